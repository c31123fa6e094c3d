"""Group-relative advantage estimators: rewards R[B, G, K] and weights w[K] -> advantages A[B, G].

B prompts, G rollouts per prompt, K reward dimensions (never pre-summed by the reward registry).
Each estimator is a pure, jittable function written for one group and ``jax.vmap``-ed over B;
``compute_advantages`` picks one by ``AdvantageConfig.estimator`` from ``ESTIMATORS``.

Conventions (shared by every estimator; the tests pin each one):

* Float32 throughout; the result carries no gradient (``stop_gradient``).
* ``valid[B, G]`` (default: all True). Invalid rows get advantage 0 and are left out of every group and
  batch statistic (mean, std, counts).
* Missing reward dimensions are NaN. They are ignored as in TRL's ``nansum``: a NaN entry adds nothing to
  the weighted sum sum_k w_k r_k (a row whose dimensions are all NaN has total 0), and in the per-dimension
  estimators (gdpo, per_dim) it is left out of that dimension's group statistics and contributes 0.
* std uses ``std_ddof`` (default 1, Bessel-corrected, as ``torch.std`` in TRL / verl / tunix GRPO).
  Group z-scores divide by (std + eps); batch z-scores by (std_batch + batch_norm_eps).
* Zero-variance groups get advantage exactly 0, also after a batch normalisation (where the float residue
  of (0 - mean_batch) / std_batch is dropped). For the weighted total (grpo, grpo_batch_std, drgrpo, rloo,
  reinforce_pp_baseline) that means all valid totals exactly equal; near-ties are damped by eps as in
  the peers. For the fused per-dimension scores (gdpo, per_dim) it means a spread <= 1e-5 * sum_k |w_k|,
  the float32 residue of dimensions that cancel exactly (see ``_per_dim_fused``).
* Singleton groups (exactly one valid row) have no group baseline and get 0 (TRL's choice; verl instead
  uses mean 0 / std 1 there, passing the raw reward through). Fully invalid groups get 0 everywhere.
* Batch statistics are over valid rows, one count per sequence (verl's ``masked_whiten`` weights by
  tokens; the two agree when every sequence counts once).
"""

from __future__ import annotations

import functools
from typing import Callable

import jax
import jax.numpy as jnp

from grpo_jax.config import ADVANTAGE_ESTIMATORS, AdvantageConfig

Array = jax.Array
Aux = dict[str, Array]
Estimator = Callable[..., tuple[Array, Aux]]

_FUSED_ZERO_TOL = 1e-5  # relative spread below which fused per-dimension scores count as constant


def _moments(x_G: Array, mask_G: Array, *, ddof: int) -> tuple[Array, Array, Array]:
    """Masked mean and std of one group, and whether the group is degenerate.

    Degenerate = fewer than two valid entries, or all valid entries exactly equal (zero range). The exact
    range test is what makes zero-variance groups give exactly 0: a float mean of equal values can differ
    from them by one ulp, and (x - mean) / (std + eps) would then be noise instead of 0.
    """
    n = jnp.sum(mask_G)
    x0 = jnp.where(mask_G, x_G, 0.0)
    mean = jnp.sum(x0) / jnp.maximum(n, 1)
    var = jnp.sum(jnp.where(mask_G, (x0 - mean) ** 2, 0.0)) / jnp.maximum(n - ddof, 1)
    spread = jnp.max(jnp.where(mask_G, x0, -jnp.inf)) - jnp.min(jnp.where(mask_G, x0, jnp.inf))
    degenerate = (n < 2) | (spread == 0.0)
    return mean, jnp.sqrt(var), degenerate


def _center(x_G: Array, mask_G: Array) -> tuple[Array, Array]:
    """x_i - mean_j x_j over the valid entries; 0 for invalid entries and degenerate groups."""
    mean, _, degenerate = _moments(x_G, mask_G, ddof=0)
    return jnp.where(mask_G & ~degenerate, x_G - mean, 0.0), degenerate


