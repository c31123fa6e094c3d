"""Penalties: repetition, DAPO soft overlong punishment, length target; values derived by hand."""

import pytest

from grpo_jax.rewards import RewardInputError, length_penalty, overlong_penalty, repetition_penalty
from grpo_jax.rewards.penalties import soft_overlong


def test_repetition_fraction():
    # 'a b c d a b c d': 5 four-grams, 4 distinct -> 1 - 4/5 = 0.2
    assert repetition_penalty("a b c d a b c d", {}).score == pytest.approx(-0.2)
    assert repetition_penalty("the quick brown fox jumps over", {}).score == 0.0
    # 103 identical words: 100 four-grams, 1 distinct -> 0.99
    assert repetition_penalty(" ".join(["w"] * 103), {}).score == pytest.approx(-0.99)
    # threshold 0.5: (0.99 - 0.5) / 0.5 = 0.98
    assert repetition_penalty(" ".join(["w"] * 103), {}, threshold=0.5).score == pytest.approx(-0.98)
    # token ids win over text: bigrams (1,2),(2,1),(1,2),(2,1): 4 total, 2 distinct -> 0.5
    result = repetition_penalty("ignored", {"response_token_ids": [1, 2, 1, 2, 1]}, ngram=2)
    assert result.score == pytest.approx(-0.5) and result.info["length_unit"] == "tokens"


@pytest.mark.parametrize(
    "length, expected",
    [(16384, 0.0), (16385, -1 / 4096), (18432, -0.5), (20480, -1.0), (20481, -1.0)],  # L_max=20480, L_cache=4096
)
def test_soft_overlong_matches_dapo(length, expected):
    assert soft_overlong(length, 20480, 4096) == pytest.approx(expected)
    result = overlong_penalty("x", {"response_length": length})
    assert result.score == pytest.approx(expected) and result.info["length_unit"] == "tokens"


def test_overlong_fallback_units():
    # 90 words with L_max=100, L_cache=20: (80 - 90) / 20 = -0.5
    assert overlong_penalty("w " * 90, {}, max_len=100, cache_len=20).info["length_unit"] == "words"
    assert overlong_penalty("w " * 90, {}, max_len=100, cache_len=20).score == pytest.approx(-0.5)
    # 'w ' * 45 is 90 characters
    assert overlong_penalty("w " * 45, {}, max_len=100, cache_len=20, unit="chars").score == pytest.approx(-0.5)


def test_length_penalty():
    assert length_penalty("w " * 150, {}, target=100).score == pytest.approx(-0.5)  # |150-100|/100
    assert length_penalty("w " * 50, {}, target=100, mode="over").score == 0.0
    assert length_penalty("w " * 120, {}, target=100, tolerance=10).score == pytest.approx(-0.1)  # (20-10)/100
    assert length_penalty("x", {"target_length": 10, "response_length": 40}).score == -1.0  # clipped


def test_bad_config_and_sample():
    with pytest.raises(RewardInputError):
        overlong_penalty("x", {}, max_len=10, cache_len=20)
    with pytest.raises(RewardInputError, match="response_length"):
        overlong_penalty("x", {"response_length": -3})
    with pytest.raises(RewardInputError, match="target_length"):
        length_penalty("x", {})
    with pytest.raises(RewardInputError):
        repetition_penalty("x", {}, ngram=0)
    with pytest.raises(RewardInputError, match="unit"):
        overlong_penalty("x", {}, unit="tokens")
