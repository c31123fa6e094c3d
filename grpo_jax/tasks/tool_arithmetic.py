"""Arithmetic where a Python tool pays: prompt "123*456=", answer "56088", and the policy may write
`<python>print(123*456)</python>` to have the host compute it (grpo_jax/tools.py).

The problems, splits and rows are `ArithmeticTask`'s (by composition: same prompts, same "answer" field), with
multiplication as the default operation: 3-digit products are what a small model rarely gets right in its head
(docs/measurements.md), so a call that is always right is worth learning.

Two solution paths, so the supervised warm start (`sft._target` picks one per draw) shows the call format on
about half of its draws and the plain answer on the others:
- tool:    `<think>mul</think><python>print(123*456)</python><output>\\n56088\\n</output>\\n<answer>56088</answer>`,
  the output text exactly what `tools.format_output` makes of the printed product, as the sampler appends it;
- in-head: `<think>mul</think><answer>56088</answer>` (`ArithmeticTask.solution`).
The code writes the operands without the prompt's zero padding: `print(123*045)` is a SyntaxError in Python 3
(a leading zero in a decimal literal), so "123*045=" is called as `print(123*45)`.

The rewards read the policy's own text only (the tool's outputs removed by the rollout), so a program that prints
"<answer>...</answer>" cannot answer for the policy: the math reward reads the `<answer>` block, and the format
reward is told that calls between the thinking and the answer are well-formed (`tool_call`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from grpo_jax.config import ToolConfig
from grpo_jax.tasks.arithmetic import OPS, ArithmeticTask
from grpo_jax.tasks.base import ANSWER_CLOSE, ANSWER_OPEN, THINK_CLOSE, THINK_OPEN, Row
from grpo_jax.tokenizer import TAGS, TOOL_ALPHABET, TOOL_TAGS, CharTokenizer, Tokenizer

_PROMPT_RE = re.compile(r"(\d+)([-+*])(\d+)=")


def call_code(prompt: str) -> str:
    """The tool call's code for an arithmetic prompt: "045*120=" -> "print(45*120)" (operands without leading
    zeros, which Python 3 rejects in decimal literals). A prompt of another shape is an error naming the field."""
    m = _PROMPT_RE.fullmatch(prompt) if isinstance(prompt, str) else None
    if m is None:
        raise ValueError(f"row field 'prompt' must look like '123*456=', got {prompt!r:.60}")
    a, op, b = m.groups()
    return f"print({int(a)}{op}{int(b)})"


@dataclass(frozen=True)
class ToolArithmeticTask:
    """`ArithmeticTask`'s problems (default 3-digit "*") with a tool-call solution beside the in-head one."""

    digits: int = 3
    op: str = "*"
    name: str = "tool_arithmetic"
    required_fields: tuple[str, ...] = ("prompt", "answer")

    def __post_init__(self) -> None:
        ArithmeticTask(digits=self.digits, op=self.op)  # a bad digits or op is an error naming it, now

    @property
    def base(self) -> ArithmeticTask:
        """The arithmetic task generating the rows (under this task's name)."""
        return ArithmeticTask(digits=self.digits, op=self.op, name=self.name)

    def generate(self, split: str, n: int, seed: int) -> list[Row]:
        """n distinct problems of `split`: exactly `ArithmeticTask`'s rows for the same digits, op and seed."""
        return self.base.generate(split, n, seed)

    def solutions(self, row: Row) -> list[str]:
        """[the tool solution, the in-head solution]: the warm start supervises one of them per draw."""
        return [self.tool_solution(row), self.solution(row)]

    def solution(self, row: Row) -> str:
        """The in-head completion (no call), as `ArithmeticTask` writes it."""
        return self.base.solution(row)

    def tool_solution(self, row: Row) -> str:
        """Think, call the tool on the prompt's operands, read its output, answer: the full conversation text
        (the policy's tokens and the output the host appends, `tools.format_output` of what the code prints)."""
        cfg = ToolConfig()
        thought = OPS[row.get("op", self.op)][0]
        answer = str(row["answer"])  # what the call prints: the product, one line
        call = f"{cfg.call_open}{call_code(row['prompt'])}{cfg.call_close}"
        # tools.format_output(answer, cfg), written out: tasks and tools share a floor of docs/architecture.md, so
        # neither imports the other (tests/test_tool_task.py checks the two texts, and a real run's, are one)
        output = f"{cfg.output_open}\n{answer}\n{cfg.output_close}\n"
        return f"{THINK_OPEN}{thought}{THINK_CLOSE}{call}{output}{ANSWER_OPEN}{answer}{ANSWER_CLOSE}"

    def tokenizer(self) -> Tokenizer:
        """Characters with atomic think/answer tags and tool markers, and the characters tool output may hold."""
        return CharTokenizer(TOOL_ALPHABET, TAGS + TOOL_TAGS)

    def reward_specs(self) -> list[dict[str, Any]]:
        """`ArithmeticTask`'s weights (correct + 0.1 x format); the format reward accepts calls before the answer."""
        cfg = ToolConfig()
        return [
            {"name": "math", "weight": 1.0, "kwargs": {}},
            {"name": "format", "weight": 0.1,
             "kwargs": {"require_answer_tag": True, "tool_call": [cfg.call_open, cfg.call_close]}},
        ]
