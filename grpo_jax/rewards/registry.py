"""Reward registry and batch evaluation into a per-dimension reward matrix R[N, K].

The matrix keeps one column per reward dimension and is never pre-summed: how dimensions combine
(sum-then-normalise, GDPO's normalise-then-sum, conditioning one reward on another) is the advantage
estimator's research question, and a pre-summed scalar would make reward collapse invisible. Weights
travel alongside (`weights(specs)`) for the estimator to apply.

Sandboxed rewards (code) are submitted to a bounded `SandboxPool` first and the inline rewards are
computed while those programs run.
"""

from __future__ import annotations

import inspect
import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, fields
from types import MappingProxyType
from typing import Any

import numpy as np

from grpo_jax.config import REWARD_SPEC_FIELDS
from grpo_jax.rewards.base import RewardFn, RewardResult
from grpo_jax.rewards.code import code_reward
from grpo_jax.rewards.countdown import countdown_numbers_reward, countdown_reward, countdown_steps_reward
from grpo_jax.rewards.format import format_reward
from grpo_jax.rewards.math import math_reward
from grpo_jax.rewards.penalties import length_budget, length_penalty, overlong_penalty, repetition_penalty
from grpo_jax.rewards.sandbox import SandboxPool
from grpo_jax.rewards.science import science_reward
from grpo_jax.rewards.translation import translation_reward

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
        raise ValueError(f"unknown reward {name!r}; known rewards: {', '.join(sorted(REWARDS))}")
    return name


def _keyword_params(fn: RewardFn) -> set[str]:
    params = inspect.signature(fn).parameters.values()
    return {p.name for p in params if p.kind is inspect.Parameter.KEYWORD_ONLY}


@dataclass(frozen=True)
class RewardSpec:
    """One reward dimension: which reward, its weight (applied later by the advantage estimator), and
    its keyword arguments. Validated at construction so a typo fails at config time, not mid-run."""

    name: str  # a key of REWARDS
    weight: float = 1.0  # finite; used by the advantage estimator, never to pre-sum rewards
    kwargs: Mapping[str, Any] = field(default_factory=dict)  # keyword-only arguments of the reward
    version: str | None = None  # if set, must equal the reward's current version (pins behaviour)
    label: str | None = None  # dimension name; defaults to `name` (set it to use a reward twice)
    when: str | None = None  # another dimension: this one counts only where that one is satisfied (`gate`)

    def __post_init__(self) -> None:
        fn = REWARDS[_known(self.name)]
        if isinstance(self.weight, bool) or not isinstance(self.weight, (int, float)) or not math.isfinite(self.weight):
            raise ValueError(f"RewardSpec({self.name!r}).weight must be a finite number, got {self.weight!r}")
        if not isinstance(self.kwargs, Mapping) or not all(isinstance(k, str) for k in self.kwargs):
            raise ValueError(f"RewardSpec({self.name!r}).kwargs must be a mapping with string keys")
        unknown = set(self.kwargs) - _keyword_params(fn)
        if unknown:
            raise ValueError(
                f"RewardSpec({self.name!r}) got unknown kwargs {sorted(unknown)}; "
                f"accepted: {sorted(_keyword_params(fn))}"
            )
        current = fn.reward_version  # type: ignore[attr-defined]
        if self.version is not None and self.version != current:
            raise ValueError(f"RewardSpec({self.name!r}) pins version {self.version!r} but the reward is {current!r}")
        if self.label is not None and (not isinstance(self.label, str) or not self.label):
            raise ValueError(f"RewardSpec({self.name!r}).label must be a non-empty string")
        if self.when is not None and (not isinstance(self.when, str) or not self.when):
            raise ValueError(f"RewardSpec({self.name!r}).when must be a dimension name, got {self.when!r}")
        object.__setattr__(self, "kwargs", dict(self.kwargs))  # a private copy (plain dict: picklable, asdict-able)
        object.__setattr__(self, "weight", float(self.weight))

    @property
    def dimension(self) -> str:
        return self.label or self.name


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
    return names


def describe(specs: Sequence[RewardSpec]) -> list[dict[str, Any]]:
    """What scored a run, one JSON-able record per dimension in column order of R: the dimension, the
    reward and the version it runs now (not the pin, which may be unset), its weight and kwargs."""
    return [{"dimension": s.dimension, "name": s.name, "version": reward_version(s.name), "weight": s.weight,
             "kwargs": dict(s.kwargs), **({"when": s.when} if s.when else {})} for s in specs]


def weights(specs: Sequence[RewardSpec]) -> np.ndarray:
    """Weights w[K] (float32) aligned with the columns of R."""
    return np.asarray([s.weight for s in specs], dtype=np.float32)


def _scorer(spec: RewardSpec) -> Callable[[tuple[str, Mapping[str, Any]]], RewardResult]:
    fn = REWARDS[spec.name]
    kwargs = dict(spec.kwargs)
    return lambda pair: fn(pair[0], pair[1], **kwargs)


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
    if len(responses) != len(samples):
        raise ValueError(f"got {len(responses)} responses but {len(samples)} samples")
    if not specs:
        raise ValueError("evaluate needs at least one RewardSpec")
    names = dimension_names(specs)
    pairs = list(zip(responses, samples, strict=True))
    own_pool = pool is None and any(s.name in SANDBOXED for s in specs)
    pool = SandboxPool(max_workers) if own_pool else pool
    try:
        starts, pending = {}, {}
        for spec in specs:  # start sandboxed work first so it overlaps the inline rewards
            if spec.name in SANDBOXED:
                starts[spec.dimension] = time.perf_counter()
                pending[spec.dimension] = [pool.submit(_scorer(spec), p) for p in pairs]  # type: ignore[union-attr]
        columns: dict[str, list[RewardResult]] = {}
        times: dict[str, float] = {}
        for spec in specs:
            if spec.name not in SANDBOXED:
                t0 = time.perf_counter()
                score = _scorer(spec)
                columns[spec.dimension] = [score(p) for p in pairs]
                times[spec.dimension] = time.perf_counter() - t0
        for dim, futures in pending.items():
            columns[dim] = [f.result() for f in futures]
            times[dim] = time.perf_counter() - starts[dim]
    finally:
        if own_pool and pool is not None:
            pool.close()
    return _assemble(specs, names, columns, times, len(pairs))


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
        "versions": {s.dimension: reward_version(s.name) for s in specs},
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
        top = REWARDS[specs[g].name].score_range[1]  # type: ignore[attr-defined]
        unmet = ~(np.nan_to_num(rewards_NxK[:, g], nan=-np.inf) >= top - 1e-6)
        for i in np.flatnonzero(unmet):
            per_response[i][spec.dimension]["ungated"] = float(rewards_NxK[i, k])
        rewards_NxK[unmet, k] = REWARDS[spec.name].score_range[0]  # type: ignore[attr-defined]
