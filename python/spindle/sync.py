"""Synchronization objects, drop-in for ``threading``'s: Lock, RLock, Semaphore,
BoundedSemaphore, Event, Condition, Barrier, plus CountDownLatch.

Waits park the caller in the server (one connection per waiting thread, no polling).
A lock whose holder's connection died is released by the server; the next ``acquire`` then
returns ``True`` and emits :class:`spindle.AbandonedLockWarning`.
"""

from __future__ import annotations

import threading
import time
import warnings
from typing import Any, Callable, List, Optional, TypeVar, Union

from .errors import AbandonedLockWarning
from .proxy import Proxy, attach, refuse_waiting, validate_name

T = TypeVar("T")


def _message_of(call: Callable[[], Any], default: str) -> str:
    """The message of the ``ValueError`` that ``call`` raises (CPython's wording varies by
    version: Lock's negative timeout is "must be positive" before 3.13)."""
    try:
        call()
    except ValueError as exc:
        return str(exc)
    return default


_NEGATIVE_LOCK_TIMEOUT = _message_of(
    lambda: threading.Lock().acquire(True, -2), "timeout value must be a non-negative number"
)


def _lock_args(blocking: bool, timeout: Any) -> List[Any]:
    """``threading.Lock.acquire``'s ``(blocking, timeout)`` as the server's ``[blocking, timeout]``.

    As in CPython: ``timeout=-1`` (the default) waits forever; a non-blocking call takes no
    other timeout; any other negative timeout is a ``ValueError`` and ``None`` a ``TypeError``.
    """
    if timeout is None:
        raise TypeError("'NoneType' object cannot be interpreted as an integer")
    if not blocking:
        if timeout != -1:
            raise ValueError("can't specify a timeout for a non-blocking call")
        return [False, None]
    if timeout == -1:
        return [True, None]
    if timeout < 0:
        raise ValueError(_NEGATIVE_LOCK_TIMEOUT)
    if timeout > threading.TIMEOUT_MAX:
        raise OverflowError("timeout value is too large")
    return [True, timeout]


def _semaphore_args(blocking: bool, timeout: Optional[float]) -> List[Any]:
    """``threading.Semaphore.acquire``'s arguments: ``None`` waits forever and a negative
    timeout acts as a zero one (CPython's Semaphore is written in Python, unlike its Lock)."""
    if not blocking:
        if timeout is not None:
            raise ValueError("can't specify timeout for non-blocking acquire")
        return [False, None]
    return [True, _timeout(timeout)]


def _timeout(timeout: Optional[float]) -> Optional[float]:
    """A wait's timeout for the server: ``None`` (forever) stays, a negative one becomes 0,
    as in ``threading`` (``Event.wait(-1)`` returns at once), since the server refuses it."""
    if timeout is not None and timeout < 0:
        return 0
    return timeout


def _parks(args: List[Any]) -> bool:
    """Whether an ``acquire``/``wait`` with these ``[blocking, timeout]`` (or ``[timeout]``)
    arguments could park in the server: blocking, and a timeout other than zero."""
    if len(args) == 2 and not args[0]:
        return False
    timeout = args[-1]
    return timeout is None or timeout > 0


def _acquired(result: Any, obj: Proxy) -> bool:
    if result == "abandoned":
        warnings.warn(
            f"{obj!r} was acquired after its previous holder died while holding it; "
            "the state it protects may be inconsistent",
            AbandonedLockWarning,
            stacklevel=3,
        )
        return True
    return bool(result)


class Lock(Proxy, type_name="Lock"):
    """A mutual-exclusion lock; any caller may release it, as with ``threading.Lock``.

    ``acquire`` returns ``True`` and warns :class:`spindle.AbandonedLockWarning` when the
    previous holder's process died while holding the lock.
    """

    def __init__(self, *, name: Optional[str] = None, persistent: bool = False) -> None:
        # persistent=True is refused by the server: a lock is ephemeral by nature.
        self._init([], name, persistent)

    def acquire(self, blocking: bool = True, timeout: float = -1) -> bool:
        args = _lock_args(blocking, timeout)
        return _acquired(self._call("acquire", args, _parks(args)), self)

    def release(self) -> None:
        self._call("release", [])

    def locked(self) -> bool:
        return self._call("locked", [])

    def __enter__(self) -> bool:
        return _acquired(self._call("acquire", [True, None], True), self)

    def __exit__(self, *exc: Any) -> None:
        self._call("release", [])

    def __repr__(self) -> str:
        """``<spindle.Lock object 'key' [locked]>``: the state, as ``threading``'s locks show
        it (without it when the server cannot be reached, so that ``repr`` never raises)."""
        try:
            state = "locked" if self.locked() else "unlocked"
        except Exception:
            return Proxy.__repr__(self)
        return f"<spindle.{type(self).__name__} object {self._key!r} [{state}]>"


