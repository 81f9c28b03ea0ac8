"""Each object type against a real server: semantics, values, errors."""

from __future__ import annotations

import collections
import concurrent.futures
import pickle
import queue
import threading
import time
from fractions import Fraction

import numpy as np
import pytest

import spindle
from conftest import ParkedProbe, wait_until


# -- names, references, errors ---------------------------------------------------------


def test_named_objects_are_found_by_name(uniq):
    a = spindle.Counter(5, name=f"{uniq}.n")
    b = spindle.Counter(99, name=f"{uniq}.n")  # exists: constructor args are ignored
    assert b.get() == 5
    a.add(1)
    assert b.get() == 6
    assert a == b and a.name == f"{uniq}.n"
    assert spindle.Counter().name is None


@pytest.mark.parametrize("bad", ["", "~x", "~"])
def test_bad_names_are_value_errors(bad):
    with pytest.raises(ValueError):
        spindle.Counter(name=bad)


def test_type_mismatch_names_both_types(uniq):
    spindle.Counter(name=f"{uniq}.tm")
    with pytest.raises(spindle.TypeMismatch) as info:
        spindle.Dict(name=f"{uniq}.tm")
    assert isinstance(info.value, TypeError)
    message = str(info.value)
    assert "Counter" in message and "Dict" in message


def test_unknown_method_is_an_attribute_error():
    c = spindle.Counter()
    with pytest.raises(spindle.UnknownMethod) as info:
        spindle.call(c, "no_such_method", 1)
    assert isinstance(info.value, AttributeError)
    assert "no_such_method" in str(info.value)


def test_unknown_type(uniq):
    with pytest.raises(spindle.UnknownType) as info:
        spindle.connect().create("NoSuchType", f"{uniq}.x", [], False)
    assert isinstance(info.value, TypeError)
    assert "NoSuchType" in str(info.value)


def test_bad_arguments_are_type_errors():
    c = spindle.Counter()
    with pytest.raises(TypeError):
        c.add("not a number")
    assert c.get() == 0


def test_counter_overflow_is_an_error_not_a_wrap():
    c = spindle.Counter(2**63 - 1)
    with pytest.raises(OverflowError):
        c.increment()
    assert c.get() == 2**63 - 1
    c.set(-(2**63))
    with pytest.raises(OverflowError):
        c.decrement()


# -- values ------------------------------------------------------------------------------


def test_values_round_trip():
    v = spindle.Value()
    assert v.get() is None
    for value in [1, -2.5, "s", b"\x00b", [1, [2, "x"]], {"a": [1]}, True, None, 2**64 - 1]:
        v.set(value)
        assert v.get() == value
    v.set((1, 2))
    assert type(v.get()) is tuple and v.get() == (1, 2)  # tuples stay tuples
    v.set({(1, 2): "t", "l": [(1, [2])]})
    assert v.get() == {(1, 2): "t", "l": [(1, [2])]}
    v.set({1, 2, 3})
    assert v.get() == {1, 2, 3}  # no MessagePack form: pickled (ext type 1)
    v.set(Fraction(1, 3))
    assert v.get() == Fraction(1, 3)
    v.set(2**80)
    assert v.get() == 2**80
    assert v.get_and_set("new") == 2**80
    assert v.compare_and_set("new", "newer") is True
    assert v.compare_and_set("new", "x") is False
    assert v.value == "newer"


def test_proxies_inside_values_come_back_as_proxies():
    c = spindle.Counter(3)
    d = spindle.Dict()
    d["c"] = c
    d["nested"] = [c, {"again": c}]
    got = d["c"]
    assert isinstance(got, spindle.Counter) and got.key == c.key
    got.increment()
    assert c.get() == 4
    assert d["nested"][1]["again"].get() == 4


def test_proxies_pickle_as_references():
    q = spindle.Queue()
    copy = pickle.loads(pickle.dumps(q))
    assert type(copy) is spindle.Queue and copy.key == q.key
    copy.put(1)
    assert q.get(timeout=10) == 1


# -- data types --------------------------------------------------------------------------


