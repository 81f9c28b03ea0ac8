"""Transactions through the public API (docs/transactions.md): atomic and isolated commits,
aborts that leave nothing, conflicts and retries, blocking calls refused, limits, clients
killed mid-transaction, and a bank of persistent accounts whose total never changes while
the server is killed with `kill -9`."""

from __future__ import annotations

import contextlib
import os
import queue
import random
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Callable, Iterator, List

import pytest

import bank

import spindle
from conftest import ServerProcess, connected_to, stable_port


def test_a_commit_shows_every_change_at_once_and_none_before(uniq: str) -> None:
    a, b = spindle.Counter(100, name=f"{uniq}a"), spindle.Counter(0, name=f"{uniq}b")
    seen = []
    with spindle.transaction():
        a.add(-30)
        b.add(30)
        # Its own changes, to the transaction; the committed state, to anyone else (another
        # thread is not in the transaction).
        assert (a.get(), b.get()) == (70, 30)
        other = threading.Thread(target=lambda: seen.append((a.get(), b.get())))
        other.start()
        other.join()
    assert seen == [(100, 0)]
    assert (a.get(), b.get()) == (70, 30)


def test_creates_and_deletes_inside_are_part_of_it(uniq: str) -> None:
    keep = spindle.Dict(name=f"{uniq}d")
    with spindle.transaction():
        made = spindle.List([1, 2], name=f"{uniq}l")
        made.append(3)
        keep["k"] = "v"
        spindle.delete(keep)
        assert f"{uniq}l" not in {name for name, _ in spindle.objects(uniq)}
    assert spindle.List(name=f"{uniq}l").copy() == [1, 2, 3]
    assert f"{uniq}d" not in {name for name, _ in spindle.objects(uniq)}


def test_an_exception_inside_leaves_nothing_behind(uniq: str) -> None:
    q = spindle.Queue(name=f"{uniq}q")
    q.put("job")
    running = spindle.List(name=f"{uniq}r")

    class Refused(Exception):
        pass

    with pytest.raises(Refused):
        with spindle.transaction():
            running.append(q.get_nowait())
            raise Refused()
    assert q.get_nowait() == "job"
    assert running.copy() == []


def test_a_single_call_on_an_object_a_transaction_read_fails_its_commit(uniq: str) -> None:
    a = spindle.Counter(5, name=f"{uniq}a")
    b = spindle.Counter(0, name=f"{uniq}b")
    with pytest.raises(spindle.TransactionConflict, match="changed after the transaction read it"):
        with spindle.transaction():
            b.add(a.get())
            changer = threading.Thread(target=lambda: a.add(1))
            changer.start()
            changer.join()
    assert (a.get(), b.get()) == (6, 0)


@contextlib.contextmanager
def an_older_transaction(take: Callable[[], object]) -> Iterator[List[str]]:
    """Inside the block, a transaction on another thread has done ``take()`` and stays open;
    it commits when the block ends (the list it yields then says ``"committed"``)."""
    inside, go = threading.Event(), threading.Event()
    committed: List[str] = []

    def older() -> None:
        with spindle.transaction():
            take()
            inside.set()
            go.wait(10)
        committed.append("committed")

    first = threading.Thread(target=older)
    first.start()
    assert inside.wait(10)
    try:
        yield committed
    finally:
        go.set()
        first.join(10)


def test_the_younger_of_two_transactions_on_one_object_waits_for_the_older(uniq: str) -> None:
    c = spindle.Counter(0, name=f"{uniq}c")
    seen = []

    def younger() -> None:
        with spindle.transaction():
            seen.append(c.add(10))

    with an_older_transaction(lambda: c.add(1)):
        second = threading.Thread(target=younger)
        second.start()
        second.join(0.5)
        assert second.is_alive() and seen == []  # waiting for the older one, not aborted
    second.join(10)
    assert seen == [11]  # it ran on what the older one committed
    assert c.get() == 11


def test_a_client_cannot_claim_to_be_older_than_it_is(uniq: str) -> None:
    # A client names its transaction's age, but the age that counts is when the server
    # first saw it: one claiming an ancient age waits for an older transaction instead of
    # taking its object from it.
    from spindle.client import current

    c = spindle.Counter(0, name=f"{uniq}c")
    claimed = []

    def ancient() -> None:
        client = current()
        txn = client.begin(age=1)  # 1 µs after 1970
        try:
            claimed.append(c.add(10))
            client.commit(txn)
        except BaseException:
            client.end(txn)
            raise

    with an_older_transaction(lambda: c.add(1)) as honest:
        second = threading.Thread(target=ancient)
        second.start()
        second.join(0.5)
        assert second.is_alive() and claimed == []  # it waits: it is the younger
    second.join(10)
    assert honest == ["committed"] and claimed == [11]
    assert c.get() == 11


