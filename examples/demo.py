"""Several processes share counters, a dictionary and a barrier.

Each worker process throws darts to estimate pi and counts the words of its slice of a text,
adding both to shared objects with one call each (the additions run in the server). A barrier
then holds everyone until every count is in, after which each worker reads the finished totals
to work out its own share. Run it with `make demo`, or `python examples/demo.py [WORKERS]`:
with no server running, `spindle.connect()` starts an embedded one for the program's life.
"""

from __future__ import annotations

import codecs
import contextlib
import io
import multiprocessing as mp
import random
import re
import sys
from collections import Counter as LocalCounter

import spindle

DARTS = 200_000


def zen_of_python() -> list[str]:
    with contextlib.redirect_stdout(io.StringIO()):
        import this
    return re.findall(r"[a-z']+", codecs.decode(this.s, "rot13").lower())


def worker(rank: int, workers: int, hits: spindle.Counter, darts: spindle.Counter,
           words: spindle.Dict, barrier: spindle.Barrier, shares: spindle.Dict) -> None:
    rng = random.Random(rank)
    inside = sum(rng.random() ** 2 + rng.random() ** 2 <= 1.0 for _ in range(DARTS))
    hits.add(inside)
    darts.add(DARTS)

    text = zen_of_python()
    mine = LocalCounter(text[rank::workers])
    words.merge_many(dict(mine), op="sum")

    barrier.wait()  # past this point every worker's counts are in
    total = sum(words.values())
    shares[rank] = sum(mine.values()) / total


def main() -> None:
    workers = int(sys.argv[1]) if len(sys.argv) > 1 else 4
    spindle.connect()
    hits, darts = spindle.Counter(), spindle.Counter()
    words, shares = spindle.Dict(), spindle.Dict()
    barrier = spindle.Barrier(workers)

    procs = [mp.Process(target=worker, args=(r, workers, hits, darts, words, barrier, shares))
             for r in range(workers)]
    for p in procs:
        p.start()
    for p in procs:
        p.join()
    if any(p.exitcode for p in procs):
        sys.exit(f"a worker failed: exit codes {[p.exitcode for p in procs]}")

    print(f"{workers} processes threw {darts.get():,} darts: pi ≈ {4 * hits.get() / darts.get():.4f}")
    top = sorted(words.items(), key=lambda kv: (-kv[1], kv[0]))[:5]
    print(f"{len(words)} distinct words in the Zen of Python; most common: "
          + ", ".join(f"{w} ({n})" for w, n in top))
    print("each worker's share of the words: "
          + ", ".join(f"#{r} {shares[r]:.0%}" for r in sorted(shares.keys())))
    status = spindle.status()
    print(f"server {status['address']}: {status['calls']:,} calls served")


if __name__ == "__main__":
    main()