def test_dict_basics_and_merge():
    d = spindle.Dict({"a": 1}, b=2)
    assert dict(d) == {"a": 1, "b": 2}
    assert d == {"a": 1, "b": 2}
    assert d.merge("a", 5) == 6
    assert d.merge("l", "x", op="append") == ["x"]
    assert d.merge("l", "y", op="append") == ["x", "y"]
    assert d.merge("s", [1, 2, 2], op="union") == [1, 2]
    assert d.merge("s", [2, 3], op="union") == [1, 2, 3]
    assert d.merge("m", 4, op="min") == 4
    assert d.merge("m", 2, op="min") == 2
    assert d.merge("m", 9, op="max") == 9
    assert d.merge("a", "r", op="replace") == "r"
    with pytest.raises(TypeError):
        d.merge_many({"z": 1, "l": 2}, op="sum")  # "l" holds a list: nothing changes
    assert "z" not in d
    with pytest.raises(KeyError) as info:
        d[(1, "k")]
    assert info.value.args[0] == (1, "k")
    d[(1, "k")] = 1
    assert (1, "k") in d.keys()


def test_sorted_dict():
    s = spindle.SortedDict({3: "c", 1: "a", 2: "b"})
    assert list(s) == [1, 2, 3]
    assert s.first() == (1, "a") and s.last() == (3, "c")
    assert s.range(2, None) == [(2, "b"), (3, "c")]
    counts = spindle.SortedDict({"x": 1, "y": 5, "z": 5})
    assert counts.most_common(2) == [("y", 5), ("z", 5)]
    with pytest.raises(KeyError):
        spindle.SortedDict().first()


def test_list_slices():
    items = list(range(10))
    lst = spindle.List(items)
    assert lst[::3] == items[::3] and lst[-3:] == items[-3:]
    lst[1:9:2] = ["a", "b", "c", "d"]
    items[1:9:2] = ["a", "b", "c", "d"]
    assert list(lst) == items
    with pytest.raises(ValueError):
        lst[::2] = [1]
    del lst[::4]
    del items[::4]
    assert lst == items
    with pytest.raises(IndexError):
        lst[100]


def test_blob():
    b = spindle.Blob(b"ab")
    assert b.append(b"cd") == 4
    assert b.get() == b"abcd" and len(b) == 4
    assert b.read(1, 10) == b"bcd"


def test_array_round_trip_with_numpy():
    a = spindle.Array((2, 3))
    assert a.shape == (2, 3) and a.dtype == np.float64
    assert np.array_equal(a.get(), np.zeros((2, 3)))
    data = np.arange(6, dtype=np.float64).reshape(2, 3)
    a.set(data)
    a.add(data)
    a.add(1.0)
    a.scale(0.5)
    expected = (data + data + 1.0) * 0.5
    got = a.get()
    assert got.dtype == np.float64 and got.shape == (2, 3)
    assert np.array_equal(got, expected)
    got[0, 0] = 99  # a writable copy
    ints = spindle.Array(4, "int64")
    ints.add(np.array([1, 2, 3, 4]))
    ints.scale(3)
    assert np.array_equal(ints.get(), np.array([3, 6, 9, 12]))
    with pytest.raises(ValueError):
        a.add(np.zeros(5))


def test_data_reprs_show_the_contents_like_the_builtins(uniq):
    assert repr(spindle.Dict({"a": 1, (1, 2): [3]})) == "spindle.Dict({'a': 1, (1, 2): [3]})"
    assert repr(spindle.Dict()) == "spindle.Dict({})"
    assert repr(spindle.SortedDict({3: "c", 1: "a"})) == "spindle.SortedDict({1: 'a', 3: 'c'})"
    assert repr(spindle.List([1, "x", (2,)])) == "spindle.List([1, 'x', (2,)])"
    assert repr(spindle.Counter(5)) == "spindle.Counter(5)"
    assert repr(spindle.Value("v")) == "spindle.Value('v')"
    assert repr(spindle.Value()) == "spindle.Value(None)"
    named = spindle.Dict({"a": 1}, name=f"{uniq}.d")
    assert repr(named) == f"spindle.Dict({{'a': 1}}, name='{uniq}.d')"
    assert repr(spindle.Counter(2, name=f"{uniq}.c")) == f"spindle.Counter(2, name='{uniq}.c')"
    assert str(spindle.List([1])) == "spindle.List([1])"
    # Nested objects show their contents; a container holding itself shows "...".
    outer = spindle.List([spindle.Counter(3)])
    assert repr(outer) == "spindle.List([spindle.Counter(3)])"
    outer.append(outer)
    assert repr(outer) == "spindle.List([spindle.Counter(3), spindle.List(...)])"
    d = spindle.Dict()
    d["me"] = d
    assert repr(d) == "spindle.Dict({'me': spindle.Dict(...)})"
    # A deleted object cannot show its contents: repr falls back to the reference.
    spindle.delete(named)
    assert repr(named) == f"<spindle.Dict '{uniq}.d'>"


