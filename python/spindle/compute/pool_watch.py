"""The warning of a pool too small for the program: its calls wait for a worker while every
worker runs a call that does not end, which is what a barrier, latch or future waited on by
the running calls and reached only by the queued ones looks like (they would wait forever).

The server says when a call of this process queues behind a full pool (``{"queued": id,
"max_workers": n}``) and when it starts; if calls have waited ``WARN_AFTER`` seconds and
no call of this process ended meanwhile, :class:`spindle.PoolDeadlockWarning` says so once,
naming ``--max-workers``. A watcher thread runs only while calls wait.
"""

from __future__ import annotations

import threading
import time
import warnings
from typing import Any, Dict, Optional

from ..errors import PoolDeadlockWarning

WARN_AFTER = 10.0  # seconds of waiting, with no call ending, before the warning
CHECK_EVERY = 0.5

_lock = threading.Lock()
_waiting: Dict[Any, float] = {}  # a queued call's future -> when it queued
_max_workers = 0
_last_end = time.monotonic()
_watcher: Optional[threading.Thread] = None
_warned = False


def queued(future: Any, max_workers: int) -> None:
    """A call of this process waits behind a full pool of ``max_workers``."""
    global _max_workers, _watcher
    with _lock:
        _waiting[future] = time.monotonic()
        _max_workers = max_workers
        if _watcher is None:
            _watcher = threading.Thread(target=_watch, name="spindle-pool-watch", daemon=True)
            _watcher.start()


def started(future: Any) -> None:
    with _lock:
        _waiting.pop(future, None)


def ended(future: Any) -> None:
    global _last_end
    with _lock:
        _waiting.pop(future, None)
        _last_end = time.monotonic()


def _watch() -> None:
    global _watcher, _warned
    while True:
        time.sleep(CHECK_EVERY)
        with _lock:
            if not _waiting:
                _watcher = None
                return
            now = time.monotonic()
            oldest = min(_waiting.values())
            stuck = now - oldest >= WARN_AFTER and now - _last_end >= WARN_AFTER
            if not stuck or _warned:
                continue
            _warned = True
            count, workers, waited = len(_waiting), _max_workers, now - oldest
        warnings.warn(
            f"{count} spindle call(s) have waited {waited:.0f} s for a worker while all "
            f"{workers} workers of the pool run calls that do not end: if those calls wait on a "
            "barrier, latch or future that the waiting calls must reach, they wait forever. "
            f"Start the server with a larger --max-workers (now {workers}), or make fewer "
            "calls wait on each other",
            PoolDeadlockWarning,
            stacklevel=1,
        )
