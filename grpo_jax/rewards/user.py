"""A researcher's own rewards, named in `rewards.specs` by import path (`{"name": "my_rewards:brevity"}`).

A user reward is a plain function, as TRL's reward functions are. Two shapes:

    def brevity(completion, **row):              # one completion: its text, then the row's fields
        return 1.0 - len(completion) / 100

    def judge(completions, prompts, **kwargs):    # TRL's: the whole batch, by keyword, one score per completion
        return [float(len(c) < 100) for c in completions]

A function whose parameters include `completions` or `prompts` is called once per batch as TRL calls its
reward functions (`adapt_batched`): `completions` and `prompts` as lists (for conversational rows, those with
`messages`, each prompt is its message list and each completion `[{"role": "assistant", "content": text}]`),
`completion_ids` (each completion's token ids) and every other row field as a list over the batch, as
keywords. `@user_reward("1", batched=True)` asks for that shape by decoration instead. Any other function is
called once per completion (`adapt`): the text first, then the row's fields it names (all with `**row`).

What it returns, per completion: a number; None, meaning the reward does not apply to that row (its score
is NaN there, and the advantage estimators and diagnostics leave it out of that dimension, as TRL does); or
a `RewardResult`. Scores pass through as they are unless `user_reward(low=, high=)` declares a range, outside
of which a score is an error. NaN, infinity, another type, the wrong number of scores, or an exception are
errors: that row does not count for the dimension (NaN, as None) and carries the error in its info
(`base.ERROR_REASONS`), which the trainer counts per dimension (`rewards/<dim>/errors`), reports once per kind
and, above a share of rows, pauses on; a reward that fails on every row of the first step stops the run. A
`RewardInputError` (a row without a field the function requires, or one it raises itself) stops the run at
once. A function already decorated with `base.reward` follows the contract itself and is used as it is.

Versions: `@user_reward("1")` or the spec's `version`; a function with neither is versioned by a digest of its
source (`source_version`), so the manifest records which code scored a run and a resume notes a change.
`threads=N` runs a reward that waits (a remote judge) in threads beside the other rewards
(registry.start_evaluate).
"""

from __future__ import annotations

import functools
import hashlib
import inspect
import math
import numbers
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from grpo_jax import importpath
from grpo_jax.rewards.base import (NOT_APPLICABLE, MissingFieldError, RewardFn, RewardInputError, RewardResult,
                                   bad_score, final_score, raised, reward)

_BY_KEYWORD = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
# the batch arguments TRL passes its reward functions by name, besides the row fields
TRL_ARGUMENTS = ("completions", "prompts", "completion_ids")
UNBOUNDED = (-math.inf, math.inf)


def user_reward(version: str, *, low: float | None = None, high: float | None = None, threads: int = 0,
                batched: bool = False, lo: float | None = None, hi: float | None = None
                ) -> Callable[[Callable], Callable]:
    """Mark a plain reward function with its version and score range, and return it unchanged.

    `version` names the scoring behaviour, as a built-in's does: change it whenever a score changes. The
    run's manifest.json records it, and a spec's `version` pins it (a different one is refused at start).
    `low` / `high` declare the range of its scores (`lo` / `hi` are the same): a score outside it is an error
    counted against the reward; undeclared, scores pass through as they are. A reward used as another's
    `when` condition must declare `high` (its "satisfied" score).
    `threads` > 0 is for a reward that waits rather than computes (a remote judge or verifier): up to that many
    calls run at once in threads, beside the other rewards and, with off-policy rollouts, beside the
    trainer's logging. Such a function must be thread-safe and bound its own waits (a request timeout): a
    call that never returns stalls the run. 0 (the default) calls it on the main thread.
    `batched=True` calls it once per batch, as TRL calls its reward functions (a function with a `completions`
    or `prompts` parameter is called so without it)."""
    low, high = (lo if low is None else low), (hi if high is None else high)
    if not isinstance(version, str) or not version:
        raise ValueError(f"user_reward: version must be a non-empty string such as '1', got {version!r}")
    bounds = (-math.inf if low is None else low, math.inf if high is None else high)
    if not all(isinstance(b, (int, float)) and not isinstance(b, bool) and not math.isnan(b) for b in bounds) \
            or not bounds[0] < bounds[1]:
        raise ValueError(f"user_reward: need numbers low < high, got low={low!r}, high={high!r}")
    if isinstance(threads, bool) or not isinstance(threads, int) or threads < 0:
        raise ValueError(f"user_reward: threads must be an int >= 0, got {threads!r}")
    if not isinstance(batched, bool):
        raise ValueError(f"user_reward: batched must be True or False, got {batched!r}")

    def mark(fn: Callable) -> Callable:
        fn.reward_version = version  # type: ignore[attr-defined]
        fn.score_range = (float(bounds[0]), float(bounds[1]))  # type: ignore[attr-defined]
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
    return adapt_batched(fn, path) if batch_shaped(fn) else adapt(fn, path)


