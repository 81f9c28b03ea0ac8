"""``multiprocessing.Pool`` and ``multiprocessing.pool.ThreadPool`` whose tasks run as cloud
functions, on a :class:`spindle.Executor` bounded to ``processes`` calls in flight.

The methods are ``multiprocessing``'s: ``apply``, ``apply_async``, ``map``, ``map_async``,
``starmap``, ``starmap_async``, ``imap``, ``imap_unordered``, ``close``, ``terminate``,
``join`` and the context manager (which terminates on exit, as the standard library's).
``map`` cuts its input into chunks as the standard library does (four per process when
``chunksize`` is not given), each chunk one cloud function. ``processes`` defaults to
``cpu_count()``: the server's worker pool size. ``initializer(*initargs)`` runs once in
each worker process before its first task of the pool. ``terminate`` stops the tasks at
once, running or not (the workers running them are killed); where the standard library's
unfinished results never arrive, here they raise ``concurrent.futures.CancelledError``.
"""

from __future__ import annotations

import builtins
import collections
import concurrent.futures
import queue as _queue
import threading
from multiprocessing import TimeoutError
from typing import Any, Callable, Deque, Iterable, List, Optional, Sequence

from ..compute.executor import Executor
from ..compute.initializer import Initializer
from ..compute.invoker import Invocation

RUN, CLOSE, TERMINATE = "RUN", "CLOSE", "TERMINATE"


def _run_chunk(fn: Callable[..., Any], chunk: Sequence[Any], star: bool) -> List[Any]:
    return [fn(*args) for args in chunk] if star else [fn(item) for item in chunk]


def _concatenated(chunks: List[List[Any]]) -> List[Any]:
    return [item for chunk in chunks for item in chunk]


class ApplyResult:
    """The result of one or more tasks (``multiprocessing.pool.AsyncResult``): ready when
    every task ended, or as soon as one failed."""

    def __init__(self, futures: List[Invocation], combine: Callable[[List[Any]], Any],
                 callback: Optional[Callable[[Any], Any]] = None,
                 error_callback: Optional[Callable[[BaseException], Any]] = None) -> None:
        self._futures = futures
        self._combine = combine
        self._callback, self._error_callback = callback, error_callback
        self._lock = threading.Lock()
        self._remaining = len(futures)
        self._settled = False
        self._ready = threading.Event()
        self._value: Any = None
        self._error: Optional[BaseException] = None
        if not futures:
            self._settle(None)
        for future in futures:
            future.add_done_callback(self._task_done)

    def _task_done(self, future: Invocation) -> None:
        error = _error_of(future)
        with self._lock:
            if self._settled:
                return
            self._remaining -= 1
            if error is None and self._remaining:
                return
            self._settled = True
        self._settle(error)

    def _settle(self, error: Optional[BaseException]) -> None:
        if error is None:
            try:
                self._value = self._combine([f.result() for f in self._futures])
            except BaseException as exc:
                error = exc
        self._error = error
        self._ready.set()
        callback = self._callback if error is None else self._error_callback
        if callback is not None:
            callback(self._value if error is None else error)

    def ready(self) -> bool:
        return self._ready.is_set()

    def successful(self) -> bool:
        if not self.ready():
            raise ValueError(f"{self!r} not ready")
        return self._error is None

    def wait(self, timeout: Optional[float] = None) -> None:
        self._ready.wait(timeout)

    def get(self, timeout: Optional[float] = None) -> Any:
        """The result, waiting up to ``timeout`` (``multiprocessing.TimeoutError``); re-raises
        a task's exception."""
        if not self._ready.wait(timeout):
            raise TimeoutError
        if self._error is not None:
            raise self._error
        return self._value


AsyncResult = ApplyResult
MapResult = ApplyResult


def _error_of(future: Invocation) -> Optional[BaseException]:
    if future.cancelled():
        return concurrent.futures.CancelledError("the task was stopped by terminate()")
    return future.exception()


class IMapIterator:
    """The iterator of ``imap`` (in order) or ``imap_unordered`` (as chunks end); ``next``
    takes a timeout (``multiprocessing.TimeoutError``)."""

    def __init__(self, futures: List[Invocation], ordered: bool) -> None:
        self._items: Deque[Any] = collections.deque()
        self._left = len(futures)
        self._current: Optional[Invocation] = None  # the chunk being waited for
        self._order = iter(futures)
        self._done: Optional["_queue.Queue[Invocation]"] = None
        if not ordered:
            self._done = _queue.Queue()
            for future in futures:
                future.add_done_callback(self._done.put)

    def __iter__(self) -> "IMapIterator":
        return self

    def _next_chunk(self, timeout: Optional[float]) -> Invocation:
        if self._done is None:
            return next(self._order)
        try:
            return self._done.get(timeout=timeout)
        except _queue.Empty:
            raise TimeoutError from None

    def next(self, timeout: Optional[float] = None) -> Any:
        while not self._items:
            if self._current is None:
                if not self._left:
                    raise StopIteration
                self._current = self._next_chunk(timeout)
            future = self._current
            try:
                chunk = future.result(timeout)
            except builtins.TimeoutError:
                if not future.done():  # our wait timed out, not the task
                    raise TimeoutError from None
                self._current, self._left = None, self._left - 1
                raise
            except BaseException:
                self._current, self._left = None, self._left - 1
                raise
            self._current, self._left = None, self._left - 1
            self._items.extend(chunk)
        return self._items.popleft()

    __next__ = next


