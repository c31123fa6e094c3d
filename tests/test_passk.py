"""The pass@k advantage estimator: hand cases for G = 4, k in {1, 2, 4}, a NumPy
re-implementation of the formula (Chen et al. 2025; verl `core_algos._calc_passk_adv`), k = 1 against GRPO,
invalid rows, and the config check."""

from __future__ import annotations

import math

import jax.numpy as jnp
import numpy as np
import pytest

from grpo_jax import advantages as adv_lib
from grpo_jax.config import AdvantageConfig
from tests.test_advantages import estimator_err, passk_err


def _err(outcomes, k, valid=None):
    """The float32 error bound of one group's pass@k advantages (tests/test_advantages.passk_err)."""
    valid = np.ones(len(outcomes), bool) if valid is None else np.asarray(valid, bool)
    return passk_err(np.asarray([outcomes]) == 1, valid[None], k)


def _passk(outcomes, k, valid=None):
    """Advantages of one group of 0/1 outcomes (a single reward dimension, weight 1, threshold 1)."""
    r = jnp.asarray([[[float(x)] for x in outcomes]], jnp.float32)
    v = None if valid is None else jnp.asarray([valid])
    adv, aux = adv_lib.compute_advantages(r, jnp.ones(1), valid=v, cfg=AdvantageConfig(estimator="passk", pass_k=k))
    return np.asarray(adv[0]), bool(aux["zero_variance"][0])


def _reference(outcomes, k):
    """The formula with Python's exact binomials, float64."""
    n, c = len(outcomes), int(sum(outcomes))
    comb = lambda a, b: math.comb(a, b) if 0 <= b <= a else 0  # noqa: E731
    rho = 1 - comb(n - c, k) / comb(n, k)
    sigma = math.sqrt(rho * (1 - rho))
    if sigma == 0:
        return np.zeros(n)
    pos = (1 - rho) / sigma
    neg = (1 - rho - comb(n - c - 1, k - 1) / comb(n - 1, k - 1)) / sigma
    return np.where(np.asarray(outcomes) == 1, pos, neg)


@pytest.mark.parametrize(("outcomes", "k", "expected"), [
    # k = 1: rho = p = c/4, sigma = sqrt(p(1-p)); A+ = (1-p)/sigma, A- = -p/sigma
    ([1, 0, 0, 0], 1, [math.sqrt(3), -1 / math.sqrt(3), -1 / math.sqrt(3), -1 / math.sqrt(3)]),
    ([1, 1, 0, 0], 1, [1.0, 1.0, -1.0, -1.0]),
    # k = 2, c = 1: rho = 1 - C(3,2)/C(4,2) = 1/2, sigma = 1/2; A+ = 1; A- = (1/2 - C(2,1)/C(3,1)) / (1/2) = -1/3
    ([1, 0, 0, 0], 2, [1.0, -1 / 3, -1 / 3, -1 / 3]),
    # k = 2, c = 2: rho = 1 - 1/6 = 5/6, sigma = sqrt(5)/6; A+ = (1/6)/sigma = 1/sqrt(5); A- = (1/6 - 1/3)/sigma
    ([0, 1, 0, 1], 2, [-1 / math.sqrt(5), 1 / math.sqrt(5), -1 / math.sqrt(5), 1 / math.sqrt(5)]),
    # k = 2, c = 3: every pair holds a success, rho = 1: no signal
    ([1, 1, 0, 1], 2, [0.0, 0.0, 0.0, 0.0]),
    # k = 4 = G: rho = 1 as soon as one succeeds: no signal
    ([1, 0, 0, 0], 4, [0.0, 0.0, 0.0, 0.0]),
    # all correct / all wrong: no signal for any k
    ([1, 1, 1, 1], 1, [0.0] * 4), ([1, 1, 1, 1], 2, [0.0] * 4), ([1, 1, 1, 1], 4, [0.0] * 4),
    ([0, 0, 0, 0], 1, [0.0] * 4), ([0, 0, 0, 0], 2, [0.0] * 4), ([0, 0, 0, 0], 4, [0.0] * 4),
])
def test_hand_cases_for_a_group_of_four(outcomes, k, expected):
    adv, zero_var = _passk(outcomes, k)
    # the closed forms above (float64) against float32: passk_err (0 for the degenerate groups: exactly 0)
    np.testing.assert_allclose(adv, expected, rtol=0, atol=_err(outcomes, k))
    assert zero_var == (not any(expected))


