"""``from spindle import threading``: the ``threading`` module, with cloud threads and shared
synchronization objects, so that porting a threaded program is a change of imports.

Every public name of the standard library's ``threading`` is here (tests/test_mirrors.py
checks it against the running Python):

- ``Thread`` runs its target as a cloud function (:class:`spindle.Thread`); ``Timer`` is one
  that waits first; ``Lock``, ``RLock``, ``Condition``, ``Semaphore``, ``BoundedSemaphore``,
  ``Event`` and ``Barrier`` live in the server, so cloud threads share them;
- ``local`` gives each thread, and each cloud thread, attributes of its own;
- ``current_thread``, ``main_thread``, ``get_ident``, ``get_native_id`` are the standard
  library's: inside a cloud thread they describe the worker thread running it (named after
  the ``Thread``); ``enumerate`` and ``active_count`` count this process's threads plus the
  cloud threads it started that are still running;
- ``settrace``, ``setprofile`` (and their getters), ``stack_size`` and ``excepthook`` act on
  this process's own threads, as the standard library's: they cannot reach a function
  running in a worker, so for cloud threads they are no-ops (a cloud thread's exception is
  re-raised by ``join`` instead of going to ``excepthook``).
"""

from __future__ import annotations

import threading as _std
from typing import Any, Callable, Iterable, List, Mapping, Optional

from .compute.thread import Thread, alive_threads
from .sync import Barrier, BoundedSemaphore, Condition, Event, Lock, RLock, Semaphore
from .thread_local import local

# The standard library's own, for this process's threads (see the module docstring).
BrokenBarrierError = _std.BrokenBarrierError
ExceptHookArgs = _std.ExceptHookArgs
ThreadError = _std.ThreadError
TIMEOUT_MAX = _std.TIMEOUT_MAX
current_thread = _std.current_thread
currentThread = _std.currentThread
excepthook = _std.excepthook
__excepthook__ = _std.__excepthook__
get_ident = _std.get_ident
get_native_id = _std.get_native_id
getprofile = _std.getprofile
gettrace = _std.gettrace
main_thread = _std.main_thread
setprofile = _std.setprofile
settrace = _std.settrace
stack_size = _std.stack_size
for _name in ("setprofile_all_threads", "settrace_all_threads"):  # Python 3.12
    if hasattr(_std, _name):
        globals()[_name] = getattr(_std, _name)


def enumerate() -> List[Any]:
    """This process's live threads, then the cloud threads it started that are running."""
    return [*_std.enumerate(), *alive_threads()]


def active_count() -> int:
    """How many threads :func:`enumerate` returns."""
    return len(enumerate())


def activeCount() -> int:
    """Deprecated alias of :func:`active_count`, as in ``threading``."""
    import warnings

    warnings.warn("activeCount() is deprecated, use active_count() instead",
                  DeprecationWarning, stacklevel=2)
    return active_count()


class Timer(Thread):
    """A cloud thread that calls ``function(*args, **kwargs)`` after ``interval`` seconds,
    unless :meth:`cancel` was called first (from any process: the flag is a shared Event)."""

    def __init__(
        self,
        interval: float,
        function: Callable[..., Any],
        args: Optional[Iterable[Any]] = None,
        kwargs: Optional[Mapping[str, Any]] = None,
    ) -> None:
        super().__init__()
        self.interval = interval
        self.function = function
        self.args = tuple(args) if args is not None else ()
        self.kwargs = dict(kwargs) if kwargs is not None else {}
        self.finished = Event()

    def cancel(self) -> None:
        """Stop the timer if it has not fired yet."""
        self.finished.set()

    def run(self) -> None:
        self.finished.wait(self.interval)
        if not self.finished.is_set():
            self.function(*self.args, **self.kwargs)
        self.finished.set()


__all__ = [
    "Barrier", "BoundedSemaphore", "BrokenBarrierError", "Condition", "Event", "ExceptHookArgs",
    "Lock", "RLock", "Semaphore", "TIMEOUT_MAX", "Thread", "ThreadError", "Timer",
    "active_count", "current_thread", "enumerate", "excepthook", "get_ident", "get_native_id",
    "getprofile", "gettrace", "local", "main_thread", "setprofile", "settrace", "stack_size",
]
__all__ += [n for n in ("setprofile_all_threads", "settrace_all_threads") if n in globals()]
