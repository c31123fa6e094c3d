"""Adversarial self-check of the code reward: hostile programs score 0, are stopped by the limit they run
into (the reason says which), and leave the calling process and the file system outside their temp dir alone.
No test bounds the elapsed time: a loaded machine stretches it, and the reason is what shows a limit fired.

Each attack is written so that it would *pass* (score 1) if the defence it probes were missing: it
defines the correct solution only when the attack worked.
"""

import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid

import pytest

from grpo_jax.rewards import code_reward
from grpo_jax.rewards.sandbox import Isolation, capabilities

TESTS = {
    "tests": "def check(candidate):\n"
    "    assert abs(candidate(2) - 4) < 1e-9\n"
    "    assert abs(candidate(-3) - 9) < 1e-9\n",
    "entry_point": "square",
}
RIGHT_IF_OK = "def square(x):\n    return x * x if ok else x + 2\n"  # correct only when `ok` is true
WRONG = "def square(x):\n    return x + 2\n"
WALL_S = 2.0


def attack(body: str) -> tuple[float, dict]:
    result = code_reward("<think>x</think>```python\n" + body + "```", TESTS, wall_s=WALL_S, cpu_s=WALL_S)
    return result.score, dict(result.info)


@pytest.fixture(autouse=True)
def caller_untouched():
    """Whatever the program does, this process keeps its cwd, environment and signal handlers."""

    def state():
        env = {k: v for k, v in os.environ.items() if k != "PYTEST_CURRENT_TEST"}  # pytest's own phase marker
        return os.getcwd(), env, signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGALRM)

    before = state()
    yield
    assert state() == before


@pytest.fixture
def bystander():
    """A process of the caller's user standing in for the trainer (holds a secret in its environment)."""
    secret = "grpo-secret-" + uuid.uuid4().hex
    proc = subprocess.Popen(["sleep", "60"], env={"GRPO_TEST_SECRET": secret, "PATH": os.environ.get("PATH", "")})
    yield proc, secret
    proc.kill()
    proc.wait()


def _processes_with(token: str) -> list[int]:
    found = []
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    if token.encode() in f.read():
                        found.append(int(pid))
            except OSError:
                pass
    return found


def test_infinite_loop():
    score, info = attack("while True:\n    pass\n" + WRONG)
    assert score == 0.0 and info["reason"] in ("timeout", "cpu_limit")  # it really ran until a limit


def test_fork_bomb_is_contained():
    score, info = attack("import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass\n")
    assert score == 0.0 and info["reason"] in ("timeout", "cpu_limit", "killed")
    assert subprocess.run(["true"]).returncode == 0  # the caller can still start processes


def test_escaped_daemons_are_killed():
    """setsid() leaves the process group; the PID namespace (or the per-run uid) still gets them."""
    token = "grpo-daemon-" + uuid.uuid4().hex
    body = (
        "import os\nfor _ in range(3):\n    if os.fork() == 0:\n        os.setsid()\n"
        f"        os.execv('/bin/sleep', ['{token}', '30'])\n"
        "while True:\n    pass\n"
    )
    score, _ = attack(body)
    assert score == 0.0
    deadline = time.monotonic() + 10  # only ends the wait for the killed ones to vanish; an escaped one sleeps 30 s
    while _processes_with(token) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _processes_with(token) == []


def test_memory_bomb():
    score, info = attack("x = []\nwhile True:\n    x.append(bytearray(64 * 2**20))\n")
    assert score == 0.0 and info["reason"] == "memory"


def test_100mb_of_output():
    # killed at the 1 MiB cap, not after reading 100 MB: the program never got past its write (it blocks on the
    # full pipe once the cap stops the reading), so the line it writes after it never reaches stderr
    body = "import sys\nsys.stdout.write('x' * (100 * 2**20))\nsys.stderr.write('ALL WRITTEN')\n" + WRONG
    score, info = attack(body)
    assert score == 0.0 and info["reason"] == "output_limit"
    assert "ALL WRITTEN" not in info["results"][0].get("stderr_tail", "")


