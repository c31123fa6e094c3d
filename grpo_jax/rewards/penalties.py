"""Penalties in [-1, 0]: n-gram repetition, DAPO soft overlong punishment, distance from a length target; and
the binary length budget in {0, 1} (GDPO's length reward: 1 when the response fits, else 0).

Length unit, in order of preference (the unit used is reported in `info["length_unit"]`):
1. tokens from the sampler: `sample[length_key]` (an int, e.g. the completion-mask sum) or, for the
   repetition penalty, `sample[token_ids_key]` (the completion's token ids);
2. otherwise whitespace-separated words (`unit="words"`, the default fallback) or characters
   (`unit="chars"`). Words undercount tokens by roughly 1.3x for English BPE vocabularies: set L_max and
   L_cache in the same unit you measure in, or pass token counts.
Each is its own reward dimension; whether it only counts for correct answers (GDPO's conditioned length
reward) is the spec's `when` (`grpo_jax.rewards.registry.RewardSpec`), not decided here.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from grpo_jax.rewards.base import RewardInputError, RewardResult, reward

REPETITION_VERSION = "1"
OVERLONG_VERSION = "1"
LENGTH_VERSION = "1"
BUDGET_VERSION = "1"
MAX_REPETITION_UNITS = 200_000


def response_length(response: str, sample: Mapping[str, Any], *, length_key: str, unit: str) -> tuple[int, str]:
    """(length, unit used): the sampler's token count when the sample carries one, else words/chars."""
    if unit not in ("words", "chars"):
        raise RewardInputError(f"unit must be 'words' or 'chars', got {unit!r}")
    if length_key in sample:
        n = sample[length_key]
        if isinstance(n, bool) or not isinstance(n, int) or n < 0:
            raise RewardInputError(f"sample field {length_key!r} must be a non-negative int (tokens), got {n!r}")
        return n, "tokens"
    return (len(response.split()), "words") if unit == "words" else (len(response), "chars")


def _ngram_repeat_fraction(units: Sequence[Any], n: int) -> float:
    """Fraction of n-grams that repeat an earlier n-gram: 0 for no repetition, -> 1 for a loop."""
    total = len(units) - n + 1
    if total <= 1:
        return 0.0
    distinct = len({tuple(units[i : i + n]) for i in range(total)})
    return 1.0 - distinct / total


@reward("repetition", REPETITION_VERSION, lo=-1.0, hi=0.0)
def repetition_penalty(
    response: str,
    sample: Mapping[str, Any],
    *,
    ngram: int = 4,
    threshold: float = 0.0,
    token_ids_key: str = "response_token_ids",
    unit: str = "words",
) -> RewardResult:
    """-(repeated n-gram fraction above `threshold`, rescaled to [0, 1]) over the whole response.

    The whole response (thinking included) is scored: degenerate loops mostly happen while thinking.
    """
    if not isinstance(ngram, int) or ngram < 1 or not 0.0 <= threshold < 1.0:
        raise RewardInputError(f"repetition: need ngram >= 1 and 0 <= threshold < 1, got {ngram}, {threshold}")
    if token_ids_key in sample:
        units, unit_used = sample[token_ids_key], "tokens"
        if not isinstance(units, Sequence) or isinstance(units, str):
            raise RewardInputError(f"sample field {token_ids_key!r} must be a sequence of token ids")
    elif unit == "words":
        units, unit_used = response.split(), "words"
    elif unit == "chars":
        units, unit_used = response, "chars"
    else:
        raise RewardInputError(f"repetition: unit must be 'words' or 'chars', got {unit!r}")
    truncated = len(units) > MAX_REPETITION_UNITS  # bound the work on runaway generations
    fraction = _ngram_repeat_fraction(units[:MAX_REPETITION_UNITS], ngram)
    excess = max(0.0, fraction - threshold) / (1.0 - threshold)
    info = {"reason": "ok", "repeat_fraction": round(fraction, 6), "length_unit": unit_used, "truncated": truncated}
    return RewardResult(-excess, info)


