"""Persistent objects across real crashes: `kill -9` of the server, torn and corrupt logs,
`spindle repair`, the write-ahead log shared by the partitions, and data directories of the
per-partition layout (docs/durability.md)."""

from __future__ import annotations

import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Dict, List

import pytest

import spindle
from conftest import (
    ServerProcess, connected_to, pythonpath_for_tests, server_binary, stable_port, wait_until,
)
from load import EXACTLY_ONCE, LoadClients, assert_under_load, kills_under_load


def durable_server(data_dir: Path, *args: str, port: int = 0, **kwargs) -> ServerProcess:
    return ServerProcess("--data-dir", str(data_dir), *args, port=port, **kwargs)


def segments(data_dir: Path) -> List[Path]:
    """The write-ahead log's segments, oldest first."""
    return sorted((data_dir / "wal").glob("log-*.spl"))


def snapshot_files(data_dir: Path) -> List[Path]:
    return sorted((data_dir / "wal").glob("snap-*.sps"))


def snapshot_segments(data_dir: Path) -> Dict[int, List[int]]:
    """Each partition's snapshots, by the log segment each covers up to."""
    out: Dict[int, List[int]] = {}
    for path in snapshot_files(data_dir):
        _, partition, seq, _ = path.stem.split("-")
        out.setdefault(int(partition), []).append(int(seq))
    return out


def segment_seq(path: Path) -> int:
    return int(path.stem.split("-")[2])


def record_partitions(data_dir: Path) -> List[int]:
    """The partition of every record in the write-ahead log, in log order (each record's
    payload starts with its partition, 4 bytes little-endian)."""
    out = []
    for segment in segments(data_dir):
        data = segment.read_bytes()
        at = 32
        while at + 8 <= len(data) and (length := int.from_bytes(data[at:at + 4], "little")):
            out.append(int.from_bytes(data[at + 8:at + 12], "little"))
            at += 8 + length
    return out


def start_refused(data_dir: Path) -> subprocess.CompletedProcess:
    """Start a server that is expected to refuse to start."""
    return subprocess.run(
        [server_binary(), "server", "--port", "0", "--data-dir", str(data_dir)],
        capture_output=True,
        text=True,
        timeout=30,
        stdin=subprocess.DEVNULL,
    )


# Without snapshots the log only grows; with a tiny --snapshot-after, kills also land while
# snapshots are captured and written, and recovery starts from one.
@pytest.mark.parametrize("snapshots", [[], ["--snapshot-after", "4096"]], ids=["log-only", "snapshots"])
def test_acknowledged_updates_survive_20_kills_exactly_once(tmp_path, snapshots):
    port = stable_port()
    server = durable_server(tmp_path, "--session-ttl", "30", *snapshots, port=port)
    address = f"127.0.0.1:{port}"
    env = dict(os.environ, SPINDLE_ADDRESS=address)

    def kill_and_restart() -> None:
        nonlocal server
        server.kill()  # SIGKILL
        server = durable_server(tmp_path, "--session-ttl", "30", *snapshots, port=port)

    try:
        with LoadClients(EXACTLY_ONCE, lambda i: [address, "load", str(i)], 3, tmp_path, env) as load:
            window = kills_under_load(load, kill_and_restart, 20, random.Random(5))
            results = load.stop()
    finally:
        server.kill()
    # The kills landed under load: acknowledged calls before the first and after the last,
    # by the times the clients wrote down.
    assert_under_load(results, window)
    # One last crash, then check what the log rebuilt.
    assert_recovered_exactly_once(tmp_path, port, "load", results)
    if snapshots:
        assert snapshot_files(tmp_path), "snapshots were written"
        assert segment_seq(segments(tmp_path)[0]) > 1, "the log was compacted"


def assert_recovered_exactly_once(data_dir: Path, port: int, prefix: str, results: List[dict]) -> None:
    """Start a server on ``data_dir`` and check that the ``EXACTLY_ONCE`` load's acknowledged
    calls are all there, each exactly once."""
    server = durable_server(data_dir, port=port)
    try:
        client = spindle.Client(server.address)
        seen = sorted(v for r in results for v in r["seen"])
        # Every acknowledged increment is there, each exactly once: the results the
        # clients saw are 1..n with no gap and no repeat.
        assert seen == list(range(1, len(seen) + 1))
        assert client.call("Counter", f"{prefix}.shared", "get", []) == len(seen)
        for i, r in enumerate(results):
            assert client.call("Counter", f"{prefix}.c{i}", "get", []) == r["adds"]
            assert client.call("Dict", f"{prefix}.dict", "getitem", [f"k{i}"]) == r["merged"]
            assert r["adds"] == r["merged"] == len(r["seen"]) == len(r["acked_at"])
        client.close()
    finally:
        server.stop()


