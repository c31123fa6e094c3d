"""The tests' process: a fresh interpreter that never loads the solution. It runs the tests against
stubs that call the solution's process over the pipes, and alone holds the nonce and the marker fd,
which it writes to only when the tests and `check(entry_point)` returned normally, no call failed and
at least one was made.
"""

import builtins
import os
import sys
import threading
import weakref

from .context import _signature, _solution_module, _TestsContext, _wants_descriptions
from .job import CALL_FAILED_LINE, PEER_GONE
from .solution import _main_module
from .wire import (
    _DECODE_ERRORS,
    _MAX_BATCH,
    _MAX_EXPORTS,
    _MAX_OBJECTS,
    _MAX_SHARED,
    _MUTABLE,
    _BadWire,
    _NotPlain,
    _Decoder,
    _Encoder,
    _Held,
    _Shared,
    _message,
    _read_message,
    _released,
    _write_back,
    _write_message,
)


class _CallFailed(BaseException):
    """A call to the solution that failed as no function's call can pass: a result that is not plain
    data, a broken protocol, or an exception that must not act as control flow in the tests' process
    (SystemExit, KeyboardInterrupt, GeneratorExit, other BaseExceptions, StopIteration). A
    BaseException, so `except Exception` in the tests does not catch it; recorded either way."""


class _PeerGone(_CallFailed):
    """The solution's process ended (or closed the channel) before answering."""


_CONTROL_FLOW = (StopIteration, StopAsyncIteration)  # end an iteration when raised by a callback (map, iter)
_STAND_INS = {}
_MESSAGES = weakref.WeakKeyDictionary()  # stand-in exception -> its str() in the solution's process


def _sent_message(error):
    """str() of a stand-in exception: the solution's own str() of it, where that differed from what its
    arguments give (a custom __str__)."""
    message = _MESSAGES.get(error)
    return message if message is not None else type(error).__mro__[1].__str__(error)


def _restore_attributes(error, attributes):
    """Set the plain-data attributes the solution's exception carried (`e.code`); dunders, malformed
    entries and attributes the class refuses (a read-only property) are skipped."""
    if type(attributes) is not list:
        raise _BadWire("malformed exception attributes")
    for item in attributes[:100]:
        if not (type(item) is list and len(item) == 2 and type(item[0]) is str):
            raise _BadWire("malformed exception attribute")
        name, value = item
        if name.isidentifier() and not name.startswith("__"):
            value = _Decoder().decode(value)
            try:
                setattr(error, name, value)
            except Exception:
                pass


_MAX_EXCEPTION_BASES = 8  # builtin classes one exception class of the solution's may combine


def _stand_in(type_name, kinds):
    """A subclass of the builtin exceptions `kinds` named like the solution's own exception class, so
    that `except ValueError` catches the solution's `class BadInput(ValueError)` (and `except TypeError`
    its `class E(ValueError, TypeError)`) as it would in one interpreter (and `except BadInput` cannot:
    the tests cannot name it)."""
    key = (type_name, kinds)
    if key not in _STAND_INS:
        try:
            _STAND_INS[key] = type(type_name, kinds, {"__module__": "solution", "__str__": _sent_message})
        except TypeError:  # not a valid class name, or bases that cannot be combined
            _STAND_INS[key] = kinds[0]
    return _STAND_INS[key]


def _instantiate(kind, args, message):
    """The exception of class `kind` from its arguments (else its message), or None where neither builds
    one (an `ExceptionGroup`, whose sub-exceptions are not plain data)."""
    try:
        return kind(*args) if args is not None else kind(message)
    except Exception:  # a constructor that wants other arguments: skip its __init__
        try:
            return kind.__new__(kind, message)
        except Exception:
            return None


