"""Your own data files with a Hugging Face tokenizer: rows of any format of `grpo_jax.tasks.adapters`
(GSM8K, MATH, MBPP, HumanEval, multiple choice, translation pairs, or native prompt/messages rows).

The rows come from `task.train_path` / `task.eval_path` (read, adapted and validated line by line by
grpo_jax.data); this task supplies the tokenizer (a local HF folder, usually the checkpoint's own) and
the rewards, which follow from the rows' format: the correctness reward of its family (math, code,
science, translation) plus a small think/answer format reward. The format is `task.format`, or detected
from the columns of the first row; `bind_format` gives the task the format its data was read in.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, ClassVar

from grpo_jax.config import UserError
from grpo_jax.tasks.adapters import FAMILY_FIELDS, FAMILY_REWARDS, FORMATS, reward_specs
from grpo_jax.tasks.base import Row
from grpo_jax.tokenizer import HFTokenizer, Tokenizer


@dataclass(frozen=True)
class JsonlTask:
    tokenizer_path: str = ""  # local HF tokenizer folder (the checkpoint folder works)
    format_weight: float = 0.1  # weight of the think/answer format reward next to correctness (1.0)
    source_lang: str = ""  # wmt rows ({"translation": {"de": ..., "en": ...}}): the key translated from
    target_lang: str = ""  # ... and the key translated into (either alone picks the other of two keys)
    format: str = "auto"  # the rows' format (a key of adapters.FORMATS); set from the data by bind_format
    name: str = "jsonl"
    families: ClassVar[tuple[str, ...]] = tuple(FAMILY_REWARDS)  # the reward families this task scores

    @property
    def required_fields(self) -> tuple[str, ...]:
        """The fields of an adapted row: the prompt and what its family's reward reads."""
        family = FORMATS[self.format].family if self.format in FORMATS else None
        return ("prompt",) + (FAMILY_FIELDS[family] if family else ())

    @property
    def formats(self) -> tuple[str, ...]:
        """The row formats this task reads (those of its reward families)."""
        return tuple(name for name, fmt in FORMATS.items() if fmt.family in self.families)

    def generate(self, split: str, n: int, seed: int) -> list[Row]:
        fix = {"train": "set task.train_path to a JSONL file of them",
               "heldout": "set task.eval_path to a JSONL file of them (or task.n_eval=0 to evaluate nothing)"}
        raise ValueError(f"task {self.name!r} generates no rows, and the {split!r} split was asked for "
                         f"({n} rows): " + fix.get(split, "this launcher needs a task that generates rows "
                                                        "(e.g. arithmetic), or rows read from files")
                         + f" (rows of the formats {', '.join(self.formats)})")

    def solutions(self, row: Row) -> list[str]:
        """The one ideal completion (`solution`): this task has a single solution path."""
        return [self.solution(row)]

    def solution(self, row: Row) -> str:
        if "solution" not in row:
            raise KeyError("row has no 'solution' field: the supervised warm start needs worked solutions")
        return row["solution"]

    def tokenizer(self) -> Tokenizer:
        if not self.tokenizer_path:
            raise ValueError("task.options must give tokenizer_path (a local HF tokenizer or checkpoint folder)")
        if not os.path.isdir(self.tokenizer_path):  # named by its config key, not by the tokenizer class
            raise UserError(f"task.options tokenizer_path={self.tokenizer_path!r}: no such folder; give a local "
                            "Hugging Face tokenizer or checkpoint folder (hub ids are not fetched)")
        return HFTokenizer(self.tokenizer_path)

    def reward_specs(self) -> list[dict[str, Any]]:
        if self.format not in FORMATS:
            raise ValueError(f"task {self.name!r} takes its rewards from the rows' format, which is not known yet "
                             f"(format={self.format!r}): load the data first (grpo_jax.tasks.bind_format) or set "
                             "rewards.specs")
        return reward_specs(self.format, self.format_weight)
