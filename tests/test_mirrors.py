"""The mirror modules: ``spindle.threading``, ``spindle.queue``, ``spindle.concurrent.futures``
and ``spindle.multiprocessing`` have every public name of their standard-library twins (on the
running Python, so a release that adds a name fails here), and their names behave as their
twins' with cloud threads and shared objects, on the session server's worker pool."""

from __future__ import annotations

import concurrent.futures
import inspect
import multiprocessing
import multiprocessing.pool
import pickle
import queue
import threading
import types
import uuid

import pytest

import mirrors_remote as remote
import spindle
import spindle.concurrent.futures as spindle_futures_by_import
from conftest import POOL, ParkedProbe, wait_until
from spindle import multiprocessing as smp
from spindle import queue as squeue
from spindle import threading as sthreading
from spindle.concurrent import futures as sfutures
from spindle.multiprocessing import pool as spool


def public_names(module: types.ModuleType) -> set:
    """The module's ``__all__``, plus the public names of ``dir()`` it defines itself (not
    modules, nor what it imported from elsewhere, such as ``threading.WeakSet``)."""
    names = set(getattr(module, "__all__", ()))
    for name in dir(module):
        if name.startswith("_"):
            continue
        value = getattr(module, name)
        if isinstance(value, types.ModuleType):
            continue
        home = getattr(value, "__module__", None)
        if home is None or home == module.__name__ or home.startswith(module.__name__ + "."):
            names.add(name)
    return names


@pytest.mark.parametrize("mirror, twin", [
    (sthreading, threading),
    (squeue, queue),
    (sfutures, concurrent.futures),
    (smp, multiprocessing),
])
def test_every_public_name_of_the_twin_is_in_the_mirror(mirror, twin):
    missing = public_names(twin) - set(dir(mirror))
    assert not missing, f"{mirror.__name__} lacks {sorted(missing)} of {twin.__name__}"
    # And the mirror's own __all__ lists what it has, so `from ... import *` ports too.
    assert set(getattr(twin, "__all__", ())) <= set(mirror.__all__)


def test_the_pool_module_has_its_twins_pools():
    assert set(multiprocessing.pool.__all__) <= set(dir(spool))
    assert smp.pool is spool and spindle_futures_by_import is sfutures


def test_the_names_that_must_be_spindles_are():
    # Exceptions are the standard library's, so a ported program's except clauses still match.
    assert sthreading.BrokenBarrierError is threading.BrokenBarrierError
    assert squeue.Empty is queue.Empty and squeue.Full is queue.Full
    assert smp.TimeoutError is multiprocessing.TimeoutError
    assert issubclass(sthreading.Thread, spindle.Thread)
    assert sthreading.Lock is spindle.Lock and sthreading.Barrier is spindle.Barrier
    assert issubclass(squeue.SimpleQueue, spindle.Queue)
    assert issubclass(sfutures.ThreadPoolExecutor, spindle.Executor)
    assert issubclass(sfutures.ProcessPoolExecutor, spindle.Executor)
    assert issubclass(smp.Process, spindle.Thread)
    # Same signature as the twin's, positional parameters in the same order.
    for ours, theirs in [(sfutures.ThreadPoolExecutor, concurrent.futures.ThreadPoolExecutor),
                         (sfutures.ProcessPoolExecutor, concurrent.futures.ProcessPoolExecutor),
                         (spool.ThreadPool, multiprocessing.pool.ThreadPool),
                         (sthreading.Timer, threading.Timer)]:
        assert list(inspect.signature(ours).parameters) == list(
            inspect.signature(theirs).parameters)


# -- threading ---------------------------------------------------------------------------


def test_timer_calls_its_function_after_the_interval_and_cancel_stops_it():
    fired, cancelled = spindle.Counter(), spindle.Counter()
    timer = sthreading.Timer(0.05, remote.increment, args=(fired,))
    timer.start()
    timer.join()
    assert fired.get() == 1
    late = sthreading.Timer(30, remote.increment, args=[cancelled])
    late.start()
    late.cancel()
    late.join()
    assert cancelled.get() == 0 and not late.is_alive()


def test_enumerate_and_active_count_include_running_cloud_threads():
    go, done = spindle.Event(), spindle.Counter()
    thread = sthreading.Thread(target=remote.wait_then_count, args=(go, done))
    before = sthreading.active_count()
    thread.start()
    assert thread in sthreading.enumerate()
    assert sthreading.active_count() == before + 1
    go.set()
    thread.join()
    assert wait_until(lambda: thread not in sthreading.enumerate())
    assert done.get() == 1


