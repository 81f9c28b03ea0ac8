"""Scale-up with 1 to 8 workers on this machine's cores, the seed's Figure 4a and 4c.

Both experiments are weak scaling, as in the seed: each cloud thread gets the same amount of
work, so W threads do W times the work of one.

* Monte Carlo pi (examples/pi.py, Listing 1; Figure 4a): W cloud threads on a pool of W
  workers (`spindle run --max-workers W`), a fixed number of points per thread; total points
  per second, speed-up over 1 worker and efficiency. The time examples/pi.py measures includes
  starting the workers, so the same run with 1,000 points per thread gives that start-up.
  Peer: the same loop (`estimate`) called in this one Python process, on one thread's points.
* k-means (examples/kmeans.py, Listing 5 with the @spindle.shared GlobalCentroids; Figure 4c):
  W cloud threads on a pool of W workers, a fixed number of points per thread ("the input
  increases proportionally to the number of threads"); mean time per iteration (the first
  left out, as bench/ml.py does), the seed's scale-up T1/TW (the efficiency) and the speed-up
  W x T1/TW. Peer: the same algorithm in one NumPy process on one core (`--local`) on the data
  of 1 and of 2 threads. BLAS is limited to one thread per cloud thread (threadpoolctl in the
  example, OMP/OpenBLAS/MKL variables for the workers).

With more workers than cores the speed-up cannot exceed the number of cores; the tables give
that ceiling. The runs take turns for `--rounds` rounds; each figure is the median, with the
min-max. Prints the tables, rewrites the "scaling" section of docs/benchmarks.md with
docs/img/scaling.png, and records the summary's claims. ``QUICK=1``: 1 and 2 workers, one
round, small sizes (report in target/bench-quick/).

Usage: python bench/scaling.py [--workers 1 2 4 8] [--rounds 3] [--no-docs]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

from report import IMG, QUICK, ROOT, Claim, log, machine, print_table, summarize, table, update_section

sys.path.insert(0, str(ROOT / "examples"))
import pi as pi_example  # noqa: E402  (Listing 1's cloud thread, also run here as the peer)
from ml import GOAL_EFFICIENCY, example, per_iteration  # noqa: E402  (one way to run the examples)

CORES = os.cpu_count() or 1
STARTUP_POINTS = 1_000  # pi with this many points per thread: the cost of starting the workers


class _Hits:
    """Stands in for the shared Counter when Listing 1's thread runs in this process."""

    def __init__(self) -> None:
        self.value = 0

    def add(self, n: int) -> None:
        self.value += n


def pi_one_process(points: int) -> float:
    """points/s of examples/pi.py's `estimate`, called once in this plain Python process."""
    t = time.perf_counter()
    pi_example.estimate(points, 0, _Hits())
    return points / (time.perf_counter() - t)


