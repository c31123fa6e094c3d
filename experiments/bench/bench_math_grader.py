"""Math grader fidelity on held-out labelled answer pairs: false positives and false negatives per class.

    nice -n 19 python experiments/bench/bench_math_grader.py                      # data/math_heldout.jsonl
    python experiments/bench/bench_math_grader.py --pairs PATH --out results.json
    python experiments/bench/bench_math_grader.py --no-math-verify                # our grader only

Each line of the pairs file is `{"id", "class", "gold", "pred", "equal", "why"}`: a reference answer, a
predicted final answer (already extracted, as `\\boxed{}` or `<answer>` would give it), and the verdict a
careful human grader of MATH / GSM8K / AIME answers gives (`equal`), with the reason in `why`. The pairs of
`data/math_heldout.jsonl` were written without reading the grader's own regression or adversarial files, so
they are a held-out check: both equivalent spellings that must match and near misses that must not (a
rounding, a sign, an open vs closed end, a unit, a base), across the answer forms models and datasets use.

Graders: ours, `grpo_jax.rewards.math.answers_equal(pred, gold)`, and, when the package is importable,
math-verify (`verify(parse("$" + gold + "$"), parse("$" + pred + "$"))`; an exception counts as "not
equal"). A false positive is a pair labelled unequal that a grader calls equal; a false negative the other
way. Prints per class and in total: pairs, and each grader's false positives and false negatives, then
every pair on which a grader disagrees with the label. `--out` writes the same as JSON, with provenance
(git commit, package versions, the math reward's version). The counts are a measurement, not a gate.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

from grpo_jax.provenance import package_versions, result_provenance
from grpo_jax.rewards import math as math_reward

HERE = os.path.dirname(os.path.abspath(__file__))
PAIRS_PATH = os.path.join(HERE, "data", "math_heldout.jsonl")
FIELDS = {"id": str, "class": str, "gold": str, "pred": str, "equal": bool, "why": str}

Grader = Callable[[str, str], bool]  # (gold, pred) -> equal


@dataclass(frozen=True)
class Pair:
    id: str
    cls: str
    gold: str
    pred: str
    equal: bool
    why: str


def load_pairs(path: str = PAIRS_PATH) -> list[Pair]:
    """The labelled pairs of a JSONL file; a missing or mistyped field, or a repeated id, is a ValueError."""
    pairs: list[Pair] = []
    seen: set[str] = set()
    with open(path, encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            row = json.loads(line)
            for name, kind in FIELDS.items():
                if name not in row:
                    raise ValueError(f"{path}:{lineno}: missing field {name!r}")
                if not isinstance(row[name], kind):
                    raise ValueError(f"{path}:{lineno}: field {name!r} must be {kind.__name__}, "
                                     f"not {type(row[name]).__name__}")
            extra = set(row) - set(FIELDS)
            if extra:
                raise ValueError(f"{path}:{lineno}: unknown fields {sorted(extra)}")
            if row["id"] in seen:
                raise ValueError(f"{path}:{lineno}: repeated id {row['id']!r}")
            seen.add(row["id"])
            pairs.append(Pair(row["id"], row["class"], row["gold"], row["pred"], row["equal"], row["why"]))
    return pairs


def ours(gold: str, pred: str) -> bool:
    return bool(math_reward.answers_equal(pred, gold)[0])


def math_verify_grader() -> Grader | None:
    """math-verify's verdict on (gold, pred), or None when the package is not importable."""
    try:
        from math_verify import parse, verify
    except ImportError:
        return None

    def grade(gold: str, pred: str) -> bool:
        try:
            return bool(verify(parse("$" + gold + "$"), parse("$" + pred + "$")))
        except Exception:  # noqa: BLE001 - any failure of the grader is its "not equal"
            return False

    return grade


