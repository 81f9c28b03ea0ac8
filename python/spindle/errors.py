"""Spindle exceptions and the mapping from the server's error kinds to Python exceptions.

The table is the one in docs/protocol.md ("Errors"): most kinds become the exception the
ported standard-library program already catches (``KeyError``, ``queue.Empty``,
``threading.BrokenBarrierError``...); the rest are :class:`SpindleError` subclasses.
"""

from __future__ import annotations

import builtins
import concurrent.futures
import pickle
import queue
import threading
from typing import Any, Callable, Dict, NoReturn, Optional


class SpindleError(Exception):
    """Base class of Spindle's own errors."""


class ProtocolError(SpindleError):
    """The server refused a request as malformed (also ``FrameTooLarge``, ``NoSession``)."""


class ObjectNotFound(SpindleError, LookupError):
    """No object at that key (deleted, or an unnamed object whose session ended)."""


class TypeMismatch(SpindleError, TypeError):
    """The key holds an object of another type."""


class UnknownMethod(SpindleError, AttributeError):
    """The object's type has no such method."""


class UnknownType(SpindleError, TypeError):
    """The server knows no such object type."""


class ServerUnavailable(SpindleError, ConnectionError):
    """The Spindle server cannot be reached (after a few reconnection attempts)."""


class AbandonedLockWarning(RuntimeWarning):
    """A lock was acquired after its previous holder died while holding it.

    The state the lock protected may be half-updated. ``acquire`` still returns ``True``
    (the caller does hold the lock); turn the warning into an error with
    ``warnings.simplefilter("error", spindle.AbandonedLockWarning)`` to stop instead.
    """


class LostUpdateWarning(RuntimeWarning):
    """A cloud function changed state that stays in its worker: the attributes of the plain
    object whose method it is, a module global, or a variable it closes over. The caller's
    copy never sees the change (a silent wrong answer with ``threading``'s code). Warned at
    the caller once per function and name; the message says the fix (``@spindle.shared``,
    a ``spindle.Dict``...)."""


class PoolDeadlockWarning(RuntimeWarning):
    """Calls wait for a worker while every worker of the pool runs a call that does not end:
    if the running calls wait on a barrier, latch or future that the waiting calls must
    reach, the program never ends. Raise the server's ``--max-workers``."""


if concurrent.futures.TimeoutError is TimeoutError:  # Python >= 3.11
    SpindleTimeout: type = TimeoutError
else:  # pragma: no cover - Python 3.9 / 3.10

    class SpindleTimeout(TimeoutError, concurrent.futures.TimeoutError):  # type: ignore
        """A timed wait expired (both ``TimeoutError`` and ``concurrent.futures``')."""


class WorkerCrashed(SpindleError):
    """A function's worker process died during the call (``os._exit``, a signal, the memory
    limit...). Only that call fails; the pool replaces the worker.

    ``status`` is the exit status (or None), ``signal`` the signal number (or None),
    ``reason`` the gateway's explanation (``"memory limit"`` when it killed the worker for its
    memory), ``stdout``/``stderr`` what the function wrote before dying.
    """

    def __init__(
        self,
        message: str = "the function's worker died",
        status: Optional[int] = None,
        signal: Optional[int] = None,
        reason: str = "",
        stdout: bytes = b"",
        stderr: bytes = b"",
    ) -> None:
        super().__init__(message)
        self.status = status
        self.signal = signal
        self.reason = reason
        self.stdout = stdout
        self.stderr = stderr

    def __reduce__(self) -> Any:
        return (
            type(self),
            (self.args[0] if self.args else "", self.status, self.signal, self.reason,
             self.stdout, self.stderr),
        )


class FunctionTimeout(SpindleTimeout):  # type: ignore[misc, valid-type]
    """A function ran past its ``timeout``; its worker was killed and replaced.
    ``stdout``/``stderr`` hold what it wrote until then."""

    def __init__(self, message: str = "", stdout: bytes = b"", stderr: bytes = b"") -> None:
        super().__init__(message)
        self.stdout = stdout
        self.stderr = stderr

    def __reduce__(self) -> Any:
        return (type(self), (self.args[0] if self.args else "", self.stdout, self.stderr))


class Unauthorized(SpindleError, PermissionError):
    """The server refused this client: a server with credentials serves only connections that
    give them (``$SPINDLE_USER`` and ``$SPINDLE_TOKEN``)."""


class PermissionDenied(SpindleError, PermissionError):
    """This client's user may not do that operation on that name: its roles do not allow it
    (the message names the operation, the name and the permission it needs)."""


