"""Function overhead: Spindle beside Ray and Lithops in one run.

* warm invocation round trip of an empty function, p50 and p99 (one call at a time);
* empty-function throughput (all calls submitted at once);
* cold: the platform's start-up, then its first call with no warm worker yet;
  peers: Ray tasks (`ray.init(num_cpus=2)`, local) and Lithops' localhost backend;
* a map of many tiny tasks without a chunk size (`spindle.Executor().map`, which batches
  them) beside the standard library's `ThreadPoolExecutor.map` and Ray's
  `ray.util.multiprocessing.Pool.map`.

Monte Carlo pi's scaling with the number of workers is in bench/scaling.py.

Prints the tables with the ratios and rewrites the "functions" section of docs/benchmarks.md
with plots under docs/img/. Usage: python bench/functions.py [--calls N] [--no-docs] (QUICK=1:
fewer calls)
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import queue
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

from report import IMG, QUICK, ROOT, Claim, log, machine, package_version, percentile, print_table, summarize, table, update_section
from spindle.embedded import find_binary

sys.path.insert(0, str(ROOT / "python"))


def empty() -> None:
    return None


def empty_of(_: object) -> None:  # Lithops passes each call one argument
    return None


def tiny(x: int) -> int:
    return x * x


MAP_ROUNDS = 11  # a map of tiny tasks lasts milliseconds: one slow round must not decide


def timed_map(map_fn, n: int) -> float:
    """Median seconds of ``list(map_fn(tiny, range(n)))`` over MAP_ROUNDS, after a warm-up."""
    expected = [tiny(i) for i in range(n)]
    assert list(map_fn(tiny, range(n))) == expected
    time.sleep(2)  # workers the warm-up started finish starting: the pool is warm
    times = []
    for _ in range(MAP_ROUNDS):
        t = time.perf_counter()
        result = list(map_fn(tiny, range(n)))
        times.append(time.perf_counter() - t)
        assert result == expected
    return statistics.median(times)


def map_spindle(n: int) -> float:
    import spindle

    server, address = start_server()
    try:
        spindle.connect(address)
        with spindle.Executor(echo=False) as ex:
            return timed_map(ex.map, n)
    finally:
        spindle.disconnect()
        server.stdin.close()
        server.wait(10)


def map_stdlib(n: int) -> float:
    import concurrent.futures

    with concurrent.futures.ThreadPoolExecutor() as ex:
        return timed_map(ex.map, n)


def map_ray(n: int) -> float:
    import ray
    from ray.util.multiprocessing import Pool

    ray.init(num_cpus=2, include_dashboard=False, logging_level="ERROR", log_to_driver=False)
    try:
        pool = Pool(processes=2)
        try:
            return timed_map(pool.map, n)
        finally:
            pool.terminate()
    finally:
        ray.shutdown()


def start_server(*args: str) -> tuple[subprocess.Popen, str]:
    proc = subprocess.Popen([find_binary(), "server", "--port", "0", "--embedded", "--python", sys.executable, *args],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    for line in proc.stdout:
        if line.startswith("spindle listening on "):
            return proc, line.split()[-1]
    raise RuntimeError("spindle server did not start")


class Spindle:
    """A fresh ``spindle server`` (no warm worker) and an Executor on it."""

    def settle(self) -> None:
        pass

    def start(self) -> None:
        import spindle

        self.server, address = start_server()
        spindle.connect(address)
        self.ex = spindle.Executor()

    def call(self) -> None:
        self.ex.submit(empty).result()

    def many(self, n: int) -> None:
        for f in [self.ex.submit(empty) for _ in range(n)]:
            f.result()

    def stop(self) -> None:
        import spindle

        self.ex.shutdown()
        spindle.disconnect()
        self.server.stdin.close()  # --embedded: the server stops at the end of its stdin
        try:
            self.server.wait(10)
        except subprocess.TimeoutExpired:
            self.server.kill()


class Ray:
    """``ray.init(num_cpus=2)`` (a local cluster) and a task."""

    def settle(self) -> None:
        pass

    def start(self) -> None:
        import ray

        ray.init(num_cpus=2, include_dashboard=False, logging_level="ERROR", log_to_driver=False)
        self.task = ray.remote(empty)

    def call(self) -> None:
        import ray

        ray.get(self.task.remote())

    def many(self, n: int) -> None:
        import ray

        ray.get([self.task.remote() for _ in range(n)])

    def stop(self) -> None:
        import ray

        ray.shutdown()


class Lithops:
    """Lithops' localhost backend (2 worker processes, localhost storage)."""

    def start(self) -> None:
        import lithops

        config = {"lithops": {"backend": "localhost", "storage": "localhost", "log_level": "ERROR"},
                  "localhost": {"runtime": sys.executable, "worker_processes": 2}}
        self.fexec = lithops.FunctionExecutor(config=config)

    # include_modules=None: ship no modules; the empty function travels by value. (By default
    # Lithops copies the modules it sees referenced, here this benchmark's and the spindle SDK,
    # and a partial copy of a package fails to import in its workers.)
    def call(self) -> None:
        self.fexec.call_async(empty_of, 0, include_modules=None)
        self.fexec.get_result()

    def many(self, n: int) -> None:
        self.fexec.map(empty_of, range(n), include_modules=None)
        self.fexec.get_result()

    def settle(self) -> None:
        """Wait, untimed, for the localhost backend's job manager to exit after a job. Lithops 3.8
        stops its task consumers once results are in, but a job invoked before the manager thread
        exits finds no consumer and never runs (a race, seen here as a hang)."""
        manager = self.fexec.compute_handler.job_manager
        if manager is not None:
            manager.join()

    def stop(self) -> None:
        self.fexec.clean()


