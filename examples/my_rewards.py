"""Rewards of your own, used without editing grpo_jax: name them in rewards.specs by import path.

    PYTHONPATH=examples python -m grpo_jax.train --smoke --out runs/mine --set 'rewards.specs=[
        {"name": "math"}, {"name": "my_rewards:brevity", "weight": 0.5, "kwargs": {"budget": 12}},
        {"name": "my_rewards:contains_answer", "version": "1"}]'

A reward is a plain function, as in TRL: the completion text first, then the row's fields (here the
arithmetic task's `answer`, `prompt`, ...) and the spec's `kwargs` as keyword arguments; it returns a number,
None where it does not apply, or a `RewardResult` (a score with the reason in `info`). TRL's own shape,
`def r(completions, **kwargs)` returning a list, works as it is (`trl_style` below). Its version, recorded in
the run's manifest.json, comes from `@user_reward("1")` or from the spec's "version" (change it whenever a
score changes), else from a digest of the function's source. A reward that raises or returns something
that is not a score is reported and counted (`rewards/<dim>/errors`), never silently scored 0. The path
stays in config.json, so --resume, --rollback-to and `python -m grpo_jax.export` import it again: keep this
folder on PYTHONPATH for them too.
"""

from __future__ import annotations

from grpo_jax.rewards import RewardResult, user_reward


@user_reward("1", low=0.0, high=1.0)
def brevity(completion: str, budget: int = 12, **row) -> float:
    """1 for an empty completion, falling linearly to 0 at `budget` characters and 0 beyond (its declared range
    is [0, 1]: a score outside it would be counted as an error of the reward)."""
    return max(0.0, 1.0 - len(completion) / budget)


def contains_answer(completion: str, answer: str) -> RewardResult:
    """1 when the row's `answer` appears in the completion. It declares no version: its spec gives one."""
    found = str(answer) in completion
    return RewardResult(float(found), {"reason": "ok" if found else "answer_absent"})


@user_reward("1", batched=True, threads=1)
def judged_in_one_request(completions: list[str], answer: list[str]) -> list[float]:
    """A reward that scores the whole batch in one call (`batched=True`, as TRL's reward functions do): the
    completions as a list and each row field as a list over the batch. A remote judge would send one request
    here; `threads=1` runs the call beside the inline rewards (and, with rollout.off_policy_steps=1, beside the
    trainer's logging) instead of on the main thread. This stand-in judges locally: 1 where the answer appears."""
    return [float(str(a) in c) for c, a in zip(completions, answer)]


def trl_style(completions, answer, **kwargs) -> list[float | None]:
    """A reward as TRL users write it: the batch's completions (message lists for conversational rows) and
    each row field as a list, by keyword; None for a row it does not apply to (here, rows without an answer)."""
    texts = [c[0]["content"] if isinstance(c, list) else c for c in completions]
    return [None if a is None else float(str(a) in t) for t, a in zip(texts, answer)]

