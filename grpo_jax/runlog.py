"""A run's log streams: JSONL files, TensorBoard scalars and a progress bar (the folder's lifecycle is
`runfolder`'s, the plots and reports `reporting`'s).

Layout of ``out_dir`` (every JSONL row carries ``"step"``; keys sorted; one row per line):

    metrics.jsonl   deterministic per-step values only: same config + seed => byte-identical file
    timings.jsonl   wall-clock values, kept apart so they cannot break the above
    samples.jsonl   a few completions per step, one row per sample (group, prompt once per group, rewards, advantage)
    events.jsonl    pause, rollback, weight changes, warnings, resume, segments ... (never truncated)
    run.lock        held by the process running in the folder (``grpo_jax.runlock``), removed when it ends
    interrupted/    logs of a run stopped before its first checkpoint, set aside when one starts over (``runfolder.set_aside``)
    tb/             TensorBoard event files (scalars of metrics and timings, histograms)
    wandb/          with logging.wandb_project: W&B's own files (``grpo_jax.wandb_log`` mirrors the streams)
    plots/*.png     ``reporting.plot_run``;  report.md / report.json: ``reporting.write_report``

Floats are written as Python floats; NaN and +-inf as the strings "nan", "inf", "-inf" so every line is
valid JSON. ``read_jsonl`` turns those strings back into floats (top-level values only: text nested in a
row is left alone) and skips a torn final line, the most a ``kill -9`` can leave behind.

Resuming after step k (``resume_step=k``) drops the rows with step > k from the three step files (atomic
rewrite) so the resumed stream equals an uninterrupted one, appends a "resume" event, and tells TensorBoard
to discard its scalars from step k + 1 on (a purge event; old event files are kept). A file ending in a
partial line (a row cut mid-line) loses that line too; the logger warns and logs a "torn_rows" event with
the count per file and, when metrics.jsonl no longer reaches step k, the steps that have no row.
"""

from __future__ import annotations

import functools
import json
import math
import os
import time
import types
import warnings
from typing import IO, Any, Callable, Sequence

import numpy as np
from tqdm import tqdm
from grpo_jax.fileio import atomic_write

Row = dict[str, Any]

STEP_FILES = ("metrics", "timings", "samples", "problems")  # rows with step > resume_step are dropped on resume
# Live figures in the progress bar: metric name -> short label.
PROGRESS_KEYS = {
    "reward/total": "reward",
    "entropy/mean": "entropy",
    "accuracy": "acc",
    "eval/accuracy": "eval_acc",
    "length/mean": "len",
    "kl": "kl",
}
_NON_FINITE = {"nan": math.nan, "inf": math.inf, "-inf": -math.inf}


