"""Values on the wire: MessagePack with extension types, and NumPy arrays.

- Plain values (None, bool, int, float, str, bytes, list, dict) are MessagePack.
- A tuple travels as ext type 3 whose body is the array of its items, so it comes back a
  tuple (the server compares and hashes it by its items). Arrays written by other clients
  come back as lists, or as tuples where a value must be hashable (dictionary keys).
- A dataclass instance travels as ext type 4 whose body is ``[module, qualname, {field:
  value...}]`` (its ``dataclasses.fields``, values encoded with this codec), when it is plain
  data: an instance of exactly a dataclass that pickles by reference (a module-level class),
  with no custom pickling, no ``__new__``, and no state besides its fields. The reader finds
  the class by name without running any of its code (a module not imported yet is imported
  only if it is public and its top-level package is imported already), checks it is such a
  dataclass with those very fields, and fills ``object.__new__(cls)`` field by field
  (``__init__`` does not run; frozen and slots dataclasses too). A class that cannot be found
  there, or does not fit, gives an :class:`UnknownDataclass` keeping the fields. A dataclass
  value never holds a pickle: one whose fields (at any depth) would need pickle pickles
  whole (ext 1), as does one inside itself; a reader refuses a pickle inside one.
- A NumPy array of a bool, integer, float or complex dtype (not ``longdouble``) travels as
  ext type 5 whose body is ``[dtype.str, [dim...], data]`` (the bytes in C order, in the byte
  order ``dtype.str`` names); it comes back a writable array. NumPy is imported only to
  decode one.
- A value with no other form (exact types only: a subclass such as a namedtuple or an
  IntEnum keeps its type this way) is pickled into ext type 1. Values for and from shared
  objects' methods (``ship``) fall back to cloudpickle, by value, for classes of ``__main__``
  and classes that do not pickle by reference; dataclasses pickle there too (the object host
  imports their classes as pickle does).
- The server stores every pickle a client writes (ext type 1 or 6, at any depth of a
  ``create`` or ``call``'s arguments) as ext type 6 whose body is ``[writer, trusted,
  pickle]``: the writing user, and whether that user could run code (define, invoke) then.
  A pickle is code to whoever unpickles it, so one is unpickled only if ``trusted``, or
  written by this process's own user (:func:`set_user`, from the server's hello), or by a
  writer the program trusts (:func:`trust`); any other raises
  :class:`spindle.UntrustedValue`, naming the writer, and is never unpickled. An object
  host has no own user. Ext type 1 values read (object hosts' results, values stored before
  stamping) are unpickled as before.
- A Spindle proxy travels as ext type 2 whose body is ``[type, key]`` and comes back as a
  proxy attached to the same object.
- NumPy arrays for ``Array`` objects travel as the map
  ``{"dtype": str, "shape": [int...], "data": bin}`` (C order, little-endian).

Values that do not decode here (a malformed body, a class not here) come back as
placeholders, :class:`Unpicklable` and its subclasses, which keep the data.
"""

from __future__ import annotations

import dataclasses
import importlib
import pickle
import re
import sys
import threading
import weakref
from typing import Any, Callable, Dict, FrozenSet, List, Optional, Tuple

import cloudpickle
import msgpack

from .errors import UndecodableValue, UntrustedValue

EXT_PICKLE = 1
EXT_REF = 2
EXT_TUPLE = 3
EXT_DATACLASS = 4
EXT_NDARRAY = 5
EXT_STAMPED = 6

ARRAY_DTYPES = ("float64", "float32", "int64")

# NumPy dtypes that travel as ext 5: kinds with a fixed, portable layout, by item size
# (``longdouble`` is left out: its bytes differ between platforms).
_DTYPE_STR = re.compile(r"[<>|=][biufc][0-9]{1,2}")  # as dtype.str: "<f8", "|b1", ">c16"
_NDARRAY_SIZES = {"b": (1,), "i": (1, 2, 4, 8), "u": (1, 2, 4, 8), "f": (2, 4, 8), "c": (8, 16)}