class _Channel:
    """The tests' end of the pipes to the solution's process. Every harness-level failure is kept, so a
    test that catches it still fails the case."""

    def __init__(self, replies_fd, requests_fd):
        self.replies_fd, self.requests_fd = replies_fd, requests_fd
        self.failures = []
        self.calls = 0
        self.context = None  # a _TestsContext once the tests' process is set up
        self.shared = _Shared()
        self.proxies = _Proxies(self)
        self.lock = threading.RLock()  # tests may call from several threads: one round trip at a time

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
        containers it changed are changed here too, in place. Before it, the new contents of the shared
        containers the tests changed go to the solution's process (see _Shared), and with them what the tests
        changed of the state one interpreter would share with the call (context.py); after it, what the call
        printed, read, wrote, drew and warned is applied here."""
        with self.lock:
            unplain = []  # shared containers the tests gave data that is not plain: no longer shared
            encoder = _Encoder(shared=self.shared, held=self.proxies)
            try:
                changes = self.shared.states(encoder, unplain)  # first: the solution decodes them first
                encoded = [encoder.encode(a) for a in args], [[k, encoder.encode(v)] for k, v in kwargs.items()]
            except Exception as e:  # _NotPlain, or a container whose iteration fails
                raise self.fail(_CallFailed(f"an argument to {name}() is not plain data: {_message(e)}")) from None
            self.calls += 1
            self.send(["call", name, *encoded, [unplain + self.forget(), changes], self.outgoing(name)])
            caller = (encoder.objects, encoder.tags, encoder.nans)
            reply = self.receive()
            kind = reply[0] if type(reply) is list and reply else None
            if kind == "ok" and len(reply) == 5:
                value = self.settle(name, caller, reply[2], lambda decoder: decoder.decode(reply[1]), reply[3])
                self.incoming(name, reply[4])
                return value
            if kind == "raise" and len(reply) == 5:
                error = self.settle(name, caller, reply[2], lambda decoder: self.error(name, reply[1]), reply[3])
                self.incoming(name, reply[4])
                raise error
            raise self.fail(_CallFailed(_bad_reason(reply)))

    def forget(self):
        """[handle, ...] of the shared containers the tests no longer hold, taken out of the table."""
        if not self.shared.due():
            return []
        handles, tags, values = self.shared.detach()
        _released(values)
        for handle, tag, value in zip(handles, tags, values):
            if value is not None:
                self.shared.add(handle, value, tag)
        self.shared.pruned = len(self.shared.objects)
        return [handle for handle, value in zip(handles, values) if value is None]

    def outgoing(self, name):
        """What the tests changed of the state one interpreter would share with the call (context.py)."""
        try:
            return self.context.outgoing() if self.context is not None else {}
        except Exception as e:  # too many or too large files, an unreadable one
            raise self.fail(_CallFailed(f"the tests' state cannot be shared with {name}(): {_message(e)}")) from None

    def incoming(self, name, report):
        """Apply what the call printed, read, wrote, drew and warned (a warning may raise here, under
        an "error" filter, as it would have inside the call)."""
        try:
            self.context.incoming(report)
        except (*_DECODE_ERRORS, _NotPlain, OSError) as e:
            raise self.fail(_CallFailed(f"the solution's process broke the protocol: {_message(e)}")) from None

    def describe(self, names):
        """{name: description} of the program's callables (see context._describe)."""
        self.send(["describe", names])
        reply = self.receive()
        if not (type(reply) is list and len(reply) == 2 and reply[0] == "described" and type(reply[1]) is dict):
            raise self.fail(_CallFailed(_bad_reason(reply)))
        return reply[1]

    def next_items(self, name, handle, count, caller):
        """([items], end) of an iterator `name()` returned: end is None (more may follow), "done", or
        the exception to raise after the items."""
        with self.lock:
            return self.next_items_now(name, handle, count, caller)

    def next_items_now(self, name, handle, count, caller):
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

    def settle(self, name, caller, states, head, share=None):
        """Decode a reply's value (`head(decoder)`), its states and (after a call) what it says of the
        shared containers with one decoder, write the states into the caller's containers and the
        shared ones, and return the value."""
        objects, tags, nans = caller
        remote = lambda handle: _remote_items(self, name, handle, caller)  # noqa: E731
        decoder = _Decoder(objects, remote, nans, self.shared, self.proxies)
        try:
            value = head(decoder)
            changes = _decode_states(decoder, states, tags)
            shared_changes = [] if share is None else self.decode_share(decoder, share, caller)
        except _DECODE_ERRORS as e:
            raise self.fail(_CallFailed(f"the solution's process broke the protocol: {e}")) from None
        for number, new in changes:
            _write_back(objects[number], tags[number], new)
        if share is not None:
            self.reshare(decoder, share, caller, shared_changes)
        return value

    def decode_share(self, decoder, share, caller):
        """The decoded changes to shared containers of a reply's `share`, [changes, register, kept,
        dropped], after checking that each new handle names a mutable container of the reply (register)
        or of the request (kept), once, and is new, and each dropped one is shared."""
        if share == [[], [], [], []]:  # the common case: nothing shared
            return []
        if not (type(share) is list and len(share) == 4 and all(type(part) is list for part in share)):
            raise _BadWire("malformed share")
        changes = self.shared.decode_states(decoder, share[0])
        seen, handles = set(), set()
        for part, (objects, tags) in zip(share[1:3], ((decoder.objects, decoder.tags), caller[:2])):
            for item in part:
                if not (type(item) is list and len(item) == 2 and all(type(n) is int for n in item)):
                    raise _BadWire("malformed new handle")
                number, handle = item
                if not 0 <= number < len(objects) or tags[number] not in _MUTABLE or id(objects[number]) in seen:
                    raise _BadWire("a handle for no container")
                if handle < self.shared.next or handle in handles:
                    raise _BadWire("a handle that is not new")
                seen.add(id(objects[number]))
                handles.add(handle)
        if not all(type(handle) is int and handle in self.shared.objects for handle in share[3]):
            raise _BadWire("a dropped handle that is not shared")
        if len(self.shared.objects) - len(set(share[3])) + len(handles) > _MAX_SHARED:
            raise _BadWire("too many shared containers")
        return changes

    def reshare(self, decoder, share, caller, changes):
        """Apply a checked `share`: write the changes, drop, then add the new handles."""
        if share == [[], [], [], []]:
            return
        self.shared.write(changes)
        for handle in share[3]:
            if handle in self.shared.objects:
                self.shared.remove(handle)
        for part, (objects, tags) in zip(share[1:3], ((decoder.objects, decoder.tags), caller[:2])):
            for number, handle in part:
                self.shared.add(handle, objects[number], tags[number])
                self.shared.next = max(self.shared.next, handle + 1)

    def error(self, name, info):
        """The exception the tests see for one the solution raised: the builtin exception itself, or a
        stand-in subclass of the nearest builtin class for the solution's own classes. Exceptions that
        would act as control flow here (StopIteration swallowed by map() or all()) and BaseExceptions
        (SystemExit, KeyboardInterrupt, GeneratorExit, the solution's own) are recorded failures."""
        if not (type(info) is list and len(info) == 5 and all(type(x) is str for x in info[:3])):
            raise _BadWire("malformed exception")
        type_name, base_name, message, args, attributes = info
        args = None if args is None else _Decoder().decode(args)
        names = base_name.split(",")[:_MAX_EXCEPTION_BASES + 1]
        kinds = tuple(getattr(builtins, n, None) if n.isidentifier() else None for n in names)
        if len(kinds) > _MAX_EXCEPTION_BASES or len(set(kinds)) < len(kinds):
            raise _BadWire("an exception with too many or repeated builtin classes")
        if not all(isinstance(kind, type) and issubclass(kind, BaseException) for kind in kinds):
            raise _BadWire("an exception whose builtin class is unknown")
        if any(not issubclass(kind, Exception) or issubclass(kind, _CONTROL_FLOW) for kind in kinds):
            return self.fail(_CallFailed(f"{name}() raised {type_name}: {message[:200]}"))
        kind = kinds[0]
        if type_name != base_name and type_name.isidentifier():
            kind = _stand_in(type_name, kinds)
        error = _instantiate(kind, args if type(args) is tuple else None, message)
        if error is None:
            return self.fail(_CallFailed(f"{name}() raised {type_name}, which cannot be rebuilt here: {message[:200]}"))
        _restore_attributes(error, attributes)
        if type(error).__str__ is _sent_message and _message(error) != message:
            _MESSAGES[error] = message  # the solution's class had its own __str__
        return error


