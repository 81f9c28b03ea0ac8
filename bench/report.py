"""Shared by the benchmarks: logging, the machine's description, tables, and
``docs/benchmarks.md``, where each benchmark owns one section between markers
(``<!-- bench:NAME -->`` ... ``<!-- /bench:NAME -->``) and rewrites only that one."""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
IMG = DOCS / "img"
HEADER = """# Benchmarks

Every figure is measured side by side with the real peer in one run on one machine,
and reported as a ratio. Regenerate with `make bench` (it installs `redis-server` and the
pinned peers of `requirements-bench.lock`); each script rewrites only its own section.
"""


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def machine() -> str:
    cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")), "unknown CPU")
    return f"{os.cpu_count()} cores, {cpu}"


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


def update_section(name: str, body: str) -> None:
    """Replace (or append) the section of docs/benchmarks.md owned by bench `name`."""
    path = DOCS / "benchmarks.md"
    text = path.read_text() if path.exists() else HEADER
    start, end = f"<!-- bench:{name} -->", f"<!-- /bench:{name} -->"
    block = f"{start}\n{body.strip()}\n{end}"
    pattern = re.compile(re.escape(start) + r".*?" + re.escape(end), re.S)
    if pattern.search(text):
        text = pattern.sub(lambda _: block, text)
    else:
        text = text.rstrip() + "\n\n" + block + "\n"
    path.write_text(text)
    log(f"updated the {name!r} section of {path}")
