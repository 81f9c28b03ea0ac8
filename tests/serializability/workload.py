"""A live list-append workload against a Spindle server, checked for strict serializability.

Each of ``processes`` client processes runs, until ``duration`` seconds have passed, one
transaction attempt after another: 1 to 4 micro-operations on random keys among ``keys``
lists, each an append of a unique integer or a read of the whole list. Every attempt becomes
one line of the history (the format of :mod:`.checker`), written as soon as it ends, so a
crashed run still leaves a history to check:

- the body and its commit went through: ``"ok"``;
- :class:`spindle.TransactionConflict`, or any error from a call inside the body (the
  transaction then aborts): ``"fail"``;
- any other error from the commit itself, a lost connection above all: ``"info"``, since the
  server may or may not have committed it.

Times come from ``time.monotonic()``, one clock for every process of the machine.

Command line (the server's address, else ``$SPINDLE_ADDRESS``)::

    python -m tests.serializability.workload --address 127.0.0.1:7070 --keys 8 \\
        --processes 4 --duration 10 --history history.jsonl

It prints the checker's report; exit status 0 when the history is strictly serializable,
1 when it has anomalies.
"""

from __future__ import annotations

import argparse
import itertools
import json
import multiprocessing
import os
import random
import sys
import tempfile
import time
import uuid
from typing import Any, Dict, List, Optional, Sequence

import spindle

from .checker import Report, check, load

__all__ = ["run", "main"]

MAX_OPS = 4


def run(address: str, keys: int, processes: int, duration: float, history: str) -> Report:
    """Run the workload on fresh lists of the server at ``address``, write its history to
    the file ``history`` (replaced) and check it."""
    prefix = f"serializability-{uuid.uuid4().hex[:12]}-"
    open(history, "w").close()
    # Fresh interpreters: a forked child would share its parent's connections.
    context = multiprocessing.get_context("spawn")
    workers = [context.Process(target=client, name=f"client-{process}",
                               args=(address, process, processes, keys, prefix, duration, history))
               for process in range(processes)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    failed = [worker.name for worker in workers if worker.exitcode != 0]
    if failed:
        raise RuntimeError(f"workload processes failed: {', '.join(failed)}")
    return check(load(history))


def client(address: str, process: int, processes: int, keys: int, prefix: str,
           duration: float, history: str) -> None:
    """One process of the workload: attempts until ``duration`` has passed."""
    spindle.connect(address, embedded=False)
    lists = [spindle.List(name=f"{prefix}{key}") for key in range(keys)]
    rng = random.Random()
    # Unique across processes: this process's values are its number modulo their count.
    values = (process + processes * n for n in itertools.count(1))
    deadline = time.monotonic() + duration
    fd = os.open(history, os.O_WRONLY | os.O_APPEND)
    try:
        while time.monotonic() < deadline:
            ops: List[List[Any]] = []
            for _ in range(rng.randint(1, MAX_OPS)):
                key = rng.randrange(keys)
                ops.append(["append", key, next(values)] if rng.random() < 0.5 else ["r", key, None])
            record = attempt(process, lists, ops)
            # One write per line: appends of whole lines from several processes never mix.
            os.write(fd, (json.dumps(record) + "\n").encode())
    finally:
        os.close(fd)


def attempt(process: int, lists: Sequence[spindle.List], ops: List[List[Any]]) -> Dict[str, Any]:
    """Run ``ops`` as one transaction attempt (reads fill in their values) and return its
    history record."""
    committing = False
    invoke = time.monotonic()
    try:
        with spindle.transaction():
            for op in ops:
                name, key, value = op
                if name == "append":
                    lists[key].append(value)
                else:
                    op[2] = lists[key].copy()
            committing = True
        outcome = "ok"
    except spindle.TransactionConflict:
        outcome = "fail"
    except (spindle.SpindleError, OSError):  # OSError: lost connections and timeouts
        outcome = "info" if committing else "fail"
    complete = time.monotonic()
    return {"process": process, "type": outcome, "invoke": invoke, "complete": complete, "ops": ops}


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tests.serializability.workload",
        description="Run a list-append workload of transactions against a Spindle server and "
                    "check its history for strict serializability.")
    parser.add_argument("--address", default=os.environ.get("SPINDLE_ADDRESS"),
                        help="the server (default: $SPINDLE_ADDRESS)")
    parser.add_argument("--keys", type=int, default=8, help="lists (default 8)")
    parser.add_argument("--processes", type=int, default=4, help="client processes (default 4)")
    parser.add_argument("--duration", type=float, default=10.0, help="seconds (default 10)")
    parser.add_argument("--history", help="the history file (default: a new temporary file)")
    parser.add_argument("--limit", type=int, default=10,
                        help="anomalies of each kind shown in full (default 10)")
    args = parser.parse_args(argv)
    if not args.address:
        parser.error("no server: pass --address or set SPINDLE_ADDRESS")
    if args.keys < 1 or args.processes < 1:
        parser.error("--keys and --processes must be at least 1")
    history = args.history
    if history is None:
        descriptor, history = tempfile.mkstemp(prefix="spindle-history-", suffix=".jsonl")
        os.close(descriptor)
    report = run(args.address, args.keys, args.processes, args.duration, history)
    print(f"history: {history}")
    print(report.format(args.limit))
    return 0 if report.valid else 1


if __name__ == "__main__":
    sys.exit(main())
