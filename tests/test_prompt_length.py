"""The prompt-length limit: sampling.max_prompt_tokens (default: the model's positions - max_new_tokens), a
longer prompt dropped (counted in the data report and the start line) or cut to its last tokens, and a
budget that cannot fit the model's positions refused in one line naming the keys and the numbers."""

from __future__ import annotations

import json

import jax
import numpy as np
import pytest

import models
from grpo_jax import build, cli, data, experience, train
from grpo_jax.assemble import assemble
from grpo_jax.config import SamplingConfig, TrainConfig, override
from grpo_jax.tokenizer import CharTokenizer
from models.rope import text_positions

POSITIONS, NEW_TOKENS = 48, 16  # the derived limit: 48 - 16 = 32 prompt tokens
LIMIT = POSITIONS - NEW_TOKENS


def prompt_of(n: int) -> str:
    """A prompt of exactly n characters ("1+1+...="), which CharTokenizer encodes as n tokens."""
    return ("1+" * n)[: n - 1] + "="


def write_rows(path, lengths) -> str:
    path.write_text("".join(json.dumps({"prompt": prompt_of(n), "answer": "2"}) + "\n" for n in lengths))
    return str(path)


def config(tmp_path, train_lengths, eval_lengths, *extra: str) -> TrainConfig:
    return override(TrainConfig(), [
        f"task.train_path={write_rows(tmp_path / 'train.jsonl', train_lengths)}",
        f"task.eval_path={write_rows(tmp_path / 'eval.jsonl', eval_lengths)}",
        f"model.max_positions={POSITIONS}", f"sampling.max_new_tokens={NEW_TOKENS}", "sampling.group_size=2",
        "prompts_per_step=2", "steps=1", "model.d_model=32", "model.mlp_dim=64", "model.n_layers=1",
        "logging.progress=false", "logging.tensorboard=false", *extra])


def hf_config_folder(tmp_path, max_position_embeddings: int):
    """A checkpoint folder holding only config.json: the positions are read from it before any weight."""
    folder = tmp_path / "ckpt"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({
        "architectures": ["Qwen2ForCausalLM"], "vocab_size": 128, "hidden_size": 32, "intermediate_size": 64,
        "num_hidden_layers": 1, "num_attention_heads": 2, "num_key_value_heads": 1,
        "max_position_embeddings": max_position_embeddings}))
    return folder


def exit_line(argv) -> str:
    with pytest.raises(SystemExit) as info:
        train.main(argv)
    text = str(info.value.code)
    assert "\n" not in text and text.startswith("error: "), text
    return text


# ---- the limit and where its number comes from ---------------------------------------------------------------

def test_the_default_limit_is_the_models_positions_minus_max_new_tokens(tmp_path):
    sampling = SamplingConfig(max_new_tokens=NEW_TOKENS)
    limit, how = data.prompt_token_limit(sampling, POSITIONS, "model.max_positions")
    assert limit == LIMIT
    assert how == f"{POSITIONS} positions (model.max_positions) - sampling.max_new_tokens {NEW_TOKENS}"
    explicit = SamplingConfig(max_new_tokens=NEW_TOKENS, max_prompt_tokens=LIMIT - 5)
    assert data.prompt_token_limit(explicit, POSITIONS, "model.max_positions") == (LIMIT - 5,
                                                                                   "sampling.max_prompt_tokens")
    assert data.prompt_token_limit(sampling, 0, "model.preset='tiny'")[0] is None  # no positions known: no limit
    # the model's positions: model.max_positions, else the checkpoint's config.json, else none (a preset)
    folder = hf_config_folder(tmp_path, 512)
    cfg = override(TrainConfig(), [f"model.hf_path={folder}"])
    assert build.model_positions(cfg) == (512, f"max_position_embeddings in {folder / 'config.json'}, model.hf_path")
    assert build.model_positions(override(cfg, ["model.max_positions=300"])) == (300, "model.max_positions")
    assert build.model_positions(TrainConfig()) == (0, "model.preset='tiny'")
    read = models.hf.read_config(str(folder))
    assert read.max_positions == 512 and models.hf.config_to_hf(read)["max_position_embeddings"] == 512


# ---- drop and truncate ---------------------------------------------------------------------------------------

def test_a_long_prompt_is_dropped_and_counted_in_the_report_and_the_start_line(tmp_path, capsys):
    assert [len(CharTokenizer().encode(prompt_of(n))) for n in (4, LIMIT, LIMIT + 1)] == [4, LIMIT, LIMIT + 1]
    cfg = config(tmp_path, [4, 6, LIMIT, LIMIT + 1, 60], [5, LIMIT + 3], "task.n_eval=2")
    tr = train.Trainer(cfg, str(tmp_path / "run"))
    tr.release_lock()
    lengths = [len(r["prompt"]) for r in tr.parts.rows]
    assert sorted(lengths) == [4, 6, LIMIT] and [len(r["prompt"]) for r in tr.eval_rows] == [5]
    assert tr.actor.prompt_limit == LIMIT
    report = tr.data_report["prompt_lengths"]
    assert report["train"] == {"rows": 5, "dropped": 2, "longest": 60}
    assert report["eval"] == {"rows": 2, "dropped": 1, "longest": LIMIT + 3}
    events = [json.loads(line) for line in open(tmp_path / "run" / "events.jsonl")]
    assert next(e for e in events if e["kind"] == "data")["prompt_lengths"] == report
    lines = [line for line in capsys.readouterr().err.splitlines() if line.startswith("sampling.max_prompt_tokens")]
    assert lines == [f"sampling.max_prompt_tokens={LIMIT} ({POSITIONS} positions (model.max_positions) - "
                     f"sampling.max_new_tokens {NEW_TOKENS}): dropped 2 of 5 training rows (longest 60 tokens), "
                     f"1 of 2 held-out rows (longest {LIMIT + 3} tokens); longer prompts were left out "
                     "(sampling.long_prompts=drop)"]


