"""The plain data that crosses between the solution's process and the tests' process, and its framing.

A message is 4 bytes of big-endian length and then that much ASCII JSON (lone surrogates travel as
escapes); a frame over _MAX_FRAME_BYTES, or one that is not JSON, is `_BadWire`, and a closed channel is
EOFError. A value is `[tag, payload]`: scalars (None, bool, int, float, complex, str, bytes, Fraction,
Decimal, range, builtin types and functions by name; numpy scalars as themselves, `["Np", [dtype, scalar]]`) and the
builtin and `collections` containers of them (a long flat list of ints, floats or strs as `["Li" | "Lf" |
"Ls", items]`). Each container of a message is numbered depth first, and a later reference to it is
`["R", n]`, so aliasing survives; `["A", n]` names the n-th container of the call's own request (an
argument coming back), `["H", n]` a container both processes share across calls (`_Shared`), `["G", n]`
an iterator that stays in the solution's process, `["Ob", [n, class name]]` an instance of the program's
own classes that stays there too (`["Ob", n]` when the tests pass it back; see `_Held`); a NaN keeps
its identity as `["An", n]` (the request's n-th NaN) and `["Rn", n]` (the message's). A value nested
deeper than _MAX_DEPTH, or containing itself, is `_NotPlain` when encoded and `_BadWire` when decoded;
anything malformed decodes to one of _DECODE_ERRORS, never to a value of another type. A raised
exception travels as `_error_info`.

The requests and replies built from these values (call, next, ready, ok, raise, items, bad, describe,
described) are written and read in `solution.py` and `judge.py`; a call and its reply also carry the
state of `context.py`.
"""

import builtins
import collections  # already loaded by json (through re and functools): costs nothing here
import json
import math
import operator
import os
import sys

_MAX_DEPTH = 100  # nesting of a value; deeper (or self-containing) values are not plain data
_MAX_FRAME_BYTES = 256 << 20
_MAX_EXPORTS = 10_000
_MAX_ITERATORS = 100_000  # live iterators one solution's process may hand over
_MAX_OBJECTS = 10_000  # instances of the program's classes one solution's process may keep (see _Held)
_MAX_BATCH = 1024  # items of an iterator fetched per round trip (the batch doubles from 1)
_MAX_SHARED = 128  # containers both processes hold under one handle (see _Shared) ...
_MAX_SHARED_ITEMS = 10_000  # ... and their items, all told: each call compares them, both sides
_PRUNE_EVERY = 64  # calls between looks for shared containers no longer held (also when the table doubles)
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
_BASES = {tag: kind for kind, tag in _CONTAINERS}
# What a container subclass may define and still cross as its base type: its methods are those of the base.
_HARMLESS_NAMES = frozenset(
    ("__module__", "__qualname__", "__doc__", "__dict__", "__weakref__", "__slots__", "__init__", "__annotations__",
     "__orig_bases__", "__parameters__", "__firstlineno__", "__static_attributes__", "__classcell__")
)  # fmt: skip
# numpy scalar types that cross as themselves (by dtype name), holding the Python scalar of _scalar.
_NUMPY_SCALARS = frozenset(
    ("bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64", "float16", "float32",
     "float64", "complex64", "complex128")
)  # fmt: skip
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
            if tag in _MUTABLE and _own_methods(type(value), kind):
                raise _NotPlain(f"{type(value).__name__!r} is a {kind.__name__} subclass with its own methods")
            return tag
    return None


def _own_methods(kind, base):
    """Whether a subclass of a mutable container defines methods of its own (a read-only list, a dict
    that logs its writes): it would arrive as its base type, and changes written back through the base
    type would bypass them, so it is not plain data (the call fails). The harness's own ordered set is
    exempt; it only keeps an order."""
    if kind is _SetInOrder:
        return False
    for cls in kind.__mro__:
        if cls is base:
            return False
        if any(name not in _HARMLESS_NAMES for name in vars(cls)):
            return True
    return False


def _contents(value, tag):
    """A container's items (key-value pairs for mappings), read through its base type."""
    return list(_CONTENTS[tag](value))


