"""Alarms on the per-step metrics stream: entropy collapse, dead groups, length blow-up, KL, clipping, NaN,
skipped and stalled updates.

The trainer calls ``Monitor.observe(step, metrics)`` once per step with the flat float metrics dict. Each
``AlarmRule`` watches one metric and fires once when its condition has held for ``patience`` consecutive
observations (edge-triggered: it re-arms only after the condition clears, so a collapsed run is not
flooded). An alarm with action "pause" tells the trainer to checkpoint, write ``write_alarm_report`` and
exit with ``PAUSE_EXIT_CODE``, so a scheduler can tell "paused for a human" from success and failure.

Metrics a step does not report are ignored: no alarm, no error, no history entry, streaks unchanged.
All state (per-metric history ring buffers, per-rule streaks, the symptoms of recent steps) is JSON-able for
checkpoint and bitwise resume.

Where the trouble began: the monitor records, for each observed step, the rules whose condition held there
(a symptom, whether or not the rule has fired yet). The trouble behind an alarm began at the first step of
the unbroken run of steps with a symptom that ends at the alarm (``Monitor.trouble_began``). Step t's
metrics describe the policy of checkpoint t - 1 (its rollout, and the update computed on it), so the rollback
target is the newest kept checkpoint c with c + 1 before that step (``rollback_target``).
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import sys
import warnings
from collections import deque
from collections.abc import Iterable, Mapping

import numpy as np

from grpo_jax.config import AlarmRule, MonitorConfig
from grpo_jax.fileio import atomic_write_text

PAUSE_EXIT_CODE = 75  # sysexits.h EX_TEMPFAIL: "try again later", distinct from success (0) and crashes (1)
# entropy/frac_of_max at or above this is a uniform policy (float32 entropies of a uniform distribution land within
# 1e-6 of log V; the arithmetic smoke config's barely warm-started model samples at 0.998)
UNIFORM_ENTROPY_FRAC = 1 - 1e-4


@dataclasses.dataclass(frozen=True)
class Alarm:
    """A fired rule: the value at `step` and the metric's recent (step, value) history, newest last."""

    rule: AlarmRule
    step: int
    value: float
    history: tuple[tuple[int, float], ...]
    detail: str = ""  # what the trainer knows beyond the metric (e.g. which reward failed, and how)

    @property
    def message(self) -> str:
        said = f"step {self.step}: {self.rule.metric} = {self.value:.6g} ({self.rule.describe()})"
        return f"{said}: {self.detail}" if self.detail else said

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


