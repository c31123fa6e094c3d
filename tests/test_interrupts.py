"""Ctrl-C (SIGINT) and SIGTERM during training: the step in progress finishes, is checkpointed and logged, the
launcher says in one line what --resume will do and exits with 128 + the signal's number; the resumed run is
the uninterrupted one."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time

import pytest

from grpo_jax import interrupts, train
from grpo_jax.checkpoint import Checkpointer
from grpo_jax.runlog import read_jsonl
from tests.launchers import load_launcher
from tests.test_train import ROOT, _assert_rows_have_signal, signal_config


class SignalInTest(Exception):
    """What SIGINT (and SIGTERM) raise in this test process instead of ending pytest itself."""


@pytest.fixture
def sigint_raises():
    """While the test runs, SIGINT raises SignalInTest: the handler the trainer must replace during `run` and put
    back afterwards (and what makes a trainer that leaves SIGINT alone fail this test instead of ending pytest)."""
    def handler(signum, frame):
        raise SignalInTest(signum)

    previous = signal.signal(signal.SIGINT, handler)
    yield handler
    signal.signal(signal.SIGINT, previous)


def _checkpoint_steps(out) -> list[int]:
    ck = Checkpointer(os.path.join(out, "checkpoints"))
    steps = ck.steps()
    ck.close()
    return steps


def test_sigint_mid_run_checkpoints_that_step_and_the_resumed_run_is_the_uninterrupted_one(tmp_path, sigint_raises,
                                                                                            capfd):
    """checkpoint.every=50 of 4 steps: only the interrupt can leave a checkpoint at step 2. SIGINT arrives after
    step 2's update (inside the step, as Ctrl-C would), and again while that checkpoint is written."""
    cfg = signal_config("steps=4", "checkpoint.every=50")
    straight, cut = tmp_path / "straight", tmp_path / "cut"
    train.Trainer(cfg, str(straight), quiet=True).run()

    tr = train.Trainer(cfg, str(cut), quiet=True)
    step_once, save = tr.step_once, tr.save

    def step_then_ctrl_c():
        out = step_once()
        if tr.step == 2:
            signal.raise_signal(signal.SIGINT)
        return out

    def save_under_a_second_ctrl_c(metrics=None):
        signal.raise_signal(signal.SIGINT)
        save(metrics)

    tr.step_once, tr.save = step_then_ctrl_c, save_under_a_second_ctrl_c
    sigterm_before = signal.getsignal(signal.SIGTERM)
    summary = tr.run()
    assert (summary["steps"], summary["interrupted"], summary["paused"]) == (2, "SIGINT", False)
    assert signal.getsignal(signal.SIGINT) is sigint_raises and signal.getsignal(signal.SIGTERM) == sigterm_before
    assert _checkpoint_steps(cut) == [2]
    assert [r["step"] for r in read_jsonl(str(cut / "metrics.jsonl"))] == [1, 2]
    (event,) = [e for e in read_jsonl(str(cut / "events.jsonl")) if e["kind"] == "interrupted"]
    assert (event["step"], event["signal"], event["checkpoint"]) == (2, "SIGINT", 2)
    assert "continues from step 2 to 4" in event["message"] and "note" not in event  # on-policy: resumes exactly
    assert "SIGINT again: still finishing the current step and saving its checkpoint" in capfd.readouterr().err

    resumed = train.Trainer(cfg, str(cut), resume=True, quiet=True)
    assert resumed.step == 2
    ended = resumed.run()
    assert (ended["steps"], ended["interrupted"], ended["paused"]) == (4, None, False)
    _assert_rows_have_signal(straight / "metrics.jsonl")  # the steps trained for real (grad_norm > 0)
    assert (cut / "metrics.jsonl").read_bytes() == (straight / "metrics.jsonl").read_bytes()
    assert (_checkpoint_steps(cut), _checkpoint_steps(straight)) == ([2, 4], [4])


