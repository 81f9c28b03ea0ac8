//! Transactions' workspaces: a transaction's calls run on its own copies of the objects it
//! touches here (forked on first touch, with the version they had), so nothing it does is
//! visible before it commits, and it reads its own writes. Its mutating calls are kept, and
//! its commit applies them again, in order, to the objects themselves, through the same
//! `apply` as single calls: one implementation of each object, and the records replay and
//! replicas see are those of ordinary calls, wrapped in one `commit` record (all or none).
//!
//! Concurrency control: a transaction takes each object it touches for itself (an exclusive
//! lock). A younger transaction wanting an object an older one holds gives up at once
//! (`TransactionConflict`); an older one takes it from a younger one, which is aborted here
//! (wound-die, by age: the time its first attempt began; retries keep it, so the oldest
//! always gets through). Nobody waits, so there is no deadlock. Single calls never wait for
//! a transaction either: they change objects as always, and a transaction whose objects
//! changed since it read them fails its commit ([`Partition::validate`]). Commit is the
//! serialization point: it runs under the shard locks of every partition involved.
//!
//! User-defined objects, whose state lives in object hosts, take part through copies made
//! there, under the same ownership and versions: see [`copies`].

use ahash::HashMap;
use std::sync::Arc;
use std::time::Instant;

use super::{check_type, memory, moved, storage_error, Body, Partition, Storage};
use crate::objects;
use crate::record::{encode_apply, Record, MAX_RECORD_LEN};
use crate::{Caller, Ctx, Delivery, Error, ErrorKind, Object, Reply, Step, Token, Value};

use super::Op;

pub(super) mod copies;

/// A transaction: its session and its number there.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct TxnId {
    pub client: Arc<str>,
    pub number: u64,
}

/// What a partition needs to know of the transaction a call is part of.
#[derive(Clone, Copy, Debug)]
pub struct TxnCall<'a> {
    pub id: &'a TxnId,
    /// When its first attempt began (microseconds): the older wins a conflict.
    pub age: u64,
    /// Its first call in this partition (otherwise a workspace missing here was taken away).
    pub first: bool,
    /// It is aborted here if it has not committed by then.
    pub deadline: Instant,
    /// Bytes its copies of objects may hold here.
    pub max_bytes: usize,
}

/// A transaction's state in one partition.
pub(super) struct Workspace {
    age: u64,
    deadline: Instant,
    /// Its copies of the objects it touched, by key.
    forks: HashMap<String, Fork>,
    /// Its mutating calls, in order, to apply at commit.
    ops: Vec<(Caller, Op)>,
    /// Its last call's seq and reply, for that call resent (a transaction is one thread's:
    /// one call in flight).
    last_reply: Option<(u64, Reply)>,
    /// Bytes its copies hold, counted in the server's memory account like objects.
    bytes: usize,
}

/// A transaction's copy of one object.
struct Fork {
    /// `None`: absent (never there, or deleted by the transaction).
    obj: Option<Box<dyn Object>>,
    /// The version the object had when forked (0: absent): commit needs it unchanged.
    base: u64,
    /// What it is counted for in the memory account.
    bytes: usize,
}

/// The token of calls applied at commit: their replies went out already, from the forks.
pub(super) const COMMIT_TOKEN: Token = Token { conn: 0, req: u64::MAX };

impl Workspace {
    /// Whether `self` (of `id`) is older than `other` (of `other_id`): by age, then by id.
    fn older_than(&self, id: &TxnId, other: &Workspace, other_id: &TxnId) -> bool {
        (self.age, id) < (other.age, other_id)
    }
}

fn conflict(message: String) -> Error {
    Error::new(ErrorKind::TransactionConflict, message)
}

