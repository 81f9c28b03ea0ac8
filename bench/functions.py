"""Function overhead and Monte Carlo scaling: Spindle beside Ray and Lithops in one run.

* warm invocation round trip of an empty function, p50 and p99 (one call at a time);
* empty-function throughput (all calls submitted at once);
  peers: Ray tasks (`ray.init(num_cpus=2)`, local) and Lithops' localhost backend;
* Monte Carlo pi (examples/pi.py) with 1, 2 and 4 workers: points/s and scaling.

Prints the tables with the ratios and rewrites the "functions" section of docs/benchmarks.md
with plots under docs/img/. Usage: python bench/functions.py [--calls N] [--no-docs]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import queue
import subprocess
import sys
import time
from pathlib import Path

from report import IMG, ROOT, log, machine, print_table, table, update_section
from spindle.embedded import find_binary

sys.path.insert(0, str(ROOT / "python"))


def empty() -> None:
    return None


def empty_of(_: object) -> None:  # Lithops passes each call one argument
    return None


def quantile(samples: list[float], q: float) -> float:
    s = sorted(samples)
    return s[min(len(s) - 1, int(q * len(s)))]


def start_server(*args: str) -> tuple[subprocess.Popen, str]:
    proc = subprocess.Popen([find_binary(), "server", "--port", "0", "--embedded", *args],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    for line in proc.stdout:
        if line.startswith("spindle listening on "):
            return proc, line.split()[-1]
    raise RuntimeError("spindle server did not start")


def bench_spindle(calls: int, burst: int) -> dict:
    import spindle

    server, address = start_server()
    try:
        spindle.connect(address)
        with spindle.Executor() as ex:
            for f in [ex.submit(empty) for _ in range(8)]:  # start the pool: warm workers
                f.result()
            lat = []
            for _ in range(calls):
                t = time.perf_counter()
                ex.submit(empty).result()
                lat.append(time.perf_counter() - t)
            t = time.perf_counter()
            for f in [ex.submit(empty) for _ in range(burst)]:
                f.result()
            tput = burst / (time.perf_counter() - t)
        spindle.disconnect()
    finally:
        server.stdin.close()  # --embedded: the server stops at the end of its stdin
        try:
            server.wait(10)
        except subprocess.TimeoutExpired:
            server.kill()
    return {"lat": lat, "tput": tput}


def bench_ray(calls: int, burst: int) -> dict:
    import ray

    ray.init(num_cpus=2, include_dashboard=False, logging_level="ERROR", log_to_driver=False)
    try:
        task = ray.remote(empty)
        ray.get([task.remote() for _ in range(8)])
        lat = []
        for _ in range(calls):
            t = time.perf_counter()
            ray.get(task.remote())
            lat.append(time.perf_counter() - t)
        t = time.perf_counter()
        ray.get([task.remote() for _ in range(burst)])
        tput = burst / (time.perf_counter() - t)
    finally:
        ray.shutdown()
    return {"lat": lat, "tput": tput}


def bench_lithops(calls: int, burst: int) -> dict:
    import lithops

    config = {"lithops": {"backend": "localhost", "storage": "localhost", "log_level": "ERROR"},
              "localhost": {"runtime": sys.executable, "worker_processes": 2}}
    fexec = lithops.FunctionExecutor(config=config)
    try:
        fexec.call_async(empty_of, 0)
        fexec.get_result()
        lat = []
        for _ in range(calls):
            t = time.perf_counter()
            fexec.call_async(empty_of, 0)
            fexec.get_result()
            lat.append(time.perf_counter() - t)
        t = time.perf_counter()
        fexec.map(empty_of, range(burst))
        fexec.get_result()
        tput = burst / (time.perf_counter() - t)
    finally:
        fexec.clean()
    return {"lat": lat, "tput": tput}


def _run_child(fn, calls: int, burst: int, out) -> None:
    try:
        out.put(("ok", fn(calls, burst)))
    except Exception as e:  # reported by the parent
        out.put(("error", f"{type(e).__name__}: {e}"))


def run_isolated(fn, calls: int, burst: int, limit_s: float) -> dict:
    """Run a peer's benchmark in a child process, so a peer that hangs (seen with Lithops'
    localhost backend) is stopped after `limit_s` and reported instead of stalling the run."""
    ctx = mp.get_context("fork")  # the child keeps __main__, where the functions live
    out = ctx.Queue()
    child = ctx.Process(target=_run_child, args=(fn, calls, burst, out))
    child.start()
    try:
        status, value = out.get(timeout=limit_s)
    except queue.Empty:
        child.kill()
        raise TimeoutError(f"did not finish within {limit_s:.0f} s") from None
    finally:
        child.join(10)
        if child.is_alive():
            child.kill()
    if status == "error":
        raise RuntimeError(value)
    return value


def bench_pi(workers: list[int], points: int) -> dict[int, float]:
    """points/s of examples/pi.py with as many cloud threads as pool workers."""
    env = {k: v for k, v in os.environ.items() if k != "SPINDLE_ADDRESS"}
    env["PYTHONPATH"] = str(ROOT / "python")
    rates = {}
    for w in workers:
        out = subprocess.run([find_binary(), "run", "--max-workers", str(w),
                              str(ROOT / "examples" / "pi.py"), "--threads", str(w),
                              "--points", str(points), "--json"],
                             env=env, capture_output=True, text=True, check=True)
        rates[w] = json.loads(out.stdout.strip().splitlines()[-1])["points_per_s"]
        log(f"  pi with {w} workers: {rates[w]:,.0f} points/s")
    return rates


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--calls", type=int, default=2000, help="sequential calls for latency")
    ap.add_argument("--burst", type=int, default=5000, help="calls at once for throughput")
    ap.add_argument("--lithops-calls", type=int, default=10)
    ap.add_argument("--lithops-burst", type=int, default=50)
    ap.add_argument("--points", type=int, default=50_000_000, help="pi: points per worker")
    ap.add_argument("--no-docs", action="store_true")
    args = ap.parse_args()

    results, missing = {}, {}
    for name, fn, calls, burst in [("spindle", bench_spindle, args.calls, args.burst),
                                   ("ray", bench_ray, args.calls, args.burst),
                                   ("lithops", bench_lithops, args.lithops_calls,
                                    args.lithops_burst)]:
        log(f"{name}: {calls} sequential calls, then {burst} at once")
        try:
            results[name] = fn(calls, burst) if name == "spindle" else run_isolated(fn, calls, burst, 300)
        except Exception as e:  # a peer that cannot run here is reported, never faked
            missing[name] = f"{type(e).__name__}: {e}"
            log(f"  {name} could not run: {missing[name]}")
    log("Monte Carlo pi with 1, 2 and 4 workers")
    pi = bench_pi([1, 2, 4], args.points)

    s = results["spindle"]
    rows = []
    for name in ("ray", "lithops"):
        if name not in results:
            continue
        r = results[name]
        rows += [
            [f"round trip p50 (ms), vs {name}", quantile(s["lat"], .5) * 1e3,
             quantile(r["lat"], .5) * 1e3, quantile(r["lat"], .5) / quantile(s["lat"], .5)],
            [f"round trip p99 (ms), vs {name}", quantile(s["lat"], .99) * 1e3,
             quantile(r["lat"], .99) * 1e3, quantile(r["lat"], .99) / quantile(s["lat"], .99)],
            [f"empty functions/s, vs {name}", s["tput"], r["tput"], s["tput"] / r["tput"]],
        ]
    headers = ["measure", "spindle", "peer", "speed-up (peer/spindle time)"]
    print_table(headers, rows)
    pi_rows = [[w, rate, rate / pi[1], rate / pi[1] / w] for w, rate in pi.items()]
    pi_headers = ["workers", "points/s", "speed-up vs 1", "efficiency"]
    print_table(pi_headers, pi_rows)
    if args.no_docs:
        return

    images = plot(results, pi)
    lines = [
        "## Functions vs Ray and Lithops (`bench/functions.py`)",
        "",
        f"Machine: {machine()}. Spindle's gateway and worker pool (release build), Ray "
        f"{version('ray')} (`ray.init(num_cpus=2)`, tasks), Lithops {version('lithops')} "
        "(localhost backend, 2 worker processes, localhost storage). An empty Python function, "
        f"called from Python: {args.calls} sequential calls after warm-up for the round trip "
        f"({args.lithops_calls} for Lithops), {args.burst} submitted at once for throughput "
        f"({args.lithops_burst} for Lithops). Goals: p50 under 0.5 ms, at least 3,000 calls/s "
        "and at least 2x Ray.",
        "",
        *table(headers, rows),
        "",
        *[f"- {name} could not run here: `{why}`" for name, why in missing.items()],
        "",
        f"Monte Carlo pi (`examples/pi.py`, Listing 1), {args.points:,} points per cloud thread, "
        "as many threads as pool workers (`spindle run --max-workers W`); this machine has "
        f"{os.cpu_count()} cores, so 4 workers share 2.",
        "",
        *table(pi_headers, pi_rows),
        "",
        *[f"![{Path(i).stem}]({i})" for i in images],
    ]
    update_section("functions", "\n".join(lines))


def version(module: str) -> str:
    try:
        return __import__(module).__version__
    except Exception:
        return "(not installed)"


def plot(results: dict, pi: dict[int, float]) -> list[str]:
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

    fig, ax = plt.subplots(figsize=(5, 3.5))
    ws = sorted(pi)
    ax.plot(ws, [pi[w] / 1e6 for w in ws], "o-", label="spindle")
    ax.plot(ws, [pi[1] * min(w, os.cpu_count()) / 1e6 for w in ws], "--", label="linear up to the cores")
    ax.set_xlabel("workers")
    ax.set_ylabel("million points/s")
    ax.set_xticks(ws)
    ax.legend()
    fig.tight_layout()
    fig.savefig(IMG / "functions_pi.png", dpi=110)
    plt.close(fig)
    return ["img/functions_overhead.png", "img/functions_pi.png"]


if __name__ == "__main__":
    main()
