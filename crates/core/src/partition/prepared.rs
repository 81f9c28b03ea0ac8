//! Two-phase commit of a cluster's transactions, as one partition sees it (see
//! docs/transactions.md, "Across a cluster's shards").
//!
//! As a participant, a partition *prepares* a transaction: its workspace is validated, and
//! its calls' records go in one `prepare` record, with every key it touched. From then on
//! the transaction cannot be wounded or expire, and every other call on those keys waits
//! (reads too: the client may hold the commit's reply before this shard applies it) until
//! the `decide` record applies the records or drops them. Replaying a `prepare` record
//! rebuilds the prepared state, so a new leader (or a snapshot's restore) has it.
//!
//! As the coordinator (the lowest shard the transaction touched), a partition keeps the
//! decision in its `decision` record until every participant learned it (`forget`); the
//! record also decides the coordinator's own part, and records the commit's reply for
//! retries. A decision is taken once: a later attempt finds it (an abort presumed for a
//! participant that asked stops a late commit).

use ahash::HashMap;
use std::sync::Arc;
use std::time::Instant;

use super::{Partition, Storage};
use crate::record::{encode_apply, Record, MAX_RECORD_LEN};
use crate::{Caller, Delivery, Error, ErrorKind, Reply, Token, Value};

use super::transaction::COMMIT_TOKEN;
use super::txn_waits::TxnWaiter;
use super::{Op, TxnId};

/// Prepared transactions, the calls waiting for them, and the coordinator's decisions.
#[derive(Default)]
pub(super) struct TwoPhase {
    prepared: HashMap<TxnId, Prepared>,
    /// The prepared transaction holding each key.
    holders: HashMap<String, TxnId>,
    decisions: HashMap<TxnId, Decision>,
}

struct Prepared {
    coordinator: u64,
    keys: Vec<String>,
    /// Its calls' records (on persistent objects): what every replica applies at commit.
    records: Vec<Vec<u8>>,
    /// Its calls, on the leader that prepared it (ephemeral objects' too, which have no
    /// records): applied at commit in place of the records.
    ops: Option<Vec<(Caller, Op)>>,
    /// Calls on its keys waiting for the decision, in arrival order.
    blocked: Vec<Blocked>,
}

/// A call waiting for a prepared transaction's decision.
enum Blocked {
    Single {
        caller: Caller,
        token: Token,
        seq: u64,
        acked: u64,
        op: Op,
    },
    /// A call of another transaction.
    InTxn(TxnWaiter),
}

impl Blocked {
    fn token(&self) -> Token {
        match self {
            Blocked::Single { token, .. } => *token,
            Blocked::InTxn(w) => w.token,
        }
    }
}

/// A coordinator's decision on a transaction.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Decision {
    pub commit: bool,
    /// Why it aborted (empty when it commits): the commit's reply.
    pub message: String,
    /// The shards that take part.
    pub participants: Vec<u64>,
}

impl Decision {
    /// The reply of the commit it decides.
    pub fn reply(&self) -> Reply {
        match self.commit {
            true => Ok(Value::Boolean(true)),
            false => Err(Error::new(ErrorKind::TransactionConflict, self.message.clone())),
        }
    }
}

impl TwoPhase {
    /// The prepared transaction holding `key`, if any (cheap while none is prepared).
    fn holder(&self, key: &str) -> Option<&TxnId> {
        match self.holders.is_empty() {
            true => None,
            false => self.holders.get(key),
        }
    }
}

impl Partition {
    /// A live call on a key a prepared transaction holds waits for its decision: `None`
    /// when it was put aside (its reply comes with the decision), else the call back.
    pub(super) fn wait_if_prepared(
        &mut self,
        caller: &Caller,
        token: Token,
        seq: u64,
        acked: u64,
        op: Op,
    ) -> Option<Op> {
        let Some(id) = self.two_phase.holder(op.key()).cloned() else {
            return Some(op);
        };
        let prepared = self.two_phase.prepared.get_mut(&id).expect("a holder is prepared");
        prepared.blocked.push(Blocked::Single {
            caller: caller.clone(),
            token,
            seq,
            acked,
            op,
        });
        None
    }

