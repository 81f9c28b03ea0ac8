"""Many tasks in one function call: ``Executor.map``'s batches.

A function call costs a round trip through the gateway and a pickled function, far more than
a tiny task; ``Executor.map`` therefore sends its tasks in batches (``run_each`` runs one in a
worker) and keeps each task's own result or exception apart, so ``map`` still yields the
results in order and raises a task's exception where its result would be, with the task's
remote traceback, as one call per task would.
"""

from __future__ import annotations

import pickle
import traceback
from typing import Any, Callable, List, Optional, Tuple

import cloudpickle

from ..errors import remote_exception, unpickled_exception

# A task's outcome: (True, value), or (False, (pickled exception or None, type, message,
# traceback)).
Outcome = Tuple[bool, Any]


def run_each(fn: Callable[..., Any], tasks: List[tuple]) -> List[Outcome]:
    """``fn(*args)`` for each task, in order (in a worker): each result, or what it raised."""
    outcomes: List[Outcome] = []
    for args in tasks:
        try:
            outcomes.append((True, fn(*args)))
        except BaseException as exc:  # as one call per task: SystemExit is the task's too
            outcomes.append((False, _failure(exc)))
    return outcomes


run_each._spindle_runs_argument = 0  # type: ignore[attr-defined]  # lost_updates watches fn


def _failure(exc: BaseException) -> Tuple[Optional[bytes], str, str, str]:
    tb = exc.__traceback__.tb_next if exc.__traceback__ is not None else None  # not ours
    try:
        message = str(exc)
    except Exception:  # a broken __str__
        message = f"<unprintable {type(exc).__name__}>"
    try:
        data: Optional[bytes] = cloudpickle.dumps(exc, protocol=pickle.HIGHEST_PROTOCOL)
        pickle.loads(data)  # some exceptions pickle but do not unpickle (required args)
    except BaseException:
        data = None
    text = "".join(traceback.format_exception(type(exc), exc, tb))
    return data, type(exc).__qualname__, message, text


def result(outcome: Outcome) -> Any:
    """A task's value, or its exception raised (with the remote traceback as its cause)."""
    ok, value = outcome
    if ok:
        return value
    data, type_name, message, tb = value
    raise remote_exception(unpickled_exception(data), type_name, message, tb)
