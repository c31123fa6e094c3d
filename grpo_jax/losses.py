"""Per-token policy losses, KL to the reference, entropy bonus and loss aggregation.

Inputs: logp, old_logp [N, T] (log pi_theta, log pi_old of the sampled tokens), advantages [N] or [N, T],
mask [N, T] (completion tokens that count), optionally ref_logp [N, T] and entropies [N, T] (entropies
come from the trainer's forward and carry gradient). All maths in float32; sign convention: the returned
quantities are a loss to MINIMISE, i.e. -surrogate.

    rho_{i,t} = exp(clamp(logp - old_logp, -c_log, c_log))                          (c_log = log_ratio_clamp)
    l_{i,t}   = policy_loss_{i,t} + beta * KL_{i,t} - entropy_coef * H_{i,t}
    loss      = numerator / denominator                                             (see ``aggregate``)

Gradient accumulation and data parallelism: ``loss_terms`` returns (numerator, denominator). The
denominator does not depend on the parameters, so over microbatches / shards m

    sum_m num_m / sum_m den_m == full-batch loss,   grad = sum_m grad(num_m) / sum_m den_m

exactly, for every aggregation mode. Exception: statistics over the tokens of one call (Clip-Cov / KL-Cov
covariances and token counts, the top-entropy quantile) are computed over the tokens passed in, as verl
does per micro-batch; pass the whole batch in one call where that matters.

Metrics: a flat dict of float32 scalars whose names tell how to merge them across microbatches/shards:
``*_sum`` and ``num_*`` add, ``*_min`` take the min, ``*_max`` the max (``merge_metrics``);
``finalize_metrics`` turns each ``x_sum`` into the token mean ``x`` (divided by num_tokens).
"""

from __future__ import annotations

from typing import Callable

import jax
import jax.numpy as jnp

from grpo_jax.config import LossConfig
from grpo_jax.diagnostics import masked_quantile

Array = jax.Array
Metrics = dict[str, Array]
PolicyLoss = Callable[..., tuple[Array, Metrics]]


# ----------------------------------------------------------------------------------------- building blocks


def kl_estimate(
    logp: Array, ref_logp: Array, *, estimator: str, log_ratio_clamp: float = 20.0, kl_clamp: float = 10.0
) -> Array:
    """Per-token estimate of KL(pi_theta || pi_ref) from x ~ pi_theta (Schulman 2020), r = pi_ref / pi_theta.

        k1 = -log r = logp - ref_logp
        k2 = 1/2 (log r)^2
        k3 = (r - 1) - log r,   log r clamped to +-log_ratio_clamp, k3 clamped to +-kl_clamp (verl low_var_kl)
    """
    log_r = ref_logp - logp
    if estimator == "k1":
        return -log_r
    if estimator == "k2":
        return 0.5 * log_r**2
    if estimator == "k3":
        log_r = jnp.clip(log_r, -log_ratio_clamp, log_ratio_clamp)
        return jnp.clip(jnp.exp(log_r) - log_r - 1.0, -kl_clamp, kl_clamp)
    raise ValueError(f"kl estimator: unknown {estimator!r}; known: k1, k2, k3")


def aggregate(
    per_token: Array, mask: Array, *, mode: str, max_len_norm: int | None = None
) -> tuple[Array, Array]:
    """(numerator, denominator) of the loss for one aggregation mode; loss = numerator / denominator.

    With M the mask, |o_i| = sum_t M_{i,t} and S = number of rows with |o_i| > 0 (all-masked rows are
    padding and are not counted):

        token-mean               num = sum_{i,t} l M               den = sum_{i,t} M       (DAPO)
        seq-mean-token-mean      num = sum_i (sum_t l M) / |o_i|   den = S                 (GRPO)
        seq-mean-token-sum       num = sum_{i,t} l M               den = S
        seq-mean-token-sum-norm  num = sum_{i,t} l M / L           den = S                 (Dr. GRPO, TRL
                                 dr_grpo; L = max_len_norm; verl divides by L only, i.e. omits the 1/S)
    """
    m = mask.astype(jnp.float32)
    tok_sum_N = jnp.sum(jnp.where(mask, per_token, 0.0), axis=-1)
    len_N = jnp.sum(m, axis=-1)
    num_seqs = jnp.sum((len_N > 0).astype(jnp.float32))
    if mode == "token-mean":
        return jnp.sum(tok_sum_N), jnp.sum(len_N)
    if mode == "seq-mean-token-mean":
        return jnp.sum(tok_sum_N / jnp.maximum(len_N, 1.0)), num_seqs
    if mode == "seq-mean-token-sum":
        return jnp.sum(tok_sum_N), num_seqs
    if mode == "seq-mean-token-sum-norm":
        if max_len_norm is None:
            raise ValueError("seq-mean-token-sum-norm needs max_len_norm")
        return jnp.sum(tok_sum_N) / float(max_len_norm), num_seqs
    raise ValueError(f"aggregation mode: unknown {mode!r}")


