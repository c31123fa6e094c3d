"""Rollout throughput: our sampler vs transformers' `generate`, same weights, same work, one process.

    python experiments/bench/bench_sampler.py                       # the benchmark work below, f32, 2 CPU devices
    python experiments/bench/bench_sampler.py --dtype bfloat16 --devices 1
    python experiments/bench/bench_sampler.py --no-hf --preset qwen2.5-0.5b --dtype bfloat16 --platform gpu

Work (docs/measurements.md §1): tiny Qwen2 (vocab 512, hidden 256, MLP 688, 4 layers, 8 heads, 2 KV heads, tied), random
init in transformers (seed 0), saved with `save_pretrained` and read with `models.load_hf`; 8 prompts x
G=8, 16-token prompts, 128 new tokens with EOS suppressed, temperature 1. Prints generated tokens/s (median
of --repeats timed runs after a warm-up), runs alternating between the two so machine noise hits both.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile

import jax
import jax.numpy as jnp
import numpy as np

import models
from grpo_jax import experience, perf, sharding
from grpo_jax.config import MeshConfig, SamplingConfig
from grpo_jax.sampler import bucket_length, sample, sample_pmap


def get_config() -> dict:
    return dict(prompts=8, group=8, prompt_len=16, new_tokens=128, repeats=5, threads=2, devices=2,
                dtype="float32", preset="bench_qwen2_tiny", platform="cpu", hf=True)


def _parse(argv):
    c = get_config()
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    for k in ("prompts", "group", "prompt_len", "new_tokens", "repeats", "threads", "devices"):
        ap.add_argument("--" + k.replace("_", "-"), type=int, default=c[k])
    ap.add_argument("--dtype", default=c["dtype"], choices=["float32", "bfloat16"])
    ap.add_argument("--preset", default=c["preset"], help="models preset (the HF side needs bench_qwen2_tiny)")
    ap.add_argument("--platform", default=c["platform"], help="cpu | gpu | tpu")
    ap.add_argument("--no-hf", dest="hf", action="store_false", help="skip the transformers baseline")
    ap.add_argument("--pmap", action="store_true", help="split prompts with sample_pmap instead of a mesh")
    return ap.parse_args(argv)


def main(argv=None) -> dict:
    args = _parse(argv)
    # Device setup must precede the first array (no backend yet): on CPU, each core is worth most as its own device.
    if not os.environ.get("JAX_PLATFORMS"):  # JAX_PLATFORMS, when set, wins over --platform
        jax.config.update("jax_platforms", args.platform)
    if args.platform == "cpu":
        jax.config.update("jax_num_cpu_devices", args.devices)
    perf.tune_host_allocator()

    b, g, p, n = args.prompts, args.group, args.prompt_len, args.new_tokens
    prompts = np.random.RandomState(0).randint(1, 500, (b, p))
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        if args.hf:
            # only the transformers baseline needs these (torch is optional: the `test` extra)
            import torch
            import transformers

            transformers.logging.set_verbosity_error()
            torch.set_num_threads(args.threads)
            torch.manual_seed(0)
            hf_cfg = transformers.Qwen2Config(vocab_size=512, hidden_size=256, intermediate_size=688,
                                              num_hidden_layers=4, num_attention_heads=8, num_key_value_heads=2,
                                              tie_word_embeddings=True, rope_theta=1e6)
            hf = transformers.Qwen2ForCausalLM(hf_cfg).eval()
            hf.save_pretrained(tmp)
            cfg, params = models.load_hf(tmp)
            hf_inputs = torch.as_tensor(prompts)

            def run_hf():
                with torch.no_grad():
                    out = hf.generate(hf_inputs, do_sample=True, temperature=1.0, top_k=0, top_p=1.0,
                                      num_return_sequences=g, max_new_tokens=n, min_new_tokens=n,
                                      pad_token_id=0, eos_token_id=None)
                assert out.shape == (b * g, p + n), out.shape
        else:
            cfg = models.preset(args.preset)
            params = models.init_params(cfg, jax.random.key(0))
        if args.dtype != "float32":
            cfg = cfg.replace(param_dtype=args.dtype, dtype=args.dtype)
            params = jax.tree.map(lambda x: x.astype(args.dtype), params)
        devices = jax.local_devices()
        tokens = jnp.asarray(prompts % cfg.vocab_size)
        mask = jnp.ones((b, p), jnp.int32)
        fn = sample_pmap if args.pmap else sample
        if not args.pmap:  # prompts split over a data mesh, params replicated: one SPMD program
            mesh = sharding.make_mesh(MeshConfig())
            params = sharding.shard_params(params, mesh)
            tokens = jax.device_put(tokens, sharding.batch_sharding(mesh, 2))
            mask = jax.device_put(mask, sharding.batch_sharding(mesh, 2))
        counter = [0]

        def run_ours():
            counter[0] += 1
            ro = fn(cfg, params, tokens, mask, key=jax.random.key(counter[0]), group_size=g, max_new_tokens=n,
                    temperature=1.0)
            jax.block_until_ready(ro.tokens)
            assert int(ro.lengths.min()) == n

        runners = {"grpo-jax": run_ours}
        if not args.pmap:  # the same work through the Trainer's rollout (`experience.rollout`, its mesh)
            runners["grpo-jax, Trainer path"] = _trainer_path(cfg, params, mesh, np.asarray(prompts % cfg.vocab_size),
                                                              g, n, counter)
        runners.update({"transformers generate": run_hf} if args.hf else {})
        times = perf.alternating_times(runners, args.repeats)
    tokens_generated = b * g * n
    width = bucket_length(p)  # the work our sampler does: prefill once per prompt, decode over the filled cache
    flops = perf.forward_flops(cfg, b, width) + sum(perf.decode_step_flops(cfg, b * g, width + t + 1) for t in range(n))
    peak = perf.matmul_peak(args.dtype)
    print(f"\nrollout: {b} prompts x G={g}, {p}-token prompts, {n} new tokens; model {cfg.num_params() / 1e6:.1f}M "
          f"params, {args.dtype}; {len(devices)} {args.platform} device(s); torch threads {args.threads}")
    print(f"{'sampler':<24}{'median s':>10}{'tokens/s':>12}{'ratio':>8}")
    base = None
    for k in reversed(list(runners)):
        med = statistics.median(times[k])
        results[k] = tokens_generated / med
        base = base or results[k]
    for k in runners:
        med = statistics.median(times[k])
        print(f"{k:<24}{med:>10.3f}{results[k]:>12,.0f}{results[k] / base:>8.2f}x")
    if "grpo-jax, Trainer path" in times:
        inside = statistics.median(times["grpo-jax, Trainer path"])
        print(f"\nTrainer path / sampler alone: {inside / statistics.median(times['grpo-jax']):.3f}x time")
        results["trainer_path_ratio"] = inside / statistics.median(times["grpo-jax"])
    ours = statistics.median(times["grpo-jax"])
    print(f"\nours: {flops / 1e9:.1f} GFLOP of model arithmetic -> {flops / ours / 1e9:.1f} GFLOP/s = "
          f"{100 * flops / ours / peak:.0f}% of the {peak / 1e9:.0f} GFLOP/s {args.dtype} matmul peak measured here "
          f"(model FLOP utilisation)")
    results["mfu"] = flops / ours / peak
    return results


class _FixedPrompts:
    """A tokenizer stand-in whose prompts are the benchmark's token ids (row i of the batch for prompt i) and
    whose EOS id is never sampled (-1), so the Trainer path does exactly the benchmark's work."""

    pad_id, eos_id = 0, -1

    def __init__(self, prompts):
        self.prompts = prompts

    def encode_batch(self, texts, **_):  # the keywords of Tokenizer.encode_batch: the prompts are fixed already
        return self.prompts[list(texts)], np.ones((len(texts), self.prompts.shape[1]), bool)


def _trainer_path(cfg, params, mesh, prompts, group: int, new_tokens: int, counter):
    """A runner of `experience.rollout` as `Trainer.step_once` calls it: host prompts placed on the Trainer's
    mesh (`sharding.shard_rows`), then the sampler."""
    sampling = SamplingConfig(group_size=group, max_new_tokens=new_tokens)
    actor = experience.Actor(cfg, _FixedPrompts(prompts), (), sampling, mesh=mesh)
    rows = [{"prompt": i} for i in range(len(prompts))]

    def run():
        counter[0] += 1
        ro = experience.rollout(actor, params, rows, jax.random.key(counter[0]), group_size=group, temperature=1.0)
        jax.block_until_ready(ro.tokens)
        assert int(ro.lengths.min()) == new_tokens and not ro.tokens.sharding.is_fully_replicated

    return run


if __name__ == "__main__":
    sys.exit(0 if main() else 1)
