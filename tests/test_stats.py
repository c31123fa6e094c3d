"""grpo_jax.stats: pass@k against exact enumeration, the paired bootstrap against the normal approximation and
by coverage, the seed level of the bootstrap, McNemar against a hand count and scipy, the noise floor and
verdict rule, and the table format. Random data come from fixed NumPy seeds; every expected value is derived
from the data (or by hand in a comment), never a golden number of the PRNG."""

from __future__ import annotations

import itertools
import math
from fractions import Fraction

import numpy as np
import pytest
from scipy.stats import binomtest

from grpo_jax import stats
from tests.tolerance import EPS64, rounding_tol


# ---------------------------------------------------------------------------------------------------- pass@k


def _enumerated_pass_at_k(n: int, c: int, k: int) -> float:
    """The fraction of k-subsets of n samples (samples 0..c-1 correct) that hold at least one correct one."""
    subsets = list(itertools.combinations(range(n), k))
    return sum(any(i < c for i in s) for s in subsets) / len(subsets)


def _product_form_tol(n: int, c: int, k: int) -> float:
    """How far stats.pass_at_k's float64 1 - prod_{i = n-c+1}^{n} (1 - k / i) may be from the exact pass@k, and
    from a reference rounded once (u = eps64 / 2): each factor carries the rounding of k / i amplified to
    k / (i - k) of itself and its own subtraction's, the product one per factor, 1 - q one and the reference one.
    n - c < k gives exactly 1."""
    u = EPS64 / 2
    if n - c < k:
        return u
    i = np.arange(n - c + 1, n + 1, dtype=np.float64)
    q = float(np.prod(1 - k / i))
    return u * (q * float(np.sum(k / (i - k) + 2)) + 2)


def test_pass_at_k_matches_enumeration_for_every_small_case():
    # every n <= 8, every c in 0..n (c = 0 and c = n included), every k in 1..n (k = n included)
    for n in range(1, 9):
        for c in range(n + 1):
            for k in range(1, n + 1):
                expected = _enumerated_pass_at_k(n, c, k)
                tol = _product_form_tol(n, c, k)
                assert stats.pass_at_k(n, c, k) == pytest.approx(expected, abs=tol), (n, c, k)
    # the edge values by hand: c = 0 never passes, c = n always does, k = n passes iff c > 0
    assert stats.pass_at_k(5, 0, 3) == 0.0 and stats.pass_at_k(5, 5, 3) == 1.0
    assert stats.pass_at_k(4, 1, 4) == 1.0 and stats.pass_at_k(4, 0, 4) == 0.0
    # n = 4, c = 1, k = 2: 1 - C(3, 2) / C(4, 2) = 1 - 3/6 = 0.5
    assert stats.pass_at_k(4, 1, 2) == pytest.approx(0.5)


def test_pass_at_k_is_stable_for_large_n():
    # n = 1000 samples: C(n, k) overflows float64 for k ~ 500, the product form does not; the exact value is
    # 1 - C(n - c, k) / C(n, k) in rational arithmetic
    for c, k in [(1, 1), (3, 10), (50, 500), (900, 100), (0, 1000), (1, 1000)]:
        exact = 1 - Fraction(math.comb(1000 - c, k), math.comb(1000, k))
        assert stats.pass_at_k(1000, c, k) == pytest.approx(float(exact), abs=_product_form_tol(1000, c, k)), (c, k)


def test_pass_at_k_vectorised_over_problems_with_different_n():
    n = np.array([3, 4, 8, 8, 5, 6, 3])
    c = np.array([3, 1, 0, 8, 2, 5, 1])
    out = stats.pass_at_k(n, c, 1)
    assert isinstance(out, np.ndarray) and out.dtype == np.float64 and out.shape == (7,)
    # pass@1 = c / n exactly (1 - (n - c)/n)
    tol = lambda k: max(_product_form_tol(*t, k) for t in zip(n, c))  # noqa: E731
    np.testing.assert_allclose(out, c / n, rtol=0, atol=tol(1))
    for k in (1, 2, 3):
        np.testing.assert_allclose(stats.pass_at_k(n, c, k), [_enumerated_pass_at_k(*t, k) for t in zip(n, c)],
                                   rtol=0, atol=tol(k))
    # scalars give a float; a scalar n broadcasts over an array of c, and 2-d input keeps its shape
    assert isinstance(stats.pass_at_k(4, 1, 2), float)
    np.testing.assert_allclose(stats.pass_at_k(4, np.array([0, 1, 4]), 2), [0.0, 0.5, 1.0], rtol=0,
                               atol=max(_product_form_tol(4, c_, 2) for c_ in (0, 1, 4)))
    assert stats.pass_at_k(np.full((2, 3), 4), np.ones((2, 3), int), 2).shape == (2, 3)


