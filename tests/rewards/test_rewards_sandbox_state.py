"""Nothing a sandboxed run leaves behind reaches the next run: SysV shared memory, semaphores and message
queues, POSIX message queues (kernel objects found again by a key or a name) and POSIX shared memory
(files under /dev/shm). A run that could leave state for the next one would turn the repeated runs of a
GRPO group into an oracle ("the grader ran me again": the tests stop at the first failed assert), and a
SysV segment is memory outside the run's limits.

Each object gets a fresh random key or name per test, so these tests cannot see each other's objects or
those of another checkout running them at the same time.
"""

from __future__ import annotations

import ctypes
import os
import secrets

import pytest

from grpo_jax.rewards.sandbox import Isolation, capabilities, run_program

LAYERS = ("net_namespace", "pid_namespace", "ipc_namespace", "drop_uid", "landlock", "seccomp")
SEGMENT_BYTES = 16 << 20  # resident once touched: the run's memory that would outlive it
IPC_CREAT, O_CREAT, O_RDWR = 0o1000, 0o100, 0o2

# `create` and `find` print "created"/"found", or the errno of the failed call.
SYSV_CALLS = {
    "shm": ("libc.shmget({key}, {size}, {flags})", "shm"),
    "msg": ("libc.msgget({key}, {flags})", "msg"),
    "sem": ("libc.semget({key}, 1, {flags})", "sem"),
}
PROGRAM = """\
import ctypes
libc = ctypes.CDLL(None, use_errno=True)
libc.shmat.restype = ctypes.c_void_p
libc.mq_open.argtypes = [ctypes.c_char_p, ctypes.c_int, ctypes.c_uint, ctypes.c_void_p]
result = {call}
if result < 0 or result is None:
    print('errno', ctypes.get_errno())
else:
    if {touch!r}:
        ctypes.memset(libc.shmat(result, None, 0), 1, {size})
    print({done!r})
"""


def _program(kind: str, key: int, create: bool) -> str:
    if kind == "mq":
        call = f"libc.mq_open(b'/grpo_{key}', {O_CREAT | O_RDWR if create else O_RDWR}, 0o666, None)"
    else:
        call = SYSV_CALLS[kind][0].format(key=key, size=SEGMENT_BYTES if create else 0,
                                          flags=IPC_CREAT | 0o666 if create else 0)  # fmt: skip
    return PROGRAM.format(call=call, touch=create and kind == "shm", size=SEGMENT_BYTES,
                          done="created" if create else "found")  # fmt: skip


def _on_host(kind: str, key: int) -> bool:
    """Whether the trainer's own IPC namespace holds the object (SysV: /proc/sysvipc lists it by key)."""
    if kind == "mq":
        return _mq_exists(key)
    with open(f"/proc/sysvipc/{SYSV_CALLS[kind][1]}") as table:
        return any(line.split()[0] == str(key) for line in list(table)[1:])


def _libc():
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mq_open.argtypes = [ctypes.c_char_p, ctypes.c_int, ctypes.c_uint, ctypes.c_void_p]
    return libc


def _mq_exists(key: int) -> bool:
    fd = _libc().mq_open(f"/grpo_{key}".encode(), O_RDWR, 0, None)
    if fd >= 0:
        os.close(fd)
    return fd >= 0


def _remove_from_host(kind: str, key: int) -> None:
    """Clean up after a run that did leave its object behind (the control, or a broken layer)."""
    libc = _libc()
    if kind == "mq":
        libc.mq_unlink(f"/grpo_{key}".encode())
        return
    get, ctl = {"shm": (libc.shmget, libc.shmctl), "msg": (libc.msgget, libc.msgctl),
                "sem": (libc.semget, libc.semctl)}[kind]  # fmt: skip
    ident = get(key, 0, 0) if kind != "msg" else get(key, 0)
    if ident >= 0:
        ctl(ident, 0, 0) if kind == "sem" else ctl(ident, 0, None)  # IPC_RMID (sem: IPC_RMID is 0 too)


def _only(layer: str | None) -> Isolation:
    if layer is None:
        return Isolation()
    if not capabilities()[layer]:
        pytest.skip(f"{layer} is not available on this machine")
    return Isolation(**{name: name == layer for name in LAYERS})


def _two_runs(kind: str, isolation: Isolation) -> tuple[str, bool, str]:
    """(what run 1 said when it created the object, whether the host then holds it, what run 2 found)."""
    key = 1 + secrets.randbelow(2**30)
    try:
        first = run_program(_program(kind, key, create=True), isolation=isolation)
        assert first.status == "ok", first.stderr
        on_host = _on_host(kind, key)
        second = run_program(_program(kind, key, create=False), isolation=isolation)
        assert second.status == "ok", second.stderr
        return first.stdout.strip(), on_host, second.stdout.strip()
    finally:
        _remove_from_host(kind, key)


