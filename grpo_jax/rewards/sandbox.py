"""Run untrusted, model-written Python in a separate, confined process, and a bounded pool of them.

Model-written code never runs in the calling (trainer) process. Each run is a fresh interpreter
(`python -S -s -P`, no site-packages) started through the trusted harness `_sandbox_runner.py`, with:

- a fresh temporary directory as cwd, removed afterwards; an environment holding only PYTHONHASHSEED=0
  and PYTHONUTF8=1 (so output is deterministic), nothing inherited from the parent;
- rlimits: CPU seconds, address space, process count, file size, open files, no core dumps;
- a wall-clock limit and a cap on stdout/stderr, after which the whole process group is SIGKILLed;
- isolation layers, each used when this machine allows it (`capabilities()` says which):
  * `net_namespace` / `pid_namespace`: `unshare --net --pid --fork --kill-child` (as root, else in a
    user namespace). No network interfaces but a down loopback; the sandbox is PID 1 of its own
    namespace, so `os.getppid()` is 0, and when it dies the kernel kills every process it forked,
    including ones that escaped the process group with setsid;
  * `drop_uid` (when started as root): the code runs as a fresh unprivileged uid, so it cannot
    signal, ptrace or read the environment of the caller, write outside world-writable directories,
    and RLIMIT_NPROC (which root ignores) bounds fork bombs;
  * `landlock`: writes only inside the temp dir, reads only the stdlib and system libraries (so not
    the dataset with the reference answers), no TCP bind/connect, and (ABI >= 6) no signals to
    processes outside the sandbox;
  * `seccomp`: `socket()` and `io_uring_setup()` fail with EACCES, the fallback "block sockets" layer.

A test-mode pass is decided here, not by the program: the harness writes a per-run random nonce to a
pipe only after the solution, the tests and `check(entry_point)` returned normally. Residual risk,
stated plainly: solution and tests share one interpreter, so code that deliberately introspects the
harness (frames, gc) or returns objects with a rigged `__eq__` can still fool assert-based tests;
stdin/stdout tests are compared by the parent and are immune to both.
"""

from __future__ import annotations

import contextlib
import functools
import marshal
import os
import platform
import secrets
import selectors
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TypeVar

_RUNNER_SOURCE = (Path(__file__).with_name("_sandbox_runner.py")).read_text()
_SETUP_FAILED = 121  # exit codes of _sandbox_runner.py
_CPU_LIMIT_EXIT = 152
_LAYERS = ("net_namespace", "pid_namespace", "drop_uid", "landlock", "seccomp")
_SYSTEM_READ_PATHS = ("/usr", "/lib", "/lib32", "/lib64", "/bin", "/etc/ld.so.cache")
_ENV = {"PYTHONHASHSEED": "0", "PYTHONUTF8": "1"}

T = TypeVar("T")
R = TypeVar("R")


@dataclass(frozen=True)
class Limits:
    """Resource limits for one sandboxed run (each applies to every process of the run)."""

    wall_s: float = 5.0  # wall clock for the whole process tree, then SIGKILL to the group
    cpu_s: float = 4.0  # CPU seconds per process (RLIMIT_CPU, rounded up to whole seconds)
    memory_mb: int = 512  # address space per process (RLIMIT_AS)
    max_processes: int = 16  # RLIMIT_NPROC for the sandbox uid (bounds fork bombs)
    max_output_bytes: int = 1 << 20  # stdout cap; exceeding it kills the run ("output_limit")
    max_stderr_bytes: int = 64 << 10  # stderr cap, same treatment
    max_file_bytes: int = 16 << 20  # RLIMIT_FSIZE: largest file the code may write
    max_open_files: int = 64  # RLIMIT_NOFILE

    def __post_init__(self) -> None:
        for name, value in asdict(self).items():
            if not isinstance(value, (int, float)) or isinstance(value, bool) or value <= 0:
                raise ValueError(f"Limits.{name} must be a positive number, got {value!r}")


