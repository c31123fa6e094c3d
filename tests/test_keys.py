"""PRNG keys of both kinds: every public entry point that takes a `key` accepts a typed key
(`jax.random.key(s)`) and a legacy uint32[2] key (`jax.random.PRNGKey(s)`), and the same seed gives the same
result either way (`models.keys.as_typed_key`)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import models
from grpo_jax import sampler
from models.keys import as_typed_key, is_typed_key

SEEDS = (0, 7)


def _model():
    """The tiny random model of tests/test_sampler.py: 2-D weights scaled up so the next-token
    distributions are peaked enough that different keys draw different tokens."""
    cfg = models.tiny(qkv_bias=True)
    params = models.init_params(cfg, jax.random.key(0))
    return cfg, jax.tree.map(lambda p: p * 8.0 if p.ndim == 2 else p, params)


def _prompts():
    tokens = np.random.RandomState(1).randint(3, 128, (2, 6))
    mask = np.ones((2, 6), np.int32)
    mask[1, :2] = 0  # a shorter, left-padded prompt
    return jnp.asarray(tokens), jnp.asarray(mask)


@pytest.mark.parametrize("seed", SEEDS)
def test_both_kinds_of_key_hold_the_same_bits(seed):
    """Why the equalities below can hold: under the default threefry implementation a typed key is a
    wrapper around exactly the uint32[2] a legacy key is."""
    typed, legacy = jax.random.key(seed), jax.random.PRNGKey(seed)
    assert is_typed_key(typed) and not is_typed_key(legacy)
    assert legacy.dtype == jnp.uint32 and legacy.shape == (2,)
    np.testing.assert_array_equal(jax.random.key_data(typed), legacy)
    converted = as_typed_key(legacy)
    assert is_typed_key(converted) and converted.shape == ()
    np.testing.assert_array_equal(jax.random.key_data(converted), legacy)
    assert as_typed_key(typed) is typed


def test_as_typed_key_keeps_batch_shape_and_works_under_jit():
    legacy = jax.random.split(jax.random.PRNGKey(3), 4)  # uint32[4, 2]
    assert legacy.shape == (4, 2)
    typed = as_typed_key(legacy)
    assert typed.shape == (4,)
    np.testing.assert_array_equal(jax.random.key_data(typed), legacy)
    # a legacy key traced under jit: the same draw as the typed key outside it
    draw = jax.jit(lambda k: jax.random.uniform(as_typed_key(k), (3,)))
    np.testing.assert_array_equal(draw(jax.random.PRNGKey(5)), jax.random.uniform(jax.random.key(5), (3,)))


@pytest.mark.parametrize("seed", SEEDS)
def test_row_keys_same_for_both_kinds(seed):
    ids = jnp.arange(3, dtype=jnp.int32)
    typed = sampler.row_keys(jax.random.key(seed), ids, 4)
    legacy = sampler.row_keys(jax.random.PRNGKey(seed), ids, 4)
    assert typed.shape == legacy.shape == (12,)  # one key per (prompt, completion) row, not 2 per row
    np.testing.assert_array_equal(jax.random.key_data(legacy), jax.random.key_data(typed))


def _rollouts_equal(a: sampler.Rollout, b: sampler.Rollout) -> None:
    for name in ("tokens", "completion_mask", "lengths", "logprobs", "entropies"):
        np.testing.assert_array_equal(np.asarray(getattr(a, name)), np.asarray(getattr(b, name)), err_msg=name)


def test_sample_same_tokens_for_both_kinds():
    """sample with PRNGKey(s) == sample with key(s), for two seeds; the two seeds differ from each other
    (so equality is not the trivial equality of a rollout that ignores its key)."""
    cfg, params = _model()
    prompt, mask = _prompts()
    kw = {"group_size": 4, "max_new_tokens": 6, "temperature": 1.0, "eos_ids": (3,)}
    outs = []
    for seed in SEEDS:
        typed = sampler.sample(cfg, params, prompt, mask, key=jax.random.key(seed), **kw)
        legacy = sampler.sample(cfg, params, prompt, mask, key=jax.random.PRNGKey(seed), **kw)
        _rollouts_equal(legacy, typed)
        outs.append(np.asarray(typed.tokens))
    assert (outs[0] != outs[1]).any()


def test_sample_pmap_and_sample_core_same_for_both_kinds():
    cfg, params = _model()
    prompt, mask = _prompts()
    kw = {"group_size": 2, "max_new_tokens": 4, "temperature": 1.0}
    typed = sampler.sample_pmap(cfg, params, prompt, mask, key=jax.random.key(2), devices=jax.local_devices()[:1],
                                **kw)
    legacy = sampler.sample_pmap(cfg, params, prompt, mask, key=jax.random.PRNGKey(2),
                                 devices=jax.local_devices()[:1], **kw)
    _rollouts_equal(legacy, typed)
    tokens, tmask = sampler.prepare_prompts(prompt, mask)
    ids = jnp.arange(tokens.shape[0], dtype=jnp.int32)
    core = sampler.sample_core(cfg, params, tokens, tmask, ids, key=jax.random.PRNGKey(2), **kw)
    _rollouts_equal(core, typed)


def test_init_params_same_for_both_kinds():
    cfg = models.tiny(qkv_bias=True)
    typed = models.init_params(cfg, jax.random.key(4))
    legacy = models.init_params(cfg, jax.random.PRNGKey(4))
    assert jax.tree.structure(typed) == jax.tree.structure(legacy)
    for a, b in zip(jax.tree.leaves(typed), jax.tree.leaves(legacy)):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    other = models.init_params(cfg, jax.random.PRNGKey(5))
    assert (np.asarray(other["embed"]) != np.asarray(legacy["embed"])).any()
