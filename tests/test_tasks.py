"""Shipped tasks: seeded determinism, disjoint splits, correct references, ideal completions that the
task's own rewards score as perfect."""

from __future__ import annotations

import operator

import pytest

from grpo_jax.rewards import RewardSpec, evaluate, format_reward, math_reward, translation_reward
from grpo_jax.tasks import SPLITS, SYNTHETIC, TASKS, ArithmeticTask, get_task, split_of
from grpo_jax.tasks.translation import LEXICON, SOURCE_WORDS, TARGET_WORDS

NAMES = list(SYNTHETIC)


@pytest.mark.parametrize("name", NAMES)
def test_same_seed_same_rows_other_seed_other_rows(name):
    task = TASKS[name]
    rows = task.generate("train", 200, seed=3)
    assert rows == task.generate("train", 200, seed=3)
    assert [r["prompt"] for r in rows] != [r["prompt"] for r in task.generate("train", 200, seed=4)]
    assert task.generate("train", 50, seed=3) == rows[:50]  # a smaller request is a prefix
    assert len({r["prompt"] for r in rows}) == 200  # distinct problems


@pytest.mark.parametrize("name", NAMES)
def test_splits_never_overlap_for_any_seed_or_size(name):
    task = TASKS[name]
    prompts = {split: set() for split in SPLITS}
    for seed, n in ((0, 300), (1, 1000), (7, 2000)):
        for split in SPLITS:
            rows = task.generate(split, n if split == "train" else n // 4, seed=seed)
            # membership is a property of the problem itself, whatever seed or size produced it
            assert all(split_of(r["source"] if name == "translation" else r["prompt"]) == split for r in rows)
            prompts[split] |= {r["prompt"] for r in rows}
    assert not prompts["train"] & prompts["heldout"]
    assert not prompts["train"] & prompts["valid"]
    assert not prompts["valid"] & prompts["heldout"]


@pytest.mark.parametrize("op", ["+", "-", "*"])
def test_arithmetic_answers_recomputed(op):
    task = ArithmeticTask(digits=3, op=op)
    fn = {"+": operator.add, "-": operator.sub, "*": operator.mul}[op]
    for row in task.generate("train", 300, seed=0):
        left, right = row["prompt"][:-1].split(op)
        assert len(left) == len(right) == 3 and row["prompt"].endswith("=")  # zero-padded operands
        assert row["answer"] == str(fn(int(left), int(right)))
        assert int(row["answer"]) >= 0


def test_arithmetic_difficulty_counts_carries():
    task = ArithmeticTask()
    assert task.make_row(123, 45)["difficulty"] == 0  # 3+5, 2+4, 1+0: no carry
    assert task.make_row(999, 1)["difficulty"] == 3  # carry out of every digit
    assert task.make_row(1, 999)["prompt"] == "001+999="
    assert ArithmeticTask(op="-").make_row(5, 123)["prompt"] == "123-005="  # larger operand first


def test_translation_references_are_word_by_word():
    assert len(LEXICON) == len(set(TARGET_WORDS)) == len(SOURCE_WORDS) == 40
    for row in TASKS["translation"].generate("train", 300, seed=0):
        source = row["prompt"].removesuffix(":")
        assert source == row["source"] and 2 <= len(source.split()) <= 6
        assert row["references"] == [" ".join(LEXICON[w] for w in source.split())] == [row["answer"]]


@pytest.mark.parametrize("name", NAMES)
def test_solution_is_perfect_under_the_task_rewards(name):
    task = TASKS[name]
    specs = [RewardSpec(**d) for d in task.reward_specs()]
    rows = task.generate("heldout", 40, seed=0)
    solutions = [task.solution(r) for r in rows]
    rewards, _ = evaluate(specs, solutions, rows)
    # correctness 1, format 1, and (translation) a length penalty of 0 at the target length
    expected = [0.0 if s.name == "length" else 1.0 for s in specs]
    assert rewards.tolist() == [expected] * len(rows)
    for solution in solutions:
        thought = solution.split("<think>")[1].split("</think>")[0]
        assert 0 < len(thought.strip()) <= (40 if name == "countdown" else 8)  # countdown thinks in steps


def test_wrong_answers_are_not_rewarded():
    """The check above is not vacuous: a changed answer loses the correctness reward, not the format one."""
    row = TASKS["arithmetic"].generate("heldout", 1, seed=0)[0]
    wrong = TASKS["arithmetic"].solution({**row, "answer": str(int(row["answer"]) + 1)})
    assert math_reward(wrong, row).score == 0.0 and format_reward(wrong, row).score == 1.0
    row = TASKS["translation"].generate("heldout", 1, seed=0)[0]
    half = TASKS["translation"].solution({**row, "answer": row["answer"].split()[0]})
    assert 0.0 < translation_reward(half, row).score < 1.0


def test_completions_are_short_in_task_tokens():
    task = TASKS["arithmetic"]
    tok = task.tokenizer()
    row = task.make_row(123, 45)
    assert row["prompt"] == "123+045=" and row["answer"] == "168"
    assert task.solution(row) == "<think>add</think><answer>168</answer>"
    # prompt: 8 characters; completion: 4 tags + 'add' + '168' + EOS = 11
    assert len(tok.encode(row["prompt"])) == 8
    assert len(tok.encode(task.solution(row))) + 1 == 11


def test_get_task_options_and_errors():
    assert get_task("arithmetic", digits=2, op="*").generate("train", 1, seed=0)[0]["prompt"][2] == "*"
    with pytest.raises(ValueError, match="unknown task 'nope'"):
        get_task("nope")
    with pytest.raises(ValueError, match="unknown options \\['digit'\\]"):
        get_task("arithmetic", digit=2)
    with pytest.raises(ValueError, match="split must be one of"):
        TASKS["arithmetic"].generate("test", 1, seed=0)
    with pytest.raises(ValueError, match="problem space is too small"):
        get_task("arithmetic", digits=1).generate("heldout", 50, seed=0)  # ~5 of 100 problems are held out


def test_jsonl_math_task_reads_files_and_says_so():
    task = get_task("jsonl_math")
    with pytest.raises(ValueError, match="task.train_path"):
        task.generate("train", 10, seed=0)
    with pytest.raises(ValueError, match="tokenizer_path"):
        task.tokenizer()
    assert task.required_fields == ("prompt", "answer")
    assert [s["name"] for s in task.reward_specs()] == ["math", "format"]
