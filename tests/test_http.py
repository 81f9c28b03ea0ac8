"""The HTTP front end (``spindle server --http-port``, docs/http.md) against real server
processes over real sockets: every route, every error status, exactly-once with
``Idempotency-Key``, the limits, hostile clients, and objects shared with the Python SDK."""

from __future__ import annotations

import base64
import http.client
import json
import os
import selectors
import socket
import subprocess
import threading
import time
import uuid
from typing import Any, Dict, Iterator, List, Optional, Tuple

import pytest

import spindle
from conftest import ServerProcess, connected_to, gateway_args, server_binary

TOKEN = "the-http-servers-token"


@pytest.fixture(scope="module")
def web() -> Iterator[ServerProcess]:
    """A server with HTTP on a free port, and no credentials."""
    proc = ServerProcess("--http-port", "0", *gateway_args(2))
    assert proc.http_address, "no 'spindle http on' line"
    yield proc
    proc.stop()


@pytest.fixture(scope="module")
def guarded() -> Iterator[ServerProcess]:
    """A server with a token (so HTTP needs credentials), and a user who may only read."""
    proc = ServerProcess("--http-port", "0", "--token", TOKEN, *gateway_args(1))
    env = dict(os.environ, SPINDLE_ADDRESS=proc.address, SPINDLE_TOKEN=TOKEN)
    env.pop("SPINDLE_USER", None)
    run = lambda *args: subprocess.run([server_binary(), *args], env=env, capture_output=True,  # noqa: E731
                                       text=True, timeout=60)
    out = run("role", "add", "shop-reader", "read:shop/")
    assert out.returncode == 0, out.stderr
    out = run("user", "add", "reader", "--role", "shop-reader")
    assert out.returncode == 0, out.stderr
    proc.reader_token = out.stdout.strip()  # type: ignore[attr-defined]
    # May write the functions' names, but run no code.
    assert run("role", "add", "fn-writer", "read,write,create:functions/").returncode == 0
    out = run("user", "add", "writer", "--role", "fn-writer")
    assert out.returncode == 0, out.stderr
    proc.writer_token = out.stdout.strip()  # type: ignore[attr-defined]
    yield proc
    proc.stop()


def host_port(address: str) -> Tuple[str, int]:
    host, port = address.rsplit(":", 1)
    return host, int(port)


class Http:
    """One keep-alive HTTP connection; ``ask`` returns ``(status, headers, JSON body)``."""

    def __init__(self, address: str, headers: Optional[Dict[str, str]] = None) -> None:
        self.conn = http.client.HTTPConnection(*host_port(address), timeout=30)
        self.headers = headers or {}

    def ask(self, method: str, path: str, body: Any = None, headers: Optional[Dict[str, str]] = None,
            raw: Optional[bytes] = None) -> Tuple[int, Dict[str, str], Any]:
        data = raw if raw is not None else (None if body is None else json.dumps(body).encode())
        all_headers = {**self.headers, **(headers or {})}
        if data is not None:
            all_headers.setdefault("Content-Type", "application/json")
        self.conn.request(method, path, body=data, headers=all_headers)
        response = self.conn.getresponse()
        text = response.read()
        return response.status, {k.lower(): v for k, v in response.getheaders()}, json.loads(text) if text else None

    def close(self) -> None:
        self.conn.close()


@pytest.fixture
def api(web) -> Iterator[Http]:
    client = Http(web.http_address)
    yield client
    client.close()


@pytest.fixture
def name() -> str:
    return f"h{uuid.uuid4().hex[:12]}"


def error_type(body: Any) -> str:
    return body["error"]["type"]


def test_openapi_document_describes_every_route(api):
    status, headers, doc = api.ask("GET", "/v1/openapi.json")
    assert status == 200 and headers["content-type"].startswith("application/json")
    assert doc["openapi"].startswith("3.")
    assert set(doc["paths"]) == {"/v1/objects", "/v1/objects/{name}", "/v1/objects/{name}/{method}",
                                 "/v1/functions/{name}", "/v1/openapi.json"}


