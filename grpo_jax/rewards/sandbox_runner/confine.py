"""The runner's confinement of its own process, applied before any untrusted code runs: rlimits, the
allowed third-party packages pinned by fd, and the isolation layers the job names (no_new_privs,
Landlock, the uid drop, seccomp, and for the tests' process no dumping). Each failure is a
`_SetupError` naming its layer; the runner then exits with SETUP_FAILED (fail closed).
"""

import _signal
import os
import resource
import stat
import sys

from .job import CPU_LIMIT_EXIT

# Landlock (linux/landlock.h). Filesystem rights by ABI version; net and scope rights from ABI 4 / 6.
_LL_EXECUTE, _LL_WRITE_FILE, _LL_READ_FILE, _LL_READ_DIR = 1, 2, 4, 8
_LL_TRUNCATE, _LL_IOCTL_DEV = 1 << 14, 1 << 15
_LL_FS_BY_ABI = {1: (1 << 13) - 1, 2: (1 << 14) - 1, 3: (1 << 15) - 1, 4: (1 << 15) - 1}
_SYS_LANDLOCK_CREATE, _SYS_LANDLOCK_ADD_RULE, _SYS_LANDLOCK_RESTRICT = 444, 445, 446
_PR_SET_NO_NEW_PRIVS, _PR_SET_SECCOMP, _SECCOMP_MODE_FILTER, _PR_SET_DUMPABLE = 38, 22, 2, 4

# seccomp: the AUDIT_ARCH value and the numbers of the denied syscalls, for the architectures we know.
# Sockets and io_uring (which could open sockets) fail with EACCES. With EPERM: the calls that change a
# file's mode, owner, times, extended attributes or inode flags (Landlock has no right for them, so a
# run that keeps the caller's uid could otherwise change the caller's files), and the calls that read
# or write another process's memory, and the kernel objects that outlive a process and are found again by
# a key or a name, not a path (SysV shared memory, semaphores and message queues, POSIX message queues,
# keyrings): a run could otherwise leave state for the next run to read, where the IPC namespace is
# missing, and SysV segments are memory outside the run's limits. Numbers from 424 on are shared by all
# architectures.
_SECCOMP_ARCH = {"x86_64": 0xC000003E, "aarch64": 0xC00000B7}
_NEW_SYSCALLS = {"io_uring_setup": 425, "fchmodat2": 452, "setxattrat": 463, "removexattrat": 466, "file_setattr": 469}
_PERSISTENT_OBJECT_SYSCALLS = {
    "x86_64": {
        "shmget": 29, "shmat": 30, "shmctl": 31, "semget": 64, "semop": 65, "semctl": 66, "shmdt": 67,
        "msgget": 68, "msgsnd": 69, "msgrcv": 70, "msgctl": 71, "semtimedop": 220, "mq_open": 240,
        "mq_unlink": 241, "mq_timedsend": 242, "mq_timedreceive": 243, "mq_notify": 244, "mq_getsetattr": 245,
        "add_key": 248, "request_key": 249, "keyctl": 250,
    },
    "aarch64": {
        "mq_open": 180, "mq_unlink": 181, "mq_timedsend": 182, "mq_timedreceive": 183, "mq_notify": 184,
        "mq_getsetattr": 185, "msgget": 186, "msgctl": 187, "msgrcv": 188, "msgsnd": 189, "semget": 190,
        "semctl": 191, "semtimedop": 192, "semop": 193, "shmget": 194, "shmctl": 195, "shmat": 196, "shmdt": 197,
        "add_key": 217, "request_key": 218, "keyctl": 219,
    },
}  # fmt: skip
_DENIED_SYSCALLS = {
    "x86_64": {
        "socket": 41, "chmod": 90, "fchmod": 91, "fchmodat": 268, "chown": 92, "fchown": 93, "lchown": 94,
        "fchownat": 260, "utime": 132, "utimes": 235, "utimensat": 280, "futimesat": 261, "setxattr": 188,
        "lsetxattr": 189, "fsetxattr": 190, "removexattr": 197, "lremovexattr": 198, "fremovexattr": 199,
        "ptrace": 101, "process_vm_readv": 310, "process_vm_writev": 311, **_NEW_SYSCALLS,
        **_PERSISTENT_OBJECT_SYSCALLS["x86_64"],
    },
    "aarch64": {  # the generic table: no chmod/chown/lchown/utime/utimes/futimesat (only the *at forms)
        "socket": 198, "fchmod": 52, "fchmodat": 53, "fchownat": 54, "fchown": 55, "utimensat": 88,
        "setxattr": 5, "lsetxattr": 6, "fsetxattr": 7, "removexattr": 14, "lremovexattr": 15,
        "fremovexattr": 16, "ptrace": 117, "process_vm_readv": 270, "process_vm_writev": 271, **_NEW_SYSCALLS,
        **_PERSISTENT_OBJECT_SYSCALLS["aarch64"],
    },
}  # fmt: skip
_EACCES_SYSCALLS = frozenset({"socket", "io_uring_setup"})
_IOCTL_NR = {"x86_64": 16, "aarch64": 29}
# ioctl commands that set inode flags (chattr): FS_IOC_SETFLAGS, FS_IOC32_SETFLAGS, FS_IOC_FSSETXATTR
_DENIED_IOCTLS = (0x40086602, 0x40046602, 0x401C5820)


