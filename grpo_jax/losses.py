"""Per-token policy losses, KL to the reference, entropy bonus and loss aggregation.

Inputs: logp, old_logp [N, T] (log pi_theta, log pi_old of the sampled tokens), advantages [N] or [N, T],
mask [N, T] (completion tokens that count), optionally ref_logp [N, T] and entropies [N, T] (entropies
come from the trainer's forward and carry gradient). All maths in float32; sign convention: the returned
quantities are a loss to MINIMISE, i.e. -surrogate.

    rho_{i,t} = exp(clamp(logp - old_logp, -c_log, c_log))                          (c_log = log_ratio_clamp)
    l_{i,t}   = w_{i,t} policy_loss_{i,t} + beta * KL_{i,t} - entropy_coef * H_{i,t}   (w: sampler-trainer correction)
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

from grpo_jax.config import POLICY_LOSSES as LOSS_NAMES
from grpo_jax.config import LossConfig, registry
from grpo_jax.diagnostics import masked_quantile

Array = jax.Array
Metrics = dict[str, Array]
PolicyLoss = Callable[..., tuple[Array, Metrics]]

_REGISTERED: dict[str, PolicyLoss] = {}


def register(*names: str) -> Callable[[PolicyLoss], PolicyLoss]:
    """Decorator: the policy loss of `names`. Each must be in config.POLICY_LOSSES, the one list of loss
    names (LossConfig validates against it, and POLICY_LOSSES below is built in its order)."""
    unlisted = [n for n in names if n not in LOSS_NAMES]
    if unlisted:
        raise ValueError(f"policy losses {unlisted} are not in grpo_jax.config.POLICY_LOSSES: add them there")

    def add(fn: PolicyLoss) -> PolicyLoss:
        taken = [n for n in names if n in _REGISTERED]
        if taken:
            raise ValueError(f"policy losses {taken} are registered twice")
        _REGISTERED.update(dict.fromkeys(names, fn))
        return fn

    return add


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


@register("ppo", "vanilla")
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


@register("gspo")
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


@register("gspo_token")
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


@register("clip_cov")
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


@register("kl_cov")
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
    # |log rho| as log rho * sign(log rho): derivative 0 at rho = 1, as torch.abs in verl (jnp.abs' is 1 there)
    abs_log_ratio = log_ratio * jax.lax.stop_gradient(jnp.sign(log_ratio))
    loss = -adv * ratio + jnp.where(selected, cfg.kl_cov_coef * abs_log_ratio, 0.0)
    no_clip = jnp.zeros_like(mask)
    maps = {"clip_frac_low": no_clip, "clip_frac_high": no_clip, "clip_frac_dual": no_clip}
    return loss, {**maps, "ratio": ratio, "cov_selected": selected}


@register("cispo")
def cispo_loss(
    cfg: LossConfig, *, logp: Array, old_logp: Array, adv: Array, mask: Array, key: Array
) -> tuple[Array, Metrics]:
    """CISPO (MiniMax-M1, Chen et al. 2025; verl ``compute_policy_loss_cispo``): the IS weight is clipped and
    detached, the gradient flows through log pi_theta on every token (none is dropped by a clip):

        l_{i,t} = -sg(clip(rho, 1 - eps_low, 1 + eps_high)) A log pi_theta       (defaults: clip to [0, 5])
    """
    del key
    ratio = jnp.exp(jnp.clip(logp - old_logp, -cfg.log_ratio_clamp, cfg.log_ratio_clamp))
    low, high = 1.0 - cfg.eps_low, 1.0 + cfg.eps_high
    weight = jax.lax.stop_gradient(jnp.clip(ratio, low, high))
    maps = {"clip_frac_low": ratio < low, "clip_frac_high": ratio > high, "clip_frac_dual": jnp.zeros_like(mask)}
    return -weight * adv * logp, {**maps, "ratio": ratio}


@register("sapo")
def sapo_loss(
    cfg: LossConfig, *, logp: Array, old_logp: Array, adv: Array, mask: Array, key: Array
) -> tuple[Array, Metrics]:
    """SAPO (Gao et al. 2025, arXiv:2511.20347; verl ``compute_policy_loss_sapo``, TRL ``sapo``): a soft gate
    instead of the hard clip, with temperature tau = sapo_tau_pos if A > 0 else sapo_tau_neg:

        l_{i,t} = -A f(rho),   f(rho) = 4/tau sigmoid(tau (rho - 1)),   f'(1) = 1 (= PPO's gradient on-policy)
    """
    del key
    ratio = jnp.exp(jnp.clip(logp - old_logp, -cfg.log_ratio_clamp, cfg.log_ratio_clamp))
    tau = jnp.where(adv > 0, cfg.sapo_tau_pos, cfg.sapo_tau_neg)
    gate = jax.nn.sigmoid(tau * (ratio - 1.0)) * (4.0 / tau)
    no_clip = jnp.zeros_like(mask)
    maps = {"clip_frac_low": no_clip, "clip_frac_high": no_clip, "clip_frac_dual": no_clip}
    return -adv * gate, {**maps, "ratio": ratio}


@register("gmpo")
def gmpo_loss(
    cfg: LossConfig, *, logp: Array, old_logp: Array, adv: Array, mask: Array, key: Array
) -> tuple[Array, Metrics]:
    """GMPO (Zhao et al. 2025, arXiv:2507.20673; verl ``compute_policy_loss_geo_mean``): the geometric mean of
    the token ratios, each token's log-ratio clipped (in log space) on the side its advantage pushes:

        log r~_{i,t} = sgn(A) min(sgn(A) log rho_{i,t}, sgn(A) clip(log rho_{i,t}, -eps_low, eps_high))
        l_i          = -A_i exp(1/|o_i| sum_t log r~_{i,t})        (A_i: the row's mean advantage)

    broadcast to every valid token of row i, so seq-mean-token-mean gives the paper's mean over sequences.
    """
    del key
    log_ratio = jnp.clip(logp - old_logp, -cfg.log_ratio_clamp, cfg.log_ratio_clamp)
    sign = jnp.sign(adv)
    clipped = jnp.clip(log_ratio, -cfg.eps_low, cfg.eps_high)
    log_r = sign * jnp.minimum(sign * log_ratio, sign * clipped)
    n = jnp.maximum(jnp.sum(mask, -1, keepdims=True), 1)
    seq_ratio = jnp.exp(jnp.sum(jnp.where(mask, log_r, 0.0), -1, keepdims=True) / n)
    seq_adv = jnp.sum(jnp.where(mask, adv, 0.0), -1, keepdims=True) / n
    loss = jnp.broadcast_to(-seq_adv * seq_ratio, logp.shape)
    outside = log_ratio != clipped
    maps = {"clip_frac_low": outside & (adv < 0), "clip_frac_high": outside & (adv > 0),
            "clip_frac_dual": jnp.zeros_like(mask)}
    return loss, {**maps, "ratio": jnp.exp(log_ratio)}


def _dppo(valid: Array, ratio: Array, adv: Array, dropped_low: Array, dropped_high: Array):
    """The DPPO loss -A rho on the tokens inside the trust region, 0 (no gradient) outside it."""
    maps = {"clip_frac_low": dropped_low, "clip_frac_high": dropped_high, "clip_frac_dual": jnp.zeros_like(valid)}
    return jnp.where(valid, -adv * ratio, 0.0), {**maps, "ratio": ratio}


@register("dppo_tv")
def dppo_tv_loss(
    cfg: LossConfig, *, logp: Array, old_logp: Array, adv: Array, mask: Array, key: Array
) -> tuple[Array, Metrics]:
    """DPPO, binary-TV trust region (Qi et al. 2026, arXiv:2602.04879; prime-rl ``default_loss_fn``): a
    token leaves the loss when its probability moved too far in the direction its advantage pushes,

        l_{i,t} = -A rho M,   M = [p - p_old <= eps_high] if A > 0,   [p - p_old >= -eps_low] if A < 0

    with p = exp(logp), p_old = exp(old_logp) (probabilities, not ratios: a rare token may move further)."""
    del key
    ratio = jnp.exp(jnp.clip(logp - old_logp, -cfg.log_ratio_clamp, cfg.log_ratio_clamp))
    diff = jnp.exp(logp) - jnp.exp(old_logp)
    too_high, too_low = (adv > 0) & (diff > cfg.eps_high), (adv < 0) & (diff < -cfg.eps_low)
    return _dppo(~(too_high | too_low), ratio, adv, too_low, too_high)


@register("dppo_kl")
def dppo_kl_loss(
    cfg: LossConfig, *, logp: Array, old_logp: Array, adv: Array, mask: Array, key: Array
) -> tuple[Array, Metrics]:
    """DPPO, binary-KL trust region (Qi et al. 2026; verl ``compute_policy_loss_dppo_kl``): as dppo_tv with
    the KL between the Bernoulli distributions (p_old, 1 - p_old) and (p, 1 - p),

        D = p_old log(p_old / p) + (1 - p_old) log((1 - p_old) / (1 - p))
        M = [D <= eps_high or p <= p_old] if A > 0,   [D <= eps_low or p >= p_old] if A < 0
    """
    del key
    ratio = jnp.exp(jnp.clip(logp - old_logp, -cfg.log_ratio_clamp, cfg.log_ratio_clamp))
    p, p_old = jnp.exp(logp), jnp.exp(old_logp)
    # log(1 - p) as log1p(-p), with p kept below 1 so a token of probability 1 gives a finite (large) D
    one_minus = jnp.log1p(-jnp.minimum(p_old, 1 - 1e-7)) - jnp.log1p(-jnp.minimum(p, 1 - 1e-7))
    binary_kl = p_old * (old_logp - logp) + (1.0 - p_old) * one_minus
    too_high = (adv > 0) & (binary_kl > cfg.eps_high) & (p > p_old)
    too_low = (adv < 0) & (binary_kl > cfg.eps_low) & (p < p_old)
    return _dppo(~(too_high | too_low), ratio, adv, too_low, too_high)


# The registry, in the order of config.POLICY_LOSSES; a listed loss without @register fails here, at import.
POLICY_LOSSES: dict[str, PolicyLoss] = registry("policy loss", LOSS_NAMES, _REGISTERED)


# ------------------------------------------------------------------------------- sampler-trainer corrections


def rollout_correction(
    cfg: LossConfig, *, logp: Array, old_logp: Array, sampler_logp: Array, adv: Array, mask: Array
) -> tuple[Array, dict[str, Array]]:
    """The per-token weight [N, T] (no gradient) that the policy loss is multiplied by, and its maps.

    rho_s = pi_old / pi_sampler per token, pi_old the trainer's logprobs before the update (the rollout's
    importance weight for the gap between the sampler and the trainer). The token IS weight, once:

        tis_cap C           w = min(rho_s, C)                        (TRL token_truncate; verl rollout_is token)
        icepop (lo, hi)     w = rho_s [lo <= rho_s <= hi]            masked IS (IcePop, Ling team 2025: M(k) = k
                                                                     inside the band, 0 outside; TRL token_mask)
        both                w = min(rho_s, C) [lo <= rho_s <= hi]

    then the sequence masks multiply in:

        seq_mask (lo, hi)   w *= [lo <= exp(mean_t log rho_s) <= hi]  per row (verl rollout_rs geometric)
        opsm_delta d        w *= not (A < 0 and mean_t(log pi_sampler - sg log pi_theta) > d)   per row
                            (DeepSeek-V3.2 eq. 9; TRL ``get_off_policy_mask``)

    Masked tokens keep their place in the loss denominator, as TRL multiplies the per-token loss (verl's
    rejection sampling removes them from the mask instead). With sampler_logp == old_logp every weight is
    1 and the loss is the uncorrected one; opsm_delta still acts on the policy's drift during the update,
    as TRL's does without vLLM. GMPO's loss is one value per row, copied to its tokens: a weighted row
    then counts with the arithmetic mean of its tokens' weights (verl's geo_mean takes their geometric mean).
    """
    sg = jax.lax.stop_gradient
    log_rho = jnp.clip(old_logp - sampler_logp, -cfg.log_ratio_clamp, cfg.log_ratio_clamp)
    rho = jnp.exp(log_rho)
    n = jnp.maximum(jnp.sum(mask, -1, keepdims=True), 1)
    weight, maps = jnp.ones_like(logp), {}
    if cfg.tis_cap is not None or cfg.icepop is not None:
        weight = rho
    if cfg.tis_cap is not None:
        weight = jnp.minimum(weight, cfg.tis_cap)
        maps["tis_capped"] = rho > cfg.tis_cap
    if cfg.icepop is not None:
        keep = (rho >= cfg.icepop[0]) & (rho <= cfg.icepop[1])
        weight = jnp.where(keep, weight, 0.0)
        maps["icepop_masked"] = ~keep
    if cfg.seq_mask is not None:
        geo = jnp.exp(jnp.sum(jnp.where(mask, log_rho, 0.0), -1, keepdims=True) / n)
        keep = (geo >= cfg.seq_mask[0]) & (geo <= cfg.seq_mask[1])
        weight = jnp.where(keep, weight, 0.0)
        maps["seq_masked"] = jnp.broadcast_to(~keep, logp.shape)
    if cfg.opsm_delta is not None:
        seq_kl = jnp.sum(jnp.where(mask, sampler_logp - sg(logp), 0.0), -1, keepdims=True) / n
        drop = (adv < 0) & (seq_kl > cfg.opsm_delta)
        weight = jnp.where(drop, 0.0, weight)
        maps["opsm_masked"] = drop
    if maps:
        maps["is_weight"] = weight
    return sg(weight), maps


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
    sampler_logp: Array | None = None,
) -> tuple[Array, Array, Metrics]:
    """(numerator, denominator, metrics) of the GRPO loss; loss = numerator / denominator.

        l_{i,t} = w_{i,t} m^H_{i,t} policy_loss_{i,t} + beta KL_{i,t} - entropy_coef H_{i,t}

    w the sampler-trainer correction (``rollout_correction``; 1 when none is configured), computed from
    sampler_logp, the rollout's own logprobs (None: the same as old_logp, i.e. no gap); with cfg.kl_is the
    KL term is multiplied by pi_theta / pi_sampler. policy_loss from ``POLICY_LOSSES[cfg.policy_loss]``;
    m^H the top-entropy mask when cfg.top_entropy_quantile < 1 (masked tokens still count in the
    denominator, as in the paper); KL_{i,t} = ``kl_estimate`` (needs ref_logp when beta > 0); the entropy
    term needs entropies and is skipped without them. ``entropy_coef`` may be a traced scalar
    (schedules). ``key`` drives Clip-Cov's random choice and is unused otherwise. old_logp, sampler_logp,
    advantages and ref_logp carry no gradient.

    Metrics (merge rules in the module doc): num_tokens, num_seqs, pg_loss_sum, ratio_sum / _min / _max,
    clip_frac_low_sum, clip_frac_high_sum, clip_frac_dual_sum, ppo_kl_sum (sum of -log rho, the
    approximate KL(pi_old || pi_theta)); kl_sum when ref_logp is given; entropy_sum when entropies are
    given; cov_selected_sum for clip_cov / kl_cov; entropy_mask_kept_sum with the top-entropy mask; with a
    correction, is_weight_sum and the fraction it acted on: tis_capped_sum, icepop_masked_sum,
    seq_masked_sum, opsm_masked_sum.
    """
    sg = jax.lax.stop_gradient
    mask = jnp.asarray(mask, bool)
    # Masked positions are zeroed first so that padding (e.g. -inf logp) cannot leak NaN into gradients.
    logp = jnp.where(mask, jnp.asarray(logp, jnp.float32), 0.0)
    old_logp = sg(jnp.where(mask, jnp.asarray(old_logp, jnp.float32), 0.0))
    adv = sg(jnp.asarray(advantages, jnp.float32))
    adv = jnp.where(mask, adv[:, None] if adv.ndim == 1 else adv, 0.0)  # [N, T]

    sampler = old_logp if sampler_logp is None else sg(jnp.where(mask, jnp.asarray(sampler_logp, jnp.float32), 0))
    pg, maps = POLICY_LOSSES[cfg.policy_loss](cfg, logp=logp, old_logp=old_logp, adv=adv, mask=mask, key=key)
    weight, corr_maps = rollout_correction(cfg, logp=logp, old_logp=old_logp, sampler_logp=sampler, adv=adv,
                                           mask=mask)
    if corr_maps:
        pg = pg * weight
        maps.update(corr_maps)
    if cfg.top_entropy_quantile < 1.0:
        pg, maps["entropy_mask_kept"] = _top_entropy_only(cfg, pg, entropies, mask)
    regularizer, reg_maps = _regularizers(
        cfg, logp=logp, mask=mask, ref_logp=ref_logp, entropies=entropies, entropy_coef=entropy_coef,
        sampler_logp=sampler,
    )
    per_token = pg + regularizer
    numerator, denominator = aggregate(per_token, mask, mode=cfg.agg_mode, max_len_norm=cfg.max_len_norm)
    metrics = _token_metrics(pg, logp - old_logp, mask, {**maps, **reg_maps})
    return numerator, denominator, metrics


def _top_entropy_only(cfg: LossConfig, pg: Array, entropies: Array | None, mask: Array) -> tuple[Array, Array]:
    """(pg on the top ``cfg.top_entropy_quantile`` of tokens by entropy, 0 elsewhere; the kept mask)."""
    if entropies is None:
        raise ValueError("LossConfig.top_entropy_quantile < 1 needs entropies")
    keep = high_entropy_mask(jnp.asarray(entropies, jnp.float32), mask, quantile=1.0 - cfg.top_entropy_quantile)
    return jnp.where(keep, pg, 0.0), keep


def _regularizers(
    cfg: LossConfig,
    *,
    logp: Array,
    mask: Array,
    ref_logp: Array | None,
    entropies: Array | None,
    entropy_coef: float | Array,
    sampler_logp: Array,
) -> tuple[Array, dict[str, Array]]:
    """beta KL_{i,t} - entropy_coef H_{i,t} per token [N, T] (each term only when its input is given).

    cfg.kl_is: KL_{i,t} x pi_theta / pi_sampler, with gradient through the ratio: the samples come from
    the sampler, so this weighs the estimate to the current policy, whose KL the term means (DeepSeek-V3.2
    §3.1; TRL ``use_bias_correction_kl`` weighs by pi_theta / pi_old, the same when the sampler is pi_old)."""
    per_token = jnp.zeros_like(logp)
    maps = {}
    if ref_logp is not None:
        ref = jax.lax.stop_gradient(jnp.where(mask, jnp.asarray(ref_logp, jnp.float32), 0.0))
        kl = kl_estimate(
            logp, ref, estimator=cfg.kl_estimator, log_ratio_clamp=cfg.log_ratio_clamp, kl_clamp=cfg.kl_clamp
        )
        if cfg.kl_is:
            kl = kl * jnp.exp(jnp.clip(logp - sampler_logp, -cfg.log_ratio_clamp, cfg.log_ratio_clamp))
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
