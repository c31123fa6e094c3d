"""Compile a run's programs for a TPU topology on a machine with no TPU, and report what each needs per chip.

    python -m grpo_jax.aot --topology v5e:2x4 --config runs/a/config.json [--set KEY=VALUE ...]
    python experiments/arithmetic.py --compile-only --topology v5e-64 --set model.preset=qwen2.5-7b ...

XLA's TPU compiler ships in libtpu (`pip install -e '.[tpu]'`); `jax.experimental.topologies` describes the
devices of a named slice without any TPU attached. Every program a GRPO step runs is lowered over
`ShapeDtypeStruct`s sharded on meshes of those devices and compiled, allocating nothing: the train step as
configured (mu, minibatches, microbatches, remat, LoRA, the reference and old-logprob passes inside it), the
teacher-forced logprob pass on its own, the sampler's prefill and decode (every decode chunk, the KV cache at
P + T slots) or, with replicated rollout params, the per-device rollout program, and the policy's move onto
the rollout mesh (LoRA merge, reshard) when there is one. No weights, no data, no TPU.

The report gives per program and per chip the compiler's memory figures (arguments, outputs, temporaries,
code; donated buffers counted once) against the chip's HBM, XLA's own cost figures, the collectives in the
compiled HLO with their bytes, the compile time, and a roofline estimate (compute, HBM and interconnect bounds
from the chip's published peaks, `CHIPS`) of each program's time and from those the GRPO step's time,
rollout tokens/s per chip and MFU. Those are estimates, labelled so; only a run on the device measures.
A run that does not fit ends with exit code 3 and one line naming the program, the figure and the capacity.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import re
import sys
import time

import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding, PartitionSpec as P

import models
from grpo_jax import build, perf, sampler, sharding, update
from grpo_jax.cli import UserError, for_people, parse_args
from grpo_jax.config import TrainConfig
from grpo_jax.experience import Batch
from models.config import ModelConfig

NOT_FIT_EXIT_CODE = 3  # the run's programs compiled but one needs more HBM than the chip has
GIB = 1024**3


@dataclasses.dataclass(frozen=True)
class Chip:
    """A TPU chip's published figures (one JAX device per chip: v4 and v5p run their two TensorCores as one
    megacore device). hbm_bytes is the capacity the compiler may fill; bandwidths in bytes/s."""

    name: str
    hbm_bytes: float
    hbm_bw: float  # HBM bandwidth
    peak_flops: float  # dense bf16 matmul FLOP/s
    ici_bw: float  # inter-chip interconnect, bidirectional per chip
    source: str


# Google Cloud TPU documentation (cloud.google.com/tpu/docs/v4, /v5e, /v5p, /v6e), read 2026-12-06. v4's page
# gives no per-chip ICI figure: 6 links x 90 GB/s bidirectional per link from the JAX scaling book
# (jax-ml.github.io/scaling-book/tpus). v5p's page gives 95 GiB usable of 96 physical.
CHIPS = {
    "v4": Chip("TPU v4", 32 * GIB, 1.2e12, 275e12, 6 * 9e10, "cloud.google.com/tpu/docs/v4; ICI: scaling-book/tpus"),
    "v5e": Chip("TPU v5e", 16 * GIB, 8.19e11, 197e12, 4e11, "cloud.google.com/tpu/docs/v5e"),
    "v5p": Chip("TPU v5p", 95 * GIB, 2.765e12, 459e12, 1.2e12, "cloud.google.com/tpu/docs/v5p"),
    "v6e": Chip("TPU v6e (Trillium)", 32 * GIB, 1.638e12, 918e12, 8e11, "cloud.google.com/tpu/docs/v6e"),
}
# GPUs have no topology to compile for here (XLA's GPU compiler needs the GPU): their rows are estimates only.
# NVIDIA H100 SXM datasheet (nvidia.com/en-us/data-center/h100): 80 GB HBM3, 3.35 TB/s, 989 TFLOP/s dense bf16
# (1,979 with sparsity), NVLink 900 GB/s.
GPUS = {"h100": Chip("NVIDIA H100 SXM", 80e9, 3.35e12, 989e12, 9e11, "nvidia.com/en-us/data-center/h100")}
# chips -> the slice's shape, for names such as v5e-64 (a chip count; v5p's own slice names count TensorCores,
# two a chip, so Google's v5p-128 is "v5p-64" here: 64 chips, 4x4x4)
_SHAPES_2D = {1: "1x1", 4: "2x2", 8: "2x4", 16: "4x4", 32: "4x8", 64: "8x8", 128: "8x16", 256: "16x16"}
_SHAPES_3D = {8: "2x2x2", 16: "2x2x4", 32: "2x4x4", 64: "4x4x4", 128: "4x4x8", 256: "4x8x8", 512: "8x8x8"}


def topology_name(name: str) -> tuple[str, str]:
    """(chip key, the slice name jax.experimental.topologies takes) for "v5e:2x4" or "v5e-8" (chips)."""
    chip, sep, rest = name.partition(":") if ":" in name else name.partition("-")
    if chip not in CHIPS or not sep or not rest:
        raise UserError(f"--topology {name!r}: expected CHIP:SHAPE (v5e:2x4, v5p:4x4x4) or CHIP-CHIPS (v5e-64) with "
                        f"CHIP one of {sorted(CHIPS)}")
    if sep == ":":
        return chip, name
    shapes = _SHAPES_3D if chip in ("v4", "v5p") else _SHAPES_2D
    if not rest.isdigit() or int(rest) not in shapes:
        raise UserError(f"--topology {name!r}: {chip} slices known by chip count: {sorted(shapes)}; or name the shape "
                        f"({chip}:{next(iter(shapes.values()))})")
    return chip, f"{chip}:{shapes[int(rest)]}"


def topology_devices(name: str) -> list:
    """The devices of a TPU slice, from libtpu's description of the topology (no TPU needed). libtpu takes a
    machine-wide lock file by default; compiling touches no TPU, so several compiling processes (the test
    workers, the scaling table's rows) may load it at once."""
    os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
    try:
        from jax.experimental import topologies
        return list(topologies.get_topology_desc(platform="tpu", topology_name=name).devices)
    except Exception as e:  # noqa: BLE001 - no libtpu, or a name it does not know: one line saying which
        raise UserError(f"--topology {name}: the TPU compiler could not describe it ({' '.join(str(e).split())[:300]});"
                        " install it with pip install -e '.[tpu]'") from None


# --------------------------------------------------------------------------------------------------
# the run's shapes, abstractly
# --------------------------------------------------------------------------------------------------

def model_config(cfg: TrainConfig) -> ModelConfig:
    """The run's ModelConfig without weights: a checkpoint folder's config.json, or the preset with the run's
    overrides at the task tokenizer's vocabulary (a task whose tokenizer needs files that are not here: the
    preset's own vocabulary, which is the real one for the Qwen and Llama presets)."""
    spec = cfg.model
    if spec.hf_path and os.path.isfile(os.path.join(spec.hf_path, "config.json")):
        hf = models.hf._read_json(os.path.join(spec.hf_path, "config.json"))
        return models.hf.config_from_hf(hf, where=os.path.join(spec.hf_path, "config.json")).replace(
            param_dtype=spec.param_dtype, dtype=spec.dtype, remat=spec.remat, scan_layers=spec.scan_layers,
            logits_chunk=spec.logits_chunk)
    vocab = _task_vocab(cfg)
    if vocab is None:
        vocab = models.preset(spec.preset).vocab_size
    return build.preset_config(spec, vocab)


def _task_vocab(cfg: TrainConfig) -> int | None:
    from grpo_jax import tasks as tasks_lib
    try:
        return tasks_lib.get_task(cfg.task.name, **dict(cfg.task.options)).tokenizer().vocab_size
    except Exception:  # noqa: BLE001 - a tokenizer read from a folder that is not on this machine
        return None


def abstract_state(cfg: TrainConfig, model_cfg: ModelConfig, optimizer, mesh):
    """The run's TrainState as ShapeDtypeStructs carrying the shardings `initial_state` gives it on `mesh`:
    params (and the reference copy, the LoRA base) by the rules table, the optimizer's moments as their
    params, its counters replicated."""
    key = jax.random.key(0)
    params = jax.eval_shape(lambda k: models.init_params(model_cfg, k), key)
    state = jax.eval_shape(lambda p, k: update.initial_state(cfg, model_cfg, p, optimizer, k), params, key)
    specs = state.replace(params=sharding.param_specs(state.params, mesh),
                          ref_params=sharding.param_specs(state.ref_params, mesh) if state.ref_params else {},
                          base=sharding.param_specs(state.base, mesh) if state.base else {},
                          step=P(), opt_state=None)
    opt_specs = _optimizer_specs(optimizer, state.opt_state, specs.params)
    specs = specs.replace(opt_state=opt_specs)
    return jax.tree.map(lambda s, p: _struct(s, NamedSharding(mesh, p)), state, specs,
                        is_leaf=lambda x: isinstance(x, P))


def _optimizer_specs(optimizer, opt_state, param_specs):
    """PartitionSpecs of the optimizer state: a leaf shaped as the params (Adam's moments) takes its param's
    spec, anything else (step counters) is replicated."""
    import optax
    return optax.tree_map_params(optimizer, lambda _, spec: spec, opt_state, param_specs,
                                 transform_non_params=lambda _: P(), is_leaf=lambda x: isinstance(x, P))


def _struct(x, sharding_) -> jax.ShapeDtypeStruct:
    return jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=sharding_)


