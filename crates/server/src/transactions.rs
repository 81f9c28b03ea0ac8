//! Transactions on one server: which shards each open transaction touched, its limits,
//! and its commit (every shard it touched locked together, validated, then applied, their
//! records written as one) or abort. The workspaces themselves live in the partitions
//! (`spindle_core::partition::transaction`); docs/transactions.md tells the whole design.
//! In a cluster, each node keeps the part on the shards it leads, and the commit is
//! two-phase (`cluster::two_phase`).

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use ahash::{HashMap, HashSet};
use spindle_core::partition::{Op, TxnCall, TxnId};
use spindle_core::record::MAX_RECORD_LEN;
use spindle_core::{Caller, Delivery, Error, ErrorKind, Reply, Token, Value};
use spindle_proto::TxnRef;

use crate::config::TransactionLimits;
use crate::{hosts, journal, Shared};

/// How long a transaction's age is remembered after its last call here: far longer than
/// the pause between a retry's attempts.
const AGE_MEMORY: Duration = Duration::from_secs(60);

/// How long one age may be named at most: longer than a `@transactional` function's 100
/// attempts of 5 s each (so a client cannot stay the oldest for ever by naming it again).
const AGE_LIFETIME: Duration = Duration::from_secs(600);

/// The open transactions of every session here, and counts for `status`.
#[derive(Default)]
pub(crate) struct Transactions {
    open: Mutex<HashMap<TxnId, Open>>,
    /// The ages given here, by session and by the age its client named (see [`age`](Self::age)).
    ages: Mutex<HashMap<Arc<str>, HashMap<u64, Age>>>,
    committed: AtomicU64,
    aborted: AtomicU64,
    /// Cluster transactions this node coordinates the commit of, now.
    pub(crate) coordinating: crate::cluster::two_phase::Coordinating,
}

/// What the server knows of an open transaction.
struct Open {
    deadline: Instant,
    /// The shards it touched.
    shards: BTreeSet<usize>,
    /// The objects it touched (against the limit).
    keys: HashSet<String>,
    /// Bytes of its calls' arguments (against the limit).
    bytes: usize,
}

/// An age given here, and when a call last named it.
struct Age {
    micros: u64,
    given: Instant,
    used: Instant,
}

/// `(committed, aborted, open)`, for `status`.
pub(crate) struct Counts {
    pub(crate) committed: u64,
    pub(crate) aborted: u64,
    pub(crate) open: usize,
}

