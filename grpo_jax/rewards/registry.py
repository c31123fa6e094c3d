"""Reward registry and batch evaluation into a per-dimension reward matrix R[N, K].

The matrix keeps one column per reward dimension and is never pre-summed: how dimensions combine
(sum-then-normalise, GDPO's normalise-then-sum, conditioning one reward on another) is the advantage
estimator's research question, and a pre-summed scalar would make reward collapse invisible. Weights
travel alongside (`weights(specs)`) for the estimator to apply.

A spec names a built-in reward (a key of REWARDS) or a researcher's own function by import path,
`package.module:function` (rewards/user.py): config.json keeps the path, so a resumed run, a rollback or an
export imports it again exactly as it looks up a built-in.

Sandboxed rewards (code) are submitted to a bounded `SandboxPool` first, rewards that wait (a remote judge,
`user_reward(threads=)`) to their own threads, and the inline rewards are computed while those run;
`start_evaluate` returns before the others finish, so the trainer can do its other host work meanwhile.
"""

from __future__ import annotations

import functools
import inspect
import math
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field, fields
from types import MappingProxyType
from typing import Any

import numpy as np

from grpo_jax.config import REWARD_SPEC_FIELDS
from grpo_jax.importpath import is_import_path
from grpo_jax.rewards.base import RewardFn, RewardInputError, RewardResult
from grpo_jax.rewards.code import code_reward
from grpo_jax.rewards.countdown import (countdown_numbers_reward, countdown_ops_reward, countdown_reward,
                                         countdown_steps_reward)
from grpo_jax.rewards.format import format_reward
from grpo_jax.rewards.math import math_reward
from grpo_jax.rewards.penalties import length_budget, length_penalty, overlong_penalty, repetition_penalty
from grpo_jax.rewards.sandbox import SandboxPool
from grpo_jax.rewards.science import science_reward
from grpo_jax.rewards.translation import translation_reward
from grpo_jax.rewards.user import load_reward

REWARDS: Mapping[str, RewardFn] = MappingProxyType(
    {
        fn.reward_name: fn  # type: ignore[attr-defined]
        for fn in (
            format_reward,
            math_reward,
            code_reward,
            science_reward,
            translation_reward,
            countdown_reward,
            countdown_numbers_reward,
            countdown_steps_reward,
            countdown_ops_reward,
            repetition_penalty,
            overlong_penalty,
            length_penalty,
            length_budget,
        )
    }
)
SANDBOXED = frozenset({"code"})  # rewards that execute model output: evaluated in the pool


def reward_version(name: str) -> str:
    """Current version string of a registered reward."""
    return REWARDS[_known(name)].reward_version  # type: ignore[attr-defined]


def _known(name: str) -> str:
    if name not in REWARDS:
        raise ValueError(f"unknown reward {name!r}; known rewards: {', '.join(sorted(REWARDS))}, or your own "
                         "function as package.module:function")
    return name


def reward_fn(name: str) -> RewardFn:
    """The reward a spec's `name` names: a built-in, or the function at an import path (imported once)."""
    return load_reward(name) if is_import_path(name) else REWARDS[_known(name)]


def spec_version(spec: "RewardSpec") -> str:
    """The version that scores a dimension: its reward's own, or for a user function that declares none, the
    spec's `version`, else the digest of the function's source (`user.source_version`; RewardSpec requires one
    of the three)."""
    fn = reward_fn(spec.name)
    return (getattr(fn, "reward_version", None) or spec.version  # type: ignore[return-value]
            or getattr(fn, "source_version", None))


def _keyword_params(fn: RewardFn) -> set[str] | None:
    """The keyword arguments a spec may give `fn`: a built-in's keyword-only parameters, a user function's
    named parameters (`accepted_kwargs`, set by rewards.user.adapt); None when it takes any (`**row`)."""
    if hasattr(fn, "accepted_kwargs"):
        accepted = fn.accepted_kwargs  # type: ignore[attr-defined]
        return None if accepted is None else set(accepted)
    params = inspect.signature(fn).parameters.values()
    return {p.name for p in params if p.kind is inspect.Parameter.KEYWORD_ONLY}


