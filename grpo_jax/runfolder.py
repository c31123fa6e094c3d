"""One run's folder (`--out`): its lock, how a run starts in it (fresh, resumed, rolled back), its log streams
and its checkpoints: `RunFolder`.

Process 0 locks the folder (`runlock`: another process running there is refused at once, or after
`lock_wait` seconds) and holds it until the run ends; process 0 writes the logs, the others log to a scratch
folder removed at the end (they see the same metrics; their checkpoint shards go to the shared set).
"""

from __future__ import annotations

import json
import math
import os
import shutil
import sys
import tempfile
import time
import warnings
from typing import Any

import jax
import jax.numpy as jnp

from grpo_jax import checkpoint as ckpt_lib
from grpo_jax import data as data_lib
from grpo_jax import provenance, reporting, runconfig, runlock, runlog, wandb_log
from grpo_jax.build import lora_note
from grpo_jax.config import RESUME_CRITICAL, TrainConfig, flat_dict, inert_settings, to_dict
from grpo_jax.fileio import atomic_write_text


class RunFolder:
    """`out_dir` for one run of `cfg`: lock it, then `open_checkpoints`, `restore` (resume or rollback) and
    `open_logs`; `save` each checkpoint; `close` at the end."""

    def __init__(self, out_dir: str, cfg: TrainConfig, *, lock_wait: float = 0.0):
        self.out_dir, self.cfg = out_dir, cfg
        self.lock = runlock.acquire(out_dir, wait=lock_wait) if jax.process_index() == 0 else None
        self.ckpt: ckpt_lib.Checkpointer | None = None
        self.logger: runlog.RunLogger | None = None
        self.changes: list[runconfig.Change] = []  # what a resume or rollback changes in the run's config

    def release_lock(self) -> None:
        """Let another process run in the folder; idempotent."""
        if self.lock is not None:
            self.lock.release()

    def open_checkpoints(self) -> ckpt_lib.Checkpointer:
        c = self.cfg.checkpoint
        self.ckpt = ckpt_lib.Checkpointer(os.path.join(self.out_dir, "checkpoints"), keep_last=c.keep_last,
                                          keep_best=c.keep_best, best_metric=c.best_metric)
        return self.ckpt

    def restore(self, target, rollback_to: int | None) -> tuple | None:
        """(state, meta, step, notes) of the newest good checkpoint, or of `rollback_to`; None when the folder
        has none to resume. `target` is the state's ShapeDtypeStructs. Refused, before anything in the folder
        changes, when `cfg` changes a key the checkpoint cannot take or the logs are another run's. What `cfg`
        changes in the run's config (`runconfig.current`) is kept in `changes`, for `open_logs` to record.
        Newer checkpoints (corrupt ones skipped, or those a rollback abandons: archived first) are deleted:
        this run rewrites them."""
        ckpt, out_dir = self.ckpt, self.out_dir
        if ckpt.latest_step() is None:
            if rollback_to is not None:
                raise ckpt_lib.CheckpointError(f"--rollback-to {rollback_to}: {out_dir} has no checkpoints")
            return None
        self._check_critical(ckpt.read_meta(rollback_to)["config"])  # before the state's shapes are compared
        saved = runconfig.current(out_dir)
        self.changes = runconfig.changes(saved[0], self.cfg) if saved is not None else []
        state, meta, step = ckpt.restore(target, step=rollback_to, may_lack=("ref_params",))
        notes = []
        if jax.tree_util.tree_leaves(target.ref_params) and not jax.tree_util.tree_leaves(state.ref_params):
            # written while loss.beta was 0 (a KL switched on at a rollback): the reference is the policy restored
            state = state.replace(ref_params=jax.tree.map(jnp.copy, state.params))
            notes.append(("kl_reference", {
                "message": f"checkpoint step {step} holds no KL reference (loss.beta was 0 when it was written): the "
                           f"KL reference is the policy of step {step}"}))
        mismatch = logs_mismatch(out_dir, step, meta, critical=RESUME_CRITICAL)
        if mismatch:
            raise ckpt_lib.CheckpointError(
                f"cannot {'roll back' if rollback_to is not None else 'resume'} {out_dir}: its checkpoints and "
                f"its logs are of different runs: {mismatch}. Move the other run's checkpoints or logs elsewhere, "
                "or choose another --out")
        newer = [s for s in ckpt.steps() if s > step]
        if rollback_to is not None and newer:
            ckpt_lib.archive_branch(out_dir, step, newer)
        for s in newer:
            ckpt.delete(s)
        return state, meta, step, notes

    def _check_critical(self, saved: dict) -> None:
        """CheckpointError, one line naming each key, when `cfg` differs from a checkpoint's config `saved` in
        a key that must match (`config.RESUME_CRITICAL`); a key the checkpoint predates counts as its default."""
        try:
            ckpt_lib.check_compatible(saved, to_dict(self.cfg), RESUME_CRITICAL, defaults=to_dict(TrainConfig()))
        except ckpt_lib.CheckpointError as e:
            raise ckpt_lib.CheckpointError(
                f"{self.out_dir}: {e} (the run's config is its config.json with the changes in "
                f"{runconfig.HISTORY}; --resume and --rollback-to on the command line start from it)") from None

    def fresh_start(self, *, resume: bool) -> list[tuple[str, dict]]:
        """Before a run starts at step 0 in the folder: the (event kind, info) notes to log and warn. Every
        process decides (so all of them refuse a folder that holds a run); process 0 moves the files.

        A folder whose logs hold steps but which has no checkpoint was interrupted before its first one
        (Ctrl-C, kill -9, a crash): nothing can be resumed, so its logs are moved to
        <out>/interrupted/<time>/ and the run starts again. A folder with checkpoints is refused unless
        --resume or --rollback-to says what to do with it."""
        prefix = "--resume: " if resume else ""
        if not has_step_rows(self.out_dir):
            if not resume:
                return []
            return [("resume_nothing", {"message": f"--resume: {self.out_dir} has no checkpoint to resume from "
                                                   "(nor logged steps); starting a new run at step 0"})]
        checkpoints = self.ckpt.steps()
        if checkpoints:  # only without --resume: restore would have found them
            raise FileExistsError(
                f"{self.out_dir} already holds a run (checkpoints at steps {checkpoints}, rows in metrics.jsonl): "
                "continue it with --resume (Trainer(resume=True)), go back to a checkpoint with --rollback-to STEP, "
                "or choose another --out")
        if jax.process_index() != 0:
            return []
        moved = set_aside(self.out_dir, os.path.join(self.out_dir, "interrupted"))
        return [("restart", {"previous_logs": moved, "message": (
            f"{prefix}{self.out_dir} holds the logs of a run stopped before its first checkpoint (nothing to "
            f"resume); they were moved to {moved} and the run starts again at step 0")})]

    def open_logs(self, start: int | None, notes: list, *, quiet: bool, rollback: bool, data_report: dict,
                  specs) -> runlog.RunLogger:
        """The log streams from `start` (None: a fresh run, which writes config.json and the data report);
        `notes` (event kind, info) are logged and warned; every start records the manifest."""
        cfg, out_dir, pid = self.cfg, self.out_dir, jax.process_index()
        os.makedirs(out_dir, exist_ok=True)
        if start is None:  # and which of the settings act on (almost) nothing
            notes = [*notes, *(("inert_setting", {"message": m}) for m in inert_settings(cfg)),
                     *(("lora_off", {"message": m}) for m in [lora_note(cfg)] if m)]
        log_dir = out_dir if pid == 0 else tempfile.mkdtemp(prefix=f"grpo-jax-process-{pid}-")
        sinks = ([wandb_log.WandbSink(cfg.logging.wandb_project, out_dir, config=to_dict(cfg), start_step=start or 0)]
                 if cfg.logging.wandb_project and log_dir == out_dir else [])
        self.logger = logger = runlog.RunLogger(
            log_dir, total_steps=cfg.steps, tensorboard=cfg.logging.tensorboard,
            progress=cfg.logging.progress and not quiet and log_dir == out_dir, resume_step=start, sinks=sinks)
        for kind, info in notes:
            logger.event(start or 0, kind, **info)
            warnings.warn(info["message"], RuntimeWarning, stacklevel=3)
        if rollback:
            logger.event(start, "rollback", to_step=start, config=to_dict(cfg))
        if start is not None and self.changes and pid == 0:
            self._record_changes(logger, start, "rollback" if rollback else "resume")
        if start is None and pid == 0:
            atomic_write_text(os.path.join(out_dir, "config.json"), json.dumps(to_dict(cfg), indent=2, sort_keys=True))
            logger.event(0, "data", **data_report)
        if pid == 0 and not quiet:  # what cleaning and the prompt limit did to the data, seen before training on it
            lines = [data_lib.cleaning_summary(setting, data_report.get(key, {})) for setting, key in
                     (("task.train_path", "sanitize"), ("task.eval_path", "eval_sanitize"))]
            for line in [*lines, data_lib.length_summary(data_report.get("prompt_lengths"))]:
                if line:
                    print(line, file=sys.stderr, flush=True)
            line = data_lib.holdout_summary(data_report.get("eval_holdout", {}))
            if line:
                print(line, file=sys.stderr, flush=True)
        if pid == 0:  # every start (a resume may run other code): <out>/manifest.json
            for kind, problem in provenance.record_start(out_dir, cfg, specs, start_step=start or 0):
                logger.event(start or 0, kind, message=problem)
                warnings.warn(problem, RuntimeWarning, stacklevel=3)
        return logger

    def _record_changes(self, logger: runlog.RunLogger, step: int, at: str) -> None:
        """What this resume or rollback changes in the run's config: a "config_changed" event and a line of
        config_history.jsonl (with the whole config from now on: what the next --resume starts from).
        config.json is left as the run started."""
        changes = runconfig.as_record(self.changes)
        logger.event(step, "config_changed", at=at, changes=changes)
        path, before = os.path.join(self.out_dir, runconfig.HISTORY), ""
        if os.path.exists(path):  # rewritten whole (atomically): a reader never sees half a line
            with open(path, encoding="utf-8") as f:
                before = f.read()
        entry = {"step": step, "at": at, "wall_time": time.time(), "changes": changes, "config": to_dict(self.cfg)}
        atomic_write_text(path, before + json.dumps(entry, sort_keys=True) + "\n")

    def report(self, summary: dict, *, title: str, sections=(), data_report: dict) -> tuple[str, str]:
        """PNG plots from metrics.jsonl plus report.md / report.json; report.json carries the provenance of the
        process writing it (`provenance.result_provenance`), and a section the data's report."""
        plots = reporting.plot_run(runlog.read_jsonl(os.path.join(self.out_dir, "metrics.jsonl")), self.out_dir)
        data = "```\n" + json.dumps(data_report, indent=1) + "\n```"
        sections = list(sections) + [("Data (rows kept by each stage, difficulty strata)", data)]
        return reporting.write_report(self.out_dir, summary, title=title, sections=sections, plots=plots,
                                   provenance=provenance.result_provenance())

    def close(self) -> None:
        """Close the logs (removing another process's scratch logs) and the checkpointer."""
        self.logger.close()
        if self.logger.out_dir != self.out_dir:
            shutil.rmtree(self.logger.out_dir, ignore_errors=True)
        self.ckpt.close()


