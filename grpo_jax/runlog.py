"""A run's outputs: JSONL streams, TensorBoard scalars, a progress bar, PNG plots and the end-of-run report.

Layout of ``out_dir`` (every JSONL row carries ``"step"``; keys sorted; one row per line):

    metrics.jsonl   deterministic per-step values only: same config + seed => byte-identical file
    timings.jsonl   wall-clock values, kept apart so they cannot break the above
    samples.jsonl   a few completions per step, one row per sample
    events.jsonl    pause, rollback, weight changes, warnings, resume, segments ... (never truncated)
    run.lock        held by the process running in the folder (``grpo_jax.runlock``), removed when it ends
    interrupted/    logs of a run stopped before its first checkpoint, set aside when one starts over (``set_aside``)
    tb/             TensorBoard event files (scalars of metrics and timings, histograms)
    plots/*.png     ``plot_run``;  report.md / report.json: ``write_report``

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
import urllib.parse
import warnings
from typing import IO, Any, Callable, Iterable

import numpy as np
from tqdm import tqdm
from grpo_jax.config import flat_dict
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
                 progress: bool = True, resume_step: int | None = None):
        self.out_dir = out_dir
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
        for name, (edges, fractions) in (histograms or {}).items():
            self._add_histogram(step, name, edges, fractions)
        self._update_bar(step, metrics)

    def log_samples(self, step: int, samples: list[dict]) -> None:
        """A few completions of this step, one row each (e.g. prompt, completion, rewards)."""
        self._write("samples", [{"step": int(step), **sample} for sample in samples])

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
        scalars = [summary.Value(tag=k, simple_value=float(v)) for k, v in values.items() if _is_number(v)]
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
                 if _is_number(metrics.get(k))}
        self._bar.update(step - self._bar.n)
        self._bar.set_postfix(shown)


def has_step_rows(out_dir: str) -> bool:
    """Whether any step file (metrics, timings, samples) in out_dir holds a row."""
    paths = (os.path.join(out_dir, f"{name}.jsonl") for name in STEP_FILES)
    return any(os.path.exists(p) and _parse_lines(p) for p in paths)


# What a run writes beside its checkpoints: moved together by `set_aside`.
RUN_OUTPUTS = tuple(f"{name}.jsonl" for name in (*STEP_FILES, "events")) + (
    "config.json", "manifest.json", "report.md", "report.json", "tb", "plots", "alarms", "hf")


def set_aside(out_dir: str, dest_root: str) -> str:
    """Moves the run outputs of out_dir (RUN_OUTPUTS that exist) into a new dest_root/<time>/ folder, renamed
    one by one (nothing copied, nothing deleted), and returns that folder. Used when a run folder holds the
    logs of a run that cannot be continued and a new run starts there."""
    stamp = time.strftime("%Y%m%d-%H%M%S")
    dest, n = os.path.join(dest_root, stamp), 1
    while os.path.exists(dest):
        dest, n = os.path.join(dest_root, f"{stamp}-{n}"), n + 1
    os.makedirs(dest)
    for name in RUN_OUTPUTS:
        src = os.path.join(out_dir, name)
        if os.path.exists(src):
            os.replace(src, os.path.join(dest, name))
    return dest


def read_jsonl(path: str) -> list[Row]:
    """Rows of a JSONL file; a torn final line is skipped, "nan"/"inf"/"-inf" values become floats."""
    return [{k: _NON_FINITE.get(v, v) if isinstance(v, str) else v for k, v in row.items()}
            for _, row in _parse_lines(path)]


def plot_run(rows: list[Row], out_dir: str) -> list[str]:
    """PNG plots of a run's metrics rows in ``out_dir/plots``; a plot whose metrics are absent is skipped.

    rewards (reward/<dim>/mean with a +-reward/<dim>/std band, reward/total), entropy (entropy/mean with
    p5-p95 and darker p25-p75 bands), groups (groups/reward_var_mean, groups/zero_var_frac on a twin axis),
    lengths (length/mean, min-max band, length/truncated_frac), format (format_rate), eval_accuracy
    (eval/accuracy, logged every few steps), entropy_by_kind (entropy_t1/<kind>/mean), pass_at_k
    (eval/t1/pass@k beside eval/accuracy), optim (kl, clip_frac_low, clip_frac_high, grad_norm, lr).
    """
    from matplotlib.figure import Figure  # imported here: only the end of a run needs matplotlib

    plot_dir = os.path.join(out_dir, "plots")
    os.makedirs(plot_dir, exist_ok=True)
    paths = []
    for name, draw in _PLOTS:
        fig = Figure(figsize=(7, 4), layout="constrained")
        if draw(fig, rows):
            path = os.path.join(plot_dir, f"{name}.png")
            atomic_write(path, functools.partial(fig.savefig, format="png", dpi=100))
            paths.append(path)
    return paths


def write_report(out_dir: str, summary: dict, *, title: str, sections: Iterable[tuple[str, str]] = (),
                 plots: Iterable[str] = (), provenance: dict | None = None) -> tuple[str, str]:
    """report.md (title, table of the summary's scalars, sections, plots, the provenance's command and
    commit) and report.json (the summary, with the provenance under "provenance" when given)."""
    os.makedirs(out_dir, exist_ok=True)
    lines = [f"# {title}", ""]
    table = _flatten(_plain(summary))
    if table:
        lines += ["| metric | value |", "| --- | --- |"]
        lines += [f"| {_cell(k)} | {_cell(_fmt(v))} |" for k, v in table.items()] + [""]
    for heading, body in sections:
        lines += [f"## {heading}", "", body.strip(), ""]
    if plots:
        lines += ["## Plots", ""]
        lines += [_image(p, out_dir) + "\n" for p in plots]
    if provenance:
        git = provenance.get("git", {})
        lines += ["## Provenance", "", f"`{provenance.get('command')}` at commit {git.get('commit')}"
                  f"{' (uncommitted changes)' if git.get('dirty') else ''}; the rest is in report.json.", ""]
    md_path, json_path = os.path.join(out_dir, "report.md"), os.path.join(out_dir, "report.json")
    atomic_write(md_path, _text("\n".join(lines).rstrip() + "\n"))
    data = _plain(summary) if provenance is None else {**_plain(summary), "provenance": _plain(provenance)}
    atomic_write(json_path, _text(json.dumps(data, sort_keys=True, indent=2) + "\n"))
    return md_path, json_path


# ---- segments: one process's share of a run (the first, then each --resume) -----------------------------


def last_write_time(out_dir: str) -> float | None:
    """The newest modification time among a run's logs and checkpoints (None for an empty folder): when the
    process that last ran there stopped writing. Read it before a new process rewrites anything."""
    paths = [os.path.join(out_dir, f"{name}.jsonl") for name in (*STEP_FILES, "events")]
    ckpt = os.path.join(out_dir, "checkpoints")
    if os.path.isdir(ckpt):
        paths += [os.path.join(ckpt, p) for p in os.listdir(ckpt)]
    times = [os.path.getmtime(p) for p in paths if os.path.exists(p)]
    return max(times) if times else None


def _event_row(step: int, kind: str, info: dict) -> Row:
    return {"wall_time": time.time(), **info, "step": int(step), "kind": kind}


def append_event(out_dir: str, step: int, kind: str, **info: Any) -> None:
    """One events.jsonl row, as `RunLogger.event` writes it, also when no logger is open (e.g. after run())."""
    with open(os.path.join(out_dir, "events.jsonl"), "a", encoding="utf-8", newline="\n") as f:
        f.write(_dumps(_event_row(step, kind, info)) + "\n")


def open_segment(out_dir: str, *, step: int, started_at: float, last_write: float | None, **info: Any) -> None:
    """Logs a "segment_start" event (this process began at `started_at`, epoch seconds, at `step`; `info`
    is kept with it). A previous segment that never logged its end (killed, crashed) gets its "segment" event
    first, marked interrupted, with its wall time estimated as `last_write` (see `last_write_time`) minus its
    start and `to_step` = `step`, the checkpoint this process resumes from."""
    path = os.path.join(out_dir, "events.jsonl")
    events = read_jsonl(path) if os.path.exists(path) else []
    starts = [i for i, e in enumerate(events) if e.get("kind") == "segment_start"]
    if starts and not any(e.get("kind") == "segment" for e in events[starts[-1]:]):
        prev = {k: v for k, v in events[starts[-1]].items() if k not in ("kind", "step", "wall_time")}
        wall = max(0.0, last_write - prev["started_at"]) if last_write is not None else None
        append_event(out_dir, step, "segment", **{**prev, "to_step": int(step), "wall_seconds": wall,
                                                  "interrupted": True})
    append_event(out_dir, step, "segment_start", **info, from_step=int(step), started_at=started_at)


def close_segment(out_dir: str, *, from_step: int, to_step: int, started_at: float, wall_seconds: float,
                  **info: Any) -> None:
    """Logs this process's "segment" event: the steps it took and its wall time."""
    append_event(out_dir, to_step, "segment", from_step=int(from_step), to_step=int(to_step),
                 wall_seconds=wall_seconds, interrupted=False, started_at=started_at, **info)


