"""Training controls the host loop consults each step: entropy-bonus coefficient, rollout temperature,
reward-weight curriculum with hot reload, and DAPO dynamic sampling.

Everything here is host-side, deterministic and cheap, except ``per_token_temperature`` (jittable, for the
sampler). Each stateful controller has a JSON-able ``state_dict()`` / ``load_state_dict(d)`` holding plain
Python floats, which JSON round-trips exactly, so a resumed run continues bitwise. Configs are frozen
dataclasses validated in ``__post_init__``; a bad value raises ``ValueError`` naming the field.

Why these controls (ALGORITHMS.md §4, §5, §10): policy entropy falls fast and mostly early in RL (Cui et al.
2025), so the entropy bonus may need warming up or steering toward a target; "Beyond the 80/20 rule" shows
decoding temperature on high-entropy tokens matters, the evidence behind the adaptive temperature; DAPO's
dynamic sampling drops zero-variance groups, which carry no advantage and so no gradient.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import warnings
from collections import deque
from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np


def _fail(cls: str, field: str, msg: str) -> None:
    raise ValueError(f"{cls}.{field}: {msg}")


def _check_choice(cls: str, field: str, value: str, known: tuple[str, ...]) -> None:
    if value not in known:
        _fail(cls, field, f"unknown value {value!r}; known: {', '.join(known)}")


def _finite(x) -> bool:
    try:
        return math.isfinite(float(x))
    except (TypeError, ValueError):
        return False


def _check_keys(owner: str, d: dict, keys: set[str]) -> None:
    if not isinstance(d, dict) or set(d) != keys:
        got = sorted(d) if isinstance(d, dict) else type(d).__name__
        raise ValueError(f"{owner}.load_state_dict: expected keys {sorted(keys)}, got {got}")


# --------------------------------------------------------------------------------------------------
# entropy-bonus coefficient
# --------------------------------------------------------------------------------------------------

ENTROPY_COEF_MODES = ("constant", "warmup", "adaptive")
ADAPT_RULES = ("multiplicative", "additive")


@dataclasses.dataclass(frozen=True)
class EntropyCoefConfig:
    """The coefficient c(step) of the entropy bonus (loss -= c * H)."""

    mode: str = "constant"  # one of ENTROPY_COEF_MODES
    coef: float = 0.0  # constant value; warmup target; adaptive starting value
    warmup_start: int = 0  # warmup: c = 0 for step <= warmup_start ...
    warmup_steps: int = 0  # ... then linear to coef, reached at warmup_start + warmup_steps (0 = jump)
    target_entropy: float = 0.3  # adaptive: mean token entropy (nats) to steer toward
    adapt_rate: float = 0.05  # adaptive: factor (1 + rate) per step, or the absolute step when additive
    adapt: str = "multiplicative"  # one of ADAPT_RULES
    min_coef: float = 0.0  # adaptive: lower bound
    max_coef: float = 0.05  # adaptive: upper bound

    def __post_init__(self) -> None:
        name = type(self).__name__
        _check_choice(name, "mode", self.mode, ENTROPY_COEF_MODES)
        _check_choice(name, "adapt", self.adapt, ADAPT_RULES)
        for field in ("coef", "target_entropy", "adapt_rate", "min_coef", "max_coef"):
            if not _finite(getattr(self, field)) or getattr(self, field) < 0:
                _fail(name, field, f"must be a finite number >= 0, got {getattr(self, field)!r}")
        for field in ("warmup_start", "warmup_steps"):
            if not isinstance(getattr(self, field), int) or getattr(self, field) < 0:
                _fail(name, field, f"must be an int >= 0, got {getattr(self, field)!r}")
        if self.mode == "adaptive":
            if not self.min_coef <= self.coef <= self.max_coef:
                _fail(name, "coef", f"must lie in [min_coef, max_coef] = [{self.min_coef}, {self.max_coef}], "
                                    f"got {self.coef!r}")
            if self.adapt == "multiplicative" and self.coef == 0:
                _fail(name, "coef", "must be > 0 with multiplicative adaptation (0 * factor stays 0)")
            if not self.adapt_rate > 0:
                _fail(name, "adapt_rate", f"must be > 0 in adaptive mode, got {self.adapt_rate!r}")


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
        if not _finite(entropy_mean) or entropy_mean == cfg.target_entropy:
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

TEMPERATURE_MODES = ("fixed", "adaptive")


@dataclasses.dataclass(frozen=True)
class TemperatureConfig:
    """Rollout temperature, optionally steered by the rollouts' mean token entropy."""

    mode: str = "fixed"  # one of TEMPERATURE_MODES; the base temperature is sampling.temperature
    min_temp: float = 0.5  # lower bound (only reached when entropy_ceiling is set)
    max_temp: float = 1.5  # upper bound
    entropy_floor: float = 0.1  # window-mean entropy (nats) under this raises the temperature
    entropy_ceiling: float | None = None  # window-mean entropy above this lowers it (None = never below base)
    hysteresis: float = 0.05  # return toward base only once entropy is past floor + h (ceiling - h)
    step_up: float = 0.05  # temperature increment per update
    step_down: float = 0.05  # temperature decrement per update
    window: int = 5  # number of recent rollouts averaged

    def __post_init__(self) -> None:
        name = type(self).__name__
        _check_choice(name, "mode", self.mode, TEMPERATURE_MODES)
        for field in ("min_temp", "max_temp", "entropy_floor", "hysteresis", "step_up", "step_down"):
            if not _finite(getattr(self, field)) or getattr(self, field) < 0:
                _fail(name, field, f"must be a finite number >= 0, got {getattr(self, field)!r}")
        if not 0 < self.min_temp <= self.max_temp:
            _fail(name, "min_temp", f"need 0 < min_temp <= max_temp, got {self.min_temp}, {self.max_temp}")
        if self.entropy_ceiling is not None and not self.entropy_ceiling > self.entropy_floor + 2 * self.hysteresis:
            _fail(name, "entropy_ceiling", f"must be None or > entropy_floor + 2 * hysteresis, "
                                           f"got {self.entropy_ceiling!r}")
        if not isinstance(self.window, int) or self.window < 1:
            _fail(name, "window", f"must be an int >= 1, got {self.window!r}")


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
        if cfg.mode == "fixed" or not _finite(entropy_mean):
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


