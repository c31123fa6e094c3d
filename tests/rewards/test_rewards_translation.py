"""Translation reward: chrF/BLEU of the answer segment against one or more references."""

import pytest
from sacrebleu.metrics import BLEU, CHRF

from grpo_jax.rewards import RewardInputError, translation_reward

REF = "The cat sits on the mat."
HYP = "The cat is sitting on the mat."


def test_identical_is_one_and_empty_is_zero():
    assert translation_reward("<think>t</think>" + REF, {"references": REF}).score == pytest.approx(1.0)
    assert (
        translation_reward("<think>t</think><answer> </answer>", {"references": REF}).info["reason"] == "empty_answer"
    )


def test_scaled_sacrebleu_values():
    expected_chrf = CHRF().sentence_score(HYP, [REF]).score / 100  # sacrebleu reports 0-100
    got = translation_reward("<think>t</think><answer>" + HYP + "</answer>", {"references": [REF]})
    assert got.score == pytest.approx(expected_chrf) and 0.0 < got.score < 1.0
    expected_bleu = BLEU(effective_order=True).sentence_score(HYP, [REF]).score / 100
    assert translation_reward(HYP, {"references": REF}, metric="bleu").score == pytest.approx(expected_bleu)
    expected_chrfpp = CHRF(word_order=2).sentence_score(HYP, [REF]).score / 100  # chrF++ adds word bigrams
    assert translation_reward(HYP, {"references": REF}, metric="chrf++").score == pytest.approx(expected_chrfpp)


def test_best_of_several_references_and_only_the_answer_segment():
    one = translation_reward(HYP, {"references": [REF]}).score
    two = translation_reward(HYP, {"references": [REF, HYP]}).score
    assert two == pytest.approx(1.0) and one < 1.0
    # the thinking holds a perfect copy, the answer is off-topic: only the answer is scored
    assert translation_reward(f"<think>{REF}</think>Dogs bark loudly.", {"references": REF}).score < 0.3


def test_bad_config_and_sample():
    with pytest.raises(RewardInputError, match="metric"):
        translation_reward(HYP, {"references": REF}, metric="meteor")
    with pytest.raises(KeyError, match="'references'"):
        translation_reward(HYP, {"reference": REF})
    with pytest.raises(RewardInputError, match="references"):
        translation_reward(HYP, {"references": []})
