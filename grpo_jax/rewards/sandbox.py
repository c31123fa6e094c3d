"""Run untrusted, model-written Python in a separate, confined process, and a bounded pool of them.

Model-written code never runs in the calling (trainer) process. Each run is a fresh interpreter
(`python -S -s -P`, no site-packages; the harness finds the allowed third-party packages, numpy, at
their own directories) started through the trusted harness in `sandbox_runner/`, with:

- a fresh temporary directory as cwd, removed afterwards; an environment holding only PYTHONHASHSEED=0
  and PYTHONUTF8=1 (so output is deterministic) and OPENBLAS_NUM_THREADS=OMP_NUM_THREADS=1 (numpy's
  BLAS in one thread), nothing inherited from the parent;
- rlimits: CPU seconds, address space, process count, file size, open files, no core dumps;
- a wall-clock limit and caps on stdout (1 MiB) and stderr (16 MiB, of which the last 64 KiB are kept),
  after which the whole process group is SIGKILLed; stdin is a file the code may also open by path;
- isolation layers, each used when this machine allows it (`capabilities()` says which):
  * `net_namespace` / `pid_namespace`: `unshare --net --pid --fork --kill-child` (as root, else in a
    user namespace). No network interfaces but a down loopback; the sandbox is PID 1 of its own
    namespace, so `os.getppid()` is 0, and when it dies the kernel kills every process it forked,
    including ones that escaped the process group with setsid;
  * `ipc_namespace`: `unshare --ipc`: SysV shared memory, semaphores and message queues and POSIX
    message queues made by the code live in the run's own IPC namespace and die with it, so nothing
    of one run is found by the next (seccomp also refuses those calls, for machines without it);
  * `private_shm`: `unshare --mount`, where the harness mounts a fresh, size-capped tmpfs on /dev/shm
    that Landlock lets the run write: POSIX semaphores and shared memory (`multiprocessing`) work and
    die with the run; without it, Landlock keeps the shared /dev/shm out of reach;
  * `drop_uid` (when started as root): the code runs as a fresh unprivileged uid, so it cannot
    signal, ptrace or read the environment of the caller, write outside world-writable directories,
    and RLIMIT_NPROC (which root ignores) bounds fork bombs;
  * `landlock`: writes only inside the temp dir, reads only the stdlib and system libraries (both
    without their site-packages/dist-packages), the allowed packages and stdin (so not the dataset
    with the reference answers, nor another installed package), no TCP bind/connect, and
    (ABI >= 6) no signals to processes outside the sandbox;
  * `seccomp`: `socket()` and `io_uring_setup()` fail with EACCES (the fallback "block sockets" layer);
    the calls that change a file's mode, owner, times, extended attributes or inode flags (chmod,
    chown, utime families, *xattr, FS_IOC_SETFLAGS) and those that reach another process's memory
    (ptrace, process_vm_readv/writev) fail with EPERM. Landlock has no right for the former, so
    without the uid drop they would reach the caller's own files. So do the calls that make or reach
    kernel objects found again by a key or a name (SysV IPC, POSIX message queues, keyrings), which
    would outlive the run.

Test mode runs two sandboxed processes joined by two pipes: the solution's, which runs the program and
then answers calls to its functions with plain data (None, bool, numbers, str, bytes, Fraction,
Decimal, range, and lists, tuples, sets, frozensets, dicts, OrderedDicts, Counters, defaultdicts,
deques and bytearrays of them; an iterator stays there and its items are fetched as the tests take
them; anything else fails the call), and the tests', a fresh interpreter that never loads the solution
and runs the tests against local stubs of its functions. Aliasing, identity with the arguments and the
arguments' changes in place cross too, so a call behaves as in one interpreter (docs/sandbox.md). The
pass is decided in the tests' process: it writes a per-run random nonce, which only it is given, to a
pipe only it holds, after the tests and `check(entry_point)` returned normally, no call failed and at
least one was made. So what the solution does inside its own interpreter (patched builtins, import
hooks, frame walking, gc, trace hooks, objects with rigged comparisons, forged replies) cannot reach
anything the verdict depends on. What remains possible is described in docs/sandbox.md (a wrong
answer the tests do not catch; helpers the tests take from the solution, as in some HumanEval tasks;
weaker process separation when no uid is dropped and Landlock is absent).
"""

