"""Cluster mode with real processes: three `spindle server --node-id` nodes on loopback,
replicated shards, `kill -9` and `SIGSTOP` of leaders under load, restarts with the data
directory intact, and membership changes while serving (docs/cluster.md)."""

from __future__ import annotations

import contextlib
import ipaddress
import json
import os
import random
import shutil
import signal
import struct
import subprocess
import sys
import threading
import time
import zlib
from pathlib import Path
from typing import Dict, Iterable, Iterator, List, NamedTuple, Optional

import pytest

import spindle
from spindle.client import Client, Connection, frame, shard_of
from spindle.errors import Unauthorized
from spindle.sessions import new_secret
from conftest import REPO, ServerProcess, listening, pythonpath_for_tests, server_binary, stable_port, wait_until
from load import EXACTLY_ONCE, FAULT_AFTER, FaultWindow, LoadClients, assert_under_load

SHARDS = 4
# The nodes split the machine's cores, as `spindle cluster local` does.
THREADS = max(1, len(os.sched_getaffinity(0)) // 3)
# The token of nodes listening on a network namespace's address (not loopback).
NETNS_TOKEN = "cluster-test-token"
# What the test clusters' nodes authenticate each other with, as the user nodes say hello as.
CLUSTER_KEY = "cluster-test-key"
NODE_USER = "~node"


def cluster_map(host: str, port: int) -> Dict:
    """The view of the cluster of the node at ``host:port`` (the `cluster` request), asked
    with ``$SPINDLE_TOKEN`` as the SDK would."""
    conn = Connection(host, port, "cluster-test-session", 1, os.environ.get("SPINDLE_TOKEN"))
    try:
        reply = conn.roundtrip(frame([2, "cluster"]), 2)
    finally:
        conn.close()
    assert reply[1] == 0, reply
    return reply[2]


class Node:
    """One cluster node: a server process with its own port and data directory (run by
    ``binary``, default the build under test)."""

    def __init__(
        self, node_id: int, data_dir: Path, join: Optional[str] = None, *extra: str,
        netns: Optional["Netns"] = None, start: bool = True, binary: Optional[str] = None,
    ) -> None:
        self.node_id = node_id
        self.binary = binary
        self.extra = list(extra)
        self.data_dir = data_dir
        self.netns = netns
        self.host = netns.host(node_id) if netns else "127.0.0.1"
        self.port = 7070 if netns else stable_port()
        self.address = f"{self.host}:{self.port}"
        self.join = join
        self.log = data_dir.parent / f"node{node_id}.log"
        self.server: Optional[ServerProcess] = None
        if start:
            self.start()

    def start(self) -> None:
        args = ["--node-id", str(self.node_id), "--data-dir", str(self.data_dir), "--cluster-key", CLUSTER_KEY]
        args += ["--partitions", str(SHARDS), "--threads", str(THREADS), "--python", sys.executable]
        if "--session-ttl" not in self.extra:
            args += ["--session-ttl", "30"]
        if self.join:
            args += ["--join", self.join]
        args += self.extra
        prefix: List[str] = []
        if self.netns:
            args += ["--host", self.host, "--token", NETNS_TOKEN, "--insecure"]
            prefix = self.netns.exec_prefix(self.node_id)
        with open(self.log, "a") as log:
            self.server = ServerProcess(*args, port=self.port, stderr=log, prefix=prefix, binary=self.binary)

    def map(self) -> Dict:
        """This node's view of the cluster (the `cluster` request)."""
        return cluster_map(self.host, self.port)

    def kill(self) -> None:
        assert self.server is not None
        self.server.kill()

    def stop(self) -> None:
        if self.server is not None:
            self.server.stop()


class Cluster:
    """Three nodes: the first starts the cluster, the others join it through the first."""

    def __init__(
        self, root: Path, size: int = 3, rf: int = 3, netns: Optional["Netns"] = None, extra: tuple = (),
        binary: Optional[str] = None,
    ) -> None:
        self.root = root
        self.extra = extra
        self.nodes: List[Node] = []
        for node_id in range(1, size + 1):
            join = self.nodes[0].address if self.nodes else None
            self.nodes.append(Node(
                node_id, root / f"n{node_id}", join, "--replication-factor", str(rf), *extra, netns=netns,
                binary=binary,
            ))
        assert wait_until(self.settled, 30), self.describe()

    def add(self) -> Node:
        """Start one more node, joining through the last one."""
        node = Node(len(self.nodes) + 1, self.root / f"n{len(self.nodes) + 1}", self.nodes[-1].address, *self.extra)
        self.nodes.append(node)
        return node

    def views(self) -> Dict[int, Dict]:
        """Every group as its leader sees it (a node knows only the groups it holds)."""
        views: Dict[int, Dict] = {}
        for node in self.nodes:
            try:
                cluster = node.map()
            except OSError:
                continue
            for g in cluster["groups"] + [dict(cluster["metadata"], shard="meta")]:
                if g["leader"] == node.node_id:
                    views[g["shard"]] = g
        return views

    def settled(self) -> bool:
        """Every started node is a member, and every group has a leader and exactly its
        placed replicas as voters (the nodes that do not vote on the metadata follow it as
        learners)."""
        try:
            members = set(map(int, self.nodes[0].map()["nodes"]))
        except OSError:
            return False
        if members != {n.node_id for n in self.nodes}:
            return False
        views = self.views()
        return len(views) == SHARDS + 1 and all(
            sorted(g["voters"]) == sorted(g["placement"]) and (shard == "meta" or not g["learners"])
            and g["leader"] == g["placement"][0]  # leadership too has moved where it goes
            for shard, g in views.items()
        )

    @property
    def addresses(self) -> str:
        return ",".join(n.address for n in self.nodes)

    def voters_everywhere(self, voters: set) -> bool:
        views = self.views()
        return len(views) == SHARDS + 1 and all(set(g["voters"]) == voters for g in views.values())

    def leaders(self, via: Optional[Node] = None) -> Dict[int, int]:
        """Each shard's leader (node id), as its leader sees it (or as ``via`` sees it)."""
        if via is not None:
            return {g["shard"]: g["leader"] for g in via.map()["groups"]}
        return {shard: g["leader"] for shard, g in self.views().items() if shard != "meta"}

    def every_shard_led(self, via: Optional[Node] = None, without: Optional[Node] = None) -> bool:
        """Whether every shard has a leader (as ``leaders(via)`` sees them), none of them
        ``without``. A shard missing from the map, or with no leader, is not led."""
        leaders = self.leaders(via)
        return (
            set(leaders) == set(range(SHARDS)) and all(leaders.values())
            and (without is None or without.node_id not in leaders.values())
        )

    def busiest_leader(self) -> Node:
        counts: Dict[int, int] = {}
        for leader in self.leaders().values():
            counts[leader] = counts.get(leader, 0) + 1
        node_id = max(counts, key=counts.__getitem__)
        return next(n for n in self.nodes if n.node_id == node_id)

    def caught_up(self, node: Node) -> bool:
        """Whether ``node`` applied the log of every shard it holds as far as the shard's
        leader committed."""
        try:
            mine = {g["shard"]: g["applied"] for g in node.map()["groups"]}
        except OSError:
            return False
        views = self.views()
        return all(
            mine[shard] >= g["commit"]
            for shard, g in views.items()
            if shard != "meta" and node.node_id in g["voters"]
        ) and len(views) == SHARDS + 1

    def describe(self) -> str:
        out = []
        for n in self.nodes:
            try:
                m = n.map()
                out.append(json.dumps(m["groups"] + [m["metadata"]]))
            except OSError as exc:
                out.append(f"node {n.node_id}: {exc}")
        return "\n".join(out)

    def stop(self) -> None:
        for n in self.nodes:
            n.stop()


@pytest.fixture
def cluster(tmp_path):
    c = Cluster(tmp_path)
    yield c
    c.stop()


class History:
    """Client threads calling ``add`` and ``get`` at random on persistent counters, each call
    recorded with its outcome and its call and return times (one monotonic clock, the same
    in every process of the machine) for the Porcupine checker (tests/linearizability). A
    call that failed has an unknown outcome (``known`` false): it may have applied or not."""

    def __init__(self, address: str, keys: List[str], clients: int = 4) -> None:
        setup = Client(address)
        try:
            for key in keys:
                setup.create("Counter", key, [], False, persistent=True)
        finally:
            setup.close()
        self.keys = keys
        self.ops: List[dict] = []
        self.faults: List[tuple] = []  # (what, start, end), monotonic ns
        self.lock = threading.Lock()
        self.stopping = threading.Event()
        self.threads = [threading.Thread(target=self.client_loop, args=(address, i), daemon=True)
                        for i in range(clients)]
        for t in self.threads:
            t.start()

    def client_loop(self, address: str, me: int) -> None:
        client = Client(address)
        rng = random.Random(me)
        try:
            while not self.stopping.is_set():
                key = rng.choice(self.keys)
                op, arg = ("add", rng.randint(1, 5)) if rng.random() < 0.6 else ("get", 0)
                call = time.monotonic_ns()
                try:
                    out = client.call("Counter", key, op, [arg] if op == "add" else [])
                    known = True
                except (spindle.SpindleError, OSError):
                    out, known = 0, False
                ret = time.monotonic_ns()
                with self.lock:
                    self.ops.append({"client": me, "op": op, "key": key, "arg": arg, "out": out,
                                     "known": known, "call": call, "ret": ret})
        finally:
            client.close()

    def known(self, since: int = 0, op: Optional[str] = None, keys: Optional[Iterable[str]] = None) -> int:
        """Acknowledged calls made at or after ``since`` (of ``op`` on ``keys``, if given)."""
        keys = None if keys is None else set(keys)
        with self.lock:
            return sum(1 for o in self.ops if o["known"] and o["call"] >= since
                       and (op is None or o["op"] == op) and (keys is None or o["key"] in keys))

    def wait_known(self, count: int, since: int = 0, **which) -> None:
        assert wait_until(lambda: self.known(since, **which) >= count, 120, interval=0.02), (
            f"{self.known(since, **which)} of {count} calls {which or ''} acknowledged"
        )

    @contextlib.contextmanager
    def fault(self, what: str) -> Iterator[None]:
        """Inject a fault (the body) once ``FAULT_AFTER`` calls were acknowledged since the
        last one ended, and wait for as many more once it is over."""
        self.wait_known(FAULT_AFTER, since=self.faults[-1][2] if self.faults else 0)
        start = time.monotonic_ns()
        yield
        end = time.monotonic_ns()
        self.faults.append((what, start, end))
        self.wait_known(FAULT_AFTER, since=end)

    def check(self, tmp_path: Path, more: Iterable[dict] = ()) -> None:
        """The history (with ``more`` operations recorded elsewhere) is linearizable, and
        each fault had ``FAULT_AFTER`` acknowledged calls before it and after it."""
        self.stopping.set()
        for t in self.threads:
            t.join(60)
            assert not t.is_alive(), "a history client is stuck in a call"
        ops = self.ops + list(more)
        (tmp_path / "history.jsonl").write_text("".join(json.dumps(op) + "\n" for op in ops))
        assert self.faults, "no fault was injected"
        since = 0
        for what, start, end in self.faults:
            before = sum(1 for o in ops if o["known"] and since <= o["call"] and o["ret"] < start)
            after = sum(1 for o in ops if o["known"] and o["call"] >= end)
            print(f"history: {what}: {before} calls acknowledged before it, {after} after it")
            assert before >= FAULT_AFTER and after >= FAULT_AFTER, (
                f"{what}: {before} calls acknowledged before it, {after} after it"
            )
            since = end
        out = check_history(ops)
        assert out.returncode == 0, out.stdout + out.stderr

    def __enter__(self) -> "History":
        return self

    def __exit__(self, *exc: object) -> None:
        self.stopping.set()
        for t in self.threads:
            t.join(60)


def keys_on_every_shard(prefix: str) -> List[str]:
    """One key per shard, the i-th on shard i."""
    return [next(f"{prefix}{shard}.{i}" for i in range(1000) if shard_of(f"{prefix}{shard}.{i}", SHARDS) == shard)
            for shard in range(SHARDS)]


class LoadRun(NamedTuple):
    results: List[dict]  # what each load client saw acknowledged, and when ("acked_at")
    fault_began: int  # time.monotonic_ns() as the fault began
    fault_over: int  # and once it was over


def run_load(cluster: Cluster, tmp_path: Path, during, clients: int = 3, history: Optional[History] = None) -> LoadRun:
    """Run ``clients`` ``EXACTLY_ONCE`` load processes against the cluster; once they had
    ``FAULT_AFTER`` calls acknowledged (and ``history`` too), inject the fault: ``during(load)``;
    once it is over, wait for ``FAULT_AFTER`` more acknowledged after it, and stop them."""
    address = cluster.addresses
    with LoadClients(EXACTLY_ONCE, lambda i: [address, "load", str(i)], clients, tmp_path) as load:
        load.wait_acknowledged(FAULT_AFTER)
        with history.fault(during.__name__) if history else contextlib.nullcontext():
            began = time.monotonic_ns()
            during(load)
            over = time.monotonic_ns()
        load.wait_acknowledged(FAULT_AFTER, since=over)
        return LoadRun(load.stop(), began, over)


def check_exactly_once(cluster: Cluster, run: LoadRun) -> None:
    """The fault landed under load, and the load outlived it, by the times the load clients
    wrote down (not the progress the waits read); every acknowledged update is in the
    cluster, each exactly once."""
    assert_under_load(run.results, FaultWindow(run.fault_began, run.fault_over))
    client = Client(cluster.addresses)
    try:
        seen = sorted(v for r in run.results for v in r["seen"])
        assert seen == list(range(1, len(seen) + 1)), "an acknowledged increment was lost or applied twice"
        assert client.call("Counter", "load.shared", "get", []) == len(seen)
        for i, r in enumerate(run.results):
            assert client.call("Counter", f"load.c{i}", "get", []) == r["adds"]
            assert client.call("Dict", "load.dict", "getitem", [f"k{i}"]) == r["merged"]
            assert r["adds"] == r["merged"] == len(r["seen"]) == len(r["acked_at"])
    finally:
        client.close()


def load_goes_on(load: LoadClients) -> None:
    """Wait for ``FAULT_AFTER`` more acknowledged calls: the load carries on while the
    fault is in place."""
    load.wait_acknowledged(FAULT_AFTER, since=time.monotonic_ns())


def test_every_shard_is_replicated_on_three_nodes_and_calls_reach_their_leader(cluster):
    client = Client(cluster.addresses)
    try:
        keys = [f"rep{i}" for i in range(16)]
        assert {shard_of(k, SHARDS) for k in keys} == set(range(SHARDS)), "the keys cover every shard"
        for k in keys:
            client.create("Counter", k, [], False, persistent=True)
            for _ in range(5):
                client.call("Counter", k, "add", [2])
        assert [client.call("Counter", k, "get", []) for k in keys] == [10] * 16
        assert client.shards == SHARDS
    finally:
        client.close()
    # Every node applies every shard's log up to its leader's commit.
    for node in cluster.nodes:
        assert wait_until(lambda: cluster.caught_up(node), 10), cluster.describe()
    # The CLI shows the same map.
    out = subprocess.run(
        [server_binary(), "cluster", "status", "--address", cluster.nodes[1].address],
        capture_output=True, text=True, timeout=30,
    )
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0] == f"3 nodes, {SHARDS} shards, 3 replicas each, cluster format 5", out.stdout
    table = lines[lines.index(next(line for line in lines if line.startswith("shard"))) + 1:]
    rows = [line.split() for line in table]
    assert [r[0] for r in rows] == [str(i) for i in range(SHARDS)] + ["meta"], out.stdout
    assert all(r[2] == "1,2,3" and r[-1] == "up" for r in rows), out.stdout
    # Leadership follows placement: the three nodes share the shards' leadership.
    assert len({r[1] for r in rows[:SHARDS]}) > 1, out.stdout


