"""Compiled object types: WebAssembly modules whose exported functions are an object's
methods, run inside the server next to the object's state (docs/wasm.md).

```python
Account = spindle.wasm_type("examples/wasm/build/bank.wasm")   # a class, like @spindle.shared's
a = Account(100, name="alice")     # runs the module's `init` in the server
a.deposit(5)                       # one round trip; the method runs in the server
```

The module is sent to the server once per version (the SHA-256 of its bytes) and compiled
there; the server refuses a module that does not keep the ABI, saying what is missing. A
method's arguments and result travel as MessagePack values (None, bool, int, float, str,
bytes, lists and dicts of them).
"""

from __future__ import annotations

import hashlib
import os
import threading
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Tuple, Type, Union

from . import client as _client_mod
from .errors import UnknownType
from .proxy import Proxy, validate_name

PREFIX = "wasm:"


class CompiledProxy(Proxy):
    """Base class of the classes :func:`wasm_type` returns: a proxy whose methods are the
    module's exports."""

    _version: str = ""
    _code: bytes = b""
    _methods: Tuple[str, ...] = ()
    _persistent: bool = False

    def __init__(self, *args: Any, name: Optional[str] = None, persistent: Optional[bool] = None) -> None:
        cls = type(self)
        client = _client_mod.current()
        owned = name is None
        self._key = client.unnamed_key() if owned else validate_name(name)
        durable = cls._persistent if persistent is None else persistent
        payload = [cls._version, list(args)]
        try:
            client.create(cls._type, self._key, payload, owned, persistent=durable)
        except UnknownType:  # the server forgot the module (it restarted), or in a cluster
            # the object's shard is led by a node that has not seen it: define it there
            _define(client, cls._type, cls._version, cls._code, self._key)
            client.create(cls._type, self._key, payload, owned, persistent=durable)

    def __getattr__(self, name: str) -> Any:
        raise AttributeError(
            f"{type(self).__name__} has no method {name!r} (its module exports: "
            f"{', '.join(type(self)._methods) or 'none'})"
        )

    def __repr__(self) -> str:
        return f"<{self._type} {self._key!r}>"


class GenericCompiledProxy(Proxy):
    """A proxy for an object of a compiled type whose module this process does not have (a
    function worker that received a proxy): any public attribute is a method."""

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        return _method(name).__get__(self)

    def __repr__(self) -> str:
        return f"<{self._type} {self._key!r}>"


def _method(name: str) -> Callable[..., Any]:
    def method(self: Proxy, *args: Any) -> Any:
        return self._call(name, list(args))

    method.__name__ = method.__qualname__ = name
    return method


def _define(client: Any, type_name: str, version: str, code: bytes, key: Optional[str] = None) -> List[str]:
    methods = client.define(type_name, version, code, key)
    if not isinstance(methods, list):
        raise TypeError(f"the server answered define of {type_name} with {methods!r}, not its methods")
    return [str(m) for m in methods]


def wasm_type(module: Union[str, "os.PathLike[str]", bytes], name: Optional[str] = None, *,
              persistent: bool = False) -> Type[CompiledProxy]:
    """The class of a compiled object type: ``module`` is a ``.wasm`` file (a path) or its
    bytes; ``name`` the type's name (default: the file's stem), so objects are
    ``wasm:<name>``. Its objects are persistent by default when ``persistent`` is set (each
    constructor takes ``persistent=`` too). Defines the module in the server, which refuses
    one that breaks the ABI (``TypeError`` saying what is wrong)."""
    if isinstance(module, (bytes, bytearray, memoryview)):
        code = bytes(module)
        if name is None:
            raise TypeError("wasm_type(bytes) needs name=: the type's name")
    else:
        path = Path(module)
        code = path.read_bytes()
        name = name or path.stem
    if not name or not isinstance(name, str):
        raise ValueError(f"a compiled type's name must be a non-empty str, not {name!r}")
    type_name = PREFIX + name
    version = hashlib.sha256(code).hexdigest()
    methods = _define(_client_mod.current(), type_name, version, code)
    namespace: Dict[str, Any] = {"_type": type_name, "_version": version, "_code": code,
                                 "_methods": tuple(methods), "_persistent": persistent,
                                 "__doc__": f"Objects of the WebAssembly module {name} ({version[:12]})."}
    for method in methods:
        if method.startswith("_") or method in ("key", "name"):
            continue  # proxy attributes: spindle.call(obj, method) reaches these
        namespace[method] = _method(method)
    with _LOCK:
        cls = type(name, (CompiledProxy,), namespace)
        _CLASSES[type_name] = cls
    return cls


_CLASSES: Dict[str, Type[CompiledProxy]] = {}
_GENERIC: Dict[str, Type[GenericCompiledProxy]] = {}
_LOCK = threading.Lock()


def proxy_class(type_name: str) -> Type[Proxy]:
    """The proxy class for ``type_name`` (``wasm:...``): the one :func:`wasm_type` made in
    this process, else a generic one."""
    with _LOCK:
        cls: Optional[Type[Proxy]] = _CLASSES.get(type_name)
        if cls is None:
            cls = _GENERIC.get(type_name)
            if cls is None:
                cls = _GENERIC[type_name] = type(type_name[len(PREFIX):] or type_name,
                                                 (GenericCompiledProxy,), {"_type": type_name})
        return cls
