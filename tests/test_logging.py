"""Run outputs: JSONL round trip (NaN/inf, sorted keys), deterministic metrics.jsonl, resume truncation ==
uninterrupted run, torn last lines, TensorBoard scalars read back from the event file, plots and report."""

from __future__ import annotations

import json
import math
import os
import struct

import numpy as np
import pytest
from tensorboardX.proto.event_pb2 import Event, SessionLog

from grpo_jax.reporting import plot_run, write_report
from grpo_jax.runlog import RunLogger, read_jsonl


def _strict_json(line: str) -> dict:
    def reject(name: str) -> None:
        raise AssertionError(f"invalid JSON constant {name}")

    return json.loads(line, parse_constant=reject)


def _read_bytes(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read()


def _metrics(step: int) -> dict:
    return {"reward/total": step / 10, "loss": -0.5 * step, "length/mean": 3 * step}


def _run(out_dir: str, steps: range, **kwargs) -> None:
    """Logs `steps` the way the trainer does: metrics + timings, two samples and an event per step, and an
    evaluation's per-problem results every other step."""
    with RunLogger(out_dir, tensorboard=False, progress=False, **kwargs) as log:
        for step in steps:
            log.log(step, _metrics(step), timings={"step_s": 0.01 * step})
            log.log_samples(step, [{"completion": f"c{step}-{i}", "reward": 1.0} for i in range(2)])
            log.event(step, "weights", weights=[1.0, 0.5])
            if step % 2 == 0:
                log.log_problems(step, {"greedy_correct": [True, step % 4 == 0], "t1_correct": [3, 1]})


def _steps(path: str) -> list[int]:
    return [row["step"] for row in read_jsonl(path)]


def _event_file_records(tb_dir: str) -> list[Event]:
    """Every Event in the TFRecord files under tb_dir: [u64 len][u32 crc][payload][u32 crc] each."""
    events = []
    for name in sorted(os.listdir(tb_dir)):
        data, pos = _read_bytes(os.path.join(tb_dir, name)), 0
        while pos < len(data):
            (n,) = struct.unpack("<Q", data[pos:pos + 8])
            events.append(Event.FromString(data[pos + 12:pos + 12 + n]))
            pos += 12 + n + 4
    return events


def test_round_trip_non_finite_sorted_keys(tmp_path):
    metrics = {"zeta": 1, "alpha": math.nan, "inf_up": math.inf, "inf_down": -math.inf,
               "f32": np.float32(0.25), "i64": np.int64(7), "entropy/hist": np.array([1.0, 2.0])}
    with RunLogger(str(tmp_path), tensorboard=False, progress=False) as log:
        log.log(np.int32(3), metrics)
    (line,) = (tmp_path / "metrics.jsonl").read_text().splitlines()
    raw = _strict_json(line)
    assert list(raw) == sorted(raw)
    assert raw["alpha"] == "nan" and raw["inf_up"] == "inf" and raw["inf_down"] == "-inf"
    assert type(raw["f32"]) is float and type(raw["i64"]) is int and raw["step"] == 3
    (row,) = read_jsonl(str(tmp_path / "metrics.jsonl"))
    assert math.isnan(row["alpha"]) and row["inf_up"] == math.inf and row["inf_down"] == -math.inf
    assert row["zeta"] == 1 and row["f32"] == 0.25 and row["entropy/hist"] == [1.0, 2.0]


def test_metrics_byte_identical_when_timings_differ(tmp_path):
    for name, scale in (("a", 1.0), ("b", 7.3)):
        with RunLogger(str(tmp_path / name), tensorboard=False, progress=False) as log:
            for step in range(1, 5):
                log.log(step, {**_metrics(step), "nan_metric": math.nan}, timings={"rollout_s": scale * step})
    assert _read_bytes(tmp_path / "a/metrics.jsonl") == _read_bytes(tmp_path / "b/metrics.jsonl")
    assert _read_bytes(tmp_path / "a/timings.jsonl") != _read_bytes(tmp_path / "b/timings.jsonl")
    assert "rollout_s" not in (tmp_path / "a/metrics.jsonl").read_text()


def test_step_is_reserved(tmp_path):
    with RunLogger(str(tmp_path), tensorboard=False, progress=False) as log:
        with pytest.raises(ValueError, match="reserved"):
            log.log(1, {"step": 2})


def test_resume_truncates_step_files_and_matches_uninterrupted(tmp_path):
    whole, resumed = str(tmp_path / "whole"), str(tmp_path / "resumed")
    _run(whole, range(1, 7))
    _run(resumed, range(1, 7))
    with RunLogger(resumed, tensorboard=False, progress=False, resume_step=3):
        pass
    for name in ("metrics", "timings", "samples"):
        assert sorted(set(_steps(os.path.join(resumed, f"{name}.jsonl")))) == [1, 2, 3]
    assert _steps(os.path.join(resumed, "problems.jsonl")) == [2]  # the evaluations after step 3 are gone
    assert read_jsonl(os.path.join(resumed, "problems.jsonl"))[0]["t1_correct"] == [3, 1]
    events = read_jsonl(os.path.join(resumed, "events.jsonl"))
    assert [e["step"] for e in events] == [1, 2, 3, 4, 5, 6, 3]
    assert events[-1]["kind"] == "resume"
    assert events[-1]["dropped_rows"] == {"metrics": 3, "timings": 3, "samples": 6, "problems": 2}

    _run(resumed, range(4, 7), resume_step=3)
    for name in ("metrics", "samples"):
        assert _read_bytes(f"{resumed}/{name}.jsonl") == _read_bytes(f"{whole}/{name}.jsonl")
    assert [e["kind"] for e in read_jsonl(os.path.join(resumed, "events.jsonl"))].count("resume") == 2


def test_torn_last_line_ignored_on_read_and_removed_on_resume(tmp_path):
    whole, crashed = str(tmp_path / "whole"), str(tmp_path / "crashed")
    _run(whole, range(1, 5))
    _run(crashed, range(1, 5))
    for name in ("metrics", "events"):
        with open(os.path.join(crashed, f"{name}.jsonl"), "a") as f:
            f.write('{"step": 5, "reward/tot')  # kill -9 in the middle of a write
    assert _steps(os.path.join(crashed, "metrics.jsonl")) == [1, 2, 3, 4]
    assert len(read_jsonl(os.path.join(crashed, "events.jsonl"))) == 4

    with pytest.warns(RuntimeWarning, match="partial last line"):
        _run(crashed, range(5, 6), resume_step=4)
    _run(whole, range(5, 6), resume_step=4)
    assert _read_bytes(f"{crashed}/metrics.jsonl") == _read_bytes(f"{whole}/metrics.jsonl")
    events = read_jsonl(os.path.join(crashed, "events.jsonl"))  # torn tail gone, so every line parses
    assert [e["kind"] for e in events] == ["weights"] * 4 + ["resume", "torn_rows", "weights"]
    assert events[5]["rows"] == {"metrics": 1, "events": 1}
    assert "have no metrics row" not in events[5]["message"]  # the row cut was step 5's, after the resume point


def test_a_row_cut_mid_line_at_the_resume_step_is_counted_warned_and_logged(tmp_path):
    """Checkpoint 4 exists but metrics.jsonl was cut inside step 4's row (a copy cut short): resuming after
    step 4 leaves step 4 without a row, which the logger says, rather than continuing over a silent hole."""
    out = str(tmp_path)
    _run(out, range(1, 5))
    path = os.path.join(out, "metrics.jsonl")
    text = open(path).read()
    open(path, "w").write(text[:text.rindex("\n", 0, len(text) - 1) + 1] + text.splitlines()[-1][:12])
    with pytest.warns(RuntimeWarning, match=r"partial last line .* of metrics.jsonl; metrics.jsonl now ends at "
                                            r"step 3 and the run continues after step 4, so steps 4..4 have no"):
        _run(out, range(5, 7), resume_step=4)
    assert _steps(path) == [1, 2, 3, 5, 6]
    (torn,) = [e for e in read_jsonl(os.path.join(out, "events.jsonl")) if e["kind"] == "torn_rows"]
    assert torn["rows"] == {"metrics": 1} and torn["step"] == 4 and "steps 4..4" in torn["message"]


def test_complete_last_row_without_newline_is_kept(tmp_path):
    _run(str(tmp_path), range(1, 3))
    with open(tmp_path / "metrics.jsonl", "a") as f:
        f.write('{"step": 3}')  # died between the row and its newline
    assert _steps(str(tmp_path / "metrics.jsonl")) == [1, 2, 3]
    with RunLogger(str(tmp_path), tensorboard=False, progress=False, resume_step=3) as log:
        log.log(4, {})
    assert _steps(str(tmp_path / "metrics.jsonl")) == [1, 2, 3, 4]


def test_corrupt_middle_line_raises_naming_the_line(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 1}\n{"step": 2, oops}\n{"step": 3}\n')
    with pytest.raises(ValueError, match=r"metrics.jsonl:2"):
        read_jsonl(str(path))
    with pytest.raises(ValueError, match=r"metrics.jsonl:2"):
        RunLogger(str(tmp_path), tensorboard=False, progress=False, resume_step=1)
    assert path.read_text() == '{"step": 1}\n{"step": 2, oops}\n{"step": 3}\n'  # nothing rewritten


def test_fresh_logger_refuses_a_used_dir_and_resume_zero_restarts(tmp_path):
    _run(str(tmp_path), range(1, 3))
    before = _read_bytes(tmp_path / "metrics.jsonl")
    with pytest.raises(FileExistsError, match="resume_step"):
        RunLogger(str(tmp_path), tensorboard=False, progress=False)
    assert _read_bytes(tmp_path / "metrics.jsonl") == before
    _run(str(tmp_path), range(1, 2), resume_step=0)
    assert _steps(str(tmp_path / "metrics.jsonl")) == [1]
    assert len(read_jsonl(str(tmp_path / "events.jsonl"))) == 4  # 2 + resume + 1


def test_tensorboard_scalars_and_purge_on_resume(tmp_path):
    with RunLogger(str(tmp_path), progress=False) as log:
        for step in (1, 2):
            log.log(step, {"reward/total": 0.5 * step, "kl": math.nan, "note": "text", "hist": [1, 2]},
                    timings={"rollout_s": 1.5})
    scalars = {}
    for event in _event_file_records(str(tmp_path / "tb")):
        for value in event.summary.value:
            scalars.setdefault(value.tag, []).append((event.step, value.simple_value))
    assert set(scalars) == {"reward/total", "kl", "rollout_s"}
    assert scalars["reward/total"] == [(1, 0.5), (2, 1.0)]
    assert all(math.isnan(v) for _, v in scalars["kl"])

    with RunLogger(str(tmp_path), progress=False, resume_step=1):
        pass
    starts = [e.step for e in _event_file_records(str(tmp_path / "tb"))
              if e.HasField("session_log") and e.session_log.status == SessionLog.START]
    assert starts == [2]


def test_progress_false_prints_nothing_progress_true_shows_figures(tmp_path, capfd):
    with RunLogger(str(tmp_path / "quiet"), progress=False) as log:
        log.log(1, {"reward/total": math.nan, "kl": math.inf})
        log.event(1, "warning", message="nan reward")
    assert capfd.readouterr() == ("", "")
    with RunLogger(str(tmp_path / "bar"), total_steps=4, tensorboard=False) as log:
        log.log(1, {"reward/total": 0.25, "entropy/mean": 1.5, "loss": 3.0})
    err = capfd.readouterr().err
    assert "reward=0.25" in err and "entropy=1.5" in err and "loss" not in err


def _synthetic_rows(steps: int = 12) -> list[dict]:
    rows = []
    for s in range(1, steps + 1):
        row = {"step": s, "reward/total": s / steps, "format_rate": min(1.0, s / 5), "kl": 0.01 * s,
               "lr": 1e-5, "grad_norm": 1.0 / s, "groups/reward_var_mean": 0.2, "groups/zero_var_frac": 0.1,
               "length/mean": 20 + s, "length/min": 5, "length/max": 40, "length/truncated_frac": 0.05}
        for dim in ("format", "correct"):
            row |= {f"reward/{dim}/mean": s / steps, f"reward/{dim}/std": 0.1}
        row |= {f"entropy/p{q}": q / 50 for q in (5, 25, 75, 95)} | {"entropy/mean": 1.0}
        if s % 4 == 0:
            row |= {"eval/accuracy": s / steps, "eval/t1/pass@1": s / steps / 2, "eval/t1/pass@4": s / steps}
        row |= {"entropy_t1/mean": 1.0, "entropy_t1/reasoning/mean": 1.5, "entropy_t1/answer/mean": 0.5}
        if s % 2 == 0:  # measured every gap_every = 2 steps
            row |= {"gap/abs_logp": 1e-3, "gap/kl": 1e-6 * s, "gap/ratio_max": 1.01, "gap/token_out_frac": 0.0}
        rows.append(row)
    return rows


def test_plot_run_writes_the_expected_pngs(tmp_path):
    paths = plot_run(_synthetic_rows(), str(tmp_path))
    names = {os.path.basename(p) for p in paths}
    assert names == {f"{n}.png" for n in ("rewards", "entropy", "groups", "lengths", "format",
                                            "eval_accuracy", "entropy_by_kind", "pass_at_k", "optim", "gap")}
    for p in paths:
        assert os.path.dirname(p) == str(tmp_path / "plots")
        assert _read_bytes(p)[:8] == b"\x89PNG\r\n\x1a\n"
    assert sorted(os.listdir(tmp_path / "plots")) == sorted(names)  # no temp files left behind


def test_plot_run_skips_plots_without_metrics(tmp_path):
    rows = [{"step": s, "reward/total": 0.1 * s, "grad_norm": 1.0, "loss": 2.0} for s in range(1, 4)]
    assert {os.path.basename(p) for p in plot_run(rows, str(tmp_path))} == {"rewards.png", "optim.png"}
    assert plot_run([], str(tmp_path / "empty")) == []
    dims_only = [{"step": s, "reward/format/mean": 0.5, "entropy/p5": 0.1} for s in range(1, 4)]
    assert [os.path.basename(p) for p in plot_run(dims_only, str(tmp_path / "dims"))] == ["rewards.png"]


def test_write_report_md_and_json(tmp_path):
    plots = [str(tmp_path / "plots" / "entropy.png")]
    summary = {"accuracy": {"before": 0.125, "after": np.float32(0.5)}, "steps": 40, "final_kl": math.nan,
               "run": "a|b", "curve": [0.1, 0.2]}
    md_path, json_path = write_report(str(tmp_path), summary, title="Arithmetic GRPO",
                                      sections=[("Notes", "Entropy stayed above 0.5.")], plots=plots)
    md = open(md_path).read()
    assert md.startswith("# Arithmetic GRPO\n")
    for line in ("| accuracy/before | 0.125 |", "| accuracy/after | 0.5 |", "| steps | 40 |",
                 "| final_kl | nan |", "| run | a\\|b |", "## Notes", "Entropy stayed above 0.5.",
                 "![entropy](plots/entropy.png)"):
        assert line in md
    assert "curve" not in md
    assert _strict_json(open(json_path).read()) == {
        "accuracy": {"before": 0.125, "after": 0.5}, "steps": 40, "final_kl": "nan", "run": "a|b",
        "curve": [0.1, 0.2]}
    assert sorted(os.listdir(tmp_path)) == ["report.json", "report.md"]


def test_close_is_idempotent_and_logging_after_close_fails(tmp_path):
    log = RunLogger(str(tmp_path), progress=False)
    log.log(1, {"kl": 0.1})
    log.close()
    log.close()
    with pytest.raises(ValueError):
        log.log(2, {"kl": 0.2})
    assert _steps(str(tmp_path / "metrics.jsonl")) == [1]


@pytest.fixture
def umask_022():
    old = os.umask(0o022)
    yield
    os.umask(old)


def _mode(path) -> int:
    return os.stat(path).st_mode & 0o777


def test_written_files_get_the_umask_modes_and_rewrites_keep_theirs(tmp_path, umask_022):
    """Atomically written files get the umask's modes (0644 under umask 022), not mkstemp's 0600: config.json,
    reports, plots, and the step files a resume rewrites."""
    from grpo_jax.fileio import atomic_write_text

    atomic_write_text(tmp_path / "config.json", "{}")
    md, js = write_report(str(tmp_path), {"steps": 1}, title="t")
    (png,) = plot_run([{"step": s, "format_rate": 0.5} for s in (1, 2)], str(tmp_path))
    for path in (tmp_path / "config.json", md, js, png):
        assert _mode(path) == 0o644, path
    os.umask(0o077)
    atomic_write_text(tmp_path / "private.txt", "x")
    assert _mode(tmp_path / "private.txt") == 0o600  # the umask decides, not a fixed mode
    atomic_write_text(tmp_path / "config.json", "{}")
    assert _mode(tmp_path / "config.json") == 0o644  # a rewritten file keeps its mode
    os.umask(0o022)
    _run(str(tmp_path / "run"), range(1, 4))
    os.chmod(tmp_path / "run" / "samples.jsonl", 0o640)
    _run(str(tmp_path / "run"), range(2, 3), resume_step=1)  # rewrites the step files atomically
    assert _mode(tmp_path / "run" / "metrics.jsonl") == 0o644
    assert _mode(tmp_path / "run" / "samples.jsonl") == 0o640


def test_set_aside_moves_a_runs_outputs_and_nothing_else(tmp_path):
    from grpo_jax.runfolder import has_step_rows, set_aside

    _run(str(tmp_path), range(1, 3))
    (tmp_path / "config.json").write_text("{}")
    (tmp_path / "checkpoints").mkdir()
    before = {n: _read_bytes(tmp_path / n) for n in ("metrics.jsonl", "events.jsonl", "config.json")}
    assert has_step_rows(str(tmp_path))
    dest = set_aside(str(tmp_path), str(tmp_path / "interrupted"))
    again = set_aside(str(tmp_path), str(tmp_path / "interrupted"))  # same second: a distinct folder
    assert dest != again and os.path.dirname(dest) == str(tmp_path / "interrupted")
    assert {n: _read_bytes(os.path.join(dest, n)) for n in before} == before
    assert not has_step_rows(str(tmp_path)) and (tmp_path / "checkpoints").is_dir()
    assert sorted(os.listdir(tmp_path)) == ["checkpoints", "interrupted"]


def test_segments_are_summed_across_processes_and_an_interrupted_one_is_estimated(tmp_path):
    from grpo_jax.runfolder import close_segment, open_segment, run_segments

    out = str(tmp_path)
    open_segment(out, step=0, started_at=1000.0, last_write=None)
    close_segment(out, from_step=0, to_step=5, started_at=1000.0, wall_seconds=50.0, warm_start=True)
    open_segment(out, step=5, started_at=2000.0, last_write=2100.0, warm_start=False)  # resumed at 5, then killed
    open_segment(out, step=7, started_at=3000.0, last_write=2030.0)  # resumed at 7: the killed one ran 30 s
    close_segment(out, from_step=7, to_step=9, started_at=3000.0, wall_seconds=20.0)
    segs = run_segments(read_jsonl(str(tmp_path / "events.jsonl")))
    assert [(s["from_step"], s["to_step"], s["wall_seconds"], s["interrupted"]) for s in segs] == [
        (0, 5, 50.0, False), (5, 7, 30.0, True), (7, 9, 20.0, False)]
    assert segs[0]["warm_start"] is True and segs[1]["warm_start"] is False  # kept from its start event
    open_segment(out, step=0, started_at=4000.0, last_write=None)  # a restart from scratch: a new run
    close_segment(out, from_step=0, to_step=3, started_at=4000.0, wall_seconds=10.0)
    assert [s["wall_seconds"] for s in run_segments(read_jsonl(str(tmp_path / "events.jsonl")))] == [10.0]
