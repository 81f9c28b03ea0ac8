//! One partition of the object space: its objects, parked-call timers, and the reply log
//! that makes retried calls exactly-once. A pure state machine: every entry point takes the
//! current time and returns the replies to send.
//!
//! This file holds the object map and [`Partition::apply`], which refuses what must not run
//! and dispatches the rest to create, call or delete. Each other concern has its own file:
//! `reply_log` (exactly-once replies), `admission` (room under `--max-memory`),
//! `durability` (the op log and its replay), `waiting` (parked calls and what ends them),
//! `users` (user-defined objects in hosts), `moves` (`keep`, export, abandoning a shard),
//! `transaction`, `snapshot`, `memory` and `object_map`.

use ahash::{HashMap, HashSet};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Instant;

use crate::objects::compiled::Library;
use crate::objects::user::{self, Forward, UserObject, UserState};
use crate::{objects, Caller, ConnId, Ctx, Delivery, Error, ErrorKind, Object, Reply, Step, Token, Value};

mod admission;
mod compiled;
mod durability;
mod memory;
mod moves;
mod object_map;
mod prepared;
mod reply_log;
mod snapshot;
mod transaction;
mod txn_waits;
mod users;
mod waiting;

pub use crate::op::Op;
pub use memory::{Charge, Memory};
pub use moves::Detached;
pub use prepared::Decision;
pub use reply_log::{DEFAULT_REPLY_LOGS_BYTES, DEFAULT_REPLY_LOG_BYTES};
pub use transaction::{TxnCall, TxnId};
pub use users::StoredUser;

use durability::{storage_error, Storage};
use moves::moved;
use reply_log::{ReplyLog, ReplyLogLimit};
use users::{forward_call, uncount};
use waiting::system_caller;

/// An object's key and the session it goes with (`None`: named or kept).
pub type KeyAndOwner = (String, Option<Arc<str>>);

/// Prefix of the keys of unnamed objects; names given by users never start with it.
pub const UNNAMED_PREFIX: char = '~';

struct Entry {
    body: Body,
    /// The session an unnamed object lives and dies with; `None` for named or kept objects.
    owner: Option<Arc<str>>,
    /// Its changes are logged and it is recovered after a restart.
    persistent: bool,
    /// The partition's snapshot epoch when it was made or last captured: a snapshot in
    /// progress still needs it while this is older than the snapshot's epoch.
    epoch: u64,
}

enum Body {
    Builtin(Box<dyn Object>),
    /// Boxed: most objects are built-in, and a small entry keeps a million objects small.
    User(Box<UserObject>),
}

impl Entry {
    /// The object's size as counted for `--max-memory` (a user-defined object's state lives
    /// in its host, bounded by `--host-memory-limit`).
    fn size(&self) -> usize {
        match &self.body {
            Body::Builtin(obj) => obj.size(),
            Body::User(_) => 0,
        }
    }

    /// Whether the object is a cache, which may evict (see [`Partition::make_room`]).
    fn is_cache(&self) -> bool {
        matches!(&self.body, Body::Builtin(obj) if obj.is_cache())
    }
}

impl Body {
    fn type_name(&self) -> &str {
        match self {
            Body::Builtin(obj) => obj.type_name(),
            Body::User(u) => &u.type_name,
        }
    }

    fn builtin(&mut self) -> Option<&mut Box<dyn Object>> {
        match self {
            Body::Builtin(obj) => Some(obj),
            Body::User(_) => None,
        }
    }
}

