"""spindle.Executor: a ``concurrent.futures.Executor`` whose calls run as Spindle functions.

```python
with spindle.Executor(max_workers=64, retries=2) as ex:
    squares = list(ex.map(pow, range(100), [2] * 100))
    fut = ex.submit(work, chunk)
    fut.result(); fut.stdout; fut.report["cold"]
```

Retries and exactly-once: a call that fails (the function raises, its worker crashes, or it
runs past its timeout) is run again, up to ``retries`` more times, after ``backoff``. Each
call runs as a session of its own, and its retries repeat that session's call numbers, so
the shared-object calls the failed attempt already made are answered from the server's
record instead of being applied again (docs/protocol.md, "Sessions"). Iterative code that
keeps its progress in shared objects (an iteration ``Counter``, a ``Barrier``) therefore
resumes where it failed, as in CRUCIAL. This holds as long as the retry issues the same
object calls in the same order up to the point of failure, and is retried within the
server's session TTL (``--session-ttl``, default 5 s).
"""

from __future__ import annotations

import collections
import concurrent.futures
import itertools
import math
import os
import threading
import time
from typing import Any, Callable, Deque, Iterable, Iterator, List, Optional, Set

from .. import client as _client_mod
from . import batch, progress
from .call import Backoff, Call, call_options, keep_alive
from .invoker import MAX_ARGUMENT, Invocation, on_reader_thread

# Batches per worker that ``map`` aims at (as ``multiprocessing.Pool``'s chunk size): enough
# that a slow batch does not leave the other workers idle at the end.
BATCHES_PER_WORKER = 4


def default_workers() -> int:
    """The gateway's default pool size: 8 workers per core."""
    return 8 * (os.cpu_count() or 1)


def _chunks(items: List[Any], size: int) -> List[List[Any]]:
    return [items[i:i + size] for i in range(0, len(items), size)]


