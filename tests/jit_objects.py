"""A shared class for object hosts on PyPy (tests/test_shared.py): in a module of its own
that such a host imports (it cannot load the class as CPython's code), needing nothing that
PyPy's environment lacks."""

from __future__ import annotations

import sys

import spindle


@spindle.shared
class Tally:
    """A running total and a loop a JIT compiles: ``add_squares(n)`` adds 0² + 1² + ... +
    (n-1)², one at a time."""

    def __init__(self, total: int = 0) -> None:
        self.total = total

    def add_squares(self, n: int) -> int:
        total = self.total
        for i in range(n):
            total += i * i
        self.total = total
        return total

    def runtime(self) -> str:
        return sys.implementation.name
