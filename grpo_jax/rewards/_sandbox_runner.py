"""Trusted harness that runs *inside* the sandbox process; never imported by the trainer.

`sandbox.py` starts `python -S -s [-P] -c <this file's source> JOB_FD MARKER_FD IN_FD OUT_FD` (under
`unshare` when available; -1 for an fd the role has none of). This code reads the job (role, program or
tests, limits, isolation layers) from JOB_FD, applies the limits and isolation to its own process, then
plays one of three roles:

- `script`: runs the program as `__main__` (stdin/stdout tests; the parent compares the output);
- `serve`: the solution's process. Runs the program, reports the names it defines, then answers calls
  `name(*args, **kwargs)` that arrive on IN_FD with their results on OUT_FD, as plain data only;
- `tests`: the tests' process, a fresh interpreter that never loads the solution. The tests run here,
  with every name the solution defines bound to a stub that asks the solution's process over the pipes.
  It writes the per-run nonce (which only this role is given) to MARKER_FD after the tests and
  `check(entry_point)` returned normally and no call failed.

So the verdict is computed from plain data (None, bool, int, float, complex, str, bytes and lists,
tuples, sets, frozensets, dicts of them), rebuilt by this harness in a process the solution cannot
reach: patched builtins, import hooks, frame walking, gc and objects with rigged comparisons all act
inside the solution's own process, where nothing the verdict depends on lives. Setup failures exit
with status 121 and a line on stderr naming the layer, so the parent can tell a broken sandbox from a
broken program and never runs code unconfined.

Only the standard library is used (the interpreter runs without site-packages).
"""

import _signal
import builtins
import json
import marshal
import os
import resource
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


def _run_script(program):
    """stdin/stdout mode: the program runs as __main__; the parent compares its output."""
    code = compile(program, "<solution>", "exec")
    exec(code, {"__name__": "__main__", "__builtins__": builtins})


# ------------------------------------------------------------------------------ plain data on the wire

_MAX_DEPTH = 100  # nesting of a value; deeper (or self-containing) values are not plain data
_MAX_FRAME_BYTES = 256 << 20
_MAX_EXPORTS = 10_000
_SEQUENCES = {"L": list, "T": tuple, "E": set, "Z": frozenset}


class _NotPlain(Exception):
    """A value that has no plain-data form."""


class _BadWire(Exception):
    """A message that breaks the protocol (only a hostile solution's process sends one)."""


def _to_wire(value, depth=0):
    """`value` as JSON-ready tagged data: [tag, payload]. Subclasses of the plain types are sent as
    their base type (a namedtuple as a tuple, a Counter as a dict, an IntEnum as an int); anything
    else (iterators, instances, functions) raises _NotPlain."""
    if depth > _MAX_DEPTH:
        raise _NotPlain(f"nested deeper than {_MAX_DEPTH} levels (or contains itself)")
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
    if isinstance(value, (bytes, bytearray)):
        return ["Y", bytes(value).hex()]
    for tag, kind in _SEQUENCES.items():
        if isinstance(value, kind):
            return [tag, [_to_wire(item, depth + 1) for item in kind.__iter__(value)]]
    if isinstance(value, dict):
        return ["D", [[_to_wire(k, depth + 1), _to_wire(v, depth + 1)] for k, v in dict.items(value)]]
    raise _NotPlain(f"{type(value).__name__!r} is not plain data")