def test_sync_object_reprs_stay_short(uniq):
    lock = spindle.Lock(name=f"{uniq}.lock")
    assert repr(lock) == f"<spindle.Lock object '{uniq}.lock' [unlocked]>"
    with lock:  # the state, as threading's locks show it
        assert repr(lock) == f"<spindle.Lock object '{uniq}.lock' [locked]>"
    rlock = spindle.RLock()
    rlock.acquire()
    assert repr(rlock) == f"<spindle.RLock object '{rlock.key}' [locked]>"
    event = spindle.Event()
    assert repr(event) == f"<spindle.Event '{event.key}'>"
    assert repr(spindle.Queue(name=f"{uniq}.q")) == f"<spindle.Queue '{uniq}.q'>"


def test_dict_and_list_compare_with_builtins_by_contents():
    d = spindle.Dict({"a": 1, "b": [2]})
    assert d == {"a": 1, "b": [2]} and {"b": [2], "a": 1} == d
    assert d != {"a": 1} and not (d == {"a": 1})
    assert d == spindle.Dict({"b": [2], "a": 1})  # another object, same contents
    assert d != [("a", 1), ("b", [2])] and d != spindle.Counter()
    lst = spindle.List([1, (2, 3)])
    assert lst == [1, (2, 3)] and [1, (2, 3)] == lst
    assert lst != [1] and lst != [(2, 3), 1]
    assert lst == spindle.List([1, (2, 3)])
    assert lst != (1, (2, 3))  # like list: never equal to a tuple
    assert lst != spindle.Dict() and lst != "12"


def count_calls(obj):
    """Record the server methods ``obj`` calls from now on."""
    calls, real = [], obj._call

    def counted(method, args):
        calls.append(method)
        return real(method, args)

    obj._call = counted
    return calls


def test_comparisons_and_reprs_take_one_snapshot():
    d, lst = spindle.Dict({"a": 1}), spindle.List([1, 2])
    dict_calls, list_calls = count_calls(d), count_calls(lst)
    assert d == {"a": 1} and lst == [1, 2]
    assert dict_calls == ["items"] and list_calls == ["items"]
    repr(d), repr(lst)
    assert dict_calls == ["items"] * 2 and list_calls == ["items"] * 2


# -- synchronization ---------------------------------------------------------------------


def test_queue_get_timeout_raises_empty_after_the_timeout():
    q = spindle.Queue()
    start = time.monotonic()
    with pytest.raises(queue.Empty):
        q.get(timeout=0.5)
    assert time.monotonic() - start >= 0.5
    with pytest.raises(queue.Empty):
        q.get_nowait()


def test_bounded_queue_full_and_join():
    q = spindle.Queue(2)
    assert q.maxsize == 2
    q.put(1)
    q.put_nowait(2)
    assert q.full()
    with pytest.raises(queue.Full):
        q.put(3, timeout=0.1)
    with pytest.raises(queue.Full):
        q.put_nowait(3)
    assert q.join(0.05) is False
    assert q.get() == 1 and q.get() == 2
    q.task_done()
    q.task_done()
    with pytest.raises(ValueError):
        q.task_done()
    assert q.join() is True


def test_priority_queue_returns_tuples_in_order():
    q = spindle.PriorityQueue()
    for item in [(3, "c"), (1, "a"), (2, "b")]:
        q.put(item)
    assert [q.get(), q.get(), q.get()] == [(1, "a"), (2, "b"), (3, "c")]


def test_threads_share_a_queue():
    q = spindle.Queue()
    out = []

    def consume():
        while (item := q.get(timeout=30)) is not None:
            out.append(item)

    threads = [threading.Thread(target=consume) for _ in range(3)]
    for t in threads:
        t.start()
    for i in range(300):
        q.put(i)
    for _ in threads:
        q.put(None)
    for t in threads:
        t.join()
    assert sorted(out) == list(range(300))


