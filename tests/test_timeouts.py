"""Zero and negative timeouts, and acquire's argument checks, side by side with the standard
library: the same return values, the same exception types and (where the SDK raises them)
the same messages as CPython's ``threading``, ``queue`` and ``concurrent.futures``."""

from __future__ import annotations

import concurrent.futures
import queue
import threading
import types

import pytest

import spindle

STDLIB = types.SimpleNamespace(
    Lock=threading.Lock,
    RLock=threading.RLock,
    Semaphore=threading.Semaphore,
    BoundedSemaphore=threading.BoundedSemaphore,
    Event=threading.Event,
    Condition=threading.Condition,
    Barrier=threading.Barrier,
    Future=concurrent.futures.Future,
    Queue=queue.Queue,
    LifoQueue=queue.LifoQueue,
    PriorityQueue=queue.PriorityQueue,
)
SPINDLE = spindle

HANG_GUARD = 60.0  # seconds; only a call that hangs (a negative timeout taken as "forever") fails it


def outcome(case, ns, with_message: bool):
    """Run ``case(ns)`` in a helper thread (so a call that never returns fails the test instead
    of hanging it); its result, or the type (and message) of what it raised."""
    box = []

    def run() -> None:
        try:
            box.append(("ok", case(ns)))
        except Exception as exc:
            box.append(("raised", type(exc).__name__, str(exc) if with_message else None))

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(HANG_GUARD)
    assert box, f"{case.__name__} did not return within {HANG_GUARD} s"
    return box[0]


def held(ns, cls: str):
    lock = getattr(ns, cls)()
    lock.acquire()
    return lock


def empty_semaphore(ns, cls: str):
    return getattr(ns, cls)(0)


def full_queue(ns, cls: str = "Queue"):
    q = getattr(ns, cls)(1)
    q.put(1)
    return q


def barrier_outcome(barrier, *timeout):
    try:
        return ("index", barrier.wait(*timeout), barrier.broken)
    except threading.BrokenBarrierError:
        return ("BrokenBarrierError", barrier.broken)


def condition_wait(ns, timeout, owned: bool = True):
    cond = ns.Condition()
    if not owned:
        return cond.wait(timeout)
    with cond:
        got = cond.wait(timeout)
        return got, cond._is_owned()


def condition_wait_for(ns, value, timeout):
    cond = ns.Condition()
    with cond:
        return cond.wait_for(lambda: value, timeout), cond._is_owned()


def future_done(ns):
    f = ns.Future()
    f.set_result("r")
    return f