# ---- the folder's files: set aside, segments, whether the logs are the checkpoint's run ---------------


def has_step_rows(out_dir: str) -> bool:
    """Whether any step file (metrics, timings, samples) in out_dir holds a row."""
    paths = (os.path.join(out_dir, f"{name}.jsonl") for name in runlog.STEP_FILES)
    return any(os.path.exists(p) and runlog.read_jsonl(p) for p in paths)


# What a run writes beside its checkpoints: moved together by `set_aside`.
RUN_OUTPUTS = tuple(f"{name}.jsonl" for name in (*runlog.STEP_FILES, "events")) + (
    "config.json", runconfig.HISTORY, "manifest.json", "report.md", "report.json", "tb", "wandb", "plots", "alarms",
    "hf")


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


def last_write_time(out_dir: str) -> float | None:
    """The newest modification time among a run's logs and checkpoints (None for an empty folder): when the
    process that last ran there stopped writing. Read it before a new process rewrites anything."""
    paths = [os.path.join(out_dir, f"{name}.jsonl") for name in (*runlog.STEP_FILES, "events")]
    ckpt = os.path.join(out_dir, "checkpoints")
    if os.path.isdir(ckpt):
        paths += [os.path.join(ckpt, p) for p in os.listdir(ckpt)]
    times = [os.path.getmtime(p) for p in paths if os.path.exists(p)]
    return max(times) if times else None


