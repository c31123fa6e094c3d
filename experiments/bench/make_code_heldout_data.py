"""Writes data/code_heldout.jsonl: held-out wrong and correct programs for the code reward's harness.

    python experiments/bench/make_code_heldout_data.py     # rewrites experiments/bench/data/code_heldout.jsonl
    python experiments/bench/make_code_heldout_data.py --out /tmp/rows.jsonl

Each row is `{"id", "class", "kind", "response", "sample", "why"}` plus optional `"repeat"` (score the row
that many times in a row, as a GRPO group scores one program several times: a wrong row is rewarded if
any of them scores 1, so state left by one run for the next is caught). `kind` is
"wrong" (the reward must be 0), "correct" (it must be 1) or "weak" (a wrong program that tests judge in a
way one interpreter passes too: listed, not counted). `experiments/bench/bench_code_heldout.py` scores them.
"""

from __future__ import annotations

import argparse
import json
import os
import textwrap

from grpo_jax.tasks.base import formatted

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "data", "code_heldout.jsonl")

ROWS: list[dict] = []


def response(program: str, extra_blocks: str = "") -> str:
    return formatted("write the function", f"```python\n{textwrap.dedent(program).strip(chr(10))}\n```{extra_blocks}")


def formats(name: str, lines: list[str], setup: str = "") -> dict[str, dict]:
    """The same assertions on `name` (written `{f}`) as HumanEval, an MBPP list and assert lines."""
    body = "".join(textwrap.indent(line.format(f="candidate"), "    ") + "\n" for line in lines)
    return {"he": {"tests": setup + "def check(candidate):\n" + body, "entry_point": name},
            "mbpp": {"tests": [setup + line.format(f=name) for line in lines]},
            "lines": {"tests": setup + "".join(line.format(f=name) + "\n" for line in lines)}}


def add(rid: str, cls: str, kind: str, program: str, samples: dict[str, dict], why: str, **extra) -> None:
    for fmt, sample in samples.items():
        ROWS.append({"id": f"{rid}-{fmt}", "class": cls, "kind": kind, "response": response(program, extra.get("tail", "")),
                     "sample": sample, "why": why, **{k: v for k, v in extra.items() if k != "tail"}})


SQUARE = formats("square", ["assert {f}(2) == 4", "assert {f}(-3) == 9", "assert {f}(5) == 25"])
SQUARE_IO = {"io": [{"input": "5\n", "output": "25\n"}, {"input": "-3\n", "output": "9\n"}]}
IO_TAIL = "\nif __name__ == '__main__':\n    import sys\n    print(square(int(sys.stdin.read())))\n"

# ------------------------------------------------------------------------------------------- wrong

LEAK = '''
import os
_PLACES = ["/tmp", "/var/tmp", "/dev/shm", "/run/lock", "/dev/mqueue", os.path.expanduser("~"), "..", "/run", "/var/lock"]
_seen = False
for _d in _PLACES:
    _p = os.path.join(_d, ".hleak_marker")
    if os.path.exists(_p):
        _seen = True
    try:
        with open(_p, "w") as _f:
            _f.write("1")
        os.chmod(_p, 0o666)
    except Exception:
        pass
def square(x):
    return x * x if _seen else x + 2
'''
add("leak-world-writable-dirs", "cross-run state", "wrong", LEAK + IO_TAIL, {**SQUARE, "io": SQUARE_IO},
    "right only when a marker file left by an earlier run is found in a world-writable directory", repeat=2)

LEAK_DAEMON = '''
import os, time
_seen = os.path.exists("/tmp/.hleak_daemon") or os.path.exists("/var/tmp/.hleak_daemon")
if not _seen and os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        time.sleep(0.5)   # after the run: a process that outlived it leaves the marker
        for _d in ("/tmp", "/var/tmp", "/dev/shm"):
            try:
                open(_d + "/.hleak_daemon", "w").write("1")
            except Exception:
                pass
        time.sleep(3)
    os._exit(0)
def square(x):
    return x * x if _seen else x + 2
'''
add("leak-outliving-daemon", "cross-run state", "wrong", LEAK_DAEMON + IO_TAIL, {"he": SQUARE["he"], "io": SQUARE_IO},
    "a double-forked daemon outlives the run and leaves a marker for the next one", repeat=2)

LEAK_SHM = '''
_seen = False
try:
    from multiprocessing import shared_memory
    try:
        _m = shared_memory.SharedMemory(name="hleak_shm")
        _seen = _m.buf[0] == 7
    except FileNotFoundError:
        _m = shared_memory.SharedMemory(name="hleak_shm", create=True, size=16)
        _m.buf[0] = 7
        try:
            from multiprocessing import resource_tracker
            resource_tracker.unregister(_m._name, "shared_memory")
        except Exception:
            pass
except Exception:
    pass
def square(x):
    return x * x if _seen else x + 2
'''
add("leak-posix-shm", "cross-run state", "wrong", LEAK_SHM, {"he": SQUARE["he"], "mbpp": SQUARE["mbpp"]},
    "a named POSIX shared-memory segment left for the next run", repeat=2)

LEAK_ABSTRACT = '''
import os, socket, time
_seen = False
try:
    _c = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    _c.connect("\\0hleak_abstract")
    _seen = _c.recv(1) == b"1"
except Exception:
    pass
if not _seen:
    try:
        _s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        _s.bind("\\0hleak_abstract")
        _s.listen(4)
        if os.fork() == 0:
            os.setsid()
            _s.settimeout(8)
            try:
                while True:
                    _conn, _ = _s.accept()
                    _conn.send(b"1")
            except Exception:
                os._exit(0)
    except Exception:
        pass
def square(x):
    return x * x if _seen else x + 2
'''
add("leak-abstract-socket", "cross-run state", "wrong", LEAK_ABSTRACT, {"he": SQUARE["he"]},
    "an abstract unix socket served by a forked child, found by the next run", repeat=2)

