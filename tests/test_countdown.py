"""Countdown: the exact verifier reward, the exhaustive solver, and the task (splits, rows, completions)."""

from __future__ import annotations

from fractions import Fraction

import numpy as np
import pytest

from grpo_jax.config import TrainConfig, override
from grpo_jax.rewards import (
    REWARDS,
    RewardInputError,
    countdown_numbers_reward,
    countdown_reward,
    countdown_ops_reward,
    countdown_steps_reward,
    dimension_names,
    evaluate as evaluate_rewards,
)
from grpo_jax.rewards import countdown as countdown_module
from grpo_jax.rewards.countdown import (MAX_ANSWER_CHARS, MAX_THOUGHT_CHARS, canonical_answer, check_expression,
                                        evaluate, parse)
from grpo_jax.tasks import SPLITS, TASKS, CountdownTask, get_task, split_of
from grpo_jax.tasks.countdown import completion, count_solutions, random_trace_pass_at_k, solve, steps_for

SAMPLE = {"numbers": [3, 5, 8], "target": 23}
THINK = "<think>5*3=15, 15+8=23</think>"
REASONS = {"correct", "no_answer", "too_long", "multiple_answers", "parse_error", "unary_minus", "too_deep",
           "wrong_numbers", "division_by_zero", "wrong_value"}


def score(answer: str, sample: dict = SAMPLE) -> tuple[float, str]:
    result = countdown_reward(f"{THINK}<answer>{answer}</answer>", sample)
    return result.score, result.info["reason"]


# ------------------------------------------------------------------------------------ the verifier


@pytest.mark.parametrize("answer, sample", [
    ("(5*3)+8", SAMPLE),
    ("5*3+8", SAMPLE),  # precedence without parentheses
    ("8+3*5", SAMPLE),  # any order of the numbers
    (" ( 5 *\t3 ) + 8 ", SAMPLE),  # spaces and tabs
    ("(((5)*(3)))+((8))", SAMPLE),  # redundant parentheses
    ("((8-(5-3))*3)-(0)", {"numbers": [0, 3, 3, 5, 8], "target": 18}),  # nested; 0 is a number like any other
    ("(6/2+4)*3-1", {"numbers": [1, 2, 3, 4, 6], "target": 20}),  # all four operators
    ("6/(1-3/4)", {"numbers": [1, 3, 4, 6], "target": 24}),  # non-integer intermediates: allowed, exact
    ("3-(5-8)", {"numbers": [3, 5, 8], "target": 6}),  # negative intermediate: allowed
    ("(3+3)*8", {"numbers": [3, 3, 8], "target": 48}),  # a number given twice is used twice
])
def test_valid_expressions_score_one(answer, sample):
    assert score(answer, sample) == (1.0, "correct")


@pytest.mark.parametrize("answer, sample, reason", [
    ("5*3+8+8-8", SAMPLE, "wrong_numbers"),  # 8 reused
    ("(3+3+3)*8", {"numbers": [3, 3, 8], "target": 72}, "wrong_numbers"),  # given twice, used three times
    ("5*3+8", {"numbers": [2, 3, 5, 8], "target": 23}, "wrong_numbers"),  # 2 missing
    ("5*3+9-1", SAMPLE, "wrong_numbers"),  # numbers not in the row
    ("53-30", {"numbers": [3, 5, 30], "target": 23}, "wrong_numbers"),  # digits of two numbers glued
    ("05*3+8", SAMPLE, "wrong_numbers"),  # written differently from the row
    ("1000000-5*3*8", SAMPLE, "wrong_numbers"),  # a 7-digit literal
    ("5*3-8", SAMPLE, "wrong_value"),
    ("8/(3-3)", {"numbers": [3, 3, 8], "target": 8}, "division_by_zero"),
    ("-3+5*8-14", SAMPLE, "unary_minus"),
    ("8*(5--3)", SAMPLE, "unary_minus"),
    ("+5*3+8", SAMPLE, "parse_error"),
    ("(5*3+8", SAMPLE, "parse_error"),  # unbalanced
    ("5*3)+8", SAMPLE, "parse_error"),
    ("()5*3+8", SAMPLE, "parse_error"),
    ("(5*3)+8=23", SAMPLE, "parse_error"),  # text after the expression
    ("5**3+8", SAMPLE, "parse_error"),
    ("5 3+8", SAMPLE, "parse_error"),
    ("5.0*3+8", SAMPLE, "parse_error"),
    ("5*3+", SAMPLE, "parse_error"),
    ("", SAMPLE, "no_answer"),
    ("1" + "0" * 400, SAMPLE, "too_long"),  # 10**400 written out
    ("(" * 40 + "5*3+8" + ")" * 40, SAMPLE, "too_deep"),
])
def test_invalid_expressions_score_zero_with_reason(answer, sample, reason):
    assert score(answer, sample) == (0.0, reason)


