"""Spindle's transactions are strictly serializable: the list-append workload of
tests/serializability against the session's server, its history checked after Elle."""

from __future__ import annotations

from serializability.checker import load
from serializability.workload import run


def test_list_append_transactions_are_strictly_serializable(server, tmp_path) -> None:
    history = str(tmp_path / "history.jsonl")
    # Few keys, so that transactions meet and conflict.
    report = run(server.address, keys=3, processes=3, duration=3.0, history=history)
    assert report.valid, report.format()
    observed = [op[2] for record in load(history) if record["type"] == "ok"
                for op in record["ops"] if op[0] == "r" and op[2]]
    assert observed, "no committed transaction read a non-empty list"