def per_token_temperature(logits_RxV: jax.Array, *, base_temperature, entropy_floor, boost,
                          max_temperature) -> jax.Array:
    """Per-row sampling temperature [R], float32: min(base * boost, max) where the entropy of
    softmax(logits / base) is under the floor, else base. Jittable; the arguments may be traced.

    Why: a row about to collapse onto one token gets a hotter distribution. The sampler divides the logits by
    this temperature and must report logprobs/entropies of that same tempered distribution. base <= 0
    (greedy) gives 0 on every row. Masked logits (-inf) are allowed.
    """
    base = jnp.asarray(base_temperature, jnp.float32)
    safe_base = jnp.where(base > 0, base, 1.0)
    logp = jax.nn.log_softmax(logits_RxV.astype(jnp.float32) / safe_base, axis=-1)
    entropy_R = -jnp.sum(jnp.where(logp > -jnp.inf, jnp.exp(logp) * logp, 0.0), axis=-1)
    hot = jnp.minimum(base * jnp.asarray(boost, jnp.float32), jnp.asarray(max_temperature, jnp.float32))
    return jnp.where(entropy_R < entropy_floor, hot, base)


# --------------------------------------------------------------------------------------------------
# reward weights: curriculum + hot reload
# --------------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class RewardWeightsConfig:
    """Reward-weight curriculum and hot-reload file.

    Effective weight of dimension k at step s: ``w_k(s) = file_or_base_k * m_k(s)``. The weights file
    (JSON {dimension: weight}) overrides the base weights for the dimensions it names; the curriculum
    *multiplies*, so m_k is a 0..1 ramp (or any factor) and a re-tuned file weight keeps its ramp.
    m_k is piecewise-linear through the (step, factor) points, flat before the first and after the last;
    dimensions without a schedule have m_k = 1.
    """

    schedule: tuple = ()  # ((dimension, ((step, factor), ...)), ...); e.g. (("quality", ((0, 0.), (200, 1.))),)
    weights_file: str = ""  # JSON {dimension: weight}, re-read when its content changes; "" = none
    allow_negative: tuple = ()  # dimensions whose file weight may be < 0 (those with a negative base also may)

    def __post_init__(self) -> None:
        name = type(self).__name__
        if not isinstance(self.weights_file, str):
            _fail(name, "weights_file", f"must be a path string, got {self.weights_file!r}")
        if not all(isinstance(d, str) for d in self.allow_negative):
            _fail(name, "allow_negative", f"must be dimension names, got {self.allow_negative!r}")
        object.__setattr__(self, "allow_negative", tuple(self.allow_negative))
        object.__setattr__(self, "schedule", tuple(_parse_schedule_entry(e) for e in self.schedule))
        dims = [d for d, _ in self.schedule]
        if len(set(dims)) != len(dims):
            _fail(name, "schedule", f"a dimension is scheduled twice: {dims}")


