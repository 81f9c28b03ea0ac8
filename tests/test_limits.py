"""Bounds on what clients may hold: connections, time, frames, unread replies and recorded
replies; each attack keeps the server's memory under a stated bound while another client is
served. Real server processes and raw sockets (docs/limits.md)."""

from __future__ import annotations

import os
import socket
import subprocess
import threading
import time
from typing import Iterator, List

import cloudpickle
import msgpack
import pytest

import spindle
from conftest import ServerProcess, connected_to, server_binary, wait_until
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


MiB = 1 << 20


def greeted(server: ServerProcess, receive_buffer: int = 0) -> Connection:
    """A connection that said hello; ``receive_buffer``: a small kernel buffer (set before
    connecting), so that replies it does not read pile up in the server rather than here."""
    host, port = server.address.rsplit(":", 1)
    conn = Connection(host, int(port), new_secret(), 1, timeout=60)
    if receive_buffer:
        conn.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, receive_buffer)
    return conn


def create(conn: Connection, type_name: str, key: str, *args) -> None:
    reply = conn.roundtrip(frame([2, "create", 0, 0, type_name, key, list(args), False]), 2)
    assert reply[1] == 0, reply


def call(id: int, type_name: str, key: str, method: str, *args, seq: int = 0) -> bytes:
    return frame([id, "call", seq, 0, type_name, key, method, list(args)])


def rss(server: ServerProcess) -> int:
    """The server's resident memory in bytes."""
    with open(f"/proc/{server.process.pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


class Bystander:
    """Another client calling all along: it must keep being served."""

    def __init__(self, server: ServerProcess) -> None:
        self.conn = greeted(server)
        create(self.conn, "Counter", "bystander")
        self.calls = 0
        self.stopped = threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)
        self.thread.start()

    def run(self) -> None:
        while not self.stopped.is_set():
            assert self.conn.roundtrip(call(7, "Counter", "bystander", "increment"), 7)[1] == 0
            self.calls += 1

    def served(self, more: int = 20) -> bool:
        """Whether it makes ``more`` calls from now."""
        start = self.calls
        return wait_until(lambda: self.calls >= start + more, 30)

    def stop(self) -> None:
        self.stopped.set()
        self.thread.join(30)
        self.conn.close()


@pytest.fixture
def bounded() -> Iterator[List]:
    """Servers started by the test (with its limits), stopped after it."""
    started: List = []
    yield started
    for item in started:
        item.stop()


def start(bounded: List, *args: str, prefix: List[str] = []) -> ServerProcess:
    server = ServerProcess(*args, stderr=subprocess.PIPE, prefix=prefix)
    # Drain the log, keeping it for the test to read.
    server.log = []
    threading.Thread(target=lambda: server.log.extend(server.process.stderr), daemon=True).start()
    bounded.append(server)
    return server


def logged(server: ServerProcess, text: str) -> int:
    return sum(text in line for line in list(server.log))


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
    for args in (["--hello-timeout", "0"], ["--hello-timeout=-1"], ["--max-connections", "0"],
                 ["--frame-timeout", "0"], ["--client-timeout=-1"], ["--max-frame-values", "0"],
                 ["--max-calls-in-flight", "0"], ["--max-call-output", "ten"],
                 ["--output-hard-limit", "10", "--output-limit", "20"]):
        out = subprocess.run([server_binary(), "server", "--port", "0", *args], capture_output=True, text=True,
                             timeout=30, stdin=subprocess.DEVNULL)
        assert out.returncode == 2 and args[0].split("=")[0] in out.stderr, (args, out.stderr)


