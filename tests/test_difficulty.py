"""Offline pass-rate estimation: the command writes pass rates next to the dataset, from a run's checkpoint."""

from __future__ import annotations

import json

from grpo_jax import data as data_lib
from grpo_jax import difficulty, train
from tests.test_train import tiny_config


def test_pass_rates_written_next_to_the_data(tmp_path):
    train.Trainer(tiny_config("steps=1"), str(tmp_path / "run"), quiet=True).run()
    rows = [{"prompt": f"{i:03d}+{i:03d}=", "answer": str(2 * i)} for i in range(6)]
    path = tmp_path / "train.jsonl"
    data_lib.write_jsonl(path, rows)
    summary = difficulty.main(["--data", str(path), "--run", str(tmp_path / "run"), "--k", "4"])
    out = data_lib.load_jsonl(tmp_path / "train.passrate.jsonl")
    assert summary["checkpoint_step"] == 1 and summary["out"] == str(tmp_path / "train.passrate.jsonl")
    assert [r["prompt"] for r in out] == [r["prompt"] for r in rows]  # every row kept, in order
    assert all(r["pass_rate"] in (0.0, 0.25, 0.5, 0.75, 1.0) for r in out)  # k = 4 samples each
    assert sum(summary["strata"].values()) == 6
    # deterministic: the same checkpoint, data and seed give the same rates
    difficulty.main(["--data", str(path), "--run", str(tmp_path / "run"), "--k", "4", "--out",
                     str(tmp_path / "again.jsonl")])
    assert data_lib.load_jsonl(tmp_path / "again.jsonl") == out
    assert json.loads((tmp_path / "run" / "config.json").read_text())["steps"] == 1  # run dir untouched
