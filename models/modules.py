"""The decoder as Flax linen modules: embedding, RMSNorm, attention (RoPE / 2D-RoPE / M-RoPE, KV cache, GQA,
optional output gate), SwiGLU MLP, the decoder layer, the decoder with its LM head, and LoRA adapters on the
projections.

Linen, not nnx: a linen module holds no state, `Decoder(cfg).apply(variables, ...)` is a pure function of a
parameter pytree, so everything that jits, shards, differentiates, checkpoints or updates keeps seeing plain
arrays; nnx objects would have to be split into (graphdef, state) at every one of those boundaries.

Parameters keep the repo's one layout (models.transformer, models.layers): each layer's dict is flat (the
attention and MLP share the layer's scope, `nn.share_scope`), so parameter names are those of the sharding
rules, LoRA, the Hugging Face mapping and every checkpoint. The only difference is linen's naming of a list of
layers, `layers_0, layers_1, ...` for the list `layers`; `variables` / `canonical` convert (a dict
restructuring, free under jit). The KV cache and the LoRA dropout key are arguments and results, not linen
collections, so `forward(params, tokens, positions, cache) -> (logits, cache)` stays pure.
"""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp

from models import layers
from models import lora as lora_lib
from models.config import ModelConfig
from models.rope import apply_rope, rope_cos_sin

INIT_STD = 0.02  # Hugging Face's default initializer_range


def _normal(key, shape, dtype):
    return (INIT_STD * jax.random.normal(key, shape, jnp.float32)).astype(dtype)


def _ones(key, shape, dtype):
    return jnp.ones(shape, dtype)


def _zeros(key, shape, dtype):
    return jnp.zeros(shape, dtype)


class _LayerPart(nn.Module):
    """A part of a decoder layer (attention or MLP): its parameters live in the layer's own flat dict (the layer
    shares its scope with it), the LoRA adapters under "lora" (an `models.lora.Attached`, `lora.attach`)."""

    cfg: ModelConfig

    def norm(self, name: str, x):
        """`layers.rms_norm` with the layer's weight `name` ([D])."""
        return layers.rms_norm(x, self.param(name, _ones, (x.shape[-1],), self.cfg.jnp_param_dtype), self.cfg.norm_eps)

    def dense(self, name: str, x, shape: tuple[int, int]):
        return layers.dense(x, self.param(name, _normal, shape, self.cfg.jnp_param_dtype), self.cfg.jnp_dtype)

    def with_lora(self, target: str, x, y, dropout_key):
        """y plus the layer's LoRA term for `target` on input x (y unchanged without one)."""
        lora = self.get_variable("params", "lora") if self.has_variable("params", "lora") else None
        d = None if lora is None else lora_lib.delta(lora, target, x, self.cfg.jnp_dtype, dropout_key)
        return y if d is None else y + d.reshape(y.shape).astype(y.dtype)


class Attention(_LayerPart):
    """Pre-norm attention with residual; parameters attn_norm [D], qkv [D, C] (fused q, k, v and the optional
    output gate), qkv_bias [C] (Qwen2), q_norm / k_norm [H] (Qwen3), o [N*H, D]. With a cache, the new k/v are
    written at write_index and attention runs over the whole cache (the mask hides unwritten slots). Returns
    (x, new kv cache). LoRA adapters add to the q, k, v and o outputs; dropout_key: their dropout (training)."""

    @nn.compact
    def __call__(self, x_BxTxD, cos, sin, mask_BxTxS, kv_cache=None, write_index_B=None, dropout_key=None):
        cfg = self.cfg
        width = cfg.q_dim + 2 * cfg.kv_dim + (cfg.q_dim if cfg.attn_output_gate else 0)
        h = self.norm("attn_norm", x_BxTxD)
        qkv = self.dense("qkv", h, (cfg.d_model, width))
        if cfg.qkv_bias:
            qkv = qkv + self.param("qkv_bias", _zeros, (width,), cfg.jnp_param_dtype).astype(cfg.jnp_dtype)
        q, k, v, gate = layers.split_qkv(cfg, qkv)
        q, k, v = (self.with_lora(t, h, y, dropout_key) for t, y in (("q", q), ("k", k), ("v", v)))
        if cfg.qk_norm:  # Qwen3: each head's q and k RMS-normalised over H, before the rotation
            q, k = self.norm("q_norm", q), self.norm("k_norm", k)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        if kv_cache is None:  # teacher forcing / training: XLA's fused-friendly attention, fast backward
            y = layers.causal_attention(q, k, v, mask_BxTxS).reshape(q.shape[0], q.shape[1], -1)
        else:
            k = layers.write_cache(kv_cache["k"], k.transpose(0, 2, 3, 1), write_index_B, axis=3)  # [B, K, H, S]
            v = layers.write_cache(kv_cache["v"], v.transpose(0, 2, 1, 3), write_index_B, axis=2)  # [B, K, S, H]
            kv_cache = {"k": k, "v": v}
            y = layers.attend(cfg, q, k, v, mask_BxTxS)
        if gate is not None:
            y = y * jax.nn.sigmoid(gate.astype(jnp.float32)).astype(y.dtype)
        return x_BxTxD + self.with_lora("o", y, self.dense("o", y, (cfg.q_dim, cfg.d_model)), dropout_key), kv_cache


