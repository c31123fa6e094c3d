"""What every shipped task shares: the Task interface, hash-based splits and seeded problem drawing.

Splits are a function of the problem itself (a SHA-256 of its canonical key), not of the seed or of how
many rows were asked for, so a held-out problem can never turn up in training data for any seed or
size. `valid` exists so that supervised warm-start stopping (NOTES: stop on validation accuracy) never
looks at the problems the final report is scored on (`heldout`).
"""

from __future__ import annotations

import hashlib
from typing import Any, Callable, Protocol

import numpy as np

from grpo_jax.tokenizer import Tokenizer

SPLITS = ("train", "valid", "heldout")
# Fraction of the problem space in each split, by hash bucket. Held-out and valid are small slices so
# that the training space stays large; 5% of 3-digit additions is still 50,000 problems.
SPLIT_FRACTIONS = {"heldout": 0.05, "valid": 0.05, "train": 0.90}
BLOCK = 256  # candidates proposed per RNG call (fixed: the stream must not depend on n)
THINK_OPEN, THINK_CLOSE, ANSWER_OPEN, ANSWER_CLOSE = "<think>", "</think>", "<answer>", "</answer>"

Row = dict[str, Any]


class Task(Protocol):
    """A verifiable task: seeded rows, the ideal completion, a fitting tokenizer, and its rewards."""

    name: str
    required_fields: tuple[str, ...]  # fields every row needs (checked when rows are loaded from JSONL)

    def generate(self, split: str, n: int, seed: int) -> list[Row]: ...

    def solution(self, row: Row) -> str: ...

    def solutions(self, row: Row) -> list[str]: ...  # every valid ideal completion (the warm start picks one)

    def tokenizer(self) -> Tokenizer: ...

    def reward_specs(self) -> list[dict[str, Any]]: ...


def split_of(key: str) -> str:
    """The split a problem belongs to, from a stable hash of its canonical key (same on every machine)."""
    digest = hashlib.sha256(key.encode("utf-8")).digest()
    u = int.from_bytes(digest[:8], "big") / 2.0**64
    if u < SPLIT_FRACTIONS["heldout"]:
        return "heldout"
    if u < SPLIT_FRACTIONS["heldout"] + SPLIT_FRACTIONS["valid"]:
        return "valid"
    return "train"


def check_request(split: str, n: int, seed: int) -> None:
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
    if isinstance(n, bool) or not isinstance(n, int) or n < 0:
        raise ValueError(f"n must be a non-negative int, got {n!r}")
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise ValueError(f"seed must be a non-negative int, got {seed!r}")


def draw_distinct(
    split: str,
    n: int,
    seed: int,
    propose: Callable[[np.random.Generator, int], list[tuple[str, Any]]],
    build: Callable[[Any], Row],
) -> list[Row]:
    """n distinct problems of `split`, by rejection: `propose(rng, size)` gives (key, problem) candidates
    and `build(problem)` turns each kept one into a row.

    The RNG is `default_rng([seed, split index])`, so each split's stream is independent of the others,
    and candidates come in fixed-size blocks, so `generate(n)` is a prefix of `generate(m)` for m > n.
    Gives up with an error when the split's problem space is too small for n (e.g. 1-digit addition).
    """
    check_request(split, n, seed)
    rng = np.random.default_rng([seed, SPLITS.index(split)])
    rows: list[Row] = []
    seen: set[str] = set()
    for _ in range(50 * n // BLOCK + 20):
        for key, problem in propose(rng, BLOCK):
            if len(rows) == n:
                return rows
            if key not in seen and split_of(key) == split:
                seen.add(key)
                rows.append(build(problem))
    if len(rows) == n:
        return rows
    raise ValueError(f"could only draw {len(rows)} of {n} distinct {split!r} problems: the problem space is too small")


def formatted(thought: str, answer: str) -> str:
    """The completion format every task teaches: <think>thought</think><answer>answer</answer>."""
    return f"{THINK_OPEN}{thought}{THINK_CLOSE}{ANSWER_OPEN}{answer}{ANSWER_CLOSE}"