def _zscore(x_G: Array, mask_G: Array, *, ddof: int, eps: float) -> tuple[Array, Array]:
    """(x_i - mean) / (std + eps) over the valid entries; 0 for invalid entries and degenerate groups."""
    mean, std, degenerate = _moments(x_G, mask_G, ddof=ddof)
    return jnp.where(mask_G & ~degenerate, (x_G - mean) / (std + eps), 0.0), degenerate


def _prepare(rewards: Array, weights: Array, valid: Array | None) -> tuple[Array, Array, Array, Array]:
    """(R [B, G, K] float32 without gradient, w [K], valid [B, G], the weighted totals [B, G]): the one place
    an estimator call applies the weights to the rewards (`weighted_total`)."""
    rewards_BxGxK = jnp.asarray(rewards, jnp.float32)
    if rewards_BxGxK.ndim != 3:
        raise ValueError(f"rewards must be [B, G, K], got shape {rewards_BxGxK.shape}")
    weights_K = jnp.asarray(weights, jnp.float32)
    if weights_K.shape != rewards_BxGxK.shape[-1:]:
        raise ValueError(f"weights must be [K]={rewards_BxGxK.shape[-1:]}, got shape {weights_K.shape}")
    valid_BxG = jnp.ones(rewards_BxGxK.shape[:2], bool) if valid is None else jnp.asarray(valid, bool)
    if valid_BxG.shape != rewards_BxGxK.shape[:2]:
        raise ValueError(f"valid must be [B, G]={rewards_BxGxK.shape[:2]}, got shape {valid_BxG.shape}")
    rewards_BxGxK = jax.lax.stop_gradient(rewards_BxGxK)
    return rewards_BxGxK, weights_K, valid_BxG, weighted_total(rewards_BxGxK, weights_K)


def weighted_total(rewards_BxGxK: Array, weights_K: Array) -> Array:
    """r_total = sum_k w_k r_k [B, G] float32, NaN entries skipped (TRL ``nansum``). The one definition of
    the weighted total, computed once per estimator call (``_prepare``) and returned in its aux, where the
    diagnostics read it."""
    rewards_BxGxK = jnp.asarray(rewards_BxGxK, jnp.float32)
    return jnp.sum(jnp.where(jnp.isnan(rewards_BxGxK), 0.0, rewards_BxGxK * jnp.asarray(weights_K, jnp.float32)), axis=-1)


def _per_dim_fused(
    rewards_BxGxK: Array, weights_K: Array, valid_BxG: Array, cfg: AdvantageConfig
) -> tuple[Array, Array]:
    """A_sum = sum_k w_k (r_k - mean_G r_k) / (std_G r_k + eps): per-dimension group z-scores, fused.

    Returns (A_sum [B, G], zero_variance [B]). Per-dimension z-scores sum to 0 within a group, so a group
    whose fused scores are all equal has A_sum = 0 in exact arithmetic; in float32 exactly cancelling
    dimensions leave a residue of a few ulp. A spread below ``_FUSED_ZERO_TOL * sum_k |w_k|`` is therefore
    treated as a zero-variance group and set to exactly 0, so a later batch z-score cannot amplify it.
    """
    mask_BxGxK = valid_BxG[..., None] & ~jnp.isnan(rewards_BxGxK)
    zscore_G = functools.partial(_zscore, ddof=cfg.std_ddof, eps=cfg.eps)
    per_group = jax.vmap(zscore_G, in_axes=(1, 1), out_axes=(1, 0))  # over K inside one group
    z_BxGxK, _ = jax.vmap(per_group)(rewards_BxGxK, mask_BxGxK)  # over B
    fused_BxG = jnp.sum(z_BxGxK * weights_K, axis=-1)
    tol = _FUSED_ZERO_TOL * jnp.sum(jnp.abs(weights_K))
    hi_B = jnp.max(jnp.where(valid_BxG, fused_BxG, -jnp.inf), axis=-1)
    lo_B = jnp.min(jnp.where(valid_BxG, fused_BxG, jnp.inf), axis=-1)
    zero_var_B = (jnp.sum(valid_BxG, axis=-1) < 2) | (hi_B - lo_B <= tol)
    return jnp.where(zero_var_B[:, None], 0.0, fused_BxG), zero_var_B


