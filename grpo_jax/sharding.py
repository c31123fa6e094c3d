"""Device mesh, the one logical-axis -> mesh-axis rules table, and partition specs derived from it.

Mesh axes: `data` (batch only), `fsdp` (batch and parameter shards), `tensor` (heads / MLP / vocab).
Every parameter dimension has a logical name; RULES maps it to mesh axes. A dimension that the mesh axes
do not divide evenly is replicated instead (tiny test models on 8 devices), so any model runs on any mesh.
"""

from __future__ import annotations

import functools
import math

import jax
import numpy as np
from jax.experimental import multihost_utils
from jax.sharding import AxisType, Mesh, NamedSharding, PartitionSpec as P

import models
from grpo_jax.config import MeshConfig
from models.config import ModelConfig

MESH_AXES = ("data", "fsdp", "tensor")

# logical axis -> mesh axes (a tuple shards one dimension over several mesh axes)
RULES: dict[str, tuple[str, ...] | None] = {
    "batch": ("data", "fsdp"),
    "embed": ("fsdp",),
    "heads": ("tensor",),  # fused q|k|v(|gate) columns and o rows
    "mlp": ("tensor",),
    "vocab": ("tensor",),
    "norm": None,
    "lora_rank": None,  # a LoRA adapter's rank r: small, never split
}

# parameter name -> logical axes of its dimensions (models.layers documents the layout)
PARAM_AXES: dict[str, tuple[str, ...]] = {
    "embed": ("vocab", "embed"),
    "lm_head": ("embed", "vocab"),
    "final_norm": ("norm",),
    "attn_norm": ("norm",),
    "mlp_norm": ("norm",),
    "q_norm": ("norm",),  # [H], shared by the heads (Qwen3)
    "k_norm": ("norm",),
    "qkv": ("embed", "heads"),
    "qkv_bias": ("heads",),
    "o": ("heads", "embed"),
    "gate_up": ("embed", "mlp"),
    "down": ("mlp", "embed"),
}
# LoRA adapters (models.lora: {target: {"a": [in, r], "b": [r, out]}}), keyed "target.a" / "target.b": A is
# split like its base tensor's input dimension and B like its output columns, so x A and (x A) B shard as
# x W does
_LORA_IO = {"q": ("embed", "heads"), "k": ("embed", "heads"), "v": ("embed", "heads"), "o": ("heads", "embed"),
            "gate": ("embed", "mlp"), "up": ("embed", "mlp"), "down": ("mlp", "embed")}
PARAM_AXES.update({f"{t}.a": (io[0], "lora_rank") for t, io in _LORA_IO.items()})
PARAM_AXES.update({f"{t}.b": ("lora_rank", io[1]) for t, io in _LORA_IO.items()})


def initialize_distributed(cfg: MeshConfig) -> None:
    """jax.distributed.initialize for multi-process runs (CPU: gloo collectives). No-op for one process."""
    if cfg.num_processes <= 1 and not cfg.coordinator:
        return
    jax.config.update("jax_cpu_collectives_implementation", "gloo")  # CPU-only setting; harmless elsewhere
    kwargs = {"coordinator_address": cfg.coordinator or None, "num_processes": cfg.num_processes}
    if cfg.process_id >= 0:
        kwargs["process_id"] = cfg.process_id
    jax.distributed.initialize(**kwargs)
    _orbax_barriers_off_the_devices()


def _orbax_barriers_off_the_devices() -> None:
    """Orbax's default barrier between processes is a psum over every device (`sync_global_devices`). Some
    of its barriers run on its own threads, so on one process a barrier can be launched between two of the
    training step's collectives and on another process around them: the device programs then pair up wrongly
    and both processes wait forever (seen here: two processes with dynamic sampling and a checkpoint every
    step hung in step 2). Orbax's switch to the distributed client's barrier, which does not touch the
    devices, removes the hang."""
    # only multi-process runs need orbax's flag: a single process never imports absl or orbax for it
    from absl import flags

    import orbax.checkpoint  # noqa: F401  (defines the flag)

    if not flags.FLAGS.is_parsed():  # an absl app parses its own flags first; a plain script never does
        flags.FLAGS.mark_as_parsed()
    flags.FLAGS.experimental_orbax_use_distributed_barrier = True


def make_mesh(cfg: MeshConfig, devices=None) -> Mesh:
    """The training mesh: (data, fsdp, tensor) with automatic (pjit-style) sharding propagation, over all
    devices, or over the first data*fsdp*tensor of them when a rollout mesh is configured."""
    return _grid(cfg.data, cfg.fsdp, cfg.tensor, devices, subset=cfg.rollout_data != 0, prefix="")