@dataclass(frozen=True)
class RewardSpec:
    """One reward dimension: which reward, its weight (applied later by the advantage estimator), and
    its keyword arguments. Validated at construction so a typo fails at config time, not mid-run."""

    name: str  # a key of REWARDS, or a function of your own as package.module:function
    weight: float = 1.0  # finite; used by the advantage estimator, never to pre-sum rewards
    kwargs: Mapping[str, Any] = field(default_factory=dict)  # keyword-only arguments of the reward
    version: str | None = None  # if set, must equal the reward's current version (pins behaviour); the version
    #                               of a user function that declares none
    label: str | None = None  # dimension name; defaults to `name` (set it to use a reward twice)
    when: str | None = None  # another dimension: this one counts only where that one is satisfied (`gate`)

    def __post_init__(self) -> None:
        fn = reward_fn(self.name)
        if isinstance(self.weight, bool) or not isinstance(self.weight, (int, float)) or not math.isfinite(self.weight):
            raise ValueError(f"RewardSpec({self.name!r}).weight must be a finite number, got {self.weight!r}")
        if not isinstance(self.kwargs, Mapping) or not all(isinstance(k, str) for k in self.kwargs):
            raise ValueError(f"RewardSpec({self.name!r}).kwargs must be a mapping with string keys")
        accepted = _keyword_params(fn)
        unknown = set() if accepted is None else set(self.kwargs) - accepted
        if unknown:
            raise ValueError(
                f"RewardSpec({self.name!r}) got unknown kwargs {sorted(unknown)}; "
                f"accepted: {sorted(accepted)}"  # type: ignore[arg-type]
            )
        current = getattr(fn, "reward_version", None)
        if self.version is not None and (not isinstance(self.version, str) or not self.version):
            raise ValueError(f"RewardSpec({self.name!r}).version must be a non-empty string such as \"1\", "
                             f"got {self.version!r}")
        if current is None and self.version is None and getattr(fn, "source_version", None) is None:
            raise ValueError(f"reward {self.name!r} has no version and Python cannot read its source to digest: "
                             "decorate it with @grpo_jax.rewards.user_reward(\"1\") or give its spec \"version\": "
                             "\"1\" (change it whenever its scores change; the run's manifest.json records it)")
        if current is not None and self.version is not None and self.version != current:
            raise ValueError(f"RewardSpec({self.name!r}) pins version {self.version!r} but the reward is {current!r}")
        if self.label is not None and (not isinstance(self.label, str) or not self.label):
            raise ValueError(f"RewardSpec({self.name!r}).label must be a non-empty string")
        if self.when is not None and (not isinstance(self.when, str) or not self.when):
            raise ValueError(f"RewardSpec({self.name!r}).when must be a dimension name, got {self.when!r}")
        object.__setattr__(self, "kwargs", dict(self.kwargs))  # a private copy (plain dict: picklable, asdict-able)
        object.__setattr__(self, "weight", float(self.weight))

    @property
    def dimension(self) -> str:
        """The column name: `label`, else the reward's name (a user function's own name, not its path, so
        that metric names stay `reward/<name>/...`)."""
        return self.label or self.name.rpartition(":")[2]


# config.REWARD_SPEC_FIELDS names these fields for the checks of a rewards.specs entry (config is built without
# importing this module): the two differing fails here, at import.
if tuple(f.name for f in fields(RewardSpec)) != REWARD_SPEC_FIELDS:
    raise ValueError(f"RewardSpec fields {tuple(f.name for f in fields(RewardSpec))} differ from "
                     f"grpo_jax.config.REWARD_SPEC_FIELDS {REWARD_SPEC_FIELDS}")


def dimension_names(specs: Sequence[RewardSpec]) -> list[str]:
    """Column names of R, in order; duplicates are an error (give one of them a `label`)."""
    names = [s.dimension for s in specs]
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise ValueError(f"duplicate reward dimensions {duplicates}: give RewardSpec a distinct label")
    ungated = {s.dimension for s in specs if s.when is None}
    for s in specs:
        if s.when is not None and (s.when == s.dimension or s.when not in ungated):
            raise ValueError(f"reward dimension {s.dimension!r}: when={s.when!r} must name another dimension of "
                             f"this run that has no `when` of its own; dimensions without one: {sorted(ungated)}")
        if s.when is not None:
            _check_gate_range(s, next(g for g in specs if g.dimension == s.when))
    return names


