"""Where a GRPO step's time goes: each part of one rollout and one update timed on its own, with its
roofline (FLOPs and minimum bytes counted from the shapes, against the matmul peak and copy bandwidth this
script measures on the same device).

    python experiments/bench/profile_step.py                       # the benchmark work (bench_sampler / bench_train)
    python experiments/bench/profile_step.py --microbatches 8      # the update in 8 accumulated slices
    python experiments/bench/profile_step.py --trace /tmp/trace    # also a jax.profiler trace of one full step
    python experiments/bench/profile_step.py --preset qwen2.5-0.5b --dtype bfloat16 --platform gpu

Parts: prefill (B prompts), one decode step (B*G rows, model forward against the cache at its mean fill),
sampling arithmetic per step (temperature, categorical draw, logprob and entropy over the vocabulary),
the whole decode loop, the reference forward, the policy loss forward, forward+backward, and the
optimizer update. "bound" is the part's roofline time max(FLOPs / peak, bytes / bandwidth); "of roofline"
is bound / measured (100% = at the machine's limit). Writes `--out` (default runs/profile_step.json).
"""

from __future__ import annotations

import argparse
import json
import os

import jax
import jax.numpy as jnp
import numpy as np

import models
from grpo_jax import experience, perf, sampler, update
from grpo_jax.config import TrainConfig, override
from models.rope import rope_positions


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--group", type=int, default=8)
    ap.add_argument("--prompt-len", type=int, default=16)
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--microbatches", type=int, default=1)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--preset", default="bench_qwen2_tiny")
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    ap.add_argument("--platform", default="cpu")
    ap.add_argument("--trace", default=None, help="directory for a jax.profiler trace of one full step")
    ap.add_argument("--out", default="runs/profile_step.json")
    args = ap.parse_args(argv)
    if not os.environ.get("JAX_PLATFORMS"):  # JAX_PLATFORMS, when set, wins over --platform
        jax.config.update("jax_platforms", args.platform)
    perf.tune_host_allocator()
    b, g, p, n, reps = args.prompts, args.group, args.prompt_len, args.new_tokens, args.repeats
    rows = b * g
    cfg = override(TrainConfig(), [f"prompts_per_step={b}", f"sampling.group_size={g}", f"sampling.max_new_tokens={n}",
                                   "loss.beta=0.04", "steps=1000", f"microbatches={args.microbatches}"])
    mc = models.preset(args.preset, param_dtype=args.dtype, dtype=args.dtype)
    params = models.init_params(mc, jax.random.key(0))
    itemsize = jnp.dtype(args.dtype).itemsize
    prompts = jnp.asarray(np.random.RandomState(0).randint(1, mc.vocab_size, (b, p)))
    mask = jnp.ones((b, p), bool)
    tokens, tmask = sampler.prepare_prompts(prompts, mask)
    width = tokens.shape[1]
    seq_len = width + n
    block = jax.block_until_ready

    parts = {}  # name -> (seconds, flops, bytes)

    # --- rollout -------------------------------------------------------------------------------------
    prefill = lambda: block(sampler._prefill(mc, params, tokens, tmask, group_size=g, max_new_tokens=n))  # noqa: E731
    parts["prefill"] = (perf.median_time(prefill, reps), perf.forward_flops(mc, b, width),
                        perf.forward_bytes(mc, b, width, itemsize))

    mean_fill = width + n // 2
    cache = models.init_cache(mc, rows, mean_fill + 1, aligned=True)
    cache = {**cache, "end_index": jnp.int32(mean_fill), "mask": jnp.ones((rows, mean_fill + 1), bool)}
    step_tokens = jnp.ones((rows, 1), jnp.int32)
    step_pos = rope_positions(mc, jnp.full((rows, 1), mean_fill, jnp.int32))
    loop_n = 32

    @jax.jit
    def decode_steps(prm, c):  # loop_n forward steps rewriting one slot: the per-step model cost alone
        def body(i, carry):
            logits, _ = models.forward(mc, prm, step_tokens + i % 2, step_pos, cache=c)
            return carry + logits[:, 0, :1]
        return jax.lax.fori_loop(0, loop_n, body, jnp.zeros((rows, 1), jnp.float32))

    parts["decode step (model)"] = (perf.median_time(lambda: block(decode_steps(params, cache)), reps) / loop_n,
                                    perf.decode_step_flops(mc, rows, mean_fill + 1),
                                    perf.decode_step_bytes(mc, rows, mean_fill + 1, itemsize))

    logits = jax.random.normal(jax.random.key(1), (rows, mc.vocab_size))
    keys = jax.random.split(jax.random.key(2), rows)

    @jax.jit
    def sample_steps(lg, ks):
        def body(t, acc):
            step_keys = jax.vmap(jax.random.fold_in, in_axes=(0, None))(ks, t)
            dist = sampler.process_logits(lg, temperature=1.0)
            tok = sampler.sample_categorical(step_keys, dist)
            lp, ent = sampler.logprobs_and_entropy(dist, tok)
            return acc + lp + ent
        return jax.lax.fori_loop(0, loop_n, body, jnp.zeros((rows,)))

    vocab_bytes = rows * mc.vocab_size * 4
    parts["sampling per step"] = (perf.median_time(lambda: block(sample_steps(logits, keys)), reps) / loop_n,
                                  10.0 * rows * mc.vocab_size, vocab_bytes)

    def rollout():
        ro = sampler.sample(mc, params, prompts, mask, key=jax.random.key(3), group_size=g, max_new_tokens=n)
        return block(ro)

    ro = rollout()
    decode_flops = sum(perf.decode_step_flops(mc, rows, width + t + 1) for t in range(n))
    decode_bytes = sum(perf.decode_step_bytes(mc, rows, width + t + 1, itemsize) for t in range(n))
    parts["rollout (prefill + decode loop)"] = (perf.median_time(rollout, reps), decode_flops + parts["prefill"][1],
                                                decode_bytes + parts["prefill"][2])

    # --- update --------------------------------------------------------------------------------------
    batch = experience.batch_from_rollout(ro, jnp.asarray(np.random.RandomState(1).randn(rows).astype(np.float32)))
    chunks = args.microbatches
    fwd_flops = perf.forward_flops(mc, rows, seq_len)
    fwd_bytes = perf.forward_bytes(mc, rows, seq_len, itemsize)
    ref_fn = jax.jit(lambda prm, bt: update.chunked_logprobs(mc, prm, bt, n, chunks))
    ref_logp = ref_fn(params, batch)
    parts["reference forward"] = (perf.median_time(lambda: block(ref_fn(params, batch)), reps), fwd_flops, fwd_bytes)

    micro_loss = update.make_micro_loss(mc, cfg)
    split = lambda x: x.reshape((chunks, rows // chunks) + x.shape[1:])  # noqa: E731
    sliced = jax.tree.map(split, (batch, ref_logp))
    key = jax.random.key(4)

    @jax.jit
    def loss_forward(prm):
        return jax.lax.map(lambda x: micro_loss(prm, x[0], x[1], None, key, jnp.float32(0.0))[0], sliced).sum()

    grad_fn = jax.value_and_grad(micro_loss, has_aux=True)

    @jax.jit
    def loss_grad(prm):
        def acc(carry, x):
            (num, _), grads = grad_fn(prm, x[0], x[1], None, key, jnp.float32(0.0))
            return jax.tree.map(jnp.add, carry, grads), num
        zeros = jax.tree.map(jnp.zeros_like, prm)
        return jax.lax.scan(acc, zeros, sliced)

    parts["policy loss forward"] = (perf.median_time(lambda: block(loss_forward(params)), reps), fwd_flops, fwd_bytes)
    parts["policy loss forward+backward"] = (perf.median_time(lambda: block(loss_grad(params)), reps), 3 * fwd_flops,
                                             3 * fwd_bytes)
    opt = update.make_optimizer(cfg)
    opt_state = opt.init(params)
    grads = loss_grad(params)[0]

    @jax.jit
    def opt_step(prm, st, gr):
        updates, st = opt.update(gr, st, prm)
        return jax.tree.map(jnp.add, prm, updates), st

    n_params = sum(x.size for x in jax.tree.leaves(params))
    parts["optimizer (AdamW + clip)"] = (perf.median_time(lambda: block(opt_step(params, opt_state, grads)), reps),
                                         12.0 * n_params, 4 * itemsize * n_params * 2)

    if args.trace:
        state = update.initial_state(cfg, mc, params, opt, jax.random.key(0))
        step_fn = jax.jit(update.make_train_step(mc, cfg, opt))
        block(step_fn(state, batch, key, jnp.float32(0.0)))
        with jax.profiler.trace(args.trace):
            rollout()
            block(step_fn(state, batch, key, jnp.float32(0.0)))
        print(f"trace written to {args.trace} (open with TensorBoard's profile plugin or Perfetto)")

    peak = perf.matmul_peak(args.dtype)
    bandwidth = perf.copy_bandwidth()
    print(f"\nprofile: {b} prompts x G={g}, {p}-token prompts (bucket {width}), {n} new tokens; model "
          f"{mc.num_params() / 1e6:.1f}M params, {args.dtype}, {jax.devices()[0].platform}; "
          f"{args.microbatches} microbatch(es)")
    print(f"measured: matmul peak {peak / 1e9:.0f} GFLOP/s, copy bandwidth {bandwidth / 1e9:.1f} GB/s\n")
    print(f"{'part':<34}{'ms':>10}{'GFLOP':>9}{'MB':>9}{'GFLOP/s':>9}{'bound ms':>10}{'of roofline':>13}")
    report = {"peak_flops_per_s": peak, "copy_bytes_per_s": bandwidth, "parts": {}}
    for name, (sec, flops, nbytes) in parts.items():
        bound = max(flops / peak, nbytes / bandwidth)
        print(f"{name:<34}{sec * 1e3:>10.2f}{flops / 1e9:>9.2f}{nbytes / 1e6:>9.1f}{flops / sec / 1e9:>9.1f}"
              f"{bound * 1e3:>10.2f}{100 * bound / sec:>12.0f}%")
        report["parts"][name] = {"seconds": sec, "flops": flops, "bytes": nbytes, "bound_seconds": bound}
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(report, f, indent=1)
    return report


if __name__ == "__main__":
    main()