def spread(samples: list[float], scale: float = 1.0, digits: int = 3) -> str:
    return f"{min(samples) * scale:.{digits}g}–{max(samples) * scale:.{digits}g}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workers", type=int, nargs="+", default=[1, 2] if QUICK else [1, 2, 4, 8],
                    help="worker counts (must include 1 and 2)")
    ap.add_argument("--rounds", type=int, default=1 if QUICK else 3)
    ap.add_argument("--pi-points", type=int, default=30_000_000 if QUICK else 100_000_000,
                    help="Monte Carlo pi: points per cloud thread")
    ap.add_argument("--km-points", type=int, default=100_000 if QUICK else 200_000,
                    help="k-means: points per cloud thread")
    ap.add_argument("--dims", type=int, default=50)
    ap.add_argument("-k", type=int, default=25)
    ap.add_argument("--iterations", type=int, default=5 if QUICK else 10)
    ap.add_argument("--no-docs", action="store_true", help="print only; do not write docs/benchmarks.md")
    args = ap.parse_args()
    ws = sorted(set(args.workers))
    if ws[:2] != [1, 2]:
        ap.error("--workers must include 1 and 2 (the speed-ups are against 1, the claims at 2)")
    load = os.getloadavg()[0]
    started = time.perf_counter()

    def km_args(w: int) -> list[str]:
        return ["--threads", str(w), "--points", str(args.km_points * w), "--dims", str(args.dims),
                "-k", str(args.k), "--iterations", str(args.iterations)]

    pi_rate = {w: [] for w in ws}      # points/s, one per round
    pi_secs = {w: [] for w in ws}      # seconds of the whole run (examples/pi.py's clock)
    pi_start = {w: [] for w in ws}     # seconds of the same run with STARTUP_POINTS per thread
    km = {w: [] for w in ws}           # seconds per iteration
    pi_peer: list[float] = []          # points/s of one process, on the points of one thread
    km_peer: dict[int, list[float]] = {1: [], 2: []}  # NumPy s/iteration on the data of W threads
    for r in range(args.rounds):
        order = ws if r % 2 == 0 else ws[::-1]
        log(f"round {r + 1}/{args.rounds}: workers {order}")
        for w in order:
            res = example("pi", "--threads", str(w), "--points", str(args.pi_points), workers=w)
            pi_rate[w].append(res["points_per_s"])
            pi_secs[w].append(res["seconds"])
            pi_start[w].append(example("pi", "--threads", str(w), "--points", str(STARTUP_POINTS),
                                       workers=w)["seconds"])
            km[w].append(per_iteration(example("kmeans", *km_args(w), "--objects", "shared", workers=w)))
            log(f"  {w} workers: pi {pi_rate[w][-1] / 1e6:.1f} M points/s in {pi_secs[w][-1]:.2f} s "
                f"(start-up {pi_start[w][-1]:.2f} s); k-means {km[w][-1]:.3f} s per iteration")
        pi_peer.append(pi_one_process(args.pi_points))
        for w in km_peer:
            km_peer[w].append(per_iteration(example("kmeans", *km_args(w), local=True)))
        log(f"  one process: pi {pi_peer[-1] / 1e6:.1f} M points/s; k-means NumPy "
            + ", ".join(f"{km_peer[w][-1]:.3f} s per iteration on {w}x the data" for w in km_peer))
    elapsed = time.perf_counter() - started
    log(f"measured in {elapsed:.0f} s")

    med = statistics.median
    ceiling = {w: min(w, CORES) for w in ws}
    pi_speedup = {w: med(pi_rate[w]) / med(pi_rate[1]) for w in ws}
    pi_headers = ["workers", "M points/s", "min–max", "seconds", "start-up (s)", "speed-up vs 1",
                  "efficiency", f"ceiling min(W, {CORES} cores)"]
    pi_rows = [[w, med(pi_rate[w]) / 1e6, spread(pi_rate[w], 1e-6), med(pi_secs[w]), med(pi_start[w]),
                pi_speedup[w], pi_speedup[w] / w, ceiling[w]] for w in ws]
    km_t1 = med(km[1])
    km_speedup = {w: w * km_t1 / med(km[w]) for w in ws}
    km_headers = ["threads", "points", "s/iteration", "min–max", "speed-up W·T1/TW",
                  "efficiency = scale-up T1/TW", f"ceiling min(W, {CORES} cores)"]
    km_rows = [[w, args.km_points * w, med(km[w]), spread(km[w]), km_speedup[w], km_speedup[w] / w,
                ceiling[w]] for w in ws]
    pi_vs = med(pi_rate[2]) / med(pi_peer)
    km_vs = {w: med(km_peer[w]) / med(km[w]) for w in km_peer}
    peer_headers = ["measure", "spindle", "one process", "ratio", "efficiency (ratio / W)"]
    peer_rows = [
        ["Monte Carlo pi, M points/s: 1 worker vs 1 process", med(pi_rate[1]) / 1e6,
         med(pi_peer) / 1e6, med(pi_rate[1]) / med(pi_peer), med(pi_rate[1]) / med(pi_peer)],
        ["Monte Carlo pi, M points/s: 2 workers vs 1 process", med(pi_rate[2]) / 1e6,
         med(pi_peer) / 1e6, pi_vs, pi_vs / 2],
        *[[f"k-means, s/iteration: {w} thread{'s' if w > 1 else ''} vs NumPy, "
           f"{args.km_points * w:,} points", med(km[w]), med(km_peer[w]), km_vs[w], km_vs[w] / w]
          for w in km_peer],
    ]
    print_table(pi_headers, pi_rows)
    print_table(km_headers, km_rows)
    print_table(peer_headers, peer_rows)
    if args.no_docs:
        return

    km_eff2 = km_vs[2] / 2
    top = ws[-1]
    over = [w for w in ws if w > CORES]
    lines = [
        f"## Scaling on {CORES} cores, seed Figure 4 (`bench/scaling.py`)",
        "",
        f"Machine: {machine()}; 1-minute load average {load:.1f} before the runs"
        + (f", above the {CORES} cores: other processes were taking a share of them"
           if load > CORES else "")
        + ". Spindle's `spindle run --max-workers W` (release build) with W cloud "
        f"threads, W in {', '.join(map(str, ws))}; {args.rounds} round(s), the worker counts taking "
        f"turns; each figure is the median over rounds, with the min–max. {elapsed:.0f} s in all."
        + (" **QUICK run: small sizes, noisy figures.**" if QUICK else ""),
        "",
        "Both experiments are weak scaling, as the seed's: every cloud thread gets the same work, "
        "so the speed-up is the work done per second relative to 1 worker. "
        + (f"This machine has {CORES} cores, so with {', '.join(map(str, over))} workers there are "
           f"more workers than cores and the speed-up cannot exceed {CORES} (the ceiling column); "
           f"the seed ran each thread on its own AWS Lambda function (Figure 4a: 800 threads, "
           f"Figure 4c: up to 320), which a {CORES}-core machine cannot reproduce. "
           if over else "")
        + "The server, its object hosts and the driver share those cores with the workers.",
        "",
        f"**Monte Carlo pi** (`examples/pi.py`, Listing 1; seed Figure 4a): {args.pi_points:,} "
        "points per cloud thread, total points per second. examples/pi.py's clock includes "
        "starting the workers (Python, NumPy and the SDK in each); the start-up column is the same "
        f"run with {STARTUP_POINTS:,} points per thread.",
        "",
        *table(pi_headers, pi_rows),
        "",
        f"**k-means** (`examples/kmeans.py --objects shared`, Listing 5 with the "
        f"`@spindle.shared` GlobalCentroids and GlobalDelta; seed Figure 4c): {args.km_points:,} "
        f"points x {args.dims} dims per cloud thread, k = {args.k}, {args.iterations} iterations, "
        "mean time per iteration without the first, measured from the start barrier (data "
        "generation excluded). The seed's scale-up T1/TW (1 = perfectly linear) is the "
        "efficiency; the speed-up W·T1/TW is the work per second relative to 1 thread.",
        "",
        *table(km_headers, km_rows),
        "",
        "**Against one process** (the single-machine peer): pi's `estimate` called once in one "
        "plain Python process on one thread's points; k-means in one NumPy process on one core "
        "(`--local`, the same data and algorithm). Ratios above 1 "
        "favour Spindle; the efficiency divides by the workers.",
        "",
        *table(peer_headers, peer_rows),
        "",
        f"Conclusions. Monte Carlo pi: 2 workers give {pi_speedup[2]:.2f}x the points/s of 1 "
        f"(efficiency {pi_speedup[2] / 2:.2f}) and {pi_vs:.2f}x one process"
        + (f"; {top} workers on {CORES} cores give {pi_speedup[top]:.2f}x, "
           f"{pi_speedup[top] / ceiling[top]:.0%} of the {ceiling[top]}x ceiling" if top > CORES else "")
        + f". k-means: 2 threads do {km_speedup[2]:.2f}x the work per second of 1 (the seed's "
        f"scale-up {km_speedup[2] / 2:.2f}, where the seed stayed within 10% of 1 on Lambda)"
        + (f"; {top} threads {km_speedup[top]:.2f}x, {km_speedup[top] / ceiling[top]:.0%} of the "
           f"{ceiling[top]}x ceiling" if top > CORES else "")
        + f". Against one NumPy process on the same data, 2 threads run an iteration "
        f"{km_vs[2]:.2f}x as fast, a parallel efficiency of **{km_eff2:.2f}** (goal ≥ "
        f"{GOAL_EFFICIENCY}, bench/ml.py's: {'met' if km_eff2 >= GOAL_EFFICIENCY else 'missed'}); "
        f"with 1 thread an iteration takes {1 / km_vs[1]:.2f}x NumPy's time (NumPy's step plus "
        "the calls on the shared objects and the barrier).",
        "",
        "![scaling](img/scaling.png)",
    ]
    plot(ws, pi_rate, pi_peer, km, km_peer)
    update_section("scaling", "\n".join(lines))
    summarize("scaling", [
        Claim("Monte Carlo pi, 2 workers vs 1 process", f"{med(pi_rate[2]) / 1e6:.1f} M points/s",
              f"1 process {med(pi_peer) / 1e6:.1f} M points/s", pi_vs, "-", None),
        Claim("k-means, 2 threads vs NumPy one process",
              f"{med(km[2]):.3f} s/iteration (efficiency {km_eff2:.2f})",
              f"NumPy {med(km_peer[2]):.3f} s/iteration", km_vs[2],
              f"efficiency ≥ {GOAL_EFFICIENCY} at 2 workers", km_eff2 >= GOAL_EFFICIENCY),
    ])


