"""Science reward: option letters (with hedge detection) and numbers with tolerance and units."""

import pytest

from grpo_jax.rewards import RewardInputError, science_reward

T = "<think>recall</think>"
MC = {"answer": "C", "choices": ["H2O", "CO2", "NaCl", "O2"]}


@pytest.mark.parametrize(
    "text",
    [
        "Answer: C",
        "The answer is (C).",
        "\\boxed{C}",
        "\\boxed{\\text{C}}",
        "C",
        "(C)",
        "**Answer:** C",
        "Final answer: C because ...",
    ],
)
def test_choice_extraction_correct(text):
    assert science_reward(T + text, MC).score == 1.0


@pytest.mark.parametrize(
    "text, reason",
    [
        ("Answer: B", "wrong_answer"),
        ("ABCD", "hedged"),  # adversarial: every option
        ("A or C", "hedged"),  # adversarial: two options
        ("Answer: A, C", "hedged"),
        ("Answer: C\nAnswer: D", "hedged"),
        ("Answer: Carbon dioxide", "no_answer"),  # a word, not a letter
        ("Answer: I think it is C", "no_answer"),  # 'I' here is English, not option I
        ("Answer: E", "no_answer"),  # only 4 choices: E is not an option
    ],
)
def test_choice_wrong_hedged_or_missing(text, reason):
    result = science_reward(T + text, MC)
    assert result.score == 0.0 and result.info["reason"] == reason


def test_choice_only_in_thinking_does_not_count():
    assert science_reward("<think>Answer: C</think>hmm", MC).score == 0.0


def test_numeric_tolerance_and_units():
    sample = {"answer": "9.8", "unit": "m/s^2"}
    assert science_reward(T + "\\boxed{9.8}", sample).score == 1.0  # no unit: read in the reference unit
    assert science_reward(T + "The answer is 9.85 m/s^2.", sample).score == 1.0  # 0.5% off < 1%
    assert science_reward(T + "Answer: 10", sample).score == 0.0  # 2% off
    assert science_reward(T + "Answer: 9.8 kg", sample).info["reason"] == "unit_mismatch"
    assert science_reward(T + "Answer: 9.8", sample, require_unit=True).info["reason"] == "missing_unit"
    assert science_reward(T + "Answer: 2.5 km", {"answer": 2500, "unit": "m"}).score == 1.0  # SI prefix
    assert science_reward(T + "Answer: 6.02 \\times 10^{23}", {"answer": 6.022e23}).score == 1.0
    assert science_reward(T + "Answer: 6.02e23", {"answer": "6.022e23", "rel_tol": 1e-4}).score == 0.0
    assert science_reward(T + "Answer: 3\nAnswer: 4", {"answer": 3}).info["reason"] == "multiple_answers"


def test_malformed_samples():
    with pytest.raises(KeyError, match="'answer'"):
        science_reward(T + "C", {"choices": ["a", "b"]})
    with pytest.raises(RewardInputError, match="option letters"):
        science_reward(T + "C", {"answer": "Z", "choices": ["a", "b"]})
    with pytest.raises(RewardInputError, match="choices"):
        science_reward(T + "C", {"answer": "A", "choices": "ab"})
    with pytest.raises(RewardInputError, match="number"):
        science_reward(T + "C", {"answer": "twelve"})
