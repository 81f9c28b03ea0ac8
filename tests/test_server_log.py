"""Each error is an exception for the caller and a line in the server's log."""

from __future__ import annotations

import subprocess

import pytest

import spindle
from conftest import ServerProcess, connected_to, server_binary


def test_client_errors_are_logged_by_the_server():
    proc = subprocess.Popen(
        [server_binary(), "server", "--port", "0"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    try:
        address = proc.stdout.readline().split()[-1]
        client = spindle.client.Client(address)
        client.create("Counter", "hits", [], False)
        with pytest.raises(spindle.UnknownMethod):
            client.call("Counter", "hits", "explode", [])
        with pytest.raises(spindle.TypeMismatch):
            client.call("Queue", "hits", "get", [])
        with pytest.raises(TypeError):
            client.call("Counter", "hits", "add", ["five"])
        client.close()
    finally:
        proc.terminate()
        _, log = proc.communicate(timeout=30)
    assert "Counter has no method 'explode'" in log
    assert "'hits' is a Counter, not a Queue" in log
    assert "must be an integer" in log


@spindle.shared
class Tally:
    def __init__(self) -> None:
        self.n = 0

    def add(self, k: int) -> int:
        self.n += k
        return self.n


def test_a_clean_stop_with_a_live_object_host_warns_of_nothing():
    """The server kills its object hosts as it stops: their objects go with it, which is no
    loss to warn of."""
    server = ServerProcess(stderr=subprocess.PIPE)
    try:
        with connected_to(server):
            assert Tally().add(2) == 2
    finally:
        server.stop()
    log = server.process.stderr.read()
    assert "stopped accepting connections" in log, log
    assert " WARN " not in log and " ERROR " not in log, log