def plot(ws, pi_rate, pi_peer, km, km_peer) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    med = statistics.median
    IMG.mkdir(parents=True, exist_ok=True)
    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 3.8))
    m = [med(pi_rate[w]) / 1e6 for w in ws]
    a.errorbar(ws, m, yerr=[[x - min(pi_rate[w]) / 1e6 for x, w in zip(m, ws)],
                            [max(pi_rate[w]) / 1e6 - x for x, w in zip(m, ws)]],
               fmt="o-", capsize=3, label="spindle")
    a.plot(ws, [m[0] * min(w, CORES) for w in ws], "--", c="gray",
           label=f"linear up to {CORES} cores")
    a.plot([1], [med(pi_peer) / 1e6], "s", c="C1", label="one process")
    a.set_xscale("log", base=2)
    a.set_xticks(ws, [str(w) for w in ws])
    a.set_ylim(bottom=0)
    a.set_xlabel("workers (= cloud threads)")
    a.set_ylabel("million points/s")
    a.set_title("Monte Carlo pi (Fig. 4a)")
    a.legend(fontsize=8)

    t1 = med(km[1])
    s = [w * t1 / med(km[w]) for w in ws]
    b.errorbar(ws, s, yerr=[[x - w * t1 / max(km[w]) for x, w in zip(s, ws)],
                            [w * t1 / min(km[w]) - x for x, w in zip(s, ws)]],
               fmt="o-", capsize=3, label="spindle, W·T1/TW")
    b.plot(ws, [min(w, CORES) for w in ws], "--", c="gray", label=f"linear up to {CORES} cores")
    pw = sorted(km_peer)
    b.plot(pw, [w * t1 / med(km_peer[w]) for w in pw], "s", c="C1",
           label="one NumPy process (same data)")
    b.set_xscale("log", base=2)
    b.set_xticks(ws, [str(w) for w in ws])
    b.set_ylim(bottom=0)
    b.set_xlabel("cloud threads (weak scaling)")
    b.set_ylabel("speed-up vs 1 thread")
    b.set_title("k-means (Fig. 4c)")
    b.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(IMG / "scaling.png", dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    main()