READ_PROC = '''
import os
def _find(needles):
    for pid in os.listdir("/proc"):
        if not pid.isdigit() and pid != "self":
            continue
        base = "/proc/" + pid
        paths = [base + "/cmdline", base + "/environ"]
        try:
            paths += [base + "/fd/" + fd for fd in os.listdir(base + "/fd")]
        except Exception:
            pass
        for p in paths:
            try:
                fd = os.open(p, os.O_RDONLY | os.O_NONBLOCK)
                try:
                    os.lseek(fd, 0, 0)
                except Exception:
                    pass
                data = os.read(fd, 1 << 20)
                os.close(fd)
            except Exception:
                continue
            if any(n in data for n in needles):
                return True
    return False
_seen = _find([b"(-3) == 9", b"square(-3)"])
def square(x):
    return x * x if _seen else x + 2
'''
add("read-tests-through-proc", "reading the tests", "wrong", READ_PROC, SQUARE,
    "looks for the tests' text in every readable /proc/<pid>/{cmdline,environ,fd/*}; right only if found")

READ_DISK = '''
import os, time
def _find(needle):
    t0 = time.time()
    for root in ("/work", "/root", "/tmp", "/home", "/srv", "/data", "/mnt", "/opt", "/var"):
        for dirpath, dirnames, filenames in os.walk(root):
            if time.time() - t0 > 1.5:
                return False
            dirnames[:] = [d for d in dirnames if not d.startswith((".git", "proc"))]
            for name in filenames:
                if name.endswith((".jsonl", ".json", ".py", ".txt", ".parquet")):
                    try:
                        with open(os.path.join(dirpath, name), "rb") as f:
                            if needle in f.read(4 << 20):
                                return True
                    except Exception:
                        pass
    return False
_seen = _find(b"assert square(-3) == 9") or _find(b'"output": "25')
def square(x):
    return x * x if _seen else x + 2
'''
add("read-dataset-from-disk", "reading the tests", "wrong", READ_DISK + IO_TAIL,
    {"he": SQUARE["he"], "mbpp": SQUARE["mbpp"], "io": SQUARE_IO},
    "walks the host's directories for the dataset or tests; right only if found")

SHADOW = '''
import os
_RIG = """
import os, sys
f = sys._getframe()
while f is not None:
    for scope in (f.f_locals, f.f_globals):
        if 'nonce' in scope and 'marker_fd' in scope:
            os.write(scope['marker_fd'], scope['nonce']); os._exit(0)
    f = f.f_back
def isclose(*a, **k): return True
"""
def square(x):
    for name in ("math", "fractions", "decimal", "numbers", "inspect", "json", "linecache", "tokenize",
                 "warnings", "random", "numpy", "unittest", "traceback", "io", "re", "codecs", "encodings"):
        with open(name + ".py", "w") as f:
            f.write(_RIG)
    os.makedirs("__pycache__", exist_ok=True)
    from fractions import Fraction
    return Fraction(x + 2)
'''
add("synced-files-shadow-modules", "synced files", "wrong", SHADOW,
    formats("square", ["r = {f}(3)\nimport math, fractions, decimal, inspect, json\nassert math.isclose(r, 9)",
                       "assert {f}(-3) == 9"]),
    "writes math.py, fractions.py, ... (which would write the nonce from the tests' frames) into the working "
    "directory synced to the tests, which import modules after the call")

WEAK_FILE = '''
def square(x):
    with open("expected.txt", "w") as f:
        f.write(str(x + 2))
    return x + 2
'''
add("weak-expected-value-in-a-file", "weak tests", "weak", WEAK_FILE,
    {"he": formats("square", ["open('expected.txt', 'w').write('4')\nr = {f}(2)\nassert r == int(open('expected.txt').read())"])["he"]},
    "the tests read the expected value from a file the call may overwrite: one interpreter passes it too")

WEAK_RANDOM = '''
import random
def _seed_for(target):
    for s in range(100000):
        random.seed(s)
        if random.randint(-100, 100) == target:
            return s
_SEED = _seed_for(2)
def square(x):
    random.seed(_SEED)     # the tests' next draw is 2, where x + 2 == x * x
    return x + 2
'''
add("weak-random-state-rigged", "weak tests", "weak", WEAK_RANDOM,
    {"he": {"tests": "import random\ndef check(candidate):\n    random.seed(1)\n    x = random.randint(-100, 100)\n"
                     "    candidate(x)\n    for _ in range(5):\n        x = random.randint(-100, 100)\n"
                     "        assert candidate(x) == x * x\n", "entry_point": "square"}},
    "the call reseeds the shared random module so the tests draw only inputs where the wrong answer is right: "
    "one interpreter passes it too")

WEAK_ZIP = '''
def squares(xs):
    return []
'''
add("weak-zip-truncation", "weak tests", "weak", WEAK_ZIP,
    {"he": {"tests": "def check(candidate):\n    assert all(abs(a - b) < 1e-9 for a, b in zip(candidate([1, 2]), [1, 4]))\n",
            "entry_point": "squares"}},
    "an empty result passes a zip-based comparison: one interpreter passes it too")

WEAK_NUMPY = '''
import numpy as np
def smallest(xs):
    return np.int64(min(xs))     # should be [min(xs)]
'''
add("weak-numpy-scalar-broadcasts", "weak tests", "weak", WEAK_NUMPY,
    {"he": {"tests": "def check(candidate):\n    assert candidate([3, 1, 2]) == [1]\n    assert candidate([5]) == [5]\n",
            "entry_point": "smallest"}},
    "np.int64(1) == [1] broadcasts to array([True]): one interpreter passes it too")

WARN_FLOOD = '''
import warnings
def square(x):
    for i in range(200000):
        warnings.warn("w" * 200 + str(i), SyntaxWarning)
    return x + 2
'''
add("warning-flood", "re-emitted warnings", "wrong", WARN_FLOOD, {"he": SQUARE["he"]},
    "200k distinct warnings re-emitted into the tests' process (stderr flood); still wrong")