def test_a_client_that_does_not_read_is_not_served_more_until_it_does(bounded):
    """Pipelined reads of a 4 MiB blob from a client that never reads: the server stops
    running its requests once its unread replies pass --output-limit (before running them,
    not after), and runs the rest when it reads."""
    server = start(bounded, "--output-limit", str(16 * MiB))
    owner = greeted(server)
    create(owner, "Blob", "big", b"x" * (4 * MiB))
    idle = rss(server)
    bystander = Bystander(server)
    reader = greeted(server, receive_buffer=64 * 1024)
    try:
        count = 400  # 1.6 GiB of replies, if they all ran
        reader.sock.sendall(b"".join(call(100 + i, "Blob", "big", "get") for i in range(count)))
        time.sleep(1)
        assert bystander.served()
        held = rss(server) - idle
        assert held < 16 * MiB + 100 * MiB, f"the server grew by {held / MiB:.0f} MiB"
        # Reading, the client gets every reply, in order.
        for i in range(count):
            reply = reader.roundtrip(b"", 100 + i)
            assert reply[1] == 0 and len(reply[2]) == 4 * MiB
    finally:
        bystander.stop()
        reader.close()
        owner.close()


def test_a_client_whose_unread_replies_pass_the_hard_limit_is_closed(bounded):
    """Replies another client's calls produce (parked gets woken by puts) cannot wait: past
    --output-hard-limit the client that does not read is closed, with the reason logged."""
    server = start(bounded, "--output-limit", str(4 * MiB), "--output-hard-limit", str(32 * MiB))
    producer = greeted(server)
    create(producer, "Queue", "q")
    idle = rss(server)
    sleeper = greeted(server, receive_buffer=64 * 1024)
    try:
        sleeper.sock.sendall(b"".join(call(100 + i, "Queue", "q", "get") for i in range(200)))
        item = b"y" * MiB
        for i in range(200):
            reply = producer.roundtrip(call(10, "Queue", "q", "put", item), 10)
            assert reply[1] == 0, reply
        assert wait_until(lambda: logged(server, "--output-hard-limit") > 0, 30), "".join(server.log)
        # The items put after the sleeper was closed wait in the queue.
        queued = producer.roundtrip(call(12, "Queue", "q", "qsize"), 12)[2]
        assert 0 < queued < 200
        held = rss(server) - idle
        assert held < 32 * MiB + queued * MiB + 100 * MiB, f"the server grew by {held / MiB:.0f} MiB"
        # The closed client's socket ends (after what was sent before).
        sleeper.sock.settimeout(30)
        with pytest.raises(OSError):
            while sleeper.sock.recv(1 << 20):
                pass
            raise ConnectionResetError("closed")
        assert producer.roundtrip(frame([11, "ping"]), 11)[2] == "pong"
        # A client's own reply waits for it whatever its size: one over the hard limit too.
        create(producer, "Blob", "huge", b"h" * (40 * MiB))
        slow = greeted(server, receive_buffer=64 * 1024)
        reply = slow.roundtrip(call(13, "Blob", "huge", "get"), 13)
        assert reply[1] == 0 and len(reply[2]) == 40 * MiB
        slow.close()
    finally:
        sleeper.close()
        producer.close()


def test_a_session_that_never_acknowledges_keeps_a_bounded_reply_log(bounded):
    """Small calls returning 1 MiB each, from a session that sends no `acked`: the replies
    recorded for its retries stay under --max-reply-log (the oldest are forgotten, and a
    retry of one is refused)."""
    server = start(bounded, "--max-reply-log", str(16 * MiB), "--partitions", "1")
    conn = greeted(server)
    create(conn, "Dict", "d")
    idle = rss(server)
    conn.roundtrip(call(1, "Dict", "d", "setdefault", "k", b"z" * MiB), 1)
    for seq in range(1, 601):  # small calls answered with 1 MiB each: 600 MiB recorded, unbounded
        reply = conn.roundtrip(call(seq, "Dict", "d", "setdefault", "k", None, seq=seq), seq)
        assert reply[1] == 0 and len(reply[2]) == MiB
    held = rss(server) - idle
    assert held < 16 * MiB + 100 * MiB, f"the server grew by {held / MiB:.0f} MiB"
    # The newest replies are still kept for a retry: seq 600 answers from the log.
    reply = conn.roundtrip(call(9, "Dict", "d", "pop", "k", seq=600), 9)
    assert reply[1] == 0 and len(reply[2]) == MiB
    assert conn.roundtrip(call(10, "Dict", "d", "len"), 10)[2] == 1, "the pop did not run"
    # An old one was forgotten: its retry is refused, never run a second time.
    reply = conn.roundtrip(call(11, "Dict", "d", "pop", "k", seq=1), 11)
    assert reply[1] == 1 and reply[2][0] == "ProtocolError" and "reply was forgotten" in reply[2][1], reply
    assert conn.roundtrip(call(12, "Dict", "d", "len"), 12)[2] == 1, "the pop did not run"
    conn.close()


