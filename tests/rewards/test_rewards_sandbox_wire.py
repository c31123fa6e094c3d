"""The runner's wire formats on their own, without starting a sandbox: the plain data that crosses between
the solution's process and the tests' process (grpo_jax/rewards/sandbox_runner/wire.py), its framing and
limits, and the parent-runner contract (job.py). A value comes back equal, of the same type and with its
aliasing; a value with no plain form is `_NotPlain` when sent; anything malformed that arrives is one of
`_DECODE_ERRORS` (never a value of another type), a closed channel EOFError."""

import collections
import fractions
import json
import math
import os
import sys
import threading
from decimal import Decimal

import pytest

from grpo_jax.rewards.sandbox_runner import job, wire

ROUND_TRIPS = {
    "none": None,
    "bools": [True, False],
    "ints": [0, -1, 2**64, -(3**500)],
    "floats": [1.5, -0.0, float("inf"), 1e-310],
    "complex": 1.5 - 2j,
    "str": "héllo \U0001f600 \udc80",  # a lone surrogate too: it travels as an escape
    "bytes": b"\x00\xff",
    "fraction": fractions.Fraction(-3, 7),
    "decimal": Decimal("1.10"),
    "range": range(-5, 10**30, 3),
    "tuple": (1, ("a", b"b"), ()),
    "dict": {"a": 1, 2: [3], (4, 5): None, frozenset({6}): {}},
    "set": {1, "x", (2, 3)},
    "frozenset": frozenset({1, 2}),
    "bytearray": bytearray(b"ab"),
    "deque": collections.deque([1, 2], maxlen=5),
    "ordered": collections.OrderedDict([("b", 1), ("a", 2)]),
    "counter": collections.Counter("abca"),
    "defaultdict": collections.defaultdict(list, {"k": [1]}),
    "empty": [[], {}, set(), (), "", b""],
}


def round_trip(value, known=(), remote=None):
    return wire._Decoder(known, remote).decode(json.loads(json.dumps(wire._Encoder(known).encode(value))))


@pytest.mark.parametrize("name", sorted(ROUND_TRIPS))
def test_plain_data_comes_back_equal_and_of_the_same_type(name):
    value = ROUND_TRIPS[name]
    back = round_trip(value)
    assert repr(back) == repr(value) and type(back) is type(value)


def test_numbers_keep_their_exact_value():
    back = round_trip([float("nan"), -0.0, 10**5000, True, 1])
    assert math.isnan(back[0]) and math.copysign(1, back[1]) == -1.0
    assert back[2] == 10**5000  # hex on the wire: no digit limit
    assert back[3] is True and type(back[4]) is int


def test_subclasses_of_scalars_arrive_as_their_base_type():
    class Int(int):
        def __eq__(self, other):
            return True

    class Str(str):
        pass

    back = round_trip([Int(3), Str("s")])
    assert back == [3, "s"] and type(back[0]) is int and type(back[1]) is str


def test_container_subclasses_without_methods_arrive_as_their_base_type():
    class Plain(list):
        pass

    class Point(tuple):  # immutable: nothing can be written back past its methods
        def norm(self):
            return sum(self)

    back = round_trip([Plain([1, 2]), Point((3, 4))])
    assert back == [[1, 2], (3, 4)] and type(back[0]) is list and type(back[1]) is tuple


@pytest.mark.parametrize("base", [list, dict, set, bytearray, collections.deque, collections.OrderedDict])
def test_a_mutable_container_subclass_with_its_own_methods_is_not_plain_data(base):
    """A read-only list (or one that iterates otherwise) would arrive as a plain list, and changes
    written back through its base type would bypass its guard: refused, so the call fails."""
    rigged = type("Guarded", (base,), {"__iter__": lambda self: iter([99])})
    with pytest.raises(wire._NotPlain, match="Guarded.* subclass with its own methods"):
        wire._Encoder().encode([rigged()])


def test_flat_lists_take_the_bulk_path_and_keep_their_numbering():
    """Long lists of only ints (64-bit), finite floats or strs travel as JSON numbers or strings; an
    alias of one is still a reference to it, and anything else goes item by item."""
    ints, floats, strs = list(range(-8, 2**40, 2**36)), [i / 3 for i in range(20)], ["\udc80é"] * 20
    encoded = wire._Encoder().encode([ints, floats, strs, ints])
    assert [part[0] for part in encoded[1]] == ["Li", "Lf", "Ls", "R"]
    back = round_trip([ints, floats, strs, ints])
    assert back == [ints, floats, strs, ints] and back[3] is back[0]
    for slow in ([2**64] * 20, [True] * 20, [1] * 10 + [1.0] * 10, [float("inf")] * 20, [1] * 15):
        assert wire._Encoder().encode(slow)[0] == "L" and round_trip(slow) == slow


