//! Cluster mode: every shard is a Raft group (raft-rs) replicated on `rf` of the cluster's
//! nodes, placed by rendezvous hashing over the nodes that a metadata Raft group records
//! (see `meta`); each group's leader moves its replicas when nodes join or leave.
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
//!
//! The metadata group's leader judges which nodes are up, suspect or dead (see `liveness`);
//! placement leaves dead nodes out, so their replicas move to live ones.

pub(crate) mod format;
mod group;
mod liveness;
mod meta;
pub(crate) mod moves;
mod peers;
mod store;
pub(crate) mod two_phase;

use std::collections::{BTreeMap, VecDeque};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use spindle_core::{Delivery, Error, ErrorKind, Value};
use tokio::sync::{mpsc, oneshot};
use tracing::{info, warn};

use group::Event;
pub use liveness::DEFAULT_DEAD_AFTER;
pub(crate) use meta::Command as MetadataChange;
use meta::Liveness;

use crate::access::Access;
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
    /// Replicas per shard, for a new cluster (default 3; fewer while there are fewer nodes).
    pub replication_factor: usize,
    /// What the cluster's nodes authenticate to each other with (`--cluster-key`; the
    /// server's `--token` when not given): peer operations need it, always.
    pub key: Option<String>,
    /// `--dead-after`: a node not heard from for longer is declared dead, and its replicas
    /// move to live nodes.
    pub dead_after: Duration,
}

/// The largest Raft message (a batch of large entries) a peer sends, in parts, or accepts.
/// Snapshots stream through files instead, with no limit.
pub(crate) const MAX_RAFT_MESSAGE: usize = 1 << 30;

/// The data of a Raft snapshot that stands for the data in file `path` (see `store`).
pub(crate) fn snapshot_file_data(path: &std::path::Path) -> Vec<u8> {
    store::file_data(path)
}

/// Replicas per shard unless `--replication-factor` says otherwise.
pub const DEFAULT_REPLICATION_FACTOR: usize = 3;

