"""The two-process test harness of the code reward behaves as one interpreter would, where that matters.

The tests run in their own process against stubs of the program's functions (see docs/sandbox.md).
These tests pin the places where that separation must not show: a function named like a builtin is the
program's own; an exception from the program cannot act as control flow, nor be swallowed, in the
tests' process; arguments changed in place, identity, ordered containers and set order come back as
they are; state the program keeps is shared across calls both ways; NaN identity, numpy scalars and an
exception's attributes survive the trip; calls from several threads are answered in turn; a container
subclass with its own methods fails the call; a main block, stderr, stdin by path, numpy, Fractions and
generators work as in one interpreter; the state the tests' process shares with a call (its prints, the
stdin the tests feed, files in the working directory, `random`, the recursion limit, warnings, `from
solution import`, signatures, builtin types as values) reaches the other side; a builtin the tests build an
expected value with stays theirs; instances of the program's own classes the tests build arguments with go
back as themselves. Each wrong program here must score 0 and each right one 1, in every test
format that applies (HumanEval `check(candidate)`, an MBPP list of asserts, assert lines in one string).
"""

import importlib.util
import textwrap

import pytest

from grpo_jax.rewards import code_reward


def score(body: str, sample: dict) -> tuple[float, dict]:
    result = code_reward("<think>x</think>```python\n" + body + "```", sample, wall_s=4.0)
    return result.score, dict(result.info)


def formats(name: str, lines: list[str], setup: str = "") -> dict[str, dict]:
    """The same assertions on `name` (written as `{f}`) in the three function-call formats."""
    body = "".join(textwrap.indent(line.format(f="candidate"), "    ") + "\n" for line in lines)
    return {
        "humaneval": {"tests": setup + "def check(candidate):\n" + body, "entry_point": name},
        "mbpp": {"tests": [setup + line.format(f=name) for line in lines]},
        "assert-lines": {"tests": setup + "".join(line.format(f=name) + "\n" for line in lines)},
    }


def stderr_of(info: dict) -> str:
    return "".join(r.get("stderr_tail", "") for r in info.get("results", []))


# ------------------------------------------------------------------ a function named like a builtin

SUM = formats("sum", ["assert {f}([1, 2]) == 3", "assert {f}([]) == 0"])
ROUND = formats("round", ["assert {f}(2.5) == 3", "assert {f}(3.5) == 4"])


@pytest.mark.parametrize("fmt", sorted(SUM))
def test_a_wrong_function_named_like_a_builtin_is_called_and_fails(fmt):
    value, info = score("def sum(xs):\n    return 12345\n", SUM[fmt])
    assert value == 0.0, info
    right_sum = "def sum(xs):\n    total = 0\n    for x in xs:\n        total += x\n    return total\n"
    right, info = score(right_sum, SUM[fmt])
    assert right == 1.0, info


@pytest.mark.parametrize("fmt", sorted(ROUND))
def test_a_right_function_named_like_a_builtin_is_the_one_tested(fmt):
    """Half-up rounding where the builtin rounds half to even: only the program's round passes."""
    value, info = score("import math\ndef round(x):\n    return math.floor(x + 0.5)\n", ROUND[fmt])
    assert value == 1.0, info


def test_a_program_that_defines_nothing_does_not_pass_a_builtin_named_task():
    value, info = score("pass\n", SUM["mbpp"])
    assert value == 0.0 and "never called the program" in stderr_of(info), info
    value, info = score("pass\n", SUM["humaneval"])
    assert value == 0.0 and "does not define sum()" in stderr_of(info), info


@pytest.mark.parametrize("fmt", ["mbpp", "assert-lines"])
def test_a_builtin_the_tests_judge_with_stays_the_real_one(fmt):
    """`abs(square(x) - y)`: the tests call `square`, so the program's `abs` does not replace the judge."""
    sample = formats("square", ["assert abs({f}(2) - 4) < 1e-9", "assert abs({f}(-3) - 9) < 1e-9"])[fmt]
    value, info = score("abs = lambda x: 0\ndef square(x):\n    return x + 2\n", sample)
    assert value == 0.0, info
    honest, info = score("def abs(x):\n    return -x if x < 0 else x\ndef square(x):\n    return x * x\n", sample)
    assert honest == 1.0, info


def test_a_builtin_judging_a_builtin_named_function_stays_the_real_one():
    """`abs(sum(xs) - 3)`: `abs` judges the result of the program's `sum`, so redefining it does not help."""
    sample = {"tests": ["assert abs(sum([1, 2]) - 3) < 1e-9", "assert abs(sum([]) - 0) < 1e-9"]}
    value, info = score("abs = lambda x: 0\ndef sum(xs):\n    return 12345\n", sample)
    assert value == 0.0, info
    right = "def abs(x):\n    return -x if x < 0 else x\n"
    right += "def sum(xs):\n    return 0 if not xs else xs[0] + sum(xs[1:])\n"
    honest, info = score(right, sample)
    assert honest == 1.0, info


# ------------------------------------------------------------------ exceptions from the program

STOP_ITERATION_TESTS = {
    "all-map": "assert all(map({f}, [2, 4, 6]))",
    "any-map": "assert not any(map({f}, [2, 4, 6]))",
    "next-default": "assert next(map({f}, [1]), True)",
    "iter-sentinel": "assert list(iter(lambda: {f}(0), 1)) == []",
}


@pytest.mark.parametrize("fmt", sorted(SUM))
@pytest.mark.parametrize("case", sorted(STOP_ITERATION_TESTS))
def test_stop_iteration_from_the_program_is_a_failure_not_the_end_of_a_loop(case, fmt):
    sample = formats("is_even", [STOP_ITERATION_TESTS[case]])[fmt]
    value, info = score("def is_even(n):\n    raise StopIteration\n", sample)
    assert value == 0.0 and "is_even() raised StopIteration" in stderr_of(info), info