def _check_gate_range(spec: RewardSpec, condition: RewardSpec) -> None:
    """`gate` needs the condition's top score ("satisfied") and the gated reward's lowest: a user reward that
    declares no range (`user_reward(low=, high=)`) has neither, which is an error naming the dimension."""
    for s, end, word in ((condition, 1, "high"), (spec, 0, "low")):
        if not math.isfinite(reward_fn(s.name).score_range[end]):  # type: ignore[attr-defined]
            raise ValueError(f"reward dimension {spec.dimension!r} has when={spec.when!r}, which needs reward "
                             f"{s.name!r} to declare its {word} score: @user_reward(..., low=, high=)")


def describe(specs: Sequence[RewardSpec]) -> list[dict[str, Any]]:
    """What scored a run, one JSON-able record per dimension in column order of R: the dimension, the
    reward and the version it runs now (not the pin, which may be unset), its weight and kwargs; for a
    user function also the file it was imported from."""
    return [{"dimension": s.dimension, "name": s.name, "version": spec_version(s), "weight": s.weight,
             "kwargs": dict(s.kwargs), **({"when": s.when} if s.when else {}),
             **({"file": getattr(reward_fn(s.name), "source_file", None)} if is_import_path(s.name) else {})}
            for s in specs]


def weights(specs: Sequence[RewardSpec]) -> np.ndarray:
    """Weights w[K] (float32) aligned with the columns of R."""
    return np.asarray([s.weight for s in specs], dtype=np.float32)


class RewardError(RuntimeError):
    """A reward raised on one response (a bug in the reward, or its pool shut down): the message names the
    dimension, the response and its row. A `RewardInputError` (bad row or kwargs) keeps its class (a
    `MissingFieldError` is a KeyError too), with the same message."""


def _describe(i: int, n: int, sample: Any) -> str:
    if not isinstance(sample, Mapping):
        return f"response {i} of {n} (a row that is a {type(sample).__name__}, not a mapping)"
    row = next((f"{k}={sample[k]!r:.60}" for k in ("id", "task_id", "problem_id") if k in sample), None)
    prompt = sample.get("prompt")
    where = row or (f"prompt {prompt!r:.80}" if isinstance(prompt, str) else f"fields {sorted(map(str, sample))}")
    return f"response {i} of {n} (row {where})"


def _failed(spec: RewardSpec, where: str, e: BaseException) -> Exception:
    """What `spec`'s reward raised on `where` (a response, or a batch), naming the dimension and the row."""
    msg = f"reward {spec.dimension!r} ({spec.name}) failed on {where}: {type(e).__name__}: {e}"
    return type(e)(msg) if isinstance(e, RewardInputError) else RewardError(msg)  # MissingFieldError stays one


def _batch_scorer(spec: RewardSpec) -> Callable[[list[tuple[str, Mapping[str, Any]]]], list[RewardResult]]:
    """`score(pairs)`: a batched reward (`user_reward(batched=True)`) of every response in one call; what it
    raises comes out naming the dimension and the batch."""
    fn = reward_fn(spec.name)
    kwargs = dict(spec.kwargs)

    def score(pairs):
        try:
            return fn([r for r, _ in pairs], [s for _, s in pairs], **kwargs)
        except Exception as e:  # noqa: BLE001 - re-raised, naming the batch
            first = _describe(0, len(pairs), pairs[0][1]) if pairs else "none"
            raise _failed(spec, f"its batch of {len(pairs)} responses (first: {first})", e) from e

    return score


