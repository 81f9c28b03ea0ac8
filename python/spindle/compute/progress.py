"""A progress bar for long maps (``Executor.map``, ``parallel_for``), drawn with tqdm.

By default shown only where someone watches and only when a map is long: stderr is a
terminal, tqdm is installed, it was not turned off (``progress=False``, or
``SPINDLE_PROGRESS=0`` for the whole program), and the map has run for ``DELAY`` seconds
(tqdm's ``delay``: short maps never draw one). ``progress=True`` draws one at once, wherever
stderr goes.
"""

from __future__ import annotations

import os
import sys
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


def bar(total: int, description: str, progress: Optional[bool] = None) -> Any:
    """A bar of ``total`` steps (tqdm's, or a :class:`NoBar`); ``update`` is thread-safe."""
    if total <= 1 or not wanted(progress):
        return NoBar()
    try:
        from tqdm import tqdm
    except ImportError:
        return NoBar()
    return tqdm(total=total, desc=description, unit="task", delay=0 if progress else DELAY,
                file=sys.stderr, dynamic_ncols=True, leave=False)