def _batch_zscore(x_BxG: Array, valid_BxG: Array, keep_BxG: Array, *, ddof: int, eps: float) -> Array:
    """(x - mean_batch) / (std_batch + eps) over all valid rows of the batch; 0 where ``keep`` is False."""
    z, _ = _zscore(x_BxG.reshape(-1), valid_BxG.reshape(-1), ddof=ddof, eps=eps)
    return jnp.where(keep_BxG, z.reshape(x_BxG.shape), 0.0)


def _aux(scores_BxG: Array, zero_var_B: Array, valid_BxG: Array, total_BxG: Array) -> Aux:
    """scores: the values the group statistic saw; zero_variance: the group gives no signal; totals: the
    weighted totals sum_k w_k r_k (what the reward diagnostics read)."""
    return {
        "scores": scores_BxG,
        "totals": total_BxG,
        "zero_variance": zero_var_B,
        "num_valid": jnp.sum(valid_BxG, axis=-1, dtype=jnp.int32),
    }


def _finish(adv_BxG: Array, aux: Aux) -> tuple[Array, Aux]:
    return jax.lax.stop_gradient(adv_BxG.astype(jnp.float32)), aux


def grpo(
    rewards: Array, weights: Array, *, valid: Array | None = None, cfg: AdvantageConfig
) -> tuple[Array, Aux]:
    """GRPO (DeepSeekMath eq. 3; TRL ``sum_then_normalize``; verl ``grpo``).

        r_i = sum_k w_k r_{i,k}
        A_i = (r_i - mean(r_1..r_G)) / (std(r_1..r_G) + eps)
    """
    _, _, valid_BxG, total_BxG = _prepare(rewards, weights, valid)
    zscore_G = functools.partial(_zscore, ddof=cfg.std_ddof, eps=cfg.eps)
    adv_BxG, zero_var_B = jax.vmap(zscore_G)(total_BxG, valid_BxG)
    return _finish(adv_BxG, _aux(total_BxG, zero_var_B, valid_BxG, total_BxG))


def grpo_batch_std(
    rewards: Array, weights: Array, *, valid: Array | None = None, cfg: AdvantageConfig
) -> tuple[Array, Aux]:
    """Group mean, batch std (TRL ``scale_rewards="batch"``).

        A_i = (r_i - mean_group r) / (std_batch r + batch_norm_eps),  std over the raw r of all valid rows.
    """
    _, _, valid_BxG, total_BxG = _prepare(rewards, weights, valid)
    centered_BxG, zero_var_B = jax.vmap(_center)(total_BxG, valid_BxG)
    _, std_batch, batch_degenerate = _moments(total_BxG.reshape(-1), valid_BxG.reshape(-1), ddof=cfg.std_ddof)
    adv_BxG = jnp.where(batch_degenerate, 0.0, centered_BxG / (std_batch + cfg.batch_norm_eps))
    return _finish(adv_BxG, _aux(total_BxG, zero_var_B, valid_BxG, total_BxG))


def drgrpo(
    rewards: Array, weights: Array, *, valid: Array | None = None, cfg: AdvantageConfig
) -> tuple[Array, Aux]:
    """Dr. GRPO (Liu et al. 2025): no std, A_i = r_i - mean(r_1..r_G)."""
    del cfg  # no normalisation to configure
    _, _, valid_BxG, total_BxG = _prepare(rewards, weights, valid)
    adv_BxG, zero_var_B = jax.vmap(_center)(total_BxG, valid_BxG)
    return _finish(adv_BxG, _aux(total_BxG, zero_var_B, valid_BxG, total_BxG))


def rloo(
    rewards: Array, weights: Array, *, valid: Array | None = None, cfg: AdvantageConfig
) -> tuple[Array, Aux]:
    """RLOO (Ahmadian et al. 2024): leave-one-out baseline over the n valid rows of the group.

        A_i = r_i - 1/(n-1) sum_{j != i} r_j = n/(n-1) (r_i - mean r)      (0 when n < 2)
    """
    del cfg
    _, _, valid_BxG, total_BxG = _prepare(rewards, weights, valid)
    centered_BxG, zero_var_B = jax.vmap(_center)(total_BxG, valid_BxG)
    n_Bx1 = jnp.sum(valid_BxG, axis=-1, keepdims=True).astype(jnp.float32)
    adv_BxG = centered_BxG * n_Bx1 / jnp.maximum(n_Bx1 - 1.0, 1.0)
    return _finish(adv_BxG, _aux(total_BxG, zero_var_B, valid_BxG, total_BxG))


