"""Durability: what persistent objects cost, Spindle beside Redis with AOF, and recovery.

Starts ``spindle server`` (without ``--data-dir``, and with ``--data-dir`` under each
``--fsync`` policy) and ``redis-server`` (``appendonly yes``, ``appendfsync always`` and
``everysec``; no RDB snapshots) on free loopback ports, data directories in a temporary
directory, and measures from Python, the same way for both, in one run:

* **throughput** (persistent vs ephemeral, and vs Redis AOF): 16 client processes (one
  connection each) on 800 keys chosen uniformly at random (the seed's Figure 3), two
  workloads: counter increments (``Counter.add(1)`` / ``INCRBY``) and 1 KB writes
  (``Blob.set`` / ``SET``). Spindle ephemeral, then persistent with ``--fsync always``,
  ``interval=10ms``, ``interval=1s`` and ``never``; Redis AOF ``always`` and ``everysec``.
  Pairs for the ratios: ``always``/``always`` and ``interval=1s``/``everysec``.
* **YCSB** A (50% read, 50% update), B (95/5), C (100% read) and F (50% read, 50%
  read-modify-write): YCSB's scrambled zipfian key choice (constant 0.99, seeded), 1 KB
  records ``user<N>`` (Spindle: persistent ``Blob`` objects, read = ``get``, update = ``set``,
  RMW = ``get`` then ``set``; Redis: ``GET``/``SET``), loaded first by the 16 clients in
  parallel (load throughput reported), then each workload for a fixed time: ops/s, p50 and
  p99 latency, under both pairs of fsync policies.
* **recovery**: persistent counters created with ``--fsync never`` (to load fast), the server
  SIGKILLed (a crash), then restarted on the same data directory, several times: the time
  from spawn to its first reply (and the server's own ``recovered in N ms`` log line), the
  data directory's size and the resident memory after recovery; beside Redis restarting on
  its AOF (spawn to the first ``PING`` answered, not ``LOADING``).

Throughput figures are medians over rounds (min and max beside them); the configurations
take turns in each round, so the machine's slow spells hit all alike. Prints tables, writes
the ``durability`` section of ``docs/benchmarks.md`` and plots under ``docs/img/``.

Usage: ``python bench/durability.py [--only throughput|ycsb|recovery] [--no-docs]``
(``QUICK=1`` in the environment: tiny sizes, under a minute).
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import re
import shlex
import signal
import statistics
import subprocess
import tempfile
import threading
import time
from array import array
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np
from objects import free_port, redis_cmd
from report import IMG, QUICK, Claim, log, machine, percentile, print_table, redis_version, summarize, table, update_section

import spindle
from spindle.embedded import find_binary

# Extra flags for every Spindle server of the recovery measure (the one that loads the
# objects and every restart), e.g. ["--snapshot-after", "0"] to time a replay of the whole log
# instead of the default (a snapshot every 64 MiB of log, then the tail).
RECOVERY_FLAGS: list[str] = []

CLIENTS = 16
KEYS = 800  # the throughput workloads' keys (the seed's Figure 3)
VALUE_SIZE = 1024


@dataclass(frozen=True)
class Sizes:
    rounds: int  # throughput: rounds (medians over them)
    seconds: float  # throughput: each run
    records: int  # YCSB: records loaded
    ycsb_rounds: int
    ycsb_seconds: float  # YCSB: each run of a workload
    objects: int  # recovery: persistent counters
    restarts: int  # recovery: restarts (median over them)


# Full mode fits in about 6 minutes on 2 cores: throughput 7 configurations x 2 workloads x
# 3 rounds x 2 s; YCSB 2 loads of 1M records, then 4 workloads x 4 configurations x 2 rounds
# x 2 s; recovery 1M counters and 2 restarts of each server.
FULL_SIZES = Sizes(rounds=3, seconds=2.0, records=1_000_000, ycsb_rounds=2, ycsb_seconds=2.0,
                   objects=1_000_000, restarts=2)
QUICK_SIZES = Sizes(rounds=1, seconds=0.4, records=5_000, ycsb_rounds=1, ycsb_seconds=0.4,
                    objects=10_000, restarts=2)


# --- servers ------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Config:
    label: str
    system: str  # "spindle" or "redis"
    fsync: str | None = None  # spindle --fsync (None: no --data-dir) or redis appendfsync
    short: str = ""  # label in the plots


SPINDLE_EPHEMERAL = Config("Spindle, ephemeral", "spindle", None, "ephemeral")
SPINDLE_ALWAYS = Config("Spindle, --fsync always", "spindle", "always", "always")
SPINDLE_10MS = Config("Spindle, --fsync interval=10ms", "spindle", "interval=10ms", "10ms")
SPINDLE_1S = Config("Spindle, --fsync interval=1s", "spindle", "interval=1s", "1s")
SPINDLE_NEVER = Config("Spindle, --fsync never", "spindle", "never", "never")
REDIS_ALWAYS = Config("Redis, AOF appendfsync always", "redis", "always", "Redis always")
REDIS_EVERYSEC = Config("Redis, AOF appendfsync everysec", "redis", "everysec", "Redis everysec")

THROUGHPUT_CONFIGS = [SPINDLE_EPHEMERAL, SPINDLE_ALWAYS, SPINDLE_10MS, SPINDLE_1S, SPINDLE_NEVER,
                      REDIS_ALWAYS, REDIS_EVERYSEC]
YCSB_CONFIGS = [SPINDLE_ALWAYS, REDIS_ALWAYS, SPINDLE_1S, REDIS_EVERYSEC]
PAIRS = [(SPINDLE_ALWAYS, REDIS_ALWAYS, "fsync always"),
         (SPINDLE_1S, REDIS_EVERYSEC, "fsync every second")]


@dataclass
class Server:
    config: Config
    data_dir: Path | None
    extra: list[str] = field(default_factory=list)
    port: int = 0
    proc: subprocess.Popen | None = None
    stderr_path: Path | None = None

    def cmd(self) -> list[str]:
        if self.config.system == "spindle":
            cmd = [find_binary(), "server", "--port", str(self.port)]
            if self.config.fsync is not None:
                cmd += ["--data-dir", str(self.data_dir), "--fsync", self.config.fsync]
            return cmd + self.extra
        self.data_dir.mkdir(parents=True, exist_ok=True)
        return redis_cmd(self.port, self.data_dir) + ["--appendonly", "yes", "--appendfsync", self.config.fsync]

    def start(self) -> float:
        """Spawn the server; return the seconds from spawn to its first answered request
        (a TCP connection is not enough: Spindle listens before it recovers)."""
        self.port = free_port()
        self.stderr_path = Path(tempfile.mkstemp(prefix="stderr-", dir=TMP)[1])
        with open(self.stderr_path, "wb") as err:
            t0 = time.perf_counter()
            self.proc = subprocess.Popen(self.cmd(), stdout=err, stderr=err)
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.config.label} exited with status {self.proc.returncode}: "
                                   f"{self.stderr_path.read_text(errors='replace')[-2000:]}")
            if self.answers():
                elapsed = time.perf_counter() - t0
                break
            if time.perf_counter() - t0 > 600:
                raise RuntimeError(f"{self.config.label} did not start")
            time.sleep(0.001)
        if self.config.system == "redis":  # the AOF options took (they follow redis_cmd's)
            got = self.redis().config_get("append*")
            assert got["appendonly"] == "yes" and got["appendfsync"] == self.config.fsync, got
        return elapsed

    def answers(self) -> bool:
        if self.config.system == "spindle":
            try:
                spindle.connect(self.address, embedded=False)
                spindle.status()
                return True
            except (spindle.ServerUnavailable, OSError, ConnectionError):
                return False
            finally:
                spindle.disconnect()
        import redis

        try:
            return bool(self.redis().ping())
        except (redis.ConnectionError, redis.BusyLoadingError, OSError):
            return False

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def redis(self):
        import redis

        return redis.Redis(host="127.0.0.1", port=self.port, decode_responses=True)

    def rss_mib(self) -> float:
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
        return float("nan")

    def recovered_ms(self) -> float | None:
        """The recovery time the server logged, if it did: Spindle's ``recovered in N ms``,
        Redis' ``DB loaded from append only file: N seconds``."""
        text = self.stderr_path.read_text(errors="replace")
        match = (re.search(r"recovered in ([\d.]+) ?(ms|s)\b", text)
                 or re.search(r"DB loaded from append only file: ([\d.]+) (seconds)", text))
        if not match:
            return None
        return float(match.group(1)) * (1 if match.group(2) == "ms" else 1000)

    def kill(self) -> None:
        """SIGKILL: a crash."""
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.kill()