# (id, case, compare messages too). Each case builds its own objects from ``ns``.
CASES = [
    # Event: a negative timeout does not wait.
    ("event-wait-neg1", lambda ns: ns.Event().wait(-1), True),
    ("event-wait-neg-half", lambda ns: ns.Event().wait(-0.5), True),
    ("event-wait-zero", lambda ns: ns.Event().wait(0), True),
    ("event-set-wait-neg1", lambda ns: (lambda e: (e.set(), e.wait(-1))[1])(ns.Event()), True),
    # Condition: wait(-1) returns False at once and re-acquires; wait_for returns the predicate.
    ("condition-wait-neg1", lambda ns: condition_wait(ns, -1), True),
    ("condition-wait-neg-half", lambda ns: condition_wait(ns, -0.5), True),
    ("condition-wait-zero", lambda ns: condition_wait(ns, 0), True),
    ("condition-wait-unowned", lambda ns: condition_wait(ns, -1, owned=False), True),
    ("condition-wait-for-false", lambda ns: condition_wait_for(ns, False, -1), True),
    ("condition-wait-for-zero", lambda ns: condition_wait_for(ns, 0, -1), True),
    ("condition-wait-for-true", lambda ns: condition_wait_for(ns, 5, -1), True),
    ("condition-wait-for-zero-timeout", lambda ns: condition_wait_for(ns, [], 0), True),
    # Barrier: a negative timeout breaks it like a zero one; the last party still opens it.
    ("barrier-wait-neg1", lambda ns: barrier_outcome(ns.Barrier(2), -1), False),
    ("barrier-wait-zero", lambda ns: barrier_outcome(ns.Barrier(2), 0), False),
    ("barrier-default-neg1", lambda ns: barrier_outcome(ns.Barrier(2, None, -1)), False),
    ("barrier-one-party-neg1", lambda ns: barrier_outcome(ns.Barrier(1), -1), False),
    # Future: a negative timeout raises TimeoutError unless done.
    ("future-result-neg1", lambda ns: ns.Future().result(-1), False),
    ("future-result-zero", lambda ns: ns.Future().result(0), False),
    ("future-exception-neg1", lambda ns: ns.Future().exception(-1), False),
    ("future-done-result-neg1", lambda ns: future_done(ns).result(-1), True),
    ("future-done-exception-neg1", lambda ns: future_done(ns).exception(-1), True),
    # Queue: a negative timeout is a ValueError when blocking, ignored when not (and ignored
    # by put on an unbounded queue, which never waits).
    ("queue-get-neg1", lambda ns: ns.Queue().get(True, -1), True),
    ("queue-get-neg-tiny", lambda ns: ns.Queue().get(True, -1e-9), True),
    ("queue-get-neg1-nonempty", lambda ns: full_queue(ns).get(True, -1), True),
    ("queue-get-zero", lambda ns: ns.Queue().get(True, 0), False),
    ("queue-get-nonblocking-neg1", lambda ns: ns.Queue().get(False, -1), False),
    ("queue-get-nonblocking-neg1-item", lambda ns: full_queue(ns).get(False, -1), True),
    ("queue-put-neg1", lambda ns: ns.Queue().put(1, True, -1), True),
    ("queue-put-neg1-bounded", lambda ns: ns.Queue(2).put(1, True, -1), True),
    ("queue-put-neg1-full", lambda ns: full_queue(ns).put(2, True, -1), True),
    ("queue-put-nonblocking-neg1-full", lambda ns: full_queue(ns).put(2, False, -1), False),
    ("queue-put-zero-full", lambda ns: full_queue(ns).put(2, True, 0), False),
    ("lifo-get-neg1", lambda ns: ns.LifoQueue().get(True, -1), True),
    ("priority-get-neg1", lambda ns: ns.PriorityQueue().get(True, -1), True),
    ("priority-put-neg1-full", lambda ns: full_queue(ns, "PriorityQueue").put(2, True, -1), True),
]

for cls in ("Lock", "RLock"):
    CASES += [
        # -1 means forever (here: free, so True); other negatives are a ValueError.
        (f"{cls}-acquire-neg1", lambda ns, c=cls: getattr(ns, c)().acquire(True, -1), True),
        (f"{cls}-acquire-neg1-float", lambda ns, c=cls: getattr(ns, c)().acquire(True, -1.0), True),
        (f"{cls}-acquire-neg2", lambda ns, c=cls: getattr(ns, c)().acquire(True, -2), True),
        (f"{cls}-acquire-neg-half", lambda ns, c=cls: getattr(ns, c)().acquire(timeout=-0.5), True),
        (f"{cls}-held-acquire-neg-tiny", lambda ns, c=cls: held(ns, c).acquire(True, -1e-9), True),
        (f"{cls}-acquire-none", lambda ns, c=cls: getattr(ns, c)().acquire(True, None), False),
        # A non-blocking call takes no timeout but -1.
        (f"{cls}-nonblocking-1", lambda ns, c=cls: getattr(ns, c)().acquire(False, 1), True),
        (f"{cls}-nonblocking-zero", lambda ns, c=cls: getattr(ns, c)().acquire(False, 0), True),
        (f"{cls}-nonblocking-neg2", lambda ns, c=cls: getattr(ns, c)().acquire(False, -2), True),
        (f"{cls}-nonblocking-neg1", lambda ns, c=cls: getattr(ns, c)().acquire(False, -1), True),
        (f"{cls}-nonblocking-kw", lambda ns, c=cls: getattr(ns, c)().acquire(blocking=False), True),
        (f"{cls}-zero-timeout", lambda ns, c=cls: getattr(ns, c)().acquire(True, 0), True),
        (f"{cls}-too-large", lambda ns, c=cls: getattr(ns, c)().acquire(
            True, threading.TIMEOUT_MAX * 2), False),
    ]
