"""Format reward: the response is `<think>…</think>` then the answer (optionally `<answer>…</answer>`).

Also `split_response`, the one place that decides which text is "the answer": every content reward
(math, science, code, translation) reads only the answer segment, so an answer that appears only inside
the thinking does not count, and structure is judged separately by `format_reward` as its own reward
dimension (so a content reward never silently mixes in a format bonus).

A thinking chat template (Qwen3's) ends the rendered prompt with `<think>\n`: the model's completion then
starts inside the thinking and never contains the opening tag. The data pipeline marks such a row with
`THINK_PREFILLED` (a bool field); `assistant_turn` puts the prompt's opening tag back in front of the
completion, so every reward judges the same text, the whole assistant turn. A row without the field is
scored on the completion as written: a model that omits `<think>` on its own still fails the format.

A policy with a Python tool (grpo_jax/tools.py) writes `<python>code</python>` before answering; its rewards
read its own text, the tool's outputs removed, and `format_reward(tool_call=("<python>", "</python>"))` accepts
such calls between the thinking and the answer (without the option they are text before the answer, as ever).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

from grpo_jax.rewards.base import RewardInputError, RewardResult, reward

FORMAT_VERSION = "2"  # 2: a row with think_prefilled=True is scored as "<think>" + completion
THINK_PREFILLED = "think_prefilled"  # row field: the rendered prompt ends with an opened think tag


class ResponseParts(NamedTuple):
    """(thinking, answer) text of a response; see `split_response` for the lenient rules."""

    thinking: str
    answer: str


def _tags(tag: str) -> tuple[str, str]:
    if not tag or not re.fullmatch(r"[A-Za-z_][\w.-]*", tag):
        raise RewardInputError(f"tag name must be an identifier-like string, got {tag!r}")
    return f"<{tag}>", f"</{tag}>"


def think_prefilled(sample: Mapping[str, Any]) -> bool:
    """Whether the row's prompt opened the think block (`sample[THINK_PREFILLED]`; absent: False).

    Anything but a bool is a data error naming the field: a string "false" read as true would silently
    change what every reward scores."""
    value = sample.get(THINK_PREFILLED, False) if isinstance(sample, Mapping) else False
    if not isinstance(value, bool):
        raise RewardInputError(f"sample field {THINK_PREFILLED!r} must be true or false, got {value!r:.40}")
    return value


def assistant_turn(response: str, sample: Mapping[str, Any], *, think_tag: str = "think") -> str:
    """The whole assistant turn of a completion: `<think_tag>` + response when the row's prompt opened the
    think block (`think_prefilled`), else the response as it is. Rewards read this text, so a completion
    under a thinking template is judged exactly as the same turn written in full by a model without one."""
    return _tags(think_tag)[0] + response if think_prefilled(sample) else response


def split_response(response: str, *, think_tag: str = "think", answer_tag: str = "answer") -> ResponseParts:
    """Split a response into (thinking, answer), leniently, for the content rewards.

    - With a closing think tag, the answer is the text after the *last* `</think>`: anything before it
      was written as (or inside) thinking, so it cannot be committed as the answer.
    - With an opening think tag but no close, the whole response is unfinished thinking: answer "".
    - With no think tags at all, the whole response is the answer (models without a think template).
    - If the answer region contains answer tags, the answer is the content of all answer blocks (joined
      by newlines, an unclosed last block runs to the end); text outside the blocks is ignored here
      and penalised by `format_reward`.
    """
    think_open, think_close = _tags(think_tag)
    answer_open, answer_close = _tags(answer_tag)
    close_at = response.rfind(think_close)
    if close_at >= 0:
        first_close = response.find(think_close)
        open_at = response.find(think_open, 0, first_close)
        start = open_at + len(think_open) if open_at >= 0 else 0
        thinking = response[start:first_close].strip()
        region = response[close_at + len(think_close) :]
    elif think_open in response:
        return ResponseParts(response.split(think_open, 1)[1].strip(), "")
    else:
        thinking, region = "", response
    if answer_open not in region:
        return ResponseParts(thinking, region.replace(answer_close, "").strip())
    blocks = []
    for chunk in region.split(answer_open)[1:]:
        blocks.append(chunk.split(answer_close, 1)[0].strip())
    return ResponseParts(thinking, "\n".join(b for b in blocks if b))


# What each character (and so each token) of a response is, by the segments `split_response` reads.
SEGMENT_KINDS = ("other", "reasoning", "answer")  # codes 0, 1, 2: tags, text outside both segments, EOS: other
_OTHER, _REASONING, _ANSWER = 0, 1, 2


def segment_kinds(
    response: str, *, think_tag: str = "think", answer_tag: str = "answer", think_prefilled: bool = False
) -> bytearray:
    """Per character of `response`, its `SEGMENT_KINDS` code: 1 inside the thinking, 2 inside the answer,
    0 for the tags and any other text. The segments are exactly those `split_response` reads (the first
    think block, or all of an unclosed one; the answer blocks after the last `</think>`, or that whole
    region when it has no answer tag), so the entropy of "reasoning" tokens is that of the text a content
    reward treats as thinking. With `think_prefilled` (the prompt opened the think block) the segments are
    those of the whole assistant turn (`assistant_turn`), reported for the response's own characters."""
    if think_prefilled:
        opened = _tags(think_tag)[0]
        return segment_kinds(opened + response, think_tag=think_tag, answer_tag=answer_tag)[len(opened) :]
    think_open, think_close = _tags(think_tag)
    answer_open, answer_close = _tags(answer_tag)
    kinds = bytearray(len(response))

    def mark(start: int, end: int, code: int) -> None:
        kinds[start:end] = bytes([code]) * max(0, end - start)

    close_at = response.rfind(think_close)
    if close_at < 0 and think_open in response:
        mark(response.find(think_open) + len(think_open), len(response), _REASONING)
        return kinds
    region = 0
    if close_at >= 0:
        first_close = response.find(think_close)
        open_at = response.find(think_open, 0, first_close)
        mark(open_at + len(think_open) if open_at >= 0 else 0, first_close, _REASONING)
        region = close_at + len(think_close)
    if answer_open not in response[region:]:
        mark(region, len(response), _ANSWER)
        for at in _find_all(response, answer_close, region):  # a stray closing tag is not answer text
            mark(at, at + len(answer_close), _OTHER)
        return kinds
    for at in _find_all(response, answer_open, region):
        start = at + len(answer_open)
        ends = [e for e in (response.find(answer_close, start), response.find(answer_open, start)) if e >= 0]
        mark(start, min(ends, default=len(response)), _ANSWER)
    return kinds


