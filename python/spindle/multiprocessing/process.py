"""``multiprocessing.Process`` as a cloud thread: the target runs as a cloud function.

As ``multiprocessing``'s: ``join`` does not raise what the target raised; the error shows
in ``exitcode`` (1) and its traceback is printed to stderr, as a child process prints it.
``terminate``/``kill`` stop the process whether it runs or waits for a worker (the worker
running it is killed); ``join`` then waits until that worker is gone, and ``exitcode`` is
``-signal.SIGTERM`` or ``-signal.SIGKILL`` as for a child process. ``pid`` is the worker's,
once known.
"""

from __future__ import annotations

import itertools
import signal
import sys
import traceback
from typing import Any, List, Optional

from ..compute.thread import Thread, alive_threads

_numbers = itertools.count(1)


class Process(Thread):
    """``multiprocessing.Process(group, target, name, args, kwargs, *, daemon)``."""

    def __init__(self, group: None = None, target: Any = None, name: Optional[str] = None,
                 args: Any = (), kwargs: Any = None, *, daemon: Optional[bool] = None) -> None:
        if group is not None:
            raise AssertionError("group argument must be None for now")
        super().__init__(None, target, name if name is not None else f"Process-{next(_numbers)}",
                         args, kwargs, daemon=daemon)
        self._reported = False
        self._stopped_by: Optional[signal.Signals] = None  # terminate() or kill()

    def join(self, timeout: Optional[float] = None) -> None:
        if self._future is None:
            raise AssertionError("can only join a started process")
        try:
            error = self._future.exception(timeout)
        except TimeoutError:
            return
        except Exception:  # cancelled (terminated before it ran)
            return
        if error is not None and not self._reported:
            self._reported = True
            print(f"Process {self.name}:", file=sys.stderr)
            traceback.print_exception(type(error), error, error.__traceback__, file=sys.stderr)

    @property
    def exitcode(self) -> Optional[int]:
        """None while running; 0 if the target returned, 1 if it raised, -15 if terminated
        and -9 if killed."""
        future = self._future
        if future is None or not future.done():
            return None
        if future.cancelled():
            return -(self._stopped_by or signal.SIGTERM)
        return 0 if future.exception() is None else 1

    @property
    def pid(self) -> Optional[int]:
        return self.native_id

    def terminate(self) -> None:
        self._stop(signal.SIGTERM)

    def kill(self) -> None:
        self._stop(signal.SIGKILL)

    def _stop(self, how: signal.Signals) -> None:
        if self._future is not None and not self._future.done():
            if self._stopped_by is None:
                self._stopped_by = how
            self._future.kill()

    def close(self) -> None:
        if self.is_alive():
            raise ValueError("Cannot close a process while it is still running. "
                             "You should first call join() or terminate().")

    def __repr__(self) -> str:
        code = self.exitcode
        status = "initial" if self._future is None else (
            "started" if code is None else f"stopped exitcode={code}")
        return f"<spindle.multiprocessing.Process name={self.name!r} {status}>"


def active_children() -> List[Process]:
    """The processes started here that are still running."""
    return [t for t in alive_threads() if isinstance(t, Process)]
