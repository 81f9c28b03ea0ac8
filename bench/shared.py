"""User-defined objects (``@spindle.shared``): call overhead and CRUCIAL's Figure 3 vs Redis.

Starts ``spindle server --object-hosts CORES`` and ``redis-server`` on free loopback ports,
then measures from Python, in one run:

* **call round trip**: one client, one call at a time, a user-defined method
  (``Cell.add(1)``: ``self.value += 1``) against the built-in ``Counter.add(1)``, on the same
  connection, beside a bare TCP echo between two Python processes (one process hop), taking
  turns in short blocks; p50 and p99, as scheduled and with the processes pinned to one core
  or the object hosts to the other core (on this VM a wake-up across cores costs tens of µs).
* **throughput (seed Figure 3)**: 800 objects each holding an integer, chosen uniformly at
  random by 16 client processes (processes, so that Python clients are not the bottleneck).
  An operation is ``n`` sequential steps of ``x = (x * 31 + 7) % 1000003``; *simple* is
  ``n = 1``, *complex* (the seed's "10K multiplications") is ``n = 10,000``. Integer
  arithmetic, identical on both sides (every value stays below 2^53, so Lua's doubles are
  exact), checked against a local computation before timing:

  - Redis: a Lua script, ``EVALSHA`` on the key holding the number (GET, loop, SET);
  - Spindle, Python method: ``Number.spin(n)``, a plain Python loop in an object host; the
    same on a second server with ``--object-hosts 1`` (what the hosts' parallelism buys), and
    on a third whose hosts run PyPy (``--host-python``, the environment of ``make pypy``;
    they import ``Number`` from ``bench/shared_objects.py``);
  - Spindle, NumPy method: ``Number.spin_numpy(n)``, the same ``n`` multiplications as a
    parallel prefix (the powers ``31^i mod p`` by doubling in int64 vectors), then
    ``x_n = 31^n x + 7 (31^0 + ... + 31^(n-1)) mod p``: the same result, bit for bit;
  - Spindle, built-in (simple only): ``Counter.add(1)`` on 800 counters, the closest built-in
    (the server has no multiply-modulo method).

* the **cost of one complex operation's arithmetic alone**, to say what 5x would take:
  the Python loop and the NumPy variant in this process, Lua from Redis' own
  ``INFO commandstats``, the same Python loop under PyPy's JIT (the PyPy hosts' ``.venv-pypy``),
  and the same loop in Rust (``rustc -O``, when available), which is what a built-in method
  or a WebAssembly object would run.

Prints tables with the ratios and writes the ``shared`` section of ``docs/benchmarks.md``
with plots under ``docs/img/``. Usage: ``python bench/shared.py [--seconds S] [--rounds R]``.
"""

from __future__ import annotations

import argparse
import contextlib
import multiprocessing as mp
import os
import random
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from objects import Running, free_port, redis_cmd
from report import IMG, QUICK, Claim, log, machine, percentile, print_table, redis_version, summarize, table, update_section
from shared_objects import A, B, P, Number, spin_numpy

import spindle
from spindle.embedded import find_binary

COMPLEX, SIMPLE = 10_000, 1
OBJECTS = 800

LUA = """
local x = tonumber(redis.call('GET', KEYS[1]) or '1')
local n = tonumber(ARGV[1])
for i = 1, n do x = (x * 31 + 7) % 1000003 end
redis.call('SET', KEYS[1], x)
return x
"""


def spin_reference(x: int, n: int) -> int:
    for _ in range(n):
        x = (x * A + B) % P
    return x


@spindle.shared
class Cell:
    """The user-defined twin of ``Counter.add``."""

    def __init__(self, value: int = 0) -> None:
        self.value = value

    def add(self, delta: int = 1) -> int:
        self.value += delta
        return self.value


# --- servers --------------------------------------------------------------------------------

# Object hosts on PyPy (`--host-python`): the environment `make pypy` builds.
PYPY = Path(__file__).resolve().parents[1] / ".venv-pypy" / "bin" / "python"


def start_spindle(hosts: int, host_python: Path | None = None) -> Running:
    binary = find_binary()
    help_text = subprocess.run([binary, "server", "--help"], capture_output=True, text=True,
                               check=False).stdout
    if "--host-python" not in help_text:
        sys.exit(f"error: {binary} has no --host-python (object hosts on PyPy): rebuild it")
    port = free_port()
    cmd = [binary, "server", "--port", str(port), "--object-hosts", str(hosts), "--python", sys.executable]
    # PyPy hosts import Number from shared_objects (next to this file, on PYTHONPATH).
    return Running(cmd + (["--host-python", str(host_python)] if host_python else []), port)