def _find_all(text: str, sub: str, start: int) -> list[int]:
    out, at = [], text.find(sub, start)
    while at >= 0:
        out.append(at)
        at = text.find(sub, at + len(sub))
    return out


def tool_markers(tool_call: Sequence[str] | None) -> tuple[str, str] | None:
    """The (open, close) markers of a tool call from the `tool_call` keyword, or None (calls not allowed)."""
    if tool_call is None:
        return None
    if (isinstance(tool_call, str) or not isinstance(tool_call, Sequence) or len(tool_call) != 2
            or not all(isinstance(m, str) and m.strip() for m in tool_call) or tool_call[0] == tool_call[1]):
        raise RewardInputError(f"tool_call must be two distinct non-empty marker strings (open, close), "
                               f"got {tool_call!r:.80}")
    return tool_call[0], tool_call[1]


def _after_calls(rest: str, call_open: str, call_close: str) -> tuple[str, str]:
    """(the text after the calls that open `rest`, 'ok' or the violated rule). Each call is `call_open`, non-empty
    code, `call_close`, with only whitespace between calls; a marker anywhere else (a call after the answer, a
    close without an open) is out of order, and a call the text never closes is unclosed."""
    text = rest.lstrip()
    while text.startswith(call_open):
        code, closed, text = text[len(call_open):].partition(call_close)
        if not closed or call_open in code:
            return text, "tool_call_unclosed"
        if not code.strip():
            return text, "tool_call_empty"
        text = text.lstrip()
    if call_open in text or call_close in text:
        return text, "tool_call_order"
    return text, "ok"


