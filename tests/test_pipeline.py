"""The step's pipeline: rollouts dispatched ahead of the host work (bitwise the same run), one-step off-policy
rollouts (whose logprobs are the previous params', whose update is the off-policy PPO update, and whose
kill -9 resume is bitwise), and scoring errors that surface in the loop naming the row."""

from __future__ import annotations

import json
import os
import signal
import time

import jax
import numpy as np
import pytest

from grpo_jax import experience, train, update
from grpo_jax.config import override
from grpo_jax.rewards import RewardError
from grpo_jax.runlog import read_jsonl
from tests.test_train import (SIGNAL, TINY, _assert_moved, _assert_real_signal, _assert_rows_have_signal,
                              _assert_same_update, _leaves, assert_same_final_state, run_straight_and_killed,
                              signal_config)

OFF = "rollout.off_policy_steps=1"


def _copy(tree):
    return jax.tree.map(lambda x: np.array(x), tree)


def test_overlapped_rollouts_leave_every_number_as_it_was(tmp_path):
    """20 real steps with evaluations and checkpoints between them: the next rollout dispatched before the
    step's host work (default) and after it give byte-identical metrics and the same final params."""
    extra = ("steps=20", "checkpoint.every=5", "logging.eval_every=7", "task.n_eval=4")
    finals, streams = [], []
    for name, overlap in (("overlap", "true"), ("sequential", "false")):
        tr = train.Trainer(signal_config(*extra, f"rollout.overlap={overlap}"), str(tmp_path / name), quiet=True)
        before = _leaves(tr.state.params)
        tr.run()
        finals.append(_leaves(tr.state.params))
        _assert_moved(before, finals[-1])
        rows = read_jsonl(str(tmp_path / name / "metrics.jsonl"))
        steps = [r for r in rows if "grad_norm" in r]  # the row of step 0 holds its evaluation only
        _assert_real_signal([r["grad_norm"] for r in steps], [r["skipped"] for r in steps])
        assert len(steps) == 20 and [r["step"] for r in rows if "eval/accuracy" in r] == [0, 7, 14, 20]
        streams.append((tmp_path / name / "metrics.jsonl").read_bytes())
    assert streams[0] == streams[1]
    for a, b in zip(*finals):
        np.testing.assert_array_equal(a, b)


def test_overlap_with_dynamic_sampling_is_bitwise_too(tmp_path):
    """Dynamic sampling: the next step's first round is dispatched ahead; its later rounds draw after it."""
    extra = ("steps=4", "dynamic.enabled=true", "dynamic.max_rounds=2", "checkpoint.every=0")
    streams = []
    for overlap in ("true", "false"):
        train.Trainer(signal_config(*extra, f"rollout.overlap={overlap}"), str(tmp_path / overlap), quiet=True).run()
        rows = _assert_rows_have_signal(tmp_path / overlap / "metrics.jsonl")
        assert max(r["dynamic/rounds"] for r in rows) == 2  # a second round was drawn on some step
        streams.append((tmp_path / overlap / "metrics.jsonl").read_bytes())
    assert streams[0] == streams[1]


def _teacher_forced(tr, params, ro):
    tokens, mask = experience.full_sequences(ro)
    logp, _ = update.completion_logprobs(tr.actor.model_cfg, params, tokens, mask, ro.tokens.shape[-1],
                                         ro.temperatures.reshape(tokens.shape[0], -1))
    m = np.asarray(ro.completion_mask).reshape(tokens.shape[0], -1).astype(bool)
    return np.asarray(logp)[m], np.asarray(ro.logprobs).reshape(tokens.shape[0], -1)[m]


