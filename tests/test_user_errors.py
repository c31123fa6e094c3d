"""Errors for people: a mistake in the user's config, data or folders ends a command line with one line that
names the key, file, row or folder (cli.for_people); --debug or GRPO_JAX_DEBUG=1 shows the traceback, and a
bug always does. Each case calls the entry point in-process and reads the SystemExit's text."""

from __future__ import annotations

import json
import os

import pytest

from grpo_jax import cli, train
from grpo_jax.build import lora_note
from grpo_jax.config import TaskConfig, TrainConfig, override
from grpo_jax.data import DataError, load_task_data
from grpo_jax.tasks import get_task


def exit_line(main, argv) -> str:
    """The text `main(argv)` exits with; it must be one line starting with "error: "."""
    with pytest.raises(SystemExit) as info:
        main(argv)
    text = str(info.value.code)
    assert "\n" not in text and text.startswith("error: "), text
    return text


def run_argv(tmp_path, *settings: str) -> list[str]:
    return ["--out", str(tmp_path / "run"), "--quiet", *(a for s in settings for a in ("--set", s))]


def write_jsonl(path, rows) -> str:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


# ---- the wrapper ------------------------------------------------------------------------------------------

def test_a_user_error_is_one_line_and_a_bug_keeps_its_traceback(monkeypatch):
    monkeypatch.delenv(cli.DEBUG_ENV, raising=False)

    def bad_value(argv=None):
        raise ValueError("task.n_eval: must be\n  >= 0")

    def bug(argv=None):
        raise ZeroDivisionError("division by zero")

    text = exit_line(cli.for_people(bad_value), [])
    assert text.startswith("error: task.n_eval: must be >= 0 (--debug")
    with pytest.raises(ZeroDivisionError):
        cli.for_people(bug)([])
    text = exit_line(cli.for_people(lambda argv=None: open("/nonexistent/x.json")), [])  # an OSError: its file
    assert text.startswith("error: /nonexistent/x.json: No such file or directory (--debug")


def test_debug_flag_or_env_var_shows_the_traceback(tmp_path, monkeypatch):
    monkeypatch.delenv(cli.DEBUG_ENV, raising=False)
    argv = run_argv(tmp_path, f"model.hf_path={tmp_path / 'no_ckpt'}")
    with pytest.raises(cli.UserError, match="model.hf_path="):
        train.main(argv + ["--debug"])
    monkeypatch.setenv(cli.DEBUG_ENV, "1")
    with pytest.raises(cli.UserError, match="model.hf_path="):
        train.main(argv)
    monkeypatch.setenv(cli.DEBUG_ENV, "0")
    exit_line(train.main, argv)


# ---- the cases ----------------------------------------------------------------------------------------------

def test_a_missing_model_folder_names_model_hf_path(tmp_path, monkeypatch):
    monkeypatch.delenv(cli.DEBUG_ENV, raising=False)
    folder = tmp_path / "Qwen3-0.6B"
    text = exit_line(train.main, run_argv(tmp_path, f"model.hf_path={folder}", "task.name=jsonl",
                                          f"task.options=[[\"tokenizer_path\", \"{folder}\"]]"))
    assert f"model.hf_path={str(folder)!r}: no such folder" in text and "tokenizer" not in text.split(";")[0]


def test_a_misspelled_data_path_names_the_config_key_and_path(tmp_path, monkeypatch):
    monkeypatch.delenv(cli.DEBUG_ENV, raising=False)
    path = tmp_path / "trian.jsonl"
    text = exit_line(train.main, run_argv(tmp_path, f"task.train_path={path}"))
    assert f"task.train_path={str(path)!r}: no such file" in text
    write_jsonl(tmp_path / "train.jsonl", [{"prompt": "1+1=", "answer": "2"}])
    with pytest.raises(DataError, match=f"task.eval_path='{tmp_path / 'tset.jsonl'}': no such file"):
        load_task_data(get_task("arithmetic"), TaskConfig(train_path=str(tmp_path / "train.jsonl"),
                                                          eval_path=str(tmp_path / "tset.jsonl")), 0)


@pytest.mark.parametrize("name, content", [("train.parquet", b"\x15\x04\xff"),  # by suffix (e.g. cut short)
                                           ("train.jsonl", b"PAR1\x15\x04\x15"),
                                           ("renamed.bin", b"PAR1\x00\xff")])
def test_a_parquet_file_is_refused_with_the_conversion_command(tmp_path, name, content):
    path = tmp_path / name
    path.write_bytes(content)
    with pytest.raises(DataError) as info:
        load_task_data(get_task("arithmetic"), TaskConfig(train_path=str(path)), 0)
    text = str(info.value)
    assert "\n" not in text and "not UTF-8" not in text
    assert f"task.train_path={str(path)!r} is a Parquet file" in text
    assert f"pd.read_parquet({str(path)!r}).to_json(" in text and "lines=True" in text


