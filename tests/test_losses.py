"""Policy losses, KL, entropy bonus, aggregation: hand-computed values, gradients, microbatches, jit/vmap."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.test_util import check_grads

from grpo_jax import config as config_lib
from grpo_jax import losses
from grpo_jax.config import LossConfig
from tests.tolerance import EPS32, central_difference_tol, rounding_tol, sum_tol

KEY = jax.random.PRNGKey(0)
MODES = config_lib.AGG_MODES


@functools.partial(jax.jit, static_argnames="cfg")
def terms_and_grad(cfg: LossConfig, logp: jax.Array, kw: dict) -> tuple:
    """(numerator, denominator, metrics, d(num/den)/d logp), jitted: one compile per config and shapes."""

    def loss(lp):
        num, den, metrics = losses.loss_terms(cfg, logp=lp, **kw)
        return num / den, (num, den, metrics)

    (_, (num, den, metrics)), grad = jax.value_and_grad(loss, has_aux=True)(logp)
    return num, den, metrics, grad


def run(cfg: LossConfig, b: dict, **extra) -> tuple:
    kw = {k: v for k, v in b.items() if k != "logp"}
    kw.setdefault("key", KEY)
    return terms_and_grad(cfg, b["logp"], {**kw, **extra})


@functools.partial(jax.jit, static_argnames=("max_len_norm", "beta", "eps_low", "eps_high"))
def _terms_all_modes(logp, kw, *, max_len_norm, beta, eps_low, eps_high):
    out = {}
    for mode in MODES:
        cfg = LossConfig(
            agg_mode=mode, max_len_norm=max_len_norm, beta=beta, eps_low=eps_low, eps_high=eps_high
        )
        out[mode] = terms_and_grad.__wrapped__(cfg, logp, kw)
    return out


def run_modes(b: dict, *, max_len_norm=5, beta=0.0, eps_low=0.2, eps_high=0.2, **extra) -> dict:
    """``run`` for the four aggregation modes in one compiled program."""
    kw = {k: v for k, v in b.items() if k != "logp"} | {"key": KEY} | extra
    static = dict(max_len_norm=max_len_norm, beta=beta, eps_low=eps_low, eps_high=eps_high)
    return _terms_all_modes(b["logp"], kw, **static)


def one_token_rows(ratios, advs):
    """N rows of one valid token: logp - old_logp = log(ratio)."""
    ratios = jnp.asarray(ratios, jnp.float32)[:, None]
    return dict(
        logp=jnp.log(ratios), old_logp=jnp.zeros_like(ratios), advantages=jnp.asarray(advs, jnp.float32),
        mask=jnp.ones(ratios.shape, bool),
    )


# At most this many correctly rounded float32 operations make one per-token value before it is summed (ratio:
# subtract, exp; a policy loss: clip, products, max; k3: subtract, exp, two subtractions, clamp; beta KL,
# coef H and their sum; the aggregation weight): what each term carries into the sums below (sum_tol's ops).
TOKEN_OPS = 16


def token_values(cfg: LossConfig, b: dict, key=KEY) -> dict:
    """The per-token values over the valid tokens that loss_terms adds into its float *_sum metrics (keyed by
    metric) and "terms", |l| <= |policy loss| + beta |KL| + |H| (entropy_coef <= 1) bounding the numerator's
    terms: the magnitudes those float32 sums round against (tests/tolerance.sum_tol). The other *_sum metrics
    count tokens (0/1 values: exact integers in float32)."""
    m = np.asarray(b["mask"], bool)
    mask = jnp.asarray(m)
    logp = jnp.where(mask, jnp.asarray(b["logp"], jnp.float32), 0.0)
    old = jnp.where(mask, jnp.asarray(b["old_logp"], jnp.float32), 0.0)
    adv = jnp.where(mask, jnp.asarray(b["advantages"], jnp.float32)[:, None], 0.0)
    pg, maps = losses.POLICY_LOSSES[cfg.policy_loss](cfg, logp=logp, old_logp=old, adv=adv, mask=mask, key=key)
    out = {"pg_loss_sum": pg, "ppo_kl_sum": logp - old, "ratio_sum": maps["ratio"]}
    if "ref_logp" in b:
        ref = jnp.where(mask, jnp.asarray(b["ref_logp"], jnp.float32), 0.0)
        out["kl_sum"] = losses.kl_estimate(logp, ref, estimator=cfg.kl_estimator,
                                           log_ratio_clamp=cfg.log_ratio_clamp, kl_clamp=cfg.kl_clamp)
    if "entropies" in b:
        out["entropy_sum"] = jnp.asarray(b["entropies"], jnp.float32)
    out = {k: np.abs(np.asarray(v, np.float64))[m] for k, v in out.items()}
    out["terms"] = out["pg_loss_sum"] + cfg.beta * out.get("kl_sum", 0.0) + out.get("entropy_sum", 0.0)
    return out


def metric_tol(name: str, value, values: dict) -> float:
    """How far two float32 computations of metric `name` (another summation order: microbatches merged,
    jit(vmap) against eager) may differ: twice sum_tol of the per-token values it sums; a ratio min / max is one
    per-token value (<= TOKEN_OPS roundings of eps/2 a side); token counts are exact."""
    if name in values:
        return 2 * sum_tol(values[name], ops=TOKEN_OPS)
    if name.endswith(("_min", "_max")):
        return rounding_tol(value, ulps=TOKEN_OPS)
    return 0.0


def random_batch(seed: int, N=6, T=5):
    rng = np.random.default_rng(seed)
    lengths = np.array([5, 3, 1, 0, 4, 2, 5, 3][:N])  # row 3 is an all-masked padding row
    mask = np.arange(T)[None, :] < lengths[:, None]
    logp = -np.abs(rng.normal(size=(N, T))) - 0.1
    return dict(
        logp=jnp.asarray(logp, jnp.float32),
        old_logp=jnp.asarray(logp + 0.1 * rng.normal(size=(N, T)), jnp.float32),
        ref_logp=jnp.asarray(logp + 0.2 * rng.normal(size=(N, T)), jnp.float32),
        advantages=jnp.asarray(rng.normal(size=N), jnp.float32),
        entropies=jnp.asarray(np.abs(rng.normal(size=(N, T))), jnp.float32),
        mask=jnp.asarray(mask),
    )


# ---------------------------------------------------------------------------------------- policy gradient


def test_ratio_one_gradient_is_reinforce():
    # At logp == old_logp, rho = 1 and d rho / d logp = 1, no clipping is active, and the gradient is
    # REINFORCE's:  d loss / d logp_{i,t} = -A_i M_{i,t} w_{i,t} / den, with the mode's token weight w:
    # token-mean 1 (den = sum M); seq-mean-token-mean 1/|o_i|; seq-mean-token-sum 1; -sum-norm 1/L (den = S).
    b = random_batch(0)
    b = dict(logp=b["logp"], old_logp=b["logp"], advantages=b["advantages"], mask=b["mask"])
    L = 7
    grads = run_modes(b, max_len_norm=L)
    m = np.asarray(b["mask"], np.float32)
    lengths, seqs = m.sum(1, keepdims=True), float((m.sum(1) > 0).sum())
    expected_weight_den = {
        "token-mean": (np.ones_like(m), m.sum()),
        "seq-mean-token-mean": (1.0 / np.maximum(lengths, 1) * np.ones_like(m), seqs),
        "seq-mean-token-sum": (np.ones_like(m), seqs),
        "seq-mean-token-sum-norm": (np.ones_like(m) / L, seqs),
    }
    for mode, (weight, den) in expected_weight_den.items():
        expected = -np.asarray(b["advantages"])[:, None] * m * weight / den
        # float32 against the float64 formula: <= 4 roundings a element (the weight, 1 / den, two products;
        # rho = exp(0) = 1 exactly), eps/2 each: 4 ulps of the largest is 2x room
        np.testing.assert_allclose(grads[mode][3], expected, rtol=0, atol=rounding_tol(expected, ulps=4), err_msg=mode)


def test_ppo_clip_sign_convention():
    # eps = 0.2. Per-token loss max(-A rho, -A clip(rho, 0.8, 1.2)), gradient -A rho when unclipped, else 0:
    #   A=+1 rho=1.3: max(-1.3, -1.2) = -1.2, clipped (upper)  -> grad 0
    #   A=+1 rho=1.1: -1.1, unclipped                          -> grad -1.1
    #   A=+1 rho=0.7: max(-0.7, -0.8) = -0.7, unclipped         -> grad -0.7
    #   A=-2 rho=0.7: max(1.4, 1.6) = 1.6, clipped (lower)      -> grad 0
    #   A=-2 rho=0.9: 1.8, unclipped                            -> grad +1.8
    #   A=-2 rho=1.3: max(2.6, 2.4) = 2.6, unclipped            -> grad +2.6
    # token-mean over 6 tokens; numerator = -1.2 - 1.1 - 0.7 + 1.6 + 1.8 + 2.6 = 3.0.
    b = one_token_rows([1.3, 1.1, 0.7, 0.7, 0.9, 1.3], [1, 1, 1, -2, -2, -2])
    cfg = LossConfig(agg_mode="token-mean")
    num, den, metrics, grad = run(cfg, b)
    np.testing.assert_allclose([num, den], [3.0, 6.0], rtol=1e-6)
    # expected from the table above; float32 ratio, log, exp, / 6: <= 4 roundings of eps/2, 4 ulps is 2x room
    expected = np.array([0.0, -1.1, -0.7, 0.0, 1.8, 2.6]) / 6
    np.testing.assert_allclose(grad[:, 0], expected, rtol=0, atol=rounding_tol(expected, ulps=4))
    assert float(metrics["clip_frac_high_sum"]) == 1.0 and float(metrics["clip_frac_low_sum"]) == 1.0


def test_clip_higher():
    # A=+1, rho=1.25: clipped by eps_high=0.2 (gradient 0), not by DAPO's eps_high=0.28 (gradient -1.25).
    b = one_token_rows([1.25], [1.0])
    for eps_high, expected in ((0.2, 0.0), (0.28, -1.25)):
        grad = run(LossConfig(eps_high=eps_high, agg_mode="token-mean"), b)[3]
        # clipped: exactly 0 (the constant branch); else -rho = -exp(log 1.25) in float32: <= 3 roundings
        np.testing.assert_allclose(grad[0, 0], expected, rtol=0, atol=rounding_tol(expected, ulps=4))


def test_dual_clip():
    # A=-1: l = min(max(rho, clip(rho, .8, 1.2)), c) with c = 3.
    #   rho=4: min(4, 3) = 3 (capped, grad 0, counted in clip_frac_dual); without dual-clip l = 4, grad 4
    #   rho=2: min(2, 3) = 2, grad 2
    # A=+1, rho=4: max(-4, -1.2) = -1.2 (dual-clip only touches A < 0).
    b = one_token_rows([4.0, 2.0, 4.0], [-1.0, -1.0, 1.0])
    num, _, metrics, grad = run(LossConfig(dual_clip_c=3.0, agg_mode="seq-mean-token-sum"), b)
    np.testing.assert_allclose(num, 3.0 + 2.0 - 1.2, rtol=1e-6)
    # expected from the cases above: exp(log rho) and / 3 in float32, <= 4 roundings of eps/2 (2x room)
    np.testing.assert_allclose(grad[:, 0], np.array([0, 2, 0]) / 3, rtol=0, atol=rounding_tol(2 / 3, ulps=4))
    assert float(metrics["clip_frac_dual_sum"]) == 1.0
    grad_off = run(LossConfig(agg_mode="seq-mean-token-sum"), b)[3]
    np.testing.assert_allclose(grad_off[:, 0], np.array([4, 2, 0]) / 3, rtol=0, atol=rounding_tol(4 / 3, ulps=4))


# ------------------------------------------------------------------------------------------- aggregation


def test_aggregation_modes_hand_values():
    # l = [[1, 2, 3], [4, x, x], [x, x, x]] with x masked; row 2 is padding (not a sequence).
    #   token-mean:              (1+2+3+4) / 4 tokens                 = 10 / 4
    #   seq-mean-token-mean:     (6/3 + 4/1) / 2 seqs                 = 6 / 2
    #   seq-mean-token-sum:      (6 + 4) / 2 seqs                     = 10 / 2
    #   seq-mean-token-sum-norm: ((6 + 4) / L) / 2 seqs, L = 4        = 2.5 / 2
    per_token = jnp.array([[1.0, 2.0, 3.0], [4.0, 99.0, 99.0], [99.0, 99.0, 99.0]])
    mask = jnp.array([[1, 1, 1], [1, 0, 0], [0, 0, 0]], bool)
    expected = {
        "token-mean": (10.0, 4.0), "seq-mean-token-mean": (6.0, 2.0),
        "seq-mean-token-sum": (10.0, 2.0), "seq-mean-token-sum-norm": (2.5, 2.0),
    }
    for mode, (num, den) in expected.items():
        np.testing.assert_allclose(losses.aggregate(per_token, mask, mode=mode, max_len_norm=4), (num, den))


def test_microbatches_equal_full_batch():
    # sum_m num_m / sum_m den_m == full loss and sum_m grad(num_m) / sum_m den_m == full gradient, for
    # every mode (KL and entropy bonus on; the first microbatch holds the all-masked padding row).
    b = random_batch(1, N=8)
    cfg_kw = dict(max_len_norm=5, beta=0.1, eps_low=0.05, eps_high=0.05)
    full = run_modes(b, entropy_coef=0.01, **cfg_kw)
    parts = [run_modes({k: v[sl] for k, v in b.items()}, entropy_coef=0.01, **cfg_kw)
             for sl in (slice(0, 4), slice(4, 8))]
    for mode in MODES:
        num, den, metrics, grad = full[mode]
        split = [p[mode] for p in parts]
        den_total = sum(p[1] for p in split)
        np.testing.assert_allclose(sum(p[0] for p in split) / den_total, num / den, rtol=1e-6, err_msg=mode)
        # run_modes returns d(num_m / den_m) / d logp_m; rescale to d(num_m / den_total) / d logp_m.
        grad_split = jnp.concatenate([p[3] * p[1] / den_total for p in split])
        # each element is the same per-token chain (<= TOKEN_OPS roundings of eps/2 a side) and the split
        # side rescales it (two more): 2 * TOKEN_OPS + 2 roundings of eps/2 ~ TOKEN_OPS + 1 ulps of the largest
        np.testing.assert_allclose(grad_split, grad, rtol=0, atol=rounding_tol(grad, ulps=TOKEN_OPS + 1), err_msg=mode)
        merged = losses.merge_metrics(split[0][2], split[1][2])
        values = token_values(LossConfig(agg_mode=mode, **cfg_kw), b)
        for name in metrics:  # the same per-token values, summed per microbatch then merged
            tol = metric_tol(name, metrics[name], values)
            np.testing.assert_allclose(merged[name], metrics[name], rtol=0, atol=tol, err_msg=name)


# ---------------------------------------------------------------------------------------------------- KL


def test_kl_estimators_match_definitions():
    logp = jnp.array([[-1.0, -2.0, -0.5, -30.0]])
    ref = jnp.array([[-1.5, -1.0, -0.5, -0.1]])
    log_r = np.asarray(ref - logp)  # log pi_ref / pi_theta
    k1 = losses.kl_estimate(logp, ref, estimator="k1")
    k2 = losses.kl_estimate(logp, ref, estimator="k2")
    k3 = losses.kl_estimate(logp, ref, estimator="k3")
    np.testing.assert_allclose(k1, -log_r, rtol=1e-6)
    np.testing.assert_allclose(k2, 0.5 * log_r**2, rtol=1e-6)
    expected_k3 = np.exp(log_r) - log_r - 1
    np.testing.assert_allclose(k3[0, :3], expected_k3[0, :3], rtol=1e-6)
    assert float(k3[0, 3]) == 10.0  # log r = 29.9 -> clamped to 20, exp(20) - 21 -> clamped to 10 (verl)


def test_k1_k3_unbiased_k2_nonnegative_on_exact_expectation():
    # x ~ q = pi_theta over 5 tokens, p = pi_ref. E_q[k1] = E_q[k3] = KL(q || p) exactly; k2 >= 0.
    q = jax.nn.softmax(jnp.array([1.0, 0.5, -0.3, 0.2, -1.0]))
    p = jax.nn.softmax(jnp.array([0.2, 0.9, -0.1, 0.0, -0.5]))
    kl = float(jnp.sum(q * (jnp.log(q) - jnp.log(p))))
    for est in ("k1", "k3"):
        value = losses.kl_estimate(jnp.log(q)[None], jnp.log(p)[None], estimator=est)[0]
        np.testing.assert_allclose(float(jnp.sum(q * value)), kl, rtol=1e-5)
    assert np.all(np.asarray(losses.kl_estimate(jnp.log(q), jnp.log(p), estimator="k2")) >= 0)


def test_gradient_matches_finite_differences():
    # PPO (unclipped region: ratios within 1 +- 0.1, eps 0.5) + beta k3 KL + entropy bonus.
    b = random_batch(2)
    cfg = LossConfig(eps_low=0.5, eps_high=0.5, beta=0.3, agg_mode="seq-mean-token-mean")
    rest = {k: v for k, v in b.items() if k not in ("logp", "entropies")}

    @jax.jit
    def f(logp, entropies):
        num, den, _ = losses.loss_terms(cfg, logp=logp, entropies=entropies, entropy_coef=0.05, key=KEY, **rest)
        return num / den

    def value_err(logp, entropies):  # f = num / den in float32: its sum of terms (den = 5 rows, exact) and the /
        terms = token_values(cfg, {**rest, "logp": logp, "entropies": entropies})["terms"]
        return sum_tol(terms, ops=TOKEN_OPS + 1) / 5

    args = (b["logp"], b["entropies"])
    tol = central_difference_tol(f, args, 1e-2, value_err)
    check_grads(f, args, order=1, modes=("rev",), eps=1e-2, atol=tol, rtol=0)


# --------------------------------------------------------------------------------------------------- GSPO


def test_gspo_sequence_ratio_and_clipping():
    # Row 0: logp - old = (0.1, 0.3) -> s_0 = exp(0.2) = 1.2214 > 1 + 4e-4, A=+1: clipped, l = -(1 + 4e-4).
    # Row 1: logp - old = (-0.2)     -> s_1 = exp(-0.2) = 0.8187 < 1 - 3e-4, A=-1: clipped, l = 1 - 3e-4.
    cfg = LossConfig(policy_loss="gspo", agg_mode="seq-mean-token-mean")
    assert (cfg.eps_low, cfg.eps_high) == (3e-4, 4e-4)  # GSPO paper defaults when left as None
    logp = jnp.array([[0.1, 0.3], [-0.2, 0.0]])
    b = dict(logp=logp, old_logp=jnp.zeros_like(logp), advantages=jnp.array([1.0, -1.0]),
             mask=jnp.array([[1, 1], [1, 0]], bool))
    num, den, m, _ = run(cfg, b)
    # the two row values of ~1 cancel to -3.5e-4: each carries <= 3 roundings (1 + eps in float32, the row
    # mean, the sum), so the sum is off by sum_tol of the two (ops 3), / den 2 (exact)
    rows = np.array([-(1 + 4e-4), 1 - 3e-4])
    np.testing.assert_allclose(num / den, rows.sum() / 2, rtol=0, atol=sum_tol(rows, ops=3) / 2)
    np.testing.assert_allclose([m["ratio_max"], m["ratio_min"]], [np.exp(0.2), np.exp(-0.2)], rtol=1e-6)
    assert float(m["clip_frac_high_sum"]) == 2.0 and float(m["clip_frac_low_sum"]) == 1.0


def test_gspo_token_equals_gspo_for_sequence_advantages():
    # Unclipped (eps 0.5): l_{i,t} = -A_i s_i for every token; seq-mean-token-mean gives -A_i s_i per
    # sequence, so d loss / d logp_{i,t} = -A_i s_i / |o_i| / S for both forms.
    b = random_batch(3)
    b = {k: b[k] for k in ("logp", "old_logp", "advantages", "mask")}
    out = {}
    for name in ("gspo", "gspo_token"):
        num, den, _, grad = run(LossConfig(policy_loss=name, eps_low=0.5, eps_high=0.5), b)
        out[name] = (num / den, grad)
    m = np.asarray(b["mask"], np.float32)
    lengths = np.maximum(m.sum(1), 1)
    s = np.exp((np.asarray(b["logp"] - b["old_logp"]) * m).sum(1) / lengths)
    expected = -np.asarray(b["advantages"]) * s / lengths / (m.sum(1) > 0).sum()
    # float32 against the float64 formula: the row's log-ratio sum (<= 5 adds of |log rho| < 0.5 each: an
    # absolute error in the exponent below 5 eps/2), / |o_i|, exp, x A, / |o_i|, / S: <= 10 roundings of eps/2,
    # 8 ulps of the largest is 1.6x room
    np.testing.assert_allclose(out["gspo"][1], expected[:, None] * m, rtol=0, atol=rounding_tol(expected, ulps=8))
    np.testing.assert_allclose(out["gspo_token"][0], out["gspo"][0], rtol=1e-6)
    # two float32 programs of that chain: twice the 10 roundings, 16 ulps is 1.6x room
    np.testing.assert_allclose(out["gspo_token"][1], out["gspo"][1], rtol=0, atol=rounding_tol(expected, ulps=16))


# ------------------------------------------------------------------------------------ Clip-Cov and KL-Cov


def test_clip_cov_selects_unclipped_tokens_in_covariance_band():
    # logp = [[0, 0, -2, -2], [-2, -2, 0, 0]] (mean -1), A = [[2, 2, 0, 0], [-2, -2, 0, 0]] (mean 0):
    # Cov = (logp + 1) A = [[2, 2, 0, 0], [2, 2, 0, 0]]. Token (0,1) has rho = e^0.5 > 1.2 with A > 0:
    # already clipped by PPO, so the candidates (1 < Cov < 5, not clipped) are (0,0), (1,0), (1,1).
    logp = jnp.array([[0.0, 0.0, -2.0, -2.0], [-2.0, -2.0, 0.0, 0.0]])
    old = logp.at[0, 1].add(-0.5)
    adv = jnp.array([[2.0, 2.0, 0.0, 0.0], [-2.0, -2.0, 0.0, 0.0]])
    b = dict(logp=logp, old_logp=old, advantages=adv, mask=jnp.ones((2, 4), bool))
    cov = losses.token_covariance(logp, adv, b["mask"])
    np.testing.assert_allclose(cov, [[2, 2, 0, 0], [2, 2, 0, 0]])
    candidates = np.array([[1, 0, 0, 0], [1, 1, 0, 0]], bool)
    choices = set()
    for seed in range(8):
        key = jax.random.PRNGKey(seed)
        # r = 2e-4: max(floor(2e-4 * 8), 1) = 1 token chosen at random among the 3 candidates.
        _, _, m, grad = run(LossConfig(policy_loss="clip_cov", agg_mode="token-mean"), b, key=key)
        detached = candidates & (np.asarray(grad) == 0.0)
        assert detached.sum() == 1 and float(m["cov_selected_sum"]) == 1.0
        choices.add(tuple(np.argwhere(detached)[0]))
    assert len(choices) > 1  # the key drives the choice
    # r = 0.5: floor(0.5 * 8) = 4 >= 3 candidates -> all three; lb = 2.5 -> none (Cov = 2 not > 2.5).
    for ratio, lb, selected in ((0.5, 1.0, 3.0), (2e-4, 2.5, 0.0)):
        cfg = LossConfig(policy_loss="clip_cov", clip_cov_ratio=ratio, clip_cov_lb=lb)
        assert float(run(cfg, b)[2]["cov_selected_sum"]) == selected


def test_kl_cov_penalises_top_covariance_tokens():
    # One sequence, A = (3, 1, 0, 0, -1, -3) (mean 0), logp = (0, -1, -2, -2.5, -3, -3.5) (mean -2):
    # Cov = (logp + 2) A = (6, 1, 0, 0, 1, 4.5). log rho = 0.1 everywhere. Token-mean numerator:
    # sum_t -A_t rho + coef * 0.1 * #selected = 0 + 0.1 * #selected (sum A = 0, coef = 1).
    #   k = 2e-4: max(floor(2e-4 * 6), 1) = 1 -> token 0 (Cov 6)            -> numerator 0.1
    #   k = 0.34: floor(0.34 * 6) = 2         -> tokens 0, 5 (Cov 6, 4.5)   -> numerator 0.2
    logp = jnp.array([[0.0, -1.0, -2.0, -2.5, -3.0, -3.5]])
    b = dict(logp=logp, old_logp=logp - 0.1, advantages=jnp.array([[3.0, 1.0, 0.0, 0.0, -1.0, -3.0]]),
             mask=jnp.ones((1, 6), bool))
    for ratio, n_sel in ((2e-4, 1), (0.34, 2)):
        num, _, m, grad = run(LossConfig(policy_loss="kl_cov", kl_cov_ratio=ratio, agg_mode="token-mean"), b)
        # sum_t -A_t rho_t (0 exactly only for one rho; each rho_t = exp(logp_t - old_t) carries the rounding
        # of old = logp - 0.1, up to |logp| 3.5 eps/2, and of the exp and the product: ops 6) + 0.1 per token kept
        terms = np.concatenate([3.0 * np.exp(0.1) * np.array([1, 1 / 3, 0, 0, 1 / 3, 1]), np.full(n_sel, 0.1)])
        np.testing.assert_allclose(num, 0.1 * n_sel, rtol=0, atol=sum_tol(terms, ops=6))
        assert float(m["cov_selected_sum"]) == n_sel
    # With k = 0.34, d/d logp at token 0 (selected): -A rho + sign(log rho) = -3 e^0.1 + 1; at token 5
    # (selected, A = -3): 3 e^0.1 + 1; at token 1 (not selected): -e^0.1. Token-mean over 6.
    e = np.exp(0.1)
    np.testing.assert_allclose(grad[0, [0, 5, 1]], np.array([-3 * e + 1, 3 * e + 1, -e]) / 6, rtol=1e-5)
    # On-policy (log rho = 0 exactly) |log rho| has no derivative; it is taken as 0, as torch.abs in verl, so
    # the selected tokens get the plain -A (jnp.abs would add +1 and push their logp down).
    _, _, _, grad = run(LossConfig(policy_loss="kl_cov", kl_cov_ratio=0.34, agg_mode="token-mean"),
                        b | {"old_logp": logp})
    np.testing.assert_allclose(grad[0], -b["advantages"][0] / 6, rtol=1e-6)


# ------------------------------------------------------------------------------- entropy mask and bonus

TRL_ENTROPIES = jnp.array([[0.1, 0.2, 0.3, 0.4, 0.5, 0.6], [0.7, 0.8, 0.9, 1.0, 1.1, 1.2]])
TRL_MASK = jnp.array([[1, 1, 1, 1, 1, 1], [1, 1, 1, 1, 0, 0]], bool)


def test_high_entropy_mask_trl_cases():
    # 10 valid tokens 0.1..1.0; quantile 0.8 at position 0.8 * 9 = 7.2 -> 0.8 + 0.2 * 0.1 = 0.82, so the
    # top 2 (0.9, 1.0) are kept; the padded 1.1, 1.2 are not (TRL test_compute_entropy_mask_0).
    keep = losses.high_entropy_mask(TRL_ENTROPIES, TRL_MASK, quantile=0.8)
    np.testing.assert_array_equal(keep, [[0, 0, 0, 0, 0, 0], [0, 0, 1, 1, 0, 0]])
    # test_compute_entropy_mask_1: 8 valid tokens, quantile at 5.6 -> 0.76; keeps 1.4 and 0.8.
    ent = jnp.array([[0.1, 0.2, 0.3, 1.4, 0.5, 0.14], [0.5, 0.6, 0.7, 0.8, 0.9, 1.0]])
    mask = jnp.array([[1, 1, 1, 1, 0, 0], [1, 1, 1, 1, 0, 0]], bool)
    np.testing.assert_array_equal(
        losses.high_entropy_mask(ent, mask, quantile=0.8), [[0, 0, 0, 1, 0, 0], [0, 0, 0, 1, 0, 0]]
    )
    assert not np.any(losses.high_entropy_mask(TRL_ENTROPIES, jnp.zeros_like(TRL_MASK), quantile=0.5))


def test_top_entropy_quantile_in_loss_keeps_denominator():
    # rho = 0.2 keeps the 2 forking tokens; the other 8 contribute nothing but still count (token-mean /10).
    cfg = LossConfig(top_entropy_quantile=0.2, agg_mode="token-mean")
    zeros = jnp.zeros_like(TRL_ENTROPIES)
    b = dict(logp=zeros, old_logp=zeros, advantages=jnp.ones(2), mask=TRL_MASK, entropies=TRL_ENTROPIES)
    num, den, m, grad = run(cfg, b)
    np.testing.assert_allclose([num, den, m["entropy_mask_kept_sum"]], [-2.0, 10.0, 2.0])
    np.testing.assert_array_equal(np.asarray(grad) != 0, [[0, 0, 0, 0, 0, 0], [0, 0, 1, 1, 0, 0]])


def test_entropy_bonus_gradient_and_traced_coefficient():
    # l += -coef H: d loss / d H_{i,t} = -coef M_{i,t} / sum M under token-mean; coef may be traced.
    b = random_batch(4)
    cfg = LossConfig(agg_mode="token-mean")
    rest = {k: b[k] for k in ("logp", "old_logp", "advantages", "mask")}

    @jax.jit
    def grad_h(coef):
        f = lambda h: losses.loss_terms(cfg, entropies=h, entropy_coef=coef, key=KEY, **rest)[0]
        return jax.grad(f)(b["entropies"])

    m = np.asarray(b["mask"], np.float32)
    for coef in (0.0, 0.01, 0.05):
        # -coef M exactly up to float32(coef) (one rounding of eps/2; coef 0 gives exactly 0): 1 ulp, 2x room
        np.testing.assert_allclose(grad_h(jnp.float32(coef)), -coef * m, rtol=0, atol=rounding_tol(coef, ulps=1))


# ------------------------------------------------------------------------------------ jit, vmap, config


def test_every_loss_under_jit_and_vmap_matches_eager():
    # jit(vmap(loss_terms)) over two stacked batches (and two keys) == eager loss_terms on each batch.
    # One test for all losses, so the eager op cache (same shapes) is shared between them.
    batches = [random_batch(10 + i) for i in range(2)]
    stacked = jax.tree.map(lambda *x: jnp.stack(x), *batches)
    keys = jax.random.split(KEY, 2)
    for name in config_lib.POLICY_LOSSES[1:]:  # "vanilla" is an alias of "ppo"
        cfg = LossConfig(
            policy_loss=name, beta=0.05, clip_cov_ratio=0.3, kl_cov_ratio=0.3, top_entropy_quantile=0.5
        )
        call = functools.partial(losses.loss_terms, cfg, entropy_coef=0.01)
        vmapped = jax.jit(jax.vmap(lambda b, k: call(key=k, **b)))(stacked, keys)
        for i, (b, k) in enumerate(zip(batches, keys)):
            num, den, metrics = call(key=k, **b)
            # the same per-token values in another fusion and summation order: twice sum_tol of |l| (den: a
            # count, exact)
            values = token_values(cfg, b, key=k)
            np.testing.assert_allclose(vmapped[0][i], num, rtol=0, atol=2 * sum_tol(values["terms"], ops=TOKEN_OPS))
            np.testing.assert_array_equal(vmapped[1][i], den)
            for m in metrics:
                got = vmapped[2][m][i]
                tol = metric_tol(m, metrics[m], values)
                np.testing.assert_allclose(got, metrics[m], rtol=0, atol=tol, err_msg=f"{name} {m}")


def test_register_refuses_a_loss_the_config_does_not_list_or_a_name_twice():
    with pytest.raises(ValueError, match=r"\['grpo'\] are not in grpo_jax.config.POLICY_LOSSES"):
        losses.register("ppo", "grpo")
    with pytest.raises(ValueError, match=r"\['gspo'\] are registered twice"):
        losses.register("gspo")(losses.ppo_loss)
    assert losses.POLICY_LOSSES["gspo"] is losses.gspo_loss and losses.POLICY_LOSSES["vanilla"] is losses.ppo_loss


def test_config_validation():
    with pytest.raises(ValueError, match=r"LossConfig\.policy_loss.*known: ppo, vanilla, gspo"):
        LossConfig(policy_loss="grpo")
    with pytest.raises(ValueError, match=r"LossConfig\.max_len_norm"):
        LossConfig(agg_mode="seq-mean-token-sum-norm")
    with pytest.raises(ValueError, match=r"LossConfig\.agg_mode"):
        LossConfig(agg_mode="sum")
    with pytest.raises(ValueError, match=r"LossConfig\.dual_clip_c"):
        LossConfig(dual_clip_c=1.0)
    with pytest.raises(ValueError, match=r"LossConfig\.eps_low"):
        LossConfig(eps_low=1.5)
    with pytest.raises(ValueError, match=r"LossConfig\.kl_estimator.*k1, k2, k3"):
        LossConfig(kl_estimator="k4")
    assert (LossConfig().eps_low, LossConfig().eps_high) == (0.2, 0.2)
    b = one_token_rows([1.0], [1.0])
    with pytest.raises(ValueError, match="beta > 0 needs ref_logp"):
        losses.loss_terms(LossConfig(beta=0.1), key=KEY, **b)
    with pytest.raises(ValueError, match="needs entropies"):
        losses.loss_terms(LossConfig(top_entropy_quantile=0.2), key=KEY, **b)