# This process's own user (its pickles are always unpickled here), set by the client from
# the server's hello reply; None: no own user (an object host, or not connected yet).
own_user: Optional[str] = None
# Writers whose pickles this process unpickles although they may not run code (`trust`).
trusted_writers: FrozenSet[str] = frozenset()


def set_user(name: Optional[str]) -> None:
    """Make ``name`` this process's own user (the client calls it with the server's hello
    reply): values it wrote are unpickled here whatever its permissions."""
    if name is not None and not isinstance(name, str):
        raise TypeError(f"a user name is a str, not {type(name).__name__}")
    global own_user
    own_user = name


def trust(*writers: str) -> None:
    """Unpickle, in this process, the values these users write even though they may not run
    code on the server (``spindle.trust("etl")``).

    A pickle is code: unpickling one runs what its writer chose, here, with this program's
    rights. Trust only users whose code this program could run anyway. The trust is this
    process's (functions and object hosts decide their own).
    """
    for writer in writers:
        if not isinstance(writer, str) or not writer:
            raise TypeError(f"a writer is a user name (a non-empty str), not {writer!r}")
    global trusted_writers
    trusted_writers = trusted_writers | frozenset(writers)


class Unpicklable:
    """A pickled value (ext type 1) that could not be unpickled in this process."""

    __slots__ = ("data", "error")

    def __init__(self, data: bytes, error: BaseException) -> None:
        self.data = data
        self.error = error

    def __repr__(self) -> str:
        return f"<spindle.codec.Unpicklable {len(self.data)} bytes: {self.error!r}>"


class Untrusted(Unpicklable):
    """A pickled value not unpickled because of its writer (``writer``; see
    :class:`spindle.UntrustedValue`, its ``error``). Only :func:`unpackb` with
    ``lenient=True`` gives these (and ``UntrustedValue.value``); reads raise instead."""

    __slots__ = ("writer",)

    def __init__(self, writer: str, data: bytes, error: BaseException) -> None:
        super().__init__(data, error)
        self.writer = writer

    def __repr__(self) -> str:
        return f"<spindle.codec.Untrusted {len(self.data)} bytes written by {self.writer!r}>"

    def __reduce__(self) -> Any:  # never as the pickle it holds (that would launder it)
        return (Untrusted, (self.writer, b"", self.error))


class Undecodable(Unpicklable):
    """A value of extension type ``code`` (4, 5, 6) that does not decode here: its body is
    malformed, or it needs what this process lacks (NumPy). ``data`` is the body, ``error``
    says why; written back, it travels as it came."""

    __slots__ = ("code",)

    def __init__(self, code: int, data: bytes, error: BaseException) -> None:
        super().__init__(data, error)
        self.code = code

    def __repr__(self) -> str:
        return (f"<spindle.codec.Undecodable ext type {self.code}, {len(self.data)} bytes: "
                f"{self.error!r}>")


class UnknownDataclass(Undecodable):
    """A dataclass value (ext type 4) whose class is not here or does not fit: ``module``,
    ``qualname`` and ``fields`` (a dict, decoded) keep what was written, ``error`` says why.
    Written back, it travels as it came."""

    __slots__ = ("module", "qualname", "fields")

    def __init__(self, data: bytes, module: str, qualname: str, fields: Dict[str, Any],
                 error: BaseException) -> None:
        super().__init__(EXT_DATACLASS, data, error)
        self.module = module
        self.qualname = qualname
        self.fields = fields

    def __repr__(self) -> str:
        items = ", ".join(f"{k}={v!r}" for k, v in self.fields.items())
        return (f"<spindle.codec.UnknownDataclass {self.module}.{self.qualname}({items}): "
                f"{self.error}>")


# Set by ``spindle.host`` while it packs a method's result: ``(object, type, key)`` of the
# method's object, which travels as a reference to itself wherever it is in the result (as
# ``return self`` does), never as a copy of its state.
shipping_self: Optional[Tuple[Any, str, str]] = None


# -- encoding -----------------------------------------------------------------------------


