"""Hugging Face interop: read a local checkpoint folder into (ModelConfig, params) and write one back.

Supported: LlamaForCausalLM (Llama-3 RoPE scaling included), Qwen2ForCausalLM, Qwen3ForCausalLM (dense; q/k
RMSNorm per head), and the text decoder of Qwen2VLForConditionalGeneration (M-RoPE; the vision tower's
tensors are ignored on load and not written on save). Weights come from
`model.safetensors` or a sharded `model.safetensors.index.json`. HF keeps q/k/v and gate/up as separate
[out, in] matrices; we fuse them into [in, q+k+v] and [in, 2F] once here, at load time.
Nothing is fetched from a hub: `path` must be a local folder.
"""

from __future__ import annotations

import json
import os
import shutil
from typing import Any

import jax.numpy as jnp
import numpy as np
from safetensors import safe_open
from safetensors.flax import save_file

from models.config import LLAMA3_ROPE_KEYS, ModelConfig

ARCHITECTURES = {
    "LlamaForCausalLM": "llama",
    "Qwen2ForCausalLM": "qwen2",
    "Qwen2VLForConditionalGeneration": "qwen2_vl",
    "Qwen3ForCausalLM": "qwen3",
}
_HF_NAME = {v: k for k, v in ARCHITECTURES.items()}
# config.json's max_position_embeddings for a model with no count of its own (ModelConfig.max_positions = 0, a
# randomly initialised preset): transformers needs one, so such a checkpoint loads back with this many positions
HF_DEFAULT_POSITIONS = 32768


class CheckpointError(ValueError):
    """A checkpoint folder that cannot be read as a supported model; the message names the file or tensor."""


# --------------------------------------------------------------------------------------------------
# config.json <-> ModelConfig
# --------------------------------------------------------------------------------------------------

def _read_json(path: str) -> Any:
    """A checkpoint's JSON file (config.json, the safetensors index); errors name the file."""
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except (OSError, ValueError) as e:  # ValueError: bad JSON or not UTF-8
        raise CheckpointError(f"{path}: cannot read as JSON ({e})") from None


