"""Atomic file writes: everything the project writes beside a run (reports, configs, rewritten logs, data)
goes through a temp file in the same folder and `os.replace`, so a reader or a crash sees the old file or
the new one, never half of one.

Modes: a new file gets what `open(path, "w")` would give it (0666 less the process umask, e.g. 0644 under
umask 022), a rewritten file keeps its current mode; the temp file's private 0600 never reaches the result.
"""

from __future__ import annotations

import os
import stat
import tempfile
from typing import IO, Any, Callable


def current_umask() -> int:
    """The process umask, read from /proc where possible (setting it to read it back races other threads)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def _target_mode(path: str) -> int:
    try:
        return stat.S_IMODE(os.stat(path).st_mode)
    except FileNotFoundError:
        return 0o666 & ~current_umask()


def atomic_write(path: str | os.PathLike, write: Callable[[IO[bytes]], Any]) -> None:
    """Call `write(f)` on a binary temp file, fsync it, and rename it over `path` (folders created)."""
    path = os.fspath(path)
    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=f".{os.path.basename(path)}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            os.fchmod(f.fileno(), _target_mode(path))  # mkstemp makes it 0600
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise


def atomic_write_text(path: str | os.PathLike, text: str) -> None:
    atomic_write(path, lambda f: f.write(text.encode("utf-8")))
