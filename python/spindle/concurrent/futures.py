"""``from spindle.concurrent import futures``: ``concurrent.futures`` whose executors run
their calls as cloud functions, so that porting is a change of imports.

``ThreadPoolExecutor`` and ``ProcessPoolExecutor`` are both :class:`spindle.Executor`: the
calls run in the server's worker processes, whichever the program asked for (a thread pool's
calls cannot share this process's memory either way: what they share goes in Spindle objects).
``max_workers`` bounds the calls in flight (None: the server's pool decides) and
``initializer(*initargs)`` runs once in each worker process before its first call of the pool.
``mp_context`` and ``max_tasks_per_child`` are accepted and have no effect: workers are the
server's.

``Future`` is the standard library's class, the type of the futures the executors return, so
``isinstance`` checks, ``wait`` and ``as_completed`` work unchanged (:class:`spindle.Future`
is the future that lives in the server, for setting a result from another process).
Every other name is the standard library's (tests/test_mirrors.py checks that none is missing).
"""

from __future__ import annotations

import concurrent.futures as _std
from typing import Any, Callable, Optional

from ..compute.executor import Executor
from ..compute.initializer import Initializer
from ..compute.invoker import Invocation

ALL_COMPLETED = _std.ALL_COMPLETED
FIRST_COMPLETED = _std.FIRST_COMPLETED
FIRST_EXCEPTION = _std.FIRST_EXCEPTION
BrokenExecutor = _std.BrokenExecutor
CancelledError = _std.CancelledError
Future = _std.Future
InvalidStateError = _std.InvalidStateError
TimeoutError = _std.TimeoutError
as_completed = _std.as_completed
wait = _std.wait


class _PoolExecutor(Executor):
    """An executor with a pool's initializer."""

    def __init__(self, max_workers: Optional[int], label: str,
                 initializer: Optional[Callable[..., Any]], initargs: Any) -> None:
        super().__init__(max_workers, label=label)
        self._initializer = Initializer(initializer, initargs)

    def _submit(self, fn: Callable[..., Any], args: tuple, kwargs: dict, label: str) -> Invocation:
        return super()._submit(self._initializer.wrap(fn), args, kwargs, label)


class ThreadPoolExecutor(_PoolExecutor):
    """``concurrent.futures.ThreadPoolExecutor``'s arguments; calls run as cloud functions
    (their echoed output is prefixed with ``thread_name_prefix``)."""

    def __init__(self, max_workers: Optional[int] = None, thread_name_prefix: str = "",
                 initializer: Optional[Callable[..., Any]] = None, initargs: Any = ()) -> None:
        super().__init__(max_workers, thread_name_prefix or "ThreadPoolExecutor", initializer,
                         initargs)


class ProcessPoolExecutor(_PoolExecutor):
    """``concurrent.futures.ProcessPoolExecutor``'s arguments; calls run as cloud functions."""

    def __init__(self, max_workers: Optional[int] = None, mp_context: Any = None,
                 initializer: Optional[Callable[..., Any]] = None, initargs: Any = (), *,
                 max_tasks_per_child: Optional[int] = None) -> None:
        if max_tasks_per_child is not None and max_tasks_per_child < 1:
            raise ValueError("max_tasks_per_child must be >= 1")
        super().__init__(max_workers, "ProcessPoolExecutor", initializer, initargs)


__all__ = [
    "ALL_COMPLETED", "BrokenExecutor", "CancelledError", "Executor", "FIRST_COMPLETED",
    "FIRST_EXCEPTION", "Future", "InvalidStateError", "ProcessPoolExecutor",
    "ThreadPoolExecutor", "TimeoutError", "as_completed", "wait",
]