def current_run(events: list[Row]) -> list[Row]:
    """The events of the run now in the folder: those from its last segment start at step 0 on (a restart
    from scratch begins a new run; the events of the abandoned one are not its own)."""
    fresh = [i for i, e in enumerate(events) if e.get("kind") == "segment_start" and e.get("from_step") == 0]
    return events[fresh[-1] if fresh else 0:]


def run_segments(events: list[Row]) -> list[Row]:
    """The "segment" events of the run now in the folder (`current_run`)."""
    return [e for e in current_run(events) if e.get("kind") == "segment"]


# ---- JSONL files ----------------------------------------------------------------------------------------


def _native(v: Any) -> Any:
    """numpy / jax scalars and arrays -> Python numbers and lists."""
    return v.tolist() if hasattr(v, "tolist") else v


def _plain(v: Any) -> Any:
    """A JSON-safe copy: Python scalars, lists and str-keyed dicts; non-finite floats as strings."""
    v = _native(v)
    if isinstance(v, dict):
        return {str(k): _plain(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_plain(x) for x in v]
    if isinstance(v, float) and not math.isfinite(v):
        return "nan" if math.isnan(v) else ("inf" if v > 0 else "-inf")
    if v is None or isinstance(v, (bool, int, float, str)):
        return v
    return str(v)


def _dumps(row: Row) -> str:
    # ensure_ascii: every line is ASCII, so a torn write never splits a multi-byte character.
    return json.dumps(_plain(row), sort_keys=True, allow_nan=False, ensure_ascii=True)


def _is_number(v: Any) -> bool:
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
        atomic_write(path, _text("".join(kept)))
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


def _text(s: str) -> Callable[[IO[bytes]], None]:
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


# ---- plots ----------------------------------------------------------------------------------------------


def _aligned(rows: list[Row], *keys: str) -> tuple[np.ndarray, ...]:
    """(steps, values of keys[0], values of keys[1], ...) over the rows where every key is a number."""
    picked = [r for r in rows if all(_is_number(r.get(k)) for k in keys)]
    return (np.array([r["step"] for r in picked], float),
            *(np.array([r[k] for r in picked], float) for k in keys))


def _has(rows: list[Row], key: str) -> bool:
    return any(_is_number(r.get(key)) for r in rows)


def _finish(ax: Any, ylabel: str, title: str) -> None:
    ax.set_xlabel("step")
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(alpha=0.3)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize="small")