def recovered_records(log: str) -> int:
    """The ``records`` (replayed) of the server log's "recovered" line."""
    line = next(line for line in log.splitlines() if "recovered in" in line)
    return int(line.split("records=")[1].split()[0])


def test_recovery_loads_a_snapshot_and_replays_only_the_log_after_it(tmp_path):
    port = stable_port()
    flags = ["--partitions", "2", "--snapshot-after", "4096"]
    server = durable_server(tmp_path, *flags, port=port)
    try:
        with connected_to(server.address):
            counters = [spindle.Counter(name=f"c{i}", persistent=True) for i in range(20)]
            totals = spindle.Dict(name="totals", persistent=True)
            jobs = spindle.Queue(name="jobs", persistent=True)
            for round in range(150):
                for c in counters:
                    c.add(1)
                totals.merge(f"k{round % 7}", 1, "sum")
                jobs.put(round)
            assert jobs.get() == 0
            history = 150 * 22 + 20 + 3 + 1
            server.kill()
            log = tmp_path / "server.log"
            with open(log, "w") as stderr:
                server = durable_server(tmp_path, *flags, port=port, stderr=stderr)
            assert [c.get() for c in counters] == [150] * 20
            assert sum(totals.values()) == 150 and len(totals) == 7
            assert jobs.qsize() == 149 and jobs.get() == 1
            # Recovery time follows the snapshot and the tail, not the history.
            replayed = recovered_records(log.read_text())
            assert replayed < history // 4, f"replayed {replayed} of {history} records"
            assert "snapshots=2" in log.read_text()
            # The log behind the snapshots is gone: a few segments per partition are left
            # (once a snapshot the restart began is published and the older ones pruned).
            assert wait_until(lambda: len(segments(tmp_path)) <= 2 * 3), segments(tmp_path)
            assert wait_until(lambda: len(snapshot_files(tmp_path)) <= 2 * 2), snapshot_files(tmp_path)
    finally:
        server.stop()


# A client that makes an unnamed persistent object (owned by its session), says so, and
# waits to be killed.
OWNER = r"""
import sys, time
import spindle
spindle.connect(sys.argv[1], embedded=False)
mine = spindle.Counter(persistent=True)
mine.add(7)
print("made", flush=True)
time.sleep(600)
"""


# With a TTL of 0 the session ends during recovery, which must log it too.
@pytest.mark.parametrize("ttl", ["1", "0"])
def test_a_session_that_never_comes_back_after_a_restart_ends(tmp_path, ttl):
    port = stable_port()
    server = durable_server(tmp_path, "--session-ttl", ttl, port=port)
    owner = subprocess.Popen(
        [sys.executable, "-c", OWNER, server.address],
        stdout=subprocess.PIPE,
        text=True,
        env=dict(os.environ, PYTHONPATH=pythonpath_for_tests()),
    )
    try:
        assert owner.stdout.readline().strip() == "made"
        # The server and its client die together; the client never comes back.
        server.kill()
        owner.kill()
        owner.wait()
        server = durable_server(tmp_path, "--session-ttl", ttl, port=port)
        client = spindle.Client(server.address)
        if ttl != "0":
            assert client.status()["persistent_objects"] == 1, "recovered with its session"
        # The session ends a TTL after the restart, durably: its unnamed object goes.
        assert wait_until(lambda: client.status()["persistent_objects"] == 0, deadline=15)
        client.close()
        server.kill()
        server = durable_server(tmp_path, "--session-ttl", ttl, port=port)
        client = spindle.Client(server.address)
        assert client.status()["persistent_objects"] == 0
        client.close()
    finally:
        if owner.poll() is None:
            owner.kill()
        server.stop()


def test_a_damaged_newest_snapshot_falls_back_to_the_older_one(tmp_path):
    port = stable_port()
    flags = ["--partitions", "1", "--snapshot-after", "2048"]
    server = durable_server(tmp_path, *flags, port=port)
    try:
        with connected_to(server.address):
            n = spindle.Counter(name="n", persistent=True)
            for _ in range(400):
                n.add(1)
            assert wait_until(lambda: len(snapshot_files(tmp_path)) == 2)
            server.kill()
            newest = snapshot_files(tmp_path)[-1]
            data = bytearray(newest.read_bytes())
            data[-3] ^= 0xFF
            newest.write_bytes(bytes(data))
            log = tmp_path / "server.log"
            with open(log, "w") as stderr:
                server = durable_server(tmp_path, *flags, port=port, stderr=stderr)
            assert n.get() == 400
            text = log.read_text()
            assert f"ignoring snapshot {newest}" in text and "checksum" in text, text
    finally:
        server.stop()


