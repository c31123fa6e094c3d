"""What a run is built from, read off its config: the model (a Hugging Face folder or a preset with the
run's shape overrides) and the reward dimensions. Used by the Trainer, the export (which rebuilds a
checkpoint's shapes) and the offline tools, so none of them needs the training loop."""

from __future__ import annotations

import json
import os

import jax

import models
from grpo_jax import rewards as rewards_lib
from grpo_jax.config import TrainConfig
from models.config import ModelConfig


def build_model(cfg: TrainConfig, vocab_size: int, key: jax.Array, *, tokenizer_name: str = "the task's tokenizer"):
    """(model config, params) from a HF folder or a preset with the run's overrides (params on host).

    vocab_size is the tokenizer's: a loaded model with fewer embedding rows is an error, since JAX clamps
    out-of-range ids in the lookup and the run would train silently on the wrong tokens."""
    spec = cfg.model
    if spec.hf_path:
        model_cfg, params = models.load_hf(spec.hf_path, param_dtype=spec.param_dtype, dtype=spec.dtype)
        model_cfg = model_cfg.replace(remat=spec.remat)  # a training choice, not in the HF config
        if model_cfg.vocab_size < vocab_size:
            raise ValueError(
                f"vocabulary mismatch: the model in model.hf_path={spec.hf_path!r} has vocab_size "
                f"{model_cfg.vocab_size} (config.json), smaller than the {vocab_size} ids of {tokenizer_name}; "
                f"ids {model_cfg.vocab_size}..{vocab_size - 1} would be clamped to the last embedding row and the run "
                "would train on garbage. Use the tokenizer saved with the checkpoint (for jsonl_math: "
                "task.options tokenizer_path = the checkpoint folder) or a model whose vocab_size is at least "
                f"{vocab_size}")
        return model_cfg, params
    model_cfg = preset_config(spec, vocab_size)
    return model_cfg, models.init_params(model_cfg, key)


def preset_config(spec, vocab_size: int) -> ModelConfig:
    """The ModelConfig of model.preset with the run's shape overrides (0 = keep the preset's); also what
    `grpo_jax.export` rebuilds a checkpoint's shapes from."""
    shape = {f: getattr(spec, f) for f in ("d_model", "n_layers", "n_heads", "n_kv_heads", "head_dim", "mlp_dim")}
    overrides = {k: v for k, v in shape.items() if v}
    return models.preset(spec.preset, vocab_size=vocab_size, param_dtype=spec.param_dtype, dtype=spec.dtype,
                         remat=spec.remat, **overrides)


def reward_specs(cfg: TrainConfig, task) -> tuple[rewards_lib.RewardSpec, ...]:
    """The run's reward dimensions: rewards.specs, else the task's defaults; a bad entry names its index."""
    raw = cfg.rewards.specs or tuple(task.reward_specs())
    where = "rewards.specs" if cfg.rewards.specs else f"task {task.name!r} default rewards"
    specs = []
    for i, s in enumerate(raw):
        try:
            specs.append(rewards_lib.RewardSpec(**dict(s)))
        except (TypeError, ValueError) as e:  # TypeError: a key RewardSpec does not take
            raise ValueError(f"{where}[{i}] = {json.dumps(s, default=str)}: {e}") from None
    try:
        rewards_lib.dimension_names(specs)  # distinct dimensions; each `when` names an ungated one
    except ValueError as e:
        raise ValueError(f"{where}: {e}") from None
    return tuple(specs)