def test_pass_at_k_curve_averages_over_problems():
    n, c = [4, 4, 2], [1, 0, 2]
    # k = 1: mean(1/4, 0, 1) = 5/12; k = 2: mean(0.5, 0, 1) = 1/2
    assert stats.pass_at_k_curve(n, c, [1, 2]) == {1: pytest.approx(5 / 12), 2: pytest.approx(0.5)}


def test_pass_at_k_rejects_bad_arguments():
    with pytest.raises(ValueError, match=r"k <= n.*k=5.*n=3"):
        stats.pass_at_k(3, 1, 5)
    with pytest.raises(ValueError, match=r"k <= n"):  # one problem with too few samples fails the whole call
        stats.pass_at_k([8, 3], [1, 1], 4)
    for n, c, k in [(3, 4, 1), (3, -1, 1), (3, 1, 0), (3.5, 1, 1), (3, 1, 1.5)]:
        with pytest.raises(ValueError):
            stats.pass_at_k(n, c, k)


# ------------------------------------------------------------------------------------------ paired bootstrap


def _paired_arms(rng: np.random.Generator, shape, p_a=0.6, p_new=0.7, redraw=0.2):
    """Correlated 0/1 arms, as two runs scored on the same problems: b is a with a fraction `redraw` of the
    problems re-drawn as Bernoulli(p_new). E[b - a] = redraw * (p_new - p_a)."""
    a = rng.random(shape) < p_a
    b = np.where(rng.random(shape) < redraw, rng.random(shape) < p_new, a)
    return a.astype(float), b.astype(float)


def test_bootstrap_matches_the_normal_approximation_with_one_seed():
    a, b = _paired_arms(np.random.default_rng(1), (1, 4000))
    d = (b - a)[0]
    ci = stats.paired_bootstrap_ci(a, b)
    # the closed form for a mean of P paired differences: half-width 1.96 * sd(d) / sqrt(P), from the same data
    normal_half = 1.96 * d.std(ddof=1) / math.sqrt(d.size)
    assert (ci["high"] - ci["low"]) / 2 == pytest.approx(normal_half, rel=0.10)
    assert ci["low"] < ci["diff"] < ci["high"]
    # the mean of d = b - a (an exact integer sum, one rounding) against two rounded means and their difference:
    # 4 roundings of eps64/2 of the largest mean
    assert ci["diff"] == pytest.approx(b.mean() - a.mean(), abs=rounding_tol([a.mean(), b.mean()], ulps=2, eps=EPS64))
    assert (ci["seeds"], ci["problems"], ci["n_boot"], ci["level"]) == (1, 4000, 10_000, 0.95)
    # the pairing matters on this data: resampling the arms independently would give a half-width of
    # 1.96 * sqrt(var a + var b) / sqrt(P), more than twice as wide, so a broken pairing fails the check above
    unpaired_half = 1.96 * math.sqrt(a.var(ddof=1) + b.var(ddof=1)) / math.sqrt(d.size)
    assert unpaired_half > 2 * normal_half


def test_identical_arms_give_a_zero_interval():
    a = (np.random.default_rng(2).random((3, 200)) < 0.5).astype(float)
    ci = stats.paired_bootstrap_ci(a, a.copy(), n_boot=500)
    # every replicate is a mean of b - a = 0
    assert (ci["diff"], ci["low"], ci["high"]) == (0.0, 0.0, 0.0)