def abstract_batch(cfg: TrainConfig, mesh, prompt_len: int) -> Batch:
    """The update's Batch for N = prompts_per_step x G rows of P + T tokens, placed as `make_batch` places it."""
    n, t = cfg.prompts_per_step * cfg.sampling.group_size, cfg.sampling.max_new_tokens
    split = n % sharding.data_ways(mesh) == 0

    def arr(shape, dtype):
        place = sharding.batch_sharding(mesh, len(shape)) if split else sharding.replicated(mesh)
        return jax.ShapeDtypeStruct(shape, dtype, sharding=place)

    return Batch(tokens=arr((n, prompt_len + t), jnp.int32), attn_mask=arr((n, prompt_len + t), jnp.bool_),
                 loss_mask=arr((n, t), jnp.bool_), old_logp=arr((n, t), jnp.float32), advantages=arr((n,), jnp.float32),
                 temperatures=arr((n, t), jnp.float32))


# --------------------------------------------------------------------------------------------------
# the programs
# --------------------------------------------------------------------------------------------------

@dataclasses.dataclass
class Program:
    """One jitted program of the run, lowered over abstract arguments; `compile()` fills the figures."""

    name: str
    lowered: object
    figures: dict = dataclasses.field(default_factory=dict)


def run_programs(cfg: TrainConfig, model_cfg: ModelConfig, devices, prompt_len: int, *, only=None):
    """Lower every program of a GRPO step of `cfg` on meshes of `devices` and compile each, in order; yields
    (name, figures) as each finishes, so a long compile's predecessors are reported first."""
    mesh = sharding.make_mesh(cfg.mesh, devices)
    rollout_mesh = sharding.make_rollout_mesh(cfg.mesh, devices) or mesh
    optimizer = update.make_optimizer(cfg)
    state = abstract_state(cfg, model_cfg, optimizer, mesh)
    batch = abstract_batch(cfg, mesh, prompt_len)
    for name, make in _program_makers(cfg, model_cfg, mesh, rollout_mesh, state, batch, optimizer, prompt_len):
        if only and name not in only:
            continue
        start = time.perf_counter()
        try:
            # the mesh the run's programs trace under: the train step's (sharding.under_mesh), the rollout's
            with jax.sharding.use_abstract_mesh((rollout_mesh if name in _ROLLOUT_PROGRAMS else mesh).abstract_mesh):
                made = make()
                if isinstance(made, dict):  # figures already added up over several programs (reshard_figures)
                    yield name, made
                    continue
                compiled = made if isinstance(made, jax.stages.Compiled) else made.compile()
        except jax.errors.JaxRuntimeError as e:  # XLA refuses a program that cannot fit: the report says so
            yield name, refused_figures(str(e), seconds=time.perf_counter() - start)
            continue
        yield name, program_figures(compiled, seconds=time.perf_counter() - start)