def _scorer(spec: RewardSpec, n: int) -> Callable[[tuple[int, tuple[str, Mapping[str, Any]]]], RewardResult]:
    """`score((i, (response, sample)))`: the spec's reward of one response; an exception it raises comes out
    naming the dimension, the response's position among the n and its row (`RewardError`)."""
    fn = reward_fn(spec.name)
    kwargs = dict(spec.kwargs)

    def score(item):
        i, (response, sample) = item
        try:
            return fn(response, sample, **kwargs)
        except Exception as e:  # noqa: BLE001 - re-raised, naming the row
            raise _failed(spec, _describe(i, n, sample), e) from e

    return score


def evaluate(
    specs: Sequence[RewardSpec],
    responses: Sequence[str],
    samples: Sequence[Mapping[str, Any]],
    *,
    pool: SandboxPool | None = None,
    max_workers: int = 2,
) -> tuple[np.ndarray, dict[str, Any]]:
    """Score N responses on K dimensions -> (R [N, K] float32, infos).

    `samples[i]` is the dataset row (plus optional sampler facts such as `response_length`) for
    `responses[i]`. infos: `dimensions`, `versions`, `weights`, per-dimension wall time `time_s`,
    and `per_response[i][dimension]` = that reward's info dict.
    """
    return start_evaluate(specs, responses, samples, pool=pool, max_workers=max_workers).result()


def threads(spec: RewardSpec) -> int:
    """How many threads run the spec's reward beside the main thread (`reward_threads`, set by
    `user_reward(threads=)`): 0 for a reward that computes (it runs inline, where the math reward's SIGALRM
    timeout can be armed), more for one that waits (a remote judge)."""
    return int(getattr(reward_fn(spec.name), "reward_threads", 0))


def batched(spec: RewardSpec) -> bool:
    """Whether the spec's reward scores a whole batch in one call (`user_reward(batched=True)`)."""
    return bool(getattr(reward_fn(spec.name), "reward_batched", False))


def start_evaluate(
    specs: Sequence[RewardSpec],
    responses: Sequence[str],
    samples: Sequence[Mapping[str, Any]],
    *,
    pool: SandboxPool | None = None,
    max_workers: int = 2,
) -> Scoring:
    """`evaluate`, begun: sandboxed rewards are submitted to the sandbox pool and rewards that wait (`threads`)
    to their own threads, then the inline rewards are computed here; `result()` waits for the rest. The caller
    can do other host work in between (the trainer logs a step while a judge answers)."""
    if len(responses) != len(samples):
        raise ValueError(f"got {len(responses)} responses but {len(samples)} samples")
    if not specs:
        raise ValueError("evaluate needs at least one RewardSpec")
    names = dimension_names(specs)
    pairs = list(zip(responses, samples, strict=True))
    own_pool = pool is None and any(s.name in SANDBOXED for s in specs)
    scoring = Scoring(specs, names, len(pairs))
    if own_pool:
        pool = SandboxPool(max_workers)
        scoring.closers.append(pool.close)
    try:
        for spec in specs:  # start the work that runs elsewhere first, so it overlaps the inline rewards
            if spec.name in SANDBOXED:
                scoring.submit(spec, pool, pairs)
            elif threads(spec):
                executor = ThreadPoolExecutor(max_workers=threads(spec), thread_name_prefix=f"reward-{spec.dimension}")
                scoring.closers.append(functools.partial(executor.shutdown, wait=False, cancel_futures=True))
                scoring.submit(spec, executor, pairs)
        for spec in specs:
            if spec.dimension not in scoring.pending:
                t0 = time.perf_counter()
                if batched(spec):
                    scoring.columns[spec.dimension] = _batch_scorer(spec)(pairs)
                else:
                    score = _scorer(spec, len(pairs))
                    scoring.columns[spec.dimension] = [score(item) for item in enumerate(pairs)]
                scoring.times[spec.dimension] = time.perf_counter() - t0
    except BaseException:
        scoring.close()
        raise
    return scoring