def _from_wire(item, depth=0):
    """The value of a `_to_wire` message, rebuilt from builtin types only; anything else raises _BadWire."""
    if depth > _MAX_DEPTH or type(item) is not list or len(item) != 2 or type(item[0]) is not str:
        raise _BadWire("malformed value")
    tag, payload = item
    if (tag == "N" and payload is None) or (tag == "B" and type(payload) is bool):
        return payload
    if tag in ("I", "F", "S", "Y") and type(payload) is str:
        return _scalar(tag, payload)
    if tag == "C" and type(payload) is list and len(payload) == 2 and all(type(p) is str for p in payload):
        return complex(float.fromhex(payload[0]), float.fromhex(payload[1]))
    if tag in _SEQUENCES and type(payload) is list:
        return _SEQUENCES[tag](_from_wire(x, depth + 1) for x in payload)
    if tag == "D" and type(payload) is list and all(type(p) is list and len(p) == 2 for p in payload):
        return {_from_wire(k, depth + 1): _from_wire(v, depth + 1) for k, v in payload}
    raise _BadWire(f"malformed value with tag {tag[:8]!r}")


def _scalar(tag, text):
    if tag == "I":
        return int(text, 16)  # base 16: linear in the length, no digit limit
    if tag == "F":
        return float.fromhex(text)
    return text if tag == "S" else bytes.fromhex(text)


def _decode(item):
    """`_from_wire` with every failure turned into _BadWire (bad hex, unhashable keys, deep nesting)."""
    try:
        return _from_wire(item)
    except (ValueError, TypeError, RecursionError, OverflowError) as e:
        raise _BadWire(f"malformed value: {type(e).__name__}") from None


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


def _serve(program, requests_fd, replies_fd):
    """Run the solution, report its names (functions and classes as callables, modules by their own
    name), then answer calls until the tests' process closes the channel."""
    namespace = {"__name__": "__main__", "__builtins__": builtins}
    exec(compile(program, "<solution>", "exec"), namespace)
    _write_message(replies_fd, ["ready", _exports(namespace)])
    while True:
        try:
            request = _read_message(requests_fd)
        except EOFError:
            return
        _write_message(replies_fd, _answer(namespace, request))


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


def _answer(namespace, request):
    """The reply to ["call", name, args, kwargs]: ["ok", value] | ["raise", type, message, is_exception]
    | ["bad", reason]."""
    try:
        _, name, args, kwargs = request
        function = namespace[name]
        args = [_decode(a) for a in args]
        kwargs = {str(k): _decode(v) for k, v in kwargs}
    except Exception as e:
        return ["bad", f"malformed call ({type(e).__name__})"]
    try:
        result = function(*args, **kwargs)
    except BaseException as e:  # SystemExit too: the tests' process reports it as a failed call
        return ["raise", type(e).__name__, _message(e), isinstance(e, Exception)]
    try:
        return ["ok", _to_wire(result)]
    except Exception as e:  # _NotPlain, or a container whose iteration fails
        return ["bad", f"the result of {name}() is not plain data: {_message(e)}"]


def _message(error):
    try:
        return str(error)[:2000]
    except Exception:
        return "<unprintable>"


# ------------------------------------------------------------------------------ the tests' process


class _CallFailed(BaseException):
    """A call to the solution that has no Python-level outcome (non-plain result, protocol broken).
    A BaseException, so `except Exception` in the tests does not catch it; recorded either way."""


class _PeerGone(_CallFailed):
    """The solution's process ended (or closed the channel) before answering."""


class _CandidateError(Exception):
    """Stands in for an exception class of the solution's own (the tests cannot name it anyway)."""


