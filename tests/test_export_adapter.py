"""The export's base files and LoRA adapter: `python -m grpo_jax.export` copies the base folder's
generation_config.json, and `--adapter-only` writes a PEFT adapter that peft loads onto the base to give
the merged export's logits. The base is a tiny random transformers model saved to a temporary folder; the
checkpoint restore is replaced by a state built here (restoring a real run is tests/test_export.py's)."""

from __future__ import annotations

import dataclasses
import json
import os
from types import SimpleNamespace

import jax
import numpy as np
import pytest
import transformers

import models
from grpo_jax import export
from grpo_jax.config import LoraConfig, TrainConfig
from grpo_jax.tokenizer import CharTokenizer
from models import lora
from tests.hf_util import build, hf_logits
from tests.tolerance import forward_tol


def _trained_like(adapters, seed=3):
    """Adapters with non-zero B (what training makes of them): every leaf perturbed by N(0, 0.05^2)."""
    leaves, tree = jax.tree.flatten(adapters)
    keys = jax.random.split(jax.random.key(seed), len(leaves))
    return jax.tree.unflatten(tree, [np.asarray(x + 0.05 * jax.random.normal(k, x.shape)) for x, k in zip(leaves, keys)])


@pytest.fixture(params=["qwen2", "llama"])
def lora_run(request, tmp_path, monkeypatch):
    """A tiny random base saved with a generation_config.json, and a LoRA "run" on it (rank 4, alpha 8, the
    attention and MLP targets) whose checkpoint restore returns trained-like adapters."""
    base_dir = str(tmp_path / "base")
    base = build(request.param)
    base.generation_config = transformers.GenerationConfig(do_sample=True, temperature=0.6, top_p=0.95,
                                                           eos_token_id=[2, 7])
    base.save_pretrained(base_dir)
    model_cfg, base_params = models.load_hf(base_dir)
    targets = ("q", "v", "o", "up", "down")
    lora_cfg = LoraConfig(rank=4, alpha=8.0, targets=targets)
    adapters = _trained_like(lora.init_adapters(model_cfg, 4, targets, jax.random.key(0)))
    default = TrainConfig()
    cfg = dataclasses.replace(default, lora=lora_cfg, model=dataclasses.replace(default.model, hf_path=base_dir))
    state = SimpleNamespace(params=adapters, base=base_params)
    monkeypatch.setattr(export, "restore_state", lambda run_dir, step=None: (cfg, model_cfg, state, CharTokenizer(), 5))
    return SimpleNamespace(base_dir=base_dir, model_cfg=model_cfg, cfg=cfg, adapters=adapters, base=base_params)


def test_generation_config_is_copied_from_the_base(lora_run, tmp_path):
    out = str(tmp_path / "merged")
    info = export.main(["runs/x", out])
    src = os.path.join(lora_run.base_dir, "generation_config.json")
    assert info["generation_config"] == os.path.abspath(src)
    assert open(os.path.join(out, "generation_config.json")).read() == open(src).read()
    loaded = transformers.GenerationConfig.from_pretrained(out)
    assert (loaded.temperature, loaded.top_p, loaded.eos_token_id) == (0.6, 0.95, [2, 7])
    os.remove(src)  # a base without one: nothing copied, said so
    info = export.main(["runs/x", str(tmp_path / "bare")])
    assert info["generation_config"] is None
    assert not os.path.exists(tmp_path / "bare" / "generation_config.json")


