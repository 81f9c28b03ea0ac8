"""The compute tier: spindle.Thread, Executor, parallel_for and the joblib backend, run on the
session server's function gateway (a real worker pool of ``conftest.POOL`` workers).

Functions that run remotely live in ``remote.py``. Each bad input ends with a clear error on
this side, and the call after it succeeds.
"""

from __future__ import annotations

import concurrent.futures
import multiprocessing as mp
import os
import signal
import subprocess
import sys
import textwrap
from typing import Iterator

import pytest

import remote
import spindle
from conftest import POOL, ServerProcess, connected_to, gateway_args, wait_until
from spindle.compute import partition
from spindle.errors import RemoteTraceback

FORK = mp.get_context("fork")


def next_call_succeeds() -> None:
    """The pool recovered: a plain call runs."""
    with spindle.Executor(echo=False) as ex:
        assert ex.submit(remote.square, 12).result(timeout=60) == 144


@pytest.fixture
def own_gateway() -> Iterator[ServerProcess]:
    """A server of the test's own with a gateway of ``POOL`` workers, this process connected
    to it for the test: its ``queued`` count moves only with the test's calls (on the
    session's server, calls another test left behind would move it too)."""
    proc = ServerProcess(*gateway_args())
    try:
        with connected_to(proc):
            yield proc
    finally:
        proc.stop()


# -- Thread ----------------------------------------------------------------------------------


def test_thread_runs_its_target_on_a_worker():
    counter = spindle.Counter()
    t = spindle.Thread(target=remote.add_to, args=(counter, 5), name="adder")
    assert not t.is_alive() and t.name == "adder"
    t.start()
    t.join(timeout=60)
    assert not t.is_alive()
    assert counter.get() == 5
    assert t.result == 5
    assert t.native_id is not None and t.native_id != os.getpid()
    with pytest.raises(RuntimeError):
        t.start()


def test_thread_join_reraises_with_the_remote_traceback():
    t = spindle.Thread(target=remote.fail, args=("boom 42",))
    t.start()
    with pytest.raises(ValueError, match="boom 42") as info:
        t.join()
    cause = info.value.__cause__
    assert isinstance(cause, RemoteTraceback)
    assert "remote.py" in cause.tb and "in fail" in cause.tb
    assert "worker.py" not in cause.tb  # the traceback starts in the user's code
    next_call_succeeds()


def test_thread_join_with_a_timeout_returns_while_it_runs():
    release = spindle.Event()
    t = spindle.Thread(target=remote.wait_event, args=(release,))
    t.start()
    t.join(timeout=0.05)
    assert t.is_alive()
    release.set()
    t.join(60)
    assert not t.is_alive() and t.result is True


class CountingThread(spindle.Thread):
    def __init__(self, counter: spindle.Counter) -> None:
        super().__init__()
        self.counter = counter

    def run(self) -> int:
        return self.counter.add(10)


def test_a_thread_subclass_overriding_run():
    counter = spindle.Counter()
    t = CountingThread(counter)
    t.start()
    t.join(60)
    assert counter.get() == 10 and t.result == 10


# -- Executor --------------------------------------------------------------------------------


def test_executor_submit_and_map():
    with spindle.Executor(echo=False) as ex:
        assert isinstance(ex, concurrent.futures.Executor)
        future = ex.submit(remote.square, 7)
        assert future.result(60) == 49
        assert list(ex.map(remote.square, range(20))) == [i * i for i in range(20)]
        assert list(ex.map(pow, range(10), [3] * 10, chunksize=4)) == [i**3 for i in range(10)]
        done = list(concurrent.futures.as_completed([ex.submit(remote.identity, i) for i in range(5)]))
        assert sorted(f.result() for f in done) == list(range(5))
    report = future.report
    assert set(report) >= {"ok", "cold", "duration", "peak_rss", "worker"}
    assert report["ok"] is True and report["peak_rss"] > 0
    with pytest.raises(RuntimeError, match="shutdown"):
        ex.submit(remote.square, 1)


