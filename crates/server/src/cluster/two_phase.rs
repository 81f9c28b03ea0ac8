//! Transactions over a cluster's shards: two-phase commit with replicated participants and
//! a replicated coordinator (as Spanner). The workspaces live on each shard's leader, as on
//! one server; the commit goes to the leader of the lowest shard the transaction touched,
//! the coordinator:
//!
//! 1. it asks every touched shard's leader to prepare (`prepare`: validate the workspace
//!    and put its writes in one Raft entry; yes once that commits);
//! 2. it puts the decision in one Raft entry of its own shard (commit if all said yes),
//!    which records the commit's reply for retries and decides its own part;
//! 3. it answers the client once that commits, and tells the others (`decide`: one entry
//!    each); once all have, the decision is forgotten (`forget`).
//!
//! A transaction over one shard commits in one entry (its `commit` record). A participant
//! that stays prepared asks the coordinator shard's leader for the decision (`decision`);
//! a coordinator with no decision and no commit under way presumes an abort and logs it
//! first, so a late commit attempt finds it. The partition keeps all of this state
//! (`spindle_core::partition::prepared`); this module does the I/O.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

use ahash::{HashMap, HashSet};
use spindle_core::partition::{Decision, TxnId};
use spindle_core::{Caller, Delivery, Error, ErrorKind, Reply, Token, Value};
use tokio::sync::oneshot;
use tracing::debug;

use super::{format, not_leader};
use crate::{hosts, Shared};

/// How often a leader looks for prepared transactions to ask about, and decisions to
/// tell or forget.
const RECOVER_EVERY: Duration = Duration::from_millis(500);
/// A prepared transaction is asked about, or a decision resent, once this old (before,
/// the live commit is expected to see to it).
const GRACE: Duration = Duration::from_secs(1);
/// A presumed abort (its participants unknown) is kept this long: a late commit attempt
/// can only come within the transaction's time limit and the client's retries.
pub(crate) const PRESUMED_ABORT_KEPT: Duration = Duration::from_secs(60);

/// Transactions this node is committing as coordinator: a participant asking about one
/// of them is told to ask again, not given a presumed abort.
#[derive(Default)]
pub(crate) struct Coordinating(std::sync::Mutex<HashSet<TxnId>>);

impl Coordinating {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashSet<TxnId>> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// The error of a transaction's calls on a cluster whose nodes do not all read format
/// [`format::TRANSACTIONS`].
pub(crate) fn check_format(shared: &Shared) -> Result<(), Error> {
    super::require_format(shared, format::TRANSACTIONS, "transactions")
}

pub(crate) fn redirect(shared: &Shared, shard: usize) -> Error {
    match &shared.cluster {
        Some(cluster) => cluster.redirect(shard),
        None => not_leader(None),
    }
}

/// Run `tasks` side by side; their results in order.
async fn all<T: Send + 'static>(
    tasks: impl Iterator<Item = impl std::future::Future<Output = Result<T, Error>> + Send + 'static>,
) -> Vec<Result<T, Error>> {
    let handles: Vec<_> = tasks.map(tokio::spawn).collect();
    let mut out = Vec::with_capacity(handles.len());
    for handle in handles {
        out.push(
            handle
                .await
                .unwrap_or_else(|e| Err(Error::new(ErrorKind::Internal, e.to_string()))),
        );
    }
    out
}

/// Wait for a proposal's signal: an error when its replica stopped serving first.
async fn committed(signal: oneshot::Receiver<()>, shared: &Shared, shard: usize) -> Result<(), Error> {
    signal.await.map_err(|_| redirect(shared, shard))
}

/// Commit transaction `number` of `caller`'s session over `shards` (request `token`,
/// `seq`), here the leader of the lowest of them. The reply goes to `token`.
pub(crate) async fn commit(shared: Arc<Shared>, caller: Caller, token: Token, seq: u64, number: u64, shards: Vec<u64>) {
    let id = TxnId {
        client: caller.client.clone(),
        number,
    };
    let shards: Vec<usize> = shards
        .into_iter()
        .map(|s| s as usize)
        .collect::<BTreeSet<_>>()
        .into_iter()
        .collect();
    let reply = match shards.iter().find(|&&s| s >= shared.shards.count()) {
        Some(s) => Some(Err(Error::value(format!("the cluster has no shard {s}")))),
        None => match shards.len() {
            // An SDK that does not name them (an older one) cannot commit in a cluster.
            0 => Some(Err(Error::new(
                ErrorKind::TransactionError,
                "a commit in a cluster must name the shards its transaction touched (upgrade the client library)",
            ))),
            1 => return commit_one(&shared, &caller, token, seq, &id, shards[0]),
            _ => commit_many(&shared, &caller, token, seq, &id, &shards).await,
        },
    };
    if let Some(reply) = reply {
        shared.registry.deliver([Delivery { token, reply }]);
    }
}

