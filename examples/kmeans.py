"""k-means clustering with cloud threads and server-side aggregation (CRUCIAL, Listing 5).

`--threads` cloud threads each generate their own fragment of the data (no data travels
through the program) and then iterate in lockstep:

* read the current centroids (one call);
* assign their points and compute, per cluster, the sum and the count of their points and
  their contribution to the inertia;
* hand those partial results to the server, where they add up, one small message per thread;
* wait on a `Barrier` (Listing 5, line 19);
* advance the shared iteration `Counter` with `compare_and_set` (Listing 5, line 20).

`--objects` chooses what holds the shared state:

* `shared` (the default) is Listing 5 itself: two user-defined objects, `GlobalCentroids`
  and `GlobalDelta` (`@spindle.shared` classes below), whose methods run in the server's
  object hosts. `centroids.update(sums, counts)` adds a thread's part; the last part of an
  iteration turns the sums into the new centroids right there, and `delta.update(inertia,
  shift)` tracks the inertia and the convergence criterion. The methods never wait on other
  objects (the host rule): the threads meet at the `Barrier`, outside any method.
* `compiled` is `shared` with the centroids as a compiled object type: the same
  `GlobalCentroids`, written in C and compiled to WebAssembly (`examples/wasm/kmeans.c`,
  built by `make wasm`), whose methods run inside the server itself, with the same results
  bit for bit.
* `array` builds the same from built-in objects: the parts are added to `Array`s and the
  barrier's action, run by the last thread to arrive, computes the new centroids client-side
  (three `Array.get`s, one `set`, three `fill`s per iteration).

They stop after `--iterations` or when no centroid moves more than `--tol`. `--local` runs the
same algorithm in this one process with NumPy (the single-machine baseline) on the same data.

    spindle run examples/kmeans.py [--points 500000] [--dims 50] [-k 25] [--threads 2]
                                   [--objects shared|compiled|array]
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from scipy import sparse

import spindle


@dataclass(frozen=True)
class Problem:
    points: int
    dims: int
    k: int
    parts: int  # the data is generated as this many fragments, one per thread
    seed: int


def fragment(p: Problem, part: int) -> np.ndarray:
    """Fragment `part` of the data: points around k random centres, the same every time."""
    centres = np.random.default_rng([p.seed, 0]).uniform(-5, 5, size=(p.k, p.dims))
    bounds = np.linspace(0, p.points, p.parts + 1).astype(int)
    rng = np.random.default_rng([p.seed, 1, part])
    n = bounds[part + 1] - bounds[part]
    return centres[rng.integers(p.k, size=n)] + rng.standard_normal((n, p.dims))


def dataset(p: Problem) -> np.ndarray:
    return np.concatenate([fragment(p, i) for i in range(p.parts)])


def initial_centroids(p: Problem) -> np.ndarray:
    """k starting centroids drawn from the data's distribution (same for every run mode)."""
    centres = np.random.default_rng([p.seed, 0]).uniform(-5, 5, size=(p.k, p.dims))
    rng = np.random.default_rng([p.seed, 2])
    return centres[rng.integers(p.k, size=p.k)] + rng.standard_normal((p.k, p.dims))


def partial_step(x: np.ndarray, sq_norms: np.ndarray, centroids: np.ndarray):
    """Assign points to their nearest centroid: per-cluster sums, counts, and the inertia."""
    # |x - c|^2 = |x|^2 - 2 x.c + |c|^2; the nearest centroid does not depend on |x|^2.
    scores = x @ (-2.0 * centroids.T)
    scores += (centroids * centroids).sum(axis=1)  # in place: no temporary of n x k
    labels = scores.argmin(axis=1)
    nearest = sq_norms + np.take_along_axis(scores, labels[:, None], 1)[:, 0]
    inertia = float(np.maximum(nearest, 0.0).sum())
    k = len(centroids)
    members = sparse.csr_matrix((np.ones(len(x)), (labels, np.arange(len(x)))), shape=(k, len(x)))
    return members @ x, np.bincount(labels, minlength=k).astype(np.float64), inertia