class RunLogger:
    """Writes one run's JSONL streams, TensorBoard scalars and progress bar; see the module docstring.

    A fresh logger (``resume_step=None``) refuses an ``out_dir`` whose step files already hold rows, so a
    second run never interleaves with or silently replaces the first; ``resume_step=0`` restarts from
    scratch there, keeping events.jsonl and the old TensorBoard files.
    """

    def __init__(self, out_dir: str, *, total_steps: int | None = None, tensorboard: bool = True,
                 progress: bool = True, resume_step: int | None = None, sinks: Sequence[Any] = ()):
        self.out_dir = out_dir
        self._sinks = list(sinks)  # mirrors of the streams (e.g. wandb_log.WandbSink): log, log_samples, close
        os.makedirs(out_dir, exist_ok=True)
        dropped, torn = _prepare_files(out_dir, resume_step)
        self._files = {name: open(self.path(name), "a", encoding="utf-8", newline="\n")
                       for name in (*STEP_FILES, "events")}
        self._tb = _open_tensorboard(os.path.join(out_dir, "tb"), resume_step) if tensorboard else None
        self._bar = (tqdm(total=total_steps, initial=resume_step or 0, unit="step", dynamic_ncols=True)
                     if progress else None)
        if resume_step is not None:
            self.event(resume_step, "resume", dropped_rows=dropped)
        if torn:
            self._report_torn(torn, resume_step)

    def _report_torn(self, torn: dict[str, int], resume_step: int | None) -> None:
        """Warn about, and log as a "torn_rows" event, the partial last lines just dropped: each was a row cut
        mid-line (a kill during a write, a copy cut short), so the step it held has no row any more."""
        message = (f"{self.out_dir}: dropped the partial last line (a row cut mid-line) of "
                   + ", ".join(f"{name}.jsonl" for name in torn))
        metrics = self.path("metrics")
        if "metrics" in torn and resume_step is not None:
            last = max((row["step"] for row in read_jsonl(metrics)), default=None)
            if last is None or last < resume_step:
                now = "has no rows" if last is None else f"ends at step {last}"
                first = 0 if last is None else last + 1
                message += (f"; metrics.jsonl now {now} and the run continues after step {resume_step}, so steps "
                            f"{first}..{resume_step} have no metrics row")
        self.event(resume_step or 0, "torn_rows", rows=torn, message=message)
        warnings.warn(message, RuntimeWarning, stacklevel=3)

    def path(self, name: str) -> str:
        """Path of one JSONL stream: "metrics", "timings", "samples" or "events"."""
        return os.path.join(self.out_dir, f"{name}.jsonl")

    def log(self, step: int, metrics: dict[str, float | int], *, timings: dict[str, float] | None = None,
            histograms: dict[str, tuple[list, list]] | None = None) -> None:
        """One metrics row (and one timings row when given), their TensorBoard scalars, the progress bar.

        histograms: {name: (bin edges [n + 1], bin fractions [n])}. The fractions go into the metrics row
        under `name`, rounded to 5 decimals (the edges are fixed per name, so they are not repeated every
        step), and to TensorBoard as a histogram."""
        if "step" in metrics or (timings and "step" in timings):
            raise ValueError("log: 'step' is reserved for the step number, not a metric name")
        step = int(step)
        metrics = {k: _native(v) for k, v in metrics.items()}
        metrics.update({k: [round(float(x), 5) for x in fr] for k, (_, fr) in (histograms or {}).items()})
        timings = {k: _native(v) for k, v in (timings or {}).items()}
        self._write("metrics", [{"step": step, **metrics}])
        if timings:
            self._write("timings", [{"step": step, **timings}])
        self._add_scalars(step, {**metrics, **timings})
        for sink in self._sinks:
            sink.log(step, {**metrics, **timings})
        for name, (edges, fractions) in (histograms or {}).items():
            self._add_histogram(step, name, edges, fractions)
        self._update_bar(step, metrics)

    def log_samples(self, step: int, samples: list[dict]) -> None:
        """A few completions of this step, one row each (e.g. prompt, completion, rewards)."""
        self._write("samples", [{"step": int(step), **sample} for sample in samples])
        for sink in self._sinks:
            sink.log_samples(step, samples)

    def log_problems(self, step: int, per_problem: dict) -> None:
        """One problems.jsonl row: an evaluation's result per held-out problem, in the eval split's order
        (e.g. greedy_correct [N] as 0/1, t1_correct [N] counts of k), for paired statistics across runs."""
        self._write("problems", [{"step": int(step), **{k: np.asarray(v).astype(int).tolist()
                                                         for k, v in per_problem.items()}}])

    def event(self, step: int, kind: str, **info: Any) -> None:
        """Something that happened once: pause, rollback, branch, weight change, warning, resume, ..."""
        self._write("events", [_event_row(step, kind, info)])

    def close(self) -> None:
        """Flushes and closes everything; safe to call twice."""
        for f in self._files.values():
            f.close()
        if self._tb is not None:
            self._tb.close()
            self._tb = None
        if self._bar is not None:
            self._bar.close()
            self._bar = None
        while self._sinks:
            self._sinks.pop().close()

    def __enter__(self) -> RunLogger:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _write(self, name: str, rows: list[Row]) -> None:
        f = self._files[name]
        f.write("".join(_dumps(row) + "\n" for row in rows))
        f.flush()  # a kill -9 then loses at most the line being written

    def _add_scalars(self, step: int, values: Row) -> None:
        if self._tb is None:
            return
        summary = _tensorboard().summary_pb2.Summary
        scalars = [summary.Value(tag=k, simple_value=float(v)) for k, v in values.items() if is_number(v)]
        self._tb.add_summary(summary(value=scalars), global_step=step)

    def _add_histogram(self, step: int, name: str, edges: list, fractions: list) -> None:
        """A TensorBoard histogram of bin fractions: bucket i covers [edges[i], edges[i + 1])."""
        if self._tb is None:
            return
        centres = [(lo + hi) / 2 for lo, hi in zip(edges[:-1], edges[1:])]
        total = float(sum(fractions))
        protos = _tensorboard().summary_pb2
        histo = protos.HistogramProto(min=float(edges[0]), max=float(edges[-1]), num=total,
                               sum=float(sum(c * f for c, f in zip(centres, fractions))),
                               sum_squares=float(sum(c * c * f for c, f in zip(centres, fractions))),
                               bucket_limit=[float(e) for e in edges[1:]], bucket=[float(f) for f in fractions])
        self._tb.add_summary(protos.Summary(value=[protos.Summary.Value(tag=name, histo=histo)]), global_step=step)

    def _update_bar(self, step: int, metrics: Row) -> None:
        if self._bar is None:
            return
        shown = {label: f"{metrics[k]:.3g}" for k, label in PROGRESS_KEYS.items()
                 if is_number(metrics.get(k))}
        self._bar.update(step - self._bar.n)
        self._bar.set_postfix(shown)


