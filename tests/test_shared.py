"""User-defined shared objects (``@spindle.shared``) against real servers and object hosts.

The classes below live in this test module, which the hosts cannot import: they travel by
value, as a program's own classes do. Functions run in workers come from
``shared_remote.py``, which does not import these classes (the workers get generic proxies).
Failures that cost a host (a method looping forever, ``os._exit``) run on private servers
with a short ``--object-call-timeout``.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import importlib
import inspect
import os
import pickle
import queue
import subprocess
import sys
import textwrap
import threading
import time
from typing import Any, Iterator, List, Tuple

import numpy as np
import pytest

import shared_remote
import spindle
from conftest import REPO, ServerProcess, connected_to, gateway_args, wait_until
from spindle.errors import RemoteTraceback
from spindle.shared import class_code


class BoxError(Exception):
    """Raised by Box.fail; must come back as this very class."""


class Unpicklable(Exception):
    def __init__(self) -> None:
        super().__init__("holds a lock")
        self.lock = threading.Lock()


@spindle.shared
class Box:
    """A value in a box (docstring kept on the proxy class)."""

    LIMIT = 10  # a class attribute: not shared

    def __init__(self, value: Any = 0, *, fail: bool = False) -> None:
        if fail:
            raise BoxError("the constructor refused")
        self.value = value
        self._secret = "hidden"

    def get(self) -> Any:
        """The value."""
        return self.value

    def set(self, value: Any) -> None:
        self.value = value

    def add(self, delta: int = 1) -> Any:
        self.value += delta
        return self.value

    def incr(self) -> int:
        self.value += 1
        return self.value

    def pid(self) -> int:
        return os.getpid()

    def me(self) -> "Box":
        self.value += 100
        return self

    def nap(self, seconds: float) -> Tuple[float, float]:
        start = time.monotonic()  # of the host's clock: compare only spans of one host
        time.sleep(seconds)
        return start, time.monotonic()

    def meet(self, here: str, there: str) -> bool:
        """Marks ``here``, then waits (a minute at most) for ``there``: true when the call
        that marks ``there`` ran while this one did."""
        open(here, "w").close()
        end = time.monotonic() + 60
        while not os.path.exists(there):
            if time.monotonic() > end:
                return False
            time.sleep(0.01)
        return True

    def fail(self, message: str) -> None:
        self.value = -1  # the state stays as the method left it
        raise BoxError(message)

    def fail_unpicklable(self) -> None:
        raise Unpicklable()

    def returns_generator(self) -> Any:
        return (i for i in range(3))

    def big(self, size: int) -> bytes:
        return b"x" * size

    def quit(self) -> None:
        sys.exit(3)

    def spin(self) -> None:
        while True:
            pass

    def die(self) -> None:
        os._exit(1)

    def _private(self) -> str:
        return "private"

    @property
    def doubled(self) -> Any:
        return self.value * 2

    @staticmethod
    def helper(x: int) -> int:
        return x + 1

    @classmethod
    def boxed(cls, value: Any) -> "Box":
        return cls(value)


@spindle.shared
class Arrays:
    def __init__(self, n: int) -> None:
        self.data = np.arange(n, dtype=np.float64)

    def scale(self, factor: float) -> np.ndarray:
        self.data = self.data * factor
        return self.data

    def pair(self) -> Tuple[Any, ...]:
        return (self.data.sum(), (1, "a"), {"k": (2, 3)}, [np.int64(4)])

    def echo(self, *args: Any, **kwargs: Any) -> Tuple[Any, Any]:
        return args, kwargs

    def keep_counter(self, counter: spindle.Counter) -> int:
        self.counter = counter
        return counter.add(5)

    def counter_of(self) -> spindle.Counter:
        return self.counter


@spindle.shared
class Attempt:
    """Runs an SDK call inside a method (for the blocking rule)."""

    def run(self, obj: Any, method: str, *args: Any, **kwargs: Any) -> Any:
        return getattr(obj, method)(*args, **kwargs)

    def start_thread(self) -> None:
        spindle.Thread(target=print).start()

    def construct(self) -> None:
        Box(1)


@pytest.fixture(scope="module")
def short_timeout() -> Iterator[ServerProcess]:
    """A server whose object calls time out after 1 s, with two hosts and a 4 MiB frame limit."""
    proc = ServerProcess("--session-ttl", "1", "--object-call-timeout", "1", "--object-hosts",
                         "2", "--max-frame", str(4 << 20), *gateway_args(2))
    yield proc
    proc.stop()


def on_two_hosts(make: Any) -> Tuple[Any, Any]:
    """Two objects ``make()`` whose hosts differ (objects go to hosts by a hash of the key)."""
    first = make()
    for _ in range(40):
        other = make()
        if other.pid() != first.pid():
            return first, other
    pytest.fail("every object landed on one host")


# -- construction -----------------------------------------------------------------------------


def test_an_unnamed_object_is_constructed_in_a_host():
    box = Box(41)
    assert isinstance(box, Box) and isinstance(box, spindle.Proxy)
    assert box.key.startswith("~") and box.name is None
    assert box.get() == 41
    assert box.add(1) == 42 and box.add(delta=2) == 44
    assert box.pid() != os.getpid()
    assert Box._type == "py:test_shared.Box"
    assert Box.__wrapped__.__name__ == "Box" and Box.__wrapped__ is not Box
    other = Box()
    assert other.key != box.key and other.get() == 0
    same = box.me()  # a method returning self returns the proxy, not a copy of the state
    assert same == box and type(same) is Box and box.get() == 144


def test_a_named_object_is_constructed_once_and_later_constructions_attach(uniq):
    first = Box(5, name=f"{uniq}.box")
    first.add(1)
    again = Box(99, name=f"{uniq}.box")  # attaches: 99 is ignored
    assert again == first and again.key == f"{uniq}.box" == again.name
    assert again.get() == 6


def test_a_raising_constructor_leaves_no_object(uniq):
    with pytest.raises(BoxError, match="the constructor refused"):
        Box(fail=True, name=f"{uniq}.box")
    assert spindle.objects(uniq) == []
    assert Box(7, name=f"{uniq}.box").get() == 7  # constructed afresh, with these arguments


def test_the_proxy_class_looks_like_the_class():
    assert Box.__name__ == "Box" and Box.__qualname__ == "Box" and Box.__module__ == "test_shared"
    assert Box.__doc__.startswith("A value in a box")
    assert Box.get.__doc__ == "The value."
    assert str(inspect.signature(Box.add)) == "(self, delta: 'int' = 1) -> 'Any'"
    params = inspect.signature(Box).parameters
    assert list(params) == ["value", "fail", "name"]
    assert params["name"].kind is inspect.Parameter.KEYWORD_ONLY
    assert "name" in (Box.__init__.__doc__ or "")


def test_shared_classes_are_subclassed_through_the_original_class():
    with pytest.raises(TypeError, match=r"subclass the class itself \(Box.__wrapped__\)"):
        class Bigger(Box):
            pass

    @spindle.shared
    class Labelled(Box.__wrapped__):
        def label(self) -> str:
            return f"box of {self.value}"

    assert Labelled._type.endswith("Labelled") and callable(Labelled.label)
    assert not issubclass(Labelled, Box)  # another shared type, with Box's methods too
    assert callable(Labelled.get)


def test_static_and_class_methods_run_here():
    assert Box.helper(1) == 2
    box = Box.boxed(3)  # cls is the proxy class: a shared object
    assert isinstance(box, Box) and box.get() == 3


def test_persistent_objects_need_a_data_directory(uniq):
    # Accepted by the decorator (tests/test_shared_durability.py runs them with --data-dir);
    # the session's server has no data directory, so constructing one is refused.
    @spindle.shared(persistent=True)
    class Durable:
        def get(self) -> int:
            return 1

    with pytest.raises(ValueError, match="no --data-dir"):
        Durable(name=f"{uniq}.durable")
    with pytest.raises(ValueError, match="no --data-dir"):
        Durable()

    @spindle.shared(persistent=False)
    class Ephemeral:
        def one(self) -> int:
            return 1

    assert Ephemeral._type.endswith("Ephemeral") and Ephemeral.__wrapped__().one() == 1


def test_a_class_defined_in_a_function_works():
    def local_helper(x: int) -> int:
        return x * 3

    @spindle.shared
    class Local:
        def __init__(self, base: int) -> None:
            self.base = base

        def compute(self, x: int) -> int:
            return local_helper(x) + self.base

    assert Local._type == "py:test_shared.test_a_class_defined_in_a_function_works.<locals>.Local"
    assert Local(10).compute(2) == 16


def test_a_class_of_main_works_and_its_instances_come_back_as_that_class(child_env, tmp_path, uniq):
    script = tmp_path / "prog.py"
    script.write_text(textwrap.dedent(
        f"""
        import dataclasses, os, spindle

        @dataclasses.dataclass
        class Point:
            x: int
            y: int

        @spindle.shared
        class Path:
            def __init__(self):
                self.points = []

            def add(self, point):
                assert isinstance(point, Point)
                self.points.append(point)
                return len(self.points)

            def last(self):
                return self.points[-1]

        def extend(x, y):  # runs in a function worker, which has no source of this script
            Path(name="{uniq}.path").add(Point(x, y))

        path = Path(name="{uniq}.path")
        path.add(Point(1, 2))
        path.add(Point(3, 4))
        last = path.last()
        print(type(last) is Point, last)
        print(Path._type)
        thread = spindle.Thread(target=extend, args=(5, 6), echo=False)
        thread.start()
        thread.join(60)
        print(path.last())
        """
    ))
    out = subprocess.run([sys.executable, str(script)], env=child_env, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == ["True Point(x=3, y=4)", "py:__main__.Path", "Point(x=5, y=6)"]
    # Another program reaches it without the class: a generic proxy.
    path = spindle.attach("py:__main__.Path", f"{uniq}.path")
    assert path.add.__name__ == "add"
    spindle.delete(path)


# -- values -----------------------------------------------------------------------------------


def test_methods_take_and_return_numpy_arrays_tuples_and_proxies():
    arrays = Arrays(4)
    scaled = arrays.scale(2.0)
    assert isinstance(scaled, np.ndarray) and scaled.dtype == np.float64
    assert scaled.tolist() == [0.0, 2.0, 4.0, 6.0]
    total, pair, mapping, items = arrays.pair()
    assert total == 12.0 and pair == (1, "a") and mapping == {"k": (2, 3)} and items == [4]
    args, kwargs = arrays.echo((1, 2), np.ones(2), key=(3, "x"))
    assert args[0] == (1, 2) and isinstance(args[1], np.ndarray) and kwargs == {"key": (3, "x")}
    counter = spindle.Counter(1)
    assert arrays.keep_counter(counter) == 6
    assert arrays.counter_of() == counter and counter.get() == 6


def test_instances_of_local_classes_travel_by_value_and_come_back_as_themselves():
    @dataclasses.dataclass
    class Point:
        x: int
        y: int

    arrays = Arrays(1)
    (point,), kwargs = arrays.echo(Point(1, 2), other=[Point(3, 4)])
    assert type(point) is Point and point == Point(1, 2)
    assert kwargs == {"other": [Point(3, 4)]}


def test_call_by_name_and_keep():
    box = Box(1)
    assert spindle.call(box, "add", 2) == 3
    with pytest.raises(ValueError):
        spindle.keep(box, "elsewhere")  # its host holds it under its key
    assert spindle.keep(box) is box and box.get() == 3
    spindle.delete(box)


def test_a_server_that_forgot_the_class_gets_it_again(monkeypatch):
    @spindle.shared
    class Fresh:
        def one(self) -> int:
            return 1

    client = spindle.connect()
    client.defined.add((Fresh._type, class_code(Fresh)[0]))  # as if sent before a restart
    sent = []
    define = client.define
    monkeypatch.setattr(client, "define", lambda *args: sent.append(args[0]) or define(*args))
    assert Fresh().one() == 1  # create answered UnknownType: define, create again
    assert sent == [Fresh._type]
    Fresh()
    assert sent == [Fresh._type]  # once per client


def test_a_proxy_pickles_as_a_reference():
    box = Box(3)
    copy = pickle.loads(pickle.dumps(box))
    assert copy == box and type(copy) is Box and copy.get() == 3
    generic = spindle.attach(Box._type, box.key)
    assert generic == box and generic.get() == 3


def test_a_result_that_does_not_pickle_is_a_type_error_naming_the_method():
    box = Box(1)
    with pytest.raises(TypeError, match="Box.returns_generator"):
        box.returns_generator()
    assert box.get() == 1


# -- functions and concurrency ----------------------------------------------------------------

def test_many_functions_incrementing_one_object_are_linearizable():
    counter = Box(0)
    with spindle.Executor(max_workers=8, echo=False) as ex:
        futures = [ex.submit(shared_remote.bump, counter, 200) for _ in range(8)]
        results = [f.result(timeout=120) for f in futures]
    assert counter.get() == 1600
    # Every increment saw its own value: no two calls interleaved.
    values = [v for r in results for v in r]
    assert sorted(values) == list(range(1, 1601))
    assert all(r == sorted(r) for r in results)


def test_a_function_without_the_class_gets_a_generic_proxy():
    box = Box(8)
    t = spindle.Thread(target=shared_remote.describe, args=(box,), echo=False)
    t.start()
    t.join(60)
    assert t.result == ["Box", True, box.key, 8]
    t = spindle.Thread(target=shared_remote.reach_private, args=(box,), echo=False)
    t.start()
    t.join(60)
    assert "not shared" in t.result


@spindle.shared
class Badge:
    """Has methods named like a proxy's own attributes (``name``, ``key``)."""

    def __init__(self, holder: str) -> None:
        self.holder = holder

    def name(self) -> str:
        return f"badge of {self.holder}"

    def me(self) -> Any:
        return self


