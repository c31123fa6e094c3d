"""Export a run's policy as a transformers checkpoint: `python -m grpo_jax.export RUN_DIR [--step N] OUT`.

    python -m grpo_jax.export runs/a runs/a-hf             # the newest good checkpoint
    python -m grpo_jax.export runs/a runs/a-hf-200 --step 200
    python -m grpo_jax.export runs/a runs/a-hf --force     # replace an existing export
    python -m grpo_jax.export runs/a runs/a-lora --adapter-only   # a LoRA run's adapter alone, for peft

OUT gets what `transformers.AutoModelForCausalLM.from_pretrained(OUT)` loads (`models.save_hf`:
config.json + model.safetensors), the tokenizer beside it, and `export_info.json` (run folder, step,
tokenizer, the run's manifest). With `checkpoint.export_hf=true` the Trainer writes the same to <out>/hf
after its last step (from the params in memory; a paused run is not exported).

Tokenizer: a task with a Hugging Face tokenizer (jsonl_math) has its files written with the model
(`save_pretrained`), so `AutoTokenizer.from_pretrained(OUT)` works. The synthetic tasks (arithmetic,
translation) use grpo_jax's own `CharTokenizer`, which has no transformers equivalent: no HF tokenizer is
written, its description goes to `grpo_tokenizer.json` (`CharTokenizer.from_json` reads it back) and the
export says so. The pad/bos/eos ids go into config.json either way (unless a base model's config.json
already gives them), so `generate` stops at the policy's EOS. The base folder's (model.hf_path)
`generation_config.json`, when it has one, is copied beside the weights, so `generate` samples with the
base's settings (temperature, top_p, stop ids) as it did before training.

`--adapter-only` (a LoRA run on a model.hf_path base) writes what PEFT loads instead of the merged model:
`adapter_config.json` + `adapter_model.safetensors` (`models.lora.peft_config` / `peft_tensors`), with the
tokenizer and export_info.json beside them; `PeftModel.from_pretrained(base, OUT)` on the base folder gives
the merged export's model.

Where the params come from: the checkpoint's saved config rebuilds the train state's shapes (model from
model.preset and the task tokenizer's vocabulary, or model.hf_path's config.json; the optimizer from
optim.*), and the whole state is restored onto the CPU (params, optimizer moments, reference: about four
times the policy's size in host memory), then `update.policy_params` picks what is written (with LoRA, the
adapters merged into the base).

Nothing already written is lost: the export is assembled in a hidden folder beside OUT and renamed into
place; an OUT that exists and is not empty is refused unless --force, which swaps it out only once the new
export is complete.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import tempfile
import time
from typing import Any

import jax
from safetensors.numpy import save_file

import models
from grpo_jax import checkpoint as ckpt_lib
from grpo_jax import build, provenance, sharding, update
from grpo_jax import tasks as tasks_lib
from grpo_jax.cli import add_debug_flag, for_people
from grpo_jax.config import TrainConfig, UserError, from_dict
from grpo_jax.fileio import atomic_write_text
from grpo_jax.tokenizer import CharTokenizer, HFTokenizer
from models.config import ModelConfig

EXPORT_INFO = "export_info.json"
GENERATION_CONFIG = "generation_config.json"  # transformers' sampling defaults, copied from the base folder
ADAPTER_CONFIG, ADAPTER_WEIGHTS = "adapter_config.json", "adapter_model.safetensors"  # PEFT's file names
CHAR_TOKENIZER_FILE = "grpo_tokenizer.json"
FORMAT = 1


class ExportError(UserError, RuntimeError):
    """A run, step or model that cannot be exported, or a destination that would be overwritten; the
    message names the run folder, step or path."""


def check_exportable(model_cfg: ModelConfig, where: str) -> None:
    """Raise ExportError naming `where` when `models.save_hf` would refuse this model (rope2d, attention
    output gates, a Qwen2-VL shape transformers would misread, ...): cheap, so it runs before any restore
    and, with checkpoint.export_hf, when the Trainer starts rather than after the last step."""
    try:
        models.hf.check_hf_writable(model_cfg)
    except models.CheckpointError as e:
        raise ExportError(f"{where}: the policy cannot be written as a transformers checkpoint: {e}") from None


def check_destination(out: str, *, force: bool) -> None:
    """Refuse an OUT that is a file, or a non-empty folder without `force` (nothing is overwritten by
    accident)."""
    if os.path.lexists(out) and not os.path.isdir(out):
        raise ExportError(f"export destination {out} exists and is not a folder")
    if os.path.isdir(out) and os.listdir(out) and not force:
        raise ExportError(f"export destination {out} exists and is not empty: choose another folder or pass "
                          "--force to replace it")


def _token_ids(tokenizer) -> dict[str, int]:
    ids = {"pad_token_id": tokenizer.pad_id, "eos_token_id": tokenizer.eos_id, "bos_token_id": tokenizer.bos_id}
    return {k: int(v) for k, v in ids.items() if v is not None}


def _write_tokenizer(tokenizer, folder: str) -> str:
    """Write what can be written of the tokenizer into `folder`; returns the line export_info records."""
    if isinstance(tokenizer, HFTokenizer):
        tokenizer.hf.save_pretrained(folder)
        return "hf: the task's tokenizer files (AutoTokenizer.from_pretrained loads them)"
    if isinstance(tokenizer, CharTokenizer):
        atomic_write_text(os.path.join(folder, CHAR_TOKENIZER_FILE), tokenizer.to_json())
        return (f"none: the task uses grpo_jax's CharTokenizer, which has no transformers equivalent; no HF "
                f"tokenizer was written. {CHAR_TOKENIZER_FILE} describes it "
                "(grpo_jax.tokenizer.CharTokenizer.from_json)")
    return f"none: no HF tokenizer was written ({type(tokenizer).__name__} has no files to save)"


def _swap_into_place(new: str, out: str, scratch: str) -> None:
    """Rename the finished export `new` to `out`; an existing `out` is first moved into `scratch` (same
    folder, so both are renames) and deleted only after the new one is in place."""
    if os.path.lexists(out):
        os.replace(out, os.path.join(scratch, "replaced"))
    os.replace(new, out)


def _assemble(out: str, fill, *, info: dict, tokenizer, force: bool) -> dict:
    """Run `fill(folder) -> fields` on a hidden folder beside `out`, write the tokenizer there and
    export_info.json (format, time, `info`, `fields`, the tokenizer line), and rename the folder into place
    (see the module docstring); returns export_info."""
    check_destination(out, force=force)
    out = os.path.abspath(out)
    parent = os.path.dirname(out)
    os.makedirs(parent, exist_ok=True)
    scratch = tempfile.mkdtemp(dir=parent, prefix=f".{os.path.basename(out)}.export-")
    try:
        staged = os.path.join(scratch, "new")
        os.makedirs(staged)
        info = {"format": FORMAT, "exported_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"), **info, **fill(staged),
                "tokenizer": _write_tokenizer(tokenizer, staged)}
        atomic_write_text(os.path.join(staged, EXPORT_INFO), json.dumps(info, indent=2, sort_keys=True))
        _swap_into_place(staged, out, scratch)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return info


def copy_generation_config(base_folder: str | None, folder: str) -> str | None:
    """Copy the base model's generation_config.json (sampling defaults and stop ids `generate` uses) from
    `base_folder` into `folder`; returns the path copied, or None when there is no base folder or it has
    none (a preset model, or a base saved without one)."""
    if not base_folder:
        return None
    src = os.path.join(base_folder, GENERATION_CONFIG)
    if not os.path.isfile(src):
        return None
    try:
        shutil.copyfile(src, os.path.join(folder, GENERATION_CONFIG))
    except OSError as e:
        raise ExportError(f"model.hf_path={base_folder!r}: cannot copy {src} into the export ({e})") from None
    return os.path.abspath(src)


def write_export(out: str, model_cfg: ModelConfig, params, tokenizer, *, info: dict,
                 base_config: dict | None = None, base_folder: str | None = None, force: bool = False) -> dict:
    """Write params as a transformers checkpoint in `out` with the tokenizer beside it, the base folder's
    generation_config.json (when it has one) and export_info.json (`info` plus the tokenizer line and the
    generation config copied); returns what export_info.json holds. Assembled in a hidden sibling folder and
    renamed into place (see the module docstring)."""
    check_exportable(model_cfg, f"export to {out}")

    def fill(staged: str) -> dict:
        models.save_hf(model_cfg, params, staged, base_config={**_token_ids(tokenizer), **(base_config or {})})
        return {"generation_config": copy_generation_config(base_folder, staged)}

    return _assemble(out, fill, info=info, tokenizer=tokenizer, force=force)


def write_adapter(out: str, model_cfg: ModelConfig, adapters, lora_cfg, tokenizer, *, info: dict,
                  base_folder: str, force: bool = False) -> dict:
    """Write LoRA `adapters` (models.lora's pytree) as a PEFT adapter in `out`: adapter_config.json (rank,
    alpha, dropout, target modules of `lora_cfg`; `base_folder` as base_model_name_or_path) and
    adapter_model.safetensors, the tokenizer and export_info.json beside them; returns export_info."""
    check_exportable(model_cfg, f"adapter export to {out}")
    if not base_folder:
        raise ExportError(f"adapter export to {out}: the adapter needs its base as a transformers folder "
                          "(model.hf_path); a preset model's base exists only in the run: export it merged")
    tensors = models.lora.peft_tensors(model_cfg, adapters)
    config = models.lora.peft_config(rank=lora_cfg.rank, alpha=lora_cfg.alpha, dropout=lora_cfg.dropout,
                                     targets=lora_cfg.targets, base_model=os.path.abspath(base_folder))

    def fill(staged: str) -> dict:
        save_file(tensors, os.path.join(staged, ADAPTER_WEIGHTS), metadata={"format": "pt"})
        atomic_write_text(os.path.join(staged, ADAPTER_CONFIG), json.dumps(config, indent=2, sort_keys=True))
        return {"adapter_only": True, "base_model": config["base_model_name_or_path"]}

    return _assemble(out, fill, info=info, tokenizer=tokenizer, force=force)


# --------------------------------------------------------------------------------------------------
# from a run
# --------------------------------------------------------------------------------------------------

def base_config(cfg: TrainConfig) -> dict | None:
    """The config.json of model.hf_path (its other fields, e.g. token ids, carried into the export), or
    None for a preset model or a base folder that is gone."""
    if not cfg.model.hf_path:
        return None
    path = os.path.join(cfg.model.hf_path, "config.json")
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except (OSError, ValueError) as e:
        raise ExportError(f"model.hf_path={cfg.model.hf_path!r}: cannot read {path} ({e}); the export rebuilds the "
                          "model's shape from it") from None


def model_config(cfg: TrainConfig, vocab_size: int) -> ModelConfig:
    """The run's ModelConfig without weights: model.hf_path's config.json (dtypes as configured), else the
    preset with the run's overrides (as `build.build_model` builds them)."""
    if not cfg.model.hf_path:
        return build.preset_config(cfg.model, vocab_size)
    hf = models.hf.config_from_hf(base_config(cfg), where=os.path.join(cfg.model.hf_path, "config.json"))
    return hf.replace(param_dtype=cfg.model.param_dtype, dtype=cfg.model.dtype, remat=cfg.model.remat)


