"""Synchronization, Spindle beside Redis and ZooKeeper: the seed's Figure 6c and 6a.

Starts ``spindle server``, ``redis-server`` and a standalone ZooKeeper (the Debian
``zookeeper`` package's jar, run with ``java`` in the foreground) on free loopback ports, and
stops them at the end, then measures:

* **Barriers (Figure 6c)**: the average time to cross one barrier, over back-to-back
  barriers, for N parties, each a separate OS process (started and connected before the
  clock starts; a first, untimed barrier is the common start). Contenders: Spindle's
  ``spindle.Barrier(N).wait()``; the seed's non-resilient Redis barrier on ``BLPOP``
  (``INCR`` a generation's count, the last arriver ``RPUSH``-es N-1 release tokens, the others
  ``BLPOP`` one); and ZooKeeper's double barrier (kazoo's ``DoubleBarrier``, ``enter()`` then
  ``leave()`` per crossing, a fresh path per generation).
* **End of a map phase (Figure 6a)**: a Monte Carlo estimation of pi by N functions on
  Spindle's function pool, synchronized three ways: each function ``SET``-s its count in
  Redis and the driver polls ``MGET`` every 10 ms (PyWren's way, with Redis for S3); one
  ``spindle.Future`` per function; and auto-reduce (every function adds its count to one
  ``spindle.Counter`` and counts down a ``spindle.CountDownLatch``, the driver waits on the
  latch and reads the sum once). The sync time runs from the moment the last function
  finished computing to the moment the driver has the reduced result.

Prints the tables, writes the ``sync`` section of ``docs/benchmarks.md`` with plots under
``docs/img/``, and records its claims in the summary. Usage:
``python bench/sync.py [--no-docs]`` (``QUICK=1``: fewer parties, barriers and runs, report
under ``target/bench-quick/``). Needs ``redis-server``, the ``zookeeper`` package and kazoo:
``make bench`` installs them.
"""

from __future__ import annotations

import argparse
import faulthandler
import importlib.util
import multiprocessing as mp
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
import uuid
from pathlib import Path

from objects import free_port, redis_cmd, stop_process, wait_for_port
from report import (IMG, QUICK, Claim, log, machine, package_version, print_table, redis_version,
                    summarize, table, update_section)

import spindle
from spindle.embedded import find_binary, worker_environment

ZK_JAR = Path("/usr/share/java/zookeeper.jar")  # the Debian package's; its manifest names its deps
ZK_MAIN = "org.apache.zookeeper.server.quorum.QuorumPeerMain"

PARTIES = [2, 8] if QUICK else [2, 4, 8, 16, 32, 64]
BARRIERS = 50 if QUICK else 1000           # back-to-back barriers per run (Spindle, Redis)
REPS = 1 if QUICK else 3                   # runs per (system, parties): median, min-max
ZK_BUDGET = 160 if QUICK else 640          # ZooKeeper: barriers x parties per run, at most
ZK_MIN = 15
RUN_DEADLINE = 60.0 if QUICK else 180.0                     # seconds a barrier run may take before we give up

MAP_FUNCTIONS = 4 if QUICK else 8          # functions of the map phase
MAP_POINTS = 2_000_000                     # darts per function
MAP_REPS = 3 if QUICK else 15              # runs per technique, alternating
POLL_S = 0.010                             # the driver's polling interval on Redis

SYSTEMS = ["spindle", "redis", "zookeeper"]
LABELS = {"spindle": "Spindle Barrier", "redis": "Redis BLPOP barrier",
          "zookeeper": "ZooKeeper double barrier (kazoo)"}


