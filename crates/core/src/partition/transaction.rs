//! Transactions' workspaces: a transaction's calls run on its own copies of the objects it
//! touches here (forked on first touch, with the version they had), so nothing it does is
//! visible before it commits, and it reads its own writes. Its mutating calls are kept, and
//! its commit applies them again, in order, to the objects themselves, through the same
//! `apply` as single calls: one implementation of each object, and the records replay and
//! replicas see are those of ordinary calls, wrapped in one `commit` record (all or none).
//!
//! Concurrency control: a transaction takes each object it touches for itself (an exclusive
//! lock). A younger transaction wanting an object an older one holds waits for it
//! ([`txn_waits`](super::txn_waits)); an older one takes it from a younger one, which is
//! aborted here (wound-wait, by age: the time its first attempt began; retries keep it, so
//! the oldest always gets through). Single calls never wait for a transaction: they change
//! objects as always, and a transaction whose objects changed since it read them fails its
//! commit ([`Partition::validate`]). Commit is the serialization point: it runs under the
//! shard locks of every partition involved.
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

use super::txn_waits::TxnWaiter;
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
    pub(super) fn older_than(&self, id: &TxnId, other: &Workspace, other_id: &TxnId) -> bool {
        (self.age, id) < (other.age, other_id)
    }
}

fn conflict(message: String) -> Error {
    Error::new(ErrorKind::TransactionConflict, message)
}

impl Partition {
    /// Run one call of transaction `txn` on its workspace here. Returns its reply (the
    /// transaction's own view, which nobody else sees before it commits) with the replies
    /// of the calls it woke; no reply of its own while it waits for an older transaction's
    /// object, or for a prepared transaction's decision (it comes when they end).
    pub fn apply_in(
        &mut self,
        txn: TxnCall<'_>,
        caller: &Caller,
        token: Token,
        seq: u64,
        op: Op,
        now: Instant,
    ) -> Vec<Delivery> {
        let mut out: Vec<Delivery> = self
            .run_in(TxnWaiter::new(txn, caller, token, seq, op), now)
            .into_iter()
            .collect();
        out.extend(self.wake(now));
        out
    }

    /// Run (or run again) one call of a transaction: `None` while it waits.
    pub(super) fn run_in(&mut self, w: TxnWaiter, now: Instant) -> Option<Delivery> {
        // Its fields borrowed apart: `w.op` moves into the step.
        let txn = TxnCall {
            id: &w.id,
            age: w.age,
            first: w.first,
            deadline: w.deadline,
            max_bytes: w.max_bytes,
        };
        // (Not a call handed to the driver of nested calls: the driver runs it again.)
        if let Some((_, reply)) = self
            .txns
            .get(txn.id)
            .and_then(|ws| ws.last_reply.as_ref())
            .filter(|(last, reply)| {
                w.seq != 0 && *last == w.seq && !matches!(reply, Err(e) if e.kind == ErrorKind::NestedCall)
            })
        {
            return Some(Delivery {
                token: w.token,
                reply: reply.clone(),
            });
        }
        let reply = match self.open_workspace(txn, now) {
            Err(e) => Err(e),
            // A client's call of a method that may call other objects goes to the server's
            // driver at once, never after a wait (whoever woke it could not hand it over).
            Ok(()) if self.makes_calls(&w.op) => Err(super::drive_nested(w.op)),
            // A prepared transaction cannot be wounded, and holds its keys only until its
            // decision: wait for it (its workspace open here, so an abort meanwhile ends it).
            Ok(()) if self.prepared_holder(w.op.key()).is_some() => {
                self.wait_in_txn(TxnWaiter { first: false, ..w });
                return None;
            }
            Ok(()) if self.must_wait(txn.id, w.op.key()) => {
                self.wait_for_lock(w);
                return None;
            }
            Ok(()) if self.is_user_op(txn.id, &w.op) => self.user_step(txn, &w.caller, w.token, w.seq, w.op)?,
            Ok(()) => self.txn_step(txn, &w.caller, w.op, now),
        };
        if matches!(&reply, Err(e) if e.kind == ErrorKind::TransactionError) {
            // Nothing it did may commit, even if its code catches the error (its other
            // shards learn it at commit, when this one no longer validates it).
            self.forget_txn(&w.id, "");
        }
        if let (Some(ws), true) = (self.txns.get_mut(&w.id), w.seq != 0) {
            ws.last_reply = Some((w.seq, reply.clone()));
        }
        Some(Delivery { token: w.token, reply })
    }

