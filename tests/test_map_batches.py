"""Executor.map sends tiny tasks in batches, keeping each task's result, exception and order;
a progress bar for long maps."""

from __future__ import annotations

import functools

import re
import subprocess
import sys
import textwrap

import pytest

import remote
import spindle
from conftest import ServerProcess, connected_to, gateway_args
from spindle.errors import RemoteTraceback


def labels_of(out: str) -> list:
    return re.findall(r"^\[(task \d+)\] shout (\d+)$", out, re.M)


def test_tiny_tasks_go_in_batches_in_order(capsys):
    with spindle.Executor(max_workers=1) as ex:
        assert list(ex.map(remote.shout, range(40))) == list(range(40))
    printed = labels_of(capsys.readouterr().out)
    assert sorted(int(n) for _, n in printed) == list(range(40))
    calls = {label for label, _ in printed}
    # 1 worker, 4 batches: 4 calls of 10 tasks (one call per task would be 40).
    assert len(calls) == 4
    for label in calls:  # a batch runs its tasks in order
        numbers = [int(n) for lab, n in printed if lab == label]
        assert numbers == sorted(numbers) and len(numbers) == 10


def test_a_pool_larger_than_the_cores_gets_4_batches_per_core(capsys):
    status = spindle.status()
    cores, pool = status["cores"], status["max_workers"]
    tasks = 40 * cores
    assert tasks > pool
    with spindle.Executor() as ex:  # the server's pool
        assert list(ex.map(remote.shout, range(tasks))) == list(range(tasks))
    calls = {label for label, _ in labels_of(capsys.readouterr().out)}
    assert len(calls) == 4 * min(cores, pool)  # not 4 per worker of the pool


def test_tasks_that_could_all_run_at_once_each_get_a_call():
    # They may wait for each other, as threads would: batched, they would never meet. A pool
    # larger than 4 batches per core, which is where batching would otherwise begin.
    pool = 4 * spindle.status()["cores"] + 4
    server = ServerProcess(*gateway_args(pool))
    try:
        with connected_to(server):
            meeting = spindle.Barrier(pool)
            with spindle.Executor(echo=False) as ex:
                indices = list(ex.map(remote.meet, [meeting] * pool, [60] * pool))
            assert sorted(indices) == list(range(pool))
    finally:
        server.stop()


def test_a_task_failure_is_raised_at_its_place_with_its_traceback():
    with spindle.Executor(max_workers=2, echo=False) as ex:
        results = ex.map(remote.fail_at, range(30), [17] * 30)
        assert [next(results) for _ in range(17)] == list(range(17))
        with pytest.raises(ValueError, match="task 17 failed") as info:
            next(results)
    cause = info.value.__cause__
    assert isinstance(cause, RemoteTraceback) and "fail_at" in str(cause)
    assert "run_each" not in str(cause)  # the batch's own frame is not the task's
    # One iterable: each item is the task's one argument (a tuple stays a tuple).
    with spindle.Executor(max_workers=2, echo=False) as ex:
        results = ex.map(functools.partial(remote.fail_at, bad=5), range(30))
        assert [next(results) for _ in range(5)] == list(range(5))
        with pytest.raises(ValueError, match="task 5 failed"):
            next(results)
        assert list(ex.map(remote.identity, [(1, 2), (3,)] * 10)) == [(1, 2), (3,)] * 10


def test_explicit_chunksize_and_retries_set_the_calls(capsys):
    with spindle.Executor(max_workers=2, retries=1) as ex:  # retries are per task
        assert list(ex.map(remote.shout, range(6))) == list(range(6))
    assert len({label for label, _ in labels_of(capsys.readouterr().out)}) == 6
    with spindle.Executor() as ex:
        assert list(ex.map(remote.shout, range(6), chunksize=3)) == list(range(6))
        assert list(ex.map(remote.shout, range(3), chunksize=1)) == list(range(3))
    assert len({label for label, _ in labels_of(capsys.readouterr().out)}) == 2 + 3
    with pytest.raises(ValueError):
        spindle.Executor().map(remote.shout, range(3), chunksize=0)


def test_map_timeout_and_empty_input():
    release = spindle.Event()
    with spindle.Executor(echo=False) as ex:
        assert list(ex.map(remote.shout, [])) == []
        results = ex.map(remote.wait_event, [release] * 4, timeout=0.5)
        with pytest.raises(TimeoutError):
            list(results)
        release.set()


BAR = textwrap.dedent(
    """
    import sys, spindle, remote
    progress = {"on": True, "off": False, "auto": None}[sys.argv[1]]
    with spindle.Executor(echo=False, progress=progress) as ex:
        print(sum(ex.map(remote.square, range(50))))
    print(sum(spindle.parallel_for(remote.square, range(50), tasks=5, echo=False,
                                   progress=progress)))
    """
)


@pytest.mark.parametrize("mode", ["on", "off", "auto"])
def test_progress_bar_only_when_asked_or_on_a_terminal(child_env, mode):
    # Asked for: drawn on stderr (tqdm); auto with stderr a pipe, or off: nothing drawn.
    out = subprocess.run([sys.executable, "-c", BAR, mode], env=child_env, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["40425", "40425"]
    drawn = re.findall(r"(task|parallel_for): +\d+%", out.stderr)
    if mode == "on":
        assert {"task", "parallel_for"} <= set(drawn), out.stderr
    else:
        assert drawn == [] and "/50" not in out.stderr, out.stderr


WAITING = textwrap.dedent(
    """
    import sys, spindle, remote
    release = spindle.Event(name=sys.argv[1])
    with spindle.Executor(echo=False) as ex:
        print(list(ex.map(remote.wait_event, [release] * 3)))
    """
)


def test_a_long_map_draws_a_bar_when_stderr_is_a_terminal(child_env, uniq):
    # The bar shows once the map has run DELAY seconds; the map waits for us to see it.
    import fcntl
    import os
    import pty
    import select
    import struct
    import termios
    import time

    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 100, 0, 0))
    proc = subprocess.Popen([sys.executable, "-c", WAITING, f"{uniq}.go"], env=child_env,
                            stdout=subprocess.PIPE, stderr=slave, text=True)
    os.close(slave)
    seen = ""
    try:
        deadline = time.monotonic() + 120
        while "task:" not in seen and time.monotonic() < deadline:
            if select.select([master], [], [], 1)[0]:
                seen += os.read(master, 4096).decode("utf-8", "replace")
        assert re.search(r"task: +0%.*0/3", seen), seen
    finally:
        spindle.Event(name=f"{uniq}.go").set()
        out, _ = proc.communicate(timeout=120)
        os.close(master)
    assert out.strip() == "[True, True, True]"