_FLAT_MIN = 16  # shorter lists are not worth the check
_FLAT_TYPES = {"Li": int, "Lf": float, "Ls": str}  # a flat list's tag -> the one type of its items
_FLAT_TAGS = {kind: tag for tag, kind in _FLAT_TYPES.items()}


def _flat_list(value):
    """[tag, items] of a list whose items are all exact ints within 64 bits, all exact finite floats
    or all exact strs: its items as JSON numbers or strings, parsed and checked in C on both sides
    (the bulk path: a list of millions of numbers costs about what one interpreter's copy does);
    else None. The list is numbered as any other."""
    kinds = set(map(type, list.__iter__(value)))
    if len(kinds) != 1:
        return None
    (kind,) = kinds
    tag = _FLAT_TAGS.get(kind)
    if tag == "Li" and not -(1 << 63) <= min(value) <= max(value) < (1 << 63):
        return None
    if tag == "Lf" and not all(map(math.isfinite, value)):
        return None  # NaN keeps its identity (see nan); infinities are rare
    return None if tag is None else [tag, list(value)]


def _factory_name(factory):
    """A defaultdict's default factory by name, if it is a builtin type (else None: no default)."""
    return next((name for name, kind in _FACTORIES.items() if kind is factory), None)


class _Encoder:
    """Values as JSON-ready tagged data, [tag, payload]. Each container gets the next number of the
    message when first met (depth first, in order), and a later reference to it is sent as ["R", n], so
    aliasing survives the trip; a value that contains itself is not plain data. `known` holds the
    other side's objects (a call's containers, numbered as in its request): they are sent as ["A", n].
    `hand_over` (solution's replies only) keeps an iterator in this process and numbers it; `held` (a
    `_Held`) sends an object that stays in the solution's process by its handle."""

    def __init__(self, known=(), hand_over=None, known_nans=(), shared=None, held=None):
        self.known = {id(value): number for number, value in enumerate(known)} if known else {}
        self.numbers, self.objects, self.tags, self.open = {}, [], [], set()
        self.hand_over = hand_over
        self.known_nans = {id(value): number for number, value in enumerate(known_nans)}
        self.nans, self.nan_numbers = [], {}
        self.shared = shared.ids if shared is not None else {}
        self.held = held

    def encode(self, value, depth=0):
        kind = type(value)
        if kind is int:  # the commonest types first, without a call
            return ["I", format(value, "x")]
        if kind is str:
            return ["S", value]
        if depth > _MAX_DEPTH:
            raise _NotPlain(f"nested deeper than {_MAX_DEPTH} levels")
        if self.held is not None and kind is self.held.kind:  # before any isinstance: a proxy refuses them
            return ["Ob", self.held.send(value)]
        scalar = _scalar(value)
        if scalar is not None:
            return self.nan(value) if scalar[1] == "nan" and kind is float else scalar
        key = id(value)
        if key in self.known:
            return ["A", self.known[key]]
        if key in self.shared:
            return ["H", self.shared[key]]
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
        if tag == "L" and len(value) >= _FLAT_MIN:
            flat = _flat_list(value)
            if flat is not None:
                return flat
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

    def nan(self, value):
        """A NaN float keeps its identity, so that `[x] == [x]` holds on arrival as it does for one
        object (list equality tries identity first): the call's own NaN argument comes back as ["An", n],
        one met again in the message as ["Rn", n]."""
        key = id(value)
        if key in self.known_nans:
            return ["An", self.known_nans[key]]
        if key in self.nan_numbers:
            return ["Rn", self.nan_numbers[key]]
        self.nan_numbers[key] = len(self.nans)
        self.nans.append(value)
        return ["F", "nan"]

    def other(self, value):
        """Fractions, decimals, ranges, numpy scalars (as themselves where their dtype is one of
        _NUMPY_SCALARS, else as the Python scalar they hold) and, in the solution's replies, iterators;
        anything else raises _NotPlain."""
        fractions, decimal, numpy = (sys.modules.get(name) for name in ("fractions", "decimal", "numpy"))
        if fractions is not None and isinstance(value, fractions.Fraction):
            return ["Fr", [format(int(value.numerator), "x"), format(int(value.denominator), "x")]]
        if decimal is not None and isinstance(value, decimal.Decimal):
            return ["Dc", str(value)]
        if isinstance(value, range):
            return ["Rg", [format(n, "x") for n in (value.start, value.stop, value.step)]]
        if numpy is not None and isinstance(value, numpy.generic) and _scalar(value.item()) is not None:
            if value.dtype.name in _NUMPY_SCALARS and type(value) is value.dtype.type:
                return ["Np", [value.dtype.name, _scalar(value.item())]]
            return _scalar(value.item())
        if _builtin_named(getattr(value, "__name__", None)) is value:
            return ["Ty", value.__name__]
        if self.hand_over is not None and hasattr(type(value), "__next__"):
            return ["G", self.hand_over(value)]
        if self.held is not None and self.held.keeps(value):
            return ["Ob", self.held.send(value)]
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
    if tag == "Ty" and _builtin_named(payload) is not None:
        return _builtin_named(payload)
    if tag == "Np" and type(payload) is list and len(payload) == 2 and payload[0] in _NUMPY_SCALARS:
        inner = payload[1]
        if type(inner) is list and len(inner) == 2 and inner[0] in ("B", "I", "F", "C"):
            return _numpy_scalar(payload[0], _scalar_value(*inner))
    raise _BadWire(f"malformed value with tag {tag[:8]!r}")


