"""Mixed versions and rolling upgrades (docs/cluster.md, "Upgrading"): a cluster of the
previous release, built from this repository's history, upgraded to the build under test
one node at a time under load from the current SDK, with no acknowledged call lost; and
peer frames of a cluster format newer than a node reads, refused with both formats named."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

from spindle.client import Connection
from conftest import wait_until
import previous_release
from load import FAULT_AFTER
from test_cluster import (
    CLUSTER_KEY, NODE_USER, Cluster, History, check_exactly_once, keys_on_every_shard, load_goes_on, raw, run_load,
)

# The newest cluster format the build under test reads and writes (crates/proto CLUSTER_FORMAT).
CLUSTER_FORMAT = 5


def formats(cluster: Cluster) -> dict:
    """The cluster format each node writes (None: a node of the previous release, which
    tells none)."""
    return {n.node_id: n.map().get("cluster_format") for n in cluster.nodes}


def test_a_rolling_upgrade_under_load_loses_no_acknowledged_call(tmp_path):
    try:
        old = previous_release.binary()
    except previous_release.BuildError as exc:
        pytest.fail(str(exc))
    cluster = Cluster(tmp_path, binary=old)
    try:
        assert formats(cluster) == {1: None, 2: None, 3: None}
        history = History(cluster.addresses, keys_on_every_shard("upgrade"))

        def calls_go_on(load) -> None:
            """The load's clients and the history's get ``FAULT_AFTER`` more calls through."""
            since = time.monotonic_ns()
            load_goes_on(load)
            history.wait_known(FAULT_AFTER, since=since)

        def upgrade_one_node_at_a_time(load) -> None:
            for upgraded, node in enumerate(cluster.nodes, 1):
                # Stopped as a crash would: a node of the first release answers the calls it
                # holds at an ordinary stop with an Internal error (see docs/cluster.md).
                node.kill()
                node.binary = None  # the build under test, same --node-id and --data-dir
                node.start()
                assert wait_until(lambda: cluster.every_shard_led() and cluster.caught_up(node), 60), (
                    cluster.describe()
                )
                # While a node of the previous release remains, the new ones write its format.
                if upgraded < len(cluster.nodes):
                    assert formats(cluster) == {n.node_id: 1 if n.node_id <= upgraded else None
                                                for n in cluster.nodes}
                calls_go_on(load)
                if upgraded == 1:
                    # The new node crashes mid-upgrade: the old ones lead every shard, from
                    # what they applied of the entries it wrote.
                    node.kill()
                    assert wait_until(lambda: cluster.every_shard_led(via=cluster.nodes[1], without=node), 60), (
                        cluster.describe()
                    )
                    calls_go_on(load)
                    node.start()
                    assert wait_until(lambda: cluster.every_shard_led() and cluster.caught_up(node), 60), (
                        cluster.describe()
                    )
                    calls_go_on(load)
            # Every node reads the new format: they all write it from now on.
            everyone = {n.node_id: CLUSTER_FORMAT for n in cluster.nodes}
            assert wait_until(lambda: formats(cluster) == everyone, 30), formats(cluster)
            calls_go_on(load)
            # A node stopped the ordinary way sends the calls it held elsewhere, and replays a
            # log of both formats as it starts again.
            first = cluster.nodes[0]
            first.stop()
            first.start()
            assert wait_until(lambda: cluster.every_shard_led() and cluster.caught_up(first), 60), (
                cluster.describe()
            )

        run = run_load(cluster, tmp_path, upgrade_one_node_at_a_time, history=history)
        check_exactly_once(cluster, run)
        history.check(tmp_path)
    finally:
        cluster.stop()


def test_peer_frames_of_a_newer_cluster_format_are_refused_naming_both(server):
    host, port = server.address.rsplit(":", 1)
    newer = CLUSTER_FORMAT + 1
    frames = (
        [2, "raft", 1, "127.0.0.1:1", 0, [b"\x08\x02"], False, newer],
        [2, "snapshot", 1, "127.0.0.1:1", 0, None, b"data", False, newer],
    )
    for request in frames:
        reply = raw(host, int(port), request)
        assert reply[1] == 1 and reply[2][0] == "ProtocolError", reply
        assert f"cluster format {newer}; this node reads cluster formats 1 to {CLUSTER_FORMAT}" in reply[2][1], reply
    # The formats it reads pass the parser (and reach the node-only check).
    reply = raw(host, int(port), [2, "raft", 1, "127.0.0.1:1", 0, [b"\x08\x02"], False, CLUSTER_FORMAT])
    assert reply[1] == 1 and reply[2][0] == "PermissionDenied", reply


def test_a_cluster_node_tells_the_newest_cluster_format_it_reads_in_its_hello(tmp_path):
    cluster = Cluster(tmp_path, size=1, rf=1)
    try:
        node = cluster.nodes[0]
        conn = Connection(node.host, node.port, "upgrade-format-test", 1, CLUSTER_KEY, user=NODE_USER)
        conn.close()
        assert conn.hello["cluster_format"] == CLUSTER_FORMAT
        # Alone, it writes the newest format it reads.
        view = node.map()
        assert (view["cluster_format"], view["reads_cluster_format"]) == (CLUSTER_FORMAT, CLUSTER_FORMAT)
    finally:
        cluster.stop()