def reinforce_pp_baseline(
    rewards: Array, weights: Array, *, valid: Array | None = None, cfg: AdvantageConfig
) -> tuple[Array, Aux]:
    """REINFORCE++-baseline (Hu 2025; verl ``reinforce_plus_plus_baseline``).

        A~_i = r_i - mean_group r;     A_i = (A~_i - mean_batch A~) / (std_batch A~ + batch_norm_eps)
    """
    _, _, valid_BxG, total_BxG = _prepare(rewards, weights, valid)
    centered_BxG, zero_var_B = jax.vmap(_center)(total_BxG, valid_BxG)
    keep_BxG = valid_BxG & ~zero_var_B[:, None]
    adv_BxG = _batch_zscore(centered_BxG, valid_BxG, keep_BxG, ddof=cfg.std_ddof, eps=cfg.batch_norm_eps)
    return _finish(adv_BxG, _aux(total_BxG, zero_var_B, valid_BxG, total_BxG))


def gdpo(
    rewards: Array, weights: Array, *, valid: Array | None = None, cfg: AdvantageConfig
) -> tuple[Array, Aux]:
    """GDPO (Liu et al., arXiv:2601.05242, eqs. 4-7; TRL ``normalize_then_sum``).

        A_k^{(i,j)} = (r_k^{(i,j)} - mean_j r_k^{(i,.)}) / (std_j r_k^{(i,.)} + eps)     per reward, per group
        A_sum^{(i,j)} = sum_k w_k A_k^{(i,j)}
        A^{(i,j)} = (A_sum^{(i,j)} - mean_batch A_sum) / (std_batch A_sum + batch_norm_eps)
    """
    rewards_BxGxK, weights_K, valid_BxG, total_BxG = _prepare(rewards, weights, valid)
    fused_BxG, zero_var_B = _per_dim_fused(rewards_BxGxK, weights_K, valid_BxG, cfg)
    keep_BxG = valid_BxG & ~zero_var_B[:, None]
    adv_BxG = _batch_zscore(fused_BxG, valid_BxG, keep_BxG, ddof=cfg.std_ddof, eps=cfg.batch_norm_eps)
    return _finish(adv_BxG, _aux(fused_BxG, zero_var_B, valid_BxG, total_BxG))


def per_dim(
    rewards: Array, weights: Array, *, valid: Array | None = None, cfg: AdvantageConfig
) -> tuple[Array, Aux]:
    """Estimate separately, then fuse: GDPO without the batch step.

        A^{(i,j)} = sum_k w_k (r_k^{(i,j)} - mean_j r_k^{(i,.)}) / (std_j r_k^{(i,.)} + eps)
    """
    rewards_BxGxK, weights_K, valid_BxG, total_BxG = _prepare(rewards, weights, valid)
    fused_BxG, zero_var_B = _per_dim_fused(rewards_BxGxK, weights_K, valid_BxG, cfg)
    return _finish(fused_BxG, _aux(fused_BxG, zero_var_B, valid_BxG, total_BxG))


def _comb(n: Array, k: Array) -> Array:
    """Binomial coefficient C(n, k) for float n, k >= 0 (0 when k > n), through log-gamma: exact enough
    for group sizes up to a few hundred."""
    ok = (k >= 0) & (k <= n)
    log_c = jax.lax.lgamma(n + 1.0) - jax.lax.lgamma(k + 1.0) - jax.lax.lgamma(jnp.maximum(n - k, 0.0) + 1.0)
    return jnp.where(ok, jnp.round(jnp.exp(log_c)), 0.0)


