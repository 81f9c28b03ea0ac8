"""The Santa Claus problem (Trono, 1994) with groups and gates (seed §3.4.3).

Santa sleeps until either all nine reindeer are back from vacation or three of the ten elves
need help; the reindeer have priority. Each entity is a thread. Elves and reindeer join a
*group* (a `Semaphore` of free places and a `Barrier` that fills up); the group's last member
flags it ready (an `Event`) and wakes Santa (a `Semaphore`). Santa then operates the group's
two *gates* (`Barrier`s of the group's size plus Santa): the members enter, Santa delivers
toys or helps the elves, and they leave through the exit gate. After `--deliveries` deliveries
Santa breaks the barriers and everyone goes home.

The same code runs in three modes, which differ only in where the objects and threads are:

    --mode threading   `threading` objects and local threads (the single-machine program)
    --mode objects     Spindle objects and local threads
    --mode cloud       Spindle objects and cloud threads (`spindle.Thread`; 20 threads, so the
                       function pool needs 20 workers: `spindle server --max-workers 24`)

    spindle run examples/santa_claus.py [--mode cloud] [--deliveries 15] [--scale 1.0]
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import threading
import time
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

REINDEER, ELVES, ELF_GROUP = 9, 10, 3


def toolkit(mode: str) -> SimpleNamespace:
    """The synchronization objects and the thread class of a mode: a change of imports."""
    if mode == "threading":
        return SimpleNamespace(Semaphore=threading.Semaphore, Barrier=threading.Barrier,
                               Event=threading.Event, Thread=threading.Thread, List=list)
    import spindle

    spindle.connect()
    thread = spindle.Thread if mode == "cloud" else threading.Thread
    return SimpleNamespace(Semaphore=spindle.Semaphore, Barrier=spindle.Barrier,
                           Event=spindle.Event, Thread=thread, List=spindle.List)


@dataclass(frozen=True)
class Group:
    """A room for `size` members: places, a barrier that fills it, and two gates."""

    kind: str
    size: int
    places: Any   # Semaphore(size): who may join the group being formed
    full: Any     # Barrier(size): its action flags the group ready and wakes Santa
    ready: Any    # Event: the group is full and waits for Santa
    entry: Any    # Barrier(size + 1): the entry gate, operated by Santa
    exit: Any     # Barrier(size + 1): the exit gate


def make_group(kit: SimpleNamespace, kind: str, size: int, wake: Any) -> Group:
    ready = kit.Event()

    def notify_santa() -> None:  # run by the member that completes the group
        ready.set()
        wake.release()

    return Group(kind, size, kit.Semaphore(size), kit.Barrier(size, action=notify_santa), ready,
                 kit.Barrier(size + 1), kit.Barrier(size + 1))


def member(group: Group, ident: int, away: tuple[float, float], log: Any) -> None:
    """A reindeer or an elf: away for a while, then joins a group and meets Santa; forever."""
    from threading import BrokenBarrierError

    rng = random.Random(f"{group.kind}{ident}")
    try:
        while True:
            time.sleep(rng.uniform(*away))  # on vacation, or working in the workshop
            group.places.acquire()
            try:
                group.full.wait()           # the group fills up; the last one wakes Santa
                group.entry.wait()          # Santa opens the entry gate
                log.append([group.kind, ident])  # harnessed to the sleigh / in Santa's study
                group.exit.wait()
            finally:
                group.places.release()      # (also when leaving: the next one finds out)
    except BrokenBarrierError:
        return                              # Christmas is over: Santa broke the barriers


def santa(reindeer: Group, elves: Group, wake: Any, deliveries: int, busy: float,
          log: Any) -> None:
    """Santa: sleeps until a group is ready, reindeer first; stops after `deliveries`."""
    delivered = 0
    while delivered < deliveries:
        wake.acquire()                      # sleep until a group is ready
        group = reindeer if reindeer.ready.is_set() else elves
        group.ready.clear()
        log.append(["santa", group.kind, "begin"])
        group.entry.wait()                  # open the entry gate: the members come in
        time.sleep(busy)                    # deliver the toys, or help the elves
        group.exit.wait()                   # and out they go
        log.append(["santa", group.kind, "end"])
        delivered += group is reindeer
    for group in (reindeer, elves):         # send everybody home
        for barrier in (group.full, group.entry, group.exit):
            barrier.abort()


def _meet(barrier) -> None:
    barrier.wait()


def warm_pool(workers: int) -> None:
    """Start `workers` workers before the clock, as a threaded program's threads exist before
    they work: that many functions meeting at one barrier need that many workers at once."""
    import spindle

    pool = spindle.status().get("max_workers", workers)
    if pool < workers:
        sys.exit(f"cloud mode runs {workers} threads at once, but the server's pool has "
                 f"{pool} workers: run it with `spindle run --max-workers {workers} ...`")
    meeting = spindle.Barrier(workers)
    with spindle.Executor(echo=False) as ex:
        list(ex.map(_meet, [meeting] * workers))


def solve(mode: str, deliveries: int, scale: float, cold: bool = False) -> tuple[float, list]:
    kit = toolkit(mode)
    wake, log = kit.Semaphore(0), kit.List()
    reindeer = make_group(kit, "reindeer", REINDEER, wake)
    elves = make_group(kit, "elf", ELF_GROUP, wake)
    threads = [kit.Thread(target=santa, args=(reindeer, elves, wake, deliveries,
                                              0.010 * scale, log), name="santa")]
    threads += [kit.Thread(target=member, args=(reindeer, i, (0.05 * scale, 0.15 * scale), log),
                           name=f"reindeer-{i}") for i in range(REINDEER)]
    threads += [kit.Thread(target=member, args=(elves, i, (0.02 * scale, 0.2 * scale), log),
                           name=f"elf-{i}") for i in range(ELVES)]
    if mode == "cloud" and not cold:
        warm_pool(len(threads))
    start = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return time.perf_counter() - start, list(log)


def check(log: list) -> dict:
    """Split the log into Santa's sessions and verify each one's company."""
    sessions, current = [], None
    for entry in log:
        if entry[0] == "santa":
            if entry[2] == "begin":
                assert current is None, "Santa began a session inside another"
                current = (entry[1], [])
            else:
                assert current is not None and current[0] == entry[1], "unbalanced session"
                sessions.append(current)
                current = None
        else:
            assert current is not None and entry[0] == current[0], f"{entry} outside its session"
            current[1].append(entry[1])
    assert current is None, "a session never ended"
    for kind, members in sessions:
        size = REINDEER if kind == "reindeer" else ELF_GROUP
        assert len(members) == len(set(members)) == size, f"a {kind} group of {members}"
    return {"deliveries": sum(kind == "reindeer" for kind, _ in sessions),
            "consultations": sum(kind == "elf" for kind, _ in sessions),
            "groups": [[kind, sorted(members)] for kind, members in sessions]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mode", choices=["threading", "objects", "cloud"], default="objects")
    ap.add_argument("--deliveries", type=int, default=15)
    ap.add_argument("--scale", type=float, default=1.0, help="multiply every sleep by this")
    ap.add_argument("--json", action="store_true", help="also print the result as JSON")
    ap.add_argument("--cold", action="store_true",
                    help="cloud mode: time the workers' cold starts too (default: warm the pool first)")
    args = ap.parse_args()

    print(f"Santa Claus, {REINDEER} reindeer, {ELVES} elves, {args.deliveries} deliveries, "
          f"mode {args.mode}", file=sys.stderr)
    elapsed, log = solve(args.mode, args.deliveries, args.scale, args.cold)
    summary = check(log)
    print(f"{summary['deliveries']} deliveries and {summary['consultations']} consultations "
          f"(every group complete) in {elapsed:.2f} s, mode {args.mode}")
    if args.json:
        print(json.dumps({"mode": args.mode, "seconds": elapsed, **summary}))


if __name__ == "__main__":
    main()
