"""Lost updates: state a cloud function changes that stays in its worker.

With ``threading``, a thread that appends to a global list, bumps a module counter or sets
an attribute of the object whose method it runs changes the program's own state. A Spindle
function runs on a copy (its pickle), so the change stays in the worker and the caller reads
the old value: a silent wrong answer. The worker (:func:`watch` before the call,
:func:`changed` after) compares what the function can reach that way — its ``self`` when it
is a bound method of a plain object, the closure's variables, the module globals its code
names — and lists what changed in the report (``lost_updates``); the caller warns
(:func:`warn`) once per function and name.

Cheap by construction: only those values, immutable ones compared by identity, others by
their pickle (large buffers by checksum, pickle protocol 5); proxies (shared objects, whose
changes are the server's), modules, functions and classes are skipped, and so is a value
that does not pickle.
"""

from __future__ import annotations

import functools
import pickle
import threading
import types
import warnings
import zlib
from typing import Any, Dict, FrozenSet, List, Optional, Set, Tuple

import cloudpickle

from .errors import LostUpdateWarning
from .proxy import Proxy

_IMMUTABLE = (type(None), bool, int, float, complex, str, bytes, range, frozenset)
_SKIPPED = (types.ModuleType, types.FunctionType, types.BuiltinFunctionType, types.MethodType,
            type, property, staticmethod, classmethod)
_MISSING = object()

# What a watched value looked like: the value (by identity), and a fingerprint of its state
# (None for an immutable value).
Before = Tuple[Any, Optional[Tuple[bytes, Tuple[int, ...]]]]


def _fingerprint(value: Any) -> Optional[Tuple[bytes, Tuple[int, ...]]]:
    buffers: List[pickle.PickleBuffer] = []
    try:
        data = pickle.dumps(value, protocol=5, buffer_callback=buffers.append)
    except (pickle.PicklingError, AttributeError, TypeError):
        # A class shipped by value (of the caller's __main__) pickles by value only.
        buffers.clear()
        data = cloudpickle.dumps(value, protocol=5, buffer_callback=buffers.append)
    return data, tuple(zlib.crc32(b.raw()) for b in buffers)


def _watchable(value: Any) -> bool:
    return not isinstance(value, _SKIPPED) and not isinstance(value, Proxy)


def _state(value: Any) -> Optional[Before]:
    """``value`` and its fingerprint, or None when it is not watched."""
    if isinstance(value, _IMMUTABLE):
        return value, None
    if not _watchable(value):
        return None
    try:
        return value, _fingerprint(value)
    except Exception:  # does not pickle (a lock, a socket...): not watched
        return None


class Watch:
    """The watched state of one call's function: ``(kind, name) -> Before``."""

    __slots__ = ("fn", "before", "globals", "cells", "owner")

    def __init__(self, fn: Any) -> None:
        self.fn = fn
        self.before: Dict[Tuple[str, str], Before] = {}
        self.globals: Dict[str, Any] = {}
        self.cells: Dict[str, Any] = {}
        self.owner: Any = None


def watch(fn: Any, args: tuple) -> Optional[Watch]:
    """What ``fn`` (called with ``args``) can change without sharing it, as it is now. A
    batch runner (a function with ``_spindle_runs_argument = i``) stands for its argument i.
    Never raises: a check must not fail the call it watches."""
    try:
        return _watch(fn, args)
    except Exception:
        return None


def _watch(fn: Any, args: tuple) -> Optional[Watch]:
    target = getattr(fn, "_spindle_runs_argument", None)
    if target is not None and len(args) > target:  # a batch runner: the user's function
        fn = args[target]
    owner = None
    if isinstance(fn, types.MethodType):
        owner, fn = fn.__self__, fn.__func__
    if not isinstance(fn, types.FunctionType):
        return None
    w = Watch(fn)
    if owner is not None and not isinstance(owner, type) and _watchable(owner):
        state = _state(owner)
        if state is not None:
            w.owner = owner
            w.before[("self", type(owner).__qualname__)] = state
    code = fn.__code__
    for name, cell in zip(code.co_freevars, fn.__closure__ or ()):
        try:
            value = cell.cell_contents
        except ValueError:  # not yet assigned
            continue
        state = _state(value)
        if state is not None:
            w.cells[name] = cell
            w.before[("closure", name)] = state
    g = fn.__globals__
    for name in _global_names(code):
        value = g.get(name, _MISSING)
        if value is _MISSING:
            continue
        state = _state(value)
        if state is not None:
            w.globals[name] = g
            w.before[("global", name)] = state
    return w if w.before else None


@functools.lru_cache(maxsize=1024)
def _global_names(code: types.CodeType) -> FrozenSet[str]:
    """The global names a function's code (and the code nested in it) uses."""
    names = set(code.co_names)
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            names |= _global_names(const)
    return frozenset(names)


def changed(w: Optional[Watch]) -> List[Dict[str, Any]]:
    """What the call changed of what :func:`watch` saw: the report's ``lost_updates``."""
    if w is None:
        return []
    code = w.fn.__code__
    lost = []
    for (kind, name), before in w.before.items():
        try:
            differs = _differs(w, kind, name, before)
        except Exception:  # never fails the call (an odd __eq__ or __getattr__, say)
            continue
        if differs:
            lost.append({"kind": kind, "name": name, "function": w.fn.__qualname__,
                         "file": code.co_filename, "line": code.co_firstlineno})
    return lost


def _differs(w: Watch, kind: str, name: str, before: Before) -> bool:
    value, fingerprint = before
    if kind == "self":
        now = w.owner
    elif kind == "closure":
        try:
            now = w.cells[name].cell_contents
        except ValueError:  # deleted
            return True
    else:
        now = w.globals[name].get(name, _MISSING)
    if now is not value:  # rebound
        return True
    if fingerprint is None:  # immutable
        return False
    try:
        return _fingerprint(now) != fingerprint
    except Exception:  # no longer pickles: say nothing
        return False


_warned: Set[Tuple[str, int, str, str]] = set()
_warned_lock = threading.Lock()


def warn(lost: Any) -> None:
    """Warn :class:`LostUpdateWarning` for a report's ``lost_updates``, once per site."""
    if not isinstance(lost, list):
        return
    for entry in lost:
        if not isinstance(entry, dict):
            continue
        kind, name, function = entry.get("kind"), entry.get("name"), entry.get("function")
        file, line = entry.get("file"), entry.get("line")
        if not all(isinstance(v, str) for v in (kind, name, function, file)) or not isinstance(line, int):
            continue
        site = (file, line, kind, name)
        with _warned_lock:
            if site in _warned:
                continue
            _warned.add(site)
        try:
            warnings.warn_explicit(_message(kind, name, function), LostUpdateWarning, file, line)
        except Exception:  # an "error" filter: nothing here may raise (the reply's thread)
            pass


def _message(kind: str, name: str, function: str) -> str:
    if kind == "self":
        return (
            f"{function} ran as a spindle function and changed the attributes of its "
            f"{name} object, in the worker only: the caller's {name} never sees the change. "
            f"Make {name} a @spindle.shared class (its methods then run in the server on one "
            "shared object), or keep the state in a spindle.Dict"
        )
    what = "the module global" if kind == "global" else "the variable it closes over,"
    return (
        f"{function} ran as a spindle function and changed {what} {name!r}, in the worker "
        f"only: the caller's {name!r} never sees the change. Keep it in a spindle object "
        "(spindle.Dict, spindle.List, spindle.Counter, or a @spindle.shared class), or return "
        "the value"
    )