def test_users_and_roles_are_replicated_to_every_node_and_kept_across_a_restart(cluster):
    """Users and roles live in the metadata group: made through any node, they authenticate
    on every node, and a restarted node still knows them."""
    def spindle_cli(address: str, *args: str, user: Optional[str] = None,
                    token: Optional[str] = None) -> subprocess.CompletedProcess:
        env = {k: v for k, v in os.environ.items() if k not in ("SPINDLE_USER", "SPINDLE_TOKEN")}
        env.update({"SPINDLE_ADDRESS": address, **({"SPINDLE_USER": user} if user else {}),
                    **({"SPINDLE_TOKEN": token} if token else {})})
        return subprocess.run([server_binary(), *args], env=env, capture_output=True, text=True, timeout=60)

    def authenticates(node: Node, user: str, token: str) -> bool:
        try:
            Connection(node.host, node.port, new_secret(), 1, token, user=user).close()
            return True
        except (Unauthorized, OSError):
            return False

    # The cluster has no token: its first user must be an administrator.
    out = spindle_cli(cluster.nodes[2].address, "user", "add", "root", "--role", "admin")
    assert out.returncode == 0, out.stderr
    root = out.stdout.strip()
    assert wait_until(lambda: all(authenticates(n, "root", root) for n in cluster.nodes), 10)
    out = spindle_cli(cluster.nodes[1].address, "role", "add", "app", "read,write,create:app/",
                      user="root", token=root)
    assert out.returncode == 0, out.stderr
    out = spindle_cli(cluster.nodes[0].address, "user", "add", "ann", "--role", "app", user="root", token=root)
    assert out.returncode == 0, out.stderr
    ann = out.stdout.strip()
    assert wait_until(lambda: all(authenticates(n, "ann", ann) for n in cluster.nodes), 10)
    for node in cluster.nodes:
        with pytest.raises(Unauthorized, match="needs credentials"):
            Connection(node.host, node.port, new_secret(), 1)
    # Ann's permissions hold on the node leading the shard of her objects.
    client_env = dict(SPINDLE_USER="ann", SPINDLE_TOKEN=ann)
    old = {k: os.environ.get(k) for k in client_env}
    os.environ.update(client_env)
    try:
        client = Client(cluster.addresses)
        client.create("Counter", "app/hits", [], False, persistent=True)
        assert client.call("Counter", "app/hits", "add", [3]) == 3
        with pytest.raises(spindle.PermissionDenied):
            client.create("Counter", "hits", [], False, persistent=True)
        client.close()
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    # A restarted node reads them back from its metadata log.
    node = cluster.nodes[2]
    node.stop()
    node.join = None
    node.start()
    assert authenticates(node, "ann", ann)
    assert not authenticates(node, "ann", "a wrong token")


def test_a_node_that_does_not_lead_the_shard_answers_with_its_leader(cluster):
    leaders = cluster.leaders()
    shard, leader = next(iter(leaders.items()))
    key = next(f"k{i}" for i in range(1000) if shard_of(f"k{i}", SHARDS) == shard)
    follower = next(n for n in cluster.nodes if n.node_id != leader)
    leader_node = next(n for n in cluster.nodes if n.node_id == leader)
    conn = Connection("127.0.0.1", follower.port, "redirect-test-session", 1)
    try:
        reply = conn.roundtrip(frame([2, "create", 1, 0, "Counter", key, [], False]), 2)
        assert reply[1] == 1 and reply[2][0] == "NotLeader", reply
        assert reply[2][2] == leader_node.address
        assert conn.hello["shards"] == SHARDS and conn.hello["node"] == follower.node_id
    finally:
        conn.close()
    # The create ran nowhere: the leader has no such counter.
    client = Client(leader_node.address)
    try:
        with pytest.raises(spindle.errors.ObjectNotFound):
            client.call("Counter", key, "get", [])
    finally:
        client.close()


def test_keep_moves_an_object_to_a_name_whose_shard_another_node_leads(cluster):
    """``keep`` under a name in another shard: the object's state moves to the node leading
    the name's shard (or stays on this node if it leads both), and its old key forwards to
    the name. A taken name, or a type whose state is its holders and waiters, leaves the
    object under its key."""
    leaders = cluster.leaders()
    assert len(set(leaders.values())) > 1, f"one node leads every shard: {leaders}"
    client = Client(cluster.addresses)
    try:
        for i in range(12):
            # Every other name in a shard another node leads: both ways of moving run.
            key = client.unnamed_key()
            name = next(f"kept{i}.{j}" for j in range(1000)
                        if (leaders[shard_of(key, SHARDS)] != leaders[shard_of(f"kept{i}.{j}", SHARDS)]) == (i % 2 == 0))
            client.create("Dict", key, [], True)
            client.call("Dict", key, "setitem", ["n", i])
            client.call("Dict", key, "setitem", ["items", list(range(i))])
            assert client.keep("Dict", key, name) == name
            assert client.call("Dict", name, "get", ["n"]) == i
            assert client.call("Dict", name, "get", ["items"]) == list(range(i))
            with pytest.raises(spindle.errors.Moved) as moved:
                client.call("Dict", key, "get", ["n"])
            assert moved.value.new_key == name
            # A resent keep is answered as the first was.
            assert client.keep("Dict", key, name) == name

        # The name is taken on the other node: the object stays, with its state.
        key = client.unnamed_key()
        client.create("Counter", key, [], True)
        client.call("Counter", key, "add", [7])
        taken = next(f"taken{i}" for i in range(1000)
                     if leaders[shard_of(f"taken{i}", SHARDS)] != leaders[shard_of(key, SHARDS)])
        client.create("Counter", taken, [], False)
        with pytest.raises(TypeError, match="already a Counter"):
            client.keep("Counter", key, taken)
        assert client.call("Counter", key, "get", []) == 7
        assert client.call("Counter", taken, "get", []) == 0

        # A compiled object moves with its state; its module is compiled on the node it
        # comes to, where its type must be defined (each node keeps its own classes).
        bank = REPO / "examples" / "wasm" / "build" / "bank.wasm"
        if not bank.is_file():
            pytest.fail(f"{bank} is missing: run `make wasm` (part of `make setup`)")
        key = client.unnamed_key()
        far = next(f"account{i}" for i in range(1000)
                   if leaders[shard_of(f"account{i}", SHARDS)] != leaders[shard_of(key, SHARDS)])
        client.define("wasm:kept-bank", "v1", bank.read_bytes(), key=key)
        client.create("wasm:kept-bank", key, ["v1", [40]], True)
        client.call("wasm:kept-bank", key, "deposit", [2])
        with pytest.raises(spindle.errors.UnknownType, match="not defined"):
            client.keep("wasm:kept-bank", key, far)
        assert client.call("wasm:kept-bank", key, "balance", []) == 42
        client.define("wasm:kept-bank", "v1", bank.read_bytes(), key=far)
        assert client.keep("wasm:kept-bank", key, far) == far
        assert client.call("wasm:kept-bank", far, "deposit", [8]) == 50

        # A Lock's state cannot leave its node's connections: a clear error, the lock stays.
        key = client.unnamed_key()
        client.create("Lock", key, [], True)
        far = next(f"lock{i}" for i in range(1000)
                   if leaders[shard_of(f"lock{i}", SHARDS)] != leaders[shard_of(key, SHARDS)])
        with pytest.raises(ValueError, match="cannot move to another node"):
            client.keep("Lock", key, far)
        assert client.call("Lock", key, "acquire", [False]) is True
    finally:
        client.close()

    # The node side of a move: an `adopt` resent with its origin is answered as the first
    # was; another move to the name finds it taken; an expired one is refused.
    name = "adopted"
    leader = next(n for n in cluster.nodes if n.node_id == leaders[shard_of(name, SHARDS)])
    outsider = Connection(leader.host, leader.port, "adopt-outsider-session", 1)
    try:
        # Only a node, with the cluster key, may move objects in: a client may not.
        reply = outsider.roundtrip(frame([2, "adopt", "Counter", name, {"v": 1, "value": 1}, "n9:0",
                                          int(time.time() * 1000) + 60_000]), 2)
        assert reply[1] == 1 and reply[2][0] == "PermissionDenied", reply
    finally:
        outsider.close()
    with pytest.raises(Unauthorized, match="wrong cluster key"):
        Connection(leader.host, leader.port, "adopt-forger-session", 1, "not-the-key", user=NODE_USER)
    conn = Connection(leader.host, leader.port, "adopt-test-session", 1, CLUSTER_KEY, user=NODE_USER)
    try:
        state = {"v": 1, "value": 41}
        later = int(time.time() * 1000) + 60_000

        def adopt(rid: int, origin: str, expires: int = later) -> list:
            return conn.roundtrip(frame([rid, "adopt", "Counter", name, state, origin, expires]), rid)

        assert adopt(2, "n9:1:~x.1") == [2, 0, name]
        assert adopt(3, "n9:1:~x.1") == [3, 0, name]
        taken = adopt(4, "n9:2:~x.1")
        assert taken[1] == 1 and "already a Counter" in taken[2][1], taken
        expired = adopt(5, "n9:3:~y.1", expires=int(time.time() * 1000) - 1)
        assert expired[1] == 1 and expired[2][0] == "Busy" and "expired" in expired[2][1], expired
        # A state that is not a Counter's is refused (before the name is even looked at).
        bad = conn.roundtrip(frame([6, "adopt", "Counter", name, {"v": 1, "value": "x"}, "n9:4", later]), 6)
        assert bad[1] == 1 and bad[2][0] == "ValueError", bad
        # Snapshot frames out of order or that do not decode are dropped (they are one-way):
        # the connection goes on, and no received file is left behind.
        conn.sock.sendall(frame([7, "snapshot", 9, "127.0.0.1:1", 0, None, b"orphan", False]))
        conn.sock.sendall(frame([8, "snapshot", 9, "127.0.0.1:1", 0, b"\xff\xff not protobuf", b"data", False]))
        assert conn.roundtrip(frame([9, "ping"]), 9) == [9, 0, "pong"]
        assert not list((leader.data_dir / "raft").glob("snap-*-incoming-*.tmp"))
    finally:
        conn.close()
    client = Client(cluster.addresses)
    try:
        assert client.call("Counter", name, "get", []) == 41
    finally:
        client.close()