def test_create_call_list_and_delete(api, name):
    assert api.ask("PUT", f"/v1/objects/{name}", {"type": "Counter", "args": [10]})[::2] == (201, {"result": True})
    # Again with the same type: it existed.
    assert api.ask("PUT", f"/v1/objects/{name}", {"type": "Counter"})[::2] == (200, {"result": False})
    assert api.ask("POST", f"/v1/objects/{name}/add", {"args": [5]})[::2] == (200, {"result": 15})
    # Its type may be given; a call without a body takes no arguments.
    assert api.ask("POST", f"/v1/objects/{name}/increment", {"type": "Counter"})[2] == {"result": 16}
    assert api.ask("POST", f"/v1/objects/{name}/get")[2] == {"result": 16}
    api.ask("PUT", f"/v1/objects/{name}.d", {"type": "Dict", "args": [{"a": 1}]})
    status, _, listed = api.ask("GET", f"/v1/objects?prefix={name}")
    assert status == 200
    assert [(o["name"], o["type"]) for o in listed["objects"]] == [(name, "Counter"), (f"{name}.d", "Dict")]
    assert all(isinstance(o["size"], int) for o in listed["objects"])
    assert api.ask("DELETE", f"/v1/objects/{name}")[::2] == (200, {"result": True})
    status, _, body = api.ask("DELETE", f"/v1/objects/{name}")
    assert status == 404 and error_type(body) == "NotFound"
    status, _, body = api.ask("POST", f"/v1/objects/{name}/get")
    assert status == 404 and name in body["error"]["message"]


def test_values_map_to_json_with_documented_wrappers(web, api, name):
    api.ask("PUT", f"/v1/objects/{name}", {"type": "Blob"})
    payload = bytes(range(256))
    wrapped = {"$bytes": base64.b64encode(payload).decode()}
    assert api.ask("POST", f"/v1/objects/{name}/set", {"args": [wrapped]})[0] == 200
    assert api.ask("POST", f"/v1/objects/{name}/get")[2] == {"result": wrapped}
    with connected_to(web):
        assert spindle.Blob(name=name).get() == payload
    # Keys that are not strings, and floats JSON cannot write.
    api.ask("PUT", f"/v1/objects/{name}.v", {"type": "Value"})
    value = {"$map": [[1, "one"], [2.5, [None, True, {"x": {"$float": "nan"}}]]]}
    api.ask("POST", f"/v1/objects/{name}.v/set", {"args": [value]})
    assert api.ask("POST", f"/v1/objects/{name}.v/get")[2] == {"result": value}
    # A JSON object keeps its order, as a Dict does.
    api.ask("PUT", f"/v1/objects/{name}.d", {"type": "Dict", "args": [{"b": 1, "a": 2, "c": 3}]})
    assert api.ask("POST", f"/v1/objects/{name}.d/keys")[2] == {"result": ["b", "a", "c"]}
    status, _, body = api.ask("POST", f"/v1/objects/{name}.v/set", {"args": [{"$bytes": "%%%"}]})
    assert status == 400 and error_type(body) == "BadArguments"


def test_objects_are_shared_with_the_python_sdk(web, api, name):
    api.ask("PUT", f"/v1/objects/{name}", {"type": "Counter", "args": [7]})
    with connected_to(web):
        counter = spindle.Counter(name=name)
        assert counter.get() == 7
        counter.add(3)
        words = spindle.Dict(name=f"{name}.words")
        words["spindle"] = [1, 2]
    assert api.ask("POST", f"/v1/objects/{name}/get")[2] == {"result": 10}
    assert api.ask("POST", f"/v1/objects/{name}.words/getitem", {"args": ["spindle"]})[2] == {"result": [1, 2]}


def test_a_compiled_method_that_calls_another_object_over_http(web, api, name):
    """A compiled method's nested calls run as on the native protocol: in one transaction
    whose reply is recorded for an idempotent retry."""
    from conftest import REPO

    with connected_to(web):
        Account = spindle.wasm_type(REPO / "examples" / "wasm" / "build" / "bank.wasm", f"{name}bank")
        Account(100, name=f"{name}.a")
        Account(0, name=f"{name}.b")
    transfer = {"args": [f"{name}.b", 30]}
    first = api.ask("POST", f"/v1/objects/{name}.a/transfer", transfer, headers={"Idempotency-Key": "t1"})
    again = api.ask("POST", f"/v1/objects/{name}.a/transfer", transfer, headers={"Idempotency-Key": "t1"})
    assert first[::2] == again[::2] == (200, {"result": 70})
    assert api.ask("POST", f"/v1/objects/{name}.b/balance")[2] == {"result": 30}
    status, _, body = api.ask("POST", f"/v1/objects/{name}.a/transfer", {"args": [f"{name}.b", 1000]})
    assert status == 422 and "insufficient funds" in body["error"]["message"]
    assert api.ask("POST", f"/v1/objects/{name}.b/balance")[2] == {"result": 30}, "the deposit was undone"