def test_a_connection_parks_a_bounded_number_of_calls(bounded):
    """A get parked on an empty queue costs the server about 100 bytes and its client 40:
    past --max-calls-in-flight a connection's new calls are refused until one is answered."""
    server = start(bounded, "--max-calls-in-flight", "1000")
    conn = greeted(server)
    create(conn, "Queue", "q")
    conn.sock.sendall(b"".join(call(100 + i, "Queue", "q", "get") for i in range(1000)))
    reply = conn.roundtrip(call(5, "Queue", "q", "qsize"), 5)
    assert reply[2][0] == "Busy" and "--max-calls-in-flight" in reply[2][1], reply
    assert conn.roundtrip(frame([6, "ping"]), 6)[2] == "pong", "requests that cannot wait still run"
    # So does a withdraw, which makes room for one more call.
    assert conn.roundtrip(frame([7, "withdraw", 101, "q"]), 7)[2] is True
    assert conn.roundtrip(call(8, "Queue", "q", "qsize"), 8)[2] == 0
    conn.sock.sendall(call(9, "Queue", "q", "get"))  # the one more call, parked
    assert conn.roundtrip(call(10, "Queue", "q", "qsize"), 10)[2][0] == "Busy"
    # A parked call answered by another client makes room too.
    other = greeted(server)
    assert other.roundtrip(call(11, "Queue", "q", "put", "x"), 11)[1] == 0
    assert conn.roundtrip(b"", 100)[2] == "x"
    assert conn.roundtrip(call(12, "Queue", "q", "qsize"), 12)[2] == 0
    other.close()
    conn.close()


def test_sessions_opened_one_after_another_keep_bounded_reply_logs_together(bounded):
    """Session after session, each filling its reply log and going away (its log kept for
    --session-ttl): all the logs together stay under --max-reply-logs-total."""
    server = start(bounded, "--max-reply-log", str(8 * MiB), "--max-reply-logs-total", str(32 * MiB),
                   "--partitions", "1", "--session-ttl", "600")
    owner = greeted(server)
    create(owner, "Dict", "d")
    owner.roundtrip(call(1, "Dict", "d", "setdefault", "k", b"z" * MiB), 1)
    idle = rss(server)
    for _ in range(40):  # 320 MiB recorded, unbounded
        conn = greeted(server)
        for seq in range(1, 9):
            reply = conn.roundtrip(call(seq, "Dict", "d", "setdefault", "k", None, seq=seq), seq)
            assert reply[1] == 0 and len(reply[2]) == MiB
        conn.close()
    held = rss(server) - idle
    assert held < 32 * MiB + 100 * MiB, f"the server grew by {held / MiB:.0f} MiB"
    # A session's newest reply is still kept for a retry.
    last = greeted(server)
    assert last.roundtrip(call(1, "Dict", "d", "setdefault", "k", None, seq=1), 1)[1] == 0
    reply = last.roundtrip(call(2, "Dict", "d", "pop", "k", seq=1), 2)
    assert reply[1] == 0 and len(reply[2]) == MiB
    assert last.roundtrip(call(3, "Dict", "d", "len"), 3)[2] == 1, "the pop did not run"
    last.close()
    owner.close()