def test_aliasing_survives_and_distinct_equal_containers_stay_distinct():
    shared = [1]
    back = round_trip([shared, shared, [1], {"k": shared}])
    assert back[0] is back[1] is back[3]["k"] and back[2] is not back[0]


def test_a_container_that_holds_itself_is_not_plain_data():
    loop = []
    loop.append(loop)
    with pytest.raises(wire._NotPlain, match="contains itself"):
        wire._Encoder().encode(loop)


def test_nesting_is_limited_both_ways():
    deep = []
    for _ in range(wire._MAX_DEPTH + 1):
        deep = [deep]
    with pytest.raises(wire._NotPlain, match=f"nested deeper than {wire._MAX_DEPTH} levels"):
        wire._Encoder().encode(deep)
    message = ["L", []]
    for _ in range(wire._MAX_DEPTH + 1):
        message = ["L", [message]]
    with pytest.raises(wire._BadWire):
        wire._Decoder().decode(message)


@pytest.mark.parametrize("value", [object(), [].append, wire._Encoder, ValueError("x"), sys])
def test_other_objects_are_not_plain_data(value):
    with pytest.raises(wire._NotPlain, match="is not plain data"):
        wire._Encoder().encode(value)


def test_builtin_types_and_functions_cross_by_name():
    """`assert f() is int`, `sort_by(words, len)`: a builtin type or function arrives as itself; a name that
    is no public builtin type or function is refused, and a bound builtin method is not plain data."""
    for kind in (int, list, type, ValueError, object, len, print, sorted):
        assert wire._Decoder().decode(wire._Encoder().encode(kind)) is kind
    for name in ("__loader__", "__import__", "_x", "True", "Ellipsis", "nothing", "a.b"):
        with pytest.raises(wire._BadWire):
            wire._Decoder().decode(["Ty", name])
    for value in ([].append, str.lower):
        with pytest.raises(wire._NotPlain):
            wire._Encoder().encode(value)


def test_a_defaultdict_with_a_factory_that_is_not_a_builtin_type_loses_its_default():
    back = round_trip(collections.defaultdict(lambda: 0, {"a": 1}))
    assert back == {"a": 1} and back.default_factory is None


def test_a_set_keeps_the_senders_iteration_order():
    grown = set(range(100))
    for n in range(2, 100):
        grown.discard(n)  # a large table with deleted slots: inserting 0, 1 afresh may order them otherwise
    grown |= {1000, -7}
    back = round_trip(grown)
    assert back == grown and list(back) == list(grown) and isinstance(back, set)
    assert repr(back) == repr(grown)


def test_numpy_scalars_arrive_as_themselves():
    numpy = pytest.importorskip("numpy")
    sent = [numpy.int64(-3), numpy.uint64(2**64 - 1), numpy.float32(0.1), numpy.bool_(True), numpy.complex64(1j)]
    back = round_trip(sent)
    assert [type(v) for v in back] == [type(v) for v in sent] and back == sent
    assert back[3] is not True and back[2] == numpy.float32(0.1)
    with pytest.raises(wire._DECODE_ERRORS):
        wire._Decoder().decode(["Np", ["int8", ["I", "400"]]])  # out of range: refused, not wrapped
    assert type(round_trip(numpy.str_("a"))) is str  # a type outside the list: its Python scalar


def test_a_nan_keeps_its_identity_in_a_message_and_back_to_its_sender():
    """`[x] == [x]` is True for one NaN object (list equality tries identity first)."""
    nan, other = float("nan"), float("nan")
    back = round_trip([nan, nan, other])
    assert back[0] is back[1] and back[2] is not back[0] and back == [back[0], back[1], back[2]]
    sender = wire._Encoder()
    request = sender.encode([nan])
    receiver = wire._Decoder()
    argument = receiver.decode(request)
    reply = wire._Encoder(known_nans=receiver.nans).encode([argument[0], float("nan")])
    assert reply[1][0] == ["An", 0]
    assert wire._Decoder(known_nans=sender.nans).decode(reply)[0] is nan


