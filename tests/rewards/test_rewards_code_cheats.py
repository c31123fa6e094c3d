"""Cheats on the code reward's verdict: wrong solutions that try to make the tests pass.

Every cheat is written against a wrong `square` (`return x + 2`) and scored in each function-call
test format: HumanEval (`check(candidate)` + entry point), MBPP (a list of `assert` lines, each its
own case) and `assert` lines in one string. Each one would score 1.0 if the tests ran in the solution's
interpreter; the tests run in a second, clean process that only ever receives plain data from the
solution's, so each must score 0. Honest solutions must still score 1 in every format, including the
stdin/stdout one.
"""

import pytest

from grpo_jax.rewards import code_reward

WRONG = "def square(x):\n    return x + 2\n"
RIGHT = "def square(x):\n    return x * x\n"
HUMANEVAL = {
    "tests": "def check(candidate):\n"
    "    assert abs(candidate(2) - 4) < 1e-9\n"
    "    assert abs(candidate(-3) - 9) < 1e-9\n",
    "entry_point": "square",
}
MBPP = {"tests": ["assert square(2) == 4", "assert abs(square(2) - 4) < 1e-9 and abs(square(-3) - 9) < 1e-9"]}
ASSERT_LINES = {"tests": "assert abs(square(2) - 4) < 1e-9\nassert abs(square(-3) - 9) < 1e-9\n"}
HUMANEVAL_MATH = {
    "tests": "import math\ndef check(candidate):\n    assert math.isclose(candidate(2), 4)\n"
    "    assert math.isclose(candidate(-3), 9)\n",
    "entry_point": "square",
}
MBPP_MATH = {
    "tests": ["import math\nassert math.isclose(square(2), 4)", "import math\nassert math.isclose(square(-3), 9)"]
}
FORMATS = {"humaneval": HUMANEVAL, "mbpp": MBPP, "assert-lines": ASSERT_LINES}
MATH_FORMATS = {"humaneval": HUMANEVAL_MATH, "mbpp": MBPP_MATH}

PATCH_EXEC = "import builtins\nbuiltins.exec = lambda *a, **k: None\n"
PATCH_COMPILE = (
    "import builtins\n_compile = builtins.compile\n"
    "builtins.compile = lambda src, name, mode, *a, **k: _compile('pass', name, mode)\n"
)
PATCH_RUNNER_GLOBALS = (
    "import sys\n_main = sys.modules['__main__']\n_compile = compile\n"
    "_main.exec = lambda *a, **k: None\n"
    "_main.compile = lambda src, name, mode, *a, **k: _compile('pass', name, mode)\n"
)
META_PATH_MATH = """\
import sys, types, importlib.machinery
class _Loader:
    def create_module(self, spec):
        fake = types.ModuleType(spec.name)
        fake.isclose = lambda *a, **k: True
        return fake
    def exec_module(self, module):
        pass
class _Finder:
    def find_spec(self, name, path=None, target=None):
        if name == 'math':
            return importlib.machinery.ModuleSpec(name, _Loader())
        return None
sys.meta_path.insert(0, _Finder())
sys.modules.pop('math', None)
"""
FRAME_WALK_MARKER = """\
import os, sys
_frame = sys._getframe()
while _frame is not None:
    _names = _frame.f_locals
    if 'nonce' in _names and 'marker_fd' in _names:
        os.write(_names['marker_fd'], _names['nonce'])
        os._exit(0)
    _frame = _frame.f_back
"""
FRAME_SCAN_FDS = """\
import os, sys
_frame = sys._getframe()
_secrets = set()
while _frame is not None:
    for _scope in (_frame.f_locals, _frame.f_globals):
        _secrets.update(v for v in _scope.values() if isinstance(v, bytes) and len(v) == 16)
    _frame = _frame.f_back
for _fd in range(3, 32):
    for _secret in _secrets:
        try:
            os.write(_fd, _secret)
        except OSError:
            pass
if _secrets:
    os._exit(0)
"""
GC_RIG_ABS = """\
import gc
def square(x):
    for holder in gc.get_referrers(square):
        if isinstance(holder, dict) and '__builtins__' in holder:
            holder['abs'] = lambda v: 0
    return x + 2
"""
CALLER_GLOBALS_RIG_ABS = """\
import sys
def square(x):
    sys._getframe(1).f_globals['abs'] = lambda v: 0
    return x + 2
"""
RIGGED_OBJECT = """\
class _Always:
    def __eq__(self, other): return True
    def __ne__(self, other): return False
    def __lt__(self, other): return True
    def __le__(self, other): return True
    def __gt__(self, other): return True
    def __ge__(self, other): return True
    def __sub__(self, other): return self
    def __rsub__(self, other): return self
    def __abs__(self): return self
    def __bool__(self): return True
    def __float__(self): return 4.0
    __hash__ = object.__hash__
def square(x):
    return _Always()
"""
RIGGED_INT = """\
class _Int(int):
    def __eq__(self, other): return True
    def __sub__(self, other): return _Int(0)
    def __abs__(self): return _Int(0)
    def __lt__(self, other): return True
    __hash__ = int.__hash__
def square(x):
    return _Int(x + 2)
"""