def _default(obj: Any, ship: bool = False, plain: bool = False) -> Any:
    """The MessagePack form of ``obj`` (for ``msgpack.packb``); ``plain``: inside a dataclass
    value, which holds no pickle (raises :class:`_NotPlain` where one would be needed)."""
    from .proxy import Proxy

    if type(obj) is tuple:
        if plain:
            return msgpack.ExtType(EXT_TUPLE, _packb_plain(list(obj)))
        return msgpack.ExtType(EXT_TUPLE, packb(list(obj), ship))
    if isinstance(obj, Proxy):
        return msgpack.ExtType(EXT_REF, msgpack.packb(obj._reference()))
    np = sys.modules.get("numpy")
    if np is not None:
        if isinstance(obj, np.generic):
            return obj.item()
        if type(obj) is np.ndarray and _ndarray_travels(obj.dtype):
            return msgpack.ExtType(EXT_NDARRAY, _encode_ndarray_ext(obj))
    if type(obj) in _PASSTHROUGH and obj.code != EXT_STAMPED:
        return msgpack.ExtType(obj.code, obj.data)  # a placeholder written back: as it came
    if ship:
        me = shipping_self
        if me is not None and obj is me[0]:
            from .proxy import overriding_methods, reference

            ref = reference(me[1], me[2], overriding_methods(type(obj)))
            return msgpack.ExtType(EXT_REF, msgpack.packb(ref))
        return msgpack.ExtType(EXT_PICKLE, _pickle_to_ship(obj))
    if "__dataclass_fields__" in type(obj).__dict__:
        ext = _dataclass_ext(obj)
        if ext is not None:
            return ext
    if plain:
        raise _NotPlain
    return msgpack.ExtType(EXT_PICKLE, _pickle_value(obj))


def _pickle_value(obj: Any) -> bytes:
    """A value's pickle: by reference (plain pickle) where its classes can be imported by
    name elsewhere; by value (cloudpickle) when one of them is of ``__main__`` (another
    process's ``__main__`` is another program, or Spindle's worker) or of no importable place
    (defined in a function), so that such values read anywhere as they do as arguments."""
    try:
        data = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    except (pickle.PicklingError, AttributeError, TypeError):
        return cloudpickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    # A class of __main__ pickles as the name "__main__" (a false match only costs speed).
    if b"__main__" in data:
        return cloudpickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    return data


def _default_plain(obj: Any) -> Any:
    return _default(obj, False, True)


def _packb_plain(value: Any) -> bytes:
    return msgpack.packb(value, default=_default_plain, use_bin_type=True, strict_types=True)


def _default_ship(obj: Any) -> Any:
    return _default(obj, True)


def _pickle_to_ship(obj: Any) -> bytes:
    """``obj`` pickled for a shared object's method in another process (or back from it).

    Plain pickle for instances of installed classes (fast, and the host imports them). An
    instance of a class of ``__main__`` or of the program's own modules pickles by reference
    but would mean another class, or no class, in the object host (whose ``__main__`` is
    Spindle's), and a class defined in a function, or shipped by value (a shared object's
    class, in its host), does not pickle by reference at all: those go by value with
    cloudpickle, which also gives them back as the very class they were in the process that
    sent that class first.
    """
    from .shared import installed, pickle_by_value

    module = type(obj).__module__
    if installed(module):
        try:
            return pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
        except Exception:
            pass
    return pickle_by_value(obj)


def _ndarray_travels(dtype: Any) -> bool:
    """Whether arrays of ``dtype`` travel as ext 5 (plain numbers or bools)."""
    return dtype.itemsize in _NDARRAY_SIZES.get(dtype.kind, ()) and dtype.names is None \
        and dtype.subdtype is None


def _encode_ndarray_ext(arr: Any) -> bytes:
    return msgpack.packb([arr.dtype.str, list(arr.shape), arr.tobytes(order="C")],
                         use_bin_type=True)


# Pickling hooks that make a class's pickle more than its fields.
_PICKLING = ("__reduce__", "__reduce_ex__", "__getstate__", "__setstate__", "__getnewargs__",
             "__getnewargs_ex__", "__new__")
