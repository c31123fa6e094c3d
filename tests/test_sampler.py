"""Sampler properties: logprobs == teacher forcing, greedy == argmax of full forwards, EOS masking,
top-k/top-p support, determinism, pmap/mesh == single device, bounded compilation."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import models
from grpo_jax import sampler
from grpo_jax.experience import full_sequences
from grpo_jax.sampler import process_logits, sample
from models.rope import rope_positions
from tests.tolerance import entropy_tol, logprob_tol


def _model(rope_kind="rope", scale=8.0, seed=0):
    extra = {"mrope": dict(mrope_sections=(2, 3, 3)), "rope2d": {}, "rope": {}}[rope_kind]
    cfg = models.tiny(rope_kind=rope_kind, qkv_bias=True, **extra)
    params = models.init_params(cfg, jax.random.key(seed))
    # larger weights -> peaked next-token distributions, so top-k/top-p and greedy are non-trivial
    return cfg, jax.tree.map(lambda p: p * scale if p.ndim == 2 else p, params)


def _prompts(b=3, p=6, seed=1, vocab=128):
    tokens = np.random.RandomState(seed).randint(3, vocab, (b, p))
    mask = np.ones((b, p), np.int32)
    mask[1, :2] = 0  # a shorter, left-padded prompt
    mask[-1, :4] = 0
    return jnp.asarray(tokens), jnp.asarray(mask)


def _teacher_forced_logits(cfg, params, prompt, mask, rollout):
    """Logits predicting each completion token, from one full forward over prompt + completion."""
    seq, seq_mask = full_sequences(rollout)
    p = rollout.prompt_tokens.shape[1]
    pos = jnp.maximum(jnp.cumsum(seq_mask, axis=-1) - 1, 0)
    logits = jax.jit(lambda s, q, m: models.forward(cfg, params, s, q, attn_mask=m)[0])(
        seq, rope_positions(cfg, pos), seq_mask)
    t = rollout.tokens.shape[-1]
    return logits[:, p - 1 : p - 1 + t].reshape(rollout.tokens.shape + (cfg.vocab_size,))


@pytest.mark.parametrize("rope_kind, temperature, top_k, top_p", [
    ("rope", 1.0, 0, 1.0),
    ("rope", 0.7, 0, 1.0),
    ("rope", 1.3, 20, 0.9),
    ("mrope", 1.0, 0, 1.0),
    ("rope2d", 0.8, 0, 1.0),
])
def test_logprobs_equal_teacher_forcing(rope_kind, temperature, top_k, top_p):
    cfg, params = _model(rope_kind)
    prompt, mask = _prompts()
    ro = sample(cfg, params, prompt, mask, key=jax.random.key(0), group_size=4, max_new_tokens=10,
                temperature=temperature, top_k=top_k, top_p=top_p, eos_ids=(3, 4, 5))
    logits = _teacher_forced_logits(cfg, params, prompt, mask, ro)
    dist = process_logits(logits, temperature=temperature, top_k=top_k, top_p=top_p)
    logp = jax.nn.log_softmax(dist, axis=-1)
    want = jnp.take_along_axis(logp, ro.tokens[..., None], axis=-1)[..., 0]
    m = ro.completion_mask.astype(bool)
    # the sampler's cached decode against one full forward: two float32 computations of the same logits
    # (forward_tol), through the same filters and log-softmax (tests/tolerance.logprob_tol, entropy_tol; bounded
    # with the unfiltered logits / T: all V entries, the larger entropy)
    dist_m = np.asarray(logits)[np.asarray(m)] / temperature
    assert np.abs(np.asarray(ro.logprobs - want))[np.asarray(m)].max() <= logprob_tol(dist_m, cfg)
    p = jnp.exp(logp)
    want_ent = -jnp.sum(jnp.where(p > 0, p * logp, 0.0), axis=-1)
    assert np.abs(np.asarray(ro.entropies - want_ent))[np.asarray(m)].max() <= entropy_tol(dist_m, cfg)
    assert np.all(np.asarray(ro.logprobs)[~np.asarray(m)] == 0)


def test_per_token_temperature_logprobs_match_the_distribution_used():
    """Positions whose entropy is under the floor are sampled hotter; the stored logprobs are those of the
    boosted distribution, and Rollout.temperatures says which temperature each token used."""
    cfg, params = _model(scale=8.0)
    prompt, mask = _prompts()
    ro = sample(cfg, params, prompt, mask, key=jax.random.key(4), group_size=4, max_new_tokens=8,
                temperature=0.8, token_temperature=(3.0, 1.5, 1.1))
    temps = np.asarray(ro.temperatures)[np.asarray(ro.completion_mask) > 0]
    assert set(np.round(temps.astype(np.float64), 5).tolist()) == {0.8, 1.1}  # both the base and the boosted min(0.8 * 1.5, 1.1) occur
    logits = _teacher_forced_logits(cfg, params, prompt, mask, ro)
    logp = jax.nn.log_softmax(logits / ro.temperatures[..., None], axis=-1)
    want = jnp.take_along_axis(logp, ro.tokens[..., None], axis=-1)[..., 0]
    m = np.asarray(ro.completion_mask).astype(bool)
    # cached decode against one full forward at each token's temperature (tests/tolerance.logprob_tol)
    tol = logprob_tol(np.asarray(logits / ro.temperatures[..., None])[m], cfg)
    assert np.abs(np.asarray(ro.logprobs - want))[m].max() <= tol
    # boosted exactly where the base-temperature entropy is under the floor
    base_logp = jax.nn.log_softmax(logits / 0.8, axis=-1)
    base_entropy = -jnp.sum(jnp.exp(base_logp) * base_logp, axis=-1)
    np.testing.assert_array_equal(np.asarray(ro.temperatures)[m] > 0.9, np.asarray(base_entropy)[m] < 3.0)


def test_greedy_equals_argmax_of_full_forward():
    cfg, params = _model()
    prompt, mask = _prompts()
    n = 8
    ro = sample(cfg, params, prompt, mask, key=jax.random.key(0), group_size=2, max_new_tokens=n, temperature=0.0)
    tokens, tmask = sampler.prepare_prompts(prompt, mask)
    p = tokens.shape[1]
    # A fixed-width buffer filled one argmax at a time; causality makes the unfilled tail irrelevant.
    seq = jnp.concatenate([tokens, jnp.zeros((tokens.shape[0], n), jnp.int32)], axis=1)
    seq_mask = jnp.concatenate([tmask, jnp.ones((tokens.shape[0], n), bool)], axis=1)
    pos = jnp.maximum(jnp.cumsum(seq_mask, axis=-1) - 1, 0)
    full = jax.jit(lambda s: models.forward(cfg, params, s, pos, attn_mask=seq_mask)[0])
    for i in range(n):
        seq = seq.at[:, p + i].set(jnp.argmax(full(seq)[:, p + i - 1], axis=-1))
    want = np.asarray(seq[:, p:])
    got = np.asarray(ro.tokens)
    assert (got[:, 0] == want).all() and (got[:, 1] == want).all()  # both group members are the argmax path


def test_eos_masks_everything_after_it():
    cfg, params = _model(scale=2.0)
    prompt, mask = _prompts(b=4)
    eos = tuple(range(3, 40))  # ~30% of the vocabulary: most rows stop early, some run to the end
    ro = sample(cfg, params, prompt, mask, key=jax.random.key(5), group_size=8, max_new_tokens=6, eos_ids=eos,
                pad_id=0)
    toks, m = np.asarray(ro.tokens), np.asarray(ro.completion_mask)
    lengths, trunc = np.asarray(ro.lengths), np.asarray(ro.truncated)
    is_eos = np.isin(toks, eos)
    assert trunc.any() and (~trunc).any()  # both cases are exercised
    for b in range(toks.shape[0]):
        for g in range(toks.shape[1]):
            hits = np.flatnonzero(is_eos[b, g])
            if hits.size:
                n = hits[0] + 1
                assert not trunc[b, g] and lengths[b, g] == n
                assert (toks[b, g, n:] == 0).all()
            else:
                assert trunc[b, g] and lengths[b, g] == 6
            assert m[b, g].tolist() == [1] * lengths[b, g] + [0] * (6 - lengths[b, g])


def test_decoding_stops_early_when_all_rows_finish():
    cfg, params = _model()
    prompt, mask = _prompts()
    everything = tuple(range(cfg.vocab_size))  # the first token always ends the row
    ro = sample(cfg, params, prompt, mask, key=jax.random.key(0), group_size=2, max_new_tokens=50,
                eos_ids=everything)
    assert np.asarray(ro.lengths).max() == 1 and not np.asarray(ro.truncated).any()


@pytest.mark.parametrize("top_k, top_p", [(5, 1.0), (0, 0.5)])
def test_top_k_top_p_never_sample_outside_the_allowed_set(top_k, top_p):
    cfg, params = _model(scale=3.0)
    prompt, mask = _prompts(b=2)
    ro = sample(cfg, params, prompt, mask, key=jax.random.key(7), group_size=64, max_new_tokens=4,
                top_k=top_k, top_p=top_p)
    raw = _teacher_forced_logits(cfg, params, prompt, mask, ro)
    allowed = process_logits(raw, temperature=1.0, top_k=top_k, top_p=top_p) > -1e29
    picked = np.asarray(jnp.take_along_axis(allowed, ro.tokens[..., None], axis=-1)[..., 0])
    assert picked.all()
    sizes = np.asarray(allowed.sum(-1))
    assert sizes.min() >= 1 and sizes.max() < cfg.vocab_size  # the filter really removed tokens
    if top_k:
        assert sizes.max() == top_k


def test_filters_on_hand_made_logits():
    logits = jnp.log(jnp.array([0.5, 0.2, 0.15, 0.1, 0.05]))
    # top-p 0.7: mass before each sorted token = 0, .5, .7, ... -> keep the first two (0.5 + 0.2 >= 0.7)
    assert (sampler.top_p_filter(logits, 0.7) > -1e29).tolist() == [True, True, False, False, False]
    assert (sampler.top_p_filter(logits, 0.3) > -1e29).tolist() == [True, False, False, False, False]
    assert (sampler.top_k_filter(logits, 3) > -1e29).tolist() == [True, True, True, False, False]


def test_determinism_and_key_sensitivity():
    cfg, params = _model(scale=2.0)
    prompt, mask = _prompts()
    kw = dict(group_size=4, max_new_tokens=8)
    a = sample(cfg, params, prompt, mask, key=jax.random.key(1), **kw)
    b = sample(cfg, params, prompt, mask, key=jax.random.key(1), **kw)
    c = sample(cfg, params, prompt, mask, key=jax.random.key(2), **kw)
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
    assert (np.asarray(a.tokens) != np.asarray(c.tokens)).any()
    # group members differ from each other (each row has its own key)
    assert (np.asarray(a.tokens)[:, 0] != np.asarray(a.tokens)[:, 1]).any()


def test_right_padded_prompts_equal_left_padded():
    cfg, params = _model()
    prompt, mask = _prompts()
    right_tok, right_mask = np.array(prompt), np.array(mask)
    for i in range(right_tok.shape[0]):
        n = int(right_mask[i].sum())
        right_tok[i] = np.concatenate([right_tok[i][right_mask[i] > 0], np.zeros(6 - n, int)])
        right_mask[i] = np.arange(6) < n
    kw = dict(key=jax.random.key(3), group_size=2, max_new_tokens=5)
    a = sample(cfg, params, prompt, mask, **kw)
    b = sample(cfg, params, jnp.asarray(right_tok), jnp.asarray(right_mask), **kw)
    np.testing.assert_array_equal(np.asarray(a.tokens), np.asarray(b.tokens))


def test_decode_compiles_once_per_bucket():
    cfg, params = _model()
    kw = dict(key=jax.random.key(0), group_size=2, max_new_tokens=4)
    sampler._decode.clear_cache()  # other tests may already have compiled these shapes
    before = sampler._decode._cache_size()
    for p in (5, 7, 8):  # all in the 8-wide bucket
        tokens = jnp.ones((2, p), jnp.int32) * 9
        sample(cfg, params, tokens, jnp.ones((2, p), jnp.int32), **kw)
    assert sampler._decode._cache_size() == before + 1
    sample(cfg, params, jnp.ones((2, 9), jnp.int32), jnp.ones((2, 9), jnp.int32), **kw)  # bucket 16
    assert sampler._decode._cache_size() == before + 2
    sample(cfg, params, jnp.ones((2, 9), jnp.int32), jnp.ones((2, 9), jnp.int32), temperature=0.3, **kw)
    assert sampler._decode._cache_size() == before + 2  # temperature is traced: no recompile


def test_bad_arguments_are_named():
    cfg, params = _model()
    prompt, mask = _prompts()
    for kw, word in [(dict(group_size=0), "group_size"), (dict(top_p=0.0), "top_p"), (dict(top_k=-1), "top_k"),
                     (dict(temperature=-1.0), "temperature"), (dict(max_new_tokens=0), "max_new_tokens")]:
        args = dict(key=jax.random.key(0), group_size=2, max_new_tokens=3) | kw
        with pytest.raises(ValueError, match=word):
            sample(cfg, params, prompt, mask, **args)


MULTI_DEVICE = textwrap.dedent("""
    import json, sys
    import jax, jax.numpy as jnp, numpy as np
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
    import models
    from grpo_jax import sampler
    from grpo_jax.sampler import sample, sample_pmap
    assert jax.device_count() == 8, jax.devices()
    cfg = models.tiny(n_heads=4, n_kv_heads=4, qkv_bias=True)
    params = jax.tree.map(lambda p: p * 4.0 if p.ndim == 2 else p, models.init_params(cfg, jax.random.key(0)))
    tokens = jnp.asarray(np.random.RandomState(0).randint(3, 128, (8, 6)))
    mask = jnp.ones((8, 6), jnp.int32).at[1, :3].set(0)
    kw = dict(key=jax.random.key(11), group_size=4, max_new_tokens=12, eos_ids=(3, 4, 5, 6))
    single = sample(cfg, jax.device_put(params, jax.devices()[0]), tokens, mask, **kw)
    pm = sample_pmap(cfg, params, tokens, mask, **kw)
    mesh = Mesh(np.array(jax.devices()).reshape(2, 4), ("data", "tensor"))
    def spec(x):  # shard matrices over 'tensor' on their output dim, replicate vectors
        return NamedSharding(mesh, P(None, "tensor") if x.ndim == 2 else P())
    sharded_params = jax.tree.map(lambda x: jax.device_put(x, spec(x)), params)
    batch = NamedSharding(mesh, P("data", None))
    sh = sample(cfg, sharded_params, jax.device_put(tokens, batch), jax.device_put(mask, batch), **kw)
    # replicated params, rows over all 8 devices: the shard_map path (one decode loop per device)
    data = Mesh(np.array(jax.devices()), ("data",))
    rows, rep = NamedSharding(data, P("data")), NamedSharding(data, P())
    rep_params = jax.device_put(params, rep)
    row_tokens, row_mask = jax.device_put(tokens, rows), jax.device_put(mask, rows)
    split = sampler.row_shard_axes(row_tokens, rep_params)
    sm = sample(cfg, rep_params, row_tokens, row_mask, **kw)
    n_compiled = sampler._row_sharded.cache_info().currsize
    sample(cfg, rep_params, row_tokens, row_mask, **(kw | dict(key=jax.random.key(12))))
    pm2 = sample_pmap(cfg, params, tokens, mask, **(kw | dict(key=jax.random.key(12))))
    # the bound on two float32 programs' logprobs of these tokens (tests/tolerance.logprob_tol): from the logits
    # of one full forward over the single-device rollout (temperature 1)
    from grpo_jax.experience import full_sequences
    from models.rope import rope_positions, text_positions
    from tests.tolerance import logprob_tol
    seq, seq_mask = full_sequences(single)
    logits = models.forward(cfg, params, seq, rope_positions(cfg, text_positions(seq_mask)), attn_mask=seq_mask)[0]
    print(json.dumps({
        "logp_tol": logprob_tol(np.asarray(logits)[np.asarray(seq_mask, bool)], cfg),
        "shard_map_equal": bool((np.asarray(sm.tokens) == np.asarray(single.tokens)).all()),
        "shard_map_logp_diff": float(np.abs(np.asarray(sm.logprobs) - np.asarray(single.logprobs)).max()),
        "shard_map_taken": split is not None and split[1] == ("data",),
        "spmd_for_tensor_sharded": sampler.row_shard_axes(jax.device_put(tokens, batch), sharded_params) is None,
        "builds": [n_compiled, sampler._row_sharded.cache_info().currsize, sampler._pmapped.cache_info().currsize],
        "pmap_equal": bool((np.asarray(pm.tokens) == np.asarray(single.tokens)).all()),
        "mesh_equal": bool((np.asarray(sh.tokens) == np.asarray(single.tokens)).all()),
        "pmap_logp_diff": float(np.abs(np.asarray(pm.logprobs) - np.asarray(single.logprobs)).max()),
        "mesh_logp_diff": float(np.abs(np.asarray(sh.logprobs) - np.asarray(single.logprobs)).max()),
        "sharded": str(sharded_params["layers"][0]["qkv"].sharding.spec),
        "lengths_varied": bool(len(set(np.asarray(single.lengths).ravel().tolist())) > 1),
    }))