TMP: Path = Path(tempfile.gettempdir())


def dir_size(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def filesystem(path: Path) -> str:
    """The file system type holding ``path`` (fsync on tmpfs would be free)."""
    best, kind = "", "unknown"
    for line in Path("/proc/mounts").read_text().splitlines():
        _, mount, fstype, *_ = line.split()
        if str(path).startswith(mount) and len(mount) > len(best):
            best, kind = mount, fstype
    return kind


# --- client processes ---------------------------------------------------------------------------

def connect(system: str, port: int):
    """This process's connection: None for Spindle (the SDK's global client), else redis-py."""
    if system == "spindle":
        spindle.connect(f"127.0.0.1:{port}", embedded=False)
        return None
    import redis

    return redis.Redis(host="127.0.0.1", port=port)


def _client_main(prepare, args, barrier, out) -> None:
    try:
        run = prepare(*args)  # connected, keys chosen: then all start together
        barrier.wait()
        out.put(run())
    except BaseException as e:  # reported by the parent
        barrier.abort()
        out.put(e)
        raise


def run_clients(prepare, args_list: list[tuple], timeout: float) -> tuple[list, float]:
    """Fork one process per ``args``; each calls ``prepare(*args)`` (connect, set up) and,
    once all are ready, the callable it returned. Returns their results and the wall time
    from the common start to the last result."""
    spindle.disconnect()  # the children connect on their own; never share a socket
    ctx = mp.get_context("fork")
    out, barrier = ctx.Queue(), ctx.Barrier(len(args_list) + 1)
    procs = [ctx.Process(target=_client_main, args=(prepare, a, barrier, out), daemon=True)
             for a in args_list]
    for p in procs:
        p.start()
    try:
        barrier.wait(timeout=120)
    except threading.BrokenBarrierError:
        pass  # a client failed: its exception is in the queue
    t0 = time.perf_counter()
    results = [out.get(timeout=timeout) for _ in procs]
    wall = time.perf_counter() - t0
    for p in procs:
        p.join()
    for r in results:
        if isinstance(r, BaseException):
            raise RuntimeError(f"a client failed: {r!r}") from r
    return results, wall


def _load_client(system: str, port: int, kind: str, start: int, stop: int, persistent: bool):
    """Create records ``start..stop``: 1 KB ``Blob``/``SET`` (kind "user") or counters (kind "c")."""
    r = connect(system, port)
    value = os.urandom(VALUE_SIZE)

    def run():
        t0 = time.perf_counter()
        for i in range(start, stop):
            key = f"{kind}{i}"
            if system == "redis":
                r.set(key, value if kind == "user" else i % 1000)
            elif kind == "user":
                spindle.Blob(value, name=key, persistent=persistent)
            else:
                spindle.Counter(i % 1000, name=key, persistent=persistent)
        return stop - start, time.perf_counter() - t0

    return run


def load(server: Server, kind: str, count: int, clients: int) -> float:
    """Create ``count`` records with ``clients`` processes; returns records per second."""
    persistent = server.config.fsync is not None
    bounds = [count * i // clients for i in range(clients + 1)]
    _, wall = run_clients(_load_client, [(server.config.system, server.port, kind, bounds[i], bounds[i + 1],
                                          persistent) for i in range(clients)], timeout=3600)
    return count / wall


def _throughput_client(system: str, port: int, workload: str, seconds: float, seed: int):
    r = connect(system, port)
    idx = np.random.default_rng(seed).integers(0, KEYS, 1 << 14).tolist()
    mask = (1 << 14) - 1
    if workload == "increment":
        keys = [f"c{i}" for i in range(KEYS)]
        if system == "spindle":
            counters = [spindle.attach("Counter", k) for k in keys]
            op = lambda i: counters[i].add(1)  # noqa: E731
        else:
            op = lambda i: r.incrby(keys[i], 1)  # noqa: E731
    else:
        keys = [f"b{i}" for i in range(KEYS)]
        value = os.urandom(VALUE_SIZE)
        if system == "spindle":
            blobs = [spindle.attach("Blob", k) for k in keys]
            op = lambda i: blobs[i].set(value)  # noqa: E731
        else:
            op = lambda i: r.set(keys[i], value)  # noqa: E731
    op(idx[0])

    def run():
        n, j, t0 = 0, 0, time.perf_counter()
        stop = t0 + seconds
        while True:
            for _ in range(32):
                op(idx[j & mask])
                j += 1
            n += 32
            now = time.perf_counter()
            if now >= stop:
                return n, now - t0

    return run


def throughput(server: Server, workload: str, clients: int, seconds: float, seed: int) -> float:
    results, _ = run_clients(_throughput_client, [(server.config.system, server.port, workload, seconds,
                                                   seed * 1000 + i) for i in range(clients)],
                             timeout=seconds + 120)
    return sum(n / elapsed for n, elapsed in results)


def prepare_throughput(server: Server) -> None:
    """The 800 counters (at 0) and 800 1 KB values of the throughput workloads."""
    value = os.urandom(VALUE_SIZE)
    if server.config.system == "redis":
        r = server.redis()
        r.mset({f"c{i}": 0 for i in range(KEYS)})
        r.mset({f"b{i}": value for i in range(KEYS)})
        return
    persistent = server.config.fsync is not None
    spindle.connect(server.address, embedded=False)
    for i in range(KEYS):
        spindle.Counter(0, name=f"c{i}", persistent=persistent)
        spindle.Blob(value, name=f"b{i}", persistent=persistent)
    spindle.disconnect()


# --- YCSB ---------------------------------------------------------------------------------------

ZIPFIAN_CONSTANT = 0.99
ZIPF_ITEMS = 10_000_000_000  # YCSB's ScrambledZipfianGenerator.ITEM_COUNT
ZIPF_ZETAN = 26.46902820178302  # its precomputed zeta(ITEM_COUNT, 0.99)
FNV_OFFSET, FNV_PRIME = 0xCBF29CE484222325, 1099511628211

# name: (fraction of reads, description); the rest are updates (F: read-modify-writes).
WORKLOADS = {"A": (0.5, "50% read, 50% update"), "B": (0.95, "95% read, 5% update"),
             "C": (1.0, "100% read"), "F": (0.5, "50% read, 50% read-modify-write")}


def fnvhash64(v: np.ndarray) -> np.ndarray:
    """YCSB's ``Utils.fnvhash64`` (FNV-1a over the 8 bytes, low first; ``Math.abs``)."""
    v = v.astype(np.uint64)
    h = np.full(v.shape, FNV_OFFSET, dtype=np.uint64)
    for _ in range(8):
        h ^= v & np.uint64(0xFF)
        h *= np.uint64(FNV_PRIME)  # wraps, as Java's long does
        v >>= np.uint64(8)
    return np.abs(h.view(np.int64))


def scrambled_zipfian(records: int, size: int, rng: np.random.Generator) -> np.ndarray:
    """``size`` record numbers from YCSB's default request distribution: a zipfian
    (Gray et al.; constant 0.99) over 10^10 items, hashed (FNV-64) onto ``records``, so
    the popular records are spread over the key space."""
    theta, items = ZIPFIAN_CONSTANT, ZIPF_ITEMS + 1  # ZipfianGenerator(0, ITEM_COUNT)
    zeta2 = 1 + 0.5 ** theta
    alpha = 1 / (1 - theta)
    eta = (1 - (2 / items) ** (1 - theta)) / (1 - zeta2 / ZIPF_ZETAN)
    u = rng.random(size)
    uz = u * ZIPF_ZETAN
    ranks = np.floor(items * np.power(eta * u - eta + 1, alpha)).astype(np.int64)
    ranks[uz < 1 + 0.5 ** theta] = 1
    ranks[uz < 1] = 0
    return fnvhash64(ranks) % records


def _ycsb_client(system: str, port: int, workload: str, records: int, seconds: float, seed: int):
    r = connect(system, port)
    rng = np.random.default_rng(seed)
    n_ops = 1 << 15
    keys = [f"user{i}" for i in scrambled_zipfian(records, n_ops, rng).tolist()]
    reads = (rng.random(n_ops) < WORKLOADS[workload][0]).tolist()
    value = os.urandom(VALUE_SIZE)
    if system == "spindle":
        attach = spindle.attach

        def read(k):
            return attach("Blob", k).get()

        def update(k):
            attach("Blob", k).set(value)
    else:
        read = r.get

        def update(k):
            r.set(k, value)

    if workload == "F":
        def write(k):  # read-modify-write: the record is read, then written back
            read(k)
            update(k)
    else:
        write = update
    got = read(keys[0])
    assert got is not None and len(got) == VALUE_SIZE, (system, keys[0], got)

    def run():
        lat = array("f")
        clock = time.perf_counter_ns
        n, t0 = 0, clock()
        stop = t0 + int(seconds * 1e9)
        now = t0
        while now < stop:
            j = n & (n_ops - 1)
            (read if reads[j] else write)(keys[j])
            t = clock()
            lat.append((t - now) / 1000.0)
            now = t
            n += 1
        return n, (now - t0) / 1e9, lat.tobytes()

    return run


def ycsb(server: Server, workload: str, records: int, clients: int, seconds: float, seed: int):
    """(ops/s, latencies in µs) of ``clients`` processes running ``workload``."""
    results, _ = run_clients(_ycsb_client, [(server.config.system, server.port, workload, records, seconds,
                                             seed * 1000 + i) for i in range(clients)],
                             timeout=seconds + 120)
    lat = np.concatenate([np.frombuffer(raw, dtype=np.float32) for _, _, raw in results])
    return sum(n / elapsed for n, elapsed, _ in results), lat


# --- the three parts ----------------------------------------------------------------------------

def part_throughput(sizes: Sizes, clients: int) -> dict:
    servers = [Server(c, TMP / f"tput-{c.short.replace(' ', '-')}") for c in THROUGHPUT_CONFIGS]
    runs: dict[tuple[str, str], list[float]] = {}
    try:
        for s in servers:
            log(f"throughput: starting {s.config.label}...")
            s.start()
            prepare_throughput(s)
        for r in range(sizes.rounds):
            for workload in ("increment", "1 KB write"):
                for s in servers:
                    log(f"throughput, round {r + 1}/{sizes.rounds}: {workload}, {clients} clients on "
                        f"{s.config.label} for {sizes.seconds:g} s...")
                    runs.setdefault((workload, s.config.label), []).append(
                        throughput(s, workload, clients, sizes.seconds, r))
    finally:
        for s in servers:
            s.stop()
    return runs


def part_ycsb(sizes: Sizes, clients: int) -> dict:
    """One server per system, loaded once under the every-second policies; then each phase
    (PAIRS, last first) runs every workload on both, taking turns. Between phases Redis
    switches with ``CONFIG SET appendfsync`` and Spindle restarts on its data directory with
    the other ``--fsync`` (which also times a recovery of the loaded records)."""
    first, last = PAIRS[-1], PAIRS[0]
    servers = {"spindle": Server(first[0], TMP / "ycsb-spindle"), "redis": Server(first[1], TMP / "ycsb-redis")}
    out: dict = {"loads": {}, "sizes": {}, "runs": {}, "lats": {}}
    try:
        for s in servers.values():
            log(f"ycsb: starting {s.config.label}, loading {sizes.records:,} records of "
                f"{VALUE_SIZE} B with {clients} clients...")
            s.start()
            out["loads"][s.config.label] = load(s, "user", sizes.records, clients)
            out["sizes"][s.config.label] = dir_size(s.data_dir)
            log(f"ycsb: loaded {s.config.label} at {out['loads'][s.config.label]:,.0f} records/s")
        for spindle_config, redis_config, _ in (first, last):
            if servers["spindle"].config != spindle_config:
                servers["spindle"].stop()
                log(f"ycsb: restarting Spindle with --fsync {spindle_config.fsync} on the loaded data...")
                servers["spindle"] = Server(spindle_config, servers["spindle"].data_dir)
                out["restart"] = (servers["spindle"].start(), servers["spindle"].recovered_ms(),
                                  dir_size(servers["spindle"].data_dir))
                log(f"ycsb: Spindle answered {out['restart'][0]:.2f} s after spawn")
            if servers["redis"].config != redis_config:
                r = servers["redis"].redis()
                r.config_set("appendfsync", redis_config.fsync)
                assert r.config_get("appendfsync")["appendfsync"] == redis_config.fsync
                servers["redis"].config = redis_config
            for r in range(sizes.ycsb_rounds):
                for workload in WORKLOADS:
                    for s in servers.values():
                        log(f"ycsb, round {r + 1}/{sizes.ycsb_rounds}: workload {workload}, {clients} "
                            f"clients on {s.config.label} for {sizes.ycsb_seconds:g} s...")
                        ops, lat = ycsb(s, workload, sizes.records, clients, sizes.ycsb_seconds, r)
                        key = (workload, s.config.label)
                        out["runs"].setdefault(key, []).append(ops)
                        out["lats"][key] = np.concatenate([out["lats"].get(key, np.empty(0, np.float32)), lat])
    finally:
        for s in servers.values():
            s.stop()
    return out


def part_recovery(sizes: Sizes, clients: int, extra: list[str]) -> dict:
    """Per system: objects, data size, spawn-to-answer times, log's recovered-in times, RSS."""
    out = {}
    for config in (replace(SPINDLE_NEVER, label="Spindle, --fsync never" + "".join(f" {f}" for f in extra)),
                   REDIS_EVERYSEC):
        server = Server(config, TMP / f"recovery-{config.system}", extra if config.system == "spindle" else [])
        log(f"recovery: starting {config.label}, creating {sizes.objects:,} persistent counters "
            f"with {clients} clients...")
        server.start()
        rate = load(server, "c", sizes.objects, clients)
        log(f"recovery: created at {rate:,.0f}/s; SIGKILL")
        server.kill()
        result = {"load": rate, "size": dir_size(server.data_dir), "start": [], "log": [], "rss": []}
        for i in range(sizes.restarts):
            elapsed = server.start()
            result["start"].append(elapsed)
            result["log"].append(server.recovered_ms())
            result["rss"].append(server.rss_mib())
            if config.system == "spindle":
                spindle.connect(server.address, embedded=False)
                count = spindle.status().get("persistent_objects")
                probe = spindle.attach("Counter", f"c{sizes.objects - 1}").get()
                spindle.disconnect()
            else:
                r = server.redis()
                count, probe = r.dbsize(), int(r.get(f"c{sizes.objects - 1}"))
            if (count, probe) != (sizes.objects, (sizes.objects - 1) % 1000):
                message = (f"{config.label} recovered {count} objects (expected {sizes.objects:,}), "
                           f"last counter {probe}")
                if config.system == "spindle":
                    raise RuntimeError(message)
                log(f"warning: {message}")  # everysec may lose the last second
            log(f"recovery, restart {i + 1}/{sizes.restarts}: {config.label} answered {elapsed * 1000:,.0f} ms "
                f"after spawn with {count:,} objects" + (f" (log: recovered in {result['log'][-1]:,.1f} ms)"
                                                        if result["log"][-1] is not None else ""))
            server.kill()
        out[config.label] = result
    return out


# --- report -------------------------------------------------------------------------------------

def med_min_max(values: list[float]) -> list[float]:
    return [statistics.median(values), min(values), max(values)]


def throughput_tables(runs: dict) -> tuple[tuple, tuple]:
    med = {k: statistics.median(v) for k, v in runs.items()}
    rows = []
    for workload in ("increment", "1 KB write"):
        base = med[(workload, SPINDLE_EPHEMERAL.label)]
        for c in THROUGHPUT_CONFIGS:
            values = runs[(workload, c.label)]
            goal = "≥ 0.5" if c is SPINDLE_ALWAYS else ""
            rows.append([workload, c.label, *med_min_max(values), med[(workload, c.label)] / base, goal])
    persistent = (["workload", "configuration", "ops/s (median)", "min", "max", "vs Spindle ephemeral", "goal"],
                  rows)
    rows = []
    for workload in ("increment", "1 KB write"):
        for s, r, pair in PAIRS:
            rows.append([workload, f"{s.label} vs {r.label}", med[(workload, s.label)], med[(workload, r.label)],
                         med[(workload, s.label)] / med[(workload, r.label)], "≥ 1.0"])
    vs_redis = (["workload", "pair", "Spindle (ops/s)", "Redis (ops/s)", "Spindle/Redis", "goal"], rows)
    return persistent, vs_redis


def ycsb_tables(result: dict, records: int, clients: int) -> tuple[tuple, tuple]:
    loads, runs, lats = result["loads"], result["runs"], result["lats"]
    rows = [[label, records, rate, records / rate, result["sizes"][label] / 2 ** 20] for label, rate in loads.items()]
    load_table = (["loaded under", "records", f"load (records/s, {clients} clients)", "seconds",
                   "on disk after the load (MiB)"], rows)
    rows = []
    for workload, (_, description) in WORKLOADS.items():
        for s, r, pair in PAIRS:
            ks, kr = (workload, s.label), (workload, r.label)
            ls, lr = lats[ks], lats[kr]
            ms, mr = statistics.median(runs[ks]), statistics.median(runs[kr])
            rows.append([f"{workload}: {description}", pair, ms, f"{min(runs[ks]):,.0f}–{max(runs[ks]):,.0f}",
                         mr, f"{min(runs[kr]):,.0f}–{max(runs[kr]):,.0f}", ms / mr,
                         f"{percentile(ls, 0.5):,.0f} / {percentile(ls, 0.99):,.0f}",
                         f"{percentile(lr, 0.5):,.0f} / {percentile(lr, 0.99):,.0f}",
                         "≥ 1.0"])
    run_table = (["workload", "fsync", "Spindle (ops/s)", "min–max", "Redis (ops/s)", "min–max", "Spindle/Redis",
                  "Spindle p50 / p99 (µs)", "Redis p50 / p99 (µs)", "goal"], rows)
    return load_table, run_table


def recovery_table(result: dict, objects: int) -> tuple:
    rows = []
    spindle_key = next(k for k in result if k.startswith("Spindle"))
    base = statistics.median(result[REDIS_EVERYSEC.label]["start"])
    for label, r in result.items():
        start = [s * 1000 for s in r["start"]]
        logged = [x for x in r["log"] if x is not None]
        rows.append([label, objects, r["size"] / 2 ** 20, r["load"], *med_min_max(start),
                     statistics.median(logged) if logged else "-", statistics.median(r["rss"]),
                     statistics.median(r["start"]) / base, "< 5,000 ms" if label == spindle_key else ""])
    return (["server", "persistent objects", "data on disk (MiB)", "created (objects/s)",
             "spawn to first answer (ms, median)", "min", "max", "logged recovery (ms)",
             "RSS after recovery (MiB)", "vs Redis", "goal"], rows)


def plot_throughput(runs: dict, img: Path) -> str:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    colours = {"spindle": ["tab:gray", "tab:blue", "tab:cyan", "tab:green", "tab:olive"],
               "redis": ["tab:red", "tab:orange"]}
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.8))
    for ax, workload in zip(axes, ("increment", "1 KB write")):
        meds = [statistics.median(runs[(workload, c.label)]) for c in THROUGHPUT_CONFIGS]
        lo = [m - min(runs[(workload, c.label)]) for m, c in zip(meds, THROUGHPUT_CONFIGS)]
        hi = [max(runs[(workload, c.label)]) - m for m, c in zip(meds, THROUGHPUT_CONFIGS)]
        colour = colours["spindle"] + colours["redis"]
        bars = ax.bar(range(len(meds)), [m / 1000 for m in meds],
                      yerr=[[v / 1000 for v in lo], [v / 1000 for v in hi]], capsize=3, color=colour)
        for bar, m, top in zip(bars, meds, hi):
            ax.annotate(f"{m / meds[0]:.2f}x", (bar.get_x() + bar.get_width() / 2, (m + top) / 1000),
                        textcoords="offset points", xytext=(0, 3), ha="center", fontsize=7)
        ax.set_xticks(range(len(meds)), [c.short.replace(" ", "\n") for c in THROUGHPUT_CONFIGS], fontsize=7)
        ax.set_title(f"{workload}, {KEYS} keys uniformly at random")
        ax.set_ylabel("thousand ops / s")
        ax.grid(axis="y", alpha=0.3)
    fig.suptitle(f"{CLIENTS} client processes: Spindle ephemeral and persistent (--fsync), Redis AOF "
                 "(median, min–max; ratio vs Spindle ephemeral)", fontsize=9)
    fig.tight_layout()
    img.mkdir(parents=True, exist_ok=True)
    fig.savefig(img / "durability-throughput.png", dpi=120)
    plt.close(fig)
    return "img/durability-throughput.png"