def _numpy_scalar(dtype_name, value):
    """numpy's scalar of that dtype holding `value`, or `value` itself where numpy cannot be imported
    (the allowed packages are importable in both processes when the trainer has them)."""
    try:
        import numpy  # here: only a message that holds a numpy scalar needs numpy
    except Exception:
        return value
    with numpy.errstate(all="raise"):
        return numpy.dtype(dtype_name).type(value)


def _builtin_named(name):
    """The builtin type (`int`, `list`, `ValueError`) or function (`len`, `abs`, `sorted`) of that public
    name, else None: both processes have the same builtins, so one crosses by its name (`assert f() is
    int`, `sort_by(words, key=len)`); a bound method (`[].append`) or a method descriptor (`str.lower`)
    is not a builtin by name and stays not plain data."""
    if type(name) is not str or not name.isidentifier() or name.startswith("_"):
        return None
    kind = getattr(builtins, name, None)
    return kind if isinstance(kind, (type, type(len))) else None


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
    `remote(handle)`: the tests' local generator over an iterator the solution handed over; `held`
    (a `_Held`): what an object's handle stands for on this side."""

    def __init__(self, known=(), remote=None, known_nans=(), shared=None, held=None):
        self.known, self.remote = known, remote
        self.objects, self.tags = [], []
        self.known_nans, self.nans = known_nans, []
        self.shared = shared.objects if shared is not None else {}
        self.held = held

    def decode(self, item, depth=0):
        if depth > _MAX_DEPTH or type(item) is not list or len(item) != 2 or type(item[0]) is not str:
            raise _BadWire("malformed value")
        tag, payload = item
        if tag == "S" and type(payload) is str:
            return payload
        if tag in _CONTAINER_TAGS:
            return self.container(tag, payload, depth)
        if tag in _FLAT_TYPES:
            return self.flat(tag, payload)
        if tag in ("A", "R", "G", "H", "An", "Rn"):
            return self.reference(tag, payload)
        if tag == "Ob" and self.held is not None:
            return self.held.receive(payload)
        value = _scalar_value(tag, payload)
        if tag == "F" and value != value:
            self.nans.append(value)  # numbered as the encoder numbered it (see _Encoder.nan)
        return value

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

    def flat(self, tag, payload):
        """A flat list (see _flat_list): the JSON list itself, once its items are checked."""
        if type(payload) is not list or not set(map(type, payload)) <= {_FLAT_TYPES[tag]}:
            raise _BadWire(f"malformed {tag} list")
        self.objects.append(payload)
        self.tags.append("L")
        return payload

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
        if tag == "H" and number in self.shared:
            return self.shared[number]
        if tag == "An" and number < len(self.known_nans):
            return self.known_nans[number]
        if tag == "Rn" and number < len(self.nans):
            return self.nans[number]
        raise _BadWire(f"a reference ({tag}) to nothing")


