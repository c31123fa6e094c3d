"""Countdown (TinyZero's task): combine the given numbers with + - * / into an expression equal to a target.

A prompt lists the numbers in ascending order, a colon, the target and "=": `"3 5 8:23="` (numbers
1..max_number, target 1..max_target, all inside TASK_ALPHABET). The ascending order makes the prompt the
canonical problem, so it is also the split key: one problem, one prompt, one split.

Every problem is solvable: the target is the value of a random trace (below) over the drawn numbers,
each step a uniformly drawn pair and a uniformly drawn allowed operator; the first of TARGET_TRIES
traces whose value lies in [1, max_target] is kept, and numbers with none are dropped.

Traces and distinct solutions (what "n_solutions" counts). A trace is a sequence of steps; each step
takes two of the currently available numbers, writes `left op right=result`, removes the two and adds
the result, until one number is left; a solution is a trace whose last number is the target (so every
given number is used exactly once). Allowed steps keep every intermediate a positive integer:
- `+` and `*` always, written larger operand first (so `3+5` and `5+3` are one step);
- `-` only when the result is > 0, larger first (a zero would only feed degenerate `x+(a-a)` padding
  and divisions by zero, and would inflate the count without adding a real path);
- `/` only when exact (the divisor is never zero: every number is positive), dividend first.
Two solutions are the same when their step lists are equal in this canonical writing; the same steps
in another order are different solutions, as they are different completions. Steps that only relabel
(`x*1`, `x/1`) are distinct steps. The verifier (`rewards/countdown.py`) accepts more than this: any
expression over the numbers with the exact value (negative, zero or fractional intermediates), so the
solver's count is the number of *trace-shaped* ways, a lower bound on what scores 1.

Completion: `<think>5*3=15, 15+8=23</think><answer>(5*3)+8</answer>`. The thought is the steps joined
by ", "; the answer mirrors the trace, each step's operands in the step's order and every compound
operand in parentheses, so it evaluates exactly as the trace does. `solution(row)` is the first trace
in the solver's fixed order (pairs in ascending order of value, operators in the order + - * /, depth
first); `solutions(row)` is every trace, for a warm start that samples among them.

Measured at the defaults (n_numbers=4, max_number=15, max_target=100) on 2,000 held-out problems
(seed 0), with the snippet below:
    distinct solutions per problem: mean 13.6, min 1, median 11, max 107; exactly one: 4.9%
    <think> length in CharTokenizer tokens: canonical solution 23.1, a random solution 23.6
    whole completion (tags and EOS): mean 40.7, max 52 tokens; prompt at most 15 tokens
    problem space (number multisets x reachable targets): 145,574, so ~7,300 held out
    generate("train", 20_000): ~8 s on one busy CPU core
Other settings (n_numbers, max_number, max_target: mean solutions, fraction with one, think tokens,
completion tokens, problem space):
    3, 50, 100:  2.8, 14%, 16.7, 31.2, 141,697     3, 99, 100:  2.9, 10%, 17.4, 32.1, 648,371
    3, 30, 100:  2.7, 22%, 16.0, 30.1, 42,273 (2,000 held-out problems cannot be drawn; train rows)
    4, 13, 100: 11.6,  6%, 22.9, 40.1, 88,377 (held-out draws of 3,000 fail)
    4, 20, 100: 14.8,  4%, 24.1, 42.2, 384,004
Three numbers cannot reach 3 solutions on average: their paths are mostly the three groupings of
a+b+c or a*b*c, and smaller numbers (more coincidences) leave too few held-out problems. With
min_solutions=2 the one-path problems (14% at 3, 50, 100) are redrawn, so every problem offers a choice:
    3, 50, 100, min_solutions 2:  mean 3.11 (min 2, median 3, max 10; 6.8% with exactly two),
    think tokens 16.8 / 16.9, completion 31.3 (at most 37) tokens, ~86% of the 3, 50, 100 space

    task = CountdownTask(); tok = task.tokenizer(); rows = task.generate("heldout", 2000, seed=0)
    counts = np.array([r["n_solutions"] for r in rows]); rng = np.random.default_rng(0)
    think = lambda s: len(tok.encode(s.split("<think>")[1].split("</think>")[0]))
    print(counts.mean(), counts.min(), np.median(counts), counts.max(), (counts == 1).mean())
    print(np.mean([think(task.solution(r)) for r in rows]),
          np.mean([think(rng.choice(task.solutions(r))) for r in rows]))
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterator, NamedTuple

import numpy as np

from grpo_jax.rewards.countdown import canonical_answer
from grpo_jax.tasks.base import Row, draw_distinct, formatted
from grpo_jax.tokenizer import CharTokenizer, Tokenizer

TARGET_TRIES = 4  # random traces tried per drawn number set before the set is dropped (target out of range)


class Step(NamedTuple):
    """One canonical step `left op right=result`."""

    left: int
    op: str
    right: int
    result: int

    def text(self) -> str:
        return f"{self.left}{self.op}{self.right}={self.result}"


class Solution(NamedTuple):
    """A trace and the answer expression that evaluates as it does."""

    steps: tuple[Step, ...]
    expression: str


class _Entry(NamedTuple):
    """An available number and the expression that produced it (an atom for a given number)."""

    value: int
    expression: str
    atom: bool


def steps_for(a: int, b: int) -> list[Step]:
    """Every allowed step combining the values a and b, canonically written, in the order + - * /."""
    hi, lo = max(a, b), min(a, b)
    steps = [Step(hi, "+", lo, hi + lo)]
    if hi > lo:  # results stay positive
        steps.append(Step(hi, "-", lo, hi - lo))
    steps.append(Step(hi, "*", lo, hi * lo))
    if hi % lo == 0:  # exact division only; lo >= 1 since every value is positive
        steps.append(Step(hi, "/", lo, hi // lo))
    return steps


def _branches(values: tuple[int, ...]) -> list[tuple[Step, tuple[int, ...]]]:
    """Each allowed first step from the ascending `values` and the ascending values after it.

    One branch per distinct pair of values: equal values give equal steps, so no trace is repeated."""
    out = []
    tried: set[tuple[int, int]] = set()
    for i in range(len(values)):
        for j in range(i + 1, len(values)):
            if (values[i], values[j]) in tried:
                continue
            tried.add((values[i], values[j]))
            rest = values[:i] + values[i + 1 : j] + values[j + 1 :]
            out.extend((step, tuple(sorted((*rest, step.result)))) for step in steps_for(values[i], values[j]))
    return out


def _traces(values: tuple[int, ...], target: int) -> Iterator[tuple[Step, ...]]:
    """Every trace from the ascending `values` to `target`, depth first in `_branches` order (lazily, so
    the canonical solution costs only the search up to the first one)."""
    if len(values) == 1:
        if values[0] == target:
            yield ()
        return
    for step, after in _branches(values):
        for tail in _traces(after, target):
            yield (step, *tail)


def _results(lo: int, hi: int) -> list[int]:
    """The results of `steps_for(lo, hi)` (lo <= hi) without building the steps: the counter's last step."""
    out = [hi + lo, hi * lo]
    if hi > lo:
        out.append(hi - lo)
    if hi % lo == 0:
        out.append(hi // lo)
    return out


def _count(values: tuple[int, ...], target: int) -> int:
    """The number of traces from the ascending `values` to `target` (what `_traces` would yield)."""
    if len(values) == 1:
        return int(values[0] == target)
    if len(values) == 2:  # the last step, counted without building it: most of the work lands here
        return _results(*values).count(target)
    return sum(_count(after, target) for _, after in _branches(values))


def _count_all(values: tuple[int, ...]) -> int:
    """The number of traces from the ascending `values` to any final value."""
    if len(values) == 1:
        return 1
    return sum(_count_all(after) for _, after in _branches(values))


def random_trace_pass_at_k(numbers: tuple[int, ...] | list[int], target: int, k: int) -> float:
    """pass@k of a policy that ignores the target and draws k traces uniformly, with replacement, among every
    trace over the numbers: 1 - (1 - solutions / traces)^k, exact (the coverage a guesser gets; a policy's
    pass@k means something only above it)."""
    values = _check_numbers(numbers)
    return 1.0 - (1.0 - _count(values, target) / _count_all(values)) ** k


def expression_of(numbers: tuple[int, ...] | list[int], steps: tuple[Step, ...]) -> str:
    """The answer expression of a trace: replay it, taking each operand from the first available entry of
    its value (given numbers come first), wrapping compound operands in parentheses."""
    entries = [_Entry(n, str(n), True) for n in sorted(numbers)]
    for step in steps:
        left = entries.pop(next(k for k, e in enumerate(entries) if e.value == step.left))
        right = entries.pop(next(k for k, e in enumerate(entries) if e.value == step.right))
        wrap = [e.expression if e.atom else f"({e.expression})" for e in (left, right)]
        entries.append(_Entry(step.result, f"{wrap[0]}{step.op}{wrap[1]}", False))
    return entries[0].expression


def _check_numbers(numbers: tuple[int, ...] | list[int]) -> tuple[int, ...]:
    if not numbers or any(isinstance(n, bool) or not isinstance(n, int) or n < 1 for n in numbers):
        raise ValueError(f"numbers must be a non-empty list of positive ints, got {numbers!r}")
    return tuple(sorted(numbers))


def solve(numbers: tuple[int, ...] | list[int], target: int) -> list[Solution]:
    """Every distinct solution (module docstring) of `numbers` -> `target`, in the solver's fixed order."""
    values = _check_numbers(numbers)
    return [Solution(steps, expression_of(values, steps)) for steps in _traces(values, target)]


def first_solution(numbers: tuple[int, ...] | list[int], target: int) -> Solution | None:
    """solve(numbers, target)[0] without enumerating the rest, or None when there is no solution."""
    values = _check_numbers(numbers)
    steps = next(_traces(values, target), None)
    return None if steps is None else Solution(steps, expression_of(values, steps))


def count_solutions(numbers: tuple[int, ...] | list[int], target: int) -> int:
    """len(solve(numbers, target)), counted without building the traces (what `generate` runs per row)."""
    return _count(_check_numbers(numbers), target)


def completion(solution: Solution) -> str:
    """The completion text of a solution: the steps as the thought, the expression as the answer."""
    return formatted(", ".join(step.text() for step in solution.steps), solution.expression)


def random_trace_value(numbers: list[int], uniforms: np.ndarray) -> int:
    """The value of a random trace over `numbers`: each step picks a pair and an allowed operator by
    two of `uniforms` (floats in [0, 1), two per step)."""
    values = list(numbers)
    for k in range(len(numbers) - 1):
        i, j = _pair(len(values), uniforms[2 * k])
        steps = steps_for(values[i], values[j])
        step = steps[int(uniforms[2 * k + 1] * len(steps))]
        values = [v for m, v in enumerate(values) if m not in (i, j)] + [step.result]
    return values[0]


def _pair(n: int, u: float) -> tuple[int, int]:
    """The pair (i, j), i < j, of index int(u * n(n-1)/2) among the n(n-1)/2 pairs of n items."""
    pairs = [(i, j) for i in range(n) for j in range(i + 1, n)]
    return pairs[int(u * len(pairs))]


def prompt_of(numbers: list[int], target: int) -> str:
    """The prompt, which is also the canonical problem: ascending numbers, then the target."""
    return f"{' '.join(map(str, sorted(numbers)))}:{target}="


@dataclass(frozen=True)
class CountdownTask:
    """`n_numbers` numbers in [1, max_number] and a reachable target in [1, max_target]; rows carry
    "numbers" and "target" for the countdown reward, and the solver's "n_solutions"."""

    n_numbers: int = 4  # 3 numbers give < 3 solutions on average (module docstring)
    max_number: int = 15  # numbers in [1, max_number]; 13 leaves too few held-out problems
    max_target: int = 100  # targets in [1, max_target]
    min_solutions: int = 1  # problems with fewer distinct solutions are redrawn (2: every problem has a choice)
    name: str = "countdown"
    required_fields: tuple[str, ...] = ("prompt", "numbers", "target")

    def __post_init__(self) -> None:
        # n_numbers <= 4: the solver enumerates every trace of every generated problem, ~1000 with 4
        # numbers, ~100 times more with 5
        for field, lo, hi in (("n_numbers", 2, 4), ("max_number", 1, 999), ("max_target", 1, 999_999),
                              ("min_solutions", 1, 1000)):
            value = getattr(self, field)
            if isinstance(value, bool) or not isinstance(value, int) or not lo <= value <= hi:
                raise ValueError(f"CountdownTask.{field} must be an int in [{lo}, {hi}], got {value!r}")

    def make_row(self, numbers: list[int], target: int) -> Row:
        """The row of a problem (numbers in any order), with the solver's count of its solutions."""
        numbers = sorted(numbers)
        return {"prompt": prompt_of(numbers, target), "numbers": numbers, "target": target, "task": self.name,
                "n_solutions": count_solutions(numbers, target)}

    def _propose(self, rng: np.random.Generator, size: int) -> list[tuple[str, tuple[list[int], int]]]:
        """Candidate problems: drawn numbers and the value of the first random trace in target range, kept
        when the solver finds at least `min_solutions` solutions (the RNG stream does not depend on it)."""
        numbers = rng.integers(1, self.max_number + 1, size=(size, self.n_numbers)).tolist()
        uniforms = rng.random((size, TARGET_TRIES, 2 * (self.n_numbers - 1)))
        out = []
        for nums, tries in zip(numbers, uniforms):
            targets = (random_trace_value(nums, u) for u in tries)
            target = next((t for t in targets if 1 <= t <= self.max_target), None)
            if target is None or (self.min_solutions > 1 and count_solutions(nums, target) < self.min_solutions):
                continue
            out.append((prompt_of(nums, target), (nums, target)))
        return out

    def generate(self, split: str, n: int, seed: int) -> list[Row]:
        """n distinct problems of `split` ("train", "valid", "heldout"), reproducible from `seed`."""
        return draw_distinct(split, n, seed, self._propose, lambda problem: self.make_row(*problem))

    def solutions(self, row: Row) -> list[str]:
        """Every distinct solution's completion text, in the solver's order (the first is `solution`)."""
        return [completion(s) for s in solve(list(row["numbers"]), int(row["target"]))]

    def solution(self, row: Row) -> str:
        """The canonical completion: the solver's first trace (the caller appends the tokenizer's EOS id)."""
        found = first_solution(list(row["numbers"]), int(row["target"]))
        if found is None:
            raise ValueError(f"countdown problem {row.get('prompt')!r} has no solution")
        return completion(found)

    def tokenizer(self) -> Tokenizer:
        return CharTokenizer()

    def canonical_answer(self, text: str, row: Row) -> str | None:
        """The completion's answer written canonically (`rewards.countdown.canonical`): distinct solutions are
        counted by it, not by strings."""
        return canonical_answer(text, row)

    def reward_specs(self) -> list[dict[str, Any]]:
        """The exact verifier plus the small format term the other shipped tasks use."""
        return [
            {"name": "countdown", "weight": 1.0, "kwargs": {}},
            {"name": "format", "weight": 0.1, "kwargs": {"require_answer_tag": True}},
        ]
