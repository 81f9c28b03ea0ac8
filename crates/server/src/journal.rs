//! Durability of persistent objects: one op log per shard with group commit, snapshots,
//! and recovery at start (see docs/durability.md).
//!
//! A shard's partition leaves a record for every event that changes a persistent object.
//! The call that caused it writes the records itself, under the shard lock
//! ([`ShardState::journal`](crate::shards::ShardState::journal)), so they are in the
//! partition's order and no thread hop is paid. With `--fsync always` its replies then wait
//! for the shard's [`Syncer`] thread: it `fsync`s whenever replies wait, each `fsync`
//! covering every record written before it by any call (group commit: under load they run
//! back to back while calls keep writing), and sends the replies it covered. A call that
//! only reads a persistent object waits the same way while records before it are not
//! durable, so no reply shows a state a crash could take back. With `interval` the syncer
//! `fsync`s on a timer and replies go at once; with `never` there is no syncer.
//!
//! Snapshots: after `--snapshot-after` bytes of log, a call's journal step starts a snapshot
//! ([`Partition::begin_snapshot`]) and moves the log to a new segment there, under the shard
//! lock: the snapshot covers the log up to the new segment's start. A thread of its own
//! then captures the objects a chunk at a time (calls go on between chunks), writes the
//! file, and deletes the log behind the older of the two newest snapshots.

use std::collections::VecDeque;
use std::fs;
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, PoisonError, Weak};
use std::time::Instant;

use spindle_core::{ConnId, Delivery, Error, ErrorKind, Partition};
use spindle_storage::{self as storage, LogFile, LogPosition, LogWriter, FIRST_SEGMENT_SEQ};
use tracing::{error, info, warn};

use crate::config::Fsync;
use crate::shards::ShardState;
use crate::Shared;

// A record the partition accepts must fit the log.
const _: () = assert!(spindle_core::record::MAX_RECORD_LEN == storage::MAX_RECORD_LEN as usize);

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

/// A shard's op log, kept in the shard's state: calls write their records themselves,
/// under the shard lock, so records are in the partition's order with no hop to another
/// thread. With `--fsync always` the replies then wait for the shard's [`Syncer`].
pub(crate) struct Journal<F: LogFile = fs::File> {
    index: usize,
    /// For the snapshot thread (weak: the shards live inside `Shared`).
    shared: Weak<Shared>,
    log: LogWriter<F>,
    fsync: Fsync,
    /// Why the log failed: every later record is refused (the file's state is unknown).
    failed: Option<String>,
    /// Bytes written to the log since the server started (marks for the syncer).
    written: u64,
    /// `None` with `--fsync never`.
    syncer: Option<Arc<Syncer>>,
    dir: PathBuf,
    /// `--snapshot-after` (0: never).
    snapshot_after: u64,
    /// Log bytes written since the last snapshot's moment.
    since_snapshot: u64,
    /// A snapshot is being captured or written.
    snapshotting: Arc<AtomicBool>,
}

impl<F: LogFile> Journal<F> {
    /// After any partition entry point (under the shard lock): write its op-log `records`;
    /// returns the replies that may go now. With `--fsync always`, replies that depend on
    /// records not yet durable (the call's own, or earlier ones it may have read) go to the
    /// syncer instead, which sends them after its next `fsync`.
    fn submit(&mut self, partition: &mut Partition, records: Vec<Vec<u8>>, deliveries: Vec<Delivery>) -> Vec<Delivery> {
        if let Some(why) = self
            .failed
            .clone()
            .or_else(|| self.syncer.as_ref().and_then(|s| s.failure()))
        {
            return match records.is_empty() {
                // Reads see only what was acknowledged before the failure, or refused since.
                true => deliveries,
                false => self.fail(partition, &why, deliveries),
            };
        }
        if !records.is_empty() {
            if let Err(e) = self.log.append_batch(&records) {
                return self.fail(partition, &e.to_string(), deliveries);
            }
            let bytes: usize = records.iter().map(Vec::len).sum();
            self.written += bytes as u64;
            self.since_snapshot += bytes as u64;
            if let Some(syncer) = &self.syncer {
                syncer.written.store(self.written, Ordering::Release);
            }
        }
        match (&self.syncer, self.fsync) {
            (Some(syncer), Fsync::Always) if !deliveries.is_empty() => syncer.after_sync(self.written, deliveries),
            _ => deliveries,
        }
    }

