"""Reward-collapse, entropy and length diagnostics: pure, jittable, flat dicts with stable names.

Every function returns ``{name: array}`` with "/"-separated names, float32 scalars unless stated, ready for
JSONL / TensorBoard. Undefined statistics (no valid entries, zero variance) are reported as 0, never NaN,
so a NaN-stopping train loop is not tripped by a diagnostic.

Reward collapse (GDPO, arXiv:2601.05242): summing K rewards before the group normalisation maps distinct
reward vectors to the same advantage. Measured here per group and summed over the batch:

    collapse/ratio = sum_b D_R(b) / sum_b D_A(b)

    D_R(b): number of distinct reward vectors r_{b,i} in R^K among the valid rows of group b,
    D_A(b): number of distinct advantage values A_{b,i} among the same rows,

where two rows are "the same" when every coordinate differs by at most ``tol`` (NaN equals NaN). Counting
is first-occurrence: row i is new if no earlier valid row j < i is the same. Because the estimators are
deterministic functions of the reward vector, D_A <= D_R, so the ratio is >= 1, and 1 means no collapse.
Groups with no valid row contribute 0 to both sums; a batch without valid rows gives ratio 0.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

Array = jax.Array

QUANTILES = (5, 25, 50, 75, 95)  # entropy percentiles reported as entropy/p{q}


def masked_quantile(x: Array, mask: Array, q: float | Array) -> Array:
    """Quantile(s) q in [0, 1] of x over mask, linear interpolation (``torch.quantile`` / numpy default).

    Position q (n - 1) in the sorted valid values, interpolated between its two neighbours; 0 when mask is
    empty. q may be an array, giving one quantile per entry.
    """
    flat = jnp.where(mask, x, jnp.inf).astype(jnp.float32).reshape(-1)
    sorted_x = jnp.sort(flat)
    n = jnp.sum(mask)
    pos = jnp.asarray(q, jnp.float32) * jnp.maximum(n - 1, 0).astype(jnp.float32)
    lo = jnp.floor(pos).astype(jnp.int32)
    hi = jnp.minimum(lo + 1, jnp.maximum(n - 1, 0))
    frac = pos - lo
    value = sorted_x[lo] * (1.0 - frac) + sorted_x[hi] * frac
    return jnp.where(n > 0, value, 0.0)


def _masked_mean(x: Array, mask: Array) -> Array:
    return jnp.sum(jnp.where(mask, x, 0.0)) / jnp.maximum(jnp.sum(mask), 1)


def _num_distinct(x_GxD: Array, valid_G: Array, *, tol: float) -> Array:
    """First-occurrence count of distinct rows of x [G, D] among valid rows (NaN == NaN)."""
    both_nan = jnp.isnan(x_GxD)[:, None, :] & jnp.isnan(x_GxD)[None, :, :]
    close = (jnp.abs(x_GxD[:, None, :] - x_GxD[None, :, :]) <= tol) | both_nan
    same_GxG = jnp.all(close, axis=-1) & valid_G[:, None] & valid_G[None, :]
    earlier_GxG = jnp.tril(jnp.ones_like(same_GxG), k=-1)  # [i, j] True for j < i
    seen_before = jnp.any(same_GxG & earlier_GxG, axis=-1)
    return jnp.sum(valid_G & ~seen_before, dtype=jnp.int32)


def _pearson(x: Array, y: Array, mask: Array) -> Array:
    """Pearson correlation over mask; 0 when fewer than 2 entries or either variance is 0."""
    mx, my = _masked_mean(x, mask), _masked_mean(y, mask)
    dx, dy = jnp.where(mask, x - mx, 0.0), jnp.where(mask, y - my, 0.0)
    sxx, syy, sxy = jnp.sum(dx * dx), jnp.sum(dy * dy), jnp.sum(dx * dy)
    ok = (sxx > 0) & (syy > 0)
    return jnp.where(ok, sxy / jnp.sqrt(jnp.where(ok, sxx * syy, 1.0)), 0.0)


def _group_stats(r_G: Array, mask_G: Array) -> tuple[Array, Array, Array]:
    """Mean, population variance (ddof=0) and zero-variance flag (< 2 entries or all equal) of one group."""
    n = jnp.sum(mask_G)
    mean = _masked_mean(r_G, mask_G)
    var = jnp.sum(jnp.where(mask_G, (r_G - mean) ** 2, 0.0)) / jnp.maximum(n, 1)
    spread = jnp.max(jnp.where(mask_G, r_G, -jnp.inf)) - jnp.min(jnp.where(mask_G, r_G, jnp.inf))
    return mean, var, (n < 2) | (spread == 0.0)


def reward_diagnostics(
    rewards: Array, totals: Array, advantages: Array, *, valid: Array | None = None, tol: float = 1e-6
) -> dict[str, Array]:
    """Per-dimension reward statistics, zero-variance fractions, reward/advantage correlation, collapse.

    Args: rewards [B, G, K] (NaN = missing), totals [B, G] (the weighted totals sum_k w_k r_k,
    ``advantages.weighted_total``), advantages [B, G], valid [B, G] (default all).
    Returns:
      reward/group_mean [B, K], reward/group_var [B, K]: per group and dimension, over valid non-NaN rows,
        variance with ddof=0 (0 for empty groups);
      reward/within_group_mean [K], reward/within_group_var [K]: those per-group values averaged over the
        groups where the dimension has a valid entry (the within-group picture the batch-wide mean hides);
      reward/mean [K]: over all valid non-NaN rows;
      reward/total: mean weighted total over valid rows; groups/reward_var_mean: mean over non-empty groups
        of the within-group variance (ddof=0) of the total;
      groups/zero_var_frac: fraction of non-empty groups whose total is constant, i.e. groups GRPO learns
        nothing from; reward/zero_var_frac_per_dim [K]: the same per dimension (over groups where that
        dimension has a valid entry). < 2 entries counts as constant;
      reward/adv_corr [K]: Pearson correlation of r_k with A over valid non-NaN rows of the whole batch;
      reward/adv_corr_within [K]: the same with r_k centred on its group mean, i.e. how much of A's
        within-group ordering dimension k explains (0 when k never varies within a group);
      adv/distinct_per_group [B] int32, reward/distinct_vectors_per_group [B] int32: D_A(b), D_R(b);
      collapse/distinct_rewards, collapse/distinct_advantages (int32), collapse/ratio: see module doc;
      collapse/distinct_advantages_per_group: mean D_A(b) over non-empty groups (G when nothing ties).
    """
    rewards_BxGxK = jnp.asarray(rewards, jnp.float32)
    total_BxG = jnp.asarray(totals, jnp.float32)
    adv_BxG = jnp.asarray(advantages, jnp.float32)
    valid_BxG = jnp.ones(adv_BxG.shape, bool) if valid is None else jnp.asarray(valid, bool)
    mask_BxGxK = valid_BxG[..., None] & ~jnp.isnan(rewards_BxGxK)

    per_dim = jax.vmap(jax.vmap(_group_stats, in_axes=(1, 1)))  # over B, then K
    mean_BxK, var_BxK, const_BxK = per_dim(rewards_BxGxK, mask_BxGxK)
    present_BxK = jnp.any(mask_BxGxK, axis=1)
    _, total_var_B, const_total_B = jax.vmap(_group_stats)(total_BxG, valid_BxG)
    nonempty_B = jnp.any(valid_BxG, axis=-1)

    corr_K = jax.vmap(_pearson, in_axes=(2, None, 2))(rewards_BxGxK, adv_BxG, mask_BxGxK)
    centred_BxGxK = jnp.where(mask_BxGxK, rewards_BxGxK - mean_BxK[:, None, :], 0.0)
    corr_within_K = jax.vmap(_pearson, in_axes=(2, None, 2))(centred_BxGxK, adv_BxG, mask_BxGxK)
    group_avg = jax.vmap(_masked_mean, in_axes=(1, 1))  # over B, per K
    return {
        "reward/group_mean": mean_BxK,
        "reward/group_var": var_BxK,
        "reward/mean": jax.vmap(_masked_mean, in_axes=(2, 2))(rewards_BxGxK, mask_BxGxK),
        "reward/within_group_mean": group_avg(mean_BxK, present_BxK),
        "reward/within_group_var": group_avg(var_BxK, present_BxK),
        "reward/total": _masked_mean(total_BxG, valid_BxG),
        "groups/reward_var_mean": _masked_mean(total_var_B, nonempty_B),
        "groups/zero_var_frac": _masked_mean(const_total_B.astype(jnp.float32), nonempty_B),
        "reward/zero_var_frac_per_dim": jax.vmap(_masked_mean, in_axes=(1, 1))(
            const_BxK.astype(jnp.float32), present_BxK
        ),
        "reward/adv_corr": corr_K,
        "reward/adv_corr_within": corr_within_K,
        **collapse_counts(rewards_BxGxK, adv_BxG, valid_BxG, tol=tol),
    }


def collapse_counts(rewards_BxGxK: Array, adv_BxG: Array, valid_BxG: Array, *, tol: float) -> dict[str, Array]:
    """Distinct reward vectors and distinct advantages per group and their ratio (module doc)."""
    distinct_adv_B = jax.vmap(lambda a, v: _num_distinct(a[:, None], v, tol=tol))(adv_BxG, valid_BxG)
    distinct_rew_B = jax.vmap(lambda r, v: _num_distinct(r, v, tol=tol))(rewards_BxGxK, valid_BxG)
    total_rew, total_adv = jnp.sum(distinct_rew_B), jnp.sum(distinct_adv_B)
    ratio = jnp.where(total_adv > 0, total_rew / jnp.maximum(total_adv, 1), 0.0).astype(jnp.float32)
    nonempty_B = jnp.any(valid_BxG, axis=-1)
    return {
        "adv/distinct_per_group": distinct_adv_B,
        "reward/distinct_vectors_per_group": distinct_rew_B,
        "collapse/distinct_rewards": total_rew,
        "collapse/distinct_advantages": total_adv,
        "collapse/distinct_advantages_per_group": _masked_mean(distinct_adv_B.astype(jnp.float32), nonempty_B),
        "collapse/ratio": ratio,
    }


def drowned_dimensions(corr_within_K: Array, zero_var_frac_K: Array, weights_K: Array, *,
                       max_abs_corr: float = 0.1, min_vary_frac: float = 0.1) -> Array:
    """Number of weighted reward dimensions the advantage ignores: dimension k varies within at least
    `min_vary_frac` of the groups (1 - reward/zero_var_frac_per_dim) and has weight != 0, yet its
    within-group correlation with A is under `max_abs_corr` in magnitude. That is the reward-collapse
    symptom of a dimension drowned by the others in the weighted sum (docs/algorithms.md §3.8)."""
    varies = (1.0 - zero_var_frac_K) >= min_vary_frac
    ignored = jnp.abs(corr_within_K) < max_abs_corr
    return jnp.sum(varies & ignored & (weights_K != 0), dtype=jnp.int32)


def bimodality_coefficient(x: Array, mask: Array) -> Array:
    """Sarle's bimodality coefficient of x over mask, with the bias-corrected sample moments:

        G1 = g1 sqrt(n(n-1)) / (n-2),          g1 = m3 / m2^{3/2}
        G2 = (n-1) / ((n-2)(n-3)) ((n+1) g2 + 6),   g2 = m4 / m2^2 - 3
        BC = (G1^2 + 1) / (G2 + 3 (n-1)^2 / ((n-2)(n-3)))

    BC > 5/9 (the value of a uniform distribution) suggests bimodality. 0 when n < 4 or m2 = 0.
    """
    n = jnp.sum(mask).astype(jnp.float32)
    d = jnp.where(mask, x - _masked_mean(x, mask), 0.0)
    m2, m3, m4 = (jnp.sum(d**p) / jnp.maximum(n, 1.0) for p in (2, 3, 4))
    ok = (n >= 4) & (m2 > 0)
    n_, m2_ = jnp.where(ok, n, 4.0), jnp.where(ok, m2, 1.0)
    g1, g2 = m3 / m2_**1.5, m4 / m2_**2 - 3.0
    skew = g1 * jnp.sqrt(n_ * (n_ - 1)) / (n_ - 2)
    kurt = (n_ - 1) / ((n_ - 2) * (n_ - 3)) * ((n_ + 1) * g2 + 6)
    bc = (skew**2 + 1) / (kurt + 3 * (n_ - 1) ** 2 / ((n_ - 2) * (n_ - 3)))
    return jnp.where(ok, bc, 0.0)


def entropy_diagnostics(
    entropies: Array, mask: Array, *, num_bins: int = 20, hist_max: float = 4.0, near_zero: float = 1e-2,
    prefix: str = "entropy",
) -> dict[str, Array]:
    """Token-entropy statistics over mask (entropies [N, T] in nats, mask [N, T]), named `<prefix>/...`.

    Returns entropy/mean, entropy/p5 .. entropy/p95 (linear-interpolated percentiles), entropy/hist
    [num_bins] (fraction of tokens per bin of width hist_max / num_bins on [0, hist_max); the last bin
    also holds everything >= hist_max), entropy/hist_edges [num_bins + 1], entropy/bimodality (Sarle's
    coefficient), entropy/near_zero_frac (fraction with H < near_zero; 0.01 as in "Beyond the 80/20
    rule"), entropy/num_tokens (int32).
    """
    ent = jax.lax.stop_gradient(jnp.asarray(entropies, jnp.float32))
    m = jnp.asarray(mask, bool)
    n = jnp.sum(m)
    pct = masked_quantile(ent, m, jnp.asarray(QUANTILES, jnp.float32) / 100.0)
    width = hist_max / num_bins
    bin_idx = jnp.clip(jnp.floor(ent / width).astype(jnp.int32), 0, num_bins - 1)
    counts = jnp.zeros(num_bins, jnp.float32).at[bin_idx.reshape(-1)].add(m.reshape(-1).astype(jnp.float32))
    out = {"mean": _masked_mean(ent, m)}
    out.update({f"p{q}": pct[i] for i, q in enumerate(QUANTILES)})
    out.update({
        "hist": counts / jnp.maximum(n, 1),
        "hist_edges": jnp.linspace(0.0, hist_max, num_bins + 1, dtype=jnp.float32),
        "bimodality": bimodality_coefficient(ent, m),
        "near_zero_frac": _masked_mean((ent < near_zero).astype(jnp.float32), m),
        "num_tokens": n.astype(jnp.int32),
    })
    return {f"{prefix}/{k}": v for k, v in out.items()}


def entropy_by_kind(entropies: Array, mask: Array, kinds: Array, kind_names: tuple[str, ...], *,
                    prefix: str = "entropy_t1") -> dict[str, Array]:
    """`entropy_diagnostics` over all masked tokens (`<prefix>/...`) and over each kind of token
    (`<prefix>/<kind name>/...`; kinds [N, T] int codes indexing kind_names), e.g. the policy's own T = 1
    entropy of reasoning, answer and other tokens: a collapse of the reasoning is then not averaged away
    by already-certain tags."""
    m = jnp.asarray(mask, bool)
    out = entropy_diagnostics(entropies, m, prefix=prefix)
    for code, name in enumerate(kind_names):
        out.update(entropy_diagnostics(entropies, m & (kinds == code), prefix=f"{prefix}/{name}"))
    return out


def length_diagnostics(lengths: Array, truncated: Array, *, max_len: int | None = None,
                       valid: Array | None = None) -> dict[str, Array]:
    """Completion-length statistics (lengths [N] in tokens, truncated [N] bool: hit the length limit).

    Returns length/mean, length/min, length/max, length/p10, length/p50, length/p90 (linear-interpolated
    percentiles), length/truncated_frac, length/terminated_mean (mean over completions that ended with EOS)
    and, with max_len (the sampler's max_new_tokens), length/mean_frac = length/mean / max_len, so one alarm
    threshold fits every budget. All over valid rows; 0 where no row qualifies.
    """
    lengths_f = jnp.asarray(lengths, jnp.float32)
    trunc = jnp.asarray(truncated, bool)
    v = jnp.ones(lengths_f.shape, bool) if valid is None else jnp.asarray(valid, bool)
    any_valid = jnp.any(v)
    pct = masked_quantile(lengths_f, v, jnp.asarray([0.1, 0.5, 0.9], jnp.float32))
    out = {
        "length/mean": _masked_mean(lengths_f, v),
        "length/min": jnp.where(any_valid, jnp.min(jnp.where(v, lengths_f, jnp.inf)), 0.0),
        "length/max": jnp.where(any_valid, jnp.max(jnp.where(v, lengths_f, -jnp.inf)), 0.0),
        "length/p10": pct[0],
        "length/p50": pct[1],
        "length/p90": pct[2],
        "length/truncated_frac": _masked_mean(trunc.astype(jnp.float32), v),
        "length/terminated_mean": _masked_mean(lengths_f, v & ~trunc),
    }
    if max_len:
        out["length/mean_frac"] = out["length/mean"] / max_len
    return out


def _k3(x: Array) -> Array:
    """k3 = e^x - 1 - x without the cancellation that rounds it to 0 in float32 for |x| < ~3e-4 (the gap
    between two float32 passes is ~1e-7): its Taylor series x^2/2 + x^3/6 + x^4/24 below |x| = 1e-2
    (truncation error < x^5/120, relative 2e-12), expm1(x) - x above."""
    series = x * x * (0.5 + x * (1.0 / 6.0 + x / 24.0))
    return jnp.where(jnp.abs(x) < 1e-2, series, jnp.expm1(x) - x)


def sampler_trainer_gap(trainer_logp: Array, sampler_logp: Array, mask: Array, *, bound: float) -> dict[str, Array]:
    """How far the rollout's logprobs are from the trainer's teacher-forced ones for the same tokens, with
    rho = pi_trainer / pi_sampler per valid token (logprobs [N, T], mask [N, T]):

        gap/abs_logp        token mean of |log pi_trainer - log pi_sampler|
        gap/kl              token mean of k3 = rho - 1 - log rho, an estimate of KL(sampler || trainer)
                            from the sampler's tokens (Schulman 2020; verl rollout_corr ``kl`` uses k1 and k3)
        gap/ratio_max, gap/ratio_min, gap/ratio_p99   of rho
        gap/token_out_frac  fraction of tokens with rho outside [1/bound, bound]
        gap/seq_out_frac    fraction of sequences whose weight prod_t rho (exp of the summed log-ratios, the
                            sequence's importance weight) is outside [1/bound, bound]
    """
    mask = jnp.asarray(mask, bool)
    log_rho = jnp.where(mask, trainer_logp.astype(jnp.float32) - sampler_logp.astype(jnp.float32), 0.0)
    log_rho = jnp.clip(log_rho, -20.0, 20.0)  # as the losses' log_ratio_clamp: exp stays finite
    rho = jnp.exp(log_rho)
    log_bound = jnp.log(jnp.float32(bound))
    rows = jnp.any(mask, -1)
    seq_log = jnp.sum(log_rho, -1)
    return {
        "gap/abs_logp": _masked_mean(jnp.abs(log_rho), mask),
        "gap/kl": _masked_mean(_k3(log_rho), mask),
        "gap/ratio_max": jnp.where(jnp.any(mask), jnp.max(jnp.where(mask, rho, -jnp.inf)), 1.0),
        "gap/ratio_min": jnp.where(jnp.any(mask), jnp.min(jnp.where(mask, rho, jnp.inf)), 1.0),
        "gap/ratio_p99": masked_quantile(rho, mask, 0.99),
        "gap/token_out_frac": _masked_mean((jnp.abs(log_rho) > log_bound).astype(jnp.float32), mask),
        "gap/seq_out_frac": _masked_mean((jnp.abs(seq_log) > log_bound).astype(jnp.float32), rows),
    }
