//! One Raft group on this node (a shard, or the cluster's metadata): a task that owns the
//! raft-rs `RawNode` and its storage, steps peers' messages into it, proposes the leader's
//! entries, persists and sends what each `Ready` holds, and applies committed entries (to
//! the shard's partition, or to the metadata). Its leader also moves the group's replicas
//! towards their placement, one membership change at a time.

use ahash::HashMap;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use protobuf::Message as _;
use raft::prelude::{
    ConfChange, ConfChangeType, ConfState, Entry, EntryType, HardState, Message, MessageType, Snapshot,
    SnapshotMetadata,
};
use raft::{ProgressState, RawNode, SnapshotStatus, StateRole};
use spindle_core::objects::compiled::Library;
use spindle_core::{Error, ErrorKind, Partition, Value};
use tokio::sync::{mpsc, oneshot};
use tracing::{debug, error, info, warn};

use super::format;
use super::liveness::Judge;
use super::meta::{Command, Liveness, Meta};
use super::store::{data_file, RaftStorage, SnapshotData, Store};
use crate::config::Fsync;
use crate::{hosts, Shared};

/// Raft's clock: elections after 10-20 ticks without a leader, heartbeats every 2.
const TICK: Duration = Duration::from_millis(50);
const ELECTION_TICKS: usize = 10;
const HEARTBEAT_TICKS: usize = 2;
/// Events handled before the next `Ready` (a batch: many proposals, one fsync).
const BATCH: usize = 1024;
/// Record bytes of consecutive proposals merged into one entry, at most (far below a
/// Raft message's limit, and a follower applies an entry under one hold of its lock).
const ENTRY_BYTES: usize = 256 << 10;
/// Ticks between two leadership transfers to a group's preferred leader (no ping-pong).
const TRANSFER_COOLDOWN: u32 = 40;
/// Ticks between two elections a node stands in for a leader that is down.
const RESTAND_TICKS: u32 = 2;
/// Ticks a peer may stay waiting for a snapshot before it is sent again (it was lost), plus
/// one tick per this many bytes of snapshot (10 MiB/s: a large one takes time to travel and
/// install, and resending it meanwhile would only add copies).
const SNAPSHOT_RETRY_TICKS: u32 = 100;
const SNAPSHOT_BYTES_PER_TICK: usize = 512 << 10;
/// Bytes of a partition captured per hold of the shard lock while taking a snapshot.
const SNAPSHOT_CHUNK: usize = 1 << 20;

pub(crate) enum Event {
    /// Protobuf-encoded Raft messages from a peer.
    Messages(Vec<Vec<u8>>),
    /// A serving leader's proposal: its epoch, its number, and its op-log records.
    Propose(u64, u64, Vec<Vec<u8>>),
    /// The body of snapshot capture `id`, or why it failed.
    Captured(u64, Result<SnapshotData, String>),
    /// A change of the cluster's nodes (metadata group only), answered once proposed.
    Change(Command, oneshot::Sender<Result<Value, Error>>),
}

/// An entry proposed by a shard's leader: `[node, epoch, proposal, [record, ...]]` in cluster
/// format `format`, written straight into a buffer of its size (the records are copied once).
pub(crate) fn encode_entry(format: u64, node: u64, epoch: u64, proposal: u64, records: &[Vec<u8>]) -> Vec<u8> {
    // Markers and lengths: at most 9 bytes an integer, 5 a record, 5 the array, 10 the format.
    let size = 10 + 1 + 3 * 9 + 5 + records.iter().map(|r| 5 + r.len()).sum::<usize>();
    let mut out = Vec::with_capacity(size);
    format::write_mark(&mut out, format);
    // Writing to a Vec cannot fail.
    let _ = rmp::encode::write_array_len(&mut out, 4);
    for n in [node, epoch, proposal] {
        let _ = rmp::encode::write_uint(&mut out, n);
    }
    let _ = rmp::encode::write_array_len(&mut out, records.len() as u32);
    for record in records {
        let _ = rmp::encode::write_bin(&mut out, record);
    }
    out
}

struct Proposed<'a> {
    node: u64,
    epoch: u64,
    proposal: u64,
    records: Vec<&'a [u8]>,
}

/// Decode an entry, its records borrowed from it (read straight from the bytes).
fn decode_entry(data: &[u8]) -> Result<Proposed<'_>, String> {
    let bad = || "an entry that is not [node, epoch, proposal, records]".to_string();
    // Every format this build reads has the same body so far.
    let (_, mut rd) = format::open(data, "the entry")?;
    if rmp::decode::read_array_len(&mut rd).map_err(|_| bad())? != 4 {
        return Err(bad());
    }
    let mut uint = || rmp::decode::read_int::<u64, _>(&mut rd).map_err(|_| bad());
    let (node, epoch, proposal) = (uint()?, uint()?, uint()?);
    let n = rmp::decode::read_array_len(&mut rd).map_err(|_| bad())? as usize;
    // (A record takes two bytes at least: a count past the bytes left is refused below.)
    let mut records = Vec::with_capacity(n.min(rd.len() / 2));
    for _ in 0..n {
        let len = rmp::decode::read_bin_len(&mut rd).map_err(|_| bad())? as usize;
        if rd.len() < len {
            return Err(bad());
        }
        let (record, rest) = rd.split_at(len);
        records.push(record);
        rd = rest;
    }
    Ok(Proposed {
        node,
        epoch,
        proposal,
        records,
    })
}

pub(crate) struct Driver {
    node_id: u64,
    index: usize,
    /// This is the metadata group (otherwise a shard's).
    meta: bool,
    raw: RawNode<RaftStorage>,
    store: Store,
    events: mpsc::UnboundedReceiver<Event>,
    applied: u64,
    leading: bool,
    /// Leading, but entries of earlier terms up to this index are not applied yet.
    serve_at: Option<u64>,
    serving: bool,
    /// Ticks until the next leadership transfer may start.
    cooldown: u32,
    /// The replica's serving epoch (see `Replica::epoch`).
    epoch: u64,
    /// `--fsync`: when the Raft log is made durable.
    fsync: Fsync,
    last_sync: Instant,
    /// `--snapshot-after`: bytes of log after which a snapshot is taken (0: never).
    snapshot_after: u64,
    /// The snapshot being taken, if any.
    capture: Option<Capture>,
    captures: u64,
    /// A capture thread is running: no other may start (it would take the other's chunks).
    capturing: Arc<AtomicBool>,
    /// The last proposal of this serving epoch handed to raft-rs, and its entry's index.
    proposed: (u64, u64),
    /// Consecutive proposals received and not yet handed to raft-rs: one entry for them all.
    pending: Option<Pending>,
    /// The configuration as of the snapshot, then after each membership change applied since.
    confs: Vec<(u64, ConfState)>,
    /// Ticks each peer has been waiting for a snapshot.
    snapshot_waits: HashMap<u64, u32>,
    /// For a peer that failed to take a snapshot and does not replicate yet: that
    /// snapshot's index, and how many times it failed.
    snapshot_failures: HashMap<u64, (u64, u32)>,
    /// A partition that could not be rebuilt: the driver stops.
    broken: bool,
    /// Files of snapshots received since the last `Ready` (see `handle`), with the state
    /// each restores.
    received: Vec<(std::path::PathBuf, Option<Restored>)>,
    /// The term and leader for which this node last stood because the leader was down
    /// (once for them: a link that keeps failing to a leader still heard from must not
    /// make it stand at every heartbeat).
    stood: (u64, u64),
    /// The survivor this node last stood in place of (a candidate whose log is behind).
    stood_for: Option<u64>,
    /// Ticks before standing again while no leader is heard of since (see `stand_again`).
    restand: u32,
    /// The metadata group's state read at start, for `run` to apply (see `stored_meta`).
    stored_meta: Option<(Option<Vec<Command>>, Vec<Entry>)>,
    /// The judge of the nodes' liveness, while this node leads the metadata group.
    judge: Option<Judge>,
}

/// What a leader's snapshot restores: a shard's partition, or the metadata's commands.
enum Restored {
    Partition(Box<Partition>),
    Meta(Vec<Command>),
}

/// Proposals `epoch`'s serving leader made, up to `proposal`, to become one entry.
struct Pending {
    epoch: u64,
    proposal: u64,
    records: Vec<Vec<u8>>,
    bytes: usize,
}

/// A snapshot being taken. The partition's state is captured as of one moment, which is
/// that of entry `index`: on a follower the last applied entry; on a serving leader (whose
/// partition runs ahead of the log) the entry carrying the last proposal made before the
/// moment, known once it is handed to raft-rs. It is installed once that entry is applied.
struct Capture {
    id: u64,
    index: Option<u64>,
    /// The proposal whose entry is the moment's (a serving leader's).
    proposal: u64,
    /// A serving leader's term: the moment's entry must be of it when applied (else another
    /// leader's entry replaced it, and the capture holds state that never committed).
    term: Option<u64>,
    body: Option<SnapshotData>,
}