#[derive(Default)]
pub struct Partition {
    objects: object_map::ObjectMap,
    /// Keys that `keep` moved away, with their new key and the session that owned them.
    moved: HashMap<String, (String, Option<Arc<str>>)>,
    /// Deadlines of parked calls, earliest first. A timer goes as soon as its call is
    /// answered, so long timeouts on calls answered early do not pile up.
    timers: BTreeMap<(Instant, u64), (String, Token)>,
    timer_of: HashMap<Token, (Instant, u64)>,
    timer_seq: u64,
    /// Parked mutating calls whose eventual reply must be recorded.
    parked_seqs: HashMap<Token, (Arc<str>, u64)>,
    logs: HashMap<Arc<str>, ReplyLog>,
    /// The bytes of all the logs together.
    logs_bytes: usize,
    /// Bytes of replies a client's log may hold, and all of them together.
    reply_log_limit: ReplyLogLimit,
    /// Keys of connection-tracking objects each connection has used (for disconnect clean-up).
    conn_keys: HashMap<ConnId, HashSet<String>>,
    /// Requests for object hosts, in the order applied, until the server takes them.
    forwards: Vec<Forward>,
    /// Calls (and creates) of user-defined objects waiting for their host. They outlive
    /// their connection: the host runs them anyway, so a retry must find their reply.
    hosted: HashSet<Token>,
    /// User-defined objects by `(type, version)`, for `define` (one version at a time).
    versions: HashMap<(String, String), usize>,
    /// Code of the user-defined classes whose `class` record this partition logged (or
    /// replayed), by `(type, version)`: restoring a stored object needs it, and so will a
    /// partition snapshot.
    classes: HashMap<(String, String), Arc<Vec<u8>>>,
    /// Code offered by persistent creates ([`offer_class`](Self::offer_class)), logged
    /// with the first state of its version.
    unlogged_classes: HashMap<(String, String), Arc<Vec<u8>>>,
    next_object_id: u64,
    storage: Storage,
    /// Op-log records produced since the server last took them, in order.
    records: Vec<Vec<u8>>,
    /// A call reached a persistent object since the last take: its replies wait for the
    /// records before them to be durable, even if it wrote none (no reply reveals a state
    /// that a crash could still take back).
    touched_persistent: bool,
    /// Connections and sessions named in logged records: their end is logged too, since it
    /// drops their parked calls (and a session's unnamed objects and replies).
    logged_conns: BTreeSet<ConnId>,
    logged_clients: HashSet<Arc<str>>,
    highest_logged_conn: ConnId,
    /// The op-log records of logged calls parked on persistent objects, with their park
    /// order: a snapshot carries them, and its restore applies them again.
    parked_records: HashMap<Token, (u64, Vec<u8>)>,
    parked_order: u64,
    /// Calls of persistent user-defined objects whose reply is in a logged `user_state`
    /// record (recorded as durable when they settle).
    logged_hosted: HashSet<Token>,
    /// Bumped by every snapshot; see [`Entry::epoch`].
    snapshot_epoch: u64,
    /// The snapshot being captured, if any (see [`snapshot`]).
    capture: Option<snapshot::Capture>,
    /// Open transactions' workspaces (see [`transaction`]).
    txns: HashMap<TxnId, transaction::Workspace>,
    /// The user-defined objects transactions hold, and their copies in hosts
    /// (see `transaction::copies`).
    txn_copies: transaction::copies::Copies,
    /// The transaction holding each key a transaction touched.
    locks: HashMap<String, TxnId>,
    /// When each open transaction expires, earliest first.
    txn_deadlines: BTreeSet<(Instant, TxnId)>,
    /// Transactions' calls waiting for objects older transactions hold (see [`txn_waits`]).
    lock_waits: txn_waits::LockWaits,
    /// A transaction's calls are being applied at its commit (accepted already).
    committing: bool,
    /// The call being applied may only read, else fails with this refusal
    /// ([`apply_reading`](Self::apply_reading)).
    reading: Option<Error>,
    /// Cluster transactions prepared here, and decisions kept (see [`prepared`]).
    two_phase: prepared::TwoPhase,
    /// Compiles the code of compiled types (see [`compiled`]).
    library: Option<Arc<dyn Library>>,
    /// The compiled code of each `(type, version)` of compiled type seen here.
    codes: compiled::Codes,
}

impl Partition {
    pub fn new() -> Self {
        Self::default()
    }

    /// Number of objects held.
    pub fn len(&self) -> usize {
        self.objects.len()
    }

    /// Number of persistent objects held.
    pub fn persistent_len(&self) -> usize {
        self.objects.values().filter(|e| e.persistent).count()
    }

    pub fn is_empty(&self) -> bool {
        self.objects.is_empty()
    }

