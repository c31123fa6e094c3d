"""The optional W&B mirror (grpo_jax.wandb_log): a real tiny run with logging.wandb_project set, W&B offline,
sends every metrics row's numbers and each step's samples table, and writes its offline run under <out>/wandb;
without wandb installed the key is a one-line error naming the extra."""

from __future__ import annotations

import glob
import math
import os
import sys

import pytest

from grpo_jax.config import UserError
from grpo_jax.runlog import read_jsonl


def test_without_wandb_the_key_names_the_extra_to_install(tmp_path, monkeypatch):
    from grpo_jax.wandb_log import WandbSink

    monkeypatch.setitem(sys.modules, "wandb", None)  # import wandb then raises ImportError
    with pytest.raises(UserError, match=r"logging\.wandb_project is set but wandb is not installed: "
                                        r"pip install -e '\.\[wandb\]'") as err:
        WandbSink("p", str(tmp_path), config={}, start_step=0)
    assert "\n" not in str(err.value)


def test_a_run_mirrors_its_metrics_and_samples_to_an_offline_wandb_run(tmp_path, monkeypatch):
    wandb = pytest.importorskip("wandb")
    from grpo_jax import train
    from tests.test_train import _assert_real_signal, signal_config

    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    sent = []  # (data, step) of every Run.log call, passed on to W&B unchanged
    original = wandb.sdk.wandb_run.Run.log

    def spy(self, data, step=None, *args, **kwargs):
        sent.append((dict(data), step))
        return original(self, data, step, *args, **kwargs)

    monkeypatch.setattr(wandb.sdk.wandb_run.Run, "log", spy)
    out = str(tmp_path / "run")
    cfg = signal_config("steps=2", "logging.wandb_project=grpo-jax-test", "logging.samples_per_step=3")
    train.Trainer(cfg, out, quiet=True).run()

    rows = [r for r in read_jsonl(os.path.join(out, "metrics.jsonl")) if "loss" in r]
    _assert_real_signal([r["grad_norm"] for r in rows])  # trained for real: there is something to mirror
    scalars = {step: data for data, step in sent if "samples" not in data}
    for row in rows:
        mirrored = scalars[row["step"]]
        numbers = {k: v for k, v in row.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
        assert set(numbers) - {"step"} <= set(mirrored), set(numbers) - set(mirrored)
        assert all(mirrored[k] == v or (math.isnan(v) and math.isnan(mirrored[k])) for k, v in numbers.items()
                   if k != "step")
        assert mirrored["grad_norm"] > 0 and "time/step" in mirrored  # the timings row too
    tables = {step: data["samples"] for data, step in sent if "samples" in data}
    assert sorted(tables) == [1, 2] and all(len(t.data) == 3 for t in tables.values())
    logged = read_jsonl(os.path.join(out, "samples.jsonl"))
    columns = tables[2].columns
    assert [r[columns.index("advantage")] for r in tables[2].data] == [s["advantage"] for s in logged if s["step"] == 2]
    assert glob.glob(os.path.join(out, "wandb", "offline-run-*", "run-*.wandb"))
