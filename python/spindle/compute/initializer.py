"""Initializers of pools and executors (``multiprocessing.Pool(initializer=...)``,
``ProcessPoolExecutor(initializer=...)``) for calls that run as cloud functions.

The standard library runs ``initializer(*initargs)`` once in each process of the pool before
its first task. Here the pool's processes are the server's workers, shared by every pool, so
each call carries the initializer and a token naming its pool, and a worker runs it before
the first call of that pool it receives (the worker remembers the tokens it has seen).
"""

from __future__ import annotations

import uuid
from typing import Any, Callable, Optional, Set, Tuple

# Tokens of the pools whose initializer ran in this process.
_initialized: Set[str] = set()


class Initialized:
    """``fn`` preceded, once per process, by its pool's initializer."""

    __slots__ = ("fn", "initializer", "initargs", "token")

    def __init__(self, fn: Callable[..., Any], initializer: Callable[..., Any],
                 initargs: Tuple[Any, ...], token: str) -> None:
        self.fn, self.initializer, self.initargs, self.token = fn, initializer, initargs, token

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if self.token not in _initialized:
            self.initializer(*self.initargs)
            _initialized.add(self.token)
        return self.fn(*args, **kwargs)

    def __reduce__(self) -> Any:
        return (Initialized, (self.fn, self.initializer, self.initargs, self.token))


class Initializer:
    """A pool's initializer (or none): :meth:`wrap` gives what each of its calls runs."""

    def __init__(self, initializer: Optional[Callable[..., Any]], initargs: Any = ()) -> None:
        if initializer is not None and not callable(initializer):
            raise TypeError("initializer must be a callable")
        self.initializer = initializer
        self.initargs = tuple(initargs)
        self.token = uuid.uuid4().hex

    def wrap(self, fn: Callable[..., Any]) -> Callable[..., Any]:
        if self.initializer is None:
            return fn
        return Initialized(fn, self.initializer, self.initargs, self.token)