/// The cluster side of a server: this node, its peers, and one Raft group per shard.
pub(crate) struct Cluster {
    pub(crate) node_id: u64,
    /// This node's advertised address.
    pub(crate) address: String,
    /// Known addresses of the cluster's nodes (from the log and from peers' messages).
    nodes: Mutex<BTreeMap<u64, String>>,
    /// The shards' groups, then the metadata group (at index `meta_group`).
    pub(crate) groups: Box<[GroupHandle]>,
    meta_group: usize,
    /// The cluster's nodes and replication factor, as the metadata group applied them.
    meta: Mutex<meta::Meta>,
    peers: peers::Peers,
    /// `--join`, for a new node until it is a member of every shard.
    join: Option<String>,
    /// Objects other nodes moved here by `keep` lately (a resent `adopt` is recognized).
    adopted: moves::Adopted,
    /// The groups' Raft logs and snapshots (`DIR/raft`).
    raft_dir: PathBuf,
    /// Snapshots received from peers so far (each is written to a file of its own).
    received: AtomicU64,
    /// Files of snapshots received whole and not yet taken by their group.
    finished: Mutex<std::collections::HashSet<PathBuf>>,
    /// Where the users and roles the metadata group applies take effect.
    access: Arc<Access>,
    /// The cluster format this node wrote last (see `active_format`).
    writes_format: AtomicU64,
    /// The newest format of a metadata entry applied here: the cluster has moved to it and
    /// never goes back (a node of an older release cannot join it).
    format_floor: AtomicU64,
    /// When each node was last heard from (the metadata group's leader judges by it).
    heard: liveness::Heard,
    /// `--dead-after`.
    dead_after: Duration,
    /// The shard whose replicas this node (its leader) is moving: one at a time.
    moving: Mutex<Option<usize>>,
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
    /// Tasks waiting for a proposal to commit (dropped, unsent, if it may never).
    signals: VecDeque<(u64, oneshot::Sender<()>)>,
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
        if self
            .events
            .send(Event::Propose(self.epoch, self.proposed, records))
            .is_err()
        {
            return fail(deliveries, &not_leader(None));
        }
        if !deliveries.is_empty() {
            self.held.push_back((self.proposed, deliveries));
        }
        Vec::new()
    }

    /// [`submit`](Self::submit), and a signal once the proposal commits (an error if this
    /// replica stops serving first: it may never).
    pub(crate) fn submit_signal(
        &mut self,
        records: Vec<Vec<u8>>,
        deliveries: Vec<Delivery>,
    ) -> (Vec<Delivery>, oneshot::Receiver<()>) {
        let (tx, rx) = oneshot::channel();
        let now = self.submit(records, deliveries);
        if self.serving {
            self.signals.push_back((self.proposed, tx));
        }
        (now, rx)
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
        while self.signals.front().is_some_and(|(p, _)| *p <= proposal) {
            if let Some((_, signal)) = self.signals.pop_front() {
                let _ = signal.send(());
            }
        }
        Some(out)
    }

    /// Stop serving: the held replies fail with `error`.
    fn stop(&mut self, error: &Error) -> Vec<Delivery> {
        self.serving = false;
        self.signals.clear();
        let held: Vec<Delivery> = self.held.drain(..).flat_map(|(_, d)| d).collect();
        fail(held, error)
    }

    /// Start serving; returns the new epoch.
    fn start(&mut self) -> u64 {
        self.serving = true;
        self.epoch += 1;
        self.proposed = 0;
        self.epoch
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

/// `TransactionError` saying that `what` needs every node upgraded, on a cluster whose nodes
/// do not all read `format` yet.
pub(crate) fn require_format(shared: &Shared, format: u64, what: &str) -> Result<(), Error> {
    match &shared.cluster {
        Some(cluster) if cluster.active_format() < format => Err(Error::new(
            ErrorKind::TransactionError,
            format!("{what} need every node of the cluster upgraded to a release that runs them"),
        )),
        _ => Ok(()),
    }
}

/// A call this node may not run: it does not lead the shard (clients resend to the leader).
pub(crate) fn not_serving() -> Error {
    Error::new(ErrorKind::NotLeader, "this node does not lead the object's shard")
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

    /// The cluster format to write: the newest every node of the cluster reads (see
    /// `format`). A node that has not told since this one started counts as format 1.
    pub(crate) fn active_format(&self) -> u64 {
        let active = {
            // Nodes declared dead do not hold it back: they may never come back (and one that
            // does is of a release that read the format it was declared dead in).
            let meta = self.meta.lock().unwrap_or_else(|e| e.into_inner());
            meta.nodes
                .keys()
                .filter(|&&n| n != self.node_id && meta.liveness(n) != meta::Liveness::Dead)
                .map(|&n| self.peers.format_of(n))
                .fold(format::NEWEST, u64::min)
                .max(self.format_floor.load(Ordering::Relaxed))
        };
        let before = self.writes_format.swap(active, Ordering::Relaxed);
        if before != active {
            info!(
                "writing cluster format {active} (the newest every node reads; this node reads up to {})",
                format::NEWEST
            );
        }
        active
    }

    /// Keep a link to every other node of the cluster (see `Peers::reach`).
    fn reach_every_node(&self, shared: &Arc<Shared>) {
        let nodes: Vec<u64> = {
            let meta = self.meta.lock().unwrap_or_else(|e| e.into_inner());
            meta.nodes.keys().copied().filter(|&n| n != self.node_id).collect()
        };
        self.peers.reach(shared, nodes.into_iter());
    }

    pub(crate) fn meta(&self) -> meta::Meta {
        self.meta.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    fn apply_meta(&self, command: meta::Command) {
        let acl_changed = matches!(command, meta::Command::Acl(_));
        let mut meta = self.meta.lock().unwrap_or_else(|e| e.into_inner());
        meta.apply(command);
        if acl_changed {
            self.access.set(meta.acl.clone());
        }
        if meta.nodes.contains_key(&self.node_id) {
            self.access.set_ready();
        }
    }

    /// Replace the metadata with that rebuilt by `commands` (a metadata snapshot's).
    fn restore_meta(&self, commands: Vec<meta::Command>) {
        let mut meta = meta::Meta::default();
        for command in commands {
            if let meta::Command::AddNode { node, address } = &command {
                self.learn_address(*node, address);
            }
            meta.apply(command);
        }
        self.access.set(meta.acl.clone());
        if meta.nodes.contains_key(&self.node_id) {
            self.access.set_ready();
        }
        *self.meta.lock().unwrap_or_else(|e| e.into_inner()) = meta;
    }

    /// A new file to receive a snapshot for `group` into.
    pub(crate) fn incoming_snapshot(&self, group: u64) -> PathBuf {
        let n = self.received.fetch_add(1, Ordering::Relaxed);
        store::incoming_file(&self.raft_dir, u32::try_from(group).unwrap_or(u32::MAX), n)
    }

    /// The snapshot received into `path` came whole (its group may take it).
    pub(crate) fn snapshot_finished(&self, path: PathBuf) {
        self.finished.lock().unwrap_or_else(|e| e.into_inner()).insert(path);
    }

    /// Take the snapshot received into `path`: false unless it came whole and nobody took it,
    /// so a message can name no other file (not even one still being written).
    pub(crate) fn take_finished(&self, path: &std::path::Path) -> bool {
        self.finished.lock().unwrap_or_else(|e| e.into_inner()).remove(path)
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

    /// The `NotLeader` error for group `group`, naming where to go: its leader if this node
    /// knows it, else a node placed to hold the group (a member knows its leader), so that
    /// a client reaches the leader within two hops.
    pub(crate) fn redirect(&self, group: usize) -> Error {
        not_leader(self.leader_guess(group).as_deref())
    }

    /// Where to send a request for group `group`: its leader, or a node that should know it
    /// (this node itself if it leads the group; `None` while nobody is known).
    pub(crate) fn leader_address(&self, group: usize) -> Option<String> {
        self.leader_guess(group).or_else(|| {
            (self.groups[group].leader.load(Ordering::Relaxed) == self.node_id).then(|| self.address.clone())
        })
    }

    /// Whether shard `group`'s leader may start moving its replicas: this node moves one
    /// shard at a time (each move copies a shard to a new replica while the cluster serves).
    pub(crate) fn claim_move(&self, group: usize) -> bool {
        let mut moving = self.moving.lock().unwrap_or_else(|e| e.into_inner());
        *moving.get_or_insert(group) == group
    }

    /// Shard `group` has its placed replicas (or this node no longer leads it).
    pub(crate) fn end_move(&self, group: usize) {
        let mut moving = self.moving.lock().unwrap_or_else(|e| e.into_inner());
        if *moving == Some(group) {
            *moving = None;
        }
    }

    /// The address of group `group`'s leader, or of a node that should know it; never a node
    /// declared suspect or dead (a client then asks another node).
    fn leader_guess(&self, group: usize) -> Option<String> {
        let meta = self.meta();
        let placed = match group == self.meta_group {
            true => meta.meta_voters(group as u64),
            false => meta.shard_replicas(group as u64),
        };
        let leader = self.groups[group].leader.load(Ordering::Relaxed);
        if leader == self.node_id {
            return None; // Leading, not serving yet: retry here shortly.
        }
        let live = |n: u64| n != self.node_id && meta.liveness(n) == Liveness::Up;
        let up = |n: u64| live(n) && !self.peers.is_down(n);
        // A node the group moved away from may never hear of it again: its own view of the
        // leader is trusted only while it is placed to hold the group, or names a placed node.
        let trusted = placed.contains(&self.node_id) || group == self.meta_group || placed.contains(&leader);
        if leader != 0 && trusted && up(leader) {
            return self.address_of(leader);
        }
        placed
            .iter()
            .copied()
            .filter(|&n| up(n))
            .chain(placed.iter().copied().filter(|&n| live(n)))
            .find_map(|n| self.address_of(n))
    }

    /// Raft messages from node `from` for shard `group`.
    /// Hand `messages` of group `group` from node `from` to the group; false if there is no
    /// such group here (or it stopped).
    pub(crate) fn receive(&self, from: u64, address: &str, group: u64, messages: Vec<Vec<u8>>) -> bool {
        self.learn_address(from, address);
        self.heard.record(from);
        usize::try_from(group)
            .ok()
            .and_then(|g| self.groups.get(g))
            .is_some_and(|g| g.events.send(Event::Messages(messages)).is_ok())
    }

    /// Send `request` (a peer operation about shard `group`) to the group's leader,
    /// following `NotLeader` answers a few times.
    pub(crate) async fn ask_leader(&self, shared: &Shared, group: usize, request: Vec<Value>) -> Result<Value, Error> {
        let key = shared.access.cluster_key().unwrap_or_default().to_string();
        let name = self.name();
        let mut target = self.leader_address(group);
        for _ in 0..4 {
            let Some(address) = target.take() else {
                tokio::time::sleep(Duration::from_millis(50)).await;
                target = self.leader_address(group);
                continue;
            };
            let asked = self
                .peers
                .request(&address, &name, &key, shared.tls.as_ref(), request.clone());
            match asked.await {
                Err(e) if e.kind == ErrorKind::NotLeader => {
                    target = e.data.as_str().map(str::to_string);
                    if target.is_none() {
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        target = self.leader_address(group);
                    }
                }
                reply => return reply,
            }
        }
        Err(not_leader(None))
    }

    /// Whether `group` is one of this node's groups.
    pub(crate) fn has_group(&self, group: u64) -> bool {
        usize::try_from(group).is_ok_and(|g| g < self.groups.len())
    }

    /// Ask the metadata group (here: its leader) to add or remove a node.
    pub(crate) async fn change(&self, change: MetadataChange) -> Result<Value, Error> {
        let g = &self.groups[self.meta_group];
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
        let meta = self.meta();
        let mut nodes = self.nodes.lock().unwrap_or_else(|e| e.into_inner()).clone();
        nodes.retain(|id, _| meta.nodes.contains_key(id));
        let address = |id: u64| self.address_of(id).map_or(Value::Nil, Value::from);
        let ids = |v: &[u64]| Value::Array(v.iter().map(|&n| Value::from(n)).collect());
        let mut groups: Vec<Value> = self
            .groups
            .iter()
            .enumerate()
            .map(|(i, g)| {
                let view = g.view.lock().unwrap_or_else(|e| e.into_inner()).clone();
                let leader = g.leader.load(Ordering::Relaxed);
                let placed = match i == self.meta_group {
                    true => meta.meta_voters(i as u64),
                    false => meta.shard_replicas(i as u64),
                };
                Value::Map(vec![
                    ("shard".into(), (i as u64).into()),
                    ("placement".into(), ids(&placed)),
                    ("leader".into(), leader.into()),
                    // Where a client should send the group's calls: its leader, or a node
                    // that knows it.
                    (
                        "leader_address".into(),
                        match leader {
                            n if n != 0 && meta.liveness(n) == Liveness::Up => address(n),
                            _ => self.leader_guess(i).map_or(Value::Nil, Value::from),
                        },
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
        let metadata = groups.pop().unwrap_or(Value::Nil);
        Value::Map(vec![
            ("node".into(), self.node_id.into()),
            ("address".into(), self.address.as_str().into()),
            ("shards".into(), (groups.len() as u64).into()),
            ("replication_factor".into(), (meta.rf as u64).into()),
            // The format this node writes (the newest all nodes read) and reads at most.
            ("cluster_format".into(), self.active_format().into()),
            ("reads_cluster_format".into(), format::NEWEST.into()),
            ("metadata".into(), metadata),
            (
                "nodes".into(),
                Value::Map(
                    nodes
                        .iter()
                        .map(|(id, a)| (Value::from(*id), Value::from(a.as_str())))
                        .collect(),
                ),
            ),
            ("groups".into(), Value::Array(groups)),
            ("liveness".into(), self.liveness_view(&meta)),
        ])
    }

    /// Each node's declared liveness, and how long ago this node last heard it (the
    /// metadata group's leader hears every node).
    fn liveness_view(&self, meta: &meta::Meta) -> Value {
        let now = Instant::now();
        Value::Map(
            meta.nodes
                .keys()
                .map(|&n| {
                    let heard = match n == self.node_id {
                        true => Some(now),
                        false => self.heard.last(n),
                    };
                    let ago = heard.map_or(Value::Nil, |t| Value::from(now.duration_since(t).as_millis() as u64));
                    let entry = vec![
                        ("state".into(), meta.liveness(n).name().into()),
                        ("last_heard_ms".into(), ago),
                    ];
                    (Value::from(n), Value::Map(entry))
                })
                .collect(),
        )
    }

    /// The verdicts of the metadata group's leader (`judge`) on the nodes, now.
    fn judge(&self, judge: &mut liveness::Judge) -> Vec<meta::Command> {
        let meta = self.meta();
        judge.verdicts(
            &meta,
            self.node_id,
            |n| self.heard.last(n),
            self.dead_after,
            Instant::now(),
        )
    }
}

/// One request to a node, on a connection of its own (before this node is running).
pub(crate) async fn peers_request(
    address: &str,
    key: &str,
    tls: Option<&crate::tls::Tls>,
    request: Vec<Value>,
) -> Result<Value, Error> {
    peers::request(address, "spindle-joining-node", key, tls, request).await
}

/// The parts of cluster mode made before the server's shared state exists.
pub(crate) struct Prepared {
    pub(crate) cluster: Cluster,
    pub(crate) replicas: Vec<Replica>,
    pub(crate) drivers: Vec<group::Driver>,
}

/// Open every shard's Raft log in `dir/raft` and prepare its group (started by [`start`]).
pub(crate) fn prepare(
    config: &ClusterConfig,
    dir: &std::path::Path,
    address: String,
    shards: usize,
    fsync: crate::config::Fsync,
    snapshot_after: u64,
    access: Arc<Access>,
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
    // A new cluster starts here only on a fresh data directory: a member restarted without
    // --join must never make itself the only voter of a group it does not hold.
    let fresh = !raft_dir.exists();
    let bootstrap = (config.join.is_none() && fresh).then_some(config.replication_factor.max(1));
    // The shards' groups, then the metadata group.
    for index in 0..=shards {
        let meta = index == shards;
        let store = store::Store::open(&raft_dir, index as u32)?;
        let (tx, rx) = mpsc::unbounded_channel();
        let driver = group::Driver::new(
            config.node_id,
            index,
            meta,
            store,
            rx,
            bootstrap,
            &address,
            &mut nodes,
            fsync,
            snapshot_after,
        )?;
        drivers.push(driver);
        groups.push(GroupHandle {
            events: tx.clone(),
            leader: AtomicU64::new(0),
            view: Mutex::new(GroupView::default()),
        });
        if !meta {
            replicas.push(Replica {
                serving: false,
                node_id: config.node_id,
                epoch: 0,
                proposed: 0,
                held: VecDeque::new(),
                signals: VecDeque::new(),
                events: tx,
            });
        }
    }
    let cluster = Cluster {
        node_id: config.node_id,
        address,
        nodes: Mutex::new(nodes),
        groups: groups.into_boxed_slice(),
        meta_group: shards,
        meta: Mutex::new(meta::Meta::default()),
        peers: peers::Peers::default(),
        join: config.join.clone(),
        adopted: moves::Adopted::default(),
        raft_dir,
        received: AtomicU64::new(0),
        finished: Mutex::default(),
        access,
        writes_format: AtomicU64::new(format::OLDEST),
        format_floor: AtomicU64::new(format::OLDEST),
        heard: liveness::Heard::default(),
        dead_after: config.dead_after,
        moving: Mutex::new(None),
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
    tokio::spawn(two_phase::recover(shared.clone()));
}

/// A new node asks the metadata group's leader to add it, until the metadata it follows
/// lists it; its shards' groups then take it in as their placement says.
async fn join(shared: Arc<Shared>) {
    let Some(cluster) = shared.cluster.as_ref() else { return };
    let Some(seed) = cluster.join.clone() else { return };
    let key = shared.access.cluster_key().unwrap_or_default().to_string();
    let started = Instant::now();
    let mut target = seed.clone();
    let mut announced = false;
    while !cluster.meta().nodes.contains_key(&cluster.node_id) {
        let request = vec!["join".into(), cluster.node_id.into(), cluster.address.as_str().into()];
        match peers::request(&target, &cluster.name(), &key, shared.tls.as_ref(), request).await {
            Ok(_) => {}
            Err(e) if e.kind == ErrorKind::NotLeader => {
                // Ask the leader it names next (or the seed again, mid-election).
                target = e.data.as_str().map_or_else(|| seed.clone(), str::to_string);
                continue;
            }
            Err(e) => {
                if !announced {
                    warn!("joining through {target}: {} (retrying)", e.message);
                    announced = true;
                }
                target = seed.clone();
            }
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    info!(
        "joined the cluster in {:.1} s; shards placed here are moving in",
        started.elapsed().as_secs_f64()
    );
}