def new_centroids(sums: np.ndarray, counts: np.ndarray, old: np.ndarray) -> np.ndarray:
    """Mean of each cluster; an empty cluster keeps its centroid."""
    return np.where(counts[:, None] > 0, sums / np.maximum(counts, 1)[:, None], old)


# --- --objects shared: Listing 5's user-defined objects, run in the server's object hosts --

@spindle.shared
class GlobalCentroids:
    """The centroids (Listing 5, line 8). Each thread hands in its per-cluster sums and counts
    with `update`; the last of the `parts` updates of an iteration computes the new centroids
    in place and returns how far they moved (the others get None).

    The parts are added up in a fixed order, not in the order they arrive, so a run is
    reproducible bit for bit and `--tol 0` stops exactly when the assignment stops changing."""

    def __init__(self, initial, parts: int) -> None:
        self.centroids = np.array(initial, dtype=np.float64)
        self.parts = parts
        self.received: list = []

    def get(self) -> np.ndarray:
        """getCorrectCoordinates(): the current centroids, (k, dims)."""
        return self.centroids

    def update(self, local_sums, local_counts):
        self.received.append((np.asarray(local_counts, dtype=np.float64),
                              np.asarray(local_sums, dtype=np.float64)))
        if len(self.received) < self.parts:
            return None
        self.received.sort(key=lambda part: (part[0].tobytes(), part[1].tobytes()))
        sums = np.zeros_like(self.centroids)
        counts = np.zeros(len(self.centroids))
        for part_counts, part_sums in self.received:
            counts += part_counts
            sums += part_sums
        self.received = []
        new = new_centroids(sums, counts, self.centroids)
        shift = float(np.abs(new - self.centroids).max())
        self.centroids = new
        return shift


@spindle.shared
class GlobalDelta:
    """The convergence criterion (Listing 5, line 4): adds up the threads' inertia, takes the
    centroids' shift from the thread that computed it, and records `[inertia, time, shift]`
    once all `parts` threads reported an iteration (the first record is the start)."""

    def __init__(self, parts: int, tol: float) -> None:
        self.parts, self.tol = parts, tol
        self.records: list = []
        self.done = False
        self.inertias: list = []
        self.shift = None

    def start(self) -> None:
        self.records.append([None, time.time(), None])

    def update(self, local_inertia: float, shift=None) -> None:
        self.inertias.append(local_inertia)
        if shift is not None:
            self.shift = shift
        if len(self.inertias) == self.parts:
            self.records.append([math.fsum(self.inertias), time.time(), self.shift])
            self.done = self.shift is not None and self.shift <= self.tol
            self.inertias, self.shift = [], None

    def converged(self) -> bool:
        """endCondition()."""
        return self.done

    def history(self) -> list:
        return self.records


@dataclass(frozen=True)
class Objects:
    """The shared state of Listing 5 with user-defined objects (proxies: pickled as references)."""

    centroids: "GlobalCentroids | CompiledCentroids"
    delta: GlobalDelta
    iteration: spindle.Counter
    start: spindle.Barrier    # everyone loaded its fragment: the clock starts
    step: spindle.Barrier     # everyone handed in its part: the new centroids are ready


@dataclass(frozen=True)
class CompiledCentroids:
    """`GlobalCentroids`'s methods on the compiled type (`examples/wasm/kmeans.c`): rows travel
    as the bytes of their float64s, the form the module reads without a conversion."""

    obj: spindle.Proxy

    @classmethod
    def create(cls, initial: np.ndarray, parts: int) -> "CompiledCentroids":
        path = Path(__file__).resolve().parent / "wasm" / "build" / "kmeans.wasm"
        if not path.is_file():
            sys.exit(f"error: {path} is missing: build it with `make wasm`")
        Centroids = spindle.wasm_type(path)
        return cls(Centroids([row.tobytes() for row in initial], parts))

    def get(self) -> np.ndarray:
        return np.array(self.obj.get(), dtype=np.float64)

    def update(self, sums: np.ndarray, counts: np.ndarray):
        return self.obj.update([row.tobytes() for row in np.ascontiguousarray(sums, dtype=np.float64)],
                               np.asarray(counts, dtype=np.float64).tobytes())