BASE_EXCEPTIONS = {
    "SystemExit": "raise SystemExit(0)",
    "KeyboardInterrupt": "raise KeyboardInterrupt",
    "GeneratorExit": "raise GeneratorExit",
    "custom": "raise type('Quiet', (BaseException,), {})()",
}


@pytest.mark.parametrize("fmt", sorted(SUM))
@pytest.mark.parametrize("error", sorted(BASE_EXCEPTIONS))
def test_a_base_exception_from_the_program_is_recorded_even_if_the_tests_swallow_it(error, fmt):
    sample = formats("f", ["try:\n    {f}(1)\nexcept BaseException:\n    pass"])[fmt]
    value, info = score(f"def f(x):\n    {BASE_EXCEPTIONS[error]}\n", sample)
    assert value == 0.0 and "f() raised" in stderr_of(info), info
    honest, info = score("def f(x):\n    return x\n", sample)
    assert honest == 1.0, info


def test_the_programs_exception_classes_are_caught_by_their_builtin_bases():
    """`class BadInput(ValueError)` is caught by `except ValueError`, with its message and name."""
    program = (
        "class BadInput(ValueError):\n    pass\n"
        "def f(x):\n    if x < 0:\n        raise BadInput('negative', x)\n    return x\n"
    )
    tests = (
        "def check(c):\n    try:\n        c(-1)\n    except ValueError as e:\n"
        "        assert type(e).__name__ == 'BadInput' and e.args == ('negative', -1)\n"
        "    else:\n        assert False\n"
    )
    value, info = score(program, {"tests": tests, "entry_point": "f"})
    assert value == 1.0, info


# ------------------------------------------------------------------ mutation, identity, order

SORT_COPY = formats("f", ["a = [3, 1, 2]\nb = {f}(a)\nassert b == [1, 2, 3] and a == [3, 1, 2]"])
NOT_SAME = formats("f", ["a = [3, 1, 2]\nb = {f}(a)\nassert b == a and b is not a"])
SORT_IN_PLACE = formats("f", ["a = [3, 1, 2]\nassert {f}(a) is None and a == [1, 2, 3]"])


@pytest.mark.parametrize("fmt", sorted(SORT_COPY))
def test_a_program_that_mutates_its_argument_is_seen_to(fmt):
    value, info = score("def f(xs):\n    xs.sort()\n    return xs\n", SORT_COPY[fmt])
    assert value == 0.0, info
    honest, info = score("def f(xs):\n    return sorted(xs)\n", SORT_COPY[fmt])
    assert honest == 1.0, info


@pytest.mark.parametrize("fmt", sorted(NOT_SAME))
def test_returning_the_argument_gives_back_the_callers_own_object(fmt):
    value, info = score("def f(xs):\n    return xs\n", NOT_SAME[fmt])
    assert value == 0.0, info
    honest, info = score("def f(xs):\n    return list(xs)\n", NOT_SAME[fmt])
    assert honest == 1.0, info


@pytest.mark.parametrize("fmt", sorted(SORT_IN_PLACE))
def test_an_in_place_function_changes_the_callers_object(fmt):
    value, info = score("def f(xs):\n    xs.sort()\n", SORT_IN_PLACE[fmt])
    assert value == 1.0, info
    wrong, info = score("def f(xs):\n    xs = sorted(xs)\n", SORT_IN_PLACE[fmt])
    assert wrong == 0.0, info


IN_PLACE_TASKS = [
    # (program, tests): changes in place, nested, aliased, before an exception, of every mutable kind
    ("def f(d):\n    d['k'].append(1)\n    d['new'] = d['k']\n",
     "x = {'k': []}\ninner = x['k']\nf(x)\nassert x == {'k': [1], 'new': [1]} and x['new'] is inner is x['k']\n"),
    ("def f(a, b):\n    a.append(1)\n    return len(b)\n",
     "x = [0]\nassert f(x, x) == 2 and x == [0, 1]\n"),
    ("def f(xs):\n    xs.append(1)\n    raise ValueError('late')\n",
     "x = []\ntry:\n    f(x)\nexcept ValueError:\n    pass\nassert x == [1]\n"),
    ("def f(xs):\n    xs.append(xs)\n",
     "x = []\nf(x)\nassert x[0] is x\n"),
    ("def f(s, b, q, od):\n    s.add(3)\n    b.extend(b'z')\n    q.appendleft(0)\n    od.move_to_end('a')\n",
     "import collections\n"
     "s, b, q, od = {1}, bytearray(b'y'), collections.deque([1]), collections.OrderedDict(a=1, b=2)\n"
     "f(s, b, q, od)\nassert s == {1, 3} and b == b'yz' and list(q) == [0, 1] and list(od) == ['b', 'a']\n"),
    ("def f(t):\n    t[0].append(1)\n    return t\n",
     "x = ([],)\nassert f(x) is x and x[0] == [1]\n"),
    ("def f(xs):\n    return [xs[0], xs[0]]\n",
     "x = [[1]]\nr = f(x)\nassert r[0] is x[0] and r[1] is x[0]\n"),
    ("def f(n):\n    row = [0] * n\n    return [row, row]\n",
     "r = f(2)\nr[0][0] = 5\nassert r[1][0] == 5\n"),
]


@pytest.mark.parametrize("program, tests", IN_PLACE_TASKS, ids=range(len(IN_PLACE_TASKS)))
def test_changes_aliases_and_identity_cross_as_in_one_interpreter(program, tests):
    value, info = score(program, {"tests": tests})
    assert value == 1.0, info


