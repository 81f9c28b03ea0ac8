"""k-means and logistic regression: Spindle beside PySpark and one NumPy process, in one run.

The same generated data for everyone (examples/kmeans.py and examples/logistic_regression.py
generate it fragment by fragment from a seed): 500,000 points x 50 dims with k = 25, and
500,000 samples x 50 features. Data generation and loading are excluded everywhere, as in
the seed (§3.4.2).

* k-means, time per iteration: `spindle run examples/kmeans.py` (2 cloud threads; the
  aggregation in user-defined objects, `--objects shared`, and in built-in Arrays), the same
  algorithm in one NumPy process on one core (`--local`), and Spark MLlib's
  `pyspark.ml.clustering.KMeans` on `local[2]` over a cached DataFrame (per iteration:
  the difference between fits of many and of 1 iteration, divided by the difference of
  their iteration counts, so set-up costs cancel).
* logistic regression, time to reach a loss: Spindle's full-batch gradient descent (Array.add
  + Barrier) against Spark MLlib's `LogisticRegression` (L-BFGS, in the JVM) and against the
  same gradient descent written on PySpark RDDs (broadcast weights, `treeReduce` of the
  gradients: the algorithm of the seed's `LogisticRegressionWithSGD`, removed in Spark 3).

Usage: python bench/ml.py [--points 500000] [--dims 50] [-k 25] [--no-docs]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from report import IMG, QUICK, ROOT, Claim, log, machine, package_version, print_table, summarize, table, update_section

sys.path.insert(0, str(ROOT / "examples"))
import kmeans  # noqa: E402  (the examples' data generation and steps)
import logistic_regression as logreg  # noqa: E402
from spindle.embedded import find_binary


GOAL_EFFICIENCY = 0.75  # k-means with 2 threads against one NumPy process
LOST_UPDATE_GOAL = 1.05  # the lost-update check's cost: at most 5%


def example(name: str, *args: str, local: bool = False, workers: int | None = None,
            lost_updates: bool = True) -> dict:
    """Run examples/NAME.py with `spindle run` (a pool of `workers` when given), or locally
    with --local; its JSON result. One BLAS thread per process: one core per cloud thread.
    ``lost_updates=False``: the workers skip the lost-update check (to measure its cost)."""
    env = {k: v for k, v in os.environ.items() if k != "SPINDLE_ADDRESS"}
    if not lost_updates:
        env["SPINDLE_LOST_UPDATES"] = "0"
    env["PYTHONPATH"] = str(ROOT / "python")
    env["SPINDLE_PYTHON"] = sys.executable  # the program and its workers: this environment's
    for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        env[var] = "1"
    script = str(ROOT / "examples" / f"{name}.py")
    pool = [] if workers is None else ["--max-workers", str(workers)]
    cmd = ([sys.executable, script, *args, "--local"] if local
           else [find_binary(), "run", *pool, script, *args])
    out = subprocess.run([*cmd, "--json"], env=env, capture_output=True, text=True)
    if out.returncode:
        raise RuntimeError(f"{name} failed:\n{out.stderr[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def per_iteration(result: dict) -> float:
    """Mean seconds per k-means iteration, the first (warm-up of imports and caches) left out."""
    times = result["times"][1:] or result["times"]
    return sum(times) / len(times)


def spark_session():
    from pyspark.sql import SparkSession

    # Spark's Python workers import the examples' modules (data generation, gradient).
    os.environ["PYTHONPATH"] = os.pathsep.join([str(ROOT / "examples"), str(ROOT / "python"),
                                                os.environ.get("PYTHONPATH", "")])
    os.environ["PYSPARK_PYTHON"] = sys.executable
    spark = (SparkSession.builder.master("local[2]").appName("spindle-bench")
             .config("spark.driver.memory", "6g").config("spark.ui.enabled", "false")
             .config("spark.sql.shuffle.partitions", "2").getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def spark_kmeans(spark, p: kmeans.Problem, iterations: int) -> dict:
    from pyspark.ml.clustering import KMeans
    from pyspark.ml.linalg import Vectors

    def rows(part: int):
        return [(Vectors.dense(x),) for x in kmeans.fragment(p, part)]

    log("  spark: generating and caching the points")
    df = spark.createDataFrame(
        spark.sparkContext.parallelize(range(p.parts), p.parts).flatMap(rows), ["features"])
    df = df.repartition(p.parts).cache()
    df.count()
    # A first fit warms the JVM (JIT, broadcast, caches); it is not measured. Each measured fit
    # still pays a fixed cost (job set-up, the training summary), so the per-iteration time is
    # the difference between a long and a one-iteration fit.
    KMeans(k=p.k, maxIter=1, tol=0.0, initMode="random", seed=p.seed).fit(df)
    fits = {}
    for n in (1, iterations + 1):
        est = KMeans(k=p.k, maxIter=n, tol=0.0, initMode="random", seed=p.seed)
        t = time.perf_counter()
        model = est.fit(df)
        fits[n] = (time.perf_counter() - t, model.summary.numIter, model.summary.trainingCost)
        log(f"  spark: maxIter={n}: {fits[n][1]} iterations in {fits[n][0]:.2f} s, "
            f"cost {fits[n][2]:.6g}")
    df.unpersist()
    (t1, i1, _), (tn, inn, cost) = fits[1], fits[iterations + 1]
    return {"per_iteration": (tn - t1) / max(inn - i1, 1), "iterations": inn, "cost": cost}


def spark_logreg_mllib(spark, p: logreg.Problem, iterations: int) -> dict:
    """Spark MLlib's LogisticRegression (L-BFGS); the features carry a column of ones."""
    from pyspark.ml.classification import LogisticRegression
    from pyspark.ml.linalg import Vectors

    def rows(part: int):
        x, y = logreg.fragment(p, part)
        return [(Vectors.dense(a), float(b)) for a, b in zip(x, y)]

    log("  spark: generating and caching the samples")
    df = spark.createDataFrame(
        spark.sparkContext.parallelize(range(p.parts), p.parts).flatMap(rows), ["features", "label"])
    df = df.repartition(p.parts).cache()
    df.count()
    est = LogisticRegression(maxIter=iterations, regParam=0.0, tol=0.0, fitIntercept=False,
                             standardization=False)
    t = time.perf_counter()
    model = est.fit(df)
    seconds = time.perf_counter() - t
    history = list(model.summary.objectiveHistory)
    df.unpersist()
    log(f"  spark mllib: {len(history) - 1} iterations in {seconds:.2f} s, loss {history[-1]:.6f}")
    return {"seconds": seconds, "loss": history}


