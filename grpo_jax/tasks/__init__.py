"""Verifiable tasks by name: synthetic ones that ship with the code, and `jsonl` for your own files.

    task = get_task("arithmetic", digits=3)
    train = task.generate("train", 10_000, seed=0)
    heldout = task.generate("heldout", 500, seed=0)   # never overlaps train, for any seed or size
    target = task.solution(train[0])                  # ideal completion text, for the supervised warm start
    specs = [RewardSpec(**d) for d in task.reward_specs()]

File tasks (`jsonl`, `jsonl_math`) read rows of the formats in `adapters.FORMATS` and score them by the
format's reward family; `bind_format(task, fmt)` gives them the format their data was read in. The
synthetic tasks read only native rows (prompt/messages plus their fields) from files.

A task of your own is named by import path, `task.name=my_tasks:MyTask`: a Task object (its dataclass
fields set by task.options, as for the shipped tasks), or a class or factory called with task.options as
keyword arguments that returns one.
"""

from __future__ import annotations

import dataclasses
from types import MappingProxyType
from typing import Any, Mapping

from grpo_jax import importpath
from grpo_jax.tasks.adapters import FORMATS, NATIVE
from grpo_jax.tasks.arithmetic import ArithmeticTask
from grpo_jax.tasks.base import SPLITS, Row, Task, split_of
from grpo_jax.tasks.countdown import CountdownTask
from grpo_jax.tasks.jsonl import JsonlTask
from grpo_jax.tasks.jsonl_math import JsonlMathTask
from grpo_jax.tasks.tool_arithmetic import ToolArithmeticTask
from grpo_jax.tasks.translation import TranslationTask

TASKS: Mapping[str, Task] = MappingProxyType(
    {"arithmetic": ArithmeticTask(), "translation": TranslationTask(), "countdown": CountdownTask(),
     "tool_arithmetic": ToolArithmeticTask(), "jsonl": JsonlTask(), "jsonl_math": JsonlMathTask()}
)


SYNTHETIC = ("arithmetic", "translation", "countdown")  # tasks generating their own rows (jsonl, jsonl_math read files)
NOT_OPTIONS = frozenset({"name", "required_fields", "format"})  # fields task.options may not set (format: task.format)


TASK_METHODS = ("generate", "solution", "solutions", "tokenizer", "reward_specs")  # what a Task must have


def get_task(name: str, **options: Any) -> Task:
    """The registered task `name`, with its dataclass fields (e.g. digits, op) overridden by `options`;
    or the task at the import path `name` (`package.module:attribute`, see the module docstring)."""
    if importpath.is_import_path(name):
        return _imported_task(name, options)
    if name not in TASKS:
        raise ValueError(f"unknown task {name!r}; known tasks: {', '.join(sorted(TASKS))}, or your own as "
                         "package.module:TaskClass")
    return _with_options(name, TASKS[name], options)


def _with_options(name: str, task: Task, options: dict[str, Any]) -> Task:
    """A Task dataclass with the fields `options` names replaced; an unknown option is an error naming it."""
    fields = {f.name for f in dataclasses.fields(task)} - NOT_OPTIONS  # type: ignore[arg-type]
    unknown = set(options) - fields
    if unknown:
        raise ValueError(f"task {name!r} got unknown options {sorted(unknown)}; accepted: {sorted(fields)}")
    return dataclasses.replace(task, **options)  # type: ignore[type-var]


def _imported_task(path: str, options: dict[str, Any]) -> Task:
    """The task at an import path: a Task dataclass object takes `options` as its fields; a class or factory
    is called with them. What comes back must have a Task's methods and a name (errors name the path)."""
    obj = importpath.load(path)
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        task = _with_options(path, obj, options)  # type: ignore[arg-type]
    elif callable(obj):
        try:
            task = obj(**options)
        except TypeError as e:
            raise ValueError(f"task {path!r} cannot take task.options {sorted(options)}: {e}") from None
    else:
        raise ValueError(f"task {path!r} is a {type(obj).__name__}, not a task, a task class or a factory")
    missing = [m for m in TASK_METHODS if not callable(getattr(task, m, None))]
    missing += [] if isinstance(getattr(task, "name", None), str) else ["name (a string)"]
    missing += [] if isinstance(getattr(task, "required_fields", None), (tuple, list)) else ["required_fields"]
    if missing:
        raise ValueError(f"task {path!r} gave a {type(task).__name__} without a Task's {', '.join(missing)} "
                         "(grpo_jax.tasks.base.Task lists what a task needs)")
    return task


def row_formats(task: Task) -> tuple[str, ...]:
    """The row formats `task` reads from files: a file task's (those of its reward families), else native rows."""
    return task.formats if isinstance(task, JsonlTask) else (NATIVE,)


def generates_rows(task: Task) -> bool:
    """Whether `task` generates its own rows (train and held-out splits); a file task reads them from files,
    so a run without task.eval_path holds out a slice of its training file instead (data.hold_out)."""
    return not isinstance(task, JsonlTask)


def row_options(task: Task) -> dict[str, Any]:
    """The task options the row formats read (`adapters.RowFormat.options`, e.g. wmt's source_lang and
    target_lang), to pass to `adapters.adapt_row`: a file task's fields of those names; {} for other tasks."""
    if not isinstance(task, JsonlTask):
        return {}
    names = {name for fmt in FORMATS.values() for name in fmt.options}
    return {name: getattr(task, name) for name in sorted(names) if hasattr(task, name)}


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
           "Row", "Task", "ToolArithmeticTask", "TranslationTask", "bind_format", "generates_rows", "get_task",
           "row_formats", "row_options", "split_of"]