def test_every_error_status(api, name):
    api.ask("PUT", f"/v1/objects/{name}", {"type": "Counter"})
    cases = [
        # (method, path, body or raw bytes, status, error type)
        ("PUT", f"/v1/objects/{name}", {"type": "Dict"}, 409, "TypeMismatch"),
        ("POST", f"/v1/objects/{name}/get", {"type": "Dict"}, 409, "TypeMismatch"),
        ("POST", f"/v1/objects/{name}.missing/get", {}, 404, "NotFound"),
        ("POST", f"/v1/objects/{name}/fly", {}, 404, "UnknownMethod"),
        ("GET", "/v1/nothing/here", None, 404, "NotFound"),
        ("POST", f"/v1/objects/{name}/add", {"args": ["x"]}, 400, "BadArguments"),
        ("POST", f"/v1/objects/{name}/add", b'{"args": [1', 400, "BadArguments"),
        ("POST", f"/v1/objects/{name}/add", b"\xff\xfe", 400, "BadArguments"),
        ("POST", f"/v1/objects/{name}/add", {"args": {"delta": 1}}, 400, "BadArguments"),
        ("POST", f"/v1/objects/{name}/add", [1], 400, "BadArguments"),
        ("POST", f"/v1/objects/{name}/add", {"args": [1], "typo": 2}, 400, "BadArguments"),
        ("POST", f"/v1/objects/{name}/add", {"args": [1], "kwargs": {"delta": 1}}, 400, "BadArguments"),
        ("PUT", f"/v1/objects/{name}.x", {"type": 5}, 400, "BadArguments"),
        ("PUT", f"/v1/objects/{name}.x", {"args": []}, 400, "BadArguments"),
        ("PUT", f"/v1/objects/{name}.x", {"type": "Counter", "persistent": "yes"}, 400, "BadArguments"),
        ("PUT", f"/v1/objects/{name}.x", {"type": "NoSuchType"}, 400, "UnknownType"),
        ("POST", f"/v1/functions/{name}", {}, 404, "NotFound"),
    ]
    for method, path, body, status, kind in cases:
        raw = body if isinstance(body, bytes) else None
        got, _, reply = api.ask(method, path, None if raw else body, raw=raw)
        assert (got, error_type(reply)) == (status, kind), (method, path, body, reply)
        assert reply["error"]["message"]
    # An overflow is the caller's mistake too.
    api.ask("POST", f"/v1/objects/{name}/set", {"args": [2**63 - 1]})
    status, _, body = api.ask("POST", f"/v1/objects/{name}/add", {"args": [1]})
    assert status == 400 and error_type(body) == "OverflowError"
    status, _, _ = api.ask("DELETE", "/v1/objects")
    assert status == 405


