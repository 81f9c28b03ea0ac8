//! Cluster mode: every shard is a Raft group (raft-rs) replicated on the cluster's nodes.
//!
//! A shard's leader runs calls on its partition as a single server does; the op-log records
//! its partition produces for persistent objects become Raft entries instead of local log
//! writes, and the replies that depend on them wait until their entry commits (the way they
//! wait for an `fsync` on a single server). Followers replay committed entries through the
//! same `Partition::replay` that recovery uses, so every replica is the same pure state
//! machine fed by the Raft log. Ephemeral and synchronization objects live on the leader
//! alone (replication factor 1, as in CRUCIAL). A read of a persistent object commits an
//! empty entry first, so no reply shows state that a new leader could lack.
//!
//! When a node stops leading a shard, it answers the calls waiting there with `NotLeader`
//! (clients retry them on the new leader with the same `(client, seq)`, so they apply once)
//! and rebuilds its partition from the committed log, dropping anything applied that never
//! committed. Calls reaching a node that does not lead their shard are answered `NotLeader`
//! with the leader's address: clients follow it and cache the shard map.

mod group;
mod peers;
mod store;

use std::collections::{BTreeMap, VecDeque};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use spindle_core::{Delivery, Error, ErrorKind, Value};
use tokio::sync::{mpsc, oneshot};
use tracing::{info, warn};

pub(crate) use group::Change as MembershipChange;
use group::Event;

use crate::Shared;

/// `--node-id`, `--join` and `--advertise` of `spindle server`.
#[derive(Clone, Debug)]
pub struct ClusterConfig {
    /// This node's id in the cluster (not 0); it names the node in every shard's Raft group.
    pub node_id: u64,
    /// A node of the cluster to join; `None` starts a new cluster (or restarts a member).
    pub join: Option<String>,
    /// The address other nodes and clients use to reach this one (default: the bound one).
    pub advertise: Option<String>,
}

/// The cluster side of a server: this node, its peers, and one Raft group per shard.
pub(crate) struct Cluster {
    pub(crate) node_id: u64,
    /// This node's advertised address.
    pub(crate) address: String,
    /// Known addresses of the cluster's nodes (from the log and from peers' messages).
    nodes: Mutex<BTreeMap<u64, String>>,
    pub(crate) groups: Box<[GroupHandle]>,
    peers: peers::Peers,
    /// `--join`, for a new node until it is a member of every shard.
    join: Option<String>,
}

/// What the rest of the server sees of one shard's Raft group.
pub(crate) struct GroupHandle {
    events: mpsc::UnboundedSender<Event>,
    /// The leader as last seen (0: unknown).
    leader: AtomicU64,
    /// The group's state for `cluster` (updated by its driver).
    pub(crate) view: Mutex<GroupView>,
}

#[derive(Clone, Default)]
pub(crate) struct GroupView {
    pub(crate) term: u64,
    pub(crate) commit: u64,
    pub(crate) applied: u64,
    pub(crate) voters: Vec<u64>,
    pub(crate) learners: Vec<u64>,
    pub(crate) serving: bool,
}

/// A shard's replica state, kept under the shard lock beside its partition.
pub(crate) struct Replica {
    /// Calls may run here: this node leads the shard and has applied the whole log of
    /// earlier terms.
    pub(crate) serving: bool,
    node_id: u64,
    /// Bumped when serving starts: entries this node proposed while serving carry it, so a
    /// committed entry is known to be already applied here only if it is of this epoch.
    epoch: u64,
    /// Proposals made in this epoch.
    proposed: u64,
    /// Replies waiting for a proposal to commit, oldest first.
    held: VecDeque<(u64, Vec<Delivery>)>,
    events: mpsc::UnboundedSender<Event>,
}

