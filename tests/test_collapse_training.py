"""The collapse instruments through real training steps: each new diagnostic against a NumPy recomputation
from the step's own rollout and rewards, the curriculum and the per-token temperature run through the
trainer, dynamic sampling per the estimator, and a pause by the entropy alarm that rolls back and recovers."""

from __future__ import annotations

import dataclasses
import json
import os
import shlex

import jax
import numpy as np
import pytest

from grpo_jax import advantages, experience, train
from grpo_jax.config import AdvantageConfig, MonitorConfig
from grpo_jax.runlog import read_jsonl
from tests.test_logging import _event_file_records
from tests.test_advantages import estimator_err
from tests.test_train import _leaves, step_logprob_tol, tiny_config
from tests.tolerance import EPS32, EPS64, center_err, group_var_mean_tol, pearson_tol, rounding_tol, zscore_err

# translation: chrF quality varies between random completions, so the groups have reward variance
VARIED = ("task.name=translation", "sampling.max_new_tokens=16", "steps=2")


def _grpo_advantages(totals_BxG: np.ndarray, eps: float = 1e-6) -> np.ndarray:
    """grpo: group z-score of the weighted totals, ddof 1, + eps; a constant group gets 0."""
    mean = totals_BxG.mean(axis=1, keepdims=True)
    std = totals_BxG.std(axis=1, ddof=1, keepdims=True)
    const = (totals_BxG.max(axis=1) == totals_BxG.min(axis=1))[:, None]
    return np.where(const, 0.0, (totals_BxG - mean) / (std + eps))


def _pearson(x: np.ndarray, y: np.ndarray) -> float:
    x, y = x - x.mean(), y - y.mean()
    denom = np.sqrt((x * x).sum() * (y * y).sum())
    return float((x * y).sum() / denom) if denom > 0 else 0.0


def test_new_diagnostics_equal_a_numpy_recomputation_from_the_step(tmp_path):
    tr = train.Trainer(tiny_config(*VARIED), str(tmp_path), quiet=True)
    before = _leaves(tr.state.params)
    out = tr.step_once()
    m, exp, hists = out.metrics, out.experience, out.histograms
    assert m["grad_norm"] > 0 and any((a != b).any() for a, b in zip(before, _leaves(tr.state.params)))
    r = exp.rewards.astype(np.float64)  # [B, G, K]
    w = tr.reward_weights.at(0).astype(np.float64)
    dims = tr.actor.dims
    assert r[..., dims.index("translation")].std(axis=1).max() > 0  # real within-group variance
    totals = (r * w).sum(-1)
    adv = _grpo_advantages(totals)
    # the step's float32 statistics against float64 recomputations from the same (float32) rewards; the step's
    # weights are float32 (eps/2 of each w_k r_k) and its totals sum K of them (2K eps/2): total_err; its
    # advantages are within estimator_err of the exact z-scores, and of those of these totals by zscore_err
    u, (b, g, n_k) = EPS32 / 2, r.shape
    total_err = (2 * n_k + 1) * u * np.abs(r * w).sum(-1)
    adv_err = estimator_err("grpo", r, w) + zscore_err(totals, 1e-6, u * np.abs(r * w).sum(-1)).max()
    drowned = 0
    for k, d in enumerate(dims):
        # a mean over B groups of means over G: G + B + 2 roundings of eps/2 of the largest reward
        mean_tol = (g + b + 2) * u * np.abs(r[..., k]).max()
        np.testing.assert_allclose(m[f"reward/{d}/within_group_mean"], r[..., k].mean(1).mean(), rtol=0, atol=mean_tol)
        np.testing.assert_allclose(m[f"reward/{d}/within_group_var"], r[..., k].var(1).mean(), rtol=0,
                                   atol=group_var_mean_tol(r[..., k]))
        centred = r[..., k] - r[..., k].mean(1, keepdims=True)
        corr_within = _pearson(centred.ravel(), adv.ravel())
        tol = pearson_tol(centred, adv, center_err(r[..., k]), adv_err)  # the step centres per group first
        np.testing.assert_allclose(m[f"reward/{d}/adv_corr_within"], corr_within, rtol=0, atol=tol)
        tol = pearson_tol(r[..., k], adv, 0.0, adv_err)
        np.testing.assert_allclose(m[f"reward/{d}/adv_corr"], _pearson(r[..., k].ravel(), adv.ravel()), rtol=0,
                                   atol=tol)
        varies = np.mean(r[..., k].max(1) > r[..., k].min(1)) >= 0.1
        drowned += int(varies and abs(corr_within) < 0.1 and w[k] != 0)
    assert m["collapse/drowned_dims"] == drowned
    np.testing.assert_allclose(m["reward/total"], totals.mean(), rtol=1e-5)
    np.testing.assert_allclose(m["groups/reward_var_mean"], totals.var(1).mean(), rtol=0,
                               atol=group_var_mean_tol(totals, total_err[..., None].max(1)))
    np.testing.assert_allclose(m["groups/zero_var_frac"], np.mean(totals.max(1) == totals.min(1)))
    # lengths: numpy's linear percentiles of the B*G completion lengths; the budget is T = 16
    lengths = np.asarray(exp.rollout.lengths, np.float64).ravel()
    for q in (10, 50, 90):
        np.testing.assert_allclose(m[f"length/p{q}"], np.percentile(lengths, q), rtol=1e-6)
    np.testing.assert_allclose(m["length/mean_frac"], lengths.mean() / 16, rtol=1e-6)
    # entropy histogram: 20 bins of width 0.2 on [0, 4), everything >= 4 in the last, fractions of tokens
    ent = np.asarray(exp.rollout.entropies)[np.asarray(exp.rollout.completion_mask) > 0]
    edges, fractions = hists["entropy/hist"]
    # float32 linspace: the step 4 / 20 and start + i step, 2 roundings of eps/2 of <= 4: 2 ulps is 2x room
    np.testing.assert_allclose(edges, np.linspace(0, 4, 21), rtol=0, atol=rounding_tol(4.0, ulps=2))
    counts = np.bincount(np.clip(np.floor(ent / 0.2).astype(int), 0, 19), minlength=20)
    # an exact count / n in float32: one rounding of eps/2; 1 ulp is 2x room
    np.testing.assert_allclose(fractions, counts / len(ent), rtol=0, atol=rounding_tol(counts / len(ent), ulps=1))
    # thinking segments, in characters, from the decoded texts: up to the first </think> (from an opening
    # <think> before it, else from the start), or all after an unclosed <think>, or nothing without tags
    def thinking(t):
        if "</think>" in t:
            head = t.split("</think>", 1)[0]
            return head.split("<think>", 1)[1] if "<think>" in head else head
        return t.split("<think>", 1)[1] if "<think>" in t else ""

    think = [len(thinking(t).strip()) for t in exp.texts]
    np.testing.assert_allclose(m["think/chars_p50"], np.percentile(think, 50))
    np.testing.assert_allclose(m["think/chars_mean"], np.mean(think))


