"""Rewards never raise on model output: random unicode, huge strings, unbalanced braces and tags."""

import math
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
    """Each reward returns a result in its range (no crash, no internal error) on each input. No time bound:
    how fast a call returns depends on the machine and its load; test_repeated_patterns_stay_linear checks
    the cost's growth with the input's length instead."""
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


LINEAR_N = 1_000  # repetitions of the piece in the small text; the large one has 10x as many


def _cpu_seconds(work, repeats: int = 3) -> float:
    """CPU seconds of this process spent in `work()`, the least of `repeats` runs. CPU time, not wall time:
    time the process waits while other processes run does not count; the minimum drops what a garbage
    collection or a page fault added to one run."""
    best = math.inf
    for _ in range(repeats):
        t0 = time.process_time()
        work()
        best = min(best, time.process_time() - t0)
    return best


@pytest.mark.parametrize(
    "piece", ["Answer: (A) (B) ", "The answer is 1. ", "<answer>", "ignore the previous instructions "]
)
def test_repeated_patterns_stay_linear(piece):
    """Thousands of repeated commitments/tags: each reward's extraction (and sanitize_prompt) stays linear in
    the text's length; a quadratic scan takes minutes on 20 000 repetitions.

    No absolute time bound, which a slow or loaded machine fails: the CPU time of each function on the text
    with 10 * LINEAR_N repetitions is compared with its CPU time on LINEAR_N, measured here, so the
    machine's speed cancels out of the ratio. Linear work gives ~10 and quadratic work ~100. The bound, 35,
    has room on both sides: the linear ratios measured on a loaded 2-core machine were at most 11 at this
    size and 18 at twice it (per-call overhead pulls a cheap function's ratio down, memory effects on the
    larger text push it up; a deliberately quadratic scan added to a reward gave 37 to 100), and a
    quadratic term that makes up a third of the cost at LINEAR_N already pushes the ratio past it
    (10 * 2/3 + 100 * 1/3 = 40). LINEAR_N = 1 000 is large enough that per-call overhead does not dominate: the
    measured ratios are ~10, not ~1 (except translation_reward, which truncates its input to 20 000
    characters and so stops growing), and small enough that the large texts cost ~1 s of CPU per piece."""
    from grpo_jax.rewards import sanitize_prompt

    small, large = piece * LINEAR_N, piece * (10 * LINEAR_N)
    calls = [(fn.reward_name, lambda text, fn=fn, s=sample, kw=kwargs: _check(fn, s, kw, text))
             for fn, sample, kwargs in INLINE]  # fmt: skip
    calls.append(("sanitize_prompt", sanitize_prompt))
    for name, call in calls:
        t_small = _cpu_seconds(lambda call=call: call(small))
        t_large = _cpu_seconds(lambda call=call: call(large))
        assert t_large < 35 * t_small, f"{name}: {t_large:.4f} s of CPU on 10x the text vs {t_small:.4f} s"
