"""The collapse studies judge their own acceptance from results.json: each rule on synthetic figures."""

from __future__ import annotations

import pytest

from grpo_jax import study
from tests.launchers import load_launcher
from tests.tolerance import EPS64, rounding_tol

entropy_verdict = load_launcher("entropy_collapse").verdict
reward_verdict = load_launcher("reward_collapse").verdict


def _ent(seed, ratio, passk, greedy, start_passk=0.8):
    return {"seed": seed, "entropy_ratio": ratio, "passk_t1_final": passk, "passk_t1_start": start_passk,
            "greedy_final": greedy}


def _entropy_results():
    # none collapses (0.1x, pass@16 0.70 < 0.80 at the start) on 4 seeds; null differs from none by +-0.005 in
    # pass@16 and +-0.01 in greedy; `good` and `also_good` gain 0.04-0.06 pass@16 on every seed with greedy equal;
    # `costly` gains pass@16 but loses 0.05 greedy (beyond the greedy floor); `weak` gains +-0.01 (noise).
    seeds = range(4)
    sign = lambda s: 1 if s % 2 else -1  # noqa: E731
    return {"none": [_ent(s, 0.1, 0.70, 0.40) for s in seeds],
            "null": [_ent(s, 0.1, 0.70 + 0.005 * sign(s), 0.40 + 0.01 * sign(s)) for s in seeds],
            "clip_cov": [_ent(s, 0.5, 0.75 + 0.01 * sign(s), 0.40) for s in seeds],
            "kl_cov": [_ent(s, 0.5, 0.74 + 0.01 * sign(s), 0.41) for s in seeds],
            "kl_ref": [_ent(s, 0.5, 0.75, 0.35) for s in seeds],
            "top_entropy": [_ent(s, 0.2, 0.70 + 0.01 * sign(s), 0.40) for s in seeds],
            "lower_lr": [_ent(s, 0.6, 0.80, 0.45) for s in seeds]}


def _entropy_judge(results):
    arms = [a for a in results if a not in ("none", "null")]
    passk, greedy = (study.compare_seeds(results, baseline="none", metric=m, null="null", arms=arms, family=8)
                     for m in ("passk_t1_final", "greedy_final"))
    return entropy_verdict(results, passk, greedy, controls=CONTROLS)


CONTROLS = ("clip_cov", "kl_cov", "kl_ref", "top_entropy")  # the controls these synthetic studies register


def test_entropy_verdict_needs_collapse_and_two_controls_that_win_on_pass_at_k():
    v = _entropy_judge(_entropy_results())
    # greedy floor: null - none d = [-0.01, 0.01, -0.01, 0.01], sd 0.01155, t_{0.975,3} 3.182 -> 0.0184; kl_ref's
    # greedy -0.05 is below -0.0184; lower_lr wins but is the cause removed, not a control
    assert v["collapse"] and v["none_ratio"] == {s: 0.1 for s in range(4)}
    assert v["controls"] == ["clip_cov", "kl_cov"] and v["holds"]


def test_entropy_verdict_counts_only_the_registered_controls():
    """A control outside the registered ones that passes the rule is listed as exploratory and never counts."""
    results = _entropy_results()
    passk, greedy = (study.compare_seeds(results, baseline="none", metric=m, null="null",
                                         arms=[a for a in results if a not in ("none", "null")], family=2)
                     for m in ("passk_t1_final", "greedy_final"))
    v = entropy_verdict(results, passk, greedy, controls=("clip_cov", "top_entropy"))
    assert v["controls"] == ["clip_cov"] and v["exploratory"] == ["kl_cov"] and not v["holds"]


def test_entropy_verdict_fails_without_collapse_or_controls():
    results = _entropy_results()
    results["none"][3]["entropy_ratio"] = 0.25  # one seed does not collapse
    assert not _entropy_judge(results)["collapse"] and not _entropy_judge(results)["holds"]
    results = _entropy_results()
    results["none"][0]["passk_t1_final"] = 0.85  # pass@16 above the warm start's on one seed
    assert not _entropy_judge(results)["collapse"]
    results = _entropy_results()
    del results["kl_cov"]
    assert _entropy_judge(results)["controls"] == ["clip_cov"] and not _entropy_judge(results)["holds"]


DIMS = ("countdown", "countdown_numbers", "countdown_steps", "length_budget")


def _rew(seed, joint, ratio=1.05, corr=(0.6, 0.7, 0.15, 0.4), varies=(0.5, 0.3, 0.2, 0.4)):
    out = {"seed": seed, "joint_final": joint, "collapse_ratio": ratio}
    out.update({f"corr_within_{d}": c for d, c in zip(DIMS, corr)})
    out.update({f"varies_{d}": v for d, v in zip(DIMS, varies)})
    return out


def _reward_results():
    # grpo and null differ by +-0.005 per seed; gdpo gains 0.03-0.05 on every seed; conditioned gains on two
    # seeds and loses on two (mean 0)
    seeds = range(4)
    return {"grpo": [_rew(s, 0.10) for s in seeds],
            "null": [_rew(s, 0.10 + (0.005 if s % 2 else -0.005)) for s in seeds],
            "gdpo": [_rew(s, 0.10 + 0.03 + 0.02 * (s % 2)) for s in seeds],
            "conditioned": [_rew(s, 0.10 + (0.02 if s < 2 else -0.02)) for s in seeds]}


def _judge(results):
    comparison = study.compare_seeds(results, baseline="grpo", metric="joint_final", null="null",
                                     arms=["gdpo", "conditioned"], family=3)
    return reward_verdict(results, comparison), comparison


def test_reward_verdict_needs_collapse_a_drowned_dimension_and_a_win():
    v, comparison = _judge(_reward_results())
    # null - grpo: d = [-0.005, 0.005, -0.005, 0.005], mean 0, sd 0.00577, t_{0.975,3} = 3.182
    # -> floor = 3.182 * 0.00577 / 2 = 0.00919; gdpo: d = [0.03, 0.05, 0.03, 0.05], mean 0.04, CI [0.022, 0.058]
    # the hand values are printed to 5 decimals (half a unit: 5e-6); the float64 statistics round a few times
    tol = 5e-6 + rounding_tol(0.04, ulps=8, eps=EPS64)
    assert comparison["noise_floor"]["floor"] == pytest.approx(0.00919, abs=tol)
    assert comparison["arms"]["gdpo"]["diff"]["low"] == pytest.approx(0.04 - 0.01837, abs=tol)
    assert v["collapse"] and set(v["drowned"]) == {"countdown_steps"}
    assert v["fixes"] == ["gdpo"] and v["survives_bonferroni"] == ["gdpo"] and v["holds"]
    results = _reward_results()
    results["grpo"][2]["collapse_ratio"] = 1.0  # one seed without ties: no collapse
    assert not _judge(results)[0]["collapse"] and not _judge(results)[0]["holds"]
    results = _reward_results()
    for r in results["grpo"]:
        r["varies_countdown_steps"] = 0.04  # the weakly correlated dimension hardly varies: not drowned
    assert _judge(results)[0]["drowned"] == {} and not _judge(results)[0]["holds"]
    results = _reward_results()
    results["gdpo"] = [_rew(s, 0.10 + 0.005 * (s % 2)) for s in range(4)]  # inside the noise
    assert _judge(results)[0]["fixes"] == [] and not _judge(results)[0]["holds"]
