"""The bank of the transaction tests, on one server (test_transactions.py) and over a
cluster's shards (test_cluster_transactions.py): the clients' script and what must hold.

`transfer` clients move random amounts between random accounts, each transfer appending its
id to a history list in the same transaction; `audit` clients read every balance in
read-only transactions and note any snapshot whose total is off or with a negative balance.
A client's arguments: the server's address (or the nodes'), its role and its number.
"""

from __future__ import annotations

CLIENT = r"""
import json, os, random, sys
import spindle, spindle.client
from load import Progress
spindle.client.RETRIES = 9  # reconnect for up to ~25 s: a restart takes milliseconds
address, role, me, stop, progress, out = sys.argv[1:]
spindle.connect(address, embedded=False)
accounts = [spindle.Counter(name=n, persistent=True) for n in NAMES]
history = spindle.List(name=HISTORY.format(me=me), persistent=True)
progress = Progress(progress)
rng = random.Random(me)
acked, snapshots, bad, unknown = [], 0, [], 0

@spindle.transactional
def transfer(src, dst, amount, tid):
    if src.get() < amount:
        return False
    src.add(-amount)
    dst.add(amount)
    history.append(tid)
    return True

@spindle.transactional
def snapshot():
    return [a.get() for a in accounts]

n = 0
while not os.path.exists(stop):
    try:
        if role == "transfer":
            n += 1
            tid = f"{me}-{n}"
            src, dst = rng.sample(accounts, 2)
            if transfer(src, dst, rng.randint(1, 30), tid):
                acked.append(tid)
        else:
            balances = snapshot()
            snapshots += 1
            if sum(balances) != len(accounts) * 100 or min(balances) < 0:
                bad.append(balances)
        progress.acknowledged()
    except (spindle.ServerUnavailable, spindle.TransactionConflict):
        unknown += 1  # no server answered within the retries, or the attempts ran out
with open(out, "w") as f:
    json.dump({"acked": acked, "snapshots": snapshots, "bad": bad, "unknown": unknown,
               "acked_at": progress.times}, f)
"""

# 8 clients transfer, 2 audit.
ROLES = ["transfer"] * 8 + ["audit"] * 2


def client_script(names: list, history: str) -> str:
    """The clients' script over accounts `names` (100 each at the start), appending to the
    history list named `history` (`{me}` in it: the client's number)."""
    return CLIENT.replace("NAMES", repr(names)).replace("HISTORY", repr(history))


def check(results: list, balances: list, history: list) -> None:
    """What must hold after the run: the total kept, no balance negative, every acknowledged
    transfer in the history exactly once, and every snapshot whole."""
    print(f"bank: {sum(len(r['acked']) for r in results)} transfers acknowledged, "
          f"{sum(r['snapshots'] for r in results)} snapshots, {sum(r['unknown'] for r in results)} unknown")
    assert sum(balances) == len(balances) * 100
    assert min(balances) >= 0
    assert len(history) == len(set(history)), "a transfer landed twice"
    acked = [tid for r in results for tid in r["acked"]]
    assert acked, "no transfer was acknowledged"
    assert set(acked) <= set(history), f"lost: {sorted(set(acked) - set(history))[:10]}"
    audits = [r for r, role in zip(results, ROLES) if role == "audit"]
    assert all(r["snapshots"] > 0 for r in audits), "an auditor never got a snapshot"
    assert [r["bad"] for r in audits] == [[] for _ in audits]
