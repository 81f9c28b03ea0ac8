"""Shared data: Counter, Value, Dict, SortedDict, List, Blob, Array.

Every method is one round trip and runs in the server, next to the data. Views such as
``Dict.keys()`` are snapshots taken by one call, not live views.

``persistent=True`` (with ``name=``, on a server started with ``--data-dir``) makes an object
survive a server crash: every change is in the server's op log before its call returns
(docs/durability.md). Every reference to it must say ``persistent=True`` too.
"""

from __future__ import annotations

import operator
import threading
from collections.abc import Iterable, Mapping, MutableMapping, MutableSequence, Sequence
from typing import Any, Iterator, List as _List, Optional, Tuple, Union

from .codec import decode_ndarray, encode_ndarray, hashable
from .proxy import Proxy

_MISSING: Any = object()


def _pairs(other: Any) -> _List[Any]:
    """Key/value pairs of a mapping or an iterable of pairs, as a list of 2-lists."""
    if isinstance(other, Mapping):
        return [[k, v] for k, v in other.items()]
    if hasattr(other, "keys"):
        return [[k, other[k]] for k in other.keys()]
    out = []
    for pair in other:
        k, v = pair
        out.append([k, v])
    return out


_REPRS = threading.local()


def _contents_repr(obj: Proxy, contents: Any) -> str:
    """``spindle.Type(<repr of contents()>[, name='...'])``, like the builtin's repr.

    ``contents`` is called once (one snapshot). A value that holds a reference to an object
    being shown is shown as ``...``, as the builtins do for recursive containers; when the
    server cannot be reached the short reference repr is used, so ``repr`` never raises.
    """
    active = getattr(_REPRS, "active", None)
    if active is None:
        active = _REPRS.active = set()
    ref = (obj._type, obj._key)
    cls = f"spindle.{type(obj).__name__}"
    if ref in active:
        return f"{cls}(...)"
    active.add(ref)
    try:
        shown = repr(contents())
    except Exception:
        return Proxy.__repr__(obj)
    finally:
        active.discard(ref)
    name = obj.name
    return f"{cls}({shown})" if name is None else f"{cls}({shown}, name={name!r})"


class Counter(Proxy, type_name="Counter"):
    """A signed 64-bit integer; overflow raises ``OverflowError``."""

    def __init__(
        self, initial: int = 0, *, name: Optional[str] = None, persistent: bool = False
    ) -> None:
        self._init([initial], name, persistent)

    def get(self) -> int:
        return self._call("get", [])

    def set(self, value: int) -> None:
        self._call("set", [value])

    def add(self, delta: int = 1) -> int:
        """Add ``delta``; return the new value."""
        return self._call("add", [delta])

    def get_and_add(self, delta: int) -> int:
        """Add ``delta``; return the old value."""
        return self._call("get_and_add", [delta])

    def increment(self) -> int:
        return self._call("increment", [])

    def decrement(self) -> int:
        return self._call("decrement", [])

    def compare_and_set(self, expected: int, new: int) -> bool:
        return self._call("compare_and_set", [expected, new])

    @property
    def value(self) -> int:
        return self._call("get", [])

    @value.setter
    def value(self, value: int) -> None:
        self._call("set", [value])

    def __iadd__(self, delta: int) -> "Counter":
        self._call("add", [delta])
        return self

    def __isub__(self, delta: int) -> "Counter":
        self._call("add", [-delta])
        return self

    def __int__(self) -> int:
        return self.get()

    def __index__(self) -> int:
        return self.get()

    def __repr__(self) -> str:
        return _contents_repr(self, self.get)


class Value(Proxy, type_name="Value"):
    """A single value of any type."""

    def __init__(
        self, initial: Any = None, *, name: Optional[str] = None, persistent: bool = False
    ) -> None:
        self._init([initial], name, persistent)

    def get(self) -> Any:
        return self._call("get", [])

    def set(self, value: Any) -> None:
        self._call("set", [value])

    def get_and_set(self, value: Any) -> Any:
        """Store ``value``; return the old one."""
        return self._call("get_and_set", [value])

    def compare_and_set(self, expected: Any, new: Any) -> bool:
        return self._call("compare_and_set", [expected, new])

    @property
    def value(self) -> Any:
        return self._call("get", [])

    @value.setter
    def value(self, value: Any) -> None:
        self._call("set", [value])

    def __repr__(self) -> str:
        return _contents_repr(self, self.get)


