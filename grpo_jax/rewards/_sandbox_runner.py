"""Trusted harness that runs *inside* the sandbox process; never imported by the trainer.

`sandbox.py` starts `python -S -s [-P] -c <this file's source> JOB_FD MARKER_FD` (under `unshare` when
available). This code reads the job (program, tests, limits, isolation layers, per-run nonce) from
JOB_FD, applies the limits and isolation to its own process, then runs the untrusted program. In test
mode it writes the nonce to MARKER_FD only after the program, the test code and `check(entry_point)`
all returned normally, so printing a marker, `exit(0)`, `raise SystemExit`, `os._exit` or a crash
cannot look like a pass. Setup failures exit with status 121 and a line on stderr naming the
layer, so the parent can tell a broken sandbox from a broken program and never runs code unconfined.

Only the standard library is used (the interpreter runs without site-packages).
"""

import _signal
import builtins
import marshal
import os
import resource
import sys

SETUP_FAILED = 121
CPU_LIMIT_EXIT = 152  # 128 + SIGXCPU: reported as an exit code because `unshare --fork` (util-linux
# 2.38) fails to re-raise SIGXCPU/SIGKILL in itself and would turn them into a plain exit status 1

# Landlock (linux/landlock.h). Filesystem rights by ABI version; net and scope rights from ABI 4 / 6.
_LL_EXECUTE, _LL_WRITE_FILE, _LL_READ_FILE, _LL_READ_DIR = 1, 2, 4, 8
_LL_TRUNCATE, _LL_IOCTL_DEV = 1 << 14, 1 << 15
_LL_FS_BY_ABI = {1: (1 << 13) - 1, 2: (1 << 14) - 1, 3: (1 << 15) - 1, 4: (1 << 15) - 1}
_SYS_LANDLOCK_CREATE, _SYS_LANDLOCK_ADD_RULE, _SYS_LANDLOCK_RESTRICT = 444, 445, 446
_PR_SET_NO_NEW_PRIVS, _PR_SET_SECCOMP, _SECCOMP_MODE_FILTER = 38, 22, 2

# seccomp: (AUDIT_ARCH, socket nr, io_uring_setup nr) for the architectures we know.
_SECCOMP_ARCH = {"x86_64": (0xC000003E, 41, 425), "aarch64": (0xC00000B7, 198, 425)}


class _SetupError(Exception):
    def __init__(self, layer, error):
        super().__init__(f"{layer}: {error}")
        self.layer, self.error = layer, error


def _read_job(fd):
    chunks = []
    while True:
        chunk = os.read(fd, 1 << 16)
        if not chunk:
            break
        chunks.append(chunk)
    os.close(fd)
    return marshal.loads(b"".join(chunks))  # written by sandbox.py (trusted); cheaper to import than json


def _set_limits(limits):
    """rlimits apply to this process and everything it forks (children inherit them)."""
    cpu = max(1, int(limits["cpu_s"] + 0.999))
    pairs = (
        (resource.RLIMIT_CPU, cpu, cpu + 1),
        (resource.RLIMIT_AS, limits["memory_bytes"], limits["memory_bytes"]),
        (resource.RLIMIT_NPROC, limits["max_processes"], limits["max_processes"]),
        (resource.RLIMIT_FSIZE, limits["max_file_bytes"], limits["max_file_bytes"]),
        (resource.RLIMIT_NOFILE, limits["max_open_files"], limits["max_open_files"]),
        (resource.RLIMIT_CORE, 0, 0),
    )
    for which, soft, hard in pairs:
        try:
            resource.setrlimit(which, (soft, hard))
        except (ValueError, OSError) as e:
            raise _SetupError("rlimit", repr(e)) from e
    _signal.signal(_signal.SIGXCPU, lambda signum, frame: os._exit(CPU_LIMIT_EXIT))  # _signal: no enum import


def _libc():
    import ctypes  # here: only the sandboxed child needs it, after its limits are set

    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    libc.prctl.restype = ctypes.c_int
    return ctypes, libc


def _no_new_privs():
    ctypes, libc = _libc()
    L = ctypes.c_ulong
    if libc.prctl(_PR_SET_NO_NEW_PRIVS, L(1), L(0), L(0), L(0)) != 0:
        raise _SetupError("no_new_privs", os.strerror(ctypes.get_errno()))