def _snapshot(value, tag):
    """What a mutable container holds, flat, for an identity comparison (None for immutable ones)."""
    if tag not in _MUTABLE:
        return None
    items = _contents(value, tag)
    flat = [part for pair in items for part in pair] if tag in _PAIRS else items
    if tag == "d":
        flat.append(_defaultdict.default_factory.__get__(value))
    return flat


def _unchanged(now, before):
    """Whether two snapshots (or a list and its snapshot) hold the same objects in the same order."""
    return list.__len__(now) == len(before) and all(map(operator.is_, list.__iter__(now), before))


def _write_back(target, tag, new):
    """Write the new contents the other process gave one of this process's containers into it, in
    place, through its base type: the object keeps its identity and its type."""
    if tag == "L":
        list.__setitem__(target, slice(None), new)
    elif tag == "y":
        bytearray.__setitem__(target, slice(None), new)
    elif tag == "E":
        set.clear(target)
        set.update(target, iter(new))  # iter(): in the sender's order (see _set_in_order)
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


class _Held:
    """The objects that stay in the solution's process and cross as handles, one table per side (a
    remote reference, as an iterator's handle is). The solution's side (`_Kept` in solution.py) keeps an
    instance of the program's own classes that a reply holds (`Pair(5, 24)`, a tree's root) and numbers
    it in order; the tests' side (`_Proxies` in judge.py) gets an opaque proxy for each handle, one per
    handle, which goes back as that handle. `kind`: the type sent by handle wherever it is met (the
    proxy type; None on the solution's side); `keeps(value)`: whether any other value that is not plain
    data is kept and sent by handle; `send(value)`: its payload; `receive(payload)`: the object (or
    proxy) it stands for, or _BadWire."""

    kind = None

    def keeps(self, value):
        return False


class _Shared:
    """The mutable containers both processes hold under one handle, so that identity and changes
    survive across calls as in one interpreter: a container a call returned (or an argument container
    the call kept) that the program still holds after the call, while the tests hold it too. Each side
    keeps its own object for a handle and what it held when last synced; before a call the tests' side
    sends the new contents of those the tests changed, after it the solution's side those the program
    changed, and a shared container met in a message travels as ["H", handle]. A container that only
    the harness still holds on one side is dropped (see `_released`) when the table is pruned (`due`);
    at most _MAX_SHARED containers and _MAX_SHARED_ITEMS items are shared (past that, new ones cross
    by value only)."""

    def __init__(self):
        self.objects, self.tags, self.before, self.ids = {}, {}, {}, {}
        self.items = 0
        self.next = 0  # the next handle (the solution's side numbers them)
        self.pruned, self.calls = 0, 0  # the table's size when last pruned, calls since

    def due(self):
        """Whether to look for containers no longer held now: when the table has doubled since the last
        look, or every _PRUNE_EVERY calls. A container kept longer only costs its comparison."""
        self.calls += 1
        if not self.objects or (len(self.objects) < 2 * self.pruned + 8 and self.calls < _PRUNE_EVERY):
            return False
        self.calls = 0
        return True

    def room(self, value, tag):
        return len(self.objects) < _MAX_SHARED and self.items + len(_contents(value, tag)) <= _MAX_SHARED_ITEMS

    def add(self, handle, value, tag):
        self.objects[handle], self.tags[handle], self.ids[id(value)] = value, tag, handle
        self.before[handle] = _snapshot(value, tag)
        self.items += len(self.before[handle])

    def detach(self):
        """([handle], [tag], [object]) of all, emptying the table (so that it holds no reference)."""
        handles, tags, objects = list(self.objects), list(self.tags.values()), list(self.objects.values())
        self.objects, self.tags, self.before, self.ids = {}, {}, {}, {}
        self.items = 0
        return handles, tags, objects

    def remove(self, handle):
        value = self.objects.pop(handle)
        del self.tags[handle], self.ids[id(value)]
        self.items -= len(self.before.pop(handle))

    def states(self, encoder, unplain=None):
        """[[handle, [tag, new contents]], ...] of the containers changed since the last look. With a
        list `unplain`, a container that now holds data that is not plain leaves the table, its handle
        added to the list, instead of raising _NotPlain."""
        states, tags, before = [], self.tags, self.before
        for handle, value in self.objects.items():
            tag = tags[handle]
            if tag == "L" and _unchanged(value, before[handle]):  # a list compares as it is, unsnapshotted
                continue
            now = _snapshot(value, tag)
            if not _unchanged(now, before[handle]):
                if unplain is not None and not _plain_contents(self, value, tag, encoder.held):
                    unplain.append(handle)
                    continue
                states.append([handle, [tag, encoder.body(value, tag, 1)]])
                self.items += len(now) - len(self.before[handle])
                self.before[handle] = now
        for handle in unplain or ():
            self.remove(handle)
        return states

    def decode_states(self, decoder, states):
        """[(handle, new contents)] of a message's states: each names one shared container, once, with
        contents of its own kind."""
        if type(states) is not list:
            raise _BadWire("malformed states of shared containers")
        changes, seen = [], set()
        for state in states:
            if not (type(state) is list and len(state) == 2 and type(state[1]) is list and len(state[1]) == 2):
                raise _BadWire("malformed state of a shared container")
            handle, (tag, body) = state
            if type(handle) is not int or handle not in self.objects or handle in seen or tag != self.tags[handle]:
                raise _BadWire("a state for no shared container")
            seen.add(handle)
            changes.append((handle, decoder.container(tag, body, 1, numbered=False)))
        return changes

    def write(self, changes):
        """Write decoded states into the shared containers (after which they hold what was sent)."""
        for handle, new in changes:
            value, tag = self.objects[handle], self.tags[handle]
            _write_back(value, tag, new)
            now = _snapshot(value, tag)
            self.items += len(now) - len(self.before[handle])
            self.before[handle] = now


