"""Checkpoints of the training state (any pytree of jax arrays) plus a JSON metadata dict, on orbax.

One step on disk (an orbax `CheckpointManager` step of three composite items):

  <dir>/<step>/state/    the state pytree (`StandardSave`: OCDBT/zarr3, restored onto the target's shardings)
  <dir>/<step>/meta/     the caller's JSON dict (resolved config, data cursor, controller states, metrics)
  <dir>/<step>/record/   ours: format, step, per-leaf shape/dtype/sha256, sha256 of the meta, the metrics

Atomicity: orbax writes every item into `<step>.orbax-checkpoint-tmp-<time>/` and renames it to `<step>/`
only when all of them are written (on GCS a commit_success.txt plays the rename's part). A save killed at
any point (even kill -9) leaves only the tmp directory, which orbax never lists as a step and our next
`save` removes. Silent corruption (a flipped byte that decompresses fine, a bad copy) is caught by the
sha256 of every leaf, recomputed on restore; truncated or missing files make orbax raise. Either way
`restore(target)` warns and falls back to the newest good step.

Typed PRNG keys (`jax.random.key`) are saved as they are (orbax 0.12 handles them); their checksum covers
`jax.random.key_data`. Meta goes through JSON: tuples come back as lists, dict keys as strings.

Steps only move forward: `save(step)` refuses a step that is not newer than the latest one, so a resumed
run never mixes with a stale future. After a rollback (or a fallback past a corrupt step) `delete` the
newer steps first.
"""

from __future__ import annotations

import dataclasses
import hashlib
import itertools
import json
import logging
import math
import os
import shutil
import sys
import time
import warnings
from collections.abc import Sequence
from typing import Any

import jax
import numpy as np
import orbax.checkpoint as ocp
from jax.experimental import multihost_utils

from grpo_jax.config import UserError

_FORMAT = 1
_STATE, _META, _RECORD = "state", "meta", "record"


class CheckpointError(UserError, RuntimeError):
    """A bad checkpoint directory, step or resume; the message names which and what is wrong."""


class _BadStep(CheckpointError):
    """This step cannot be used (unreadable, truncated, checksum mismatch); an older one may still be good."""


# --------------------------------------------------------------------------------------------------
# checksums
# --------------------------------------------------------------------------------------------------

def _host_bytes(x) -> np.ndarray:
    """The leaf's values as one flat uint8 host array (gathered across processes if need be)."""
    if jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key):
        x = jax.random.key_data(x)
    if isinstance(x, jax.Array) and not x.is_fully_addressable:
        x = multihost_utils.process_allgather(x, tiled=True)
    return np.ascontiguousarray(np.asarray(x)).reshape(-1).view(np.uint8)


def _leaf_records(tree) -> dict[str, dict]:
    """keystr(path) -> {shape, dtype, sha256} for every leaf (all must be arrays)."""
    records = {}
    for path, x in jax.tree_util.tree_flatten_with_path(tree)[0]:
        name = jax.tree_util.keystr(path)
        if not isinstance(x, (jax.Array, np.ndarray)):
            raise CheckpointError(f"state leaf {name} is a {type(x).__name__}; checkpointed leaves must be arrays")
        records[name] = {"shape": list(x.shape), "dtype": str(x.dtype),
                         "sha256": hashlib.sha256(_host_bytes(x)).hexdigest()}
    return records


def _meta_digest(meta: dict) -> str:
    # Digest of the JSON round trip, so that tuples/lists and int/str keys hash alike on both sides.
    canonical = json.dumps(json.loads(json.dumps(meta)), sort_keys=True)
    return hashlib.sha256(canonical.encode()).hexdigest()


def _finite_numbers(metrics: dict | None) -> dict[str, float]:
    """The metrics worth ranking by: real, finite numbers only (NaN never becomes 'best')."""
    out = {}
    for name, value in (metrics or {}).items():
        try:
            value = float(value)
        except (TypeError, ValueError):
            continue
        if math.isfinite(value):
            out[str(name)] = value
    return out


# --------------------------------------------------------------------------------------------------
# retention
# --------------------------------------------------------------------------------------------------