def test_large_frames_in_progress_share_a_budget_and_a_deadline(bounded):
    """Clients holding large partial frames: past --max-partial-frames the next one is
    refused at once; a frame that does not arrive within --frame-timeout (per MiB) closes
    its connection."""
    server = start(bounded, "--max-partial-frames", str(100 * MiB), "--frame-timeout", "1")
    idle = rss(server)
    bystander = Bystander(server)
    holders = [greeted(server) for _ in range(3)]
    try:
        # Two frames of 40 MiB each start (the first 8 MiB of each), then a third.
        for conn in holders:
            body = msgpack.packb([50, "call", 0, 0, "Blob", "b", "set", [b"q" * (40 * MiB)]])
            conn.sock.sendall(len(body).to_bytes(4, "big") + body[: 8 * MiB])
        refused = holders[2].roundtrip(b"", 0)
        assert refused[2][0] == "Busy" and "--max-partial-frames" in refused[2][1], refused
        assert bystander.served()
        held = rss(server) - idle
        assert held < 100 * MiB + 100 * MiB, f"the server grew by {held / MiB:.0f} MiB"
        # Their deadline is 1 s + 1 s per MiB: 41 s. A small frame's is about a second.
        late = greeted(server)
        body = msgpack.packb([51, "call", 0, 0, "Blob", "b", "set", [b"q" * 1000]])
        late.sock.sendall(len(body).to_bytes(4, "big") + body[:100])
        reply = late.roundtrip(b"", 0)
        assert reply[2][0] == "ProtocolError" and "--frame-timeout" in reply[2][1], reply
        late.close()
    finally:
        bystander.stop()
        for conn in holders:
            conn.close()


def test_a_frame_of_tiny_values_is_refused_before_it_is_decoded(bounded):
    """A 48 MiB frame of nils decodes to 1.5 GiB; past --max-frame-values it is refused
    without decoding, and the connection goes on."""
    server = start(bounded)
    conn = greeted(server)
    idle = rss(server)
    count = 48 * MiB
    nils = b"\xdd" + count.to_bytes(4, "big") + b"\xc0" * count
    # [12, "call", 0, 0, "List", "l", "extend", [nils]]
    head = b"".join(msgpack.packb(item) for item in [12, "call", 0, 0, "List", "l", "extend"])
    body = b"\x98" + head + b"\x91" + nils
    reply = conn.roundtrip(len(body).to_bytes(4, "big") + body, 12)
    assert reply[2][0] == "ProtocolError" and "--max-frame-values" in reply[2][1], reply
    held = rss(server) - idle
    assert held < 48 * MiB + 150 * MiB, f"the server grew by {held / MiB:.0f} MiB"
    assert conn.roundtrip(frame([13, "ping"]), 13)[2] == "pong"
    conn.close()


def test_a_tuple_of_tiny_values_is_counted_too(bounded):
    """A tuple (ext type 3) is decoded by the server (its pickles stamped, its items hashed as
    a key): its items count against --max-frame-values like an array's."""
    server = start(bounded, "--max-frame-values", str(MiB))
    conn = greeted(server)
    count = 4 * MiB
    nils = b"\xdd" + count.to_bytes(4, "big") + b"\xc0" * count
    tuple_of_nils = b"\xc9" + len(nils).to_bytes(4, "big") + b"\x03" + nils
    # [14, "call", 0, 0, "List", "l", "append", [tuple_of_nils]]
    head = b"".join(msgpack.packb(item) for item in [14, "call", 0, 0, "List", "l", "append"])
    body = b"\x98" + head + b"\x91" + tuple_of_nils
    reply = conn.roundtrip(len(body).to_bytes(4, "big") + body, 14)
    assert reply[2][0] == "ProtocolError" and "--max-frame-values" in reply[2][1], reply
    assert conn.roundtrip(frame([15, "ping"]), 15)[2] == "pong"
    conn.close()