def plot_ycsb(result: dict, img: Path) -> str:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs, lats = result["runs"], result["lats"]
    colours = {SPINDLE_ALWAYS.label: "tab:blue", REDIS_ALWAYS.label: "tab:red",
               SPINDLE_1S.label: "tab:green", REDIS_EVERYSEC.label: "tab:orange"}
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.8))
    width = 0.2
    for i, c in enumerate(YCSB_CONFIGS):
        xs = [j + (i - 1.5) * width for j in range(len(WORKLOADS))]
        meds = [statistics.median(runs[(w, c.label)]) for w in WORKLOADS]
        lo = [m - min(runs[(w, c.label)]) for m, w in zip(meds, WORKLOADS)]
        hi = [max(runs[(w, c.label)]) - m for m, w in zip(meds, WORKLOADS)]
        axes[0].bar(xs, [m / 1000 for m in meds], width, yerr=[[v / 1000 for v in lo], [v / 1000 for v in hi]],
                    capsize=2, label=c.label, color=colours[c.label])
        axes[1].bar(xs, [percentile(lats[(w, c.label)], 0.99) / 1000 for w in WORKLOADS], width,
                    color=colours[c.label])
    for ax, ylabel in zip(axes, ("thousand ops / s (median, min–max)", "p99 latency (ms)")):
        ax.set_xticks(range(len(WORKLOADS)), list(WORKLOADS))
        ax.set_ylabel(ylabel)
        ax.grid(axis="y", alpha=0.3)
    axes[0].legend(fontsize=7)
    fig.suptitle(f"YCSB A, B, C, F: 1 KB records, zipfian 0.99, {CLIENTS} client processes", fontsize=9)
    fig.tight_layout()
    img.mkdir(parents=True, exist_ok=True)
    fig.savefig(img / "durability-ycsb.png", dpi=120)
    plt.close(fig)
    return "img/durability-ycsb.png"


