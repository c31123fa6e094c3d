"""Multi-digit arithmetic, the default experiment's task: prompt "123+045=", answer "168".

Operands are zero-padded to `digits` so every prompt of a task has the same length and the digit
positions line up; the answer is written most-significant digit first with no padding, as the math
reward reads it. For "-" the larger operand comes first, so answers are never negative.

The ideal completion thinks one fixed word ("add"): the format reward needs a non-empty thought, and a
constant one keeps the setting measured in docs/measurements.md §2 (SFT to ~30%, then GRPO +15 to +56 points), where
the model has to carry in its head rather than on a scratchpad.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from grpo_jax.tasks.base import Row, draw_distinct, formatted
from grpo_jax.tokenizer import CharTokenizer, Tokenizer

OPS = {"+": ("add", lambda a, b: a + b), "-": ("sub", lambda a, b: a - b), "*": ("mul", lambda a, b: a * b)}


def difficulty(a: int, b: int, op: str) -> int:
    """Carries (+), borrows (-) or non-zero digits of the multiplier (*): a stratum for data reports."""
    if op == "*":
        return sum(c != "0" for c in str(b))
    count, carry = 0, 0
    while a or b:
        da, db = a % 10, b % 10
        carry = int(da + db + carry >= 10) if op == "+" else int(da - db - carry < 0)
        count += carry
        a, b = a // 10, b // 10
    return count


@dataclass(frozen=True)
class ArithmeticTask:
    """`digits`-digit operands combined by `op`; rows carry "answer" for the math reward."""

    digits: int = 3  # operand width; 1 digit leaves too few problems for distinct splits of any size
    op: str = "+"  # one of "+", "-", "*"
    name: str = "arithmetic"
    required_fields: tuple[str, ...] = ("prompt", "answer")

    def __post_init__(self) -> None:
        if isinstance(self.digits, bool) or not isinstance(self.digits, int) or not 1 <= self.digits <= 18:
            raise ValueError(f"digits must be an int in [1, 18], got {self.digits!r}")
        if self.op not in OPS:
            raise ValueError(f"op must be one of {sorted(OPS)}, got {self.op!r}")

    def make_row(self, a: int, b: int) -> Row:
        """The row for operands (a, b), canonicalised (larger first for '-')."""
        if self.op == "-" and a < b:
            a, b = b, a
        prompt = self._key(a, b)
        answer = str(OPS[self.op][1](a, b))
        return {"prompt": prompt, "answer": answer, "task": self.name, "operands": [a, b], "op": self.op,
                "difficulty": difficulty(a, b, self.op)}

    def _propose(self, rng: np.random.Generator, size: int) -> list[tuple[str, tuple[int, int]]]:
        operands = rng.integers(0, 10**self.digits, size=(size, 2)).tolist()
        return [(self._key(a, b), (a, b)) for a, b in operands]

    def _key(self, a: int, b: int) -> str:
        """The canonical problem: its prompt (so '-' problems with swapped operands are one problem)."""
        if self.op == "-" and a < b:
            a, b = b, a
        return f"{a:0{self.digits}d}{self.op}{b:0{self.digits}d}="

    def generate(self, split: str, n: int, seed: int) -> list[Row]:
        """n distinct problems of `split` ("train", "valid", "heldout"), reproducible from `seed`."""
        return draw_distinct(split, n, seed, self._propose, lambda ab: self.make_row(*ab))

    def solutions(self, row: Row) -> list[str]:
        """The one ideal completion (`solution`): this task has a single solution path."""
        return [self.solution(row)]

    def solution(self, row: Row) -> str:
        """The ideal completion text (the caller appends the tokenizer's EOS id)."""
        return formatted(OPS[row.get("op", self.op)][0], str(row["answer"]))

    def tokenizer(self) -> Tokenizer:
        return CharTokenizer()

    def reward_specs(self) -> list[dict[str, Any]]:
        """Correctness plus a small format term: the weights of the runs in docs/measurements.md §2."""
        return [
            {"name": "math", "weight": 1.0, "kwargs": {}},
            {"name": "format", "weight": 0.1, "kwargs": {"require_answer_tag": True}},
        ]