/// One shard: validate and apply in one `commit` entry, as on one server.
fn commit_one(shared: &Arc<Shared>, caller: &Caller, token: Token, seq: u64, id: &TxnId, shard: usize) {
    shared.transactions.forget(id);
    let mut actions = Vec::new();
    let outcome = shared.shards.with(shard, |s| {
        if !s.serving() {
            return vec![Delivery {
                token,
                reply: Err(redirect(shared, shard)),
            }];
        }
        if let Some(reply) = s.partition.recorded(&caller.client, seq) {
            return s.journal(vec![Delivery { token, reply }]);
        }
        if let Err(e) = s.partition.validate(id) {
            let woken = s.partition.drop_txn(id, Instant::now());
            let mut out = s.journal(woken);
            actions = hosts::forward(shared, &mut s.partition, None);
            shared.transactions.count(false);
            out.push(Delivery { token, reply: Err(e) });
            return out;
        }
        let reply: Reply = Ok(Value::Boolean(true));
        let mut out = s.partition.commit(id, caller.conn, seq, &reply, Instant::now());
        // Its copies of user-defined objects become the objects (on this leader's hosts;
        // replicas restore a persistent one's state from the entry).
        actions = hosts::forward(shared, &mut s.partition, None);
        out.push(Delivery { token, reply });
        shared.transactions.count(true);
        s.journal(out)
    });
    hosts::run(shared, actions);
    match outcome {
        Ok(deliveries) => shared.registry.deliver(deliveries),
        Err(e) => shared.registry.deliver([Delivery { token, reply: Err(e) }]),
    }
}

/// Several shards: two-phase commit. Returns the reply to send now, if it is not held
/// for the decision's entry.
async fn commit_many(
    shared: &Arc<Shared>,
    caller: &Caller,
    token: Token,
    seq: u64,
    id: &TxnId,
    shards: &[usize],
) -> Option<Reply> {
    let home = shards[0];
    let settled = shared.shards.with(home, |s| {
        if !s.serving() {
            return Some(Err(redirect(shared, home)));
        }
        if let Some(reply) = s.partition.recorded(&caller.client, seq) {
            return Some(reply);
        }
        if let Some(decision) = s.partition.decision(id) {
            return Some(decision.reply());
        }
        shared.transactions.coordinating.lock().insert(id.clone());
        None
    });
    match settled {
        Ok(Some(reply)) => return Some(reply),
        Ok(None) => {}
        Err(e) => return Some(Err(e)),
    }
    let votes = all(shards.iter().map(|&shard| {
        let (shared, id) = (shared.clone(), id.clone());
        async move { prepare(&shared, &id, shard, home).await }
    }))
    .await;
    let refusal = votes.into_iter().find_map(Result::err);
    let decision = Decision {
        commit: refusal.is_none(),
        message: refusal.map_or_else(String::new, |e| match e.kind {
            ErrorKind::TransactionConflict => e.message,
            _ => format!("transaction {} was aborted: {} (run it again)", id.number, e.message),
        }),
        participants: shards.iter().map(|&s| s as u64).collect(),
    };
    let proposed = shared.shards.with(home, |s| {
        if !s.serving() {
            return Err(redirect(shared, home));
        }
        let (taken, mut out) = s.partition.record_decision(id, decision, seq, Instant::now());
        out.push(Delivery {
            token,
            reply: taken.reply(),
        });
        let records = s.partition.take_log().unwrap_or_default();
        match s.replica.as_mut() {
            Some(replica) => Ok((taken, replica.submit_signal(records, out))),
            None => Err(not_leader(None)),
        }
    });
    shared.transactions.coordinating.lock().remove(id);
    let (taken, (now, signal)) = match proposed.and_then(|r| r) {
        Ok(proposed) => proposed,
        Err(e) => return Some(Err(e)),
    };
    shared.registry.deliver(now);
    shared.transactions.count(taken.commit);
    if committed(signal, shared, home).await.is_ok() {
        tell(shared, id, &taken, home).await;
    }
    None
}

