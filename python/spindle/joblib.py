"""A joblib parallel backend that runs joblib's batches as Spindle functions.

```python
import joblib
import spindle.joblib  # registers the "spindle" backend (so does `import spindle` when
                       # joblib was imported first)

with joblib.parallel_backend("spindle"):
    RandomForestClassifier(n_jobs=-1).fit(X, y)   # unchanged scikit-learn code
```

``from spindle.joblib import parallel_config`` in place of joblib's makes Spindle the backend
of every ``with parallel_config(...)`` block (a change of imports).

Each batch of joblib calls travels with cloudpickle to a worker of the server's pool and its
results come back to joblib. ``n_jobs=-1`` means one function per core of this machine.
Backend options (``joblib.parallel_backend("spindle", retries=2, echo=False, timeout=60)``)
go to the underlying :class:`spindle.Executor`. Calls that need shared memory
(``require="sharedmem"``) stay on joblib's threads, as with any process-based backend.
"""

from __future__ import annotations

import os
from typing import Any, Callable, Optional

import joblib as _joblib
from joblib import register_parallel_backend
from joblib._parallel_backends import AutoBatchingMixin, ParallelBackendBase

from .compute.executor import Executor
from .compute.invoker import Invocation

NAME = "spindle"
_EXECUTOR_OPTIONS = ("max_workers", "retries", "backoff", "timeout", "memory_mb", "echo",
                     "label", "max_argument")


class SpindleBackend(AutoBatchingMixin, ParallelBackendBase):
    """joblib batches as Spindle functions (see the module docstring)."""

    supports_retrieve_callback = True
    supports_sharedmem = False
    uses_threads = False

    def __init__(self, nesting_level: Optional[int] = None,
                 inner_max_num_threads: Optional[int] = None, **executor_options: Any) -> None:
        super().__init__(nesting_level=nesting_level,
                         inner_max_num_threads=inner_max_num_threads)
        # scikit-learn passes its data inline: no 1 MiB argument limit here.
        unknown = set(executor_options) - set(_EXECUTOR_OPTIONS)
        if unknown:
            raise TypeError(f"unknown spindle backend options: {', '.join(sorted(unknown))}")
        executor_options.setdefault("max_argument", None)
        executor_options.setdefault("label", "joblib")
        self.executor_options = executor_options
        self._executor: Optional[Executor] = None

    def effective_n_jobs(self, n_jobs: Optional[int]) -> int:
        if n_jobs == 0:
            raise ValueError("n_jobs == 0 in Parallel has no meaning")
        if n_jobs is None:
            return 1
        if n_jobs < 0:
            return max((os.cpu_count() or 1) + 1 + n_jobs, 1)
        return n_jobs

    def configure(self, n_jobs: int = 1, parallel: Any = None, prefer: Any = None,
                  require: Any = None, **backend_kwargs: Any) -> int:
        n_jobs = self.effective_n_jobs(n_jobs)
        self.parallel = parallel
        # joblib passes its process-pool options (max_nbytes, mmap_mode...) too: keep ours.
        ours = {k: v for k, v in backend_kwargs.items() if k in _EXECUTOR_OPTIONS}
        if ours:
            self.executor_options.update(ours)
        if self._executor is None:
            self._executor = Executor(**self.executor_options)
        return n_jobs

    def submit(self, func: Callable[[], Any], callback: Optional[Callable[[Any], Any]] = None
               ) -> Invocation:
        if self._executor is None:
            self._executor = Executor(**self.executor_options)
        future = self._executor.submit(func)
        if callback is not None:
            future.add_done_callback(callback)
        return future

    def retrieve_result_callback(self, future: Invocation) -> Any:
        return future.result()

    def terminate(self) -> None:
        if self._executor is not None:
            self._executor.shutdown(wait=False)
            self._executor = None
        self.reset_batch_stats()

    def abort_everything(self, ensure_ready: bool = True) -> None:
        """Withdraw the batches still queued; running ones end on their own."""
        if self._executor is not None:
            self._executor.shutdown(wait=False, cancel_futures=True)
            self._executor = None
        if ensure_ready:
            self._executor = Executor(**self.executor_options)


register_parallel_backend(NAME, SpindleBackend)


def parallel_config(backend: Any = NAME, **options: Any) -> Any:
    """``joblib.parallel_config`` whose backend is Spindle's unless told otherwise, so that
    ``from joblib import parallel_config`` becomes ``from spindle.joblib import
    parallel_config`` and the code under it runs its batches as Spindle functions."""
    return _joblib.parallel_config(backend, **options)


__all__ = ["NAME", "SpindleBackend", "parallel_config"]
