"""The scanned layer stack (ModelConfig.scan_layers) and the chunked head (ModelConfig.logits_chunk): the same
numbers as the unrolled decoder and the all-at-once head, and a train step that trains with them on."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import models
from grpo_jax import config as train_config
from grpo_jax import update
from grpo_jax.experience import Batch
from models import lora as lora_lib
from models.rope import rope_positions, text_positions

EPS32 = float(np.finfo(np.float32).eps)


def _model(remat="none", **kw):
    """A 3-layer Qwen3-style model (q/k norms, biases) with weights scaled up so attention is far from uniform."""
    cfg = models.tiny(n_layers=3, qkv_bias=True, qk_norm=True, remat=remat, **kw)
    params = models.init_params(cfg, jax.random.key(0))
    return cfg, jax.tree.map(lambda p: p * 4.0 if p.ndim == 2 else p + 0.1, params)


def _tokens(cfg, b=3, t=20):
    tokens = jax.random.randint(jax.random.key(1), (b, t), 0, cfg.vocab_size)
    return tokens, jnp.ones((b, t), bool).at[0, :5].set(False)  # row 0 left-padded, as the trainer's batches


def _loss(cfg, tokens, mask, n=9):
    """A policy-gradient-shaped loss: signed per-token weights on the completion logprobs plus an entropy bonus."""
    weights = jnp.cos(jnp.arange(n, dtype=jnp.float32))[None]
    temperature = jnp.linspace(0.6, 1.2, tokens.shape[0] * n).reshape(-1, n)  # per token, as the sampler records

    def loss(params):
        logp, ent = update.completion_logprobs(cfg, params, tokens, mask, n, temperature)
        return -jnp.mean(weights * logp) - 0.01 * jnp.mean(ent)

    return loss


def _grads(cfg, params):
    tokens, mask = _tokens(cfg)
    return jax.jit(jax.value_and_grad(_loss(cfg, tokens, mask)))(params)


def _rounding_tol(tree) -> float:
    """Two programs that sum the same terms in another order differ by a few float32 roundings of the largest
    entry; 64 ulps of the largest magnitude bounds that with room, and is ~1e5 times smaller than any gradient
    a wrong layer order or a missing layer would change."""
    return 64 * EPS32 * max(float(jnp.max(jnp.abs(x))) for x in jax.tree.leaves(tree))


@pytest.mark.parametrize("remat", ["none", "full", "dots"])
def test_scanned_forward_is_bitwise_the_unrolled_forward(remat):
    cfg, params = _model(remat)
    tokens, mask = _tokens(cfg)
    pos = rope_positions(cfg, text_positions(mask))
    fwd = lambda c: jax.jit(lambda p: models.forward(c, p, tokens, pos, attn_mask=mask)[0])(params)  # noqa: E731
    unrolled, scanned = fwd(cfg), fwd(cfg.replace(scan_layers=True))
    assert float(jnp.std(unrolled)) > 0
    np.testing.assert_array_equal(np.asarray(scanned), np.asarray(unrolled))


def test_scanned_gradients_are_bitwise_the_unrolled_ones_under_full_remat():
    """remat=full (the setting at scale) recomputes each layer from its input in both programs, so the same
    operations meet XLA in the same shape: loss and every gradient leaf are bitwise equal."""
    cfg, params = _model("full")
    (l0, g0), (l1, g1) = _grads(cfg, params), _grads(cfg.replace(scan_layers=True), params)
    assert float(l0) == float(l1)
    for a, b in zip(jax.tree.leaves(g0), jax.tree.leaves(g1)):
        np.testing.assert_array_equal(np.asarray(b), np.asarray(a))
    assert all(float(jnp.max(jnp.abs(g))) > 0 for g in jax.tree.leaves(g0))


@pytest.mark.parametrize("remat", ["none", "dots"])
def test_scanned_gradients_match_the_unrolled_ones_to_rounding(remat):
    """Without full remat XLA:CPU fuses the unrolled backward differently from the loop body's: equal loss,
    gradients equal to float32 rounding (measured: at most 2 ulps of the largest entry)."""
    cfg, params = _model(remat)
    (l0, g0), (l1, g1) = _grads(cfg, params), _grads(cfg.replace(scan_layers=True), params)
    assert float(l0) == float(l1)
    tol = _rounding_tol(g0)
    for a, b in zip(jax.tree.leaves(g0), jax.tree.leaves(g1)):
        np.testing.assert_allclose(np.asarray(b), np.asarray(a), rtol=0, atol=tol)


def test_a_scan_that_skipped_a_layer_would_be_caught():
    """The comparison above can fail: the same model with its last layer's weights changed differs far outside
    the rounding tolerance (so the scan's per-layer weight order is what the equality checks)."""
    cfg, params = _model("none")
    other = dict(params, layers=params["layers"][:-1] + [jax.tree.map(lambda x: x * 0.5, params["layers"][-1])])
    (_, g0), (_, g1) = _grads(cfg, params), _grads(cfg.replace(scan_layers=True), other)
    worst = max(float(jnp.max(jnp.abs(a - b))) for a, b in zip(jax.tree.leaves(g0), jax.tree.leaves(g1)))
    assert worst > 1e3 * _rounding_tol(g0)


@pytest.mark.parametrize("chunk", [4, 9])  # 9 = T; 4 pads T = 9 up to 12
def test_chunked_head_gives_the_same_logprobs_entropies_and_gradients(chunk):
    cfg, params = _model("none", tie_embeddings=True)
    tokens, mask = _tokens(cfg)
    temperature = jnp.linspace(0.6, 1.2, 27).reshape(3, 9)
    lp0, ent0 = update.completion_logprobs(cfg, params, tokens, mask, 9, temperature)
    chunked = cfg.replace(logits_chunk=chunk)
    lp1, ent1 = update.completion_logprobs(chunked, params, tokens, mask, 9, temperature)
    assert lp1.shape == lp0.shape == (3, 9)
    # the same head matmul per position, in slices: a log-softmax of V = 128 terms rounds within a few ulps
    np.testing.assert_allclose(np.asarray(lp1), np.asarray(lp0), rtol=0, atol=_rounding_tol(lp0))
    np.testing.assert_allclose(np.asarray(ent1), np.asarray(ent0), rtol=0, atol=_rounding_tol(ent0))
    (l0, g0), (l1, g1) = _grads(cfg, params), _grads(chunked, params)
    np.testing.assert_allclose(float(l1), float(l0), rtol=16 * EPS32)
    tol = _rounding_tol(g0)
    for a, b in zip(jax.tree.leaves(g0), jax.tree.leaves(g1)):
        assert np.all(np.isfinite(np.asarray(b)))  # the padded positions' temperature is 1, not 0
        np.testing.assert_allclose(np.asarray(b), np.asarray(a), rtol=0, atol=tol)


def test_chunked_head_keeps_lora_dropout_and_trains_the_adapters():
    """With LoRA the chunked head sits on the attached base: the adapters get gradient and dropout still draws
    from the key (two keys give two losses)."""
    cfg, base = _model("none")
    cfg = cfg.replace(logits_chunk=4)
    adapters = lora_lib.init_adapters(cfg, 4, ("q", "v", "down"), jax.random.key(2))
    adapters = jax.tree.map(lambda x: x + 0.05, adapters)  # B = 0 at init would give A no gradient
    tokens, mask = _tokens(cfg)

    def loss(ad, key):
        p = lora_lib.attach(base, ad, scale=2.0, dropout=0.3)
        return jnp.sum(update.completion_logprobs(cfg, p, tokens, mask, 9, 1.0, dropout_key=key)[0])

    g = jax.grad(loss)(adapters, jax.random.key(3))
    assert all(float(jnp.max(jnp.abs(x))) > 0 for x in jax.tree.leaves(g))
    assert float(loss(adapters, jax.random.key(3))) != float(loss(adapters, jax.random.key(4)))


def test_train_step_with_scan_and_chunked_head_moves_params_as_the_plain_step():
    """One GRPO step (update.make_train_step) with scan_layers + logits_chunk + remat=full against the plain
    model's: it trains (grad_norm > 0, params moved) and lands within rounding of the plain step's params."""
    cfg, params = _model("full")
    run = train_config.override(train_config.TrainConfig(), ["sampling.max_new_tokens=9", "prompts_per_step=1",
                                                            "sampling.group_size=3", "optim.lr=1e-2"])
    tokens, mask = _tokens(cfg)
    batch = Batch(tokens=tokens, attn_mask=mask, loss_mask=jnp.ones((3, 9), bool).at[1, 6:].set(False),
                  old_logp=jnp.full((3, 9), -4.0), advantages=jnp.array([1.0, -0.5, -0.5]),
                  temperatures=jnp.ones((3, 9)))
    out = {}
    for name, model_cfg in (("plain", cfg), ("scan", cfg.replace(scan_layers=True, logits_chunk=4))):
        opt = update.make_optimizer(run)
        state = update.initial_state(run, model_cfg, params, opt, jax.random.key(0))
        new, metrics = jax.jit(update.make_train_step(model_cfg, run, opt))(state, batch, jax.random.key(1),
                                                                             jnp.float32(0.0))
        assert float(metrics["grad_norm"]) > 0
        out[name] = (new.params, metrics)
    moved = jax.tree.map(lambda a, b: float(jnp.max(jnp.abs(a - b))), out["plain"][0], params)
    assert max(jax.tree.leaves(moved)) > 1e-3  # Adam's first step moves each weight by ~lr
    np.testing.assert_allclose(float(out["scan"][1]["grad_norm"]), float(out["plain"][1]["grad_norm"]), rtol=1e-5)
    # Adam's first update is lr * g / (|g| + eps): a rounding-level change in g moves it by ~lr * (its share), so
    # the params agree to lr-sized rounding of the normalised step; a wrong layer would move them by ~lr
    for a, b in zip(jax.tree.leaves(out["plain"][0]), jax.tree.leaves(out["scan"][0])):
        np.testing.assert_allclose(np.asarray(b), np.asarray(a), rtol=0, atol=run.optim.lr * 1e-2 + _rounding_tol(a))


def test_logits_chunk_and_scan_refused_for_a_module_of_your_own():
    with pytest.raises(ValueError, match="logits_chunk"):
        train_config.override(train_config.TrainConfig(), ["model.module=pkg.mod:Cls", "model.logits_chunk=8"])
    with pytest.raises(ValueError, match="logits_chunk"):
        models.tiny(logits_chunk=-1)
