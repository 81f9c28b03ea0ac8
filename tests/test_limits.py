"""Bounds on what clients may hold: connections at once, and the time to say hello. Real
server processes and raw sockets (docs/limits.md)."""

from __future__ import annotations

import socket
import subprocess

import msgpack

from conftest import ServerProcess, server_binary, wait_until
from spindle.client import Connection, frame
from spindle.sessions import new_secret


def read_frame(sock: socket.socket) -> list | None:
    """The next frame's value, or None once the server closed the connection."""
    head = sock.recv(4, socket.MSG_WAITALL)
    if len(head) < 4:
        return None
    return msgpack.unpackb(sock.recv(int.from_bytes(head, "big"), socket.MSG_WAITALL))


def open_raw(address: str) -> socket.socket:
    host, port = address.rsplit(":", 1)
    return socket.create_connection((host, int(port)), timeout=30)


def test_past_max_connections_a_new_client_is_told_at_once():
    server = ServerProcess("--max-connections", "3")
    host, port = server.address.rsplit(":", 1)
    held = [Connection(host, int(port), new_secret(), 1) for _ in range(3)]
    try:
        with open_raw(server.address) as extra:
            reply = read_frame(extra)
            assert reply is not None and reply[1] == 1 and reply[2][0] == "Busy", reply
            assert "--max-connections" in reply[2][1]
            assert read_frame(extra) is None, "and the connection closes"
        # The ones served go on; one closing makes room.
        assert held[0].roundtrip(frame([5, "ping"]), 5)[2] == "pong"
        held.pop().close()

        def room() -> bool:
            try:
                held.append(Connection(host, int(port), new_secret(), 1))
                return True
            except OSError:
                return False
        assert wait_until(room, 10)
    finally:
        for conn in held:
            conn.close()
        server.stop()


def test_a_connection_that_never_says_hello_is_closed_and_one_that_did_stays():
    server = ServerProcess("--hello-timeout", "0.5")
    host, port = server.address.rsplit(":", 1)
    greeted = Connection(host, int(port), new_secret(), 1)
    try:
        with open_raw(server.address) as silent:
            reply = read_frame(silent)
            assert reply is not None and reply[1] == 1 and reply[2][0] == "ProtocolError", reply
            assert "no hello within" in reply[2][1]
            assert read_frame(silent) is None
        # A connection half-way through its hello frame is closed too.
        with open_raw(server.address) as partial:
            partial.sendall(frame([1, "hello", {"client": "x", "protocol": 1}])[:6])
            reply = read_frame(partial)
            assert reply is not None and "no hello within" in reply[2][1], reply
        # The greeted connection outlived both deadlines.
        assert greeted.roundtrip(frame([9, "ping"]), 9)[2] == "pong"
    finally:
        greeted.close()
        server.stop()


def test_bad_limits_are_refused_at_start():
    for args in (["--hello-timeout", "0"], ["--hello-timeout=-1"], ["--max-connections", "0"]):
        out = subprocess.run([server_binary(), "server", "--port", "0", *args], capture_output=True, text=True,
                             timeout=30, stdin=subprocess.DEVNULL)
        assert out.returncode == 2 and args[0].split("=")[0] in out.stderr, (args, out.stderr)
