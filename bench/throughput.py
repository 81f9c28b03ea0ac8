"""Throughput vs Redis, the seed's Figure 3, driven by the Rust load generator (``bench/loadgen``).

Starts ``spindle server --object-hosts CORES`` and ``redis-server`` (no persistence, otherwise
its defaults) on free loopback ports, creates the objects, then runs ``spindle-loadgen``
against each system with the same client code, connections, pipelining depth and uniformly
random keys (800 objects, 200 connections, one request in flight per connection by default).
Operations, the same value semantics on both sides (a float64 multiplied by 1.0000001):

* ``incr`` (baseline): ``Counter.add(1)`` vs ``INCRBY key 1``;
* ``multiply`` (simple): one multiplication. Spindle: the built-in ``Array.scale(f)`` on a
  one-element float64 ``Array`` (``Counter`` has no multiply; ``scale`` is the built-in that
  multiplies). Redis has no multiply command (``INCRBY``/``INCRBYFLOAT`` add), so its honest
  peer is a one-line Lua script run with ``EVALSHA``: GET, multiply, SET;
* ``complex``: 10,000 sequential multiplications. Spindle: ``Number.spin(10000, f)``, a
  method of a ``@spindle.shared`` Python class running in an object host; Redis: a Lua script
  (``EVALSHA``) doing the same loop on the key's value;
* ``complex-wasm``: the same, as a compiled (WebAssembly) method running inside the server:
  ``examples/wasm/number.c``'s ``spin(10000, f)`` (``wasm:number``, built by ``make wasm``);
* ``method``: a compiled type's trivial method, ``examples/wasm/bank.c``'s ``deposit(1)``,
  beside ``incr``'s built-in ``Counter.add(1)`` (and Redis' ``INCRBY``).

The (operation, system) runs take turns over several rounds; the table gives the median
ops/s with the min-max over rounds and the Spindle/Redis ratio beside the issue's goal.
Writes the ``throughput`` section of ``docs/benchmarks.md`` and ``docs/img/throughput.png``.
Usage: ``python bench/throughput.py [--no-docs] [--seconds S] [--rounds R] [--baseline BINARY]``
(``QUICK=1``: a few seconds per run). ``--baseline``: also compare this build's ``incr`` with an
older build's, taking turns (``compare_builds``, which bench/limits.py uses too).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
from pathlib import Path

from objects import Running, free_port, redis_cmd
from report import IMG, QUICK, ROOT, Claim, log, machine, print_table, redis_version, summarize, table, update_section

import spindle
from spindle.embedded import find_binary

KEYS = 800
FACTOR = 1.0000001
STEPS = 10_000
OPS = ("incr", "method", "multiply", "complex", "complex-wasm")
# Python methods in CPython object hosts are reported without a goal; compiled ones carry it.
GOALS = {"incr": "baseline", "method": "-", "multiply": "≥ 1.0", "complex": "-", "complex-wasm": "≥ 5.0"}
GOAL_VALUES = {"multiply": 1.0, "complex-wasm": 5.0}
# A compiled method's round trip beside the built-in's: `method` ops/s / `incr` ops/s.
METHOD_GOAL = 1 / 1.2
HOW = {
    "incr": ("built-in `Counter.add(1)`", "`INCRBY key 1`"),
    "method": ("WebAssembly method `deposit(1)` (`examples/wasm/bank.c`)", "`INCRBY key 1`"),
    "multiply": ("built-in `Array.scale(f)` (one float64)", "Lua `EVALSHA`: GET, multiply, SET"),
    "complex": ("Python method, `@spindle.shared`", "Lua `EVALSHA`: GET, 10,000 multiplications, SET"),
    "complex-wasm": ("WebAssembly method `spin(n, f)` (`examples/wasm/number.c`)",
                     "Lua `EVALSHA`: GET, 10,000 multiplications, SET"),
}
# What the load generator runs for each op, on Spindle: its op, object type, method and keys.
LOADGEN = {
    "incr": ("incr", None, None, None),
    "method": ("method", "wasm:bank", "deposit", "obj-"),
    "multiply": ("multiply", None, None, None),
    "complex": ("complex", f"py:{__name__}.Number", "spin", "num-"),
    "complex-wasm": ("complex", "wasm:number", "spin", "wnum-"),
}
WASM_BUILD = ROOT / "examples" / "wasm" / "build"
SYSTEMS = ("spindle", "redis")


@spindle.shared
class Number:
    """A float with the complex operation: ``n`` sequential multiplications by ``f``."""

    def __init__(self, x: float = 1.0) -> None:
        self.x = x

    def spin(self, n: int, f: float) -> float:
        x = self.x
        for _ in range(n):
            x = x * f
        self.x = x
        return x


def loadgen_binary() -> str:
    """Build (a no-op when up to date) and return the release ``spindle-loadgen``."""
    cargo = shutil.which("cargo")
    path = ROOT / "target" / "release" / "spindle-loadgen"
    if cargo:
        subprocess.run([cargo, "build", "--release", "--locked", "--quiet", "-p", "spindle-loadgen"],
                       cwd=ROOT, check=True)
    elif not path.exists():
        sys.exit("error: cargo not found and target/release/spindle-loadgen missing")
    return str(path)


def prepare(ports: dict[str, int]) -> None:
    """The 800 objects of each operation, on both sides, all starting at 1.0 (counters at 0)."""
    import numpy as np
    import redis

    r = redis.Redis(host="127.0.0.1", port=ports["redis"])
    r.flushall()
    r.mset({f"mul-{i}": "1.0" for i in range(KEYS)})
    r.mset({f"num-{i}": "1.0" for i in range(KEYS)})
    r.mset({f"incr-{i}": 0 for i in range(KEYS)})
    r.mset({f"obj-{i}": 0 for i in range(KEYS)})
    r.mset({f"wnum-{i}": "1.0" for i in range(KEYS)})
    spindle.connect(f"127.0.0.1:{ports['spindle']}")
    for path in (WASM_BUILD / "number.wasm", WASM_BUILD / "bank.wasm"):
        if not path.is_file():
            sys.exit(f"error: {path} is missing: run `make wasm`")
    WasmNumber = spindle.wasm_type(WASM_BUILD / "number.wasm")
    Bank = spindle.wasm_type(WASM_BUILD / "bank.wasm")
    for i in range(KEYS):
        spindle.Counter(name=f"incr-{i}")
        a = spindle.Array(1, name=f"mul-{i}")
        a.set(np.ones(1))
        Number(1.0, name=f"num-{i}")
        WasmNumber(1.0, name=f"wnum-{i}")
        Bank(0, name=f"obj-{i}")
    # The Python method and a local loop agree (the Lua script is the same loop in the loadgen).
    check = Number(1.0)
    x = 1.0
    for _ in range(STEPS):
        x *= FACTOR
    assert check.spin(STEPS, FACTOR) == x
    spindle.delete(check)
    compiled = WasmNumber(1.0)
    assert compiled.spin(STEPS, FACTOR) == x
    spindle.delete(compiled)


def run_loadgen(binary: str, system: str, port: int, op: str, args) -> dict:
    loadgen_op, object_type, method, prefix = LOADGEN[op]
    cmd = [binary, "--target", system, "--address", f"127.0.0.1:{port}", "--op", loadgen_op,
           "--connections", str(args.connections), "--pipeline", str(args.pipeline),
           "--keys", str(KEYS), "--seconds", str(args.seconds), "--warmup", str(args.warmup),
           "--factor", repr(FACTOR), "--steps", str(STEPS)]
    if object_type:
        cmd += ["--object-type", object_type, "--method", method, "--key-prefix", prefix]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        sys.exit(f"error: spindle-loadgen failed on {system} {op}: {proc.stderr.strip()}")
    return json.loads(proc.stdout)


def cpu_s(pid: int) -> float:
    """The CPU time ``pid`` has used, user and system, in seconds."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def compare_builds(builds: dict[str, str], args) -> tuple[dict[str, list[float]], dict[str, list[float]]]:
    """``incr`` calls/s and the server's CPU µs per call of each build (name: binary), serving
    the same load (``args``: rounds, seconds, warmup, connections) in rounds that take turns,
    who goes first alternating. The CPU per call is steadier on a machine the load generator
    shares; compare each round's own ratio, since the machine's speed drifts between rounds."""
    load = loadgen_binary()
    rates: dict[str, list[float]] = {build: [] for build in builds}
    cpu_us: dict[str, list[float]] = {build: [] for build in builds}
    running = {}
    try:
        for build, binary in builds.items():
            port = free_port()
            running[build] = Running([binary, "server", "--port", str(port)], port)
            client = spindle.Client(f"127.0.0.1:{port}")
            for i in range(KEYS):
                client.create("Counter", f"incr-{i}", [], False)
            client.close()
        for r in range(args.rounds):
            for build in list(builds)[:: 1 if r % 2 == 0 else -1]:
                pid = running[build].proc.pid
                before = cpu_s(pid)
                cmd = [load, "--target", "spindle", "--address", f"127.0.0.1:{running[build].port}", "--op", "incr",
                       "--connections", str(args.connections), "--keys", str(KEYS), "--seconds", str(args.seconds),
                       "--warmup", str(args.warmup)]
                proc = subprocess.run(cmd, capture_output=True, text=True)
                if proc.returncode != 0:
                    sys.exit(f"error: spindle-loadgen failed on {build}: {proc.stderr.strip()}")
                rate = float(json.loads(proc.stdout)["ops_per_s"])
                # The warm-up's calls are not counted in the rate, but its CPU is: about.
                per_call = (cpu_s(pid) - before) / (rate * (args.seconds + args.warmup)) * 1e6
                log(f"round {r + 1}/{args.rounds}: {build} {rate:,.0f} calls/s, {per_call:.2f} µs CPU/call")
                rates[build].append(rate)
                cpu_us[build].append(per_call)
    finally:
        for server in running.values():
            server.stop()
    return rates, cpu_us


