"""Dicts created as caches (``max_memory``): they evict their least recently used keys past
their own bound, and give them first when the server is over --max-memory, while ordinary
objects never lose a key. Real server processes (docs/limits.md, "Caches")."""

from __future__ import annotations

import subprocess

import pytest

import spindle
from conftest import ServerProcess, connected_to, server_binary

MiB = 1 << 20
VALUE = b"v" * (64 * 1024)


def test_a_cache_evicts_its_least_recently_used_keys_and_keeps_working(uniq):
    plain = spindle.Dict({f"k{i}": VALUE for i in range(20)}, name=f"{uniq}-plain")
    cache = spindle.Dict(name=f"{uniq}-cache", max_memory="1MiB")
    cache["hot"] = VALUE
    for i in range(100):  # 6 MiB through a 1 MiB cache
        cache[i] = VALUE
        assert cache["hot"] == VALUE  # used each time: never the least recently used
    assert 10 <= len(cache) <= 16
    assert 99 in cache and 98 in cache and 0 not in cache and "hot" in cache
    # From the least to the most recently used: the read "hot" last.
    assert list(cache)[-1] == "hot" and list(cache)[-2] == 99
    # It keeps working: writes and reads, the same reference by name.
    again = spindle.Dict(name=f"{uniq}-cache")
    again["new"] = 1
    assert cache["new"] == 1 and len(cache) <= 16
    with pytest.raises(ValueError, match="max_memory"):
        cache["huge"] = b"x" * (2 * MiB)
    assert "huge" not in cache
    # The ordinary dict lost nothing.
    assert len(plain) == 20 and all(plain[f"k{i}"] == VALUE for i in range(20))


def test_cache_options_are_checked():
    with pytest.raises(ValueError, match="eviction policy"):
        spindle.Dict(max_memory=MiB, evict="random")
    for bad in (0, -1, "12XB", "MiB", 1.5):
        with pytest.raises(ValueError):
            spindle.Dict(max_memory=bad)
    assert spindle.Dict(max_memory="2 KiB", evict="lru") is not None


def test_over_max_memory_caches_evict_before_an_ordinary_dict_is_refused(uniq):
    # Four partitions: the caches and the dict are spread over them, and give room all the same.
    server = ServerProcess("--max-memory", "8MiB", "--partitions", "4")
    try:
        with connected_to(server):
            caches = [spindle.Dict(name=f"{uniq}-cache{i}", max_memory="64MiB") for i in range(4)]
            for i in range(80):  # 5 MiB of cached keys
                caches[i % 4][i] = VALUE
            assert caches[0][0] == VALUE  # a use: key 0 is the most recently used of its cache
            plain = spindle.Dict(name=f"{uniq}-plain")
            written = 0
            with pytest.raises(spindle.OutOfMemory, match="over --max-memory"):
                while True:
                    plain[written] = VALUE
                    written += 1
                    assert written < 1000, "never refused"
            # Refused only once the caches had nothing left to give: more than the
            # limit went into the ordinary dict, and it lost none of it.
            assert written * len(VALUE) > 7 * MiB, written
            assert sum(len(c) for c in caches) == 0
            assert len(plain) == written and plain[0] == VALUE and plain[written - 1] == VALUE
            # Room made by deletes goes to caches as to anything.
            for i in range(3):
                del plain[i]
            caches[1]["again"] = VALUE
            assert caches[1]["again"] == VALUE
    finally:
        server.stop()


def test_the_cache_evicting_first_is_the_least_recently_used(uniq):
    server = ServerProcess("--max-memory", "4MiB", "--partitions", "1")
    try:
        with connected_to(server):
            cache = spindle.Dict(name=f"{uniq}-cache", max_memory="64MiB")
            for i in range(40):  # 2.5 MiB
                cache[i] = VALUE
            for i in range(10):
                cache.get(i)  # keys 0..9 are now the most recently used
            plain = spindle.Dict(name=f"{uniq}-plain")
            for i in range(40):  # 2.5 MiB more: the server passes 4 MiB
                plain[i] = VALUE
            kept = set(cache)
            assert 0 < len(kept) < 40
            assert set(range(10)) <= kept, "the recently read keys went first"
            assert 10 not in kept
            assert len(plain) == 40
    finally:
        server.stop()


def test_a_persistent_cache_survives_a_restart_with_its_options_and_order(uniq, tmp_path):
    args = ("--data-dir", str(tmp_path), "--max-memory", "64MiB")
    server = ServerProcess(*args)
    try:
        with connected_to(server):
            cache = spindle.Dict(name=f"{uniq}-cache", persistent=True, max_memory="1MiB")
            for i in range(12):
                cache[i] = VALUE
            assert cache[0] == VALUE  # a read is a use, logged: 1 is now the least recently used
            order = list(cache)
        server.stop()
        server = ServerProcess(*args)
        with connected_to(server):
            cache = spindle.Dict(name=f"{uniq}-cache", persistent=True)
            assert list(cache) == order and order[-1] == 0
            for i in range(12, 20):  # still a cache of 1 MiB, evicting in the same order
                cache[i] = VALUE
            assert 1 not in cache and 0 in cache and 19 in cache
            assert 10 <= len(cache) <= 16
    finally:
        server.stop()


def test_max_memory_takes_units_and_unlimited():
    for size, limit in (("512MiB", 512 * MiB), ("2GB", 2_000_000_000), ("unlimited", 0), ("1048576", MiB)):
        server = ServerProcess("--max-memory", size)
        try:
            with connected_to(server):
                assert spindle.status()["max_memory"] == limit, size
        finally:
            server.stop()
    # The default is a limit: half of what the machine or the cgroup gives.
    server = ServerProcess()
    try:
        with connected_to(server):
            assert spindle.status()["max_memory"] > 0
    finally:
        server.stop()
    for bad in ("12XB", "1.5GiB", "-1", "MiB"):
        out = subprocess.run([server_binary(), "server", "--port", "0", f"--max-memory={bad}"], capture_output=True,
                             text=True, timeout=30, stdin=subprocess.DEVNULL)
        assert out.returncode == 2 and "--max-memory" in out.stderr, (bad, out.stderr)
    help = subprocess.run([server_binary(), "server", "--help"], capture_output=True, text=True, timeout=30)
    assert "unlimited" in help.stdout and "half the machine's memory" in help.stdout