@pytest.mark.parametrize("response, expected", [
    (f"{THINK}(5*3)+8", (1.0, "correct")),  # no answer tag: the text after </think>, as for math
    ("5*3+8", (1.0, "correct")),  # no tags at all: the whole response
    ("<think>(5*3)+8", (0.0, "no_answer")),  # unfinished thinking
    ("<think>(5*3)+8</think>", (0.0, "no_answer")),  # only inside the thinking
    (f"{THINK}<answer>(5*3)+8</answer> so 23", (1.0, "correct")),  # outside text: the format reward's business
    (f"{THINK}<answer>(5*3)+8</answer><answer>(5*3)+8</answer>", (0.0, "multiple_answers")),
    (f"{THINK}<answer></answer><answer>(5*3)+8</answer>", (1.0, "correct")),  # empty blocks are dropped
])
def test_answer_segment_follows_split_response(response, expected):
    result = countdown_reward(response, SAMPLE)
    assert (result.score, result.info["reason"]) == expected


def test_version_registration_and_malformed_samples():
    assert countdown_reward.reward_version == "2" and REWARDS["countdown"] is countdown_reward
    for sample in ({"numbers": [3, 5, 8]}, {"target": 23}, {"numbers": [], "target": 1},
                   {"numbers": [3, True], "target": 1}, {"numbers": [3, 10**7], "target": 1},
                   {"numbers": [3, 5], "target": "8"}, {"numbers": "3 5", "target": 8}):
        with pytest.raises(RewardInputError):
            countdown_reward("5*3+8", sample)


def _never(*_args):
    raise AssertionError("the parser ran on a text over the length cap")


def test_huge_answers_are_cut_fast(monkeypatch):
    # cut before any parsing: the parser, made to fail here, is never called (a count of work, zero, where a
    # time bound would fail on a loaded machine)
    with monkeypatch.context() as patch:
        patch.setattr(countdown_module, "parse", _never)
        for answer in ("9" * 10**6, "(" * 10**5, "1+" * 10**5 + "1", "-" * 10**5):
            assert score(answer) == (0.0, "too_long")
    assert score("(" * 99 + "5*3+8" + ")" * 99) == (0.0, "too_long")  # 203 characters: the length cap comes first
    assert check_expression("(" * 90 + "5*3+8" + ")" * 90, [3, 5, 8], 23) == "too_deep"
    assert len("(" * 90 + "5*3+8" + ")" * 90) < MAX_ANSWER_CHARS


def _random_text(rng: np.random.Generator) -> str:
    pieces = list("0123456789+-*/() =\n\tx.") + ["3", "5", "8", "<think>", "</think>", "<answer>", "</answer>"]
    return "".join(rng.choice(pieces, size=int(rng.integers(0, 60))))


def test_never_raises_on_random_text():
    rng = np.random.default_rng(0)
    reasons = set()
    for _ in range(3000):
        text = _random_text(rng)
        result = countdown_reward(text, SAMPLE)
        assert result.score in (0.0, 1.0) and result.info["reason"] in REASONS, (text, result.info)
        assert check_expression(text, [3, 5, 8], 23) in REASONS - {"no_answer"}
        reasons.add(result.info["reason"])
    assert {"parse_error", "wrong_numbers", "no_answer"} <= reasons  # the fuzz reaches several branches


# ------------------------------------------------------------------------------------ the solver


def traces(numbers, target) -> set[tuple[str, ...]]:
    return {tuple(step.text() for step in s.steps) for s in solve(numbers, target)}


def test_solver_enumerates_one_two_three_to_six():
    # By hand, first step then last step (+ and * larger first; - only when positive; / only when exact):
    #   1 and 2:  2+1=3 -> 3+3=6 | 2-1=1 -> {1,3}: 4, 2, 3, 3: none | 2*1=2 -> 3*2=6 | 2/1=2 -> 3*2=6
    #   1 and 3:  3+1=4 -> 4+2=6 | 3-1=2 -> {2,2}: 4, 4, 1: none   | 3*1=3 -> 3*2=6 | 3/1=3 -> 3*2=6
    #   2 and 3:  3+2=5 -> 5+1=6 | 3-2=1 -> {1,1}: 2, 1, 1: none   | 3*2=6 -> 6*1=6 and 6/1=6 | 3/2: not exact
    # 9 traces.
    assert traces([1, 2, 3], 6) == {
        ("2+1=3", "3+3=6"), ("2*1=2", "3*2=6"), ("2/1=2", "3*2=6"),
        ("3+1=4", "4+2=6"), ("3*1=3", "3*2=6"), ("3/1=3", "3*2=6"),
        ("3+2=5", "5+1=6"), ("3*2=6", "6*1=6"), ("3*2=6", "6/1=6"),
    }
    assert len(solve([3, 2, 1], 6)) == 9 == count_solutions((3, 1, 2), 6)  # the order of the numbers is moot


