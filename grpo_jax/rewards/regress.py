"""Reward regression sets: `python -m grpo_jax.rewards.regress` fails on any change in behaviour.

Each `regression/<reward>.jsonl` line is one case:
    {"id", "reward", "version", "response", "sample", "kwargs" (optional), "expected", "note" (optional)}
A case fails when the reward's score differs from `expected` (abs. tolerance 1e-6) or when the
reward's current version differs from the case's recorded `version`. So a behaviour change can only
land together with a version bump and a deliberate re-recording:

    python -m grpo_jax.rewards.regress             # check everything (exit 1 and a diff listing on change)
    python -m grpo_jax.rewards.regress --record    # after an intentional change: rewrite expected+version

`--record` refuses to re-record a changed score under an unchanged version: bump the reward's version
first, so that runs trained on the old behaviour can be told apart from runs on the new one.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from grpo_jax.rewards.base import RewardInputError
from grpo_jax.rewards.registry import REWARDS, SANDBOXED, reward_version
from grpo_jax.rewards.sandbox import SandboxPool

REGRESSION_DIR = Path(__file__).with_name("regression")
TOLERANCE = 1e-6
_REQUIRED = ("id", "reward", "version", "response", "sample", "expected")


@dataclass(frozen=True)
class Case:
    """One regression case and where it came from (file, 1-based line)."""

    path: Path
    line: int
    data: dict[str, Any]


@dataclass(frozen=True)
class Outcome:
    case: Case
    score: float | None  # None: the reward raised (only legitimate for malformed-sample cases)
    reason: str
    problems: tuple[str, ...]


def load_cases(directory: Path = REGRESSION_DIR) -> list[Case]:
    """All cases in `directory/*.jsonl`; a malformed line is an error naming file and line."""
    cases = []
    for path in sorted(directory.glob("*.jsonl")):
        for lineno, text in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
            if not text.strip():
                continue
            try:
                data = json.loads(text)
            except json.JSONDecodeError as e:
                raise ValueError(f"{path}:{lineno}: invalid JSON: {e}") from e
            missing = [k for k in _REQUIRED if k not in data]
            if missing:
                raise ValueError(f"{path}:{lineno}: case is missing fields {missing}")
            if data["reward"] not in REWARDS:
                raise ValueError(f"{path}:{lineno}: unknown reward {data['reward']!r}; known: {sorted(REWARDS)}")
            cases.append(Case(path, lineno, data))
    ids = [c.data["id"] for c in cases]
    duplicates = sorted({i for i in ids if ids.count(i) > 1})
    if duplicates:
        raise ValueError(f"duplicate case ids: {duplicates}")
    return cases


def _score(case: Case) -> tuple[float | None, str]:
    fn = REWARDS[case.data["reward"]]
    try:
        result = fn(case.data["response"], case.data["sample"], **case.data.get("kwargs", {}))
    except RewardInputError as e:  # cases may pin that a malformed sample is rejected
        return None, f"raises:{type(e).__name__}"
    return result.score, str(result.info.get("reason", ""))


def _check(case: Case, score: float | None, reason: str) -> Outcome:
    problems = []
    expected = case.data["expected"]
    if expected is None or score is None:
        if (expected is None) != (score is None):
            problems.append(f"expected {expected!r}, got {score!r} ({reason})")
    elif abs(float(expected) - score) > TOLERANCE:
        problems.append(f"expected {expected}, got {round(score, 6)} ({reason})")
    current = reward_version(case.data["reward"])
    if str(case.data["version"]) != current:
        problems.append(f"recorded version {case.data['version']!r} != current {current!r}")
    return Outcome(case, score, reason, tuple(problems))


def run_cases(cases: Sequence[Case], *, workers: int = 2) -> list[Outcome]:
    """Score every case (sandboxed rewards through the pool) and compare with the recording."""
    sandboxed = [c for c in cases if c.data["reward"] in SANDBOXED]
    inline = [c for c in cases if c.data["reward"] not in SANDBOXED]
    with SandboxPool(workers) as pool:
        futures = {id(c): pool.submit(_score, c) for c in sandboxed}
        results = {id(c): _score(c) for c in inline}
        results.update({key: f.result() for key, f in futures.items()})
    return [_check(c, *results[id(c)]) for c in cases]


def record(outcomes: Sequence[Outcome]) -> list[str]:
    """Rewrite expected scores and versions in place; refuse score changes without a version bump."""
    refusals = []
    for o in outcomes:
        same_version = str(o.case.data["version"]) == reward_version(o.case.data["reward"])
        score_changed = any(p.startswith("expected") for p in o.problems)
        if score_changed and same_version:
            refusals.append(
                f"{o.case.path.name}:{o.case.line} {o.case.data['id']}: score changed but reward "
                f"{o.case.data['reward']!r} is still version {o.case.data['version']!r}; bump its version first"
            )
    if refusals:
        return refusals
    by_path: dict[Path, list[Outcome]] = {}
    for o in outcomes:
        by_path.setdefault(o.case.path, []).append(o)
    for path, items in by_path.items():
        lines = []
        for o in sorted(items, key=lambda x: x.case.line):
            data = dict(o.case.data)
            data["expected"] = None if o.score is None else round(o.score, 6)
            data["version"] = reward_version(data["reward"])
            lines.append(json.dumps(data, ensure_ascii=False))
        path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return []


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m grpo_jax.rewards.regress", description=__doc__.split("\n")[0])
    parser.add_argument("--record", action="store_true", help="rewrite expected scores and versions")
    parser.add_argument("--only", nargs="*", default=None, help="reward names to run (default: all)")
    parser.add_argument("--dir", type=Path, default=REGRESSION_DIR, help="directory of *.jsonl cases")
    parser.add_argument("--workers", type=int, default=2, help="sandbox pool size for code cases")
    args = parser.parse_args(argv)
    cases = [c for c in load_cases(args.dir) if args.only is None or c.data["reward"] in args.only]
    outcomes = run_cases(cases, workers=args.workers)
    failed = [o for o in outcomes if o.problems]
    if args.record:
        refusals = record(outcomes)
        for line in refusals:
            print("REFUSED", line)
        print(f"recorded {len(outcomes)} cases ({len(failed)} changed)" if not refusals else "nothing written")
        return 2 if refusals else 0
    for o in failed:
        print(
            f"CHANGED {o.case.path.name}:{o.case.line} [{o.case.data['reward']}] {o.case.data['id']}: "
            + "; ".join(o.problems)
        )
    counts: dict[str, int] = {}
    for o in outcomes:
        counts[o.case.data["reward"]] = counts.get(o.case.data["reward"], 0) + 1
    summary = ", ".join(f"{name} {n}" for name, n in sorted(counts.items()))
    print(f"{len(outcomes)} cases ({summary}); {len(failed)} changed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
