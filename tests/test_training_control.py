"""Training controls wired into the trainer: entropy bonus, temperature, alarms that pause, rollback,
dynamic sampling, reward-weight hot reload, pass-rate band filter."""

from __future__ import annotations

import json
import os
import subprocess

import jax
import numpy as np
import pytest

from grpo_jax import presets, train
from grpo_jax.config import override
from grpo_jax.runlog import read_jsonl
from grpo_jax.monitor import PAUSE_EXIT_CODE
from tests.test_train import ROOT, SIGNAL, _leaves, _run, tiny_config


def _mean_last(rows, key, n=2):
    return float(np.mean([r[key] for r in rows[-n:]]))


def test_entropy_bonus_raises_entropy(tmp_path):
    """Same seed, same data: with a large entropy coefficient the policy's token entropy ends higher."""
    runs = {}
    for name, coef in (("off", 0.0), ("on", 0.5)):
        cfg = tiny_config("steps=6", f"entropy.coef={coef}", "sampling.temperature=0.7")
        train.Trainer(cfg, str(tmp_path / name), quiet=True).run()
        runs[name] = read_jsonl(str(tmp_path / name / "metrics.jsonl"))
    assert runs["on"][0]["entropy/mean"] == pytest.approx(runs["off"][0]["entropy/mean"])  # same start
    assert _mean_last(runs["on"], "entropy/mean") > _mean_last(runs["off"], "entropy/mean") + 0.01


def test_adaptive_temperature_reacts_to_low_entropy(tmp_path):
    """A floor far above any reachable entropy: the controller raises the rollout temperature each step,
    within its bound, and the sampler really samples at it (recorded per token)."""
    cfg = tiny_config("steps=4", "temperature.mode=adaptive", "temperature.entropy_floor=100.0",
                      "temperature.step_up=0.1", "temperature.max_temp=1.25", "temperature.window=1")
    tr = train.Trainer(cfg, str(tmp_path), quiet=True)
    temps = []
    for _ in range(4):
        m = tr.step_once().metrics
        temps.append(m["control/temperature"])
    assert temps == pytest.approx([1.0, 1.1, 1.2, 1.25])


