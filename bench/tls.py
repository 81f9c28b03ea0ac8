"""The cost of TLS, side by side with Redis over TLS (``redis-server --tls-port``).

Makes a development CA with ``spindle cert``, then starts four servers on free loopback
ports: ``spindle server`` in plaintext and with ``--tls-cert``, ``redis-server`` (no
persistence) in plaintext and with ``--port 0 --tls-port`` on the same certificate
(``--tls-auth-clients no``). From Python (the Spindle SDK and redis-py, whose TLS both
come from the ``ssl`` module, verifying the server against the CA), measures per system:

* **latency**: one client, one ``Counter.add(1)`` / ``INCRBY key 1`` at a time on random keys
  (mean, p50, p99);
* **throughput**: ``CLIENTS`` processes, each one call at a time, for ``SECONDS`` (calls/s);
* **connect**: opening a connection and its first round trip (the TLS handshake's cost).

The systems take turns over rounds; figures are medians over rounds. The ratios that matter
are TLS over plaintext for each system (what TLS costs), and Spindle over Redis with TLS.
Writes the ``tls`` section of ``docs/benchmarks.md`` and ``docs/img/tls.png``. Usage:
``python bench/tls.py [--no-docs] [--rounds R] [--seconds S]`` (``QUICK=1``: short runs).
"""

from __future__ import annotations

import argparse
import multiprocessing
import random
import shutil
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

from objects import Running, free_port, redis_cmd
from report import (IMG, QUICK, Claim, log, machine, print_table, redis_version, sequential_latency,
                    summarize, table, update_section)

import spindle
from spindle.embedded import find_binary

KEYS = 800
SYSTEMS = ("spindle", "spindle-tls", "redis", "redis-tls")


def client_call(system: str, port: int, ca: str):
    """A function doing one increment on key ``i`` through the system's Python client."""
    tls = system.endswith("-tls")
    if system.startswith("spindle"):
        client = spindle.Client(f"127.0.0.1:{port}", tls=ca if tls else False)
        return lambda i: client.call("Counter", f"incr-{i}", "add", [1])
    import redis

    r = redis.Redis(host="127.0.0.1", port=port, ssl=tls, ssl_ca_certs=ca if tls else None)
    return lambda i: r.incrby(f"incr-{i}", 1)


def prepare(system: str, port: int, ca: str) -> None:
    if system.startswith("spindle"):
        client = spindle.Client(f"127.0.0.1:{port}", tls=ca if system.endswith("-tls") else False)
        for i in range(KEYS):
            client.create("Counter", f"incr-{i}", [], False)
        client.close()


def latency(system: str, port: int, ca: str, ops: int) -> dict:
    return sequential_latency(client_call(system, port, ca), KEYS, ops, warmup=1000)


def _load(job: tuple) -> int:
    system, port, ca, seconds, seed = job
    call = client_call(system, port, ca)
    keys = random.Random(seed)
    call(0)
    done, end = 0, time.perf_counter() + seconds
    while time.perf_counter() < end:
        for _ in range(50):
            call(keys.randrange(KEYS))
        done += 50
    return done


def throughput(system: str, port: int, ca: str, clients: int, seconds: float) -> float:
    """Calls/s of ``clients`` processes, each making one call at a time."""
    ctx = multiprocessing.get_context("spawn")
    with ctx.Pool(clients) as pool:
        pool.map(_load, [(system, port, ca, 0.3, i) for i in range(clients)])  # warm up
        t0 = time.perf_counter()
        counts = pool.map(_load, [(system, port, ca, seconds, i) for i in range(clients)])
        return sum(counts) / (time.perf_counter() - t0)