def test_local_gives_each_thread_its_own_attributes():
    data = sthreading.local()
    data.x = "main"
    seen = []

    def other() -> None:
        seen.append(getattr(data, "x", None))
        data.x = "other"
        seen.append(data.x)

    worker = threading.Thread(target=other)
    worker.start()
    worker.join()
    assert seen == [None, "other"] and data.x == "main"
    del data.x
    with pytest.raises(AttributeError):
        data.x


def test_a_local_subclass_initializes_each_thread():
    class Defaults(sthreading.local):
        def __init__(self, colour: str) -> None:
            self.colour = colour
            self.calls = []

    data = Defaults("red")
    data.colour = "blue"
    seen = []
    worker = threading.Thread(target=lambda: seen.append(data.colour))
    worker.start()
    worker.join()
    assert seen == ["red"] and data.colour == "blue"
    with pytest.raises(TypeError):
        sthreading.local(1)


def test_a_local_travels_to_a_cloud_thread_empty():
    data = sthreading.local()
    data.token = "caller's"
    assert pickle.loads(pickle.dumps(data)).__dict__ == {}
    with sfutures.ThreadPoolExecutor() as ex:
        assert ex.submit(remote.visit_local, data, "remote").result() is None
    assert data.token == "caller's"


def test_each_cloud_thread_on_a_worker_gets_a_fresh_local():
    # A module-level local in a worker process outlives one call: the next cloud thread
    # that worker runs must not see what the previous one set.
    results = []
    for i in range(2 * POOL + 2):
        with sfutures.ThreadPoolExecutor(max_workers=1) as ex:
            results.append(ex.submit(remote.visit_worker_local, f"call {i}").result())
    pids = [pid for _, pid in results]
    assert len(set(pids)) < len(pids), "no worker ran two calls: the test proves nothing"
    assert [seen for seen, _ in results] == [None] * len(results)


# -- queue -------------------------------------------------------------------------------


def test_simple_queue_is_shared_with_cloud_threads():
    q = squeue.SimpleQueue()
    with pytest.raises(squeue.Empty):
        q.get_nowait()
    with sfutures.ThreadPoolExecutor() as ex:
        ex.submit(q.put, "from a cloud thread").result()
    assert q.qsize() == 1 and not q.empty()
    assert q.get(timeout=5) == "from a cloud thread"


# -- concurrent.futures ------------------------------------------------------------------


@pytest.mark.parametrize("executor", [sfutures.ThreadPoolExecutor, sfutures.ProcessPoolExecutor])
def test_pool_executors_run_calls_as_cloud_functions(executor):
    with executor(max_workers=4) as ex:
        futures = [ex.submit(remote.square, i) for i in range(6)]
        assert all(isinstance(f, sfutures.Future) for f in futures)
        done, _ = sfutures.wait(futures, return_when=sfutures.ALL_COMPLETED)
        assert len(done) == 6
        assert sorted(f.result() for f in sfutures.as_completed(futures)) == [
            i * i for i in range(6)]
        assert list(ex.map(remote.power, [2, 3], [10, 2])) == [1024, 9]
        with pytest.raises(ValueError, match="boom"):
            ex.submit(remote.fail, "boom").result()
    with pytest.raises(ValueError):
        executor(max_workers=0)


def test_an_executors_initializer_runs_once_per_worker_before_its_calls():
    token = uuid.uuid4().hex
    with sfutures.ProcessPoolExecutor(initializer=remote.initialize, initargs=(token,)) as ex:
        results = list(ex.map(remote.initialized_with, range(3 * POOL)))
    for initialized, _ in results:
        assert initialized.count(token) == 1
    with pytest.raises(TypeError):
        sfutures.ThreadPoolExecutor(initializer=42)


# -- multiprocessing ---------------------------------------------------------------------


def test_pool_methods_give_the_standard_librarys_results():
    with smp.Pool(4) as pool:
        assert pool.map(remote.square, range(20)) == [i * i for i in range(20)]
        assert pool.map(remote.square, range(7), chunksize=3) == [i * i for i in range(7)]
        assert pool.map(remote.square, []) == []
        assert pool.starmap(remote.power, [(2, 3), (3, 2)]) == [8, 9]
        assert pool.apply(remote.power, (2, 5)) == 32
        assert list(pool.imap(remote.square, range(5))) == [0, 1, 4, 9, 16]
        assert list(pool.imap(remote.square, range(5), 2)) == [0, 1, 4, 9, 16]
        assert sorted(pool.imap_unordered(remote.square, range(5))) == [0, 1, 4, 9, 16]
        got = []
        result = pool.apply_async(remote.square, (7,), callback=got.append)
        assert result.get(timeout=30) == 49 and result.ready() and result.successful()
        assert wait_until(lambda: got == [49])
        mapped = pool.map_async(remote.square, range(3))
        mapped.wait()
        assert mapped.get() == [0, 1, 4]
        errors = []
        failed = pool.apply_async(remote.fail, ("bad",), error_callback=errors.append)
        with pytest.raises(ValueError, match="bad"):
            failed.get()
        assert not failed.successful() and isinstance(errors[0], ValueError)
        with pytest.raises(ValueError, match="bad"):
            pool.map(remote.fail, ["bad"])
        with pytest.raises(ValueError):
            pool.join()  # still running
    with pytest.raises(ValueError, match="Pool not running"):
        pool.apply(remote.square, (1,))