def test_connect_to_local_listener():
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen(8)
        server.settimeout(0.3)
        port = server.getsockname()[1]
        body = (
            "import socket\nok = False\ntry:\n"
            f"    s = socket.create_connection(('127.0.0.1', {port}), timeout=1)\n"
            "    s.sendall(b'pwned')\n    ok = True\nexcept OSError:\n    pass\n" + RIGHT_IF_OK
        )
        score, _ = attack(body)
        with pytest.raises(socket.timeout):
            server.accept()  # nothing ever connected
    assert score == 0.0


def test_write_outside_temp_dir(tmp_path):
    token = "grpo-escape-" + uuid.uuid4().hex
    targets = [
        os.path.join(tempfile.gettempdir(), token),  # world-writable /tmp
        str(tmp_path / token),  # a directory of the caller
        os.path.join(os.getcwd(), token),  # the repository
        "../" + token,  # next to the sandbox's own temp dir
    ]
    body = (
        f"ok = False\nfor p in {targets!r}:\n    try:\n        open(p, 'w').write('x')\n        ok = True\n"
        "    except OSError:\n        pass\n" + RIGHT_IF_OK
    )
    score, _ = attack(body)
    assert score == 0.0
    leftovers = [p for p in targets[:3] + [os.path.join(tempfile.gettempdir(), token)] if os.path.exists(p)]
    assert leftovers == []


def test_read_environment_of_the_caller(bystander, monkeypatch):
    proc, secret = bystander
    monkeypatch.setenv("GRPO_TEST_SECRET", secret)
    body = (
        "import os, glob\nok = 'GRPO_TEST_SECRET' in os.environ\n"
        "for p in glob.glob('/proc/*/environ'):\n    try:\n"
        f"        ok = ok or {secret!r}.encode() in open(p, 'rb').read()\n"
        "    except OSError:\n        pass\n" + RIGHT_IF_OK
    )
    score, _ = attack(body)
    assert score == 0.0


def test_kill_the_parent_and_the_caller(bystander):
    proc, _ = bystander
    caps = capabilities()
    if not (caps["pid_namespace"] or caps["drop_uid"] or int(caps["landlock_abi"]) >= 6):
        pytest.skip("no layer here stops a same-user process from signalling the caller")
    body = (
        "import os, signal\nok = False\n"
        f"for pid in (os.getppid(), {proc.pid}, {os.getpid()}):\n    try:\n"
        "        os.kill(pid, signal.SIGKILL) if pid else None\n        ok = ok or pid > 1\n"
        "    except OSError:\n        pass\n" + RIGHT_IF_OK
    )
    score, _ = attack(body)
    assert score == 0.0
    assert proc.poll() is None  # the stand-in trainer is alive (and so, evidently, are we)


@pytest.mark.parametrize(
    "body",
    [
        "exit(0)\n" + WRONG,
        "raise SystemExit\n" + WRONG,
        "raise SystemExit(0)\n" + WRONG,
        "import os\nos._exit(0)\n",
        "import atexit, os\natexit.register(lambda: os._exit(0))\n" + WRONG,
    ],
    ids=["exit0", "raise-SystemExit", "SystemExit0", "os._exit", "atexit"],
)
def test_early_exit_is_not_a_pass(body):
    score, info = attack(body)
    assert score == 0.0 and info["reason"] in ("incomplete", "error")


@pytest.mark.parametrize(
    "body",
    [
        "def check(candidate):\n    return True\n" + WRONG,
        "import builtins, sys, os\nbuiltins.AssertionError = type('Nope', (Exception,), {})\n"
        "sys.excepthook = lambda *a: os._exit(0)\n" + WRONG,
        "abs = lambda x: 0\n" + WRONG,
        "import builtins\nbuiltins.abs = lambda x: 0\n" + WRONG,
        "import sys, types\nsys.modules['math'] = types.SimpleNamespace(isclose=lambda *a, **k: True)\n" + WRONG,
        "import sys\ndef _rig(frame, event, arg):\n    frame.f_globals['abs'] = lambda v: 0\n"
        "sys.settrace(_rig)\n" + WRONG,
    ],
    ids=["redefine-check", "redefine-assert", "shadow-abs", "patch-builtins", "swap-module", "settrace"],
)
def test_redefining_the_test_machinery(body):
    score, _ = attack(body)
    assert score == 0.0