def batch_shaped(fn: Callable) -> bool:
    """Whether `fn` scores a whole batch per call: `user_reward(batched=True)`, or TRL's shape (a parameter
    named `completions` or `prompts`)."""
    if getattr(fn, "reward_batched", False):
        return True
    try:
        names = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False
    return "completions" in names or "prompts" in names


def source_version(fn: Callable) -> str | None:
    """"src-<12 hex>": a digest of `fn`'s source text, the version of a function that declares none (None when
    Python cannot read its source)."""
    try:
        source = inspect.getsource(fn)
    except (OSError, TypeError):
        return None
    return "src-" + hashlib.sha256(source.encode("utf-8")).hexdigest()[:12]


def _as_result(path: str, value: Any, lo: float, hi: float) -> RewardResult:
    """What a user function returned for one completion, as a RewardResult: None -> not applicable (NaN); a
    number or a RewardResult as it is; anything else, a non-finite score or one outside the declared range
    [lo, hi] -> an error (`base.bad_score`) with a NaN score."""
    if value is None:
        return RewardResult(math.nan, {"reason": NOT_APPLICABLE})
    info: dict[str, Any] = {}
    if isinstance(value, RewardResult):
        value, info = value.score, dict(value.info)
        if value is None:
            return RewardResult(math.nan, {**info, "reason": NOT_APPLICABLE})
    if not isinstance(value, (numbers.Real, np.bool_, np.number)) or isinstance(value, np.complexfloating):
        return RewardResult(math.nan, bad_score("wrong_type", (
            f"reward {path!r} returned {type(value).__name__} {value!r:.60}; a reward returns a number, None (does "
            "not apply to this row) or a RewardResult")))
    score = float(value)
    if not math.isfinite(score):
        return RewardResult(math.nan, bad_score("not_finite", f"reward {path!r} returned {score} (return None for "
                                                               "a row the reward does not apply to)"))
    if not lo <= score <= hi:
        return RewardResult(math.nan, bad_score("out_of_range", (
            f"reward {path!r} returned {score:g}, outside the range [{lo:g}, {hi:g}] it declares with "
            "user_reward(low=, high=)")))
    return RewardResult(score, info)


def adapt(fn: Callable, path: str) -> RewardFn:
    """`fn(completion, **row_fields, **kwargs) -> number | None | RewardResult` as `fn(response, sample, **kwargs)`.

    The row's fields are passed as keyword arguments: all of them when `fn` takes `**row`, else those it
    names. A spec keyword argument that is also a row field is an error (which one would it mean?)."""
    completion, takes_any, keywords, required = _signature(fn, path, "completion text")
    lo, hi = getattr(fn, "score_range", UNBOUNDED)

    def scored(response: str, sample: Mapping[str, Any], **kwargs: Any) -> RewardResult:
        fields = {k: sample[k] for k in _fields(path, sample, completion, takes_any, keywords, required, kwargs)}
        return _as_result(path, fn(response, **fields, **kwargs), lo, hi)

    scored.__name__ = scored.__qualname__ = getattr(fn, "__name__", "user_reward")
    wrapped = reward(path, getattr(fn, "reward_version", None), lo=lo, hi=hi, error_score=math.nan)(scored)
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
    wrapped.source_version = source_version(fn)  # type: ignore[attr-defined]
    wrapped.reward_threads = getattr(fn, "reward_threads", 0)  # type: ignore[attr-defined]
    wrapped.reward_batched = batch_shaped(fn)  # type: ignore[attr-defined]
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