def test_pool_close_join_and_thread_pool():
    pool = spool.ThreadPool(2)
    result = pool.map_async(remote.square, range(4))
    pool.close()
    with pytest.raises(ValueError, match="Pool not running"):
        pool.map(remote.square, [1])
    pool.join()
    assert result.ready() and result.get() == [0, 1, 4, 9]
    with pytest.raises(ValueError):
        smp.Pool(0)
    with pytest.raises(NotImplementedError):
        pickle.dumps(pool)


def test_pool_terminate_stops_the_running_tasks_and_withdraws_the_rest():
    started, ran = spindle.Counter(), spindle.Counter()
    pool = smp.Pool(2)
    running = [pool.apply_async(remote.count_after_sleep, (started, ran, 600)) for _ in range(2)]
    waiting = pool.map_async(remote.increment, [ran] * 3, chunksize=1)
    assert wait_until(lambda: started.get() == 2)
    pool.terminate()
    # Its workers are gone when terminate returns: no task ran past its sleep, nor started.
    assert all(result.ready() and not result.successful() for result in [*running, waiting])
    with pytest.raises(sfutures.CancelledError, match="terminate"):
        running[0].get()
    with pytest.raises(sfutures.CancelledError):
        waiting.get()
    pool.join()
    assert ran.get() == 0
    with pytest.raises(ValueError, match="Pool not running"):
        pool.apply(remote.square, (1,))


def test_terminate_from_an_error_callback_stops_the_other_tasks():
    started, ran = spindle.Counter(), spindle.Counter()
    pool = smp.Pool(2)
    running = pool.apply_async(remote.count_after_sleep, (started, ran, 600))
    assert wait_until(lambda: started.get() == 1)
    failed = pool.apply_async(remote.fail, ("stop all",), error_callback=lambda _: pool.terminate())
    failed.wait(60)
    running.wait(60)  # the callback's terminate stopped it
    assert running.ready() and not running.successful()
    with pytest.raises(ValueError, match="stop all"):
        failed.get()
    pool.join()
    assert ran.get() == 0


def test_a_pool_context_terminates_the_tasks_still_running_on_exit():
    started, ran = spindle.Counter(), spindle.Counter()
    with smp.Pool(1) as pool:
        result = pool.apply_async(remote.count_after_sleep, (started, ran, 600))
        assert wait_until(lambda: started.get() == 1)
    assert result.ready() and not result.successful()
    assert ran.get() == 0


def test_imap_next_takes_a_timeout():
    go = spindle.Event()
    with smp.Pool(2) as pool:
        results = pool.imap(remote.wait_for, [go])
        with pytest.raises(smp.TimeoutError):
            results.next(timeout=0.05)
        go.set()
        assert results.next(timeout=60) is True
        with pytest.raises(StopIteration):
            next(results)


def test_pool_initializer_runs_in_each_worker_once():
    token = uuid.uuid4().hex
    with smp.Pool(POOL, initializer=remote.initialize, initargs=(token,)) as pool:
        results = pool.map(remote.initialized_with, range(3 * POOL), chunksize=1)
    assert all(initialized.count(token) == 1 for initialized, _ in results)


def test_process_exitcode_and_join_that_does_not_raise(capfd):
    counter = spindle.Counter()
    ok = smp.Process(target=remote.increment, args=(counter,))
    assert ok.exitcode is None and ok.name.startswith("Process-")
    ok.start()
    ok.join()
    assert ok.exitcode == 0 and counter.get() == 1
    bad = smp.Process(target=remote.fail, args=("child failed",), name="failing")
    bad.start()
    bad.join()  # as multiprocessing: no exception here
    assert bad.exitcode == 1
    assert "child failed" in capfd.readouterr().err
    assert bad not in smp.active_children()


@pytest.mark.parametrize("stop, exitcode", [("terminate", -15), ("kill", -9)])
def test_process_terminate_and_kill_stop_a_running_process(stop, exitcode):
    started, ran = spindle.Counter(), spindle.Counter()
    process = smp.Process(target=remote.count_after_sleep, args=(started, ran, 600))
    process.start()
    assert wait_until(lambda: started.get() == 1)
    getattr(process, stop)()
    process.join()  # returns once the worker running it is gone
    assert process.exitcode == exitcode and not process.is_alive()
    assert process not in smp.active_children()
    assert ran.get() == 0


