"""User-defined shared objects: ``@spindle.shared`` classes whose methods run in the server.

```python
@spindle.shared
class Centroids:
    def __init__(self, k, dim): ...
    def update(self, sums, counts): ...

c = Centroids(25, 100)          # constructed in an object host; c is a proxy
c.update(sums, counts)          # one round trip; runs next to the object's state
```

The server owns the objects (names, sessions, exactly-once, deletion work as for the built-in
types) and runs their methods in object hosts, Python processes it supervises
(``spindle.host``; docs/protocol.md, "User-defined objects"). This module is the client
side: the decorator, the proxy classes, and shipping a class's code.

Why the rules below:

- Only public methods are shared. Reading an attribute of a proxy would need a round trip
  per read and would hide that the value is a copy, so attributes, properties and private
  names raise ``AttributeError`` (write a method that returns what you need).
- A class's code travels by value (cloudpickle) unless its module is an installed package,
  so classes of ``__main__``, of test modules and of notebooks work without installing
  anything in the server's Python. Its version is a hash of its source, the same in every
  process that has that source, so two programs sharing a named object agree on the class.
"""

from __future__ import annotations

import functools
import hashlib
import inspect
import io
import os
import pickle
import sys
import sysconfig
import threading
import weakref
from typing import Any, Callable, Dict, Optional, Tuple, Type, TypeVar, Union, overload

import cloudpickle

from . import client as _client_mod
from . import proxy as _proxy
from .errors import UnknownType
from .proxy import Proxy, refuse_waiting, validate_name

C = TypeVar("C", bound=type)

# Modules whose classes the hosts import by name instead of receiving by value.
_INSTALLED_DIRS = tuple(
    os.path.normcase(os.path.realpath(p))
    for p in {sysconfig.get_paths().get(k) for k in ("stdlib", "platstdlib", "purelib", "platlib")}
    if p
)


class SharedProxy(Proxy):
    """Base class of the proxy classes that ``@spindle.shared`` makes.

    A proxy holds only the object's reference ``(type, key)``; its public methods send
    ``call`` requests. ``_refused`` names the class's attributes that are not methods (for a
    clear ``AttributeError``).
    """

    _refused: Dict[str, str] = {}
    _qualname: str = ""
    _version: Optional[str] = None  # see class_code

    def __init_subclass__(cls, **kwargs: Any) -> None:
        for base in cls.__bases__:
            if "__wrapped__" in vars(base):  # a decorated class's proxy class
                raise TypeError(
                    f"cannot subclass the shared class {base.__qualname__}: subclass the "
                    f"class itself ({base.__qualname__}.__wrapped__) and decorate the subclass "
                    "with @spindle.shared"
                )
        super().__init_subclass__(**kwargs)

    def __init__(self, *args: Any, name: Optional[str] = None, **kwargs: Any) -> None:
        self._construct(args, kwargs, name)

    def _construct(self, args: Tuple[Any, ...], kwargs: Dict[str, Any], name: Optional[str]) -> bool:
        """Construct the object in a host (or attach to the named one); True if constructed."""
        cls = type(self)
        refuse_waiting(f"constructing the shared object {cls._qualname}")
        version, code = class_code(cls)
        client = _client_mod.current()
        if name is None:
            key, owned = client.unnamed_key(), True
        else:
            key, owned = validate_name(name), False
        self._key = key
        payload = [version, list(args), kwargs]
        defined = client.defined
        if (cls._type, version) not in defined:
            client.define(cls._type, version, code)
            defined.add((cls._type, version))
        try:
            return bool(client.create(cls._type, key, payload, owned, True))
        except UnknownType:  # the server forgot the class (it restarted, say): define again
            client.define(cls._type, version, code)
            return bool(client.create(cls._type, key, payload, owned, True))

    def _call(self, method: str, args: Any, waits: bool = False) -> Any:
        # A call on another user-defined object from inside a method could wait for this very
        # host (or for one busy with a call waiting for ours).
        if _proxy.running_method is not None:
            refuse_waiting(f"calling {self._qualname}.{method}() (a shared object's method)")
        # No `Moved` to follow: a user-defined object cannot be kept under another name.
        return _client_mod.current().call(self._type, self._key, method, args, True)

    def _remote(self, method: str, args: Tuple[Any, ...], kwargs: Dict[str, Any]) -> Any:
        return self._call(method, [list(args), kwargs])

    def __getattr__(self, name: str) -> Any:
        # Only reached when normal lookup fails: the class has no shared method `name`.
        qualname = type(self)._qualname
        if name.startswith("_"):
            raise AttributeError(
                f"{name!r} of the shared object {qualname} is not shared: only its public "
                "methods are (names starting with '_' stay inside the object)"
            )
        what = type(self)._refused.get(name)
        if what is not None:
            raise AttributeError(
                f"{name!r} is {what} of {qualname}, and attributes of a shared object are not "
                "shared, only its methods: add a method that returns it"
            )
        raise AttributeError(
            f"the shared object {qualname} has no method {name!r} (its attributes are not "
            "shared, only its methods)"
        )

    def __setattr__(self, name: str, value: Any) -> None:
        if not name.startswith("_"):
            raise AttributeError(
                f"cannot set {name!r} on a proxy of the shared object {type(self)._qualname}: "
                "its state lives in the server; change it with a method"
            )
        object.__setattr__(self, name, value)

    def __repr__(self) -> str:
        return f"<shared {self._qualname} {self._key!r}>"