def make_rollout_mesh(cfg: MeshConfig, devices=None) -> Mesh | None:
    """The rollout mesh (mesh.rollout_*) over the first rollout_data*fsdp*tensor devices, or None (roll out
    on the training mesh)."""
    if cfg.rollout_data == 0:
        return None
    return _grid(cfg.rollout_data, cfg.rollout_fsdp, cfg.rollout_tensor, devices, subset=True, prefix="rollout_")


def _grid(data: int, fsdp: int, tensor: int, devices, *, subset: bool, prefix: str) -> Mesh:
    devices = jax.devices() if devices is None else devices
    n = len(devices)
    data = data if data > 0 else n // (fsdp * tensor)
    used = data * fsdp * tensor
    if used > n or used < 1 or (used != n and not subset):
        raise ValueError(f"MeshConfig: {prefix}data*{prefix}fsdp*{prefix}tensor = {data}*{fsdp}*{tensor} does not "
                         f"match {n} devices" + ("" if subset else " (only with a rollout mesh may a mesh use fewer)"))
    grid = np.asarray(devices[:used]).reshape(data, fsdp, tensor)
    return Mesh(grid, MESH_AXES, axis_types=(AxisType.Auto,) * 3)


# a model of your own (ModelConfig.module) names its parameters' logical axes in its class's `param_axes`,
# {"name" or "parent.name": one RULES name per dimension}; `build.build_model` declares them here
_MODULE_AXES: dict[str, tuple[str, ...]] = {}


def declare_param_axes(axes, where: str) -> None:
    """Add a module's `param_axes` to the lookup `param_specs` uses; a name that the built-in decoder already
    uses with other axes, or a logical axis RULES does not know, is a ValueError naming `where`."""
    for name, logical in dict(axes).items():
        logical = tuple(logical)
        unknown = [a for a in logical if a not in RULES]
        if unknown:
            raise ValueError(f"{where}.param_axes[{name!r}]: unknown logical axes {unknown}; known: {sorted(RULES)}")
        if PARAM_AXES.get(name, logical) != logical:
            raise ValueError(f"{where}.param_axes[{name!r}] = {logical} differs from the built-in decoder's "
                             f"{PARAM_AXES[name]} for that name; name the parameter differently")
        _MODULE_AXES[name] = logical


def on_mesh(params, mesh: Mesh):
    """`params` on `mesh` by the rules: as they are when they already live there, else resharded (the
    rollout mesh takes the training params this way every step)."""
    leaf = jax.tree.leaves(params)[0]
    if isinstance(getattr(leaf, "sharding", None), NamedSharding) and leaf.sharding.mesh == mesh:
        return params
    return shard_params(params, mesh)


def logical_to_spec(axes: tuple[str, ...], shape: tuple[int, ...], mesh: Mesh) -> P:
    """PartitionSpec for one array: RULES applied per dimension, replicated where sizes do not divide."""
    out = []
    for name, size in zip(axes, shape):
        mesh_axes = tuple(a for a in (RULES.get(name) or ()) if mesh.shape[a] > 1)
        ways = math.prod(mesh.shape[a] for a in mesh_axes)
        if not mesh_axes or size % ways:
            out.append(None)
        else:
            out.append(mesh_axes[0] if len(mesh_axes) == 1 else mesh_axes)
    return P(*out)


def _leaf_name(path) -> str:
    return str(getattr(path[-1], "key", getattr(path[-1], "name", path[-1])))


def param_specs(params_shape, mesh: Mesh):
    """PartitionSpecs for a params pytree (arrays or ShapeDtypeStructs), from PARAM_AXES (and a module's
    declared `param_axes`) and RULES (a leaf is looked up as "parent.name" first, for the LoRA adapters' a / b
    and a linen Dense's kernel, then as its name)."""
    known = {**_MODULE_AXES, **PARAM_AXES}

    def spec(path, leaf):
        name = _leaf_name(path)
        if len(path) > 1 and f"{_leaf_name(path[:-1])}.{name}" in known:
            name = f"{_leaf_name(path[:-1])}.{name}"
        if name not in known:
            raise KeyError(f"no logical axes for parameter {jax.tree_util.keystr(path)}; add it to PARAM_AXES (the "
                           "built-in decoder) or to your module's param_axes")
        if len(known[name]) != len(leaf.shape):
            raise ValueError(f"parameter {jax.tree_util.keystr(path)} has shape {tuple(leaf.shape)} but its logical "
                             f"axes {known[name]} name {len(known[name])} dimensions")
        return logical_to_spec(known[name], leaf.shape, mesh)

    return jax.tree_util.tree_map_with_path(spec, params_shape)


