"""A shared class for object hosts on PyPy (tests/test_shared.py): in a module of its own
that such a host imports (it cannot load the class as CPython's code), needing nothing that
PyPy's environment lacks."""

from __future__ import annotations

import sys

import spindle


@spindle.shared
class Spinner:
    """An integer and a loop a JIT compiles: ``x = (x * 31 + 7) % 1000003``, ``n`` times."""

    def __init__(self, x: int = 1) -> None:
        self.x = x

    def spin(self, n: int) -> int:
        x = self.x
        for _ in range(n):
            x = (x * 31 + 7) % 1000003
        self.x = x
        return x

    def runtime(self) -> str:
        return sys.implementation.name