_ROLLOUT_PROGRAMS = ("to_rollout_mesh", "prefill", "decode", "rollout")


def _program_makers(cfg, model_cfg, mesh, rollout_mesh, state, batch, optimizer, prompt_len):
    """[(name, () -> Lowered)] for the run's programs, in the order a step runs them."""
    replicated = sharding.replicated(mesh)
    key = _key_struct(replicated)
    coef = jax.ShapeDtypeStruct((), jnp.float32, sharding=replicated)
    state_shardings = jax.tree.map(lambda s: s.sharding, state)
    t_len, chunks = cfg.sampling.max_new_tokens, cfg.minibatches * cfg.microbatches

    def train():
        step = jax.jit(sharding.under_mesh(mesh, update.make_train_step(model_cfg, cfg, optimizer)),
                       out_shardings=(state_shardings, None), donate_argnums=0)
        return step.lower(state, batch, key, coef)

    def logprobs():
        fn = jax.jit(lambda p, b: update.chunked_logprobs(model_cfg, p, b, t_len, chunks))
        return fn.lower(update.reference_params(cfg, state) if cfg.loss.beta > 0 else _policy_struct(cfg, state), batch)

    rollout_params = _rollout_params(cfg, model_cfg, state, rollout_mesh)
    policy = _rollout_params(cfg, model_cfg, state, mesh)  # the policy's weights on the training mesh
    makers = [("train_step", train), ("logprobs", logprobs)]
    if cfg.lora.rank:  # the Trainer's merge: W + scale * A B, laid out as the base
        shardings = jax.tree.map(lambda s: s.sharding, policy)
        makers.append(("lora_merge", lambda: jax.jit(lambda st: update.policy_params(model_cfg, cfg, st),
                                                     out_shardings=shardings).lower(state)))
    if rollout_mesh is not mesh:
        makers.append(("to_rollout_mesh", lambda: reshard_figures(policy, rollout_params)))
    return makers + _sampler_makers(cfg, model_cfg, rollout_mesh, rollout_params, prompt_len)