def versions() -> str:
    spindle_v = subprocess.run([find_binary(), "--version"], capture_output=True, text=True,
                               check=False).stdout.strip()
    return f"{redis_version()}, {spindle_v} (release build)"


def rounds(n: int) -> str:
    return f"{n} round{'s' if n != 1 else ''}"


# Measured once, when the per-partition logs became one write-ahead log (the previous
# release's binary against this one; not rerun by this script).
SHARED_LOG_NOTE = (
    "**One write-ahead log for all partitions** (docs/durability.md): 1 KB writes under `--fsync always`, "
    "16 clients, a log per partition (the previous release) against one shared log, taking turns, 3 runs "
    "of 4 s each, median, on this machine while it was busy with other builds and tests: with 2 partitions "
    "(the default here) 7,993 and 9,042 calls/s, **1.13x**; with `--partitions 8`, 4,875 and 6,943 calls/s, "
    "**1.42x**: one `fsync` per round for all partitions instead of one per partition."
)


def write_docs(args, sizes: Sizes, results: dict, tables: dict, images: list[str]) -> None:
    fs = filesystem(TMP)
    lines = [
        "## Durability (`bench/durability.py`)",
        "",
        (f"Machine: {machine()}. {versions()}. Data directories on `{fs}` (`{TMP}`). Both servers "
         f"driven from Python ({args.clients} client processes, one connection each: the Spindle SDK and "
         "redis-py, one call per round trip); Redis with `appendonly yes` and no RDB snapshots "
         "(its default AOF rewrite on). The configurations take turns in each round, so the "
         "machine's slow spells hit all alike; figures are medians over the rounds, min and max beside."
         + (" **QUICK run: tiny sizes, noisy figures.**" if QUICK else "")),
        "",
    ]
    if "throughput" in tables:
        persistent, vs_redis = tables["throughput"]
        lines += [
            (f"**Persistent vs ephemeral.** {KEYS} keys chosen uniformly at random (the seed's Figure 3): "
             "counter increments (`Counter.add(1)` / `INCRBY`) and 1 KB writes (`Blob.set` / `SET`), "
             f"{rounds(sizes.rounds)} of {sizes.seconds:g} s. Goal: persistent with `--fsync always` at "
             "least 0.5x ephemeral. Under `always` every change waits for a `write` and an `fdatasync` "
             "of the server's write-ahead log (one for all partitions, shared by the calls queued meanwhile), "
             "so with one call in flight per "
             "client the ratio depends on the disk's flush latency (a virtual disk here) and on the number of "
             "clients."),
            "",
            *table(*persistent),
            "",
            SHARED_LOG_NOTE,
            "",
            ("**Reading the ratio.** With one call in flight per client, a call under `always` waits on "
             "average for the `fdatasync` in progress on the log to end, then for the next "
             "one, which covers it: about 1.5 flushes. Measured apart on this machine's virtual disk, a "
             "flush of a few KiB takes 110-135 µs, so a call waits about 200 µs, "
             "nearly as long again as its whole ephemeral round trip with "
             "16 clients on 2 cores; the ratio therefore sits near 0.5 and swings with the disk from run "
             "to run. With the log on `tmpfs` (a free flush) `always` keeps about 0.8x ephemeral: the "
             "hand-off to the syncer thread and the log write cost the rest. The log is preallocated by "
             "writing zeros, so no flush commits file-system metadata (a sparse extension made each "
             "flush about twice as long)."),
            "",
            ("**Against Redis with AOF**, the closest policies paired: `--fsync always` with "
             "`appendfsync always` (both fsync before replying, both group commits), "
             "`--fsync interval=1s` with `appendfsync everysec`. Goal: at least 1x."),
            "",
            *table(*vs_redis),
            "",
        ]
    if "ycsb" in tables:
        load_table, run_table = tables["ycsb"]
        restart = results["ycsb"].get("restart")
        lines += [
            (f"**YCSB.** {sizes.records:,} records of {VALUE_SIZE} B (`user<N>`; Spindle: persistent `Blob`s, "
             "read = `get`, update = `set`; Redis: `GET`/`SET`), loaded by the client processes "
             "in parallel, one record per call, under `--fsync interval=1s` and `appendfsync everysec`. "
             "Then workloads A (50% read, 50% update), B (95/5), C (100% read) and F (50% read, 50% "
             "read-modify-write: `get` then `set`, one operation), "
             f"{rounds(sizes.ycsb_rounds)} of {sizes.ycsb_seconds:g} s each, Spindle and Redis taking turns, "
             "first under the every-second policies, then under `always` (Redis switched with "
             "`CONFIG SET appendfsync always`, Spindle restarted on its data with `--fsync always`"
             + (f": it answered {restart[0]:.1f} s after spawn, replaying {restart[2] / 2 ** 20:,.0f} MiB of log"
                + (f", and logged `recovered in {restart[1]:,.0f} ms`" if restart[1] is not None else "")
                if restart else "")
             + "). Keys from YCSB's default distribution (scrambled zipfian, constant 0.99, seeded). "
             f"Latency per operation, all clients and rounds pooled; with {args.clients} processes on "
             f"{os.cpu_count()} cores it includes the time a client waits for a core. Goal: at least 1x Redis."),
            "",
            *table(*load_table),
            "",
            *table(*run_table),
            "",
        ]
    if "recovery" in tables:
        extra = " ".join(RECOVERY_FLAGS + shlex.split(args.recovery_flags))
        lines += [
            (f"**Recovery.** {sizes.objects:,} persistent counters created by the client processes "
             f"(Spindle `--fsync never`{f' {extra}' if extra else ''}; Redis AOF `everysec`, one `SET` "
             f"each), the server SIGKILLed, then restarted on the same data {sizes.restarts} times (a SIGKILL "
             "each time): the time from spawn to the first request answered (Spindle: `status`; it "
             "listens before it recovers, so a TCP connection alone proves nothing; Redis: `PING` "
             "not answered `LOADING`), and Spindle's own `recovered in N ms` log line. Each restart "
             "checks the object count and a counter's value. Goal: under 5 s for 1M objects."),
            "",
            *table(*tables["recovery"][0]),
            "",
        ]
    lines += [*[f"![{Path(i).stem}]({i})" for i in images], ""]
    update_section("durability", "\n".join(lines))


