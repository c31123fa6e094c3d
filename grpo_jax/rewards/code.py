"""Code reward: extract the program from the answer and run it against the sample's tests, sandboxed.

Two test formats, the two that the common datasets use:
- `sample["tests"]`: test code (a string, or a list of strings each run as its own case) that calls
  the program's functions. With `sample["entry_point"]`, `check(<entry_point>)` is called afterwards,
  as in HumanEval; MBPP-style lists of `assert` lines work without it. The tests run in a separate,
  clean sandboxed process that sees the program's functions as stubs: each call is answered by the
  program's process with a plain-data value (None, bool, numbers, str, bytes, Fraction, Decimal,
  range, and the builtin and `collections` containers of them; an iterator is read lazily; anything
  else fails the case), so no object of the program's, and nothing it patched, takes part in the
  comparisons. Arguments changed in place, identity and aliasing cross as in one interpreter; a
  function named like a builtin is the program's when it is the function under test (see `sandbox.py`,
  docs/sandbox.md).
- `sample["io"]`: a list of `{"input": str, "output": str}` cases; the program reads stdin, and its
  stdout is compared line by line (trailing whitespace and trailing blank lines ignored) in *this*
  process, so nothing the program prints can fake a pass.

The program is the fenced block of the answer that defines the function under test (the entry point,
or the functions the tests call), else the last ```python block, else the last unlabelled one, else the
whole answer; a Python block ends at the first fence after which it parses, so "```" inside a string
does not cut it (`extract_program`, docs/sandbox.md).

Score: `mode="all"` gives 1 only if every case passes (stopping at the first failure); `mode="fraction"`
gives the fraction of cases passed. Every case is a fresh sandboxed process (see `sandbox.py`).
"""

from __future__ import annotations

import ast
import bisect
import builtins
import re
from collections.abc import Mapping, Sequence
from typing import Any

from grpo_jax.rewards.base import MissingFieldError, RewardInputError, RewardResult, require, reward
from grpo_jax.rewards.format import assistant_turn, split_response
from grpo_jax.rewards.sandbox import Isolation, Limits, SandboxResult, run_program

CODE_VERSION = "5"  # 5: the block that defines the function under test is the program; fences inside
# strings; no IPC object or installed package other than the allowed ones reachable; multiprocessing
# works in the run's own /dev/shm; the tests' stdout, stdin, files, random state, recursion limit and
# warnings reach the program's calls; `from solution import`, signatures, builtin types as values;
# state shared across calls, numpy scalars, NaN identity, exception attributes (docs/sandbox.md)
# 4: a think_prefilled row is read as "<think>" + completion (no </think>: no program)
# 3: builtin-named functions under test, exceptions that cannot act as control flow, arguments
# changed in place and identity written back, main blocks, stderr, stdin by path, numpy, generators (docs/sandbox.md)
# 2: the tests run in their own process against plain-data results (nothing the program patches
# in its own process, builtins, exec or the harness, can make a test pass; see the module docstring)

_OPEN_FENCE_RE = re.compile(r"```[ \t]*([A-Za-z0-9_+-]*)[^\n]*\n")
_LINE_FENCE_RE = re.compile(r"^[ \t]*```[ \t]*$", re.MULTILINE)  # a fence alone on its line
_FENCE = "```"
_FENCE_RE = re.compile(_FENCE)
_PYTHON_LANGS = {"python", "py", "python3", "py3"}
_MAX_FENCE_TRIES = 32  # closing-fence candidates parsed per block
_PARSE_BUDGET = 1_000_000  # characters parsed per answer to find closing fences (then markdown's rule)
MAX_PROGRAM_CHARS = 100_000


def extract_program(answer: str, names: Sequence[str] = ()) -> str:
    """The program in an answer, chosen as a grader reading it would: among the ```python and unlabelled
    blocks, the last one that defines the most of `names` (the entry point, or the functions the tests
    call), so that a usage example after the solution does not replace it; without such a block, the
    last ```python block, else the last unlabelled one, else the whole answer (bare code)."""
    blocks = [(lang, body.strip("\n")) for lang, body in fenced_blocks(answer) if lang in _PYTHON_LANGS | {""}]
    if names:
        wanted = set(names)
        counts = [len(wanted & _defined_names(body)) for _, body in blocks]
        if counts and max(counts) > 0:
            return blocks[max(range(len(blocks)), key=lambda i: (counts[i], i))][1]
    for langs in (_PYTHON_LANGS, {""}):
        bodies = [body for lang, body in blocks if lang in langs]
        if bodies:
            return bodies[-1]
    return answer.strip()