def high_entropy_mask(entropies: Array, mask: Array, *, quantile: float) -> Array:
    """Forking-token mask (Wang et al. 2025; TRL ``get_high_entropy_mask``): H_{i,t} >= tau & M_{i,t},
    tau = ``quantile``-quantile of the valid entropies. quantile = 1 - rho keeps the top rho fraction."""
    ent = jax.lax.stop_gradient(entropies)
    tau = masked_quantile(ent, mask, quantile)
    return mask & (ent >= tau)


def _descending_rank(score: Array, eligible: Array) -> Array:
    """Rank (0 = largest) of each eligible entry of score; ineligible entries rank after all eligible."""
    flat = jnp.where(eligible, score, -jnp.inf).reshape(-1)
    order = jnp.argsort(flat, descending=True, stable=True)
    rank = jnp.zeros(flat.shape, jnp.int32).at[order].set(jnp.arange(flat.size, dtype=jnp.int32))
    return rank.reshape(score.shape)


def token_covariance(logp: Array, advantages: Array, mask: Array) -> Array:
    """Cov_{i,t} = (sg logp_{i,t} - mean_M sg logp) (A_{i,t} - mean_M A)  (Cui et al. 2025), [N, T]."""
    logp = jax.lax.stop_gradient(logp)
    n = jnp.maximum(jnp.sum(mask), 1)
    mean_logp = jnp.sum(jnp.where(mask, logp, 0.0)) / n
    mean_adv = jnp.sum(jnp.where(mask, advantages, 0.0)) / n
    return (logp - mean_logp) * (advantages - mean_adv)


def _clipped_surrogate(ratio: Array, adv: Array, cfg: LossConfig) -> tuple[Array, Metrics, Array]:
    """PPO clipped loss with clip-higher and optional dual-clip, as verl ``compute_policy_loss_vanilla``:

        l = max(-A rho, -A clip(rho, 1 - eps_low, 1 + eps_high));   if A < 0 and c set: l = min(l, -c A)

    For A > 0 the gradient vanishes once rho > 1 + eps_high; for A < 0 once rho < 1 - eps_low (and, with
    dual-clip, once rho > c). Returns (loss [N, T], clip indicator maps, any-clip map).
    """
    low, high = 1.0 - cfg.eps_low, 1.0 + cfg.eps_high
    loss = jnp.maximum(-adv * ratio, -adv * jnp.clip(ratio, low, high))
    clip_low = (adv < 0) & (ratio < low)
    clip_high = (adv > 0) & (ratio > high)
    clip_dual = jnp.zeros_like(clip_low)
    if cfg.dual_clip_c is not None:
        loss = jnp.where(adv < 0, jnp.minimum(loss, -adv * cfg.dual_clip_c), loss)
        clip_dual = (adv < 0) & (ratio > cfg.dual_clip_c)
    maps = {"clip_frac_low": clip_low, "clip_frac_high": clip_high, "clip_frac_dual": clip_dual}
    return loss, maps, clip_low | clip_high | clip_dual


# ---------------------------------------------------------------------------------------- policy losses
# Each: (cfg, *, logp, old_logp, adv, mask, key) -> (per-token loss [N, T], {name: per-token map}).