_HEAPTYPE = 1 << 9  # Py_TPFLAGS_HEAPTYPE: a class defined in Python
# Whether a dataclass travels as ext 4 (see `_plain_dataclass`), by class.
_plain: "weakref.WeakKeyDictionary[type, bool]" = weakref.WeakKeyDictionary()
# Ids of the dataclass instances being encoded by this thread (to catch cycles).
_encoding = threading.local()


class _NotPlain(Exception):
    """Internal: a dataclass value would hold a pickle, or itself (pickle keeps cycles): it
    pickles whole instead."""


def _lookup(module: str, qualname: str, load: bool) -> Any:
    """The object ``module.qualname`` names, found through the modules' and classes'
    dictionaries (no ``__getattr__``, property or descriptor runs); None if there is none.
    ``load``: import the module if it is not yet (see :func:`_importable`)."""
    mod = sys.modules.get(module)
    if mod is None:
        if not load or not _importable(module):
            return None
        try:
            mod = importlib.import_module(module)
        except (Exception, SystemExit):
            return None
    obj = getattr(mod, "__dict__", None)
    obj = obj.get(qualname.split(".")[0]) if isinstance(obj, dict) else None
    for part in qualname.split(".")[1:]:
        if not isinstance(obj, type):
            return None
        obj = obj.__dict__.get(part)
    return obj


def _importable(module: str) -> bool:
    """Whether a dataclass value may import ``module`` to find its class: a public module
    (no part starts with ``_``) of a package this process imported already. Importing runs
    a module's code: a writer must not choose which installed module runs here."""
    parts = module.split(".")
    return (all(p.isidentifier() and not p.startswith("_") for p in parts)
            and parts[0] in sys.modules)


def _plain_dataclass(cls: type) -> bool:
    """Whether instances of ``cls`` are plain data that ext 4 carries whole: ``cls`` is a
    dataclass itself (not a subclass of one), pickles by reference, has no custom pickling
    or ``__new__``, no slots besides its fields, and no base of a built-in layout."""
    try:
        ok = _plain.get(cls)
    except TypeError:  # a metaclass making classes unhashable: no cache
        return _is_plain_dataclass(cls)
    if ok is None:
        ok = _is_plain_dataclass(cls)
        _plain[cls] = ok
    return ok


def _is_plain_dataclass(cls: Any) -> bool:
    if not isinstance(cls, type) or "__dataclass_fields__" not in cls.__dict__:
        return False
    module = cls.__dict__.get("__module__")
    qualname = cls.__dict__.get("__qualname__", cls.__qualname__)
    if not isinstance(module, str) or not isinstance(qualname, str):
        return False
    if not all(p.isidentifier() for p in qualname.split(".")):  # "<locals>"
        return False
    if module == "__main__":  # no other process has this class under that name: by value
        return False
    if _lookup(module, qualname, False) is not cls:  # does not pickle by reference
        return False
    import copyreg

    if cls in copyreg.dispatch_table:
        return False
    try:
        names = {f.name for f in dataclasses.fields(cls)}
    except TypeError:
        return False
    for klass in cls.__mro__:
        if klass is object:
            continue
        if not klass.__flags__ & _HEAPTYPE and (
            klass.__basicsize__ != object.__basicsize__ or klass.__itemsize__
        ):
            return False  # a built-in base (dict, int, Exception...) holds state of its own
        for name in _PICKLING:
            hook = klass.__dict__.get(name)
            # Frozen slots dataclasses get __getstate__/__setstate__ from dataclasses.
            if hook is not None and getattr(hook, "__module__", None) != "dataclasses":
                return False
        slots = klass.__dict__.get("__slots__", ())
        for slot in (slots,) if isinstance(slots, str) else slots:
            if slot not in names and slot not in ("__dict__", "__weakref__"):
                return False
    return True


