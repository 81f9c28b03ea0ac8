"""Values on the wire: MessagePack with two extension types, and NumPy arrays.

- Plain values (None, bool, int, float, str, bytes, list, dict) are MessagePack.
- A tuple travels as ext type 3 whose body is the array of its items, so it comes back a
  tuple (the server compares and hashes it by its items). Arrays written by other clients
  come back as lists, or as tuples where a value must be hashable (dictionary keys).
- A value with no MessagePack form (exact types only: a subclass such as a namedtuple or an
  IntEnum keeps its type this way) is pickled into ext type 1. Values for and from shared
  objects' methods (``ship``) fall back to cloudpickle, by value, for classes of ``__main__``
  and classes that do not pickle by reference.
- A Spindle proxy travels as ext type 2 whose body is ``[type, key]`` and comes back as a
  proxy attached to the same object.
- NumPy arrays for ``Array`` objects travel as the map
  ``{"dtype": str, "shape": [int...], "data": bin}`` (C order, little-endian).
"""

from __future__ import annotations

import pickle
import sys
from typing import Any, Dict, List, Optional, Tuple

import msgpack

EXT_PICKLE = 1
EXT_REF = 2
EXT_TUPLE = 3

ARRAY_DTYPES = ("float64", "float32", "int64")


class Unpicklable:
    """A pickled value (ext type 1) that could not be unpickled in this process."""

    __slots__ = ("data", "error")

    def __init__(self, data: bytes, error: BaseException) -> None:
        self.data = data
        self.error = error

    def __repr__(self) -> str:
        return f"<spindle.codec.Unpicklable {len(self.data)} bytes: {self.error!r}>"


# Set by ``spindle.host`` while it packs a method's result: ``(object, type, key)`` of the
# method's object, which travels as a reference to itself wherever it is in the result (as
# ``return self`` does), never as a copy of its state.
shipping_self: Optional[Tuple[Any, str, str]] = None


def _default(obj: Any, ship: bool = False) -> Any:
    from .proxy import Proxy

    if type(obj) is tuple:
        return msgpack.ExtType(EXT_TUPLE, packb(list(obj), ship))
    if isinstance(obj, Proxy):
        return msgpack.ExtType(EXT_REF, msgpack.packb(obj._reference()))
    np = sys.modules.get("numpy")
    if np is not None and isinstance(obj, np.generic):
        return obj.item()
    if ship:
        me = shipping_self
        if me is not None and obj is me[0]:
            from .proxy import overriding_methods, reference

            ref = reference(me[1], me[2], overriding_methods(type(obj)))
            return msgpack.ExtType(EXT_REF, msgpack.packb(ref))
        return msgpack.ExtType(EXT_PICKLE, _pickle_to_ship(obj))
    return msgpack.ExtType(EXT_PICKLE, pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL))


def _default_ship(obj: Any) -> Any:
    return _default(obj, True)


def _pickle_to_ship(obj: Any) -> bytes:
    """``obj`` pickled for a shared object's method in another process (or back from it).

    Plain pickle for instances of installed classes (fast, and the host imports them). An
    instance of a class of ``__main__`` or of the program's own modules pickles by reference
    but would mean another class, or no class, in the object host (whose ``__main__`` is
    Spindle's), and a class defined in a function, or shipped by value (a shared object's
    class, in its host), does not pickle by reference at all: those go by value with
    cloudpickle, which also gives them back as the very class they were in the process that
    sent that class first.
    """
    from .shared import installed, pickle_by_value

    module = type(obj).__module__
    if installed(module):
        try:
            return pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
        except Exception:
            pass
    return pickle_by_value(obj)


def _ext_hook(code: int, data: bytes) -> Any:
    if code == EXT_TUPLE:
        return tuple(unpackb(data))
    if code == EXT_REF:
        from .proxy import from_reference

        return from_reference(*msgpack.unpackb(data, raw=False))
    if code == EXT_PICKLE:
        try:
            return pickle.loads(data)
        except Exception as exc:  # a class this process cannot import, say
            return Unpicklable(data, exc)
    return msgpack.ExtType(code, data)


def hashable(value: Any) -> Any:
    """``value`` with its arrays turned into tuples, recursively (so it can be a key)."""
    if type(value) is list:
        return tuple([hashable(v) for v in value])
    return value


def _pairs_hook(pairs: List[Tuple[Any, Any]]) -> Dict[Any, Any]:
    try:
        return dict(pairs)
    except TypeError:  # an array key: make it a tuple
        return {hashable(k): v for k, v in pairs}


def packb(value: Any, ship: bool = False) -> bytes:
    """Encode ``value`` as MessagePack; ``ship``: for a shared object's method (see
    :func:`_pickle_to_ship`)."""
    return msgpack.packb(value, default=_default_ship if ship else _default, use_bin_type=True,
                         strict_types=True)


def unpackb(body: bytes) -> Any:
    """Decode one MessagePack value."""
    return msgpack.unpackb(
        body,
        raw=False,
        strict_map_key=False,
        ext_hook=_ext_hook,
        object_pairs_hook=_pairs_hook,
    )


def pickled(obj: Any) -> Any:
    """``obj`` pickled as an ext-1 value, or None when it cannot be pickled."""
    try:
        return msgpack.ExtType(EXT_PICKLE, pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL))
    except Exception:
        return None


def encode_ndarray(array: Any) -> Dict[str, Any]:
    """The wire map of a NumPy array (dtype kept if float64/float32/int64, else float64)."""
    import numpy as np

    arr = np.asarray(array)
    name = arr.dtype.name if arr.dtype.name in ARRAY_DTYPES else (
        "int64" if arr.dtype.kind in "iub" else "float64"
    )
    arr = np.ascontiguousarray(arr, dtype=np.dtype(name).newbyteorder("<"))
    return {"dtype": name, "shape": list(arr.shape), "data": arr.tobytes(order="C")}


def decode_ndarray(value: Dict[str, Any]) -> Any:
    """A writable NumPy array from its wire map."""
    import numpy as np

    dtype = np.dtype(value["dtype"]).newbyteorder("<")
    arr = np.frombuffer(value["data"], dtype=dtype).reshape(tuple(value["shape"]))
    return arr.astype(arr.dtype.newbyteorder("="), copy=True)
