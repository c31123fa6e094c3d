"""Trusted harness that runs *inside* the sandbox process; never imported by the trainer.

`sandbox.py` starts `python -S -s [-P] -c <this file's source> JOB_FD MARKER_FD IN_FD OUT_FD` (under
`unshare` when available; -1 for an fd the role has none of). This code reads the job (role, program or
tests, limits, isolation layers) from JOB_FD, applies the limits and isolation to its own process, then
plays one of three roles:

- `script`: runs the program as `__main__` (stdin/stdout tests; the parent compares the output);
- `serve`: the solution's process. Runs the program (a main block ends without failing it: see
  `_compile_solution`), reports the names it defines, then answers calls `name(*args, **kwargs)` that
  arrive on IN_FD with their results on OUT_FD, as plain data only;
- `tests`: the tests' process, a fresh interpreter that never loads the solution. The tests run here,
  with every name the solution defines bound to a stub that asks the solution's process over the pipes
  (a builtin's name only for the function under test: see `_shadowing`). It writes the per-run nonce
  (which only this role is given) to MARKER_FD after the tests and `check(entry_point)` returned
  normally, no call failed and at least one was made.

So the verdict is computed from plain data (None, bool, numbers, str, bytes, Fraction, Decimal, range
and the builtin and `collections` containers of them; see `_Encoder`), rebuilt by this harness in a
process the solution cannot reach: patched builtins, import hooks, frame walking, gc and objects with
rigged comparisons all act inside the solution's own process, where nothing the verdict depends on
lives, and a reply that process forges is checked as strictly as any other. Where the separation
would show, the protocol carries what one interpreter would share: containers are numbered, so
aliasing survives and a result that is (or holds) an argument is the caller's own object; the
arguments a call changed in place are sent back and written into the caller's objects; an iterator
stays in the solution's process and is read as the tests iterate; an exception keeps its builtin
class, except those that would act as control flow in the tests' process (StopIteration) and
BaseExceptions, which are recorded failures. Setup failures exit with status 121 and a line on stderr
naming the layer, so the parent can tell a broken sandbox from a broken program and never runs code
unconfined.

The harness uses only the standard library. The interpreter runs without site-packages; the program
may import the third-party packages the parent allows (numpy), found by `_PinnedPackages`.
"""

import _signal
import builtins
import collections  # already loaded by json (through re and functools): costs nothing here
import json
import marshal
import os
import resource
import stat
import sys