def test_an_ordered_dict_keeps_its_order():
    sample = {"tests": "import collections\nassert f() == collections.OrderedDict([(1, 'a'), (2, 'b')])\n"}
    program = "import collections\ndef f():\n    return collections.OrderedDict([{}, {}])\n"
    wrong, info = score(program.format("(2, 'b')", "(1, 'a')"), sample)
    assert wrong == 0.0, info
    right, info = score(program.format("(1, 'a')", "(2, 'b')"), sample)
    assert right == 1.0, info


SET_AFTER_DELETIONS = "s = set(range(32))\nfor i in range(2, 32):\n    s.discard(i)\ns.discard(0)\ns.add(8)\n"


def test_a_set_iterates_in_the_programs_order():
    """A set that grew, then lost elements, iterates in an order a fresh set of its elements does not."""
    program = "def f():\n" + textwrap.indent(SET_AFTER_DELETIONS, "    ") + "    return s\n"
    tests = SET_AFTER_DELETIONS + "assert list(set([1, 8])) != list(s)\nassert list(f()) == list(s) and f() == {1, 8}\n"
    tests += "assert repr(f()) == repr(s) and isinstance(f(), set)\n"
    value, info = score(program, {"tests": tests})
    assert value == 1.0, info


def test_collections_keep_their_type():
    program = (
        "import collections\ndef f():\n"
        "    return collections.Counter(a=1, b=0), collections.defaultdict(list, x=[1]), collections.deque([1], 3)\n"
    )
    tests = (
        "import collections\nc, d, q = f()\nassert c == collections.Counter(a=1) and c.most_common(1) == [('a', 1)]\n"
        "assert d['missing'] == [] and q.maxlen == 3 and isinstance(q, collections.deque)\n"
    )
    value, info = score(program, {"tests": tests})
    assert value == 1.0, info


# ------------------------------------------------------------------ Fractions, generators, ranges

def test_fractions_decimals_and_ranges_round_trip():
    program = (
        "from fractions import Fraction\nfrom decimal import Decimal\n"
        "def f(x):\n    return Fraction(x, 3), Decimal('0.10'), range(2), x\n"
    )
    tests = (
        "from fractions import Fraction\nfrom decimal import Decimal\n"
        "q, d, r, x = f(Fraction(1, 2))\n"
        "assert q == Fraction(1, 6) and isinstance(q, Fraction) and x == Fraction(1, 2)\n"
        "assert str(d) == '0.10' and list(r) == [0, 1] and r == range(2)\n"
    )
    value, info = score(program, {"tests": tests})
    assert value == 1.0, info


GENERATOR_TASKS = [
    ("def f(n):\n    for i in range(n):\n        yield i * i\n",
     "import types\nassert list(f(4)) == [0, 1, 4, 9] and isinstance(f(1), types.GeneratorType)\n"),
    ("import itertools\ndef f():\n    return itertools.count(5)\n",
     "import itertools\nassert list(itertools.islice(f(), 3)) == [5, 6, 7]\n"),
    ("def f(n):\n    yield n\n    raise ValueError('after one')\n",
     "g = f(7)\nassert next(g) == 7\n"
     "try:\n    next(g)\nexcept ValueError as e:\n    assert str(e) == 'after one'\nelse:\n    assert False\n"),
    ("def f(xs):\n    while xs:\n        yield xs.pop()\n",
     "a = [1, 2, 3]\nassert list(f(a)) == [3, 2, 1] and a == []\n"),
    ("def f(n):\n    return map(str, range(n))\n", "assert list(f(3)) == ['0', '1', '2']\n"),
]


@pytest.mark.parametrize("program, tests", GENERATOR_TASKS, ids=["squares", "endless", "raises", "pops", "map"])
def test_generators_and_iterators_are_consumed_lazily_in_the_programs_process(program, tests):
    value, info = score(program, {"tests": tests})
    assert value == 1.0, info


def test_a_wrong_generator_still_fails():
    value, info = score("def f(n):\n    yield from range(n + 1)\n", {"tests": "assert list(f(2)) == [0, 1]\n"})
    assert value == 0.0, info


# ------------------------------------------------------------------ main block, stderr, stdin, numpy

MAIN_BLOCKS = {
    "input": "if __name__ == '__main__':\n    print(square(int(input())))\n",
    "sys.exit-main": "import sys\ndef main():\n    return 0\nif __name__ == '__main__':\n    sys.exit(main())\n",
    "unittest": "import unittest\n"
    "class T(unittest.TestCase):\n    def test(self):\n        self.assertEqual(square(3), 9)\n"
    "if __name__ == '__main__':\n    unittest.main()\n",
    "error": "if '__main__' == __name__:\n    raise RuntimeError('driver')\n",
}
SQUARE = formats("square", ["assert {f}(2) == 4", "assert {f}(-3) == 9"])


@pytest.mark.parametrize("fmt", sorted(SQUARE))
@pytest.mark.parametrize("block", sorted(MAIN_BLOCKS))
def test_a_main_block_does_not_fail_a_right_program(block, fmt):
    right, info = score("def square(x):\n    return x * x\n" + MAIN_BLOCKS[block], SQUARE[fmt])
    assert right == 1.0, info
    wrong, info = score("def square(x):\n    return x + 2\n" + MAIN_BLOCKS[block], SQUARE[fmt])
    assert wrong == 0.0, info


def test_what_follows_a_failing_main_block_still_runs():
    program = "if __name__ == '__main__':\n    input()\ndef square(x):\n    return x * {}\n"
    value, info = score(program.format("x"), SQUARE["humaneval"])
    assert value == 1.0, info
    wrong, info = score(program.format("2"), SQUARE["humaneval"])
    assert wrong == 0.0 and "main block ended with EOFError" in stderr_of(info), info


def test_the_main_block_runs_as_main_with_an_empty_stdin():
    program = (
        "import sys\nseen = []\ndef f():\n    return seen\n"
        "if __name__ == '__main__':\n"
        "    seen.append(sys.modules['__main__'].f is f)\n    seen.append(sys.stdin.read())\n"
    )
    value, info = score(program, {"tests": "assert f() == [True, '']\n"})
    assert value == 1.0, info


