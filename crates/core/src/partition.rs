//! One partition of the object space: its objects, parked-call timers, and the reply log
//! that makes retried calls exactly-once. A pure state machine: every entry point takes the
//! current time and returns the replies to send.
//!
//! User-defined objects (`py:` types) run in object hosts: their calls park here and leave as
//! [`Forward`]s, which the server drains with [`Partition::take_forwards`] right after each
//! entry point (so a host sees one object's calls in the order applied here); the host's
//! answers come back through [`Partition::complete`] and [`Partition::lose`].
//!
//! Persistent objects: every event that changes one (a mutating call, create or delete, and
//! the expiry, withdrawal, disconnect or session end that resolves a parked call on one)
//! leaves an op-log [`Record`](crate::record::Record), in the order applied, which the server
//! drains with [`Partition::take_log`] under the same lock and makes durable before sending
//! the replies. Recovery feeds the records back through [`Partition::replay`], which calls
//! the very entry points that produced them.

use ahash::{HashMap, HashSet};
use std::borrow::Cow;
use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::sync::Arc;
use std::time::Instant;

use crate::objects::user::{self, Forward, UserObject, UserState};
use crate::record::{encode_apply, encode_class, encode_user_state, Record, UserStateRef, MAX_RECORD_LEN};
use crate::{objects, Caller, ConnId, Ctx, Delivery, Error, ErrorKind, Object, Reply, Step, Token, Value};

mod memory;
mod object_map;
mod prepared;
mod snapshot;
mod transaction;

pub use memory::{Charge, Memory};
pub use prepared::Decision;
pub use transaction::{TxnCall, TxnId};

/// How many recorded replies each client keeps per partition. A client never retries a call
/// older than its oldest call in flight, so a window is enough; a client that says which
/// replies it holds (`acked`) keeps only those of its calls in flight.
const REPLY_LOG_LEN: usize = 4096;

/// Bytes of replies each client keeps per partition unless told otherwise
/// ([`Partition::set_reply_log_limit`]).
pub const DEFAULT_REPLY_LOG_BYTES: usize = 64 << 20;

/// An object's key and the session it goes with (`None`: named or kept).
pub type KeyAndOwner = (String, Option<Arc<str>>);

/// Bytes of replies all clients keep together per partition unless told otherwise.
pub const DEFAULT_REPLY_LOGS_BYTES: usize = 256 << 20;

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

/// Whether this partition may hold persistent objects.
#[derive(Clone, Debug, Default, PartialEq)]
enum Storage {
    /// The server has no data directory.
    #[default]
    None,
    Ok,
    /// The op log failed (disk full...): no persistent write is accepted until a restart.
    Failed(String),
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

/// A persistent user-defined object as logged: what a partition snapshot keeps of it.
#[derive(Clone, Debug, PartialEq)]
pub struct StoredUser {
    pub key: String,
    pub type_name: String,
    pub version: String,
    /// The session owning it (an unnamed object), if any.
    pub owner: Option<String>,
    /// Its last logged state (a pickle; opaque here).
    pub state: Vec<u8>,
}

/// An object taken out of its partition by `keep`, on its way to another key.
pub struct Detached {
    obj: Box<dyn Object>,
    owner: Option<Arc<str>>,
}

#[derive(Default)]
struct ReplyLog {
    /// The replies, sorted by sequence number and searched by halves. Rings, not trees: a
    /// client's sequence numbers mostly grow, so a new reply goes at the back (a late one a
    /// few places before it) and the oldest leaves from the front, with no node to allocate,
    /// split or merge (a hash table would touch a random slot of every client's thousands).
    replies: VecDeque<Recorded>,
    /// The sequence numbers in the order recorded: the oldest recorded is forgotten first
    /// (not the lowest: a call parked long ago may have been answered just now).
    order: VecDeque<u64>,
    /// The highest sequence number recorded: a client's new call is above it, and is known
    /// new without a search.
    highest: u64,
    /// The client holds the replies of all its calls below this seq (the highest `acked` it
    /// sent, or the seq of the call that sent it if lower): it never sends those again, so a
    /// copy of one arriving now (delayed in the network, say, on a connection the client
    /// gave up) is refused, not run again.
    acked_below: u64,
    /// Calls at or above `acked_below` whose replies were forgotten for room (sorted, at
    /// most [`REPLY_LOG_LEN`]): a retry of one is refused, not run a second time.
    forgotten: VecDeque<u64>,
    /// About how many bytes the replies take.
    bytes: usize,
}

struct Recorded {
    seq: u64,
    /// Boxed: most replies are values, and a busy client keeps thousands.
    reply: Result<Value, Box<Error>>,
    /// Whether the call is in the op log (only those go into snapshots: a replay would not
    /// have recorded the others).
    durable: bool,
}

impl ReplyLog {
    /// Record `seq`'s reply, forgetting the oldest recorded while the log holds
    /// [`REPLY_LOG_LEN`] replies or would pass `max_bytes`.
    fn record(&mut self, seq: u64, reply: Reply, durable: bool, max_bytes: usize) {
        let reply = reply.map_err(Box::new);
        let size = reply_size(&reply);
        self.bytes += size;
        if let Some(i) = self.position(seq) {
            let r = &mut self.replies[i];
            self.bytes -= reply_size(&r.reply);
            (r.reply, r.durable) = (reply, durable);
            return;
        }
        if let Ok(i) = self.forgotten.binary_search(&seq) {
            self.forgotten.remove(i); // a replica replaying it records it again
        }
        // Forget first: the rings never grow past their length, nor the log past its bytes.
        while (self.order.len() >= REPLY_LOG_LEN || self.bytes > max_bytes) && self.forget_oldest() {}
        self.order.push_back(seq);
        let recorded = Recorded { seq, reply, durable };
        if seq > self.highest {
            self.highest = seq;
            self.replies.push_back(recorded);
        } else {
            // A late call: the ring moves the few replies recorded above it.
            let i = self.replies.partition_point(|r| r.seq < seq);
            self.replies.insert(i, recorded);
        }
    }

    /// Forget the oldest recorded reply; false if none is left.
    fn forget_oldest(&mut self) -> bool {
        let Some(old) = self.order.pop_front() else {
            return false;
        };
        let at = match self.replies.front() {
            Some(r) if r.seq == old => Some(0),
            _ => self.position(old),
        };
        if let Some(r) = at.and_then(|i| self.replies.remove(i)) {
            self.bytes -= reply_size(&r.reply);
            self.remember_forgotten(old);
        }
        true
    }

    /// Forget the replies below `seq`, and refuse those calls from now on: their client holds
    /// the replies, and never sends the calls again.
    fn acknowledge(&mut self, seq: u64) {
        self.acked_below = self.acked_below.max(seq);
        if self.replies.front().is_none_or(|r| r.seq >= seq) {
            return;
        }
        let kept = self.replies.partition_point(|r| r.seq < seq);
        let forgotten: usize = self.replies.drain(..kept).map(|r| reply_size(&r.reply)).sum();
        self.bytes -= forgotten;
        // Short: only the calls in flight are left.
        self.order.retain(|&s| s >= seq);
        let gone = self.forgotten.partition_point(|&s| s < seq);
        self.forgotten.drain(..gone);
    }

    fn remember_forgotten(&mut self, seq: u64) {
        if self.forgotten.len() >= REPLY_LOG_LEN {
            self.forgotten.pop_front();
        }
        match self.forgotten.back() {
            Some(&last) if last > seq => {
                let i = self.forgotten.partition_point(|&s| s < seq);
                self.forgotten.insert(i, seq);
            }
            _ => self.forgotten.push_back(seq),
        }
    }

    /// Whether `seq`'s reply was recorded, then forgotten for room.
    fn was_forgotten(&self, seq: u64) -> bool {
        self.forgotten.binary_search(&seq).is_ok()
    }

    fn position(&self, seq: u64) -> Option<usize> {
        if seq > self.highest {
            return None;
        }
        self.replies.binary_search_by_key(&seq, |r| r.seq).ok()
    }

    /// The reply recorded for `seq`, and whether its call is in the op log.
    fn get(&self, seq: u64) -> Option<(Reply, bool)> {
        let r = &self.replies[self.position(seq)?];
        Some((r.reply.clone().map_err(|e| *e), r.durable))
    }

    /// The replies of logged calls, oldest recorded first (what a snapshot carries).
    fn durable(&self) -> impl Iterator<Item = (u64, Reply)> + '_ {
        self.order.iter().filter_map(|&seq| match self.get(seq) {
            Some((reply, true)) => Some((seq, reply)),
            _ => None,
        })
    }
}

/// About how many bytes a recorded reply takes.
fn reply_size(reply: &Result<Value, Box<Error>>) -> usize {
    std::mem::size_of::<Recorded>()
        + match reply {
            Ok(value) => crate::value::approx_size(value),
            Err(e) => std::mem::size_of::<Error>() + e.message.len() + crate::value::approx_size(&e.data),
        }
}

/// A call as the partition receives it.
#[derive(Clone, Debug, PartialEq)]
pub enum Op {
    /// Create the object with `args` unless it exists; reply `true` if created.
    Create {
        type_name: String,
        key: String,
        args: Vec<Value>,
        owned: bool,
        /// Logged and recovered after a restart (durable types only).
        persistent: bool,
    },
    /// Run `method` on the object.
    Call {
        type_name: String,
        key: String,
        method: String,
        args: Vec<Value>,
    },
    /// Remove the object; reply `true` if it existed.
    Delete { key: String },
}