def arithmetic_costs(binary: str, redis_port: int) -> dict[str, float]:
    """µs of one complex operation's arithmetic alone: the Python loop in this process, and the
    Lua script inside Redis (its own ``INFO commandstats``, one connection for one second)."""
    import time

    import redis

    x, reps, t0 = 1.0, 30, time.perf_counter()
    for _ in range(reps):
        for _ in range(STEPS):
            x = x * FACTOR
    python_us = (time.perf_counter() - t0) / reps * 1e6
    r = redis.Redis(host="127.0.0.1", port=redis_port)
    r.config_resetstat()
    subprocess.run([binary, "--target", "redis", "--address", f"127.0.0.1:{redis_port}", "--op", "complex",
                    "--connections", "1", "--keys", str(KEYS), "--seconds", "1", "--warmup", "0",
                    "--factor", repr(FACTOR), "--steps", str(STEPS)], capture_output=True, check=True)
    lua_us = float(r.info("commandstats")["cmdstat_evalsha"]["usec_per_call"])
    return {"python": python_us, "lua": lua_us}


def version(cmd: list[str]) -> str:
    try:
        return subprocess.run(cmd, capture_output=True, text=True, check=False).stdout.strip()
    except OSError:
        return "unknown"


def plot(med: dict, lo: dict, hi: dict, ops: list[str], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    path.parent.mkdir(parents=True, exist_ok=True)
    fig, ax = plt.subplots(figsize=(6.5, 3.8))
    width = 0.38
    for i, system in enumerate(SYSTEMS):
        xs = [j + (i - 0.5) * width for j in range(len(ops))]
        ys = [med[(op, system)] for op in ops]
        err = [[med[(op, system)] - lo[(op, system)] for op in ops],
               [hi[(op, system)] - med[(op, system)] for op in ops]]
        ax.bar(xs, ys, width, yerr=err, capsize=3, label=system)
    ax.set_xticks(range(len(ops)), ops)
    ax.set_yscale("log")
    ax.set_ylabel("operations / s (log scale)")
    ax.set_title("Throughput, 800 objects, 200 connections (median, min-max)")
    ax.legend()
    ax.grid(axis="y", alpha=0.3, which="both")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, help="measured seconds per run (default 5: 15 s over the rounds; "
                    "quick 1.5)")
    ap.add_argument("--warmup", type=float, help="warm-up seconds per run (default 1, quick 0.5)")
    ap.add_argument("--rounds", type=int, help="rounds; the systems take turns (default 3, quick 1)")
    ap.add_argument("--connections", type=int, default=200)
    ap.add_argument("--pipeline", type=int, default=1, help="requests in flight per connection, both systems")
    ap.add_argument("--hosts", type=int, default=os.cpu_count() or 1, help="--object-hosts (default: cores)")
    ap.add_argument("--ops", default=",".join(OPS), help="comma-separated subset of " + ",".join(OPS))
    ap.add_argument("--no-docs", action="store_true", help="print only; do not write docs/benchmarks.md")
    ap.add_argument("--baseline", metavar="BINARY", help="an older spindle binary: compare this build's single "
                    "calls with its, taking turns (goal: at most 5%% lost)")
    args = ap.parse_args()
    args.seconds = args.seconds or (1.5 if QUICK else 5.0)
    args.warmup = args.warmup if args.warmup is not None else (0.5 if QUICK else 1.0)
    args.rounds = args.rounds or (1 if QUICK else 3)
    ops = [op for op in args.ops.split(",") if op]
    if any(op not in OPS for op in ops):
        sys.exit(f"error: --ops takes {','.join(OPS)}")

    log("building spindle-loadgen...")
    binary = loadgen_binary()
    spindle_bin = find_binary()
    ports = {"spindle": free_port(), "redis": free_port()}
    cmds = {"redis": redis_cmd(ports["redis"]),
            "spindle": [spindle_bin, "server", "--port", str(ports["spindle"]), "--object-hosts", str(args.hosts),
                        "--python", sys.executable]}
    servers: dict[str, Running] = {}
    runs: dict[tuple[str, str], list[dict]] = {}
    try:
        for name, cmd in cmds.items():
            servers[name] = Running(cmd, ports[name])
        log(f"creating {KEYS} objects per operation on both systems...")
        prepare(ports)
        for r in range(args.rounds):
            order = SYSTEMS if r % 2 == 0 else SYSTEMS[::-1]
            for op in ops:
                for system in order:
                    log(f"round {r + 1}/{args.rounds}: {op} on {system}, {args.connections} connections, "
                        f"pipeline {args.pipeline}, {args.seconds:g} s...")
                    res = run_loadgen(binary, system, ports[system], op, args)
                    log(f"  {res['ops_per_s']:,.0f} ops/s, p50 {res['p50_us']} µs, p99 {res['p99_us']} µs")
                    runs.setdefault((op, system), []).append(res)
        costs = arithmetic_costs(binary, ports["redis"]) if "complex" in ops else {}
    finally:
        spindle.disconnect()
        for s in servers.values():
            s.stop()

    med = {k: statistics.median(x["ops_per_s"] for x in v) for k, v in runs.items()}
    lo = {k: min(x["ops_per_s"] for x in v) for k, v in runs.items()}
    hi = {k: max(x["ops_per_s"] for x in v) for k, v in runs.items()}
    p50 = {k: statistics.median(x["p50_us"] for x in v) for k, v in runs.items()}
    p99 = {k: statistics.median(x["p99_us"] for x in v) for k, v in runs.items()}
    headers = ["operation", "spindle ops/s (min-max)", "redis ops/s (min-max)", "spindle/redis",
               "goal", "met", "p50 µs s/r", "p99 µs s/r"]
    rows, claims = [], []
    for op in ops:
        s, rd = (op, "spindle"), (op, "redis")
        ratio = med[s] / med[rd]
        goal = GOAL_VALUES.get(op)
        claims.append(Claim(f"{op} throughput, {args.connections} connections, {KEYS} objects", f"{med[s]:,.0f} ops/s",
                            f"Redis {med[rd]:,.0f} ops/s", ratio, GOALS[op] if goal else "-",
                            None if goal is None else ratio >= goal))
        rows.append([op, f"{med[s]:,.0f} ({lo[s]:,.0f}-{hi[s]:,.0f})", f"{med[rd]:,.0f} ({lo[rd]:,.0f}-{hi[rd]:,.0f})",
                     f"{ratio:.2f}", GOALS[op], "-" if goal is None else ("yes" if ratio >= goal else "**no**"),
                     f"{p50[s]:,.0f} / {p50[rd]:,.0f}", f"{p99[s]:,.0f} / {p99[rd]:,.0f}"])
    print_table(headers, rows)
    method_ratio = None
    if "method" in ops and "incr" in ops:
        m, i = med[("method", "spindle")], med[("incr", "spindle")]
        method_ratio = m / i
        claims.append(Claim("WebAssembly method round trip (`deposit(1)`) vs built-in `Counter.add(1)`, "
                            f"{args.connections} connections", f"{m:,.0f} ops/s", f"built-in {i:,.0f} ops/s",
                            method_ratio, "within 1.2x", method_ratio >= METHOD_GOAL))
        log(f"compiled method / built-in: {method_ratio:.3f} (goal ≥ {METHOD_GOAL:.3f})")
    against = compare_builds({"this build": spindle_bin, "baseline": args.baseline}, args) if args.baseline else None
    if against:
        rates, cpu_us = against
        kept = statistics.median(b / a for b, a in zip(rates["this build"], rates["baseline"]))
        log(f"incr, this build / the baseline build: {kept:.3f} (median of the rounds' ratios)")
        claims.append(Claim("incr single calls, this build / the baseline build", f"{statistics.median(rates['this build']):,.0f}/s",
                            f"baseline {statistics.median(rates['baseline']):,.0f}/s", kept, ">= 0.95", kept >= 0.95))
    if costs:
        print(f"one complex operation's arithmetic alone: CPython loop {costs['python']:,.0f} µs, "
              f"Redis Lua {costs['lua']:,.0f} µs (INFO commandstats)")
    if args.no_docs:
        return
    plot(med, lo, hi, ops, IMG / "throughput.png")
    write_docs(args, ops, headers, rows, med, costs, against, method_ratio)
    summarize("throughput", claims)


