"""Properties of the decoder: causality, padding invariance, cached decode == full forward, bounded
compilation, RoPE layouts against transformers, config validation."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch

import models
from models import rope
from models.rope import text_positions
from tests.tolerance import EPS32, forward_tol

VARIANTS = {
    "rope": models.tiny(),
    "rope_bias_tied": models.tiny(qkv_bias=True, tie_embeddings=True),
    "rope2d": models.tiny(rope_kind="rope2d"),
    "mrope": models.tiny(rope_kind="mrope", mrope_sections=(2, 3, 3)),
    "mrope_interleaved": models.tiny(rope_kind="mrope", mrope_sections=(2, 3, 3), mrope_interleaved=True),
    "gated": models.tiny(attn_output_gate=True),
    "qwen3": models.tiny(qk_norm=True, head_dim=32, arch="qwen3"),  # q/k norms, head_dim > d_model / n_heads
}


def _positions(cfg, pos_BxT):
    pos = jnp.asarray(pos_BxT)
    if cfg.rope_kind == "rope":
        return pos
    if cfg.rope_kind == "rope2d":  # distinct row/col so both halves matter
        return jnp.stack([pos // 3, pos % 3 + pos])
    return jnp.stack([pos, pos // 2, pos + 1])


def _setup(name, seed=0):
    cfg = VARIANTS[name]
    params = models.init_params(cfg, jax.random.key(seed))
    # scale up the random weights so attention is far from uniform and errors would show
    params = jax.tree.map(lambda p: p * 5.0 if p.ndim == 2 else p, params)
    return cfg, params


@pytest.mark.parametrize("name", list(VARIANTS))
def test_causality(name):
    """Changing tokens at t >= 5 leaves every logit at t < 5 unchanged."""
    cfg, params = _setup(name)
    tokens = jax.random.randint(jax.random.key(1), (2, 9), 0, cfg.vocab_size)
    other = tokens.at[:, 5:].set((tokens[:, 5:] + 7) % cfg.vocab_size)
    pos = _positions(cfg, np.broadcast_to(np.arange(9), (2, 9)))
    a, _ = models.forward(cfg, params, tokens, pos)
    b, _ = models.forward(cfg, params, other, pos)
    np.testing.assert_array_equal(np.asarray(a[:, :5]), np.asarray(b[:, :5]))
    assert np.abs(np.asarray(a[:, 5:] - b[:, 5:])).max() > 1e-3  # the future did change


@pytest.mark.parametrize("name", ["rope", "mrope", "gated"])
def test_left_padding_invariance(name):
    """A left-padded row gives the same logits on its real tokens as the same row without padding."""
    cfg, params = _setup(name)
    seq = jax.random.randint(jax.random.key(2), (1, 6), 0, cfg.vocab_size)
    alone, _ = models.forward(cfg, params, seq, _positions(cfg, np.arange(6)[None]))
    padded = jnp.concatenate([jnp.full((1, 3), 17), seq], axis=1)
    mask = np.array([[0, 0, 0, 1, 1, 1, 1, 1, 1]])
    out, _ = models.forward(cfg, params, padded, _positions(cfg, text_positions(mask)), attn_mask=jnp.asarray(mask))
    # the padded row sums over more (masked) keys: float32 rounding only, relative to the logits (tests/tolerance.py)
    np.testing.assert_allclose(np.asarray(out[:, 3:]), np.asarray(alone), atol=forward_tol(alone, cfg))


@pytest.mark.parametrize("name", list(VARIANTS))
def test_prefill_then_cached_decode_equals_full_forward(name):
    """Left-padded prompts of different lengths, prefilled into a cache, then one token at a time: every
    logit equals one full forward over the whole sequence, to float32 rounding (tests/tolerance.py)."""
    cfg, params = _setup(name)
    b, prompt_len, new, max_len = 2, 5, 6, 16
    tokens = jax.random.randint(jax.random.key(3), (b, prompt_len + new), 0, cfg.vocab_size)
    mask = np.ones((b, prompt_len + new), np.int32)
    mask[1, :2] = 0  # row 1 has a 3-token prompt, left-padded
    pos = _positions(cfg, text_positions(mask))
    full, _ = models.forward(cfg, params, tokens, pos, attn_mask=jnp.asarray(mask))

    cache = models.init_cache(cfg, b, max_len)
    step = jax.jit(lambda p, t, q, m, c: models.forward(cfg, p, t, q, attn_mask=m, cache=c))
    logits, cache = step(params, tokens[:, :prompt_len], pos[..., :prompt_len], jnp.asarray(mask[:, :prompt_len]),
                         cache)
    outs = [logits]
    for t in range(prompt_len, prompt_len + new):
        logits, cache = step(params, tokens[:, t : t + 1], pos[..., t : t + 1], jnp.asarray(mask[:, t : t + 1]), cache)
        outs.append(logits)
    cached = np.concatenate([np.asarray(o) for o in outs], axis=1)
    real = mask.astype(bool)
    assert np.abs(cached - np.asarray(full))[real].max() <= forward_tol(np.asarray(full)[real], cfg)
    assert np.asarray(cache["end_index"]).tolist() == [prompt_len + new] * b
    assert step._cache_size() == 2  # one prefill shape, one decode shape


def test_cache_grown_between_steps_gives_the_same_logits():
    """The sampler starts from a prompt-sized cache and grows it before each decode chunk: a cache grown
    from exactly the prompt to 7 then 10 slots must give the logits of a cache allocated at 10 (the new
    slots are empty and masked out; a wrong pad axis would misplace keys and change them)."""
    cfg, params = _setup("rope")
    b, prompt_len = 2, 4
    tokens = jax.random.randint(jax.random.key(5), (b, prompt_len + 6), 0, cfg.vocab_size)
    pos = _positions(cfg, np.broadcast_to(np.arange(prompt_len + 6), (b, prompt_len + 6)))
    fwd = jax.jit(lambda t, q, c: models.forward(cfg, params, t, q, cache=c))

    def decode(cache, grow_at):
        _, cache = fwd(tokens[:, :prompt_len], pos[..., :prompt_len], cache)
        outs = []
        for t in range(prompt_len, prompt_len + 6):
            if t in grow_at:
                cache = models.grow_cache(cache, grow_at[t])
            logits, cache = fwd(tokens[:, t : t + 1], pos[..., t : t + 1], cache)
            outs.append(np.asarray(logits))
        return np.concatenate(outs, axis=1), cache

    fixed, _ = decode(models.init_cache(cfg, b, 10, aligned=True), {})
    grown, cache = decode(models.init_cache(cfg, b, prompt_len, aligned=True), {4: 7, 7: 10})
    # summation order differs with the cache length: float32 rounding only, relative to the logits
    np.testing.assert_allclose(grown, fixed, atol=forward_tol(fixed, cfg))
    assert cache["mask"].shape == (b, 10) and cache["layers"][0]["k"].shape[-1] == 10
    with pytest.raises(ValueError, match="max_len"):
        models.grow_cache(cache, 8)


def test_block_causal_attention_equals_dense_on_every_real_query():
    """causal_attention skips the upper triangle block by block; with 4-row blocks over 30 positions
    (8 blocks, the last partial) and left padding, every query that sees a key matches the dense kernel."""
    from models.layers import causal_attention

    b, t = 3, 30
    q = jax.random.normal(jax.random.key(7), (b, t, 4, 8))
    k = jax.random.normal(jax.random.key(8), (b, t, 2, 8))
    v = jax.random.normal(jax.random.key(9), (b, t, 2, 8))
    valid = np.ones((b, t), bool)
    valid[1, :7] = False  # left padding
    mask = jnp.tril(jnp.ones((t, t), bool))[None] & jnp.asarray(valid)[:, None, :]
    dense = jax.nn.dot_product_attention(q, k, v, mask=mask[:, None])
    blocked = causal_attention(q, k, v, mask, block=4)
    # Two float32 computations of the same sums (the blocked one leaves out keys that are masked: exact zeros),
    # bounded as forward_tol bounds two forwards: a sum of K terms is off by K eps of the terms' magnitude. A
    # score q.k / sqrt(d) sums d products: off by d eps |s|max, which moves the softmax weights by 2x that
    # relative; the max, exp, the sum over <= t keys, the division and the weighted sum of t values add t + 4.
    # The output is a weighted mean of the values: K_o eps max|v| with K_o = 2 d |s|max + t + 4.
    d = q.shape[-1]
    qn, kn, vn = (np.asarray(x, np.float64) for x in (q, np.repeat(k, 2, axis=2), np.repeat(v, 2, axis=2)))
    scores = np.where(np.asarray(mask)[:, None], np.einsum("bind,bjnd->bnij", qn, kn) / np.sqrt(d), -np.inf)
    k_out = 2 * d * np.abs(scores[np.isfinite(scores)]).max() + t + 4
    np.testing.assert_allclose(np.asarray(blocked)[valid], np.asarray(dense)[valid], rtol=0,
                               atol=k_out * EPS32 * np.abs(vn).max())
    grads = [jax.grad(lambda q_, f=f: jnp.sum(jnp.where(jnp.asarray(valid)[:, :, None, None], f(q_), 0.0) ** 2))(q)
             for f in (lambda q_: causal_attention(q_, k, v, mask, block=4),
                       lambda q_: jax.nn.dot_product_attention(q_, k, v, mask=mask[:, None]))]
    # d/dq = sum_j p_ij (a_ij - abar_i) k_j / sqrt(d), a_ij = g_i . v_j, g_i = 2 o_i (0 on padding queries): its
    # terms' magnitude T = max sum_j p_ij (|a_ij| + |abar_i|) |k_j| / sqrt(d) (float64 here); along a term's chain
    # the forward's K_o, a's d products, abar's t, the subtraction, product and scale (3) and the sum over t keys:
    # K_g = K_o + d + 2t + 3, eps of T.
    with np.errstate(invalid="ignore"):  # padding queries (no key): g = 0 there
        p = np.exp(scores - scores.max(-1, keepdims=True))
        p = np.nan_to_num(p / p.sum(-1, keepdims=True))
    g = 2 * np.einsum("bnij,bjnd->bind", p, vn) * valid[:, :, None, None]
    a = np.einsum("bind,bjnd->bnij", g, vn)
    abar = (p * a).sum(-1, keepdims=True)
    terms = np.einsum("bnij,bjnd->bind", p * (np.abs(a) + np.abs(abar)), np.abs(kn)) / np.sqrt(d)
    k_grad = k_out + d + 2 * t + 3
    np.testing.assert_allclose(np.asarray(grads[0]), np.asarray(grads[1]), rtol=0, atol=k_grad * EPS32 * terms.max())


def test_forward_compiles_once_per_shape():
    cfg, params = _setup("rope")
    fwd = jax.jit(lambda p, t, q: models.forward(cfg, p, t, q)[0])
    tokens = jnp.zeros((2, 8), jnp.int32)
    pos = jnp.broadcast_to(jnp.arange(8), (2, 8))
    fwd(params, tokens, pos)
    fwd(params, tokens + 1, pos)
    assert fwd._cache_size() == 1
    fwd(params, jnp.zeros((2, 4), jnp.int32), pos[:, :4])
    assert fwd._cache_size() == 2


def test_bf16_params_keep_float32_logits():
    cfg32, params32 = _setup("rope")
    cfg16 = cfg32.replace(param_dtype="bfloat16", dtype="bfloat16")
    params16 = jax.tree.map(lambda p: p.astype(jnp.bfloat16), params32)
    tokens = jax.random.randint(jax.random.key(4), (2, 7), 0, cfg32.vocab_size)
    pos = jnp.broadcast_to(jnp.arange(7), (2, 7))
    l32, _ = models.forward(cfg32, params32, tokens, pos)
    l16, _ = models.forward(cfg16, params16, tokens, pos)
    assert l16.dtype == jnp.float32
    lp32 = jax.nn.log_softmax(l32, -1)
    lp16 = jax.nn.log_softmax(l16, -1)
    # bf16 has ~3 significant digits; the distributions agree to that precision, not bitwise
    assert 0 < float(jnp.abs(lp32 - lp16).max()) < 0.5


# ---------------------------------------------------------------- RoPE against transformers' layouts

def _rope_tol(pos) -> float:
    """Two float32 computations (ours, transformers') of cos / sin(pos theta^(-2i / d)): on each side the inverse
    frequency (a power and a division: 3 roundings of eps/2) times pos (1 more) is off by 4 eps/2 of the angle,
    whose magnitude is at most max|pos| (the inverse frequencies are <= 1); cos / sin add 2 eps/2 (their
    rounding and their implementation). Both sides: (4 max|pos| + 2) eps."""
    return (4 * float(np.abs(pos).max()) + 2) * EPS32


def test_rope2d_matches_qwen2_vl_vision_rotary():
    from transformers.models.qwen2_vl.configuration_qwen2_vl import Qwen2VLVisionConfig
    from transformers.models.qwen2_vl.modeling_qwen2_vl import Qwen2VLVisionRotaryEmbedding

    head_dim = 16
    vcfg = Qwen2VLVisionConfig(embed_dim=32, num_heads=2)  # head_dim = 32 / 2 = 16
    grid = np.array([[1, 4, 6], [2, 2, 2]])
    pos = rope.vision_patch_positions(grid, spatial_merge_size=2)  # [2, N]
    ref_cos, ref_sin = Qwen2VLVisionRotaryEmbedding(vcfg)(torch.zeros(1), torch.as_tensor(pos.T))
    cfg = models.tiny(rope_kind="rope2d", head_dim=head_dim)
    cos, sin = rope.rope_cos_sin(cfg, jnp.asarray(pos[:, None, :]))  # B = 1
    tol = _rope_tol(pos)
    np.testing.assert_allclose(np.asarray(cos[0]), ref_cos.numpy(), rtol=0, atol=tol)
    np.testing.assert_allclose(np.asarray(sin[0]), ref_sin.numpy(), rtol=0, atol=tol)


def test_vision_patch_positions_match_transformers():
    from transformers.vision_utils import get_vision_position_ids

    grid = np.array([[1, 4, 6], [2, 2, 4]])
    ref = get_vision_position_ids(torch.as_tensor(grid), 2)
    np.testing.assert_array_equal(rope.vision_patch_positions(grid, 2), ref.numpy().T)


@pytest.mark.parametrize("interleaved", [False, True])
def test_mrope_layout_matches_transformers(interleaved):
    """Chunked sections as Qwen2-VL, interleaved as Qwen3-VL, on random 3-axis positions."""
    if interleaved:
        from transformers import Qwen3VLTextConfig
        from transformers.models.qwen3_vl.modeling_qwen3_vl import Qwen3VLTextRotaryEmbedding as Emb

        hf_cfg = Qwen3VLTextConfig(hidden_size=128, num_attention_heads=4, head_dim=32,
                                   rope_parameters={"rope_type": "default", "rope_theta": 5e6,
                                                    "mrope_section": [6, 5, 5], "mrope_interleaved": True})
        cfg = models.tiny(rope_kind="mrope", head_dim=32, mrope_sections=(6, 5, 5), mrope_interleaved=True,
                          rope_theta=5e6)
    else:
        from transformers.models.qwen2_vl.configuration_qwen2_vl import Qwen2VLTextConfig
        from transformers.models.qwen2_vl.modeling_qwen2_vl import Qwen2VLRotaryEmbedding as Emb

        hf_cfg = Qwen2VLTextConfig(hidden_size=128, num_attention_heads=4,
                                   rope_parameters={"rope_type": "default", "rope_theta": 1e4,
                                                    "mrope_section": [4, 6, 6]})
        cfg = models.tiny(rope_kind="mrope", head_dim=32, mrope_sections=(4, 6, 6))
    pos = np.random.RandomState(0).randint(0, 50, (3, 2, 7))
    ref_cos, ref_sin = Emb(hf_cfg)(torch.zeros(1, dtype=torch.float32), torch.as_tensor(pos))
    cos, sin = rope.rope_cos_sin(cfg, jnp.asarray(pos))
    tol = _rope_tol(pos)
    np.testing.assert_allclose(np.asarray(cos), ref_cos.numpy(), rtol=0, atol=tol)
    np.testing.assert_allclose(np.asarray(sin), ref_sin.numpy(), rtol=0, atol=tol)


def test_interleaved_axis_assignment():
    """Qwen3-VL [24, 20, 20]: f = 1 mod 3 -> h and f = 2 mod 3 -> w below 60, the rest t: 24/20/20."""
    axis = rope.mrope_axis_of_freq((24, 20, 20), True)
    assert np.bincount(axis).tolist() == [24, 20, 20]
    assert axis[:6].tolist() == [0, 1, 2, 0, 1, 2] and axis[60:].tolist() == [0, 0, 0, 0]


@pytest.mark.parametrize("interleaved", [False, True])
def test_mrope_with_equal_axes_is_1d_rope(interleaved):
    pos = np.random.RandomState(1).randint(0, 100, (2, 5))
    c1, s1 = rope.rope_cos_sin(models.tiny(), jnp.asarray(pos))
    cm, sm = rope.rope_cos_sin(models.tiny(rope_kind="mrope", mrope_sections=(2, 3, 3), mrope_interleaved=interleaved),
                               jnp.asarray(np.stack([pos] * 3)))
    np.testing.assert_array_equal(np.asarray(c1), np.asarray(cm))
    np.testing.assert_array_equal(np.asarray(s1), np.asarray(sm))


def test_rope_rejects_wrong_position_rank():
    with pytest.raises(ValueError, match=r"\[3, B, T\]"):
        rope.rope_cos_sin(models.tiny(rope_kind="mrope", mrope_sections=(2, 3, 3)), jnp.zeros((2, 5)))


# ---------------------------------------------------------------- config validation

@pytest.mark.parametrize("bad, field", [
    (dict(n_heads=3), "n_heads"),
    (dict(head_dim=15), "head_dim"),
    (dict(rope_kind="alibi"), "rope_kind"),
    (dict(rope_kind="mrope", mrope_sections=(2, 2, 2)), "mrope_sections"),
    (dict(mrope_sections=(2, 3, 3)), "mrope_sections"),
    (dict(dtype="int8"), "dtype"),
    (dict(vocab_size=0), "vocab_size"),
])
def test_config_errors_name_the_field(bad, field):
    with pytest.raises(ValueError, match=field):
        models.tiny(**bad)


def test_presets_param_counts():
    # Qwen2.5-0.5B is published as 494M parameters (tied embeddings).
    assert abs(models.qwen2_5_0_5b().num_params() / 1e6 - 494) < 1
    # Qwen3-0.6B: 0.44B non-embedding parameters (its model card), embeddings tied
    q3 = models.qwen3_0_6b()
    assert abs((q3.num_params() - q3.vocab_size * q3.d_model) / 1e9 - 0.44) < 0.005
    for cfg in (models.tiny(), VARIANTS["qwen3"]):
        params = models.init_params(cfg, jax.random.key(0))
        assert sum(x.size for x in jax.tree.leaves(params)) == cfg.num_params()
        # every leaf has logical sharding axes (a new parameter without them is a KeyError on a mesh)
        from grpo_jax import sharding

        mesh = jax.sharding.Mesh(np.array(jax.devices()[:1]).reshape(1, 1, 1), ("data", "fsdp", "tensor"))
        assert len(jax.tree.leaves(sharding.param_specs(params, mesh))) == len(jax.tree.leaves(params))


def _saved_tiny(path, **kw):
    cfg = models.tiny(**kw)
    models.save_hf(cfg, models.init_params(cfg, jax.random.key(0)), str(path))
    return cfg


def test_unreadable_weight_files_name_the_file_or_shard(tmp_path):
    """A truncated or garbage safetensors file, or a list-shaped config.json or index, raises a CheckpointError
    naming the file or shard and what is wrong with it (not safetensors' own error, which names no file, or
    an AttributeError/TypeError)."""
    import json
    import os

    _saved_tiny(tmp_path / "m")
    weights = tmp_path / "m" / "model.safetensors"
    data = weights.read_bytes()
    weights.write_bytes(data[: len(data) // 2])
    with pytest.raises(models.CheckpointError, match=r"m/model\.safetensors: not a readable safetensors file"):
        models.load_hf(str(tmp_path / "m"))
    weights.write_bytes(os.urandom(200))
    with pytest.raises(models.CheckpointError, match=r"m/model\.safetensors: not a readable safetensors file"):
        models.load_hf(str(tmp_path / "m"))
    # a sharded checkpoint: the bad shard is the one named
    _saved_tiny(tmp_path / "s")
    os.rename(tmp_path / "s" / "model.safetensors", tmp_path / "s" / "model-00001-of-00002.safetensors")
    (tmp_path / "s" / "model-00002-of-00002.safetensors").write_bytes(b"\x08\x00\x00\x00\x00\x00\x00\x00{garbage")
    index = tmp_path / "s" / "model.safetensors.index.json"
    index.write_text(json.dumps({"weight_map": {"model.norm.weight": "model-00001-of-00002.safetensors",
                                                "lm_head.weight": "model-00002-of-00002.safetensors"}}))
    with pytest.raises(models.CheckpointError, match=r"model-00002-of-00002\.safetensors: not a readable"):
        models.load_hf(str(tmp_path / "s"))
    for shape in ("[]", '{"weight_map": ["a.safetensors"]}', '{"metadata": {}}'):
        index.write_text(shape)
        with pytest.raises(models.CheckpointError, match=r"index\.json: not a safetensors index: expected a JSON "
                                                         r"object with a 'weight_map'"):
            models.load_hf(str(tmp_path / "s"))
    (tmp_path / "s" / "config.json").write_text("[1, 2]")
    with pytest.raises(models.CheckpointError, match=r"s/config\.json: expected a JSON object of model settings "
                                                     r"\(a transformers config\.json\), got list"):
        models.load_hf(str(tmp_path / "s"))


@pytest.mark.parametrize("name", sorted(VARIANTS))
def test_the_linen_decoder_declares_the_layout_init_params_writes(name):
    """`Decoder.init` (linen's own initialisers) and `init_params` (the repo's, whose keys every run and test
    fixes) give one parameter layout: the same names, shapes and dtypes, so the sharding rules, LoRA, the HF
    mapping and checkpoints hold for both; `variables` / `canonical` convert without loss."""
    cfg = VARIANTS[name]
    tokens, pos = jnp.zeros((1, 4), jnp.int32), _positions(cfg, jnp.arange(4)[None])
    from_linen = models.modules.canonical(models.modules.Decoder(cfg).init(jax.random.key(0), tokens, pos))
    ours = models.init_params(cfg, jax.random.key(0))
    spec = lambda tree: jax.tree.map(lambda x: (x.shape, x.dtype), tree)  # noqa: E731
    assert spec(from_linen) == spec(ours)
    again = models.modules.canonical(models.modules.variables(ours))
    assert jax.tree.structure(again) == jax.tree.structure(ours)
    assert all(a is b for a, b in zip(jax.tree.leaves(again), jax.tree.leaves(ours)))  # a restructuring only
    # linen's init is a working model too: finite logits through the pure forward
    logits, _ = models.forward(cfg, from_linen, tokens, pos)
    assert logits.shape == (1, 4, cfg.vocab_size) and bool(jnp.isfinite(logits).all())
