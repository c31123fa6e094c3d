"""FLOP accounting used by the benchmarks (grpo_jax.perf), checked against hand counts."""

from __future__ import annotations

import models
from grpo_jax import perf


def test_matmul_params_of_the_benchmark_model():
    cfg = models.preset("bench_qwen2_tiny")
    # per layer: qkv 256 x (256 + 2*64) + o 256 x 256 + gate/up/down 3 x 256 x 688 = 692,224; 4 layers;
    # tied LM head 256 x 512 = 131,072
    assert perf.matmul_params(cfg) == 4 * 692_224 + 131_072


def test_attention_pairs_follow_the_block_causal_kernel():
    assert perf.attention_pairs(144, 128) == 144 * 144  # under two blocks: one dense call
    # 528 = 4 full blocks of 128 + 16: block i (0-based) sees (i + 1) * 128 keys, the last 16 rows see 528
    expected = sum(128 * 128 * (i + 1) for i in range(4)) + 16 * 528
    assert perf.attention_pairs(528, 128) == expected
    assert 528 * 529 / 2 < expected < 528 * 528


def test_forward_flops_is_two_flops_per_multiply_add():
    cfg = models.preset("bench_qwen2_tiny")
    rows, length = 2, 10
    attention = cfg.n_layers * 2 * length * length * cfg.n_heads * cfg.head_dim
    assert perf.forward_flops(cfg, rows, length) == 2.0 * rows * (length * perf.matmul_params(cfg) + attention)
    assert perf.decode_step_flops(cfg, rows, 1) == 2.0 * rows * (perf.matmul_params(cfg) + cfg.n_layers * 2 * 8 * 32)


def test_alternating_times_interleaves_the_calls_after_one_warm_up_each():
    calls = []
    fns = {name: (lambda name=name: calls.append(name)) for name in ("a", "b", "c")}
    times = perf.alternating_times(fns, repeats=3)
    # one warm-up call each, then 3 rounds of a, b, c: the timed calls alternate, none runs twice in a row
    assert calls == ["a", "b", "c"] * 4
    assert set(times) == {"a", "b", "c"} and all(len(t) == 3 and min(t) >= 0 for t in times.values())