@spindle.shared
class Numbers:
    def __init__(self) -> None:
        self.items: List[int] = []

    def extend(self, n: int) -> int:
        self.items.extend(range(n))
        return len(self.items)

    def all(self) -> List[int]:
        return self.items


def test_a_method_result_of_too_many_values_fails_that_call_alone(bounded):
    server = start(bounded, "--max-frame-values", "5000")
    with connected_to(server):
        numbers = Numbers()
        assert numbers.extend(4000) == 4000
        assert len(numbers.all()) == 4000
        numbers.extend(2000)
        with pytest.raises(ValueError, match="--max-frame-values"):
            numbers.all()
        # The host and its object live on.
        assert numbers.extend(1) == 6001


def test_an_idle_client_is_closed_and_one_waiting_for_a_reply_is_not(bounded):
    server = start(bounded, "--client-timeout", "1")
    idle = greeted(server)
    waiting = greeted(server)
    holder = greeted(server)
    try:
        create(holder, "Queue", "wq")
        # A get parked on an empty queue is a call in flight, however long it waits.
        waiting.sock.sendall(call(30, "Queue", "wq", "get"))
        reply = idle.roundtrip(b"", 0)
        assert reply[2][0] == "Timeout" and "--client-timeout" in reply[2][1], reply
        time.sleep(2)
        putter = greeted(server)
        assert putter.roundtrip(call(31, "Queue", "wq", "put", "late"), 31)[1] == 0
        assert waiting.roundtrip(b"", 30)[2] == "late"
        putter.close()
    finally:
        for conn in (idle, waiting, holder):
            conn.close()


def test_the_sdk_reconnects_when_its_idle_connection_was_closed(bounded):
    server = start(bounded, "--client-timeout", "0.5")
    with connected_to(server):
        counter = spindle.Counter(name="idle-sdk")
        counter.increment()
        time.sleep(1.5)
        assert counter.increment() == 2


def test_a_flood_of_bad_frames_is_logged_in_a_few_lines(bounded):
    server = start(bounded)
    conn = greeted(server)
    bad = frame([5, "no-such-op"])
    conn.sock.sendall(bad * 20000)
    for _ in range(20000):
        assert conn.roundtrip(b"", 5)[2][0] == "ProtocolError"
    assert conn.roundtrip(frame([6, "ping"]), 6)[2] == "pong"
    lines = logged(server, "no-such-op")
    assert 1 <= lines <= 2, f"{lines} lines logged"
    conn.close()


def test_a_flood_of_bad_calls_and_of_calls_over_max_memory_is_logged_in_a_few_lines(bounded):
    """Each error is a line in the log (tests/test_server_log.py), but a client making bad
    calls, or writes refused past --max-memory, as fast as it can is summarized."""
    server = start(bounded, "--max-memory", "1000")
    conn = greeted(server)

    def flood(request: bytes, kind: str) -> None:
        conn.sock.sendall(request * 20000)
        for _ in range(20000):
            assert conn.roundtrip(b"", 5)[2][0] == kind

    create(conn, "Counter", "n")
    flood(call(5, "Counter", "n", "add", "five"), "BadArguments")
    create(conn, "Blob", "b", b"x" * 2000)  # over the limit from now on
    flood(call(5, "Blob", "b", "append", b"y"), "OutOfMemory")
    assert conn.roundtrip(frame([6, "ping"]), 6)[2] == "pong"
    bad, refused = logged(server, "must be an integer"), logged(server, "over --max-memory")
    assert 1 <= bad <= 2 and 1 <= refused <= 2, f"{bad} and {refused} lines logged"
    conn.close()


