//! `keep` under a name whose shard another node leads: the object moves to that node.
//!
//! Only ephemeral objects take a new name (a persistent one keeps its key), and in a cluster
//! they live in the memory of their shard's leader alone. So a move between shards led by
//! two nodes is a transfer between two memories, not between two Raft logs: the node leading
//! the object's shard takes the object out, sends its snapshot to the node leading the
//! name's shard (`adopt`, following redirects), and, once that node has put it under the
//! name, leaves a forwarding note at the old key. If the name is taken there, or that node
//! cannot be reached, the object goes back under its key. An `adopt` resent after a lost
//! answer is recognized by its origin (unique per move) and answered as the first was. An
//! `adopt` is valid until a time it carries ([`MOVE_DEADLINE`] after the move began), and
//! the object goes back under its key only [`CLOCK_MARGIN`] after that: so it never ends up
//! under both keys, as long as the nodes' clocks agree within the margin. While the object
//! travels, calls on its old key find nothing; a node that adopts it and turns out to have
//! lost its leadership loses it, as it loses every ephemeral object it held.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use spindle_core::objects::compiled::{self, CompiledObject};
use spindle_core::{Detached, Error, ErrorKind, Value};

use super::{not_serving, peers};
use crate::{hosts, Shared};

/// How long a move may look for the name's leader (an election, a node restarting).
pub(crate) const MOVE_DEADLINE: Duration = Duration::from_secs(10);
/// How far apart the nodes' clocks may be (see the module documentation).
pub(crate) const CLOCK_MARGIN: Duration = Duration::from_secs(1);
/// Pause before asking again when no leader is known.
const RETRY_AFTER: Duration = Duration::from_millis(100);
/// How long an adoption is remembered for a resent `adopt` (well past the deadline).
const REMEMBER: Duration = Duration::from_secs(60);

/// Adoptions this node made lately: `(when, origin, name)`, oldest first; and the count of
/// moves it started, which makes their origins unique.
pub(crate) struct Adopted {
    recent: Mutex<VecDeque<(Instant, String, String)>>,
    moves: AtomicU64,
}

impl Default for Adopted {
    fn default() -> Self {
        // Counting from the start time: a restarted node's moves get other origins.
        let start = SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64);
        Adopted {
            recent: Mutex::new(VecDeque::new()),
            moves: AtomicU64::new(start),
        }
    }
}