def test_solver_unique_and_unsolvable_problems():
    # 2, 5, 7 -> 19: of the 9 first steps only 7*2=14 leaves a pair that reaches 19 (14+5).
    (only,) = solve([2, 5, 7], 19)
    assert [s.text() for s in only.steps] == ["7*2=14", "14+5=19"] and only.expression == "(7*2)+5"
    assert solve([2, 5, 7], 100) == []  # the largest reachable value is 2*5*7 = 70
    assert solve([4, 4], 0) == [] and traces([4, 4], 1) == {("4/4=1",)}  # no zero from 4-4; 4/4 exact
    with pytest.raises(ValueError, match="positive ints"):
        solve([3, 0], 3)


def _check_trace(numbers, target, solution):
    available = list(numbers)
    for step in solution.steps:
        available.remove(step.left)
        available.remove(step.right)
        assert step in steps_for(step.left, step.right) and step.result > 0
        available.append(step.result)
    assert available == [target]


def test_every_solution_is_a_valid_trace_and_verifies():
    rng = np.random.default_rng(1)
    for _ in range(60):
        numbers = rng.integers(1, 13, size=int(rng.integers(2, 5))).tolist()
        target = int(rng.integers(1, 60))
        found = solve(numbers, target)
        assert len(found) == count_solutions(numbers, target)
        assert len({s.steps for s in found}) == len(found)  # distinct traces
        sample = {"numbers": numbers, "target": target}
        for s in found:
            _check_trace(numbers, target, s)
            tree, _ = parse(s.expression)
            assert evaluate(tree) == Fraction(target)
            assert countdown_reward(completion(s), sample).score == 1.0


# ------------------------------------------------------------------------------------ the task