def _passk_group(success_G: Array, mask_G: Array, *, k: int) -> tuple[Array, Array]:
    """Pass@k advantages of one group of binary outcomes (Chen et al. 2025, "Pass@k Training for Adaptively
    Balancing Exploration and Exploitation", analytical form; verl ``_calc_passk_adv``). With n valid rows,
    c successes:

        rho   = 1 - C(n-c, k) / C(n, k)               the group's unbiased pass@k
        sigma = sqrt(rho (1 - rho))
        A_+   = (1 - rho) / sigma                      every success
        A_-   = (1 - rho - C(n-c-1, k-1) / C(n-1, k-1)) / sigma     every failure

    Degenerate (all 0): sigma = 0 (no success, or every k-subset holds one), k > n, or n < 2."""
    n = jnp.sum(mask_G).astype(jnp.float32)
    c = jnp.sum(mask_G & success_G).astype(jnp.float32)
    kf = jnp.float32(k)
    rho = 1.0 - _comb(n - c, kf) / jnp.maximum(_comb(n, kf), 1.0)
    sigma = jnp.sqrt(jnp.maximum(rho * (1.0 - rho), 0.0))
    degenerate = (n < 2) | (kf > n) | (sigma <= 0.0)
    safe = jnp.where(degenerate, 1.0, sigma)
    miss = _comb(n - c - 1.0, kf - 1.0) / jnp.maximum(_comb(n - 1.0, kf - 1.0), 1.0)
    adv_G = jnp.where(success_G, (1.0 - rho) / safe, (1.0 - rho - miss) / safe)
    return jnp.where(mask_G & ~degenerate, adv_G, 0.0), degenerate


def passk(
    rewards: Array, weights: Array, *, valid: Array | None = None, cfg: AdvantageConfig
) -> tuple[Array, Aux]:
    """Pass@k advantage (see ``_passk_group``): a row succeeds when its weighted total reaches
    ``cfg.pass_threshold``; k = ``cfg.pass_k``. k = 1 gives (r - p) / sqrt(p (1 - p)): GRPO on the 0/1
    outcomes with the population std and no eps. Larger k rewards a group for having *some* success, so a
    failure in a group that already passes@k is penalised less, which keeps exploring."""
    _, _, valid_BxG, total_BxG = _prepare(rewards, weights, valid)
    success_BxG = total_BxG >= cfg.pass_threshold
    adv_BxG, zero_var_B = jax.vmap(functools.partial(_passk_group, k=cfg.pass_k))(success_BxG, valid_BxG)
    return _finish(adv_BxG, _aux(total_BxG, zero_var_B, valid_BxG, total_BxG))


# The registry. `config.ADVANTAGE_ESTIMATORS` is the one list of names (config validates against it and
# says what each is); each name is the function of that name above.
ESTIMATORS: dict[str, Estimator] = {name: globals()[name] for name in ADVANTAGE_ESTIMATORS}
# Estimators that normalise each reward dimension within the group before fusing: a group whose weighted
# totals tie can still carry their signal (dynamic sampling asks the estimator, not the totals).
PER_DIMENSION = frozenset({"gdpo", "per_dim"})


def compute_advantages(
    rewards: Array, weights: Array, *, valid: Array | None = None, cfg: AdvantageConfig
) -> tuple[Array, Aux]:
    """Advantages [B, G] of the estimator named by ``cfg.estimator``, and its aux dict.

    aux: ``scores`` [B, G] (the per-row values the group statistic saw: the weighted total, or the fused
    per-dimension z-scores for gdpo / per_dim), ``totals`` [B, G] (the weighted totals), ``zero_variance`` [B] bool (the group carries no signal:
    < 2 valid rows or all scores equal), ``num_valid`` [B] int32. ``cfg`` is hashable: jit with
    ``static_argnames="cfg"``. ``cfg.pos_scale`` < 1 then scales the positive advantages (W-REINFORCE).
    """
    adv, aux = ESTIMATORS[cfg.estimator](rewards, weights, valid=valid, cfg=cfg)
    if cfg.pos_scale != 1.0:  # a Python branch: the default traces exactly the estimator
        adv = jnp.where(adv > 0, cfg.pos_scale * adv, adv)
    return adv, aux