def _plot_rewards(fig: Any, rows: list[Row]) -> bool:
    dims = sorted({k.split("/")[1] for r in rows for k in r
                   if k.startswith("reward/") and k.endswith("/mean") and k.count("/") == 2})
    if not dims and not _has(rows, "reward/total"):
        return False
    ax = fig.add_subplot()
    for i, dim in enumerate(dims):
        ax.plot(*_aligned(rows, f"reward/{dim}/mean"), color=f"C{i}", label=dim)
        steps, mean, std = _aligned(rows, f"reward/{dim}/mean", f"reward/{dim}/std")
        ax.fill_between(steps, mean - std, mean + std, color=f"C{i}", alpha=0.2, lw=0)
    if _has(rows, "reward/total"):
        ax.plot(*_aligned(rows, "reward/total"), color="black", lw=2, label="total")
    _finish(ax, "reward", "reward per dimension")
    return True


def _plot_entropy(fig: Any, rows: list[Row]) -> bool:
    if not _has(rows, "entropy/mean"):
        return False
    ax = fig.add_subplot()
    for lo, hi, alpha in (("p5", "p95", 0.15), ("p25", "p75", 0.35)):
        steps, low, high = _aligned(rows, f"entropy/{lo}", f"entropy/{hi}")
        if len(steps):
            ax.fill_between(steps, low, high, color="C0", alpha=alpha, lw=0, label=f"{lo}-{hi}")
    ax.plot(*_aligned(rows, "entropy/mean"), color="C0", label="mean")
    _finish(ax, "entropy (nats/token)", "policy entropy")
    return True