def test_matches_the_formula_on_random_groups():
    rng = np.random.default_rng(0)
    for g in (2, 3, 4, 8, 16):
        for k in (1, 2, 3, 4, 8):
            if k > g:
                continue
            for _ in range(5):
                outcomes = (rng.random(g) < rng.random()).astype(int).tolist()
                adv, _ = _passk(outcomes, k)
                np.testing.assert_allclose(adv, _reference(outcomes, k), rtol=0, atol=_err(outcomes, k),
                                           err_msg=f"G={g} k={k} {outcomes}")


def test_k1_is_grpo_with_the_population_std_on_binary_outcomes():
    rng = np.random.default_rng(1)
    r = jnp.asarray((rng.random((16, 8, 1)) < 0.4).astype(np.float32))
    w = jnp.ones(1)
    passk, _ = adv_lib.compute_advantages(r, w, cfg=AdvantageConfig(estimator="passk", pass_k=1))
    grpo, _ = adv_lib.compute_advantages(r, w, cfg=AdvantageConfig(estimator="grpo", std_ddof=0, eps=0.0))
    # two float32 computations of (r - p) / sqrt(p (1 - p)), each within its bound of the exact value
    tol = passk_err(np.asarray(r[..., 0]) == 1, np.ones(r.shape[:2], bool), 1) + estimator_err(
        "grpo", r, w, std_ddof=0, eps=0.0)
    np.testing.assert_allclose(np.asarray(passk), np.asarray(grpo), rtol=0, atol=tol)


def test_larger_k_penalises_failures_less_in_groups_that_already_pass():
    """The point of pass@k: with one success in four, a failure costs -1/sqrt(3) = -0.577 at k = 1 but
    -1/3 at k = 2 (the group already passes@2 half the time)."""
    one, _ = _passk([1, 0, 0, 0], 1)
    two, _ = _passk([1, 0, 0, 0], 2)
    assert two[1] > one[1] and two[1] < 0


def test_invalid_rows_are_left_out_and_threshold_uses_the_weighted_total():
    # rows 2-3 invalid: the group is [1, 0] (n = 2, k = 1: A = +1, -1)
    adv, _ = _passk([1, 0, 1, 1], 1, valid=[True, True, False, False])
    np.testing.assert_allclose(adv, [1.0, -1.0, 0.0, 0.0], rtol=0, atol=_err([1, 0, 1, 1], 1, [1, 1, 0, 0]))
    # correctness weight 1 plus format weight 0.1: totals 1.1 / 0.1 / 1.0 / 0.0 -> successes at >= 1.0
    r = jnp.asarray([[[1, 1], [0, 1], [1, 0], [0, 0]]], jnp.float32)
    adv2, _ = adv_lib.compute_advantages(r, jnp.asarray([1.0, 0.1]),
                                         cfg=AdvantageConfig(estimator="passk", pass_k=1))
    np.testing.assert_allclose(np.asarray(adv2[0]), [1.0, -1.0, 1.0, -1.0], rtol=0, atol=_err([1, 0, 1, 0], 1))


def test_pass_k_must_be_a_positive_int():
    with pytest.raises(ValueError, match="pass_k"):
        AdvantageConfig(estimator="passk", pass_k=0)


def test_singleton_groups_and_garbage_in_invalid_rows_give_zero():
    # one valid row: no group to compare with
    adv, zero_var = _passk([1, 0, 0, 0], 1, valid=[True, False, False, False])
    assert zero_var and np.all(adv == 0.0)
    # garbage (NaN, 1e6) in invalid rows changes nothing for the valid ones
    r = jnp.asarray([[[1.0], [0.0], [np.nan], [1e6]]], jnp.float32)
    cfg = AdvantageConfig(estimator="passk", pass_k=1)
    adv2, _ = adv_lib.compute_advantages(r, jnp.ones(1), valid=jnp.asarray([[True, True, False, False]]), cfg=cfg)
    np.testing.assert_allclose(np.asarray(adv2[0]), [1.0, -1.0, 0.0, 0.0], rtol=0,
                               atol=_err([1, 0, 0, 1], 1, [1, 1, 0, 0]))
