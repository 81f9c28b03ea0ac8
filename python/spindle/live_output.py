"""A worker's output as it comes: what the running task writes to fds 1 and 2 goes to the
server while the task runs, as ``[task_id, 2, {"stdout"|"stderr": bytes}]`` frames on the
worker's connection (docs/protocol.md, "Workers"). The server forwards it to the caller and
to ``spindle logs -f``.

It reads the worker's capture files (worker.py ``Capture``) from where it last stopped, a
few times a second from a thread of its own, so output written by C code and subprocesses
goes too, and the task never waits on the network to print. At most ``limit`` bytes per
stream and task are sent: the files hold the rest (disk, not memory), as before.
"""

from __future__ import annotations

import os
import threading
import time
from typing import Callable, List, Optional

INTERVAL = 0.05  # seconds between two looks at the files while a task runs
CHUNK = 64 << 10  # bytes per frame


class LiveOutput:
    """Sends the running task's new output with ``send(task_id, stream_name, bytes)``."""

    def __init__(self, files: List[int], limit: int, send: Callable[[int, str, bytes], None]) -> None:
        self._files = files
        self._limit = limit
        self._send = send
        self._lock = threading.Lock()  # one reader of the files at a time
        self._task: Optional[int] = None
        self._sent = [0, 0]
        self._running = threading.Event()
        thread = threading.Thread(target=self._loop, name="spindle-output", daemon=True)
        thread.start()

    def start(self, task_id: int) -> None:
        """A task starts: the capture files are empty."""
        with self._lock:
            self._task = task_id
            self._sent = [0, 0]
        self._running.set()

    def finish(self) -> None:
        """The task ended: send what is left (within the limit), and stop until the next."""
        self._running.clear()
        with self._lock:
            if self._task is not None:
                self._pump()
            self._task = None

    def _loop(self) -> None:
        while True:
            self._running.wait()
            time.sleep(INTERVAL)  # gather a little output per frame
            with self._lock:
                if self._task is None:
                    continue
                try:
                    self._pump()
                except OSError:  # the connection is gone: the worker ends on its own
                    self._task = None

    def _pump(self) -> None:
        task = self._task
        assert task is not None
        for i, (fd, name) in enumerate(zip(self._files, ("stdout", "stderr"))):
            end = min(os.fstat(fd).st_size, self._limit)
            while self._sent[i] < end:
                data = os.pread(fd, min(CHUNK, end - self._sent[i]), self._sent[i])
                if not data:
                    break
                self._sent[i] += len(data)
                self._send(task, name, data)