class UntrustedValue(SpindleError, PermissionError):
    """A pickled value was not unpickled: a pickle is code to whoever unpickles it, and its
    writer (``writer``) could not run code on the server when writing it, is not this
    process's own user, and was not trusted with :func:`spindle.trust`.

    Raised when a value is read (docs/security.md). When the whole reply was read,
    ``value`` holds it with :class:`spindle.codec.Untrusted` placeholders where such pickles
    were (else ``None``).
    """

    def __init__(self, writer: str, message: Optional[str] = None) -> None:
        if message is None:
            message = (
                f"a pickled value written by {writer!r}, who may not run code here: not "
                f"unpickled (trust that writer with spindle.trust({writer!r}) to read it)"
            )
        super().__init__(message)
        self.writer = writer
        self.value: Any = None

    def __reduce__(self) -> Any:
        return (type(self), (self.writer, self.args[0] if self.args else None))


class UndecodableValue(SpindleError, TypeError):
    """A value read from the server does not decode in this process: its class is not here
    (a class of another program's ``__main__``, a module this process lacks), or the value
    is malformed. Raised where the value is read, instead of handing the program a
    placeholder; the message says why."""


class TLSError(SpindleError, ConnectionError):
    """A TLS connection to the server failed: its certificate is not signed by the CA the
    client trusts (``$SPINDLE_TLS_CA``), it does not name the host, the server wants a client
    certificate (``$SPINDLE_TLS_CERT``, ``$SPINDLE_TLS_KEY``), or it does not speak TLS.
    Final: the call is not retried."""


class StorageError(SpindleError, OSError):
    """The server could not write its op log (disk full, an I/O error): the call's change to a
    persistent object is not durable, and that object's partition refuses persistent writes
    until the server restarts (ephemeral objects keep working)."""


class OutOfMemory(SpindleError, MemoryError):
    """The server's objects hold more than its ``--max-memory``, and its caches (dicts
    made with ``max_memory``) have no keys left to evict: a call that may grow an object (or
    create one) is refused and changes nothing. Reads, deletes and calls that only shrink
    objects still run; delete objects (or raise the limit) to write again."""


class TransactionConflict(SpindleError):
    """A transaction met another over an object, or found an object it read changed, and
    was aborted: nothing it did is visible. Running it again may succeed
    (``@spindle.transactional`` does so, with backoff)."""


class Trapped(SpindleError, RuntimeError):
    """A compiled (WebAssembly) method trapped (``unreachable``, an out-of-bounds access...) or
    passed a limit of the server's (its instruction budget, memory or stack). The object is as
    it was before the call. ``reason`` is ``"trap"``, ``"fuel"``, ``"memory"`` or ``"stack"``."""

    def __init__(self, message: str, reason: str = "") -> None:
        super().__init__(message)
        self.reason = reason


class TransactionError(SpindleError):
    """A transaction cannot go on as written: a call that would wait (``Lock.acquire()``,
    ``Queue.get()``...; use the non-blocking form), a limit passed (time, objects, bytes),
    constructing a user-defined object inside (construct it before), or a user-defined object
    whose state does not pickle (a transaction works on a copy of it). It was aborted:
    nothing it did is visible. Running it again fails the same way."""


class ObjectLost(SpindleError):
    """A user-defined object (``@spindle.shared``) was lost with its host process.

    The host died (``os._exit``, a signal, out of memory) or was restarted because a call ran
    past the server's ``--object-call-timeout``. The object's state is gone: every call on it
    fails with this error until it is deleted or constructed again. ``reason`` is the
    server's explanation.
    """

    def __init__(self, message: str = "the object's host died", reason: str = "") -> None:
        super().__init__(message)
        self.reason = reason

    def __reduce__(self) -> Any:
        return (type(self), (self.args[0] if self.args else "", self.reason))


class BlockingCallError(SpindleError, RuntimeError):
    """A method of a shared object made a call that could wait (docs/protocol.md,
    "Methods do not wait").

    An object's host runs one call at a time, so a method waiting for something another
    call must do (a lock release, a queue item, a barrier party) would wait forever. Such
    calls are refused before anything is sent: blocking acquires and waits, calls on other
    user-defined objects, and starting functions. Non-waiting forms (``block=False``,
    ``timeout=0``, ``Counter.add``...) stay allowed.
    """


class RemoteError(SpindleError):
    """A function or a shared object's method raised an exception that could not be brought
    back (it does not pickle, or its class cannot be imported here).

    ``type_name`` and ``message`` describe it; the remote traceback is the ``__cause__``.
    """

    def __init__(self, type_name: str, message: str) -> None:
        super().__init__(f"{type_name}: {message}" if message else type_name)
        self.type_name = type_name
        self.remote_message = message


class RemoteTraceback(Exception):
    """The traceback of an exception raised in a function, attached as its ``__cause__``
    (as ``concurrent.futures.ProcessPoolExecutor`` does)."""

    def __init__(self, tb: str) -> None:
        super().__init__(tb)
        self.tb = tb

    def __str__(self) -> str:
        return "\n\n" + '"""\n' + self.tb.rstrip("\n") + '\n"""'


