"""Pure-functional decoder language models (Llama / Qwen2 / Qwen3 / Qwen2-VL text) in JAX.

    cfg = models.tiny()                      # or models.load_hf(folder) -> (cfg, params)
    params = models.init_params(cfg, key)
    logits, cache = models.forward(cfg, params, tokens, positions, attn_mask=mask, cache=cache)

The names below load on first use (PEP 562), so `models.config` (the option lists `grpo_jax.config`
validates against) can be imported without importing jax.
"""

from __future__ import annotations

import importlib

_EXPORTS = {
    "models.config": ("PRESETS", "ModelConfig", "bench_qwen2_tiny", "llama_1b", "preset", "qwen2_5_0_5b",
                      "qwen3_0_6b", "tiny"),
    "models.hf": ("CheckpointError", "load_hf", "save_hf"),
    "models.keys": ("as_typed_key",),
    "models.transformer": ("decoder", "forward", "forward_hidden", "grow_cache", "head_logits", "init_cache",
                           "init_params", "token_entropy", "token_logprobs"),
}
_HOME = {name: module for module, names in _EXPORTS.items() for name in names}
_SUBMODULES = ("config", "hf", "keys", "layers", "lora", "modules", "rope", "transformer")
__all__ = sorted(_HOME)


def __getattr__(name: str):
    if name in _HOME:
        value = getattr(importlib.import_module(_HOME[name]), name)
    elif name in _SUBMODULES:
        value = importlib.import_module(f"models.{name}")
    else:
        raise AttributeError(f"module 'models' has no attribute {name!r}")
    globals()[name] = value  # later reads skip this function
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_HOME) | set(_SUBMODULES))