impl Transactions {
    fn lock(&self) -> MutexGuard<'_, HashMap<TxnId, Open>> {
        self.open.lock().unwrap_or_else(PoisonError::into_inner)
    }

    pub(crate) fn counts(&self) -> Counts {
        Counts {
            committed: self.committed.load(Ordering::Relaxed),
            aborted: self.aborted.load(Ordering::Relaxed),
            // Expired ones are dropped when their session next opens one, commits or ends.
            open: {
                let now = Instant::now();
                self.lock().values().filter(|o| o.deadline > now).count()
            },
        }
    }

    /// Transaction `id` is being committed (prepared) here: no longer open.
    pub(crate) fn forget(&self, id: &TxnId) {
        self.lock().remove(id);
    }

    /// Count a transaction committed, or aborted.
    pub(crate) fn count(&self, committed: bool) {
        match committed {
            true => self.committed.fetch_add(1, Ordering::Relaxed),
            false => self.aborted.fetch_add(1, Ordering::Relaxed),
        };
    }

    /// The age that counts for a transaction of `client` whose client names `claimed`: the
    /// time this node first saw that name (kept while calls name it, so a retry that names its
    /// first attempt's age keeps it, for at most `AGE_LIFETIME`). A client cannot claim to be
    /// older than it is and win every conflict. At most `most` ages per session are kept
    /// (the least recently named go).
    fn age(&self, client: &Arc<str>, claimed: u64, most: usize, now: Instant) -> u64 {
        let mut ages = self.ages.lock().unwrap_or_else(PoisonError::into_inner);
        let session = ages.entry(client.clone()).or_default();
        if let Some(age) = session
            .get_mut(&claimed)
            .filter(|a| now.saturating_duration_since(a.given) < AGE_LIFETIME)
        {
            age.used = now;
            return age.micros;
        }
        if session.len() >= most {
            session.retain(|_, a| now.saturating_duration_since(a.used) < AGE_MEMORY);
            if session.len() >= most {
                let stalest = session.iter().min_by_key(|(_, a)| a.used).map(|(c, _)| *c);
                session.remove(&stalest.expect("the session has ages"));
            }
        }
        let micros = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_micros() as u64);
        session.insert(
            claimed,
            Age {
                micros,
                given: now,
                used: now,
            },
        );
        micros
    }

    /// A session ended: its transactions went with it (each partition drops its workspaces).
    pub(crate) fn end_session(&self, client: &str) {
        self.ages.lock().unwrap_or_else(PoisonError::into_inner).remove(client);
        let mut open = self.lock();
        let before = open.len();
        open.retain(|id, _| &*id.client != client);
        self.aborted.fetch_add((before - open.len()) as u64, Ordering::Relaxed);
    }

    /// Note a call of transaction `id` on `key` in shard `index`, carrying `bytes` of
    /// arguments: opens the transaction on its `first` call. Returns whether this
    /// is its first call in that shard, and its deadline.
    fn enter(
        &self,
        limits: &TransactionLimits,
        id: &TxnId,
        first: bool,
        index: usize,
        key: &str,
        bytes: usize,
    ) -> Result<(bool, Instant), Error> {
        let now = Instant::now();
        let mut open = self.lock();
        if !open.contains_key(id) {
            if !first {
                return Err(Error::new(
                    ErrorKind::TransactionConflict,
                    format!(
                        "transaction {} is not open here (aborted by an older transaction, past its time limit, or \
                         the server restarted): it was aborted",
                        id.number
                    ),
                ));
            }
            // Expired ones count until their session commits, aborts or ends: drop them now.
            let before = open.len();
            open.retain(|other, o| other.client != id.client || o.deadline > now);
            self.aborted.fetch_add((before - open.len()) as u64, Ordering::Relaxed);
            let of_session = open.keys().filter(|other| other.client == id.client).count();
            if of_session >= limits.per_session {
                return Err(Error::new(
                    ErrorKind::TransactionError,
                    format!(
                        "this session has {of_session} transactions open, the most allowed \
                         (--max-transactions-per-session): commit or abort one first"
                    ),
                ));
            }
            open.insert(
                id.clone(),
                Open {
                    deadline: now + limits.duration,
                    shards: BTreeSet::new(),
                    keys: HashSet::default(),
                    bytes: 0,
                },
            );
        }
        let txn = open.get_mut(id).expect("inserted above");
        if now >= txn.deadline {
            return Err(Error::new(
                ErrorKind::TransactionConflict,
                format!(
                    "transaction {} ran past its time limit of {:.1} s (--max-transaction-time) and was aborted",
                    id.number,
                    limits.duration.as_secs_f64()
                ),
            ));
        }
        txn.bytes += bytes;
        if txn.bytes > limits.bytes {
            return Err(Error::new(
                ErrorKind::TransactionError,
                format!(
                    "transaction {} passed {} bytes of calls (keys, methods and arguments; \
                     --max-transaction-bytes) and was aborted: make it in smaller transactions",
                    id.number, limits.bytes
                ),
            ));
        }
        if !txn.keys.contains(key) {
            if txn.keys.len() >= limits.objects {
                return Err(Error::new(
                    ErrorKind::TransactionError,
                    format!(
                        "transaction {} would touch more than {} objects (--max-transaction-objects) and was \
                         aborted: make it in smaller transactions",
                        id.number, limits.objects
                    ),
                ));
            }
            txn.keys.insert(key.to_string());
        }
        Ok((txn.shards.insert(index), txn.deadline))
    }
}

