"""One process per run folder: ``<out>/run.lock``, an exclusive lock held by the process that runs there.

``acquire(out_dir)`` takes an exclusive ``fcntl.flock`` on ``<out>/run.lock`` and writes the holder into it
(pid, host, start time, command). A second process asking for the same folder gets ``RunLocked``, whose
message names the holder's pid and host, at once (or after ``wait`` seconds of retrying), so two runs never
interleave their logs or mix their checkpoints.

The kernel drops a flock when its process ends, however it ends, so a lock file left behind by a killed run
(same host, its pid no longer running) is taken over with a warning. A file naming another host is refused:
whether that process still runs cannot be checked from here, and a shared file system may not carry flocks
between hosts; the message says to delete the file once that run is over.

Within one process the lock is reentrant: each ``acquire`` returns a handle, and the file is removed when the
last handle of the process is released (a trainer, then the launcher that writes the report after it).
Handles still held when the interpreter exits are released then; a forked child never releases its parent's.
"""

from __future__ import annotations

import atexit
import dataclasses
import fcntl
import json
import os
import socket
import sys
import time
import warnings

LOCK_FILE = "run.lock"


class RunLocked(RuntimeError):
    """Another process holds the run folder's lock; the message names it (pid, host) and the lock file."""


@dataclasses.dataclass
class _Held:
    fd: int  # the open lock file carrying the flock
    count: int  # handles of this process not yet released
    owner: int  # the pid that took it


_HELD: dict[str, _Held] = {}  # lock file path -> what this process holds


class RunLock:
    """One handle on a held run-folder lock; ``release`` is idempotent."""

    def __init__(self, path: str):
        self.path = path
        self._released = False

    def again(self) -> RunLock:
        """Another handle on the same lock (the lock stays until both are released)."""
        if self._released:
            raise RuntimeError(f"{self.path}: this handle was released")
        _HELD[self.path].count += 1
        return RunLock(self.path)

    def release(self) -> None:
        if self._released:
            return
        self._released = True
        held = _HELD.get(self.path)
        if held is None or held.owner != os.getpid():
            return
        held.count -= 1
        if held.count == 0:
            _drop(self.path)


def acquire(out_dir: str, *, wait: float = 0.0) -> RunLock:
    """Lock the run folder `out_dir` (created if missing) for this process; see the module docstring.
    wait: seconds to keep retrying while another process holds it before raising RunLocked."""
    os.makedirs(out_dir, exist_ok=True)
    path = os.path.join(os.path.realpath(out_dir), LOCK_FILE)
    held = _HELD.get(path)
    if held is not None and held.owner == os.getpid():
        held.count += 1
        return RunLock(path)
    deadline = time.monotonic() + wait
    fd = _try_lock(path)
    while fd is None:
        if time.monotonic() >= deadline:
            raise RunLocked(_busy_message(out_dir, path, _read_holder(path, patience=1.0)))
        time.sleep(0.2)
        fd = _try_lock(path)
    try:
        _take_over(out_dir, path, _read_holder(path))
        me = json.dumps({"pid": os.getpid(), "host": socket.gethostname(), "started": time.time(),
                         "command": " ".join(sys.argv)})
        os.ftruncate(fd, 0)
        os.pwrite(fd, (me + "\n").encode(), 0)
        os.fsync(fd)
    except BaseException:
        os.close(fd)
        raise
    _HELD[path] = _Held(fd, 1, os.getpid())
    return RunLock(path)


def _try_lock(path: str) -> int | None:
    """An fd of `path` carrying our exclusive flock, or None while another process holds it."""
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return None
        if _is_file(fd, path):
            return fd
        os.close(fd)  # the holder removed the file between our open and our flock: lock the new one


def _is_file(fd: int, path: str) -> bool:
    try:
        st, now = os.fstat(fd), os.stat(path)
    except FileNotFoundError:
        return False
    return (st.st_dev, st.st_ino) == (now.st_dev, now.st_ino)


def _read_holder(path: str, patience: float = 0.0) -> dict | None:
    """The holder recorded in the lock file (None when empty or unreadable). patience: seconds to wait for
    a holder that has just taken the lock to write itself in."""
    deadline = time.monotonic() + patience
    while True:
        try:
            with open(path, encoding="utf-8") as f:
                text = f.read()
        except OSError:
            text = ""
        if text.strip() or time.monotonic() >= deadline:
            break
        time.sleep(0.05)
    try:
        holder = json.loads(text)
    except ValueError:
        return {"unreadable": text[:200]} if text.strip() else None
    return holder if isinstance(holder, dict) else {"unreadable": text[:200]}


def _describe(holder: dict | None) -> str:
    if not holder or "unreadable" in holder:
        return "an unknown process (the lock file names no holder)"
    started = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(holder.get("started", 0)))
    return (f"pid {holder.get('pid')} on host {holder.get('host')} (started {started}: "
            f"{holder.get('command') or '?'})")


def _busy_message(out_dir: str, path: str, holder: dict | None) -> str:
    return (f"{out_dir} is in use by another run: {_describe(holder)} holds {path}. Wait for it to end, stop it, "
            "or choose another --out")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


def _take_over(out_dir: str, path: str, holder: dict | None) -> None:
    """We hold the flock; the file may still name an earlier holder. Another host's: refused (RunLocked);
    this host's: it no longer runs (or no longer holds it), so the lock is taken over with a warning."""
    if holder is None:
        return
    host = holder.get("host")
    if "unreadable" not in holder and host != socket.gethostname():
        raise RunLocked(f"{out_dir}: {path} names {_describe(holder)}, another host, whose process cannot be "
                        "checked from here; if that run has ended, delete the lock file and start again")
    pid = holder.get("pid")
    state = ("is not running" if isinstance(pid, int) and not _alive(pid) else
             "no longer holds it" if isinstance(pid, int) else "is unknown")
    warnings.warn(f"{out_dir}: taking over a stale lock ({path}): its holder, {_describe(holder)}, {state}",
                  RuntimeWarning, stacklevel=3)


def _drop(path: str) -> None:
    """Remove the lock file (when it is still ours) and close it, which releases the flock."""
    held = _HELD.pop(path)
    try:
        if _is_file(held.fd, path):
            os.unlink(path)
    finally:
        os.close(held.fd)


@atexit.register
def _release_all() -> None:
    for path, held in list(_HELD.items()):
        if held.owner == os.getpid():
            _drop(path)