def _plain_contents(shared, value, tag, held=None):
    """Whether a container's contents encode (into a message of their own, thrown away)."""
    try:
        _Encoder(shared=shared, held=held).body(value, tag, 1)
    except Exception:
        return False
    return True


def _released(values):
    """Set to None each entry of `values` that nothing but this list holds, in turn until none is left
    (a container let go lets go of what it held), so that what stays is held elsewhere: by the program
    (or the tests), or inside something they hold. The caller holds no other reference to them."""
    going = True
    while going:
        going = False
        for index in range(len(values)):
            if values[index] is not None and sys.getrefcount(values[index]) == 2:
                values[index] = None
                going = True


_JSON_ENCODE = json.JSONEncoder(separators=(",", ":")).encode  # built once: a message costs no encoder


def _write_message(fd, message, write=os.write):
    """One length-prefixed JSON message (ASCII: lone surrogates travel as escapes)."""
    data = _JSON_ENCODE(message).encode("ascii")
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
        return json.loads(_read_exact(fd, size).decode("ascii"))  # a str: no encoding to detect
    except (ValueError, RecursionError) as e:
        raise _BadWire(f"message is not JSON ({type(e).__name__})") from None


def _error_info(error):
    """[type name, names of its nearest builtin classes, message, args or None, attributes] of a raised
    exception; the nearest builtin classes are those of its MRO that no other builtin class of the MRO
    derives from, comma-joined (`ValueError,TypeError` for `class E(ValueError, TypeError)`); the message
    is its str() (a custom __str__ included), the attributes its own plain-data ones ([[name, value],
    ...]: `e.code`)."""
    kind = type(error)
    found = [c for c in kind.__mro__ if getattr(builtins, c.__name__, None) is c]
    nearest = [c.__name__ for c in found if not any(d is not c and issubclass(d, c) for d in found)]
    base = ",".join(nearest) or "BaseException"
    try:
        args = _Encoder().encode(tuple(error.args))
    except Exception:  # args that are not plain data: the message stands in for them
        args = None
    return [kind.__name__, base, _message(error), args, _error_attributes(error)]


def _error_attributes(error):
    """[[name, value], ...] of an exception's own attributes that are plain data (dunders and anything
    else left out)."""
    attributes = []
    try:
        names = [name for name in vars(error) if type(name) is str and name.isidentifier()]
    except Exception:
        return attributes
    for name in names[:100]:
        if name.startswith("__"):
            continue
        try:
            attributes.append([name, _Encoder().encode(vars(error)[name])])
        except Exception:  # not plain data: left out
            pass
    return attributes


def _message(error):
    try:
        return str(error)[:2000]
    except Exception:
        return "<unprintable>"