PARTS = ("throughput", "ycsb", "recovery")


def main() -> None:
    global TMP
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 epilog="Full mode takes about 6 minutes on 2 cores; QUICK=1 under one.")
    ap.add_argument("--only", choices=PARTS, help="run one part only (prints; does not write the docs)")
    ap.add_argument("--clients", type=int, default=CLIENTS, help="concurrent client processes")
    ap.add_argument("--recovery-flags", default="",
                    help="more spindle server flags for the recovery part (added to RECOVERY_FLAGS)")
    ap.add_argument("--no-docs", action="store_true", help="print only; do not write docs/benchmarks.md")
    args = ap.parse_args()
    sizes = QUICK_SIZES if QUICK else FULL_SIZES
    parts = [args.only] if args.only else list(PARTS)
    extra = RECOVERY_FLAGS + shlex.split(args.recovery_flags)

    t_start = time.perf_counter()
    results: dict[str, dict] = {}
    tables: dict[str, tuple] = {}
    with tempfile.TemporaryDirectory(prefix="spindle-durability-") as tmp:
        TMP = Path(tmp)
        if filesystem(TMP) == "tmpfs":
            log(f"warning: {TMP} is on tmpfs: fsync costs nothing there (set TMPDIR to a disk)")
        for part in parts:
            t_part = time.perf_counter()
            if part == "throughput":
                results[part] = part_throughput(sizes, args.clients)
                tables[part] = throughput_tables(results[part])
            elif part == "ycsb":
                results[part] = part_ycsb(sizes, args.clients)
                tables[part] = ycsb_tables(results[part], sizes.records, args.clients)
            else:
                results[part] = part_recovery(sizes, args.clients, extra)
                tables[part] = (recovery_table(results[part], sizes.objects),)  # one table
            log(f"{part}: done in {time.perf_counter() - t_part:,.0f} s")
        fs_note = f"{TMP} on {filesystem(TMP)}"
    log(f"done in {time.perf_counter() - t_start:,.0f} s (data directories: {fs_note})")

    for name in parts:
        for t in tables[name]:
            print_table(*t)
            print()
    if args.no_docs or args.only:
        return
    images = [plot_throughput(results["throughput"], IMG), plot_ycsb(results["ycsb"], IMG)]
    TMP = Path(tempfile.gettempdir())  # where they were: the parent of the deleted directory
    write_docs(args, sizes, results, tables, images)
    summarize("durability", claims(results, sizes.records, sizes.objects))


