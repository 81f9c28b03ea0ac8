"""Invoking functions: one gateway connection per process, replies matched by request id.

docs/protocol.md ("Functions"): ``[id, "invoke", "python", payload, options]`` is answered
when the function ends, so many invocations share one connection; before that, progress
frames ``[id, 2, value]`` (its output as it comes, that it queued or started) go to the
invocation's ``on_progress``. Sends take a lock; one
reader thread resolves the :class:`Invocation` futures. After ``fork`` the child drops the
inherited connection unused and opens its own on its first invocation.

Each invocation runs as its own session (``Scoped``): a retry of it repeats the same
``(session, seq)`` object calls, so the calls the failed attempt already made are answered
from the server's record instead of being applied twice.
"""

from __future__ import annotations

import concurrent.futures
import itertools
import os
import pickle
import select
import ssl
import sys
import threading
from typing import Any, Callable, Dict, List, Optional, Tuple

import cloudpickle

from .. import client as _client_mod
from ..client import Connection, frame
from ..codec import unpackb
from ..errors import (
    FunctionTimeout,
    ServerUnavailable,
    UntrustedValue,
    WorkerCrashed,
    error_from_reply,
    remote_exception,
    unpickled_exception,
)
from .output import write as write_output

MAX_ARGUMENT = 1 << 20  # bytes: larger arguments travel as objects or paths, not inline
MAX_PAYLOAD = (64 << 20) - 4096  # under the server's default frame limit (--max-frame)
CANCEL_TIMEOUT = 30.0


class Scoped:
    """A function to run in the session ``session`` (see the module docstring).

    The worker recognizes it and calls ``fn`` inside ``Client.scope(session)``.
    """

    __slots__ = ("fn", "session")

    def __init__(self, fn: Callable[..., Any], session: str) -> None:
        self.fn = fn
        self.session = session

    def __call__(self, *args: Any, **kwargs: Any) -> Any:  # outside a worker: just call
        with _client_mod.current().scope(self.session):
            return self.fn(*args, **kwargs)

    def __reduce__(self) -> Any:
        return (Scoped, (self.fn, self.session))


def _describe(obj: Any) -> str:
    text = repr(obj)
    return text if len(text) <= 60 else text[:57] + "..."


def make_payload(fn: Callable[..., Any], args: Tuple[Any, ...], kwargs: Dict[str, Any],
                 session: Optional[str], limit: Optional[int] = MAX_ARGUMENT) -> bytes:
    """The ``python`` payload: a cloudpickle of ``(function, args, kwargs)``.

    Raises ``ValueError`` for an argument (or a function with what it captures) whose pickle
    is over ``limit`` (1 MiB; None: no limit but the server's frame size), and ``TypeError``
    when something cannot be pickled.
    """
    target = Scoped(fn, session) if session is not None else fn
    try:
        payload = cloudpickle.dumps((target, args, kwargs), protocol=pickle.HIGHEST_PROTOCOL)
    except Exception as exc:
        raise TypeError(f"cannot ship {_describe(fn)} as a spindle function: {exc}") from exc
    if limit is not None and len(payload) > limit:
        _refuse_large(fn, args, kwargs, limit)
    if len(payload) > MAX_PAYLOAD:
        raise ValueError(
            f"the call of {_describe(fn)} pickles to {len(payload):,} bytes, over the server's "
            "frame limit: put large data in a spindle.Blob or spindle.Array (or a file) and "
            "pass that, or its path, instead"
        )
    return payload


def _refuse_large(fn: Any, args: Tuple[Any, ...], kwargs: Dict[str, Any], limit: int) -> None:
    named: List[Tuple[str, Any]] = [("the function (with what it captures)", fn)]
    named += [(f"argument {i}", a) for i, a in enumerate(args)]
    named += [(f"argument {k!r}", v) for k, v in kwargs.items()]
    for what, value in named:
        size = len(cloudpickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL))
        if size > limit:
            raise ValueError(
                f"{what} of {_describe(fn)} pickles to {size:,} bytes, over the "
                f"{limit / (1 << 20):g} MiB limit "
                "for inline arguments: put large data in a spindle.Blob or spindle.Array "
                "(or a file) and pass that, or its path, instead"
            )