def barriers_for(system: str, parties: int) -> int:
    """Barriers per run: all of them, except ZooKeeper's, capped at ZK_BUDGET / parties."""
    if system != "zookeeper":
        return BARRIERS
    return min(BARRIERS, max(ZK_MIN, ZK_BUDGET // parties))


def require_peers() -> None:
    if importlib.util.find_spec("kazoo") is None:
        sys.exit("error: kazoo is not installed; `make bench` installs it (from requirements-bench.lock)")
    if not ZK_JAR.exists() or not shutil.which("java"):
        sys.exit(f"error: ZooKeeper ({ZK_JAR}) or java not found; `make bench` installs them "
                 "(apt-get install zookeeper)")
    redis_cmd(0)  # exits with its own message when redis-server is missing


# --- ZooKeeper ------------------------------------------------------------------------------

def four_letter(port: int, word: str) -> str:
    with socket.create_connection(("127.0.0.1", port), timeout=2) as s:
        s.sendall(word.encode())
        chunks = []
        while True:
            chunk = s.recv(4096)
            if not chunk:
                return b"".join(chunks).decode(errors="replace")
            chunks.append(chunk)


class ZooKeeper:
    """A standalone ZooKeeper server in the foreground, its data in a temporary directory."""

    def __init__(self) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="spindle-bench-zk-"))
        self.port = free_port()
        (self.dir / "data").mkdir()
        cfg = self.dir / "zoo.cfg"
        cfg.write_text("\n".join([
            "tickTime=2000",
            f"dataDir={self.dir / 'data'}",
            f"clientPort={self.port}",
            "clientPortAddress=127.0.0.1",
            "admin.enableServer=false",
            "maxClientCnxns=0",  # the default (60 per address) would refuse 64 local parties
            "4lw.commands.whitelist=ruok,srvr",
            "",
        ]))
        self.log = open(self.dir / "zookeeper.log", "wb")
        self.proc = subprocess.Popen(["java", "-cp", str(ZK_JAR), ZK_MAIN, str(cfg)],
                                     stdout=self.log, stderr=subprocess.STDOUT)
        try:
            self._wait_ok()
        except BaseException:
            self.stop()
            raise
        self.version = next(line.split(":", 1)[1].strip().split("-")[0].split(",")[0]
                            for line in self.srvr.splitlines() if line.startswith("Zookeeper version"))

    def _wait_ok(self, deadline_s: float = 60.0) -> None:
        """Until it answers ``ruok`` and then ``srvr`` with its version (then it serves)."""
        start = time.monotonic()
        while time.monotonic() - start < deadline_s:
            if self.proc.poll() is not None:
                tail = (self.dir / "zookeeper.log").read_text(errors="replace")[-2000:]
                raise RuntimeError(f"ZooKeeper exited with status {self.proc.returncode}: {tail}")
            try:
                if four_letter(self.port, "ruok") == "imok":
                    self.srvr = four_letter(self.port, "srvr")
                    if "Zookeeper version" in self.srvr:
                        return
            except OSError:
                pass
            time.sleep(0.1)
        raise RuntimeError(f"ZooKeeper on port {self.port} did not start serving in {deadline_s:.0f} s")

    def stop(self) -> None:
        stop_process(self.proc)
        self.log.close()
        shutil.rmtree(self.dir, ignore_errors=True)


def double_barrier_class():
    """kazoo's DoubleBarrier, its enter made to follow the ZooKeeper recipe (ZOOKEEPER-1011).

    The recipe sets the watch on ``ready`` *before* creating the party's node; kazoo's
    ``enter`` creates the node first and then calls ``exists(ready, watch)``, ignoring its
    answer. A party delayed between the two (easily, with more processes than cores) misses
    ``ready`` altogether: its node completed the count, the last arriver created ``ready``,
    the first to leave deleted it again, so the party counts fewer than N nodes and waits
    forever for a ``ready`` that never comes back (this hung runs of 8 parties here). This
    version sets the watch first and returns at once when ``ready`` already exists; nothing
    else changes.
    """
    from kazoo.exceptions import NodeExistsError
    from kazoo.protocol.states import EventType
    from kazoo.recipe.barrier import DoubleBarrier

    class FixedDoubleBarrier(DoubleBarrier):
        def _inner_enter(self):
            if not self.assured_path:
                self.client.ensure_path(self.path)
                self.assured_path = True
            ready = self.client.handler.event_object()

            def created(event):
                if event.type == EventType.CREATED:
                    ready.set()

            exists = self.client.exists(self.path + "/ready", watch=created)  # before our node
            try:
                self.client.create(self.create_path, self._identifier.encode("utf-8"), ephemeral=True)
            except NodeExistsError:
                pass
            if exists:
                return True
            if len(self.client.get_children(self.path)) < self.num_clients:
                ready.wait()
            else:
                self.client.ensure_path(self.path + "/ready")
            return True

    return FixedDoubleBarrier


