"""The collapse studies judge their own acceptance from results.json: each rule on synthetic figures."""

from __future__ import annotations

import pytest

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


def _rew(seed, start, final, fmt=0.95):
    return {"seed": seed, "accuracy_start": start, "accuracy_final": final, "format_rate_final": fmt}


def test_reward_verdict_margin_gain_and_ceiling():
    results = {
        "grpo": [_rew(0, 0.30, 0.32), _rew(1, 0.30, 0.34), _rew(2, 0.30, 0.30)],
        # gains +0.10, +0.12, +0.08 (mean 0.10 vs grpo's 0.02); margins 0.08, 0.08, 0.08;
        # seed stds (ddof 1): grpo 0.02, fix 0.02 -> pooled 0.02, 2x = 0.04 < 0.08
        "fix": [_rew(0, 0.30, 0.40), _rew(1, 0.30, 0.42), _rew(2, 0.30, 0.38)],
        # wins every seed by 0.01 but the margin 0.01 is under 2 x pooled std (0.04)
        "small": [_rew(0, 0.30, 0.33), _rew(1, 0.30, 0.35), _rew(2, 0.30, 0.31)],
    }
    v = reward_verdict(results)
    assert v["format_at_ceiling"]
    fix = v["arms"]["fix"]
    assert fix["wins_every_seed"] and fix["mean_margin"] == pytest.approx(0.08)
    assert fix["pooled_std"] == pytest.approx(0.02) and fix["gain"] == pytest.approx(0.10)
    assert fix["grpo_gain"] == pytest.approx(0.02) and fix["holds"]
    assert v["arms"]["small"]["wins_every_seed"] and not v["arms"]["small"]["holds"]
    assert v["holds"]
    results["grpo"][2]["format_rate_final"] = 0.85  # the easy dimension is not at its ceiling on seed 2
    assert not reward_verdict(results)["holds"]


def test_reward_verdict_needs_twice_the_baseline_gain():
    results = {
        "grpo": [_rew(0, 0.30, 0.40), _rew(1, 0.30, 0.42)],  # grpo gains 0.11
        "fix": [_rew(0, 0.30, 0.50), _rew(1, 0.30, 0.52)],  # gains 0.21 < 2 x 0.11, margin 0.10 > 2 x 0.014
    }
    f = reward_verdict(results)["arms"]["fix"]
    assert f["wins_every_seed"] and f["mean_margin"] > 2 * f["pooled_std"] and not f["holds"]