def test_methods_named_like_proxy_attributes_stay_methods_without_the_class():
    """A class's ``name`` method wins over the proxy's ``name`` property, also in a function
    that does not have the class: the reference (pickled, or in a method's result) says so."""
    badge = Badge("ann")
    assert badge.name() == "badge of ann" and badge.key.startswith("~")
    t = spindle.Thread(target=shared_remote.names_of, args=(badge,), echo=False)
    t.start()
    t.join(60)
    # The proxy it was passed, and the one `me()` returned to it, both call the method;
    # `key` is still the proxy's.
    assert t.result == ["badge of ann", "badge of ann", badge.key]


PYPY = REPO / ".venv-pypy" / "bin" / "python"
needs_pypy = pytest.mark.skipif(
    not (REPO / ".venv-pypy" / ".installed").exists(),
    reason="no PyPy environment in .venv-pypy (`make pypy` builds it where pypy3 installs)")


@needs_pypy
def test_object_hosts_on_pypy_import_classes_from_their_modules(tmp_path, monkeypatch):
    """`--host-python` runs the hosts on another Python. PyPy cannot load a class CPython
    shipped as code, so the host imports it from its module (on the server's PYTHONPATH),
    at the caller's version; a class it cannot import that way is a clear error."""
    import jit_objects

    # A module of which the host finds another copy than this process (another deployment):
    # another version of the class.
    source = textwrap.dedent("""
        import spindle

        @spindle.shared
        class Edited:
            def value(self):
                return 1
        """)
    for side, text in (("here", source), ("host", source.replace("return 1", "return 2"))):
        (tmp_path / side).mkdir()
        (tmp_path / side / "edited_objects.py").write_text(text)
    monkeypatch.syspath_prepend(str(tmp_path / "here"))
    monkeypatch.setenv("PYTHONPATH", str(tmp_path / "host"))
    edited_objects = importlib.import_module("edited_objects")

    proc = ServerProcess("--object-hosts", "1", "--host-python", str(PYPY))
    try:
        with connected_to(proc):
            tally = jit_objects.Tally(5)
            assert tally.runtime() == "pypy"
            squares = sum(i * i for i in range(10_000))
            for round_ in range(1, 4):
                assert tally.add_squares(10_000) == 5 + round_ * squares
            # A class of a module the host cannot import (this one needs NumPy, which the
            # PyPy environment lacks), and one at another version than the caller's.
            with pytest.raises(ImportError, match=r"cannot load the class .*Box in this object host \(pypy .*"
                                                  r"importing test_shared failed: No module named 'numpy'"):
                Box(1)
            with pytest.raises(ImportError, match="holds another version of it than the caller's"):
                edited_objects.Edited()

            @spindle.shared
            class Local:
                def value(self) -> int:
                    return 1

            with pytest.raises(ImportError, match="defined inside a function cannot be imported"):
                Local()
            assert tally.add_squares(0) == 5 + 3 * squares  # the host and its object are unharmed
    finally:
        proc.stop()


