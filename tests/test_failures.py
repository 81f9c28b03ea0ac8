"""Clients that die, sessions that end, servers that go away."""

from __future__ import annotations

import multiprocessing as mp
import os
import signal
import subprocess
import sys
import textwrap

import pytest

import spindle
import workers
from conftest import ParkedProbe, ServerProcess, wait_until

FORK = mp.get_context("fork")


def test_lock_of_a_killed_holder_is_freed_and_reported_abandoned(uniq):
    lock = spindle.Lock(name=f"{uniq}.lock")
    held = spindle.Event()
    child = FORK.Process(target=workers.hold_lock_forever, args=(lock, held))
    child.start()
    try:
        assert held.wait(30)
        assert lock.locked()
        assert lock.acquire(blocking=False) is False
    finally:
        os.kill(child.pid, signal.SIGKILL)
        child.join()
    with pytest.warns(spindle.AbandonedLockWarning):
        assert lock.acquire(timeout=30) is True
    assert lock.locked()
    lock.release()
    # The next clean acquire is an ordinary one.
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error", spindle.AbandonedLockWarning)
        assert lock.acquire(timeout=30) is True
    lock.release()


def test_client_killed_on_a_barrier_breaks_it_and_others_are_served():
    barrier = spindle.Barrier(2)
    child = FORK.Process(target=workers.park_on_barrier, args=(barrier,))
    child.start()
    try:
        assert wait_until(lambda: barrier.n_waiting == 1)
    finally:
        os.kill(child.pid, signal.SIGKILL)
        child.join()
    assert wait_until(lambda: barrier.broken)
    counter = spindle.Counter()
    assert counter.add(3) == 3
    barrier.reset()
    assert not barrier.broken
    # The barrier works again for live parties.
    other = FORK.Process(target=workers.park_on_barrier, args=(barrier,))
    other.start()
    assert barrier.wait(30) in (0, 1)
    other.join(30)
    assert other.exitcode == 0


def test_client_killed_on_a_queue_does_not_steal_items():
    q = spindle.Queue()
    ready = spindle.Event()
    stolen = spindle.List()
    child = FORK.Process(target=workers.park_on_queue, args=(q, ready, stolen))
    child.start()
    try:
        assert ready.wait(30)
        with ParkedProbe(q) as probe:
            assert wait_until(probe.parked)  # the child's get is parked
    finally:
        os.kill(child.pid, signal.SIGKILL)
        child.join()
    # The server withdraws the dead connection's get...
    with ParkedProbe(q) as probe:
        assert wait_until(lambda: not probe.parked())
    # ...so an item put now stays in the queue instead of going to the dead getter.
    q.put("item")
    assert q.qsize() == 1
    assert q.get(timeout=30) == "item"
    assert len(stolen) == 0
    assert q.qsize() == 0


def test_unnamed_objects_vanish_with_their_session_named_ones_stay(uniq):
    refs = spindle.Dict()
    child = FORK.Process(target=workers.make_objects, args=(f"{uniq}.named", refs))
    child.start()
    child.join(30)
    assert child.exitcode == 0
    unnamed = spindle.attach("Counter", refs["unnamed"])
    named = spindle.attach("Counter", refs["named"])
    assert refs["unnamed"].startswith("~")
    assert isinstance(refs["unnamed_ref"], spindle.Counter)
    assert refs["unnamed_ref"].key == refs["unnamed"]

    def gone() -> bool:
        try:
            unnamed.get()
            return False
        except spindle.ObjectNotFound:
            return True

    assert wait_until(gone)  # the session TTL is 1 s
    assert named.get() == 8
    assert (f"{uniq}.named", "Counter") in spindle.objects(uniq)


def test_kept_unnamed_object_outlives_its_session(uniq):
    script = textwrap.dedent(
        f"""
        import spindle
        c = spindle.Counter(41)
        spindle.keep(c, name="{uniq}.kept")
        c.increment()
        print(c.key)
        print(spindle.Counter(1).key)  # unnamed, not kept: goes with the session
        """
    )
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
    )
    assert out.returncode == 0, out.stderr
    kept_key, unnamed_key = out.stdout.split()
    assert kept_key == f"{uniq}.kept"
    unnamed = spindle.attach("Counter", unnamed_key)

    def session_ended() -> bool:
        try:
            unnamed.get()
            return False
        except spindle.ObjectNotFound:
            return True

    assert wait_until(session_ended)  # the session TTL is 1 s
    assert spindle.Counter(name=f"{uniq}.kept").get() == 42
    assert (f"{uniq}.kept", "Counter") in spindle.objects(uniq)


def test_server_gone_raises_server_unavailable():
    private = ServerProcess()
    script = textwrap.dedent(
        """
        import sys, spindle
        c = spindle.Counter()
        c.increment()
        print("ready", flush=True)
        sys.stdin.readline()
        try:
            c.increment()
        except spindle.ServerUnavailable as exc:
            assert isinstance(exc, ConnectionError)
            print("unavailable", exc)
        """
    )
    env = {**os.environ, "SPINDLE_ADDRESS": private.address,
           "PYTHONPATH": os.pathsep.join(sys.path)}
    proc = subprocess.Popen(
        [sys.executable, "-c", script], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
        text=True, env=env,
    )
    try:
        assert proc.stdout.readline().strip() == "ready"
        private.kill()
        out, _ = proc.communicate("go\n", timeout=60)
    finally:
        private.stop()
        if proc.poll() is None:
            proc.kill()
    assert out.startswith("unavailable")
    assert private.address in out