def test_ephemeral_objects_are_gone_after_a_restart_persistent_ones_are_there(tmp_path):
    port = stable_port()
    server = durable_server(tmp_path, port=port)
    try:
        with connected_to(server.address):
            kept = spindle.Dict({"a": 1}, name="kept", persistent=True)
            kept["b"] = 2
            queue = spindle.Queue(name="jobs", persistent=True)
            queue.put("first")
            queue.put("second")
            assert queue.get() == "first"
            spindle.Counter(5, name="scratch").add(1)
            listed = subprocess.run(
                [server_binary(), "objects", "--persistent", "--address", server.address],
                capture_output=True,
                text=True,
                check=True,
            ).stdout
            assert "kept" in listed and "jobs" in listed and "scratch" not in listed
            server.kill()
            server = durable_server(tmp_path, port=port)
            assert dict(kept.items()) == {"a": 1, "b": 2}
            assert queue.get(timeout=5) == "second"
            with pytest.raises(spindle.ObjectNotFound):
                spindle.attach("Counter", "scratch").get()
            assert spindle.objects() == [("jobs", "Queue"), ("kept", "Dict")]
            spindle.Counter(name="fresh")
            assert spindle.objects(persistent=True) == [("jobs", "Queue"), ("kept", "Dict")]
            # Delete is durable too.
            assert spindle.delete(kept)
            server.kill()
            server = durable_server(tmp_path, port=port)
            assert spindle.objects() == [("jobs", "Queue")], "deleted, and the ephemeral one gone"
    finally:
        server.stop()


@pytest.mark.parametrize("fsync", ["always", "interval=10ms", "never"])
def test_every_fsync_policy_survives_a_crash_of_the_server(tmp_path, fsync):
    # A process crash loses nothing under any policy: written means in the page cache.
    port = stable_port()
    server = durable_server(tmp_path, "--fsync", fsync, port=port)
    try:
        with connected_to(server.address):
            n = spindle.Counter(name="n", persistent=True)
            for _ in range(200):
                n.add(1)
            server.kill()
            server = durable_server(tmp_path, "--fsync", fsync, port=port)
            assert n.get() == 200
    finally:
        server.stop()


def test_a_parked_get_does_not_survive_a_restart(tmp_path):
    port = stable_port()
    server = durable_server(tmp_path, port=port)
    script = (
        "import spindle, sys\n"
        "spindle.connect(sys.argv[1], embedded=False)\n"
        "spindle.attach('Queue', 'q').get()\n"
    )
    env = dict(os.environ, PYTHONPATH=pythonpath_for_tests())
    getter = None
    try:
        with connected_to(server.address):
            queue = spindle.Queue(name="q", persistent=True)
            # `ParkedProbe` cannot probe a persistent object: the server refuses to `keep` one
            # (ValueError) before it looks for parked callers (`Partition::detach`). So this
            # reads the counters of a server only this test uses, where the getter's get is
            # the only call after ours: it is parked once the server counted it (a first
            # status) and, in a second one, had no reply recorded for it (the reply would be
            # recorded under the same hold of the shard's lock as the call was counted), while
            # the getter is still connected (its session's end would drop a parked call).
            before = spindle.status()
            getter = subprocess.Popen([sys.executable, "-c", script, server.address], env=env)

            def parked() -> bool:
                applied = spindle.status()["calls"] == before["calls"] + 1
                now = spindle.status()
                still_connected = now["connections"] == before["connections"] + 1
                return applied and now["replies"] == before["replies"] and still_connected

            assert wait_until(parked)
            getter.kill()
            assert getter.wait() == -signal.SIGKILL, "the getter was still waiting in get"
            server.kill()
            server = durable_server(tmp_path, port=port)
            # Its put finds no getter from the old server: the item stays.
            queue.put("x")
            server.kill()
            server = durable_server(tmp_path, port=port)
            assert queue.qsize() == 1
    finally:
        if getter is not None:
            getter.kill()
        server.stop()