/// Prepare `id` in `shard` (its decision kept by shard `home`): `Ok` is a yes.
async fn prepare(shared: &Arc<Shared>, id: &TxnId, shard: usize, home: usize) -> Result<(), Error> {
    let Some(cluster) = shared.cluster.as_ref() else {
        return Err(not_leader(None));
    };
    if serves(shared, shard) {
        return prepare_here(shared, id, shard, home).await;
    }
    let request = vec![
        "prepare".into(),
        (*id.client).into(),
        id.number.into(),
        (shard as u64).into(),
        (home as u64).into(),
    ];
    cluster.ask_leader(shared, shard, request).await.map(|_| ())
}

fn serves(shared: &Shared, shard: usize) -> bool {
    shared.shards.with(shard, |s| s.serving()).unwrap_or(false)
}

/// The `prepare` of a transaction in a shard this node leads: yes once its prepare
/// entry commits.
pub(crate) async fn prepare_here(shared: &Shared, id: &TxnId, shard: usize, home: usize) -> Result<(), Error> {
    shared.transactions.forget(id);
    let signal = shared.shards.with(shard, |s| {
        if !s.serving() {
            return Err(redirect(shared, shard));
        }
        let mut woken = Vec::new();
        if let Err(e) = s.partition.prepare(id, home as u64, Instant::now(), &mut woken) {
            // Dropped: the calls that waited for its objects run.
            shared.registry.deliver(s.journal(woken));
            return Err(e);
        }
        let records = s.partition.take_log().unwrap_or_default();
        match s.replica.as_mut() {
            Some(replica) => Ok(replica.submit_signal(records, Vec::new()).1),
            None => Err(not_leader(None)),
        }
    })??;
    committed(signal, shared, shard).await
}

/// The `decide` of a transaction in a shard this node leads: done once its entry commits.
pub(crate) async fn decide_here(shared: &Shared, id: &TxnId, shard: usize, commit: bool) -> Result<(), Error> {
    let signal = shared.shards.with(shard, |s| {
        if !s.serving() {
            return Err(redirect(shared, shard));
        }
        let out = s.partition.decide(id, commit, Instant::now());
        let records = s.partition.take_log().unwrap_or_default();
        match s.replica.as_mut() {
            Some(replica) => Ok(replica.submit_signal(records, out)),
            None => Err(not_leader(None)),
        }
    })??;
    shared.registry.deliver(signal.0);
    committed(signal.1, shared, shard).await
}

/// Tell the participants other than `home` the decision on `id`; forget it once all
/// have it. Returns whether all have.
async fn tell(shared: &Arc<Shared>, id: &TxnId, decision: &Decision, home: usize) -> bool {
    let others = decision.participants.iter().map(|&p| p as usize).filter(|&p| p != home);
    let commit = decision.commit;
    let told = all(others.map(|shard| {
        let (shared, id) = (shared.clone(), id.clone());
        async move {
            if serves(&shared, shard) {
                return decide_here(&shared, &id, shard, commit).await;
            }
            let Some(cluster) = shared.cluster.as_ref() else {
                return Err(not_leader(None));
            };
            let request = vec![
                "decide".into(),
                (*id.client).into(),
                id.number.into(),
                (shard as u64).into(),
                commit.into(),
            ];
            cluster.ask_leader(&shared, shard, request).await.map(|_| ())
        }
    }))
    .await;
    if let Some(e) = told.iter().find_map(|r| r.as_ref().err()) {
        debug!(shard = home, "a participant did not take a decision yet: {}", e.message);
        return false;
    }
    forget(shared, id, home);
    true
}

/// Drop the decision on `id` from shard `home` (logged; nobody waits on it).
fn forget(shared: &Shared, id: &TxnId, home: usize) {
    let _ = shared.shards.with(home, |s| {
        if s.serving() {
            s.partition.forget(id);
            let _ = s.journal(Vec::new());
        }
    });
}