class Executor(concurrent.futures.Executor):
    """Runs calls as Spindle functions (``concurrent.futures.Executor``).

    - ``max_workers``: at most this many of this executor's calls in flight (None: no bound
      here; the server's pool still queues what it cannot run yet);
    - ``retries``, ``backoff``: run a failed call again up to ``retries`` times, waiting
      ``backoff * 2 ** (n - 1)`` seconds (or ``backoff(n)`` for a callable) before retry n;
    - ``timeout``, ``memory_mb``: per-call limits enforced by the gateway
      (``spindle.FunctionTimeout``, ``spindle.WorkerCrashed``);
    - ``echo``: print each function's stdout/stderr here, prefixed with ``[task N]``;
    - ``max_argument``: the largest pickled argument accepted (1 MiB; larger data belongs in
      a ``spindle.Blob``/``spindle.Array`` or a file). None lifts the check (the joblib
      backend does, since scikit-learn passes its data inline);
    - ``progress``: a progress bar for a long ``map`` (None: when stderr is a terminal and
      ``$SPINDLE_PROGRESS`` is not 0; needs tqdm).

    Futures are :class:`spindle.Invocation` objects (``stdout``, ``stderr``, ``report``).
    """

    def __init__(
        self,
        max_workers: Optional[int] = None,
        retries: int = 0,
        backoff: Backoff = 0.1,
        *,
        timeout: Optional[float] = None,
        memory_mb: Optional[int] = None,
        echo: bool = True,
        label: str = "task",
        max_argument: Optional[int] = MAX_ARGUMENT,
        progress: Optional[bool] = None,
    ) -> None:
        if max_workers is not None and max_workers <= 0:
            raise ValueError("max_workers must be greater than 0")
        if retries < 0:
            raise ValueError("retries must be >= 0")
        self.max_workers = max_workers
        self.retries = retries
        self.backoff = backoff
        self.timeout = timeout
        self.memory_mb = memory_mb
        self.echo = echo
        self.label = label
        self.max_argument = max_argument
        self.progress = progress
        self._numbers = itertools.count()
        self._lock = threading.Lock()
        self._waiting: Deque[Call] = collections.deque()  # beyond max_workers, not yet sent
        self._in_flight = 0
        self._cores: Optional[int] = None  # the server's, and its pool's size: see _capacity
        self._pool = 0
        self._futures: Set[Invocation] = set()
        self._shutdown = False
        call_options(timeout, memory_mb, "")  # validate now

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Invocation:
        """Run ``fn(*args, **kwargs)`` as a function; return its future."""
        return self._submit(fn, args, kwargs, f"{self.label} {next(self._numbers)}")

    def _submit(self, fn: Callable[..., Any], args: tuple, kwargs: dict, label: str) -> Invocation:
        if self._shutdown:
            raise RuntimeError("cannot schedule new futures after shutdown")
        future = Invocation(label)
        call = Call(
            future, fn, args, kwargs,
            options=call_options(self.timeout, self.memory_mb, label),
            retries=self.retries, backoff=self.backoff, echo=self.echo, limit=self.max_argument,
        )
        with self._lock:
            if self._shutdown:
                raise RuntimeError("cannot schedule new futures after shutdown")
            self._futures.add(future)
            keep_alive(future)
            bounded = self.max_workers is not None and self._in_flight >= self.max_workers
            if bounded:
                self._waiting.append(call)
            else:
                self._in_flight += 1
        future.add_done_callback(self._forget)
        if not bounded:
            self._dispatch(call)
        return future

    def _dispatch(self, call: Call) -> None:
        call.future.add_done_callback(self._release)
        call.start()

    def _release(self, future: Invocation) -> None:
        """A dispatched call ended: send the next waiting one, if any."""
        while True:
            with self._lock:
                if not self._waiting:
                    self._in_flight -= 1
                    return
                call = self._waiting.popleft()
            if not call.future.done():  # skip those cancelled while waiting
                self._dispatch(call)
                return

    def _forget(self, future: Invocation) -> None:
        with self._lock:
            self._futures.discard(future)

    def map(
        self,
        fn: Callable[..., Any],
        *iterables: Iterable[Any],
        timeout: Optional[float] = None,
        chunksize: Optional[int] = None,
    ) -> Iterator[Any]:
        """Like ``concurrent.futures``: the results in order, a task's exception raised where
        its result would be; ``chunksize`` tasks per function call.

        Without ``chunksize``, tasks that could all run at once (no more than ``max_workers``,
        else the gateway's pool) get one call each, since they may wait for each other as
        threads do; more go in batches, since a call costs far more than a tiny task:
        ``BATCHES_PER_WORKER`` per worker that can run at once, but at most per server core.
        One call per task when the executor has ``retries`` or a per-call ``timeout``, which
        apply to each task. A batch whose results cannot be pickled, or whose worker crashes,
        fails each of its tasks.
        """
        if chunksize is not None and chunksize < 1:
            raise ValueError("chunksize must be >= 1.")
        # One iterable (the common map): its items as they are, each one task's argument, with
        # no tuple per task to build and pickle.
        one = len(iterables) == 1
        items: List[Any] = list(iterables[0]) if one else list(zip(*iterables))
        if chunksize is None:
            chunksize = self._batch_size(len(items))
        end = None if timeout is None else timeout + time.monotonic()
        bar = progress.bar(len(items), self.label, self.progress)
        calls: List[Invocation] = []
        try:
            for chunk in _chunks(items, chunksize):
                if chunksize == 1:
                    call = self.submit(fn, chunk[0]) if one else self.submit(fn, *chunk[0])
                else:
                    call = self._submit(batch.run_each, (fn, chunk, one), {},
                                        f"{self.label} {next(self._numbers)}")
                call.add_done_callback(lambda _, n=len(chunk): bar.update(n))
                calls.append(call)
        except BaseException:
            for call in calls:
                call.cancel()
            bar.close()
            raise
        return self._results(calls, chunksize == 1, end, bar)

    def _batch_size(self, tasks: int) -> int:
        if self.retries or self.timeout is not None:
            return 1
        slots, cores = self._capacity()
        if tasks <= slots:
            return 1  # they could all run at once, and may wait for each other as threads do
        return max(1, math.ceil(tasks / (BATCHES_PER_WORKER * min(slots, cores))))

    def _capacity(self) -> tuple[int, int]:
        """How many of this executor's calls run at once (``max_workers``, else the server's
        pool) and the server's cores. The pool outnumbers the cores for functions that wait;
        a batch runs its tasks one after another anyway, so more batches than the cores would
        only add calls."""
        if self._cores is None:
            status = _client_mod.current().status()
            self._cores = int(status.get("cores") or os.cpu_count() or 1)
            self._pool = int(status.get("max_workers") or default_workers())
        return self.max_workers or self._pool, self._cores

    @staticmethod
    def _results(calls: List[Invocation], single: bool, end: Optional[float], bar: Any) -> Iterator[Any]:
        # A generator apart from map(), so that map() submits at once, as the stdlib's does;
        # closing it early cancels what has not started.
        try:
            calls.reverse()
            while calls:
                call = calls[-1]
                value = call.result() if end is None else call.result(end - time.monotonic())
                calls.pop()
                if single:
                    yield value
                else:
                    yield from batch.results(value)
        finally:
            for call in calls:
                call.cancel()
            bar.close()

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False,
                 kill_running: bool = False) -> None:
        """No new calls; with ``cancel_futures``, withdraw the calls that have not started
        (waiting here or queued in the server); with ``kill_running``, those and the calls
        that run (their workers are killed, and their futures end cancelled); with ``wait``,
        wait for every call to end (a killed one ends once its worker is gone), unless
        called from a done-callback, whose thread must go on reading the calls' replies."""
        with self._lock:
            self._shutdown = True
            futures = list(self._futures)
        if cancel_futures or kill_running:
            with self._lock:
                waiting = list(self._waiting)
            for call in waiting:
                call.future.cancel()
            for future in futures:
                if not future.done():
                    if kill_running:
                        future.kill()
                    else:
                        future.cancel()
        if wait and not on_reader_thread():
            concurrent.futures.wait(futures)
