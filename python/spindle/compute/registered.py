"""Functions registered under a name, for callers that are no Python program: the HTTP front
end invokes ``POST /v1/functions/NAME`` with JSON arguments and answers the JSON result
(docs/http.md, "Functions").

A registered function is the pickle of the function in the ``Value`` named
``functions/NAME``: registering needs ``write`` on that name, and the server runs it only if
its writer may run code there (the pickle's stamp, docs/security.md), so a user who may only
write data cannot plant code that others' calls would run.
"""

from __future__ import annotations

from typing import Any, Callable, Optional

from ..data import Value

PREFIX = "functions/"


def register_function(fn: Callable[..., Any], name: Optional[str] = None) -> str:
    """Register ``fn`` as ``name`` (default: its ``__name__``); return the name. Registering
    again replaces it. ``fn`` travels like a function given to ``spindle.Thread``: by
    reference when workers can import its module, by value (cloudpickle) when it is of
    ``__main__``."""
    name = name or fn.__name__
    Value(name=PREFIX + name).set(fn)
    return name
