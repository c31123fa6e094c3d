"""The model protocol: a researcher's own Flax linen decoder, defined here and not in the package, trains through the
Trainer when the config names it (`model.module`), resumes bitwise, and shards by the axes it declares.

What the protocol asks of a module (docs/architecture.md, "The model protocol"): a linen Module class built as
`Class(model_cfg)` whose `__call__(tokens [B, T], positions, *, attn_mask, cache, dropout_key)` returns (logits
[B, T, V] float32, the cache) and keeps the KV cache in `models.init_cache`'s layout (cfg.n_layers entries);
optionally `param_axes` ({"name" or "parent.name": logical axes}) for the sharding rules."""

from __future__ import annotations

import json
from typing import ClassVar

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import models
from grpo_jax import sharding, train
from grpo_jax.config import UserError, override
from grpo_jax.runlog import read_jsonl
from models.config import ModelConfig
from models.layers import attend, write_cache
from models.rope import apply_rope, rope_cos_sin, text_positions
from tests.test_train import _assert_moved, _assert_real_signal, _leaves, signal_config
from tests.tolerance import forward_tol

MODULE = "model.module=tests.test_model_protocol:TinyDecoder"


class TinyDecoder(nn.Module):
    """One pre-norm block written with linen's own layers (Embed, Dense, RMSNorm), a GELU MLP where the
    built-in decoder has SwiGLU, and its own LM head; RoPE and the cache write reuse the repo's primitives."""

    cfg: ModelConfig
    param_axes: ClassVar[dict] = {
        "embed.embedding": ("vocab", "embed"), "q.kernel": ("embed", "heads"), "k.kernel": ("embed", "heads"),
        "v.kernel": ("embed", "heads"), "o.kernel": ("heads", "embed"), "up.kernel": ("embed", "mlp"),
        "down.kernel": ("mlp", "embed"), "head.kernel": ("embed", "vocab"), "scale": ("norm",)}

    @nn.compact
    def __call__(self, tokens, positions, *, attn_mask=None, cache=None, dropout_key=None):
        cfg = self.cfg
        b, t = tokens.shape
        valid = jnp.ones((b, t), bool) if attn_mask is None else attn_mask.astype(bool)
        x = nn.Embed(cfg.vocab_size, cfg.d_model, name="embed")(tokens)
        h = nn.RMSNorm(name="attn_norm")(x)
        q = nn.Dense(cfg.q_dim, use_bias=False, name="q")(h).reshape(b, t, cfg.n_heads, cfg.head_dim)
        k = nn.Dense(cfg.kv_dim, use_bias=False, name="k")(h).reshape(b, t, cfg.n_kv_heads, cfg.head_dim)
        v = nn.Dense(cfg.kv_dim, use_bias=False, name="v")(h).reshape(b, t, cfg.n_kv_heads, cfg.head_dim)
        cos, sin = rope_cos_sin(cfg, positions)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        if cache is None:
            mask = jnp.tril(jnp.ones((t, t), bool))[None] & valid[:, None, :]
            y, new_cache = jax.nn.dot_product_attention(q, k, v, mask=mask[:, None]).reshape(b, t, -1), None
        else:
            index = cache["end_index"]
            key_mask = write_cache(cache["mask"], valid, index)
            keys = write_cache(cache["layers"][0]["k"], k.transpose(0, 2, 3, 1), index, axis=3)
            values = write_cache(cache["layers"][0]["v"], v.transpose(0, 2, 1, 3), index, axis=2)
            query_slot = jnp.broadcast_to(index, (b,))[:, None] + jnp.arange(t)
            slots = jnp.arange(key_mask.shape[1])
            mask = (slots[None, None, :] <= query_slot[:, :, None]) & key_mask[:, None, :]
            y = attend(cfg, q, keys, values, mask)
            new_cache = {"layers": [{"k": keys, "v": values}], "end_index": index + t, "mask": key_mask}
        x = x + nn.Dense(cfg.d_model, use_bias=False, name="o")(y)
        h = nn.RMSNorm(name="mlp_norm")(x)
        x = x + nn.Dense(cfg.d_model, use_bias=False, name="down")(nn.gelu(nn.Dense(cfg.mlp_dim, use_bias=False,
                                                                                   name="up")(h)))
        # a small head: near-uniform logits at init, so a random model's completions differ (a gradient)
        head = nn.Dense(cfg.vocab_size, use_bias=False, kernel_init=nn.initializers.normal(0.02), name="head")
        logits = head(nn.RMSNorm(name="final_norm")(x))
        return logits.astype(jnp.float32), new_cache


def _cfg(**over):
    return models.tiny(n_layers=1, module="tests.test_model_protocol:TinyDecoder", **over)


