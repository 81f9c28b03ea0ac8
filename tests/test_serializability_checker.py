"""The strict serializability checker of tests/serializability: hand-written histories with
known anomalies and valid ones; random serial executions (hypothesis) that it must accept,
and reject once one read is made stale; and small faulty histories on which it must agree
with a brute-force search for a serial order."""

from __future__ import annotations

import itertools
import json
import subprocess
import sys
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from serializability.checker import Report, check, load, main

REPO = Path(__file__).resolve().parents[1]


def txn(kind: str, invoke: float, complete: Optional[float], *ops: Tuple[str, Any, Any],
        process: int = 0) -> Dict[str, Any]:
    return {"process": process, "type": kind, "invoke": invoke, "complete": complete,
            "ops": [list(op) for op in ops]}


def only(report: Report, name: str) -> Tuple[int, ...]:
    """The transactions of the single anomaly called name."""
    found = [anomaly for anomaly in report.anomalies if anomaly.name == name]
    assert len(found) == 1, report.format()
    return found[0].transactions


# --- anomalies -------------------------------------------------------------------------------


def test_g0_write_cycle():
    report = check([
        txn("ok", 0, 1, ("append", "x", 1), ("append", "y", 1)),
        txn("ok", 0, 1, ("append", "x", 2), ("append", "y", 2)),
        txn("ok", 2, 3, ("r", "x", [1, 2]), ("r", "y", [2, 1])),
    ])
    assert report.names() == {"G0"}
    assert sorted(only(report, "G0")) == [1, 2]
    assert "T1 appended 1 to 'x', and T2 appended 2 right after it" in report.anomalies[0].explanation


def test_one_short_cycle_per_component():
    # T1 and T2 order each other, and T3 lies on a longer cycle through both.
    report = check([
        txn("ok", 0, 1, ("append", "x", 1), ("append", "y", 2), ("append", "w", 2)),
        txn("ok", 0, 1, ("append", "x", 2), ("append", "y", 1), ("append", "z", 1)),
        txn("ok", 0, 1, ("append", "z", 2), ("append", "w", 1)),
        txn("ok", 2, 3, *[("r", key, [1, 2]) for key in "xyzw"]),
    ])
    assert report.names() == {"G0"}
    assert sorted(only(report, "G0")) == [1, 2]
    assert "a cycle of 2 transactions, among 3 transactions" in report.anomalies[0].explanation


def test_g1a_aborted_read():
    report = check([
        txn("fail", 0, 1, ("append", "x", 1)),
        txn("ok", 2, 3, ("r", "x", [1])),
    ])
    assert report.names() == {"G1a"}
    assert only(report, "G1a") == (2, 1)


def test_g1b_intermediate_read():
    report = check([
        txn("ok", 0, 1, ("append", "x", 1), ("append", "x", 2)),
        txn("ok", 0, 1, ("r", "x", [1])),
        txn("ok", 2, 3, ("r", "x", [1, 2])),
    ])
    assert only(report, "G1b") == (2, 1)


def test_a_transaction_may_read_its_own_intermediate_state():
    report = check([
        txn("ok", 0, 1, ("append", "x", 1), ("r", "x", [1]), ("append", "x", 2)),
        txn("ok", 2, 3, ("r", "x", [1, 2])),
    ])
    assert report.valid, report.format()


def test_g1c_circular_information_flow():
    report = check([
        txn("ok", 0, 1, ("append", "x", 1), ("r", "y", [1])),
        txn("ok", 0, 1, ("append", "y", 1), ("r", "x", [1])),
    ])
    assert report.names() == {"G1c"}
    assert sorted(only(report, "G1c")) == [1, 2]


def test_g_single_read_skew():
    # T2 sees T1's y but not its x.
    report = check([
        txn("ok", 0, 1, ("append", "x", 1), ("append", "y", 1)),
        txn("ok", 0, 1, ("r", "x", []), ("r", "y", [1])),
        txn("ok", 2, 3, ("r", "x", [1]), ("r", "y", [1])),
    ])
    assert report.names() == {"G-single"}
    assert sorted(only(report, "G-single")) == [1, 2]
    explanation = report.anomalies[0].explanation
    assert "T2 read 'x' = [], without T1's append of 1, which came first" in explanation
    assert "T2 read 'y' = [1], ending with T1's append of 1" in explanation