impl Partition {
    /// Run one call of transaction `txn` on its workspace here. Returns its reply: the
    /// transaction's own view, which nobody else sees before it commits.
    pub fn apply_in(
        &mut self,
        txn: TxnCall<'_>,
        caller: &Caller,
        token: Token,
        seq: u64,
        op: Op,
        now: Instant,
    ) -> Delivery {
        let reply = self.txn_step(txn, caller, seq, op, now);
        if let (Some(ws), true) = (self.txns.get_mut(txn.id), seq != 0) {
            ws.last_reply = Some((seq, reply.clone()));
        }
        Delivery { token, reply }
    }

    /// [`apply_in`](Self::apply_in), except that a call on an object a prepared transaction
    /// holds waits for its decision (it cannot be long): `None` then, and its reply comes
    /// with the decision.
    pub fn apply_in_or_wait(
        &mut self,
        txn: TxnCall<'_>,
        caller: &Caller,
        token: Token,
        seq: u64,
        op: Op,
        now: Instant,
    ) -> Option<Delivery> {
        let answered = self
            .txns
            .get(txn.id)
            .is_some_and(|ws| seq != 0 && ws.last_reply.as_ref().is_some_and(|(last, _)| *last == seq));
        if !answered && self.prepared_holder(op.key()).is_some() {
            self.wait_in_txn(txn, caller, token, seq, op);
            return None;
        }
        if self.is_user_op(txn.id, &op) {
            return self.apply_in_user(txn, caller, token, seq, op);
        }
        Some(self.apply_in(txn, caller, token, seq, op, now))
    }

    fn txn_step(&mut self, txn: TxnCall<'_>, caller: &Caller, seq: u64, op: Op, now: Instant) -> Reply {
        if let Some(reply) = self.open_workspace(txn, seq) {
            return reply;
        }
        let id = txn.id;
        let key = op.key().to_string();
        if let Some((new_key, _)) = self.moved.get(&key) {
            return Err(moved(&key, new_key));
        }
        // The copy first: a refused one (too large, no memory) leaves no ownership behind.
        self.fork(id, &key, txn.max_bytes)?;
        self.lock_for(id, &key)?;
        let ws = self.txns.get_mut(id).expect("the workspace was made above");
        let fork = ws.forks.get_mut(&key).expect("forked above");
        match op {
            Op::Create {
                ref type_name,
                ref args,
                owned: _,
                persistent,
                ..
            } => {
                if let Some(obj) = &fork.obj {
                    check_type(&key, obj.type_name(), type_name)?;
                    return Ok(Value::Boolean(false));
                }
                // As `Partition::create` checks: the commit must not meet a refusal.
                if key.is_empty() {
                    return Err(Error::bad_args("an object name must not be empty"));
                }
                if persistent {
                    if objects::TYPES.contains(&type_name.as_str()) && !objects::is_durable(type_name) {
                        return Err(Error::value(format!(
                            "{type_name} is a synchronization object, ephemeral by nature: persistent=True is only \
                             for data objects"
                        )));
                    }
                    if self.storage == Storage::None {
                        return Err(Error::value(
                            "persistent=True needs a server started with a data directory: this server has no \
                             --data-dir",
                        ));
                    }
                }
                self.objects.memory().check()?;
                let obj = objects::create(type_name, args)?;
                let size = obj.size();
                fork.obj = Some(obj);
                ws.ops.push((caller.clone(), op));
                self.resize_fork(id, &key, size, txn.max_bytes)?;
                Ok(Value::Boolean(true))
            }
            Op::Delete { .. } => {
                let existed = fork.obj.take().is_some();
                ws.ops.push((caller.clone(), op));
                self.resize_fork(id, &key, 0, txn.max_bytes)?;
                Ok(Value::Boolean(existed))
            }
            Op::Call {
                ref type_name,
                ref method,
                ref args,
                ..
            } => {
                let Some(obj) = &mut fork.obj else {
                    return Err(Error::new(
                        ErrorKind::NotFound,
                        format!(
                            "{type_name} '{key}' does not exist (it was deleted, or the session that created it ended)"
                        ),
                    ));
                };
                check_type(&key, obj.type_name(), type_name)?;
                // Calls that change nothing need not run again at commit (a cache's reads
                // do change it: they move keys in its order of use).
                let mutating = !objects::is_read(type_name, method) || obj.is_mutating(method);
                if mutating {
                    self.objects.memory().check()?;
                }
                // The fork's waiters are copies: whatever they are told goes nowhere.
                let mut scratch = Vec::new();
                let mut ctx = Ctx::new(caller, COMMIT_TOKEN, now, &mut scratch);
                if let Step::Reply(v) = obj.apply(method, args, &mut ctx)? {
                    if mutating {
                        let size = obj.size();
                        ws.ops.push((caller.clone(), op));
                        self.resize_fork(id, &key, size, txn.max_bytes)?;
                    }
                    return Ok(v);
                }
                let message = format!(
                    "{type_name}.{method}() on '{key}' would wait, and a transaction cannot wait: use its \
                     non-blocking form (blocking=False, timeout=0, get_nowait...); transaction {} was aborted",
                    id.number
                );
                self.drop_txn(id);
                Err(Error::new(ErrorKind::TransactionError, message))
            }
        }
    }