impl Driver {
    /// Open group `index` (the metadata group when `meta`). A new first node (`bootstrap`
    /// is its replication factor) makes itself the group's only voter through the log's first
    /// entry, so nodes that join later learn it there; the metadata log then names it and
    /// the replication factor.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn new(
        node_id: u64,
        index: usize,
        meta: bool,
        mut store: Store,
        events: mpsc::UnboundedReceiver<Event>,
        bootstrap: Option<usize>,
        address: &str,
        nodes: &mut BTreeMap<u64, String>,
        fsync: Fsync,
        snapshot_after: u64,
    ) -> std::io::Result<Driver> {
        if let Some(rf) = bootstrap.filter(|_| store.is_empty()) {
            let mut cc = ConfChange::default();
            cc.set_change_type(ConfChangeType::AddNode);
            cc.node_id = node_id;
            cc.context = address.as_bytes().to_vec().into();
            let mut first = Entry::default();
            first.set_entry_type(EntryType::EntryConfChange);
            first.index = 1;
            first.term = 1;
            first.data = cc.write_to_bytes().map_err(std::io::Error::other)?.into();
            let mut entries = vec![first];
            if meta {
                let commands = [
                    Command::AddNode {
                        node: node_id,
                        address: address.to_string(),
                    },
                    Command::SetReplicationFactor { rf },
                ];
                for command in commands {
                    entries.push(Entry {
                        index: entries.len() as u64 + 1,
                        term: 1,
                        data: format::wrap(format::NEWEST, &command.encode()).into(),
                        ..Default::default()
                    });
                }
            }
            let commit = entries.len() as u64;
            store.append(&entries)?;
            store.set_hard_state(&HardState {
                term: 1,
                commit,
                ..Default::default()
            })?;
            store.set_conf_state(&ConfState {
                voters: vec![node_id],
                ..Default::default()
            })?;
            store.sync()?;
        }
        // Committed entries are replayed by `run`, not handed back by raft-rs: replaying a
        // membership change onto the configuration stored after it would undo later ones.
        let commit = store.mem.rl().hard_state().commit;
        let recovered = store.entries(1, commit);
        // The configuration is the snapshot's, then that of the committed membership changes
        // after it, replayed from the log: a stored configuration could lag the commit index.
        let base = store.snapshot_metadata();
        let stored = match meta {
            true => Some(stored_meta(&mut store, commit).map_err(std::io::Error::other)?),
            false => None,
        };
        for command in stored.iter().flat_map(|(commands, _)| commands.iter().flatten()) {
            if let Command::AddNode { node, address } = command {
                nodes.insert(*node, address.clone());
            }
        }
        let mut confs = vec![(base.index, base.get_conf_state().clone())];
        let (mut voters, mut learners) = (
            base.get_conf_state().voters.clone(),
            base.get_conf_state().learners.clone(),
        );
        for e in &recovered {
            if e.get_entry_type() == EntryType::EntryConfChange {
                if let Ok(cc) = ConfChange::parse_from_bytes(&e.data) {
                    if let Some((node, address)) = added_node(&cc) {
                        nodes.insert(node, address);
                    }
                    let n = cc.node_id;
                    voters.retain(|&v| v != n);
                    learners.retain(|&l| l != n);
                    match cc.get_change_type() {
                        ConfChangeType::AddNode => voters.push(n),
                        ConfChangeType::AddLearnerNode => learners.push(n),
                        ConfChangeType::RemoveNode => {}
                    }
                    confs.push((
                        e.index,
                        ConfState {
                            voters: voters.clone(),
                            learners: learners.clone(),
                            ..Default::default()
                        },
                    ));
                }
            }
        }
        if !recovered.is_empty() || base.index > 0 {
            store.mem.wl().set_conf_state(ConfState {
                voters,
                learners,
                ..Default::default()
            });
        }
        let config = raft::Config {
            id: node_id,
            election_tick: ELECTION_TICKS,
            heartbeat_tick: HEARTBEAT_TICKS,
            applied: commit,
            max_size_per_msg: 1 << 20,
            max_inflight_msgs: 256,
            pre_vote: true,
            check_quorum: true,
            ..Default::default()
        };
        let logger = slog::Logger::root(slog::Discard, slog::o!());
        let raw = RawNode::new(&config, store.storage(), &logger).map_err(std::io::Error::other)?;
        Ok(Driver {
            node_id,
            index,
            meta,
            raw,
            store,
            events,
            applied: commit,
            leading: false,
            serve_at: None,
            serving: false,
            cooldown: 0,
            epoch: 0,
            fsync,
            last_sync: Instant::now(),
            snapshot_after,
            capture: None,
            captures: 0,
            capturing: Arc::new(AtomicBool::new(false)),
            proposed: (0, 0),
            pending: None,
            stood: (0, 0),
            stood_for: None,
            restand: 0,
            stored_meta: stored,
            judge: None,
            confs,
            snapshot_waits: HashMap::default(),
            snapshot_failures: HashMap::default(),
            broken: false,
            received: Vec::new(),
        })
    }

    pub(crate) async fn run(mut self, shared: Arc<Shared>) {
        // However the driver ends (a storage error, a panic), its shard stops being served.
        let _stopped = Stopped {
            shared: shared.clone(),
            index: self.index,
            meta: self.meta,
        };
        if self.meta {
            let (commands, entries) = self.stored_meta.take().unwrap_or_default();
            if let Some(commands) = commands {
                cluster(&shared).restore_meta(commands);
            }
            for e in &entries {
                if let Err(why) = apply_meta(cluster(&shared), e) {
                    error!("the cluster's metadata stops here: {why}");
                    return;
                }
            }
        } else if let Err(why) = self.rebuild(&shared, None) {
            error!(shard = self.index, "the shard's state cannot be rebuilt: {why}");
            return;
        }
        let voters: Vec<u64> = self.raw.raft.prs().conf().voters().ids().iter().collect();
        if voters == [self.node_id] {
            let _ = self.raw.campaign();
        }
        let mut ticker = tokio::time::interval(TICK);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = ticker.tick() => {
                    if self.meta {
                        // The active cluster format needs word from every node.
                        cluster(&shared).reach_every_node(&shared);
                    }
                    self.stand_if_leader_down(&shared);
                    self.raw.tick();
                    self.cooldown = self.cooldown.saturating_sub(1);
                    self.judge_liveness(&shared);
                    self.reconcile(&shared);
                    self.retry_snapshots(&shared);
                    self.publish_view(&shared);
                }
                event = self.events.recv() => match event {
                    Some(event) => {
                        let propose = matches!(event, Event::Propose(..));
                        self.handle(&shared, event);
                        // tokio runs a woken task right after its waker: yielding lets the
                        // other connection tasks ready to run go first, and their calls join
                        // this one's entry.
                        if propose {
                            tokio::task::yield_now().await;
                        }
                    }
                    None => return,
                },
            }
            for _ in 0..BATCH {
                match self.events.try_recv() {
                    Ok(event) => self.handle(&shared, event),
                    Err(_) => break,
                }
            }
            self.flush_proposals(&shared);
            let ready = self.on_ready(&shared).await;
            // Snapshots received and not installed (raft-rs had a newer state) are not kept.
            for (path, _) in self.received.drain(..) {
                let _ = std::fs::remove_file(path);
            }
            if let Err(e) = ready.and_then(|()| self.maybe_snapshot(&shared)) {
                if self.broken {
                    error!(
                        shard = self.index,
                        "{e}: this node stops applying the group's entries (none is skipped) and leaves its service"
                    );
                } else {
                    error!(
                        shard = self.index,
                        "the shard's Raft log cannot be written: {e}; this node leaves the shard's service"
                    );
                }
                if self.serving {
                    self.demote(&shared);
                }
                return;
            }
            self.check_role(&shared);
            if self.broken {
                return;
            }
        }
    }

    fn handle(&mut self, shared: &Arc<Shared>, event: Event) {
        if !matches!(event, Event::Propose(..)) {
            // Proposals go to raft-rs before anything else may change its state.
            self.flush_proposals(shared);
        }
        match event {
            Event::Messages(messages) => {
                for bytes in messages {
                    match Message::parse_from_bytes(&bytes) {
                        // Peers never forward proposals (each leader proposes its own calls),
                        // and an empty one would make raft-rs panic.
                        Ok(m) if m.get_msg_type() == MessageType::MsgPropose => {}
                        Ok(m) => {
                            // A candidate's request finds the lease of a leader known down
                            // over. One whose log is behind this node's cannot win: the
                            // first survivor after it stands at once instead.
                            let vote = matches!(
                                m.get_msg_type(),
                                MessageType::MsgRequestPreVote | MessageType::MsgRequestVote
                            );
                            let from = m.from;
                            let mut stand = false;
                            if vote && self.leader_is_down(shared) {
                                let raft = &mut self.raw.raft;
                                raft.election_elapsed = raft.election_elapsed.max(ELECTION_TICKS);
                                stand = m.get_msg_type() == MessageType::MsgRequestPreVote
                                    && !raft.raft_log.is_up_to_date(m.index, m.log_term)
                                    && self.first_survivor(shared, Some(m.from)) == Some(self.node_id);
                            }
                            // A snapshot's data arrives in a file its connection wrote whole;
                            // the message may name no other (after `on_ready` it is gone).
                            if let Some(path) = data_file(m.get_snapshot().get_data()) {
                                if !cluster(shared).take_finished(&path) {
                                    warn!(shard = self.index, "dropped a snapshot naming {}", path.display());
                                    continue;
                                }
                                // Restored before raft-rs sees it, if raft-rs may take it: one
                                // that does not restore is refused here (raft-rs could not
                                // take it back).
                                let raft = &self.raw.raft;
                                let current = m.term >= raft.term
                                    && m.get_snapshot().get_metadata().index > raft.raft_log.committed;
                                let data = SnapshotData::File(path.clone());
                                match current.then(|| {
                                    tokio::task::block_in_place(|| self.restore(&data, shared.shards.library()))
                                }) {
                                    Some(Ok(restored)) => self.received.push((path, Some(restored))),
                                    None => self.received.push((path, None)),
                                    Some(Err(why)) => {
                                        warn!(shard = self.index, "refused the leader's snapshot: {why}");
                                        let _ = std::fs::remove_file(&path);
                                        continue;
                                    }
                                }
                            }
                            let _ = self.raw.step(m);
                            if stand && self.raw.raft.state == StateRole::Follower {
                                self.stand(Some(from), "the leader is down and a candidate is behind: standing");
                            }
                        }
                        Err(e) => warn!(shard = self.index, "dropped a Raft message that does not decode: {e}"),
                    }
                }
            }
            Event::Propose(epoch, proposal, records) => {
                // Only a serving leader proposes, and only what its current epoch applied:
                // raft-rs would forward a follower's proposal to the new leader, which would
                // apply it out of its partition's order.
                if !self.serving || epoch != self.epoch {
                    return; // its reply was failed when serving stopped
                }
                let bytes: usize = records.iter().map(Vec::len).sum();
                if self.pending.as_ref().is_some_and(|p| p.bytes + bytes > ENTRY_BYTES) {
                    self.flush_proposals(shared);
                }
                let pending = self.pending.get_or_insert_with(|| Pending {
                    epoch,
                    proposal,
                    records: Vec::new(),
                    bytes: 0,
                });
                pending.proposal = proposal;
                pending.records.extend(records);
                pending.bytes += bytes;
                // A snapshot's moment ends an entry (the entry's index is the moment's).
                if self
                    .capture
                    .as_ref()
                    .is_some_and(|c| c.index.is_none() && c.proposal == proposal)
                {
                    self.flush_proposals(shared);
                }
            }
            Event::Change(change, reply) => {
                let _ = reply.send(self.change(shared, change));
            }
            Event::Captured(id, body) => match (self.capture.as_mut(), body) {
                (Some(capture), Ok(body)) if capture.id == id => capture.body = Some(body),
                (Some(capture), Err(why)) if capture.id == id => {
                    warn!(shard = self.index, "a snapshot was not taken (the log is kept): {why}");
                    self.capture = None;
                }
                // A capture given up meanwhile: its file is not kept.
                (_, Ok(body)) => discard(Some(body)),
                _ => {}
            },
        }
    }

    /// Hand the pending proposals to raft-rs as one entry (their records in order; its
    /// commit releases the replies of them all).
    fn flush_proposals(&mut self, shared: &Arc<Shared>) {
        let Some(p) = self.pending.take() else { return };
        if !self.serving || p.epoch != self.epoch {
            return; // their replies were failed when serving stopped
        }
        let format = cluster(shared).active_format();
        let data = encode_entry(format, self.node_id, p.epoch, p.proposal, &p.records);
        let leading = self.raw.raft.state == StateRole::Leader;
        if leading && self.raw.propose(Vec::new(), data).is_ok() {
            let index = self.raw.raft.raft_log.last_index();
            self.proposed = (p.proposal, index);
            if let Some(capture) = self
                .capture
                .as_mut()
                .filter(|c| c.index.is_none() && c.proposal == p.proposal)
            {
                capture.index = Some(index);
            }
        } else {
            // The partition ran calls that are not in the log. Stop serving before any
            // later entry of this epoch commits (which would release their replies), and
            // rebuild from the log.
            warn!(
                shard = self.index,
                "a proposal was dropped; rebuilding the shard from its log"
            );
            self.demote(shared);
        }
    }

    /// Add or remove a node (metadata group): proposed by its leader, refused elsewhere.
    fn change(&mut self, shared: &Arc<Shared>, command: Command) -> Result<Value, Error> {
        let cluster = cluster(shared);
        if !self.meta {
            return Err(Error::new(
                ErrorKind::Internal,
                "membership changes go to the metadata group",
            ));
        }
        if self.raw.raft.state != StateRole::Leader {
            return Err(cluster.redirect(self.index));
        }
        let meta = cluster.meta();
        match &command {
            Command::AddNode { node, address } if meta.nodes.get(node) == Some(address) => return Ok("member".into()),
            Command::AddNode { node, .. } if meta.nodes.contains_key(node) => {
                return Err(Error::value(format!(
                    "node {node} is a member at another address; remove it first"
                )))
            }
            Command::RemoveNode { node } if !meta.nodes.contains_key(node) => return Ok("not a member".into()),
            Command::RemoveNode { .. } if meta.nodes.len() == 1 => {
                return Err(Error::value("the cluster's last node cannot be removed"));
            }
            Command::Acl(change) => shared.access.check(change)?,
            _ => {}
        }
        let data = format::wrap(cluster.active_format(), &command.encode());
        self.raw
            .propose(Vec::new(), data)
            .map_err(|e| Error::new(ErrorKind::Busy, format!("the change was not proposed: {e}; retry")))?;
        Ok("proposed".into())
    }

    /// The leader moves the group's replicas towards their placement, one membership change
    /// at a time: add the missing replicas as learners, promote them once they caught up,
    /// then remove (or, in the metadata group, demote) the replicas placed elsewhere, handing
    /// leadership away first if this node is one of them; and hand leadership to the
    /// preferred replica, which spreads shard leaders over the nodes.
    fn reconcile(&mut self, shared: &Arc<Shared>) {
        let cluster = cluster(shared);
        if self.raw.raft.state != StateRole::Leader {
            cluster.end_move(self.index);
            return;
        }
        if self.raw.raft.has_pending_conf() || self.serve_at.is_some() {
            return;
        }
        let meta: Meta = cluster.meta();
        let voters_wanted = self.placed_voters(&meta);
        if voters_wanted.is_empty() || meta.rf == 0 {
            return;
        }
        let members_wanted: Vec<u64> = match self.meta {
            true => meta.nodes.keys().copied().collect(),
            false => voters_wanted.clone(),
        };
        let conf = self.raw.raft.prs().conf();
        let voters: Vec<u64> = conf.voters().ids().iter().collect();
        let learners: Vec<u64> = conf.learners().iter().copied().collect();
        let settled = learners.is_empty() && voters.len() == voters_wanted.len();
        if settled && voters_wanted.iter().all(|n| voters.contains(n)) {
            cluster.end_move(self.index);
        }
        // A voter may leave only if the voters left still hold a live quorum.
        let keeps_quorum = |n: u64| {
            let live = voters
                .iter()
                .filter(|&&v| v != n && meta.liveness(v) == Liveness::Up)
                .count();
            live > (voters.len() - 1) / 2
        };
        let committed = self.raw.raft.raft_log.committed;
        let caught_up = |n: u64| self.raw.raft.prs().get(n).is_some_and(|p| p.matched >= committed);
        // Leadership goes only to a placed voter that is up to date and answering (placement
        // may still name a node that is down).
        let successor = voters_wanted.iter().copied().find(|&n| {
            n != self.node_id
                && voters.contains(&n)
                && self
                    .raw
                    .raft
                    .prs()
                    .get(n)
                    .is_some_and(|p| p.matched >= committed && p.recent_active)
        });
        let change = |kind: ConfChangeType, node: u64| {
            let mut cc = ConfChange::default();
            cc.set_change_type(kind);
            cc.node_id = node;
            cc.context = cluster.address_of(node).unwrap_or_default().into_bytes().into();
            cc
        };
        let next = if let Some(&n) = members_wanted
            .iter()
            .find(|n| !voters.contains(n) && !learners.contains(n))
        {
            // A new replica copies the shard: one shard at a time per leader.
            (self.meta || cluster.claim_move(self.index)).then(|| change(ConfChangeType::AddLearnerNode, n))
        } else if let Some(&n) = learners.iter().find(|n| voters_wanted.contains(n) && caught_up(**n)) {
            Some(change(ConfChangeType::AddNode, n))
        } else if let Some(&n) = voters.iter().find(|n| !voters_wanted.contains(n)) {
            // Only once every placed replica votes, so the group never shrinks below them.
            if !voters_wanted.iter().all(|w| voters.contains(w)) || !keeps_quorum(n) {
                None
            } else if n == self.node_id {
                if let Some(to) = successor.filter(|_| self.cooldown == 0) {
                    self.cooldown = TRANSFER_COOLDOWN;
                    info!(shard = self.index, to, "handing leadership to a placed replica");
                    self.transfer(shared, to);
                }
                None
            } else if members_wanted.contains(&n) {
                Some(change(ConfChangeType::AddLearnerNode, n))
            } else {
                Some(change(ConfChangeType::RemoveNode, n))
            }
        } else if let Some(&n) = learners.iter().find(|n| !members_wanted.contains(n)) {
            Some(change(ConfChangeType::RemoveNode, n))
        } else {
            // The preferred replica leads, when it is up (spreading leaders over the nodes),
            // unless this leader holds ephemeral objects, which would be lost with it.
            let preferred = voters_wanted[0];
            if preferred != self.node_id && self.cooldown == 0 && successor == Some(preferred) {
                self.cooldown = TRANSFER_COOLDOWN;
                let ephemeral = !self.meta
                    && shared
                        .shards
                        .with(self.index, |s| s.partition.len() > s.partition.persistent_len())
                        .unwrap_or(true);
                if !ephemeral {
                    self.transfer(shared, preferred);
                }
            }
            None
        };
        if let Some(cc) = next {
            let (kind, node) = (cc.get_change_type(), cc.node_id);
            if self.raw.propose_conf_change(Vec::new(), cc).is_ok() {
                info!(shard = self.index, node, change = ?kind, "moving the group towards its placement");
            }
        }
    }

    /// The metadata group's leader declares which nodes are up, suspect or dead (see
    /// `liveness`), from what it heard since it became the leader.
    fn judge_liveness(&mut self, shared: &Arc<Shared>) {
        if !self.meta || self.raw.raft.state != StateRole::Leader {
            self.judge = None;
            return;
        }
        let cluster = cluster(shared);
        let format = cluster.active_format();
        if format < format::LIVENESS {
            return; // a node of the previous release is still a member
        }
        let judge = self.judge.get_or_insert_with(Judge::new);
        for verdict in cluster.judge(judge) {
            info!(?verdict, "declaring a node's liveness");
            let _ = self.raw.propose(Vec::new(), format::wrap(format, &verdict.encode()));
        }
    }

    /// Hand leadership to `to`. Raft drops proposals while a transfer is under way, so the
    /// shard stops serving first (calls go to the new leader once it is elected).
    fn transfer(&mut self, shared: &Arc<Shared>, to: u64) {
        // Calls answered meanwhile go straight to the new leader.
        cluster(shared).groups[self.index].leader.store(to, Ordering::Relaxed);
        if self.serving {
            self.demote(shared);
        }
        self.raw.transfer_leader(to);
    }

    async fn on_ready(&mut self, shared: &Arc<Shared>) -> std::io::Result<()> {
        if !self.raw.has_ready() {
            return Ok(());
        }
        let mut rd = self.raw.ready();
        self.send(shared, rd.take_messages());
        if !rd.snapshot().is_empty() {
            self.install_received(shared, rd.snapshot().clone())?;
        }
        let committed = rd.take_committed_entries();
        self.apply(shared, committed)?;
        self.store.append(rd.entries())?;
        if let Some(hs) = rd.hs() {
            self.store.set_hard_state(hs)?;
        }
        // Raft assumes what a node persisted survives it; with `--fsync` other than `always`
        // a power loss on a majority may lose acknowledged entries (a process crash does not).
        let sync = match self.fsync {
            Fsync::Always => rd.must_sync(),
            Fsync::Interval(every) => self.last_sync.elapsed() >= every,
            Fsync::Never => false,
        };
        if sync {
            // An fsync may take milliseconds: this task waits for it on another thread
            // while the worker runs the others (calls arriving meanwhile join the next entry).
            let (file, target) = self.store.flush_for_sync()?;
            let result = tokio::task::spawn_blocking(move || file.sync_data())
                .await
                .unwrap_or_else(|e| Err(std::io::Error::other(e)));
            self.store.synced(target, result)?;
            self.last_sync = Instant::now();
        } else {
            self.store.flush()?;
        }
        self.send(shared, rd.take_persisted_messages());
        let mut light = self.raw.advance(rd);
        self.send(shared, light.take_messages());
        // The commit index `apply` records here waits for the group's next write (one write
        // per round; an idle group, or one stopped, never writes it): Raft needs no commit
        // index stored, and a restart that reads an older one replays less at its start,
        // then applies the rest as they commit again.
        let committed = light.take_committed_entries();
        self.apply(shared, committed)?;
        self.raw.advance_apply();
        Ok(())
    }

    fn send(&self, shared: &Arc<Shared>, messages: Vec<Message>) {
        let Some(cluster) = shared.cluster.as_ref() else { return };
        let mut by_peer: BTreeMap<u64, Vec<Vec<u8>>> = BTreeMap::new();
        for mut m in messages {
            // A snapshot names its file: the link streams the data after the message.
            if let Some(path) = data_file(m.get_snapshot().get_data()) {
                m.mut_snapshot().clear_data();
                match m.write_to_bytes() {
                    Ok(bytes) => cluster
                        .peers
                        .send_snapshot(shared, m.to, self.index as u64, bytes, path),
                    Err(e) => warn!(shard = self.index, "a Raft message did not encode: {e}"),
                }
                continue;
            }
            match m.write_to_bytes() {
                Ok(bytes) if bytes.len() > super::MAX_RAFT_MESSAGE => warn!(
                    shard = self.index,
                    to = m.to,
                    "a Raft message of {} bytes (a snapshot) is over the {} bytes a peer accepts: not sent",
                    bytes.len(),
                    super::MAX_RAFT_MESSAGE
                ),
                Ok(bytes) => by_peer.entry(m.to).or_default().push(bytes),
                Err(e) => warn!(shard = self.index, "a Raft message did not encode: {e}"),
            }
        }
        for (to, batch) in by_peer {
            cluster.peers.send(shared, to, self.index as u64, batch);
        }
    }

    /// Apply committed entries. One that cannot be applied (a format this node does not
    /// read) is never skipped: the group stops here (`broken`, and an error).
    fn apply(&mut self, shared: &Arc<Shared>, entries: Vec<Entry>) -> std::io::Result<()> {
        let Some(last) = entries.last().map(|e| e.index) else {
            return Ok(());
        };
        let unapplied = |driver: &mut Driver, why: String| {
            driver.broken = true;
            std::io::Error::other(why)
        };
        // The commit index the entries are replayed to at a restart (see `on_ready`).
        if self.store.mem.rl().hard_state().commit < last {
            self.store.set_commit(last)?;
        }
        let now = Instant::now();
        // A shard's consecutive entries are applied under one hold of its lock.
        let mut run: Vec<Entry> = Vec::new();
        for e in entries {
            self.applied = e.index;
            if e.get_entry_type() != EntryType::EntryNormal || self.meta {
                let applied = self.apply_run(shared, std::mem::take(&mut run), now);
                applied.map_err(|why| unapplied(self, why))?;
            }
            match e.get_entry_type() {
                EntryType::EntryNormal if e.data.is_empty() => {}
                EntryType::EntryNormal if self.meta => {
                    apply_meta(cluster(shared), &e).map_err(|why| unapplied(self, why))?;
                }
                EntryType::EntryNormal => run.push(e),
                EntryType::EntryConfChange => {
                    let cc = match ConfChange::parse_from_bytes(&e.data) {
                        Ok(cc) => cc,
                        Err(err) => {
                            error!(
                                shard = self.index,
                                index = e.index,
                                "a membership change does not decode: {err}"
                            );
                            continue;
                        }
                    };
                    if let Some((node, address)) = added_node(&cc) {
                        cluster(shared).learn_address(node, &address);
                    }
                    match self.raw.apply_conf_change(&cc) {
                        Ok(cs) => {
                            self.store.set_conf_state(&cs)?;
                            self.confs.push((e.index, cs.clone()));
                            info!(
                                shard = self.index,
                                voters = ?cs.voters,
                                learners = ?cs.learners,
                                "membership changed"
                            );
                        }
                        Err(err) => warn!(shard = self.index, "a membership change was refused: {err}"),
                    }
                }
                EntryType::EntryConfChangeV2 => {}
            }
        }
        let applied = self.apply_run(shared, run, now);
        applied.map_err(|why| unapplied(self, why))
    }

    /// Apply committed entries of the shard: release the replies of this epoch's own
    /// proposals (already applied here), replay the others, up to one that cannot be.
    fn apply_run(&self, shared: &Arc<Shared>, run: Vec<Entry>, now: Instant) -> Result<(), String> {
        if run.is_empty() {
            return Ok(());
        }
        let outcome = shared.shards.with(self.index, |s| {
            let mut replies = Vec::new();
            for e in &run {
                let entry = decode_entry(&e.data);
                if let (Some(replica), Ok(p)) = (s.replica.as_mut(), &entry) {
                    if let Some(released) = replica.committed(p.node, p.epoch, p.proposal) {
                        replies.extend(released);
                        continue;
                    }
                }
                if let Err(why) = replay_entry(&mut s.partition, e.index, entry, now) {
                    return (replies, Err(why));
                }
            }
            (replies, Ok(()))
        });
        match outcome {
            Ok((replies, applied)) => {
                shared.registry.deliver(replies);
                applied
            }
            Err(_) => Ok(()),
        }
    }

    /// Follow leadership: start serving once the log of earlier terms is applied, and stop
    /// (rebuilding the partition from the log) when leadership is lost.
    fn check_role(&mut self, shared: &Arc<Shared>) {
        let cluster = cluster(shared);
        let handle = &cluster.groups[self.index];
        let is_leader = self.raw.raft.state == StateRole::Leader;
        // While handing leadership over, point callers at the node taking it.
        let hint = match self.raw.raft.lead_transferee {
            Some(to) if is_leader => to,
            _ => self.raw.raft.leader_id,
        };
        handle.leader.store(hint, Ordering::Relaxed);
        if self.meta {
            // The metadata group has no partition to serve.
            self.leading = is_leader;
        } else if is_leader && !self.leading {
            self.leading = true;
            self.serve_at = Some(self.raw.raft.raft_log.last_index());
        } else if !is_leader && self.leading {
            self.leading = false;
            self.serve_at = None;
            if self.serving {
                info!(shard = self.index, "no longer the shard's leader");
                self.demote(shared);
            }
        }
        // Still leading after a rebuild (a dropped proposal, a transfer that did not happen):
        // serve again once the log is applied.
        if self.leading
            && !self.meta
            && !self.serving
            && self.serve_at.is_none()
            && self.raw.raft.lead_transferee.is_none()
        {
            self.serve_at = Some(self.raw.raft.raft_log.last_index());
        }
        if self.serve_at.is_some_and(|at| self.applied >= at) {
            self.serve_at = None;
            self.serving = true;
            let now = Instant::now();
            // The partition is that of the entries applied: proposals follow from here.
            self.proposed = (0, self.applied);
            let started = shared.shards.with(self.index, |s| {
                if let Some(replica) = s.replica.as_mut() {
                    self.epoch = replica.start();
                }
                // Calls parked by connections of earlier leaders are dropped (logged).
                let replies = s.partition.restart(now);
                (s.journal(replies), s.partition.logged_clients())
            });
            if let Ok((replies, clients)) = started {
                shared.registry.deliver(replies);
                // The shard's sessions whose clients this node has not heard from may have
                // died with the old leader, which would have ended them: they end after
                // the session TTL unless their clients connect (clients keep a connection
                // to every node, so a live one is known here).
                (shared.adopt_sessions)(shared, clients);
            }
            info!(shard = self.index, term = self.raw.raft.term, "leading the shard");
        }
    }

    /// Publish the group's state for `cluster` (on each tick: off the path of every batch).
    fn publish_view(&self, shared: &Shared) {
        let conf = self.raw.raft.prs().conf();
        let mut view = cluster(shared).groups[self.index]
            .view
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        view.term = self.raw.raft.term;
        view.commit = self.raw.raft.raft_log.committed;
        view.applied = self.applied;
        view.voters = conf.voters().ids().iter().collect();
        view.voters.sort_unstable();
        view.learners = conf.learners().iter().copied().collect();
        view.learners.sort_unstable();
        view.serving = self.serving;
    }

    /// Stop serving: answer the calls waiting here with `NotLeader`, and rebuild the
    /// partition from the snapshot and the committed log (dropping what was applied but
    /// never committed, and the ephemeral objects, which lived with this leader).
    fn demote(&mut self, shared: &Arc<Shared>) {
        self.serving = false;
        // A leader's capture is of a moment that may never commit.
        self.capture = None;
        let error = cluster(shared).redirect(self.index);
        if let Err(why) = self.rebuild(shared, Some(&error)) {
            error!(shard = self.index, "the shard's state cannot be rebuilt: {why}");
            self.broken = true;
        }
    }

    /// Replace the shard's partition with one rebuilt from the snapshot and the entries
    /// applied after it. With `error`, this replica stops serving: the calls waiting on it
    /// are answered with it.
    fn rebuild(&mut self, shared: &Arc<Shared>, error: Option<&Error>) -> Result<(), String> {
        let (now, index, applied) = (Instant::now(), self.index, self.applied);
        let store = &mut self.store;
        let rebuilt = tokio::task::block_in_place(|| {
            let library = shared.shards.library();
            store.restore_state(applied, |data, entries| replayed(data, &entries, index, now, library))
        });
        self.replace_partition(shared, error, rebuilt)
    }

    /// Put `rebuilt` in place of the shard's partition (an error leaves the old one, and is
    /// returned). With `error`, this replica stops serving first.
    fn replace_partition(
        &mut self,
        shared: &Arc<Shared>,
        error: Option<&Error>,
        rebuilt: Result<Partition, String>,
    ) -> Result<(), String> {
        let now = Instant::now();
        let outcome = shared.shards.with(self.index, |s| {
            let mut replies = Vec::new();
            if let Some(error) = error {
                replies = s.replica.as_mut().map(|r| r.stop(error)).unwrap_or_default();
                replies.extend(s.partition.abandon(error, now));
            }
            let actions = hosts::forward(shared, &mut s.partition, None);
            let replaced = rebuilt.map(|mut partition| {
                partition.skip_object_ids(s.partition.next_object_id());
                let (per_client, total) = shared.config.limits.reply_log_limits(shared.shards.count());
                partition.set_reply_log_limit(per_client, total);
                partition.set_memory(shared.shards.memory().clone());
                s.partition = partition;
            });
            (replies, actions, replaced)
        });
        let (replies, actions, replaced) = outcome.map_err(|e| e.message)?;
        shared.registry.deliver(replies);
        hosts::run(shared, actions);
        replaced
    }

    /// A snapshot a leader sent (this replica lagged behind the leader's compacted log): it
    /// replaces the log and the state. One that does not restore is refused before anything
    /// is stored (the driver stops; a restart asks again).
    fn install_received(&mut self, shared: &Arc<Shared>, mut snapshot: Snapshot) -> std::io::Result<()> {
        let index = snapshot.get_metadata().index;
        let conf = snapshot.get_metadata().get_conf_state().clone();
        let refused =
            |why: String| std::io::Error::other(format!("the leader's snapshot at {index} is refused: {why}"));
        // Streamed to a file by the connection it came on (`handle` checked the name), or
        // held whole by a peer that sends it so.
        let data = match data_file(snapshot.get_data()) {
            Some(path) => SnapshotData::File(path),
            None => SnapshotData::Bytes(snapshot.take_data().into()),
        };
        // Restored when it came in, if streamed (else now: reading and copying a large file,
        // off the async workers' duty meanwhile).
        let prepared = match &data {
            SnapshotData::File(path) => self
                .received
                .iter()
                .position(|(p, _)| p == path)
                .and_then(|i| self.received.swap_remove(i).1),
            SnapshotData::Bytes(_) => None,
        };
        let restored = match prepared {
            Some(restored) => restored,
            None => tokio::task::block_in_place(|| self.restore(&data, shared.shards.library())).map_err(refused)?,
        };
        self.capture = None;
        tokio::task::block_in_place(|| self.store.install(snapshot.take_metadata(), data, true))?;
        self.applied = index;
        self.confs = vec![(index, conf)];
        match restored {
            Restored::Meta(commands) => cluster(shared).restore_meta(commands),
            Restored::Partition(partition) => self
                .replace_partition(shared, None, Ok(*partition))
                .map_err(std::io::Error::other)?,
        }
        info!(shard = self.index, index, "installed the leader's snapshot");
        Ok(())
    }

    /// The state a leader's snapshot `data` restores, for this group.
    fn restore(&self, data: &SnapshotData, library: &Arc<dyn Library>) -> Result<Restored, String> {
        let reader = data.reader().map_err(|e| e.to_string())?;
        Ok(match self.meta {
            true => Restored::Meta(read_meta(reader)?),
            false => Restored::Partition(Box::new(restored(Some(reader), Instant::now(), library)?)),
        })
    }

    /// Take a snapshot once `--snapshot-after` bytes of log were written since the last (or
    /// a peer needs a newer one), and install it (compacting the log behind it) once its
    /// entry is applied.
    fn maybe_snapshot(&mut self, shared: &Arc<Shared>) -> std::io::Result<()> {
        let due = self.snapshot_after > 0 && self.store.since_snapshot() >= self.snapshot_after;
        let idle = self.capture.is_none() && !self.capturing.load(Ordering::Acquire);
        if idle && self.applied > self.store.snapshot_metadata().index && (due || self.store.take_wanted()) {
            self.begin_snapshot(shared);
        }
        let ready = self.capture.as_ref().and_then(|c| match (c.index, &c.body) {
            (Some(index), Some(_)) if index <= self.applied => Some(index),
            _ => None,
        });
        let Some(index) = ready else { return Ok(()) };
        let Some(capture) = self.capture.take() else {
            return Ok(());
        };
        if index <= self.store.snapshot_metadata().index {
            discard(capture.body); // a leader's snapshot overtook it
            return Ok(());
        }
        let term = self.raw.raft.raft_log.term(index).map_err(std::io::Error::other)?;
        if capture.term.is_some_and(|ours| ours != term) {
            warn!(
                shard = self.index,
                index, "dropped a snapshot of entries a later leader replaced"
            );
            discard(capture.body);
            return Ok(());
        }
        let Some(data) = capture.body else { return Ok(()) };
        // The configuration as of the snapshot's entry (the ones before it are then dropped).
        let base = self.confs.iter().rposition(|(at, _)| *at <= index);
        let conf = base.map(|i| self.confs[i].1.clone()).unwrap_or_default();
        let mut metadata = SnapshotMetadata::default();
        (metadata.index, metadata.term) = (index, term);
        metadata.set_conf_state(conf);
        let started = Instant::now();
        tokio::task::block_in_place(|| self.store.install(metadata, data, false))?;
        let bytes = self.store.snapshot_len();
        self.confs.drain(..base.unwrap_or(0));
        info!(
            shard = self.index,
            index,
            bytes,
            "took a snapshot and compacted the log behind it in {:.1} ms",
            started.elapsed().as_secs_f64() * 1e3
        );
        Ok(())
    }

    /// Mark the moment of a snapshot and start capturing the state as of it.
    fn begin_snapshot(&mut self, shared: &Arc<Shared>) {
        self.captures += 1;
        let id = self.captures;
        if self.meta {
            // The metadata is small: captured at once, as of the last applied entry.
            self.capture = Some(Capture {
                id,
                index: Some(self.applied),
                proposal: 0,
                term: None,
                body: Some(SnapshotData::Bytes(meta_snapshot(
                    &cluster(shared).meta(),
                    cluster(shared).active_format(),
                ))),
            });
            return;
        }
        let serving = self.serving;
        let began = shared.shards.with(self.index, |s| {
            let proposal = s.replica.as_ref().map_or(0, |r| r.proposed);
            (s.partition.begin_snapshot(), proposal)
        });
        let Ok((header, proposal)) = began else { return };
        let index = match serving {
            // A follower's partition is exactly its applied entries.
            false => Some(self.applied),
            // A leader's holds every proposal made so far: the moment is the last one's entry,
            // or the last applied if that is later (entries with no records came after it).
            true if proposal == self.proposed.0 => Some(self.proposed.1.max(self.applied)),
            true => None,
        };
        self.capture = Some(Capture {
            id,
            index,
            proposal,
            term: serving.then_some(self.raw.raft.term),
            body: None,
        });
        let (background, group, events) = (
            shared.clone(),
            self.index,
            cluster(shared).groups[self.index].events.clone(),
        );
        let capturing = self.capturing.clone();
        capturing.store(true, Ordering::Release);
        let path = self.store.capture_path(id);
        let spawned = std::thread::Builder::new()
            .name(format!("raft-snapshot-{group}"))
            .spawn(move || {
                let outcome = capture_to(&background, group, header, &path).map(|()| SnapshotData::File(path));
                capturing.store(false, Ordering::Release);
                let _ = events.send(Event::Captured(id, outcome));
            });
        if let Err(e) = spawned {
            self.capturing.store(false, Ordering::Release);
            warn!(shard = self.index, "cannot start a snapshot thread: {e}");
            self.capture = None;
            let _ = shared.shards.with(self.index, |s| s.partition.abort_snapshot());
        }
    }

    /// A follower whose link found its leader's port closed (a crashed process: the kernel
    /// refuses the connection at once) and that is the first surviving voter in placement
    /// order stands at once, instead of waiting out a randomized timeout after the last
    /// heartbeat; the other survivors grant it their votes at once (see `handle`), their
    /// timers a fallback. Safe if the leader is in fact alive: followers still hearing from
    /// it refuse to pre-vote.
    fn stand_if_leader_down(&mut self, shared: &Arc<Shared>) {
        self.restand = self.restand.saturating_sub(1);
        if self.leader_is_down(shared) && self.first_survivor(shared, None) == Some(self.node_id) {
            self.stand(None, "the leader is down: standing for election");
        } else if self.stand_again(shared) {
            self.restand = RESTAND_TICKS;
            debug!(shard = self.index, "no leader yet: standing again");
            let _ = self.raw.campaign();
        }
    }

    /// Whether to stand again: raft-rs forgets the leader when a node stands, and a
    /// survivor that had not yet found the leader down refused the pre-vote (its lease);
    /// its timer, or this node's, would end the wait only 0.5-1 s later. So while no leader
    /// is heard of and the one this node stood against stays down, it stands again every
    /// few ticks (pre-votes: the term stays).
    fn stand_again(&self, shared: &Arc<Shared>) -> bool {
        let raft = &self.raw.raft;
        let (term, leader) = self.stood;
        matches!(raft.state, StateRole::Follower | StateRole::PreCandidate)
            && raft.leader_id == 0
            && leader != 0
            && term == raft.term
            && self.restand == 0
            && cluster(shared).peers.is_down(leader)
            && self.first_survivor(shared, self.stood_for) == Some(self.node_id)
    }

    /// Campaign, once per term and leader (`stood_for`: in place of that survivor).
    fn stand(&mut self, stood_for: Option<u64>, why: &str) {
        let now = (self.raw.raft.term, self.raw.raft.leader_id);
        if self.stood != now {
            self.stood = now;
            self.stood_for = stood_for;
            self.restand = RESTAND_TICKS;
            info!(shard = self.index, "{why}");
            let _ = self.raw.campaign();
        }
    }

    fn leader_is_down(&self, shared: &Arc<Shared>) -> bool {
        let raft = &self.raw.raft;
        raft.state == StateRole::Follower
            && raft.leader_id != 0
            && raft.leader_id != self.node_id
            && cluster(shared).peers.is_down(raft.leader_id)
    }

    /// The voter that stands first when the leader is down: the first in placement order
    /// (then by id) that is neither the leader nor down nor `except`, as this node sees them.
    fn first_survivor(&self, shared: &Arc<Shared>, except: Option<u64>) -> Option<u64> {
        let cluster = cluster(shared);
        let voters = self.raw.raft.prs().conf().voters().ids();
        let mut others: Vec<u64> = voters.iter().collect();
        others.sort_unstable();
        self.placed_voters(&cluster.meta())
            .into_iter()
            .chain(others)
            .find(|&n| {
                voters.contains(n)
                    && n != self.raw.raft.leader_id
                    && Some(n) != except
                    && (n == self.node_id || !cluster.peers.is_down(n))
            })
    }

    /// The voters placement gives this group, preferred leader first.
    fn placed_voters(&self, meta: &Meta) -> Vec<u64> {
        match self.meta {
            // Every node follows the metadata; a few of them vote.
            true => meta.meta_voters(self.index as u64),
            false => meta.shard_replicas(self.index as u64),
        }
    }

    /// A peer sent a snapshot that never arrived (a lost message, a restarted peer) waits
    /// forever in raft-rs: after a while, report it failed so that it is sent again.
    fn retry_snapshots(&mut self, shared: &Arc<Shared>) {
        if self.raw.raft.state != StateRole::Leader {
            self.snapshot_waits.clear();
            self.snapshot_failures.clear();
            return;
        }
        let prs = self.raw.raft.prs();
        let waiting: Vec<u64> = prs
            .iter()
            .filter(|(_, pr)| pr.state == ProgressState::Snapshot)
            .map(|(id, _)| *id)
            .collect();
        self.snapshot_waits.retain(|id, _| waiting.contains(id));
        // A failed peer is probed before it waits for a snapshot again: its count goes only
        // once it replicates.
        self.snapshot_failures
            .retain(|id, _| prs.get(*id).is_some_and(|pr| pr.state != ProgressState::Replicate));
        let snapshot = self.store.snapshot_metadata().index;
        if self.store.latest_refused() && self.raw.raft.raft_log.last_index() <= snapshot {
            // A fresh snapshot needs an entry after the refused one (retried until proposed:
            // raft-rs drops proposals during a leadership transfer).
            let _ = self.raw.propose(Vec::new(), Vec::new());
        }
        if waiting.is_empty() {
            return;
        }
        let size = self.store.snapshot_len() / SNAPSHOT_BYTES_PER_TICK as u64;
        let patience = SNAPSHOT_RETRY_TICKS.saturating_add(u32::try_from(size).unwrap_or(u32::MAX));
        for id in waiting {
            let ticks = self.snapshot_waits.entry(id).or_insert(0);
            *ticks += 1;
            if *ticks >= patience {
                *ticks = 0;
                self.raw.report_snapshot(id, SnapshotStatus::Failure);
                // Lost once, it is sent again; lost twice by a peer this node reaches, it may
                // be damaged (unreadable here, or refused by the peer): a fresh one is taken
                // instead. (A peer that is down is no reason for a new snapshot.)
                if cluster(shared).peers.is_down(id) {
                    continue;
                }
                let failures = self.snapshot_failures.entry(id).or_insert((snapshot, 0));
                if failures.0 != snapshot {
                    *failures = (snapshot, 0);
                }
                failures.1 += 1;
                if failures.1 >= 2 && !self.store.latest_refused() {
                    warn!(
                        shard = self.index,
                        peer = id,
                        "a peer failed to take the snapshot twice: taking a fresh one"
                    );
                    self.store.refuse_latest();
                }
            }
        }
    }
}

