"""The held-out code-reward benchmark (experiments/bench/bench_code_heldout.py): its data file has the fields
the bench reads, its maker reproduces it, and two rows are scored end to end (a correct program in an unusual
style that scores 1, a cheat that scores 0), so the loader and data cannot rot unnoticed."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from tests.launchers import load_launcher

bench = load_launcher("bench/bench_code_heldout")
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_rows_have_the_fields_the_bench_reads():
    rows = bench.read_rows()
    assert len({r["id"] for r in rows}) == len(rows) >= 80
    for row in rows:
        assert {"id", "class", "kind", "response", "sample", "why"} <= set(row), row["id"]
        assert row["kind"] in bench.KINDS, row["id"]
        assert ("tests" in row["sample"]) != ("io" in row["sample"]), row["id"]
        assert "</think>" in row["response"] and "```python" in row["response"], row["id"]
        assert bench.program_of(row).strip(), row["id"]
        assert int(row.get("repeat", 1)) >= 1, row["id"]
    kinds = [r["kind"] for r in rows]
    assert kinds.count("wrong") >= 40 and kinds.count("correct") >= 40


def test_the_maker_reproduces_the_data_file(tmp_path):
    maker = os.path.join(ROOT, "experiments", "bench", "make_code_heldout_data.py")
    env = {**os.environ, "PYTHONPATH": ROOT}
    out = tmp_path / "rows.jsonl"
    subprocess.run([sys.executable, maker, "--out", str(out)], check=True, env=env, capture_output=True)
    assert out.read_text(encoding="utf-8") == open(bench.DATA, encoding="utf-8").read()


def test_a_correct_row_scores_one_and_a_cheat_zero():
    rows = {r["id"]: r for r in bench.read_rows()}
    right = bench.score_row(rows["lru-cache-fib-he"])
    cheat = bench.score_row(rows["forge-error-info-as-systemexit-he"])
    assert (right["score"], right["plain"], bench.verdict(right)) == (1.0, True, "ok")
    assert (cheat["score"], cheat["plain"], bench.verdict(cheat)) == (0.0, False, "ok")
    assert json.dumps([right, cheat])  # what --out writes