# --- barrier parties: long-lived processes, one connection to each system --------------------

def _crossing(system: str, clients: dict, parties: int, tag: str):
    """A function crossing barrier number g of the run ``tag``."""
    if system == "spindle":
        barrier = spindle.Barrier(parties, name=f"bench-sync-{tag}")
        return lambda g: barrier.wait()
    if system == "redis":
        r = clients["redis"]

        def cross(g: int) -> None:
            count, release = f"bsync:{tag}:{g}:n", f"bsync:{tag}:{g}:go"
            if r.incr(count) == parties:  # the last to arrive releases the others
                pipe = r.pipeline(transaction=False)
                pipe.delete(count)
                if parties > 1:
                    pipe.rpush(release, *[1] * (parties - 1))
                pipe.execute()
            else:
                r.blpop([release], 0)  # the list is gone once every token is taken
        return cross
    zk, barrier_class = clients["zookeeper"], clients["zookeeper-barrier"]

    def cross_zk(g: int) -> None:
        barrier = barrier_class(zk, f"/bench-sync/{tag}/{g}", parties)
        barrier.enter()
        barrier.leave()
    return cross_zk


def party(index: int, conn, spindle_address: str, redis_port: int, zk_port: int, stacks: str) -> None:
    """One barrier party: connects to all three systems, then runs the barrier runs it is sent."""
    import redis
    from kazoo.client import KazooClient

    stack_file = open(stacks, "w")
    faulthandler.register(signal.SIGUSR1, file=stack_file)  # the driver asks for it if a run hangs
    clients: dict = {}
    try:
        spindle.connect(spindle_address, embedded=False)
        clients["redis"] = redis.Redis(host="127.0.0.1", port=redis_port)
        clients["redis"].ping()
        zk = KazooClient(hosts=f"127.0.0.1:{zk_port}")
        zk.start(timeout=60)
        clients["zookeeper"], clients["zookeeper-barrier"] = zk, double_barrier_class()
        conn.send(("ready", index))
        while True:
            msg = conn.recv()
            if msg is None:
                break
            system, parties, count, tag = msg
            try:
                cross = _crossing(system, clients, parties, tag)
                cross(0)  # the common start, untimed
                t0 = time.perf_counter()
                for g in range(1, count + 1):
                    cross(g)
                conn.send(("ok", (time.perf_counter() - t0) / count))
            except Exception:
                conn.send(("error", traceback.format_exc()))
    except Exception:
        conn.send(("error", traceback.format_exc()))
    finally:
        if "zookeeper" in clients:
            clients["zookeeper"].stop()
            clients["zookeeper"].close()


