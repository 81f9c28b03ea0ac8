"""An object host: ``python -m spindle.host``, started by the server to run the methods of
user-defined objects (``@spindle.shared`` classes).

docs/protocol.md ("User-defined objects", "Hosts"): the host connects to
``$SPINDLE_ADDRESS``, says ``[id, "host", {"id": $SPINDLE_HOST_ID, "pid": ...}]`` and then
answers the server's ``construct``, ``call`` and ``drop`` requests one at a time, in order,
and a transaction's ``copy``, calls on the copy, ``adopt`` (its commit) and ``drop`` of the
copy (docs/transactions.md, "User-defined objects").
Running one call at a time is what makes calls on one object linearizable without locks;
the server gets parallelism by spreading objects over several hosts.

Classes arrive as cloudpickles (``code``) the first time this process sees their version and
are kept by type and version; instances are kept by key. Arguments and results are Spindle values
(the SDK's codec: tuples, pickled NumPy arrays and objects, proxies). A method's exception,
``SystemExit`` and ``KeyboardInterrupt`` included, is a ``Raised`` reply and the host goes
on; a crash (``os._exit``, a signal) or a call past the server's time limit costs the host,
and the server reports its objects lost.

Persistent objects (``@spindle.shared(persistent=True)``; docs/durability.md, "Persistent
user-defined objects"): a ``construct`` with its persistent operand, or a ``restore``, makes
the instance persistent here: after its constructor and after each of its method calls
(returning or raising) the host pickles its state (``obj.__getstate__()``, with cloudpickle)
and sends it as a 4th item of the reply, ``[rid, status, result, state]``, for the server to
log. A state that does not pickle is a ``TypeError`` reply, and the instance goes back to
its last state sent (so the host never holds a state the server has not logged). ``restore``
rebuilds an instance from a state as pickle does (``cls.__new__(cls)``, then
``__setstate__(state)`` or the ``__dict__`` and slots update).

While a constructor or method runs, ``spindle.proxy.running_method`` names it, so SDK calls
that could wait raise ``spindle.BlockingCallError`` instead of hanging the host ("Methods do
not wait"). Methods reach other objects through this process's ordinary client.
"""

from __future__ import annotations

import importlib
import inspect
import os
import pickle
import sys
import traceback
from typing import Any, Callable, Dict, List, NoReturn, Optional, Tuple

import cloudpickle
import msgpack

from spindle import codec
from spindle import proxy as _proxy
from spindle.client import frame
from spindle.errors import UntrustedValue
from spindle.worker import ERROR_TEXT_LIMIT, MAX_FRAME, _error_of, _pickle_exception, announce

REPLY_OVERHEAD = 4 << 10  # bytes of a reply besides its value (ids, kinds, framing)
# The longest state (with its reply) a persistent object can log: a frame, and an op-log
# record (64 MiB) holding the key, type and session besides.
STATE_LIMIT = min(MAX_FRAME, 64 << 20) - (64 << 10)
# Set by the server for hosts on another Python than its clients' (`--host-python`): a class
# shipped as code could not load there (PyPy cannot load CPython's code objects), or would
# run another version's bytecode, so classes are imported from their modules instead.
IMPORTS = os.environ.get("SPINDLE_HOST_IMPORTS") == "1"
# Ends the message of a persistent call whose result could not be sent: its change stays.
KEPT = "; the call's change to the object is kept (its state is logged): do not repeat the call"


def _getstate(obj: Any) -> Any:
    """The pickle protocol's state of ``obj``: its ``__getstate__()`` (every object has one
    from Python 3.11), else what ``copyreg`` pickles: the ``__dict__``, with the slots'
    values as ``(dict, slots)``."""
    getstate = getattr(obj, "__getstate__", None)
    if getstate is not None:
        return getstate()
    slots = {}
    for klass in type(obj).__mro__:
        names = klass.__dict__.get("__slots__", ())
        for name in (names,) if isinstance(names, str) else names:
            if name not in ("__dict__", "__weakref__") and hasattr(obj, name):
                slots[name] = getattr(obj, name)
    state = getattr(obj, "__dict__", None) or None
    return (state, slots) if slots else state