def test_lots_of_stderr_is_not_a_failure():
    program = "import sys\nsys.stderr.write('log line\\n' * 20000)\ndef square(x):\n    return x * x\n"
    value, info = score(program, SQUARE["humaneval"])
    assert value == 1.0, info


@pytest.mark.parametrize("path", ["/dev/stdin", "/proc/self/fd/0"])
def test_stdin_can_be_opened_by_path(path):
    program = f"with open({path!r}) as f:\n    DATA = f.read()\ndef square(x):\n    return x * x + len(DATA)\n"
    value, info = score(program, SQUARE["humaneval"])
    assert value == 1.0, info
    io = {"io": [{"input": "3 4\n", "output": "7\n"}]}
    value, info = score(f"a, b = map(int, open({path!r}).read().split())\nprint(a + b)\n", io)
    assert value == 1.0, info


@pytest.mark.skipif(importlib.util.find_spec("numpy") is None, reason="numpy is not installed here")
def test_numpy_is_importable_in_both_processes():
    program = "import numpy as np\ndef f(xs):\n    return np.sum(np.array(xs)), np.float64(0.5)\n"
    tests = "import numpy\ntotal, half = f([1, 2, 3])\nassert total == 6 and half == numpy.float64(0.5)\n"
    value, info = score(program, {"tests": tests})
    assert value == 1.0, info


# ------------------------------------------------------------------ the tests' process state reaches the calls

# Each task: (right program, wrong program, assertion lines on `{f}`). One interpreter shares stdout,
# stdin, the working directory, `random`, the recursion limit, warnings and sys.modules between the
# tests and the program; the right program passes only if the harness carries that state, the wrong
# one (a different output, no seed, ...) must fail.
STATE_TASKS = {
    "stdout-captured": (
        "def f(x):\n    print('value', x)\n    return x\n",
        "def f(x):\n    print('value', x + 1)\n    return x\n",
        ["import io, contextlib\nbuf = io.StringIO()\nwith contextlib.redirect_stdout(buf):\n"
         "    assert {f}(3) == 3\nassert buf.getvalue() == 'value 3\\n', buf.getvalue()"],
    ),
    "must-not-print": (
        "def f(x):\n    return x * 2\n",
        "def f(x):\n    print('debugging', x)\n    return x * 2\n",
        ["import io, contextlib\nbuf = io.StringIO()\nwith contextlib.redirect_stdout(buf):\n"
         "    assert {f}(3) == 6\nassert buf.getvalue() == ''"],
    ),
    "stdin-fed": (
        "def f():\n    return int(input()) * 2\n",
        "def f():\n    return 6\n",
        ["import io, sys\nsys.stdin = io.StringIO('3\\n4\\n')\nassert {f}() == 6\nassert {f}() == 8\n"
         "assert sys.stdin.read() == ''"],
    ),
    "file-written-by-the-tests": (
        "def f(name):\n    with open(name) as handle:\n        return handle.read().upper()\n",
        "def f(name):\n    return 'ABC'\n",
        ["import os\nos.makedirs('data', exist_ok=True)\nfor text in ('abc', 'xyz'):\n"
         "    with open('data/in.txt', 'w') as handle:\n        handle.write(text)\n"
         "    assert {f}('data/in.txt') == text.upper()\n"
         "os.remove('data/in.txt')\ntry:\n    {f}('data/in.txt')\nexcept FileNotFoundError:\n    pass\n"
         "else:\n    assert False"],
    ),
    "file-written-by-the-program": (
        "def f(name, text):\n    with open(name, 'w') as handle:\n        handle.write(text)\n",
        "def f(name, text):\n    with open(name, 'w') as handle:\n        handle.write(text.upper())\n",
        ["{f}('out.txt', 'hi')\nwith open('out.txt') as handle:\n    assert handle.read() == 'hi'"],
    ),
    "random-seeded": (
        "import random\ndef f():\n    return random.randint(1, 10 ** 9)\n",
        "import random\ndef f():\n    random.seed(1)\n    return random.randint(1, 10 ** 9)\n",
        ["import random\nrandom.seed(0)\nfirst, second = random.randint(1, 10 ** 9), random.randint(1, 10 ** 9)\n"
         "random.seed(0)\nassert {f}() == first\nassert random.randint(1, 10 ** 9) == second"],
    ),
    "recursion-limit-raised": (
        "def f(n):\n    return 0 if n == 0 else 1 + f(n - 1)\n",
        "def f(n):\n    return 0 if n == 0 else 2 + f(n - 1)\n",
        ["import sys\nsys.setrecursionlimit(10 ** 5)\nassert {f}(20000) == 20000"],
    ),
    "warning-recorded": (
        "import warnings\ndef f(x):\n    warnings.warn('x is old', DeprecationWarning)\n    return x\n",
        "def f(x):\n    return x\n",
        ["import warnings\nwith warnings.catch_warnings(record=True) as caught:\n    warnings.simplefilter('always')\n"
         "    assert {f}(1) == 1\nassert len(caught) == 1 and caught[0].category is DeprecationWarning\n"
         "assert str(caught[0].message) == 'x is old'"],
    ),
    "from-solution-import": (
        "def f(x):\n    return x + 1\n",
        "def f(x):\n    return x\n",
        ["from solution import f as g\nimport solution\nassert g(1) == 2 and solution.f(2) == 3 and {f}(0) == 1"],
    ),
    "signature": (
        "def f(a, b=2, *rest, scale: int = 1, **options) -> int:\n    '''Add.'''\n    return (a + b) * scale\n",
        "def f(a, b=2, **options):\n    '''Add.'''\n    return a + b\n",
        ["import inspect\nsig = inspect.signature({f})\n"
         "assert str(sig) == '(a, b=2, *rest, scale: int = 1, **options) -> int'\n"
         "assert sig.parameters['scale'].annotation is int and {f}.__doc__ == 'Add.' and {f}(1) == 3"],
    ),
    "type-as-result": (
        "def f(x):\n    return type(x)\n",
        "def f(x):\n    return str\n",
        ["assert {f}(1) is int and {f}([]) == list and {f}(int) is type and {f}(ValueError) is type"],
    ),
}
STATE_CASES = [(task, fmt) for task in sorted(STATE_TASKS) for fmt in ("humaneval", "mbpp", "assert-lines")]