class Parties:
    """``n`` party processes (forkserver: the SDKs are imported once, then forked)."""

    def __init__(self, n: int, spindle_address: str, redis_port: int, zk_port: int) -> None:
        ctx = mp.get_context("forkserver")
        ctx.set_forkserver_preload(["spindle", "redis", "kazoo.client", "kazoo.recipe.barrier"])
        self.conns, self.procs = [], []
        self.stacks = Path(tempfile.mkdtemp(prefix="spindle-bench-sync-"))
        self.runs = 0
        try:
            for i in range(n):
                mine, theirs = ctx.Pipe()
                proc = ctx.Process(target=party, args=(i, theirs, spindle_address, redis_port, zk_port,
                                                       str(self.stacks / f"party-{i}.txt")),
                                   daemon=True)
                proc.start()
                theirs.close()
                self.conns.append(mine)
                self.procs.append(proc)
            for i in range(n):
                self._recv(i, 120.0, "ready")
        except BaseException:
            self.stop()
            raise

    def _recv(self, i: int, timeout: float, expect: str):
        if not self.conns[i].poll(timeout):
            raise RuntimeError(f"barrier party {i} did not answer within {timeout:.0f} s")
        kind, value = self.conns[i].recv()
        if kind != expect:
            raise RuntimeError(f"barrier party {i} failed:\n{value}")
        return value

    def run(self, system: str, parties: int, count: int) -> float:
        """One run: the mean over the parties of their time per barrier, in seconds."""
        self.runs += 1
        tag = f"{system}-{parties}-{self.runs}-{uuid.uuid4().hex[:6]}"
        for i in range(parties):
            self.conns[i].send((system, parties, count, tag))
        deadline = time.monotonic() + RUN_DEADLINE
        times = []
        for i in range(parties):
            try:
                times.append(self._recv(i, max(0.1, deadline - time.monotonic()), "ok"))
            except RuntimeError as exc:
                self.dump_stacks(range(i, parties))
                raise RuntimeError(f"{LABELS[system]}, {parties} parties, {count} barriers: {exc}") from None
        if system == "spindle":
            spindle.delete(f"bench-sync-{tag}")
        return statistics.fmean(times)

    def dump_stacks(self, indexes) -> None:
        """Log where the parties that did not answer are waiting (their main thread)."""
        for j in indexes:
            os.kill(self.procs[j].pid, signal.SIGUSR1)
        time.sleep(1)
        for j in indexes:
            text = (self.stacks / f"party-{j}.txt").read_text(errors="replace")
            main = text[text.rfind("Current thread"):] if "Current thread" in text else text
            frames = [line.strip() for line in main.splitlines()[1:] if "multiprocessing" not in line]
            log(f"party {j} waits in: " + " <- ".join(frames[:6]))

    def stop(self) -> None:
        for conn in self.conns:
            try:
                conn.send(None)
            except OSError:
                pass
        deadline = time.monotonic() + 10  # then kill those still waiting (after a failed run)
        for proc in self.procs:
            proc.join(max(0.0, deadline - time.monotonic()))
        for proc in self.procs:
            if proc.is_alive():
                proc.kill()
                proc.join()
        shutil.rmtree(self.stacks, ignore_errors=True)


def barrier_experiment(spindle_address: str, redis_port: int, zk_port: int) -> dict:
    """{(system, parties): [seconds per barrier of each repetition]}."""
    log(f"starting {max(PARTIES)} barrier parties (processes)...")
    pool = Parties(max(PARTIES), spindle_address, redis_port, zk_port)
    results: dict = {}
    try:
        for system in SYSTEMS:  # warm-up: connections, the JVM's JIT
            pool.run(system, 2, 20)
        for parties in PARTIES:
            for rep in range(REPS):
                for system in SYSTEMS:
                    count = barriers_for(system, parties)
                    t0 = time.perf_counter()
                    per = pool.run(system, parties, count)
                    log(f"barriers: {parties:>2} parties, {system:<9} run {rep + 1}/{REPS}: "
                        f"{per * 1e3:8.3f} ms per barrier ({count} barriers, {time.perf_counter() - t0:.1f} s)")
                    results.setdefault((system, parties), []).append(per)
    finally:
        pool.stop()
    return results


# --- the map phase ----------------------------------------------------------------------------

def count_hits(points: int, seed: int) -> int:
    import numpy as np

    rng = np.random.default_rng(seed)
    hits = 0
    for start in range(0, points, 1_000_000):
        n = min(1_000_000, points - start)
        x, y = rng.random(n), rng.random(n)
        hits += int(np.count_nonzero(x * x + y * y <= 1.0))
    return hits


def map_redis(points: int, seed: int, redis_port: int, key: str) -> float:
    import redis

    r = redis.Redis(host="127.0.0.1", port=redis_port)
    r.ping()  # connected before the work, as the others are
    hits = count_hits(points, seed)
    done = time.time()
    r.set(key, hits)
    return done