impl Replica {
    /// A call's op-log `records` (possibly none: a read of persistent state) become one
    /// proposal; `deliveries` wait until it commits.
    pub(crate) fn submit(&mut self, records: Vec<Vec<u8>>, deliveries: Vec<Delivery>) -> Vec<Delivery> {
        if !self.serving {
            // The partition changes only through the log while not serving.
            return fail(deliveries, &not_leader(None));
        }
        self.proposed += 1;
        let data = group::encode_entry(self.node_id, self.epoch, self.proposed, records);
        if self.events.send(Event::Propose(data)).is_err() {
            return fail(deliveries, &not_leader(None));
        }
        if !deliveries.is_empty() {
            self.held.push_back((self.proposed, deliveries));
        }
        Vec::new()
    }

    /// Entry `proposal` of `epoch`, proposed here, committed: the replies up to it may go.
    /// Returns `None` when the entry is not one of this serving epoch's (it must be replayed).
    fn committed(&mut self, node: u64, epoch: u64, proposal: u64) -> Option<Vec<Delivery>> {
        if !self.serving || node != self.node_id || epoch != self.epoch {
            return None;
        }
        let mut out = Vec::new();
        while self.held.front().is_some_and(|(p, _)| *p <= proposal) {
            out.extend(self.held.pop_front().map(|(_, d)| d).unwrap_or_default());
        }
        Some(out)
    }

    /// Stop serving: the held replies fail with `error`.
    fn stop(&mut self, error: &Error) -> Vec<Delivery> {
        self.serving = false;
        let held: Vec<Delivery> = self.held.drain(..).flat_map(|(_, d)| d).collect();
        fail(held, error)
    }

    fn start(&mut self) {
        self.serving = true;
        self.epoch += 1;
        self.proposed = 0;
    }
}

fn fail(deliveries: Vec<Delivery>, error: &Error) -> Vec<Delivery> {
    deliveries
        .into_iter()
        .map(|d| Delivery {
            token: d.token,
            reply: Err(error.clone()),
        })
        .collect()
}

/// The answer to a call on a shard this node does not serve: try `leader` (an address).
pub(crate) fn not_leader(leader: Option<&str>) -> Error {
    match leader {
        Some(address) => Error::new(
            ErrorKind::NotLeader,
            format!("this node does not lead the object's shard; its leader is {address}"),
        )
        .with_data(Value::from(address)),
        None => Error::new(
            ErrorKind::NotLeader,
            "the object's shard has no leader at the moment (an election is under way); retry shortly",
        ),
    }
}

impl Cluster {
    /// The name this node uses in `hello` to its peers.
    pub(crate) fn name(&self) -> String {
        format!("spindle-node-{}", self.node_id)
    }

    pub(crate) fn address_of(&self, node: u64) -> Option<String> {
        self.nodes.lock().unwrap_or_else(|e| e.into_inner()).get(&node).cloned()
    }

    pub(crate) fn learn_address(&self, node: u64, address: &str) {
        if node == 0 || address.is_empty() {
            return;
        }
        let mut nodes = self.nodes.lock().unwrap_or_else(|e| e.into_inner());
        if nodes.get(&node).map(String::as_str) != Some(address) {
            info!(node, address, "learned a node's address");
            nodes.insert(node, address.to_string());
        }
    }

    /// The `NotLeader` error for shard `group`, naming its leader if known.
    pub(crate) fn redirect(&self, group: usize) -> Error {
        let leader = self.groups[group].leader.load(Ordering::Relaxed);
        let address = (leader != 0 && leader != self.node_id)
            .then(|| self.address_of(leader))
            .flatten();
        not_leader(address.as_deref())
    }

    /// Raft messages from node `from` for shard `group`.
    pub(crate) fn receive(&self, from: u64, address: &str, group: u64, messages: Vec<Vec<u8>>) {
        self.learn_address(from, address);
        if let Some(g) = usize::try_from(group).ok().and_then(|g| self.groups.get(g)) {
            let _ = g.events.send(Event::Messages(messages));
        }
    }

