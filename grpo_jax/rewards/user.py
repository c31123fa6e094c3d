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

`@user_reward("1", batched=True)` takes the batch in one call (`fn(completions, **row_columns)`, each field a list,
returning one score per completion), as TRL's reward functions do (`adapt_batched`); `threads=N` runs a reward
that waits (a remote judge) in threads beside the other rewards (registry.start_evaluate).
"""

from __future__ import annotations

import functools
import inspect
import numbers
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from grpo_jax import importpath
from grpo_jax.rewards.base import MissingFieldError, RewardFn, RewardInputError, RewardResult, bounded, reward

_BY_KEYWORD = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)


def user_reward(version: str, *, lo: float = 0.0, hi: float = 1.0, threads: int = 0,
                batched: bool = False) -> Callable[[Callable], Callable]:
    """Mark a plain reward function with its version and score range, and return it unchanged.

    `version` names the scoring behaviour, as a built-in's does: change it whenever a score changes. The
    run's manifest.json records it, and a spec's `version` pins it (a different one is refused at start).
    `threads` > 0 is for a reward that waits rather than computes (a remote judge or verifier): up to that many
    calls run at once in threads, beside the other rewards and, with off-policy rollouts, beside the
    trainer's logging. Such a function must be thread-safe and bound its own waits (a request timeout): a
    call that never returns stalls the run. 0 (the default) calls it on the main thread.
    `batched=True` calls it once per batch, as TRL calls its reward functions: the completions as a list, each
    row field as a list over the batch, and it returns one number (or RewardResult) per completion (one
    request to a judge for the whole batch)."""
    if not isinstance(version, str) or not version:
        raise ValueError(f"user_reward: version must be a non-empty string such as '1', got {version!r}")
    if not (isinstance(lo, (int, float)) and isinstance(hi, (int, float)) and lo < hi):
        raise ValueError(f"user_reward: need numbers lo < hi, got lo={lo!r}, hi={hi!r}")
    if isinstance(threads, bool) or not isinstance(threads, int) or threads < 0:
        raise ValueError(f"user_reward: threads must be an int >= 0, got {threads!r}")
    if not isinstance(batched, bool):
        raise ValueError(f"user_reward: batched must be True or False, got {batched!r}")

    def mark(fn: Callable) -> Callable:
        fn.reward_version = version  # type: ignore[attr-defined]
        fn.score_range = (float(lo), float(hi))  # type: ignore[attr-defined]
        fn.reward_threads = threads  # type: ignore[attr-defined]
        fn.reward_batched = batched  # type: ignore[attr-defined]
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
    return adapt_batched(fn, path) if getattr(fn, "reward_batched", False) else adapt(fn, path)


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
    completion, takes_any, keywords, required = _signature(fn, path, "completion text")
    lo, hi = getattr(fn, "score_range", (0.0, 1.0))

    def scored(response: str, sample: Mapping[str, Any], **kwargs: Any) -> RewardResult:
        fields = {k: sample[k] for k in _fields(path, sample, completion, takes_any, keywords, required, kwargs)}
        return _as_result(path, fn(response, **fields, **kwargs), lo, hi)

    scored.__name__ = scored.__qualname__ = getattr(fn, "__name__", "user_reward")
    wrapped = reward(path, getattr(fn, "reward_version", None), lo=lo, hi=hi)(scored)  # type: ignore[arg-type]
    return _marked(wrapped, fn, takes_any, keywords)


def _signature(fn: Callable, path: str, example: str) -> tuple[str, bool, set[str], set[str]]:
    """(the name of `fn`'s first parameter, whether it takes **row, the fields it names, those without a
    default); a ValueError naming the path when `fn` cannot take the completion(s) first."""
    try:
        params = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError) as e:
        raise ValueError(f"{path!r}: cannot read the function's signature: {e}") from None
    if not params or params[0].kind not in (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD):
        raise ValueError(f"{path!r} must take the {example} as its first argument, e.g. "
                         f"def brevity({example.split()[0]}, **row)")
    rest = params[1:]
    takes_any = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in rest)
    keywords = {p.name for p in rest if p.kind in _BY_KEYWORD}
    required = {p.name for p in rest if p.kind in _BY_KEYWORD and p.default is inspect.Parameter.empty}
    return params[0].name, takes_any, keywords, required


def _marked(wrapped: Callable, fn: Callable, takes_any: bool, keywords: set[str]) -> RewardFn:
    wrapped.accepted_kwargs = None if takes_any else frozenset(keywords)  # type: ignore[attr-defined]
    wrapped.source_file = _source_file(fn)  # type: ignore[attr-defined]
    wrapped.reward_threads = getattr(fn, "reward_threads", 0)  # type: ignore[attr-defined]
    wrapped.reward_batched = getattr(fn, "reward_batched", False)  # type: ignore[attr-defined]
    return wrapped  # type: ignore[return-value]


def _fields(path: str, sample: Mapping[str, Any], first: str, takes_any: bool, keywords: set[str],
            required: set[str], kwargs: Mapping[str, Any]) -> list[str]:
    """The row's fields the function takes (all with **row, else those it names); RewardInputError when a spec
    keyword argument is also a field, MissingFieldError when a field it requires is missing."""
    names = [k for k in sample if isinstance(k, str) and k != first and (takes_any or k in keywords)]
    clash = sorted(set(names) & set(kwargs))
    if clash:
        raise RewardInputError(f"reward {path!r}: keyword arguments {clash} of its spec are also fields of the "
                               "row; rename them")
    missing = sorted(required - set(names) - set(kwargs))
    if missing:
        raise MissingFieldError(f"reward {path!r} takes {missing}, which the row does not have "
                                f"(row fields: {sorted(map(str, sample))})")
    return names


def adapt_batched(fn: Callable, path: str) -> RewardFn:
    """`fn(completions, **row_columns, **kwargs) -> one number | RewardResult per completion`, called once per
    batch, as `fn(responses, samples, **kwargs) -> list[RewardResult]`. Each row field is passed as a list over
    the batch (the fields of its first row; every row must have those the function requires). Scores are
    clamped to its range as a per-completion reward's are; an exception, or a return value that is not one
    score per completion, costs every completion of the batch a score of 0 with the error in its info; a
    `RewardInputError` stops the run."""
    first, takes_any, keywords, required = _signature(fn, path, "completions list")
    lo, hi = getattr(fn, "score_range", (0.0, 1.0))

    def scored_batch(responses: Sequence[str], samples: Sequence[Mapping[str, Any]],
                     **kwargs: Any) -> list[RewardResult]:
        t0 = time.perf_counter()
        fields = []  # each row's fields the function takes: every row must have those it requires
        for i, sample in enumerate(samples):
            if not isinstance(sample, Mapping):
                raise RewardInputError(f"{path}: sample {i} must be a mapping, got {type(sample).__name__}")
            fields.append(_fields(path, sample, first, takes_any, keywords, required, kwargs))
        columns = {k: [s.get(k) for s in samples] for k in (fields[0] if fields else [])}
        try:
            values = list(fn(list(responses), **columns, **kwargs))
            if len(values) != len(responses):
                raise TypeError(f"returned {len(values)} scores for {len(responses)} completions")
            results = [_as_result(path, v, lo, hi) for v in values]
        except RewardInputError:
            raise
        except Exception as e:  # noqa: BLE001 - the reward must not crash training
            results = [RewardResult(0.0, {"reason": "internal_error", "error": repr(e)[:300]})] * len(responses)
        per = (time.perf_counter() - t0) / max(len(responses), 1)
        return [RewardResult(bounded(r.score, lo, hi), {"reason": "ok", **r.info, "time_s": per}) for r in results]

    scored_batch.__name__ = scored_batch.__qualname__ = getattr(fn, "__name__", "user_reward")
    scored_batch.reward_name = path  # type: ignore[attr-defined]
    scored_batch.reward_version = getattr(fn, "reward_version", None)  # type: ignore[attr-defined]
    scored_batch.score_range = (lo, hi)  # type: ignore[attr-defined]
    return _marked(scored_batch, fn, takes_any, keywords)


def _source_file(fn: Callable) -> str | None:
    """The file defining `fn` (for the manifest), or None when Python cannot tell (a builtin, a REPL)."""
    try:
        return inspect.getsourcefile(fn)
    except TypeError:
        return None