def test_calls_on_objects_of_different_hosts_run_in_parallel(tmp_path):
    proc = ServerProcess("--object-hosts", "2", *gateway_args(2))
    try:
        with connected_to(proc):
            a, b = on_two_hosts(Box)
            # Each call waits for the other to start: they meet only if both run at once
            # (one after the other, the first would give up after a minute).
            marks = [str(tmp_path / "a"), str(tmp_path / "b")]
            with concurrent.futures.ThreadPoolExecutor(2) as pool:
                met = [pool.submit(a.meet, *marks), pool.submit(b.meet, *reversed(marks))]
                assert [f.result(120) for f in met] == [True, True]

            # Calls on one object never overlap (one host: one clock).
            spans: dict = {}

            def nap(tag: str, box: Any) -> None:
                spans[tag] = box.nap(0.5)

            threads = [threading.Thread(target=nap, args=(t, a)) for t in ("c", "d")]
            for t in threads:
                t.start()
            for t in threads:
                t.join(60)
            (sc, ec), (sd, ed) = spans["c"], spans["d"]
            assert ec <= sd or ed <= sc, spans
    finally:
        proc.stop()


# -- errors -----------------------------------------------------------------------------------


def test_an_exception_comes_back_with_the_remote_traceback_and_the_state_stays():
    box = Box(5)
    with pytest.raises(BoxError, match="out of luck") as info:
        box.fail("out of luck")
    assert type(info.value) is BoxError  # the very class, not a copy
    cause = info.value.__cause__
    assert isinstance(cause, RemoteTraceback)
    assert "in fail" in cause.tb and "test_shared.py" in cause.tb
    assert "host.py" not in cause.tb  # it starts in the method
    assert box.get() == -1


