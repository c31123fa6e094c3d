"""Verifiable rewards: deterministic, bounded, versioned functions `fn(response, sample) -> RewardResult`.

Each reward is one dimension of the reward matrix R[N, K] built by `evaluate`; see registry.py. Model
output never makes a reward raise (it scores 0 with a reason); a malformed sample raises an error
naming the field. Model-written code runs only in the sandbox (sandbox.py), never in this process.

Your own reward is a plain function `fn(completion, **row) -> float | RewardResult` named in rewards.specs by
import path, `{"name": "my_rewards:brevity"}`, with its version from `@user_reward("1")` or the spec's
`version` (user.py).
"""

from grpo_jax.rewards.base import MissingFieldError, RewardInputError, RewardResult
from grpo_jax.rewards.code import code_reward
from grpo_jax.rewards.countdown import (countdown_numbers_reward, countdown_ops_reward, countdown_reward,
                                         countdown_steps_reward)
from grpo_jax.rewards.format import format_reward, split_response
from grpo_jax.rewards.math import answers_equal, math_reward
from grpo_jax.rewards.penalties import length_penalty, overlong_penalty, repetition_penalty
from grpo_jax.rewards.registry import (
    REWARDS,
    RewardError,
    RewardSpec,
    dimension_names,
    evaluate,
    start_evaluate,
    weights,
)
from grpo_jax.rewards.sanitize import sanitize_prompt, sanitize_prompts
from grpo_jax.rewards.science import science_reward
from grpo_jax.rewards.translation import translation_reward
from grpo_jax.rewards.user import user_reward

__all__ = [
    "REWARDS",
    "MissingFieldError",
    "RewardError",
    "RewardInputError",
    "RewardResult",
    "RewardSpec",
    "answers_equal",
    "code_reward",
    "countdown_numbers_reward",
    "countdown_ops_reward",
    "countdown_reward",
    "countdown_steps_reward",
    "dimension_names",
    "evaluate",
    "format_reward",
    "length_penalty",
    "math_reward",
    "overlong_penalty",
    "repetition_penalty",
    "sanitize_prompt",
    "sanitize_prompts",
    "science_reward",
    "split_response",
    "start_evaluate",
    "translation_reward",
    "user_reward",
    "weights",
]