def make_objects(p: Problem, tol: float, compiled: bool = False) -> Objects:
    make = CompiledCentroids.create if compiled else GlobalCentroids
    centroids = make(initial_centroids(p), p.parts)
    delta = GlobalDelta(p.parts, tol)
    return Objects(centroids, delta, spindle.Counter(),
                   spindle.Barrier(p.parts, action=lambda: delta.start()), spindle.Barrier(p.parts))


def kmeans_thread_objects(p: Problem, part: int, max_iter: int, s: Objects) -> None:
    """One cloud thread of Listing 5, with GlobalCentroids and GlobalDelta."""
    from threadpoolctl import threadpool_limits

    with threadpool_limits(1):  # one core per thread, like one function per vCPU
        x = fragment(p, part)   # loadDatasetFragment()
        sq_norms = (x * x).sum(axis=1)
        s.start.wait()
        it = s.iteration.get()
        while True:
            centroids = s.centroids.get()                             # line 14
            sums, counts, inertia = partial_step(x, sq_norms, centroids)  # line 16
            shift = s.centroids.update(sums, counts)                  # line 18
            s.delta.update(inertia, shift)                            # line 17
            s.step.wait()                                             # line 19
            s.iteration.compare_and_set(it, it + 1)                   # line 20
            it += 1
            if it >= max_iter or s.delta.converged():                 # line 21
                return


# --- --objects array: the same state built from built-in objects -------------------------

@dataclass(frozen=True)
class Shared:
    """The shared state of Listing 5 with built-in objects; each field is a proxy that
    pickles as a reference."""

    centroids: spindle.Array  # (k, dims): read by every thread at each iteration
    sums: spindle.Array       # (k, dims): partial sums added in the server
    counts: spindle.Array     # (k,): partial counts added in the server
    inertia: spindle.Array    # (1,): partial inertia added in the server
    history: spindle.List     # [inertia, time, centroid shift] per iteration
    iteration: spindle.Counter
    converged: spindle.Event
    start: spindle.Barrier    # everyone loaded its fragment: the clock starts
    step: spindle.Barrier     # everyone added its partial results: update the centroids


def make_shared(p: Problem, tol: float) -> Shared:
    centroids = spindle.Array((p.k, p.dims))
    centroids.set(initial_centroids(p))
    sums, counts, inertia = spindle.Array((p.k, p.dims)), spindle.Array(p.k), spindle.Array(1)
    history, converged = spindle.List(), spindle.Event()

    def update() -> None:  # the barrier's action: once per iteration, in the last thread
        old = centroids.get()
        new = new_centroids(sums.get(), counts.get(), old)
        shift = float(np.abs(new - old).max())
        centroids.set(new)
        history.append([float(inertia.get()[0]), time.time(), shift])
        sums.fill(0), counts.fill(0), inertia.fill(0)
        if shift <= tol:
            converged.set()

    start = spindle.Barrier(p.parts, action=lambda: history.append([None, time.time(), None]))
    return Shared(centroids, sums, counts, inertia, history, spindle.Counter(), converged,
                  start, spindle.Barrier(p.parts, action=update))


def kmeans_thread(p: Problem, part: int, max_iter: int, s: Shared) -> None:
    """One cloud thread of Listing 5."""
    from threadpoolctl import threadpool_limits

    with threadpool_limits(1):  # one core per thread, like one function per vCPU
        x = fragment(p, part)   # loadDatasetFragment()
        sq_norms = (x * x).sum(axis=1)
        s.start.wait()
        it = s.iteration.get()
        while True:
            sums, counts, inertia = partial_step(x, sq_norms, s.centroids.get())
            s.sums.add(sums)          # centroids.update(localCentroids, localSizes):
            s.counts.add(counts)      # the additions run in the server
            s.inertia.add(inertia)
            s.step.wait()             # barrier.await(); the last one updates the centroids
            s.iteration.compare_and_set(it, it + 1)
            it += 1
            if it >= max_iter or s.converged.is_set():
                return


