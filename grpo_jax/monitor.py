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
from grpo_jax.fileio import atomic_write_text

PAUSE_EXIT_CODE = 75  # sysexits.h EX_TEMPFAIL: "try again later", distinct from success (0) and crashes (1)

ALARM_KINDS = ("below", "above", "drop", "nonfinite")
ALARM_ACTIONS = ("warn", "pause")


def _fail(cls: str, field: str, msg: str) -> None:
    raise ValueError(f"{cls}.{field}: {msg}")


@dataclasses.dataclass(frozen=True)
class AlarmRule:
    """One condition on one metric.

    below / above: value < / > threshold. drop: relative fall (ref - value) / |ref| > threshold, where ref is
    the value `window` observations earlier (e.g. 0.5 over 20 = entropy halved in 20 steps). nonfinite:
    value is NaN/inf, or > threshold (threshold 0 on a counter such as "skipped" fires on any skip).
    """

    metric: str  # metric name in the trainer's flat dict, e.g. "entropy/mean"
    kind: str  # one of ALARM_KINDS
    threshold: float = math.inf  # see the class docstring; inf suits "nonfinite" on a loss
    action: str = "warn"  # one of ALARM_ACTIONS
    window: int = 20  # drop: look-back in observations of the metric
    patience: int = 1  # consecutive observations the condition must hold before firing
    name: str = ""  # identifier in state and reports; "" = derived from the fields

    def __post_init__(self) -> None:
        cls = type(self).__name__
        if not isinstance(self.metric, str) or not self.metric:
            _fail(cls, "metric", f"must be a non-empty metric name, got {self.metric!r}")
        if self.kind not in ALARM_KINDS:
            _fail(cls, "kind", f"unknown value {self.kind!r}; known: {', '.join(ALARM_KINDS)}")
        if self.action not in ALARM_ACTIONS:
            _fail(cls, "action", f"unknown value {self.action!r}; known: {', '.join(ALARM_ACTIONS)}")
        if isinstance(self.threshold, bool) or not isinstance(self.threshold, (int, float)) or \
                math.isnan(self.threshold):
            _fail(cls, "threshold", f"must be a number, got {self.threshold!r}")
        if self.kind == "drop" and not 0 < self.threshold <= 1:
            _fail(cls, "threshold", f"a relative drop must be in (0, 1], got {self.threshold!r}")
        for field in ("window", "patience"):
            if isinstance(getattr(self, field), bool) or not isinstance(getattr(self, field), int) or \
                    getattr(self, field) < 1:
                _fail(cls, field, f"must be an int >= 1, got {getattr(self, field)!r}")

    @property
    def key(self) -> str:
        return self.name or f"{self.metric}:{self.kind}:{self.threshold!r}:{self.action}"

    def describe(self) -> str:
        extra = f" over {self.window} observations" if self.kind == "drop" else ""
        limit = "" if self.kind == "nonfinite" and math.isinf(self.threshold) else f" {self.threshold:g}"
        return f"{self.metric} {self.kind}{limit}{extra} for {self.patience} step(s) -> {self.action}"


def default_rules(*, max_new_tokens: int = 1024) -> tuple[AlarmRule, ...]:
    """Rules worth having on any GRPO run. Only a persistently non-finite loss pauses; the rest warn,
    because e.g. low entropy is also what a solved easy task looks like. Pass the sampler's
    max_new_tokens so the length blow-up rule scales with the budget."""
    return (
        AlarmRule("entropy/mean", "below", 0.05, patience=5),  # collapse (Cui et al. 2025)
        AlarmRule("entropy/mean", "drop", 0.5, window=20),  # halved within 20 steps
        AlarmRule("groups/zero_var_frac", "above", 0.9, patience=5),  # most groups give no gradient (DAPO)
        AlarmRule("length/mean", "above", 0.9 * max_new_tokens, patience=5),  # blow-up
        AlarmRule("length/mean", "below", 2.0, patience=5),  # collapse to empty answers
        AlarmRule("length/truncated_frac", "above", 0.5, patience=5),
        AlarmRule("repetition/rate", "above", 0.3, patience=3),
        AlarmRule("kl", "above", 1.0, patience=3),
        AlarmRule("clip_frac_high", "above", 0.2, patience=3),
        AlarmRule("clip_frac_low", "above", 0.2, patience=3),
        AlarmRule("loss", "nonfinite", action="pause", patience=3),  # one NaN step is skipped; three is broken
        AlarmRule("skipped", "nonfinite", 0.0),  # any skipped update
    )


