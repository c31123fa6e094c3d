"""Device mesh, the one logical-axis -> mesh-axis rules table, and partition specs derived from it.

Mesh axes: `data` (batch only), `fsdp` (batch and parameter shards), `tensor` (heads / MLP / vocab).
Every parameter dimension has a logical name; RULES maps it to mesh axes. A dimension that the mesh axes
do not divide evenly is replicated instead (tiny test models on 8 devices), so any model runs on any mesh.
"""

from __future__ import annotations

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
}

# parameter name -> logical axes of its dimensions (models.layers documents the layout)
PARAM_AXES: dict[str, tuple[str, ...]] = {
    "embed": ("vocab", "embed"),
    "lm_head": ("embed", "vocab"),
    "final_norm": ("norm",),
    "attn_norm": ("norm",),
    "mlp_norm": ("norm",),
    "qkv": ("embed", "heads"),
    "qkv_bias": ("heads",),
    "o": ("heads", "embed"),
    "gate_up": ("embed", "mlp"),
    "down": ("mlp", "embed"),
}


def initialize_distributed(cfg: MeshConfig) -> None:
    """jax.distributed.initialize for multi-process runs (CPU: gloo collectives). No-op for one process."""
    if cfg.num_processes <= 1 and not cfg.coordinator:
        return
    jax.config.update("jax_cpu_collectives_implementation", "gloo")  # CPU-only setting; harmless elsewhere
    kwargs = {"coordinator_address": cfg.coordinator or None, "num_processes": cfg.num_processes}
    if cfg.process_id >= 0:
        kwargs["process_id"] = cfg.process_id
    jax.distributed.initialize(**kwargs)


def make_mesh(cfg: MeshConfig, devices=None) -> Mesh:
    """A (data, fsdp, tensor) mesh with automatic (pjit-style) sharding propagation."""
    devices = jax.devices() if devices is None else devices
    n = len(devices)
    data = cfg.data if cfg.data > 0 else n // (cfg.fsdp * cfg.tensor)
    if data * cfg.fsdp * cfg.tensor != n:
        raise ValueError(
            f"MeshConfig: data*fsdp*tensor = {data}*{cfg.fsdp}*{cfg.tensor} does not match {n} devices"
        )
    grid = np.asarray(devices).reshape(data, cfg.fsdp, cfg.tensor)
    return Mesh(grid, MESH_AXES, axis_types=(AxisType.Auto,) * 3)


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
    """PartitionSpecs for a params pytree (arrays or ShapeDtypeStructs), from PARAM_AXES and RULES."""
    def spec(path, leaf):
        name = _leaf_name(path)
        if name not in PARAM_AXES:
            raise KeyError(f"no logical axes for parameter {jax.tree_util.keystr(path)}; add it to PARAM_AXES")
        return logical_to_spec(PARAM_AXES[name], leaf.shape, mesh)

    return jax.tree_util.tree_map_with_path(spec, params_shape)


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


def replicated(mesh: Mesh) -> NamedSharding:
    return NamedSharding(mesh, P())


def to_host(x) -> np.ndarray:
    """Fully gather a (possibly multi-process) array to every host as NumPy."""
    if isinstance(x, jax.Array) and not x.is_fully_addressable:
        if x.is_fully_replicated:
            return np.asarray(x.addressable_data(0))
        return np.asarray(multihost_utils.process_allgather(x, tiled=True))
    return np.asarray(x)