    /// A transaction's call on a key a prepared transaction holds: it waits for the decision.
    pub(super) fn wait_in_txn(&mut self, w: TxnWaiter) {
        let Some(id) = self.two_phase.holder(w.op.key()).cloned() else {
            return;
        };
        let prepared = self.two_phase.prepared.get_mut(&id).expect("a holder is prepared");
        prepared.blocked.push(Blocked::InTxn(w));
    }

    /// The prepared transaction holding `key` (a transaction wanting it gives way).
    pub(super) fn prepared_holder(&self, key: &str) -> Option<&TxnId> {
        self.two_phase.holder(key)
    }

    /// Prepare transaction `id` here, its decision to be kept by shard `coordinator`: its
    /// workspace must validate. Logs its `prepare` record; the vote is yes once that is
    /// durable. Preparing one already prepared changes nothing (a resent prepare), but its
    /// answer still waits for the log. The replies of calls that waited for the objects of
    /// one that does not validate (and is dropped) go in `out`.
    pub fn prepare(
        &mut self,
        id: &TxnId,
        coordinator: u64,
        now: Instant,
        out: &mut Vec<Delivery>,
    ) -> Result<(), Error> {
        if self.two_phase.prepared.contains_key(id) {
            self.touched_persistent = true;
            return Ok(());
        }
        if self.holds_user_objects(id) {
            // Their copies live in this leader's hosts, which a prepared transaction's
            // decision may outlive: not yet (docs/transactions.md).
            out.extend(self.drop_txn(id, now));
            return Err(Error::new(
                ErrorKind::TransactionError,
                format!(
                    "transaction {} touched user-defined objects and objects of other shards: in a cluster, a \
                     transaction with user-defined objects must keep to one shard (for now)",
                    id.number
                ),
            ));
        }
        if let Err(e) = self.validate(id) {
            out.extend(self.drop_txn(id, now));
            return Err(e);
        }
        let (keys, ops) = self.take_workspace(id);
        let records = self.records_of(&ops);
        if records.iter().map(|r| r.len() + 5).sum::<usize>() + keys.iter().map(|k| k.len() + 5).sum::<usize>()
            > MAX_RECORD_LEN
        {
            // Its workspace went: the calls that waited for its objects run.
            out.extend(self.wake(now));
            return Err(Error::new(
                ErrorKind::TransactionError,
                format!(
                    "transaction {} would write a prepare record larger than the {MAX_RECORD_LEN} bytes a record \
                     may hold: make it in smaller transactions",
                    id.number
                ),
            ));
        }
        let record = Record::Prepare {
            client: id.client.to_string(),
            number: id.number,
            coordinator,
            keys: keys.clone(),
            records: records.clone(),
        };
        self.log(record.encode());
        self.logged_clients.insert(id.client.clone());
        self.hold(id.clone(), coordinator, keys.clone(), records, Some(ops));
        self.wait_for_prepared(&keys);
        Ok(())
    }

    /// The records a replica applies for `ops` (their calls on persistent objects, as the
    /// leader will find them when they run in order).
    fn records_of(&self, ops: &[(Caller, Op)]) -> Vec<Vec<u8>> {
        let durable = self.storage != Storage::None;
        let mut persistent: HashMap<&str, bool> = HashMap::default();
        let mut records = Vec::new();
        for (caller, op) in ops {
            let key = op.key();
            let is = *persistent.entry(key).or_insert_with(|| self.is_persistent(key));
            let now = match op {
                Op::Create { persistent: p, .. } => is || (*p && durable),
                Op::Delete { .. } => false,
                Op::Call { .. } => is,
            };
            if is || now {
                records.push(encode_apply(caller, COMMIT_TOKEN, 0, 0, op));
            }
            persistent.insert(key, now);
        }
        records
    }

    fn hold(
        &mut self,
        id: TxnId,
        coordinator: u64,
        keys: Vec<String>,
        records: Vec<Vec<u8>>,
        ops: Option<Vec<(Caller, Op)>>,
    ) {
        for key in &keys {
            self.two_phase.holders.insert(key.clone(), id.clone());
        }
        let prepared = Prepared {
            coordinator,
            keys,
            records,
            ops,
            blocked: Vec::new(),
        };
        self.two_phase.prepared.insert(id, prepared);
    }

