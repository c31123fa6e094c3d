"""Rollouts dispatched before the step that trains on them: `RolloutsAhead`.

With rollout.overlap the next step's rollout is queued behind this step's update, so the device decodes it
while the host logs; with one-step off-policy rollouts (rollout.off_policy_steps) it is decoded one step
earlier still, with the params before the update, and scored on the host while the device works. A rollout
is never dispatched ahead across a periodic checkpoint: a run resumed there decodes that step's rollout with
its own params (the params before are not kept), so the uninterrupted run does too.
"""

from __future__ import annotations

import dataclasses
from typing import Callable

import jax

from grpo_jax import experience, sampler
from grpo_jax import data as data_lib
from grpo_jax.config import TrainConfig


@dataclasses.dataclass(frozen=True)
class Pending:
    """A rollout dispatched before the step that trains on it."""

    rows: list  # round 0's data rows
    rollout: sampler.Rollout  # device arrays, perhaps still being computed (JAX's asynchronous dispatch)
    cursor_before: data_lib.Cursor  # the data stream's cursor before these rows (a checkpoint saves the oldest)
    temperature: float  # what it was sampled at
    lag: int  # updates between the params that decoded it and the params of the step that trains on it
    scored: experience.Scoring | Exception | None = None  # scored ahead (off-policy), or what scoring raised


def periodic_checkpoint(cfg: TrainConfig, step: int) -> bool:
    """Whether the loop writes a periodic checkpoint at `step` (checkpoint.every)."""
    every = cfg.checkpoint.every
    return bool(every) and step % every == 0


class RolloutsAhead:
    """The step -> Pending queue of one run. It draws its rows from `stream`, samples with the key
    `sample_key(step)` at the temperature `temperature()` reads when it dispatches."""

    def __init__(self, cfg: TrainConfig, actor: experience.Actor, stream: data_lib.PromptStream,
                 sample_key: Callable[[int], jax.Array], temperature: Callable[[], float]):
        self.cfg, self.actor, self.stream = cfg, actor, stream
        self.sample_key, self.temperature = sample_key, temperature
        self._pending: dict[int, Pending] = {}

    def cursor(self) -> data_lib.Cursor:
        """The stream's cursor before every row drawn ahead: a resumed run draws those rows again."""
        return next(iter(self._pending.values())).cursor_before if self._pending else self.stream.cursor

    def dispatch(self, step: int, params: Callable[[], object]) -> None:
        """The current params (`params()`, on the rollout mesh) are those of `step`: dispatch the rollouts they
        decode and that are not yet dispatched, in step order (their rows are drawn in that order): `step`'s
        own rollout, and with one-step off-policy rollouts also the next step's, unless that step starts
        afresh after a checkpoint. Nothing waits here: the device runs them while the host goes on."""
        cfg = self.cfg
        ahead = (step, step + 1) if cfg.rollout.off_policy_steps else (step,)
        for s in ahead:
            if s >= cfg.steps or s in self._pending or (s > step and periodic_checkpoint(cfg, s)):
                continue
            before = self.stream.cursor
            rows = self.stream.take(experience.round_size(cfg.prompts_per_step, cfg.dynamic))
            temperature = self.temperature()
            key = experience.round_key(self.sample_key(s), 0, cfg.dynamic)
            ro = experience.rollout(self.actor, params(), rows, key, group_size=cfg.sampling.group_size,
                                    temperature=temperature)
            self._pending[s] = Pending(rows, ro, before, temperature, lag=s - step)

    def score(self, step: int) -> None:
        """Score `step`'s rollout, decoded ahead with the previous params, now: the host works while the device
        runs the update just dispatched and the rollout after. Its first round only (dynamic sampling draws
        later rounds when the step runs); what scoring raises is kept and raised by that step, so the step
        that is running now is logged and checkpointed first. Rewards that wait (`user_reward(threads=)`) go on
        in their threads; the step collects them."""
        pending = self._pending.get(step)
        if pending is None or pending.scored is not None:
            return
        try:
            scored = experience.start_scoring(self.actor, pending.rows, pending.rollout)
        except Exception as e:  # noqa: BLE001 - raised by the step that trains on it
            scored = e
        self._pending[step] = dataclasses.replace(pending, scored=scored)

    def take(self, step: int, params: Callable[[], object]) -> Pending:
        """`step`'s rollout, dispatched now if it was not ahead; what scoring it ahead raised is raised here."""
        if step not in self._pending:
            self.dispatch(step, params)
        pending = self._pending.pop(step)
        if isinstance(pending.scored, Exception):
            raise pending.scored
        return pending

    def lag(self, step: int) -> int:
        """The lag of `step`'s rollout when it is already dispatched (`Pending.lag`), else 0 (it will be decoded
        with the params of `step`)."""
        pending = self._pending.get(step)
        return pending.lag if pending is not None else 0

    def drop(self) -> None:
        """Forget the rollouts dispatched ahead; their rows go back to the stream (the oldest one's cursor)."""
        self.stream.cursor = self.cursor()
        for pending in self._pending.values():
            if isinstance(pending.scored, experience.Scoring):
                pending.scored.close()
        self._pending.clear()