""")


def test_pmap_shard_map_and_mesh_sharded_sampler_match_single_device():
    env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=8", JAX_PLATFORMS="cpu")
    out = subprocess.run([sys.executable, "-c", MULTI_DEVICE], env=env, capture_output=True, text=True, timeout=600,
                         cwd=os.path.dirname(os.path.dirname(__file__)))
    assert out.returncode == 0, out.stderr[-3000:]
    res = json.loads(out.stdout.strip().splitlines()[-1])
    assert res["pmap_equal"] and res["mesh_equal"], res
    # another program (pmap, a tensor-sharded mesh, shard_map) computes the same logits in another order
    assert res["pmap_logp_diff"] <= res["logp_tol"] and res["mesh_logp_diff"] <= res["logp_tol"], res
    assert "tensor" in res["sharded"] and res["lengths_varied"]
    assert res["shard_map_taken"] and res["spmd_for_tensor_sharded"], res
    assert res["shard_map_equal"] and res["shard_map_logp_diff"] <= res["logp_tol"], res
    assert res["builds"] == [1, 1, 1], res  # a new key reuses the built shard_map / pmap programs


def test_decode_chunks_cover_every_step_once():
    """Chunk ends are increasing, the last is T, and no chunk is shorter than min_chunk unless T is."""
    for t in (1, 7, 31, 32, 40, 64, 100, 128, 512):
        ends = sampler.decode_chunks(t)
        assert ends[-1] == t and all(a < b for a, b in zip([0] + ends, ends))
        assert len(ends) <= 8
        if t >= 32:
            assert min(b - a for a, b in zip([0] + ends, ends)) >= 32 or len(ends) == 1


def test_argmax_last_matches_jnp_argmax_and_the_draw_matches_categorical():
    """argmax_last is jnp.argmax (first index of the maximum, ties included) on finite rows, and
    sample_categorical draws exactly jax.random.categorical's tokens from the same keys (same Gumbel
    noise), so swapping it in changed no rollout."""
    from grpo_jax.sampler import argmax_last, sample_categorical

    x = jnp.array([[1.0, 3.0, 3.0, 0.0], [-jnp.inf, -jnp.inf, 2.0, 2.0], [5.0, 5.0, 5.0, 5.0]])
    np.testing.assert_array_equal(argmax_last(x), jnp.argmax(x, axis=-1))  # [1, 2, 0]
    wide = jax.random.normal(jax.random.key(0), (64, 512)) * 4.0
    np.testing.assert_array_equal(argmax_last(wide), jnp.argmax(wide, axis=-1))
    assert int(argmax_last(jnp.array([jnp.nan, 1.0, 2.0]))) == 2  # documented: in range, never out of bounds
    keys = jax.random.split(jax.random.key(1), 64)
    np.testing.assert_array_equal(sample_categorical(keys, wide), jax.vmap(jax.random.categorical)(keys, wide))


def test_one_decode_loop_over_the_full_cache_samples_what_the_chunks_sample():
    """`_decode(chunk_ends=(T,))` (what grpo_jax.aot compiles to size a rollout) is the chunked decode with every
    step in one loop over the P + T cache: the extra slots are masked, so the same tokens are drawn and their
    logprobs agree to float32 rounding (the softmax sums over more, all-zero, terms)."""
    cfg, params = _model()
    prompt, mask = _prompts()
    kw = dict(key=jax.random.key(3), group_size=2, max_new_tokens=70, temperature=1.0)  # decode_chunks: 2 loops
    assert len(sampler.decode_chunks(70)) == 2
    tokens, mask_p = sampler.prepare_prompts(prompt, mask)
    ids = jnp.arange(tokens.shape[0], dtype=jnp.int32)
    chunked = sampler.sample_core(cfg, params, tokens, mask_p, ids, **kw)
    one = sampler.sample_core(cfg, params, tokens, mask_p, ids, chunk_ends=(70,), **kw)
    np.testing.assert_array_equal(np.asarray(one.tokens), np.asarray(chunked.tokens))
    assert int(jnp.sum(chunked.completion_mask)) > 2 * 3 * 2  # more than a couple of tokens per row were drawn
    lp = np.asarray(chunked.logprobs)
    tol = 64 * np.finfo(np.float32).eps * np.abs(lp).max()  # 64 ulps of the largest logprob: reordered sums
    np.testing.assert_allclose(np.asarray(one.logprobs), lp, rtol=0, atol=tol)

