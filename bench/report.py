"""Shared by the benchmarks: logging, the machine's description, peer versions, tables, the
one-screen summary, and ``docs/benchmarks.md``, where each benchmark owns one section between
markers (``<!-- bench:NAME -->`` ... ``<!-- /bench:NAME -->``) and rewrites only that one.

``QUICK=1`` in the environment makes every benchmark a smoke check: small sizes, and its
report goes to ``target/bench-quick/`` so that the published one is never overwritten by
noisy figures.
"""

from __future__ import annotations

import datetime
import json
import os
import re
import shutil
import subprocess
import sys
from dataclasses import asdict, dataclass
from importlib import metadata
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
QUICK = os.environ.get("QUICK", "") not in ("", "0")
DOCS = ROOT / "target" / "bench-quick" if QUICK else ROOT / "docs"
IMG = DOCS / "img"
SUMMARY = DOCS / "benchmarks-summary.json"
HEADER = """# Benchmarks

Every figure is measured side by side with the real peer in one run on one machine,
and reported as a ratio. Regenerate with `make bench` (it installs `redis-server`,
`zookeeper` and the pinned peers of `requirements-bench.lock`); each `bench/*.py` rewrites
only its own section, and the summary below is rebuilt from every section's results.
"""


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def machine() -> str:
    """Cores, memory and CPU of this machine, and today's date: the first words of every table."""
    info = Path("/proc/cpuinfo").read_text().splitlines()
    cpu = next((line.split(":", 1)[1].strip() for line in info if line.startswith("model name")), "unknown CPU")
    mem_kib = next((int(line.split()[1]) for line in Path("/proc/meminfo").read_text().splitlines()
                    if line.startswith("MemTotal:")), 0)
    return f"{os.cpu_count()} cores, {mem_kib / 2**20:.0f} GiB, {cpu}; {datetime.date.today().isoformat()}"


def redis_version() -> str:
    """`Redis 7.0.15` (the redis-server on PATH) and its Python client's version."""
    out = subprocess.run([shutil.which("redis-server") or "redis-server", "--version"],
                         capture_output=True, text=True).stdout.split()
    server = next((w[2:] for w in out if w.startswith("v=")), "?")
    return (f"Redis {server} (Python clients: redis-py {package_version('redis')} with hiredis "
            f"{package_version('hiredis')})")


def package_version(name: str) -> str:
    """The installed version of a Python package (a peer from requirements-bench.lock)."""
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return "not installed"


def percentile(samples, q: float) -> float:
    """The q-quantile of ``samples`` (any sequence or NumPy array): the sample at index q·n of the
    sorted samples, so that p99 of 100 samples is the largest."""
    s = sorted(samples)
    return float(s[min(len(s) - 1, int(q * len(s)))])


def sequential_latency(call, keys: int, ops: int, warmup: int) -> dict:
    """Mean, p50 and p99 in µs of ``ops`` sequential ``call(key)`` on random keys below
    ``keys``, after ``warmup`` calls."""
    import random
    import statistics
    import time

    rng = random.Random(1)
    for _ in range(min(warmup, ops)):
        call(rng.randrange(keys))
    clock, samples = time.perf_counter_ns, []
    for _ in range(ops):
        i = rng.randrange(keys)
        t0 = clock()
        call(i)
        samples.append((clock() - t0) / 1000.0)
    return {"mean_us": statistics.fmean(samples), "p50_us": percentile(samples, 0.5),
            "p99_us": percentile(samples, 0.99)}


def table(headers: list[str], rows: list[list]) -> list[str]:
    """A Markdown table; floats get thousands separators and sensible precision."""
    def cell(v) -> str:
        if isinstance(v, float):
            return f"{v:,.2f}" if abs(v) >= 10 else f"{v:.3g}"
        return f"{v:,}" if isinstance(v, int) else str(v)

    lines = ["| " + " | ".join(headers) + " |",
             "|" + "|".join("---" if i == 0 else "---:" for i in range(len(headers))) + "|"]
    lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in rows]
    return lines


def print_table(headers: list[str], rows: list[list]) -> None:
    print("\n".join(table(headers, rows)), flush=True)


@dataclass
class Claim:
    """One line of the summary: an experiment's figure for Spindle and for the peer, their
    ratio (oriented so that above 1 means Spindle is better), the goal and whether it is met."""
    experiment: str
    spindle: str
    peer: str
    ratio: float
    goal: str
    met: bool | None  # None: no goal, reported for context


SUMMARY_HEADERS = ["experiment", "spindle", "peer", "ratio", "goal", "met"]


def summary_rows() -> list[list]:
    """The summary, from every benchmark's claims, in the order of their sections."""
    results = json.loads(SUMMARY.read_text()) if SUMMARY.exists() else {}
    doc = (DOCS / "benchmarks.md").read_text() if (DOCS / "benchmarks.md").exists() else ""

    def position(bench: str) -> int:
        at = doc.find(f"<!-- bench:{bench} -->")
        return at if at >= 0 else len(doc)

    rows = []
    for bench in sorted(results, key=position):
        claims = results[bench]
        for c in claims:
            met = {True: "yes", False: "**no**", None: "-"}[c["met"]]
            rows.append([f"{c['experiment']} ({bench})", c["spindle"], c["peer"], ratio_text(c["ratio"]),
                         c["goal"], met])
    return rows


def ratio_text(ratio: float) -> str:
    """Three significant digits below 10 (so 0.499 never reads as a met 0.5), whole numbers above."""
    return f"{ratio:.3g}x" if ratio < 10 else f"{ratio:,.0f}x"


def summarize(bench: str, claims: list[Claim]) -> None:
    """Record ``bench``'s claims and rebuild the summary at the top of docs/benchmarks.md."""
    results = json.loads(SUMMARY.read_text()) if SUMMARY.exists() else {}
    results[bench] = [asdict(c) for c in claims]
    SUMMARY.parent.mkdir(parents=True, exist_ok=True)
    SUMMARY.write_text(json.dumps(results, indent=1) + "\n")
    write_summary()


def write_summary() -> None:
    """The summary section of docs/benchmarks.md, from the recorded claims."""
    rows = summary_rows()
    met = sum(r[-1] == "yes" for r in rows)
    goals = sum(r[-1] != "-" for r in rows)
    update_section("summary", "\n".join([
        "## Summary",
        "",
        f"{machine()}. Each row names its section below (in parentheses), which gives the peers' "
        f"versions and settings, the spread over runs and, where a goal is missed, why. Ratios "
        f"above 1 favour Spindle (the peer's time over Spindle's, or Spindle's rate over the "
        f"peer's). Goals met: {met} of {goals}.",
        "",
        *table(SUMMARY_HEADERS, rows),
    ]))


def update_section(name: str, body: str) -> None:
    """Replace (or add) the section of docs/benchmarks.md owned by bench `name` (the
    summary goes first, the others in the order they first ran)."""
    path = DOCS / "benchmarks.md"
    text = path.read_text() if path.exists() else HEADER
    start, end = f"<!-- bench:{name} -->", f"<!-- /bench:{name} -->"
    block = f"{start}\n{body.strip()}\n{end}"
    pattern = re.compile(re.escape(start) + r".*?" + re.escape(end), re.S)
    if pattern.search(text):
        text = pattern.sub(lambda _: block, text)
    elif name == "summary" and "<!-- bench:" in text:
        first = text.index("<!-- bench:")
        text = text[:first] + block + "\n\n" + text[first:]
    else:
        text = text.rstrip() + "\n\n" + block + "\n"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    log(f"updated the {name!r} section of {path}")
