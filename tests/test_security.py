"""Security against a real server started with ``--token``: what a client without the token
can reach (nothing), and that clients with it work as before (docs/protocol.md, Security)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import textwrap
from typing import Iterator

import msgpack
import pytest

import spindle
import remote
from conftest import ServerProcess, connected_to, gateway_args, pythonpath_for_tests, wait_until
from spindle.client import Connection, frame
from spindle.sessions import new_secret, session_id, unnamed_key

TOKEN = "s3cret-token"


@pytest.fixture(scope="module")
def guarded() -> Iterator[ServerProcess]:
    proc = ServerProcess("--token", TOKEN, *gateway_args(2))
    yield proc
    proc.stop()


def run_as(address: str, token: str | None, script: str) -> subprocess.CompletedProcess:
    """Run ``script`` in a fresh Python process connected to ``address`` with ``token``."""
    env = dict(os.environ, SPINDLE_ADDRESS=address, PYTHONPATH=pythonpath_for_tests())
    env.pop("SPINDLE_TOKEN", None)
    if token is not None:
        env["SPINDLE_TOKEN"] = token
    return subprocess.run([sys.executable, "-c", textwrap.dedent(script)], env=env, capture_output=True,
                          text=True, timeout=120)


def test_the_stored_pickle_attack_fails_at_its_first_step(guarded):
    """An attacker without the token tries to plant a pickle in a named Dict, for the next
    authorized reader (or a function) to unpickle, which would copy the reader's token: the
    server refuses the connection before any operation, so nothing is stored."""
    attack = """
        import os, spindle

        class Exploit:
            def __reduce__(self):
                return (os.system, ("echo $SPINDLE_TOKEN > /tmp/stolen",))

        try:
            spindle.connect(embedded=False)
            spindle.Dict(name="config")["plugin"] = Exploit()
            print("stored")
        except PermissionError as exc:
            print("refused", type(exc).__name__, exc)
        """
    for token in (None, "guessed"):
        out = run_as(guarded.address, token, attack)
        assert out.returncode == 0, out.stderr
        assert out.stdout.startswith("refused Unauthorized"), out.stdout + out.stderr
    # The owner finds nothing planted.
    out = run_as(guarded.address, TOKEN, """
        import spindle
        spindle.connect(embedded=False)
        print(spindle.objects("config"))
        """)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


def exchange(sock: socket.socket, request: list) -> list:
    """Send one request frame on ``sock`` and read its reply ``[id, status, result]``."""
    sock.sendall(frame(request))
    head = sock.recv(4, socket.MSG_WAITALL)
    body = sock.recv(int.from_bytes(head, "big"), socket.MSG_WAITALL)
    return msgpack.unpackb(body)


@pytest.mark.parametrize("request_", [
    ["create", 1, 0, "Dict", "config", [], False],
    ["call", 1, 0, "Dict", "config", "setitem", ["k", 1]],
    ["delete", 1, "config"],
    ["keep", 1, "Dict", "config", "other"],
    ["objects", ""],
    ["status"],
    ["invoke", "python", b"x", {}],
], ids=lambda r: r[0])
def test_without_the_token_no_operation_runs(guarded, request_):
    host, port = guarded.address.rsplit(":", 1)
    with pytest.raises(spindle.Unauthorized, match="needs credentials"):
        Connection(host, int(port), "stranger", 1)
    # A refused hello closes the connection: nothing sent behind it runs (nor can guesses be
    # pipelined on it).
    for hello in ({"client": "stranger", "protocol": 1}, {"client": "stranger", "protocol": 1, "token": "x"}):
        with socket.create_connection((host, int(port)), timeout=10) as sock:
            sock.sendall(frame([1, "hello", hello]) + frame([2, *request_]))
            head = sock.recv(4, socket.MSG_WAITALL)
            refused = msgpack.unpackb(sock.recv(int.from_bytes(head, "big"), socket.MSG_WAITALL))
            assert refused[1] != 0 and refused[2][0] == "Unauthorized", refused
            assert sock.recv(4) == b"", "the connection closes after a refused hello"
    owner = Connection(host, int(port), new_secret(), 1, TOKEN)
    try:
        assert owner.roundtrip(frame([2, "objects", ""]), 2)[2] == []
    finally:
        owner.close()


def test_clients_with_the_single_token_work_as_before(guarded):
    """Upgrading: today's single --token setup keeps working for clients that give it:
    objects, functions and user-defined objects."""
    out = run_as(guarded.address, TOKEN, """
        import spindle, remote
        spindle.connect(embedded=False)
        hits = spindle.Counter(name="hits")
        hits.add(5)
        words = spindle.Dict(name="words")
        words["a"] = 1
        with spindle.Executor(echo=False) as ex:
            squared = ex.submit(remote.square, 7).result(60)

        @spindle.shared
        class Box:
            def __init__(self, v):
                self.v = v

            def get(self):
                return self.v

        print(hits.get(), dict(words), squared, Box(3).get())
        """)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["5", "{'a':", "1}", "49", "3"]


def test_refusals_are_logged_once_a_minute_per_client(tmp_path):
    """A client hammering the server with bad credentials gets one log line, not one each."""
    log = tmp_path / "server.log"
    with open(log, "w") as stderr:
        proc = ServerProcess("--token", TOKEN, stderr=stderr)
    try:
        host, port = proc.address.rsplit(":", 1)
        for attempt in range(50):
            with pytest.raises(spindle.Unauthorized):
                Connection(host, int(port), f"guesser{attempt}", 1, token=f"guess{attempt}")
        # The server is still there for the owner, and has logged the refusals once.
        Connection(host, int(port), "owner-session-secret", 1, token=TOKEN).close()
    finally:
        proc.stop()
    refusals = [line for line in log.read_text().splitlines() if "refused:" in line]
    assert len(refusals) == 1, refusals
    assert "wrong token" in refusals[0] and "127.0.0.1" in refusals[0]


def test_a_session_is_resumed_with_its_secret_only(server):
    """Knowing a session's id (it shows in logs and errors) is not enough to act as it."""
    client = spindle.connect()
    client.ping()  # the process's session is open
    victim = session_id(client.session)
    host, port = server.address.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        reply = exchange(sock, [1, "hello", {"client": victim, "protocol": 1}])
        assert reply[1] != 0 and reply[2][0] == "Unauthorized" and "its secret only" in reply[2][1], reply
        reply = exchange(sock, [2, "hello", {"client": victim, "protocol": 1, "secret": new_secret()}])
        assert reply[1] != 0 and reply[2][0] == "ProtocolError", reply
        reply = exchange(sock, [3, "hello", {"client": victim, "protocol": 1, "secret": "short"}])
        assert reply[1] != 0 and "16 characters" in reply[2][1], reply
        # Still no session: a call as the victim does not run.
        reply = exchange(sock, [4, "call", 1, 0, "Counter", "c", "add", [1]])
        assert reply[1] != 0 and reply[2][0] == "NoSession", reply
    # Its holder resumes it.
    conn = Connection(host, int(port), client.session, 1)
    assert conn.hello["resumed"] is True
    conn.close()


