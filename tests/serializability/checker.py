"""A strict serializability checker for list-append histories, after Jepsen's Elle
(Kingsbury & Alvaro, "Elle: Inferring Isolation Anomalies from Experimental Observations",
VLDB 2020).

Clients run transactions that append unique values to lists and read whole lists. Every read
of a list is a prefix of the list's final state, so the reads reveal the order of the appends
(the version order) and which versions each transaction saw. From them the checker infers a
dependency graph between transactions and reports every cycle as an anomaly: no serial order
of the committed transactions, consistent with real time, explains what the clients observed.

History format
--------------
JSON lines, one transaction attempt per line, in any order::

    {"process": 3, "type": "ok", "invoke": 12.5, "complete": 12.52,
     "ops": [["append", "x", 7], ["r", "y", [1, 4, 2]]]}

``process``
    integer: the client process that ran the attempt.
``type``
    ``"ok"``: committed, and its reads are what it observed. ``"fail"``: definitely aborted,
    none of its appends may ever be visible, its reads are ignored. ``"info"``: unknown
    outcome (a lost connection during commit): its appends may or may not be visible, its
    reads are ignored.
``invoke``, ``complete``
    monotonic seconds, from one clock shared by all processes, when the attempt began and when
    its outcome was known (``complete >= invoke``). An ``info`` attempt may take effect at any
    time after ``invoke``; its ``complete`` is ignored and may be null.
``ops``
    the micro-operations in program order: ``["append", key, value]`` appends ``value`` to the
    list at ``key``; ``["r", key, values]`` reads the whole list at ``key`` (``values`` is null
    when unknown). Keys are strings or integers, values are JSON scalars, and every value is
    appended at most once per key in the whole history: a value names its writer.

Transaction ``T<n>`` in a report is the attempt on line ``n`` of the history.

What is checked
---------------
Version orders: per key, the longest read of a committed transaction is the version order;
a read that is not a prefix of it, or an order in which a transaction's appends are not in
the order it made them, is ``incompatible-order``. An ``info`` transaction with an append
in a version order committed, all its appends with it. From the reads follow the edges
between committed (``ok``) and possibly committed (``info``) transactions:

- ``ww``: T2 appended the element right after one T1 appended, in the version order;
- ``wr``: T2 read a list whose last element T1 appended;
- ``rw``: T1 read a list, and T2 appended the element right after its end (the first element
  when T1 read an empty list); committed appends no read observed come after every observed
  one, so the readers of the longest list precede them too;
- ``rt``: T1 completed before T2 was invoked (strict serializability), encoded through a
  chain of barrier nodes so the graph stays linear in the history's size.

Only a transaction's first read of a key before it appends to it (its external read) and its
appends take part. Each strongly connected component (Tarjan, iterative) yields one shortest
cycle, searched with the fewest ``rw`` edges and named by its edges: ``G0`` (ww only),
``G1c`` (ww and wr), ``G-single`` (exactly one rw), ``G2`` (more rw), with ``-realtime``
when the cycle needs ``rt`` edges (serializable, but not strictly). Components without a
cycle of dependency edges alone are searched with ``rt`` edges as well.

On histories of this format the verdict is exact: a history passes if and only if some order
of its ``ok`` transactions and of some ``info`` ones, consistent with real time, gives every
``ok`` read what it observed (the tests compare it with a brute-force search).

Besides cycles: ``G1a`` (a read observes an append of a failed transaction), ``G1b`` (a read
ends at a transaction's intermediate append to the key), ``garbage-read`` (a read observes a
value nobody appended), ``duplicate-elements`` (a value twice in one read), ``internal`` (a
read disagrees with the transaction's own earlier reads and appends, or holds one of its later
appends) and ``lost-update``
(two committed transactions read the same version of a key and both appended to it; it also
shows as a G-single or G2 cycle).

Command line: ``python -m tests.serializability.checker history.jsonl`` (``-`` for standard
input) prints a report; exit status 0 when the history is strictly serializable, 1 when it
has anomalies, 2 when it is malformed.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import heapq
import itertools
import json
import sys
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Iterable, Iterator, List, Optional, Sequence, Set, Tuple

__all__ = ["Anomaly", "Report", "check", "load", "main"]

# Edge types, as bits: two transactions may be ordered for several reasons at once.
WW, WR, RW, RT = 1, 2, 4, 8
DEPENDENCIES = WW | WR | RW
EDGE_NAMES = {WW: "ww", WR: "wr", RW: "rw", RT: "rt"}
# A cycle's edge is labelled by the first of these it can be: the fewer rw edges, the stronger
# the isolation level it violates.
LABEL_PREFERENCE = (WW, WR, RT, RW)
# Work bound of the search for a cycle with a single rw edge in a large component: each try
# costs about the component's size.
SINGLE_RW_WORK = 200_000
SHOWN_ELEMENTS = 6  # of a long read in a report
UNOBSERVED = ()  # what follows the last observed element: the appends no read observed
Hops = List[Tuple[int, int, int]]  # a path: (from, to, label) of each edge


@dataclass(frozen=True)
class Anomaly:
    """One anomaly: its name, the transactions (line numbers) involved and an explanation."""

    name: str
    transactions: Tuple[int, ...]
    explanation: str


@dataclass
class Report:
    """The outcome of :func:`check`."""

    counts: Dict[str, int]
    anomalies: List[Anomaly] = field(default_factory=list)

    @property
    def valid(self) -> bool:
        return not self.anomalies

    def names(self) -> Set[str]:
        return {anomaly.name for anomaly in self.anomalies}

    def format(self, limit: Optional[int] = 10) -> str:
        """Human-readable; at most ``limit`` anomalies of each name in full."""
        total = sum(self.counts.values())
        kinds = ", ".join(f"{self.counts[t]} {t}" for t in ("ok", "fail", "info"))
        verdict = ("strictly serializable" if self.valid
                   else plural(len(self.anomalies), "anomaly", "anomalies"))
        lines = [f"{plural(total, 'transaction', 'transactions')} ({kinds}): {verdict}"]
        by_name = Counter(anomaly.name for anomaly in self.anomalies)
        lines += [f"  {name}: {count}" for name, count in sorted(by_name.items())]
        shown: Counter = Counter()
        for anomaly in self.anomalies:
            shown[anomaly.name] += 1
            if limit is not None and shown[anomaly.name] > limit:
                continue
            lines += ["", anomaly.explanation]
        hidden = 0 if limit is None else sum(max(0, count - limit) for count in by_name.values())
        if hidden:
            lines += ["", f"({plural(hidden, 'more anomaly', 'more anomalies')} not shown)"]
        return "\n".join(lines)


@dataclass
class Transaction:
    line: int
    process: int
    type: str
    invoke: float
    complete: Optional[float]
    ops: List[Tuple[str, Any, Any]]
    appends: Dict[Any, List[Any]] = field(default_factory=dict)
    # The first read of each key before the transaction appends to it: what it saw of others.
    external_reads: Dict[Any, List[Any]] = field(default_factory=dict)

    @property
    def name(self) -> str:
        return f"T{self.line}"

    def describe(self) -> str:
        span = f"{self.invoke:.6f}..{'?' if self.complete is None else f'{self.complete:.6f}'}"
        ops = ", ".join(f"{op} {key!r} {show(value) if op == 'r' else repr(value)}"
                        for op, key, value in self.ops)
        return f"{self.name} = process {self.process}, {self.type}, {span}: {ops}"


def plural(count: int, one: str, many: str) -> str:
    return f"{count} {one if count == 1 else many}"


def show(values: Optional[List[Any]]) -> str:
    """A read for a report: a long one shows its last elements, the ones edges are made of."""
    if values is None:
        return "null"
    if len(values) <= SHOWN_ELEMENTS:
        return repr(list(values))
    tail = ", ".join(repr(v) for v in values[-(SHOWN_ELEMENTS - 1):])
    return f"[...{len(values) - SHOWN_ELEMENTS + 1} more, {tail}]"


def load(path: str) -> List[Dict[str, Any]]:
    """The records of a JSON-lines history file (``-``: standard input); blank lines skipped."""
    stream = sys.stdin if path == "-" else open(path, encoding="utf-8")
    with stream, collection_paused():
        records = []
        for number, text in enumerate(stream, 1):
            if not text.strip():
                continue
            try:
                record = json.loads(text)
            except json.JSONDecodeError as error:
                raise ValueError(f"line {number}: not JSON: {error}") from None
            if not isinstance(record, dict):
                raise ValueError(f"line {number}: not a JSON object")
            record["line"] = number
            records.append(record)
        return records


def parse(record: Dict[str, Any], line: int) -> Transaction:
    """One record of the history format, validated."""

    def fail(why: str) -> ValueError:
        return ValueError(f"line {line}: {why}: {record!r}")

    if not isinstance(record, dict):
        raise fail("not an object")
    kind = record.get("type")
    if kind not in ("ok", "fail", "info"):
        raise fail('"type" must be "ok", "fail" or "info"')
    process = record.get("process")
    if not isinstance(process, int) or isinstance(process, bool):
        raise fail('"process" must be an integer')
    invoke, complete = record.get("invoke"), record.get("complete")
    if not is_number(invoke):
        raise fail('"invoke" must be a number')
    if kind == "info" and complete is None:
        pass
    elif not is_number(complete) or complete < invoke:
        raise fail('"complete" must be a number not below "invoke"')
    ops = record.get("ops")
    if not isinstance(ops, list):
        raise fail('"ops" must be a list')
    parsed = []
    for op in ops:
        if not (isinstance(op, list) and len(op) == 3 and op[0] in ("append", "r")):
            raise fail(f'each op must be ["append", key, value] or ["r", key, values], not {op!r}')
        name, key, value = op
        if not isinstance(key, (str, int)):
            raise fail(f"keys must be strings or integers, not {key!r}")
        if name == "append" and not is_scalar(value):
            raise fail(f"appended values must be JSON scalars, not {value!r}")
        # A read's elements are checked where it is used: committed reads must hash.
        if name == "r" and not (value is None or isinstance(value, list)):
            raise fail(f"a read must be a list or null, not {value!r}")
        parsed.append((name, key, value))
    return Transaction(line, process, kind, float(invoke),
                       None if kind == "info" else float(complete), parsed)


def is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def is_scalar(value: Any) -> bool:
    return value is None or isinstance(value, (str, int, float, bool))


def check(records: Iterable[Dict[str, Any]]) -> Report:
    """Check a history given as decoded records of the history format (see the module
    documentation); a record's line number is its ``"line"`` entry, else its position from 1.
    Raises ``ValueError`` for a malformed history."""
    with collection_paused():
        transactions = [parse(record, record.get("line", number) if isinstance(record, dict) else number)
                        for number, record in enumerate(records, 1)]
        return Checker(transactions).run()


@contextlib.contextmanager
def collection_paused() -> Iterator[None]:
    """No cyclic garbage collection: the history's millions of containers would make every
    collection walk them all, and the checker makes no reference cycles to collect."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


