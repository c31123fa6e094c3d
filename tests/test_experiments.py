"""Each experiment's --smoke variant runs end to end and writes its report with the documented fields."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from tests.test_train import ROOT

REPORT_FIELDS = ("accuracy_sft", "accuracy_final", "accuracy_best", "format_rate_final", "entropy_first",
                 "entropy_final", "zero_variance_fraction_final", "steps", "wall_seconds", "seed")


def test_arithmetic_smoke_writes_the_report(tmp_path):
    out = subprocess.run([sys.executable, "experiments/arithmetic.py", "--smoke", "--quiet", "--out", str(tmp_path)],
                         cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    report = json.loads((tmp_path / "report.json").read_text())
    summary = report.get("summary", report)
    for field in REPORT_FIELDS:
        assert field in summary, field
    assert summary["steps"] == 2 and summary["seed"] == 0
    assert 0.0 <= summary["accuracy_final"] <= 1.0
    md = (tmp_path / "report.md").read_text()
    assert "accuracy_sft" in md and "Targets" in md
    for name in ("metrics.jsonl", "config.json", "events.jsonl"):
        assert (tmp_path / name).exists(), name
    assert os.listdir(tmp_path / "tb") and any(p.endswith(".png") for p in os.listdir(tmp_path / "plots"))


def test_greedy_demo_runs():
    out = subprocess.run([sys.executable, "experiments/greedy_demo.py", "--new-tokens", "4"], cwd=ROOT,
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "greedy continuation" in out.stdout