@dataclass(frozen=True)
class Isolation:
    """Which isolation layers to use: None = use if this machine allows it, True = require, False = off."""

    net_namespace: bool | None = None
    pid_namespace: bool | None = None
    drop_uid: bool | None = None
    landlock: bool | None = None
    seccomp: bool | None = None


@dataclass(frozen=True)
class SandboxResult:
    """Outcome of one run. `passed` is the harness's verdict (tests mode), never the program's."""

    status: str  # ok | error | memory | timeout | cpu_limit | file_limit | output_limit | killed | setup_failed
    returncode: int | None
    stdout: str
    stderr: str
    wall_s: float
    passed: bool = False  # tests mode: nonce seen and clean exit; stdin/stdout mode: clean exit
    layers: tuple[str, ...] = field(default_factory=tuple)


# ------------------------------------------------------------------------------------ capabilities


def _landlock_abi() -> int:
    """Landlock ABI version of the running kernel (0 if absent); the probe has no side effects."""
    if sys.platform != "linux":
        return 0
    try:
        import ctypes  # here: only the Linux capability probe needs it

        libc = ctypes.CDLL(None, use_errno=True)
        libc.syscall.restype = ctypes.c_long
        abi = libc.syscall(ctypes.c_long(444), None, ctypes.c_long(0), ctypes.c_long(1))
        return max(0, int(abi))
    except (OSError, AttributeError):
        return 0


def _unshare_prefix(net: bool, pid: bool, user: bool, binary: str = "unshare") -> list[str]:
    args = [binary] + (["--user", "--map-root-user"] if user else [])
    args += ["--net"] if net else []
    args += ["--pid", "--fork", "--kill-child"] if pid else []
    return args + ["--"]


def _try(cmd: list[str]) -> bool:
    try:
        return subprocess.run(cmd, capture_output=True, timeout=10, env=_ENV).returncode == 0
    except (OSError, subprocess.SubprocessError):
        return False


def _probe_namespaces(binary: str | None) -> tuple[bool, bool, bool]:
    """(net, pid, needs_user_namespace) that `unshare` can give us here."""
    if binary is None:
        return False, False, False
    true = [shutil.which("true") or "/bin/true"]
    for user in (False, True):
        if _try(_unshare_prefix(True, True, user, binary) + true):
            return True, True, user
        net = _try(_unshare_prefix(True, False, user, binary) + true)
        pid = _try(_unshare_prefix(False, True, user, binary) + true)
        if net or pid:
            return net, pid, user
    return False, False, False


_CAPS_LOCK = threading.Lock()


@functools.lru_cache(maxsize=1)
def _capabilities_cached() -> dict[str, object]:
    unshare = shutil.which("unshare")
    net, pid, user = _probe_namespaces(unshare)
    caps: dict[str, object] = {
        "unshare": unshare or "",
        "net_namespace": net,
        "pid_namespace": pid,
        "user_namespace": user,
        "drop_uid": hasattr(os, "geteuid") and os.geteuid() == 0 and not user,
        "landlock": _landlock_abi() > 0,
        "landlock_abi": _landlock_abi(),
        "seccomp": sys.platform == "linux" and platform.machine() in ("x86_64", "aarch64"),
        "machine": platform.machine(),
    }
    # A layer the kernel advertises can still be refused (e.g. inside some containers): verify each by
    # running the harness once with everything on, switching off whatever it reports as failing.
    for _ in range(len(_LAYERS)):
        layers = {k: bool(caps[k]) for k in _LAYERS}
        result = _run_once("pass", None, None, "", Limits(wall_s=10.0), layers, caps)
        if result.status != "setup_failed":
            break
        failed = _failed_layer(result.stderr)
        if failed not in _LAYERS or not caps[failed]:
            break
        caps[failed] = False
    return caps