@dataclasses.dataclass
class _KeepLastAndBest:
    """An orbax `PreservationPolicy`: the newest `keep_last` steps plus the `keep_best` best by rank.

    `ranks` holds metrics[best_metric] only for steps that reported it as a finite number; ties go to the
    earlier step. Ours rather than orbax's BestN because orbax reads ranks back from a metrics file whose
    corruption would break opening the directory; we read ours tolerantly from the step's record.
    """

    keep_last: int
    keep_best: int
    best_mode: str
    ranks: dict[int, float]

    def should_preserve(self, checkpoints, *, context) -> list[bool]:
        del context
        steps = [c.step for c in checkpoints]
        keep = set(sorted(steps)[-self.keep_last:])
        ranked = sorted((s for s in sorted(steps) if s in self.ranks), key=self.ranks.__getitem__,
                        reverse=self.best_mode == "max")
        keep.update(ranked[: self.keep_best])
        return [s in keep for s in steps]


# --------------------------------------------------------------------------------------------------
# the checkpointer
# --------------------------------------------------------------------------------------------------

def _abstract_leaf(path, leaf) -> jax.ShapeDtypeStruct:
    if isinstance(leaf, jax.ShapeDtypeStruct):
        return leaf
    if isinstance(leaf, jax.Array):
        return jax.ShapeDtypeStruct(leaf.shape, leaf.dtype, sharding=leaf.sharding)
    raise CheckpointError(f"restore target leaf {jax.tree_util.keystr(path)} is a {type(leaf).__name__}; "
                          "expected a jax.Array or a jax.ShapeDtypeStruct with a sharding")


def _target_problems(abstract, saved: dict[str, dict]) -> list[str]:
    leaves, _ = jax.tree_util.tree_flatten_with_path(abstract)
    wanted = {jax.tree_util.keystr(p): (list(x.shape), str(x.dtype)) for p, x in leaves}
    problems = [f"{k}: in the target, not in the checkpoint" for k in wanted if k not in saved]
    problems += [f"{k}: in the checkpoint, not in the target" for k in saved if k not in wanted]
    for k, (shape, dtype) in wanted.items():
        if k in saved and (saved[k]["shape"], saved[k]["dtype"]) != (shape, dtype):
            problems.append(f"{k}: checkpoint has {saved[k]['dtype']}{saved[k]['shape']}, target {dtype}{shape}")
    return problems


def _frames(tb) -> set[str]:
    names = set()
    while tb is not None:
        names.add(tb.tb_frame.f_code.co_name)
        tb = tb.tb_next
    return names


def _is_abandoned_read(unraisable) -> bool:
    """An orbax restore that fails on one array closes its asyncio loop while tensorstore still has reads of
    the other arrays in flight; each read that finishes later tries `loop.call_soon_threadsafe` on the
    closed loop and Python prints a `RuntimeError: Event loop is closed` traceback (dozens per bad step)."""
    if not isinstance(unraisable.exc_value, RuntimeError) or str(unraisable.exc_value) != "Event loop is closed":
        return False
    return "call_soon_threadsafe" in _frames(unraisable.exc_traceback)