def test_map_raises_the_first_failure_in_order():
    with spindle.Executor(echo=False) as ex:
        results = ex.map(remote.fail, ["first", "second"])
        with pytest.raises(ValueError, match="first"):
            list(results)


def test_max_workers_bounds_the_calls_in_flight():
    started = spindle.Semaphore(0)
    release = spindle.Event()
    ex = spindle.Executor(max_workers=2, echo=False)
    try:
        futures = [ex.submit(remote.block_on, started, release) for _ in range(4)]
        assert started.acquire(timeout=60) and started.acquire(timeout=60)
        # Two calls are in flight; the other two wait here, never sent.
        assert sum(f._request_id is not None for f in futures) == 2
        assert started.acquire(timeout=0.2) is False
        release.set()
        assert [f.result(60) for f in futures] == ["released"] * 4
    finally:
        release.set()
        ex.shutdown()


def test_shutdown_cancel_futures_withdraws_calls_queued_in_the_server(own_gateway):
    started = spindle.Semaphore(0)
    release = spindle.Event()
    ex = spindle.Executor(echo=False)
    try:
        blockers = [ex.submit(remote.block_on, started, release) for _ in range(POOL)]
        for _ in range(POOL):  # every worker is busy: what follows queues in the server
            assert started.acquire(timeout=60)
        assert spindle.status()["queued"] == 0
        queued = [ex.submit(remote.square, i) for i in range(5)]
        assert wait_until(lambda: spindle.status()["queued"] == 5)
        ex.shutdown(wait=False, cancel_futures=True)
        assert all(f.cancelled() for f in queued)
        with pytest.raises(concurrent.futures.CancelledError):
            queued[0].result()
        assert not any(f.done() for f in blockers)  # running calls are not cancelled
        done, _ = concurrent.futures.wait(queued, timeout=60)  # cancelled counts as done
        assert set(done) == set(queued)
    finally:
        release.set()
    assert [f.result(60) for f in blockers] == ["released"] * POOL
    next_call_succeeds()


def test_shutdown_waiting_with_cancel_futures_returns(own_gateway):
    started = spindle.Semaphore(0)
    release = spindle.Event()
    ex = spindle.Executor(echo=False)
    blockers = [ex.submit(remote.block_on, started, release) for _ in range(POOL)]
    for _ in range(POOL):
        assert started.acquire(timeout=60)
    assert spindle.status()["queued"] == 0
    queued = [ex.submit(remote.square, i) for i in range(5)]
    assert wait_until(lambda: spindle.status()["queued"] == 5)
    release.set()  # the running calls end; shutdown(wait=True) must not wait on cancelled ones
    ex.shutdown(wait=True, cancel_futures=True)
    assert all(f.done() for f in blockers + queued)
    assert all(f.cancelled() or f.result() == i * i for i, f in enumerate(queued))
    next_call_succeeds()


def test_kill_stops_a_running_call_which_ends_cancelled_and_is_not_retried(own_gateway):
    started, release = spindle.Semaphore(0), spindle.Event()
    with spindle.Executor(echo=False, retries=2) as ex:
        running = ex.submit(remote.block_on, started, release)
        assert started.acquire(timeout=60)
        assert not running.cancel()  # cancel() leaves a running call alone...
        assert running.kill()  # ...kill() stops it
        concurrent.futures.wait([running], timeout=60)
        assert running.cancelled() and running.attempts == 1
        assert spindle.status()["busy"] == 0  # its worker is gone, and no retry runs
        with pytest.raises(concurrent.futures.CancelledError):
            running.result()
    next_call_succeeds()


