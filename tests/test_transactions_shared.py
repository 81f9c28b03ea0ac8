"""User-defined objects (``@spindle.shared``) in transactions, through the public API with
real object hosts (docs/transactions.md, "User-defined objects"): atomic with built-in
objects, isolated until commit, retried under contention from several processes, durable
across ``kill -9`` when persistent, and aborted cleanly when their host dies."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest

import spindle
from test_shared_durability import durable
from txn_accounts import Account, PersistentAccount


class Undo(Exception):
    pass


def test_a_user_defined_object_and_a_counter_commit_together_or_not_at_all(uniq: str) -> None:
    account, counter = Account(100, name=f"{uniq}a"), spindle.Counter(0, name=f"{uniq}c")
    with spindle.transaction():
        assert account.add(-30) == 70
        counter.add(30)
        assert (account.balance(), counter.get()) == (70, 30)  # its own changes, to it
    assert (account.balance(), counter.get()) == (70, 30)
    # An exception inside leaves both as they were.
    with pytest.raises(Undo):
        with spindle.transaction():
            account.add(-50)
            counter.add(50)
            assert account.balance() == 20
            raise Undo()
    assert (account.balance(), counter.get()) == (70, 30)
    # Attaching to it by name inside (the proxy's create) is part of it too.
    with spindle.transaction():
        Account(name=f"{uniq}a").add(5)
    assert account.balance() == 75


def test_nobody_sees_a_change_before_commit_and_a_single_call_in_between_conflicts(uniq: str) -> None:
    account = Account(100, name=f"{uniq}a")
    seen = []
    with pytest.raises(spindle.TransactionConflict, match="changed after the transaction read it"):
        with spindle.transaction():
            account.add(-30)
            # Another thread is not in the transaction: its call sees the committed state,
            # and (any method may change the object) the transaction cannot commit over it.
            other = threading.Thread(target=lambda: seen.append(account.balance()))
            other.start()
            other.join()
    assert seen == [100]
    assert account.balance() == 100


TRANSFERS = r"""
import json, random, sys
import spindle
from txn_accounts import Account
prefix, me, count = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
accounts = [Account(name=f"{prefix}{i}") for i in range(4)]
rng = random.Random(me)

@spindle.transactional
def transfer(src, dst, amount):
    if src.balance() < amount:
        return False
    src.add(-amount)
    dst.add(amount)
    return True

@spindle.transactional
def audit():
    return [a.balance() for a in accounts]

moved, bad = 0, []
for _ in range(count):
    src, dst = rng.sample(accounts, 2)
    moved += transfer(src, dst, rng.randint(1, 40))
    total = audit()
    if sum(total) != 400 or min(total) < 0:
        bad.append(total)
print(json.dumps({"moved": moved, "bad": bad}))
"""


def test_transactional_transfers_between_user_defined_accounts_from_several_processes(
    uniq: str, child_env: dict
) -> None:
    accounts = [Account(100, name=f"{uniq}{i}") for i in range(4)]
    committed = spindle.status()["transactions_committed"]
    clients = [
        subprocess.Popen([sys.executable, "-c", TRANSFERS, uniq, str(me), "25"],
                         stdout=subprocess.PIPE, text=True, env=child_env)
        for me in range(4)
    ]
    results = [json.loads(c.communicate(timeout=240)[0]) for c in clients]
    assert [c.returncode for c in clients] == [0] * 4
    balances = [a.balance() for a in accounts]
    assert sum(balances) == 400 and min(balances) >= 0, balances
    assert [r["bad"] for r in results] == [[]] * 4, "an audit saw a total off"
    assert sum(r["moved"] for r in results) > 0
    # Every transfer and every audit committed, some after retries.
    assert spindle.status()["transactions_committed"] - committed >= 4 * 25 * 2


def test_a_committed_persistent_object_survives_kill_9_and_an_aborted_change_leaves_nothing(
    tmp_path: Path,
) -> None:
    with durable(tmp_path) as d:
        account = PersistentAccount(100, name="account")
        counter = spindle.Counter(0, name="counter", persistent=True)
        with spindle.transaction():
            account.add(-30)
            counter.add(30)
        with pytest.raises(Undo):
            with spindle.transaction():
                account.add(-50)
                counter.add(50)
                raise Undo()
        d.crash_and_restart()
        assert (account.balance(), counter.get()) == (70, 30)
        # Committed again after the restart, and again across a second kill.
        with spindle.transaction():
            account.add(-20)
            counter.add(20)
        d.crash_and_restart()
        assert (account.balance(), counter.get()) == (50, 50)


def test_a_host_killed_during_a_transaction_aborts_it_and_the_object_keeps_its_state(tmp_path: Path) -> None:
    with durable(tmp_path) as d:
        account = PersistentAccount(100, name="account")
        counter = spindle.Counter(0, name="counter", persistent=True)
        with pytest.raises(spindle.TransactionConflict):
            with spindle.transaction():
                account.add(-10)
                counter.add(10)
                os.kill(account.pid(), signal.SIGKILL)  # the host of the object and its copy
                account.add(-10)
        # The object is back to its last committed state (restored in a new host), and
        # nothing of the transaction is anywhere.
        assert (account.balance(), counter.get()) == (100, 0)

        @spindle.transactional
        def move() -> None:
            account.add(-10)
            counter.add(10)

        move()
        assert (account.balance(), counter.get()) == (90, 10)
        d.crash_and_restart()
        assert (account.balance(), counter.get()) == (90, 10)