def capabilities() -> dict[str, object]:
    """Which isolation layers this machine allows (probed once per process, then cached)."""
    with _CAPS_LOCK:
        return dict(_capabilities_cached())


def resolve_layers(isolation: Isolation) -> dict[str, bool]:
    """The layers a run will use: requested-and-available; a required but unavailable layer is an error."""
    caps = capabilities()
    layers = {}
    for name in _LAYERS:
        want = getattr(isolation, name)
        if want and not caps[name]:
            raise RuntimeError(f"sandbox layer {name!r} was required but this machine does not allow it: {caps}")
        layers[name] = bool(caps[name]) if want is None else bool(want)
    return layers


def _failed_layer(stderr: str) -> str | None:
    for line in stderr.splitlines():
        if line.startswith("sandbox_setup_failed:"):
            return line.split(":")[1]
    return None


# ------------------------------------------------------------------------------------ one run


def _interpreter_args() -> list[str]:
    flags = ["-S", "-s"] + (["-P"] if sys.version_info >= (3, 11) else [])
    return [sys.executable, *flags, "-c", _RUNNER_SOURCE]


def _remove_tree(path: str) -> None:
    """rmtree that also handles directories the code made unreadable (chmod 000)."""

    def fix_and_retry(func: Callable, p: str, _exc: object) -> None:
        try:
            os.chmod(os.path.dirname(p), 0o700)
            os.chmod(p, 0o700)
            func(p)
        except OSError:
            pass

    shutil.rmtree(path, onerror=fix_and_retry)


def _read_streams(proc: subprocess.Popen, deadline: float, limits: Limits) -> tuple[bytes, bytes, str | None]:
    """Read stdout/stderr until EOF, the deadline, or a cap; returns (out, err, reason-to-kill)."""
    caps = {proc.stdout: limits.max_output_bytes, proc.stderr: limits.max_stderr_bytes}
    data: dict = {proc.stdout: bytearray(), proc.stderr: bytearray()}
    sel = selectors.DefaultSelector()
    for stream in caps:
        os.set_blocking(stream.fileno(), False)
        sel.register(stream, selectors.EVENT_READ)
    try:
        while sel.get_map():
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return bytes(data[proc.stdout]), bytes(data[proc.stderr]), "timeout"
            for key, _ in sel.select(timeout=min(remaining, 0.5)):
                chunk = os.read(key.fileobj.fileno(), 1 << 16)
                if not chunk:
                    sel.unregister(key.fileobj)
                    continue
                buf = data[key.fileobj]
                buf += chunk[: caps[key.fileobj] - len(buf) + 1]
                if len(buf) > caps[key.fileobj]:
                    del buf[caps[key.fileobj] :]
                    return bytes(data[proc.stdout]), bytes(data[proc.stderr]), "output_limit"
    finally:
        sel.close()
    return bytes(data[proc.stdout]), bytes(data[proc.stderr]), None


def _wait_until(proc: subprocess.Popen, deadline: float) -> bool:
    """Wait for the group leader without reaping it, so its pid (= process group id) stays reserved
    and the following killpg cannot hit an unrelated group."""
    while time.monotonic() < deadline:
        try:
            info = os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
        except ChildProcessError:
            return True
        if info is not None:
            return True
        time.sleep(0.002)
    return False


def _status(returncode: int | None, kill_reason: str | None, stderr: str) -> str:
    if kill_reason:
        return kill_reason
    if returncode == _SETUP_FAILED and "sandbox_setup_failed:" in stderr:
        return "setup_failed"
    if returncode in (-signal.SIGXCPU, _CPU_LIMIT_EXIT):
        return "cpu_limit"
    if returncode == -signal.SIGXFSZ:
        return "file_limit"
    if returncode == -signal.SIGKILL or (returncode == 1 and "unshare: sigprocmask" in stderr[-200:]):
        return "killed"  # the second form: util-linux unshare could not re-raise the child's SIGKILL
    if returncode:
        return "memory" if "MemoryError" in stderr else "error"
    return "ok"


