#!/usr/bin/env bash
# The trainer's and the sampler's throughput at a Qwen2.5-0.5B shape in bf16 on one GPU, beside the roofline
# estimate for the same chip. Needs a CUDA jaxlib (pip install "jax[cuda12]==0.10.2") and `pip install -e .`.
# Anchors (one H100): prime-rl's trainer 11.9k tok/s for Qwen3-0.6B at 11.1% MFU; vLLM ~12.1k output tok/s for
# Qwen3-0.6B with 128-token outputs. Writes $OUT_DIR/*.log (default runs/gpu_anchors).
set -euo pipefail
cd "$(dirname "$0")/../.."
OUT_DIR=${OUT_DIR:-runs/gpu_anchors}
mkdir -p "$OUT_DIR"
nvidia-smi --query-gpu=name,memory.total --format=csv | tee "$OUT_DIR/gpu.log"
# the update: 64 prompts x G = 8, 256-token prompts, 1,024 new tokens, 16 microbatches (trainer tokens/s)
python experiments/bench/bench_train.py --preset qwen2.5-0.5b --dtype bfloat16 --platform gpu --prompts 64 \
    --group 8 --prompt-len 256 --new-tokens 1024 --microbatches 16 --repeats 3 2>&1 | tee "$OUT_DIR/train.log"
# the sampler: 64 prompts x G = 8 with 128-token outputs (vLLM's anchor), one device, no transformers baseline
python experiments/bench/bench_sampler.py --preset qwen2.5-0.5b --dtype bfloat16 --platform gpu --prompts 64 \
    --group 8 --prompt-len 256 --new-tokens 128 --devices 1 --no-hf --repeats 3 2>&1 | tee "$OUT_DIR/sampler.log"
# the same chip's roofline estimate for the update's work (labelled ESTIMATE)
python experiments/tpu_plan.py --compile-only --topology h100-1 --set model.preset=qwen2.5-0.5b --set mesh.fsdp=1 \
    --set microbatches=16 | tee "$OUT_DIR/estimate.log"