CHEATS = {
    "builtins.exec": PATCH_EXEC + WRONG,
    "builtins.compile": PATCH_COMPILE + WRONG,
    "runner-globals": PATCH_RUNNER_GLOBALS + WRONG,
    "frame-walk-marker": FRAME_WALK_MARKER + WRONG,
    "frame-scan-fds": FRAME_SCAN_FDS + WRONG,
    "gc-rig-abs": GC_RIG_ABS,
    "caller-globals-rig-abs": CALLER_GLOBALS_RIG_ABS,
    "rigged-object": RIGGED_OBJECT,
    "rigged-int-subclass": RIGGED_INT,
}


def score(body: str, sample: dict, **kwargs) -> tuple[float, dict]:
    result = code_reward("<think>x</think>```python\n" + body + "```", sample, wall_s=3.0, **kwargs)
    return result.score, dict(result.info)


@pytest.mark.parametrize("fmt", sorted(FORMATS))
@pytest.mark.parametrize("cheat", sorted(CHEATS))
def test_cheat_scores_zero(cheat, fmt):
    value, info = score(CHEATS[cheat], FORMATS[fmt])
    assert value == 0.0, info
    assert info["reason"] != "ok"


@pytest.mark.parametrize("fmt", sorted(MATH_FORMATS))
def test_meta_path_finder_cannot_serve_the_tests_a_fake_module(fmt):
    value, info = score(META_PATH_MATH + WRONG, MATH_FORMATS[fmt])
    assert value == 0.0, info
    honest, info = score(META_PATH_MATH + RIGHT, MATH_FORMATS[fmt])
    assert honest == 1.0, info  # the finder is harmless to a right answer: the tests get the real math


@pytest.mark.parametrize("fmt", sorted(FORMATS))
@pytest.mark.parametrize("cheat", [name for name, body in sorted(CHEATS.items()) if body.endswith(WRONG)])
def test_cheats_are_harmless_to_a_right_answer(cheat, fmt):
    """What fails a cheat is its wrong answer, not its cheat code: before a right `square` it scores 1."""
    value, info = score(CHEATS[cheat].replace(WRONG, RIGHT), FORMATS[fmt])
    assert value == 1.0, info


SYSV_COUNTER = """\
import ctypes
_libc = ctypes.CDLL(None, use_errno=True)
_libc.shmat.restype = ctypes.c_void_p
_runs_before = 0
_id = _libc.shmget({key}, 4096, 0o1000 | 0o666)  # IPC_CREAT: the segment an earlier run made, else a new one
if _id >= 0:
    _cell = ctypes.c_int.from_address(_libc.shmat(_id, None, 0))
    _runs_before = _cell.value
    _cell.value += 1
def square(x):
    return x * x if _runs_before else x + 2  # stands for answers learned from the earlier runs' failures
"""


@pytest.mark.parametrize("fmt", sorted(FORMATS))
def test_state_left_by_an_earlier_run_is_gone(fmt):
    """A program that counts its runs in a SysV segment (a fixed key) is right only when it finds an
    earlier run's count: where state survived a run, its second scoring would be 1. Each run has its own
    IPC namespace, and seccomp refuses the SysV calls, so every scoring starts from nothing."""
    import ctypes
    import secrets

    key = 1 + secrets.randbelow(2**30)
    try:
        for _ in range(3):
            value, info = score(SYSV_COUNTER.format(key=key), FORMATS[fmt])
            assert value == 0.0, info
    finally:  # what a run without the layers would have left in the trainer's namespace
        libc = ctypes.CDLL(None, use_errno=True)
        if (ident := libc.shmget(key, 0, 0)) >= 0:
            libc.shmctl(ident, 0, None)  # IPC_RMID


