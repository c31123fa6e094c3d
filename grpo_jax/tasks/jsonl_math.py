"""Maths from your own JSONL files with a Hugging Face tokenizer: the `jsonl` task restricted to maths rows
(native {"prompt"|"messages", "answer"[, "solution"]}, GSM8K or MATH), scored by the math reward plus a
small format reward. Kept as its own name for the runs and scripts that use it; see `tasks/jsonl.py`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from grpo_jax.tasks.adapters import NATIVE
from grpo_jax.tasks.jsonl import JsonlTask


@dataclass(frozen=True)
class JsonlMathTask(JsonlTask):
    format: str = NATIVE  # any maths format has the same rewards, so they are known before the data is read
    name: str = "jsonl_math"
    families: ClassVar[tuple[str, ...]] = ("math",)
