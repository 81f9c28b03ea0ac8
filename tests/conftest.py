"""Test fixtures: a real Spindle server process for the session (never mocks).

The server runs on a free port (``--port 0``) with ``--session-ttl 1`` so that session
expiry is observable; ``SPINDLE_ADDRESS`` is exported so child processes (fork or spawn) and
subprocesses find it. Its function gateway runs workers with this interpreter and a pool of
at most ``POOL`` workers; workers find the SDK and ``tests/remote.py`` on ``PYTHONPATH``.
"""

from __future__ import annotations

import contextlib
import os
import random
import socket
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any, Iterator, List, Optional, Union

import pytest

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "python"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import spindle  # noqa: E402
from spindle.client import Connection, frame, parse_address, shard_of  # noqa: E402
from spindle.sessions import new_secret  # noqa: E402

LISTENING = "spindle listening on "
HTTP_LISTENING = "spindle http on "  # before LISTENING, with --http-port
POOL = 8  # --max-workers of the session's server


def server_binary() -> str:
    """The spindle binary under test: $SPINDLE_BIN, the venv's, or the release build."""
    candidates = [
        os.environ.get("SPINDLE_BIN"),
        str(Path(sys.prefix) / "bin" / "spindle"),
        str(REPO / "target" / "release" / "spindle"),
    ]
    for candidate in candidates:
        if candidate and os.path.isfile(candidate) and os.access(candidate, os.X_OK):
            return candidate
    pytest.fail("no spindle binary: run `cargo build --release -p spindle-cli` (or set SPINDLE_BIN)")


def pythonpath_for_tests() -> str:
    """``PYTHONPATH`` for processes running test code: the SDK and the tests directory."""
    parts = [str(REPO / "python"), str(Path(__file__).resolve().parent)]
    if os.environ.get("PYTHONPATH"):
        parts.append(os.environ["PYTHONPATH"])
    return os.pathsep.join(parts)


def gateway_args(max_workers: int = POOL) -> List[str]:
    """Server arguments for the function gateway: workers run this interpreter."""
    return ["--python", sys.executable, "--max-workers", str(max_workers)]


class ServerProcess:
    """A ``spindle server`` child process on a free port (or on ``port``, to restart a server
    where its clients reconnect); ``stderr``: where its log goes (default: inherited);
    ``binary``: another build than the one under test (an older release)."""

    def __init__(
        self, *args: str, env: Optional[dict] = None, port: int = 0, stderr: Any = None,
        prefix: List[str] = [], binary: Optional[str] = None,
    ) -> None:
        self.binary = binary or server_binary()
        if env is None:
            env = dict(os.environ)
        env["PYTHONPATH"] = pythonpath_for_tests()
        # `prefix` runs the server through another command (`ip netns exec NS`).
        self.process = subprocess.Popen(
            [*prefix, self.binary, "server", "--port", str(port), "--embedded", *args],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=stderr,
            text=True,
            env=env,
        )
        self.http_address: Optional[str] = None
        self.address = self._wait_listening()
        # Keep draining stdout so the server never blocks on a full pipe.
        threading.Thread(target=lambda: [None for _ in self.process.stdout], daemon=True).start()

    def _wait_listening(self) -> str:
        found: List[str] = []

        def read() -> None:
            for line in self.process.stdout:  # type: ignore[union-attr]
                if line.startswith(HTTP_LISTENING):
                    self.http_address = line[len(HTTP_LISTENING):].strip()
                if line.startswith(LISTENING):
                    found.append(line[len(LISTENING):].strip())
                    return

        reader = threading.Thread(target=read, daemon=True)
        reader.start()
        reader.join(30)
        if not found:
            self.stop()
            pytest.fail(f"{self.binary} did not print {LISTENING!r}")
        return found[0]

    def kill(self) -> None:
        self.process.kill()
        self.process.wait()

    def stop(self) -> None:
        if self.process.poll() is None:
            try:
                self.process.stdin.close()  # type: ignore[union-attr]
                self.process.wait(10)
            except (OSError, subprocess.TimeoutExpired):
                self.kill()


@contextlib.contextmanager
def connected_to(server: Union[ServerProcess, str]) -> Iterator[spindle.Client]:
    """This process (its proxies, and child processes through ``SPINDLE_ADDRESS``) talks to
    ``server`` (a server, or an address) for the block, then to the server it talked to
    before (the session's): for a test that needs a server of its own."""
    address = server if isinstance(server, str) else server.address
    saved = os.environ["SPINDLE_ADDRESS"]
    client = spindle.connect(address, embedded=False)
    try:
        yield client
    finally:
        spindle.connect(saved, embedded=False)