impl Op {
    pub fn key(&self) -> &str {
        match self {
            Op::Create { key, .. } | Op::Call { key, .. } | Op::Delete { key } => key,
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
    /// The transaction holding each key a transaction touched.
    locks: HashMap<String, TxnId>,
    /// When each open transaction expires, earliest first.
    txn_deadlines: BTreeSet<(Instant, TxnId)>,
    /// A transaction's calls are being applied at its commit (accepted already).
    committing: bool,
    /// Cluster transactions prepared here, and decisions kept (see [`prepared`]).
    two_phase: prepared::TwoPhase,
}

struct ReplyLogLimit {
    per_client: usize,
    total: usize,
}

impl Default for ReplyLogLimit {
    fn default() -> Self {
        ReplyLogLimit {
            per_client: DEFAULT_REPLY_LOG_BYTES,
            total: DEFAULT_REPLY_LOGS_BYTES,
        }
    }
}

fn system_caller() -> Caller {
    Caller {
        conn: 0,
        client: Arc::from(""),
        thread: 0,
    }
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

    /// Keep at most `per_client` bytes of a client's recorded replies here (it acknowledges
    /// none, say), forgetting its oldest; and at most `total` of all clients' together,
    /// forgetting the oldest of the largest log first, so that clients opening session
    /// after session, each filling its log, cannot take the server's memory.
    pub fn set_reply_log_limit(&mut self, per_client: usize, total: usize) {
        self.reply_log_limit = ReplyLogLimit { per_client, total };
    }

    /// Record `seq`'s reply in `client`'s log, within the limits (see
    /// [`set_reply_log_limit`](Self::set_reply_log_limit)).
    fn record_reply(&mut self, client: &Arc<str>, seq: u64, reply: Reply, durable: bool) {
        // The client's log is found by reference: its name is cloned only for a new one.
        let log = match self.logs.get_mut(client) {
            Some(log) => log,
            None => self.logs.entry(client.clone()).or_default(),
        };
        let before = log.bytes;
        log.record(seq, reply, durable, self.reply_log_limit.per_client);
        self.logs_bytes = self.logs_bytes + log.bytes - before;
        while self.logs_bytes > self.reply_log_limit.total {
            // The largest by bytes, then by name: the same on every replica.
            let largest = self
                .logs
                .iter_mut()
                .max_by(|a, b| (a.1.bytes, a.0).cmp(&(b.1.bytes, b.0)));
            let Some((_, log)) = largest else { break };
            let before = log.bytes;
            if !log.forget_oldest() {
                break;
            }
            self.logs_bytes -= before - log.bytes;
        }
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

    /// How many replies this partition keeps for retries, over all its clients.
    pub fn recorded_replies(&self) -> usize {
        self.logs.values().map(|log| log.replies.len()).sum()
    }

    /// User-defined objects alive (constructing or constructed; not lost).
    pub fn hosted_objects(&self) -> usize {
        self.versions.values().sum()
    }

    /// User-defined objects of `type_name` at `version` alive (lost ones hold no instance).
    pub fn count_version(&self, type_name: &str, version: &str) -> usize {
        self.versions
            .get(&(type_name.to_string(), version.to_string()))
            .copied()
            .unwrap_or(0)
    }

    /// The live user-defined objects of `type_name` at `version`, as `(key, owner)`: the
    /// session an unnamed object goes with, `None` for a named (or kept) one. What stops
    /// another version from being defined, for the refusal to name.
    pub fn objects_of_version(&self, type_name: &str, version: &str) -> Vec<KeyAndOwner> {
        if self.count_version(type_name, version) == 0 {
            return Vec::new();
        }
        self.objects
            .iter()
            .filter_map(|(key, e)| match &e.body {
                Body::User(u)
                    if u.type_name == type_name && u.version == version && !matches!(u.state, UserState::Lost(_)) =>
                {
                    Some((key.to_string(), e.owner.clone()))
                }
                _ => None,
            })
            .collect()
    }

    /// The code of class `type_name` at `version`, if this partition logged it.
    pub fn class_code(&self, type_name: &str, version: &str) -> Option<&Arc<Vec<u8>>> {
        self.classes.get(&(type_name.to_string(), version.to_string()))
    }

    /// Every class whose code this partition logged, as `(type, version, code)` (for a
    /// partition snapshot, and to register them with the server after recovery).
    pub fn classes(&self) -> Vec<(String, String, Arc<Vec<u8>>)> {
        self.classes
            .iter()
            .map(|((t, v), code)| (t.clone(), v.clone(), code.clone()))
            .collect()
    }

    /// A persistent create of a user-defined type is about to be applied with `code` as
    /// its class: keep the code to log it with the first state of that version here.
    pub fn offer_class(&mut self, type_name: &str, version: &str, code: &Arc<Vec<u8>>) {
        let class = (type_name.to_string(), version.to_string());
        if self.storage != Storage::None && !self.classes.contains_key(&class) {
            self.unlogged_classes.entry(class).or_insert_with(|| code.clone());
        }
    }

    /// Put a class logged earlier back (replay, or a partition snapshot being restored).
    pub fn insert_class(&mut self, type_name: &str, version: &str, code: Arc<Vec<u8>>) {
        let class = (type_name.to_string(), version.to_string());
        self.unlogged_classes.remove(&class);
        self.classes.insert(class, code);
    }

    /// Every persistent user-defined object with its last logged state, by key (for a
    /// partition snapshot). One still constructing has no state yet and is left out.
    pub fn stored_user_objects(&self) -> Vec<StoredUser> {
        let mut found: Vec<StoredUser> = self
            .objects
            .iter()
            .filter(|(_, e)| e.persistent)
            .filter_map(|(k, e)| match &e.body {
                Body::User(u) => u.last_state.as_ref().map(|state| StoredUser {
                    key: k.to_string(),
                    type_name: u.type_name.clone(),
                    version: u.version.clone(),
                    owner: e.owner.as_deref().map(str::to_string),
                    state: state.clone(),
                }),
                Body::Builtin(_) => None,
            })
            .collect();
        found.sort_unstable_by(|a, b| a.key.cmp(&b.key));
        found
    }

    /// Put a persistent user-defined object at `o.key` with no instance in any host (the
    /// next call restores it from `o.state`), replacing what was there: replay of its
    /// `user_state` record, or a partition snapshot being restored.
    pub fn insert_stored_user(&mut self, o: StoredUser) {
        let same = matches!(
            self.objects.get(&o.key),
            Some(Entry { body: Body::User(u), persistent: true, .. })
                if u.type_name == o.type_name && u.version == o.version && u.calls.is_empty()
        );
        if same {
            if let Some(Entry {
                body: Body::User(u),
                owner,
                ..
            }) = self.objects.get_mut(&o.key)
            {
                u.state = UserState::Stored;
                u.last_state = Some(o.state);
                *owner = o.owner.map(Arc::from);
            }
            return;
        }
        self.remove(&o.key);
        self.next_object_id += 1;
        *self
            .versions
            .entry((o.type_name.clone(), o.version.clone()))
            .or_default() += 1;
        let u = UserObject {
            type_name: o.type_name,
            version: o.version,
            id: self.next_object_id,
            state: UserState::Stored,
            calls: VecDeque::new(),
            last_state: Some(o.state),
        };
        self.objects.insert(
            o.key,
            Entry {
                body: Body::User(Box::new(u)),
                owner: o.owner.map(Arc::from),
                persistent: true,
                epoch: self.snapshot_epoch,
            },
        );
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

    /// Whether a live object is under `key`: one that a `create` attaches to, not one that
    /// a `create` would make again (a user-defined object lost with its host).
    pub fn is_live(&self, key: &str) -> bool {
        match self.objects.get(key).map(|e| &e.body) {
            Some(Body::User(u)) => !matches!(u.state, UserState::Lost(_)),
            Some(Body::Builtin(_)) => true,
            None => false,
        }
    }

    /// Accept persistent objects: the server logs what [`take_log`](Self::take_log) gives.
    pub fn enable_storage(&mut self) {
        self.storage = Storage::Ok;
    }

    /// The op log failed: refuse every further persistent write (ephemeral objects go on).
    pub fn storage_failed(&mut self, why: &str) {
        self.storage = Storage::Failed(why.to_string());
    }

    /// The op-log records produced since the last call, in order, or `None` if no persistent
    /// object was reached: then the replies may go at once. With `Some` (even empty), the
    /// replies go only once everything logged before, and these records, are durable.
    pub fn take_log(&mut self) -> Option<Vec<Vec<u8>>> {
        if !self.touched_persistent && self.records.is_empty() {
            return None;
        }
        self.touched_persistent = false;
        Some(std::mem::take(&mut self.records))
    }

    /// The sessions named in logged records that have not ended.
    pub fn logged_clients(&self) -> Vec<Arc<str>> {
        self.logged_clients.iter().cloned().collect()
    }

    /// The highest connection id in a logged record: new connections after a restart must
    /// be numbered above it.
    pub fn highest_logged_conn(&self) -> ConnId {
        self.highest_logged_conn
    }

    /// Every persistent object a replay of the log would find (not one still constructing),
    /// with its snapshot (`None` for one without: never, for durable types; always for
    /// user-defined ones, whose state is [`stored_user_objects`](Self::stored_user_objects)),
    /// by key.
    pub fn persistent_snapshots(&self) -> BTreeMap<String, (String, Option<Value>)> {
        self.objects
            .iter()
            .filter(|(_, e)| is_durable(e))
            .map(|(k, e)| {
                let snap = match &e.body {
                    Body::Builtin(obj) => obj.snapshot(),
                    Body::User(_) => None,
                };
                (k.to_string(), (e.body.type_name().to_string(), snap))
            })
            .collect()
    }

    /// The recorded replies of logged calls, by client (what a snapshot carries).
    #[cfg(test)]
    pub(crate) fn durable_replies(&self) -> BTreeMap<String, Vec<(u64, Reply)>> {
        self.logs
            .iter()
            .map(|(client, log)| {
                let replies = log.durable().collect();
                (client.to_string(), replies)
            })
            .filter(|(_, replies): &(String, Vec<_>)| !replies.is_empty())
            .collect()
    }

    /// Recovery: apply one op-log record through the entry point that produced it. Replies
    /// are dropped (their connections died with the old server) and no record is produced
    /// again. Fails on a record that does not decode.
    pub fn replay(&mut self, record: &[u8], now: Instant) -> Result<(), String> {
        match Record::decode(record)? {
            Record::Apply {
                caller,
                token,
                seq,
                acked,
                op,
            } => {
                self.apply_as(&caller, token, seq, acked, op, now, Some(record));
            }
            // Forced: the replayed call's deadline was computed from the replay's clock.
            Record::Expire { key, token } => {
                self.withdraw(token, &key, now);
            }
            Record::Disconnect { conn } => {
                self.disconnect(conn, now);
            }
            Record::Evict { key, bytes } => {
                self.evict(&key, usize::try_from(bytes).unwrap_or(usize::MAX));
            }
            Record::EndSession { client } => {
                self.end_session(&client, now);
            }
            Record::UserState {
                key,
                type_name,
                version,
                owner,
                token,
                client,
                seq,
                reply,
                state,
            } => {
                if let Some(owner) = &owner {
                    self.logged_clients.insert(Arc::from(owner.as_str()));
                }
                if let Some(client) = client.filter(|_| seq != 0) {
                    let client: Arc<str> = Arc::from(client);
                    self.record_reply(&client, seq, reply, true);
                    self.logged_clients.insert(client);
                }
                self.highest_logged_conn = self.highest_logged_conn.max(token.conn);
                self.insert_stored_user(StoredUser {
                    key,
                    type_name,
                    version,
                    owner,
                    state,
                });
            }
            Record::Class {
                type_name,
                version,
                code,
            } => self.insert_class(&type_name, &version, Arc::new(code)),
            Record::Commit { client, seq, records } => self.replay_commit(client, seq, records, now)?,
            r @ (Record::Prepare { .. } | Record::Decide { .. } | Record::Decision { .. } | Record::Forget { .. }) => {
                self.replay_two_phase(r, now)
            }
        }
        // Nothing runs in a host during replay: stored objects are restored on their next call.
        self.forwards.clear();
        self.records.clear();
        self.touched_persistent = false;
        Ok(())
    }

    /// After recovery: every connection of the old server is gone, so drop the calls still
    /// parked. The disconnects are logged like live ones, so a later replay sees them too.
    pub fn restart(&mut self, now: Instant) -> Vec<Delivery> {
        let conns: Vec<ConnId> = self.logged_conns.iter().copied().collect();
        conns.into_iter().flat_map(|c| self.disconnect(c, now)).collect()
    }

    fn log(&mut self, record: Vec<u8>) {
        self.records.push(record);
        self.touched_persistent = true;
    }

    /// Whether `key` holds a persistent object.
    /// (One still constructing is not yet: it has no record that a replay would find, so
    /// nothing about it may be logged.)
    fn is_persistent(&self, key: &str) -> bool {
        self.objects.get(key).is_some_and(is_durable)
    }

    /// A `create`'s `persistent` must suit the type, the server and the object already there.
    fn check_persistence(&self, type_name: &str, key: &str, persistent: bool) -> Result<(), Error> {
        if persistent {
            if objects::TYPES.contains(&type_name) && !objects::is_durable(type_name) {
                return Err(Error::value(format!(
                    "{type_name} is a synchronization object, ephemeral by nature: persistent=True is only \
                     for data objects (Counter, Value, Dict, SortedDict, List, Blob, Array, Queue, LifoQueue, \
                     PriorityQueue)"
                )));
            }
            if self.storage == Storage::None {
                return Err(Error::value(
                    "persistent=True needs a server started with a data directory: this server has no --data-dir",
                ));
            }
            // Forwarding notes are not logged: answer here, where a replay would too.
            if let Some((new_key, _)) = self.moved.get(key) {
                return Err(moved(key, new_key));
            }
        }
        match self.objects.get(key) {
            // Refused here, unlogged: a replay has no ephemeral (or still constructing) object
            // at `key`, so a logged create would succeed there and diverge from the live run.
            Some(e) if persistent && !is_durable(e) && e.body.type_name() != type_name => {
                check_type(key, e.body.type_name(), type_name)
            }
            Some(e) if e.body.type_name() == type_name && e.persistent != persistent => {
                let (is, not) = match e.persistent {
                    true => ("persistent", "persistent=False"),
                    false => ("ephemeral", "persistent=True"),
                };
                Err(Error::value(format!(
                    "'{key}' is an existing {is} {type_name}: it cannot be used with {not} (delete it first, or use another name)"
                )))
            }
            _ => Ok(()),
        }
    }

    /// The requests for object hosts produced since the last call, in order.
    pub fn take_forwards(&mut self) -> Vec<Forward> {
        std::mem::take(&mut self.forwards)
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
            // The client's log is found by reference: its name is cloned only for a new one.
            let log = match self.logs.get_mut(&caller.client) {
                Some(log) => log,
                None => self.logs.entry(caller.client.clone()).or_default(),
            };
            // Never the call's own reply: a client acknowledging it is mistaken.
            let before = log.bytes;
            log.acknowledge(acked.min(seq));
            self.logs_bytes -= before - log.bytes;
        }
        // Only live calls: a logged one was accepted where it ran, and a replica (whose mark
        // may be higher, from a leader's snapshot) must apply it the same.
        if let Some(log) = self.logs.get(&caller.client).filter(|_| seq != 0 && replayed.is_none()) {
            if seq < log.acked_below {
                let e = Error::new(
                    ErrorKind::ProtocolError,
                    format!(
                        "call {seq} of this session is not run again: its session acknowledged the replies of \
                         its calls below {}, so this is a stale copy",
                        log.acked_below
                    ),
                );
                out.push(Delivery { token, reply: Err(e) });
                return out;
            }
            if log.was_forgotten(seq) {
                let e = Error::new(
                    ErrorKind::ProtocolError,
                    format!(
                        "call {seq} of this session ran, but its reply was forgotten: the session's unacknowledged \
                         replies passed --max-reply-log, so it is not run again"
                    ),
                );
                out.push(Delivery { token, reply: Err(e) });
                return out;
            }
        }
        let persistent = match &op {
            Op::Create { persistent: true, .. } => self.storage != Storage::None,
            op => self.is_persistent(op.key()),
        };
        // An absent key may be a persistent object whose delete is not durable yet: answers
        // about it wait for the log like answers about persistent objects.
        let durable = self.storage != Storage::None;
        self.touched_persistent |= persistent || (durable && !self.objects.contains_key(op.key()));
        if persistent {
            self.preserve(op.key());
        }
        if seq != 0 {
            if let Some((reply, _)) = self.logs.get(&caller.client).and_then(|l| l.get(seq)) {
                // A recorded reply may be about a change whose record is still being written
                // (it waits like one), or whose write failed (then it is not durable).
                self.touched_persistent |= durable;
                let reply = match &self.storage {
                    Storage::Failed(why) if persistent => Err(storage_error(why)),
                    _ => reply,
                };
                out.push(Delivery { token, reply });
                return out;
            }
            if !matches!(op, Op::Delete { .. }) && self.take_over(&caller.client, token, seq, op.key()) {
                return out;
            }
        }
        // A call on a key a prepared transaction holds waits for its decision.
        let op = match replayed.is_none() && !self.committing {
            true => match self.wait_if_prepared(caller, token, seq, acked, op) {
                Some(op) => op,
                None => return out,
            },
            false => op,
        };
        // A live call that may grow an object waits for room (a replayed one was accepted
        // where it ran), which caches give first. Refused before anything is logged or
        // recorded: a retry may pass.
        if replayed.is_none() && !self.committing && self.objects.memory().is_over() && self.may_grow(&op) {
            self.make_room();
            if let Err(e) = self.objects.memory().check() {
                out.push(Delivery { token, reply: Err(e) });
                return out;
            }
        }
        if let Op::Create {
            type_name,
            key,
            persistent,
            ..
        } = &op
        {
            if let Err(e) = self.check_persistence(type_name, key, *persistent) {
                self.reply(caller, token, seq, true, false, Err(e), &mut out);
                return out;
            }
        }
        // A persistent user-defined object's create and calls are logged when its host
        // answers them, with its state after them (`complete`); they may change it, so a
        // failed log refuses them too.
        let mut user_write = false;
        let logged = persistent
            && match &op {
                Op::Call { key, method, .. } => match self.objects.get(key).map(|e| &e.body) {
                    Some(Body::Builtin(obj)) => obj.is_mutating(method),
                    Some(Body::User(_)) => {
                        user_write = true;
                        false
                    }
                    None => false,
                },
                Op::Create { type_name, .. } if user::is_user_type(type_name) => {
                    user_write = true;
                    false
                }
                Op::Create { .. } | Op::Delete { .. } => true,
            };
        let logged_at = self.records.len();
        if logged || user_write {
            if let Storage::Failed(why) = &self.storage {
                let e = storage_error(why);
                self.reply(caller, token, seq, true, false, Err(e), &mut out);
                return out;
            }
        }
        if logged {
            let record: Cow<[u8]> = match replayed {
                Some(bytes) => Cow::Borrowed(bytes),
                None => Cow::Owned(encode_apply(caller, token, seq, acked, &op)),
            };
            if record.len() > MAX_RECORD_LEN {
                let e = Error::value(format!(
                    "this change to persistent object '{}' would be an op-log record of {} bytes, more than \
                     the {MAX_RECORD_LEN} a record may hold: make it in smaller parts",
                    op.key(),
                    record.len()
                ));
                self.reply(caller, token, seq, true, false, Err(e), &mut out);
                return out;
            }
            match record {
                Cow::Owned(record) => self.log(record),
                Cow::Borrowed(_) => self.touched_persistent = true,
            }
            self.logged_conns.insert(caller.conn);
            if !self.logged_clients.contains(&caller.client) {
                self.logged_clients.insert(caller.client.clone());
            }
            self.highest_logged_conn = self.highest_logged_conn.max(caller.conn);
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
            } => self.call(caller, token, &type_name, &key, &method, args, now, &mut out),
        };
        match reply {
            Ok(None) => {
                if record && seq != 0 {
                    self.parked_seqs.insert(token, (caller.client.clone(), seq));
                }
                let parked = match (logged, replayed) {
                    (false, _) => None,
                    (true, Some(bytes)) => Some(bytes.to_vec()),
                    (true, None) => self.records.get(logged_at).cloned(),
                };
                if let Some(record) = parked {
                    self.parked_order += 1;
                    self.parked_records.insert(token, (self.parked_order, record));
                }
            }
            Ok(Some(v)) => self.reply(caller, token, seq, record, logged, Ok(v), &mut out),
            Err(e) => self.reply(caller, token, seq, record, logged, Err(e), &mut out),
        }
        self.settle(&out);
        out
    }

    /// Over `--max-memory`: the caches here let their least recently used entries go, each
    /// its share of the excess (in proportion to its size), until the objects fit the limit
    /// or the caches are empty. Ordinary objects never lose data. Logged for a persistent
    /// cache, as the bytes to free (a replay or a follower, whose total differs, frees the
    /// same entries: the cache's order is part of its state).
    pub fn make_room(&mut self) {
        let memory = self.objects.memory();
        if !memory.is_over() {
            return;
        }
        let excess = memory.used() - memory.limit();
        // A persistent cache's evictions must be logged: not while the log is failed.
        let logless = matches!(self.storage, Storage::Failed(_));
        let caches: Vec<(Arc<str>, usize)> = self
            .objects
            .caches()
            .filter_map(|key| {
                let entry = self.objects.get(key)?;
                (!(logless && entry.persistent)).then(|| (key.clone(), entry.size()))
            })
            .collect();
        let total: usize = caches.iter().map(|(_, size)| size).sum();
        if excess == 0 || total == 0 {
            return;
        }
        for (key, size) in caches {
            let share = (excess as u128 * size as u128).div_ceil(total as u128);
            let share = usize::try_from(share).unwrap_or(usize::MAX).min(size);
            if share == 0 {
                continue;
            }
            let freed = self.evict(&key, share);
            if freed > 0 && self.is_persistent(&key) {
                let bytes = share as u64;
                self.log(
                    Record::Evict {
                        key: key.to_string(),
                        bytes,
                    }
                    .encode(),
                );
            }
        }
    }

    /// Let the cache at `key` free `bytes` (see [`Object::evict`]); returns what it freed.
    fn evict(&mut self, key: &str, bytes: usize) -> usize {
        self.preserve(key);
        let Some((entry, counted, meter)) = self.objects.get_metered(key) else {
            return 0;
        };
        let Some(obj) = entry.body.builtin() else { return 0 };
        let freed = obj.evict(bytes);
        meter.changed(counted, memory::object_size(key, obj.size()));
        freed
    }

    /// Whether `op` may make the objects hold more: a create of a new key, or a call of a
    /// built-in method that may grow its object.
    fn may_grow(&self, op: &Op) -> bool {
        match op {
            Op::Create { key, .. } => !self.objects.contains_key(key),
            Op::Call { key, method, .. } => match self.objects.get(key).map(|e| &e.body) {
                Some(Body::Builtin(obj)) => obj.may_grow(method),
                _ => false,
            },
            Op::Delete { .. } => false,
        }
    }

    /// A call resent (same client and seq) while the first is still with the object's host
    /// must not run twice: the resent one takes the first one's place and gets its reply.
    fn take_over(&mut self, client: &Arc<str>, token: Token, seq: u64, key: &str) -> bool {
        let Some(Entry {
            body: Body::User(u), ..
        }) = self.objects.get_mut(key)
        else {
            return false;
        };
        let parked_seqs = &self.parked_seqs;
        let Some(slot) = u
            .calls
            .iter_mut()
            .find(|t| parked_seqs.get(t).is_some_and(|(c, s)| *s == seq && **c == **client))
        else {
            return false;
        };
        let old = std::mem::replace(slot, token);
        if let Some(record) = self.parked_seqs.remove(&old) {
            self.parked_seqs.insert(token, record);
        }
        self.hosted.remove(&old);
        self.hosted.insert(token);
        true
    }

    #[allow(clippy::too_many_arguments)]
    fn reply(
        &mut self,
        caller: &Caller,
        token: Token,
        seq: u64,
        record: bool,
        logged: bool,
        reply: Reply,
        out: &mut Vec<Delivery>,
    ) {
        if record && seq != 0 {
            self.record_reply(&caller.client, seq, reply.clone(), logged);
        }
        out.push(Delivery { token, reply });
    }

    /// Book-keeping for answered calls: record the replies of parked mutating calls (for
    /// exactly-once retries) and drop their timers.
    fn settle(&mut self, out: &[Delivery]) {
        // Most calls leave nothing to settle: no lookups while nothing is parked or hosted.
        if self.timer_of.is_empty()
            && self.hosted.is_empty()
            && self.parked_records.is_empty()
            && self.logged_hosted.is_empty()
            && self.parked_seqs.is_empty()
        {
            return;
        }
        for d in out {
            if let Some(at) = self.timer_of.remove(&d.token) {
                self.timers.remove(&at);
            }
            self.hosted.remove(&d.token);
            let logged = self.parked_records.remove(&d.token).is_some() | self.logged_hosted.remove(&d.token);
            if let Some((client, seq)) = self.parked_seqs.remove(&d.token) {
                self.record_reply(&client, seq, d.reply.clone(), logged);
            }
        }
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
        let Some((version, args, kwargs)) = user_args else {
            let obj = objects::create(&type_name, &args)?;
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
        self.remove(&key);
        self.next_object_id += 1;
        let object_id = self.next_object_id;
        self.forwards.push(Forward::Construct {
            key: key.clone(),
            object_id,
            type_name: type_name.clone(),
            version: version.clone(),
            args,
            kwargs,
            persistent,
        });
        *self.versions.entry((type_name.clone(), version.clone())).or_default() += 1;
        self.hosted.insert(token);
        let u = UserObject {
            type_name,
            version,
            id: object_id,
            state: UserState::Constructing,
            calls: VecDeque::from([token]),
            last_state: None,
        };
        self.objects.insert(
            key,
            Entry {
                body: Body::User(Box::new(u)),
                owner,
                persistent,
                epoch: self.snapshot_epoch,
            },
        );
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
        type_name: &str,
        key: &str,
        method: &str,
        args: Vec<Value>,
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
        let obj = match &mut entry.body {
            Body::Builtin(obj) => obj,
            Body::User(u) => {
                let ids = &mut self.next_object_id;
                let forwarded = forward_call(u, token, key, method, args, ids, &mut self.forwards);
                if forwarded.is_ok() {
                    self.hosted.insert(token);
                }
                // Every method may change the object: its reply is recorded.
                return (forwarded.map(|()| None), true);
            }
        };
        let record = obj.is_mutating(method);
        let mut ctx = Ctx::new(caller, token, now, out);
        let step = obj.apply(method, &args, &mut ctx);
        // Calls that are not recorded may change the object too (a lock's `acquire`, and a
        // parked call: its waiters).
        if record || !objects::is_read(type_name, method) || matches!(step, Ok(Step::Park { .. })) {
            meter.changed(counted, memory::object_size(key, obj.size()));
        }
        if obj.tracks_connections() {
            self.conn_keys.entry(caller.conn).or_default().insert(key.to_string());
        }
        match step {
            Ok(Step::Reply(v)) => (Ok(Some(v)), record),
            Ok(Step::Park { deadline }) => {
                if let Some(d) = deadline {
                    self.timer_seq += 1;
                    let at = (d, self.timer_seq);
                    if let Some(old) = self.timer_of.insert(token, at) {
                        self.timers.remove(&old);
                    }
                    self.timers.insert(at, (key.to_string(), token));
                }
                (Ok(None), record)
            }
            Err(e) => (Err(e), record),
        }
    }

    /// The id the next object created here will follow.
    pub fn next_object_id(&self) -> u64 {
        self.next_object_id
    }

    /// Number objects created from now on above `next`: a partition rebuilt in place of
    /// another must not reuse ids that object hosts may still answer about.
    pub fn skip_object_ids(&mut self, next: u64) {
        self.next_object_id = self.next_object_id.max(next);
    }

    /// This replica stops serving its shard (in a cluster, the shard's leadership moved):
    /// answer every parked call, and every call waiting for an object host, with `error`,
    /// and let the hosts drop their objects (see [`take_forwards`](Self::take_forwards)).
    /// The partition is replaced after this.
    pub fn abandon(&mut self, error: &Error, now: Instant) -> Vec<Delivery> {
        let keys: Vec<String> = self.objects.iter().map(|(k, _)| k.to_string()).collect();
        let mut out = self.abandon_waiting(error);
        for key in keys {
            let Some(e) = self.remove(&key) else { continue };
            match e.body {
                Body::Builtin(mut obj) => {
                    let caller = system_caller();
                    let mut ctx = Ctx::new(&caller, Token { conn: 0, req: 0 }, now, &mut out);
                    obj.drain_waiters(&mut ctx, error);
                }
                Body::User(u) => {
                    out.extend(u.calls.into_iter().map(|token| Delivery {
                        token,
                        reply: Err(error.clone()),
                    }));
                    if u.state != UserState::Stored {
                        self.forwards.push(Forward::Drop { key, object_id: u.id });
                    }
                }
            }
        }
        out
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

    /// The host of user-defined object `object_id` at `key` answered its oldest call (or its
    /// constructor). A reply about an object that is gone (deleted, lost, recreated) is
    /// dropped.
    pub fn complete(&mut self, key: &str, object_id: u64, reply: Reply, now: Instant) -> Vec<Delivery> {
        self.complete_with_state(key, object_id, reply, None, now)
    }

    /// [`complete`](Self::complete) with the object's pickled state after the call, which the
    /// host sends for a persistent object (unless the call never ran, or its state did not
    /// pickle). That state is logged with the reply (and the class's code before the first
    /// state of its version), so the reply waits for the record to be durable.
    pub fn complete_with_state(
        &mut self,
        key: &str,
        object_id: u64,
        mut reply: Reply,
        state: Option<Vec<u8>>,
        now: Instant,
    ) -> Vec<Delivery> {
        let mut out = Vec::new();
        // Why the object goes back to its last logged state after this call, if it does.
        let mut restore: Option<&str> = None;
        let persistent = match self.objects.get(key) {
            Some(Entry {
                body: Body::User(u),
                persistent,
                ..
            }) if u.id == object_id && !u.calls.is_empty() => *persistent,
            _ => return out,
        };
        if persistent {
            self.touched_persistent = true;
            self.preserve(key);
            let constructing = self
                .user_mut(key, object_id)
                .is_some_and(|u| u.state == UserState::Constructing);
            match state {
                Some(state) => {
                    if constructing {
                        if let Ok(v) = &mut reply {
                            *v = Value::Boolean(true);
                        }
                    }
                    if !(constructing && reply.is_err()) {
                        if let Err(len) = self.log_user_state(key, &reply, state) {
                            // Unloggable: the host's instance (and the calls sent to it
                            // after this one) go; the object keeps its last logged state.
                            reply = Err(Error::value(format!(
                                "the state of the persistent object '{key}' with this call's reply is {len} \
                                 bytes, over the {MAX_RECORD_LEN} an op-log record holds: this call did not \
                                 take effect and the object keeps its last acknowledged state"
                            )));
                            self.forwards.push(Forward::Drop {
                                key: key.to_string(),
                                object_id,
                            });
                            if !constructing {
                                restore = Some("an earlier call left a state too large to log");
                            }
                        }
                    }
                }
                // A host must send the state after a persistent object's constructor or call
                // returned: without it the change cannot be logged, so it is undone.
                None if reply.is_ok() => {
                    reply = Err(Error::new(
                        ErrorKind::Internal,
                        format!(
                            "the object host sent no state for the persistent object '{key}' (a server bug): this \
                             call did not take effect"
                        ),
                    ));
                    self.forwards.push(Forward::Drop {
                        key: key.to_string(),
                        object_id,
                    });
                    if !constructing {
                        restore = Some("an earlier call's state was not sent");
                    }
                }
                None => {}
            }
        }
        let Some(u) = self.user_mut(key, object_id) else {
            return out;
        };
        let Some(token) = u.calls.pop_front() else {
            return out;
        };
        match (&u.state, reply) {
            (UserState::Constructing, Ok(_)) => {
                u.state = UserState::Ready;
                out.push(Delivery {
                    token,
                    reply: Ok(Value::Boolean(true)),
                });
            }
            (UserState::Constructing, Err(e)) => {
                // No object is left; what was queued behind the constructor finds none.
                let type_name = u.type_name.clone();
                let message = format!(
                    "{type_name} '{key}' does not exist: its constructor failed ({}: {})",
                    e.kind.as_str(),
                    e.message
                );
                out.push(Delivery { token, reply: Err(e) });
                if let Some(Entry {
                    body: Body::User(u), ..
                }) = self.remove(key)
                {
                    let err = Error::new(ErrorKind::NotFound, message);
                    out.extend(u.calls.into_iter().map(|token| Delivery {
                        token,
                        reply: Err(err.clone()),
                    }));
                }
            }
            (_, reply) => out.push(Delivery { token, reply }),
        }
        self.settle(&out);
        if let Some(reason) = restore {
            out.extend(self.lose(key, object_id, reason, now));
        }
        out
    }

    /// The host of user-defined object `object_id` at `key` died: every call waiting for it
    /// is answered `ObjectLost`, and so is every later call until the key is deleted or
    /// constructed again. An object lost while constructing is gone, as if its constructor
    /// had raised. A persistent object is not lost: it goes back to its last logged state
    /// ([`UserState::Stored`]), its calls in flight are answered `ObjectLost` (they did not
    /// take effect), and the next call restores it in a host.
    pub fn lose(&mut self, key: &str, object_id: u64, reason: &str, _now: Instant) -> Vec<Delivery> {
        let mut out = Vec::new();
        let (u, persistent) = match self.objects.get_mut(key) {
            Some(Entry {
                body: Body::User(u),
                persistent,
                ..
            }) if u.id == object_id => (u, *persistent),
            _ => return out,
        };
        let stored = persistent && u.state == UserState::Ready;
        let err = match stored {
            true => user::lost_persistent(&u.type_name, key, reason),
            false => user::lost(&u.type_name, key, reason),
        };
        let calls = std::mem::take(&mut u.calls);
        // Their answers must not overtake those of calls whose records are being written.
        self.touched_persistent |= persistent;
        match u.state {
            UserState::Constructing => {
                self.remove(key);
            }
            // Still counted: its version stays held back from `define`.
            UserState::Ready if stored => u.state = UserState::Stored,
            UserState::Ready => {
                // No instance is left anywhere: it no longer holds its version back from `define`.
                uncount(&mut self.versions, u);
                u.state = UserState::Lost(reason.to_string());
            }
            // Lost already (its host's exit and a call that found no host both say so):
            // uncounted already. Stored: restored on its next call.
            UserState::Lost(_) | UserState::Stored => {}
        }
        out.extend(calls.into_iter().map(|token| Delivery {
            token,
            reply: Err(err.clone()),
        }));
        self.settle(&out);
        out
    }

    /// A call on user-defined object `object_id` reached its host slot, which holds no
    /// instance of it. While it constructs, the slot's record went with an answer already on
    /// its way (the constructor raised, or the host died): that answer settles its calls.
    /// Otherwise the object is lost, as in [`lose`](Self::lose).
    pub fn orphaned(&mut self, key: &str, object_id: u64, reason: &str, now: Instant) -> Vec<Delivery> {
        match self.user_mut(key, object_id) {
            Some(u) if u.state == UserState::Constructing => Vec::new(),
            _ => self.lose(key, object_id, reason, now),
        }
    }

    /// Log the state of persistent user-defined object `key` after its oldest call in flight
    /// (answered `reply`), preceded by its class's code the first time. `Err(len)`: the
    /// record would be over [`MAX_RECORD_LEN`]; nothing is logged.
    fn log_user_state(&mut self, key: &str, reply: &Reply, state: Vec<u8>) -> Result<(), usize> {
        let Some(Entry {
            body: Body::User(u),
            owner,
            ..
        }) = self.objects.get(key)
        else {
            return Ok(());
        };
        let Some(&token) = u.calls.front() else {
            return Ok(());
        };
        let class = (u.type_name.clone(), u.version.clone());
        let recorded = self.parked_seqs.get(&token).cloned();
        let record = encode_user_state(&UserStateRef {
            key,
            type_name: &u.type_name,
            version: &u.version,
            owner: owner.as_deref(),
            token,
            client: recorded.as_ref().map(|(c, _)| &**c),
            seq: recorded.as_ref().map_or(0, |(_, s)| *s),
            reply,
            state: &state,
        });
        if record.len() > MAX_RECORD_LEN {
            return Err(record.len());
        }
        let owner = owner.clone();
        if !self.classes.contains_key(&class) {
            if let Some(code) = self.unlogged_classes.remove(&class) {
                self.log(encode_class(&class.0, &class.1, &code));
                self.classes.insert(class, code);
            }
        }
        self.log(record);
        self.logged_hosted.insert(token);
        self.logged_clients.extend(owner);
        if let Some((client, _)) = recorded {
            self.logged_clients.insert(client);
        }
        self.highest_logged_conn = self.highest_logged_conn.max(token.conn);
        if let Some(Entry {
            body: Body::User(u), ..
        }) = self.objects.get_mut(key)
        {
            u.last_state = Some(state);
        }
        Ok(())
    }

    fn user_mut(&mut self, key: &str, object_id: u64) -> Option<&mut UserObject> {
        match self.objects.get_mut(key) {
            Some(Entry {
                body: Body::User(u), ..
            }) if u.id == object_id => Some(u),
            _ => None,
        }
    }

    /// The earliest deadline of a parked call, for the driver's timer.
    pub fn next_deadline(&self) -> Option<Instant> {
        let parked = self.timers.first_key_value().map(|((d, _), _)| *d);
        match self.next_txn_deadline() {
            Some(txn) => Some(parked.map_or(txn, |p| p.min(txn))),
            None => parked,
        }
    }

    /// Answer parked calls whose deadline has passed.
    pub fn tick(&mut self, now: Instant) -> Vec<Delivery> {
        self.expire_txns(now);
        let mut out = Vec::new();
        let caller = system_caller();
        while let Some(entry) = self.timers.first_entry() {
            if entry.key().0 > now {
                break;
            }
            let (key, token) = entry.remove();
            self.timer_of.remove(&token);
            self.preserve(&key);
            let Some((e, counted, meter)) = self.objects.get_metered(&key) else {
                continue;
            };
            let persistent = e.persistent;
            if let Some(obj) = e.body.builtin() {
                let before = out.len();
                let mut ctx = Ctx::new(&caller, token, now, &mut out);
                obj.expire(token, &mut ctx);
                // A parked call gone may take what it held (a put's item).
                meter.changed(counted, memory::object_size(&key, obj.size()));
                if persistent && out.len() > before {
                    self.log(Record::Expire { key, token }.encode());
                }
            }
        }
        self.settle(&out);
        out
    }

    /// The caller of a parked call gave up waiting (an interrupted client): answer the call now
    /// with its timeout result, as if its deadline had passed, so the connection stays in step
    /// and keeps what it holds. Returns the replies, the withdrawn call's among them if it was
    /// still parked on `key`. A call running in an object host cannot be withdrawn.
    pub fn withdraw(&mut self, token: Token, key: &str, now: Instant) -> Vec<Delivery> {
        let mut out = Vec::new();
        let caller = system_caller();
        // The call may have been answered by a change still being written: the `withdraw`
        // reply must not overtake that answer.
        self.touched_persistent |= self.storage != Storage::None;
        self.preserve(key);
        let Some((e, counted, meter)) = self.objects.get_metered(key) else {
            return out;
        };
        let persistent = e.persistent;
        if let Some(obj) = e.body.builtin() {
            let mut ctx = Ctx::new(&caller, token, now, &mut out);
            ctx.withdrawing = true;
            obj.expire(token, &mut ctx);
            meter.changed(counted, memory::object_size(key, obj.size()));
        }
        if persistent && !out.is_empty() {
            let key = key.to_string();
            self.log(Record::Expire { key, token }.encode());
        }
        self.settle(&out);
        out
    }

    /// A connection closed: drop its parked calls and release what it held.
    pub fn disconnect(&mut self, conn: ConnId, now: Instant) -> Vec<Delivery> {
        let mut out = Vec::new();
        if self.logged_conns.remove(&conn) {
            self.log(Record::Disconnect { conn }.encode());
        }
        let caller = system_caller();
        for key in self.conn_keys.remove(&conn).unwrap_or_default() {
            self.preserve(&key);
            if let Some((e, counted, meter)) = self.objects.get_metered(&key) {
                if let Some(obj) = e.body.builtin() {
                    let mut ctx = Ctx::new(&caller, Token { conn: 0, req: 0 }, now, &mut out);
                    obj.disconnect(conn, &mut ctx);
                    meter.changed(counted, memory::object_size(&key, obj.size()));
                }
            }
        }
        // Calls with an object host still run there: a retry must get their reply.
        let hosted = &self.hosted;
        self.parked_seqs.retain(|t, _| t.conn != conn || hosted.contains(t));
        self.parked_records.retain(|t, _| t.conn != conn);
        let timers = &mut self.timers;
        self.timer_of.retain(|t, at| {
            let keep = t.conn != conn;
            if !keep {
                timers.remove(at);
            }
            keep
        });
        out.retain(|d| d.token.conn != conn);
        self.settle(&out);
        out
    }

    /// A session ended: its unnamed objects go, and so does its reply log.
    pub fn end_session(&mut self, client: &str, now: Instant) -> Vec<Delivery> {
        self.end_txns(client);
        let mut out = Vec::new();
        if self.logged_clients.remove(client) {
            let client = client.to_string();
            self.log(Record::EndSession { client }.encode());
        }
        let doomed: Vec<String> = self
            .objects
            .iter()
            .filter(|(_, e)| e.owner.as_deref() == Some(client))
            .map(|(k, _)| k.to_string())
            .collect();
        for key in doomed {
            self.delete(&key, now, &mut out);
        }
        self.moved.retain(|_, (_, owner)| owner.as_deref() != Some(client));
        // Parked calls of other sessions answered NotFound keep exactly-once.
        self.settle(&out);
        if let Some(log) = self.logs.remove(client) {
            self.logs_bytes -= log.bytes;
        }
        // Its calls still running in object hosts are answered to closed connections; with
        // the session gone nobody can retry them, so their replies are not recorded.
        self.parked_seqs.retain(|_, (c, _)| **c != *client);
        out
    }

    /// Take an object out for `keep`. Refused while calls are parked on it.
    pub fn detach(&mut self, type_name: &str, key: &str) -> Result<Detached, Error> {
        let e = self
            .objects
            .get(key)
            .ok_or_else(|| Error::new(ErrorKind::NotFound, format!("{type_name} '{key}' does not exist")))?;
        check_type(key, e.body.type_name(), type_name)?;
        if e.persistent {
            return Err(persistent_keep(type_name, key));
        }
        let obj = match &e.body {
            Body::Builtin(obj) => obj,
            Body::User(_) => {
                return Err(Error::value(format!(
                    "a user-defined object stays under its key: {type_name} '{key}' cannot be kept \
                     under a new name; construct it with name= instead"
                )))
            }
        };
        if obj.has_waiters() {
            return Err(Error::new(
                ErrorKind::Busy,
                format!("{type_name} '{key}' has parked callers; keep it when none are waiting"),
            ));
        }
        if self.prepared_holder(key).is_some() {
            return Err(Error::new(
                ErrorKind::Busy,
                format!("{type_name} '{key}' is held by a transaction being committed; keep it once it is"),
            ));
        }
        let e = self.remove(key).expect("checked");
        let Body::Builtin(obj) = e.body else {
            unreachable!("checked above")
        };
        Ok(Detached { obj, owner: e.owner })
    }

    /// Put a detached object under `key`, owned by nobody. Gives it back if `key` is taken.
    pub fn attach(&mut self, key: &str, d: Detached) -> Result<(), (Error, Detached)> {
        if let Some(e) = self.objects.get(key) {
            let err = Error::new(
                ErrorKind::TypeMismatch,
                format!("'{key}' is already a {}", e.body.type_name()),
            );
            return Err((err, d));
        }
        self.moved.remove(key);
        self.objects.insert(
            key.to_string(),
            Entry {
                body: Body::Builtin(d.obj),
                owner: None,
                // `detach` refuses persistent objects.
                persistent: false,
                epoch: self.snapshot_epoch,
            },
        );
        Ok(())
    }

    /// Undo a detach whose attach failed. False (and the object dropped) if `key` was made
    /// anew meanwhile (only possible when the object was away from the shard's lock).
    #[must_use]
    pub fn restore(&mut self, key: &str, d: Detached) -> bool {
        if self.objects.contains_key(key) {
            return false;
        }
        self.objects.insert(
            key.to_string(),
            Entry {
                body: Body::Builtin(d.obj),
                owner: d.owner,
                persistent: false,
                epoch: self.snapshot_epoch,
            },
        );
        true
    }

    /// Leave a forwarding note at an old key after `keep` moved its object.
    pub fn set_moved(&mut self, old_key: &str, new_key: &str, owner: Option<Arc<str>>) {
        self.moved.insert(old_key.to_string(), (new_key.to_string(), owner));
    }

    /// `keep(obj)` without a new name: the object outlives its session.
    pub fn disown(&mut self, type_name: &str, key: &str) -> Result<(), Error> {
        let e = self
            .objects
            .get_mut(key)
            .ok_or_else(|| Error::new(ErrorKind::NotFound, format!("{type_name} '{key}' does not exist")))?;
        check_type(key, e.body.type_name(), type_name)?;
        if e.persistent && e.owner.is_some() {
            return Err(persistent_keep(type_name, key));
        }
        e.owner = None;
        Ok(())
    }
}

impl Detached {
    pub fn owner(&self) -> Option<Arc<str>> {
        self.owner.clone()
    }

    /// The object's type and state (its snapshot, [`crate::objects::snapshot`]), to move it
    /// to another node: `None` for a type whose state is who holds and who waits (a `Lock`,
    /// a `Barrier`...), which cannot leave its node's connections.
    pub fn encode(&self) -> Option<(&'static str, Value)> {
        self.obj.snapshot().map(|state| (self.obj.type_name(), state))
    }

    /// The inverse of [`Detached::encode`], on the node the object moves to (owned by
    /// nobody, as `keep` leaves it). A bad state is a `ValueError`.
    pub fn decode(type_name: &str, state: &Value) -> Result<Detached, Error> {
        Ok(Detached {
            obj: objects::snapshot::restore(type_name, state)?,
            owner: None,
        })
    }
}

fn storage_error(why: &str) -> Error {
    Error::new(
        ErrorKind::StorageError,
        format!(
            "persistent objects of this partition are read-only until the server restarts: the op log failed ({why})"
        ),
    )
}

/// `keep` moves objects between keys and sessions, which the op log does not record yet.
fn persistent_keep(type_name: &str, key: &str) -> Error {
    Error::value(format!(
        "persistent {type_name} '{key}' cannot be kept under a new name or outside its session yet; \
         construct it with name= instead"
    ))
}

/// Whether `e` is a persistent object a replay of the log would find.
fn is_durable(e: &Entry) -> bool {
    e.persistent
        && match &e.body {
            Body::User(u) => u.last_state.is_some(),
            Body::Builtin(_) => true,
        }
}

/// One user-defined object of its version less (deleted, or lost with its host).
fn uncount(versions: &mut HashMap<(String, String), usize>, u: &UserObject) {
    let key = (u.type_name.clone(), u.version.clone());
    if let Some(n) = versions.get_mut(&key) {
        *n -= 1;
        if *n == 0 {
            versions.remove(&key);
        }
    }
}

/// Queue a call on a user-defined object for its host.
fn forward_call(
    u: &mut UserObject,
    token: Token,
    key: &str,
    method: &str,
    args: Vec<Value>,
    next_object_id: &mut u64,
    forwards: &mut Vec<Forward>,
) -> Result<(), Error> {
    if method.starts_with('_') {
        return Err(Error::new(
            ErrorKind::UnknownMethod,
            format!(
                "{} has no shared method '{method}': private and special methods are not shared",
                u.type_name
            ),
        ));
    }
    let (args, kwargs) = user::parse_call_args(&u.type_name, method, args)?;
    if let UserState::Lost(reason) = &u.state {
        return Err(user::lost(&u.type_name, key, reason));
    }
    if u.state == UserState::Stored {
        // Rebuilt from its last logged state, under a new id: answers about the instance
        // its dead host held are dropped.
        *next_object_id += 1;
        u.id = *next_object_id;
        u.state = UserState::Ready;
        forwards.push(Forward::Restore {
            key: key.to_string(),
            object_id: u.id,
            type_name: u.type_name.clone(),
            version: u.version.clone(),
            state: u.last_state.clone().unwrap_or_default(),
        });
    }
    u.calls.push_back(token);
    forwards.push(Forward::Call {
        key: key.to_string(),
        object_id: u.id,
        type_name: u.type_name.clone(),
        method: method.to_string(),
        args,
        kwargs,
    });
    Ok(())
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

fn moved(key: &str, new_key: &str) -> Error {
    Error::new(ErrorKind::Moved, format!("'{key}' was kept as '{new_key}'")).with_data(Value::from(new_key))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::objects::testing::*;

    #[test]
    fn a_retried_call_gets_the_recorded_reply() {
        let mut p = Harness::new();
        p.create_ok("Counter", "c", vec![]);
        let (t, out) = p.call(&who(1), 7, "Counter", "c", "increment", vec![]);
        assert_eq!(value_of(&out, t), Value::from(1));
        // Same client and seq, even on another connection: not applied twice.
        let again = Caller { conn: 9, ..who(1) };
        let (t, out) = p.call(&again, 7, "Counter", "c", "increment", vec![]);
        assert_eq!(value_of(&out, t), Value::from(1));
        assert_eq!(p.ok("Counter", "c", "get", vec![]), Value::from(1));
        // seq 0 opts out; another client's seq 7 is its own.
        p.call(&who(1), 0, "Counter", "c", "increment", vec![]);
        let (t, out) = p.call(&who(2), 7, "Counter", "c", "increment", vec![]);
        assert_eq!(value_of(&out, t), Value::from(3));
    }

    #[test]
    fn a_call_acknowledging_replies_makes_the_partition_forget_them_but_never_its_own() {
        let mut p = Harness::new();
        p.create_ok("Counter", "c", vec![]);
        let increment = || Op::Call {
            type_name: "Counter".into(),
            key: "c".into(),
            method: "increment".into(),
            args: vec![],
        };
        // A client with one call in flight at a time acknowledges all before it.
        for seq in 1..=100 {
            let t = p.token(1);
            let out = p.p.apply(&who(1), t, seq, seq, increment(), p.now);
            assert_eq!(value_of(&out, t), Value::from(seq as i64));
        }
        let log = &p.p.logs["c1"];
        assert_eq!(
            (log.replies.len(), log.order.len()),
            (1, 1),
            "only the call in flight's"
        );
        // The unacknowledged call still gets its recorded reply when retried, even from a
        // client acknowledging it by mistake (`acked` above its own seq).
        for acked in [100, 500] {
            let t = p.token(1);
            let out = p.p.apply(&who(1), t, 100, acked, increment(), p.now);
            assert_eq!(value_of(&out, t), Value::from(100));
        }
        // An acknowledged call's reply is forgotten, and a stale copy of the call refused.
        let t = p.token(1);
        let out = p.p.apply(&who(1), t, 99, 0, increment(), p.now);
        assert_eq!(error_of(&out, t).kind, ErrorKind::ProtocolError);
        assert!(error_of(&out, t).message.contains("stale copy"));
        assert_eq!(p.ok("Counter", "c", "get", vec![]), Value::from(100));
        // Without `acked` (0) nothing is forgotten before the window is full.
        for seq in 1000..1100 {
            let t = p.token(2);
            p.p.apply(&who(2), t, seq, 0, increment(), p.now);
        }
        assert_eq!(p.p.logs["c2"].replies.len(), 100);
    }

    #[test]
    fn a_retry_of_a_call_whose_reply_was_forgotten_for_room_is_refused_not_run_again() {
        let mut p = Harness::new();
        p.p.set_reply_log_limit(1 << 10, usize::MAX);
        p.create_ok("Dict", "d", vec![]);
        let setdefault = |value: Value| Op::Call {
            type_name: "Dict".into(),
            key: "d".into(),
            method: "setdefault".into(),
            args: vec!["k".into(), value],
        };
        let big = Value::Binary(vec![1; 600]);
        // A session that never acknowledges: each 600-byte reply pushes the previous out.
        for seq in 1..=3 {
            let t = p.token(1);
            let out = p.p.apply(&who(1), t, seq, 0, setdefault(big.clone()), p.now);
            assert_eq!(value_of(&out, t), big);
        }
        assert!(p.p.logs["c1"].get(1).is_none(), "forgotten for room");
        let t = p.token(1);
        let out = p.p.apply(&who(1), t, 1, 0, setdefault(Value::Nil), p.now);
        let e = error_of(&out, t);
        assert_eq!(e.kind, ErrorKind::ProtocolError);
        assert!(
            e.message.contains("reply was forgotten") && e.message.contains("--max-reply-log"),
            "{e}"
        );
        // Still recorded: answered from the log. New calls run.
        let t = p.token(1);
        assert_eq!(
            value_of(&p.p.apply(&who(1), t, 3, 0, setdefault(Value::Nil), p.now), t),
            big
        );
        let t = p.token(1);
        assert_eq!(
            value_of(&p.p.apply(&who(1), t, 4, 0, setdefault(Value::Nil), p.now), t),
            big
        );
        // Acknowledged, the forgotten call is a stale copy, as any acknowledged one.
        let t = p.token(1);
        p.p.apply(&who(1), t, 5, 5, setdefault(Value::Nil), p.now);
        let t = p.token(1);
        let out = p.p.apply(&who(1), t, 1, 0, setdefault(Value::Nil), p.now);
        assert!(error_of(&out, t).message.contains("stale copy"));
        assert!(p.p.logs["c1"].forgotten.is_empty());
    }

    #[test]
    fn a_replica_replaying_the_log_forgets_the_same_replies() {
        let (mut live, now) = (Partition::new(), Instant::now());
        live.enable_storage();
        let create = Op::Create {
            type_name: "Counter".into(),
            key: "c".into(),
            args: vec![],
            owned: false,
            persistent: true,
        };
        live.apply(&who(1), Token { conn: 1, req: 1 }, 1, 0, create, now);
        for seq in 2..=50 {
            let op = Op::Call {
                type_name: "Counter".into(),
                key: "c".into(),
                method: "increment".into(),
                args: vec![],
            };
            // Two calls in flight: each acknowledges up to the one before it.
            live.apply(&who(1), Token { conn: 1, req: seq }, seq, seq - 1, op, now);
        }
        let mut replica = Partition::new();
        replica.enable_storage();
        for record in live.take_log().unwrap() {
            replica.replay(&record, now).unwrap();
        }
        let seqs = |p: &Partition| p.logs["c1"].replies.iter().map(|r| r.seq).collect::<Vec<_>>();
        assert_eq!(seqs(&live), [49, 50]);
        assert_eq!(seqs(&replica), seqs(&live));
    }

    #[test]
    fn a_reply_log_finds_every_kept_reply_whatever_the_order_of_its_calls() {
        let mut log = ReplyLog::default();
        // A client's calls may be recorded out of order (several threads, parked calls).
        for seq in [10, 3, 7] {
            log.record(seq, Ok(Value::from(seq)), true, usize::MAX);
        }
        for seq in [3, 7, 10] {
            assert_eq!(log.get(seq).map(|(r, _)| r), Some(Ok(Value::from(seq))), "seq {seq}");
        }
        assert!(log.get(11).is_none() && log.get(5).is_none());
        // Recording a seq again replaces its reply in place.
        log.record(7, Err(Error::value("again")), false, usize::MAX);
        assert_eq!(
            log.get(7).map(|(r, durable)| (r.is_err(), durable)),
            Some((true, false))
        );
        assert_eq!(log.durable().map(|(seq, _)| seq).collect::<Vec<_>>(), [10, 3]);
        // The oldest recorded are forgotten first, the newest kept.
        for seq in 11..11 + REPLY_LOG_LEN as u64 {
            log.record(seq, Ok(Value::Nil), false, usize::MAX);
        }
        assert!(log.get(10).is_none() && log.get(3).is_none());
        assert!(log.get(10 + REPLY_LOG_LEN as u64).is_some());
        assert!(log.get(11 + REPLY_LOG_LEN as u64).is_none());
        // A late call is kept as the newest: the oldest recorded (11) goes, not the lowest.
        log.record(5, Ok(Value::Nil), true, usize::MAX);
        assert!(log.get(5).is_some() && log.get(11).is_none() && log.get(12).is_some());
        assert_eq!(log.replies.len(), REPLY_LOG_LEN);
    }

    #[test]
    fn a_reply_log_forgets_the_oldest_recorded_past_its_bytes() {
        let mut log = ReplyLog::default();
        let big = || Ok(Value::Binary(vec![7; 1 << 20]));
        for seq in 1..=100 {
            log.record(seq, big(), false, 8 << 20);
            assert!(log.bytes <= (8 << 20) + (2 << 20), "{} bytes after {seq}", log.bytes);
        }
        assert!(log.get(100).is_some() && log.get(94).is_some(), "the newest are kept");
        assert!(log.get(90).is_none(), "the oldest are forgotten");
        // Acknowledging them all leaves nothing counted.
        log.acknowledge(101);
        assert_eq!(log.bytes, 0);
        // A reply larger than the limit is still recorded, alone.
        log.record(200, Ok(Value::Binary(vec![0; 9 << 20])), false, 8 << 20);
        log.record(201, Ok(Value::Nil), false, 8 << 20);
        assert!(log.get(200).is_none() && log.get(201).is_some());
    }

    #[test]
    fn all_clients_logs_together_stay_under_their_total_the_largest_forgetting_first() {
        let mut p = Partition::new();
        p.set_reply_log_limit(8 << 20, 20 << 20);
        let big = || Ok(Value::Binary(vec![7; 1 << 20]));
        let small: Arc<str> = Arc::from("small");
        p.record_reply(&small, 1, Ok(Value::from(1)), false);
        // Session after session, each filling its own log.
        for n in 0..10 {
            let client: Arc<str> = Arc::from(format!("c{n}"));
            for seq in 1..=8 {
                p.record_reply(&client, seq, big(), false);
            }
            let total: usize = p.logs.values().map(|log| log.bytes).sum();
            assert_eq!(total, p.logs_bytes);
            assert!(total <= 20 << 20, "{total} bytes after {n}");
        }
        assert!(p.logs["small"].get(1).is_some(), "a small log is left alone");
        assert!(p.logs["c9"].get(8).is_some(), "the newest reply is kept");
        // An ended session gives its bytes back.
        p.end_session("c9", Instant::now());
        assert_eq!(p.logs_bytes, p.logs.values().map(|log| log.bytes).sum::<usize>());
    }

    #[test]
    fn a_reply_log_answers_as_a_map_that_forgets_the_oldest_recorded_first() {
        // The model: what the log must answer, however its calls arrive.
        #[derive(Default)]
        struct Model {
            replies: BTreeMap<u64, (Reply, bool)>,
            order: VecDeque<u64>,
            forgotten: BTreeSet<u64>,
        }
        impl Model {
            fn record(&mut self, seq: u64, reply: Reply, durable: bool) {
                self.forgotten.remove(&seq);
                if self.replies.insert(seq, (reply, durable)).is_none() {
                    self.order.push_back(seq);
                    if self.order.len() > REPLY_LOG_LEN {
                        let old = self.order.pop_front().unwrap();
                        self.replies.remove(&old);
                        if self.forgotten.len() >= REPLY_LOG_LEN {
                            self.forgotten.pop_first();
                        }
                        self.forgotten.insert(old);
                    }
                }
            }
            fn acknowledge(&mut self, seq: u64) {
                self.replies.retain(|&s, _| s >= seq);
                self.order.retain(|&s| s >= seq);
                self.forgotten.retain(|&s| s >= seq);
            }
        }
        let mut state = 0x9e37_79b9_7f4a_7c15_u64;
        let mut rand = |n: u64| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state % n
        };
        let (mut log, mut model, mut next) = (ReplyLog::default(), Model::default(), 0_u64);
        for step in 0..3 * REPLY_LOG_LEN as u64 {
            // New calls, late ones, retries of old or forgotten ones, the lowest seqs.
            let seq = match rand(8) {
                0..=3 => {
                    next += 1 + rand(2);
                    next
                }
                4 | 5 => next.saturating_sub(rand(2 * REPLY_LOG_LEN as u64)),
                6 => rand(4),
                _ => next + rand(3),
            };
            // The last third also acknowledges (after the first two filled the log).
            if step > 2 * REPLY_LOG_LEN as u64 && rand(30) == 0 {
                let below = next.saturating_sub(rand(64));
                log.acknowledge(below);
                model.acknowledge(below);
                assert_eq!(log.order, model.order, "step {step}");
            } else if rand(10) < 6 {
                let reply = match rand(4) {
                    0 => Err(Error::value(format!("{step}"))),
                    _ => Ok(Value::from(step)),
                };
                let durable = rand(2) == 0;
                log.record(seq, reply.clone(), durable, usize::MAX);
                model.record(seq, reply, durable);
                assert!(log
                    .replies
                    .iter()
                    .zip(log.replies.iter().skip(1))
                    .all(|(a, b)| a.seq < b.seq));
                assert_eq!(log.order, model.order, "step {step}");
            } else {
                assert_eq!(
                    log.get(seq),
                    model.replies.get(&seq).cloned(),
                    "get({seq}), step {step}"
                );
                assert_eq!(
                    log.was_forgotten(seq),
                    model.forgotten.contains(&seq),
                    "was_forgotten({seq}), step {step}"
                );
            }
        }
        for seq in 0..=next + 2 {
            assert_eq!(log.get(seq), model.replies.get(&seq).cloned(), "get({seq})");
        }
        let durable: Vec<(u64, Reply)> = model
            .order
            .iter()
            .filter_map(|seq| match &model.replies[seq] {
                (reply, true) => Some((*seq, reply.clone())),
                _ => None,
            })
            .collect();
        assert_eq!(log.durable().collect::<Vec<_>>(), durable);
        assert!(
            log.replies.capacity() < 2 * REPLY_LOG_LEN,
            "the ring outgrew its length"
        );
    }

    #[test]
    fn a_parked_then_woken_call_is_recorded() {
        let mut p = Harness::new();
        p.create_ok("Queue", "q", vec![]);
        let (t, out) = p.call(&who(2), 5, "Queue", "q", "get", vec![]);
        assert!(out.is_empty());
        let (_, out) = p.call(&who(1), 1, "Queue", "q", "put", vec!["job".into()]);
        assert_eq!(value_of(&out, t), Value::from("job"));
        p.ok("Queue", "q", "put", vec!["other".into()]);
        // The retry must not take a second item.
        let (t, out) = p.call(&who(2), 5, "Queue", "q", "get", vec![]);
        assert_eq!(value_of(&out, t), Value::from("job"));
        assert_eq!(p.ok("Queue", "q", "qsize", vec![]), Value::from(1));
    }

    #[test]
    fn timed_out_and_withdrawn_calls() {
        let mut p = Harness::new();
        p.create_ok("Queue", "q", vec![]);
        let (t, _) = p.call(&who(2), 5, "Queue", "q", "get", vec![true.into(), 1.into()]);
        assert_eq!(p.p.next_deadline(), Some(p.now + std::time::Duration::from_secs(1)));
        assert_eq!(error_of(&p.advance(1.0), t).kind, ErrorKind::Empty);
        assert_eq!(p.p.next_deadline(), None);
        p.ok("Queue", "q", "put", vec!["x".into()]);
        let (t, out) = p.call(&who(2), 5, "Queue", "q", "get", vec![true.into(), 1.into()]);
        assert_eq!(error_of(&out, t).kind, ErrorKind::Empty, "the recorded timeout");
        // A call withdrawn by a disconnect was never answered: its retry runs.
        let (_, out) = p.call(&who(3), 6, "Queue", "q", "get", vec![]);
        assert_eq!(out.len(), 1);
        let (_, out) = p.call(&who(3), 7, "Queue", "q", "get", vec![true.into(), 100.into()]);
        assert!(out.is_empty());
        assert!(p.p.next_deadline().is_some());
        assert!(p.disconnect(3).is_empty());
        assert_eq!(p.p.next_deadline(), None, "the withdrawn call's timer goes with it");
        p.ok("Queue", "q", "put", vec!["y".into()]);
        let (t, out) = p.call(&who(3), 7, "Queue", "q", "get", vec![]);
        assert_eq!(value_of(&out, t), Value::from("y"));
    }

    #[test]
    fn timers_of_answered_calls_go_away() {
        let mut p = Harness::new();
        p.create_ok("Lock", "l", vec![]);
        p.ok("Lock", "l", "acquire", vec![]);
        for _ in 0..100 {
            p.park(2, "Lock", "l", "acquire", vec![true.into(), 3600.into()]);
            p.ok("Lock", "l", "release", vec![]);
            p.ok_as(&who(2), "Lock", "l", "release", vec![]);
            p.ok("Lock", "l", "acquire", vec![]);
        }
        assert_eq!(p.p.timers.len(), 0);
        assert_eq!(p.p.next_deadline(), None);
    }

    #[test]
    fn ending_a_session_deletes_its_unnamed_objects() {
        let mut p = Harness::new();
        let owner = who(1);
        let op = Op::Create {
            type_name: "Event".into(),
            key: "~c1.1".into(),
            args: vec![],
            owned: true,
            persistent: false,
        };
        let t0 = p.token(1);
        p.p.apply(&owner, t0, 1, 0, op, p.now);
        let (t, out) = p.call(&who(2), 3, "Event", "~c1.1", "wait", vec![]);
        assert!(out.is_empty());
        let out = p.p.end_session("c1", p.now);
        assert_eq!(error_of(&out, t).kind, ErrorKind::NotFound);
        assert_eq!(p.err("Event", "~c1.1", "is_set", vec![]).kind, ErrorKind::NotFound);
        assert!(p.p.is_empty());
    }

    #[test]
    fn a_withdrawn_call_gets_its_timeout_result_and_its_connection_keeps_its_lock() {
        let mut h = Harness::new();
        h.create_ok("Lock", "l", vec![]);
        h.create_ok("Queue", "q", vec![]);
        h.create_ok("Barrier", "b", vec![2.into()]);
        assert_eq!(h.ok_as(&who(1), "Lock", "l", "acquire", vec![]), Value::Boolean(true));
        // Connection 1 waits on an empty queue with no timeout, then gives up.
        let get = h.park(1, "Queue", "q", "get", vec![]);
        let out = h.withdraw(get, "q");
        assert_eq!(error_of(&out, get).kind, ErrorKind::Empty);
        assert_eq!(h.ok("Lock", "l", "locked", vec![]), Value::Boolean(true));
        // The withdrawn get takes nothing: the next item waits for the next get.
        h.ok("Queue", "q", "put", vec![7.into()]);
        assert_eq!(h.ok("Queue", "q", "qsize", vec![]), Value::from(1));
        // Withdrawing what is not parked (answered already, or unknown) does nothing.
        assert!(h.withdraw(get, "q").is_empty());
        assert!(h.withdraw(get, "missing").is_empty());
        // A barrier party that gives up breaks the barrier, as an interrupted threading wait does.
        let wait = h.park(2, "Barrier", "b", "wait", vec![]);
        assert_eq!(error_of(&h.withdraw(wait, "b"), wait).kind, ErrorKind::BrokenBarrier);
        let lock_wait = h.park(3, "Lock", "l", "acquire", vec![]);
        assert_eq!(value_of(&h.withdraw(lock_wait, "l"), lock_wait), Value::Boolean(false));
    }

    mod user_objects {
        use super::*;
        use crate::objects::user::Forward;

        const T: &str = "py:__main__.Centroids";

        fn ctor(version: &str, args: Vec<Value>) -> Vec<Value> {
            vec![version.into(), Value::Array(args), Value::Map(vec![])]
        }

        fn margs(args: Vec<Value>) -> Vec<Value> {
            vec![Value::Array(args), Value::Map(vec![])]
        }

        /// Send `create` of a user-defined object; returns its token and immediate replies.
        fn create(
            h: &mut Harness,
            caller: &Caller,
            seq: u64,
            key: &str,
            args: Vec<Value>,
            owned: bool,
        ) -> (Token, Vec<Delivery>) {
            let token = h.token(caller.conn);
            let op = Op::Create {
                type_name: T.into(),
                key: key.into(),
                args,
                owned,
                persistent: false,
            };
            let out = h.p.apply(caller, token, seq, 0, op, h.now);
            (token, out)
        }

        /// Construct `key` (version v1) and let its host succeed; returns its object id.
        fn constructed(h: &mut Harness, key: &str) -> u64 {
            let (t, out) = create(h, &who(1), 0, key, ctor("v1", vec![]), false);
            assert!(out.is_empty(), "create parks until the host answers");
            let id = match h.p.take_forwards().as_slice() {
                [Forward::Construct { object_id, .. }] => *object_id,
                other => panic!("expected one Construct, got {other:?}"),
            };
            let out = h.p.complete(key, id, Ok(Value::Nil), h.now);
            assert_eq!(value_of(&out, t), Value::Boolean(true));
            id
        }

        #[test]
        fn create_and_calls_go_to_the_host_in_order() {
            let mut h = Harness::new();
            let (create_t, out) = create(&mut h, &who(1), 1, "c", ctor("v1", vec![3.into()]), false);
            assert!(out.is_empty());
            // A call while constructing queues behind the constructor.
            let (call_t, out) = h.call(&who(2), 1, T, "c", "update", margs(vec![1.into()]));
            assert!(out.is_empty());
            let forwards = h.p.take_forwards();
            let id = forwards[0].object_id();
            assert_eq!(
                forwards,
                vec![
                    Forward::Construct {
                        key: "c".into(),
                        object_id: id,
                        type_name: T.into(),
                        version: "v1".into(),
                        args: vec![3.into()],
                        kwargs: Value::Map(vec![]),
                        persistent: false,
                    },
                    Forward::Call {
                        key: "c".into(),
                        object_id: id,
                        type_name: T.into(),
                        method: "update".into(),
                        args: vec![1.into()],
                        kwargs: Value::Map(vec![]),
                    },
                ]
            );
            assert!(h.p.take_forwards().is_empty());
            assert_eq!(
                value_of(&h.p.complete("c", id, Ok(Value::Nil), h.now), create_t),
                Value::Boolean(true)
            );
            assert_eq!(
                value_of(&h.p.complete("c", id, Ok(7.into()), h.now), call_t),
                Value::from(7)
            );
            // Nothing in flight: a stray reply is dropped.
            assert!(h.p.complete("c", id, Ok(8.into()), h.now).is_empty());
            assert_eq!(h.p.objects("", false), vec![("c".to_string(), T.to_string())]);
            assert_eq!(
                (
                    h.p.hosted_objects(),
                    h.p.count_version(T, "v1"),
                    h.p.count_version(T, "v2")
                ),
                (1, 1, 0)
            );
            // The create was recorded: a retry says `true` again without constructing.
            let (t, out) = create(&mut h, &who(1), 1, "c", ctor("v1", vec![]), false);
            assert_eq!(value_of(&out, t), Value::Boolean(true));
            assert!(h.p.take_forwards().is_empty());
        }

        #[test]
        fn objects_of_a_version_name_their_owners() {
            let mut h = Harness::new();
            constructed(&mut h, "named");
            create(&mut h, &who(1), 2, "~c1.1", ctor("v1", vec![]), true);
            let mut found = h.p.objects_of_version(T, "v1");
            found.sort();
            assert_eq!(
                found,
                vec![
                    ("named".to_string(), None),
                    ("~c1.1".to_string(), Some(Arc::from("c1")))
                ]
            );
            assert!(h.p.objects_of_version(T, "v2").is_empty());
            h.p.end_session("c1", h.now);
            assert_eq!(h.p.objects_of_version(T, "v1"), vec![("named".to_string(), None)]);
        }

        #[test]
        fn create_of_an_existing_key() {
            let mut h = Harness::new();
            let (_, out) = create(&mut h, &who(1), 0, "c", ctor("v1", vec![]), false);
            assert!(out.is_empty());
            h.p.take_forwards();
            // While constructing, as after: `false` at once, nothing forwarded.
            let (t, out) = create(&mut h, &who(2), 0, "c", ctor("v1", vec![]), false);
            assert_eq!(value_of(&out, t), Value::Boolean(false));
            let (t, out) = create(&mut h, &who(2), 0, "c", ctor("v2", vec![]), false);
            let e = error_of(&out, t);
            assert_eq!(e.kind, ErrorKind::TypeMismatch);
            assert_eq!(e.message, format!("'c' is a {T} of version v1, not of version v2"));
            assert!(h.p.take_forwards().is_empty());
            h.create_ok("Counter", "n", vec![]);
            let (t, out) = create(&mut h, &who(2), 0, "n", ctor("v1", vec![]), false);
            assert_eq!(error_of(&out, t).kind, ErrorKind::TypeMismatch);
            assert_eq!(h.err(T, "n", "get", margs(vec![])).kind, ErrorKind::TypeMismatch);
            assert_eq!(h.err("Counter", "c", "get", vec![]).kind, ErrorKind::TypeMismatch);
            for bad in [
                vec![],
                vec!["v1".into()],
                vec!["v1".into(), Value::Nil, Value::Map(vec![])],
            ] {
                let (t, out) = create(&mut h, &who(2), 0, "d", bad, false);
                assert_eq!(error_of(&out, t).kind, ErrorKind::BadArguments);
            }
            assert!(h.p.take_forwards().is_empty());
        }

        #[test]
        fn a_failed_constructor_leaves_no_object() {
            let mut h = Harness::new();
            let (create_t, _) = create(&mut h, &who(1), 0, "c", ctor("v1", vec![]), false);
            let (call_t, _) = h.call(&who(2), 3, T, "c", "update", margs(vec![]));
            let id = h.p.take_forwards()[0].object_id();
            let raised = Error::new(ErrorKind::Raised, "ValueError: k must be positive");
            let out = h.p.complete("c", id, Err(raised.clone()), h.now);
            assert_eq!(error_of(&out, create_t), raised);
            let e = error_of(&out, call_t);
            assert_eq!(e.kind, ErrorKind::NotFound);
            assert!(
                e.message
                    .contains("its constructor failed (Raised: ValueError: k must be positive)"),
                "{e}"
            );
            assert!(h.p.is_empty());
            assert_eq!(h.p.hosted_objects(), 0);
            // The host still answers the queued call (it holds no such key): dropped.
            assert!(h
                .p
                .complete("c", id, Err(Error::new(ErrorKind::NotFound, "no")), h.now)
                .is_empty());
            assert_eq!(h.err(T, "c", "update", margs(vec![])).kind, ErrorKind::NotFound);
        }

        #[test]
        fn private_methods_and_bad_arguments_never_reach_the_host() {
            let mut h = Harness::new();
            constructed(&mut h, "c");
            let e = h.err(T, "c", "_secret", margs(vec![]));
            assert_eq!(e.kind, ErrorKind::UnknownMethod);
            assert!(e.message.contains("private and special methods are not shared"), "{e}");
            assert_eq!(
                h.err(T, "c", "__reduce__", margs(vec![])).kind,
                ErrorKind::UnknownMethod
            );
            assert_eq!(h.err(T, "c", "update", vec![]).kind, ErrorKind::BadArguments);
            assert!(h.p.take_forwards().is_empty());
        }

        #[test]
        fn a_lost_object_answers_object_lost_until_constructed_again() {
            let mut h = Harness::new();
            let id = constructed(&mut h, "c");
            let (a, _) = h.call(&who(1), 0, T, "c", "update", margs(vec![]));
            let (b, _) = h.call(&who(2), 4, T, "c", "update", margs(vec![]));
            assert_eq!(h.p.take_forwards().len(), 2);
            let reason = "its object host exited with status 3";
            let out = h.p.lose("c", id, reason, h.now);
            assert_eq!(tokens(&out), vec![a, b]);
            let e = error_of(&out, b);
            assert_eq!(e.kind, ErrorKind::ObjectLost);
            assert_eq!(e.data, Value::Map(vec![("reason".into(), reason.into())]));
            // Later calls are not forwarded; the retry of b gets its recorded reply.
            assert_eq!(h.err(T, "c", "update", margs(vec![])).kind, ErrorKind::ObjectLost);
            let (t, out) = h.call(&who(2), 4, T, "c", "update", margs(vec![]));
            assert_eq!(error_of(&out, t).kind, ErrorKind::ObjectLost);
            assert!(h.p.take_forwards().is_empty());
            assert_eq!(h.p.len(), 1, "a lost object keeps its key");
            assert_eq!(
                (h.p.hosted_objects(), h.p.count_version(T, "v1")),
                (0, 0),
                "but holds no instance"
            );
            // A create constructs a fresh object under a new id (of the version defined now);
            // the old id's replies are dropped.
            let (t, out) = create(&mut h, &who(1), 0, "c", ctor("v2", vec![]), false);
            assert!(out.is_empty());
            let new_id = h.p.take_forwards()[0].object_id();
            assert_ne!(new_id, id);
            assert!(h.p.complete("c", id, Ok(Value::Nil), h.now).is_empty());
            assert!(h.p.lose("c", id, "late", h.now).is_empty());
            assert_eq!(
                value_of(&h.p.complete("c", new_id, Ok(Value::Nil), h.now), t),
                Value::Boolean(true)
            );
            assert_eq!((h.p.hosted_objects(), h.p.count_version(T, "v2")), (1, 1));
            // Deleting it after it was lost again counts nothing twice.
            h.p.lose("c", new_id, "gone", h.now);
            h.delete("c");
            assert_eq!((h.p.len(), h.p.hosted_objects()), (0, 0));
        }

        #[test]
        fn an_object_lost_while_constructing_is_gone() {
            let mut h = Harness::new();
            let (create_t, _) = create(&mut h, &who(1), 0, "c", ctor("v1", vec![]), false);
            let (call_t, _) = h.call(&who(2), 0, T, "c", "update", margs(vec![]));
            let id = h.p.take_forwards()[0].object_id();
            let out = h.p.lose("c", id, "its object host did not connect within 30 s", h.now);
            assert_eq!(error_of(&out, create_t).kind, ErrorKind::ObjectLost);
            assert_eq!(error_of(&out, call_t).kind, ErrorKind::ObjectLost);
            assert!(h.p.is_empty());
            assert_eq!(h.p.hosted_objects(), 0);
        }

        #[test]
        fn a_call_resent_while_in_flight_runs_once() {
            let mut h = Harness::new();
            let id = constructed(&mut h, "c");
            let first = Caller { conn: 1, ..who(5) };
            let (t1, out) = h.call(&first, 9, T, "c", "update", margs(vec![]));
            assert!(out.is_empty());
            assert_eq!(h.p.take_forwards().len(), 1);
            // The client reconnects and resends: not forwarded again.
            let again = Caller { conn: 2, ..who(5) };
            let (t2, out) = h.call(&again, 9, T, "c", "update", margs(vec![]));
            assert!(out.is_empty());
            assert!(h.p.take_forwards().is_empty());
            let out = h.p.complete("c", id, Ok(42.into()), h.now);
            assert_eq!(tokens(&out), vec![t2], "the resent call takes the first one's place");
            assert_ne!(t1, t2);
            let (t3, out) = h.call(&again, 9, T, "c", "update", margs(vec![]));
            assert_eq!(value_of(&out, t3), Value::from(42));
            // A retried create while constructing takes over the same way.
            let (c1, _) = create(&mut h, &first, 10, "d", ctor("v1", vec![]), false);
            let (c2, out) = create(&mut h, &again, 10, "d", ctor("v1", vec![]), false);
            assert!(out.is_empty());
            let d = h.p.take_forwards()[0].object_id();
            assert_eq!(tokens(&h.p.complete("d", d, Ok(Value::Nil), h.now)), vec![c2]);
            assert_ne!(c1, c2);
        }

        #[test]
        fn a_disconnect_keeps_the_reply_of_a_call_the_host_runs() {
            let mut h = Harness::new();
            let id = constructed(&mut h, "c");
            let (_, out) = h.call(&who(3), 9, T, "c", "update", margs(vec![]));
            assert!(out.is_empty());
            assert_eq!(h.p.take_forwards().len(), 1);
            assert!(h.disconnect(3).is_empty());
            // The reply goes to the closed connection (the server drops it) and is recorded.
            assert_eq!(h.p.complete("c", id, Ok(5.into()), h.now).len(), 1);
            let back = Caller { conn: 4, ..who(3) };
            let (t, out) = h.call(&back, 9, T, "c", "update", margs(vec![]));
            assert_eq!(value_of(&out, t), Value::from(5));
            assert!(h.p.take_forwards().is_empty());
        }

        #[test]
        fn delete_and_session_end_drain_calls_and_drop_the_instance() {
            let mut h = Harness::new();
            let id = constructed(&mut h, "c");
            let (t, _) = h.call(&who(2), 0, T, "c", "update", margs(vec![]));
            h.p.take_forwards();
            let out = h.delete("c");
            assert_eq!(error_of(&out, t).kind, ErrorKind::NotFound);
            assert_eq!(
                h.p.take_forwards(),
                vec![Forward::Drop {
                    key: "c".into(),
                    object_id: id
                }]
            );
            assert_eq!(h.p.hosted_objects(), 0);
            // The host's late answer about the deleted object is dropped.
            assert!(h.p.complete("c", id, Ok(1.into()), h.now).is_empty());
            // An unnamed object goes with its session, constructing or not.
            let (t, _) = create(&mut h, &who(1), 0, "~c1.1", ctor("v1", vec![]), true);
            let id = h.p.take_forwards()[0].object_id();
            let out = h.p.end_session("c1", h.now);
            assert_eq!(error_of(&out, t).kind, ErrorKind::NotFound);
            assert_eq!(
                h.p.take_forwards(),
                vec![Forward::Drop {
                    key: "~c1.1".into(),
                    object_id: id
                }]
            );
            assert!(h.p.is_empty());
        }

        #[test]
        fn keep_detaches_but_never_renames() {
            let mut h = Harness::new();
            let (t, _) = create(&mut h, &who(1), 0, "~c1.1", ctor("v1", vec![]), true);
            let id = h.p.take_forwards()[0].object_id();
            h.p.complete("~c1.1", id, Ok(Value::Nil), h.now);
            let e = h.p.detach(T, "~c1.1").err().expect("refused");
            assert_eq!(e.kind, ErrorKind::ValueError);
            assert!(e.message.contains("construct it with name= instead"), "{e}");
            assert_eq!(h.p.disown(T, "~c1.1"), Ok(()));
            assert!(h.p.end_session("c1", h.now).is_empty());
            assert_eq!(h.p.len(), 1, "kept: it outlives its session");
            assert_ne!(t.req, 0);
        }

        #[test]
        fn an_object_lost_twice_is_uncounted_once() {
            // Its host's exit and a call that found no host both report the loss.
            let mut h = Harness::new();
            let a = constructed(&mut h, "a");
            constructed(&mut h, "b");
            assert_eq!(h.p.count_version(T, "v1"), 2);
            let (t, _) = h.call(&who(1), 0, T, "a", "update", margs(vec![]));
            let out = h.p.lose("a", a, "its object host exited with status 1", h.now);
            assert_eq!(error_of(&out, t).kind, ErrorKind::ObjectLost);
            assert!(h
                .p
                .lose("a", a, "its object host exited with status 1", h.now)
                .is_empty());
            assert_eq!(
                (h.p.count_version(T, "v1"), h.p.hosted_objects()),
                (1, 1),
                "b still holds v1 back from define"
            );
            h.delete("a");
            assert_eq!(h.p.count_version(T, "v1"), 1);
        }

        #[test]
        fn a_call_that_finds_no_instance_while_constructing_waits_for_the_constructor() {
            // The host answered the constructor with an exception (so it holds no instance)
            // while a call was being applied: the constructor's answer is on its way.
            let mut h = Harness::new();
            let (create_t, _) = create(&mut h, &who(1), 0, "c", ctor("v1", vec![]), false);
            let (call_t, _) = h.call(&who(2), 0, T, "c", "update", margs(vec![]));
            let id = h.p.take_forwards()[0].object_id();
            assert!(h.p.orphaned("c", id, "its object host stopped", h.now).is_empty());
            let raised = Error::new(ErrorKind::Raised, "ValueError: k must be positive");
            let out = h.p.complete("c", id, Err(raised.clone()), h.now);
            assert_eq!(error_of(&out, create_t), raised);
            assert_eq!(error_of(&out, call_t).kind, ErrorKind::NotFound);
            // A constructed object no host holds is lost, as before.
            let id = constructed(&mut h, "d");
            let (t, _) = h.call(&who(2), 0, T, "d", "update", margs(vec![]));
            let out = h.p.orphaned("d", id, "its object host exited with status 1", h.now);
            assert_eq!(error_of(&out, t).kind, ErrorKind::ObjectLost);
        }

        #[test]
        fn an_ended_session_keeps_no_reply_log_for_calls_still_in_flight() {
            let mut h = Harness::new();
            let id = constructed(&mut h, "c");
            let (_, out) = h.call(&who(3), 9, T, "c", "update", margs(vec![]));
            assert!(out.is_empty());
            assert!(h.disconnect(3).is_empty());
            assert!(h.p.end_session("c3", h.now).is_empty());
            // The host answers after the session is gone: nobody can retry it any more.
            assert_eq!(h.p.complete("c", id, Ok(5.into()), h.now).len(), 1);
            assert!(h.p.logs.is_empty(), "a log for an ended session");
            assert!(h.p.parked_seqs.is_empty() && h.p.hosted.is_empty());
        }

        mod persistent {
            use super::*;

            /// A harness whose partition logs, and a persistent create of `key` (class code
            /// offered first, as the server does).
            fn durable() -> Harness {
                let mut h = Harness::new();
                h.p.enable_storage();
                h
            }

            fn create_p(h: &mut Harness, caller: &Caller, seq: u64, key: &str, owned: bool) -> (Token, Vec<Delivery>) {
                h.p.offer_class(T, "v1", &Arc::new(vec![0xc0, 0xde]));
                let token = h.token(caller.conn);
                let op = Op::Create {
                    type_name: T.into(),
                    key: key.into(),
                    args: ctor("v1", vec![]),
                    owned,
                    persistent: true,
                };
                let out = h.p.apply(caller, token, seq, 0, op, h.now);
                (token, out)
            }

            fn decode_all(log: &[Vec<u8>]) -> Vec<Record> {
                log.iter().map(|r| Record::decode(r).expect("decodes")).collect()
            }

            /// Construct persistent `key` with state `s0`; returns its id and the records.
            fn constructed_p(h: &mut Harness, key: &str) -> (u64, Vec<Vec<u8>>) {
                let (t, out) = create_p(h, &who(1), 1, key, false);
                assert!(out.is_empty());
                assert_eq!(h.p.take_log(), Some(vec![]), "the create itself is not logged");
                let id = match h.p.take_forwards().as_slice() {
                    [Forward::Construct {
                        object_id,
                        persistent: true,
                        ..
                    }] => *object_id,
                    other => panic!("expected one persistent Construct, got {other:?}"),
                };
                let out =
                    h.p.complete_with_state(key, id, Ok(Value::Nil), Some(b"s0".to_vec()), h.now);
                assert_eq!(value_of(&out, t), Value::Boolean(true));
                (id, h.p.take_log().expect("logged"))
            }

            #[test]
            fn a_persistent_user_object_needs_a_data_directory() {
                let mut h = Harness::new();
                let (t, out) = create_p(&mut h, &who(1), 1, "c", false);
                let e = error_of(&out, t);
                assert_eq!(e.kind, ErrorKind::ValueError);
                assert!(e.message.contains("no --data-dir"), "{e}");
                assert!(h.p.take_forwards().is_empty() && h.p.is_empty());
            }

            #[test]
            fn complete_logs_the_class_once_then_the_state_with_the_reply() {
                let mut h = durable();
                let (id, log) = constructed_p(&mut h, "c");
                assert_eq!(
                    decode_all(&log),
                    vec![
                        Record::Class {
                            type_name: T.into(),
                            version: "v1".into(),
                            code: vec![0xc0, 0xde]
                        },
                        Record::UserState {
                            key: "c".into(),
                            type_name: T.into(),
                            version: "v1".into(),
                            owner: None,
                            token: Token { conn: 1, req: 1 },
                            client: Some("c1".into()),
                            seq: 1,
                            reply: Ok(Value::Boolean(true)),
                            state: b"s0".to_vec(),
                        },
                    ]
                );
                assert_eq!(h.p.persistent_len(), 1);
                // A method that raises logs its state too, with its error as the reply.
                let (t, _) = h.call(&who(2), 7, T, "c", "update", margs(vec![]));
                assert_eq!(h.p.take_log(), Some(vec![]), "a call waits for the log, unlogged");
                let raised = Error::new(ErrorKind::Raised, "ValueError: no");
                let out =
                    h.p.complete_with_state("c", id, Err(raised.clone()), Some(b"s1".to_vec()), h.now);
                assert_eq!(error_of(&out, t), raised);
                let log = decode_all(&h.p.take_log().expect("logged"));
                assert!(
                    matches!(&log[..], [Record::UserState { seq: 7, reply: Err(e), state, .. }]
                        if *e == raised && state == b"s1"),
                    "{log:?}"
                );
                // A call whose state did not pickle logs nothing (the host kept the last one).
                let (t, _) = h.call(&who(2), 8, T, "c", "update", margs(vec![]));
                let e = Error::new(ErrorKind::Raised, "TypeError: cannot pickle the state");
                let out = h.p.complete_with_state("c", id, Err(e.clone()), None, h.now);
                assert_eq!(error_of(&out, t), e);
                assert_eq!(h.p.take_log(), Some(vec![]));
                assert_eq!(h.p.stored_user_objects()[0].state, b"s1".to_vec());
                assert_eq!(h.p.classes().len(), 1);
            }

            #[test]
            fn replay_rebuilds_a_stored_object_and_its_replies() {
                let mut h = durable();
                let (id, mut log) = constructed_p(&mut h, "c");
                let (_, _) = h.call(&who(2), 7, T, "c", "update", margs(vec![]));
                h.p.take_forwards();
                h.p.complete_with_state("c", id, Ok(41.into()), Some(b"s1".to_vec()), h.now);
                log.extend(h.p.take_log().unwrap());
                // An unnamed one, owned by session c3.
                let (_, _) = create_p(&mut h, &who(3), 1, "~c3.1", true);
                let id3 = h.p.take_forwards()[0].object_id();
                h.p.complete_with_state("~c3.1", id3, Ok(Value::Nil), Some(b"u0".to_vec()), h.now);
                log.extend(h.p.take_log().unwrap());

                let mut r = Partition::new();
                r.enable_storage();
                for rec in &log {
                    r.replay(rec, h.now).unwrap();
                }
                assert_eq!(r.stored_user_objects(), h.p.stored_user_objects());
                assert_eq!(r.stored_user_objects().len(), 2);
                assert_eq!(r.class_code(T, "v1").map(|c| c.to_vec()), Some(vec![0xc0, 0xde]));
                assert!(r.take_forwards().is_empty(), "nothing runs in a host during replay");
                assert_eq!(r.count_version(T, "v1"), 2, "stored objects hold their version");
                assert_eq!(r.objects("", true), vec![("c".to_string(), T.to_string())]);
                let mut h2 = Harness::new();
                h2.p = r;
                // The retried call gets its recorded reply; nothing reaches a host.
                let (t, out) = h2.call(&who(2), 7, T, "c", "update", margs(vec![]));
                assert_eq!(value_of(&out, t), Value::from(41));
                let (t, out) = create_p(&mut h2, &who(1), 1, "c", false);
                assert_eq!(value_of(&out, t), Value::Boolean(true));
                assert!(h2.p.take_forwards().is_empty());
                // The owner's session end is logged, and deletes its object.
                assert!(h2.p.end_session("c3", h2.now).is_empty());
                let log = decode_all(&h2.p.take_log().unwrap());
                assert!(log.contains(&Record::EndSession { client: "c3".into() }), "{log:?}");
                assert_eq!(h2.p.stored_user_objects().len(), 1);
                assert!(h2.p.take_forwards().is_empty(), "a stored object is in no host");
            }

            #[test]
            fn a_partition_snapshot_carries_stored_objects_classes_and_their_replies() {
                let mut h = durable();
                let (id, mut log) = constructed_p(&mut h, "c");
                // Constructing at the moment: left to the log.
                let (_, _) = create_p(&mut h, &who(3), 1, "late", false);
                let late = h.p.take_forwards()[0].object_id();
                log.extend(h.p.take_log().unwrap_or_default());
                let at = log.len();
                let mut body = h.p.begin_snapshot();
                // A call completes before the capture reaches the object: copy on write.
                h.call(&who(2), 7, T, "c", "update", margs(vec![]));
                h.p.take_forwards();
                h.p.complete_with_state("c", id, Ok(41.into()), Some(b"s1".to_vec()), h.now);
                h.p.complete_with_state("late", late, Ok(Value::Nil), Some(b"L0".to_vec()), h.now);
                log.extend(h.p.take_log().unwrap());
                body.extend(h.p.snapshot_chunk(usize::MAX).unwrap().0);

                let restore = |tail: &[Vec<u8>]| {
                    let mut r = Partition::new();
                    r.enable_storage();
                    r.restore_snapshot(&mut &body[..], h.now).unwrap();
                    for rec in tail {
                        r.replay(rec, h.now).unwrap();
                    }
                    r
                };
                let at_moment = restore(&[]);
                let stored = at_moment.stored_user_objects();
                assert_eq!(stored.len(), 1, "only the acknowledged object");
                assert_eq!((stored[0].key.as_str(), stored[0].state.as_slice()), ("c", &b"s0"[..]));
                assert_eq!(
                    at_moment.class_code(T, "v1").map(|c| c.to_vec()),
                    Some(vec![0xc0, 0xde])
                );
                let r = restore(&log[at..]);
                let mut full = Partition::new();
                full.enable_storage();
                for rec in &log {
                    full.replay(rec, h.now).unwrap();
                }
                assert_eq!(r.stored_user_objects(), h.p.stored_user_objects());
                assert_eq!(r.stored_user_objects(), full.stored_user_objects());
                assert_eq!(r.durable_replies(), full.durable_replies());
                // Live, the completed call's reply is recorded as durable too.
                assert_eq!(h.p.durable_replies(), full.durable_replies());
            }

            #[test]
            fn nothing_about_an_object_still_constructing_is_logged() {
                let mut h = durable();
                create_p(&mut h, &who(1), 1, "k", false);
                h.p.take_forwards();
                h.p.take_log();
                // A replay finds no object at `k`: a logged create there would make one, a
                // logged delete would answer otherwise.
                let token = h.token(2);
                let op = Op::Create {
                    type_name: "Counter".into(),
                    key: "k".into(),
                    args: vec![],
                    owned: false,
                    persistent: true,
                };
                let out = h.p.apply(&who(2), token, 1, 0, op, h.now);
                assert_eq!(error_of(&out, token).kind, ErrorKind::TypeMismatch);
                let token = h.token(3);
                let out = h.p.apply(&who(3), token, 1, 0, Op::Delete { key: "k".into() }, h.now);
                assert_eq!(value_of(&out, token), Value::Boolean(true));
                assert!(h.p.take_log().unwrap_or_default().is_empty());
                assert!(h.p.persistent_snapshots().is_empty());
            }

            #[test]
            fn the_first_call_on_a_stored_object_restores_it_first() {
                let mut h = durable();
                let (_, log) = constructed_p(&mut h, "c");
                let mut r = Partition::new();
                r.enable_storage();
                for rec in &log {
                    r.replay(rec, h.now).unwrap();
                }
                h.p = r;
                let (t, out) = h.call(&who(2), 3, T, "c", "update", margs(vec![5.into()]));
                assert!(out.is_empty());
                let forwards = h.p.take_forwards();
                let id = forwards[0].object_id();
                assert_eq!(
                    forwards,
                    vec![
                        Forward::Restore {
                            key: "c".into(),
                            object_id: id,
                            type_name: T.into(),
                            version: "v1".into(),
                            state: b"s0".to_vec(),
                        },
                        Forward::Call {
                            key: "c".into(),
                            object_id: id,
                            type_name: T.into(),
                            method: "update".into(),
                            args: vec![5.into()],
                            kwargs: Value::Map(vec![]),
                        },
                    ]
                );
                // Restored once: the next call goes straight to the host.
                h.call(&who(2), 4, T, "c", "update", margs(vec![]));
                assert!(matches!(h.p.take_forwards().as_slice(), [Forward::Call { .. }]));
                let out =
                    h.p.complete_with_state("c", id, Ok(1.into()), Some(b"s1".to_vec()), h.now);
                assert_eq!(value_of(&out, t), Value::from(1));
                // Nothing new was logged for the class: the replayed record stands.
                let log = decode_all(&h.p.take_log().unwrap());
                assert!(matches!(&log[..], [Record::UserState { .. }]), "{log:?}");
            }

            #[test]
            fn a_host_death_stores_the_object_and_answers_its_calls_object_lost() {
                let mut h = durable();
                let (id, _) = constructed_p(&mut h, "c");
                let (a, _) = h.call(&who(2), 5, T, "c", "update", margs(vec![]));
                let (b, _) = h.call(&who(2), 6, T, "c", "update", margs(vec![]));
                h.p.take_forwards();
                // a ran (its state is logged), b was running when the host died.
                h.p.complete_with_state("c", id, Ok(1.into()), Some(b"s1".to_vec()), h.now);
                h.p.take_log();
                let out = h.p.lose("c", id, "its object host exited with status 3", h.now);
                assert_eq!(tokens(&out), vec![b]);
                let e = error_of(&out, b);
                assert_eq!(e.kind, ErrorKind::ObjectLost);
                let reason = e.data.as_map().unwrap()[0].1.as_str().unwrap().to_string();
                assert!(reason.starts_with("its object host exited with status 3; "), "{reason}");
                assert!(reason.contains("restored to its last acknowledged state"), "{reason}");
                assert!(reason.contains("this call did not take effect"), "{reason}");
                assert_eq!(h.p.take_log(), Some(vec![]), "nothing logged; replies wait in order");
                assert_eq!(h.p.count_version(T, "v1"), 1, "not lost: its version is held");
                assert_ne!(a, b);
                // The next call restores it from the last logged state under a new id.
                let (t, _) = h.call(&who(2), 7, T, "c", "update", margs(vec![]));
                let forwards = h.p.take_forwards();
                let new_id = forwards[0].object_id();
                assert_ne!(new_id, id);
                assert!(
                    matches!(&forwards[0], Forward::Restore { state, .. } if state == b"s1"),
                    "{forwards:?}"
                );
                // The dead host's late answer is dropped; the new one's counts.
                assert!(h.p.complete("c", id, Ok(9.into()), h.now).is_empty());
                let out =
                    h.p.complete_with_state("c", new_id, Ok(2.into()), Some(b"s2".to_vec()), h.now);
                assert_eq!(value_of(&out, t), Value::from(2));
                h.p.take_log();
                // Lost while constructing: gone, as an ephemeral one.
                let (ct, _) = create_p(&mut h, &who(1), 9, "d", false);
                let d = h.p.take_forwards()[0].object_id();
                let out = h.p.lose("d", d, "its object host was killed by signal 9", h.now);
                assert_eq!(error_of(&out, ct).kind, ErrorKind::ObjectLost);
                // Only `c` is stored (a check that `d` is absent alone passes on an empty list).
                let stored: Vec<String> = h.p.stored_user_objects().into_iter().map(|o| o.key).collect();
                assert_eq!(stored, ["c"]);
                // Deleting a stored object is logged, sends nothing to a host and frees its version.
                h.p.lose("c", new_id, "gone", h.now);
                h.p.take_forwards();
                h.delete("c");
                assert!(h.p.take_forwards().is_empty());
                let log = decode_all(&h.p.take_log().unwrap());
                assert!(
                    matches!(
                        &log[..],
                        [Record::Apply {
                            op: Op::Delete { .. },
                            ..
                        }]
                    ),
                    "{log:?}"
                );
                assert_eq!(h.p.count_version(T, "v1"), 0);
            }

            #[test]
            fn a_state_too_large_to_log_discards_the_call_and_stores_the_object() {
                let mut h = durable();
                let (id, _) = constructed_p(&mut h, "c");
                let (a, _) = h.call(&who(2), 5, T, "c", "update", margs(vec![]));
                let (b, _) = h.call(&who(2), 6, T, "c", "update", margs(vec![]));
                h.p.take_forwards();
                let huge = vec![0; MAX_RECORD_LEN];
                let out = h.p.complete_with_state("c", id, Ok(1.into()), Some(huge), h.now);
                let e = error_of(&out, a);
                assert_eq!(e.kind, ErrorKind::ValueError);
                assert!(e.message.contains("over the 67108864 an op-log record holds"), "{e}");
                // b was sent to the host after a: it ran on a state never logged.
                assert_eq!(error_of(&out, b).kind, ErrorKind::ObjectLost);
                assert_eq!(h.p.take_log(), Some(vec![]));
                assert!(matches!(h.p.take_forwards().as_slice(), [Forward::Drop { .. }]));
                h.call(&who(2), 7, T, "c", "update", margs(vec![]));
                assert!(matches!(&h.p.take_forwards()[0], Forward::Restore { state, .. } if state == b"s0"));
            }

            #[test]
            fn a_failed_log_refuses_calls_on_persistent_user_objects() {
                let mut h = durable();
                constructed_p(&mut h, "c");
                h.p.storage_failed("No space left on device");
                assert_eq!(h.err(T, "c", "update", margs(vec![])).kind, ErrorKind::StorageError);
                assert!(h.p.take_forwards().is_empty());
            }

            #[test]
            fn a_constructor_reply_without_state_fails_the_create() {
                let mut h = durable();
                let (t, _) = create_p(&mut h, &who(1), 1, "c", false);
                let id = h.p.take_forwards()[0].object_id();
                let out = h.p.complete("c", id, Ok(Value::Nil), h.now);
                assert_eq!(error_of(&out, t).kind, ErrorKind::Internal);
                assert!(h.p.is_empty());
                assert!(matches!(h.p.take_forwards().as_slice(), [Forward::Drop { .. }]));
            }
        }

        #[test]
        fn withdraw_does_not_touch_hosted_calls() {
            let mut h = Harness::new();
            let id = constructed(&mut h, "c");
            let (t, _) = h.call(&who(2), 0, T, "c", "update", margs(vec![]));
            assert!(h.withdraw(t, "c").is_empty());
            assert_eq!(value_of(&h.p.complete("c", id, Ok(1.into()), h.now), t), Value::from(1));
        }
    }
}
