//! Durability of persistent objects: one op log per shard, written by a thread of its own
//! with group commit, and recovery at start (see docs/durability.md).
//!
//! A shard's partition leaves a record for every event that changes a persistent object;
//! under the shard lock, [`ShardState::journal`](crate::shards::ShardState::journal) hands
//! the records to the shard's writer together with every reply that event produced, so
//! records reach the writer in the partition's order. The writer takes everything queued,
//! writes it with one `append_batch`, makes it durable with one `fsync` (`--fsync always`),
//! and only then releases the replies. A call that only reads a persistent object sends
//! its reply the same way while records are in flight, so no reply shows a state a crash
//! could take back.
//!
//! Snapshots: after `--snapshot-after` bytes of log, the writer starts a snapshot under the
//! shard lock ([`Partition::begin_snapshot`](spindle_core::Partition::begin_snapshot)) and
//! puts a marker in its own queue there, so the marker sits exactly between the records
//! before the snapshot's moment and those after. Reaching the marker, the writer starts a
//! new segment: the snapshot covers the log up to its start. A thread of its own then
//! captures the objects a chunk at a time (calls go on between chunks), writes the file,
//! and deletes the log behind the older of the two newest snapshots.

use std::fs;
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender};
use std::sync::Arc;
use std::time::Instant;

use spindle_core::{ConnId, Delivery, Error, ErrorKind};
use spindle_storage::{self as storage, LogFile, LogPosition, LogWriter, FIRST_SEGMENT_SEQ};
use tracing::{error, info, warn};

use crate::config::Fsync;
use crate::Shared;

// A record the partition accepts must fit the log.
const _: () = assert!(spindle_core::record::MAX_RECORD_LEN == storage::MAX_RECORD_LEN as usize);

/// Most queued batches committed together (bounds the latency of the first of them).
const MAX_GROUP: usize = 4096;
/// Bytes of objects a snapshot captures per hold of the shard lock.
const SNAPSHOT_CHUNK: usize = 256 << 10;
/// Snapshots kept; the log is deleted behind the oldest (a damaged newest one falls back).
const SNAPSHOTS_KEPT: usize = 2;
/// The file that records how many partitions the data directory was written with: keys
/// are placed by hash over that number, so it must never change.
const PARTITIONS_FILE: &str = "partitions";

/// An error that stopped recovery (as opposed to failing to listen).
#[derive(Debug)]
pub struct RecoveryError(pub String);

impl std::fmt::Display for RecoveryError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for RecoveryError {}

fn recovery_error(message: String) -> io::Error {
    io::Error::other(RecoveryError(message))
}

/// Records of one event and the replies that wait for them.
struct Batch {
    records: Vec<Vec<u8>>,
    deliveries: Vec<Delivery>,
}

/// What a shard's writer is sent, in the partition's order.
enum Item {
    Batch(Batch),
    /// A snapshot began here (its header): the records before it are behind its moment.
    Snapshot(Vec<u8>),
}

/// A shard's way to its writer.
pub(crate) struct LogHandle {
    index: usize,
    tx: Sender<Item>,
    /// Batches with records queued or being written, not yet answered.
    inflight: Arc<AtomicUsize>,
}

impl LogHandle {
    /// Queue `records` with the replies that depend on them; returns the replies that may
    /// go now.
    pub(crate) fn submit(&self, records: Vec<Vec<u8>>, deliveries: Vec<Delivery>) -> Vec<Delivery> {
        let logged = !records.is_empty();
        if !logged && (deliveries.is_empty() || self.inflight.load(Ordering::Acquire) == 0) {
            // A read with nothing pending before it: everything it can see is durable.
            return deliveries;
        }
        if logged {
            self.inflight.fetch_add(1, Ordering::AcqRel);
        }
        match self.tx.send(Item::Batch(Batch { records, deliveries })) {
            Ok(()) => Vec::new(),
            Err(mpsc::SendError(item)) => {
                if logged {
                    self.inflight.fetch_sub(1, Ordering::AcqRel);
                }
                match item {
                    Item::Batch(batch) => fail(self.index, "its log writer stopped", batch.deliveries),
                    Item::Snapshot(_) => Vec::new(),
                }
            }
        }
    }
}