def test_bootstrap_interval_covers_the_true_difference_at_its_level():
    # 200 synthetic datasets with a known true difference E[b - a] = 0.2 * (0.7 - 0.6) = 0.02. The coverage
    # of a 95% interval over 200 datasets is binomial with SD sqrt(0.95 * 0.05 / 200) ~ 1.5 points, so
    # 90-99% is about -3 to +2.6 SD around 95% (a small n_boot and the percentile interval's slight
    # under-coverage at P = 300 shift the centre a little below 95%).
    rng = np.random.default_rng(3)
    covered = 0
    for i in range(200):
        a, b = _paired_arms(rng, (1, 300))
        ci = stats.paired_bootstrap_ci(a, b, n_boot=300, seed=i)
        covered += ci["low"] <= 0.02 <= ci["high"]
    assert 0.90 <= covered / 200 <= 0.99


def test_seed_level_sees_trajectory_noise():
    # 4 seeds whose arm-b accuracy differs by large per-seed offsets (trajectory noise): the two-level
    # bootstrap resamples seeds and widens; the problem-only bootstrap of the seed-averaged data cannot see it.
    rng = np.random.default_rng(4)
    offsets = np.array([-0.15, -0.05, 0.05, 0.15])[:, None]
    a = (rng.random((4, 500)) < 0.5).astype(float)
    b = (rng.random((4, 500)) < 0.5 + offsets).astype(float)
    two_level = stats.paired_bootstrap_ci(a, b, n_boot=2000)
    problems_only = stats.paired_bootstrap_ci(a.mean(0, keepdims=True), b.mean(0, keepdims=True), n_boot=2000)
    # both are one rounding of the same exact mean (sums of 0/1 and of quarters are exact): eps64/2 each
    assert two_level["diff"] == pytest.approx(problems_only["diff"], abs=rounding_tol(two_level["diff"], ulps=1,
                                                                                     eps=EPS64))
    # problem-only half-width ~ 1.96 * sqrt(2 * 0.25 / 4) / sqrt(500) ~ 0.03; the seed level adds the spread of
    # the seed means, sd ~ 0.13 * sqrt(3/4) / 2 ~ 0.056, half-width ~ 0.11: well over twice as wide
    width = lambda ci: ci["high"] - ci["low"]  # noqa: E731
    assert width(two_level) > 2 * width(problems_only)


def test_one_number_per_seed():
    # [S] input: a plain bootstrap of S per-seed differences; for large S its half-width is the normal
    # approximation 1.96 * sd / sqrt(S) of the same numbers
    rng = np.random.default_rng(5)
    a, b = rng.normal(0.5, 0.05, 400), rng.normal(0.52, 0.05, 400)
    ci = stats.paired_bootstrap_ci(a, b)
    assert (ci["seeds"], ci["problems"]) == (400, None)
    assert (ci["high"] - ci["low"]) / 2 == pytest.approx(1.96 * (b - a).std(ddof=1) / 20, rel=0.10)


def test_bootstrap_is_deterministic_for_a_seed_and_checks_its_input():
    rng = np.random.default_rng(6)
    a, b = rng.normal(0.5, 0.1, (3, 100)), rng.normal(0.55, 0.1, (3, 100))  # continuous: no tied quantiles
    first = stats.paired_bootstrap_ci(a, b, n_boot=500, seed=7)
    assert stats.paired_bootstrap_ci(a, b, n_boot=500, seed=7) == first
    assert stats.paired_bootstrap_ci(a, b, n_boot=500, seed=8)["low"] != first["low"]
    # a wider level gives a wider interval from the same replicates
    wide = stats.paired_bootstrap_ci(a, b, n_boot=500, seed=7, level=0.99)
    assert wide["low"] <= first["low"] and wide["high"] >= first["high"]
    for bad_a, bad_b in [(a, b[:, :50]), (a[None], b[None]), (np.zeros((0, 3)), np.zeros((0, 3)))]:
        with pytest.raises(ValueError, match="shape"):
            stats.paired_bootstrap_ci(bad_a, bad_b)
    with pytest.raises(ValueError, match="finite"):
        stats.paired_bootstrap_ci(np.array([0.0, np.nan]), np.zeros(2))
    with pytest.raises(ValueError, match="level"):
        stats.paired_bootstrap_ci(a, b, level=95)


# ---------------------------------------------------------------------------------------------------- McNemar


