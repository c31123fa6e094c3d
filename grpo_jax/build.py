"""What a run is built from, read off its config: the model (a Hugging Face folder or a preset with the
run's shape overrides) and the reward dimensions. Used by the Trainer, the export (which rebuilds a
checkpoint's shapes) and the offline tools, so none of them needs the training loop."""

from __future__ import annotations

import dataclasses
import json
import os

import jax

import models
from grpo_jax import importpath, sharding
from grpo_jax import rewards as rewards_lib
from grpo_jax.cli import one_line
from grpo_jax.config import LoraConfig, TrainConfig, UserError
from models.config import ModelConfig


def build_model(cfg: TrainConfig, vocab_size: int, key: jax.Array, *, tokenizer_name: str = "the task's tokenizer"):
    """(model config, params) from a HF folder or a preset with the run's overrides (params on host).

    vocab_size is the tokenizer's: a loaded model with fewer embedding rows is an error, since JAX clamps
    out-of-range ids in the lookup and the run would train silently on the wrong tokens."""
    spec = cfg.model
    if spec.hf_path:
        check_model_folder(cfg)
        try:
            model_cfg, params = models.load_hf(spec.hf_path, param_dtype=spec.param_dtype, dtype=spec.dtype)
        except (OSError, models.hf.CheckpointError) as e:  # a missing config.json, a bad tensor: name the key
            raise UserError(f"model.hf_path={spec.hf_path!r}: {one_line(e)}") from e
        model_cfg = model_cfg.replace(remat=spec.remat, scan_layers=spec.scan_layers,  # training choices, not in HF
                                      logits_chunk=spec.logits_chunk,
                                      max_positions=spec.max_positions or model_cfg.max_positions)
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
    if model_cfg.module:
        try:
            importpath.load(spec.module)  # a bad path: one line naming what is missing
            module = models.decoder(model_cfg)  # built here, so an error in it is one line naming the key
            sharding.declare_param_axes(getattr(module, "param_axes", {}), spec.module)
        except Exception as e:  # noqa: BLE001 - the researcher's module: any error is reported as one line
            raise UserError(f"model.module={spec.module!r}: {one_line(e)}") from e
        if cfg.lora.rank:
            raise UserError(f"model.module={spec.module!r} with lora.rank={cfg.lora.rank}: LoRA adapters sit on the "
                            "built-in decoder's projections; train your module's own parameters (lora.rank=0)")
    return model_cfg, models.init_params(model_cfg, key)


def check_model_folder(cfg: TrainConfig) -> None:
    """Refuse a model.hf_path that is not an existing local folder, naming the key: checked before anything
    reads the folder (the task's tokenizer often comes from it, and would name only itself)."""
    path = cfg.model.hf_path
    if path and not os.path.isdir(path):
        what = "is a file, not a folder" if os.path.exists(path) else "no such folder"
        raise UserError(f"model.hf_path={path!r}: {what}; set it to a local Hugging Face checkpoint folder "
                        "(config.json + *.safetensors; hub ids are not fetched)")


def model_positions(cfg: TrainConfig) -> tuple[int, str]:
    """(the positions the run's model may use, prompt + completion; where that number comes from), read
    before any weight is: model.max_positions, else the checkpoint's max_position_embeddings (config.json
    only), else 0 (a preset is randomly initialised and was trained for no length)."""
    spec = cfg.model
    if spec.max_positions:
        return spec.max_positions, "model.max_positions"
    if not spec.hf_path:
        return 0, f"model.preset={spec.preset!r}"
    check_model_folder(cfg)
    try:
        positions = models.hf.read_config(spec.hf_path).max_positions
    except models.hf.CheckpointError as e:
        raise UserError(f"model.hf_path={spec.hf_path!r}: {one_line(e)}") from e
    return positions, f"max_position_embeddings in {os.path.join(spec.hf_path, 'config.json')}, model.hf_path"


def lora_note(cfg: TrainConfig) -> str | None:
    """"LoRA off: full fine-tuning ..." when lora.rank is 0 but another lora setting differs from its default
    (someone asked for LoRA and would otherwise train every weight without a word); None otherwise, so a run
    that never mentions LoRA stays quiet."""
    if cfg.lora.rank:
        return None
    changed = [f"lora.{f.name}" for f in dataclasses.fields(LoraConfig)
               if f.name != "rank" and getattr(cfg.lora, f.name) != getattr(LoraConfig(), f.name)]
    if not changed:
        return None
    return (f"LoRA off: full fine-tuning (lora.rank=0 trains every weight; {', '.join(changed)} "
            "unused); set lora.rank > 0 (e.g. --set lora.rank=16) to train adapters")


def preset_config(spec, vocab_size: int) -> ModelConfig:
    """The ModelConfig of model.preset with the run's shape overrides (0 = keep the preset's); also what
    `grpo_jax.export` rebuilds a checkpoint's shapes from."""
    shape = {f: getattr(spec, f) for f in ("d_model", "n_layers", "n_heads", "n_kv_heads", "head_dim", "mlp_dim",
                                           "max_positions")}
    overrides = {k: v for k, v in shape.items() if v}
    return models.preset(spec.preset, vocab_size=vocab_size, param_dtype=spec.param_dtype, dtype=spec.dtype,
                         remat=spec.remat, scan_layers=spec.scan_layers, logits_chunk=spec.logits_chunk,
                         module=spec.module, **overrides)


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
