"""Property tests: Spindle's synchronization objects and queues behave like their
standard-library twins under random single-threaded sequences of operations.

Only calls that cannot block are used (non-blocking, zero or negative timeouts), so one thread
drives both sides; return values and exception types must match after every step.
"""

from __future__ import annotations

import concurrent.futures
import queue
import threading

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import spindle

SETTINGS = settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)


def outcome(fn, *args):
    """What ``fn(*args)`` did: its result (exceptions returned as values are described by type
    and args) or the type of the exception it raised (messages may differ)."""
    try:
        result = fn(*args)
    except Exception as exc:
        return ("raised", type(exc).__name__)
    if isinstance(result, BaseException):
        return ("ok", ("exception", type(result).__name__, result.args))
    return ("ok", result)


def in_other_thread(fn, *args):
    """``fn(*args)`` run (and joined) in a fresh thread: another owner for locks."""
    box = []

    def run():
        box.append(outcome(fn, *args))

    t = threading.Thread(target=run)
    t.start()
    t.join()
    return box[0]


# -- Lock and RLock ----------------------------------------------------------------------

lock_ops = st.sampled_from(
    ["acquire_nonblocking", "acquire_zero", "acquire_negative", "release", "release_other",
     "locked"]
)


def lock_actions(lock):
    return {
        "acquire_nonblocking": lambda: outcome(lock.acquire, False),
        "acquire_zero": lambda: outcome(lock.acquire, True, 0),
        "acquire_negative": lambda: outcome(lock.acquire, True, -2),  # ValueError
        "release": lambda: outcome(lock.release),
        "release_other": lambda: in_other_thread(lock.release),  # allowed for a Lock
        "locked": lambda: outcome(lock.locked),
    }


@SETTINGS
@given(st.lists(lock_ops, max_size=20))
def test_lock_matches_threading_lock(ops):
    mine, theirs = lock_actions(spindle.Lock()), lock_actions(threading.Lock())
    for op in ops:
        assert mine[op]() == theirs[op](), op
    assert mine["locked"]() == theirs["locked"]()


rlock_ops = st.sampled_from(
    ["acquire_nonblocking", "acquire_zero", "acquire_negative", "release", "release_other",
     "is_owned", "is_owned_other"]
)


def rlock_actions(lock):
    return {
        "acquire_nonblocking": lambda: outcome(lock.acquire, False),
        "acquire_zero": lambda: outcome(lock.acquire, True, 0),
        "acquire_negative": lambda: outcome(lock.acquire, True, -0.5),  # ValueError
        "release": lambda: outcome(lock.release),  # RuntimeError once fully released
        "release_other": lambda: in_other_thread(lock.release),  # RuntimeError: not the owner
        "is_owned": lambda: outcome(lock._is_owned),
        "is_owned_other": lambda: in_other_thread(lock._is_owned),
    }


@SETTINGS
@given(st.lists(rlock_ops, max_size=20))
def test_rlock_matches_threading_rlock(ops):
    mine, theirs = rlock_actions(spindle.RLock()), rlock_actions(threading.RLock())
    depth = 0
    for op in ops:
        got, want = mine[op](), theirs[op]()
        assert got == want, (op, depth)
        if op in ("acquire_nonblocking", "acquire_zero") and want == ("ok", True):
            depth += 1
        elif op == "release" and want[0] == "ok":
            depth -= 1
    # Unwind the nesting: exactly ``depth`` releases succeed, the next one fails on both.
    for _ in range(depth):
        assert mine["release"]() == theirs["release"]() == ("ok", None)
    assert mine["release"]() == theirs["release"]() == ("raised", "RuntimeError")


# -- Semaphore and BoundedSemaphore ------------------------------------------------------

semaphore_ops = st.one_of(
    st.tuples(st.just("acquire_nonblocking")),
    st.tuples(st.just("acquire_zero")),
    st.tuples(st.just("acquire_negative")),
    st.tuples(st.just("acquire_nonblocking_timeout")),
    st.tuples(st.just("release"), st.integers(-1, 3)),
    st.tuples(st.just("value")),
)


