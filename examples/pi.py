"""Monte Carlo estimation of pi with cloud threads (CRUCIAL, Listing 1).

Every `spindle.Thread` runs `estimate` as a function on the platform's worker pool; each
throws its darts locally and adds its hits to one shared `Counter`, a single call whose
addition runs in the server. The main program reads the total once every thread is done.

    spindle run examples/pi.py [--threads 4] [--points 10_000_000]
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import numpy as np

import spindle

BATCH = 1_000_000  # darts per NumPy step: bounded memory whatever --points says


def estimate(points: int, seed: int, inside: spindle.Counter) -> None:
    """One cloud thread: throw `points` darts and add the hits to the shared counter."""
    rng = np.random.default_rng(seed)
    hits = 0
    for start in range(0, points, BATCH):
        n = min(BATCH, points - start)
        x, y = rng.random(n), rng.random(n)
        hits += int(np.count_nonzero(x * x + y * y <= 1.0))
    inside.add(hits)  # counter.addAndGet(count): one round trip, added in the server


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=4, help="cloud threads (default 4)")
    ap.add_argument("--points", type=int, default=10_000_000, help="darts per thread")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", action="store_true", help="also print the result as JSON")
    args = ap.parse_args()

    spindle.connect()
    inside = spindle.Counter()  # shared: every thread adds to the same object
    threads = [spindle.Thread(target=estimate, args=(args.points, args.seed + i, inside),
                              name=f"pi-{i}")
               for i in range(args.threads)]
    print(f"{args.threads} cloud threads x {args.points:,} points", file=sys.stderr)
    start = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    elapsed = time.perf_counter() - start

    total = args.threads * args.points
    pi = 4.0 * inside.get() / total
    print(f"pi ≈ {pi:.6f} (error {abs(pi - np.pi):.2e}) from {total:,} points "
          f"in {elapsed:.2f} s: {total / elapsed:,.0f} points/s")
    if args.json:
        print(json.dumps({"pi": pi, "points": total, "threads": args.threads,
                          "seconds": elapsed, "points_per_s": total / elapsed}))


if __name__ == "__main__":
    main()