def _job(
    program: str,
    tests: str | None,
    entry_point: str | None,
    limits: Limits,
    layers: dict,
    caps: dict,
    uid: int | None,
    nonce: bytes,
) -> bytes:
    """The harness's instructions, marshalled (the runner imports marshal faster than json)."""
    return marshal.dumps(
        {
            "program": program,
            "tests": tests,
            "entry_point": entry_point,
            "nonce": nonce,
            "uid": uid,
            "layers": layers,
            "landlock_abi": caps.get("landlock_abi", 0),
            "machine": caps.get("machine", ""),
            "read_paths": [p for p in _SYSTEM_READ_PATHS if os.path.exists(p)],
            "limits": {
                "cpu_s": limits.cpu_s,
                "memory_bytes": int(limits.memory_mb) << 20,
                "max_processes": int(limits.max_processes),
                "max_file_bytes": int(limits.max_file_bytes),
                "max_open_files": int(limits.max_open_files),
            },
        }
    )


def _spawn(workdir: str, job: bytes, stdin: str, marker_w: int, layers: dict, caps: dict) -> subprocess.Popen:
    """Start the harness. The job (with the nonce) and stdin go through unlinked temporary files: no
    path to find them by, no pipe to block on, and the harness closes the job fd before any user code."""
    ns = layers["net_namespace"] or layers["pid_namespace"]
    user = bool(caps["user_namespace"])
    prefix = _unshare_prefix(layers["net_namespace"], layers["pid_namespace"], user, str(caps["unshare"])) if ns else []
    with tempfile.TemporaryFile() as job_file, tempfile.TemporaryFile() as stdin_file:
        job_file.write(job)
        job_file.seek(0)
        stdin_file.write(stdin.encode("utf-8", "surrogatepass"))
        stdin_file.seek(0)
        job_fd = job_file.fileno()
        return subprocess.Popen(
            prefix + _interpreter_args() + [str(job_fd), str(marker_w)],
            stdin=stdin_file,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            cwd=workdir,
            env=_ENV,
            start_new_session=True,
            pass_fds=(job_fd, marker_w),
            close_fds=True,
        )


def _read_marker(marker_r: int) -> bytes:
    os.set_blocking(marker_r, False)
    try:
        return os.read(marker_r, 256)
    except BlockingIOError:
        return b""


def _run_once(
    program: str, tests: str | None, entry_point: str | None, stdin: str, limits: Limits, layers: dict, caps: dict
) -> SandboxResult:
    t0 = time.monotonic()
    deadline = t0 + limits.wall_s
    workdir = tempfile.mkdtemp(prefix="grpo_sbx_")
    uid = 1_000_000 + secrets.randbelow(1_000_000_000) if layers["drop_uid"] else None
    nonce = secrets.token_bytes(16)
    marker_r, marker_w = os.pipe()
    proc = None
    try:
        if uid is not None:
            os.chown(workdir, uid, uid)
        job = _job(program, tests, entry_point, limits, layers, caps, uid, nonce)
        proc = _spawn(workdir, job, stdin, marker_w, layers, caps)
        os.close(marker_w)
        marker_w = -1
        out, err, kill_reason = _read_streams(proc, deadline, limits)
        if kill_reason is None and not _wait_until(proc, deadline):
            kill_reason = "timeout"
        _kill_tree(proc, uid, layers)
        returncode = proc.wait()
        stderr = err.decode("utf-8", "replace")
        status = _status(returncode, kill_reason, stderr)
        passed = status == "ok" and (tests is None or _read_marker(marker_r) == nonce)
        return SandboxResult(
            status,
            returncode,
            out.decode("utf-8", "replace"),
            stderr[-4000:],
            time.monotonic() - t0,
            passed,
            tuple(k for k in _LAYERS if layers[k]),
        )
    finally:
        _cleanup(proc, (marker_r, marker_w), workdir)