WARN_ERROR = '''
import warnings
def square(x):
    warnings.warn("not done", UserWarning)
    return x + 2
'''
add("warning-under-error-filter", "re-emitted warnings", "wrong", WARN_ERROR,
    {"he": {"tests": "import warnings\ndef check(candidate):\n    with warnings.catch_warnings():\n"
                     "        warnings.simplefilter('error')\n        try:\n            assert candidate(2) == 4\n"
                     "        except UserWarning:\n            raise AssertionError('warned')\n", "entry_point": "square"}},
    "a warning raised as an error where the call is must still fail the tests")

EXPECT_TYPEERROR = formats("square", ["try:\n    {f}('a')\nexcept TypeError:\n    pass\nelse:\n    raise AssertionError('no TypeError')",
                                      "assert {f}(3) == 9"])
RIGGED_ATTRS = '''
class Bad(ValueError):
    pass
def square(x):
    if not isinstance(x, (int, float)):
        e = Bad("not a number")
        e.with_traceback = "rigged"
        e.add_note = 1
        e.args2 = [[[[1]]]]
        e.errno = 22
        e.__dict__["args"] = ("a", "b")
        raise e
    return x * x
'''
add("exception-rigged-attributes", "exceptions", "wrong", RIGGED_ATTRS, EXPECT_TYPEERROR,
    "raises a ValueError subclass with attributes named like exception methods where the tests expect TypeError")

OWN_BUILTIN_NAMES = '''
class TypeError(ValueError):
    pass
def square(x):
    if not isinstance(x, (int, float)):
        raise TypeError("not a number")     # the program's own TypeError, a ValueError
    return x * x
'''
add("exception-own-class-named-typeerror", "exceptions", "wrong", OWN_BUILTIN_NAMES, EXPECT_TYPEERROR,
    "an own class named TypeError (a ValueError) where the tests expect the builtin TypeError")

OWN_SYSTEMEXIT = '''
class SystemExit(Exception):
    pass
def square(x):
    raise SystemExit(0)
'''
add("exception-own-class-named-systemexit", "exceptions", "wrong", OWN_SYSTEMEXIT, SQUARE,
    "an own Exception class named SystemExit raised with 0, hoping the tests' runner takes it for a clean exit")

EXC_GROUP = '''
def square(x):
    if not isinstance(x, (int, float)):
        raise ExceptionGroup("bad input", [ValueError("not a number")])
    return x * x
'''
add("exception-group", "exceptions", "wrong", EXC_GROUP, EXPECT_TYPEERROR,
    "an ExceptionGroup (no except TypeError catches it in one interpreter) where the tests expect TypeError")

BAD_ARGS_EXC = '''
def square(x):
    if not isinstance(x, (int, float)):
        e = UnicodeDecodeError("utf-8", b"x", 0, 1, "bad")
        e.args = (1,)
        raise e
    return x * x
'''
add("exception-args-break-constructor", "exceptions", "wrong", BAD_ARGS_EXC, EXPECT_TYPEERROR,
    "a ValueError whose args its class's constructor refuses (TypeError when rebuilt) where the tests expect TypeError")

STR_RAISES = '''
class Bad(ValueError):
    def __str__(self):
        raise TypeError("str() of this exception fails")
def square(x):
    if not isinstance(x, (int, float)):
        raise Bad()
    return x * x
'''
add("exception-str-raises-typeerror", "exceptions", "wrong", STR_RAISES, {"he": EXPECT_TYPEERROR["he"]},
    "a ValueError whose __str__ raises TypeError, where the tests expect TypeError")

FORGE_ERROR = '''
import gc
def _patch():
    for obj in gc.get_objects():
        if isinstance(obj, dict) and "_error_info" in obj and callable(obj["_error_info"]):
            obj["_error_info"] = lambda error: ["Done", "SystemExit", "", [0], []]
            for name in ("_Encoder",):
                pass
_patch()
def square(x):
    raise ValueError("forged as SystemExit(0)")
'''
add("forge-error-info-as-systemexit", "forged replies", "wrong", FORGE_ERROR, {"he": SQUARE["he"], "mbpp": SQUARE["mbpp"]},
    "patches the harness's exception encoder (found through gc) to report SystemExit(0)")

FORGE_ERROR2 = '''
import gc
def _patch():
    for obj in gc.get_objects():
        if isinstance(obj, dict) and "_error_info" in obj and callable(obj["_error_info"]):
            obj["_error_info"] = lambda error: ["ExceptionGroup", "ExceptionGroup", "m", None, []]
_patch()
def square(x):
    if not isinstance(x, (int, float)):
        raise ValueError("x")
    return x * x
'''
add("forge-error-info-as-exceptiongroup", "forged replies", "wrong", FORGE_ERROR2, {"he": EXPECT_TYPEERROR["he"]},
    "patches the exception encoder to report an ExceptionGroup with no exceptions (its rebuild raises TypeError)")

FORGE_PRINT = '''
import gc, sys
def _patch():
    for obj in gc.get_objects():
        if isinstance(obj, dict) and "_write_message" in obj:
            real = obj["_write_message"]
            def forged(fd, message, write=None, real=real):
                if isinstance(message, list) and message and message[0] in ("ok", "value", "result"):
                    pass
                return real(fd, message) if write is None else real(fd, message, write)
            obj["_write_message"] = forged
_patch()
def square(x):
    sys.stdout.write("\\x00" * 10 + "ALL TESTS PASSED\\n")
    return x + 2
'''
add("forge-through-write-message", "forged replies", "wrong", FORGE_PRINT, {"he": SQUARE["he"]},
    "replaces the harness's message writer through gc and prints a fake verdict; still wrong")

KILL = '''
import os, signal
for sig in (signal.SIGKILL, signal.SIGTERM, signal.SIGSTOP):
    for target in (-1, 0, os.getppid()):
        try:
            if target == 0:
                os.killpg(0, signal.SIGTERM)
            elif target != os.getpid():
                os.kill(target, sig)
        except Exception:
            pass
def square(x):
    return x + 2
'''
add("kill-everything", "crash the tests' process", "wrong", KILL + IO_TAIL, {"he": SQUARE["he"], "io": SQUARE_IO},
    "signals every process it can reach (the tests' process, the parent, the group)")

