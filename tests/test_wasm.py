"""Compiled object types (``spindle.wasm_type``): WebAssembly modules whose methods run inside
the server (docs/wasm.md). The modules are the examples (``examples/wasm``) and a module that
misbehaves on request (``tests/fixtures/wasm/hostile.c``), built by ``make wasm``; every test
talks to a real server process.
"""

from __future__ import annotations

import concurrent.futures
import subprocess
import threading
from pathlib import Path

import pytest

import spindle
from conftest import REPO, ServerProcess, connected_to, server_binary, stable_port, wait_until

BUILD = REPO / "examples" / "wasm" / "build"
FIXTURES = REPO / "tests" / "fixtures" / "wasm" / "build"


def module(path: Path) -> Path:
    if not path.is_file():
        pytest.fail(f"{path} is missing: run `make wasm` (part of `make setup`)")
    return path


@pytest.fixture(scope="module")
def Bank():
    return spindle.wasm_type(module(BUILD / "bank.wasm"))


@pytest.fixture(scope="module")
def Hostile():
    return spindle.wasm_type(module(FIXTURES / "hostile.wasm"))


@pytest.mark.parametrize("build", ["bank.wasm", "bank_as.wasm"])
def test_an_account_in_c_and_in_assemblyscript(build, uniq):
    Account = spindle.wasm_type(module(BUILD / build), f"{uniq}bank")
    assert sorted(Account._methods) == ["balance", "deposit", "transfer", "withdraw"]
    a = Account(100, name=f"{uniq}alice")
    assert a.deposit(5) == 105
    assert a.withdraw(3) == 102
    with pytest.raises(ValueError, match="insufficient funds"):
        a.withdraw(1000)
    assert a.balance() == 102, "a failed method leaves the state as it was"
    with pytest.raises(AttributeError, match="no method 'steal'"):
        a.steal(1)  # type: ignore[attr-defined]
    # The same object from another proxy, by name.
    assert Account(name=f"{uniq}alice").balance() == 102
    assert spindle.attach(f"wasm:{uniq}bank", f"{uniq}alice").balance() == 102
    assert (f"{uniq}alice", f"wasm:{uniq}bank") in spindle.objects(uniq)


def test_a_method_runs_the_same_arithmetic_as_python(uniq):
    Op = spindle.wasm_type(module(BUILD / "complex_op.wasm"))
    o = Op(5, name=f"{uniq}op")
    x = 5
    for _ in range(10_000):
        x = (x * 31 + 7) % 1000003
    assert o.complex() == x
    Number = spindle.wasm_type(module(BUILD / "number.wasm"))
    n = Number(1.0)
    y = 1.0
    for _ in range(10_000):
        y *= 1.0000001
    assert n.spin(10_000, 1.0000001) == y


@pytest.mark.parametrize(
    "method, reason, message",
    [
        ("spin", "fuel", "ran out of fuel"),
        ("hog", "memory", "memory growth"),
        ("trap", "trap", "unreachable"),
        ("wild", "trap", "out of bounds"),
        ("recurse", "trap", "out of bounds"),  # C's stack is in memory, below the data
        ("garbage", "trap", "one MessagePack value"),
    ],
)
def test_a_trap_or_a_limit_is_an_error_on_that_call_only(Hostile, method, reason, message):
    h = Hostile()
    h.set(7)
    counter = spindle.Counter()
    with pytest.raises(spindle.Trapped, match=message) as raised:
        getattr(h, method)()
    assert raised.value.reason == reason
    assert h.get() == 7, "the state the method wrote before it failed is forgotten"
    assert counter.add(1) == 1, "the server serves other objects"
    assert h.get() == 7


def test_a_raised_error_is_the_builtin_exception_it_names(Hostile):
    h = Hostile()
    h.set(3)
    with pytest.raises(KeyError, match="no such thing"):
        getattr(h, "raise")()  # a keyword in Python, an ordinary name in C
    assert h.get() == 3


def test_the_fuel_limit_is_the_servers_flag(uniq):
    server = ServerProcess("--wasm-fuel", "1000")
    try:
        with connected_to(server):
            Op = spindle.wasm_type(module(BUILD / "complex_op.wasm"))
            o = Op(1)
            assert o.simple() == 38, "a short method fits in the budget"
            with pytest.raises(spindle.Trapped) as raised:
                o.complex()
            assert raised.value.reason == "fuel"
            assert o.simple() == (38 * 31 + 7) % 1000003
    finally:
        server.stop()


