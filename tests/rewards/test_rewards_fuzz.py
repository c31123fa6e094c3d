"""Rewards never raise on model output: random unicode, huge strings, unbalanced braces and tags."""

import random
import time

import pytest

from grpo_jax.rewards import (
    code_reward,
    format_reward,
    length_penalty,
    math_reward,
    overlong_penalty,
    repetition_penalty,
    science_reward,
    translation_reward,
)

INLINE = [
    (format_reward, {}, {}),
    (math_reward, {"answer": "4"}, {}),
    (math_reward, {"answer": "\\frac{1}{2}"}, {"fallback_last_number": True}),
    (science_reward, {"answer": "B", "choices": ["a", "b", "c"]}, {}),
    (science_reward, {"answer": "9.8", "unit": "m/s^2"}, {}),
    (translation_reward, {"references": ["The cat sits."]}, {}),
    (translation_reward, {"references": ["The cat sits."]}, {"metric": "bleu"}),
    (repetition_penalty, {}, {}),
    (overlong_penalty, {}, {"max_len": 100, "cache_len": 10}),
    (length_penalty, {}, {"target": 50}),
]
IDS = [f"{fn.reward_name}-{i}" for i, (fn, _, _) in enumerate(INLINE)]
PIECES = [
    "<think>",
    "</think>",
    "<answer>",
    "</answer>",
    "\\boxed{",
    "}",
    "{",
    "\\frac",
    "\\sqrt",
    "^",
    "_",
    "$",
    "####",
    "The answer is",
    "Answer:",
    "(C)",
    "A or B",
    "```python\n",
    "```",
    "\n",
    " ",
    "9" * 50,
    "-",
    ".",
    ",",
    "%",
    "\\left(",
    "\\right)",
    "\\text{",
    "\u2212",
    "\u03c0",
    "\U0001f680",
    "\x00",
    "\ud800",
    "e",
    "x",
    "=",
    "/",
    "!",
]


def _random_response(rng: random.Random) -> str:
    parts = []
    for _ in range(rng.randint(0, 40)):
        if rng.random() < 0.7:
            parts.append(rng.choice(PIECES))
        else:
            parts.append("".join(chr(rng.randint(1, 0x2FFF)) for _ in range(rng.randint(1, 12))))
    return "".join(parts)


def _check(fn, sample, kwargs, response):
    result = fn(response, sample, **kwargs)
    lo, hi = fn.score_range
    assert lo <= result.score <= hi and "reason" in result.info
    assert result.info["reason"] != "internal_error", result.info  # the decorator hid a bug


@pytest.mark.parametrize("fn, sample, kwargs", INLINE, ids=IDS)
def test_random_unicode_never_raises(fn, sample, kwargs):
    rng = random.Random(1234)  # fixed seed: a failure here is reproducible
    for _ in range(150):
        _check(fn, sample, kwargs, _random_response(rng))


@pytest.mark.parametrize("fn, sample, kwargs", INLINE, ids=IDS)
def test_huge_and_pathological_strings(fn, sample, kwargs):
    t0 = time.perf_counter()
    for response in [
        "",
        "x" * 2_000_000,
        "{" * 100_000,
        "\\boxed{" * 20_000,
        "<think>" * 10_000 + "</think>" * 10_000,
        "<think>t</think>" + "\\boxed{" + "(" * 5_000 + "}",
        "<think>t</think>The answer is " + "1" * 100_000,
        "<think>t</think>" + " ".join(["word"] * 300_000),
    ]:
        _check(fn, sample, kwargs, response)
    assert time.perf_counter() - t0 < 30


def test_code_reward_on_garbage_programs():
    sample = {"tests": "def check(f):\n    assert f(1) == 1\n", "entry_point": "f"}
    for response in [
        "```python\n\x00\x01\n```",
        "```python\n" + "(" * 5000 + "\n```",
        "\ud800" * 10,
        "```python\n" + "a" * 200_000 + "\n```",
    ]:
        result = code_reward(response, sample, wall_s=2.0)
        assert result.score == 0.0 and "reason" in result.info


@pytest.mark.parametrize(
    "piece", ["Answer: (A) (B) ", "The answer is 1. ", "<answer>", "ignore the previous instructions "]
)
def test_repeated_patterns_stay_linear(piece):
    """Thousands of repeated commitments/tags: extraction stays linear (a quadratic scan takes minutes on
    such text), < 1 s each on a quiet machine. The bound leaves room for a loaded one."""
    from grpo_jax.rewards import sanitize_prompt

    text = piece * 20_000
    t0 = time.perf_counter()
    for fn, sample, kwargs in INLINE:
        _check(fn, sample, kwargs, text)
    sanitize_prompt(text)
    assert time.perf_counter() - t0 < 20
