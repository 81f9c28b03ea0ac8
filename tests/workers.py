"""Process targets for the multi-process tests (importable by spawn children too)."""

from __future__ import annotations

import os
import time
from typing import Any

import spindle


def increment(counter: spindle.Counter, times: int) -> None:
    for _ in range(times):
        counter.increment()


def merge_words(words: spindle.Dict, worker: int, rounds: int) -> None:
    for r in range(rounds):
        words.merge_many({"all": 1, f"w{worker}": 1, f"r{r % 5}": 2}, op="sum")


def barrier_rounds(
    barrier: spindle.Barrier, arrivals: spindle.Dict, early: spindle.Counter, generations: int
) -> None:
    parties = barrier.parties
    for gen in range(generations):
        arrivals.merge(gen, 1, op="sum")
        barrier.wait()
        if arrivals[gen] != parties:  # somebody of this generation had not arrived yet
            early.increment()


def semaphore_rounds(
    sem: spindle.Semaphore, inside: spindle.Counter, peak: spindle.Dict, rounds: int
) -> None:
    for _ in range(rounds):
        with sem:
            now = inside.increment()
            peak.merge("max", now, op="max")
            time.sleep(0.001)
            inside.decrement()


def hold_lock_forever(lock: spindle.Lock, held: spindle.Event) -> None:
    lock.acquire()
    held.set()
    time.sleep(600)


def park_on_barrier(barrier: spindle.Barrier) -> None:
    barrier.wait()


def park_on_queue(q: spindle.Queue, ready: spindle.Event, stolen: spindle.List) -> None:
    ready.set()
    stolen.append(q.get())


def make_objects(name: str, refs: spindle.Dict) -> None:
    """Create an unnamed and a named counter, publish their keys, and exit."""
    unnamed = spindle.Counter(7)
    named = spindle.Counter(8, name=name)
    refs["unnamed"] = unnamed.key
    refs["named"] = named.key
    refs["unnamed_ref"] = unnamed  # travels as a reference (ext type 2)


def touch(obj: Any, marks: spindle.Dict) -> None:
    """Reach the same objects from a child: bump the counter, record our session."""
    obj["counter"].add(10)
    marks[os.getpid()] = spindle.connect().session