def connect_time(system: str, port: int, ca: str, count: int) -> float:
    """Mean µs to open a connection and get its first answer."""
    tls = system.endswith("-tls")
    context = spindle.tls_context(ca) if tls else None
    t0 = time.perf_counter()
    for _ in range(count):
        if system.startswith("spindle"):
            client = spindle.Client(f"127.0.0.1:{port}", tls=context or False)
            client.ping()
            client.close()
        else:
            import redis

            r = redis.Redis(host="127.0.0.1", port=port, ssl=tls, ssl_ca_certs=ca if tls else None)
            r.ping()
            r.close()
    return (time.perf_counter() - t0) / count * 1e6


def servers(certs: Path) -> dict:
    ca, cert, key = str(certs / "ca.pem"), str(certs / "server.pem"), str(certs / "server-key.pem")
    binary = find_binary()
    ports = {s: free_port() for s in SYSTEMS}
    cmds = {
        "spindle": [binary, "server", "--port", str(ports["spindle"])],
        "spindle-tls": [binary, "server", "--port", str(ports["spindle-tls"]), "--tls-cert", cert, "--tls-key", key,
                        "--tls-ca", ca],
        "redis": redis_cmd(ports["redis"]),
        "redis-tls": redis_cmd(0) + ["--tls-port", str(ports["redis-tls"]), "--tls-cert-file", cert,
                                     "--tls-key-file", key, "--tls-ca-cert-file", ca, "--tls-auth-clients", "no"],
    }
    return {s: Running(cmds[s], ports[s]) for s in SYSTEMS}


