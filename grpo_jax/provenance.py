"""Run provenance: `<out>/manifest.json`, written (atomically) each time a Trainer starts in a run folder.

`config.json` says what was asked for; the manifest says what actually ran, so a result can be traced to
the code and the rewards that produced it:

- `rewards`: the resolved reward dimensions (`build.reward_specs`: a task's defaults when `rewards.specs`
  is empty), each with the version of the reward that scored it (`rewards.base.reward`: a version is
  bumped whenever a score changes);
- `regression`: the status of each used reward's regression set (`rewards/regression/<name>.jsonl`) in
  this process at start: cases, passed, failed and the failed ids. Inline rewards take milliseconds (math
  about 1 s the first time, the sympy import). Sandboxed rewards are recorded as "skipped (code: sandbox)":
  their 38 cases start 38 sandboxed interpreters, about 4 s on 2 busy cores at every start, for a check
  that `python -m grpo_jax.rewards.regress --only code` (and CI) makes anyway;
- `packages` (jax, jaxlib, flax, optax, orbax-checkpoint, transformers, numpy) and `python`;
- `git`: the commit of the checkout this package runs from and whether it had uncommitted changes (None
  with the reason when it is not a git checkout or git is missing: an installed copy still trains);
- `data`: sha256 and size of `task.train_path` / `task.eval_path` (and of `model.hf_path`'s config.json),
  so a changed file under the same name is visible.

A resumed run (or a rollback) starts again, possibly with other code: its manifest replaces the file and
the earlier ones move into `previous_starts` (oldest first), so no record is lost.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.metadata
import json
import os
import platform
import shlex
import subprocess
import sys
import time
from collections.abc import Sequence
from typing import Any

from grpo_jax.fileio import atomic_write_text
from grpo_jax.rewards import regress
from grpo_jax.rewards.registry import SANDBOXED, RewardSpec, describe

MANIFEST = "manifest.json"
FORMAT = 1
PACKAGES = ("jax", "jaxlib", "flax", "optax", "orbax-checkpoint", "transformers", "numpy")
SANDBOX_SKIP = "skipped (code: sandbox)"
_PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the checkout holding grpo_jax/


def package_versions(names: Sequence[str] = PACKAGES) -> dict[str, str | None]:
    """Installed distribution versions (None when one is not installed) and the Python version."""
    out: dict[str, str | None] = {}
    for name in names:
        try:
            out[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            out[name] = None
    out["python"] = platform.python_version()
    return out


def _git(args: Sequence[str], cwd: str) -> str:
    return subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, check=True, timeout=10).stdout


def git_state(directory: str = _PACKAGE_DIR) -> dict[str, Any]:
    """{"commit", "dirty"} of the git checkout at `directory`; {"commit": None, "error"} when there is none
    (not a checkout, no git binary, git failing): provenance never stops a run."""
    try:
        commit = _git(["rev-parse", "HEAD"], directory).strip()
        dirty = bool(_git(["status", "--porcelain", "--untracked-files=no"], directory).strip())
    except (OSError, subprocess.SubprocessError) as e:  # FileNotFoundError: no git; CalledProcessError: no repo
        detail = getattr(e, "stderr", None) or str(e)
        return {"commit": None, "error": f"{type(e).__name__}: {' '.join(str(detail).split())[:200]}"}
    return {"commit": commit, "dirty": dirty}


def source_digest(root: str = os.path.join(_PACKAGE_DIR, "grpo_jax")) -> str:
    """sha256 of the .py sources under `root` (paths and contents, in sorted order): what `git_state`'s dirty
    flag cannot tell apart, e.g. whether a cached artifact was made by this exact code."""
    h = hashlib.sha256()
    for dirpath, dirnames, files in sorted(os.walk(root)):
        dirnames.sort()
        for name in sorted(f for f in files if f.endswith(".py")):
            path = os.path.join(dirpath, name)
            h.update(os.path.relpath(path, root).encode() + b"\0")
            with open(path, "rb") as f:
                h.update(f.read() + b"\0")
    return h.hexdigest()


def machine() -> dict[str, Any]:
    """The CPU model (from /proc/cpuinfo where there is one), the core count this process may use and the
    platform: timings and bitwise reproducibility are per machine and core count."""
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            cpu = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), cpu)
    except OSError:
        pass  # not Linux: platform's own name stays
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return {"cpu": cpu, "cores": cores, "platform": platform.platform()}


@functools.cache
def result_provenance() -> dict[str, Any]:
    """What a results.json or report.json carries so its figures can be traced and rerun: the git commit
    and dirty state, a sha256 of grpo_jax's sources (which a dirty checkout's commit does not pin), package
    versions, this process's command (`python` + argv) and the machine. Read once per process, at the first
    call (the Trainer makes it when it starts): a commit made while a run trains is not the code it ran."""
    return {"git": git_state(), "source_digest": source_digest(), "packages": package_versions(),
            "command": shlex.join(["python", *sys.argv]), "machine": machine(),
            "recorded_at": time.strftime("%Y-%m-%dT%H:%M:%S%z")}


def file_digest(path: str) -> dict[str, Any]:
    """{"path" (as given), "sha256", "bytes"} of a file, read in 1 MiB blocks (data files may be large)."""
    h, size = hashlib.sha256(), 0
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
            size += len(block)
    return {"path": path, "sha256": h.hexdigest(), "bytes": size}


def data_digests(cfg) -> dict[str, dict | None]:
    """Digests of the run's input files: task.train_path, task.eval_path (None when unset) and the
    config.json of model.hf_path (weights are not hashed: gigabytes, and the config names the model)."""
    files = {"train_path": cfg.task.train_path, "eval_path": cfg.task.eval_path,
             "model_config": os.path.join(cfg.model.hf_path, "config.json") if cfg.model.hf_path else ""}
    return {name: file_digest(path) if path else None for name, path in files.items()}


def regression_status(names: Sequence[str], cases: Sequence[regress.Case] | None = None) -> dict[str, dict]:
    """Per reward name: its regression cases run now, {"status": "pass"/"fail"/"no cases", "cases",
    "passed", "failed", "failed_ids"}; sandboxed rewards {"status": SANDBOX_SKIP, "reason"} (see the module
    docstring for why)."""
    cases = regress.load_cases() if cases is None else cases
    out: dict[str, dict] = {}
    for name in dict.fromkeys(names):  # each reward once, in order of first use
        if name in SANDBOXED:
            out[name] = {"status": SANDBOX_SKIP, "reason": (
                "its regression cases each start a sandboxed interpreter (about 4 s at every run start); run "
                f"`python -m grpo_jax.rewards.regress --only {name}` to check them")}
            continue
        outcomes = regress.run_cases([c for c in cases if c.data["reward"] == name])
        failed = [o.case.data["id"] for o in outcomes if o.problems]
        status = "no cases" if not outcomes else "fail" if failed else "pass"
        out[name] = {"status": status, "cases": len(outcomes), "passed": len(outcomes) - len(failed),
                     "failed": len(failed), "failed_ids": failed}
    return out


def build_manifest(cfg, specs: Sequence[RewardSpec], *, start_step: int = 0) -> dict[str, Any]:
    """The manifest of a run starting (or resuming) at `start_step` with these resolved reward specs."""
    return {
        "format": FORMAT,
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "start_step": int(start_step),
        "rewards": describe(specs),
        "regression": regression_status([s.name for s in specs]),
        "packages": package_versions(),
        "git": git_state(),
        "data": data_digests(cfg),
    }


def regression_problems(manifest: dict) -> list[str]:
    """One message per used reward whose regression set failed at start (for the run's events/warnings)."""
    return [f"reward {name!r} (version {_version(manifest, name)}) fails {r['failed']} of its {r['cases']} "
            f"regression cases at start: {', '.join(r['failed_ids'][:5])}; run `python -m grpo_jax.rewards.regress "
            f"--only {name}` for the differences" for name, r in manifest["regression"].items() if r.get("failed")]


def _version(manifest: dict, name: str) -> str:
    return next(r["version"] for r in manifest["rewards"] if r["name"] == name)


def read_manifest(out_dir: str) -> dict | None:
    """The run folder's manifest, or None when it has none (or an unreadable one)."""
    try:
        with open(os.path.join(out_dir, MANIFEST), encoding="utf-8") as f:
            data = json.load(f)
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def write_manifest(out_dir: str, manifest: dict) -> dict:
    """Write `manifest` as <out_dir>/manifest.json (atomically), the manifests of earlier starts of this run
    kept in its `previous_starts`; returns what was written."""
    old = read_manifest(out_dir)
    manifest = dict(manifest)
    if old is not None:
        manifest["previous_starts"] = old.pop("previous_starts", []) + [old]
    atomic_write_text(os.path.join(out_dir, MANIFEST), json.dumps(manifest, indent=2, sort_keys=True))
    return manifest


def record_start(out_dir: str, cfg, specs: Sequence[RewardSpec], *, start_step: int) -> list[tuple[str, str]]:
    """Build and write the manifest of a run starting at `start_step`; returns (event kind, message) for each
    regression problem (`regression_failed`: a used reward failing its regression set) and, when the run
    resumes, each dimension whose reward version differs from the previous start's (`reward_version_changed`:
    a user function edited since, whose digest moved), which the trainer logs as events and warns about."""
    manifest = write_manifest(out_dir, build_manifest(cfg, specs, start_step=start_step))
    notes = [("regression_failed", m) for m in regression_problems(manifest)]
    earlier = manifest.get("previous_starts", [])
    if start_step and earlier:
        notes += [("reward_version_changed", m) for m in version_changes(earlier[-1], manifest)]
    return notes


def version_changes(before: dict, now: dict) -> list[str]:
    """One message per reward dimension whose version differs between two manifests' `rewards` records."""
    old = {r["dimension"]: r.get("version") for r in before.get("rewards", [])}
    return [f"reward {r['name']!r} (dimension {r['dimension']!r}) is version {r.get('version')!r} now and was "
            f"{old[r['dimension']]!r} at the previous start: steps from {now['start_step']} on are scored by the "
            "changed function" for r in now.get("rewards", [])
            if r["dimension"] in old and old[r["dimension"]] != r.get("version")]