@pytest.mark.parametrize(
    "code, message",
    [
        (b"junk", "not a WebAssembly module"),
        (b"\0asm\x01\0\0\0", "memory"),  # an empty module: no exports at all
        (b"\0asm\x01\0\0\0\x01", "does not compile.*end-of-file"),  # truncated
    ],
)
def test_a_module_that_breaks_the_abi_is_refused_with_why(uniq, code, message):
    with pytest.raises(TypeError, match=message):
        spindle.wasm_type(code, f"{uniq}bad")
    assert spindle.Counter().add(2) == 2


def test_a_module_too_large_is_refused(uniq):
    with pytest.raises(TypeError, match="too large"):
        spindle.wasm_type(b"\0asm\x01\0\0\0" + b"\0" * (17 << 20), f"{uniq}huge")


def test_an_undefined_version_is_unknown_type(uniq):
    from spindle.client import current

    with pytest.raises(spindle.UnknownType, match="not defined"):
        current().create(f"wasm:{uniq}nothing", f"{uniq}k", ["feed", []], False)


def test_a_proxy_passed_to_a_cloud_thread_calls_the_same_object(Bank, uniq):
    a = Bank(0, name=f"{uniq}shared")
    with spindle.Executor() as ex:
        results = list(ex.map(deposit_one, [a] * 8))
    assert sorted(results) == list(range(1, 9))
    assert a.balance() == 8


def deposit_one(account) -> int:
    # A worker has no wasm_type of its own: its proxy is generic, every method is remote.
    return account.deposit(1)


def test_a_transfer_between_accounts_is_atomic(Bank, uniq):
    a, b = Bank(100, name=f"{uniq}a"), Bank(0, name=f"{uniq}b")

    @spindle.transactional
    def transfer(src, dst, amount):
        src.withdraw(amount)
        dst.deposit(amount)

    transfer(a, b, 30)
    assert (a.balance(), b.balance()) == (70, 30)
    with pytest.raises(ValueError, match="insufficient funds"):
        transfer(b, a, 50)  # b.withdraw fails: nothing of the transfer happens
    assert (a.balance(), b.balance()) == (70, 30)
    with spindle.transaction():
        b.deposit(5)
        assert b.balance() == 35
        a.deposit(1)
    assert (a.balance(), b.balance()) == (71, 35)