def test_a_keep_whose_target_leader_is_paused_follows_the_name_to_its_new_leader(cluster):
    """A move to a name whose shard's leader is paused (`SIGSTOP`: its kernel still accepts
    connections, nothing answers) does not wait on it: the move goes on to the leader the
    shard elects meanwhile, and the object is there."""
    leaders = cluster.leaders()
    client = Client(cluster.addresses)
    key = client.unnamed_key()
    client.create("Counter", key, [], True)
    client.call("Counter", key, "add", [5])
    name = next(f"far{i}" for i in range(1000)
                if leaders[shard_of(f"far{i}", SHARDS)] != leaders[shard_of(key, SHARDS)])
    target = next(n for n in cluster.nodes if n.node_id == leaders[shard_of(name, SHARDS)])
    outcome: list = []

    def keep() -> None:
        try:
            outcome.append(client.keep("Counter", key, name))
        except Exception as exc:  # noqa: BLE001 - the outcome is checked below
            outcome.append(exc)

    os.kill(target.server.process.pid, signal.SIGSTOP)
    try:
        keeper = threading.Thread(target=keep)
        keeper.start()
        keeper.join(60)
        assert not keeper.is_alive(), "keep never answered"
        assert outcome == [name], outcome
        assert client.call("Counter", name, "get", []) == 5
        with pytest.raises(spindle.errors.Moved):
            client.call("Counter", key, "get", [])
    finally:
        os.kill(target.server.process.pid, signal.SIGCONT)
        client.close()


def test_killing_the_busiest_leader_under_load_loses_and_repeats_nothing(cluster, tmp_path):
    victim = cluster.busiest_leader()

    def crash_and_restart(load: LoadClients) -> None:
        victim.kill()  # SIGKILL
        # The others elect new leaders; the load carries on against them.
        assert wait_until(lambda: cluster.every_shard_led(without=victim), 20), cluster.describe()
        load_goes_on(load)
        victim.start()  # its data directory is intact

    check_exactly_once(cluster, run_load(cluster, tmp_path, crash_and_restart))
    # The restarted node caught up with everything committed while it was down.
    assert wait_until(lambda: cluster.caught_up(victim), 20), cluster.describe()


def test_a_crashed_leaders_shards_elect_their_first_surviving_replica_in_placement_order(cluster):
    """The first surviving voter in a shard's placement stands as soon as its link finds
    the leader's port closed; left to randomized timeouts, either survivor could win."""
    victim = cluster.busiest_leader()
    survivors = [n for n in cluster.nodes if n is not victim]
    groups = [g for g in survivors[0].map()["groups"] if g["leader"] == victim.node_id]
    # Shards whose preferred leader is the victim: no later handover picks the winner.
    expected = {g["shard"]: next(n for n in g["placement"] if n != victim.node_id)
                for g in groups if g["placement"][0] == victim.node_id}
    assert expected, cluster.describe()
    # Idle: the survivors' logs are equal (one ahead of the first would stand instead).
    victim.kill()

    def elected() -> Dict[int, int]:
        out = {}
        for node in survivors:
            for g in node.map()["groups"]:
                if g["shard"] in expected and g["serving_here"]:
                    out[g["shard"]] = node.node_id
        return out

    assert wait_until(lambda: len(elected()) == len(expected), 20), cluster.describe()
    assert elected() == expected
    for node in survivors:
        if node.node_id in expected.values():
            assert "the leader is down: standing for election" in node.log.read_text()


def test_a_stopped_leader_is_replaced_and_catches_up_after_it_resumes(cluster, tmp_path):
    victim = cluster.busiest_leader()
    other = next(n for n in cluster.nodes if n is not victim)

    def pause(load: LoadClients) -> None:
        os.kill(victim.server.process.pid, signal.SIGSTOP)  # a slow node, not a dead one
        try:
            assert wait_until(lambda: cluster.every_shard_led(via=other, without=victim), 20), cluster.describe()
            load_goes_on(load)  # served by the new leaders while the old one is stopped
        finally:
            os.kill(victim.server.process.pid, signal.SIGCONT)

    check_exactly_once(cluster, run_load(cluster, tmp_path, pause))
    assert wait_until(lambda: cluster.caught_up(victim), 20), cluster.describe()


def test_calls_waiting_on_a_paused_leader_complete_on_the_new_one_before_it_resumes(cluster):
    victim = cluster.busiest_leader()
    shard = next(s for s, leader in cluster.leaders().items() if leader == victim.node_id)
    key = next(f"paused{i}" for i in range(1000) if shard_of(f"paused{i}", SHARDS) == shard)
    client = Client(cluster.addresses)
    client.create("Counter", key, [], False, persistent=True)
    results: List[int] = []
    paused = threading.Event()

    def caller(new_connection: bool) -> None:
        if not new_connection:  # this thread's connection to the leader is open before the pause
            results.append(client.call("Counter", key, "add", [1]))
        paused.wait()
        results.append(client.call("Counter", key, "add", [1]))

    threads = [threading.Thread(target=caller, args=(new,)) for new in (False, True)]
    for t in threads:
        t.start()
    assert wait_until(lambda: results == [1], 10)
    os.kill(victim.server.process.pid, signal.SIGSTOP)
    try:
        # Sent to the paused leader, on an open connection and on a new one: the client sees
        # another node name a new leader (or the hello go unanswered) and resends there, with
        # the same seq (applied once), while the old leader is still stopped.
        paused.set()
        for t in threads:
            t.join(30)
        assert sorted(results) == [1, 2, 3], "both calls completed on the new leader"
    finally:
        os.kill(victim.server.process.pid, signal.SIGCONT)
    for t in threads:
        t.join(30)
    assert client.call("Counter", key, "get", []) == 3
    client.close()


def test_removing_a_node_under_load_keeps_every_update(cluster, tmp_path):
    def remove_third(load: LoadClients) -> None:
        out = subprocess.run(
            [server_binary(), "cluster", "remove", "3", "--address", cluster.nodes[0].address],
            capture_output=True, text=True, timeout=90,
        )
        assert out.returncode == 0, out.stderr
        assert cluster.voters_everywhere({1, 2}), cluster.describe()

    with History(cluster.addresses, keys_on_every_shard("leave")) as history:
        run = run_load(cluster, tmp_path, remove_third, history=history)
    check_exactly_once(cluster, run)
    history.check(tmp_path)
    cluster.nodes[2].stop()
    # Two voters of two: every shard still serves without the removed node.
    client = Client(f"{cluster.nodes[0].address},{cluster.nodes[1].address}")
    try:
        assert client.call("Counter", "load.shared", "add", [1]) > 0
    finally:
        client.close()


def test_cluster_add_registers_a_node_and_waits_until_it_holds_its_replicas(cluster, tmp_path):
    def add(node: str, address: str) -> subprocess.Popen:
        return subprocess.Popen(
            [server_binary(), "cluster", "add", node, address, "--address", cluster.nodes[0].address],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )

    fourth = Node(4, tmp_path / "n4", cluster.nodes[0].address, start=False)
    adding = add("4", fourth.address)
    # Registered before the node runs: the metadata lists it, and no replica moved yet.
    assert wait_until(lambda: 4 in cluster.nodes[0].map()["nodes"], 20)
    assert adding.poll() is None, "it waits for the node"
    fourth.start()
    cluster.nodes.append(fourth)
    out, err = adding.communicate(timeout=90)
    assert adding.returncode == 0, err
    assert "node 4 is a member and holds its" in out
    assert wait_until(cluster.settled, 30), cluster.describe()
    assert any(4 in g["voters"] for s, g in cluster.views().items() if s != "meta")
    # Again: a member at that address already; at another address: refused, nothing changes.
    again = add("4", fourth.address)
    assert again.wait(60) == 0
    taken = add("4", "127.0.0.1:1")
    _, err = taken.communicate(timeout=60)
    assert taken.returncode == 1 and "node 4 is a member at" in err, err
    assert cluster.nodes[0].map()["nodes"][4] == fourth.address


def test_with_one_replica_each_shard_lives_on_one_node_and_the_shards_spread(tmp_path):
    cluster = Cluster(tmp_path, rf=1)
    try:
        views = cluster.views()
        holders = {shard: g["voters"] for shard, g in views.items() if shard != "meta"}
        assert all(len(v) == 1 for v in holders.values()), holders
        assert len({v[0] for v in holders.values()}) > 1, "the shards spread over the nodes"
        client = Client(cluster.addresses)
        try:
            keys = [f"one{i}" for i in range(16)]
            for k in keys:
                client.create("Counter", k, [], False, persistent=True)
                client.call("Counter", k, "add", [3])
            assert [client.call("Counter", k, "get", []) for k in keys] == [3] * 16
        finally:
            client.close()
    finally:
        cluster.stop()


def test_a_joining_node_takes_its_replicas_under_load_with_no_update_lost(cluster, tmp_path):
    def join_a_fourth(load: LoadClients) -> None:
        node = cluster.add()
        assert wait_until(cluster.settled, 60), cluster.describe()
        held = [s for s, g in cluster.views().items() if node.node_id in g["voters"]]
        assert held, "the new node holds replicas"

    with History(cluster.addresses, keys_on_every_shard("join")) as history:
        run = run_load(cluster, tmp_path, join_a_fourth, history=history)
    check_exactly_once(cluster, run)
    history.check(tmp_path)


# Nodes not heard from for this long are declared dead (suspect after half of it).
DEAD_AFTER = ("--dead-after", "4")


