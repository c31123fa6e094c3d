"""Sandbox mechanics: limits, environment, temp dir, per-layer network isolation, the bounded pool."""

import contextlib
import os
import socket
import threading

import pytest

from grpo_jax.rewards.sandbox import Isolation, Limits, SandboxPool, capabilities, resolve_layers, run_program

LAYERS = ("net_namespace", "pid_namespace", "ipc_namespace", "private_shm", "drop_uid", "landlock", "seccomp")
CONNECT = "import socket\nsocket.create_connection(('127.0.0.1', {port}), timeout=1)\nprint('CONNECTED')"


def test_capabilities_report_every_layer():
    caps = capabilities()
    assert set(LAYERS) <= set(caps)
    assert all(isinstance(caps[k], bool) for k in LAYERS)


def test_required_but_unavailable_layer_is_an_error(monkeypatch):
    import grpo_jax.rewards.sandbox as sb

    monkeypatch.setattr(sb, "capabilities", lambda: {**{k: False for k in LAYERS}})
    with pytest.raises(RuntimeError, match="landlock"):
        resolve_layers(Isolation(landlock=True))
    assert resolve_layers(Isolation()) == {k: False for k in LAYERS}


def test_limits_are_validated():
    with pytest.raises(ValueError, match="wall_s"):
        Limits(wall_s=0)
    with pytest.raises(ValueError, match="memory_mb"):
        Limits(memory_mb=-1)


def test_stdout_stdin_and_exit_status():
    r = run_program("import sys\nprint(sys.stdin.read().upper())", stdin="abc\n")
    assert (r.status, r.passed, r.stdout) == ("ok", True, "ABC\n\n")
    r = run_program("raise ValueError('boom')")
    assert r.status == "error" and not r.passed and "ValueError: boom" in r.stderr


def test_tests_mode_pass_needs_the_harness_marker():
    tests = "def check(f):\n    assert f(3) == 6\n"
    assert run_program("def double(x):\n    return 2 * x\n", tests=tests, entry_point="double").passed
    assert not run_program("def double(x):\n    return 3 * x\n", tests=tests, entry_point="double").passed
    # a clean exit that skips the tests: exit status 0, but no marker
    r = run_program("import sys\nsys.exit(0)\n", tests=tests, entry_point="double")
    assert (r.status, r.passed) == ("ok", False)


def test_environment_is_empty_but_deterministic(monkeypatch):
    monkeypatch.setenv("GRPO_SHOULD_NOT_LEAK", "1")
    r = run_program("import os\nprint(sorted(os.environ))\nprint(hash('grpo'))")
    names, hash_line = r.stdout.splitlines()
    assert "GRPO_SHOULD_NOT_LEAK" not in names and "PATH" not in names and "HOME" not in names
    assert run_program("print(hash('grpo'))").stdout.strip() == hash_line  # PYTHONHASHSEED=0


def test_fresh_temp_dir_is_cwd_and_is_removed():
    r = run_program("import os\nopen('scratch.txt', 'w').write('x')\nprint(os.getcwd())\nprint(os.listdir('.'))")
    cwd, listing = r.stdout.splitlines()
    assert os.path.basename(cwd).startswith("grpo_sbx_") and listing == "['scratch.txt']"
    assert not os.path.exists(cwd)


def test_wall_limit_and_output_cap():
    # "timeout" is the supervisor's verdict when it killed the run at its wall limit: a program that slept its
    # 30 s out would end "ok". No bound on the elapsed time, which a loaded machine stretches.
    r = run_program("import time\ntime.sleep(30)", limits=Limits(wall_s=0.5))
    assert r.status == "timeout"
    r = run_program("print('y' * 5000)", limits=Limits(max_output_bytes=1000))
    assert r.status == "output_limit" and len(r.stdout) <= 1000


def test_stderr_keeps_its_tail_and_has_a_high_cap():
    """A chatty program is not stopped at 64 KiB of stderr; the end (where a traceback is) is kept."""
    r = run_program("import sys\nsys.stderr.write('x' * 300_000 + 'END')\nprint('done')")
    assert (r.status, r.stdout) == ("ok", "done\n") and r.stderr.endswith("xEND")
    r = run_program("import sys\nsys.stderr.write('y' * 5000)", limits=Limits(max_stderr_bytes=1000))
    assert r.status == "output_limit"