def _state_target(cfg: TrainConfig, model_cfg: ModelConfig):
    """The Trainer's TrainState as ShapeDtypeStructs on the CPU: what `Checkpointer.restore` needs to read
    a step (every leaf, the optimizer's and the reference's too, must match)."""
    optimizer = update.make_optimizer(cfg)
    key = jax.random.key(0)  # shapes only
    abstract = jax.eval_shape(lambda: update.initial_state(cfg, model_cfg, models.init_params(model_cfg, key),
                                                           optimizer, key))
    cpu = jax.sharding.SingleDeviceSharding(jax.devices("cpu")[0])
    return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=cpu), abstract)


def _run_config(run_dir: str, meta: dict, step: int | None) -> TrainConfig:
    try:
        return from_dict(TrainConfig, meta["config"])
    except (KeyError, TypeError, ValueError) as e:
        at = f"step {step}" if step is not None else "its newest checkpoint"
        raise ExportError(f"{run_dir}: the config saved with {at} cannot be read by this version of grpo_jax "
                          f"({type(e).__name__}: {e})") from None


def restore_policy(run_dir: str, step: int | None = None):
    """(train config, model config, policy params, tokenizer, step) of a run's checkpoint `step` (default:
    the newest good one; with LoRA the adapters merged in). Errors name the run folder and the step."""
    cfg, model_cfg, state, tokenizer, used = restore_state(run_dir, step)
    return cfg, model_cfg, update.policy_params(model_cfg, cfg, state), tokenizer, used


