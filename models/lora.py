"""LoRA adapters on the fused projections (Hu et al. 2021, with PEFT's `LoraConfig` semantics).

A target projection y = x W gains y += scale * (dropout(x) A) B, scale = alpha / r, with A [in, r] drawn as
PEFT's default (kaiming-uniform with a = sqrt(5), i.e. U(-1/sqrt(in), 1/sqrt(in)), nn.Linear's init) and
B [r, out] = 0, so a fresh adapter leaves the model exactly as it was. Dropout (PEFT lora_dropout) acts on
the adapter's input only, and only when a key is given (the training forward).

Targets and where their columns live in the fused per-layer params (`models.layers`):
    q, k, v   -> qkv columns [0, q_dim), [q_dim, q_dim + kv_dim), [q_dim + kv_dim, q_dim + 2 kv_dim)
    o         -> o [N*H, D]
    gate, up  -> gate_up columns [0, F), [F, 2F)
    down      -> down [F, D]

Adapters are a plain pytree, kept in float32 whatever the base's dtype (as PEFT's autocast_adapter_dtype):
    {"layers": [{target: {"a": [in, r], "b": [r, out]}, ...}, ...]}
`attach(base, adapters)` hangs them on the base for the forward (`models.layers` adds the low-rank term;
no copy of the base); `merge(cfg, base, adapters, scale)` returns plain params W + scale * A B, which
decode at no extra cost and are what a transformers export writes.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from models.config import LORA_TARGETS, ModelConfig
from models.hf import decoder_prefix
from models.keys import as_typed_key

TARGETS = LORA_TARGETS  # the projections an adapter can sit on (the list lives in models.config)
ADAPTER_DTYPE = jnp.float32


@dataclasses.dataclass(frozen=True)
class Attached:
    """A layer's adapters as the forward sees them (`attach`): the weights are pytree leaves, scale and
    dropout are static (so `jax.checkpoint` and jit treat them as constants)."""

    weights: dict  # {target: {"a": [in, r], "b": [r, out]}}
    scale: float  # alpha / r
    dropout: float  # rate on the adapter's input, applied only when the forward gets a dropout key


jax.tree_util.register_dataclass(Attached, data_fields=["weights"], meta_fields=["scale", "dropout"])


def target_shapes(cfg: ModelConfig) -> dict[str, tuple[int, int]]:
    """(in, out) of each target projection."""
    d, f = cfg.d_model, cfg.mlp_dim
    return {"q": (d, cfg.q_dim), "k": (d, cfg.kv_dim), "v": (d, cfg.kv_dim), "o": (cfg.q_dim, d),
            "gate": (d, f), "up": (d, f), "down": (f, d)}


def target_slot(cfg: ModelConfig, target: str) -> tuple[str, int]:
    """(fused parameter name, first column) where a target's output columns live."""
    q, kv, f = cfg.q_dim, cfg.kv_dim, cfg.mlp_dim
    return {"q": ("qkv", 0), "k": ("qkv", q), "v": ("qkv", q + kv), "o": ("o", 0),
            "gate": ("gate_up", 0), "up": ("gate_up", f), "down": ("down", 0)}[target]


def check_targets(targets) -> tuple[str, ...]:
    unknown = [t for t in targets if t not in TARGETS]
    if unknown or not targets or len(set(targets)) != len(targets):
        raise ValueError(f"LoRA targets must be distinct names among {TARGETS}, got {tuple(targets)!r}")
    return tuple(targets)


def init_adapters(cfg: ModelConfig, rank: int, targets, key: jax.Array) -> dict:
    """Fresh adapters: A ~ U(-1/sqrt(in), 1/sqrt(in)) (PEFT's default), B = 0, per layer and target; the
    A of (layer i, target j) comes from fold_in(fold_in(key, i), j)."""
    if not (isinstance(rank, int) and rank > 0):
        raise ValueError(f"LoRA rank must be an int > 0, got {rank!r}")
    targets, key, shapes = check_targets(targets), as_typed_key(key), target_shapes(cfg)

    def adapter(k, target):
        fan_in, fan_out = shapes[target]
        bound = fan_in ** -0.5
        return {"a": jax.random.uniform(k, (fan_in, rank), ADAPTER_DTYPE, -bound, bound),
                "b": jnp.zeros((rank, fan_out), ADAPTER_DTYPE)}

    return {"layers": [{t: adapter(jax.random.fold_in(jax.random.fold_in(key, i), TARGETS.index(t)), t)
                        for t in targets} for i in range(cfg.n_layers)]}