/// Takes a group out of service when its driver ends: no leader here, and a shard's waiting
/// calls are answered (its partition no longer reaches any log).
struct Stopped {
    shared: Arc<Shared>,
    index: usize,
    meta: bool,
}

impl Drop for Stopped {
    fn drop(&mut self) {
        let cluster = cluster(&self.shared);
        cluster.groups[self.index].leader.store(0, Ordering::Relaxed);
        if let Ok(mut view) = cluster.groups[self.index].view.lock() {
            view.serving = false;
        }
        if self.meta {
            return;
        }
        // As when leadership is lost: the calls go to another node (a rolling upgrade stops
        // nodes under load), and apply there once by their `(client, seq)`.
        let error = Error::new(
            ErrorKind::NotLeader,
            format!(
                "shard {} stopped on this node (see its log); retry on another node",
                self.index
            ),
        )
        .with_data(cluster.redirect(self.index).data);
        if let Ok(replies) = self.shared.shards.with(self.index, |s| {
            s.replica.as_mut().map(|r| r.stop(&error)).unwrap_or_default()
        }) {
            self.shared.registry.deliver(replies);
        }
    }
}

fn cluster(shared: &Shared) -> &super::Cluster {
    shared.cluster.as_ref().expect("a Raft group runs only in cluster mode")
}