    /// The answer to call `seq` of transaction `txn` here without running it (a resend of
    /// its last call, or a transaction aborted here); otherwise its workspace, opened on
    /// its first call here.
    fn open_workspace(&mut self, txn: TxnCall<'_>, seq: u64) -> Option<Reply> {
        let id = txn.id;
        match self.txns.get(id) {
            Some(ws) => {
                if let Some((_, reply)) = ws.last_reply.as_ref().filter(|(last, _)| seq != 0 && *last == seq) {
                    return Some(reply.clone());
                }
            }
            None if !txn.first => {
                return Some(Err(conflict(format!(
                    "transaction {} was aborted: an older transaction took an object it held, or it ran past its \
                     time limit",
                    id.number
                ))))
            }
            None => {
                let ws = Workspace {
                    age: txn.age,
                    deadline: txn.deadline,
                    forks: HashMap::default(),
                    ops: Vec::new(),
                    last_reply: None,
                    bytes: 0,
                };
                self.txn_deadlines.insert((txn.deadline, id.clone()));
                self.txns.insert(id.clone(), ws);
            }
        }
        None
    }

    /// Take `key` for transaction `id`, from a younger holder if need be (wound-die).
    fn lock_for(&mut self, id: &TxnId, key: &str) -> Result<(), Error> {
        // A prepared transaction cannot be wounded (`apply_in_or_wait` waits for it; this
        // call did not ask to).
        if self.prepared_holder(key).is_some() {
            let number = id.number;
            self.drop_txn(id);
            return Err(conflict(format!(
                "transaction {number} was aborted: '{key}' is held by a transaction being committed (run it again)"
            )));
        }
        let Some(holder) = self.locks.get(key).filter(|h| *h != id).cloned() else {
            if !self.locks.contains_key(key) {
                self.locks.insert(key.to_string(), id.clone());
            }
            return Ok(());
        };
        let Some(them) = self.txns.get(&holder) else {
            // Its workspace went without its locks (cannot happen; never a panic over it).
            self.locks.insert(key.to_string(), id.clone());
            return Ok(());
        };
        if them.older_than(&holder, &self.txns[id], id) {
            let number = id.number;
            self.drop_txn(id);
            return Err(conflict(format!(
                "transaction {number} was aborted: '{key}' is held by an older transaction (run it again)"
            )));
        }
        self.drop_txn(&holder);
        self.locks.insert(key.to_string(), id.clone());
        Ok(())
    }