class _SetupError(Exception):
    def __init__(self, layer, error):
        super().__init__(f"{layer}: {error}")
        self.layer, self.error = layer, error


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


def _landlock(abi, workdir, read_paths, writable=()):
    """Writes only inside the workdir (and `writable`: the run's own /dev/shm); reads only the Python
    stdlib and system libraries; no TCP; no signals to (and no ptrace or /proc access of) processes
    outside the sandbox (ABI >= 6)."""
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
    rules = [(p, fs_all) for p in (workdir, *writable)] + [(p, read_rights) for p in read_paths]
    rules += [("/dev/null", file_rights & ~_LL_EXECUTE), ("/dev/zero", _LL_READ_FILE), ("/dev/urandom", _LL_READ_FILE)]

    def add_rule(fd, rights, what):
        rule = PathBeneath(rights, fd)
        if libc.syscall(L(_SYS_LANDLOCK_ADD_RULE), L(ruleset), L(1), ctypes.byref(rule), L(0)) != 0:
            raise _SetupError("landlock", f"add_rule {what}: {os.strerror(ctypes.get_errno())}")

    for path, rights in rules:
        try:
            fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
        except OSError:
            continue  # a missing system directory needs no rule
        try:
            add_rule(fd, rights if stat.S_ISDIR(os.fstat(fd).st_mode) else rights & file_rights, path)
        finally:
            os.close(fd)
    if stat.S_ISREG(os.fstat(0).st_mode):  # stdin by path (/dev/stdin, /proc/self/fd/0) reopens this file
        add_rule(0, _LL_READ_FILE, "stdin")
    if libc.syscall(L(_SYS_LANDLOCK_RESTRICT), L(ruleset), L(0)) != 0:
        raise _SetupError("landlock", "restrict_self: " + os.strerror(ctypes.get_errno()))
    os.close(ruleset)


def _visible(paths, hidden):
    """The read paths with the hidden directories (site-packages) cut out of them. A Landlock rule only
    adds rights, so a path with a hidden directory somewhere below it is replaced by its entries, each
    treated the same way; paths are resolved first (`/lib` may be `/usr/lib`), duplicates dropped."""
    hidden = {os.path.realpath(h) for h in hidden if os.path.isdir(h)}
    visible = []
    for path in paths:
        visible += _entries_except(os.path.realpath(path), hidden)
    return list(dict.fromkeys(visible))


def _entries_except(path, hidden):
    """[path] when no hidden directory lies below it, else its entries without the hidden ones. Symbolic
    links among the entries get no rule: what they point to is readable where its own path is."""
    if path in hidden:
        return []
    prefix = path.rstrip("/") + "/"
    if not any(h.startswith(prefix) for h in hidden):
        return [path]
    entries = []
    try:
        with os.scandir(path) as scan:
            for entry in scan:
                if not entry.is_symlink():
                    entries += _entries_except(prefix + entry.name, hidden)
    except OSError:
        return []
    return entries


def _private_shm(limits):
    """Mount a fresh tmpfs on /dev/shm in the run's own mount namespace (`unshare --mount`), so that
    POSIX semaphores and shared memory (`multiprocessing`) work and die with the run: nothing of the
    trainer's /dev/shm is visible, nothing written there outlives the run, and its size is capped."""
    ctypes, libc = _libc()
    ms_nosuid, ms_nodev, ms_noexec = 2, 4, 8
    options = f"size={int(limits['max_file_bytes'])},nr_inodes=1024,mode=1777".encode()
    if libc.mount(b"grpo_shm", b"/dev/shm", b"tmpfs", ctypes.c_ulong(ms_nosuid | ms_nodev | ms_noexec), options) != 0:
        raise _SetupError("private_shm", "mount /dev/shm: " + os.strerror(ctypes.get_errno()))


