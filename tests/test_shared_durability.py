"""Persistent user-defined objects (``@spindle.shared(persistent=True)``) across real crashes:
``kill -9`` of the server, object hosts that exit or run past the object call timeout
(docs/durability.md, "Persistent user-defined objects"). Every test runs its own server
with a data directory; the classes below travel to the hosts by value, as in any program.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, Iterator, List, Tuple

import pytest

import spindle
from conftest import ServerProcess, connected_to, pythonpath_for_tests, stable_port
from load import LoadClients, assert_under_load, kills_under_load
from spindle.shared import class_code


@spindle.shared(persistent=True)
class Ledger:
    """An append-only list of entries, with a few ways to misbehave."""

    def __init__(self, *first: Any) -> None:
        self.entries: List[Any] = list(first)

    def add(self, entry: Any) -> int:
        self.entries.append(entry)
        return len(self.entries)

    def get(self) -> List[Any]:
        return list(self.entries)

    def add_then_raise(self, entry: Any) -> None:
        self.entries.append(entry)
        raise ValueError(f"refused {entry!r} (after adding it)")

    def add_then_crash(self, entry: Any) -> None:
        self.entries.append(entry)
        os._exit(3)

    def add_then_hang(self, entry: Any, ended: str) -> None:
        self.entries.append(entry)
        time.sleep(60)
        open(ended, "w").close()

    def add_unpicklable(self, entry: Any) -> int:
        self.entries.append(entry)
        self.lock = threading.Lock()  # a lock does not pickle
        return len(self.entries)


@spindle.shared(persistent=True)
class Slotted:
    """State as ``(dict, slots)``, and a ``__getstate__``/``__setstate__`` pair elsewhere."""

    __slots__ = ("count", "__dict__")

    def __init__(self) -> None:
        self.count = 0
        self.note = "n"

    def bump(self) -> Tuple[int, str]:
        self.count += 1
        self.note += "!"
        return self.count, self.note


@spindle.shared(persistent=True)
class Custom:
    def __init__(self) -> None:
        self.value = 1

    def __getstate__(self) -> dict:
        return {"v": self.value}

    def __setstate__(self, state: dict) -> None:
        self.value = state["v"] * 10  # restoring is visible

    def double(self) -> int:
        self.value *= 2
        return self.value


@spindle.shared
class Ephemeral:
    def __init__(self) -> None:
        self.n = 0


class Durable:
    """A server with a data directory, restartable on the same port; this process's
    proxies talk to it while the test runs."""

    def __init__(self, data_dir: Path, *args: str) -> None:
        self.data_dir, self.args = data_dir, args
        self.port = stable_port()
        self.server = self._start()

    def _start(self) -> ServerProcess:
        return ServerProcess(
            "--data-dir", str(self.data_dir), "--session-ttl", "30", "--python", sys.executable,
            *self.args, port=self.port,
        )

    @property
    def address(self) -> str:
        return self.server.address

    def crash_and_restart(self) -> None:
        self.server.kill()  # SIGKILL
        self.server = self._start()

    def stop(self) -> None:
        self.server.kill()


@contextlib.contextmanager
def durable(tmp_path: Path, *args: str) -> Iterator[Durable]:
    d = Durable(tmp_path / "data", *args)
    try:
        with connected_to(d.address):
            yield d
    finally:
        d.stop()


# A process without the class: it reaches the object by name with a generic proxy.
ATTACH = r"""
import json, sys
import spindle
address, type_name, key = sys.argv[1:]
spindle.connect(address, embedded=False)
ledger = spindle.attach(type_name, key)
print(json.dumps([type(ledger).__name__, ledger.get(), ledger.add("from a generic proxy")]))
"""


def run_attach(address: str, key: str) -> List[Any]:
    env = dict(os.environ, PYTHONPATH=pythonpath_for_tests(), SPINDLE_ADDRESS=address)
    out = subprocess.run([sys.executable, "-c", ATTACH, address, Ledger._type, key],
                         capture_output=True, text=True, env=env, timeout=60)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def test_state_survives_kill_9_and_is_reachable_without_the_class(tmp_path):
    with durable(tmp_path) as d:
        ledger = Ledger("a", name="ledger")
        assert ledger.add("b") == 2
        with pytest.raises(ValueError, match="refused 'c'"):
            ledger.add_then_raise("c")
        # A method that raises keeps what it did, as a local object would: logged too.
        assert ledger.get() == ["a", "b", "c"]
        unnamed = Ledger("u")
        assert unnamed.add("v") == 2
        d.crash_and_restart()
        assert spindle.objects(persistent=True) == [("ledger", Ledger._type)]
        # A process that never had the class: the server recovered it (no define needed).
        kind, seen, added = run_attach(d.address, "ledger")
        assert (kind, seen, added) == ("Ledger", ["a", "b", "c"], 4)
        # Constructing the name again attaches (its arguments are ignored).
        again = Ledger("ignored", name="ledger")
        assert again.get() == ["a", "b", "c", "from a generic proxy"]
        # The unnamed one lives with this session, which the restart did not end.
        assert unnamed.get() == ["u", "v"]
        # The recovered class holds its version: the same version again is a no-op, another
        # one is refused while the stored objects exist.
        client = spindle.Client(d.address)
        version, code = class_code(Ledger)
        assert client.define(Ledger._type, version, code) is True
        with pytest.raises(spindle.TypeMismatch, match=r"1 named object\(s\) \('ledger'\)"):
            client.define(Ledger._type, "another-version", code)
        client.close()
        d.crash_and_restart()
        assert ledger.get() == ["a", "b", "c", "from a generic proxy"]


def test_slots_and_setstate_follow_pickle(tmp_path):
    with durable(tmp_path) as d:
        s = Slotted(name="slotted")
        assert s.bump() == (1, "n!")
        c = Custom(name="custom")
        assert c.double() == 2
        d.crash_and_restart()
        assert s.bump() == (2, "n!!")
        # Restored through __setstate__ (which multiplies by 10 here): 2 * 10, doubled.
        assert c.double() == 40


def test_a_host_crash_restores_the_last_acknowledged_state(tmp_path):
    with durable(tmp_path) as d:
        ledger = Ledger(name="crashy")
        ledger.add(1)
        with pytest.raises(spindle.ObjectLost) as info:
            ledger.add_then_crash(2)
        reason = str(info.value)
        assert "its object host exited with status 3" in reason
        assert "restored to its last acknowledged state" in reason
        assert "this call did not take effect" in reason
        # The crashing call's change is gone; the object works on in a new host.
        assert ledger.get() == [1]
        assert ledger.add(3) == 2
        d.crash_and_restart()
        assert ledger.get() == [1, 3]


def test_a_method_past_the_call_timeout_restores_rather_than_loses(tmp_path):
    with durable(tmp_path, "--object-call-timeout", "1") as d:
        ledger = Ledger(name="slow")
        ledger.add("kept")
        ended = tmp_path / "ended"
        with pytest.raises(spindle.ObjectLost, match="ran longer than the object call timeout"):
            ledger.add_then_hang("gone", str(ended))
        assert not ended.exists(), "answered while the method still ran, not when it ended"
        assert ledger.get() == ["kept"]
        ledger.add("after")
        d.crash_and_restart()
        assert ledger.get() == ["kept", "after"]


def test_an_unpicklable_state_is_an_error_and_the_object_keeps_its_last_state(tmp_path):
    with durable(tmp_path) as d:
        ledger = Ledger(name="locky")
        ledger.add(1)
        with pytest.raises(TypeError, match="cannot pickle the state of the persistent object"):
            ledger.add_unpicklable(2)
        # Memory and disk agree: the host went back to the last logged state.
        assert ledger.get() == [1]
        assert ledger.add(3) == 2
        d.crash_and_restart()
        assert ledger.get() == [1, 3]


def test_an_unpicklable_state_after_the_constructor_leaves_no_object(tmp_path):
    @spindle.shared(persistent=True)
    class Locked:
        def __init__(self) -> None:
            self.lock = threading.Lock()

        def ping(self) -> int:
            return 1

    with durable(tmp_path):
        with pytest.raises(TypeError, match="cannot pickle the state"):
            Locked(name="locked")
        assert spindle.objects(persistent=True) == []


def test_delete_survives_a_restart(tmp_path):
    with durable(tmp_path) as d:
        ledger = Ledger("x", name="doomed")
        keep = Ledger("y", name="kept")
        assert spindle.delete(ledger) is True
        d.crash_and_restart()
        assert spindle.objects(persistent=True) == [("kept", Ledger._type)]
        assert keep.get() == ["y"]
        with pytest.raises(spindle.ObjectNotFound):
            ledger.get()
        assert Ledger("fresh", name="doomed").get() == ["fresh"]


def test_persistent_needs_a_data_directory(uniq):
    # The session's server has no --data-dir.
    with pytest.raises(ValueError, match="no --data-dir"):
        Ledger(name=f"{uniq}.nope")
    # And the flag is part of the object: an ephemeral object's name stays ephemeral.
    e = Ephemeral(name=f"{uniq}.e")
    assert spindle.objects(f"{uniq}.", persistent=True) == []
    spindle.delete(e)


def test_a_retried_call_after_a_restart_gets_its_recorded_reply(tmp_path):
    with durable(tmp_path) as d:
        Ledger(name="once")
        client = spindle.Client(d.address)
        with client.scope("retrying-session"):
            first = client.call(Ledger._type, "once", "add", [["only once"], {}], True)
        assert first == 1
        d.crash_and_restart()
        client = spindle.Client(d.address)
        # The same session and seq: the recorded reply, and the method does not run again.
        with client.scope("retrying-session"):
            again = client.call(Ledger._type, "once", "add", [["only once"], {}], True)
        assert again == 1
        assert Ledger(name="once").get() == ["only once"]


# A client appending to a persistent ledger until told to stop, recording every
# acknowledged result and when it came; the server dies under it again and again and the
# SDK resends each call, with the same seq, until the restarted server answers. Arguments:
# address, then the stop, progress and output files (see load.py).
LOAD = r"""
import json, os, sys
import spindle, spindle.client
from load import Progress
spindle.client.RETRIES = 9

