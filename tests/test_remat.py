"""Gradient checkpointing (ModelConfig.remat): same loss and gradients as without it, a checkpoint in the
differentiated program only when asked for, validation, and no effect on HF configs, hashing or sampling."""

from __future__ import annotations

import importlib.util
import json
import os

import jax
import jax.extend.core
import jax.numpy as jnp
import numpy as np
import pytest

import models
from grpo_jax import config as train_config
from grpo_jax import sampler, train, update
from models import hf, layers
from models.config import REMAT_MODES
from tests.tolerance import rounding_tol

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _setup(remat="none", n_layers=3, seed=0):
    """A small random Qwen2-style model (bias, tied) with weights scaled up so attention is far from
    uniform and a wrong recomputation would show in the gradients."""
    cfg = models.tiny(n_layers=n_layers, qkv_bias=True, tie_embeddings=True, remat=remat)
    params = models.init_params(cfg, jax.random.key(seed))
    params = jax.tree.map(lambda p: p * 4.0 if p.ndim == 2 else p + 0.1, params)
    return cfg, params


def _batch(cfg, b=2, t=12, seed=1):
    """Tokens [B, T] with the first row left-padded by 3, as the trainer's batches are."""
    tokens = jax.random.randint(jax.random.key(seed), (b, t), 0, cfg.vocab_size)
    mask = jnp.ones((b, t), bool).at[0, :3].set(False)
    return tokens, mask


def _loss_fn(cfg, tokens, mask, n_completion):
    """A policy-gradient-shaped loss on the training forward (update.completion_logprobs): per-token
    weights of both signs on the completion logprobs plus an entropy bonus, so every layer gets gradient."""
    weights = jnp.cos(jnp.arange(n_completion, dtype=jnp.float32))[None]

    def loss(params):
        logp, ent = update.completion_logprobs(cfg, params, tokens, mask, n_completion, 0.9)
        return -jnp.mean(weights * logp) - 0.01 * jnp.mean(ent)

    return loss