def test_an_exception_that_does_not_pickle_is_a_remote_error():
    box = Box()
    with pytest.raises(spindle.RemoteError, match="holds a lock") as info:
        box.fail_unpicklable()
    assert info.value.type_name == "Unpicklable"
    assert "fail_unpicklable" in info.value.__cause__.tb
    assert box.get() == 0


def test_sys_exit_in_a_method_is_an_exception_and_the_host_stays():
    box = Box()
    pid = box.pid()
    with pytest.raises(SystemExit):
        box.quit()
    assert box.pid() == pid and box.add() == 1


def test_attributes_are_not_shared():
    box = Box(2)
    with pytest.raises(AttributeError, match="no method 'value' .*not shared, only its methods"):
        box.value  # noqa: B018
    with pytest.raises(AttributeError, match="LIMIT.* attributes of a shared object are not shared"):
        box.LIMIT  # noqa: B018
    with pytest.raises(AttributeError, match="doubled.*property"):
        box.doubled  # noqa: B018
    with pytest.raises(AttributeError, match="'_secret' of the shared object Box is not shared"):
        box._secret  # noqa: B018
    with pytest.raises(AttributeError, match="'_private' of the shared object Box is not shared"):
        box._private()
    with pytest.raises(AttributeError, match="has no method 'nope'"):
        box.nope()
    with pytest.raises(AttributeError, match="cannot set 'value'"):
        box.value = 3
    assert box.get() == 2


def test_the_server_refuses_private_missing_and_non_method_names():
    box = Box(2)
    client = spindle.connect()
    for method in ("_private", "__init__", "__class__", "nope", "doubled", "LIMIT"):
        with pytest.raises(spindle.UnknownMethod):
            client.call(Box._type, box.key, method, [[], {}])
    generic = spindle.attach(Box._type, box.key)
    with pytest.raises(AttributeError):  # UnknownMethod is an AttributeError
        generic.nope()
    with pytest.raises(AttributeError):
        generic._private()
    assert box.get() == 2


def test_a_class_that_does_not_pickle_is_a_clear_type_error():
    @spindle.shared
    class Locked:
        lock = threading.Lock()

        def get(self) -> int:
            return 1

    with pytest.raises(TypeError, match=r"cannot ship the class .*Locked.*_thread.lock"):
        Locked()


def test_a_name_holding_a_built_in_object_is_a_type_mismatch(uniq):
    spindle.Counter(name=f"{uniq}.c")
    with pytest.raises(spindle.TypeMismatch):
        Box(1, name=f"{uniq}.c")
    box = Box(1, name=f"{uniq}.b")
    with pytest.raises(spindle.TypeMismatch):
        spindle.Counter(name=f"{uniq}.b")
    assert box.get() == 1


def test_two_versions_of_a_class_cannot_live_under_one_type(uniq):
    module = f"versions_{uniq}"

    def load(result: int) -> Any:
        namespace = {"__name__": module}
        exec(textwrap.dedent(f"""
            import spindle

            @spindle.shared
            class Versioned:
                def which(self):
                    return {result}
            """), namespace)
        return namespace["Versioned"]

    old, new = load(1), load(2)
    assert old._type == new._type == f"py:{module}.Versioned"
    old_version, new_version = class_code(old)[0], class_code(new)[0]
    assert old_version != new_version
    first = old(name=f"{uniq}.old")
    assert first.which() == 1
    with pytest.raises(spindle.TypeMismatch) as info:
        new(name=f"{uniq}.new")
    assert old_version in str(info.value) and new_version in str(info.value)
    assert first.which() == 1  # nothing changed
    spindle.delete(first)
    second = new(name=f"{uniq}.new")  # no object of the old version left: accepted
    assert second.which() == 2
    spindle.delete(second)