def _landlock(abi, workdir, read_paths):
    """Writes only inside the workdir; reads only the Python stdlib and system libraries; no TCP;
    no signals to (and no ptrace or /proc access of) processes outside the sandbox (ABI >= 6)."""
    ctypes, libc = _libc()
    L = ctypes.c_long

    class RulesetAttr(ctypes.Structure):
        _fields_ = [("fs", ctypes.c_uint64), ("net", ctypes.c_uint64), ("scoped", ctypes.c_uint64)]

    class PathBeneath(ctypes.Structure):
        _pack_ = 1
        _fields_ = [("allowed", ctypes.c_uint64), ("parent_fd", ctypes.c_int32)]

    fs_all = _LL_FS_BY_ABI.get(abi, (1 << 16) - 1)
    attr = RulesetAttr(fs_all, 3 if abi >= 4 else 0, 3 if abi >= 6 else 0)
    ruleset = libc.syscall(L(_SYS_LANDLOCK_CREATE), ctypes.byref(attr), L(ctypes.sizeof(attr)), L(0))
    if ruleset < 0:
        raise _SetupError("landlock", "create_ruleset: " + os.strerror(ctypes.get_errno()))
    file_rights = fs_all & (_LL_EXECUTE | _LL_WRITE_FILE | _LL_READ_FILE | _LL_TRUNCATE | _LL_IOCTL_DEV)
    read_rights = _LL_EXECUTE | _LL_READ_FILE | _LL_READ_DIR
    rules = [(workdir, fs_all)] + [(p, read_rights) for p in read_paths]
    rules += [("/dev/null", file_rights & ~_LL_EXECUTE), ("/dev/zero", _LL_READ_FILE), ("/dev/urandom", _LL_READ_FILE)]
    for path, rights in rules:
        try:
            fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
        except OSError:
            continue  # a missing system directory needs no rule
        is_dir = os.path.isdir(path)
        rule = PathBeneath(rights if is_dir else rights & file_rights, fd)
        ok = libc.syscall(L(_SYS_LANDLOCK_ADD_RULE), L(ruleset), L(1), ctypes.byref(rule), L(0))
        err = ctypes.get_errno()
        os.close(fd)
        if ok != 0:
            raise _SetupError("landlock", f"add_rule {path}: {os.strerror(err)}")
    if libc.syscall(L(_SYS_LANDLOCK_RESTRICT), L(ruleset), L(0)) != 0:
        raise _SetupError("landlock", "restrict_self: " + os.strerror(ctypes.get_errno()))
    os.close(ruleset)


def _seccomp_block_sockets(machine):
    """A tiny BPF filter: socket() and io_uring_setup() fail with EACCES, foreign-ABI syscalls with
    EPERM (so int 0x80 / x32 cannot bypass it), everything else is allowed."""
    if machine not in _SECCOMP_ARCH:
        raise _SetupError("seccomp", f"no syscall table for architecture {machine!r}")
    ctypes, libc = _libc()
    arch, nr_socket, nr_io_uring = _SECCOMP_ARCH[machine]

    class Filter(ctypes.Structure):
        _fields_ = [("code", ctypes.c_uint16), ("jt", ctypes.c_uint8), ("jf", ctypes.c_uint8), ("k", ctypes.c_uint32)]

    class Prog(ctypes.Structure):
        _fields_ = [("len", ctypes.c_uint16), ("filter", ctypes.POINTER(Filter))]

    ld_w_abs, jeq_k, jge_k, ret_k = 0x20, 0x15, 0x35, 0x06
    allow, eperm, eacces = 0x7FFF0000, 0x00050000 | 1, 0x00050000 | 13
    program = [
        (ld_w_abs, 0, 0, 4),  # A = arch
        (jeq_k, 1, 0, arch),
        (ret_k, 0, 0, eperm),
        (ld_w_abs, 0, 0, 0),  # A = syscall nr
        (jge_k, 3, 0, 0x40000000),  # x32 ABI numbers
        (jeq_k, 2, 0, nr_socket),
        (jeq_k, 1, 0, nr_io_uring),
        (ret_k, 0, 0, allow),
        (ret_k, 0, 0, eacces),
    ]
    filters = (Filter * len(program))(*[Filter(*ins) for ins in program])
    prog = Prog(len(program), filters)
    L = ctypes.c_ulong
    if libc.prctl(_PR_SET_SECCOMP, L(_SECCOMP_MODE_FILTER), ctypes.byref(prog), L(0), L(0)) != 0:
        raise _SetupError("seccomp", os.strerror(ctypes.get_errno()))


