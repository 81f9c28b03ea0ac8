"""Serializable transactions over Spindle objects (docs/transactions.md).

``with spindle.transaction():`` runs its body as one attempt: every call the thread makes
on a Spindle object inside it is part of the transaction, sees the transaction's own
changes, and is seen by nobody else until the body ends and the transaction commits, all
at once. An exception inside aborts it (nothing it did is ever seen) and goes on; a commit
that meets a conflicting transaction raises :class:`~spindle.TransactionConflict`.

``@spindle.transactional`` runs a function as a transaction and runs it again, with
backoff, while it conflicts; its return value is the function's. A transaction inside
another (a transactional function calling another) is part of the outer one.
"""

from __future__ import annotations

import contextlib
import functools
import random
import time
from typing import Any, Callable, Iterator, Optional, TypeVar, overload

from .client import Transaction, current
from .errors import TransactionConflict

__all__ = ["transaction", "transactional"]

F = TypeVar("F", bound=Callable[..., Any])

#: Attempts of a ``@transactional`` function before its conflict is raised.
ATTEMPTS = 100
#: The longest pause between two attempts (seconds); the first is about a millisecond.
MAX_BACKOFF = 0.1


@contextlib.contextmanager
def transaction() -> Iterator[None]:
    """Run the body as one attempt of a transaction (see the module's docstring)."""
    with _attempt(None):
        yield


@contextlib.contextmanager
def _attempt(age: Optional[int]) -> Iterator[Optional[Transaction]]:
    """One attempt, begun at ``age`` (a retry's; ``None``: now). Yields the transaction, or
    ``None`` inside another transaction (whose part the body is)."""
    client = current()
    if client.transaction() is not None:
        yield None
        return
    txn = client.begin(age)
    try:
        yield txn
    except BaseException:
        client.end(txn)
        with contextlib.suppress(Exception):  # the body's exception is the one that matters
            client.abort(txn)
        raise
    client.commit(txn)


@overload
def transactional(fn: F) -> F: ...
@overload
def transactional(*, attempts: int = ATTEMPTS) -> Callable[[F], F]: ...


def transactional(fn: Optional[F] = None, *, attempts: int = ATTEMPTS) -> Any:
    """Run ``fn`` as a transaction, again while it conflicts (up to ``attempts`` times: the
    first retry at once, later ones after a randomized exponential backoff; each attempt
    keeps the first one's age, so younger transactions wait for it). Any other exception
    aborts it and goes on. ``fn`` should only change Spindle objects: it may run more than
    once."""
    if attempts < 1:
        raise ValueError("attempts must be at least 1")

    def decorate(fn: F) -> F:
        @functools.wraps(fn)
        def run(*args: Any, **kwargs: Any) -> Any:
            age: Optional[int] = None
            pause = 0.001
            for attempt in range(attempts):
                try:
                    with _attempt(age) as txn:
                        if txn is not None:
                            age = txn.age
                        return fn(*args, **kwargs)
                except TransactionConflict:
                    if current().transaction() is not None or attempt == attempts - 1:
                        raise  # the outer transaction retries, or no attempt is left
                # At once the first time: older by then than most it meets, it waits for
                # the few older ones rather than conflicting with them again.
                if attempt > 0:
                    time.sleep(random.uniform(0, pause))
                    pause = min(pause * 2, MAX_BACKOFF)
            raise AssertionError("unreachable")

        return run  # type: ignore[return-value]

    return decorate(fn) if fn is not None else decorate
