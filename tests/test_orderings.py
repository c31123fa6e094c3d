"""Pair orderings of GRPO's sum against GDPO's per-dimension z-scores, and the tabular simulation, on hand-built
groups whose counts are derived in the comments (group size 16, Bessel-corrected std as the estimators use)."""

from __future__ import annotations

import numpy as np
import pytest

from grpo_jax import orderings
from tests.launchers import load_launcher


def group(*counts_and_rows) -> np.ndarray:
    """One group [1, G, K] from (count, reward vector) pairs."""
    return np.array([row for n, row in counts_and_rows for _ in range(n)], np.float64)[None]


def test_a_tie_between_correct_long_and_wrong_short_goes_to_the_rarer_correctness():
    # 2 correct-long (1, 0), 8 wrong-short (0, 1), 6 wrong-long (0, 0): 120 pairs.
    # Sum ties: pairs inside {CL, WS} (10 rows, 45 pairs) and inside WL (15): 60 of 120.
    # Mixed pairs (one correct): 2 x 14 = 28; of them the CL-WS pairs tie, 2 x 8 = 16 (16/28).
    # GDPO: std of p = 2/16 is sqrt(16/15 * 2/16 * 14/16) = 0.342, of p = 8/16 is 0.516, so
    # CL = 0.875/0.342 - 0.5/0.516 = 1.59 > WS = -0.125/0.342 + 0.5/0.516 = 0.60: all 16 ties go to correct.
    p = orderings.pair_orderings(group((2, [1, 0]), (8, [0, 1]), (6, [0, 0])), [1.0, 1.0])
    assert p["pairs"] == 120
    assert p["grpo_ties"] == pytest.approx(60 / 120)
    assert p["mixed"] == pytest.approx(28 / 120)
    assert p["mixed_grpo_ties"] == pytest.approx(16 / 28)
    assert p["tie_gdpo_prefers_correct"] == 1.0 and p["tie_gdpo_prefers_wrong"] == 0.0
    assert p["gdpo_orders_a_grpo_tie"] == pytest.approx(16 / 120)  # identical vectors stay tied
    assert p["reversed"] == 0.0 and p["mixed_grpo_prefers_wrong"] == 0.0


def test_when_brevity_is_rarer_than_correctness_the_tie_goes_to_the_wrong_completion():
    # 8 correct-long, 2 wrong-short, 6 wrong-long: now brevity (2/16) is the rarer dimension, so its z-score
    # steps further: CL = 0.5/0.516 - 0.125/0.342 = 0.60 < WS = -0.5/0.516 + 0.875/0.342 = 1.59.
    p = orderings.pair_orderings(group((8, [1, 0]), (2, [0, 1]), (6, [0, 0])), [1.0, 1.0])
    assert p["mixed_grpo_ties"] == pytest.approx(16 / (8 * 8))
    assert p["tie_gdpo_prefers_wrong"] == 1.0 and p["gdpo_prefers_wrong"] == pytest.approx(16 / 64)


def test_rates_mirrored_around_one_half_leave_the_tie_a_tie():
    # p(correct) = 4/16 and p(short) = 12/16 have equal std, so CL and WS fuse to the same score (0 each, up
    # to float32 rounding, inside TIE_TOL): GDPO breaks no tie.
    p = orderings.pair_orderings(group((3, [1, 0]), (1, [1, 1]), (11, [0, 1]), (1, [0, 0])), [1.0, 1.0])
    assert p["mixed_grpo_ties"] > 0
    assert p["tie_gdpo_prefers_correct"] == 0.0 and p["tie_gdpo_prefers_wrong"] == 0.0


def test_three_dimensions_can_reverse_the_sum():
    # Rows 0-7 satisfy dims 0 and 1 (p = 8/16 each, std 0.516), row 15 only dim 2 (p = 1/16, std 0.25).
    # Sum: 2 > 1. GDPO: (1, 1, 0) = 2 * 0.5/0.516 - 0.0625/0.25 = 1.69 < (0, 0, 1) = -2 * 0.5/0.516 + 0.9375/0.25
    # = 1.81: each of the 8 pairs (row i < 8, row 15) is reversed; nothing else is.
    r = np.zeros((1, 16, 3))
    r[0, :8, :2] = 1.0
    r[0, 15, 2] = 1.0
    assert orderings.pair_orderings(r, [1.0, 1.0, 1.0])["reversed"] == pytest.approx(8 / 120)