def _dataclass_ext(obj: Any) -> Optional[msgpack.ExtType]:
    """``obj`` as ext 4, or None when it is not plain data (then it pickles)."""
    cls = type(obj)
    if not _plain_dataclass(cls):
        return None
    names = [f.name for f in dataclasses.fields(cls)]
    extra = getattr(obj, "__dict__", None)
    if extra and not set(extra) <= set(names):  # attributes besides the fields
        return None
    try:
        fields = {name: getattr(obj, name) for name in names}
    except AttributeError:  # a field never set (init=False, no default)
        return None
    active = _encoding.__dict__.setdefault("ids", set())
    if id(obj) in active:
        raise _NotPlain
    outermost = not active
    active.add(id(obj))
    try:
        body = _packb_plain([cls.__module__, cls.__qualname__, fields])
    except _NotPlain:
        if outermost:
            return None  # a field needs pickle: the whole value pickles
        raise
    finally:
        active.discard(id(obj))
    return msgpack.ExtType(EXT_DATACLASS, body)


# -- decoding -----------------------------------------------------------------------------


def _unpack(body: bytes, hook: Callable[[int, bytes], Any]) -> Any:
    return msgpack.unpackb(body, raw=False, strict_map_key=False, ext_hook=hook,
                           object_pairs_hook=_pairs_hook)


_HOOKS: Dict[Tuple[bool, bool, bool, bool], Callable[[int, bytes], Any]] = {}


class _PickleInside(ValueError):
    """Internal: a pickle (ext type 1 or 6) inside a dataclass value, which never holds one
    (its writer pickles the whole value instead): the value is refused, not unpickled."""

    def __init__(self) -> None:
        super().__init__("a dataclass value (ext type 4) holding a pickle: not decoded "
                         "(dataclass values never hold pickles)")


def ext_hook(own: bool = True, lenient: bool = False, strict: bool = False,
             pickles: bool = True) -> Callable[[int, bytes], Any]:
    """The ``ext_hook`` decoding Spindle's extension types (for ``msgpack.unpackb``).

    ``own``: unpickle what this process's own user wrote (an object host: False).
    ``lenient``: an untrusted pickle decodes to an :class:`Untrusted` placeholder instead of
    raising :class:`spindle.UntrustedValue`. ``strict``: raise the error of any value that
    does not decode here instead of giving a placeholder. ``pickles``: False inside a
    dataclass value, where a pickle is refused.
    """
    key = (own, lenient, strict, pickles)
    hook = _HOOKS.get(key)
    if hook is None:

        def hook(code: int, data: bytes) -> Any:
            value = _decode_ext(code, data, own, lenient, strict, pickles)
            if strict and isinstance(value, Unpicklable):
                raise value.error
            return value

        hook = _HOOKS.setdefault(key, hook)
    return hook


def _decode_ext(code: int, data: bytes, own: bool, lenient: bool, strict: bool,
                pickles: bool) -> Any:
    if code == EXT_TUPLE:
        return tuple(_unpack(data, ext_hook(own, lenient, strict, pickles)))
    if code == EXT_REF:
        from .proxy import from_reference

        return from_reference(*msgpack.unpackb(data, raw=False))
    if code == EXT_STAMPED or code == EXT_PICKLE:
        if not pickles:
            raise _PickleInside()
        if code == EXT_PICKLE:  # unstamped: an object host's result, or stored before stamps
            return _unpickle(data)
        return _decode_stamped(data, own, lenient)
    if code == EXT_DATACLASS:
        return _decode_dataclass(data, ext_hook(own, lenient, strict, False), strict)
    if code == EXT_NDARRAY:
        return _decode_ndarray_ext(data)
    return msgpack.ExtType(code, data)


def _unpickle(data: bytes) -> Any:
    try:
        return pickle.loads(data)
    except Exception as exc:  # a class this process cannot import, say
        return Unpicklable(data, exc)


def _decode_stamped(body: bytes, own: bool, lenient: bool) -> Any:
    """An ext 6 value: its pickle, unpickled only for a writer this process trusts."""
    try:
        stamp = msgpack.unpackb(body, raw=False)
        writer, trusted, data = stamp
        if type(writer) is not str or type(trusted) is not bool or type(data) is not bytes:
            raise TypeError("wrong types")
    except Exception as exc:
        return Undecodable(EXT_STAMPED, body, ValueError(
            f"a malformed stamped pickle (ext type 6 must be [writer, trusted, pickle]): {exc}"
        ))
    if trusted or writer in trusted_writers or (
            own and own_user is not None and writer == own_user):
        return _unpickle(data)
    exc = UntrustedValue(writer)
    if lenient:
        return Untrusted(writer, data, exc)
    raise exc


