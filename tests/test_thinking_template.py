"""Thinking chat templates (Qwen3's ends the prompt with `<think>\\n`): the loader marks the rendered rows
`think_prefilled`, and the format reward and the content rewards then judge "<think>" + completion, so a
correct completion scores 1 under such a template and the same completion still scores 0 for a row whose
prompt did not open `<think>`. Also the first-step warning when no completion passes the format reward."""

from __future__ import annotations

import json

import pytest

from grpo_jax.config import TaskConfig
from grpo_jax.data import load_task_data
from grpo_jax.experience import assistant_turns, format_zero_warning, thinking_lengths
from grpo_jax.rewards import RewardInputError, format_reward, math_reward
from grpo_jax.rewards.format import segment_kinds
from grpo_jax.tasks import chat, get_task
from grpo_jax.tokenizer import HFTokenizer
from tests.launchers import load_launcher
from tests.test_chat_template import build_chatml_tokenizer

pytest.importorskip("transformers")

QWEN3_THINKING = load_launcher("hf_math").QWEN3_THINKING  # Qwen's ChatML whose assistant turn opens "<think>\n"
COMPLETION = "6 boxes of 12 is 72.</think>\n\n<answer>72</answer>"
ROW = {"messages": [{"role": "system", "content": "Put the final number in <answer></answer>."},
                    {"role": "user", "content": "How many eggs are in 6 boxes of 12?"}], "answer": "72"}


@pytest.fixture(scope="module")
def thinking_tok(tmp_path_factory):
    return HFTokenizer(build_chatml_tokenizer(tmp_path_factory.mktemp("qwen3"), chat_template=QWEN3_THINKING))


def test_qwen3_style_template_marks_the_row_and_the_correct_completion_scores_one(tmp_path, thinking_tok):
    path = tmp_path / "train.jsonl"
    path.write_text(json.dumps(ROW) + "\n")
    rows, _, report = load_task_data(get_task("jsonl"), TaskConfig(name="jsonl", train_path=str(path), n_eval=0),
                                     0, thinking_tok)
    row = rows[0]
    assert row["prompt"].endswith("<|im_start|>assistant\n<think>\n") and row["think_prefilled"] is True
    # the system prompt's format instruction reached the prompt as written (cleaning kept it)
    assert "Put the final number in <answer></answer>." in row["prompt"] and not report["sanitize"]["findings"]
    assert format_reward(COMPLETION, row).score == 1.0 and math_reward(COMPLETION, row).score == 1.0
    unmarked = {k: v for k, v in row.items() if k != "think_prefilled"}  # no silent leniency without the flag
    assert format_reward(COMPLETION, unmarked).info["reason"] == "missing_tag:<think>"


def test_a_template_that_opens_no_think_block_marks_nothing(tmp_path):
    tok = HFTokenizer(build_chatml_tokenizer(tmp_path / "chatml"))
    row = chat.render({"answer": "72"}, ROW["messages"], tok)
    assert "think_prefilled" not in row and format_reward(COMPLETION, row).score == 0.0
    assert chat.opens_think("...<|im_start|>assistant\n<think>\n") and not chat.opens_think("<think>x</think>\n")


def test_prefilled_rows_read_an_unclosed_completion_as_thinking_and_reject_a_non_bool_flag():
    marked, plain = {"answer": "72", "think_prefilled": True}, {"answer": "72"}
    unfinished = "so the answer is \\boxed{72}"  # cut off inside the prompt-opened thinking
    assert math_reward(unfinished, marked).score == 0.0 and math_reward(unfinished, plain).score == 1.0
    assert format_reward("<think>r</think>72", marked).info["reason"] == "repeated_tag:<think>"
    with pytest.raises(RewardInputError, match="think_prefilled"):
        format_reward(COMPLETION, {"think_prefilled": "yes"})
    # per-token segments and thinking lengths follow the same reading
    kinds = segment_kinds("ab</think>C", think_prefilled=True)
    assert "".join("ORA"[k] for k in kinds) == "RROOOOOOOOA"
    texts = assistant_turns([marked, plain], ["ab</think>C", "ab</think>C"])
    assert texts == ["<think>ab</think>C", "ab</think>C"] and thinking_lengths(texts)["think/chars_mean"] == 2.0


def test_first_step_with_no_format_pass_warns_naming_the_most_common_reason():
    metrics = {"format_rate": 0.0, "reason/format/missing_tag:<think>": 6.0, "reason/format/empty_answer": 2.0,
               "reason/math/no_answer": 8.0}
    message = format_zero_warning(metrics)
    assert message is not None and "missing_tag:<think>, 6 of 8 completions" in message
    assert format_zero_warning({**metrics, "format_rate": 0.125}) is None
    assert format_zero_warning({"reason/math/no_answer": 8.0}) is None  # no format reward in the run
