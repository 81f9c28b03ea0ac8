"""Proxies: local handles on objects that live in the server, named by ``(type, key)``.

A proxy holds only its reference. Pickling it ships the reference (never the state), so a
proxy passed to a ``multiprocessing`` child, or inside a value stored in another object,
reaches the same server object.
"""

from __future__ import annotations

import inspect
from typing import Any, ClassVar, Dict, List, Optional, Tuple, Type, TypeVar, Union

from . import client as _client_mod
from .errors import BlockingCallError, Moved

P = TypeVar("P", bound="Proxy")

_TYPES: Dict[str, Type["Proxy"]] = {}

# The public attributes of every proxy. A user-defined class may have methods of these names:
# its proxies' methods win, and a reference names them, so that a proxy made where the class
# is absent (a generic proxy) has them as methods too.
PROXY_ATTRIBUTES = ("key", "name")

# The shared object's method running in this process, set by ``spindle.host`` around each
# constructor and method call (None elsewhere, so the check costs one global read).
running_method: Optional[str] = None


def refuse_waiting(what: str) -> None:
    """Raise :class:`BlockingCallError` if a shared object's method is running here.

    Every SDK call that could wait calls this first (docs/protocol.md, "Methods do not
    wait"): a host runs one call at a time, so a method waiting for another call (a lock's
    release, a queue's item, another object's host) could wait forever; refusing before
    anything is sent turns a hang until the call timeout into an error at the line at fault.
    """
    method = running_method
    if method is not None:
        raise BlockingCallError(
            f"{what} is refused inside {method}, a method of a shared object: it could wait, "
            "and the object's host runs one call at a time, so a method must not wait for "
            "other calls (nor call other shared objects or start functions). Use a "
            "non-waiting form (blocking=False, block=False, timeout=0...) or do the waiting "
            "in the caller."
        )


def validate_name(name: Any) -> str:
    """Check a user-given object name: a non-empty ``str`` not starting with ``~``."""
    if not isinstance(name, str):
        raise TypeError(f"a spindle object name must be a str, not {type(name).__name__}")
    if not name:
        raise ValueError("a spindle object name must not be empty")
    if name.startswith("~"):
        raise ValueError(
            f"invalid spindle object name {name!r}: names starting with '~' are reserved "
            "for unnamed objects"
        )
    return name


class Proxy:
    """Base class of every Spindle object proxy."""

    _type: ClassVar[str] = ""
    # The methods named like a proxy attribute (see `overriding_methods`).
    _overriding: ClassVar[Tuple[str, ...]] = ()
    _key: str

    def __init_subclass__(cls, type_name: Optional[str] = None, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if type_name is not None:
            cls._type = type_name
            _TYPES[type_name] = cls

    def _init(self, args: List[Any], name: Optional[str], persistent: bool = False) -> bool:
        """Create (or find, when named) the server object; True if it was created.
        ``persistent``: logged and recovered after a restart (durable types only)."""
        client = _client_mod.current()
        owned = name is None
        self._key = client.unnamed_key() if owned else validate_name(name)
        return client.create(self._type, self._key, args, owned, persistent=persistent)

    @classmethod
    def _attach(cls: Type[P], key: str) -> P:
        """A proxy for the existing object at ``key`` (nothing is sent to the server)."""
        obj = cls.__new__(cls)
        obj._key = key
        obj._attached()
        return obj

    def _attached(self) -> None:
        """Hook: set up local state of a proxy made by :meth:`_attach`."""

    def _call(self, method: str, args: List[Any], waits: bool = False) -> Any:
        """Call ``method`` in the server; ``waits``: this call could park (see
        :func:`refuse_waiting`)."""
        if waits and running_method is not None:
            refuse_waiting(f"spindle.{type(self).__name__}.{method}()")
        client = _client_mod._client
        if client is None:
            client = _client_mod.connect()
        try:
            return client.call(self._type, self._key, method, args)
        except Moved as moved:  # kept under a new key: follow it
            self._key = moved.new_key
            return self._call(method, args)

    @property
    def key(self) -> str:
        """The object's key in the server (``~...`` for an unnamed object)."""
        return self._key

    @property
    def name(self) -> Optional[str]:
        """The object's name, or None for an unnamed object."""
        return None if self._key.startswith("~") else self._key

    def _reference(self) -> List[Any]:
        """The wire form of this proxy: ``[type, key]``, then the overriding methods if any."""
        return reference(self._type, self._key, self._overriding)

    def __reduce__(self) -> Union[str, Tuple[Any, ...]]:
        return (from_reference, tuple(self._reference()))

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Proxy):
            return (self._type, self._key) == (other._type, other._key)
        return NotImplemented

    def __hash__(self) -> int:
        return hash((self._type, self._key))

    def __repr__(self) -> str:
        return f"<spindle.{type(self).__name__} {self._key!r}>"


