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

Score: `mode="all"` gives 1 only if every case passes (stopping at the first failure); `mode="fraction"`
gives the fraction of cases passed. Every case is a fresh sandboxed process (see `sandbox.py`).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from grpo_jax.rewards.base import MissingFieldError, RewardInputError, RewardResult, require, reward
from grpo_jax.rewards.format import assistant_turn, split_response
from grpo_jax.rewards.sandbox import Isolation, Limits, SandboxResult, run_program

CODE_VERSION = "5"  # 5: state shared across calls, numpy scalars, NaN identity, exception attributes (sandbox.md)
# 4: a think_prefilled row is read as "<think>" + completion (no </think>: no program)
# 3: builtin-named functions under test, exceptions that cannot act as control flow, arguments
# changed in place and identity written back, main blocks, stderr, stdin by path, numpy, generators (docs/sandbox.md)
# 2: the tests run in their own process against plain-data results (nothing the program patches
# in its own process, builtins, exec or the harness, can make a test pass; see the module docstring)

_FENCE_RE = re.compile(r"```[ \t]*([A-Za-z0-9_+-]*)[^\n]*\n(.*?)(?:```|\Z)", re.DOTALL)
_PYTHON_LANGS = {"python", "py", "python3", "py3"}
MAX_PROGRAM_CHARS = 100_000


def extract_program(answer: str) -> str:
    """The program in an answer: the last ```python block, else the last unlabelled ``` block, else the
    whole answer (a model that answers with bare code)."""
    blocks = [(lang.lower(), body) for lang, body in _FENCE_RE.findall(answer)]
    for wanted in (_PYTHON_LANGS, {""}):
        bodies = [body for lang, body in blocks if lang in wanted]
        if bodies:
            return bodies[-1].strip("\n")
    return answer.strip()


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
    program = extract_program(split_response(turn, think_tag=think_tag, answer_tag=answer_tag).answer)
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
