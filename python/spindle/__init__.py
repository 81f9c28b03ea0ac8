"""Spindle: shared objects in a server, drop-in for ``threading``, ``queue`` and
``concurrent.futures``.

```python
import spindle
spindle.connect()                 # $SPINDLE_ADDRESS, else a private embedded server
hits = spindle.Counter()          # unnamed: lives as long as this program's session
words = spindle.Dict(name="words")  # named: found by name from any program
```

A server that speaks TLS is reached with its CA: ``$SPINDLE_TLS_CA`` (and
``$SPINDLE_TLS_CERT``/``$SPINDLE_TLS_KEY`` for a client certificate), or
``spindle.connect(address, tls="ca.pem")`` (or ``tls=spindle.tls_context(...)``).

Porting a threaded program is a change of imports: ``from spindle import threading, queue,
multiprocessing`` and ``from spindle.concurrent import futures`` are mirror modules with every
public name of their standard-library twins; every constructor takes the positional
arguments of its standard-library twin, ``name=`` is keyword-only, and errors are the
exceptions the program already catches (``queue.Empty``, ``threading.BrokenBarrierError``,
``KeyError``...). Using any object connects implicitly.

``@spindle.shared`` makes a class's instances shared objects whose methods run in the server
(in object hosts it supervises), one round trip per call.

Functions run on the server's worker pool: ``spindle.Thread`` (like ``threading.Thread``),
``spindle.Executor`` (a ``concurrent.futures.Executor``) and ``spindle.parallel_for``.

``Lock.acquire`` and ``RLock.acquire`` return True and warn :class:`AbandonedLockWarning`
when the previous holder died while holding the lock (a dead holder's ``Semaphore`` permits
are given back silently). A cloud function that changes state it cannot share (a global, a
closure's variable, its plain ``self``) warns :class:`LostUpdateWarning` at the caller.
"""

from .client import Client, connect, disconnect, tls_context
from .codec import trust
from .compiled import wasm_type
from .compute import Executor, Invocation, Thread, parallel_for, register_function
from .data import Array, Blob, Counter, Dict, List, SortedDict, Value
from .errors import (
    AbandonedLockWarning,
    BlockingCallError,
    FunctionTimeout,
    LostUpdateWarning,
    ObjectLost,
    ObjectNotFound,
    OutOfMemory,
    PermissionDenied,
    PoolDeadlockWarning,
    ProtocolError,
    RemoteError,
    ServerUnavailable,
    SpindleError,
    StorageError,
    TLSError,
    TransactionConflict,
    TransactionError,
    Trapped,
    TypeMismatch,
    Unauthorized,
    UnknownMethod,
    UndecodableValue,
    UnknownType,
    UntrustedValue,
    WorkerCrashed,
)
from .futures import Future
from .proxy import Proxy, attach, call, delete, keep, objects, status
from .queues import LifoQueue, PriorityQueue, Queue
from .shared import shared
from .transactions import transaction, transactional
from .sync import (
    Barrier,
    BoundedSemaphore,
    Condition,
    CountDownLatch,
    Event,
    Lock,
    RLock,
    Semaphore,
)

__version__ = "0.1.0"

__all__ = [
    "AbandonedLockWarning",
    "Array",
    "Barrier",
    "Blob",
    "BlockingCallError",
    "BoundedSemaphore",
    "Client",
    "Condition",
    "CountDownLatch",
    "Counter",
    "Dict",
    "Event",
    "Executor",
    "FunctionTimeout",
    "Future",
    "Invocation",
    "LifoQueue",
    "List",
    "Lock",
    "LostUpdateWarning",
    "ObjectLost",
    "ObjectNotFound",
    "OutOfMemory",
    "PriorityQueue",
    "ProtocolError",
    "Proxy",
    "Queue",
    "PermissionDenied",
    "PoolDeadlockWarning",
    "RLock",
    "RemoteError",
    "Semaphore",
    "ServerUnavailable",
    "SortedDict",
    "SpindleError",
    "StorageError",
    "TLSError",
    "Thread",
    "TransactionConflict",
    "TransactionError",
    "Trapped",
    "TypeMismatch",
    "Unauthorized",
    "UnknownMethod",
    "UndecodableValue",
    "UnknownType",
    "UntrustedValue",
    "Value",
    "WorkerCrashed",
    "attach",
    "call",
    "connect",
    "delete",
    "disconnect",
    "keep",
    "objects",
    "parallel_for",
    "register_function",
    "shared",
    "status",
    "tls_context",
    "transaction",
    "transactional",
    "trust",
    "wasm_type",
]


def _register_joblib_if_loaded() -> None:
    import sys

    if "joblib" in sys.modules:
        try:
            from . import joblib as _joblib  # noqa: F401  (registers the "spindle" backend)
        except Exception:  # an incompatible joblib must not break `import spindle`
            pass


_register_joblib_if_loaded()