    /// Apply (`commit`) or drop the prepared transaction `id`, and run the calls that waited
    /// for it. Logs its `decide` record unless the decision is the coordinator's own record.
    /// Returns the replies of the calls it woke and of those that waited.
    pub fn decide(&mut self, id: &TxnId, commit: bool, now: Instant) -> Vec<Delivery> {
        self.settle_prepared(id, commit, true, now)
    }

    fn settle_prepared(&mut self, id: &TxnId, commit: bool, log: bool, now: Instant) -> Vec<Delivery> {
        let Some(prepared) = self.two_phase.prepared.remove(id) else {
            // Decided already (or never prepared here): the answer waits for the log still.
            self.touched_persistent = true;
            return Vec::new();
        };
        for key in &prepared.keys {
            if self.two_phase.holders.get(key) == Some(id) {
                self.two_phase.holders.remove(key);
            }
        }
        let mut out = Vec::new();
        if commit {
            let before = self.records.len();
            self.committing = true;
            match prepared.ops {
                Some(ops) => {
                    for (caller, op) in ops {
                        out.extend(self.apply_as(&caller, COMMIT_TOKEN, 0, 0, op, now, None));
                    }
                }
                None => {
                    for record in &prepared.records {
                        if let Ok(Record::Apply {
                            caller,
                            token,
                            seq,
                            acked,
                            op,
                        }) = Record::decode(record)
                        {
                            out.extend(self.apply_as(&caller, token, seq, acked, op, now, Some(record)));
                        }
                    }
                }
            }
            self.committing = false;
            out.retain(|d| d.token != COMMIT_TOKEN);
            // The prepare record holds them already.
            self.records.truncate(before);
        }
        if log {
            let record = Record::Decide {
                client: id.client.to_string(),
                number: id.number,
                commit,
            };
            self.log(record.encode());
        }
        self.touched_persistent = true;
        for b in prepared.blocked {
            match b {
                Blocked::Single {
                    caller,
                    token,
                    seq,
                    acked,
                    op,
                } => {
                    // One that turns out to call other objects (its object came with this
                    // transaction) cannot be handed to the server's driver from here.
                    let key = op.key().to_string();
                    out.extend(
                        self.apply_as(&caller, token, seq, acked, op, now, None)
                            .into_iter()
                            .map(|mut d| {
                                if matches!(&d.reply, Err(e) if e.kind == ErrorKind::NestedCall) {
                                    let busy = format!("'{key}' was being committed by a transaction: try again");
                                    d.reply = Err(Error::new(ErrorKind::Busy, busy));
                                }
                                d
                            }),
                    )
                }
                // Past its deadline, it is aborted there.
                Blocked::InTxn(w) => out.extend(self.run_woken(w, now)),
            }
        }
        out.extend(self.wake(now));
        out
    }

    /// As the coordinator: decide transaction `id` (`commit`, or abort with `message`) over
    /// `participants`, unless it was decided already. Its `decision` record records the
    /// reply for `seq` (not 0) and decides this shard's own part. Returns the decision in
    /// force, and the replies of the calls its own part woke.
    pub fn record_decision(
        &mut self,
        id: &TxnId,
        decision: Decision,
        seq: u64,
        now: Instant,
    ) -> (Decision, Vec<Delivery>) {
        if let Some(taken) = self.two_phase.decisions.get(id) {
            self.touched_persistent = true;
            return (taken.clone(), Vec::new());
        }
        let record = Record::Decision {
            client: id.client.to_string(),
            number: id.number,
            commit: decision.commit,
            seq,
            message: decision.message.clone(),
            participants: decision.participants.clone(),
        };
        self.log(record.encode());
        let out = self.take_decision(id, decision.clone(), seq, now);
        (decision, out)
    }

    fn take_decision(&mut self, id: &TxnId, decision: Decision, seq: u64, now: Instant) -> Vec<Delivery> {
        if seq != 0 {
            self.record_reply(&id.client, seq, decision.reply(), true);
        }
        self.logged_clients.insert(id.client.clone());
        let commit = decision.commit;
        self.two_phase.decisions.insert(id.clone(), decision);
        self.settle_prepared(id, commit, false, now)
    }