def _value_and_grad(cfg, params, t):
    tokens, mask = _batch(cfg, t=t)
    return jax.jit(jax.value_and_grad(_loss_fn(cfg, tokens, mask, n_completion=t // 2)))(params)


@pytest.mark.parametrize("t", [12, 2 * layers.CAUSAL_BLOCK + 8])  # dense attention, then the blocked path
@pytest.mark.parametrize("mode", ["full", "dots"])
def test_remat_gives_the_same_loss_and_gradients(mode, t):
    cfg, params = _setup()
    loss0, grads0 = _value_and_grad(cfg, params, t)
    loss1, grads1 = _value_and_grad(cfg.replace(remat=mode), params, t)
    # the same sums in another fusion: rounding only, relative to the magnitudes involved (tests/tolerance.py). The
    # loss is a mean of per-token logprobs weighted by |w| <= 1 (and a 0.01 entropy term): its terms are at most
    # the largest |logprob|, which bounds it however much the signs of w cancel in the mean.
    tokens, mask = _batch(cfg, t=t)
    logp, _ = update.completion_logprobs(cfg, params, tokens, mask, t // 2, 0.9)
    assert abs(float(loss1) - float(loss0)) <= rounding_tol(logp)
    flat0, tree0 = jax.tree.flatten_with_path(grads0)
    flat1, tree1 = jax.tree.flatten_with_path(grads1)
    assert tree0 == tree1
    worst = {jax.tree_util.keystr(k): float(jnp.max(jnp.abs(a - b))) for (k, a), (_, b) in zip(flat0, flat1)}
    assert max(worst.values()) <= rounding_tol(grads0), sorted(worst.items(), key=lambda kv: -kv[1])[:3]
    norms = [float(jnp.linalg.norm(g)) for _, g in flat0]
    assert max(norms) > 1e-3  # the comparison is not between two zero gradients
    layer_norms = [float(jnp.linalg.norm(g["qkv"])) for g in grads0["layers"]]
    assert min(layer_norms) > 0  # every checkpointed layer is on the gradient path


def _remat_eqns(jaxpr) -> list:
    """The checkpoint equations (primitive `remat2`, printed `checkpoint` by some JAX versions) of a
    jaxpr, searched through nested jaxprs (pjit, custom_vjp, ...)."""
    found = []
    for eqn in jaxpr.eqns:
        if "remat" in eqn.primitive.name or "checkpoint" in eqn.primitive.name:
            found.append(eqn)
        for sub in jax.extend.core.jaxprs_in_params(eqn.params):
            found += _remat_eqns(sub)
    return found


def _grad_program(mode):
    cfg, params = _setup(remat=mode, n_layers=2)
    tokens, mask = _batch(cfg)
    grad_fn = jax.grad(_loss_fn(cfg, tokens, mask, n_completion=6))
    return jax.make_jaxpr(grad_fn)(params), jax.jit(grad_fn).lower(params).as_text()


@pytest.mark.parametrize("mode, policy", [
    ("full", jax.checkpoint_policies.nothing_saveable),
    ("dots", jax.checkpoint_policies.dots_with_no_batch_dims_saveable),
])
def test_remat_puts_one_checkpoint_per_layer_in_the_grad_program(mode, policy):
    jaxpr, hlo = _grad_program(mode)
    eqns = _remat_eqns(jaxpr.jaxpr)
    assert len(eqns) == 2, [e.primitive.name for e in eqns]  # one per decoder layer
    assert all(e.params["policy"] == policy for e in eqns)
    assert "optimization_barrier" in hlo  # the backward pass recomputes the layer behind a barrier


def test_no_remat_has_no_checkpoint():
    jaxpr, hlo = _grad_program("none")
    assert not _remat_eqns(jaxpr.jaxpr)
    assert "optimization_barrier" not in hlo


def test_invalid_remat_is_an_error_naming_the_field():
    with pytest.raises(ValueError, match=r"ModelConfig\.remat must be one of .*'none'.*'full'.*'dots'.*'partial'"):
        models.tiny(remat="partial")
    with pytest.raises(ValueError, match=r"ModelSpec\.remat: unknown value 'partial'; known: none, full, dots"):
        train_config.override(train_config.TrainConfig(), ["model.remat=partial"])


def test_train_config_accepts_remat_from_the_models_own_mode_list():
    cfg = train_config.override(train_config.TrainConfig(), ["model.remat=full"])
    assert cfg.model.remat == "full" and train_config.TrainConfig().model.remat == "none"
    assert train_config.from_dict(train_config.TrainConfig, train_config.to_dict(cfg)) == cfg
    assert train_config.REMAT_MODES is REMAT_MODES  # one list, read from models.config, not a copy


def test_remat_config_is_hashable_and_a_distinct_static_argument():
    a, b = models.tiny(), models.tiny(remat="full")
    assert a != b and a == models.tiny(remat="none") and hash(a) == hash(models.tiny())
    assert len({a, b, models.tiny(remat="dots")}) == 3
    traced = []

    @jax.jit
    def f(x):
        return x

    g = jax.jit(lambda cfg, x: traced.append(cfg.remat) or f(x), static_argnums=0)
    g(a, 1.0), g(b, 1.0), g(a, 2.0)
    assert traced == ["none", "full"]  # one trace per remat mode, the cached one reused


def test_remat_is_not_written_to_hf_configs_and_loads_as_none(tmp_path):
    cfg, params = _setup(remat="dots", n_layers=1)
    cfg = cfg.replace(arch="qwen2")
    written = hf.config_to_hf(cfg)
    assert written == hf.config_to_hf(cfg.replace(remat="none"))
    assert "remat" not in json.dumps(written)
    assert hf.config_from_hf(written).remat == "none"
    models.save_hf(cfg, params, str(tmp_path / "ckpt"))
    loaded, _ = models.load_hf(str(tmp_path / "ckpt"))
    # config.json gives a model without a positions count of its own the default one, which loads back
    assert loaded.remat == "none" and loaded == cfg.replace(remat="none", max_positions=hf.HF_DEFAULT_POSITIONS)


def test_sampling_is_unchanged_by_remat():
    cfg, params = _setup(n_layers=2)
    prompt = jax.random.randint(jax.random.key(3), (2, 5), 1, cfg.vocab_size)
    mask = jnp.ones((2, 5), bool).at[1, :2].set(False)
    kw = {"key": jax.random.key(4), "group_size": 2, "max_new_tokens": 6, "temperature": 1.0}
    base = sampler.sample(cfg, params, prompt, mask, **kw)
    for mode in ("full", "dots"):
        got = sampler.sample(cfg.replace(remat=mode), params, prompt, mask, **kw)
        np.testing.assert_array_equal(np.asarray(got.tokens), np.asarray(base.tokens))
        np.testing.assert_array_equal(np.asarray(got.logprobs), np.asarray(base.logprobs))


def test_bench_remat_smoke_reports_every_mode(tmp_path):
    """experiments/bench/bench_remat.py --smoke (compile only): one row per mode with XLA's figures, and JAX's
    residuals shrink under checkpointing (what XLA then keeps is the backend's plan, PERF.md #22)."""
    spec = importlib.util.spec_from_file_location("bench_remat",
                                                  os.path.join(ROOT, "experiments", "bench", "bench_remat.py"))
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    rows = bench.main(["--smoke", "--repeats", "0", "--out", str(tmp_path / "out.json")])
    by_mode = {r["remat"]: r for r in rows}
    assert list(by_mode) == ["none", "full", "dots"]
    assert all(r["temp_size_in_bytes"] > 0 and r["argument_size_in_bytes"] > 0 for r in rows)
    assert by_mode["full"]["residual_bytes"] < by_mode["dots"]["residual_bytes"] < by_mode["none"]["residual_bytes"]
    assert json.loads((tmp_path / "out.json").read_text())["rows"] == rows


def test_model_remat_reaches_the_trainer_and_leaves_its_step_unchanged(tmp_path):
    """`--set model.remat=full` reaches the model the Trainer builds, and one real update (a length reward
    gives grad_norm > 0) has the same loss and gradient norm as without it, and the same params measured
    against the update: the recomputed forward sums in another order, and Adam turns that noise on an element
    whose gradient is ~0 into a visible fraction of a step (1e-6 on one of 4,096 elements on some CPUs)."""
    from tests.test_train import _assert_same_update, signal_config, step_tols

    out = {}
    for mode in ("none", "full"):
        tr = train.Trainer(signal_config("steps=1", f"model.remat={mode}"), str(tmp_path / mode), quiet=True)
        assert tr.actor.model_cfg.remat == mode
        initial = [np.asarray(x) for x in jax.tree.leaves(tr.state.params)]
        params = jax.tree.map(np.asarray, tr.policy_params())  # a copy: the step donates the state
        step = tr.step_once()
        metrics = step.metrics
        assert metrics["grad_norm"] > 0
        out[mode] = (metrics, initial, [np.asarray(x) for x in jax.tree.leaves(tr.state.params)])
        if mode == "none":
            loss_tol, _ = step_tols(tr, params, step)  # the same step in another float32 program
    (m0, i0, p0), (m1, i1, p1) = out["none"], out["full"]
    np.testing.assert_allclose(m1["loss"], m0["loss"], rtol=0, atol=loss_tol)
    np.testing.assert_allclose(m1["grad_norm"], m0["grad_norm"], rtol=1e-5)
    for a, b in zip(i1, i0):  # the same start, so the comparison below is of the updates
        np.testing.assert_array_equal(a, b)
    _assert_same_update(p1, p0, i0, lr=tr.cfg.optim.lr)
