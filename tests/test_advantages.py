"""Advantage estimators: hand-computed values, peer cross-checks (TRL, verl), conventions, jit/vmap."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from grpo_jax import advantages as adv_lib
from grpo_jax.config import ADVANTAGE_ESTIMATORS, AdvantageConfig
from tests.tolerance import EPS32, center_err, group_stats, rounding_tol, zscore_err

ALL = tuple(ADVANTAGE_ESTIMATORS)
# passk scores thresholded 0/1 outcomes, so the continuous-reward cases below do not apply to it; its
# zero-variance, singleton and invalid-row cases are in tests/test_passk.py
CONTINUOUS = tuple(n for n in ALL if n != "passk")
_jit_compute = jax.jit(adv_lib.compute_advantages, static_argnames="cfg")


def run(name: str, rewards, weights, valid=None, **cfg_kw):
    """Jitted (one compile per config and shape); eager parity is tested separately below."""
    adv, aux = _jit_compute(
        jnp.asarray(rewards, jnp.float32), jnp.asarray(weights, jnp.float32), valid=valid,
        cfg=AdvantageConfig(estimator=name, **cfg_kw),
    )
    return np.asarray(adv), aux


@jax.jit
def _all_estimators(rewards, weights, valid):
    """Every estimator with its default config in one program: one compile per shape for all of them."""
    cfgs = {n: AdvantageConfig(estimator=n) for n in ALL}
    return {n: adv_lib.compute_advantages(rewards, weights, valid=valid, cfg=c) for n, c in cfgs.items()}


def run_default(name: str, rewards, weights, valid=None):
    rewards = jnp.asarray(rewards, jnp.float32)
    valid = jnp.ones(rewards.shape[:2], bool) if valid is None else valid
    adv, aux = _all_estimators(rewards, jnp.asarray(weights, jnp.float32), valid)[name]
    return np.asarray(adv), aux


def estimator_err(name: str, rewards, weights, valid=None, **cfg_kw) -> float:
    """A bound on |float32 advantage - exact advantage| over the valid rows of an estimator, from the float32
    roundings of its steps (tests/tolerance.center_err / zscore_err, per entry; u = eps / 2): the weighted total
    sum_k w_k r_k (K products, K - 1 adds: 2K u sum_k |w_k r_k|), the group centring or z-score, rloo's
    n / (n - 1) (2 u), the batch z-score of gdpo and reinforce_pp_baseline and grpo_batch_std's batch std; gdpo
    and per_dim fuse per-dimension z-scores (sum_k |w_k| their error + 2K u sum_k |w_k z_k|); passk: passk_err."""
    cfg = AdvantageConfig(estimator=name, **cfg_kw)
    ddof, u = cfg.std_ddof, EPS32 / 2
    r = np.asarray(rewards, np.float64)
    w = np.asarray(weights, np.float64)
    ok = np.ones(r.shape[:2], bool) if valid is None else np.asarray(valid, bool)
    wr = np.where(np.isnan(r), 0.0, r * w)
    total = np.where(ok, wr.sum(-1), np.nan)
    total_err = 2 * r.shape[-1] * u * np.abs(wr).sum(-1)
    flat = lambda x: np.where(ok, x, np.nan).reshape(1, -1)  # noqa: E731  the batch as one group
    if name == "passk":
        return passk_err(np.where(ok, total >= cfg.pass_threshold, False), ok, cfg.pass_k)
    if name == "grpo":
        err = zscore_err(total, cfg.eps, total_err, ddof)
    elif name in ("drgrpo", "rloo", "reinforce_pp_baseline", "grpo_batch_std"):
        centered = np.where(ok, total - np.nanmean(total, -1, keepdims=True), np.nan)
        err = center_err(total, total_err)
        if name == "rloo":
            n = np.sum(ok, -1, keepdims=True)
            err = (err + 2 * u * np.abs(np.nan_to_num(centered))) * n / np.maximum(n - 1, 1)
        elif name == "reinforce_pp_baseline":
            err = zscore_err(flat(centered), cfg.batch_norm_eps, flat(err), ddof)
        elif name == "grpo_batch_std":  # centred / (batch std + eps): the std as in zscore_err, over all totals
            _, d, rr, _, _ = group_stats(flat(total), flat(total_err))
            n = ok.sum()
            s = np.sqrt((d**2).sum() / max(n - ddof, 1))
            s_err = rr.max() * np.sqrt(n / max(n - ddof, 1)) + ((n + 1) / 2 + 2) * u * s
            a = np.abs(np.nan_to_num(centered)) / (s + cfg.batch_norm_eps)
            err = (err + a * s_err + u * a * (s + cfg.batch_norm_eps)) / (s + cfg.batch_norm_eps)
    else:
        assert name in ("gdpo", "per_dim"), name
        per_k = np.moveaxis(np.where(ok[..., None], r, np.nan), -1, 0)
        z_err = [zscore_err(x, cfg.eps, 0.0, ddof) for x in per_k]
        z = []
        for x in per_k:
            mean = np.nanmean(x, -1, keepdims=True)
            n = (~np.isnan(x)).sum(-1, keepdims=True)
            std = np.sqrt(np.nansum((x - mean) ** 2, -1, keepdims=True) / np.maximum(n - ddof, 1))
            z.append(np.nan_to_num((x - mean) / (std + cfg.eps)))
        err = sum(abs(wk) * ek + 2 * len(w) * u * abs(wk) * np.abs(zk) for wk, ek, zk in zip(w, z_err, z))
        if name == "gdpo":
            fused = sum(wk * zk for wk, zk in zip(w, z))
            err = zscore_err(flat(fused), cfg.batch_norm_eps, flat(err), ddof)
    return float(np.max(np.where(np.isnan(flat(total)), 0.0, np.reshape(err, (1, -1))), initial=0.0))


def passk_err(success, valid, k: int) -> float:
    """A bound on the float32 error of the pass@k advantages (advantages._passk_group) of groups of 0/1 outcomes
    [B, G] (u = eps / 2): the binomials are exact integers (lgamma, exp and round, n <= a few hundred); their
    quotients round (u), rho = 1 - q and 1 - rho are off by <= u each, sigma^2 = rho (1 - rho) by <= 3u, so
    sigma by 3u / (2 sigma) + u sigma; the numerators by <= 3u: A = num / sigma is off by
    3u / sigma + |A| (3u / (2 sigma^2) + 2u). Degenerate groups are exactly 0 (bound 0)."""
    import math

    u = EPS32 / 2
    comb = lambda a, b: math.comb(a, b) if 0 <= b <= a else 0  # noqa: E731
    worst = 0.0
    for s_row, v_row in zip(np.asarray(success, bool), np.asarray(valid, bool)):
        n, c = int(v_row.sum()), int((s_row & v_row).sum())
        if n < 2 or k > n:
            continue
        rho = 1 - comb(n - c, k) / comb(n, k)
        sigma = math.sqrt(rho * (1 - rho))
        if sigma == 0:
            continue
        a = max(abs(1 - rho), abs(1 - rho - comb(n - c - 1, k - 1) / max(comb(n - 1, k - 1), 1))) / sigma
        worst = max(worst, 3 * u / sigma + a * (1.5 * u / sigma**2 + 2 * u))
    return worst


# ------------------------------------------------------------------------------------ hand-computed cases

# GDPO paper, G=2, two binary rewards, unit weights. Rows are (r1, r2) of the two rollouts.
PAIRS = {  # total-reward pair -> reward vectors giving it
    (0, 1): [[0, 0], [1, 0]],
    (0, 2): [[0, 0], [1, 1]],
    (1, 2): [[1, 0], [1, 1]],
}


def test_grpo_collapses_gdpo_paper_pairs():
    # Totals (a, b), a < b: mean (a+b)/2, ddof=1 std = |b-a|/sqrt(2), so
    # A = -+ (|b-a|/2) / (|b-a|/sqrt(2) + eps). For (0,1) and (1,2): 0.5 / (sqrt(.5) + eps);
    # for (0,2): 1 / (sqrt(2) + eps). Both ~ 0.7071: three different pairs, one advantage.
    eps = 1e-6
    adv, _ = run("grpo", list(PAIRS.values()), [1.0, 1.0], eps=eps)
    small = 0.5 / (np.sqrt(0.5) + eps)
    large = 1.0 / (np.sqrt(2.0) + eps)
    np.testing.assert_allclose(adv, [[-small, small], [-large, large], [-small, small]], rtol=1e-6)
    # 1/sqrt(2) (to 8 decimals: 5e-9) less eps's share, 0.5 eps / (sqrt(.5) (sqrt(.5) + eps)) <= eps, and float32
    tol = eps + 5e-9 + estimator_err("grpo", list(PAIRS.values()), [1.0, 1.0], eps=eps)
    np.testing.assert_allclose(np.abs(adv), 0.70710678, rtol=0, atol=tol)
    adv0, _ = run("grpo", list(PAIRS.values()), [1.0, 1.0], std_ddof=0)
    # ddof=0: |b-a|/2 / (|b-a|/2 + eps) = 1 less eps / (std + eps) <= 1e-6 / 0.5 (std >= 0.5), and float32
    tol = 1e-6 / 0.5 + estimator_err("grpo", list(PAIRS.values()), [1.0, 1.0], std_ddof=0)
    np.testing.assert_allclose(np.abs(adv0), 1.0, rtol=0, atol=tol)


def test_gdpo_distinguishes_gdpo_paper_pairs():
    # Per dimension, a varying binary pair z-scores to -+z, z = 0.5/(sqrt(.5)+eps); a constant one to 0.
    #   (0,1): dim1 varies, dim2 constant -> A_sum = (-z, z)
    #   (0,2): both vary                   -> A_sum = (-2z, 2z)
    #   (1,2): dim2 varies                 -> A_sum = (-z, z)
    # Batch of 6 values: mean 0, ddof=1 var = (4 z^2 + 2 (2z)^2) / 5 = 12 z^2 / 5, std = z sqrt(2.4).
    # So A = (-+1, -+2, -+1) z / (z sqrt(2.4) + 1e-4): (0,2) gets twice the advantage of (0,1).
    eps, beps = 1e-6, 1e-4
    adv, aux = run("gdpo", list(PAIRS.values()), [1.0, 1.0], eps=eps, batch_norm_eps=beps)
    z = 0.5 / (np.sqrt(0.5) + eps)
    unit = z / (z * np.sqrt(2.4) + beps)
    np.testing.assert_allclose(adv, [[-unit, unit], [-2 * unit, 2 * unit], [-unit, unit]], rtol=1e-5)
    np.testing.assert_allclose(aux["scores"], [[-z, z], [-2 * z, 2 * z], [-z, z]], rtol=1e-6)


def test_g3_case_grpo_zero_although_rewards_differ():
    # r1 = (1,1,0), r2 = (0,0,1): totals (1,1,1) -> zero-variance group -> A = 0 exactly under grpo.
    rewards = [[[1, 0], [1, 0], [0, 1]]]
    adv, aux = run("grpo", rewards, [1.0, 1.0])
    assert np.all(adv == 0.0) and bool(aux["zero_variance"][0])
    # Per dimension: mean 2/3, ddof=1 std = sqrt(1/3), z1 = (1/3, 1/3, -2/3)/sqrt(1/3) and z2 = -z1.
    # With equal weights the fused score z1 + z2 cancels too (exactly anti-correlated dims); gdpo keeps
    # it at exactly 0 instead of amplifying the float residue in the batch step.
    adv_gdpo, aux_gdpo = run("gdpo", rewards, [1.0, 1.0])
    assert np.all(adv_gdpo == 0.0) and bool(aux_gdpo["zero_variance"][0])
    # Unequal weights (1, 0.5): per_dim gives 0.5 z1 = 0.5 (1/3, 1/3, -2/3) / (sqrt(1/3) + eps).
    adv_pd, _ = run("per_dim", rewards, [1.0, 0.5])
    z1 = np.array([1, 1, -2]) / 3 / (np.sqrt(1 / 3) + 1e-6)
    np.testing.assert_allclose(adv_pd[0], 0.5 * z1, rtol=1e-6)


def test_single_group_hand_values():
    # Totals (1, 0, 0, 0): mean 1/4, deviations (3/4, -1/4, -1/4, -1/4).
    rewards = [[[1.0], [0.0], [0.0], [0.0]]]
    dev = np.array([0.75, -0.25, -0.25, -0.25])
    adv, _ = run("drgrpo", rewards, [1.0])
    np.testing.assert_allclose(adv[0], dev, rtol=1e-6)
    adv, _ = run("rloo", rewards, [1.0])  # G/(G-1) dev = (1, -1/3, -1/3, -1/3)
    np.testing.assert_allclose(adv[0], [1.0, -1 / 3, -1 / 3, -1 / 3], rtol=1e-6)
    adv, _ = run("grpo", rewards, [1.0], eps=0.0)  # ddof=1 var = (9/16 + 3/16)/3 = 1/4, std = 1/2
    np.testing.assert_allclose(adv[0], dev / 0.5, rtol=1e-6)
    adv, _ = run("grpo", rewards, [1.0], eps=0.0, std_ddof=0)  # ddof=0 std = sqrt(3/16)
    np.testing.assert_allclose(adv[0], dev / np.sqrt(3 / 16), rtol=1e-6)


@pytest.mark.parametrize("name", ALL)
def test_pos_scale_scales_positive_advantages_only(name):
    # W-REINFORCE: A -> lambda * A where A > 0, unchanged where A <= 0, after the estimator.
    # Hand case, grpo, totals (1, 0, 0, 1): mean 1/2, ddof-1 std sqrt(1/3), A = +-sqrt(3)/2;
    # with lambda 0.1 the two correct rows get 0.1 * sqrt(3)/2 and the wrong ones keep -sqrt(3)/2.
    r, w = random_rewards(7, B=4, G=4, nan_frac=0.0)
    r[0] = 0.5  # a constant group: zero variance, stays exactly 0
    if name == "passk":
        r = (r > 0.5).astype(np.float32)
    plain, _ = run(name, r, w)
    # two float32 programs of the estimator (each within estimator_err of the exact values) and lam x in float32
    tol = 2 * estimator_err(name, r, w) + rounding_tol(plain, ulps=0.5)
    for lam in (0.0, 0.1):
        scaled, _ = run(name, r, w, pos_scale=lam)
        np.testing.assert_allclose(scaled, np.where(plain > 0, lam * plain, plain), rtol=0, atol=tol)
    assert np.any(plain > 0) and np.any(plain < 0) and np.all(plain[0] == 0.0)
    if name == "grpo":
        adv, _ = run("grpo", [[[1.0], [0.0], [0.0], [1.0]]], [1.0], eps=0.0, pos_scale=0.1)
        a = np.sqrt(3) / 2
        np.testing.assert_allclose(adv[0], [0.1 * a, -a, -a, 0.1 * a], rtol=1e-6)
    with pytest.raises(ValueError, match=r"AdvantageConfig\.pos_scale"):
        AdvantageConfig(pos_scale=1.5)


def test_weighted_sum_and_nan_dims_as_trl_nansum():
    # Weights (2, 1): totals 2 r1 + r2 with NaN skipped: (2*1 + 0, nan->0 + 1, 2*0 + nan->0) = (2, 1, 0).
    rewards = [[[1.0, 0.0], [np.nan, 1.0], [0.0, np.nan]]]
    adv, aux = run("drgrpo", rewards, [2.0, 1.0])
    np.testing.assert_allclose(aux["scores"][0], [2.0, 1.0, 0.0])
    # totals (2, 1, 0) less their mean 1, by hand; float32 within estimator_err
    np.testing.assert_allclose(adv[0], [1.0, 0.0, -1.0], rtol=0, atol=estimator_err("drgrpo", rewards, [2.0, 1.0]))


@pytest.mark.parametrize("name", ALL)
def test_every_estimator_reports_the_weighted_totals_it_applied_the_weights_for(name):
    # The same rows as above: 2 r1 + r2 with NaN skipped = (2, 1, 0), whatever the estimator does with them;
    # the diagnostics read these totals, so the weights are applied in one place.
    rewards = [[[1.0, 0.0], [np.nan, 1.0], [0.0, np.nan]]]
    _, aux = run(name, rewards, [2.0, 1.0])
    np.testing.assert_array_equal(aux["totals"][0], [2.0, 1.0, 0.0])


def test_per_dim_ignores_nan_entries_in_dimension_stats():
    # dim1 (1, 0, nan): stats over 2 rows, z = (+-0.5)/(sqrt(.5)+eps), NaN row contributes 0.
    # dim2 (nan, nan, nan): absent everywhere -> contributes 0.
    eps = 1e-6
    rewards = [[[1.0, np.nan], [0.0, np.nan], [np.nan, np.nan]]]
    adv, _ = run("per_dim", rewards, [1.0, 1.0], eps=eps)
    z = 0.5 / (np.sqrt(0.5) + eps)
    np.testing.assert_allclose(adv[0], [z, -z, 0.0], rtol=1e-6)


# ------------------------------------------------------------------------ zero variance, singleton, invalid


@pytest.mark.parametrize("name", CONTINUOUS)
def test_zero_variance_groups_and_invalid_rows(name):
    # Compact batch: group 0 constant (0.3, 1) in every row, groups 1-3 vary.
    rng = np.random.default_rng(1)
    compact = rng.integers(0, 3, size=(4, 3, 2)).astype(np.float32)
    compact[0] = [0.3, 1.0]
    compact[1, :, 0] = [0.0, 1.0, 2.0]
    # Padded batch: two invalid garbage rows per group (NaN, 1e6) and a fifth, fully invalid group.
    # Invalid rows are left out of every group and batch statistic, so the valid rows must not change.
    padded = np.full((5, 5, 2), 1e6, np.float32)
    padded[:4, :3] = compact
    padded[:, 3, 0] = np.nan
    valid = np.zeros((5, 5), bool)
    valid[:4, :3] = True
    a_compact, aux_compact = run_default(name, compact, [1.0, 0.7])
    a_padded, aux_padded = run_default(name, padded, [1.0, 0.7], valid=jnp.asarray(valid))
    # two float32 programs (the padded one adds exact zeros for its invalid rows): each within estimator_err
    tol = 2 * estimator_err(name, compact, [1.0, 0.7])
    np.testing.assert_allclose(a_padded[:4, :3], a_compact, rtol=0, atol=tol)
    assert np.all(a_padded[:, 3:] == 0.0) and np.all(a_padded[4] == 0.0)
    # The constant group gets exactly 0 (batch estimators must not leak the batch mean into it).
    assert np.all(a_compact[0] == 0.0) and np.any(a_compact[1] != 0.0)
    assert bool(aux_compact["zero_variance"][0]) and not bool(aux_compact["zero_variance"][1])
    np.testing.assert_array_equal(aux_padded["num_valid"], [3, 3, 3, 3, 0])
    assert bool(aux_padded["zero_variance"][0]) and bool(aux_padded["zero_variance"][4])


@pytest.mark.parametrize("name", CONTINUOUS)
def test_singleton_group_gets_zero(name):
    rng = np.random.default_rng(0)
    rewards = rng.normal(size=(2, 4, 2))
    valid = np.array([[True, False, False, False], [True] * 4])
    adv, aux = run_default(name, rewards, [1.0, 1.0], valid=jnp.asarray(valid))
    assert np.all(adv[0] == 0.0) and bool(aux["zero_variance"][0])
    assert np.all(np.isfinite(adv)) and np.any(adv[1] != 0.0)
    np.testing.assert_array_equal(aux["num_valid"], [1, 4])


# ---------------------------------------------------------------- cross-checks against peer formulas (NumPy)


def np_trl_sum_then_normalize(r_NxK, w, G, eps=1e-4):
    """TRL GRPOTrainer, multi_objective_aggregation="sum_then_normalize", scale_rewards="group"."""
    total = np.nansum(r_NxK * w[None, :], axis=1).reshape(-1, G)
    return ((total - total.mean(1, keepdims=True)) / (total.std(1, ddof=1, keepdims=True) + eps)).reshape(-1)


def np_trl_batch_std(r_NxK, w, G, eps=1e-4):
    """TRL scale_rewards="batch": group mean, std of the raw rewards over the whole batch."""
    total = np.nansum(r_NxK * w[None, :], axis=1)
    grouped = total.reshape(-1, G)
    return ((grouped - grouped.mean(1, keepdims=True)).reshape(-1)) / (total.std(ddof=1) + eps)


def np_trl_normalize_then_sum(r_NxK, w, G, eps=1e-4):
    """TRL normalize_then_sum (= NVlabs GDPO): nanmean / Bessel nanstd per reward, nansum, batch z-score."""
    grouped = r_NxK.reshape(-1, G, r_NxK.shape[1])
    mean = np.nanmean(grouped, axis=1, keepdims=True)
    count = np.sum(~np.isnan(grouped), axis=1, keepdims=True)
    var = np.nanmean((grouped - mean) ** 2, axis=1, keepdims=True) * count / (count - 1)
    reward_k = ((grouped - mean) / (np.sqrt(var) + eps)).reshape(-1, r_NxK.shape[1])
    x = np.nansum(reward_k * w[None, :], axis=1)
    return (x - x.mean()) / (x.std(ddof=1) + eps)


def np_verl_grpo(scores, G, eps=1e-6):
    """verl compute_grpo_outcome_advantage: (s - mean) / (torch.std + eps) per group."""
    s = scores.reshape(-1, G)
    return ((s - s.mean(1, keepdims=True)) / (s.std(1, ddof=1, keepdims=True) + eps)).reshape(-1)


def np_verl_rloo(scores, G):
    """verl compute_rloo_outcome_advantage: s n/(n-1) - mean n/(n-1)."""
    s = scores.reshape(-1, G)
    return (s * G / (G - 1) - s.mean(1, keepdims=True) * G / (G - 1)).reshape(-1)


def np_verl_rpp_baseline(scores, G):
    """verl compute_reinforce_plus_plus_baseline_outcome_advantage, one token per response:
    s - group mean, then masked_whiten: (x - mean) * rsqrt(Bessel var + 1e-8)."""
    s = scores.reshape(-1, G)
    x = (s - s.mean(1, keepdims=True)).reshape(-1)
    return (x - x.mean()) / np.sqrt(x.var(ddof=1) + 1e-8)


def random_rewards(seed: int, B=16, G=8, nan_frac=0.0):
    """Multi-reward batch: a graded dimension, a binary one and a continuous one, optional NaN holes."""
    rng = np.random.default_rng(seed)
    r = np.stack([
        rng.integers(0, 4, size=(B, G)) / 3.0,
        (rng.random((B, G)) < 0.4).astype(np.float64),
        rng.normal(size=(B, G)),
    ], axis=-1)
    if nan_frac:
        r[rng.random(r.shape) < nan_frac] = np.nan
    return r.astype(np.float32).astype(np.float64), np.array([1.0, 0.5, 0.25])


@pytest.mark.parametrize("seed", [0, 1])
def test_grpo_matches_trl_sum_then_normalize(seed):
    r, w = random_rewards(seed, nan_frac=0.1)
    adv, _ = run("grpo", r, w, eps=1e-4)
    # float32 against the float64 peer on the same (float32) rewards: estimator_err (the peer's rounding is ~1e-9 of it)
    tol = estimator_err("grpo", r, w, eps=1e-4)
    np.testing.assert_allclose(adv.reshape(-1), np_trl_sum_then_normalize(r.reshape(-1, 3), w, 8), rtol=0, atol=tol)


@pytest.mark.parametrize("seed", [0, 1])
def test_gdpo_matches_trl_normalize_then_sum(seed):
    r, w = random_rewards(seed, nan_frac=0.1)
    adv, _ = run("gdpo", r, w, eps=1e-4, batch_norm_eps=1e-4)
    tol = estimator_err("gdpo", r, w, eps=1e-4, batch_norm_eps=1e-4)  # float32 against the float64 peer
    np.testing.assert_allclose(adv.reshape(-1), np_trl_normalize_then_sum(r.reshape(-1, 3), w, 8), rtol=0, atol=tol)


def test_grpo_batch_std_matches_trl_scale_rewards_batch():
    r, w = random_rewards(2)
    adv, _ = run("grpo_batch_std", r, w, batch_norm_eps=1e-4)
    tol = estimator_err("grpo_batch_std", r, w, batch_norm_eps=1e-4)  # float32 against the float64 peer
    np.testing.assert_allclose(adv.reshape(-1), np_trl_batch_std(r.reshape(-1, 3), w, 8), rtol=0, atol=tol)


@pytest.mark.parametrize("seed", [3, 4])
def test_matches_verl_grpo_rloo_reinforce_pp_baseline(seed):
    r, w = random_rewards(seed)
    scores = (r * w).sum(-1).reshape(-1)
    # float32 against the float64 peers on the same (float32) rewards: estimator_err each
    adv, _ = run("grpo", r, w, eps=1e-6)
    tol = estimator_err("grpo", r, w, eps=1e-6)
    np.testing.assert_allclose(adv.reshape(-1), np_verl_grpo(scores, 8), rtol=0, atol=tol)
    adv, _ = run("rloo", r, w)
    np.testing.assert_allclose(adv.reshape(-1), np_verl_rloo(scores, 8), rtol=0, atol=estimator_err("rloo", r, w))
    # verl puts its 1e-8 inside the sqrt; with batch_norm_eps=0 the two differ by x / sqrt(var) - x / sqrt(var +
    # 1e-8) <= |A| 1e-8 / (2 var), var the peer's Bessel variance of the centred scores.
    adv, _ = run("reinforce_pp_baseline", r, w, batch_norm_eps=0.0)
    want = np_verl_rpp_baseline(scores, 8)
    centred = (scores.reshape(-1, 8) - scores.reshape(-1, 8).mean(1, keepdims=True)).reshape(-1)
    tol = estimator_err("reinforce_pp_baseline", r, w, batch_norm_eps=0.0) + np.abs(want).max() * 1e-8 / (
        2 * centred.var(ddof=1))
    np.testing.assert_allclose(adv.reshape(-1), want, rtol=0, atol=tol)


# ------------------------------------------------------------------------------------- jit, vmap, config


def test_every_estimator_under_jit_and_vmap_matches_eager():
    # jit(vmap(estimator)) over two independent batches == the eager estimator on each batch.
    r, w = random_rewards(5, B=4, G=4, nan_frac=0.1)
    r = jnp.asarray(r, jnp.float32).reshape(2, 2, 4, 3)  # two batches of B=2
    w = jnp.asarray(w, jnp.float32)
    valid = jnp.ones((2, 2, 4), bool).at[0, 1, 2].set(False)
    for name in ALL:
        cfg = AdvantageConfig(estimator=name)
        vmapped = jax.jit(jax.vmap(lambda r_, v_: adv_lib.compute_advantages(r_, w, valid=v_, cfg=cfg)[0]))
        eager = [adv_lib.ESTIMATORS[name](r[i], w, valid=valid[i], cfg=cfg)[0] for i in range(2)]
        # two float32 programs of the estimator, each within estimator_err of the exact values
        tol = 2 * max(estimator_err(name, r[i], w, valid[i]) for i in range(2))
        np.testing.assert_allclose(vmapped(r, valid), np.stack(eager), rtol=0, atol=tol, err_msg=name)


def test_registry_is_built_from_the_config_names_and_validation():
    # one list of names: each config name resolves to the estimator function of that name
    assert tuple(adv_lib.ESTIMATORS) == ADVANTAGE_ESTIMATORS
    assert all(fn.__name__ == name and callable(fn) for name, fn in adv_lib.ESTIMATORS.items())
    with pytest.raises(ValueError, match=r"AdvantageConfig\.estimator.*known: grpo, grpo_batch_std"):
        AdvantageConfig(estimator="ppo")
    with pytest.raises(ValueError, match=r"AdvantageConfig\.std_ddof"):
        AdvantageConfig(std_ddof=2)
    with pytest.raises(ValueError, match=r"AdvantageConfig\.eps"):
        AdvantageConfig(eps=-1.0)
    with pytest.raises(dataclasses.FrozenInstanceError):
        AdvantageConfig().eps = 0.1  # type: ignore[misc]
    hash(AdvantageConfig())  # usable as a static jit argument