def restore_state(run_dir: str, step: int | None = None):
    """(train config, model config, train state, tokenizer, step) of a run's checkpoint `step` (default:
    the newest good one), the state on the CPU. Errors name the run folder and the step."""
    ckpt_dir = os.path.join(run_dir, "checkpoints")
    if not os.path.isdir(run_dir):
        raise ExportError(f"{run_dir}: no such run folder")
    if not os.path.isdir(ckpt_dir):
        raise ExportError(f"{run_dir}: no checkpoints (no {ckpt_dir} folder): was the run started with --out "
                          f"{run_dir}, and did it reach its first checkpoint?")
    with ckpt_lib.Checkpointer(ckpt_dir, keep_last=1) as ckpt:
        steps = ckpt.steps()
        if not steps:
            raise ExportError(f"{run_dir}: no checkpoints in {ckpt_dir}")
        if step is not None and step not in steps:
            raise ExportError(f"{run_dir}: no checkpoint at step {step}; the run has steps {steps}")
        try:
            meta = ckpt.read_meta(step)
        except ckpt_lib.CheckpointError as e:
            raise ExportError(f"{run_dir}: {e}") from None
        cfg = _run_config(run_dir, meta, step)
        at = f"{run_dir} step {meta.get('step', step)}"
        try:
            tokenizer = tasks_lib.get_task(cfg.task.name, **dict(cfg.task.options)).tokenizer()
        except (OSError, ValueError) as e:
            raise ExportError(f"{at}: the task's tokenizer cannot be built ({e})") from None
        model_cfg = model_config(cfg, tokenizer.vocab_size)
        check_exportable(model_cfg, at)
        try:
            state, _, used = ckpt.restore(_state_target(cfg, model_cfg), step=step)
        except ckpt_lib.CheckpointError as e:
            raise ExportError(f"{run_dir}: {e}") from None
    return cfg, model_cfg, state, tokenizer, used