class Invocation(concurrent.futures.Future):
    """The future of one function call, with what the function printed and its report.

    - ``stdout``, ``stderr``: bytes the function wrote (at most 1 MiB each);
    - ``report``: the gateway's report (``cold``, ``queued``, ``duration``, ``peak_rss``,
      ``worker``, ``truncated``) of the last attempt;
    - ``attempts``: how many times the function ran (more than 1 after retries);
    - ``label``: the task's name, used as the prefix of its echoed output.

    The future stays pending until the call ends. ``cancel()`` also withdraws a call that is
    still queued in the server; ``kill()`` stops it even when it runs.
    """

    def __init__(self, label: str = "") -> None:
        super().__init__()
        self.label = label
        self.stdout = b""
        self.stderr = b""
        self.report: Dict[str, Any] = {}
        self.attempts = 0
        self._invoker: Optional["Invoker"] = None
        self._request_id: Optional[int] = None  # of the attempt in the server, if any
        self.call_id: Optional[int] = None  # the server's number for it (spindle ps), once known
        self._cancel_hook: Optional[Callable[["Invocation"], bool]] = None
        self.killed = False  # kill() stopped it: its attempt's failure means cancelled

    def cancel(self) -> bool:
        """Cancel the call if it has not started: still waiting here, or queued in the server."""
        with self._condition:
            if self._state != "PENDING":
                return self._state in ("CANCELLED", "CANCELLED_AND_NOTIFIED")
            invoker, rid = self._invoker, self._request_id
        if self._cancel_hook is not None and self._cancel_hook(self):
            return self._cancel_now()
        if rid is None or invoker is None:
            return self._cancel_now()
        if invoker.cancel(rid):
            return self._cancel_now()
        return self.cancelled()

    def kill(self) -> bool:
        """Stop the call whether it runs or not, as ``spindle kill``: withdraw it if it has
        not started, else kill its worker (with what the function started). The future then
        ends cancelled, once the worker is gone. False if the call had ended already."""
        with self._condition:
            if self._state != "PENDING":
                return self._state in ("CANCELLED", "CANCELLED_AND_NOTIFIED")
            self.killed = True
        if self.cancel():
            return True
        # It runs: its "started" progress frame came before the answer to cancel, so the
        # server's number for it is known.
        invoker, call = self._invoker, self.call_id
        if invoker is None or call is None or not invoker.kill(call):
            return self.cancelled()
        return True

    def _cancel_now(self) -> bool:
        # Notify at once: concurrent.futures.wait() and as_completed() count a future as done
        # only once it is CANCELLED_AND_NOTIFIED (an executor would do this when it dequeues).
        if not super().cancel():
            return False
        with self._condition:
            notify = self._state == "CANCELLED"  # not yet notified (cancel may come twice)
        if notify:
            try:
                self.set_running_or_notify_cancel()
            except RuntimeError:  # another thread's cancel notified first
                pass
        return True

    def _cancelled_remotely(self) -> None:
        self._cancel_now()


def exception_of(report: Dict[str, Any]) -> BaseException:
    """The exception a function raised, with its remote traceback as ``__cause__``."""
    error = report.get("error") or {}
    exc = unpickled_exception(report.get("result"))
    return remote_exception(exc, error.get("type"), error.get("message"), error.get("traceback"))


def result_of(report: Dict[str, Any]) -> Any:
    return pickle.loads(report["result"])