    /// The log failed: fail `deliveries`, and every persistent write of the partition from now on.
    fn fail(&mut self, partition: &mut Partition, why: &str, deliveries: Vec<Delivery>) -> Vec<Delivery> {
        if self.failed.is_none() {
            error!(
                partition = self.index,
                "the op log failed: {why}; persistent objects of this partition are read-only until a restart"
            );
            self.failed = Some(why.to_string());
            partition.storage_failed(why);
            partition.abort_snapshot();
        }
        storage_errors(self.index, why, deliveries)
    }
}

impl Journal {
    /// Start a snapshot if enough log was written since the last one (and none is running):
    /// its moment is now, between the records written so far and the next ones. The log
    /// moves to a new segment here (the snapshot covers the log up to its start), and a
    /// thread of its own captures and writes the snapshot.
    ///
    /// Returns replies failed by a failed move to the new segment.
    #[must_use]
    fn maybe_snapshot(&mut self, partition: &mut Partition) -> Vec<Delivery> {
        if self.snapshot_after == 0
            || self.since_snapshot < self.snapshot_after
            || self.failed.is_some()
            || self.syncer.as_ref().is_some_and(|s| s.failure().is_some())
            || self.snapshotting.load(Ordering::Acquire)
        {
            return Vec::new();
        }
        let Some(shared) = self.shared.upgrade() else {
            return Vec::new();
        };
        let header = partition.begin_snapshot();
        let rotated = self.log.rotate().and_then(|position| {
            if let Some(syncer) = &self.syncer {
                syncer.switch_file(self.log.sync_handle()?);
            }
            Ok(position)
        });
        let position = match rotated {
            Ok(position) => position,
            Err(e) => {
                // Which segment the log is in, or which file the syncer makes durable, or
                // whether an fsync error was reported to the rotation's own fsync and not to
                // the syncer's: unknown. Stop persistent writes, and fail the replies waiting
                // for a sync that may not cover them.
                let why = format!("the log could not move to a new segment: {e}");
                let mut failed = self.fail(partition, &why, Vec::new());
                if let Some(syncer) = &self.syncer {
                    failed.extend(syncer.fail_waiting(&why));
                }
                return failed;
            }
        };
        self.since_snapshot = 0;
        self.snapshotting.store(true, Ordering::Release);
        let (background, index, dir, flag) = (shared, self.index, self.dir.clone(), self.snapshotting.clone());
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
            partition.abort_snapshot();
            self.snapshotting.store(false, Ordering::Release);
        }
        Vec::new()
    }
}

/// Write `records` to shard `s`'s log (if it has one) and return the replies that may go now.
pub(crate) fn submit(s: &mut ShardState, records: Vec<Vec<u8>>, deliveries: Vec<Delivery>) -> Vec<Delivery> {
    let ShardState { partition, log, .. } = s;
    let Some(journal) = log else {
        return deliveries;
    };
    let mut out = journal.submit(partition, records, deliveries);
    out.extend(journal.maybe_snapshot(partition));
    out
}

/// Makes a shard's log durable in the background and sends the replies that wait for it
/// (group commit: one `fsync` covers every record written before it, by any call).
pub(crate) struct Syncer {
    index: usize,
    /// Bytes written to the log so far (the journal's mark after its last write).
    written: AtomicU64,
    state: Mutex<SyncState>,
    wake: Condvar,
    /// The current segment (replaced when the log moves to a new one, after syncing the old).
    file: Mutex<Arc<fs::File>>,
}

#[derive(Default)]
struct SyncState {
    /// Replies waiting for the log to be durable up to their mark, oldest first.
    waiting: VecDeque<(u64, Vec<Delivery>)>,
    /// The highest mark known durable.
    synced: u64,
    failed: Option<String>,
    /// The syncer waits for replies (calls wake it only then: a wake-up is a system call).
    idle: bool,
}

