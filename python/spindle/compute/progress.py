"""A progress bar for long maps (``Executor.map``, ``parallel_for``), drawn with tqdm.

By default shown only where someone watches and only when a map is long: stderr is a
terminal, tqdm is installed, it was not turned off (``progress=False``, or
``SPINDLE_PROGRESS=0`` for the whole program), and the map has run for ``DELAY`` seconds
(short maps never draw one). ``progress=True`` draws one at once, wherever
stderr goes.
"""

from __future__ import annotations

import os
import sys
import threading
from typing import Any, Optional

DELAY = 2.0


class NoBar:
    """What a map updates when no bar is drawn."""

    def update(self, n: int = 1) -> None:
        pass

    def close(self) -> None:
        pass


def wanted(progress: Optional[bool]) -> bool:
    """Whether to draw a bar: ``progress`` True/False, or None (decide by the terminal)."""
    if progress is not None:
        return progress
    if os.environ.get("SPINDLE_PROGRESS", "").strip().lower() in ("0", "false", "no", "off"):
        return False
    stream = sys.stderr
    try:
        return stream is not None and stream.isatty()
    except (AttributeError, ValueError):  # replaced by an object without isatty, or closed
        return False


class Bar:
    """A tqdm bar of ``total`` steps, drawn from ``delay`` seconds on (never, if closed
    before); ``update`` is thread-safe (the futures' callbacks call it)."""

    def __init__(self, total: int, description: str, delay: float) -> None:
        self.total = total
        self.description = description
        self._lock = threading.Lock()
        self._done = 0
        self._bar: Any = None
        self._closed = False
        self._timer = threading.Timer(delay, self._draw)
        self._timer.daemon = True
        self._timer.start()

    def _draw(self) -> None:
        from tqdm import tqdm

        with self._lock:
            if not self._closed:
                self._bar = tqdm(total=self.total, initial=self._done, desc=self.description,
                                 unit="task", file=sys.stderr, dynamic_ncols=True, leave=False)

    def update(self, n: int = 1) -> None:
        with self._lock:
            self._done += n
            if self._bar is not None:
                self._bar.update(n)

    def close(self) -> None:
        self._timer.cancel()
        with self._lock:
            self._closed = True
            bar, self._bar = self._bar, None
        if bar is not None:
            bar.close()


def bar(total: int, description: str, progress: Optional[bool] = None) -> Any:
    """A :class:`Bar` of ``total`` steps if one is wanted, else a :class:`NoBar`."""
    if total <= 1 or not wanted(progress):
        return NoBar()
    try:
        import tqdm  # noqa: F401
    except ImportError:
        return NoBar()
    return Bar(total, description, 0.0 if progress else DELAY)