def check_format(
    response: str, *, think_tag: str = "think", answer_tag: str = "answer", require_answer_tag: bool = False,
    tool_call: Sequence[str] | None = None,
) -> str:
    """'ok' if the response has the strict structure, else the first violated rule (a short reason).

    `tool_call` (open, close markers): tool calls may stand between the thinking and the answer, as the policy
    writes them in a rollout with a tool (the tool's outputs removed: the reward reads the policy's own text
    only). None: any marker text is ordinary text (outside the answer block: `text_before_answer`)."""
    markers = tool_markers(tool_call)
    think_open, think_close = _tags(think_tag)
    answer_open, answer_close = _tags(answer_tag)
    counts = {t: response.count(t) for t in (think_open, think_close, answer_open, answer_close)}
    for tag, n in counts.items():
        if n > 1:
            return f"repeated_tag:{tag}"
    if counts[think_open] == 0:
        return f"missing_tag:{think_open}"
    if counts[think_close] == 0:
        return f"missing_tag:{think_close}"
    if response[: response.index(think_open)].strip():
        return "text_before_think"
    after_open = response.split(think_open, 1)[1]
    if think_close not in after_open:
        return "tag_order"
    thinking, _, rest = after_open.partition(think_close)
    if answer_open in thinking or answer_close in thinking:
        return "tag_order"
    if not thinking.strip():
        return "empty_thinking"
    if markers is not None:
        if any(m in thinking for m in markers):
            return "tool_call_order"
        rest, reason = _after_calls(rest, *markers)
        if reason != "ok":
            return reason
    return _check_answer_region(rest, answer_open, answer_close, require_answer_tag)


def _check_answer_region(rest: str, answer_open: str, answer_close: str, require_answer_tag: bool) -> str:
    has_open, has_close = answer_open in rest, answer_close in rest
    if not has_open and not has_close:
        if require_answer_tag:
            return f"missing_tag:{answer_open}"
        return "ok" if rest.strip() else "empty_answer"
    if has_open != has_close:
        return f"missing_tag:{answer_close if has_open else answer_open}"
    before, _, after_open = rest.partition(answer_open)
    if answer_close in before:
        return "tag_order"
    content, _, after = after_open.partition(answer_close)
    if before.strip():
        return "text_before_answer"
    if after.strip():
        return "text_after_answer"
    return "ok" if content.strip() else "empty_answer"


@reward("format", FORMAT_VERSION)
def format_reward(
    response: str,
    sample: Mapping[str, Any],
    *,
    think_tag: str = "think",
    answer_tag: str = "answer",
    require_answer_tag: bool = False,
    tool_call: Sequence[str] | None = None,
) -> RewardResult:
    """1 if the response is exactly `<think>T</think>A` (or `…</think><answer>A</answer>`), else 0.

    Each tag at most once and in order, T and A non-empty after stripping, and only whitespace outside
    (before `<think>`, around the answer block). The text judged is `assistant_turn`: when the sample says
    the prompt opened `<think>` (`think_prefilled`), "T</think>A" is the full structure; otherwise the
    sample is not read. With `tool_call` = (open, close), e.g. ("<python>", "</python>"), complete non-empty
    calls may also stand between `</think>` and the answer (`check_format`); the default None scores as before.
    """
    turn = assistant_turn(response, sample, think_tag=think_tag)
    reason = check_format(turn, think_tag=think_tag, answer_tag=answer_tag, require_answer_tag=require_answer_tag,
                          tool_call=tool_call)
    return RewardResult(1.0 if reason == "ok" else 0.0, {"reason": reason})