class RLock(Lock, type_name="RLock"):
    """A reentrant lock owned by (this process's session, the calling thread)."""

    def is_owned(self) -> bool:
        """True if the calling thread holds the lock."""
        return self._call("is_owned", [])

    _is_owned = is_owned


class Semaphore(Proxy, type_name="Semaphore"):
    """A counting semaphore; permits held by a dead process are given back."""

    def __init__(
        self, value: int = 1, *, name: Optional[str] = None, persistent: bool = False
    ) -> None:
        if value < 0:
            raise ValueError("semaphore initial value must be >= 0")
        self._init([value], name, persistent)

    def acquire(self, blocking: bool = True, timeout: Optional[float] = None) -> bool:
        args = _semaphore_args(blocking, timeout)
        return _acquired(self._call("acquire", args, _parks(args)), self)

    def release(self, n: int = 1) -> None:
        self._call("release", [n])

    @property
    def value(self) -> int:
        """The number of free permits."""
        return self._call("value", [])

    def __enter__(self) -> bool:
        return _acquired(self._call("acquire", [True, None], True), self)

    def __exit__(self, *exc: Any) -> None:
        self._call("release", [1])


class BoundedSemaphore(Semaphore, type_name="BoundedSemaphore"):
    """A semaphore that refuses (``ValueError``) to be released above its initial value."""


class Event(Proxy, type_name="Event"):
    """A flag that threads wait for, like ``threading.Event``."""

    def __init__(self, *, name: Optional[str] = None, persistent: bool = False) -> None:
        self._init([], name, persistent)

    def set(self) -> None:
        self._call("set", [])

    def clear(self) -> None:
        self._call("clear", [])

    def is_set(self) -> bool:
        return self._call("is_set", [])

    isSet = is_set

    def wait(self, timeout: Optional[float] = None) -> bool:
        """Wait until the flag is set (a negative timeout: do not wait); the flag."""
        args = [_timeout(timeout)]
        return self._call("wait", args, _parks(args))


AnyLock = Union[Lock, RLock]


class Condition(Proxy, type_name="Condition"):
    """A condition variable, like ``threading.Condition`` (default lock: an ``RLock``).

    The lock is acquired and released by the client; the server keeps the queue of waiters
    as tickets: ``register`` while holding the lock, release it, ``wait`` for the ticket,
    re-acquire. A named Condition found by name uses the lock it was created with.
    """

    def __init__(self, lock: Optional[AnyLock] = None, *, name: Optional[str] = None) -> None:
        if lock is not None and not isinstance(lock, Lock):
            raise TypeError("a spindle Condition needs a spindle Lock or RLock (or None)")
        if name is None:
            lock = lock if lock is not None else RLock()
            self._init([lock._type, lock._key], None)
        else:
            validate_name(name)
            if lock is None:
                lock = RLock(name=f"{name}:lock")
            if not self._init([lock._type, lock._key], name):
                stored = self._call("lock", [])
                if [lock._type, lock._key] != list(stored):
                    lock = attach(stored[0], stored[1])  # type: ignore[assignment]
        self._lock_proxy: Optional[AnyLock] = lock

    def _attached(self) -> None:
        self._lock_proxy = None

    @property
    def _lock(self) -> AnyLock:
        if self._lock_proxy is None:
            type_name, key = self._call("lock", [])
            self._lock_proxy = attach(type_name, key)  # type: ignore[assignment]
        return self._lock_proxy  # type: ignore[return-value]

    def acquire(self, blocking: bool = True, timeout: float = -1) -> bool:
        return self._lock.acquire(blocking, timeout)

    def release(self) -> None:
        self._lock.release()

    def __enter__(self) -> bool:
        return self._lock.__enter__()

    def __exit__(self, *exc: Any) -> None:
        self._lock.release()

    def _is_owned(self) -> bool:
        lock = self._lock
        if isinstance(lock, RLock):
            return lock.is_owned()
        return lock.locked()

    def _release_all(self) -> int:
        lock = self._lock
        if not isinstance(lock, RLock):
            lock.release()
            return 1
        depth = 0
        while True:
            lock.release()
            depth += 1
            if not lock.is_owned():
                return depth

    def wait(self, timeout: Optional[float] = None) -> bool:
        """Release the lock, wait to be notified (or time out), re-acquire; True if notified."""
        # Refused in a shared object's method even with a zero timeout: it re-acquires the
        # lock, which may wait.
        refuse_waiting("spindle.Condition.wait()")
        if not self._is_owned():
            raise RuntimeError("cannot wait on un-acquired lock")
        timeout = _timeout(timeout)
        ticket = self._call("register", [])
        depth = self._release_all()
        try:
            return bool(self._call("wait", [ticket, timeout]))
        except BaseException:
            try:
                self._call("cancel", [ticket])
            except Exception:
                pass
            raise
        finally:
            lock = self._lock
            for _ in range(depth):
                lock.acquire()

    def wait_for(self, predicate: Callable[[], T], timeout: Optional[float] = None) -> T:
        """Wait until ``predicate()`` is true (or the timeout expires); return its last value."""
        endtime = None
        waittime = timeout
        result = predicate()
        while not result:
            if waittime is not None:
                if endtime is None:
                    endtime = time.monotonic() + waittime
                else:
                    waittime = endtime - time.monotonic()
                    if waittime <= 0:
                        break
            self.wait(waittime)
            result = predicate()
        return result

    def notify(self, n: int = 1) -> None:
        """Wake up to ``n`` waiters (the caller must hold the lock)."""
        if not self._is_owned():
            raise RuntimeError("cannot notify on un-acquired lock")
        self._call("notify", [n])

    def notify_all(self) -> None:
        """Wake every waiter (the caller must hold the lock)."""
        if not self._is_owned():
            raise RuntimeError("cannot notify on un-acquired lock")
        self._call("notify_all", [])

    notifyAll = notify_all