    /// Give transaction `id` its copy of `key` unless it has one. A copy counts in the
    /// server's memory account (refused over `--max-memory`) and in the transaction's
    /// `max_bytes` here.
    fn fork(&mut self, id: &TxnId, key: &str, max_bytes: usize) -> Result<(), Error> {
        if self.txns[id].forks.contains_key(key) {
            return Ok(());
        }
        let obj = match self.objects.get(key).map(|e| &e.body) {
            Some(Body::Builtin(obj)) => {
                let size = obj.size();
                let held = self.txns[id].bytes;
                if held + size > max_bytes {
                    return Err(Error::new(
                        ErrorKind::TransactionError,
                        format!(
                            "transaction {} would hold {} bytes of copies of objects in this shard with '{key}', \
                             more than --max-transaction-bytes ({max_bytes}), and was aborted: make it in smaller transactions",
                            id.number,
                            held + size
                        ),
                    ));
                }
                self.objects.memory().check()?;
                Some(obj.fork())
            }
            // Calls on user-defined objects go to `copies` (`is_user_op`): not a built-in's.
            Some(Body::User(u)) => return Err(user_object_here(&u.type_name, key)),
            None => None,
        };
        let size = obj.as_ref().map_or(0, |o| o.size());
        let base = self.objects.version(key);
        let ws = self.txns.get_mut(id).expect("the workspace exists");
        ws.forks.insert(key.to_string(), Fork { obj, base, bytes: 0 });
        self.resize_fork(id, key, size, max_bytes)
    }

    /// The copy of `key` of transaction `id` now holds `size` bytes: refused (the caller
    /// drops the transaction) when its copies here pass `max_bytes`.
    fn resize_fork(&mut self, id: &TxnId, key: &str, size: usize, max_bytes: usize) -> Result<(), Error> {
        let memory = self.objects.memory().clone();
        let Some(ws) = self.txns.get_mut(id) else { return Ok(()) };
        let Some(fork) = ws.forks.get_mut(key) else {
            return Ok(());
        };
        let size = memory::object_size(key, size);
        memory.add(size, false);
        memory.sub(fork.bytes, false);
        ws.bytes = ws.bytes + size - fork.bytes;
        fork.bytes = size;
        if ws.bytes > max_bytes {
            return Err(Error::new(
                ErrorKind::TransactionError,
                format!(
                    "transaction {} would hold {} bytes of copies of objects in this shard with '{key}', more than \
                     --max-transaction-bytes ({max_bytes}), and was aborted: make it in smaller transactions",
                    id.number, ws.bytes
                ),
            ));
        }
        Ok(())
    }

    /// Take transaction `id`'s workspace away (it is being prepared): the keys it touched
    /// and its mutating calls. Its locks and its copies' memory go.
    pub(super) fn take_workspace(&mut self, id: &TxnId) -> (Vec<String>, Vec<(Caller, Op)>) {
        let Some(ws) = self.txns.get_mut(id) else {
            return (Vec::new(), Vec::new());
        };
        let ops = std::mem::take(&mut ws.ops);
        let mut keys: Vec<String> = ws.forks.keys().cloned().collect();
        keys.sort_unstable();
        self.drop_txn(id);
        (keys, ops)
    }

    /// Forget transaction `id` here: its workspace and its objects go (an abort, or a
    /// transaction wounded or expired). Its later calls here get `TransactionConflict`.
    pub fn drop_txn(&mut self, id: &TxnId) {
        let Some(ws) = self.txns.remove(id) else { return };
        self.drop_copies(id);
        self.txn_deadlines.remove(&(ws.deadline, id.clone()));
        self.objects.memory().sub(ws.bytes, false);
        for key in ws.forks.keys() {
            if self.locks.get(key) == Some(id) {
                self.locks.remove(key);
            }
        }
    }