def test_a_refused_call_that_waited_aborts_its_transaction_too() -> None:
    # A TransactionError aborts the transaction even if the code catches it, also when the
    # refused call first waited for an older transaction's object (and is answered at its
    # commit).
    server = ServerProcess("--max-transaction-bytes", "100000")
    try:
        with connected_to(server):
            blob = spindle.Blob(name="rb")
            blob.set(b"x" * 60_000)
            c = spindle.Counter(name="rc")
            outcome = []

            def younger() -> None:
                try:
                    with spindle.transaction():
                        c.add(1)
                        try:
                            blob.append(b"y" * 50_000)  # waits, then is refused: over 100000 bytes of copies
                        except spindle.TransactionError as e:
                            outcome.append(("refused", str(e)))
                    outcome.append("committed")
                except spindle.TransactionConflict as e:
                    outcome.append(("conflict", str(e)))

            with an_older_transaction(lambda: len(blob)):  # takes the blob
                second = threading.Thread(target=younger)
                second.start()
                second.join(0.5)
                assert second.is_alive(), "it should wait for the older transaction"
            second.join(10)
            assert outcome and outcome[0][0] == "refused", outcome
            assert len(blob) == 60_000, f"the refused append took effect ({outcome})"
            assert c.get() == 0, f"a transaction with a refused call committed ({outcome})"
    finally:
        server.stop()