@dataclasses.dataclass(frozen=True)
class MonitorConfig:
    """Alarm rules and how much history per metric is kept (for drop rules and for the reports)."""

    rules: tuple = dataclasses.field(default_factory=default_rules)  # AlarmRule (or its dict, from JSON)
    history: int = 64  # observations kept per watched metric; must exceed every drop rule's window

    def __post_init__(self) -> None:
        rules = tuple(AlarmRule(**r) if isinstance(r, Mapping) else r for r in self.rules)
        if not all(isinstance(r, AlarmRule) for r in rules):
            _fail("MonitorConfig", "rules", "entries must be AlarmRule or dicts of its fields")
        keys = [r.key for r in rules]
        if len(set(keys)) != len(keys):
            _fail("MonitorConfig", "rules", f"duplicate rules (give them distinct names): {keys}")
        object.__setattr__(self, "rules", rules)
        need = max([r.window + 1 for r in rules if r.kind == "drop"], default=1)
        if not isinstance(self.history, int) or self.history < need:
            _fail("MonitorConfig", "history", f"must be an int >= {need} (largest drop window + 1), "
                                              f"got {self.history!r}")


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


def _holds(rule: AlarmRule, hist: deque[tuple[int, float]]) -> bool:
    """Does the rule's condition hold at the newest observation? NaN compares false except in nonfinite."""
    value = hist[-1][1]
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
        alarms = []
        for rule in self.cfg.rules:
            if rule.metric not in seen:
                continue
            hist = self._history[rule.metric]
            self._streak[rule.key] = self._streak[rule.key] + 1 if _holds(rule, hist) else 0
            if self._streak[rule.key] == rule.patience:
                alarms.append(Alarm(rule, int(step), hist[-1][1], tuple(hist)))
        return alarms

    def state_dict(self) -> dict:
        return {"history": {m: [[s, _enc(v)] for s, v in h] for m, h in self._history.items()},
                "streak": dict(self._streak)}

    def load_state_dict(self, d: dict) -> None:
        """Restore history and streaks. Entries for metrics/rules not in this config are dropped and new
        rules start fresh, so a resumed run may add or remove alarms."""
        if not isinstance(d, dict) or set(d) != {"history", "streak"}:
            raise ValueError(f"Monitor.load_state_dict: expected keys ['history', 'streak'], got {d!r:.200}")
        for metric, hist in self._history.items():
            hist.clear()
            hist.extend((int(s), float(v)) for s, v in d["history"].get(metric, []))
        for key in self._streak:
            self._streak[key] = int(d["streak"].get(key, 0))


def should_pause(alarms: Iterable[Alarm]) -> bool:
    return any(a.rule.action == "pause" for a in alarms)


def _markdown(alarms: list[Alarm], step: int) -> str:
    verdict = "the run paused" if should_pause(alarms) else "the run continues"
    lines = [f"# Alarm report, step {step}", "", f"{len(alarms)} alarm(s); {verdict}.", ""]
    for a in alarms:
        lines += [f"## {a.rule.metric}: {a.rule.kind} ({a.rule.action})", "",
                  f"- rule: {a.rule.describe()}", f"- fired at step {a.step} with value {a.value:.6g}", "",
                  "| step | value |", "|---:|---:|"]
        lines += [f"| {s} | {v:.6g} |" for s, v in a.history] + [""]
    return "\n".join(lines)


def write_alarm_report(path: str, alarms: Iterable[Alarm], step: int) -> tuple[str, str]:
    """Write <base>.md and <base>.json (base = path without a .md/.json suffix), each atomically: which
    metric, the rule, the step and the metric's recent history. Returns (markdown path, JSON path)."""
    alarms = list(alarms)
    base, ext = os.path.splitext(path)
    base = base if ext in (".md", ".json") else path
    payload = {"step": int(step), "paused": should_pause(alarms), "alarms": [a.to_dict() for a in alarms]}
    atomic_write_text(base + ".json", json.dumps(payload, indent=2, allow_nan=False) + "\n")
    atomic_write_text(base + ".md", _markdown(alarms, step))
    return base + ".md", base + ".json"