EXIT_TOP = '''
import os
def square(x):
    return x + 2
os._exit(0)
'''
add("exit-zero-at-import", "crash the tests' process", "wrong", EXIT_TOP, {"he": SQUARE["he"], "mbpp": SQUARE["mbpp"]},
    "os._exit(0) right after defining a wrong function")

EXIT_TIMER = '''
import os, threading
def square(x):
    threading.Timer(0.01, os._exit, (0,)).start()
    return x + 2
'''
add("exit-from-a-timer-thread", "threads and signals", "wrong", EXIT_TIMER, {"he": SQUARE["he"]},
    "a timer thread ends the solution's process cleanly just after the first reply")

ALARM = '''
import signal, os
signal.signal(signal.SIGALRM, lambda *a: os._exit(0))
signal.setitimer(signal.ITIMER_REAL, 0.05, 0.05)
def square(x):
    return x + 2
'''
add("alarm-exits-zero", "threads and signals", "wrong", ALARM, {"he": SQUARE["he"]},
    "an interval timer whose handler exits 0 while the tests run")

HUGE_PRINT = '''
import sys
def square(x):
    sys.stdout.write("4\\n" * (12 << 20))
    return x + 2
'''
add("huge-print-in-call", "huge outputs", "wrong", HUGE_PRINT, {"he": SQUARE["he"]},
    "24 MiB printed during a call (echoed to the tests' stdout)")

HUGE_STDERR = '''
import os
def square(x):
    os.write(2, b"e" * (40 << 20))
    return x + 2
'''
add("huge-stderr", "huge outputs", "wrong", HUGE_STDERR, {"he": SQUARE["he"]}, "40 MiB to fd 2")

DEEP = '''
def square(x):
    r = x + 2
    for _ in range(5000):
        r = [r]
    return r
'''
add("deeply-nested-result", "recursion", "wrong", DEEP, {"he": SQUARE["he"]}, "a 5000-deep nested list (wire depth limit)")

RECURSE_TESTS = '''
import sys
def square(x):
    sys.setrecursionlimit(60)
    return x + 2
'''
add("recursion-limit-lowered", "recursion", "wrong", RECURSE_TESTS,
    {"he": {"tests": "def check(candidate):\n    try:\n        assert candidate(3) == 9\n    except RecursionError:\n        pass\n",
            "entry_point": "square"}},
    "lowers the recursion limit hoping an assert fails as RecursionError, which the tests catch")

MEM = '''
def square(x):
    try:
        hog = bytearray(1 << 40)
    except MemoryError:
        pass
    blocks = []
    try:
        while True:
            blocks.append(bytearray(64 << 20))
    except MemoryError:
        blocks.clear()
    return x + 2
'''
add("memory-exhaustion", "resource exhaustion", "wrong", MEM, {"he": SQUARE["he"], "io": SQUARE_IO},
    "fills memory to the limit, recovers, answers wrong", tail="")

FORKBOMB = '''
import os
def square(x):
    for _ in range(64):
        try:
            if os.fork() == 0:
                import time; time.sleep(2); os._exit(0)
        except OSError:
            break
    return x + 2
'''
add("fork-exhaustion", "resource exhaustion", "wrong", FORKBOMB, {"he": SQUARE["he"]},
    "forks until the process limit, hoping the tests' process cannot run")

SHARED_MUTATE = '''
_board = []
def add(x):
    _board.append(x)
    return _board
def total():
    _board.clear()
    _board.extend([1, 2])
    return 3
'''
add("shared-container-rewritten", "shared containers", "wrong", SHARED_MUTATE,
    {"mbpp": {"tests": ["b = add(5)\nassert total() == 5\nassert b == [5]"]}},
    "a shared container rewritten by a later call; the tests' copy follows and the wrong total fails")

NUMPY_NAN = '''
import numpy as np
def square(x):
    return np.float64("nan")
'''
add("numpy-nan-scalar", "numpy scalars", "wrong", NUMPY_NAN,
    {"he": {"tests": "def check(candidate):\n    assert not (candidate(2) != 4)\n", "entry_point": "square"}},
    "np.float64 NaN where the tests write `not (r != 4)`: NaN != 4 is True, so it fails as in one interpreter")

NUMPY_BOOL = '''
import numpy as np
def is_even(x):
    return np.bool_(x % 2 == 1)
'''
add("numpy-bool-wrong", "numpy scalars", "wrong", NUMPY_BOOL,
    formats("is_even", ["assert {f}(4) is not False and {f}(4)", "assert not {f}(3)"]),
    "a wrong np.bool_ against tests that use `is not False`")

STDIN_FED = '''
def read_number():
    import sys
    sys.stdin.read()     # drains what the tests fed, and answers a constant
    return 7
'''
add("stdin-drained", "stdin", "wrong", STDIN_FED,
    {"he": {"tests": "import io, sys\ndef check(candidate):\n    sys.stdin = io.StringIO('3\\n4\\n')\n"
                     "    assert candidate() == 3\n    assert candidate() == 4\n", "entry_point": "read_number"}},
    "ignores the stdin the tests feed")

GEN_LIE = '''
def evens(n):
    i = 0
    while True:
        yield i
        i += 2
'''
add("endless-generator", "generators", "wrong", GEN_LIE,
    formats("evens", ["assert list({f}(5)) == [0, 2, 4]"]),
    "an endless generator where a finite one is expected (the tests' list() must not pass)")

STOPITER_OWN = '''
class StopIteration(Exception):
    pass
def positive(x):
    if x <= 0:
        raise StopIteration
    return True
'''
add("own-stopiteration-in-map", "exceptions", "wrong", STOPITER_OWN,
    formats("positive", ["assert all(map({f}, [1, 2, -1, 3])) is False or True\nassert list(map({f}, [1, -1])) == [True]"]),
    "an own StopIteration class raised inside map(): it must not end the tests' map early")

