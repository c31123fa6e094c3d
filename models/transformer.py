"""The decoder LM as pure functions: `init_params`, `init_cache`, `forward` (the linen `models.modules.Decoder`
applied to a parameter pytree), and float32 token log-probs / entropies.

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
decoder layer under `nn.remat` ("full" or "dots", see `models.modules.remat_policy`); the cached path is
unchanged.
"""

from __future__ import annotations

import functools
import importlib

import flax.linen as nn
import jax
import jax.numpy as jnp

from models import modules
from models.config import ModelConfig
from models.keys import as_typed_key
from models.modules import INIT_STD
from models.rope import rope_positions


@functools.cache
def _module_class(path: str):
    """The class `package.module:Class` names (a config's `module`; grpo_jax.build checks it first, naming the
    key, so this is the plain lookup)."""
    module_name, _, attribute = path.partition(":")
    obj = importlib.import_module(module_name)
    for part in attribute.split("."):
        obj = getattr(obj, part)
    return obj


def decoder(cfg: ModelConfig) -> nn.Module:
    """The linen module `forward` applies: `cfg.module`'s class built as Class(cfg), else the built-in
    `models.modules.Decoder`."""
    return _module_class(cfg.module)(cfg) if cfg.module else modules.Decoder(cfg)


def init_params(cfg: ModelConfig, key: jax.Array) -> dict:
    """Random weights: normal(0, 0.02) matrices, unit norms, zero biases (as transformers' init). A module of
    your own (`cfg.module`) is initialised by its own `init` on one token."""
    key = as_typed_key(key)
    if cfg.module:
        tokens = jnp.zeros((1, 1), jnp.int32)
        return dict(decoder(cfg).init(key, tokens, rope_positions(cfg, jnp.zeros((1, 1), jnp.int32)))["params"])
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
    """Logits [B, T, V] (float32) for tokens [B, T] at RoPE positions ([B,T], [2,B,T] or [3,B,T]): the linen
    module of `decoder(cfg)` applied to the params (a pure function of them).

    attn_mask [B, T]: 1 for real tokens, 0 for padding (keys that nobody may attend to).
    Without a cache: causal self-attention over the T tokens. With a cache: the T tokens are written at
    each row's `end_index` and attend to everything written before them; the updated cache is returned.
    dropout_key: LoRA adapter dropout in the cache-free (training) forward, layer i's key fold_in(key, i);
    None (sampling, logprob passes) = no dropout. Params without adapters ignore it.
    """
    # your own module's parameters are its linen params as they are; the built-in's list of layers is renamed
    variables = {"params": params} if cfg.module else modules.variables(params)
    return decoder(cfg).apply(variables, tokens, positions, attn_mask=attn_mask, cache=cache, dropout_key=dropout_key)


def forward_hidden(cfg: ModelConfig, params: dict, tokens: jnp.ndarray, positions: jnp.ndarray, *,
                   attn_mask: jnp.ndarray | None = None, dropout_key: jax.Array | None = None) -> jnp.ndarray:
    """The built-in decoder's cache-free forward up to the head: the last layer's output [B, T, D] (before
    the final norm), which `head_logits` turns into logits; `forward` = head_logits(forward_hidden(...))."""
    if cfg.module:
        raise ValueError(f"forward_hidden: the built-in decoder's; model.module={cfg.module!r} returns logits only")
    return decoder(cfg).apply(modules.variables(params), tokens, positions, attn_mask=attn_mask,
                              dropout_key=dropout_key, hidden=True)[0]


def head_logits(cfg: ModelConfig, params: dict, x_BxTxD: jnp.ndarray) -> jnp.ndarray:
    """Final norm and LM head on hidden states (`forward_hidden`), float32 logits [B, T, V]."""
    head = {k: params[k] for k in ("final_norm", "lm_head") if k in params}
    return modules.LMHead(cfg, parent=None).apply({"params": head}, x_BxTxD, params["embed"])


def token_logprobs(logits_BxTxV: jnp.ndarray, targets_BxT: jnp.ndarray) -> jnp.ndarray:
    """log softmax(logits)[target] in float32, [B, T]."""
    logits = logits_BxTxV.astype(jnp.float32)
    picked = jnp.take_along_axis(logits, targets_BxT[..., None], axis=-1)[..., 0]
    return picked - jax.nn.logsumexp(logits, axis=-1)


def token_entropy(logits_BxTxV: jnp.ndarray) -> jnp.ndarray:
    """Entropy of softmax(logits) in nats, float32, [B, T]."""
    logp = jax.nn.log_softmax(logits_BxTxV.astype(jnp.float32), axis=-1)
    return -jnp.sum(jnp.exp(logp) * logp, axis=-1)
