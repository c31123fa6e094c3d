"""Format reward and the (thinking, answer) split that every content reward relies on."""

import pytest

from grpo_jax.rewards import RewardInputError, format_reward, split_response
from grpo_jax.rewards.format import check_format


@pytest.mark.parametrize(
    "response",
    [
        "<think>2+2=4</think>4",
        "<think>2+2=4</think>\n<answer>4</answer>\n",
        "\n  <think>x</think>  The answer is 4.  ",
    ],
)
def test_well_formed_scores_one(response):
    result = format_reward(response, {})
    assert result.score == 1.0 and result.info["reason"] == "ok"


@pytest.mark.parametrize(
    "response, reason",
    [
        ("The answer is 4", "missing_tag:<think>"),
        ("<think>x", "missing_tag:</think>"),
        ("<think> \n </think>4", "empty_thinking"),
        ("<think>x</think>  ", "empty_answer"),
        ("<think>x</think><answer>  </answer>", "empty_answer"),
        ("Sure. <think>x</think>4", "text_before_think"),
        ("<think>x</think>Result: <answer>4</answer>", "text_before_answer"),
        ("<think>x</think><answer>4</answer> and 5", "text_after_answer"),
        ("<think>x <answer>4</answer></think>", "tag_order"),
        ("<think>x</think><answer>4", "missing_tag:</answer>"),
        ("</think><think>x</think>4", "repeated_tag:</think>"),
    ],
)
def test_malformed_scores_zero_with_reason(response, reason):
    result = format_reward(response, {})
    assert result.score == 0.0
    assert result.info["reason"] == reason


@pytest.mark.parametrize(
    "response",
    [
        "<think><think>x</think></think>4",  # nested
        "<think>a</think><think>b</think>4",  # repeated
        "<think>a</think><answer>4</answer><answer>5</answer>",  # two answers
        "<think>a</think>4</think>",  # stray close after the answer
        "<think>a</think><answer>4</answer>\nPS: 5",  # text after the answer
    ],
)
def test_adversarial_structures_score_zero(response):
    assert format_reward(response, {}).score == 0.0


def test_configurable_tags_and_required_answer_tag():
    response = "<reasoning>r</reasoning><final>4</final>"
    assert format_reward(response, {}, think_tag="reasoning", answer_tag="final").score == 1.0
    assert format_reward(response, {}).score == 0.0  # default tags are absent
    assert format_reward("<think>r</think>4", {}, require_answer_tag=True).score == 0.0
    assert check_format("<think>r</think><answer>4</answer>", require_answer_tag=True) == "ok"


def test_bad_tag_name_is_a_config_error():
    with pytest.raises(RewardInputError):
        format_reward("<think>x</think>4", {}, think_tag="<bad>")


@pytest.mark.parametrize(
    "response, thinking, answer",
    [
        ("<think>t</think> a ", "t", "a"),
        ("<think>t</think><answer> a </answer>", "t", "a"),
        ("no tags at all", "", "no tags at all"),
        ("<think>never closed \\boxed{4}", "never closed \\boxed{4}", ""),
        # everything before the last </think> was thinking: a box there is not the answer
        ("<think>t</think>\\boxed{4}</think>final", "t", "final"),
        ("<think>t</think><answer>1</answer> junk <answer>2</answer>", "t", "1\n2"),
        ("<think>t</think>x</answer>", "t", "x"),
    ],
)
def test_split_response(response, thinking, answer):
    parts = split_response(response)
    assert (parts.thinking, parts.answer) == (thinking, answer)
    th, an = parts  # a plain (thinking, answer) tuple
    assert (th, an) == (thinking, answer)


def test_non_string_response_scores_zero():
    assert format_reward(None, {}).score == 0.0  # type: ignore[arg-type]
    assert format_reward(b"<think>x</think>4", {}).info["reason"] == "response_not_a_string"  # type: ignore[arg-type]
