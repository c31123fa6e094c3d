"""The collapse studies judge their own acceptance from results.json: each rule on synthetic figures."""

from __future__ import annotations

import pytest

from grpo_jax import study
from tests.launchers import load_launcher

entropy_verdict = load_launcher("entropy_collapse").verdict
reward_verdict = load_launcher("reward_collapse").verdict


def _ent(seed, first, final, acc, **extra):
    return {"seed": seed, "entropy_p50_first": first, "entropy_p50_final": final, "accuracy_final": acc, **extra}


def _entropy_results():
    # none collapses to 0.05x on both seeds; `good` holds 0.5x and is at least as accurate; `cold` holds
    # entropy but is less accurate on seed 1; `weak` is accurate but ends at 0.2x; pause_rollback recovers.
    return {
        "none": [_ent(0, 1.0, 0.05, 0.40), _ent(1, 2.0, 0.10, 0.50)],
        "good": [_ent(0, 1.0, 0.5, 0.40), _ent(1, 2.0, 1.0, 0.55)],
        "also_good": [_ent(0, 1.0, 0.3, 0.45), _ent(1, 2.0, 0.6, 0.50)],
        "cold": [_ent(0, 1.0, 0.5, 0.45), _ent(1, 2.0, 1.0, 0.49)],
        "weak": [_ent(0, 1.0, 0.2, 0.60), _ent(1, 2.0, 0.4, 0.60)],
        "pause_rollback": [_ent(0, 1.0, 0.2, 0.4, paused_at=200, rolled_back_to=175),
                           _ent(1, 2.0, 0.3, 0.5, paused_at=210, rolled_back_to=200)],
    }


def test_entropy_verdict_holds_with_two_controls_and_a_recovered_pause():
    v = entropy_verdict(_entropy_results())
    assert v["collapse"] and v["none_ratio"] == {0: pytest.approx(0.05), 1: pytest.approx(0.05)}
    # 0.3x exactly counts as held (>=); equal accuracy counts as no lower
    assert sorted(v["controls"]) == ["also_good", "good"]
    assert v["pause_rollback"] and v["holds"]


def test_entropy_verdict_fails_on_each_missing_piece():
    results = _entropy_results()
    results["none"][1] = _ent(1, 2.0, 0.25, 0.50)  # 0.125x: not collapsed on seed 1
    assert not entropy_verdict(results)["collapse"] and not entropy_verdict(results)["holds"]
    results = _entropy_results()
    del results["also_good"]
    assert sorted(entropy_verdict(results)["controls"]) == ["good"] and not entropy_verdict(results)["holds"]
    results = _entropy_results()
    results["pause_rollback"][0]["paused_at"] = None  # never paused
    assert not entropy_verdict(results)["pause_rollback"] and not entropy_verdict(results)["holds"]
    results = _entropy_results()
    results["pause_rollback"][1]["entropy_p50_final"] = 0.1  # 0.05x: did not recover
    assert not entropy_verdict(results)["pause_rollback"]
    results = _entropy_results()
    results["good"] = results["good"][:1]  # a control measured on one seed of two cannot hold on every seed
    assert "good" not in entropy_verdict(results)["controls"]


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
    assert comparison["noise_floor"]["floor"] == pytest.approx(0.00919, abs=1e-4)
    assert comparison["arms"]["gdpo"]["diff"]["low"] == pytest.approx(0.04 - 0.01837, abs=1e-4)
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