def test_histogram_and_new_metrics_reach_the_logs(tmp_path):
    train.Trainer(tiny_config(*VARIED, "logging.tensorboard=true"), str(tmp_path), quiet=True).run()
    rows = read_jsonl(str(tmp_path / "metrics.jsonl"))
    for row in rows:
        # the row's 20 fractions are rounded to 5 decimals (runlog): 20 x 5e-6 off 1, and their float32 eps/2
        assert len(row["entropy/hist"]) == 20 and abs(sum(row["entropy/hist"]) - 1) <= 20 * 5e-6 + EPS32 / 2
        for key in ("length/p10", "length/p90", "think/chars_p50", "collapse/drowned_dims",
                    "reward/translation/within_group_var", "reward/format/adv_corr_within"):
            assert key in row, key
    histos = [(e.step, v.histo) for e in _event_file_records(str(tmp_path / "tb")) for v in e.summary.value
              if v.tag == "entropy/hist"]
    assert [step for step, _ in histos] == [1, 2]
    for (_, h), row in zip(histos, rows):
        assert len(h.bucket) == 20 and list(h.bucket_limit)[-1] == pytest.approx(4.0)
        # TensorBoard holds the fractions, the metrics row them rounded to 5 decimals (runlog): half a unit, 5e-6
        np.testing.assert_allclose(h.bucket, row["entropy/hist"], rtol=0, atol=5e-6 + rounding_tol(1.0, 1, EPS64))


def test_reward_weight_curriculum_runs_through_the_trainer(tmp_path):
    """format ramped 0 -> 1 over steps 0..4: the logged weight follows the ramp and the advantages see it
    (with weight 0 the format dimension cannot move the totals)."""
    cfg = tiny_config(*VARIED, "steps=4", 'rewards.weights.schedule=[["format", [[0, 0.0], [4, 1.0]]]]')
    tr = train.Trainer(cfg, str(tmp_path), quiet=True)
    weights = []
    for _ in range(4):
        out = tr.step_once()
        m, exp = out.metrics, out.experience
        weights.append(m["control/weight/format"])
        w = tr.reward_weights.at(tr.step - 1)
        _, aux = advantages.compute_advantages(exp.rewards, w, cfg=tr.cfg.advantage)
        np.testing.assert_allclose(aux["totals"], (exp.rewards * w).sum(-1), rtol=1e-6)
    assert weights == pytest.approx([0.0, 0.05, 0.1, 0.15])  # the task's base weight 0.2 x ramp 0, 1/4, 2/4, 3/4