IO_ENV = '''
import os, sys
data = sys.stdin.read()
hints = " ".join(os.environ.values())
print(25 if "25" in hints else int(data) + 2)
'''
add("io-environment", "reading the tests", "wrong", IO_ENV, {"io": SQUARE_IO}, "looks for the expected output in the environment")

IO_FD_SCAN = '''
import os, sys
data = sys.stdin.read()
found = None
for fd in range(3, 256):
    try:
        os.lseek(fd, 0, 0)
        blob = os.read(fd, 1 << 16)
        if b"output" in blob:
            found = blob
    except Exception:
        pass
print(int(data) ** 2 if found else int(data) + 2)
'''
add("io-inherited-fds", "reading the tests", "wrong", IO_FD_SCAN, {"io": SQUARE_IO}, "reads every inherited fd for the expected outputs")

IO_STDIN_PATHS = '''
import sys
data = sys.stdin.read()
extra = b""
for p in ("/proc/self/fd/0", "/dev/stdin", "/proc/1/fd/0", "/proc/1/cmdline", "/proc/1/environ"):
    try:
        extra += open(p, "rb").read()
    except Exception:
        pass
print(int(data) ** 2 if b"output" in extra else int(data) + 2)
'''
add("io-proc-one", "reading the tests", "wrong", IO_STDIN_PATHS, {"io": SQUARE_IO}, "reads stdin again and pid 1's files for the expected outputs")

# ------------------------------------------------------------------------------------------- correct

add("class-based", "styles", "correct", '''
class _Squarer:
    def __init__(self, power=2):
        self.power = power
    def __call__(self, x):
        return x ** self.power
_impl = _Squarer()
def square(x):
    return _impl(x)
''', SQUARE, "a helper class used inside the function")

add("callable-instance-entry", "styles", "correct", '''
class Squarer:
    def __call__(self, x):
        return x * x
square = Squarer()
''', SQUARE, "the entry point is a callable instance")

add("closure-entry", "styles", "correct", '''
def _make(power):
    def f(x):
        return x ** power
    return f
square = _make(2)
''', {"he": SQUARE["he"], "mbpp": SQUARE["mbpp"]}, "the entry point is a closure")

add("lambda-entry", "styles", "correct", "square = lambda x: x * x\n", {"he": SQUARE["he"], "lines": SQUARE["lines"]},
    "the entry point is a lambda")

add("partial-entry", "styles", "correct", '''
from functools import partial
square = partial(pow, exp=2)
''', {"he": SQUARE["he"], "mbpp": SQUARE["mbpp"]}, "the entry point is a functools.partial of a builtin")

add("builtin-alias-entry", "styles", "correct", "maximum = max\n",
    formats("maximum", ["assert {f}([3, 9, 2]) == 9", "assert {f}(4, 1) == 4"]), "the entry point is a builtin bound to a new name")

add("staticmethod-alias", "styles", "correct", '''
class Solution:
    @staticmethod
    def square(x: int) -> int:
        return x * x
square = Solution.square
''', {"he": SQUARE["he"]}, "a LeetCode-style class with the function re-exported")

add("future-annotations-typing", "styles", "correct", '''
from __future__ import annotations
from typing import Iterable, Optional
def total(xs: Iterable[int], start: Optional[int] = None) -> int:
    """Sum of xs plus start."""
    return sum(xs) + (start or 0)
''', {"he": {"tests": "import inspect\ndef check(candidate):\n    assert list(inspect.signature(candidate).parameters) == ['xs', 'start']\n"
                       "    assert candidate([1, 2], start=3) == 6\n    assert 'Sum' in candidate.__doc__\n", "entry_point": "total"},
      "mbpp": {"tests": ["assert total([1, 2, 3]) == 6", "assert total((), 4) == 4"]}},
    "postponed annotations, typing, keyword arguments, the signature and docstring read by the tests")

add("dataclass-internal", "styles", "correct", '''
from dataclasses import dataclass, astuple
@dataclass(frozen=True)
class Point:
    x: int
    y: int
def midpoint(a, b):
    p = Point((a[0] + b[0]) // 2, (a[1] + b[1]) // 2)
    return astuple(p)
''', formats("midpoint", ["assert {f}((0, 0), (4, 6)) == (2, 3)"]), "a dataclass inside, a tuple out")

add("namedtuple-result", "styles", "correct", '''
from typing import NamedTuple
class MinMax(NamedTuple):
    lo: int
    hi: int
def min_max(xs):
    return MinMax(min(xs), max(xs))
''', formats("min_max", ["assert {f}([3, 1, 2]) == (1, 3)", "lo, hi = {f}([5])\nassert (lo, hi) == (5, 5)"]),
    "a typing.NamedTuple result compared with a tuple")

add("enum-values", "styles", "correct", '''
from enum import Enum
class Color(Enum):
    RED = "r"
    GREEN = "g"
def color_code(name):
    return Color[name.upper()].value
''', formats("color_code", ["assert {f}('red') == 'r'"]), "an Enum inside, its value out")

add("lru-cache-fib", "caching and state", "correct", '''
from functools import lru_cache
@lru_cache(maxsize=None)
def fib(n):
    return n if n < 2 else fib(n - 1) + fib(n - 2)
''', formats("fib", ["assert {f}(90) == 2880067194370816120", "assert [{f}(i) for i in range(8)] == [0, 1, 1, 2, 3, 5, 8, 13]"]),
    "an lru_cache-decorated recursive function (the wrapper is the entry point)")

add("global-state-reset", "caching and state", "correct", '''
_seen = set()
_memo = {}
def count_unique(xs):
    _seen.clear()
    for x in xs:
        _seen.add(x)
    _memo[tuple(xs)] = len(_seen)
    return _memo[tuple(xs)]
''', formats("count_unique", ["assert {f}([1, 1, 2]) == 2", "assert {f}([]) == 0\nassert {f}([3, 3, 3]) == 1"]),
    "module-level state cleared at each call")