def reshard_figures(src, dst) -> dict:
    """The per-chip figures of moving a params tree from `src`'s shardings to `dst`'s, as `jax.device_put` does
    it at run time: leaf by leaf, one program per distinct (shape, dtype, source, target). Arguments and outputs
    add up over the leaves (all of them live at the end); temporaries and code are the largest one program's."""
    groups: dict = {}
    for s, d in zip(jax.tree.leaves(src), jax.tree.leaves(dst)):
        sig = (s.shape, s.dtype, s.sharding.spec, d.sharding.spec)
        groups.setdefault(sig, [s, d, 0])[2] += 1
    out = {"argument_bytes": 0, "output_bytes": 0, "temp_bytes": 0, "code_bytes": 0, "alias_bytes": 0,
           "xla_flops": 0.0, "xla_bytes_accessed": 0.0, "collectives": {}, "compile_seconds": 0.0}
    for s, d, count in groups.values():
        start = time.perf_counter()
        f = program_figures(jax.jit(lambda x: x, out_shardings=d.sharding).lower(s).compile(), seconds=0.0)
        out["compile_seconds"] += time.perf_counter() - start
        for k in ("argument_bytes", "output_bytes", "xla_flops", "xla_bytes_accessed"):
            out[k] += count * f[k]
        out["temp_bytes"], out["code_bytes"] = max(out["temp_bytes"], f["temp_bytes"]), max(out["code_bytes"],
                                                                                             f["code_bytes"])
        for op, c in f["collectives"].items():
            entry = out["collectives"].setdefault(op, {"count": 0, "bytes": 0})
            entry["count"] += count * c["count"]
            entry["bytes"] += count * c["bytes"]
    out["total_bytes"] = out["argument_bytes"] + out["output_bytes"] + out["temp_bytes"] + out["code_bytes"]
    return out


def _key_struct(place) -> jax.ShapeDtypeStruct:
    """A typed PRNG key's abstract value, placed as `place`."""
    return jax.ShapeDtypeStruct((), jax.eval_shape(lambda: jax.random.key(0)).dtype, sharding=place)


def _policy_struct(cfg: TrainConfig, state):
    return update.forward_params(cfg, state.params, state.base)


def _rollout_params(cfg, model_cfg, state, rollout_mesh):
    """The policy's full weights as the sampler gets them: on the rollout mesh by the rules (LoRA merged)."""
    full = jax.eval_shape(lambda st: update.policy_params(model_cfg, cfg, st), state)
    specs = sharding.param_specs(full, rollout_mesh)
    return jax.tree.map(lambda x, p: _struct(x, NamedSharding(rollout_mesh, p)), full, specs,
                        is_leaf=lambda x: isinstance(x, P))


def _sampler_makers(cfg, model_cfg, mesh, params, prompt_len):
    """The rollout's programs as `sampler.sample` dispatches them: with replicated params and rows split over
    the data axes, one shard_map program per device (prefill and decode together); else the SPMD prefill and
    decode (every decode chunk: `sampler.decode_chunks`)."""
    s = cfg.sampling
    b, g, t = cfg.prompts_per_step, s.group_size, s.max_new_tokens
    rows = sharding.batch_sharding(mesh, 2) if b % sharding.data_ways(mesh) == 0 else sharding.replicated(mesh)
    prompts = jax.ShapeDtypeStruct((b, prompt_len), jnp.int32, sharding=rows)
    mask = jax.ShapeDtypeStruct((b, prompt_len), jnp.bool_, sharding=rows)
    ids = jax.ShapeDtypeStruct((b,), jnp.int32, sharding=sharding.batch_sharding(mesh, 1) if rows.spec else rows)
    rep = sharding.replicated(mesh)
    key = _key_struct(rep)
    temperature = jax.ShapeDtypeStruct((), jnp.float32, sharding=rep)
    token_temp = (s.token_entropy_floor, s.token_boost, s.token_max_temperature) if s.token_entropy_floor else None
    # decode: one loop over the full P + T cache, the largest of the sampler's chunks (`sampler.decode_chunks`:
    # up to 8 loops of the same body over a growing cache); its memory is the rollout's, its compile time one loop's
    static = dict(group_size=g, max_new_tokens=t, top_k=s.top_k, top_p=float(s.top_p), eos_ids=(1,), pad_id=0,
                  token_temperature=tuple(float(x) for x in token_temp or ()) or None, chunk_ends=(t,))
    replicated_params = all(x.sharding.is_fully_replicated for x in jax.tree.leaves(params))
    if replicated_params and rows.spec and sharding.data_ways(mesh) > 1:
        axes = tuple(a for a in sharding.RULES["batch"] if mesh.shape[a] > 1)
        fn = sampler._row_sharded(model_cfg, mesh, axes, tuple(sorted(static.items())))
        return [("rollout", lambda: fn.lower(params, prompts, mask, ids, key, temperature))]

    compiled = {}  # decode reads the prefill's output shardings: the prefill is compiled once

    def prefill():
        if "prefill" not in compiled:
            compiled["prefill"] = sampler._prefill.lower(model_cfg, params, prompts, mask, group_size=g,
                                                         max_new_tokens=t).compile()
        return compiled["prefill"]

    def decode():
        out = prefill().output_shardings
        cache, logits, lengths = jax.tree.map(
            lambda x, sh: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=sh),
            jax.eval_shape(lambda p, x, m: sampler._prefill(model_cfg, p, x, m, group_size=g, max_new_tokens=t),
                           params, prompts, mask), out)
        keys = jax.eval_shape(lambda k, i: sampler.row_keys(k, i, g), key, ids)
        keys = jax.ShapeDtypeStruct(keys.shape, keys.dtype, sharding=lengths.sharding)
        return sampler._decode.lower(model_cfg, params, cache, logits, lengths, keys, temperature, max_new_tokens=t,
                                     top_k=s.top_k, top_p=float(s.top_p), eos_ids=(1,), pad_id=0,
                                     token_temperature=static["token_temperature"] or (), chunk_ends=(t,))

    return [("prefill", prefill), ("decode", decode)]


