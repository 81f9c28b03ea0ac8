"""``multiprocessing``'s queues as Spindle queues: ``Queue`` and ``JoinableQueue`` (with
``close``, ``join_thread`` and ``cancel_join_thread``, which have nothing to do: there is no
feeder thread, every ``put`` is in the server when it returns) and ``SimpleQueue``."""

from __future__ import annotations

from typing import Optional

from .. import queues
from .synchronize import TravelsAsItself


class Queue(TravelsAsItself, queues.Queue):
    """A shared FIFO queue with ``multiprocessing.Queue``'s methods."""

    def close(self) -> None:
        """Nothing to flush: puts are in the server already."""

    def join_thread(self) -> None:
        """No feeder thread to wait for."""

    def cancel_join_thread(self) -> None:
        """No feeder thread to abandon."""


class JoinableQueue(Queue):
    """A shared queue with ``task_done`` and ``join``."""


class SimpleQueue(TravelsAsItself, queues.SimpleQueue):
    """A shared unbounded queue with ``multiprocessing.SimpleQueue``'s methods."""

    def __init__(self, *, ctx: Optional[object] = None, name: Optional[str] = None) -> None:
        super().__init__(name=name)

    def close(self) -> None:
        """Nothing to release here: the queue lives in the server."""
