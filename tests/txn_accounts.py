"""User-defined accounts for tests/test_transactions_shared.py, in a module of their own so
that the test and its client processes share one class (and so one version); the hosts get
it by value, as any program's class."""

from __future__ import annotations

import os

import spindle


class _Account:
    def __init__(self, balance: int = 0) -> None:
        self.balance_ = balance

    def add(self, amount: int) -> int:
        self.balance_ += amount
        return self.balance_

    def balance(self) -> int:
        return self.balance_

    def pid(self) -> int:
        """The object host's process id."""
        return os.getpid()


@spindle.shared
class Account(_Account):
    """An ephemeral account."""


@spindle.shared(persistent=True)
class PersistentAccount(_Account):
    """A persistent account (its server needs a data directory)."""