def test_unnamed_keys_are_unguessable_from_the_session_id():
    """An unnamed object's key is a digest of the session's secret and its number: neither
    the session id nor another key of the session tells it."""
    client = spindle.connect()
    first, second = spindle.Counter(), spindle.Counter()
    for counter in (first, second):
        assert counter.key.startswith("~") and len(counter.key) == 33, counter.key
        assert session_id(client.session)[1:] not in counter.key
        assert client.session not in counter.key
    assert first.key != second.key
    # Only the secret's holder can compute them.
    assert {first.key, second.key} <= {unnamed_key(client.session, n) for n in range(1, 10_000)}


# -- contained functions ---------------------------------------------------------------------


def running(pid: int) -> bool:
    """Whether ``pid`` is a live process (not a zombie)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except (OSError, IndexError):
        return False


CGROUP_MODES = ("cgroup-v2", "cgroup-v1")


def cgroups_v1_writable() -> bool:
    """Whether this machine surely lets the server make cgroups: root, with writable v1
    hierarchies (CI's machines). With v2, that takes delegation, which the server checks."""
    return (os.geteuid() == 0 and os.access("/sys/fs/cgroup/memory", os.W_OK)
            and os.access("/sys/fs/cgroup/pids", os.W_OK))


def cgroup_dir(path: str) -> str:
    """The directory of a cgroup ``path`` (from /proc/PID/cgroup) in the memory hierarchy
    (v1) or the unified one (v2)."""
    v1 = "/sys/fs/cgroup/memory"
    return (v1 if os.path.isdir(v1) else "/sys/fs/cgroup") + path


def needs_cgroups() -> None:
    """Skip a test of cgroups where the server cannot make them (it must, on CI's machines)."""
    mode = spindle.status()["containment"]
    if mode not in CGROUP_MODES:
        assert not cgroups_v1_writable(), f"cgroup v1 is writable, yet the server says {mode}"
        pytest.skip("this machine gives the server no cgroups")


def test_the_server_says_how_functions_are_contained():
    mode = spindle.status()["containment"]
    assert mode in (*CGROUP_MODES, "subreaper")
    if cgroups_v1_writable():
        assert mode in CGROUP_MODES
    proc = ServerProcess("--no-cgroups", *gateway_args(1))
    try:
        with connected_to(proc):
            assert spindle.status()["containment"] == "subreaper"
    finally:
        proc.stop()


def test_a_worker_runs_in_a_cgroup_of_its_own_removed_when_it_ends():
    proc = ServerProcess("--idle-timeout", "0.2", *gateway_args(1))
    try:
        with connected_to(proc):
            needs_cgroups()
            server_pid = spindle.status()["pid"]
            with spindle.Executor(echo=False) as ex:
                cgroups = ex.submit(remote.own_cgroup).result(60)
            path = cgroups.get("memory") or cgroups[""]
            parent, name = path.rsplit("/", 1)
            assert parent.endswith(f"/spindle-{server_pid}") and name.startswith("worker-"), path
            assert os.path.isdir(cgroup_dir(path))  # the worker idles in it
            # The idle worker is stopped: its cgroup goes with it.
            assert wait_until(lambda: not os.path.exists(cgroup_dir(path))), path
            assert os.path.isdir(cgroup_dir(parent))
    finally:
        proc.stop()
    # The server's own goes when it stops.
    assert wait_until(lambda: not os.path.exists(cgroup_dir(parent))), parent


def test_a_process_a_function_double_forks_ends_with_its_call(tmp_path):
    with spindle.Executor(echo=False) as ex:
        pid = ex.submit(remote.escape, 1, 0, str(tmp_path / "pid")).result(60)
    assert wait_until(lambda: not running(pid)), f"process {pid} outlived its call"


def test_a_double_forked_process_counts_against_the_memory_limit_and_dies_with_the_worker(tmp_path):
    """1.5 GiB in a process of its own session, under a 1 GiB limit: the worker is killed for
    it, and the process goes with the worker."""
    pidfile = tmp_path / "pid"
    with spindle.Executor(memory_mb=1024, echo=False) as ex:
        future = ex.submit(remote.escape, 1536, 120, str(pidfile))
        with pytest.raises(spindle.WorkerCrashed) as info:
            future.result(120)
    assert info.value.reason == "memory limit"
    pid = int(pidfile.read_text())
    assert wait_until(lambda: not running(pid)), f"process {pid} outlived its worker"


def test_a_process_a_worker_orphaned_dies_when_the_worker_dies_by_itself(tmp_path):
    """The worker double-forks a process, then `os._exit`s: as the orphan's subreaper it
    would hand it to init on its death; its cgroup takes the orphan with it."""
    needs_cgroups()
    pidfile = tmp_path / "pid"
    with spindle.Executor(echo=False) as ex:
        with pytest.raises(spindle.WorkerCrashed):
            ex.submit(remote.escape_then_exit, str(pidfile)).result(60)
    pid = int(pidfile.read_text())
    assert wait_until(lambda: not running(pid)), f"process {pid} outlived its worker"


def test_a_fork_bomb_stops_at_the_pids_limit_and_the_server_carries_on():
    proc = ServerProcess("--pids-limit", "24", *gateway_args(1))
    try:
        with connected_to(proc):
            needs_cgroups()
            with spindle.Executor(echo=False) as ex:
                pids = ex.submit(remote.fork_until_refused, 500).result(60)
                assert pids[-1] == -1 and len(pids) <= 24, f"{len(pids) - 1} forks, none refused"
                # The call's processes end with it; the next call runs.
                assert wait_until(lambda: not any(running(pid) for pid in pids[:-1]))
                assert ex.submit(remote.own_cgroup).result(60)
            assert spindle.status()["containment"] in CGROUP_MODES
    finally:
        proc.stop()


@spindle.shared
class Escaper:
    """Double-forks processes from its object host, and ends the host."""

    def escape(self, pidfile: str) -> int:
        return remote.escape(0, 0, pidfile)

    def die(self) -> None:
        os._exit(3)


def test_a_process_an_object_host_orphaned_dies_with_the_host(tmp_path):
    """Hosts are not subreapers (objects may keep subprocesses): a double-forked process
    went to init, out of reach; the host's cgroup takes it down with the host."""
    needs_cgroups()
    escaper = Escaper()
    pid = escaper.escape(str(tmp_path / "pid"))
    assert running(pid)
    with pytest.raises(spindle.ObjectLost):
        escaper.die()
    assert wait_until(lambda: not running(pid)), f"process {pid} outlived its object host"


@spindle.shared
class Hoard:
    """Holds what it is given, in the object host."""

    def __init__(self) -> None:
        self.blocks: list = []

    def grow(self, megabytes: int) -> int:
        block = bytearray(megabytes << 20)
        for i in range(0, len(block), 4096):
            block[i] = 1
        self.blocks.append(block)
        return len(self.blocks)

    def size(self) -> int:
        return len(self.blocks)


def test_an_object_host_over_its_memory_limit_is_killed_and_says_why():
    proc = ServerProcess("--object-hosts", "1", "--host-memory-limit", "300")
    try:
        with connected_to(proc):
            hoard = Hoard()
            assert hoard.grow(100) == 1  # within the limit
            with pytest.raises(spindle.ObjectLost) as info:
                for _ in range(40):  # the limit is crossed on the way, and seen within 50 ms
                    hoard.grow(100)
            assert "memory limit (300 MiB" in info.value.reason
            # The host is replaced: new objects work.
            assert Hoard().size() == 0
    finally:
        proc.stop()


@spindle.shared
class Loud:
    def shout(self, lines: int) -> int:
        for i in range(lines):
            print(f"loud line {i} " + "x" * 90)
        return lines


def test_an_object_hosts_output_reaches_the_log_capped(tmp_path):
    """10 MB printed by a method: the server's log gets the first lines under the host's id,
    a line saying the rest of the minute's output is dropped, and not the 10 MB."""
    log = tmp_path / "server.log"
    with open(log, "w") as stderr:
        proc = ServerProcess("--object-hosts", "1", stderr=stderr)
    try:
        with connected_to(proc):
            loud = Loud()
            assert loud.shout(100_000) == 100_000
            assert wait_until(lambda: "output over" in log.read_text())
            assert loud.shout(1) == 1  # the host is unharmed
    finally:
        proc.stop()
    text = log.read_text()
    assert "loud line 0 " in text and 'stream="stdout"' in text
    assert "loud line 99999 " not in text
    assert len(text) < 1 << 20, len(text)