def ppo_loss(
    cfg: LossConfig, *, logp: Array, old_logp: Array, adv: Array, mask: Array, key: Array
) -> tuple[Array, Metrics]:
    """Vanilla PPO-clip / GRPO token loss with rho_{i,t} = pi_theta / pi_old per token."""
    del key
    ratio = jnp.exp(jnp.clip(logp - old_logp, -cfg.log_ratio_clamp, cfg.log_ratio_clamp))
    loss, maps, _ = _clipped_surrogate(ratio, adv, cfg)
    return loss, {**maps, "ratio": ratio}


def _seq_log_ratio(logp: Array, old_logp: Array, mask: Array) -> Array:
    """log s_i = 1/|o_i| sum_t (logp - old_logp) M, [N, 1]."""
    diff = jnp.where(mask, logp - old_logp, 0.0)
    return jnp.sum(diff, -1, keepdims=True) / jnp.maximum(jnp.sum(mask, -1, keepdims=True), 1)


def gspo_loss(
    cfg: LossConfig, *, logp: Array, old_logp: Array, adv: Array, mask: Array, key: Array
) -> tuple[Array, Metrics]:
    """GSPO (Zheng et al. 2025): sequence-level ratio s_i = (pi_theta(o_i) / pi_old(o_i))^{1/|o_i|},

        l_{i,t} = max(-A s_i, -A clip(s_i, 1 - eps_low, 1 + eps_high))     for every token t of o_i
    """
    del key
    log_s = jnp.clip(_seq_log_ratio(logp, old_logp, mask), -cfg.log_ratio_clamp, cfg.log_ratio_clamp)
    ratio = jnp.broadcast_to(jnp.exp(log_s), logp.shape)
    loss, maps, _ = _clipped_surrogate(ratio, adv, cfg)
    return loss, {**maps, "ratio": ratio}


def gspo_token_loss(
    cfg: LossConfig, *, logp: Array, old_logp: Array, adv: Array, mask: Array, key: Array
) -> tuple[Array, Metrics]:
    """GSPO-token: s_{i,t} = sg[s_i] pi_theta(o_{i,t}) / sg[pi_theta(o_{i,t})], i.e.
    log s_{i,t} = sg[log s_i] + logp_{i,t} - sg[logp_{i,t}]; equals gspo in value and, for
    sequence-level advantages, in gradient (verl ``compute_policy_loss_gspo``)."""
    del key
    sg = jax.lax.stop_gradient
    log_s = sg(_seq_log_ratio(logp, old_logp, mask)) + logp - sg(logp)
    ratio = jnp.exp(jnp.clip(log_s, -cfg.log_ratio_clamp, cfg.log_ratio_clamp))
    loss, maps, _ = _clipped_surrogate(ratio, adv, cfg)
    return loss, {**maps, "ratio": ratio}


def clip_cov_loss(
    cfg: LossConfig, *, logp: Array, old_logp: Array, adv: Array, mask: Array, key: Array
) -> tuple[Array, Metrics]:
    """Clip-Cov (Cui et al. 2025; verl ``compute_policy_loss_clip_cov``): PPO-clip loss, except that among
    the valid tokens not already clipped with clip_cov_lb < Cov_{i,t} < clip_cov_ub, max(floor(r N), 1)
    chosen uniformly at random (``key``) get loss 0 and no gradient (N = valid tokens, r = clip_cov_ratio)."""
    ratio = jnp.exp(jnp.clip(logp - old_logp, -cfg.log_ratio_clamp, cfg.log_ratio_clamp))
    loss, maps, clipped = _clipped_surrogate(ratio, adv, cfg)
    cov = token_covariance(logp, adv, mask)
    candidate = mask & ~clipped & (cov > cfg.clip_cov_lb) & (cov < cfg.clip_cov_ub)
    num_clip = jnp.maximum(jnp.floor(cfg.clip_cov_ratio * jnp.sum(mask)), 1).astype(jnp.int32)
    rank = _descending_rank(jax.random.uniform(key, logp.shape), candidate)
    selected = candidate & (rank < num_clip)
    return jnp.where(selected, 0.0, loss), {**maps, "ratio": ratio, "cov_selected": selected}