    /// Count this partition's objects in `memory` (shared by a server's partitions), and
    /// refuse calls that may grow an object while it is over its limit.
    pub fn set_memory(&mut self, memory: Memory) {
        self.objects.set_memory(memory);
    }

    /// The account this partition's objects are counted in.
    pub fn memory(&self) -> &Memory {
        self.objects.memory()
    }

    /// Named objects whose name starts with `prefix` (only persistent ones if
    /// `persistent_only`), as `(name, type)`.
    pub fn objects(&self, prefix: &str, persistent_only: bool) -> Vec<(String, String)> {
        self.listing(prefix, persistent_only, false)
            .into_iter()
            .map(|(name, type_name, _)| (name, type_name))
            .collect()
    }

    /// As [`objects`](Self::objects), unnamed ones too when `unnamed`, with each object's
    /// size as `--max-memory` counts it: `(key, type, bytes)`.
    pub fn listing(&self, prefix: &str, persistent_only: bool, unnamed: bool) -> Vec<(String, String, usize)> {
        self.objects
            .iter()
            .filter(|(k, e)| {
                (unnamed || !k.starts_with(UNNAMED_PREFIX))
                    && k.starts_with(prefix)
                    && (e.persistent || !persistent_only)
            })
            .map(|(k, e)| (k.to_string(), e.body.type_name().to_string(), e.size()))
            .collect()
    }

    /// The type of the object under `key`, if any: how a front end that addresses objects
    /// by name alone (HTTP) finds the reference `(type, key)` to call.
    pub fn type_of(&self, key: &str) -> Option<&str> {
        self.objects.get(key).map(|e| e.body.type_name())
    }

    /// Whether `op` is a call, made by a client, of an object whose methods may call other
    /// objects (see [`Object::makes_calls`]).
    pub(super) fn makes_calls(&self, op: &Op) -> bool {
        match op {
            Op::Call { key, nested: None, .. } => {
                matches!(self.objects.get(key).map(|e| &e.body), Some(Body::Builtin(obj)) if obj.makes_calls())
            }
            _ => false,
        }
    }

    /// Whether a live object is under `key`: one that a `create` attaches to, not one that
    /// a `create` would make again (a user-defined object lost with its host).
    pub fn is_live(&self, key: &str) -> bool {
        match self.objects.get(key).map(|e| &e.body) {
            Some(Body::User(u)) => !matches!(u.state, UserState::Lost(_)),
            Some(Body::Builtin(_)) => true,
            None => false,
        }
    }

    /// Apply one call. `seq` is the caller's sequence number (0: do not deduplicate), and
    /// `acked` the seq below which the caller holds all its replies (0: no word on them),
    /// which are forgotten here; a later live call below it is refused as a stale copy.
    /// Returns the caller's reply (unless the call parked) and any woken waiters' replies.
    pub fn apply(
        &mut self,
        caller: &Caller,
        token: Token,
        seq: u64,
        acked: u64,
        op: Op,
        now: Instant,
    ) -> Vec<Delivery> {
        self.apply_as(caller, token, seq, acked, op, now, None)
    }

    /// [`apply`](Self::apply) for a caller who may only read the object: a call that would
    /// change it fails with `refusal` and changes nothing. Only a compiled object's methods
    /// are tried (whether one writes is known once it ran); a built-in's that write, and a
    /// user-defined object's, are refused at once. Nothing is logged or recorded: a read.
    pub fn apply_reading(
        &mut self,
        caller: &Caller,
        token: Token,
        seq: u64,
        op: Op,
        now: Instant,
        refusal: Error,
    ) -> Vec<Delivery> {
        if !matches!(op, Op::Call { .. }) {
            return vec![Delivery {
                token,
                reply: Err(refusal),
            }];
        }
        if self.prepared_holder(op.key()).is_some() {
            // A call there would wait for the transaction's decision and run later as a write.
            let busy = Error::new(
                ErrorKind::Busy,
                format!("'{}' is being committed by a transaction: try again", op.key()),
            );
            return vec![Delivery {
                token,
                reply: Err(busy),
            }];
        }
        self.reading = Some(refusal);
        let out = self.apply_as(caller, token, seq, 0, op, now, None);
        self.reading = None;
        out
    }

