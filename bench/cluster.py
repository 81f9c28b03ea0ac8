"""Cluster mode: replicated throughput vs Redis with replicas and ``WAIT`` (the seed's Figure 3,
replicated), and availability through a node crash and a node join (the seed's Figure 8).

**Throughput.** A 3-node loopback cluster (``spindle server --node-id``, 8 shards) for each
replication factor rf = 1, 2, 3, against one Redis master with two replicas, where a write is
acknowledged after ``WAIT rf-1`` replicas have it. The Rust load generator (``bench/loadgen``)
drives both with the same code: 200 connections (the seed's 200 cloud threads), then 32 (a
lighter load), one request in flight each, increments of 800 persistent counters chosen uniformly at random (``Counter.add(1)`` vs ``INCRBY`` then
``WAIT``). Spindle's client sends each call to its shard's leader. Spindle runs twice: with
its Raft log fsynced before each acknowledgement (``--fsync always``, the default) and not
(``--fsync never``: replicated in memory, like Redis without an AOF); Redis replicates in
memory. At rf = 1 and 200 connections, Spindle also runs on a 1-node cluster (the same
shards in one process), which separates a node's cost per call from its spreading over three,
and Redis also runs sharded over three masters without replicas (the seed's rf = 1 setup).

**Availability.** 100 client threads (in 4 processes, through the Python SDK) read a shared
model (a persistent 4 KB ``Blob``, 32 of them) on a 3-node cluster (rf = 3). At 5 s the
node leading the most shards is killed (``SIGKILL``); at 12 s a fourth node joins. The
reads completed per 100 ms make the timeline; the dip is measured against the throughput
before the crash.

**Re-replication.** The same reads on a 4-node cluster (rf = 3) with ``--dead-after`` short:
the node leading the most shards is killed, and the run measures the time until the cluster
declares it dead and until every shard is back at three live voters, and the reads per
second meanwhile. ``--only rereplication`` runs only this part and prints it.

Writes the ``cluster`` section of ``docs/benchmarks.md`` and ``docs/img/cluster-*.png``.
Usage: ``python bench/cluster.py [--no-docs]`` (``QUICK=1``: short runs).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import queue
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from objects import free_port, redis_cmd, stop_process, wait_for_port
from report import IMG, QUICK, Claim, log, machine, print_table, redis_version, summarize, table, update_section
from throughput import loadgen_binary

from spindle.client import Client, Connection, frame
from spindle.embedded import find_binary

NODES = 3
CLUSTER_KEY = "bench-cluster-key"  # what the nodes authenticate each other with
SHARDS = 8
KEYS = 800
CONNECTIONS = (200, 32)  # the seed's 200 cloud threads (the goal's load), then a lighter load
RFS = (1, 2, 3)
GOAL_THROUGHPUT = 1.0  # Spindle at least Redis WAIT at every rf
GOAL_DIP = 0.30  # at most 30% below the throughput before the crash...
GOAL_DIP_SECONDS = 2.0  # ...for under 2 s
GOAL_RECOVERY_SECONDS = 2.0  # full throughput within 2 s of the join
BUCKET = 0.1  # seconds per timeline point


def threads_per_node(nodes: int) -> int:
    """The nodes split the machine's cores, as `spindle cluster local` does."""
    return max(1, len(os.sched_getaffinity(0)) // nodes)


class LocalCluster:
    """Nodes of one cluster on loopback, each a ``spindle server --node-id`` process."""

    def __init__(self, root: Path, rf: int, fsync: str, nodes: int = NODES, extra: tuple = ()) -> None:
        self.root, self.rf, self.fsync, self.extra = root, rf, fsync, list(extra)
        self.threads = threads_per_node(nodes)
        root.mkdir(parents=True, exist_ok=True)
        self.procs: dict[int, subprocess.Popen] = {}
        self.ports: dict[int, int] = {}
        for node in range(1, nodes + 1):
            self.start(node)
        self.wait_settled()

    def address(self, node: int) -> str:
        return f"127.0.0.1:{self.ports[node]}"

    @property
    def addresses(self) -> str:
        return ",".join(self.address(n) for n in self.procs)

    def start(self, node: int) -> None:
        self.ports[node] = free_port()
        cmd = [find_binary(), "server", "--node-id", str(node), "--port", str(self.ports[node]),
               "--data-dir", str(self.root / f"n{node}"), "--partitions", str(SHARDS),
               "--replication-factor", str(self.rf), "--fsync", self.fsync, "--threads", str(self.threads), "--shared-cores",
               "--cluster-key", CLUSTER_KEY, *self.extra]
        if node > 1:
            cmd += ["--join", self.address(1)]
        log_file = open(self.root / f"n{node}.log", "w")
        self.procs[node] = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=log_file)
        wait_for_port(self.ports[node], self.procs[node])

    def maps(self) -> list[dict]:
        out = []
        for node in self.procs:
            if self.procs[node].poll() is not None:
                continue
            try:
                conn = Connection("127.0.0.1", self.ports[node], "bench-cluster-session", 1)
                reply = conn.roundtrip(frame([2, "cluster"]), 2)
                conn.close()
                out.append(reply[2])
            except OSError:
                pass
        return out

    def leaders(self) -> dict[int, int]:
        """Each shard's leader, as its leader sees it."""
        found = {}
        for m in self.maps():
            for g in m["groups"]:
                if g["leader"] == m["node"]:
                    found[g["shard"]] = g["leader"]
        return found

    def settled(self) -> bool:
        """Every live node is a member, and every group has its placed replicas as voters."""
        views = {}
        maps = self.maps()
        live = {n for n, p in self.procs.items() if p.poll() is None}
        if not maps or any(set(map(int, m["nodes"])) != live for m in maps):
            return False
        for m in maps:
            for g in m["groups"] + [dict(m["metadata"], shard="meta")]:
                if g["leader"] == m["node"]:
                    views[g["shard"]] = g
        # Leadership too has settled on each group's preferred replica (the load generator
        # reads the shard map once).
        return len(views) == SHARDS + 1 and all(
            sorted(g["voters"]) == sorted(g["placement"]) and (s == "meta" or not g["learners"])
            and g["leader"] == g["placement"][0]
            for s, g in views.items())

    def wait_settled(self, deadline: float = 60.0) -> float:
        start = time.monotonic()
        while not self.settled():
            if time.monotonic() - start > deadline:
                raise RuntimeError(f"the cluster did not settle within {deadline:.0f} s (logs in {self.root})")
            time.sleep(0.05)
        return time.monotonic() - start

    def busiest_leader(self) -> int:
        counts: dict[int, int] = {}
        for leader in self.leaders().values():
            counts[leader] = counts.get(leader, 0) + 1
        return max(counts, key=counts.__getitem__)

    def stop(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                stop_process(proc)


class RedisReplicated:
    """One Redis master and two replicas (in memory, no persistence)."""

    def __init__(self) -> None:
        self.ports = [free_port() for _ in range(3)]
        self.procs = []
        for i, port in enumerate(self.ports):
            # The master sends its data to the replicas at once (by default it waits 5 s for more).
            cmd = redis_cmd(port) + (["--repl-diskless-sync-delay", "0"] if i == 0 else
                                     ["--replicaof", "127.0.0.1", str(self.ports[0])])
            self.procs.append(subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
            wait_for_port(port, self.procs[-1])
        import redis

        master = redis.Redis(host="127.0.0.1", port=self.ports[0])
        deadline = time.monotonic() + 30
        while sum(isinstance(v, dict) and v.get("state") == "online"
                  for v in master.info("replication").values()) < 2:
            if time.monotonic() > deadline:
                raise RuntimeError("the Redis replicas did not come online")
            time.sleep(0.05)

    def stop(self) -> None:
        for proc in self.procs:
            stop_process(proc)


class RedisMasters:
    """Redis sharded over independent masters, one per node, no replicas (the seed's rf = 1)."""

    def __init__(self, count: int) -> None:
        self.ports = [free_port() for _ in range(count)]
        self.procs = []
        for port in self.ports:
            self.procs.append(subprocess.Popen(redis_cmd(port), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
            wait_for_port(port, self.procs[-1])

    @property
    def addresses(self) -> str:
        return ",".join(f"127.0.0.1:{port}" for port in self.ports)

    def stop(self) -> None:
        for proc in self.procs:
            stop_process(proc)


def loadgen(binary: str, target: str, address: str, seconds: float, connections: int, wait: int = 0) -> dict:
    cmd = [binary, "--target", target, "--address", address, "--op", "incr", "--connections", str(connections),
           "--pipeline", "1", "--keys", str(KEYS), "--seconds", str(seconds), "--warmup", "1",
           "--key-prefix", "replicated-"]
    cmd += ["--persistent"] if target == "spindle" else ["--wait", str(wait)]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        sys.exit(f"error: spindle-loadgen failed on {target}: {proc.stderr.strip()}")
    return json.loads(proc.stdout)


# --- availability --------------------------------------------------------------------------

def reader_process(addresses: str, threads: int, keys: list[str], until: float, out) -> None:
    """``threads`` readers looping over ``keys``; puts the completion times (monotonic)."""
    import threading

    done: list[float] = []
    lock = threading.Lock()

    def loop(i: int) -> None:
        client = Client(addresses)
        mine: list[float] = []
        n = i
        while time.monotonic() < until:
            try:
                client.call("Blob", keys[n % len(keys)], "get", [])
                mine.append(time.monotonic())
            except Exception:  # a call that outlived the failover window: not counted
                pass
            n += 1
        client.close()
        with lock:
            done.extend(mine)

    pool = [threading.Thread(target=loop, args=(i,)) for i in range(threads)]
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    out.put(done)


def persistent_blobs(cluster: LocalCluster) -> list[str]:
    """The 32 persistent 4 KB blobs the availability runs read, created; their keys."""
    keys = [f"model-{i}" for i in range(32)]
    setup = Client(cluster.addresses)
    for key in keys:
        setup.create("Blob", key, [bytes(4096)], False, persistent=True)
    setup.close()
    return keys


def availability(root: Path, duration: float, kill_at: float, join_at: float) -> dict:
    cluster = LocalCluster(root, rf=3, fsync="always")
    keys = persistent_blobs(cluster)
    events: dict[str, float] = {}
    try:
        ctx = multiprocessing.get_context("spawn")
        out = ctx.Queue()
        start = time.monotonic() + 2.0  # after the readers connected
        until = start + duration
        readers = [ctx.Process(target=reader_process, args=(cluster.addresses, 25, keys, until, out))
                   for _ in range(4)]
        for p in readers:
            p.start()
        time.sleep(max(0.0, start + kill_at - time.monotonic()))
        victim = cluster.busiest_leader()
        cluster.procs[victim].kill()
        events["kill"] = time.monotonic() - start
        log(f"killed node {victim} at {events['kill']:.1f} s")
        time.sleep(max(0.0, start + join_at - time.monotonic()))
        cluster.start(NODES + 1)
        events["join"] = time.monotonic() - start
        log(f"node {NODES + 1} joining at {events['join']:.1f} s")
        times: list[float] = []
        for _ in readers:
            try:
                times.extend(out.get(timeout=until - time.monotonic() + 60))
            except queue.Empty:
                codes = [p.exitcode for p in readers]
                raise RuntimeError(f"a reader process ended without its reads (exit codes {codes})") from None
        for p in readers:
            p.join()
    finally:
        cluster.stop()
    buckets = int(duration / BUCKET)
    counts = [0] * buckets
    for t in times:
        i = int((t - start) / BUCKET)
        if 0 <= i < buckets:
            counts[i] += 1
    rate = [c / BUCKET for c in counts]
    before = statistics.median(rate[int(1.0 / BUCKET):int(events["kill"] / BUCKET)])
    k, j = int(events["kill"] / BUCKET), int(events["join"] / BUCKET)
    # Every 100 ms below 70% between the crash and the join counts, as after the join.
    low = [i for i in range(k, j) if rate[i] < (1 - GOAL_DIP) * before]
    dip_s = len(low) * BUCKET
    worst = min(rate[k:j]) / before if j > k else 1.0
    # The seed reports its dip over seconds: the lowest one-second window after the crash.
    second = int(1.0 / BUCKET)
    windows = [sum(rate[i:i + second]) / second for i in range(k, max(k + 1, j - second + 1))]
    worst_second = min(windows) / before
    after_crash = statistics.median(rate[k + int(3 / BUCKET):j]) if j - k > int(3 / BUCKET) else float("nan")
    # Recovery after the join: the first point from which the next second reads 90% of
    # before. Over a second, as the dip: 100 ms points scatter (before the crash, up to a
    # fifth of them fall below 90% of their own median, and ten in a row above it can take
    # seconds to come). Replicas and leadership keep moving for a while after it: every later
    # dip below 70% is counted too.
    recovered_s = float("inf")  # not within the run (a median over runs then sorts it last)
    for i in range(j, buckets - second + 1):
        if sum(rate[i:i + second]) / second >= 0.9 * before:
            recovered_s = (i - j) * BUCKET
            break
    late = [i for i in range(j, buckets) if rate[i] < (1 - GOAL_DIP) * before]
    join_dips = sum(1 for i in late if i - 1 not in late)
    join_dip_s = len(late) * BUCKET
    return {"rate": rate, "events": events, "before": before, "dip_s": dip_s, "worst": worst,
            "worst_second": worst_second,
            "after_crash": after_crash, "recovered_s": recovered_s, "join_dips": join_dips, "join_dip_s": join_dip_s,
            "reads": len(times)}


DEAD_AFTER = 3.0  # seconds: --dead-after of the re-replication run


def rereplicated(cluster: LocalCluster, victim: int) -> bool:
    """Every group, as its leader sees it, has its placed replicas as voters, as many as the
    live nodes allow (up to 3), none of them ``victim``."""
    views = {}
    for m in cluster.maps():
        for g in m["groups"] + [dict(m["metadata"], shard="meta")]:
            if g["leader"] == m["node"]:
                views[g["shard"]] = g
    want = min(3, sum(1 for p in cluster.procs.values() if p.poll() is None))
    return len(views) == SHARDS + 1 and all(
        len(g["voters"]) == want and victim not in g["voters"] and sorted(g["voters"]) == sorted(g["placement"])
        and (s == "meta" or not g["learners"])
        for s, g in views.items())


def declared_dead(cluster: LocalCluster, victim: int) -> bool:
    return any(m.get("liveness", {}).get(victim, {}).get("state") == "dead" for m in cluster.maps())


def rereplication(root: Path, budget: float) -> dict:
    """Reads through a node's death on 4 nodes (rf = 3): when it is declared dead, when every
    shard is back at three live voters, and the reads per second before, while the cluster
    waits out ``--dead-after``, and while replicas move."""
    cluster = LocalCluster(root, rf=3, fsync="always", nodes=NODES + 1, extra=("--dead-after", f"{DEAD_AFTER:g}"))
    keys = persistent_blobs(cluster)
    events: dict[str, float] = {}
    try:
        ctx = multiprocessing.get_context("spawn")
        out = ctx.Queue()
        start = time.monotonic() + 2.0
        until = start + budget
        readers = [ctx.Process(target=reader_process, args=(cluster.addresses, 25, keys, until, out))
                   for _ in range(4)]
        for p in readers:
            p.start()
        time.sleep(max(0.0, start + 3.0 - time.monotonic()))
        victim = cluster.busiest_leader()
        cluster.procs[victim].kill()
        events["kill"] = time.monotonic() - start
        log(f"killed node {victim} at {events['kill']:.1f} s")
        while time.monotonic() < until and "replicated" not in events:
            now = time.monotonic() - start
            if "dead" not in events and declared_dead(cluster, victim):
                events["dead"] = now
            if "dead" in events and rereplicated(cluster, victim):
                events["replicated"] = now
            time.sleep(0.05)
        log(f"events: {events}")
        times: list[float] = []
        for _ in readers:
            times.extend(out.get(timeout=until - time.monotonic() + 60))
        for p in readers:
            p.join()
    finally:
        cluster.stop()
    counts = [0] * int(budget / BUCKET)
    for t in times:
        i = int((t - start) / BUCKET)
        if 0 <= i < len(counts):
            counts[i] += 1
    rate = [c / BUCKET for c in counts]

    def median_rate(a: float, b: float) -> float:
        part = rate[int(a / BUCKET):int(b / BUCKET)]
        return statistics.median(part) if part else float("nan")

    kill, dead = events["kill"], events.get("dead", budget)
    full = events.get("replicated", budget)
    return {"before": median_rate(1.0, kill), "waiting": median_rate(kill, dead), "moving": median_rate(dead, full),
            "after": median_rate(full, budget), "to_dead": dead - kill, "to_replicated": full - kill,
            "moves": full - dead, "replicated": "replicated" in events}


def rereplication_rows(r: dict) -> list[list[str]]:
    def seconds(name: str) -> str:
        return f"{r[name]:.1f} s" if r["replicated"] else "not within the run"

    return [
        ["reads/s before the death (median per 100 ms)", f"{r['before']:,.0f}"],
        ["from the kill to the node declared dead", f"{r['to_dead']:.1f} s (--dead-after {DEAD_AFTER:g} s)"],
        ["from the kill to every shard at 3 live voters", seconds("to_replicated")],
        ["of which replicas moving (declared dead to replicated)", seconds("moves")],
        ["reads/s until declared dead (2 of 3 replicas live)", f"{r['waiting']:,.0f}"],
        ["reads/s while replicas move", f"{r['moving']:,.0f}"],
        ["reads/s once replicated", f"{r['after']:,.0f}"],
    ]


# --- report --------------------------------------------------------------------------------

def plot_throughput(results: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    path.parent.mkdir(parents=True, exist_ok=True)
    fig, axes = plt.subplots(1, len(CONNECTIONS), figsize=(11, 3.6), sharey=True)
    systems = [("spindle-always", "Spindle, Raft log fsynced"), ("spindle-never", "Spindle, in memory"),
               ("redis", "Redis, WAIT rf-1")]
    width = 0.27
    for ax, conns in zip(axes, CONNECTIONS):
        for i, (system, label) in enumerate(systems):
            ys = [statistics.median(r["ops_per_s"] for r in results[(system, rf, conns)]) for rf in RFS]
            ax.bar([x + (i - 1) * width for x in range(len(RFS))], ys, width, label=label)
        ax.set_xticks(range(len(RFS)), [f"rf = {rf}" for rf in RFS])
        ax.set_title(f"{conns} connections")
        ax.grid(axis="y", alpha=0.3)
    axes[0].set_ylabel("increments/s")
    axes[0].legend()
    fig.suptitle(f"Replicated increments, {NODES}-node loopback cluster")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def plot_availability(a: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 3.6))
    xs = [i * BUCKET for i in range(len(a["rate"]))]
    ax.plot(xs, [r / 1000 for r in a["rate"]], lw=1)
    for name, label in (("kill", "node killed"), ("join", "node joins")):
        ax.axvline(a["events"][name], color="red" if name == "kill" else "green", ls="--", label=label)
    ax.axhline(a["before"] / 1000, color="gray", ls=":", label="before the crash (median)")
    ax.set_xlabel("seconds")
    ax.set_ylabel("reads/s (thousands, per 100 ms)")
    ax.set_title("100 clients reading a shared model through a crash and a join (seed Figure 8)")
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def round_runs(binary: str, work: Path, rf: int, conns: int,
               seconds: float) -> list[tuple[str, Callable[[], dict]]]:
    """One round's runs at ``rf`` and ``conns``, each a loadgen result's system name and the
    run. The goal's pair, Spindle in memory and Redis ``WAIT``, is side by side."""

    def spindle(fsync: str, nodes: int = NODES) -> Callable[[], dict]:
        def run() -> dict:
            cluster = LocalCluster(work / f"{fsync}-{nodes}", rf, fsync, nodes=nodes)
            try:
                return loadgen(binary, "spindle", cluster.address(1), seconds, conns)
            finally:
                cluster.stop()
        return run

    def redis(wait: int) -> dict:
        replicated = RedisReplicated()
        try:
            return loadgen(binary, "redis", f"127.0.0.1:{replicated.ports[0]}", seconds, conns, wait=wait)
        finally:
            replicated.stop()

    def sharded() -> dict:
        masters = RedisMasters(NODES)
        try:
            return loadgen(binary, "redis", masters.addresses, seconds, conns)
        finally:
            masters.stop()

    runs = [("spindle-always", spindle("always")), ("spindle-never", spindle("never")),
            ("redis", lambda: redis(rf - 1))]
    if rf == 1 and conns == CONNECTIONS[0]:
        # Where rf = 1 loses against Redis: the same shards, all on one node; and the seed's
        # rf = 1, Redis sharded over as many masters as nodes, without replicas.
        runs += [("spindle-one-node", spindle("never", nodes=1)), ("redis-sharded", sharded)]
    return runs


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--no-docs", action="store_true", help="print only; do not write docs/benchmarks.md")
    ap.add_argument("--only", choices=["rereplication"], help="run only this part, print it (no docs)")
    args = ap.parse_args()
    rereplication_budget = 30.0 if QUICK else 60.0
    if args.only == "rereplication":
        work = Path(tempfile.mkdtemp(prefix="spindle-bench-cluster-"))
        try:
            print_table(["measure", "value"], rereplication_rows(rereplication(work / "rereplication", rereplication_budget)))
        finally:
            shutil.rmtree(work, ignore_errors=True)
        return
    rounds, seconds = (1, 1.0) if QUICK else (5, 4.0)
    duration, kill_at, join_at = (10.0, 3.0, 6.0) if QUICK else (20.0, 5.0, 12.0)
    avail_runs = 1 if QUICK else 3
    binary = loadgen_binary()
    results: dict[tuple[str, int, int], list[dict]] = {}
    work = Path(tempfile.mkdtemp(prefix="spindle-bench-cluster-"))
    try:
        for r in range(rounds):
            for conns in CONNECTIONS:
                for rf in RFS:
                    runs = round_runs(binary, work / f"r{r}-c{conns}-rf{rf}", rf, conns, seconds)
                    # Every other round runs them the other way round: a pair's two runs stay
                    # side by side, and neither always goes first (the machine drifts).
                    for system, run in runs if r % 2 == 0 else runs[::-1]:
                        log(f"round {r + 1}/{rounds}: {conns} connections, rf={rf}, {system}...")
                        results.setdefault((system, rf, conns), []).append(run())
        timelines = []
        for i in range(avail_runs):
            log(f"availability {i + 1}/{avail_runs}: {duration:g} s of reads, a crash at {kill_at:g} s, "
                f"a join at {join_at:g} s...")
            timelines.append(availability(work / f"availability{i}", duration, kill_at, join_at))
        log(f"re-replication: a node killed on 4 nodes, --dead-after {DEAD_AFTER:g} s...")
        moved = rereplication(work / "rereplication", rereplication_budget)
    finally:
        shutil.rmtree(work, ignore_errors=True)

    def med(system: str, rf: int, conns: int) -> float:
        return statistics.median(r["ops_per_s"] for r in results[(system, rf, conns)])

    def paired(system: str, peer: str, rf: int, conns: int) -> list[float]:
        # Spindle and its peer run in the same round: each round's own ratio follows the
        # machine's speed, which drifts between rounds (and moves Redis as much).
        ours, theirs = results[(system, rf, conns)], results[(peer, rf, conns)]
        assert len(ours) == len(theirs), (system, peer, rf, conns)
        return [s["ops_per_s"] / p["ops_per_s"] for s, p in zip(ours, theirs)]

    def ratio(system: str, peer: str, rf: int, conns: int) -> float:
        return statistics.median(paired(system, peer, rf, conns))

    def ratio_shown(system: str, peer: str, rf: int, conns: int) -> str:
        rounds = paired(system, peer, rf, conns)
        return f"{statistics.median(rounds):.2f} ({min(rounds):.2f}-{max(rounds):.2f})"

    def spread(system: str, rf: int, conns: int) -> str:
        runs = [r["ops_per_s"] for r in results[(system, rf, conns)]]
        p50 = statistics.median(r["p50_us"] for r in results[(system, rf, conns)])
        return f"{med(system, rf, conns):,.0f} ({min(runs):,.0f}-{max(runs):,.0f}), p50 {p50 / 1000:.2f} ms"

    headers = ["replicas", "spindle, Raft log fsynced", "spindle, in memory", "redis: WAIT rf-1, or sharded",
               "in memory / redis, per round: median (min-max)", "fsynced / redis, per round", "goal", "met"]
    rows, claims = [], []
    for conns in CONNECTIONS:
        goal = conns == CONNECTIONS[0]  # judged at the seed's load
        for rf in RFS:
            mem, disk, red = (med(system, rf, conns) for system in ("spindle-never", "spindle-always", "redis"))
            mem_ratio = ratio("spindle-never", "redis", rf, conns)
            met = mem_ratio >= GOAL_THROUGHPUT
            rows.append([f"rf = {rf}, {conns} connections", *(spread(system, rf, conns) for system in
                         ("spindle-always", "spindle-never", "redis")),
                         ratio_shown("spindle-never", "redis", rf, conns),
                         ratio_shown("spindle-always", "redis", rf, conns),
                         f"≥ {GOAL_THROUGHPUT}" if goal else "-", ("yes" if met else "**no**") if goal else "-"])
            claims.append(Claim(f"replicated increments, rf = {rf}, in memory, {conns} connections",
                                f"{mem:,.0f} ops/s", f"Redis WAIT {rf - 1}: {red:,.0f} ops/s", mem_ratio,
                                f"≥ {GOAL_THROUGHPUT}" if goal else "-", met if goal else None))
            if goal:
                claims.append(Claim(f"replicated increments, rf = {rf}, Raft log fsynced, {conns} connections",
                                    f"{disk:,.0f} ops/s", f"Redis WAIT {rf - 1}: {red:,.0f} ops/s",
                                    ratio("spindle-always", "redis", rf, conns),
                                    "-", None))
            if ("redis-sharded", rf, conns) in results:
                sharded = med("redis-sharded", rf, conns)
                rows.append([f"rf = {rf}, {conns} connections, Redis sharded over {NODES} masters",
                             *(spread(system, rf, conns) for system in
                               ("spindle-always", "spindle-never", "redis-sharded")),
                             ratio_shown("spindle-never", "redis-sharded", rf, conns),
                             ratio_shown("spindle-always", "redis-sharded", rf, conns), "-", "-"])
                claims.append(Claim(f"replicated increments, rf = {rf}, in memory, {conns} connections, vs Redis "
                                    f"sharded over {NODES} masters (the seed's rf = 1)", f"{mem:,.0f} ops/s",
                                    f"Redis, {NODES} masters: {sharded:,.0f} ops/s",
                                    ratio("spindle-never", "redis-sharded", rf, conns), "-", None))
    print_table(headers, rows)
    # The timeline shown is the median run (by its lowest second); the goals are judged on
    # the medians over the runs, each run's figures beside them.
    avail = sorted(timelines, key=lambda r: r["worst_second"])[len(timelines) // 2]

    def over_runs(name: str) -> float:
        return statistics.median(r[name] for r in timelines)

    def shown(value: float, fmt: str) -> str:
        return "not within the run" if value == float("inf") else fmt.format(value)

    def recovery(value: float) -> str:
        # The timeline counts in steps of BUCKET: 0 is no dip at the join at all.
        return f"< {BUCKET:g} s" if value == 0 else shown(value, "{:.1f} s")

    def each(name: str, show: Callable[[float], str]) -> str:
        return "" if len(timelines) == 1 else " (runs: " + ", ".join(show(r[name]) for r in timelines) + ")"

    worst_second, dip_s, recovered_s = over_runs("worst_second"), over_runs("dip_s"), over_runs("recovered_s")
    dip_ok = worst_second >= 1 - GOAL_DIP and dip_s < GOAL_DIP_SECONDS
    rec_ok = recovered_s <= GOAL_RECOVERY_SECONDS
    avail_headers = ["measure", "value", "goal", "met"]
    avail_rows = [
        ["reads/s before the crash (median per 100 ms)", f"{avail['before']:,.0f}", "", ""],
        ["lowest 100 ms after the crash", f"{avail['worst'] * 100:.0f}% of before", "", ""],
        ["lowest 1 s window after the crash", f"{worst_second * 100:.0f}% of before"
         + each("worst_second", "{:.0%}".format),
         f"≥ {(1 - GOAL_DIP) * 100:.0f}%", "yes" if worst_second >= 1 - GOAL_DIP else "**no**"],
        ["time below 70% of before after the crash (summed until the join)", f"{dip_s:.1f} s" + each("dip_s", "{:.1f} s".format),
         f"< {GOAL_DIP_SECONDS:g} s", "yes" if dip_s < GOAL_DIP_SECONDS else "**no**"],
        ["reads/s on 2 nodes (median, 3 s after the crash)", f"{avail['after_crash']:,.0f}", "", ""],
        ["from the join to a second at 90% of before", recovery(recovered_s) + each("recovered_s", recovery),
         f"≤ {GOAL_RECOVERY_SECONDS:g} s", "yes" if rec_ok else "**no**"],
        ["dips below 70% after the join (count, total time)",
         f"{avail['join_dips']}, {avail['join_dip_s']:.1f} s", "", ""],
        ["reads in the run", f"{avail['reads']:,}", "", ""],
    ]
    print_table(avail_headers, avail_rows)
    moved_rows = rereplication_rows(moved)
    print_table(["measure", "value"], moved_rows)
    claims.append(Claim("availability: a node crash (lowest 1 s; time below 70%)",
                        f"{worst_second * 100:.0f}%; {dip_s:.1f} s", "seed: -30%",
                        worst_second / (1 - GOAL_DIP), f"≥ 70%, < {GOAL_DIP_SECONDS:g} s", dip_ok))
    claims.append(Claim("availability: recovery after a node join", recovery(recovered_s),
                        "seed: 20 s", 20.0 / max(recovered_s, BUCKET), f"≤ {GOAL_RECOVERY_SECONDS:g} s",
                        rec_ok))
    ratios = {conns: [ratio("spindle-never", "redis", rf, conns) for rf in RFS] for conns in CONNECTIONS}
    if args.no_docs:
        return
    # rf = 1 replicates nothing: what it costs is a call's path through the nodes.
    rf1 = ratios[CONNECTIONS[0]][RFS.index(1)]
    one_node, three_nodes = med("spindle-one-node", 1, CONNECTIONS[0]), med("spindle-never", 1, CONNECTIONS[0])
    nodes_compared = (f"the same shards on a 1-node cluster: {one_node:,.0f} calls/s against "
                      f"{three_nodes:,.0f} on three nodes, medians")
    path = "a call's path through a node (a task hop, a log write, a frame per reply) costs more than Redis's"
    if rf1 >= GOAL_THROUGHPUT:
        rf1_reading = f"rf = 1, which replicates nothing, reaches {rf1:.2f}x Redis `WAIT 0` ({nodes_compared})."
    elif one_node > three_nodes:
        rf1_reading = (f"Even rf = 1, which replicates nothing, stays below Redis `WAIT 0`: its shards' leaders "
                       "are spread over three processes, each woken for a third of the calls, where Redis's "
                       f"master serves them all ({nodes_compared}), and {path}.")
    else:
        rf1_reading = f"Even rf = 1, which replicates nothing, stays below Redis `WAIT 0`: {path} ({nodes_compared})."
    sharded = med("redis-sharded", 1, CONNECTIONS[0])
    one_master = med("redis", 1, CONNECTIONS[0])
    rf1_reading += (" The seed's rf = 1 sharded Redis over the same machines as CRUCIAL, without replicas, and "
                    "found it \"50% faster for simple operations\" (CRUCIAL at about 0.67x), each process on a "
                    f"machine of its own. Set up that way here ({NODES} Redis masters, the load generator sending "
                    "each key to its master), the masters share the 2 cores with the nodes and the load "
                    f"generator, as Spindle's nodes do: Redis serves {sharded:,.0f} calls/s (one master: "
                    f"{one_master:,.0f}), medians, and Spindle's rf = 1 reaches "
                    f"{ratio('spindle-never', 'redis-sharded', 1, CONNECTIONS[0]):.2f}x (the median of the rounds' "
                    "ratios; their spread is in the table).")
    plot_throughput(results, IMG / "cluster-throughput.png")
    plot_availability(avail, IMG / "cluster-availability.png")
    lines = [
        "## Cluster mode: replication vs Redis WAIT (seed Figure 3) and availability (seed Figure 8) "
        "(`bench/cluster.py`)",
        "",
        f"Machine: {machine()}. {redis_version()}. Spindle release build, {NODES} nodes on loopback, "
        f"{SHARDS} shards, replicas placed by rendezvous hashing; every process (nodes, Redis, load "
        "generator) shares the machine's cores, and the nodes share them out (`--threads "
        f"{threads_per_node(NODES)} --shared-cores` each, as `spindle cluster local` does: "
        "more threads than cores would only switch among themselves, and a node's thread that runs "
        "out of calls after a busy spell lets the other processes run before it sleeps).",
        "",
        f"**Throughput.** The Rust load generator, {CONNECTIONS[0]} connections (the seed's "
        f"{CONNECTIONS[0]} cloud threads), then {CONNECTIONS[1]} (a lighter load), with one increment in "
        f"flight each, on {KEYS} persistent counters chosen uniformly at random, {seconds:g} s per run "
        f"after 1 s of warm-up, {rounds} round(s); median ops/s (min-max) and p50 latency. Spindle in "
        "memory and Redis run side by side in each round, a round's runs in reverse order every "
        "other round, and a ratio is the median of the rounds' own ratios (the machine's speed "
        "drifts between rounds, and moves both), so it need not equal the quotient of the medians "
        "shown. Spindle's "
        "client sends each call to its shard's leader; a reply waits until its Raft entry is committed "
        "on a majority of the shard's rf replicas (and, with the log fsynced, written to disk on each "
        "of them). Redis: one master and two replicas, no persistence, `INCRBY` then `WAIT rf-1 1000` "
        "on the same connection (the seed's baseline); at rf = 1 also, as the seed's rf = 1 ran it, "
        f"sharded over {NODES} independent masters without replicas (a row without a goal). The goal "
        "compares like with like at the seed's "
        f"load: replication in memory on both sides (`--fsync never`), {CONNECTIONS[0]} connections, at "
        "least 1x Redis at every rf.",
        "",
        *table(headers, rows),
        "",
        "![cluster throughput](img/cluster-throughput.png)",
        "",
        "**Reading the throughput.** A Spindle call is applied by its connection's task, which "
        "hands its op-log records to the shard's Raft task (a hop between tasks). That task first lets "
        "the connection tasks ready to run go (one yield), so that the calls behind it join it, turns "
        "the calls it finds waiting into one Raft entry, appends it to the log file (one `write` "
        "per entry, and an fsync when the log is fsynced), sends it to the followers over the peer "
        "links (each link writes everything queued for its peer, all shards' messages, at once) "
        "and, once a majority has it, releases the replies through the connections' writers. "
        "Followers decode each call's record straight from the entry and apply it through the "
        "same `apply`. Redis applies the command at once and streams it to its replicas; `WAIT` "
        "only waits for their acknowledgement. On this 2-core machine the three nodes and the load "
        "generator share the cores, so throughput is CPU time per call. A node's thread that runs "
        "out of calls after a busy spell lets the other processes run before it sleeps "
        "(`--shared-cores`), so it wakes to a batch: fewer sleeps and wakeups, and more calls per "
        "Raft entry. The figures swing "
        "between runs (Redis's own too: its min-max): in memory Spindle reaches "
        f"{min(ratios[CONNECTIONS[0]]):.2f}-{max(ratios[CONNECTIONS[0]]):.2f}x "
        f"Redis `WAIT` at {CONNECTIONS[0]} connections and "
        f"{min(ratios[CONNECTIONS[1]]):.2f}-{max(ratios[CONNECTIONS[1]]):.2f}x at {CONNECTIONS[1]}; the "
        f"goal (1x at every rf, at {CONNECTIONS[0]} connections) is "
        f"{'met' if min(ratios[CONNECTIONS[0]]) >= GOAL_THROUGHPUT else 'missed'}. {rf1_reading} "
        + ("Shortening a call's path further (proposing from the connection task instead of a hop to "
           "the shard's Raft task, one log write per node rather than per shard, as TiKV's multi-Raft "
           "batching does) is what remains, rather than a different algorithm. "
           if min(ratios[CONNECTIONS[0]]) < GOAL_THROUGHPUT else "")
        + "With the Raft log "
        "fsynced (what makes a Spindle write survive a power loss of a majority, which Redis "
        "`WAIT` does not), the fsync of each replica's log dominates.",
        "",
        f"**Availability** ({len(timelines)} run(s); the timeline and the rows without a goal are the "
        f"median run's). {duration:g} s of reads by 100 client threads (4 processes, the Python SDK) "
        "of 32 persistent 4 KB blobs on a 3-node cluster (rf = 3, Raft log fsynced; a read commits an "
        f"empty entry, so it is linearizable). At {kill_at:g} s the node leading the most shards is "
        f"killed (`SIGKILL`); at {join_at:g} s a fourth node joins and takes the replicas its placement "
        "gives it. The seed's CRUCIAL lost 30% of its throughput on a crash and took 20 s to recover "
        "after a join. Both are judged over seconds, as the seed plots them: the lowest second "
        "after the crash, and the first second after the join that reads 90% of before (100 ms "
        "points scatter too much to ask each of ten in a row to).",
        "",
        *table(avail_headers, avail_rows),
        "",
        "![cluster availability](img/cluster-availability.png)",
        "",
        f"**Re-replication.** The same reads on a 4-node cluster (rf = 3, `--dead-after {DEAD_AFTER:g}`): "
        "the node leading the most shards is killed; the metadata group's leader declares it dead once "
        "it has not heard it for `--dead-after`, and each shard's leader then replaces its replica on "
        "a live node (one shard at a time per leader: a learner catches up, is promoted, and the dead "
        "voter is removed).",
        "",
        *table(["measure", "value"], moved_rows),
        "",
        "**Reading the timeline.** When a node dies, the shards it led have no leader until "
        "their followers elect one. A follower whose link to its leader finds the leader's port "
        "closed (a crashed process) stops waiting out the leader's lease, and the first surviving "
        "voter in the shard's placement order stands at once: the new leader is elected within "
        "milliseconds of the crash, not after a randomized election timeout (0.5-1 s). A "
        "survivor that has not yet found the leader down refuses its pre-vote, so the candidate "
        "stands again every 100 ms until a leader is heard of; if its log is behind, the next "
        "survivor in placement order stands instead. A paused or cut-off leader still takes the "
        "whole timeout. Every "
        "client reads every shard, so what remains of the dip is the clients finding the new "
        "leaders; throughput then returns (higher than before when two nodes share the 2 cores "
        "instead of three). A join costs no stall: the new node catches up as a learner, and "
        "leadership moves to it only once it is up to date, the old leader handing over before "
        "it stops serving.",
        "",
    ]
    update_section("cluster", "\n".join(lines))
    summarize("cluster", claims)


if __name__ == "__main__":
    main()