def start_redis() -> Running:
    port = free_port()
    return Running(redis_cmd(port), port)


# --- one operation per workload, made in the measuring process -------------------------------

# name: (operation, server, how the operation runs). Rounds run them in this order.
WORKLOADS = {
    "redis simple": ("simple", "redis", "Redis, Lua script (EVALSHA)"),
    "spindle simple built-in": ("simple", "spindle", "Spindle, built-in Counter.add"),
    "spindle simple Python": ("simple", "spindle", "Spindle, Python method"),
    "redis complex": ("complex", "redis", "Redis, Lua script (EVALSHA)"),
    "spindle complex Python": ("complex", "spindle", "Spindle, Python method"),
    "spindle complex Python, 1 host": ("complex", "spindle-1", "Spindle, Python method, 1 object host"),
    "spindle complex NumPy": ("complex", "spindle", "Spindle, NumPy method"),
    "spindle complex Python, PyPy": ("complex", "spindle-pypy", "Spindle, Python method, PyPy object hosts"),
}


# The proxies, made by prepare() in the parent before the client processes fork (a proxy is
# only its reference: the children call through their own connections).
PROXIES: dict[str, list] = {}


def make_op(workload: str, ports: dict[str, int]):
    """A callable ``op(i)`` applying the workload's operation to object ``i``."""
    operation, server, _ = WORKLOADS[workload]
    n = COMPLEX if operation == "complex" else SIMPLE
    if server == "redis":
        import redis

        r = redis.Redis(host="127.0.0.1", port=ports["redis"])
        sha = r.script_load(LUA)
        keys = [f"num:{i}" for i in range(OBJECTS)]
        return lambda i: r.evalsha(sha, 1, keys[i], n)
    spindle.connect(f"127.0.0.1:{ports[server]}")
    if "built-in" in workload:
        counters = PROXIES["counters"]
        return lambda i: counters[i].add(1)
    numbers = PROXIES["numbers"]
    if "NumPy" in workload:
        return lambda i: numbers[i].spin_numpy(n)
    return lambda i: numbers[i].spin(n)


def _client(workload: str, ports: dict[str, int], seconds: float, start_at: float, seed: int, out) -> None:
    try:
        op = make_op(workload, ports)
        rng = random.Random(seed)
        op(rng.randrange(OBJECTS))  # connected, scripts loaded, classes defined
        while time.time() < start_at:
            time.sleep(0.001)
        n, stop, now = 0, start_at + seconds, time.time()
        while now < stop:
            op(rng.randrange(OBJECTS))
            n += 1
            now = time.time()
        out.put((n, now - start_at))
    except BaseException as e:  # reported by the parent
        out.put(e)
        raise


def throughput(workload: str, ports: dict[str, int], clients: int, seconds: float, seed: int) -> float:
    """Operations per second of ``clients`` processes running the workload for ``seconds``."""
    ctx = mp.get_context("fork")
    out = ctx.Queue()
    start_at = time.time() + 0.5 + 0.05 * clients
    procs = [ctx.Process(target=_client, args=(workload, ports, seconds, start_at, seed * 1000 + i, out))
             for i in range(clients)]
    for p in procs:
        p.start()
    results = [out.get(timeout=seconds + 120) for _ in procs]
    for p in procs:
        p.join()
    for r in results:
        if isinstance(r, BaseException):
            raise RuntimeError(f"a {workload} client failed: {r!r}") from r
    return sum(n / elapsed for n, elapsed in results)


def prepare(ports: dict[str, int]) -> None:
    """Create the 800 objects on both sides and check that all variants agree."""
    import redis

    r = redis.Redis(host="127.0.0.1", port=ports["redis"])
    r.flushall()
    r.mset({f"num:{i}": 1 for i in range(OBJECTS)})
    for other in ("spindle-1", "spindle-pypy"):  # the same objects, on one host and on PyPy
        spindle.connect(f"127.0.0.1:{ports[other]}")
        for i in range(OBJECTS):
            Number(1, name=f"num-{i}")
        jit, x = Number(5), 5
        for n in (1, 2, 7, COMPLEX, 0, COMPLEX, 3):
            x = spin_reference(x, n)
            assert jit.spin(n) == x, (other, n)
        spindle.delete(jit)
    spindle.connect(f"127.0.0.1:{ports['spindle']}")
    PROXIES["numbers"] = [Number(1, name=f"num-{i}") for i in range(OBJECTS)]
    PROXIES["counters"] = [spindle.Counter(name=f"counter-{i}") for i in range(OBJECTS)]
    # The three implementations give the same values as a local loop, call after call.
    sha = r.script_load(LUA)
    r.set("check", 5)
    plain, vector, x = Number(5), Number(5), 5
    for n in (1, 2, 7, COMPLEX, 0, COMPLEX, 3):
        x = spin_reference(x, n)
        got = (int(r.evalsha(sha, 1, "check", n)), plain.spin(n), vector.spin_numpy(n), spin_numpy(x, 0))
        assert got == (x, x, x, x), (n, got, x)
    spindle.delete(plain)
    spindle.delete(vector)
    log("checked: Lua, the Python method and the NumPy method compute the same values")