CASES += [
    ("Lock-held-zero-timeout", lambda ns: held(ns, "Lock").acquire(True, 0), True),
    ("Lock-held-nonblocking", lambda ns: held(ns, "Lock").acquire(False), True),
    ("Lock-release-unlocked", lambda ns: ns.Lock().release(), True),
    ("RLock-release-unowned", lambda ns: ns.RLock().release(), True),
]

for cls in ("Semaphore", "BoundedSemaphore"):
    CASES += [
        # Negative timeouts act as zero ones (CPython's Semaphore is pure Python).
        (f"{cls}-acquire-neg1", lambda ns, c=cls: getattr(ns, c)().acquire(True, -1), True),
        (f"{cls}-acquire-neg2", lambda ns, c=cls: getattr(ns, c)().acquire(timeout=-2), True),
        (f"{cls}-empty-neg1", lambda ns, c=cls: empty_semaphore(ns, c).acquire(True, -1), True),
        (f"{cls}-empty-neg-half", lambda ns, c=cls: empty_semaphore(ns, c).acquire(timeout=-0.5), True),
        (f"{cls}-empty-zero", lambda ns, c=cls: empty_semaphore(ns, c).acquire(True, 0), True),
        (f"{cls}-empty-nonblocking", lambda ns, c=cls: empty_semaphore(ns, c).acquire(False), True),
        (f"{cls}-nonblocking-1", lambda ns, c=cls: getattr(ns, c)().acquire(False, 1), True),
        (f"{cls}-nonblocking-neg1", lambda ns, c=cls: getattr(ns, c)().acquire(False, -1), True),
        (f"{cls}-nonblocking-zero", lambda ns, c=cls: getattr(ns, c)().acquire(False, 0), True),
        (f"{cls}-nonblocking-none", lambda ns, c=cls: getattr(ns, c)().acquire(False, None), True),
        (f"{cls}-release-zero", lambda ns, c=cls: getattr(ns, c)().release(0), True),
        (f"{cls}-negative-value", lambda ns, c=cls: getattr(ns, c)(-1), True),
    ]
CASES.append(
    ("BoundedSemaphore-over-release", lambda ns: ns.BoundedSemaphore(1).release(), True)
)


@pytest.mark.parametrize("case,with_message", [(c, m) for _, c, m in CASES],
                         ids=[i for i, _, _ in CASES])
def test_matches_the_standard_library(case, with_message):
    want = outcome(case, STDLIB, with_message)
    got = outcome(case, SPINDLE, with_message)
    assert got == want


def test_count_down_latch_negative_timeout_does_not_wait():
    latch = spindle.CountDownLatch(1)
    assert latch.wait(-1) is False
    assert latch.wait(0) is False
    latch.count_down()
    assert latch.wait(-1) is True


def test_queue_join_negative_timeout_does_not_wait():
    q = spindle.Queue()
    q.put(1)
    assert q.join(-1) is False
    q.get()
    q.task_done()
    assert q.join(-1) is True


def test_condition_default_lock_timeouts_follow_rlock():
    cond = spindle.Condition()
    assert cond.acquire(True, -1) is True
    with pytest.raises(ValueError, match="timeout value must be"):
        cond.acquire(True, -2)
    with pytest.raises(ValueError, match="can't specify a timeout for a non-blocking call"):
        cond.acquire(False, 1)
    cond.release()


def test_queue_put_negative_timeout_is_checked_only_when_bounded():
    # queue.Queue.put looks at the timeout only when maxsize > 0.
    for maxsize in (0, -1):
        q = spindle.Queue(maxsize)
        q.put("x", True, -1)
        assert q.get_nowait() == "x"
        std = queue.Queue(maxsize)
        std.put("x", True, -1)
    with pytest.raises(ValueError, match="'timeout' must be a non-negative number"):
        spindle.Queue(5).put("x", True, -1)