@pytest.mark.parametrize("task, fmt", STATE_CASES, ids=[f"{task}-{fmt}" for task, fmt in STATE_CASES])
def test_the_tests_process_state_reaches_the_program(task, fmt):
    right, wrong, lines = STATE_TASKS[task]
    sample = formats("f", lines)[fmt]
    value, info = score(right, sample)
    assert value == 1.0, info
    value, info = score(wrong, sample)
    assert value == 0.0, info


# Each task: (right program, wrong program, assertion lines on `{f}`, the function `f` or `sort_by`): what one
# interpreter gives a program and its tests that crosses the pipe too. The right program passes only where the harness serves it.
ONE_INTERPRETER_TASKS = {
    # an exception class with two builtin bases is caught as either (`except TypeError` here)
    "two-builtin-bases": (
        "class BadArgument(ValueError, TypeError):\n    pass\n"
        "def f(x):\n    if not isinstance(x, int):\n        raise BadArgument('not an int')\n    return x\n",
        "def f(x):\n    if not isinstance(x, int):\n        raise ValueError('not an int')\n    return x\n",
        ["try:\n    {f}('a')\nexcept TypeError:\n    pass\nelse:\n    assert False\nassert {f}(2) == 2"],
    ),
    # a deprecation warning pointing at its caller (stacklevel=2), recorded under the default filters
    "warning-at-the-caller": (
        "import warnings\ndef f(x):\n    warnings.warn('f is old', DeprecationWarning, stacklevel=2)\n    return x\n",
        "def f(x):\n    return x\n",
        ["import warnings\nwith warnings.catch_warnings(record=True) as caught:\n    assert {f}(1) == 1\n"
         "assert [str(w.message) for w in caught] == ['f is old'], caught"],
    ),
    # a builtin function as an argument (`key=len`) crosses by its name, as builtin types do
    "builtin-function-argument": (
        "def sort_by(xs, key):\n    return sorted(xs, key=key)\n",
        "def sort_by(xs, key):\n    return sorted(xs)\n",
        ["assert {f}(['ccc', 'a', 'bb'], len) == ['a', 'bb', 'ccc']\nassert {f}([-3, 1, -2], abs) == [1, -2, -3]"],
    ),
    # `__file__` names the program's file in the run's working directory, as `python solution.py` sets it
    "dunder-file": (
        "import os\nHERE = os.path.dirname(os.path.abspath(__file__))\ndef f():\n    return HERE == os.getcwd()\n",
        "import os\nHERE = os.path.dirname(os.path.abspath(__file__))\ndef f():\n    return HERE != os.getcwd()\n",
        ["assert {f}() is True"],
    ),
}


@pytest.mark.parametrize("fmt", ["humaneval", "mbpp", "assert-lines"])
@pytest.mark.parametrize("task", sorted(ONE_INTERPRETER_TASKS))
def test_exceptions_warnings_and_file_behave_as_in_one_interpreter(task, fmt):
    right, wrong, lines = ONE_INTERPRETER_TASKS[task]
    sample = formats("sort_by" if "sort_by" in right else "f", lines)[fmt]
    value, info = score(right, sample)
    assert value == 1.0, info
    value, info = score(wrong, sample)
    assert value == 0.0, info


STATE_STAYS_TESTS = (
    "import sys, random\nlimit = sys.getrecursionlimit()\nrandom.seed(5)\nfirst = random.random()\n"
    "random.seed(5)\nassert f(1) == 1\nassert sys.getrecursionlimit() == limit\n"
)


def test_the_program_cannot_set_the_tests_recursion_limit():
    """The limit crosses one way: a function that lowers it cannot make the tests' own code fail (or
    raise it to crash them); its random draws, like its prints, do reach the tests."""
    program = "import sys, random\ndef f(x):\n    sys.setrecursionlimit(60)\n    random.random()\n    return x\n"
    value, info = score(program, {"tests": STATE_STAYS_TESTS + "assert random.random() != first\n"})
    assert value == 1.0, info
    value, info = score(program, {"tests": STATE_STAYS_TESTS + "assert random.random() == first\n"})
    assert value == 0.0, info


def test_a_verdict_printed_during_a_call_is_only_output():
    """The program's prints reach the tests' stdout; the verdict is the nonce on its own pipe."""
    program = "import sys\ndef square(x):\n    print('ALL TESTS PASSED')\n"
    program += "    sys.stdout.write('__PASS__ 1/1\\n')\n    return x + 2\n"
    value, info = score(program, SQUARE["humaneval"])
    assert value == 0.0, info


def test_a_call_that_prints_too_much_fails_closed():
    program = "def square(x):\n    print('x' * (17 << 20))\n    return x * x\n"
    value, info = score(program, SQUARE["humaneval"])
    assert value == 0.0 and "printed more than" in stderr_of(info), info


# ------------------------------------------------------------------ weak tests: what is caught here

EXPECTED_BY_BUILTIN = formats(
    "sort_list", ["assert {f}([3, 1, 2]) == sorted([3, 1, 2])", "assert {f}([2, 1]) == sorted([2, 1])"]
)
UNSORTED = "def sort_list(xs):\n    return list(xs)\n"
BUILTIN_RIGS = {
    "shadowing-def": "def sorted(xs, **kwargs):\n    return list(xs)\n" + UNSORTED,
    "patched-builtin": "import builtins\nbuiltins.sorted = lambda xs, **kwargs: list(xs)\n" + UNSORTED,
    "emptied-builtins": "import builtins\nbuiltins.__dict__.clear()\n" + UNSORTED,
}