def _plot_twin(fig: Any, rows: list[Row], *, left: str, right: str, title: str,
               band: tuple[str, str] | None = None) -> bool:
    """``left`` (with an optional min-max ``band``) on the left axis, ``right`` (a fraction) on a twin."""
    if not any(_has(rows, k) for k in (left, right, *(band or ()))):
        return False
    ax = fig.add_subplot()
    ax.plot(*_aligned(rows, left), color="C0", label=left)
    if band:
        steps, low, high = _aligned(rows, *band)
        ax.fill_between(steps, low, high, color="C0", alpha=0.2, lw=0, label=f"{band[0]}..{band[1]}")
    twin = ax.twinx()
    twin.plot(*_aligned(rows, right), color="C3", ls="--", label=right)
    twin.set_ylabel(right, color="C3")
    _finish(ax, left, title)
    handles = [*ax.get_legend_handles_labels()[0], *twin.get_legend_handles_labels()[0]]
    ax.legend(handles=handles, fontsize="small")
    return True


def _plot_lines(fig: Any, rows: list[Row], *, keys: tuple[str, ...], title: str) -> bool:
    """One panel per present key, sharing the step axis (the keys may differ in scale)."""
    present = [k for k in keys if _has(rows, k)]
    if not present:
        return False
    fig.set_size_inches(7, 1 + 2 * len(present))
    axes = fig.subplots(len(present), 1, sharex=True, squeeze=False)[:, 0]
    for ax, key in zip(axes, present):
        steps, values = _aligned(rows, key)
        ax.plot(steps, values, marker="o" if len(steps) < 30 else None)  # sparse series (eval) as points
        _finish(ax, key, title if ax is axes[0] else "")
    return True


def _plot_overlay(fig: Any, rows: list[Row], *, keys: tuple[str, ...], title: str, ylabel: str) -> bool:
    """The present keys as lines on one axis (the same quantity measured several ways)."""
    present = [k for k in keys if _has(rows, k)]
    if not present:
        return False
    ax = fig.subplots()
    for key in present:
        steps, values = _aligned(rows, key)
        ax.plot(steps, values, marker="o" if len(steps) < 30 else None, label=key)
    _finish(ax, ylabel, title)
    ax.legend(fontsize="small")
    return True


_PLOTS: tuple[tuple[str, Callable[[Any, list[Row]], bool]], ...] = (
    ("rewards", _plot_rewards),
    ("entropy", _plot_entropy),
    ("groups", functools.partial(_plot_twin, left="groups/reward_var_mean", right="groups/zero_var_frac",
                                 title="group reward variance")),
    ("lengths", functools.partial(_plot_twin, left="length/mean", right="length/truncated_frac",
                                  band=("length/min", "length/max"), title="response length")),
    ("format", functools.partial(_plot_lines, keys=("format_rate",), title="format compliance")),
    ("eval_accuracy", functools.partial(_plot_lines, keys=("eval/accuracy",), title="held-out accuracy")),
    ("entropy_by_kind", functools.partial(
        _plot_overlay, keys=("entropy_t1/mean", "entropy_t1/reasoning/mean", "entropy_t1/answer/mean",
                             "entropy_t1/other/mean"), title="policy entropy at T = 1, by kind of token",
        ylabel="mean entropy (nats)")),
    ("pass_at_k", functools.partial(
        _plot_overlay, keys=("eval/accuracy", *(f"eval/t1/pass@{k}" for k in (1, 2, 4, 8, 16, 32))),
        title="held-out pass@k at T = 1 (unbiased) and greedy accuracy", ylabel="fraction of problems")),
    ("optim", functools.partial(_plot_lines, title="optimisation",
                                keys=("kl", "clip_frac_low", "clip_frac_high", "grad_norm", "lr"))),
    ("gap", functools.partial(_plot_lines, title="sampler-trainer gap",
                              keys=("gap/abs_logp", "gap/kl", "gap/ratio_max", "gap/token_out_frac", "is_weight"))),
)


