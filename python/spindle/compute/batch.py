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
from typing import Any, Callable, Dict, Iterable, Iterator, List, Optional, Tuple

import cloudpickle

from ..errors import remote_exception, unpickled_exception

# A task's failure: (pickled exception or None, type, message, traceback).
Failure = Tuple[Optional[bytes], str, str, str]
# What a batch returns: each task's value in order (None where it failed) and the failures by
# task index, so the common batch, with no failure, is one plain list both ways.
Outcomes = Tuple[List[Any], Dict[int, Failure]]


def run_each(fn: Callable[..., Any], tasks: List[Any], one: bool = False) -> Outcomes:
    """``fn(*args)`` for each task's arguments, or ``fn(arg)`` for each with ``one``, in order
    (in a worker): each result, and what any raised."""
    values: List[Any] = []
    failures: Dict[int, Failure] = {}
    for task in tasks:
        try:
            values.append(fn(task) if one else fn(*task))
        except BaseException as exc:  # as one call per task: SystemExit is the task's too
            failures[len(values)] = _failure(exc)
            values.append(None)
    return values, failures


run_each._spindle_runs_argument = 0  # type: ignore[attr-defined]  # lost_updates watches fn


def _failure(exc: BaseException) -> Failure:
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


def results(outcomes: Outcomes) -> Iterable[Any]:
    """The tasks' values in order; a failed task's exception is raised where its value would
    be (with the remote traceback as its cause)."""
    values, failures = outcomes
    return _raising(values, failures) if failures else values


def _raising(values: List[Any], failures: Dict[int, Failure]) -> Iterator[Any]:
    for index, value in enumerate(values):
        failure = failures.get(index)
        if failure is None:
            yield value
            continue
        data, type_name, message, tb = failure
        raise remote_exception(unpickled_exception(data), type_name, message, tb)
