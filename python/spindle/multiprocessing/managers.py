"""``multiprocessing.Manager()``: its ``dict()``, ``list()``, ``Namespace()``, queues, locks and
values are Spindle objects, shared with cloud functions (and named ones with any program).
There is no manager process: ``start``, ``connect``, ``shutdown`` and ``join`` have nothing
to do, and the objects live as long as this program's session (or their name)."""

from __future__ import annotations

import builtins
from typing import Any, Optional

from .. import data
from .. import sync
from ..queues import Queue


class Namespace:
    """Attributes kept in a shared :class:`spindle.Dict` (those starting with ``_`` stay in
    this proxy, as with ``multiprocessing``'s namespace proxies)."""

    def __init__(self, **kwds: Any) -> None:
        object.__setattr__(self, "_values", data.Dict(kwds))

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        try:
            return self._values[name]
        except KeyError:
            raise AttributeError(f"'Namespace' object has no attribute {name!r}") from None

    def __setattr__(self, name: str, value: Any) -> None:
        if name.startswith("_"):
            object.__setattr__(self, name, value)
        else:
            self._values[name] = value

    def __delattr__(self, name: str) -> None:
        if name.startswith("_"):
            object.__delattr__(self, name)
            return
        try:
            del self._values[name]
        except KeyError:
            raise AttributeError(name) from None

    def __repr__(self) -> str:
        items = ", ".join(f"{k}={v!r}" for k, v in sorted(self._values.items()))
        return f"Namespace({items})"


class SyncManager:
    """``multiprocessing.managers.SyncManager``'s object factories, as Spindle objects."""

    def __init__(self, address: Any = None, authkey: Optional[bytes] = None,
                 serializer: str = "pickle", ctx: Any = None, **_: Any) -> None:
        self.address = address

    def start(self, initializer: Any = None, initargs: Any = ()) -> None:
        if initializer is not None:
            initializer(*initargs)

    def connect(self) -> None:
        """Nothing to connect: the objects connect to the server on use."""

    def shutdown(self) -> None:
        """Nothing to stop: the objects live in the server."""

    def join(self, timeout: Optional[float] = None) -> None:
        """No manager process to wait for."""

    def __enter__(self) -> "SyncManager":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.shutdown()

    def dict(self, *args: Any, **kwargs: Any) -> data.Dict:
        return data.Dict(builtins.dict(*args, **kwargs))

    def list(self, sequence: Any = ()) -> data.List:
        return data.List(sequence)

    def Namespace(self, **kwds: Any) -> Namespace:
        return Namespace(**kwds)

    def Value(self, typecode: Any, value: Any, lock: bool = True) -> data.Value:
        return data.Value(value)

    def Array(self, typecode: Any, sequence: Any, lock: bool = True) -> data.List:
        return data.List(sequence)

    def Queue(self, maxsize: int = 0) -> Queue:
        return Queue(maxsize)

    JoinableQueue = Queue

    def Lock(self) -> sync.Lock:
        return sync.Lock()

    def RLock(self) -> sync.RLock:
        return sync.RLock()

    def Semaphore(self, value: int = 1) -> sync.Semaphore:
        return sync.Semaphore(value)

    def BoundedSemaphore(self, value: int = 1) -> sync.BoundedSemaphore:
        return sync.BoundedSemaphore(value)

    def Condition(self, lock: Any = None) -> sync.Condition:
        return sync.Condition(lock)

    def Event(self) -> sync.Event:
        return sync.Event()

    def Barrier(self, parties: int, action: Any = None,
                timeout: Optional[float] = None) -> sync.Barrier:
        return sync.Barrier(parties, action, timeout)

    def Pool(self, processes: Optional[int] = None, *args: Any, **kwargs: Any) -> Any:
        from .pool import Pool

        return Pool(processes, *args, **kwargs)


def Manager() -> SyncManager:
    """A started manager (see the module docstring)."""
    manager = SyncManager()
    manager.start()
    return manager
