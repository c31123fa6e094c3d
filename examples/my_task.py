"""A task of your own, used without editing grpo_jax: `--set task.name=my_task:subtraction` (with this folder
on PYTHONPATH). The name may point at a Task object, a Task class or, as here, a factory; task.options are
passed to it as keyword arguments (`--set task.options.digits=2`). A Task (grpo_jax.tasks.base.Task) has a
name, required_fields, generate, solution, solutions, tokenizer and reward_specs.
"""

from __future__ import annotations

from grpo_jax.tasks import ArithmeticTask


def subtraction(digits: int = 3) -> ArithmeticTask:
    """`digits`-digit subtraction (larger operand first), scored by the arithmetic task's rewards."""
    return ArithmeticTask(digits=digits, op="-", name="subtraction")
