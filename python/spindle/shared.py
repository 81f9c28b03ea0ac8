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
  anything in the server's Python. Its version is a hash of its source and of the helpers,
  constants and base classes its code uses, the same in every process that has that source,
  so two programs sharing a named object agree on the class, and an edited helper is a new
  version (servers and hosts keep a version's first code).
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
import types
import weakref
from typing import (Any, Callable, Dict, Iterator, List, Optional, Tuple, Type, TypeVar, Union,
                    overload)

import cloudpickle

from . import client as _client_mod
from . import proxy as _proxy
from .errors import SpindleError, UnknownType
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
    _persistent: bool = False  # @spindle.shared(persistent=True)

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
            client.define(cls._type, version, code, key)
            defined.add((cls._type, version))
        try:
            persistent = cls._persistent
            try:
                return bool(client.create(cls._type, key, payload, owned, True, persistent))
            except UnknownType:  # the server forgot the class (it restarted, say), or (in a
                # cluster) the object's shard is led by a node that has not seen it: define again
                client.define(cls._type, version, code, key)
                return bool(client.create(cls._type, key, payload, owned, True, persistent))
        except TypeError as exc:  # the constructor's arguments
            own = name is not None and not isinstance(exc, SpindleError)
            hint = _own_name_hint(cls, len(args), name) if own else None  # type: ignore[arg-type]
            if hint is None:
                raise
            raise TypeError(f"{exc}: {hint}") from exc

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


def _own_name_hint(cls: Type[SharedProxy], positional: int, name: str) -> Optional[str]:
    """Why a constructor given ``name=`` lacked its own parameter ``name``, if it has one that
    ``positional`` positional arguments do not cover (``name=`` is Spindle's)."""
    try:
        signature = inspect.signature(cls.__wrapped__.__init__)  # type: ignore[attr-defined]
    except (TypeError, ValueError):
        return None
    params = [p for p in list(signature.parameters.values())[1:]
              if p.kind is not inspect.Parameter.VAR_POSITIONAL]
    for index, param in enumerate(params):
        if param.name != "name":
            continue
        if param.kind is inspect.Parameter.KEYWORD_ONLY:
            return (f"{cls._qualname}'s own keyword-only parameter 'name' cannot be given, since "
                    "name= is the Spindle object's name: make it a positional parameter")
        if index >= positional:
            return (f"name={name!r} is the Spindle object's name, not {cls._qualname}'s own "
                    "parameter 'name', which can only be given positionally: "
                    f"{cls._qualname}(<its name>, ..., name={name!r})")
    return None


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
        return _remote_method(name).__get__(self)


_GENERIC: Dict[Tuple[str, Tuple[str, ...]], Type[GenericSharedProxy]] = {}
_GENERIC_LOCK = threading.Lock()


def generic_proxy_class(type_name: str, overriding: Tuple[str, ...] = ()) -> Type[SharedProxy]:
    """The proxy class for ``type_name`` (``py:...``): the decorated class's when this
    process has one, else a generic one (whose every public attribute is a remote method, as
    are ``overriding``: the class's methods named like a proxy attribute)."""
    registered = _proxy._TYPES.get(type_name)
    if registered is not None:
        return registered  # type: ignore[return-value]
    with _GENERIC_LOCK:
        cls = _GENERIC.get((type_name, overriding))
        if cls is None:
            qualname = type_name[3:].rpartition(".")[2] or type_name
            namespace: Dict[str, Any] = {"_type": type_name, "_qualname": type_name[3:],
                                         "_overriding": overriding}
            namespace.update((n, _remote_method(n)) for n in overriding
                             if n in _proxy.PROXY_ATTRIBUTES)
            cls = type(qualname, (GenericSharedProxy,), namespace)
            _GENERIC[(type_name, overriding)] = cls
        return cls


# -- shipping a class ---------------------------------------------------------------------


_INSTALLED: Dict[str, bool] = {}  # by module name, for modules imported here
_SDK = __name__.partition(".")[0]


def installed(module_name: str) -> bool:
    """Whether a module comes from the standard library or an installed package (then the
    hosts import it by name; anything else travels by value)."""
    known = _INSTALLED.get(module_name)
    if known is not None:
        return known
    if module_name == "__main__":
        return False
    if module_name in sys.builtin_module_names or module_name.partition(".")[0] == _SDK:
        return True  # the hosts run Spindle: its modules are there, however it is installed
    module = sys.modules.get(module_name)
    path = getattr(module, "__file__", None) if module is not None else None
    if not path:
        return False
    path = os.path.normcase(os.path.realpath(path))
    parts = path.split(os.sep)
    known = "site-packages" in parts or "dist-packages" in parts or any(
        path.startswith(d + os.sep) for d in _INSTALLED_DIRS)
    _INSTALLED[module_name] = known
    return known


class _ClassPickler(cloudpickle.Pickler):
    """cloudpickle for the hosts: the classes and functions of the program's own modules by
    value (the hosts cannot import them: a class's module, the sibling module its helper
    comes from, an argument's class's), and proxy classes by name (a method that mentions
    its own decorated class, or another one, gets in the host the proxy class of that type).
    Only under ``_PICKLE_LOCK``: cloudpickle's by-value registry is global."""

    def __init__(self, file: Any) -> None:
        super().__init__(file, protocol=pickle.HIGHEST_PROTOCOL)
        self.registered: List[Any] = []  # modules this pickler made by-value

    def reducer_override(self, obj: Any) -> Any:
        if isinstance(obj, type):
            if issubclass(obj, SharedProxy) and obj._type:
                return (generic_proxy_class, (obj._type,))
            self._by_value(obj.__module__)
            _track(obj)
        elif isinstance(obj, types.FunctionType):
            self._by_value(obj.__module__)
        # cloudpickle defines it on CPython only (on PyPy its pickler is pickle's own).
        fallback = getattr(super(), "reducer_override", None)
        return NotImplemented if fallback is None else fallback(obj)

    def _by_value(self, name: Any) -> None:
        module = sys.modules.get(name) if isinstance(name, str) else None
        if module is None or name == "__main__" or installed(name):
            return  # cloudpickle takes __main__'s by value itself
        if name not in cloudpickle.list_registry_pickle_by_value():
            cloudpickle.register_pickle_by_value(module)
            self.registered.append(module)


def _track(cls: type) -> None:
    """Give a class that travels by value a cloudpickle tracker id made from its version.

    cloudpickle gives each class it pickles by value a random id, and a process receiving it
    keeps the class under that id, so that the class coming back (an instance a method
    returns, an exception it raises) is the sender's very class. But a server keeps the first
    code sent for a version: in a second program, or the same program run again, the hosts'
    classes would carry the first program's ids, and results and exceptions would be of
    look-alike classes (``except MyError`` would not catch). An id from the class's name and
    version (its source and what it uses) is the same in every program with that code, and
    another for edited code (a host holding the old class would give it for the new).
    (cloudpickle has no public way to choose ids; without its tracker, ids stay random.)
    """
    by_class = getattr(cloudpickle.cloudpickle, "_DYNAMIC_CLASS_TRACKER_BY_CLASS", None)
    by_id = getattr(cloudpickle.cloudpickle, "_DYNAMIC_CLASS_TRACKER_BY_ID", None)
    lock = getattr(cloudpickle.cloudpickle, "_DYNAMIC_CLASS_TRACKER_LOCK", None)
    if by_class is None or by_id is None or lock is None or cls in by_class:
        return
    if installed(cls.__module__):  # travels by reference
        return
    version = _source_version(cls)  # another version (a helper edited): another class
    if version is None:  # cloudpickle gives it a random id
        return
    name = f"{cls.__module__}.{cls.__qualname__}"
    tracker_id = hashlib.sha256(f"{name}\0{version}".encode()).hexdigest()[:32]
    with lock:
        if cls not in by_class:
            by_class[cls] = tracker_id
            by_id[tracker_id] = cls  # a class of that source defined again: the latest


_PICKLE_LOCK = threading.Lock()


def pickle_by_value(obj: Any) -> bytes:
    """``obj`` (a class, an argument, a result) cloudpickled for another process: see
    :class:`_ClassPickler`."""
    with _PICKLE_LOCK:
        buf = io.BytesIO()
        pickler = _ClassPickler(buf)
        try:
            pickler.dump(obj)
            return buf.getvalue()
        finally:
            for module in pickler.registered:
                cloudpickle.unregister_pickle_by_value(module)


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
        for fn in _functions_of(value):
            code = fn.__code__
            # Only functions of the class's body can tell (not a dataclass's generated ones,
            # made from strings, nor a decorator's wrappers).
            if code.co_filename.startswith("<") or not fn.__qualname__.startswith(
                    cls.__qualname__ + "."):
                continue
            if (os.path.realpath(code.co_filename) != filename
                    or not first <= code.co_firstlineno < end):
                return None
    return "".join(lines)


def _source_version(cls: type) -> Optional[str]:
    """The version of a class with a known source: the SHA-256 of its source (or stand-in) and
    of what its code uses (:func:`_uses`)."""
    try:
        source = _source(cls) or _stand_in(cls)
        if source is None:
            return None
        digest = hashlib.sha256(source.encode())
        for part in _uses(cls):
            digest.update(b"\0" + part.encode("utf-8", "surrogatepass"))
        return digest.hexdigest()
    except Exception:  # inspect failing on an unusual class: a version from the pickle
        return None


_CONSTANTS = (bool, int, float, complex, str, bytes, type(None))


def _global_names(code: Any) -> Iterator[str]:
    """The global (and attribute) names a code object and the code nested in it mention."""
    yield from code.co_names
    for const in code.co_consts:
        if inspect.iscode(const):
            yield from _global_names(const)


def _functions_of(value: Any) -> List[Any]:
    """The functions behind a class attribute (a method, a property's accessors...)."""
    if isinstance(value, property):
        return [f for f in (value.fget, value.fset, value.fdel) if f is not None]
    try:
        value = inspect.unwrap(getattr(value, "__func__", value))
    except ValueError:  # a __wrapped__ cycle
        return []
    return [value] if inspect.isfunction(value) else []


def _functions(obj: Any) -> Iterator[Any]:
    """The functions of a class's own namespace, or ``obj``."""
    for value in vars(obj).values() if isinstance(obj, type) else [obj]:
        yield from _functions_of(value)


def _stand_in(cls: type) -> Optional[str]:
    """A stand-in for the source of a class ``inspect`` cannot find, made of what it finds.

    ``inspect`` looks for a class in its module's file: a notebook's ``__main__`` has none, so
    a class of a cell has no source, and a version from its pickle would change each time the
    cell runs, and in each kernel (a named object could not be constructed again). Its
    methods' sources are found by their code: with the class's name, bases and plain
    attributes they stand in. None when a method has no source either (``exec``).
    """
    bases = ", ".join(f"{b.__module__}.{b.__qualname__}" for b in cls.__bases__)
    parts = [f"class {cls.__qualname__}({bases})"]
    for name, value in vars(cls).items():
        if name == "__firstlineno__":  # moves with the cell's other lines
            continue
        functions = _functions_of(value)
        if isinstance(value, type) and value.__qualname__.startswith(cls.__qualname__ + "."):
            nested = _stand_in(value)  # a class defined in this one
            if nested is None:
                return None
            parts.append(nested)
        elif isinstance(value, type):
            parts.append(f"{name}: {value.__module__}.{value.__qualname__}")
        elif functions:
            for fn in functions:
                try:
                    parts.append(inspect.getsource(fn))
                except Exception:
                    return None
        elif _plain(value) is not None:
            parts.append(f"{name} = {_plain(value)}")
        else:
            parts.append(f"{name}: {type(value).__module__}.{type(value).__qualname__}")
    return "\n".join(parts)


def _constant(value: Any) -> str:
    """A plain constant as text for a version (a long one by its hash)."""
    if isinstance(value, (str, bytes)) and len(value) > 256:
        data = value.encode("utf-8", "surrogatepass") if isinstance(value, str) else value
        return f"{type(value).__name__} {hashlib.sha256(data).hexdigest()}"
    try:
        return repr(value)
    except ValueError:  # an int over the digits limit
        return hex(value)


def _plain(value: Any, depth: int = 0) -> Optional[str]:
    """A constant as text for a version: a plain value, or a small list, tuple or dict of them
    (in order: the same in every process that builds it alike); None for anything else."""
    if isinstance(value, _CONSTANTS):
        return _constant(value)
    if depth >= 2 or type(value) not in (list, tuple, dict) or len(value) > 256:
        return None
    items = [x for pair in value.items() for x in pair] if type(value) is dict else value
    texts = [_plain(item, depth + 1) for item in items]
    if None in texts:
        return None
    return f"{type(value).__name__}({', '.join(texts)})"  # type: ignore[arg-type]


def _uses(cls: type) -> List[str]:
    """What a class's code uses besides its own source, as text for its version.

    Servers and hosts keep the first code they get for a version, so a program that edits a
    helper of a class (a function or class of its own modules the methods name, a module
    constant, a base class) and runs again must send a new version, not run the old code.
    Functions and classes of the program's own modules count by their source (and what they
    use, recursively), plain constants (and small lists, tuples and dicts of them) by their
    value, anything else by its type.
    """
    parts: List[str] = []
    seen = {cls}
    todo: List[Any] = [cls]
    while todo:
        obj = todo.pop(0)
        named: List[Tuple[str, Any]] = []
        if isinstance(obj, type):
            named += [("base", base) for base in obj.__bases__]
            named += [("nested", v) for v in vars(obj).values() if isinstance(v, type)]
        for fn in _functions(obj):
            names = sorted(set(_global_names(fn.__code__)))
            named += [(name, fn.__globals__[name]) for name in names if name in fn.__globals__]
        for name, value in named:
            if isinstance(value, type) and issubclass(value, SharedProxy):
                parts.append(f"{name}: shared {value._type}")
            elif inspect.ismodule(value):
                parts.append(f"{name}: module {value.__name__}")
            elif _plain(value) is not None:
                parts.append(f"{name} = {_plain(value)}")
            elif (isinstance(value, type) or inspect.isfunction(value)) and not installed(
                    value.__module__):
                try:
                    source = inspect.getsource(value)
                except Exception:  # no source (a builtin, a class made by exec)
                    source = f"{value.__module__}.{value.__qualname__}"
                parts.append(f"{name}: {source}")
                if value not in seen:
                    seen.add(value)
                    todo.append(value)
            else:
                kind = value if isinstance(value, type) else type(value)
                parts.append(f"{name}: {kind.__module__}.{kind.__qualname__}")
    return parts


_CODE: "weakref.WeakKeyDictionary[type, Tuple[str, bytes]]" = weakref.WeakKeyDictionary()
_DECORATED: "weakref.WeakSet[type]" = weakref.WeakSet()  # proxy classes made in this process


def class_code(proxy_cls: Type[SharedProxy]) -> Tuple[str, bytes]:
    """``(version, code)`` of a decorated class, computed once per process.

    ``code`` is the cloudpickle of the class. ``version`` is the SHA-256 of its source and
    of the helpers, constants and base classes it uses (the same in every process with that
    source: :func:`_uses`; for a notebook's class, of a stand-in: :func:`_stand_in`), or of
    ``code`` when the source is unknown (a class made by ``exec``: then each program has its
    own version). It is kept on the proxy
    class, so a proxy class that travels by value (to a function constructing objects of
    it) keeps its version where the source cannot be found.
    """
    cls = proxy_cls.__wrapped__  # type: ignore[attr-defined]
    cached = _CODE.get(cls)
    if cached is not None:
        return cached
    try:
        code = pickle_by_value(cls)
    except Exception as exc:
        raise TypeError(
            f"cannot ship the class {cls.__module__}.{cls.__qualname__} to Spindle's object "
            f"hosts: it does not pickle ({type(exc).__name__}: {exc}). Keep locks, sockets, "
            "open files and the like out of class attributes (create them in __init__)"
        ) from exc
    # Again now, where the decorator ran before the module defined the helpers below it; a
    # proxy class decorated in another process keeps its version.
    version = (_source_version(cls) if proxy_cls in _DECORATED else None) or proxy_cls.__dict__.get(
        "_version")
    if version is None:
        version = hashlib.sha256(code).hexdigest()
    type.__setattr__(proxy_cls, "_version", version)
    _CODE[cls] = (version, code)
    return version, code


# -- the decorator ------------------------------------------------------------------------


def _remote_method(name: str, fn: Optional[Callable[..., Any]] = None) -> Callable[..., Any]:
    """The proxy's method ``name``; ``fn``: the class's own, when this process has it."""
    def method(self: SharedProxy, *args: Any, **kwargs: Any) -> Any:
        return self._remote(name, args, kwargs)

    if fn is None:
        method.__name__ = method.__qualname__ = name
    else:
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


def _proxy_class(cls: type, persistent: bool = False) -> Type[SharedProxy]:
    # A child that multiprocessing spawns imports the main script as __mp_main__: the same
    # classes as the parent's __main__ ones, so the same types.
    module = "__main__" if cls.__module__ == "__mp_main__" else cls.__module__
    type_name = f"py:{module}.{cls.__qualname__}"
    if len(type_name.encode()) > 256:
        raise ValueError(f"the type name {type_name!r} is over 256 bytes")
    namespace: Dict[str, Any] = {
        "__module__": cls.__module__,
        "__qualname__": cls.__qualname__,
        "__doc__": cls.__doc__,
        "__wrapped__": cls,
        "_qualname": cls.__qualname__,
        "_version": _source_version(cls),
        "_persistent": persistent,
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
        elif isinstance(raw, property):
            refused[name] = "a property"
        elif inspect.isdatadescriptor(raw):  # a slot, say
            refused[name] = "an attribute"
        elif callable(getattr(cls, name, None)):
            namespace[name] = _remote_method(name, getattr(cls, name))
        else:
            refused[name] = "an attribute"
    namespace["_refused"] = refused
    namespace["_overriding"] = _proxy.overriding_methods(cls)

    def __init__(self: SharedProxy, *args: Any, name: Optional[str] = None, **kwargs: Any) -> None:
        self._construct(args, kwargs, name)

    __init__.__qualname__ = f"{cls.__qualname__}.__init__"
    __init__.__doc__ = _INIT_DOC
    signature = _init_signature(cls)
    __init__.__signature__ = signature  # type: ignore[attr-defined]
    namespace["__init__"] = __init__
    namespace["__signature__"] = signature.replace(parameters=list(signature.parameters.values())[1:])
    proxy_cls = type(cls.__name__, (SharedProxy,), namespace, type_name=type_name)
    _DECORATED.add(proxy_cls)
    return proxy_cls


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
    - ``persistent=True``: the objects survive a crash of their host (a method calling
      ``os._exit``, one past the object call timeout) and a restart of the server, with no
      acknowledged call lost. The server needs ``--data-dir``. After the constructor and
      after every method call (returning or raising) the object's state
      (``__getstate__()``) is pickled and logged before the call returns, so methods need
      not be deterministic; a state that does not pickle is a ``TypeError`` and the object
      keeps its last logged state. See docs/durability.md, "Persistent user-defined objects".

    The class is shipped with cloudpickle (by value unless its module is an installed
    package) on first construction; one that does not pickle raises ``TypeError`` then.
    """
    def decorate(klass: C) -> C:
        if not isinstance(klass, type):
            raise TypeError(f"@spindle.shared decorates a class, not {type(klass).__name__}")
        if issubclass(klass, Proxy):
            raise TypeError(f"{klass.__qualname__} is a Spindle proxy class already")
        return _proxy_class(klass, bool(persistent))  # type: ignore[return-value]

    if cls is None:
        return decorate
    return decorate(cls)