def run_spindle(p: Problem, max_iter: int, tol: float,
                objects: str = "shared") -> tuple[list[float], list[float]]:
    """Run on cloud threads; return the inertia and the duration of each iteration."""
    if objects in ("shared", "compiled"):
        s, target = make_objects(p, tol, compiled=objects == "compiled"), kmeans_thread_objects
        history_now = s.delta.history
    else:
        s, target = make_shared(p, tol), kmeans_thread
        history_now = s.history.copy
    threads = [spindle.Thread(target=target, args=(p, i, max_iter, s), name=f"kmeans-{i}")
               for i in range(p.parts)]
    for t in threads:
        t.start()
    shown = 0
    while any(t.is_alive() for t in threads):  # report progress from the shared history
        shown = report(history_now(), shown)
        time.sleep(0.2)
    for t in threads:
        t.join()  # re-raises a thread's exception
    history = history_now()
    report(history, shown)
    times = [b[1] - a[1] for a, b in zip(history, history[1:])]
    return [h[0] for h in history[1:]], times


def report(history: list, shown: int) -> int:
    for i in range(max(shown, 1), len(history)):
        print(f"  iteration {i}: inertia {history[i][0]:.6g}, "
              f"{history[i][1] - history[i - 1][1]:.3f} s", file=sys.stderr, flush=True)
    return max(shown, len(history))


def run_local(p: Problem, max_iter: int, tol: float) -> tuple[list[float], list[float]]:
    """The same algorithm in one NumPy process on one core: the single-machine baseline."""
    from threadpoolctl import threadpool_limits

    with threadpool_limits(1):
        x = dataset(p)
        sq_norms = (x * x).sum(axis=1)
        centroids = initial_centroids(p)
        inertias, times = [], []
        for i in range(max_iter):
            t0 = time.perf_counter()
            sums, counts, inertia = partial_step(x, sq_norms, centroids)
            new = new_centroids(sums, counts, centroids)
            shift, centroids = float(np.abs(new - centroids).max()), new
            inertias.append(inertia)
            times.append(time.perf_counter() - t0)
            print(f"  iteration {i + 1}: inertia {inertia:.6g}, {times[-1]:.3f} s",
                  file=sys.stderr, flush=True)
            if shift <= tol:
                break
    return inertias, times


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--points", type=int, default=500_000)
    ap.add_argument("--dims", type=int, default=50)
    ap.add_argument("-k", type=int, default=25, help="clusters")
    ap.add_argument("--threads", type=int, default=2, help="cloud threads (= data fragments)")
    ap.add_argument("--iterations", type=int, default=10, help="at most this many")
    ap.add_argument("--tol", type=float, default=0.0, help="stop when no centroid moves more")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--local", action="store_true", help="one NumPy process instead of threads")
    ap.add_argument("--objects", choices=("shared", "compiled", "array"), default="shared",
                    help="shared state: @spindle.shared GlobalCentroids/GlobalDelta (Listing 5), "
                         "the same with GlobalCentroids compiled to WebAssembly (examples/wasm), "
                         "or built-in Arrays with a barrier action")
    ap.add_argument("--json", action="store_true", help="also print the result as JSON")
    args = ap.parse_args()

    p = Problem(args.points, args.dims, args.k, args.threads, args.seed)
    mode = "1 NumPy process" if args.local else f"{p.parts} cloud threads, {args.objects} objects"
    print(f"k-means: {p.points:,} points x {p.dims} dims, k={p.k}, {mode}", file=sys.stderr)
    start = time.perf_counter()
    if args.local:
        inertias, times = run_local(p, args.iterations, args.tol)
    else:
        spindle.connect()
        inertias, times = run_spindle(p, args.iterations, args.tol, args.objects)
    total = time.perf_counter() - start

    per_iter = sum(times) / len(times)
    print(f"{len(inertias)} iterations, final inertia {inertias[-1]:.6g}, "
          f"{per_iter:.3f} s per iteration, {total:.2f} s in all ({mode})")
    if args.json:
        print(json.dumps({"iterations": len(inertias), "inertia": inertias, "times": times,
                          "per_iteration": per_iter, "total": total, "threads": p.parts,
                          "local": args.local, "objects": None if args.local else args.objects}))


if __name__ == "__main__":
    main()