/// Apply a committed metadata entry (refused, not skipped, when it does not decode).
fn apply_meta(cluster: &super::Cluster, e: &Entry) -> Result<(), String> {
    if e.get_entry_type() != EntryType::EntryNormal || e.data.is_empty() {
        return Ok(());
    }
    let what = format!("metadata entry {}", e.index);
    let (entry_format, body) = format::open(&e.data, &what)?;
    cluster.format_floor.fetch_max(entry_format, Ordering::Relaxed);
    let command = Command::decode(body).map_err(|why| format!("{what} does not decode: {why}"))?;
    if let Command::AddNode { node, address } = &command {
        cluster.learn_address(*node, address);
    }
    info!(?command, "cluster metadata changed");
    cluster.apply_meta(command);
    Ok(())
}

/// The metadata group's snapshot in cluster format `format`: the commands that rebuild its
/// state.
fn meta_snapshot(meta: &Meta, format: u64) -> Vec<u8> {
    let mut commands = vec![Value::Binary(Command::SetReplicationFactor { rf: meta.rf }.encode())];
    for (node, address) in &meta.nodes {
        let add = Command::AddNode {
            node: *node,
            address: address.clone(),
        };
        commands.push(Value::Binary(add.encode()));
    }
    for change in meta.acl.changes() {
        commands.push(Value::Binary(Command::Acl(change).encode()));
    }
    if format >= format::LIVENESS {
        for (&node, &liveness) in &meta.liveness {
            commands.push(Value::Binary(Command::SetLiveness { node, liveness }.encode()));
        }
    }
    let mut out = Vec::new();
    format::write_mark(&mut out, format);
    rmpv::encode::write_value(&mut out, &Value::Array(commands)).expect("encoding to memory");
    out
}