def test_g_single_through_an_unobserved_append():
    # No read ever sees T1's append to x; T2's read of it still precedes it.
    report = check([
        txn("ok", 0, 1, ("append", "x", 1), ("append", "y", 1)),
        txn("ok", 0, 1, ("r", "x", []), ("r", "y", [1])),
    ])
    assert report.names() == {"G-single"}
    assert "which no read observed" in report.anomalies[0].explanation


def test_g2_write_skew():
    report = check([
        txn("ok", 0, 1, ("r", "x", []), ("append", "y", 1)),
        txn("ok", 0, 1, ("r", "y", []), ("append", "x", 1)),
        txn("ok", 2, 3, ("r", "x", [1]), ("r", "y", [1])),
    ])
    assert report.names() == {"G2"}
    assert sorted(only(report, "G2")) == [1, 2]
    assert report.anomalies[0].explanation.count("(rw)") == 2


def test_lost_update():
    report = check([
        txn("ok", 0, 1, ("r", "x", [0]), ("append", "x", 1)),
        txn("ok", 0, 1, ("r", "x", [0]), ("append", "x", 2)),
        txn("ok", 2, 3, ("r", "x", [0, 1, 2])),
        txn("ok", -1, -0.5, ("append", "x", 0)),
    ])
    assert sorted(only(report, "lost-update")) == [1, 2]
    assert sorted(only(report, "G-single")) == [1, 2]


def test_stale_read_is_serializable_but_not_strictly():
    stale = [
        txn("ok", 0, 1, ("append", "x", 1)),
        txn("ok", 2, 3, ("r", "x", [])),  # invoked after the append completed
    ]
    report = check(stale)
    assert report.names() == {"G-single-realtime"}
    assert "T1 completed at 1.000000, before T2 was invoked at 2.000000" in report.anomalies[0].explanation
    overlapping = [dict(stale[0]), dict(stale[1], invoke=0.5)]
    assert check(overlapping).valid


def test_stale_read_behind_later_appends():
    report = check([
        txn("ok", 0, 1, ("append", "x", 1)),
        txn("ok", 2, 3, ("append", "x", 2)),
        txn("ok", 4, 5, ("r", "x", [1])),
        txn("ok", 6, 7, ("r", "x", [1, 2])),
    ])
    assert report.names() == {"G-single-realtime"}
    assert sorted(only(report, "G-single-realtime")) == [2, 3]


def test_realtime_order_of_writes():
    # T2 began after T1 committed, yet its append comes first.
    report = check([
        txn("ok", 0, 1, ("append", "x", 1)),
        txn("ok", 2, 3, ("append", "x", 2)),
        txn("ok", 4, 5, ("r", "x", [2, 1])),
    ])
    assert report.names() == {"G0-realtime"}


def test_equal_times_are_not_an_order():
    report = check([
        txn("ok", 0, 1, ("append", "x", 1)),
        txn("ok", 1, 2, ("r", "x", [])),
    ])
    assert report.valid, report.format()


def test_incompatible_orders():
    report = check([
        txn("ok", 0, 1, ("append", "x", 1)),
        txn("ok", 0, 1, ("append", "x", 2)),
        txn("ok", 0, 1, ("append", "x", 3)),
        txn("ok", 0, 1, ("r", "x", [1, 2])),
        txn("ok", 0, 1, ("r", "x", [1, 3])),
    ])
    assert report.names() == {"incompatible-order"}
    assert sorted(only(report, "incompatible-order")) == [4, 5]


def test_internal_read_misses_own_append():
    report = check([txn("ok", 0, 1, ("append", "x", 1), ("r", "x", []))])
    assert only(report, "internal") == (1,)


def test_internal_read_of_own_later_append():
    report = check([txn("ok", 0, 1, ("r", "x", [1]), ("append", "x", 1))])
    assert report.names() == {"internal"}


def test_appends_out_of_their_transaction_order():
    report = check([
        txn("ok", 0, 1, ("append", "x", 1), ("append", "x", 2)),
        txn("ok", 2, 3, ("r", "x", [2, 1, 3])),
        txn("ok", 0, 1, ("append", "x", 3)),
    ])
    assert report.names() == {"incompatible-order"}
    assert only(report, "incompatible-order") == (2, 1)
    assert "with 2 before 1, but T1 appended 1 first" in report.anomalies[0].explanation