def test_paired_t_ci_by_hand():
    # d = [1, 2, 3]: mean 2, sd 1, t_{0.975, 2} = 4.302653 -> half width 4.302653 / sqrt(3) = 2.484138
    ci = stats.paired_t_ci([0.0, 0.0, 0.0], [1.0, 2.0, 3.0])
    assert ci["diff"] == pytest.approx(2.0) and ci["sd"] == pytest.approx(1.0) and ci["seeds"] == 3
    # 2.484138 is printed to 6 decimals (half a unit: 5e-7) and the float64 interval rounds a few times
    tol = 5e-7 + rounding_tol(2 + 2.484138, ulps=4, eps=EPS64)
    assert (ci["low"], ci["high"]) == (pytest.approx(2 - 2.484138, abs=tol), pytest.approx(2 + 2.484138, abs=tol))
    # [S, P]: each seed's mean over problems first (the seed is the unit): d = [0.5, 0.0]
    two = stats.paired_t_ci([[0, 0], [1, 1]], [[1, 0], [1, 1]])
    assert two["per_seed"] == [0.5, 0.0] and two["diff"] == pytest.approx(0.25)
    with pytest.raises(ValueError, match="S >= 2"):
        stats.paired_t_ci([1.0], [2.0])


def test_paired_t_ci_covers_at_its_level_with_eight_seeds():
    # 2,000 studies of 8 seeds with true difference 0.1 and seed noise sd 0.05: coverage within 3 binomial SE
    # of 95% (SE = sqrt(0.95 * 0.05 / 2000) = 0.0049)
    rng = np.random.default_rng(0)
    hits = 0
    for _ in range(2000):
        a = rng.normal(0.3, 0.05, 8)
        ci = stats.paired_t_ci(a, a + rng.normal(0.1, 0.05, 8))
        hits += ci["low"] <= 0.1 <= ci["high"]
    assert abs(hits / 2000 - 0.95) < 3 * math.sqrt(0.95 * 0.05 / 2000)


def test_mcnemar_hand_count():
    # 10 problems: columns 0-3 a wrong / b right (b01 = 4), column 4 a right / b wrong (b10 = 1), columns 5-7
    # both right, 8-9 both wrong. X ~ Bin(5, 1/2): P(X <= 1) = (C(5,0) + C(5,1)) / 2^5 = (1 + 5) / 32 = 6/32,
    # p = 2 * 6/32 = 12/32 = 0.375. chi2 = (|4 - 1| - 1)^2 / 5 = 4/5 = 0.8.
    a = np.array([0, 0, 0, 0, 1, 1, 1, 1, 0, 0], bool)
    b = np.array([1, 1, 1, 1, 0, 1, 1, 1, 0, 0], bool)
    out = stats.mcnemar(a, b)
    # p = 2 tail / 2^n from exact integers: one rounding of eps64/2 (0.375 = 12/32 is in fact exact)
    p_tol = rounding_tol(0.375, ulps=0.5, eps=EPS64)
    assert out == {"b01": 4, "b10": 1, "p_value": pytest.approx(0.375, abs=p_tol), "chi2": pytest.approx(0.8),
                   "problems": 10}
    # swapping the runs swaps the counts, not the test
    assert stats.mcnemar(b, a)["p_value"] == out["p_value"] and stats.mcnemar(b, a)["b10"] == 4


def test_mcnemar_edge_cases():
    same = np.array([1, 0, 1], bool)
    # no discordant pairs: p = 1 and chi2 = 0 by convention
    assert stats.mcnemar(same, same) == {"b01": 0, "b10": 0, "p_value": 1.0, "chi2": 0.0, "problems": 3}
    # b01 = b10 = 2: 2 * P(X <= 2) with X ~ Bin(4, 1/2) = 2 * 11/16 > 1, clipped to 1; chi2 = (0 - 1)^2 / 4
    a = np.array([0, 0, 1, 1], bool)
    out = stats.mcnemar(a, ~a)
    assert (out["p_value"], out["chi2"]) == (1.0, 0.25)
    # 40 discordant pairs all one way: p = 2 / 2^40 exactly
    assert stats.mcnemar(np.zeros(40, bool), np.ones(40, bool))["p_value"] == 2.0 ** -39
    with pytest.raises(ValueError, match="bool"):
        stats.mcnemar(np.array([0, 1]), np.array([1, 1]))
    with pytest.raises(ValueError):
        stats.mcnemar(np.ones(3, bool), np.ones(4, bool))


