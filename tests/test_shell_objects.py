"""Shared objects as shell commands (docs/shell.md) and the Python SDK on the same objects:
what one writes, the other reads. The commands are the real ``spindle`` binary, started as
``spindle TYPE ...``."""

from __future__ import annotations

import os
import subprocess
import threading
from typing import List

import spindle
from conftest import ServerProcess, server_binary, wait_until


def shell_env() -> dict:
    """The environment of a shell command: the session's server, no token."""
    env = dict(os.environ)
    env.pop("SPINDLE_TOKEN", None)
    return env


def sh(*args: str, input: bytes = b"", check: bool = True) -> subprocess.CompletedProcess:
    """``spindle TYPE ARGS...`` against the session's server."""
    done = subprocess.run(
        [server_binary(), *args], input=input, capture_output=True, env=shell_env(), timeout=60
    )
    if check:
        assert done.returncode == 0, done.stderr.decode()
    return done


def out(*args: str) -> str:
    return sh(*args).stdout.decode()


def test_a_map_written_by_the_shell_reads_as_a_dict(uniq: str) -> None:
    name = f"{uniq}.words"
    for _ in range(2):
        sh("map", "-n", name, "mergeAll", "-1", "1=1", "-1", "word=1", "-2", "sum")
    sh("map", "-n", name, "put", "-1", "pi", "-2", "3.14")
    sh("map", "-n", name, "put", "-1", "text", "-2", "hello world")
    words = spindle.Dict(name=name)
    # Typed as literals: ints and floats are numbers, the rest strings.
    assert dict(words) == {1: 2, "word": 2, "pi": 3.14, "text": "hello world"}
    words.merge("word", 5, op="sum")
    assert out("map", "-n", name, "get", "-1", "word") == "7\n"


def test_python_objects_read_from_the_shell(uniq: str) -> None:
    hits = spindle.Counter(41, name=f"{uniq}.hits")
    assert out("counter", "-n", f"{uniq}.hits", "increment") == "42\n"
    assert hits.get() == 42
    ordered = spindle.SortedDict(name=f"{uniq}.sorted")
    ordered.update({"b": 2, "a": 1, "c": [1, "x"]})
    assert out("treemap", "-n", f"{uniq}.sorted", "entrySet") == "a=1\nb=2\nc=[1, x]\n"
    items = spindle.List(name=f"{uniq}.items")
    items.extend(["x", 2, None])
    assert out("list", "-n", f"{uniq}.items", "list") == "x\n2\n\n"
    done = spindle.Future(name=f"{uniq}.rdv")
    done.set_result("10.0.0.7")
    assert out("rdv", "-n", f"{uniq}.rdv") == "10.0.0.7\n"
    # A name holding another type is refused, with both type names.
    refused = sh("map", "-n", f"{uniq}.hits", "size", check=False)
    assert refused.returncode == 1
    assert refused.stderr.decode() == f"map: '{uniq}.hits' is a Counter, not a Dict\n"


def test_a_barrier_between_a_thread_and_a_shell_process(uniq: str) -> None:
    barrier = spindle.Barrier(2, name=f"{uniq}.b")
    indexes: List[int] = []
    waiter = threading.Thread(target=lambda: indexes.append(barrier.wait(timeout=30)))
    waiter.start()
    assert wait_until(lambda: barrier.n_waiting == 1)
    printed = int(out("barrier", "-n", f"{uniq}.b", "await"))
    waiter.join()
    # The shell counts arrivals from 1 (as CRUCIAL did), Python from 0: the second arrival.
    assert (indexes, printed) == ([0], 2)


def test_the_pipe_encoding_is_a_queue_of_chunks_ended_by_none(uniq: str) -> None:
    data = b"".join(b"line %d\n" % i for i in range(50_000))
    # Read while the shell writes: input arriving slowly comes in more chunks than the pipe
    # holds (16), and the writer then waits for this reader.
    written: List[subprocess.CompletedProcess] = []
    writer = threading.Thread(target=lambda: written.append(sh("pipe", "-n", f"{uniq}.p", "write", input=data)))
    writer.start()
    pipe = spindle.Queue(16, name=f"{uniq}.p")
    assert pipe.maxsize == 16
    chunks = []
    while (chunk := pipe.get(timeout=30)) is not None:
        assert isinstance(chunk, bytes) and len(chunk) <= 64 << 10 and chunk.endswith(b"\n")
        chunks.append(chunk)
    writer.join(60)
    assert len(written) == 1, "the shell's write finished"
    assert b"".join(chunks) == data

    # And a pipe fed from Python reads from the shell.
    back = spindle.Queue(16, name=f"{uniq}.back")
    feeder = threading.Thread(target=lambda: [back.put(c) for c in chunks + [None]])
    feeder.start()
    assert sh("pipe", "-n", f"{uniq}.back", "read").stdout == data
    feeder.join()


def test_a_long_put_from_the_shell_leaves_the_server_few_replies(uniq: str) -> None:
    # A server of its own: its reply count moves only with this test's calls.
    saved = os.environ["SPINDLE_ADDRESS"]
    private = ServerProcess()
    spindle.connect(private.address)
    try:
        # The queue holds 2000: the shell's 2001st put waits, so its session is still open.
        jobs = spindle.Queue(2000, name=f"{uniq}.jobs")
        before = spindle.status()["replies"]
        items = [arg for i in range(2001) for arg in ("-1", str(i))]
        putter = subprocess.Popen([server_binary(), "queue", "-n", f"{uniq}.jobs", "put", *items],
                                  stderr=subprocess.PIPE,
                                  env={**shell_env(), "SPINDLE_ADDRESS": private.address})
        try:
            assert wait_until(lambda: jobs.qsize() == 2000)
            # Each put acknowledged the replies before it: the server keeps the one in
            # flight, not 2000.
            assert spindle.status()["replies"] - before <= 2
            assert jobs.get() == 0
        except BaseException:
            putter.kill()  # its last put would wait for room forever
            raise
        finally:
            _, err = putter.communicate(timeout=60)
        assert putter.returncode == 0, err.decode()
        assert jobs.qsize() == 2000
    finally:
        spindle.connect(saved)
        private.stop()