def unpickled_exception(data: Optional[bytes]) -> Any:
    """The exception pickled in ``data``; None when there is none or it does not unpickle
    here (its class unknown to this process, say)."""
    if data is None:
        return None
    try:
        return pickle.loads(data)
    except Exception:
        return None


def remote_exception(
    exc: Any, type_name: Optional[str], message: Optional[str], tb: Optional[str]
) -> BaseException:
    """The exception to raise for one raised remotely (a function's, a method's).

    ``exc`` is the unpickled exception, or anything else when it could not be brought back
    (then a :class:`RemoteError` naming its type and message stands in). The remote
    traceback becomes its ``__cause__``, as ``ProcessPoolExecutor`` does, so the printed
    error shows where it happened on the other side.
    """
    if not isinstance(exc, BaseException):
        exc = _builtin_exception(type_name, message or "") or RemoteError(type_name or "Exception", message or "")
    if tb:
        exc.__cause__ = RemoteTraceback(tb)
    return exc


def _builtin_exception(type_name: Optional[str], message: str) -> Optional[BaseException]:
    """The built-in exception named ``type_name`` (``ValueError``...), as a compiled method
    raises them by name (it has no pickle to send), or None."""
    cls = getattr(builtins, type_name or "", None)
    if not (isinstance(cls, type) and issubclass(cls, Exception)):
        return None
    try:
        return cls(message)
    except TypeError:  # one that takes other arguments (UnicodeDecodeError...)
        return None


class Moved(Exception):
    """Internal: the object was kept under a new key (``data``); proxies follow it."""

    def __init__(self, new_key: str) -> None:
        super().__init__(new_key)
        self.new_key = new_key


class RemoteFutureException(Exception):
    """Internal: ``Future.result`` found an exception; ``data`` is the exception value."""

    def __init__(self, message: str, data: Any) -> None:
        super().__init__(message)
        self.data = data


def _hashable(value: Any) -> Any:
    from .codec import hashable

    return hashable(value)


_SIMPLE: Dict[str, Callable[[str], BaseException]] = {
    "ProtocolError": ProtocolError,
    "FrameTooLarge": ProtocolError,
    "NoSession": ProtocolError,
    "UnknownType": UnknownType,
    "UnknownMethod": UnknownMethod,
    "TypeMismatch": TypeMismatch,
    "NotFound": ObjectNotFound,
    "BadArguments": TypeError,
    "IndexError": IndexError,
    "ValueError": ValueError,
    "OverflowError": OverflowError,
    "RuntimeError": RuntimeError,
    "Timeout": SpindleTimeout,
    "BrokenBarrier": threading.BrokenBarrierError,
    "Empty": queue.Empty,
    "Full": queue.Full,
    "InvalidState": concurrent.futures.InvalidStateError,
    "Cancelled": concurrent.futures.CancelledError,
    "FunctionTimeout": FunctionTimeout,
    "Unauthorized": Unauthorized,
    "PermissionDenied": PermissionDenied,
    "StorageError": StorageError,
    "OutOfMemory": OutOfMemory,
    "TransactionConflict": TransactionConflict,
    "TransactionError": TransactionError,
    "Busy": SpindleError,
    # A cluster's shard had no leader for longer than the client waits (see client.py).
    "NotLeader": ServerUnavailable,
    "Internal": SpindleError,
}


def error_from_reply(error: Any) -> BaseException:
    """The exception for an error reply's ``[kind, message, data]``."""
    try:
        kind, message, data = error
    except (TypeError, ValueError):
        return ProtocolError(f"malformed error reply from the server: {error!r}")
    if kind == "KeyError":
        return KeyError(_hashable(data))
    if kind == "Moved":
        return Moved(data)
    if kind == "FutureException":
        return RemoteFutureException(message, data)
    if kind == "WorkerCrashed":
        info = data if isinstance(data, dict) else {}
        return WorkerCrashed(
            message,
            status=info.get("status"),
            signal=info.get("signal"),
            reason=info.get("reason") or "",
            stdout=info.get("stdout") or b"",
            stderr=info.get("stderr") or b"",
        )
    if kind == "FunctionTimeout":
        info = data if isinstance(data, dict) else {}
        return FunctionTimeout(message, info.get("stdout") or b"", info.get("stderr") or b"")
    if kind == "Raised":  # a shared object's method (or constructor) raised
        info = data if isinstance(data, dict) else {}
        return remote_exception(
            info.get("exception"), info.get("type"), info.get("message") or message,
            info.get("traceback"),
        )
    if kind == "ObjectLost":
        info = data if isinstance(data, dict) else {}
        return ObjectLost(message, info.get("reason") or "")
    if kind == "Trapped":
        info = data if isinstance(data, dict) else {}
        return Trapped(message, info.get("reason") or "")
    make = _SIMPLE.get(kind)
    if make is None:
        return SpindleError(f"{kind}: {message}")
    return make(message)


def raise_error(error: Any) -> NoReturn:
    """Raise the exception for an error reply."""
    raise error_from_reply(error)