class MLP(_LayerPart):
    """Pre-norm SwiGLU MLP with residual, x + down(silu(gate(h)) * up(h)); parameters mlp_norm [D], gate_up
    [D, 2F] (fused), down [F, D]. LoRA adapters add to the gate, up and down outputs."""

    @nn.compact
    def __call__(self, x_BxTxD, dropout_key=None):
        cfg = self.cfg
        h = self.norm("mlp_norm", x_BxTxD)
        gate, up = jnp.split(self.dense("gate_up", h, (cfg.d_model, 2 * cfg.mlp_dim)), 2, axis=-1)
        gate, up = self.with_lora("gate", h, gate, dropout_key), self.with_lora("up", h, up, dropout_key)
        act = jax.nn.silu(gate) * up
        return x_BxTxD + self.with_lora("down", act, self.dense("down", act, (cfg.mlp_dim, cfg.d_model)), dropout_key)


class DecoderLayer(nn.Module):
    """One decoder block, attention then MLP (both pre-norm with residual), their parameters in one flat dict.
    Returns (x, the layer's new kv cache or None)."""

    cfg: ModelConfig

    def setup(self):
        self.attention, self.mlp = Attention(self.cfg), MLP(self.cfg)
        nn.share_scope(self, self.attention)
        nn.share_scope(self, self.mlp)

    def __call__(self, x_BxTxD, cos, sin, mask_BxTxS, kv_cache=None, write_index_B=None, dropout_key=None):
        x, kv_cache = self.attention(x_BxTxD, cos, sin, mask_BxTxS, kv_cache, write_index_B, dropout_key)
        return self.mlp(x, dropout_key), kv_cache


def _train_layer(layer: DecoderLayer, x, cos, sin, mask, dropout_key):
    """A layer on the cache-free path, the unit `Decoder` checkpoints (`nn.remat`) under ModelConfig.remat."""
    return layer(x, cos, sin, mask, dropout_key=dropout_key)[0]