def open_segment(out_dir: str, *, step: int, started_at: float, last_write: float | None, **info: Any) -> None:
    """Logs a "segment_start" event (this process began at `started_at`, epoch seconds, at `step`; `info`
    is kept with it). A previous segment that never logged its end (killed, crashed) gets its "segment" event
    first, marked interrupted, with its wall time estimated as `last_write` (see `last_write_time`) minus its
    start and `to_step` = `step`, the checkpoint this process resumes from."""
    path = os.path.join(out_dir, "events.jsonl")
    events = runlog.read_jsonl(path) if os.path.exists(path) else []
    starts = [i for i, e in enumerate(events) if e.get("kind") == "segment_start"]
    if starts and not any(e.get("kind") == "segment" for e in events[starts[-1]:]):
        prev = {k: v for k, v in events[starts[-1]].items() if k not in ("kind", "step", "wall_time")}
        wall = max(0.0, last_write - prev["started_at"]) if last_write is not None else None
        runlog.append_event(out_dir, step, "segment", **{**prev, "to_step": int(step), "wall_seconds": wall,
                                                  "interrupted": True})
    runlog.append_event(out_dir, step, "segment_start", **info, from_step=int(step), started_at=started_at)


def close_segment(out_dir: str, *, from_step: int, to_step: int, started_at: float, wall_seconds: float,
                  **info: Any) -> None:
    """Logs this process's "segment" event: the steps it took and its wall time."""
    runlog.append_event(out_dir, to_step, "segment", from_step=int(from_step), to_step=int(to_step),
                 wall_seconds=wall_seconds, interrupted=False, started_at=started_at, **info)


def current_run(events: list[runlog.Row]) -> list[runlog.Row]:
    """The events of the run now in the folder: those from its last segment start at step 0 on (a restart
    from scratch begins a new run; the events of the abandoned one are not its own)."""
    fresh = [i for i, e in enumerate(events) if e.get("kind") == "segment_start" and e.get("from_step") == 0]
    return events[fresh[-1] if fresh else 0:]


def run_segments(events: list[runlog.Row]) -> list[runlog.Row]:
    """The "segment" events of the run now in the folder (`current_run`)."""
    return [e for e in current_run(events) if e.get("kind") == "segment"]


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
    rows = {r["step"]: r for r in runlog.read_jsonl(path)} if os.path.exists(path) else {}
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