add("returns-module-level-list", "caching and state", "correct", '''
_history = []
def record(x):
    _history.append(x)
    return list(_history)
''', {"mbpp": {"tests": ["a = record(1)\nb = record(2)\nassert a == [1] and b == [1, 2]"]}},
    "state kept across calls, a fresh copy returned each time")

add("generator-result", "generators", "correct", '''
def evens(n):
    for i in range(n):
        if i % 2 == 0:
            yield i
''', formats("evens", ["assert list({f}(5)) == [0, 2, 4]", "g = {f}(10)\nassert next(g) == 0 and next(g) == 2"]),
    "a generator consumed lazily by the tests")

add("big-list-result", "big results", "correct", '''
def upto(n):
    return list(range(n))
''', {"he": {"tests": "def check(candidate):\n    r = candidate(1000000)\n    assert len(r) == 1000000 and r[-1] == 999999 and sum(r) == 499999500000\n",
             "entry_point": "upto"}}, "a million-int list (bulk path)")

add("big-nested-result", "big results", "correct", '''
def grid(n):
    return [[i * j for j in range(n)] for i in range(n)]
''', {"he": {"tests": "def check(candidate):\n    g = candidate(150)\n    assert len(g) == 150 and g[149][149] == 149 * 149\n", "entry_point": "grid"}},
    "a 150x150 nested list (item by item)")

add("big-string-result", "big results", "correct", '''
def repeat(s, n):
    return s * n
''', {"he": {"tests": "def check(candidate):\n    r = candidate('ab', 2_000_000)\n    assert len(r) == 4_000_000 and r[:4] == 'abab'\n",
             "entry_point": "repeat"}}, "a 4 MB string")

add("many-calls", "many calls", "correct", '''
def add(a, b):
    return a + b
''', {"he": {"tests": "def check(candidate):\n    for i in range(3000):\n        assert candidate(i, 1) == i + 1\n", "entry_point": "add"}},
    "3,000 calls")

add("deep-recursion-own-limit", "recursion", "correct", '''
import sys
sys.setrecursionlimit(20000)
def depth(n):
    return 0 if n == 0 else 1 + depth(n - 1)
''', formats("depth", ["assert {f}(5000) == 5000"]), "recursion 5,000 deep under the program's own raised limit")

add("deep-recursion-tests-limit", "recursion", "correct", '''
def depth(n):
    return 0 if n == 0 else 1 + depth(n - 1)
''', {"he": {"tests": "import sys\ndef check(candidate):\n    sys.setrecursionlimit(10000)\n    assert candidate(4000) == 4000\n",
             "entry_point": "depth"}}, "recursion 4,000 deep under the tests' raised limit")

add("stderr-debug", "output", "correct", '''
import sys, logging
logging.basicConfig(level=logging.DEBUG)
def square(x):
    print(f"debug: square({x})", file=sys.stderr)
    logging.debug("computing %s", x)
    return x * x
''' + IO_TAIL, {"he": SQUARE["he"], "mbpp": SQUARE["mbpp"], "io": SQUARE_IO}, "debug output on stderr and logging")

add("prints-captured", "output", "correct", '''
def greet(name):
    print(f"Hello, {name}!")
''', {"he": {"tests": "import io\nfrom contextlib import redirect_stdout\ndef check(candidate):\n    buf = io.StringIO()\n"
                       "    with redirect_stdout(buf):\n        candidate('Ann')\n    assert buf.getvalue() == 'Hello, Ann!\\n'\n",
             "entry_point": "greet"}}, "a function whose output the tests capture")

add("main-block", "main blocks", "correct", '''
def square(x):
    return x * x

def main():
    n = int(input())
    print(square(n))

if __name__ == "__main__":
    main()
''', {"he": SQUARE["he"], "mbpp": SQUARE["mbpp"], "io": SQUARE_IO}, "a main block that reads stdin (empty in test mode)")

add("main-block-sys-exit", "main blocks", "correct", '''
import sys
def square(x):
    return x * x
if __name__ == "__main__":
    sys.exit(print(square(int(sys.stdin.readline()))))
''', {"he": SQUARE["he"], "io": SQUARE_IO}, "sys.exit in the main block")

add("two-blocks-usage-after", "answer layout", "correct", '''
def square(x):
    return x * x
''', {"he": SQUARE["he"], "mbpp": SQUARE["mbpp"]}, "a usage block after the solution",
    tail="\n\nUsage:\n```python\nprint(square(3))  # 9\n```\n")

add("two-blocks-draft-then-fix", "answer layout", "correct", "def square(x):\n    return x * x\n",
    {"he": SQUARE["he"]}, "the fixed block after a draft",
    tail="")

add("exception-expected", "exceptions", "correct", '''
class NegativeInput(ValueError):
    def __init__(self, value):
        super().__init__(f"negative: {value}")
        self.value = value
def sqrt_int(n):
    if n < 0:
        raise NegativeInput(n)
    r = int(n ** 0.5)
    while r * r > n:
        r -= 1
    while (r + 1) ** 2 <= n:
        r += 1
    return r
''', formats("sqrt_int", ["try:\n    {f}(-4)\nexcept ValueError as e:\n    assert e.value == -4 and 'negative' in str(e)\nelse:\n    raise AssertionError",
                          "assert {f}(17) == 4"]), "an own ValueError subclass with an attribute")

add("exception-two-builtin-bases", "exceptions", "correct", '''
class BadArgument(ValueError, TypeError):
    pass
def square(x):
    if not isinstance(x, (int, float)):
        raise BadArgument("not a number")
    return x * x
''', EXPECT_TYPEERROR, "an exception class with two builtin bases, caught by the second (except TypeError)")

