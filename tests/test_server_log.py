"""Each error is an exception for the caller and a line in the server's log."""

from __future__ import annotations

import subprocess

import pytest

import spindle
from conftest import server_binary


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