# --------------------------------------------------------------------------------------------------
# what a compiled program needs
# --------------------------------------------------------------------------------------------------

_COLLECTIVE = re.compile(r"=\s*(\(?[^=]*?\)?)\s+(all-gather|all-reduce|reduce-scatter|all-to-all|collective-permute)"
                         r"(?:-start)?\(")
_ARRAY = re.compile(r"\b(pred|s8|u8|s16|u16|s32|u32|s64|u64|bf16|f16|f32|f64)\[([0-9,]*)\]")
_BYTES = {"pred": 1, "s8": 1, "u8": 1, "s16": 2, "u16": 2, "bf16": 2, "f16": 2, "s32": 4, "u32": 4, "f32": 4,
          "s64": 8, "u64": 8, "f64": 8}


def collectives(hlo_text: str) -> dict[str, dict]:
    """{op: {"count", "bytes"}} of the collectives in a compiled (per-device) HLO module: how many appear in
    the text and the bytes of their results (an op inside a loop body is counted once, as it is written)."""
    out: dict[str, dict] = {}
    for line in hlo_text.splitlines():
        m = _COLLECTIVE.search(line)
        if not m or "-done(" in line:
            continue
        size = sum(_BYTES[t] * math.prod(int(d) for d in dims.split(",") if d)
                   for t, dims in _ARRAY.findall(m.group(1)))
        entry = out.setdefault(m.group(2), {"count": 0, "bytes": 0})
        entry["count"] += 1
        entry["bytes"] += size
    return out


def program_figures(compiled, *, seconds: float) -> dict:
    """Per-chip figures of one compiled program: memory (bytes), XLA's cost analysis, collectives, compile s."""
    mem = compiled.memory_analysis()
    cost = compiled.cost_analysis() or {}
    cost = cost[0] if isinstance(cost, list) else cost
    figures = {
        "argument_bytes": mem.argument_size_in_bytes, "output_bytes": mem.output_size_in_bytes,
        "temp_bytes": mem.temp_size_in_bytes, "code_bytes": mem.generated_code_size_in_bytes,
        "alias_bytes": mem.alias_size_in_bytes,
        "xla_flops": float(cost.get("flops", 0.0)), "xla_bytes_accessed": float(cost.get("bytes accessed", 0.0)),
        "collectives": collectives(compiled.as_text()), "compile_seconds": seconds,
    }
    figures["total_bytes"] = (figures["argument_bytes"] + figures["output_bytes"] + figures["temp_bytes"]
                              + figures["code_bytes"] - figures["alias_bytes"])
    return figures


_REFUSAL = re.compile(r"RESOURCE_EXHAUSTED: (?P<what>[^\n]*?\((?P<need>[0-9.]+)(?P<unit>[KMGT])\)[^\n]*)")


def refused_figures(message: str, *, seconds: float) -> dict:
    """A program XLA would not compile because it needs more HBM than the chip has (RESOURCE_EXHAUSTED):
    the bytes it names (e.g. "HLO temporaries (85.09G)") as the program's total, and its words. Any other
    compile error is a bug and propagates."""
    m = _REFUSAL.search(message)
    if m is None:
        raise RuntimeError(f"the TPU compiler failed: {message[:2000]}")
    need = float(m.group("need")) * 1024 ** "KMGT".index(m.group("unit")) * 1024
    return {"refused": m.group("what").strip(), "total_bytes": int(need), "argument_bytes": 0, "output_bytes": 0,
            "temp_bytes": int(need), "code_bytes": 0, "alias_bytes": 0, "xla_flops": 0.0, "xla_bytes_accessed": 0.0,
            "collectives": {}, "compile_seconds": seconds}


# --------------------------------------------------------------------------------------------------
# the roofline estimate
# --------------------------------------------------------------------------------------------------