def spark_logreg_gd(spark, p: logreg.Problem, epochs: int, rate: float) -> dict:
    """The examples' gradient descent on RDDs: broadcast the weights, treeReduce the gradients."""
    import numpy as np

    sc = spark.sparkContext
    data = sc.parallelize(range(p.parts), p.parts).map(lambda i: logreg.fragment(p, i)).cache()
    data.count()
    w = np.zeros(p.features + 1)
    losses, times, t0 = [], [], time.perf_counter()
    for epoch in range(epochs):
        bw = sc.broadcast(w)
        gradient, loss = data.map(lambda f: logreg.partial_gradient(f[0], f[1], bw.value)) \
            .treeReduce(lambda a, b: (a[0] + b[0], a[1] + b[1]))
        w = w - rate * gradient / p.samples
        losses.append(loss / p.samples)
        times.append(time.perf_counter() - t0)
        bw.destroy()
    data.unpersist()
    log(f"  spark RDD gradient descent: {epochs} epochs in {times[-1]:.2f} s, "
        f"loss {losses[-1]:.6f}")
    return {"loss": losses, "times": times}


def time_to(losses: list[float], times: list[float], target: float, rel: float = 1e-6):
    """Seconds until the loss first comes within `rel` of `target` (None if never)."""
    for loss, t in zip(losses, times):
        if loss <= target * (1 + rel):
            return t
    return None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--points", type=int, default=20_000 if QUICK else 500_000)
    ap.add_argument("--dims", type=int, default=50)
    ap.add_argument("-k", type=int, default=25)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--iterations", type=int, default=5 if QUICK else 10, help="k-means iterations")
    ap.add_argument("--rounds", type=int, default=1 if QUICK else 3, help="k-means runs of each kind (median)")
    ap.add_argument("--epochs", type=int, default=50 if QUICK else 100, help="Spindle's gradient-descent epochs")
    ap.add_argument("--spark-epochs", type=int, default=10 if QUICK else 20, help="PySpark RDD GD epochs")
    ap.add_argument("--lbfgs-iterations", type=int, default=10 if QUICK else 20)
    ap.add_argument("--rate", type=float, default=2.0)
    ap.add_argument("--no-spark", action="store_true")
    ap.add_argument("--no-docs", action="store_true")
    args = ap.parse_args()
    size = ["--threads", str(args.threads)]
    km_args = ["--points", str(args.points), "--dims", str(args.dims), "-k", str(args.k),
               "--iterations", str(args.iterations), *size]
    lr_args = ["--samples", str(args.points), "--features", str(args.dims),
               "--rate", str(args.rate), *size]

    # k-means: the three runs take turns for --rounds rounds; each figure is the median over
    # the rounds of a run's mean time per iteration.
    km_runs: dict[str, list[float]] = {"shared": [], "array": [], "local": []}
    km_shared: list[dict] = []  # whole results, for the lost-update check's cost
    for r in range(args.rounds):
        log(f"k-means, {args.points:,} x {args.dims}, k={args.k}, round {r + 1}/{args.rounds}: "
            f"spindle ({args.threads} threads; user-defined objects, then Arrays), one NumPy process")
        km_shared.append(example("kmeans", *km_args, "--objects", "shared"))
        km_runs["shared"].append(per_iteration(km_shared[-1]))
        km_runs["array"].append(per_iteration(example("kmeans", *km_args, "--objects", "array")))
        km_runs["local"].append(per_iteration(example("kmeans", *km_args, local=True)))
    log("logistic regression: spindle")
    lr_spindle = example("logistic_regression", *lr_args, "--epochs", str(args.epochs))
    lu_headers, lu_rows, lu_worst = lost_update_cost(args, km_args, lr_args, km_shared, lr_spindle)
    log("logistic regression: one NumPy process")
    lr_numpy = example("logistic_regression", *lr_args, "--epochs", str(args.epochs), local=True)

    km_spark = lr_mllib = lr_gd = None
    if not args.no_spark:
        log("PySpark local[2]")
        spark = spark_session()
        try:
            km_spark = spark_kmeans(spark, kmeans.Problem(args.points, args.dims, args.k,
                                                          args.threads, 1), args.iterations)
            p = logreg.Problem(args.points, args.dims, args.threads, 1)
            lr_mllib = spark_logreg_mllib(spark, p, args.lbfgs_iterations)
            lr_gd = spark_logreg_gd(spark, p, args.spark_epochs, args.rate)
        finally:
            spark.stop()

    s_it, a_it, n_it = (statistics.median(km_runs[k]) for k in ("shared", "array", "local"))
    km_headers = ["k-means, time per iteration", "seconds", "vs spindle"]
    km_rows = [[f"spindle, {args.threads} cloud threads (@spindle.shared GlobalCentroids)", s_it, 1.0],
               [f"spindle, {args.threads} cloud threads (built-in Arrays, barrier action)", a_it, a_it / s_it],
               ["NumPy, one process, one core", n_it, n_it / s_it]]
    if km_spark:
        km_rows.append([f"PySpark MLlib KMeans, local[{args.threads}]", km_spark["per_iteration"],
                        km_spark["per_iteration"] / s_it])
    efficiency = n_it / (args.threads * s_it)
    print_table(km_headers, km_rows)
    print(f"k-means parallel efficiency vs one NumPy process: {efficiency:.2f}")

    lr_headers = ["logistic regression, time to reach the target loss", "target loss",
                  "peer (s)", "spindle (s)", "speed-up"]
    lr_rows = []
    for label, losses, times in ([("NumPy GD, one process", lr_numpy["loss"], lr_numpy["times"])]
                                 + ([("PySpark RDD GD (same algorithm)", lr_gd["loss"],
                                      lr_gd["times"])] if lr_gd else [])):
        target = losses[min(len(losses), args.spark_epochs) - 1]
        peer = time_to(losses, times, target, 0.0)
        mine = time_to(lr_spindle["loss"], lr_spindle["times"], target)
        lr_rows.append([label, target, peer, mine, peer / mine if mine else "not reached"])
    if lr_mllib:
        target = lr_mllib["loss"][-1]
        mine = time_to(lr_spindle["loss"], lr_spindle["times"], target)
        lr_rows.append([f"PySpark MLlib LogisticRegression (L-BFGS, {args.lbfgs_iterations} it.)",
                        target, lr_mllib["seconds"], mine if mine else "not reached",
                        lr_mllib["seconds"] / mine if mine else "-"])
    print_table(lr_headers, lr_rows)
    print_table(lu_headers, lu_rows)
    if args.no_docs:
        return

    images = plot(km_rows, lr_spindle, lr_numpy, lr_gd, lr_mllib)
    lines = [
        "## k-means and logistic regression vs PySpark (`bench/ml.py`)",
        "",
        f"Machine: {machine()}. PySpark {package_version('pyspark')} on `local[{args.threads}]` "
        f"(Java 17), Spindle with {args.threads} cloud threads, one NumPy process on one core "
        "(`threadpoolctl` limits BLAS to one thread for it and for each cloud thread). "
        f"Generated data: {args.points:,} points x {args.dims} dims, k = {args.k} (k-means: "
        f"median of {args.rounds} runs each, taking turns); "
        f"{args.points:,} samples x {args.dims} features (plus a bias column). Loading and "
        "generation excluded, as in the seed. Goals: k-means at least 3x faster than Spark per "
        f"iteration with a parallel efficiency of at least {GOAL_EFFICIENCY}; logistic regression at Spark's "
        "final loss at least 2x sooner.",
        "",
        *table(km_headers, km_rows),
        "",
        f"Parallel efficiency of Spindle's k-means against one NumPy process: **{efficiency:.2f}**"
        f" (time of one process / ({args.threads} x time with {args.threads} threads)).",
        "",
        "Logistic regression: each row gives a peer's loss after its run (target), the seconds "
        "the peer took to reach it and the seconds Spindle's gradient descent took (within "
        f"a relative 1e-6), measured from the start barrier after loading. Learning rate "
        f"{args.rate}; PySpark GD ran {args.spark_epochs} epochs, Spindle up to {args.epochs}.",
        "",
        *table(lr_headers, lr_rows),
        "",
        "The lost-update check (`spindle.LostUpdateWarning`: each function call compares, in its "
        "worker, the state it could change without sharing it before and after the call) costs "
        f"at most {LOST_UPDATE_GOAL - 1:.0%}: the same programs with the workers' check off "
        "(`SPINDLE_LOST_UPDATES=0`), taking turns with the runs above (median of "
        f"{args.rounds} each). They are timed whole, from connecting to the server to the end "
        "of the last cloud thread (data generation included), since the check runs as each "
        "call starts and ends, outside the iteration times above.",
        "",
        *table(lu_headers, lu_rows),
        "",
        *[f"![{Path(i).stem}]({i})" for i in images],
    ]
    update_section("ml", "\n".join(lines))
    claims = [Claim(f"k-means iteration, {args.threads} cloud threads, parallel efficiency vs one NumPy process",
                    f"{s_it:.3f} s (efficiency {efficiency:.2f})", f"NumPy {n_it:.3f} s", n_it / s_it,
                    f"efficiency ≥ {GOAL_EFFICIENCY}", efficiency >= GOAL_EFFICIENCY)]
    if km_spark:
        spark_it = km_spark["per_iteration"]
        claims.append(Claim(f"k-means iteration, {args.points:,} x {args.dims}, k = {args.k}", f"{s_it:.3f} s",
                            f"PySpark MLlib {spark_it:.3f} s", spark_it / s_it, "≥ 3.0", spark_it / s_it >= 3.0))
    for label, target, peer, mine, speedup in lr_rows[1:]:  # the PySpark rows
        reached = isinstance(speedup, float)
        claims.append(Claim(f"logistic regression to {label}'s loss {target:.3f}",
                            f"{mine:.2f} s" if reached else "not reached", f"{label} {peer:.2f} s",
                            speedup if reached else 0.0, "≥ 2.0", reached and speedup >= 2.0))
    claims.append(Claim("lost-update check, k-means and logistic regression", f"x{lu_worst:.3f} at worst",
                        "the check off", lu_worst, f"≤ {LOST_UPDATE_GOAL}", lu_worst <= LOST_UPDATE_GOAL))
    summarize("ml", claims)