def test_the_module_runs_as_the_pure_forward_and_its_cached_decode_matches():
    """`models.init_params` / `models.forward` on a config naming the module: its own linen params (names it
    chose), and the protocol's cache contract holds (prefill then one-token decodes == the full forward)."""
    cfg = _cfg()
    params = models.init_params(cfg, jax.random.key(0))
    assert sorted(params) == ["attn_norm", "down", "embed", "final_norm", "head", "k", "mlp_norm", "o", "q", "up", "v"]
    tokens = jax.random.randint(jax.random.key(1), (2, 7), 0, cfg.vocab_size)
    mask = jnp.ones((2, 7), bool).at[0, :2].set(False)  # row 0 left-padded
    pos = text_positions(mask)
    full, none = models.forward(cfg, params, tokens, pos, attn_mask=mask)
    assert none is None and full.dtype == jnp.float32
    cache = models.init_cache(cfg, 2, 8)
    logits, cache = models.forward(cfg, params, tokens[:, :4], pos[:, :4], attn_mask=mask[:, :4], cache=cache)
    steps = [logits]
    for i in range(4, 7):
        logits, cache = models.forward(cfg, params, tokens[:, i:i + 1], pos[:, i:i + 1], cache=cache)
        steps.append(logits)
    # another summation order: float32 rounding, relative to the compared logits' magnitude (tests/tolerance.py)
    tol = forward_tol(np.concatenate([full[1], full[0, 2:]]), cfg)
    np.testing.assert_allclose(np.concatenate(steps, 1)[1], full[1], atol=tol)  # row 1: every position
    np.testing.assert_allclose(np.concatenate(steps, 1)[0, 2:], full[0, 2:], atol=tol)  # row 0: real tokens


def test_its_declared_axes_shard_it_and_an_undeclared_parameter_is_named():
    cfg = _cfg()
    sharding.declare_param_axes(TinyDecoder.param_axes, "TinyDecoder")
    shapes = jax.eval_shape(lambda k: models.init_params(cfg, k), jax.random.key(0))
    mesh = jax.sharding.AbstractMesh((1, 2, 4), ("data", "fsdp", "tensor"))
    specs = sharding.param_specs(shapes, mesh)
    assert specs["q"]["kernel"] == jax.sharding.PartitionSpec("fsdp", "tensor")  # [D 64, N*H 64]
    assert specs["o"]["kernel"] == jax.sharding.PartitionSpec("tensor", "fsdp")
    assert specs["embed"]["embedding"] == jax.sharding.PartitionSpec("tensor", "fsdp")  # [V 128, D 64]
    assert specs["final_norm"]["scale"] == jax.sharding.PartitionSpec(None)
    with pytest.raises(KeyError, match=r"\['extra'\]\['w'\].*your module's param_axes"):
        sharding.param_specs({"extra": {"w": jax.ShapeDtypeStruct((4, 4), jnp.float32)}}, mesh)
    with pytest.raises(ValueError, match=r"Mine.param_axes\['x.kernel'\]: unknown logical axes \['rows'\]"):
        sharding.declare_param_axes({"x.kernel": ("rows", "embed")}, "Mine")
    with pytest.raises(ValueError, match=r"differs from the built-in decoder's"):
        sharding.declare_param_axes({"qkv": ("embed", "embed")}, "Mine")


def test_a_flax_decoder_of_your_own_trains_through_the_trainer_and_resumes_bitwise(tmp_path):
    """3 real steps through the Trainer with the module named in the config (grad_norm > 0 every step, params
    moved); a run stopped after step 2 and resumed from its checkpoint logs the same metrics (floats compared
    exactly) and ends on the same params as the straight run."""
    straight = train.Trainer(signal_config(MODULE, "steps=3", "checkpoint.every=1"), str(tmp_path / "straight"),
                             quiet=True)
    assert "q" in straight.state.params and "kernel" in straight.state.params["q"]  # the module's own names
    before = _leaves(straight.state.params)
    straight.run()
    _assert_moved(before, _leaves(straight.state.params))
    rows = read_jsonl(str(tmp_path / "straight" / "metrics.jsonl"))
    _assert_real_signal([r["grad_norm"] for r in rows], [r["skipped"] for r in rows])
    assert [r["step"] for r in rows] == [1, 2, 3]

    first = train.Trainer(signal_config(MODULE, "steps=2", "checkpoint.every=1"), str(tmp_path / "resumed"),
                          quiet=True)
    first.run()
    first.release_lock()
    saved = json.load(open(tmp_path / "resumed" / "config.json"))
    assert saved["model"]["module"] == "tests.test_model_protocol:TinyDecoder"
    resumed = train.Trainer(signal_config(MODULE, "steps=3", "checkpoint.every=1"), str(tmp_path / "resumed"),
                            resume=True, quiet=True)
    assert resumed.step == 2
    resumed.run()
    # the same rows, but for the evaluation the first run made when it ended at step 2
    resumed_rows = [{k: v for k, v in r.items() if not (r["step"] == 2 and k.startswith("eval/"))}
                    for r in read_jsonl(str(tmp_path / "resumed" / "metrics.jsonl"))]
    assert resumed_rows == rows
    for a, b in zip(_leaves(resumed.state.params), _leaves(straight.state.params)):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("extra, words", [
    (("model.module=tests.test_model_protocol:NoSuchDecoder",), r"model.module=.*has no attribute 'NoSuchDecoder'"),
    ((MODULE, "lora.rank=4"), r"model.module=.*lora.rank=4: LoRA adapters sit on the built-in decoder"),
])
def test_a_bad_module_or_lora_on_it_is_one_line_naming_the_key(tmp_path, extra, words):
    with pytest.raises(UserError, match=words):
        train.Trainer(signal_config(*extra), str(tmp_path / "run"), quiet=True)


def test_a_module_of_your_own_has_no_hugging_face_export():
    with pytest.raises(models.CheckpointError, match="no Hugging Face mapping"):
        models.hf.config_to_hf(_cfg())


def test_the_module_setting_is_checked_when_the_config_is_read():
    with pytest.raises(ValueError, match="ModelSpec.module: must be an import path"):
        override(train.TrainConfig(), ["model.module=TinyDecoder"])
    with pytest.raises(ValueError, match="ModelSpec.module: and hf_path cannot both be set"):
        override(train.TrainConfig(), [MODULE, "model.hf_path=/some/folder"])