def map_future(points: int, seed: int, future) -> float:
    hits = count_hits(points, seed)
    done = time.time()
    future.set_result(hits)
    return done


def map_reduce(points: int, seed: int, total, latch) -> float:
    hits = count_hits(points, seed)
    done = time.time()
    total.add(hits)
    latch.count_down()
    return done


TECHNIQUES = ["redis polling", "spindle futures", "spindle auto-reduce"]


def map_run(technique: str, redis_port: int, run: int) -> tuple[float, float, int]:
    """One map phase: (total seconds, sync seconds, darts inside the circle)."""
    import redis

    n, seeds = MAP_FUNCTIONS, [1000 + i for i in range(MAP_FUNCTIONS)]
    r = redis.Redis(host="127.0.0.1", port=redis_port)
    r.ping()
    start = time.time()
    if technique == "redis polling":
        keys = [f"bench-pi:{run}:{i}" for i in range(n)]
        threads = [spindle.Thread(target=map_redis, args=(MAP_POINTS, seeds[i], redis_port, keys[i]), echo=False)
                   for i in range(n)]
        for t in threads:
            t.start()
        while True:
            values = r.mget(keys)
            if all(v is not None for v in values):
                break
            time.sleep(POLL_S)
        hits = sum(int(v) for v in values)
        have = time.time()
        r.delete(*keys)
    elif technique == "spindle futures":
        futures = [spindle.Future() for _ in range(n)]
        threads = [spindle.Thread(target=map_future, args=(MAP_POINTS, seeds[i], futures[i]), echo=False)
                   for i in range(n)]
        for t in threads:
            t.start()
        hits = sum(f.result() for f in futures)
        have = time.time()
    else:
        total, latch = spindle.Counter(), spindle.CountDownLatch(n)
        threads = [spindle.Thread(target=map_reduce, args=(MAP_POINTS, seeds[i], total, latch), echo=False)
                   for i in range(n)]
        for t in threads:
            t.start()
        latch.wait()
        hits = total.get()
        have = time.time()
    for t in threads:  # after the clock: each function's compute-end timestamp
        t.join()
    last_done = max(t.result for t in threads)
    return have - start, have - last_done, hits


def map_experiment(redis_port: int) -> dict:
    """{technique: [(total s, sync s, hits), ...]}."""
    log(f"map phase: warming up the pool with {MAP_FUNCTIONS} functions, one run per technique...")
    for technique in TECHNIQUES:
        map_run(technique, redis_port, -1)
    results: dict = {t: [] for t in TECHNIQUES}
    for rep in range(MAP_REPS):
        for technique in TECHNIQUES:
            total, sync, hits = map_run(technique, redis_port, rep)
            results[technique].append((total, sync, hits))
        log(f"map phase, run {rep + 1}/{MAP_REPS}: " + ", ".join(
            f"{t} sync {results[t][-1][1] * 1e3:.1f} ms" for t in TECHNIQUES))
    return results


# --- report -----------------------------------------------------------------------------------

def fmt_ms(seconds: float) -> str:
    return f"{seconds * 1e3:.3g} ms" if seconds < 0.01 else f"{seconds * 1e3:.1f} ms"