/// Run call `op` (request `token`, `seq` of its session) of transaction `txn` on the
/// workspace of its shard. Returns its reply, if it did not wait (for an older transaction,
/// or one being committed across shards: its reply comes when they end; or it runs on the
/// transaction's copy of a user-defined object in its host, and its reply comes from there),
/// with the replies of the calls it woke.
pub(crate) fn call(
    shared: &Arc<Shared>,
    caller: &Caller,
    token: Token,
    seq: u64,
    txn: TxnRef,
    op: Op,
) -> Result<Vec<Delivery>, Error> {
    crate::cluster::two_phase::check_format(shared)?;
    let id = TxnId {
        client: caller.client.clone(),
        number: txn.number,
    };
    // What its commit keeps of the call: the key and the method too.
    let sizes = |args: &[Value]| args.iter().map(spindle_core::value::approx_size).sum::<usize>();
    let bytes = op.key().len()
        + match &op {
            Op::Create { type_name, args, .. } => type_name.len() + sizes(args),
            Op::Call { method, args, .. } => method.len() + sizes(args),
            Op::Delete { .. } => 0,
        };
    let index = shared.shards.index_of(op.key());
    let limits = &shared.config.limits.transactions;
    let clustered = shared.cluster.is_some();
    if clustered && !shared.shards.with(index, |s| s.serving())? {
        return Err(crate::cluster::two_phase::redirect(shared, index));
    }
    let entered = shared
        .transactions
        .enter(limits, &id, txn.first, index, op.key(), bytes);
    let (first, deadline) = entered.inspect_err(|e| aborted_by(shared, &id, e))?;
    // In a cluster `first` is the transaction's first call in this shard: a shard whose
    // leader changed must not open it again without its earlier calls there.
    let first = first && (txn.first || !clustered);
    let age = shared.transactions.age(
        &caller.client,
        txn.age,
        limits.per_session.clamp(1, 256),
        Instant::now(),
    );
    let txn = TxnCall {
        id: &id,
        age,
        first,
        deadline,
        max_bytes: limits.bytes,
    };
    let (deliveries, actions) = shared.shards.with(index, |s| {
        if !s.serving() {
            return Err(crate::cluster::two_phase::redirect(shared, index));
        }
        s.calls += 1;
        let out = s.partition.apply_in(txn, caller, token, seq, op, Instant::now());
        // Requests for the hosts of user-defined objects (copies, calls on them, copies of
        // transactions it wounded dropped) leave in the order applied, as single calls' do.
        Ok((s.journal(out), hosts::forward(shared, &mut s.partition, None)))
    })??;
    hosts::run(shared, actions);
    if let Some(Delivery { reply: Err(e), .. }) = deliveries.iter().find(|d| d.token == token) {
        aborted_by(shared, &id, e);
    }
    Ok(deliveries)
}

/// A transaction that got `TransactionError` is aborted everywhere here (its message says
/// so): nothing it did may commit after an error its code may have caught.
fn aborted_by(shared: &Arc<Shared>, id: &TxnId, e: &Error) {
    if e.kind == ErrorKind::TransactionError {
        abort(shared, &id.client, id.number);
    }
}

/// Commit transaction `number` of `caller`'s session (request `token`, `seq`): every shard
/// it touched validates it, then applies it, under their locks held together; the shard
/// of the session's name records the reply, so a retried commit gets it. Returns the
/// replies to send (the commit's among them).
pub(crate) fn commit(
    shared: &Arc<Shared>,
    caller: &Caller,
    token: Token,
    seq: u64,
    number: u64,
) -> Result<Vec<Delivery>, Error> {
    let home = shared.shards.index_of(&caller.client);
    commit_at(shared, caller, (token, seq), number, home, Ok(Value::Boolean(true)))
}

/// Commit transaction `number`, which the driver of nested calls ran for `caller`'s call
/// `seq` of a method of `key`: `reply`, the method's, is the commit's reply (to `token`),
/// recorded for `seq` in `key`'s partition, where a retried call finds it.
pub(crate) fn commit_call(
    shared: &Arc<Shared>,
    caller: &Caller,
    (token, seq): (Token, u64),
    number: u64,
    key: &str,
    reply: Reply,
) -> Result<Vec<Delivery>, Error> {
    let home = shared.shards.index_of(key);
    commit_at(shared, caller, (token, seq), number, home, reply)
}

