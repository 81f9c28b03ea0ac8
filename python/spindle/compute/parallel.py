"""spindle.parallel_for: CRUCIAL's ``invokeIterativeTask``.

``parallel_for(fn, range(ROWS), tasks=32)`` splits the iterations into ``tasks`` contiguous
chunks (sizes differ by at most one; a ``range`` is split into ranges, so nothing is
materialized), runs each chunk as one function that calls ``fn(i)`` for its items in order,
and returns every ``fn(i)`` in the order of the input.
"""

from __future__ import annotations

from typing import Any, Callable, Iterable, List, Optional, Sequence

from . import progress as _progress
from .call import Backoff
from .executor import Executor, default_workers


def partition(items: Sequence[Any], tasks: int) -> List[Sequence[Any]]:
    """``items`` cut into ``min(tasks, len(items))`` contiguous, nearly equal slices."""
    if tasks < 1:
        raise ValueError("tasks must be >= 1")
    n = len(items)
    tasks = min(tasks, n)
    if tasks == 0:
        return []
    size, extra = divmod(n, tasks)
    chunks = []
    start = 0
    for i in range(tasks):
        end = start + size + (1 if i < extra else 0)
        chunks.append(items[start:end])
        start = end
    return chunks


def _run_chunk(fn: Callable[[Any], Any], chunk: Iterable[Any]) -> List[Any]:
    return [fn(i) for i in chunk]


_run_chunk._spindle_runs_argument = 0  # type: ignore[attr-defined]  # lost_updates watches fn


def default_tasks() -> int:
    """8 functions per core (the gateway's default pool size)."""
    return default_workers()


def parallel_for(
    fn: Callable[[Any], Any],
    iterable_or_range: Iterable[Any],
    tasks: Optional[int] = None,
    *,
    retries: int = 0,
    backoff: Backoff = 0.1,
    timeout: Optional[float] = None,
    memory_mb: Optional[int] = None,
    echo: bool = True,
    progress: Optional[bool] = None,
) -> List[Any]:
    """Run ``fn(i)`` for every ``i`` with ``tasks`` functions; return the results in order.

    ``tasks`` defaults to 8 per core. The first failing chunk's exception is raised (after
    its retries); the other chunks still run to their end. ``progress``: a progress bar
    while it runs long (None: when stderr is a terminal; see ``spindle.Executor``).
    """
    items = iterable_or_range if isinstance(iterable_or_range, (range, list, tuple)) else list(
        iterable_or_range
    )
    chunks = partition(items, default_tasks() if tasks is None else tasks)
    with Executor(retries=retries, backoff=backoff, timeout=timeout, memory_mb=memory_mb,
                  echo=echo) as executor:
        bar = _progress.bar(len(items), "parallel_for", progress)
        try:
            futures = []
            for i, chunk in enumerate(chunks):
                future = executor._submit(_run_chunk, (fn, chunk), {}, f"task {i}")
                future.add_done_callback(lambda _, n=len(chunk): bar.update(n))
                futures.append(future)
            results: List[Any] = []
            for future in futures:
                results.extend(future.result())
        finally:
            bar.close()
    return results