/// Start a snapshot of shard `s` now (call with the shard locked): its moment is here, in
/// the order of the log. Returns whether the writer got the marker.
fn begin_snapshot(s: &mut crate::shards::ShardState) -> bool {
    let header = s.partition.begin_snapshot();
    let sent = s
        .log
        .as_ref()
        .is_some_and(|log| log.tx.send(Item::Snapshot(header)).is_ok());
    if !sent {
        s.partition.abort_snapshot();
    }
    sent
}

fn fail(index: usize, why: &str, deliveries: Vec<Delivery>) -> Vec<Delivery> {
    let err = Error::new(
        ErrorKind::StorageError,
        format!(
            "the op log of partition {index} could not be written ({why}): this call's change is not durable, \
             and persistent objects of the partition are read-only until the server restarts"
        ),
    );
    deliveries
        .into_iter()
        .map(|d| Delivery {
            token: d.token,
            reply: Err(err.clone()),
        })
        .collect()
}

/// The partition count to use with `dir`: the one it was written with, if any (recorded on
/// first use).
pub(crate) fn partitions(dir: &Path, configured: usize) -> io::Result<usize> {
    fs::create_dir_all(dir).map_err(|e| recovery_error(format!("cannot create {}: {e}", dir.display())))?;
    let file = dir.join(PARTITIONS_FILE);
    match fs::read_to_string(&file) {
        Ok(text) => {
            let recorded: usize = text
                .trim()
                .parse()
                .ok()
                .filter(|n| *n > 0)
                .ok_or_else(|| recovery_error(format!("{} does not hold a partition count", file.display())))?;
            if recorded != configured {
                info!(
                    partitions = recorded,
                    "{} was written with {recorded} partitions: using {recorded}",
                    dir.display()
                );
            }
            Ok(recorded)
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            let tmp = dir.join(format!("{PARTITIONS_FILE}.tmp"));
            fs::write(&tmp, format!("{configured}\n"))
                .and_then(|()| fs::File::open(&tmp)?.sync_all())
                .and_then(|()| fs::rename(&tmp, &file))
                .and_then(|()| storage::sync_dir(dir))
                .map_err(|e| recovery_error(format!("cannot write {}: {e}", file.display())))?;
            Ok(configured)
        }
        Err(e) => Err(recovery_error(format!("cannot read {}: {e}", file.display()))),
    }
}

/// Recover every shard from the logs in `dir`, then start their writers. Runs before the
/// server accepts connections.
pub(crate) fn start(shared: &Arc<Shared>, dir: &Path, fsync: Fsync, snapshot_after: u64) -> io::Result<()> {
    let started = Instant::now();
    storage::remove_stale_temp_files(dir).map_err(|e| recovery_error(e.to_string()))?;
    // Partitions recover in parallel: one thread each, every one locking only its own shard.
    let results: Vec<io::Result<Recovered>> = std::thread::scope(|scope| {
        let threads: Vec<_> = (0..shared.shards.count())
            .map(|index| scope.spawn(move || recover_shard(shared, dir, index)))
            .collect();
        threads
            .into_iter()
            .map(|t| {
                t.join()
                    .unwrap_or_else(|_| Err(recovery_error("recovery panicked".into())))
            })
            .collect()
    });
    let mut highest_conn: ConnId = 0;
    let mut clients = Vec::new();
    let mut writers = Vec::new();
    let (mut records, mut objects, mut snapshots) = (0, 0, 0);
    for recovered in results {
        let mut recovered = recovered?;
        highest_conn = highest_conn.max(recovered.highest_conn);
        clients.append(&mut recovered.clients);
        objects += recovered.objects;
        records += recovered.records;
        snapshots += u64::from(recovered.from_snapshot);
        writers.push(recovered);
    }
    shared.registry.start_after(highest_conn);
    crate::sessions::recovered(shared, clients);
    let classes = crate::hosts::register_recovered_classes(shared).map_err(io::Error::other)?;
    for (index, recovered) in writers.into_iter().enumerate() {
        let (tx, rx) = mpsc::channel();
        let inflight = Arc::new(AtomicUsize::new(0));
        let handle = LogHandle {
            index,
            tx,
            inflight: inflight.clone(),
        };
        shared
            .shards
            .with(index, |s| s.log = Some(handle))
            .map_err(io::Error::other)?;
        let w = Writer {
            index,
            log: recovered.log,
            fsync,
            failed: None,
            dir: dir.to_owned(),
            snapshot_after,
            since_snapshot: recovered.tail_bytes,
            snapshotting: Arc::new(AtomicBool::new(false)),
        };
        let shared = shared.clone();
        std::thread::Builder::new()
            .name(format!("oplog-{index}"))
            .spawn(move || write_loop(&shared, w, rx, &inflight))?;
    }
    info!(
        data_dir = %dir.display(),
        records,
        snapshots,
        persistent_objects = objects,
        classes,
        fsync = ?fsync,
        "recovered in {:.1} ms",
        started.elapsed().as_secs_f64() * 1e3
    );
    Ok(())
}