def _attach_barrier(key: str, action: Optional[Callable[[], Any]]) -> "Barrier":
    barrier = Barrier._attach(key)
    barrier._action = action
    return barrier


class Barrier(Proxy, type_name="Barrier"):
    """A cyclic barrier for ``parties`` callers, like ``threading.Barrier``.

    ``action`` runs in the last caller to arrive, before the others are released; if it
    raises, the barrier breaks and the exception propagates to that caller.
    """

    def __init__(
        self,
        parties: int,
        action: Optional[Callable[[], Any]] = None,
        timeout: Optional[float] = None,
        *,
        name: Optional[str] = None,
        persistent: bool = False,
    ) -> None:
        if parties < 1:
            raise ValueError("parties must be >= 1")
        self._action = action
        self._init([parties, action is not None, _timeout(timeout)], name, persistent)

    def _attached(self) -> None:
        self._action = None

    def __reduce__(self) -> Any:
        return (_attach_barrier, (self._key, self._action))

    def wait(self, timeout: Optional[float] = None) -> int:
        """Wait for all parties; return this caller's arrival index (0 to parties - 1)."""
        index = self._call("wait", [_timeout(timeout)], True)
        if isinstance(index, list):  # [index, generation]: we arrived last, run the action
            index, generation = index
            try:
                if self._action is not None:
                    self._action()
            except BaseException:
                self._call("action_done", [generation, False])
                raise
            self._call("action_done", [generation, True])
        return index

    def reset(self) -> None:
        """Return the barrier to its initial state; waiting parties get BrokenBarrierError."""
        self._call("reset", [])

    def abort(self) -> None:
        """Break the barrier until :meth:`reset`."""
        self._call("abort", [])

    def _info(self) -> Any:
        return self._call("info", [])

    @property
    def parties(self) -> int:
        return self._info()["parties"]

    @property
    def n_waiting(self) -> int:
        return self._info()["n_waiting"]

    @property
    def broken(self) -> bool:
        return self._info()["broken"]


class CountDownLatch(Proxy, type_name="CountDownLatch"):
    """A one-shot gate: ``wait`` returns once ``count_down`` was called ``count`` times."""

    def __init__(
        self, count: int, *, name: Optional[str] = None, persistent: bool = False
    ) -> None:
        if count < 0:
            raise ValueError("count must be >= 0")
        self._init([count], name, persistent)

    def count_down(self) -> int:
        """Decrement the count (never below 0); return what remains."""
        return self._call("count_down", [])

    @property
    def count(self) -> int:
        return self._call("count", [])

    def wait(self, timeout: Optional[float] = None) -> bool:
        """Wait for the count to reach 0; False on timeout (a negative one: do not wait)."""
        args = [_timeout(timeout)]
        return self._call("wait", args, _parks(args))
