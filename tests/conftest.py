"""Test fixtures: a real Spindle server process for the session (never mocks).

The server runs on a free port (``--port 0``) with ``--session-ttl 1`` so that session
expiry is observable; ``SPINDLE_ADDRESS`` is exported so child processes (fork or spawn) and
subprocesses find it. Its function gateway runs workers with this interpreter and a pool of
at most ``POOL`` workers; workers find the SDK and ``tests/remote.py`` on ``PYTHONPATH``.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any, Iterator, List, Optional

import pytest

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "python"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import spindle  # noqa: E402

LISTENING = "spindle listening on "
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


_GATEWAY: List[bool] = []


def has_gateway() -> bool:
    """Whether the binary under test runs functions (its server takes ``--max-workers``)."""
    if not _GATEWAY:
        out = subprocess.run([server_binary(), "server", "--help"], capture_output=True, text=True)
        _GATEWAY.append("--max-workers" in out.stdout)
    return _GATEWAY[0]


def gateway_args(max_workers: int = POOL) -> List[str]:
    """Server arguments for the function gateway (none if the binary has no gateway yet)."""
    if not has_gateway():
        return []
    return ["--python", sys.executable, "--max-workers", str(max_workers)]


class ServerProcess:
    """A ``spindle server`` child process on a free port (or on ``port``, to restart a server
    where its clients reconnect); ``stderr``: where its log goes (default: inherited)."""

    def __init__(
        self, *args: str, env: Optional[dict] = None, port: int = 0, stderr: Any = None,
        prefix: List[str] = [],
    ) -> None:
        self.binary = server_binary()
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
        self.address = self._wait_listening()
        # Keep draining stdout so the server never blocks on a full pipe.
        threading.Thread(target=lambda: [None for _ in self.process.stdout], daemon=True).start()

    def _wait_listening(self) -> str:
        found: List[str] = []

        def read() -> None:
            for line in self.process.stdout:  # type: ignore[union-attr]
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


def has_parked_callers(obj: "spindle.proxy.Proxy") -> bool:
    """Whether calls are parked on ``obj`` in the server right now.

    The server refuses to move an object (``keep`` with a new name answers ``Busy``) while
    callers are parked on it, which makes a move an exact probe. When nobody is parked the
    object does move, to a fresh name: every proxy follows it (the old key answers
    ``Moved``), and it now outlives its session, so delete it when done.
    """
    try:
        spindle.keep(obj, f"probe.{uuid.uuid4().hex}")
    except spindle.SpindleError as exc:
        if "parked" in str(exc):
            return True
        raise
    return False


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def listening(port: int, host: str = "127.0.0.1") -> bool:
    """Whether something accepts connections on ``port``."""
    import socket

    try:
        socket.create_connection((host, port), timeout=1).close()
        return True
    except OSError:
        return False


# A client process for crash tests: increments persistent counters and merges into a
# persistent Dict until told to stop, recording every acknowledged result. The server (or a
# cluster's leaders) dies under it again and again; the SDK resends each call, with the same
# seq, until a server answers. Arguments: address (a list for a cluster), the objects' name
# prefix, this client's number, the stop file, the output file.
EXACTLY_ONCE_LOAD = r"""
import json, os, sys
import spindle, spindle.client
spindle.client.RETRIES = 9  # reconnect for up to ~25 s: a restart takes milliseconds
address, prefix, me, stop, out = sys.argv[1:]
spindle.connect(address, embedded=False)
shared = spindle.Counter(name=prefix + ".shared", persistent=True)
mine = spindle.Counter(name=prefix + ".c" + me, persistent=True)
merges = spindle.Dict(name=prefix + ".dict", persistent=True)
seen, adds, merged = [], 0, 0
while not os.path.exists(stop):
    seen.append(shared.add(1))
    adds = mine.add(1)
    merged = merges.merge("k" + me, 1, "sum")
with open(out, "w") as f:
    json.dump({"seen": seen, "adds": adds, "merged": merged}, f)
"""
