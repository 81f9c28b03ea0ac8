"""connect(): the named server, or else a private embedded one; "auto" finds a shared one."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import spindle
from conftest import ServerProcess, connected_to, free_port, listening, wait_until


def test_connect_reuses_the_listening_server(server):
    client = spindle.connect()
    assert client.address == server.address
    assert client.server is None  # nothing embedded: the fixture's server was listening
    assert spindle.status()["pid"] == server.process.pid


def without_address(env: dict) -> dict:
    return {k: v for k, v in env.items() if k != "SPINDLE_ADDRESS"}


def test_connect_without_an_address_starts_a_private_embedded_server(child_env):
    script = textwrap.dedent(
        """
        import os, subprocess, sys, spindle
        c = spindle.Counter(name="embedded")
        c.add(5)
        client = spindle.connect()
        print(client.server is not None)
        print(os.environ["SPINDLE_ADDRESS"])
        print(spindle.status()["pid"] == client.server.process.pid)
        # A child process finds the embedded server through SPINDLE_ADDRESS.
        code = "import spindle; print(spindle.Counter(name='embedded').add(1))"
        print(subprocess.run([sys.executable, "-c", code], capture_output=True,
                             text=True).stdout.strip())
        """
    )
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True,
        env=without_address(child_env), timeout=120,
    )
    assert out.returncode == 0, out.stderr
    lines = out.stdout.split()
    assert lines[0] == "True"
    port = int(lines[1].rsplit(":", 1)[1])
    assert lines[1] == f"127.0.0.1:{port}" and port != 7070  # a free port, not the shared one
    assert lines[2] == "True"
    assert lines[3] == "6"
    # The embedded server ends with the program.
    assert wait_until(lambda: not listening(port), interval=0.05)


def test_two_programs_have_embedded_servers_of_their_own(child_env, tmp_path):
    # The first program holds its object until told to exit; the second starts meanwhile,
    # must not see the first's object, and keeps working after the first has exited.
    go = tmp_path / "go"
    first = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(
            f"""
            import os, time, spindle
            spindle.Counter(name="mine").add(1)
            print(os.environ["SPINDLE_ADDRESS"], flush=True)
            while not os.path.exists({str(go)!r}):
                time.sleep(0.01)
            """
        )],
        stdout=subprocess.PIPE, text=True, env=without_address(child_env),
    )
    second = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(
            f"""
            import os, time, spindle
            c = spindle.Counter(name="mine")
            print(os.environ["SPINDLE_ADDRESS"], c.add(10), flush=True)
            while not os.path.exists({str(go)!r} + "2"):
                time.sleep(0.01)
            print(c.add(5), spindle.Dict(name="d").setdefault("k", 1), flush=True)
            """
        )],
        stdout=subprocess.PIPE, text=True, env=without_address(child_env),
    )
    try:
        assert first.stdout is not None and second.stdout is not None
        first_address = first.stdout.readline().strip()
        second_address, count = second.stdout.readline().split()
        assert first_address != second_address
        assert count == "10"  # not 11: the second never attached to the first's server
        go.touch()
        assert first.wait(60) == 0
        assert wait_until(lambda: not listening(int(first_address.rsplit(":", 1)[1])), interval=0.05)
        (tmp_path / "go2").touch()
        assert second.stdout.readline().split() == ["15", "1"]
        assert second.wait(60) == 0
    finally:
        for proc in (first, second):
            if proc.poll() is None:
                proc.kill()
                proc.wait()


def test_an_address_where_nothing_listens_is_server_unavailable(child_env):
    # Named by SPINDLE_ADDRESS or by connect(): an error naming it, never a server started
    # there (workers and hosts, with embedded=False, likewise).
    port = free_port()
    script = textwrap.dedent(
        f"""
        import spindle
        for how in ("env", "arg", "workers"):
            try:
                if how == "env":
                    spindle.connect()
                elif how == "arg":
                    spindle.connect("127.0.0.1:{port}")
                else:
                    spindle.connect("127.0.0.1:{port}", embedded=False)
            except spindle.ServerUnavailable as exc:
                print("refused:", exc)
        """
    )
    env = {**child_env, "SPINDLE_ADDRESS": f"127.0.0.1:{port}"}
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=60
    )
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert len(lines) == 3, out.stdout
    for line in lines:
        assert line.startswith(f"refused: spindle server at 127.0.0.1:{port} is unavailable"), line
    assert not listening(port)


def test_connect_auto_finds_the_running_server_or_says_none_runs(server, child_env):
    found = textwrap.dedent(
        """
        import spindle
        print(spindle.connect("auto").address)
        """
    )
    out = subprocess.run([sys.executable, "-c", found], capture_output=True, text=True,
                         env=child_env, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == server.address
    if listening(7070):
        return  # someone's shared server on the well-known port: "auto" would find it
    missing = textwrap.dedent(
        """
        import spindle
        try:
            spindle.connect("auto")
        except spindle.ServerUnavailable as exc:
            print("refused:", exc)
        """
    )
    out = subprocess.run([sys.executable, "-c", missing], capture_output=True, text=True,
                         env=without_address(child_env), timeout=60)
    assert out.returncode == 0, out.stderr
    assert "no running spindle server found" in out.stdout and "spindle server" in out.stdout


def test_objects_status_and_delete(uniq):
    # A server of its own: its status counts only this test's objects and connections.
    private = ServerProcess()
    try:
        with connected_to(private):
            c = spindle.Counter(name=f"{uniq}.c")
            spindle.Dict(name=f"{uniq}.d")
            assert spindle.objects(uniq) == [(f"{uniq}.c", "Counter"), (f"{uniq}.d", "Dict")]
            status = spindle.status()
            assert status["objects"] == 2 and status["connections"] == 1
            assert spindle.delete(c) is True
            assert spindle.delete(c) is False
            assert spindle.objects(uniq) == [(f"{uniq}.d", "Dict")]
            assert spindle.status()["objects"] == 1
            try:
                c.get()
            except spindle.ObjectNotFound as exc:
                assert isinstance(exc, LookupError)
            else:
                raise AssertionError("a deleted object answered")
            assert os.environ["SPINDLE_ADDRESS"] == spindle.connect().address == private.address
    finally:
        private.stop()
