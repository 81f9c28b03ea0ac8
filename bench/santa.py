"""Santa Claus problem: completion time in the three modes of examples/santa_claus.py.

`threading` objects + local threads, Spindle objects + local threads, Spindle objects +
cloud threads (`spindle.Thread`), each run `--runs` times (10 elves, 9 reindeer, 15
deliveries), interleaved so that machine noise hits every mode alike. The Spindle modes run
under `spindle run --max-workers 24` (20 cloud threads at once). Prints p50/p99 and the
overhead against `threading` and rewrites the "santa" section of docs/benchmarks.md.

Usage: python bench/santa.py [--runs 7] [--scale 1.0] [--no-docs] (QUICK=1: 2 runs,
sleeps halved)
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys

from report import IMG, QUICK, ROOT, Claim, log, machine, percentile, print_table, summarize, table, update_section
from spindle.embedded import find_binary

MODES = ["threading", "objects", "cloud"]


def run(mode: str, scale: float) -> float:
    env = {k: v for k, v in os.environ.items() if k != "SPINDLE_ADDRESS"}
    env["PYTHONPATH"] = str(ROOT / "python")
    env["SPINDLE_PYTHON"] = sys.executable  # the program and its workers: this environment's
    script = [str(ROOT / "examples" / "santa_claus.py"), "--mode", mode, "--scale", str(scale),
              "--json"]
    cmd = [find_binary(), "run", "--max-workers", "24", *script]
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True)
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["deliveries"] == 15
    return result["seconds"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=2 if QUICK else 7)
    ap.add_argument("--scale", type=float, default=0.5 if QUICK else 1.0, help="multiplies every sleep")
    ap.add_argument("--no-docs", action="store_true")
    args = ap.parse_args()

    times: dict[str, list[float]] = {m: [] for m in MODES}
    for i in range(args.runs):
        for mode in MODES:
            times[mode].append(run(mode, args.scale))
        log(f"  run {i + 1}/{args.runs}: " + ", ".join(f"{m} {times[m][-1]:.2f} s" for m in MODES))

    base = statistics.median(times["threading"])
    headers = ["mode", "p50 (s)", "p99 (s)", "overhead vs threading (p50)"]
    labels = {"threading": "threading objects + local threads",
              "objects": "Spindle objects + local threads",
              "cloud": "Spindle objects + spindle.Thread"}
    rows = [[labels[m], statistics.median(times[m]), percentile(times[m], 0.99),
             "-" if m == "threading" else f"{(statistics.median(times[m]) / base - 1) * 100:+.1f}%"]
            for m in MODES]
    print_table(headers, rows)
    if args.no_docs:
        return

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    IMG.mkdir(parents=True, exist_ok=True)
    fig, ax = plt.subplots(figsize=(6, 3.2))
    ax.boxplot([times[m] for m in MODES], tick_labels=[labels[m].replace(" + ", "\n+ ") for m in MODES])
    ax.set_ylabel("completion time (s)")
    fig.tight_layout()
    fig.savefig(IMG / "santa.png", dpi=110)
    plt.close(fig)
    lines = [
        "## Santa Claus problem (`bench/santa.py`)",
        "",
        f"Machine: {machine()}. `examples/santa_claus.py`: 10 elves, 9 reindeer, 15 deliveries, "
        f"{args.runs} runs per mode, interleaved; sleeps scaled by {args.scale}. The seed "
        "reports 3.8% and 9.0% overhead; the goal here is at most 5%. In cloud mode the worker",
        "pool is warmed to the 20 threads before the clock starts, as a threaded program's",
        "threads exist before they work (cold starts are measured in the functions section).",
        "",
        *table(headers, rows),
        "",
        *[f"Goal missed: {labels[m]} at {(statistics.median(times[m]) / base - 1) * 100:+.1f}%. The "
          "program sleeps most of its time; the rest is one round trip per synchronization call, "
          "so what costs is the machine's wake-up latency." for m in MODES[1:]
          if statistics.median(times[m]) > 1.05 * base],
        "",
        "![santa](img/santa.png)",
    ]
    update_section("santa", "\n".join(lines))
    cloud = statistics.median(times["cloud"])  # Spindle objects + spindle.Thread: the whole port
    summarize("santa", [Claim(f"Santa Claus, {labels['cloud']}, p50", f"{cloud:.2f} s", f"threading {base:.2f} s",
                              base / cloud, "overhead ≤ 5%", cloud <= 1.05 * base)])


if __name__ == "__main__":
    main()
