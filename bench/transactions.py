"""Transactions, Spindle beside Redis: transfers between two accounts, each a read of the
source's balance and a move of a random amount if it suffices, by 16 client processes, over
1,000 accounts (low contention) and 10 (high contention).

Contenders, each counting committed transfers per second:

* Spindle: ``@spindle.transactional`` (``src.get()``, ``src.add(-n)``, ``dst.add(n)``, commit;
  retried on conflict with backoff);
* Redis ``WATCH``/``MULTI``/``EXEC`` (redis-py's pipeline: ``WATCH src dst``, ``GET src``, then
  ``MULTI``, ``DECRBY``, ``INCRBY``, ``EXEC`` in one round trip; retried on ``WatchError``);
* a Redis Lua script doing the whole transfer in one call (``EVALSHA``).

Goals (the issue's): Spindle at least 2x Redis ``WATCH``/``MULTI`` at both contention levels
and at least 0.5x the Lua script. Also reported: the share of Spindle's attempts that
conflicted.

In a cluster: the same transfers on 3 nodes (``rf = 3``, persistent accounts, ``--fsync
always``), between two accounts of one shard (one Raft entry) and of two shards (two-phase
commit), committed transfers/s and each transfer's p50/p99 latency, side by side.

Writes the ``transactions`` section of ``docs/benchmarks.md`` and
``docs/img/transactions.png``. Usage: ``python bench/transactions.py [--no-docs]
[--seconds S] [--clients N] [--no-cluster]`` (``QUICK=1``: short runs). Needs ``redis-server``.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import random
import shutil
import statistics
import tempfile
import time
from pathlib import Path

from objects import Running, free_port, redis_cmd, spindle_cmd
from report import (IMG, QUICK, Claim, log, machine, percentile, print_table, redis_version, summarize, table,
                    update_section)

ACCOUNTS = [1000, 10]
BALANCE = 1_000_000_000  # never short: every transfer moves money
ROUNDS = 1 if QUICK else 3


def move(src, dst, amount: int) -> bool:
    """A transfer's body: read the source's balance, move ``amount`` if it suffices."""
    if src.get() < amount:
        return False
    src.add(-amount)
    dst.add(amount)
    return True


def spindle_transfer(port: int, accounts: int):
    import spindle

    spindle.connect(f"127.0.0.1:{port}", embedded=False)
    names = [spindle.Counter(BALANCE, name=f"acct:{i}") for i in range(accounts)]

    transfer = spindle.transactional(move)

    def one(rng: random.Random) -> None:
        src, dst = rng.sample(names, 2)
        transfer(src, dst, rng.randint(1, 10))

    return one


def redis_multi_transfer(port: int, accounts: int):
    import redis

    r = redis.Redis(host="127.0.0.1", port=port)
    keys = [f"acct:{i}" for i in range(accounts)]
    pipe = r.pipeline()

    def one(rng: random.Random) -> None:
        src, dst = rng.sample(keys, 2)
        amount = rng.randint(1, 10)
        while True:
            try:
                pipe.watch(src, dst)
                if int(pipe.get(src)) < amount:
                    pipe.unwatch()
                    return
                pipe.multi()
                pipe.decrby(src, amount)
                pipe.incrby(dst, amount)
                pipe.execute()
                return
            except redis.WatchError:
                continue
            finally:
                pipe.reset()

    return one


LUA = """
local balance = tonumber(redis.call('GET', KEYS[1]))
if balance < tonumber(ARGV[1]) then return 0 end
redis.call('DECRBY', KEYS[1], ARGV[1])
redis.call('INCRBY', KEYS[2], ARGV[1])
return 1
"""


def redis_lua_transfer(port: int, accounts: int):
    import redis

    r = redis.Redis(host="127.0.0.1", port=port)
    keys = [f"acct:{i}" for i in range(accounts)]
    script = r.register_script(LUA)

    def one(rng: random.Random) -> None:
        src, dst = rng.sample(keys, 2)
        script(keys=[src, dst], args=[rng.randint(1, 10)])

    return one


SYSTEMS = {
    "spindle": spindle_transfer,
    "redis WATCH/MULTI": redis_multi_transfer,
    "redis Lua": redis_lua_transfer,
}


def _worker(system: str, port: int, accounts: int, seed: int, seconds: float, start_at: float, out) -> None:
    one = SYSTEMS[system](port, accounts)
    rng = random.Random(seed)
    one(rng)
    while time.time() < start_at:
        time.sleep(0.001)
    n, stop = 0, start_at + seconds
    while time.time() < stop:
        for _ in range(10):
            one(rng)
        n += 10
    out.put(n)


CLUSTER_ACCOUNTS = 100
CLUSTER_KINDS = ("one shard", "two shards")


def _cluster_worker(addresses: str, kind: str, seed: int, seconds: float, start_at: float, out) -> None:
    """Transfers between two accounts of one shard, or of two, until ``seconds`` have passed
    after ``start_at``: puts ``(count, latencies in µs)``."""
    import spindle
    from cluster import SHARDS
    from spindle.client import shard_of

    spindle.connect(addresses, embedded=False)
    names = [f"cacct:{i}" for i in range(CLUSTER_ACCOUNTS)]
    by_shard: dict[int, list] = {}
    for name in names:
        by_shard.setdefault(shard_of(name, SHARDS), []).append(spindle.Counter(BALANCE, name=name, persistent=True))
    shards = [s for s, accounts in by_shard.items() if len(accounts) >= 2]

    transfer = spindle.transactional(move)

    rng = random.Random(seed)

    def pair() -> tuple:
        if kind == "one shard":
            return tuple(rng.sample(by_shard[rng.choice(shards)], 2))
        a, b = rng.sample(list(by_shard), 2)
        return rng.choice(by_shard[a]), rng.choice(by_shard[b])

    transfer(*pair(), 1)
    while time.time() < start_at:
        time.sleep(0.001)
    latencies, stop = [], start_at + seconds
    while time.time() < stop:
        begun = time.perf_counter()
        transfer(*pair(), rng.randint(1, 10))
        latencies.append((time.perf_counter() - begun) * 1e6)
    out.put((len(latencies), latencies))


def cluster_runs(clients: int, seconds: float) -> dict[str, dict]:
    """Per kind of transfer: transfers/s and p50/p99 latency (µs) on a 3-node cluster."""
    from cluster import LocalCluster

    root = Path(tempfile.mkdtemp(prefix="spindle-bench-transactions-"))
    cluster = LocalCluster(root, rf=3, fsync="always")
    results = {}
    try:
        for kind in CLUSTER_KINDS:
            ctx = mp.get_context("fork")
            out = ctx.Queue()
            start_at = time.time() + 2.0 + 0.1 * clients
            procs = [ctx.Process(target=_cluster_worker, args=(cluster.addresses, kind, i, seconds, start_at, out))
                     for i in range(clients)]
            for p in procs:
                p.start()
            got = [out.get(timeout=seconds + 120) for _ in procs]
            for p in procs:
                p.join()
            latencies = sorted(x for _, lat in got for x in lat)
            results[kind] = {"rate": sum(n for n, _ in got) / seconds, "p50": percentile(latencies, 0.5),
                             "p99": percentile(latencies, 0.99)}
            log(f"cluster, {kind}: {results[kind]['rate']:,.0f} transfers/s, p50 {results[kind]['p50']:,.0f} µs, "
                f"p99 {results[kind]['p99']:,.0f} µs")
    finally:
        cluster.stop()
        shutil.rmtree(root, ignore_errors=True)
    return results


def setup_redis(port: int, accounts: int) -> None:
    import redis

    r = redis.Redis(host="127.0.0.1", port=port)
    r.flushall()
    r.mset({f"acct:{i}": BALANCE for i in range(accounts)})


def transfers_per_s(system: str, port: int, accounts: int, clients: int, seconds: float) -> float:
    ctx = mp.get_context("fork")
    out = ctx.Queue()
    start_at = time.time() + 1.0 + 0.1 * clients
    procs = [ctx.Process(target=_worker, args=(system, port, accounts, i, seconds, start_at, out))
             for i in range(clients)]
    for p in procs:
        p.start()
    total = sum(out.get(timeout=seconds + 120) for _ in procs)
    for p in procs:
        p.join()
    return total / seconds


def spindle_status(port: int) -> dict:
    import spindle

    return spindle.Client(f"127.0.0.1:{port}").status()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--no-docs", action="store_true", help="print only; do not touch docs/")
    parser.add_argument("--seconds", type=float, default=2.0 if QUICK else 10.0)
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--no-cluster", action="store_true", help="skip the 3-node cluster's transfers")
    args = parser.parse_args()
    results: dict[tuple[str, int], list[float]] = {}
    conflict_share: dict[int, list[float]] = {}
    for accounts in ACCOUNTS:
        for round_ in range(ROUNDS):
            for system in SYSTEMS:
                port = free_port()
                server = Running(spindle_cmd(port) if system == "spindle" else redis_cmd(port), port)
                try:
                    if system != "spindle":
                        setup_redis(port, accounts)
                    rate = transfers_per_s(system, port, accounts, args.clients, args.seconds)
                    if system == "spindle":
                        status = spindle_status(port)
                        attempts = status["transactions_committed"] + status["transactions_aborted"]
                        conflict_share.setdefault(accounts, []).append(status["transactions_aborted"] / max(attempts, 1))
                finally:
                    server.stop()
                results.setdefault((system, accounts), []).append(rate)
                log(f"{accounts} accounts, round {round_ + 1}: {system} {rate:,.0f} transfers/s")
    median = {k: statistics.median(v) for k, v in results.items()}
    rows = []
    for accounts in ACCOUNTS:
        s, m, lua = (median[(name, accounts)] for name in SYSTEMS)
        rows.append([f"{accounts:,}", f"{s:,.0f}", f"{m:,.0f}", f"{lua:,.0f}", f"{s / m:.2f}x",
                     f"{s / lua:.2f}x", f"{statistics.median(conflict_share[accounts]):.0%}"])
    headers = ["accounts", "spindle transfers/s", "redis WATCH/MULTI", "redis Lua", "vs WATCH/MULTI",
               "vs Lua", "spindle attempts aborted"]
    print_table(headers, rows)
    in_cluster = {} if args.no_cluster else cluster_runs(args.clients, args.seconds)
    cluster_headers = ["accounts of", "transfers/s", "p50 µs", "p99 µs"]
    cluster_rows = [[kind, f"{r['rate']:,.0f}", f"{r['p50']:,.0f}", f"{r['p99']:,.0f}"] for kind, r in in_cluster.items()]
    if cluster_rows:
        print_table(cluster_headers, cluster_rows)
    claims = []
    for accounts in ACCOUNTS:
        s, m, lua = (median[(name, accounts)] for name in SYSTEMS)
        contention = "low" if accounts >= 100 else "high"
        claims.append(Claim(f"transfers, {accounts:,} accounts ({contention} contention) vs WATCH/MULTI",
                            f"{s:,.0f}/s", f"{m:,.0f}/s", s / m, ">= 2x", s / m >= 2))
        claims.append(Claim(f"transfers, {accounts:,} accounts ({contention} contention) vs Lua",
                            f"{s:,.0f}/s", f"{lua:,.0f}/s", s / lua, ">= 0.5x", s / lua >= 0.5))
    if args.no_docs:
        return
    image = plot(median)
    update_section("transactions", "\n".join([
        "## Transactions",
        "",
        f"{machine()}; {redis_version()}. Transfers between two random accounts (read the "
        f"source's balance, move 1 to 10 if it suffices) by {args.clients} client processes for "
        f"{args.seconds:.0f} s, median of {ROUNDS} rounds; each system on a fresh server. Spindle: "
        "`@spindle.transactional` (four round trips: two adds, a read and the commit; retried on "
        "conflict); Redis `WATCH`/`MULTI`/`EXEC` through redis-py's pipeline (three round trips, "
        "retried on `WatchError`); a Redis Lua script (one round trip, no isolation to manage). "
        "Single server (`bench/transactions.py`).",
        "",
        *table(headers, rows),
        "",
        *misses(median, rows),
        f"![transfers per second]({image})",
        *([
            "",
            f"In a 3-node cluster (`rf = 3`, {CLUSTER_ACCOUNTS} persistent accounts, `--fsync always`; "
            f"{args.clients} client processes for {args.seconds:.0f} s, one run): transfers between two "
            "accounts of one shard commit in one Raft entry; between two shards, by two-phase commit "
            "(a prepare entry in each shard's group, the decision in the coordinator's, then the "
            "decide entries).",
            "",
            *table(cluster_headers, cluster_rows),
        ] if cluster_rows else []),
    ]))
    summarize("transactions", claims)


def misses(median: dict[tuple[str, int], float], rows: list[list[str]]) -> list[str]:
    """Why the goals this run missed are missed, and what would meet them."""
    said = []
    low, high = ACCOUNTS
    if median[("spindle", low)] < 2 * median[("redis WATCH/MULTI", low)]:
        said.append(
            f"At low contention the 2x goal over `WATCH`/`MULTI` is missed ({rows[0][4]}): a transfer "
            "driven from the client costs Spindle four round trips against three, and on this machine "
            "the 16 Python clients and the server share two cores, so transfers/s follow the CPU a "
            "transfer costs, client and server together, more than how each system isolates it.")
    if median[("spindle", high)] < 0.5 * median[("redis Lua", high)]:
        said.append(
            f"At high contention Spindle reaches {rows[1][5]} of the Lua script: a transaction holds "
            "its accounts from its first read to its commit, four round trips, while the others that "
            "want them wait (wound-wait), and an older one takes an account from a younger one, "
            f"which is aborted ({rows[1][6]} of attempts); the Lua script holds nothing across round "
            "trips, since it runs whole inside Redis. What would meet 0.5x Lua: running the "
            "transaction's body next to the data, as LambdaStore does (a transactional method in an "
            "object host, or compiled to WebAssembly), so it holds its objects for microseconds "
            "instead of round trips.")
    return [" ".join(said), ""] if said else []


def plot(median: dict[tuple[str, int], float]) -> str:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 3.5))
    width = 0.25
    for i, system in enumerate(SYSTEMS):
        xs = [j + (i - 1) * width for j in range(len(ACCOUNTS))]
        ax.bar(xs, [median[(system, a)] for a in ACCOUNTS], width, label=system)
    ax.set_xticks(range(len(ACCOUNTS)), [f"{a:,} accounts" for a in ACCOUNTS])
    ax.set_ylabel("committed transfers / s")
    ax.set_title("Transfers between two accounts, 16 clients")
    ax.legend()
    fig.tight_layout()
    IMG.mkdir(parents=True, exist_ok=True)
    fig.savefig(IMG / "transactions.png", dpi=120)
    return "img/transactions.png"


if __name__ == "__main__":
    main()