class SharedTLSSocket:
    """A TLS socket one thread reads while others send: every use of the TLS session holds a
    lock, and a reader waits for data outside it (then reads without blocking), so a reader
    waiting for replies never holds up a sender."""

    def __init__(self, sock: "ssl.SSLSocket") -> None:
        self._sock = sock
        self._lock = threading.Lock()

    def sendall(self, data: bytes) -> None:
        with self._lock:
            self._sock.sendall(data)

    def _read(self, read: Callable[[], int]) -> int:
        while True:
            if not self._sock.pending():
                try:
                    select.select([self._sock], [], [])
                except ValueError:  # closed meanwhile (fd -1)
                    raise ConnectionResetError("the connection was closed") from None
            with self._lock:
                self._sock.settimeout(0.0)
                try:
                    return read()
                except (ssl.SSLWantReadError, ssl.SSLWantWriteError):
                    continue  # part of a record, or a record that held no data
                finally:
                    self._sock.settimeout(None)

    def recv(self, size: int) -> bytes:
        data = b""

        def read() -> int:
            nonlocal data
            data = self._sock.recv(size)
            return len(data)

        self._read(read)
        return data

    def recv_into(self, view: memoryview) -> int:
        return self._read(lambda: self._sock.recv_into(view))

    def settimeout(self, timeout: Optional[float]) -> None:
        pass  # the invoker's connection always blocks

    def close(self) -> None:
        self._sock.close()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._sock, name)


class Invoker:
    """A process's gateway connection."""

    def __init__(self, client: "_client_mod.Client") -> None:
        self.address = client.address
        self.pid = os.getpid()
        self._conn = Connection(client.host, client.port, client.session, 1, client.token,
                                user=client.user, tls=client.tls)
        if client.tls is not None:
            # The reader thread and the senders share one TLS session, which must not be
            # used by two threads at once.
            self._conn.sock = SharedTLSSocket(self._conn.sock)  # type: ignore[assignment]
        self._ids = itertools.count(2)
        self._pending: Dict[int, Callable[[List[Any]], None]] = {}
        self._progress: Dict[int, Callable[[Any], None]] = {}
        self._lock = threading.Lock()
        self.closed = False
        self._reader = threading.Thread(target=self._read_loop, name="spindle-invoker", daemon=True)
        self._reader.start()

    def send(self, request_tail: List[Any], on_reply: Callable[[List[Any]], None],
             on_progress: Optional[Callable[[Any], None]] = None) -> int:
        """Send ``[id, *request_tail]``; ``on_reply(reply)`` runs in the reader thread, as
        ``on_progress(value)`` does for each progress frame before it."""
        with self._lock:
            if self.closed:
                raise ServerUnavailable(f"spindle server at {self.address} is unavailable")
            rid = next(self._ids)
            self._pending[rid] = on_reply
            if on_progress is not None:
                self._progress[rid] = on_progress
            try:
                self._conn.sock.sendall(frame([rid, *request_tail]))
            except OSError as exc:
                self._pending.pop(rid, None)
                self._progress.pop(rid, None)
                self._close_locked()
                raise ServerUnavailable(
                    f"spindle server at {self.address} is unavailable: {exc}"
                ) from exc
        return rid

    def invoke(self, payload: bytes, options: Dict[str, Any],
               on_reply: Callable[[List[Any]], None],
               on_progress: Optional[Callable[[Any], None]] = None) -> int:
        return self.send(["invoke", "python", payload, options], on_reply, on_progress)

    def cancel(self, rid: int) -> bool:
        """Withdraw the queued invocation ``rid``; True if it had not started."""
        try:
            return bool(self._ask(["cancel", rid]))
        except Exception:  # the connection is gone: so is the call
            return False

    def kill(self, call: int) -> bool:
        """Stop the server's call number ``call`` (as ``spindle kill``): withdraw it if
        queued, else kill its worker; False if it has ended already."""
        try:
            return bool(self._ask(["calls", "kill", call]))
        except Exception:  # ended already (ValueError), or the connection is gone
            return False

    def _ask(self, request_tail: List[Any]) -> Any:
        """Send ``[id, *request_tail]`` and wait for its result (raising its error)."""
        if threading.current_thread() is self._reader:
            # From a done-callback: only this thread reads replies, so it cannot wait for one.
            # The server still acts on the request, and the call then ends as it says.
            self.send(request_tail, lambda reply: None)
            return None
        answer: "concurrent.futures.Future[Any]" = concurrent.futures.Future()

        def on_reply(reply: List[Any]) -> None:
            if reply[1] == 0:
                answer.set_result(reply[2])
            else:
                answer.set_exception(reply_error(reply))

        self.send(request_tail, on_reply)
        return answer.result(CANCEL_TIMEOUT)

    def _read_loop(self) -> None:
        conn = self._conn
        pending = self._pending
        error: BaseException = ServerUnavailable(
            f"the connection to the spindle server at {self.address} was lost"
        )
        try:
            while True:
                try:
                    reply = unpackb(conn.read_body())
                except UntrustedValue as exc:  # read whole: the stream is in step
                    if exc.value is None:
                        continue
                    reply = exc.value
                rid = reply[0]
                if reply[1] == 2:  # progress of a call still running
                    progress = self._progress.get(rid)
                    if progress is not None:
                        try:
                            progress(reply[2])
                        except Exception:
                            import traceback

                            traceback.print_exc()
                    continue
                if rid == 0 and reply[1] == 1:  # a frame the server could not read
                    error = error_from_reply(reply[2])
                    if isinstance(reply[2], list) and reply[2] and reply[2][0] == "FrameTooLarge":
                        break
                    continue
                with self._lock:
                    callback = pending.pop(rid, None)
                    self._progress.pop(rid, None)
                if callback is not None:
                    try:
                        callback(reply)
                    except Exception:  # a bug in a callback must not stop the reader
                        import traceback

                        traceback.print_exc()
        except (OSError, ValueError, EOFError):
            pass
        except Exception as exc:  # an undecodable frame: give up on this connection
            error = ServerUnavailable(f"bad reply from the spindle server: {exc}")
        with self._lock:
            self._close_locked()
            callbacks, self._pending = list(pending.values()), {}
            self._progress = {}
        failed = [0, 1, ["ConnectionLost", str(error), None]]
        for callback in callbacks:
            try:
                callback(failed)
            except Exception:
                pass

    def _close_locked(self) -> None:
        self.closed = True
        self._conn.close()

    def close(self) -> None:
        with self._lock:
            self._close_locked()

    def forget_in_child(self) -> None:
        """After fork: close our copy of the socket without sending anything on it."""
        self.closed = True
        self._conn.close()
        self._pending = {}
        self._progress = {}