    /// The coordinator's decision on `id`, while kept.
    pub fn decision(&self, id: &TxnId) -> Option<&Decision> {
        self.two_phase.decisions.get(id)
    }

    /// The decisions kept here (every participant has yet to learn them).
    pub fn decisions(&self) -> Vec<(TxnId, Decision)> {
        let mut all: Vec<_> = self
            .two_phase
            .decisions
            .iter()
            .map(|(i, d)| (i.clone(), d.clone()))
            .collect();
        all.sort_unstable_by(|a, b| a.0.cmp(&b.0));
        all
    }

    /// Every participant learned the decision on `id`: drop it (logged).
    pub fn forget(&mut self, id: &TxnId) {
        if self.two_phase.decisions.remove(id).is_some() {
            let record = Record::Forget {
                client: id.client.to_string(),
                number: id.number,
            };
            self.log(record.encode());
        }
    }

    /// The transactions prepared here, with their coordinator shards.
    pub fn prepared_txns(&self) -> Vec<(TxnId, u64)> {
        let mut all: Vec<_> = self
            .two_phase
            .prepared
            .iter()
            .map(|(id, p)| (id.clone(), p.coordinator))
            .collect();
        all.sort_unstable();
        all
    }

    /// Whether transaction `id` is prepared here.
    pub fn is_prepared(&self, id: &TxnId) -> bool {
        self.two_phase.prepared.contains_key(id)
    }

    /// Replay of the two-phase records.
    pub(super) fn replay_two_phase(&mut self, record: Record, now: Instant) {
        match record {
            Record::Prepare {
                client,
                number,
                coordinator,
                keys,
                records,
            } => {
                let client: Arc<str> = Arc::from(client);
                self.logged_clients.insert(client.clone());
                let id = TxnId { client, number };
                // A workspace of it here (on a replica: none) is now prepared.
                self.forget_txn(&id, "");
                self.hold(id, coordinator, keys.clone(), records, None);
                self.wait_for_prepared(&keys);
            }
            Record::Decide { client, number, commit } => {
                let id = TxnId {
                    client: Arc::from(client),
                    number,
                };
                self.settle_prepared(&id, commit, false, now);
            }
            Record::Decision {
                client,
                number,
                commit,
                seq,
                message,
                participants,
            } => {
                let id = TxnId {
                    client: Arc::from(client),
                    number,
                };
                let decision = Decision {
                    commit,
                    message,
                    participants,
                };
                if !self.two_phase.decisions.contains_key(&id) {
                    self.take_decision(&id, decision, seq, now);
                }
            }
            Record::Forget { client, number } => {
                let id = TxnId {
                    client: Arc::from(client),
                    number,
                };
                self.two_phase.decisions.remove(&id);
            }
            _ => {}
        }
    }

    /// A leader stepping down: the calls waiting for a decision are answered with `error`.
    pub(super) fn abandon_waiting(&mut self, error: &Error) -> Vec<Delivery> {
        let mut out = Vec::new();
        for prepared in self.two_phase.prepared.values_mut() {
            out.extend(prepared.blocked.drain(..).map(|b| Delivery {
                token: b.token(),
                reply: Err(error.clone()),
            }));
        }
        out
    }

