"""A worker's output as it comes: what the running task writes to fds 1 and 2 goes to the
server while the task runs, as ``[task_id, 2, {"stdout"|"stderr": bytes}]`` frames on the
worker's connection (docs/protocol.md, "Workers"). The server forwards it to the caller and
to ``spindle logs -f``.

It reads the worker's capture files (worker.py ``Capture``) from where it last stopped, a
few times a second from a thread of its own, so output written by C code and subprocesses
goes too, and the task never waits on the network to print. At most ``limit`` bytes per
stream and task are sent: the files hold the rest (disk, not memory), as before.

The files themselves hold at most ``cap`` bytes per stream and task on disk (the server's
``--max-call-output``, 0 for none): past it, each look frees the disk blocks of what came
since, keeping one byte more to show that there was more, and the output sent says
``[output truncated at N bytes]`` after its first ``cap`` bytes. The blocks are freed by
punching a hole, so the file's size still counts every byte written and the report's
``truncated`` is exact; where a file system cannot punch holes the file is cut instead, and
what a writer appends while it is cut goes uncounted.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import threading
import time
from typing import Callable, List, Optional

INTERVAL = 0.05  # seconds between two looks at the files while a task runs
CHUNK = 64 << 10  # bytes per frame


_FALLOC_FL_KEEP_SIZE = 0x01
_FALLOC_FL_PUNCH_HOLE = 0x02
_libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
_fallocate = getattr(_libc, "fallocate", None)
if _fallocate is not None:
    _fallocate.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int64, ctypes.c_int64]


def punch_hole(fd: int, offset: int, length: int) -> bool:
    """Free the disk blocks of ``length`` bytes at ``offset``, keeping the file's size.
    False where the file system (or the platform) cannot."""
    if _fallocate is None:
        return False
    return _fallocate(fd, _FALLOC_FL_PUNCH_HOLE | _FALLOC_FL_KEEP_SIZE, offset, length) == 0


def truncation_marker(cap: int) -> bytes:
    """What follows the first ``cap`` bytes of a stream cut there."""
    return f"\n[output truncated at {cap} bytes]\n".encode()


class LiveOutput:
    """Sends the running task's new output with ``send(task_id, stream_name, bytes)``, and
    keeps its files within ``cap`` bytes each."""

    def __init__(self, files: List[int], limit: int, send: Callable[[int, str, bytes], None],
                 cap: int = 0) -> None:
        self._files = files
        self._limit = limit
        self._cap = cap
        self._send = send
        self._lock = threading.Lock()  # one reader of the files at a time
        self._task: Optional[int] = None
        self._sent = [0, 0]
        # Where each file's disk blocks are freed up to (holes punched past the cap).
        self._punched = [0, 0]
        # Bytes of each stream cut past the cap by truncation (no holes) since the task started.
        self.dropped = [0, 0]
        self._running = threading.Event()
        thread = threading.Thread(target=self._loop, name="spindle-output", daemon=True)
        thread.start()

    def start(self, task_id: int) -> None:
        """A task starts: the capture files are empty."""
        with self._lock:
            self._task = task_id
            self._sent = [0, 0]
            self._punched = [0, 0]
            self.dropped = [0, 0]
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
        cap = self._cap
        for i, (fd, name) in enumerate(zip(self._files, ("stdout", "stderr"))):
            size = os.fstat(fd).st_size
            if cap and size > max(cap + 1, self._punched[i]):
                start = max(cap + 1, self._punched[i])
                if punch_hole(fd, start, size - start):
                    self._punched[i] = size
                else:
                    os.ftruncate(fd, cap + 1)  # writers append at the new end
                    self.dropped[i] += size - (cap + 1)
            end = min(size, self._limit, cap or size)
            while self._sent[i] < end:
                data = os.pread(fd, min(CHUNK, end - self._sent[i]), self._sent[i])
                if not data:
                    break
                self._sent[i] += len(data)
                self._send(task, name, data)
            if cap and size > cap and self._sent[i] == cap:
                self._sent[i] += 1  # past the byte kept to show there was more: said once
                self._send(task, name, truncation_marker(cap))
