"""Values of every kind through every object: instances of classes of ``__main__`` (plain
classes, dataclasses, namedtuples, enums) travel through Queue, Dict, List, Value, Future and
function results, to and from cloud functions; a value that does not decode where it is read
raises a clear error there, never a placeholder."""

from __future__ import annotations

import pickle
import subprocess
import sys
import textwrap

import msgpack
import pytest

import spindle
from spindle import codec

PROGRAM = textwrap.dedent(
    """
    import collections, dataclasses, enum, sys
    import spindle

    @dataclasses.dataclass
    class Point:
        x: int
        y: int

    class Color(enum.Enum):
        RED = 1
        BLUE = 2

    Pair = collections.namedtuple("Pair", "a b")

    class Box:
        def __init__(self, v):
            self.v = v

        def __eq__(self, other):
            return type(other).__name__ == "Box" and other.v == self.v

    def values():
        return [Point(1, 2), Color.BLUE, Pair(1, [2]), Box(Point(3, 4))]

    def relay(q, d, l, v, f):
        # In a worker: read each object's values, check they are this process's classes,
        # and write them back through other objects.
        got = [q.get(timeout=60) for _ in range(4)]
        got += [d[i] for i in range(4)] + list(l) + v.get() + f.result(60)
        expected = values()
        for value, want in zip(got, expected * 5):
            assert type(value) is type(want) and value == want, (value, want)
        for i, value in enumerate(got[:4]):
            q.put(value)
            d[f"back{i}"] = value
        v.set(got[:4])
        return got[:4]

    if __name__ == "__main__":
        q, d, l = spindle.Queue(), spindle.Dict(), spindle.List()
        v, f = spindle.Value(), spindle.Future()
        for i, value in enumerate(values()):
            q.put(value)
            d[i] = value
            l.append(value)
        v.set(values())
        f.set_result(values())
        with spindle.Executor(echo=False) as ex:
            returned = ex.submit(relay, q, d, l, v, f).result(120)
        read = [q.get(timeout=60) for _ in range(4)]
        read += [d[f"back{i}"] for i in range(4)] + v.get() + returned
        for value, want in zip(read, values() * 4):
            assert type(value) is type(want) and value == want, (value, want)
        assert read[1] is Color.BLUE  # an enum member comes back as this very member
        print("ok", len(read))
    """
)


def test_values_of_main_classes_travel_through_every_object(child_env, tmp_path):
    script = tmp_path / "prog.py"
    script.write_text(PROGRAM)
    out = subprocess.run([sys.executable, str(script)], env=child_env, capture_output=True,
                         text=True, timeout=180)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["ok", "16"]


class Local:
    def __init__(self, v: int) -> None:
        self.v = v


def test_a_value_that_does_not_decode_here_raises_where_it_is_read(uniq):
    # A pickle naming a class this process lacks (as an older client wrote a __main__ class)
    # is an UndecodableValue at the read, naming the class, not a placeholder.
    d = spindle.Dict(name=f"{uniq}.d")
    gone = pickle.dumps(Local(1)).replace(b"test_values", b"test_gone__")
    d["bad"] = msgpack.ExtType(codec.EXT_PICKLE, gone)
    d["good"] = 1
    with pytest.raises(spindle.UndecodableValue, match="test_gone__"):
        d["bad"]
    with pytest.raises(spindle.UndecodableValue):
        d.copy()
    assert d["good"] == 1  # the connection stays in step