class HostError(Exception):
    """An error reply of a kind other than ``Raised`` (``NotFound``, ``UnknownMethod``...)."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind
        self.message = message


# Arguments decode as the SDK decodes values, except that a host has no own user (it
# unpickles only what trusted writers wrote: codec, ext type 6) and that an argument that
# does not decode here (a class not here) raises instead of giving the method a placeholder.
_strict_ext_hook = codec.ext_hook(own=False, strict=True)


def decode(body: bytes) -> Any:
    """A request, with its arguments decoded as the SDK does; raises when an argument does
    not unpickle here (instead of passing the method a placeholder)."""
    return msgpack.unpackb(body, raw=False, strict_map_key=False, ext_hook=_strict_ext_hook,
                           object_pairs_hook=codec._pairs_hook)


def _trimmed(exc: BaseException) -> BaseException:
    """``exc`` with this module's frames dropped: its traceback starts in the user's code."""
    tb = exc.__traceback__
    while tb is not None and tb.tb_frame.f_code.co_filename == __file__:
        tb = tb.tb_next
    return exc.with_traceback(tb)


def raised(exc: BaseException, where: str) -> List[Any]:
    """The ``["Raised", message, data]`` error of an exception a constructor or method raised."""
    error = _error_of(_trimmed(exc))
    pickled = _pickle_exception(exc)
    size = sum(len(v) for v in error.values()) + len(pickled or b"")
    if size > MAX_FRAME - REPLY_OVERHEAD:  # a huge exception: its type and cut text still go
        pickled = None
        error = {k: v if len(v) <= ERROR_TEXT_LIMIT else v[:ERROR_TEXT_LIMIT] + " ... (cut)"
                 for k, v in error.items()}
    data: Dict[str, Any] = dict(error)
    data["exception"] = None if pickled is None else msgpack.ExtType(codec.EXT_PICKLE, pickled)
    message = f"{where} raised {error['type']}: {error['message']}"
    return ["Raised", message[:ERROR_TEXT_LIMIT], data]


class Host:
    """The classes and instances of one host process, and the requests it answers."""

    def __init__(self) -> None:
        self.classes: Dict[Tuple[str, str], type] = {}  # by (type, version)
        # By key, and transactions' copies by _copy_name: (instance, class, type).
        self.instances: Dict[Any, Tuple[Any, type, str]] = {}
        self._methods: Dict[Tuple[type, str], bool] = {}  # (class, name): is it shared?
        self.states: Dict[Any, bytes] = {}  # persistent instances (and copies): their last state sent

    # -- requests ----------------------------------------------------------------------

    def handle(self, body: bytes) -> bytes:
        """The reply frame to one request frame."""
        try:
            request = decode(body)
        except Exception as exc:
            return self._undecodable(body, exc)
        rid = request[0] if isinstance(request, list) and request else 0
        try:
            op = request[1]
            if op == "call":
                _, _, key, method, args, kwargs, *copy = request
                name = _copy_name(copy[0]) if copy else key
                if name in self.states:
                    return self._call_persistent(rid, name, method, args, kwargs, key)
                where, value, me = self.call(name, method, args, kwargs, key)
                return self._reply(rid, value, where, me)
            if op == "construct":
                _, _, key, type_name, version, code, args, kwargs, *rest = request
                self.states.pop(key, None)
                self.construct(key, type_name, version, code, args, kwargs)
                if rest and rest[0]:  # persistent: the state goes with the reply
                    obj, cls, _ = self.instances[key]
                    try:
                        state = self._state_of(obj, f"{cls.__qualname__}.__init__")
                    except _Raised:
                        self.instances.pop(key, None)  # no object is left, as if it raised
                        raise
                    self.states[key] = state
                    return frame([rid, 0, None, state])
                return frame([rid, 0, None])
            if op == "restore":
                _, _, key, type_name, version, code, state = request
                self.restore(key, type_name, version, code, state)
                return frame([rid, 0, None])
            if op == "drop":
                name = _copy_name(request[3]) if len(request) > 3 else request[2]
                self.instances.pop(name, None)
                self.states.pop(name, None)
                return frame([rid, 0, None])
            if op == "copy":
                _, _, key, copy_id = request
                self.copy(key, _copy_name(copy_id))
                return frame([rid, 0, None])
            if op == "adopt":
                _, _, key, copy_id = request
                self.adopt(key, _copy_name(copy_id))
                return frame([rid, 0, None])
            if op == "ping":
                return frame([rid, 0, "pong"])
            raise HostError("ProtocolError", f"an object host does not do {op!r}")
        except HostError as err:
            return frame([rid, 1, [err.kind, err.message, None]])
        except _Raised as err:
            return frame([rid, 1, err.error])
        except (ValueError, TypeError, LookupError) as exc:  # a request of the wrong shape
            return frame([rid, 1, ["ProtocolError", f"bad request to an object host: {exc}", None]])

    def _class(self, type_name: str, version: str, code: Optional[bytes]) -> type:
        cls = self.classes.get((type_name, version))
        if cls is None:
            if code is None:
                raise HostError("UnknownType", f"this host has no code for {type_name} {version}")
            if IMPORTS:
                cls = self._import(type_name, version)
            else:
                try:
                    cls = pickle.loads(code)
                except BaseException as exc:  # a module missing here, say
                    raise _Raised(raised(exc, f"loading the class {type_name}")) from None
            if not isinstance(cls, type):
                raise HostError("ProtocolError", f"the code of {type_name} is not a class")
            self.classes[(type_name, version)] = cls
        return cls

    @staticmethod
    def _import(type_name: str, version: str) -> type:
        """``type_name``'s class imported from its module, at the caller's version (a host on
        another Python: see ``IMPORTS``); else a clear ImportError saying why not."""
        from spindle.shared import SharedProxy, _source_version

        def fail(why: str, cause: Optional[BaseException] = None) -> NoReturn:
            here = f"{sys.implementation.name} {sys.version.split()[0]}"
            err = ImportError(f"cannot load the class {type_name[3:]} in this object host ({here}, which "
                              f"imports classes from their modules: --host-python): {why}")
            err.__cause__ = cause
            raise _Raised(raised(err, f"loading the class {type_name}"))

        parts = type_name[3:].split(".")
        if "<locals>" in parts:
            fail("a class defined inside a function cannot be imported: define it at a module's top level")
        for split in range(len(parts) - 1, 0, -1):  # the longest module name first
            module = ".".join(parts[:split])
            if module in ("__main__", "__mp_main__"):
                fail("a program's __main__ cannot be imported: define the class in a module")
            _proxy.running_method = f"importing {module}"  # what it runs may not wait
            try:
                found: Any = importlib.import_module(module)
            except ModuleNotFoundError as exc:
                if exc.name is not None and (module + ".").startswith(exc.name + "."):
                    continue  # no such module: perhaps a shorter name is the module
                fail(f"importing {module} failed: {exc}", exc)
            except BaseException as exc:  # the module's own code failed (or exited)
                fail(f"importing {module} failed: {type(exc).__name__}: {exc}", exc)
            finally:
                _proxy.running_method = None
            qualname = ".".join(parts[split:])
            for name in parts[split:]:
                # A decorated class's proxy has only its methods: nested classes are the class's.
                found = getattr(found, "__wrapped__", found)
                if not hasattr(found, name):
                    fail(f"module {module} has no {qualname}")
                found = getattr(found, name)
            found = getattr(found, "__wrapped__", found)
            if not isinstance(found, type) or issubclass(found, SharedProxy):
                fail(f"{module}.{qualname} is not a class")
            found_version = _source_version(found)
            if found_version is None:
                fail(f"this host cannot read the source of {module}.{qualname} to check that it "
                     "is the caller's version")
            if found_version != version:
                where = getattr(sys.modules.get(module), "__file__", None) or module
                fail(f"{where} holds another version of it than the caller's (or the caller's "
                     "has no source, as a class made by exec): deploy the same code to both; a "
                     "host keeps a module it imported until it restarts")
            return found
        fail("its module is not importable here (put it on the server's PYTHONPATH)")

    def construct(self, key: str, type_name: str, version: str, code: Optional[bytes],
                  args: List[Any], kwargs: Dict[str, Any]) -> None:
        cls = self._class(type_name, version, code)
        self.instances.pop(key, None)  # constructed again (after it was lost, say)
        obj = self._run(cls, f"{cls.__qualname__}.__init__", args, kwargs)
        self.instances[key] = (obj, cls, type_name)

    def restore(self, key: str, type_name: str, version: str, code: Optional[bytes],
                state: bytes) -> None:
        """Rebuild persistent object ``key`` from its last logged state."""
        cls = self._class(type_name, version, code)
        self.instances.pop(key, None)
        self.states.pop(key, None)
        obj = self._rebuild(cls, state, f"restoring {cls.__qualname__}")
        self.instances[key] = (obj, cls, type_name)
        self.states[key] = state

    def copy(self, key: str, name: Tuple[str, int]) -> None:
        """Keep a copy of instance ``key`` as ``name`` for a transaction (docs/transactions.md):
        rebuilt from its pickled state as ``restore`` does, so the transaction's calls change
        the copy only. A persistent object's copy starts from its last state sent (which is
        the instance's), and sends its state with every answer as the instance does."""
        entry = self.instances.get(key)
        if entry is None:
            raise HostError("NotFound", f"this host holds no object {key!r}")
        obj, cls, type_name = entry
        where = f"copying {cls.__qualname__} for a transaction"
        state = self.states.get(key)
        if state is None:
            try:
                state = cloudpickle.dumps(_getstate(obj), protocol=pickle.HIGHEST_PROTOCOL)
            except BaseException as exc:
                err = TypeError(f"cannot pickle the state of {cls.__qualname__} to copy it for a "
                                f"transaction ({type(exc).__name__}: {exc})")
                raise _Raised(raised(err, where)) from None
        else:
            self.states[name] = state
        self.instances[name] = (self._rebuild(cls, state, where), cls, type_name)

    def adopt(self, key: str, name: Tuple[str, int]) -> None:
        """A transaction committed: its copy ``name`` becomes instance ``key``."""
        entry = self.instances.pop(name, None)
        if entry is None:
            raise HostError("NotFound", f"this host holds no copy {name[1]} of {key!r}")
        self.instances[key] = entry
        state = self.states.pop(name, None)
        if state is not None:
            self.states[key] = state

    @staticmethod
    def _rebuild(cls: type, state: bytes, where: str) -> Any:
        """An instance of ``cls`` with the pickled ``state``, as ``pickle`` builds one."""
        _proxy.running_method = where
        try:
            obj = cls.__new__(cls)
            value = pickle.loads(state)
            setstate = getattr(obj, "__setstate__", None)
            if setstate is not None:
                setstate(value)
            else:
                slots = None
                if isinstance(value, tuple) and len(value) == 2:
                    value, slots = value
                if value:
                    obj.__dict__.update(value)
                if slots:
                    for name, item in slots.items():
                        setattr(obj, name, item)
            return obj
        except BaseException as exc:
            raise _Raised(raised(exc, where)) from None
        finally:
            _proxy.running_method = None

    @staticmethod
    def _state_of(obj: Any, where: str) -> bytes:
        """The pickled state of ``obj`` after ``where`` ran; ``_Raised`` (a ``TypeError``)
        if it does not pickle or cannot be sent."""
        try:
            state = cloudpickle.dumps(_getstate(obj), protocol=pickle.HIGHEST_PROTOCOL)
        except BaseException as exc:
            err: BaseException = TypeError(
                f"cannot pickle the state of the persistent object {type(obj).__qualname__} "
                f"after {where} ({type(exc).__name__}: {exc}): the object keeps its last "
                "acknowledged state and this call did not take effect"
            )
            raise _Raised(raised(err, where)) from None
        if len(state) > STATE_LIMIT:
            err = ValueError(
                f"the state of the persistent object {type(obj).__qualname__} after {where} is "
                f"{len(state):,} bytes, over the {STATE_LIMIT:,} that can be logged: the object "
                "keeps its last acknowledged state and this call did not take effect (keep large "
                "data in a spindle.Blob or spindle.Array)"
            )
            raise _Raised(raised(err, where)) from None
        return state

    def _call_persistent(self, rid: int, name: Any, method: str, args: List[Any],
                         kwargs: Dict[str, Any], key: str) -> bytes:
        """A call on a persistent instance (or a transaction's copy of one: ``name``): its
        reply carries the state after it (also when the method raised); if that state does
        not pickle, the instance goes back to its last state sent and the call is a
        ``TypeError``."""
        entry = self.instances.get(name)
        if entry is None:
            raise HostError("NotFound", f"this host holds no object {key!r}")
        cls = entry[1]
        where = f"{cls.__qualname__}.{method}"
        try:
            where, value, me = self.call(name, method, args, kwargs, key)
            error: Optional[List[Any]] = None
        except _Raised as err:
            error, value, me = err.error, None, (entry[0], entry[2], key)
        # HostError (the method never ran) goes up: no state, nothing changed.
        try:
            state = self._state_of(me[0], where)
        except _Raised as err:
            try:
                obj = self._rebuild(cls, self.states[name], f"restoring {cls.__qualname__}")
                self.instances[name] = (obj, cls, entry[2])
            except _Raised:  # cannot happen for a state that loaded before; drop it then
                self.instances.pop(name, None)
                self.states.pop(name, None)
            return frame([rid, 1, err.error])
        self.states[name] = state
        if error is not None:
            return frame([rid, 1, error, state])
        # The result's frame (a fixarray of 3) with the state as a 4th item.
        body = self._reply(rid, value, where, me, KEPT)[4:]
        extra = msgpack.packb(state, use_bin_type=True)
        if len(body) + len(extra) > STATE_LIMIT:
            err = ValueError(
                f"the result of {where} and the object's state are {len(body) + len(extra):,} "
                f"bytes, over the {STATE_LIMIT:,} that can be logged with it: return smaller "
                f"parts{KEPT}"
            )
            return frame([rid, 1, raised(err, where), state])
        out = b"\x94" + body[1:] + extra
        return len(out).to_bytes(4, "big") + out

    def call(self, name: Any, method: str, args: List[Any], kwargs: Dict[str, Any],
             key: str) -> Tuple[str, Any, Tuple[Any, str, str]]:
        """``(where, result, (object, type, key))`` of a method call on instance ``name``
        (``key``, or a transaction's copy of object ``key``)."""
        entry = self.instances.get(name)
        if entry is None:
            raise HostError("NotFound", f"this host holds no object {key!r}")
        obj, cls, type_name = entry
        where = f"{cls.__qualname__}.{method}"
        if not self._shared(cls, method):
            raise HostError("UnknownMethod", f"{cls.__qualname__} has no public method {method!r}")
        try:
            fn = getattr(obj, method)
        except BaseException as exc:  # __getattr__ of the user's raising
            raise _Raised(raised(exc, where)) from None
        if not callable(fn):  # an instance attribute hiding the method
            raise HostError("UnknownMethod", f"{where} is not a method")
        return where, self._run(fn, where, args, kwargs), (obj, type_name, key)

    def _shared(self, cls: type, name: str) -> bool:
        """Whether ``name`` is a public method of ``cls`` (properties and data are not)."""
        known = self._methods.get((cls, name))
        if known is None:
            known = False
            if isinstance(name, str) and not name.startswith("_"):
                try:
                    raw = inspect.getattr_static(cls, name)
                    known = not (isinstance(raw, property) or inspect.isdatadescriptor(raw)) and (
                        isinstance(raw, (staticmethod, classmethod)) or callable(raw)
                    )
                except AttributeError:
                    known = False
            self._methods[(cls, name)] = known
        return known

    @staticmethod
    def _run(fn: Callable[..., Any], where: str, args: List[Any], kwargs: Dict[str, Any]) -> Any:
        """``fn(*args, **kwargs)`` with the blocking rule on; its exception as ``_Raised``."""
        _proxy.running_method = where
        try:
            return fn(*args, **kwargs)
        except BaseException as exc:  # SystemExit and KeyboardInterrupt too: the host stays
            raise _Raised(raised(exc, where)) from None
        finally:
            _proxy.running_method = None

    # -- replies -----------------------------------------------------------------------

    @staticmethod
    def _reply(rid: int, value: Any, where: str, me: Tuple[Any, str, str], note: str = "") -> bytes:
        """The reply frame of a call that returned ``value``; an error reply if it cannot be
        sent (``note`` ends its message)."""
        # The object itself, anywhere in its method's result (`return self`, a fluent
        # method), travels as its proxy: see codec.shipping_self.
        codec.shipping_self = me
        try:
            data = frame([rid, 0, value], True)
        except BaseException as exc:
            err = TypeError(
                f"cannot pickle the result of {where} ({type(value).__name__}): {exc}{note}"
            )
            return frame([rid, 1, raised(err, where)])
        finally:
            codec.shipping_self = None
        if len(data) > MAX_FRAME:
            err = ValueError(
                f"the result of {where} is {len(data):,} bytes, over the {MAX_FRAME:,} a reply "
                "can carry: keep large data in the object (return parts of it), or store it in "
                f"a spindle.Blob or spindle.Array and return that{note}"
            )
            return frame([rid, 1, raised(err, where)])
        return data

    @staticmethod
    def _undecodable(body: bytes, exc: BaseException) -> bytes:
        """The reply to a request whose arguments do not unpickle here."""
        try:
            request = msgpack.unpackb(body, raw=False, strict_map_key=False,
                                      object_pairs_hook=codec._pairs_hook)
            rid = request[0]
        except Exception:
            return frame([0, 1, ["ProtocolError", f"undecodable request: {exc}", None]])
        where = f"{request[3]}" if len(request) > 3 else "the object"
        if isinstance(exc, UntrustedValue):  # as a read raises it
            err: BaseException = exc
        else:
            err = TypeError(f"cannot unpickle an argument in this object host "
                            f"({type(exc).__name__}: {exc})")
        return frame([rid, 1, raised(err, where)])


