"""``multiprocessing.Value`` and ``Array`` (and their ``Raw`` forms) as Spindle objects.

A ``Value`` is a :class:`spindle.Value` and an ``Array`` a :class:`spindle.List` of the
given length, holding what the ctypes type would hold (``Value('i')`` is 0, ``Value('d')``
0.0; the initial values are converted by the ctypes type, so a bad one is refused here).
With ``lock=True`` (the default) each has a shared ``RLock``, ``get_lock()``, and travels to
cloud functions with it, so ``with v.get_lock(): v.value += 1`` counts exactly, as in
``multiprocessing``. A single ``v.value`` read or write is one linearizable call either way.
"""

from __future__ import annotations

from multiprocessing.sharedctypes import typecode_to_type
from typing import Any, Optional

from .. import data
from .synchronize import RLock


def _ctype(typecode_or_type: Any) -> Any:
    if isinstance(typecode_or_type, str):
        try:
            return typecode_to_type[typecode_or_type]
        except KeyError:
            raise TypeError(f"unknown typecode {typecode_or_type!r}") from None
    return typecode_or_type


def _lock_of(lock: Any) -> Optional[Any]:
    if lock is True:
        return RLock()
    if lock is False or lock is None:
        return None
    if not hasattr(lock, "acquire"):
        raise AttributeError(f"{lock!r} has no method 'acquire'")
    return lock


class _Synchronized:
    """``multiprocessing``'s synchronized wrapper's methods, over the object's shared lock."""

    _lock: Optional[Any]

    def get_lock(self) -> Any:
        if self._lock is None:
            raise AttributeError("this object was created with lock=False: it has no lock")
        return self._lock

    def get_obj(self) -> Any:
        return self

    def acquire(self, *args: Any) -> bool:
        return self.get_lock().acquire(*args)

    def release(self) -> None:
        self.get_lock().release()

    def __enter__(self) -> bool:
        return self.get_lock().__enter__()

    def __exit__(self, *exc: Any) -> None:
        self.get_lock().__exit__(*exc)


def _rebuild(cls: Any, key: str, lock: Optional[Any]) -> Any:
    obj = cls._attach(key)
    obj._lock = lock
    return obj


class Value(_Synchronized, data.Value):
    """``multiprocessing.Value(typecode_or_type, *args, lock=True)``; see the module docstring."""

    def __init__(self, typecode_or_type: Any, *args: Any, lock: Any = True) -> None:
        super().__init__(_ctype(typecode_or_type)(*args).value)
        self._lock = _lock_of(lock)

    def _attached(self) -> None:
        self._lock = None

    def __reduce__(self) -> Any:
        return (_rebuild, (type(self), self._key, self._lock))


class Array(_Synchronized, data.List):
    """``multiprocessing.Array(typecode_or_type, size_or_initializer, lock=True)``."""

    def __init__(self, typecode_or_type: Any, size_or_initializer: Any, *,
                 lock: Any = True) -> None:
        ctype = _ctype(typecode_or_type)
        if isinstance(size_or_initializer, int):
            items = list((ctype * size_or_initializer)())
        else:
            initial = list(size_or_initializer)
            items = list((ctype * len(initial))(*initial))
        if items and hasattr(items[0], "value"):  # arrays of structures: keep the values
            items = [item.value for item in items]
        super().__init__(items)
        self._lock = _lock_of(lock)

    def _attached(self) -> None:
        self._lock = None

    def __reduce__(self) -> Any:
        return (_rebuild, (type(self), self._key, self._lock))


def RawValue(typecode_or_type: Any, *args: Any) -> Value:
    """A shared value without a lock."""
    return Value(typecode_or_type, *args, lock=False)


def RawArray(typecode_or_type: Any, size_or_initializer: Any) -> Array:
    """A shared array without a lock."""
    return Array(typecode_or_type, size_or_initializer, lock=False)