def test_process_terminate_withdraws_a_process_waiting_for_a_worker():
    started, ran = spindle.Counter(), spindle.Counter()
    busy = [smp.Process(target=remote.count_after_sleep, args=(started, ran, 600))
            for _ in range(POOL)]
    for process in busy:
        process.start()
    assert wait_until(lambda: started.get() == POOL)
    queued = smp.Process(target=remote.increment, args=(ran,))
    queued.start()
    queued.terminate()
    queued.join()
    assert queued.exitcode == -15
    for process in busy:
        process.terminate()
    for process in busy:
        process.join()
    assert [process.exitcode for process in busy] == [-15] * POOL
    assert ran.get() == 0 and started.get() == POOL


def test_manager_objects_and_shared_values_are_shared_with_pool_tasks():
    with smp.Manager() as manager:
        shared, namespace = manager.dict(), manager.Namespace(first=True)
        array = smp.Array("d", 4)
        assert array[:] == [0.0] * 4
        with smp.Pool(4) as pool:
            pool.starmap(remote.fill_shared, [(shared, namespace, array, i) for i in range(4)])
        assert dict(shared) == {i: i * i for i in range(4)}
        assert namespace.first is True and namespace.last in range(4)
        assert array[:] == [0.5, 1.5, 2.5, 3.5]
        assert isinstance(shared, spindle.Dict) and isinstance(manager.list([1]), spindle.List)
        with pytest.raises(AttributeError):
            namespace.missing


def test_value_with_its_lock_counts_exactly_across_cloud_functions():
    assert smp.Value("i").value == 0 and smp.Value("d", 1.5).value == 1.5
    assert smp.RawValue("b", 3).value == 3
    with pytest.raises(TypeError):
        smp.Value("i", "not a number")
    counter = smp.Value("i", 0)
    with smp.Pool(4) as pool:
        pool.starmap(remote.add_locked, [(counter, 25)] * 4)
    assert counter.value == 100
    with pytest.raises(AttributeError):
        smp.RawValue("i").get_lock()


def test_multiprocessing_lock_queue_and_pipe():
    lock = smp.Lock()
    assert lock.acquire(timeout=None)  # multiprocessing's None: wait forever
    assert not lock.acquire(block=True, timeout=-1)  # negative: do not wait
    lock.release()
    semaphore = smp.Semaphore(2)
    assert semaphore.get_value() == 2
    bounded = smp.BoundedSemaphore(1)
    assert bounded.acquire(timeout=None)
    bounded.release()
    with pytest.raises(ValueError):
        bounded.release()
    q = smp.JoinableQueue()
    q.put(1)
    q.close()
    q.join_thread()
    assert q.get() == 1
    q.task_done()
    assert q.join(timeout=5)
    here, there = smp.Pipe()
    child = smp.Process(target=remote.echo_through, args=(there,))
    child.start()
    here.send("ping")
    assert here.poll(30) and here.recv() == ("echo", "ping")
    child.join()
    reader, writer = smp.Pipe(duplex=False)
    with pytest.raises(OSError):
        reader.send(1)
    writer.send_bytes(b"abcdef", 1, 3)
    assert reader.recv_bytes() == b"bcd" and not reader.poll()


def test_multiprocessing_condition_acquire_waits_for_a_held_lock():
    lock = smp.Lock()
    condition = smp.Condition(lock)
    held, parked = threading.Event(), []

    def hold() -> None:
        with condition:
            held.set()
            with ParkedProbe(lock) as probe:  # let go once the main thread waits for it
                parked.append(wait_until(probe.parked))

    holder = threading.Thread(target=hold)
    holder.start()
    held.wait()
    assert condition.acquire()  # timeout=None: waits until the holder lets go
    condition.release()
    holder.join()
    assert parked == [True]


def test_mirror_objects_keep_their_methods_in_cloud_functions():
    # A multiprocessing Queue passed to a function is still one (with close()).
    q = smp.Queue()
    assert type(pickle.loads(pickle.dumps(q))) is smp.Queue
    assert type(pickle.loads(pickle.dumps(smp.Lock()))) is smp.Lock
    value = smp.Value("i", 5)
    copy = pickle.loads(pickle.dumps(value))
    assert copy.value == 5 and copy.get_lock() == value.get_lock()


def test_cpu_count_is_the_servers_pool_and_get_context_is_the_module():
    assert smp.cpu_count() == POOL
    assert smp.get_context("spawn") is smp
    with pytest.raises(ValueError):
        smp.get_context("no-such-method")
