"""The cost of authentication and permission checks on the call path (``bench/throughput.py``'s
``incr`` load, driven by the Rust load generator).

Starts ``spindle server`` three ways on free loopback ports: ``open`` (no credential: the
default user), ``token`` (``--token``: the default user, authenticated) and ``user``
(``--token``, and the load says hello as a user whose role has ``RULES`` rules, the one that
grants its keys last, so every call's check walks them all). With ``--baseline BINARY`` (a
build from before users and roles existed) a fourth server, ``baseline``, runs that binary
open. Each server gets the same 800 counters and the same load (200 connections, one
``Counter.add(1)`` in flight each); the servers take turns over rounds, and the table gives
the median calls/s. The goal: permission-checked calls keep at least 0.95 of the open
server's throughput (and of the baseline's, when given). Writes the ``auth`` section of
``docs/benchmarks.md``. Usage: ``python bench/auth.py [--no-docs] [--rounds R] [--seconds S]
[--baseline BINARY]`` (``QUICK=1``: short runs).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys

from objects import Running, free_port
from report import QUICK, Claim, log, machine, print_table, summarize, table, update_section
from throughput import KEYS, loadgen_binary

import spindle
from spindle.embedded import find_binary

TOKEN = "bench-auth-token-0123456789"
RULES = 16
GOAL = 0.95


def credentials(system: str, user_token: str) -> dict:
    """The load generator's environment for ``system``."""
    env = {k: v for k, v in os.environ.items() if k not in ("SPINDLE_USER", "SPINDLE_TOKEN")}
    if system == "token":
        env["SPINDLE_TOKEN"] = TOKEN
    elif system == "user":
        env.update(SPINDLE_USER="bench", SPINDLE_TOKEN=user_token)
    return env


def prepare(system: str, port: int) -> str:
    """Create the counters; for ``user``, the role and the user (its token returned)."""
    address = f"127.0.0.1:{port}"
    token = "" if system in ("open", "baseline") else TOKEN
    env = dict(os.environ, SPINDLE_ADDRESS=address, SPINDLE_TOKEN=token)
    env.pop("SPINDLE_USER", None)
    user_token = ""
    if system == "user":
        rules = [f"read,write,create:other{i}/" for i in range(RULES - 1)] + ["read,write,create:incr-"]
        subprocess.run([find_binary(), "role", "add", "load", *rules], env=env, check=True, capture_output=True)
        out = subprocess.run([find_binary(), "user", "add", "bench", "--role", "load"], env=env, check=True,
                             capture_output=True, text=True)
        user_token = out.stdout.strip()
    os.environ["SPINDLE_TOKEN"] = token
    client = spindle.Client(address)
    for i in range(KEYS):
        client.create("Counter", f"incr-{i}", [], False)
    client.close()
    os.environ.pop("SPINDLE_TOKEN", None)
    return user_token


def run(binary: str, port: int, env: dict, args) -> float:
    cmd = [binary, "--target", "spindle", "--address", f"127.0.0.1:{port}", "--op", "incr",
           "--connections", str(args.connections), "--keys", str(KEYS), "--seconds", str(args.seconds),
           "--warmup", str(args.warmup)]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if proc.returncode != 0:
        sys.exit(f"error: spindle-loadgen failed: {proc.stderr.strip()}")
    return float(json.loads(proc.stdout)["ops_per_s"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--no-docs", action="store_true")
    parser.add_argument("--rounds", type=int, default=2 if QUICK else 5)
    parser.add_argument("--seconds", type=float, default=2.0 if QUICK else 8.0)
    parser.add_argument("--warmup", type=float, default=1.0)
    parser.add_argument("--connections", type=int, default=200)
    parser.add_argument("--baseline", help="a spindle binary from before users and roles, run open")
    args = parser.parse_args()
    log("building spindle-loadgen...")
    load = loadgen_binary()
    systems = ["open", "token", "user"] + (["baseline"] if args.baseline else [])
    binary = find_binary()
    running, tokens = {}, {}
    try:
        for system in systems:
            port = free_port()
            cmd = [args.baseline if system == "baseline" else binary, "server", "--port", str(port)]
            if system in ("token", "user"):
                cmd += ["--token", TOKEN]
            running[system] = Running(cmd, port)
            tokens[system] = prepare(system, port)
        rates: dict = {s: [] for s in systems}
        for r in range(args.rounds):
            for system in systems:
                rate = run(load, running[system].port, credentials(system, tokens[system]), args)
                log(f"round {r + 1}/{args.rounds}: {system} {rate:,.0f} calls/s")
                rates[system].append(rate)
    finally:
        for server in running.values():
            server.stop()
    med = {s: statistics.median(rates[s]) for s in systems}
    headers = ["server", "calls/s, median (min-max)", "vs open"] + (["vs baseline"] if args.baseline else [])
    rows = []
    for s in systems:
        row = [s, f"{med[s]:,.0f} ({min(rates[s]):,.0f}-{max(rates[s]):,.0f})", f"{med[s] / med['open']:.3f}"]
        if args.baseline:
            row.append(f"{med[s] / med['baseline']:.3f}")
        rows.append(row)
    print_table(headers, rows)
    if args.no_docs:
        return
    kept = med["user"] / med["open"]
    claims = [Claim(f"permission-checked calls ({RULES} rules) / open server", f"{med['user']:,.0f}/s",
                    f"open {med['open']:,.0f}/s", kept, f">= {GOAL}", kept >= GOAL)]
    if args.baseline:
        vs = med["user"] / med["baseline"]
        claims.append(Claim("permission-checked calls / build before users", f"{med['user']:,.0f}/s",
                            f"before {med['baseline']:,.0f}/s", vs, f">= {GOAL}", vs >= GOAL))
    lines = [
        "## Authentication and permissions (`bench/auth.py`)",
        "",
        f"Machine: {machine()}. `spindle-loadgen --op incr`, {args.connections} connections, one "
        f"`Counter.add(1)` in flight each, {KEYS} counters, {args.seconds:g} s per run after "
        f"{args.warmup:g} s of warm-up, {args.rounds} rounds with the servers taking turns. "
        "`open`: no credential (the default user); `token`: `--token`; `user`: a user whose role "
        f"has {RULES} rules, the one granting its keys last"
        + ("; `baseline`: the build before users and roles, open." if args.baseline else "."),
        "",
        *table(headers, rows),
        "",
        "Credentials are checked once per connection (`hello`); each call then passes the "
        "permission gate (its user's rules, read again only after a change of users or roles) "
        "and has its pickles stamped, which for calls without pickles is a walk of the arguments. "
        "Read the medians beside each row's min-max: a difference smaller than the spread "
        "between rounds is noise of the shared 2-core machine, not a cost.",
        "",
    ]
    update_section("auth", "\n".join(lines))
    summarize("auth", claims)


if __name__ == "__main__":
    main()