def test_off_policy_rollouts_are_the_previous_params_and_their_update_is_the_off_policy_update(tmp_path):
    """With rollout.off_policy_steps=1 the batch of step k >= 1 was sampled from the params of step k - 1:
    its sampler logprobs are their teacher-forced logprobs (<= 1e-5) and not those of step k's params; and with
    no correction (old_logp_source=sampler) the update is PPO's against that older policy, which a hand-built
    batch (the rollout's tokens, old logprobs teacher-forced under step k - 1's params) reproduces."""
    cfg = signal_config("steps=4", OFF, "checkpoint.every=0", "sampling.temperature=1.0")
    tr = train.Trainer(cfg, str(tmp_path / "run"), quiet=True)
    hand_step = jax.jit(update.make_train_step(tr.actor.model_cfg, cfg, tr.parts.optimizer))
    history, lags = [_copy(tr.state.params)], []
    for k in range(cfg.steps):
        state_before = jax.tree.map(lambda x: x.copy(), tr.state)  # the trainer's step donates its state
        out = tr.step_once()
        lags.append(out.metrics["rollout/lag"])
        assert out.metrics["grad_norm"] > 0 and "gap/kl" in out.metrics  # the gap is measured every step
        history.append(_copy(tr.state.params))
        ro = out.experience.rollout
        behaviour, sampler_logp = _teacher_forced(tr, history[max(k - 1, 0)], ro)  # history[j]: step j's params
        np.testing.assert_allclose(sampler_logp, behaviour, atol=1e-5)
        if k == 0:
            continue
        current, _ = _teacher_forced(tr, history[k], ro)
        assert np.abs(current - sampler_logp).max() > 1e-3, "the rollout matches the current params too"
        assert out.metrics["gap/kl"] > 0
        # the hand-built off-policy update from the state before step k
        adv, _ = experience.advantages_and_diagnostics(out.experience, tr.reward_weights.at(k), cfg=cfg.advantage)
        batch = experience.make_batch(out.experience, adv, tr.mesh)
        tokens, mask = experience.full_sequences(ro)
        old, _ = update.completion_logprobs(tr.actor.model_cfg, history[k - 1], tokens, mask, ro.tokens.shape[-1],
                                            ro.temperatures.reshape(tokens.shape[0], -1))
        batch = batch.replace(old_logp=old)
        state, _ = hand_step(state_before, batch, tr._step_keys(k)[1], np.float32(tr.entropy_ctl.value(k)))
        _assert_same_update(_leaves(tr.state.params), _leaves(state.params), _leaves(state_before.params))
    assert lags == [0.0, 1.0, 1.0, 1.0]


def test_off_policy_steps_after_a_checkpoint_are_decoded_with_their_own_params(tmp_path):
    tr = train.Trainer(signal_config("steps=5", OFF, "checkpoint.every=2"), str(tmp_path), quiet=True)
    tr.run()
    rows = _assert_rows_have_signal(tmp_path / "metrics.jsonl")
    # step k's row is logged as k + 1; checkpoints at steps 2 and 4 make steps 2 and 4 fresh
    assert [r["rollout/lag"] for r in rows] == [0.0, 1.0, 0.0, 1.0, 0.0]


def test_off_policy_kill_minus_9_then_resume_is_bitwise_identical(tmp_path):
    """6 real steps, a checkpoint every 3, killed after the checkpoint at 3: the resumed run decodes step 3
    with its own params, as the uninterrupted run did, and everything after is the same bytes."""
    steps = 6
    extra = (*SIGNAL, f"steps={steps}", OFF, "checkpoint.every=3")
    run_straight_and_killed(tmp_path, extra, steps=steps, kill_after=3)
    rows = _assert_rows_have_signal(tmp_path / "straight" / "metrics.jsonl")
    assert [r["rollout/lag"] for r in rows] == [0.0, 1.0, 1.0, 0.0, 1.0, 1.0]
    straight, killed = ((tmp_path / name / "metrics.jsonl").read_bytes() for name in ("straight", "killed"))
    assert straight == killed
    assert_same_final_state(tmp_path, extra, steps=steps)


# A reward that follows the reward contract itself (as one made with `base.reward` does), so nothing between it and
# the registry catches what it raises: a bug, or a verifier that went away. It counts its calls in a file and
# raises from its 33rd call on: 16 completions a step, so the third step's first completion.
RAISING_REWARD = """
import os
from grpo_jax.rewards import RewardResult

def fails_on_third_step(response, sample, **kwargs):
    marker = os.environ["GRPO_TEST_MARKER"]
    calls = int(open(marker).read()) if os.path.exists(marker) else 0
    with open(marker, "w") as f:
        f.write(str(calls + 1))
    if calls >= 32:
        raise RuntimeError("the verifier is gone")
    return RewardResult(1.0, {"reason": "ok"})

fails_on_third_step.reward_name = "fails_on_third_step"
fails_on_third_step.reward_version = "1"
"""