# ---- report ---------------------------------------------------------------------------------------------


def _flatten(d: dict, prefix: str = "") -> dict[str, Any]:
    """Scalar entries of a nested dict, keys joined with "/"; lists are left to report.json."""
    out = {}
    for k, v in d.items():
        if isinstance(v, dict):
            out.update(_flatten(v, f"{prefix}{k}/"))
        elif v is None or isinstance(v, (bool, int, float, str)):
            out[f"{prefix}{k}"] = v
    return out


def _fmt(v: Any) -> str:
    return f"{v:.4g}" if isinstance(v, float) else str(v)


def _cell(s: str) -> str:
    return s.replace("|", "\\|").replace("\n", " ")


def _image(path: str, out_dir: str) -> str:
    rel = os.path.relpath(path, out_dir).replace(os.sep, "/")
    return f"![{os.path.splitext(os.path.basename(path))[0]}]({urllib.parse.quote(rel)})"


def _same_number(a, b) -> bool:
    """Whether two logged numbers are equal ("nan" / "inf" strings read as floats; NaN equals NaN)."""
    try:
        x, y = float(a), float(b)
    except (TypeError, ValueError):
        return a == b
    return x == y or (math.isnan(x) and math.isnan(y))


def logs_mismatch(out_dir: str, step: int, meta: dict, *, critical: tuple[str, ...]) -> str | None:
    """Why out_dir's logs are not those of the run whose checkpoint at `step` (with `meta`) is being restored,
    or None. Within one run: metrics.jsonl reaches the step (a step's row is written before its checkpoint),
    every value of the checkpoint's monitor history equals the row of its step (both are the step's metrics),
    and config.json (written when the run started) agrees with the checkpoint's config on the `critical` keys."""
    path, config_path = os.path.join(out_dir, "metrics.jsonl"), os.path.join(out_dir, "config.json")
    rows = {r["step"]: r for r in read_jsonl(path)} if os.path.exists(path) else {}
    ckpt = f"checkpoint step {step} ({os.path.join(out_dir, 'checkpoints', str(step))})"
    last = max(rows, default=None)
    if last is None or last < step:
        return f"{ckpt} is beyond the last step logged in {path} ({'none' if last is None else last})"
    logged_config = _read_config(config_path)
    history = meta.get("controls", {}).get("monitor", {}).get("history", {})
    for metric, pairs in sorted(history.items()):
        for s, value in pairs:
            if s in rows and metric in rows[s] and not _same_number(value, rows[s][metric]):
                differ = _config_differences(meta["config"], logged_config)
                return (f"{ckpt} recorded {metric} = {value} at step {s}, {path} has {rows[s][metric]}"
                        + (f"; config differences (checkpoint vs {config_path}): {differ}" if differ else ""))
    differ = _config_differences(meta["config"], logged_config, keys=critical)
    return f"{ckpt} and {config_path} differ in keys that must match: {differ}" if differ else None


def _read_config(path: str) -> dict:
    """A run's config.json as a dict; {} when it is missing or unreadable (nothing to compare)."""
    try:
        with open(path, encoding="utf-8") as f:
            config = json.load(f)
    except (OSError, ValueError):
        return {}
    return config if isinstance(config, dict) else {}


def _config_differences(saved: dict, logged: dict, *, keys=None, limit: int = 6) -> str:
    """"key: saved vs logged" for the dotted keys (all, or `keys`) present in both configs with different
    values, at most `limit` of them; "" when none."""
    a, b = flat_dict(saved), flat_dict(logged)
    names = sorted(set(a) & set(b)) if keys is None else [k for k in keys if k in a and k in b]
    diffs = [f"{k}: {json.dumps(a[k])} vs {json.dumps(b[k])}" for k in names if a[k] != b[k]]
    return ", ".join(diffs[:limit]) + (", ..." if len(diffs) > limit else "")
