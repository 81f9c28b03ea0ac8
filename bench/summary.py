"""Print the one-screen summary of the last benchmark run (the table atop docs/benchmarks.md,
or target/bench-quick/benchmarks.md under QUICK=1). Exits 1 when there are no results yet.
``--reset`` forgets the recorded results, so that a new run's summary holds only its own."""

from __future__ import annotations

import sys

from report import DOCS, SUMMARY, SUMMARY_HEADERS, print_table, summary_rows


def main() -> None:
    if sys.argv[1:] == ["--reset"]:
        SUMMARY.unlink(missing_ok=True)
        return
    rows = summary_rows()
    if not rows:
        sys.exit(f"error: no benchmark results in {SUMMARY}; run `make bench` first")
    print(f"\nSummary ({DOCS / 'benchmarks.md'}):\n")
    print_table(SUMMARY_HEADERS, rows)


if __name__ == "__main__":
    main()