def estimate(cfg: TrainConfig, model_cfg: ModelConfig, chip: Chip, n_chips: int, prompt_len: int) -> dict:
    """A roofline estimate of one GRPO step on `n_chips` chips (an ESTIMATE from the chip's published peaks,
    perfect overlap within each phase, no overlap between phases): per phase the largest of compute time
    (FLOPs / peak), HBM time (minimum bytes / bandwidth) and interconnect time (FSDP's weight gathers and
    gradient reductions / ICI bandwidth). Decode runs every row to T tokens."""
    b, g, t = cfg.prompts_per_step, cfg.sampling.group_size, cfg.sampling.max_new_tokens
    n, seq = b * g, prompt_len + t
    itemsize = jnp.dtype(model_cfg.dtype).itemsize
    weights = perf.matmul_params(model_cfg) * itemsize
    m = cfg.mesh
    fsdp, tensor = m.fsdp, m.tensor
    data = n_chips // (fsdp * tensor)
    r_fsdp, r_tensor = (m.rollout_fsdp, m.rollout_tensor) if m.rollout_data else (fsdp, tensor)

    def gather(ways: int, tp: int) -> float:  # bytes a chip receives to gather weights split `ways` ways (its tp shard)
        return weights / tp * (ways - 1) / ways

    passes = 1 + (cfg.loss.beta > 0) + (cfg.sampling.old_logp_source == "recompute")
    fwd = perf.forward_flops(model_cfg, n, seq)
    remat = {"none": 0, "dots": 0.5, "full": 1}[model_cfg.remat]
    updates = cfg.mu * cfg.minibatches
    train_flops = fwd * (passes + cfg.mu * (3 + remat))
    # per update each chip reads its shard of params, grads and both Adam moments (f32) and writes them back
    state_bytes = perf.matmul_params(model_cfg) * (jnp.dtype(model_cfg.param_dtype).itemsize + 4 * 3) / (fsdp * tensor)
    train_hbm = ((passes + cfg.mu * 3) * perf.forward_bytes(model_cfg, n, seq, itemsize) / n_chips
                 + 2 * updates * state_bytes)
    micro = cfg.mu * cfg.minibatches * cfg.microbatches
    train_ici = (passes * cfg.microbatches + micro * 3) * gather(fsdp, tensor)
    grad_shard = perf.matmul_params(model_cfg) * jnp.dtype(model_cfg.param_dtype).itemsize / (fsdp * tensor)
    train_ici += updates * 2 * grad_shard * (data - 1) / data  # the data axis's gradient all-reduce
    # tensor parallelism: two all-reduces of the residual stream per layer and forward (twice more backward)
    tokens_per_chip = n * seq / (data * fsdp)
    tp_bytes = 2 * model_cfg.n_layers * tokens_per_chip * model_cfg.d_model * itemsize * 2 * (tensor - 1) / tensor
    train_ici += (passes + cfg.mu * 3) * tp_bytes
    train = _bound(train_flops / n_chips / chip.peak_flops, train_hbm / chip.hbm_bw, train_ici / chip.ici_bw)

    prefill_flops = perf.forward_flops(model_cfg, b, prompt_len)
    prefill_hbm = perf.forward_bytes(model_cfg, b, prompt_len, itemsize) / n_chips
    prefill = _bound(prefill_flops / n_chips / chip.peak_flops, prefill_hbm / chip.hbm_bw,
                     gather(r_fsdp, r_tensor) / chip.ici_bw)
    mean_cache = prompt_len + t / 2
    decode_flops = t * perf.decode_step_flops(model_cfg, n, int(mean_cache))
    # per step each chip reads the weights it holds after the gather (its tensor shard) and its rows' KV cache
    kv_bytes = perf.decode_step_bytes(model_cfg, n, int(mean_cache), itemsize) - weights
    decode_hbm = t * (weights / r_tensor + kv_bytes / n_chips)
    decode_ici = t * gather(r_fsdp, r_tensor)
    decode = _bound(decode_flops / n_chips / chip.peak_flops, decode_hbm / chip.hbm_bw, decode_ici / chip.ici_bw)
    step = train["seconds"] + prefill["seconds"] + decode["seconds"]
    model_flops = train_flops + prefill_flops + decode_flops
    return {
        "label": "ESTIMATE (roofline from published peaks, not a measurement)",
        "phases": {"train": train, "prefill": prefill, "decode": decode},
        "step_seconds": step,
        "rollout_tokens_per_s_per_chip": n * t / (prefill["seconds"] + decode["seconds"]) / n_chips,
        "mfu": model_flops / (step * n_chips * chip.peak_flops),
        "inputs": {"chips": n_chips, "data": data, "fsdp": fsdp, "tensor": tensor, "rows": n, "prompt_len": prompt_len,
                   "new_tokens": t, "peak_flops": chip.peak_flops, "hbm_bw": chip.hbm_bw, "ici_bw": chip.ici_bw},
    }


def _bound(compute: float, hbm: float, ici: float) -> dict:
    times = {"compute": compute, "hbm": hbm, "ici": ici}
    bound = max(times, key=times.get)
    return {"seconds": times[bound], "bound": bound, **{f"{k}_seconds": v for k, v in times.items()}}


# --------------------------------------------------------------------------------------------------
# the report and the command
# --------------------------------------------------------------------------------------------------