EDITED_SCRIPT = textwrap.dedent(
    """
    import sys
    import spindle

    @spindle.shared
    class Tally:
        def which(self):
            return VERSION

    if __name__ == "__main__":
        try:
            t = Tally(name=sys.argv[1]) if len(sys.argv) > 1 else Tally()
            print(t.which())
        except spindle.TypeMismatch as exc:
            print("refused:", exc)
    """
)


def test_an_edited_script_runs_again_once_only_named_objects_are_gone(child_env, tmp_path, uniq):
    # A shared server that keeps an ended program's session for 10 minutes: its unnamed
    # objects must still count as gone at once.
    private = ServerProcess("--session-ttl", "600", *gateway_args(2))
    try:
        script = tmp_path / "prog.py"

        def run(version: int, *args: str) -> str:
            script.write_text(EDITED_SCRIPT.replace("VERSION", str(version)))
            env = {**child_env, "SPINDLE_ADDRESS": private.address}
            out = subprocess.run([sys.executable, str(script), *args], env=env,
                                 capture_output=True, text=True, timeout=120)
            assert out.returncode == 0, out.stderr
            return out.stdout.strip()

        assert run(1) == "1"
        assert run(2) == "2"  # the first run's unnamed object is gone with its program
        assert run(2, f"{uniq}.kept") == "2"
        refused = run(3)
        assert refused.startswith("refused:"), refused
        assert f"'{uniq}.kept'" in refused and "spindle.delete" in refused
        with connected_to(private):
            spindle.delete(spindle.attach("py:__main__.Tally", f"{uniq}.kept"))
        assert run(3) == "3"
    finally:
        private.stop()


def test_delete_drops_the_object(uniq):
    box = Box(1, name=f"{uniq}.box")
    assert spindle.delete(box) is True
    with pytest.raises(spindle.ObjectNotFound):
        box.get()
    assert spindle.delete(box) is False
    assert Box(2, name=f"{uniq}.box").get() == 2  # the name is free again