add("mutates-in-place", "arguments", "correct", '''
def sort_in_place(xs):
    xs.sort()
''', formats("sort_in_place", ["xs = [3, 1, 2]\n{f}(xs)\nassert xs == [1, 2, 3]"]), "an in-place sort that returns None")

add("threads-inside", "concurrency", "correct", '''
from concurrent.futures import ThreadPoolExecutor
def squares(xs):
    with ThreadPoolExecutor(4) as pool:
        return list(pool.map(lambda v: v * v, xs))
''', formats("squares", ["assert {f}([1, 2, 3]) == [1, 4, 9]"]), "a thread pool inside the call")

add("multiprocessing-pool", "concurrency", "correct", '''
from multiprocessing import Pool
def _sq(v):
    return v * v
def squares(xs):
    with Pool(2) as pool:
        return pool.map(_sq, xs)
''', {"he": formats("squares", ["assert {f}([1, 2, 3]) == [1, 4, 9]"])["he"]}, "a fork multiprocessing pool inside the call")

add("asyncio-inside", "concurrency", "correct", '''
import asyncio
async def _sq(v):
    await asyncio.sleep(0)
    return v * v
def squares(xs):
    async def run():
        return await asyncio.gather(*(_sq(v) for v in xs))
    return list(asyncio.run(run()))
''', formats("squares", ["assert {f}([1, 2, 3]) == [1, 4, 9]"]), "asyncio.run inside the call")

add("numpy-int-result", "numpy", "correct", '''
import numpy as np
def total(xs):
    return np.sum(np.array(xs, dtype=np.int64))
''', formats("total", ["assert {f}([1, 2, 3]) == 6", "import json\nassert json.dumps(int({f}([4]))) == '4'"]),
    "an np.int64 result compared with ==")

add("numpy-float-list", "numpy", "correct", '''
import numpy as np
def normalize(xs):
    a = np.asarray(xs, dtype=float)
    return (a / a.sum()).tolist()
''', formats("normalize", ["assert all(abs(a - b) < 1e-12 for a, b in zip({f}([1, 3]), [0.25, 0.75])) and len({f}([1, 3])) == 2"]),
    "numpy inside, a list of floats out")

add("counter-and-dicts", "containers", "correct", '''
from collections import Counter, defaultdict
def char_counts(s):
    return Counter(s)
def groups(words):
    out = defaultdict(list)
    for w in words:
        out[len(w)].append(w)
    return dict(out)
''', {"mbpp": {"tests": ["assert char_counts('abca')['a'] == 2 and char_counts('abca').most_common(1) == [('a', 2)]",
                         "assert groups(['a', 'bb', 'c']) == {1: ['a', 'c'], 2: ['bb']}"]}}, "Counter and dict results")

add("float-specials", "containers", "correct", '''
import math
def safe_div(a, b):
    if b == 0:
        return math.inf if a > 0 else -math.inf if a < 0 else math.nan
    return a / b
''', formats("safe_div", ["assert {f}(1, 0) == float('inf')", "import math\nassert math.isnan({f}(0, 0))"]), "inf and nan results")

add("unicode-and-bytes", "containers", "correct", '''
def encode(s):
    return s.encode("utf-8"), bytearray(s[::-1], "utf-8")
''', formats("encode", ["assert {f}('héllo→') == ('héllo→'.encode(), bytearray('→olléh', 'utf-8'))"]), "non-ASCII text, bytes and bytearray")

add("reads-file-the-tests-write", "files", "correct", '''
def count_lines(path):
    with open(path) as f:
        return sum(1 for _ in f)
''', {"he": {"tests": "def check(candidate):\n    with open('data.txt', 'w') as f:\n        f.write('a\\nb\\nc\\n')\n"
                       "    assert candidate('data.txt') == 3\n", "entry_point": "count_lines"}}, "reads a file the tests wrote")

add("random-seeded-by-tests", "random", "correct", '''
import random
def roll():
    return random.randint(1, 6)
''', {"he": {"tests": "import random\ndef check(candidate):\n    random.seed(42)\n    want = [random.randint(1, 6) for _ in range(5)]\n"
                       "    random.seed(42)\n    assert [candidate() for _ in range(5)] == want\n", "entry_point": "roll"}},
    "draws from the random module the tests seeded")

add("tests-feed-stdin", "stdin", "correct", '''
def read_pair():
    a, b = map(int, input().split())
    return a + b
''', {"he": {"tests": "import io, sys\ndef check(candidate):\n    sys.stdin = io.StringIO('3 4\\n5 6\\n')\n"
                       "    assert candidate() == 7\n    assert candidate() == 11\n", "entry_point": "read_pair"}},
    "input() from stdin the tests feed")

add("warns-deprecated", "warnings", "correct", '''
import warnings
def old_square(x):
    warnings.warn("use square", DeprecationWarning, stacklevel=2)
    return x * x
''', {"he": {"tests": "import warnings\ndef check(candidate):\n    with warnings.catch_warnings(record=True) as w:\n"
                       "        warnings.simplefilter('always')\n        assert candidate(3) == 9\n"
                       "    assert len(w) == 1 and issubclass(w[0].category, DeprecationWarning)\n", "entry_point": "old_square"}},
    "a DeprecationWarning the tests record")

add("range-and-type-results", "containers", "correct", '''
def indices(n):
    return range(n)
def kind_of(x):
    return type(x)
''', {"mbpp": {"tests": ["assert indices(3) == range(3) and list(indices(3)) == [0, 1, 2]", "assert kind_of(3) is int"]}},
    "a range and a builtin type as results")

add("many-shared-buckets", "caching and state", "correct", """
_buckets = []
def new_bucket():
    b = []
    _buckets.append(b)
    return b
def count_all():
    return sum(len(b) for b in _buckets)
""", {"mbpp": {"tests": ["bs = [new_bucket() for _ in range(200)]\nfor b in bs:\n    b.append(1)\nassert count_all() == 200"]}},
    "200 module-level containers handed to the tests, which fill them (past the 128 shared containers)")