class Decoder(nn.Module):
    """The decoder LM: embed [V, D], layers_0 ... layers_{n-1} (`DecoderLayer`), final_norm [D] and lm_head
    [D, V] (absent when embeddings are tied). `__call__(tokens, positions, *, attn_mask, cache, dropout_key)
    -> (logits [B, T, V] float32, cache)`, the contract of `models.transformer.forward`."""

    cfg: ModelConfig

    def setup(self):
        cfg, pdtype = self.cfg, self.cfg.jnp_param_dtype
        self.embed = self.param("embed", _normal, (cfg.vocab_size, cfg.d_model), pdtype)
        self.layers = [DecoderLayer(cfg) for _ in range(cfg.n_layers)]
        self.final_norm = self.param("final_norm", _ones, (cfg.d_model,), pdtype)
        if not cfg.tie_embeddings:
            self.lm_head = self.param("lm_head", _normal, (cfg.d_model, cfg.vocab_size), pdtype)

    def __call__(self, tokens, positions, *, attn_mask=None, cache=None, dropout_key=None):
        cfg = self.cfg
        b, t = tokens.shape
        valid = jnp.ones((b, t), bool) if attn_mask is None else attn_mask.astype(bool)
        x = self.embed[tokens].astype(cfg.jnp_dtype)
        cos, sin = rope_cos_sin(cfg, positions)
        if cache is None:  # the training / teacher-forcing path: the only one ever differentiated
            mask = jnp.tril(jnp.ones((t, t), bool))[None] & valid[:, None, :]  # [B, T, T]
            run = _train_layer if cfg.remat == "none" else nn.remat(_train_layer, policy=remat_policy(cfg.remat))
            for i, layer in enumerate(self.layers):
                x = run(layer, x, cos, sin, mask, None if dropout_key is None else jax.random.fold_in(dropout_key, i))
            return self.unembed(x), None
        # prefill / decode (the sampler): never differentiated, so never checkpointed
        write_index = cache["end_index"]
        key_mask = layers.write_cache(cache["mask"], valid, write_index)  # [B, S]
        slots = jnp.arange(key_mask.shape[1])
        query_slot = jnp.broadcast_to(write_index, (b,))[:, None] + jnp.arange(t)  # [B, T]
        mask = (slots[None, None, :] <= query_slot[:, :, None]) & key_mask[:, None, :]  # [B, T, S]
        new_layer_caches = []
        for layer, kv in zip(self.layers, cache["layers"]):
            x, kv = layer(x, cos, sin, mask, kv, write_index)
            new_layer_caches.append(kv)
        return self.unembed(x), {"layers": new_layer_caches, "end_index": write_index + t, "mask": key_mask}

    def unembed(self, x_BxTxD):
        """Final norm and LM head; logits accumulated and returned in float32."""
        x = layers.rms_norm(x_BxTxD, self.final_norm, self.cfg.norm_eps)
        head = self.embed.T if self.cfg.tie_embeddings else self.lm_head
        return jnp.einsum("btd,dv->btv", x, head.astype(x.dtype), preferred_element_type=jnp.float32)


def remat_policy(mode: str):
    """The `jax.checkpoint` policy of a ModelConfig.remat mode ("none" has none: the layer is not wrapped).

    "full": nothing saved inside the layer; its input is kept and the whole block is recomputed in the
    backward pass (least memory, about one extra forward of compute).
    "dots": `dots_with_no_batch_dims_saveable` (MaxText's remat_policy="minimal"). Our projections
    (`layers.dense`, "...d,df->...f": qkv, o, gate_up, down) are dot_generals without batch dimensions, so
    their outputs, O(T * (D + F)) per row, are saved; the attention products inside
    `jax.nn.dot_product_attention` (scores "BTNH,BSNH->BNTS" and probs @ V) are batched over (B, heads),
    so they are not saved and their O(T^2) score/probability tensors are recomputed. `dots_saveable`
    would also keep those T^2 tensors, the largest activations of a long sequence, and save little.
    The checkpoint only changes what the backward pass keeps versus recomputes; values and gradients are
    the same. prevent_cse stays True (the default), as JAX recommends for checkpoints outside a `lax.scan`
    (our layers are a Python loop)."""
    if mode == "full":
        return jax.checkpoint_policies.nothing_saveable
    if mode == "dots":
        return jax.checkpoint_policies.dots_with_no_batch_dims_saveable
    raise ValueError(f"remat_policy: no checkpoint policy for ModelConfig.remat={mode!r}")


def variables(params: dict) -> dict:
    """The repo's parameter pytree as `Decoder`'s linen variables: the list `layers` as layers_0, layers_1, ..."""
    rest = {k: v for k, v in params.items() if k != "layers"}
    return {"params": {**rest, **{f"layers_{i}": p for i, p in enumerate(params["layers"])}}}


def canonical(variables_: dict) -> dict:
    """`variables` inverted: `Decoder.init`'s output as the repo's parameter pytree."""
    p = dict(variables_["params"])
    n = sum(1 for k in p if k.startswith("layers_"))
    return {**{k: v for k, v in p.items() if not k.startswith("layers_")}, "layers": [p[f"layers_{i}"] for i in range(n)]}