/// Recover shard `index` (see [`recover`]); errors name the partition.
fn recover_shard(shared: &Shared, dir: &Path, index: usize) -> io::Result<Recovered> {
    let recovered = shared
        .shards
        .with(index, |s| {
            s.partition.enable_storage();
            recover(&mut s.partition, dir, index as u32)
        })
        .map_err(|e| recovery_error(format!("partition {index}: {e}")))?;
    recovered.map_err(|e| match e.get_ref().is_some_and(|inner| inner.is::<RecoveryError>()) {
        true => e,
        // The storage crate's message names the file and the offset.
        false => recovery_error(e.to_string()),
    })
}

/// A partition's log after recovery.
struct Recovered {
    log: LogWriter,
    /// Records replayed.
    records: u64,
    /// Persistent objects recovered.
    objects: usize,
    /// The highest connection id in the log, and the sessions it names that have not ended.
    highest_conn: ConnId,
    clients: Vec<Arc<str>>,
    /// Bytes of log after the snapshot loaded (all of it without one).
    tail_bytes: u64,
    from_snapshot: bool,
}

/// Load partition `index`'s newest snapshot, replay the log after it, cut a torn tail, and
/// open the log for appending.
fn recover(partition: &mut spindle_core::Partition, dir: &Path, index: u32) -> io::Result<Recovered> {
    let plan = storage::plan_recovery(dir, index)?;
    let now = Instant::now();
    for rejected in &plan.rejected_snapshots {
        warn!(
            "ignoring snapshot {}: {} (using an older one and more of the log)",
            rejected.path.display(),
            rejected.reason
        );
    }
    if let Some(snapshot) = &plan.snapshot {
        let (_, body) = storage::read_snapshot(&snapshot.path)?;
        partition
            .restore_snapshot(&body, now)
            .map_err(|why| recovery_error(format!("snapshot {} does not restore: {why}", snapshot.path.display())))?;
    }
    let tail_bytes = plan
        .segments
        .iter()
        .map(|s| fs::metadata(&s.path).map_or(0, |m| m.len().saturating_sub(s.start_offset)))
        .sum();
    let outcome = storage::replay(&plan, |pos, record| {
        partition.replay(record, now).map_err(|why| {
            let path = storage::segment_path(dir, index, pos.seq);
            let len = record.len() as u64 + storage::log::RECORD_HEADER_LEN;
            let at = pos.offset.saturating_sub(len);
            recovery_error(format!(
                "op log {} holds an unreadable record at byte offset {at}: {why}",
                path.display()
            ))
        })
    })?;
    if let Some(torn) = &outcome.torn {
        warn!(
            "truncating the torn tail of {} at byte offset {} ({} bytes of a write that never completed: {})",
            torn.path.display(),
            torn.offset,
            torn.len(),
            torn.reason
        );
        storage::truncate_torn_tail(&torn.path, torn.offset)?;
    }
    let mut log = match plan.segments.last() {
        Some(last) => LogWriter::open(&last.path)?,
        None => LogWriter::create(dir, index, FIRST_SEGMENT_SEQ)?,
    };
    // The old server's connections are gone: their parked calls go, durably, before
    // anything new is applied.
    partition.restart(now);
    if let Some(records) = partition.take_log() {
        log.append_batch(&records)?;
        log.sync()?;
    }
    Ok(Recovered {
        log,
        records: outcome.records,
        objects: partition.persistent_len(),
        highest_conn: partition.highest_logged_conn(),
        clients: partition.logged_clients(),
        tail_bytes,
        from_snapshot: plan.snapshot.is_some(),
    })
}

