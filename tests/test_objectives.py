"""CISPO, SAPO, GMPO, DPPO (binary TV / binary KL), the sampler-trainer corrections (tis_cap, icepop, seq_mask,
opsm_delta, kl_is) and diagnostics.sampler_trainer_gap: hand-computed values, NumPy re-implementations of the
peer code (verl, TRL, prime-rl), finite-difference gradients, identities, metrics and config validation.

Every loss call goes through one padded shape [N, T] = [6, 5] and one input structure (``make_batch``), so the
jitted ``terms_and_grad`` of tests/test_losses.py compiles once per config for the whole file.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.test_util import check_grads

from grpo_jax import diagnostics, losses
from grpo_jax.config import LossConfig, SamplingConfig, TrainConfig
from tests.test_losses import KEY, TOKEN_OPS, run
from tests.tolerance import EPS64, central_difference_tol, gap_tols, rounding_tol, sum_tol

N, T = 6, 5
LOSSES = ("cispo", "sapo", "gmpo", "dppo_tv", "dppo_kl")
# One config per new loss, default eps (cispo: weight clipped to [0, 5]; gmpo: log-ratio to [-0.4, 0.4]; dppo:
# delta 0.2). The agg mode is the peer's (verl cispo: token-mean; sapo and gmpo: seq-mean-token-mean).
LOSS_CFG = {
    "cispo": LossConfig(policy_loss="cispo", agg_mode="token-mean"),
    "sapo": LossConfig(policy_loss="sapo", agg_mode="seq-mean-token-mean"),
    "gmpo": LossConfig(policy_loss="gmpo", agg_mode="seq-mean-token-mean"),
    "dppo_tv": LossConfig(policy_loss="dppo_tv", agg_mode="token-mean"),
    "dppo_kl": LossConfig(policy_loss="dppo_kl", agg_mode="token-mean"),
}
# Corrections on the default PPO loss (eps 0.2).
CORR_CFG = {
    "tis": LossConfig(tis_cap=2.0, agg_mode="token-mean"),
    "icepop": LossConfig(icepop=(0.5, 2.0), agg_mode="token-mean"),
    "seq_mask": LossConfig(seq_mask=(0.8, 1.25), agg_mode="seq-mean-token-mean"),
    "opsm": LossConfig(opsm_delta=0.1, agg_mode="token-mean"),
    # tis_cap = C_high with icepop (C_low, C_high): min(rho, C) [C_low <= rho <= C_high] = rho [...], TRL token_mask
    "token_mask": LossConfig(tis_cap=2.0, icepop=(0.5, 2.0), agg_mode="token-mean"),
    "all": LossConfig(tis_cap=2.0, icepop=(0.5, 3.0), seq_mask=(0.8, 1.25), opsm_delta=0.1, agg_mode="token-mean"),
    "kl_is": LossConfig(beta=0.1, kl_is=True, agg_mode="token-mean"),
}
PLAIN_CFG = {  # the uncorrected twins (same agg mode / beta)
    "token-mean": LossConfig(agg_mode="token-mean"),
    "seq-mean-token-mean": LossConfig(agg_mode="seq-mean-token-mean"),
    "beta": LossConfig(beta=0.1, agg_mode="token-mean"),
}
PLAIN_OF = {"tis": "token-mean", "icepop": "token-mean", "seq_mask": "seq-mean-token-mean", "opsm": "token-mean",
            "token_mask": "token-mean", "all": "token-mean", "kl_is": "beta"}


def make_batch(logp, old_logp, advantages, mask=None, sampler_logp=None, ref_logp=None) -> dict:
    """A hand case [n, t] (n <= N, t <= T) padded to [N, T] with masked positions and zero advantages.
    sampler_logp defaults to old_logp (no gap), ref_logp to logp (KL 0)."""
    logp = np.asarray(logp, np.float32)
    n, t = logp.shape
    mask = np.ones((n, t), bool) if mask is None else np.asarray(mask, bool)
    old_logp = np.asarray(old_logp, np.float32)
    sampler_logp = old_logp if sampler_logp is None else np.asarray(sampler_logp, np.float32)
    ref_logp = logp if ref_logp is None else np.asarray(ref_logp, np.float32)

    def pad(x, dtype=np.float32):
        out = np.zeros((N, T), dtype)
        out[:n, :t] = x
        return jnp.asarray(out)

    adv = np.zeros(N, np.float32)
    adv[:n] = advantages
    return {"logp": pad(logp), "old_logp": pad(old_logp), "advantages": jnp.asarray(adv), "mask": pad(mask, bool),
            "sampler_logp": pad(sampler_logp), "ref_logp": pad(ref_logp)}


def one_token(ratios, advs, old=0.0, sampler_ratios=None) -> dict:
    """Rows of one valid token with logp - old_logp = log(ratio) and old_logp - sampler_logp = log(rho_s)."""
    old_logp = np.full((len(ratios), 1), old, np.float32)
    logp = old_logp + np.log(np.asarray(ratios, np.float64))[:, None]
    sampler = None if sampler_ratios is None else old_logp - np.log(np.asarray(sampler_ratios))[:, None]
    return make_batch(logp, old_logp, advs, sampler_logp=sampler)


def gap_batch(seed: int) -> dict:
    """Random [N, T] case (row 3 is padding) with a policy drift that crosses every clip / trust-region boundary
    (log-ratios ~ 0.5 N(0, 1) plus four spikes at +-2, i.e. ratios 7.4 / 0.14) and a sampler-trainer gap."""
    rng = np.random.default_rng(seed)
    mask = np.arange(T)[None, :] < np.array([5, 3, 1, 0, 4, 2])[:, None]
    logp = -np.abs(1.5 * rng.normal(size=(N, T))) - 0.05
    log_ratio = 0.5 * rng.normal(size=(N, T))
    spikes = rng.choice(N * T, size=4, replace=False)
    log_ratio.flat[spikes] = rng.choice([-2.0, 2.0], size=4)
    old = np.minimum(logp - log_ratio, -0.02)  # log-probabilities stay < 0 (dppo_kl's log(1 - p))
    sampler = np.minimum(old + 0.4 * rng.normal(size=(N, T)), -0.01)
    ref = logp + 0.3 * rng.normal(size=(N, T))
    adv = rng.normal(size=N)
    adv[:2] = (1.0, -1.0)  # both signs every time
    return make_batch(logp, old, adv, mask, sampler, ref)


def host(b: dict) -> dict:
    """float64 NumPy copies (what the peers compute with) and the token advantages [N, T]."""
    out = {k: np.asarray(v, np.float64) for k, v in b.items()}
    out["mask"] = np.asarray(b["mask"], bool)
    out["adv"] = np.where(out["mask"], out["advantages"][:, None], 0.0)
    return out


def finalize(metrics: dict) -> dict:
    return {k: float(v) for k, v in losses.finalize_metrics(metrics).items()}


# ------------------------------------------------------------------------------- NumPy peers (float64)
# Each per-token function takes lp (the live log pi_theta, differentiated by finite differences) and lp_sg (the
# same values held fixed: the peers' .detach()), so central differences reproduce the peers' autograd.


def sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


def peer_cispo(lp, lp_sg, old, adv, *, clip_low, clip_high):
    # verl verl/trainer/ppo/core_algos.py::compute_policy_loss_cispo
    ratio = np.exp(np.clip(lp_sg - old, -20.0, 20.0))
    return -np.clip(ratio, 1 - clip_low, 1 + clip_high) * adv * lp


def peer_sapo(lp, lp_sg, old, adv, *, tau_pos, tau_neg):
    # verl core_algos.py::compute_policy_loss_sapo; TRL trl/trainer/grpo_trainer.py::_compute_loss ("sapo")
    ratio = np.exp(np.clip(lp - old, -20.0, 20.0))
    tau = np.where(adv > 0, tau_pos, tau_neg)
    return -sigmoid(tau * (ratio - 1.0)) * 4.0 / tau * adv


def peer_gmpo_seq(lp, old, adv, mask, *, clip_low, clip_high):
    # verl core_algos.py::compute_policy_loss_geo_mean: per-SEQUENCE loss -A_i exp(mean_t min-clipped log-ratio)
    nakl = lp - old
    sgn = np.sign(adv)
    nakl_min = sgn * np.minimum(sgn * nakl, sgn * np.clip(nakl, -clip_low, clip_high))
    n = mask.sum(-1)
    ratio = np.exp((nakl_min * mask).sum(-1) / (n + 1e-8))
    return -(adv * mask).sum(-1) / (n + 1e-8) * ratio


def peer_dppo_tv(lp, lp_sg, old, adv, *, mask_low, mask_high):
    # prime-rl src/prime_rl/trainer/rl/loss.py::default_loss_fn (dppo_mask_low / dppo_mask_high)
    diff = np.exp(lp_sg) - np.exp(old)
    invalid = np.where(adv > 0, diff > mask_high, diff < -mask_low)
    return -adv * np.exp(lp - old) * ~invalid


def peer_dppo_kl(lp, lp_sg, old, adv, *, delta_low, delta_high, clip_c=10.0):
    # verl fork core_algos.py::compute_policy_loss_dppo_kl: -A sg(min(ratio, C)) log pi valid (same gradient as
    # ours, -A ratio valid, while ratio < C; values differ, so only gradients are compared)
    p, p_old = np.exp(lp_sg), np.exp(old)
    bkl = p_old * (old - lp_sg) + (1 - p_old) * np.log((1 - p_old) / (1 - p))
    valid = np.where(adv > 0, (bkl <= delta_high) | (p <= p_old), (bkl <= delta_low) | (p >= p_old))
    return -adv * np.minimum(np.exp(lp_sg - old), clip_c) * lp * valid


def peer_ppo(lp, old, adv, *, eps_low=0.2, eps_high=0.2):
    # verl core_algos.py::compute_policy_loss_vanilla (no dual-clip)
    ratio = np.exp(lp - old)
    return np.maximum(-adv * ratio, -adv * np.clip(ratio, 1 - eps_low, 1 + eps_high))


def peer_correction_weight(cfg: LossConfig, lp_sg, old, sampler, adv, mask):
    """The weight on the policy loss, as the peers build it (rho_s = exp(old - sampler) per token)."""
    rho = np.exp(old - sampler)  # TRL grpo_trainer.py::_generate_and_score_completions (token_* modes)
    # the token IS weight, once: rho (TRL's vllm_importance_sampling_ratio) ...
    w = rho.copy() if cfg.tis_cap is not None or cfg.icepop is not None else np.ones_like(rho)
    if cfg.tis_cap is not None:  # TRL token_truncate: clamp(max=cap)
        w = np.minimum(w, cfg.tis_cap)
    if cfg.icepop is not None:  # TRL token_mask: masked_fill(rho < min | rho > max, 0), rho kept inside
        w = w * ((rho >= cfg.icepop[0]) & (rho <= cfg.icepop[1]))
    if cfg.seq_mask is not None:  # verl rollout_corr_helper.py geometric rejection: exp(masked_mean(log rho))
        n = np.maximum(mask.sum(-1, keepdims=True), 1)
        geo = np.exp((np.log(rho) * mask).sum(-1, keepdims=True) / n)
        w = w * ((geo >= cfg.seq_mask[0]) & (geo <= cfg.seq_mask[1]))
    if cfg.opsm_delta is not None:  # TRL grpo_trainer.py::get_off_policy_mask
        kl = ((sampler - lp_sg) * mask).sum(-1, keepdims=True) / np.maximum(mask.sum(-1, keepdims=True), 1.0)
        w = w * ((adv >= 0) | (kl <= cfg.opsm_delta))
    return w


def peer_k3(lp, ref):
    # TRL grpo_trainer.py::_compute_loss per_token_kl (k3)
    return np.exp(ref - lp) - (ref - lp) - 1.0


def np_aggregate(per_token, mask, mode):
    """(numerator, denominator) as losses.aggregate documents: token-mean sum / tokens; seq-mean-token-mean
    sum_i (row sum / |o_i|) / non-empty rows (verl agg_loss)."""
    n = mask.sum(-1)
    if mode == "token-mean":
        return (per_token * mask).sum(), float(mask.sum())
    assert mode == "seq-mean-token-mean"
    return ((per_token * mask).sum(-1) / np.maximum(n, 1)).sum(), float((n > 0).sum())


def np_terms(per_token, mask, mode):
    """The terms np_aggregate's numerator adds, over the valid tokens (each with its row weight 1 / |o_i| under
    seq-mean-token-mean): the magnitudes the float32 numerator rounds against (tests/tolerance.sum_tol)."""
    if mode == "token-mean":
        return (per_token * mask)[mask]
    return (per_token * mask / np.maximum(mask.sum(-1, keepdims=True), 1))[mask]


def fd_grad(f, x, h=1e-6):
    """Central finite differences of the scalar float64 function f at x (every entry)."""
    g = np.zeros_like(x)
    for idx in np.ndindex(x.shape):
        e = np.zeros_like(x)
        e[idx] = h
        g[idx] = (f(x + e) - f(x - e)) / (2 * h)
    return g


def peer_value_tol(f, lp) -> float:
    """The float32 numerator against the float64 peer's on the same (float32) inputs: only the float32 side
    rounds, within sum_tol of the peer's terms, each made by <= TOKEN_OPS roundings (the log-ratio's
    subtraction counting up to |log rho| < 2.5 of them)."""
    return sum_tol(f(lp, terms=True), ops=TOKEN_OPS)


def peer_grad_tol(f, lp, den, p_grad, h=1e-6) -> float:
    """The float32 gradient against float64 central differences of the peer (fd_grad, step h): each float32
    element carries <= TOKEN_OPS roundings of eps/2 (TOKEN_OPS / 2 ulps of the largest); a difference quotient is
    off by the float64 rounding of the two values, 2 e_f / (2 h) with e_f = sum_tol of the peer's terms / den,
    and by the truncation h^2 / 6 |f^(3)| ~ 1e-12 |f^(3)|, orders below both (f is smooth within h of lp)."""
    return rounding_tol(p_grad, ulps=TOKEN_OPS / 2) + sum_tol(f(lp, terms=True), ops=TOKEN_OPS, eps=EPS64) / den / h


def peer_loss(name: str, h: dict):
    """(f(lp) -> (num, den) of the peer loss, with everything but lp fixed at the batch) for a policy loss;
    f(lp, terms=True): the terms its numerator adds (np_terms; gmpo: the rows' losses)."""
    cfg = LOSS_CFG[name]
    old, adv, mask, lp0 = h["old_logp"], h["adv"], h["mask"], h["logp"]
    if name == "gmpo":
        def f(lp, terms=False):
            seq = peer_gmpo_seq(lp, old, adv, mask, clip_low=cfg.eps_low, clip_high=cfg.eps_high)
            nonempty = mask.sum(-1) > 0
            if terms:
                return seq[nonempty]
            return seq[nonempty].sum(), float(nonempty.sum())  # verl: torch.mean over the (non-empty) rows
        return f
    per_token = {
        "cispo": lambda lp: peer_cispo(lp, lp0, old, adv, clip_low=cfg.eps_low, clip_high=cfg.eps_high),
        "sapo": lambda lp: peer_sapo(lp, lp0, old, adv, tau_pos=cfg.sapo_tau_pos, tau_neg=cfg.sapo_tau_neg),
        "dppo_tv": lambda lp: peer_dppo_tv(lp, lp0, old, adv, mask_low=cfg.eps_low, mask_high=cfg.eps_high),
        "dppo_kl": lambda lp: peer_dppo_kl(lp, lp0, old, adv, delta_low=cfg.eps_low, delta_high=cfg.eps_high),
    }[name]
    return lambda lp, terms=False: (np_terms if terms else np_aggregate)(per_token(lp) * mask, mask, cfg.agg_mode)


def peer_corrected(cfg: LossConfig, h: dict):
    """f(lp) -> (num, den): PPO x peer correction weight (+ beta k3 x exp(lp - sampler) with kl_is, TRL
    use_bias_correction_kl's coef_1, live); f(lp, terms=True): the terms its numerator adds (np_terms)."""
    old, adv, mask, lp0, sampler = h["old_logp"], h["adv"], h["mask"], h["logp"], h["sampler_logp"]
    w = peer_correction_weight(cfg, lp0, old, sampler, adv, mask)

    def f(lp, terms=False):
        per_token = w * peer_ppo(lp, old, adv, eps_low=cfg.eps_low, eps_high=cfg.eps_high)
        if cfg.beta > 0:
            kl = peer_k3(lp, h["ref_logp"])
            per_token = per_token + cfg.beta * kl * (np.exp(lp - sampler) if cfg.kl_is else 1.0)
        return (np_terms if terms else np_aggregate)(per_token * mask, mask, cfg.agg_mode)

    return f, w


# ------------------------------------------------------------------------------------ 1. hand values


def test_cispo_hand_values():
    # Default clip [1 - 1, 1 + 4] = [0, 5]; old_logp = -2 so logp = -2 + log(ratio) (the loss uses logp itself):
    #   l = -sg(w) A logp,  d l / d logp = -w A  (every token keeps a gradient, clipped or not).
    #   ratio 6,  A=+1: w 5 (clipped)  logp -0.2082  l = -5 * -0.2082 = 1.0412   grad -5
    #   ratio 2,  A=+1: w 2            logp -1.3069  l = 2.6137                  grad -2
    #   ratio .5, A=+1: w .5           logp -2.6931  l = 1.3466                  grad -0.5
    #   ratio 6,  A=-2: w 5 (clipped)  l = -5 * -2 * -0.2082 = -2.0824           grad +10
    #   ratio .5, A=-2: w .5           l = -0.5 * -2 * -2.6931 = -2.6931         grad +1
    # token-mean over 5 tokens.
    ratios, advs = np.array([6.0, 2.0, 0.5, 6.0, 0.5]), np.array([1.0, 1.0, 1.0, -2.0, -2.0])
    w, lp = np.array([5.0, 2.0, 0.5, 5.0, 0.5]), -2.0 + np.log(ratios)
    # the table's values are printed to 4 decimals: within half a unit of the 4th, 5e-5
    np.testing.assert_allclose(-w * advs * lp, [1.0412, 2.6137, 1.3466, -2.0824, -2.6931], rtol=0, atol=5e-5)
    num, den, m, grad = run(LOSS_CFG["cispo"], one_token(ratios, advs, old=-2.0))
    np.testing.assert_allclose([num, den], [np.sum(-w * advs * lp), 5.0], rtol=1e-5)
    np.testing.assert_allclose(grad[:5, 0], np.array([-5.0, -2.0, -0.5, 10.0, 1.0]) / 5, rtol=1e-5)
    assert float(m["clip_frac_high_sum"]) == 2.0 and float(m["clip_frac_low_sum"]) == 0.0


def test_sapo_hand_values():
    # f(r) = 4/tau sigmoid(tau (r - 1)), l = -A f(r), d l / d logp = -A 4 s (1 - s) r with s = sigmoid(tau (r - 1));
    # tau = 1 for A > 0, 1.05 otherwise. At r = 1: s = 1/2, gradient exactly -A (f'(1) = 1), value -A 2 / tau.
    #   r 1,   A=+1: l = -2,            grad -1
    #   r 1,   A=-1: l = 2 / 1.05,      grad +1
    #   r 1.5, A=+1: s = sig(.5) = .6225, grad -4 (.6225)(.3775) 1.5 = -1.410  (PPO-clip: 0, PPO unclipped: -1.5)
    #   r .5,  A=+1: s = sig(-.5) = .3775, grad -4 (.3775)(.6225) .5 = -.470   (|.| < r = .5)
    #   r 3,   A=-2: s = sig(2.1) = .8909, grad +2 * 4 (.8909)(.1091) 3 = 2.333 (PPO: +6)
    #   r 1.5, A=-2: s = sig(.525) = .6283, grad +2 * 4 (.6283)(.3717) 1.5 = 2.802 (PPO: +3)
    ratios, advs = np.array([1.0, 1.0, 1.5, 0.5, 3.0, 1.5]), np.array([1.0, -1.0, 1.0, 1.0, -2.0, -2.0])
    tau = np.where(advs > 0, 1.0, 1.05)
    s = sigmoid(tau * (ratios - 1))
    value, g = -advs * 4 / tau * s, -advs * 4 * s * (1 - s) * ratios
    # the table's gradients are printed to 3 decimals: within half a unit of the 3rd, 5e-4
    np.testing.assert_allclose(g, [-1, 1, -1.410, -0.470, 2.333, 2.802], rtol=0, atol=5e-4)
    num, den, _, grad = run(LOSS_CFG["sapo"], one_token(ratios, advs))  # 6 one-token rows: den 6
    np.testing.assert_allclose([num, den], [value.sum(), 6.0], rtol=1e-5)
    np.testing.assert_allclose(value[:2], [-2.0, 2 / 1.05], rtol=1e-6)
    grad = np.asarray(grad[:, 0]) * 6
    np.testing.assert_allclose(grad, g, rtol=1e-5)
    np.testing.assert_allclose(grad[:2], [-1.0, 1.0], rtol=1e-6)
    away = ratios != 1
    assert np.all(np.abs(grad[away]) < np.abs(advs * ratios)[away]) and np.all(grad[away] != 0)


def test_gmpo_hand_values():
    # eps 0.4 in log space; each log-ratio is clipped only on the side its advantage pushes (min(sgn lr, sgn clip)):
    #   row 0 lr (0.6, -0.6), A=+1: (0.4, -0.6) -> s = e^-0.1, l = -e^-0.1; grad (0, l / 2): 0.6 clipped, -0.6 not
    #   row 1 lr (0.6, -0.6), A=-1: (0.6, -0.4) -> s = e^0.1,  l = +e^0.1;  grad (l / 2, 0): the mirror image
    #   row 2 lr (0.2, 0.1),  A=+2: inside     -> s = e^.15,  l = -2 e^.15; grad (l / 2, l / 2)
    #   row 3 lr (0.5),       A=+1: clipped    -> s = e^0.4,  l = -e^0.4;   grad 0
    # seq-mean-token-mean: every valid token of row i carries l_i, so num = sum_i l_i, den = 4 rows.
    lr = np.array([[0.6, -0.6], [0.6, -0.6], [0.2, 0.1], [0.5, 0.0]])
    mask = np.array([[1, 1], [1, 1], [1, 1], [1, 0]], bool)
    old = np.full_like(lr, -1.0)
    l = np.array([-np.exp(-0.1), np.exp(0.1), -2 * np.exp(0.15), -np.exp(0.4)])
    num, den, m, grad = run(LOSS_CFG["gmpo"], make_batch(old + lr, old, [1.0, -1.0, 2.0, 1.0], mask))
    np.testing.assert_allclose([num, den], [l.sum(), 4.0], rtol=1e-5)
    expected = np.array([[0, l[0] / 2], [l[1] / 2, 0], [l[2] / 2, l[2] / 2], [0, 0]]) / 4
    # float32 against the formulas: logp = old + lr rounded (|logp| < 1.6: the log-ratio off by < 1.6 eps/2),
    # subtract, clip, the 2-token sum, / |o_i|, exp, x A, / |o_i|, / 4: <= 10 roundings of eps/2; 8 ulps is 1.6x room
    np.testing.assert_allclose(grad[:4, :2], expected, rtol=0, atol=rounding_tol(expected, ulps=8))
    # clip_frac counts tokens outside [-0.4, 0.4] by the sign of A (verl pg_clipfrac / pg_clipfrac_lower).
    assert float(m["clip_frac_high_sum"]) == 3.0 and float(m["clip_frac_low_sum"]) == 2.0


def test_dppo_hand_values():
    # p_old = 0.5 except the rare token (p_old 0.01 -> p 0.1, ratio 10: far outside PPO's clip, but |p - p_old|
    # = 0.09 and its binary KL 0.01 log(0.1) + 0.99 log(0.99 / 0.9) = 0.0713 are inside delta = 0.2).
    # Kept tokens: l = -A ratio, grad -A ratio; dropped: 0 and 0. token-mean over 7 tokens.
    # binary TV (drop A>0 if p - p_old > 0.2; A<0 if p - p_old < -0.2):
    #   row 0 A=+1: p .8 drop (+.3), p .65 keep (-1.3) | row 1 A=+1: p .1 keep (-0.2; A>0 ignores the low side),
    #   rare keep (-10) | row 2 A=-1: p .2 drop (-.3), p .4 keep (.8) | row 3 A=-1: p .95 keep (1.9)
    # binary KL, D = -0.5 log(4 p (1 - p)) at p_old = .5 (drop A>0 if D > .2 and p > p_old; A<0 if p < p_old):
    #   row 0: p .85 D .337 drop, p .7 D .087 keep (-1.4) | row 1: p .1 D .511 keep (p < p_old), rare keep (-10)
    #   row 2: p .1 D .511 drop, p .3 D .087 keep (.6)    | row 3: p .9 D .511 keep (p > p_old) (1.8)
    mask = np.array([[1, 1], [1, 1], [1, 1], [1, 0]], bool)
    old = np.log([[0.5, 0.5], [0.5, 0.01], [0.5, 0.5], [0.5, 0.5]])
    advs = [1.0, 1.0, -1.0, -1.0]
    cases = {
        "dppo_tv": ([[0.8, 0.65], [0.1, 0.1], [0.2, 0.4], [0.95, 0.5]], [[0, -1.3], [-0.2, -10], [0, 0.8], [1.9, 0]]),
        "dppo_kl": ([[0.85, 0.7], [0.1, 0.1], [0.1, 0.3], [0.9, 0.5]], [[0, -1.4], [-0.2, -10], [0, 0.6], [1.8, 0]]),
    }
    for name, (p, loss) in cases.items():
        num, den, m, grad = run(LOSS_CFG[name], make_batch(np.log(p), old, advs, mask))
        loss = np.array(loss)
        np.testing.assert_allclose([num, den], [loss.sum(), 7.0], rtol=1e-5, err_msg=name)
        # float32 log p and log p_old (|log| <= 4.6: their difference off by <= 7 eps/2), exp, x A, / 7: <= 10
        # roundings of eps/2 against the hand values; 8 ulps of the largest is 1.6x room
        np.testing.assert_allclose(grad[:4, :2], loss / 7, rtol=0, atol=rounding_tol(loss / 7, ulps=8), err_msg=name)
        assert np.all((np.asarray(grad[:4, :2]) == 0) == (loss == 0)), name  # dropped: exactly no gradient
        assert float(m["clip_frac_high_sum"]) == 1.0 and float(m["clip_frac_low_sum"]) == 1.0, name


# ------------------------------------------------------------------- 2. NumPy peers on random batches


@pytest.mark.parametrize("name", LOSSES)
def test_policy_losses_match_peers(name):
    # Values (num, den) and d(num / den) / d logp against the float64 peer; the peer's gradient by central finite
    # differences of its loss (with its .detach()ed factors held fixed). dppo_kl: gradients only (see peer).
    boundary_hits = 0
    for seed in range(3):
        b = gap_batch(seed)
        h = host(b)
        num, den, _, grad = run(LOSS_CFG[name], b)
        f = peer_loss(name, h)
        p_num, p_den = f(h["logp"])
        if name != "dppo_kl":
            np.testing.assert_allclose(num, p_num, rtol=0, atol=peer_value_tol(f, h["logp"]), err_msg=f"{name} {seed}")
            np.testing.assert_array_equal(den, p_den, err_msg=f"{name} {seed}")  # a count
        else:
            assert np.exp(h["logp"] - h["old_logp"]).max() < 10.0  # below the peer's C: same gradient
        p_grad = fd_grad(lambda lp, f=f, p_den=p_den: f(lp)[0] / p_den, h["logp"])
        tol = peer_grad_tol(f, h["logp"], p_den, p_grad)
        np.testing.assert_allclose(grad, p_grad, rtol=0, atol=tol, err_msg=f"{name} {seed}")
        # How many valid tokens sit beyond a clip / trust-region boundary (checked below: the test is not vacuous).
        cfg, ratio = LOSS_CFG[name], np.exp(h["logp"] - h["old_logp"])
        beyond = {
            "cispo": ratio > 1 + cfg.eps_high,
            "sapo": np.abs(ratio - 1) > 0.5,
            "gmpo": np.abs(np.log(ratio)) > cfg.eps_high,
            "dppo_tv": np.abs(np.exp(h["logp"]) - np.exp(h["old_logp"])) > cfg.eps_high,
            "dppo_kl": (np.asarray(grad) == 0) & (h["adv"] != 0),
        }[name]
        boundary_hits += int((beyond & h["mask"]).sum())
    assert 0 < boundary_hits < 3 * int(h["mask"].sum()), name


@pytest.mark.parametrize("corr", ["tis", "icepop", "seq_mask", "opsm", "token_mask", "all", "kl_is"])
def test_corrections_match_peers(corr):
    # PPO (verl vanilla) x the peers' correction weight; gradients by finite differences of the peer loss.
    cfg = CORR_CFG[corr]
    acted = 0
    for seed in range(3):
        b = gap_batch(seed)
        h = host(b)
        num, den, _, grad = run(cfg, b)
        f, w = peer_corrected(cfg, h)
        p_num, p_den = f(h["logp"])
        np.testing.assert_allclose(num, p_num, rtol=0, atol=peer_value_tol(f, h["logp"]), err_msg=f"{corr} {seed}")
        np.testing.assert_array_equal(den, p_den, err_msg=f"{corr} {seed}")  # a count
        p_grad = fd_grad(lambda lp, f=f, p_den=p_den: f(lp)[0] / p_den, h["logp"])
        tol = peer_grad_tol(f, h["logp"], p_den, p_grad)
        np.testing.assert_allclose(grad, p_grad, rtol=0, atol=tol, err_msg=f"{corr} {seed}")
        acted += int(((w != 1) & h["mask"]).sum())
    if corr != "kl_is":
        assert acted > 0, corr  # the correction changed some weight: the comparison is not vacuous
    if corr == "token_mask":  # and that is TRL's token_mask weight rho [lo <= rho <= hi] exactly
        rho = np.exp(h["old_logp"] - h["sampler_logp"])
        np.testing.assert_allclose(w, rho * ((rho >= 0.5) & (rho <= 2.0)), rtol=1e-12)


# ------------------------------------------------------------------------ 3. finite-difference gradients


@jax.jit
def _fd_losses(lp_cispo, lp_sapo, lp_gmpo, lp_kl, kw_cispo, kw_sapo, kw_gmpo, kw_kl, lr_cispo):
    def loss(cfg, lp, kw):
        num, den, _ = losses.loss_terms(cfg, logp=lp, key=KEY, **kw)
        return num / den

    # CISPO's weight is detached, so its gradient is the derivative of the value only where the weight is
    # constant: hold the ratio fixed by moving old_logp with logp (old_logp carries no gradient either way);
    # the value is then -w A logp with w constant, whose derivative the gradient must be.
    kw_cispo = {**kw_cispo, "old_logp": lp_cispo - lr_cispo}
    return jnp.stack([
        loss(LOSS_CFG["cispo"], lp_cispo, kw_cispo),
        loss(LOSS_CFG["sapo"], lp_sapo, kw_sapo),
        loss(LOSS_CFG["gmpo"], lp_gmpo, kw_gmpo),
        loss(LossConfig(policy_loss="sapo", beta=0.3, kl_is=True), lp_kl, kw_kl),
    ])


def test_gradients_match_finite_differences():
    # cispo (ratios on both sides of the clip at 5), sapo (smooth), gmpo (log-ratios >= 0.1 away from +-0.4),
    # sapo + beta k3 x pi_theta / pi_sampler (kl_is, sampler != old). float32 finite differences, eps 1e-2.
    rng = np.random.default_rng(7)
    base = gap_batch(5)
    kw = lambda b: {k: v for k, v in b.items() if k != "logp"}
    lr_cispo = jnp.where(base["mask"], jnp.log(jnp.asarray(rng.choice([0.3, 0.8, 2.0, 6.0, 9.0], (N, T)))), 0.0)
    gmpo_lr = rng.choice([-0.9, -0.6, -0.25, -0.1, 0.1, 0.3, 0.55, 0.8], size=(N, T))
    b_gmpo = make_batch(np.asarray(base["old_logp"]) + gmpo_lr, base["old_logp"], base["advantages"], base["mask"])
    args = (base["logp"], base["logp"], b_gmpo["logp"], base["logp"], kw(base), kw(base), kw(b_gmpo), kw(base))
    f = lambda *lps: _fd_losses(*lps, *args[4:], lr_cispo)

    def value_err(lp_cispo, lp_sapo, lp_gmpo, lp_kl):
        """Each loss's float32 rounding at that point: sum_tol of its peer's terms (TOKEN_OPS roundings each) /
        den, and the / den."""
        errs = []
        for name, b in (("cispo", {**base, "logp": lp_cispo, "old_logp": lp_cispo - np.asarray(lr_cispo)}),
                        ("sapo", {**base, "logp": lp_sapo}), ("gmpo", {**b_gmpo, "logp": lp_gmpo})):
            h = host(b)
            peer = peer_loss(name, h)
            errs.append(sum_tol(peer(h["logp"], terms=True), ops=TOKEN_OPS + 1) / peer(h["logp"])[1])
        h = host({**base, "logp": lp_kl})  # sapo + 0.3 k3 exp(lp - sampler), seq-mean-token-mean as sapo's
        sapo = peer_loss("sapo", h)
        kl = np_terms(0.3 * peer_k3(h["logp"], h["ref_logp"]) * np.exp(h["logp"] - h["sampler_logp"]), h["mask"],
                      "seq-mean-token-mean")
        terms = np.concatenate([sapo(h["logp"], terms=True), kl])
        errs.append(sum_tol(terms, ops=TOKEN_OPS + 1) / sapo(h["logp"])[1])
        return np.array(errs)

    tol = central_difference_tol(f, args[:4], 1e-2, value_err)
    check_grads(f, args[:4], order=1, modes=("rev",), eps=1e-2, atol=tol, rtol=0)


# ------------------------------------------------------------------------------------------- 4. identities


def test_corrections_are_identity_without_gap():
    # sampler_logp == old_logp: rho_s = 1, so min(1, C) = 1 (C >= 1), 1 in [lo, hi], geo 1 in [lo, hi]: the weight
    # is exactly 1 and the loss, gradient and loss metrics are bit-for-bit the uncorrected ones.
    # opsm still sees the drift logp - old (as TRL without vLLM), so it is checked where logp == old_logp too;
    # there it is the identity as well (mean KL 0 <= delta).
    for seed in (0, 1):
        b = gap_batch(seed)
        no_gap = {**b, "sampler_logp": b["old_logp"]}
        on_policy = {**no_gap, "logp": b["old_logp"]}
        for corr in ("tis", "icepop", "seq_mask", "opsm", "token_mask", "all"):
            plain = PLAIN_CFG[PLAIN_OF[corr]]
            for case, batch in (("no gap", no_gap), ("on policy", on_policy)):
                if corr in ("opsm", "all") and case == "no gap":
                    continue
                got, want = run(CORR_CFG[corr], batch), run(plain, batch)
                for i in (0, 1, 3):
                    np.testing.assert_array_equal(got[i], want[i], err_msg=f"{corr} {case} {seed} out {i}")
                np.testing.assert_array_equal(got[2]["pg_loss_sum"], want[2]["pg_loss_sum"])
                assert float(finalize(got[2])["is_weight"]) == 1.0, (corr, case)
        # The opsm drift is real: with sampler == old but logp != old, some A < 0 row of seed 0/1 is dropped.
        m = finalize(run(CORR_CFG["opsm"], no_gap)[2])
        assert m["opsm_masked"] > 0.0


def test_kl_is_on_policy():
    # kl_is multiplies k3 by exp(logp - sampler) WITH gradient. At logp == sampler == old the factor is 1, so the
    # value is exactly the plain one, but the gradient gains the score-function term k3 d(factor)/d logp = k3:
    #   d/d logp [k3 e^{logp - s}] = k3' + k3     (the unbiased gradient of KL(pi_theta || pi_ref))
    # so grad_is - grad_plain = beta k3 M / den. (It is NOT the identity in gradient, by design.)
    b = gap_batch(2)
    b = {**b, "logp": b["old_logp"], "sampler_logp": b["old_logp"]}
    h = host(b)
    num, den, m, grad = run(CORR_CFG["kl_is"], b)
    num0, den0, m0, grad0 = run(PLAIN_CFG["beta"], b)
    np.testing.assert_array_equal([num, den], [num0, den0])
    k3 = peer_k3(h["logp"], h["ref_logp"]) * h["mask"]
    assert k3.max() > 1e-3
    # two float32 gradients (<= TOKEN_OPS roundings of eps/2 a element each) whose difference is the k3 term
    tol = rounding_tol([grad, grad0], ulps=TOKEN_OPS)
    np.testing.assert_allclose(np.asarray(grad) - np.asarray(grad0), 0.1 * k3 / float(den), rtol=0, atol=tol)
    np.testing.assert_array_equal(m["kl_sum"], m0["kl_sum"])


# ----------------------------------------------------------------------------------- 5. corrections, gap


def test_tis_cap_scales_by_cap():
    # PPO at ratio 1 (logp == old): per-token loss -A w, gradient -A w / 3 (token-mean). C = 2.
    #   rho_s 3,   A=+1: w = min(3, 2) = 2   -> l -2,    grad -2/3 (uncorrected -1, -1/3: scaled by exactly C)
    #   rho_s 1.5, A=+1: w 1.5               -> l -1.5,  grad -0.5
    #   rho_s .5,  A=-1: w .5                -> l .5,    grad .5/3
    b = one_token([1.0, 1.0, 1.0], [1.0, 1.0, -1.0], sampler_ratios=[3.0, 1.5, 0.5])
    num, den, m, grad = run(CORR_CFG["tis"], b)
    num0, _, _, grad0 = run(PLAIN_CFG["token-mean"], b)
    np.testing.assert_allclose([num, den], [-3.0, 3.0], rtol=1e-6)
    np.testing.assert_allclose(grad[:3, 0], [-2 / 3, -0.5, 0.5 / 3], rtol=1e-6)
    np.testing.assert_allclose(grad[0, 0] / grad0[0, 0], 2.0, rtol=1e-6)
    np.testing.assert_allclose([num0], [-1.0], rtol=1e-6)
    m = finalize(m)
    np.testing.assert_allclose([m["tis_capped"], m["is_weight"]], [1 / 3, (2 + 1.5 + 0.5) / 3], rtol=1e-6)


def test_icepop_masks_tokens_keeps_denominator():
    # (lo, hi) = (0.5, 2): rho_s 3 and 0.4 are masked (weight 0: no value, no gradient), 1.5 and 0.55 kept
    # with their IS weight rho_s (masked IS: IcePop's M(k) = k inside the band). den stays 4 tokens.
    #   A = (+1, +1, -1, -1): l = (0, -1.5, 0, +0.55) -> num -0.95;  grad (0, -1.5/4, 0, 0.55/4)
    b = one_token([1.0] * 4, [1.0, 1.0, -1.0, -1.0], sampler_ratios=[3.0, 1.5, 0.4, 0.55])
    num, den, m, grad = run(CORR_CFG["icepop"], b)
    np.testing.assert_allclose([num, den], [-0.95, 4.0], rtol=1e-6)
    np.testing.assert_allclose(grad[:4, 0], [0.0, -1.5 / 4, 0.0, 0.55 / 4], rtol=1e-6)
    assert grad[0, 0] == 0.0 and grad[2, 0] == 0.0
    m = finalize(m)
    np.testing.assert_allclose([m["icepop_masked"], m["is_weight"]], [0.5, (1.5 + 0.55) / 4], rtol=1e-6)


def test_seq_mask_drops_whole_rows():
    # (lo, hi) = (0.8, 1.25) on exp(mean_t log rho_s), seq-mean-token-mean, PPO at ratio 1 (l = -A per token):
    #   row 0 log rho_s (0.5, 0.3),   A=+1: geo e^0.4 = 1.49 -> dropped
    #   row 1 log rho_s (0.5, -0.5),  A=+1: geo 1 -> kept (each token is far off, the row is not) -> row mean -1
    #   row 2 log rho_s (-0.3, -0.3), A=-1: geo 0.74 -> dropped
    #   row 3 log rho_s (0.1, 0.0),   A=-1: geo 1.05 -> kept -> row mean +1
    # num = 0, den = 4 rows (dropped rows still count); grad row 1: -1 / 2 / 4, row 3: +1 / 8, rows 0, 2: 0.
    log_rho = np.array([[0.5, 0.3], [0.5, -0.5], [-0.3, -0.3], [0.1, 0.0]])
    old = np.full_like(log_rho, -1.0)
    b = make_batch(old, old, [1.0, 1.0, -1.0, -1.0], sampler_logp=old - log_rho)
    num, den, m, grad = run(CORR_CFG["seq_mask"], b)
    # num: the row means -1 and +1 (ratio exp(0), the product, the mean: <= 3 roundings each) cancel; den a count
    np.testing.assert_allclose(num, 0.0, rtol=0, atol=sum_tol([1.0, 1.0], ops=3))
    np.testing.assert_array_equal(den, 4.0)
    # -A / 2 / 4 from the table: <= 4 roundings of eps/2 (exact here: powers of 2), 4 ulps is 2x room
    np.testing.assert_allclose(grad[:4, :2], [[0, 0], [-1 / 8, -1 / 8], [0, 0], [1 / 8, 1 / 8]], rtol=0,
                               atol=rounding_tol(1 / 8, ulps=4))
    np.testing.assert_allclose(finalize(m)["seq_masked"], 0.5, rtol=1e-6)


def test_opsm_drops_only_negative_rows_with_large_kl():
    # sampler == old == 0; delta 0.1; mean KL = mean(sampler - logp) = -logp. PPO eps 0.2, token-mean over 4:
    #   row 0 logp -0.15, A=-1: KL 0.15 > 0.1, A<0 -> dropped: l 0, grad 0  (uncorrected: l = r = e^-.15, grad r)
    #   row 1 logp -0.15, A=+1: same KL, A>0 -> kept:          l = -e^-.15, grad -e^-.15
    #   row 2 logp -0.05, A=-1: KL 0.05 -> kept:               l = e^-.05,  grad e^-.05
    #   row 3 logp +0.15, A=-1: KL -0.15 -> kept:              l = e^.15 (1.16 < dual-clip-free max), grad e^.15
    b = one_token(np.exp([-0.15, -0.15, -0.05, 0.15]), [-1.0, 1.0, -1.0, -1.0])
    num, den, m, grad = run(CORR_CFG["opsm"], b)
    e = np.exp([-0.15, -0.15, -0.05, 0.15])
    np.testing.assert_allclose([num, den], [-e[1] + e[2] + e[3], 4.0], rtol=1e-6)
    np.testing.assert_allclose(grad[:4, 0], np.array([0.0, -e[1], e[2], e[3]]) / 4, rtol=1e-6)
    assert grad[0, 0] == 0.0
    np.testing.assert_allclose(finalize(m)["opsm_masked"], 0.25, rtol=1e-6)
    grad0 = run(PLAIN_CFG["token-mean"], b)[3]
    np.testing.assert_allclose(grad0[0, 0], e[0] / 4, rtol=1e-6)  # what the mask removed


# ----------------------------------------------------------------------------------------------- 6. metrics


def test_correction_metrics_compose():
    # "all": tis_cap 2, icepop (0.5, 3), seq_mask (0.8, 1.25), opsm 0.1; logp == old (PPO ratio 1, l = -A w) so
    # opsm's KL = mean(sampler - old) = -mean log rho_s. 5 rows x 2 tokens, token-mean over 10:
    #   row 0 log rho_s (log 2.5, -log 2.5), A=+1: w (min(2.5, 2) = 2 [capped], 0 [0.4 < 0.5: icepop])
    #   row 1 (0.1, 0.2),     A=-1: geo e^.15 kept, KL -0.15 kept    -> w (e^.1, e^.2)
    #   row 2 (-0.15, -0.15), A=-1: geo e^-.15 = .86 kept, KL .15 > .1 and A<0 -> opsm: w (0, 0)
    #   row 3 (-0.15, -0.15), A=+1: kept                             -> w (e^-.15, e^-.15)
    #   row 4 (0.5, 0.5),     A=+1: geo e^.5 = 1.65 > 1.25 -> seq_mask: w (0, 0)
    # token means: tis_capped 1/10, icepop_masked 1/10, seq_masked 2/10, opsm_masked 2/10,
    # is_weight (2 + e^.1 + e^.2 + 2 e^-.15) / 10; gradient -A w / 10.
    log_rho = np.array([[np.log(2.5), -np.log(2.5)], [0.1, 0.2], [-0.15, -0.15], [-0.15, -0.15], [0.5, 0.5]])
    advs = np.array([1.0, -1.0, -1.0, 1.0, 1.0])
    old = np.full_like(log_rho, -1.0)
    num, den, m, grad = run(CORR_CFG["all"], make_batch(old, old, advs, sampler_logp=old - log_rho))
    w = np.array([[2, 0], [np.exp(0.1), np.exp(0.2)], [0, 0], [np.exp(-0.15)] * 2, [0, 0]])
    m = finalize(m)
    expected = {"tis_capped": 0.1, "icepop_masked": 0.1, "seq_masked": 0.2, "opsm_masked": 0.2,
                "is_weight": w.sum() / 10, "num_tokens": 10.0}
    np.testing.assert_allclose([m[k] for k in expected], list(expected.values()), rtol=1e-6)
    # w from the table: float32 sampler = old - log rho (|.| < 2: rho off by < 2 eps/2), old - sampler, exp, the
    # cap, x A, / 10: <= 6 roundings of eps/2; 4 ulps of the largest is 1.3x room (the masked ones are exactly 0)
    expected = -advs[:, None] * w / 10
    np.testing.assert_allclose(grad[:5, :2], expected, rtol=0, atol=rounding_tol(expected, ulps=4))
    np.testing.assert_allclose([num, den], [np.sum(-advs[:, None] * w), 10.0], rtol=1e-6)


# ----------------------------------------------------------------------------------------- 7. diagnostics


@functools.partial(jax.jit, static_argnames="bound")
def _gap(trainer, sampler, mask, bound):
    return diagnostics.sampler_trainer_gap(trainer, sampler, mask, bound=bound)


def test_sampler_trainer_gap_matches_numpy():
    rng = np.random.default_rng(3)
    mask = np.arange(8)[None, :] < np.array([8, 5, 0, 3, 7, 1, 8, 2])[:, None]  # row 2: padding
    trainer = -np.abs(rng.normal(size=(8, 8))).astype(np.float32)
    sampler = (trainer + 0.3 * rng.normal(size=(8, 8))).astype(np.float32)
    bound = 1.5
    got = {k: float(v) for k, v in _gap(jnp.asarray(trainer), jnp.asarray(sampler), jnp.asarray(mask), bound).items()}
    lr = (trainer.astype(np.float64) - sampler)[mask]
    rho = np.exp(lr)
    rows = mask.any(-1)
    seq_w = np.array([np.prod(np.exp(trainer[i].astype(np.float64) - sampler[i])[mask[i]]) for i in np.where(rows)[0]])
    token_out = np.mean((rho < 1 / bound) | (rho > bound))
    seq_out = np.mean((seq_w < 1 / bound) | (seq_w > bound))
    expected = {
        "gap/abs_logp": np.mean(np.abs(lr)), "gap/kl": np.mean(rho - 1 - lr), "gap/ratio_max": rho.max(),
        "gap/ratio_min": rho.min(), "gap/ratio_p99": np.percentile(rho, 99), "gap/token_out_frac": token_out,
        "gap/seq_out_frac": seq_out,
    }
    assert set(got) == set(expected)
    tols = gap_tols(trainer, sampler, mask)  # float32 against the float64 definitions, per metric
    for k, v in expected.items():
        np.testing.assert_allclose(got[k], v, rtol=0, atol=tols[k], err_msg=k)
    assert 0 < token_out < 1 and 0 < seq_out < 1 and seq_out != token_out
    same = {k: float(v) for k, v in _gap(jnp.asarray(trainer), jnp.asarray(trainer), jnp.asarray(mask), bound).items()}
    assert same == {"gap/abs_logp": 0.0, "gap/kl": 0.0, "gap/ratio_max": 1.0, "gap/ratio_min": 1.0,
                    "gap/ratio_p99": 1.0, "gap/token_out_frac": 0.0, "gap/seq_out_frac": 0.0}


# ----------------------------------------------------------------------------------------------- 8. config


def test_config_validation_and_defaults():
    for kwargs, field in (
        ({"icepop": (2.0, 1.0)}, "icepop"), ({"icepop": (0.5,)}, "icepop"), ({"seq_mask": (1.2, 0.8)}, "seq_mask"),
        ({"tis_cap": 0}, "tis_cap"), ({"tis_cap": -1.0}, "tis_cap"), ({"opsm_delta": -0.1}, "opsm_delta"),
        ({"sapo_tau_neg": 0}, "sapo_tau_neg"), ({"sapo_tau_pos": -1.0}, "sapo_tau_pos"),
    ):
        with pytest.raises(ValueError, match=rf"LossConfig\.{field}"):
            LossConfig(**kwargs)
    assert LossConfig(icepop=[0.5, 5]).icepop == (0.5, 5.0)  # lists (JSON / --set) become hashable tuples
    eps = {name: (LossConfig(policy_loss=name).eps_low, LossConfig(policy_loss=name).eps_high) for name in LOSSES}
    assert eps == {"cispo": (1.0, 4.0), "sapo": (0.2, 0.2), "gmpo": (0.4, 0.4), "dppo_tv": (0.2, 0.2),
                   "dppo_kl": (0.2, 0.2)}
    assert (LossConfig().sapo_tau_pos, LossConfig().sapo_tau_neg) == (1.0, 1.05)
    gap_fields = ({"tis_cap": 2.0}, {"icepop": (0.5, 5.0)}, {"seq_mask": (0.5, 2.0)})
    assert all(LossConfig(**kw).corrects_gap for kw in gap_fields)
    assert not LossConfig(opsm_delta=0.1, kl_is=True, beta=0.1).corrects_gap and not LossConfig().corrects_gap
    for kw in gap_fields:
        with pytest.raises(ValueError, match=r"sampling\.old_logp_source"):
            TrainConfig(loss=LossConfig(**kw))
        TrainConfig(loss=LossConfig(**kw), sampling=SamplingConfig(old_logp_source="recompute"))
    TrainConfig(loss=LossConfig(opsm_delta=0.1, kl_is=True, beta=0.1))  # neither needs pi_old != pi_sampler
