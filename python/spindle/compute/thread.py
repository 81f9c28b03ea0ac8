"""spindle.Thread: a cloud thread, ``threading.Thread`` whose target runs as a Spindle function.

```python
t = spindle.Thread(target=work, args=(i, barrier, hits))   # same arguments as threading
t.start(); t.join()
```

Differences from ``threading.Thread``: the target runs in a worker process, so its arguments
and the target itself are pickled (shared objects travel as references); an exception raised
by the target is re-raised by ``join`` with the remote traceback as its ``__cause__``;
``result`` holds what the target returned. As with ``threading``, the program waits at exit
for its non-daemon threads; daemon threads' calls are abandoned with the program.
"""

from __future__ import annotations

import itertools
import threading
from typing import Any, Callable, Dict, List, Optional, Set

from .call import Backoff, Call, call_options, keep_alive
from .invoker import Invocation

_numbers = itertools.count(1)

# The cloud threads this process started that have not ended (spindle.threading.enumerate).
_alive: Set["Thread"] = set()
_alive_lock = threading.Lock()


def alive_threads() -> List["Thread"]:
    """The cloud threads started here that are still running, in no particular order."""
    with _alive_lock:
        return list(_alive)


class Thread:
    """A thread of control that runs as a Spindle function (see the module docstring).

    Takes ``threading.Thread``'s arguments, plus ``timeout`` and ``memory_mb`` (limits of the
    call), ``retries``/``backoff`` (as :class:`spindle.Executor`) and ``echo`` (print the
    function's output here with a ``[name]`` prefix). Subclasses may override :meth:`run`.
    """

    def __init__(
        self,
        group: None = None,
        target: Optional[Callable[..., Any]] = None,
        name: Optional[str] = None,
        args: Any = (),
        kwargs: Optional[Dict[str, Any]] = None,
        *,
        daemon: Optional[bool] = None,
        timeout: Optional[float] = None,
        memory_mb: Optional[int] = None,
        retries: int = 0,
        backoff: Backoff = 0.1,
        echo: bool = True,
    ) -> None:
        if group is not None:
            if target is None and callable(group):  # Thread(fn): accept the obvious intent
                target, group = group, None
            else:
                raise ValueError("group argument must be None for now")
        self._target = target
        self._name = str(name) if name is not None else f"Thread-{next(_numbers)}"
        self._args = tuple(args)
        self._kwargs = dict(kwargs or {})
        # As in threading: a thread inherits its creator's daemon status unless told.
        self.daemon = threading.current_thread().daemon if daemon is None else bool(daemon)
        self._options = call_options(timeout, memory_mb, self._name)
        self._retries = retries
        self._backoff = backoff
        self._echo = echo
        self._future: Optional[Invocation] = None

    # -- threading.Thread's interface ----------------------------------------------------

    def start(self) -> None:
        """Start the function. Raises ``RuntimeError`` if called twice, and the pickling
        errors (``TypeError``, ``ValueError`` for an argument over 1 MiB) right here."""
        if self._future is not None:
            raise RuntimeError("threads can only be started once")
        future = Invocation(self._name)
        if type(self).run is Thread.run:
            fn, args, kwargs = self._target, self._args, self._kwargs
            if fn is None:
                fn, args, kwargs = _nothing, (), {}
        else:  # a subclass overriding run(): ship the object and call its run()
            fn, args, kwargs = type(self).run, (self,), {}
        call = Call(future, fn, args, kwargs, options=self._options,
                    retries=self._retries, backoff=self._backoff, echo=self._echo)
        self._future = future
        if not self.daemon:
            keep_alive(future)
        with _alive_lock:
            _alive.add(self)
        future.add_done_callback(self._ended)
        call.start()

    def _ended(self, future: Invocation) -> None:
        with _alive_lock:
            _alive.discard(self)

    def run(self) -> Any:
        """What the function does: call the target (override in a subclass)."""
        if self._target is not None:
            return self._target(*self._args, **self._kwargs)
        return None

    def join(self, timeout: Optional[float] = None) -> None:
        """Wait until the function ends (or ``timeout`` seconds pass, as ``threading``).

        Re-raises the exception that ended it: the target's own (with the remote traceback as
        ``__cause__``), ``spindle.WorkerCrashed``, or ``spindle.FunctionTimeout``.
        """
        if self._future is None:
            raise RuntimeError("cannot join thread before it is started")
        try:
            self._future.exception(timeout)
        except TimeoutError:
            return
        error = self._future.exception(0)
        if error is not None:
            raise error

    def is_alive(self) -> bool:
        return self._future is not None and not self._future.done()

    @property
    def name(self) -> str:
        return self._name

    @name.setter
    def name(self, value: str) -> None:
        self._name = str(value)

    @property
    def ident(self) -> Optional[int]:
        """A number identifying the invocation once started (unique while it lives), else None."""
        return None if self._future is None else id(self._future)

    @property
    def native_id(self) -> Optional[int]:
        """The pid of the worker that ran the function (known once it ends)."""
        return None if self._future is None else self._future.report.get("worker")

    # -- what a cloud thread adds ----------------------------------------------------------

    @property
    def future(self) -> Optional[Invocation]:
        """The invocation's future: ``stdout``, ``stderr``, ``report``..."""
        return self._future

    @property
    def result(self) -> Any:
        """What the target returned (None until it ends; raises as :meth:`join` does)."""
        if self._future is None or not self._future.done():
            return None
        return self._future.result()

    @property
    def stdout(self) -> bytes:
        return b"" if self._future is None else self._future.stdout

    @property
    def stderr(self) -> bytes:
        return b"" if self._future is None else self._future.stderr

    def __getstate__(self) -> Dict[str, Any]:
        # A subclass's instance travels to the worker for run(): without its local future.
        state = dict(self.__dict__)
        state["_future"] = None
        return state

    def __repr__(self) -> str:
        status = "initial" if self._future is None else ("started" if self.is_alive() else "stopped")
        return f"<spindle.Thread({self._name}, {status})>"


def _nothing() -> None:
    return None