    /// For a snapshot: each prepared transaction's `prepare` record, and each kept
    /// decision's `decision` record (with no reply: the reply log has it).
    pub(super) fn two_phase_records(&self) -> (Vec<Vec<u8>>, Vec<Vec<u8>>) {
        let mut prepared: Vec<_> = self.two_phase.prepared.iter().collect();
        prepared.sort_unstable_by(|a, b| a.0.cmp(b.0));
        let prepared = prepared
            .into_iter()
            .map(|(id, p)| {
                Record::Prepare {
                    client: id.client.to_string(),
                    number: id.number,
                    coordinator: p.coordinator,
                    keys: p.keys.clone(),
                    records: p.records.clone(),
                }
                .encode()
            })
            .collect();
        let decisions = self
            .decisions()
            .into_iter()
            .map(|(id, d)| {
                Record::Decision {
                    client: id.client.to_string(),
                    number: id.number,
                    commit: d.commit,
                    seq: 0,
                    message: d.message,
                    participants: d.participants,
                }
                .encode()
            })
            .collect();
        (prepared, decisions)
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::objects::testing::who;
    use crate::partition::TxnCall;

    fn id(number: u64) -> TxnId {
        TxnId {
            client: Arc::from("t"),
            number,
        }
    }

    fn call(key: &str, method: &str, args: Vec<Value>) -> Op {
        Op::Call {
            type_name: "Counter".into(),
            key: key.into(),
            method: method.into(),
            args,
            nested: None,
        }
    }

    /// A leader with persistent counters `a` and `b`, and the records it logged.
    struct Leader {
        p: Partition,
        log: Vec<Vec<u8>>,
        now: Instant,
    }

    impl Leader {
        fn new() -> Self {
            let mut p = Partition::new();
            p.enable_storage();
            let mut l = Leader {
                p,
                log: Vec::new(),
                now: Instant::now(),
            };
            for key in ["a", "b"] {
                let create = Op::Create {
                    type_name: "Counter".into(),
                    key: key.into(),
                    args: vec![],
                    owned: false,
                    persistent: true,
                };
                let out = l.p.apply(&who(9), Token { conn: 9, req: 1 }, 0, 0, create, l.now);
                l.drain(out);
            }
            l
        }

        fn drain(&mut self, out: Vec<Delivery>) -> Vec<Delivery> {
            self.log.extend(self.p.take_log().unwrap_or_default());
            out
        }

        fn in_txn(&mut self, txn: &TxnId, op: Op) -> Reply {
            let call = TxnCall {
                id: txn,
                age: 1,
                first: true,
                deadline: self.now + Duration::from_secs(5),
                max_bytes: 1 << 20,
            };
            let out = self
                .p
                .apply_in(call, &who(1), Token { conn: 1, req: 1 }, 0, op, self.now);
            self.drain(out).remove(0).reply
        }

        fn single(&mut self, req: u64, op: Op) -> Vec<Delivery> {
            let out = self.p.apply(&who(2), Token { conn: 2, req }, 0, 0, op, self.now);
            self.drain(out)
        }

        fn replica(&self) -> Partition {
            let mut r = Partition::new();
            r.enable_storage();
            for record in &self.log {
                r.replay(record, self.now).unwrap();
            }
            r
        }
    }

    fn value(p: &mut Partition, key: &str) -> Reply {
        let out = p.apply(
            &who(3),
            Token { conn: 3, req: 1 },
            0,
            0,
            call(key, "get", vec![]),
            Instant::now(),
        );
        out.into_iter().next().expect("not held").reply
    }

    #[test]
    fn a_prepared_transaction_holds_its_keys_until_decided_and_replicas_follow() {
        let mut l = Leader::new();
        let t = id(1);
        assert_eq!(l.in_txn(&t, call("a", "add", vec![5.into()])), Ok(5.into()));
        assert_eq!(l.in_txn(&t, call("b", "get", vec![])), Ok(0.into()));
        l.p.prepare(&t, 0, l.now, &mut Vec::new()).unwrap();
        l.drain(Vec::new());
        // Reads and writes wait for the decision, another transaction's calls too.
        assert!(l.single(10, call("a", "get", vec![])).is_empty());
        assert!(l.single(11, call("b", "add", vec![1.into()])).is_empty());
        let other = TxnCall {
            id: &id(2),
            age: 0,
            first: true,
            deadline: l.now + Duration::from_secs(5),
            max_bytes: 1 << 20,
        };
        let waiting = l.p.apply_in(
            other,
            &who(4),
            Token { conn: 4, req: 12 },
            0,
            call("a", "get", vec![]),
            l.now,
        );
        assert!(waiting.is_empty());
        // An old transaction cannot wound it.
        assert!(l.p.is_prepared(&t));
        // A replica rebuilt from the log holds the same keys.
        let mut r = l.replica();
        assert_eq!(r.prepared_txns(), vec![(t.clone(), 0)]);
        assert!(r
            .apply(
                &who(3),
                Token { conn: 3, req: 1 },
                0,
                0,
                call("a", "get", vec![]),
                l.now
            )
            .is_empty());
        // Commit: the waiting calls run after its writes.
        let now = l.now;
        let out = l.p.decide(&t, true, now);
        let out = l.drain(out);
        let reply = |req| out.iter().find(|d| d.token.req == req).map(|d| d.reply.clone());
        assert_eq!(reply(10), Some(Ok(5.into())));
        assert_eq!(reply(11), Some(Ok(1.into())));
        assert_eq!(reply(12), Some(Ok(5.into())));
        assert!(l.p.validate(&id(2)).is_ok());
        let mut r = l.replica();
        assert!(r.prepared_txns().is_empty());
        assert_eq!(value(&mut r, "a"), Ok(5.into()));
        assert_eq!(value(&mut r, "b"), Ok(1.into()));
    }

    #[test]
    fn an_abort_drops_the_prepared_writes_everywhere() {
        let mut l = Leader::new();
        let t = id(1);
        l.in_txn(&t, call("a", "add", vec![5.into()])).unwrap();
        l.p.prepare(&t, 3, l.now, &mut Vec::new()).unwrap();
        l.drain(Vec::new());
        let now = l.now;
        let out = l.p.decide(&t, false, now);
        l.drain(out);
        assert_eq!(value(&mut l.p, "a"), Ok(0.into()));
        assert_eq!(value(&mut l.replica(), "a"), Ok(0.into()));
    }

    #[test]
    fn a_stale_workspace_votes_no() {
        let mut l = Leader::new();
        let t = id(1);
        l.in_txn(&t, call("a", "get", vec![])).unwrap();
        l.single(10, call("a", "add", vec![1.into()]));
        assert_eq!(
            l.p.prepare(&t, 0, l.now, &mut Vec::new()).unwrap_err().kind,
            ErrorKind::TransactionConflict
        );
        assert!(!l.p.is_prepared(&t));
    }

    #[test]
    fn a_decision_is_taken_once_and_decides_the_coordinators_own_part() {
        let mut l = Leader::new();
        let t = id(1);
        l.in_txn(&t, call("a", "add", vec![2.into()])).unwrap();
        l.p.prepare(&t, 0, l.now, &mut Vec::new()).unwrap();
        let commit = Decision {
            commit: true,
            message: String::new(),
            participants: vec![0, 1],
        };
        let now = l.now;
        let (taken, _) = l.p.record_decision(&t, commit.clone(), 7, now);
        assert_eq!(taken, commit);
        let abort = Decision {
            commit: false,
            message: "presumed".into(),
            participants: vec![0, 1],
        };
        let (taken, _) = l.p.record_decision(&t, abort, 0, now);
        assert_eq!(taken, commit);
        l.drain(Vec::new());
        assert_eq!(l.p.recorded("t", 7), Some(Ok(true.into())));
        let mut r = l.replica();
        assert_eq!(r.decision(&t), Some(&commit));
        assert_eq!(r.recorded("t", 7), Some(Ok(true.into())));
        assert_eq!(value(&mut r, "a"), Ok(2.into()));
        l.p.forget(&t);
        l.drain(Vec::new());
        assert_eq!(l.replica().decision(&t), None);
    }

    #[test]
    fn a_snapshot_keeps_prepared_transactions_and_decisions() {
        let mut l = Leader::new();
        let (t, u) = (id(1), id(2));
        l.in_txn(&t, call("a", "add", vec![4.into()])).unwrap();
        l.p.prepare(&t, 1, l.now, &mut Vec::new()).unwrap();
        let decision = Decision {
            commit: false,
            message: "no".into(),
            participants: vec![0, 1],
        };
        let now = l.now;
        l.p.record_decision(&u, decision.clone(), 0, now);
        let mut body = l.p.begin_snapshot();
        while let Some((chunk, last)) = l.p.snapshot_chunk(1 << 20) {
            body.extend(chunk);
            if last {
                break;
            }
        }
        let mut r = Partition::new();
        r.enable_storage();
        r.restore_snapshot(&mut &body[..], now).unwrap();
        assert_eq!(r.prepared_txns(), vec![(t.clone(), 1)]);
        assert_eq!(r.decision(&u), Some(&decision));
        r.decide(&t, true, now);
        assert_eq!(value(&mut r, "a"), Ok(4.into()));
    }
}