def soft_overlong(length: int, max_len: int, cache_len: int) -> float:
    """DAPO soft overlong punishment (docs/algorithms.md §9.1):
    0 if L <= L_max - L_cache; ((L_max - L_cache) - L) / L_cache if L_max - L_cache < L <= L_max; -1 beyond."""
    free = max_len - cache_len
    if length <= free:
        return 0.0
    if length <= max_len:
        return (free - length) / cache_len
    return -1.0


@reward("overlong", OVERLONG_VERSION, lo=-1.0, hi=0.0)
def overlong_penalty(
    response: str,
    sample: Mapping[str, Any],
    *,
    max_len: int = 20480,
    cache_len: int = 4096,
    length_key: str = "response_length",
    unit: str = "words",
) -> RewardResult:
    """DAPO's soft overlong punishment of the response length (defaults: the paper's 20,480 / 4,096)."""
    if not (isinstance(max_len, int) and isinstance(cache_len, int) and 0 < cache_len <= max_len):
        raise RewardInputError(f"overlong: need 0 < cache_len <= max_len (ints), got {cache_len}, {max_len}")
    length, unit_used = response_length(response, sample, length_key=length_key, unit=unit)
    return RewardResult(
        soft_overlong(length, max_len, cache_len), {"reason": "ok", "length": length, "length_unit": unit_used}
    )


@reward("length", LENGTH_VERSION, lo=-1.0, hi=0.0)
def length_penalty(
    response: str,
    sample: Mapping[str, Any],
    *,
    target: int | None = None,
    tolerance: int = 0,
    scale: int | None = None,
    mode: str = "two_sided",
    length_key: str = "response_length",
    target_key: str = "target_length",
    unit: str = "words",
) -> RewardResult:
    """-min(1, max(0, d - tolerance) / scale), d = |L - target| (two_sided) or max(0, L - target) (over).

    `target` comes from kwargs or `sample[target_key]`; `scale` defaults to the target itself.
    """
    if mode not in ("two_sided", "over"):
        raise RewardInputError(f"length: mode must be 'two_sided' or 'over', got {mode!r}")
    goal = target if target is not None else sample.get(target_key)
    if goal is None:
        raise RewardInputError(f"length: give target= or sample field {target_key!r}")
    if isinstance(goal, bool) or not isinstance(goal, int) or goal <= 0:
        raise RewardInputError(f"length: target must be a positive int, got {goal!r}")
    width = goal if scale is None else scale
    if width <= 0 or tolerance < 0:
        raise RewardInputError(f"length: need scale > 0 and tolerance >= 0, got {scale}, {tolerance}")
    length, unit_used = response_length(response, sample, length_key=length_key, unit=unit)
    distance = abs(length - goal) if mode == "two_sided" else max(0, length - goal)
    penalty = -min(1.0, max(0, distance - tolerance) / width)
    return RewardResult(penalty, {"reason": "ok", "length": length, "target": goal, "length_unit": unit_used})


@reward("length_budget", BUDGET_VERSION)
def length_budget(
    response: str,
    sample: Mapping[str, Any],
    *,
    budget: int,
    length_key: str = "response_length",
    unit: str = "words",
) -> RewardResult:
    """1 when the response is at most `budget` long (tokens from the sampler, else `unit`), else 0: a binary
    dimension that a policy can satisfy by choosing a shorter solution path."""
    if isinstance(budget, bool) or not isinstance(budget, int) or budget <= 0:
        raise RewardInputError(f"length_budget: budget must be a positive int, got {budget!r}")
    length, unit_used = response_length(response, sample, length_key=length_key, unit=unit)
    return RewardResult(float(length <= budget), {"reason": "ok" if length <= budget else "over_budget",
                                                  "length": length, "budget": budget, "length_unit": unit_used})
