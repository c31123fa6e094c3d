"""Verifiable tasks by name: synthetic ones that ship with the code, and `jsonl` for your own files.

    task = get_task("arithmetic", digits=3)
    train = task.generate("train", 10_000, seed=0)
    heldout = task.generate("heldout", 500, seed=0)   # never overlaps train, for any seed or size
    target = task.solution(train[0])                  # ideal completion text, for the supervised warm start
    specs = [RewardSpec(**d) for d in task.reward_specs()]

File tasks (`jsonl`, `jsonl_math`) read rows of the formats in `adapters.FORMATS` and score them by the
format's reward family; `bind_format(task, fmt)` gives them the format their data was read in. The
synthetic tasks read only native rows (prompt/messages plus their fields) from files.
"""

from __future__ import annotations

import dataclasses
from types import MappingProxyType
from typing import Any, Mapping

from grpo_jax.tasks.adapters import FORMATS, NATIVE
from grpo_jax.tasks.arithmetic import ArithmeticTask
from grpo_jax.tasks.base import SPLITS, Row, Task, split_of
from grpo_jax.tasks.countdown import CountdownTask
from grpo_jax.tasks.jsonl import JsonlTask
from grpo_jax.tasks.jsonl_math import JsonlMathTask
from grpo_jax.tasks.translation import TranslationTask

TASKS: Mapping[str, Task] = MappingProxyType(
    {"arithmetic": ArithmeticTask(), "translation": TranslationTask(), "countdown": CountdownTask(),
     "jsonl": JsonlTask(), "jsonl_math": JsonlMathTask()}
)


SYNTHETIC = ("arithmetic", "translation", "countdown")  # tasks generating their own rows (jsonl, jsonl_math read files)
NOT_OPTIONS = frozenset({"name", "required_fields", "format"})  # fields task.options may not set (format: task.format)


def get_task(name: str, **options: Any) -> Task:
    """The registered task `name`, with its dataclass fields (e.g. digits, op) overridden by `options`."""
    if name not in TASKS:
        raise ValueError(f"unknown task {name!r}; known tasks: {', '.join(sorted(TASKS))}")
    fields = {f.name for f in dataclasses.fields(TASKS[name])} - NOT_OPTIONS  # type: ignore[arg-type]
    unknown = set(options) - fields
    if unknown:
        raise ValueError(f"task {name!r} got unknown options {sorted(unknown)}; accepted: {sorted(fields)}")
    return dataclasses.replace(TASKS[name], **options)  # type: ignore[type-var]


def row_formats(task: Task) -> tuple[str, ...]:
    """The row formats `task` reads from files: a file task's (those of its reward families), else native rows."""
    return task.formats if isinstance(task, JsonlTask) else (NATIVE,)


def bind_format(task: Task, fmt: str) -> Task:
    """`task` scoring rows of format `fmt`: a file task takes that format's rewards; any other task (whose
    rows are native or generated) is returned as it is."""
    if not isinstance(task, JsonlTask):
        return task
    if fmt not in task.formats:
        raise ValueError(f"task {task.name!r} reads rows of the formats {', '.join(task.formats)}, not {fmt!r}"
                         + ("; use task.name=jsonl" if fmt in FORMATS else ""))
    return dataclasses.replace(task, format=fmt)


__all__ = ["FORMATS", "SPLITS", "SYNTHETIC", "TASKS", "ArithmeticTask", "CountdownTask", "JsonlMathTask", "JsonlTask",
           "Row", "Task", "TranslationTask", "bind_format", "get_task", "row_formats", "split_of"]