_UNITS = {"": 1, "b": 1, "kib": 1 << 10, "mib": 1 << 20, "gib": 1 << 30, "tib": 1 << 40,
          "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12}


def _size(size: Union[int, str]) -> int:
    """Bytes from an int or a string with a unit, as ``--max-memory`` takes them: ``"64MiB"``."""
    if isinstance(size, str):
        text = size.strip()
        digits = len(text) - len(text.lstrip("0123456789"))
        unit = _UNITS.get(text[digits:].strip().lower())
        if digits == 0 or unit is None:
            raise ValueError(f"max_memory={size!r} is not a size: an int, or a string such as '64MiB' or '1GB'")
        size = int(text[:digits]) * unit
    if isinstance(size, bool) or not isinstance(size, int) or size <= 0:
        raise ValueError(f"max_memory={size!r}: a cache needs a positive number of bytes")
    return size


class Dict(Proxy, MutableMapping, type_name="Dict"):
    """A dictionary in insertion order, like ``dict``, plus server-side ``merge``.

    With ``max_memory`` (bytes, or a string such as ``"64MiB"``) it is a cache, as in
    Redis's ``allkeys-lru``: while its keys and values hold more than that, its least recently
    used keys go (reads with ``d[k]`` and ``get``, and writes, are uses; it iterates from the
    least to the most recently used key). The server's caches also give their least recently
    used keys when the server is over ``--max-memory``, before any call is refused with
    :class:`spindle.OutOfMemory`. Ordinary dictionaries never lose a key. An entry larger than
    the whole cache is a ``ValueError``. ``evict="lru"`` is the one policy. The options belong
    to the object when it is created: a later ``Dict(name=...)`` reaches it as it is.
    """

    def __init__(
        self,
        initial: Any = None,
        *,
        name: Optional[str] = None,
        persistent: bool = False,
        max_memory: Union[int, str, None] = None,
        evict: str = "lru",
        **kwargs: Any,
    ) -> None:
        entries = _pairs(initial) if initial is not None else []
        entries += [[k, v] for k, v in kwargs.items()]
        args: _List[Any] = [dict((hashable(k), v) for k, v in entries)] if entries else []
        if max_memory is not None:
            args = [args[0] if args else None, {"max_memory": _size(max_memory), "evict": evict}]
        self._init(args, name, persistent)

    def __getitem__(self, key: Any) -> Any:
        return self._call("getitem", [key])

    def __setitem__(self, key: Any, value: Any) -> None:
        self._call("setitem", [key, value])

    def __delitem__(self, key: Any) -> None:
        self._call("delitem", [key])

    def __contains__(self, key: object) -> bool:
        return self._call("contains", [key])

    def __len__(self) -> int:
        return self._call("len", [])

    def __iter__(self) -> Iterator[Any]:
        return iter([hashable(k) for k in self._call("keys", [])])

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Proxy) and not isinstance(other, Mapping):
            return False
        if isinstance(other, Proxy) and other._type == self._type and other._key == self._key:
            return True
        if isinstance(other, Mapping):
            return dict(self.items()) == dict(other.items())
        return NotImplemented

    __hash__ = Proxy.__hash__

    def __repr__(self) -> str:
        return _contents_repr(self, self.copy)

    def get(self, key: Any, default: Any = None) -> Any:
        return self._call("get", [key, default])

    def keys(self):  # type: ignore[override]
        """A snapshot of the keys (a set-like view)."""
        return dict.fromkeys(hashable(k) for k in self._call("keys", [])).keys()

    def values(self) -> _List[Any]:  # type: ignore[override]
        """A snapshot of the values."""
        return self._call("values", [])

    def items(self):  # type: ignore[override]
        """A snapshot of the ``(key, value)`` pairs (a set-like view)."""
        return {hashable(k): v for k, v in self._call("items", [])}.items()

    def setdefault(self, key: Any, default: Any = None) -> Any:
        return self._call("setdefault", [key, default])

    def pop(self, key: Any, default: Any = _MISSING) -> Any:
        if default is _MISSING:
            return self._call("pop", [key])
        return self._call("pop", [key, default])

    def popitem(self) -> Tuple[Any, Any]:
        """Remove and return the last inserted ``(key, value)``; ``KeyError`` when empty."""
        k, v = self._call("popitem", [])
        return hashable(k), v

    def update(self, other: Any = (), **kwargs: Any) -> None:  # type: ignore[override]
        entries = _pairs(other) + [[k, v] for k, v in kwargs.items()]
        if entries:
            self._call("update", [entries])

    def clear(self) -> None:
        self._call("clear", [])

    def copy(self) -> dict:
        """A plain ``dict`` with the current contents."""
        return dict(self.items())

    def merge(self, key: Any, value: Any, op: str = "sum") -> Any:
        """Combine ``value`` into the value at ``key`` in the server; return the result.

        ``op``: ``"sum"``, ``"min"``, ``"max"``, ``"append"``, ``"union"`` or ``"replace"``.
        """
        return self._call("merge", [key, value, op])

    def merge_many(self, entries: Any, op: str = "sum") -> None:
        """:meth:`merge` every entry of a mapping (or pairs) atomically."""
        self._call("merge_many", [_pairs(entries), op])


