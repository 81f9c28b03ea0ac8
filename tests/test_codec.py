"""The codec on its own (no server): dataclasses (ext 4) and NumPy arrays (ext 5) as plain
data, and stamped pickles (ext 6) unpickled only for trusted writers."""

from __future__ import annotations

import dataclasses
import pickle
import sys
import types
from typing import Any, Dict, List, Optional, Tuple

import msgpack
import numpy as np
import pytest

import spindle
from spindle import codec
from spindle.errors import SpindleError


@pytest.fixture(scope="module")
def server() -> None:
    """These tests need no server (overrides conftest's session server for this module)."""
    return None


@pytest.fixture(autouse=True)
def codec_state() -> Any:
    """Leave the codec's process-wide trust as it was."""
    user, writers = codec.own_user, codec.trusted_writers
    yield
    codec.own_user, codec.trusted_writers = user, writers


# -- helpers ----------------------------------------------------------------------------


def ext_codes(body: bytes) -> List[int]:
    """The ext type codes in ``body``, outermost first (bodies of 3 and 4 looked into)."""
    codes: List[int] = []

    def hook(code: int, data: bytes) -> Any:
        codes.append(code)
        if code in (codec.EXT_TUPLE, codec.EXT_DATACLASS):
            msgpack.unpackb(data, raw=False, ext_hook=hook, strict_map_key=False)
        return None

    msgpack.unpackb(body, raw=False, ext_hook=hook, strict_map_key=False)
    return codes


def ext(code: int, body: Any) -> bytes:
    """A whole MessagePack value: ext type ``code`` whose body is ``body`` packed."""
    data = body if isinstance(body, bytes) else msgpack.packb(body, use_bin_type=True)
    return msgpack.packb(msgpack.ExtType(code, data))


def stamped(writer: Any, trusted: Any, data: Any) -> bytes:
    return ext(codec.EXT_STAMPED, [writer, trusted, data])


def roundtrip(value: Any) -> Any:
    return codec.unpackb(codec.packb(value))