def test_mcnemar_matches_scipy_binomtest():
    rng = np.random.default_rng(8)
    for p_a, p_b, n_problems in [(0.5, 0.6, 60), (0.3, 0.3, 40), (0.7, 0.4, 200), (0.5, 0.52, 500)]:
        a, b = rng.random(n_problems) < p_a, rng.random(n_problems) < p_b
        out = stats.mcnemar(a, b)
        n = out["b01"] + out["b10"]
        # scipy's two-sided exact test of b01 successes in n trials at p = 1/2 (symmetric: twice the smaller tail)
        assert out["p_value"] == pytest.approx(binomtest(out["b01"], n, 0.5).pvalue, rel=1e-12)


# ------------------------------------------------------------------------------------ noise floor and verdict


def test_noise_floor_and_verdict_on_constructed_arms():
    rng = np.random.default_rng(9)
    base = rng.random((3, 1000)) < 0.5
    # the null arm: 10% of the problems per seed re-drawn (a reseeded baseline); differences are pure noise
    null = np.where(rng.random(base.shape) < 0.10, rng.random(base.shape) < 0.5, base)
    floor = stats.noise_floor(base.astype(float), null.astype(float), n_boot=2000)
    assert floor["floor"] == max(abs(floor["low"]), abs(floor["high"])) and floor["floor"] > 0
    assert floor["low"] <= 0 <= floor["high"]  # this null covers 0 (it has no true effect)
    # 40% of the wrong answers fixed (diff ~ +0.2) / broken (~ -0.2): far outside a floor of ~0.01
    up = base | (rng.random(base.shape) < 0.4)
    down = base & (rng.random(base.shape) >= 0.4)
    win = stats.paired_bootstrap_ci(base.astype(float), up.astype(float), n_boot=2000)
    loss = stats.paired_bootstrap_ci(base.astype(float), down.astype(float), n_boot=2000)
    assert stats.verdict(win, floor) == "win" and stats.verdict(loss, floor) == "loss"
    # 0.5% of the problems fixed: every difference is >= 0 so the CI excludes 0, but the margin is inside the
    # noise floor (the preconditions are checked so the case stays what it claims to be)
    tiny = base | (rng.random(base.shape) < 0.005)
    small = stats.paired_bootstrap_ci(base.astype(float), tiny.astype(float), n_boot=2000)
    assert small["low"] > 0 and small["diff"] < floor["floor"]
    assert stats.verdict(small, floor) == "inside noise"


def test_verdict_rule_on_hand_cases():
    ci = lambda diff, low, high: {"diff": diff, "low": low, "high": high}  # noqa: E731
    assert stats.verdict(ci(0.05, 0.02, 0.08), {"floor": 0.03}) == "win"
    assert stats.verdict(ci(-0.05, -0.08, -0.02), 0.03) == "loss"  # a bare float floor works too
    assert stats.verdict(ci(0.05, -0.01, 0.11), 0.03) == "inside noise"  # CI spans 0
    assert stats.verdict(ci(0.05, 0.0, 0.10), 0.03) == "inside noise"  # CI touches 0: not excluded
    assert stats.verdict(ci(0.03, 0.01, 0.05), 0.03) == "inside noise"  # diff equal to the floor: not above it
    assert stats.verdict(ci(0.02, 0.01, 0.03), 0.03) == "inside noise"  # CI excludes 0, margin inside the floor
    assert stats.verdict(ci(-0.02, -0.03, -0.01), 0.03) == "inside noise"
    assert stats.verdict(ci(0.002, 0.001, 0.003), 0.0) == "win"  # a zero floor leaves only the CI


def test_format_ci():
    assert stats.format_ci({"diff": 0.042, "low": 0.011, "high": 0.073}) == "+4.2 [1.1, 7.3]"
    assert stats.format_ci({"diff": -0.015, "low": -0.0301, "high": -0.0004}) == "-1.5 [-3.0, 0.0]"  # no "-0.0"
    assert stats.format_ci({"diff": 0.0, "low": -0.1, "high": 0.1}) == "+0.0 [-10.0, 10.0]"
    assert stats.format_ci({"diff": 0.5, "low": 0.25, "high": 0.75}, scale=1.0, digits=2) == "+0.50 [0.25, 0.75]"