def test_transactional_functions_retry_until_every_transfer_lands(uniq: str) -> None:
    accounts = [spindle.Counter(100, name=f"{uniq}{i}") for i in range(3)]

    @spindle.transactional
    def transfer(src: spindle.Counter, dst: spindle.Counter, amount: int) -> bool:
        if src.get() < amount:
            return False
        src.add(-amount)
        dst.add(amount)
        return True

    done = queue.Queue()

    def worker(seed: int) -> None:
        moved = 0
        for i in range(40):
            src, dst = accounts[(seed + i) % 3], accounts[(seed + i + 1) % 3]
            moved += transfer(src, dst, 1)
        done.put(moved)

    threads = [threading.Thread(target=worker, args=(s,)) for s in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sum(done.get() for _ in threads) == 160  # no account ran dry: all went through
    assert sum(a.get() for a in accounts) == 300


def test_a_transactional_function_inside_another_is_part_of_it(uniq: str) -> None:
    c = spindle.Counter(0, name=f"{uniq}c")

    @spindle.transactional
    def inner() -> None:
        c.add(1)

    @spindle.transactional
    def outer() -> None:
        inner()
        inner()
        raise KeyError("undo")

    with pytest.raises(KeyError):
        outer()
    assert c.get() == 0


@pytest.mark.parametrize(
    "make, block, name",
    [
        (lambda k: spindle.Lock(name=k), lambda o: (o.acquire(), o.acquire()), "Lock.acquire()"),
        (lambda k: spindle.Queue(name=k), lambda o: o.get(), "Queue.get()"),
        (lambda k: spindle.Event(name=k), lambda o: o.wait(), "Event.wait()"),
        (lambda k: spindle.Barrier(2, name=k), lambda o: o.wait(), "Barrier.wait()"),
    ],
)
def test_a_call_that_would_wait_is_an_error_naming_it(uniq, make, block, name) -> None:
    obj = make(f"{uniq}o")
    with pytest.raises(spindle.TransactionError, match=rf"{name.replace('(', '[(]').replace(')', '[)]')} on '{uniq}o' would wait"):
        with spindle.transaction():
            block(obj)


def test_non_blocking_forms_work_inside(uniq: str) -> None:
    lock, q = spindle.Lock(name=f"{uniq}l"), spindle.Queue(name=f"{uniq}q")
    with spindle.transaction():
        assert lock.acquire(blocking=False)
        q.put(1)
        assert q.get_nowait() == 1
        q.put(2)
    assert lock.locked()
    lock.release()
    assert q.get_nowait() == 2


def test_cloud_threads_and_executor_functions_run_transactions(uniq: str) -> None:
    import remote

    accounts = [spindle.Counter(100, name=f"{uniq}-acct{i}") for i in range(5)]
    committed = spindle.status()["transactions_committed"]
    with spindle.Executor(echo=False) as ex:
        moved = [ex.submit(remote.transfer_many, accounts, 40, seed) for seed in range(3)]
        threads = [spindle.Thread(target=remote.transfer_many, args=(accounts, 40, seed)) for seed in (7, 8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        assert sum(f.result(120) for f in moved) > 0
    balances = [a.get() for a in accounts]
    assert sum(balances) == 500 and min(balances) >= 0, balances
    # Each of the 5 x 40 transfers committed as a transaction (some after retries).
    assert spindle.status()["transactions_committed"] - committed >= 200


def test_limits_of_objects_time_bytes_and_open_transactions_are_enforced_and_status_counts() -> None:
    server = ServerProcess("--max-transaction-objects", "2", "--max-transaction-time", "0.5",
                           "--max-transaction-bytes", "1000", "--max-transactions-per-session", "3")
    try:
        with connected_to(server):
            a, b, c = (spindle.Counter(name=f"lim{i}") for i in range(3))
            with pytest.raises(spindle.TransactionError, match="more than 2 objects"):
                with spindle.transaction():
                    a.add(1)
                    b.add(1)
                    c.add(1)
            with pytest.raises(spindle.TransactionConflict, match="time limit"):
                with spindle.transaction():
                    a.add(1)
                    time.sleep(0.7)
                    b.add(1)
            blob = spindle.Blob(name="lim-blob")
            with pytest.raises(spindle.TransactionError, match="1000 bytes of calls"):
                with spindle.transaction():
                    a.add(1)
                    blob.set(b"x" * 600)
                    blob.set(b"y" * 600)
            assert blob.get() == b"" and a.get() == 0
            # Three threads each hold a transaction open: a fourth of the session is refused.
            inside, release = threading.Barrier(4), threading.Event()

            def hold(counter) -> None:
                with spindle.transaction():
                    counter.get()
                    inside.wait(10)
                    release.wait(10)

            holders = [threading.Thread(target=hold, args=(x,)) for x in (a, b, c)]
            for t in holders:
                t.start()
            inside.wait(10)
            try:
                with pytest.raises(spindle.TransactionError, match="3 transactions open"):
                    with spindle.transaction():
                        a.get()
            finally:
                release.set()
                for t in holders:
                    t.join(10)
            with spindle.transaction():
                a.add(1)
            assert (a.get(), b.get(), c.get()) == (1, 0, 0)
            status = spindle.status()
            assert status["transactions_committed"] == 4  # the three holders commit too
            assert status["transactions_aborted"] == 3  # the refused fourth never opened
            assert status["transactions_open"] == 0
            shown = subprocess.run(
                [server.binary, "status", "--address", server.address], capture_output=True, text=True, check=True
            ).stdout
            assert "4 committed, 3 aborted, 0 in flight" in shown
    finally:
        server.stop()


KILLED_MID_TRANSACTION = """
import os, sys, spindle
c = spindle.Counter(name=sys.argv[1])
txn = spindle.transaction()
txn.__enter__()
c.add(1000)
print("inside", flush=True)
sys.stdin.readline()
"""


def test_a_client_killed_mid_transaction_leaves_nothing_and_frees_its_objects(uniq: str, child_env: dict) -> None:
    c = spindle.Counter(0, name=f"{uniq}c")
    child = subprocess.Popen(
        [sys.executable, "-c", KILLED_MID_TRANSACTION, f"{uniq}c"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=child_env,
    )
    assert child.stdout.readline().strip() == "inside"
    child.send_signal(signal.SIGKILL)
    child.wait()

    # The dead client's transaction is older: this one gives way until the session's end
    # (or the transaction's time limit) frees the counter, then goes through.
    @spindle.transactional
    def bump() -> None:
        c.add(1)

    bump()
    assert c.get() == 1


LOCKED_IN_TRANSACTION = """
import sys, spindle
with spindle.transaction():  # the lock reached inside only: no single call on its shard
    assert spindle.Lock(name=sys.argv[1]).acquire(blocking=False)
print("held", flush=True)
sys.stdin.readline()
"""


def test_a_lock_acquired_in_a_transaction_is_released_when_its_holder_dies(uniq: str, child_env: dict) -> None:
    lock = spindle.Lock(name=f"{uniq}lock")
    child = subprocess.Popen(
        [sys.executable, "-c", LOCKED_IN_TRANSACTION, f"{uniq}lock"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=child_env,
    )
    assert child.stdout.readline().strip() == "held"
    assert not lock.acquire(blocking=False)
    child.send_signal(signal.SIGKILL)
    child.wait()
    with pytest.warns(spindle.AbandonedLockWarning):
        assert lock.acquire(timeout=30)  # released once the dead session ends


def test_a_refused_transaction_is_aborted_and_leaves_its_objects_free() -> None:
    server = ServerProcess("--max-transaction-bytes", "100000")
    try:
        with connected_to(server):
            big = spindle.Blob(name="big")
            big.set(b"x" * 200_000)
            c = spindle.Counter(name="c")
            # Too large to copy: refused, and the object is left free for the next.
            for _ in range(3):
                with pytest.raises(spindle.TransactionError, match="and was aborted"):
                    with spindle.transaction():
                        big.get()
            assert len(big.get()) == 200_000
            # The error caught inside: the transaction is gone, and its earlier calls with it.
            with pytest.raises(spindle.TransactionConflict, match="not open"):
                with spindle.transaction():
                    c.add(1)
                    try:
                        big.get()
                    except spindle.TransactionError:
                        pass
            assert c.get() == 0
            # Objects made inside count against the transaction's bytes too.
            used = spindle.status()["memory_used"]
            with pytest.raises(spindle.TransactionError, match="bytes of copies"):
                with spindle.transaction():
                    for i in range(8):
                        spindle.Array(1 << 20, name=f"made{i}").fill(7)
            assert spindle.status()["memory_used"] == used
            assert [name for name, _ in spindle.objects("made")] == []
            # Keys and methods count in its bytes too, not only arguments.
            named = spindle.List(name="l" * 60_000)
            with pytest.raises(spindle.TransactionError, match="bytes of calls"):
                with spindle.transaction():
                    named.reverse()
                    named.reverse()
            # A rename is no part of a transaction.
            with pytest.raises(spindle.TransactionError, match="keep"):
                with spindle.transaction():
                    spindle.keep(c, "kept")
            with spindle.transaction():
                c.add(1)
            assert c.get() == 1 and spindle.status()["transactions_open"] == 0
    finally:
        server.stop()


def test_a_caches_reads_inside_move_its_keys_as_outside(uniq: str) -> None:
    value = "v" * 1000

    def fresh(name: str) -> spindle.Dict:
        d = spindle.Dict(name=name, max_memory=2600)
        d["a"] = value
        d["b"] = value
        return d

    single = fresh(f"{uniq}single")
    single.get("a")
    single["c"] = value
    inside = fresh(f"{uniq}txn")
    with spindle.transaction():
        inside.get("a")
        inside["c"] = value
        seen = sorted(inside.keys())
    assert sorted(single.keys()) == seen == sorted(inside.keys()) == ["a", "c"]


ACCOUNTS = 100


def test_a_bank_keeps_its_total_through_kill_9s_and_every_transfer_lands_once(tmp_path: Path) -> None:
    from load import LoadClients, assert_under_load, kills_under_load

    port = stable_port()
    args = ("--data-dir", str(tmp_path / "data"), "--session-ttl", "30", "--partitions", "4")
    server = ServerProcess(*args, port=port)
    address = f"127.0.0.1:{port}"
    with connected_to(server):
        for i in range(ACCOUNTS):
            spindle.Counter(100, name=f"bank.{i}", persistent=True)
        spindle.List(name="bank.history", persistent=True)

    def kill_and_restart() -> None:
        nonlocal server
        server.kill()  # SIGKILL
        server = ServerProcess(*args, port=port)

    script = bank.client_script([f"bank.{i}" for i in range(ACCOUNTS)], "bank.history")
    env = dict(os.environ, SPINDLE_ADDRESS=address)
    try:
        with LoadClients(script, lambda i: [address, bank.ROLES[i], str(i)], len(bank.ROLES), tmp_path, env) as load:
            began = time.monotonic()
            window = kills_under_load(load, kill_and_restart, 10, random.Random(7))
            time.sleep(max(0.0, 20 - (time.monotonic() - began)))  # at least 20 s of transfers
            results = load.stop()
        assert_under_load(results, window)
        server.kill()  # one last crash: what follows is what the log rebuilt
        server = ServerProcess(*args, port=port)
        with connected_to(server):
            balances = [spindle.Counter(name=f"bank.{i}", persistent=True).get() for i in range(ACCOUNTS)]
            history = spindle.List(name="bank.history", persistent=True).copy()
    finally:
        server.kill()
    bank.check(results, balances, history)