def test_internal_reads_disagree():
    report = check([
        txn("ok", 0, 1, ("append", "x", 1)),
        txn("ok", 0, 1, ("r", "x", []), ("r", "x", [1])),
    ])
    assert only(report, "internal") == (2,)


def test_duplicate_elements():
    report = check([
        txn("ok", 0, 1, ("append", "x", 1)),
        txn("ok", 2, 3, ("r", "x", [1, 1])),
    ])
    assert report.names() == {"duplicate-elements"}
    assert only(report, "duplicate-elements") == (2,)


def test_garbage_read():
    report = check([txn("ok", 0, 1, ("r", "x", [7]))])
    assert report.names() == {"garbage-read"}


# --- valid histories -------------------------------------------------------------------------


def test_serial_history():
    report = check([
        txn("ok", 0, 1, ("r", "x", []), ("append", "x", 1)),
        txn("ok", 2, 3, ("append", "x", 2), ("r", "x", [1, 2]), ("append", "y", 1)),
        txn("ok", 4, 5, ("r", "y", [1]), ("r", "x", [1, 2]), ("append", "x", 3)),
        txn("ok", 6, 7, ("r", "x", [1, 2, 3]), ("r", "y", [1])),
    ])
    assert report.valid, report.format()
    assert report.counts == {"ok": 4, "fail": 0, "info": 0}


def test_concurrent_transactions_on_different_keys():
    report = check([
        txn("ok", 0, 3, ("append", "x", 1), ("r", "x", [1]), process=0),
        txn("ok", 1, 4, ("append", "y", 1), ("r", "y", [1]), process=1),
        txn("ok", 2, 5, ("r", "z", []), process=2),
        txn("ok", 6, 7, ("r", "x", [1]), ("r", "y", [1]), ("r", "z", []), process=0),
    ])
    assert report.valid, report.format()


def test_invisible_failed_and_unknown_transactions():
    report = check([
        txn("ok", 0, 1, ("append", "x", 1)),
        txn("fail", 0, 1, ("append", "x", 2), ("r", "x", [9])),
        txn("info", 0, None, ("append", "x", 3), ("r", "x", None)),
        txn("info", 2, 3, ("append", "y", 1)),
        txn("ok", 4, 5, ("r", "x", [1]), ("r", "y", [])),
    ])
    assert report.valid, report.format()
    assert report.counts == {"ok": 2, "fail": 1, "info": 2}


def test_appends_no_read_observed():
    report = check([
        txn("ok", 0, 1, ("append", "x", 1), ("r", "x", [1]), ("append", "x", 2)),
        txn("ok", 2, 3, ("r", "x", [1]), ("append", "x", 3)),
        txn("ok", 2, 3, ("r", "x", [1]), ("append", "y", 1)),
    ])
    # No read saw 2 or 3: they come after 1. T2 and T3 read T1's intermediate state, and T2
    # precedes T1 (it did not see 2) yet follows it (it saw 1).
    assert report.names() == {"G1b", "G-single"}
    valid = check([
        txn("ok", 0, 1, ("append", "x", 1), ("r", "x", [1]), ("append", "x", 2)),
        txn("ok", 2, 3, ("r", "x", [1, 2]), ("append", "x", 3)),
        txn("ok", 2, 3, ("r", "x", [1, 2]), ("append", "y", 1)),
        txn("ok", 2, 3, ("r", "y", []), ("append", "y", 2)),
    ])
    assert valid.valid, valid.format()


def test_unknown_transaction_that_committed():
    report = check([
        txn("ok", 0, 1, ("append", "x", 1)),
        txn("info", 2, 3, ("append", "x", 2)),
        txn("ok", 9, 10, ("r", "x", [1, 2])),  # it took effect after it gave up: allowed
    ])
    assert report.valid, report.format()


def test_unknown_transaction_seen_in_part():
    # T2 saw T1's append to x, so T1 committed, and with it its append to y.
    report = check([
        txn("info", 0, None, ("append", "x", 1), ("append", "y", 1)),
        txn("ok", 0, 1, ("r", "x", [1]), ("r", "y", [])),
    ])
    assert report.names() == {"G-single"}