def config_from_hf(hf: dict[str, Any], *, where: str = "config.json") -> ModelConfig:
    """Translate a transformers config dict (5.x `rope_parameters` or 4.x `rope_theta`/`rope_scaling`)."""
    if not isinstance(hf, dict):
        raise CheckpointError(f"{where}: expected a JSON object of model settings (a transformers config.json), "
                              f"got {type(hf).__name__}")
    archs = hf.get("architectures") or []
    arch = next((ARCHITECTURES[a] for a in archs if a in ARCHITECTURES), None)
    if arch is None:
        arch = hf.get("model_type") if hf.get("model_type") in _HF_NAME else None
    if arch is None:
        raise CheckpointError(
            f"{where}: unsupported architecture {archs or hf.get('model_type')!r}; supported: {sorted(ARCHITECTURES)}"
        )
    text = dict(hf.get("text_config") or hf) if arch == "qwen2_vl" else hf
    rope = dict(text.get("rope_parameters") or text.get("rope_scaling") or {})
    rope_type = rope.get("rope_type", rope.get("type", "default"))
    theta = rope.get("rope_theta", text.get("rope_theta", hf.get("rope_theta", 10_000.0)))
    if arch == "qwen2_vl":
        if rope_type not in ("default", "mrope"):
            raise CheckpointError(f"{where}: rope type {rope_type!r} is not supported for Qwen2-VL")
        rope_kw = dict(rope_kind="mrope", mrope_sections=tuple(rope.get("mrope_section", (16, 24, 24))))
    elif rope_type == "llama3":
        missing = [k for k in LLAMA3_ROPE_KEYS if k not in rope]
        if missing:
            raise CheckpointError(f"{where}: rope type 'llama3' without {missing}")
        scaling = tuple((k, int(rope[k]) if k == "original_max_position_embeddings" else float(rope[k]))
                        for k in LLAMA3_ROPE_KEYS)
        rope_kw = dict(rope_kind="rope", rope_scaling=scaling)
    else:
        if rope_type != "default":
            raise CheckpointError(f"{where}: rope_parameters.rope_type={rope_type!r} is not supported (default and "
                                  "llama3 are); the model would compute other positions than it was trained with")
        rope_kw = dict(rope_kind="rope")
    if arch in ("llama", "qwen3") and (text.get("attention_bias") or text.get("mlp_bias")):
        raise CheckpointError(f"{where}: {arch} with attention_bias/mlp_bias is not supported (o_proj/MLP biases)")
    if arch == "qwen3" and text.get("use_sliding_window"):
        raise CheckpointError(f"{where}: Qwen3 with use_sliding_window=true is not supported (full attention only)")
    if float(text.get("partial_rotary_factor", 1.0)) != 1.0:
        raise CheckpointError(f"{where}: partial_rotary_factor={text['partial_rotary_factor']} is not supported")
    try:
        heads, d_model = int(text["num_attention_heads"]), int(text["hidden_size"])
        return ModelConfig(
            vocab_size=int(text["vocab_size"]),
            d_model=d_model,
            n_layers=int(text["num_hidden_layers"]),
            n_heads=heads,
            n_kv_heads=int(text.get("num_key_value_heads") or heads),
            head_dim=int(text.get("head_dim") or d_model // heads),
            mlp_dim=int(text["intermediate_size"]),
            norm_eps=float(text.get("rms_norm_eps", 1e-6)),
            rope_theta=float(theta),
            qkv_bias=arch in ("qwen2", "qwen2_vl"),
            qk_norm=arch == "qwen3",
            tie_embeddings=bool(hf.get("tie_word_embeddings", text.get("tie_word_embeddings", False))),
            arch=arch,
            max_positions=int(text.get("max_position_embeddings") or hf.get("max_position_embeddings") or 0),
            **rope_kw,
        )
    except KeyError as e:
        raise CheckpointError(f"{where}: missing field {e.args[0]!r}") from None


def check_hf_writable(cfg: ModelConfig) -> None:
    """Raise CheckpointError naming the setting when cfg has no Llama/Qwen2/Qwen3/Qwen2-VL checkpoint format."""
    if cfg.module:
        raise CheckpointError(f"model.module={cfg.module!r} is a module of your own: it has no Hugging Face "
                              "mapping (the run's orbax checkpoints hold its parameters)")
    if cfg.attn_output_gate:
        raise CheckpointError("attention output gates have no Llama/Qwen2/Qwen2-VL checkpoint format")
    if cfg.arch in ("llama", "qwen3") and cfg.qkv_bias:
        raise CheckpointError(f"a {cfg.arch} checkpoint cannot carry q/k/v biases without an o_proj bias")
    if cfg.qk_norm != (cfg.arch == "qwen3"):
        raise CheckpointError(f"q/k norms (qk_norm={cfg.qk_norm}) go with arch='qwen3' only, got arch={cfg.arch!r}")
    if cfg.rope_scaling and cfg.arch != "llama":
        raise CheckpointError(f"Llama-3 RoPE scaling has no {cfg.arch} checkpoint format (transformers reads it "
                              "for Llama only)")
    if cfg.arch in ("qwen2", "qwen2_vl") and not cfg.qkv_bias:
        raise CheckpointError(f"{cfg.arch} checkpoints always have q/k/v biases: set qkv_bias=True")
    if (cfg.arch == "qwen2_vl") != (cfg.rope_kind == "mrope"):
        raise CheckpointError(f"arch={cfg.arch!r} does not go with rope_kind={cfg.rope_kind!r}")
    if cfg.rope_kind == "mrope" and cfg.mrope_interleaved:
        raise CheckpointError("interleaved M-RoPE (Qwen3-VL) cannot be written as a Qwen2-VL checkpoint")
    if cfg.rope_kind == "rope2d":  # no HF text decoder rotates by 2D positions; it would load as plain RoPE
        raise CheckpointError("rope_kind='rope2d' has no Llama/Qwen2/Qwen2-VL checkpoint format (it would load "
                              "back as plain RoPE and compute something else)")
    if cfg.arch == "qwen2_vl" and cfg.head_dim * cfg.n_heads != cfg.d_model:
        # transformers' Qwen2-VL attention takes head_dim = hidden_size // num_attention_heads, whatever
        # config.json says, so such a checkpoint fails to load there
        raise CheckpointError(f"a Qwen2-VL checkpoint needs head_dim * n_heads == d_model (transformers derives "
                              f"head_dim from them), got head_dim={cfg.head_dim}, n_heads={cfg.n_heads}, "
                              f"d_model={cfg.d_model}")


def config_to_hf(cfg: ModelConfig, base: dict[str, Any] | None = None) -> dict[str, Any]:
    """A transformers config dict for cfg; `base` (e.g. the original config.json) supplies other fields."""
    check_hf_writable(cfg)
    rope = {"rope_type": "default", "rope_theta": cfg.rope_theta}
    if cfg.rope_scaling:
        rope.update(rope_type="llama3", **dict(cfg.rope_scaling))
    if cfg.rope_kind == "mrope":
        rope["mrope_section"] = list(cfg.mrope_sections)
    text = {
        "vocab_size": cfg.vocab_size,
        "hidden_size": cfg.d_model,
        "intermediate_size": cfg.mlp_dim,
        "num_hidden_layers": cfg.n_layers,
        "num_attention_heads": cfg.n_heads,
        "num_key_value_heads": cfg.n_kv_heads,
        "head_dim": cfg.head_dim,
        "rms_norm_eps": cfg.norm_eps,
        "rope_parameters": rope,
        "rope_theta": cfg.rope_theta,  # read by transformers 4.x, which ignores rope_parameters
        "hidden_act": "silu",
        "max_position_embeddings": cfg.max_positions or HF_DEFAULT_POSITIONS,
        "tie_word_embeddings": cfg.tie_embeddings,
        "dtype": cfg.param_dtype,
    }
    if cfg.arch == "llama":
        text.update(attention_bias=False, mlp_bias=False)
    if cfg.arch == "qwen3":
        text.update(attention_bias=False, use_sliding_window=False)
    out = dict(base or {})
    out.update(architectures=[_HF_NAME[cfg.arch]], model_type=cfg.arch)
    if cfg.arch == "qwen2_vl":
        out["text_config"] = {**out.get("text_config", {}), **text, "model_type": "qwen2_vl_text"}
        out["tie_word_embeddings"] = cfg.tie_embeddings
        out.setdefault("vision_config", {"depth": 1, "embed_dim": 32, "hidden_size": cfg.d_model, "num_heads": 2})
    else:
        out.update(text)
    return out


# --------------------------------------------------------------------------------------------------
# tensors
# --------------------------------------------------------------------------------------------------

def _prefix(arch: str, names: set[str]) -> str:
    if arch == "qwen2_vl" and any(n.startswith("model.language_model.") for n in names):
        return "model.language_model."
    return "model."


def _weight_files(path: str) -> list[str]:
    index = os.path.join(path, "model.safetensors.index.json")
    if os.path.exists(index):
        raw = _read_json(index)
        weight_map = raw.get("weight_map") if isinstance(raw, dict) else None
        if not isinstance(weight_map, dict) or not all(isinstance(v, str) for v in weight_map.values()):
            got = type(raw).__name__ if not isinstance(raw, dict) else f"weight_map = {raw.get('weight_map')!r:.80}"
            raise CheckpointError(f"{index}: not a safetensors index: expected a JSON object with a 'weight_map' "
                                  f"object {{tensor name: shard file}}, got {got}")
        return sorted({os.path.join(path, v) for v in weight_map.values()})
    single = os.path.join(path, "model.safetensors")
    if os.path.exists(single):
        return [single]
    raise CheckpointError(f"{path}: no model.safetensors or model.safetensors.index.json")


def _read_tensors(path: str) -> dict[str, np.ndarray]:
    tensors = {}
    for file in _weight_files(path):
        if not os.path.exists(file):
            raise CheckpointError(f"{file}: listed in the index but missing")
        name = None
        try:
            with safe_open(file, framework="flax") as f:
                for name in f.keys():
                    tensors[name] = f.get_tensor(name)
        except Exception as e:  # safetensors raises its own SafetensorError (truncated, garbage header, ...)
            what = f"tensor {name!r}" if name else "its header"
            raise CheckpointError(f"{file}: not a readable safetensors file (failed at {what}: "
                                  f"{type(e).__name__}: {e}); the shard is truncated or corrupt: re-copy or "
                                  "re-export it") from None
    return tensors


def decoder_prefix(cfg: ModelConfig) -> str:
    """The transformers name of the text decoder's module, before `layers.i.` / `embed_tokens`: Qwen2-VL's
    decoder sits under model.language_model."""
    return "model.language_model." if cfg.arch == "qwen2_vl" else "model."


def hf_tensor_shapes(cfg: ModelConfig) -> dict[str, tuple[int, ...]]:
    """Expected HF tensor names and shapes (text decoder only), in torch's [out, in] layout."""
    pre = decoder_prefix(cfg)
    shapes = {f"{pre}embed_tokens.weight": (cfg.vocab_size, cfg.d_model), f"{pre}norm.weight": (cfg.d_model,)}
    if not cfg.tie_embeddings:
        shapes["lm_head.weight"] = (cfg.vocab_size, cfg.d_model)
    for i in range(cfg.n_layers):
        lp = f"{pre}layers.{i}."
        shapes.update({
            lp + "input_layernorm.weight": (cfg.d_model,),
            lp + "post_attention_layernorm.weight": (cfg.d_model,),
            lp + "self_attn.q_proj.weight": (cfg.q_dim, cfg.d_model),
            lp + "self_attn.k_proj.weight": (cfg.kv_dim, cfg.d_model),
            lp + "self_attn.v_proj.weight": (cfg.kv_dim, cfg.d_model),
            lp + "self_attn.o_proj.weight": (cfg.d_model, cfg.q_dim),
            lp + "mlp.gate_proj.weight": (cfg.mlp_dim, cfg.d_model),
            lp + "mlp.up_proj.weight": (cfg.mlp_dim, cfg.d_model),
            lp + "mlp.down_proj.weight": (cfg.d_model, cfg.mlp_dim),
        })
        if cfg.qkv_bias:
            for proj, width in (("q", cfg.q_dim), ("k", cfg.kv_dim), ("v", cfg.kv_dim)):
                shapes[lp + f"self_attn.{proj}_proj.bias"] = (width,)
        if cfg.qk_norm:
            shapes.update({lp + f"self_attn.{p}_norm.weight": (cfg.head_dim,) for p in "qk"})
    return shapes


def read_config(path: str) -> ModelConfig:
    """The ModelConfig of a local checkpoint folder's config.json, without reading its tensors (e.g. to check
    a run's settings against the model's positions before loading gigabytes of weights)."""
    config_path = os.path.join(path, "config.json")
    return config_from_hf(_read_json(config_path), where=config_path)


def load_hf(path: str, *, param_dtype: str | None = None, dtype: str | None = None) -> tuple[ModelConfig, dict]:
    """(cfg, params) from a local HF checkpoint folder; errors name the file or tensor that is wrong."""
    if not os.path.isdir(path):
        raise CheckpointError(f"{path}: not a directory (only local checkpoint folders are read)")
    cfg = read_config(path)
    tensors = _read_tensors(path)
    stored_dtype = str(next(iter(tensors.values())).dtype) if tensors else "float32"
    cfg = cfg.replace(
        param_dtype=param_dtype or (stored_dtype if stored_dtype in ("float32", "bfloat16", "float16") else "float32"),
        dtype=dtype or "float32",
    )
    pre = _prefix(cfg.arch, set(tensors))
    expected = {n.replace("model.language_model.", pre, 1): s for n, s in hf_tensor_shapes(cfg).items()}
    if cfg.tie_embeddings:
        tensors.pop("lm_head.weight", None)  # some exporters write the tied head anyway
    for name, shape in expected.items():
        if name not in tensors:
            raise CheckpointError(f"{path}: tensor {name!r} missing (expected shape {shape})")
        if tuple(tensors[name].shape) != shape:
            raise CheckpointError(
                f"{path}: tensor {name!r} has shape {tuple(tensors[name].shape)}, expected {shape}"
            )
    return cfg, _params_from_hf(cfg, tensors, pre)


def _params_from_hf(cfg: ModelConfig, t: dict, pre: str) -> dict:
    dt = cfg.jnp_param_dtype

    def w(name):  # torch [out, in] -> ours [in, out]
        return jnp.asarray(t[name], dt).T

    layers = []
    for i in range(cfg.n_layers):
        lp = f"{pre}layers.{i}."
        a = lp + "self_attn."
        layer = {
            "attn_norm": jnp.asarray(t[lp + "input_layernorm.weight"], dt),
            "qkv": jnp.concatenate([w(a + "q_proj.weight"), w(a + "k_proj.weight"), w(a + "v_proj.weight")], 1),
            "o": w(a + "o_proj.weight"),
            "mlp_norm": jnp.asarray(t[lp + "post_attention_layernorm.weight"], dt),
            "gate_up": jnp.concatenate([w(lp + "mlp.gate_proj.weight"), w(lp + "mlp.up_proj.weight")], 1),
            "down": w(lp + "mlp.down_proj.weight"),
        }
        if cfg.qkv_bias:
            layer["qkv_bias"] = jnp.concatenate([jnp.asarray(t[a + f"{p}_proj.bias"], dt) for p in "qkv"])
        if cfg.qk_norm:
            layer["q_norm"], layer["k_norm"] = (jnp.asarray(t[a + f"{p}_norm.weight"], dt) for p in "qk")
        layers.append(layer)
    params = {
        "embed": jnp.asarray(t[pre + "embed_tokens.weight"], dt),
        "layers": layers,
        "final_norm": jnp.asarray(t[pre + "norm.weight"], dt),
    }
    if not cfg.tie_embeddings:
        params["lm_head"] = w("lm_head.weight")
    return params


def params_to_hf(cfg: ModelConfig, params: dict) -> dict[str, jnp.ndarray]:
    """Our params as HF-named tensors in torch's [out, in] layout."""
    pre = decoder_prefix(cfg)
    q, kv = cfg.q_dim, cfg.kv_dim
    out = {pre + "embed_tokens.weight": params["embed"], pre + "norm.weight": params["final_norm"]}
    if not cfg.tie_embeddings:
        out["lm_head.weight"] = params["lm_head"].T
    for i, p in enumerate(params["layers"]):
        lp, a = f"{pre}layers.{i}.", f"{pre}layers.{i}.self_attn."
        out.update({
            lp + "input_layernorm.weight": p["attn_norm"],
            lp + "post_attention_layernorm.weight": p["mlp_norm"],
            a + "q_proj.weight": p["qkv"][:, :q].T,
            a + "k_proj.weight": p["qkv"][:, q : q + kv].T,
            a + "v_proj.weight": p["qkv"][:, q + kv : q + 2 * kv].T,
            a + "o_proj.weight": p["o"].T,
            lp + "mlp.gate_proj.weight": p["gate_up"][:, : cfg.mlp_dim].T,
            lp + "mlp.up_proj.weight": p["gate_up"][:, cfg.mlp_dim :].T,
            lp + "mlp.down_proj.weight": p["down"].T,
        })
        if cfg.qkv_bias:
            b = p["qkv_bias"]
            out.update({a + "q_proj.bias": b[:q], a + "k_proj.bias": b[q : q + kv], a + "v_proj.bias": b[q + kv :]})
        if cfg.qk_norm:
            out.update({a + "q_norm.weight": p["q_norm"], a + "k_norm.weight": p["k_norm"]})
    return {k: jnp.asarray(v) for k, v in out.items()}


def save_hf(cfg: ModelConfig, params: dict, path: str, *, base_config: dict | None = None) -> None:
    """Write config.json + model.safetensors that transformers' `from_pretrained` loads.

    The folder is written under a temporary name and renamed into place, so an existing checkpoint at
    `path` is never left half-overwritten.
    """
    hf_config = config_to_hf(cfg, base_config)
    tensors = params_to_hf(cfg, params)
    tmp = path.rstrip("/") + ".tmp-save"
    os.makedirs(tmp, exist_ok=True)
    save_file(tensors, os.path.join(tmp, "model.safetensors"), metadata={"format": "pt"})
    with open(os.path.join(tmp, "config.json"), "w") as f:
        json.dump(hf_config, f, indent=2)
    if os.path.exists(path):
        old = path.rstrip("/") + ".tmp-old"
        os.replace(path, old)
        os.replace(tmp, path)
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.replace(tmp, path)
