"""Scaling tables: rollout and update time and peak memory as the group size G, the completion length
and the model width double.

    python experiments/bench/bench_scaling.py                   # all three sweeps on the tiny Qwen2 shape, f32
    python experiments/bench/bench_scaling.py --sweep group     # one sweep
    python experiments/bench/bench_scaling.py --smoke           # seconds: tiny model, two points per sweep (tests)
    python experiments/bench/bench_scaling.py --platform gpu --dtype bfloat16 --preset qwen2.5-0.5b --prompts 16

Work: `--prompts` prompts of 16 tokens, G completions of T tokens (EOS suppressed), one GRPO update (beta
0.04, reference pass included) in microbatches of about `--tokens-per-microbatch` tokens (whole rows), so a
bigger G or T means more microbatches of the same size. Fixed point G=8, T=128, width 256 (bench_qwen2_tiny);
each sweep doubles one of them. All points of a sweep are compiled first and then timed in alternating rounds
(`--repeats` rounds, one call of each point's rollout and update per round; medians), so machine drift between
minutes does not enter the ratios. "x linear" is (time / first row's time) / (work / first row's work), where
work counts generated tokens (rollout) and trained tokens (update) for the G and T sweeps and matmul
parameters for the width sweep: 1.00 = exactly linear, below 1 = fixed costs being amortised. "x FLOPs" is the
same ratio for the FLOPs counted from the shapes (`grpo_jax.perf`): where it passes 1, the arithmetic itself
grows faster than the work (attention's T^2 term), so no implementation stays linear. Peak memory is XLA's
planned footprint of the compiled program (arguments + outputs + temporaries, `compiled.memory_analysis()`),
so it is the same on any machine for the same shapes.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics

import jax
import jax.numpy as jnp
import numpy as np

import models
from grpo_jax import experience, perf, sampler, update
from grpo_jax.config import TrainConfig, override

SWEEPS = {
    "group": [{"group": g} for g in (4, 8, 16, 32)],
    "length": [{"new_tokens": t} for t in (64, 128, 256, 512)],
    "width": [{"width": w} for w in (128, 256, 512, 1024)],
}


def _peak_bytes(compiled) -> int:
    m = compiled.memory_analysis()
    if m is None:
        return 0
    return int(m.argument_size_in_bytes + m.output_size_in_bytes + m.temp_size_in_bytes - m.alias_size_in_bytes)


def build(point: dict, args) -> tuple[dict, dict]:
    """One point of a sweep, compiled and ready: (its figures: shapes, FLOPs, planned memory; the two
    callables to time, {"rollout": ..., "update": ...})."""
    g, n, width = point.get("group", 8), point.get("new_tokens", 128), point.get("width", 0)
    b, p = args.prompts, 16
    rows = b * g
    shape = {}
    if width:  # width doubles with the head count (head_dim fixed) and the MLP (ratio kept)
        base = models.preset(args.preset)
        scale = width / base.d_model
        shape = dict(d_model=width, mlp_dim=int(base.mlp_dim * scale), n_heads=max(1, int(base.n_heads * scale)),
                     n_kv_heads=max(1, int(base.n_kv_heads * scale)))
    mc = models.preset(args.preset, param_dtype=args.dtype, dtype=args.dtype, **shape)
    rows_per_micro = max(1, args.tokens_per_microbatch // (sampler.bucket_length(p) + n))
    micro = max(1, rows // rows_per_micro)
    while rows % micro:  # microbatches must split the rows evenly
        micro += 1
    cfg = override(TrainConfig(), [f"prompts_per_step={b}", f"sampling.group_size={g}", f"sampling.max_new_tokens={n}",
                                   "loss.beta=0.04", "steps=1000", f"microbatches={micro}"])
    params = models.init_params(mc, jax.random.key(0))
    prompts = jnp.asarray(np.random.RandomState(0).randint(1, mc.vocab_size, (b, p)))
    mask = jnp.ones((b, p), bool)
    tokens, tmask = sampler.prepare_prompts(prompts, mask)
    counter = [0]

    def rollout():
        counter[0] += 1
        ro = sampler.sample(mc, params, prompts, mask, key=jax.random.key(counter[0]), group_size=g, max_new_tokens=n)
        return jax.block_until_ready(ro)

    ro = rollout()
    cache, logits0, lengths = sampler._prefill(mc, params, tokens, tmask, group_size=g, max_new_tokens=n)
    decode_args = (mc, params, cache, logits0, lengths, sampler.row_keys(jax.random.key(0), jnp.arange(b), g),
                   jnp.float32(1.0))
    decode_kw = dict(max_new_tokens=n, top_k=0, top_p=1.0, eos_ids=(), pad_id=0, token_temperature=())
    rollout_mem = _peak_bytes(sampler._decode.lower(*decode_args, **decode_kw).compile())

    batch = experience.batch_from_rollout(ro, jnp.asarray(np.random.RandomState(1).randn(rows).astype(np.float32)))
    opt = update.make_optimizer(cfg)
    state = update.initial_state(cfg, mc, params, opt, jax.random.key(0))
    step = jax.jit(update.make_train_step(mc, cfg, opt))
    key = jax.random.key(5)
    update_mem = _peak_bytes(step.lower(state, batch, key, jnp.float32(0.0)).compile())
    width_p = tokens.shape[1]
    rollout_flops = perf.forward_flops(mc, b, width_p) + sum(
        perf.decode_step_flops(mc, rows, width_p + t + 1) for t in range(n))
    update_flops = 4 * perf.forward_flops(mc, rows, batch.tokens.shape[1])  # forward + backward (2x) + reference
    figures = {"group": g, "new_tokens": n, "width": mc.d_model, "rows": rows, "microbatches": micro,
               "rollout_flops": rollout_flops, "update_flops": update_flops,
               "generated_tokens": rows * n, "trained_tokens": rows * batch.tokens.shape[1],
               "rollout_peak_mb": rollout_mem / 2**20, "update_peak_mb": update_mem / 2**20,
               "params_m": mc.num_params() / 1e6}
    return figures, {"rollout": rollout, "update": lambda: jax.block_until_ready(step(state, batch, key, jnp.float32(0.0)))}


def measure(points: list[dict], args) -> list[dict]:
    """Every point of a sweep built first, then timed in alternating rounds (`perf.alternating_times`), so
    the ratios between points are not machine drift between minutes. Median seconds per part."""
    built = [build(point, args) for point in points]
    fns = {(i, part): fn for i, (_, parts) in enumerate(built) for part, fn in parts.items()}
    times = perf.alternating_times(fns, args.repeats)
    return [{**figures, **{f"{part}_s": statistics.median(times[(i, part)]) for part in parts}}
            for i, (figures, parts) in enumerate(built)]


def table(name: str, results: list[dict]) -> str:
    key = {"group": "group", "length": "new_tokens", "width": "width"}[name]
    base = results[0]
    # work per point: tokens for G and T; for width, tokens x matmul params (FLOPs) as the linear model
    lines = [f"| {key} | rollout s | x linear | x FLOPs | update s | x linear | x FLOPs | rollout peak MB | "
             "update peak MB |", "|---|---|---|---|---|---|---|---|---|"]
    for r in results:
        if name == "width":
            work_r = r["params_m"] / base["params_m"]
            work_u = work_r
        else:
            work_r = r["generated_tokens"] / base["generated_tokens"]
            work_u = r["trained_tokens"] / base["trained_tokens"]
        lin_r = (r["rollout_s"] / base["rollout_s"]) / work_r
        lin_u = (r["update_s"] / base["update_s"]) / work_u
        flops_r = (r["rollout_flops"] / base["rollout_flops"]) / work_r
        flops_u = (r["update_flops"] / base["update_flops"]) / work_u
        lines.append(f"| {r[key]} | {r['rollout_s']:.3f} | {lin_r:.2f} | {flops_r:.2f} | {r['update_s']:.3f} | "
                     f"{lin_u:.2f} | {flops_u:.2f} | {r['rollout_peak_mb']:.0f} | {r['update_peak_mb']:.0f} |")
    return "\n".join(lines)


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sweep", choices=list(SWEEPS) + ["all"], default="all")
    ap.add_argument("--prompts", type=int, default=4)
    ap.add_argument("--tokens-per-microbatch", type=int, default=1152, help="8 rows of 16 + 128 tokens")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--preset", default="bench_qwen2_tiny")
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    ap.add_argument("--platform", default="cpu")
    ap.add_argument("--out", default="runs/bench_scaling.json")
    ap.add_argument("--smoke", action="store_true", help="tiny model, first two points of each sweep, 1 repeat")
    args = ap.parse_args(argv)
    if args.smoke:
        args.preset, args.repeats, args.prompts = "tiny", 1, 2
    if not os.environ.get("JAX_PLATFORMS"):  # JAX_PLATFORMS, when set, wins over --platform
        jax.config.update("jax_platforms", args.platform)
    perf.tune_host_allocator()
    sweeps = list(SWEEPS) if args.sweep == "all" else [args.sweep]
    out = {}
    for name in sweeps:
        points = SWEEPS[name][:2] if args.smoke else SWEEPS[name]
        if args.smoke:  # tiny model: short completions, widths around its own
            points = [{**pt, "new_tokens": min(pt.get("new_tokens", 16), 16)} for pt in points]
            points = [{**pt, "width": pt["width"] // 4} if "width" in pt else pt for pt in points]
        out[name] = measure(points, args)
        print(f"\n{name} sweep ({args.prompts} prompts, 16-token prompts, {args.dtype}, "
              f"{jax.devices()[0].platform}; others fixed at G=8, T=128, width 256{' / 64 (smoke)' if args.smoke else ''}):")
        print(table(name, out[name]))
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(out, f, indent=1)
    return out


if __name__ == "__main__":
    main()