# ----------------------------------------------------------------------------- honest solutions


@pytest.mark.parametrize("fmt", sorted(FORMATS) + sorted(f"{k}-math" for k in MATH_FORMATS))
def test_honest_square_scores_one_in_every_function_format(fmt):
    sample = FORMATS.get(fmt) or MATH_FORMATS[fmt[: -len("-math")]]
    value, info = score(RIGHT, sample)
    assert value == 1.0, info
    wrong, info = score(WRONG, sample)
    assert wrong == 0.0 and info["reason"] == "error", info


def test_honest_stdin_stdout_scores_one_and_cheats_do_not_help():
    sample = {"io": [{"input": "2\n", "output": "4\n"}, {"input": "-3\n", "output": "9\n"}]}
    honest = "print(int(input()) ** 2)\n"
    assert score(honest, sample)[0] == 1.0
    wrong = "print(int(input()) + 2)\n"
    for cheat in ("builtins.exec", "runner-globals", "frame-scan-fds"):
        prefix = CHEATS[cheat].replace(WRONG, "")
        assert score(prefix + wrong, sample)[0] == 0.0, cheat


PLAIN_DATA_TASKS = [
    # (solution, tests, entry point): the return types the wire carries, compared in the tests' process
    ("def f(x):\n    return (x, [x], {x: 'v'}, {x}, frozenset([x]), None, True, b'b', 1.5, 2j)\n",
     "def check(c):\n    assert c(3) == (3, [3], {3: 'v'}, {3}, frozenset([3]), None, True, b'b', 1.5, 2j)\n"
     "    assert c(3)[6] is True and c(3)[5] is None\n", "f"),
    ("def f(n):\n    return 7 ** n\n", "def check(c):\n    assert c(6000) == 7 ** 6000\n", "f"),
    ("def f(x):\n    return float('nan') if x else float('-inf')\n",
     "import math\ndef check(c):\n    assert math.isnan(c(1)) and c(0) == -math.inf\n", "f"),
    ("import collections\ndef f(s):\n    return collections.Counter(s)\n",
     "def check(c):\n    assert c('aab') == {'a': 2, 'b': 1}\n", "f"),
    ("import collections\nP = collections.namedtuple('P', 'x y')\ndef f(a, b=0):\n    return P(a, b)\n",
     "def check(c):\n    assert c(1, b=2) == (1, 2)\n    assert c(a=3) == (3, 0)\n", "f"),
    ("def f(x):\n    if x < 0:\n        raise ValueError('negative')\n    return x\n",
     "def check(c):\n    try:\n        c(-1)\n    except ValueError:\n        pass\n    else:\n        assert False\n"
     "    assert c(2) == 2\n", "f"),
    ("def f(xs):\n    return sorted(xs)\n",
     "import random\ndef check(c):\n    rng = random.Random(0)\n    for _ in range(200):\n"
     "        xs = [rng.randint(-9, 9) for _ in range(rng.randint(0, 8))]\n        assert c(list(xs)) == sorted(xs)\n",
     "f"),
    ("def encode(s):\n    return s[::-1]\ndef decode(s):\n    return s[::-1]\n",
     "def check(c):\n    for s in ('abc', '', 'xyz!'):\n        assert c(encode(s)) == s\n", "decode"),
    ("def f(s):\n    return s.upper() + '\\udc80'\n", "def check(c):\n    assert c('é') == 'É\\udc80'\n", "f"),
]


@pytest.mark.parametrize("solution, tests, entry", PLAIN_DATA_TASKS, ids=lambda x: None)
def test_honest_plain_data_results_score_one(solution, tests, entry):
    value, info = score(solution, {"tests": tests, "entry_point": entry})
    assert value == 1.0, info


def test_mbpp_tests_may_use_a_module_the_solution_imported():
    """MBPP lists sometimes call `math.…` without importing it (the reference solution did): the tests'
    process imports its own copy of a stdlib module the solution imported under its own name."""
    sample = {"tests": ["assert math.isclose(area(1.0), math.pi)", "assert math.isclose(area(2.0), 4 * math.pi)"]}
    assert score("import math\ndef area(r):\n    return math.pi * r * r\n", sample)[0] == 1.0