def test_stdin_can_be_reopened_by_path():
    for path in ("/dev/stdin", "/proc/self/fd/0"):
        r = run_program(f"print(open({path!r}).read().upper())", stdin="abc")
        assert (r.status, r.stdout) == ("ok", "ABC\n"), r.stderr


def test_cpu_limit_counts_cpu_not_wall():
    # the CPU limit ended the loop, not the 10 s wall limit (whose status is "timeout"); the status says which
    # limit fired whatever the machine's load, where a bound on r.wall_s would not
    r = run_program("while True:\n    pass", limits=Limits(wall_s=10.0, cpu_s=1.0))
    assert r.status in ("cpu_limit", "killed")


def test_memory_limit():
    r = run_program("x = bytearray(2 * 2**30)", limits=Limits(memory_mb=256))
    assert r.status == "memory"


@pytest.mark.parametrize("layer", ["net_namespace", "landlock", "seccomp"])
def test_each_network_layer_alone_blocks_a_local_connection(layer):
    if not capabilities()[layer]:
        pytest.skip(f"{layer} is not available on this machine")
    only = Isolation(**{name: name == layer for name in LAYERS})
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen(1)
        server.settimeout(0.3)
        program = CONNECT.format(port=server.getsockname()[1])
        r = run_program(program, isolation=only)
        assert "CONNECTED" not in r.stdout and r.status == "error"
        with pytest.raises(socket.timeout):
            server.accept()


def test_control_without_network_layers_connects():
    """The layer tests above could fail: with all layers off, the same program does connect."""
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen(1)
        program = CONNECT.format(port=server.getsockname()[1])
        r = run_program(program, isolation=Isolation(**{name: False for name in LAYERS}))
        assert r.stdout.strip() == "CONNECTED"


def test_pool_bounds_concurrency():
    """4 sandboxed programs through a 2-worker pool: two run at once, never more. Checked by what ran where,
    not by the elapsed time (a loaded machine stretches both rounds): every call waits at a barrier for a
    second one, which a serial pool never sends (the barrier breaks after its timeout, only a guard against a
    hang), and at most 2 calls are ever inside the pool's function, on at most 2 threads."""
    barrier, lock = threading.Barrier(2, timeout=120), threading.Lock()
    inside, most_inside, threads = [0], [0], set()

    def task(_):
        with lock:
            inside[0] += 1
            most_inside[0] = max(most_inside[0], inside[0])
            threads.add(threading.get_ident())
        try:
            barrier.wait()  # a second call is running at the same time
            return run_program("print('ok')")
        finally:
            with lock:
                inside[0] -= 1

    with SandboxPool(2) as pool:
        results = pool.map(task, range(4))
    assert all(r.passed and r.stdout == "ok\n" for r in results)
    assert most_inside[0] == 2 and len(threads) == 2


def test_pool_rejects_zero_workers():
    with pytest.raises(ValueError):
        SandboxPool(0)


def test_setup_failure_fails_closed():
    """If a requested layer cannot be applied, the program never runs and the status says so."""
    from grpo_jax.rewards import sandbox as sb

    layers = {name: name == "seccomp" for name in LAYERS}
    caps = {**capabilities(), "machine": "an-unknown-architecture"}
    r = sb._run_once("print('RAN')", None, None, "", Limits(), layers, caps)
    assert r.status == "setup_failed" and "RAN" not in r.stdout and not r.passed
    assert sb._failed_layer(r.stderr) == "seccomp"


# --------------------------------------------------------------------------- file metadata (seccomp)