from __future__ import annotations

import contextlib
import functools
import glob
import importlib.util
import os
import platform
import secrets
import selectors
import shutil
import signal
import site
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from typing import TypeVar

from grpo_jax.rewards.sandbox_runner.bundle import bundle
from grpo_jax.rewards.sandbox_runner.job import CPU_LIMIT_EXIT, PEER_GONE, SETUP_FAILED, SETUP_FAILED_LINE, dump_job

_RUNNER_SOURCE = bundle()  # the runner's modules as one `python -c` source (it cannot import the package)
_LAYERS = ("net_namespace", "pid_namespace", "ipc_namespace", "private_shm", "drop_uid", "landlock", "seccomp")
_SYSTEM_READ_PATHS = ("/usr", "/lib", "/lib32", "/lib64", "/bin", "/etc/ld.so.cache")
# Deterministic output; numpy's BLAS in one thread (RLIMIT_NPROC and RLIMIT_CPU count every thread).
_ENV = {"PYTHONHASHSEED": "0", "PYTHONUTF8": "1", "OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1"}
_STDERR_KEPT = 64 << 10  # the tail of a process's stderr that is kept (tracebacks end there)
_PACKAGES = ("numpy",)  # third-party packages sandboxed code may import, when installed here

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
    max_stderr_bytes: int = 16 << 20  # stderr cap, same treatment (only the last 64 KiB are kept)
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
    ipc_namespace: bool | None = None
    private_shm: bool | None = None
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
    passed: bool = False  # tests mode: the tests' process wrote the nonce and exited cleanly; else clean exit
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


_UNSHARE_ARGS = {  # the namespace layers and how `unshare` makes each
    "net_namespace": ["--net"],
    "ipc_namespace": ["--ipc"],
    "private_shm": ["--mount", "--propagation", "private"],  # the runner mounts its own /dev/shm there
    "pid_namespace": ["--pid", "--fork", "--kill-child"],
}


def _unshare_prefix(namespaces: Iterable[str], user: bool, binary: str = "unshare") -> list[str]:
    """The `unshare` command line that puts a run into the given namespace layers (in a user namespace
    where that is what lets an unprivileged caller make them)."""
    args = [binary] + (["--user", "--map-root-user"] if user else [])
    for layer, layer_args in _UNSHARE_ARGS.items():
        args += layer_args if layer in namespaces else []
    return args + ["--"]


def _try(cmd: list[str]) -> bool:
    try:
        return subprocess.run(cmd, capture_output=True, timeout=10, env=_ENV).returncode == 0
    except (OSError, subprocess.SubprocessError):
        return False


def _probe_namespaces(binary: str | None) -> tuple[dict[str, bool], bool]:
    """({namespace layer: whether `unshare` can make it here}, whether that needs a user namespace)."""
    none = {layer: False for layer in _UNSHARE_ARGS}
    if binary is None:
        return none, False
    true = [shutil.which("true") or "/bin/true"]
    for user in (False, True):
        if _try(_unshare_prefix(_UNSHARE_ARGS, user, binary) + true):
            return {layer: True for layer in _UNSHARE_ARGS}, user
        each = {layer: _try(_unshare_prefix([layer], user, binary) + true) for layer in _UNSHARE_ARGS}
        if any(each.values()):
            return each, user
    return none, False


_CAPS_LOCK = threading.Lock()