    /// The reply of transaction `id`'s call `seq`, which the server's driver of nested calls
    /// ran: a resent call gets it (as [`apply_in`](Self::apply_in) keeps each call's).
    pub fn answered_in(&mut self, id: &TxnId, seq: u64, reply: Reply) {
        if let (Some(ws), true) = (self.txns.get_mut(id), seq != 0) {
            ws.last_reply = Some((seq, reply));
        }
    }

    /// Make transaction `txn`'s workspace here on its first call; later calls need it.
    fn open_workspace(&mut self, txn: TxnCall<'_>, now: Instant) -> Result<(), Error> {
        let id = txn.id;
        if txn.deadline <= now {
            self.forget_txn(id, "it ran past its time limit");
            return Err(conflict(format!(
                "transaction {} ran past its time limit and was aborted",
                id.number
            )));
        }
        match self.txns.get(id) {
            Some(_) => Ok(()),
            None if !txn.first => Err(conflict(format!(
                "transaction {} was aborted: an older transaction took an object it held, or it ran past its \
                 time limit",
                id.number
            ))),
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
                Ok(())
            }
        }
    }

    fn txn_step(&mut self, txn: TxnCall<'_>, caller: &Caller, op: Op, now: Instant) -> Reply {
        let id = txn.id;
        let key = op.key().to_string();
        if let Some((new_key, _)) = self.moved.get(&key) {
            return Err(moved(&key, new_key));
        }
        // The copy first: a refused one (too large, no memory) leaves no ownership behind.
        self.fork(id, &key, txn.max_bytes)?;
        self.lock_for(id, &key);
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
                let obj = super::compiled::create_object(&self.codes, type_name, args.clone())?;
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
                ref nested,
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
                if nested.is_none() && obj.makes_calls() {
                    return Err(super::drive_nested(op));
                }
                // Calls that change nothing need not run again at commit (a cache's reads
                // do change it: they move keys in its order of use).
                let mutating = !objects::is_read(type_name, method) || obj.is_mutating(method);
                if mutating {
                    self.objects.memory().check()?;
                }
                // The fork's waiters are copies: whatever they are told goes nowhere.
                let mut scratch = Vec::new();
                let mut ctx = Ctx::new(caller, COMMIT_TOKEN, now, &mut scratch);
                ctx.nested = nested.as_deref().unwrap_or_default();
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
                self.forget_txn(id, "");
                Err(Error::new(ErrorKind::TransactionError, message))
            }
        }
    }

    /// Take `key` for transaction `id`, from a younger holder if need be (an older one
    /// made it wait: [`must_wait`](Self::must_wait)).
    fn lock_for(&mut self, id: &TxnId, key: &str) {
        if let Some(holder) = self.locks.get(key).filter(|h| *h != id).cloned() {
            self.forget_txn(&holder, "an older transaction took an object it held (run it again)");
        }
        self.locks.insert(key.to_string(), id.clone());
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
        self.forget_txn(id, "");
        (keys, ops)
    }

    /// Forget transaction `id` here (an abort): its workspace and its objects go, and its
    /// later calls here get `TransactionConflict`. Returns the replies of the calls this
    /// woke (those that waited for its objects).
    pub fn drop_txn(&mut self, id: &TxnId, now: Instant) -> Vec<Delivery> {
        self.forget_txn(id, "it was aborted");
        self.wake(now)
    }

    /// [`drop_txn`](Self::drop_txn) without running the woken calls yet (the caller's
    /// entry point does, [`wake`](Self::wake)); its waiting call, if any, is answered
    /// with `why`.
    pub(super) fn forget_txn(&mut self, id: &TxnId, why: &str) {
        self.stop_waiting(id, why);
        let Some(ws) = self.txns.remove(id) else { return };
        self.drop_copies(id);
        self.txn_deadlines.remove(&(ws.deadline, id.clone()));
        self.objects.memory().sub(ws.bytes, false);
        for key in ws.forks.keys() {
            if self.locks.get(key) == Some(id) {
                self.locks.remove(key);
                self.lock_released(key);
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
        self.forget_txn(id, "");
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
            let reply = reply.clone();
            self.log(
                Record::Commit {
                    client,
                    seq,
                    records,
                    reply,
                }
                .encode(),
            );
            self.logged_clients.insert(id.client.clone());
        }
        // The calls that waited for its objects run on what it left.
        out.extend(self.wake(now));
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
        reply: Reply,
        now: Instant,
    ) -> Result<(), String> {
        for record in records {
            self.replay(&record, now)?;
        }
        if let Some(client) = client.filter(|_| seq != 0) {
            let client: Arc<str> = Arc::from(client);
            self.record_reply(&client, seq, reply, true);
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
            self.forget_txn(&id, "it ran past its time limit");
        }
    }

    /// A session ended: its transactions go.
    pub(super) fn end_txns(&mut self, client: &str) {
        let ended: Vec<TxnId> = self.txns.keys().filter(|id| &*id.client == client).cloned().collect();
        for id in ended {
            self.forget_txn(&id, "its session ended");
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
            nested: None,
        }
    }

    fn get(key: &str) -> Op {
        Op::Call {
            type_name: "Counter".into(),
            key: key.into(),
            method: "get".into(),
            args: vec![],
            nested: None,
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

    /// Call `op` in transaction `id` of age `age`, its `first` call here or not, as request
    /// `req` of connection `age`: every reply it gave (its own, if it did not wait, and
    /// those of the calls it woke).
    fn send(p: &mut Partition, id: &TxnId, age: u64, first: bool, req: u64, op: Op, now: Instant) -> Vec<Delivery> {
        let txn = TxnCall {
            id,
            age,
            first,
            deadline: now + Duration::from_secs(5),
            max_bytes: 1 << 20,
        };
        p.apply_in(txn, &who(age), Token { conn: age, req }, 0, op, now)
    }

    /// [`send`] of a call that does not wait: its reply.
    fn step(p: &mut Partition, id: &TxnId, age: u64, first: bool, op: Op, now: Instant) -> Reply {
        let mut out = send(p, id, age, first, 1, op, now);
        assert_eq!(out.len(), 1, "one reply: {out:?}");
        out.remove(0).reply
    }

    fn single(p: &mut Partition, op: Op, now: Instant) -> Reply {
        p.apply(&who(2), Token { conn: 2, req: 1 }, 0, 0, op, now)
            .remove(0)
            .reply
    }

    fn token(conn: u64, req: u64) -> Token {
        Token { conn, req }
    }

    #[test]
    fn the_younger_waits_for_the_older_and_the_older_takes_from_a_younger() {
        let now = Instant::now();
        let mut p = Partition::new();
        counter(&mut p, "c", now);
        let (old, young) = (id("a", 1), id("b", 2));
        let idle = p.memory().used();
        assert_eq!(step(&mut p, &old, 10, true, add("c", 1), now), Ok(1.into()));
        // A copy counts in the memory account, until its transaction ends.
        assert!(p.memory().used() > idle);
        // The younger waits: no reply yet.
        assert!(send(&mut p, &young, 20, true, 7, add("c", 5), now).is_empty());
        assert!(p.validate(&old).is_ok());
        // The older commits: the younger's call runs on what it left.
        let out = p.commit(&old, 10, 0, &Ok(true.into()), now);
        assert_eq!(
            out,
            vec![Delivery {
                token: token(20, 7),
                reply: Ok(6.into())
            }]
        );
        p.validate(&young).unwrap();
        p.commit(&young, 20, 0, &Ok(true.into()), now);
        assert_eq!(single(&mut p, get("c"), now), Ok(6.into()));
        // An older one takes an object from a younger, which is aborted here.
        let (younger, oldest) = (id("c", 3), id("d", 4));
        assert_eq!(step(&mut p, &younger, 30, true, add("c", 1), now), Ok(7.into()));
        assert_eq!(step(&mut p, &oldest, 5, true, add("c", 100), now), Ok(106.into()));
        assert_eq!(p.validate(&younger).unwrap_err().kind, ErrorKind::TransactionConflict);
        let later = step(&mut p, &younger, 30, false, get("c"), now).unwrap_err();
        assert_eq!(later.kind, ErrorKind::TransactionConflict);
        p.validate(&oldest).unwrap();
        p.commit(&oldest, 5, 0, &Ok(true.into()), now);
        assert_eq!(single(&mut p, get("c"), now), Ok(106.into()));
        assert_eq!(p.open_txns(), 0);
        assert_eq!(p.memory().used(), idle);
    }

    #[test]
    fn a_waiting_transaction_taken_from_by_an_older_one_is_answered_aborted() {
        let now = Instant::now();
        let mut p = Partition::new();
        counter(&mut p, "a", now);
        counter(&mut p, "b", now);
        let (t10, t20, t5) = (id("x", 1), id("y", 2), id("z", 3));
        step(&mut p, &t10, 10, true, add("a", 1), now).unwrap();
        step(&mut p, &t20, 20, true, add("b", 1), now).unwrap();
        // t20 waits for a (t10 holds it); t5, older than both, takes b from t20, whose
        // waiting call is answered.
        assert!(send(&mut p, &t20, 20, false, 8, add("a", 1), now).is_empty());
        let out = send(&mut p, &t5, 5, true, 1, add("b", 2), now);
        assert_eq!(out.len(), 2, "{out:?}");
        assert_eq!(
            out[0],
            Delivery {
                token: token(5, 1),
                reply: Ok(2.into())
            }
        );
        assert_eq!(out[1].token, token(20, 8));
        assert_eq!(out[1].reply.as_ref().unwrap_err().kind, ErrorKind::TransactionConflict);
        // Nothing of t20 is left to wake when t10 ends.
        assert!(p.drop_txn(&t10, now).is_empty());
        assert_eq!(
            step(&mut p, &t20, 20, false, get("a"), now).unwrap_err().kind,
            ErrorKind::TransactionConflict
        );
    }

    #[test]
    fn waiters_run_oldest_first_when_the_holder_aborts() {
        let now = Instant::now();
        let mut p = Partition::new();
        counter(&mut p, "c", now);
        let (holder, t30, t20) = (id("h", 1), id("y", 2), id("z", 3));
        step(&mut p, &holder, 10, true, add("c", 1), now).unwrap();
        assert!(send(&mut p, &t30, 30, true, 1, add("c", 30), now).is_empty());
        assert!(send(&mut p, &t20, 20, true, 1, add("c", 20), now).is_empty());
        // The holder's abort: the older waiter takes c, the younger waits for it in turn.
        let out = p.drop_txn(&holder, now);
        assert_eq!(
            out,
            vec![Delivery {
                token: token(20, 1),
                reply: Ok(20.into())
            }]
        );
        let out = p.commit(&t20, 20, 0, &Ok(true.into()), now);
        assert_eq!(
            out,
            vec![Delivery {
                token: token(30, 1),
                reply: Ok(50.into())
            }]
        );
    }

    #[test]
    fn a_waiting_call_ends_at_its_deadline_on_withdrawal_or_with_its_connection() {
        let now = Instant::now();
        let mut p = Partition::new();
        counter(&mut p, "c", now);
        let (holder, waiter) = (id("h", 1), id("w", 2));
        let txn = |id| TxnCall {
            id,
            age: 20,
            first: true,
            deadline: now + Duration::from_secs(1),
            max_bytes: 1 << 20,
        };
        step(&mut p, &holder, 10, true, add("c", 1), now).unwrap();
        // Its deadline (earlier than the holder's) is the partition's next one.
        assert!(p
            .apply_in(txn(&waiter), &who(20), token(20, 1), 0, add("c", 1), now)
            .is_empty());
        assert_eq!(p.next_deadline(), Some(now + Duration::from_secs(1)));
        let out = p.tick(now + Duration::from_secs(2));
        assert_eq!(out.len(), 1);
        assert_eq!(out[0].token, token(20, 1));
        assert_eq!(out[0].reply.as_ref().unwrap_err().kind, ErrorKind::TransactionConflict);
        // Withdrawn: answered, and its transaction aborted.
        let waiter = id("w", 3);
        assert!(p
            .apply_in(txn(&waiter), &who(20), token(20, 2), 0, add("c", 1), now)
            .is_empty());
        let out = p.withdraw(token(20, 2), "c", now);
        assert_eq!(out.len(), 1);
        assert_eq!(out[0].reply.as_ref().unwrap_err().kind, ErrorKind::TransactionConflict);
        assert!(p.validate(&waiter).is_err());
        // Its connection closed: dropped unanswered, the transaction still open (a client
        // that reconnects sends the call again), and the holder's end wakes nobody.
        let waiter = id("w", 4);
        assert!(p
            .apply_in(txn(&waiter), &who(20), token(20, 3), 0, add("c", 1), now)
            .is_empty());
        assert!(p.disconnect(20, now).is_empty());
        assert!(p.drop_txn(&holder, now).is_empty());
        assert!(p.validate(&waiter).is_ok());
    }

    #[test]
    fn a_waiting_call_sent_again_on_a_new_connection_is_answered_once() {
        let now = Instant::now();
        let mut p = Partition::new();
        counter(&mut p, "c", now);
        let (holder, waiter) = (id("h", 1), id("w", 2));
        step(&mut p, &holder, 10, true, add("c", 1), now).unwrap();
        let txn = TxnCall {
            id: &waiter,
            age: 20,
            first: true,
            deadline: now + Duration::from_secs(5),
            max_bytes: 1 << 20,
        };
        // Connection 20's call waits; its client reconnects (21) and sends it again before
        // the server sees 20 close.
        assert!(p.apply_in(txn, &who(20), token(20, 1), 3, add("c", 1), now).is_empty());
        assert!(p.apply_in(txn, &who(21), token(21, 1), 3, add("c", 1), now).is_empty());
        assert!(p.disconnect(20, now).is_empty());
        let out = p.drop_txn(&holder, now);
        assert_eq!(
            out,
            vec![Delivery {
                token: token(21, 1),
                reply: Ok(1.into())
            }]
        );
    }

    #[test]
    fn a_waiter_aborted_while_its_key_wakes_is_answered() {
        let now = Instant::now();
        let mut p = Partition::new();
        counter(&mut p, "a", now);
        let (holder, waiter) = (id("h", 1), id("w", 2));
        step(&mut p, &holder, 10, true, add("a", 1), now).unwrap();
        assert!(send(&mut p, &waiter, 20, true, 4, add("a", 1), now).is_empty());
        // Past the waiter's deadline when the holder ends: answered, not run.
        let late = now + Duration::from_secs(6);
        let out = p.drop_txn(&holder, late);
        assert_eq!(out.len(), 1, "{out:?}");
        assert_eq!(out[0].token, token(20, 4));
        assert_eq!(out[0].reply.as_ref().unwrap_err().kind, ErrorKind::TransactionConflict);
        assert_eq!(p.open_txns(), 0);
    }

    /// A leader stepping down (`abandon`, then the partition is replaced) answers every
    /// parked call and every call waiting for a prepared transaction: a transaction's call
    /// waiting for an older one's object must be answered too, or its client waits on a
    /// reply that never comes (the partition that held it is dropped).
    #[test]
    fn a_partition_given_up_answers_a_transactions_call_waiting_for_an_object() {
        let now = Instant::now();
        let mut p = Partition::new();
        counter(&mut p, "c", now);
        let (holder, waiter) = (id("h", 1), id("w", 2));
        step(&mut p, &holder, 10, true, add("c", 1), now).unwrap();
        assert!(send(&mut p, &waiter, 20, true, 7, add("c", 1), now).is_empty());
        let error = Error::new(ErrorKind::NotLeader, "this node no longer leads the shard");
        let out = p.abandon(&error, now);
        assert!(
            out.iter().any(|d| d.token == token(20, 7)),
            "the waiting call is answered: {out:?}"
        );
    }

    /// A call refused with `TransactionError` leaves nothing of its transaction to commit
    /// ("The transaction is aborted even if the code catches the error"), also when it
    /// waited and ran at the holder's commit, whose replies the server does not look into.
    #[test]
    fn a_woken_call_refused_over_the_byte_limit_leaves_nothing_to_commit() {
        let now = Instant::now();
        let mut p = Partition::new();
        let create = Op::Create {
            type_name: "List".into(),
            key: "l".into(),
            args: vec![],
            owned: false,
            persistent: false,
        };
        p.apply(&who(9), Token { conn: 9, req: 1 }, 0, 0, create, now);
        let len = || Op::Call {
            type_name: "List".into(),
            key: "l".into(),
            method: "len".into(),
            args: vec![],
            nested: None,
        };
        let append = Op::Call {
            type_name: "List".into(),
            key: "l".into(),
            method: "append".into(),
            args: vec![Value::from("x".repeat(4000))],
            nested: None,
        };
        let (old, young) = (id("a", 1), id("b", 2));
        assert_eq!(step(&mut p, &old, 10, true, len(), now), Ok(0.into()));
        let txn = TxnCall {
            id: &young,
            age: 20,
            first: true,
            deadline: now + Duration::from_secs(5),
            max_bytes: 2000,
        };
        // It waits for the older one's list.
        assert!(p.apply_in(txn, &who(20), token(20, 1), 1, append, now).is_empty());
        p.validate(&old).unwrap();
        let out = p.commit(&old, 10, 0, &Ok(true.into()), now);
        assert_eq!(out.len(), 1, "{out:?}");
        assert_eq!(out[0].token, token(20, 1));
        assert_eq!(out[0].reply.as_ref().unwrap_err().kind, ErrorKind::TransactionError);
        // The client caught the TransactionError and commits.
        if p.validate(&young).is_ok() {
            p.commit(&young, 20, 0, &Ok(true.into()), now);
            let reply = p
                .apply(&who(2), Token { conn: 2, req: 1 }, 0, 0, len(), now)
                .remove(0)
                .reply;
            assert_eq!(
                reply,
                Ok(0.into()),
                "the call refused with TransactionError was committed"
            );
        }
    }
}