def test_cancel_from_a_done_callback_does_not_stall_replies(own_gateway):
    started = spindle.Semaphore(0)
    release = spindle.Event()
    with spindle.Executor(echo=False) as ex:
        blockers = [ex.submit(remote.block_on, started, release) for _ in range(POOL)]
        for _ in range(POOL):
            assert started.acquire(timeout=60)
        assert spindle.status()["queued"] == 0
        queued = ex.submit(remote.square, 3)
        assert wait_until(lambda: spindle.status()["queued"] == 1)
        blockers[0].add_done_callback(lambda _: queued.cancel())
        release.set()
        assert [f.result(20) for f in blockers] == ["released"] * POOL  # not stalled 30 s
        # The freed worker may have started it before the cancel arrived; either way it ends.
        concurrent.futures.wait([queued], timeout=20)
        assert queued.cancelled() or queued.result() == 9


def test_cancel_of_a_call_waiting_for_a_slot():
    release = spindle.Event()
    started = spindle.Semaphore(0)
    ex = spindle.Executor(max_workers=1, echo=False)
    try:
        first = ex.submit(remote.block_on, started, release)
        second = ex.submit(remote.square, 3)
        assert started.acquire(timeout=60)
        assert second.cancel() and second.cancelled()
        assert first.cancel() is False  # running
    finally:
        release.set()
    assert first.result(60) == "released"
    ex.shutdown()


# -- parallel_for ------------------------------------------------------------------------------


def test_partition_is_static_contiguous_and_balanced():
    chunks = partition(range(10), 3)
    assert chunks == [range(0, 4), range(4, 7), range(7, 10)]
    assert partition(list("abcde"), 2) == [["a", "b", "c"], ["d", "e"]]
    assert partition(range(2), 5) == [range(0, 1), range(1, 2)]
    assert partition([], 4) == []
    with pytest.raises(ValueError):
        partition(range(3), 0)


def test_parallel_for_returns_results_in_order_from_n_functions():
    out = spindle.parallel_for(remote.whoami, range(23), tasks=4, echo=False)
    assert [r[0] for r in out] == [i * i for i in range(23)]
    # One function per chunk: each contiguous chunk ran as one invocation (one session).
    sessions = [r[1] for r in out]
    runs = [sessions[0]]
    for s in sessions[1:]:
        if s != runs[-1]:
            runs.append(s)
    assert len(runs) == len(set(runs)) == 4
    sizes = [sessions.count(s) for s in runs]
    assert sizes == [6, 6, 6, 5]


def test_parallel_for_over_a_list_and_an_error():
    assert spindle.parallel_for(remote.square, [3, 1, 2], tasks=8) == [9, 1, 4]
    with pytest.raises(ValueError, match="bad"):
        spindle.parallel_for(remote.fail, ["bad"] * 4, tasks=2, echo=False)
    next_call_succeeds()


# -- shared objects, retries -------------------------------------------------------------------


def test_functions_reach_the_callers_objects():
    counter = spindle.Counter()
    with spindle.Executor(echo=False) as ex:
        list(ex.map(remote.add_to, [counter] * 8, [25] * 8))
    assert counter.get() == 8 * 25


@pytest.mark.parametrize("how", ["raise", "crash"])
def test_retries_rerun_and_object_calls_stay_exactly_once(tmp_path, how):
    counter = spindle.Counter()
    marker = str(tmp_path / "failed-once")
    with spindle.Executor(retries=2, backoff=0.01, echo=False) as ex:
        future = ex.submit(remote.add_then_fail_once, counter, marker, how)
        # The retry's counter.add(1) is the failed attempt's call, answered from the record.
        assert future.result(60) == 1
    assert os.path.exists(marker)
    assert future.attempts == 2
    assert counter.get() == 1


def test_retries_run_out_and_raise(tmp_path):
    log = tmp_path / "attempts"
    with spindle.Executor(retries=2, backoff=lambda n: 0.0, echo=False) as ex:
        future = ex.submit(remote.count_attempt_and_fail, str(log))
        with pytest.raises(RuntimeError, match="always fails"):
            future.result(60)
    assert log.read_text().count("attempt") == 3 and future.attempts == 3


# -- output --------------------------------------------------------------------------------------