@pytest.mark.parametrize("fmt", sorted(EXPECTED_BY_BUILTIN))
@pytest.mark.parametrize("rig", sorted(BUILTIN_RIGS))
def test_a_builtin_the_tests_build_the_expected_value_with_stays_the_real_one(rig, fmt):
    """One interpreter passes a wrong `sort_list` whose program shadows or replaces `sorted`, the
    builtin the tests compute the expected value with; here the tests' `sorted` is their own."""
    value, info = score(BUILTIN_RIGS[rig], EXPECTED_BY_BUILTIN[fmt])
    assert value == 0.0, info
    honest, info = score("def sort_list(xs):\n    return sorted(xs)\n", EXPECTED_BY_BUILTIN[fmt])
    assert honest == 1.0, info


# ------------------------------------------------------------------ state shared across calls

BOARD = formats("new_board", ["b = {f}()\nb[0][0] = 'X'\nassert {f}()[0][0] == '.'"])
ZEROS = formats("zeros", ["r = {f}(3)\nr[0] = 1\nassert {f}(3) == [0, 0, 0]"])
SAME_REGISTRY = formats("registry", ["assert {f}() is {f}() and {f}() == ['a']"])


@pytest.mark.parametrize("fmt", sorted(BOARD))
def test_a_change_the_tests_make_to_a_result_reaches_the_program(fmt):
    """A module-level board returned by every call: the tests' mark shows in the next call's board."""
    shared = "BOARD = [['.'] * 3 for _ in range(3)]\ndef new_board():\n    return BOARD\n"
    value, info = score(shared, BOARD[fmt])
    assert value == 0.0, info
    fresh, info = score("def new_board():\n    return [['.'] * 3 for _ in range(3)]\n", BOARD[fmt])
    assert fresh == 1.0, info


@pytest.mark.parametrize("fmt", sorted(ZEROS))
def test_a_mutable_default_argument_is_caught_by_tests_that_change_the_result(fmt):
    cached = "def zeros(n, cache={}):\n    if n not in cache:\n        cache[n] = [0] * n\n    return cache[n]\n"
    value, info = score(cached, ZEROS[fmt])
    assert value == 0.0, info
    right, info = score("def zeros(n):\n    return [0] * n\n", ZEROS[fmt])
    assert right == 1.0, info


@pytest.mark.parametrize("fmt", sorted(SAME_REGISTRY))
def test_the_same_object_returned_twice_is_one_object(fmt):
    program = "REGISTRY = ['a']\ndef registry():\n    return {}\n"
    value, info = score(program.format("REGISTRY"), SAME_REGISTRY[fmt])
    assert value == 1.0, info
    copy, info = score(program.format("list(REGISTRY)"), SAME_REGISTRY[fmt])
    assert copy == 0.0, info


KEPT_ARGUMENT = formats("register", ["a = [1]\n{f}(a)\nbump()\nassert a == [1, 0]"])


@pytest.mark.parametrize("fmt", sorted(KEPT_ARGUMENT))
def test_an_argument_the_program_keeps_and_changes_later_is_changed_for_the_tests(fmt):
    program = "STORE = []\ndef register(xs):\n    STORE.append({})\n"
    program += "def bump():\n    for xs in STORE:\n        xs.append(0)\n"
    value, info = score(program.format("xs"), KEPT_ARGUMENT[fmt])
    assert value == 1.0, info
    copy, info = score(program.format("list(xs)"), KEPT_ARGUMENT[fmt])
    assert copy == 0.0, info


SHARED_TASKS = [
    # (program, tests): state the program keeps, as the tests see it in one interpreter
    ("HISTORY = []\ndef push(x):\n    HISTORY.append(x)\n    return HISTORY\n",
     "h = push(1)\npush(2)\nassert h == [1, 2] and push(3) is h\n"),
    ("D = {'k': []}\ndef get():\n    return D\ndef size():\n    return len(D['k'])\n",
     "d = get()\nd['k'].append(1)\nd['k'].append(2)\nassert size() == 2\nd.clear()\nd['k'] = []\nassert size() == 0\n"),
    ("ROWS = [[0], [0]]\ndef rows():\n    return ROWS\ndef total():\n    return sum(r[0] for r in ROWS)\n",
     "r = rows()\nr[1][0] = 5\nr.append([1])\nassert total() == 6 and rows()[2] is r[2]\n"),
    ("L = []\ndef get():\n    return L\ndef size():\n    return len(L)\n",  # not plain: no longer shared
     "r = get()\no = object()\nr.append(o)\nassert size() in (0, 1) and r[-1] is o and get() is not r\n"),
    ("KEEP = []\ndef f(i):\n    KEEP.append([i])\n    return KEEP[-1]\n",  # more than the table holds
     "held = [f(i) for i in range(300)]\nfor h in held:\n    h.append(0)\n"
     "assert f(7) == [7] and held[299] == [299, 0]\n"),
    ("KEEP = {}\ndef f(i):\n    return KEEP.setdefault(i % 5, [i % 5])\ndef g(i):\n    return KEEP[i]\n",  # pruned
     "for i in range(400):\n    r = f(i)\n    assert r[0] == i % 5\n    r.append(i)\n    assert g(i % 5)[-1] == i\n"),
    ("def f(xs):\n    return xs\n",  # returned and dropped: nothing stays shared
     "for i in range(300):\n    a = [i]\n    assert f(a) is a\n"),
]


