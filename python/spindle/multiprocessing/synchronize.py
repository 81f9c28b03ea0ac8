"""``multiprocessing``'s synchronization types as Spindle objects: the same objects as
:mod:`spindle.sync`, with ``multiprocessing``'s method signatures where they differ
(``acquire(block=True, timeout=None)``, ``Semaphore.get_value()``).
``Event`` and ``Barrier`` are :mod:`spindle.sync`'s own."""

from __future__ import annotations

from typing import Any, Optional, Type, TypeVar

from .. import sync
from ..proxy import Proxy

P = TypeVar("P", bound=Proxy)

Barrier = sync.Barrier
Event = sync.Event


def _attach_as(cls: Type[P], key: str) -> P:
    return cls._attach(key)


class TravelsAsItself:
    """A mirror's subclass of a Spindle proxy that unpickles as itself, not as its base
    (which lacks the mirror's methods): pickling a proxy ships only its class and key."""

    _key: str

    def __reduce__(self) -> Any:
        return (_attach_as, (type(self), self._key))


def _acquire_args(block: bool, timeout: Optional[float]) -> Any:
    """``multiprocessing``'s ``(block, timeout)`` as ``threading``'s ``(blocking, timeout)``:
    None waits forever, a negative timeout does not wait."""
    if not block:
        return False, -1
    return True, -1 if timeout is None else max(timeout, 0)


class Lock(TravelsAsItself, sync.Lock):
    """A shared lock with ``multiprocessing.Lock``'s ``acquire(block=True, timeout=None)``."""

    def acquire(  # type: ignore[override]
            self, block: bool = True, timeout: Optional[float] = None) -> bool:
        return super().acquire(*_acquire_args(block, timeout))


class RLock(TravelsAsItself, sync.RLock):
    """A shared reentrant lock with ``multiprocessing.RLock``'s ``acquire``."""

    def acquire(  # type: ignore[override]
            self, block: bool = True, timeout: Optional[float] = None) -> bool:
        return super().acquire(*_acquire_args(block, timeout))


class Semaphore(TravelsAsItself, sync.Semaphore):
    """A shared semaphore with ``multiprocessing.Semaphore``'s ``acquire(block, timeout)``
    (keyword ``block``) and ``get_value()``."""

    def acquire(  # type: ignore[override]
            self, block: bool = True, timeout: Optional[float] = None) -> bool:
        return super().acquire(block, timeout)

    def get_value(self) -> int:
        return self.value


class Condition(TravelsAsItself, sync.Condition):
    """A shared condition variable with ``multiprocessing.Condition``'s ``acquire``, whatever
    kind of Spindle lock it holds."""

    def acquire(  # type: ignore[override]
            self, block: bool = True, timeout: Optional[float] = None) -> bool:
        return sync.Lock.acquire(self._lock, *_acquire_args(block, timeout))


class BoundedSemaphore(Semaphore, sync.BoundedSemaphore):
    """A shared bounded semaphore (``ValueError`` on a release above the initial value)."""