def semaphore_actions(sem, value):
    return {
        "acquire_nonblocking": lambda: outcome(sem.acquire, False),
        "acquire_zero": lambda: outcome(sem.acquire, True, 0),
        "acquire_negative": lambda: outcome(sem.acquire, True, -1),  # a zero timeout here
        "acquire_nonblocking_timeout": lambda: outcome(sem.acquire, False, 1),  # ValueError
        "release": lambda n: outcome(sem.release, n),  # ValueError for n < 1 / over-release
        "value": lambda: outcome(value),
    }


def run_semaphores(spindle_cls, stdlib_cls, initial, ops):
    ours, std = spindle_cls(initial), stdlib_cls(initial)
    mine = semaphore_actions(ours, lambda: ours.value)
    theirs = semaphore_actions(std, lambda: std._value)
    for name, *args in ops:
        assert mine[name](*args) == theirs[name](*args), (name, args)
    assert ours.value == std._value


@SETTINGS
@given(st.integers(0, 3), st.lists(semaphore_ops, max_size=20))
def test_semaphore_matches_threading_semaphore(initial, ops):
    run_semaphores(spindle.Semaphore, threading.Semaphore, initial, ops)


@SETTINGS
@given(st.integers(0, 3), st.lists(semaphore_ops, max_size=20))
def test_bounded_semaphore_matches_threading_bounded_semaphore(initial, ops):
    run_semaphores(spindle.BoundedSemaphore, threading.BoundedSemaphore, initial, ops)


# -- Event -------------------------------------------------------------------------------

event_ops = st.sampled_from(["set", "clear", "is_set", "wait_zero", "wait_negative"])


def event_actions(event):
    return {
        "set": lambda: outcome(event.set),
        "clear": lambda: outcome(event.clear),
        "is_set": lambda: outcome(event.is_set),
        "wait_zero": lambda: outcome(event.wait, 0),
        "wait_negative": lambda: outcome(event.wait, -1),
    }


@SETTINGS
@given(st.lists(event_ops, max_size=20))
def test_event_matches_threading_event(ops):
    mine, theirs = event_actions(spindle.Event()), event_actions(threading.Event())
    for op in ops:
        assert mine[op]() == theirs[op](), op


# -- CountDownLatch (no stdlib twin: a reference model) ----------------------------------


class LatchModel:
    def __init__(self, count: int) -> None:
        if count < 0:
            raise ValueError("count must be >= 0")
        self.count = count

    def count_down(self) -> int:
        self.count = max(self.count - 1, 0)
        return self.count

    def wait(self, timeout=None) -> bool:
        return self.count == 0  # single-threaded: nobody else can count down meanwhile


latch_ops = st.sampled_from(["count_down", "count", "wait_zero", "wait_negative"])


def latch_actions(latch):
    return {
        "count_down": lambda: outcome(latch.count_down),
        "count": lambda: outcome(lambda: latch.count),
        "wait_zero": lambda: outcome(latch.wait, 0),
        "wait_negative": lambda: outcome(latch.wait, -1),
    }


@SETTINGS
@given(st.integers(-1, 4), st.lists(latch_ops, max_size=20))
def test_count_down_latch_matches_a_model(count, ops):
    if count < 0:
        assert outcome(spindle.CountDownLatch, count) == outcome(LatchModel, count)
        return
    mine = latch_actions(spindle.CountDownLatch(count))
    theirs = latch_actions(LatchModel(count))
    for op in ops:
        assert mine[op]() == theirs[op](), op


# -- Future ------------------------------------------------------------------------------