class NoPickle:
    """Stands in for the ``pickle`` module in the codec: any use fails the test."""

    HIGHEST_PROTOCOL = pickle.HIGHEST_PROTOCOL

    @staticmethod
    def dumps(*args: Any, **kwargs: Any) -> bytes:
        raise AssertionError("pickle.dumps used")

    @staticmethod
    def loads(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("pickle.loads used")


# A pickle whose unpickling has a visible effect: it appends 1 to EFFECTS.
EFFECTS: List[int] = []


def plant(item: int) -> None:
    EFFECTS.append(item)


class Planted:
    def __reduce__(self) -> Any:  # (not EFFECTS.append: pickle would copy the list)
        return (plant, (1,))


PLANTED = pickle.dumps(Planted(), protocol=pickle.HIGHEST_PROTOCOL)


@pytest.fixture
def effects() -> List[int]:
    EFFECTS.clear()
    yield EFFECTS
    EFFECTS.clear()


# -- dataclasses ------------------------------------------------------------------------


@dataclasses.dataclass
class Point:
    x: float
    y: float


@dataclasses.dataclass(frozen=True)
class Frozen:
    name: str
    tags: Tuple[str, ...]


@dataclasses.dataclass
class Everything:
    ints: List[int]
    table: Dict[str, Any]
    pair: Tuple[int, bytes]
    blob: bytes
    nothing: Optional[int]
    origin: Point
    points: List[Point]
    frozen: Frozen
    array: Any = None
    counted: int = dataclasses.field(default=0, init=False)


@dataclasses.dataclass
class Checked:
    """Its __init__ and __post_init__ must not run when a value is read."""

    value: int
    inits: int = 0

    def __post_init__(self) -> None:
        raise AssertionError("__post_init__ ran")


class Outer:
    @dataclasses.dataclass
    class Inner:
        a: int


if sys.version_info >= (3, 10):

    @dataclasses.dataclass(slots=True)
    class Slotted:
        a: int
        b: Tuple[int, int]

    @dataclasses.dataclass(slots=True, frozen=True)
    class FrozenSlotted:
        a: int
        b: str


def test_dataclasses_round_trip_as_ext_4():
    value = Everything(
        ints=[1, 2, 3],
        table={"k": [1, {"n": None}], "t": (1, 2)},
        pair=(7, b"\x00\xff"),
        blob=b"bytes",
        nothing=None,
        origin=Point(0.0, -1.5),
        points=[Point(1, 2), Point(3, 4)],
        frozen=Frozen("f", ("a", "b")),
        array=np.arange(4, dtype=np.int32),
    )
    value.counted = 3
    body = codec.packb(value)
    assert ext_codes(body)[0] == codec.EXT_DATACLASS
    assert codec.EXT_PICKLE not in ext_codes(body)
    back = codec.unpackb(body)
    assert type(back) is Everything
    assert type(back.origin) is Point and type(back.frozen) is Frozen
    assert back.pair == (7, b"\x00\xff") and type(back.pair) is tuple
    assert back.frozen.tags == ("a", "b") and type(back.frozen.tags) is tuple
    assert back.table == {"k": [1, {"n": None}], "t": (1, 2)}
    assert back.counted == 3
    assert np.array_equal(back.array, value.array) and back.array.dtype == np.int32
    back.array = value.array = None
    assert back == value


def test_frozen_and_nested_class_dataclasses():
    f = roundtrip(Frozen("x", ("y",)))
    assert f == Frozen("x", ("y",)) and hash(f) == hash(Frozen("x", ("y",)))
    with pytest.raises(dataclasses.FrozenInstanceError):
        f.name = "z"  # still frozen
    assert roundtrip(Outer.Inner(5)) == Outer.Inner(5)
    # A frozen dataclass as a dictionary key.
    assert roundtrip({Frozen("k", ()): 1}) == {Frozen("k", ()): 1}


@pytest.mark.skipif(sys.version_info < (3, 10), reason="slots dataclasses need Python 3.10")
def test_slots_dataclasses():
    s = roundtrip(Slotted(1, (2, 3)))
    assert type(s) is Slotted and s == Slotted(1, (2, 3)) and not hasattr(s, "__dict__")
    fs = roundtrip(FrozenSlotted(1, "b"))
    assert fs == FrozenSlotted(1, "b")
    assert ext_codes(codec.packb(FrozenSlotted(1, "b"))) == [codec.EXT_DATACLASS]


def test_dataclasses_and_arrays_do_not_use_pickle(monkeypatch):
    value = [Point(1, 2), Frozen("a", ((1, 2),)), np.ones((2, 2)), Outer.Inner(1)]
    monkeypatch.setattr(codec, "pickle", NoPickle)
    back = roundtrip(value)
    assert back[:2] == value[:2] and back[3] == value[3]
    assert np.array_equal(back[2], value[2])


def test_reading_a_dataclass_runs_none_of_its_code():
    c = Checked.__new__(Checked)
    c.value, c.inits = 1, 0
    back = roundtrip(c)
    assert type(back) is Checked and back.value == 1


@dataclasses.dataclass
class CustomReduce:
    a: int

    def __reduce__(self) -> Any:
        return (CustomReduce, (self.a + 1,))


@dataclasses.dataclass
class WithState:
    a: int

    def __setstate__(self, state: Any) -> None:
        self.__dict__.update(state, restored=True)


def test_dataclasses_that_are_not_plain_data_pickle_as_before():
    class Sub(Point):  # a subclass of a dataclass, not a dataclass itself
        pass

    global SubOfPoint
    SubOfPoint = Sub
    Sub.__qualname__ = "SubOfPoint"
    extra = Point(1, 2)
    extra.note = "not a field"
    for value in (Sub(1, 2), extra, Point(1, {1, 2}), CustomReduce(1), WithState(1)):
        assert ext_codes(codec.packb(value)) == [codec.EXT_PICKLE], value
    back = roundtrip(extra)
    assert back == extra and back.note == "not a field"
    assert type(roundtrip(Sub(1, 2))) is Sub
    assert roundtrip(Point(1, {1, 2})) == Point(1, {1, 2})
    assert roundtrip(CustomReduce(1)) == CustomReduce(2)
    assert roundtrip(WithState(1)).restored


def test_a_dataclass_defined_in_a_function_pickles_by_value():
    @dataclasses.dataclass
    class Local:
        a: int

    # Plain pickle cannot name its class: it travels by value, as a function's argument does.
    assert ext_codes(codec.packb(Local(1))) == [codec.EXT_PICKLE]
    back = codec.unpackb(codec.packb(Local(1)))
    assert type(back) is Local and back == Local(1)


def test_a_field_needing_pickle_pickles_the_outermost_dataclass():
    inner = Point(1, frozenset([1]))
    body = codec.packb([Everything([], {}, (1, b""), b"", None, inner, [], Frozen("", ()))])
    assert ext_codes(body) == [codec.EXT_PICKLE]  # the whole Everything, not a pickle in it


def test_a_dataclass_inside_itself_pickles():
    p = Point(1, None)
    p.y = [p]
    assert ext_codes(codec.packb(p)) == [codec.EXT_PICKLE]
    back = roundtrip(p)
    assert back.y[0] is back
    assert ext_codes(codec.packb(Point(1, 2))) == [codec.EXT_DATACLASS]  # none left behind


def test_shipped_dataclasses_keep_pickle():
    assert ext_codes(codec.packb(Point(1, 2), ship=True))[0] == codec.EXT_PICKLE
    assert codec.unpackb(codec.packb(Point(1, 2), ship=True)) == Point(1, 2)


def test_a_dataclass_of_an_unknown_class_keeps_its_fields():
    body = ext(codec.EXT_DATACLASS, ["test_codec", "Gone", {"a": 1, "b": [2]}])
    value = codec.unpackb(body)
    assert isinstance(value, codec.UnknownDataclass) and isinstance(value, codec.Unpicklable)
    assert (value.module, value.qualname) == ("test_codec", "Gone")
    assert value.fields == {"a": 1, "b": [2]}
    assert "Gone" in str(value.error) and "Gone" in repr(value)
    # Written back, it travels as it came.
    assert codec.packb(value) == body


def test_a_dataclass_of_a_module_not_imported_is_not_imported():
    assert "antigravity" not in sys.modules
    value = codec.unpackb(ext(codec.EXT_DATACLASS, ["antigravity", "X", {}]))
    assert isinstance(value, codec.UnknownDataclass) and "not imported" in str(value.error)
    assert "antigravity" not in sys.modules
    value = codec.unpackb(ext(codec.EXT_DATACLASS, ["os._private", "X", {}]))
    assert isinstance(value, codec.UnknownDataclass)


def test_a_dataclass_naming_something_else_never_calls_it(monkeypatch):
    calls: List[Any] = []
    monkeypatch.setattr("os.system", lambda *a: calls.append(a))
    fake = types.ModuleType("spindle_test_fake")
    fake.NotData = type("NotData", (), {"__init__": lambda self, **k: calls.append(k)})
    fake.Mimic = type("Mimic", (), {"__dataclass_fields__": {},
                                    "__new__": lambda cls: calls.append(cls)})
    monkeypatch.setitem(sys.modules, "spindle_test_fake", fake)
    for module, qualname, fields in [
        ("os", "system", {"command": "touch /tmp/pwned"}),
        ("builtins", "eval", {"source": "1"}),
        ("spindle_test_fake", "NotData", {"a": 1}),
        ("spindle_test_fake", "Mimic", {}),
        ("test_codec", "Point.__init__", {"x": 1}),
        ("test_codec", "<locals>.X", {}),
        ("", "X", {}),
    ]:
        value = codec.unpackb(ext(codec.EXT_DATACLASS, [module, qualname, fields]))
        assert isinstance(value, codec.UnknownDataclass), (module, qualname)
    assert calls == []


def test_a_dataclass_with_other_fields_is_not_filled_in():
    missing = codec.unpackb(ext(codec.EXT_DATACLASS, ["test_codec", "Point", {"x": 1}]))
    assert isinstance(missing, codec.UnknownDataclass) and "missing: ['y']" in str(missing.error)
    fields = {"x": 1, "y": 2, "z": 3}
    extra = codec.unpackb(ext(codec.EXT_DATACLASS, ["test_codec", "Point", fields]))
    assert isinstance(extra, codec.UnknownDataclass) and "'z'" in str(extra.error)


@pytest.mark.parametrize("body", [
    b"",
    b"\xc1",
    msgpack.packb(["test_codec", "Point"]),
    msgpack.packb(["test_codec", "Point", {"x": 1, "y": 2}, 4]),
    msgpack.packb([1, "Point", {}]),
    msgpack.packb(["test_codec", "Point", [1, 2]]),
    msgpack.packb(["test_codec", "Point", {1: 1, "y": 2}]),
    msgpack.packb("test_codec.Point"),
    msgpack.packb(["test_codec", "Point", {"x": 1, "y": 2}])[:-1],  # truncated
])
def test_a_malformed_dataclass_is_a_placeholder(body):
    value = codec.unpackb(ext(codec.EXT_DATACLASS, body))
    assert isinstance(value, codec.Undecodable) and value.code == codec.EXT_DATACLASS
    assert "ext type 4" in str(value.error) or isinstance(value, codec.UnknownDataclass)


def test_a_pickle_inside_a_dataclass_value_is_refused(effects):
    codec.trust("alice")
    for pickled in (msgpack.ExtType(codec.EXT_PICKLE, PLANTED),
                    msgpack.ExtType(codec.EXT_STAMPED, msgpack.packb(["alice", True, PLANTED]))):
        tup = msgpack.ExtType(codec.EXT_TUPLE, msgpack.packb([pickled]))
        for field in (pickled, [pickled], tup):
            body = msgpack.packb(["test_codec", "Point", {"x": 1, "y": field}])
            value = codec.unpackb(ext(codec.EXT_DATACLASS, body))
            assert isinstance(value, codec.Undecodable) and "holding a pickle" in str(value.error)
    assert effects == []


# -- NumPy arrays -----------------------------------------------------------------------


@pytest.mark.parametrize("array", [
    np.arange(12, dtype=np.float64).reshape(3, 4),
    np.arange(6, dtype=np.float32).reshape(2, 3).T,  # not contiguous
    np.array(3.25),  # 0-d
    np.array([], dtype=np.int16),
    np.zeros((0, 3), dtype=np.uint8),
    np.array([[True, False], [False, True]]),
    np.array([1 + 2j, -3.5j], dtype=np.complex128),
    np.array([1 + 2j], dtype=np.complex64),
    np.array([1.5, -2], dtype=np.float16),
    np.arange(24, dtype=np.int64).reshape(2, 3, 4)[:, ::2],
    np.array([-1, 2**31 - 1], dtype=">i4"),  # big-endian
    np.array([2**64 - 1], dtype=np.uint64),
])
def test_ndarrays_round_trip_as_ext_5(array):
    body = codec.packb(array)
    assert ext_codes(body) == [codec.EXT_NDARRAY]
    back = codec.unpackb(body)
    assert type(back) is np.ndarray
    assert back.dtype == array.dtype and back.shape == array.shape
    assert np.array_equal(back, array)
    assert back.flags.writeable
    back[...] = 0  # owns its memory


def test_other_ndarrays_pickle_as_before():
    for array in (np.array(["a", "b"]), np.array([None, 1], dtype=object),
                  np.array(["2020-01-01"], dtype="datetime64[D]"),
                  np.zeros(2, dtype=[("a", "i4"), ("b", "f8")]),
                  np.ma.masked_array([1, 2], mask=[0, 1]), np.zeros(2, dtype=np.longdouble)):
        assert ext_codes(codec.packb(array)) == [codec.EXT_PICKLE], array.dtype
        back = roundtrip(array)
        assert type(back) is type(array) and back.dtype == array.dtype


@pytest.mark.parametrize("body", [
    ["|O8", [1], b"\x00" * 8],  # object dtype
    ["O", [1], b"\x00" * 8],
    ["<U1", [1], b"\x00" * 4],
    ["<M8[D]", [1], b"\x00" * 8],
    ["<f16", [1], b"\x00" * 16],  # longdouble
    ["i4,f8", [1], b"\x00" * 12],
    ["<f8", [3], b"\x00" * 16],  # wrong length for the shape
    ["<f8", [2, 2], b"\x00" * 24],
    ["<f8", [-1], b"\x00" * 16],  # negative dimension
    ["<f8", [True], b"\x00" * 8],
    ["<f8", [0, 2**64 - 1], b""],
    ["<f8", [1] * 70, b"\x00" * 8],  # too many dimensions
    ["<f8", [1], "text"],
    ["<f8", 1, b"\x00" * 8],
    [8, [1], b"\x00" * 8],
    ["<f8", [1]],
    ["garbage", [1], b"\x00"],
])
def test_a_malformed_ndarray_is_a_placeholder(body):
    value = codec.unpackb(ext(codec.EXT_NDARRAY, body))
    assert isinstance(value, codec.Undecodable) and value.code == codec.EXT_NDARRAY
    assert "ext type 5" in str(value.error)


def test_a_truncated_ndarray_is_a_placeholder():
    body = msgpack.packb(["<f8", [2], b"\x00" * 16], use_bin_type=True)
    value = codec.unpackb(ext(codec.EXT_NDARRAY, body[:-3]))
    assert isinstance(value, codec.Undecodable)


# -- stamped pickles --------------------------------------------------------------------


def test_an_untrusted_writer_is_refused_and_its_pickle_never_runs(effects):
    codec.set_user("alice")
    with pytest.raises(spindle.UntrustedValue) as info:
        codec.unpackb(stamped("mallory", False, PLANTED))
    assert effects == []
    err = info.value
    assert isinstance(err, SpindleError) and isinstance(err, PermissionError)
    assert err.writer == "mallory"
    assert str(err) == ("a pickled value written by 'mallory', who may not run code here: not "
                        "unpickled (trust that writer with spindle.trust('mallory') to read it)")
    assert pickle.loads(pickle.dumps(err)).writer == "mallory"


def test_untrusted_deep_inside_a_value_raises_after_the_whole_value(effects):
    planted = msgpack.ExtType(codec.EXT_STAMPED, msgpack.packb(["mallory", False, PLANTED]))
    trusted = msgpack.ExtType(codec.EXT_STAMPED,
                              msgpack.packb(["bob", True, pickle.dumps({1, 2})]))
    tup = msgpack.ExtType(codec.EXT_TUPLE, msgpack.packb([1, planted], use_bin_type=True))
    body = msgpack.packb([7, 0, {"a": [tup], "b": trusted}], use_bin_type=True)
    with pytest.raises(spindle.UntrustedValue) as info:
        codec.unpackb(body)
    assert effects == []
    value = info.value.value  # the whole reply, with a placeholder: a reader stays in step
    assert value[0] == 7 and value[2]["b"] == {1, 2}
    placeholder = value[2]["a"][0][1]
    assert isinstance(placeholder, codec.Untrusted) and placeholder.writer == "mallory"
    assert codec.unpackb(body, lenient=True)[2]["a"][0][1].writer == "mallory"
    # The placeholder never travels as the pickle it holds.
    assert PLANTED not in codec.packb(placeholder)
    assert effects == []


@pytest.mark.parametrize("how", ["trusted", "own", "trust"])
def test_trusted_writers_are_unpickled(effects, how):
    codec.set_user("alice" if how == "own" else "carol")
    if how == "trust":
        spindle.trust("mallory", "eve")
    writer = "alice" if how == "own" else "mallory"
    assert codec.unpackb(stamped(writer, how == "trusted", PLANTED)) is None  # plant's
    assert effects == [1]
    assert codec.unpackb(stamped(writer, how == "trusted", pickle.dumps({"s": {1}}))) == {"s": {1}}


def test_no_own_user_trusts_no_one_by_name(effects):
    codec.set_user(None)
    for writer in ("", "None", "default"):
        with pytest.raises(spindle.UntrustedValue):
            codec.unpackb(stamped(writer, False, PLANTED))
    assert effects == []


def test_trust_checks_its_arguments():
    with pytest.raises(TypeError):
        spindle.trust(None)  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        spindle.trust("")
    with pytest.raises(TypeError):
        codec.set_user(3)  # type: ignore[arg-type]
    assert "spindle.trust" not in str(codec.trusted_writers)


def test_a_trusted_pickle_that_does_not_unpickle_is_unpicklable():
    body = pickle.dumps(Point(1, 2)).replace(b"test_codec", b"test_gone_")
    value = codec.unpackb(stamped("bob", True, body))
    assert type(value) is codec.Unpicklable and value.data == body


def test_unstamped_pickles_unpickle_as_before(effects):
    codec.set_user("alice")
    assert codec.unpackb(msgpack.packb(msgpack.ExtType(codec.EXT_PICKLE, PLANTED))) is None
    assert effects == [1]


@pytest.mark.parametrize("body", [
    b"",
    b"\xc1",
    msgpack.packb(["mallory", False]),
    msgpack.packb(["mallory", False, PLANTED, 1], use_bin_type=True),
    msgpack.packb([None, True, PLANTED], use_bin_type=True),
    msgpack.packb(["bob", 1, PLANTED], use_bin_type=True),  # an int is not a bool
    msgpack.packb(["bob", True, "not bytes"]),
    msgpack.packb({"writer": "bob", "trusted": True, "pickle": PLANTED}, use_bin_type=True),
    msgpack.packb(["bob", True, PLANTED], use_bin_type=True)[:-5],  # truncated
])
def test_a_malformed_stamp_is_a_placeholder_never_unpickled(effects, body):
    value = codec.unpackb(ext(codec.EXT_STAMPED, body))
    assert isinstance(value, codec.Undecodable) and value.code == codec.EXT_STAMPED
    assert "ext type 6" in str(value.error)
    assert effects == []
    assert codec.EXT_STAMPED not in ext_codes(codec.packb(value))  # never sent back as a stamp


def test_an_object_host_has_no_own_user(effects):
    from spindle import host

    codec.set_user("alice")
    request = msgpack.packb([1, "call", "key", "m", [msgpack.ExtType(
        codec.EXT_STAMPED, msgpack.packb(["alice", False, PLANTED], use_bin_type=True))]],
        use_bin_type=True)
    with pytest.raises(spindle.UntrustedValue):
        host.decode(request)
    assert effects == []
    spindle.trust("alice")
    assert host.decode(request)[4] == [None] and effects == [1]
    # A class not here, even nested, raises there rather than reaching the method.
    gone = msgpack.packb(["test_codec", "Gone", {}])
    dc = msgpack.ExtType(codec.EXT_DATACLASS, gone)
    tup = msgpack.ExtType(codec.EXT_TUPLE, msgpack.packb([dc]))
    with pytest.raises(LookupError):
        host.decode(msgpack.packb([1, "call", "key", "m", [tup]]))
