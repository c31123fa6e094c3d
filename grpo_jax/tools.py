"""A Python tool the policy calls mid-answer, on the host: finding a call in the decoded text, running it in
a fresh sandbox, the text appended for the model to read, per-row statistics and their step metrics, and a
host-side multi-turn loop (`run_turns`) driven by any text generator.

A call is the code between `ToolConfig.call_open` and `call_close` (default `<python>` ... `</python>`). Its
result is appended as `<output>\\n...\\n</output>\\n`: what the code printed (its first `max_output_chars`
characters, then a note of how much was cut) and, when it failed, one line the model can read (the
exception's last traceback line and the line of the code it came from, or which limit stopped it).

Each call runs as one script-mode `rewards.sandbox.run_program` (a fresh interpreter in its own temporary
directory, removed afterwards, with the tool's limits and empty stdin; docs/sandbox.md), so the variables,
imports and working-directory files of one call are gone at the next, no network is reachable (writes
outside the working directory are refused where the machine has Landlock: docs/sandbox.md says what
remains without it), and the calls of several rows run at once through a `SandboxPool`.

The jitted sampler's multi-turn decode (`grpo_jax.multiturn`) uses these pieces on tokens; `run_turns` is the
same loop on texts, for any text generator.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Sequence

from grpo_jax.config import AlarmRule, MonitorConfig, ToolConfig
from grpo_jax.rewards.sandbox import Limits, SandboxPool, SandboxResult, run_program

TIMEOUT_STATUSES = ("timeout", "cpu_limit")  # sandbox statuses counted as a call that ran out of time
# The alarms a run with the tool adds to its rules (`monitor_config`): a policy that stopped calling the tool,
# and one whose calls (nearly) all fail. Both collapses pause (monitor.collapse_action=warn makes them warnings).
TOOL_ALARM_RULES = (
    AlarmRule("tool/call_rate", "below", 0.01, action="pause", patience=10, name="tool_never_called"),
    AlarmRule("tool/error_rate", "above", 0.9, action="pause", patience=10, name="tool_always_errors"),
)


def monitor_config(monitor: MonitorConfig, tool: ToolConfig) -> MonitorConfig:
    """The run's alarm rules: `monitor`'s, plus TOOL_ALARM_RULES when the tool is on (a rule of the same name
    already there is kept as the user set it)."""
    if not tool.enabled:
        return monitor
    names = {r.name for r in monitor.rules}
    return dataclasses.replace(monitor, rules=monitor.rules + tuple(r for r in TOOL_ALARM_RULES if r.name not in names))


# ------------------------------------------------------------------------------------ finding a call


@dataclasses.dataclass(frozen=True)
class ToolCall:
    """One complete call in a text: its code and the span [start, end) from the open marker to past the close."""

    code: str
    start: int
    end: int


def _ends_in_string(code: str) -> bool:
    """Whether Python code ends inside an unterminated string literal, so a close marker right after it
    is part of the string (`print("</python>")`), not the end of the call."""
    try:
        compile(code, "<tool>", "exec")
    except SyntaxError as e:
        msg = (e.msg or "").lower()
        return "string literal" in msg and ("unterminated" in msg or "scanning" in msg)
    except (ValueError, RecursionError, MemoryError, OverflowError):  # a NUL byte, absurd nesting: not a string
        return False
    return False


def find_call(text: str, cfg: ToolConfig, start: int = 0) -> ToolCall | None:
    """The first complete call in text[start:], or None (no call, or one still open: keep decoding).

    The call opens at the first `call_open`; it closes at the first `call_close` after it where the code
    does not end inside a string literal. Markers inside the code (in strings or comments) are code."""
    opened = text.find(cfg.call_open, start)
    if opened < 0:
        return None
    body = opened + len(cfg.call_open)
    at = body
    while (at := text.find(cfg.call_close, at)) >= 0:
        if not _ends_in_string(text[body:at]):
            return ToolCall(text[body:at], opened, at + len(cfg.call_close))
        at += 1
    return None


def call_at_end(text: str, cfg: ToolConfig, start: int = 0) -> str | None:
    """The code of the call that ends the text (trailing whitespace allowed), or None. `start` is where the
    unanswered text begins (past the last output the host appended), so printed markers are never read."""
    call = find_call(text, cfg, start)
    while call is not None:
        if not text[call.end:].strip():
            return call.code
        call = find_call(text, cfg, call.end)
    return None


# ------------------------------------------------------------------------------------ running and formatting


@dataclasses.dataclass(frozen=True)
class ToolResult:
    """One call's outcome: the text to append and what the statistics count."""

    text: str  # `<output>\n...\n</output>\n`, ready to append
    status: str  # the sandbox's status (ok, error, timeout, cpu_limit, memory, output_limit, ...)
    error: bool  # the call did not end cleanly (an exception, a limit, a sandbox failure)
    timeout: bool  # it ran out of wall-clock or CPU time (also an error)
    truncated: bool  # its output was cut
    seconds: float  # the sandbox's wall time for it


