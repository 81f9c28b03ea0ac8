"""Load for fault tests: client processes that call a server (or a cluster) until told to
stop, each recording the time of every acknowledged call as it goes.

A fault test waits for ``FAULT_AFTER`` acknowledged calls before it injects the fault, and
for as many more after the fault is over before it stops the load, so the fault always lands
under load and the load always outlives it, however slow the machine. Whether it did is then
checked on what the clients themselves wrote at the end (``assert_under_load``), not on the
progress the waits read::

    with LoadClients(EXACTLY_ONCE, lambda i: [address, "load", str(i)], 3, tmp_path) as load:
        load.wait_acknowledged(FAULT_AFTER)
        start = time.monotonic_ns()
        inject_the_fault()
        end = time.monotonic_ns()
        load.wait_acknowledged(FAULT_AFTER, since=end)
        results = load.stop()
    assert_under_load(results, FaultWindow(start, end))

(``kills_under_load`` runs that for a series of kills.) A load script takes its own
arguments, then the stop file, its progress file and its output file (``sys.argv[-3:]``);
it calls ``Progress.acknowledged()`` after each acknowledged call, and puts
``Progress.times`` in its output as ``"acked_at"``.

Times are ``time.monotonic_ns()``: CLOCK_MONOTONIC, one clock for every process of the
machine, so the clients' times and the test's compare.
"""

from __future__ import annotations

import bisect
import json
import os
import random
import subprocess
import sys
import time
from array import array
from pathlib import Path
from typing import Callable, Dict, List, NamedTuple, Optional

# Acknowledged calls (summed over the load's clients) before a fault, and again after it.
FAULT_AFTER = 50
# Acknowledged calls the load makes between two kills of a series, so that each kill lands
# under load.
BETWEEN_KILLS = 5


class Progress:
    """The load script's side: each acknowledged call appends its time (8 bytes, native
    order) to the progress file, which the test reads while the script runs, and to
    ``times``, for the script's output.

    Nothing is ever overwritten, so a reader cannot see a half-written count: it counts the
    whole records, and a record being appended is not one yet. (A write-and-rename would
    close that too, but a rename over an existing file took 0.7 to 0.9 ms on ext4, which
    flushes the new file first (auto_da_alloc), against a few microseconds for an append,
    and this runs once per acknowledged call.)
    """

    def __init__(self, path: str) -> None:
        self.fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_APPEND, 0o644)
        self.times: List[int] = []

    def acknowledged(self) -> None:
        now = time.monotonic_ns()
        self.times.append(now)
        os.write(self.fd, now.to_bytes(8, sys.byteorder, signed=True))


class FaultWindow(NamedTuple):
    start: int  # time.monotonic_ns() as the first fault began
    end: int  # and once the last one was over (the server serving again)


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

    def _times(self, path: Path) -> array:
        """The times of a client's acknowledged calls so far, in order (whole records)."""
        times = array("q")
        try:
            data = path.read_bytes()
        except FileNotFoundError:  # not started yet
            return times
        times.frombytes(data[: len(data) - len(data) % times.itemsize])
        return times

    def each_acknowledged(self, since: int = 0) -> List[int]:
        """Calls acknowledged so far, per client; with ``since``, those acknowledged at or
        after that time (``time.monotonic_ns()``)."""
        counts = []
        for path in self.progress:
            times = self._times(path)
            counts.append(len(times) - bisect.bisect_left(times, since))
        return counts

    def acknowledged(self, since: int = 0) -> int:
        """Calls acknowledged so far (at or after ``since``), over all clients."""
        return sum(self.each_acknowledged(since))

    def wait_acknowledged(self, count: int, deadline: float = 120.0, since: int = 0) -> int:
        """Wait until ``count`` calls were acknowledged (at or after ``since``), and each
        client had one (its first connect is not retried, so no fault may come before every
        client is connected; after a fault, every client is through it); fails if a client
        ended or the deadline (a bound on failure only) passed first. Returns the count
        reached."""
        end = time.monotonic() + deadline
        while (done := sum(each := self.each_acknowledged(since))) < count or 0 in each:
            ended = [p.returncode for p in self.procs if p.poll() is not None]
            assert not ended, f"a load client ended early (exit codes {ended}) at {done} acknowledged calls"
            assert time.monotonic() < end, f"{done} of {count} calls acknowledged after {deadline} s"
            time.sleep(0.01)
        return done

    def stop(self, timeout: float = 90.0) -> List[dict]:
        """Stop the clients; each one's output (what it saw acknowledged, and when)."""
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


def kills_under_load(
    load: LoadClients, kill_and_restart: Callable[[], None], times: int, rng: random.Random,
) -> FaultWindow:
    """``times`` kills under ``load``: the first once ``FAULT_AFTER`` calls were
    acknowledged, each next one once ``BETWEEN_KILLS`` calls were acknowledged after the
    restart before it, plus a random pause of up to 50 ms (where in a call the kill lands);
    then waits for ``FAULT_AFTER`` calls acknowledged after the last restart.
    ``kill_and_restart()`` kills the server and returns once its successor serves. Returns
    when the first kill began and the last restart was over."""
    assert times >= 1, "a series of no kills"
    load.wait_acknowledged(FAULT_AFTER)
    start = restarted = time.monotonic_ns()
    for i in range(times):
        if i:
            load.wait_acknowledged(BETWEEN_KILLS, since=restarted)
            time.sleep(rng.uniform(0, 0.05))
        kill_and_restart()
        restarted = time.monotonic_ns()
    load.wait_acknowledged(FAULT_AFTER, since=restarted)
    return FaultWindow(start, restarted)


def assert_under_load(results: List[dict], window: FaultWindow) -> None:
    """The faults landed under load and the load outlived them, by the times the clients
    wrote in their output (``"acked_at"``), not by the progress the waits read: each
    client's are in order, ``FAULT_AFTER`` calls were acknowledged before the first fault
    began and as many after the last was over."""
    for r in results:
        assert r["acked_at"] == sorted(r["acked_at"]), "a client's acknowledgement times go back"
    times = [t for r in results for t in r["acked_at"]]
    before = sum(1 for t in times if t < window.start)
    after = sum(1 for t in times if t >= window.end)
    print(f"load: {before} calls acknowledged before the first fault, {len(times) - before - after} "
          f"while faults lasted, {after} after the last")
    assert before >= FAULT_AFTER, f"only {before} calls were acknowledged before the first fault"
    assert after >= FAULT_AFTER, f"only {after} calls were acknowledged after the last fault"


# Increments persistent counters and merges into a persistent Dict, recording every
# acknowledged result and when it came. The server (or a cluster's leaders) dies under it
# again and again; the SDK resends each call, with the same seq, until a server answers.
# Arguments: address (a list for a cluster), the objects' name prefix, this client's number.
# Its progress counts rounds (the shared counter's increments, each followed by two more
# calls), acknowledged once the round's last call is.
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
    progress.acknowledged()
with open(out, "w") as f:
    json.dump({"seen": seen, "adds": adds, "merged": merged, "acked_at": progress.times}, f)
"""