def kl_cov_loss(
    cfg: LossConfig, *, logp: Array, old_logp: Array, adv: Array, mask: Array, key: Array
) -> tuple[Array, Metrics]:
    """KL-Cov (Cui et al. 2025; verl ``compute_policy_loss_kl_cov``): no PPO clip; the top
    max(floor(k N), 1) valid tokens by Cov_{i,t} (k = kl_cov_ratio) get a penalty on the log-ratio:

        l_{i,t} = -A rho + kl_cov_coef |log rho|   (selected),     -A rho   (otherwise)
    """
    del key
    log_ratio = jnp.clip(logp - old_logp, -cfg.log_ratio_clamp, cfg.log_ratio_clamp)
    ratio = jnp.exp(log_ratio)
    num_sel = jnp.maximum(jnp.floor(cfg.kl_cov_ratio * jnp.sum(mask)), 1).astype(jnp.int32)
    selected = mask & (_descending_rank(token_covariance(logp, adv, mask), mask) < num_sel)
    loss = -adv * ratio + jnp.where(selected, cfg.kl_cov_coef * jnp.abs(log_ratio), 0.0)
    no_clip = jnp.zeros_like(mask)
    maps = {"clip_frac_low": no_clip, "clip_frac_high": no_clip, "clip_frac_dual": no_clip}
    return loss, {**maps, "ratio": ratio, "cov_selected": selected}


POLICY_LOSSES: dict[str, PolicyLoss] = {
    "ppo": ppo_loss,
    "vanilla": ppo_loss,
    "gspo": gspo_loss,
    "gspo_token": gspo_token_loss,
    "clip_cov": clip_cov_loss,
    "kl_cov": kl_cov_loss,
}


# ------------------------------------------------------------------------------------------- entry point


def loss_terms(
    cfg: LossConfig,
    *,
    logp: Array,
    old_logp: Array,
    advantages: Array,
    mask: Array,
    ref_logp: Array | None = None,
    entropies: Array | None = None,
    entropy_coef: float | Array = 0.0,
    key: Array,
) -> tuple[Array, Array, Metrics]:
    """(numerator, denominator, metrics) of the GRPO loss; loss = numerator / denominator.

        l_{i,t} = m^H_{i,t} policy_loss_{i,t} + beta KL_{i,t} - entropy_coef H_{i,t}

    policy_loss from ``POLICY_LOSSES[cfg.policy_loss]``; m^H the top-entropy mask when
    cfg.top_entropy_quantile < 1 (masked tokens still count in the denominator, as in the paper);
    KL_{i,t} = ``kl_estimate`` (needs ref_logp when beta > 0); the entropy term needs entropies and is
    skipped without them. ``entropy_coef`` may be a traced scalar (schedules). ``key`` drives Clip-Cov's
    random choice and is unused otherwise. old_logp, advantages and ref_logp carry no gradient.

    Metrics (merge rules in the module doc): num_tokens, num_seqs, pg_loss_sum, ratio_sum / _min / _max,
    clip_frac_low_sum, clip_frac_high_sum, clip_frac_dual_sum, ppo_kl_sum (sum of -log rho, the
    approximate KL(pi_old || pi_theta)); kl_sum when ref_logp is given; entropy_sum when entropies are
    given; cov_selected_sum for clip_cov / kl_cov; entropy_mask_kept_sum with the top-entropy mask.
    """
    sg = jax.lax.stop_gradient
    mask = jnp.asarray(mask, bool)
    # Masked positions are zeroed first so that padding (e.g. -inf logp) cannot leak NaN into gradients.
    logp = jnp.where(mask, jnp.asarray(logp, jnp.float32), 0.0)
    old_logp = sg(jnp.where(mask, jnp.asarray(old_logp, jnp.float32), 0.0))
    adv = sg(jnp.asarray(advantages, jnp.float32))
    adv = jnp.where(mask, adv[:, None] if adv.ndim == 1 else adv, 0.0)  # [N, T]

    pg, maps = POLICY_LOSSES[cfg.policy_loss](cfg, logp=logp, old_logp=old_logp, adv=adv, mask=mask, key=key)
    if cfg.top_entropy_quantile < 1.0:
        if entropies is None:
            raise ValueError("LossConfig.top_entropy_quantile < 1 needs entropies")
        ent = jnp.asarray(entropies, jnp.float32)
        keep = high_entropy_mask(ent, mask, quantile=1.0 - cfg.top_entropy_quantile)
        pg = jnp.where(keep, pg, 0.0)
        maps["entropy_mask_kept"] = keep
    regularizer, reg_maps = _regularizers(
        cfg, logp=logp, mask=mask, ref_logp=ref_logp, entropies=entropies, entropy_coef=entropy_coef
    )
    per_token = pg + regularizer
    numerator, denominator = aggregate(per_token, mask, mode=cfg.agg_mode, max_len_norm=cfg.max_len_norm)
    metrics = _token_metrics(pg, logp - old_logp, mask, {**maps, **reg_maps})
    return numerator, denominator, metrics