def grade_all(pairs: list[Pair], graders: dict[str, Grader]) -> dict[str, list[bool]]:
    """Each grader's verdict on each pair, in order. A grader that raises counts as "not equal"."""
    verdicts: dict[str, list[bool]] = {}
    for name, grade in graders.items():
        out = []
        for p in pairs:
            try:
                out.append(bool(grade(p.gold, p.pred)))
            except Exception:  # noqa: BLE001
                out.append(False)
        verdicts[name] = out
    return verdicts


def count(pairs: list[Pair], verdicts: dict[str, list[bool]]) -> dict[str, dict[str, Any]]:
    """Per class and under "total": {"pairs", and per grader {"fp", "fn"}}; classes in order of first use."""
    table: dict[str, dict[str, Any]] = {}
    for i, p in enumerate(pairs):
        for key in (p.cls, "total"):
            row = table.setdefault(key, {"pairs": 0, **{g: {"fp": 0, "fn": 0} for g in verdicts}})
            row["pairs"] += 1
            for g, vs in verdicts.items():
                if vs[i] and not p.equal:
                    row[g]["fp"] += 1
                elif not vs[i] and p.equal:
                    row[g]["fn"] += 1
    total = table.pop("total", {"pairs": 0, **{g: {"fp": 0, "fn": 0} for g in verdicts}})
    table["total"] = total
    return table


def disagreements(pairs: list[Pair], verdicts: dict[str, list[bool]]) -> list[dict[str, Any]]:
    """Every pair on which at least one grader's verdict differs from the label, with all verdicts."""
    out = []
    for i, p in enumerate(pairs):
        got = {g: vs[i] for g, vs in verdicts.items()}
        if any(v != p.equal for v in got.values()):
            out.append({**asdict(p), "verdicts": got})
    return out


def format_table(table: dict[str, dict[str, Any]], graders: list[str]) -> str:
    head = f"{'class':<16}{'pairs':>6}" + "".join(f"{g + ' FP':>16}{g + ' FN':>16}" for g in graders)
    lines = [head, "-" * len(head)]
    for cls, row in table.items():
        lines.append(f"{cls:<16}{row['pairs']:>6}"
                     + "".join(f"{row[g]['fp']:>16}{row[g]['fn']:>16}" for g in graders))
    return "\n".join(lines)



def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--pairs", default=PAIRS_PATH, help="labelled pairs (JSONL)")
    ap.add_argument("--out", default=None, help="write the counts and disagreements here (JSON)")
    ap.add_argument("--no-math-verify", action="store_true", help="grade with ours only")
    args = ap.parse_args(argv)

    pairs = load_pairs(args.pairs)
    graders: dict[str, Grader] = {"ours": ours}
    mv = None if args.no_math_verify else math_verify_grader()
    if mv is not None:
        graders["math_verify"] = mv
    verdicts = grade_all(pairs, graders)
    table = count(pairs, verdicts)
    wrong = disagreements(pairs, verdicts)

    print(f"{len(pairs)} pairs from {args.pairs} ({sum(p.equal for p in pairs)} labelled equal); "
          f"math reward version {math_reward.MATH_VERSION}")
    print(format_table(table, list(graders)))
    print(f"\n{len(wrong)} pairs on which a grader disagrees with the label:")
    for w in wrong:
        marks = " ".join(f"{g}={'=' if v else '!='}" + ("" if v == w["equal"] else "*")
                         for g, v in w["verdicts"].items())
        print(f"  {w['id']:<18} label={'=' if w['equal'] else '!='}  {marks}  gold={w['gold']!r} "
              f"pred={w['pred']!r}  ({w['why']})")
    result = {"pairs_path": os.path.relpath(args.pairs), "n_pairs": len(pairs), "graders": list(graders),
              "counts": table, "disagreements": wrong,
              "versions": {"math_reward_version": math_reward.MATH_VERSION,
                           **package_versions(["math-verify", "sympy", "latex2sympy2_extended"])},
              "provenance": result_provenance()}
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=2, ensure_ascii=False)
        print(f"wrote {args.out}", file=sys.stderr)
    return result


if __name__ == "__main__":
    main()
