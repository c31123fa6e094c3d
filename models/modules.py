"""The decoder as Flax linen modules: embedding, RMSNorm, attention (RoPE / 2D-RoPE / M-RoPE, KV cache, GQA,
optional output gate), SwiGLU MLP, the decoder layer, the decoder with its LM head, and LoRA adapters on the
projections.

Linen, not nnx: a linen module holds no state, `Decoder(cfg).apply(variables, ...)` is a pure function of a
parameter pytree, so everything that jits, shards, differentiates, checkpoints or updates keeps seeing plain
arrays; nnx objects would have to be split into (graphdef, state) at every one of those boundaries.

Parameters keep the repo's one layout (models.transformer, models.layers): each layer's dict is flat (the
attention and MLP, and their norms, projections and adapters, share the layer's scope, `nn.share_scope`; the
embedding and the head share the decoder's), so parameter names are those of the sharding
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


def _shared(parent: nn.Module, child: nn.Module) -> nn.Module:
    """`child` with its parameters in `parent`'s own dict (`nn.share_scope`): the flat layout. Children that
    share a scope need distinct names (`<parameter>_rms`, `_dense`, `_lora`), which appear in no parameter path."""
    nn.share_scope(parent, child)
    return child


class RMSNorm(nn.Module):
    """weight * x / sqrt(mean(x^2) + eps), statistics in float32 (`layers.rms_norm`); the weight [x's last dim] is
    the parameter `weight_name` of the scope it shares (attn_norm, q_norm, ..., final_norm)."""

    cfg: ModelConfig
    weight_name: str

    @nn.compact
    def __call__(self, x):
        weight = self.param(self.weight_name, _ones, (x.shape[-1],), self.cfg.jnp_param_dtype)
        return layers.rms_norm(x, weight, self.cfg.norm_eps)


class Dense(nn.Module):
    """x @ W in the compute dtype (`layers.dense`), W [in, out] the parameter `weight_name` of the shared scope."""

    cfg: ModelConfig
    weight_name: str
    features: int

    @nn.compact
    def __call__(self, x):
        w = self.param(self.weight_name, _normal, (x.shape[-1], self.features), self.cfg.jnp_param_dtype)
        return layers.dense(x, w, self.cfg.jnp_dtype)


class LoRA(nn.Module):
    """A projection's low-rank adapter: y + scale * (dropout(x) A) B (`models.lora.delta`), the layer's adapters
    read from its "lora" entry (an `models.lora.Attached`, placed by `lora.attach`); y as it is when the layer
    has none, or none on this target. Dropout only with a key (training)."""

    cfg: ModelConfig
    target: str

    def __call__(self, x, y, dropout_key=None):
        adapters = self.get_variable("params", "lora") if self.has_variable("params", "lora") else None
        d = None if adapters is None else lora_lib.delta(adapters, self.target, x, self.cfg.jnp_dtype, dropout_key)
        return y if d is None else y + d.reshape(y.shape).astype(y.dtype)


class _Block(nn.Module):
    """Attention or MLP: its norms, projections and adapters keep their parameters in the layer's flat dict."""

    cfg: ModelConfig

    def norm(self, weight: str) -> RMSNorm:
        return _shared(self, RMSNorm(self.cfg, weight, name=f"{weight}_rms"))

    def dense(self, weight: str, features: int) -> Dense:
        return _shared(self, Dense(self.cfg, weight, features, name=f"{weight}_dense"))

    def lora(self, target: str) -> LoRA:
        return _shared(self, LoRA(self.cfg, target, name=f"{target}_lora"))


class Attention(_Block):
    """Pre-norm attention with residual; parameters attn_norm [D], qkv [D, C] (fused q, k, v and the optional
    output gate), qkv_bias [C] (Qwen2), q_norm / k_norm [H] (Qwen3), o [N*H, D], all in the layer's dict. With a
    cache, the new k/v are written at write_index and attention runs over the whole cache (the mask hides
    unwritten slots). Returns (x, new kv cache). LoRA adds to the q, k, v and o outputs."""

    @nn.compact
    def __call__(self, x_BxTxD, cos, sin, mask_BxTxS, kv_cache=None, write_index_B=None, dropout_key=None):
        cfg = self.cfg
        width = cfg.q_dim + 2 * cfg.kv_dim + (cfg.q_dim if cfg.attn_output_gate else 0)
        h = self.norm("attn_norm")(x_BxTxD)
        qkv = self.dense("qkv", width)(h)
        if cfg.qkv_bias:
            qkv = qkv + self.param("qkv_bias", _zeros, (width,), cfg.jnp_param_dtype).astype(cfg.jnp_dtype)
        q, k, v, gate = layers.split_qkv(cfg, qkv)
        q, k, v = (self.lora(t)(h, y, dropout_key) for t, y in (("q", q), ("k", k), ("v", v)))
        if cfg.qk_norm:  # Qwen3: each head's q and k RMS-normalised over H, before the rotation
            q, k = self.norm("q_norm")(q), self.norm("k_norm")(k)
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
        return x_BxTxD + self.lora("o")(y, self.dense("o", cfg.d_model)(y), dropout_key), kv_cache


class MLP(_Block):
    """Pre-norm SwiGLU MLP with residual, x + down(silu(gate(h)) * up(h)); parameters mlp_norm [D], gate_up
    [D, 2F] (fused), down [F, D], in the layer's dict. LoRA adds to the gate, up and down outputs."""

    @nn.compact
    def __call__(self, x_BxTxD, dropout_key=None):
        cfg = self.cfg
        h = self.norm("mlp_norm")(x_BxTxD)
        gate, up = jnp.split(self.dense("gate_up", 2 * cfg.mlp_dim)(h), 2, axis=-1)
        gate, up = self.lora("gate")(h, gate, dropout_key), self.lora("up")(h, up, dropout_key)
        act = jax.nn.silu(gate) * up
        return x_BxTxD + self.lora("down")(act, self.dense("down", cfg.d_model)(act), dropout_key)


class Embed(nn.Module):
    """The token embedding, `embed` [V, D]; `attend(x)` is the tied LM head (x @ embed^T)."""

    cfg: ModelConfig

    def setup(self):
        self.table = self.param("embed", _normal, (self.cfg.vocab_size, self.cfg.d_model), self.cfg.jnp_param_dtype)

    def __call__(self, tokens):
        return self.table[tokens].astype(self.cfg.jnp_dtype)


class LMHead(nn.Module):
    """Final norm and LM head, `final_norm` [D] and `lm_head` [D, V] (or the embedding's transpose when tied);
    logits accumulated and returned in float32."""

    cfg: ModelConfig

    @nn.compact
    def __call__(self, x_BxTxD, embed_VxD):
        cfg = self.cfg
        x = _shared(self, RMSNorm(cfg, "final_norm", name="final_norm_rms"))(x_BxTxD)
        head = embed_VxD.T if cfg.tie_embeddings else self.param("lm_head", _normal, (cfg.d_model, cfg.vocab_size),
                                                                 cfg.jnp_param_dtype)
        return jnp.einsum("btd,dv->btv", x, head.astype(x.dtype), preferred_element_type=jnp.float32)


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
        return layers.constrain_rows(self.mlp(x, dropout_key)), kv_cache


def _train_layer(layer: DecoderLayer, x, cos, sin, mask, dropout_key):
    """A layer on the cache-free path, the unit `Decoder` checkpoints (`nn.remat`) under ModelConfig.remat."""
    return layer(x, cos, sin, mask, dropout_key=dropout_key)[0]


class Decoder(nn.Module):
    """The decoder LM: `Embed` (embed [V, D]), layers_0 ... layers_{n-1} (`DecoderLayer`), `LMHead` (final_norm
    [D], lm_head [D, V], absent when embeddings are tied). `__call__(tokens, positions, *, attn_mask, cache,
    dropout_key) -> (logits [B, T, V] float32, cache)`, the contract of `models.transformer.forward`."""

    cfg: ModelConfig

    def setup(self):
        cfg = self.cfg
        self.embedding, self.head = Embed(cfg), LMHead(cfg)
        nn.share_scope(self, self.embedding)
        nn.share_scope(self, self.head)
        self.layers = [DecoderLayer(cfg) for _ in range(cfg.n_layers)]

    def __call__(self, tokens, positions, *, attn_mask=None, cache=None, dropout_key=None, hidden=False):
        """hidden=True (cache-free path only): the last layer's output [B, T, D] instead of the logits, for a
        caller that applies the head itself (`models.transformer.head_logits`) to a slice of the positions."""
        cfg = self.cfg
        b, t = tokens.shape
        valid = jnp.ones((b, t), bool) if attn_mask is None else attn_mask.astype(bool)
        x = layers.constrain_rows(self.embedding(tokens))
        cos, sin = rope_cos_sin(cfg, positions)
        if cache is None:  # the training / teacher-forcing path: the only one ever differentiated
            mask = jnp.tril(jnp.ones((t, t), bool))[None] & valid[:, None, :]  # [B, T, T]
            if cfg.scan_layers and not self.is_initializing():
                stacked = [self.variables["params"][f"layers_{i}"] for i in range(cfg.n_layers)]
                x = scan_layers(cfg, stacked, x, cos, sin, mask, dropout_key)
            else:
                run = _train_layer if cfg.remat == "none" else nn.remat(_train_layer, policy=remat_policy(cfg.remat))
                for i, layer in enumerate(self.layers):
                    key = None if dropout_key is None else jax.random.fold_in(dropout_key, i)
                    x = run(layer, x, cos, sin, mask, key)
            return (x if hidden else self.head(x, self.embedding.table)), None
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
        return self.head(x, self.embedding.table), {"layers": new_layer_caches, "end_index": write_index + t,
                                                "mask": key_mask}


def scan_layers(cfg: ModelConfig, layer_params: list, x_BxTxD, cos, sin, mask_BxTxS, dropout_key=None):
    """The cache-free layers as one `lax.scan` over their weights stacked on a leading [n_layers] axis
    (ModelConfig.scan_layers): XLA compiles one layer body instead of n_layers copies, so compile time stops
    growing with depth (MaxText's scan_layers). Layer i computes exactly what the unrolled loop's layer i does,
    its dropout key fold_in(dropout_key, i) too. The stack is a copy of the weights made inside the program
    (a params-sized temporary per chip, freed after the forward; its gradient is sliced back per layer)."""
    stacked = jax.tree.map(lambda *leaves: jnp.stack(leaves), *layer_params)
    layer = DecoderLayer(cfg, parent=None)  # a module of its own, applied to each layer's weights

    def body(x, xs):
        params, i = xs
        key = None if dropout_key is None else jax.random.fold_in(dropout_key, i)
        return layer.apply({"params": params}, x, cos, sin, mask_BxTxS, dropout_key=key)[0], None

    if cfg.remat != "none":  # inside a scan, prevent_cse=False is JAX's advice: the loop already keeps XLA from CSE
        body = jax.checkpoint(body, policy=remat_policy(cfg.remat), prevent_cse=False)
    return jax.lax.scan(body, x_BxTxD, (stacked, jnp.arange(cfg.n_layers)))[0]


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
    rest = {k: v for k, v in p.items() if not k.startswith("layers_")}
    return {**rest, "layers": [p[f"layers_{i}"] for i in range(n)]}