def _seccomp_program(machine):
    """The BPF filter as (code, jt, jf, k) tuples: foreign-ABI syscalls fail with EPERM (so int 0x80 /
    x32 cannot bypass it), x32 numbers and the denied syscalls with their errno, the inode-flag ioctls
    with EPERM; everything else is allowed."""
    ld_w_abs, jeq_k, jge_k, ret_k = 0x20, 0x15, 0x35, 0x06
    allow, eperm, eacces = 0x7FFF0000, 0x00050000 | 1, 0x00050000 | 13
    program = [
        (ld_w_abs, 0, 0, 4),  # A = arch
        (jeq_k, 1, 0, _SECCOMP_ARCH[machine]),
        (ret_k, 0, 0, eperm),
        (ld_w_abs, 0, 0, 0),  # A = syscall nr
        (jge_k, 0, 1, 0x40000000),  # x32 ABI numbers
        (ret_k, 0, 0, eacces),
    ]
    for name, nr in sorted(_DENIED_SYSCALLS[machine].items(), key=lambda item: item[1]):
        program += [(jeq_k, 0, 1, nr), (ret_k, 0, 0, eacces if name in _EACCES_SYSCALLS else eperm)]
    program += [(jeq_k, 0, 1 + 2 * len(_DENIED_IOCTLS), _IOCTL_NR[machine]), (ld_w_abs, 0, 0, 24)]  # A = args[1]
    for command in _DENIED_IOCTLS:  # (the low 32 bits: ioctl's cmd is an unsigned int; both ABIs are LE)
        program += [(jeq_k, 0, 1, command), (ret_k, 0, 0, eperm)]
    return program + [(ret_k, 0, 0, allow)]


def _seccomp(machine):
    """Install the filter of `_seccomp_program` on this process and everything it starts."""
    if machine not in _SECCOMP_ARCH:
        raise _SetupError("seccomp", f"no syscall table for architecture {machine!r}")
    ctypes, libc = _libc()

    class Filter(ctypes.Structure):
        _fields_ = [("code", ctypes.c_uint16), ("jt", ctypes.c_uint8), ("jf", ctypes.c_uint8), ("k", ctypes.c_uint32)]

    class Prog(ctypes.Structure):
        _fields_ = [("len", ctypes.c_uint16), ("filter", ctypes.POINTER(Filter))]

    program = _seccomp_program(machine)
    filters = (Filter * len(program))(*[Filter(*ins) for ins in program])
    prog = Prog(len(program), filters)
    L = ctypes.c_ulong
    if libc.prctl(_PR_SET_SECCOMP, L(_SECCOMP_MODE_FILTER), ctypes.byref(prog), L(0), L(0)) != 0:
        raise _SetupError("seccomp", os.strerror(ctypes.get_errno()))


def _not_dumpable():
    """The tests' process: no core dumps, and its /proc files (mem, fd, environ) become root's, so
    another process of the same uid (the solution's, when no uid is dropped) cannot open them."""
    if not sys.platform.startswith("linux"):
        return
    ctypes, libc = _libc()
    L = ctypes.c_ulong
    if libc.prctl(_PR_SET_DUMPABLE, L(0), L(0), L(0), L(0)) != 0:
        raise _SetupError("dumpable", os.strerror(ctypes.get_errno()))


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


def _open_packages(packages):
    """{name: directory} of the third-party packages the parent allows (numpy), each opened now and
    reached later through its /proc/self/fd link, like the stdlib after the uid drop."""
    pinned = {}
    for name, path in packages.items():
        try:
            pinned[name] = f"/proc/self/fd/{os.open(path, os.O_RDONLY | os.O_DIRECTORY)}"
        except OSError:
            pass  # removed since the parent looked: the import fails as it would without the package
    return pinned


class _PinnedPackages:
    """A meta-path finder for the allowed third-party packages (the interpreter runs without
    site-packages, and Landlock lets it read only those packages' directories there)."""

    def __init__(self, directories):
        self.directories = directories

    def find_spec(self, name, path=None, target=None):
        directory = self.directories.get(name)
        if directory is None:
            return None
        import importlib.util  # here: only a program that imports an allowed package needs it

        init = directory + "/__init__.py"
        return importlib.util.spec_from_file_location(name, init, submodule_search_locations=[directory])


def _setup(job):
    layers = job["layers"]
    _set_limits(job["limits"])
    stdlib = [os.path.realpath(p) for p in sys.path if os.path.isdir(p)]
    read_paths = stdlib + list(job["read_paths"])
    packages = _open_packages(job["packages"])
    if packages:
        sys.meta_path.append(_PinnedPackages(packages))
    if layers.get("drop_uid"):
        _pin_sys_path()
    if layers.get("private_shm"):
        _private_shm(job["limits"])  # before Landlock, which forbids mounting
    if layers.get("landlock") or layers.get("seccomp"):
        _no_new_privs()
    if layers.get("landlock"):
        # The stdlib directory holds site-packages: the program may import only the allowed packages
        # (their own directories are read paths), not whatever else is installed, nor read its data.
        stdlib_sites = [d + "/" + name for d in stdlib for name in ("site-packages", "dist-packages")]
        visible = _visible(read_paths, list(job["hidden_paths"]) + stdlib_sites)
        _landlock(job["landlock_abi"], os.getcwd(), visible, ["/dev/shm"] if layers.get("private_shm") else [])
    if layers.get("drop_uid"):
        _drop_uid(job["uid"])
    if layers.get("seccomp"):
        _seccomp(job["machine"])
    if job["role"] == "tests":
        _not_dumpable()  # last: changing uid resets the flag