def test_a_flood_of_failed_calls_answered_later_is_logged_in_a_few_lines(bounded):
    """Errors answered to a client after its call left its connection (a woken waiter's, an
    object host's or a function's result) are summarized as its own are; what was held back
    is said when the server stops."""
    server = start(bounded, "--max-frame-values", "5000")
    with connected_to(server):
        numbers = Numbers()
        numbers.extend(6000)
        for _ in range(200):
            with pytest.raises(ValueError, match="--max-frame-values"):
                numbers.all()
    server.stop()
    assert wait_until(lambda: logged(server, "suppressed 199 similar lines of ValueError errors"), 10), \
        "".join(server.log)
    lines = logged(server, "--max-frame-values")
    assert 1 <= lines <= 2, f"{lines} lines logged"


def test_a_server_out_of_descriptors_logs_its_failed_accepts_in_a_few_lines(bounded):
    """Clients holding every descriptor the server may open make each accept fail, retried
    every 50 ms: logged once, with the count of the others when the server stops."""
    server = start(bounded, "--max-connections", "1000", prefix=["prlimit", "--nofile=96", "--"])
    held = [open_raw(server.address) for _ in range(150)]
    try:
        time.sleep(1)
    finally:
        for sock in held:
            sock.close()
    server.stop()
    assert wait_until(lambda: logged(server, "similar lines of failed accepts"), 10), "".join(server.log)
    lines = logged(server, "accept failed")
    assert 1 <= lines <= 2, f"{lines} lines logged"


def test_past_max_memory_writes_are_refused_and_reads_and_deletes_still_run(bounded):
    server = start(bounded, "--max-memory", str(4 * MiB))
    with connected_to(server):
        words, blob, items = spindle.Dict(name="words"), spindle.Blob(name="blob"), spindle.List(name="items")
        words["big"] = "x" * (3 * MiB)
        blob.set(b"y" * (2 * MiB))  # under the limit when sent: may pass it by its own size
        status = spindle.status()
        assert status["max_memory"] == 4 * MiB and status["memory_used"] > 5 * MiB, status
        with pytest.raises(spindle.OutOfMemory, match="over --max-memory 4194304"):
            words["small"] = 1
        with pytest.raises(MemoryError):
            blob.set(b"z")
        with pytest.raises(spindle.OutOfMemory):
            items.append(1)
        with pytest.raises(spindle.OutOfMemory):
            spindle.Dict(name="new")
        # Nothing changed; reads, pops and deletes run.
        assert "small" not in words and len(blob.get()) == 2 * MiB and len(items) == 0
        assert words.pop("big") == "x" * (3 * MiB)
        assert spindle.delete(blob)
        assert spindle.status()["memory_used"] < 4 * MiB
        words["small"] = 1
        items.append(1)
        assert dict(words) == {"small": 1} and list(items) == [1]


def test_max_memory_holds_across_partitions(bounded):
    server = start(bounded, "--max-memory", str(8 * MiB), "--partitions", "4")
    with connected_to(server):
        blobs = [spindle.Blob(name=f"b{i}") for i in range(40)]
        written = 0
        with pytest.raises(spindle.OutOfMemory):
            for b in blobs:
                b.set(b"v" * MiB)
                written += 1
        assert 8 <= written <= 9, written
        used = spindle.status()["memory_used"]
        assert 8 * MiB < used < 10 * MiB, used
        # Every partition refuses, whichever holds the bytes.
        refused = 0
        for b in blobs:
            try:
                b.set(b"w")
            except spindle.OutOfMemory:
                refused += 1
        assert refused >= len(blobs) - written


def test_max_memory_counts_what_each_object_costs_beyond_its_bytes(bounded):
    """A million tiny objects take about 160 MB, though their keys and values hold 8: under a
    --max-memory of 8 MiB the creates are refused long before."""
    server = start(bounded, "--max-memory", str(8 * MiB))
    conn = greeted(server)
    idle = rss(server)
    made = 0
    for batch in range(100):
        conn.sock.sendall(b"".join(frame([20, "create", 0, 0, "Counter", f"c{batch}.{i}", [], False])
                                   for i in range(10000)))
        replies = [conn.roundtrip(b"", 20) for _ in range(10000)]
        made += sum(reply[1] == 0 for reply in replies)
        if made < len(replies) * (batch + 1):
            assert all(reply[1] == 0 or reply[2][0] == "OutOfMemory" for reply in replies)
            break
    assert made < 100_000, f"{made} objects made"
    held = rss(server) - idle
    assert held < 8 * MiB + 50 * MiB, f"the server grew by {held / MiB:.0f} MiB"
    conn.close()