/// Delete a capture's file (one that will not be installed).
fn discard(body: Option<SnapshotData>) {
    if let Some(SnapshotData::File(path)) = body {
        let _ = std::fs::remove_file(path);
    }
}

/// Write the body of a snapshot of shard `group` to `path`: `header`, then the objects a
/// chunk per hold of the shard lock (calls go on between chunks).
fn capture_to(shared: &Shared, group: usize, header: Vec<u8>, path: &std::path::Path) -> Result<(), String> {
    let written = write_capture(shared, group, header, path);
    if written.is_err() {
        let _ = std::fs::remove_file(path);
    }
    written
}

fn write_capture(shared: &Shared, group: usize, header: Vec<u8>, path: &std::path::Path) -> Result<(), String> {
    use std::io::Write as _;
    let failed = |e: std::io::Error| format!("cannot write {}: {e}", path.display());
    let mut file = std::io::BufWriter::new(std::fs::File::create(path).map_err(failed)?);
    file.write_all(&header).map_err(failed)?;
    loop {
        match shared
            .shards
            .with(group, |s| s.partition.snapshot_chunk(SNAPSHOT_CHUNK))
        {
            Ok(Some((chunk, done))) => {
                file.write_all(&chunk).map_err(failed)?;
                if done {
                    return file.flush().map_err(failed);
                }
            }
            Ok(None) => return Err("the partition was rebuilt meanwhile".to_string()),
            Err(e) => return Err(e.message),
        }
    }
}