def test_a_trace_hook_is_harmless_to_a_right_answer():
    """Trace hooks act in the solution's process only (the tests run in another), so they are not
    rejected: a right answer that installs one scores 1."""
    score, info = attack("import sys\nsys.settrace(lambda *a: None)\ndef square(x):\n    return x * x\n")
    assert score == 1.0, info


def test_swapping_a_module_the_tests_import():
    sample = {
        "tests": "import math\ndef check(c):\n    assert math.isclose(c(2), 4)\n    assert math.isclose(c(-3), 9)\n",
        "entry_point": "square",
    }
    body = "import sys, types\nsys.modules['math'] = types.SimpleNamespace(isclose=lambda *a, **k: True)\n" + WRONG
    response = "<think>x</think>```python\n" + body + "```"
    assert code_reward(response, sample, wall_s=WALL_S).score == 0.0
    honest = "<think>x</think>```python\nimport math\ndef square(x):\n    return math.pow(x, 2)\n```"
    assert code_reward(honest, sample, wall_s=WALL_S).score == 1.0


def test_fake_pass_marker():
    body = (
        "import os\nprint('ALL TESTS PASSED')\nprint('__PASS__ 1/1')\n"
        "for fd in range(3, 16):\n    try:\n        os.write(fd, bytes(16))\n    except OSError:\n        pass\n"
        + WRONG
    )
    score, info = attack(body)
    assert score == 0.0 and info["reason"] == "error"  # the tests ran and failed


FORGE_REPLY = """\
import sys
_harness = sys._getframe(1).f_globals  # the solution's harness, which it controls
_harness['_answer'] = lambda *arguments: {reply!r}
def f(xs, t):
    return 5  # wrong: only a forged reply can answer 4
"""
NO_SHARE = [[], [], [], []]  # no shared containers changed, registered or dropped
FORGED_REPLIES = {
    # each carries the right answer 4, with something the tests' process must refuse
    "state-for-no-argument": ["ok", ["I", "4"], [[5, ["L", []]]], NO_SHARE],
    "state-for-a-tuple": ["ok", ["I", "4"], [[1, ["T", []]]], NO_SHARE],
    "state-of-another-kind": ["ok", ["I", "4"], [[0, ["D", []]]], NO_SHARE],
    "state-twice": ["ok", ["I", "4"], [[0, ["L", []]], [0, ["L", []]]], NO_SHARE],
    "argument-out-of-range": ["ok", ["T", [["I", "4"], ["A", 7]]], [], NO_SHARE],
    "reference-to-itself": ["ok", ["T", [["I", "4"], ["L", [["R", 1]]]]], [], NO_SHARE],
    "set-with-equal-elements": ["ok", ["T", [["I", "4"], ["E", [["I", "1"], ["I", "1"]]]]], [], NO_SHARE],
    "exception-of-no-builtin-class": ["raise", ["X", "NotABuiltin", "m", None, []], [], NO_SHARE],
    "exception-with-a-control-flow-base": ["raise", ["X", "ValueError,StopIteration", "m", None, []], [], NO_SHARE],
    "exception-with-a-repeated-base": ["raise", ["X", "ValueError,ValueError", "m", None, []], [], NO_SHARE],
    "exception-with-an-unknown-base": ["raise", ["X", "ValueError,NotABuiltin", "m", None, []], [], NO_SHARE],
    "iterator-that-does-not-exist": ["ok", ["T", [["I", "4"], ["G", 99]]], [], NO_SHARE],
    "shared-that-does-not-exist": ["ok", ["T", [["I", "4"], ["H", 3]]], [], NO_SHARE],
    "nan-that-was-not-sent": ["ok", ["T", [["I", "4"], ["An", 0]]], [], NO_SHARE],
    "state-for-no-shared-container": ["ok", ["I", "4"], [], [[[0, ["L", []]]], [], [], []]],
    "handle-for-a-tuple": ["ok", ["T", [["I", "4"]]], [], [[], [[0, 0]], [], []]],
    "handle-for-an-immutable-argument": ["ok", ["I", "4"], [], [[], [], [[1, 0]], []]],
    "handle-twice": ["ok", ["T", [["I", "4"], ["L", []]]], [], [[], [[1, 0]], [[0, 0]], []]],
    "drop-of-nothing": ["ok", ["I", "4"], [], [[], [], [], [0]]],
    "numpy-scalar-out-of-range": ["ok", ["T", [["I", "4"], ["Np", ["int8", ["I", "400"]]]]], [], NO_SHARE],
    "reply-without-share": ["ok", ["I", "4"], []],
}
FORGED_TESTS = """\
def check(c):
    try:
        r = c([1], (2,))
    except Exception:  # an exception passes too, so only the harness can fail the forged one
        r = 4
    r = r if isinstance(r, tuple) else (r,)
    assert r[0] == 4
    for part in r[1:]:
        if hasattr(part, '__next__'):
            list(part)
"""