def test_truncate_left_keeps_each_long_prompts_last_tokens_in_the_rollout(tmp_path):
    cfg = config(tmp_path, [4, LIMIT + 9], [5], "sampling.long_prompts=truncate_left")
    parts = assemble(cfg)
    assert len(parts.rows) == 2 and parts.data_report["prompt_lengths"]["train"] == {
        "rows": 2, "truncated": 1, "longest": LIMIT + 9}
    assert data.length_summary(parts.data_report["prompt_lengths"]).endswith(
        f"truncated 1 of 2 training rows (longest {LIMIT + 9} tokens), 0 of 1 held-out rows (longest 5 tokens); "
        "longer prompts kept their last tokens (sampling.long_prompts=truncate_left)")
    tok = parts.actor.tokenizer
    long_row = next(r for r in parts.rows if len(r["prompt"]) > LIMIT)
    ro = experience.rollout(parts.actor, parts.policy_params(parts.state), [long_row, parts.rows[0]],
                            jax.random.key(0), group_size=2, temperature=1.0)
    prompt, mask = np.asarray(ro.prompt_tokens), np.asarray(ro.prompt_mask)
    np.testing.assert_array_equal(prompt[0][mask[0]], tok.encode(long_row["prompt"])[-LIMIT:])
    np.testing.assert_array_equal(prompt[1][mask[1]], tok.encode(parts.rows[0]["prompt"]))  # a short one: as it is
    # the positions the model is asked for: the prompt's real tokens and T completion tokens, whatever the
    # bucket's padding (the sampler's cache is wider than the positions: bucket 32 + 16 slots)
    seq_mask = np.concatenate([mask, np.ones((2, NEW_TOKENS), bool)], axis=1)
    assert int(np.asarray(text_positions(seq_mask)).max()) == POSITIONS - 1


def test_a_truncated_prompt_keeps_its_leading_bos():
    tok = CharTokenizer()
    rows = [[tok.bos_id, *tok.encode(prompt_of(10))], tok.encode(prompt_of(10)), [tok.bos_id, *tok.encode("12=")]]
    tokens, mask = data.pad_rows(rows, width=None, pad_id=tok.pad_id, left_pad=True)
    cut, cut_mask = data.keep_last_tokens(tokens, mask, 6, bos_id=tok.bos_id)
    assert cut.shape == (3, 6)
    assert cut[0][cut_mask[0]].tolist() == [tok.bos_id, *rows[0][-5:]]  # BOS, then the last 5
    assert cut[1][cut_mask[1]].tolist() == rows[1][-6:]  # no BOS: the last 6
    assert cut[2][cut_mask[2]].tolist() == rows[2]  # short enough: as it was


# ---- refusals ------------------------------------------------------------------------------------------------

def test_a_prompt_budget_past_the_models_positions_is_refused_in_one_line(tmp_path, monkeypatch):
    monkeypatch.delenv(cli.DEBUG_ENV, raising=False)
    folder = hf_config_folder(tmp_path, 512)
    argv = ["--out", str(tmp_path / "run"), "--quiet", "--set", f"model.hf_path={folder}",
            "--set", "sampling.max_new_tokens=64"]
    text = exit_line(argv + ["--set", "sampling.max_prompt_tokens=600"])
    assert text.startswith(f"error: sampling.max_prompt_tokens (600) + sampling.max_new_tokens (64) = 664 exceeds the "
                           f"model's 512 positions (max_position_embeddings in {folder / 'config.json'}, "
                           "model.hf_path); lower one of them")
    text = exit_line(["--out", str(tmp_path / "run"), "--quiet", "--set", "model.max_positions=64",
                      "--set", "sampling.max_new_tokens=64"])
    assert text.startswith("error: sampling.max_new_tokens (64) leaves no room for a prompt in the model's 64 "
                           "positions (model.max_positions)")
    assert not (tmp_path / "run" / "checkpoints").exists()


@pytest.mark.parametrize("part", ["train", "eval"])
def test_dropping_every_row_is_refused_in_one_line(tmp_path, monkeypatch, part):
    monkeypatch.delenv(cli.DEBUG_ENV, raising=False)
    train_lengths, eval_lengths = ([LIMIT + 1, 40], [5]) if part == "train" else ([5], [LIMIT + 2, 50])
    cfg = config(tmp_path, train_lengths, eval_lengths)
    with pytest.raises(data.DataError) as info:
        assemble(cfg)
    what = "training rows: the shortest prompt has 33" if part == "train" else "held-out rows: the shortest prompt has 34"
    assert str(info.value).startswith(f"sampling.max_prompt_tokens={LIMIT} ({POSITIONS} positions (model.max_positions) "
                                      f"- sampling.max_new_tokens {NEW_TOKENS}) drops every one of the 2 {what} tokens")
    assert str(info.value).endswith("set sampling.long_prompts=truncate_left" if part == "train" else
                                    "set sampling.long_prompts=truncate_left or set task.n_eval=0")