# --- call round trip --------------------------------------------------------------------------

BLOCK = 200  # calls of one kind in a row in the round-trip measure
BUILTIN, USER, ECHO = "built-in Counter.add", "user-defined Cell.add", "TCP echo, Python to Python"


@contextlib.contextmanager
def echo_peer():
    """A forked Python process echoing 20-byte messages over loopback TCP; yields a call
    making one round trip (the cost of one process hop on this machine) and its pid."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    pid = os.fork()
    if pid == 0:
        conn, _ = listener.accept()
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        while data := conn.recv(64):
            conn.sendall(data)
        os._exit(0)
    sock = socket.create_connection(listener.getsockname())
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    msg = b"x" * 20

    def echo(_: int) -> None:
        sock.sendall(msg)
        sock.recv(64)

    try:
        yield echo, pid
    finally:
        sock.close()
        listener.close()
        os.waitpid(pid, 0)


def pin(pids: list[int], cpus: set[int]) -> None:
    """Pin every thread of these processes to ``cpus``."""
    for pid in pids:
        for tid in os.listdir(f"/proc/{pid}/task"):
            try:
                os.sched_setaffinity(int(tid), cpus)
            except OSError:  # a thread that just ended
                pass


def host_pids(server_pid: int) -> list[int]:
    """The object hosts among the server's children."""
    pids = []
    for tid in os.listdir(f"/proc/{server_pid}/task"):
        children = Path(f"/proc/{server_pid}/task/{tid}/children").read_text().split()
        for child in map(int, children):
            try:
                if b"spindle.host" in Path(f"/proc/{child}/cmdline").read_bytes():
                    pids.append(child)
            except OSError:
                pass
    return pids


# Where the processes run during each phase of the round-trip measure: None leaves it to the
# kernel; else (CPU of the client and the server, CPU of the object hosts and the echo peer).
PLACEMENTS = {"as scheduled": None, "one core": (0, 0), "host on the other core": (0, 1)}


