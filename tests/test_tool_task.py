"""The tool-arithmetic task: ArithmeticTask's rows, a tool solution whose output text is exactly what the host
appends, a tokenizer with atomic tool markers (the default tokenizer untouched), and rewards that score the
policy's own text (the tool's outputs removed)."""

from __future__ import annotations

import pytest

from grpo_jax import presets, tools
from grpo_jax.config import ToolConfig
from grpo_jax.rewards import RewardSpec, evaluate, format_reward, math_reward
from grpo_jax.tasks import SPLITS, TASKS, ArithmeticTask, ToolArithmeticTask, get_task, split_of
from grpo_jax.tasks.tool_arithmetic import call_code
from grpo_jax.tokenizer import CONTROL, TAGS, TASK_ALPHABET, TOOL_ALPHABET, TOOL_TAGS, CharTokenizer

TASK = ToolArithmeticTask()
CFG = ToolConfig()


def policy_text(completion: str) -> str:
    """The completion without the outputs the host appended (what the rewards receive in a tool rollout)."""
    out = completion
    while CFG.output_open in out:
        before, _, rest = out.partition(CFG.output_open)
        out = before + rest.partition(CFG.output_close + "\n")[2]
    return out


def scores(task, completion: str, row: dict) -> dict[str, float]:
    """{dimension: score} of one completion under the task's own reward specs."""
    specs = [RewardSpec(**d) for d in task.reward_specs()]
    rewards, infos = evaluate(specs, [completion], [row])
    return {dim: float(rewards[0, k]) for k, dim in enumerate(infos["dimensions"])}


def test_registered_with_multiplication_by_default():
    task = get_task("tool_arithmetic")
    assert isinstance(task, ToolArithmeticTask) and (task.digits, task.op) == (3, "*")
    assert TASKS["tool_arithmetic"] == task
    assert get_task("tool_arithmetic", digits=2).digits == 2
    with pytest.raises(ValueError, match="digits"):
        ToolArithmeticTask(digits=0)
    with pytest.raises(ValueError, match="op"):
        ToolArithmeticTask(op="/")


def test_rows_are_arithmetics_rows_reproducible_distinct_and_split_by_problem():
    rows = TASK.generate("train", 300, seed=5)
    assert rows == TASK.generate("train", 300, seed=5)
    assert [r["prompt"] for r in rows] != [r["prompt"] for r in TASK.generate("train", 300, seed=6)]
    assert len({r["prompt"] for r in rows}) == 300
    plain = ArithmeticTask(digits=3, op="*").generate("train", 300, seed=5)
    assert [(r["prompt"], r["answer"]) for r in rows] == [(r["prompt"], r["answer"]) for r in plain]
    assert all(r["task"] == "tool_arithmetic" for r in rows)
    by_split = {s: {r["prompt"] for r in TASK.generate(s, 300 if s == "train" else 100, seed=1)} for s in SPLITS}
    assert all(split_of(p) == s for s, prompts in by_split.items() for p in prompts)
    assert not (by_split["train"] & by_split["valid"] or by_split["train"] & by_split["heldout"]
                or by_split["valid"] & by_split["heldout"])


def test_solutions_are_the_tool_call_then_the_in_head_answer():
    for row in TASK.generate("train", 20, seed=0):
        a, b = row["operands"]
        answer = str(a * b)
        assert row["answer"] == answer and row["prompt"] == f"{a:03d}*{b:03d}="
        tool, head = TASK.solutions(row)
        assert head == f"<think>mul</think><answer>{answer}</answer>" == ArithmeticTask(op="*").solution(row)
        assert tool == (f"<think>mul</think><python>print({a}*{b})</python><output>\n{answer}\n</output>\n"
                        f"<answer>{answer}</answer>")


