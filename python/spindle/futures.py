"""Future: a result that one process sets and others wait for, like
``concurrent.futures.Future``.

``set_exception`` stores ``[type_name, message, pickled exception]``; ``result()`` re-raises
the unpickled exception, or a :class:`spindle.SpindleError` naming its type and message when it
cannot be unpickled here.
"""

from __future__ import annotations

import concurrent.futures
import threading
from typing import Any, Callable, Optional

from .codec import pickled
from .errors import RemoteFutureException, SpindleError
from .proxy import Proxy, refuse_waiting


def _exception_from(value: Any) -> BaseException:
    try:
        type_name, message, exc = value
    except (TypeError, ValueError):
        return SpindleError(f"future exception: {value!r}")
    if isinstance(exc, BaseException):
        return exc
    return SpindleError(f"{type_name}: {message}")


def _timeout(timeout: Optional[float]) -> Optional[float]:
    """A negative timeout waits no time, as in ``concurrent.futures`` (the server refuses it)."""
    if timeout is not None and timeout < 0:
        return 0
    return timeout


class Future(Proxy, type_name="Future"):
    """A shared future: ``set_result``/``set_exception`` once; ``result`` waits."""

    def __init__(self, *, name: Optional[str] = None, persistent: bool = False) -> None:
        self._init([], name, persistent)

    def set_result(self, result: Any) -> None:
        """Complete with ``result``; ``InvalidStateError`` if already done."""
        self._call("set_result", [result])

    def set_exception(self, exception: BaseException) -> None:
        """Complete with ``exception``; ``InvalidStateError`` if already done."""
        if isinstance(exception, type):
            exception = exception()
        value = [type(exception).__name__, str(exception), pickled(exception)]
        self._call("set_exception", [value])

    def result(self, timeout: Optional[float] = None) -> Any:
        """The result, waiting up to ``timeout``; re-raises a stored exception."""
        try:
            timeout = _timeout(timeout)
            return self._call("result", [timeout], timeout != 0)
        except RemoteFutureException as remote:
            raise _exception_from(remote.data) from None

    def exception(self, timeout: Optional[float] = None) -> Optional[BaseException]:
        """The stored exception (None if the future has a result), waiting up to ``timeout``."""
        timeout = _timeout(timeout)
        value = self._call("exception", [timeout], timeout != 0)
        return None if value is None else _exception_from(value)

    def done(self) -> bool:
        return self._call("done", [])

    def cancelled(self) -> bool:
        return self._call("cancelled", [])

    def running(self) -> bool:
        return self._call("running", [])

    def cancel(self) -> bool:
        """Cancel a pending future; True if it is now cancelled."""
        return self._call("cancel", [])

    def add_done_callback(self, fn: Callable[["Future"], Any]) -> None:
        """Call ``fn(self)`` once the future is done (from a helper thread if not yet)."""
        if self.done():
            fn(self)
            return
        # Its helper thread would wait for the future: refused in a shared object's method.
        refuse_waiting("spindle.Future.add_done_callback() of a pending future")

        def wait_then_call() -> None:
            try:
                self.exception()
            except concurrent.futures.CancelledError:
                pass
            except Exception:  # the server went away: give up silently
                return
            fn(self)

        threading.Thread(target=wait_then_call, daemon=True).start()
