"""Training controls the host loop consults each step: entropy-bonus coefficient, rollout temperature,
reward-weight curriculum with hot reload, and DAPO dynamic sampling.

Everything here is host-side, deterministic and cheap (the per-token temperature, which runs inside the
decode loop, lives in ``grpo_jax.sampler``). Each stateful controller has a JSON-able ``state_dict()`` /
``load_state_dict(d)`` holding plain Python floats, which JSON round-trips exactly, so a resumed run
continues bitwise. Their configs live in ``grpo_jax.config``.

Why these controls (docs/algorithms.md §7, §8): policy entropy falls fast and mostly early in RL (Cui et al.
2025), so the entropy bonus may need warming up or steering toward a target; "Beyond the 80/20 rule" shows
decoding temperature on high-entropy tokens matters, the evidence behind the adaptive temperature; DAPO's
dynamic sampling drops zero-variance groups, which carry no advantage and so no gradient.
"""

from __future__ import annotations

import hashlib
import json
import math
import warnings
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from grpo_jax.config import EntropyCoefConfig, RewardWeightsConfig, TemperatureConfig, is_finite_number


def _check_keys(owner: str, d: dict, keys: set[str]) -> None:
    if not isinstance(d, dict) or set(d) != keys:
        got = sorted(d) if isinstance(d, dict) else type(d).__name__
        raise ValueError(f"{owner}.load_state_dict: expected keys {sorted(keys)}, got {got}")


class EntropyCoefController:
    """Step -> entropy coefficient. Pass the value into the jitted step as an array, not a static argument,
    so changing it never recompiles.

    Protocol per step: ``c = ctl.value(step)`` for the loss, then ``ctl.update(step, metrics["entropy/mean"])``,
    which returns the coefficient for step + 1. Only "adaptive" has state; a non-finite entropy changes nothing.
    """

    def __init__(self, cfg: EntropyCoefConfig):
        self.cfg = cfg
        self._coef = float(cfg.coef)

    def value(self, step: int) -> float:
        cfg = self.cfg
        if cfg.mode == "adaptive":
            return self._coef
        if cfg.mode == "warmup":  # max(., 1): warmup_steps = 0 jumps to coef right after warmup_start
            frac = (step - cfg.warmup_start) / max(cfg.warmup_steps, 1)
            return cfg.coef * min(max(frac, 0.0), 1.0)
        return cfg.coef

    def update(self, step: int, entropy_mean: float) -> float:
        """Adaptive: raise c while entropy is under the target, lower it above, clip to [min, max]."""
        cfg = self.cfg
        if cfg.mode != "adaptive":
            return self.value(step + 1)
        if not is_finite_number(entropy_mean) or entropy_mean == cfg.target_entropy:
            return self._coef
        up = entropy_mean < cfg.target_entropy
        if cfg.adapt == "multiplicative":
            factor = 1.0 + cfg.adapt_rate
            coef = self._coef * factor if up else self._coef / factor
        else:
            coef = self._coef + cfg.adapt_rate if up else self._coef - cfg.adapt_rate
        self._coef = min(max(coef, cfg.min_coef), cfg.max_coef)
        return self._coef

    def state_dict(self) -> dict:
        return {"coef": self._coef}

    def load_state_dict(self, d: dict) -> None:
        _check_keys(type(self).__name__, d, {"coef"})
        self._coef = float(d["coef"])


# --------------------------------------------------------------------------------------------------
# rollout temperature
# --------------------------------------------------------------------------------------------------


class TemperatureController:
    """Windowed, hysteretic bang-step control of the rollout temperature.

    Feed it the entropy of the distribution actually sampled (the sampler's, which includes the temperature),
    so raising the temperature raises the measured entropy and the loop settles. The hysteresis band keeps
    it from oscillating around the floor; a non-finite entropy is ignored.
    """

    def __init__(self, cfg: TemperatureConfig, base: float):
        if cfg.mode == "adaptive" and not cfg.min_temp <= base <= cfg.max_temp:
            raise ValueError(f"sampling.temperature={base} must lie in [temperature.min_temp, temperature.max_temp]"
                             f" = [{cfg.min_temp}, {cfg.max_temp}] for adaptive temperature")
        self.cfg, self.base = cfg, float(base)
        self._temp = float(base)
        self._recent: deque[float] = deque(maxlen=cfg.window)

    def value(self) -> float:
        return self._temp

    def update(self, entropy_mean: float) -> float:
        """Record one rollout's mean entropy; return the temperature for the next rollout."""
        cfg = self.cfg
        if cfg.mode == "fixed" or not is_finite_number(entropy_mean):
            return self._temp
        self._recent.append(float(entropy_mean))
        h = sum(self._recent) / len(self._recent)
        t, ceiling = self._temp, cfg.entropy_ceiling
        if h < cfg.entropy_floor:
            t = min(t + cfg.step_up, cfg.max_temp)
        elif ceiling is not None and h > ceiling:
            t = max(t - cfg.step_down, cfg.min_temp)
        elif t > self.base and h >= cfg.entropy_floor + cfg.hysteresis:
            t = max(t - cfg.step_down, self.base)
        elif t < self.base and ceiling is not None and h <= ceiling - cfg.hysteresis:
            t = min(t + cfg.step_up, self.base)
        self._temp = t
        return t

    def state_dict(self) -> dict:
        return {"temperature": self._temp, "recent": list(self._recent)}

    def load_state_dict(self, d: dict) -> None:
        _check_keys(type(self).__name__, d, {"temperature", "recent"})
        self._temp = float(d["temperature"])
        self._recent = deque((float(x) for x in d["recent"]), maxlen=self.cfg.window)


