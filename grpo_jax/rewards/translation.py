"""Translation reward: chrF (default), chrF++ or sentence BLEU of the answer segment, scaled to [0, 1].

chrF is the default because at sentence level it is far less noisy than BLEU (no zero n-gram
precisions on short outputs) and needs no tokenizer choice for most languages. Only the answer
segment is scored; whether the response followed the think/answer format is the separate `format`
reward dimension, so the two signals stay separable in the reward matrix.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Any

from grpo_jax.rewards.base import RewardInputError, RewardResult, as_str_list, require, reward
from grpo_jax.rewards.format import assistant_turn, split_response

TRANSLATION_VERSION = "2"  # 2: a think_prefilled row is read as "<think>" + completion
MAX_HYPOTHESIS_CHARS = 20_000  # longer answers are truncated before scoring (runaway generations)


@functools.lru_cache(maxsize=16)
def _metric(metric: str, tokenize: str | None, lowercase: bool) -> Any:
    """Build a sacrebleu metric object once (construction is the slow part of sentence scoring)."""
    from sacrebleu.metrics import BLEU, CHRF  # deferred: only translation tasks pay sacrebleu's import

    if metric == "chrf":
        return CHRF(lowercase=lowercase)
    if metric == "chrf++":
        return CHRF(word_order=2, lowercase=lowercase)
    if metric == "bleu":
        return BLEU(effective_order=True, tokenize=tokenize, lowercase=lowercase)
    raise RewardInputError(f"translation: metric must be 'chrf', 'chrf++' or 'bleu', got {metric!r}")


@reward("translation", TRANSLATION_VERSION)
def translation_reward(
    response: str,
    sample: Mapping[str, Any],
    *,
    metric: str = "chrf",
    references_key: str = "references",
    tokenize: str | None = None,
    lowercase: bool = False,
    think_tag: str = "think",
    answer_tag: str = "answer",
) -> RewardResult:
    """Sentence-level `metric` of the answer against `sample[references_key]` (one string or a list)."""
    scorer = _metric(metric, tokenize, lowercase)
    refs = as_str_list(require(sample, references_key), references_key)
    turn = assistant_turn(response, sample, think_tag=think_tag)  # with the prompt's opened <think>
    hypothesis = split_response(turn, think_tag=think_tag, answer_tag=answer_tag).answer
    if not hypothesis.strip():
        return RewardResult(0.0, {"reason": "empty_answer", "metric": metric})
    truncated = len(hypothesis) > MAX_HYPOTHESIS_CHARS
    hypothesis = " ".join(hypothesis[:MAX_HYPOTHESIS_CHARS].split())
    score = scorer.sentence_score(hypothesis, refs).score / 100.0
    return RewardResult(
        score, {"reason": "ok", "metric": metric, "raw": round(score * 100.0, 4), "truncated": truncated}
    )