def health_metrics(metrics: Mapping[str, object], *, vocab_size: int) -> dict[str, float]:
    """Figures the default rules watch that no single logged metric gives, from a step's metrics:

    - entropy/frac_of_max: entropy/mean / log(vocab_size), 1 for a uniform policy over the vocabulary;
    - stalled_update: 1.0 when grad_norm is exactly 0 although there is something to learn: rewards vary
      within groups (groups/reward_var_mean > 0, so advantages are not all 0) or the policy is uniform
      (entropy/frac_of_max >= UNIFORM_ENTROPY_FRAC, e.g. a model blown up by a huge learning rate that no
      gradient reaches any more); else 0.0. A skipped update logs a NaN grad_norm, not 0: rules on "skipped"
      and "loss" watch those.

    A figure whose inputs the step lacks is left out."""
    out = {}
    entropy, grad = _scalar(metrics.get("entropy/mean")), _scalar(metrics.get("grad_norm"))
    if entropy is not None and vocab_size > 1:
        out["entropy/frac_of_max"] = entropy / math.log(vocab_size)
    if grad is not None:
        variance = _scalar(metrics.get("groups/reward_var_mean"))
        uniform = out.get("entropy/frac_of_max", 0.0) >= UNIFORM_ENTROPY_FRAC
        out["stalled_update"] = float(grad == 0.0 and ((variance is not None and variance > 0) or uniform))
    return out


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
    """Evaluates the rules on each step's metrics; keeps per-metric history, per-rule streaks and, per observed
    step, the rules in a streak there (its symptoms)."""

    def __init__(self, cfg: MonitorConfig):
        self.cfg = cfg
        self._history: dict[str, deque[tuple[int, float]]] = {
            r.metric: deque(maxlen=cfg.history) for r in cfg.rules}
        self._streak: dict[str, int] = {r.key: 0 for r in cfg.rules}
        self._first: dict[str, float] = {}  # per metric: first finite positive value (below_first_frac)
        self._symptoms: deque[tuple[int, tuple[str, ...]]] = deque(maxlen=cfg.history)  # (step, rule keys)

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
        self._symptoms.append((int(step), tuple(k for k, n in self._streak.items() if n > 0)))
        return alarms

    def trouble_began(self) -> int | None:
        """The first step of the unbroken run of observed steps, ending with the newest, on each of which some
        rule's condition held (None when none holds at the newest step). When that run reaches the oldest
        step kept (`history` steps back), that step: the trouble began there or earlier."""
        began = None
        for step, keys in reversed(self._symptoms):
            if not keys:
                break
            began = step
        return began

    def symptoms_of_checkpoint(self, step: int) -> list[str] | None:
        """The rules (keys) whose condition held on the first observed step after checkpoint `step`, the first
        step taken from its policy (the newest step when none came after it); None when that step is older
        than the recorded symptoms."""
        if not self._symptoms or step + 1 < self._symptoms[0][0]:
            return None
        later = [keys for s, keys in self._symptoms if s > step]
        return list(later[0] if later else self._symptoms[-1][1])

    def trouble(self, alarms: Iterable[Alarm], kept_steps: Iterable[int]) -> dict:
        """Where the trouble behind `alarms` began and what to roll back to: {"began": the step of the first
        symptom (`trouble_began`, or the pausing alarms' streak start if earlier), "first_symptoms": the
        metrics abnormal at that step, "rollback_step": `rollback_target`, "before_trouble": whether that
        checkpoint's first step precedes the trouble, "abnormal_at_rollback": the metrics already abnormal on
        that first step (None: older than the record)}. Metrics are given as "metric: rule" strings."""
        alarms = list(alarms)
        pausing = [a for a in alarms if a.rule.action == "pause"] or alarms
        starts = [a.step - a.rule.patience + 1 for a in pausing]
        chain = self.trouble_began()
        began = min(starts + ([chain] if chain is not None else []))
        target = rollback_target(kept_steps, began)
        at_target = self.symptoms_of_checkpoint(target)
        first = next((keys for s, keys in self._symptoms if s == began), ())
        return {"began": int(began), "first_symptoms": self._describe(first), "rollback_step": int(target),
                "before_trouble": target + 1 < began,
                "abnormal_at_rollback": None if at_target is None else self._describe(at_target)}

    def _describe(self, keys: Iterable[str]) -> list[str]:
        rules = {r.key: r for r in self.cfg.rules}
        return [f"{rules[k].metric}: {rules[k].name or rules[k].describe()}" for k in keys if k in rules]

    def state_dict(self) -> dict:
        return {"history": {m: [[s, _enc(v)] for s, v in h] for m, h in self._history.items()},
                "streak": dict(self._streak), "first": dict(self._first),
                "symptoms": [[s, list(keys)] for s, keys in self._symptoms]}

    def load_state_dict(self, d: dict) -> None:
        """Restore history, streaks and symptoms. Entries for metrics/rules not in this config are dropped and
        new rules start fresh, so a resumed run may add or remove alarms. "first" and "symptoms" may be absent
        (a checkpoint written before they existed): the first values are then taken afresh, and the symptoms
        recorded from the resumed step on."""
        known = {"history", "streak", "first", "symptoms"}
        if not isinstance(d, dict) or not {"history", "streak"} <= set(d) <= known:
            raise ValueError(f"Monitor.load_state_dict: expected keys {sorted(known)} (first and symptoms "
                             f"optional), got {d!r:.200}")
        self._first = {m: float(v) for m, v in d.get("first", {}).items() if m in self._history}
        for metric, hist in self._history.items():
            hist.clear()
            hist.extend((int(s), float(v)) for s, v in d["history"].get(metric, []))
        for key in self._streak:
            self._streak[key] = int(d["streak"].get(key, 0))
        self._symptoms.clear()
        self._symptoms.extend((int(s), tuple(k for k in keys if k in self._streak))
                              for s, keys in d.get("symptoms", []))


def should_pause(alarms: Iterable[Alarm]) -> bool:
    return any(a.rule.action == "pause" for a in alarms)


# What to switch on when a pausing rule fires (the rollback command's --set flags); a rule without one gets
# the placeholder --set KEY=VALUE, which a person replaces (run as it is, it fails naming 'KEY').
REMEDIES = {
    "entropy_collapse": "--set temperature.mode=adaptive",  # the control that moved entropy in our studies
    "entropy_median_collapse": "--set temperature.mode=adaptive",
    "reasoning_entropy_collapse": "--set temperature.mode=adaptive",  # the thinking tokens' entropy at T = 1
    "group_variance_collapse": "--set dynamic.enabled=true",  # train on the groups that still vary
}


def rollback_target(kept_steps: Iterable[int], began: int) -> int:
    """The checkpoint to roll back to when the trouble began at step `began`: the newest kept step c whose
    policy ran clean, c + 1 < began (step t's metrics describe the policy of checkpoint t - 1: its rollout and
    the update computed on it), else the oldest kept step (0 when none is kept)."""
    kept = sorted(kept_steps)
    before = [s for s in kept if s + 1 < began]
    return before[-1] if before else (kept[0] if kept else 0)


def rollback_command(out_dir: str, alarms: Iterable[Alarm], kept_steps: Iterable[int], *,
                     began: int | None = None) -> str:
    """The command that resumes a paused run from before the trouble with a control switched on: the
    checkpoint `rollback_target` picks for trouble that began at `began` (the trainer passes
    `Monitor.trouble`'s; default: where the first pausing rule's streak began) and the remedies of the rules
    that paused; --rollback-to continues with the run's own config (config.json and its recorded changes)."""
    alarms = list(alarms)
    pausing = [a for a in alarms if a.rule.action == "pause"] or alarms
    if began is None:
        began = min(a.step - a.rule.patience + 1 for a in pausing)
    target = rollback_target(kept_steps, began)
    remedies = sorted({REMEDIES.get(a.rule.name, "--set KEY=VALUE") for a in pausing})
    return (f"python -m grpo_jax.train --out {out_dir} --rollback-to {target} "
            + " ".join(remedies))


