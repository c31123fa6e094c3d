"""Performance accounting shared by the benchmarks: FLOPs and minimum bytes counted from shapes, the
machine's own matmul peak and copy bandwidth, and the host-allocator setting that keeps big XLA:CPU
buffers from being page-faulted in on every call.

Counting conventions (experiments/PERF.md): a matmul [m, k] x [k, n] is 2*m*k*n FLOPs; attention counts QK^T and PV
over the keys actually read; the backward pass is 2x the forward. Minimum bytes are what a part must at
least move through memory once: its weights, its KV cache reads, its inputs and outputs.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import statistics
import sys
import time

import jax
import jax.numpy as jnp

from models.config import ModelConfig
from models.layers import CAUSAL_BLOCK


def matmul_params(cfg: ModelConfig) -> int:
    """Weights that every token multiplies through (all projections and the LM head; not embeddings)."""
    qkv = cfg.d_model * (cfg.q_dim + 2 * cfg.kv_dim + (cfg.q_dim if cfg.attn_output_gate else 0))
    per_layer = qkv + cfg.q_dim * cfg.d_model + 3 * cfg.d_model * cfg.mlp_dim
    return cfg.n_layers * per_layer + cfg.d_model * cfg.vocab_size


def attention_pairs(seq_len: int, block: int = CAUSAL_BLOCK) -> int:
    """Query-key pairs `models.layers.causal_attention` computes: all seq_len^2 under two blocks, else each
    query block against the keys up to its end."""
    if seq_len < 2 * block:
        return seq_len * seq_len
    return sum((min(seq_len, s + block) - s) * min(seq_len, s + block) for s in range(0, seq_len, block))


def forward_flops(cfg: ModelConfig, n_rows: int, seq_len: int) -> float:
    """Matmul FLOPs of one teacher-forced forward over n_rows x seq_len tokens, attention counted over
    the query-key pairs the kernel actually computes (`attention_pairs`)."""
    attention = cfg.n_layers * 2 * attention_pairs(seq_len) * cfg.n_heads * cfg.head_dim  # QK^T and PV
    return 2.0 * n_rows * (seq_len * matmul_params(cfg) + attention)


def decode_step_flops(cfg: ModelConfig, n_rows: int, cache_len: int) -> float:
    """One decode step: every row's new token through the weights and against cache_len keys."""
    return 2.0 * n_rows * (matmul_params(cfg) + cfg.n_layers * 2 * cache_len * cfg.n_heads * cfg.head_dim)


def decode_step_bytes(cfg: ModelConfig, n_rows: int, cache_len: int, itemsize: int = 4) -> float:
    """Minimum memory traffic of one decode step: the weights once and every row's K and V cache."""
    kv = n_rows * cfg.n_layers * 2 * cache_len * cfg.n_kv_heads * cfg.head_dim
    return itemsize * (matmul_params(cfg) + kv)


def forward_bytes(cfg: ModelConfig, n_rows: int, seq_len: int, itemsize: int = 4) -> float:
    """Minimum traffic of a teacher-forced forward: the weights, the tokens' residual stream in and out of
    every layer, and the logits written once."""
    tokens = n_rows * seq_len
    return itemsize * (matmul_params(cfg) + tokens * cfg.d_model * 2 * cfg.n_layers + tokens * cfg.vocab_size)


def median_time(fn, repeats: int) -> float:
    """Median wall seconds of fn() over `repeats` calls after one warm-up call (compilation)."""
    return statistics.median(alternating_times({"fn": fn}, repeats)["fn"])


def alternating_times(fns: dict, repeats: int) -> dict:
    """Wall seconds of each fn() in `fns` over `repeats` rounds, one call of every fn per round, after one
    warm-up call each (compilation). Comparisons between the fns are then made at the same moments, so the
    machine's drift (up to ~30% here between minutes) hits all of them alike instead of whichever ran last.
    Returns {name: [seconds per round]}."""
    for fn in fns.values():
        fn()
    times = {name: [] for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            start = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - start)
    return times


def _best_time(fn, repeats: int) -> float:
    return min(alternating_times({"fn": fn}, repeats)["fn"])


def matmul_peak(dtype: str = "float32", n: int = 2048, repeats: int = 5, device=None) -> float:
    """FLOP/s of one n x n x n jnp.dot on `device` with a float32 result: the peak the benchmarks report
    utilisation against. For bf16 that is XLA:CPU's fast kernel here (~270 GFLOP/s at 2048^3, against ~140
    with a bf16 result), so bf16 utilisation is not flattered by a slow reference."""
    a = jax.device_put(jnp.ones((n, n), dtype), device)
    f = jax.jit(lambda x: jnp.dot(x, x, preferred_element_type=jnp.float32))
    return 2.0 * n**3 / _best_time(lambda: f(a).block_until_ready(), repeats)


def copy_bandwidth(n_bytes: int = 48 << 20, repeats: int = 5, device=None) -> float:
    """Bytes/s of an out-of-place elementwise op (read n_bytes, write n_bytes) on `device`. The default
    48 MB array is past the last-level cache but under 64 MB: on XLA:CPU here, buffers over 64 MB run at
    ~5 GB/s against 20-25 GB/s below (they are page-faulted in on every call; experiments/PERF.md)."""
    x = jax.device_put(jnp.ones((n_bytes // 4,), jnp.float32), device)
    f = jax.jit(lambda v: v * 1.0001)
    return 2.0 * n_bytes / _best_time(lambda: f(x).block_until_ready(), repeats)


M_TRIM_THRESHOLD, M_MMAP_MAX = -1, -4  # glibc mallopt parameters (malloc.h)


def tune_host_allocator() -> bool:
    """Keep freed host memory for reuse instead of returning it to the OS (glibc only; else a no-op).

    XLA:CPU allocates each large buffer with malloc; glibc serves blocks over 32 MB with a fresh mmap and
    unmaps them on free, so every call page-faults its big buffers in again (zeroing each 4 KB page).
    Turning mmap off and the trim threshold up makes them come from, and return to, the heap. Measured
    here on a [64, 8, 144, 144] float32 elementwise op: 15-25 ms -> 3-4 ms (experiments/PERF.md). Cost: the
    process keeps its peak heap. Returns whether the setting took effect."""
    if not sys.platform.startswith("linux"):
        return False
    name = ctypes.util.find_library("c")
    if not name:
        return False
    try:
        libc = ctypes.CDLL(name)
        return bool(libc.mallopt(M_MMAP_MAX, 0)) and bool(libc.mallopt(M_TRIM_THRESHOLD, 2**31 - 1))
    except (OSError, AttributeError):
        return False