class Checker:
    """The analysis of one history. Nodes of the graph are the transactions' positions, then
    virtual nodes (barriers of real time, chains to unobserved appends) whose out-edges are
    unlabelled: a path through them stands for one edge of the type that entered them."""

    def __init__(self, transactions: Sequence[Transaction]) -> None:
        self.transactions = transactions
        self.anomalies: List[Anomaly] = []
        # writer[key][value]: position of the transaction that appended value to key
        self.writer: Dict[Any, Dict[Any, int]] = defaultdict(dict)
        # reads[key]: (position, read, external?) of every known read of an ok transaction
        self.reads: Dict[Any, List[Tuple[int, List[Any], bool]]] = defaultdict(list)
        self.order: Dict[Any, List[Any]] = {}
        self.position: Dict[Any, Dict[Any, int]] = {}
        self.compatible: Dict[Any, List[Tuple[int, List[Any], bool]]] = {}
        # The info transactions that committed: some read observed one of their appends.
        self.committed: Set[int] = set()
        self.unobserved: Dict[Any, Set[int]] = {}
        self.out: List[Dict[int, int]] = [{} for _ in transactions]

    def run(self) -> Report:
        for index, txn in enumerate(self.transactions):
            self.index(index, txn)
        keys = list(dict.fromkeys(itertools.chain(self.writer, self.reads)))  # in history order
        for key in keys:
            self.order_key(key)
        for key in keys:
            self.link_key(key)
        self.add_realtime_edges()
        self.find_cycles()
        counts = Counter(txn.type for txn in self.transactions)
        return Report({kind: counts[kind] for kind in ("ok", "fail", "info")}, self.anomalies)

    def report(self, name: str, positions: Iterable[int], explanation: str) -> None:
        lines = tuple(self.transactions[p].line for p in positions)
        self.anomalies.append(Anomaly(name, lines, f"{name}: {explanation}"))

    def is_node(self, position: int) -> bool:
        return self.transactions[position].type != "fail"

    # --- one transaction at a time ---------------------------------------------------------

    def index(self, position: int, txn: Transaction) -> None:
        # What the transaction's own operations say each list is, once it has read it.
        known: Dict[Any, List[Any]] = {}
        for name, key, value in txn.ops:
            if name == "append":
                first = self.writer[key].setdefault(value, position)
                if first != position or value in txn.appends.get(key, ()):
                    other = self.transactions[first]
                    raise ValueError(f"line {txn.line}: {value!r} was appended to {key!r} before "
                                     f"(line {other.line}): appended values must be unique per key")
                txn.appends.setdefault(key, []).append(value)
                if key in known:
                    known[key] = known[key] + [value]  # a new list: reads are kept as they are
                continue
            if txn.type != "ok" or value is None:
                continue
            try:
                distinct = len(set(value))
            except TypeError:
                raise ValueError(f"line {txn.line}: a read must hold scalars: {value!r}") from None
            if distinct != len(value):
                duplicates = [v for v, n in Counter(value).items() if n > 1]
                self.report("duplicate-elements", [position],
                            f"{txn.name} read {key!r} = {show(value)}, in which "
                            f"{', '.join(map(repr, duplicates))} appear more than once\n"
                            f"  {txn.describe()}")
                known[key] = value
                continue
            own = txn.appends.get(key, [])
            if key in known:
                if value != known[key]:
                    self.report("internal", [position],
                                f"{txn.name} read {key!r} = {show(value)}, but its own earlier "
                                f"operations make it {show(known[key])}\n  {txn.describe()}")
            elif own and value[-len(own):] != own:
                self.report("internal", [position],
                            f"{txn.name} read {key!r} = {show(value)}, which does not end with "
                            f"its own earlier appends {own!r}\n  {txn.describe()}")
            external = key not in known and not own
            if external:
                txn.external_reads[key] = value
            self.reads[key].append((position, value, external))
            known[key] = value
        for key, read in txn.external_reads.items():
            future = sorted(set(txn.appends.get(key, ())).intersection(read), key=read.index)
            if future:
                self.report("internal", [position],
                            f"{txn.name} read {key!r} = {show(read)}, holding its own later "
                            f"append of {', '.join(map(repr, future))}\n  {txn.describe()}")

    # --- one key at a time -----------------------------------------------------------------

    def order_key(self, key: Any) -> None:
        """The key's version order, and the reads that disagree with it."""
        reads = self.reads.get(key, [])
        longest = max((read for _, read, _ in reads), key=len, default=[])
        self.order[key] = longest
        position = self.position[key] = {value: i for i, value in enumerate(longest)}
        compatible = self.compatible[key] = []
        incompatible = []
        for p, read, external in reads:
            if len(read) <= len(longest) and read == longest[:len(read)]:
                compatible.append((p, read, external))
            else:
                incompatible.append((p, read))
        self.check_observed_writers(key, longest, compatible)
        if incompatible:
            self.report_incompatible(key, longest, reads, incompatible)
        for p, read in incompatible:
            self.check_values(key, p, read, [i for i, v in enumerate(read) if v not in position])
        # A transaction's appends are in the order it made them, and info ones that a read
        # observed committed.
        appended_last: Dict[int, int] = {}
        for value in longest:
            w = self.writer[key].get(value)
            if w is None:
                continue
            if self.transactions[w].type == "info":
                self.committed.add(w)
            own = self.transactions[w].appends[key]
            if appended_last.get(w, -1) > own.index(value):
                self.report_misordered_appends(key, w, value, own[appended_last[w]], compatible)
            appended_last[w] = max(appended_last.get(w, -1), own.index(value))

    def link_key(self, key: Any) -> None:
        """The key's edges, and its lost updates."""
        longest, position, compatible = self.order[key], self.position[key], self.compatible[key]
        writer = self.writer.get(key, {})
        # The transactions that appended each element, where they may have committed.
        writers = [writer.get(value, -1) for value in longest]
        node_writers = [w if w >= 0 and self.is_node(w) else -1 for w in writers]
        # following[i]: index of the first element from i on with a possible committer
        following: List[Optional[int]] = [None] * (len(longest) + 1)
        for i in range(len(longest) - 1, -1, -1):
            following[i] = i if node_writers[i] >= 0 else following[i + 1]

        previous = -1
        for w in node_writers:
            if w >= 0:
                if previous >= 0 and previous != w:
                    self.add_edge(previous, w, WW)
                previous = w
        last_writer = previous

        unobserved = sorted({w for value, w in writer.items() if value not in position
                             and (self.transactions[w].type == "ok" or w in self.committed)})
        self.unobserved[key] = set(unobserved)
        latest_readers = []
        versions_appended_to: Dict[int, List[int]] = defaultdict(list)
        for p, read, external in compatible:
            if not external:
                continue
            if read:
                w = node_writers[len(read) - 1]
                if w >= 0 and w != p:
                    self.add_edge(w, p, WR)
                self.check_intermediate(key, p, read)
            after = following[len(read)]
            if after is None:
                latest_readers.append(p)
            elif node_writers[after] != p:
                self.add_edge(p, node_writers[after], RW)
            if key in self.transactions[p].appends:
                versions_appended_to[len(read)].append(p)
        if unobserved:
            sources = [(p, RW) for p in latest_readers]
            if last_writer >= 0:
                sources.append((last_writer, WW))
            self.add_edges_to_all_but_self(sources, unobserved)

        for length, positions in versions_appended_to.items():
            if len(positions) > 1:
                self.report_lost_update(key, longest[:length], positions)

    def report_incompatible(self, key: Any, longest: List[Any],
                            reads: List[Tuple[int, List[Any], bool]],
                            incompatible: List[Tuple[int, List[Any]]]) -> None:
        p, read = incompatible[0]
        q = next(q for q, r, _ in reads if r is longest)
        reader, other = self.transactions[p], self.transactions[q]
        differ = next(i for i, (a, b) in enumerate(zip(read, longest)) if a != b)
        others = len(incompatible) - 1
        more = f" ({plural(others, 'more read disagrees', 'more reads disagree')})" if others else ""
        self.report("incompatible-order", [q, p],
                    f"{reader.name} read {key!r} = {show(read)} and {other.name} read {key!r} = "
                    f"{show(longest)}, which differ at index {differ} ({read[differ]!r} and "
                    f"{longest[differ]!r}){more}\n"
                    f"  {reader.describe()}\n  {other.describe()}")

    def report_misordered_appends(self, key: Any, writer: int, value: Any, earlier: Any,
                                  reads: List[Tuple[int, List[Any], bool]]) -> None:
        position = self.position[key][value]
        reader, read = next((p, read) for p, read, _ in reads if len(read) > position)
        self.report("incompatible-order", [reader, writer],
                    f"{self.transactions[reader].name} read {key!r} = {show(read[:position + 1])}..., "
                    f"with {earlier!r} before {value!r}, but {self.transactions[writer].name} appended "
                    f"{value!r} first\n  {self.transactions[reader].describe()}\n"
                    f"  {self.transactions[writer].describe()}")

    def check_observed_writers(self, key: Any, longest: List[Any],
                               reads: List[Tuple[int, List[Any], bool]]) -> None:
        """G1a and garbage reads among the elements of the version order: each reported
        with the first transaction of the history that read it."""
        writer = self.writer.get(key, {})
        for i, value in enumerate(longest):
            w = writer.get(value)
            if w is not None and self.transactions[w].type != "fail":
                continue
            reader, read = next((p, read) for p, read, _ in reads if len(read) > i)
            self.check_values(key, reader, read, [i])

    def check_values(self, key: Any, reader: int, read: List[Any], indexes: Iterable[int]) -> None:
        txn = self.transactions[reader]
        writer = self.writer.get(key, {})
        for i in indexes:
            value = read[i]
            w = writer.get(value)
            if w is None:
                self.report("garbage-read", [reader],
                            f"{txn.name} read {key!r} = {show(read[:i + 1])}..., but no transaction "
                            f"appended {value!r} to {key!r}\n  {txn.describe()}")
            elif self.transactions[w].type == "fail":
                aborted = self.transactions[w]
                self.report("G1a", [reader, w],
                            f"{txn.name} read {key!r} = {show(read[:i + 1])}..., but {aborted.name}, "
                            f"which appended {value!r}, aborted\n  {txn.describe()}\n  {aborted.describe()}")

    def check_intermediate(self, key: Any, reader: int, read: List[Any]) -> None:
        w = self.writer[key].get(read[-1])
        if w is None or w == reader or self.transactions[w].type == "fail":
            return
        own = self.transactions[w].appends[key]
        if own[-1] != read[-1]:
            later = own[own.index(read[-1]) + 1:]
            self.report("G1b", [reader, w],
                        f"{self.transactions[reader].name} read {key!r} = {show(read)}, an "
                        f"intermediate state of {self.transactions[w].name}, which went on to append "
                        f"{', '.join(map(repr, later))}\n  {self.transactions[reader].describe()}\n"
                        f"  {self.transactions[w].describe()}")

    def report_lost_update(self, key: Any, version: List[Any], positions: List[int]) -> None:
        names = [self.transactions[p].name for p in positions]
        appended = "; ".join(f"{self.transactions[p].name} appended "
                             f"{', '.join(map(repr, self.transactions[p].appends[key]))}"
                             for p in positions)
        details = "".join(f"\n  {self.transactions[p].describe()}" for p in positions)
        self.report("lost-update", positions,
                    f"{', '.join(names[:-1])} and {names[-1]} read {key!r} = {show(version)} and "
                    f"appended to it ({appended}): only the first of them to commit read the latest "
                    f"version{details}")

    # --- the graph -------------------------------------------------------------------------

    def add_edge(self, source: int, target: int, label: int) -> None:
        edges = self.out[source]
        edges[target] = edges.get(target, 0) | label

    def new_node(self) -> int:
        self.out.append({})
        return len(self.out) - 1

    def add_edges_to_all_but_self(self, sources: List[Tuple[int, int]], targets: List[int]) -> None:
        """An edge from each source to each target but itself, through two chains of virtual
        nodes (ascending[i] reaches targets[:i + 1], descending[i] reaches targets[i:]), in
        edges linear in their numbers."""
        ascending = [self.new_node() for _ in targets]
        descending = [self.new_node() for _ in targets]
        for i, target in enumerate(targets):
            self.add_edge(ascending[i], target, 0)
            self.add_edge(descending[i], target, 0)
            if i:
                self.add_edge(ascending[i], ascending[i - 1], 0)
                self.add_edge(descending[i - 1], descending[i], 0)
        where = {target: i for i, target in enumerate(targets)}
        for source, label in sources:
            i = where.get(source)
            if i is None:
                self.add_edge(source, ascending[-1], label)
                continue
            if i > 0:
                self.add_edge(source, ascending[i - 1], label)
            if i + 1 < len(targets):
                self.add_edge(source, descending[i + 1], label)

    def add_realtime_edges(self) -> None:
        """T1 -> T2 when T1 completed before T2 was invoked: the transactions completed since
        the previous invocation lead to a new barrier, which leads to the previous barrier and
        to every transaction invoked from then on."""
        events = []
        for position, txn in enumerate(self.transactions):
            if not self.is_node(position):
                continue
            events.append((txn.invoke, 0, position))
            if txn.type == "ok":
                events.append((txn.complete, 1, position))  # after invocations at the same time
        events.sort()
        completed: List[int] = []
        barrier = -1
        for _, completion, position in events:
            if completion:
                completed.append(position)
                continue
            if completed:
                fresh = self.new_node()
                if barrier >= 0:
                    self.add_edge(barrier, fresh, 0)
                for done in completed:
                    self.add_edge(done, fresh, RT)
                completed.clear()
                barrier = fresh
            if barrier >= 0:
                self.add_edge(barrier, position, 0)

    def successors(self, allowed: int, members: Optional[Set[int]] = None) -> Callable[[int], List[int]]:
        """A node's successors through edges of the allowed types (and unlabelled ones),
        among members."""
        out = self.out

        def of(node: int) -> List[int]:
            return [v for v, label in out[node].items()
                    if (label == 0 or label & allowed) and (members is None or v in members)]
        return of

    # --- cycles ----------------------------------------------------------------------------

    def find_cycles(self) -> None:
        everything = self.successors(DEPENDENCIES | RT)
        for component in strongly_connected_components(range(len(self.out)), everything):
            members = set(component)
            inner = strongly_connected_components(component, self.successors(DEPENDENCIES, members))
            if inner:
                for part in inner:
                    self.report_cycle(self.classify(set(part), 0), part)
            else:
                self.report_cycle(self.classify(members, RT), component)

    def classify(self, members: Set[int], extra: int) -> Hops:
        """A short cycle in a strongly connected component, with as few rw edges as the
        searches find: ww alone, then ww and wr, then one rw, then any number."""
        for allowed in (WW | extra, WW | WR | extra):
            cycle = self.cycle_within(members, allowed, 1)
            if cycle:
                return cycle
        cycle = self.single_rw_cycle(members, WW | WR | extra)
        if cycle:
            return cycle
        cycle = self.cycle_within(members, DEPENDENCIES | extra, len(members) + 1)
        assert cycle, "a strongly connected component has a cycle"
        return cycle

    def cycle_within(self, members: Set[int], allowed: int, rw_cost: int) -> Optional[Hops]:
        allowed_edges = self.successors(allowed, members)
        components = strongly_connected_components(sorted(members), allowed_edges)
        if not components:
            return None
        smallest = min(components, key=len)
        start = min(node for node in smallest if node < len(self.transactions))
        return self.shortest_path(start, start, set(smallest), allowed, rw_cost)

    def single_rw_cycle(self, members: Set[int], allowed: int) -> Optional[Hops]:
        rw_edges = ((a, x) for a in sorted(members) for x, label in self.out[a].items()
                    if x in members and label & RW and not label & allowed)
        for a, x in itertools.islice(rw_edges, max(1, SINGLE_RW_WORK // len(members))):
            path = self.shortest_path(x, a, members, allowed, 1)
            if path:
                return [(a, x, RW)] + path
        return None

    def shortest_path(self, source: int, target: int, members: Set[int], allowed: int,
                      rw_cost: int) -> Optional[Hops]:
        """The cheapest path from source to target (a cycle when they are equal) as its hops
        (from, to, label); an edge costs 1, rw_cost when only rw allows it, 0 when unlabelled."""
        cost = {source: 0}
        came_from: Dict[int, Tuple[int, int]] = {}
        best: Optional[Tuple[int, int, int]] = None  # cost, last node, label into target
        heap = [(0, source)]
        while heap:
            spent, node = heapq.heappop(heap)
            if best is not None and spent >= best[0]:
                break
            if spent > cost[node]:
                continue
            for successor, labels in self.out[node].items():
                if successor not in members:
                    continue
                if labels == 0:
                    label, step = 0, 0
                elif labels & allowed:
                    label = next(bit for bit in LABEL_PREFERENCE if bit & labels & allowed)
                    step = rw_cost if label == RW else 1
                else:
                    continue
                total = spent + step
                if successor == target:
                    if best is None or total < best[0]:
                        best = (total, node, label)
                elif total < cost.get(successor, total + 1):
                    cost[successor] = total
                    came_from[successor] = (node, label)
                    heapq.heappush(heap, (total, successor))
        if best is None:
            return None
        _, node, label = best
        hops = [(node, target, label)]
        while node != source:
            previous, label = came_from[node]
            hops.append((previous, node, label))
            node = previous
        hops.reverse()
        return hops

    def report_cycle(self, hops: Hops, component: List[int]) -> None:
        # Unlabelled hops leave virtual nodes: they continue the edge that entered them.
        edges: List[List[int]] = []
        for source, target, label in hops:
            if label:
                edges.append([source, target, label])
            else:
                edges[-1][1] = target
        labels = [label for _, _, label in edges]
        rw = labels.count(RW)
        if rw == 0:
            name = "G0" if all(label in (WW, RT) for label in labels) else "G1c"
        else:
            name = "G-single" if rw == 1 else "G2"
        if RT in labels:
            name += "-realtime"
        positions = [source for source, _, _ in edges]
        lines = [f"a cycle of {len(edges)} transactions"]
        size = sum(1 for node in component if node < len(self.transactions))
        if size > len(edges):
            lines[0] += f", among {size} transactions that all depend on each other"
        lines += [f"  {self.transactions[p].describe()}" for p in positions]
        lines.append("  Then:")
        for i, (source, target, label) in enumerate(edges):
            however = "However, " if i == len(edges) - 1 else ""
            before, after = self.transactions[source].name, self.transactions[target].name
            lines.append(f"    - {however}{before} < {after} ({EDGE_NAMES[label]}): "
                         f"{self.explain(source, target, label)}")
        lines[-1] += ": a contradiction."
        self.report(name, positions, "\n".join(lines))

    def explain(self, source: int, target: int, label: int) -> str:
        t1, t2 = self.transactions[source], self.transactions[target]
        if label == RT:
            return (f"{t1.name} completed at {t1.complete:.6f}, before {t2.name} was invoked at "
                    f"{t2.invoke:.6f}")
        if label == WR:
            for key, read in t2.external_reads.items():
                if read and self.writer[key].get(read[-1]) == source:
                    return (f"{t2.name} read {key!r} = {show(read)}, ending with {t1.name}'s "
                            f"append of {read[-1]!r}")
        if label == WW:
            for key, values in t1.appends.items():
                for value in values:
                    if value not in self.position.get(key, {}):
                        continue
                    following = self.follower(key, value, target)
                    if following == UNOBSERVED:
                        return (f"{t1.name} appended {value!r} to {key!r}, the last element any read "
                                f"observed, and {t2.name}'s committed append to {key!r}, which no read "
                                f"observed, came later")
                    if following is not None:
                        return (f"{t1.name} appended {value!r} to {key!r}, and {t2.name} appended "
                                f"{following[0]!r} right after it")
        if label == RW:
            for key, read in t1.external_reads.items():
                if read != self.order[key][:len(read)]:
                    continue
                following = self.follower(key, read[-1] if read else None, target)
                if following == UNOBSERVED:
                    unseen = [v for v in t2.appends[key] if v not in self.position[key]]
                    return (f"{t1.name} read {key!r} = {show(read)}, the longest read of it, without "
                            f"{t2.name}'s committed append of {', '.join(map(repr, unseen))}, "
                            f"which no read observed")
                if following is not None:
                    where = f"right after {read[-1]!r}" if read else "first"
                    return (f"{t1.name} read {key!r} = {show(read)}, without {t2.name}'s append of "
                            f"{following[0]!r}, which came {where}")
        raise AssertionError(f"no reason for the edge {t1.name} -> {t2.name} ({EDGE_NAMES[label]})")

    def follower(self, key: Any, value: Any, target: int) -> Optional[Tuple[Any, ...]]:
        """``(element,)`` when the target appended the element that came next after value
        (None: the start of the list) among possibly committed ones; UNOBSERVED when nothing
        observed came next and the target's committed append was never observed; else None."""
        order, writer = self.order[key], self.writer[key]
        start = 0 if value is None else self.position[key][value] + 1
        for element in order[start:]:
            w = writer.get(element, -1)
            if w >= 0 and self.is_node(w):
                return (element,) if w == target else None
        return UNOBSERVED if target in self.unobserved[key] else None


def strongly_connected_components(nodes: Iterable[int],
                                  successors: Callable[[int], List[int]]) -> List[List[int]]:
    """Tarjan's algorithm, iterative: the components of more than one node."""
    index: Dict[int, int] = {}
    low: Dict[int, int] = {}
    on_stack: Set[int] = set()
    stack: List[int] = []
    components = []
    for root in nodes:
        if root in index:
            continue
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        work: List[Tuple[int, Iterator[int]]] = [(root, iter(successors(root)))]
        while work:
            node, pending = work[-1]
            for successor in pending:
                if successor not in index:
                    index[successor] = low[successor] = len(index)
                    stack.append(successor)
                    on_stack.add(successor)
                    work.append((successor, iter(successors(successor))))
                    break
                if successor in on_stack and index[successor] < low[node]:
                    low[node] = index[successor]
            else:
                work.pop()
                if work:
                    parent = work[-1][0]
                    if low[node] < low[parent]:
                        low[parent] = low[node]
                if low[node] == index[node]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        components.append(component)
    return components


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tests.serializability.checker",
        description="Check a list-append history (JSON lines) for strict serializability.")
    parser.add_argument("history", help="the history file, - for standard input")
    parser.add_argument("--limit", type=int, default=10,
                        help="anomalies of each kind shown in full (default 10)")
    args = parser.parse_args(argv)
    try:
        report = check(load(args.history))
    except (OSError, ValueError) as error:
        print(f"{parser.prog}: {error}", file=sys.stderr)
        return 2
    print(report.format(args.limit))
    return 0 if report.valid else 1


if __name__ == "__main__":
    sys.exit(main())