class SortedDict(Dict, type_name="SortedDict"):
    """A dictionary ordered by key."""

    def range(self, lo: Any = None, hi: Any = None) -> _List[Tuple[Any, Any]]:
        """``(key, value)`` pairs with ``lo <= key < hi`` (None: unbounded)."""
        return [(hashable(k), v) for k, v in self._call("range", [lo, hi])]

    def first(self) -> Tuple[Any, Any]:
        """The pair with the smallest key; ``KeyError`` when empty."""
        k, v = self._call("first", [])
        return hashable(k), v

    def last(self) -> Tuple[Any, Any]:
        """The pair with the largest key; ``KeyError`` when empty."""
        k, v = self._call("last", [])
        return hashable(k), v

    def most_common(self, n: Optional[int] = None) -> _List[Tuple[Any, Any]]:
        """Pairs by value, largest first (ties by key), like ``collections.Counter``."""
        args = [] if n is None else [n]
        return [(hashable(k), v) for k, v in self._call("most_common", args)]


def _slice_args(s: slice) -> _List[Any]:
    return [s.start, s.stop, s.step]


class List(Proxy, MutableSequence, type_name="List"):
    """A list, like ``list``: negative indexes and (extended) slices included."""

    def __init__(
        self,
        initial: Iterable[Any] = (),
        *,
        name: Optional[str] = None,
        persistent: bool = False,
    ) -> None:
        items = list(initial)
        self._init([items] if items else [], name, persistent)

    def __getitem__(self, index: Union[int, slice]) -> Any:
        if isinstance(index, slice):
            return self._call("getslice", _slice_args(index))
        return self._call("getitem", [operator.index(index)])

    def __setitem__(self, index: Union[int, slice], value: Any) -> None:
        if isinstance(index, slice):
            self._call("setslice", _slice_args(index) + [list(value)])
        else:
            self._call("setitem", [operator.index(index), value])

    def __delitem__(self, index: Union[int, slice]) -> None:
        if isinstance(index, slice):
            self._call("delslice", _slice_args(index))
        else:
            self._call("delitem", [operator.index(index)])

    def __len__(self) -> int:
        return self._call("len", [])

    def __iter__(self) -> Iterator[Any]:
        return iter(self._call("items", []))

    def __reversed__(self) -> Iterator[Any]:
        return reversed(self._call("items", []))

    def __contains__(self, value: object) -> bool:
        return self._call("contains", [value])

    def __eq__(self, other: object) -> bool:
        """Contents equality with a ``list`` or another ``spindle.List`` (one snapshot each);
        like ``list``, never equal to a tuple or another kind of sequence."""
        if isinstance(other, List):
            if other._type == self._type and other._key == self._key:
                return True
            return self._call("items", []) == other._call("items", [])
        if isinstance(other, list):
            return self._call("items", []) == other
        if isinstance(other, Proxy):
            return False
        return NotImplemented

    __hash__ = Proxy.__hash__

    def __repr__(self) -> str:
        return _contents_repr(self, self.copy)

    def __iadd__(self, values: Iterable[Any]) -> "List":
        self.extend(values)
        return self

    def insert(self, index: int, value: Any) -> None:
        self._call("insert", [operator.index(index), value])

    def append(self, value: Any) -> None:
        self._call("append", [value])

    def extend(self, values: Iterable[Any]) -> None:
        self._call("extend", [list(values)])

    def pop(self, index: int = -1) -> Any:
        return self._call("pop", [operator.index(index)])

    def index(self, value: Any, start: int = 0, stop: Optional[int] = None) -> int:
        return self._call("index", [value, start, stop])

    def count(self, value: Any) -> int:
        return self._call("count", [value])

    def remove(self, value: Any) -> None:
        self._call("remove", [value])

    def reverse(self) -> None:
        self._call("reverse", [])

    def clear(self) -> None:
        self._call("clear", [])

    def sort(self, *, key: Any = None, reverse: bool = False) -> None:
        """Sort in the server; with a ``key`` function, sort here and store (not atomic)."""
        if key is None:
            self._call("sort", [reverse])
        else:
            self[:] = sorted(self._call("items", []), key=key, reverse=reverse)

    def copy(self) -> list:
        """A plain ``list`` with the current contents."""
        return self._call("items", [])