    /// Ask shard `group`'s Raft group (here: its leader) to add or remove a node.
    pub(crate) async fn change(&self, group: u64, change: MembershipChange) -> Result<Value, Error> {
        let Some(g) = usize::try_from(group).ok().and_then(|g| self.groups.get(g)) else {
            return Err(Error::value(format!(
                "there is no shard {group}: the cluster has {} shards",
                self.groups.len()
            )));
        };
        let (reply, answer) = oneshot::channel();
        g.events
            .send(Event::Change(change, reply))
            .map_err(|_| Error::new(ErrorKind::Internal, "the shard's Raft group stopped"))?;
        answer
            .await
            .map_err(|_| Error::new(ErrorKind::Internal, "the shard's Raft group stopped"))?
    }

    /// The cluster map: nodes, and each shard's replicas, leader and progress.
    pub(crate) fn map(&self) -> Value {
        let nodes = self.nodes.lock().unwrap_or_else(|e| e.into_inner()).clone();
        let address = |id: u64| nodes.get(&id).map_or(Value::Nil, |a| Value::from(a.as_str()));
        let shards = self
            .groups
            .iter()
            .enumerate()
            .map(|(i, g)| {
                let view = g.view.lock().unwrap_or_else(|e| e.into_inner()).clone();
                let leader = g.leader.load(Ordering::Relaxed);
                let ids = |v: &[u64]| Value::Array(v.iter().map(|&n| Value::from(n)).collect());
                Value::Map(vec![
                    ("shard".into(), (i as u64).into()),
                    ("leader".into(), leader.into()),
                    (
                        "leader_address".into(),
                        if leader == 0 { Value::Nil } else { address(leader) },
                    ),
                    ("voters".into(), ids(&view.voters)),
                    ("learners".into(), ids(&view.learners)),
                    ("term".into(), view.term.into()),
                    ("commit".into(), view.commit.into()),
                    ("applied".into(), view.applied.into()),
                    ("serving_here".into(), view.serving.into()),
                ])
            })
            .collect();
        Value::Map(vec![
            ("node".into(), self.node_id.into()),
            ("address".into(), self.address.as_str().into()),
            ("shards".into(), (self.groups.len() as u64).into()),
            (
                "nodes".into(),
                Value::Map(
                    nodes
                        .iter()
                        .map(|(id, a)| (Value::from(*id), Value::from(a.as_str())))
                        .collect(),
                ),
            ),
            ("groups".into(), Value::Array(shards)),
        ])
    }
}

/// One request to a node, on a connection of its own (before this node is running).
pub(crate) async fn peers_request(address: &str, token: Option<&str>, request: Vec<Value>) -> Result<Value, Error> {
    peers::request(address, "spindle-joining-node", token, request).await
}

/// The parts of cluster mode made before the server's shared state exists.
pub(crate) struct Prepared {
    pub(crate) cluster: Cluster,
    pub(crate) replicas: Vec<Replica>,
    drivers: Vec<group::Driver>,
}

/// Open every shard's Raft log in `dir/raft` and prepare its group (started by [`start`]).
pub(crate) fn prepare(
    config: &ClusterConfig,
    dir: &std::path::Path,
    address: String,
    shards: usize,
) -> std::io::Result<Prepared> {
    if config.node_id == 0 {
        return Err(std::io::Error::other("--node-id must not be 0"));
    }
    check_node_id(dir, config.node_id)?;
    let raft_dir: PathBuf = dir.join("raft");
    let mut groups = Vec::new();
    let mut replicas = Vec::new();
    let mut drivers = Vec::new();
    let mut nodes = BTreeMap::new();
    nodes.insert(config.node_id, address.clone());
    for index in 0..shards {
        let store = store::Store::open(&raft_dir, index as u32)?;
        let (tx, rx) = mpsc::unbounded_channel();
        let driver = group::Driver::new(
            config.node_id,
            index,
            store,
            rx,
            config.join.is_none(),
            &address,
            &mut nodes,
        )?;
        groups.push(GroupHandle {
            events: tx.clone(),
            leader: AtomicU64::new(0),
            view: Mutex::new(GroupView::default()),
        });
        replicas.push(Replica {
            serving: false,
            node_id: config.node_id,
            epoch: 0,
            proposed: 0,
            held: VecDeque::new(),
            events: tx,
        });
        drivers.push(driver);
    }
    let cluster = Cluster {
        node_id: config.node_id,
        address,
        nodes: Mutex::new(nodes),
        groups: groups.into_boxed_slice(),
        peers: peers::Peers::default(),
        join: config.join.clone(),
    };
    Ok(Prepared {
        cluster,
        replicas,
        drivers,
    })
}

