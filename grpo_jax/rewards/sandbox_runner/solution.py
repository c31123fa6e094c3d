"""The solution's process: the `script` role (the program as `__main__`, its output compared by the
parent) and the `serve` role (the program's definitions, then calls to them answered with plain data).
"""

import builtins
import os
import sys

from .context import _describe, _ProgramContext
from .wire import (
    _MAX_BATCH,
    _MAX_ITERATORS,
    _MAX_OBJECTS,
    _MUTABLE,
    _BadWire,
    _Decoder,
    _Encoder,
    _Held,
    _NotPlain,
    _Shared,
    _error_info,
    _message,
    _read_message,
    _released,
    _snapshot,
    _unchanged,
    _write_message,
)
from .wire import _MAX_EXPORTS

_MAIN_BLOCK_ENDED = "__sandbox_main_block_ended__"


def _main_module(argv0):
    """The namespace of a fresh module registered as `__main__`, with `sys.argv` and `__file__` as
    `python <argv0>` gives them (the run's working directory joined with argv0), so `unittest.main()`,
    pickle, `sys.modules[__name__]` and `os.path.dirname(__file__)` see the code's own names and place
    (and not this harness, nor the harness's fds as command-line arguments)."""
    module = type(sys)("__main__")
    module.__dict__["__builtins__"] = builtins
    module.__dict__["__file__"] = os.path.join(os.getcwd(), argv0)
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


class _Arguments:
    """The containers a call received, numbered as in its request, and what they held when last sent,
    so that those the call changed in place (items compared by identity: a reordering, a replaced or
    an added item counts) go back to the tests' process and into the caller's own objects."""

    def __init__(self, objects, tags, nans=()):
        self.objects, self.tags, self.nans = objects, tags, nans
        self.before = [_snapshot(value, tag) for value, tag in zip(objects, tags)]

    def states(self, encoder):
        """[[number, [tag, new contents]], ...] for the containers changed since the last look."""
        states = []
        for number, (value, tag) in enumerate(zip(self.objects, self.tags)):
            before = self.before[number]
            if before is None:
                continue
            now = _snapshot(value, tag)
            if not _unchanged(now, before):
                states.append([number, [tag, encoder.body(value, tag, 1)]])
                self.before[number] = now
        return states


def _serve(program, requests_fd, replies_fd):
    """Run the solution, report its names (functions and classes as callables, modules by their own
    name), then answer calls and iterator requests until the tests' process closes the channel."""
    namespace = _main_module("solution.py")
    namespace[_MAIN_BLOCK_ENDED] = _main_block_ended
    context = _ProgramContext()  # before the program runs: files it writes at its top level are shared
    exec(_compile_solution(program), namespace)
    namespace.pop(_MAIN_BLOCK_ENDED, None)
    _write_message(replies_fd, ["ready", _exports(namespace)])
    iterators = []  # (iterator, the _Arguments of the call that returned it), by handle
    shared = _Shared()
    kept = _Kept()
    while True:
        try:
            request = _read_message(requests_fd)
        except EOFError:
            return
        kind = request[0] if type(request) is list and request else None
        if kind == "call" and len(request) == 6:
            reply = _answer_in_context(context, namespace, request, iterators, shared, kept)
        elif kind == "describe" and len(request) == 2:
            reply = _descriptions(namespace, request[1])
        elif kind == "next" and len(request) == 3:
            reply = _next_items(request, iterators, shared, kept)
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


def _call_object(function, *args, **kwargs):
    """Call one of the program's objects the tests hold as a proxy (a bound method read from an
    instance: `stack.push(3)`)."""
    return function(*args, **kwargs)


# What the tests may do with an object that stays here, asked for as a call by these names (not
# identifiers: no name of the program's can take their place): read or set an attribute, call it.
_FORWARDED = {".getattr": getattr, ".setattr": setattr, ".call": _call_object}
_MethodType = type(_Held().keeps)
_FunctionType = type(_call_object)


class _Kept(_Held):
    """The solution's side of `_Held`: instances of the program's own classes (their class defined by the
    program, as `__main__`), the program's functions, and methods bound to either, kept for the run in
    the order they were first sent, so that the tests' proxy for one comes back as the very object
    (identity and the program's changes to it kept). A method is kept once per instance and function
    (`s.push` read twice is one handle: reading methods in a loop does not fill the table)."""

    def __init__(self):
        self.objects, self.ids = [], {}

    def keeps(self, value):
        owner = value.__self__ if type(value) is _MethodType else value
        try:
            module = owner.__module__ if type(owner) is _FunctionType else type(owner).__module__
        except Exception:  # a metaclass that refuses: not the program's plain class
            return False
        return type(module) is str and module == "__main__"

    def send(self, value):
        key = (id(value.__self__), id(value.__func__)) if type(value) is _MethodType else id(value)
        handle = self.ids.get(key)
        if handle is None:
            if len(self.objects) >= _MAX_OBJECTS:
                raise _NotPlain(f"more than {_MAX_OBJECTS} of the program's objects sent to the tests")
            handle = self.ids[key] = len(self.objects)
            self.objects.append(value)
        return [handle, str.__str__(type(value).__name__)[:100]]

    def receive(self, payload):
        if type(payload) is int and 0 <= payload < len(self.objects):
            return self.objects[payload]
        raise _BadWire("a handle to no object of the program's")