@pytest.mark.parametrize("kind", ["shm", "msg", "sem", "mq"])
@pytest.mark.parametrize("layer", [None, "ipc_namespace", "seccomp"], ids=["all-layers", "ipc-only", "seccomp-only"])
def test_an_ipc_object_does_not_outlive_its_run(kind, layer):
    """With every layer, and with each of the two layers that guard this alone: the run cannot leave the
    object in the trainer's namespace, and the next run cannot find it. The IPC namespace lets the run use
    one (it dies with the run); seccomp refuses the calls with EPERM."""
    created, on_host, found = _two_runs(kind, _only(layer))
    assert not on_host and found.startswith("errno ")
    if layer == "ipc_namespace":
        assert created == "created"
    if layer == "seccomp":
        assert created == "errno 1"  # EPERM


@pytest.mark.parametrize("kind", ["shm", "msg", "sem", "mq"])
def test_control_without_the_layers_an_ipc_object_outlives_its_run(kind):
    """The test above could fail: with the layers off, the object stays in the trainer's namespace (a
    16 MiB segment resident after its run) and the next run finds it."""
    assert _two_runs(kind, Isolation(**{name: False for name in LAYERS})) == ("created", True, "found")


POSIX_SHM = """\
import os
from multiprocessing import shared_memory
try:
    segment = shared_memory.SharedMemory(name={name!r}, create=True, size=1 << 20)
    segment.buf[:3] = b'abc'
    print('created')
except OSError as e:
    print(type(e).__name__)
try:
    open('/dev/shm/' + {name!r} + '.txt', 'w').write('x')
    print('written')
except OSError as e:
    print(type(e).__name__)
try:
    print(sorted(os.listdir('/dev/shm')))
except OSError as e:
    print(type(e).__name__)
"""


def test_posix_shared_memory_is_out_of_reach_under_landlock():
    """/dev/shm is neither the run's temp dir nor a read path: Landlock refuses creating a segment there
    (`multiprocessing.shared_memory`, or by path), and the trainer's /dev/shm keeps nothing of the run."""
    if not capabilities()["landlock"]:
        pytest.skip("landlock is not available on this machine")
    name = f"grpo_{secrets.token_hex(8)}"
    try:
        r = run_program(POSIX_SHM.format(name=name))
        assert r.status == "ok", r.stderr
        assert r.stdout.splitlines() == ["PermissionError"] * 3  # create, write by path, list
        assert not os.path.exists(f"/dev/shm/{name}") and not os.path.exists(f"/dev/shm/{name}.txt")
    finally:
        for leftover in (f"/dev/shm/{name}", f"/dev/shm/{name}.txt"):
            if os.path.exists(leftover):
                os.unlink(leftover)



POOL = """\
{imports}
def square(x):
    return x * x
if __name__ == "__main__":
    with {pool}(2) as pool:
        print(*pool.map(square, map(int, input().split())))
"""
POOLS = {
    "Pool": "from multiprocessing import Pool",
    "ThreadPool": "from multiprocessing.pool import ThreadPool",  # its change notifier is a multiprocessing queue
    "ProcessPoolExecutor": "from concurrent.futures import ProcessPoolExecutor",
    "ThreadPoolExecutor": "from concurrent.futures import ThreadPoolExecutor",
}


@pytest.mark.parametrize("pool", sorted(POOLS))
def test_multiprocessing_fails_closed_and_threads_work(pool):
    """`multiprocessing`'s locks and queues are POSIX semaphores, which live in /dev/shm, shared by the
    trainer and every run and so out of reach under Landlock (above): a right program that uses them fails
    with an error status, never a pass. `concurrent.futures.ThreadPoolExecutor` needs none and passes."""
    from grpo_jax.rewards import code_reward

    if not capabilities()["landlock"]:
        pytest.skip("landlock is not available on this machine")
    sample = {"io": [{"input": "1 2 3\n", "output": "1 4 9\n"}]}
    program = POOL.format(imports=POOLS[pool], pool=pool)
    result = code_reward("<think>x</think>```python\n" + program + "```", sample)
    if pool == "ThreadPoolExecutor":
        assert result.score == 1.0, result.info
    else:
        assert result.score == 0.0 and result.info["reason"] == "error", result.info
        assert "PermissionError" in result.info["results"][0]["stderr_tail"], result.info