@spindle.shared(persistent=True)
class Ledger:
    def __init__(self):
        self.entries = []

    def add(self, entry):
        self.entries.append(entry)
        return len(self.entries)

    def get(self):
        return list(self.entries)

address, stop, progress, out = sys.argv[1:]
spindle.connect(address, embedded=False)
ledger = Ledger(name="load")
progress = Progress(progress)
acked = []
i = 0
while not os.path.exists(stop):
    i += 1
    acked.append([i, ledger.add(i)])
    progress.acknowledged()
with open(out, "w") as f:
    json.dump({"acked": acked, "final": ledger.get(), "acked_at": progress.times}, f)
"""


# With a tiny --snapshot-after, kills also land while snapshots are captured and written,
# and restarts begin from one.
@pytest.mark.parametrize("snapshots", [[], ["--snapshot-after", "4096"]], ids=["log-only", "snapshots"])
def test_no_acknowledged_call_is_lost_or_repeated_across_kills(tmp_path, snapshots):
    d = Durable(tmp_path / "data", *snapshots)
    env = dict(os.environ, SPINDLE_ADDRESS=d.address)
    try:
        with LoadClients(LOAD, lambda i: [d.address], 1, tmp_path, env) as load:
            window = kills_under_load(load, d.crash_and_restart, 5, random.Random(7))
            [result] = load.stop()
    finally:
        d.stop()
    acked, final = result["acked"], result["final"]
    # The kills landed under load: acknowledged calls before the first and after the last,
    # by the times the client wrote down.
    assert_under_load([result], window)
    assert len(result["acked_at"]) == len(acked)
    # Each call ran exactly once, in order: entry i is at position i.
    assert acked == [[i, i] for i in range(1, len(acked) + 1)]
    assert final == list(range(1, len(acked) + 1))
    if snapshots:
        assert list((tmp_path / "data" / "wal").glob("snap-*.sps")), "snapshots were written"
