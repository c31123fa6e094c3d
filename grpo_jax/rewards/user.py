"""A researcher's own rewards, named in `rewards.specs` by import path (`{"name": "my_rewards:brevity"}`).

A user reward is a plain function, as TRL's reward functions are: the completion text first, then the
row's fields as keyword arguments (and the spec's `kwargs`), returning a number or a `RewardResult`:

    from grpo_jax.rewards import user_reward

    @user_reward("1")                      # its version; optional when the spec gives "version"
    def brevity(completion, **row):
        return 1.0 - len(completion) / 100

`load_reward` adapts it to the reward contract of `base.reward` (`fn(response, sample, **kwargs)`): the
score is clamped to its range ([0, 1] unless `user_reward(lo=, hi=)` says otherwise) and NaN scores 0; an
exception raised by the function, or a value that is not a number, costs that completion a score of 0 with
the error in its info, never the run; a `RewardInputError` (a row without a field the function requires,
or one it raises itself) still stops the run. A function already decorated with `base.reward` follows the
contract itself and is used as it is.
"""

from __future__ import annotations

import functools
import inspect
import numbers
from collections.abc import Callable, Mapping
from typing import Any

from grpo_jax import importpath
from grpo_jax.rewards.base import MissingFieldError, RewardFn, RewardInputError, RewardResult, reward

_BY_KEYWORD = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)


def user_reward(version: str, *, lo: float = 0.0, hi: float = 1.0) -> Callable[[Callable], Callable]:
    """Mark a plain reward function with its version and score range, and return it unchanged.

    `version` names the scoring behaviour, as a built-in's does: change it whenever a score changes. The
    run's manifest.json records it, and a spec's `version` pins it (a different one is refused at start)."""
    if not isinstance(version, str) or not version:
        raise ValueError(f"user_reward: version must be a non-empty string such as '1', got {version!r}")
    if not (isinstance(lo, (int, float)) and isinstance(hi, (int, float)) and lo < hi):
        raise ValueError(f"user_reward: need numbers lo < hi, got lo={lo!r}, hi={hi!r}")

    def mark(fn: Callable) -> Callable:
        fn.reward_version = version  # type: ignore[attr-defined]
        fn.score_range = (float(lo), float(hi))  # type: ignore[attr-defined]
        return fn

    return mark


@functools.cache
def load_reward(path: str) -> RewardFn:
    """The reward `package.module:function` names, adapted to the reward contract (once per process, so
    every spec and every step uses the same function object). One-line ValueError naming the path when
    it cannot be imported or is not a function."""
    fn = importpath.load(path)
    if not callable(fn):
        raise ValueError(f"{path!r} is a {type(fn).__name__}, not a reward function")
    if hasattr(fn, "reward_name"):  # made with base.reward: already follows the contract
        return fn
    return adapt(fn, path)


def _as_result(path: str, value: Any, lo: float, hi: float) -> RewardResult:
    """What a user function returned, as a RewardResult (a bool or number, or a RewardResult as it is);
    a score outside [lo, hi] keeps its value in info as `unclamped`, so clamping is visible in the logs."""
    if isinstance(value, RewardResult):
        score, info = value.score, dict(value.info)
    elif isinstance(value, numbers.Real):
        score, info = float(value), {}
    else:
        raise TypeError(f"reward {path!r} returned {type(value).__name__} {value!r:.60}; it must return a number "
                        "or a RewardResult")
    if not lo <= score <= hi and score == score:  # NaN is base.reward's business (it scores 0)
        info["unclamped"] = score
    return RewardResult(score, info)


def adapt(fn: Callable, path: str) -> RewardFn:
    """`fn(completion, **row_fields, **kwargs) -> number | RewardResult` as `fn(response, sample, **kwargs)`.

    The row's fields are passed as keyword arguments: all of them when `fn` takes `**row`, else those it
    names. A spec keyword argument that is also a row field is an error (which one would it mean?)."""
    try:
        params = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError) as e:
        raise ValueError(f"{path!r}: cannot read the function's signature: {e}") from None
    if not params or params[0].kind not in (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD):
        raise ValueError(f"{path!r} must take the completion text as its first argument, e.g. "
                         "def brevity(completion, **row) -> float")
    completion, rest = params[0].name, params[1:]
    takes_any = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in rest)
    keywords = {p.name for p in rest if p.kind in _BY_KEYWORD}
    required = {p.name for p in rest if p.kind in _BY_KEYWORD and p.default is inspect.Parameter.empty}
    lo, hi = getattr(fn, "score_range", (0.0, 1.0))

    def scored(response: str, sample: Mapping[str, Any], **kwargs: Any) -> RewardResult:
        fields = {k: v for k, v in sample.items()
                  if isinstance(k, str) and k != completion and (takes_any or k in keywords)}
        clash = sorted(set(fields) & set(kwargs))
        if clash:
            raise RewardInputError(f"reward {path!r}: keyword arguments {clash} of its spec are also fields of the "
                                   "row; rename them")
        missing = sorted(required - set(fields) - set(kwargs))
        if missing:
            raise MissingFieldError(f"reward {path!r} takes {missing}, which the row does not have "
                                    f"(row fields: {sorted(map(str, sample))})")
        return _as_result(path, fn(response, **fields, **kwargs), lo, hi)

    scored.__name__ = scored.__qualname__ = getattr(fn, "__name__", "user_reward")
    wrapped = reward(path, getattr(fn, "reward_version", None), lo=lo, hi=hi)(scored)  # type: ignore[arg-type]
    wrapped.accepted_kwargs = None if takes_any else frozenset(keywords)  # type: ignore[attr-defined]
    wrapped.source_file = _source_file(fn)  # type: ignore[attr-defined]
    return wrapped


def _source_file(fn: Callable) -> str | None:
    """The file defining `fn` (for the manifest), or None when Python cannot tell (a builtin, a REPL)."""
    try:
        return inspect.getsourcefile(fn)
    except TypeError:
        return None
