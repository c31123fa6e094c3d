"""A toy translation task with a fixed made-up lexicon: prompt "bako deli:", reference "zat fen".

Translation is word by word (same order), so the task is learnable by a tiny model, yet chrF on the
answer gives graded credit for partly right sentences: a dense quality signal next to the binary
format reward and a length penalty. The three dimensions exist for the multi-reward (reward collapse)
ablations; they are deliberately separate columns of the reward matrix.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from grpo_jax.tasks.base import Row, draw_distinct, formatted
from grpo_jax.tokenizer import CharTokenizer, Tokenizer

SOURCE_WORDS = (
    "bako deli fumo gari hesu jiko kale lumo mira nobe pesa quro rina sota tule vimo wabe yoka zeni abu "
    "eko ima oru ula firu geta hano joru kimi lesa mogu nari piko ruta sebi tora vena wiku yamo zuri"
).split()
TARGET_WORDS = (
    "zat fen mor kil dra pux sel trom gax vin bler hod nup qua rish tem wol yex zib cof "
    "dun fli gor hap jux klo lem mav nix opt pry rud sav tuk vey wub yon zor bax eft"
).split()
LEXICON = dict(zip(SOURCE_WORDS, TARGET_WORDS))  # 40 pairs; fixed, so every machine has the same task
MARKER = ":"


def translate(source: str) -> str:
    """Word-by-word translation of a source sentence (the reference)."""
    return " ".join(LEXICON[w] for w in source.split())


@dataclass(frozen=True)
class TranslationTask:
    """Sentences of `min_words`..`max_words` lexicon words; rows carry "references" for chrF."""

    min_words: int = 2
    max_words: int = 6
    name: str = "translation"
    required_fields: tuple[str, ...] = ("prompt", "references")

    def __post_init__(self) -> None:
        if not 1 <= self.min_words <= self.max_words:
            raise ValueError(f"need 1 <= min_words <= max_words, got {self.min_words}, {self.max_words}")

    def make_row(self, source: str) -> Row:
        target = translate(source)
        row = {"prompt": f"{source}{MARKER}", "answer": target, "references": [target], "task": self.name,
               "source": source, "difficulty": len(source.split())}
        row["target_length"] = len(self.solution(row))  # characters; see reward_specs
        return row

    def _propose(self, rng: np.random.Generator, size: int) -> list[tuple[str, str]]:
        lengths = rng.integers(self.min_words, self.max_words + 1, size=size).tolist()
        words = rng.integers(0, len(SOURCE_WORDS), size=(size, self.max_words)).tolist()
        sources = [" ".join(SOURCE_WORDS[i] for i in w[:k]) for k, w in zip(lengths, words)]
        return [(s, s) for s in sources]

    def generate(self, split: str, n: int, seed: int) -> list[Row]:
        """n distinct sentences of `split` ("train", "valid", "heldout"), reproducible from `seed`."""
        return draw_distinct(split, n, seed, self._propose, self.make_row)

    def solutions(self, row: Row) -> list[str]:
        """The one ideal completion (`solution`): this task has a single solution path."""
        return [self.solution(row)]

    def solution(self, row: Row) -> str:
        """Ideal completion: the thought counts the words (e.g. "3 words"), the answer is the reference."""
        n_words = len(row["answer"].split())
        return formatted(f"{n_words} words", row["answer"])

    def tokenizer(self) -> Tokenizer:
        return CharTokenizer()

    def reward_specs(self) -> list[dict[str, Any]]:
        """chrF quality, format, and a penalty for running longer than the ideal completion.

        Length is measured in characters of the decoded response (`target_length` is in characters), so
        it does not depend on the tokenizer. `length_key` names a field the sampler does not fill, so a
        token count it may attach as "response_length" is not compared against a character target.
        """
        return [
            {"name": "translation", "weight": 1.0, "kwargs": {"metric": "chrf"}},
            {"name": "format", "weight": 0.2, "kwargs": {"require_answer_tag": True}},
            {"name": "length", "weight": 0.2,
             "kwargs": {"mode": "over", "unit": "chars", "length_key": "response_chars"}},
        ]