def test_shared_containers_travel_by_handle_and_report_their_changes():
    shared = wire._Shared()
    board = [[0], [0]]
    shared.add(7, board, "L")
    encoder = wire._Encoder(shared=shared)
    assert encoder.encode([board]) == ["L", [["H", 7]]] and shared.states(encoder) == []
    board.append(5)
    rows = [["L", [["I", "0"]]], ["L", [["I", "0"]]]]  # the rows are new to this message: sent in full
    assert shared.states(wire._Encoder(shared=shared)) == [[7, ["L", [*rows, ["I", "5"]]]]]
    assert shared.states(wire._Encoder(shared=shared)) == []  # reported once
    assert wire._Decoder(shared=shared).decode(["H", 7]) is board
    with pytest.raises(wire._BadWire):
        wire._Decoder(shared=shared).decode(["H", 8])
    with pytest.raises(wire._BadWire):
        shared.decode_states(wire._Decoder(), [[7, ["D", []]]])  # of another kind


def test_released_keeps_only_what_something_else_holds():
    kept = [1]
    values = [[kept, [2]], kept, [3]]
    inner = values[0][1]
    del inner
    wire._released(values)
    assert values == [None, kept, None]


def test_known_objects_travel_as_references_to_the_callers_own():
    argument = [3, 1, 2]
    encoded = wire._Encoder([argument]).encode([argument])
    assert encoded == ["L", [["A", 0]]]
    back = wire._Decoder([argument]).decode(encoded)
    assert back[0] is argument


def test_iterators_are_handed_over_only_where_the_encoder_allows():
    handles = []
    encoder = wire._Encoder(hand_over=lambda iterator: handles.append(iterator) or len(handles) - 1)
    generator = (n for n in range(3))
    assert encoder.encode([generator]) == ["L", [["G", 0]]] and handles == [generator]
    assert wire._Decoder(remote=lambda handle: f"remote {handle}").decode(["G", 7]) == "remote 7"
    with pytest.raises(wire._NotPlain):
        wire._Encoder().encode(iter([1]))


MALFORMED = {
    "not a pair": "x",
    "short": ["S"],
    "tag not a string": [1, 2],
    "unknown tag": ["Zz", 1],
    "str payload": ["S", 1],
    "int digits": ["I", "zz"],
    "float": ["F", 1.0],
    "complex": ["C", ["0x1p+0"]],
    "fraction by zero": ["Fr", ["1", "0"]],
    "range step 0": ["Rg", ["0", "1", "0"]],
    "decimal": ["Dc", "not a number"],
    "bool": ["B", 1],
    "list payload": ["L", "abc"],
    "pair": ["D", [["S", "a"]]],
    "unhashable key": ["D", [[["L", []], ["N", None]]]],
    "equal set elements": ["E", [["I", "1"], ["F", "0x1p+0"]]],
    "deque maxlen": ["Q", [-1, []]],
    "defaultdict factory": ["d", ["eval", []]],
    "bytearray hex": ["y", "zz"],
    "reference to nothing": ["R", 0],
    "reference to a container being built": ["L", [["R", 0]]],
    "negative reference": ["R", -1],
    "argument out of range": ["A", 0],
    "iterator without a channel": ["G", 0],
    "shared without a table": ["H", 0],
    "nan that was not sent": ["An", 0],
    "nan met before nothing": ["Rn", 0],
    "flat ints holding a str": ["Li", [1, "2"]],
    "flat ints holding a bool": ["Li", [1, True]],
    "flat floats holding an int": ["Lf", [1.5, 2]],
    "flat strs not a list": ["Ls", "ab"],
    "numpy dtype not allowed": ["Np", ["object", ["I", "1"]]],
}


@pytest.mark.parametrize("name", sorted(MALFORMED))
def test_malformed_values_are_decode_errors(name):
    with pytest.raises(wire._DECODE_ERRORS):
        wire._Decoder().decode(MALFORMED[name])


def test_a_protocol_violation_names_the_tag():
    with pytest.raises(wire._BadWire, match="malformed value with tag 'Zz'"):
        wire._Decoder().decode(["Zz", 1])
    with pytest.raises(wire._BadWire, match=r"a reference \(R\) to nothing"):
        wire._Decoder().decode(["R", 3])


@pytest.fixture
def channel():
    r, w = os.pipe()
    yield r, w
    for fd in (r, w):
        try:
            os.close(fd)
        except OSError:
            pass


