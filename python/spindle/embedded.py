"""An embedded Spindle server: a child process that lives as long as this program.

``spindle.connect()`` starts one, on a free loopback port, when no server is named
(``address``, ``$SPINDLE_ADDRESS``): the program's own, found by its children and cloud
functions through ``$SPINDLE_ADDRESS`` and by no other program. The server runs with
``--embedded``, so it exits by itself when its stdin pipe closes — at our exit, or if this
process dies without cleaning up.
"""

from __future__ import annotations

import atexit
import collections
import os
import shutil
import subprocess
import sys
import threading
from pathlib import Path
from typing import Deque, Dict, List, Optional

from .errors import ServerUnavailable

LISTENING = "spindle listening on "
START_TIMEOUT = 30.0


def find_binary() -> str:
    """The ``spindle`` binary: $SPINDLE_BIN, <sys.prefix>/bin, PATH, then the repo's build."""
    env = os.environ.get("SPINDLE_BIN")
    if env:
        return env
    candidate = Path(sys.prefix) / "bin" / "spindle"
    if candidate.is_file() and os.access(candidate, os.X_OK):
        return str(candidate)
    found = shutil.which("spindle")
    if found:
        return found
    repo = Path(__file__).resolve().parents[2]
    candidate = repo / "target" / "release" / "spindle"
    if candidate.is_file():
        return str(candidate)
    raise ServerUnavailable(
        "no spindle server binary found: set SPINDLE_BIN, install it on PATH, "
        "or build it with `cargo build --release -p spindle-cli`"
    )


def worker_environment() -> Dict[str, str]:
    """This environment, with ``PYTHONPATH`` led by this program's own import directories
    (those of ``sys.path`` outside the Python installation), for the gateway's workers."""
    env = dict(os.environ)
    installed = {os.path.realpath(p) for p in (sys.prefix, sys.base_prefix, sys.exec_prefix)}
    own: List[str] = []
    for entry in sys.path:
        path = os.path.realpath(entry or os.getcwd())
        if not os.path.isdir(path) or any(path == p or path.startswith(p + os.sep) for p in installed):
            continue
        if path not in own:
            own.append(path)
    extra = env.get("PYTHONPATH", "")
    env["PYTHONPATH"] = os.pathsep.join(own + ([extra] if extra else []))
    return env


class EmbeddedServer:
    """A ``spindle server --embedded`` child process."""

    def __init__(self, host: str, port: int, extra_args: Optional[List[str]] = None) -> None:
        self.binary = find_binary()
        cmd = [self.binary, "server", "--port", str(port), "--embedded"]
        if host not in ("127.0.0.1", "localhost"):
            cmd += ["--host", host]
        # The gateway's workers run this interpreter, and find the modules this program
        # imports from its own directories (functions pickled by reference need them).
        cmd += ["--python", sys.executable]
        cmd += list(extra_args or [])
        self.owner_pid = os.getpid()
        self._stderr: Deque[str] = collections.deque(maxlen=50)
        self.process = subprocess.Popen(
            cmd,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=worker_environment(),
            start_new_session=True,  # Ctrl-C in the terminal reaches us, not the server
        )
        self.address = self._wait_listening()
        threading.Thread(target=self._drain, args=(self.process.stdout, None), daemon=True).start()
        atexit.register(self.stop)

    def _wait_listening(self) -> str:
        found: List[str] = []
        ready = threading.Event()
        stdout = self.process.stdout
        assert stdout is not None and self.process.stderr is not None
        threading.Thread(target=self._drain, args=(self.process.stderr, self._stderr), daemon=True).start()

        def read() -> None:
            for line in stdout:
                if line.startswith(LISTENING):
                    found.append(line[len(LISTENING):].strip())
                    break
            ready.set()

        reader = threading.Thread(target=read, daemon=True)
        reader.start()
        ready.wait(START_TIMEOUT)
        if not found:
            self.stop()
            raise ServerUnavailable(
                f"the embedded spindle server ({self.binary}) did not start: "
                + (" | ".join(self._stderr) or "no output")
            )
        return found[0]

    @staticmethod
    def _drain(stream, keep: Optional[Deque[str]]) -> None:
        try:
            for line in stream:
                if keep is not None:
                    keep.append(line.rstrip())
        except (OSError, ValueError):
            pass

    def forget_in_child(self) -> None:
        """In a forked child: close our copy of the stdin pipe, never stop the server."""
        try:
            if self.process.stdin is not None:
                self.process.stdin.close()  # our copy of the fd only; the parent keeps its own
        except (OSError, ValueError):
            pass

    def stop(self) -> None:
        """Stop the server (only from the process that started it)."""
        if os.getpid() != self.owner_pid or self.process.poll() is not None:
            return
        try:
            if self.process.stdin is not None:
                self.process.stdin.close()
            self.process.wait(5)
        except (OSError, subprocess.TimeoutExpired):
            self.process.kill()
            self.process.wait()
