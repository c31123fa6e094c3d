"""`python -m grpo_jax.export` and `checkpoint.export_hf`: a tiny run trained 2 real steps is exported from
its checkpoints and at its end; transformers loads the export and gives our logits; the step chosen is
the step written; the LoRA hook is what both paths write; bad runs, steps, models and destinations are
refused with messages naming them, and nothing already written is lost."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import transformers

import models
from grpo_jax import build, export, train, update
from grpo_jax.runlog import read_jsonl
from grpo_jax.tokenizer import CharTokenizer, HFTokenizer
from models.rope import text_positions
from tests.hf_util import hf_logits
from tests.test_train import ROOT, _assert_real_signal, signal_config
from tests.tolerance import forward_tol


def _leaves(tree) -> dict[str, np.ndarray]:
    return {jax.tree_util.keystr(p): np.asarray(x) for p, x in jax.tree_util.tree_leaves_with_path(tree)}


def _assert_same_params(a, b) -> None:
    la, lb = _leaves(a), _leaves(b)
    assert sorted(la) == sorted(lb)
    for name in la:
        np.testing.assert_array_equal(la[name], lb[name], err_msg=name)


def _logit_diff_and_tol(folder: str, cfg: models.ModelConfig, params, tokens: np.ndarray) -> tuple[float, float]:
    """max |our logits - transformers' logits| on the exported folder, and what float32 rounding may account
    for: the same function summed in two libraries' orders, relative to the logits' magnitude (tests/tolerance.py)."""
    hf = transformers.AutoModelForCausalLM.from_pretrained(folder).eval()
    ours, _ = models.forward(cfg, params, jnp.asarray(tokens), jnp.asarray(text_positions(np.ones_like(tokens))))
    ref = hf_logits(hf, tokens)
    return float(np.abs(np.asarray(ours) - ref).max()), forward_tol(ref, cfg)


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """2 GRPO steps of the tiny Llama on arithmetic with a length reward (a real gradient), a checkpoint
    after each, and checkpoint.export_hf on."""
    out = str(tmp_path_factory.mktemp("export") / "run")
    trainer = train.Trainer(signal_config("steps=2", "checkpoint.export_hf=true"), out, quiet=True)
    trainer.run()
    rows = read_jsonl(os.path.join(out, "metrics.jsonl"))
    _assert_real_signal([r["grad_norm"] for r in rows], [r["skipped"] for r in rows])
    return trainer


def test_export_loads_in_transformers_with_our_logits(run, tmp_path):
    out = str(tmp_path / "exp")
    info = export.main([run.out_dir, out])
    assert info["step"] == 2 and info["source"] == "checkpoint" and info["run_dir"] == os.path.abspath(run.out_dir)
    cfg2, params2 = models.load_hf(out)
    # a preset has no positions count of its own: config.json gives it the default, which loads back
    assert cfg2.replace(remat=run.actor.model_cfg.remat) == run.actor.model_cfg.replace(
        max_positions=models.hf.HF_DEFAULT_POSITIONS)
    _assert_same_params(params2, run.state.params)  # the checkpoint's params are the trainer's, bit for bit
    tok = run.actor.tokenizer
    tokens = np.asarray([tok.encode("12+34=?"), tok.encode("<think>12+3</think>?")], np.int32)
    diff, tol = _logit_diff_and_tol(out, run.actor.model_cfg, run.state.params, tokens)
    print(f"\nexported tiny llama: max |logit diff| vs transformers = {diff:.2e}, tolerance {tol:.2e}")
    assert diff <= tol
    hf_cfg = json.load(open(os.path.join(out, "config.json")))
    assert (hf_cfg["eos_token_id"], hf_cfg["pad_token_id"], hf_cfg["bos_token_id"]) == (tok.eos_id, tok.pad_id,
                                                                                          tok.bos_id)
    # the char tokenizer: no HF tokenizer, said so, and its description written beside
    assert info["tokenizer"].startswith("none:") and "no HF tokenizer" in info["tokenizer"]
    assert not os.path.exists(os.path.join(out, "tokenizer.json"))
    assert CharTokenizer.from_json(open(os.path.join(out, export.CHAR_TOKENIZER_FILE)).read()) == tok
    saved = json.load(open(os.path.join(out, export.EXPORT_INFO)))
    assert saved["step"] == 2 and saved["run_manifest"]["rewards"][0]["name"] == "math"


def test_end_of_run_export_is_the_final_policy(run):
    hf_dir = os.path.join(run.out_dir, "hf")
    _, params = models.load_hf(hf_dir)
    _assert_same_params(params, run.state.params)
    info = json.load(open(os.path.join(hf_dir, export.EXPORT_INFO)))
    assert info["step"] == 2 and info["source"].startswith("end of run")
    events = [e for e in read_jsonl(os.path.join(run.out_dir, "events.jsonl")) if e["kind"] == "export"]
    assert len(events) == 1 and events[0]["path"] == hf_dir


def test_step_option_exports_that_checkpoint(run, tmp_path):
    out1 = str(tmp_path / "step1")
    assert export.main([run.out_dir, out1, "--step", "1"])["step"] == 1
    _, p1 = models.load_hf(out1)
    _, p2 = models.load_hf(os.path.join(run.out_dir, "hf"))
    moved = max(float(np.abs(a - b).max()) for a, b in zip(_leaves(p1).values(), _leaves(p2).values()))
    assert moved > 1e-4  # step 2's update changed the policy: step 1's export is another set of weights


def test_lora_hook_is_what_gets_written(run, tmp_path, monkeypatch):
    """Both paths write update.policy_params(model_cfg, cfg, state): the one place LoRA merges adapters
    (tests/test_lora.py exports a LoRA run)."""
    monkeypatch.setattr(update, "policy_params",
                        lambda model_cfg, cfg, state: {**state.params, "final_norm": state.params["final_norm"] + 1.0})
    export.main([run.out_dir, str(tmp_path / "cli")])
    _, params = models.load_hf(str(tmp_path / "cli"))
    np.testing.assert_array_equal(params["final_norm"], np.asarray(run.state.params["final_norm"]) + 1.0)
    export.export_trainer(run, str(tmp_path / "trainer"))
    _, params = models.load_hf(str(tmp_path / "trainer"))
    np.testing.assert_array_equal(params["final_norm"], np.asarray(run.state.params["final_norm"]) + 1.0)


def test_existing_destination_is_refused_unless_force(run, tmp_path):
    out = tmp_path / "taken"
    out.mkdir()
    (out / "notes.txt").write_text("keep me")
    with pytest.raises(export.ExportError, match=f"{out} exists and is not empty.*--force"):
        export.main([run.out_dir, str(out), "--debug"])
    assert os.listdir(out) == ["notes.txt"] and (out / "notes.txt").read_text() == "keep me"
    assert sorted(os.listdir(tmp_path)) == ["taken"]  # no staging folder left behind
    export.main([run.out_dir, str(out), "--force"])
    assert not (out / "notes.txt").exists() and models.load_hf(str(out))[0].arch == "llama"
    assert sorted(os.listdir(tmp_path)) == ["taken"]
    (tmp_path / "file").write_text("x")
    with pytest.raises(export.ExportError, match="exists and is not a folder"):
        export.main([run.out_dir, str(tmp_path / "file"), "--force", "--debug"])
    empty = tmp_path / "empty"
    empty.mkdir()
    export.main([run.out_dir, str(empty)])  # an empty folder is fine (e.g. made by a job script)
    assert (empty / "model.safetensors").exists()


def test_bad_run_and_step_name_them(run, tmp_path):
    with pytest.raises(export.ExportError, match=f"{tmp_path / 'nope'}: no such run folder"):
        export.main([str(tmp_path / "nope"), str(tmp_path / "o"), "--debug"])
    (tmp_path / "fresh").mkdir()
    with pytest.raises(export.ExportError, match=f"{tmp_path / 'fresh'}: no checkpoints"):
        export.main([str(tmp_path / "fresh"), str(tmp_path / "o"), "--debug"])
    (tmp_path / "fresh" / "checkpoints").mkdir()
    with pytest.raises(export.ExportError, match=f"{tmp_path / 'fresh'}: no checkpoints in"):
        export.main([str(tmp_path / "fresh"), str(tmp_path / "o"), "--debug"])
    with pytest.raises(export.ExportError, match=r"no checkpoint at step 7; the run has steps \[1, 2\]"):
        export.main([run.out_dir, str(tmp_path / "o"), "--step", "7", "--debug"])
    assert not (tmp_path / "o").exists()


def test_command_line_error_exits_with_the_message(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "grpo_jax.export", str(tmp_path / "nope"), str(tmp_path / "o")],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1
    assert f"error: {tmp_path / 'nope'}: no such run folder" in proc.stderr and "--debug" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_models_save_hf_refuses_are_refused_naming_where():
    for cfg in (models.tiny(rope_kind="rope2d"), models.tiny(arch="qwen2", qkv_bias=True, attn_output_gate=True)):
        with pytest.raises(export.ExportError, match="runs/x step 3: the policy cannot be written"):
            export.check_exportable(cfg, "runs/x step 3")
    export.check_exportable(models.tiny(), "ok")


def test_trainer_refuses_export_hf_for_a_model_save_hf_refuses(monkeypatch, tmp_path):
    """Refused when the run starts, not after its last step."""
    monkeypatch.setattr(build, "preset_config", lambda spec, vocab: models.tiny(vocab_size=vocab, rope_kind="rope2d"))
    with pytest.raises(export.ExportError, match="checkpoint.export_hf=true: the policy cannot be written"):
        train.Trainer(signal_config("checkpoint.export_hf=true"), str(tmp_path / "r"), quiet=True)


def _word_tokenizer(folder) -> None:
    tokenizers = pytest.importorskip("tokenizers")
    vocab = {"[PAD]": 0, "[BOS]": 1, "[EOS]": 2, "[UNK]": 3, "what": 4, "is": 5, "two": 6, "plus": 7, "?": 8}
    core = tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab, unk_token="[UNK]"))
    core.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    transformers.PreTrainedTokenizerFast(tokenizer_object=core, pad_token="[PAD]", bos_token="[BOS]",
                                         eos_token="[EOS]", unk_token="[UNK]").save_pretrained(folder)


def test_hf_tokenizer_written_beside_the_export(tmp_path):
    """A task with a Hugging Face tokenizer: its files are written with the model; transformers loads both.
    (A Llama: for a folder whose config.json says qwen2, AutoTokenizer always builds Qwen2Tokenizer, which
    reads this word-level test tokenizer wrongly; a real Qwen checkpoint's tokenizer is a Qwen2 one.)"""
    _word_tokenizer(tmp_path / "tok")
    tok = HFTokenizer(tmp_path / "tok")
    cfg = models.tiny(vocab_size=16, d_model=32, n_layers=1, head_dim=8, mlp_dim=48, tie_embeddings=True)
    params = models.init_params(cfg, jax.random.key(1))
    params = jax.tree.map(lambda x: x + 0.05 * jax.random.normal(jax.random.key(2), x.shape, x.dtype), params)
    out = str(tmp_path / "exp")
    info = export.write_export(out, cfg, params, tok, info={"step": 0})
    assert info["tokenizer"].startswith("hf:")
    hf_tok = transformers.AutoTokenizer.from_pretrained(out)
    assert hf_tok.encode("what is two plus two ?", add_special_tokens=False) == tok.encode("what is two plus two ?")
    assert hf_tok.eos_token_id == tok.eos_id == json.load(open(os.path.join(out, "config.json")))["eos_token_id"]
    tokens = np.asarray([tok.encode("what is two plus two ?")], np.int32)
    diff, tol = _logit_diff_and_tol(out, cfg, params, tokens)
    assert diff <= tol