def reply_error(reply: List[Any]) -> BaseException:
    """The exception of an error reply to ``invoke`` (lost connections included)."""
    error = reply[2]
    if isinstance(error, list) and error and error[0] == "ConnectionLost":
        return ServerUnavailable(error[1])
    return error_from_reply(error)


_invoker: Optional[Invoker] = None
_invoker_lock = threading.Lock()


def current_invoker() -> Invoker:
    """This process's invoker, (re)connecting when needed."""
    global _invoker
    invoker = _invoker
    client = _client_mod.current()
    if invoker is not None and not invoker.closed and invoker.address == client.address:
        return invoker
    with _invoker_lock:
        invoker = _invoker
        if invoker is None or invoker.closed or invoker.address != client.address:
            if invoker is not None:
                invoker.close()
            try:
                invoker = Invoker(client)
            except OSError as exc:
                raise ServerUnavailable(
                    f"spindle server at {client.address} is unavailable: {exc}"
                ) from exc
            _invoker = invoker
        return invoker


def on_reader_thread() -> bool:
    """Whether this thread reads the invoker's replies (done-callbacks run on it), so it
    must never wait for a reply."""
    invoker = _invoker
    return invoker is not None and threading.current_thread() is invoker._reader


def echo_output(label: str, stdout: bytes, stderr: bytes, truncated: int = 0) -> None:
    """Print a function's output here, each line prefixed with ``[label]``."""
    write_output(label, "stdout", stdout)
    write_output(label, "stderr", stderr)
    if truncated and sys.stderr is not None:
        try:
            sys.stderr.write(f"[{label}] ({truncated:,} more bytes of output were cut)\n")
        except (OSError, ValueError):
            pass


def _after_fork_in_child() -> None:
    global _invoker, _invoker_lock
    _invoker_lock = threading.Lock()
    if _invoker is not None:
        _invoker.forget_in_child()
        _invoker = None


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


__all__ = [
    "FunctionTimeout",
    "Invocation",
    "Invoker",
    "MAX_ARGUMENT",
    "Scoped",
    "WorkerCrashed",
    "current_invoker",
    "echo_output",
    "exception_of",
    "make_payload",
    "on_reader_thread",
    "reply_error",
    "result_of",
]
