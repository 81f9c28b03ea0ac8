"""One function call driven to its end: invoke, echo the output, retry, resolve the future.

Used by :class:`spindle.Thread`, :class:`spindle.Executor` and :func:`spindle.parallel_for`.
Replies arrive in the invoker's reader thread; a retry waits its backoff on a timer.
"""

from __future__ import annotations

import atexit
import concurrent.futures
import os
import socket
import sys
import threading
from typing import Any, Callable, Dict, List, Optional, Set, Tuple, Union

from .. import lost_updates
from ..errors import FunctionTimeout, WorkerCrashed
from ..proxy import refuse_waiting
from ..sessions import new_secret
from . import pool_watch
from .invoker import (
    MAX_ARGUMENT,
    Invocation,
    current_invoker,
    echo_output,
    exception_of,
    make_payload,
    reply_error,
    result_of,
)
from .output import LiveOutput

Backoff = Union[float, Callable[[int], float]]
MAX_DELAY = 30.0

# Calls the interpreter's exit waits for: non-daemon threads' and executors' (as threading's
# and concurrent.futures' own).
_running: Set[Invocation] = set()
_running_lock = threading.Lock()
_exit_hook = False


def _wait_at_exit() -> None:
    while True:
        with _running_lock:
            pending = list(_running)
        if not pending:
            return
        concurrent.futures.wait(pending)


def keep_alive(future: Invocation) -> None:
    """Make the program's exit wait for ``future``, as it waits for a non-daemon thread or
    for the work queued in a ``concurrent.futures`` executor."""
    global _exit_hook
    with _running_lock:
        if not _exit_hook:
            # Runs where threading joins its own threads, before atexit handlers close the
            # connection (concurrent.futures uses the same hook); plain atexit otherwise.
            register = getattr(threading, "_register_atexit", atexit.register)
            try:
                register(_wait_at_exit)
            except RuntimeError:  # the interpreter is exiting already: it waits for nothing more
                return
            _exit_hook = True
        _running.add(future)
    future.add_done_callback(_forget)


def _forget(future: Invocation) -> None:
    with _running_lock:
        _running.discard(future)


def _forget_all_after_fork() -> None:
    # A forked child inherits the parent's calls but not the thread that receives their
    # replies: it must not wait for them at its exit.
    global _running_lock
    _running_lock = threading.Lock()
    _running.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_all_after_fork)


def backoff_delay(backoff: Backoff, retry: int) -> float:
    """Seconds to wait before retry number ``retry`` (1, 2, ...): a callable's answer, or
    ``backoff * 2 ** (retry - 1)`` capped at 30 s."""
    if callable(backoff):
        return max(0.0, float(backoff(retry)))
    return min(MAX_DELAY, float(backoff) * 2 ** (retry - 1))


def call_options(timeout: Optional[float], memory_mb: Optional[int], label: str) -> Dict[str, Any]:
    """The ``options`` map of an invocation (keys left out take the server's defaults)."""
    if timeout is not None and timeout < 0:
        raise ValueError("timeout must be non-negative")
    # Output as it comes (compute/output.py); `caller` is what `spindle ps` shows.
    options: Dict[str, Any] = {"label": label, "live": True, "caller": _caller()}
    if timeout is not None:
        options["timeout"] = timeout
    if memory_mb is not None:
        options["memory_mb"] = int(memory_mb)
    return options


_callers: Dict[int, str] = {}


def _caller() -> str:
    """This process as `spindle ps` shows it: program, pid and host."""
    pid = os.getpid()
    caller = _callers.get(pid)
    if caller is None:
        program = os.path.basename(sys.argv[0]) if sys.argv and sys.argv[0] else "python"
        caller = _callers[pid] = f"{program} pid {pid} on {socket.gethostname()}"
    return caller


def _function_name(fn: Any) -> str:
    name = getattr(fn, "__qualname__", None) or getattr(fn, "__name__", None) or type(fn).__name__
    module = getattr(fn, "__module__", None)
    return f"{module}.{name}" if module and module != "__main__" else str(name)


