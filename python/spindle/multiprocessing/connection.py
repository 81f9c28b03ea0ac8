"""``multiprocessing.Pipe`` over two Spindle queues: its ends can be passed to cloud
functions (each end pickles as its queues' references)."""

from __future__ import annotations

import queue as _queue
from collections import deque
from typing import Any, Deque, Optional, Tuple

from .queues import Queue


class Connection:
    """One end of a :func:`Pipe`: ``send``/``recv`` objects (or bytes), ``poll``."""

    def __init__(self, inbox: Optional[Queue], outbox: Optional[Queue]) -> None:
        self._inbox, self._outbox = inbox, outbox
        self._polled: Deque[Any] = deque()  # what poll() took out of the inbox
        self.closed = False

    @property
    def readable(self) -> bool:
        return self._inbox is not None

    @property
    def writable(self) -> bool:
        return self._outbox is not None

    def _check(self, inbox: bool) -> Queue:
        if self.closed:
            raise OSError("handle is closed")
        end = self._inbox if inbox else self._outbox
        if end is None:
            raise OSError("connection is write-only" if inbox else "connection is read-only")
        return end

    def send(self, obj: Any) -> None:
        self._check(False).put(obj)

    def recv(self) -> Any:
        inbox = self._check(True)
        return self._polled.popleft() if self._polled else inbox.get()

    def send_bytes(self, buf: Any, offset: int = 0, size: Optional[int] = None) -> None:
        view = memoryview(buf).cast("B")
        if offset < 0 or offset > len(view):
            raise ValueError("offset out of bounds")
        end = len(view) if size is None else offset + size
        if size is not None and (size < 0 or end > len(view)):
            raise ValueError("size is negative" if size < 0 else "buffer length < offset + size")
        self.send(bytes(view[offset:end]))

    def recv_bytes(self, maxlength: Optional[int] = None) -> bytes:
        data = self.recv()
        if not isinstance(data, bytes):
            raise TypeError(f"expected bytes from the pipe, got {type(data).__name__}")
        if maxlength is not None and len(data) > maxlength:
            raise OSError("bad message length")
        return data

    def poll(self, timeout: Optional[float] = 0.0) -> bool:
        """Whether something can be received, waiting up to ``timeout`` (None: forever)."""
        inbox = self._check(True)
        if self._polled:
            return True
        try:
            item = inbox.get(timeout != 0, None if timeout is None else max(timeout, 0))
        except _queue.Empty:
            return False
        self._polled.append(item)
        return True

    def close(self) -> None:
        self.closed = True

    def __enter__(self) -> "Connection":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def Pipe(duplex: bool = True) -> Tuple[Connection, Connection]:
    """Two connected ends; with ``duplex=False``, the first receives and the second sends."""
    forward = Queue()
    if not duplex:
        return Connection(forward, None), Connection(None, forward)
    backward = Queue()
    return Connection(forward, backward), Connection(backward, forward)
