"""The serverless shell: `spindle sh` and the shell object commands, beside local peers.

Starts ``spindle server`` (its function pool sized for the run) and ``redis-server`` on free
loopback ports, then measures, as a user at a terminal would (each figure is whole process
invocations, start-up included):

* **`spindle sh true`, warm round trip**: sequential invocations once the pool is warm, p50
  and p99, beside running ``bash -c true`` locally (the floor: a process start of bash);
* **100 parallel invocations**: GNU ``parallel -j 100`` running ``spindle sh "echo N"`` 100
  times, beside GNU ``parallel -j 100`` running ``echo N`` locally (100 warm workers: the
  pool is grown by a first round);
* **object commands**: ``counter -n c increment`` beside ``redis-cli INCR c``, sequential,
  each a process start plus one round trip, p50 and p99.

Prints the tables, writes the ``shell`` section of ``docs/benchmarks.md`` and a plot under
``docs/img/``. Usage: ``python bench/shell.py [--no-docs]`` (``QUICK=1``: fewer runs).
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from objects import free_port, redis_cmd, stop_process, wait_for_port
from report import IMG, QUICK, Claim, log, machine, percentile, print_table, redis_version, summarize, table, update_section

from spindle.embedded import find_binary

PARALLEL = 100  # invocations at once (the figure)


def timed_runs(cmd: list[str], runs: int, env: dict) -> list[float]:
    """Milliseconds of each of ``runs`` sequential runs of ``cmd`` (after 5 warm-ups)."""
    samples = []
    for i in range(runs + 5):
        t0 = time.perf_counter()
        done = subprocess.run(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        elapsed = (time.perf_counter() - t0) * 1e3
        if done.returncode != 0:
            raise RuntimeError(f"{cmd} failed ({done.returncode}): {done.stderr.decode(errors='replace')}")
        if i >= 5:
            samples.append(elapsed)
    return samples


def parallel_seconds(command: str, env: dict, rounds: int) -> list[float]:
    """Seconds for GNU parallel to run ``command`` (``{}`` is 1..100) 100 times at once."""
    times = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        done = subprocess.run(["parallel", "-j", str(PARALLEL), command, ":::", *map(str, range(1, PARALLEL + 1))],
                              env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        times.append(time.perf_counter() - t0)
        lines = done.stdout.decode().split()
        if done.returncode != 0 or sorted(map(int, lines)) != list(range(1, PARALLEL + 1)):
            raise RuntimeError(f"parallel {command!r} failed ({done.returncode}): "
                               f"{done.stderr.decode(errors='replace')[-2000:]}")
    return times


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--no-docs", action="store_true", help="print only; do not write docs/benchmarks.md")
    args = ap.parse_args()
    runs, rounds = (40, 1) if QUICK else (300, 5)
    for tool in ("parallel", "redis-cli"):
        if not shutil.which(tool):
            sys.exit(f"error: {tool} not found; `make bench` installs it (apt-get install parallel redis-server)")

    binary = find_binary()
    bindir = Path(tempfile.mkdtemp(prefix="spindle-bench-shell-"))
    (bindir / "counter").symlink_to(binary)
    port, rport = free_port(), free_port()
    server = subprocess.Popen([binary, "server", "--port", str(port), "--python", sys.executable,
                               "--max-workers", str(PARALLEL), "--idle-timeout", "600"],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    redis = subprocess.Popen(redis_cmd(rport), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    env = dict(os.environ, SPINDLE_ADDRESS=f"127.0.0.1:{port}", PATH=f"{bindir}:{os.environ['PATH']}")
    try:
        wait_for_port(port, server)
        wait_for_port(rport, redis)
        log(f"spindle sh true: {runs} sequential runs...")
        sh = timed_runs([binary, "sh", "true"], runs, env)
        local = timed_runs(["bash", "-c", "true"], runs, env)
        log(f"{PARALLEL} parallel invocations ({rounds} rounds, after one that grows the pool)...")
        parallel_seconds(f"{binary} sh 'echo {{}}'", env, 1)
        par_sh = parallel_seconds(f"{binary} sh 'echo {{}}'", env, rounds)
        par_local = parallel_seconds("echo {}", env, rounds)
        log(f"object commands: {runs} sequential increments each...")
        incr = timed_runs(["counter", "-n", "bench-shell", "increment"], runs, env)
        rincr = timed_runs(["redis-cli", "-p", str(rport), "INCR", "bench-shell"], runs, env)
    finally:
        for proc in (server, redis):
            stop_process(proc)
        shutil.rmtree(bindir, ignore_errors=True)

    med = statistics.median
    latency_rows = [
        ["`spindle sh true` (warm)", med(sh), percentile(sh, 0.99), "`bash -c true` locally", med(local),
         percentile(local, 0.99), med(sh) / med(local), "p50 < 20 ms", "yes" if med(sh) < 20 else "no"],
        ["`counter -n c increment`", med(incr), percentile(incr, 0.99), "`redis-cli INCR c`", med(rincr),
         percentile(rincr, 0.99), med(incr) / med(rincr), "p50 < 5 ms", "yes" if med(incr) < 5 else "no"],
    ]
    latency_headers = ["command", "p50 (ms)", "p99 (ms)", "peer", "peer p50 (ms)", "peer p99 (ms)",
                       "Spindle/peer (p50)", "goal", "met"]
    parallel_rows = [[f"{PARALLEL} × `spindle sh 'echo N'`", med(par_sh), min(par_sh), max(par_sh),
                      f"{PARALLEL} × `echo N` locally", med(par_local), med(par_sh) / med(par_local)]]
    parallel_headers = ["run by GNU parallel -j 100", "seconds (median)", "min", "max", "peer", "peer (s)", "Spindle/peer"]
    print_table(latency_headers, latency_rows)
    print_table(parallel_headers, parallel_rows)
    if args.no_docs:
        return

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    IMG.mkdir(parents=True, exist_ok=True)
    fig, ax = plt.subplots(figsize=(7, 3.5))
    data = [sh, local, incr, rincr]
    labels = ["spindle sh true", "bash -c true", "counter increment", "redis-cli INCR"]
    ax.boxplot(data, orientation="horizontal", showfliers=False)
    ax.set_yticks(range(1, len(labels) + 1), labels)
    ax.set_xlabel("milliseconds per command, process start included")
    ax.set_title("Shell commands, end to end")
    fig.tight_layout()
    fig.savefig(IMG / "shell_latency.png", dpi=110)
    plt.close(fig)

    parallel_version = subprocess.run(["parallel", "--version"], capture_output=True, text=True).stdout.split("\n")[0]
    body = "\n".join([
        "## The serverless shell (`bench/shell.py`)",
        "",
        f"Machine: {machine()}. {redis_version()}, {parallel_version}, spindle (release build). Every figure is whole commands run from Python one after another "
        f"({runs} runs after 5 warm-ups), the process start included, as at a terminal. "
        f"`spindle sh` runs the command in a warm worker of a local server (`--max-workers {PARALLEL}`) "
        "and streams its output back through the state tier.",
        "",
        *table(latency_headers, latency_rows),
        "",
        f"**{PARALLEL} parallel invocations**, GNU parallel launching them all at once, medians of {rounds} "
        "rounds (the pool was grown to 100 warm workers by a first round). Locally the commands are "
        "processes of this machine; through `spindle sh` each is a function invocation on the pool, "
        "whose workers share the same 2 cores.",
        "",
        *table(parallel_headers, parallel_rows),
        "",
        "![shell_latency](img/shell_latency.png)",
    ])
    update_section("shell", body)
    summarize("shell", [
        Claim("`spindle sh true`, warm, p50", f"{med(sh):.1f} ms", f"`bash -c true` locally {med(local):.1f} ms",
              med(local) / med(sh), "p50 < 20 ms", med(sh) < 20),
        Claim("`counter increment` command, p50", f"{med(incr):.1f} ms", f"`redis-cli INCR` {med(rincr):.1f} ms",
              med(rincr) / med(incr), "p50 < 5 ms", med(incr) < 5),
        Claim(f"{PARALLEL} parallel `spindle sh` by GNU parallel", f"{med(par_sh):.2f} s",
              f"local processes {med(par_local):.2f} s", med(par_local) / med(par_sh), "-", None),
    ])
    log("wrote docs/benchmarks.md (shell section) and docs/img/shell_latency.png")


if __name__ == "__main__":
    main()