/// [`commit`], its reply (`reply`, if it commits) recorded for `seq` in shard `home`.
fn commit_at(
    shared: &Arc<Shared>,
    caller: &Caller,
    (token, seq): (Token, u64),
    number: u64,
    home: usize,
    reply: Reply,
) -> Result<Vec<Delivery>, Error> {
    let id = TxnId {
        client: caller.client.clone(),
        number,
    };
    let open = shared.transactions.lock().remove(&id);
    let mut shards = open.as_ref().map(|o| o.shards.clone()).unwrap_or_default();
    shards.insert(home);
    let indices: Vec<usize> = shards.into_iter().collect();
    let expired = open.as_ref().is_some_and(|o| Instant::now() >= o.deadline);
    let limits = &shared.config.limits.transactions;
    let mut actions = Vec::new();
    let deliveries = shared.shards.with_many(&indices, |states| {
        let now = Instant::now();
        let at_home = states.iter().position(|(i, _)| *i == home).expect("home is among them");
        if let Some(reply) = states[at_home].1.partition.recorded(&caller.client, seq) {
            // Committed before (a retried call whose first copy committed): this copy goes.
            let mut out = vec![Delivery { token, reply }];
            for (_, s) in states.iter_mut() {
                let woken = s.partition.drop_txn(&id, now);
                out.extend(s.journal(woken));
                actions.extend(hosts::forward(shared, &mut s.partition, None));
            }
            return out;
        }
        // In a cluster each shard is a Raft group of its own: one commit entry is atomic in
        // one shard only (a client's commit over several goes through `two_phase`).
        if shared.cluster.is_some() && states.len() > 1 {
            let e = Error::new(
                ErrorKind::TransactionError,
                format!(
                    "transaction {number} of a method's nested calls touched {} shards: in a cluster, a method's \
                     nested calls must stay in its object's shard (keep the objects it calls in its shard, or \
                     call them from the client in a transaction)",
                    states.len()
                ),
            );
            let mut out = vec![Delivery { token, reply: Err(e) }];
            for (_, s) in states.iter_mut() {
                let woken = s.partition.drop_txn(&id, now);
                out.extend(s.journal(woken));
                actions.extend(hosts::forward(shared, &mut s.partition, None));
            }
            return out;
        }
        let checked = match (&open, expired) {
            (None, _) => Err(Error::new(
                ErrorKind::TransactionConflict,
                format!(
                    "transaction {number} is not open here: it was aborted (by an older transaction, or past its \
                     time limit), or its session ended"
                ),
            )),
            (Some(_), true) => Err(Error::new(
                ErrorKind::TransactionConflict,
                format!(
                    "transaction {number} ran past its time limit of {:.1} s (--max-transaction-time) and was aborted",
                    limits.duration.as_secs_f64()
                ),
            )),
            (Some(open), false) => states
                .iter()
                .map(|(index, s)| {
                    if !s.serving() {
                        return Err(crate::cluster::not_serving());
                    }
                    match open.shards.contains(index) {
                        true => s.partition.validate(&id),
                        false => Ok(0), // home only: it records the reply
                    }
                })
                .sum::<Result<usize, Error>>()
                .and_then(|bytes| fits_one_record(number, bytes, states.len())),
        };
        if let Err(e) = checked {
            let mut out = Vec::new();
            for (_, s) in states.iter_mut() {
                let woken = s.partition.drop_txn(&id, now);
                out.extend(s.journal(woken));
                actions.extend(hosts::forward(shared, &mut s.partition, None));
            }
            shared.transactions.aborted.fetch_add(1, Ordering::Relaxed);
            out.push(Delivery { token, reply: Err(e) });
            return out;
        }
        let mut out = Vec::new();
        let mut parts = Vec::new();
        for (index, s) in states.iter_mut() {
            let recorded = if *index == home { seq } else { 0 };
            out.extend(s.partition.commit(&id, caller.conn, recorded, &reply, now));
            // Its copies of user-defined objects become the objects, before any later call.
            actions.extend(hosts::forward(shared, &mut s.partition, None));
            if let Some(records) = s.partition.take_log().filter(|r| !r.is_empty()) {
                parts.push((*index as u32, records));
            }
        }
        out.push(Delivery { token, reply });
        shared.transactions.committed.fetch_add(1, Ordering::Relaxed);
        match parts.len() {
            // One shard's records: its own log's usual write.
            0 | 1 => {
                let (index, records) = parts.pop().unwrap_or((home as u32, Vec::new()));
                let (_, s) = states
                    .iter_mut()
                    .find(|(i, _)| *i == index as usize)
                    .expect("a locked shard");
                s.write(records, out)
            }
            _ => journal::submit_group(states.iter_mut().filter_map(|(_, s)| s.logged()).collect(), parts, out),
        }
    });
    hosts::run(shared, actions);
    deliveries
}

/// A commit whose records, `bytes` over `parts` partitions, fit one log record (its parts'
/// headers with them).
fn fits_one_record(number: u64, bytes: usize, parts: usize) -> Result<(), Error> {
    let total = bytes + parts * 1024;
    match total <= MAX_RECORD_LEN {
        true => Ok(()),
        false => Err(Error::new(
            ErrorKind::TransactionError,
            format!(
                "transaction {number} would write a commit record of about {total} bytes, more than the \
                 {MAX_RECORD_LEN} a record may hold: make it in smaller transactions"
            ),
        )),
    }
}

/// Abort transaction `number` of `client`: nothing it did is ever seen. Replies whether it
/// was open.
pub(crate) fn abort(shared: &Arc<Shared>, client: &Arc<str>, number: u64) -> bool {
    let id = TxnId {
        client: client.clone(),
        number,
    };
    let Some(open) = shared.transactions.lock().remove(&id) else {
        return false;
    };
    shared.transactions.aborted.fetch_add(1, Ordering::Relaxed);
    for index in open.shards {
        // A poisoned shard holds nothing of it any more.
        let dropped = shared.shards.with(index, |s| {
            let out = s.partition.drop_txn(&id, Instant::now());
            (s.journal(out), hosts::forward(shared, &mut s.partition, None))
        });
        if let Ok((woken, actions)) = dropped {
            shared.registry.deliver(woken);
            hosts::run(shared, actions);
        }
    }
    true
}