@pytest.mark.parametrize("forged", sorted(FORGED_REPLIES))
def test_forged_replies_are_refused(forged):
    """The solution's process can send any reply; the tests' process accepts only well-formed ones,
    writes back only into the call's own changeable arguments, and fails the case otherwise."""
    body = FORGE_REPLY.format(reply=FORGED_REPLIES[forged])
    result = code_reward("<think>x</think>```python\n" + body + "```", {"tests": FORGED_TESTS, "entry_point": "f"})
    assert result.score == 0.0, result.info
    assert "sandbox_call_failed" in result.info["results"][0]["stderr_tail"], result.info


def test_a_well_formed_forged_reply_is_just_an_answer():
    """The control for the test above: the forged route is in use (the real `f` is wrong), and a
    well-formed reply through it passes."""
    body = FORGE_REPLY.format(reply=["ok", ["I", "4"], [[0, ["L", [["I", "1"]]]]], NO_SHARE])
    result = code_reward("<think>x</think>```python\n" + body + "```", {"tests": FORGED_TESTS, "entry_point": "f"})
    assert result.score == 1.0, result.info


FORGED_OBJECT_REPLIES = {
    # handles of objects that stay in the solution's process, forged: each must be refused as a
    # protocol break (the tests below never use the proxies, so only the decoder can fail them)
    "never-issued": ["ok", ["T", [["I", "4"], ["Ob", [3, "Pair"]]]], [], NO_SHARE],
    "number-as-str": ["ok", ["T", [["I", "4"], ["Ob", ["0", "Pair"]]]], [], NO_SHARE],
    "without-class-name": ["ok", ["T", [["I", "4"], ["Ob", 0]]], [], NO_SHARE],
    "renamed": ["ok", ["T", [["I", "4"], ["Ob", [0, "Pair"]], ["Ob", [0, "Node"]]]], [], NO_SHARE],
    "in-exception-attributes": [
        "raise", ["ValueError", "ValueError", "m", None, [["x", ["Ob", [0, "P"]]]]], [], NO_SHARE
    ],
    "in-exception-args": ["raise", ["ValueError", "ValueError", "m", ["T", [["Ob", [0, "P"]]]], []], [], NO_SHARE],
}  # fmt: skip
OBJECT_TESTS = """\
def check(c):
    try:
        r = c([1], (2,))
    except ValueError:
        r = (4,)
    assert type(r) is tuple and r[0] == 4
    assert len(r) < 3 or r[1] is r[2]
"""


@pytest.mark.parametrize("forged", sorted(FORGED_OBJECT_REPLIES))
def test_forged_object_handles_are_refused(forged):
    """A handle is accepted only as one the tests' side has seen (same class name) or the next one, and
    only where a value may be; anything else breaks the protocol and fails the case."""
    body = FORGE_REPLY.format(reply=FORGED_OBJECT_REPLIES[forged])
    result = code_reward("<think>x</think>```python\n" + body + "```", {"tests": OBJECT_TESTS, "entry_point": "f"})
    assert result.score == 0.0, result.info
    assert "broke the protocol" in result.info["results"][0]["stderr_tail"], result.info