def round_trips(server: Running, ops: int) -> dict[str, dict[str, list[float]]]:
    """Sequential calls, one client, µs: Counter.add(1), Cell.add(1) and a bare TCP echo
    between two Python processes, in short blocks taking turns (so that all three see the
    machine in the same state), in each placement of PLACEMENTS."""
    spindle.connect(f"127.0.0.1:{server.port}")
    counter, cell = spindle.Counter(name="rt-counter"), Cell(name="rt-cell")
    everything = set(range(os.cpu_count() or 1))
    results: dict[str, dict[str, list[float]]] = {}
    with echo_peer() as (echo, echo_pid):
        calls = {BUILTIN: counter.add, USER: cell.add, ECHO: echo}
        hosts = host_pids(server.proc.pid)
        for placement, cpus in PLACEMENTS.items():
            if cpus is not None and len(everything) < 2:
                continue
            if cpus is not None:
                pin([os.getpid(), server.proc.pid], {cpus[0]})
                pin([*hosts, echo_pid], {cpus[1]})
            log(f"round trips, {placement}: {ops:,} of each kind in alternating blocks of {BLOCK}...")
            for call in calls.values():
                for _ in range(500):
                    call(1)
            samples: dict[str, list[float]] = {name: [] for name in calls}
            clock = time.perf_counter_ns
            order = list(calls.items())
            for b in range(ops // BLOCK):
                for name, call in order[b % 3:] + order[:b % 3]:  # who goes first rotates
                    block = samples[name]
                    for _ in range(BLOCK):
                        t0 = clock()
                        call(1)
                        block.append((clock() - t0) / 1000.0)
            results[placement] = samples
        pin([os.getpid(), server.proc.pid, *hosts, echo_pid], everything)
    return results


# --- the arithmetic alone ----------------------------------------------------------------------

def per_call_us(fn, reps: int) -> float:
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e6


RUST = """
use std::time::Instant;
fn spin(mut x: u64, n: u64, a: u64, b: u64, p: u64) -> u64 {
    for _ in 0..n { x = (x * a + b) % p; }
    x
}
fn main() {
    // Parameters from the command line, as a built-in method would get them.
    let v: Vec<u64> = std::env::args().skip(1).map(|s| s.parse().unwrap()).collect();
    let (n, a, b, p, reps) = (v[0], v[1], v[2], v[3], v[4]);
    let mut x = 5;
    let mut times = Vec::new();
    for _ in 0..reps {
        let t = Instant::now();
        x = spin(x, n, a, b, p);
        times.push(t.elapsed().as_secs_f64());
    }
    times.sort_by(|a, b| a.partial_cmp(b).unwrap());
    println!("{} {}", x, times[times.len() / 2] * 1e6);
}
"""


def native_us() -> float | None:
    """The loop compiled by rustc -O: what a built-in (or a WebAssembly) method would run."""
    rustc = shutil.which("rustc") or str(Path.home() / ".cargo" / "bin" / "rustc")
    if not os.access(rustc, os.X_OK):
        return None
    with tempfile.TemporaryDirectory() as tmp:
        src, exe = Path(tmp) / "spin.rs", Path(tmp) / "spin"
        src.write_text(RUST)
        if subprocess.run([rustc, "-O", str(src), "-o", str(exe)], capture_output=True, check=False).returncode:
            return None
        out = subprocess.run([str(exe), str(COMPLEX), str(A), str(B), str(P), "2000"],
                             capture_output=True, text=True, check=True).stdout.split()
        x = spin_reference(5, COMPLEX)
        for _ in range(1999):
            x = spin_reference(x, COMPLEX)
        assert int(out[0]) == x, "the Rust loop disagrees"
        return float(out[1])


PYPY_LOOP = f"""
import sys, time
def spin(x, n):
    for _ in range(n):
        x = (x * {A} + {B}) % {P}
    return x
x = 5
for _ in range(2000):  # the JIT compiles the loop here
    x = spin(x, {COMPLEX})
times = []
for _ in range(2000):
    t0 = time.perf_counter()
    x = spin(x, {COMPLEX})
    times.append(time.perf_counter() - t0)
times.sort()
print(x, times[len(times) // 2] * 1e6)
"""


def pypy_us() -> float:
    """The Python method's loop run by PyPy's JIT: what the PyPy object hosts spend on it."""
    out = subprocess.run([str(PYPY), "-c", PYPY_LOOP], capture_output=True, text=True,
                         check=True).stdout.split()
    x = spin_reference(5, COMPLEX)
    for _ in range(3999):
        x = spin_reference(x, COMPLEX)
    assert int(out[0]) == x, "the PyPy loop disagrees"
    return float(out[1])


def arithmetic_costs(redis_port: int) -> dict[str, float]:
    """µs of one complex operation's arithmetic, without any call overhead."""
    import redis

    costs = {PY_COST: per_call_us(lambda: spin_reference(5, COMPLEX), 300),
             NP_COST: per_call_us(lambda: spin_numpy(5, COMPLEX), 300)}
    r = redis.Redis(host="127.0.0.1", port=redis_port)
    sha = r.script_load(LUA)
    r.config_resetstat()
    for _ in range(300):
        r.evalsha(sha, 1, "lua-cost", COMPLEX)
    stats = r.info("commandstats")["cmdstat_evalsha"]
    costs[LUA_COST] = float(stats["usec_per_call"])
    costs[PYPY_COST] = pypy_us()
    native = native_us()
    if native is not None:
        costs[RS_COST] = native
    return costs


def host_handle_us() -> float:
    """µs an object host spends on one ``Cell.add(1)`` call itself (``Host.handle``: decode
    the request, run the method, encode the reply), without the sockets."""
    import cloudpickle
    import msgpack
    from spindle.host import Host

    host = Host()
    host.construct("k", "py:bench.Cell", "v", cloudpickle.dumps(Cell.__wrapped__), [0], {})
    body = msgpack.packb([7, "call", "k", "add", [1], {}])
    for _ in range(2000):
        host.handle(body)
    t0, n = time.perf_counter(), 20000
    for _ in range(n):
        host.handle(body)
    return (time.perf_counter() - t0) / n * 1e6


# --- report -------------------------------------------------------------------------------------

def plot(rt: dict[str, dict[str, list[float]]], runs: dict[str, list[float]], img: Path,
         clients: int) -> list[str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    img.mkdir(parents=True, exist_ok=True)
    styles = {BUILTIN: "tab:blue", USER: "tab:orange", ECHO: "tab:gray"}
    fig, axes = plt.subplots(1, len(rt), figsize=(4.2 * len(rt), 3.6), sharey=True, squeeze=False)
    for ax, (placement, samples) in zip(axes[0], rt.items()):
        for name, values in samples.items():
            v = sorted(values)
            ax.plot(v, [i / len(v) for i in range(len(v))], "--" if name == ECHO else "-",
                    label=name, color=styles[name])
        ax.set_xscale("log")
        ax.set_xlabel("round trip from Python (µs, log)")
        ax.set_title(placement)
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel("fraction of calls")
    axes[0][0].legend(fontsize=8)
    fig.suptitle("Sequential calls, one client: user-defined vs built-in method, and a bare process hop",
                 fontsize=10)
    fig.tight_layout()
    fig.savefig(img / "shared_latency.png", dpi=120)
    plt.close(fig)

    fig, axes = plt.subplots(1, 2, figsize=(10, 4), gridspec_kw={"width_ratios": [3, 4]})
    colours = {"redis": "tab:red", "built-in": "tab:blue", "1 host": "tab:olive",
               "Python": "tab:green", "NumPy": "tab:purple"}
    for ax, operation in zip(axes, ("simple", "complex")):
        names = [w for w in WORKLOADS if WORKLOADS[w][0] == operation]
        meds = [statistics.median(runs[w]) for w in names]
        lo = [m - min(runs[w]) for m, w in zip(meds, names)]
        hi = [max(runs[w]) - m for m, w in zip(meds, names)]
        labels = [WORKLOADS[w][2].replace(", ", "\n", 1).replace(", ", "\n") for w in names]
        colour = [next(c for k, c in colours.items() if k in w) for w in names]
        bars = ax.bar(range(len(names)), meds, yerr=[lo, hi], capsize=4, color=colour)
        redis = meds[0]
        for bar, m in zip(bars, meds):
            ax.annotate(f"{m / redis:.2f}x", (bar.get_x() + bar.get_width() / 2, m),
                        textcoords="offset points", xytext=(0, 3), ha="center", fontsize=8)
        ax.set_xticks(range(len(names)), labels, fontsize=7)
        n = SIMPLE if operation == "simple" else COMPLEX
        ax.set_title(f"{operation}: {n:,} step{'s' if n > 1 else ''} per call")
        ax.set_ylabel("operations / s")
        ax.grid(axis="y", alpha=0.3)
    fig.suptitle(f"{OBJECTS} objects, uniformly random, {clients} client processes "
                 "(median of the rounds, min–max; ratio vs Redis)", fontsize=10)
    fig.tight_layout()
    fig.savefig(img / "shared_throughput.png", dpi=120)
    plt.close(fig)
    return ["img/shared_latency.png", "img/shared_throughput.png"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ops", type=int, default=1000 if QUICK else 15000,
                    help="sequential calls per kind for the round trip")
    ap.add_argument("--rounds", type=int, default=1 if QUICK else 3,
                    help="rounds: the workloads take turns; medians over rounds")
    ap.add_argument("--seconds", type=float, default=0.5 if QUICK else 2.0, help="duration of each throughput run")
    ap.add_argument("--clients", type=int, default=16, help="concurrent client processes")
    ap.add_argument("--hosts", type=int, default=os.cpu_count() or 1, help="--object-hosts (default: cores)")
    ap.add_argument("--no-docs", action="store_true", help="print only; do not write docs/benchmarks.md")
    args = ap.parse_args()

    if not PYPY.exists():
        sys.exit(f"error: no PyPy environment at {PYPY}: run `make pypy` (it installs Debian's pypy3)")
    os.environ["PYTHONPATH"] = os.pathsep.join(
        [str(Path(__file__).resolve().parent), *filter(None, [os.environ.get("PYTHONPATH")])])
    log(f"starting spindle (--object-hosts {args.hosts}; another with 1; another on PyPy) and redis...")
    servers = {"spindle": start_spindle(args.hosts), "spindle-1": start_spindle(1),
               "spindle-pypy": start_spindle(args.hosts, PYPY), "redis": start_redis()}
    ports = {name: s.port for name, s in servers.items()}
    try:
        prepare(ports)
        rt = round_trips(servers["spindle"], args.ops)
        runs: dict[str, list[float]] = {w: [] for w in WORKLOADS}
        for r in range(args.rounds):  # rounds alternate: slow spells hit every workload alike
            for workload in WORKLOADS:
                log(f"throughput, round {r + 1}/{args.rounds}: {workload}, {args.clients} clients "
                    f"for {args.seconds:.0f} s...")
                runs[workload].append(throughput(workload, ports, args.clients, args.seconds, r))
        spindle.connect(f"127.0.0.1:{ports['spindle']}")
        status = spindle.status()
        costs = arithmetic_costs(ports["redis"])
    finally:
        spindle.disconnect()
        for s in servers.values():
            s.stop()
    log(f"server status after the runs: object_hosts={status.get('object_hosts')}, "
        f"hosted_objects={status.get('hosted_objects')}")
    report_all(args, rt, runs, costs)


def report_all(args, rt: dict[str, dict[str, list[float]]],
               runs: dict[str, list[float]], costs: dict[str, float]) -> None:
    cores = os.cpu_count() or 1
    rt_rows = []
    for placement, samples in rt.items():
        med = {n: statistics.median(s) for n, s in samples.items()}
        p99 = {n: percentile(s, 0.99) for n, s in samples.items()}
        rt_rows += [[f"{placement}, p50", med[USER], med[BUILTIN], med[ECHO], med[USER] / med[BUILTIN], "≤ 2.0"],
                    [f"{placement}, p99", p99[USER], p99[BUILTIN], p99[ECHO], p99[USER] / p99[BUILTIN], "≤ 2.0"]]
    rt_table = (["round trip (µs)", USER, BUILTIN, ECHO, "user / built-in", "goal"], rt_rows)
    hop = {placement: {n: statistics.median(s) for n, s in samples.items()} for placement, samples in rt.items()}

    tput = {w: statistics.median(v) for w, v in runs.items()}
    rows = []
    for w, (operation, _, label) in WORKLOADS.items():
        goal = "≥ 1.0" if w == "spindle complex Python" else ""
        rows.append([f"{operation}: {label}", tput[w], min(runs[w]), max(runs[w]),
                     tput[w] / tput[f"redis {operation}"], goal])
    t_table = (["operation: system", "ops/s (median)", "min", "max", "vs redis", "goal"], rows)

    # What it would take: each variant's arithmetic plus the machine's CPU per call (all
    # processes, clients included: cores / the simple-operation throughput of that path).
    redis_c = tput["redis complex"]
    target = 5 * redis_c
    overhead = {"host": cores / tput["spindle simple Python"] * 1e6,
                "built-in": cores / tput["spindle simple built-in"] * 1e6}
    variants = [("Python method", costs[PY_COST], overhead["host"], tput["spindle complex Python"]),
                ("NumPy method", costs[NP_COST], overhead["host"], tput["spindle complex NumPy"])]
    if PYPY_COST in costs:
        variants.append((PYPY_HOST, costs[PYPY_COST], overhead["host"], tput["spindle complex Python, PyPy"]))
    if RS_COST in costs:
        variants.append(("built-in method (the Rust loop in the server)", costs[RS_COST],
                         overhead["built-in"], None))
        variants.append((f"WebAssembly object (the Rust loop at {WASM_SLOWDOWN}x, run in the server)",
                         costs[RS_COST] * WASM_SLOWDOWN, overhead["built-in"], None))
    w_rows = []
    for name, arith, over, measured in variants:
        per_call = arith + over
        w_rows.append([name, arith, over, cores * 1e6 / per_call,
                       "-" if measured is None else measured, cores * 1e6 / per_call / redis_c,
                       target * per_call / 1e6])
    w_table = (["complex operation", "arithmetic (µs)", "+ CPU per call (µs)",
                f"model: {cores} cores / per call (ops/s)", "measured (ops/s)",
                "model vs redis", "cores for 5x redis"], w_rows)
    c_table = (["one complex operation's arithmetic", "µs", "calls/s on one core"],
               [[name, us, 1e6 / us] for name, us in costs.items()])

    for headers, rows in (rt_table, t_table, c_table, w_table):
        print_table(headers, rows)
        print()
    print(f"hop: {hop}")
    if args.no_docs:
        return
    images = plot(rt, runs, IMG, args.clients)
    write_docs(args, rt_table, hop, t_table, c_table, w_table, tput, costs, overhead, images)


PY_COST = "Python loop (the Python method)"
NP_COST = "NumPy prefix (the NumPy method)"
LUA_COST = "Lua in Redis (GET, loop, SET; INFO commandstats)"
RS_COST = "Rust, rustc -O (what a built-in method runs)"
PYPY_COST = "Python loop under PyPy (a JIT: what PyPy object hosts run)"
PYPY_HOST = "Python method, PyPy object hosts"
WASM_SLOWDOWN = 1.5  # assumed cost of compiled WebAssembly against native code


def write_docs(args, rt_table, hop, t_table, c_table, w_table, tput, costs, overhead, images) -> None:
    cores = os.cpu_count() or 1
    lua, py, vec = costs[LUA_COST], costs[PY_COST], costs[NP_COST]
    redis_c = tput["redis complex"]
    py_ratio = tput["spindle complex Python"] / redis_c
    pypy_ratio = tput["spindle complex Python, PyPy"] / redis_c
    np_ratio = tput["spindle complex NumPy"] / redis_c
    scaling = tput["spindle complex Python"] / tput["spindle complex Python, 1 host"]
    host_us = host_handle_us()
    one = hop.get("one core")
    other = hop.get("host on the other core")
    for h in (one, other):
        if h:
            h["echo"] = h[ECHO]
    model = {row[0]: row[3] for row in w_table[1]}
    eff_py = tput["spindle complex Python"] / model["Python method"]
    eff_np = tput["spindle complex NumPy"] / model["NumPy method"]
    builtin_model = next((row[5] for row in w_table[1] if row[0].startswith("built-in")), None)
    pypy_row = next((row for row in w_table[1] if row[0] == PYPY_HOST), None)
    lines = [
        "## User-defined objects (`bench/shared.py`)",
        "",
        (f"Machine: {machine()}. Spindle release build, `--object-hosts {args.hosts}` (one per "
         f"core); {redis_version()} (no persistence; it runs scripts on one thread). "
         "Both driven from Python: the Spindle SDK and redis-py. Throughput figures are the "
         f"median of {args.rounds} runs of {args.seconds:.0f} s (min and max beside them); the "
         "workloads take turns in rounds, so the machine's slow spells hit all alike."),
        "",
        (f"**Call round trip.** One client, {args.ops:,} sequential calls of each kind on one "
         "connection: a user-defined method (`Cell.add(1)`: `self.value += 1`, run in an object "
         "host) against the built-in `Counter.add(1)` (run by the server itself), beside a bare "
         "TCP echo between two Python processes (the cost of one process hop). The three take "
         f"turns in blocks of {BLOCK} calls. Three placements: *as scheduled* (the kernel's "
         "choice), *one core* (client, server, hosts and echo peer pinned to CPU 0), and *host "
         "on the other core* (client and server on CPU 0, hosts and echo peer on CPU 1). "
         "Goal: within 2x."),
        "",
        *table(*rt_table),
        "",
        (f"A user-defined call is the built-in path plus one hop: the server sends the call to "
         "the object's host over a socket and waits for its reply. The host's own work per call "
         f"is {host_us:.1f} µs (decode, call, encode: `Host.handle` timed in-process); the rest "
         "is socket transits and process wake-ups, and on this VM their cost depends on where "
         "the processes run: a wake-up on the same core is cheap, one on another (idle) core "
         "costs tens of µs, as the echo shows"
         + (f" ({one['echo']:.1f} µs on one core, {other['echo']:.1f} µs across cores)"
            if one and other else "")
         + ". A built-in call involves the client and the server, a user-defined call also the "
         "host, and every hop to a process on another core pays that wake-up, so the *as "
         "scheduled* rows depend on where the kernel happened to put the three"
         + (f". On one core the hop adds {one[USER] - one[BUILTIN]:.0f} µs ({one[USER] / one[BUILTIN]:.1f}x "
            f"the built-in): one echo and the host's work are {one['echo'] + host_us:.0f} µs of it, "
            f"and the other {one[USER] - one[BUILTIN] - one['echo'] - host_us:.0f} µs are the "
            "server's side of the extra hop: one more socket read, socket write and event-loop "
            "wait per call, and the switches to and from the host process, mostly kernel time "
            "(the call and the host's answer are written to their sockets directly by the task "
            "that read them, as built-in replies are, with no task wake-up in between)" if one else "")
         + (f". With the host on the other core the hop adds {other[USER] - other[BUILTIN]:.0f} µs "
            f"({other[USER] / other[BUILTIN]:.1f}x): two cross-core wake-ups" if other else "")
         + "."),
        "",
        (f"**Throughput (seed Figure 3).** {OBJECTS} objects holding an integer, chosen uniformly "
         f"at random by {args.clients} client processes. One step is "
         "`x = (x * 31 + 7) % 1000003` (integer arithmetic, the same on both sides; every value "
         "stays below 2^53, so Lua's doubles are exact; all variants are checked against a local "
         f"loop before timing). *Simple* is one step, *complex* is {COMPLEX:,} sequential steps "
         "(the seed's \"10K multiplications\"). Redis runs a Lua script (`EVALSHA`: GET, loop, "
         "SET). Spindle's Python method is the plain loop. The NumPy method returns the same "
         f"value bit for bit from the same {COMPLEX:,} multiplications done as int64 vector "
         "operations: the powers 31^i mod p by doubling (a parallel prefix), then "
         "x·31^n + 7·Σ31^i mod p. The built-in for *simple* is `Counter.add(1)` (the server has "
         "no multiply-modulo method). *1 object host* is a second server with "
         "`--object-hosts 1`; *PyPy object hosts* a third whose hosts run PyPy "
         "(`--host-python`, the environment of `make pypy`), importing the class from "
         "`bench/shared_objects.py`. Goal: the Python method at least 1x Redis on complex "
         "operations."),
        "",
        *table(*t_table),
        "",
        "The arithmetic of one complex operation alone (no call), median:",
        "",
        *table(*c_table),
        "",
        ("**Reading the throughput.** For complex "
         f"operations Redis runs one script at a time: {lua:.0f} µs of Lua per call caps it "
         f"near {1e6 / lua:,.0f} ops/s, and it reached {redis_c:,.0f}. Spindle runs calls on "
         f"objects of different hosts in parallel ({scaling:.2f}x from 1 host to {args.hosts}), "
         f"but CPython's loop costs {py:.0f} µs, {py / lua:.1f}x Lua's, and this machine has "
         f"{cores} cores for the hosts, the server and the {args.clients} clients together: at "
         f"most {cores * 1e6 / py:,.0f} ops/s, so the Python method reaches {py_ratio:.2f}x "
         f"Redis here, {'meeting' if py_ratio >= 1 else 'short of'} the 1x goal on CPython hosts; on PyPy hosts the same method reaches {pypy_ratio:.2f}x (below). The NumPy method ({vec:.0f} µs of arithmetic) reaches {np_ratio:.2f}x."),
        "",
        (f"**What 5x Redis would take** ({5 * redis_c:,.0f} complex ops/s here). A simple model: "
         "a call costs its arithmetic plus a fixed CPU cost per call for "
         "the whole machine (client, server, host: the cores divided by the simple-operation "
         f"throughput of that path, {overhead['host']:.0f} µs through a host, "
         f"{overhead['built-in']:.0f} µs for a built-in), and throughput is cores / cost. The "
         "built-in and WebAssembly rows are projections (no such method exists yet; WebAssembly "
         f"is assumed {WASM_SLOWDOWN}x slower than native code). Measured throughput is "
         f"{eff_py:.0%} (Python) and {eff_np:.0%} (NumPy) of the model (it counts no wake-ups "
         "and no imbalance between hosts), so read its ratios as upper bounds and its core "
         "counts as lower bounds"
         + (f": at NumPy's efficiency a built-in method would reach about "
            f"{builtin_model * eff_np:.1f}x Redis on this {cores}-core machine." if builtin_model else ".")),
        "",
        *table(*w_table),
        "",
        ("So Python methods scale with cores, not with cleverness: 5x needs as many cores as "
         "the last column says, as the seed's 5x came from 200 cloud threads over a cluster "
         "against one Redis thread. Per core, what pays is to stop interpreting the loop: "
         "NumPy when the work vectorizes (it did here, through a parallel prefix), a built-in "
         "method (a Rust `apply` for the operation, no host hop at all), or a WebAssembly "
         "object (a later issue): compiled code run in the server, which also removes the hop."
         + (f" Or a JIT for the methods themselves: PyPy runs the same loop in "
            f"{costs[PYPY_COST]:.0f} µs, {py / costs[PYPY_COST]:.0f}x faster than CPython and "
            f"{lua / costs[PYPY_COST]:.1f}x faster than Lua, and with object hosts on PyPy "
            f"(`--host-python`) the plain Python method reaches {pypy_ratio:.2f}x Redis "
            f"({pypy_row[4] / pypy_row[3]:.0%} of the model, which counts the CPython hosts' "
            "cost per call: PyPy's pure-Python msgpack and its JIT may cost otherwise). The goal "
            "row stays the CPython one: PyPy hosts import classes from modules on the server's "
            "path, not from `__main__`, and pass only values both sides can unpickle (README)."
            if pypy_row else "")),
        "",
        *[f"![{Path(i).stem}]({i})" for i in images],
        "",
    ]
    update_section("shared", "\n".join(lines))
    placement, user, builtin = rt_table[1][0][:3]  # the first placement (as scheduled), p50
    summarize("shared", [
        Claim(f"user-defined method round trip ({placement})", f"{user:.1f} µs",
              f"built-in Counter.add {builtin:.1f} µs", builtin / user, "≥ 0.5 (within 2x)", user <= 2 * builtin),
        Claim(f"complex operation ({COMPLEX:,} steps), Python method, {args.clients} Python clients",
              f"{tput['spindle complex Python']:,.0f} ops/s", f"Redis Lua {redis_c:,.0f} ops/s", py_ratio,
              "≥ 1.0", py_ratio >= 1.0),
        Claim(f"complex operation ({COMPLEX:,} steps), Python method on PyPy object hosts, "
              f"{args.clients} Python clients", f"{tput['spindle complex Python, PyPy']:,.0f} ops/s",
              f"Redis Lua {redis_c:,.0f} ops/s", pypy_ratio, "-", None),
    ])


if __name__ == "__main__":
    main()