def test_splits_are_disjoint_for_any_seed_or_size():
    task = TASKS["countdown"]
    prompts = {split: set() for split in SPLITS}
    for seed, n in ((0, 400), (5, 2000)):
        for split in SPLITS:
            rows = task.generate(split, n if split == "train" else n // 4, seed=seed)
            assert all(split_of(r["prompt"]) == split for r in rows)  # the prompt is the canonical problem
            prompts[split] |= {r["prompt"] for r in rows}
    assert not prompts["train"] & prompts["heldout"]
    assert not prompts["train"] & prompts["valid"]
    assert not prompts["valid"] & prompts["heldout"]


def test_generate_is_deterministic_and_prefix_stable():
    task = TASKS["countdown"]
    rows = task.generate("train", 300, seed=2)
    assert rows == task.generate("train", 300, seed=2)
    assert task.generate("train", 70, seed=2) == rows[:70]
    assert [r["prompt"] for r in rows] != [r["prompt"] for r in task.generate("train", 300, seed=3)]
    assert len({r["prompt"] for r in rows}) == 300


def test_rows_solutions_and_tokens():
    task = TASKS["countdown"]
    tok = task.tokenizer()
    for row in task.generate("valid", 150, seed=0):
        numbers, target = row["numbers"], row["target"]
        assert len(numbers) == 4 and numbers == sorted(numbers) and all(1 <= n <= 15 for n in numbers)
        assert 1 <= target <= 100 and row["prompt"] == f"{' '.join(map(str, numbers))}:{target}="
        texts = task.solutions(row)
        assert row["n_solutions"] == len(texts) == len(set(texts)) >= 1
        assert task.solution(row) == texts[0]
        for text in (row["prompt"], *texts):
            assert tok.unk_id not in tok.encode(text)
        assert all(countdown_reward(t, row).score == 1.0 for t in texts)


def test_defaults_have_several_paths_and_short_completions():
    """The properties the defaults were chosen for (module docstring), on a smaller held-out sample."""
    task = TASKS["countdown"]
    tok = task.tokenizer()
    rows = task.generate("heldout", 300, seed=0)
    counts = np.array([r["n_solutions"] for r in rows])
    assert counts.mean() >= 3 and (counts == 1).mean() < 0.2
    thoughts = [task.solution(r).split("<think>")[1].split("</think>")[0] for r in rows]
    assert np.mean([len(tok.encode(t)) for t in thoughts]) >= 15
    assert np.mean([len(tok.encode(task.solution(r))) + 1 for r in rows]) <= 44  # with EOS


def test_min_solutions_drops_problems_and_keeps_the_stream():
    """min_solutions filters candidates before the split and distinctness checks and draws nothing extra, so
    the filtered problems are, in order, the unfiltered ones that have at least that many solutions."""
    plain = CountdownTask(n_numbers=3, max_number=50)
    every = plain.generate("train", 400, seed=3)
    assert min(r["n_solutions"] for r in every) == 1  # the filter has something to drop
    kept = [r for r in every if r["n_solutions"] >= 2]
    filtered = CountdownTask(n_numbers=3, max_number=50, min_solutions=2).generate("train", len(kept), seed=3)
    assert [r["prompt"] for r in filtered] == [r["prompt"] for r in kept]
    assert all(r["n_solutions"] == count_solutions(r["numbers"], r["target"]) >= 2 for r in filtered)


def test_prompt_format_options_and_errors():
    task = CountdownTask(n_numbers=3, max_number=9, max_target=50)
    assert task.make_row([8, 3, 5], 23) == {"prompt": "3 5 8:23=", "numbers": [3, 5, 8], "target": 23,
                                            "task": "countdown", "n_solutions": 1}
    assert task.solution(task.make_row([8, 3, 5], 23)) == "<think>5*3=15, 15+8=23</think><answer>(5*3)+8</answer>"
    assert len(get_task("countdown", n_numbers=3).generate("train", 5, seed=0)[0]["numbers"]) == 3
    for bad in ({"n_numbers": 5}, {"n_numbers": 1}, {"max_number": 0}, {"max_target": True}, {"max_number": 2.5},
                {"min_solutions": 0}):
        with pytest.raises(ValueError, match="CountdownTask"):
            CountdownTask(**bad)
    with pytest.raises(ValueError, match="no solution"):
        task.solution({"prompt": "2 5 7:100=", "numbers": [2, 5, 7], "target": 100})
    with pytest.raises(ValueError, match="problem space is too small"):
        CountdownTask(n_numbers=2, max_number=3, max_target=9).generate("heldout", 50, seed=0)


# ------------------------------------------------------------------------------------ countdown_numbers

NUMBERS_REASONS = {"ok", "no_answer", "too_long", "multiple_answers", "parse_error", "unary_minus", "too_deep",
                   "wrong_numbers"}


def numbers_score(answer: str, sample: dict = SAMPLE) -> tuple[float, str]:
    result = countdown_numbers_reward(f"{THINK}<answer>{answer}</answer>", sample)
    return result.score, result.info["reason"]


@pytest.mark.parametrize("answer, sample", [
    ("(5*3)+8", SAMPLE),  # correct
    ("5*3-8", SAMPLE),  # value 7, not 23: the value is countdown's business
    ("8/(3-3)", {"numbers": [3, 3, 8], "target": 8}),  # no value at all: nothing is evaluated
    (" 3 *\t(8 - 5) ", SAMPLE),  # spaces, tabs, any order
    ("6/(1-3/4)", {"numbers": [1, 3, 4, 6], "target": 2}),  # fraction intermediate, wrong value
])
def test_countdown_numbers_scores_any_expression_over_the_numbers(answer, sample):
    assert numbers_score(answer, sample) == (1.0, "ok")


@pytest.mark.parametrize("answer, reason", [
    ("5*3+8+8-8", "wrong_numbers"),  # 8 reused
    ("5*3", "wrong_numbers"),  # 8 unused
    ("5*3+9", "wrong_numbers"),  # 9 is not given
    ("05*3+8", "wrong_numbers"),  # written differently from the row
    ("-3+5*8", "unary_minus"),
    ("(5*3)+8=23", "parse_error"),
    ("5 3+8", "parse_error"),
    ("five*3+8", "parse_error"),
    ("(" * 40 + "5*3+8" + ")" * 40, "too_deep"),
    ("1" + "0" * 400, "too_long"),
    ("5*3+8\n5*3+8", "multiple_answers"),
    ("", "no_answer"),
])
def test_countdown_numbers_reasons(answer, reason):
    assert numbers_score(answer) == (0.0, reason)


def test_countdown_numbers_reads_the_answer_segment_only():
    assert countdown_numbers_reward("<think>5*3+8</think>", SAMPLE).info["reason"] == "no_answer"
    assert countdown_numbers_reward("<think>5*3+8", SAMPLE).info["reason"] == "no_answer"  # unfinished thinking
    assert countdown_numbers_reward("5*3+8", SAMPLE).score == 1.0  # no tags: the whole response
    two = f"{THINK}<answer>5*3+8</answer><answer>5*3+8</answer>"
    assert countdown_numbers_reward(two, SAMPLE).info["reason"] == "multiple_answers"


def test_wrong_value_with_the_right_numbers_splits_the_two_answer_rewards():
    response = f"{THINK}<answer>(5*3)-8</answer>"
    assert (countdown_reward(response, SAMPLE).score, countdown_reward(response, SAMPLE).info["reason"]) == (
        0.0, "wrong_value")
    assert countdown_numbers_reward(response, SAMPLE).score == 1.0
    assert countdown_steps_reward(response, SAMPLE).score == 1.0  # the trace is judged on its own


# ------------------------------------------------------------------------------------ countdown_steps

STEPS_REASONS = {"ok", "no_think", "too_long", "parse_error", "too_many_steps", "wrong_arithmetic",
                 "unavailable_operand", "numbers_left"}


def steps_info(thought: str, sample: dict = SAMPLE) -> dict:
    result = countdown_steps_reward(f"<think>{thought}</think><answer>(5*3)+8</answer>", sample)
    assert result.score == float(result.info["reason"] == "ok")
    return dict(result.info)


@pytest.mark.parametrize("thought, sample, value", [
    ("5*3=15, 15+8=23", SAMPLE, 23),  # the task's form
    ("5*3=15,15+8=23", SAMPLE, 23),  # no space after the comma
    (" 5 *\t3 = 15 , 15 + 8 = 23 ", SAMPLE, 23),  # spaces and tabs around tokens
    ("3*5=15, 8+15=23", SAMPLE, 23),  # smaller operand first
    ("8-5=3, 3*3=9", SAMPLE, 9),  # a result reused as an operand next to an equal given number; value != target
    ("8-3=5, 5-5=0", SAMPLE, 0),  # a zero result is a non-negative integer
    ("8/8=1, 3*1=3", {"numbers": [3, 8, 8], "target": 3}, 3),  # exact division, a number given twice
    ("0+3=3, 3+5=8, 8*8=64", {"numbers": [0, 3, 5, 8], "target": 64}, 64),
])
def test_countdown_steps_valid_traces(thought, sample, value):
    info = steps_info(thought, sample)
    assert (info["reason"], info["value"]) == ("ok", value)


@pytest.mark.parametrize("thought, reason, step", [
    ("5*3=16, 16+8=24", "wrong_arithmetic", 1),  # a wrong step, then consistent with it
    ("5*3=15, 15+8=24", "wrong_arithmetic", 2),
    ("8/3=2, 5*2=10", "wrong_arithmetic", 1),  # inexact division
    ("5-8=0, 3+8=11", "wrong_arithmetic", 1),  # below zero
    ("5*3=15, 15+5=20", "unavailable_operand", 2),  # 5 reused
    ("5*3=15, 15+15=30", "unavailable_operand", 2),  # a result used twice
    ("9*3=27, 27+8=35", "unavailable_operand", 1),  # 9 is not given
    ("3+3=6, 6+8=14", "unavailable_operand", 1),  # 3 given once
    ("5*3=15, 23+8=31", "unavailable_operand", 2),  # a result never produced
])
def test_countdown_steps_step_reasons(thought, reason, step):
    info = steps_info(thought)
    assert (info["reason"], info["step"]) == (reason, step)


def test_countdown_steps_division_by_zero_is_wrong_arithmetic():
    sample = {"numbers": [3, 8, 8], "target": 3}
    assert steps_info("8-8=0, 0/3=0", sample)["reason"] == "ok"  # zero divided is fine
    info = steps_info("8-8=0, 3/0=0", sample)  # no result of 3/0 is right
    assert (info["reason"], info["step"]) == ("wrong_arithmetic", 2)


@pytest.mark.parametrize("thought, reason", [
    ("5*3=15", "numbers_left"),  # 8 unused
    ("5*3=15, 15+8=23, 23+0=23", "too_many_steps"),  # no trace of 3 numbers has 3 steps
    ("3-5=-2, 8*2=16", "parse_error"),  # a negative result cannot be written
    ("8/5=1.6, 3*1.6=4.8", "parse_error"),  # nor a fractional one
    ("05*3=15, 15+8=23", "parse_error"),  # leading zero
    ("5*3=015, 15+8=23", "parse_error"),
    ("5*3=15, 15+8=23,", "parse_error"),  # an empty step
    ("5*3=15\n15+8=23", "parse_error"),  # steps are separated by commas
    ("5*3=15; 15+8=23", "parse_error"),
    ("(5*3)+8=23", "parse_error"),  # one step is one operation
    ("5*3=15, 15+8", "parse_error"),
    ("5x3=15, 15+8=23", "parse_error"),
    ("5*3=15, 15+8=23 so 23", "parse_error"),
    ("\u0665*3=15, 15+8=23", "parse_error"),  # an Arabic-Indic digit five is not a trace number
    ("1" * (MAX_THOUGHT_CHARS + 1), "too_long"),
    ("", "no_think"),
])
def test_countdown_steps_trace_reasons(thought, reason):
    assert steps_info(thought)["reason"] == reason


@pytest.mark.parametrize("thought, first, reason", [
    ("5*3=15, 15+8=24", 1, "ok"),  # the start is right; the wrong second step is not judged
    ("5*3=15", 1, "ok"),  # numbers left are not judged either
    ("5*3=16, 16+8=24", 1, "wrong_arithmetic"),
    ("5*5=25, 25-8=17", 1, "unavailable_operand"),
    ("5*3=15, 15+8=24", 2, "wrong_arithmetic"),
    ("5*3=15", 2, "too_few_steps"),
    ("5*3=15, 15+8=23, 23+0=23", 1, "too_many_steps"),  # the whole trace must still parse as one
])
def test_countdown_steps_first_judges_the_start_of_a_trace(thought, first, reason):
    result = countdown_steps_reward(f"<think>{thought}</think><answer>x</answer>", SAMPLE, first=first)
    assert (result.info["reason"], result.score) == (reason, float(reason == "ok"))


@pytest.mark.parametrize("first", [0, -1, True, 1.0, "1"])
def test_countdown_steps_first_must_be_a_positive_int(first):
    with pytest.raises(RewardInputError, match="first must be a positive int"):
        countdown_steps_reward(f"{THINK}<answer>x</answer>", SAMPLE, first=first)


def test_countdown_steps_reads_the_thinking_segment():
    assert countdown_steps_reward("(5*3)+8", SAMPLE).info["reason"] == "no_think"  # no tags: all answer
    assert countdown_steps_reward("<answer>(5*3)+8</answer>", SAMPLE).info["reason"] == "no_think"
    assert countdown_steps_reward("<think>5*3=15, 15+8=23", SAMPLE).score == 1.0  # cut off after the trace
    assert countdown_steps_reward("5*3=15, 15+8=23</think>(5*3)+8", SAMPLE).score == 1.0  # no opening tag
    # the first think block is the thinking
    assert countdown_steps_reward(f"{THINK}<think>junk</think>(5*3)+8", SAMPLE).score == 1.0
    custom = countdown_steps_reward("<r>5*3=15, 15+8=23</r><a>(5*3)+8</a>", SAMPLE, think_tag="r", answer_tag="a")
    assert custom.score == 1.0


def test_new_rewards_registration_and_malformed_samples():
    assert countdown_numbers_reward.reward_version == "2" and REWARDS["countdown_numbers"] is countdown_numbers_reward
    assert countdown_steps_reward.reward_version == "2" and REWARDS["countdown_steps"] is countdown_steps_reward
    assert countdown_reward.reward_version == "2"
    for fn in (countdown_numbers_reward, countdown_steps_reward):
        for sample in ({"numbers": [3, 5, 8]}, {"target": 23}, {"numbers": [], "target": 1},
                       {"numbers": [3, True], "target": 1}, {"numbers": [3, 10**7], "target": 1},
                       {"numbers": [3, 5], "target": "8"}, {"numbers": "3 5", "target": 8}):
            with pytest.raises(RewardInputError):
                fn(f"{THINK}<answer>5*3+8</answer>", sample)
        with pytest.raises(RewardInputError):
            fn("5*3+8", SAMPLE, tol=1)  # an unknown keyword is a config bug
        assert fn(None, SAMPLE).info["reason"] == "response_not_a_string"


def test_solver_completions_score_one_on_all_three():
    task = CountdownTask(n_numbers=3, max_number=50, min_solutions=2)
    rows = task.generate("heldout", 50, seed=0)
    scored = 0
    for row in rows:
        for text in task.solutions(row):
            for fn in (countdown_reward, countdown_numbers_reward, countdown_steps_reward):
                result = fn(text, row)
                assert result.score == 1.0, (text, fn.reward_name, result.info)
            assert countdown_steps_reward(text, row).info["value"] == row["target"]
            scored += 1
    assert scored >= 2 * len(rows)  # min_solutions=2


def test_huge_thoughts_are_cut_fast(monkeypatch):
    with monkeypatch.context() as patch:  # cut before any parsing, as test_huge_answers_are_cut_fast
        patch.setattr(countdown_module, "parse_steps", _never)
        for thought in ("9" * 10**6, "1+1=2," * 10**5, "," * 10**5, "x" + " " * 10**5 + "x"):
            assert steps_info(thought)["reason"] == "too_long"
    longest = "5*3=15, 15+8=23" + " " * (MAX_THOUGHT_CHARS - 15)  # exactly the cap: still read
    assert len(longest) == MAX_THOUGHT_CHARS and steps_info(longest)["reason"] == "ok"
    big = {"numbers": [999_999, 999_998, 999_997], "target": 1}
    trace = f"999999*999998={999_999 * 999_998}, {999_999 * 999_998}*999997={999_999 * 999_998 * 999_997}"
    assert steps_info(trace, big)["reason"] == "ok"


def _junk_or_mutated_trace(rng: np.random.Generator) -> str:
    """Random junk from trace and tag pieces, or a valid trace with a few characters replaced (reaches the
    per-step checks, which pure junk rarely does)."""
    pieces = list("0123456789+-*/()=, \n\tx.") + ["15", "23", "<think>", "</think>", "<answer>", "</answer>"]
    if rng.random() < 0.5:
        return "".join(rng.choice(pieces, size=int(rng.integers(0, 60))))
    chars = list("<think>5*3=15, 15+8=23</think><answer>(5*3)+8</answer>")
    for _ in range(int(rng.integers(1, 4))):
        chars[int(rng.integers(0, len(chars)))] = str(rng.choice(pieces))
    return "".join(chars)


def test_new_rewards_never_raise_on_random_text():
    rng = np.random.default_rng(0)
    seen = {"countdown_numbers": set(), "countdown_steps": set()}
    for _ in range(2000):
        text = _junk_or_mutated_trace(rng)
        for fn, known in ((countdown_numbers_reward, NUMBERS_REASONS), (countdown_steps_reward, STEPS_REASONS)):
            result = fn(text, SAMPLE)
            assert result.score in (0.0, 1.0) and result.info["reason"] in known, (text, fn.reward_name, result.info)
            assert result.score == float(result.info["reason"] == "ok")
            seen[fn.reward_name].add(result.info["reason"])
    assert {"ok", "parse_error", "wrong_numbers", "no_answer"} <= seen["countdown_numbers"]
    assert {"ok", "no_think", "parse_error", "wrong_arithmetic"} <= seen["countdown_steps"]


# ------------------------------------------------------------------------------------ several dimensions


def test_config_specs_with_all_four_dimensions_score_a_matrix():
    from grpo_jax.build import reward_specs  # imports jax and the models: only this test needs them

    specs_json = ('[{"name": "countdown", "weight": 1.0}, {"name": "countdown_numbers", "weight": 1.0}, '
                  '{"name": "countdown_steps", "weight": 1.0}, '
                  '{"name": "format", "weight": 1.0, "kwargs": {"require_answer_tag": true}}]')
    cfg = override(TrainConfig(), [f"rewards.specs={specs_json}"])
    specs = reward_specs(cfg, CountdownTask())
    assert dimension_names(specs) == ["countdown", "countdown_numbers", "countdown_steps", "format"]
    responses = [
        "<think>5*3=15, 15+8=23</think><answer>(5*3)+8</answer>",  # everything right
        "<think>5*3=15, 15-8=7</think><answer>(5*3)-8</answer>",  # valid trace, right numbers, wrong value
        "<think>5*3=16, 16+8=24</think><answer>(5*3)+8</answer>",  # correct answer after a broken trace
        "<think>5*3=15</think><answer>5*3</answer>",  # 8 unused in both
        "(5*3)+8",  # no tags: the answer is right, there is no thinking and no format
    ]
    rewards_NxK, infos = evaluate_rewards(specs, responses, [SAMPLE] * len(responses))
    assert rewards_NxK.shape == (5, 4) and rewards_NxK.dtype == np.float32
    assert rewards_NxK.tolist() == [[1, 1, 1, 1], [0, 1, 1, 1], [1, 1, 0, 1], [0, 0, 0, 1], [1, 1, 0, 0]]
    assert rewards_NxK[1, :3].sum() == rewards_NxK[2, :3].sum() == 2  # two different failures tie when summed
    assert infos["versions"] == {"countdown": "2", "countdown_numbers": "2", "countdown_steps": "2", "format": "2"}
    assert infos["per_response"][2]["countdown_steps"]["reason"] == "wrong_arithmetic"
    with pytest.raises(ValueError, match=r"rewards\.specs\[0\].*unknown kwargs"):
        reward_specs(override(TrainConfig(), ['rewards.specs=[{"name": "countdown_steps", "kwargs": {"x": 1}}]']),
                     CountdownTask())


# ------------------------------------------------------------------------------------ countdown_ops


@pytest.mark.parametrize("answer, ops, score, reason", [
    ("(5*3)+8", "+*", 1.0, "ok"),          # correct, in + and *
    ("(5+3)+8", "+*", 1.0, "ok"),          # wrong value (16): style only
    ("(8-3)*5", "+*", 0.0, "other_operator"),  # the right numbers, a subtraction
    ("(8+8)*3", "+*", 0.0, "wrong_numbers"),   # the numbers are judged first
    ("(8-5)*3", "-*", 1.0, "ok"),          # the operators are the spec's
    ("8/(5+3)", "+*", 0.0, "other_operator"),
    ("23", "+*", 0.0, "wrong_numbers"),     # one literal is no expression over the numbers
    ("(5*3+8", "+*", 0.0, "parse_error"),
])
def test_countdown_ops_judges_the_operators_of_an_expression_over_the_numbers(answer, ops, score, reason):
    result = countdown_ops_reward(f"<think></think><answer>{answer}</answer>", SAMPLE, ops=ops)
    assert (result.score, result.info["reason"]) == (score, reason)


@pytest.mark.parametrize("answer, uses, score, reason", [
    ("(5*3)+8", "*", 1.0, "ok"),            # correct, and it multiplies
    ("(5+3)*8", "*", 1.0, "ok"),            # wrong value (64): style only
    ("(5+3)+8", "*", 0.0, "missing_operator"),  # the right numbers, no multiplication
    ("(8-3)*5", "*-", 1.0, "ok"),           # every operator of uses appears
    ("(8-3)+5", "*-", 0.0, "missing_operator"),
    ("(5*3)*3", "*", 0.0, "wrong_numbers"),  # the numbers are judged first
])
def test_countdown_ops_uses_asks_for_operators_the_answer_must_contain(answer, uses, score, reason):
    result = countdown_ops_reward(f"<think></think><answer>{answer}</answer>", SAMPLE, ops="+-*/", uses=uses)
    assert (result.score, result.info["reason"]) == (score, reason)


def test_countdown_ops_refuses_a_bad_operator_set():
    for ops in ("", "+^", 3):
        with pytest.raises(RewardInputError, match="countdown_ops: ops"):
            countdown_ops_reward("<answer>(5*3)+8</answer>", SAMPLE, ops=ops)
    for uses in ("^", None):
        with pytest.raises(RewardInputError, match="countdown_ops: uses"):
            countdown_ops_reward("<answer>(5*3)+8</answer>", SAMPLE, ops="+-*/", uses=uses)
    with pytest.raises(RewardInputError, match="ops '\\+\\*' excludes"):
        countdown_ops_reward("<answer>(5*3)+8</answer>", SAMPLE, ops="+*", uses="-")
    assert countdown_ops_reward("<think>5*3=15</think>", SAMPLE).info["reason"] == "no_answer"


# ------------------------------------------------------------------ distinct solutions, the guesser's coverage


def _canon(answer: str, sample: dict = SAMPLE) -> str | None:
    return canonical_answer(f"<think></think><answer>{answer}</answer>", sample)


def test_one_solution_written_many_ways_is_one_canonical_answer():
    same = ["(5*3)+8", "8+(5*3)", "8+5*3", "(3*5)+8", "3*5+8", "((5*3))+8"]
    assert len({_canon(a) for a in same}) == 1
    abc = {"numbers": [2, 3, 4], "target": 9}
    assert len({_canon(a, abc) for a in ["2+3+4", "(2+3)+4", "4+(3+2)", "3+(2+4)"]}) == 1  # one + chain
    # another solution, or regrouping across - or /, is another canonical answer
    assert _canon("(8-3)*5") != _canon("(5*3)+8")
    d = {"numbers": [9, 5, 3], "target": 7}
    assert _canon("9-(5-3)", d) != _canon("(9+3)-5", d)
    assert _canon("(5*3)+9") is None and _canon("") is None  # not over the numbers / no answer


def test_the_guesser_pass_at_k_by_hand():
    # numbers 1, 2 (one step): traces 2+1=3, 2-1=1, 2*1=2, 2/1=2 -> 4 traces; target 2 is reached by two of
    # them, so q = 1/2 and pass@k = 1 - (1/2)^k.
    assert random_trace_pass_at_k([1, 2], 2, 1) == 0.5
    assert random_trace_pass_at_k([1, 2], 2, 3) == 1 - 0.5 ** 3
    assert random_trace_pass_at_k([1, 2], 5, 4) == 0.0
    # three numbers: the share is count_solutions over every trace, so it never exceeds pass@k = 1
    row = CountdownTask(n_numbers=3, max_number=50, min_solutions=2).generate("heldout", 1, seed=0)[0]
    p1 = random_trace_pass_at_k(row["numbers"], row["target"], 1)
    assert 0 < p1 < 1 and random_trace_pass_at_k(row["numbers"], row["target"], 16) == 1 - (1 - p1) ** 16
