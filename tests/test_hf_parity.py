"""Our forward against transformers' PyTorch models on the same random weights (loaded via load_hf)."""

from __future__ import annotations

import json
import os

import jax.numpy as jnp
import numpy as np
import pytest
import torch

import models
from models.rope import mrope_positions, mrope_token_types, text_positions
from tests.hf_util import VL_TOKENS, build, hf_logits
from tests.tolerance import forward_tol

# The same float32 function in two libraries, each summing in its own order: the logits may differ by
# rounding only, a tolerance relative to their magnitude (tests/tolerance.py).


def _ours(cfg, params, tokens, positions, mask=None):
    logits, _ = models.forward(cfg, params, jnp.asarray(tokens), jnp.asarray(positions),
                               attn_mask=None if mask is None else jnp.asarray(mask))
    return np.asarray(logits)


def _random_tokens(seed, shape, avoid=()):
    toks = np.random.RandomState(seed).randint(8, 128, shape)  # ids < 8 hold the VL special tokens
    assert not np.isin(toks, avoid).any()
    return toks


@pytest.mark.parametrize("arch", ["llama", "qwen2", "qwen3"])
def test_text_parity(arch, tmp_path):
    hf = build(arch)
    hf.save_pretrained(tmp_path)
    cfg, params = models.load_hf(str(tmp_path))
    assert cfg.arch == arch and cfg.qkv_bias == (arch == "qwen2") and cfg.tie_embeddings == (arch != "llama")
    assert cfg.qk_norm == (arch == "qwen3") and cfg.head_dim == (32 if arch == "qwen3" else 16)
    tokens = _random_tokens(0, (2, 12))
    ours, ref = _ours(cfg, params, tokens, text_positions(np.ones_like(tokens))), hf_logits(hf, tokens)
    diff, tol = np.abs(ours - ref).max(), forward_tol(ref, cfg)
    print(f"\nparity {arch}: max |logit diff| = {diff:.2e}, tolerance {tol:.2e}")
    assert diff <= tol


# Llama-3.1's scaling with a short original context, so that at head_dim 16 (frequencies theta^(-j/8), wavelengths
# 2 pi .. ~20,000 at theta 1e4) all three bands occur: w < 32 / 4 = 8 kept, w > 32 / 1 = 32 divided by
# the factor, 8 <= w <= 32 interpolated; positions up to 40 reach past the original context.
LLAMA3_ROPE = {"rope_type": "llama3", "rope_theta": 10000.0, "factor": 8.0, "low_freq_factor": 1.0,
               "high_freq_factor": 4.0, "original_max_position_embeddings": 32}


def test_llama3_rope_scaling_parity(tmp_path):
    hf = build("llama", rope_parameters=LLAMA3_ROPE)
    hf.save_pretrained(tmp_path)
    cfg, params = models.load_hf(str(tmp_path))
    assert dict(cfg.rope_scaling) == {k: v for k, v in LLAMA3_ROPE.items() if k not in ("rope_type", "rope_theta")}
    from models.rope import inv_freq, llama3_inv_freq

    freqs = np.asarray(inv_freq(16, 1e4))
    wavelen = 2 * np.pi / freqs
    scaled = np.asarray(llama3_inv_freq(jnp.asarray(freqs), dict(cfg.rope_scaling)))
    assert (wavelen < 8).any() and (wavelen > 32).any() and ((wavelen >= 8) & (wavelen <= 32)).any()
    np.testing.assert_allclose(scaled[wavelen < 8], freqs[wavelen < 8])  # kept
    np.testing.assert_allclose(scaled[wavelen > 32], freqs[wavelen > 32] / 8, rtol=1e-6)  # divided by the factor
    tokens = _random_tokens(3, (2, 40))
    ours, ref = _ours(cfg, params, tokens, text_positions(np.ones_like(tokens))), hf_logits(hf, tokens)
    diff, tol = np.abs(ours - ref).max(), forward_tol(ref, cfg)
    unscaled = _ours(cfg.replace(rope_scaling=()), params, tokens, text_positions(np.ones_like(tokens)))
    print(f"\nparity llama3 rope scaling: max |logit diff| = {diff:.2e}, tolerance {tol:.2e} (without the scaling: "
          f"{np.abs(unscaled - ref).max():.2e})")
    assert diff <= tol < np.abs(unscaled - ref).max()  # the scaling matters at these positions