def test_output_is_captured_and_echoed_with_a_task_prefix(capsys):
    with spindle.Executor() as ex:
        future = ex.submit(remote.chatter, 7)
        assert future.result(60) == 7
    assert b"hello 7\n" in future.stdout
    assert b"from-a-subprocess-7\n" in future.stdout and b"raw-fd-write-7\n" in future.stdout
    assert future.stderr == b"oops 7\n"
    out, err = capsys.readouterr()
    assert "[task 0] hello 7\n" in out and "[task 0] from-a-subprocess-7\n" in out
    assert "[task 0] oops 7\n" in err
    # Each call gets only its own output.
    with spindle.Executor(echo=False) as ex:
        quiet = ex.submit(remote.square, 2)
        assert quiet.result(60) == 4
    assert quiet.stdout == b"" and quiet.stderr == b""
    out, err = capsys.readouterr()
    assert out == "" and err == ""


def test_a_thread_echoes_with_its_name(capsys):
    t = spindle.Thread(target=remote.chatter, args=(3,), name="chatty")
    t.start()
    t.join(60)
    assert "[chatty] hello 3\n" in capsys.readouterr().out
    assert b"hello 3" in t.stdout


# -- bad input and failures ----------------------------------------------------------------------


def test_an_unpicklable_function_is_refused_at_submit():
    import threading

    lock = threading.Lock()
    with spindle.Executor() as ex:
        with pytest.raises(TypeError, match="cannot ship"):
            ex.submit(lambda: lock.locked())
    t = spindle.Thread(target=lambda: lock)
    with pytest.raises(TypeError):
        t.start()
    next_call_succeeds()


def test_an_exception_that_does_not_unpickle_still_reports_type_and_traceback():
    with spindle.Executor(echo=False) as ex:
        future = ex.submit(remote.raise_unpicklable)
        with pytest.raises(spindle.RemoteError, match="Unpicklable: a=1") as info:
            future.result(60)
    assert isinstance(info.value.__cause__, RemoteTraceback)
    assert "raise_unpicklable" in info.value.__cause__.tb
    next_call_succeeds()


def test_a_result_too_large_for_a_reply_is_a_clear_error():
    with spindle.Executor(echo=False) as ex:
        with pytest.raises(ValueError, match="spindle.Blob or spindle.Array"):
            ex.submit(bytes, 70 << 20).result(60)  # over the 64 MiB frame limit
    next_call_succeeds()


def test_an_exception_too_large_for_a_reply_still_reports_its_type():
    with spindle.Executor(echo=False) as ex:
        future = ex.submit(remote.raise_huge, 70 << 20)  # its message alone is over 64 MiB
        error = future.exception(60)
    assert not isinstance(error, spindle.WorkerCrashed)
    assert "ValueError" in repr(error) or isinstance(error, ValueError)
    next_call_succeeds()


def test_an_unpicklable_result_is_an_error():
    with spindle.Executor(echo=False) as ex:
        with pytest.raises(TypeError, match="cannot pickle the function's result"):
            ex.submit(remote.return_a_lock).result(60)
    next_call_succeeds()


def test_a_worker_exiting_fails_only_its_call_with_its_status():
    with spindle.Executor(echo=False) as ex:
        crashed = ex.submit(remote.exit_with, 3)
        fine = [ex.submit(remote.square, i) for i in range(4)]
        with pytest.raises(spindle.WorkerCrashed) as info:
            crashed.result(60)
        assert [f.result(60) for f in fine] == [0, 1, 4, 9]
    assert info.value.status == 3 and info.value.signal is None
    assert info.value.stdout == b"about to exit\n"  # what the call wrote before dying
    next_call_succeeds()


def test_a_worker_killed_by_a_signal_reports_it():
    t = spindle.Thread(target=remote.segfault)
    t.start()
    with pytest.raises(spindle.WorkerCrashed) as info:
        t.join(60)
    assert info.value.signal == signal.SIGSEGV
    next_call_succeeds()


def test_a_function_past_its_timeout_is_stopped():
    with spindle.Executor(timeout=0.5, echo=False) as ex:
        with pytest.raises(spindle.FunctionTimeout) as info:
            ex.submit(remote.print_then_sleep, "still working", 120).result(60)
    assert isinstance(info.value, TimeoutError)
    assert info.value.stdout == b"still working\n"  # what it wrote before it was stopped
    next_call_succeeds()