class Scoring:
    """A batch's rewards being computed (`start_evaluate`): the inline columns are done, the sandboxed and
    threaded ones are futures. `result()` waits for them -> (R, infos) and releases the pools; `close()`
    abandons them (a rollout that will not be trained on)."""

    def __init__(self, specs: Sequence[RewardSpec], names: list[str], n: int) -> None:
        self.specs, self.names, self.n = specs, names, n
        self.columns: dict[str, list[RewardResult]] = {}
        self.times: dict[str, float] = {}
        self.pending: dict[str, list[Future]] = {}
        self.closers: list[Callable[[], Any]] = []
        self._started: dict[str, float] = {}
        self._finished: dict[str, list[float]] = {}

    def submit(self, spec: RewardSpec, pool: SandboxPool | ThreadPoolExecutor, pairs: list) -> None:
        """Every response's score of `spec` as a future of `pool` (one future for the batch of a batched
        reward); each records when it finished (`time_s` is the dimension's own wall time, not the time until
        `result()` was called)."""
        whole = batched(spec)
        score = _batch_scorer(spec) if whole else _scorer(spec, len(pairs))
        done = self._finished.setdefault(spec.dimension, [])

        def timed(item):
            try:
                return score(item)
            finally:
                done.append(time.perf_counter())

        self._started[spec.dimension] = time.perf_counter()
        self.pending[spec.dimension] = ([pool.submit(timed, pairs)] if whole else
                                        [_submit(pool, spec, timed, item, len(pairs)) for item in enumerate(pairs)])

    def result(self) -> tuple[np.ndarray, dict[str, Any]]:
        try:
            for spec in self.specs:
                dim = spec.dimension
                if dim in self.pending:
                    scores = [f.result() for f in self.pending[dim]]
                    self.columns[dim] = scores[0] if batched(spec) else scores
                    self.times[dim] = max(self._finished[dim], default=self._started[dim]) - self._started[dim]
        finally:
            self.close()
        return _assemble(self.specs, self.names, self.columns, self.times, self.n)

    def close(self) -> None:
        for futures in self.pending.values():
            for f in futures:
                f.cancel()
        for close in self.closers:
            close()
        self.closers.clear()


def _submit(pool: SandboxPool | ThreadPoolExecutor, spec: RewardSpec, fn: Callable, item, n: int) -> Future:
    """The pool's future of `fn(item)`, one response's score; a pool that takes no more work (shut down) is a
    `RewardError` naming the response."""
    try:
        return pool.submit(fn, item)
    except RuntimeError as e:
        raise _failed(spec, _describe(item[0], n, item[1][1]), e) from e


def _assemble(
    specs: Sequence[RewardSpec],
    names: list[str],
    columns: dict[str, list[RewardResult]],
    times: dict[str, float],
    n: int,
) -> tuple[np.ndarray, dict[str, Any]]:
    rewards_NxK = np.zeros((n, len(specs)), dtype=np.float32)
    per_response: list[dict[str, Any]] = [{} for _ in range(n)]
    for k, dim in enumerate(names):
        for i, result in enumerate(columns[dim]):
            rewards_NxK[i, k] = result.score
            per_response[i][dim] = dict(result.info)
    gate(specs, names, rewards_NxK, per_response)
    infos = {
        "dimensions": names,
        "versions": {s.dimension: spec_version(s) for s in specs},
        "weights": weights(specs).tolist(),
        "time_s": {dim: times[dim] for dim in names},
        "per_response": per_response,
    }
    return rewards_NxK, infos


def gate(specs: Sequence[RewardSpec], names: list[str], rewards_NxK: np.ndarray, per_response: list[dict]) -> None:
    """Conditioned rewards, in place: a dimension with `when` scores its reward's minimum on every row where
    the `when` dimension is below its own maximum (not satisfied; NaN included), as GDPO's length reward
    counts only for correct answers. The score it would have had stays in that row's info as `ungated`."""
    for k, spec in enumerate(specs):
        if spec.when is None:
            continue
        g = names.index(spec.when)
        top = reward_fn(specs[g].name).score_range[1]  # type: ignore[attr-defined]
        unmet = ~(np.nan_to_num(rewards_NxK[:, g], nan=-np.inf) >= top - 1e-6)
        for i in np.flatnonzero(unmet):
            per_response[i][spec.dimension]["ungated"] = float(rewards_NxK[i, k])
        rewards_NxK[unmet, k] = reward_fn(spec.name).score_range[0]  # type: ignore[attr-defined]