def _pin_sys_path():
    """Keep the stdlib importable after dropping to an unprivileged uid: the interpreter may live under
    a directory that uid cannot traverse (e.g. /root/.pyenv), so each sys.path directory is opened now
    and reached later through its /proc/self/fd link, which skips the path walk."""
    pinned = {}
    for entry in sys.path:
        if os.path.isdir(entry):
            fd = os.open(entry, os.O_RDONLY | os.O_DIRECTORY)
            pinned[entry.rstrip("/") + "/"] = f"/proc/self/fd/{fd}/"
    sys.path[:] = [p.rstrip("/") for p in pinned.values()]
    sys.path_importer_cache.clear()
    for module in list(sys.modules.values()):  # packages already imported (collections, encodings)
        path = getattr(module, "__path__", None)
        if isinstance(path, list):
            path[:] = [_repin(p, pinned) for p in path]


def _repin(path, pinned):
    for real, link in pinned.items():
        if path.startswith(real):
            return link + path[len(real) :]
    return path


def _drop_uid(uid):
    try:
        os.setgroups([])
        os.setgid(uid)
        os.setuid(uid)
    except OSError as e:
        raise _SetupError("drop_uid", repr(e)) from e
    if os.getuid() != uid or os.geteuid() != uid:
        raise _SetupError("drop_uid", "uid did not change")


def _setup(job):
    layers = job["layers"]
    _set_limits(job["limits"])
    read_paths = [os.path.realpath(p) for p in sys.path if os.path.isdir(p)] + list(job["read_paths"])
    if layers.get("drop_uid"):
        _pin_sys_path()
    if layers.get("landlock") or layers.get("seccomp"):
        _no_new_privs()
    if layers.get("landlock"):
        _landlock(job["landlock_abi"], os.getcwd(), read_paths)
    if layers.get("drop_uid"):
        _drop_uid(job["uid"])
    if layers.get("seccomp"):
        _seccomp_block_sockets(job["machine"])


class _Quit:
    """`exit()`/`quit()` as the site module would define them (the interpreter runs with -S)."""

    def __init__(self, name):
        self.name = name

    def __repr__(self):
        return f"Use {self.name}() or Ctrl-D (i.e. EOF) to exit"

    def __call__(self, code=None):
        raise SystemExit(code)


builtins.exit, builtins.quit = _Quit("exit"), _Quit("quit")


def _run_script(program):
    """stdin/stdout mode: the program runs as __main__; the parent compares its output."""
    code = compile(program, "<solution>", "exec")
    exec(code, {"__name__": "__main__", "__builtins__": builtins})


def _run_tests(program, tests, entry_point, marker_fd, nonce):
    """Test mode. The solution runs in its own namespace; the tests run in a fresh one that sees the
    solution's names but pristine builtins and modules, so redefining `len`, `check`, builtins or
    `sys.modules` entries in the solution cannot change what the tests compute. (Attributes patched
    onto modules that were loaded before the solution ran, such as `sys`, are a residual risk.)"""
    pristine = dict(builtins.__dict__)
    modules_before = dict(sys.modules)
    write, trace, profile = os.write, sys.gettrace, sys.getprofile
    solution = {"__name__": "__main__", "__builtins__": dict(pristine)}
    exec(compile(program, "<solution>", "exec"), solution)
    if trace() is not None or profile() is not None:
        raise RuntimeError("sandbox: the solution installed a trace/profile hook")
    for name in [n for n in sys.modules if n not in modules_before]:
        del sys.modules[name]  # the tests import their own, fresh copies of anything the solution imported
    sys.modules.update(modules_before)  # and get back any entry the solution replaced
    scope = {"__name__": "__main__", "__builtins__": dict(pristine)}
    scope.update((k, v) for k, v in solution.items() if k not in pristine and not k.startswith("__"))
    exec(compile(tests, "<tests>", "exec"), scope)
    if entry_point:
        exec(compile(f"check({entry_point})", "<check>", "exec"), scope)
    sys.stdout.flush()
    write(marker_fd, nonce)


def main():
    job_fd, marker_fd = int(sys.argv[1]), int(sys.argv[2])
    job = _read_job(job_fd)
    nonce = job.pop("nonce")
    try:
        _setup(job)
    except Exception as e:  # fail closed: never run the program half-confined
        layer, error = (e.layer, e.error) if isinstance(e, _SetupError) else ("unknown", repr(e))
        os.write(2, f"sandbox_setup_failed:{layer}:{error}\n".encode("utf-8", "replace"))
        os._exit(SETUP_FAILED)
    if job["tests"] is None:
        os.close(marker_fd)
        _run_script(job["program"])
    else:
        _run_tests(job["program"], job["tests"], job["entry_point"], marker_fd, nonce)


if __name__ == "__main__":
    main()
