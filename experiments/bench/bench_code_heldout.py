"""Held-out attacks and fidelity checks on the code reward: wrong programs must score 0, correct ones 1.

    python experiments/bench/make_code_heldout_data.py                     # (re)writes data/code_heldout.jsonl
    nice -n 19 python experiments/bench/bench_code_heldout.py              # all rows, 2 threads
    python experiments/bench/bench_code_heldout.py --ids leak- exception-  # rows whose id starts so
    python experiments/bench/bench_code_heldout.py --out runs/bench_code_heldout.json

Each row of `data/code_heldout.jsonl` (`id`, `class`, `kind`, `response`, `sample`, `why`) is scored with
`code_reward(response, sample)` under the default isolation, `repeat` times in a row where the row says so
(state left by one run for the next: a wrong row counts as rewarded if any run scores 1). Kinds: `wrong`
(must score 0: cheats and wrong programs), `correct` (must score 1: honest programs in unusual styles) and
`weak` (wrong programs whose tests one interpreter passes too: listed, not counted).

Each row is also run in one interpreter (program and tests in a single process, as a plain harness runs
them; that process is itself sandboxed, with generous limits, because some rows signal every process they
can reach or fork to the limit): a `wrong` row that one interpreter passes is relabelled a weak test (the
tests, not the two-process harness, let it through), a `correct` row it fails is reported as a bad row.
Prints per class the counts (wrong rewarded, correct lost) with each failure's status and stderr tail;
writes `--out` (JSON, with provenance) if given.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import sys
import time
from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from grpo_jax.provenance import result_provenance
from grpo_jax.rewards import code_reward
from grpo_jax.rewards.code import CODE_VERSION, _cases, extract_program, called_names, outputs_match
from grpo_jax.rewards.format import split_response
from grpo_jax.rewards.sandbox import Limits, available_layers, run_program

HERE = os.path.dirname(os.path.abspath(__file__))
DATA = os.path.join(HERE, "data", "code_heldout.jsonl")
KINDS = ("wrong", "weak", "correct")
PASSED = "one interpreter: the tests passed"  # printed after the tests, so an early exit(0) is no pass
PLAIN_LIMITS = Limits(wall_s=20.0, cpu_s=15.0, memory_mb=2048, max_output_bytes=8 << 20)
MARKERS = ("/tmp/.hleak_*", "/var/tmp/.hleak_*", "/dev/shm/.hleak_*", "/dev/shm/hleak_*", "/run/lock/.hleak_*",
           os.path.expanduser("~/.hleak_*"))


def read_rows(path: str = DATA) -> list[dict[str, Any]]:
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def clean_markers() -> None:
    """Remove marker files a leak row (or its plain run) may have left on this machine."""
    for pattern in MARKERS:
        for path in glob.glob(pattern):
            try:
                os.unlink(path)
            except OSError:
                pass


def program_of(row: dict[str, Any]) -> str:
    """The program the reward would extract from the row's response."""
    kind, cases, entry = _cases(row["sample"])
    names = (entry,) if entry is not None else called_names(cases) if kind == "tests" else ()
    return extract_program(split_response(row["response"]).answer, names)


def one_interpreter_script(program: str, test: str, entry: str | None) -> str:
    """Program and tests in one interpreter, as a plain harness has it: the program runs as the module
    `solution` (its main block does not run), its public names are the tests' globals, then `check(entry)`,
    then a line saying the tests passed."""
    return ("import sys, types\n_solution = types.ModuleType('solution')\nsys.modules['solution'] = _solution\n"
            "_solution.__file__ = 'solution.py'\n"
            f"exec(compile({program!r}, 'solution.py', 'exec'), _solution.__dict__)\n"
            "globals().update({k: v for k, v in vars(_solution).items() if not k.startswith('_')})\n"
            f"{test}\n" + (f"check({entry})\n" if entry else "") + f"print({PASSED!r})\n")


def one_interpreter_io_script(program: str) -> str:
    """A stdin/stdout program as `python main.py` runs it: `__main__`, with a `__file__`."""
    return (f"exec(compile({program!r}, 'main.py', 'exec'), "
            "{'__name__': '__main__', '__file__': 'main.py', '__builtins__': __builtins__})\n")


def plain_passes(row: dict[str, Any]) -> bool | None:
    """One interpreter's verdict: every case of the row passes (True), one fails (False), a timeout (None).
    The one interpreter is itself sandboxed (a single confined process, generous limits): rows here signal
    every process they can reach, fork to the limit or fill memory, which must never run unconfined."""
    program = program_of(row)
    kind, cases, entry = _cases(row["sample"])
    for case in cases:
        if kind == "tests":
            result = run_program(one_interpreter_script(program, case, entry), limits=PLAIN_LIMITS)
            ok = result.passed and result.stdout.rstrip("\n").endswith(PASSED)  # not an exit before the tests
        else:
            result = run_program(one_interpreter_io_script(program), stdin=case[0], limits=PLAIN_LIMITS)
            ok = result.passed and outputs_match(result.stdout, case[1])
        if result.status == "timeout":
            return None
        if not ok:
            return False
    return True