def test_a_retry_with_the_same_idempotency_key_applies_once(web, api, name):
    api.ask("PUT", f"/v1/objects/{name}", {"type": "Counter"})
    first = api.ask("POST", f"/v1/objects/{name}/add", {"args": [5]}, headers={"Idempotency-Key": "k1"})
    again = api.ask("POST", f"/v1/objects/{name}/add", {"args": [5]}, headers={"Idempotency-Key": "k1"})
    assert first[::2] == again[::2] == (200, {"result": 5})
    # A retry on another connection is the same call too.
    other = Http(web.http_address)
    assert other.ask("POST", f"/v1/objects/{name}/add", {"args": [5]}, headers={"Idempotency-Key": "k1"})[2] == {"result": 5}
    other.close()
    assert api.ask("POST", f"/v1/objects/{name}/add", {"args": [5]}, headers={"Idempotency-Key": "k2"})[2] == {"result": 10}
    # Without a key, each request runs.
    api.ask("POST", f"/v1/objects/{name}/add", {"args": [1]})
    api.ask("POST", f"/v1/objects/{name}/add", {"args": [1]})
    assert api.ask("POST", f"/v1/objects/{name}/get")[2] == {"result": 12}
    # Keys are bounded, as the memory that remembers them.
    status, _, body = api.ask("POST", f"/v1/objects/{name}/add", {"args": [1]}, headers={"Idempotency-Key": "k" * 256})
    assert status == 400 and "Idempotency-Key" in body["error"]["message"]
    # A recorded error is replayed as well.
    api.ask("PUT", f"/v1/objects/{name}.q", {"type": "Queue"})
    for _ in range(2):
        status, _, body = api.ask("POST", f"/v1/objects/{name}.q/get", {"args": [False]},
                                  headers={"Idempotency-Key": "k3"})
        assert status == 422 and error_type(body) == "Empty"


def test_a_blocking_call_parks_until_answered(web, api, name):
    api.ask("PUT", f"/v1/objects/{name}", {"type": "Queue"})
    answers: List[Any] = []
    waiter = threading.Thread(target=lambda: answers.append(
        Http(web.http_address).ask("POST", f"/v1/objects/{name}/get", {"args": [True, 20]})))
    started = time.monotonic()
    waiter.start()
    time.sleep(0.3)
    assert not answers, "get answered before anything was put"
    with connected_to(web):
        spindle.Queue(name=name).put("job")
    waiter.join(30)
    assert answers and answers[0][::2] == (200, {"result": "job"})
    assert time.monotonic() - started < 10
    # A get with a timeout and nothing to get.
    status, _, body = api.ask("POST", f"/v1/objects/{name}/get", {"args": [True, 0.2]})
    assert status == 422 and error_type(body) == "Empty"


def test_a_request_past_its_time_is_answered_408_and_its_call_withdrawn(api, name):
    api.ask("PUT", f"/v1/objects/{name}", {"type": "Queue"})
    started = time.monotonic()
    status, _, body = api.ask("POST", f"/v1/objects/{name}/get", {}, headers={"Spindle-Timeout": "0.3"})
    assert status == 408 and error_type(body) == "Timeout"
    assert time.monotonic() - started < 5
    # The withdrawn get does not take the next item.
    api.ask("POST", f"/v1/objects/{name}/put", {"args": ["x"]})
    assert api.ask("POST", f"/v1/objects/{name}/qsize")[2] == {"result": 1}


def test_credentials_are_required_when_the_server_has_a_token(guarded, name):
    anonymous = Http(guarded.http_address)
    status, headers, body = anonymous.ask("GET", "/v1/objects")
    assert status == 401 and error_type(body) == "Unauthorized" and "Bearer" in headers["www-authenticate"]
    for wrong in ("Bearer nope", "Basic " + base64.b64encode(b"reader:nope").decode(), "Token x", "Basic !!"):
        assert anonymous.ask("GET", "/v1/objects", headers={"Authorization": wrong})[0] == 401, wrong
    admin = Http(guarded.http_address, {"Authorization": f"Bearer {TOKEN}"})
    assert admin.ask("PUT", f"/v1/objects/shop%2F{name}", {"type": "Counter", "args": [3]})[0] == 201
    assert admin.ask("PUT", f"/v1/objects/{name}", {"type": "Counter"})[0] == 201
    basic = base64.b64encode(f"reader:{guarded.reader_token}".encode()).decode()
    reader = Http(guarded.http_address, {"Authorization": f"Basic {basic}"})
    assert reader.ask("POST", f"/v1/objects/shop%2F{name}/get")[2] == {"result": 3}
    status, _, body = reader.ask("POST", f"/v1/objects/shop%2F{name}/add", {"args": [1]})
    assert status == 403 and error_type(body) == "PermissionDenied"
    status, _, body = reader.ask("POST", f"/v1/objects/{name}/get")
    assert status == 403 and error_type(body) == "PermissionDenied"
    # A reader lists what it may read only.
    listed = reader.ask("GET", "/v1/objects")[2]["objects"]
    assert [o["name"] for o in listed] == [f"shop/{name}"]
    for c in (anonymous, admin, reader):
        c.close()