exceptions = st.sampled_from([ValueError("bad"), KeyError("k"), RuntimeError(), ZeroDivisionError("z")])
future_ops = st.one_of(
    st.tuples(st.just("set_result"), st.one_of(st.none(), st.integers(-5, 5), st.text(max_size=3))),
    st.tuples(st.just("set_exception"), exceptions),
    st.tuples(st.just("cancel")),
    st.tuples(st.just("done")),
    st.tuples(st.just("cancelled")),
    st.tuples(st.just("running")),
    st.tuples(st.just("result_zero")),
    st.tuples(st.just("result_negative")),
    st.tuples(st.just("exception_zero")),
)


def future_actions(future):
    def cancel():
        cancelled = future.cancel()
        if (
            isinstance(future, concurrent.futures.Future)
            and cancelled
            and future._state == concurrent.futures._base.CANCELLED
        ):
            # What an executor does with a cancelled future; without it, CPython lets
            # set_result complete a cancelled future, while a Spindle Future stays cancelled.
            future.set_running_or_notify_cancel()
        return cancelled

    return {
        "set_result": lambda v: outcome(future.set_result, v),
        "set_exception": lambda e: outcome(future.set_exception, e),
        "cancel": lambda: outcome(cancel),
        "done": lambda: outcome(future.done),
        "cancelled": lambda: outcome(future.cancelled),
        "running": lambda: outcome(future.running),
        "result_zero": lambda: outcome(future.result, 0),  # TimeoutError while pending
        "result_negative": lambda: outcome(future.result, -1),
        "exception_zero": lambda: outcome(future.exception, 0),
    }


@SETTINGS
@given(st.lists(future_ops, max_size=15))
def test_future_matches_concurrent_futures_future(ops):
    mine = future_actions(spindle.Future())
    theirs = future_actions(concurrent.futures.Future())
    for name, *args in ops:
        assert mine[name](*args) == theirs[name](*args), (name, args)


# -- Queue, LifoQueue, PriorityQueue -----------------------------------------------------

queue_ops = st.one_of(
    st.tuples(st.just("put_nonblocking"), st.integers(0, 9)),
    st.tuples(st.just("put_zero"), st.integers(0, 9)),
    st.tuples(st.just("put_nowait"), st.integers(0, 9)),
    st.tuples(st.just("get_nonblocking")),
    st.tuples(st.just("get_zero")),
    st.tuples(st.just("get_nowait")),
    st.tuples(st.just("get_negative")),
    st.tuples(st.just("task_done")),
    st.tuples(st.just("qsize")),
    st.tuples(st.just("empty")),
    st.tuples(st.just("full")),
)


def queue_actions(q):
    return {
        "put_nonblocking": lambda item: outcome(q.put, item, False),  # Full
        "put_zero": lambda item: outcome(q.put, item, True, 0),  # Full
        "put_nowait": lambda item: outcome(q.put_nowait, item),
        "get_nonblocking": lambda: outcome(q.get, False),  # Empty
        "get_zero": lambda: outcome(q.get, True, 0),  # Empty
        "get_nowait": lambda: outcome(q.get_nowait),
        "get_negative": lambda: outcome(q.get, True, -1),  # ValueError
        "task_done": lambda: outcome(q.task_done),  # ValueError past the items put
        "qsize": lambda: outcome(q.qsize),
        "empty": lambda: outcome(q.empty),
        "full": lambda: outcome(q.full),
    }


QUEUES = [
    (spindle.Queue, queue.Queue),
    (spindle.LifoQueue, queue.LifoQueue),
    (spindle.PriorityQueue, queue.PriorityQueue),
]


@SETTINGS
@given(st.sampled_from(QUEUES), st.integers(-1, 3), st.lists(queue_ops, max_size=25))
def test_queues_match_the_queue_module(pair, maxsize, ops):
    spindle_cls, stdlib_cls = pair
    ours, std = spindle_cls(maxsize), stdlib_cls(maxsize)
    mine, theirs = queue_actions(ours), queue_actions(std)
    for name, *args in ops:
        assert mine[name](*args) == theirs[name](*args), (name, args)
    assert ours.maxsize == std.maxsize
    assert ours.qsize() == std.qsize()