SYSTEMS = {"spindle": Spindle, "ray": Ray, "lithops": Lithops}


def bench(name: str, calls: int, burst: int, colds: int) -> dict:
    """Cold: ``colds`` times, the platform started afresh (start-up), then its first call (no warm
    worker yet). Warm, on the last one (after an untimed burst, so its pool has grown): ``calls``
    sequential calls after 8 of warm-up, then ``burst`` calls submitted at once (calls/s). ``settle`` runs untimed after each."""
    system = SYSTEMS[name]()
    clock = time.perf_counter
    startup, first = [], []
    for i in range(colds):
        t0 = clock()
        system.start()
        t1 = clock()
        try:
            system.call()
            first.append(clock() - t1)
            startup.append(t1 - t0)
            system.settle()
        except BaseException:
            system.stop()
            raise
        if i < colds - 1:
            system.stop()
    try:
        system.many(burst)  # the pool grows to what a burst needs, as a warm platform's has
        system.settle()
        for _ in range(8):
            system.call()
            system.settle()
        lat = []
        for _ in range(calls):
            t = clock()
            system.call()
            lat.append(clock() - t)
            system.settle()
        t = clock()
        system.many(burst)
        tput = burst / (clock() - t)
    finally:
        system.stop()
    return {"lat": lat, "tput": tput, "startup": startup, "first": first}


def _run_child(fn, args: tuple, out) -> None:
    os.setsid()  # its own process group: the peer's processes can be killed with it
    try:
        out.put(("ok", fn(*args)))
    except Exception as e:  # reported by the parent
        out.put(("error", f"{type(e).__name__}: {e}"))