    /// Whether transaction `id` may commit here: it is still open, and every object it
    /// touched is as it found it; nothing that applying its calls needs is missing. Returns
    /// about how many bytes its commit record here takes (the parts of a commit over several
    /// partitions share one record).
    pub fn validate(&self, id: &TxnId) -> Result<usize, Error> {
        let Some(ws) = self.txns.get(id) else {
            return Err(conflict(format!(
                "transaction {} was aborted: an older transaction took an object it held, or it ran past its time \
                 limit",
                id.number
            )));
        };
        for (key, fork) in &ws.forks {
            if self.objects.version(key) != fork.base {
                return Err(conflict(format!(
                    "transaction {} was aborted: '{key}' changed after the transaction read it (run it again)",
                    id.number
                )));
            }
        }
        let mut bytes = self.check_copies(id)?;
        for (caller, op) in &ws.ops {
            let persistent = match op {
                Op::Create { persistent, .. } => *persistent,
                op => self.is_persistent(op.key()),
            };
            if !persistent {
                continue;
            }
            if let Storage::Failed(why) = &self.storage {
                return Err(storage_error(why));
            }
            bytes += encode_apply(caller, COMMIT_TOKEN, 0, 0, op).len() + 5;
        }
        if bytes > MAX_RECORD_LEN {
            return Err(Error::new(
                ErrorKind::TransactionError,
                format!(
                    "transaction {} would write a commit record of {bytes} bytes here, more than the \
                     {MAX_RECORD_LEN} a record may hold: make it in smaller transactions",
                    id.number
                ),
            ));
        }
        Ok(bytes)
    }

    /// Apply transaction `id`'s calls to the objects (after [`validate`](Self::validate)
    /// passed here, under the same lock), for the committing connection `conn`. Their records
    /// become one `commit` record, which also records `reply` for `client`/`seq` when
    /// `seq` is not 0 (the partition that answers a retried commit). Returns the replies of
    /// calls its changes woke.
    pub fn commit(&mut self, id: &TxnId, conn: u64, seq: u64, reply: &Reply, now: Instant) -> Vec<Delivery> {
        // No workspace: the partition that records the reply of a transaction that touched
        // nothing here.
        let ops = self
            .txns
            .get_mut(id)
            .map(|ws| std::mem::take(&mut ws.ops))
            .unwrap_or_default();
        let copies = self.take_copies(id);
        self.drop_txn(id);
        let before = self.records.len();
        let mut out = Vec::new();
        self.committing = true;
        for (caller, op) in ops {
            // Held locks belong to the connection that commits (the one that made the call
            // may be gone).
            let caller = Caller { conn, ..caller };
            out.extend(self.apply_as(&caller, COMMIT_TOKEN, 0, 0, op, now, None));
        }
        self.adopt_copies(copies);
        self.committing = false;
        // The calls ran on the copies first, with the same checks: none fails now.
        debug_assert!(
            out.iter().all(|d| d.token != COMMIT_TOKEN || d.reply.is_ok()),
            "a committed call failed"
        );
        out.retain(|d| d.token != COMMIT_TOKEN);
        let durable = self.storage != Storage::None;
        if seq != 0 {
            self.record_reply(&id.client, seq, reply.clone(), durable);
        }
        if self.records.len() > before || (seq != 0 && durable) {
            let records = self.records.split_off(before);
            let client = (seq != 0).then(|| id.client.to_string());
            self.log(Record::Commit { client, seq, records }.encode());
            self.logged_clients.insert(id.client.clone());
        }
        out
    }

    /// The reply recorded for `client`'s call `seq` here, if any (a retried commit's).
    pub fn recorded(&self, client: &str, seq: u64) -> Option<Reply> {
        self.logs
            .get(client)
            .and_then(|log| log.get(seq))
            .map(|(reply, _)| reply)
    }

    /// Replay of a `commit` record: its calls, then its reply.
    pub(super) fn replay_commit(
        &mut self,
        client: Option<String>,
        seq: u64,
        records: Vec<Vec<u8>>,
        now: Instant,
    ) -> Result<(), String> {
        for record in records {
            self.replay(&record, now)?;
        }
        if let Some(client) = client.filter(|_| seq != 0) {
            let client: Arc<str> = Arc::from(client);
            self.record_reply(&client, seq, Ok(Value::Boolean(true)), true);
            self.logged_clients.insert(client);
        }
        Ok(())
    }

    /// Transactions open here.
    pub fn open_txns(&self) -> usize {
        self.txns.len()
    }