def sandbox_limits(cfg: ToolConfig) -> Limits:
    """The sandbox limits of one call: the tool's time and memory, the sandbox's defaults for the rest
    (its 1 MiB stdout cap stops a call that floods; `max_output_chars` then cuts what is shown)."""
    return Limits(wall_s=float(cfg.wall_s), cpu_s=float(cfg.cpu_s), memory_mb=cfg.memory_mb)


def truncate_output(out: str, limit: int, stopped: bool) -> tuple[str, bool]:
    """(the first `limit` characters of `out` and a note of how much was cut, whether anything was cut).
    `stopped`: the sandbox killed the call at its output cap, so the full length is unknown."""
    if stopped:
        cut = max(len(out) - limit, 0)
        return out[:limit] + f"\n[output cut: more than {cut} characters; the call was stopped for printing " \
                             f"too much]", True
    if len(out) <= limit:
        return out, False
    return out[:limit] + f"\n[output cut: {len(out) - limit} more characters]", True


def error_line(result: SandboxResult, cfg: ToolConfig) -> str:
    """One line saying why a call failed, for the model: the exception's last traceback line and the line
    of the call's code it came from (`ZeroDivisionError: division by zero (line 2)`), or the limit."""
    if result.status == "timeout":
        return f"TimeoutError: the call ran past its {cfg.wall_s:g} s wall-clock limit and was stopped"
    if result.status == "cpu_limit":
        return f"TimeoutError: the call used up its {cfg.cpu_s:g} s of CPU time and was stopped"
    if result.status == "memory":
        return f"MemoryError: the call ran past its {cfg.memory_mb} MB memory limit"
    if result.status != "error":
        return f"the call was stopped ({result.status})"
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    if not lines:
        return f"the call exited with status {result.returncode}"
    where = re.findall(r'File "<solution>", line (\d+)', result.stderr)
    return lines[-1].strip() + (f" (line {where[-1]})" if where else "")


def format_output(body: str, cfg: ToolConfig) -> str:
    """The text appended after a call: `output_open`, the body, `output_close`, each on its own line."""
    return f"{cfg.output_open}\n{body}\n{cfg.output_close}\n" if body else f"{cfg.output_open}\n{cfg.output_close}\n"


def tool_result(result: SandboxResult, cfg: ToolConfig) -> ToolResult:
    """A sandbox run as the tool's result: printed output (cut to `max_output_chars`), then the error line.
    What a successful call writes to stderr (warnings) is not shown."""
    stopped = result.status == "output_limit"
    shown, truncated = truncate_output(result.stdout.removesuffix("\n"), cfg.max_output_chars, stopped)
    error = result.status not in ("ok", "output_limit")
    body = "\n".join(part for part in (shown, error_line(result, cfg) if error else "") if part)
    return ToolResult(format_output(body, cfg), result.status, error, result.status in TIMEOUT_STATUSES,
                      truncated, result.wall_s)


def run_call(code: str, cfg: ToolConfig) -> ToolResult:
    """One call in a fresh script-mode sandbox (empty stdin, its own temporary directory, no network)."""
    return tool_result(run_program(code, limits=sandbox_limits(cfg)), cfg)


def run_calls(codes: Sequence[str], cfg: ToolConfig, pool: SandboxPool) -> list[ToolResult]:
    """Each code's result, in order, up to `pool.max_workers` calls running at once."""
    return pool.map(lambda code: run_call(code, cfg), list(codes))


# ------------------------------------------------------------------------------------ statistics


@dataclasses.dataclass(frozen=True)
class ToolStats:
    """A row's tool use over its conversation."""

    calls: int = 0
    errors: int = 0
    timeouts: int = 0
    truncations: int = 0
    seconds: float = 0.0

    def add(self, result: ToolResult) -> ToolStats:
        return ToolStats(self.calls + 1, self.errors + result.error, self.timeouts + result.timeout,
                         self.truncations + result.truncated, self.seconds + result.seconds)