def test_objects_lists_the_type_and_session_end_deletes_unnamed_ones(child_env, uniq):
    script = textwrap.dedent(
        f"""
        import spindle, test_shared
        refs = spindle.Dict(name="{uniq}.refs")
        refs["unnamed"] = test_shared.Box(1)
        test_shared.Box(2, name="{uniq}.named")
        """
    )
    out = subprocess.run([sys.executable, "-c", script], env=child_env, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    refs = spindle.Dict(name=f"{uniq}.refs")
    unnamed = refs["unnamed"]
    assert isinstance(unnamed, Box)
    # The child's session ends --session-ttl (1 s) after it exits: its unnamed box goes.
    def gone() -> bool:
        try:
            unnamed.get()
        except spindle.ObjectNotFound:
            return True
        return False

    assert wait_until(gone)
    assert Box(0, name=f"{uniq}.named").get() == 2
    assert (f"{uniq}.named", "py:test_shared.Box") in spindle.objects(uniq)
    listing = subprocess.run([os.environ["SPINDLE_BIN"], "objects", uniq], env=child_env,
                             capture_output=True, text=True, timeout=60)
    assert "py:test_shared.Box" in listing.stdout, listing


# -- failures that cost a host ----------------------------------------------------------------


def test_a_method_running_past_the_call_timeout_loses_its_object(short_timeout):
    with connected_to(short_timeout):
        looping, bystander = on_two_hosts(Box)
        old_pids = {looping.pid(), bystander.pid()}
        start = time.monotonic()
        with pytest.raises(spindle.ObjectLost) as info:
            looping.spin()
        assert time.monotonic() - start < 30
        assert info.value.reason
        with pytest.raises(spindle.ObjectLost):
            looping.get()  # lost for good
        assert bystander.get() == 0 and bystander.add() == 1  # the other host is untouched
        # New objects work, on the restarted host too.
        assert wait_until(lambda: Box(4).pid() not in old_pids)
        spindle.delete(looping)


def test_os_exit_in_a_method_loses_its_objects_and_the_server_carries_on(short_timeout, uniq):
    with connected_to(short_timeout):
        dying, bystander = on_two_hosts(Box)
        pid = dying.pid()
        neighbours = (Box(i, name=f"{uniq}.{i}") for i in range(100))
        neighbour = next(n for n in neighbours if n.pid() == pid)  # on the same host
        with pytest.raises(spindle.ObjectLost):
            dying.die()
        with pytest.raises(spindle.ObjectLost):
            neighbour.get()  # every object of that host is lost
        assert bystander.add() == 1
        assert spindle.status()["objects"] >= 1
        # Constructing a lost named object again makes a fresh one, with the new arguments.
        again = Box(42, name=neighbour.key)
        assert again.get() == 42 and neighbour.get() == 42


def test_a_result_over_the_frame_limit_is_an_error(short_timeout):
    with connected_to(short_timeout):
        box = Box(1)
        with pytest.raises(ValueError, match="Box.big.*over"):
            box.big(5 << 20)
        assert len(box.big(1000)) == 1000
        assert box.get() == 1


# -- methods do not wait ----------------------------------------------------------------------


def _blocking_cases() -> List[Tuple[str, Any, str, tuple, dict]]:
    return [
        ("lock", lambda: spindle.Lock(), "acquire", (), {}),
        ("lock timeout", lambda: spindle.Lock(), "acquire", (True, 5), {}),
        ("lock with", lambda: spindle.Lock(), "__enter__", (), {}),
        ("rlock", lambda: spindle.RLock(), "acquire", (), {}),
        ("semaphore", lambda: spindle.Semaphore(0), "acquire", (), {}),
        ("event", lambda: spindle.Event(), "wait", (), {}),
        ("event timeout", lambda: spindle.Event(), "wait", (2,), {}),
        ("condition", lambda: spindle.Condition(), "wait", (), {}),
        ("barrier", lambda: spindle.Barrier(2), "wait", (), {}),
        ("queue get", lambda: spindle.Queue(), "get", (), {}),
        ("queue get timeout", lambda: spindle.Queue(), "get", (), {"timeout": 1}),
        ("bounded put", lambda: spindle.Queue(1), "put", (1,), {}),
        ("queue join", lambda: spindle.Queue(), "join", (), {}),
        ("future result", lambda: spindle.Future(), "result", (), {}),
        ("future exception", lambda: spindle.Future(), "exception", (), {}),
        ("latch", lambda: spindle.CountDownLatch(1), "wait", (), {}),
        ("shared object", lambda: Box(1), "get", (), {}),
    ]


@pytest.mark.parametrize("case", _blocking_cases(), ids=lambda c: c[0])
def test_calls_that_could_wait_are_refused_inside_a_method(case):
    _, make, method, args, kwargs = case
    obj = make()
    attempt = Attempt()
    with pytest.raises(spindle.BlockingCallError, match=r"refused inside Attempt.run") as info:
        attempt.run(obj, method, *args, **kwargs)
    assert isinstance(info.value, RuntimeError)


@pytest.mark.parametrize(
    "make, method, args, expected",
    [
        (lambda: spindle.Lock(), "acquire", (False,), True),
        (lambda: spindle.Lock(), "acquire", (True, 0), True),
        (lambda: spindle.Semaphore(1), "acquire", (True, 0), True),
        (lambda: spindle.Event(), "wait", (0,), False),
        (lambda: spindle.Event(), "is_set", (), False),
        (lambda: spindle.Queue(), "put", (1,), None),  # unbounded: never waits
        (lambda: spindle.Queue(2), "put_nowait", (1,), None),
        (lambda: spindle.Queue(), "qsize", (), 0),
        (lambda: spindle.Future(), "done", (), False),
        (lambda: spindle.CountDownLatch(1), "count_down", (), 0),
        (lambda: spindle.Counter(4), "add", (1,), 5),
    ],
)
def test_calls_that_cannot_wait_are_allowed_inside_a_method(make, method, args, expected):
    assert Attempt().run(make(), method, *args) == expected


def test_non_waiting_failures_are_the_usual_exceptions_inside_a_method():
    attempt = Attempt()
    with pytest.raises(queue.Empty):
        attempt.run(spindle.Queue(), "get_nowait")
    with pytest.raises(TimeoutError):
        attempt.run(spindle.Future(), "result", 0)


def test_starting_functions_and_constructing_objects_are_refused_inside_a_method():
    attempt = Attempt()
    with pytest.raises(spindle.BlockingCallError, match="starting a spindle function"):
        attempt.start_thread()
    with pytest.raises(spindle.BlockingCallError, match="constructing the shared object .*Box"):
        attempt.construct()


def test_the_blocking_rule_refuses_before_sending_anything(monkeypatch):
    """In this process, as in a host: refused calls never reach the server (the objects do
    not even exist, so a call that went out would fail otherwise)."""
    import spindle.proxy

    attach = spindle.attach
    refused = [
        lambda: attach("Lock", "nowhere").acquire(),
        lambda: attach("Semaphore", "nowhere").acquire(timeout=3),
        lambda: attach("Event", "nowhere").wait(),
        lambda: attach("Barrier", "nowhere").wait(),
        lambda: attach("Queue", "nowhere").get(),
        lambda: attach("Queue", "nowhere").join(),
        lambda: attach("Future", "nowhere").result(),
        lambda: attach("CountDownLatch", "nowhere").wait(1),
        lambda: attach(Box._type, "nowhere").get(),
        lambda: Box(1),
        lambda: spindle.Thread(target=print).start(),
        lambda: spindle.Executor().submit(print),
        lambda: spindle.parallel_for(print, range(3)),
    ]
    monkeypatch.setattr(spindle.proxy, "running_method", "Test.method")
    for call in refused:
        with pytest.raises(spindle.BlockingCallError, match="Test.method"):
            call()
    with pytest.raises(spindle.ObjectNotFound):  # a non-waiting call does go out
        attach("Queue", "nowhere").get(block=False)


# -- review: versions cover the code a class uses ---------------------------------------------


def test_editing_a_helper_a_constant_or_a_base_class_makes_a_new_version(
    tmp_path, monkeypatch, uniq
):
    """Servers and hosts keep the first code of a version: a class whose helper function,
    module constant or base class changed (its own source did not) must get a new version,
    else the edited program silently runs the old code. Helpers defined below the class
    count too."""
    module = f"helpers_{uniq}"
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(sys, "dont_write_bytecode", True)  # no stale .pyc between edits

    def load(factor: int, offset: int) -> Any:
        (tmp_path / f"{module}.py").write_text(textwrap.dedent(f"""
            import spindle

            class Base:
                def offset(self):
                    return {offset}

            @spindle.shared
            class Scaled(Base):
                def scale(self, x):
                    return helper(x) + self.offset()

            FACTOR = {{"scale": {factor}}}

            def helper(x):
                return x * FACTOR["scale"]
            """))
        sys.modules.pop(module, None)
        return importlib.import_module(module).Scaled

    versions = []
    for factor, offset, expected in [(2, 0, 20), (3, 0, 30), (3, 5, 35)]:
        cls = load(factor, offset)
        versions.append(class_code(cls)[0])
        obj = cls(name=f"{uniq}.scaled")  # one key, so one host, for every version
        assert obj.scale(10) == expected
        spindle.delete(obj)  # no object of this version left: the next may be defined
    assert len(set(versions)) == 3
    assert class_code(load(3, 5))[0] == versions[-1]  # the same code: the same version


def test_a_slot_is_called_an_attribute_not_a_property():
    @spindle.shared
    class Slotted:
        __slots__ = ("value",)

        def get(self) -> Any:
            return self.value

    with pytest.raises(AttributeError, match="'value' is an attribute of"):
        Slotted._attach("~nowhere").value  # noqa: B018


def test_a_host_answers_a_request_of_the_wrong_shape_with_an_error():
    import msgpack

    from spindle import codec
    from spindle.host import Host

    for request in [{"a": 1}, [1, {"op": "call"}], [1, "call", "k", "m", [], {}, 7]]:
        reply = codec.unpackb(Host().handle(msgpack.packb(request))[4:])
        assert reply[1] == 1 and reply[2][0] in ("ProtocolError", "NotFound"), reply


_NOTEBOOK = '''
import linecache, sys, types
import spindle

main = types.ModuleType("__main__")  # a notebook's __main__: no __file__
sys.modules["__main__"] = main

def run_cell(cell, run):
    filename = f"/tmp/ipykernel_{run}/cell.py"  # as ipykernel: the cell's code in linecache
    linecache.cache[filename] = (len(cell), None, cell.splitlines(True), filename)
    exec(compile(cell, filename, "exec"), main.__dict__)
    return main.__dict__["Cell"]

CELL = """
import spindle

LIMIT = 5

@spindle.shared
class Cell:
    SCALE = 10

    def __init__(self, value):
        self.value = value

    def get(self):
        return min(self.value * self.SCALE, LIMIT * 100)
"""
first = run_cell(CELL, 1)(1, name=NAME)
again = run_cell(CELL, 2)(2, name=NAME)  # the cell runs again, unchanged: attaches
print(again.get())
try:
    run_cell(CELL.replace("SCALE = 10", "SCALE = 20"), 3)(3, name=NAME + ".edited")
except spindle.TypeMismatch:
    print("edited: TypeMismatch")
spindle.delete(first)
'''


def test_a_notebook_cell_run_again_attaches_to_its_named_object(child_env, uniq):
    """A class of a notebook cell has no source for ``inspect`` (``__main__`` has no file): its
    version must still be the same each time the unchanged cell runs (in any kernel), so
    that constructing a named object again attaches to it, and differ once it is edited."""
    out = subprocess.run([sys.executable, "-c", f"NAME = {uniq!r}\n" + _NOTEBOOK], env=child_env,
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split("\n")[:2] == ["10", "edited: TypeMismatch"]


def test_instances_of_classes_of_the_programs_own_modules_travel_by_value(
    tmp_path, monkeypatch, uniq
):
    """A class of one of the program's modules (which the hosts cannot import) travels by
    value as an argument, as the shared class of that module does."""
    module = f"geometry_{uniq}"
    (tmp_path / f"{module}.py").write_text(textwrap.dedent("""
        import dataclasses
        import spindle

        @dataclasses.dataclass
        class Point:
            x: int
            y: int

        @spindle.shared
        class Shape:
            def __init__(self, *points):
                self.points = list(points)

            def add(self, point):
                assert isinstance(point, Point)
                self.points.append(point)
                return len(self.points)

            def last(self):
                return self.points[-1]
        """))
    monkeypatch.syspath_prepend(str(tmp_path))
    geometry = importlib.import_module(module)
    shape = geometry.Shape(geometry.Point(0, 0))
    assert shape.add(geometry.Point(1, 2)) == 2
    assert shape.add(point=(geometry.Point(3, 4))) == 3
    last = shape.last()
    assert type(last) is geometry.Point and last == geometry.Point(3, 4)


@spindle.shared
class Person:
    def __init__(self, name: str, age: int = 0) -> None:
        self.person = name

    def get(self) -> str:
        return self.person


def test_a_constructor_parameter_called_name_missing_says_why(uniq):
    """``name=`` is the Spindle object's name: a class's own ``name`` parameter left out
    because of it is explained, not just reported missing."""
    with pytest.raises(TypeError, match="can only be given positionally") as info:
        Person(name=f"{uniq}.ann")
    assert "missing 1 required positional argument: 'name'" in str(info.value)
    assert spindle.objects(uniq) == []
    assert Person("ann", name=f"{uniq}.ann").get() == "ann"
    assert Person(name=f"{uniq}.ann").get() == "ann"  # attaches: no constructor runs
    with pytest.raises(TypeError, match="missing 1 required positional argument: 'name'$"):
        Person()  # unnamed: nothing to explain


def test_a_program_run_again_gets_its_own_classes_back(child_env, tmp_path, uniq):
    """The server keeps the first code sent for a version, with the classes it carries: the
    results and exceptions of a second program (or the same one run again) must still be of
    that program's classes (``except ShapeError`` catches, a returned Point is a Point)."""
    module = f"shapes_{uniq}"
    (tmp_path / f"{module}.py").write_text(textwrap.dedent("""
        import dataclasses
        import spindle

        class ShapeError(Exception):
            pass

        @dataclasses.dataclass
        class Point:
            x: int
            y: int

        @spindle.shared
        class Shape:
            def origin(self):
                return Point(0, 0)

            def fail(self):
                raise ShapeError("no")
        """))
    (tmp_path / "prog.py").write_text(textwrap.dedent(f"""
        from {module} import Point, Shape, ShapeError

        shape = Shape()
        print(shape.origin() == Point(0, 0))
        try:
            shape.fail()
        except ShapeError:
            print("caught")
        """))
    for _ in range(2):
        out = subprocess.run([sys.executable, str(tmp_path / "prog.py")], env=child_env,
                             capture_output=True, text=True, timeout=60)
        assert out.returncode == 0, out.stderr
        assert out.stdout.split() == ["True", "caught"]


@spindle.shared
@dataclasses.dataclass
class Tally:
    total: int = 0

    def add(self, n: int) -> int:
        self.total += n
        return self.total


def test_a_dataclass_is_versioned_by_its_source_as_other_classes(child_env, uniq):
    """A dataclass's generated methods have no source: its version must still come from its
    source (not from its pickle, which differs in every process), so that another program
    constructing the named object attaches to it."""
    from spindle.shared import _source_version

    assert _source_version(Tally.__wrapped__) is not None
    tally = Tally(name=f"{uniq}.tally")
    tally.add(2)
    code = f"from test_shared import Tally\nprint(Tally(name={uniq + '.tally'!r}).add(3))"
    out = subprocess.run([sys.executable, "-c", code], env=child_env, capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["5"]
    spindle.delete(tally)


def test_a_connection_that_could_not_open_is_dropped_quietly(monkeypatch):
    """Calling a proxy while the server is down must raise ServerUnavailable, not also print
    'Exception ignored in Connection.close' for every attempt."""
    import gc

    from conftest import free_port
    from spindle.client import Connection

    unraisable: List[Any] = []
    monkeypatch.setattr(sys, "unraisablehook", unraisable.append)
    with pytest.raises(OSError):
        Connection("127.0.0.1", free_port(), "session", 1)
    gc.collect()
    assert unraisable == []


def test_a_class_using_helpers_of_other_modules_of_the_program_works(
    tmp_path, monkeypatch, uniq
):
    """The hosts cannot import the program's modules: a class whose methods use a helper
    from a sibling module of its package, or from another module of the program, must
    bring them along (not fail in the host with ModuleNotFoundError)."""
    package = tmp_path / f"proj_{uniq}"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "utils.py").write_text("def double(x):\n    return 2 * x\n")
    (tmp_path / f"tools_{uniq}.py").write_text("def inc(x):\n    return x + 1\n")
    (package / "models.py").write_text(textwrap.dedent(f"""
        import spindle
        from tools_{uniq} import inc
        from .utils import double

        @spindle.shared
        class Model:
            def run(self, x):
                return inc(double(x))
        """))
    monkeypatch.syspath_prepend(str(tmp_path))
    model = importlib.import_module(f"proj_{uniq}.models").Model()
    assert model.run(20) == 41


@spindle.shared
class Inspector:
    def is_object_lost(self, value: Any) -> bool:
        return isinstance(value, spindle.ObjectLost)


def test_spindles_own_classes_reach_a_host_as_themselves():
    """Spindle's modules are in every host however Spindle is installed (an editable install
    is not under site-packages): its classes travel by reference, not as copies."""
    assert Inspector().is_object_lost(spindle.ObjectLost("lost", "a test"))


def test_a_child_spawned_by_multiprocessing_has_the_main_scripts_types(child_env, tmp_path, uniq):
    """multiprocessing's spawn (and forkserver) children import the main script as
    ``__mp_main__``: its classes must still be the ``py:__main__...`` types, so that a child
    constructs (attaches to) the parent's named object and gets proxies of the class."""
    script = tmp_path / "prog.py"
    script.write_text(textwrap.dedent(f"""
        import multiprocessing
        import spindle

        @spindle.shared
        class Acc:
            def __init__(self):
                self.n = 0

            def add(self, k):
                self.n += k
                return self.n

        def child(acc):
            return [type(acc) is Acc, acc.add(1), Acc(name="{uniq}.acc").add(10)]

        if __name__ == "__main__":
            acc = Acc(name="{uniq}.acc")
            with multiprocessing.get_context("spawn").Pool(1) as pool:
                print(pool.apply(child, (acc,)))
            spindle.delete(acc)
        """))
    out = subprocess.run([sys.executable, str(script)], env=child_env, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split("\n")[0] == "[True, 1, 11]"


@spindle.shared
class Fluent:
    def __init__(self) -> None:
        self.lock = threading.Lock()  # the state does not pickle: it must not travel

    def inside(self) -> Any:
        return [self, {"me": self, "pair": (self, 1)}]


def test_the_object_anywhere_in_a_result_comes_back_as_its_proxy():
    """As ``return self`` does: the object in a list, dict or tuple of the result is its
    proxy, not a copy of its state (which may not even pickle)."""
    fluent = Fluent()
    me, inner = fluent.inside()
    assert me == fluent and type(me) is Fluent
    assert inner["me"] == fluent and inner["pair"] == (fluent, 1)