def _parse_schedule_entry(entry) -> tuple[str, tuple[tuple[int, float], ...]]:
    """(dim, points) with int steps strictly increasing and finite factors >= 0; lists accepted (JSON)."""
    bad = f"entries must be (dimension, ((step, factor), ...)), got {entry!r}"
    if not isinstance(entry, (tuple, list)) or len(entry) != 2 or not isinstance(entry[0], str):
        _fail("RewardWeightsConfig", "schedule", bad)
    dim, points = entry
    try:
        pts = tuple((int(s), float(w)) for s, w in points)
        integral = all(s == raw_s for (s, _), (raw_s, _) in zip(pts, points))
    except (TypeError, ValueError):
        pts, integral = (), False
    if not pts or not integral:
        _fail("RewardWeightsConfig", "schedule", bad)
    steps = [s for s, _ in pts]
    if steps != sorted(set(steps)) or steps[0] < 0:
        _fail("RewardWeightsConfig", "schedule", f"{dim!r}: steps must be >= 0 and strictly increasing, got {steps}")
    if not all(math.isfinite(w) and w >= 0 for _, w in pts):
        _fail("RewardWeightsConfig", "schedule", f"{dim!r}: factors must be finite and >= 0, got {pts}")
    return dim, pts


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

    def maybe_reload(self, step: int) -> dict | None:
        """Re-read the weights file; return {"step", "old", "new"} when the weights changed, else None."""
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
        """(weights, "") for a valid file, ({}, problem) otherwise."""
        try:
            obj = json.loads(raw)
        except (ValueError, UnicodeDecodeError) as e:
            return {}, f"not valid JSON ({e})"
        if not isinstance(obj, dict):
            return {}, f"expected a JSON object {{dimension: weight}}, got {type(obj).__name__}"
        unknown = sorted(set(obj) - set(self.dims))
        if unknown:
            return {}, f"unknown dimensions {unknown}; known: {list(self.dims)}"
        for dim, w in obj.items():
            if isinstance(w, bool) or not isinstance(w, (int, float)) or not math.isfinite(w):
                return {}, f"weight of {dim!r} must be a finite number, got {w!r}"
            if w < 0 and dim not in self.cfg.allow_negative and self._base[self.dims.index(dim)] >= 0:
                return {}, f"weight of {dim!r} must be >= 0, got {w!r} (list it in allow_negative to permit)"
        return {d: float(w) for d, w in obj.items()}, ""

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

    ``add(totals_BxG)`` once per round until ``done``. Groups are kept in arrival order (round, then index),
    so the result is deterministic. ``max_rounds`` counts all rounds, the first included (verl's
    max_num_gen_batches). If the cap is reached short of `need`, the remaining slots are filled with
    zero-variance groups in arrival order ("least bad": they add no gradient but keep shapes static) and
    ``dynamic/filled_frac`` reports the share. Fewer than `need` are kept only if every group seen is used.
    The buffer lives within one step, so it has no checkpoint state.
    """

    def __init__(self, need: int, max_rounds: int, *, tol: float = 0.0):
        if not isinstance(need, int) or need < 1:
            raise ValueError(f"GroupBuffer.need: must be an int >= 1, got {need!r}")
        if not isinstance(max_rounds, int) or max_rounds < 1:
            raise ValueError(f"GroupBuffer.max_rounds: must be an int >= 1, got {max_rounds!r}")
        self.need, self.max_rounds, self.tol = need, max_rounds, tol
        self.rounds = 0
        self._kept: list[tuple[int, int]] = []  # informative (round, group)
        self._fallback: list[tuple[int, int]] = []  # zero-variance (round, group), arrival order
        self._filled: list[tuple[int, int]] = []
        self._seen = 0

    @property
    def done(self) -> bool:
        return len(self._kept) >= self.need or self.rounds >= self.max_rounds

    def add(self, totals_BxG) -> None:
        """Take one round's group totals [B, G]."""
        if self.done:
            raise RuntimeError("GroupBuffer.add: already done (enough groups or max_rounds reached)")
        informative = informative_mask(totals_BxG, tol=self.tol)
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
        }
