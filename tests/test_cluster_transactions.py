"""Transactions across a cluster's shards (docs/transactions.md, "Across a cluster's
shards"): real three-node clusters on loopback, transfers between accounts on shards led by
different nodes, and a bank whose total never changes while shard leaders are killed with
`kill -9`."""

from __future__ import annotations

import os
import random
import threading
import time
from pathlib import Path

import pytest

import bank

import spindle
from spindle.client import Client, Connection, frame, shard_of
from spindle.sessions import session_id
from test_cluster import CLUSTER_KEY, NODE_USER, SHARDS, Cluster, cluster  # noqa: F401  (the fixture)
from conftest import wait_until


def accounts_on_every_shard(prefix: str, per_shard: int) -> list:
    """Names of ``per_shard`` accounts on each shard."""
    names: list = []
    counts = {s: 0 for s in range(SHARDS)}
    i = 0
    while min(counts.values()) < per_shard:
        name = f"{prefix}{i}"
        shard = shard_of(name, SHARDS)
        if counts[shard] < per_shard:
            counts[shard] += 1
            names.append(name)
        i += 1
    return names


def test_a_transfer_between_shards_led_by_different_nodes_commits_atomically(cluster, monkeypatch):  # noqa: F811
    leaders = cluster.leaders()
    assert len(set(leaders.values())) > 1, "the shards' leadership is spread over the nodes"
    # connect() notes the address in the environment: the tests after this one find theirs.
    monkeypatch.setenv("SPINDLE_ADDRESS", cluster.addresses)
    spindle.connect(cluster.addresses, embedded=False)
    try:
        names = accounts_on_every_shard("acct", 2)
        accounts = [spindle.Counter(100, name=n, persistent=True) for n in names]

        @spindle.transactional
        def transfer(src, dst, amount):
            if src.get() < amount:
                return False
            src.add(-amount)
            dst.add(amount)
            return True

        # Each pair of shards, both ways; the commit's reply comes once all of it is visible.
        for a in accounts:
            for b in accounts:
                if a is not b:
                    assert transfer(a, b, 1)
        assert [a.get() for a in accounts] == [100] * len(accounts)
        assert transfer(accounts[0], accounts[-1], 100)
        assert (accounts[0].get(), accounts[-1].get()) == (0, 200)
        assert not transfer(accounts[0], accounts[1], 1)

        # An exception inside leaves nothing on any shard.
        with pytest.raises(ZeroDivisionError):
            with spindle.transaction():
                for a in accounts:
                    a.add(1000)
                1 / 0
        assert sum(a.get() for a in accounts) == 100 * len(accounts)

        # Threads transferring at random over every shard: the total never changes.
        rng = random.Random(3)
        errors: list = []

        def worker(seed: int) -> None:
            r = random.Random(seed)
            try:
                for _ in range(40):
                    src, dst = r.sample(accounts, 2)
                    transfer(src, dst, r.randint(1, 20))
            except Exception as exc:  # noqa: BLE001 - reported below
                errors.append(exc)

        threads = [threading.Thread(target=worker, args=(rng.random(),)) for _ in range(6)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert errors == []
        balances = [a.get() for a in accounts]
        assert sum(balances) == 100 * len(accounts) and min(balances) >= 0
    finally:
        spindle.disconnect()


def test_list_append_transactions_over_shards_are_strictly_serializable(cluster, tmp_path):  # noqa: F811
    """The list-append workload of tests/serializability over lists on several shards led
    by different nodes, its history checked after Elle."""
    from serializability.checker import load
    from serializability.workload import run

    history = str(tmp_path / "history.jsonl")
    report = run(cluster.addresses, keys=6, processes=3, duration=5.0, history=history)
    assert report.valid, report.format()
    committed = [record for record in load(history) if record["type"] == "ok"]
    assert any(len({op[1] for op in record["ops"]}) > 1 for record in committed)


def test_a_participant_whose_coordinator_never_decides_learns_a_presumed_abort(cluster):  # noqa: F811
    """A node prepares a transaction in one shard and then says nothing more, as a
    coordinator that crashed between the phases: reads of the prepared object wait, the
    participant asks the coordinator shard, which has no decision and no commit under way,
    so it logs an abort; the waiting read then sees the object unchanged, and the
    transaction's own late commit finds the abort."""
    names = sorted(accounts_on_every_shard("pa", 1), key=lambda n: shard_of(n, SHARDS))
    early, late = names[0], names[-1]
    participant, coordinator = shard_of(late, SHARDS), shard_of(early, SHARDS)
    assert coordinator < participant
    client = Client(cluster.addresses)
    reader = Client(cluster.addresses)
    try:
        for name in (early, late):
            client.create("Counter", name, [10], False, persistent=True)
        txn = client.begin()
        assert client.call("Counter", early, "add", [1]) == 11
        assert client.call("Counter", late, "add", [5]) == 15
        client.end(txn)
        # As the coordinator would: prepare the transaction's part in the participant shard.
        leader = next(n for n in cluster.nodes if n.node_id == cluster.leaders()[participant])
        node = Connection(leader.host, leader.port, "txn-test-node-session", 1, CLUSTER_KEY, user=NODE_USER)
        try:
            me = session_id(client._state.secret)
            reply = node.roundtrip(frame([2, "prepare", me, txn.number, participant, coordinator]), 2)
            assert reply == [2, 0, True], reply
        finally:
            node.close()
        # A read of the prepared object waits for the decision, which the participant asks for.
        seen: list = []
        waiting = threading.Thread(target=lambda: seen.append(reader.call("Counter", late, "get", [])))
        waiting.start()
        waiting.join(60)
        assert seen == [10], "the prepared writes were dropped once the abort was presumed"
        # The transaction's commit, late, finds the abort logged by the coordinator shard.
        with pytest.raises(spindle.TransactionConflict, match="did not reach a decision"):
            client.commit(txn)
        assert [reader.call("Counter", n, "get", []) for n in (early, late)] == [10, 10]
    finally:
        client.close()
        reader.close()


ACCOUNTS = 100


def test_a_bank_over_shards_keeps_its_total_through_leaders_killed_and_every_transfer_lands_once(
    cluster, tmp_path: Path,  # noqa: F811
) -> None:
    from load import LoadClients, assert_under_load, kills_under_load

    names = [f"bank.{i}" for i in range(ACCOUNTS)]
    assert {shard_of(n, SHARDS) for n in names} == set(range(SHARDS))
    roles = bank.ROLES
    client = Client(cluster.addresses)
    try:
        for n in names:
            client.create("Counter", n, [100], False, persistent=True)
        for i, role in enumerate(roles):
            if role == "transfer":
                client.create("List", f"bank.history.{i}", [], False, persistent=True)
    finally:
        client.close()
    rng = random.Random(11)

    def kill_a_leader_and_restart() -> None:
        # The leader of a shard picked at random: coordinators and participants alike die.
        leaders = cluster.leaders()
        victim_id = leaders[rng.choice(sorted(leaders))]
        victim = next(n for n in cluster.nodes if n.node_id == victim_id)
        victim.kill()  # SIGKILL
        assert wait_until(lambda: cluster.every_shard_led(without=victim), 20), cluster.describe()
        victim.start()  # its data directory is intact
        assert wait_until(lambda: cluster.caught_up(victim), 30), cluster.describe()

    script = bank.client_script(names, "bank.history.{me}")  # one per client: no hot key
    address = cluster.addresses
    env = dict(os.environ, SPINDLE_ADDRESS=address)
    with LoadClients(script, lambda i: [address, roles[i], str(i)], len(roles), tmp_path, env) as load:
        began = time.monotonic()
        window = kills_under_load(load, kill_a_leader_and_restart, 5, random.Random(7))
        time.sleep(max(0.0, 20 - (time.monotonic() - began)))  # at least 20 s of transfers
        results = load.stop()
    assert_under_load(results, window)
    client = Client(cluster.addresses)
    try:
        balances = [client.call("Counter", n, "get", []) for n in names]
        history = [tid for i, role in enumerate(roles) if role == "transfer"
                   for tid in client.call("List", f"bank.history.{i}", "items", [])]
    finally:
        client.close()
    bank.check(results, balances, history)