    /// [`apply`](Self::apply), with the call's record when it is `replayed` from one (not
    /// encoded again; the replay drops the log it leaves, so it is copied only if the call
    /// parks).
    #[allow(clippy::too_many_arguments)] // `apply`'s, and the record
    fn apply_as(
        &mut self,
        caller: &Caller,
        token: Token,
        seq: u64,
        acked: u64,
        op: Op,
        now: Instant,
        replayed: Option<&[u8]>,
    ) -> Vec<Delivery> {
        let mut out = Vec::new();
        if seq != 0 && acked > 1 {
            // Never the call's own reply: a client acknowledging it is mistaken.
            self.acknowledge(&caller.client, acked.min(seq));
        }
        // Only live calls: a logged one was accepted where it ran, and a replica (whose mark
        // may be higher, from a leader's snapshot) must apply it the same.
        if seq != 0 && replayed.is_none() {
            if let Err(e) = self.check_fresh(&caller.client, seq) {
                out.push(Delivery { token, reply: Err(e) });
                return out;
            }
        }
        let persistent = self.touch(&op);
        if seq != 0 {
            if let Some(reply) = self.recorded_reply(&caller.client, seq, persistent) {
                out.push(Delivery { token, reply });
                return out;
            }
            if !matches!(op, Op::Delete { .. }) && self.take_over(&caller.client, token, seq, op.key()) {
                return out;
            }
        }
        // A method that may call other objects runs here until its first call, if it makes
        // one: then it is handed to the server's driver of nested calls, which runs it in a
        // transaction (`handover` keeps the call for that). One that would wait for a
        // prepared transaction goes at once (whoever woke it could not hand it over). A
        // reader's call runs as far as its first call, which a reader may not make.
        let handover = match replayed.is_none() && !self.committing && self.reading.is_none() && self.makes_calls(&op) {
            true if self.prepared_holder(op.key()).is_some() => {
                out.push(Delivery {
                    token,
                    reply: Err(drive_nested(op)),
                });
                return out;
            }
            true => Some(op.clone()),
            false => None,
        };
        // A call on a key a prepared transaction holds waits for its decision.
        let op = match replayed.is_none() && !self.committing {
            true => match self.wait_if_prepared(caller, token, seq, acked, op) {
                Some(op) => op,
                None => return out,
            },
            false => op,
        };
        // A replayed call was accepted where it ran, and a transaction's at its commit; a
        // read grows nothing.
        if replayed.is_none() && !self.committing && self.reading.is_none() {
            if let Err(e) = self.check_room(&op) {
                out.push(Delivery { token, reply: Err(e) });
                return out;
            }
        }
        // Refusals from here on are recorded: a retry gets the same.
        let logged = match self.check_write(&op, persistent) {
            Ok(logged) => logged,
            Err(e) => {
                self.reply(caller, token, seq, true, false, Err(e), &mut out);
                return out;
            }
        };
        let logged_at = self.records.len();
        if logged {
            if let Err(e) = self.log_call(caller, token, seq, acked, &op, replayed) {
                self.reply(caller, token, seq, true, false, Err(e), &mut out);
                return out;
            }
        }
        let (reply, record) = match op {
            Op::Create {
                type_name,
                key,
                args,
                owned,
                persistent,
            } => (
                self.create(caller, token, type_name, key, args, owned, persistent),
                true,
            ),
            Op::Delete { key } => (Ok(Some(Value::Boolean(self.delete(&key, now, &mut out)))), true),
            Op::Call {
                type_name,
                key,
                method,
                args,
                nested,
            } => {
                let nested = nested.as_deref().unwrap_or_default();
                self.call(caller, token, (&type_name, &key, &method), args, nested, now, &mut out)
            }
        };
        if let (Err(e), Some(op)) = (&reply, handover) {
            if e.kind == ErrorKind::NestedCall {
                // It made a call: nothing of this run stays (its state was not changed).
                self.records.truncate(logged_at);
                out.push(Delivery {
                    token,
                    reply: Err(drive_nested(op)),
                });
                self.settle(&out);
                return out;
            }
        }
        match reply {
            Ok(None) => {
                if record && seq != 0 {
                    self.parked_seqs.insert(token, (caller.client.clone(), seq));
                }
                if logged {
                    self.keep_parked_record(token, logged_at, replayed);
                }
            }
            Ok(Some(v)) => self.reply(caller, token, seq, record, logged, Ok(v), &mut out),
            Err(e) => self.reply(caller, token, seq, record, logged, Err(e), &mut out),
        }
        self.settle(&out);
        out
    }