def _trouble_lines(trouble: dict) -> list[str]:
    """The report's account of where the trouble began and what the rollback checkpoint already showed."""
    target, began = trouble["rollback_step"], trouble["began"]
    first = ", ".join(f"`{m}`" for m in trouble["first_symptoms"]) or "none recorded"
    abnormal = trouble["abnormal_at_rollback"]
    shown = ("unknown (older than the monitor's record)" if abnormal is None else
             ", ".join(f"`{m}`" for m in abnormal) or "none")
    where = (f"checkpoint {target} is the newest kept one from before it (its policy's first step, {target + 1}, "
             "came before the first symptom)" if trouble["before_trouble"] else
             f"no kept checkpoint comes from before it: checkpoint {target} is the oldest kept one")
    return ["## Where the trouble began", "", f"- first symptom: step {began} ({first})", f"- rollback: {where}",
            f"- metrics already abnormal on the first step from checkpoint {target}: {shown}", ""]


def _markdown(alarms: list[Alarm], step: int, command: str | None, trouble: dict | None) -> str:
    verdict = "the run paused" if should_pause(alarms) else "the run continues"
    names = ", ".join(a.rule.name or a.rule.metric for a in alarms)
    lines = [f"# Alarm report, step {step}", "", f"{len(alarms)} alarm(s) ({names}); {verdict}.", ""]
    if command:
        clean = trouble is None or trouble["before_trouble"]
        how = ("Roll back to a checkpoint from before the trouble, with a control on:" if clean else
               "Roll back to the oldest kept checkpoint (none comes from before the trouble), with a control on:")
        lines += ["## How to continue", "", how, "", f"    {command}", "",
                  "or continue unchanged with `--resume` (same --out).", ""]
    if trouble is not None:
        lines += _trouble_lines(trouble)
    for a in alarms:
        lines += [f"## {a.rule.name or a.rule.metric}: {a.rule.metric} {a.rule.kind} ({a.rule.action})", "",
                  f"- rule: {a.rule.describe()}", f"- fired at step {a.step} with value {a.value:.6g}",
                  *([f"- {a.detail}"] if a.detail else []), "",
                  "| step | value |", "|---:|---:|"]
        lines += [f"| {s} | {v:.6g} |" for s, v in a.history] + [""]
    return "\n".join(lines)


def write_alarm_report(path: str, alarms: Iterable[Alarm], step: int, *, command: str | None = None,
                       trouble: dict | None = None) -> tuple[str, str]:
    """Write <base>.md and <base>.json (base = path without a .md/.json suffix), each atomically: which
    alarm, the rule, the step, the metric's recent history and, for a pause, the command that continues the
    run (`rollback_command`) and where the trouble began (`Monitor.trouble`: the first symptom, the rollback
    checkpoint and the metrics already abnormal there). Returns (markdown path, JSON path)."""
    alarms = list(alarms)
    base, ext = os.path.splitext(path)
    base = base if ext in (".md", ".json") else path
    payload = {"step": int(step), "paused": should_pause(alarms), "alarms": [a.to_dict() for a in alarms],
               "rollback_command": command, "trouble": trouble}
    atomic_write_text(base + ".json", json.dumps(payload, indent=2, allow_nan=False) + "\n")
    atomic_write_text(base + ".md", _markdown(alarms, step, command, trouble))
    return base + ".md", base + ".json"


def exit_paused(out_dir: str, step: int) -> None:
    """End a launcher whose run an alarm paused: say where the alarm report is, exit with PAUSE_EXIT_CODE."""
    print(f"paused by an alarm at step {step}: {out_dir}/alarms/step-{step}.md names it and the command that "
          "rolls back with a control on (or continue unchanged with --resume)", file=sys.stderr)
    sys.exit(PAUSE_EXIT_CODE)


def log_alarms(logger, mon: Monitor, out_dir: str, step: int, alarms, *, kept) -> None:
    """Log and warn each alarm; when they pause the run, write the alarm report (where the trouble began, the
    checkpoint from before it, the rollback command) and log the pause. `kept()` lists the checkpoints."""
    for a in alarms:
        logger.event(step, "alarm", **{k: v for k, v in a.to_dict().items() if k != "step"})
        warnings.warn(a.message, stacklevel=4)
    if should_pause(alarms):
        steps = kept()
        trouble = mon.trouble(alarms, steps)
        command = rollback_command(out_dir, alarms, steps, began=trouble["began"])
        write_alarm_report(os.path.join(out_dir, "alarms", f"step-{step}"), alarms, step, command=command,
                           trouble=trouble)
        logger.event(step, "pause", alarms=[a.rule.key for a in alarms], rollback_command=command, trouble=trouble)
