"""Synthetic verifiable tasks that ship with the code, by name.

    task = get_task("arithmetic", digits=3)
    train = task.generate("train", 10_000, seed=0)
    heldout = task.generate("heldout", 500, seed=0)   # never overlaps train, for any seed or size
    target = task.solution(train[0])                  # ideal completion text, for the supervised warm start
    specs = [RewardSpec(**d) for d in task.reward_specs()]
"""

from __future__ import annotations

import dataclasses
from types import MappingProxyType
from typing import Any, Mapping

from grpo_jax.tasks.arithmetic import ArithmeticTask
from grpo_jax.tasks.base import SPLITS, Row, Task, split_of
from grpo_jax.tasks.jsonl_math import JsonlMathTask
from grpo_jax.tasks.translation import TranslationTask

TASKS: Mapping[str, Task] = MappingProxyType(
    {"arithmetic": ArithmeticTask(), "translation": TranslationTask(), "jsonl_math": JsonlMathTask()}
)


SYNTHETIC = ("arithmetic", "translation")  # tasks that generate their own rows (jsonl_math reads files)


def get_task(name: str, **options: Any) -> Task:
    """The registered task `name`, with its dataclass fields (e.g. digits, op) overridden by `options`."""
    if name not in TASKS:
        raise ValueError(f"unknown task {name!r}; known tasks: {', '.join(sorted(TASKS))}")
    fields = {f.name for f in dataclasses.fields(TASKS[name])} - {"name", "required_fields"}  # type: ignore[arg-type]
    unknown = set(options) - fields
    if unknown:
        raise ValueError(f"task {name!r} got unknown options {sorted(unknown)}; accepted: {sorted(fields)}")
    return dataclasses.replace(TASKS[name], **options)  # type: ignore[type-var]


__all__ = ["SPLITS", "SYNTHETIC", "TASKS", "ArithmeticTask", "JsonlMathTask", "Row", "Task", "TranslationTask", "get_task", "split_of"]
