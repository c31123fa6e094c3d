"""Atomic file writes: everything the project writes beside a run (reports, configs, rewritten logs, data)
goes through a temp file in the same folder and `os.replace`, so a reader or a crash sees the old file or
the new one, never half of one."""

from __future__ import annotations

import os
import tempfile
from typing import IO, Any, Callable


def atomic_write(path: str | os.PathLike, write: Callable[[IO[bytes]], Any]) -> None:
    """Call `write(f)` on a binary temp file, fsync it, and rename it over `path` (folders created)."""
    path = os.fspath(path)
    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=f".{os.path.basename(path)}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise


def atomic_write_text(path: str | os.PathLike, text: str) -> None:
    atomic_write(path, lambda f: f.write(text.encode("utf-8")))