def score_row(row: dict[str, Any]) -> dict[str, Any]:
    """The reward on one row (repeated where the row says so), and the plain interpreter's verdict."""
    runs = []
    for _ in range(int(row.get("repeat", 1))):
        t = time.perf_counter()
        result = code_reward(row["response"], row["sample"])
        failed = next((r for r in result.info.get("results", []) if r["status"] != "pass"), {})
        runs.append({"score": result.score, "reason": result.info.get("reason"), "status": failed.get("status", "pass"),
                     "stderr_tail": failed.get("stderr_tail", ""), "seconds": round(time.perf_counter() - t, 2)})
    plain = plain_passes(row)
    best = max(runs, key=lambda r: r["score"])
    worst = min(runs, key=lambda r: r["score"])
    shown = best if row["kind"] != "correct" else worst
    return {"id": row["id"], "class": row["class"], "kind": row["kind"], "why": row["why"], "plain": plain,
            "score": shown["score"], "runs": runs, "status": shown["status"], "reason": shown["reason"],
            "stderr_tail": shown["stderr_tail"][-300:]}


def verdict(s: dict[str, Any]) -> str:
    """ok, rewarded (a wrong row scored 1), lost (a correct row scored 0), weak (tests one interpreter
    passes too), bad-row (a correct row one interpreter fails: the row, not the harness, is wrong)."""
    if s["kind"] == "weak" or (s["kind"] == "wrong" and s["plain"] is True):
        return "weak"
    if s["kind"] == "correct" and s["plain"] is False:
        return "bad-row"
    if s["kind"] == "wrong":
        return "rewarded" if s["score"] > 0 else "ok"
    return "lost" if s["score"] < 1 else "ok"


def report(scored: list[dict[str, Any]]) -> dict[str, Any]:
    by_class: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    for s in scored:
        c = by_class[s["class"]]
        c[s["kind"]] += 1
        c[verdict(s)] += 1
    print(f"| {'class':<28} | wrong | rewarded | correct | lost | weak | bad-row |")
    print("|" + "-" * 30 + "|-------|----------|---------|------|------|---------|")
    for cls in sorted(by_class):
        c = by_class[cls]
        print(f"| {cls:<28} | {c['wrong']:>5} | {c['rewarded']:>8} | {c['correct']:>7} | {c['lost']:>4} "
              f"| {c['weak']:>4} | {c['bad-row']:>7} |")
    totals = {k: sum(verdict(s) == k for s in scored) for k in ("rewarded", "lost", "weak", "bad-row")}
    totals.update({k: sum(s["kind"] == k for s in scored) for k in KINDS})
    totals["wrong_counted"] = sum(s["kind"] == "wrong" and verdict(s) != "weak" for s in scored)
    totals["correct_counted"] = sum(s["kind"] == "correct" and verdict(s) != "bad-row" for s in scored)
    print(f"wrong rewarded: {totals['rewarded']}/{totals['wrong_counted']}; correct lost: "
          f"{totals['lost']}/{totals['correct_counted']}; weak tests: {totals['weak']}; bad rows: {totals['bad-row']}")
    for s in scored:
        v = verdict(s)
        if v != "ok":
            plain = {True: "passes", False: "fails", None: "not run/timed out"}[s["plain"]]
            print(f"  [{v}] {s['id']} ({s['class']}): score {s['score']:.0f}, status {s['status']}, plain {plain}"
                  + (f"\n      stderr: {s['stderr_tail'][-200:]!r}" if s["stderr_tail"] and v != "weak" else ""))
    return totals


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data", default=DATA)
    ap.add_argument("--ids", nargs="*", default=None, help="only rows whose id starts with one of these")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    rows = read_rows(args.data)
    if args.ids:
        rows = [r for r in rows if r["id"].startswith(tuple(args.ids))]
    clean_markers()
    t0 = time.perf_counter()
    # leak rows run alone, one after another, so no other row's run interleaves with their repeats
    with ThreadPoolExecutor(args.workers) as pool:
        scored = list(pool.map(score_row, [r for r in rows if "repeat" not in r]))
    scored += [score_row(r) for r in rows if "repeat" in r]
    clean_markers()
    order = {r["id"]: i for i, r in enumerate(rows)}
    scored.sort(key=lambda s: order[s["id"]])
    seconds = time.perf_counter() - t0
    layers = available_layers()
    print(f"sandbox layers: {', '.join(layers) or 'none'}; {len(rows)} rows in {seconds:.0f} s")
    totals = report(scored)
    result = {"totals": totals, "rows": scored,
              "config": {"data": os.path.relpath(args.data, HERE), "ids": args.ids, "workers": args.workers,
                         "sandbox_layers": layers, "code_reward_version": CODE_VERSION, "seconds": round(seconds, 1)},
              "provenance": result_provenance()}
    if args.out:
        os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
        with open(args.out, "w", encoding="utf-8") as f:
            json.dump(result, f, indent=1)
        print(f"wrote {args.out}")
    return result


if __name__ == "__main__":
    main()
