"""XLA-planned memory (and step time) of the policy-loss forward + backward with and without gradient
checkpointing per decoder layer (`ModelConfig.remat`: none / full / dots).

    python experiments/bench/bench_remat.py                  # 8 layers, width 512, 8 x 512 tokens: compile, then time
    python experiments/bench/bench_remat.py --qwen05b        # Qwen2.5-0.5B shapes, 4 x 512 tokens: compile only
    python experiments/bench/bench_remat.py --smoke          # seconds: 2 layers, width 64, 2 x 32 tokens

What is compiled: `jax.jit(jax.value_and_grad(micro_loss, has_aux=True)).lower(...).compile()` for the loss
the trainer differentiates (`grpo_jax.update.make_micro_loss`: teacher-forced forward over prompt +
completion, GRPO clipped loss with a KL term, beta 0.04), one microbatch, no optimizer. Inputs are
`jax.ShapeDtypeStruct`s and the params come from `jax.eval_shape`, so nothing is allocated to compile, and
the 0.5B case only compiles. The figures are `compiled.memory_analysis()` fields: `temp_size_in_bytes`
(XLA's buffer plan for intermediates, where saved activations live), `argument_size_in_bytes` (params +
batch), `output_size_in_bytes` (loss, metrics, gradients), `alias_size_in_bytes`, and
`peak_memory_in_bytes` as XLA reports it (0 where a backend does not fill it in; XLA:CPU reports
argument + output there, without temporaries); "planned" is argument + output + temp - alias, the
footprint `experiments/bench/bench_scaling.py` reports. "JAX residuals" is what JAX itself asks to keep for the
backward pass (`residual_bytes`): it shows what checkpointing removes before XLA plans buffers. The
figures depend only on the shapes and the backend's compiler, not on the machine's load.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np

import models
from grpo_jax import update
from grpo_jax.config import TrainConfig, override
from grpo_jax.experience import Batch

MODES = ("none", "full", "dots")
FIELDS = ("temp_size_in_bytes", "argument_size_in_bytes", "output_size_in_bytes", "alias_size_in_bytes",
          "peak_memory_in_bytes")


def model_config(args):
    """The ModelConfig to measure (remat left at "none"; each mode replaces it)."""
    if args.qwen05b:
        return models.qwen2_5_0_5b(param_dtype=args.dtype, dtype=args.dtype)
    return models.ModelConfig(vocab_size=args.vocab, d_model=args.d_model, n_layers=args.n_layers,
                              n_heads=args.n_heads, n_kv_heads=args.n_kv_heads, head_dim=args.head_dim,
                              mlp_dim=args.mlp_dim, qkv_bias=True, tie_embeddings=True, arch="qwen2",
                              param_dtype=args.dtype, dtype=args.dtype)


def train_config(completion: int):
    """The run settings that shape the loss (the rows come from the inputs): the last `completion` tokens of
    each row are trained, with the KL term on."""
    return override(TrainConfig(), [f"sampling.max_new_tokens={completion}", "loss.beta=0.04"])


def abstract_inputs(mc, batch: int, seq_len: int, completion: int) -> tuple:
    """(params, Batch, ref_logp, sampler_logp (None), key, entropy_coef) as shapes only: what `micro_loss`
    takes."""
    params = jax.eval_shape(functools.partial(models.init_params, mc), jax.random.key(0))

    def row(*shape, dtype=jnp.float32):
        return jax.ShapeDtypeStruct((batch, *shape), dtype)

    mb = Batch(tokens=row(seq_len, dtype=jnp.int32), attn_mask=row(seq_len, dtype=jnp.bool_),
               loss_mask=row(completion, dtype=jnp.bool_), old_logp=row(completion), advantages=row(),
               temperatures=row(completion))
    key = jax.eval_shape(lambda: jax.random.key(0))
    return params, mb, row(completion), None, key, jax.ShapeDtypeStruct((), jnp.float32)


def concrete_inputs(mc, batch: int, seq_len: int, completion: int) -> tuple:
    """Real arrays of the same shapes (random weights, tokens, advantages), for timing the small case."""
    keys = jax.random.split(jax.random.key(1), 4)
    params = models.init_params(mc, jax.random.key(0))
    logp = -jax.random.uniform(keys[1], (batch, completion)) * 3.0
    mb = Batch(tokens=jax.random.randint(keys[0], (batch, seq_len), 0, mc.vocab_size),
               attn_mask=jnp.ones((batch, seq_len), bool), loss_mask=jnp.ones((batch, completion), bool),
               old_logp=logp, advantages=jax.random.normal(keys[2], (batch,)),
               temperatures=jnp.ones((batch, completion)))
    return params, mb, logp + 0.01, None, jax.random.key(2), jnp.float32(0.0)


def compile_mode(mc, cfg, mode: str, inputs: tuple):
    """The compiled value-and-grad of the training loss with `remat=mode`, and the seconds it took."""
    grad_fn = jax.jit(jax.value_and_grad(update.make_micro_loss(mc.replace(remat=mode), cfg), has_aux=True))
    start = time.perf_counter()
    compiled = grad_fn.lower(*inputs).compile()
    return compiled, time.perf_counter() - start


def residual_bytes(mc, cfg, mode: str, inputs: tuple) -> int:
    """Bytes JAX keeps from the forward for the backward pass with `remat=mode`: the leaves of the
    `jax.vjp` closure, traced under `jax.eval_shape` (nothing allocated). This is the plan JAX hands to XLA,
    the same on every backend; how much of it the compiled program keeps is the backend's buffer plan."""
    loss = update.make_micro_loss(mc.replace(remat=mode), cfg)

    def vjp_closure(params, *rest):
        return jax.vjp(lambda p: loss(p, *rest)[0], params)[1]

    leaves = jax.tree.leaves(jax.eval_shape(vjp_closure, *inputs))
    return sum(int(np.prod(x.shape)) * x.dtype.itemsize for x in leaves)