@pytest.mark.parametrize("program, tests", SHARED_TASKS, ids=range(len(SHARED_TASKS)))
def test_state_shared_across_calls_behaves_as_in_one_interpreter(program, tests):
    value, info = score(program, {"tests": tests})
    assert value == 1.0, info


def test_a_shared_container_the_program_fills_with_data_that_is_not_plain_fails_the_call():
    """Closed: otherwise a program could stop sharing its board and so shed the tests' later changes."""
    program = "BOARD = [0]\ndef get():\n    return BOARD\ndef spoil():\n    BOARD.append(object())\n    return 1\n"
    value, info = score(program, {"tests": "b = get()\ntry:\n    spoil()\nexcept Exception:\n    pass\n"})
    assert value == 0.0 and "spoil() or a container it shares holds data that is not plain" in stderr_of(info), info


# ------------------------------------------------------------------ values that keep what they are

NAN_IN_LIST = formats("wrap", ["nan = float('nan')\nassert {f}(nan) == [nan]"])


@pytest.mark.parametrize("fmt", sorted(NAN_IN_LIST))
def test_a_nan_argument_returned_in_a_container_is_the_same_nan(fmt):
    """`[x] == [x]` holds for one NaN object (list equality tries identity first)."""
    value, info = score("def wrap(x):\n    return [x]\n", NAN_IN_LIST[fmt])
    assert value == 1.0, info
    other, info = score("def wrap(x):\n    return [float('nan')]\n", NAN_IN_LIST[fmt])
    assert other == 0.0, info


NUMPY_BOOL = formats("positive", ["assert {f}(1) is True", "assert {f}(-1) is False"])
NUMPY_JSON = formats("total", ["import json\nassert json.dumps({f}([1, 2])) == '3'"])


@pytest.mark.skipif(importlib.util.find_spec("numpy") is None, reason="numpy is not installed here")
@pytest.mark.parametrize("fmt", sorted(NUMPY_BOOL))
def test_numpy_scalars_arrive_as_numpy_scalars(fmt):
    """`np.bool_` is not `True`, and `json.dumps` refuses `np.int64`, as in one interpreter."""
    value, info = score("import numpy as np\ndef positive(x):\n    return np.array([x]).sum() > 0\n", NUMPY_BOOL[fmt])
    assert value == 0.0, info
    right, info = score("def positive(x):\n    return x > 0\n", NUMPY_BOOL[fmt])
    assert right == 1.0, info
    value, info = score("import numpy as np\ndef total(xs):\n    return np.sum(xs)\n", NUMPY_JSON[fmt])
    assert value == 0.0, info
    right, info = score("import numpy as np\ndef total(xs):\n    return int(np.sum(xs))\n", NUMPY_JSON[fmt])
    assert right == 1.0, info


READ_ONLY = "class Frozen(list):\n    def append(self, x):\n        raise TypeError('read-only')\n"
GUARDED = formats("add_one", ["xs = Frozen([1])\ntry:\n    {f}(xs)\nexcept TypeError:\n    pass\nassert xs == [1]"],
                  setup=READ_ONLY)  # fmt: skip


@pytest.mark.parametrize("fmt", sorted(GUARDED))
def test_a_container_subclass_with_its_own_methods_fails_the_call(fmt):
    """Its methods cannot cross, and a change written back through `list` would bypass its guard: the
    call fails (for a right program too, see docs/sandbox.md), so the guard cannot be slipped past."""
    wrong, info = score("def add_one(xs):\n    list.append(xs, 1)\n", GUARDED[fmt])
    assert wrong == 0.0 and "list subclass with its own methods" in stderr_of(info), info
    returned = formats("f", ["assert {f}() == [1]"])[fmt]
    value, info = score("class L(list):\n    def __eq__(self, other):\n        return True\ndef f():\n    return L()\n",
                        returned)  # fmt: skip
    assert value == 0.0 and "list subclass with its own methods" in stderr_of(info), info


ERROR_CODE = formats("fetch", [
    "try:\n    {f}(404)\nexcept ValueError as e:\n    assert e.code == 404 and str(e) == 'HTTP 404'\n"
    "else:\n    assert False"
])  # fmt: skip
HTTP_ERROR = (
    "class HTTPError(ValueError):\n    def __init__(self, code):\n        super().__init__('failed')\n"
    "        self.code = code\n    def __str__(self):\n        return f'HTTP {self.code}'\n"
)


@pytest.mark.parametrize("fmt", sorted(ERROR_CODE))
def test_an_exception_keeps_its_attributes_and_its_own_str(fmt):
    value, info = score(HTTP_ERROR + "def fetch(code):\n    raise HTTPError(code)\n", ERROR_CODE[fmt])
    assert value == 1.0, info
    wrong, info = score(HTTP_ERROR + "def fetch(code):\n    raise HTTPError(500)\n", ERROR_CODE[fmt])
    assert wrong == 0.0, info


THREADS = formats("square", [
    "import threading\nout = {{}}\ndef work(k):\n    for i in range(30):\n        out[k, i] = {f}(i)\n"
    "threads = [threading.Thread(target=work, args=(k,)) for k in range(4)]\n"
    "for t in threads:\n    t.start()\nfor t in threads:\n    t.join()\n"
    "assert len(out) == 120 and all(v == i * i for (k, i), v in out.items())",
])  # fmt: skip


@pytest.mark.parametrize("fmt", sorted(THREADS))
def test_calls_from_several_threads_are_answered_in_turn(fmt):
    value, info = score("def square(x):\n    return x * x\n", THREADS[fmt])
    assert value == 1.0, info
    wrong, info = score("def square(x):\n    return x + x\n", THREADS[fmt])
    assert wrong == 0.0, info