def test_messages_round_trip_through_a_pipe_as_length_prefixed_ascii_json(channel):
    r, w = channel
    message = ["call", "f", [wire._Encoder().encode("\udc80é")], []]
    wire._write_message(w, message)
    wire._write_message(w, ["ready", []])
    size = int.from_bytes(os.read(r, 4), "big")
    body = os.read(r, size)
    assert body.isascii() and json.loads(body) == message
    assert wire._read_message(r) == ["ready", []]


def test_short_writes_still_send_the_whole_frame(channel):
    r, w = channel
    wire._write_message(w, {"k": "v" * 100}, write=lambda fd, view: os.write(fd, view[:3]))
    assert wire._read_message(r) == {"k": "v" * 100}


def test_a_closed_channel_is_eof_before_and_inside_a_frame(channel):
    r, w = channel
    os.write(w, (10).to_bytes(4, "big") + b"[1,")
    os.close(w)
    with pytest.raises(EOFError):
        wire._read_message(r)
    with pytest.raises(EOFError):
        wire._read_message(r)


def test_a_frame_over_the_limit_is_refused_before_it_is_read(channel):
    r, w = channel
    os.write(w, (wire._MAX_FRAME_BYTES + 1).to_bytes(4, "big"))
    with pytest.raises(wire._BadWire, match=f"message of {wire._MAX_FRAME_BYTES + 1} bytes"):
        wire._read_message(r)


@pytest.mark.parametrize(
    ("body", "error"), [(b"[1,", "JSONDecodeError"), (b"\xff", "UnicodeDecodeError"), (b"[" * 100_000, "RecursionError")]
)
def test_a_frame_that_is_not_json_is_a_protocol_violation(channel, body, error):
    r, w = channel
    frame = memoryview(len(body).to_bytes(4, "big") + body)
    writer = threading.Thread(target=lambda: [os.write(w, frame[n : n + 4096]) for n in range(0, len(frame), 4096)])
    writer.start()  # larger than a pipe's buffer: written from a thread while it is read
    with pytest.raises(wire._BadWire, match=f"message is not JSON \\({error}\\)"):
        wire._read_message(r)
    writer.join()


def test_read_exact_reads_across_short_reads():
    data = iter([b"ab", b"c", b"def"])
    assert wire._read_exact(0, 5, read=lambda fd, n: next(data)[:n]) == b"abcde"


def test_an_exception_travels_as_its_name_nearest_builtin_class_message_and_args():
    class BadInput(ValueError):
        pass

    error = BadInput("no", 3)
    error.code, error.hook, error.__note = 404, lambda: 0, "private"
    assert wire._error_info(error) == [
        "BadInput", "ValueError", "('no', 3)", ["T", [["S", "no"], ["I", "3"]]], [["code", ["I", "194"]]]
    ]  # fmt: skip  (a lambda is not plain data; a dunder is left out)

    class Both(ValueError, TypeError):
        pass

    assert wire._error_info(Both("x"))[:2] == ["Both", "ValueError,TypeError"]  # the nearest builtin classes
    info = wire._error_info(KeyError(object()))
    assert info[:2] == ["KeyError", "KeyError"] and info[3] is None  # args not plain: the message stands in


def test_an_exception_message_is_cut_and_an_unprintable_one_named_so():
    class Unprintable(Exception):
        def __str__(self):
            raise RuntimeError

    assert len(wire._error_info(ValueError("x" * 5000))[2]) == 2000
    assert wire._message(Unprintable()) == "<unprintable>"


def test_the_job_round_trips_and_its_fd_is_closed():
    sent = {"role": "tests", "nonce": b"\x00" * 16, "limits": {"cpu_s": 1.5}, "layers": {"seccomp": True}}
    r, w = os.pipe()
    os.write(w, job.dump_job(sent))
    os.close(w)
    assert job._read_job(r) == sent
    with pytest.raises(OSError):
        os.close(r)


def test_the_exit_codes_and_failure_lines_are_the_documented_ones():
    assert (job.SETUP_FAILED, job.PEER_GONE, job.CPU_LIMIT_EXIT) == (121, 122, 152)
    assert (job.SETUP_FAILED_LINE, job.CALL_FAILED_LINE) == ("sandbox_setup_failed:", "sandbox_call_failed: ")


class _ProgramClass:
    """Stands in for a class the program defines (its module is the program's, `__main__`)."""

    __module__ = "__main__"


class _FakeChannel:
    def __init__(self):
        self.failures = []

    def fail(self, error):
        self.failures.append(error)
        return error