def test_a_function_over_its_memory_limit_is_killed():
    with spindle.Executor(memory_mb=150, echo=False) as ex:
        with pytest.raises(spindle.WorkerCrashed) as info:
            ex.submit(remote.hog_memory, 400, 60).result(90)
    assert info.value.reason == "memory limit"
    next_call_succeeds()


def test_children_sharing_a_functions_memory_copy_on_write_count_it_once():
    # 4 processes x 300 MiB by VmRSS, but 300 MiB of memory: within a 700 MiB limit.
    with spindle.Executor(memory_mb=700, echo=False) as ex:
        assert ex.submit(remote.fork_sharing, 300, 3).result(90) == "3 children shared 300 MiB"
    next_call_succeeds()


def test_a_function_printing_100_mb_is_truncated(capsys):
    total = 100 << 20
    with spindle.Executor(echo=False) as ex:
        future = ex.submit(remote.flood, total)
        assert future.result(120) == "flooded"
    assert len(future.stdout) == 1 << 20
    assert future.report["truncated"] == total - (1 << 20)
    next_call_succeeds()


def test_a_thousand_submissions_on_a_pool_of_eight_all_complete():
    with spindle.Executor(echo=False) as ex:
        futures = [ex.submit(remote.square, i) for i in range(1000)]
        assert [f.result(120) for f in futures] == [i * i for i in range(1000)]
    status = spindle.status()
    assert status["workers"] <= POOL


def test_an_argument_over_1_mib_is_refused():
    big = b"x" * (2 << 20)
    with spindle.Executor() as ex:
        with pytest.raises(ValueError, match="Blob") as info:
            ex.submit(remote.identity, big)
        assert "argument 0" in str(info.value)
        # The same data as a Blob travels as a reference.
        blob = spindle.Blob(big)
        assert ex.submit(remote.blob_length, blob).result(60) == len(big)
    with pytest.raises(ValueError, match="1 MiB"):
        spindle.parallel_for(remote.identity, [big], tasks=1)
    next_call_succeeds()