def _copy_name(copy_id: int) -> Tuple[str, int]:
    """Where a transaction's copy is kept in ``Host.instances`` (keys are strings: never this)."""
    if not isinstance(copy_id, int):
        raise TypeError("a copy id is an integer")
    return ("copy", copy_id)


class _Raised(Exception):
    """Internal: carries a ``Raised`` error out of :meth:`Host.handle`'s helpers."""

    def __init__(self, error: List[Any]) -> None:
        super().__init__(error[1])
        self.error = error


def serve(address: str, host_id: str) -> None:
    """Connect, say ``host``, and answer requests until the server closes the connection."""
    conn = announce(address, "host", {"id": host_id, "pid": os.getpid()})
    state = Host()
    read_body, sendall, handle = conn.read_body, conn.sock.sendall, state.handle
    while True:
        try:
            body = read_body()
        except (ConnectionError, OSError):
            return  # the server closed the connection: exit cleanly
        sendall(handle(body))


def main() -> None:
    address = os.environ.get("SPINDLE_ADDRESS")
    host_id = os.environ.get("SPINDLE_HOST_ID")
    if not address or not host_id:
        sys.stderr.write(
            "spindle host: SPINDLE_ADDRESS and SPINDLE_HOST_ID must be set "
            "(object hosts are started by `spindle server`)\n"
        )
        raise SystemExit(2)
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)  # a method reading stdin gets EOF, not the server's stdin
    os.close(devnull)
    for stream in (sys.stdout, sys.stderr):  # a method's prints reach the server's log now
        try:
            stream.reconfigure(line_buffering=True)  # type: ignore[union-attr]
        except (AttributeError, ValueError):
            pass
    try:
        serve(address, host_id)
    except KeyboardInterrupt:
        pass
    except BaseException:  # a host bug: say it where the server's operator sees it
        sys.stderr.write("spindle host: " + traceback.format_exc())
        sys.stderr.flush()
        os._exit(1)
    # Threads a method left running must not keep a host alive without its server.
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