/// A shard's writer: group commit until the server exits.
fn write_loop(shared: &Arc<Shared>, mut w: Writer, rx: Receiver<Item>, inflight: &AtomicUsize) {
    let fsync = w.fsync;
    let mut last_sync = Instant::now();
    let mut group: Vec<Batch> = Vec::new();
    loop {
        w.maybe_snapshot(shared);
        let unsynced = w.failed.is_none() && w.log.position() != w.log.synced_position();
        let first = match fsync {
            Fsync::Interval(every) if unsynced => {
                match rx.recv_timeout((last_sync + every).saturating_duration_since(Instant::now())) {
                    Ok(item) => Some(item),
                    Err(RecvTimeoutError::Timeout) => None,
                    Err(RecvTimeoutError::Disconnected) => return,
                }
            }
            _ => match rx.recv() {
                Ok(item) => Some(item),
                Err(_) => return,
            },
        };
        // Everything queued up to a snapshot marker goes in one group; the marker after it.
        let mut marker = None;
        let mut next = first;
        while let Some(item) = next.take() {
            match item {
                Item::Batch(batch) => group.push(batch),
                Item::Snapshot(header) => {
                    marker = Some(header);
                    break;
                }
            }
            if group.len() < MAX_GROUP {
                next = rx.try_recv().ok();
            }
        }
        if !group.is_empty() {
            let logged = group.iter().filter(|b| !b.records.is_empty()).count();
            let (out, newly_failed) = w.commit(&mut group);
            if let Some(why) = newly_failed {
                storage_failed(shared, w.index, &why);
            }
            shared.registry.deliver(out);
            // Only now: a read that finds nothing in flight answers at once.
            inflight.fetch_sub(logged, Ordering::AcqRel);
        }
        if let Some(header) = marker {
            w.snapshot_at_marker(shared, header);
        }
        if let (Fsync::Interval(every), None) = (fsync, &w.failed) {
            if last_sync.elapsed() >= every {
                if let Err(e) = w.log.sync() {
                    let why = e.to_string();
                    storage_failed(shared, w.index, &why);
                    w.failed = Some(why);
                }
                last_sync = Instant::now();
            }
        }
    }
}

/// A shard's log as its writer sees it.
struct Writer<F: LogFile = fs::File> {
    index: usize,
    log: LogWriter<F>,
    fsync: Fsync,
    /// Why the log failed: every later record is refused (the file's state is unknown).
    failed: Option<String>,
    dir: PathBuf,
    /// `--snapshot-after` (0: never).
    snapshot_after: u64,
    /// Log bytes written since the last snapshot's moment.
    since_snapshot: u64,
    /// A snapshot is being captured or written.
    snapshotting: Arc<AtomicBool>,
}

impl Writer {
    /// Start a snapshot if enough log was written since the last one (and none is running).
    fn maybe_snapshot(&mut self, shared: &Shared) {
        if self.snapshot_after == 0
            || self.since_snapshot < self.snapshot_after
            || self.failed.is_some()
            || self.snapshotting.load(Ordering::Acquire)
        {
            return;
        }
        match shared.shards.with(self.index, begin_snapshot) {
            Ok(true) => {
                self.snapshotting.store(true, Ordering::Release);
                self.since_snapshot = 0;
            }
            Ok(false) => {}
            Err(e) => error!(partition = self.index, "cannot start a snapshot: {e}"),
        }
    }

