"""Load for fault tests: client processes that call a server (or a cluster) until told to
stop, each counting its acknowledged calls in a progress file as it goes.

A fault test waits for ``FAULT_AFTER`` acknowledged calls before it injects the fault, and
for as many more after the fault is over before it stops the load, so the fault always lands
under load and the load always outlives it, however slow the machine::

    with LoadClients(EXACTLY_ONCE, lambda i: [address, "load", str(i)], 3, tmp_path) as load:
        load.wait_acknowledged(FAULT_AFTER)
        before = load.acknowledged()
        inject_the_fault()
        load.wait_acknowledged(load.acknowledged() + FAULT_AFTER)
        results = load.stop()

A load script takes its own arguments, then the stop file, its progress file and its output
file (``sys.argv[-3:]``), and calls ``Progress.acknowledged(n)`` after each acknowledged call.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable, Dict, List, Optional

# Acknowledged calls (summed over the load's clients) before a fault, and again after it.
FAULT_AFTER = 50


class Progress:
    """The load script's side: how many of its calls were acknowledged so far, in a file the
    test reads while the script runs (overwritten in place, fixed width)."""

    WIDTH = 12

    def __init__(self, path: str) -> None:
        self.file = open(path, "w")
        self.acknowledged(0)

    def acknowledged(self, count: int) -> None:
        self.file.seek(0)
        self.file.write(f"{count:{self.WIDTH}d}")
        self.file.flush()


class LoadClients:
    """``count`` processes running ``script`` (``python -c``), the i-th with ``args(i)``."""

    def __init__(
        self, script: str, args: Callable[[int], List[str]], count: int, tmp_path: Path,
        env: Optional[Dict[str, str]] = None,
    ) -> None:
        from conftest import pythonpath_for_tests

        self.count = count
        self.stop_file = tmp_path / "load.stop"
        self.progress = [tmp_path / f"load{i}.progress" for i in range(count)]
        self.out = [tmp_path / f"load{i}.json" for i in range(count)]
        env = dict(os.environ if env is None else env, PYTHONPATH=pythonpath_for_tests())
        self.procs = [
            subprocess.Popen(
                [sys.executable, "-c", script, *args(i), str(self.stop_file), str(self.progress[i]),
                 str(self.out[i])],
                env=env,
            )
            for i in range(count)
        ]

    def each_acknowledged(self) -> List[int]:
        """Calls acknowledged so far, per client."""
        counts = []
        for path in self.progress:
            try:
                counts.append(int(path.read_text() or 0))
            except (OSError, ValueError):  # not started yet, or read mid-write
                counts.append(0)
        return counts

    def acknowledged(self) -> int:
        """Calls acknowledged so far, over all clients."""
        return sum(self.each_acknowledged())

    def wait_acknowledged(self, count: int, deadline: float = 120.0) -> int:
        """Wait until ``count`` calls were acknowledged, and each client had one (its first
        connect is not retried, so no fault may come before every client is connected);
        fails if a client ended or the deadline (a bound on failure only) passed first.
        Returns the count reached."""
        end = time.monotonic() + deadline
        while (done := sum(each := self.each_acknowledged())) < count or 0 in each:
            ended = [p.returncode for p in self.procs if p.poll() is not None]
            assert not ended, f"a load client ended early (exit codes {ended}) at {done} acknowledged calls"
            assert time.monotonic() < end, f"{done} of {count} calls acknowledged after {deadline} s"
            time.sleep(0.01)
        return done

    def stop(self, timeout: float = 90.0) -> List[dict]:
        """Stop the clients; each one's output (what it saw acknowledged)."""
        self.stop_file.touch()
        for p in self.procs:
            assert p.wait(timeout) == 0, f"a load client exited with {p.returncode}"
        return [json.loads(path.read_text()) for path in self.out]

    def kill(self) -> None:
        self.stop_file.touch()
        for p in self.procs:
            if p.poll() is None:
                p.kill()
                p.wait()

    def __enter__(self) -> "LoadClients":
        return self

    def __exit__(self, *exc: object) -> None:
        self.kill()


# Increments persistent counters and merges into a persistent Dict, recording every
# acknowledged result. The server (or a cluster's leaders) dies under it again and again; the
# SDK resends each call, with the same seq, until a server answers. Arguments: address (a
# list for a cluster), the objects' name prefix, this client's number. Its progress counts
# rounds (the shared counter's increments, each followed by two more calls).
EXACTLY_ONCE = r"""
import json, os, sys
import spindle, spindle.client
from load import Progress
spindle.client.RETRIES = 9  # reconnect for up to ~25 s: a restart takes milliseconds
address, prefix, me, stop, progress, out = sys.argv[1:]
spindle.connect(address, embedded=False)
shared = spindle.Counter(name=prefix + ".shared", persistent=True)
mine = spindle.Counter(name=prefix + ".c" + me, persistent=True)
merges = spindle.Dict(name=prefix + ".dict", persistent=True)
progress = Progress(progress)
seen, adds, merged = [], 0, 0
while not os.path.exists(stop):
    seen.append(shared.add(1))
    adds = mine.add(1)
    merged = merges.merge("k" + me, 1, "sum")
    progress.acknowledged(len(seen))
with open(out, "w") as f:
    json.dump({"seen": seen, "adds": adds, "merged": merged}, f)
"""