def test_zero_padded_operands_are_written_without_leading_zeros():
    row = ArithmeticTask(op="*").make_row(7, 45)  # prompt "007*045="
    assert row["prompt"] == "007*045="
    assert call_code(row["prompt"]) == "print(7*45)"
    compile(call_code(row["prompt"]), "<tool>", "exec")  # print(007*045) would be a SyntaxError
    with pytest.raises(SyntaxError):
        compile("print(007*045)", "<tool>", "exec")
    with pytest.raises(ValueError, match="'prompt'"):
        TASK.tool_solution({"prompt": "what is 7 times 45?", "answer": "315"})


def test_the_tool_solution_holds_exactly_what_running_its_call_appends():
    row = TASK.generate("valid", 1, seed=0)[0]
    tool = TASK.solutions(row)[0]
    call = tools.find_call(tool, CFG)
    assert call is not None and call.code == call_code(row["prompt"])
    result = tools.run_call(call.code, CFG)  # a real sandboxed run, as the host will do it
    assert result.status == "ok" and result.text == tools.format_output(row["answer"], CFG)
    assert tool[call.end:] == result.text + f"<answer>{row['answer']}</answer>"


def test_tokenizer_round_trips_the_tool_solution_with_single_token_markers():
    tok = TASK.tokenizer()
    for row in TASK.generate("train", 30, seed=2):
        for text in (row["prompt"], *TASK.solutions(row)):
            ids = tok.encode(text)
            assert tok.unk_id not in ids and tok.decode(ids) == text
    for marker in TAGS + TOOL_TAGS:
        assert len(tok.encode(marker)) == 1
    assert TOOL_TAGS == (CFG.call_open, CFG.call_close, CFG.output_open, CFG.output_close)
    close_id = tok.encode("</python>")[0]
    ids = tok.encode("<think>mul</think><python>print(1*2)</python>")
    assert ids.count(close_id) == 1 and ids[-1] == close_id
    # '<' and '>' are characters too, but a whole marker always encodes as its one id
    assert tok.encode("<>") == [tok.encode("<")[0], tok.encode(">")[0]] and tok.unk_id not in tok.encode("<>")
    assert tok.encode("</python") == [tok.encode(c)[0] for c in "</python"]


def test_tokenizer_covers_what_tool_outputs_and_error_lines_hold():
    tok = TASK.tokenizer()
    error = tools.run_call("print(undefined_name[0])", CFG)
    text = error.text + 'SyntaxError: "x" {1: [2]} <unk> # ; % & | ^ ~ @ $ \\ `\t'
    assert error.error and "NameError" in error.text
    assert tok.unk_id not in tok.encode(text) and tok.decode(tok.encode(text)) == text


def test_default_char_tokenizer_ids_are_unchanged():
    tok = CharTokenizer()
    # pad, bos, eos, unk, then the four tags, then TASK_ALPHABET in order: the default experiment's ids
    offset = len(CONTROL) + len(TAGS)
    text = "<think>add</think><answer>0129 +-*/=:.,?!'()z</answer>"
    expected = [len(CONTROL) + TAGS.index("<think>")] + [offset + TASK_ALPHABET.index(c) for c in "add"]
    expected += [len(CONTROL) + TAGS.index("</think>"), len(CONTROL) + TAGS.index("<answer>")]
    expected += [offset + TASK_ALPHABET.index(c) for c in "0129 +-*/=:.,?!'()z"]
    expected += [len(CONTROL) + TAGS.index("</answer>")]
    assert tok.encode(text) == expected
    assert tok.vocab_size == offset + len(TASK_ALPHABET) and tok.specials == TAGS
    assert TOOL_ALPHABET.startswith(TASK_ALPHABET)
    assert tok.encode("0") == [8] and tok.vocab_size == 58  # as before the tool tokenizer existed
    assert tok.encode("<>A\n_") == [tok.unk_id] * 5  # the tool's characters are not in it
    assert len(tok.encode("<python>")) == len("<python>")  # nor its markers