def plot(med: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    path.parent.mkdir(parents=True, exist_ok=True)
    fig, axes = plt.subplots(1, 3, figsize=(11, 3.4))
    colors = ["#4c72b0", "#8da0cb", "#dd8452", "#f2b880"]
    for ax, (metric, title) in zip(axes, [("throughput", "calls/s (higher is better)"),
                                          ("p50_us", "p50 latency, µs"), ("connect_us", "connect + first call, µs")]):
        values = [med[s][metric] for s in SYSTEMS]
        ax.bar(SYSTEMS, values, color=colors)
        ax.set_title(title, fontsize=10)
        ax.tick_params(axis="x", labelsize=8)
        for i, v in enumerate(values):
            ax.text(i, v, f"{v:,.0f}", ha="center", va="bottom", fontsize=8)
    fig.suptitle("TLS: Spindle and Redis, plaintext and TLS (Python clients)", fontsize=11)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    log(f"wrote {path}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--no-docs", action="store_true")
    parser.add_argument("--rounds", type=int, default=2 if QUICK else 3)
    parser.add_argument("--seconds", type=float, default=1.0 if QUICK else 4.0)
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--ops", type=int, default=3000 if QUICK else 20000)
    args = parser.parse_args()
    if not shutil.which("redis-server"):
        raise SystemExit("error: redis-server not found; `make bench` installs it")
    certs = Path(tempfile.mkdtemp(prefix="spindle-bench-tls-"))
    subprocess.run([find_binary(), "cert", "--out", str(certs)], check=True, capture_output=True)
    ca = str(certs / "ca.pem")
    running = servers(certs)
    results: dict = {s: [] for s in SYSTEMS}
    try:
        for s in SYSTEMS:
            prepare(s, running[s].port, ca)
        for r in range(args.rounds):
            for s in SYSTEMS:
                log(f"round {r + 1}/{args.rounds}: {s}")
                port = running[s].port
                row = latency(s, port, ca, args.ops)
                row["throughput"] = throughput(s, port, ca, args.clients, args.seconds)
                row["connect_us"] = connect_time(s, port, ca, 100 if QUICK else 300)
                results[s].append(row)
    finally:
        for server in running.values():
            server.stop()
        shutil.rmtree(certs, ignore_errors=True)

    metrics = ("mean_us", "p50_us", "p99_us", "throughput", "connect_us")
    med = {s: {m: statistics.median(r[m] for r in results[s]) for m in metrics} for s in SYSTEMS}
    headers = ["system", "calls/s (min-max)", "latency mean / p50 / p99 (µs)", "connect + first call (µs)"]
    rows = []
    for s in SYSTEMS:
        rates = [r["throughput"] for r in results[s]]
        m = med[s]
        rows.append([s, f"{m['throughput']:,.0f} ({min(rates):,.0f}-{max(rates):,.0f})",
                     f"{m['mean_us']:.1f} / {m['p50_us']:.0f} / {m['p99_us']:.0f}", f"{m['connect_us']:,.0f}"])
    print_table(headers, rows)

    def ratio(a: str, b: str, metric: str) -> float:
        return med[a][metric] / med[b][metric]

    ratio_headers = ["", "Spindle TLS / plaintext", "Redis TLS / plaintext", "Spindle TLS / Redis TLS"]
    ratio_rows = [
        ["throughput", f"{ratio('spindle-tls', 'spindle', 'throughput'):.3f}",
         f"{ratio('redis-tls', 'redis', 'throughput'):.3f}", f"{ratio('spindle-tls', 'redis-tls', 'throughput'):.3f}"],
        ["mean latency", f"{ratio('spindle-tls', 'spindle', 'mean_us'):.3f}",
         f"{ratio('redis-tls', 'redis', 'mean_us'):.3f}", f"{ratio('spindle-tls', 'redis-tls', 'mean_us'):.3f}"],
        ["connect", f"{ratio('spindle-tls', 'spindle', 'connect_us'):.3f}",
         f"{ratio('redis-tls', 'redis', 'connect_us'):.3f}", f"{ratio('spindle-tls', 'redis-tls', 'connect_us'):.3f}"],
    ]
    print_table(ratio_headers, ratio_rows)
    if args.no_docs:
        return
    plot(med, IMG / "tls.png")
    # Above 1: Spindle's TLS costs less, relative to its plaintext, than Redis' does.
    relative = ratio("spindle-tls", "spindle", "throughput") / ratio("redis-tls", "redis", "throughput")
    versus = ratio("spindle-tls", "redis-tls", "throughput")
    claims = [
        Claim("TLS throughput kept (TLS / plaintext), vs Redis'",
              f"{ratio('spindle-tls', 'spindle', 'throughput'):.2f}",
              f"Redis {ratio('redis-tls', 'redis', 'throughput'):.2f}", relative, "-", None),
        Claim("throughput over TLS, Python clients", f"{med['spindle-tls']['throughput']:,.0f}/s",
              f"Redis {med['redis-tls']['throughput']:,.0f}/s", versus, "-", None),
    ]
    lines = [
        "## TLS vs Redis over TLS (`bench/tls.py`)",
        "",
        f"Machine: {machine()}. {redis_version()} (no persistence) with `--tls-port` on the same "
        "development certificate as Spindle's `--tls-cert` (`spindle cert`; ECDSA P-256, TLS 1.3 "
        "on both), clients verifying the server against the CA. Clients in Python (the Spindle SDK "
        "and redis-py, both on the `ssl` module): latency is one client making "
        f"{args.ops:,} `Counter.add(1)` / `INCRBY` calls one at a time on {KEYS} random keys; "
        f"throughput is {args.clients} processes, each one call at a time, for {args.seconds:g} s; "
        "connect is a new connection and its first answer (`ping`), where the handshake shows. "
        f"{args.rounds} round(s), the four servers taking turns; medians over rounds.",
        "",
        *table(headers, rows),
        "",
        *table(ratio_headers, ratio_rows),
        "",
        "A Spindle TLS connection sends its replies through the connection's writer task (a TLS "
        "record cannot be written in part without waiting), where a plaintext one writes them "
        "straight to the socket; encryption itself is a small share of a call's cost at these "
        "sizes. With Python clients both systems are bound by the client's CPU, so this "
        "compares what TLS adds per call on each side; the Rust load generator of "
        "`bench/throughput.py` speaks plaintext only.",
        "",
        "![tls](img/tls.png)",
        "",
    ]
    update_section("tls", "\n".join(lines))
    summarize("tls", claims)


if __name__ == "__main__":
    main()
