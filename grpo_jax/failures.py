"""Rewards that fail are reported, never silent: each kind of failure once, a total failure at the start stops
the run, and the `reward_errors` alarm says which reward failed and how.

A reward fails on a row when it raises or, for a user's function, returns something that is not a score
(`rewards.base.ERROR_REASONS`); the row then does not count for that dimension. The step's metrics count the
failures (`experience.failure_counts`: `rewards/<dim>/errors`, `rewards/error_frac`); this module turns the
step's first failure of each (dimension, kind) (`Experience.errors`) into an event and a one-line warning,
stops a run whose reward fails on every row of its first step (nothing useful can be learnt from it, and a
group-variance alarm later would point at the wrong fix), and writes the reward, the error and the fix into
the `reward_errors` alarm's message.
"""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Sequence

from grpo_jax.rewards.base import ERROR_REASONS

REWARD_ERRORS_RULE = "reward_errors"  # config.default_rules' name for the alarm on rewards/error_frac


class RewardFailed(ValueError):
    """A reward failed on every row of a run's first step: the message names the reward and the error."""


def _said(failure: dict) -> str:
    where = f" (at {failure['where']})" if failure.get("where") else ""
    return f"reward {failure['reward']!r} (dimension {failure['dimension']!r}): {failure['error']}{where}"


class RewardFailures:
    """What the run has reported of its rewards' failures: the (dimension, kind) pairs already said, and the
    last step's failure of each dimension (for the alarm's message). Not checkpointed: a resumed run says each
    kind of failure once again."""

    def __init__(self) -> None:
        self.said: set[tuple[str, str]] = set()
        self.latest: dict[str, dict] = {}  # the last step's failures, one per dimension

    def check(self, step: int, errors: Sequence[dict], reasons: Sequence[dict], logger, *, first: bool) -> None:
        """Report the step's new kinds of failure (a "reward_error" event and a warning each); on the first step
        this process takes, a dimension that failed on every row raises `RewardFailed`."""
        self.latest = {f["dimension"]: f for f in errors}
        for failure in errors:
            key = (failure["dimension"], failure["kind"])
            if key in self.said:
                continue
            self.said.add(key)
            rows = sum(r.get(failure["dimension"]) in ERROR_REASONS for r in reasons)
            logger.event(step, "reward_error", dimension=failure["dimension"], reward=failure["reward"],
                         error_kind=failure["kind"], error=failure["error"], where=failure["where"], rows=rows,
                         of=len(reasons))
            warnings.warn(f"step {step}: {_said(failure)} on {rows} of {len(reasons)} rows (each kind of failure "
                          "is said once; rewards/<dim>/errors counts them every step)", RuntimeWarning, stacklevel=3)
        if first and reasons:
            for failure in errors:
                if all(r.get(failure["dimension"]) in ERROR_REASONS for r in reasons):
                    raise RewardFailed(f"{_said(failure)} failed on every row of the first step ({len(reasons)} "
                                       "completions); fix the function, then run again")

    def explain(self, alarms: list) -> list:
        """The alarms, the `reward_errors` one with the failing reward, its error and the fix in its message."""
        return [dataclasses.replace(a, detail=self.detail()) if a.rule.name == REWARD_ERRORS_RULE else a
                for a in alarms]

    def detail(self) -> str:
        said = "; ".join(_said(f) for f in self.latest.values()) or "no failure recorded"
        return (f"{said}. Fix the reward function (or the row fields it reads) and continue with --resume; each "
                "kind of failure's first error is in events.jsonl (kind reward_error). Dynamic sampling or a "
                "rollback cannot help a reward that fails")