def test_a_tiny_create_cannot_make_a_huge_array(bounded):
    """A 40-byte create of an Array of 2^26 float64 took 512 MiB past a --max-memory of 8 MiB
    (and as much again for each `get`): an Array holds 64 MiB at most, what a frame can set."""
    server = start(bounded, "--max-memory", str(8 * MiB))
    conn = greeted(server)
    reply = conn.roundtrip(frame([2, "create", 0, 0, "Array", "a", [1 << 26], False]), 2)
    assert reply[1] == 1 and reply[2][0] == "ValueError" and "too big" in reply[2][1], reply
    assert conn.roundtrip(frame([3, "status"]), 3)[2]["memory_used"] < MiB
    create(conn, "Array", "small", 1000)
    conn.close()


def test_the_items_of_parked_puts_count_against_max_memory(bounded):
    """Puts parked on a full queue hold their items: 200 of 1 MiB held 240 MiB under a
    --max-memory of 8 MiB, counted as nothing. Counted, later puts are refused, and the
    items go from the count with the calls (here, with their connection)."""
    server = start(bounded, "--max-memory", str(8 * MiB))
    owner = greeted(server)
    create(owner, "Queue", "q", 1)
    assert owner.roundtrip(call(3, "Queue", "q", "put", "first"), 3)[1] == 0
    putter = greeted(server)
    putter.sock.sendall(b"".join(call(100 + i, "Queue", "q", "put", b"p" * MiB) for i in range(40))
                        + frame([7, "ping"]))
    refused = 0
    while (reply := read_frame(putter.sock))[0] != 7:
        assert reply[2][0] == "OutOfMemory", reply
        refused += 1
    assert refused >= 30, f"{40 - refused} puts parked"

    def used() -> int:
        return owner.roundtrip(frame([4, "status"]), 4)[2]["memory_used"]
    assert used() > 8 * MiB
    putter.close()
    assert wait_until(lambda: used() < MiB, 10), used()
    owner.close()


def test_the_server_stays_within_max_memory_while_a_client_keeps_writing(bounded):
    server = start(bounded, "--max-memory", str(64 * MiB), "--partitions", "2")
    conn = greeted(server)
    idle = rss(server)
    create(conn, "Dict", "d")
    refused = 0
    for i in range(1, 301):  # 300 MiB offered
        reply = conn.roundtrip(call(i, "Dict", "d", "setitem", i, b"m" * MiB), i)
        if reply[1] == 1:
            assert reply[2][0] == "OutOfMemory", reply
            refused += 1
    assert refused > 200
    held = rss(server)
    assert held < idle * 2 + 64 * MiB + 100 * MiB, f"the server holds {held / MiB:.0f} MiB"
    conn.close()


def test_memory_used_is_recovered_with_persistent_objects(bounded, tmp_path):
    server = start(bounded, "--data-dir", str(tmp_path), "--max-memory", str(64 * MiB))
    with connected_to(server):
        d = spindle.Dict(name="kept", persistent=True)
        for i in range(50):
            d[i] = "p" * 10_000
        spindle.List(name="kept-list", persistent=True).extend(list(range(1000)))
        before = spindle.status()["memory_used"]
    assert before > 500_000
    server.stop()
    again = start(bounded, "--data-dir", str(tmp_path), "--max-memory", str(64 * MiB))
    with connected_to(again):
        after = spindle.status()
        assert after["memory_used"] == before and after["max_memory"] == 64 * MiB
        assert len(spindle.Dict(name="kept", persistent=True)) == 50