def trl_batch(responses: Sequence[str], samples: Sequence[Mapping[str, Any]]) -> dict[str, list]:
    """TRL's batch arguments: `completions` and `prompts` (message lists for conversational rows, those with
    `messages`; texts otherwise) and `completion_ids` (None where the sampler gave none)."""
    chat = [isinstance(s.get("messages"), list) for s in samples]
    return {"completions": [[{"role": "assistant", "content": r}] if c else r for r, c in zip(responses, chat)],
            "prompts": [s.get("messages") if c else s.get("prompt") for s, c in zip(samples, chat)],
            "completion_ids": [s.get("completion_ids") for s in samples]}


def adapt_batched(fn: Callable, path: str) -> RewardFn:
    """A batch-shaped `fn` (`batch_shaped`), called once per batch, as `fn(responses, samples, **kwargs) ->
    list[RewardResult]`. Its first parameter gets the completions unless it names `completions` itself; the
    TRL arguments it names (`trl_batch`: all of them when it takes **kwargs) and each row field are passed by
    keyword, a field as a list over the batch (the fields of its first row; every row must have those the
    function requires). Each value is read as a per-completion reward's is (`_as_result`); an exception fails
    every row of the batch, a return value that is not one score per completion too; a `RewardInputError`
    stops the run."""
    first, takes_any, keywords, required = _signature(fn, path, "completions list")
    params = inspect.signature(fn).parameters
    trl = [a for a in TRL_ARGUMENTS if a in params or takes_any]
    positional = first not in TRL_ARGUMENTS  # `def r(completions, ...)`: completions by keyword, as TRL passes it
    lo, hi = getattr(fn, "score_range", UNBOUNDED)

    def scored_batch(responses: Sequence[str], samples: Sequence[Mapping[str, Any]],
                     **kwargs: Any) -> list[RewardResult]:
        t0 = time.perf_counter()
        fields = []  # each row's fields the function takes: every row must have those it requires
        for i, sample in enumerate(samples):
            if not isinstance(sample, Mapping):
                raise RewardInputError(f"{path}: sample {i} must be a mapping, got {type(sample).__name__}")
            fields.append(_fields(path, {k: v for k, v in sample.items() if k not in TRL_ARGUMENTS}, first,
                                  takes_any, keywords, required - set(TRL_ARGUMENTS), kwargs))
        columns = {k: [s.get(k) for s in samples] for k in (fields[0] if fields else [])}
        batch = trl_batch(responses, samples)
        call = {**columns, **{a: batch[a] for a in trl}, **kwargs}
        try:
            values = fn(list(responses), **call) if positional else fn(**call)
            results = _batch_results(path, values, len(responses), lo, hi)
        except RewardInputError:
            raise
        except Exception as e:  # noqa: BLE001 - the reward must not crash training
            results = [RewardResult(math.nan, raised(e))] * len(responses)
        per = (time.perf_counter() - t0) / max(len(responses), 1)
        return [RewardResult(final_score(r.score, {"reason": "ok", **r.info}, lo, hi),
                             {"reason": "ok", **r.info, "time_s": per}) for r in results]

    scored_batch.__name__ = scored_batch.__qualname__ = getattr(fn, "__name__", "user_reward")
    scored_batch.reward_name = path  # type: ignore[attr-defined]
    scored_batch.reward_version = getattr(fn, "reward_version", None)  # type: ignore[attr-defined]
    scored_batch.score_range = (lo, hi)  # type: ignore[attr-defined]
    return _marked(scored_batch, fn, takes_any, keywords - set(TRL_ARGUMENTS))


def _batch_results(path: str, values: Any, n: int, lo: float, hi: float) -> list[RewardResult]:
    """A batched reward's return value as n RewardResults; not a sequence of n values: every row fails."""
    if isinstance(values, (str, bytes, Mapping)) or not isinstance(values, (Sequence, np.ndarray)):
        failed = bad_score("wrong_type", f"reward {path!r} returned {type(values).__name__} {values!r:.60}; a "
                                         f"batched reward returns one score per completion (a list of {n})")
        return [RewardResult(math.nan, failed)] * n
    if len(values) != n:
        failed = bad_score("wrong_length", f"reward {path!r} returned {len(values)} scores for {n} completions")
        return [RewardResult(math.nan, failed)] * n
    return [_as_result(path, v, lo, hi) for v in values]


def _source_file(fn: Callable) -> str | None:
    """The file defining `fn` (for the manifest), or None when Python cannot tell (a builtin, a REPL)."""
    try:
        return inspect.getsourcefile(fn)
    except TypeError:
        return None
