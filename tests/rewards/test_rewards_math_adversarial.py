"""The math grader on a hand-built adversarial set of answer pairs (tests/rewards/data/math_adversarial.jsonl).

Each line is {"class", "pred", "gold", "equal", "note"}: pairs that should match and near neighbours that
should not, for exact powers against roundings, rationals near irrational constants, spaces between digits,
base subscripts, Unicode forms, matrix row breaks, approximate answers, chained equalities, degrees-minutes,
mixed numbers and set notations. The labels are the mathematically right verdicts, written by hand.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

from grpo_jax.rewards.math import answers_equal

DATA = Path(__file__).with_name("data") / "math_adversarial.jsonl"
ROWS = [json.loads(line) for line in DATA.read_text(encoding="utf-8").splitlines() if line.strip()]


def test_set_covers_both_directions_in_every_class():
    """Every class has pairs that should match and pairs that should not, so a grader that always says one
    thing in a class fails it."""
    kinds = Counter((row["class"], row["equal"]) for row in ROWS)
    classes = {row["class"] for row in ROWS}
    assert len(ROWS) >= 100 and len({(r["pred"], r["gold"]) for r in ROWS}) == len(ROWS)
    assert all(kinds[(c, True)] and kinds[(c, False)] for c in classes), kinds


@pytest.mark.parametrize("row", ROWS, ids=[f"{r['class']}:{r['pred']}|{r['gold']}" for r in ROWS])
def test_labelled_verdict(row):
    equal, method = answers_equal(row["pred"], row["gold"])
    assert equal is row["equal"], f"{row['note']} (method {method})"