/// The data directory belongs to one node id for life.
fn check_node_id(dir: &std::path::Path, node_id: u64) -> std::io::Result<()> {
    let path = dir.join("node");
    match std::fs::read_to_string(&path) {
        Ok(text) => match text.trim().parse::<u64>() {
            Ok(id) if id == node_id => Ok(()),
            Ok(id) => Err(std::io::Error::other(format!(
                "{} belongs to node {id}, not {node_id}: start with --node-id {id}, or use another --data-dir",
                dir.display()
            ))),
            Err(_) => Err(std::io::Error::other(format!("{} is not a node id", path.display()))),
        },
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            std::fs::write(&path, format!("{node_id}\n"))?;
            spindle_storage::sync_dir(dir)
        }
        Err(e) => Err(e),
    }
}

/// Start the shards' drivers, and joining if this is a new node with `--join`.
pub(crate) fn start(shared: &Arc<Shared>, drivers: Vec<group::Driver>) {
    for driver in drivers {
        tokio::spawn(driver.run(shared.clone()));
    }
    if shared.cluster.as_ref().is_some_and(|c| c.join.is_some()) {
        tokio::spawn(join(shared.clone()));
    }
}

impl Prepared {
    pub(crate) fn into_parts(self) -> (Cluster, Vec<Replica>, Vec<group::Driver>) {
        (self.cluster, self.replicas, self.drivers)
    }
}

/// A new node asks each shard's leader to add it, until it is a voter of every shard.
async fn join(shared: Arc<Shared>) {
    let Some(cluster) = shared.cluster.as_ref() else { return };
    let Some(seed) = cluster.join.clone() else { return };
    let token = shared.config.functions.token.clone();
    let started = Instant::now();
    let mut announced = false;
    loop {
        let pending: Vec<usize> = (0..cluster.groups.len())
            .filter(|&g| {
                let view = cluster.groups[g].view.lock().unwrap_or_else(|e| e.into_inner());
                !view.voters.contains(&cluster.node_id)
            })
            .collect();
        if pending.is_empty() {
            info!(
                "joined the cluster: a voter of all {} shards after {:.1} s",
                cluster.groups.len(),
                started.elapsed().as_secs_f64()
            );
            return;
        }
        for g in pending {
            let target = cluster.groups[g].leader.load(Ordering::Relaxed);
            let address = match target {
                0 => seed.clone(),
                n if n == cluster.node_id => continue,
                n => cluster.address_of(n).unwrap_or_else(|| seed.clone()),
            };
            let request = vec![
                "join".into(),
                cluster.node_id.into(),
                cluster.address.as_str().into(),
                (g as u64).into(),
            ];
            match peers::request(&address, &cluster.name(), token.as_deref(), request).await {
                Ok(_) => {}
                Err(e) if e.kind == ErrorKind::NotLeader => {
                    if let Some(leader) = e.data.as_str() {
                        // Learn who leads: the next round asks it.
                        let _ = peers::request(
                            leader,
                            &cluster.name(),
                            token.as_deref(),
                            vec![
                                "join".into(),
                                cluster.node_id.into(),
                                cluster.address.as_str().into(),
                                (g as u64).into(),
                            ],
                        )
                        .await;
                    }
                }
                Err(e) if !announced => {
                    warn!(shard = g, "joining through {address}: {e} (retrying)");
                    announced = true;
                }
                Err(_) => {}
            }
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
}