def plot_barriers(barriers: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.5, 4))
    for system in SYSTEMS:
        xs = [p for p in PARTIES if (system, p) in barriers]
        runs = [barriers[(system, p)] for p in xs]
        med = [statistics.median(r) * 1e3 for r in runs]
        lo = [m - min(r) * 1e3 for m, r in zip(med, runs)]
        hi = [max(r) * 1e3 - m for m, r in zip(med, runs)]
        ax.errorbar(xs, med, yerr=[lo, hi], marker="o", capsize=3, label=LABELS[system])
    ax.set_xscale("log", base=2)
    ax.set_xticks(PARTIES, [str(p) for p in PARTIES])
    ax.set_yscale("log")
    ax.set_xlabel("parties (processes)")
    ax.set_ylabel("time per barrier (ms, log scale)")
    ax.set_title(f"Crossing a barrier back to back ({os.cpu_count()} cores)")
    ax.grid(alpha=0.3, which="both")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_map(maps: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(9, 3.6))
    for ax, col, title in ((ax1, 1, "sync: last compute end to result"), (ax2, 0, "whole map phase")):
        data = [[run[col] * 1e3 for run in maps[t]] for t in TECHNIQUES]
        ax.boxplot(data, orientation="horizontal", showfliers=True)
        ax.set_yticks(range(1, len(TECHNIQUES) + 1), TECHNIQUES if ax is ax1 else [""] * len(TECHNIQUES))
        ax.set_xlabel("ms")
        ax.set_title(title)
        ax.grid(axis="x", alpha=0.3)
    fig.suptitle(f"Map phase of {MAP_FUNCTIONS} functions, {MAP_REPS} runs each")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--no-docs", action="store_true", help="print only; do not write docs/benchmarks.md")
    args = ap.parse_args()
    require_peers()

    began = time.monotonic()
    sport, rport = free_port(), free_port()
    servers: list = []
    try:
        log("starting spindle server, redis-server and ZooKeeper...")
        spindle_proc = subprocess.Popen(
            [find_binary(), "server", "--port", str(sport), "--python", sys.executable,
             "--max-workers", str(max(MAP_FUNCTIONS, max(PARTIES))), "--idle-timeout", "600"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=worker_environment())
        servers.append(spindle_proc)
        redis_proc = subprocess.Popen(redis_cmd(rport), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        servers.append(redis_proc)
        wait_for_port(sport, spindle_proc)
        wait_for_port(rport, redis_proc)
        zk = ZooKeeper()
        servers.append(zk)
        address = f"127.0.0.1:{sport}"
        spindle.connect(address, embedded=False)
        barriers = barrier_experiment(address, rport, zk.port)
        maps = map_experiment(rport)
    finally:
        spindle.disconnect()
        for server in reversed(servers):
            if isinstance(server, ZooKeeper):
                server.stop()
            else:
                stop_process(server)
    elapsed = time.monotonic() - began

    # Barriers.
    med = {k: statistics.median(v) for k, v in barriers.items()}
    barrier_headers = ["parties"] + [h for s in SYSTEMS for h in (f"{s} (ms)", "min–max")] + [
        "redis/spindle", "zookeeper/spindle", "ZK barriers"]
    barrier_rows = []
    for p in PARTIES:
        row: list = [p]
        for s in SYSTEMS:
            runs = barriers[(s, p)]
            row += [med[(s, p)] * 1e3, f"{min(runs) * 1e3:.3g}–{max(runs) * 1e3:.3g}"]
        row += [med[("redis", p)] / med[("spindle", p)], med[("zookeeper", p)] / med[("spindle", p)],
                barriers_for("zookeeper", p)]
        barrier_rows.append(row)
    print_table(barrier_headers, barrier_rows)

    # Map phase.
    pis = {t: {4.0 * run[2] / (MAP_FUNCTIONS * MAP_POINTS) for run in maps[t]} for t in TECHNIQUES}
    all_pis = set().union(*pis.values())
    if len(all_pis) != 1:
        raise RuntimeError(f"the techniques disagree on pi: {pis}")
    pi = all_pis.pop()
    sync_med = {t: statistics.median(r[1] for r in maps[t]) for t in TECHNIQUES}
    total_med = {t: statistics.median(r[0] for r in maps[t]) for t in TECHNIQUES}
    map_headers = ["technique", "sync, median (ms)", "min–max", "whole run, median (ms)", "min–max",
                   "sync share", "sync: redis polling / this"]
    map_rows = []
    for t in TECHNIQUES:
        syncs, totals = [r[1] for r in maps[t]], [r[0] for r in maps[t]]
        map_rows.append([t, sync_med[t] * 1e3, f"{min(syncs) * 1e3:.3g}–{max(syncs) * 1e3:.3g}",
                         total_med[t] * 1e3, f"{min(totals) * 1e3:.4g}–{max(totals) * 1e3:.4g}",
                         f"{sync_med[t] / total_med[t]:.0%}", sync_med["redis polling"] / sync_med[t]])
    print_table(map_headers, map_rows)
    log(f"pi ≈ {pi:.6f} by every technique; the whole benchmark took {elapsed:.0f} s")

    # The goal holds at every party count: each claim shows the party count where Spindle's lead
    # over the peer is smallest.
    span = f"{min(PARTIES)}-{max(PARTIES)}"
    claims = []
    for peer, label, goal in (("redis", "Redis BLPOP barrier", 1.0), ("zookeeper", "ZooKeeper double barrier", 2.0)):
        worst = min(PARTIES, key=lambda n: med[(peer, n)] / med[("spindle", n)])
        ratio = med[(peer, worst)] / med[("spindle", worst)]
        claims.append(Claim(f"barrier crossing vs {label}, {span} processes (the closest: {worst})",
                            fmt_ms(med[("spindle", worst)]), f"{fmt_ms(med[(peer, worst)])} ({label})", ratio,
                            f"≥ {goal} at every count",
                            all(med[(peer, n)] / med[("spindle", n)] >= goal for n in PARTIES)))
    auto = sync_med["redis polling"] / sync_med["spindle auto-reduce"]
    claims += [
        Claim(f"map-phase sync, {MAP_FUNCTIONS} functions, auto-reduce vs Redis polling",
              fmt_ms(sync_med["spindle auto-reduce"]), f"{fmt_ms(sync_med['redis polling'])} (Redis MGET polling)",
              auto, "-", None),
    ]
    if args.no_docs:
        return

    IMG.mkdir(parents=True, exist_ok=True)
    plot_barriers(barriers, IMG / "sync_barriers.png")
    plot_map(maps, IMG / "sync_map.png")
    summarize("sync", claims)
    update_section("sync", report_body(barriers, med, barrier_headers, barrier_rows, map_headers, map_rows,
                                       sync_med, pi, zk.version, elapsed))


def report_body(barriers, med, barrier_headers, barrier_rows, map_headers, map_rows, sync_med, pi,
                zk_version, elapsed) -> str:
    top = max(PARTIES)
    zk_counts = ", ".join(f"{barriers_for('zookeeper', p)} at {p}" for p in PARTIES)
    misses = []
    slower_redis = [p for p in PARTIES if med[("redis", p)] < med[("spindle", p)]]
    if slower_redis:
        misses.append(
            "**Goal missed, Spindle ≤ Redis**: Redis's BLPOP barrier was faster at "
            + ", ".join(f"{p} parties ({med[('spindle', p)] / med[('redis', p)]:.2f}× Spindle's time)"
                        for p in slower_redis)
            + ". Both are one server round trip per party and crossing (Redis's last arriver makes "
              "two commands, in one pipeline); on 2 cores the time is mostly the parties' Python "
              "and their wake-ups, so the gap is the client and server cost per call.")
    slow_zk = [p for p in PARTIES if med[("zookeeper", p)] < 2 * med[("spindle", p)]]
    if slow_zk:
        misses.append(
            "**Goal missed, Spindle ≤ 0.5× ZooKeeper**: at "
            + ", ".join(f"{p} parties (ZooKeeper/Spindle {med[('zookeeper', p)] / med[('spindle', p)]:.2f})"
                        for p in slow_zk) + ".")
    if not misses:
        misses.append(f"Both barrier goals are met at every party count (at {top} parties: Redis/Spindle "
                      f"{med[('redis', top)] / med[('spindle', top)]:.2f}, ZooKeeper/Spindle "
                      f"{med[('zookeeper', top)] / med[('spindle', top)]:.2f}).")
    return "\n".join([
        "## Synchronization vs Redis and ZooKeeper, seed Figure 6 (`bench/sync.py`)",
        "",
        f"Machine: {machine()}. Peers: {redis_version()}, no persistence; "
        f"ZooKeeper {zk_version} (Debian package) as **a single standalone server** (the seed used a "
        f"3-node ensemble), its defaults otherwise (transaction log fsynced, in a temporary directory) "
        f"except `maxClientCnxns=0` so that {top} local clients may connect, with kazoo "
        f"{package_version('kazoo')}; spindle {spindle.__version__} (release build). All servers on "
        f"loopback, started by the script. The whole run took {elapsed:.0f} s.",
        "",
        "### Barriers (Figure 6c)",
        "",
        f"Average time to cross one barrier, over back-to-back barriers: {BARRIERS} per run for Spindle and "
        f"Redis; for ZooKeeper {ZK_BUDGET} / parties (at least {ZK_MIN}, at most {BARRIERS}): {zk_counts} — "
        "ZooKeeper's figure is the same average per barrier, over fewer barriers. Each party is its own "
        "OS process, started and connected before the clock; every party times from the end of a first "
        "untimed barrier (the common start) to the end of its last barrier, divided by the barriers; a "
        f"run's figure is the mean over its parties, the table gives the median of {REPS} run{'s' if REPS > 1 else ''} (systems "
        "taking turns) and the min–max. Spindle: `spindle.Barrier(N).wait()`. Redis: the seed's "
        "non-resilient BLPOP barrier (per generation: `INCR` a count; the last arriver deletes it and "
        "`RPUSH`-es N-1 tokens, the others `BLPOP` one; one connection per process). ZooKeeper: kazoo's "
        "`DoubleBarrier`, `enter()` then `leave()` per crossing on a fresh path per generation, its "
        "`enter` made to set its watch on `ready` before creating its node, as the ZooKeeper recipe does "
        "(ZOOKEEPER-1011: kazoo creates the node first, and a party delayed in between can miss `ready` "
        "and wait forever); every crossing costs each party several writes (the "
        "generation's path, its own node, `ready`, their deletions), which ZooKeeper logs to disk "
        f"before it answers. With up to {top} processes on {os.cpu_count()} cores, "
        "every figure includes the time the parties wait for a core.",
        "",
        *table(barrier_headers, barrier_rows),
        "",
        *misses,
        "",
        "![sync_barriers](img/sync_barriers.png)",
        "",
        "### End of a map phase (Figure 6a)",
        "",
        f"Monte Carlo pi with {MAP_FUNCTIONS} functions on Spindle's function pool (`spindle.Thread`, warm "
        f"workers), {MAP_POINTS:,} darts each (NumPy, fixed seeds: every technique got pi ≈ {pi:.6f}), "
        f"{MAP_REPS} runs per technique, the techniques taking turns. *Sync* is the time from the moment "
        "the last function finished computing (its `time.time()`, returned with its result) to the moment "
        "the driver holds the reduced result; *whole run* is from before the launch to that moment. "
        f"Redis polling: each function `SET`s its count, the driver `MGET`s every key every "
        f"{POLL_S * 1e3:.0f} ms (PyWren's polling of S3, on Redis). Futures: one `spindle.Future` per "
        "function, the driver gets each. Auto-reduce: every function adds its count to one "
        "`spindle.Counter` and counts down a `spindle.CountDownLatch`; the driver waits on the latch and "
        "reads the sum once. The issue sets no goal here; the seed found auto-reduce twice as fast as "
        "polling S3.",
        "",
        *table(map_headers, map_rows),
        "",
        f"Auto-reduce synchronizes {sync_med['redis polling'] / sync_med['spindle auto-reduce']:.1f}× faster than "
        f"polling Redis, futures {sync_med['redis polling'] / sync_med['spindle futures']:.1f}× (polling waits "
        f"on average half its {POLL_S * 1e3:.0f} ms interval)."
        + (" Futures beat auto-reduce here: a function completes its future in one call, while "
           "auto-reduce takes two (the addition, then the latch), and the driver a third to read the sum."
           if sync_med["spindle futures"] < sync_med["spindle auto-reduce"] else ""),
        "",
        "![sync_map](img/sync_map.png)",
    ])


if __name__ == "__main__":
    main()