def _answer(namespace, request, iterators, shared, kept=None):
    """The reply to ["call", name, args, kwargs, [forget, shared states]]: ["ok", value, states, share]
    | ["raise", error, states, share] | ["bad", reason]; `states` holds the new contents of the
    argument containers the call changed, `share` what `_share` says of the shared containers. The
    tests' changes to shared containers are written into them before the call."""
    try:
        _, name, args, kwargs, (forget, incoming) = request
        function = _FORWARDED[name] if name in _FORWARDED else namespace[name]
        decoder = _Decoder(shared=shared, held=kept)
        changes = shared.decode_states(decoder, incoming)  # encoded before the arguments
        args = [decoder.decode(a) for a in args]
        kwargs = {str(k): decoder.decode(v) for k, v in kwargs}
    except Exception as e:
        return ["bad", f"malformed call ({type(e).__name__})"]
    shared.write(changes)
    del changes
    for handle in forget:  # after the states: the tests' side sends a state, then forgets
        if type(handle) is int and handle in shared.objects:
            shared.remove(handle)
    arguments = _Arguments(decoder.objects, decoder.tags, decoder.nans)
    handed = len(iterators)
    encoder = _Encoder(
        arguments.objects, lambda iterator: _hand_over(iterators, iterator, arguments), decoder.nans, shared, kept
    )  # fmt: skip
    result = None
    try:
        result = function(*args, **kwargs)
    except BaseException as e:  # SystemExit too: the tests' process reports it as a failed call
        head = ["raise", _error_info(e)]
    else:
        try:
            head = ["ok", encoder.encode(result)]
        except Exception as e:  # _NotPlain, or a container whose iteration fails
            return ["bad", f"the result of {name}() is not plain data: {_message(e)}"]
    del result, args, kwargs
    try:
        head += [arguments.states(encoder)]
        outgoing = shared.states(encoder)
    except Exception as e:
        where = f"an argument of {name}() or a container it shares"
        return ["bad", f"{where} holds data that is not plain after the call: {_message(e)}"]
    mine = [(n, t) for n, t in enumerate(encoder.tags) if t in _MUTABLE]
    theirs = []  # the arguments, unless an iterator the call returned still reads them
    if len(iterators) == handed:
        theirs = [(n, t) for n, t in enumerate(arguments.tags) if t in _MUTABLE]
    values = [encoder.objects[n] for n, _ in mine] + [arguments.objects[n] for n, _ in theirs]
    del encoder, decoder, arguments
    return head + [[outgoing, *_share(shared, mine, theirs, values)]]


def _share(shared, mine, theirs, values):
    """[register, kept, dropped] after a call. `values` are the reply's mutable containers (numbered
    in the reply as in `mine`, [(number, tag)]) and the call's argument containers (numbered in the
    request as in `theirs`), and the caller holds no other reference to them: those the program still
    holds get new handles ([[number, handle], ...] for each kind), and the shared containers it no
    longer holds are dropped ([handle, ...])."""
    if not values and not shared.objects:
        return [[], [], []]
    handles, tags, held = shared.detach() if shared.due() else ([], [], [])
    values[:0] = held
    del held
    _released(values)
    dropped = [handle for handle, value in zip(handles, values) if value is None]
    for handle, tag, value in zip(handles, tags, values):
        if value is not None:
            shared.add(handle, value, tag)
    if handles:
        shared.pruned = len(shared.objects)
    new = [[], []]
    for which, (number, tag), value in zip([0] * len(mine) + [1] * len(theirs), mine + theirs, values[len(handles) :]):
        if value is not None and shared.room(value, tag):
            shared.add(shared.next, value, tag)
            new[which].append([number, shared.next])
            shared.next += 1
    return [*new, dropped]


def _answer_in_context(context, namespace, request, iterators, shared, kept=None):
    """`_answer` to ["call", name, args, kwargs, share, context], run as the tests' process left its state
    (stdin, files, random, recursion limit: `context`), with what the call printed, read, wrote, drew
    and warned reported after the reply's states."""
    try:
        context.enter(request[5])
    except Exception as e:  # _BadWire, _NotPlain (too many files), an unwritable file
        return ["bad", f"the call's context cannot be set up: {_message(e)}"]
    try:
        reply = _answer(namespace, request[:5], iterators, shared, kept)
    finally:
        report, failure = context.leave()
    if failure is not None:
        return ["bad", failure]
    if type(reply) is list and reply and reply[0] in ("ok", "raise"):
        return [*reply, report]
    return reply


def _descriptions(namespace, names):
    """["described", {name: description}] for the program's callables `names` (see `_describe`)."""
    if type(names) is not list:
        return ["bad", "malformed request for descriptions"]
    found = {}
    for name in names[:_MAX_EXPORTS]:
        function = namespace.get(name) if type(name) is str else None
        if callable(function):
            try:
                found[name] = _describe(function)
            except Exception:  # a signature or default whose repr fails: no description
                pass
    return ["described", found]


def _hand_over(iterators, iterator, arguments):
    """Keep an iterator a call returned; its handle lets the tests' process ask for its items."""
    if len(iterators) >= _MAX_ITERATORS:
        raise _NotPlain(f"more than {_MAX_ITERATORS} iterators handed over")
    iterators.append((iterator, arguments))
    return len(iterators) - 1


def _next_items(request, iterators, shared, kept=None):
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
    encoder = _Encoder(
        arguments.objects, lambda more: _hand_over(iterators, more, arguments), arguments.nans, shared, kept
    )  # fmt: skip
    try:
        return ["items", [encoder.encode(item) for item in items], end, arguments.states(encoder)]
    except Exception as e:
        return ["bad", f"an item of an iterator is not plain data: {_message(e)}"]
