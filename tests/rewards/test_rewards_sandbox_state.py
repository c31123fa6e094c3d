"""Nothing a sandboxed run leaves behind reaches the next run: SysV shared memory, semaphores and message
queues, POSIX message queues (kernel objects found again by a key or a name) and POSIX shared memory
(files under /dev/shm). A run that could leave state for the next one would turn the repeated runs of a
GRPO group into an oracle ("the grader ran me again": the tests stop at the first failed assert), and a
SysV segment is memory outside the run's limits.

Each object gets a fresh random key or name per test, so these tests cannot see each other's objects or
those of another checkout running them at the same time.
"""

from __future__ import annotations

import ast
import ctypes
import os
import secrets

import pytest

from grpo_jax.rewards.sandbox import Isolation, Limits, capabilities, run_program

LAYERS = ("net_namespace", "pid_namespace", "ipc_namespace", "private_shm", "drop_uid", "landlock", "seccomp")
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
import _posixshmem, os  # what multiprocessing.shared_memory calls
try:
    fd = _posixshmem.shm_open('/' + {name!r}, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
    os.ftruncate(fd, 1 << 20)
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


def _posix_shm_runs(isolation: Isolation) -> tuple[list[str], list[str]]:
    """(what a run that creates a segment and a file in /dev/shm said, what the next run said), checking
    that the trainer's /dev/shm holds neither afterwards."""
    name = f"grpo_{secrets.token_hex(8)}"
    leftovers = (f"/dev/shm/{name}", f"/dev/shm/{name}.txt")
    try:
        runs = [run_program(POSIX_SHM.format(name=name), isolation=isolation) for _ in range(2)]
        assert [r.status for r in runs] == ["ok", "ok"], runs[0].stderr + runs[1].stderr
        assert not any(os.path.exists(p) for p in leftovers)
        return runs[0].stdout.splitlines(), runs[1].stdout.splitlines()
    finally:
        for leftover in leftovers:
            if os.path.exists(leftover):
                os.unlink(leftover)


def test_posix_shared_memory_lives_in_the_runs_own_dev_shm():
    """With `private_shm`, /dev/shm is a fresh tmpfs of the run's own mount namespace: the run may create
    segments there (so `multiprocessing` works), the trainer's /dev/shm gets nothing, and the next run
    starts from an empty one."""
    if not capabilities()["private_shm"]:
        pytest.skip("private_shm is not available on this machine")
    first, second = _posix_shm_runs(Isolation())
    assert first[:2] == ["created", "written"] and second[:2] == ["created", "written"], (first, second)
    assert first[2] == second[2] and len(ast.literal_eval(first[2])) == 2, (first, second)  # its own two files


def test_without_a_private_dev_shm_landlock_keeps_it_out_of_reach():
    """/dev/shm shared with the trainer is neither the run's temp dir nor a read path: Landlock refuses
    creating a segment there (`shm_open`, or by path) and listing it."""
    if not capabilities()["landlock"]:
        pytest.skip("landlock is not available on this machine")
    first, second = _posix_shm_runs(Isolation(private_shm=False))
    assert first == second == ["PermissionError"] * 3  # create, write by path, list


def test_the_private_dev_shm_is_capped():
    """Its size is the run's file-size limit: many files below the per-file limit still run out of room."""
    if not capabilities()["private_shm"]:
        pytest.skip("private_shm is not available on this machine")
    program = (
        "import errno\nfor i in range(4):\n    try:\n        open(f'/dev/shm/f{i}', 'wb').write(bytes(6 << 20))\n"
        "    except OSError as e:\n        print(i, errno.errorcode[e.errno])\n        break\n"
    )
    r = run_program(program, limits=Limits(max_file_bytes=16 << 20))
    assert (r.status, r.stdout) == ("ok", "2 ENOSPC\n"), r.stderr


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
POOL_SAMPLE = {"io": [{"input": "1 2 3\n", "output": "1 4 9\n"}]}
POOL_TESTS = {
    "tests": "def check(candidate):\n    assert candidate([1, 2, 3]) == [1, 4, 9]\n",
    "entry_point": "squares",
}
POOL_FUNCTION = """\
from multiprocessing import Pool
def square(x):
    return x * x
def squares(xs):
    with Pool(2) as pool:
        return pool.map(square, xs)
"""


def _score(program: str, sample: dict) -> tuple[float, dict]:
    from grpo_jax.rewards import code_reward

    result = code_reward("<think>x</think>```python\n" + program + "```", sample)
    return result.score, dict(result.info)


@pytest.mark.parametrize("pool", sorted(POOLS))
def test_multiprocessing_works_in_the_runs_own_dev_shm(pool):
    """`multiprocessing`'s locks and queues are POSIX semaphores in /dev/shm: with a private one, its
    pools work, in the stdin/stdout format and inside a function the tests call."""
    if not capabilities()["private_shm"]:
        pytest.skip("private_shm is not available on this machine")
    value, info = _score(POOL.format(imports=POOLS[pool], pool=pool), POOL_SAMPLE)
    assert value == 1.0, info
    if pool == "Pool":
        value, info = _score(POOL_FUNCTION, POOL_TESTS)
        assert value == 1.0, info


def test_without_a_private_dev_shm_multiprocessing_fails_closed():
    """Where the run cannot have its own /dev/shm, Landlock keeps the shared one out of reach: a right
    program that uses a process pool fails with an error status, never a wrong pass."""
    if not capabilities()["landlock"]:
        pytest.skip("landlock is not available on this machine")
    program = POOL.format(imports=POOLS["Pool"], pool="Pool")
    r = run_program(program, stdin="1 2 3\n", isolation=Isolation(private_shm=False))
    assert (r.status, r.passed, r.stdout) == ("error", False, ""), r.stderr
    assert "PermissionError" in r.stderr



SPAWN_POOL = """\
import multiprocessing as mp
def sq(x):
    return x * x
if __name__ == '__main__':
    with mp.get_context('spawn').Pool(2) as p:
        print(p.map(sq, [1, 2, 3]))
"""


def test_the_spawn_start_method_fails_closed():
    """The `spawn` start method starts `sys.executable` anew, which the run cannot (Landlock: the
    interpreter's own directory is not a read path): an error or a timeout, never a pass."""
    if not capabilities()["landlock"]:
        pytest.skip("landlock is not available on this machine")
    r = run_program(SPAWN_POOL, limits=Limits(wall_s=3.0))
    assert r.status != "ok" and not r.passed and r.stdout == "", r.stderr