    /// The earliest time an open transaction here expires.
    pub(super) fn next_txn_deadline(&self) -> Option<Instant> {
        self.txn_deadlines.first().map(|(at, _)| *at)
    }

    /// Drop the transactions past their deadline.
    pub(super) fn expire_txns(&mut self, now: Instant) {
        while let Some((at, id)) = self.txn_deadlines.first().cloned() {
            if at > now {
                break;
            }
            self.drop_txn(&id);
        }
    }

    /// A session ended: its transactions go.
    pub(super) fn end_txns(&mut self, client: &str) {
        let ended: Vec<TxnId> = self.txns.keys().filter(|id| &*id.client == client).cloned().collect();
        for id in ended {
            self.drop_txn(&id);
        }
    }
}

fn user_object_here(type_name: &str, key: &str) -> Error {
    Error::new(ErrorKind::TypeMismatch, format!("'{key}' is a {type_name}"))
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::objects::testing::who;

    fn id(client: &str, number: u64) -> TxnId {
        TxnId {
            client: Arc::from(client),
            number,
        }
    }

    fn add(key: &str, n: i64) -> Op {
        Op::Call {
            type_name: "Counter".into(),
            key: key.into(),
            method: "add".into(),
            args: vec![n.into()],
        }
    }

    fn get(key: &str) -> Op {
        Op::Call {
            type_name: "Counter".into(),
            key: key.into(),
            method: "get".into(),
            args: vec![],
        }
    }

    fn counter(p: &mut Partition, key: &str, now: Instant) {
        let create = Op::Create {
            type_name: "Counter".into(),
            key: key.into(),
            args: vec![],
            owned: false,
            persistent: false,
        };
        p.apply(&who(9), Token { conn: 9, req: 1 }, 0, 0, create, now);
    }

    /// Call `op` in transaction `id` of age `age`, its `first` call here or not.
    fn step(p: &mut Partition, id: &TxnId, age: u64, first: bool, op: Op, now: Instant) -> Reply {
        let txn = TxnCall {
            id,
            age,
            first,
            deadline: now + Duration::from_secs(5),
            max_bytes: 1 << 20,
        };
        p.apply_in(txn, &who(1), Token { conn: 1, req: 1 }, 0, op, now).reply
    }

    fn single(p: &mut Partition, op: Op, now: Instant) -> Reply {
        p.apply(&who(2), Token { conn: 2, req: 1 }, 0, 0, op, now)
            .remove(0)
            .reply
    }

    #[test]
    fn the_younger_gives_way_and_the_older_takes_from_a_younger() {
        let now = Instant::now();
        let mut p = Partition::new();
        counter(&mut p, "c", now);
        let (old, young) = (id("a", 1), id("b", 2));
        let idle = p.memory().used();
        assert_eq!(step(&mut p, &old, 10, true, add("c", 1), now), Ok(1.into()));
        // A copy counts in the memory account, until its transaction ends.
        assert!(p.memory().used() > idle);
        let refused = step(&mut p, &young, 20, true, add("c", 5), now).unwrap_err();
        assert_eq!(refused.kind, ErrorKind::TransactionConflict);
        assert!(p.validate(&old).is_ok());
        assert!(p.validate(&young).is_err());
        // An even older one takes the object, and the one it took it from is aborted.
        let oldest = id("c", 3);
        assert_eq!(step(&mut p, &oldest, 5, true, add("c", 100), now), Ok(100.into()));
        assert_eq!(p.validate(&old).unwrap_err().kind, ErrorKind::TransactionConflict);
        let later = step(&mut p, &old, 10, false, get("c"), now).unwrap_err();
        assert_eq!(later.kind, ErrorKind::TransactionConflict);
        p.validate(&oldest).unwrap();
        p.commit(&oldest, 1, 0, &Ok(true.into()), now);
        assert_eq!(single(&mut p, get("c"), now), Ok(100.into()));
        assert_eq!(p.open_txns(), 0);
        assert_eq!(p.memory().used(), idle);
    }
}
