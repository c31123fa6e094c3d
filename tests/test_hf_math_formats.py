"""experiments/hf_math.py reads any supported row format with its own defaults (no --set task.name), resumes
a run folder from its config.json with nothing repeated, and exits with one line naming model.hf_path when
that folder is missing."""

from __future__ import annotations

import dataclasses
import json

import pytest

from grpo_jax import build, tasks
from grpo_jax.config import override, to_dict
from grpo_jax.data import load_task_data
from grpo_jax.tasks import get_task
from tests.launchers import load_launcher

pytest.importorskip("transformers")
pytest.importorskip("tokenizers")
hf_math = load_launcher("hf_math")

ROWS = {  # one row of each family, as the public datasets ship them
    "gsm8k": ({"question": "Tom has 3 apples and gets 4 more. How many?", "answer": "3 + 4 = 7\n#### 7"}, "math"),
    "mcq": ({"question": "Which gas do plants take in?", "choices": ["Oxygen", "Carbon dioxide", "Helium"],
             "answer": 1}, "science"),
    "mbpp": ({"text": "Write a function double(x).", "code": "def double(x):\n    return 2 * x",
              "test_list": ["assert double(2) == 4"]}, "code"),
    "translation": ({"source": "Le chat dort.", "target": "The cat sleeps."}, "translation"),
}


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory):
    folder = tmp_path_factory.mktemp("tok")
    hf_math.build_bpe_tokenizer(str(folder), [json.dumps(r) for r, _ in ROWS.values()] * 10)
    return str(folder)


@pytest.mark.parametrize("fmt", sorted(ROWS))
def test_the_launcher_defaults_read_every_family_without_flags(tmp_path, tokenizer_dir, fmt):
    row, reward = ROWS[fmt]
    path = tmp_path / "train.jsonl"
    path.write_text(json.dumps(row) + "\n")
    cfg = hf_math.get_config()
    task = get_task(cfg.task.name, tokenizer_path=tokenizer_dir)
    task_cfg = dataclasses.replace(cfg.task, train_path=str(path), n_eval=0)
    rows, _, report = load_task_data(task, task_cfg, 0, task.tokenizer())
    assert report["format"] == fmt and len(rows) == 1
    specs = build.reward_specs(cfg, tasks.bind_format(task, fmt))
    assert [s.name for s in specs] == [reward, "format"]


def test_resume_reads_model_hf_path_and_the_task_from_the_runs_config(tmp_path, monkeypatch):
    """`--resume --out DIR` alone: the run's config.json gives model.hf_path (here a folder since moved away,
    so the run stops at the model with the error naming it) and the task it was made with (jsonl_math, an
    earlier default of the launcher)."""
    monkeypatch.delenv("GRPO_JAX_DEBUG", raising=False)
    run, ckpt = tmp_path / "run", tmp_path / "moved-ckpt"
    run.mkdir()
    saved = override(hf_math.get_config(), [f"model.hf_path={ckpt}", "task.name=jsonl_math",
                                            f"task.train_path={tmp_path / 'train.jsonl'}"])
    (run / "config.json").write_text(json.dumps(to_dict(saved)))
    _, cfg = hf_math.parse_args(["--resume", "--out", str(run)], get_config=hf_math.get_config,
                                default_out="runs/hf_math")
    assert cfg == saved and hf_math.get_config().task.name != "jsonl_math"
    with pytest.raises(SystemExit) as info:
        hf_math.main(["--resume", "--out", str(run), "--quiet"])
    assert str(info.value.code).startswith(f"error: model.hf_path={str(ckpt)!r}: no such folder")


def test_a_missing_checkpoint_folder_is_one_line_naming_model_hf_path(tmp_path, monkeypatch):
    monkeypatch.delenv("GRPO_JAX_DEBUG", raising=False)
    data = tmp_path / "train.jsonl"
    data.write_text(json.dumps(ROWS["gsm8k"][0]) + "\n")
    with pytest.raises(SystemExit) as info:
        hf_math.main(["--out", str(tmp_path / "run"), "--quiet", "--set", f"model.hf_path={tmp_path / 'ckpt'}",
                      "--set", f"task.train_path={data}"])
    text = str(info.value.code)
    assert "\n" not in text and text.startswith(f"error: model.hf_path={str(tmp_path / 'ckpt')!r}: no such folder")