def test_sigterm_ends_the_command_line_with_143_a_checkpoint_and_one_line(tmp_path):
    """`python -m grpo_jax.train --smoke` sent SIGTERM (a preemption) once it has logged a step: it stops at
    a step k < steps with a checkpoint there (checkpoint.every=0 saves only at the end otherwise), no
    traceback, and its last stderr line says what --resume does."""
    out, steps = tmp_path / "run", 60
    cmd = [sys.executable, "-m", "grpo_jax.train", "--smoke", "--quiet", "--out", str(out),
           "--set", f"steps={steps}", "--set", "checkpoint.every=0"]
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    metrics, deadline = out / "metrics.jsonl", time.time() + 600
    while proc.poll() is None and time.time() < deadline:
        if metrics.exists() and any(r.get("step", 0) >= 1 for r in _rows(metrics)):
            break
        time.sleep(0.05)
    proc.send_signal(signal.SIGTERM)
    stdout, stderr = proc.communicate(timeout=600)
    assert proc.returncode == 143, stderr[-3000:]
    assert "Traceback" not in stderr
    last = stderr.strip().splitlines()[-1]
    match = re.fullmatch(r"interrupted by SIGTERM at step (\d+): checkpoint saved; the same command with --resume "
                         rf"continues from step (\d+) to {steps}", last)
    assert match and match[1] == match[2], last
    step = int(match[1])
    assert 1 <= step < steps and stderr.count("interrupted by") == 1
    assert _checkpoint_steps(out) == [step]
    assert max(r["step"] for r in _rows(metrics)) == step


def _rows(path) -> list[dict]:
    """The complete rows of a JSONL file another process is writing (a line cut mid-write is skipped)."""
    rows = []
    for line in open(path, encoding="utf-8"):
        try:
            rows.append(json.loads(line))
        except ValueError:
            pass
    return rows


def test_exit_code_and_line_of_each_signal(capsys):
    with pytest.raises(SystemExit) as stopped:
        interrupts.exit_interrupted("SIGINT", step=2, steps=4)
    assert stopped.value.code == 130
    assert capsys.readouterr().err == ("interrupted by SIGINT at step 2: checkpoint saved; the same command with "
                                       "--resume continues from step 2 to 4\n")
    with pytest.raises(SystemExit) as stopped:
        interrupts.exit_interrupted("SIGTERM", step=0, steps=4)
    assert stopped.value.code == 143
    assert capsys.readouterr().err == ("the run was interrupted by SIGTERM before its first step: nothing to save; "
                                       "the same command starts it again at step 0\n")


def test_caught_leaves_other_threads_and_ignored_signals_alone(sigint_raises):
    """Only the main thread may set handlers (elsewhere signal.signal raises): there `caught` changes nothing;
    a signal the process ignores stays ignored; `enabled=False` (multi-process runs) changes nothing."""
    seen = []

    def in_a_thread():
        with interrupts.caught() as stop:
            seen.append((stop.signal, signal.getsignal(signal.SIGINT)))

    thread = threading.Thread(target=in_a_thread)
    thread.start()
    thread.join()
    assert seen == [(None, sigint_raises)]
    with interrupts.caught(enabled=False):
        assert signal.getsignal(signal.SIGINT) is sigint_raises
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    sigterm_before = signal.signal(signal.SIGTERM, sigint_raises)  # the old default would end pytest
    try:
        with interrupts.caught() as stop:
            assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
            assert signal.getsignal(signal.SIGTERM) == stop.receive
            signal.raise_signal(signal.SIGTERM)
        assert stop.signal == "SIGTERM" and signal.getsignal(signal.SIGTERM) is sigint_raises
    finally:
        signal.signal(signal.SIGINT, sigint_raises)
        signal.signal(signal.SIGTERM, sigterm_before)