def test_unsupported_rope_scaling_is_refused(tmp_path):
    hf = build("llama")
    hf.save_pretrained(tmp_path)
    path = tmp_path / "config.json"
    conf = json.loads(path.read_text())
    conf["rope_parameters"] = {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0}
    path.write_text(json.dumps(conf))
    with pytest.raises(models.CheckpointError, match=r"config\.json.*'yarn' is not supported"):
        models.load_hf(str(tmp_path))


def test_text_parity_left_padded(tmp_path):
    """Left padding: transformers with attention_mask + cumsum positions == ours on the real tokens."""
    hf = build("qwen2")
    hf.save_pretrained(tmp_path)
    cfg, params = models.load_hf(str(tmp_path))
    tokens = _random_tokens(1, (2, 9))
    mask = np.ones_like(tokens)
    mask[0, :3] = 0
    pos = text_positions(mask)
    ours = _ours(cfg, params, tokens, pos, mask)
    ref = hf_logits(hf, tokens, position_ids=pos, attention_mask=mask)
    real = mask.astype(bool)
    assert np.abs(ours - ref)[real].max() <= forward_tol(ref[real], cfg)


def _vl_batch():
    """Two rows mixing text, a 1x4x6 image (after 2x2 merge: 1x2x3 = 6 tokens) and a 2x4x4 video (8 tokens);
    row 1 is left-padded by 2."""
    s, img, vid = VL_TOKENS["vision_start_token_id"], VL_TOKENS["image_token_id"], VL_TOKENS["video_token_id"]
    e = VL_TOKENS["vision_end_token_id"]
    row0 = [20, 21, s] + [img] * 6 + [e, 30, 31, s] + [vid] * 8 + [e, 40, 41]
    row1 = [0, 0, 50, s] + [img] * 6 + [e] + list(range(60, 73))
    tokens = np.array([row0, row1])
    mask = np.ones_like(tokens)
    mask[1, :2] = 0
    image_grid = np.array([[1, 4, 6], [1, 4, 6]])
    video_grid = np.array([[2, 4, 4]])
    return tokens, mask, image_grid, video_grid


def test_mrope_positions_match_get_rope_index():
    hf = build("qwen2_vl")
    tokens, mask, image_grid, video_grid = _vl_batch()
    types = mrope_token_types(tokens, image_token_id=VL_TOKENS["image_token_id"],
                              video_token_id=VL_TOKENS["video_token_id"])
    ref_pos, ref_delta = hf.model.get_rope_index(
        torch.as_tensor(tokens), torch.as_tensor(types), image_grid_thw=torch.as_tensor(image_grid),
        video_grid_thw=torch.as_tensor(video_grid), attention_mask=torch.as_tensor(mask))
    pos, delta = mrope_positions(types, attention_mask=mask, image_grid_thw=image_grid, video_grid_thw=video_grid,
                                 spatial_merge_size=hf.config.vision_config.spatial_merge_size)
    np.testing.assert_array_equal(pos, ref_pos.numpy())
    np.testing.assert_array_equal(delta, ref_delta.numpy())
    assert (pos[0] != pos[1]).any() and (pos[1] != pos[2]).any()  # a real 3-axis layout, not text-only