def test_outcome_classes_count_what_each_problem_showed():
    r = np.array([[[1, 0], [1, 0], [0, 1], [0, 1]],   # problem 0: two of (1, 0), two of (0, 1)
                  [[0, 0], [0, 0], [0, 0], [1, 0]]])  # problem 1: three of (0, 0), one of (1, 0)
    classes, probs = orderings.outcome_classes(r, smoothing=0.5)
    assert classes.tolist() == [[0, 0], [0, 1], [1, 0]]
    # problem 0: (0, 2.5, 2.5) / 5; problem 1: (3.5, 0, 1.5) / 5 -- an unseen class gets nothing
    np.testing.assert_allclose(probs, [[0, 0.5, 0.5], [0.7, 0, 0.3]])


def test_equal_rewards_leave_the_tabular_policy_where_it_was():
    # Every class scores the same: every group has zero variance, every advantage is 0, nothing moves.
    classes = np.array([[1.0, 0.0], [0.0, 1.0]])
    probs = np.full((4, 2), 0.5)
    out = orderings.simulate(probs, classes, [1.0, 1.0], estimator="grpo", lr=1.0, steps=20, group=16, seed=0)
    np.testing.assert_allclose(out, probs, rtol=0, atol=8 * np.finfo(np.float32).eps)  # log/softmax round trip


def test_the_sum_lets_the_commoner_tied_outcome_win_and_gdpo_does_not():
    # Classes CL (1, 0) 0.14, WS (0, 1) 0.49, WL (0, 0) 0.37 on 64 identical problems. The softmax policy gradient
    # moves a logit by p_c * A_c: under the sum CL and WS share an advantage, so the commoner WS gains more each
    # step and takes the mass; GDPO gives CL the larger advantage (correctness is the rarer dimension). The
    # simulated probability of a correct outcome must end higher under gdpo, by a wide margin (measured 0.10
    # against 0.02 on this seed; asserted: more than twice).
    classes = np.array([[0.0, 0.0], [0.0, 1.0], [1.0, 0.0]])
    probs = np.tile([0.37, 0.49, 0.14], (64, 1))
    end = {e: orderings.rate(orderings.simulate(probs, classes, [1.0, 1.0], estimator=e, lr=1.0, steps=100, group=16,
                                                seed=0), classes, 0) for e in ("grpo", "gdpo")}
    assert end["gdpo"] > 2 * end["grpo"]


def test_calibrated_lr_brackets_the_requested_gain():
    classes = np.array([[0.0], [1.0]])
    probs = np.tile([0.8, 0.2], (32, 1))
    lr = orderings.calibrate_lr(probs, classes, correct=0, gain=0.2, steps=30, group=16, seed=0)

    def gained(x):
        p = orderings.simulate(probs, classes, [1.0], estimator="grpo", lr=x, steps=30, group=16, seed=0)
        return orderings.rate(p, classes, 0) - 0.2

    assert gained(lr / 1.5) < 0.2 < gained(lr * 1.5)
    with pytest.raises(ValueError, match="not reached"):
        orderings.calibrate_lr(np.tile([1.0, 0.0], (4, 1)), classes, correct=0, gain=0.2, steps=5, group=16, seed=0)


def test_the_gate_measures_a_budget_and_applies_its_rule():
    # 16 problems x 16 samples: on each, samples 0-2 correct at length 33 (over a budget of 31), samples 3-10 wrong
    # at length 20 (under), the rest wrong at 40: correct 3/16, short 8/16, so GRPO ties every correct-long with
    # every wrong-short (3 x 8 of the 3 x 13 mixed pairs) and GDPO puts correct first (3/16 is further from 1/2).
    gate = load_launcher("reward_ties_gate")
    correct = np.zeros((16, 16))
    correct[:, :3] = 1.0
    lengths = np.full((16, 16), 40)
    lengths[:, :3], lengths[:, 3:11] = 33, 20
    m = gate.measure(correct, (lengths <= 31).astype(float), "short", group=16, steps=20, sim_seeds=(0,), gain=0.1)
    assert m["rate_correct"] == pytest.approx(3 / 16) and m["rate_style"] == pytest.approx(8 / 16)
    assert m["problems_with_correct_style"] == 0.0
    assert m["pairs"]["mixed_grpo_ties"] == pytest.approx(24 / 39)
    assert m["pairs"]["tie_gdpo_prefers_correct"] == 1.0
    assert m["predicted_gdpo_minus_grpo"] > 0  # the mechanism the simulation has to show
    rule = gate.rule(m)
    assert rule["G1"] and rule["G2"] and rule["G3"] and rule["passes"] == rule["G4"]
    # the other way round (8 correct-long, 2 wrong-short): brevity is the rarer dimension and G3 fails
    flipped = orderings.pair_orderings(group((8, [1, 0]), (2, [0, 1]), (6, [0, 0])), [1.0, 1.0])
    assert not gate.rule({**m, "pairs": flipped})["G3"]