def test_persistent_needs_a_durable_type_and_a_data_dir(tmp_path):
    # The session's server has no --data-dir.
    with pytest.raises(ValueError, match="Lock is a synchronization object, ephemeral by nature"):
        spindle.Lock(name="never", persistent=True)
    with pytest.raises(ValueError, match="this server has no --data-dir"):
        spindle.Counter(name="never", persistent=True)
    server = durable_server(tmp_path)
    try:
        with connected_to(server.address):
            with pytest.raises(ValueError, match="Event is a synchronization object"):
                spindle.Event(name="e", persistent=True)
            spindle.Counter(name="plain")
            with pytest.raises(ValueError, match="existing ephemeral Counter"):
                spindle.Counter(name="plain", persistent=True)
    finally:
        server.stop()


def test_a_torn_tail_is_truncated_at_start(tmp_path):
    server = durable_server(tmp_path, "--partitions", "1")
    with connected_to(server.address):
        n = spindle.Counter(name="n", persistent=True)
        for _ in range(10):
            n.add(1)
    server.kill()
    [segment] = segments(tmp_path)
    # A live segment is preallocated: its records end where the zeros begin.
    data = segment.read_bytes()
    end = 32
    while int.from_bytes(data[end:end + 4], "little"):
        end += 8 + int.from_bytes(data[end:end + 4], "little")
    assert len(data) > end and not any(data[end:]), "preallocated space after the records"
    # A write cut short by a crash: half of a new record after them.
    with open(segment, "r+b") as f:
        f.seek(end)
        f.write(b"\x40\x00\x00\x00\x12\x34")
    with tempfile.TemporaryFile("w+") as log:
        server = durable_server(tmp_path, "--partitions", "1", stderr=log)
        try:
            with connected_to(server.address):
                assert n.get() == 10
                n.add(1)
            log.seek(0)
            assert f"truncating the torn tail of {segment} at byte offset {end}" in log.read()
        finally:
            server.stop()


def test_mid_file_corruption_refuses_to_start_until_repaired(tmp_path):
    server = durable_server(tmp_path, "--partitions", "1")
    with connected_to(server.address):
        spindle.Counter(1, name="a", persistent=True)
        spindle.Counter(2, name="b", persistent=True).add(5)
    server.kill()
    [segment] = segments(tmp_path)
    data = bytearray(segment.read_bytes())
    data[32 + 8 + 3] ^= 0xFF  # inside the first record (a's create), past the header
    segment.write_bytes(bytes(data))
    refused = start_refused(tmp_path)
    assert refused.returncode != 0
    assert f"corrupt op log {segment} at byte offset 32" in refused.stderr
    assert "spindle repair" in refused.stderr
    repaired = subprocess.run(
        [server_binary(), "repair", "--data-dir", str(tmp_path)], capture_output=True, text=True
    )
    assert repaired.returncode == 0, repaired.stderr
    assert f"{segment}: kept " in repaired.stdout and "at byte offset 32" in repaired.stdout
    assert Path(f"{segment}.corrupt").exists(), "the original is kept"
    server = durable_server(tmp_path, "--partitions", "1")
    try:
        with connected_to(server.address):
            assert spindle.objects() == [("b", "Counter")]
            assert spindle.Counter(name="b", persistent=True).get() == 7
    finally:
        server.stop()


def test_a_data_directory_in_use_is_refused_to_a_second_server_and_to_repair(tmp_path):
    server = durable_server(tmp_path)
    try:
        refused = start_refused(tmp_path)
        assert refused.returncode != 0
        assert f"the data directory {tmp_path} is in use by another process" in refused.stderr
        repair = subprocess.run(
            [server_binary(), "repair", "--data-dir", str(tmp_path)], capture_output=True, text=True
        )
        assert repair.returncode != 0
        assert "is in use by another process" in repair.stderr
        with connected_to(server.address):  # the first server serves on, its log untouched
            assert spindle.Counter(name="c", persistent=True).add(1) == 1
    finally:
        server.stop()


def test_partitions_share_one_log_and_each_recovers_its_own_records_after_kill_9(tmp_path):
    port = stable_port()
    flags = ["--partitions", "4", "--session-ttl", "30"]
    server = durable_server(tmp_path, *flags, port=port)
    address = f"127.0.0.1:{port}"
    env = dict(os.environ, SPINDLE_ADDRESS=address)

    def kill_and_restart() -> None:
        nonlocal server
        server.kill()  # SIGKILL
        server = durable_server(tmp_path, *flags, port=port)

    try:
        with LoadClients(EXACTLY_ONCE, lambda i: [address, "wal", str(i)], 4, tmp_path, env) as load:
            window = kills_under_load(load, kill_and_restart, 3, random.Random(11))
            results = load.stop()
    finally:
        server.kill()
    assert_under_load(results, window)
    # One log, no log per partition; the partitions' records interleave in it.
    assert not list(tmp_path.glob("log-*.spl"))
    tagged = record_partitions(tmp_path)
    assert set(tagged) <= set(range(4)) and len(set(tagged)) >= 2, set(tagged)
    switches = sum(1 for a, b in zip(tagged, tagged[1:]) if a != b)
    assert switches >= len(tagged) // 4, f"{switches} switches between partitions in {len(tagged)} records"
    # Each partition got back its own records: a record replayed into another partition
    # would leave its object short there.
    assert_recovered_exactly_once(tmp_path, port, "wal", results)