    /// The snapshot marker came through: every record before it is written. Start a new
    /// segment (the snapshot covers the log up to it) and write the snapshot in the background.
    fn snapshot_at_marker(&mut self, shared: &Arc<Shared>, header: Vec<u8>) {
        let position = match &self.failed {
            // The state may hold changes that never reached the disk: never snapshot it.
            Some(why) => Err(why.clone()),
            None => self.log.rotate().map_err(|e| e.to_string()),
        };
        let position = match position {
            Ok(p) => p,
            Err(why) => {
                if self.failed.is_none() {
                    storage_failed(shared, self.index, &why);
                    self.failed = Some(why);
                }
                let _ = shared.shards.with(self.index, |s| s.partition.abort_snapshot());
                self.snapshotting.store(false, Ordering::Release);
                return;
            }
        };
        let (background, index, dir, flag) = (shared.clone(), self.index, self.dir.clone(), self.snapshotting.clone());
        let spawned = std::thread::Builder::new()
            .name(format!("snapshot-{index}"))
            .spawn(move || {
                let started = Instant::now();
                match write_snapshot(&background, index, &dir, position, &header) {
                    Ok(info) => info!(
                        partition = index,
                        bytes = info.body_len,
                        "snapshot {} written in {:.1} ms",
                        info.path.display(),
                        started.elapsed().as_secs_f64() * 1e3
                    ),
                    Err(e) => {
                        warn!(partition = index, "snapshot failed (the log is kept): {e}");
                        let _ = background.shards.with(index, |s| s.partition.abort_snapshot());
                    }
                }
                flag.store(false, Ordering::Release);
            });
        if let Err(e) = spawned {
            warn!(partition = self.index, "cannot start a snapshot thread: {e}");
            let _ = shared.shards.with(self.index, |s| s.partition.abort_snapshot());
            self.snapshotting.store(false, Ordering::Release);
        }
    }
}

/// Capture partition `index`'s snapshot a chunk at a time, write it as the snapshot at
/// `position`, and delete the log behind the oldest snapshot kept.
fn write_snapshot(
    shared: &Shared,
    index: usize,
    dir: &Path,
    position: LogPosition,
    header: &[u8],
) -> io::Result<storage::SnapshotInfo> {
    let mut file = storage::begin_snapshot(dir, index as u32, position)?;
    file.write_all(header)?;
    loop {
        let (chunk, done) = shared
            .shards
            .with(index, |s| s.partition.snapshot_chunk(SNAPSHOT_CHUNK))
            .map_err(io::Error::other)?;
        file.write_all(&chunk)?;
        if done {
            break;
        }
    }
    let info = file.finish()?;
    if let Some(floor) = storage::prune_snapshots(dir, index as u32, SNAPSHOTS_KEPT)? {
        storage::delete_segments_before(dir, index as u32, floor.seq)?;
    }
    Ok(info)
}

impl<F: LogFile> Writer<F> {
    /// Write a group of batches with one append (and one `fsync` under `always`); returns
    /// the replies to release, and the reason if the log failed just now.
    fn commit(&mut self, group: &mut Vec<Batch>) -> (Vec<Delivery>, Option<String>) {
        let logged = group.iter().any(|b| !b.records.is_empty());
        let written = match &self.failed {
            Some(why) => Err(why.clone()),
            None if !logged => Ok(()),
            None => self
                .log
                .append_batch(group.iter().flat_map(|b| b.records.iter()))
                .inspect(|_| {
                    let bytes: usize = group.iter().flat_map(|b| b.records.iter()).map(Vec::len).sum();
                    self.since_snapshot += bytes as u64;
                })
                .and_then(|_| match self.fsync {
                    Fsync::Always => self.log.sync(),
                    _ => Ok(()),
                })
                .map_err(|e| e.to_string()),
        };
        let mut newly_failed = None;
        if let (Err(why), None) = (&written, &self.failed) {
            self.failed = Some(why.clone());
            newly_failed = Some(why.clone());
        }
        let mut out = Vec::new();
        for batch in group.drain(..) {
            match &written {
                // Reads that only waited for earlier records go out as they are.
                Err(why) if !batch.records.is_empty() => out.extend(fail(self.index, why, batch.deliveries)),
                _ => out.extend(batch.deliveries),
            }
        }
        (out, newly_failed)
    }
}