def claims(results: dict, records: int, objects: int) -> list[Claim]:
    """The summary's lines: --fsync always against ephemeral and against Redis' AOF, YCSB A, and
    recovery."""
    med = {k: statistics.median(v) for k, v in results["throughput"].items()}
    out = []
    for workload in ("increment", "1 KB write"):
        always, eph = med[(workload, SPINDLE_ALWAYS.label)], med[(workload, SPINDLE_EPHEMERAL.label)]
        out.append(Claim(f"{workload}s, --fsync always vs ephemeral", f"{always:,.0f} ops/s",
                         f"Spindle ephemeral {eph:,.0f} ops/s", always / eph, "≥ 0.5", always / eph >= 0.5))
        ms, mr = always, med[(workload, REDIS_ALWAYS.label)]
        out.append(Claim(f"{workload}s, --fsync always vs Redis appendfsync always", f"{ms:,.0f} ops/s",
                         f"Redis {mr:,.0f} ops/s", ms / mr, "≥ 1.0", ms >= mr))
    runs = results["ycsb"]["runs"]
    ms, mr = statistics.median(runs[("A", SPINDLE_ALWAYS.label)]), statistics.median(runs[("A", REDIS_ALWAYS.label)])
    out.append(Claim(f"YCSB A, {records:,} records, fsync always", f"{ms:,.0f} ops/s", f"Redis {mr:,.0f} ops/s",
                     ms / mr, "≥ 1.0", ms >= mr))
    rec = results["recovery"]
    spindle_key = next(k for k in rec if k.startswith("Spindle"))
    ms, mr = statistics.median(rec[spindle_key]["start"]), statistics.median(rec[REDIS_EVERYSEC.label]["start"])
    out.append(Claim(f"recovery of {objects:,} persistent objects, spawn to first answer", f"{ms * 1000:,.0f} ms",
                     f"Redis {mr * 1000:,.0f} ms", mr / ms, "< 5,000 ms", ms < 5.0))
    return out


if __name__ == "__main__":
    main()
