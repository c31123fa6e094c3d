"""The decoder LM: `init_params`, `init_cache`, `forward`, and float32 token log-probs / entropies.

Params are a plain pytree:
    {"embed": [V, D], "layers": [per-layer dict, see models.layers], "final_norm": [D], "lm_head": [D, V]}
(`lm_head` absent when embeddings are tied).

KV cache (one layout, fixed size, passed in and returned):
    {"layers": [{"k": [B, K, H, S], "v": [B, K, S, H]}, ...],   -- head-major, keys slot-minor (experiments/PERF.md)
     "end_index": [B] int32  -- next slot to write in each row ([] when all rows advance together),
     "mask": [B, S] bool     -- slots that hold a real (non-padding) token}
Prefill writes T slots per row at end_index and advances it by T; decode writes one. A query in slot i
sees slots j <= i whose mask is set, so left-padded prompts of different lengths share one cache.

Gradient checkpointing (ModelConfig.remat): the cache-free forward that training differentiates runs each
decoder layer under `jax.checkpoint` ("full" or "dots", see `remat_policy`); the cached path is unchanged.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from models import layers
from models.config import ModelConfig
from models.keys import as_typed_key
from models.rope import rope_cos_sin

INIT_STD = 0.02  # Hugging Face's default initializer_range


def init_params(cfg: ModelConfig, key: jax.Array) -> dict:
    """Random weights: normal(0, 0.02) matrices, unit norms, zero biases (as transformers' init)."""
    key = as_typed_key(key)
    dtype = cfg.jnp_param_dtype
    qkv_width = cfg.q_dim + 2 * cfg.kv_dim + (cfg.q_dim if cfg.attn_output_gate else 0)
    k_embed, k_head, k_layers = jax.random.split(key, 3)

    def normal(k, shape):
        return (INIT_STD * jax.random.normal(k, shape, jnp.float32)).astype(dtype)

    def layer(k):
        k_qkv, k_o, k_gu, k_down = jax.random.split(k, 4)
        p = {
            "attn_norm": jnp.ones((cfg.d_model,), dtype),
            "qkv": normal(k_qkv, (cfg.d_model, qkv_width)),
            "o": normal(k_o, (cfg.q_dim, cfg.d_model)),
            "mlp_norm": jnp.ones((cfg.d_model,), dtype),
            "gate_up": normal(k_gu, (cfg.d_model, 2 * cfg.mlp_dim)),
            "down": normal(k_down, (cfg.mlp_dim, cfg.d_model)),
        }
        if cfg.qkv_bias:
            p["qkv_bias"] = jnp.zeros((qkv_width,), dtype)
        if cfg.qk_norm:
            p["q_norm"] = jnp.ones((cfg.head_dim,), dtype)
            p["k_norm"] = jnp.ones((cfg.head_dim,), dtype)
        return p

    params = {
        "embed": normal(k_embed, (cfg.vocab_size, cfg.d_model)),
        "layers": [layer(jax.random.fold_in(k_layers, i)) for i in range(cfg.n_layers)],
        "final_norm": jnp.ones((cfg.d_model,), dtype),
    }
    if not cfg.tie_embeddings:
        params["lm_head"] = normal(k_head, (cfg.d_model, cfg.vocab_size))
    return params


def init_cache(cfg: ModelConfig, batch: int, max_len: int, *, dtype=None, aligned: bool = False) -> dict:
    """An empty fixed-size KV cache of max_len slots per row (compute dtype unless given).

    aligned=True keeps one shared write index (shape []) instead of one per row: valid when every call
    writes the same number of slots to every row (left-padded prompts, then one token per step), and it
    turns the per-row scatter into a single slice update."""
    dtype = cfg.jnp_dtype if dtype is None else dtype
    k_shape = (batch, cfg.n_kv_heads, cfg.head_dim, max_len)
    v_shape = (batch, cfg.n_kv_heads, max_len, cfg.head_dim)
    return {
        "layers": [{"k": jnp.zeros(k_shape, dtype), "v": jnp.zeros(v_shape, dtype)} for _ in range(cfg.n_layers)],
        "end_index": jnp.zeros(() if aligned else (batch,), jnp.int32),
        "mask": jnp.zeros((batch, max_len), bool),
    }


def grow_cache(cache: dict, max_len: int) -> dict:
    """The same cache with room for max_len slots (new slots empty and masked out): lets a decoder start
    with a short cache and lengthen it in a few steps, so attention never streams slots no token has
    reached yet (the sampler's decode chunks, experiments/PERF.md)."""
    extra = max_len - cache["mask"].shape[1]
    if extra < 0:
        raise ValueError(f"grow_cache: cache already has {cache['mask'].shape[1]} slots > max_len {max_len}")
    if extra == 0:
        return cache

    def pad(x, axis):
        widths = [(0, 0)] * x.ndim
        widths[axis] = (0, extra)
        return jnp.pad(x, widths)

    return {"layers": [{"k": pad(kv["k"], 3), "v": pad(kv["v"], 2)} for kv in cache["layers"]],
            "end_index": cache["end_index"], "mask": pad(cache["mask"], 1)}


def forward(
    cfg: ModelConfig,
    params: dict,
    tokens: jnp.ndarray,
    positions: jnp.ndarray,
    *,
    attn_mask: jnp.ndarray | None = None,
    cache: dict | None = None,
    dropout_key: jax.Array | None = None,
) -> tuple[jnp.ndarray, dict | None]:
    """Logits [B, T, V] (float32) for tokens [B, T] at RoPE positions ([B,T], [2,B,T] or [3,B,T]).

    attn_mask [B, T]: 1 for real tokens, 0 for padding (keys that nobody may attend to).
    Without a cache: causal self-attention over the T tokens. With a cache: the T tokens are written at
    each row's `end_index` and attend to everything written before them; the updated cache is returned.
    dropout_key: LoRA adapter dropout in the cache-free (training) forward, layer i's key fold_in(key, i);
    None (sampling, logprob passes) = no dropout. Params without adapters ignore it.
    """
    b, t = tokens.shape
    valid = jnp.ones((b, t), bool) if attn_mask is None else attn_mask.astype(bool)
    x = params["embed"][tokens].astype(cfg.jnp_dtype)
    cos, sin = rope_cos_sin(cfg, positions)
    if cache is None:
        mask = jnp.tril(jnp.ones((t, t), bool))[None] & valid[:, None, :]  # [B, T, T]
        layer_caches, write_index = [None] * cfg.n_layers, None
    else:
        write_index = cache["end_index"]
        key_mask = layers.write_cache(cache["mask"], valid, write_index)  # [B, S]
        slots = jnp.arange(key_mask.shape[1])
        query_slot = jnp.broadcast_to(write_index, (b,))[:, None] + jnp.arange(t)  # [B, T]
        mask = (slots[None, None, :] <= query_slot[:, :, None]) & key_mask[:, None, :]  # [B, T, S]
        layer_caches = cache["layers"]
    new_layer_caches = []
    if cache is None:  # the training / teacher-forcing path: the only one ever differentiated
        layer = remat_layer(cfg)
        for i, p in enumerate(params["layers"]):
            x = layer(p, x, cos, sin, mask, None if dropout_key is None else jax.random.fold_in(dropout_key, i))
    else:  # prefill / decode (the sampler): never differentiated, so never checkpointed
        for p, kv in zip(params["layers"], layer_caches):
            x, kv = layers.attention_block(cfg, p, x, cos, sin, mask, kv, write_index)
            x = layers.mlp_block(cfg, p, x)
            new_layer_caches.append(kv)
    logits = unembed(cfg, params, x)
    if cache is None:
        return logits, None
    return logits, {"layers": new_layer_caches, "end_index": write_index + t, "mask": key_mask}


def decoder_layer(cfg: ModelConfig, p: dict, x_BxTxD, cos, sin, mask_BxTxT, dropout_key=None) -> jnp.ndarray:
    """One decoder block without a KV cache (attention then MLP, both pre-norm with residual): the unit
    that `remat_layer` checkpoints. dropout_key: the layer's LoRA dropout key (each target folds in its own
    index, `models.lora.delta`)."""
    x, _ = layers.attention_block(cfg, p, x_BxTxD, cos, sin, mask_BxTxT, dropout_key=dropout_key)
    return layers.mlp_block(cfg, p, x, dropout_key=dropout_key)


def remat_policy(mode: str):
    """The `jax.checkpoint` policy of a ModelConfig.remat mode ("none" has none: the layer is not wrapped).

    "full": nothing saved inside the layer; its input is kept and the whole block is recomputed in the
    backward pass (least memory, about one extra forward of compute).
    "dots": `dots_with_no_batch_dims_saveable` (MaxText's remat_policy="minimal"). Our projections
    (`layers.dense`, "...d,df->...f": qkv, o, gate_up, down) are dot_generals without batch dimensions, so
    their outputs, O(T * (D + F)) per row, are saved; the attention products inside
    `jax.nn.dot_product_attention` (scores "BTNH,BSNH->BNTS" and probs @ V) are batched over (B, heads),
    so they are not saved and their O(T^2) score/probability tensors are recomputed. `dots_saveable`
    would also keep those T^2 tensors, the largest activations of a long sequence, and save little."""
    if mode == "full":
        return jax.checkpoint_policies.nothing_saveable
    if mode == "dots":
        return jax.checkpoint_policies.dots_with_no_batch_dims_saveable
    raise ValueError(f"remat_policy: no checkpoint policy for ModelConfig.remat={mode!r}")


def remat_layer(cfg: ModelConfig):
    """`layer(p, x, cos, sin, mask, dropout_key=None) -> x`: `decoder_layer` as is (cfg.remat == "none")
    or wrapped in `jax.checkpoint` with `remat_policy(cfg.remat)`. The checkpoint only changes what the backward pass
    keeps versus recomputes; values and gradients are the same. prevent_cse stays True (the default), as
    JAX recommends for checkpoints outside a `lax.scan` (our layers are a Python loop)."""
    def layer(p, x, cos, sin, mask, dropout_key=None):
        return decoder_layer(cfg, p, x, cos, sin, mask, dropout_key)

    if cfg.remat == "none":
        return layer
    return jax.checkpoint(layer, policy=remat_policy(cfg.remat))


def unembed(cfg: ModelConfig, params: dict, x_BxTxD: jnp.ndarray) -> jnp.ndarray:
    """Final norm and LM head; logits accumulated and returned in float32."""
    x = layers.rms_norm(x_BxTxD, params["final_norm"], cfg.norm_eps)
    head = params["embed"].T if cfg.tie_embeddings else params["lm_head"]
    return jnp.einsum("btd,dv->btv", x, head.astype(x.dtype), preferred_element_type=jnp.float32)


def token_logprobs(logits_BxTxV: jnp.ndarray, targets_BxT: jnp.ndarray) -> jnp.ndarray:
    """log softmax(logits)[target] in float32, [B, T]."""
    logits = logits_BxTxV.astype(jnp.float32)
    picked = jnp.take_along_axis(logits, targets_BxT[..., None], axis=-1)[..., 0]
    return picked - jax.nn.logsumexp(logits, axis=-1)


def token_entropy(logits_BxTxV: jnp.ndarray) -> jnp.ndarray:
    """Entropy of softmax(logits) in nats, float32, [B, T]."""
    logp = jax.nn.log_softmax(logits_BxTxV.astype(jnp.float32), axis=-1)
    return -jnp.sum(jnp.exp(logp) * logp, axis=-1)