def test_lock_and_rlock():
    lock = spindle.Lock()
    assert lock.acquire() is True
    assert lock.acquire(False) is False
    assert lock.acquire(timeout=0.05) is False
    lock.release()
    with pytest.raises(RuntimeError):
        lock.release()
    with lock:
        assert lock.locked()
    assert not lock.locked()
    with pytest.raises(ValueError):
        lock.acquire(False, 1)

    rlock = spindle.RLock()
    with rlock:
        with rlock:
            assert rlock.is_owned()
        assert rlock.is_owned()
    assert not rlock.is_owned()
    rlock.acquire()
    errors = []

    def other_thread():
        assert rlock.acquire(timeout=0.05) is False
        assert not rlock.is_owned()
        try:
            rlock.release()
        except RuntimeError as exc:
            errors.append(exc)

    t = threading.Thread(target=other_thread)
    t.start()
    t.join()
    assert len(errors) == 1  # another thread cannot release our RLock
    rlock.release()


def test_semaphores():
    sem = spindle.Semaphore(2)
    assert sem.acquire() and sem.acquire()
    assert sem.acquire(False) is False
    assert sem.acquire(timeout=0.05) is False
    sem.release(2)
    assert sem.value == 2
    with pytest.raises(ValueError):
        spindle.Semaphore(-1)
    bounded = spindle.BoundedSemaphore(1)
    with bounded:
        pass
    with pytest.raises(ValueError):
        bounded.release()


def set_once_parked(obj, complete) -> "list[bool]":
    """Start a thread that calls ``complete()`` once a call is parked on ``obj`` in the server
    (or after the failure deadline); the list it returns gets whether one was."""
    parked: "list[bool]" = []

    def run() -> None:
        with ParkedProbe(obj) as probe:
            parked.append(wait_until(probe.parked))
        complete()

    threading.Thread(target=run, daemon=True).start()
    return parked


def test_event_between_threads():
    event = spindle.Event()
    assert event.wait(0.05) is False
    parked = set_once_parked(event, event.set)
    assert event.wait(60) is True and event.is_set()
    assert parked == [True]  # the wait was parked when the other thread set the flag
    event.clear()
    assert not event.is_set()


def test_condition_wait_notify_between_threads():
    cond = spindle.Condition()
    items = spindle.List()
    got = []

    def consumer():
        with cond:
            assert cond.wait_for(lambda: len(items) >= 3, timeout=30)
            got.extend(items)

    calls = count_calls(cond)
    threads = [threading.Thread(target=consumer) for _ in range(2)]
    for t in threads:
        t.start()
    # Both consumers wait (their tickets registered, the lock released) before any notify.
    assert wait_until(lambda: calls.count("wait") == 2)
    for i in range(3):
        with cond:
            items.append(i)
            cond.notify_all()
    for t in threads:
        t.join()
    assert got == [0, 1, 2, 0, 1, 2]
    with cond:
        assert cond.wait(0.05) is False  # nobody notifies: times out, lock re-acquired
        assert cond._is_owned()
    with pytest.raises(RuntimeError):
        cond.notify()
    with pytest.raises(RuntimeError):
        cond.wait(0.01)


def test_named_condition_attaches_to_its_stored_lock(uniq):
    lock = spindle.Lock(name=f"{uniq}.lock")
    first = spindle.Condition(lock, name=f"{uniq}.cond")
    second = spindle.Condition(name=f"{uniq}.cond")
    assert second._lock == lock
    with second:
        assert lock.locked()
        second.notify()
    assert first._lock == lock


