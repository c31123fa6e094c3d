"""--jobs: a study's arms split over processes pinned one core each, then summarized together."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.test_train import ROOT

sys.path.insert(0, os.path.join(ROOT, "experiments"))

from study import Arm, job_splits, run_jobs  # noqa: E402


def _arms(names, pausing=()):
    return {n: Arm(on_pause=(("x=1",) if n in pausing else None)) for n in names}


def test_job_splits_cover_each_arm_once_and_balance_the_cost():
    arms = _arms([f"a{i}" for i in range(13)], pausing=("a12",))
    parts = job_splits(arms, [0, 1, 2], 2)
    names = [p[1].split(",") for p in parts]
    assert all(p[0] == "--arms" for p in parts) and len(parts) == 2
    assert sorted(sum(names, [])) == sorted(arms)  # every arm once
    # costs 12 x 1 + 1.5 = 13.5: the best split is 7 / 6.5 (a12 with five others)
    cost = [sum(1.5 if n == "a12" else 1.0 for n in ns) for ns in names]
    assert sorted(cost) == [6.5, 7.0], names
    assert all(ns == sorted(ns, key=list(arms).index) for ns in names)  # each job keeps the study's order
    # more jobs than arms: the seeds are split instead; never more jobs than there is work
    assert job_splits(_arms(["a"]), [0, 1, 2], 2) == [["--seeds", "0,2"], ["--seeds", "1"]]
    assert job_splits(_arms(["a", "b"]), [0], 8) == [["--arms", "a"], ["--arms", "b"]]


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="no CPU affinity on this platform")
def test_run_jobs_pins_each_job_to_one_core_and_names_a_failed_log(tmp_path):
    cores = sorted(os.sched_getaffinity(0))
    show = [sys.executable, "-c", "import os; print(sorted(os.sched_getaffinity(0)))"]
    wall = run_jobs([show, show, show], str(tmp_path / "ok"))
    seen = [json.loads((tmp_path / "ok" / f"job{k}.log").read_text()) for k in range(3)]
    assert seen == [[cores[k % len(cores)]] for k in range(3)] and wall > 0
    assert sorted(os.sched_getaffinity(0)) == cores  # this process's affinity is restored
    fail = [sys.executable, "-c", "print('the last words'); raise SystemExit(3)"]
    with pytest.raises(SystemExit) as e:
        run_jobs([show, fail], str(tmp_path / "bad"))
    msg = str(e.value)
    assert "job1.log (exit 3)" in msg and "the last words" in msg and "job0.log" not in msg


def test_reward_collapse_jobs_trains_every_arm_and_summarizes_them(tmp_path):
    cmd = [sys.executable, "experiments/reward_collapse.py", "--smoke", "--quiet", "--out", str(tmp_path), "--arms",
           "grpo,gdpo", "--jobs", "2"]
    out = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, out.stderr[-3000:]
    study = json.loads((tmp_path / "results.json").read_text())
    assert set(study["results"]) == {"grpo", "gdpo"} and study["jobs"] == 2 and study["wall_seconds"] > 0
    for k, arm in enumerate(("grpo", "gdpo")):  # each arm trained by its own job, one core each
        log = (tmp_path / "jobs" / f"job{k}.log").read_text()
        assert f"--arms {arm} --jobs 1 --quiet" in out.stdout and "Traceback" not in log
        rows = [json.loads(line) for line in open(tmp_path / arm / "seed0" / "metrics.jsonl")]
        steps = json.loads((tmp_path / arm / "seed0" / "config.json").read_text())["steps"]
        assert max(r["step"] for r in rows) == steps > 0 and [r["seed"] for r in study["results"][arm]] == [0]
    assert "grpo" in (tmp_path / "results.md").read_text() and "gdpo" in (tmp_path / "results.md").read_text()