@pytest.mark.parametrize(
    "solution, reason",
    [
        ("def square(x):\n    return {x * x: 0}.keys()\n", "not plain data"),
        ("def square(x):\n    return object()\n", "not plain data"),
        ("def square(x):\n    xs = []\n    xs.append(xs)\n    return xs\n", "not plain data"),
    ],
    ids=["dict-view", "object", "self-containing-list"],
)
def test_results_that_are_not_plain_data_fail_the_case(solution, reason):
    value, info = score(solution, HUMANEVAL)
    assert value == 0.0 and reason in info["results"][0].get("stderr_tail", ""), info


def test_a_test_that_swallows_the_failure_still_fails():
    """A harness failure (non-plain result, solution gone) fails the case even if the tests catch it."""
    sample = {
        "tests": "def check(c):\n    try:\n        c(1)\n    except BaseException:\n        pass\n",
        "entry_point": "f",
    }
    assert score("def f(x):\n    return object()\n", sample)[0] == 0.0
    assert score("import os\ndef f(x):\n    os._exit(0)\n", sample)[0] == 0.0
    assert score("def f(x):\n    return x\n", sample)[0] == 1.0


RIGGED_INSTANCES = {
    # dunder -> (its rigged definition, an assertion it would pass in one interpreter for a wrong `f`)
    "eq": ("def __eq__(self, other): return True", "assert {f}(2) == 4"),
    "reflected-eq": ("def __eq__(self, other): return True", "assert 4 == {f}(2)"),
    "ne": ("def __ne__(self, other): return False", "assert not ({f}(2) != 4)"),
    "bool": ("def __bool__(self): return True", "assert {f}(3)"),
    "hash": ("def __hash__(self): return 4\n    def __eq__(self, other): return True", "assert {f}(2) in {{4}}"),
    "str": ("def __str__(self): return '4'", "assert str({f}(2)) == '4'"),
    "repr": ("def __repr__(self): return '4'", "assert repr({f}(2)) == '4'"),
    "format": ("def __format__(self, spec): return '4'", "assert f'{{{f}(2)}}' == '4'"),
    "len": ("def __len__(self): return 4", "assert len({f}(2)) == 4"),
    "iter": ("def __iter__(self): return iter([4])", "assert list({f}(2)) == [4]"),
    "index": ("def __index__(self): return 4", "assert [0, 1, 2, 3, 4][{f}(2)] == 4"),
    "float": ("def __float__(self): return 4.0", "assert abs(float({f}(2)) - 4.0) < 1e-9"),
    "sub": ("def __sub__(self, other): return 0", "assert {f}(2) - 4 == 0"),
    "lt": ("def __lt__(self, other): return True", "assert {f}(2) < 5"),
    "class-claim": ("__class__ = property(lambda self: int)", "assert isinstance({f}(2), int)"),
    "contains": ("def __contains__(self, item): return True", "assert 4 in {f}(2)"),
    "getitem": ("def __getitem__(self, i): return 4", "assert {f}(2)[0] == 4"),
}  # fmt: skip
RIGGED_INSTANCE_CASES = [(dunder, fmt) for dunder in sorted(RIGGED_INSTANCES) for fmt in sorted(FORMATS)]


def rigged_instance(dunder: str, fmt: str) -> tuple[str, dict]:
    """(a wrong program returning an instance of its own class with that dunder rigged, the tests of
    that format using it)."""
    method, line = RIGGED_INSTANCES[dunder]
    program = f"class Rigged:\n    {method}\ndef square(x):\n    return Rigged()\n"
    if fmt == "humaneval":
        check = "def check(candidate):\n    " + line.format(f="candidate") + "\n"
        return program, {"tests": check, "entry_point": "square"}
    if fmt == "mbpp":
        return program, {"tests": [line.format(f="square")]}
    return program, {"tests": line.format(f="square") + "\n"}


@pytest.mark.parametrize("dunder, fmt", RIGGED_INSTANCE_CASES, ids=[f"{d}-{f}" for d, f in RIGGED_INSTANCE_CASES])
def test_a_rigged_instance_of_the_programs_class_never_passes(dunder, fmt):
    """An instance of the program's own class stays in its process; the tests hold a proxy that refuses
    every use by which the object could judge itself (comparison, truth, hashing, str/repr/format,
    len, iteration, indexing, conversion, arithmetic, `isinstance` through `__class__`), so a rigged
    one scores 0 where one interpreter would pass it, and says why (an instance that claims to be an
    `int` through `__class__` is refused as a result already: it is not plain data either way)."""
    program, sample = rigged_instance(dunder, fmt)
    value, info = score(program, sample)
    assert value == 0.0, info
    assert "is not plain data" in info["results"][0].get("stderr_tail", ""), info