def overriding_methods(cls: type) -> Tuple[str, ...]:
    """The methods of ``cls`` (a user-defined class, or its proxy class) named like a proxy
    attribute (``PROXY_ATTRIBUTES``): those its proxies call in the server (as
    ``@spindle.shared`` decides: not static or class methods, properties or data)."""

    def remote(name: str) -> bool:
        raw = inspect.getattr_static(cls, name, None)
        if raw is None or isinstance(raw, (staticmethod, classmethod, type, property)):
            return False
        return inspect.isfunction(raw) or (
            not inspect.isdatadescriptor(raw) and callable(getattr(cls, name, None)))

    return tuple(n for n in PROXY_ATTRIBUTES if remote(n))


def reference(type_name: str, key: str, overriding: Tuple[str, ...] = ()) -> List[Any]:
    """The wire form of a proxy (see :meth:`Proxy._reference`)."""
    return [type_name, key, list(overriding)] if overriding else [type_name, key]


def attach(type_name: str, key: str) -> Proxy:
    """A proxy for the object ``(type_name, key)``, without creating it. (A user-defined
    type's proxy made here without its class has the attributes ``key`` and ``name``, even if
    the class has methods of those names: call those with :func:`call`.)"""
    return from_reference(type_name, key)


def from_reference(type_name: str, key: str, overriding: Any = ()) -> Proxy:
    """The proxy of a reference (:func:`reference`)."""
    cls = _TYPES.get(type_name)
    if cls is None:
        if type_name.startswith("py:"):  # a user-defined type whose class is not here
            from .shared import generic_proxy_class

            cls = generic_proxy_class(type_name, tuple(overriding))
        elif type_name.startswith("wasm:"):  # a compiled type whose module is not here
            from .compiled import proxy_class

            cls = proxy_class(type_name)
        else:
            cls = type(type_name, (Proxy,), {"_type": type_name})
    return cls._attach(key)


def call(obj: Proxy, method: str, *args: Any) -> Any:
    """Call a server method by name (for methods the proxy class does not wrap)."""
    if obj._type.startswith("py:"):  # a user-defined object's method: [args, kwargs]
        return obj._call(method, [list(args), {}])
    return obj._call(method, list(args))


def delete(obj: Union[Proxy, str]) -> bool:
    """Delete an object (a proxy, or a name); True if it existed."""
    key = obj._key if isinstance(obj, Proxy) else validate_name(obj)
    return bool(_client_mod.current().delete(key))


def keep(obj: Proxy, name: Optional[str] = None) -> Proxy:
    """Make ``obj`` outlive its session; with ``name``, move it to that name. Returns ``obj``."""
    if name is not None:
        validate_name(name)
    client = _client_mod.current()
    while True:
        try:
            obj._key = client.keep(obj._type, obj._key, name)
            return obj
        except Moved as moved:
            obj._key = moved.new_key


def objects(prefix: str = "", *, persistent: bool = False) -> List[Tuple[str, str]]:
    """``(name, type)`` of the objects whose key starts with ``prefix``, sorted by name;
    ``persistent``: only the persistent ones."""
    return [(n, t) for n, t in _client_mod.current().objects(prefix, persistent)]


def status() -> Dict[str, Any]:
    """The server's status map (address, version, pid, objects, connections, calls...)."""
    return dict(_client_mod.current().status())
