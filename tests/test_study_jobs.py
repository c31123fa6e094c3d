"""--jobs: a study's runs split over processes pinned one core each, sharing one warm start kept on disk."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys

import flax
import jax
import numpy as np
import pytest

from grpo_jax import presets, study
from grpo_jax.study import Arm, job_splits, run_jobs, select_arms
from tests.launchers import load_launcher
from tests.test_train import ROOT


def _arms(names):
    return {n: Arm() for n in names}


def test_job_splits_cover_each_run_once_in_near_equal_shares():
    arms = _arms([f"a{i}" for i in range(13)])
    jobs = job_splits(arms, [0, 1, 2], 2)
    runs = [[(a, int(s)) for p in job for a in p[1].split(",") for s in p[3].split(",")] for job in jobs]
    assert all(p[0] == "--arms" and p[2] == "--seeds" for job in jobs for p in job)
    assert sorted(sum(runs, [])) == sorted((a, s) for a in arms for s in (0, 1, 2))  # every run once
    assert [len(r) for r in runs] == [20, 19]  # 39 runs: 13 + 7 and 6 + 13
    # seed by seed: seed 1 is cut (arms a0-a6 in the first share, a7-a12 in the second); seeds 0 and 2 travel
    # whole, so only seed 1's warm start is wanted by both slots
    every = ",".join(f"a{i}" for i in range(13))
    first, rest = ",".join(f"a{i}" for i in range(7)), ",".join(f"a{i}" for i in range(7, 13))
    assert jobs[0] == [["--arms", every, "--seeds", "0"], ["--arms", first, "--seeds", "1"]]
    assert jobs[1] == [["--arms", rest, "--seeds", "1"], ["--arms", every, "--seeds", "2"]]
    four = job_splits(_arms(["none", "null", "c1", "c2"]), [1, 2, 3, 4], 2)  # a study's usual shape
    assert four == [[["--arms", "none,null,c1,c2", "--seeds", "1,2"]], [["--arms", "none,null,c1,c2", "--seeds", "3,4"]]]
    one = job_splits(_arms(["a"]), [0, 1, 2], 2)
    assert one == [[["--arms", "a", "--seeds", "0,1"]], [["--arms", "a", "--seeds", "2"]]]
    two = job_splits(_arms(["a", "b"]), [0], 8)  # never more slots than runs
    assert two == [[["--arms", "a", "--seeds", "0"]], [["--arms", "b", "--seeds", "0"]]]


def test_select_arms_runs_extra_arms_by_name_only_and_names_them_in_the_error():
    arms, extra = _arms(["none", "lower_lr"]), {"kl_passk": Arm(("loss.beta=0.1",))}
    assert list(select_arms(arms, None, extra)) == ["none", "lower_lr"]  # the default leaves the extra arm out
    picked = select_arms(arms, "kl_passk,none,gspo", extra)
    assert list(picked) == ["kl_passk", "none", "gspo"] and picked["kl_passk"] is extra["kl_passk"]
    with pytest.raises(SystemExit, match="not run by default: kl_passk"):
        select_arms(arms, "kl_pass", extra)


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="no CPU affinity on this platform")
def test_run_jobs_pins_each_slot_to_one_core_runs_its_commands_in_turn_and_names_a_failed_log(tmp_path):
    cores = sorted(os.sched_getaffinity(0))
    show = [sys.executable, "-c", "import os; print(sorted(os.sched_getaffinity(0)))"]
    wall = run_jobs([[show], [show, show], [show]], str(tmp_path / "ok"))
    for k, n in enumerate((1, 2, 1)):
        lines = (tmp_path / "ok" / f"job{k}.log").read_text().splitlines()
        seen = [json.loads(line) for line in lines if line.startswith("[")]
        assert seen == [[cores[k % len(cores)]]] * n and sum(line.startswith("$ ") for line in lines) == n
    assert sorted(os.sched_getaffinity(0)) == cores and wall > 0  # this thread's affinity is untouched
    fail = [sys.executable, "-c", "print('the last words'); raise SystemExit(3)"]
    with pytest.raises(SystemExit) as e:
        run_jobs([[show], [fail, show]], str(tmp_path / "bad"))
    msg = str(e.value)
    assert "job1.log (exit 3)" in msg and "the last words" in msg and "job0.log" not in msg
    assert (tmp_path / "bad" / "job1.log").read_text().count("$ ") == 1  # the slot stopped at its failure


def test_warm_start_is_kept_and_reused_only_with_the_same_settings(tmp_path, monkeypatch):
    cfg = load_launcher("reward_collapse").get_config(smoke=True)
    sft = {k: v for k, v in presets.COUNTDOWN_SFT_SMOKE.items() if k != "n_valid"}  # run_study passes n_valid
    params, summary = study.kept_warm_start(cfg, str(tmp_path), 20, dict(sft))
    calls = []
    real = study.warm_start
    monkeypatch.setattr(study, "warm_start", lambda *a, **k: calls.append(1) or real(*a, **k))
    again, summary_again = study.kept_warm_start(cfg, str(tmp_path), 20, dict(sft))
    assert calls == [] and summary_again["sft_steps"] == summary["sft_steps"]  # read from disk, not trained
    for a, b in zip(jax.tree.leaves(params), jax.tree.leaves(again), strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    # other settings (here n_valid, then the seed) are trained again, and their warm start replaces the kept one
    study.kept_warm_start(cfg, str(tmp_path), 21, dict(sft))
    assert calls == [1]
    other, _ = study.kept_warm_start(dataclasses.replace(cfg, seed=cfg.seed + 1), str(tmp_path), 21, dict(sft))
    assert calls == [1, 1]
    assert any(not np.array_equal(np.asarray(a), np.asarray(b))
               for a, b in zip(jax.tree.leaves(params), jax.tree.leaves(other)))


# At --smoke scale the warm start answers nothing right, so only the study's length budget (SMOKE_BUDGET tokens)
# varies within a group, with where each completion stops: the runs get a gradient, and the test can see that each
# slot trained.
def test_reward_collapse_jobs_trains_every_run_once_and_summarizes_them(tmp_path):
    restore_policy = load_launcher("pass_at_k").restore_policy
    cmd = [sys.executable, "experiments/reward_collapse.py", "--smoke", "--quiet", "--out", str(tmp_path), "--arms",
           "grpo,gdpo,per_dim", "--seeds", "0,1,2", "--jobs", "2"]
    out = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, out.stderr[-3000:]
    study_json = json.loads((tmp_path / "results.json").read_text())
    assert study_json["jobs"] == 2 and study_json["wall_seconds"] > 0
    assert {a: [r["seed"] for r in runs] for a, runs in study_json["results"].items()} == {
        "grpo": [0, 1, 2], "gdpo": [0, 1, 2], "per_dim": [0, 1, 2]}
    for arm in ("grpo", "gdpo", "per_dim"):
        for seed in (0, 1, 2):
            rows = [json.loads(line) for line in open(tmp_path / arm / f"seed{seed}" / "metrics.jsonl")]
            steps = json.loads((tmp_path / arm / f"seed{seed}" / "config.json").read_text())["steps"]
            assert max(r["step"] for r in rows) == steps > 0
            assert all(r["grad_norm"] > 0 for r in rows if "grad_norm" in r), (arm, seed)  # a gradient every step
            assert sum("grad_norm" in r for r in rows) == steps
    # 9 runs, seed by seed, in shares of 5 and 4: slot 0 runs seed 0's three arms, then grpo and gdpo on seed 1;
    # slot 1 per_dim on seed 1, then seed 2's three arms. Each seed has its own warm start, shared by its arms:
    # only seed 1's is wanted by both slots; slot 1 trains it first (the first to take its folder's lock trains
    # it, a process wanting it meanwhile waits) and slot 0's second process loads it from disk
    logs = [(tmp_path / "jobs" / f"job{k}.log").read_text() for k in (0, 1)]
    for log in logs:
        assert log.count("$ ") == 2 and "Traceback" not in log, log[-2000:]
    assert sum(log.count("warm start: loaded") for log in logs) == 1, [log[-2000:] for log in logs]
    assert sorted(os.listdir(tmp_path / "warm_start")) == ["seed0", "seed1", "seed2"]
    assert "--arms grpo,gdpo --seeds 1 --jobs 1 --quiet" in out.stdout
    assert "--arms per_dim --seeds 1 --jobs 1 --quiet" in out.stdout
    # the first run of slot 0 and the last of slot 1 ended with other params than the warm start they began from
    for arm, seed in (("grpo", 0), ("per_dim", 2)):
        _, params, step = restore_policy(str(tmp_path / arm / f"seed{seed}"))
        blob = (tmp_path / "warm_start" / f"seed{seed}" / "warm_start.msgpack").read_bytes()
        start = flax.serialization.from_bytes(params, blob)
        assert step > 0 and any(not np.array_equal(np.asarray(a), np.asarray(b))
                                for a, b in zip(jax.tree.leaves(params), jax.tree.leaves(start), strict=True)), arm


def _wait_for(predicate, proc, timeout=600.0):
    import time
    end = time.monotonic() + timeout
    while time.monotonic() < end and proc.poll() is None:
        if predicate():
            return True
        time.sleep(0.02)
    return False


def test_a_study_killed_mid_run_resumes_with_the_same_command(tmp_path):
    # 2 arms x 1 seed, 30 steps each, a checkpoint every step. kill -9 once gdpo (the second run) has a
    # checkpoint at step >= 2; the same command then keeps grpo's finished run byte for byte, resumes gdpo
    # from its newest checkpoint (not from step 0) and writes the results of both.
    cmd = [sys.executable, "experiments/reward_collapse.py", "--smoke", "--quiet", "--out", str(tmp_path), "--arms",
           "grpo,gdpo", "--set", "steps=30"]
    ckpts = tmp_path / "gdpo" / "seed0" / "checkpoints"
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True)
    caught = _wait_for(lambda: ckpts.is_dir() and any(n.isdigit() and int(n) >= 2 for n in os.listdir(ckpts)), proc)
    os.killpg(proc.pid, 9)
    proc.wait()
    assert caught, "the study ended before gdpo wrote a checkpoint: nothing was interrupted"
    assert not (tmp_path / "results.json").exists()
    grpo_files = {p: p.read_bytes() for p in (tmp_path / "grpo" / "seed0").rglob("*") if p.is_file()}
    rows = [json.loads(line) for line in open(tmp_path / "grpo" / "seed0" / "metrics.jsonl")]
    assert max(r["step"] for r in rows) == 30 and all(r["grad_norm"] > 0 for r in rows if "grad_norm" in r)
    again = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert again.returncode == 0, again.stderr[-3000:]
    assert {p: p.read_bytes() for p in (tmp_path / "grpo" / "seed0").rglob("*") if p.is_file()} == grpo_files
    events = [json.loads(line) for line in open(tmp_path / "gdpo" / "seed0" / "events.jsonl")]
    resumed = [e["step"] for e in events if e["kind"] == "resume"]
    assert len(resumed) == 1 and resumed[0] >= 2, events  # from a checkpoint, not from step 0
    assert not [e for e in events if e["kind"] == "restart"]
    rows = [json.loads(line) for line in open(tmp_path / "gdpo" / "seed0" / "metrics.jsonl")]
    trained = [r["step"] for r in rows if "grad_norm" in r]
    assert trained == list(range(1, 31)), trained  # every step once: nothing lost, nothing logged twice
    assert all(r["grad_norm"] > 0 for r in rows if "grad_norm" in r)
    results = json.loads((tmp_path / "results.json").read_text())["results"]
    assert [r["seed"] for r in results["grpo"]] == [0] and [r["seed"] for r in results["gdpo"]] == [0]
    # the resumed run's final policy moved away from the warm start it began from
    _, params, step = load_launcher("pass_at_k").restore_policy(str(tmp_path / "gdpo" / "seed0"))
    start = flax.serialization.from_bytes(params, (tmp_path / "warm_start" / "seed0" / "warm_start.msgpack").read_bytes())
    assert step == 30 and any(not np.array_equal(np.asarray(a), np.asarray(b))
                              for a, b in zip(jax.tree.leaves(params), jax.tree.leaves(start), strict=True))