def test_an_interrupted_experiment_writes_its_report_and_its_resume_lists_the_stop(tmp_path, sigint_raises,
                                                                                  monkeypatch, capsys):
    """experiments/arithmetic.py --smoke (2 steps) with SIGINT inside step 1: the report covers step 1 and
    says how the segment ended; the exit is 130 after it; --resume trains step 2 and keeps the segment."""
    main = load_launcher("arithmetic").main
    step_once = train.Trainer.step_once

    def step_then_ctrl_c(self):
        out = step_once(self)
        if self.step == 1:
            signal.raise_signal(signal.SIGINT)
        return out

    argv = ["--smoke", "--quiet", "--out", str(tmp_path), "--set", "checkpoint.every=0"]
    with monkeypatch.context() as patch:
        patch.setattr(train.Trainer, "step_once", step_then_ctrl_c)
        with pytest.raises(SystemExit) as stopped:
            main(argv)
    assert stopped.value.code == 130
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        "interrupted by SIGINT at step 1: checkpoint saved; the same command with --resume continues from step 1 to 2")
    report = json.loads((tmp_path / "report.json").read_text())
    assert (report["steps"], report["interrupted"]) == (1, "SIGINT")
    assert _checkpoint_steps(tmp_path) == [1]
    assert "| 1 | 0 -> 1 |" in (tmp_path / "report.md").read_text()
    assert "| by SIGINT |" in (tmp_path / "report.md").read_text()

    final = main([*argv, "--resume"])
    assert (final["steps"], final["interrupted"]) == (2, None)
    assert [(s["from_step"], s["to_step"], s["interrupted"], s["signal"]) for s in final["segments"]] == [
        (0, 1, False, "SIGINT"), (1, 2, False, None)]
    assert final["sft_steps"] == report["sft_steps"] is not None  # the warm start's figures, kept across the stop


def test_with_off_policy_rollouts_the_interrupted_event_notes_the_resume_decodes_on_policy(tmp_path, sigint_raises):
    """rollout.off_policy_steps=1: step 2's rollout was decoded one update behind before the signal; a resume
    cannot redo that (the older params are not checkpointed), and the event says so. At a periodic checkpoint
    nothing is dispatched ahead across it, so no note."""
    for every, noted in ((50, True), (2, False)):
        out = tmp_path / f"every-{every}"
        tr = train.Trainer(signal_config("steps=4", f"checkpoint.every={every}", "rollout.off_policy_steps=1"),
                           str(out), quiet=True)
        step_once = tr.step_once

        def step_then_ctrl_c(tr=tr, step_once=step_once):
            result = step_once()
            if tr.step == 2:
                signal.raise_signal(signal.SIGINT)
            return result

        tr.step_once = step_then_ctrl_c
        assert tr.run()["interrupted"] == "SIGINT"
        (event,) = [e for e in read_jsonl(str(out / "events.jsonl")) if e["kind"] == "interrupted"]
        assert event["checkpoint"] == 2 and ("note" in event) == noted, event
        assert _checkpoint_steps(out) == [2]


def test_a_study_stops_at_an_interrupted_run_naming_it(tmp_path, monkeypatch, capsys):
    """A study trains its runs in-process: one that a signal stopped must end the study (exit 130 with a line
    naming the run) instead of going on to the next segment or arm as if it had finished."""
    from grpo_jax import study

    class Stopped:
        """Trainer.run's summary of a run SIGINT stopped at step 3 of 10 (what the study reads of a Trainer)."""

        def __init__(self, cfg, out_dir, **kwargs):
            self.cfg, self.out_dir = cfg, out_dir

        def set_params(self, params):
            pass

        def run(self):
            return {"steps": 3, "paused": False, "interrupted": "SIGINT", "wall_seconds": 1.0}

    monkeypatch.setattr(study, "Trainer", Stopped)
    cfg = signal_config("steps=10")
    arm = study.Arm(switch_at=5, switch=("optim.lr=0.001",))  # two segments: the second must not start
    with pytest.raises(SystemExit) as stopped:
        study.run_arm(cfg, arm, str(tmp_path), params=None, quiet=True)
    assert stopped.value.code == 130
    assert capsys.readouterr().err == (f"interrupted by SIGINT at step 3 of {tmp_path}: checkpoint saved; the same "
                                       "study command continues from step 3 to 5\n")
