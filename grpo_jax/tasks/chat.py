"""Conversational prompts: which rows are rendered with the tokenizer's chat template, and as what turns.

A row may carry `messages` ([{"role": "system"|"user"|..., "content": str}, ...], as TRL's conversational
prompts) instead of a `prompt` string. Such a row is rendered with the tokenizer's chat template and the
assistant's turn opened (`add_generation_prompt=True`), and the rendered text becomes its `prompt`: the
sampler, the warm start and the logs all read `prompt`, and never need to know about chats.

`task.chat` decides which rows are rendered (`task.system_prompt` is the system turn):

    auto    `messages` rows; plain `prompt` rows only when task.system_prompt is set (a system prompt
            needs a chat to sit in: the prompt becomes the user's turn after it)
    always  every row; a plain prompt becomes the user's turn (an instruct model on GSM8K-style rows)
    never   no row: prompts are used as written, and a `messages` row is an error

The system prompt is prepended only to a conversation that has no system turn of its own: a row's own
system turn wins. A conversation must end with a turn the assistant answers (not with an assistant turn:
that is usually a supervised row whose answer belongs in `answer`).

A thinking template (Qwen3's) ends the rendered prompt with an opened `<think>`: the completion starts
inside the thinking and never writes the opening tag. `render` marks such a row `think_prefilled: true`,
so the rewards judge "<think>" + completion (rewards.format.assistant_turn) instead of failing every
completion for a tag the prompt already wrote.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from grpo_jax.config import CHAT_MODES
from grpo_jax.rewards.format import THINK_PREFILLED
from grpo_jax.tasks.base import THINK_OPEN

Row = dict[str, Any]
Turn = dict[str, str]


def check_messages(messages: Any) -> str | None:
    """The problem with a `messages` value, or None: a non-empty list of {"role", "content"} strings
    that does not end with the assistant's turn."""
    if not isinstance(messages, list) or not messages:
        return "field 'messages' must be a non-empty list of {\"role\", \"content\"} objects"
    for i, turn in enumerate(messages):
        if not isinstance(turn, Mapping):
            return f"messages[{i}] must be an object with 'role' and 'content', got {type(turn).__name__}"
        for key in ("role", "content"):
            if not isinstance(turn.get(key), str):
                got = type(turn[key]).__name__ if key in turn else "nothing"
                return f"messages[{i}].{key} must be a string, got {got}"
        if not turn["role"]:
            return f"messages[{i}].role is empty"
    if messages[-1]["role"] == "assistant":
        return ("messages ends with an assistant turn: a GRPO prompt ends where the assistant starts (put the "
                "reference answer in 'answer', not in the conversation)")
    return None


def conversation(row: Mapping[str, Any], *, system_prompt: str = "", mode: str = "auto") -> list[Turn] | None:
    """The turns `row` is rendered from, or None when its `prompt` is used as written (see module doc)."""
    if mode not in CHAT_MODES:
        raise ValueError(f"chat mode must be one of {CHAT_MODES}, got {mode!r}")
    if "messages" in row:
        if mode == "never":
            raise ValueError("the row has 'messages' but task.chat=never renders no chat template")
        turns = [{"role": t["role"], "content": t["content"]} for t in row["messages"]]
    elif mode == "always" or (mode == "auto" and system_prompt):
        turns = [{"role": "user", "content": row["prompt"]}]
    else:
        return None
    if system_prompt and turns[0]["role"] != "system":
        turns.insert(0, {"role": "system", "content": system_prompt})
    return turns


def opens_think(prompt: str) -> bool:
    """Whether a rendered prompt ends with an opened think block (`<think>` then only whitespace), as a
    thinking template's assistant turn does."""
    return prompt.rstrip().endswith(THINK_OPEN)


def render(row: Row, turns: Sequence[Turn], tokenizer: Any) -> Row:
    """The row with its conversation under `messages` and the rendered chat (assistant turn open) as `prompt`;
    `think_prefilled: true` when the rendered prompt opened the think block (`opens_think`). A row's own
    `think_prefilled` is kept when the template does not open one."""
    prompt = tokenizer.render_chat(turns)
    out = {**row, "messages": [dict(t) for t in turns], "prompt": prompt}
    if opens_think(prompt):
        out[THINK_PREFILLED] = True
    return out