    #[allow(clippy::too_many_arguments)]
    fn create(
        &mut self,
        caller: &Caller,
        token: Token,
        type_name: String,
        key: String,
        args: Vec<Value>,
        owned: bool,
        persistent: bool,
    ) -> Result<Option<Value>, Error> {
        if key.is_empty() {
            return Err(Error::bad_args("an object name must not be empty"));
        }
        let (args, user_args) = match user::is_user_type(&type_name) {
            true => {
                user::check_type_name(&type_name)?;
                (Vec::new(), Some(user::parse_create_args(&type_name, args)?))
            }
            false => (args, None),
        };
        if let Some(e) = self.objects.get(&key) {
            check_type(&key, e.body.type_name(), &type_name)?;
            match (&e.body, &user_args) {
                // A lost object's key gets a fresh instance, of whatever version is defined now.
                (Body::User(u), Some(_)) if matches!(u.state, UserState::Lost(_)) => {}
                (Body::User(u), Some((version, ..))) if u.version != *version => {
                    return Err(Error::new(
                        ErrorKind::TypeMismatch,
                        format!(
                            "'{key}' is a {type_name} of version {}, not of version {version}",
                            u.version
                        ),
                    ));
                }
                _ => return Ok(Some(Value::Boolean(false))),
            }
        } else if let Some((new_key, _)) = self.moved.get(&key) {
            return Err(moved(&key, new_key));
        }
        let owner = owned.then(|| caller.client.clone());
        let Some(user_args) = user_args else {
            let obj = compiled::create_object(&self.codes, &type_name, args)?;
            self.objects.insert(
                key,
                Entry {
                    body: Body::Builtin(obj),
                    owner,
                    persistent,
                    epoch: self.snapshot_epoch,
                },
            );
            return Ok(Some(Value::Boolean(true)));
        };
        self.construct(token, type_name, key, user_args, owner, persistent);
        // Answered when the constructor returns (`complete`).
        Ok(None)
    }

    /// Take an object out of the map, keeping the version counts right.
    fn remove(&mut self, key: &str) -> Option<Entry> {
        self.preserve(key);
        let e = self.objects.remove(key)?;
        if let Body::User(u) = &e.body {
            if !matches!(u.state, UserState::Lost(_)) {
                uncount(&mut self.versions, u);
            }
        }
        Some(e)
    }

