"""Functions that run in function workers for tests/test_shared.py.

This module never imports the shared classes of the tests: the proxies reach the workers as
references and become generic proxies there, as in a program whose functions do not import
the classes they use.
"""

from __future__ import annotations

from typing import Any, List

import spindle


def bump(counter: Any, times: int) -> List[int]:
    """Increment a user-defined counter ``times`` times; the values each call returned."""
    return [counter.incr() for _ in range(times)]


def describe(obj: Any) -> List[Any]:
    """What a worker sees of a proxy it received (it does not have the class)."""
    return [type(obj).__name__, isinstance(obj, spindle.Proxy), obj.key, obj.get()]


def reach_private(obj: Any) -> str:
    try:
        obj._secret  # noqa: B018
    except AttributeError as exc:
        return str(exc)
    return "no error"


def names_of(obj: Any) -> List[Any]:
    """A ``Badge``'s ``name()`` through the proxy passed here and through the one its ``me()``
    returns (neither class is here), and the proxy's ``key``."""
    return [obj.name(), obj.me().name(), obj.key]
