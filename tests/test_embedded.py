"""connect(): reuse a listening server, or start an embedded one when nothing listens."""

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


def test_connect_starts_an_embedded_server_when_nothing_listens(child_env):
    port = free_port()
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
    env = {**child_env, "SPINDLE_ADDRESS": f"127.0.0.1:{port}"}
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=120
    )
    assert out.returncode == 0, out.stderr
    lines = out.stdout.split()
    assert lines[0] == "True"
    assert lines[1] == f"127.0.0.1:{port}"
    assert lines[2] == "True"
    assert lines[3] == "6"
    # The embedded server ends with the program.
    assert wait_until(lambda: not listening(port), interval=0.05)


def test_workers_and_hosts_never_start_a_server_of_their_own(child_env):
    # What the server's workers and object hosts use: a dead address is an error, not an
    # embedded server nobody would stop.
    port = free_port()
    script = textwrap.dedent(
        f"""
        import spindle
        try:
            spindle.connect("127.0.0.1:{port}", embedded=False)
        except spindle.ServerUnavailable as exc:
            print("refused:", exc)
        """
    )
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, env=child_env, timeout=60
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("refused: spindle server at 127.0.0.1:"), out.stdout
    assert not listening(port)


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