def kill_group(pid: int) -> None:
    """SIGKILL the process group that ``pid`` leads (a peer's child and what it started)."""
    try:
        os.killpg(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def run_isolated(fn, args: tuple, limit_s: float):
    """``fn(*args)`` (a peer's benchmark) in a child process, so a peer that hangs (seen with
    Lithops' localhost backend) is stopped after `limit_s` and reported instead of stalling
    the run."""
    ctx = mp.get_context("fork")  # the child keeps __main__, where the functions live
    out = ctx.Queue()
    child = ctx.Process(target=_run_child, args=(fn, args, out))
    child.start()
    try:
        status, value = out.get(timeout=limit_s)
    except queue.Empty:
        kill_group(child.pid)
        raise TimeoutError(f"did not finish within {limit_s:.0f} s") from None
    finally:
        child.join(10)
        if child.is_alive():
            kill_group(child.pid)
            child.join()
    if status == "error":
        raise RuntimeError(value)
    return value


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--calls", type=int, default=300 if QUICK else 2000, help="sequential calls for latency")
    ap.add_argument("--burst", type=int, default=1000 if QUICK else 5000, help="calls at once for throughput")
    ap.add_argument("--colds", type=int, default=1 if QUICK else 3, help="fresh starts for the cold figures")
    ap.add_argument("--lithops-calls", type=int, default=5 if QUICK else 10)
    ap.add_argument("--lithops-burst", type=int, default=20 if QUICK else 50)
    ap.add_argument("--map-tasks", type=int, default=2000 if QUICK else 10_000,
                    help="tiny tasks for the map without a chunk size")
    ap.add_argument("--no-peers", action="store_true", help="Spindle and the standard library only")
    ap.add_argument("--no-docs", action="store_true")
    args = ap.parse_args()

    results, missing = {}, {}
    peers = [] if args.no_peers else [("ray", args.calls, args.burst),
                                      ("lithops", args.lithops_calls, args.lithops_burst)]
    for name, calls, burst in [("spindle", args.calls, args.burst), *peers]:
        log(f"{name}: {args.colds} cold start(s) and first calls, {calls} sequential calls, then {burst} at once")
        if name == "spindle":  # Spindle's own failure fails the benchmark
            results[name] = bench(name, calls, burst, args.colds)
            continue
        try:
            results[name] = run_isolated(bench, (name, calls, burst, args.colds), 120)
        except Exception as e:  # a peer that cannot run here is reported, never faked
            missing[name] = f"{type(e).__name__}: {e}"
            log(f"  {name} could not run: {missing[name]}")

    med = statistics.median

    def cold(result: dict) -> float:
        """Seconds from nothing to a first result: start-up plus first call, median."""
        return med([a + b for a, b in zip(result["startup"], result["first"])])

    s = results["spindle"]
    rows, claims = [], []
    for name in ("ray", "lithops"):
        if name not in results:
            continue
        r = results[name]
        rows += [
            [f"warm round trip p50 (ms), vs {name}", percentile(s["lat"], .5) * 1e3,
             percentile(r["lat"], .5) * 1e3, percentile(r["lat"], .5) / percentile(s["lat"], .5)],
            [f"warm round trip p99 (ms), vs {name}", percentile(s["lat"], .99) * 1e3,
             percentile(r["lat"], .99) * 1e3, percentile(r["lat"], .99) / percentile(s["lat"], .99)],
            [f"empty functions/s, vs {name}", s["tput"], r["tput"], s["tput"] / r["tput"]],
            [f"cold: first call on a fresh platform (ms), vs {name}", med(s["first"]) * 1e3,
             med(r["first"]) * 1e3, med(r["first"]) / med(s["first"])],
            [f"cold: platform start-up (ms), vs {name}", med(s["startup"]) * 1e3, med(r["startup"]) * 1e3,
             med(r["startup"]) / med(s["startup"])],
        ]
        p50_s, p50_r = percentile(s["lat"], .5) * 1e3, percentile(r["lat"], .5) * 1e3
        goal = name == "ray"
        claims += [
            Claim(f"warm empty-function round trip p50, vs {name}", f"{p50_s:.3f} ms",
                  f"{name} {p50_r:.2f} ms", p50_r / p50_s, "p50 < 0.5 ms" if goal else "-",
                  p50_s < 0.5 if goal else None),
            Claim(f"empty functions/s, vs {name}", f"{s['tput']:,.0f}/s", f"{name} {r['tput']:,.0f}/s",
                  s["tput"] / r["tput"], "≥ 3,000/s and ≥ 2.0" if goal else "-",
                  s["tput"] >= 3000 and s["tput"] >= 2 * r["tput"] if goal else None),
            Claim(f"cold: platform start-up and first call, vs {name}", f"{cold(s) * 1e3:.0f} ms",
                  f"{name} {cold(r) * 1e3:.0f} ms", cold(r) / cold(s), "-", None),
        ][:3 if goal else 1]  # Lithops: the round trip is enough for the summary
    headers = ["measure", "spindle", "peer", "speed-up (peer/spindle time)"]
    print_table(headers, rows)

    log(f"map of {args.map_tasks:,} tiny tasks without a chunk size: spindle, the standard library"
        + ("" if args.no_peers else ", ray"))
    maps = {"spindle.Executor().map": map_spindle(args.map_tasks),
            "concurrent.futures.ThreadPoolExecutor().map": map_stdlib(args.map_tasks)}
    if not args.no_peers:
        try:
            maps["ray.util.multiprocessing.Pool().map"] = run_isolated(map_ray, (args.map_tasks,), 300)
        except Exception as e:
            missing["ray Pool.map"] = f"{type(e).__name__}: {e}"
            log(f"  ray Pool.map could not run: {missing['ray Pool.map']}")
    mine = maps["spindle.Executor().map"]
    map_headers = [f"map of {args.map_tasks:,} tiny tasks (median of {MAP_ROUNDS})", "seconds",
                   "vs spindle (its time / spindle's)"]
    map_rows = [[name, t, t / mine] for name, t in maps.items()]
    print_table(map_headers, map_rows)
    stdlib = maps["concurrent.futures.ThreadPoolExecutor().map"]
    claims.append(Claim(f"map of {args.map_tasks:,} tiny tasks, vs the standard library's thread pool",
                        f"{mine * 1e3:.1f} ms", f"ThreadPoolExecutor {stdlib * 1e3:.1f} ms", stdlib / mine,
                        "within 3x", mine <= 3 * stdlib))
    ray_map = maps.get("ray.util.multiprocessing.Pool().map")
    if ray_map is not None:
        claims.append(Claim(f"map of {args.map_tasks:,} tiny tasks, vs Ray's multiprocessing Pool",
                            f"{mine * 1e3:.1f} ms", f"ray Pool {ray_map * 1e3:.1f} ms", ray_map / mine, "≥ 5.0",
                            ray_map >= 5 * mine))
    if args.no_docs:
        return

    images = plot(results)
    lines = [
        "## Functions vs Ray and Lithops (`bench/functions.py`)",
        "",
        f"Machine: {machine()}. Spindle's gateway and worker pool (release build), Ray "
        f"{package_version('ray')} (`ray.init(num_cpus=2)`, tasks), Lithops {package_version('lithops')} "
        "(localhost backend, 2 worker processes, localhost storage). An empty Python function, "
        f"called from Python: {args.calls} sequential calls after warm-up for the round trip "
        f"({args.lithops_calls} for Lithops), {args.burst} submitted at once for throughput "
        f"({args.lithops_burst} for Lithops), each after an untimed burst of the same size, so that "
        f"every platform's pool has grown to what a burst needs. Cold: the platform started afresh {args.colds} time(s) "
        "(`spindle server` and `connect`, `ray.init`, Lithops' `FunctionExecutor`: the start-up row), then "
        "the time of its first call, with no warm worker yet (medians). Goals: p50 under 0.5 ms, "
        "at least 3,000 calls/s and at least 2x Ray.",
        "",
        *table(headers, rows),
        "",
        f"A map of {args.map_tasks:,} tiny tasks (`x * x`) without a chunk size, from a warm pool "
        f"(median of {MAP_ROUNDS} after a warm-up): Spindle sends them in batches by itself. Goals: within "
        "3x of the standard library's thread pool, at least 5x faster than Ray's "
        "`ray.util.multiprocessing.Pool`.",
        "",
        *table(map_headers, map_rows),
        "",
        *[f"Goal missed: {c.experiment}: {c.spindle} against {c.peer} (goal {c.goal}). Spindle's "
          f"calls and the peer's share the machine's {os.cpu_count()} cores with the client submitting them, so "
          "calls/s is CPU per call, client, gateway and worker together." for c in claims if c.met is False],
        "",
        *[f"- {name} could not run here: `{why}`" for name, why in missing.items()],
        "",
        *[f"![{Path(i).stem}]({i})" for i in images],
    ]
    update_section("functions", "\n".join(lines))
    summarize("functions", claims)


def plot(results: dict) -> list[str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    IMG.mkdir(parents=True, exist_ok=True)
    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 3.5))
    for name, r in results.items():
        s = sorted(x * 1e3 for x in r["lat"])
        a.plot(s, [i / len(s) for i in range(len(s))], label=name)
    a.set_xscale("log")
    a.set_xlabel("empty-function round trip (ms, log scale)")
    a.set_ylabel("fraction of calls")
    a.legend()
    names = list(results)
    b.bar(names, [results[n]["tput"] for n in names])
    b.set_yscale("log")
    b.set_ylabel("empty functions per second (log)")
    fig.tight_layout()
    fig.savefig(IMG / "functions_overhead.png", dpi=110)
    plt.close(fig)
    return ["img/functions_overhead.png"]


if __name__ == "__main__":
    main()
