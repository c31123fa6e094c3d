"""Alarms on the per-step metrics stream: entropy collapse, dead groups, length blow-up, KL, clipping, NaN.

The trainer calls ``Monitor.observe(step, metrics)`` once per step with the flat float metrics dict. Each
``AlarmRule`` watches one metric and fires once when its condition has held for ``patience`` consecutive
observations (edge-triggered: it re-arms only after the condition clears, so a collapsed run is not
flooded). An alarm with action "pause" tells the trainer to checkpoint, write ``write_alarm_report`` and
exit with ``PAUSE_EXIT_CODE``, so a scheduler can tell "paused for a human" from success and failure.

Metrics a step does not report are ignored: no alarm, no error, no history entry, streaks unchanged.
All state (per-metric history ring buffers, per-rule streaks) is JSON-able for checkpoint and bitwise resume.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
from collections import deque
from collections.abc import Iterable, Mapping

import numpy as np

from grpo_jax.config import AlarmRule, MonitorConfig
from grpo_jax.fileio import atomic_write_text

PAUSE_EXIT_CODE = 75  # sysexits.h EX_TEMPFAIL: "try again later", distinct from success (0) and crashes (1)


@dataclasses.dataclass(frozen=True)
class Alarm:
    """A fired rule: the value at `step` and the metric's recent (step, value) history, newest last."""

    rule: AlarmRule
    step: int
    value: float
    history: tuple[tuple[int, float], ...]

    @property
    def message(self) -> str:
        return f"step {self.step}: {self.rule.metric} = {self.value:.6g} ({self.rule.describe()})"

    def to_dict(self) -> dict:
        """JSON-able (strict: non-finite numbers become the strings "nan", "inf", "-inf")."""
        return {"rule": dataclasses.asdict(self.rule) | {"threshold": _enc(self.rule.threshold)},
                "key": self.rule.key, "step": self.step, "value": _enc(self.value), "message": self.message,
                "history": [[s, _enc(v)] for s, v in self.history]}


def _enc(x: float) -> float | str:
    return x if math.isfinite(x) else str(x)


def _scalar(v) -> float | None:
    """The metric as a float, or None when it is missing or not a scalar number (then ignored)."""
    if v is None:
        return None
    try:
        a = np.asarray(v)
        return float(a.reshape(())) if a.size == 1 and a.dtype.kind in "biuf" else None
    except (TypeError, ValueError):
        return None


def _holds(rule: AlarmRule, hist: deque[tuple[int, float]], first: float | None) -> bool:
    """Does the rule's condition hold at the newest observation? NaN compares false except in nonfinite.
    `first` is the metric's first finite positive observation (None before one)."""
    value = hist[-1][1]
    if rule.kind == "below_first_frac":
        return first is not None and value < rule.threshold * first
    if rule.kind == "below":
        return value < rule.threshold
    if rule.kind == "above":
        return value > rule.threshold
    if rule.kind == "nonfinite":
        return not math.isfinite(value) or value > rule.threshold
    if len(hist) <= rule.window:  # drop: no reference value yet
        return False
    ref = hist[-1 - rule.window][1]
    return math.isfinite(ref) and ref != 0 and (ref - value) / abs(ref) > rule.threshold


class Monitor:
    """Evaluates the rules on each step's metrics; keeps per-metric history and per-rule streaks."""

    def __init__(self, cfg: MonitorConfig):
        self.cfg = cfg
        self._history: dict[str, deque[tuple[int, float]]] = {
            r.metric: deque(maxlen=cfg.history) for r in cfg.rules}
        self._streak: dict[str, int] = {r.key: 0 for r in cfg.rules}
        self._first: dict[str, float] = {}  # per metric: first finite positive value (below_first_frac)

    def history(self, metric: str) -> tuple[tuple[int, float], ...]:
        return tuple(self._history.get(metric, ()))

    def observe(self, step: int, metrics: Mapping[str, object]) -> list[Alarm]:
        """Record this step's watched metrics; return the alarms that fire now (in rule order)."""
        seen = set()
        for metric, hist in self._history.items():
            value = _scalar(metrics.get(metric))
            if value is not None:
                hist.append((int(step), value))
                seen.add(metric)
                if metric not in self._first and math.isfinite(value) and value > 0:
                    self._first[metric] = value
        alarms = []
        for rule in self.cfg.rules:
            if rule.metric not in seen:
                continue
            hist = self._history[rule.metric]
            holds = _holds(rule, hist, self._first.get(rule.metric))
            self._streak[rule.key] = self._streak[rule.key] + 1 if holds else 0
            if self._streak[rule.key] == rule.patience:
                alarms.append(Alarm(rule, int(step), hist[-1][1], tuple(hist)))
        return alarms

    def state_dict(self) -> dict:
        return {"history": {m: [[s, _enc(v)] for s, v in h] for m, h in self._history.items()},
                "streak": dict(self._streak), "first": dict(self._first)}

    def load_state_dict(self, d: dict) -> None:
        """Restore history and streaks. Entries for metrics/rules not in this config are dropped and new
        rules start fresh, so a resumed run may add or remove alarms. "first" may be absent (a checkpoint
        written before below_first_frac existed): the first values are then taken afresh."""
        if not isinstance(d, dict) or not {"history", "streak"} <= set(d) <= {"history", "streak", "first"}:
            raise ValueError(f"Monitor.load_state_dict: expected keys ['first', 'history', 'streak'], "
                             f"got {d!r:.200}")
        self._first = {m: float(v) for m, v in d.get("first", {}).items() if m in self._history}
        for metric, hist in self._history.items():
            hist.clear()
            hist.extend((int(s), float(v)) for s, v in d["history"].get(metric, []))
        for key in self._streak:
            self._streak[key] = int(d["streak"].get(key, 0))