@pytest.mark.parametrize("mode", ["rollout.overlap=true", OFF])
def test_a_reward_that_raises_mid_run_stops_it_naming_the_row(tmp_path, monkeypatch, mode):
    """A reward that raises while the next rollout is in flight ends the run in the main loop with the reward
    and the row named, without hanging; the steps logged before stay whole. Off-policy, step 2's rollout is
    scored ahead during step 1: the error waits for step 2, so step 1 is logged first."""
    (tmp_path / "pipeline_rewards.py").write_text(RAISING_REWARD)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("GRPO_TEST_MARKER", str(tmp_path / "calls"))
    specs = json.dumps([{"name": "length", "kwargs": {"target": 6}},
                        {"name": "pipeline_rewards:fails_on_third_step", "weight": 0.0}])
    cfg = override(train.TrainConfig(), [*TINY, f"rewards.specs={specs}", "steps=5", mode, "checkpoint.every=0"])
    tr = train.Trainer(cfg, str(tmp_path / "run"), quiet=True)
    named = r"fails_on_third_step.*response 0 of 16 \(row prompt '.*the verifier is gone"
    with pytest.raises(RewardError, match=named):
        tr.run()
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2]


SLEEPER = "<think>x</think>```python\nimport time\ntime.sleep(60)\ndef inc(x):\n    return x + 1\n```"
CODE_ROW = {"tests": "def check(f):\n    assert f(2) == 3\n", "entry_point": "inc", "answer": "3", "id": "inc-1"}


def _children(pid: int) -> list[int]:
    """Every live descendant of `pid` (from /proc)."""
    parents = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    parents[int(entry)] = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
    found, frontier = [], [pid]
    while frontier:
        kids = [p for p, pp in parents.items() if pp in frontier]
        found += kids
        frontier = kids
    return found


def test_a_killed_sandbox_worker_scores_its_row_killed_and_nothing_hangs():
    """The code reward's sandbox process is killed (SIGKILL, from outside) while the host scores: that one
    completion scores 0 with reason `killed`, not `timeout` (its limit is 60 s: the host did not wait it out),
    and the others score. No bound on the elapsed time, which a loaded machine stretches: the reason shows it."""
    from grpo_jax.rewards import RewardSpec, evaluate

    good = SLEEPER.replace("import time\ntime.sleep(60)\n", "")
    specs = [RewardSpec("code", 1.0, {"wall_s": 60.0, "cpu_s": 60.0})]
    result = {}

    def killer():  # the sandbox's whole process tree (its wrapper and the program), once the program runs
        deadline = time.time() + 30
        while time.time() < deadline and "done" not in result:
            tree = _children(os.getpid())
            if len(tree) >= 2 or (tree and time.time() > deadline - 25):
                time.sleep(0.5)  # the program is past its start-up, inside its sleep
                for pid in _children(os.getpid()):
                    try:
                        os.kill(pid, signal.SIGKILL)
                        result["killed"] = pid
                    except OSError:
                        pass
                return
            time.sleep(0.02)

    import threading

    thread = threading.Thread(target=killer)
    thread.start()
    r, infos = evaluate(specs, [SLEEPER], [CODE_ROW])
    result["done"] = True
    thread.join()
    assert "killed" in result
    assert r[0, 0] == 0.0 and infos["per_response"][0]["code"]["reason"] == "killed"
    r, _ = evaluate(specs, [good], [CODE_ROW])  # the pool of the next call works as before
    assert r[0, 0] == 1.0


def test_a_shut_down_sandbox_pool_is_an_error_naming_the_row():
    from grpo_jax.rewards import RewardSpec, evaluate
    from grpo_jax.rewards.sandbox import SandboxPool

    pool = SandboxPool(1)
    pool.close()
    named = r"reward 'code' \(code\) failed on response 0 of 2 \(row id='inc-1'\).*after shutdown"
    with pytest.raises(RewardError, match=named):
        evaluate([RewardSpec("code")], [SLEEPER, SLEEPER], [CODE_ROW, dict(CODE_ROW, id="inc-2")], pool=pool)