fn storage_failed(shared: &Shared, index: usize, why: &str) {
    error!(
        partition = index,
        "the op log failed: {why}; persistent objects of this partition are read-only until a restart"
    );
    if let Err(e) = shared.shards.with(index, |s| s.partition.storage_failed(why)) {
        error!(partition = index, "could not stop persistent writes: {e}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use spindle_core::{Token, Value};

    /// A disk that fills up after `room` bytes.
    struct SmallDisk {
        file: fs::File,
        room: u64,
    }

    impl LogFile for SmallDisk {
        fn write_all_at(&mut self, buf: &[u8], offset: u64) -> io::Result<()> {
            if offset + buf.len() as u64 > self.room {
                return Err(io::Error::new(io::ErrorKind::StorageFull, "No space left on device"));
            }
            LogFile::write_all_at(&mut self.file, buf, offset)
        }
        fn set_len(&mut self, len: u64) -> io::Result<()> {
            LogFile::set_len(&mut self.file, len)
        }
        fn sync_data(&mut self) -> io::Result<()> {
            LogFile::sync_data(&mut self.file)
        }
    }

    fn batch(records: usize, req: u64) -> Batch {
        Batch {
            records: vec![vec![0x90; 100]; records],
            deliveries: vec![Delivery {
                token: Token { conn: 1, req },
                reply: Ok(Value::from(req)),
            }],
        }
    }

    #[test]
    fn a_full_disk_fails_the_waiting_calls_and_every_later_write() {
        let dir = std::env::temp_dir().join(format!("spindle-journal-test-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir).unwrap();
        let log = LogWriter::create_with(&dir, 0, FIRST_SEGMENT_SEQ, |file| SmallDisk { file, room: 400 }).unwrap();
        let mut w = Writer {
            index: 0,
            log,
            fsync: Fsync::Always,
            failed: None,
            dir: dir.clone(),
            snapshot_after: 0,
            since_snapshot: 0,
            snapshotting: Arc::new(AtomicBool::new(false)),
        };
        // Two records fit: one append, one sync, replies released as they were.
        let (out, failed) = w.commit(&mut vec![batch(1, 1), batch(1, 2)]);
        assert_eq!(failed, None);
        assert_eq!(
            out.iter().map(|d| d.reply.clone()).collect::<Vec<_>>(),
            vec![Ok(1.into()), Ok(2.into())]
        );
        // The next group does not fit: its calls fail, a read waiting behind it does not.
        let (out, failed) = w.commit(&mut vec![batch(3, 3), batch(0, 4)]);
        assert!(failed.is_some_and(|why| why.contains("No space left")));
        let e = out[0].reply.clone().unwrap_err();
        assert_eq!(e.kind, ErrorKind::StorageError);
        assert!(e.message.contains("No space left on device"), "{e}");
        assert_eq!(out[1].reply, Ok(4.into()));
        // Nothing more is written, even what would fit.
        let (out, failed) = w.commit(&mut vec![batch(1, 5)]);
        assert_eq!(failed, None, "reported once");
        assert_eq!(out[0].reply.clone().unwrap_err().kind, ErrorKind::StorageError);
        // What was acknowledged is intact on disk.
        let mut scan = storage::SegmentScanner::open(w.log.path()).unwrap();
        let mut records = 0;
        while scan.next_record().unwrap().is_some() {
            records += 1;
        }
        assert_eq!(records, 2);
        let _ = fs::remove_dir_all(&dir);
    }
}