def test_rewards_on_the_policys_own_text():
    row = TASK.generate("heldout", 1, seed=0)[0]
    a, b = row["operands"]
    answer = row["answer"]
    tool = TASK.solutions(row)[0]
    own = policy_text(tool)
    assert own == f"<think>mul</think><python>print({a}*{b})</python><answer>{answer}</answer>"
    assert scores(TASK, own, row) == {"math": 1.0, "format": 1.0}
    assert scores(TASK, TASK.solutions(row)[1], row) == {"math": 1.0, "format": 1.0}
    wrong = own.replace(f"<answer>{answer}</answer>", f"<answer>{int(answer) + 1}</answer>")
    assert scores(TASK, wrong, row) == {"math": 0.0, "format": 1.0}
    # the right number only inside the code: no answer committed
    in_code = f"<think>mul</think><python>print({answer})</python>"
    assert scores(TASK, in_code, row) == {"math": 0.0, "format": 0.0}
    bare_code = f"<think>mul</think><python>{answer}</python>"
    assert scores(TASK, bare_code, row)["math"] == 0.0


@pytest.mark.parametrize("text, reason", [
    ("<think>mul</think><python>print(1*2)</python><answer>2</answer>", "ok"),
    ("<think>mul</think><python>x = 1</python>\n<python>print(x*2)</python> <answer>2</answer>", "ok"),
    ("<think>mul</think><python>print(1*2)<answer>2</answer>", "tool_call_unclosed"),
    ("<think>mul</think><python>print(1<python>*2)</python><answer>2</answer>", "tool_call_unclosed"),
    ("<think>mul</think><python> </python><answer>2</answer>", "tool_call_empty"),
    ("<think>mul</think><answer>2</answer><python>print(1*2)</python>", "tool_call_order"),
    ("<think>mul</think><answer>2<python>print(1*2)</python></answer>", "tool_call_order"),
    ("<think>mul</think>so <python>print(1*2)</python><answer>2</answer>", "tool_call_order"),
    ("<think>mul</think></python><answer>2</answer>", "tool_call_order"),
    ("<think>mul<python>print(1*2)</python></think><answer>2</answer>", "tool_call_order"),
    ("<think>mul</think><python>print(1*2)</python>", "missing_tag:<answer>"),
])
def test_format_reward_with_tool_calls(text, reason):
    got = format_reward(text, {}, require_answer_tag=True, tool_call=("<python>", "</python>"))
    assert got.info["reason"] == reason
    assert got.score == (1.0 if reason == "ok" else 0.0)


def test_format_reward_without_tool_calls_scores_as_before():
    call = "<think>mul</think><python>print(1*2)</python><answer>2</answer>"
    assert format_reward(call, {}, require_answer_tag=True).info["reason"] == "text_before_answer"
    # a call marker inside the thinking is ordinary thinking text when calls are not allowed
    assert format_reward("<think>m<python>x</python></think><answer>2</answer>", {}).score == 1.0
    assert scores(ArithmeticTask(op="*"), call, {"answer": "2"}) == {"math": 1.0, "format": 0.0}


@pytest.mark.parametrize("bad", ["<python>", ("<python>",), ("<python>", "<python>"), ("<python>", ""), (1, 2)])
def test_format_reward_rejects_a_bad_tool_call_option(bad):
    with pytest.raises(ValueError, match="tool_call"):
        format_reward("<think>a</think><answer>2</answer>", {}, tool_call=bad)


def test_preset_runs_the_task_with_room_for_a_call():
    cfg = presets.tool_arithmetic()
    base = presets.arithmetic()
    assert cfg.task.name == "tool_arithmetic" and cfg.sampling.max_new_tokens == 48
    assert (cfg.model, cfg.steps, cfg.optim) == (base.model, base.steps, base.optim)
    tok = TASK.tokenizer()
    longest = max(len(tok.encode(TASK.solutions(r)[0])) + 1 for r in TASK.generate("train", 200, seed=0))
    assert longest <= cfg.sampling.max_new_tokens  # the tool solution and its EOS fit
    assert presets.tool_arithmetic(smoke=True).model.d_model == presets.arithmetic(smoke=True).model.d_model