def compile_run(cfg: TrainConfig, topology: str, *, prompt_len: int | None = None, only=None, log=print) -> dict:
    """Compile every program of `cfg` for `topology` and return the report (`format_report` prints it)."""
    chip_key, topo = topology_name(topology)
    chip = CHIPS[chip_key]
    devices = topology_devices(topo)
    model_cfg = model_config(cfg)
    prompt_len = prompt_len or default_prompt_len(cfg)
    programs = {}
    cache_on = jax.config.jax_enable_compilation_cache  # a TPU executable cannot be read back on a CPU host
    jax.config.update("jax_enable_compilation_cache", False)
    try:
        for name, figures in run_programs(cfg, model_cfg, devices, prompt_len, only=only):
            programs[name] = figures
            log(f"compiled {name}: {figures['total_bytes'] / GIB:.2f} GiB per chip in "
                f"{figures['compile_seconds']:.1f} s")
    finally:
        jax.config.update("jax_enable_compilation_cache", cache_on)
    resident = _resident_bytes(programs)
    with_state = {k: peak_bytes(k, f, resident) for k, f in programs.items()}
    worst = max(with_state, key=with_state.get)
    peak = with_state[worst]
    return {
        "notes": layout_notes(cfg, model_cfg),
        "versions": _versions(),
        "topology": topo, "chip": dataclasses.asdict(chip), "chips": len(devices),
        "mesh": {k: getattr(cfg.mesh, k) for k in ("data", "fsdp", "tensor", "rollout_data", "rollout_fsdp",
                                                   "rollout_tensor")},
        "model": {"params": model_cfg.num_params(), "layers": model_cfg.n_layers, "d_model": model_cfg.d_model,
                  "vocab": model_cfg.vocab_size, "dtype": model_cfg.dtype, "param_dtype": model_cfg.param_dtype,
                  "remat": model_cfg.remat, "scan_layers": model_cfg.scan_layers, "lora_rank": cfg.lora.rank},
        "work": {"prompts": cfg.prompts_per_step, "group_size": cfg.sampling.group_size, "prompt_len": prompt_len,
                 "new_tokens": cfg.sampling.max_new_tokens, "mu": cfg.mu, "minibatches": cfg.minibatches,
                 "microbatches": cfg.microbatches},
        "programs": programs,
        "resident_state_bytes": resident,
        "peak": {"program": worst, "bytes": peak, "capacity": chip.hbm_bytes, "fits": peak <= chip.hbm_bytes,
                 "headroom_bytes": chip.hbm_bytes - peak},
        "compile_seconds": sum(p["compile_seconds"] for p in programs.values()),
        "estimate": estimate(cfg, model_cfg, chip, len(devices), prompt_len),
    }


_READS_THE_STATE = ("logprobs", "lora_merge", "to_rollout_mesh")  # their arguments are the train state's buffers


def peak_bytes(name: str, figures: dict, resident: int) -> int:
    """Bytes per chip while a program runs: the train step's own total (its arguments are the state); any other
    program's total plus the train state, which stays alive beside it (arguments that are the state's own
    buffers not counted twice; the rollout's params are counted as a copy, an upper bound when they are the
    state's params)."""
    if name == "train_step":
        return figures["total_bytes"]
    own = figures["total_bytes"] - (figures["argument_bytes"] if name in _READS_THE_STATE else 0)
    return own + resident


def _versions() -> dict:
    """The compiler the figures come from: jax, jaxlib, libtpu."""
    from importlib import metadata
    out = {}
    for name in ("jax", "jaxlib", "libtpu"):
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = None
    return out


def layout_notes(cfg: TrainConfig, model_cfg: ModelConfig) -> list[str]:
    """What the rules will replicate that the mesh could split: tensor ways that do not divide the KV heads
    (the KV cache, k and v whole on every tensor shard) or the query heads."""
    notes = []
    for where, ways in (("mesh.tensor", cfg.mesh.tensor), ("mesh.rollout_tensor", cfg.mesh.rollout_tensor)):
        if where == "mesh.rollout_tensor" and not cfg.mesh.rollout_data:
            continue
        for heads, what in ((model_cfg.n_kv_heads, "KV heads (the KV cache)"), (model_cfg.n_heads, "query heads")):
            if ways > 1 and heads % ways:
                notes.append(f"{where}={ways} does not divide the model's {heads} {what}: replicated on every "
                             f"tensor shard; use a divisor of {heads}")
    return notes


def _resident_bytes(programs: dict) -> int:
    """The train state's bytes per chip, alive while the rollout programs run: the train step's donated
    arguments (the aliased bytes), or its arguments when nothing was compiled as donated."""
    train = programs.get("train_step")
    if train is None:
        return 0
    return train["alias_bytes"] or train["argument_bytes"]