/// A fresh partition holding the state of a snapshot's `data` (none: empty), read as it
/// restores.
fn restored(data: Option<impl std::io::Read>, now: Instant, library: &Arc<dyn Library>) -> Result<Partition, String> {
    let mut partition = Partition::new();
    partition.enable_storage();
    partition.set_library(library.clone());
    if let Some(mut data) = data {
        partition
            .restore_snapshot(&mut data, now)
            .map_err(|why| format!("the snapshot does not restore: {why}"))?;
    }
    Ok(partition)
}

/// The metadata group's state on disk, up to entry `applied`: the commands of its latest
/// snapshot (`None` without one) and the entries after it. A snapshot damaged since it was
/// written falls back to the one before and the log kept behind it, as a shard's does.
fn stored_meta(store: &mut Store, applied: u64) -> Result<(Option<Vec<Command>>, Vec<Entry>), String> {
    store.restore_state(applied, |data, entries| Ok((data.map(read_meta).transpose()?, entries)))
}

/// The commands of a metadata snapshot's data.
fn read_meta(mut data: impl std::io::Read) -> Result<Vec<Command>, String> {
    let mut bytes = Vec::new();
    data.read_to_end(&mut bytes).map_err(|e| e.to_string())?;
    meta_commands(&bytes)
}