# ------------------------------------------------------------------------------ t-test, TOST, Holm


def test_paired_t_test_matches_scipy_and_inverts_the_interval():
    from scipy.stats import ttest_rel

    rng = np.random.default_rng(3)
    a, b = rng.normal(0.3, 0.05, 10), rng.normal(0.33, 0.05, 10)
    t = stats.paired_t_test(a, b)
    ref = ttest_rel(b, a)
    assert t["t"] == pytest.approx(ref.statistic, rel=rounding_tol(1.0, ulps=64, eps=EPS64))
    assert t["p_value"] == pytest.approx(ref.pvalue, rel=rounding_tol(1.0, ulps=1024, eps=EPS64))
    # the 95% interval excludes 0 exactly when p < 0.05
    ci = stats.paired_t_ci(a, b)
    assert (ci["low"] > 0 or ci["high"] < 0) == (t["p_value"] < 0.05)
    assert stats.paired_t_test([0.0, 0.0], [0.0, 0.0])["p_value"] == 1.0  # no difference at all


def test_tost_by_hand_and_against_the_interval():
    # d = [1, 2, 3]: mean 2, se 1/sqrt(3) = 0.57735; margin 4: t_low = (2 + 4)/se = 10.392, t_high = (2 - 4)/se
    # = -3.464; p = max(sf(10.392, 2), cdf(-3.464, 2)) = cdf(-3.464, 2) = 0.03709 (t with 2 df:
    # cdf(-x) = (1 - x / sqrt(x^2 + 2)) / 2 = (1 - 3.464 / 3.742) / 2 = 0.0371).
    x = 2 * math.sqrt(3)  # (margin - mean) / se = 2 / (1 / sqrt(3))
    expected = (1 - x / math.sqrt(x * x + 2)) / 2
    r = stats.paired_tost([0.0, 0.0, 0.0], [1.0, 2.0, 3.0], margin=4.0)
    assert r["p_value"] == pytest.approx(expected, rel=rounding_tol(1.0, ulps=1024, eps=EPS64))
    assert r["equivalent"] and -4.0 < r["low"] and r["high"] < 4.0  # the 90% interval inside the margin
    # margin 3: the 90% interval (2 +- 2.92 * 0.577 = [0.31, 3.69]) crosses 3, so not equivalent
    r3 = stats.paired_tost([0.0, 0.0, 0.0], [1.0, 2.0, 3.0], margin=3.0)
    assert not r3["equivalent"] and r3["high"] > 3.0
    with pytest.raises(ValueError, match="margin > 0"):
        stats.paired_tost([0.0, 0.0], [1.0, 1.0], margin=0.0)


def test_holm_by_hand():
    # p = (0.01, 0.04, 0.03, 0.2), m = 4: sorted 0.01, 0.03, 0.04, 0.2 -> 4*0.01 = 0.04, 3*0.03 = 0.09,
    # 2*0.04 = 0.08 -> running max 0.09, 1*0.2 = 0.2; back in the input's order:
    adj = stats.holm([0.01, 0.04, 0.03, 0.2])
    assert adj == pytest.approx([0.04, 0.09, 0.09, 0.2])
    assert stats.holm([0.5, 0.9]) == [1.0, 1.0]  # capped at 1
    assert stats.holm([]) == []
    with pytest.raises(ValueError, match="in \\[0, 1\\]"):
        stats.holm([0.1, 1.5])


def test_cover_at_by_hand():
    # rates 0/4, 1/4, 2/4, 4/4: Cover@0.25 = 3/4 (any correct), Cover@0.5 = 2/4, Cover@1 = 1/4
    n, c = [4, 4, 4, 4], [0, 1, 2, 4]
    assert [stats.cover_at(n, c, t) for t in (0.25, 0.5, 1.0)] == [0.75, 0.5, 0.25]
    with pytest.raises(ValueError, match="0 < tau <= 1"):
        stats.cover_at(n, c, 0.0)
    with pytest.raises(ValueError, match="c <= n"):
        stats.cover_at([2], [3], 0.5)