def test_pause_alarm_checkpoints_reports_exits_and_resumes(tmp_path):
    rule = json.dumps([{"metric": "reward/total", "kind": "above", "threshold": -1.0, "action": "pause"}])
    out = subprocess.run(_run(tmp_path, "steps=4", f"monitor.rules={rule}"), cwd=ROOT, capture_output=True,
                         text=True, timeout=600)
    assert out.returncode == PAUSE_EXIT_CODE, out.stderr[-2000:]
    assert sorted(os.listdir(tmp_path / "checkpoints")) == ["1"]  # paused right after step 1, saved there
    report = json.loads((tmp_path / "alarms" / "step-1.json").read_text())
    assert report["alarms"][0]["rule"]["metric"] == "reward/total"
    events = [e["kind"] for e in read_jsonl(str(tmp_path / "events.jsonl"))]
    assert "pause" in events
    # resume without the rule: continues at step 2 and finishes
    done = subprocess.run(_run(tmp_path, "steps=4", "monitor.rules=[]") + ["--resume"], cwd=ROOT,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    steps = [r["step"] for r in read_jsonl(str(tmp_path / "metrics.jsonl"))]
    assert steps == [1, 2, 3, 4]


def test_rollback_restarts_from_the_chosen_step_and_marks_the_branch(tmp_path):
    cfg = tiny_config("steps=4", "checkpoint.keep_last=5")
    train.Trainer(cfg, str(tmp_path), quiet=True).run()
    before = read_jsonl(str(tmp_path / "metrics.jsonl"))
    new = override(cfg, ["entropy.coef=0.3"])
    tr = train.Trainer(new, str(tmp_path), rollback_to=2, quiet=True)
    assert tr.step == 2
    tr.run()
    after = read_jsonl(str(tmp_path / "metrics.jsonl"))
    assert [r["step"] for r in after] == [1, 2, 3, 4]
    assert after[:2] == before[:2]  # history up to the branch point kept
    assert after[2]["control/entropy_coef"] == 0.3 and before[2]["control/entropy_coef"] == 0.0
    events = read_jsonl(str(tmp_path / "events.jsonl"))
    rollback = [e for e in events if e["kind"] == "rollback"]
    assert rollback and rollback[0]["to_step"] == 2
    branches = os.listdir(tmp_path / "branches")
    assert len(branches) == 1  # the abandoned steps 3-4 and their logs are archived, not lost
    archived = read_jsonl(str(tmp_path / "branches" / branches[0] / "metrics.jsonl"))
    assert archived == before
    assert sorted(os.listdir(tmp_path / "branches" / branches[0] / "checkpoints")) == ["3", "4"]


def test_a_kl_switched_on_at_a_rollback_takes_the_restored_policy_as_its_reference(tmp_path):
    """Checkpoints written with loss.beta = 0 hold no KL reference; a rollback that switches the KL on anchors it
    to the policy it restores (said once in events.jsonl) and trains with it: a real update moves the policy
    away from that reference, which stays fixed."""
    cfg = tiny_config("steps=3", "checkpoint.keep_last=5")
    train.Trainer(cfg, str(tmp_path), quiet=True).run()
    tr = train.Trainer(override(cfg, ["loss.beta=0.1"]), str(tmp_path), rollback_to=1, quiet=True)
    restored = jax.tree.map(np.asarray, tr.state.params)
    ref = jax.tree.map(np.asarray, tr.state.ref_params)
    assert jax.tree.all(jax.tree.map(np.array_equal, ref, restored))
    notes = [e for e in read_jsonl(str(tmp_path / "events.jsonl")) if e["kind"] == "kl_reference"]
    assert len(notes) == 1 and notes[0]["step"] == 1 and "policy of step 1" in notes[0]["message"]
    m = tr.step_once().metrics
    assert m["grad_norm"] > 0
    moved = max(float(np.abs(np.asarray(a) - b).max()) for a, b in
                zip(jax.tree.leaves(tr.state.params), jax.tree.leaves(restored)))
    assert moved > 0
    assert jax.tree.all(jax.tree.map(np.array_equal, jax.tree.map(np.asarray, tr.state.ref_params), ref))
    tr.release_lock()


def test_dynamic_sampling_uses_zero_variance_groups_only_as_filler(tmp_path):
    """DAPO: zero-variance groups enter the batch only when the round cap leaves no informative ones."""
    cfg = tiny_config("task.name=translation", "sampling.max_new_tokens=16", "dynamic.enabled=true",
                      "dynamic.oversample=2.0", "dynamic.max_rounds=2", "steps=2")
    tr = train.Trainer(cfg, str(tmp_path), quiet=True)
    for _ in range(2):
        m = tr.step_once().metrics
        assert 1 <= m["dynamic/rounds"] <= 2
        assert m["groups/zero_var_frac"] == pytest.approx(m["dynamic/filled_frac"])
        assert m["dynamic/kept"] + m["dynamic/dropped"] >= 4


def test_reward_weights_hot_reload(tmp_path):
    wfile = tmp_path / "weights.json"
    wfile.write_text(json.dumps({"format": 0.5}))
    tr = train.Trainer(tiny_config(f"rewards.weights.weights_file={wfile}"), str(tmp_path / "run"), quiet=True)
    m1 = tr.step_once().metrics
    assert m1["control/weight/format"] == 0.5 and m1["control/weight/math"] == 1.0
    wfile.write_text(json.dumps({"format": 0.0, "math": 2.0}))
    m2 = tr.step_once().metrics
    assert m2["control/weight/format"] == 0.0 and m2["control/weight/math"] == 2.0
    wfile.write_text("{not json")
    with pytest.warns(UserWarning, match="weights"):
        m3 = tr.step_once().metrics
    assert m3["control/weight/math"] == 2.0  # the broken file is ignored, the last good weights stay
    tr.logger.close()
    changes = [e for e in read_jsonl(str(tmp_path / "run" / "events.jsonl")) if e["kind"] == "reward_weights"]
    assert len(changes) >= 2


def test_pass_rate_band_filter(tmp_path):
    rows = [{"prompt": f"{i:03d}+001=", "answer": str(i + 1), "pass_rate": i / 10} for i in range(11)]
    path = tmp_path / "data.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in rows))
    tr = train.Trainer(tiny_config(f"task.train_path={path}", "task.pass_rate_lo=0.2", "task.pass_rate_hi=0.7"),
                       str(tmp_path / "run"), quiet=True)
    kept = sorted(r["pass_rate"] for r in tr.stream.rows)
    assert kept == pytest.approx([0.2, 0.3, 0.4, 0.5, 0.6, 0.7])
    assert tr.data_report["pass_rate_filter"]["kept"] == 6 and tr.data_report["rows"] == 11


@pytest.mark.parametrize("lr, rule, blown", [
    ("1e30", "skipped_updates", "skipped"),  # step 1's update blows the weights up; every later update is skipped
    ("1e3", "stalled_update", "entropy/mean"),  # step 2's entropy 0, then grad_norm exactly 0 at maximal entropy
])
def test_a_broken_learning_rate_pauses_with_a_report_within_10_steps(tmp_path, lr, rule, blown):
    """The default experiment's smoke config, with a length reward so that groups vary (without it every
    reward is 0 and the gradient is 0 at any learning rate), at a learning rate that breaks training."""
    cfg = override(presets.arithmetic(smoke=True), [*SIGNAL, f"optim.lr={lr}", "steps=10", "logging.progress=false",
                                                   "logging.tensorboard=false"])
    tr = train.Trainer(cfg, str(tmp_path), quiet=True)
    before = _leaves(tr.state.params)
    summary = tr.run()
    assert summary["paused"] and summary["steps"] <= 10, summary
    rows = [r for r in read_jsonl(str(tmp_path / "metrics.jsonl")) if "grad_norm" in r]
    assert rows[0]["grad_norm"] > 0 and rows[0]["skipped"] == 0  # step 1 trained for real
    assert any((a != b).any() for a, b in zip(before, _leaves(tr.state.params)))
    report = json.loads((tmp_path / "alarms" / f"step-{summary['steps']}.json").read_text())
    assert rule in [a["key"] for a in report["alarms"] if a["rule"]["action"] == "pause"]
    # step 2 ran the policy step 1's update blew up: the trouble began by then, no kept checkpoint is clean
    # (checkpoint 1 is that policy), and the report names what its first step already showed
    trouble = report["trouble"]
    assert trouble["began"] <= 2 and trouble["first_symptoms"]
    assert trouble["rollback_step"] == 1 and not trouble["before_trouble"]
    assert any(m.startswith(f"{blown}:") for m in trouble["abnormal_at_rollback"]), trouble
    assert "--rollback-to 1 " in report["rollback_command"]
    md = (tmp_path / "alarms" / f"step-{summary['steps']}.md").read_text()
    assert f"first symptom: step {trouble['began']}" in md and "no kept checkpoint comes from before it" in md
    if lr == "1e30":  # logged as it is: the non-finite loss rule sees it
        assert all(np.isnan(r["loss"]) and r["skipped"] == 1 for r in rows[1:])
