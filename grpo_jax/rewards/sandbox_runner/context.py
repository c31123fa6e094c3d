"""What one interpreter shares between the tests and the program besides a call's values, carried with
each call: the program's prints (to the tests' `sys.stdout`, so `redirect_stdout` sees them), the text
the tests put in `sys.stdin`, the files in the working directory, the `random` module's state, the
recursion limit the tests set, and the warnings the program raises (re-emitted under the tests' filters).

A call request carries `_TestsContext.outgoing()`, a dict holding only what changed on the tests' side;
`_ProgramContext` applies it around the call in the solution's process and reports what the call did
(`leave`); `_TestsContext.incoming` checks that report as strictly as a value and applies it. What the
program can do to the tests' process through it is what a function can do in one interpreter: print,
read stdin, write files in the working directory, draw from or seed `random`, warn. It cannot set the
tests' recursion limit (that goes one way), and its text never reaches the nonce pipe.
"""

import io
import os
import sys
import time

from .wire import _BadWire, _Decoder, _Encoder, _NotPlain, _message

_MAX_CALL_OUTPUT = 16 << 20  # bytes a call may print (more fails the call: it would all cross the pipe)
_MAX_SHARED_BYTES = 16 << 20  # bytes of files shared between the two working directories
_MAX_SHARED_FILES = 1000
_MAX_WARNINGS = 10_000  # warnings one call may raise
_MAX_WARNING_TEXT = 100_000
_STABLE_NS = 50_000_000  # a directory unchanged this long before a scan may be checked by its stat
_MT_WORDS = 625  # the Mersenne Twister's state: 624 words and an index
_SIGNATURE_WORDS = ("signature", "getfullargspec", "getargspec", "getdoc", "__doc__", "inspect")


def _frame_depth():
    """How many frames are on the stack here (the recursion limit counts them)."""
    frame, depth = sys._getframe(1), 0
    while frame is not None:
        frame, depth = frame.f_back, depth + 1
    return depth


def _random_state_data(state):
    """random.getstate() as JSON-ready data (version 3: 625 words and the cached gauss value)."""
    version, words, gauss = state
    return [version, list(words), None if gauss is None else float.hex(gauss)]


def _random_state(data):
    """The state `_random_state_data` sent, checked (a malformed one is _BadWire)."""
    if not (type(data) is list and len(data) == 3 and data[0] == 3 and type(data[1]) is list):
        raise _BadWire("malformed random state")
    words = data[1]
    if len(words) != _MT_WORDS or not all(type(w) is int and 0 <= w < 1 << 32 for w in words):
        raise _BadWire("malformed random state")
    if words[-1] > _MT_WORDS - 1 or not (data[2] is None or type(data[2]) is str):
        raise _BadWire("malformed random state")
    return (3, tuple(words), None if data[2] is None else float.fromhex(data[2]))


def _set_random_state(state):
    import random  # here: only a run whose tests or program use `random` imports it

    random.setstate(state)


