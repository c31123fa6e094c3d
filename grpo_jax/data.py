"""Prompt data: JSONL files read into a task's rows (each file's format detected and adapted, prompts
cleaned of injection, conversations rendered with the chat template: `load_task_data`), a resumable
deterministic batch stream, difficulty strata, pass-rate filtering, the prompt-length limit (rows longer than
the model's positions allow dropped or cut: `limit_prompts`), and tokenisation into the padded arrays the
sampler and trainer take.

The stream is a pure function of (rows, batch size, cursor, seed): epoch e visits the rows in the order
of `default_rng([seed, e]).permutation(n)`, and the cursor (epoch, index) is all the state there is. A
checkpoint stores the cursor, so a resumed run draws exactly the batches an uninterrupted one would.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

import numpy as np

from grpo_jax import tasks as tasks_lib
from grpo_jax.config import SamplingConfig, TaskConfig, UserError
from grpo_jax.fileio import atomic_write
from grpo_jax.rewards.sanitize import SANITIZE_VERSION, Finding, sanitize_prompt
from grpo_jax.tasks import adapters, chat
from grpo_jax.tokenizer import Tokenizer, pad_rows

Row = dict[str, Any]

# Types of the fields the pipeline and rewards read; other fields pass through unchecked.
FIELD_TYPES: Mapping[str, tuple[type, ...]] = {
    "prompt": (str,),
    "answer": (str, int, float),
    "references": (str, list),
    "difficulty": (int, str),
    "pass_rate": (int, float),
}


class DataError(ValueError):
    """A bad dataset row or argument; the message names the file and line (or row index) and field."""


# --------------------------------------------------------------------------------------------- JSONL

def check_row(row: Any, required: Sequence[str]) -> str | None:
    """The problem with one row, or None: not an object, a missing/empty required field, a wrong type."""
    if not isinstance(row, dict):
        return f"row must be a JSON object, got {type(row).__name__}"
    for name in required:
        if name not in row:
            return f"missing required field {name!r}"
        if row[name] is None or row[name] == "" or row[name] == []:
            return f"field {name!r} is empty"
    for name, types in FIELD_TYPES.items():
        value = row.get(name)
        if value is not None and (isinstance(value, bool) or not isinstance(value, types)):
            return f"field {name!r} must be {'/'.join(t.__name__ for t in types)}, got {type(value).__name__}"
    rate = row.get("pass_rate")
    if rate is not None and not 0.0 <= rate <= 1.0:
        return f"field 'pass_rate' must be in [0, 1], got {rate!r}"
    return None


def read_jsonl(path: str | Path) -> list[tuple[int, Any]]:
    """(line number, parsed JSON value) of each non-blank line of a JSONL file; a line that is not UTF-8
    JSON raises `DataError("FILE:LINE: ...")`."""
    lines = []
    with open(path, "rb") as f:
        for lineno, raw in enumerate(f, start=1):
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as e:
                raise DataError(f"{path}:{lineno}: not UTF-8 (byte {raw[e.start]:#04x} at column {e.start + 1}); "
                                "JSONL files must be UTF-8 text") from None
            if not line.strip():
                continue
            try:
                lines.append((lineno, json.loads(line)))
            except json.JSONDecodeError as e:
                raise DataError(f"{path}:{lineno}: invalid JSON ({e.msg} at column {e.colno})") from None
    return lines


def load_jsonl(path: str | Path, *, required: Sequence[str] = ("prompt",)) -> list[Row]:
    """All rows of a JSONL file, validated one by one; blank lines are skipped.

    The first bad row raises `DataError("FILE:LINE: ...")`, so a broken dataset fails before training
    starts rather than mid-run on the batch that happens to contain it.
    """
    rows = []
    for lineno, row in read_jsonl(path):
        problem = check_row(row, required)
        if problem:
            raise DataError(f"{path}:{lineno}: {problem}")
        rows.append(row)
    return rows


def write_jsonl(path: str | Path, rows: Iterable[Mapping[str, Any]]) -> None:
    """Write rows atomically (temp file in the same folder, then rename): a crash never leaves half a file."""
    def write(f):
        for row in rows:
            f.write((json.dumps(row, ensure_ascii=False) + "\n").encode("utf-8"))

    atomic_write(path, write)


# ------------------------------------------------------------------------------------ batch stream

@dataclass(frozen=True)
class Cursor:
    """Position in the stream: `index` rows of epoch `epoch`'s permutation already served."""

    epoch: int = 0
    index: int = 0

    def __post_init__(self) -> None:
        for name in ("epoch", "index"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise DataError(f"Cursor.{name} must be a non-negative int, got {value!r}")

    def to_dict(self) -> dict[str, int]:
        return {"epoch": self.epoch, "index": self.index}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Cursor:
        """Accepts what `to_dict` wrote, also after a checkpoint round trip turned the ints into NumPy ints."""
        if set(d) != {"epoch", "index"}:
            raise DataError(f"Cursor.from_dict needs exactly the fields epoch and index, got {sorted(d)}")
        return cls(*(_as_int(d[name]) for name in ("epoch", "index")))


def _as_int(value: Any) -> Any:
    """Python int for an integer scalar of any kind (int, np.int64, 0-d array); anything else unchanged."""
    if isinstance(value, (int, np.integer, np.ndarray)) and not isinstance(value, bool):
        a = np.asarray(value)
        if a.ndim == 0 and a.dtype.kind in "iu":
            return int(a)
    return value


def epoch_order(n: int, epoch: int, *, seed: int) -> np.ndarray:
    """The row order of one epoch: a permutation from its own generator, so any epoch is reachable directly."""
    return np.random.default_rng([seed, epoch]).permutation(n)


def next_indices(n: int, batch_size: int, cursor: Cursor, *, seed: int) -> tuple[np.ndarray, Cursor]:
    """Row indices of the next batch (int64 [batch_size]) and the cursor after it; may cross epochs."""
    if n <= 0 or batch_size <= 0:
        raise DataError(f"need rows and a positive batch size, got n={n}, batch_size={batch_size}")
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise DataError(f"seed must be a non-negative int, got {seed!r}")
    if cursor.index >= n:
        raise DataError(f"cursor index {cursor.index} is past the {n} rows: was it saved for another dataset?")
    epoch, index, parts, got = cursor.epoch, cursor.index, [], 0
    while got < batch_size:
        take = min(batch_size - got, n - index)
        parts.append(epoch_order(n, epoch, seed=seed)[index : index + take])
        got, index = got + take, index + take
        if index == n:
            epoch, index = epoch + 1, 0
    return np.concatenate(parts), Cursor(epoch, index)


def next_batch(rows: Sequence[Row], batch_size: int, cursor: Cursor, *, seed: int) -> tuple[list[Row], Cursor]:
    """The next `batch_size` rows and the cursor after them (see `next_indices`)."""
    idx, cursor = next_indices(len(rows), batch_size, cursor, seed=seed)
    return [rows[i] for i in idx], cursor


@dataclass
class PromptStream:
    """`next_batch` with the cursor kept for you; save `stream.cursor.to_dict()` in the checkpoint."""

    rows: Sequence[Row]
    batch_size: int
    seed: int
    cursor: Cursor = field(default_factory=Cursor)

    def next(self) -> tuple[list[Row], np.ndarray]:
        """(rows, their dataset indices): the indices are stable prompt ids, e.g. for per-prompt RNG keys."""
        idx, self.cursor = next_indices(len(self.rows), self.batch_size, self.cursor, seed=self.seed)
        return [self.rows[i] for i in idx], idx

    def take(self, n: int) -> list[Row]:
        """The next n rows (any n, e.g. a dynamic-sampling round's); advances the cursor as `next` does."""
        idx, self.cursor = next_indices(len(self.rows), n, self.cursor, seed=self.seed)
        return [self.rows[i] for i in idx]


# ------------------------------------------------------------------------- strata and pass-rate filter

PASS_RATE_STRATA = ("0", "(0,0.5)", "[0.5,1)", "1")  # never solved, hard, easy, always solved


def pass_rate_stratum(rate: float) -> str:
    """Bucket a pass rate; the ends are kept apart because those groups give GRPO no signal."""
    if rate <= 0.0:
        return "0"
    if rate >= 1.0:
        return "1"
    return "(0,0.5)" if rate < 0.5 else "[0.5,1)"


def strata_summary(rows: Sequence[Row], key: str = "difficulty") -> dict[str, int]:
    """Row count per stratum of `key` ("pass_rate" is bucketed); rows without it count as "missing"."""
    counts: dict[str, int] = {}
    for row in rows:
        value = row.get(key)
        label = "missing" if value is None else pass_rate_stratum(value) if key == "pass_rate" else str(value)
        counts[label] = counts.get(label, 0) + 1
    order = _pass_rate_order if key == "pass_rate" else _natural_order
    return dict(sorted(counts.items(), key=lambda kv: order(kv[0])))


def _pass_rate_order(label: str) -> int:
    return PASS_RATE_STRATA.index(label) if label in PASS_RATE_STRATA else len(PASS_RATE_STRATA)


def _natural_order(label: str) -> tuple[int, float, str]:
    """Numbers in numeric order (2 before 10), then other labels, then "missing"."""
    try:
        return (0, float(label), label)
    except ValueError:
        return (2 if label == "missing" else 1, 0.0, label)


def filter_by_pass_rate(rows: Sequence[Row], lo: float, hi: float) -> tuple[list[Row], dict[str, Any]]:
    """Keep rows with lo <= pass_rate <= hi, e.g. drop always-solved and never-solved prompts.

    A row without a numeric pass_rate is an error naming its index: silently keeping or dropping it
    would bias the curriculum without anyone noticing.
    """
    if not 0.0 <= lo <= hi <= 1.0:
        raise DataError(f"need 0 <= lo <= hi <= 1, got lo={lo}, hi={hi}")
    kept, below, above = [], 0, 0
    for i, row in enumerate(rows):
        rate = row.get("pass_rate")
        if isinstance(rate, bool) or not isinstance(rate, (int, float)) or math.isnan(rate):
            raise DataError(f"row {i}: field 'pass_rate' missing or not a number (got {rate!r})")
        if rate < lo:
            below += 1
        elif rate > hi:
            above += 1
        else:
            kept.append(row)
    report = {"total": len(rows), "kept": len(kept), "below": below, "above": above, "lo": lo, "hi": hi}
    return kept, report


# ------------------------------------------------------------------------- a task's rows from files

PARQUET_MAGIC = b"PAR1"  # the first (and last) four bytes of every Parquet file


def is_parquet(path: str | Path) -> bool:
    """Whether `path` is a Parquet file: its .parquet suffix or its magic bytes (a renamed file too)."""
    if str(path).lower().endswith(".parquet"):
        return True
    try:
        with open(path, "rb") as f:
            return f.read(len(PARQUET_MAGIC)) == PARQUET_MAGIC
    except OSError:
        return False


def parquet_conversion(path: str | Path) -> str:
    """A shell one-liner that writes `path`'s rows as JSONL beside it (pandas with pyarrow)."""
    target = str(Path(path).with_suffix(".jsonl"))
    return (f"python -c \"import pandas as pd; pd.read_parquet({str(path)!r}).to_json({target!r}, orient='records', "
            "lines=True, force_ascii=False)\"")


def check_data_file(path: str, setting: str) -> None:
    """Refuse, naming the config key, a data path that is not a readable JSONL file: a missing path (a typo
    would otherwise be a bare FileNotFoundError), a folder, or a Parquet file (which would read as "not
    UTF-8"); the Parquet message gives the conversion command."""
    if not os.path.exists(path):
        raise DataError(f"{setting}={path!r}: no such file; set {setting} to an existing JSONL file "
                        "(one JSON object per line)")
    if os.path.isdir(path):
        raise DataError(f"{setting}={path!r} is a folder; set {setting} to a JSONL file in it")
    if is_parquet(path):
        raise DataError(f"{setting}={path!r} is a Parquet file, which is not read; convert it to JSONL with "
                        f"{parquet_conversion(path)} and set {setting} to the .jsonl file")


def _no_rows(path: str, setting: str, task, hint: str = "") -> DataError:
    return DataError(f"{path}: no rows (the file is empty or blank); {setting} must name a JSONL file with one "
                     f"JSON object per line, fields {list(task.required_fields)}{hint}")


def sanitize_row(row: Row, action: str, keep: Sequence[str] = ()) -> tuple[Row | None, list[Finding]]:
    """`row` with its prompt (or every user turn of its conversation) cleaned of reward-channel injection
    (rewards.sanitize), or None when `action` drops it; and what was found. "flag" changes nothing.

    The run's own instructions are never rewritten: a system turn is the dataset's instruction, not a
    scraped question, so it is only flagged (reported, kept as written), and the texts of `keep` (the
    configured system prompt, the fixed wording of the row format: `instruction_texts`) are kept wherever
    they appear."""
    if action == "off":
        return row, []
    if "messages" in row:
        turns, found = [], []
        for turn in row["messages"]:
            own = action if turn["role"] != "system" else "flag"
            result = sanitize_prompt(turn["content"], action=own, keep=keep)
            found += result.findings
            if result.dropped:
                return None, found
            turns.append({**turn, "content": result.text})
        return (row if action == "flag" or not found else {**row, "messages": turns}), found
    result = sanitize_prompt(row["prompt"], action=action, keep=keep)
    if result.dropped:
        return None, list(result.findings)
    return (row if action == "flag" or not result.findings else {**row, "prompt": result.text}), list(result.findings)


def instruction_texts(cfg: TaskConfig, fmt: str) -> tuple[str, ...]:
    """The instruction texts prompt cleaning must keep for rows of format `fmt`: the configured system
    prompt and the fixed wording the format puts around each question (`adapters.fixed_text`)."""
    return tuple(t for t in (cfg.system_prompt, *adapters.fixed_text(fmt)) if t.strip())


def cleaning_summary(setting: str, report: Mapping[str, Any]) -> str | None:
    """One line saying what prompt cleaning changed in a file (rows cleaned and dropped, findings per kind,
    the first example), or None when it changed and found nothing: printed when a run starts, so a rewrite
    of the data is seen before training on it, not only in the report."""
    if not report or not (report.get("rows_changed") or report.get("rows_dropped") or report.get("findings")):
        return None
    kinds = ", ".join(f"{k} {n}" for k, n in report.get("findings", {}).items())
    line = (f"{setting}: task.sanitize={report['action']} cleaned {report['rows_changed']} rows, dropped "
            f"{report['rows_dropped']} ({kinds})")
    if report.get("examples"):
        first = report["examples"][0]
        line += f"; first: {first['row']} {first['outcome']}, found {first['found'][:2]}"
    return line


@dataclass
class CleaningReport:
    """What prompt cleaning did to one file: rows changed and dropped, findings per kind, a few examples."""

    action: str
    changed: int = 0
    dropped: int = 0
    kinds: dict[str, int] = field(default_factory=dict)
    examples: list[dict[str, Any]] = field(default_factory=list)
    max_examples: int = 3

    def add(self, where: str, before: Row, after: Row | None, findings: Sequence[Finding]) -> None:
        if not findings:
            return
        self.dropped += after is None
        self.changed += after is not None and after is not before
        for f in findings:
            self.kinds[f.kind] = self.kinds.get(f.kind, 0) + 1
        if len(self.examples) < self.max_examples:
            shown = before.get("prompt", before.get("messages"))
            self.examples.append({"row": where, "kinds": sorted({f.kind for f in findings}),
                                  "found": [f.text[:120] for f in findings], "prompt": str(shown)[:300],
                                  "outcome": "dropped" if after is None else "kept" if after is before else "cleaned"})

    def to_dict(self) -> dict[str, Any]:
        return {"action": self.action, "version": SANITIZE_VERSION, "rows_changed": self.changed,
                "rows_dropped": self.dropped, "findings": dict(sorted(self.kinds.items())), "examples": self.examples}


def _file_format(path: str, first: tuple[int, Any], cfg: TaskConfig, task) -> str:
    """The row format of a file: task.format, or detected from the columns of its first row."""
    formats = tasks_lib.row_formats(task)
    if cfg.format != "auto":
        if cfg.format not in formats:
            raise DataError(f"task.format={cfg.format!r}: task {task.name!r} reads rows of the formats "
                            f"{', '.join(formats)}" + ("; task.name=jsonl reads every format"
                                                       if cfg.format in adapters.FORMATS else ""))
        return cfg.format
    lineno, row = first
    try:
        fmt = adapters.detect_format(row)
    except adapters.RowError as e:
        raise DataError(f"{path}:{lineno}: {e}") from None
    if fmt not in formats:  # e.g. multiple-choice rows, which also have GSM8K's question and answer columns
        raise DataError(f"{path}:{lineno}: the rows look like {fmt} rows ({adapters.FORMATS[fmt].describe()}), "
                        f"which task {task.name!r} does not read (it reads {', '.join(formats)})"
                        + ("; task.name=jsonl reads every format" if task.name != "jsonl" else "")
                        + "; or set task.format")
    return fmt


def render_chats(rows: Sequence[Row], cfg: TaskConfig, tokenizer: Tokenizer | None, where: Sequence[str]) -> list[Row]:
    """The rows with each conversation (tasks.chat: `messages` rows, or every row when task.chat / task.
    system_prompt asks) rendered into `prompt` by the tokenizer's chat template; `where[i]` names row i."""
    out = []
    for row, place in zip(rows, where, strict=True):
        try:
            turns = chat.conversation(row, system_prompt=cfg.system_prompt, mode=cfg.chat)
            if turns is not None:
                if tokenizer is None:
                    raise ValueError("rendering a chat needs the task's tokenizer (load_task_data(tokenizer=...))")
                row = chat.render(row, turns, tokenizer)
        except ValueError as e:
            raise DataError(f"{place}: {e}") from None
        out.append(row)
    return out


def prepare_file(path: str, setting: str, task, cfg: TaskConfig, tokenizer: Tokenizer | None, *,
                 action: str) -> tuple[list[tuple[Row, Row | None]], dict[str, Any]]:
    """Each row of one data file as (the row as written, the row ready for the task or None when cleaning
    dropped it), and a report (format, cleaning). A ready row is adapted from the file's format
    (tasks.adapters), checked for the fields the task's reward reads, cleaned of prompt injection
    (`action`), and rendered with the chat template where task.chat says. Errors name the file and line."""
    check_data_file(path, setting)
    lines = read_jsonl(path)
    if not lines:
        raise _no_rows(path, setting, task, " (or set task.n_eval=0 to evaluate nothing)" if "eval" in setting else "")
    fmt = _file_format(path, lines[0], cfg, task)
    required = tasks_lib.bind_format(task, fmt).required_fields
    cleaning = CleaningReport(action)
    keep = instruction_texts(cfg, fmt)
    pairs: list[tuple[Row, Row | None]] = []
    kept, where = [], []
    for lineno, raw in lines:
        place = f"{path}:{lineno}"
        try:
            row = adapters.adapt_row(raw, fmt, tasks_lib.row_options(task))
        except adapters.RowError as e:
            raise DataError(f"{place}: {e}") from None
        problem = check_row(row, [f for f in required if not (f == "prompt" and "messages" in row)])
        if problem:
            raise DataError(f"{place}: {problem} (format {fmt})")
        cleaned, findings = sanitize_row(row, action, keep)
        cleaning.add(place, row, cleaned, findings)
        pairs.append((raw, cleaned))
        if cleaned is not None:
            kept.append(len(pairs) - 1)
            where.append(place)
    if not kept:
        raise DataError(f"{path}: task.sanitize={action} dropped every row ({cleaning.to_dict()['findings']})")
    rendered = render_chats([pairs[i][1] for i in kept], cfg, tokenizer, where)  # type: ignore[misc]
    for i, row in zip(kept, rendered):
        pairs[i] = (pairs[i][0], row)
    return pairs, {"format": fmt, "sanitize": cleaning.to_dict()}


def load_file(path: str, setting: str, task, cfg: TaskConfig, tokenizer: Tokenizer | None, *,
              action: str) -> tuple[list[Row], dict[str, Any]]:
    """The rows of one data file ready for the task (`prepare_file`, dropped rows left out), and its report."""
    pairs, info = prepare_file(path, setting, task, cfg, tokenizer, action=action)
    return [row for _, row in pairs if row is not None], info


def load_task_data(task, cfg: TaskConfig, seed: int, tokenizer: Tokenizer | None = None,
                   ) -> tuple[list[Row], list[Row], dict[str, Any]]:
    """(training rows, held-out rows, data report) of a run: JSONL files when the config names them (see
    `load_file`), else rows the task generates; the training rows pass the pass-rate band filter when one is
    set. The report's "format" (of the training file) is what `tasks.bind_format` gives a file task.
    Held-out rows are never cleaned, only counted (a benchmark is not rewritten), under "eval_sanitize".
    A file task given a training file but no task.eval_path evaluates on a slice of the training file
    held out before training (`hold_out`, under "eval_holdout"): it has no held-out split of its own."""
    report: dict[str, Any] = {}
    if cfg.train_path:
        rows, info = load_file(cfg.train_path, "task.train_path", task, cfg, tokenizer, action=cfg.sanitize)
        report.update(format=info["format"], sanitize=info["sanitize"])
    else:
        rows = task.generate("train", cfg.n_train, seed)
        rows = render_chats(rows, cfg, tokenizer, [f"generated train row {i}" for i in range(len(rows))])
    if cfg.train_path and not cfg.eval_path and cfg.n_eval and not tasks_lib.generates_rows(task):
        rows, eval_rows, report["eval_holdout"] = hold_out(rows, cfg.n_eval, seed, cfg.train_path)
    else:
        eval_rows = _eval_rows(task, cfg, seed, tokenizer, report)
    report.update(rows=len(rows), strata=strata_summary(rows))
    if (cfg.pass_rate_lo, cfg.pass_rate_hi) != (0.0, 1.0):
        rows, band = filter_by_pass_rate(rows, cfg.pass_rate_lo, cfg.pass_rate_hi)
        report.update(pass_rate_filter=band, pass_rate_strata=strata_summary(rows, "pass_rate"))
        if not rows:
            raise ValueError(f"task.pass_rate_lo/hi = [{cfg.pass_rate_lo}, {cfg.pass_rate_hi}] keeps no training "
                             f"row ({band})")
    if any("messages" in r for r in (*rows, *eval_rows)):
        report["chat"] = {"mode": cfg.chat, "system_prompt": cfg.system_prompt,
                          "rendered_train_rows": sum("messages" in r for r in rows)}
    return rows, eval_rows, report


# ---------------------------------------------------------------------------------- prompt lengths

def prompt_token_limit(sampling: SamplingConfig, max_positions: int, positions_from: str) -> tuple[int | None, str]:
    """(the most tokens a prompt may have, or None for no limit; how that number was reached) for a model of
    `max_positions` positions (0: none known), read from `positions_from` (a config key or file, for messages).

    A row's positions are its real tokens, whatever the padding (`models.rope.text_positions`): a prompt of n
    tokens and its T = max_new_tokens completion use positions 0 .. n + T - 1, so n + T <= max_positions is
    exactly what fits. The padding only costs memory: the sampler pads prompts to a power-of-two bucket, so its
    cache holds `sampler.bucket_length(n) + T` slots (at most `bucket_length(limit) + T`). A budget that
    cannot fit is refused, naming the keys and the numbers."""
    t, explicit = sampling.max_new_tokens, sampling.max_prompt_tokens
    if explicit:
        if max_positions and explicit + t > max_positions:
            raise UserError(f"sampling.max_prompt_tokens ({explicit}) + sampling.max_new_tokens ({t}) = {explicit + t} "
                            f"exceeds the model's {max_positions} positions ({positions_from}); lower one of them")
        return explicit, "sampling.max_prompt_tokens"
    if not max_positions:
        return None, f"no limit: {positions_from} gives no positions and sampling.max_prompt_tokens is 0"
    if t >= max_positions:
        raise UserError(f"sampling.max_new_tokens ({t}) leaves no room for a prompt in the model's {max_positions} "
                        f"positions ({positions_from}); lower sampling.max_new_tokens")
    return max_positions - t, f"{max_positions} positions ({positions_from}) - sampling.max_new_tokens {t}"


def prompt_lengths(tokenizer: Tokenizer, rows: Sequence[Row]) -> np.ndarray:
    """[len(rows)] token counts of the rows' prompts, encoded as the rollout encodes them."""
    return np.asarray([len(tokenizer.encode(r["prompt"])) for r in rows], dtype=np.int64)


def _length_counts(lengths: np.ndarray, limit: int, action: str) -> dict[str, int]:
    longer = int(np.sum(lengths > limit))
    return {"rows": int(lengths.size), "dropped" if action == "drop" else "truncated": longer,
            "longest": int(lengths.max(initial=0))}


def limit_prompts(rows: Sequence[Row], eval_rows: Sequence[Row], tokenizer: Tokenizer, limit: int | None, how: str,
                  action: str) -> tuple[list[Row], list[Row], dict[str, Any] | None]:
    """(training rows, held-out rows, report) with the rows whose prompt has more than `limit` tokens left out
    when `action` is "drop"; with "truncate_left" every row stays (the rollout keeps the last `limit` tokens of
    a longer prompt: `encode_prompts`) and the longer ones are counted. Refused when it would leave no training
    row, or no held-out row of a non-empty set. No limit: the rows as they are and no report."""
    if limit is None:
        return list(rows), list(eval_rows), None
    report: dict[str, Any] = {"max_prompt_tokens": limit, "from": how, "long_prompts": action}
    kept = []
    for name, part in (("train", rows), ("eval", eval_rows)):
        lengths = prompt_lengths(tokenizer, part)
        report[name] = _length_counts(lengths, limit, action)
        keep = [r for r, n in zip(part, lengths) if action != "drop" or n <= limit]
        if part and not keep:
            raise _all_dropped(limit, how, len(part), int(lengths.min()), name)
        kept.append(keep)
    return kept[0], kept[1], report


def _all_dropped(limit: int, how: str, n: int, shortest: int, part: str) -> DataError:
    fixes = ["raise sampling.max_prompt_tokens"] if how == "sampling.max_prompt_tokens" else []
    fixes += ["lower sampling.max_new_tokens", "set sampling.long_prompts=truncate_left"]
    fixes += ["set task.n_eval=0"] if part == "eval" else []
    what = "training rows" if part == "train" else "held-out rows"
    return DataError(f"sampling.max_prompt_tokens={limit} ({how}) drops every one of the {n} {what}: the shortest "
                     f"prompt has {shortest} tokens; {', '.join(fixes[:-1])} or {fixes[-1]}")


def length_summary(report: Mapping[str, Any] | None) -> str | None:
    """One line saying how many training and held-out prompts the limit dropped or truncated (None when it
    touched none): printed when a run starts, beside the cleaning line."""
    verb = "dropped" if report and report["long_prompts"] == "drop" else "truncated"
    if not report or not any(report[part][verb] for part in ("train", "eval")):
        return None
    parts = [f"{report[p][verb]} of {report[p]['rows']} {what} (longest {report[p]['longest']} tokens)"
             for p, what in (("train", "training rows"), ("eval", "held-out rows")) if report[p]["rows"]]
    how = "kept their last tokens" if verb == "truncated" else "were left out"
    return (f"sampling.max_prompt_tokens={report['max_prompt_tokens']} ({report['from']}): {verb} "
            f"{', '.join(parts)}; longer prompts {how} (sampling.long_prompts={report['long_prompts']})")


def _eval_rows(task, cfg: TaskConfig, seed: int, tokenizer: Tokenizer | None, report: dict[str, Any]) -> list[Row]:
    """The held-out rows from task.eval_path (its first n_eval, of the training file's reward family; noted in
    `report`), or from the task's "heldout" split; none when task.n_eval=0."""
    if not cfg.n_eval:
        return []
    if not cfg.eval_path:
        eval_rows = task.generate("heldout", cfg.n_eval, seed)
        return render_chats(eval_rows, cfg, tokenizer, [f"generated held-out row {i}" for i in range(len(eval_rows))])
    eval_rows, info = load_file(cfg.eval_path, "task.eval_path", task, cfg, tokenizer,
                                action="flag" if cfg.sanitize != "off" else "off")
    report.update(eval_format=info["format"], eval_sanitize=info["sanitize"])
    family = adapters.FORMATS[info["format"]].family
    if "format" in report and family != adapters.FORMATS[report["format"]].family:
        raise DataError(f"{cfg.eval_path}: rows of format {info['format']} ({family} reward) cannot evaluate a "
                        f"run trained on {report['format']} rows ({adapters.FORMATS[report['format']].family} "
                        "reward); set task.format or use held-out rows of the same kind")
    return eval_rows[: cfg.n_eval]


HOLDOUT_SHARE = 0.1  # at most this share of a training file's distinct prompts is held out for evaluation
HOLDOUT_STREAM = 0x686F6C64  # the hold-out's random stream, [seed, this]: apart from the epochs' [seed, e]


def hold_out(rows: Sequence[Row], n_eval: int, seed: int, path: str) -> tuple[list[Row], list[Row], dict[str, Any]]:
    """(training rows, held-out rows, report): min(n_eval, 10% of the distinct prompts) prompts drawn by
    `seed`, evaluated once each (in file order) and never trained on: every row of a held-out prompt leaves
    the training rows, so a file with repeated prompts cannot leak one into evaluation. Too few distinct
    prompts to hold one out is an error naming `path` and the two ways out."""
    prompts = list(dict.fromkeys(r["prompt"] for r in rows))  # distinct, in file order
    n = min(n_eval, int(len(prompts) * HOLDOUT_SHARE))
    if n < 1:
        raise DataError(f"{path}: no task.eval_path, and {len(prompts)} distinct prompts are too few to hold "
                        f"{HOLDOUT_SHARE:.0%} out for evaluation; set task.eval_path to a held-out JSONL file, or "
                        "task.n_eval=0 to evaluate nothing")
    order = np.random.default_rng([seed, HOLDOUT_STREAM]).permutation(len(prompts))
    held = {prompts[i] for i in order[:n]}
    train = [r for r in rows if r["prompt"] not in held]
    first = {r["prompt"]: k for k, r in reversed(list(enumerate(rows)))}  # each held prompt's first row
    heldout = [rows[k] for k in sorted(first[p] for p in held)]
    return train, heldout, {"rows": len(rows) - len(train), "of": len(rows), "prompts": n, "seed": seed}


def holdout_summary(report: Mapping[str, Any]) -> str | None:
    """The line a run prints when it evaluates on a slice of its training file (report: `hold_out`'s), else None."""
    if not report:
        return None
    return (f"no task.eval_path: holding out {report['rows']} of {report['of']} training rows for evaluation "
            f"({report['prompts']} prompts, drawn by seed {report['seed']}; never trained on)")


# ------------------------------------------------------------------------------------ tokenisation

def encode_prompts(
    tokenizer: Tokenizer, rows: Sequence[Row], *, width: int | None = None, add_bos: bool = False,
    limit: int | None = None, long_prompts: str = "truncate_left",
) -> tuple[np.ndarray, np.ndarray]:
    """(tokens int32 [B, P], mask bool [B, P]) of the rows' prompts, left-padded for generation. With a
    `limit`, a longer prompt keeps its last `limit` tokens (`keep_last_tokens`), or with long_prompts="drop"
    is refused: such rows are dropped when the data is loaded (`limit_prompts`), so one here was not."""
    texts = [r["prompt"] for r in rows]
    if limit is None:
        return tokenizer.encode_batch(texts, width=width, left_pad=True, add_bos=add_bos)
    tokens, mask = tokenizer.encode_batch(texts, left_pad=True, add_bos=add_bos)
    longest = int(mask.sum(axis=1).max(initial=0))
    if longest > limit and long_prompts == "drop":
        raise DataError(f"a prompt of {longest} tokens is longer than sampling.max_prompt_tokens={limit} with "
                        "sampling.long_prompts=drop: such rows are dropped when the data is loaded "
                        "(data.limit_prompts), which these rows did not go through")
    if longest > limit:
        tokens, mask = keep_last_tokens(tokens, mask, limit, bos_id=tokenizer.bos_id)
    if width is not None:
        tokens, mask = pad_rows([t[m] for t, m in zip(tokens, mask)], width=width, pad_id=tokenizer.pad_id,
                                left_pad=True)
    return tokens, mask


def keep_last_tokens(tokens_BxP: np.ndarray, mask_BxP: np.ndarray, limit: int, *, bos_id: int | None,
                     ) -> tuple[np.ndarray, np.ndarray]:
    """Left-padded prompts cut to their last `limit` tokens ([B, limit]), as TRL truncates prompts: the end
    of a prompt holds the question and the chat template's opened assistant turn. A cut prompt that began with
    the tokenizer's BOS keeps it in its first place (a Llama-style model reads a sequence without its BOS as
    out of distribution), followed by its last `limit` - 1 tokens."""
    b = tokens_BxP.shape[0]
    tokens, mask = tokens_BxP[:, -limit:].copy(), mask_BxP[:, -limit:].copy()
    if bos_id is not None and limit > 1 and b:
        first = tokens_BxP[np.arange(b), np.argmax(mask_BxP, axis=1)]
        cut = mask_BxP.sum(axis=1) > limit
        tokens[cut & (first == bos_id), 0] = bos_id
    return tokens, mask


def encode_completions(
    tokenizer: Tokenizer, texts: Sequence[str], *, width: int | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """(tokens int32 [B, T], mask bool [B, T]) of target completions + EOS, right-padded (supervised
    warm start): the mask covers the EOS so the model learns to stop."""
    rows = [tokenizer.encode(t) + [tokenizer.eos_id] for t in texts]
    return pad_rows(rows, width=width, pad_id=tokenizer.pad_id, left_pad=False)