def test_spindle_define_prints_the_methods_and_refuses_a_bad_file(server, tmp_path):
    done = subprocess.run([server_binary(), "define", "--address", server.address, str(BUILD / "bank.wasm")],
                          capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["balance", "deposit", "transfer", "withdraw"]
    assert "defined wasm:bank" in done.stderr
    junk = tmp_path / "junk.wasm"
    junk.write_bytes(b"not wasm")
    done = subprocess.run([server_binary(), "define", "--address", server.address, str(junk)],
                          capture_output=True, text=True, timeout=30)
    assert done.returncode == 1
    assert "not a WebAssembly module" in done.stderr and not done.stdout


def killed_three_times(server: ServerProcess, args: tuple, port: int, replies: list) -> ServerProcess:
    """SIGKILL ``server`` three times, each once calls (``replies``: theirs, growing) go on;
    the server started again after the last."""
    for _ in range(3):
        assert wait_until(lambda: len(replies) > 20, 30)
        before = len(replies)
        server.kill()  # SIGKILL: no chance to flush anything
        server = ServerProcess(*args, port=port)
        assert wait_until(lambda: len(replies) > before + 20, 60)
    return server


def test_persistent_objects_survive_kill_9_with_every_acknowledged_call(tmp_path):
    port = stable_port()
    args = ("--data-dir", str(tmp_path), "--session-ttl", "30")
    server = ServerProcess(*args, port=port)
    address = server.address
    acknowledged = []
    stop = threading.Event()
    try:
        with connected_to(address):
            Account = spindle.wasm_type(module(BUILD / "bank.wasm"), "pbank", persistent=True)
            a = Account(1000, name="saved")
            Account(5, name="other").deposit(1)

            def deposits() -> None:
                while not stop.is_set():
                    acknowledged.append(a.deposit(1))

            t = threading.Thread(target=deposits)
            t.start()
            server = killed_three_times(server, args, port, acknowledged)
            stop.set()
            t.join(60)
            # Every acknowledged deposit applied exactly once, none twice (the client
            # retried the calls in flight at each kill; their recorded replies came back).
            assert acknowledged == list(range(1001, 1001 + len(acknowledged)))
            assert a.balance() == 1000 + len(acknowledged)
        server.kill()
        server = ServerProcess(*args, port=port)
        with connected_to(server):
            # A new program reaches it by name without defining the module: the server
            # compiled it again from its log.
            assert spindle.attach("wasm:pbank", "saved").balance() == 1000 + len(acknowledged)
            assert spindle.attach("wasm:pbank", "other").balance() == 6
            assert ("saved", "wasm:pbank") in spindle.objects(persistent=True)
    finally:
        stop.set()
        server.stop()


def test_persistent_objects_come_back_from_a_snapshot(tmp_path):
    args = ("--data-dir", str(tmp_path), "--snapshot-after", "4096")
    server = ServerProcess(*args)
    try:
        with connected_to(server):
            Account = spindle.wasm_type(module(BUILD / "bank_as.wasm"), "snapbank", persistent=True)
            accounts = [Account(i, name=f"acct{i}") for i in range(20)]
            for _ in range(20):
                for a in accounts:
                    a.deposit(1)
        assert wait_until(lambda: any((tmp_path / "wal").glob("snap-*.sps")), 30), sorted(tmp_path.rglob("*"))
        server.kill()
        server = ServerProcess(*args)
        with connected_to(server):
            assert [spindle.attach("wasm:snapbank", f"acct{i}").balance() for i in range(20)] == \
                [i + 20 for i in range(20)]
    finally:
        server.stop()


def test_a_cluster_leaders_crash_loses_no_acknowledged_call(tmp_path):
    from test_cluster import SHARDS, Cluster

    from spindle.client import shard_of

    cluster = Cluster(tmp_path)
    try:
        with connected_to(cluster.addresses):
            Account = spindle.wasm_type(module(BUILD / "bank.wasm"), "cbank", persistent=True)
            accounts = [Account(0, name=f"c{i}") for i in range(12)]  # on every shard
            for a in accounts:
                a.deposit(10)
            victim = cluster.busiest_leader()
            victim.kill()
            assert wait_until(lambda: cluster.every_shard_led(without=victim), 30), cluster.describe()
            for a in accounts:
                assert a.deposit(1) == 11, "the new leader has the object and its module"
            victim.start()
            assert wait_until(lambda: cluster.caught_up(victim), 30), cluster.describe()
            assert [a.balance() for a in accounts] == [11] * 12
            # A method's nested calls commit in one shard's Raft group: within its object's
            # shard they run; across shards they are refused, and nothing moves.
            shard = {f"c{i}": shard_of(f"c{i}", SHARDS) for i in range(12)}
            same = next((a, b) for a in shard for b in shard if a != b and shard[a] == shard[b])
            other = next(b for b in shard if shard[b] != shard[same[0]])
            src = spindle.attach("wasm:cbank", same[0])
            assert src.transfer(same[1], 4) == 7
            with pytest.raises(spindle.TransactionError, match="must stay in its object's shard"):
                src.transfer(other, 1)
            assert [spindle.attach("wasm:cbank", n).balance() for n in (same[0], same[1], other)] == [7, 15, 11]
    finally:
        cluster.stop()


def test_calls_cost_no_round_trip_to_a_host(Bank, uniq):
    """A compiled method runs in the server process: no object host starts for it."""
    a = Bank(0, name=f"{uniq}nohost")
    before = spindle.status().get("object_hosts", 0)
    for _ in range(50):
        a.deposit(1)
    assert a.balance() == 50
    assert spindle.status().get("object_hosts", 0) == before


@pytest.fixture(scope="module")
def Attack():
    return spindle.wasm_type(module(FIXTURES / "attack.wasm"))


@pytest.mark.parametrize("method", ["reply_many", "write_many", "read_many", "copy_many"])
def test_the_hosts_work_on_a_guests_bytes_costs_fuel(Attack, method):
    """A loop of a few instructions that hands the host 8 MiB on every turn (a reply, a state
    written or read) or copies 16 MiB with one `memory.copy`: the copies are paid for in
    fuel, so the call runs out of it in a fraction of a second instead of holding its
    partition for hours on the fuel of a tenth of one."""
    a = Attack()
    a.grow()  # an 8 MiB state, for read_many
    with pytest.raises(spindle.Trapped) as raised:
        getattr(a, method)(10_000)
    assert raised.value.reason == "fuel"
    assert spindle.Counter().add(1) == 1


def test_a_reply_of_many_tiny_values_is_refused_before_it_is_decoded(Attack):
    """Two million nils are 2 MB of reply but would decode to some 80 MB in the server (and
    stay in its reply log): a reply is counted before it is decoded, and refused past
    1,048,576 values, with the server's memory as it was."""
    a = Attack()
    assert a.nils(1000) == [None] * 1000
    with pytest.raises(spindle.Trapped, match="more than 1048576 values") as raised:
        a.nils(2_000_000)
    assert raised.value.reason == "trap"
    with pytest.raises(spindle.Trapped, match="a reply is at most"):
        a.nils(20_000_000)  # 20 MB: past the 16 MiB a reply (as a state) may have


# --- nested calls: a method that calls other objects ------------------------------------------


@pytest.fixture(scope="module")
def Echo():
    return spindle.wasm_type(module(BUILD / "sdk_echo.wasm"))


@pytest.mark.parametrize("build", ["bank.wasm", "bank_as.wasm"])
def test_a_transfer_deposits_into_the_other_account_and_commits_both_or_neither(build, uniq):
    Account = spindle.wasm_type(module(BUILD / build), f"{uniq}nbank")
    a, b = Account(100, name=f"{uniq}a"), Account(0, name=f"{uniq}b")
    assert a.transfer(f"{uniq}b", 30) == 70
    assert (a.balance(), b.balance()) == (70, 30)
    # The deposit into b ran before the withdrawal failed: it is undone with it.
    with pytest.raises(ValueError, match="insufficient funds"):
        a.transfer(f"{uniq}b", 1000)
    assert (a.balance(), b.balance()) == (70, 30)
    # The called object's error is the method's (the SDK raises it again).
    with pytest.raises(spindle.SpindleError, match=f"'{uniq}nobody' does not exist"):
        a.transfer(f"{uniq}nobody", 5)
    with pytest.raises(ValueError, match="must not be negative"):
        b.transfer(f"{uniq}a", -5)
    # An object whose method is running cannot be called again before it returns.
    with pytest.raises(RuntimeError, match="cannot be called again before it returns"):
        a.transfer(f"{uniq}a", 5)
    assert (a.balance(), b.balance()) == (70, 30)


def test_nested_calls_inside_a_transaction_are_part_of_it(Bank, uniq):
    a, b = Bank(50, name=f"{uniq}a"), Bank(0, name=f"{uniq}b")
    with pytest.raises(KeyError):
        with spindle.transaction():
            assert a.transfer(f"{uniq}b", 20) == 30
            assert b.balance() == 20, "the transaction sees its own nested call's change"
            raise KeyError("abort")
    assert (a.balance(), b.balance()) == (50, 0), "an aborted transaction leaves nothing of it"
    with spindle.transaction():
        a.transfer(f"{uniq}b", 20)
        b.transfer(f"{uniq}a", 5)
    assert (a.balance(), b.balance()) == (35, 15)


def test_a_method_calls_built_in_objects_and_sees_their_errors(Echo, uniq):
    counter = spindle.Counter(10, name=f"{uniq}counter")
    e = Echo(name=f"{uniq}echo")
    assert e.relay(f"{uniq}counter", "add", [5]) == [True, 15]
    assert counter.get() == 15
    ok, (kind, message) = e.relay(f"{uniq}counter", "nope", [])
    assert (ok, kind) == (False, "UnknownMethod") and "nope" in message
    ok, (kind, message) = e.relay(f"{uniq}missing", "get", [])
    assert (ok, kind) == (False, "NotFound")
    # The caller's state and the counter's change commit together: an error after the call
    # (here, the re-raised one) undoes the call.
    e.relay(f"{uniq}counter", "add", [1])
    with pytest.raises(spindle.SpindleError, match="UnknownMethod|nope"):
        e.relay_or_fail(f"{uniq}counter", "nope", [])
    assert counter.get() == 16


def test_a_chain_of_calls_is_bounded(Echo, uniq):
    spindle.Counter(7, name=f"{uniq}end")
    first = [Echo(name=f"{uniq}e{i}") for i in range(9)][0]

    def through(hops: int):
        """e0 relays to e1, e1 to e2 ... e<hops> asks the counter: hops + 2 objects."""
        args: list = [f"{uniq}end", "get", []]
        for i in reversed(range(2, hops + 1)):
            args = [f"{uniq}e{i}", "relay", args]
        return first.relay(f"{uniq}e1", "relay", args)

    reply = through(6)  # 8 objects: the most a chain may hold
    for _ in range(7):
        ok, reply = reply
        assert ok, reply
    assert reply == 7
    with pytest.raises(RuntimeError, match="deeper than 8"):
        through(7)
    assert spindle.Counter(name=f"{uniq}end").get() == 7


def test_a_call_that_raised_after_its_own_calls_fails_the_whole_call(Bank, Echo, uniq):
    """No savepoints: a nested call that raised after changing objects through its own
    nested calls cannot be undone alone, so the whole call fails and nothing of it happens."""
    a, b = Bank(10, name=f"{uniq}a"), Bank(0, name=f"{uniq}b")
    e = Echo(name=f"{uniq}echo")
    with pytest.raises(spindle.TransactionError, match="insufficient funds"):
        e.relay(f"{uniq}a", "transfer", [f"{uniq}b", 1000])  # a deposits into b, then raises
    assert (a.balance(), b.balance()) == (10, 0)
    # One that raised without calls of its own changed nothing: the method handles it.
    assert e.relay(f"{uniq}a", "withdraw", [1000]) == [False, ["ValueError", "insufficient funds"]]
    # Inside the client's transaction, such a method aborts the transaction.
    with pytest.raises(spindle.TransactionError, match="was aborted"):
        with spindle.transaction():
            b.deposit(1)
            a.transfer(f"{uniq}b", 1000)
    assert (a.balance(), b.balance()) == (10, 0)


def test_concurrent_transfers_keep_the_total(Bank, uniq):
    names = [f"{uniq}acct{i}" for i in range(5)]
    accounts = [Bank(100, name=n) for n in names]

    def churn(seed: int) -> int:
        import random

        rng, done = random.Random(seed), 0
        for _ in range(40):
            src, dst = rng.sample(range(5), 2)
            try:
                accounts[src].transfer(names[dst], rng.randint(1, 30))
                done += 1
            except ValueError:  # insufficient funds: nothing moved
                pass
        return done

    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        done = sum(pool.map(churn, range(4)))
    assert done > 0
    balances = [a.balance() for a in accounts]
    assert sum(balances) == 500 and min(balances) >= 0, balances


def test_persistent_transfers_survive_kill_9_exactly_once(tmp_path):
    port = stable_port()
    args = ("--data-dir", str(tmp_path), "--session-ttl", "30")
    server = ServerProcess(*args, port=port)
    moved = []
    stop = threading.Event()
    try:
        with connected_to(server.address):
            Account = spindle.wasm_type(module(BUILD / "bank.wasm"), "tbank", persistent=True)
            a, b = Account(100_000, name="from"), Account(0, name="to")

            def transfers() -> None:
                while not stop.is_set():
                    moved.append(a.transfer("to", 1))

            t = threading.Thread(target=transfers)
            t.start()
            server = killed_three_times(server, args, port, moved)
            stop.set()
            t.join(60)
            # Every acknowledged transfer applied exactly once (retries got their recorded
            # replies), and the replayed calls used their recorded nested replies.
            assert moved == list(range(99_999, 99_999 - len(moved), -1))
            assert (a.balance(), b.balance()) == (100_000 - len(moved), len(moved))
        server.kill()
        server = ServerProcess(*args, port=port)
        with connected_to(server):
            assert spindle.attach("wasm:tbank", "to").balance() == len(moved)
            assert spindle.attach("wasm:tbank", "from").balance() == 100_000 - len(moved)
    finally:
        stop.set()
        server.stop()


def test_a_call_sent_again_runs_once_in_and_out_of_a_transaction(server, Bank, uniq):
    """The same request (session, seq) sent twice: the second gets the first's reply, and
    the nested calls ran once; in a transaction too, where the reply is the transaction's."""
    from test_permissions import Session

    a, b = Bank(100, name=f"{uniq}a"), Bank(0, name=f"{uniq}b")
    s = Session(server.address, None, None)
    try:
        def transfer(seq: int, *txn) -> list:
            return s.ask("call", seq, 0, type(a)._type, f"{uniq}a", "transfer", [f"{uniq}b", 10], 0, *txn)

        first, again = transfer(5), transfer(5)
        assert first[1:] == again[1:] == [0, 90], (first, again)
        assert b.balance() == 10
        first, again = transfer(6, [7, 0, True]), transfer(6, [7, 0, False])
        assert first[1:] == again[1:] == [0, 80], (first, again)
        assert s.ask("commit", 7, 7)[1:] == [0, True]
        assert (a.balance(), b.balance()) == (80, 20)
    finally:
        s.conn.close()
