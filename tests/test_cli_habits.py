"""Habits a new user brings from other trainers: --smoke never lands in the real run's folder, `python -m
grpo_jax.train --smoke` is a smoke run, a mistyped config key gets a "did you mean", warnings print as one line."""

from __future__ import annotations

import argparse
import subprocess
import sys

import pytest

from grpo_jax import cli, train
from grpo_jax.config import TrainConfig, from_dict, override
from tests.test_train import ROOT


def test_smoke_runs_get_their_own_default_folder():
    args = lambda out, smoke: argparse.Namespace(out=out, smoke=smoke)  # noqa: E731
    assert cli.out_dir(args(cli.DEFAULT_OUT, False), "runs/arithmetic") == "runs/arithmetic"
    assert cli.out_dir(args(cli.DEFAULT_OUT, True), "runs/arithmetic") == "runs/arithmetic-smoke"
    assert cli.out_dir(args("runs/mine", True), "runs/arithmetic") == "runs/mine"  # --out is the user's
    assert cli.out_dir(args(cli.DEFAULT_OUT, True)) == "runs/grpo-smoke"


def test_train_module_smoke_is_a_smoke_run(tmp_path):
    # the config grpo_jax.train trains with --smoke: TrainConfig() at smoke scale (2 steps), not 100 steps
    summary = train.main(["--smoke", "--quiet", "--out", str(tmp_path / "run")])
    assert summary["steps"] == 2 and TrainConfig().steps > 2


@pytest.mark.parametrize("typo, suggestion", [("optim.lrr=1e-3", "'lr'"), ("optm.lr=1e-3", "'optim'"),
                                              ("sampling.temprature=0.7", "'temperature'")])
def test_a_mistyped_key_gets_a_did_you_mean(typo, suggestion):
    with pytest.raises(ValueError, match=f"did you mean {suggestion}"):
        override(TrainConfig(), [typo])
    with pytest.raises(ValueError, match="did you mean 'steps'"):
        from_dict(TrainConfig, {"stepz": 3})
    with pytest.raises(ValueError) as err:  # nothing close: no suggestion
        override(TrainConfig(), ["optim.zzzz=1"])
    assert "did you mean" not in str(err.value)


def test_warnings_print_as_one_line_without_the_package_location():
    code = ("import warnings; from grpo_jax.cli import for_people\n"
            "f = for_people(lambda argv=None: warnings.warn('a reward\\nwarned', RuntimeWarning))\n"
            "f(DEBUG)\n")
    plain = subprocess.run([sys.executable, "-c", code.replace("DEBUG", "[]")], cwd=ROOT, capture_output=True,
                           text=True, timeout=120)
    assert plain.stderr == "warning: a reward warned\n"
    debug = subprocess.run([sys.executable, "-c", code.replace("DEBUG", "['--debug']")], cwd=ROOT,
                           capture_output=True, text=True, timeout=120)
    assert "RuntimeWarning" in debug.stderr and "<string>" in debug.stderr  # Python's own form under --debug