class _AbandonedReadLogs(logging.Filter):
    """The same race seen from asyncio's logger: a read of the failed restore that failed too, after nobody
    waits for it any more, is logged as "Task exception was never retrieved" with its traceback through orbax's
    `async_deserialize`. Those records are dropped; any other asyncio record passes."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        abandoned = (exc is not None and "never retrieved" in record.getMessage()
                     and "async_deserialize" in _frames(exc.__traceback__))
        return not abandoned


_QUIET_HOOK_INSTALLED = False


def _quiet_abandoned_reads() -> None:
    """From the first restore on, drop those tracebacks (only those: every other unraisable exception goes to
    the previous hook); the failure itself is reported once, by the fallback warning. Installed before the
    restore, not when it fails: the other reads can hit the closed loop before the failure propagates (CI saw
    one traceback slip through that race)."""
    global _QUIET_HOOK_INSTALLED
    if _QUIET_HOOK_INSTALLED:
        return
    previous = sys.unraisablehook

    def hook(unraisable):
        if not _is_abandoned_read(unraisable):
            previous(unraisable)

    sys.unraisablehook = hook
    logging.getLogger("asyncio").addFilter(_AbandonedReadLogs())
    _QUIET_HOOK_INSTALLED = True


def _short(e: BaseException) -> str:
    text = " ".join(str(e).split())
    return f"{type(e).__name__}: {text[:300]}{'...' if len(text) > 300 else ''}"


class Checkpointer:
    """Synchronous, atomic, checksummed checkpoints of (state pytree, meta dict) in one directory.

    One process group writes a directory; any number may read it. Retention keeps the newest `keep_last`
    steps plus the `keep_best` best by `metrics[best_metric]` (`best_mode` "max" or "min").
    """

    def __init__(self, directory: str, *, keep_last: int = 3, keep_best: int = 0,
                 best_metric: str | None = None, best_mode: str = "max"):
        if keep_last < 1:
            raise ValueError(f"keep_last must be >= 1 (the newest step is what a resume needs), got {keep_last}")
        if keep_best < 0:
            raise ValueError(f"keep_best must be >= 0, got {keep_best}")
        if keep_best and not best_metric:
            raise ValueError(f"keep_best={keep_best} needs best_metric (the metrics key to rank by)")
        if best_mode not in ("max", "min"):
            raise ValueError(f"best_mode must be 'max' or 'min', got {best_mode!r}")
        self.directory = os.path.abspath(str(directory))  # orbax needs absolute paths
        self.best_metric = best_metric
        self._policy = _KeepLastAndBest(keep_last, keep_best, best_mode, ranks={})
        options = ocp.CheckpointManagerOptions(enable_async_checkpointing=False, preservation_policy=self._policy)
        try:
            self._manager = ocp.CheckpointManager(self.directory, options=options)
        except Exception as e:  # orbax/epath raise assorted OSError/ValueError types for a bad path
            raise CheckpointError(f"cannot open checkpoint directory {self.directory}: {_short(e)}") from e
        self._cleaned_tmp = False
        if keep_best:
            for step in self.steps():
                self._remember_rank(step)

    # ------------------------------------------------------------------ listing
    def steps(self) -> list[int]:
        """Committed steps on disk, ascending (re-read each call; tmp dirs of unfinished saves excluded)."""
        self._manager.reload()
        return sorted(self._manager.all_steps())

    def latest_step(self) -> int | None:
        steps = self.steps()
        return steps[-1] if steps else None

    # ------------------------------------------------------------------ save
    def save(self, step: int, state, *, meta: dict, metrics: dict | None = None) -> None:
        """Write `state` and `meta` as `step`, then apply retention. Returns when the step is on disk."""
        step = int(step)
        latest = self.latest_step()
        if latest is not None and step <= latest:
            raise CheckpointError(f"cannot save step {step} in {self.directory}: it is not newer than the latest "
                                  f"checkpoint {latest} (after a rollback, delete the newer steps first)")
        try:
            json.dumps(meta)
        except (TypeError, ValueError) as e:
            raise CheckpointError(f"meta for step {step} in {self.directory} is not JSON-serialisable: {e}") from e
        scores = _finite_numbers(metrics)
        record = {"format": _FORMAT, "step": step, "leaves": _leaf_records(state),
                  "meta_sha256": _meta_digest(meta), "metrics": scores}
        self._remove_stale_tmp()
        if self.best_metric in scores:
            self._policy.ranks[step] = scores[self.best_metric]
        args = ocp.args.Composite(**{_STATE: ocp.args.StandardSave(state), _META: ocp.args.JsonSave(meta),
                                     _RECORD: ocp.args.JsonSave(record)})
        try:
            saved = self._manager.save(step, args=args, force=True)
        except Exception as e:  # re-raised with the directory and step named
            raise CheckpointError(f"saving step {step} in {self.directory} failed: {_short(e)}") from e
        if not saved:
            raise CheckpointError(f"orbax declined to save step {step} in {self.directory}")

    def delete(self, step: int) -> None:
        """Remove one committed step (e.g. the steps after a rollback point)."""
        if step not in self.steps():
            raise CheckpointError(f"no checkpoint for step {step} in {self.directory} (have {self.steps()})")
        self._manager.delete(step)
        self._policy.ranks.pop(step, None)

    def _remove_stale_tmp(self) -> None:
        # Left by saves killed mid-write in an earlier process; only the writer removes them, and only
        # before its first save, so a reader opening the directory never races a live save.
        if self._cleaned_tmp:
            return
        self._cleaned_tmp = True
        if jax.process_index() == 0:
            for tmp in ocp.path.step.all_temporary_paths(self.directory):
                tmp.get().rmtree(missing_ok=True)

    # ------------------------------------------------------------------ restore
    def restore(self, target, *, step: int | None = None, may_lack: tuple[str, ...] = ()) -> tuple[Any, dict, int]:
        """(state, meta, step used). Restored arrays take the target leaves' shardings.

        `target`: the state's structure with jax.ShapeDtypeStruct (carrying .sharding) or jax.Array leaves;
        shapes and dtypes must match the checkpoint exactly. step=None: the newest good step, warning about
        each newer one that is unusable; an explicit step that is unusable raises. `may_lack`: fields of a
        dataclass target that a checkpoint may hold nothing of (e.g. a KL reference switched on after it was
        written); such a field comes back empty ({}) for the caller to fill.
        """
        abstract = jax.tree_util.tree_map_with_path(_abstract_leaf, target)
        (state, meta), used = self._newest_good(step, lambda s: self._restore_step(s, abstract, may_lack))
        return state, meta, used

    def read_meta(self, step: int | None = None) -> dict:
        """Only the JSON metadata of `step` (default: the newest step whose metadata is readable)."""
        meta, _ = self._newest_good(step, self._read_meta_step)
        return meta

    def close(self) -> None:
        self._manager.close()

    def __enter__(self) -> Checkpointer:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _newest_good(self, step: int | None, load) -> tuple[Any, int]:
        """(load(s), s) for `step`, or for the newest step that `load` does not reject as bad."""
        steps = self.steps()
        if step is not None:
            if step not in steps:
                raise CheckpointError(f"no checkpoint for step {step} in {self.directory} (have {steps})")
            return load(step), step
        if not steps:
            raise CheckpointError(f"no checkpoints in {self.directory}")
        failures = []
        for s in reversed(steps):
            try:
                return load(s), s
            except _BadStep as e:
                failures.append(str(e))
                warnings.warn(f"{e}; trying an older checkpoint", RuntimeWarning, stacklevel=3)
        raise CheckpointError(f"no usable checkpoint in {self.directory}:\n  " + "\n  ".join(failures))

    def _load_item(self, step: int, name: str):
        try:
            restored = self._manager.restore(step, args=ocp.args.Composite(**{name: ocp.args.JsonRestore()}))
            return restored[name]
        except Exception as e:  # a missing/garbled file surfaces as many exception types
            raise _BadStep(f"checkpoint step {step} in {self.directory}: cannot read {name}: {_short(e)}") from e

    def _load_record(self, step: int) -> dict:
        record = self._load_item(step, _RECORD)
        if not isinstance(record, dict) or record.get("format") != _FORMAT or record.get("step") != step:
            raise _BadStep(f"checkpoint step {step} in {self.directory}: its record is malformed or names "
                           f"another step/format")
        return record

    def _read_meta_step(self, step: int) -> dict:
        record, meta = self._load_record(step), self._load_item(step, _META)
        if _meta_digest(meta) != record["meta_sha256"]:
            raise _BadStep(f"checkpoint step {step} in {self.directory}: meta checksum mismatch")
        return meta

    def _restore_step(self, step: int, abstract, may_lack: tuple[str, ...] = ()) -> tuple[Any, dict]:
        record = self._load_record(step)
        absent = [f for f in may_lack if not any(k.startswith(f".{f}[") or k == f".{f}" for k in record["leaves"])]
        if absent:
            abstract = abstract.replace(**{f: {} for f in absent})
        problems = _target_problems(abstract, record["leaves"])
        if problems:  # the caller's target is wrong; an older step would not fix that
            raise CheckpointError(f"restore target does not match checkpoint step {step} in {self.directory}:\n  "
                                  + "\n  ".join(problems))
        state, meta = self._restore_tolerating_empty_fields(step, abstract)
        got = _leaf_records(state)
        bad = [k for k, r in record["leaves"].items() if got[k]["sha256"] != r["sha256"]]
        if bad:
            raise _BadStep(f"checkpoint step {step} in {self.directory}: checksum mismatch in {', '.join(bad)}")
        if _meta_digest(meta) != record["meta_sha256"]:
            raise _BadStep(f"checkpoint step {step} in {self.directory}: meta checksum mismatch")
        return state, meta

    def _restore_tolerating_empty_fields(self, step: int, abstract) -> tuple[Any, dict]:
        """Restore onto `abstract`; if orbax finds the tree structures differ, retry without some of the
        target's fields that hold no leaves. _target_problems has already required the same leaves on both
        sides, so the structures can differ only by such an empty field that one side lacks: e.g.
        TrainState.base = {} (no LoRA), a field newer than the checkpoints written before LoRA existed,
        whose empty ref_params = {} the checkpoint does hold. Each subset of the empty fields is tried (there
        are at most a few); the target's empty values are kept in the result."""
        try:
            return self._restore_items(step, abstract)
        except ValueError as e:  # only orbax's tree-structure mismatch reaches here
            error = e
        if dataclasses.is_dataclass(abstract):
            fields = {f.name: getattr(abstract, f.name) for f in dataclasses.fields(abstract)}
            empty = [k for k, v in fields.items() if not jax.tree_util.tree_leaves(v)]
            for n_dropped in range(1, len(empty) + 1):
                for dropped in itertools.combinations(empty, n_dropped):
                    try:
                        state, meta = self._restore_items(step, {k: v for k, v in fields.items() if k not in dropped})
                    except ValueError:
                        continue
                    return abstract.replace(**state), meta
        raise _BadStep(f"checkpoint step {step} in {self.directory}: restore failed: {_short(error)}") from error

    def _restore_items(self, step: int, abstract) -> tuple[Any, dict]:
        args = ocp.args.Composite(**{_STATE: ocp.args.StandardRestore(abstract), _META: ocp.args.JsonRestore()})
        _quiet_abandoned_reads()  # before the restore: the abandoned reads may finish before its exception reaches us
        try:
            restored = self._manager.restore(step, args=args)
        except Exception as e:  # truncated / missing array files: tensorstore and orbax raise many types
            if isinstance(e, ValueError) and "tree structures do not match" in str(e):
                raise  # _restore_step decides
            raise _BadStep(f"checkpoint step {step} in {self.directory}: restore failed: {_short(e)}") from e
        return restored[_STATE], restored[_META]

    def _remember_rank(self, step: int) -> None:
        try:
            scores = self._load_record(step).get("metrics", {})
        except _BadStep:
            return  # an unreadable step is never kept as "best"
        if self.best_metric in scores:
            self._policy.ranks[step] = scores[self.best_metric]