impl Syncer {
    fn new(index: usize, file: fs::File) -> Self {
        Syncer {
            index,
            written: AtomicU64::new(0),
            state: Mutex::new(SyncState::default()),
            wake: Condvar::new(),
            file: Mutex::new(Arc::new(file)),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, SyncState> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn failure(&self) -> Option<String> {
        self.lock().failed.clone()
    }

    /// Queue `deliveries` until the log is durable up to `mark`; returns them if it is already.
    fn after_sync(&self, mark: u64, deliveries: Vec<Delivery>) -> Vec<Delivery> {
        let mut state = self.lock();
        if let Some(why) = &state.failed {
            return storage_errors(self.index, why, deliveries);
        }
        if mark <= state.synced {
            return deliveries;
        }
        state.waiting.push_back((mark, deliveries));
        if state.idle {
            self.wake.notify_one();
        }
        Vec::new()
    }

    /// Fail from now on; returns the replies that were waiting, failed.
    fn fail_waiting(&self, why: &str) -> Vec<Delivery> {
        let mut state = self.lock();
        state.failed.get_or_insert_with(|| why.to_string());
        state
            .waiting
            .drain(..)
            .flat_map(|(_, d)| storage_errors(self.index, why, d))
            .collect()
    }

    fn switch_file(&self, file: fs::File) {
        *self.file.lock().unwrap_or_else(PoisonError::into_inner) = Arc::new(file);
    }

    /// `fsync` until the server exits: `always`, whenever replies wait (back to back under
    /// load, each covering what was written meanwhile); `interval`, every interval.
    fn run(&self, shared: &Shared, fsync: Fsync) {
        loop {
            let target = {
                let mut state = self.lock();
                let due =
                    |state: &SyncState| state.failed.is_none() && self.written.load(Ordering::Acquire) > state.synced;
                loop {
                    match fsync {
                        Fsync::Always if !state.waiting.is_empty() && due(&state) => break,
                        Fsync::Interval(every) => {
                            state = self
                                .wake
                                .wait_timeout(state, every)
                                .unwrap_or_else(PoisonError::into_inner)
                                .0;
                            if due(&state) {
                                break;
                            }
                        }
                        _ => {
                            state.idle = true;
                            state = self.wake.wait(state).unwrap_or_else(PoisonError::into_inner);
                            state.idle = false;
                        }
                    }
                }
                // Read before the fsync: it covers at least this much.
                self.written.load(Ordering::Acquire)
            };
            let file = self.file.lock().unwrap_or_else(PoisonError::into_inner).clone();
            let synced = file.sync_data();
            let mut ready = Vec::new();
            let failed = {
                let mut state = self.lock();
                match &synced {
                    Ok(()) => {
                        state.synced = state.synced.max(target);
                        while state.waiting.front().is_some_and(|(mark, _)| *mark <= target) {
                            ready.extend(state.waiting.pop_front().map(|(_, d)| d).unwrap_or_default());
                        }
                        None
                    }
                    // After a failed fsync the kernel may have dropped the dirty pages:
                    // nothing written since the last good one can be trusted.
                    Err(e) => Some(format!("fsync failed: {e}")),
                }
            };
            shared.registry.deliver(ready);
            if let Some(why) = failed {
                self.fail(shared, &why);
            }
        }
    }

    /// The log can no longer be made durable: fail the replies waiting for it, and every
    /// persistent write of the partition from now on.
    fn fail(&self, shared: &Shared, why: &str) {
        shared.registry.deliver(self.fail_waiting(why));
        error!(
            partition = self.index,
            "the op log failed: {why}; persistent objects of this partition are read-only until a restart"
        );
        if let Err(e) = shared.shards.with(self.index, |s| {
            s.partition.storage_failed(why);
            s.partition.abort_snapshot();
        }) {
            error!(partition = self.index, "could not stop persistent writes: {e}");
        }
    }
}

fn storage_errors(index: usize, why: &str, deliveries: Vec<Delivery>) -> Vec<Delivery> {
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
    let classes = crate::hosts::register_recovered_classes(shared).map_err(io::Error::other)?;
    for (index, recovered) in writers.into_iter().enumerate() {
        let syncer = match fsync {
            Fsync::Never => None,
            _ => Some(Arc::new(Syncer::new(index, recovered.log.sync_handle()?))),
        };
        if let Some(syncer) = &syncer {
            let (shared, syncer) = (shared.clone(), syncer.clone());
            std::thread::Builder::new()
                .name(format!("fsync-{index}"))
                .spawn(move || {
                    // Should the thread ever panic, no reply may wait for it forever.
                    let run = std::panic::AssertUnwindSafe(|| syncer.run(&shared, fsync));
                    if std::panic::catch_unwind(run).is_err() {
                        syncer.fail(&shared, "the fsync thread panicked");
                    }
                })?;
        }
        let journal = Journal {
            index,
            shared: Arc::downgrade(shared),
            log: recovered.log,
            fsync,
            failed: None,
            written: 0,
            syncer,
            dir: dir.to_owned(),
            snapshot_after,
            since_snapshot: recovered.tail_bytes,
            snapshotting: Arc::new(AtomicBool::new(false)),
        };
        shared
            .shards
            .with(index, move |s| {
                let ShardState { partition, log, .. } = s;
                // A long tail replayed: snapshot it now (no call waits yet: no replies).
                let _ = log.insert(journal).maybe_snapshot(partition);
            })
            .map_err(io::Error::other)?;
    }
    // After the journals are in place: a session that ends at once logs its end.
    crate::sessions::recovered(shared, clients);
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
        let mut body = storage::SnapshotReader::open(&snapshot.path)?;
        partition
            .restore_snapshot(&mut body, now)
            .map_err(|why| recovery_error(format!("snapshot {} does not restore: {why}", snapshot.path.display())))?;
    }
    let mut tail_bytes = 0;
    let outcome = storage::replay(&plan, |pos, record| {
        tail_bytes += storage::log::RECORD_HEADER_LEN + record.len() as u64;
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
            .map_err(io::Error::other)?
            .ok_or_else(|| io::Error::other("the capture was aborted (the op log failed)"))?;
        file.write_all(&chunk)?;
        if done {
            break;
        }
    }
    let info = file.finish()?;
    // Only behind the older of two: if the newest is ever damaged, recovery falls back to it.
    let oldest_kept = storage::prune_snapshots(dir, index as u32, SNAPSHOTS_KEPT)?;
    if let Some(floor) = oldest_kept.filter(|floor| *floor < info.position) {
        storage::delete_segments_before(dir, index as u32, floor.seq)?;
    }
    Ok(info)
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

    fn reply(req: u64) -> Vec<Delivery> {
        vec![Delivery {
            token: Token { conn: 1, req },
            reply: Ok(Value::from(req)),
        }]
    }

    fn records(n: usize) -> Vec<Vec<u8>> {
        vec![vec![0x90; 100]; n]
    }

    #[test]
    fn a_failed_syncer_answers_later_calls_at_once_with_storage_errors() {
        let syncer = Syncer::new(0, fs::File::open("/dev/null").unwrap());
        syncer.written.store(10, Ordering::Release);
        assert!(syncer.after_sync(10, reply(1)).is_empty(), "waits for the next fsync");
        // An fsync failed: the reply waiting is failed, and so is one queued after.
        let failed = syncer.fail_waiting("fsync failed: EIO");
        assert_eq!(failed[0].reply.clone().unwrap_err().kind, ErrorKind::StorageError);
        let late = syncer.after_sync(10, reply(2));
        let e = late[0].reply.clone().unwrap_err();
        assert_eq!((e.kind, late[0].token.req), (ErrorKind::StorageError, 2));
        assert!(e.message.contains("EIO"), "{e}");
        assert!(
            syncer.lock().waiting.is_empty(),
            "nothing is left waiting for a sync that never comes"
        );
    }

    #[test]
    fn a_full_disk_fails_the_waiting_calls_and_every_later_write() {
        let dir = std::env::temp_dir().join(format!("spindle-journal-test-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir).unwrap();
        let log = LogWriter::create_with(&dir, 0, FIRST_SEGMENT_SEQ, |file| SmallDisk { file, room: 400 }).unwrap();
        let mut j = Journal {
            index: 0,
            shared: Weak::new(),
            log,
            fsync: Fsync::Never,
            failed: None,
            written: 0,
            syncer: None,
            dir: dir.clone(),
            snapshot_after: 0,
            since_snapshot: 0,
            snapshotting: Arc::new(AtomicBool::new(false)),
        };
        let mut p = Partition::new();
        p.enable_storage();
        // Two records fit: their replies go as they were.
        assert_eq!(j.submit(&mut p, records(1), reply(1)), reply(1));
        assert_eq!(j.submit(&mut p, records(1), reply(2)), reply(2));
        // The next write does not fit: its call fails; a read after it does not.
        let out = j.submit(&mut p, records(3), reply(3));
        let e = out[0].reply.clone().unwrap_err();
        assert_eq!(e.kind, ErrorKind::StorageError);
        assert!(e.message.contains("No space left on device"), "{e}");
        assert_eq!(j.submit(&mut p, records(0), reply(4)), reply(4));
        // Nothing more is written, even what would fit; the partition refuses persistent writes.
        let out = j.submit(&mut p, records(1), reply(5));
        assert_eq!(out[0].reply.clone().unwrap_err().kind, ErrorKind::StorageError);
        let caller = spindle_core::Caller {
            conn: 1,
            client: Arc::from("c"),
            thread: 0,
        };
        let create = spindle_core::partition::Op::Create {
            type_name: "Counter".into(),
            key: "k".into(),
            args: vec![],
            owned: false,
            persistent: true,
        };
        let out = p.apply(&caller, Token { conn: 1, req: 6 }, 0, 0, create, Instant::now());
        assert_eq!(out[0].reply.clone().unwrap_err().kind, ErrorKind::StorageError);
        // What was acknowledged is intact on disk.
        let mut scan = storage::SegmentScanner::open(j.log.path()).unwrap();
        let mut found = 0;
        while scan.next_record().unwrap().is_some() {
            found += 1;
        }
        assert_eq!(found, 2);
        let _ = fs::remove_dir_all(&dir);
    }
}
