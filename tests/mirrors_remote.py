"""Functions the mirror-module tests (test_mirrors.py) run on the gateway's workers, in a
module of their own so that workers import them by reference, without pytest."""

from __future__ import annotations

import os
import time
from typing import Any, List, Optional, Tuple

from spindle import threading

# One per worker process (imported once there): what a cloud thread sees must be fresh.
WORKER_LOCAL = threading.local()

# Set by `initialize`, the pools' initializer, in each worker process it ran in.
initialized: List[Any] = []


def visit_worker_local(token: str) -> Tuple[Optional[str], int]:
    """What the previous cloud thread on this worker left in WORKER_LOCAL (None: nothing),
    and this worker's pid."""
    seen = getattr(WORKER_LOCAL, "token", None)
    WORKER_LOCAL.token = token
    return seen, os.getpid()


def visit_local(local: Any, token: str) -> Optional[str]:
    seen = getattr(local, "token", None)
    local.token = token
    return seen


def initialize(value: Any) -> None:
    initialized.append(value)


def initialized_with(_: Any) -> Tuple[List[Any], int]:
    return list(initialized), os.getpid()


def square(x: int) -> int:
    return x * x


def power(x: int, y: int) -> int:
    return x ** y


def fail(message: str) -> None:
    raise ValueError(message)


def add_locked(value: Any, times: int) -> None:
    for _ in range(times):
        with value.get_lock():
            value.value += 1


def fill_shared(shared: Any, namespace: Any, array: Any, i: int) -> None:
    shared[i] = i * i
    namespace.last = i
    array[i] = i + 0.5


def wait_then_count(event: Any, counter: Any) -> None:
    event.wait()
    counter.increment()


def count_after_sleep(started: Any, ran: Any, seconds: float) -> None:
    """Count in ``started``, sleep, then count in ``ran``: a task that must be stopped."""
    started.increment()
    time.sleep(seconds)
    ran.increment()


def echo_through(conn: Any) -> None:
    conn.send(("echo", conn.recv()))


def increment(counter: Any) -> None:
    counter.increment()



def wait_for(event: Any) -> bool:
    return event.wait()


def worker_id(_: Any = None) -> Optional[str]:
    """The id the gateway gave the worker running this (None outside a worker)."""
    return os.environ.get("SPINDLE_WORKER_ID")
