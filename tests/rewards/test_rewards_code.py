"""Code reward: program extraction, the two test formats, scoring modes, sample validation."""

import pytest

from grpo_jax.rewards import MissingFieldError, RewardInputError, code_reward
from grpo_jax.rewards.code import called_names, extract_program, fenced_blocks, outputs_match

T = "<think>plan</think>"
HE = {
    "tests": "def check(candidate):\n    assert candidate([3, 1, 2]) == [1, 2, 3]\n    assert candidate([]) == []\n",
    "entry_point": "sort_list",
}
IO = {
    "io": [
        {"input": "2 3\n", "output": "5\n"},
        {"input": "-1 1\n", "output": "0"},
        {"input": "10 -4\n", "output": "6\n"},
    ]
}


def fenced(code: str, lang: str = "python") -> str:
    return f"{T}Here:\n```{lang}\n{code}```\n"


def test_extract_program_rules():
    assert extract_program("```python\na = 1\n```\ntext\n```py\nb = 2\n```") == "b = 2"  # last python block
    assert extract_program("```\nc = 3\n```") == "c = 3"  # unlabelled fence as fallback
    assert extract_program("```js\nx\n```\n```python\nd = 4\n```\n```js\ny\n```") == "d = 4"
    assert extract_program("  e = 5\n") == "e = 5"  # whole answer
    assert extract_program("```python\nf = 6\n") == "f = 6"  # unterminated fence at the end


USAGE_AFTER = (
    "```python\ndef sort_list(xs):\n    return sorted(xs)\n```\nUsage:\n```python\nprint(sort_list([3, 1, 2]))\n```\n"
)
FENCE_IN_STRING = 'Here:\n```python\ndef fence(s):\n    return "```" + s + "```"\n```\nDone.\n'
FENCE_IN_TRIPLE_STRING = 'Here:\n```python\ndef fence(s):\n    return """\n```\n""" + s\n```\nDone.\n'


def test_the_block_that_defines_the_function_is_the_program():
    """A usage example after the solution block is not the program: the block that defines the entry
    point (or, without one, the functions the tests call) is, as a grader reading the answer would take."""
    assert extract_program(USAGE_AFTER, ("sort_list",)).startswith("def sort_list")
    assert extract_program(USAGE_AFTER) == "print(sort_list([3, 1, 2]))"  # nothing to go by: the last block
    drafts = "```python\ndef f(x):\n    return 1\n```\nFixed:\n```python\ndef f(x):\n    return 2\n```\n"
    assert extract_program(drafts, ("f",)).endswith("return 2")  # of two blocks that define it, the last
    imports = "```python\ndef f(x):\n    return 1\n```\n```python\nfrom solution import f\nprint(f(1))\n```\n"
    assert extract_program(imports, ("f",)).startswith("def f")  # importing the function is not defining it
    assert called_names(["assert sort_list([2, 1]) == sorted([1, 2])", "def check(c):\n    assert c(1)\n"]) == (
        "sort_list",
    )


@pytest.mark.parametrize("sample", [HE, {"tests": ["assert sort_list([3, 1, 2]) == [1, 2, 3]", "assert sort_list([]) == []"]}])
def test_a_usage_example_after_the_solution_does_not_fail_a_right_answer(sample):
    assert code_reward(T + USAGE_AFTER, sample).score == 1.0
    wrong = USAGE_AFTER.replace("sorted(xs)", "xs")
    assert code_reward(T + wrong, sample).score == 0.0


@pytest.mark.parametrize("answer", [FENCE_IN_STRING, FENCE_IN_TRIPLE_STRING], ids=["string", "triple-quoted"])
def test_a_fence_inside_a_string_literal_does_not_end_the_block(answer):
    program = extract_program(answer)
    assert program.startswith("def fence") and program.endswith(("+ s", '"```"')), program
    assert compile(program, "<program>", "exec") is not None
    expected = "```x```" if answer is FENCE_IN_STRING else "\n```\nx"
    sample = {"tests": f"def check(c):\n    assert c('x') == {expected!r}\n", "entry_point": "fence"}
    assert code_reward(T + answer, sample).score == 1.0


def test_fences_markdown_would_close():
    """Python that ends a line with the fence ends there; code that is not Python ends at the first fence
    alone on its line, as in markdown."""
    assert fenced_blocks("```python\ndef f(x):\n    return x```\ntext\n```js\nlet s = '```\n```\n") == [
        ("python", "def f(x):\n    return x"),
        ("js", "let s = '```\n"),
    ]


def test_humaneval_format():
    assert code_reward(fenced("def sort_list(xs):\n    return sorted(xs)\n"), HE).score == 1.0
    wrong = code_reward(fenced("def sort_list(xs):\n    return xs\n"), HE)
    assert wrong.score == 0.0 and wrong.info["reason"] == "error"
    assert "AssertionError" in wrong.info["results"][0]["stderr_tail"]


def test_stdin_stdout_format_and_modes():
    add = fenced("a, b = map(int, input().split())\nprint(a + b)\n")
    assert code_reward(add, IO).score == 1.0
    half = fenced("a, b = map(int, input().split())\nprint(abs(a) + b)\n")  # fails only the -1 1 case
    assert code_reward(half, IO).score == 0.0
    frac = code_reward(half, IO, mode="fraction")
    assert frac.score == pytest.approx(2 / 3) and frac.info["passed"] == 2
    # mode="all" stops at the first failure: only 2 of the 3 cases were run
    assert len(code_reward(half, IO).info["results"]) == 2


def test_mbpp_assert_list_fraction():
    sample = {"tests": ["assert inc(1) == 2", "assert inc(5) == 6", "assert inc(-1) == 0", "assert inc(0) == 2"]}
    result = code_reward(fenced("def inc(x):\n    return x + 1\n"), sample, mode="fraction")
    assert result.score == pytest.approx(3 / 4)  # the last assert is wrong on purpose


def test_output_comparison_is_whitespace_tolerant_at_line_ends_only():
    assert outputs_match("5  \n\n\n", "5")
    assert outputs_match("a\r\nb\n", "a\nb")
    assert not outputs_match(" 5", "5")
    assert not outputs_match("5\n6", "5")


def test_no_program_and_syntax_error_score_zero():
    assert code_reward(T, HE).info["reason"] == "no_program"
    assert code_reward(fenced("def sort_list(xs) return xs"), HE).score == 0.0
    assert (
        code_reward("<think>```python\ndef sort_list(xs):\n    return sorted(xs)\n```", HE).score == 0.0
    )  # unfinished thinking


def test_malformed_samples_name_the_field():
    good = fenced("print(1)\n")
    with pytest.raises(MissingFieldError, match="'tests'"):
        code_reward(good, {"question": "x"})
    with pytest.raises(RewardInputError, match=r"io\[1\]\.output"):
        code_reward(good, {"io": [{"input": "", "output": "1"}, {"input": ""}]})
    with pytest.raises(RewardInputError, match="entry_point"):
        code_reward(good, {"tests": "def check(c): pass", "entry_point": "os.system('x')"})
    with pytest.raises(RewardInputError, match="tests"):
        code_reward(good, {"tests": []})
    with pytest.raises(RewardInputError, match="mode"):
        code_reward(good, IO, mode="most")
    with pytest.raises(RewardInputError, match="wall_s"):
        code_reward(good, IO, wall_s=0)
