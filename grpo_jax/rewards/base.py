"""The reward contract shared by every reward: result type, errors, and the `@reward` decorator.

A reward is `fn(response: str, sample: Mapping, **kwargs) -> RewardResult`. Model output is untrusted:
whatever it contains, the reward returns a bounded score with the reason in `info`. A malformed
`sample` or a bad keyword argument is a bug in the data or the config, not in the model, so it raises
an error naming the field. The decorator enforces that split so that an unexpected exception on some
strange response costs one sample a zero score, never the training run.
"""

from __future__ import annotations

import functools
import inspect
import math
import time
import traceback
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any


class RewardInputError(ValueError):
    """A malformed `sample` field or reward keyword argument (data/config bug, never model output)."""


class MissingFieldError(RewardInputError, KeyError):
    """A required `sample` field is absent. A KeyError too, so `except KeyError` callers still work."""

    def __str__(self) -> str:  # KeyError would quote the whole message
        return str(self.args[0]) if self.args else ""


@dataclass(frozen=True)
class RewardResult:
    """One reward value and why: `score` (the built-ins' in [0, 1], penalties in [-1, 0]; NaN where the reward
    does not apply), `info` for logs/diagnostics."""

    score: float
    info: Mapping[str, Any] = field(default_factory=dict)


RewardFn = Callable[..., RewardResult]


def require(sample: Mapping[str, Any], key: str, types: type | tuple[type, ...] | None = None) -> Any:
    """`sample[key]`, or an error naming the field (missing, or not of `types`)."""
    if not isinstance(sample, Mapping):
        raise RewardInputError(f"sample must be a mapping, got {type(sample).__name__}")
    if key not in sample:
        raise MissingFieldError(f"sample is missing required field {key!r} (has: {sorted(map(str, sample))})")
    value = sample[key]
    if types is not None and not isinstance(value, types):
        raise RewardInputError(f"sample field {key!r} must be {types}, got {type(value).__name__}")
    return value


def as_str_list(value: Any, field_name: str) -> list[str]:
    """A reference field given as one string or a list of strings -> non-empty list of strings."""
    items = [value] if isinstance(value, (str, int, float)) and not isinstance(value, bool) else value
    if not isinstance(items, Sequence) or isinstance(items, str) or not items:
        raise RewardInputError(f"sample field {field_name!r} must be a string or a non-empty list of strings")
    out = []
    for i, item in enumerate(items):
        if isinstance(item, bool) or not isinstance(item, (str, int, float)):
            raise RewardInputError(f"sample field {field_name}[{i}] must be a string, got {type(item).__name__}")
        out.append(str(item))
    return out


# A reward's info["reason"] for a row it does not score: its score is NaN there, which the advantage estimators
# and the diagnostics read as "missing" (left out of that dimension's statistics, as TRL reads a None).
NOT_APPLICABLE = "not_applicable"
# Reasons that mean the reward itself failed on the row (not the model): `internal_error` (it raised) and
# `bad_score` (a user reward returned NaN, the wrong type or count, or a score outside its declared range).
# Each such row carries info["error"] (one line) and info["error_kind"]; the trainer counts them per dimension.
ERROR_REASONS = ("internal_error", "bad_score")


def raised(e: BaseException) -> dict[str, Any]:
    """The info of a row on which the reward raised `e`: the exception's last traceback line as the error, its
    class as the kind, and where in the reward's own code it was raised (the innermost frame)."""
    frames = traceback.extract_tb(e.__traceback__) if e.__traceback__ is not None else []
    where = f"{frames[-1].filename}:{frames[-1].lineno} in {frames[-1].name}" if frames else None
    line = traceback.format_exception_only(type(e), e)[-1].strip()
    return {"reason": "internal_error", "error": " ".join(line.split())[:300], "error_kind": type(e).__name__,
            **({"where": where} if where else {})}


def bad_score(kind: str, message: str) -> dict[str, Any]:
    """The info of a row whose score a user reward got wrong (`kind`: not_finite, wrong_type, wrong_length,
    out_of_range)."""
    return {"reason": "bad_score", "error": message[:300], "error_kind": kind}


def final_score(score: float, info: Mapping[str, Any], lo: float, hi: float) -> float:
    """The score a row keeps: NaN where the reward does not apply or a user reward failed with a NaN score (the
    row is left out of that dimension), else `bounded`."""
    reason = info.get("reason")
    if reason == NOT_APPLICABLE or (reason in ERROR_REASONS and math.isnan(float(score))):
        return math.nan
    return bounded(score, lo, hi)


def bounded(score: float, lo: float, hi: float) -> float:
    """Clamp and sanitise a score: NaN would silently poison the advantage estimator."""
    score = float(score)
    if math.isnan(score):
        return 0.0
    return min(hi, max(lo, score))


def reward(name: str, version: str | None, *, lo: float = 0.0, hi: float = 1.0,
           error_score: float = 0.0) -> Callable[[RewardFn], RewardFn]:
    """Register metadata on a reward function and make it total on model output.

    Why a decorator: every reward needs the same three guarantees (bounded score, timing in info, no
    exception escaping on strange responses) and writing them once keeps each reward a plain function.
    `RewardInputError` (bad sample/kwargs) still propagates: those must stop the run with a clear message.

    `version` (a string, "1", "2", ...) names the scoring behaviour: bump it in the same change as anything
    that alters the score of some (response, sample, kwargs), and re-record the regression set
    (`python -m grpo_jax.rewards.regress --record`, which refuses a changed score under an unchanged
    version). Changes that keep every score (speed, info fields, messages) keep the version. Each run's
    `manifest.json` records the versions that scored it, and `RewardSpec(version=...)` can pin one.
    """

    def wrap(fn: RewardFn) -> RewardFn:
        signature = inspect.signature(fn)

        @functools.wraps(fn)
        def wrapped(response: str, sample: Mapping[str, Any], **kwargs: Any) -> RewardResult:
            t0 = time.perf_counter()
            if not isinstance(sample, Mapping):
                raise RewardInputError(f"{name}: sample must be a mapping, got {type(sample).__name__}")
            try:
                signature.bind(response, sample, **kwargs)
            except TypeError as e:
                raise RewardInputError(f"{name}: bad keyword arguments {sorted(kwargs)}: {e}") from e
            if not isinstance(response, str):
                result = RewardResult(0.0, {"reason": "response_not_a_string"})
            else:
                try:
                    result = fn(response, sample, **kwargs)
                except RewardInputError:
                    raise
                except Exception as e:  # noqa: BLE001 - the reward must not crash training
                    result = RewardResult(error_score, raised(e))
            info = dict(result.info)
            info.setdefault("reason", "ok")
            info["time_s"] = time.perf_counter() - t0
            return RewardResult(final_score(result.score, info, lo, hi), info)

        wrapped.reward_name = name  # type: ignore[attr-defined]
        wrapped.reward_version = version  # type: ignore[attr-defined]
        wrapped.score_range = (lo, hi)  # type: ignore[attr-defined]
        return wrapped

    return wrap