def tool_metrics(stats: Sequence[ToolStats]) -> dict[str, float]:
    """A batch's tool metrics: calls per row, the fraction of rows that called, and of the calls the
    fractions that failed, ran out of time or were cut (0 when no row called: `tool/call_rate` says so).
    Wall-clock time is not here (it differs between a run and its resume): see `tool_timings`."""
    if not stats:
        raise ValueError("tool_metrics: stats is empty; a batch has at least one row")
    rows, calls = len(stats), sum(s.calls for s in stats)

    def per_call(n: int) -> float:
        return n / calls if calls else 0.0

    return {
        "tool/calls_per_row": calls / rows,
        "tool/call_rate": sum(s.calls > 0 for s in stats) / rows,
        "tool/error_rate": per_call(sum(s.errors for s in stats)),
        "tool/timeout_rate": per_call(sum(s.timeouts for s in stats)),
        "tool/truncated_frac": per_call(sum(s.truncations for s in stats)),
    }


def tool_timings(stats: Sequence[ToolStats]) -> dict[str, float]:
    """Seconds the batch's calls spent in the sandbox, summed over calls (several run at once, so this
    can exceed the step's wall time); a wall-clock figure, for the timings stream."""
    return {"tool/seconds": float(sum(s.seconds for s in stats))}


# ------------------------------------------------------------------------------------ the multi-turn loop

# why a row ended: without a call (its EOS) / calling past max_turns / past max_chars (`run_turns`) / past the
# token cap or out of cache slots (`multiturn.sample_with_tools`, which counts tokens, not characters)
STOP_REASONS = ("done", "max_turns", "max_chars", "max_tokens", "max_slots")


@dataclasses.dataclass
class Conversation:
    """One row's text after its prompt, as segments in order: {"role": "model", "text"} for what the policy
    wrote, {"role": "tool", "code", "status", "text"} for an appended output (the tokens the loss will skip).
    `stop` is one of STOP_REASONS once the row has ended, None while it goes on."""

    segments: list[dict] = dataclasses.field(default_factory=list)
    stats: ToolStats = ToolStats()
    stop: str | None = None

    @property
    def text(self) -> str:
        return "".join(segment["text"] for segment in self.segments)

    def to_dict(self) -> dict:
        """JSON-able, for samples.jsonl: the whole conversation, why it ended, its tool statistics."""
        return {"segments": [dict(s) for s in self.segments], "stop": self.stop,
                "tool": dataclasses.asdict(self.stats)}

    def append(self, segment: dict, cfg: ToolConfig) -> None:
        """Add a segment, cut to the row's `max_chars` (the row then ends with "max_chars")."""
        room = cfg.max_chars - len(self.text)
        if len(segment["text"]) >= room:
            segment = segment | {"text": segment["text"][:room]}
            self.stop = "max_chars"
        self.segments.append(segment)


def take_turn(conv: Conversation, chunk: str, cfg: ToolConfig) -> str | None:
    """Add what the policy wrote this turn; the code to run, or None when the row ended. The chunk is kept
    up to the end of its first call (the sampler stops the row there; anything after it is dropped). A
    chunk without a complete call ends the row; a call past `max_turns` is kept but not run."""
    call = find_call(chunk, cfg)
    conv.append({"role": "model", "text": chunk if call is None else chunk[:call.end]}, cfg)
    if conv.stop is None and call is None:
        conv.stop = "done"
    elif conv.stop is None and conv.stats.calls >= cfg.max_turns:
        conv.stop = "max_turns"
    return None if conv.stop is not None else call.code


def add_result(conv: Conversation, code: str, result: ToolResult, cfg: ToolConfig) -> None:
    """Append a call's output to the row and count it."""
    conv.stats = conv.stats.add(result)
    conv.append({"role": "tool", "code": code, "status": result.status, "text": result.text}, cfg)


def run_turns(
    rows_text: Sequence[str],
    generate_fn: Callable[[list[str]], list[str]],
    cfg: ToolConfig,
    pool: SandboxPool,
) -> list[Conversation]:
    """The multi-turn loop on the host, one conversation per row. `generate_fn(texts)` continues each
    text (a row's prompt and its conversation so far) until the row ends or closes a call; rows that
    called get their outputs (run together through `pool`) and continue, the others have ended."""
    convs = [Conversation() for _ in rows_text]
    active = list(range(len(rows_text)))
    while active:
        chunks = generate_fn([rows_text[i] + convs[i].text for i in active])
        if len(chunks) != len(active):
            raise ValueError(f"run_turns: generate_fn returned {len(chunks)} texts for {len(active)} rows")
        calls = {i: code for i, chunk in zip(active, chunks) if (code := take_turn(convs[i], chunk, cfg)) is not None}
        for i, result in zip(calls, run_calls(list(calls.values()), cfg, pool)):
            add_result(convs[i], calls[i], result, cfg)
        active = [i for i in active if convs[i].stop is None]
    return convs