METADATA_ATTEMPTS = """\
import array, ctypes, errno, fcntl, os
path = {path!r}
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long

def attempt(name, action):
    try:
        action()
        print(name, 'ok')
    except OSError as e:
        print(name, errno.errorcode.get(e.errno, e.errno))

def raw(nr, *args):
    if libc.syscall(ctypes.c_long(nr), *[ctypes.c_long(a) if isinstance(a, int) else a for a in args]) < 0:
        code = ctypes.get_errno()
        raise OSError(code, os.strerror(code))

def set_nodump():
    fd = os.open(path, os.O_RDONLY)
    try:
        flags = array.array('l', [0])
        fcntl.ioctl(fd, 0x80086601, flags)  # FS_IOC_GETFLAGS is allowed
        flags[0] |= 0x40  # FS_NODUMP_FL
        fcntl.ioctl(fd, 0x40086602, flags)  # FS_IOC_SETFLAGS is not
    finally:
        os.close(fd)

def fchmod():
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fchmod(fd, 0o777)
    finally:
        os.close(fd)

attempt('chmod', lambda: os.chmod(path, 0o777))
attempt('utime', lambda: os.utime(path, (0, 0)))
attempt('chown', lambda: os.chown(path, 4242, 4242))
attempt('lchown', lambda: os.lchown(path, 4242, 4242))
attempt('setxattr', lambda: os.setxattr(path, 'user.grpo', b'1'))
attempt('removexattr', lambda: os.removexattr(path, 'user.keep'))
if {only_path_calls!r} is False:
    attempt('fchmod', fchmod)
    attempt('ioctl_setflags', set_nodump)
    if {x86_64!r}:
        attempt('fchmodat2', lambda: raw(452, -100, path.encode(), 0o777, 0))
        attempt('process_vm_readv', lambda: raw(310, os.getpid(), 0, 0, 0, 0, 0))
        attempt('ptrace_seize', lambda: raw(101, 0x4206, 999999999, 0, 0))
"""


def _metadata(path) -> tuple:
    st = os.stat(path)
    return st.st_mode, st.st_mtime_ns, st.st_uid, st.st_gid, sorted(os.listxattr(path))


def _metadata_attempts(tmp_path, isolation: Isolation, only_path_calls: bool) -> tuple[dict, tuple, tuple]:
    """Run the attempts on a fresh file of the test's user; (name -> outcome, metadata before, after)."""
    import platform

    target = tmp_path / "victim.txt"
    target.write_text("data")
    os.chmod(target, 0o640)
    os.utime(target, (1_000_000_000, 1_000_000_000))
    with contextlib.suppress(OSError):  # a file system without user xattrs: the attempts are still denied
        os.setxattr(target, "user.keep", b"1")
    before = _metadata(target)
    program = METADATA_ATTEMPTS.format(
        path=str(target), only_path_calls=only_path_calls, x86_64=platform.machine() == "x86_64"
    )
    r = run_program(program, isolation=isolation)
    assert r.status == "ok", r.stderr
    outcomes = dict(line.split() for line in r.stdout.splitlines())
    return outcomes, before, _metadata(target)


def test_seccomp_denies_metadata_changes_without_the_uid_drop(tmp_path):
    """With the uid kept (the case of any non-root trainer), only seccomp stands between sandboxed code
    and the mode, owner, times, xattrs and inode flags of the caller's files."""
    if not capabilities()["seccomp"]:
        pytest.skip("seccomp is not available on this machine")
    only = Isolation(net_namespace=False, pid_namespace=False, drop_uid=False, landlock=False, seccomp=True)
    outcomes, before, after = _metadata_attempts(tmp_path, only, only_path_calls=False)
    assert after == before
    assert outcomes and set(outcomes.values()) == {"EPERM"}, outcomes


def test_seccomp_denies_metadata_changes_with_every_other_layer_on(tmp_path):
    """Landlock has no right covering chmod/utime/chown/xattrs: with the uid kept, seccomp is the guard."""
    if not capabilities()["seccomp"]:
        pytest.skip("seccomp is not available on this machine")
    outcomes, before, after = _metadata_attempts(tmp_path, Isolation(drop_uid=False), only_path_calls=True)
    assert after == before
    assert set(outcomes.values()) == {"EPERM"}, outcomes


def test_control_without_seccomp_metadata_changes_go_through(tmp_path):
    """The two tests above could fail: with the uid kept and seccomp off, chmod and utime do work."""
    off = Isolation(net_namespace=False, pid_namespace=False, drop_uid=False, landlock=False, seccomp=False)
    outcomes, before, after = _metadata_attempts(tmp_path, off, only_path_calls=True)
    assert outcomes["chmod"] == "ok" and outcomes["utime"] == "ok"
    assert after[:2] != before[:2]
