"""Queues, drop-in for ``queue.Queue``, ``queue.LifoQueue`` and ``queue.PriorityQueue``.

``get``/``put`` block in the server and raise ``queue.Empty`` / ``queue.Full`` exactly as the
standard library does. ``PriorityQueue`` orders items by Spindle's value order (Python's, for
numbers, strings and tuples) and returns tuple items as tuples.
"""

from __future__ import annotations

from typing import Any, List, Optional

from . import proxy as _proxy
from .proxy import Proxy


def _block_args(block: bool, timeout: Optional[float]) -> List[Any]:
    if not block:
        return [False, None]
    if timeout is not None and timeout < 0:
        raise ValueError("'timeout' must be a non-negative number")
    return [True, timeout]


class Queue(Proxy, type_name="Queue"):
    """A FIFO queue; ``maxsize <= 0`` means unbounded. ``persistent=True``: see
    :mod:`spindle.data` (items survive a crash; callers waiting in ``get`` do not)."""

    def __init__(
        self, maxsize: int = 0, *, name: Optional[str] = None, persistent: bool = False
    ) -> None:
        self._init([maxsize], name, persistent)

    def put(self, item: Any, block: bool = True, timeout: Optional[float] = None) -> None:
        """Put ``item``, waiting for a free slot if needed; ``queue.Full`` on timeout."""
        if block and timeout is not None and timeout < 0 and self.maxsize <= 0:
            timeout = None  # as queue.Queue: an unbounded put never waits, nor checks timeout
        # In a shared object's method, only a put that could really wait is refused: one into
        # a bounded queue (an unbounded queue always has room).
        waits = (block and timeout != 0 and _proxy.running_method is not None
                 and self.maxsize > 0)
        self._call("put", [item] + _block_args(block, timeout), waits)

    def get(self, block: bool = True, timeout: Optional[float] = None) -> Any:
        """Remove and return an item, waiting if needed; ``queue.Empty`` on timeout."""
        return self._call("get", _block_args(block, timeout), block and timeout != 0)

    def put_nowait(self, item: Any) -> None:
        self._call("put", [item, False, None])

    def get_nowait(self) -> Any:
        return self.get(False)

    def qsize(self) -> int:
        return self._call("qsize", [])

    def empty(self) -> bool:
        return self._call("empty", [])

    def full(self) -> bool:
        return self._call("full", [])

    @property
    def maxsize(self) -> int:
        return self._call("maxsize", [])

    def task_done(self) -> None:
        """Mark one item as processed; ``ValueError`` if called more often than ``put``."""
        self._call("task_done", [])

    def join(self, timeout: Optional[float] = None) -> bool:
        """Wait until every item put was marked done; False on timeout (a Spindle addition:
        ``queue.Queue.join`` takes no timeout). A negative timeout does not wait."""
        if timeout is not None and timeout < 0:
            timeout = 0
        return self._call("join", [timeout], timeout != 0)


class LifoQueue(Queue, type_name="LifoQueue"):
    """A LIFO queue (a stack)."""


class PriorityQueue(Queue, type_name="PriorityQueue"):
    """A queue that returns the lowest item first (equal items in FIFO order)."""


class SimpleQueue(Queue):
    """An unbounded FIFO queue with ``queue.SimpleQueue``'s methods (``put``, ``get``,
    ``put_nowait``, ``get_nowait``, ``empty``, ``qsize``); it is a ``Queue`` in the server."""

    def __init__(self, *, name: Optional[str] = None, persistent: bool = False) -> None:
        super().__init__(0, name=name, persistent=persistent)