/// Milliseconds since the Unix epoch.
fn unix_ms(at: SystemTime) -> u64 {
    at.duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

impl Adopted {
    /// Whether the move `origin` already put an object under `name` here.
    fn contains(&self, origin: &str, name: &str) -> bool {
        let mut recent = self.recent.lock().unwrap_or_else(|e| e.into_inner());
        while recent.front().is_some_and(|(at, ..)| at.elapsed() > REMEMBER) {
            recent.pop_front();
        }
        recent.iter().any(|(_, o, n)| o == origin && n == name)
    }

    fn insert(&self, origin: String, name: String) {
        let mut recent = self.recent.lock().unwrap_or_else(|e| e.into_inner());
        recent.push_back((Instant::now(), origin, name));
    }
}

/// Whether `keep` of `key` under `name` moves the object to another node: in a cluster,
/// when the name's shard is another one and this node does not serve it.
pub(crate) fn is_remote(shared: &Shared, key: &str, name: &str) -> bool {
    let shards = &shared.shards;
    let (source, target) = (shards.index_of(key), shards.index_of(name));
    shared.cluster.is_some() && source != target && !shards.with(target, |s| s.serving()).unwrap_or(false)
}

/// `keep` of (`type_name`, `key`) under `name`, whose shard another node leads (see the
/// module documentation). `NotLeader` means this node does not serve the object's shard.
pub(crate) async fn keep_elsewhere(
    shared: &Arc<Shared>,
    type_name: &str,
    key: &str,
    name: &str,
) -> Result<Value, Error> {
    let Some(cluster) = shared.cluster.as_ref() else {
        return Err(Error::new(ErrorKind::Internal, "not a cluster"));
    };
    let (started, began) = (Instant::now(), SystemTime::now());
    let source = shared.shards.index_of(key);
    let detached = shared.shards.with(source, |s| match s.serving() {
        true => s.partition.detach_to(type_name, key, name),
        false => Err(not_serving()),
    })??;
    let Some(detached) = detached else {
        return Ok(Value::from(name)); // a retry
    };
    let owner = detached.owner();
    let Some((type_name, state)) = detached.encode() else {
        put_back(shared, source, key, detached);
        return Err(Error::value(format!(
            "a {type_name} cannot move to another node, and '{name}' belongs to a shard that another node \
             leads: create the {type_name} with name='{name}' instead"
        )));
    };
    let origin = format!(
        "{}:{}:{key}",
        cluster.node_id,
        cluster.adopted.moves.fetch_add(1, Ordering::Relaxed)
    );
    let request = vec![
        "adopt".into(),
        type_name.into(),
        name.into(),
        state,
        origin.as_str().into(),
        unix_ms(began + MOVE_DEADLINE).into(),
    ];
    let cluster_key = shared.access.cluster_key().unwrap_or_default();
    let target = shared.shards.index_of(name);
    let deadline = started + MOVE_DEADLINE;
    let mut address = None;
    let mut last: Option<Error> = None;
    while Instant::now() < deadline {
        let Some(to) = address.take().or_else(|| cluster.leader_address(target)) else {
            tokio::time::sleep(RETRY_AFTER).await;
            continue;
        };
        let client = cluster.name();
        let sent = peers::request(&to, &client, cluster_key, shared.tls.as_ref(), request.clone());
        let answer = tokio::time::timeout_at(deadline.into(), sent)
            .await
            .unwrap_or_else(|_| Err(Error::new(ErrorKind::Busy, format!("{to} did not answer in time"))));
        match answer {
            Ok(_) => {
                let _ = shared.shards.with(source, |s| {
                    // A node that stopped leading meanwhile rebuilt its partition from the
                    // log: nothing to leave a note in.
                    if s.serving() {
                        s.partition.set_moved(key, name, owner);
                    }
                });
                return Ok(Value::from(name));
            }
            Err(e) if e.kind == ErrorKind::NotLeader => {
                address = e.data.as_str().map(str::to_string);
                if address.is_none() {
                    tokio::time::sleep(RETRY_AFTER).await;
                }
                last = Some(e);
            }
            // Unreachable, or no answer: the adopt may have happened; resend it (the
            // origin makes that safe).
            Err(e) if e.kind == ErrorKind::Busy => {
                tokio::time::sleep(RETRY_AFTER).await;
                last = Some(e);
            }
            Err(e) => {
                put_back(shared, source, key, detached);
                return Err(e);
            }
        }
    }
    // An adopt sent may still be read by its node before it expires there.
    tokio::time::sleep_until((deadline + CLOCK_MARGIN).into()).await;
    put_back(shared, source, key, detached);
    let why = last.map_or_else(String::new, |e| format!(": {}", e.message));
    Err(Error::new(
        ErrorKind::Busy,
        format!(
            "could not move '{key}' to '{name}' within {} s: no answer from the leader of the name's shard{why}; \
             the object stays under its key",
            MOVE_DEADLINE.as_secs()
        ),
    ))
}

/// A move failed: the object goes back under its key (unless this node stopped leading its
/// shard meanwhile, which took the shard's ephemeral objects with it, or the session owning
/// the object ended meanwhile, which would have ended it).
fn put_back(shared: &Shared, source: usize, key: &str, detached: Detached) {
    if detached.owner().is_some_and(|owner| !shared.sessions.is_known(&owner)) {
        return;
    }
    let _ = shared.shards.put_back(source, key, detached);
}

/// `adopt`: put the object moved by `origin` under `name`, in the name's shard, which this
/// node must serve (`NotLeader` otherwise).
pub(crate) fn adopt(
    shared: &Shared,
    type_name: &str,
    name: &str,
    state: &Value,
    origin: &str,
    expires: u64,
) -> Result<Value, Error> {
    let Some(cluster) = shared.cluster.as_ref() else {
        return Err(Error::value(
            "this server is not part of a cluster (start it with --node-id)",
        ));
    };
    // A compiled object's module is compiled in the partition it comes into: found before
    // the shard's lock, as `define` takes the classes' lock and then shards'.
    let module = match compiled::is_compiled_type(type_name) {
        true => {
            let version = CompiledObject::snapshot_version(state)?;
            let code = hosts::class_code(&shared.hosts.classes(), type_name, &version)?;
            Some((version, code))
        }
        false => None,
    };
    let target = shared.shards.index_of(name);
    shared.shards.with(target, |s| {
        if !s.serving() {
            return Err(not_serving());
        }
        if cluster.adopted.contains(origin, name) {
            return Ok(Value::from(name));
        }
        if unix_ms(SystemTime::now()) > expires {
            return Err(Error::new(
                ErrorKind::Busy,
                format!("the move to '{name}' expired before it arrived (the object stays where it was)"),
            ));
        }
        if let Some((version, code)) = &module {
            s.partition.offer_class(type_name, version, code)?;
        }
        let detached = s.partition.decode_detached(type_name, state)?;
        s.partition.attach(name, detached).map_err(|(e, _)| e)?;
        s.calls += 1;
        cluster.adopted.insert(origin.to_string(), name.to_string());
        Ok(Value::from(name))
    })?
}