class Call:
    """Runs ``fn(*args, **kwargs)`` as a function until it succeeds or its retries run out."""

    __slots__ = ("future", "payload", "options", "retries", "backoff", "echo", "live")

    def __init__(
        self,
        future: Invocation,
        fn: Callable[..., Any],
        args: Tuple[Any, ...],
        kwargs: Dict[str, Any],
        *,
        options: Dict[str, Any],
        retries: int = 0,
        backoff: Backoff = 0.1,
        echo: bool = True,
        limit: Optional[int] = MAX_ARGUMENT,
    ) -> None:
        if retries < 0:
            raise ValueError("retries must be >= 0")
        # Thread.start, Executor.submit and parallel_for all come here.
        refuse_waiting("starting a spindle function")
        self.future = future
        # Pickled once, here, so that a bad function or argument fails the caller's submit.
        # A session of its own (its secret), the same for every retry of the call.
        self.payload = make_payload(fn, args, kwargs, new_secret(), limit)
        self.options = {**options, "function": _function_name(fn)}
        self.live = LiveOutput(future.label, echo)
        self.retries = retries
        self.backoff = backoff
        self.echo = echo

    def start(self) -> None:
        """Send the next attempt (or settle the future if that cannot be done)."""
        future = self.future
        if future.done():
            return
        try:
            invoker = current_invoker()
            future._invoker = invoker
            future.attempts += 1
            self.live = LiveOutput(future.label, self.echo)
            future._request_id = invoker.invoke(self.payload, self.options, self._on_reply, self._on_progress)
        except BaseException as exc:
            _settle(future, exc=exc)

    def _on_progress(self, value: Any) -> None:
        """A progress frame of the running attempt: output, or that it queued or started."""
        if not isinstance(value, dict):
            return
        for stream in ("stdout", "stderr"):
            if stream in value:
                self.live.feed(stream, value[stream])
        if "queued" in value:
            self.future.call_id = value["queued"]
            pool_watch.queued(self.future, value.get("max_workers") or 0)
        if "started" in value:
            self.future.call_id = value["started"]
            pool_watch.started(self.future)

    def _on_reply(self, reply: List[Any]) -> None:
        future = self.future
        future._request_id = None
        pool_watch.ended(future)
        live = self.live
        live.close()
        exc: Optional[BaseException] = None
        retryable = False
        if reply[1] == 0:
            report = reply[2]
            future.report = {k: v for k, v in report.items()
                             if k not in ("result", "stdout", "stderr", "lost_updates")}
            # Live output came before; a worker that streams nothing reports it all here.
            stdout, stderr = report.get("stdout") or b"", report.get("stderr") or b""
            future.stdout = live.output("stdout") + stdout
            future.stderr = live.output("stderr") + stderr
            if self.echo:
                echo_output(future.label, stdout, stderr, report.get("truncated") or 0)
            if "lost_updates" in report:
                lost_updates.warn(report["lost_updates"])
            if report.get("ok"):
                try:
                    value = result_of(report)
                except BaseException as err:
                    _settle(future, exc=TypeError(f"cannot unpickle the function's result: {err}"))
                    return
                _settle(future, value=value)
                return
            exc = exception_of(report)
            retryable = True
        else:
            exc = reply_error(reply)
            if isinstance(exc, concurrent.futures.CancelledError):
                future._cancelled_remotely()
                return
            if isinstance(exc, WorkerCrashed):
                future.stdout, future.stderr = exc.stdout, exc.stderr
                if self.echo:  # what did not come live
                    echo_output(future.label, exc.stdout[live.received["stdout"]:],
                                exc.stderr[live.received["stderr"]:])
            killed = isinstance(exc, WorkerCrashed) and exc.reason.startswith("killed with spindle kill")
            if killed and future.killed:  # stopped by Invocation.kill(): as cancelled
                future._cancelled_remotely()
                return
            retryable = isinstance(exc, (WorkerCrashed, FunctionTimeout)) and not killed
        if retryable and not future.killed and future.attempts <= self.retries and not future.done():
            delay = backoff_delay(self.backoff, future.attempts)
            timer = threading.Timer(delay, self.start)
            timer.daemon = True
            timer.start()
            return
        _settle(future, exc=exc)


def _settle(future: Invocation, value: Any = None, exc: Optional[BaseException] = None) -> None:
    try:
        if exc is None:
            future.set_result(value)
        else:
            future.set_exception(exc)
    except concurrent.futures.InvalidStateError:  # cancelled here meanwhile
        pass
