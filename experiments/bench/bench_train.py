"""Seconds per full GRPO step (rollout + reference forward + update) on the sampler benchmark's work.

    python experiments/bench/bench_train.py                  # tiny Qwen2, 8 prompts x G=8, 16 + 128 tokens, f32
    python experiments/bench/bench_train.py --devices 2      # two XLA CPU devices (slower for the update here)
    python experiments/bench/bench_train.py --microbatches 1 # the update in one slice (default 8: same update)
    python experiments/bench/bench_train.py --d-model 1024 --mlp-dim 2752 --head-dim 128 --new-tokens 112
                                                             # compute-bound width: 64 x 128 = 8k tokens per update
    python experiments/bench/bench_train.py --preset qwen2.5-0.5b --dtype bfloat16 --platform gpu
    python experiments/bench/bench_train.py --trl            # + TRL's GRPOTrainer on the same work, same process
                                                             #   (pip install -e '.[peers]'; bench/peer_trl.py)

Work (docs/measurements.md §1: TRL's GRPOTrainer took ~2.1 s/step for it on a faster CPU; `--trl` measures it here): tiny Qwen2 (vocab 512, hidden 256,
MLP 688, 4 layers, 8/2 heads, tied), 8 prompts x G=8, 16-token prompts, 128 new tokens (EOS suppressed),
beta = 0.04 (k3 KL to a frozen reference), one update per rollout. Rewards are random numbers: scoring is
not part of this figure. The update's FLOPs are counted from the shapes (`grpo_jax.perf`: 3x the forward,
forward + backward, attention over all L^2 pairs), and set against a matmul peak this script measures
itself (2048^3 jnp.dot in the run's dtype).
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np

import models
from grpo_jax import experience, perf, sampler, sharding, update
from grpo_jax.config import TrainConfig, override


def get_config() -> dict:
    return dict(prompts=8, group=8, prompt_len=16, new_tokens=128, repeats=5, devices=1, microbatches=8,
                dtype="float32", preset="bench_qwen2_tiny", platform="cpu", d_model=0, mlp_dim=0, head_dim=0)


def main(argv=None) -> dict:
    c = get_config()
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    for k in ("prompts", "group", "prompt_len", "new_tokens", "repeats", "devices", "microbatches", "d_model",
              "mlp_dim", "head_dim"):
        ap.add_argument("--" + k.replace("_", "-"), type=int, default=c[k],
                        help="model shape override (0 = the preset's)" if k in ("d_model", "mlp_dim", "head_dim")
                        else None)
    ap.add_argument("--dtype", default=c["dtype"], choices=["float32", "bfloat16"])
    ap.add_argument("--preset", default=c["preset"])
    ap.add_argument("--platform", default=c["platform"])
    ap.add_argument("--trl", action="store_true", help="also time TRL's GRPOTrainer on the same work (after ours)")
    args = ap.parse_args(argv)
    if not os.environ.get("JAX_PLATFORMS"):  # JAX_PLATFORMS, when set, wins over --platform
        jax.config.update("jax_platforms", args.platform)
    if args.platform == "cpu":
        jax.config.update("jax_num_cpu_devices", args.devices)  # before the first array: no backend yet
    perf.tune_host_allocator()
    b, g, p, n = args.prompts, args.group, args.prompt_len, args.new_tokens
    cfg = override(TrainConfig(), [f"prompts_per_step={b}", f"sampling.group_size={g}", f"microbatches={args.microbatches}",
                                   f"sampling.max_new_tokens={n}", "loss.beta=0.04", "steps=1000"])
    shape = {k: getattr(args, k) for k in ("d_model", "mlp_dim", "head_dim") if getattr(args, k)}
    model_cfg = models.preset(args.preset, param_dtype=args.dtype, dtype=args.dtype, **shape)
    mesh = sharding.make_mesh(cfg.mesh)
    params = sharding.init_sharded_params(model_cfg, jax.random.key(0), mesh)
    opt = update.make_optimizer(cfg)
    state = update.initial_state(cfg, model_cfg, params, opt, jax.random.key(0))
    step_fn = jax.jit(update.make_train_step(model_cfg, cfg, opt), donate_argnums=0)
    chunks = cfg.minibatches * cfg.microbatches  # as the train step slices its reference pass
    ref_fn = jax.jit(lambda prm, bt: update.chunked_logprobs(model_cfg, prm, bt, n, chunks))
    row_sharding = sharding.batch_sharding(mesh, 2)
    prompts = jax.device_put(jnp.asarray(np.random.RandomState(0).randint(1, 500, (b, p)) % model_cfg.vocab_size),
                             row_sharding)
    mask = jax.device_put(jnp.ones((b, p), bool), row_sharding)
    rng = np.random.RandomState(1)

    def one_step(i):
        nonlocal state
        t0 = time.perf_counter()
        ro = sampler.sample(model_cfg, state.params, prompts, mask, key=jax.random.key(i), group_size=g,
                            max_new_tokens=n)
        jax.block_until_ready(ro.tokens)
        t1 = time.perf_counter()
        batch = experience.batch_from_rollout(ro, jnp.asarray(rng.randn(b * g).astype(np.float32)))
        batch = jax.tree.map(lambda x: jax.device_put(x, sharding.batch_sharding(mesh, x.ndim)), batch)
        state, metrics = step_fn(state, batch, jax.random.key(10_000 + i), jnp.float32(0.0))
        jax.block_until_ready(metrics["loss"])
        t2 = time.perf_counter()
        jax.block_until_ready(ref_fn(state.ref_params, batch))
        t3 = time.perf_counter()
        return t1 - t0, t2 - t1, t3 - t2

    one_step(0)  # compile
    parts = [one_step(i + 1) for i in range(args.repeats)]
    rollout, train_update, ref = (statistics.median(x) for x in zip(*parts))  # the train step includes ref
    peak = perf.matmul_peak(args.dtype)
    seq_len = sampler.bucket_length(p) + n
    ref_flops = perf.forward_flops(model_cfg, b * g, seq_len)
    update_flops = 3 * ref_flops  # the policy forward + backward (the reference forward is timed apart)
    policy_update = max(train_update - ref, 1e-9)
    print(f"\nGRPO step: {b} prompts x G={g}, {p}-token prompts, {n} new tokens, beta=0.04, one update per rollout;"
          f" model {model_cfg.num_params() / 1e6:.1f}M params (width {model_cfg.d_model}), {args.dtype}, "
          f"{len(jax.devices())} device(s), {args.microbatches} microbatch(es)")
    print(f"{'part':<34}{'median s':>10}")
    print(f"{'rollout (prefill + decode)':<34}{rollout:>10.3f}")
    print(f"{'reference forward (in the update)':<34}{ref:>10.3f}")
    print(f"{'policy forward+backward+optimizer':<34}{policy_update:>10.3f}")
    print(f"{'full GRPO step':<34}{rollout + train_update:>10.3f}")
    achieved = update_flops / policy_update
    print(f"\nupdate: {update_flops / 1e9:.1f} GFLOP counted from shapes -> {achieved / 1e9:.1f} GFLOP/s; "
          f"measured {args.dtype} matmul peak {peak / 1e9:.0f} GFLOP/s ({100 * achieved / peak:.0f}% of peak)")
    ref_rate = ref_flops / ref
    print(f"reference forward: {ref_flops / 1e9:.1f} GFLOP -> {ref_rate / 1e9:.1f} GFLOP/s ({100 * ref_rate / peak:.0f}% "
          f"of peak); floor for update + reference at peak: {(update_flops + ref_flops) / peak:.2f} s")
    out = {"rollout_s": rollout, "reference_s": ref, "update_s": policy_update, "step_s": rollout + train_update,
           "update_flops_per_s": achieved, "peak_flops_per_s": peak}
    if args.trl:
        from peer_trl import run as run_trl  # its sibling script; imports trl and torch (optional: `.[peers]`)

        peer = run_trl(prompts=b, group=g, prompt_len=p, new_tokens=n, repeats=args.repeats)
        print(f"\n{'side by side (median s)':<34}{'ours':>10}{'TRL':>10}{'TRL/ours':>10}")
        for name, ours_s, trl_s in (("rollout / generate", rollout, peer["generate"]),
                                    ("reference forward", ref, peer["reference"]),
                                    ("the rest of the update", policy_update, peer["update"]),
                                    ("full GRPO step", rollout + train_update, peer["step"])):
            print(f"{name:<34}{ours_s:>10.3f}{trl_s:>10.3f}{trl_s / ours_s:>9.2f}x")
        out["trl_step_s"] = peer["step"]
    return out


if __name__ == "__main__":
    main()
