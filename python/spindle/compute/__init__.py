"""The compute tier: run Python functions on the server's worker pool.

- :class:`Thread` mirrors ``threading.Thread`` (a cloud thread);
- :class:`Executor` is a ``concurrent.futures.Executor``;
- :func:`parallel_for` is CRUCIAL's ``invokeIterativeTask``;
- :class:`Invocation` is their future, with the function's output and report;
- :func:`register_function` names a function for the HTTP front end to invoke.

Functions and arguments travel with cloudpickle; shared objects inside them travel as
references, so functions reach the same objects as their caller.
"""

from .executor import Executor
from .invoker import MAX_ARGUMENT, Invocation
from .parallel import parallel_for, partition
from .registered import register_function
from .thread import Thread

__all__ = ["Executor", "Invocation", "MAX_ARGUMENT", "Thread", "parallel_for", "partition", "register_function"]