class Blob(Proxy, type_name="Blob"):
    """A byte string."""

    def __init__(
        self, initial: bytes = b"", *, name: Optional[str] = None, persistent: bool = False
    ) -> None:
        self._init([bytes(initial)], name, persistent)

    def get(self) -> bytes:
        return self._call("get", [])

    def set(self, data: bytes) -> None:
        self._call("set", [bytes(data)])

    def append(self, data: bytes) -> int:
        """Append ``data``; return the new length."""
        return self._call("append", [bytes(data)])

    def read(self, offset: int, size: int) -> bytes:
        """``size`` bytes from ``offset`` (clipped to the end)."""
        return self._call("read", [offset, size])

    def __len__(self) -> int:
        return self._call("len", [])


class Array(Proxy, type_name="Array"):
    """A NumPy-like array of float64, float32 or int64, updated element-wise in the server."""

    def __init__(
        self,
        shape: Union[int, Sequence[int]],
        dtype: Any = "float64",
        *,
        name: Optional[str] = None,
        persistent: bool = False,
    ) -> None:
        import numpy as np

        dims: Any = operator.index(shape) if not isinstance(shape, Sequence) else [
            operator.index(d) for d in shape
        ]
        self._init([dims, np.dtype(dtype).name], name, persistent)

    def get(self) -> Any:
        """The contents as a new ``numpy.ndarray``."""
        return decode_ndarray(self._call("get", []))

    def set(self, array: Any) -> None:
        """Replace the contents (same shape; converted to the array's dtype)."""
        self._call("set", [encode_ndarray(array)])

    def add(self, other: Any) -> None:
        """Add an array (same shape) or a number, element-wise, in the server."""
        if isinstance(other, (int, float)) and not isinstance(other, bool):
            self._call("add", [other])
        else:
            import numpy as np

            if isinstance(other, np.generic):
                self._call("add", [other.item()])
            else:
                self._call("add", [encode_ndarray(other)])

    def scale(self, factor: Union[int, float]) -> None:
        """Multiply every element by ``factor``."""
        self._call("scale", [factor])

    def fill(self, value: Union[int, float]) -> None:
        self._call("fill", [value])

    @property
    def shape(self) -> Tuple[int, ...]:
        return tuple(self._call("shape", []))

    @property
    def dtype(self) -> Any:
        import numpy as np

        return np.dtype(self._call("dtype", []))

    def __array__(self, dtype: Any = None, copy: Any = None) -> Any:
        arr = self.get()
        return arr if dtype is None else arr.astype(dtype)