def _decode_dataclass(body: bytes, hook: Callable[[int, bytes], Any], strict: bool) -> Any:
    """An ext 4 value: an instance of its dataclass built from its fields (no code of the
    class runs), or an :class:`UnknownDataclass`."""
    try:
        module, qualname, fields = _unpack(body, hook)
        if type(module) is not str or type(qualname) is not str or type(fields) is not dict \
                or not all(type(k) is str for k in fields):
            raise TypeError("wrong types")
    except Exception as exc:
        if strict or isinstance(exc, UntrustedValue):
            raise
        return Undecodable(EXT_DATACLASS, body, ValueError(
            "a malformed dataclass value (ext type 4 must be [module, qualname, {field: "
            f"value...}}]): {exc}"
        ))
    name = f"{module}.{qualname}"
    if not (module and all(p.isidentifier() for p in module.split("."))
            and all(p.isidentifier() for p in qualname.split("."))):
        return UnknownDataclass(body, module, qualname, fields,
                                LookupError(f"{name!r} is not a class name"))
    cls = _lookup(module, qualname, True)
    if cls is None:
        why = f"no class {name} here" if module in sys.modules else (
            f"module {module!r} is not imported here (import it to read these values)")
        return UnknownDataclass(body, module, qualname, fields, LookupError(why))
    # (Looked up in the class's own dictionary: no metaclass __getattr__ runs.)
    if not (isinstance(cls, type) and _plain_dataclass(cls)):
        return UnknownDataclass(body, module, qualname, fields, TypeError(
            f"{name} here is not a dataclass whose values are plain data"))
    names = [f.name for f in dataclasses.fields(cls)]
    if set(names) != set(fields):
        missing = [n for n in names if n not in fields]
        unknown = [n for n in fields if n not in names]
        return UnknownDataclass(body, module, qualname, fields, TypeError(
            f"the fields of {name} here differ from the value's (missing: {missing}, "
            f"unknown: {unknown})"))
    try:
        obj = object.__new__(cls)
        for n in names:
            object.__setattr__(obj, n, fields[n])
    except Exception as exc:
        return UnknownDataclass(body, module, qualname, fields, exc)
    return obj


def _decode_ndarray_ext(body: bytes) -> Any:
    """An ext 5 value: a writable NumPy array, or an :class:`Undecodable`."""
    try:
        import numpy as np
    except ImportError as exc:
        return Undecodable(EXT_NDARRAY, body, exc)
    try:
        dtype_str, shape, data = msgpack.unpackb(body, raw=False)
        if type(dtype_str) is not str or type(shape) is not list or type(data) is not bytes:
            raise TypeError("wrong types")
        if not all(type(n) is int and n >= 0 for n in shape):
            raise ValueError(f"bad shape {shape!r}")
        if not _DTYPE_STR.fullmatch(dtype_str):  # never a string for NumPy to parse freely
            raise TypeError(f"dtype {dtype_str!r} is not a plain number dtype")
        dtype = np.dtype(dtype_str)
        if not _ndarray_travels(dtype):
            raise TypeError(f"dtype {dtype_str!r} is not a plain number dtype")
        count = 1
        for n in shape:
            count *= n
        if count * dtype.itemsize != len(data):
            raise ValueError(f"{len(data)} bytes for shape {tuple(shape)} of {dtype_str}")
        arr = np.frombuffer(data, dtype=dtype, count=count).reshape(tuple(shape)).copy()
    except Exception as exc:
        return Undecodable(EXT_NDARRAY, body, ValueError(
            f"a malformed array (ext type 5 must be [dtype, shape, data]): {exc}"))
    return arr