def _refuse(proxy, what):
    """Fail closed: record and raise a harness failure for a use of a proxy that would let the program's
    object (which stays in its process) decide something the tests judge by."""
    name = object.__getattribute__(proxy, "_name")
    channel = object.__getattribute__(proxy, "_proxies").channel
    raise channel.fail(
        _CallFailed(f"the tests used {what} on a {name!r} object of the program's, which is not plain data: "
                    "it stays in the program's process, where it may only be passed back, have its attributes read or "
                    "set, or be called")
    )  # fmt: skip


def _refusing(what):
    def refused(self, *args, **kwargs):
        _refuse(self, what)

    refused.__name__ = what
    return refused


def _forwarded_name(proxy, name):
    """Whether an attribute of the program's object is read or set in its process: a public or private
    name, never a dunder (those are the protocols by which the tests' own code would ask the object
    to judge itself: `__class__`, `__eq__`, `__array__`, `__dict__`)."""
    if type(name) is str and name.isidentifier() and not (name.startswith("__") and name.endswith("__")):
        return True
    _refuse(proxy, f"the attribute {str(name)[:60]!r}")


class _Remote:
    """The tests' opaque stand-in for an object that stays in the solution's process (see `_Held`): it
    goes back as that object when passed to the program (also inside containers), reads and sets the
    object's attributes and calls it there (`node.val`, `stack.push(3)`: what crosses back is plain
    data or another proxy, decoded as a call's result is), and refuses everything else: comparisons,
    hashing, truth, str/repr/format, conversions, arithmetic, iteration, `len`, indexing, `isinstance`
    against any other type (`__class__` is refused), copying. The program controls the object, so
    none of these may act as its answer; each records a failure (the case scores 0)."""

    __slots__ = ("_handle", "_name", "_proxies")

    def __getattribute__(self, name):
        if _forwarded_name(self, name):
            channel = object.__getattribute__(self, "_proxies").channel
            return channel.call(".getattr", (self, name), {})

    def __setattr__(self, name, value):
        if _forwarded_name(self, name):
            channel = object.__getattribute__(self, "_proxies").channel
            channel.call(".setattr", (self, name, value), {})

    def __call__(self, *args, **kwargs):
        return object.__getattribute__(self, "_proxies").channel.call(".call", (self, *args), kwargs)