class _Files:
    """The regular files under the working directory, by relative path, as last shared: `changes()`
    says which are new, changed or gone since, `apply()` makes the other side's changes here. Contents
    are compared, not timestamps (a file rewritten within one clock tick keeps its mtime). While the
    directory is empty, one stat stands in for the scan (see `unchanged`)."""

    def __init__(self):
        self.known = self.scan()

    def unchanged(self):
        """Whether the working directory is still the empty one the last scan saw: its timestamps are
        those it had then, and were at least _STABLE_NS older than that scan, so any later change
        (stamped with a clock at most one tick behind) shows as a new timestamp."""
        try:
            stat = os.stat(".")
        except OSError:
            return False
        return self.empty == (stat.st_mtime_ns, stat.st_ctime_ns)

    def scan(self):
        stat, now = os.stat("."), time.time_ns()
        stamps = (stat.st_mtime_ns, stat.st_ctime_ns)
        found, stack, size, seen = {}, [""], 0, 0
        while stack:
            folder = stack.pop()
            with os.scandir(folder or ".") as entries:
                for entry in entries:
                    seen += 1
                    path = folder + entry.name
                    if entry.is_dir(follow_symlinks=False):
                        stack.append(path + "/")
                    elif entry.is_file(follow_symlinks=False):
                        with open(path, "rb") as handle:
                            found[path] = handle.read(_MAX_SHARED_BYTES + 1 - size)
                        size += len(found[path])
                    if len(found) > _MAX_SHARED_FILES or size > _MAX_SHARED_BYTES:
                        raise _NotPlain(f"the working directory holds more than {_MAX_SHARED_FILES} files "
                                        f"or {_MAX_SHARED_BYTES >> 20} MiB")  # fmt: skip
        stable = not seen and now - max(stamps) > _STABLE_NS
        self.empty = stamps if stable else None
        return found

    def changes(self):
        """[[path, hex contents or None (removed)], ...] since the last look."""
        if self.empty is not None and not self.known and self.unchanged():
            return []
        now = self.scan()
        changed = [[path, data.hex()] for path, data in now.items() if self.known.get(path) != data]
        changed += [[path, None] for path in self.known if path not in now]
        self.known = now
        return changed

    def apply(self, changes):
        """Write the other side's changes here (paths checked: relative, no `..`, no empty part)."""
        if type(changes) is not list or len(changes) > _MAX_SHARED_FILES:
            raise _BadWire("malformed files")
        for change in changes:
            if not (type(change) is list and len(change) == 2 and type(change[0]) is str):
                raise _BadWire("malformed file")
            path, data = change
            parts = path.split("/")
            if any(p in ("", ".", "..") or "\0" in p for p in parts):
                raise _BadWire("a file path outside the working directory")
            if data is None:
                if os.path.isfile(path) and not os.path.islink(path):
                    os.remove(path)
                continue
            if type(data) is not str or len(data) > 2 * _MAX_SHARED_BYTES:
                raise _BadWire("malformed file")
            if len(parts) > 1:
                os.makedirs("/".join(parts[:-1]), exist_ok=True)
            with open(path, "wb") as handle:
                handle.write(bytes.fromhex(data))
        self.known = self.scan()


def _warning_data(record):
    """[name of the nearest builtin Warning class, message, filename, lineno] of a recorded warning."""
    import builtins

    kind = record.category
    base = next((c.__name__ for c in kind.__mro__ if getattr(builtins, c.__name__, None) is c), "Warning")
    filename = record.filename if type(record.filename) is str else "<unknown>"
    lineno = record.lineno if type(record.lineno) is int else 0
    return [base, _message(record.message)[:_MAX_WARNING_TEXT], filename[:1000], lineno]