# --------------------------------------------------------------------------------------------------
# resume safety
# --------------------------------------------------------------------------------------------------

_MISSING = object()


def archive_branch(out_dir: str, step: int, abandoned: Sequence[int]) -> str:
    """Before a rollback to `step` rewrites the run's history, copy what it replaces (the step logs and the
    abandoned checkpoints) to <out_dir>/branches/from-step-<step>-<time>/, so nothing written is lost."""
    dest = os.path.join(out_dir, "branches", f"from-step-{step}-{time.strftime('%Y%m%d-%H%M%S')}")
    os.makedirs(dest, exist_ok=True)
    for name in ("metrics.jsonl", "timings.jsonl", "samples.jsonl"):
        src = os.path.join(out_dir, name)
        if os.path.exists(src):
            shutil.copy2(src, dest)
    for s in abandoned:
        shutil.copytree(os.path.join(out_dir, "checkpoints", str(s)), os.path.join(dest, "checkpoints", str(s)))
    return dest


def _lookup(config: dict, dotted: str):
    node = config
    for part in dotted.split("."):
        if not isinstance(node, dict) or part not in node:
            return _MISSING
        node = node[part]
    return node


def _as_json(value):
    # Saved configs come back from JSON; compare the new one the same way (tuples == lists).
    return value if value is _MISSING else json.loads(json.dumps(value, default=str))


def _show(value) -> str:
    return "<missing>" if value is _MISSING else json.dumps(value)


def check_compatible(saved_config: dict, new_config: dict, keys: Sequence[str], *,
                     defaults: dict | None = None) -> None:
    """Raise CheckpointError naming every dotted key in `keys` whose value differs (or is missing).

    Keys not listed may differ freely (e.g. logging, total steps); the listed ones are those whose change
    would make resuming silently wrong (model shape, group size, advantage estimator, ...). `defaults`: a
    config whose values stand in for keys the saved config lacks (a field added after the checkpoint was
    written; new fields default to what the code did before them, e.g. lora.rank 0).
    """
    diffs = []
    for key in keys:
        old, new = _as_json(_lookup(saved_config, key)), _as_json(_lookup(new_config, key))
        if old is _MISSING and defaults is not None:
            old = _as_json(_lookup(defaults, key))
        if old is _MISSING and new is _MISSING:
            diffs.append(f"{key}: in neither config")
        elif old is _MISSING or new is _MISSING or old != new:
            diffs.append(f"{key}: checkpoint {_show(old)}, now {_show(new)}")
    if diffs:
        raise CheckpointError("cannot resume: the config differs from the checkpoint's in keys that must "
                              "match: " + "; ".join(diffs))