def default_prompt_len(cfg: TrainConfig) -> int:
    """The prompt bucket a run's sampler compiles for: a generated task's longest prompt over 256 of its
    training rows, bucketed as `sampler.bucket_length` does; 256 for a task read from files."""
    from grpo_jax import tasks as tasks_lib
    if cfg.task.train_path:
        return 256
    try:
        task = tasks_lib.get_task(cfg.task.name, **dict(cfg.task.options))
        rows = task.generate("train", 256, cfg.seed)
        tokens, _ = task.tokenizer().encode_batch([r["prompt"] for r in rows])
        return sampler.bucket_length(tokens.shape[1])
    except Exception:  # noqa: BLE001 - a task that needs files or options that are not here
        return 256


def format_report(report: dict) -> str:
    """The report as text: a line per program, the fit verdict, the estimate (labelled as one)."""
    chip, gib = report["chip"], lambda b: f"{b / GIB:.2f}"  # noqa: E731
    lines = [f"{report['topology']} ({report['chips']} chips of {chip['name']}, {gib(chip['hbm_bytes'])} GiB HBM "
             f"each), mesh {report['mesh']}, model {report['model']['params'] / 1e9:.2f}B params, "
             f"work {report['work']}",
             "| program | args GiB | out GiB | temp GiB | code GiB | total GiB/chip | XLA GFLOP | collectives "
             "(count, MiB) | compile s |", "|---|---|---|---|---|---|---|---|---|"]
    for name, f in report["programs"].items():
        coll = ", ".join(f"{k} {v['count']} {v['bytes'] / 2**20:.1f}" for k, v in sorted(f["collectives"].items()))
        lines.append(f"| {name} | {gib(f['argument_bytes'])} | {gib(f['output_bytes'])} | {gib(f['temp_bytes'])} | "
                     f"{gib(f['code_bytes'])} | {gib(f['total_bytes'])} | {f['xla_flops'] / 1e9:.1f} | {coll or '-'} | "
                     f"{f['compile_seconds']:.1f} |")
    peak = report["peak"]
    verdict = "fits" if peak["fits"] else "DOES NOT FIT"
    lines.append(f"peak per chip: {gib(peak['bytes'])} GiB ({peak['program']}, with the "
                 f"{gib(report['resident_state_bytes'])} GiB train state resident) of {gib(peak['capacity'])} GiB: {verdict}, headroom "
                 f"{gib(peak['headroom_bytes'])} GiB")
    est = report["estimate"]
    phases = ", ".join(f"{k} {v['seconds']:.3g} s ({v['bound']}-bound)" for k, v in est["phases"].items())
    lines.append(f"{est['label']}: step {est['step_seconds']:.3g} s [{phases}], rollout "
                 f"{est['rollout_tokens_per_s_per_chip']:.0f} tokens/s per chip, MFU {100 * est['mfu']:.1f}%")
    lines.append(f"compile time {report['compile_seconds']:.1f} s in all")
    lines += [f"note: {n}" for n in report.get("notes", [])]
    return "\n".join(lines)


def does_not_fit(report: dict) -> str | None:
    """One line naming the program, its bytes and the chip's capacity when the run does not fit; else None."""
    peak = report["peak"]
    if peak["fits"]:
        return None
    return (f"does not fit: {peak['program']} needs {peak['bytes'] / GIB:.2f} GiB per chip (train state resident "
            f"included) on {report['topology']}, whose {report['chip']['name']} has {peak['capacity'] / GIB:.2f} GiB")


def compile_only(args, cfg: TrainConfig) -> dict:
    """What `--compile-only` does for any launcher: compile, print the report, write it as JSON to
    --report (when given), exit NOT_FIT_EXIT_CODE when the run does not fit."""
    if not args.topology:
        raise UserError("--compile-only needs --topology (e.g. v5e:2x4 or v5e-64)")
    gpu, _, count = args.topology.partition("-")
    if gpu in GPUS:  # nothing to compile for: the roofline estimate alone, for a measured GPU figure to sit beside
        model_cfg, prompt_len = model_config(cfg), args.prompt_len or default_prompt_len(cfg)
        est = estimate(cfg, model_cfg, GPUS[gpu], int(count or 1), prompt_len)
        print(json.dumps(est, indent=1))
        return {"estimate": est}
    only = tuple(args.programs.split(",")) if args.programs else None
    report = compile_run(cfg, args.topology, prompt_len=args.prompt_len, only=only,
                         log=(lambda *_: None) if args.quiet else print)
    print(format_report(report))
    if args.report:
        os.makedirs(os.path.dirname(os.path.abspath(args.report)), exist_ok=True)
        with open(args.report, "w", encoding="utf-8") as f:
            json.dump(report, f, indent=1)
    if (why := does_not_fit(report)) is not None:
        print(why, file=sys.stderr)
        raise SystemExit(NOT_FIT_EXIT_CODE)
    return report


@for_people
def main(argv=None) -> dict:
    """python -m grpo_jax.aot --topology T [--config run.json] [--set KEY=VALUE ...]: compile a run for T."""
    argv = sys.argv[1:] if argv is None else list(argv)
    args, cfg = parse_args(["--compile-only", *argv], description=__doc__)
    return compile_only(args, cfg)


if __name__ == "__main__":
    main()