class _ProgramContext:
    """The solution's side: sets up a call as the tests left their process (stdin, files, random,
    recursion limit), captures its prints and warnings, and reports what it changed."""

    def __init__(self):
        import warnings  # before the program runs: a program that patches `exec` breaks later imports

        self.module_warnings = warnings
        self.files = _Files()
        self.random_state = None
        self.printed = None

    def enter(self, context):
        """Apply the tests' side before a call; _BadWire if the context is malformed."""
        if type(context) is not dict:
            raise _BadWire("malformed call context")
        if "files" in context:
            self.files.apply(context["files"])
        if "random" in context:
            _set_random_state(_random_state(context["random"]))
        random = sys.modules.get("random")
        self.random_state = random.getstate() if random is not None else None
        if "limit" in context:
            limit, depth = context["limit"] if type(context["limit"]) is list else (None, None)
            if not (type(limit) is int and type(depth) is int and 0 <= depth < limit <= 1 << 30):
                raise _BadWire("malformed recursion limit")
            try:
                sys.setrecursionlimit(max(limit - depth + _frame_depth(), 1))
            except RecursionError:  # lower than this harness's own depth: the call will fail as it would
                pass
        text = context.get("stdin")
        if text is not None and type(text) is not str:
            raise _BadWire("malformed stdin")
        self.stdin = sys.stdin
        self.fed = io.StringIO(text) if text is not None else None
        if self.fed is not None:
            sys.stdin = self.fed
        self.stdout = sys.stdout
        if self.printed is None or self.printed.closed or self.printed.buffer.closed:
            self.printed = io.TextIOWrapper(io.BytesIO(), "utf-8", "surrogateescape", write_through=True)
        sys.stdout = self.printed  # one stream for every call, emptied after each (creating one costs more)
        self.catcher = self.module_warnings.catch_warnings(record=True)
        self.recorded = self.catcher.__enter__()
        self.module_warnings.simplefilter("always")  # the tests' filters decide what becomes of each

    def leave(self):
        """Undo the call's setup and return (report, failure): what the tests' side applies, or why
        the call fails (output or files past their limits)."""
        self.catcher.__exit__(None, None, None)
        sys.stdout, printed = self.stdout, self.printed
        if self.fed is not None:
            sys.stdin = self.stdin
        report = {}
        try:
            printed.flush()
            output = printed.buffer.getvalue()
            if output:
                printed.buffer.seek(0)
                printed.buffer.truncate()
            if len(output) > _MAX_CALL_OUTPUT:
                return None, f"the call printed more than {_MAX_CALL_OUTPUT >> 20} MiB"
            if output:
                report["stdout"] = output.decode("utf-8", "surrogateescape")
            if self.fed is not None:
                report["stdin"] = self.fed.tell()
            if self.recorded:
                if len(self.recorded) > _MAX_WARNINGS:
                    return None, f"the call raised more than {_MAX_WARNINGS} warnings"
                report["warnings"] = [_warning_data(record) for record in self.recorded]
            random = sys.modules.get("random")
            if random is not None and random.getstate() != self.random_state:
                report["random"] = _random_state_data(random.getstate())
            files = self.files.changes()
            if files:
                report["files"] = files
        except Exception as e:  # a stream the program broke, unreadable files, too many of them
            return None, f"what the call left behind cannot be shared: {_message(e)}"
        return report, None


class _TestsContext:
    """The tests' side: what the tests changed since the last call (stdin they fed, files they wrote,
    the random state, the recursion limit), and the program's prints, stdin reads, files, random state
    and warnings applied here after it."""

    def __init__(self, tests):
        self.files = _Files()
        self.limit = sys.getrecursionlimit()
        self.random_state = None
        if "random" in tests:  # tests that seed `random` name it: their state is compared with this one
            import random

            self.random_state = random.getstate()
        self.stdin = None
        self.registry = {}

    def outgoing(self):
        """The context of one call: only what the tests changed."""
        context = {}
        self.stdin = None
        stdin = sys.stdin
        if stdin is not sys.__stdin__ and stdin is not None:
            try:
                position = stdin.tell()
                text = stdin.read()
                stdin.seek(position)
            except Exception:  # not readable, or not seekable: the program reads nothing
                text = None
            if type(text) is str:
                context["stdin"], self.stdin = text, (stdin, position, len(text))
        limit = sys.getrecursionlimit()
        if limit != self.limit:
            context["limit"], self.limit = [limit, _frame_depth()], limit
        random = sys.modules.get("random")
        if random is not None:
            state = random.getstate()
            if self.random_state is None:  # loaded after the start without being named: not the tests' seed
                self.random_state = state
            elif state != self.random_state:
                context["random"], self.random_state = _random_state_data(state), state
        files = self.files.changes()
        if files:
            context["files"] = files
        return context

    def incoming(self, report):
        """Apply the program's side of a call (_BadWire if malformed). Warnings come last: under an
        "error" filter one raises here, where the call was."""
        if type(report) is not dict:
            raise _BadWire("malformed call report")
        output = report.get("stdout")
        if output is not None and (type(output) is not str or len(output) > _MAX_CALL_OUTPUT):
            raise _BadWire("malformed output")
        consumed = report.get("stdin")
        if consumed is not None and not (self.stdin and type(consumed) is int and 0 <= consumed <= self.stdin[2]):
            raise _BadWire("malformed stdin report")
        state = _random_state(report["random"]) if "random" in report else None
        warned = [_warning(item) for item in _items(report.get("warnings", []), _MAX_WARNINGS)]
        if "files" in report:
            self.files.apply(report["files"])
        if consumed:
            stdin, position, _ = self.stdin
            stdin.seek(position)
            stdin.read(consumed)
        if state is not None:
            _set_random_state(state)
            self.random_state = state
        if output:
            sys.stdout.write(output)
        if warned:
            import warnings

            for category, message, filename, lineno in warned:
                # the program's own lines, and the harness's frame a `stacklevel` past the program points
                # at (in one interpreter: the tests' calling code), are __main__'s, whose DeprecationWarning
                # the default filters show; a library's location keeps its own module name
                module = "__main__" if filename in ("<solution>", "<string>") else None
                warnings.warn_explicit(message, category, filename, lineno, module, self.registry)