@pytest.fixture(scope="session", autouse=True)
def server() -> Iterator[ServerProcess]:
    """The session's server; the test process is connected to it."""
    proc = ServerProcess("--session-ttl", "1", *gateway_args())
    os.environ["SPINDLE_ADDRESS"] = proc.address
    os.environ["SPINDLE_BIN"] = proc.binary
    spindle.connect(proc.address)
    yield proc
    spindle.disconnect()
    proc.stop()


@pytest.fixture
def uniq() -> str:
    """A unique name prefix for named objects of one test."""
    return f"t{uuid.uuid4().hex[:12]}"


@pytest.fixture
def child_env(server: ServerProcess) -> dict:
    """Environment for subprocesses: the server address and the SDK on PYTHONPATH."""
    env = dict(os.environ)
    env["SPINDLE_ADDRESS"] = server.address
    env["PYTHONPATH"] = pythonpath_for_tests()
    return env


def wait_until(predicate, deadline: float = 30.0, interval: float = 0.01) -> bool:
    """Poll ``predicate`` until it is true; ``deadline`` (seconds) only bounds a failure."""
    end = time.monotonic() + deadline
    while time.monotonic() < end:
        if predicate():
            return True
        time.sleep(interval)
    return bool(predicate())


class ParkedProbe:
    """Whether calls are parked on an object in the server right now, asked without moving
    it (the Python side of ``ParkedProbe`` in crates/cli/tests/common/mod.rs)::

        with ParkedProbe(q) as probe:
            assert wait_until(probe.parked)

    The server refuses to move an object (``keep``) while callers are parked on it, with
    ``Busy``. The probe asks to move the object onto a name a placeholder of its own
    already holds in the object's shard: with nobody parked, the server takes the object
    out, finds the name taken (``TypeMismatch``, "'name' is already a Counter") and puts it
    back under the same hold of the shard's lock, so nothing moves and no proxy notices.
    Answers are told apart by their error kind, on a connection (and session) of the
    probe's own. A missing object has nobody parked.

    Persistent objects cannot be probed: ``keep`` refuses them (``ValueError``, "cannot be
    kept under a new name") before it looks for parked callers (``Partition::detach``), and
    the probe fails on that answer rather than guess.
    """

    def __init__(self, obj: "spindle.proxy.Proxy", address: Optional[str] = None) -> None:
        self.type_name, self.key = obj._type, obj._key
        host, port = parse_address(address or spindle.connect().address)
        self.conn = Connection(host, port, new_secret(), 1)
        self.rid = 1  # request ids (1 was the hello)
        partitions = self._request("status")["partitions"]
        prefix = f"parked-probe.{uuid.uuid4().hex[:12]}."
        shard = shard_of(self.key, partitions)
        self.taken = next(f"{prefix}{i}" for i in range(100_000)
                          if shard_of(f"{prefix}{i}", partitions) == shard)
        assert self._call("create", 0, "Counter", self.taken, [], False) == (0, True)

    def _request(self, op: str, *args: Any) -> Any:
        """An unnumbered request's result."""
        self.rid += 1
        _, status, result = self.conn.roundtrip(frame([self.rid, op, *args]), self.rid)
        assert status == 0, f"{op}: {result}"
        return result

    def _call(self, op: str, *args: Any) -> "tuple[int, Any]":
        """A call's ``(status, result)``: 0 and its value, or 1 and the error ``[kind,
        message, data]``. Its ``seq`` is 0: the server records no reply for it."""
        self.rid += 1
        _, status, result = self.conn.roundtrip(frame([self.rid, op, 0, *args]), self.rid)
        return status, result

    def parked(self) -> bool:
        status, answer = self._call("keep", self.type_name, self.key, self.taken)
        kind, message = (answer[0], answer[1]) if status == 1 else (None, None)
        if kind == "Busy" and "parked callers" in message:
            return True
        if kind == "TypeMismatch" and message.startswith(f"'{self.taken}' is already a"):
            return False
        if kind == "NotFound":
            return False
        raise AssertionError(f"probing {self.type_name} '{self.key}' for parked calls: unexpected answer {answer!r}")

    def close(self) -> None:
        try:
            self._call("delete", self.taken)
        finally:
            self.conn.close()

    def __enter__(self) -> "ParkedProbe":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def free_port() -> int:
    """A free port for a server that is never restarted (use ``stable_port`` for one that is)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def stable_port(count: int = 1) -> int:
    """The first of ``count`` free consecutive ports below the kernel's ephemeral range, so
    that no outgoing connection takes one while a server is down: a restarted server gets
    its port back, and a reconnecting client cannot hold it."""
    low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    rng = random.Random()
    for _ in range(1000):
        port = rng.randrange(max(1024, low - 12000), low - count)
        if all(port_free(port + i) for i in range(count)):
            return port
    pytest.fail(f"no {count} free consecutive ports below {low}")


def port_free(port: int) -> bool:
    """Whether a server could bind ``port`` on loopback now."""
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
            return True
        except OSError:
            return False


def listening(port: int, host: str = "127.0.0.1") -> bool:
    """Whether something accepts connections on ``port``."""
    try:
        socket.create_connection((host, port), timeout=1).close()
        return True
    except OSError:
        return False


# -- no silent skips, no silent stops -------------------------------------------------------
#
# Under CI (`CI=true`, as `.ci/run` sets), a skipped test fails the run unless it is listed
# here with the reason it may skip there, and so does a run that ended before running every
# test it collected (`pytest.exit`); every run ends with how many tests of each file passed,
# failed and skipped. A skip hides a missing feature or a missing tool as well as a pass
# would, so each entry needs a review. With `SPINDLE_TEST_RECORD=FILE` the run writes how
# many tests it collected and ran to FILE as it ends, which `tests/ran_all.py` checks: a
# run cut short by a process exit (`os._exit(0)` in a test) writes nothing.
ALLOWED_SKIPS: dict = {
    # "tests/test_file.py::test_name": "why this may skip in CI",
}

_OUTCOMES: dict = {}  # nodeid -> "passed" | "failed" | "skipped" (the worst of its phases)
_COLLECTED: List[str] = []  # the nodeids of the tests to run
_RANK = {"passed": 0, "skipped": 1, "failed": 2}


def in_ci() -> bool:
    return os.environ.get("CI", "").lower() in ("true", "1", "yes")


def _record(nodeid: str, outcome: str) -> None:
    if _RANK[outcome] >= _RANK[_OUTCOMES.get(nodeid, "passed")]:
        _OUTCOMES[nodeid] = outcome


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if report.failed or report.skipped or report.when == "call":
        _record(report.nodeid, report.outcome)


def pytest_collectreport(report: pytest.CollectReport) -> None:
    if report.skipped:  # a whole module skipped at collection
        _record(report.nodeid, "skipped")


def pytest_collection_finish(session: pytest.Session) -> None:
    _COLLECTED[:] = [item.nodeid for item in session.items]


def _unexpected_skips() -> List[str]:
    return sorted(n for n, o in _OUTCOMES.items() if o == "skipped" and n not in ALLOWED_SKIPS)


def _not_run() -> List[str]:
    return [n for n in _COLLECTED if n not in _OUTCOMES]


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    if in_ci() and (_unexpected_skips() or _not_run()) and session.exitstatus == pytest.ExitCode.OK:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
    record = os.environ.get("SPINDLE_TEST_RECORD")
    if record:
        ran = len(_COLLECTED) - len(_not_run())
        Path(record).write_text(f'{{"collected": {len(_COLLECTED)}, "ran": {ran}}}\n')


def pytest_terminal_summary(terminalreporter: Any) -> None:
    write = terminalreporter.write_line
    per_file: dict = {}
    for nodeid, outcome in _OUTCOMES.items():
        counts = per_file.setdefault(nodeid.split("::")[0], {"passed": 0, "failed": 0, "skipped": 0})
        counts[outcome] += 1
    terminalreporter.section("tests per file")
    for path in sorted(per_file):
        c = per_file[path]
        write(f"{path:45} {c['passed']:4} passed {c['failed']:4} failed {c['skipped']:4} skipped")
    not_run = _not_run()
    if not_run and in_ci():
        terminalreporter.section(f"{len(not_run)} of {len(_COLLECTED)} collected tests never ran", red=True)
        for nodeid in not_run[:20]:
            write(nodeid)
    unexpected = _unexpected_skips()
    if unexpected and in_ci():
        terminalreporter.section("skips not allowed in CI (see ALLOWED_SKIPS in tests/conftest.py)", red=True)
        for nodeid in unexpected:
            write(nodeid)