def lost_update_cost(args, km_args, lr_args, km_with: list[dict], lr_with: dict):
    """The lost-update check's cost: the whole k-means and logistic regression runs (their
    ``total``, which holds the check, unlike the per-iteration times) with the workers'
    check on (the runs above, then as many more) and off, taking turns; the table and the
    worst ratio on/off."""
    km_on, km_off = [result["total"] for result in km_with], []
    lr_on, lr_off = [lr_with["total"]], []
    lr_epochs = ["--epochs", str(args.epochs)]
    for r in range(args.rounds):
        log(f"lost-update check off, round {r + 1}/{args.rounds}: k-means, logistic regression")
        km_off.append(example("kmeans", *km_args, "--objects", "shared", lost_updates=False)["total"])
        lr_off.append(example("logistic_regression", *lr_args, *lr_epochs, lost_updates=False)["total"])
        if r:  # the first round's "on" runs are the ones above
            lr_on.append(example("logistic_regression", *lr_args, *lr_epochs)["total"])
    rows = [[label, statistics.median(off), statistics.median(on),
             statistics.median(on) / statistics.median(off)]
            for label, on, off in ((f"k-means, {args.iterations} iterations, s", km_on, km_off),
                                   (f"logistic regression, {args.epochs} epochs, s", lr_on, lr_off))]
    headers = ["lost-update check, whole run", "check off", "check on", "on / off"]
    return headers, rows, max(row[3] for row in rows)


def plot(km_rows, lr_spindle, lr_numpy, lr_gd, lr_mllib) -> list[str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    IMG.mkdir(parents=True, exist_ok=True)
    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 3.8))
    a.barh([r[0] for r in km_rows], [r[1] for r in km_rows])
    a.set_xlabel("k-means: seconds per iteration")
    a.invert_yaxis()
    b.plot(lr_spindle["times"], lr_spindle["loss"], ".-", label="spindle GD")
    b.plot(lr_numpy["times"], lr_numpy["loss"], ".-", label="NumPy GD")
    if lr_gd:
        b.plot(lr_gd["times"], lr_gd["loss"], ".-", label="PySpark RDD GD")
    if lr_mllib:
        b.axhline(lr_mllib["loss"][-1], ls="--", c="gray", label="MLlib L-BFGS final loss")
        b.axvline(lr_mllib["seconds"], ls=":", c="gray", label="MLlib L-BFGS fit time")
    b.set_xscale("log")
    b.set_xlabel("seconds since the start (log)")
    b.set_ylabel("mean log loss")
    b.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(IMG / "ml.png", dpi=110)
    plt.close(fig)
    return ["img/ml.png"]


if __name__ == "__main__":
    main()