def test_unknown_transaction_cannot_precede_its_invocation():
    report = check([
        txn("info", 2, None, ("append", "x", 2)),
        txn("ok", 0, 1, ("r", "x", [2])),
    ])
    assert report.names() == {"G1c-realtime"}


# --- input and command line ------------------------------------------------------------------


@pytest.mark.parametrize("record, why", [
    (txn("ok", 2, 1, ("r", "x", [])), "complete"),
    (txn("done", 0, 1), "type"),
    (txn("ok", 0, 1, ("write", "x", 1)), "op"),
    (txn("ok", 0, 1, ("append", ["x"], 1)), "keys"),
    (txn("ok", 0, 1, ("append", "x", 1), ("append", "x", 1)), "unique"),
])
def test_malformed_history(record, why):
    with pytest.raises(ValueError, match=why):
        check([record])


def test_command_line(tmp_path, capsys):
    valid = tmp_path / "valid.jsonl"
    valid.write_text(json.dumps(txn("ok", 0, 1, ("append", "x", 1))) + "\n\n"
                     + json.dumps(txn("ok", 2, 3, ("r", "x", [1]))) + "\n")
    assert main([str(valid)]) == 0
    assert "strictly serializable" in capsys.readouterr().out
    assert [record["line"] for record in load(str(valid))] == [1, 3]

    skewed = tmp_path / "skewed.jsonl"
    skewed.write_text("".join(json.dumps(record) + "\n" for record in [
        txn("ok", 0, 1, ("r", "x", []), ("append", "y", 1)),
        txn("ok", 0, 1, ("r", "y", []), ("append", "x", 1)),
    ]))
    run = subprocess.run([sys.executable, "-m", "tests.serializability.checker", str(skewed)],
                         cwd=REPO, capture_output=True, text=True, timeout=60)
    assert run.returncode == 1, run.stderr
    assert "G2: 1" in run.stdout and "T1 read 'x' = []" in run.stdout

    broken = tmp_path / "broken.jsonl"
    broken.write_text("{not json\n")
    assert main([str(broken)]) == 2
    assert "line 1" in capsys.readouterr().err


# --- random serial executions ----------------------------------------------------------------


@st.composite
def serial_histories(draw, final_read: Optional[bool] = None) -> List[Dict[str, Any]]:
    """Transactions run one at a time against lists in memory, each taking effect at its
    commit point (its index) inside its interval of real time; failed attempts and unknown
    ones that never took effect change nothing. A final transaction reads every key when
    final_read (drawn when None): without it, the last appends go unobserved."""
    keys = draw(st.integers(1, 3))
    lists: Dict[int, List[int]] = {key: [] for key in range(keys)}
    values = itertools.count(1)
    micro_ops = st.one_of(
        st.lists(st.tuples(st.sampled_from(["append", "r"]), st.integers(0, keys - 1)),
                 min_size=1, max_size=4),
        st.integers(0, keys - 1).map(lambda key: [("r", key), ("append", key)]),  # read-modify-write
    )
    spread = st.integers(0, 12).map(lambda quarters: quarters / 4)
    history = []
    for point in range(draw(st.integers(1, 10))):
        kind = draw(st.sampled_from(["ok", "ok", "ok", "fail", "info", "lost"]))
        takes_effect = kind in ("ok", "info")
        state = lists if takes_effect else {key: list(items) for key, items in lists.items()}
        ops = []
        for name, key in draw(micro_ops):
            if name == "append":
                value = next(values)
                state[key].append(value)
                ops.append(("append", key, value))
            else:
                # Reads of failed attempts are ignored; unknown outcomes have none.
                ops.append(("r", key, list(state[key]) if kind in ("ok", "fail") else None))
        invoke = point - draw(spread)
        complete = point + draw(spread)
        history.append(txn("info" if kind == "lost" else kind, invoke, complete, *ops,
                           process=draw(st.integers(0, 3))))
    if final_read if final_read is not None else draw(st.booleans()):
        final = len(history)
        history.append(txn("ok", final, final, *[("r", key, list(lists[key])) for key in lists]))
    return history


@settings(max_examples=100, deadline=None)
@given(serial_histories(), st.randoms())
def test_serial_executions_are_accepted(history, random):
    random.shuffle(history)
    report = check(history)
    assert report.valid, report.format()