class _Channel:
    """The tests' end of the pipes to the solution's process. Every harness-level failure is kept, so a
    test that catches it still fails the case."""

    def __init__(self, replies_fd, requests_fd):
        self.replies_fd, self.requests_fd = replies_fd, requests_fd
        self.failures = []

    def fail(self, error):
        self.failures.append(error)
        return error

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
        try:
            request = ["call", name, [_to_wire(a) for a in args], [[k, _to_wire(v)] for k, v in kwargs.items()]]
        except Exception as e:  # _NotPlain, or a container whose iteration fails
            raise self.fail(_CallFailed(f"an argument to {name}() is not plain data: {_message(e)}")) from None
        try:
            _write_message(self.requests_fd, request)
        except OSError:
            raise self.fail(_PeerGone("the solution's process ended before answering")) from None
        return self.outcome(name, self.receive())

    def outcome(self, name, reply):
        """The call's value, or the exception it raised (builtin types as themselves)."""
        kind = reply[0] if type(reply) is list and reply else None
        if kind == "ok" and len(reply) == 2:
            try:
                return _decode(reply[1])
            except _BadWire as e:
                raise self.fail(_CallFailed(f"the solution's process broke the protocol: {e}")) from None
        if kind == "raise" and len(reply) == 4 and all(type(x) is str for x in reply[1:3]):
            raise _exception(name, *reply[1:])
        reason = reply[1] if kind == "bad" and len(reply) == 2 and type(reply[1]) is str else "malformed reply"
        raise self.fail(_CallFailed(reason[:2000]))


def _exception(name, type_name, message, is_exception):
    """What the tests see when the solution raised: the builtin exception of that name, a stand-in for
    the solution's own exception classes; SystemExit & co. are failures (a _CallFailed)."""
    kind = getattr(builtins, type_name, None) if type_name.isidentifier() else None
    if isinstance(kind, type) and issubclass(kind, Exception):
        try:
            return kind(message)
        except Exception:  # a constructor with other arguments (UnicodeDecodeError): skip its __init__
            return kind.__new__(kind, message)
    if is_exception is True:
        return _CandidateError(f"{type_name}: {message}")
    return _CallFailed(f"{name}() raised {type_name}: {message}")


def _stub(channel, name):
    """A local function that forwards calls to the solution's `name`."""

    def call(*args, **kwargs):
        return channel.call(name, args, kwargs)

    call.__name__ = call.__qualname__ = name
    return call


def _bindings(exports, channel, builtin_names):
    """The tests' view of the solution's names: stubs for its callables, this interpreter's own copy
    of the standard-library modules it imported under their own names. Builtin names are skipped, as
    are dunders and anything malformed."""
    bound = {}
    for item in exports:
        if type(item) is not list or len(item) != 2 or type(item[0]) is not str:
            continue
        name, kind = item
        if not name.isidentifier() or name.startswith("__") or name in builtin_names:
            continue
        if kind == "call":
            bound[name] = _stub(channel, name)
        elif kind == "module" and name in sys.stdlib_module_names and name not in ("antigravity", "this"):
            try:
                bound[name] = __import__(name)
            except Exception:
                pass
    return bound


def _run_tests(tests, entry_point, replies_fd, requests_fd, marker_fd, nonce):
    """The tests' process: bind the solution's names, run the tests and `check(entry_point)`, and write
    the nonce only if all of it returned normally and no call to the solution failed."""
    sys.path[:] = [p for p in sys.path if p not in ("", ".")]  # never import from the working directory
    builtin_names = frozenset(dir(builtins))
    channel = _Channel(replies_fd, requests_fd)
    scope = {"__name__": "__main__", "__builtins__": builtins}
    try:
        scope.update(_bindings(channel.exports(), channel, builtin_names))
        exec(compile(tests, "<tests>", "exec"), scope)
        if entry_point:
            exec(compile(f"check({entry_point})", "<check>", "exec"), scope)
    except BaseException:
        gone = [f for f in channel.failures if isinstance(f, _PeerGone)]
        if gone:  # whatever the tests made of it, the cause is the solution's process ending
            raise gone[0] from None
        raise
    if channel.failures:
        raise channel.failures[0]
    sys.stdout.flush()
    os.write(marker_fd, nonce)


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
        _run_tests(job["tests"], job["entry_point"], replies_fd, requests_fd, marker_fd, job.pop("nonce"))
    except _CallFailed as e:
        sys.stdout.flush()
        os.write(2, f"sandbox_call_failed: {e}\n".encode("utf-8", "replace"))
        os._exit(PEER_GONE if isinstance(e, _PeerGone) else 1)


if __name__ == "__main__":
    main()