def status(node: Node) -> "tuple[Dict[int, str], Dict[str, str]]":
    """`spindle cluster status` asked of ``node``: each node's liveness, each group's health."""
    out = subprocess.run([server_binary(), "cluster", "status", "--address", node.address],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    _, nodes, groups = out.stdout.split("\n\n")
    liveness = {int(row.split()[0]): row.split()[3] for row in nodes.splitlines()[1:]}
    health = {row.split()[0]: row[row.rindex("  ") + 2:] for row in groups.splitlines()[1:]}
    return liveness, health


def statuses_agree(live: List[Node], liveness: Dict[int, str], health: Dict[str, str]) -> bool:
    """Whether `cluster status` asked of every node in ``live`` says the same: ``liveness``,
    and ``health`` for the groups it names (the others ``up``)."""
    expected = {shard: health.get(shard, "up") for shard in [*map(str, range(SHARDS)), "meta"]}
    return all(status(node) == (liveness, expected) for node in live)


def replicated_without(cluster: Cluster, dead: List[Node]) -> bool:
    """Whether every group has its replicas on live nodes only, as many as the live nodes
    allow (up to 3), with a leader."""
    views = cluster.views()
    gone = {n.node_id for n in dead}
    want = min(3, len(cluster.nodes) - len(dead))
    return len(views) == SHARDS + 1 and all(
        len(g["voters"]) == want and not gone & set(g["voters"]) and sorted(g["voters"]) == sorted(g["placement"])
        and (shard == "meta" or not g["learners"])
        for shard, g in views.items()
    )


def test_a_dead_node_is_replaced_on_live_nodes_and_a_second_failure_loses_nothing(tmp_path):
    cluster = Cluster(tmp_path, size=4, extra=DEAD_AFTER)
    first, second = cluster.busiest_leader(), None

    def kill_one_then_another(load: LoadClients) -> None:
        nonlocal second
        first.kill()
        # Declared dead: every shard gets back to three live voters, and serves.
        assert wait_until(lambda: replicated_without(cluster, [first]), 120), cluster.describe()
        live = [n for n in cluster.nodes if n is not first]
        liveness = {n.node_id: "dead" if n is first else "up" for n in cluster.nodes}
        assert wait_until(lambda: statuses_agree(live, liveness, {}), 30), [status(n) for n in live]
        load_goes_on(load)
        second = live[0]
        second.kill()
        assert wait_until(lambda: replicated_without(cluster, [first, second]), 120), cluster.describe()
        liveness[second.node_id] = "dead"
        survivors = [n for n in live if n is not second]
        assert wait_until(lambda: statuses_agree(survivors, liveness, {}), 30), [status(n) for n in survivors]
        load_goes_on(load)

    try:
        with History(cluster.addresses, keys_on_every_shard("dead")) as history:
            run = run_load(cluster, tmp_path, kill_one_then_another, history=history)
        check_exactly_once(cluster, run)
        history.check(tmp_path)
        assert "declaring a node's liveness" in "".join(n.log.read_text() for n in cluster.nodes)
    finally:
        cluster.stop()


def test_a_dead_node_that_comes_back_takes_its_replicas_back_and_catches_up(tmp_path):
    cluster = Cluster(tmp_path, size=4, extra=DEAD_AFTER)
    client = Client(cluster.addresses)
    try:
        placed = {shard: g["placement"] for shard, g in cluster.views().items()}
        keys = keys_on_every_shard("back")
        for key in keys:
            client.create("Counter", key, [], False, persistent=True)
            client.call("Counter", key, "add", [1])
        victim = cluster.nodes[1]
        victim.kill()
        assert wait_until(lambda: replicated_without(cluster, [victim]), 120), cluster.describe()
        # Written while it is dead: it can only learn them from the others.
        for key in keys:
            client.call("Counter", key, "add", [10])
        victim.start()
        # Up again, it holds its replicas as before (placement counts it again), caught up.
        liveness = {n.node_id: "up" for n in cluster.nodes}
        assert wait_until(lambda: statuses_agree(cluster.nodes, liveness, {}), 60), status(victim)
        assert wait_until(cluster.settled, 120), cluster.describe()
        assert {shard: g["placement"] for shard, g in cluster.views().items()} == placed
        assert wait_until(lambda: cluster.caught_up(victim), 30), cluster.describe()
        for key in keys:
            assert client.call("Counter", key, "get", []) == 11
    finally:
        client.close()
        cluster.stop()


def test_a_shard_that_lost_its_quorum_says_so_and_redirects_never_name_a_dead_node(tmp_path):
    cluster = Cluster(tmp_path, size=4, extra=DEAD_AFTER)
    try:
        views = cluster.views()
        # Two nodes that leave the metadata group a quorum (one votes on it, one does not),
        # and share the most shards: those lose their quorum.
        outside = next(n for n in cluster.nodes if n.node_id not in views["meta"]["voters"])
        shared = {n.node_id: [s for s, g in views.items() if s != "meta" and {n.node_id, outside.node_id} <= set(g["voters"])]
                  for n in cluster.nodes if n is not outside}
        partner_id = max(shared, key=lambda n: len(shared[n]))
        lost = shared[partner_id]
        assert lost, cluster.describe()
        victims = [outside, next(n for n in cluster.nodes if n.node_id == partner_id)]
        live = [n for n in cluster.nodes if n not in victims]
        for victim in victims:
            victim.kill()
        liveness = {n.node_id: "dead" if n in victims else "up" for n in cluster.nodes}
        health = {str(shard): "no quorum" for shard in lost}
        assert wait_until(lambda: statuses_agree(live, liveness, health), 90), [status(n) for n in live]
        dead_addresses = {v.address for v in victims}
        for node in live:
            for g in node.map()["groups"]:
                assert g["leader_address"] not in dead_addresses, g
            for shard in lost:
                key = next(f"q{i}" for i in range(1000) if shard_of(f"q{i}", SHARDS) == shard)
                reply = raw(node.host, node.port, [2, "create", 1, 0, "Counter", key, [], False])
                assert reply[1] == 1 and reply[2][0] == "NotLeader", reply
                assert not set(reply[2][2:3]) & dead_addresses, reply
    finally:
        cluster.stop()


# Raft snapshots after this many bytes of log, so that a test's few thousand calls take many.
SMALL_SNAPSHOTS = ("--snapshot-after", "16384")


def raft_files(node: Node, pattern: str) -> Dict[int, List[str]]:
    """``node``'s Raft files (``snap`` or ``log``) by group (not the temporary ones)."""
    out: Dict[int, List[str]] = {}
    suffix = ".sps" if pattern == "snap" else ".spl"
    for path in sorted((node.data_dir / "raft").glob(f"{pattern}-*{suffix}")):
        out.setdefault(int(path.name.split("-")[1]), []).append(path.name)
    return out


def count_on_every_shard(client: Client, prefix: str, rounds: int = 60) -> List[str]:
    """Persistent counters spread over every shard, each added to ``rounds`` times: log
    enough for ``SMALL_SNAPSHOTS`` to take snapshots and compact behind them."""
    keys = [f"{prefix}.k{i}" for i in range(24)]
    for key in keys:
        client.create("Counter", key, [], False, persistent=True)
    for _ in range(rounds):
        for key in keys:
            client.call("Counter", key, "add", [1])
    return keys


def compacted(node: Node, shard: int) -> bool:
    """``node`` took snapshots of ``shard`` and deleted its first log segment."""
    logs = raft_files(node, "log").get(shard, [])
    return bool(raft_files(node, "snap").get(shard)) and not any(
        name.endswith("-00000000000000000001.spl") for name in logs
    )


def test_snapshots_compact_the_log_and_new_and_restarted_nodes_recover_from_them(tmp_path):
    cluster = Cluster(tmp_path, extra=SMALL_SNAPSHOTS)
    client = Client(cluster.addresses)
    try:
        keys = count_on_every_shard(client, "snap")
        client.create("Dict", "snap.d", [], False, persistent=True)
        client.call("Dict", "snap.d", "setitem", ["big", "x" * 50_000])  # a record larger than a snapshot's due
        expected = {key: 60 for key in keys}

        assert wait_until(lambda: all(compacted(n, g) for n in cluster.nodes for g in range(SHARDS)), 20), [
            (raft_files(n, "snap"), raft_files(n, "log")) for n in cluster.nodes
        ]
        # Two snapshots are kept (a third exists only between its writing and the pruning).
        assert wait_until(
            lambda: all(len(names) <= 2 for n in cluster.nodes for names in raft_files(n, "snap").values()), 5
        ), [raft_files(n, "snap") for n in cluster.nodes]

        # A new node's replicas start after the leaders' compacted logs: they catch up from
        # snapshots, and serve the same state.
        newcomer = cluster.add()
        assert wait_until(cluster.settled, 60), cluster.describe()
        assert wait_until(lambda: cluster.caught_up(newcomer), 20), cluster.describe()
        assert "installed the leader's snapshot" in newcomer.log.read_text()
        led = [s for s, leader in cluster.leaders().items() if leader == newcomer.node_id]
        for key, value in expected.items():
            assert client.call("Counter", key, "get", []) == value
        assert client.call("Dict", "snap.d", "getitem", ["big"]) == "x" * 50_000
        print(f"the new node leads shards {led}")

        # A full restart recovers every replica from its snapshot and the log after it.
        client.close()
        for node in cluster.nodes:
            node.stop()
        for node in cluster.nodes:
            node.start()
        assert wait_until(cluster.every_shard_led, 30), cluster.describe()
        client = Client(cluster.addresses)
        for key, value in expected.items():
            assert client.call("Counter", key, "add", [1]) == value + 1
        assert client.call("Dict", "snap.d", "getitem", ["big"]) == "x" * 50_000
    finally:
        client.close()
        cluster.stop()


def test_a_snapshot_larger_than_a_frame_streams_to_a_new_node_through_files(tmp_path):
    # 1 MiB frames, and a shard state of several MiB: snapshots stream from the leader's
    # file to one on the new node in chunks (and batches of entries travel in parts).
    cluster = Cluster(tmp_path, extra=("--max-frame", str(1 << 20), *SMALL_SNAPSHOTS))
    client = Client(cluster.addresses)
    try:
        blobs = {f"big{i}": os.urandom(200_000) for i in range(40)}
        for key, data in blobs.items():
            client.create("Blob", key, [data], False, persistent=True)
        newcomer = cluster.add()
        assert wait_until(cluster.settled, 60), cluster.describe()
        assert wait_until(lambda: cluster.caught_up(newcomer), 30), cluster.describe()
        assert "installed the leader's snapshot" in newcomer.log.read_text()
        sizes = [p.stat().st_size for p in (newcomer.data_dir / "raft").glob("snap-*.sps")]
        assert max(sizes) > 1 << 20, sizes
        # They came as files, streamed, and those files went into the snapshots.
        assert "received a snapshot from node" in newcomer.log.read_text()
        assert not list((newcomer.data_dir / "raft").glob("snap-*-incoming-*.tmp"))
        for key, data in blobs.items():
            assert client.call("Blob", key, "get", []) == data
    finally:
        client.close()
        cluster.stop()


def newest_snapshot_once_settled(node: Node, shard: int) -> Path:
    """``node``'s newest snapshot of ``shard`` once no capture is under way and none came
    for a second (a snapshot installed later would make it the older one)."""
    def listing() -> tuple:
        raft = node.data_dir / "raft"
        return tuple(raft_files(node, "snap").get(shard, [])), tuple(raft.glob(f"snap-{shard}-capture-*"))

    last, since = listing(), time.monotonic()
    deadline = since + 30
    while time.monotonic() - since < 1.0 or last[1]:
        assert time.monotonic() < deadline, f"snapshots of shard {shard} still changing: {last}"
        time.sleep(0.1)
        now = listing()
        if now != last:
            last, since = now, time.monotonic()
    return node.data_dir / "raft" / last[0][-1]


def damage_snapshot(path: Path, keep_checksums: bool) -> None:
    """Make the partition data in Raft snapshot file ``path`` undecodable, its length kept:
    with ``keep_checksums`` the file's checksums are recomputed (it reads back, and only
    restoring it fails), else they no longer match (reading it fails)."""
    raw = bytearray(path.read_bytes())
    header, body = raw[:48], raw[48:]

    def varint(at: int) -> tuple:
        value, shift = 0, 0
        while True:
            byte = body[at]
            value, shift, at = value | (byte & 0x7F) << shift, shift + 7, at + 1
            if byte < 0x80:
                return value, at

    at = 0
    while True:  # protobuf fields of `Snapshot`: metadata (2), data (1)
        tag = body[at]
        size, at = varint(at + 1)
        if tag == 0x0A:
            break
        at += size
    assert size > 16, size
    body[at:at + 16] = b"\xc1" * 16  # a byte MessagePack never uses
    if keep_checksums:
        header[40:44] = struct.pack("<I", zlib.crc32(body))
        header[44:48] = struct.pack("<I", zlib.crc32(header[:44]))
    path.write_bytes(bytes(header + body))


def test_a_damaged_snapshot_on_the_leaders_is_replaced_by_a_fresh_one(tmp_path):
    # A node down while the leaders compact their logs needs their snapshots when it comes
    # back. Each leader's is damaged on disk: on half the shards it no longer reads (its
    # checksum), on the others it reads but does not restore. The returning node refuses
    # the latter without leaving the shard; after two failed sends each leader takes a
    # fresh snapshot, and the node catches up.
    cluster = Cluster(tmp_path, extra=SMALL_SNAPSHOTS)
    victim = cluster.nodes[2]
    victim.kill()
    others = cluster.nodes[:2]
    assert wait_until(lambda: cluster.every_shard_led(via=others[0], without=victim), 20), cluster.describe()
    client = Client(",".join(n.address for n in others))
    try:
        keys = count_on_every_shard(client, "damaged")
        leaders = cluster.leaders(via=others[0])
        nodes = {n.node_id: n for n in others}
        assert wait_until(lambda: all(compacted(nodes[leaders[s]], s) for s in range(SHARDS)), 20), [
            (raft_files(n, "snap"), raft_files(n, "log")) for n in others
        ]
        for shard in range(SHARDS):
            damage_snapshot(newest_snapshot_once_settled(nodes[leaders[shard]], shard), keep_checksums=shard % 2 == 1)

        victim.start()
        assert wait_until(lambda: cluster.caught_up(victim), 60), cluster.describe()
        log = victim.log.read_text()
        assert "refused the leader's snapshot" in log
        assert "installed the leader's snapshot" in log
        assert any("taking a fresh one" in n.log.read_text() for n in others)
        for key in keys:
            assert client.call("Counter", key, "add", [1]) == 61
    finally:
        client.close()
        cluster.stop()


def test_a_leader_whose_latest_snapshot_is_damaged_rebuilds_from_the_one_before(tmp_path):
    # A leader that loses its leadership rebuilds its partition from its latest snapshot and
    # the log. That snapshot is damaged on disk (a bad checksum on half the shards, data that
    # does not restore on the others): it falls back to the one before and the log kept
    # behind it, and goes on following the shard with the same state.
    cluster = Cluster(tmp_path, extra=SMALL_SNAPSHOTS)
    client = Client(cluster.addresses)
    try:
        keys = count_on_every_shard(client, "older")
        victim = cluster.busiest_leader()
        # Shards it leads as their preferred leader (it leads them again once back).
        led = [g["shard"] for g in victim.map()["groups"]
               if g["leader"] == victim.node_id and g["placement"][0] == victim.node_id and g["shard"] < SHARDS]
        assert led, cluster.describe()
        assert wait_until(lambda: all(len(raft_files(victim, "snap").get(s, [])) == 2 for s in led), 20), (
            raft_files(victim, "snap")
        )
        for shard in led:
            damage_snapshot(newest_snapshot_once_settled(victim, shard), keep_checksums=shard % 2 == 1)
        # Paused, it loses its shards to the others; resumed, it steps down and rebuilds.
        os.kill(victim.server.process.pid, signal.SIGSTOP)
        try:
            others = [n for n in cluster.nodes if n is not victim]
            assert wait_until(lambda: cluster.every_shard_led(via=others[0], without=victim), 20), cluster.describe()
        finally:
            os.kill(victim.server.process.pid, signal.SIGCONT)
        for key in keys:
            assert client.call("Counter", key, "add", [1]) == 61
        assert wait_until(lambda: cluster.caught_up(victim), 30), cluster.describe()
        assert "cannot be rebuilt" not in victim.log.read_text()
        assert "trying the one before" in victim.log.read_text()
        # It leads again (its shards' preferred leader) and serves the same state.
        assert wait_until(lambda: all(cluster.leaders().get(s) == victim.node_id for s in led), 30), (
            cluster.describe()
        )
        for key in keys:
            assert client.call("Counter", key, "get", []) == 61
    finally:
        client.close()
        cluster.stop()


def test_leaders_killed_under_load_while_snapshots_are_taken_lose_and_repeat_nothing(tmp_path):
    cluster = Cluster(tmp_path, extra=SMALL_SNAPSHOTS)
    try:
        def crash_twice(load: LoadClients) -> None:
            for _ in range(2):
                victim = cluster.busiest_leader()
                victim.kill()
                assert wait_until(lambda: cluster.every_shard_led(without=victim), 20), cluster.describe()
                load_goes_on(load)
                victim.start()
                assert wait_until(lambda: cluster.caught_up(victim), 30), cluster.describe()

        check_exactly_once(cluster, run_load(cluster, tmp_path, crash_twice))
        assert any(raft_files(n, "snap") for n in cluster.nodes), "snapshots were taken"
    finally:
        cluster.stop()


def test_every_node_restarted_with_its_data_directory_rejoins_with_its_state(cluster, tmp_path):
    """A full restart under load: the history of the calls made before, across and after
    it is linearizable (nothing acknowledged before the restart is lost)."""
    client = Client(cluster.addresses)
    try:
        client.create("Dict", "kept", [], False, persistent=True)
        client.call("Dict", "kept", "setitem", ["a", 1])
    finally:
        client.close()
    with History(cluster.addresses, keys_on_every_shard("restart")) as history:
        with history.fault("restart every node"):
            for node in cluster.nodes:
                node.stop()
            for node in cluster.nodes:
                node.start()  # on its port: the clients reconnect there
            assert wait_until(cluster.every_shard_led, 30), cluster.describe()
    history.check(tmp_path)
    client = Client(cluster.addresses)
    try:
        assert client.call("Dict", "kept", "getitem", ["a"]) == 1
    finally:
        client.close()


def test_a_single_replica_killed_after_acknowledging_keeps_every_write_once(tmp_path):
    # With one replica, the node's log is the only copy: a kill -9 right after the last
    # acknowledgement loses none of the writes, and the restart applies each once (whatever
    # commit index it found recorded, the entries after it commit again).
    cluster = Cluster(tmp_path, size=1, rf=1)
    keys = [f"acked{i}" for i in range(8)]
    try:
        client = Client(cluster.addresses)
        try:
            for k in keys:
                client.create("Counter", k, [], False, persistent=True)
            for _ in range(25):
                for k in keys:
                    client.call("Counter", k, "add", [1])
        finally:
            client.close()
        node = cluster.nodes[0]
        node.kill()
        node.start()
        assert wait_until(cluster.every_shard_led, 30), cluster.describe()
        client = Client(cluster.addresses)
        try:
            assert [client.call("Counter", k, "get", []) for k in keys] == [25] * len(keys)
        finally:
            client.close()
    finally:
        cluster.stop()


def unnamed_keys_on(client: Client, shards: set) -> Iterator[str]:
    """Fresh unnamed keys of ``client``'s current session that hash to one of ``shards``."""
    while True:
        key = client.unnamed_key()
        if shard_of(key, SHARDS) in shards:
            yield key


def presence_everywhere(client: Client, sessions: List[str], nodes: List[Node]) -> bool:
    """Whether ``client`` keeps a connection of each session open to each node."""
    presence = client._presence
    wanted = {(s, n.address) for s in sessions for n in nodes}
    return presence is not None and wanted <= set(presence.conns)


def test_a_new_leader_ends_the_sessions_of_dead_clients_and_keeps_those_of_live_ones(tmp_path):
    """A session ends on the node its client talked to, `--session-ttl` after the client's
    last connection there closed. A client that died just before that node did would own
    its unnamed objects forever on the shard's next leader, which never heard from it: the
    new leader ends such sessions after the TTL. A live client keeps a connection to every
    node for its own session and for those of the invocations it runs (its presence), so a
    new leader knows them and their objects stay."""
    cluster = Cluster(tmp_path, extra=("--session-ttl", "3"))
    live = Client(cluster.addresses)
    try:
        doomed = cluster.busiest_leader()
        shards = {s for s, leader in cluster.leaders().items() if leader == doomed.node_id}
        # The live client's unnamed counters on a shard of the node about to die, in its own
        # session and in an invocation's (a scope); then only the presence connections stay
        # open, so nothing else tells the new leader about these sessions.
        live_key = next(unnamed_keys_on(live, shards))
        live.create("Counter", live_key, [0], True, persistent=True)
        live._close_connections()
        with live.scope("an-invocation-secret"):
            scoped_key = next(unnamed_keys_on(live, shards))
            live.create("Counter", scoped_key, [0], True, persistent=True)
            live._close_connections()
            sessions = [live.session, live._own_session]
            assert wait_until(lambda: presence_everywhere(live, sessions, cluster.nodes), 10)
            # A client that talks only to that node, and dies (a bare connection: no presence).
            dead_key = next(k for k in (f"~dead-client.{i}" for i in range(1000))
                            if shard_of(k, SHARDS) in shards)
            conn = Connection(doomed.host, doomed.port, "dead-client-session", 1)
            reply = conn.roundtrip(frame([2, "create", 2, 0, "Counter", dead_key, [0], True, True]), 2)
            assert reply[1:] == [0, True], reply
            conn.close()
            doomed.kill()  # before its TTL for the dead client runs out

            def new_leaders() -> bool:
                leaders = cluster.leaders()
                return set(leaders) == set(range(SHARDS)) and doomed.node_id not in leaders.values()

            assert wait_until(new_leaders, 30), cluster.describe()
            check = Client(",".join(n.address for n in cluster.nodes if n is not doomed))
            try:
                # Both objects came through the failover; the dead client's goes with its
                # session, a TTL after the new leader took over.
                assert check.call("Counter", dead_key, "get", []) == 0

                def gone() -> bool:
                    try:
                        check.call("Counter", dead_key, "get", [])
                    except spindle.ObjectNotFound:
                        return True
                    return False

                assert wait_until(gone, 30, interval=0.2)
            finally:
                check.close()
            time.sleep(4)  # past the TTL the new leader would have given the live sessions
            assert live.call("Counter", scoped_key, "add", [1]) == 1
        assert live.call("Counter", live_key, "add", [1]) == 1
    finally:
        live.close()
        cluster.stop()


def test_a_client_makes_itself_known_to_a_node_that_joins_and_takes_over_shards(tmp_path):
    """Presence follows the membership: a node that joins, then leads shards, knows the live
    clients, and their unnamed objects on those shards stay past the session TTL."""
    cluster = Cluster(tmp_path, extra=("--session-ttl", "3"))
    live = Client(cluster.addresses)
    try:
        keys = [next(unnamed_keys_on(live, {shard})) for shard in range(SHARDS)]
        for key in keys:
            live.create("Counter", key, [0], True, persistent=True)
        live._close_connections()
        # Join nodes until one of them leads a shard (placement decides which).
        first_joined = len(cluster.nodes) + 1
        for _ in range(3):
            cluster.add()
            assert wait_until(cluster.settled, 60), cluster.describe()
            if max(cluster.leaders().values()) >= first_joined:
                break
        assert max(cluster.leaders().values()) >= first_joined, cluster.describe()
        assert wait_until(lambda: presence_everywhere(live, [live.session], cluster.nodes), 10)
        time.sleep(5)  # past the TTL the joined node would have given an unknown session
        assert [live.call("Counter", key, "add", [1]) for key in keys] == [1] * SHARDS
    finally:
        live.close()
        cluster.stop()


def start_refused(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [server_binary(), "server", "--port", "0", *args],
        capture_output=True, text=True, timeout=30, stdin=subprocess.DEVNULL,
    )


def test_bad_cluster_settings_are_refused_with_a_clear_message(tmp_path):
    out = start_refused("--node-id", "1", "--cluster-key", CLUSTER_KEY)
    assert out.returncode != 0 and "--data-dir" in out.stderr
    out = start_refused("--node-id", "1", "--data-dir", str(tmp_path / "keyless"))
    assert out.returncode == 2 and "a cluster node needs --cluster-key" in out.stderr
    node = Node(1, tmp_path / "n1")
    try:
        out = start_refused("--node-id", "2", "--data-dir", str(tmp_path / "other"), "--join", "127.0.0.1:1",
                            "--cluster-key", CLUSTER_KEY)
        assert out.returncode != 0 and "cannot join through 127.0.0.1:1" in out.stderr
    finally:
        node.stop()
    out = start_refused("--node-id", "2", "--data-dir", str(tmp_path / "n1"), "--cluster-key", CLUSTER_KEY)
    assert out.returncode != 0 and "belongs to node 1" in out.stderr
    out = start_refused("--join", "127.0.0.1:1")
    assert out.returncode != 0 and "--node-id" in out.stderr
    out = start_refused("--threads", "0")
    assert out.returncode == 2 and "--threads" in out.stderr
    for bad in ("0", "0.5", "soon"):
        out = start_refused("--node-id", "1", "--data-dir", str(tmp_path / "n9"), "--cluster-key", CLUSTER_KEY,
                            "--dead-after", bad)
        assert out.returncode == 2 and "--dead-after" in out.stderr and "1 or more" in out.stderr, out.stderr


def test_threads_sets_how_many_threads_serve(tmp_path):
    # Nodes sharing a machine split its cores: `--threads` is how (see THREADS), and
    # `--shared-cores` has a thread yield the cores before it sleeps.
    for threads, shared in ((1, ["--shared-cores"]), (3, [])):
        server = ServerProcess("--threads", str(threads), *shared)
        try:
            tasks = Path(f"/proc/{server.process.pid}/task")

            def names() -> List[str]:
                return [(task / "comm").read_text().strip() for task in tasks.iterdir()]

            # A thread names itself once it runs: the server may print its address first.
            assert wait_until(lambda: names().count("tokio-rt-worker") >= threads, 10), names()
            client = Client(server.address)
            try:
                client.create("Counter", "threads", [], False)
                assert client.call("Counter", "threads", "add", [threads]) == threads
            finally:
                client.close()
            assert names().count("tokio-rt-worker") == threads, names()
        finally:
            server.stop()


def linearizability_checker() -> str:
    """The Porcupine-based checker of tests/linearizability: built once by `make test-tools`
    (into target/linearizability), or here with Go if its sources are newer."""
    source = REPO / "tests" / "linearizability"
    binary = REPO / "target" / "linearizability"
    if binary.exists() and binary.stat().st_mtime >= max(p.stat().st_mtime for p in source.iterdir()):
        return str(binary)
    go = shutil.which("go")
    if go is None:
        pytest.fail(f"no up-to-date linearizability checker at {binary}, and no `go` to build it: run `make test-tools`")
    built = binary.with_name(f"linearizability.{os.getpid()}.tmp")  # whole or not at all
    out = subprocess.run([go, "build", "-o", str(built), "."], cwd=source, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, f"building the linearizability checker failed:\n{out.stderr}"
    os.replace(built, binary)
    return str(binary)


def check_history(history: List[dict]) -> subprocess.CompletedProcess:
    lines = "".join(json.dumps(op) + "\n" for op in history)
    return subprocess.run([linearizability_checker()], input=lines, capture_output=True, text=True, timeout=300)


def test_the_checker_finds_a_history_that_is_not_linearizable():
    ok = [
        {"client": 0, "op": "add", "key": "a", "arg": 2, "out": 2, "known": True, "call": 1, "ret": 5},
        {"client": 1, "op": "get", "key": "a", "arg": 0, "out": 0, "known": True, "call": 2, "ret": 3},
        {"client": 1, "op": "get", "key": "a", "arg": 0, "out": 2, "known": True, "call": 6, "ret": 7},
    ]
    assert check_history(ok).returncode == 0
    # A read after an acknowledged add that does not see it: a lost write.
    lost = ok[:1] + [{"client": 1, "op": "get", "key": "a", "arg": 0, "out": 0, "known": True, "call": 6, "ret": 7}]
    out = check_history(lost)
    assert out.returncode == 1 and "NOT linearizable" in out.stdout
    # An add whose outcome is unknown may or may not have happened, but not twice.
    unknown = [
        {"client": 0, "op": "add", "key": "a", "arg": 2, "out": 0, "known": False, "call": 1, "ret": 2},
        {"client": 1, "op": "get", "key": "a", "arg": 0, "out": 2, "known": True, "call": 3, "ret": 4},
        {"client": 1, "op": "get", "key": "a", "arg": 0, "out": 4, "known": True, "call": 5, "ret": 6},
    ]
    assert check_history(unknown[:2]).returncode == 0
    assert check_history(unknown).returncode == 1


@pytest.mark.parametrize("snapshots", [False, True], ids=["log", "snapshots"])
def test_histories_with_leaders_killed_and_paused_are_linearizable(tmp_path, snapshots):
    """Also with snapshots taken every few hundred entries: replicas restarted after a kill
    catch up from them, and the leaders' own snapshots are of moments ahead of the log."""
    cluster = Cluster(tmp_path, extra=SMALL_SNAPSHOTS if snapshots else ())
    try:
        _check_linearizable_under_faults(cluster, tmp_path)
        if snapshots:
            assert any(raft_files(n, "snap") for n in cluster.nodes), "snapshots were taken"
    finally:
        cluster.stop()


def _check_linearizable_under_faults(cluster: Cluster, tmp_path: Path) -> None:
    with History(cluster.addresses, keys_on_every_shard("lin"), clients=6) as history:
        victim = cluster.busiest_leader()
        with history.fault(f"kill -9 of node {victim.node_id}"):
            victim.kill()
            assert wait_until(lambda: cluster.every_shard_led(without=victim), 20), cluster.describe()
            # The calls go on against the new leaders while it is down.
            history.wait_known(FAULT_AFTER, since=time.monotonic_ns())
            victim.start()
            assert wait_until(cluster.settled, 30), cluster.describe()
        paused = cluster.busiest_leader()
        other = next(n for n in cluster.nodes if n is not paused)
        with history.fault(f"SIGSTOP of node {paused.node_id}"):
            os.kill(paused.server.process.pid, signal.SIGSTOP)
            try:
                assert wait_until(lambda: cluster.every_shard_led(via=other, without=paused), 20), cluster.describe()
                history.wait_known(FAULT_AFTER, since=time.monotonic_ns())
            finally:
                os.kill(paused.server.process.pid, signal.SIGCONT)
    history.check(tmp_path)


class Netns:
    """Network namespaces for the nodes, each joined to a bridge by a veth pair, so that a
    test can cut one node off (its veth down) and heal it. Needs root (CAP_NET_ADMIN). The
    names and the subnet are this run's own: a subnet no address or route of the machine
    overlaps, so the nodes' traffic goes nowhere but between the namespaces and this one
    (they have no other route)."""

    def __init__(self, size: int) -> None:
        rng = random.Random(f"{os.getpid()}.{time.time_ns()}")
        self.tag = f"sp{os.getpid() % 100000}{rng.randrange(16 ** 4):04x}"  # + 2 chars: 15 at most
        self.subnet = self.unused_subnet(rng)
        self.size = size
        self.bridge = f"{self.tag}br"
        try:
            self.ip("link", "add", self.bridge, "type", "bridge")
            self.ip("addr", "add", f"{self.subnet}.254/24", "dev", self.bridge)
            self.ip("link", "set", self.bridge, "up")
            for i in range(1, size + 1):
                ns, outside, inside = f"{self.tag}n{i}", f"{self.tag}v{i}", f"{self.tag}p{i}"
                self.ip("netns", "add", ns)
                self.ip("link", "add", outside, "type", "veth", "peer", "name", inside)
                self.ip("link", "set", inside, "netns", ns)
                self.ip("-n", ns, "addr", "add", f"{self.host(i)}/24", "dev", inside)
                self.ip("-n", ns, "link", "set", inside, "up")
                self.ip("-n", ns, "link", "set", "lo", "up")
                self.ip("link", "set", outside, "master", self.bridge)
                self.ip("link", "set", outside, "up")
        except OSError:
            self.remove()
            raise

    @staticmethod
    def ip(*args: str) -> str:
        out = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30)
        if out.returncode != 0:
            raise OSError(f"ip {' '.join(args)}: {out.stderr.strip()}")
        return out.stdout

    @classmethod
    def unused_subnet(cls, rng: random.Random) -> str:
        """``10.X.Y`` (X from the pid, Y at random) whose /24 overlaps no address or route
        of this namespace: another run's (whose bridge holds one), or a real network's."""
        taken = []
        for line in cls.ip("-o", "-4", "addr").splitlines():
            words = line.split()
            taken.append(ipaddress.ip_network(words[words.index("inet") + 1], strict=False))
        for line in cls.ip("-4", "route").splitlines():
            if line.split()[0] != "default":
                taken.append(ipaddress.ip_network(line.split()[0], strict=False))
        for attempt in range(1000):
            subnet = f"10.{(os.getpid() + attempt) % 256}.{rng.randrange(256)}"
            if not any(ipaddress.ip_network(f"{subnet}.0/24").overlaps(t) for t in taken):
                return subnet
        raise OSError(f"no free 10.X.Y.0/24 subnet: {taken}")

    def host(self, node: int) -> str:
        return f"{self.subnet}.{node}"

    def exec_prefix(self, node: int) -> List[str]:
        return ["ip", "netns", "exec", f"{self.tag}n{node}"]

    def isolate(self, node: int) -> None:
        self.ip("link", "set", f"{self.tag}v{node}", "down")

    def heal(self, node: int) -> None:
        self.ip("link", "set", f"{self.tag}v{node}", "up")

    def remove(self) -> None:
        for i in range(1, self.size + 1):
            subprocess.run(["ip", "netns", "del", f"{self.tag}n{i}"], capture_output=True)
        subprocess.run(["ip", "link", "del", self.bridge], capture_output=True)


@pytest.fixture
def netns_cluster(tmp_path, monkeypatch):
    """A cluster whose nodes live in network namespaces of their own. Not having them is a
    failure, not a skip: `make test-tools` installs iproute2, and the tests run as root."""
    if shutil.which("ip") is None:
        pytest.fail("the partition tests need iproute2 (`ip`): run `make test-tools`")
    try:
        netns = Netns(3)
    except OSError as exc:
        pytest.fail(f"cannot make network namespaces ({exc}): the partition tests need root (CAP_NET_ADMIN)")
    monkeypatch.setenv("SPINDLE_TOKEN", NETNS_TOKEN)
    cluster = None
    try:
        cluster = Cluster(tmp_path, netns=netns)
        yield cluster, netns
    finally:
        if cluster is not None:
            cluster.stop()
        netns.remove()


def test_a_partitioned_leader_is_replaced_and_no_update_is_lost_or_doubled(netns_cluster, tmp_path):
    cluster, netns = netns_cluster
    victim = cluster.busiest_leader()
    others = [n for n in cluster.nodes if n is not victim]

    def partition(load: LoadClients) -> None:
        netns.isolate(victim.node_id)
        try:
            # The majority elects new leaders while the old one is cut off, and serves the
            # load; the old one cannot acknowledge anything alone (every reply waits for a
            # majority).
            assert wait_until(lambda: cluster.every_shard_led(via=others[0], without=victim), 20), cluster.describe()
            load_goes_on(load)
        finally:
            netns.heal(victim.node_id)
        assert wait_until(cluster.settled, 30), cluster.describe()

    with History(cluster.addresses, keys_on_every_shard("part")) as history:
        run = run_load(cluster, tmp_path, partition, history=history)
    check_exactly_once(cluster, run)
    history.check(tmp_path)
    assert wait_until(lambda: cluster.caught_up(victim), 20), cluster.describe()


# The cut-off client: a process in the cut-off node's network namespace that knows that node
# alone and talks to it on connections of its own (never redirected). Arguments: the node's
# address, the token, the keys (comma-separated), a control directory, and how many rounds
# of reads of every key go in its batch. It writes each attempt to ops.jsonl (op, key,
# argument, call and return times, outcome: "ok", the error's kind or the exception that
# ended the wait, and the value), and, from a thread, the node's view of each shard's
# leader (the `cluster` request, every 20 ms) to leaders.jsonl. Until `hold` exists in the
# control directory it reads and adds (an add only after an answered call, so that a node
# that answers nothing gets few adds of unknown outcome); then it sends nothing more, says
# so (`holding`), and waits for `written`; then it sends one batch, pipelined on one
# connection: ROUNDS reads of every key, then an add to every key (the node runs a
# connection's requests in the order they come, so the reads reach it first); then it reads
# and adds again until `stop` exists.
CUT_OFF_CLIENT = r"""
import json, os, random, sys, threading, time
from spindle.client import Connection, frame
from spindle.codec import unpackb
address, token, keys, control, rounds = sys.argv[1:]
host, port = address.rsplit(":", 1)
keys, rounds = keys.split(","), int(rounds)
here = lambda name: os.path.join(control, name)
lock = threading.Lock()

def record(f, entry):
    with lock:
        f.write(json.dumps(entry) + "\n")
        f.flush()

def connect(secret):
    return Connection(host, int(port), secret, 1, token=token, timeout=1.0)

def outcome(reply):
    return ("ok", reply[2]) if reply[1] == 0 else (str(reply[2][0]), None)

def poll_leaders():
    conn, n = None, 1
    with open(here("leaders.jsonl"), "w") as f:
        while not os.path.exists(here("stop")):
            call = time.monotonic_ns()
            try:
                if conn is None:
                    conn = connect("cut-off-poller-session")
                n += 1
                groups = sorted(conn.roundtrip(frame([n, "cluster"]), n)[2]["groups"], key=lambda g: g["shard"])
                record(f, {"call": call, "ret": time.monotonic_ns(), "leaders": [g["leader"] for g in groups]})
            except OSError:
                if conn is not None:
                    conn.close()
                conn = None
            time.sleep(0.02)

threading.Thread(target=poll_leaders, daemon=True).start()
rng = random.Random(0)
conn, seq, answered, batched = None, 0, False, False
secret = "cut-off-client-session"

def request(key, op, arg):
    global seq
    seq += 1
    return seq + 1, frame([seq + 1, "call", seq, 1, "Counter", key, op, [arg] if op == "add" else []])

with open(here("ops.jsonl"), "w") as f:
    while not os.path.exists(here("stop")):
        if os.path.exists(here("hold")) and not batched:
            open(here("holding"), "w").close()  # nothing of this client's is in flight
            while not os.path.exists(here("written")) and not os.path.exists(here("stop")):
                time.sleep(0.01)
            while conn is None and not os.path.exists(here("stop")):
                try:
                    conn = connect(secret)
                except OSError:
                    time.sleep(0.05)
            if conn is None:
                break
            batch = [(k, "get", 0) for _ in range(rounds) for k in keys]
            batch += [(k, "add", rng.randint(1, 5)) for k in keys]
            pending, frames = {}, []
            for key, op, arg in batch:
                rid, data = request(key, op, arg)
                pending[rid] = (key, op, arg)
                frames.append(data)
            def done(item, result, value):
                key, op, arg = item
                record(f, {"op": op, "key": key, "arg": arg, "call": call, "sent": sent, "ret": time.monotonic_ns(),
                           "outcome": result, "out": value, "batch": True})
            conn.sock.settimeout(30.0)  # its replies wait until the node knows whether it leads
            call = sent = time.monotonic_ns()
            try:
                conn.sock.sendall(b"".join(frames))
                sent = time.monotonic_ns()
                while pending:
                    reply = unpackb(conn.read_body())
                    if reply[0] in pending:
                        done(pending.pop(reply[0]), *outcome(reply))
                conn.sock.settimeout(1.0)
            except OSError as exc:
                for item in pending.values():
                    done(item, type(exc).__name__, None)
                conn.close()
                conn = None
            batched, answered = True, False
            continue
        key = rng.choice(keys)
        op, arg = ("add", rng.randint(1, 5)) if answered and rng.random() < 0.4 else ("get", 0)
        call = time.monotonic_ns()
        try:
            if conn is None:
                conn = connect(secret)
            rid, data = request(key, op, arg)
            result, value = outcome(conn.roundtrip(data, rid))
        except OSError as exc:  # no answer in time: the stream may be out of step, reconnect
            if conn is not None:
                conn.close()
            conn, result, value = None, type(exc).__name__, None
        record(f, {"op": op, "key": key, "arg": arg, "call": call, "ret": time.monotonic_ns(), "outcome": result,
                   "out": value, "batch": False})
        answered = result == "ok"
        if not answered:
            time.sleep(0.05)  # paces the attempts on a node that refuses or does not answer
"""
# Rounds of reads of every key in the cut-off client's batch.
CUT_OFF_ROUNDS = 2


def json_lines(path: Path) -> List[dict]:
    """The JSON lines written to ``path`` so far (a line being written is left out)."""
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines(keepends=True) if line.endswith("\n")]