def test_well_formed_object_handles_are_just_an_answer():
    """The control for the test above: handles 0, 0 again and 1 decode to proxies (one per handle)."""
    reply = ["ok", ["T", [["I", "4"], ["Ob", [0, "Pair"]], ["Ob", [0, "Pair"]], ["Ob", [1, "Node"]]]], [], NO_SHARE]
    body = FORGE_REPLY.format(reply=reply)
    result = code_reward("<think>x</think>```python\n" + body + "```", {"tests": OBJECT_TESTS, "entry_point": "f"})
    assert result.score == 1.0, result.info


FORGE_CONTEXT = """\
import sys
_harness = sys._getframe(1).f_globals  # the solution's harness, which it controls
_harness['_answer_in_context'] = lambda *arguments: ['ok', ['I', '4'], [], [[], [], [], []], {report!r}]
def f(xs, t):
    return 5  # wrong: only a forged reply can answer 4
"""
FORGED_REPORTS = {
    # what a call did besides its value, forged: each must be refused
    "not-a-dict": [],
    "warning-of-no-warning-class": {"warnings": [["SystemExit", "m", "<solution>", 1]]},
    "warning-of-no-builtin-class": {"warnings": [["__loader__", "m", "<solution>", 1]]},
    "file-outside-the-directory": {"files": [["../escaped", "00"]]},
    "file-by-absolute-path": {"files": [["/tmp/escaped", "00"]]},
    "stdin-the-tests-did-not-feed": {"stdin": 3},
    "random-state-malformed": {"random": [3, [1, 2], None]},
    "stdout-not-text": {"stdout": ["S", "x"]},
}


@pytest.mark.parametrize("forged", sorted(FORGED_REPORTS))
def test_forged_call_reports_are_refused(forged):
    """What the program printed, read, wrote, drew and warned comes back with each reply; a forged
    report is checked as strictly as a value and fails the case."""
    body = FORGE_CONTEXT.format(report=FORGED_REPORTS[forged])
    result = code_reward("<think>x</think>```python\n" + body + "```", {"tests": FORGED_TESTS, "entry_point": "f"})
    assert result.score == 0.0, result.info
    assert "sandbox_call_failed" in result.info["results"][0]["stderr_tail"], result.info


def test_a_well_formed_forged_report_is_just_an_answer():
    """The control for the test above: the forged route is in use, and a well-formed report passes."""
    body = FORGE_CONTEXT.format(report={"stdout": "printed\n"})
    result = code_reward("<think>x</think>```python\n" + body + "```", {"tests": FORGED_TESTS, "entry_point": "f"})
    assert result.score == 1.0, result.info


FORGE_DESCRIPTION = """\
import sys
_harness = sys._getframe(1).f_globals  # the solution's harness, which it controls
_harness['_descriptions'] = lambda namespace, names: ['described', {{'f': {description!r}}}]
def f(xs, t):
    return 4
"""
SIGNATURE_TESTS = "import inspect\ndef check(c):\n    assert c([1], (2,)) == 4\n    inspect.signature(c)\n"
FORGED_DESCRIPTIONS = {
    "parameter-name-no-identifier": [[["1x", 1, None, None]], None, None],
    "parameter-kind-unknown": [[["xs", 99, None, None]], None, None],
    "default-malformed": [[["xs", 1, ["v", ["X", 1]], None]], None, None],
    "not-a-list": {"xs": 1},
}


@pytest.mark.parametrize("forged", sorted(FORGED_DESCRIPTIONS))
def test_forged_signatures_are_refused(forged):
    """The program's signatures (sent when the tests name inspect) are decoded strictly too."""
    body = FORGE_DESCRIPTION.format(description=FORGED_DESCRIPTIONS[forged])
    result = code_reward("<think>x</think>```python\n" + body + "```", {"tests": SIGNATURE_TESTS, "entry_point": "f"})
    assert result.score == 0.0, result.info
    assert "sandbox_call_failed" in result.info["results"][0]["stderr_tail"], result.info