def test_qwen2_vl_text_parity_with_mrope_positions(tmp_path):
    hf = build("qwen2_vl")
    hf.save_pretrained(tmp_path)
    cfg, params = models.load_hf(str(tmp_path))
    assert cfg.rope_kind == "mrope" and cfg.mrope_sections == (2, 3, 3)
    tokens, mask, image_grid, video_grid = _vl_batch()
    types = mrope_token_types(tokens, image_token_id=VL_TOKENS["image_token_id"],
                              video_token_id=VL_TOKENS["video_token_id"])
    pos, _ = mrope_positions(types, attention_mask=mask, image_grid_thw=image_grid, video_grid_thw=video_grid)
    # Vision tokens replaced by ordinary ids: we compare the text decoder under 3-axis positions, which
    # needs no pixel values.
    text_tokens = np.where(types > 0, 9, tokens)
    ours = _ours(cfg, params, text_tokens, pos, mask)
    ref = hf_logits(hf, text_tokens, position_ids=pos, attention_mask=mask)
    real = mask.astype(bool)
    diff, tol = np.abs(ours - ref)[real].max(), forward_tol(ref[real], cfg)
    print(f"\nparity qwen2_vl (M-RoPE positions): max |logit diff| = {diff:.2e}, tolerance {tol:.2e}")
    assert diff <= tol


def test_load_errors_name_the_problem(tmp_path):
    hf = build("qwen2")
    hf.save_pretrained(tmp_path / "ok")
    with pytest.raises(models.CheckpointError, match="not a directory"):
        models.load_hf(str(tmp_path / "missing"))
    # unsupported architecture
    bad = tmp_path / "ok" / "config.json"
    conf = json.loads(bad.read_text())
    bad.write_text(json.dumps({**conf, "architectures": ["GPT2LMHeadModel"], "model_type": "gpt2"}))
    with pytest.raises(models.CheckpointError, match="unsupported architecture"):
        models.load_hf(str(tmp_path / "ok"))
    # a config that promises more layers than the weights hold: the missing tensor is named
    bad.write_text(json.dumps({**conf, "num_hidden_layers": 3}))
    with pytest.raises(models.CheckpointError, match=r"model\.layers\.2\..*missing"):
        models.load_hf(str(tmp_path / "ok"))
    # a wider MLP than stored: expected and found shapes named
    bad.write_text(json.dumps({**conf, "intermediate_size": 100}))
    with pytest.raises(models.CheckpointError, match=r"mlp\.\w+_proj\.weight.*\(96, 64\).*expected \(100, 64\)"):
        models.load_hf(str(tmp_path / "ok"))
    os.remove(tmp_path / "ok" / "model.safetensors")
    with pytest.raises(models.CheckpointError, match="no model.safetensors"):
        models.load_hf(str(tmp_path / "ok"))


def test_save_hf_refuses_what_hf_cannot_hold(tmp_path):
    cfg = models.tiny(attn_output_gate=True)
    params = models.init_params(cfg, __import__("jax").random.key(0))
    with pytest.raises(models.CheckpointError, match="gate"):
        models.save_hf(cfg, params, str(tmp_path / "x"))
    assert not (tmp_path / "x").exists()


@pytest.mark.parametrize(("changes", "word"), [
    (dict(rope_kind="rope2d"), "rope2d"),  # would load back as plain RoPE
    # transformers' Qwen2-VL derives head_dim = hidden_size // heads: 16 * 4 = 64 != d_model 128
    (dict(arch="qwen2_vl", rope_kind="mrope", mrope_sections=(2, 3, 3), qkv_bias=True, head_dim=16, n_heads=4,
          n_kv_heads=2, d_model=128), "head_dim"),
])
def test_save_hf_refuses_configs_transformers_would_misread(tmp_path, changes, word):
    cfg = models.tiny().replace(**changes)
    params = models.init_params(cfg, __import__("jax").random.key(0))
    with pytest.raises(models.CheckpointError, match=word):
        models.save_hf(cfg, params, str(tmp_path / "x"))
    assert not (tmp_path / "x").exists()