def test_barrier_action_runs_once_per_generation():
    runs = spindle.Counter()
    barrier = spindle.Barrier(3, action=runs.increment)
    results = []

    def party():
        for _ in range(5):
            results.append(barrier.wait(30))

    threads = [threading.Thread(target=party) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert runs.get() == 5
    assert sorted(results) == sorted([0, 1, 2] * 5)
    assert barrier.parties == 3 and barrier.n_waiting == 0 and not barrier.broken


def test_barrier_failing_action_breaks_it():
    def fail():
        raise ZeroDivisionError("action failed")

    barrier = spindle.Barrier(2, action=fail)
    outcome = []

    def party():
        try:
            barrier.wait(30)
            outcome.append("passed")
        except threading.BrokenBarrierError:
            outcome.append("broken")
        except ZeroDivisionError:
            outcome.append("raised")

    threads = [threading.Thread(target=party) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(outcome) == ["broken", "raised"]
    assert barrier.broken
    barrier.reset()
    assert not barrier.broken


def test_barrier_timeout_breaks_it():
    barrier = spindle.Barrier(2)
    with pytest.raises(threading.BrokenBarrierError):
        barrier.wait(0.1)
    assert barrier.broken
    with pytest.raises(threading.BrokenBarrierError):
        barrier.wait(0.1)


def test_count_down_latch():
    latch = spindle.CountDownLatch(2)
    assert latch.wait(0.05) is False
    assert latch.count_down() == 1
    assert latch.count_down() == 0
    assert latch.count_down() == 0
    assert latch.wait(1) is True and latch.count == 0


# -- futures -----------------------------------------------------------------------------


class CustomError(Exception):
    pass


def test_future_result_and_exception():
    f = spindle.Future()
    assert not f.done()
    with pytest.raises(TimeoutError):
        f.result(timeout=0.05)
    parked = set_once_parked(f, lambda: f.set_result({"x": 1}))
    assert f.result(60) == {"x": 1}
    assert parked == [True]  # the result was set while the caller waited for it
    assert f.done() and f.exception() is None
    with pytest.raises(concurrent.futures.InvalidStateError):
        f.set_result(2)

    g = spindle.Future()
    g.set_exception(CustomError("boom"))
    with pytest.raises(CustomError, match="boom"):
        g.result()
    assert isinstance(g.exception(), CustomError)

    h = spindle.Future()
    assert h.cancel() is True and h.cancelled()
    with pytest.raises(concurrent.futures.CancelledError):
        h.result()


def test_future_exception_that_cannot_be_pickled():
    class Local(Exception):  # not importable: pickling fails
        pass

    f = spindle.Future()
    f.set_exception(Local("nope"))
    with pytest.raises(spindle.SpindleError) as info:
        f.result()
    assert "Local" in str(info.value) and "nope" in str(info.value)


def test_future_done_callback():
    f = spindle.Future()
    seen = threading.Event()
    f.add_done_callback(lambda fut: seen.set())
    f.set_result(1)
    assert seen.wait(30)


def test_items_of_parked_putters_count_for_task_done_and_join():
    q = spindle.Queue(1)
    q.put("a")
    putter = threading.Thread(target=q.put, args=("b",), daemon=True)  # parks: the queue is full
    putter.start()
    with ParkedProbe(q) as probe:
        assert wait_until(probe.parked)  # the put is parked in the server
    assert q.qsize() == 1 and putter.is_alive()  # "b" waits outside the queue
    assert q.get() == "a"  # lets "b" in
    putter.join(30)
    assert not putter.is_alive()
    assert q.get(timeout=30) == "b"
    q.task_done()
    q.task_done()  # two items were put: two task_done calls are allowed
    with pytest.raises(ValueError):
        q.task_done()
    assert q.join(30) is True


def test_keep_moves_an_object_and_old_references_follow(uniq):
    c = spindle.Counter(1)
    old = pickle.loads(pickle.dumps(c))  # another reference to the old key
    spindle.keep(c, name=f"{uniq}.moved")
    assert c.key == f"{uniq}.moved"
    assert old.add(1) == 2  # answered "Moved": the proxy follows to the new key
    assert old.key == f"{uniq}.moved"
    assert spindle.Counter(name=f"{uniq}.moved").get() == 2
    with pytest.raises(ValueError):
        spindle.keep(c, name="~bad")


def test_condition_wait_releases_a_recursively_held_rlock():
    cond = spindle.Condition()
    woke = []

    def notifier():
        with cond:  # only possible if wait released every level of the RLock
            cond.notify()
            woke.append(True)

    with cond:
        with cond:
            threading.Timer(0.1, notifier).start()
            assert cond.wait(30) is True
            assert cond._is_owned()
        assert cond._is_owned()
    assert not cond._is_owned()
    assert woke == [True]


Point = collections.namedtuple("Point", "x y")


def test_tuples_and_subclasses_keep_their_types(server):
    q = spindle.Queue()
    q.put((3, "a"))
    item = q.get()
    assert type(item) is tuple and item == (3, "a")
    q.put(Point(1, 2))
    got = q.get()
    assert type(got) is Point and got == Point(1, 2)
    pq = spindle.PriorityQueue()
    for entry in [(2, "b"), (1, "z"), (1, "a"), (0, [1])]:
        pq.put(entry)
    assert [pq.get() for _ in range(4)] == [(0, [1]), (1, "a"), (1, "z"), (2, "b")]
    lst = spindle.List([(1, 2), [3, 4]])
    assert lst[:] == [(1, 2), [3, 4]] and type(lst[0]) is tuple and type(lst[1]) is list
    d = spindle.Dict()
    d[(1, 2)] = (3, (4,))
    assert d[(1, 2)] == (3, (4,)) and list(d.keys()) == [(1, 2)]