/// A participant asks shard `shard` (led here) for the decision on `id`: `Some(commit)`,
/// or `None` while a commit of it is under way here. With neither a decision nor a
/// commit under way, an abort is presumed and logged first.
pub(crate) async fn ask_here(shared: &Shared, id: &TxnId, shard: usize) -> Result<Option<bool>, Error> {
    let pending = shared.shards.with(shard, |s| {
        if !s.serving() {
            return Err(redirect(shared, shard));
        }
        if let Some(decision) = s.partition.decision(id) {
            return Ok(Err(decision.commit));
        }
        if shared.transactions.coordinating.lock().contains(id) {
            return Ok(Ok(None));
        }
        let abort = Decision {
            commit: false,
            message: format!(
                "transaction {} was aborted: its commit did not reach a decision (its coordinator failed); run it again",
                id.number
            ),
            participants: Vec::new(),
        };
        let (taken, out) = s.partition.record_decision(id, abort, 0, Instant::now());
        let records = s.partition.take_log().unwrap_or_default();
        match s.replica.as_mut() {
            Some(replica) => Ok(Ok(Some((taken.commit, replica.submit_signal(records, out))))),
            None => Err(not_leader(None)),
        }
    })??;
    match pending {
        Err(commit) => Ok(Some(commit)),
        Ok(None) => Ok(None),
        Ok(Some((commit, (now, signal)))) => {
            shared.registry.deliver(now);
            committed(signal, shared, shard).await?;
            Ok(Some(commit))
        }
    }
}

/// Each leader, periodically: asks the coordinators of the transactions prepared in its
/// shards for their decisions, and tells (then forgets) the decisions its shards keep.
pub(crate) async fn recover(shared: Arc<Shared>) {
    let mut seen: HashMap<(usize, TxnId), Instant> = HashMap::default();
    // What is being asked or told now: one question or telling at a time each.
    let busy: Arc<std::sync::Mutex<HashSet<(usize, TxnId)>>> = Arc::default();
    let start = |key: (usize, TxnId)| busy.lock().unwrap_or_else(|e| e.into_inner()).insert(key);
    loop {
        tokio::time::sleep(RECOVER_EVERY).await;
        let now = Instant::now();
        let mut current = HashSet::default();
        for shard in 0..shared.shards.count() {
            let found = shared.shards.with(shard, |s| match s.serving() {
                true => (s.partition.prepared_txns(), s.partition.decisions()),
                false => (Vec::new(), Vec::new()),
            });
            let Ok((prepared, decisions)) = found else { continue };
            for (id, home) in prepared {
                let since = *seen.entry((shard, id.clone())).or_insert(now);
                current.insert((shard, id.clone()));
                if now.duration_since(since) >= GRACE && start((shard, id.clone())) {
                    let (shared, busy) = (shared.clone(), busy.clone());
                    tokio::spawn(async move {
                        learn(&shared, &id, shard, home as usize).await;
                        busy.lock().unwrap_or_else(|e| e.into_inner()).remove(&(shard, id));
                    });
                }
            }
            for (id, decision) in decisions {
                let since = *seen.entry((shard, id.clone())).or_insert(now);
                current.insert((shard, id.clone()));
                let age = now.duration_since(since);
                if decision.participants.is_empty() {
                    if age >= PRESUMED_ABORT_KEPT {
                        forget(&shared, &id, shard);
                    }
                } else if age >= GRACE && start((shard, id.clone())) {
                    let (shared, busy) = (shared.clone(), busy.clone());
                    tokio::spawn(async move {
                        tell(&shared, &id, &decision, shard).await;
                        busy.lock().unwrap_or_else(|e| e.into_inner()).remove(&(shard, id));
                    });
                }
            }
        }
        seen.retain(|k, _| current.contains(k));
    }
}

/// Ask the coordinator shard `home` for the decision on `id`, prepared in `shard`, and
/// apply it there.
async fn learn(shared: &Arc<Shared>, id: &TxnId, shard: usize, home: usize) {
    let Some(cluster) = shared.cluster.as_ref() else { return };
    let answer = match serves(shared, home) {
        true => ask_here(shared, id, home).await,
        false => {
            let request = vec![
                "decision".into(),
                (*id.client).into(),
                id.number.into(),
                (home as u64).into(),
            ];
            cluster.ask_leader(shared, home, request).await.map(|v| v.as_bool())
        }
    };
    match answer {
        Ok(Some(commit)) => {
            if let Err(e) = decide_here(shared, id, shard, commit).await {
                debug!(shard, "a learned decision was not applied yet: {}", e.message);
            }
        }
        Ok(None) => {}
        Err(e) => debug!(shard, "the coordinator shard {home} did not answer yet: {}", e.message),
    }
}