class _NotDecoded(Exception):
    """Internal: a value that does not decode here, met by ``unpackb(strict=True)``."""

    def __init__(self, placeholder: Unpicklable) -> None:
        super().__init__()
        self.placeholder = placeholder
        error = placeholder.error
        if isinstance(placeholder, UnknownDataclass):
            self.why = f"dataclass {placeholder.module}.{placeholder.qualname}: {error}"
        elif isinstance(error, (AttributeError, ImportError)) and "__main__" in str(error):
            self.why = (f"{error} (a class of another program's __main__, written before "
                        "values of such classes traveled by value)")
        else:
            self.why = f"{type(error).__name__}: {error}"


def _strict(code: int, data: bytes) -> Any:
    value = _ext_hook(code, data)
    if isinstance(value, Unpicklable):
        raise _NotDecoded(value)
    return value


def _strict_ext(code: int, data: bytes) -> Any:
    # A tuple's or dataclass's items decode strictly too.
    if code == EXT_TUPLE:
        return tuple(_unpack(data, _strict_hook))
    return _strict(code, data)


_ext_hook = ext_hook()
_lenient_hook = ext_hook(lenient=True)
_strict_hook = _strict_ext
_PASSTHROUGH = (Undecodable, UnknownDataclass)


def hashable(value: Any) -> Any:
    """``value`` with its arrays turned into tuples, recursively (so it can be a key)."""
    if type(value) is list:
        return tuple([hashable(v) for v in value])
    return value


def _pairs_hook(pairs: List[Tuple[Any, Any]]) -> Dict[Any, Any]:
    try:
        return dict(pairs)
    except TypeError:  # an array key: make it a tuple
        return {hashable(k): v for k, v in pairs}


def packb(value: Any, ship: bool = False) -> bytes:
    """Encode ``value`` as MessagePack; ``ship``: for a shared object's method (see
    :func:`_pickle_to_ship`)."""
    return msgpack.packb(value, default=_default_ship if ship else _default, use_bin_type=True,
                         strict_types=True)


def unpackb(body: bytes, lenient: bool = False, strict: bool = False) -> Any:
    """Decode one MessagePack value.

    Raises :class:`spindle.UntrustedValue` for a pickle whose writer this process does not
    trust, after decoding all of ``body`` (so a reader stays in step): the exception's
    ``value`` is the whole value with :class:`Untrusted` placeholders for such pickles, which
    ``lenient=True`` returns instead of raising. ``strict``: a value that does not decode
    here raises :class:`spindle.UndecodableValue` instead of coming back as a placeholder
    (what the client does with every reply: user code never gets a placeholder).
    """
    if lenient:
        return _unpack(body, _lenient_hook)
    try:
        if strict:
            try:
                return _unpack(body, _strict_hook)
            except _NotDecoded as exc:
                raise UndecodableValue(
                    f"a value read from the server does not decode here: {exc.why}"
                ) from exc.placeholder.error
        return _unpack(body, _ext_hook)
    except UntrustedValue as exc:
        try:
            exc.value = _unpack(body, _lenient_hook)
        except Exception:
            exc.value = None
        raise


def pickled(obj: Any) -> Any:
    """``obj`` pickled as an ext-1 value, or None when it cannot be pickled."""
    try:
        return msgpack.ExtType(EXT_PICKLE, pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL))
    except Exception:
        return None


def encode_ndarray(array: Any) -> Dict[str, Any]:
    """The wire map of a NumPy array (dtype kept if float64/float32/int64, else float64)."""
    import numpy as np

    arr = np.asarray(array)
    name = arr.dtype.name if arr.dtype.name in ARRAY_DTYPES else (
        "int64" if arr.dtype.kind in "iub" else "float64"
    )
    arr = np.ascontiguousarray(arr, dtype=np.dtype(name).newbyteorder("<"))
    return {"dtype": name, "shape": list(arr.shape), "data": arr.tobytes(order="C")}


def decode_ndarray(value: Dict[str, Any]) -> Any:
    """A writable NumPy array from its wire map."""
    import numpy as np

    dtype = np.dtype(value["dtype"]).newbyteorder("<")
    arr = np.frombuffer(value["data"], dtype=dtype).reshape(tuple(value["shape"]))
    return arr.astype(arr.dtype.newbyteorder("="), copy=True)