def test_per_token_temperature_runs_through_the_trainer(tmp_path):
    """An entropy floor above every position's entropy: each token is sampled at min(0.7 x 1.5, 2.0) = 1.05,
    recorded per token, and the update's logprobs agree with the sampler's at those temperatures."""
    cfg = tiny_config("steps=2", "sampling.temperature=0.7", "sampling.token_entropy_floor=100.0",
                      "sampling.token_boost=1.5")
    tr = train.Trainer(cfg, str(tmp_path), quiet=True)
    params = jax.tree.map(np.asarray, tr.policy_params())  # a copy: the step donates the state
    out = tr.step_once()
    m, exp = out.metrics, out.experience
    mask = np.asarray(exp.rollout.completion_mask) > 0
    np.testing.assert_allclose(np.asarray(exp.rollout.temperatures)[mask], 1.05, rtol=1e-6)
    # teacher forcing divided the logits by the recorded 1.05, as the sampler did: the mean |gap| is within the
    # two programs' logprob_tol at those temperatures
    assert m["logp_gap"] <= step_logprob_tol(tr, params, out)
    off = train.Trainer(tiny_config("steps=2", "sampling.temperature=0.7"), str(tmp_path / "off"), quiet=True)
    exp_off = off.step_once().experience
    np.testing.assert_allclose(np.asarray(exp_off.rollout.temperatures)[np.asarray(exp_off.rollout.completion_mask) > 0],
                               0.7, rtol=1e-6)


def test_dynamic_sampling_asks_the_estimator_which_groups_carry_signal():
    """Weights (1, 0.5); rows (1, 0), (1, 0), (0, 2), (0, 2): every total is 1, so grpo sees a constant
    group, but per-dimension z-scores z2 = -z1 fuse to (1 - 0.5) z1 != 0, which gdpo learns from.
    Group 1 has constant dimensions: nobody learns from it. Group 2's totals vary: both keep it."""
    r = np.array([[[1, 0], [1, 0], [0, 2], [0, 2]],
                  [[1, 1], [1, 1], [1, 1], [1, 1]],
                  [[1, 0], [0, 0], [1, 0], [0, 0]]], np.float32)
    w = np.array([1.0, 0.5], np.float32)
    np.testing.assert_array_equal(experience.informative_groups(r, w, cfg=AdvantageConfig("grpo")), [0, 0, 1])
    np.testing.assert_array_equal(experience.informative_groups(r, w, cfg=AdvantageConfig("gdpo")), [1, 0, 1])
    np.testing.assert_array_equal(experience.informative_groups(r, w, cfg=AdvantageConfig("per_dim")), [1, 0, 1])


def test_dynamic_sampling_reports_its_rule(tmp_path):
    for estimator, rule in (("grpo", "total_varies"), ("gdpo", "fused_dimensions_vary")):
        cfg = tiny_config(*VARIED, "dynamic.enabled=true", "dynamic.max_rounds=2", f"advantage.estimator={estimator}")
        m = train.Trainer(cfg, str(tmp_path / estimator), quiet=True).step_once().metrics
        assert m["dynamic/rule"] == rule


def test_entropy_alarm_pauses_and_the_reported_rollback_recovers(tmp_path):
    """The default entropy-collapse rule with its threshold raised to 1.0 (any fall below the first value)
    and patience 1 pauses this tiny run; the report names the rule, the step and a command that rolls back
    with adaptive temperature on, and running that command finishes the run."""
    rules = tuple(r if r.name != "entropy_collapse" else
                  type(r)(r.metric, r.kind, 1.0, action="pause", patience=1, name=r.name)
                  for r in MonitorConfig().rules)
    cfg = tiny_config(*VARIED, "steps=6", "optim.lr=0.03", "checkpoint.every=1")
    cfg = dataclasses.replace(cfg, monitor=MonitorConfig(rules=rules, collapse_action="pause"))
    out = str(tmp_path / "run")
    summary = train.Trainer(cfg, out, quiet=True).run()
    assert summary["paused"], "the entropy alarm should pause this run"
    step = summary["steps"]
    assert str(step) in os.listdir(os.path.join(out, "checkpoints"))
    report = json.loads(open(os.path.join(out, "alarms", f"step-{step}.json")).read())
    assert [a["rule"]["name"] for a in report["alarms"]] == ["entropy_collapse"] and report["step"] == step
    command = report["rollback_command"]
    assert command in open(os.path.join(out, "alarms", f"step-{step}.md")).read()
    argv = shlex.split(command)
    assert argv[:3] == ["python", "-m", "grpo_jax.train"] and "temperature.mode=adaptive" in argv
    # continue as the report says; the tiny model's entropy keeps falling, so the alarm is made a warning
    train.main(argv[3:] + ["--set", "monitor.collapse_action=warn", "--quiet"])
    rows = read_jsonl(os.path.join(out, "metrics.jsonl"))
    assert rows[-1]["step"] == 6 and rows[-1]["control/temperature"] >= 1.0
    assert any(e["kind"] == "rollback" for e in read_jsonl(os.path.join(out, "events.jsonl")))
