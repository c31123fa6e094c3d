"""The run folder's lock: a second process is refused naming the holder, a dead holder's lock is taken over
with a warning, another host's is refused, and within one process the lock is reentrant."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import warnings

import pytest

from grpo_jax import runlock

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

HOLD = ("import sys, time\n"
        "from grpo_jax import runlock\n"
        "lock = runlock.acquire(sys.argv[1])\n"
        "print('held', flush=True)\n"
        "time.sleep(float(sys.argv[2]))\n"
        "lock.release()\n")


def _holder(out, seconds: float) -> subprocess.Popen:
    """A process that holds out's lock for `seconds`, started and holding when this returns."""
    proc = subprocess.Popen([sys.executable, "-c", HOLD, str(out), str(seconds)], cwd=ROOT, stdout=subprocess.PIPE,
                            text=True)
    assert proc.stdout.readline() == "held\n"
    return proc


def test_a_second_process_is_refused_naming_the_holder_and_a_dead_holders_lock_is_taken_over(tmp_path, monkeypatch):
    holder = _holder(tmp_path, 3600)  # holds until it is killed below
    tries = []
    try:
        with monkeypatch.context() as patch:
            patch.setattr(runlock, "_try_lock", lambda path, _try=runlock._try_lock: tries.append(path) or _try(path))
            with pytest.raises(runlock.RunLocked, match=rf"in use by another run: pid {holder.pid} on host "
                                                        rf"{socket.gethostname()} .*run.lock"):
                runlock.acquire(str(tmp_path))
        # refused at once: after one try at the lock, no retry, while the holder still holds it. A count, where a
        # bound on the elapsed time fails on a loaded machine.
        assert len(tries) == 1 and holder.poll() is None
    finally:
        os.kill(holder.pid, signal.SIGKILL)  # as kill -9 leaves it: the file stays, the flock goes
        holder.wait()
    assert json.loads((tmp_path / "run.lock").read_text())["pid"] == holder.pid
    with pytest.warns(RuntimeWarning, match=rf"taking over a stale lock .*pid {holder.pid} .* is not running"):
        lock = runlock.acquire(str(tmp_path))
    assert json.loads((tmp_path / "run.lock").read_text())["pid"] == os.getpid()
    lock.release()
    assert not (tmp_path / "run.lock").exists()


def test_the_lock_is_reentrant_within_a_process_and_released_with_its_last_handle(tmp_path):
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a fresh folder: nothing to warn about
        first = runlock.acquire(str(tmp_path))
        second = runlock.acquire(str(tmp_path / "."))  # the same folder, spelled differently
    third = second.again()
    for handle in (first, second, first):  # releasing a handle twice counts once
        handle.release()
        assert (tmp_path / "run.lock").exists()
    third.release()
    assert not (tmp_path / "run.lock").exists()
    runlock.acquire(str(tmp_path)).release()  # free again


def test_a_lock_file_of_another_host_is_refused_and_kept(tmp_path):
    other = {"pid": 12345, "host": "elsewhere.example", "started": 0.0, "command": "python -m grpo_jax.train"}
    (tmp_path / "run.lock").write_text(json.dumps(other))
    with pytest.raises(runlock.RunLocked, match="pid 12345 on host elsewhere.example .*another host.*delete the lock"):
        runlock.acquire(str(tmp_path))
    assert json.loads((tmp_path / "run.lock").read_text()) == other


def test_wait_takes_the_lock_once_the_holder_releases_it(tmp_path):
    holder = _holder(tmp_path, 1.0)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # released properly: no stale lock to take over
        lock = runlock.acquire(str(tmp_path), wait=60)
    assert holder.wait(timeout=60) == 0
    assert json.loads((tmp_path / "run.lock").read_text())["pid"] == os.getpid()
    lock.release()