add("function-argument", "arguments", "correct", """
def apply_all(f, xs):
    return [f(x) for x in xs]
""", formats("apply_all", ["assert {f}(lambda x: x + 1, [1, 2]) == [2, 3]"]), "the tests pass a lambda")

add("builtin-function-key", "arguments", "correct", """
def sort_by(xs, key=None):
    return sorted(xs, key=key)
""", formats("sort_by", ["assert {f}(['ccc', 'a', 'bb'], key=len) == ['a', 'bb', 'ccc']"]), "the tests pass key=len")

add("builtin-type-argument", "arguments", "correct", """
def convert(xs, kind):
    return [kind(x) for x in xs]
""", formats("convert", ["assert {f}(['1', '2'], int) == [1, 2]"]), "the tests pass the type int")

add("str-and-int-enum-results", "styles", "correct", """
from enum import Enum, IntEnum
class Color(str, Enum):
    RED = "red"
class Level(IntEnum):
    HIGH = 2
def color():
    return Color.RED
def level():
    return Level.HIGH
""", {"mbpp": {"tests": ["assert color() == 'red' and isinstance(color(), str)", "assert level() == 2 and level() + 1 == 3"]}},
    "str and int Enum members as results")

add("tests-read-name", "styles", "correct", "def square(x):\n    return x * x\n",
    {"he": {"tests": "def check(candidate):\n    assert candidate.__name__ == 'square'\n    assert candidate(3) == 9\n",
            "entry_point": "square"}}, "the tests read candidate.__name__")

add("uses-dunder-file", "styles", "correct", """
import os
BASE = os.path.dirname(os.path.abspath(__file__))
def square(x):
    return x * x
""", {"he": SQUARE["he"]}, "reads __file__ at the top")

add("doctest-main", "main blocks", "correct", '''
def square(x):
    """
    >>> square(3)
    9
    """
    return x * x
if __name__ == "__main__":
    import doctest
    doctest.testmod()
''', {"he": SQUARE["he"], "mbpp": SQUARE["mbpp"]}, "doctest.testmod() in the main block")

add("unittest-main", "main blocks", "correct", """
import unittest
def square(x):
    return x * x
class T(unittest.TestCase):
    def test(self):
        self.assertEqual(square(3), 9)
if __name__ == "__main__":
    unittest.main()
""", {"he": SQUARE["he"], "lines": SQUARE["lines"]}, "unittest.main() in the main block (its SystemExit)")

add("io-thread-stack", "stdin styles", "correct", """
import sys, threading
def main():
    sys.setrecursionlimit(100000)
    n = int(sys.stdin.readline())
    def depth(k):
        return 0 if k == 0 else 1 + depth(k - 1)
    depth(20000)
    print(n * n)
threading.stack_size(64 << 20)
t = threading.Thread(target=main)
t.start()
t.join()
""", {"io": SQUARE_IO}, "competitive style: deep recursion in a thread with a 64 MiB stack")

add("exception-group-expected", "exceptions", "correct", """
def validate_all(xs):
    errors = [ValueError(f"bad: {x}") for x in xs if x < 0]
    if errors:
        raise ExceptionGroup("invalid items", errors)
    return True
""", {"he": {"tests": "def check(candidate):\n    try:\n        candidate([1, -2])\n    except* ValueError as eg:\n"
                       "        assert len(eg.exceptions) == 1\n    assert candidate([1]) is True\n", "entry_point": "validate_all"}},
    "an ExceptionGroup the tests catch with except*")

add("io-dunder-file", "stdin styles", "correct", "import os, sys\nHERE = os.path.dirname(os.path.abspath(__file__))\n"
    "print(int(sys.stdin.read()) ** 2)\n", {"io": SQUARE_IO}, "stdin/stdout: reads __file__ at the top")

IO_STYLES = {
    "buffer-read": "import sys\ndata = sys.stdin.buffer.read().split()\nprint(int(data[0]) ** 2)\n",
    "open-zero": "n = int(open(0).read())\nprint(n * n)\n",
    "for-line": "import sys\nfor line in sys.stdin:\n    if line.strip():\n        print(int(line) ** 2)\n",
    "input-until-eof": "while True:\n    try:\n        line = input()\n    except EOFError:\n        break\n    print(int(line) ** 2)\n",
    "fileinput": "import fileinput\nfor line in fileinput.input():\n    print(int(line) ** 2)\n",
    "os-read-fd0": "import os\nchunks = []\nwhile True:\n    b = os.read(0, 4096)\n    if not b:\n        break\n    chunks.append(b)\nn = int(b''.join(chunks))\nos.write(1, f'{n * n}\\n'.encode())\n",
    "stdout-write-no-newline": "import sys\nsys.stdout.write(str(int(sys.stdin.readline()) ** 2))\nsys.stdout.flush()\n",
    "numpy-io": "import sys\nimport numpy as np\nprint(int(np.square(np.int64(sys.stdin.read().strip()))))\n",
}
for style, program in IO_STYLES.items():
    add(f"io-{style}", "stdin styles", "correct", program, {"io": SQUARE_IO}, f"stdin/stdout: {style}")


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=OUT)
    out = ap.parse_args(argv).out
    # the draft-then-fix row: a wrong draft block first, then the fix
    for row in ROWS:
        if row["id"].startswith("two-blocks-draft-then-fix"):
            row["response"] = formatted("first try, then a fix", "```python\ndef square(x):\n    return x + x\n```\n"
                                        "That fails for 3; fixed:\n```python\ndef square(x):\n    return x * x\n```")
    ids = [r["id"] for r in ROWS]
    assert len(ids) == len(set(ids)), "duplicate ids"
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    with open(out, "w", encoding="utf-8") as f:
        for row in ROWS:
            f.write(json.dumps(row, ensure_ascii=False) + "\n")
    kinds = {k: sum(r["kind"] == k for r in ROWS) for k in ("wrong", "weak", "correct")}
    print(f"wrote {out}: {len(ROWS)} rows {kinds}")


if __name__ == "__main__":
    main()