def should_pause(alarms: Iterable[Alarm]) -> bool:
    return any(a.rule.action == "pause" for a in alarms)


# What to switch on when a pausing rule fires (the rollback command's --set flags); a rule without one gets
# the placeholder --set KEY=VALUE, which a person replaces (run as it is, it fails naming 'KEY').
REMEDIES = {
    "entropy_collapse": "--set temperature.mode=adaptive",  # the control that moved entropy in our studies
    "entropy_median_collapse": "--set temperature.mode=adaptive",
    "group_variance_collapse": "--set dynamic.enabled=true",  # train on the groups that still vary
}


def rollback_command(out_dir: str, alarms: Iterable[Alarm], kept_steps: Iterable[int]) -> str:
    """The command that resumes a paused run from before the trouble with a control switched on: the
    newest kept checkpoint before the first pausing rule's streak began (else the oldest kept one), the
    run's own config.json, and the remedies of the rules that paused."""
    pausing = [a for a in alarms if a.rule.action == "pause"] or list(alarms)
    began = min(a.step - a.rule.patience + 1 for a in pausing)
    kept = sorted(kept_steps)
    before = [s for s in kept if s < began]
    target = before[-1] if before else (kept[0] if kept else 0)
    remedies = sorted({REMEDIES.get(a.rule.name, "--set KEY=VALUE") for a in pausing})
    return (f"python -m grpo_jax.train --config {out_dir}/config.json --out {out_dir} --rollback-to {target} "
            + " ".join(remedies))


def _markdown(alarms: list[Alarm], step: int, command: str | None) -> str:
    verdict = "the run paused" if should_pause(alarms) else "the run continues"
    names = ", ".join(a.rule.name or a.rule.metric for a in alarms)
    lines = [f"# Alarm report, step {step}", "", f"{len(alarms)} alarm(s) ({names}); {verdict}.", ""]
    if command:
        lines += ["## How to continue", "", "Roll back to a checkpoint from before the trouble, with a control on:",
                  "", f"    {command}", "", "or continue unchanged with `--resume` (same --out).", ""]
    for a in alarms:
        lines += [f"## {a.rule.name or a.rule.metric}: {a.rule.metric} {a.rule.kind} ({a.rule.action})", "",
                  f"- rule: {a.rule.describe()}", f"- fired at step {a.step} with value {a.value:.6g}", "",
                  "| step | value |", "|---:|---:|"]
        lines += [f"| {s} | {v:.6g} |" for s, v in a.history] + [""]
    return "\n".join(lines)


def write_alarm_report(path: str, alarms: Iterable[Alarm], step: int, *, command: str | None = None) -> tuple[str, str]:
    """Write <base>.md and <base>.json (base = path without a .md/.json suffix), each atomically: which
    alarm, the rule, the step, the metric's recent history and, for a pause, the command that continues the
    run (`rollback_command`). Returns (markdown path, JSON path)."""
    alarms = list(alarms)
    base, ext = os.path.splitext(path)
    base = base if ext in (".md", ".json") else path
    payload = {"step": int(step), "paused": should_pause(alarms), "alarms": [a.to_dict() for a in alarms],
               "rollback_command": command}
    atomic_write_text(base + ".json", json.dumps(payload, indent=2, allow_nan=False) + "\n")
    atomic_write_text(base + ".md", _markdown(alarms, step, command))
    return base + ".md", base + ".json"