def test_a_leader_cut_off_by_a_partition_never_answers_a_read_with_stale_state(netns_cluster, tmp_path):
    """A leader cut off from the others still believes it leads until its check of a quorum
    fails (an election timeout after it last heard from one); a read it answered from its
    own state meanwhile would miss writes the majority made since. So the old leader is made
    slow to notice (paused as the cut begins: a stall, as of a long pause of its process,
    freezes its Raft clock), the majority elects new leaders and acknowledges adds to every
    counter the old leader served, and the old leader then resumes, still cut off, and gets
    reads of those counters from a client in its namespace that knows that node alone,
    while it still believes it leads (its own view of the shards says so after they were
    sent: a stale read is observable). Whatever it answers is linearizable with the majority's writes (a read of a
    persistent object commits an entry first: it waits, and is refused once the node steps
    down). Nothing of the old leader's shards is pending when it is cut off (the history's
    clients leave those counters alone from just before the cut until the cluster healed,
    and the cut-off client waits), so a read answered from local state would not queue
    behind a write either. The cut-off client's adds are in the history too (of unknown
    outcome when refused or unanswered); its refused and unanswered reads are left out (a
    read changes nothing)."""
    cluster, netns = netns_cluster
    victim = cluster.busiest_leader()
    others = [n for n in cluster.nodes if n is not victim]
    leaders = cluster.leaders()
    assert set(leaders) == set(range(SHARDS)), cluster.describe()
    keys = keys_on_every_shard("cut")
    read = [k for k in keys if leaders[shard_of(k, SHARDS)] == victim.node_id]
    shards = {shard_of(k, SHARDS) for k in read}
    assert read, cluster.describe()
    control = tmp_path / "cut-off-client"
    control.mkdir()
    ops, polls = control / "ops.jsonl", control / "leaders.jsonl"
    batch_size = CUT_OFF_ROUNDS * len(read) + len(read)
    pid = victim.server.process.pid
    majority_ops: List[dict] = []

    def batch() -> List[dict]:
        return [r for r in json_lines(ops) if r["batch"]]

    def victim_leads(poll: dict) -> bool:
        return any(poll["leaders"][s] == victim.node_id for s in shards)

    with History(cluster.addresses, keys) as history:
        client = subprocess.Popen(
            [*netns.exec_prefix(victim.node_id), sys.executable, "-c", CUT_OFF_CLIENT, victim.address, NETNS_TOKEN,
             ",".join(read), str(control), str(CUT_OFF_ROUNDS)],
            env=dict(os.environ, PYTHONPATH=pythonpath_for_tests()),
        )
        try:
            # It reads and adds through the leader before the cut.
            assert wait_until(lambda: sum(r["outcome"] == "ok" for r in json_lines(ops) if r["op"] == "get") >= 10
                              and sum(r["outcome"] == "ok" for r in json_lines(ops) if r["op"] == "add") >= 5, 60), (
                json_lines(ops)[-5:]
            )
            with history.fault(f"pause and cut node {victim.node_id} off"):
                # The victim's shards fall quiet: every history client has made a call since
                # it left their counters (so it has none of theirs in flight), the cut-off
                # client holds, and the victim applied all it committed. (The history's
                # clients pick their counter from `history.keys` at each call.)
                history.keys = [k for k in keys if k not in read]
                (control / "hold").touch()
                quiet = time.monotonic_ns()
                assert wait_until(lambda: history_clients_since(history, quiet) == len(history.threads), 30)
                assert wait_until((control / "holding").exists, 30), json_lines(ops)[-5:]
                assert wait_until(lambda: all(g["applied"] == g["commit"] for g in victim.map()["groups"]
                                              if g["shard"] in shards), 30), cluster.describe()
                os.kill(pid, signal.SIGSTOP)
                try:
                    netns.isolate(victim.node_id)
                    # The majority elects new leaders and acknowledges adds to every counter
                    # the cut-off client reads.
                    assert wait_until(lambda: cluster.every_shard_led(via=others[0], without=victim), 20), (
                        cluster.describe()
                    )
                    majority = Client(",".join(n.address for n in others))
                    try:
                        for key in read * 2:
                            arg, call = random.randint(1, 5), time.monotonic_ns()
                            out = majority.call("Counter", key, "add", [arg])
                            majority_ops.append({"client": -2, "op": "add", "key": key, "arg": arg, "out": out,
                                                 "known": True, "call": call, "ret": time.monotonic_ns()})
                    finally:
                        majority.close()
                    written = time.monotonic_ns()
                    (control / "written.tmp").write_text(str(written))
                    os.replace(control / "written.tmp", control / "written")
                    # The old leader resumes, still cut off, and gets the client's batch.
                    os.kill(pid, signal.SIGCONT)
                    assert wait_until(lambda: len(batch()) == batch_size, 60), batch()
                    answered = max(r["ret"] for r in batch())
                    # It finds that it no longer leads, and the client keeps trying it.
                    assert wait_until(lambda: any(p["call"] >= answered and not victim_leads(p)
                                                  for p in json_lines(polls)), 30), json_lines(polls)[-3:]
                    assert wait_until(lambda: sum(not r["batch"] and r["call"] >= answered
                                                  for r in json_lines(ops)) >= 3, 30)
                finally:
                    os.kill(pid, signal.SIGCONT)
                    netns.heal(victim.node_id)
                healed = time.monotonic_ns()
                assert wait_until(cluster.settled, 30), cluster.describe()
                history.keys = keys
                # The victim leads its shards again and answers the client.
                assert wait_until(lambda: any(r["outcome"] == "ok" and r["call"] >= healed for r in json_lines(ops)),
                                  30), json_lines(ops)[-5:]
        finally:
            (control / "stop").touch()
            try:
                assert client.wait(30) == 0, "the cut-off client failed"
            finally:
                if client.poll() is None:
                    client.kill()
    attempts, sent = json_lines(ops), batch()[0]["sent"]
    reads = [r for r in batch() if r["op"] == "get"]
    outcomes = [r["outcome"] for r in batch()]
    print(f"{len(attempts)} calls of the cut-off client; its batch after the majority's "
          f"{len(majority_ops)} adds: " + ", ".join(f"{outcomes.count(o)} {o}" for o in sorted(set(outcomes))))
    # The scenario happened: every read of the batch was made after the majority's adds
    # were acknowledged, and sent before a moment when the old leader still believed it led
    # (a view of its own asked after the batch went).
    assert len(reads) == CUT_OFF_ROUNDS * len(read) and all(r["call"] >= written for r in reads), reads
    assert any(p["call"] >= sent and victim_leads(p) for p in json_lines(polls)), (
        "the old leader had stopped leading before the cut-off client's batch was sent"
    )
    history.check(tmp_path, majority_ops + [
        {"client": -1, "op": r["op"], "key": r["key"], "arg": r["arg"], "out": r["out"] or 0,
         "known": r["outcome"] == "ok", "call": r["call"], "ret": r["ret"]}
        for r in attempts if r["op"] == "add" or r["outcome"] == "ok"
    ])


