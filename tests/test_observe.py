"""Live output and control over running calls: a cloud thread's output reaches its caller
as it is printed, prefixed with the thread's name; `spindle ps`, `kill`, `logs [-f]`,
`status --json`, `objects --all`; the warning of a pool too small for the program.

Programs run as child processes against the session's server (real workers), and the test
watches their output as it comes.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import threading
import warnings
from typing import List, Optional

import pytest

import spindle
from conftest import ServerProcess, connected_to, gateway_args, wait_until
from spindle.compute import pool_watch


def spindle_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([os.environ["SPINDLE_BIN"], *args], capture_output=True, text=True, timeout=60)


class Program:
    """A Python program in a child process; its stdout read line by line as it comes."""

    def __init__(self, source: str, env: dict) -> None:
        self.process = subprocess.Popen(
            [sys.executable, "-u", "-c", textwrap.dedent(source)],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
        )
        self.lines: List[str] = []
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.process.stdout:  # type: ignore[union-attr]
            self.lines.append(line)

    def saw(self, text: str) -> bool:
        return any(text in line for line in self.lines)

    def wait_for(self, text: str) -> None:
        assert wait_until(lambda: self.saw(text) or self.process.poll() is not None), self.lines
        assert self.saw(text), f"{text!r} not in the program's output: {''.join(self.lines)}"

    def end(self) -> int:
        try:
            return self.process.wait(60)
        finally:
            if self.process.poll() is None:
                self.process.kill()


def call_id(function: str) -> Optional[int]:
    """The id of the call of `function` in `spindle ps`, if listed."""
    for line in spindle_cli("ps").stdout.splitlines()[1:]:
        cells = line.split()
        if function in cells:
            return int(cells[0])
    return None


def test_output_arrives_as_printed_with_the_thread_name_daemons_too(child_env, uniq):
    program = Program(f"""
        import threading
        import spindle
        spindle.connect()
        go = spindle.Event(name="{uniq}-go")

        def work(go):
            print("hello from", threading.current_thread().name)  # no flush
            go.wait()
            print("bye")

        t = spindle.Thread(target=work, args=(go,), name="chatty")
        d = spindle.Thread(target=work, args=(go,), name="ghost", daemon=True)
        t.start(); d.start()
        t.join()
        print("joined")
        """, child_env)
    # Both lines come while the functions still wait for the event this test sets.
    program.wait_for("[chatty] hello from chatty")
    program.wait_for("[ghost] hello from ghost")
    assert not program.saw("bye") and program.process.poll() is None
    spindle.Event(name=f"{uniq}-go").set()
    assert program.end() == 0
    assert program.saw("[chatty] bye") and program.saw("joined")


def test_ps_lists_a_running_call_and_logs_follow_it(child_env, uniq):
    program = Program(f"""
        import spindle
        spindle.connect()
        go = spindle.Event(name="{uniq}-go")

        def talker_{uniq}(go):
            print("one")
            go.wait()
            print("two")

        t = spindle.Thread(target=talker_{uniq}, args=(go,), name="talker")
        t.start(); t.join()
        """, child_env)
    program.wait_for("[talker] one")
    function = f"talker_{uniq}"
    assert wait_until(lambda: call_id(function) is not None)
    row = next(line for line in spindle_cli("ps").stdout.splitlines() if function in line.split())
    assert "running" in row.split() and "pid" in row  # its state, and its caller
    id_ = call_id(function)
    assert spindle_cli("logs", str(id_)).stdout == "one\n"
    follower = subprocess.Popen([os.environ["SPINDLE_BIN"], "logs", "-f", str(id_)],
                                stdout=subprocess.PIPE, text=True)
    assert follower.stdout.readline() == "one\n"  # type: ignore[union-attr]
    spindle.Event(name=f"{uniq}-go").set()
    out, _ = follower.communicate(timeout=60)
    assert out == "two\n" and follower.returncode == 0
    assert program.end() == 0
    assert call_id(function) is None


def test_an_endless_printer_is_bounded_and_kill_ends_it(child_env, uniq):
    program = Program(f"""
        import spindle
        spindle.connect()
        printed = spindle.Counter(name="{uniq}-mib")

        def flood_{uniq}(printed):
            line = "x" * 1023
            while True:
                for _ in range(1024):
                    print(line)
                printed.add(1)

        t = spindle.Thread(target=flood_{uniq}, args=(printed,), name="flood")
        t.start()
        try:
            t.join()
        except spindle.WorkerCrashed as e:
            print("ENDED", e)
        """, child_env)
    printed = spindle.Counter(name=f"{uniq}-mib")
    assert wait_until(lambda: printed.get() >= 8, deadline=120)  # 8 MiB printed
    id_ = call_id(f"flood_{uniq}")
    assert id_ is not None
    # The output reaches the server in batches that may trail the counter's calls: wait for
    # the first rather than assume it came with them.
    assert wait_until(lambda: spindle_cli("logs", str(id_)).stdout, deadline=30)
    logs = spindle_cli("logs", str(id_)).stdout
    assert 0 < len(logs) <= 64 * 1024  # the server keeps a bounded tail
    assert spindle_cli("kill", str(id_)).returncode == 0
    assert program.end() == 0
    assert program.saw("ENDED") and program.saw("killed with spindle kill")
    echoed = sum(len(line) for line in program.lines if line.startswith("[flood] "))
    assert 0 < echoed <= (1 << 20) + 1024 * len("[flood] ")  # 1 MiB reached the caller, no more
    assert spindle_cli("kill", str(id_)).returncode != 0  # gone


def test_kill_withdraws_a_queued_call():
    proc = ServerProcess(*gateway_args(1))
    try:
        with connected_to(proc):
            gate = spindle.Event()
            first = spindle.Thread(target=gate.wait, name="blocker", echo=False)
            first.start()
            second = spindle.Thread(target=print, args=("never",), name="waiting", echo=False)
            second.start()
            env = dict(os.environ, SPINDLE_ADDRESS=proc.address)

            def queued_id() -> Optional[int]:
                """The waiting call's id, once the blocker runs (before, both wait)."""
                out = subprocess.run([os.environ["SPINDLE_BIN"], "ps"], capture_output=True,
                                     text=True, env=env).stdout
                rows = [line.split() for line in out.splitlines()[1:]]
                if not any("running" in r for r in rows):
                    return None
                return next((int(r[0]) for r in rows if "queued" in r), None)

            assert wait_until(lambda: queued_id() is not None)
            kill = subprocess.run([os.environ["SPINDLE_BIN"], "kill", str(queued_id())], env=env)
            assert kill.returncode == 0
            with pytest.raises(Exception) as info:
                second.join(30)
            assert "spindle kill" in str(info.value) or info.type.__name__ == "CancelledError"
            gate.set()
            first.join(30)
    finally:
        proc.stop()