/// The commands of a metadata snapshot (none in an empty one).
fn meta_commands(data: &[u8]) -> Result<Vec<Command>, String> {
    if data.is_empty() {
        return Ok(Vec::new());
    }
    let (_, mut body) = format::open(data, "the metadata snapshot")?;
    rmpv::decode::read_value(&mut body)
        .map_err(|e| e.to_string())
        .and_then(|value| match value {
            Value::Array(items) => items
                .iter()
                .map(|item| match item {
                    Value::Binary(b) => Command::decode(b),
                    _ => Err("an item that is not a command".into()),
                })
                .collect(),
            _ => Err("not an array of commands".into()),
        })
        .map_err(|why| format!("the metadata snapshot does not decode: {why}"))
}

/// The node a membership change adds, with the address its context carries.
fn added_node(cc: &ConfChange) -> Option<(u64, String)> {
    let adds = matches!(
        cc.get_change_type(),
        ConfChangeType::AddNode | ConfChangeType::AddLearnerNode
    );
    (adds && !cc.context.is_empty()).then(|| (cc.node_id, String::from_utf8_lossy(&cc.context).into_owned()))
}

/// A partition restored from snapshot `data`, then `entries` replayed on it.
fn replayed(
    data: Option<impl std::io::Read>,
    entries: &[Entry],
    index: usize,
    now: Instant,
    library: &Arc<dyn Library>,
) -> Result<Partition, String> {
    let mut partition = restored(data, now, library)?;
    for e in entries {
        if e.get_entry_type() == EntryType::EntryNormal && !e.data.is_empty() {
            replay_entry(&mut partition, e.index, decode_entry(&e.data), now)
                .map_err(|why| format!("shard {index}: {why}"))?;
        }
    }
    Ok(partition)
}

