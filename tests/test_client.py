"""The client: threads, interrupted calls, exactly-once resends, raw protocol."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import threading
import uuid
from typing import Iterator, List, Tuple

import pytest

import spindle
from conftest import ParkedProbe, ServerProcess, connected_to, server_binary, wait_until
from spindle.client import Client, Connection, frame, parse_address
from spindle.codec import unpackb


def test_threads_share_objects_through_their_own_connections():
    counter = spindle.Counter()

    def work():
        for _ in range(2000):
            counter.increment()

    threads = [threading.Thread(target=work) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert counter.get() == 16_000


class AlarmWhenParked(threading.Thread):
    """Send SIGALRM to the main thread once a call is parked on ``obj`` in the server (or
    after the failure deadline, so a call that never parks cannot hang the test)."""

    def __init__(self, obj) -> None:
        super().__init__(daemon=True)
        self.obj, self.parked = obj, False
        self.start()

    def run(self) -> None:
        with ParkedProbe(self.obj) as probe:
            self.parked = wait_until(probe.parked)
        signal.pthread_kill(threading.main_thread().ident, signal.SIGALRM)


def test_interrupted_call_discards_its_connection():
    q = spindle.Queue()

    class Interrupted(Exception):
        pass

    def interrupt(*_):
        raise Interrupted

    old = signal.signal(signal.SIGALRM, interrupt)
    alarm = AlarmWhenParked(q)
    try:
        with pytest.raises(Interrupted):
            q.get()  # parked in the server until the signal interrupts it
    finally:
        alarm.join()
        signal.signal(signal.SIGALRM, old)
    assert alarm.parked  # the get really was parked when it was interrupted
    with ParkedProbe(q) as probe:
        assert wait_until(lambda: not probe.parked())  # and is withdrawn
    q.put("x")
    assert q.qsize() == 1  # the interrupted get did not take it
    assert q.get(timeout=30) == "x"


def raw_connection(address: str, session: str) -> Connection:
    host, port = parse_address(address)
    return Connection(host, port, session, 1)


def test_a_resent_call_is_applied_once(server):
    counter = spindle.Counter()
    session = uuid.uuid4().hex
    request = [7, "call", 1, 0, "Counter", counter.key, "add", [5]]
    first = raw_connection(server.address, session)
    assert first.roundtrip(frame(request), 7) == [7, 0, 5]
    first.close()
    again = raw_connection(server.address, session)  # a reconnect of the same session
    assert again.roundtrip(frame(request), 7) == [7, 0, 5]
    assert counter.get() == 5
    request[2] = 2  # a new seq runs again
    assert again.roundtrip(frame(request), 7) == [7, 0, 10]
    again.close()


def test_replies_below_acked_are_forgotten_and_the_calls_own_kept(server):
    counter = spindle.Counter()
    conn = raw_connection(server.address, uuid.uuid4().hex)
    assert "acked" in conn.hello["features"]  # clients send it only to servers listing it

    def add(seq: int, n: int, acked: int = 0) -> object:
        request = [seq, "call", seq, 0, "Counter", counter.key, "add", [n]] + ([acked] if acked else [])
        return conn.roundtrip(frame(request), seq)[2]

    assert add(1, 5) == 5
    assert add(2, 1, acked=2) == 6  # the reply of seq 1 is held by the client
    assert add(2, 1, acked=2) == 6  # seq 2's own reply is kept: a resend is not applied
    # Seq 1's reply is forgotten, and a late copy of it is refused rather than run again.
    kind, message, _ = add(1, 5)
    assert kind == "ProtocolError" and "stale copy" in message
    assert add(3, 1, acked=50) == 7  # acked above its own seq: its own reply is still kept
    assert add(3, 1, acked=50) == 7
    assert counter.get() == 7
    conn.close()


@pytest.fixture
def own_server() -> Iterator[ServerProcess]:
    """A server of the test's own, this process connected to it for the test: its counters
    (replies, connections) move only with what the test does."""
    proc = ServerProcess()
    try:
        with connected_to(proc):
            yield proc
    finally:
        proc.stop()


def test_the_client_acknowledges_so_the_server_keeps_few_replies(own_server):
    client = spindle.connect()
    assert client.address == own_server.address
    counter = spindle.Counter()  # one key: one partition
    before = spindle.status()["replies"]

    def work() -> None:
        for _ in range(500):
            counter.increment()

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert counter.get() == 2000
    # The replies of the calls in flight at the end (one per thread at most), not 2000.
    after = spindle.status()["replies"]
    assert after - before <= 4
    # A scoped session (a function invocation, which a retry replays) keeps its replies.
    with client.scope(uuid.uuid4().hex):
        for _ in range(100):
            counter.increment()
    assert spindle.status()["replies"] - after >= 100


@pytest.fixture
def older_server() -> Iterator[Tuple[str, List[list]]]:
    """A server of protocol 1 before ``acked``: its hello lists no ``features``, and it
    refuses a ``call`` of more than 8 items and a ``create`` of more than 9, as servers did
    then. Yields its address and the calls and creates it took."""
    listener = socket.create_server(("127.0.0.1", 0))
    taken: List[list] = []
    most = {"call": 8, "create": 9}

    def serve(conn: socket.socket) -> None:
        with conn, conn.makefile("rb") as stream:
            while header := stream.read(4):
                request = unpackb(stream.read(int.from_bytes(header, "big")))
                rid, op = request[0], request[1]
                if op == "hello":
                    reply = [rid, 0, {"server": "spindle", "version": "0.1.0", "protocol": 1, "resumed": False}]
                elif op in most and len(request) <= most[op]:
                    taken.append(request)
                    reply = [rid, 0, True if op == "create" else len(taken)]
                else:
                    reply = [rid, 1, ["ProtocolError", f"'{op}' takes at most {most.get(op)} items", None]]
                conn.sendall(frame(reply))

    def accept() -> None:
        with contextlib.suppress(OSError):  # closed at the end
            while True:
                threading.Thread(target=serve, args=(listener.accept()[0],), daemon=True).start()

    threading.Thread(target=accept, daemon=True).start()
    yield "127.0.0.1:%d" % listener.getsockname()[1], taken
    listener.shutdown(socket.SHUT_RDWR)  # wakes the accepting thread, which ends
    listener.close()


def test_a_server_whose_hello_lists_no_acked_gets_calls_without_it(older_server):
    address, taken = older_server
    client = Client(address)
    try:
        assert client.create("Counter", "hits", [], owned=False, persistent=True)
        assert [client.call("Counter", "hits", "add", [1]) for _ in range(3)] == [2, 3, 4]
    finally:
        client.close()
    # The shell's client too: a create and a call, then another create and call.
    env = dict(os.environ, SPINDLE_ADDRESS=address)
    for _ in range(2):
        done = subprocess.run([server_binary(), "counter", "-n", "hits", "increment"],
                              capture_output=True, env=env, timeout=60)
        assert done.returncode == 0, done.stderr.decode()
    assert [request[1] for request in taken] == ["create"] + ["call"] * 3 + ["create", "call"] * 2


def test_a_call_started_before_a_scope_ends_in_its_own_session(server, monkeypatch):
    client = spindle.connect()
    counter = spindle.Counter()
    calls = client._state.calls
    taken, scoped = threading.Event(), threading.Event()
    start = calls.start

    def start_then_wait() -> "tuple[int, int]":
        numbers = start()
        if threading.current_thread().name == "before":
            taken.set()  # the call has its seq: now the scope begins, before it is sent
            assert scoped.wait(30)
        return numbers

    monkeypatch.setattr(calls, "start", start_then_wait)
    before = threading.Thread(target=counter.increment, name="before")
    before.start()
    assert taken.wait(30)
    with client.scope(uuid.uuid4().hex):
        scoped.set()
        before.join()
        # Had that call gone out on the scope's session, its acked (a seq of the process's
        # session) would have marked the scope's calls, numbered from 1, as stale.
        for _ in range(3):
            counter.increment()
    assert counter.get() == 4


def test_requests_before_hello_are_refused(server):
    import socket

    host, port = parse_address(server.address)
    with socket.create_connection((host, port)) as sock:
        sock.sendall(frame([3, "ping"]))
        data = b""
        while len(data) < 4 or len(data) < 4 + int.from_bytes(data[:4], "big"):
            chunk = sock.recv(65536)
            assert chunk
            data += chunk
    reply = spindle.codec.unpackb(data[4:])
    assert reply[0] == 3 and reply[1] == 1 and reply[2][0] == "NoSession"


def test_ping_and_session_resume(server):
    client = spindle.connect()
    client.ping()  # the process's session is open on the server
    conn = raw_connection(server.address, client.session)
    assert conn.hello["resumed"] is True
    assert conn.roundtrip(frame([2, "ping"]), 2) == [2, 0, "pong"]
    conn.close()
    fresh = raw_connection(server.address, uuid.uuid4().hex)
    assert fresh.hello["resumed"] is False
    fresh.close()


def test_disconnect_then_implicit_reconnect():
    counter = spindle.Counter()
    counter.add(2)
    spindle.disconnect()
    assert counter.add(3) == 5  # implicit connect; the session of unnamed objects lives on


def test_finished_threads_close_their_connections(own_server):
    counter = spindle.Counter()
    before = spindle.status()["connections"]
    assert before >= 1  # this thread's own
    seen: List[int] = []  # the connections while each thread ran

    def bump() -> None:
        counter.increment()
        seen.append(spindle.status()["connections"])

    for _ in range(200):
        t = threading.Thread(target=bump)
        t.start()
        t.join()
    assert counter.get() == 200
    # Each thread had a connection of its own while it ran; all of them are closed again.
    assert len(seen) == 200 and min(seen) >= before + 1
    assert wait_until(lambda: spindle.status()["connections"] == before)


def test_an_interrupted_wait_keeps_the_threads_locks(server):
    """A signal handler raising inside a blocking call: the call is withdrawn, not the lock."""
    lock, q = spindle.Lock(), spindle.Queue()

    class Interrupted(Exception):
        pass

    def on_alarm(signum, frame):
        raise Interrupted

    assert lock.acquire()
    previous = signal.signal(signal.SIGALRM, on_alarm)
    alarm = AlarmWhenParked(q)
    try:
        with pytest.raises(Interrupted):
            q.get()  # parks with no timeout until the alarm interrupts it
    finally:
        alarm.join()
        signal.signal(signal.SIGALRM, previous)
    assert alarm.parked
    assert lock.locked()
    assert not lock.acquire(blocking=False)  # still ours: nobody else got it
    q.put("kept")  # the withdrawn get took nothing, and the connection is in step
    assert q.get(timeout=5) == "kept"
    lock.release()
