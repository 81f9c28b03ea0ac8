"""``from spindle import queue``: the ``queue`` module with queues that live in the server,
so cloud threads share them; porting is a change of imports.

Every public name of the standard library's ``queue`` is here (tests/test_mirrors.py checks
it against the running Python): ``Queue``, ``LifoQueue``, ``PriorityQueue`` and
``SimpleQueue`` are Spindle objects; ``Empty``, ``Full`` (and ``ShutDown`` on Python 3.13+)
are the standard library's exceptions, which their methods raise.
"""

from __future__ import annotations

import queue as _std

from .queues import LifoQueue, PriorityQueue, Queue, SimpleQueue

Empty = _std.Empty
Full = _std.Full

__all__ = ["Empty", "Full", "LifoQueue", "PriorityQueue", "Queue", "SimpleQueue"]

if hasattr(_std, "ShutDown"):  # Python 3.13
    ShutDown = _std.ShutDown
    __all__.append("ShutDown")