def test_adapter_only_loads_in_peft_with_the_merged_exports_logits(lora_run, tmp_path):
    peft = pytest.importorskip("peft")
    merged_dir, adapter_dir = str(tmp_path / "merged"), str(tmp_path / "adapter")
    export.main(["runs/x", merged_dir])
    info = export.main(["runs/x", adapter_dir, "--adapter-only"])
    assert info["adapter_only"] and info["step"] == 5
    assert sorted(os.listdir(adapter_dir)) == ["adapter_config.json", "adapter_model.safetensors",
                                               "export_info.json", "grpo_tokenizer.json"]
    config = json.load(open(os.path.join(adapter_dir, "adapter_config.json")))
    assert (config["peft_type"], config["task_type"], config["r"], config["lora_alpha"]) == ("LORA", "CAUSAL_LM", 4, 8.0)
    assert config["target_modules"] == ["down_proj", "o_proj", "q_proj", "up_proj", "v_proj"]
    assert config["base_model_name_or_path"] == os.path.abspath(lora_run.base_dir)

    base = transformers.AutoModelForCausalLM.from_pretrained(lora_run.base_dir).eval()
    tokens = np.asarray(jax.random.randint(jax.random.key(1), (2, 9), 0, lora_run.model_cfg.vocab_size))
    base_logits = hf_logits(base, tokens)
    with_adapter = peft.PeftModel.from_pretrained(base, adapter_dir).eval()
    # every tensor of the file was read into a module (a wrong key name would leave that adapter at its init)
    loaded = {n for n, _ in with_adapter.named_parameters() if "lora_" in n}
    assert len(loaded) == 2 * 5 * lora_run.model_cfg.n_layers
    peft_logits = hf_logits(with_adapter, tokens)
    merged = transformers.AutoModelForCausalLM.from_pretrained(merged_dir).eval()
    merged_logits = hf_logits(merged, tokens)
    diff = float(np.abs(peft_logits - merged_logits).max())
    moved = float(np.abs(peft_logits - base_logits).max())
    # the same function in float32 in another order (peft adds s * B(A x) to W x, the export multiplies by
    # W + s * B A): rounding only, bounded relative to the logits' magnitude (tests/tolerance.py)
    tol = forward_tol(merged_logits, lora_run.model_cfg)
    print(f"\npeft(base + adapter) vs merged export: max |logit diff| = {diff:.2e}, tolerance {tol:.2e} (the "
          f"adapter moves the logits by {moved:.2e})")
    assert diff <= tol and moved > 100 * tol


def test_peft_tensor_names_and_layout():
    cfg = models.tiny(n_layers=2)
    adapters = _trained_like(lora.init_adapters(cfg, 3, ("q", "gate"), jax.random.key(0)))
    tensors = lora.peft_tensors(cfg, adapters)
    a = tensors["base_model.model.model.layers.1.self_attn.q_proj.lora_A.weight"]
    b = tensors["base_model.model.model.layers.1.mlp.gate_proj.lora_B.weight"]
    np.testing.assert_array_equal(a, np.asarray(adapters["layers"][1]["q"]["a"]).T)  # [r, in]
    np.testing.assert_array_equal(b, np.asarray(adapters["layers"][1]["gate"]["b"]).T)  # [out, r]
    assert len(tensors) == 2 * 2 * 2 and all(x.dtype == np.float32 for x in tensors.values())


def test_adapter_only_refuses_runs_it_cannot_serve(lora_run, tmp_path, monkeypatch):
    full = dataclasses.replace(lora_run.cfg, lora=LoraConfig())
    state = SimpleNamespace(params=lora_run.base, base={})
    monkeypatch.setattr(export, "restore_state", lambda run_dir, step=None: (full, lora_run.model_cfg, state,
                                                                              CharTokenizer(), 5))
    with pytest.raises(export.ExportError, match=r"runs/x: --adapter-only needs a LoRA run \(lora.rank > 0\)"):
        export.main(["runs/x", str(tmp_path / "a"), "--adapter-only", "--debug"])
    with pytest.raises(export.ExportError, match="the adapter needs its base as a transformers folder "
                                                 r"\(model.hf_path\)"):
        export.write_adapter(str(tmp_path / "b"), lora_run.model_cfg, lora_run.adapters, lora_run.cfg.lora,
                             CharTokenizer(), info={}, base_folder="")
    assert not os.path.exists(tmp_path / "a") and not os.path.exists(tmp_path / "b")