@functools.lru_cache(maxsize=1)
def _capabilities_cached() -> dict[str, object]:
    unshare = shutil.which("unshare")
    namespaces, user = _probe_namespaces(unshare)
    caps: dict[str, object] = {
        "unshare": unshare or "",
        **namespaces,
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


def available_layers() -> list[str]:
    """The isolation layers this machine allows, in the order of `_LAYERS` (what a benchmark reports)."""
    caps = capabilities()
    return [layer for layer in _LAYERS if caps[layer]]


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
        if line.startswith(SETUP_FAILED_LINE):
            return line.split(":")[1]
    return None


@functools.lru_cache(maxsize=1)
def _hidden_paths() -> tuple[str, ...]:
    """The installed-package directories (site-packages, dist-packages) that lie inside the read paths
    (the stdlib directory, /usr): Landlock's rule admits the read paths minus these, so the program
    cannot import or read packages other than the allowed ones."""
    found = list(site.getsitepackages()) + [site.getusersitepackages()]
    found += [p for p in sys.path if os.path.basename(p.rstrip("/")) in ("site-packages", "dist-packages")]
    for pattern in ("/usr/lib*/python3*/*-packages", "/usr/local/lib*/python3*/*-packages"):
        found += glob.glob(pattern)
    return tuple(sorted({os.path.realpath(p) for p in found if os.path.isdir(p)}))


@functools.lru_cache(maxsize=1)
def _packages() -> tuple[dict[str, str], tuple[str, ...]]:
    """({name: directory}, read paths) of the allowed third-party packages installed here. The sandbox
    runs without site-packages; the harness finds each of these at its directory, and Landlock lets
    it read that directory and the libraries bundled with the wheel (`numpy.libs`), nothing else there."""
    found: dict[str, str] = {}
    paths: list[str] = []
    for name in _PACKAGES:
        try:
            spec = importlib.util.find_spec(name)
        except (ImportError, ValueError):
            continue
        locations = list(spec.submodule_search_locations or []) if spec is not None else []
        if len(locations) != 1 or not os.path.isdir(locations[0]):
            continue
        found[name] = os.path.realpath(locations[0])
        paths += [p for p in (found[name], found[name] + ".libs") if os.path.isdir(p)]
    return found, tuple(paths)


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


class _Output:
    """The stdout/stderr pipes of a run's processes and what was read from them, up to the caps."""

    def __init__(self, procs: list[subprocess.Popen], limits: Limits) -> None:
        self.procs = procs
        self.caps, self.tails = {}, set()  # tails: streams of which the last _STDERR_KEPT bytes are kept
        for proc in procs:
            self.caps[proc.stdout], self.caps[proc.stderr] = limits.max_output_bytes, limits.max_stderr_bytes
            self.tails.add(proc.stderr)
        self.data = {stream: bytearray() for stream in self.caps}
        self.counts = {stream: 0 for stream in self.caps}
        self.open = set(self.caps)
        for stream in self.caps:
            os.set_blocking(stream.fileno(), False)

    def read(self, until: set, deadline: float, stop_at_cap: bool) -> str | None:
        """Read every open pipe until those in `until` reach EOF (EOF: no process holds them any more).
        Returns "timeout" at the deadline, or "output_limit" when a pipe passes its cap and
        `stop_at_cap`; past a cap otherwise, what follows is read and dropped."""
        sel = selectors.DefaultSelector()
        for stream in self.open:
            sel.register(stream, selectors.EVENT_READ)
        try:
            while self.open & until:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return "timeout"
                for key, _ in sel.select(timeout=min(remaining, 0.5)):
                    if self._read_chunk(key.fileobj) and stop_at_cap:
                        return "output_limit"
                    if key.fileobj not in self.open:
                        sel.unregister(key.fileobj)
        finally:
            sel.close()
        return None

    def _read_chunk(self, stream: object) -> bool:
        """One read from `stream` (marking EOF); True when the stream went past its cap. stdout keeps
        its first `cap` bytes, stderr its last _STDERR_KEPT."""
        chunk = os.read(stream.fileno(), 1 << 16)  # type: ignore[attr-defined]
        if not chunk:
            self.open.discard(stream)
            return False
        buf, cap = self.data[stream], self.caps[stream]
        count = self.counts[stream] = self.counts[stream] + len(chunk)
        if stream in self.tails:
            buf += chunk
            del buf[: max(0, len(buf) - _STDERR_KEPT)]
        else:
            buf += chunk[: max(0, cap - len(buf))]
        return count > cap

    def texts(self) -> tuple[list[str], list[str]]:
        """(stdouts, stderrs), one per process, decoded."""
        text = {stream: bytes(buf).decode("utf-8", "replace") for stream, buf in self.data.items()}
        return [text[p.stdout] for p in self.procs], [text[p.stderr] for p in self.procs]


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


def _exit_code(proc: subprocess.Popen) -> int | None:
    """The exit code of a process that exited normally, without reaping it; None while it runs or when a
    signal ended it."""
    try:
        info = os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
    except ChildProcessError:
        return proc.returncode
    return info.si_status if info is not None and info.si_code == os.CLD_EXITED else None


def _has_exited(proc: subprocess.Popen) -> bool:
    """Whether the process has ended (without reaping it)."""
    try:
        return os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None
    except ChildProcessError:
        return True


def _status(returncode: int | None, kill_reason: str | None, stderr: str) -> str:
    if kill_reason:
        return kill_reason
    if returncode == SETUP_FAILED and SETUP_FAILED_LINE in stderr:
        return "setup_failed"
    if returncode in (-signal.SIGXCPU, CPU_LIMIT_EXIT):
        return "cpu_limit"
    if returncode == -signal.SIGXFSZ:
        return "file_limit"
    if returncode == -signal.SIGKILL or (returncode == 1 and "unshare: sigprocmask" in stderr[-200:]):
        return "killed"  # the second form: util-linux unshare could not re-raise the child's SIGKILL
    if returncode:
        return "memory" if "MemoryError" in stderr else "error"
    return "ok"


@dataclass(frozen=True)
class _Child:
    """A started harness process, its fresh working directory and its uid (None: the uid is kept)."""

    proc: subprocess.Popen
    workdir: str
    uid: int | None


def _job(role: str, payload: dict, limits: Limits, layers: dict, caps: dict, uid: int | None) -> bytes:
    """The harness's instructions, marshalled (`job.dump_job`). `payload` holds what this role may see:
    the program (script, serve) or the tests and the nonce (tests)."""
    return dump_job(
        {
            "role": role,
            "program": payload.get("program"),
            "tests": payload.get("tests"),
            "entry_point": payload.get("entry_point"),
            "nonce": payload.get("nonce"),
            "uid": uid,
            "layers": layers,
            "landlock_abi": caps.get("landlock_abi", 0),
            "machine": caps.get("machine", ""),
            "read_paths": [p for p in _SYSTEM_READ_PATHS + _packages()[1] if os.path.exists(p)],
            "packages": _packages()[0],
            "hidden_paths": list(_hidden_paths()),
            "limits": {
                "cpu_s": limits.cpu_s,
                "memory_bytes": int(limits.memory_mb) << 20,
                "max_processes": int(limits.max_processes),
                "max_file_bytes": int(limits.max_file_bytes),
                "max_open_files": int(limits.max_open_files),
            },
        }
    )


def _spawn(
    workdir: str, job: bytes, stdin: str, fds: tuple[int, int, int], layers: dict, caps: dict, uid: int | None
) -> subprocess.Popen:
    """Start the harness with `fds` = (marker, channel in, channel out), -1 where the role has none.
    The job and stdin go through unlinked temporary files: no path to find them by, no pipe to block
    on, and the harness closes the job fd before any user code. The stdin file belongs to the run's
    uid, so the code can also reopen it by path (/dev/stdin, /proc/self/fd/0)."""
    namespaces = [layer for layer in _UNSHARE_ARGS if layers[layer]]
    prefix = _unshare_prefix(namespaces, bool(caps["user_namespace"]), str(caps["unshare"])) if namespaces else []
    with tempfile.TemporaryFile() as job_file, tempfile.TemporaryFile() as stdin_file:
        job_file.write(job)
        job_file.seek(0)
        stdin_file.write(stdin.encode("utf-8", "surrogatepass"))
        stdin_file.seek(0)
        if uid is not None:
            os.fchown(stdin_file.fileno(), uid, uid)
        job_fd = job_file.fileno()
        return subprocess.Popen(
            prefix + _interpreter_args() + [str(job_fd)] + [str(fd) for fd in fds],
            stdin=stdin_file,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            cwd=workdir,
            env=_ENV,
            start_new_session=True,
            pass_fds=(job_fd, *[fd for fd in fds if fd >= 0]),
            close_fds=True,
        )


def _start(
    role: str, payload: dict, fds: tuple[int, int, int], stdin: str, limits: Limits, layers: dict, caps: dict
) -> _Child:
    """One harness process in a fresh temp dir, under a fresh uid when the uid is dropped."""
    workdir = tempfile.mkdtemp(prefix="grpo_sbx_")
    uid = 1_000_000 + secrets.randbelow(1_000_000_000) if layers["drop_uid"] else None
    try:
        if uid is not None:
            os.chown(workdir, uid, uid)
        proc = _spawn(workdir, _job(role, payload, limits, layers, caps, uid), stdin, fds, layers, caps, uid)
    except BaseException:
        _remove_tree(workdir)
        raise
    return _Child(proc, workdir, uid)


def _supervise(
    children: list[_Child], deadline: float, limits: Limits, layers: dict
) -> tuple[list[str], list[str], list[int], list[bool], str | None]:
    """Run until the first child (the one whose outcome decides) is done, the deadline or a cap, then
    kill every process tree and read what they had written. Returns (stdouts, stderrs, returncodes,
    exited-before-the-kill, reason)."""
    procs = [c.proc for c in children]
    output = _Output(procs, limits)
    kill_reason = output.read({procs[0].stdout, procs[0].stderr}, deadline, stop_at_cap=True)
    if kill_reason is None and not _wait_until(procs[0], deadline):
        kill_reason = "timeout"
    if kill_reason is None and len(procs) > 1 and _exit_code(procs[0]) == PEER_GONE:
        # The tests' process saw the solution's pipes close; a process killed by a limit closes them before it
        # becomes waitable, so its status may not have landed yet (seen under load: an infinite loop's
        # cpu_limit read as "error"). A moment for it, spent only on this path.
        _wait_until(procs[1], time.monotonic() + 1.0)
    exited = [_has_exited(p) for p in procs]
    for child in children:
        _kill_tree(child.proc, child.uid, layers)
    output.read(set(output.caps), time.monotonic() + 2.0, stop_at_cap=False)  # the rest, e.g. a dead peer's error
    outs, errs = output.texts()
    return outs, errs, [p.wait() for p in procs], exited, kill_reason


def _read_marker(marker_r: int) -> bytes:
    os.set_blocking(marker_r, False)
    try:
        return os.read(marker_r, 256)
    except BlockingIOError:
        return b""


def _run_once(
    program: str, tests: str | None, entry_point: str | None, stdin: str, limits: Limits, layers: dict, caps: dict
) -> SandboxResult:
    """One sandboxed run: the program alone (no tests), or the program against the tests."""
    if tests is None:
        return _run_script(program, stdin, limits, layers, caps)
    return _run_tests(program, tests, entry_point, limits, layers, caps)


def _run_script(program: str, stdin: str, limits: Limits, layers: dict, caps: dict) -> SandboxResult:
    """The program as `__main__` reading `stdin`; `passed` = a clean exit (the caller compares stdout)."""
    t0 = time.monotonic()
    children: list[_Child] = []
    try:
        children.append(_start("script", {"program": program}, (-1, -1, -1), stdin, limits, layers, caps))
        outs, errs, returncodes, _, kill_reason = _supervise(children, t0 + limits.wall_s, limits, layers)
        status = _status(returncodes[0], kill_reason, errs[0])
        return SandboxResult(
            status,
            returncodes[0],
            outs[0],
            errs[0][-4000:],
            time.monotonic() - t0,
            status == "ok",
            tuple(k for k in _LAYERS if layers[k]),
        )
    finally:
        _cleanup(children, ())


def _run_tests(
    program: str, tests: str, entry_point: str | None, limits: Limits, layers: dict, caps: dict
) -> SandboxResult:
    """The program against the tests, in two sandboxed processes joined by two pipes: the solution's
    (`serve`: runs the program, answers calls with plain data) and the tests' (`tests`: a clean
    interpreter that runs the tests against stubs and alone holds the nonce and the marker pipe)."""
    t0 = time.monotonic()
    nonce = secrets.token_bytes(16)
    marker_r, marker_w = os.pipe()
    requests_r, requests_w = os.pipe()
    replies_r, replies_w = os.pipe()
    handed_over = [marker_w, requests_r, requests_w, replies_r, replies_w]  # the children's ends
    children: list[_Child] = []
    try:
        payload = {"tests": tests, "entry_point": entry_point, "nonce": nonce}
        children.append(_start("tests", payload, (marker_w, replies_r, requests_w), "", limits, layers, caps))
        children.append(_start("serve", {"program": program}, (-1, requests_r, replies_w), "", limits, layers, caps))
        _close_fds(handed_over)  # now only the children hold them: EOF reaches one side when the other ends
        outs, errs, returncodes, exited, kill_reason = _supervise(children, t0 + limits.wall_s, limits, layers)
        tests_err, solution_err = errs
        status, by_solution = _tests_status(
            kill_reason,
            returncodes[0],
            _status(returncodes[0], None, tests_err),
            _status(returncodes[1], None, solution_err) if exited[1] else None,
        )
        return SandboxResult(
            status,
            returncodes[1] if by_solution else returncodes[0],
            outs[1] + outs[0],
            (solution_err + tests_err)[-4000:],
            time.monotonic() - t0,
            status == "ok" and _read_marker(marker_r) == nonce,
            tuple(k for k in _LAYERS if layers[k]),
        )
    finally:
        _close_fds(handed_over)
        _cleanup(children, (marker_r,))


def _tests_status(
    kill_reason: str | None, tests_returncode: int, tests_status: str, solution_status: str | None
) -> tuple[str, bool]:
    """(status of a tests-mode run, whether it describes the solution's process). When the tests'
    process stopped because the solution's ended, the solution's own status says why (memory, cpu
    limit, a crash, or "ok": a clean exit before the tests finished, which is not a pass)."""
    if kill_reason:
        return kill_reason, False
    if tests_returncode == PEER_GONE:
        return (solution_status, True) if solution_status is not None else ("error", False)
    return tests_status, False


def _close_fds(fds: list[int]) -> None:
    """Close and forget every fd in the list (safe to call twice)."""
    while fds:
        with contextlib.suppress(OSError):
            os.close(fds.pop())


def _cleanup(children: list[_Child], fds: tuple[int, ...]) -> None:
    for child in children:
        if child.proc.returncode is None:  # an exception on the way: never leave the tree running
            _kill_group(child.proc)
            child.proc.wait()
        for stream in (child.proc.stdout, child.proc.stderr):
            if stream is not None:
                stream.close()
        _remove_tree(child.workdir)
    for fd in fds:
        if fd >= 0:
            os.close(fd)


def _kill_group(proc: subprocess.Popen) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)


def _kill_tree(proc: subprocess.Popen, uid: int | None, layers: dict) -> None:
    """Kill everything the run started, including processes that left the group with setsid (the
    caller then reads the output pipes to EOF: EOF means no process of the run holds them any more)."""
    _kill_group(proc)
    if uid is not None and not layers["pid_namespace"]:
        # Without a PID namespace, the run's own uid reaches every process it started: kill(-1) as that
        # uid signals exactly those (and never the caller, which runs under another uid).
        with contextlib.suppress(OSError, subprocess.SubprocessError):
            subprocess.run(
                ["/bin/sh", "-c", "kill -9 -1"],
                user=uid, group=uid, extra_groups=[], env=_ENV, timeout=10, capture_output=True,
            )  # fmt: skip


def run_program(
    program: str,
    *,
    tests: str | None = None,
    entry_point: str | None = None,
    stdin: str = "",
    limits: Limits = Limits(),
    isolation: Isolation = Isolation(),
) -> SandboxResult:
    """Run `program` confined. With `tests`, the test code (and `check(entry_point)`) runs in a second
    sandboxed process against the program's functions, and `passed` means all of it completed with
    plain-data results; without, `passed` means a clean exit (compare stdout)."""
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