def wait_for_gate() -> bool:
    """A function that holds its worker until the test opens the gate."""
    return spindle.Event(name="gate").wait(60)


def size_of(data: bytes) -> int:
    return len(data)


def test_queued_invocations_count_against_max_memory(bounded):
    """Invocations queued behind a busy pool hold their payloads in the server: 20 of 1 MiB
    under a --max-memory of 8 MiB. Counted with the objects, the ones past the limit are
    refused; the count goes down as queued ones are cancelled or run."""
    server = start(bounded, "--max-memory", str(8 * MiB), "--max-workers", "1")
    with connected_to(server):
        gate = spindle.Event(name="gate")
        conn = greeted(server)

        def used() -> int:
            return conn.roundtrip(frame([4, "status"]), 4)[2]["memory_used"]

        def replies(ids: set) -> dict:
            got = {}
            while not ids <= got.keys():
                reply = read_frame(conn.sock)
                got[reply[0]] = reply
            return got
        before = used()
        conn.sock.sendall(frame([100, "invoke", "python", cloudpickle.dumps((wait_for_gate, (), {})), {}]))
        big = cloudpickle.dumps((size_of, (b"p" * MiB,), {}))
        conn.sock.sendall(b"".join(frame([200 + i, "invoke", "python", big, {}]) for i in range(20))
                          + frame([7, "ping"]))
        refused = []
        while (reply := read_frame(conn.sock))[0] != 7:
            assert reply[1] == 1 and reply[2][0] == "OutOfMemory", reply
            assert "--max-memory" in reply[2][1], reply
            refused.append(reply[0])
        assert 10 <= len(refused) <= 13, f"{20 - len(refused)} invocations queued"
        assert used() > 8 * MiB
        # While they wait, objects may not grow either: one account.
        with pytest.raises(spindle.OutOfMemory):
            gate.set()
        # Cancelled, four make room.
        queued = sorted(set(range(200, 220)) - set(refused))
        conn.sock.sendall(b"".join(frame([300 + i, "cancel", queued[i]]) for i in range(4)))
        got = replies({300, 301, 302, 303, *queued[:4]})
        assert all(got[queued[i]][2][0] == "Cancelled" for i in range(4)), got
        assert used() < 8 * MiB
        gate.set()
        got = replies({100, *queued[4:]})
        assert all(reply[1] == 0 and reply[2]["ok"] for reply in got.values()), got
        assert wait_until(lambda: used() == before, 10), (used(), before)
        conn.close()


def chatter(lines: int) -> int:
    for i in range(lines):
        print(f"line {i:06d}")
    return lines


def test_a_call_printing_past_max_call_output_keeps_its_first_part(bounded):
    """240 kB printed under a --max-call-output of 10 kB: the first 10 kB are kept, then
    the cut is said once, in the report and in the output sent as it comes."""
    server = start(bounded, "--max-call-output", "10000")
    marker = b"\n[output truncated at 10000 bytes]\n"
    conn = greeted(server)
    payload = cloudpickle.dumps((chatter, (20000,), {}))
    report = conn.roundtrip(frame([10, "invoke", "python", payload, {}]), 10)[2]
    assert report["ok"], report
    stdout = report["stdout"]
    assert stdout.startswith(b"line 000000\n") and stdout.endswith(marker), stdout[-100:]
    assert len(stdout) == 10000 + len(marker) and stdout.count(b"truncated") == 1
    assert report["truncated"] == 20000 * 12 - 10000
    # Sent as it comes: the same first part, and the cut said once.
    conn.sock.sendall(frame([11, "invoke", "python", payload, {"live": True}]))
    live = b""
    while (reply := read_frame(conn.sock))[1] == 2:
        live += reply[2].get("stdout", b"")
    assert reply[1] == 0 and reply[2]["ok"], reply
    assert live == stdout, live[-100:]
    conn.close()