def test_a_well_formed_forged_signature_is_just_a_signature():
    body = FORGE_DESCRIPTION.format(description=[[["xs", 1, None, None], ["t", 1, ["v", ["I", "2"]], None]], None, "d"])
    result = code_reward("<think>x</think>```python\n" + body + "```", {"tests": SIGNATURE_TESTS, "entry_point": "f"})
    assert result.score == 1.0, result.info


def test_defences_do_not_reject_honest_code():
    score, info = attack("import math, collections, json\ndef square(x):\n    return math.prod([x, x])\n")
    assert score == 1.0, info
    assert sys.executable  # the caller is untouched (checked by the fixture)


# --------------------------------------------------------------------------- installed packages

PACKAGE_ATTEMPTS = """\
import os, sys
stdlib = [p for p in sys.path if os.path.isfile(p + '/os.py')][0]  # after the uid drop, a /proc/self/fd link
site = {site!r}.replace('STDLIB', stdlib)
sys.path.append(site)
outcomes = []
try:
    import {name}
    outcomes.append('imported')
except Exception as e:  # ImportError, or the finder's PermissionError
    outcomes.append(type(e).__name__)
for path in {files!r}:
    path = path.replace('SITE', site)
    try:
        open(path, 'rb').read(1)
        outcomes.append('read')
    except OSError as e:
        outcomes.append(type(e).__name__)
print(' '.join(outcomes))
"""


def _package_attempts(isolation) -> tuple[str, list[str]]:
    """Import a package installed beside numpy but not allowed, and read a file of it and of the system's
    dist-packages; (outcomes, the files tried)."""
    import glob
    import importlib.util

    from grpo_jax.rewards.sandbox import _hidden_paths, run_program

    for name in ("idna", "certifi", "click", "yaml", "sympy"):
        spec = importlib.util.find_spec(name)
        if spec is not None and spec.origin and any(spec.origin.startswith(h + "/") for h in _hidden_paths()):
            break
    else:
        pytest.skip("no package other than the allowed ones is installed here")
    site = os.path.dirname(os.path.dirname(spec.origin))
    files = ["SITE/" + os.path.relpath(spec.origin, site)]
    files += sorted(p for p in glob.glob("/usr/lib/python3/dist-packages/*.py") if os.path.isfile(p))[:1]
    stdlib = os.path.dirname(os.__file__)
    if os.path.realpath(site) == os.path.realpath(os.path.join(stdlib, "site-packages")):
        site = "STDLIB/site-packages"
    r = run_program(PACKAGE_ATTEMPTS.format(site=site, name=name, files=files), isolation=isolation)
    assert r.status == "ok", r.stderr
    return r.stdout.split(), files


@pytest.mark.parametrize("drop_uid", [None, False], ids=["all-layers", "uid-kept"])
def test_installed_packages_other_than_the_allowed_ones_are_out_of_reach(drop_uid):
    """The stdlib directory holds site-packages: Landlock admits the stdlib without it (and /usr without
    its dist-packages), so only the allowed packages can be imported and nothing else installed be read,
    also by a path through the stdlib directory's pinned fd, and also where no uid is dropped."""
    if not capabilities()["landlock"]:
        pytest.skip("landlock is not available on this machine")
    outcomes, files = _package_attempts(Isolation(drop_uid=drop_uid))
    assert len(outcomes) == 1 + len(files) and "imported" not in outcomes and "read" not in outcomes, outcomes


def test_control_without_landlock_installed_packages_are_reachable():
    """The test above could fail: without Landlock (and the uid kept, which may read the trainer's
    interpreter) the same program imports the package and reads the files."""
    outcomes, files = _package_attempts(Isolation(landlock=False, drop_uid=False))
    assert outcomes == ["imported"] + ["read"] * len(files)