# --------------------------------------------------------------------------------------------------
# reward weights: curriculum + hot reload
# --------------------------------------------------------------------------------------------------


class RewardWeights:
    """Per-step reward weights [K]: base weights, overridden by the weights file, times the curriculum.

    Per step: ``change = rw.maybe_reload(step)`` (log it when not None), then ``w = rw.at(step)``. A file
    edited during step s-1 therefore applies from step s. A bad file never raises: it is reported with
    ``warnings.warn`` (once per distinct content) and the previous weights stay.
    """

    def __init__(self, dims: Sequence[str], base_weights, cfg: RewardWeightsConfig):
        self.dims = tuple(dims)
        self.cfg = cfg
        self._base = np.asarray(base_weights, np.float64).reshape(-1)
        if self._base.shape != (len(self.dims),):
            raise ValueError(f"RewardWeights: {len(self.dims)} dimensions but base_weights of shape {self._base.shape}")
        unknown = [d for d, _ in cfg.schedule if d not in self.dims] + [
            d for d in cfg.allow_negative if d not in self.dims]
        if unknown:
            raise ValueError(f"RewardWeightsConfig.schedule: unknown dimensions {unknown}; known: {list(self.dims)}")
        self._file: dict[str, float] = {}  # the last valid file's content
        self._seen: str | None = None  # hash of the last content examined (applied or rejected)

    def current(self) -> dict[str, float]:
        """Weights before the curriculum: base, overridden by the last valid file."""
        return {d: self._file.get(d, float(w)) for d, w in zip(self.dims, self._base)}

    def at(self, step: int) -> np.ndarray:
        """Effective weights [K] float32 for this step (see RewardWeightsConfig for the formula)."""
        w = np.array(list(self.current().values()), np.float64)
        for dim, pts in self.cfg.schedule:
            steps, factors = zip(*pts)
            w[self.dims.index(dim)] *= np.interp(step, steps, factors)
        return w.astype(np.float32)

    def maybe_reload(self, step: int, on_reject: Callable[[dict], Any] | None = None) -> dict | None:
        """Re-read the weights file; return {"step", "old", "new"} when the weights changed, else None.

        A rejected file is warned about and, when given, passed to `on_reject({"step", "file", "problem",
        "kept"})` (the trainer logs it in events.jsonl), once per distinct content."""
        if not self.cfg.weights_file:
            return None
        raw, key = self._read()
        if key == self._seen:
            return None
        self._seen = key
        new, problem = self._parse(raw) if raw is not None else ({}, key)
        if problem:
            warnings.warn(f"reward weights file {self.cfg.weights_file!r} ignored at step {step}: {problem}; "
                          f"keeping {self.current()}", stacklevel=2)
            if on_reject is not None:
                on_reject({"step": int(step), "file": self.cfg.weights_file, "problem": problem,
                           "kept": self.current()})
            return None
        old = self.current()
        self._file = new
        return None if self.current() == old else {"step": int(step), "old": old, "new": self.current()}

    def _read(self) -> tuple[bytes | None, str]:
        """(bytes, content hash), or (None, the error). Hashing a tiny file each step beats trusting mtime,
        whose granularity can hide two quick same-size edits."""
        try:
            with open(self.cfg.weights_file, "rb") as f:
                raw = f.read()
        except OSError as e:
            return None, f"unreadable: {e.strerror}"
        return raw, hashlib.sha256(raw).hexdigest()

    def _parse(self, raw: bytes) -> tuple[dict[str, float], str]:
        """(weights, "") for a valid file, ({}, problem) otherwise; never raises, whatever the file holds
        (an int beyond float range, 1e400, NaN, Infinity, -0, nesting deeper than the parser's recursion limit).
        A signed zero is refused too: "-0" reads as a negative weight that is not one, so the file says write 0."""
        try:
            obj = json.loads(raw)
        except (ValueError, UnicodeDecodeError, RecursionError) as e:
            return {}, f"not valid JSON ({type(e).__name__}: {str(e)[:200]})"
        if not isinstance(obj, dict):
            return {}, f"expected a JSON object {{dimension: weight}}, got {type(obj).__name__}"
        unknown = sorted(set(obj) - set(self.dims))
        if unknown:
            return {}, f"unknown dimensions {unknown}; known: {list(self.dims)}"
        weights = {}
        for dim, w in obj.items():
            if isinstance(w, bool) or not isinstance(w, (int, float)) or not is_finite_number(w):
                shown = f"an integer of {len(str(abs(w)))} digits" if isinstance(w, int) and not isinstance(
                    w, bool) else f"{w!r:.80}"
                return {}, f"weight of {dim!r} must be a finite number (a float), got {shown}"
            if w == 0 and math.copysign(1.0, w) < 0:
                return {}, f"weight of {dim!r} is -0: write 0 (a zero weight has no sign)"
            weights[dim] = float(w)
            if weights[dim] < 0 and dim not in self.cfg.allow_negative and self._base[self.dims.index(dim)] >= 0:
                return {}, f"weight of {dim!r} must be >= 0, got {w!r} (list it in allow_negative to permit)"
        return weights, ""

    def state_dict(self) -> dict:
        """The last valid file's weights. The next maybe_reload re-reads the file: unchanged weights give no
        record, and a file that is still bad is reported again in the new process's log."""
        return {"file_weights": dict(self._file)}

    def load_state_dict(self, d: dict) -> None:
        _check_keys(type(self).__name__, d, {"file_weights"})
        unknown = sorted(set(d["file_weights"]) - set(self.dims))
        if unknown:
            raise ValueError(f"RewardWeights.load_state_dict: unknown dimensions {unknown}; known: {list(self.dims)}")
        self._file = {str(k): float(v) for k, v in d["file_weights"].items()}
        self._seen = None


