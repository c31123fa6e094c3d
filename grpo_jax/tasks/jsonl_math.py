"""Maths from your own JSONL files with a Hugging Face tokenizer: rows {"prompt", "answer"[, "solution"]}.

The rows come from `task.train_path` / `task.eval_path` (validated line by line by grpo_jax.data); this
task supplies the tokenizer (a local HF folder, usually the checkpoint's own) and the rewards: the math
reward on the answer segment plus a small format reward. Prompts are used as written: apply a chat
template when you build the file if the model expects one.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from grpo_jax.tasks.base import Row
from grpo_jax.tokenizer import HFTokenizer, Tokenizer


@dataclass(frozen=True)
class JsonlMathTask:
    tokenizer_path: str = ""  # local HF tokenizer folder (the checkpoint folder works)
    format_weight: float = 0.1  # weight of the think/answer format reward next to correctness (1.0)
    name: str = "jsonl_math"
    required_fields: tuple[str, ...] = ("prompt", "answer")

    def generate(self, split: str, n: int, seed: int) -> list[Row]:
        fix = {"train": "set task.train_path to a JSONL file of them",
               "heldout": "set task.eval_path to a JSONL file of them (or task.n_eval=0 to evaluate nothing)"}
        raise ValueError(f"task 'jsonl_math' generates no rows, and the {split!r} split was asked for "
                         f"({n} rows): " + fix.get(split, "this launcher needs a task that generates rows "
                                                        "(e.g. arithmetic), or rows read from files")
                         + ' ({"prompt", "answer"} rows)')

    def solution(self, row: Row) -> str:
        if "solution" not in row:
            raise KeyError("row has no 'solution' field: the supervised warm start needs worked solutions")
        return row["solution"]

    def tokenizer(self) -> Tokenizer:
        if not self.tokenizer_path:
            raise ValueError("task.options must give tokenizer_path (a local HF tokenizer or checkpoint folder)")
        return HFTokenizer(self.tokenizer_path)

    def reward_specs(self) -> list[dict[str, Any]]:
        return [{"name": "math", "weight": 1.0, "kwargs": {}},
                {"name": "format", "weight": self.format_weight, "kwargs": {}}]
