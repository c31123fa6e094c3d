"""Load a Hugging Face checkpoint folder into our JAX model and decode a few tokens greedily.

    python experiments/greedy_demo.py                    # builds a tiny random Qwen2 checkpoint first
    python experiments/greedy_demo.py --checkpoint DIR   # any local Llama / Qwen2 / Qwen2-VL folder

No network: without --checkpoint the script writes a random tiny model with `models.save_hf` into a
temporary folder and reads it back with `models.load_hf`, the same path a real checkpoint takes.
"""

from __future__ import annotations

import argparse
import tempfile
import time

import jax
import jax.numpy as jnp
import numpy as np

import models


def get_config() -> dict:
    return dict(checkpoint=None, prompt_len=8, new_tokens=16, batch=2, seed=0)


def greedy_decode(cfg, params, prompt_BxP: jnp.ndarray, new_tokens: int) -> np.ndarray:
    """Prefill the prompt into a KV cache, then append argmax tokens one at a time."""
    b, p = prompt_BxP.shape
    step = jax.jit(lambda prm, tok, pos, cache: models.forward(cfg, prm, tok, pos, cache=cache), donate_argnums=3)
    positions = jnp.broadcast_to(jnp.arange(p), (b, p))
    if cfg.rope_kind == "mrope":
        positions = jnp.stack([positions] * 3)
    logits, cache = step(params, prompt_BxP, positions, models.init_cache(cfg, b, p + new_tokens))
    out = []
    for t in range(new_tokens):
        token = jnp.argmax(logits[:, -1], axis=-1)[:, None]
        out.append(token)
        pos = jnp.full((b, 1), p + t)
        logits, cache = step(params, token, jnp.stack([pos] * 3) if cfg.rope_kind == "mrope" else pos, cache)
    return np.asarray(jnp.concatenate(out, axis=1))


def main(argv=None) -> None:
    defaults = get_config()
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--checkpoint", default=defaults["checkpoint"], help="local HF checkpoint folder")
    ap.add_argument("--new-tokens", type=int, default=defaults["new_tokens"])
    ap.add_argument("--seed", type=int, default=defaults["seed"])
    args = ap.parse_args(argv)

    with tempfile.TemporaryDirectory() as tmp:
        path = args.checkpoint
        if path is None:
            cfg = models.bench_qwen2_tiny()
            models.save_hf(cfg, models.init_params(cfg, jax.random.key(args.seed)), tmp + "/ckpt")
            path = tmp + "/ckpt"
            print(f"wrote a random {cfg.num_params() / 1e6:.1f}M-parameter Qwen2 checkpoint to {path}")
        cfg, params = models.load_hf(path)
        print(f"loaded {cfg.arch}: {cfg.n_layers} layers, width {cfg.d_model}, vocab {cfg.vocab_size}")
        prompt = jax.random.randint(jax.random.key(args.seed), (defaults["batch"], defaults["prompt_len"]), 0,
                                    cfg.vocab_size)
        start = time.perf_counter()
        tokens = greedy_decode(cfg, params, prompt, args.new_tokens)
        print(f"greedy continuation ({time.perf_counter() - start:.2f} s incl. compile):")
        for row in tokens:
            print("  ", row.tolist())


if __name__ == "__main__":
    main()