class Pool:
    """``multiprocessing.Pool(processes, initializer, initargs, maxtasksperchild, context)``;
    see the module docstring."""

    _label = "PoolWorker"

    def __init__(self, processes: Optional[int] = None,
                 initializer: Optional[Callable[..., Any]] = None, initargs: Iterable[Any] = (),
                 maxtasksperchild: Optional[int] = None, context: Any = None) -> None:
        if processes is None:
            from . import cpu_count

            processes = cpu_count()
        if processes < 1:
            raise ValueError("Number of processes must be at least 1")
        if maxtasksperchild is not None and (
                not isinstance(maxtasksperchild, int) or maxtasksperchild <= 0):
            raise ValueError("maxtasksperchild must be a positive int or None")
        self._processes = processes
        self._initializer = Initializer(initializer, initargs)
        self._executor = Executor(max_workers=processes, label=self._label)
        self._state = RUN

    def _check_running(self) -> None:
        if self._state != RUN:
            raise ValueError("Pool not running")

    def _submit(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Invocation:
        return self._executor.submit(self._initializer.wrap(fn), *args, **kwargs)

    def _chunks(self, fn: Callable[..., Any], iterable: Iterable[Any],
                chunksize: Optional[int], star: bool) -> List[Invocation]:
        self._check_running()
        items = list(iterable)
        if chunksize is None:
            chunksize, extra = divmod(len(items), self._processes * 4)
            if extra:
                chunksize += 1
        chunksize = max(chunksize, 1)
        return [self._submit(_run_chunk, fn, items[i:i + chunksize], star)
                for i in range(0, len(items), chunksize)]

    def apply(self, func: Callable[..., Any], args: Iterable[Any] = (), kwds: Any = None) -> Any:
        return self.apply_async(func, args, kwds).get()

    def apply_async(self, func: Callable[..., Any], args: Iterable[Any] = (), kwds: Any = None,
                    callback: Optional[Callable[[Any], Any]] = None,
                    error_callback: Optional[Callable[[BaseException], Any]] = None
                    ) -> ApplyResult:
        self._check_running()
        future = self._submit(func, *args, **(kwds or {}))
        return ApplyResult([future], lambda results: results[0], callback, error_callback)

    def map(self, func: Callable[[Any], Any], iterable: Iterable[Any],
            chunksize: Optional[int] = None) -> List[Any]:
        return self.map_async(func, iterable, chunksize).get()

    def map_async(self, func: Callable[[Any], Any], iterable: Iterable[Any],
                  chunksize: Optional[int] = None, callback: Optional[Callable[[Any], Any]] = None,
                  error_callback: Optional[Callable[[BaseException], Any]] = None) -> MapResult:
        futures = self._chunks(func, iterable, chunksize, False)
        return MapResult(futures, _concatenated, callback, error_callback)

    def starmap(self, func: Callable[..., Any], iterable: Iterable[Iterable[Any]],
                chunksize: Optional[int] = None) -> List[Any]:
        return self.starmap_async(func, iterable, chunksize).get()

    def starmap_async(self, func: Callable[..., Any], iterable: Iterable[Iterable[Any]],
                      chunksize: Optional[int] = None,
                      callback: Optional[Callable[[Any], Any]] = None,
                      error_callback: Optional[Callable[[BaseException], Any]] = None
                      ) -> MapResult:
        futures = self._chunks(func, iterable, chunksize, True)
        return MapResult(futures, _concatenated, callback, error_callback)

    def imap(self, func: Callable[[Any], Any], iterable: Iterable[Any],
             chunksize: int = 1) -> IMapIterator:
        if chunksize < 1:
            raise ValueError(f"Chunksize must be 1+, not {chunksize:n}")
        return IMapIterator(self._chunks(func, iterable, chunksize, False), ordered=True)

    def imap_unordered(self, func: Callable[[Any], Any], iterable: Iterable[Any],
                       chunksize: int = 1) -> IMapIterator:
        if chunksize < 1:
            raise ValueError(f"Chunksize must be 1+, not {chunksize:n}")
        return IMapIterator(self._chunks(func, iterable, chunksize, False), ordered=False)

    def close(self) -> None:
        """No more tasks; those submitted still run."""
        if self._state == RUN:
            self._state = CLOSE
            self._executor.shutdown(wait=False)

    def terminate(self) -> None:
        """No more tasks; stop those submitted, running or not. Returns once the workers
        that ran them are gone, as the standard library's joins its killed processes."""
        self._state = TERMINATE
        self._executor.shutdown(wait=True, kill_running=True)

    def join(self) -> None:
        """Wait for the submitted tasks (after :meth:`close` or :meth:`terminate`)."""
        if self._state == RUN:
            raise ValueError("Pool is still running")
        self._executor.shutdown(wait=True)

    def __enter__(self) -> "Pool":
        self._check_running()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.terminate()

    def __reduce__(self) -> Any:
        raise NotImplementedError(
            "pool objects cannot be passed between processes or pickled")

    def __repr__(self) -> str:
        return f"<spindle.multiprocessing.pool.{type(self).__name__} state={self._state} " \
               f"pool_size={self._processes}>"


class ThreadPool(Pool):
    """``multiprocessing.pool.ThreadPool(processes, initializer, initargs)``: the same pool
    (a thread pool's tasks share no memory with this process here either)."""

    _label = "ThreadPoolWorker"

    def __init__(self, processes: Optional[int] = None,
                 initializer: Optional[Callable[..., Any]] = None,
                 initargs: Iterable[Any] = ()) -> None:
        super().__init__(processes, initializer, initargs)


__all__ = ["Pool", "ThreadPool"]
