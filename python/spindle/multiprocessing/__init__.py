"""``from spindle import multiprocessing``: ``multiprocessing`` whose processes and pools run
as cloud functions and whose shared objects live in the server, so that porting is a change
of imports.

Every public name of the standard library's ``multiprocessing`` is here (tests/test_mirrors.py
checks it against the running Python):

- ``Process`` is a cloud thread (:mod:`.process`); ``Pool`` and ``pool.ThreadPool`` run their
  tasks as cloud functions (:mod:`.pool`);
- ``Queue``, ``JoinableQueue``, ``SimpleQueue``, ``Pipe``, ``Lock``, ``RLock``, ``Semaphore``,
  ``BoundedSemaphore``, ``Condition``, ``Event``, ``Barrier``, ``Value``, ``Array`` (and
  ``RawValue``, ``RawArray``) are Spindle objects; ``Manager()``'s ``dict()``, ``list()`` and
  ``Namespace()`` too (:mod:`.managers`);
- ``cpu_count()`` is how many calls the server's worker pool runs at once (its
  ``--max-workers``), the size a pool of cloud functions should have;
- ``get_context(method)`` checks the method and returns this module, so ``ctx.Pool(...)``
  works; the start-method, logging and ``current_process``/``parent_process`` functions and
  the exceptions are the standard library's, about this process (workers are the server's).
"""

from __future__ import annotations

import multiprocessing as _std
import os
import sys
from typing import Any, Optional

from .connection import Pipe
from .managers import Manager
from .pool import Pool
from .process import Process, active_children
from .queues import JoinableQueue, Queue, SimpleQueue
from .sharedctypes import Array, RawArray, RawValue, Value
from .synchronize import Barrier, BoundedSemaphore, Condition, Event, Lock, RLock, Semaphore

AuthenticationError = _std.AuthenticationError
BufferTooShort = _std.BufferTooShort
ProcessError = _std.ProcessError
TimeoutError = _std.TimeoutError
SUBDEBUG = _std.SUBDEBUG
SUBWARNING = _std.SUBWARNING
allow_connection_pickling = _std.allow_connection_pickling
current_process = _std.current_process
freeze_support = _std.freeze_support
get_all_start_methods = _std.get_all_start_methods
get_logger = _std.get_logger
get_start_method = _std.get_start_method
log_to_stderr = _std.log_to_stderr
parent_process = _std.parent_process
reducer = _std.reducer
set_executable = _std.set_executable
set_forkserver_preload = _std.set_forkserver_preload
set_start_method = _std.set_start_method


def cpu_count() -> int:
    """How many calls the server's worker pool runs at once (this machine's cores when the
    server does not say)."""
    from ..proxy import status

    workers = status().get("max_workers")
    if isinstance(workers, int) and workers > 0:
        return workers
    return os.cpu_count() or 1


def get_context(method: Optional[str] = None) -> Any:
    """This module, after checking ``method`` as ``multiprocessing.get_context`` does."""
    _std.get_context(method)
    return sys.modules[__name__]


__all__ = [
    "Array", "AuthenticationError", "Barrier", "BoundedSemaphore", "BufferTooShort",
    "Condition", "Event", "JoinableQueue", "Lock", "Manager", "Pipe", "Pool", "Process",
    "ProcessError", "Queue", "RLock", "RawArray", "RawValue", "Semaphore", "SimpleQueue",
    "TimeoutError", "Value", "active_children", "allow_connection_pickling", "cpu_count",
    "current_process", "freeze_support", "get_all_start_methods", "get_context", "get_logger",
    "get_start_method", "log_to_stderr", "parent_process", "reducer", "set_executable",
    "set_forkserver_preload", "set_start_method",
]