_REFUSED = (
    "eq ne lt le gt ge hash bool len length_hint iter reversed next contains getitem setitem delitem "
    "missing str repr bytes format int float complex index round trunc floor ceil neg pos abs invert "
    "add radd iadd sub rsub isub mul rmul imul matmul rmatmul imatmul truediv rtruediv itruediv "
    "floordiv rfloordiv ifloordiv mod rmod imod divmod rdivmod pow rpow ipow lshift rlshift ilshift "
    "rshift rrshift irshift and rand iand xor rxor ixor or ror ior enter exit aenter aexit await aiter "
    "anext delattr dir reduce reduce_ex getstate setstate copy deepcopy fspath sizeof get set delete "
    "set_name init buffer release_buffer"
).split()


def _refuse_methods(kind, names):
    """Give `kind` a refusing `__name__` method for each name (set on the class: the interpreter looks
    special methods up on the type, past `__getattribute__`)."""
    for name in names:
        setattr(kind, f"__{name}__", _refusing(f"__{name}__"))


_refuse_methods(_Remote, _REFUSED)


class _Proxies(_Held):
    """The tests' side of `_Held`: one `_Remote` per handle the solution's process sent. A handle is
    either one already received (the same proxy: `f(p) is p` when the program returns the object it
    was given) or the next one, with its class's name; any other number is a forged handle."""

    kind = _Remote

    def __init__(self, channel):
        self.channel = channel
        self.proxies = []

    def send(self, proxy):
        handle = object.__getattribute__(proxy, "_handle")
        if object.__getattribute__(proxy, "_proxies") is not self or not 0 <= handle < len(self.proxies):
            raise _NotPlain("a proxy of no object of the program's")
        return handle

    def receive(self, payload):
        if not (type(payload) is list and len(payload) == 2 and type(payload[0]) is int):
            raise _BadWire("malformed object handle")
        handle, name = payload
        if not (type(name) is str and 0 < len(name) <= 100):
            raise _BadWire("malformed object handle")
        if 0 <= handle < len(self.proxies):
            proxy = self.proxies[handle]
            if object.__getattribute__(proxy, "_name") != name:
                raise _BadWire("an object handle with another class name")
            return proxy
        if handle != len(self.proxies) or handle >= _MAX_OBJECTS:
            raise _BadWire("an object handle never issued")
        proxy = object.__new__(_Remote)
        for slot, value in (("_handle", handle), ("_name", name), ("_proxies", self)):
            object.__setattr__(proxy, slot, value)
        self.proxies.append(proxy)
        return proxy


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
        channel.context = _TestsContext(tests)
        _describe_stubs(channel, bound, tests)
        sys.modules["solution"] = _solution_module(bound)
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


def _describe_stubs(channel, bound, tests):
    """Give the stubs the program's signatures and docstrings (`inspect.signature(candidate)`), when
    the tests may read them: they name inspect or a signature (the description costs an import of
    inspect on each side)."""
    stubs = {name: value for name, value in bound.items() if not isinstance(value, type(sys))}
    if not stubs or not _wants_descriptions(tests):
        return
    for name, description in channel.describe(sorted(stubs)).items():
        if name not in stubs or description is None:
            continue
        try:
            stubs[name].__signature__ = _signature(description)
        except _DECODE_ERRORS as e:
            raise channel.fail(_CallFailed(f"the solution's process broke the protocol: {e}")) from None
        doc = description[2]
        stubs[name].__doc__ = doc if type(doc) is str else None


def _run_trusted(code, scope):
    """Run test code; a SystemExit it raises itself with a success code (0, None, False) is a normal
    end. (A SystemExit raised by the solution never arrives as one: it is a _CallFailed.)"""
    try:
        exec(code, scope)
    except SystemExit as e:
        if e.code not in (0, None, False):
            raise


def _tests_main(job, replies_fd, requests_fd, marker_fd):
    """The tests' role, its harness-level failures reported as one line on stderr (exit 122 when the
    solution's process ended, else 1)."""
    try:
        nonce = job.pop("nonce")
        _run_tests(job["tests"], job["entry_point"], replies_fd, requests_fd, marker_fd, nonce, job["packages"])
    except _CallFailed as e:
        sys.stdout.flush()
        os.write(2, f"{CALL_FAILED_LINE}{e}\n".encode("utf-8", "replace"))
        os._exit(PEER_GONE if isinstance(e, _PeerGone) else 1)