def memory_figures(compiled) -> dict:
    """The FIELDS of `compiled.memory_analysis()` in bytes, plus planned = argument + output + temp - alias."""
    m = compiled.memory_analysis()
    out = {f: int(getattr(m, f, 0) or 0) for f in FIELDS}
    out["planned_bytes"] = (out["argument_size_in_bytes"] + out["output_size_in_bytes"] + out["temp_size_in_bytes"]
                            - out["alias_size_in_bytes"])
    return out


def step_seconds(compiled, inputs: tuple, repeats: int) -> float:
    """Median wall time of one call of the compiled value-and-grad (after one warm-up call)."""
    jax.block_until_ready(compiled(*inputs))
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        jax.block_until_ready(compiled(*inputs))
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def table(rows: list[dict]) -> str:
    """Markdown table: JAX's residuals and MB per memory field, ratios of temp and planned against remat="none", seconds."""
    base = rows[0]

    def mb(b):
        return f"{b / 2**20:,.1f}"

    header = ("| remat | JAX residuals MB | temp MB | argument MB | output MB | alias MB | XLA peak MB | planned MB | temp vs none | "
              "planned vs none | compile s | step s |")
    lines = [header, "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        step = f"{r['step_s']:.3f}" if r.get("step_s") is not None else "-"
        lines.append(
            f"| {r['remat']} | {mb(r['residual_bytes'])} | {mb(r['temp_size_in_bytes'])} | {mb(r['argument_size_in_bytes'])} | "
            f"{mb(r['output_size_in_bytes'])} | {mb(r['alias_size_in_bytes'])} | {mb(r['peak_memory_in_bytes'])} | "
            f"{mb(r['planned_bytes'])} | {r['temp_size_in_bytes'] / max(1, base['temp_size_in_bytes']):.2f}x | "
            f"{r['planned_bytes'] / max(1, base['planned_bytes']):.2f}x | {r['compile_s']:.1f} | {step} |")
    return "\n".join(lines)


def main(argv=None) -> list[dict]:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n-layers", type=int, default=8)
    ap.add_argument("--d-model", type=int, default=512)
    ap.add_argument("--n-heads", type=int, default=8)
    ap.add_argument("--n-kv-heads", type=int, default=2)
    ap.add_argument("--head-dim", type=int, default=64)
    ap.add_argument("--mlp-dim", type=int, default=1376, help="2.7x width, as the benchmark model's 688 / 256")
    ap.add_argument("--vocab", type=int, default=512, help="the CPU tasks' tokenizers are this small")
    ap.add_argument("--batch", type=int, default=None, help="rows (default 8; 4 with --qwen05b)")
    ap.add_argument("--seq-len", type=int, default=512, help="prompt + completion tokens per row")
    ap.add_argument("--prompt-len", type=int, default=64, help="the rest of --seq-len is the trained completion")
    ap.add_argument("--qwen05b", action="store_true", help="Qwen2.5-0.5B shapes (preset qwen2.5-0.5b); compile only")
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    ap.add_argument("--repeats", type=int, default=3, help="timed calls per mode (0: compile only)")
    ap.add_argument("--platform", default="cpu")
    ap.add_argument("--smoke", action="store_true", help="2 layers, width 64, 2 x 32 tokens, 1 timed call")
    ap.add_argument("--out", default="runs/bench_remat.json")
    args = ap.parse_args(argv)
    if args.smoke:
        args.n_layers, args.d_model, args.n_heads, args.n_kv_heads, args.head_dim = 2, 64, 4, 2, 16
        args.mlp_dim, args.vocab, args.seq_len, args.prompt_len, args.batch, args.repeats = 128, 128, 32, 8, 2, 1
    batch = args.batch or (4 if args.qwen05b else 8)
    if not os.environ.get("JAX_PLATFORMS"):  # JAX_PLATFORMS, when set, wins over --platform
        jax.config.update("jax_platforms", args.platform)
    mc = model_config(args)
    completion = args.seq_len - args.prompt_len
    cfg = train_config(completion)
    abstract = abstract_inputs(mc, batch, args.seq_len, completion)
    timed = args.repeats > 0 and not args.qwen05b
    concrete = concrete_inputs(mc, batch, args.seq_len, completion) if timed else None
    print(f"{mc.num_params() / 1e6:.1f}M params ({mc.n_layers} layers, width {mc.d_model}, {mc.n_heads}/"
          f"{mc.n_kv_heads} heads x {mc.head_dim}, MLP {mc.mlp_dim}, vocab {mc.vocab_size}, {args.dtype}); "
          f"{batch} rows x {args.seq_len} tokens ({completion} trained); {jax.devices()[0].platform}, jax "
          f"{jax.__version__}")
    rows = []
    for mode in MODES:
        compiled, compile_s = compile_mode(mc, cfg, mode, abstract)
        row = {"remat": mode, "compile_s": compile_s, "residual_bytes": residual_bytes(mc, cfg, mode, abstract),
               **memory_figures(compiled)}
        row["step_s"] = step_seconds(compiled, concrete, args.repeats) if timed else None
        rows.append(row)
        print(f"  {mode}: {json.dumps(row)}", flush=True)
    print(table(rows))
    if args.out:
        os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
        with open(args.out, "w") as f:
            json.dump({"args": vars(args), "params": mc.num_params(), "rows": rows}, f, indent=2)
    return rows


if __name__ == "__main__":
    main()