def test_status_json_parses():
    status = json.loads(spindle_cli("status", "--json").stdout)
    assert isinstance(status["workers"], int) and status["address"]


def test_objects_all_lists_unnamed_objects_with_sizes(uniq):
    unnamed = spindle.List()
    unnamed.extend(["x" * 1000] * 10)
    spindle.Counter(name=f"{uniq}-named")
    key = unnamed.key
    assert key not in spindle_cli("objects").stdout
    rows = [line.split() for line in spindle_cli("objects", "--all").stdout.splitlines()]
    row = next(r for r in rows if r[0] == key)
    assert row[1] == "List" and int(row[2]) >= 10_000
    assert any(r[0] == f"{uniq}-named" for r in rows)


def test_a_pool_too_small_for_a_barrier_warns_naming_max_workers(monkeypatch):
    monkeypatch.setattr(pool_watch, "WARN_AFTER", 0.5)
    monkeypatch.setattr(pool_watch, "_warned", False)
    proc = ServerProcess(*gateway_args(1))
    try:
        with connected_to(proc), warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            barrier = spindle.Barrier(2)
            threads = [spindle.Thread(target=barrier.wait, name=f"party-{i}", echo=False) for i in range(2)]
            for t in threads:
                t.start()
            assert wait_until(lambda: any(issubclass(w.category, spindle.PoolDeadlockWarning)
                                          for w in caught))
            warning = next(w for w in caught if issubclass(w.category, spindle.PoolDeadlockWarning))
            assert "--max-workers" in str(warning.message) and "barrier" in str(warning.message)
            barrier.abort()
            for t in threads:
                try:
                    t.join(30)
                except Exception:
                    pass
    finally:
        proc.stop()


def test_kill_ends_a_detached_shell_function(uniq):
    started = spindle_cli("sh", "--async", f"echo {uniq}; sleep 600")
    assert started.returncode == 0, started.stderr
    function = f"echo {uniq}; sleep 600"
    assert wait_until(lambda: any(function in line for line in spindle_cli("ps").stdout.splitlines()))
    row = next(line for line in spindle_cli("ps").stdout.splitlines() if function in line)
    assert "spindle sh pid" in row
    assert spindle_cli("kill", row.split()[0]).returncode == 0
    assert wait_until(lambda: function not in spindle_cli("ps").stdout)
