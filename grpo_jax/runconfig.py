"""A run's saved config, and what a --resume or --rollback-to changes in it.

Two files in the run folder say which config a run trains with:

- `config.json`: the config the run started with, written once by the fresh start and never rewritten. It
  stays a plain TrainConfig object because strict readers load it as one: `config.from_dict` refuses unknown
  keys (older checkouts too, e.g. a pre-registration commit recomputing its study), and a study compares each
  run's config.json with the config its arm starts with (`study.check_run_config`), which a switch made
  mid-run would break if config.json were rewritten.
- `config_history.jsonl`: one line per resume or rollback that changed the config: the step, the kind, each
  changed key's old and new value, and the whole config from then on. Written by `runfolder.RunFolder`
  for every caller (the command line, a study's segments, a library's `Trainer(cfg, out, resume=True)`).

`current` is the config a run continues with (the newest history line's, else config.json's): the command
line starts --resume and --rollback-to from it, so a --set of the first run that is not repeated stays as it
was. `changes` lists what a new config changes in it; `refuse_critical` refuses the changes a checkpoint
cannot take (`config.RESUME_CRITICAL`: shapes, LoRA, group size, estimator, task, batch).
"""

from __future__ import annotations

import json
import os
from typing import Any

from grpo_jax.config import RESUME_CRITICAL, TrainConfig, UserError, flat_dict, from_dict, to_dict

CONFIG, HISTORY = "config.json", "config_history.jsonl"

Change = tuple[str, Any, Any]  # (dotted key, old value, new value), values as config.json holds them


def load(path: str, *, named: str = "") -> TrainConfig:
    """The TrainConfig in a config.json (as a run writes it); every error names the file (and line), after
    `named` (e.g. "--config ")."""
    try:
        with open(path, encoding="utf-8") as f:
            raw = json.load(f)
    except OSError as e:
        raise ValueError(f"{named}{path}: cannot read ({e.strerror})") from None
    except UnicodeDecodeError as e:
        raise ValueError(f"{named}{path}: not UTF-8 text (byte {e.object[e.start]:#04x} at offset {e.start})"
                         ) from None
    except json.JSONDecodeError as e:
        raise ValueError(f"{named}{path}:{e.lineno}:{e.colno}: invalid JSON ({e.msg}); expected the config.json "
                         "a run writes (a JSON object of config sections)") from None
    try:
        return from_dict(TrainConfig, raw)
    except ValueError as e:
        raise ValueError(f"{named}{path}: {e}") from None


def history(out_dir: str) -> list[dict]:
    """The entries of `out_dir`'s config_history.jsonl, oldest first ([] without one). A line that is not a
    JSON object with a "config" object is an error naming the file and line."""
    path = os.path.join(out_dir, HISTORY)
    if not os.path.exists(path):
        return []
    entries = []
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            try:
                entry = json.loads(line)
            except json.JSONDecodeError as e:
                raise ValueError(f"{path}:{n}: invalid JSON ({e.msg}); each line is one config change of the run "
                                 "(move the file aside to continue from config.json)") from None
            if not isinstance(entry, dict) or not isinstance(entry.get("config"), dict):
                raise ValueError(f"{path}:{n}: not a config change (a JSON object with a \"config\" object)")
            entries.append(entry)
    return entries


def current(out_dir: str) -> tuple[TrainConfig, str] | None:
    """(the config the run in `out_dir` continues with, where it was read): the newest config_history.jsonl
    entry's, else config.json's; None when the folder has no config.json (no run started there)."""
    path = os.path.join(out_dir, CONFIG)
    if not os.path.exists(path):
        return None
    entries = history(out_dir)
    if not entries:
        return load(path), path
    where = f"{os.path.join(out_dir, HISTORY)}:{len(entries)}"
    try:
        return from_dict(TrainConfig, entries[-1]["config"]), where
    except ValueError as e:
        raise ValueError(f"{where}: {e}") from None


def changes(old: TrainConfig, new: TrainConfig) -> list[Change]:
    """Every field whose value differs between the two configs, by dotted key in sorted order (values as
    config.json holds them: a tuple and the list it is saved as are equal)."""
    a, b = flat_dict(to_dict(old)), flat_dict(to_dict(new))
    return [(k, a.get(k), b.get(k)) for k in sorted(set(a) | set(b)) if a.get(k) != b.get(k)]


def change_line(change: Change) -> str:
    """"key: old -> new", the values as JSON."""
    key, old, new = change
    return f"{key}: {json.dumps(old)} -> {json.dumps(new)}"


def as_record(found: list[Change]) -> dict:
    """The changes as events.jsonl and config_history.jsonl hold them: {key: {"from": old, "to": new}}."""
    return {key: {"from": old, "to": new} for key, old, new in found}


def refuse_critical(found: list[Change], *, flag: str, out_dir: str) -> None:
    """UserError, one line naming each key, when `found` changes a key the run's checkpoints cannot take
    (`config.RESUME_CRITICAL`)."""
    bad = [c for c in found if c[0] in RESUME_CRITICAL]
    if bad:
        raise UserError(f"{flag} {out_dir}: cannot change {'; '.join(change_line(c) for c in bad)}: the run's "
                        "checkpoints were made with the old value (keys of the model's shapes, LoRA, group size, "
                        "estimator, task or batch, config.RESUME_CRITICAL, are fixed for a run); train it in "
                        "another --out")