def test_off_policy_with_dynamic_sampling_decodes_later_rounds_with_the_steps_params(tmp_path):
    """Only a step's first round is decoded ahead; rollout/lag is the share of the batch's groups from it."""
    cfg = signal_config("steps=4", OFF, "checkpoint.every=0", "dynamic.enabled=true", "dynamic.max_rounds=2")
    train.Trainer(cfg, str(tmp_path), quiet=True).run()
    rows = _assert_rows_have_signal(tmp_path / "metrics.jsonl")
    for r in rows[1:]:
        assert r["rollout/lag"] == r["dynamic/first_round_frac"] > 0
    assert rows[0]["rollout/lag"] == 0.0 and any(r["dynamic/first_round_frac"] < 1 for r in rows)


# Rewards declared to wait (`user_reward(threads=)`), for the trainer. `chars` scores the completion's length;
# `judged` does the same from threads; `after_the_log` is judged only once the step before its batch has been
# logged (it reads metrics.jsonl): 16 completions a step, so its calls 16b..16b+15 are step b+1's.
THREADED_REWARDS = """
import os, threading, time
from grpo_jax.rewards import user_reward

CALLS, LOCK = [0], threading.Lock()

def _chars(completion):
    return min(len(completion), 12) / 12

@user_reward("1")
def chars(completion, **row):
    return _chars(completion)

@user_reward("1", threads=4)
def judged(completion, **row):
    assert threading.current_thread() is not threading.main_thread()  # else it scores 0: a different run
    return _chars(completion)

@user_reward("1", threads=4)
def after_the_log(completion, **row):
    with LOCK:
        batch, CALLS[0] = CALLS[0] // 16, CALLS[0] + 1
    path, deadline = os.environ["GRPO_TEST_METRICS"], time.monotonic() + 20
    while time.monotonic() < deadline:
        if batch == 0 or (os.path.exists(path) and open(path).read().count('"grad_norm"') >= batch):
            return 1.0
        time.sleep(0.01)
    return 0.0
"""


def _threaded_config(tmp_path, monkeypatch, module, *specs, extra=()):
    (tmp_path / f"{module}.py").write_text(THREADED_REWARDS)
    monkeypatch.syspath_prepend(str(tmp_path))
    signal = json.loads(SIGNAL[0].partition("=")[2])  # math, format, length: a gradient on a random model
    return signal_config(OFF, "checkpoint.every=0", *extra, "rewards.specs=" + json.dumps([*signal, *specs]))


def test_a_reward_with_threads_changes_no_number(tmp_path, monkeypatch):
    """The same reward run inline and from threads (scored ahead, collected by the next step): byte-identical
    metrics over 4 real steps."""
    streams = []
    for name in ("chars", "judged"):
        spec = {"name": f"threaded_rewards_a:{name}", "label": "length_score", "weight": 0.5}
        tr = train.Trainer(_threaded_config(tmp_path, monkeypatch, "threaded_rewards_a", spec, extra=["steps=4"]),
                           str(tmp_path / name), quiet=True)
        before = _leaves(tr.state.params)
        tr.run()
        _assert_moved(before, _leaves(tr.state.params))
        rows = _assert_rows_have_signal(tmp_path / name / "metrics.jsonl")
        assert all(r["reward/length_score/mean"] > 0 for r in rows)
        streams.append((tmp_path / name / "metrics.jsonl").read_bytes())
    assert streams[0] == streams[1]


def test_off_policy_a_waiting_reward_is_judged_while_the_step_before_is_logged(tmp_path, monkeypatch):
    """Off-policy, step k+1's rollout is scored while step k finishes: a reward with threads is still being
    judged when step k logs, and step k+1 collects it. `after_the_log` returns 1 only once step k is in
    metrics.jsonl, so a trainer that waited for it before logging would see it give up (20 s) and score 0."""
    monkeypatch.setenv("GRPO_TEST_METRICS", str(tmp_path / "run" / "metrics.jsonl"))
    spec = {"name": "threaded_rewards_b:after_the_log", "weight": 0.0}
    tr = train.Trainer(_threaded_config(tmp_path, monkeypatch, "threaded_rewards_b", spec), str(tmp_path / "run"),
                       quiet=True)
    tr.run()
    rows = _assert_rows_have_signal(tmp_path / "run" / "metrics.jsonl")
    assert [r["step"] for r in rows] == [1, 2, 3] and [r["rollout/lag"] for r in rows] == [0.0, 1.0, 1.0]
    assert [r["reward/after_the_log/mean"] for r in rows] == [1.0, 1.0, 1.0]