# --------------------------------------------------------------------------------------------------
# DAPO dynamic sampling
# --------------------------------------------------------------------------------------------------


def informative_mask(totals_BxG, *, tol: float = 0.0) -> np.ndarray:
    """[B] bool: the group's finite totals are not all equal (spread > tol). A zero-variance group has zero
    advantage everywhere, hence no policy gradient (DAPO). Non-finite entries are ignored."""
    x = np.asarray(totals_BxG, np.float64)
    finite = np.isfinite(x)
    spread = np.where(finite, x, -np.inf).max(axis=1) - np.where(finite, x, np.inf).min(axis=1)
    return spread > tol  # all non-finite: -inf - inf = -inf -> False


def dynamic_sampling_select(totals_BxG, *, need: int, tol: float = 0.0) -> np.ndarray:
    """Indices (ascending) of the first `need` informative groups of one rollout round."""
    return np.flatnonzero(informative_mask(totals_BxG, tol=tol))[:need]


class GroupBuffer:
    """Collects `need` informative groups across rollout rounds (DAPO dynamic sampling, verl filter_groups).

    ``add(informative_B)`` once per round until ``done``, with the round's per-group verdict (e.g.
    ``informative_mask(totals)``, or the advantage estimator's own: ``experience.informative_groups``).
    Groups are kept in arrival order (round, then index), so the result is deterministic. ``max_rounds`` counts all rounds, the first included (verl's
    max_num_gen_batches). If the cap is reached short of `need`, the remaining slots are filled with
    zero-variance groups in arrival order ("least bad": they add no gradient but keep shapes static) and
    ``dynamic/filled_frac`` reports the share. Fewer than `need` are kept only if every group seen is used.
    The buffer lives within one step, so it has no checkpoint state.
    """

    def __init__(self, need: int, max_rounds: int):
        if not isinstance(need, int) or need < 1:
            raise ValueError(f"GroupBuffer.need: must be an int >= 1, got {need!r}")
        if not isinstance(max_rounds, int) or max_rounds < 1:
            raise ValueError(f"GroupBuffer.max_rounds: must be an int >= 1, got {max_rounds!r}")
        self.need, self.max_rounds = need, max_rounds
        self.rounds = 0
        self._kept: list[tuple[int, int]] = []  # informative (round, group)
        self._fallback: list[tuple[int, int]] = []  # zero-variance (round, group), arrival order
        self._filled: list[tuple[int, int]] = []
        self._seen = 0

    @property
    def done(self) -> bool:
        return len(self._kept) >= self.need or self.rounds >= self.max_rounds

    def add(self, informative_B) -> None:
        """Take one round's verdicts [B] bool: does group b carry a learning signal?"""
        if self.done:
            raise RuntimeError("GroupBuffer.add: already done (enough groups or max_rounds reached)")
        informative = np.asarray(informative_B, bool).reshape(-1)
        r = self.rounds
        self.rounds += 1
        self._seen += len(informative)
        room = self.need - len(self._kept)
        self._kept += [(r, int(i)) for i in np.flatnonzero(informative)[:room]]
        self._fallback += [(r, int(i)) for i in np.flatnonzero(~informative)]
        if self.rounds >= self.max_rounds and len(self._kept) < self.need:
            self._filled = self._fallback[: self.need - len(self._kept)]

    def selection(self) -> list[tuple[int, int]]:
        """(round, group index) pairs to train on: informative groups first, then any fill."""
        return self._kept + self._filled

    def metrics(self) -> dict[str, float]:
        used = len(self.selection())
        return {
            "dynamic/rounds": float(self.rounds),
            "dynamic/kept": float(len(self._kept)),
            "dynamic/dropped": float(self._seen - used),
            "dynamic/filled_frac": len(self._filled) / self.need,
            "dynamic/first_round_frac": sum(r == 0 for r, _ in self.selection()) / max(used, 1),
        }