def test_a_client_disappearing_while_its_tasks_run(child_env, uniq):
    started = spindle.Semaphore(0, name=f"{uniq}.started")
    release = spindle.Event(name=f"{uniq}.release")
    script = textwrap.dedent(
        f"""
        import spindle, remote
        started = spindle.Semaphore(name={uniq + '.started'!r})
        release = spindle.Event(name={uniq + '.release'!r})
        ex = spindle.Executor(echo=False)
        futures = [ex.submit(remote.block_on, started, release) for _ in range({POOL} + 20)]
        print("submitted", flush=True)
        release.wait(120)  # never set before this process is killed
        """
    )
    child = subprocess.Popen([sys.executable, "-c", script], env=child_env, stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "submitted"
        for _ in range(POOL):  # the pool is busy with the client's calls
            assert started.acquire(timeout=60)
    finally:
        child.kill()
        child.wait()
    # Its queued calls are withdrawn and its running calls stopped: the pool is free again
    # although nothing released the calls it was running.
    assert wait_until(lambda: spindle.status()["queued"] == 0)
    next_call_succeeds()
    release.set()
    assert started.acquire(timeout=0.5) is False  # none of the withdrawn calls ever started
    spindle.delete(started)
    spindle.delete(release)


def test_the_program_waits_at_exit_for_its_threads_and_executors(child_env, uniq):
    script = textwrap.dedent(
        f"""
        import spindle, remote
        done = spindle.Counter(name={uniq!r})
        spindle.Thread(target=remote.sleep_then_add, args=(0.5, done)).start()  # never joined
        spindle.Executor(echo=False).submit(remote.sleep_then_add, 0.5, done)  # never shut down
        """
    )
    subprocess.run([sys.executable, "-c", script], env=child_env, check=True, timeout=120)
    done = spindle.Counter(name=uniq)
    assert done.get() == 2  # as threading and concurrent.futures wait for their work at exit
    spindle.delete(done)


def test_a_forked_child_does_not_wait_for_its_parents_threads(child_env):
    script = textwrap.dedent(
        """
        import os, sys, spindle, remote
        t = spindle.Thread(target=remote.sleep_for, args=(2,), echo=False)
        t.start()
        pid = os.fork()
        if pid == 0:
            sys.exit(0)  # a normal exit: must not wait for the parent's call
        _, status = os.waitpid(pid, 0)
        t.join()
        print("child exit", os.waitstatus_to_exitcode(status), flush=True)
        """
    )
    out = subprocess.run([sys.executable, "-c", script], env=child_env, capture_output=True,
                         text=True, timeout=120)
    assert out.stdout.strip() == "child exit 0", out.stderr


def test_invocations_from_a_forked_child():
    def child(q):
        with spindle.Executor(echo=False) as ex:
            q.put(ex.submit(remote.square, 9).result(60))

    with spindle.Executor(echo=False) as ex:  # the parent's invoker exists before the fork
        assert ex.submit(remote.square, 2).result(60) == 4
    q = FORK.Queue()
    p = FORK.Process(target=child, args=(q,))
    p.start()
    assert q.get(timeout=60) == 81
    p.join(60)
    assert p.exitcode == 0
    next_call_succeeds()


# -- security, embedded ----------------------------------------------------------------------


def test_a_server_with_a_token_runs_code_only_for_clients_giving_it(child_env):
    private = ServerProcess("--token", "s3cret", *gateway_args(2))
    try:
        script = textwrap.dedent(
            """
            import spindle, remote
            try:
                print(spindle.Executor(echo=False).submit(remote.square, 5).result(60))
            except PermissionError as exc:
                print("refused", type(exc).__name__)
            """
        )
        env = {**child_env, "SPINDLE_ADDRESS": private.address}
        env.pop("SPINDLE_TOKEN", None)
        out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120)
        assert out.stdout.strip() == "refused Unauthorized", out.stderr
        env["SPINDLE_TOKEN"] = "s3cret"
        out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120)
        assert out.stdout.strip() == "25", out.stderr
    finally:
        private.stop()


def test_the_embedded_server_runs_functions_of_the_main_script(child_env, tmp_path):
    script = tmp_path / "prog.py"
    script.write_text(
        textwrap.dedent(
            """
            import spindle

            def cube(x):
                print("cubing", x)
                return x ** 3

            if __name__ == "__main__":
                client = spindle.connect()
                assert client.server is not None, "expected an embedded server"
                print(spindle.parallel_for(cube, range(6), tasks=3))
            """
        )
    )
    env = {k: v for k, v in child_env.items() if k != "SPINDLE_ADDRESS"}  # a private server
    out = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "[0, 1, 8, 27, 64, 125]" in out.stdout
    assert "[task 1] cubing 2" in out.stdout


# -- joblib ----------------------------------------------------------------------------------


def test_joblib_backend_fits_a_random_forest():
    import joblib
    from sklearn.datasets import make_classification
    from sklearn.ensemble import RandomForestClassifier

    from spindle.joblib import SpindleBackend

    X, y = make_classification(n_samples=200, n_features=6, random_state=0)
    backend = SpindleBackend(echo=False)
    submitted = []
    original = backend.submit
    backend.submit = lambda func, callback=None: submitted.append(1) or original(func, callback)
    with joblib.parallel_backend(backend):
        clf = RandomForestClassifier(n_estimators=12, n_jobs=-1, random_state=0).fit(X, y)
    assert len(clf.estimators_) == 12
    assert clf.score(X, y) > 0.9
    assert submitted  # the trees were built by Spindle functions
    # By name, as a user writes it; the batches run in worker processes.
    with joblib.parallel_backend("spindle"):
        pids = joblib.Parallel(n_jobs=2)(joblib.delayed(os.getpid)() for _ in range(4))
    assert os.getpid() not in pids