def _regularizers(
    cfg: LossConfig,
    *,
    logp: Array,
    mask: Array,
    ref_logp: Array | None,
    entropies: Array | None,
    entropy_coef: float | Array,
) -> tuple[Array, dict[str, Array]]:
    """beta KL_{i,t} - entropy_coef H_{i,t} per token [N, T] (each term only when its input is given)."""
    per_token = jnp.zeros_like(logp)
    maps = {}
    if ref_logp is not None:
        ref = jax.lax.stop_gradient(jnp.where(mask, jnp.asarray(ref_logp, jnp.float32), 0.0))
        kl = kl_estimate(
            logp, ref, estimator=cfg.kl_estimator, log_ratio_clamp=cfg.log_ratio_clamp, kl_clamp=cfg.kl_clamp
        )
        per_token = per_token + cfg.beta * kl
        maps["kl"] = kl
    elif cfg.beta > 0.0:
        raise ValueError("LossConfig.beta > 0 needs ref_logp")
    if entropies is not None:
        ent = jnp.where(mask, jnp.asarray(entropies, jnp.float32), 0.0)
        per_token = per_token - jnp.asarray(entropy_coef, jnp.float32) * ent
        maps["entropy"] = ent
    return per_token, maps


def _token_metrics(pg: Array, log_ratio: Array, mask: Array, maps: dict[str, Array]) -> Metrics:
    """Masked sums of the per-token maps (x_sum), ratio min / max, token and sequence counts; no gradient.

    With no valid token, ratio_min / ratio_max are +inf / -inf (the identities of min / max merging)."""
    ratio = maps.pop("ratio")

    def masked_sum(x: Array) -> Array:
        return jnp.sum(jnp.where(mask, x.astype(jnp.float32), 0.0))

    metrics = {
        "num_tokens": jnp.sum(mask).astype(jnp.float32),
        "num_seqs": jnp.sum(jnp.any(mask, axis=-1)).astype(jnp.float32),
        "pg_loss_sum": masked_sum(pg),
        "ppo_kl_sum": masked_sum(-log_ratio),
        "ratio_sum": masked_sum(ratio),
        "ratio_min": jnp.min(jnp.where(mask, ratio, jnp.inf)),
        "ratio_max": jnp.max(jnp.where(mask, ratio, -jnp.inf)),
    }
    metrics.update({f"{name}_sum": masked_sum(value) for name, value in maps.items()})
    return jax.tree.map(jax.lax.stop_gradient, metrics)


def merge_metrics(a: Metrics, b: Metrics) -> Metrics:
    """Combine the metrics of two microbatches / shards: *_min min, *_max max, everything else adds."""

    def merge(name: str) -> Array:
        if name.endswith("_min"):
            return jnp.minimum(a[name], b[name])
        if name.endswith("_max"):
            return jnp.maximum(a[name], b[name])
        return a[name] + b[name]

    return {name: merge(name) for name in a}


def finalize_metrics(metrics: Metrics) -> Metrics:
    """Token means from sums: x = x_sum / num_tokens for every x_sum; other entries pass through."""
    n = jnp.maximum(metrics["num_tokens"], 1.0)
    return {k.removesuffix("_sum"): (v / n if k.endswith("_sum") else v) for k, v in metrics.items()}