def read_jsonl(path: str) -> list[Row]:
    """Rows of a JSONL file; a torn final line is skipped, "nan"/"inf"/"-inf" values become floats."""
    return [{k: _NON_FINITE.get(v, v) if isinstance(v, str) else v for k, v in row.items()}
            for _, row in _parse_lines(path)]


def _event_row(step: int, kind: str, info: dict) -> Row:
    return {"wall_time": time.time(), **info, "step": int(step), "kind": kind}


def append_event(out_dir: str, step: int, kind: str, **info: Any) -> None:
    """One events.jsonl row, as `RunLogger.event` writes it, also when no logger is open (e.g. after run())."""
    with open(os.path.join(out_dir, "events.jsonl"), "a", encoding="utf-8", newline="\n") as f:
        f.write(_dumps(_event_row(step, kind, info)) + "\n")


# ---- JSONL files ----------------------------------------------------------------------------------------


def _native(v: Any) -> Any:
    """numpy / jax scalars and arrays -> Python numbers and lists."""
    return v.tolist() if hasattr(v, "tolist") else v


def plain(v: Any) -> Any:
    """A JSON-safe copy: Python scalars, lists and str-keyed dicts; non-finite floats as strings."""
    v = _native(v)
    if isinstance(v, dict):
        return {str(k): plain(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [plain(x) for x in v]
    if isinstance(v, float) and not math.isfinite(v):
        return "nan" if math.isnan(v) else ("inf" if v > 0 else "-inf")
    if v is None or isinstance(v, (bool, int, float, str)):
        return v
    return str(v)


def _dumps(row: Row) -> str:
    # ensure_ascii: every line is ASCII, so a torn write never splits a multi-byte character.
    return json.dumps(plain(row), sort_keys=True, allow_nan=False, ensure_ascii=True)


def is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _parse_lines(path: str) -> list[tuple[str, Row]]:
    """(line, row) pairs; a torn final line (no newline, invalid JSON) is dropped, other bad lines raise."""
    return _read_rows(path)[0]


def _read_rows(path: str) -> tuple[list[tuple[str, Row]], bool]:
    """`_parse_lines`, and whether it dropped a torn final line (the row being written when a process died)."""
    with open(path, encoding="utf-8") as f:
        lines = f.read().splitlines(keepends=True)
    parsed = []
    for i, line in enumerate(lines):
        if not line.strip():
            continue
        try:
            parsed.append((line, json.loads(line)))
        except json.JSONDecodeError as e:
            if i == len(lines) - 1 and not line.endswith("\n"):
                return parsed, True
            raise ValueError(f"{path}:{i + 1}: invalid JSON ({e.msg})") from None
    return parsed, False


def _keep_rows(path: str, keep: Callable[[Row], bool]) -> tuple[int, bool]:
    """Rewrites ``path`` atomically with the rows ``keep`` accepts, minus any torn tail; returns (# rows
    dropped, whether a torn tail was)."""
    if not os.path.exists(path):
        return 0, False
    parsed, torn = _read_rows(path)
    kept = [line if line.endswith("\n") else line + "\n" for line, row in parsed if keep(row)]
    with open(path, encoding="utf-8") as f:
        unchanged = f.read() == "".join(kept)
    if not unchanged:
        atomic_write(path, text_writer("".join(kept)))
    return len(parsed) - len(kept), torn


def _prepare_files(out_dir: str, resume_step: int | None) -> tuple[dict[str, int], dict[str, int]]:
    """Makes the step files end at ``resume_step`` and removes torn tails; returns (rows dropped per step
    file, {name: 1} for each stream, events included, whose torn tail went)."""
    paths = {name: os.path.join(out_dir, f"{name}.jsonl") for name in (*STEP_FILES, "events")}
    if resume_step is None:
        busy = [paths[n] for n in STEP_FILES if os.path.exists(paths[n]) and _parse_lines(paths[n])]
        if busy:
            raise FileExistsError(f"{busy[0]} already holds rows of a run; pass resume_step=k to continue "
                                  "after step k (0 restarts; the trainer's --resume does this from the newest "
                                  "checkpoint) or choose another out_dir")
    results = {name: _keep_rows(p, lambda row: name == "events" or resume_step is None or row["step"] <= resume_step)
               for name, p in paths.items()}  # events: only a torn tail goes
    dropped = {name: n for name, (n, _) in results.items() if name != "events"}
    return dropped, {name: 1 for name, (_, torn) in results.items() if torn}


def text_writer(s: str) -> Callable[[IO[bytes]], None]:
    return lambda f: f.write(s.encode("utf-8"))


@functools.cache
def _tensorboard():
    """tensorboardX, imported on first use: the import takes ~2 s (it loads torch when installed), which a
    run without TensorBoard, or one the folder lock refuses, should not pay. A namespace with `FileWriter`
    and the `event_pb2` / `summary_pb2` proto modules."""
    import tensorboardX  # imported here: see the docstring
    from tensorboardX.proto import event_pb2, summary_pb2  # imported here: see the docstring
    return types.SimpleNamespace(FileWriter=tensorboardX.FileWriter, event_pb2=event_pb2, summary_pb2=summary_pb2)


def _open_tensorboard(tb_dir: str, resume_step: int | None):
    # FileWriter + hand-built Summary protos rather than SummaryWriter.add_scalar, which logs a warning
    # to stderr for every NaN (a diverging run would flood the terminal).
    tb = _tensorboard()
    Event, SessionLog = tb.event_pb2.Event, tb.event_pb2.SessionLog
    writer = tb.FileWriter(tb_dir, flush_secs=10)
    if resume_step is not None:
        # The purge event (what SummaryWriter(purge_step=...) writes): TensorBoard discards scalars of the
        # old event files from this step on, so the resumed curve replaces the abandoned one.
        purge = resume_step + 1
        writer.add_event(Event(step=purge, file_version="brain.Event:2"))
        writer.add_event(Event(step=purge, session_log=SessionLog(status=SessionLog.START)))
    return writer
