"""A counter increment over HTTP: Spindle's HTTP front end against Webdis in front of Redis,
with Spindle's native protocol beside them.

Starts ``spindle server --http-port``, ``redis-server`` (no persistence) and ``webdis`` (its
HTTP front end, pointed at that Redis) on free loopback ports. Several client processes each
hold one keep-alive connection and make one request at a time for a fixed time:

* **spindle http**: ``POST /v1/objects/hits/add`` with ``{"args": [1]}`` (docs/http.md);
* **webdis**: ``GET /INCR/hits`` (Webdis' URL form of the Redis command);
* **spindle native**: ``Counter.add(1)`` through the Python SDK (one connection per process).

Both HTTP systems are driven by the same minimal client (a raw socket, a request built once,
the answer read by its ``Content-Length``), so the difference is the servers'. Reports the
requests per second of all processes together and the median latency (p50), over rounds in
which the systems take turns. Writes the ``http`` section of ``docs/benchmarks.md``. Usage:
``python bench/http_front.py [--clients N] [--no-docs]`` (``QUICK=1``: short runs).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time

from objects import Running, free_port, redis_cmd, stop_process, wait_for_port
from report import QUICK, Claim, log, machine, percentile, print_table, summarize, table, update_section

import spindle
from spindle.embedded import find_binary

SYSTEMS = ("spindle http", "webdis", "spindle native")
KEY = "hits"
GOAL = 1.0  # Spindle's HTTP rate at least Webdis'


def http_request(system: str, host: str) -> bytes:
    """The request bytes of one increment, built once."""
    if system == "webdis":
        return f"GET /INCR/{KEY} HTTP/1.1\r\nHost: {host}\r\n\r\n".encode()
    body = b'{"args": [1]}'
    return (f"POST /v1/objects/{KEY}/add HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n\r\n").encode() + body


def http_client(system: str, port: int, seconds: float, start_at: float, out) -> None:
    """One keep-alive connection, one request at a time until ``seconds`` pass."""
    request = http_request(system, f"127.0.0.1:{port}")
    sock = socket.create_connection(("127.0.0.1", port))
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    buf = b""

    def one() -> None:
        nonlocal buf
        sock.sendall(request)
        while True:
            head, sep, rest = buf.partition(b"\r\n\r\n")
            if sep:
                lower = head.lower()
                at = lower.index(b"content-length:") + len(b"content-length:")
                length = int(lower[at:lower.index(b"\r\n", at) if b"\r\n" in lower[at:] else None])
                if len(rest) >= length:
                    if not head.startswith(b"HTTP/1.1 200"):
                        raise RuntimeError(f"{system}: {head[:80]!r}")
                    buf = rest[length:]
                    return
            chunk = sock.recv(65536)
            if not chunk:
                raise RuntimeError(f"{system} closed the connection")
            buf += chunk

    measure(one, seconds, start_at, out)
    sock.close()


def native_client(port: int, seconds: float, start_at: float, out) -> None:
    spindle.connect(f"127.0.0.1:{port}", embedded=False)
    counter = spindle.Counter(name=KEY)
    measure(lambda: counter.add(1), seconds, start_at, out)
    spindle.disconnect()


def measure(call, seconds: float, start_at: float, out) -> None:
    """Run ``call`` from ``start_at`` (after a warm-up) for ``seconds``: send ``(count, latencies)``."""
    for _ in range(200):
        call()
    while time.time() < start_at:
        time.sleep(0.001)
    latencies = []
    end = start_at + seconds
    clock = time.perf_counter
    while time.time() < end:
        t0 = clock()
        call()
        latencies.append(clock() - t0)
    out.put((len(latencies), latencies))


def run(system: str, ports: dict[str, int], clients: int, seconds: float) -> dict:
    """Requests per second (all clients) and latency percentiles in µs of one timed run."""
    ctx = multiprocessing.get_context("fork")
    out = ctx.Queue()
    start_at = time.time() + 1.0 + 0.05 * clients
    procs = []
    for _ in range(clients):
        if system == "spindle native":
            target, args = native_client, (ports[system], seconds, start_at, out)
        else:
            target, args = http_client, (system, ports[system], seconds, start_at, out)
        p = ctx.Process(target=target, args=args)
        p.start()
        procs.append(p)
    results = [out.get(timeout=seconds + 60) for _ in procs]
    for p in procs:
        p.join()
    samples = [s for _, lat in results for s in lat]
    return {
        "rate": sum(n for n, _ in results) / seconds,
        "p50_us": percentile(samples, 0.5) * 1e6,
        "p99_us": percentile(samples, 0.99) * 1e6,
    }


def redis_server_version() -> str:
    """`Redis 7.0.15` (the redis-server on PATH; no Python client of it takes part here)."""
    out = subprocess.run([shutil.which("redis-server") or "redis-server", "--version"],
                         capture_output=True, text=True).stdout.split()
    return f"Redis {next((w[2:] for w in out if w.startswith('v=')), '?')}"


def webdis_version() -> str:
    out = subprocess.run(["dpkg-query", "-W", "-f", "${Version}", "webdis"], capture_output=True, text=True)
    return f"Webdis {out.stdout.strip() or 'unknown version'}"


class Webdis:
    """``webdis`` in the foreground on ``port``, in front of Redis on ``redis_port``."""

    def __init__(self, port: int, redis_port: int) -> None:
        binary = shutil.which("webdis")
        if not binary:
            sys.exit("error: webdis not found; `apt-get install webdis redis-server`")
        self.dir = tempfile.mkdtemp(prefix="spindle-bench-webdis-")
        config = os.path.join(self.dir, "webdis.json")
        with open(config, "w") as f:
            json.dump({"redis_host": "127.0.0.1", "redis_port": redis_port, "http_host": "127.0.0.1",
                       "http_port": port, "threads": 2, "pool_size": 20, "daemonize": False, "database": 0,
                       "verbosity": 0, "logfile": os.path.join(self.dir, "webdis.log")}, f)
        self.proc = subprocess.Popen([binary, config], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait_for_port(port, self.proc)

    def stop(self) -> None:
        stop_process(self.proc)
        shutil.rmtree(self.dir, True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--clients", type=int, default=4, help="client processes (one connection each)")
    ap.add_argument("--no-docs", action="store_true", help="print only; do not write docs/benchmarks.md")
    args = ap.parse_args()
    rounds, seconds = (1, 1.0) if QUICK else (3, 5.0)

    native, web, redis_port, webdis_port = free_port(), free_port(), free_port(), free_port()
    ports = {"spindle http": web, "spindle native": native, "webdis": webdis_port}
    servers = []
    results: dict[str, list[dict]] = {}
    try:
        servers.append(Running([find_binary(), "server", "--port", str(native), "--http-port", str(web)], native))
        wait_for_port(web, servers[0].proc)
        servers.append(Running(redis_cmd(redis_port), redis_port))
        servers.append(Webdis(webdis_port, redis_port))
        spindle.connect(f"127.0.0.1:{native}", embedded=False)
        spindle.Counter(name=KEY)
        spindle.disconnect()
        for r in range(rounds):
            order = SYSTEMS if r % 2 == 0 else SYSTEMS[::-1]
            for system in order:
                log(f"round {r + 1}/{rounds}: {system}, {args.clients} clients, {seconds:g} s...")
                results.setdefault(system, []).append(run(system, ports, args.clients, seconds))
    finally:
        for s in servers:
            s.stop()

    med = {k: {q: statistics.median(r[q] for r in v) for q in ("rate", "p50_us", "p99_us")}
           for k, v in results.items()}
    headers = ["system", "requests/s (min-max)", "p50 (µs)", "p99 (µs)"]
    rows = [[system, f"{med[system]['rate']:,.0f} ({min(r['rate'] for r in results[system]):,.0f}-"
                     f"{max(r['rate'] for r in results[system]):,.0f})",
             f"{med[system]['p50_us']:.0f}", f"{med[system]['p99_us']:.0f}"] for system in SYSTEMS]
    ratio = med["spindle http"]["rate"] / med["webdis"]["rate"]
    print_table(headers, rows)
    print(f"spindle http / webdis requests per second: {ratio:.2f} (goal ≥ {GOAL})")
    if args.no_docs:
        return
    lines = [
        "## A counter over HTTP vs Webdis (`bench/http_front.py`)",
        "",
        f"Machine: {machine()}. {webdis_version()} in front of {redis_server_version()} (no persistence); "
        f"spindle release build. {args.clients} client processes, each with one keep-alive connection "
        f"making one request at a time for {seconds:g} s (after a warm-up): `POST "
        "/v1/objects/hits/add` with `{\"args\": [1]}` (Spindle's HTTP front end, docs/http.md) "
        "against `GET /INCR/hits` (Webdis), both from the same raw-socket client; and "
        "`Counter.add(1)` through the Python SDK over the native protocol. "
        f"{rounds} round(s), the systems taking turns; figures are medians over rounds. Goal: "
        "Spindle's HTTP requests per second at least Webdis'.",
        "",
        *table(headers, rows),
        "",
        f"Spindle HTTP over Webdis: {ratio:.2f}x (goal >= {GOAL:g}x). Both HTTP servers parse each "
        "request and answer JSON; Spindle's runs the increment in its own process, where Webdis "
        "forwards it to Redis over a second connection. The native protocol's figure comes from the "
        "Python SDK, whose client costs more per call than the raw-socket HTTP client.",
        "",
    ]
    update_section("http", "\n".join(lines))
    summarize("http", [Claim(f"counter increment over HTTP, {args.clients} clients",
                             f"{med['spindle http']['rate']:,.0f} req/s",
                             f"Webdis {med['webdis']['rate']:,.0f} req/s", ratio, f">= {GOAL:g}x", ratio >= GOAL)])


if __name__ == "__main__":
    main()
