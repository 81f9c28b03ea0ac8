"""Many processes on the same objects: counts, merges, barriers, semaphores, pickling."""

from __future__ import annotations

import multiprocessing as mp
import os

import pytest

import spindle
import workers


def run_all(ctx, target, args_list):
    procs = [ctx.Process(target=target, args=args) for args in args_list]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
    assert [p.exitcode for p in procs] == [0] * len(procs)


def test_eight_processes_increment_exactly():
    counter = spindle.Counter()
    run_all(mp.get_context("fork"), workers.increment, [(counter, 10_000)] * 8)
    assert counter.get() == 80_000


def test_concurrent_merge_many_sums():
    words = spindle.Dict()
    run_all(mp.get_context("fork"), workers.merge_words, [(words, i, 200) for i in range(6)])
    assert words["all"] == 6 * 200
    assert all(words[f"w{i}"] == 200 for i in range(6))
    assert sum(words[f"r{r}"] for r in range(5)) == 2 * 6 * 200


def test_barrier_never_lets_a_process_through_early():
    parties, generations = 4, 100
    barrier = spindle.Barrier(parties)
    arrivals = spindle.Dict()
    early = spindle.Counter()
    run_all(
        mp.get_context("fork"),
        workers.barrier_rounds,
        [(barrier, arrivals, early, generations)] * parties,
    )
    assert early.get() == 0
    assert all(arrivals[g] == parties for g in range(generations))
    assert not barrier.broken


def test_semaphore_never_admits_more_than_its_value():
    sem = spindle.Semaphore(3)
    inside = spindle.Counter()
    peak = spindle.Dict({"max": 0})
    run_all(mp.get_context("fork"), workers.semaphore_rounds, [(sem, inside, peak, 40)] * 8)
    assert 1 <= peak["max"] <= 3
    assert inside.get() == 0
    assert sem.value == 3


@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_pickled_proxies_reach_the_same_object_in_children(method):
    counter = spindle.Counter(5)
    marks = spindle.Dict()
    run_all(mp.get_context(method), workers.touch, [({"counter": counter}, marks)] * 2)
    assert counter.get() == 25
    sessions = dict(marks.items())
    assert len(sessions) == 2
    mine = spindle.connect().session
    assert mine not in sessions.values()  # each child has a session of its own
    assert len(set(sessions.values())) == 2


def test_forked_child_gets_fresh_session_and_connections():
    counter = spindle.Counter()
    counter.increment()  # this thread's connection now exists and is inherited
    parent_session = spindle.connect().session
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # child
        try:
            counter.add(100)
            ok = spindle.connect().session != parent_session
            os.write(write, b"1" if ok else b"0")
        finally:
            os._exit(0)
    os.close(write)
    got = os.read(read, 1)
    os.waitpid(pid, 0)
    assert got == b"1"
    counter.increment()  # the parent's own connection still works
    assert counter.get() == 102
