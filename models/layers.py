"""The decoder's primitives as pure functions of arrays: RMSNorm, dense, the fused-qkv split, GQA attention over the
cache, blockwise causal attention and the cache write. The modules that hold the parameters and compose these
are in models/modules.py.

Letter legend: B batch, T query time, S key/cache time, D model width, N query heads, K kv heads,
G = N / K query heads per kv head, H head dim, F MLP width.

Per-layer parameter layout (one dict per layer; projections fused so a step issues few large matmuls;
`models.hf` converts to and from Hugging Face's separate q/k/v and gate/up tensors):
    attn_norm [D]   qkv [D, N*H + 2*K*H (+ N*H gate columns)]   qkv_bias [same]   o [N*H, D]
    q_norm [H]      k_norm [H]                                  (qk_norm: Qwen3)
    mlp_norm [D]    gate_up [D, 2*F]                            down [F, D]
    lora            an `models.lora.Attached` (only in params from `models.lora.attach`): each targeted
                    projection adds scale * (dropout(x) A) B to its output columns
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from models.config import ModelConfig

MASK_VALUE = -1e30  # finite, so a query with no visible key (a padding row) gives a uniform, not NaN, softmax


def rms_norm(x: jnp.ndarray, weight: jnp.ndarray, eps: float) -> jnp.ndarray:
    """weight * x / sqrt(mean(x^2) + eps), statistics in float32 (as HF Llama/Qwen2)."""
    x32 = x.astype(jnp.float32)
    normed = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + eps)
    return weight.astype(x.dtype) * normed.astype(x.dtype)


def dense(x: jnp.ndarray, w: jnp.ndarray, dtype) -> jnp.ndarray:
    return jnp.einsum("...d,df->...f", x.astype(dtype), w.astype(dtype))


def split_qkv(cfg: ModelConfig, qkv_BxTxC: jnp.ndarray):
    """Split fused projections into q [B,T,N,H], k, v [B,T,K,H] and the optional gate [B,T,N*H]."""
    b, t, _ = qkv_BxTxC.shape
    q_end, k_end, v_end = cfg.q_dim, cfg.q_dim + cfg.kv_dim, cfg.q_dim + 2 * cfg.kv_dim
    q = qkv_BxTxC[..., :q_end].reshape(b, t, cfg.n_heads, cfg.head_dim)
    k = qkv_BxTxC[..., q_end:k_end].reshape(b, t, cfg.n_kv_heads, cfg.head_dim)
    v = qkv_BxTxC[..., k_end:v_end].reshape(b, t, cfg.n_kv_heads, cfg.head_dim)
    gate = qkv_BxTxC[..., v_end:] if cfg.attn_output_gate else None
    return q, k, v, gate


def attend(cfg: ModelConfig, q_BxTxNxH, k_BxKxHxS, v_BxKxSxH, mask_BxTxS) -> jnp.ndarray:
    """Grouped-query softmax attention; scores and softmax in float32. Returns [B, T, N*H].

    Keys and values come head-major in the cache layout (keys [B, K, H, S], values [B, K, S, H]), so both
    products are plain batched matmuls over (B, K) and the cache is never transposed."""
    b, t, n, h = q_BxTxNxH.shape
    kv = cfg.n_kv_heads
    q = q_BxTxNxH.reshape(b, t, kv, n // kv, h)
    if t == 1:  # decode: no query-time axis, so no transposes around the two products
        return _attend_one(q[:, 0], k_BxKxHxS, v_BxKxSxH, mask_BxTxS[:, 0]).reshape(b, 1, n * h)
    scores = jnp.einsum("btkgh,bkhs->bkgts", q, k_BxKxHxS, preferred_element_type=jnp.float32)
    scores = scores * (h**-0.5)
    scores = jnp.where(mask_BxTxS[:, None, None, :, :], scores, MASK_VALUE)
    probs = jax.nn.softmax(scores, axis=-1).astype(v_BxKxSxH.dtype)
    out = jnp.einsum("bkgts,bksh->btkgh", probs, v_BxKxSxH)
    return out.reshape(b, t, n * h)


def _attend_one(q_BxKxGxH, k_BxKxHxS, v_BxKxSxH, mask_BxS) -> jnp.ndarray:
    """One query per row against the cache: [B, K, G, H] -> [B, K, G, H]. Written without a query-time
    axis (the T = 1 einsum above costs transposes XLA:CPU does not remove) and with keys stored [H, S], so
    both products are plain batched matmuls. Measured per decode (experiments/PERF.md #2-#3, #11): 0.94 s -> 0.75 s
    for the benchmark rollout on 2 devices; a broadcast multiply + reduce form was as fast there but
    10-20x slower when G = 1 (n_heads == n_kv_heads), so it was dropped."""
    f32 = jnp.float32
    h = q_BxKxGxH.shape[-1]
    scores = jnp.einsum("bkgh,bkhs->bkgs", q_BxKxGxH, k_BxKxHxS, preferred_element_type=f32)
    scores = jnp.where(mask_BxS[:, None, None, :], scores * (h**-0.5), MASK_VALUE)  # [B, K, G, S]
    probs = jax.nn.softmax(scores, axis=-1).astype(v_BxKxSxH.dtype)
    return jnp.einsum("bkgs,bksh->bkgh", probs, v_BxKxSxH, preferred_element_type=f32).astype(v_BxKxSxH.dtype)


# The mesh axes a decoder's activations split their rows over when the caller sets a mesh (`jax.set_mesh`);
# grpo_jax.sharding.RULES["batch"] names the same axes for the data. Without the constraint XLA may follow the
# fsdp-split embedding instead and split the residual stream's D over fsdp, which turns every projection into
# an all-reduce of its output: a Qwen2.5-0.5B train step on v5e:2x4 moved 40 GB of all-reduce per chip (docs/tpu.md).
ACTIVATION_ROW_AXES = ("data", "fsdp")


def constrain_rows(x: jnp.ndarray) -> jnp.ndarray:
    """x with its leading (row) dimension split over the current mesh's ACTIVATION_ROW_AXES and the rest
    whole on each device; x as it is when no mesh is set, those axes are all of size 1 or manual (inside a
    shard_map each device holds its own rows already), or the rows do not divide (a program on one device is
    unchanged)."""
    mesh = jax.sharding.get_abstract_mesh()
    if mesh.empty:
        return x
    manual = {a for a, t in zip(mesh.axis_names, mesh.axis_types) if t == jax.sharding.AxisType.Manual}
    axes = tuple(a for a in ACTIVATION_ROW_AXES if a in mesh.axis_names and mesh.shape[a] > 1 and a not in manual)
    ways = 1
    for a in axes:
        ways *= mesh.shape[a]
    if not axes or x.shape[0] % ways:
        return x
    spec = jax.sharding.PartitionSpec(axes if len(axes) > 1 else axes[0], *([None] * (x.ndim - 1)))
    return jax.lax.with_sharding_constraint(x, spec)


CAUSAL_BLOCK = 128  # query rows per block in causal_attention (experiments/PERF.md)


def causal_attention(q_BxTxNxH, k_BxTxKxH, v_BxTxKxH, mask_BxTxS, block: int = CAUSAL_BLOCK) -> jnp.ndarray:
    """Self-attention under a mask that is causal (query i sees no key j > i) and padding, without the
    upper triangle: query block [s, e) attends to keys [0, e) only, so a sequence of n blocks computes
    (n + 1) / 2n of the dense L^2 scores (60% at L = 528; measured 1.4x faster forward + backward there,
    experiments/PERF.md). Sequences shorter than two blocks take one dense call. Every query that sees at least one
    key gets exactly the dense result (the skipped keys are masked for it anyway); a padding query that
    sees none gets a meaningless uniform average either way, over different keys. Returns [B, T, N, H]."""
    t = q_BxTxNxH.shape[1]
    if t < 2 * block:
        return jax.nn.dot_product_attention(q_BxTxNxH, k_BxTxKxH, v_BxTxKxH, mask=mask_BxTxS[:, None])
    outs = []
    for start in range(0, t, block):
        end = min(t, start + block)
        outs.append(jax.nn.dot_product_attention(q_BxTxNxH[:, start:end], k_BxTxKxH[:, :end], v_BxTxKxH[:, :end],
                                                 mask=mask_BxTxS[:, None, start:end, :end]))
    return jnp.concatenate(outs, axis=1)


def write_cache(cache: jnp.ndarray, new: jnp.ndarray, index_B: jnp.ndarray, *, axis: int = 1) -> jnp.ndarray:
    """Write T new entries along the slot `axis` at each row's index (leading dim is the batch).

    A scalar index (all rows aligned, as in the sampler) is one dynamic_update_slice; a per-row index [B]
    is a dynamic_update_slice per row (vmapped, which XLA lowers to a scatter)."""
    new = new.astype(cache.dtype)
    if index_B.ndim == 0:
        start = [0] * cache.ndim
        start[axis] = index_B
        return jax.lax.dynamic_update_slice(cache, new, tuple(start))

    def one(c, u, i):
        start = [0] * c.ndim
        start[axis - 1] = i
        return jax.lax.dynamic_update_slice(c, u, tuple(start))

    return jax.vmap(one)(cache, new, index_B)