def fenced_blocks(text: str) -> list[tuple[str, str]]:
    """The ``` blocks of a markdown text as (language in lower case, body). A block ends at its closing
    fence, which for Python code is the first candidate after which the body parses, so a "```" inside
    a string literal does not cut it; an unclosed block runs to the end of the text."""
    fences = _Fences(text)
    blocks, pos = [], 0
    while (opened := _OPEN_FENCE_RE.search(text, pos)) is not None:
        lang = opened.group(1).lower()
        end = fences.block_end(opened.end(), python=lang in _PYTHON_LANGS | {""})
        blocks.append((lang, text[opened.end() : end]))
        pos = end + len(_FENCE)
    return blocks


class _Fences:
    """The closing-fence candidates of one text, found once (a text may open many blocks)."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.on_own_line = [m.start() + m.group().index(_FENCE) for m in _LINE_FENCE_RE.finditer(text)]
        self.anywhere = [m.start() for m in _FENCE_RE.finditer(text)]
        self.budget = _PARSE_BUDGET

    def block_end(self, start: int, python: bool) -> int:
        """Where the block whose body starts at `start` ends. Candidates, in order: fences alone on their
        line (as markdown closes a block), fences inside a line (`return x```), the end of the text.
        Python code ends at the first candidate after which it parses (a fence line is never Python, so
        a parse that spans one is impossible); code that parses nowhere ends at the first candidate, as
        markdown has it. At most _MAX_FENCE_TRIES parses a block, and _PARSE_BUDGET characters a text."""
        own = self._after(self.on_own_line, start, _MAX_FENCE_TRIES)
        inline = set(self._after(self.anywhere, start, 2 * _MAX_FENCE_TRIES)) - set(own)
        candidates = own + sorted(inline) + [len(self.text)]
        if python:
            for end in candidates[:_MAX_FENCE_TRIES]:
                if end - start > self.budget:
                    break
                self.budget -= end - start
                if _parses(self.text[start:end]):
                    return end
        return candidates[0]

    @staticmethod
    def _after(positions: list[int], start: int, count: int) -> list[int]:
        first = bisect.bisect_left(positions, start)
        return positions[first : first + count]


def _parse(code: str) -> ast.Module | None:
    """The module's syntax tree, or None for code that is not Python (model output never raises here)."""
    try:
        return ast.parse(code)
    except (SyntaxError, ValueError, RecursionError, MemoryError, OverflowError):
        return None


def _parses(code: str) -> bool:
    return _parse(code) is not None


def _defined_names(code: str) -> set[str]:
    """Names the code binds at module level by `def`, `class` or assignment (also inside top-level
    if/try/with/for blocks, not inside functions or classes; imports do not count: a usage example
    that imports the solution's function does not define it)."""
    tree = _parse(code)
    names: set[str] = set()
    stack = list(tree.body) if tree is not None else []
    while stack:
        node = stack.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
            continue
        targets = node.targets if isinstance(node, ast.Assign) else [getattr(node, "target", None)]
        for target in targets:
            if isinstance(target, ast.Name) and isinstance(node, (ast.Assign, ast.AnnAssign)):
                names.add(target.id)
        for field in ("body", "orelse", "finalbody", "handlers"):
            stack += [n for n in getattr(node, field, []) if isinstance(n, ast.AST)]
    return names


def called_names(tests: Sequence[str]) -> tuple[str, ...]:
    """The functions the tests call that they neither define nor take from builtins: the program's
    functions under test (MBPP lists and assert lines have no entry point)."""
    called: set[str] = set()
    defined: set[str] = set()
    for test in tests:
        tree = _parse(test)
        if tree is None:
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
                called.add(node.func.id)
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                defined.add(node.name)
            elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                defined.add(node.id)
            elif isinstance(node, ast.arg):
                defined.add(node.arg)
            elif isinstance(node, ast.alias):
                defined.add((node.asname or node.name).split(".")[0])
    return tuple(sorted(called - defined - set(dir(builtins))))


def _cases(sample: Mapping[str, Any]) -> tuple[str, list[Any], str | None]:
    """('tests', [test code...], entry_point) or ('io', [(stdin, expected)...], None); bad samples raise."""
    if "tests" in sample:
        return ("tests", *_test_cases(sample))
    if "io" in sample:
        return "io", _io_cases(sample["io"]), None
    raise MissingFieldError(f"sample needs a 'tests' or an 'io' field (has: {sorted(map(str, sample))})")