def test_an_instance_of_the_programs_class_crosses_as_a_handle_and_comes_back_as_itself():
    """The solution's side keeps an instance of the program's class and sends a handle; the tests' side
    gets one proxy per handle, which goes back as the handle, which the solution's side resolves to
    the very object. A value of no class of the program's stays not plain data."""
    from grpo_jax.rewards.sandbox_runner import judge, solution

    kept, proxies = solution._Kept(), judge._Proxies(_FakeChannel())
    pair = _ProgramClass()
    sent = json.loads(json.dumps(wire._Encoder(held=kept).encode([pair, pair, (pair,)])))
    handle = ["Ob", [0, "_ProgramClass"]]
    assert sent == ["L", [handle, handle, ["T", [handle]]]]
    value = wire._Decoder(held=proxies).decode(sent)
    assert type(value[0]) is judge._Remote and value[0] is value[1] is value[2][0]
    back = json.loads(json.dumps(wire._Encoder(held=proxies).encode({"p": value[0]})))
    assert back == ["D", [[["S", "p"], ["Ob", 0]]]]
    assert wire._Decoder(held=kept).decode(back) == {"p": pair} and wire._Decoder(held=kept).decode(back)["p"] is pair
    with pytest.raises(wire._NotPlain):
        wire._Encoder(held=kept).encode(object())


@pytest.mark.parametrize(
    "payload",
    [[1, "Pair"], [-1, "Pair"], ["0", "Pair"], [True, "Pair"], [0, ""], [0, 3], 0, [0, "Pair", 1], [0, "x" * 101]],
    ids=["never-issued", "negative", "str", "bool", "no-name", "name-not-str", "bare", "three", "long-name"],
)
def test_a_forged_object_handle_from_the_solution_is_refused(payload):
    """The tests' side accepts a handle it has seen (with the same class name) or the next one, and
    nothing else; no decoder without a table accepts a handle at all."""
    from grpo_jax.rewards.sandbox_runner import judge

    with pytest.raises(wire._DECODE_ERRORS):
        wire._Decoder(held=judge._Proxies(_FakeChannel())).decode(["Ob", payload])
    with pytest.raises(wire._DECODE_ERRORS):
        wire._Decoder().decode(["Ob", [0, "Pair"]])
    proxies = judge._Proxies(_FakeChannel())
    wire._Decoder(held=proxies).decode(["Ob", [0, "Pair"]])
    with pytest.raises(wire._DECODE_ERRORS):
        wire._Decoder(held=proxies).decode(["Ob", [0, "Node"]])  # handle 0 is a Pair


def test_the_solution_resolves_only_handles_it_issued_and_keeps_at_most_its_limit(monkeypatch):
    from grpo_jax.rewards.sandbox_runner import solution

    monkeypatch.setattr(solution, "_MAX_OBJECTS", 2)
    kept = solution._Kept()
    for bad in (0, -1, True, "0", [0]):
        with pytest.raises(wire._DECODE_ERRORS):
            kept.receive(bad)
    first, second = _ProgramClass(), _ProgramClass()
    assert kept.send(first)[0] == 0 and kept.send(second)[0] == 1 and kept.send(first)[0] == 0
    assert kept.receive(1) is second
    with pytest.raises(wire._NotPlain, match="more than 2"):
        kept.send(_ProgramClass())


def test_a_proxy_refuses_every_use_but_going_back_and_records_it():
    """Each refused use raises and is recorded on the channel (so a test that catches it still fails)."""
    from grpo_jax.rewards.sandbox_runner import judge

    channel = _FakeChannel()
    proxy = wire._Decoder(held=judge._Proxies(channel)).decode(["Ob", [0, "Pair"]])
    uses = [
        lambda p: p == 3, lambda p: 3 == p, lambda p: p != 3, lambda p: hash(p), lambda p: bool(p), lambda p: str(p),
        lambda p: repr(p), lambda p: format(p, ""), lambda p: len(p), lambda p: iter(p), lambda p: p[0],
        lambda p: p + 1, lambda p: 1 - p, lambda p: p < 1, lambda p: int(p), lambda p: float(p),
        lambda p: [0][p], lambda p: isinstance(p, int), lambda p: p.__class__, lambda p: p.__dict__,
        lambda p: 3 in p, lambda p: {p}, lambda p: abs(p), lambda p: -p, lambda p: round(p),
    ]  # fmt: skip
    for number, use in enumerate(uses, 1):
        with pytest.raises(judge._CallFailed, match="'Pair' object of the program's"):
            use(proxy)
        assert len(channel.failures) == number
    assert isinstance(proxy, judge._Remote) and proxy is proxy