/// Apply the records of entry `entry` (decoded) to `partition`: an error at the first that
/// cannot be (its later records are not applied either).
fn replay_entry(
    partition: &mut Partition,
    entry: u64,
    decoded: Result<Proposed, String>,
    now: Instant,
) -> Result<(), String> {
    let p = decoded.map_err(|why| format!("replicated entry {entry} cannot be applied: {why}"))?;
    for record in p.records {
        partition
            .replay(record, now)
            .map_err(|why| format!("a record of replicated entry {entry} cannot be applied: {why}"))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use raft::prelude::{ConfState, HardState};

    use super::*;

    fn add(node: u64) -> Command {
        Command::AddNode {
            node,
            address: format!("127.0.0.1:{}", 7000 + node),
        }
    }

    fn entry(index: u64) -> Entry {
        Entry {
            index,
            term: 1,
            data: add(index).encode().into(),
            ..Default::default()
        }
    }

    fn snapshot(store: &mut Store, index: u64, data: Vec<u8>) {
        let mut metadata = SnapshotMetadata::default();
        (metadata.index, metadata.term) = (index, 1);
        metadata.mut_conf_state().voters = vec![1];
        store.install(metadata, SnapshotData::Bytes(data), false).unwrap();
    }

    fn nodes(commands: &[Command]) -> Vec<u64> {
        commands
            .iter()
            .filter_map(|c| match c {
                Command::AddNode { node, .. } => Some(*node),
                _ => None,
            })
            .collect()
    }

    #[test]
    fn an_entry_is_its_value_encoding_and_decodes_back() {
        let records = vec![b"first".to_vec(), Vec::new(), vec![7u8; 300], vec![1u8; 70_000]];
        for (node, epoch, proposal) in [(1, 1, 1), (3, 200, 70_000), (u64::MAX, 0, 1 << 40)] {
            let data = encode_entry(1, node, epoch, proposal, &records);
            let value = Value::Array(vec![
                node.into(),
                epoch.into(),
                proposal.into(),
                Value::Array(records.iter().cloned().map(Value::Binary).collect()),
            ]);
            let mut expected = Vec::new();
            rmpv::encode::write_value(&mut expected, &value).unwrap();
            assert_eq!(data, expected);
            let p = decode_entry(&data).unwrap();
            assert_eq!((p.node, p.epoch, p.proposal), (node, epoch, proposal));
            assert_eq!(p.records, records.iter().map(Vec::as_slice).collect::<Vec<_>>());
        }
        assert!(decode_entry(&encode_entry(1, 1, 1, 1, &[])).unwrap().records.is_empty());
        // Cut anywhere, an entry is refused (not read past its end).
        let data = encode_entry(1, 2, 3, 4, &records[..3]);
        for cut in 0..data.len() {
            assert!(decode_entry(&data[..cut]).is_err(), "cut at {cut}");
        }
        let wrong = [
            Value::from(1),
            Value::Array(vec![1.into(), 2.into(), 3.into(), "records".into()]),
        ];
        for value in wrong {
            let mut bytes = Vec::new();
            rmpv::encode::write_value(&mut bytes, &value).unwrap();
            assert!(decode_entry(&bytes).is_err(), "{value}");
        }
    }

    #[test]
    fn entries_of_every_format_read_and_one_that_cannot_be_applied_stops_the_replay() {
        let records = vec![b"r".to_vec()];
        for format in 1..=format::NEWEST {
            let data = encode_entry(format, 1, 2, 3, &records);
            let p = decode_entry(&data).unwrap();
            assert_eq!((p.node, p.epoch, p.proposal, p.records), (1, 2, 3, vec![&b"r"[..]]));
        }
        let entry = |index: u64, data: Vec<u8>| Entry {
            index,
            term: 1,
            data: data.into(),
            ..Default::default()
        };
        let newer = entry(5, encode_entry(format::NEWEST + 1, 1, 2, 3, &[]));
        let why = replayed(
            None::<&[u8]>,
            &[newer],
            3,
            Instant::now(),
            &crate::shards::tests::library(),
        )
        .err()
        .unwrap();
        assert!(
            why.starts_with(&format!(
                "shard 3: replicated entry 5 cannot be applied: the entry is in cluster format {}; \
                 this node reads cluster formats 1 to {}",
                format::NEWEST + 1,
                format::NEWEST
            )),
            "{why}"
        );
        // A record of a version this node does not read, after one it does: refused, not
        // skipped.
        let mut unknown = Vec::new();
        rmpv::encode::write_value(
            &mut unknown,
            &Value::Array(vec![99.into(), "disconnect".into(), 1.into()]),
        )
        .unwrap();
        let entries = [entry(6, encode_entry(2, 1, 2, 3, &[unknown]))];
        let why = replayed(
            None::<&[u8]>,
            &entries,
            3,
            Instant::now(),
            &crate::shards::tests::library(),
        )
        .err()
        .unwrap();
        assert!(
            why.contains("entry 6") && why.contains("record format version 99"),
            "{why}"
        );
    }

    #[test]
    fn a_metadata_entry_or_snapshot_of_a_newer_format_is_refused() {
        let meta = Meta::default();
        assert!(meta_commands(&meta_snapshot(&meta, format::NEWEST)).is_ok());
        let why = meta_commands(&meta_snapshot(&meta, format::NEWEST + 1)).unwrap_err();
        assert!(why.contains("the metadata snapshot is in cluster format"), "{why}");
    }

    /// A metadata store in a fresh directory named after `name`: entries 1..=8 (node i added
    /// at entry i), committed, voter 1.
    fn eight_entries(name: &str) -> (std::path::PathBuf, Store) {
        let dir = std::env::temp_dir().join(format!("spindle-meta-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let mut store = Store::open(&dir, 0).unwrap();
        store.append(&(1..=8).map(entry).collect::<Vec<_>>()).unwrap();
        let hs = HardState {
            term: 1,
            vote: 1,
            commit: 8,
            ..Default::default()
        };
        store.set_hard_state(&hs).unwrap();
        store
            .set_conf_state(&ConfState {
                voters: vec![1],
                ..Default::default()
            })
            .unwrap();
        (dir, store)
    }

    #[test]
    fn a_metadata_snapshot_that_does_not_decode_falls_back_to_the_one_before() {
        let (dir, mut store) = eight_entries("fallback");
        let mut meta = Meta::default();
        (1..=4).for_each(|n| meta.apply(add(n)));
        snapshot(&mut store, 4, meta_snapshot(&meta, 1));
        // Written whole (its checksum holds) by a version that wrote something else.
        snapshot(&mut store, 6, b"\xc1 not MessagePack".to_vec());

        let (commands, entries) = stored_meta(&mut store, 8).unwrap();
        assert_eq!(nodes(&commands.unwrap()), [1, 2, 3, 4]);
        assert_eq!(entries.iter().map(|e| e.index).collect::<Vec<_>>(), [5, 6, 7, 8]);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn when_no_metadata_snapshot_restores_both_reasons_are_told() {
        let (dir, mut store) = eight_entries("neither");
        snapshot(&mut store, 4, b"\xc1 first".to_vec());
        snapshot(&mut store, 6, b"\xc1 second".to_vec());

        let why = stored_meta(&mut store, 8).unwrap_err();
        assert!(why.contains("; the one before: "), "{why}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn the_latest_metadata_snapshot_is_taken_when_it_decodes() {
        let (dir, mut store) = eight_entries("latest");
        let (commands, entries) = stored_meta(&mut store, 8).unwrap();
        assert!(commands.is_none(), "no snapshot yet");
        assert_eq!(entries.len(), 8);
        let mut meta = Meta::default();
        (1..=6).for_each(|n| meta.apply(add(n)));
        snapshot(&mut store, 6, meta_snapshot(&meta, format::NEWEST));

        let (commands, entries) = stored_meta(&mut store, 8).unwrap();
        assert_eq!(nodes(&commands.unwrap()), [1, 2, 3, 4, 5, 6]);
        assert_eq!(entries.iter().map(|e| e.index).collect::<Vec<_>>(), [7, 8]);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