def test_a_body_over_10_mib_is_refused_and_the_server_goes_on(web, api, name):
    api.ask("PUT", f"/v1/objects/{name}", {"type": "Blob"})
    big = b'{"args": [{"$bytes": "' + b"A" * (10 << 20) + b'"}]}'
    status, body = post_unread(web.http_address, f"/v1/objects/{name}/set", big)
    assert status == 413 and error_type(body) == "FrameTooLarge", body
    host, port = host_port(web.http_address)
    # The same, sent in chunks without a length.
    with socket.create_connection((host, port)) as s:
        s.sendall(f"POST /v1/objects/{name}/set HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n".encode())
        chunk = b"B" * (1 << 20)
        try:
            for _ in range(12):
                s.sendall(b"%x\r\n" % len(chunk) + chunk + b"\r\n")
        except OSError:
            pass  # the server may stop reading once it has answered
        assert b" 413 " in s.recv(4096).split(b"\r\n")[0] + b" "
    fresh = Http(web.http_address)
    assert fresh.ask("POST", f"/v1/objects/{name}/len")[2] == {"result": 0}
    fresh.close()


def post_unread(address: str, path: str, body: bytes) -> Tuple[int, Any]:
    """POST ``body`` on a connection of its own, for an answer that comes before the server
    reads it (then the server closes, and the rest of the body may not go out)."""
    with socket.create_connection(host_port(address)) as s:
        s.sendall(f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Length: {len(body)}\r\n\r\n".encode())
        try:
            s.sendall(body)
        except OSError:
            pass
        answer = b""
        while True:
            head, sep, rest = answer.partition(b"\r\n\r\n")
            length = next((int(line.split(b":")[1]) for line in head.split(b"\r\n")
                           if line.lower().startswith(b"content-length:")), None) if sep else None
            if length is not None and len(rest) >= length:
                return int(head.split(b" ")[1]), json.loads(rest[:length])
            chunk = s.recv(65536)
            assert chunk, f"the server closed without an answer: {answer!r}"
            answer += chunk


def test_hostile_clients_get_clear_errors_and_cannot_hang_the_server(web, name):
    host, port = host_port(web.http_address)
    # A body shorter than announced, then the client goes away.
    with socket.create_connection((host, port)) as s:
        s.sendall(b"POST /v1/objects/x/add HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{\"args\"")
    # A name of 200 KB: the request line is over the header limit.
    with socket.create_connection((host, port)) as s:
        s.sendall(b"POST /v1/objects/" + b"n" * 200_000 + b"/get HTTP/1.1\r\nHost: x\r\n\r\n")
        s.settimeout(10)
        try:
            head = s.recv(4096)
        except ConnectionResetError:
            head = b""
        assert head == b"" or head.split(b" ")[1] in (b"414", b"431", b"400")
    # Garbage instead of HTTP.
    with socket.create_connection((host, port)) as s:
        s.sendall(b"\x00\x01\x02 not http at all\r\n\r\n")
        s.settimeout(10)
        head = s.recv(4096)
        assert head == b"" or head.startswith(b"HTTP/1.1 400")
    # A client that sends many requests and never reads its answers.
    quiet = socket.create_connection((host, port))
    quiet.setblocking(False)
    request = b"GET /v1/openapi.json HTTP/1.1\r\nHost: x\r\n\r\n"
    sent = 0
    try:
        for _ in range(20_000):
            sent += quiet.send(request)
    except BlockingIOError:
        pass  # the server stopped reading: it does not buffer answers without end
    # Meanwhile everyone else is served.
    api = Http(web.http_address)
    assert api.ask("PUT", f"/v1/objects/{name}", {"type": "Counter"})[0] == 201
    assert api.ask("POST", f"/v1/objects/{name}/add", {"args": [2]})[2] == {"result": 2}
    api.close()
    quiet.close()
    assert sent > 0


def test_1000_concurrent_keep_alive_connections_are_served(web, name):
    Http(web.http_address).ask("PUT", f"/v1/objects/{name}", {"type": "Counter"})
    host, port = host_port(web.http_address)
    body = b'{"args": [1]}'
    request = (f"POST /v1/objects/{name}/add HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
               f"Content-Length: {len(body)}\r\n\r\n").encode() + body
    sockets = [socket.create_connection((host, port)) for _ in range(1000)]
    try:
        for round_ in range(2):  # twice on each connection: they are kept alive
            for s in sockets:
                s.sendall(request)
            answered = read_answers(sockets)
            assert answered == len(sockets), f"round {round_}: {answered} of {len(sockets)} answered"
    finally:
        for s in sockets:
            s.close()
    assert Http(web.http_address).ask("POST", f"/v1/objects/{name}/get")[2] == {"result": 2000}


def read_answers(sockets: List[socket.socket], deadline: float = 60) -> int:
    """Read one 200 answer from each socket; how many came."""
    selector = selectors.DefaultSelector()
    buffers: Dict[socket.socket, bytes] = {}
    for s in sockets:
        s.setblocking(False)
        selector.register(s, selectors.EVENT_READ)
        buffers[s] = b""
    done = 0
    end = time.monotonic() + deadline
    while done < len(sockets) and time.monotonic() < end:
        for key, _ in selector.select(timeout=1):
            s = key.fileobj
            chunk = s.recv(65536)  # type: ignore[union-attr]
            buffers[s] += chunk  # type: ignore[index]
            head, sep, rest = buffers[s].partition(b"\r\n\r\n")  # type: ignore[index]
            if not sep:
                continue
            length = int(next(line.split(b":")[1] for line in head.split(b"\r\n")
                              if line.lower().startswith(b"content-length")))
            if len(rest) >= length:
                assert head.startswith(b"HTTP/1.1 200"), head
                selector.unregister(s)
                done += 1
    selector.close()
    for s in sockets:
        s.setblocking(True)
    return done


def test_connections_past_the_limit_are_told_503(name):
    proc = ServerProcess("--http-port", "0", "--max-connections", "2")
    try:
        held = [Http(proc.http_address) for _ in range(2)]
        for c in held:
            assert c.ask("GET", "/v1/objects")[0] == 200
        status, headers, body = Http(proc.http_address).ask("GET", "/v1/objects")
        assert status == 503 and error_type(body) == "Busy" and headers["retry-after"] == "1"
        held[0].close()
        time.sleep(0.2)
        assert Http(proc.http_address).ask("GET", "/v1/objects")[0] == 200
    finally:
        proc.stop()


def test_a_node_that_does_not_lead_the_shard_answers_503_naming_the_leader(tmp_path):
    from spindle.client import shard_of
    from test_cluster import SHARDS, Cluster

    cluster = Cluster(tmp_path, extra=("--http-port", "0"))
    try:
        shard, leader = next(iter(cluster.leaders().items()))
        key = next(f"k{i}" for i in range(1000) if shard_of(f"k{i}", SHARDS) == shard)
        leader_node = next(n for n in cluster.nodes if n.node_id == leader)
        follower = next(n for n in cluster.nodes if n.node_id != leader)
        at_follower = Http(follower.server.http_address)
        status, headers, body = at_follower.ask("PUT", f"/v1/objects/{key}", {"type": "Counter"})
        assert status == 503 and error_type(body) == "NotLeader", body
        assert headers["spindle-leader"] == body["error"]["data"] == leader_node.address
        at_leader = Http(leader_node.server.http_address)
        assert at_leader.ask("PUT", f"/v1/objects/{key}", {"type": "Counter"})[0] == 201
        assert at_leader.ask("POST", f"/v1/objects/{key}/add", {"args": [2]})[2] == {"result": 2}
        status, headers, _ = at_follower.ask("POST", f"/v1/objects/{key}/add", {"args": [2]})
        assert status == 503 and headers["spindle-leader"] == leader_node.address
    finally:
        cluster.stop()


def test_a_registered_function_is_invoked_with_json_arguments(web, api):
    import remote

    with connected_to(web):
        assert spindle.register_function(remote.square) == "square"
        spindle.register_function(remote.identity, "echo")
        spindle.register_function(remote.fail, "fail")
        spindle.register_function(remote.chatter)
    no_output = {"stdout": "", "stderr": ""}
    assert api.ask("POST", "/v1/functions/square", {"args": [7]})[::2] == (200, {"result": 49, "output": no_output})
    value = {"nested": [1, "two", None, {"$bytes": "AAE="}]}
    assert api.ask("POST", "/v1/functions/echo", {"kwargs": {"x": value}})[2] == {"result": value,
                                                                                "output": no_output}
    status, _, body = api.ask("POST", "/v1/functions/fail", {"args": ["on purpose"]})
    assert status == 422 and error_type(body) == "Raised" and "on purpose" in body["error"]["message"]
    assert body["error"]["data"]["output"] == no_output
    # What a function prints comes with its result (its subprocesses' output too).
    status, _, body = api.ask("POST", "/v1/functions/chatter", {"args": [3]})
    assert status == 200 and body["result"] == 3, body
    assert body["output"]["stderr"] == "oops 3\n"
    assert body["output"]["stdout"].splitlines() == ["hello 3", "from-a-subprocess-3", "raw-fd-write-3"]
    status, _, body = api.ask("POST", "/v1/functions/square", {"args": "7"})
    assert status == 400 and error_type(body) == "BadArguments"


def test_functions_run_only_with_invoke_rights_and_code_of_trusted_writers(guarded):
    import pickle

    import remote

    admin = Http(guarded.http_address, {"Authorization": f"Bearer {TOKEN}"})
    basic = lambda user, token: {"Authorization": "Basic " + base64.b64encode(f"{user}:{token}".encode()).decode()}  # noqa: E731
    writer = Http(guarded.http_address, basic("writer", guarded.writer_token))
    reader = Http(guarded.http_address, basic("reader", guarded.reader_token))
    code = {"$ext": [1, base64.b64encode(pickle.dumps(remote.square)).decode()]}
    # Stored by a user who may run no code: its pickle never runs.
    assert writer.ask("PUT", "/v1/objects/functions%2Fplanted", {"type": "Value", "args": [code]})[0] == 201
    status, _, body = admin.ask("POST", "/v1/functions/planted", {"args": [3]})
    assert status == 403 and error_type(body) == "PermissionDenied" and "writer" in body["error"]["message"]
    # Stored by the admin: it runs, for those who may invoke.
    assert admin.ask("PUT", "/v1/objects/functions%2Fsquare", {"type": "Value", "args": [code]})[0] == 201
    assert admin.ask("POST", "/v1/functions/square", {"args": [3]})[2]["result"] == 9
    status, _, body = reader.ask("POST", "/v1/functions/square", {"args": [3]})
    assert status == 403 and error_type(body) == "PermissionDenied"
    for c in (admin, writer, reader):
        c.close()


def test_slow_bodies_hold_no_more_than_the_servers_budget(name):
    """A client that sends a large body slowly holds its size against --max-partial-frames,
    with the native protocol's large frames: past the budget others are told 503, not queued
    in memory, and the budget comes back when the slow client goes."""
    proc = ServerProcess("--http-port", "0", "--max-partial-frames", "1000000")
    try:
        api = Http(proc.http_address)
        api.ask("PUT", f"/v1/objects/{name}", {"type": "Blob"})
        host, port = host_port(proc.http_address)
        body = json.dumps({"args": [{"$bytes": base64.b64encode(b"x" * 500_000).decode()}]}).encode()
        slow = socket.create_connection((host, port))
        slow.sendall(f"POST /v1/objects/{name}/set HTTP/1.1\r\nHost: x\r\nContent-Length: {len(body)}\r\n\r\n".encode()
                     + body[:100])
        time.sleep(0.3)
        status, reply = post_unread(proc.http_address, f"/v1/objects/{name}/set", body)
        assert status == 503 and error_type(reply) == "Busy" and "--max-partial-frames" in reply["error"]["message"]
        # Small bodies are not held up.
        assert api.ask("POST", f"/v1/objects/{name}/len")[2] == {"result": 0}
        slow.close()
        time.sleep(0.3)
        assert api.ask("POST", f"/v1/objects/{name}/set", raw=body)[0] == 200
        assert api.ask("POST", f"/v1/objects/{name}/len")[2] == {"result": 500_000}
        api.close()
    finally:
        proc.stop()