def _test_cases(sample: Mapping[str, Any]) -> tuple[list[str], str | None]:
    tests = require(sample, "tests", (str, list))
    items = [tests] if isinstance(tests, str) else tests
    if not items or not all(isinstance(t, str) and t.strip() for t in items):
        raise RewardInputError("sample field 'tests' must be a non-empty string or list of non-empty strings")
    entry = sample.get("entry_point")
    if entry is not None and (not isinstance(entry, str) or not entry.isidentifier()):
        raise RewardInputError(f"sample field 'entry_point' must be a Python identifier, got {entry!r}")
    return list(items), entry


def _io_cases(io: Any) -> list[tuple[str, str]]:
    if not isinstance(io, list) or not io:
        raise RewardInputError("sample field 'io' must be a non-empty list of {input, output} cases")
    cases = []
    for i, case in enumerate(io):
        if not isinstance(case, Mapping):
            raise RewardInputError(f"sample field io[{i}] must be a mapping with 'input' and 'output'")
        for key in ("input", "output"):
            if not isinstance(case.get(key), str):
                raise RewardInputError(f"sample field io[{i}].{key} must be a string")
        cases.append((case["input"], case["output"]))
    return cases


def outputs_match(actual: str, expected: str) -> bool:
    """Line-wise comparison ignoring trailing whitespace and trailing blank lines (judge convention)."""

    def lines(text: str) -> list[str]:
        out = [line.rstrip() for line in text.replace("\r\n", "\n").split("\n")]
        while out and not out[-1]:
            out.pop()
        return out

    return lines(actual) == lines(expected)


def _case_record(result: SandboxResult, passed: bool, kind: str) -> dict[str, Any]:
    """Per-case info. A clean exit that is not a pass means wrong output (io) or that the program
    stopped before the tests finished (tests: exit(0), SystemExit or os._exit in the program)."""
    failed_clean = "wrong_answer" if kind == "io" else "incomplete"
    status = "pass" if passed else (failed_clean if result.status == "ok" else result.status)
    record: dict[str, Any] = {"status": status, "wall_s": round(result.wall_s, 4)}
    if not passed and result.stderr:
        record["stderr_tail"] = result.stderr[-400:]
    return record


def _limits(**limits: float) -> Limits:
    try:
        return Limits(**limits)
    except ValueError as e:
        raise RewardInputError(f"code: {e}") from e


def _run_case(program: str, kind: str, case: Any, entry: str | None, limits: Limits) -> dict[str, Any]:
    """One sandboxed run: tests (pass = the tests' process completed them) or an stdin/stdout case."""
    if kind == "tests":
        result = run_program(program, tests=case, entry_point=entry, limits=limits, isolation=Isolation())
        return _case_record(result, result.passed, kind)
    result = run_program(program, stdin=case[0], limits=limits, isolation=Isolation())
    return _case_record(result, result.passed and outputs_match(result.stdout, case[1]), kind)


@reward("code", CODE_VERSION)
def code_reward(
    response: str,
    sample: Mapping[str, Any],
    *,
    mode: str = "all",
    wall_s: float = 5.0,
    cpu_s: float = 4.0,
    memory_mb: int = 512,
    max_processes: int = 16,
    max_output_bytes: int = 1 << 20,
    think_tag: str = "think",
    answer_tag: str = "answer",
) -> RewardResult:
    """Pass-all (or pass-fraction) of the extracted program on the sample's tests, run sandboxed."""
    if mode not in ("all", "fraction"):
        raise RewardInputError(f"code: mode must be 'all' or 'fraction', got {mode!r}")
    kind, cases, entry = _cases(sample)
    limits = _limits(wall_s=wall_s, cpu_s=cpu_s, memory_mb=memory_mb, max_processes=max_processes,
                     max_output_bytes=max_output_bytes)  # fmt: skip
    turn = assistant_turn(response, sample, think_tag=think_tag)  # with the prompt's opened <think>
    names = (entry,) if entry is not None else called_names(cases) if kind == "tests" else ()
    program = extract_program(split_response(turn, think_tag=think_tag, answer_tag=answer_tag).answer, names)
    if not program.strip():
        return RewardResult(0.0, {"reason": "no_program", "cases": len(cases)})
    if len(program) > MAX_PROGRAM_CHARS:
        return RewardResult(0.0, {"reason": "program_too_long", "cases": len(cases)})
    records = []
    for case in cases:
        records.append(_run_case(program, kind, case, entry, limits))
        if records[-1]["status"] != "pass" and mode == "all":
            break
    n_pass = sum(r["status"] == "pass" for r in records)
    score = n_pass / len(cases) if mode == "fraction" else float(n_pass == len(cases))
    reason = "ok" if n_pass == len(cases) else next(r["status"] for r in records if r["status"] != "pass")
    return RewardResult(score, {"reason": reason, "passed": n_pass, "cases": len(cases), "results": records})