def _cleanup(proc: subprocess.Popen | None, fds: tuple[int, ...], workdir: str) -> None:
    if proc is not None:
        if proc.returncode is None:  # an exception on the way: never leave the tree running
            _kill_group(proc)
            proc.wait()
        for stream in (proc.stdout, proc.stderr):
            if stream is not None:
                stream.close()
    for fd in fds:
        if fd >= 0:
            os.close(fd)
    _remove_tree(workdir)


def _kill_group(proc: subprocess.Popen) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)


def _kill_tree(proc: subprocess.Popen, uid: int | None, layers: dict) -> None:
    """Kill everything the run started, including processes that left the group with setsid, and
    return only once they are gone (their copies of the output pipes are closed)."""
    _kill_group(proc)
    if uid is not None and not layers["pid_namespace"]:
        # Without a PID namespace, the run's own uid reaches every process it started: kill(-1) as that
        # uid signals exactly those (and never the caller, which runs under another uid).
        with contextlib.suppress(OSError, subprocess.SubprocessError):
            subprocess.run(
                ["/bin/sh", "-c", "kill -9 -1"],
                user=uid, group=uid, extra_groups=[], env=_ENV, timeout=10, capture_output=True,
            )  # fmt: skip
    _drain(proc, time.monotonic() + 2.0)


def _drain(proc: subprocess.Popen, deadline: float) -> None:
    """Read the output pipes to EOF: EOF means no process of the run holds them any more."""
    open_streams = [s for s in (proc.stdout, proc.stderr) if s is not None and not s.closed]
    while open_streams and time.monotonic() < deadline:
        for stream in list(open_streams):
            try:
                if not os.read(stream.fileno(), 1 << 16):
                    open_streams.remove(stream)
            except BlockingIOError:
                pass
        if open_streams:
            time.sleep(0.005)


def run_program(
    program: str,
    *,
    tests: str | None = None,
    entry_point: str | None = None,
    stdin: str = "",
    limits: Limits = Limits(),
    isolation: Isolation = Isolation(),
) -> SandboxResult:
    """Run `program` confined. With `tests`, the test code (and `check(entry_point)`) runs after it
    and `passed` means all of it completed; without, `passed` means a clean exit (compare stdout)."""
    if entry_point is not None and not entry_point.isidentifier():
        raise ValueError(f"entry_point must be a Python identifier, got {entry_point!r}")
    if tests is None and entry_point is not None:
        raise ValueError("entry_point needs tests that define check()")
    layers = resolve_layers(isolation)
    return _run_once(program, tests, entry_point, stdin, limits, layers, capabilities())


# ------------------------------------------------------------------------------------ pool


class SandboxPool:
    """A bounded pool of sandboxed processes: at most `max_workers` run at once.

    Every task is a fresh process (no state can leak from one program to the next), so the workers
    here are threads that only start sandboxes and wait on them; the trainer never forks (unsafe in a
    multi-threaded JAX process) and no worker process can be poisoned or killed by the code it ran.
    """

    def __init__(self, max_workers: int = 2) -> None:
        if max_workers < 1:
            raise ValueError(f"max_workers must be >= 1, got {max_workers}")
        self.max_workers = max_workers
        self._executor = ThreadPoolExecutor(max_workers=max_workers, thread_name_prefix="sandbox")

    def submit(self, fn: Callable[[T], R], item: T) -> Future[R]:
        """Schedule `fn(item)`; the future's result is what `fn` returns."""
        return self._executor.submit(fn, item)

    def map(self, fn: Callable[[T], R], items: Iterable[T]) -> list[R]:
        """`[fn(x) for x in items]` with up to `max_workers` calls (each running sandboxes) at once."""
        return list(self._executor.map(fn, items))

    def close(self) -> None:
        self._executor.shutdown(wait=True)

    def __enter__(self) -> SandboxPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