    #[allow(clippy::too_many_arguments)]
    fn call(
        &mut self,
        caller: &Caller,
        token: Token,
        (type_name, key, method): (&str, &str, &str),
        args: Vec<Value>,
        nested: &[Reply],
        now: Instant,
        out: &mut Vec<Delivery>,
    ) -> (Result<Option<Value>, Error>, bool) {
        let Some((entry, counted, meter)) = self.objects.get_metered(key) else {
            let err = match self.moved.get(key) {
                Some((new_key, _)) => moved(key, new_key),
                None => Error::new(
                    ErrorKind::NotFound,
                    format!(
                        "{type_name} '{key}' does not exist (it was deleted, or the session that created it ended)"
                    ),
                ),
            };
            return (Err(err), false);
        };
        if let Err(e) = check_type(key, entry.body.type_name(), type_name) {
            return (Err(e), false);
        }
        if let Some(refusal) = &self.reading {
            let tried = match &entry.body {
                Body::Builtin(_) => {
                    objects::compiled::is_compiled_type(type_name) || objects::is_read(type_name, method)
                }
                Body::User(_) => false,
            };
            if !tried {
                return (Err(refusal.clone()), false);
            }
        }
        let obj = match &mut entry.body {
            Body::Builtin(obj) => obj,
            Body::User(u) => {
                let ids = &mut self.next_object_id;
                let forwarded = forward_call(u, token, key, method, args, ids, &mut self.forwards);
                if forwarded.is_ok() {
                    self.hosted.insert(token);
                    // It may change the object: a transaction that read it must not commit.
                    meter.changed(counted, memory::object_size(key, 0));
                }
                // Every method may change the object: its reply is recorded.
                return (forwarded.map(|()| None), true);
            }
        };
        let reading = self.reading.as_ref();
        let record = obj.is_mutating(method) && reading.is_none();
        let mut ctx = Ctx::new(caller, token, now, out);
        ctx.read_only = reading.is_some();
        ctx.nested = nested;
        let step = obj.apply(method, &args, &mut ctx);
        // Calls that are not recorded may change the object too (a lock's `acquire`, and a
        // parked call: its waiters).
        let read = reading.is_some() || objects::is_read(type_name, method);
        if record || !read || matches!(step, Ok(Step::Park { .. })) {
            meter.changed(counted, memory::object_size(key, obj.size()));
        }
        let step = match (step, reading) {
            (Err(e), Some(refusal)) if e.kind == ErrorKind::PermissionDenied => {
                Err(Error::new(e.kind, format!("{} ({})", refusal.message, e.message)))
            }
            (Err(e), Some(refusal)) if e.kind == ErrorKind::NestedCall => Err(Error::new(
                refusal.kind,
                format!("{} ({type_name}.{method} calls other objects)", refusal.message),
            )),
            (step, _) => step,
        };
        if obj.tracks_connections() {
            self.conn_keys.entry(caller.conn).or_default().insert(key.to_string());
        }
        match step {
            Ok(Step::Reply(v)) => (Ok(Some(v)), record),
            Ok(Step::Park { deadline }) => {
                if let Some(deadline) = deadline {
                    self.set_timer(token, key, deadline);
                }
                (Ok(None), record)
            }
            Err(e) => (Err(e), record),
        }
    }

    fn delete(&mut self, key: &str, now: Instant, out: &mut Vec<Delivery>) -> bool {
        self.moved.remove(key);
        let Some(e) = self.remove(key) else {
            return false;
        };
        let err = Error::new(
            ErrorKind::NotFound,
            format!("{} '{key}' was deleted", e.body.type_name()),
        );
        match e.body {
            Body::Builtin(mut obj) => {
                let caller = system_caller();
                let mut ctx = Ctx::new(&caller, Token { conn: 0, req: 0 }, now, out);
                obj.drain_waiters(&mut ctx, &err);
            }
            Body::User(u) => {
                out.extend(u.calls.into_iter().map(|token| Delivery {
                    token,
                    reply: Err(err.clone()),
                }));
                // A stored object is in no host.
                if u.state != UserState::Stored {
                    self.forwards.push(Forward::Drop {
                        key: key.to_string(),
                        object_id: u.id,
                    });
                }
            }
        }
        true
    }
}

/// The reply that hands a client's call of a method that may call other objects to the
/// server's driver of nested calls: `NestedCall` with the call, `[type, key, method, args]`.
fn drive_nested(op: Op) -> Error {
    let Op::Call {
        type_name,
        key,
        method,
        args,
        ..
    } = op
    else {
        unreachable!("only calls make calls")
    };
    let message = format!("{type_name}.{method} on '{key}' calls other objects");
    let data = Value::Array(vec![type_name.into(), key.into(), method.into(), Value::Array(args)]);
    Error::new(ErrorKind::NestedCall, message).with_data(data)
}

fn check_type(key: &str, actual: &str, wanted: &str) -> Result<(), Error> {
    if actual == wanted {
        Ok(())
    } else {
        Err(Error::new(
            ErrorKind::TypeMismatch,
            format!("'{key}' is a {actual}, not a {wanted}"),
        ))
    }
}

#[cfg(test)]
mod tests;