SETUP_FAILED = 121
PEER_GONE = 122  # tests role: the solution's process ended, or closed its end, before the tests finished
CPU_LIMIT_EXIT = 152  # 128 + SIGXCPU: reported as an exit code because `unshare --fork` (util-linux
# 2.38) fails to re-raise SIGXCPU/SIGKILL in itself and would turn them into a plain exit status 1

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
# or write another process's memory. Numbers from 424 on are shared by all architectures.
_SECCOMP_ARCH = {"x86_64": 0xC000003E, "aarch64": 0xC00000B7}
_NEW_SYSCALLS = {"io_uring_setup": 425, "fchmodat2": 452, "setxattrat": 463, "removexattrat": 466, "file_setattr": 469}
_DENIED_SYSCALLS = {
    "x86_64": {
        "socket": 41, "chmod": 90, "fchmod": 91, "fchmodat": 268, "chown": 92, "fchown": 93, "lchown": 94,
        "fchownat": 260, "utime": 132, "utimes": 235, "utimensat": 280, "futimesat": 261, "setxattr": 188,
        "lsetxattr": 189, "fsetxattr": 190, "removexattr": 197, "lremovexattr": 198, "fremovexattr": 199,
        "ptrace": 101, "process_vm_readv": 310, "process_vm_writev": 311, **_NEW_SYSCALLS,
    },
    "aarch64": {  # the generic table: no chmod/chown/lchown/utime/utimes/futimesat (only the *at forms)
        "socket": 198, "fchmod": 52, "fchmodat": 53, "fchownat": 54, "fchown": 55, "utimensat": 88,
        "setxattr": 5, "lsetxattr": 6, "fsetxattr": 7, "removexattr": 14, "lremovexattr": 15,
        "fremovexattr": 16, "ptrace": 117, "process_vm_readv": 270, "process_vm_writev": 271, **_NEW_SYSCALLS,
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
            add_rule(fd, rights if os.path.isdir(path) else rights & file_rights, path)
        finally:
            os.close(fd)
    if stat.S_ISREG(os.fstat(0).st_mode):  # stdin by path (/dev/stdin, /proc/self/fd/0) reopens this file
        add_rule(0, _LL_READ_FILE, "stdin")
    if libc.syscall(L(_SYS_LANDLOCK_RESTRICT), L(ruleset), L(0)) != 0:
        raise _SetupError("landlock", "restrict_self: " + os.strerror(ctypes.get_errno()))
    os.close(ruleset)


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
    read_paths = [os.path.realpath(p) for p in sys.path if os.path.isdir(p)] + list(job["read_paths"])
    packages = _open_packages(job["packages"])
    if packages:
        sys.meta_path.append(_PinnedPackages(packages))
    if layers.get("drop_uid"):
        _pin_sys_path()
    if layers.get("landlock") or layers.get("seccomp"):
        _no_new_privs()
    if layers.get("landlock"):
        _landlock(job["landlock_abi"], os.getcwd(), read_paths)
    if layers.get("drop_uid"):
        _drop_uid(job["uid"])
    if layers.get("seccomp"):
        _seccomp(job["machine"])
    if job["role"] == "tests":
        _not_dumpable()  # last: changing uid resets the flag


class _Quit:
    """`exit()`/`quit()` as the site module would define them (the interpreter runs with -S)."""

    def __init__(self, name):
        self.name = name

    def __repr__(self):
        return f"Use {self.name}() or Ctrl-D (i.e. EOF) to exit"

    def __call__(self, code=None):
        raise SystemExit(code)


builtins.exit, builtins.quit = _Quit("exit"), _Quit("quit")
_MAIN_BLOCK_ENDED = "__sandbox_main_block_ended__"


def _main_module(argv0):
    """The namespace of a fresh module registered as `__main__`, with `sys.argv` as `python <argv0>`
    gives it, so `unittest.main()`, pickle and `sys.modules[__name__]` see the code's own names (and
    not this harness, nor the harness's fds as command-line arguments)."""
    module = type(sys)("__main__")
    module.__dict__["__builtins__"] = builtins
    sys.modules["__main__"] = module
    sys.argv[:] = [argv0]
    return module.__dict__


def _run_script(program):
    """stdin/stdout mode: the program runs as __main__; the parent compares its output."""
    code = compile(program, "<solution>", "exec")
    exec(code, _main_module("solution.py"))


def _is_main_test(ast, test):
    """Whether an `if` test is `__name__ == "__main__"` (either way round)."""
    if not (isinstance(test, ast.Compare) and len(test.ops) == 1 and isinstance(test.ops[0], ast.Eq)):
        return False
    sides = (test.left, test.comparators[0])
    names = [s for s in sides if isinstance(s, ast.Name) and s.id == "__name__"]
    mains = [s for s in sides if isinstance(s, ast.Constant) and s.value == "__main__"]
    return len(names) == 1 and len(mains) == 1


def _compile_solution(program):
    """The program compiled with each top-level `if __name__ == "__main__":` block wrapped so that
    whatever the block raises (EOFError from input() on the empty stdin, SystemExit from sys.exit()
    or unittest.main(), any error of the program's own driver code) ends only that block, with a line
    on stderr: the program's definitions stay, and the tests judge them."""
    if "__main__" not in program:
        return compile(program, "<solution>", "exec")
    import ast  # here: only a program that may have a main block needs the parser

    tree = ast.parse(program, "<solution>")
    for index, node in enumerate(tree.body):
        if isinstance(node, ast.If) and _is_main_test(ast, node.test):
            report = ast.Expr(ast.Call(ast.Name(_MAIN_BLOCK_ENDED, ast.Load()), [], []))
            handler = ast.ExceptHandler(ast.Name("BaseException", ast.Load()), None, [report])
            tree.body[index] = ast.copy_location(ast.Try([node], [handler], [], []), node)
    return compile(ast.fix_missing_locations(tree), "<solution>", "exec")


def _main_block_ended():
    """Called in the handler around a main block: says on stderr how it ended (not a failure)."""
    error = sys.exc_info()[1]
    line = f"sandbox: the program's main block ended with {type(error).__name__}: {_message(error)[:200]}\n"
    try:
        os.write(2, line.encode("utf-8", "replace"))
    except OSError:  # the program closed its stderr
        pass


# ------------------------------------------------------------------------------ plain data on the wire

_MAX_DEPTH = 100  # nesting of a value; deeper (or self-containing) values are not plain data
_MAX_FRAME_BYTES = 256 << 20
_MAX_EXPORTS = 10_000
_MAX_ITERATORS = 100_000  # live iterators one solution's process may hand over
_MAX_BATCH = 1024  # items of an iterator fetched per round trip (the batch doubles from 1)
_OrderedDict, _Counter, _defaultdict, _deque = (
    collections.OrderedDict, collections.Counter, collections.defaultdict, collections.deque
)  # fmt: skip
# Container tags, subclasses before their bases; each container of a message gets a number (below).
_CONTAINERS = (
    (_OrderedDict, "O"), (_Counter, "K"), (_defaultdict, "d"), (dict, "D"), (list, "L"), (tuple, "T"),
    (set, "E"), (frozenset, "Z"), (bytearray, "y"), (_deque, "Q"),
)  # fmt: skip
_EXACT_CONTAINERS = dict(_CONTAINERS)
_CONTAINER_TAGS = frozenset(tag for _, tag in _CONTAINERS)
_PAIRS = frozenset("OKdD")  # tags whose contents are key-value pairs
_MUTABLE = frozenset("OKdDLEyQ")  # tags of the containers a call may change in place
_CONTENTS = {
    "O": _OrderedDict.items, "K": dict.items, "d": dict.items, "D": dict.items, "L": list.__iter__,
    "T": tuple.__iter__, "E": set.__iter__, "Z": frozenset.__iter__, "y": bytearray.__iter__, "Q": _deque.__iter__,
}  # fmt: skip
_FACTORIES = {t.__name__: t for t in (int, float, complex, str, bytes, bool, list, tuple, dict, set, frozenset)}
_BUILDING = object()  # a container whose number is taken while its items are decoded


class _NotPlain(Exception):
    """A value that has no plain-data form."""


class _BadWire(Exception):
    """A message that breaks the protocol (only a hostile solution's process sends one)."""


_DECODE_ERRORS = (_BadWire, ValueError, TypeError, RecursionError, ArithmeticError, IndexError)


def _scalar(value):
    """[tag, payload] of None, a bool, number, str or bytes (a subclass as its base type), else None."""
    kind = type(value)
    if kind is int:
        return ["I", format(value, "x")]
    if kind is str:
        return ["S", value]
    if value is None or value is True or value is False:
        return ["N" if value is None else "B", value]
    if isinstance(value, int):
        return ["I", format(int.__int__(value), "x")]
    if isinstance(value, float):
        return ["F", float.hex(float.__float__(value))]
    if isinstance(value, complex):
        return ["C", [float.hex(float(value.real)), float.hex(float(value.imag))]]
    if isinstance(value, str):
        return ["S", str.__str__(value)]
    if isinstance(value, bytes):
        return ["Y", bytes(value).hex()]
    return None


def _container_tag(value):
    tag = _EXACT_CONTAINERS.get(type(value))
    if tag is not None:
        return tag
    for kind, tag in _CONTAINERS:
        if isinstance(value, kind):
            return tag
    return None


def _contents(value, tag):
    """A container's items (key-value pairs for mappings), read through its base type."""
    return list(_CONTENTS[tag](value))


def _factory_name(factory):
    """A defaultdict's default factory by name, if it is a builtin type (else None: no default)."""
    return next((name for name, kind in _FACTORIES.items() if kind is factory), None)


class _Encoder:
    """Values as JSON-ready tagged data, [tag, payload]. Each container gets the next number of the
    message when first met (depth first, in order), and a later reference to it is sent as ["R", n], so
    aliasing survives the trip; a value that contains itself is not plain data. `known` holds the
    other side's objects (a call's containers, numbered as in its request): they are sent as ["A", n].
    `hand_over` (solution's replies only) keeps an iterator in this process and numbers it."""

    def __init__(self, known=(), hand_over=None):
        self.known = {id(value): number for number, value in enumerate(known)} if known else {}
        self.numbers, self.objects, self.tags, self.open = {}, [], [], set()
        self.hand_over = hand_over

    def encode(self, value, depth=0):
        kind = type(value)
        if kind is int:  # the commonest types first, without a call
            return ["I", format(value, "x")]
        if kind is str:
            return ["S", value]
        if depth > _MAX_DEPTH:
            raise _NotPlain(f"nested deeper than {_MAX_DEPTH} levels")
        scalar = _scalar(value)
        if scalar is not None:
            return scalar
        key = id(value)
        if key in self.known:
            return ["A", self.known[key]]
        if key in self.numbers:
            if key in self.open:
                raise _NotPlain("it contains itself")
            return ["R", self.numbers[key]]
        tag = _container_tag(value)
        if tag is None:
            return self.other(value)
        self.numbers[key] = len(self.objects)
        self.objects.append(value)
        self.tags.append(tag)
        self.open.add(key)
        payload = self.body(value, tag, depth)
        self.open.discard(key)
        return [tag, payload]

    def body(self, value, tag, depth):
        """A container's payload: its items or pairs; deque and defaultdict put their maxlen and
        default factory first; a bytearray is hex."""
        contents = _contents(value, tag)
        if tag == "y":
            return bytes(contents).hex()
        if tag in _PAIRS:
            items = [[self.encode(k, depth + 1), self.encode(v, depth + 1)] for k, v in contents]
        else:
            items = [self.encode(item, depth + 1) for item in contents]
        if tag == "d":
            return [_factory_name(_defaultdict.default_factory.__get__(value)), items]
        if tag == "Q":
            return [_deque.maxlen.__get__(value), items]
        return items

    def other(self, value):
        """Fractions, decimals, ranges, numpy scalars (as the Python scalar they hold) and, in the
        solution's replies, iterators; anything else raises _NotPlain."""
        fractions, decimal, numpy = (sys.modules.get(name) for name in ("fractions", "decimal", "numpy"))
        if fractions is not None and isinstance(value, fractions.Fraction):
            return ["Fr", [format(int(value.numerator), "x"), format(int(value.denominator), "x")]]
        if decimal is not None and isinstance(value, decimal.Decimal):
            return ["Dc", str(value)]
        if isinstance(value, range):
            return ["Rg", [format(n, "x") for n in (value.start, value.stop, value.step)]]
        if numpy is not None and isinstance(value, numpy.generic) and _scalar(value.item()) is not None:
            return _scalar(value.item())
        if self.hand_over is not None and hasattr(type(value), "__next__"):
            return ["G", self.hand_over(value)]
        raise _NotPlain(f"{type(value).__name__!r} is not plain data")


_SCALAR_PARSERS = {"I": lambda text: int(text, 16), "F": float.fromhex, "S": str, "Y": bytes.fromhex}


def _scalar_value(tag, payload):
    """The value of a scalar [tag, payload] (see _scalar and _Encoder.other)."""
    if (tag == "N" and payload is None) or (tag == "B" and type(payload) is bool):
        return payload
    if tag in ("I", "F", "S", "Y", "Dc") and type(payload) is str:
        if tag == "Dc":
            import decimal  # here: only a message that holds a Decimal needs the module

            return decimal.Decimal(payload)
        return _SCALAR_PARSERS[tag](payload)
    if tag in ("C", "Fr", "Rg") and type(payload) is list and all(type(p) is str for p in payload):
        if tag == "C" and len(payload) == 2:
            return complex(float.fromhex(payload[0]), float.fromhex(payload[1]))
        if tag == "Rg" and len(payload) == 3:
            return range(*(int(p, 16) for p in payload))  # base 16: linear in the length, no digit limit
        if tag == "Fr" and len(payload) == 2:
            import fractions  # here: only a message that holds a Fraction needs the module

            return fractions.Fraction(int(payload[0], 16), int(payload[1], 16))
    raise _BadWire(f"malformed value with tag {tag[:8]!r}")


class _InOrder:
    """Mixin of the set types below: iterate in the sender's order while the elements are the ones sent."""

    __slots__ = ()

    def __iter__(self):
        if len(self) == len(self.order) and all(item in self for item in self.order):
            return iter(self.order)
        return super().__iter__()


class _SetInOrder(_InOrder, set):
    """A set that iterates and prints in the order the solution's set did (see _set_in_order)."""

    def __init__(self, items=()):
        set.__init__(self, items)
        self.order = tuple(items)

    def __repr__(self):
        return "{" + ", ".join(map(repr, self)) + "}" if self else "set()"


class _FrozenSetInOrder(_InOrder, frozenset):
    """A frozenset that iterates and prints in the order the solution's did (see _set_in_order)."""

    def __new__(cls, items=()):
        value = frozenset.__new__(cls, items)
        value.order = tuple(items)
        return value

    def __repr__(self):
        return "frozenset({" + ", ".join(map(repr, self)) + "})" if self else "frozenset()"


def _set_in_order(tag, items):
    """A set (frozenset) that iterates in the sender's order. Inserting the items in that order gives
    a plain set with that order, unless the sender's table was larger or held deleted slots (a set
    that grew, then lost elements); then a subclass that iterates and prints in the sender's order."""
    kind, ordered = (set, _SetInOrder) if tag == "E" else (frozenset, _FrozenSetInOrder)
    value = kind(items)
    if len(value) != len(items):
        raise _BadWire("a set with equal elements")
    if all(a is b for a, b in zip(value, items)):
        return value
    return ordered(items)


def _build(tag, extra, items):
    """The container of `tag` holding the decoded `items` (pairs for mappings)."""
    if tag == "L":
        return items
    if tag == "T":
        return tuple(items)
    if tag in ("E", "Z"):
        return _set_in_order(tag, items)
    if tag == "D":
        return dict(items)
    if tag == "O":
        return _OrderedDict(items)
    if tag == "K":
        counter = _Counter()
        dict.update(counter, items)  # as they are: Counter.update would add counts
        return counter
    if tag == "d" and (extra is None or (type(extra) is str and extra in _FACTORIES)):
        return _defaultdict(_FACTORIES.get(extra), items)
    if tag == "Q" and (extra is None or (type(extra) is int and extra >= 0)):
        return _deque(items, extra)
    raise _BadWire(f"malformed {tag} container")


class _Decoder:
    """Rebuilds `_Encoder` messages from builtin and standard-library types only; anything malformed
    raises one of _DECODE_ERRORS. `known`: the caller's containers by their number in its request;
    `remote(handle)`: the tests' local generator over an iterator the solution handed over."""

    def __init__(self, known=(), remote=None):
        self.known, self.remote = known, remote
        self.objects, self.tags = [], []

    def decode(self, item, depth=0):
        if depth > _MAX_DEPTH or type(item) is not list or len(item) != 2 or type(item[0]) is not str:
            raise _BadWire("malformed value")
        tag, payload = item
        if tag == "S" and type(payload) is str:
            return payload
        if tag in _CONTAINER_TAGS:
            return self.container(tag, payload, depth)
        if tag in ("A", "R", "G"):
            return self.reference(tag, payload)
        return _scalar_value(tag, payload)

    def container(self, tag, payload, depth, numbered=True):
        """A container from its payload, numbered as the encoder numbered it; a state (new contents
        for one of the caller's containers, which has its number) is not numbered."""
        number = len(self.objects)
        if numbered:
            self.objects.append(_BUILDING)
            self.tags.append(tag)
        if tag == "y":
            value = bytearray.fromhex(payload)
        else:
            extra, items = payload if tag in ("d", "Q") else (None, payload)
            if type(items) is not list:
                raise _BadWire(f"malformed {tag} container")
            if tag in _PAIRS:
                items = [self.pair(pair, depth) for pair in items]
            else:
                items = [self.decode(item, depth + 1) for item in items]
            value = _build(tag, extra, items)
        if numbered:
            self.objects[number] = value
        return value

    def pair(self, pair, depth):
        if type(pair) is not list or len(pair) != 2:
            raise _BadWire("malformed key-value pair")
        return self.decode(pair[0], depth + 1), self.decode(pair[1], depth + 1)

    def reference(self, tag, number):
        if type(number) is not int or number < 0:
            raise _BadWire("malformed reference")
        if tag == "A" and number < len(self.known):
            return self.known[number]
        if tag == "R" and number < len(self.objects) and self.objects[number] is not _BUILDING:
            return self.objects[number]
        if tag == "G" and self.remote is not None:
            return self.remote(number)
        raise _BadWire(f"a reference ({tag}) to nothing")


def _write_message(fd, message, write=os.write):
    """One length-prefixed JSON message (ASCII: lone surrogates travel as escapes)."""
    data = json.dumps(message, separators=(",", ":")).encode("ascii")
    view = memoryview(len(data).to_bytes(4, "big") + data)
    while view:
        view = view[write(fd, view) :]


def _read_exact(fd, size, read=os.read):
    chunks, got = [], 0
    while got < size:
        chunk = read(fd, min(size - got, 1 << 20))
        if not chunk:
            raise EOFError("the other process closed the channel")
        chunks.append(chunk)
        got += len(chunk)
    return b"".join(chunks)


def _read_message(fd):
    """One message from `_write_message`; EOFError if the sender is gone, _BadWire if it is malformed."""
    size = int.from_bytes(_read_exact(fd, 4), "big")
    if size > _MAX_FRAME_BYTES:
        raise _BadWire(f"message of {size} bytes")
    try:
        return json.loads(_read_exact(fd, size))
    except (ValueError, RecursionError) as e:
        raise _BadWire(f"message is not JSON ({type(e).__name__})") from None


# ------------------------------------------------------------------------------ the solution's process


def _snapshot(value, tag):
    """What a mutable container holds, flat, for an identity comparison (None for immutable ones)."""
    if tag not in _MUTABLE:
        return None
    items = _contents(value, tag)
    flat = [part for pair in items for part in pair] if tag in _PAIRS else items
    if tag == "d":
        flat.append(_defaultdict.default_factory.__get__(value))
    return flat


class _Arguments:
    """The containers a call received, numbered as in its request, and what they held when last sent,
    so that those the call changed in place (items compared by identity: a reordering, a replaced or
    an added item counts) go back to the tests' process and into the caller's own objects."""

    def __init__(self, objects, tags):
        self.objects, self.tags = objects, tags
        self.before = [_snapshot(value, tag) for value, tag in zip(objects, tags)]

    def states(self, encoder):
        """[[number, [tag, new contents]], ...] for the containers changed since the last look."""
        states = []
        for number, (value, tag) in enumerate(zip(self.objects, self.tags)):
            before = self.before[number]
            if before is None:
                continue
            now = _snapshot(value, tag)
            if len(now) != len(before) or any(a is not b for a, b in zip(now, before)):
                states.append([number, [tag, encoder.body(value, tag, 1)]])
                self.before[number] = now
        return states


def _serve(program, requests_fd, replies_fd):
    """Run the solution, report its names (functions and classes as callables, modules by their own
    name), then answer calls and iterator requests until the tests' process closes the channel."""
    namespace = _main_module("solution.py")
    namespace[_MAIN_BLOCK_ENDED] = _main_block_ended
    exec(_compile_solution(program), namespace)
    namespace.pop(_MAIN_BLOCK_ENDED, None)
    _write_message(replies_fd, ["ready", _exports(namespace)])
    iterators = []  # (iterator, the _Arguments of the call that returned it), by handle
    while True:
        try:
            request = _read_message(requests_fd)
        except EOFError:
            return
        kind = request[0] if type(request) is list and request else None
        if kind == "call" and len(request) == 4:
            reply = _answer(namespace, request, iterators)
        elif kind == "next" and len(request) == 3:
            reply = _next_items(request, iterators)
        else:
            reply = ["bad", "malformed request"]
        _write_message(replies_fd, reply)


def _exports(namespace):
    """[name, "call" | "module"] for the solution's public names the tests may use."""
    module_type = type(sys)
    exports = []
    for name, value in list(namespace.items()):
        if not isinstance(name, str) or name.startswith("__"):
            continue
        if isinstance(value, module_type):
            if getattr(value, "__name__", None) == name:
                exports.append([name, "module"])
        elif callable(value):
            exports.append([name, "call"])
    return exports


def _answer(namespace, request, iterators):
    """The reply to ["call", name, args, kwargs]: ["ok", value, states] | ["raise", error, states] |
    ["bad", reason]; `states` holds the new contents of the argument containers the call changed."""
    try:
        _, name, args, kwargs = request
        function = namespace[name]
        decoder = _Decoder()
        args = [decoder.decode(a) for a in args]
        kwargs = {str(k): decoder.decode(v) for k, v in kwargs}
    except Exception as e:
        return ["bad", f"malformed call ({type(e).__name__})"]
    arguments = _Arguments(decoder.objects, decoder.tags)
    encoder = _Encoder(arguments.objects, lambda iterator: _hand_over(iterators, iterator, arguments))
    try:
        result = function(*args, **kwargs)
    except BaseException as e:  # SystemExit too: the tests' process reports it as a failed call
        head = ["raise", _error_info(e)]
    else:
        try:
            head = ["ok", encoder.encode(result)]
        except Exception as e:  # _NotPlain, or a container whose iteration fails
            return ["bad", f"the result of {name}() is not plain data: {_message(e)}"]
    try:
        return head + [arguments.states(encoder)]
    except Exception as e:
        return ["bad", f"an argument of {name}() holds data that is not plain after the call: {_message(e)}"]


def _hand_over(iterators, iterator, arguments):
    """Keep an iterator a call returned; its handle lets the tests' process ask for its items."""
    if len(iterators) >= _MAX_ITERATORS:
        raise _NotPlain(f"more than {_MAX_ITERATORS} iterators handed over")
    iterators.append((iterator, arguments))
    return len(iterators) - 1


def _next_items(request, iterators):
    """The reply to ["next", handle, count]: ["items", values, end, states], where `end` is None (more
    may follow), "done", or ["raise", error]; the states are those of the arguments of the call that
    returned the iterator, which its items may still change."""
    _, handle, count = request
    if not (type(handle) is int and 0 <= handle < len(iterators) and type(count) is int and 0 < count):
        return ["bad", "malformed request for items"]
    iterator, arguments = iterators[handle]
    items, end = [], None
    try:
        while len(items) < min(count, _MAX_BATCH):
            items.append(next(iterator))
    except StopIteration:
        end = "done"
    except BaseException as e:  # the tests' process reports it where the tests reach it
        end = ["raise", _error_info(e)]
    encoder = _Encoder(arguments.objects, lambda more: _hand_over(iterators, more, arguments))
    try:
        return ["items", [encoder.encode(item) for item in items], end, arguments.states(encoder)]
    except Exception as e:
        return ["bad", f"an item of an iterator is not plain data: {_message(e)}"]


def _error_info(error):
    """[type name, name of its nearest builtin class, message, args or None] of a raised exception."""
    kind = type(error)
    base = next((c.__name__ for c in kind.__mro__ if getattr(builtins, c.__name__, None) is c), "BaseException")
    try:
        args = _Encoder().encode(tuple(error.args))
    except Exception:  # args that are not plain data: the message stands in for them
        args = None
    return [kind.__name__, base, _message(error), args]


def _message(error):
    try:
        return str(error)[:2000]
    except Exception:
        return "<unprintable>"


# ------------------------------------------------------------------------------ the tests' process


class _CallFailed(BaseException):
    """A call to the solution that failed as no function's call can pass: a result that is not plain
    data, a broken protocol, or an exception that must not act as control flow in the tests' process
    (SystemExit, KeyboardInterrupt, GeneratorExit, other BaseExceptions, StopIteration). A
    BaseException, so `except Exception` in the tests does not catch it; recorded either way."""


class _PeerGone(_CallFailed):
    """The solution's process ended (or closed the channel) before answering."""


_CONTROL_FLOW = (StopIteration, StopAsyncIteration)  # end an iteration when raised by a callback (map, iter)
_STAND_INS = {}


def _stand_in(type_name, kind):
    """A subclass of the builtin exception `kind` named like the solution's own exception class, so
    that `except ValueError` catches the solution's `class BadInput(ValueError)` as it would in one
    interpreter (and `except BadInput` cannot: the tests cannot name it)."""
    key = (type_name, kind)
    if key not in _STAND_INS:
        try:
            _STAND_INS[key] = type(type_name, (kind,), {"__module__": "solution"})
        except TypeError:  # not a valid class name
            _STAND_INS[key] = kind
    return _STAND_INS[key]


def _instantiate(kind, args, message):
    try:
        return kind(*args) if args is not None else kind(message)
    except Exception:  # a constructor that wants other arguments: skip its __init__
        return kind.__new__(kind, message)


class _Channel:
    """The tests' end of the pipes to the solution's process. Every harness-level failure is kept, so a
    test that catches it still fails the case."""

    def __init__(self, replies_fd, requests_fd):
        self.replies_fd, self.requests_fd = replies_fd, requests_fd
        self.failures = []
        self.calls = 0

    def fail(self, error):
        self.failures.append(error)
        return error

    def send(self, request):
        try:
            _write_message(self.requests_fd, request)
        except OSError:
            raise self.fail(_PeerGone("the solution's process ended before answering")) from None

    def receive(self):
        try:
            return _read_message(self.replies_fd)
        except EOFError:
            raise self.fail(_PeerGone("the solution's process ended before answering")) from None
        except _BadWire as e:
            raise self.fail(_CallFailed(f"the solution's process broke the protocol: {e}")) from None

    def exports(self):
        message = self.receive()
        if type(message) is not list or len(message) != 2 or message[0] != "ready" or type(message[1]) is not list:
            raise self.fail(_CallFailed("the solution's process broke the protocol: no list of names"))
        return message[1][:_MAX_EXPORTS]

    def call(self, name, args, kwargs):
        """The solution's `name(*args, **kwargs)`: its value, or the exception it raised; the argument
        containers it changed are changed here too, in place."""
        encoder = _Encoder()
        try:
            encoded = [encoder.encode(a) for a in args], [[k, encoder.encode(v)] for k, v in kwargs.items()]
        except Exception as e:  # _NotPlain, or a container whose iteration fails
            raise self.fail(_CallFailed(f"an argument to {name}() is not plain data: {_message(e)}")) from None
        self.calls += 1
        self.send(["call", name, *encoded])
        caller = (encoder.objects, encoder.tags)
        reply = self.receive()
        kind = reply[0] if type(reply) is list and reply else None
        if kind == "ok" and len(reply) == 3:
            return self.settle(name, caller, reply[2], lambda decoder: decoder.decode(reply[1]))
        if kind == "raise" and len(reply) == 3:
            raise self.settle(name, caller, reply[2], lambda decoder: self.error(name, reply[1]))
        raise self.fail(_CallFailed(_bad_reason(reply)))

    def next_items(self, name, handle, count, caller):
        """([items], end) of an iterator `name()` returned: end is None (more may follow), "done", or
        the exception to raise after the items."""
        self.send(["next", handle, count])
        reply = self.receive()
        if not (type(reply) is list and len(reply) == 4 and reply[0] == "items" and type(reply[1]) is list):
            raise self.fail(_CallFailed(_bad_reason(reply)))
        end = reply[2]

        def head(decoder):
            items = [decoder.decode(item) for item in reply[1]]
            if end is None or end == "done":
                return items, end
            if type(end) is list and len(end) == 2 and end[0] == "raise":
                return items, self.error(name, end[1])
            raise _BadWire("malformed end of items")

        return self.settle(name, caller, reply[3], head)

    def settle(self, name, caller, states, head):
        """Decode a reply's value (`head(decoder)`) and its states with one decoder, write the states
        into the caller's containers, and return the value."""
        objects, tags = caller
        decoder = _Decoder(objects, lambda handle: _remote_items(self, name, handle, caller))
        try:
            value = head(decoder)
            changes = _decode_states(decoder, states, tags)
        except _DECODE_ERRORS as e:
            raise self.fail(_CallFailed(f"the solution's process broke the protocol: {e}")) from None
        for number, new in changes:
            _write_back(objects[number], tags[number], new)
        return value

    def error(self, name, info):
        """The exception the tests see for one the solution raised: the builtin exception itself, or a
        stand-in subclass of the nearest builtin class for the solution's own classes. Exceptions that
        would act as control flow here (StopIteration swallowed by map() or all()) and BaseExceptions
        (SystemExit, KeyboardInterrupt, GeneratorExit, the solution's own) are recorded failures."""
        if not (type(info) is list and len(info) == 4 and all(type(x) is str for x in info[:3])):
            raise _BadWire("malformed exception")
        type_name, base_name, message, args = info
        args = None if args is None else _Decoder().decode(args)
        kind = getattr(builtins, base_name, None) if base_name.isidentifier() else None
        if not (isinstance(kind, type) and issubclass(kind, BaseException)):
            raise _BadWire("an exception whose builtin class is unknown")
        if not issubclass(kind, Exception) or issubclass(kind, _CONTROL_FLOW):
            return self.fail(_CallFailed(f"{name}() raised {type_name}: {message[:200]}"))
        if type_name != base_name and type_name.isidentifier():
            kind = _stand_in(type_name, kind)
        return _instantiate(kind, args if type(args) is tuple else None, message)


def _bad_reason(reply):
    if type(reply) is list and len(reply) == 2 and reply[0] == "bad" and type(reply[1]) is str:
        return reply[1][:2000]
    return "malformed reply"


def _decode_states(decoder, states, tags):
    """[(number, new contents)] from a reply's states: each names one changed container of the call,
    once, with contents of that container's own kind."""
    if type(states) is not list:
        raise _BadWire("malformed states")
    changes, seen = [], set()
    for state in states:
        if not (type(state) is list and len(state) == 2 and type(state[0]) is int and type(state[1]) is list):
            raise _BadWire("malformed state")
        number, body = state
        if len(body) != 2 or not 0 <= number < len(tags) or number in seen or body[0] != tags[number]:
            raise _BadWire("a state for no argument of the call")
        if tags[number] not in _MUTABLE:
            raise _BadWire("a state for an immutable argument")
        seen.add(number)
        changes.append((number, decoder.container(body[0], body[1], 1, numbered=False)))
    return changes


def _write_back(target, tag, new):
    """Write the new contents a call gave one of the caller's containers into it, in place, through
    its base type: the caller's object keeps its identity and its type."""
    if tag == "L":
        list.__setitem__(target, slice(None), new)
    elif tag == "y":
        bytearray.__setitem__(target, slice(None), new)
    elif tag == "E":
        set.clear(target)
        set.update(target, iter(new))  # iter(): in the solution's order (see _set_in_order)
    elif tag == "Q":
        _deque.clear(target)
        _deque.extend(target, new)
    elif tag == "O":
        _OrderedDict.clear(target)
        _OrderedDict.update(target, new)
    else:
        dict.clear(target)
        dict.update(target, new)
        if tag == "d":
            target.default_factory = new.default_factory


def _remote_items(channel, name, handle, caller):
    """A local generator over an iterator that `name()` returned, which stays in the solution's process:
    items are fetched as the tests take them, 1, 2, 4, ... up to _MAX_BATCH a round trip, so an
    endless generator costs what the tests take (and at most as many again)."""
    count = 1
    while True:
        items, end = channel.next_items(name, handle, count, caller)
        yield from items
        if isinstance(end, BaseException):
            raise end
        if end == "done":
            return
        count = min(2 * count, _MAX_BATCH)


def _stub(channel, name):
    """A local function that forwards calls to the solution's `name`."""

    def call(*args, **kwargs):
        return channel.call(name, args, kwargs)

    call.__name__ = call.__qualname__ = name
    return call


def _shadowing(exports, entry_point, tests):
    """The solution's callables that shadow a builtin in the tests' namespace, as in one interpreter,
    where that name is the function under test: the entry point, or without one, the builtin-named
    callables the tests use when they use none of the solution's other callables (an MBPP task
    `assert round(2.5) == 3`). A builtin with which the tests judge a result of another function
    (`abs(candidate(x) - y) < 1e-9`, `abs(sum(xs) - 3)`) stays the real one, so a program cannot
    redefine the judge."""
    callables = {item[0] for item in exports if type(item) is list and len(item) == 2 and item[1] == "call"}
    shadowing = {name for name in callables if type(name) is str and hasattr(builtins, name)}
    if entry_point:
        return shadowing & {entry_point}
    if not shadowing:
        return set()
    try:
        used, judges = _uses(tests, callables)
    except (SyntaxError, ValueError):
        return set()  # compiling the tests fails the case anyway
    return set() if used & (callables - shadowing) else (shadowing & used) - judges


def _uses(tests, callables):
    """(names the tests read, those of `callables` the tests call on an expression that calls another
    of `callables`: judges of its result, not functions under test)."""
    import ast  # here: only tests of a program that defines a builtin's name need the parser

    used, judges = set(), set()
    for node in ast.walk(ast.parse(tests)):
        if isinstance(node, ast.Name):
            used.add(node.id)
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in callables:
            arguments = node.args + [keyword.value for keyword in node.keywords]
            inner = {n.func.id for a in arguments for n in ast.walk(a) if isinstance(n, ast.Call)
                     and isinstance(n.func, ast.Name) and n.func.id in callables}  # fmt: skip
            if inner - {node.func.id}:
                judges.add(node.func.id)
    return used, judges


def _bindings(exports, channel, shadowing, packages):
    """The tests' view of the solution's names: stubs for its callables, this interpreter's own copy
    of the standard-library (or allowed third-party) modules it imported under their own names.
    Dunders, builtin names not in `shadowing`, and anything malformed are skipped."""
    bound = {}
    for item in exports:
        if type(item) is not list or len(item) != 2 or type(item[0]) is not str:
            continue
        name, kind = item
        if not name.isidentifier() or name.startswith("__") or (hasattr(builtins, name) and name not in shadowing):
            continue
        if kind == "call":
            bound[name] = _stub(channel, name)
        elif kind == "module" and (name in sys.stdlib_module_names or name in packages):
            if name not in ("antigravity", "this"):
                try:
                    bound[name] = __import__(name)
                except Exception:
                    pass
    return bound


def _run_tests(tests, entry_point, replies_fd, requests_fd, marker_fd, nonce, packages):
    """The tests' process: bind the solution's names, run the tests and `check(entry_point)`, and write
    the nonce only if all of it returned normally (or the tests ended with a clean SystemExit, as
    `unittest.main()` does), no call to the solution failed, and the tests called it at least once."""
    sys.path[:] = [p for p in sys.path if p not in ("", ".")]  # never import from the working directory
    channel = _Channel(replies_fd, requests_fd)
    scope = _main_module("tests.py")
    try:
        exports = channel.exports()
        bound = _bindings(exports, channel, _shadowing(exports, entry_point, tests), packages)
        if entry_point and entry_point not in bound:
            raise channel.fail(_CallFailed(f"the program does not define {entry_point}()"))
        scope.update(bound)
        _run_trusted(compile(tests, "<tests>", "exec"), scope)
        if entry_point:
            _run_trusted(compile(f"check({entry_point})", "<check>", "exec"), scope)
    except BaseException:
        gone = [f for f in channel.failures if isinstance(f, _PeerGone)]
        if gone:  # whatever the tests made of it, the cause is the solution's process ending
            raise gone[0] from None
        raise
    if channel.failures:
        raise channel.failures[0]
    if not channel.calls:
        raise _CallFailed("the tests never called the program")
    sys.stdout.flush()
    os.write(marker_fd, nonce)


def _run_trusted(code, scope):
    """Run test code; a SystemExit it raises itself with a success code (0, None, False) is a normal
    end. (A SystemExit raised by the solution never arrives as one: it is a _CallFailed.)"""
    try:
        exec(code, scope)
    except SystemExit as e:
        if e.code not in (0, None, False):
            raise


def main():
    job_fd, marker_fd, in_fd, out_fd = (int(a) for a in sys.argv[1:5])
    job = _read_job(job_fd)
    try:
        _setup(job)
    except Exception as e:  # fail closed: never run the program half-confined
        layer, error = (e.layer, e.error) if isinstance(e, _SetupError) else ("unknown", repr(e))
        os.write(2, f"sandbox_setup_failed:{layer}:{error}\n".encode("utf-8", "replace"))
        os._exit(SETUP_FAILED)
    if job["role"] == "tests":
        _tests_main(job, in_fd, out_fd, marker_fd)
    elif job["role"] == "serve":  # no nonce and no marker fd exist in this process
        _serve(job.pop("program"), in_fd, out_fd)
    else:
        _run_script(job.pop("program"))


def _tests_main(job, replies_fd, requests_fd, marker_fd):
    """The tests' role, its harness-level failures reported as one line on stderr (exit 122 when the
    solution's process ended, else 1)."""
    try:
        nonce = job.pop("nonce")
        _run_tests(job["tests"], job["entry_point"], replies_fd, requests_fd, marker_fd, nonce, job["packages"])
    except _CallFailed as e:
        sys.stdout.flush()
        os.write(2, f"sandbox_call_failed: {e}\n".encode("utf-8", "replace"))
        os._exit(PEER_GONE if isinstance(e, _PeerGone) else 1)


if __name__ == "__main__":
    main()
