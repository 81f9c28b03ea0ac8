"""``spindle.threading.local``: per-thread attributes, as ``threading.local``, for cloud threads.

Within one process it behaves as the standard library's: each thread sees its own
attributes, and a subclass's ``__init__`` runs again (with the constructor's arguments) the
first time a thread touches the object. What a cloud thread adds:

- the object can be pickled (``threading.local`` cannot), so a function that uses one can
  run as a cloud thread; it arrives empty, as it is for any thread that did not set it yet;
- a worker process runs many cloud threads one after the other on the same OS thread: each
  of them gets fresh attributes, never those its predecessor left (the per-call session
  state of the worker's client, ``Client._state``, tells the calls apart).

The design is CPython's ``_threading_local``: the instance's ``__dict__`` is swapped for the
calling thread's under a lock at every attribute access.
"""

from __future__ import annotations

import os
import threading
from typing import Any, Dict, Tuple

from . import client as _client_mod

# Only in a function worker does one OS thread run several cloud threads in turn.
_IN_WORKER = bool(os.environ.get("SPINDLE_WORKER_ID"))


def _cloud_call() -> Any:
    """What identifies the cloud call running now: the worker client's per-call state (None
    outside a worker, where an OS thread is the whole thread)."""
    if not _IN_WORKER:
        return None
    client = _client_mod._client
    return None if client is None else client._state


class _Slots:
    """One local's bookkeeping: its constructor arguments and each thread's attributes."""

    __slots__ = ("args", "kwargs", "per_thread", "lock")

    def __init__(self, args: Tuple[Any, ...], kwargs: Dict[str, Any]) -> None:
        self.args, self.kwargs = args, kwargs
        self.per_thread = threading.local()  # .call, .attrs: dropped when the thread ends
        self.lock = threading.RLock()


def _rebuild(cls: type, args: Tuple[Any, ...], kwargs: Dict[str, Any]) -> "local":
    return cls(*args, **kwargs)


class local:
    """Thread-local data; see the module docstring."""

    __slots__ = ("_local__slots", "__dict__")

    def __new__(cls, *args: Any, **kwargs: Any) -> "local":
        if (args or kwargs) and cls.__init__ is object.__init__:
            raise TypeError("Initialization arguments are not supported")
        self = object.__new__(cls)
        slots = _Slots(args, kwargs)
        object.__setattr__(self, "_local__slots", slots)
        slots.per_thread.call = _cloud_call()
        slots.per_thread.attrs = object.__getattribute__(self, "__dict__")
        return self

    def __getattribute__(self, name: str) -> Any:
        with _Patched(self):
            return object.__getattribute__(self, name)

    def __setattr__(self, name: str, value: Any) -> None:
        if name == "__dict__":
            raise AttributeError(
                f"{type(self).__name__!r} object attribute '__dict__' is read-only")
        with _Patched(self):
            object.__setattr__(self, name, value)

    def __delattr__(self, name: str) -> None:
        if name == "__dict__":
            raise AttributeError(
                f"{type(self).__name__!r} object attribute '__dict__' is read-only")
        with _Patched(self):
            object.__delattr__(self, name)

    def __reduce__(self) -> Any:
        # Ships as a fresh local: attributes belong to the threads that set them.
        slots = object.__getattribute__(self, "_local__slots")
        return (_rebuild, (type(self), slots.args, slots.kwargs))


class _Patched:
    """Holds the local's lock with the calling thread's attributes as its ``__dict__``,
    creating them (and running ``__init__``) on the thread's, or cloud call's, first use."""

    __slots__ = ("obj", "slots")

    def __init__(self, obj: local) -> None:
        self.obj = obj
        self.slots = object.__getattribute__(obj, "_local__slots")

    def __enter__(self) -> None:
        slots, obj = self.slots, self.obj
        slots.lock.acquire()
        try:
            call = _cloud_call()
            mine = slots.per_thread
            fresh = getattr(mine, "call", _MISSING) is not call or not hasattr(mine, "attrs")
            if fresh:
                mine.call, mine.attrs = call, {}
            object.__setattr__(obj, "__dict__", mine.attrs)
            if fresh and type(obj).__init__ is not object.__init__:
                type(obj).__init__(obj, *slots.args, **slots.kwargs)
        except BaseException:
            slots.lock.release()
            raise

    def __exit__(self, *exc: Any) -> None:
        self.slots.lock.release()


_MISSING = object()