def test_the_log_is_deleted_only_behind_the_oldest_snapshot_any_partition_keeps(tmp_path):
    port = stable_port()
    flags = ["--partitions", "2", "--snapshot-after", "4096"]
    server = durable_server(tmp_path, *flags, port=port)
    try:
        with connected_to(server.address):
            counters = [spindle.Counter(name=f"c{i}", persistent=True) for i in range(8)]
            for c in counters:
                c.add(1)
            # Calls on one object only: its partition writes the log, the other one is idle.
            for _ in range(400):
                counters[0].add(1)

            def settled() -> bool:
                """Each partition keeps two snapshots and the log starts exactly where the
                oldest of them needs it (no snapshot in flight, none left to prune)."""
                snapshots = snapshot_segments(tmp_path)
                oldest = min((min(seqs) for seqs in snapshots.values()), default=1)
                return (sorted(snapshots) == [0, 1] and all(len(seqs) == 2 for seqs in snapshots.values())
                        and segment_seq(segments(tmp_path)[0]) == oldest)

            # The idle partition snapshots as the log grows too (else its first snapshot
            # would keep the log forever), at its own times.
            assert wait_until(settled), (snapshot_segments(tmp_path), segments(tmp_path))
            snapshots = snapshot_segments(tmp_path)
            assert not set(snapshots[0]) & set(snapshots[1]), snapshots
            assert segment_seq(segments(tmp_path)[0]) > 1, "the log was compacted"
            server.kill()
            server = durable_server(tmp_path, *flags, port=port)
            assert [c.get() for c in counters] == [401] + [1] * 7
    finally:
        server.stop()


# Written by the release before the write-ahead log (one log per partition, with
# snapshots): `spindle server --data-dir DIR --partitions 2 --snapshot-after 4096`, then
# UPGRADE_WRITES, then kill -9; the segments' preallocated zeros cut off (git keeps them
# small; a trimmed segment is valid).
PER_PARTITION_FIXTURE = Path(__file__).parent / "fixtures" / "per-partition-logs"
UPGRADE_WRITES = """
counters = [spindle.Counter(name=f"counter{i}", persistent=True) for i in range(6)]
for _ in range(60):
    for i, c in enumerate(counters):
        c.add(i)
spindle.Dict({"apple": 3, "pear": 5}, name="fruit", persistent=True)
jobs = spindle.Queue(name="jobs", persistent=True)
for n in (1, 2, 3):
    jobs.put(n)
jobs.get()
"""


def test_a_data_directory_with_a_log_per_partition_moves_to_one_log(tmp_path):
    data = tmp_path / "data"
    shutil.copytree(PER_PARTITION_FIXTURE, data)
    old = sorted(data.glob("log-*.spl")) + sorted(data.glob("snap-*.sps"))
    assert any(p.suffix == ".spl" for p in old) and any(p.suffix == ".sps" for p in old)
    port = stable_port()
    log = tmp_path / "server.log"
    with open(log, "w") as stderr:
        server = durable_server(data, port=port, stderr=stderr)
    try:
        with connected_to(server.address):
            counters = [spindle.Counter(name=f"counter{i}", persistent=True) for i in range(6)]
            assert [c.get() for c in counters] == [60 * i for i in range(6)]
            assert dict(spindle.Dict(name="fruit", persistent=True).items()) == {"apple": 3, "pear": 5}
            jobs = spindle.Queue(name="jobs", persistent=True)
            assert jobs.qsize() == 2
            counters[5].add(1)
            assert "moving it to one write-ahead log" in log.read_text()
            # Read once: the old files are gone, the write-ahead log goes on.
            assert not any(p.exists() for p in old)
            assert segments(data) and set(snapshot_segments(data)) == {0, 1}
            server.kill()
            server = durable_server(data, port=port)
            assert counters[5].get() == 301
            assert [jobs.get(), jobs.get()] == [2, 3]
    finally:
        server.stop()
