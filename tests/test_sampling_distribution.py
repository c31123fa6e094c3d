"""The sampler draws from the distribution its reported logprobs describe: a chi-squared goodness-of-fit test
of many first-token draws against a distribution computed here, independently, from the model's logits
(temperature, top-k, top-p written from their definitions in NumPy, not with the sampler's filters).

Design: one prompt, N = 4096 completions of one token each, one fixed key. The expected first-token
distribution comes from a full forward over the prompt (no KV cache, unlike the sampler's prefill). Bins
with an expected count under 5 are pooled (the chi-squared approximation needs expected counts >= 5).

Threshold: a case passes when the p-value is > ALPHA = 1e-3. With a fixed key the test is deterministic;
ALPHA bounds the design's false-alarm rate: for a correct sampler the p-value is uniform over keys, so at
most 0.1% of keys would fail a case. The negative control (draws at temperature 1.0 tested against the
distribution at 0.7 must give p < ALPHA) shows the test has the power to see a wrong distribution.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import stats

import models
from grpo_jax import sampler
from models.rope import rope_positions, text_positions
from tests.tolerance import logprob_tol

N = 4096  # completions of the one prompt (rows drawn)
ALPHA = 1e-3  # p-value threshold (see the module docstring)
MIN_EXPECTED = 5.0  # smallest expected count per chi-squared bin
TOP_P_MARGIN = 1e-4  # cumulative masses at least this far from top_p: float32 vs float64 cannot disagree


@pytest.fixture(scope="module")
def model():
    """(cfg, params, prompt [1, 8], float64 next-token logits [V]) of a tiny random model whose
    first-token distribution is spread over tens of tokens: 2-D weights x8 as in tests/test_sampler.py,
    the LM head x3 more (at init every logit is ~0 and the distribution near uniform over all 128 tokens)."""
    cfg = models.tiny(qkv_bias=True)
    params = models.init_params(cfg, jax.random.key(0))
    params = jax.tree.map(lambda p: p * 8.0 if p.ndim == 2 else p, params)
    params["lm_head"] = params["lm_head"] * 3.0
    prompt = jnp.asarray(np.random.RandomState(1).randint(3, cfg.vocab_size, (1, 8)))  # a full bucket: no padding
    mask = jnp.ones_like(prompt, bool)
    logits, _ = models.forward(cfg, params, prompt, rope_positions(cfg, text_positions(mask)), attn_mask=mask)
    return cfg, params, prompt, np.asarray(logits[0, -1], np.float64)


def softmax(z: np.ndarray) -> np.ndarray:
    e = np.exp(z - z.max())
    return e / e.sum()


def expected_probs(logits: np.ndarray, *, temperature: float, top_k: int = 0, top_p: float = 1.0) -> np.ndarray:
    """The sampling distribution from its definition: softmax(logits / temperature); top-k keeps the k most
    likely tokens; top-p then keeps the smallest set of most likely tokens whose total probability (under
    the top-k distribution) reaches top_p; each filter renormalises what it keeps. Float64."""
    probs = softmax(logits / temperature)
    if top_k > 0:
        keep = np.zeros(probs.shape, bool)
        keep[np.argsort(-probs, kind="stable")[:top_k]] = True
        probs = np.where(keep, probs, 0.0) / probs[keep].sum()
    if top_p < 1.0:
        order = np.argsort(-probs, kind="stable")
        cum = np.cumsum(probs[order])
        n_keep = int(np.argmax(cum >= top_p)) + 1  # first prefix whose mass reaches top_p
        assert np.abs(cum[max(n_keep - 2, 0) : n_keep] - top_p).min() > TOP_P_MARGIN, "top_p too close to a boundary"
        keep = np.zeros(probs.shape, bool)
        keep[order[:n_keep]] = True
        probs = np.where(keep, probs, 0.0) / probs[keep].sum()
    return probs


def pooled_bins(counts: np.ndarray, probs: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray]:
    """(observed, expected) counts over the support of `probs`: tokens with expected count >= MIN_EXPECTED
    get a bin each; the rest share one bin, merged into the smallest other bin if still under MIN_EXPECTED."""
    support = probs > 0
    expected = n * probs
    big = support & (expected >= MIN_EXPECTED)
    obs, exp = list(counts[big]), list(expected[big])
    small = support & ~big
    if small.any():
        pool_obs, pool_exp = counts[small].sum(), expected[small].sum()
        if pool_exp >= MIN_EXPECTED:
            obs.append(pool_obs)
            exp.append(pool_exp)
        else:
            i = int(np.argmin(exp))
            obs[i] += pool_obs
            exp[i] += pool_exp
    return np.asarray(obs, np.float64), np.asarray(exp, np.float64)


def first_tokens(model, *, temperature: float, top_k: int = 0, top_p: float = 1.0, seed: int = 0):
    """(tokens [N], reported logprobs [N]) of the first completion token of N draws for the one prompt."""
    cfg, params, prompt, _ = model
    ro = sampler.sample(cfg, params, prompt, jnp.ones_like(prompt), key=jax.random.key(seed), group_size=N,
                        max_new_tokens=1, temperature=temperature, top_k=top_k, top_p=top_p)
    return np.asarray(ro.tokens[0, :, 0]), np.asarray(ro.logprobs[0, :, 0], np.float64)


def goodness_of_fit(tokens: np.ndarray, probs: np.ndarray) -> float:
    """Chi-squared p-value of the drawn tokens against `probs`; a token outside its support is a failure."""
    counts = np.bincount(tokens, minlength=probs.size)
    outside = counts[probs == 0].sum()
    assert outside == 0, f"{outside} draws of tokens the filters remove"
    obs, exp = pooled_bins(counts, probs, tokens.size)
    assert len(obs) >= 2, "a single bin tests nothing"
    return float(stats.chisquare(obs, exp).pvalue)


CASES = {
    "temperature_0.7": {"temperature": 0.7},
    "temperature_1.5": {"temperature": 1.5},
    "top_k": {"temperature": 1.0, "top_k": 8},
    "top_p": {"temperature": 1.0, "top_p": 0.8},
    "temperature_top_k_top_p": {"temperature": 1.3, "top_k": 20, "top_p": 0.9},
}


@pytest.mark.parametrize("name", list(CASES))
def test_draws_follow_the_reported_distribution(model, name):
    settings = CASES[name]
    probs = expected_probs(model[3], **settings)
    support = probs > 0
    bins = int((N * probs >= MIN_EXPECTED).sum())
    # the design is non-degenerate: several tokens carry mass, none dominates
    assert bins >= 5 and probs.max() < 0.9, (bins, probs.max())
    if settings.get("top_k", 0) or settings.get("top_p", 1.0) < 1.0:
        assert 2 <= support.sum() < probs.size  # the filter removed tokens, and left a choice
    tokens, logprobs = first_tokens(model, **settings)
    p_value = goodness_of_fit(tokens, probs)
    print(f"\n{name}: {bins} bins of expected count >= {MIN_EXPECTED:g}, support {support.sum()}, p = {p_value:.3g}")
    assert p_value > ALPHA
    # |reported logprob - log expected probability|: the sampler's prefill and this full forward compute the same
    # logits in another order, then each its float32 log-softmax (tests/tolerance.logprob_tol of logits / T)
    tol = logprob_tol(model[3] / settings["temperature"], model[0])
    assert np.abs(logprobs - np.log(probs[tokens])).max() <= tol


def test_negative_control_wrong_temperature_is_detected(model):
    """Draws at temperature 1.0 tested against the distribution at 0.7: the test must reject them."""
    tokens, _ = first_tokens(model, temperature=1.0)
    p_value = goodness_of_fit(tokens, expected_probs(model[3], temperature=0.7))
    print(f"\nnegative control: p = {p_value:.3g}")
    assert p_value < ALPHA
