"""Reward-collapse, entropy and length diagnostics: hand-computed values, NumPy/SciPy parity, jit."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import scipy.stats

from grpo_jax import diagnostics as diag
from grpo_jax.advantages import weighted_total
from tests.tolerance import EPS32

_reward_diag = jax.jit(diag.reward_diagnostics, static_argnames="tol")


def reward_diag(rewards, weights, adv, **kw):
    """The diagnostics as the trainer calls them: totals from the one weighted_total."""
    return _reward_diag(rewards, weighted_total(rewards, weights), adv, **kw)
entropy_diag = jax.jit(diag.entropy_diagnostics, static_argnames=("num_bins", "hist_max", "near_zero"))


def test_collapse_ratio_on_gdpo_g3_example():
    # r1 = (1,1,0), r2 = (0,0,1): reward vectors {(1,0), (0,1)} -> D_R = 2.
    # grpo (w = 1,1): totals (1,1,1) -> A = (0,0,0) -> D_A = 1 -> ratio 2 (collapse).
    # per_dim (w = 1, 0.5): A = 0.5 z1 = (c, c, -2c), c = 0.5 (1/3) / sqrt(1/3) -> D_A = 2 -> ratio 1.
    rewards = jnp.array([[[1.0, 0.0], [1.0, 0.0], [0.0, 1.0]]])
    out = reward_diag(rewards, jnp.ones(2), jnp.zeros((1, 3)))
    assert int(out["collapse/distinct_rewards"]) == 2 and int(out["collapse/distinct_advantages"]) == 1
    np.testing.assert_allclose(out["collapse/ratio"], 2.0)
    c = 0.5 / 3 / np.sqrt(1 / 3)
    out = reward_diag(rewards, jnp.array([1.0, 0.5]), jnp.array([[c, c, -2 * c]]))
    np.testing.assert_allclose(out["collapse/ratio"], 1.0)
    np.testing.assert_array_equal(out["adv/distinct_per_group"], [2])


def test_reward_statistics_hand_values():
    # Group 0: dim0 (1, 0, 1, 0) mean 1/2, var 1/4; dim1 (2, 2, 2, nan) mean 2, var 0 (constant).
    # Group 1: dim0 (1, 1, 1, 1) constant; dim1 (0, 1, nan, nan) mean 1/2, var 1/4; row 3 invalid.
    nan = np.nan
    rewards = jnp.array([
        [[1, 2], [0, 2], [1, 2], [0, nan]],
        [[1, 0], [1, 1], [1, nan], [5, 5]],
    ], jnp.float32)
    valid = jnp.array([[1, 1, 1, 1], [1, 1, 1, 0]], bool)
    adv = jnp.array([[1.0, -1.0, 1.0, -1.0], [-1.0, 1.0, 0.0, 9.0]])
    out = reward_diag(rewards, jnp.array([1.0, 1.0]), adv, valid=valid)
    np.testing.assert_allclose(out["reward/group_mean"], [[0.5, 2.0], [1.0, 0.5]])
    np.testing.assert_allclose(out["reward/group_var"], [[0.25, 0.0], [0.0, 0.25]])
    np.testing.assert_allclose(out["reward/mean"], [(1 + 0 + 1 + 0 + 1 + 1 + 1) / 7, (2 + 2 + 2 + 0 + 1) / 5])
    # Totals (NaN skipped): group 0 (3, 2, 3, 0), group 1 (1, 2, 1): neither constant.
    np.testing.assert_allclose(out["groups/zero_var_frac"], 0.0)
    # reward/total: mean of the 7 valid totals = 12 / 7. Group variances (ddof 0): group 0 mean 2,
    # ((1 + 0 + 1 + 4) / 4) = 1.5; group 1 mean 4/3, ((1/9 + 4/9 + 1/9) / 3) = 2/9; mean (1.5 + 2/9) / 2.
    np.testing.assert_allclose(out["reward/total"], 12 / 7, rtol=1e-6)
    np.testing.assert_allclose(out["groups/reward_var_mean"], (1.5 + 2 / 9) / 2, rtol=1e-6)
    np.testing.assert_allclose(out["reward/zero_var_frac_per_dim"], [0.5, 0.5])
    # Group 0: vectors (1,2), (0,2), (1,2), (0,nan) -> 3 distinct; A (1,-1,1,-1) -> 2 distinct.
    # Group 1: vectors (1,0), (1,1), (1,nan) -> 3 distinct; A (-1, 1, 0) -> 3. Ratio (3+3)/(2+3).
    np.testing.assert_array_equal(out["reward/distinct_vectors_per_group"], [3, 3])
    np.testing.assert_array_equal(out["adv/distinct_per_group"], [2, 3])
    np.testing.assert_allclose(out["collapse/ratio"], 6 / 5)


def test_adv_correlation():
    # dim0 = A exactly -> corr 1; dim1 = -2 A + 3 -> corr -1; dim2 constant -> 0 (undefined, reported 0).
    adv = jnp.array([[0.5, -1.0, 2.0], [0.0, 1.0, -3.0]])
    rewards = jnp.stack([adv, -2 * adv + 3, jnp.ones_like(adv)], axis=-1)
    out = reward_diag(rewards, jnp.ones(3), adv)
    # |corr| = 1 is an extremum: rounding in the inputs and the deviations moves it only to second order; the
    # float32 sums of n = 6 products (n roundings each), sxx syy, sqrt and / add <= 2n + 3 roundings of eps/2 (the
    # constant dimension gives exactly 0)
    tol = (2 * 6 + 3) * EPS32 / 2
    np.testing.assert_allclose(out["reward/adv_corr"], [1.0, -1.0, 0.0], rtol=0, atol=tol)


def test_zero_variance_fractions():
    # 3 groups: totals constant in groups 0 and 2 (group 2: (1,0) vs (0,1) both total 1), so 2/3.
    # dim0 constant in group 0 only -> 1/3; dim1 constant in group 0 only -> 1/3.
    rewards = jnp.array([[[1, 1], [1, 1]], [[0, 0], [1, 1]], [[1, 0], [0, 1]]], jnp.float32)
    out = reward_diag(rewards, jnp.ones(2), jnp.zeros((3, 2)))
    np.testing.assert_allclose(out["groups/zero_var_frac"], 2 / 3, rtol=1e-6)
    np.testing.assert_allclose(out["reward/zero_var_frac_per_dim"], [1 / 3, 1 / 3], rtol=1e-6)


def test_entropy_percentiles_histogram_bimodality():
    ent = jnp.array([[0.0, 0.001, 0.1, 0.5, 3.9], [1.0, 2.0, 5.0, 7.0, 0.3]])
    mask = jnp.array([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0]], bool)
    vals = np.asarray(ent)[np.asarray(mask)]  # 8 tokens: 0, .001, .1, .5, 3.9, 1, 2, 5
    out = entropy_diag(ent, mask, num_bins=4, hist_max=4.0, near_zero=0.01)
    for q in diag.QUANTILES:
        np.testing.assert_allclose(out[f"entropy/p{q}"], np.percentile(vals, q), rtol=1e-5, err_msg=str(q))
    np.testing.assert_allclose(out["entropy/mean"], vals.mean(), rtol=1e-6)
    # Bins [0,1), [1,2), [2,3), [3,4) + overflow: {0, .001, .1, .5}, {1}, {2}, {3.9, 5} -> 4, 1, 1, 2 of 8.
    np.testing.assert_allclose(out["entropy/hist"], [0.5, 0.125, 0.125, 0.25])
    np.testing.assert_allclose(out["entropy/hist_edges"], [0, 1, 2, 3, 4])
    np.testing.assert_allclose(out["entropy/near_zero_frac"], 2 / 8)  # 0 and 0.001
    assert int(out["entropy/num_tokens"]) == 8
    # Sarle's coefficient from SciPy's bias-corrected skewness and excess kurtosis.
    n = len(vals)
    skew = scipy.stats.skew(vals, bias=False)
    kurt = scipy.stats.kurtosis(vals, bias=False)
    expected_bc = (skew**2 + 1) / (kurt + 3 * (n - 1) ** 2 / ((n - 2) * (n - 3)))
    np.testing.assert_allclose(out["entropy/bimodality"], expected_bc, rtol=1e-4)


def test_bimodality_separates_bimodal_from_unimodal():
    # Two well-separated clusters (collapsed tokens near 0 and forking tokens near 2) give BC > 5/9;
    # an evenly spread (uniform-like) sample gives BC ~ 5/9 or less.
    bimodal = jnp.concatenate([jnp.linspace(0.0, 0.05, 50), jnp.linspace(2.0, 2.05, 50)])
    uniform = jnp.linspace(0.0, 2.0, 100)
    ones = jnp.ones(100, bool)
    bc = jax.jit(diag.bimodality_coefficient)
    assert float(bc(bimodal, ones)) > 0.9
    assert float(bc(uniform, ones)) < 5 / 9 + 0.01
    assert float(bc(uniform, ones.at[3:].set(False))) == 0.0  # n < 4: undefined -> 0


def test_empty_inputs_give_zeros_not_nan():
    out = entropy_diag(jnp.ones((2, 3)), jnp.zeros((2, 3), bool))
    assert all(np.all(np.isfinite(np.asarray(v))) for v in out.values())
    out = reward_diag(jnp.ones((2, 3, 2)), jnp.ones(2), jnp.zeros((2, 3)), valid=jnp.zeros((2, 3), bool))
    assert all(np.all(np.isfinite(np.asarray(v))) for v in out.values())
    assert float(out["collapse/ratio"]) == 0.0


def test_length_diagnostics():
    # Valid rows: lengths 10 (terminated), 32 (truncated), 7 (terminated); row 3 invalid.
    lengths = jnp.array([10, 32, 7, 100])
    truncated = jnp.array([False, True, False, True])
    valid = jnp.array([True, True, True, False])
    out = jax.jit(diag.length_diagnostics)(lengths, truncated, valid=valid)
    np.testing.assert_allclose(
        [out[k] for k in ("length/mean", "length/min", "length/max", "length/truncated_frac",
                          "length/terminated_mean")],
        [49 / 3, 7, 32, 1 / 3, 8.5], rtol=1e-6,
    )


def test_masked_quantile_matches_numpy():
    x = jnp.array([[0.3, 0.1, 0.9, 0.4], [0.8, 0.2, 0.6, 0.5]])
    mask = jnp.array([[1, 1, 0, 1], [1, 1, 1, 0]], bool)
    qs = jnp.array([0.0, 0.1, 0.5, 0.8, 1.0])
    expected = np.quantile(np.asarray(x)[np.asarray(mask)], np.asarray(qs))
    np.testing.assert_allclose(jax.jit(diag.masked_quantile)(x, mask, qs), expected, rtol=1e-6)