def _items(value, limit):
    if type(value) is not list or len(value) > limit:
        raise _BadWire("malformed list")
    return value


def _warning(item):
    """(category, message, filename, lineno) of a warning the program raised: a builtin category."""
    import builtins

    if not (type(item) is list and len(item) == 4 and all(type(x) is str for x in item[:3])):
        raise _BadWire("malformed warning")
    name, message, filename, lineno = item
    category = getattr(builtins, name, None) if name.isidentifier() and not name.startswith("_") else None
    if not (isinstance(category, type) and issubclass(category, Warning) and type(lineno) is int):
        raise _BadWire("a warning of no builtin category")
    return category, message, filename, lineno


def _solution_module(bound):
    """A module named `solution` whose attributes are the program's names as the tests see them, so
    that tests written for a file `solution.py` (`from solution import f`, `import solution`) work."""
    module = type(sys)("solution")
    module.__dict__.update(bound)
    return module


def _wants_descriptions(tests):
    """Whether the tests may read a function's signature or docstring (they name inspect or them)."""
    return any(word in tests for word in _SIGNATURE_WORDS)


def _describe(function):
    """[parameters, return annotation, doc] of one of the program's callables, as plain data: each
    parameter [name, kind, default, annotation], where a default or annotation is ["v", value] (plain
    data), ["r", its repr] or None (none); None if it has no signature."""
    import inspect  # here: only tests that name inspect or a signature ask

    try:
        signature = inspect.signature(function)
    except (TypeError, ValueError):
        return None
    parameters = [
        [p.name, int(p.kind), _described(p.default, inspect), _described(p.annotation, inspect)]
        for p in signature.parameters.values()
    ]
    doc = function.__doc__ if type(function.__doc__) is str else None
    return [parameters, _described(signature.return_annotation, inspect), doc]


def _described(value, inspect):
    if value is inspect.Parameter.empty:
        return None
    try:
        return ["v", _Encoder().encode(value)]
    except Exception:
        return ["r", _message(inspect.formatannotation(value))]


class _Shown:
    """A default value or annotation that is not plain data, shown as the program's repr of it."""

    def __init__(self, text):
        self.text = text

    def __repr__(self):
        return self.text


def _signature(description):
    """The inspect.Signature rebuilt from `_describe`'s data (_BadWire or ValueError if malformed)."""
    import inspect

    if not (type(description) is list and len(description) == 3 and type(description[0]) is list):
        raise _BadWire("malformed description")
    parameters, returns, _ = description
    empty = inspect.Parameter.empty
    built = []
    for item in parameters:
        if not (type(item) is list and len(item) == 4 and type(item[0]) is str and type(item[1]) is int):
            raise _BadWire("malformed parameter")
        name, kind, default, annotation = item
        kind = inspect.Parameter.POSITIONAL_ONLY.__class__(kind)
        default, annotation = _shown(default, empty), _shown(annotation, empty)
        built.append(inspect.Parameter(name, kind, default=default, annotation=annotation))
    return inspect.Signature(built, return_annotation=_shown(returns, empty))


def _shown(data, empty):
    if data is None:
        return empty
    if type(data) is list and len(data) == 2 and data[0] == "v":
        return _Decoder().decode(data[1])
    if type(data) is list and len(data) == 2 and data[0] == "r" and type(data[1]) is str:
        return _Shown(data[1])
    raise _BadWire("malformed default or annotation")
