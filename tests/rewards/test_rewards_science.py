"""Science reward: option letters (with hedge detection) and numbers with tolerance and units."""

import random

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
        "Answer: c",  # a committed lower-case letter is the option
        "(c)",
        "Answer: Option C",
        "Answer: option (c)",
        "The correct option is c.",
        "Answer: Choice C",
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
        ("Answer: b", "wrong_answer"),
        ("Answer: a or c", "hedged"),
        ("Answer: Options A and C", "hedged"),
        ("Answer: a reaction with water", "no_answer"),  # an article, not option A
        ("Answer: i think it is C", "no_answer"),
    ],
)
def test_choice_wrong_hedged_or_missing(text, reason):
    result = science_reward(T + text, MC)
    assert result.score == 0.0 and result.info["reason"] == reason


def test_the_words_and_or_name_no_option():
    result = science_reward(T + "Answer: Options A and C", {"answer": "C", "choices": list("wxyz")})
    assert result.info["extracted"] == "AC"  # not the A and D of 'and'


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


@pytest.mark.parametrize(
    "text, reason",
    [
        ("Answer: 9800 mm/s^2", "correct"),  # compound units convert
        ("Answer: 980 cm/s^2", "correct"),
        ("Answer: 0.0098 km/s^2", "correct"),
        ("Answer: 9.8 m s^-2", "correct"),
        ("Answer: 9800 mm/s", "unit_mismatch"),  # a speed, not an acceleration
        ("Answer: 9.8 m/s", "unit_mismatch"),
        ("Answer: 9.8 furlongs", "unit_mismatch"),
        ("Answer: 98 mm/s^2", "wrong_answer"),
    ],
)
def test_compound_units(text, reason):
    assert science_reward(T + text, {"answer": "9.8", "unit": "m/s^2"}).info["reason"] == reason


PREFIXES = {"k": 1e3, "": 1.0, "c": 1e-2, "m": 1e-3, "u": 1e-6}
TIME_UNITS = {"s": 1.0, "ms": 1e-3, "min": 60.0, "h": 3600.0}


@pytest.mark.parametrize("seed", range(40))
def test_compound_unit_conversion_property(seed):
    """A speed written in any prefixed length per any time unit is the reference speed; a length is not."""
    rng = random.Random(seed)
    reference = rng.uniform(0.1, 1000.0)
    prefix, time_unit = rng.choice(list(PREFIXES)), rng.choice(list(TIME_UNITS))
    value = reference / PREFIXES[prefix] * TIME_UNITS[time_unit]
    sample = {"answer": str(reference), "unit": "m/s"}
    assert science_reward(T + f"Answer: {value:.6g} {prefix}m/{time_unit}", sample).score == 1.0
    assert science_reward(T + f"Answer: {value * 1.5:.6g} {prefix}m/{time_unit}", sample).score == 0.0
    assert science_reward(T + f"Answer: {value:.6g} {prefix}m", sample).info["reason"] == "unit_mismatch"


def test_absurd_unit_powers_are_no_unit():
    for text in ("Answer: 5 mm^-999", "Answer: 5 mm^999/s"):  # 1e-3 ** -999 would overflow a float
        assert science_reward(T + text, {"answer": "5", "unit": "m"}).info["reason"] == "unit_mismatch"


def test_malformed_samples():
    with pytest.raises(KeyError, match="'answer'"):
        science_reward(T + "C", {"choices": ["a", "b"]})
    with pytest.raises(RewardInputError, match="option letters"):
        science_reward(T + "C", {"answer": "Z", "choices": ["a", "b"]})
    with pytest.raises(RewardInputError, match="choices"):
        science_reward(T + "C", {"answer": "A", "choices": "ab"})
    with pytest.raises(RewardInputError, match="number"):
        science_reward(T + "C", {"answer": "twelve"})