def under_mesh(mesh: Mesh, fn):
    """fn traced with `mesh` as the current mesh, so the decoder's activation constraints
    (`models.layers.constrain_rows`) split its rows over the mesh's data axes; on one device nothing changes.
    Keeps fn's name: jax's compile logs and profiles name the program by it."""
    @functools.wraps(fn)
    def wrapped(*args, **kwargs):
        with jax.sharding.use_abstract_mesh(mesh.abstract_mesh):
            return fn(*args, **kwargs)

    return wrapped


def named(mesh: Mesh, specs):
    return jax.tree.map(lambda s: NamedSharding(mesh, s), specs, is_leaf=lambda x: isinstance(x, P))


def init_sharded_params(cfg: ModelConfig, key: jax.Array, mesh: Mesh):
    """Params born sharded: shapes from eval_shape, then init jitted with out_shardings (no host copy)."""
    shapes = jax.eval_shape(lambda k: models.init_params(cfg, k), key)
    shardings = named(mesh, param_specs(shapes, mesh))
    return jax.jit(lambda k: models.init_params(cfg, k), out_shardings=shardings)(key)


def shard_params(params, mesh: Mesh):
    """Place existing params (e.g. loaded from a HF checkpoint) on the mesh by the rules."""
    return jax.device_put(params, named(mesh, param_specs(params, mesh)))


def batch_sharding(mesh: Mesh, ndim: int) -> NamedSharding:
    """Leading (batch) dimension over data x fsdp, the rest replicated."""
    return NamedSharding(mesh, P(RULES["batch"], *([None] * (ndim - 1))))


def data_ways(mesh: Mesh) -> int:
    """How many ways the batch (leading) dimension is split: data x fsdp."""
    return mesh.shape["data"] * mesh.shape["fsdp"]


def padded_rows(mesh: Mesh, n: int) -> int:
    """n rows rounded up to a multiple of the data x fsdp ways (what `shard_rows` places)."""
    return n + (-n % data_ways(mesh))


def shard_rows(mesh: Mesh, *arrays: np.ndarray) -> tuple:
    """Host arrays with the same leading (row) size n, placed on the mesh with rows split over data x fsdp.
    When n does not divide by the ways, the last row is repeated to the next multiple (callers keep the
    first n rows of what they compute); returns the placed arrays."""
    n = arrays[0].shape[0]
    pad = padded_rows(mesh, n) - n
    out = []
    for a in arrays:
        a = np.asarray(a)
        if a.shape[0] != n:
            raise ValueError(f"shard_rows: arrays have {n} and {a.shape[0]} rows")
        if pad:
            a = np.concatenate([a, np.repeat(a[-1:], pad, axis=0)])
        out.append(jax.device_put(a, batch_sharding(mesh, a.ndim)))
    return tuple(out)


def process_rows(mesh: Mesh | None, n: int) -> list[np.ndarray]:
    """Which of n rows each process holds when they are split over the mesh's data x fsdp axes as
    `shard_rows` splits them (padding rows dropped): a list indexed by process, each a sorted int array.
    Every process computes the same answer (it comes from the mesh, not from data), so rows scored apart
    can be put back together without sending indices. One process (or no mesh): all rows."""
    if mesh is None or jax.process_count() == 1:
        return [np.arange(n)]
    padded = padded_rows(mesh, n)
    owner = np.full(padded, -1)
    for device, index in batch_sharding(mesh, 1).devices_indices_map((padded,)).items():
        rows = np.arange(padded)[index[0]]
        owner[rows] = np.where(owner[rows] < 0, device.process_index, owner[rows])
    return [np.flatnonzero(owner[:n] == p) for p in range(jax.process_count())]


def gather_rows(local: np.ndarray, rows_by_process: list[np.ndarray], n: int) -> np.ndarray:
    """[n, ...]: each process's `local` values (for its rows `rows_by_process[process_index]`, in order)
    put in place on every process; `local` rows are padded to the largest share for the all-gather."""
    if len(rows_by_process) == 1:
        return local
    width = max(len(r) for r in rows_by_process)
    padded = np.zeros((width, *local.shape[1:]), local.dtype)
    padded[: len(local)] = local
    gathered = np.asarray(multihost_utils.process_allgather(padded, tiled=False))  # [processes, width, ...]
    out = np.zeros((n, *local.shape[1:]), local.dtype)
    for p, rows in enumerate(rows_by_process):
        out[rows] = gathered[p, : len(rows)]
    return out


def replicated(mesh: Mesh) -> NamedSharding:
    return NamedSharding(mesh, P())


def to_host(x) -> np.ndarray:
    """Fully gather a (possibly multi-process) array to every host as NumPy."""
    if isinstance(x, jax.Array) and not x.is_fully_addressable:
        if x.is_fully_replicated:
            return np.asarray(x.addressable_data(0))
        return np.asarray(multihost_utils.process_allgather(x, tiled=True))
    return np.asarray(x)
