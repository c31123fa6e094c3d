"""The math grader's held-out benchmark (experiments/bench/bench_math_grader.py): its loader rejects malformed
pairs and its counting of false positives and negatives is right on pairs whose verdicts are known. The
counts on the whole shipped set are a measurement and are not asserted here."""

from __future__ import annotations

import json

import pytest

from tests.launchers import load_launcher

bench = load_launcher("bench/bench_math_grader")

FIVE = [
    {"id": "a-1", "class": "a", "gold": "\\frac{1}{2}", "pred": "0.5", "equal": True, "why": "same value"},
    {"id": "a-2", "class": "a", "gold": "3", "pred": "4", "equal": False, "why": "different value"},
    {"id": "b-1", "class": "b", "gold": "(1, 2)", "pred": "(2, 1)", "equal": False, "why": "order"},
    {"id": "b-2", "class": "b", "gold": "2^{10}", "pred": "1024", "equal": True, "why": "evaluated"},
    {"id": "b-3", "class": "b", "gold": "[0, 1]", "pred": "[0, 1)", "equal": False, "why": "open end"},
]


def _write(tmp_path, rows) -> str:
    path = tmp_path / "pairs.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def test_shipped_pairs_load():
    pairs = bench.load_pairs()
    assert len(pairs) >= 150
    assert {p.equal for p in pairs} == {True, False}


@pytest.mark.parametrize("bad", [
    {"id": "x", "class": "c", "gold": "1", "pred": "1", "why": "no label"},
    {"id": "x", "class": "c", "gold": "1", "pred": "1", "equal": "yes", "why": "label not a bool"},
    {"id": "x", "class": "c", "gold": 1, "pred": "1", "equal": True, "why": "gold not a string"},
    {"id": "x", "class": "c", "gold": "1", "pred": "1", "equal": True, "why": "w", "note": "unknown field"},
])
def test_loader_rejects_malformed_rows(tmp_path, bad):
    with pytest.raises(ValueError):
        bench.load_pairs(_write(tmp_path, [FIVE[0], bad]))


def test_loader_rejects_repeated_ids(tmp_path):
    with pytest.raises(ValueError, match="repeated id"):
        bench.load_pairs(_write(tmp_path, [FIVE[0], FIVE[0]]))


def test_counting_with_fixed_graders(tmp_path):
    pairs = bench.load_pairs(_write(tmp_path, FIVE))
    graders = {"always": lambda g, p: True, "never": lambda g, p: False, "ours": bench.ours}
    verdicts = bench.grade_all(pairs, graders)
    assert verdicts["ours"] == [p.equal for p in pairs]  # five pairs the grader is known to get right
    table = bench.count(pairs, verdicts)
    assert list(table) == ["a", "b", "total"]
    assert table["a"] == {"pairs": 2, "always": {"fp": 1, "fn": 0}, "never": {"fp": 0, "fn": 1},
                          "ours": {"fp": 0, "fn": 0}}
    assert table["b"] == {"pairs": 3, "always": {"fp": 2, "fn": 0}, "never": {"fp": 0, "fn": 1},
                          "ours": {"fp": 0, "fn": 0}}
    assert table["total"]["always"] == {"fp": 3, "fn": 0} and table["total"]["never"] == {"fp": 0, "fn": 2}
    wrong = bench.disagreements(pairs, verdicts)
    assert [w["id"] for w in wrong] == ["a-1", "a-2", "b-1", "b-2", "b-3"]  # "always"/"never" miss each
    assert wrong[1]["verdicts"] == {"always": True, "never": False, "ours": False}


def test_a_raising_grader_counts_as_not_equal(tmp_path):
    pairs = bench.load_pairs(_write(tmp_path, FIVE[:2]))

    def boom(gold: str, pred: str) -> bool:
        raise RuntimeError("parser failure")

    table = bench.count(pairs, bench.grade_all(pairs, {"boom": boom}))
    assert table["total"] == {"pairs": 2, "boom": {"fp": 0, "fn": 1}}
