"""The benchmark's user-defined class for bench/shared.py, in a module of its own: object
hosts on PyPy (``--host-python``) import it from here, as they cannot load CPython's code,
so it needs nothing at import that PyPy's environment lacks (NumPy is imported by the NumPy
method only)."""

from __future__ import annotations

import spindle

P, A, B = 1_000_003, 31, 7  # x = (x * A + B) % P, n times


def spin_numpy(x: int, n: int) -> int:
    """``spin_reference`` with the n multiplications done as int64 vector operations."""
    import numpy as np

    pw = np.empty(n + 1, dtype=np.int64)  # pw[i] = A^i mod P; products stay below 2^40
    pw[0] = 1
    m = 1
    while m <= n:  # pw[m:2m] = pw[0:m] * A^m: each doubling step is two vector operations
        top = min(2 * m, n + 1)
        np.multiply(pw[:top - m], int(pw[m - 1]) * A % P, out=pw[m:top])
        np.remainder(pw[m:top], P, out=pw[m:top])
        m = top
    return (int(pw[n]) * (x % P) + B * int(pw[:n].sum())) % P  # the sum stays below 2^34


@spindle.shared
class Number:
    """An integer with the benchmark's operation, as a plain loop and vectorized."""

    def __init__(self, x: int = 1) -> None:
        self.x = x

    def spin(self, n: int) -> int:
        x = self.x
        for _ in range(n):
            x = (x * 31 + 7) % 1000003
        self.x = x
        return x

    def spin_numpy(self, n: int) -> int:
        self.x = spin_numpy(self.x, n)
        return self.x