def stale_read_candidates(history: List[Dict[str, Any]]) -> List[Tuple[int, int]]:
    """(transaction, op) of a committed transaction's first operation on a key: a read of a
    non-empty list, followed by appends to the key and no more reads of it. The final read
    shows the appends after the whole list read."""
    found = []
    for t, record in enumerate(history):
        if record["type"] != "ok":
            continue
        touched = set()
        for o, (name, key, value) in enumerate(record["ops"]):
            later = [n for n, k, _ in record["ops"][o + 1:] if k == key]
            if name == "r" and value and key not in touched and later and "r" not in later:
                found.append((t, o))
            touched.add(key)
    return found


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.filter_too_much])
@given(st.data())
def test_a_stale_read_before_an_append_is_rejected(data):
    history = data.draw(serial_histories(final_read=True).filter(stale_read_candidates))
    t, o = data.draw(st.sampled_from(stale_read_candidates(history)))
    _, key, seen = history[t]["ops"][o]
    history[t]["ops"][o] = ["r", key, seen[:data.draw(st.integers(0, len(seen) - 1))]]
    report = check(history)
    assert "G-single" in report.names(), report.format()
    assert report.names() <= {"G-single", "G1b", "lost-update"}, report.format()


@st.composite
def faulty_histories(draw) -> List[Dict[str, Any]]:
    """Up to five attempts on one or two lists, run one at a time in memory, with faults: a
    read may return an older prefix or two elements swapped, an aborted attempt may take
    effect, and times need not follow the order of execution."""
    keys = draw(st.integers(1, 2))
    lists: Dict[int, List[int]] = {key: [] for key in range(keys)}
    values = itertools.count(1)
    history = []
    for _ in range(draw(st.integers(1, 5))):
        kind = draw(st.sampled_from(["ok", "ok", "fail", "info", "lost", "aborted but seen"]))
        if kind in ("ok", "info", "aborted but seen"):
            state = lists
        else:
            state = {key: list(items) for key, items in lists.items()}
        ops = []
        for name, key in draw(st.lists(st.tuples(st.sampled_from(["append", "r"]),
                                                 st.integers(0, keys - 1)), min_size=1, max_size=3)):
            if name == "append":
                value = next(values)
                state[key].append(value)
                ops.append(("append", key, value))
                continue
            seen = list(state[key])
            fault = draw(st.sampled_from(["none", "none", "stale", "swapped"]))
            if fault == "stale":
                seen = seen[:draw(st.integers(0, len(seen)))]
            elif fault == "swapped" and len(seen) > 1:
                i = draw(st.integers(0, len(seen) - 2))
                seen[i], seen[i + 1] = seen[i + 1], seen[i]
            ops.append(("r", key, seen if kind in ("ok", "fail") else None))
        kind = {"lost": "info", "aborted but seen": "fail"}.get(kind, kind)
        invoke = draw(st.integers(0, 6))
        history.append(txn(kind, invoke, invoke + draw(st.integers(0, 3)), *ops))
    return history


def strictly_serializable(history: List[Dict[str, Any]]) -> bool:
    """By brute force: is there an order of every ok attempt and any info ones, each after
    the ok ones that completed before it was invoked, in which each ok one reads what it
    would have read?"""
    ok = [i for i, record in enumerate(history) if record["type"] == "ok"]
    candidates = ok + [i for i, record in enumerate(history) if record["type"] == "info"]

    def extend(placed: frozenset, lists: Dict[Any, List[Any]]) -> bool:
        if placed.issuperset(ok):
            return True
        for i in candidates:
            record = history[i]
            if i in placed or any(j not in placed and history[j]["complete"] < record["invoke"] for j in ok):
                continue
            state = {key: list(items) for key, items in lists.items()}
            for name, key, value in record["ops"]:
                if name == "append":
                    state.setdefault(key, []).append(value)
                elif record["type"] == "ok" and value != state.get(key, []):
                    break
            else:
                if extend(placed | {i}, state):
                    return True
        return False

    return extend(frozenset(), {})


@settings(max_examples=400, deadline=None)
@given(faulty_histories())
def test_the_checker_agrees_with_brute_force(history):
    report = check(history)
    assert report.valid == strictly_serializable(history), report.format()