def history_clients_since(history: History, since: int) -> int:
    """How many of ``history``'s clients recorded a call made at or after ``since``."""
    with history.lock:
        return len({o["client"] for o in history.ops if o["call"] >= since})


def children(pid: int) -> List[int]:
    """The processes whose parent is ``pid``."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError):  # a process that ended meanwhile
            if int(stat.read_text().rsplit(")", 1)[1].split()[1]) == pid:
                found.append(int(stat.parent.name))
    return found


def start_local_cluster(directory: Path, port: int, stderr=None) -> "tuple[subprocess.Popen, str]":
    """`spindle cluster local` with three nodes from ``port`` on; once it says the cluster is
    up, the process and its ``SPINDLE_ADDRESS``."""
    proc = subprocess.Popen(
        [server_binary(), "cluster", "local", "--dir", str(directory), "--port", str(port),
         "--partitions", str(SHARDS)],
        stdout=subprocess.PIPE, stderr=stderr, text=True,
    )
    address = None
    for line in proc.stdout:  # type: ignore[union-attr]
        if line.startswith("export SPINDLE_ADDRESS="):
            address = line.split("=", 1)[1].strip()
        if line.startswith("the cluster is up"):
            break
    assert address == ",".join(f"127.0.0.1:{port + i}" for i in range(3)), address
    return proc, address


def test_one_command_runs_a_local_cluster_that_stops_with_it_and_restarts_with_its_data(tmp_path):
    port = stable_port(3)

    def start() -> "tuple[subprocess.Popen, str]":
        return start_local_cluster(tmp_path / "c", port)

    proc, address = start()
    try:
        # The nodes split the machine's cores and yield them before sleeping.
        flags = [set(Path(f"/proc/{node}/cmdline").read_bytes().split(b"\0")) for node in children(proc.pid)]
        assert len(flags) == 3 and all({b"--threads", b"--shared-cores"} <= f for f in flags), flags
        client = Client(address)
        client.create("Counter", "local", [], False, persistent=True)
        assert client.call("Counter", "local", "add", [7]) == 7
        client.close()
    finally:
        proc.terminate()
        proc.wait(10)
    # The nodes stop with the command (their stdin closes).
    assert wait_until(lambda: not any(listening(port + i) for i in range(3)), 15)
    proc, address = start()
    try:
        client = Client(address)
        assert client.call("Counter", "local", "get", []) == 7
        client.close()
    finally:
        proc.terminate()
        proc.wait(10)


def test_a_local_cluster_reports_a_node_that_dies_and_the_others_keep_serving(tmp_path):
    port = stable_port(3)
    errors = tmp_path / "cluster-local.err"
    with open(errors, "w") as stderr:
        proc, address = start_local_cluster(tmp_path / "c", port, stderr=stderr)
    try:
        # "Up" means every shard has a leader; wait until each also has its three voters,
        # so that losing one leaves a majority.
        def three_voters_each() -> bool:
            view = cluster_map("127.0.0.1", port)
            groups = view["groups"] + [view["metadata"]]
            return len(groups) == SHARDS + 1 and all(sorted(g["voters"]) == [1, 2, 3] for g in groups)

        assert wait_until(three_voters_each, 30), cluster_map("127.0.0.1", port)
        client = Client(address)
        keys = keys_on_every_shard("local")
        for key in keys:
            client.create("Counter", key, [], False, persistent=True)
            assert client.call("Counter", key, "add", [1]) == 1
        nodes = {}
        for pid in children(proc.pid):
            args = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            nodes[int(args[args.index(b"--node-id") + 1])] = pid
        assert sorted(nodes) == [1, 2, 3], nodes
        os.kill(nodes[2], signal.SIGKILL)
        report = f"spindle: node 2 exited (signal: 9 (SIGKILL)); see {tmp_path / 'c' / 'node2.log'}\n"
        assert wait_until(lambda: errors.read_text() == report, 15), errors.read_text()
        # The command goes on running the others, and they serve every shard.
        assert proc.poll() is None
        assert sorted(children(proc.pid)) == sorted([nodes[1], nodes[3]])
        assert [client.call("Counter", key, "add", [1]) for key in keys] == [2] * SHARDS
        client.close()
    finally:
        proc.terminate()
        proc.wait(10)
    # Stopped, it stops the nodes left and returns as usual.
    assert proc.returncode == 0, errors.read_text()
    assert not any(listening(port + i) for i in range(3))
    assert errors.read_text() == report


def test_shell_object_commands_follow_redirects_to_each_shards_leader(cluster):
    names = [f"shell{i}" for i in range(12)]
    assert {shard_of(n, SHARDS) for n in names} == set(range(SHARDS))
    env = dict(os.environ, SPINDLE_ADDRESS=cluster.nodes[0].address)
    for name in names:
        for step, expected in ((5, "5"), (2, "7")):
            out = subprocess.run(
                [server_binary(), "counter", "-n", name, "increment", "-i", str(step)],
                capture_output=True, text=True, env=env, timeout=30,
            )
            assert out.returncode == 0 and out.stdout.strip() == expected, out.stderr


def test_objects_lists_every_shard_once_from_any_node_all_too(cluster):
    names = [f"listed{i}" for i in range(12)]
    assert {shard_of(n, SHARDS) for n in names} == set(range(SHARDS))
    client = Client(cluster.addresses)
    try:
        for i, name in enumerate(names):
            # Half persistent (on every replica), half ephemeral (on the leader alone).
            client.create("Counter", name, [], False, persistent=i % 2 == 0)
    finally:
        client.close()
    expected = [[name, "Counter"] for name in sorted(names)]
    for node in cluster.nodes:
        # The SDK, through any one node: each object once, with its type.
        client = Client(node.address)
        try:
            assert client.objects("listed") == expected
            assert client.objects("listed", persistent=True) == [e for e in expected if int(e[0][6:]) % 2 == 0]
        finally:
            client.close()
        # The CLI, and a shell object command that looks the type up, through that node.
        env = dict(os.environ, SPINDLE_ADDRESS=node.address)
        out = subprocess.run([server_binary(), "objects", "listed"], capture_output=True, text=True, env=env,
                             timeout=30)
        assert out.returncode == 0, out.stderr
        assert [line.split() for line in out.stdout.splitlines()] == expected
        # --all asks every node too, and gives each object's size.
        out = subprocess.run([server_binary(), "objects", "--all", "listed"], capture_output=True, text=True,
                             env=env, timeout=30)
        assert out.returncode == 0, out.stderr
        rows = [line.split() for line in out.stdout.splitlines()]
        assert [row[:2] for row in rows] == expected and all(row[2].isdigit() for row in rows), rows
    for name in names:
        out = subprocess.run([server_binary(), "counter", "-n", name, "get"], capture_output=True, text=True,
                             env=dict(os.environ, SPINDLE_ADDRESS=cluster.nodes[2].address), timeout=30)
        assert out.returncode == 0 and out.stdout.strip() == "0", out.stderr


def test_spindle_sh_runs_through_any_node_of_a_cluster(cluster):
    for node in cluster.nodes:
        env = dict(os.environ, SPINDLE_ADDRESS=node.address, PYTHONPATH=pythonpath_for_tests())
        # Two stages: the output stream and the pipe between them are the shell's queues.
        out = subprocess.run([server_binary(), "sh", f"echo hello {node.node_id} | tr a-z A-Z"],
                             capture_output=True, text=True, env=env, timeout=60)
        assert out.returncode == 0, out.stderr
        assert out.stdout == f"HELLO {node.node_id}\n"


def test_an_ephemeral_object_lost_with_its_leader_raises_a_clear_error(cluster):
    client = Client(cluster.addresses)
    try:
        leaders = cluster.leaders()
        victim = cluster.busiest_leader()
        shard = next(s for s, n in leaders.items() if n == victim.node_id)
        key = next(f"e{i}" for i in range(1000) if shard_of(f"e{i}", SHARDS) == shard)
        client.create("Counter", key, [], False)
        assert client.call("Counter", key, "add", [1]) == 1
        victim.kill()
        # What the new leader answers (the server's `NotFound`).
        missing = f"Counter '{key}' does not exist (it was deleted, or the session that created it ended)"
        # The call finds the leader gone, and its new leader without the object: the SDK,
        # having seen the failover, says why.
        with pytest.raises(spindle.ObjectLost) as lost:
            client.call("Counter", key, "add", [1])
        assert str(lost.value) == (
            f"{missing}: the leader of its shard changed during the call, and an ephemeral object lives on its "
            "shard's leader only (persistent=True keeps an object through failovers)"
        )
        # A later call is answered by the new leader alone: there is no such object.
        with pytest.raises(spindle.ObjectNotFound) as not_found:
            client.call("Counter", key, "add", [1])
        assert str(not_found.value) == missing
    finally:
        client.close()


def test_a_member_restarted_without_join_serves_only_the_shards_it_holds(tmp_path):
    cluster = Cluster(tmp_path, rf=1)
    try:
        client = Client(cluster.addresses)
        keys = [f"held{i}" for i in range(16)]
        for k in keys:
            client.create("Counter", k, [], False, persistent=True)
            client.call("Counter", k, "add", [4])
        client.close()
        node = cluster.nodes[1]
        node.stop()
        node.join = None  # as `spindle cluster local` and the docs restart a member
        node.start()
        assert wait_until(cluster.settled, 30), cluster.describe()
        # No group of a shard placed elsewhere made itself a one-node cluster on this node.
        for g in node.map()["groups"]:
            if node.node_id not in g["placement"]:
                assert g["leader"] != node.node_id and node.node_id not in g["voters"], g
        client = Client(cluster.addresses)
        assert [client.call("Counter", k, "get", []) for k in keys] == [4] * 16
        client.close()
    finally:
        cluster.stop()


def raw(host: str, port: int, request: list, node: bool = False) -> list:
    """One request on a connection of its own (``node``: as a node of the cluster, with its
    key); its reply ``[id, status, result]``."""
    conn = (Connection(host, port, "cluster-bad-input", 1, CLUSTER_KEY, user=NODE_USER) if node
            else Connection(host, port, "cluster-bad-input", 1))
    try:
        return conn.roundtrip(frame(request), request[0])
    finally:
        conn.close()


def test_cluster_requests_to_a_single_server_and_malformed_ones_get_clear_errors(server):
    host, port = server.address.rsplit(":", 1)
    for request in ([2, "cluster"], [2, "join", 5, "127.0.0.1:1"], [2, "leave", 5]):
        reply = raw(host, int(port), request)
        assert reply[1] == 1 and reply[2][0] == "ValueError" and "--node-id" in reply[2][1], reply
    # Raft is between nodes only: a client (even the default user) is refused.
    reply = raw(host, int(port), [2, "raft", 1, "127.0.0.1:1", 0, [b"\x08\x02"]])
    assert reply[1] == 1 and reply[2][0] == "PermissionDenied", reply
    for request in ([2, "join", 5], [2, "leave"], [2, "raft", 1, "a", 0, ["not bytes"]],
                    [2, "raft", "one", "a", 0, []], [2, "cluster", 1]):
        reply = raw(host, int(port), request)
        assert reply[1] == 1 and reply[2][0] == "ProtocolError", reply


def test_hostile_raft_frames_do_not_disturb_a_cluster(cluster):
    node = cluster.nodes[1]
    before = cluster.leaders()
    assert len(before) == SHARDS, cluster.describe()
    # An empty proposal (raft-rs would panic on it), garbage, and a shard that does not
    # exist: all dropped, nothing answered.
    hostile = [b"\x08\x02", b"\xff\xff\xff", b""]
    for shard in (0, SHARDS, 10**9):
        conn = Connection(node.host, node.port, "cluster-bad-input", 1, CLUSTER_KEY, user=NODE_USER)
        conn.sock.sendall(frame([2, "raft", 99, "127.0.0.1:1", shard, hostile]))
        conn.close()
    # Messages in parts: a part naming two messages is refused; parts that switch shards,
    # run over the size limit or are broken off by a whole batch are dropped, and the
    # connection goes on carrying messages.
    reply = raw(node.host, node.port, [2, "raft", 99, "127.0.0.1:1", 0, [b"a", b"b"], True], node=True)
    assert reply[1] == 1 and "exactly one message" in reply[2][1], reply
    conn = Connection(node.host, node.port, "cluster-bad-input", 1, CLUSTER_KEY, user=NODE_USER)
    for shard, part, more in ((0, b"\xff" * 1000, True), (1, b"\xff", False), (0, b"\x08", True),
                              (0, b"x", True)):
        conn.sock.sendall(frame([2, "raft", 99, "127.0.0.1:1", shard, [part], more]))
    conn.sock.sendall(frame([2, "raft", 99, "127.0.0.1:1", 0, hostile]))
    assert conn.roundtrip(frame([3, "ping"]), 3)[2] == "pong"
    conn.close()
    # A node id that is taken, at another address, is refused.
    meta_leader = next(n for n in cluster.nodes if n.node_id == cluster.views()["meta"]["leader"])
    reply = raw(meta_leader.host, meta_leader.port, [2, "join", 1, "127.0.0.1:1"])
    assert reply[1] == 1 and reply[2][0] == "ValueError" and "another address" in reply[2][1], reply
    # Every group still serves, with the same leaders, through the node that got the frames.
    assert wait_until(cluster.settled, 10), cluster.describe()
    assert cluster.leaders() == before
    client = Client(node.address)
    try:
        for i in range(16):
            client.create("Counter", f"after{i}", [], False, persistent=True)
            assert client.call("Counter", f"after{i}", "add", [1]) == 1
    finally:
        client.close()