def write_docs(args, ops, headers, rows, med, costs, against, method_ratio) -> None:
    spindle_v = version([find_binary(), "--version"])
    how = ["| operation | Spindle | Redis |", "|---|---|---|"]
    how += [f"| {op} | {HOW[op][0]} | {HOW[op][1]} |" for op in ops]
    missed = [op for op in ops if op in GOAL_VALUES and med[(op, "spindle")] / med[(op, "redis")] < GOAL_VALUES[op]]
    lines = [
        "## Throughput vs Redis, seed Figure 3 (`bench/throughput.py`)",
        "",
        f"Machine: {machine()}. {redis_version()} "
        f"(no persistence, otherwise its defaults); {spindle_v or 'spindle'} release build with "
        f"`--object-hosts {args.hosts}`. Both driven by the same Rust load generator "
        "(`bench/loadgen`, `spindle-loadgen`) on the same machine: "
        f"{args.connections} connections, {args.pipeline} request(s) in flight per connection, "
        f"{KEYS} objects chosen uniformly at random (seeded), {args.seconds:g} s measured after "
        f"{args.warmup:g} s of warm-up, {args.rounds} rounds in which the systems take turns "
        f"({args.seconds * args.rounds:g} s per system and operation in all; the seed ran 30 s); "
        "median ops/s with the min-max over rounds, latencies are medians over rounds of the "
        "per-run p50 and p99 (Spindle / Redis).",
        "",
        f"Values are floats multiplied by {FACTOR} on both sides (Redis keeps each value as a "
        "string that the script parses with `tonumber` and SETs back on every call; Spindle keeps "
        "a float64). The complex operation is "
        f"{STEPS:,} sequential multiplications.",
        "",
        *how,
        "",
        *table(headers, rows),
        "",
    ]
    if "multiply" in missed:
        lines += [
            "The simple-operation goal (≥ 1.0) is missed in this run: the load generator and both "
            "servers share the machine's cores, so the ratio is the inverse ratio of CPU spent per "
            "request, client and server together; this benchmark does not break that cost down yet.",
            "",
        ]
    if method_ratio is not None:
        lines += [
            f"A WebAssembly method's round trip beside the built-in's (`method` / `incr`, Spindle's ops/s): "
            f"{method_ratio:.2f} (goal: within 1.2x, at least {METHOD_GOAL:.2f}). Each call instantiates "
            "the module afresh (docs/wasm.md), the cost the built-in does not pay.",
            "",
        ]
    if "complex" in ops and costs:
        ratio = med[("complex", "spindle")] / med[("complex", "redis")]
        lines += [
            f"The Python method (`complex`, {ratio:.2f}x, reported without a goal) spends its time in "
            f"CPython in Spindle's object hosts: {costs['python']:,.0f} µs for the {STEPS:,} "
            f"multiplications in a Python loop, against {costs['lua']:,.0f} µs for the same loop in "
            "Redis' Lua (its `INFO commandstats`). The same loop compiled (`complex-wasm`) runs inside "
            "the server; PyPy object hosts are in the shared-objects section.",
            "",
        ]
    if "complex-wasm" in missed:
        ratio = med[("complex-wasm", "spindle")] / med[("complex-wasm", "redis")]
        lines += [
            f"The complex-operation goal (≥ 5.0) is missed by the WebAssembly method: {ratio:.2f}x. The "
            "method runs at native speed: its 10,000 multiplications depend each on the one before, "
            "about 32 µs in the compiled method as in a Rust loop, plus about 7 µs for the call "
            "(a fresh instance, arguments, state and reply; `cargo run --release -p spindle-wasm "
            f"--example call_overhead`). 5x Redis here is {5 * med[('complex-wasm', 'redis')]:,.0f} ops/s, "
            "which at about 39 µs each is more CPU than this machine's 2 cores have, before the "
            "server's own work per call and the load generator's, which share them: the goal needs "
            "a server with more cores (the seed's ran on several), not a faster method.",
            "",
        ]
    if against:
        rates, cpu_us = against
        ratios = [b / a for b, a in zip(rates["this build"], rates["baseline"])]
        cpu = {b: statistics.median(v) for b, v in cpu_us.items()}
        lines += [
            f"This build beside an older one (`--baseline {Path(args.baseline).name}`), `incr` alone, "
            f"{args.rounds} rounds taking turns: this build {statistics.median(rates['this build']):,.0f} calls/s, "
            f"the baseline {statistics.median(rates['baseline']):,.0f}; the rounds' ratios: median "
            f"{statistics.median(ratios):.3f} ({min(ratios):.3f}-{max(ratios):.3f}) (goal: ≥ 0.95). The server's "
            f"CPU per call (median): this build {cpu['this build']:.2f} µs, the baseline {cpu['baseline']:.2f} µs.",
            "",
        ]
    lines += ["![throughput](img/throughput.png)", ""]
    update_section("throughput", "\n".join(lines))


if __name__ == "__main__":
    main()