def attach(base: dict, adapters: dict, *, scale: float, dropout: float = 0.0) -> dict:
    """The base params with each layer's adapters under "lora" (an `Attached`): what `models.forward`
    runs as base + adapters. A restructuring only: the base arrays are shared, not copied."""
    if len(adapters["layers"]) != len(base["layers"]):
        raise ValueError(f"attach: {len(adapters['layers'])} adapter layers for {len(base['layers'])} base layers")
    pairs = zip(base["layers"], adapters["layers"])
    return {**base, "layers": [{**p, "lora": Attached(ad, float(scale), float(dropout))} for p, ad in pairs]}


def delta(lora: Attached, target: str, x: jnp.ndarray, dtype, key: jax.Array | None) -> jnp.ndarray | None:
    """scale * (dropout(x) A) B for one target of a layer ([..., out]), or None when it has no adapter.
    Dropout only with a key and a rate > 0, its key fold_in(key, target index)."""
    w = lora.weights.get(target)
    if w is None:
        return None
    if key is not None and lora.dropout > 0:
        keep = jax.random.bernoulli(jax.random.fold_in(key, TARGETS.index(target)), 1.0 - lora.dropout, x.shape)
        x = jnp.where(keep, x / (1.0 - lora.dropout), 0.0).astype(x.dtype)
    xa = jnp.einsum("...d,dr->...r", x.astype(dtype), w["a"].astype(dtype))
    return lora.scale * jnp.einsum("...r,rf->...f", xa, w["b"].astype(dtype))


def merge(cfg: ModelConfig, base: dict, adapters: dict, scale: float) -> dict:
    """Plain params (the base's structure and dtypes) with W + scale * A B added into each target's
    columns, computed in float32. The base is not modified."""
    layers = []
    for p, ad in zip(base["layers"], adapters["layers"]):
        p = dict(p)
        for target, w in ad.items():
            name, start = target_slot(cfg, target)
            update = scale * (w["a"].astype(jnp.float32) @ w["b"].astype(jnp.float32))
            cols = p[name][:, start : start + update.shape[1]].astype(jnp.float32) + update
            p[name] = jax.lax.dynamic_update_slice_in_dim(p[name], cols.astype(p[name].dtype), start, axis=1)
        layers.append(p)
    return {**base, "layers": layers}


def num_params(adapters: dict) -> int:
    return sum(x.size for x in jax.tree.leaves(adapters))


# --------------------------------------------------------------------------------------------------
# PEFT's on-disk adapter (adapter_config.json + adapter_model.safetensors)
# --------------------------------------------------------------------------------------------------

# The transformers module each target is (its name under a decoder layer); PEFT's target_modules are the last part.
HF_MODULES = {"q": "self_attn.q_proj", "k": "self_attn.k_proj", "v": "self_attn.v_proj", "o": "self_attn.o_proj",
              "gate": "mlp.gate_proj", "up": "mlp.up_proj", "down": "mlp.down_proj"}


def peft_tensors(cfg: ModelConfig, adapters: dict) -> dict:
    """The adapters as PEFT stores them, float32 numpy in torch's [out, in] layout:
    `base_model.model.<the layer's transformers name>.<module>.lora_A.weight` = A^T [r, in] and `lora_B.weight`
    = B^T [out, r] (PEFT's y += scale * B(A(x)) is our x A B). The layer names are those `models.hf` writes
    (model.layers.i, or model.language_model.layers.i for Qwen2-VL's text decoder)."""
    if len(adapters["layers"]) != cfg.n_layers:
        raise ValueError(f"peft_tensors: {len(adapters['layers'])} adapter layers for a model of {cfg.n_layers}")
    prefix = "base_model.model." + decoder_prefix(cfg)
    out = {}
    for i, layer in enumerate(adapters["layers"]):
        for target, w in layer.items():
            name = f"{prefix}layers.{i}.{HF_MODULES[target]}"
            out[f"{name}.lora_A.weight"] = np.ascontiguousarray(np.asarray(w["a"], np.float32).T)
            out[f"{name}.lora_B.weight"] = np.ascontiguousarray(np.asarray(w["b"], np.float32).T)
    return out


def peft_config(*, rank: int, alpha: float, dropout: float, targets, base_model: str) -> dict:
    """adapter_config.json for PEFT's `PeftModel.from_pretrained`: plain LoRA (scale alpha / r, no rsLoRA,
    no bias, no extra trained modules) on the targets' transformers modules of a causal LM."""
    return {"peft_type": "LORA", "task_type": "CAUSAL_LM", "base_model_name_or_path": base_model,
            "r": int(rank), "lora_alpha": float(alpha), "lora_dropout": float(dropout),
            "target_modules": sorted(HF_MODULES[t].split(".")[-1] for t in check_targets(targets)),
            "bias": "none", "use_rslora": False, "use_dora": False, "fan_in_fan_out": False,
            "modules_to_save": None, "inference_mode": True, "init_lora_weights": True}