def test_lora_rank_0_with_lora_settings_says_full_fine_tuning():
    assert lora_note(TrainConfig()) is None  # nobody asked for LoRA: nothing said
    assert lora_note(override(TrainConfig(), ["lora.rank=8", "lora.alpha=16"])) is None
    note = lora_note(override(TrainConfig(), ["lora.alpha=16", "lora.dropout=0.05"]))
    assert note.startswith("LoRA off: full fine-tuning") and "lora.alpha, lora.dropout" in note
    assert "\n" not in note


def test_the_trainer_warns_lora_off_once_at_start(tmp_path):
    cfg = override(TrainConfig(), ["steps=1", "lora.alpha=16", "task.n_eval=0", "logging.progress=false"])
    with pytest.warns(RuntimeWarning, match="LoRA off: full fine-tuning") as record:
        trainer = train.Trainer(cfg, str(tmp_path / "run"), quiet=True)
    trainer.release_lock()
    assert sum("LoRA off" in str(w.message) for w in record) == 1
    events = [json.loads(line) for line in open(os.path.join(tmp_path, "run", "events.jsonl"))]
    assert [e["kind"] for e in events].count("lora_off") == 1


@pytest.mark.parametrize("source", ["chat_template.jinja", "tokenizer_config.json"])
def test_a_raising_chat_template_names_the_template_file_and_the_row(tmp_path, source):
    pytest.importorskip("transformers")
    pytest.importorskip("tokenizers")
    from tests.launchers import load_launcher

    hf_math = load_launcher("hf_math")
    template = ("{% for m in messages %}{% if m['role'] == 'system' %}{{ raise_exception('System role not "
                "supported') }}{% endif %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
                "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
    folder = tmp_path / "tok"
    hf_math.build_bpe_tokenizer(str(folder), ["What is 2 + 2? 4"] * 20, chat_template=template)
    if source == "tokenizer_config.json":  # how older transformers save it: inside the config
        (folder / "chat_template.jinja").unlink(missing_ok=True)
        config = json.loads((folder / "tokenizer_config.json").read_text())
        (folder / "tokenizer_config.json").write_text(json.dumps({**config, "chat_template": template}))
    assert (folder / source).is_file()
    data = write_jsonl(tmp_path / "train.jsonl", [
        {"messages": [{"role": "user", "content": "What is 2 + 2?"}], "answer": "4"},
        {"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "2+3?"}],
         "answer": "5"}])
    task = get_task("jsonl", tokenizer_path=str(folder))
    with pytest.raises(DataError) as info:
        load_task_data(task, TaskConfig(train_path=data), 0, task.tokenizer())
    text = cli.one_line(info.value)
    assert text.startswith(f"{data}:2: the chat template in {folder / source} failed")
    assert "System role not supported" in text
    assert "\n" not in str(info.value)


def test_a_model_folder_without_a_checkpoint_and_a_missing_tokenizer_folder_name_their_keys(tmp_path, monkeypatch):
    monkeypatch.delenv(cli.DEBUG_ENV, raising=False)
    empty = tmp_path / "empty_ckpt"
    empty.mkdir()
    text = exit_line(train.main, run_argv(tmp_path, f"model.hf_path={empty}"))
    assert text.startswith(f"error: model.hf_path={str(empty)!r}: ") and "config.json" in text
    with pytest.raises(cli.UserError, match=f"^task.options tokenizer_path='{tmp_path / 'tok'}': no such folder"):
        get_task("jsonl", tokenizer_path=str(tmp_path / "tok")).tokenizer()


def test_the_difficulty_tool_names_its_data_flag(tmp_path, monkeypatch):
    from grpo_jax import difficulty

    monkeypatch.delenv(cli.DEBUG_ENV, raising=False)
    text = exit_line(difficulty.main, ["--data", str(tmp_path / "trian.jsonl")])
    assert text.startswith(f"error: --data={str(tmp_path / 'trian.jsonl')!r}: no such file")


def test_export_of_a_folder_without_checkpoints_is_one_line(tmp_path, monkeypatch):
    from grpo_jax import export

    monkeypatch.delenv(cli.DEBUG_ENV, raising=False)
    with pytest.raises(SystemExit) as e:
        export.main([str(tmp_path / "no_run"), str(tmp_path / "out")])
    msg = str(e.value)
    assert msg.startswith("error: ") and "\n" not in msg and "no_run" in msg and "--debug" in msg
    with pytest.raises(export.ExportError):  # --debug: the exception itself, with its traceback
        export.main([str(tmp_path / "no_run"), str(tmp_path / "out"), "--debug"])
