"""Pure-functional decoder language models (Llama / Qwen2 / Qwen3 / Qwen2-VL text) in JAX.

    cfg = models.tiny()                      # or models.load_hf(folder) -> (cfg, params)
    params = models.init_params(cfg, key)
    logits, cache = models.forward(cfg, params, tokens, positions, attn_mask=mask, cache=cache)
"""

from models.config import PRESETS, ModelConfig, bench_qwen2_tiny, llama_1b, preset, qwen2_5_0_5b, qwen3_0_6b, tiny
from models.hf import CheckpointError, load_hf, save_hf
from models.keys import as_typed_key
from models.transformer import forward, grow_cache, init_cache, init_params, token_entropy, token_logprobs

__all__ = [
    "PRESETS", "ModelConfig", "bench_qwen2_tiny", "llama_1b", "preset", "qwen2_5_0_5b", "qwen3_0_6b", "tiny",
    "CheckpointError", "load_hf", "save_hf", "as_typed_key",
    "forward", "grow_cache", "init_cache", "init_params", "token_entropy", "token_logprobs",
]