def _run_info(run_dir: str, step: int, source: str) -> dict[str, Any]:
    return {"run_dir": os.path.abspath(run_dir), "step": int(step), "source": source,
            "run_manifest": provenance.read_manifest(run_dir)}


def export_run(run_dir: str, out: str, *, step: int | None = None, force: bool = False) -> dict:
    """Export checkpoint `step` (default: the newest good one) of the run in `run_dir` to `out`; returns
    export_info. The destination is checked first, so a refused OUT costs no restore."""
    check_destination(out, force=force)
    cfg, model_cfg, params, tokenizer, used = restore_policy(run_dir, step)
    return write_export(out, model_cfg, params, tokenizer, info=_run_info(run_dir, used, "checkpoint"),
                        base_config=base_config(cfg), base_folder=cfg.model.hf_path or None, force=force)


def export_adapter_run(run_dir: str, out: str, *, step: int | None = None, force: bool = False) -> dict:
    """Export the LoRA adapters of checkpoint `step` (default: the newest good one) of the run in `run_dir`
    as a PEFT adapter in `out` (`write_adapter`); returns export_info. A run without LoRA is refused."""
    check_destination(out, force=force)
    cfg, model_cfg, state, tokenizer, used = restore_state(run_dir, step)
    if not cfg.lora.rank:
        raise ExportError(f"{run_dir}: --adapter-only needs a LoRA run (lora.rank > 0); this run trained every "
                          "weight (lora.rank=0): export it without --adapter-only")
    return write_adapter(out, model_cfg, state.params, cfg.lora, tokenizer,
                         info=_run_info(run_dir, used, "checkpoint"), base_folder=cfg.model.hf_path, force=force)


def export_trainer(trainer, out: str) -> dict | None:
    """The end-of-run export (checkpoint.export_hf): the Trainer's current policy to `out` (replaced if
    there, e.g. by an earlier segment of a resumed run). Every process joins the gather of the params;
    process 0 writes. Returns export_info on process 0, None on the others."""
    params = jax.tree.map(sharding.to_host, update.policy_params(trainer.actor.model_cfg, trainer.cfg, trainer.state))
    if jax.process_index() != 0:
        return None
    return write_export(out, trainer.actor.model_cfg, params, trainer.actor.tokenizer,
                        info=_run_info(trainer.out_dir, trainer.step, "end of run (checkpoint.export_hf)"),
                        base_config=base_config(trainer.cfg), base_folder=trainer.cfg.model.hf_path or None,
                        force=True)


@for_people
def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(prog="python -m grpo_jax.export", description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("run_dir", help="a run folder (its checkpoints/ are read)")
    ap.add_argument("out", help="the folder to write the transformers checkpoint into")
    ap.add_argument("--step", type=int, default=None, help="the checkpoint step (default: the newest good one)")
    ap.add_argument("--force", action="store_true", help="replace OUT if it exists and is not empty")
    ap.add_argument("--adapter-only", action="store_true",
                    help="a LoRA run: write the PEFT adapter (adapter_config.json + adapter_model.safetensors) "
                         "instead of the merged model")
    add_debug_flag(ap)
    args = ap.parse_args(argv)
    export = export_adapter_run if args.adapter_only else export_run
    info = export(args.run_dir, args.out, step=args.step, force=args.force)
    what = "the LoRA adapter of " if args.adapter_only else ""
    print(f"exported {what}{args.run_dir} step {info['step']} to {args.out}; tokenizer: {info['tokenizer']}")
    return info


if __name__ == "__main__":
    main()
