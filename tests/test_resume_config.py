"""--resume and --rollback-to continue a run with its own config: the first run's --set stays unless named
again, each change is printed, logged as a "config_changed" event and kept in config_history.jsonl (config.json
stays as the run started), and a change the checkpoints cannot take is refused in one line naming the key."""

from __future__ import annotations

import json
import shutil

import pytest

from grpo_jax import cli, runconfig, train
from grpo_jax.checkpoint import CheckpointError
from grpo_jax.config import TrainConfig, override, to_dict
from grpo_jax.runlog import read_jsonl
from tests.test_train import SIGNAL, _assert_real_signal
from tests.tolerance import EPS32

LR = 1e-2
# the first run: `python -m grpo_jax.train --smoke` (a 2-step shrunk config) with settings a resume must keep;
# SIGNAL gives every step a real gradient, and the collapse alarms warn (a tiny random model's groups tie)
FIRST = ["--smoke", "--quiet", *[x for s in (f"optim.lr={LR}", "steps=3", "monitor.collapse_action=warn", *SIGNAL)
                                 for x in ("--set", s)]]


@pytest.fixture(scope="module")
def first_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("resume") / "first"
    summary = train.main([*FIRST, "--out", str(out)])
    assert summary["steps"] == 3 and not summary["paused"]
    return out


@pytest.fixture
def run(first_run, tmp_path):
    """A copy of the 3-step run (checkpoints 1-3) for one test to continue."""
    return shutil.copytree(first_run, tmp_path / "run")


def _lines(err: str, flag: str) -> list[str]:
    return [line for line in err.splitlines() if line.startswith(flag + ":")]


def test_resume_keeps_the_first_runs_settings_and_changes_only_what_set_names(run, capsys):
    config_json = (run / "config.json").read_bytes()
    capsys.readouterr()
    summary = train.main(["--quiet", "--out", str(run), "--resume", "--set", "steps=5"])  # the README's command
    assert summary["steps"] == 5
    rows = [r for r in read_jsonl(str(run / "metrics.jsonl")) if "loss" in r]
    assert [r["step"] for r in rows] == [1, 2, 3, 4, 5]
    # the logged lr is the float32 the optimizer used: within one float32 rounding of 1e-2 (relative)
    assert all(r["lr"] == pytest.approx(LR, rel=EPS32) for r in rows), [r["lr"] for r in rows]
    _assert_real_signal([r["grad_norm"] for r in rows[3:]], [r["skipped"] for r in rows[3:]])  # 4-5 trained
    assert _lines(capsys.readouterr().err, "--resume") == ["--resume: steps: 3 -> 5"]
    (event,) = [e for e in read_jsonl(str(run / "events.jsonl")) if e["kind"] == "config_changed"]
    assert event["step"] == 3 and event["at"] == "resume" and event["changes"] == {"steps": {"from": 3, "to": 5}}
    assert (run / "config.json").read_bytes() == config_json  # as the run started
    (entry,) = runconfig.history(str(run))
    assert entry["changes"] == event["changes"] and entry["config"]["steps"] == 5
    # the next --resume starts from the history's config: steps 5 and lr 1e-2, nothing to print
    _, cfg = cli.parse_args(["--out", str(run), "--resume"])
    assert (cfg.steps, cfg.optim.lr) == (5, LR)
    assert _lines(capsys.readouterr().err, "--resume") == []


def test_rollback_without_config_continues_with_the_runs_settings(run, capsys):
    """docs/configuration.md's --rollback-to example, as written: no --config, the run's own settings."""
    capsys.readouterr()
    summary = train.main(["--quiet", "--out", str(run), "--rollback-to", "2", "--set", "entropy.coef=0.01"])
    assert summary["steps"] == 3
    rows = {r["step"]: r for r in read_jsonl(str(run / "metrics.jsonl")) if "loss" in r}
    assert sorted(rows) == [1, 2, 3] and rows[3]["control/entropy_coef"] == pytest.approx(0.01, rel=EPS32)
    assert rows[3]["lr"] == pytest.approx(LR, rel=EPS32) and rows[3]["grad_norm"] > 0
    assert _lines(capsys.readouterr().err, "--rollback-to 2") == ["--rollback-to 2: entropy.coef: 0.0 -> 0.01"]
    (entry,) = runconfig.history(str(run))
    assert entry["step"] == 2 and entry["at"] == "rollback" and list(entry["changes"]) == ["entropy.coef"]


@pytest.mark.parametrize("change, key", [("model.d_model=64", "model.d_model"), ("lora.rank=4", "lora.rank")])
def test_a_change_the_checkpoints_cannot_take_is_refused_in_one_line_naming_the_key(run, monkeypatch, change,
                                                                                    key):
    monkeypatch.delenv(cli.DEBUG_ENV, raising=False)
    kept = {name: (run / name).read_bytes() for name in ("metrics.jsonl", "events.jsonl", "config.json")}
    checkpoints = sorted(p.name for p in (run / "checkpoints").iterdir())
    with pytest.raises(SystemExit) as info:
        train.main(["--quiet", "--out", str(run), "--resume", "--set", change])
    text = str(info.value.code)
    assert "\n" not in text and text.startswith(f"error: --resume {run}: cannot change {key}: "), text
    assert {name: (run / name).read_bytes() for name in kept} == kept  # nothing in the folder changed
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == checkpoints
    assert not (run / runconfig.HISTORY).exists() and not (run / "run.lock").exists()


def test_the_trainer_api_refuses_the_same_change_naming_the_key(run):
    """A library caller passes its own config: a shape change is refused, one line naming the key, before the
    checkpoint's arrays are compared with the new shapes."""
    cfg = runconfig.current(str(run))[0]
    with pytest.raises(CheckpointError) as info:
        train.Trainer(override(cfg, ["model.d_model=64"]), str(run), resume=True, quiet=True)
    assert "\n" not in str(info.value) and "model.d_model: checkpoint 32, now 64" in str(info.value)


def test_current_config_reads_config_json_then_the_newest_history_line(tmp_path):
    assert runconfig.current(str(tmp_path)) is None  # no run there
    start = override(TrainConfig(), ["steps=3"])
    (tmp_path / "config.json").write_text(json.dumps(to_dict(start)))
    assert runconfig.current(str(tmp_path)) == (start, str(tmp_path / "config.json"))
    later = override(start, ["steps=7"])
    (tmp_path / runconfig.HISTORY).write_text(json.dumps({"step": 3, "config": to_dict(later)}) + "\n")
    assert runconfig.current(str(tmp_path))[0] == later
    (tmp_path / runconfig.HISTORY).write_text("not json\n")
    with pytest.raises(ValueError, match=rf"{runconfig.HISTORY}:1: invalid JSON"):
        runconfig.current(str(tmp_path))
    assert runconfig.changes(start, later) == [("steps", 3, 7)] and runconfig.changes(start, start) == []