class GenericSharedProxy(SharedProxy):
    """A proxy for a user-defined object whose class this process does not have (a function
    worker that received a proxy, say): any public attribute is a remote method."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        refuse_waiting(f"constructing the shared object {self._qualname}")
        raise TypeError(
            f"cannot construct {self._qualname} here: this process does not have the class "
            "(decorate it with @spindle.shared, or use spindle.attach for an existing object)"
        )

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            return SharedProxy.__getattr__(self, name)

        def method(*args: Any, **kwargs: Any) -> Any:
            return self._remote(name, args, kwargs)

        method.__name__ = method.__qualname__ = name
        return method


_GENERIC: Dict[str, Type[GenericSharedProxy]] = {}
_GENERIC_LOCK = threading.Lock()


def generic_proxy_class(type_name: str) -> Type[SharedProxy]:
    """The proxy class for ``type_name`` (``py:...``): the decorated class's when this
    process has one, else a generic one (whose every public attribute is a remote method)."""
    registered = _proxy._TYPES.get(type_name)
    if registered is not None:
        return registered  # type: ignore[return-value]
    with _GENERIC_LOCK:
        cls = _GENERIC.get(type_name)
        if cls is None:
            qualname = type_name[3:].rpartition(".")[2] or type_name
            cls = type(qualname, (GenericSharedProxy,), {"_type": type_name,
                                                        "_qualname": type_name[3:]})
            _GENERIC[type_name] = cls
        return cls


# -- shipping a class ---------------------------------------------------------------------


def _installed(module_name: str) -> bool:
    """Whether a module comes from the standard library or an installed package (then the
    hosts import it by name; anything else travels by value)."""
    if module_name == "__main__":
        return False
    module = sys.modules.get(module_name)
    path = getattr(module, "__file__", None) if module is not None else None
    if not path:
        return False
    path = os.path.normcase(os.path.realpath(path))
    parts = path.split(os.sep)
    if "site-packages" in parts or "dist-packages" in parts:
        return True
    return any(path.startswith(d + os.sep) for d in _INSTALLED_DIRS)


class _ClassPickler(cloudpickle.Pickler):
    """cloudpickle, with proxy classes travelling by name: a method that mentions its own
    decorated class (or another one) gets, in the host, the proxy class of that type."""

    def reducer_override(self, obj: Any) -> Any:
        if isinstance(obj, type) and issubclass(obj, SharedProxy) and obj._type:
            return (generic_proxy_class, (obj._type,))
        return super().reducer_override(obj)


_PICKLE_LOCK = threading.Lock()


def _pickle_class(cls: type) -> bytes:
    module = cls.__module__
    by_value = not _installed(module) and module in sys.modules and module != "__main__"
    with _PICKLE_LOCK:  # the by-value registry is global to cloudpickle
        register = by_value and module not in cloudpickle.list_registry_pickle_by_value()
        if register:
            cloudpickle.register_pickle_by_value(sys.modules[module])
        try:
            buf = io.BytesIO()
            _ClassPickler(buf, protocol=pickle.HIGHEST_PROTOCOL).dump(cls)
            return buf.getvalue()
        finally:
            if register:
                cloudpickle.unregister_pickle_by_value(sys.modules[module])


def _source(cls: type) -> Optional[str]:
    """The class's source, or None when unavailable or not surely this class's.

    ``inspect`` finds a class's source by its module's file and its qualname, so it may return
    another class's: the second of two classes with one qualname (defined twice in a function),
    or a class shipped by value to a process whose module of that name is another file (a
    ``__main__`` class in a function worker, whose ``__main__`` is Spindle's). The methods'
    files and line numbers must fall inside the text found.
    """
    try:
        filename = inspect.getsourcefile(cls)
        lines, first = inspect.getsourcelines(cls)
    except (OSError, TypeError):
        return None
    if filename is None:
        return None
    filename = os.path.realpath(filename)
    end = first + len(lines)
    for value in vars(cls).values():
        fn = getattr(value, "__func__", value)
        code = getattr(fn, "__code__", None)
        if code is not None and (os.path.realpath(code.co_filename) != filename
                                 or not first <= code.co_firstlineno < end):
            return None
    return "".join(lines)


def _source_version(cls: type) -> Optional[str]:
    """The version of a class with a known source: the SHA-256 of the source."""
    source = _source(cls)
    return None if source is None else hashlib.sha256(source.encode()).hexdigest()


_CODE: "weakref.WeakKeyDictionary[type, Tuple[str, bytes]]" = weakref.WeakKeyDictionary()


def class_code(proxy_cls: Type[SharedProxy]) -> Tuple[str, bytes]:
    """``(version, code)`` of a decorated class, computed once per process.

    ``code`` is the cloudpickle of the class. ``version`` is the SHA-256 of its source (the
    same in every process with that source), or of ``code`` when the source is unknown (a
    class made by ``exec``: then each program has its own version). It is kept on the proxy
    class, so a proxy class that travels by value (to a function constructing objects of
    it) keeps its version where the source cannot be found.
    """
    cls = proxy_cls.__wrapped__  # type: ignore[attr-defined]
    cached = _CODE.get(cls)
    if cached is not None:
        return cached
    try:
        code = _pickle_class(cls)
    except Exception as exc:
        raise TypeError(
            f"cannot ship the class {cls.__module__}.{cls.__qualname__} to Spindle's object "
            f"hosts: it does not pickle ({type(exc).__name__}: {exc}). Keep locks, sockets, "
            "open files and the like out of class attributes (create them in __init__)"
        ) from exc
    version = proxy_cls.__dict__.get("_version")
    if version is None:
        version = hashlib.sha256(code).hexdigest()
        type.__setattr__(proxy_cls, "_version", version)
    _CODE[cls] = (version, code)
    return version, code


# -- the decorator ------------------------------------------------------------------------


def _remote_method(name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    def method(self: SharedProxy, *args: Any, **kwargs: Any) -> Any:
        return self._remote(name, args, kwargs)

    # Name, docstring and (through __wrapped__) signature of the original, for help() and IDEs.
    functools.update_wrapper(method, fn)
    return method


def _init_signature(cls: type) -> inspect.Signature:
    """The constructor's signature plus the keyword-only ``name``."""
    params = [inspect.Parameter("self", inspect.Parameter.POSITIONAL_OR_KEYWORD)]
    if cls.__init__ is not object.__init__:  # type: ignore[misc]
        try:
            params = list(inspect.signature(cls.__init__).parameters.values())  # type: ignore[misc]
        except (TypeError, ValueError):
            pass
    if any(p.name == "name" for p in params):  # the class's own `name` (positional only here)
        return inspect.Signature(params)
    name = inspect.Parameter("name", inspect.Parameter.KEYWORD_ONLY, default=None,
                             annotation=Optional[str])
    var_kw = [p for p in params if p.kind is inspect.Parameter.VAR_KEYWORD]
    params = [p for p in params if p.kind is not inspect.Parameter.VAR_KEYWORD]
    return inspect.Signature(params + [name] + var_kw)


_INIT_DOC = """Construct the shared object in the server (arguments as the class's).

Unnamed (no ``name``): a fresh object living as long as this program's session. With
``name``: the object of that name, constructed by the first caller; later constructions
(from any program) attach to it and their other arguments are ignored. ``name`` is
Spindle's keyword: a constructor parameter called ``name`` can only be given positionally.
"""


def _proxy_class(cls: type) -> Type[SharedProxy]:
    type_name = f"py:{cls.__module__}.{cls.__qualname__}"
    if len(type_name.encode()) > 256:
        raise ValueError(f"the type name {type_name!r} is over 256 bytes")
    namespace: Dict[str, Any] = {
        "__module__": cls.__module__,
        "__qualname__": cls.__qualname__,
        "__doc__": cls.__doc__,
        "__wrapped__": cls,
        "_qualname": cls.__qualname__,
        "_version": _source_version(cls),
    }
    refused: Dict[str, str] = {}
    for name in dir(cls):
        if name.startswith("_"):
            continue
        try:
            raw = inspect.getattr_static(cls, name)
        except AttributeError:
            continue
        if isinstance(raw, (staticmethod, classmethod, type)):
            # They do not touch an instance's state: they run here, as plain functions (a
            # classmethod gets the proxy class, so ``cls(...)`` constructs a shared object).
            namespace[name] = raw
        elif inspect.isfunction(raw):
            namespace[name] = _remote_method(name, raw)
        elif isinstance(raw, property) or inspect.isdatadescriptor(raw):
            refused[name] = "a property"
        elif callable(getattr(cls, name, None)):
            namespace[name] = _remote_method(name, getattr(cls, name))
        else:
            refused[name] = "an attribute"
    namespace["_refused"] = refused

    def __init__(self: SharedProxy, *args: Any, name: Optional[str] = None, **kwargs: Any) -> None:
        self._construct(args, kwargs, name)

    __init__.__qualname__ = f"{cls.__qualname__}.__init__"
    __init__.__doc__ = _INIT_DOC
    signature = _init_signature(cls)
    __init__.__signature__ = signature  # type: ignore[attr-defined]
    namespace["__init__"] = __init__
    namespace["__signature__"] = signature.replace(parameters=list(signature.parameters.values())[1:])
    return type(cls.__name__, (SharedProxy,), namespace, type_name=type_name)


@overload
def shared(cls: C) -> C: ...


@overload
def shared(cls: None = None, *, persistent: bool = False) -> Callable[[C], C]: ...


def shared(cls: Optional[C] = None, *, persistent: bool = False) -> Union[C, Callable[[C], C]]:
    """Make a class's instances shared objects whose methods run in the server.

    ``@spindle.shared`` (or ``@spindle.shared(persistent=False)``) returns a proxy class:
    ``Centroids(25, 100)`` constructs an object in an object host and returns a proxy
    (``isinstance(c, Centroids)`` holds; the original class is ``Centroids.__wrapped__``).
    ``name=`` finds or constructs a named object (see ``Centroids.__init__``).

    - Every public method becomes a remote call: arguments and results travel as Spindle
      values (tuples, NumPy arrays, other proxies...). Calls on one object are linearizable;
      calls on objects of different hosts run in parallel. A method's exception is raised
      here with the remote traceback as its ``__cause__`` (``SystemExit`` too: the host
      stays). A method returning ``self`` returns the proxy.
    - Attributes, properties and names starting with ``_`` are not shared (``AttributeError``).
      Static methods, class methods and nested classes stay local: they run here.
    - Methods must not wait (blocking acquires, ``Queue.get()``, ``Future.result()``, calls on
      other shared objects, starting functions): such calls raise
      :class:`spindle.BlockingCallError` inside a method.
    - Proxies pickle as references; a process without the class gets a generic proxy.
    - ``persistent=True`` (objects that survive a host or server crash) is not supported yet.

    The class is shipped with cloudpickle (by value unless its module is an installed
    package) on first construction; one that does not pickle raises ``TypeError`` then.
    """
    if persistent:
        raise NotImplementedError(
            "persistent shared objects are not supported yet (durability comes later): "
            "use @spindle.shared or @spindle.shared(persistent=False)"
        )

    def decorate(klass: C) -> C:
        if not isinstance(klass, type):
            raise TypeError(f"@spindle.shared decorates a class, not {type(klass).__name__}")
        if issubclass(klass, Proxy):
            raise TypeError(f"{klass.__qualname__} is a Spindle proxy class already")
        return _proxy_class(klass)  # type: ignore[return-value]

    if cls is None:
        return decorate
    return decorate(cls)