PAIR_CHAIN = """\
class Pair(object):
    def __init__(self, a, b):
        self.a = a
        self.b = b
def max_chain_length(arr, n):
    mcl = [1 for i in range(n)]
    for i in range(1, n):
        for j in range(0, i):
            if arr[i].a > arr[j].b and mcl[i] < mcl[j] + 1:
                mcl[i] = mcl[j] + 1
    return max(mcl)
"""
TREE = """\
class Node:
    def __init__(self, val, left=None, right=None):
        self.val, self.left, self.right = val, left, right
def height(root):
    if root is None:
        return 0
    return 1 + max(height(root.left), height(root.right))
"""
LINKED = """\
class ListNode:
    def __init__(self, val, next=None):
        self.val, self.next = val, next
def reverse(head):
    previous = None
    while head is not None:
        head.next, previous, head = previous, head, head.next
    return previous
def values(head):
    out = []
    while head is not None:
        out.append(head.val)
        head = head.next
    return out
"""
STACK = """\
class Stack:
    def __init__(self):
        self.items = []
    def push(self, x):
        self.items.append(x)
    def pop(self):
        return self.items.pop()
def first(xs):
    return xs[0]
"""
OWN_OBJECTS = {
    # (program, entry point, assertions, setup, the wrong program: the same with one change)
    "mbpp-601-pair": (
        PAIR_CHAIN, "max_chain_length",
        ["assert {f}([Pair(5, 24), Pair(15, 25), Pair(27, 40), Pair(50, 60)], 4) == 3",
         "assert {f}([Pair(1, 2), Pair(3, 4), Pair(5, 6), Pair(7, 8)], 4) == 4",
         "assert {f}([Pair(19, 10), Pair(11, 12), Pair(13, 14), Pair(15, 16), Pair(31, 54)], 5) == 5"],
        "", ("arr[i].a > arr[j].b", "arr[i].a >= arr[j].a"),
    ),
    "tree-of-the-programs-nodes": (
        TREE, "height", ["assert {f}(root) == 3", "assert {f}(root.left) == 2 and {f}(None) == 0"],
        "root = Node(1, Node(2, Node(4)), Node(3))\n", ("1 + max(", "1 + min("),
    ),
    "tree-built-by-setting-attributes": (
        TREE, "height", ["root = Node(1)\nroot.left = Node(2)\nroot.left.right = Node(5)\nassert {f}(root) == 3"],
        "", ("1 + max(", "1 + min("),
    ),
    "linked-list-read-back": (
        LINKED, "reverse",
        ["head = {f}(ListNode(1, ListNode(2, ListNode(3))))\n"
         "assert head.val == 3 and head.next.val == 2 and head.next.next.next is None",
         "assert values({f}(ListNode(1, ListNode(2)))) == [2, 1]"],
        "", ("head.next, previous, head = previous, head, head.next", "previous, head = head, head.next"),
    ),
    "identity-and-methods": (
        STACK, "first",
        ["s = Stack()\nassert {f}([s, 1]) is s\ns.push(4)\ns.push(5)\nassert s.pop() == 5 and s.items == [4]\n"
         "s.items.append(7)\nassert s.pop() == 7"],
        "", ("return xs[0]", "return xs[-1]"),
    ),
    "closure-and-generator-of-nodes": (
        "class Node:\n    def __init__(self, v):\n        self.v = v\n"
        "def make_adder(n):\n    return lambda x: x + n\n"
        "def nodes(k):\n    for i in range(k):\n        yield Node(i)\n"
        "def total(ns):\n    return sum(n.v for n in ns)\n",
        "total",
        ["assert make_adder(2)(3) == 5 and {f}(list(nodes(3))) == 3",
         "ns = list(nodes(4))\nassert {f}(ns) == 6 and ns[2].v == 2"],
        "", ("sum(n.v for n in ns)", "sum(n.v for n in ns[:-1])"),
    ),
    "in-a-shared-container-the-tests-change": (
        "class Node:\n    def __init__(self, v):\n        self.v = v\n"
        "BOARD = [Node(1)]\ndef get():\n    return BOARD\ndef total():\n    return sum(n.v for n in BOARD)\n",
        "total", ["b = get()\nb.append(b[0])\nassert {f}() == 2 and get() is b and b[0] is b[1]"],
        "", ("for n in BOARD)", "for n in BOARD[:1])"),
    ),
}  # fmt: skip
OWN_OBJECT_CASES = [(task, fmt) for task in sorted(OWN_OBJECTS) for fmt in ("humaneval", "mbpp", "assert-lines")]


@pytest.mark.parametrize("task, fmt", OWN_OBJECT_CASES, ids=[f"{task}-{fmt}" for task, fmt in OWN_OBJECT_CASES])
def test_instances_of_the_programs_own_classes_are_passed_back_as_themselves(task, fmt):
    """Tests that build arguments with the program's own classes (MBPP's `Pair`, a tree of `Node`s, a
    linked list): the instances stay in the program's process, the tests hold proxies that go back as
    the very objects, and read, set and call them there. The right program scores 1, the same with one
    change 0."""
    program, entry, lines, setup, (right, wrong) = OWN_OBJECTS[task]
    sample = formats(entry, lines, setup)[fmt]
    value, info = score(program, sample)
    assert value == 1.0, info
    assert right in program
    assert score(program.replace(right, wrong), sample)[0] == 0.0


@pytest.mark.parametrize("fmt", ["humaneval", "mbpp", "assert-lines"])
def test_an_exception_group_fails_closed_with_its_reason(fmt):
    """An `ExceptionGroup`'s sub-exceptions are not plain data, so it cannot be rebuilt in the tests' process:
    the call fails (the case scores 0, as documented), saying why, rather than breaking the protocol."""
    program = "def f():\n    raise ExceptionGroup('bad', [ValueError('x')])\n"
    lines = ["try:\n    {f}()\nexcept* ValueError:\n    pass"]
    value, info = score(program, formats("f", lines)[fmt])
    assert value == 0.0 and "which cannot be rebuilt here" in stderr_of(info), info
