//! Durability of persistent objects: one write-ahead log per server shared by its
//! partitions ([`crate::wal`]), with group commit across them; snapshots per partition; and
//! recovery at start (see docs/durability.md).
//!
//! A shard's partition leaves a record for every event that changes a persistent object.
//! The call that caused it writes the records itself, under the shard lock
//! ([`Journal::append`], from the shard's journal step) and then the log's short
//! lock, so they are in the partition's order and no thread hop is paid. With `--fsync
//! always` its replies then wait for the log's syncer thread: it `fsync`s whenever replies
//! wait, each `fsync` covering every record written before it by any call of any partition
//! (group commit: under load they run back to back while calls keep writing), and sends
//! the replies it covered. A call that only reads a persistent object waits the same way
//! while its partition's records before it are not durable, so no reply shows a state a
//! crash could take back. With `interval` the syncer `fsync`s on a timer and replies go at
//! once; with `never` there is no syncer.
//!
//! Snapshots: when the log has grown by `--snapshot-after` bytes since a partition's last
//! snapshot, a call's journal step (or another partition's finished snapshot) starts one
//! ([`Partition::begin_snapshot`]) and moves the log to a new segment there, under the
//! shard lock: the snapshot covers the partition's records up to the new segment's start.
//! A thread of its own then captures the objects a chunk at a time (calls go on between
//! chunks), writes the file, and deletes the segments behind the oldest snapshot that any
//! partition keeps (two each).

use std::fs;
use std::io::{self, Write};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Weak};
use std::time::Instant;

use spindle_core::{ConnId, Delivery, Partition};
use spindle_storage::{self as storage, LogFile, LogPosition, LogWriter, FIRST_SEGMENT_SEQ};
use tracing::{error, info, warn};

use crate::config::Fsync;
use crate::wal::{storage_errors, Wal};
use crate::Shared;

// A record the partition accepts must fit the log.
const _: () = assert!(spindle_core::record::MAX_RECORD_LEN + storage::wal::TAG_LEN <= storage::MAX_RECORD_LEN as usize);

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

/// A shard's handle on the write-ahead log, kept in the shard's state: calls write their
/// records themselves, under the shard lock, so records are in the partition's order with
/// no hop to another thread. With `--fsync always` the replies then wait for the log's
/// [`Syncer`](crate::wal::Syncer).
pub(crate) struct Journal<F: LogFile = fs::File> {
    index: usize,
    /// For the snapshot thread (weak: the shards live inside `Shared`).
    shared: Weak<Shared>,
    wal: Arc<Wal<F>>,
    fsync: Fsync,
    /// This partition stopped persistent writes (the log failed).
    stopped: bool,
    /// The log's mark after this partition's last records: its reads wait for it.
    last_mark: u64,
    /// `--snapshot-after` (0: never).
    snapshot_after: u64,
    /// The log's mark at this partition's last snapshot moment (or where its replay began).
    snapshot_mark: u64,
    /// A snapshot is being captured or written.
    snapshotting: Arc<AtomicBool>,
}

impl<F: LogFile> Journal<F> {
    /// After any partition entry point (under the shard lock): write its op-log `records`;
    /// returns the replies that may go now. With `--fsync always`, replies that depend on
    /// records not yet durable (the call's own, or earlier ones it may have read) go to the
    /// syncer instead, which sends them after its next `fsync`.
    fn submit(&mut self, partition: &mut Partition, records: Vec<Vec<u8>>, deliveries: Vec<Delivery>) -> Vec<Delivery> {
        if let Some(why) = self.wal.failure() {
            return match records.is_empty() {
                // Reads see only what was acknowledged before the failure, or refused since.
                true => deliveries,
                false => self.fail(partition, &why, deliveries),
            };
        }
        if !records.is_empty() {
            match self.wal.append(self.index, &records) {
                Ok(mark) => self.last_mark = mark,
                Err(e) => {
                    // The log is shared: what follows in it is unknown for every partition.
                    let why = e.to_string();
                    self.wal.fail(&why);
                    return self.fail(partition, &why, deliveries);
                }
            }
        }
        match (&self.wal.syncer, self.fsync) {
            (Some(syncer), Fsync::Always) if !deliveries.is_empty() => syncer.after_sync(self.last_mark, deliveries),
            _ => deliveries,
        }
    }

    /// The log failed: fail `deliveries`, and every persistent write of the partition from now on.
    fn fail(&mut self, partition: &mut Partition, why: &str, deliveries: Vec<Delivery>) -> Vec<Delivery> {
        if !self.stopped {
            error!(
                partition = self.index,
                "the write-ahead log failed: {why}; persistent objects are read-only until a restart"
            );
            self.stop(partition, why);
        }
        storage_errors(why, deliveries)
    }

    fn stop(&mut self, partition: &mut Partition, why: &str) {
        self.stopped = true;
        partition.storage_failed(why);
        partition.abort_snapshot();
    }
}

impl Journal {
    /// A call's `records` (see `submit`), then a snapshot if the log grew enough since the
    /// partition's last. Returns the replies that may go now.
    pub(crate) fn append(
        &mut self,
        partition: &mut Partition,
        records: Vec<Vec<u8>>,
        deliveries: Vec<Delivery>,
    ) -> Vec<Delivery> {
        let wrote = !records.is_empty();
        let mut out = self.submit(partition, records, deliveries);
        if wrote {
            let written = self.last_mark;
            out.extend(self.maybe_snapshot(partition, written));
        }
        out
    }

    /// Start a snapshot if the log grew by `--snapshot-after` since this partition's last
    /// one (and none is running); `written` is the log's mark now. The moment is now,
    /// between this partition's records written so far and its next ones. The log moves to
    /// a new segment here (the snapshot covers the log up to its start), and a thread of
    /// its own captures and writes the snapshot.
    ///
    /// Every partition snapshots as the log grows, those that write nothing too: segments
    /// are deleted only behind the oldest snapshot any partition keeps.
    ///
    /// Returns replies failed by a failed move to the new segment.
    #[must_use]
    fn maybe_snapshot(&mut self, partition: &mut Partition, written: u64) -> Vec<Delivery> {
        if self.snapshot_after == 0
            || written.saturating_sub(self.snapshot_mark) < self.snapshot_after
            || self.stopped
            || self.snapshotting.load(Ordering::Acquire)
            || self.wal.failure().is_some()
        {
            return Vec::new();
        }
        let Some(shared) = self.shared.upgrade() else {
            return Vec::new();
        };
        let header = partition.begin_snapshot();
        let (position, mark) = match self.wal.rotate() {
            Ok(rotated) => rotated,
            Err(e) => {
                // Which segment the log is in, or which file the syncer makes durable, or
                // whether an fsync error was reported to the rotation's own fsync and not to
                // the syncer's: unknown. Stop persistent writes, and fail the replies waiting
                // for a sync that may not cover them.
                let why = format!("the log could not move to a new segment: {e}");
                self.wal.fail(&why);
                let mut failed = self.fail(partition, &why, Vec::new());
                if let Some(syncer) = &self.wal.syncer {
                    failed.extend(syncer.fail_waiting(&why));
                }
                return failed;
            }
        };
        self.snapshot_mark = mark;
        self.snapshotting.store(true, Ordering::Release);
        let (background, index, wal, flag) = (shared, self.index, self.wal.clone(), self.snapshotting.clone());
        let spawned = std::thread::Builder::new()
            .name(format!("snapshot-{index}"))
            .spawn(move || {
                let started = Instant::now();
                match write_snapshot(&background, index, &wal, position, &header) {
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
                snapshot_others(&background, index);
            });
        if let Err(e) = spawned {
            warn!(partition = self.index, "cannot start a snapshot thread: {e}");
            partition.abort_snapshot();
            self.snapshotting.store(false, Ordering::Release);
        }
        Vec::new()
    }
}

/// Write the records of several shards (a transaction's commit) as one group record, so
/// a crash keeps all of them or none, and return the replies that may go now (see
/// [`Journal::submit`]). `logs` are the shards' that have one, `parts` their records.
pub(crate) fn submit_group(
    mut logs: Vec<(&mut Partition, &mut Journal)>,
    parts: Vec<(u32, Vec<Vec<u8>>)>,
    deliveries: Vec<Delivery>,
) -> Vec<Delivery> {
    let Some(wal) = logs.first().map(|(_, journal)| journal.wal.clone()) else {
        return deliveries;
    };
    if let Some(why) = wal.failure() {
        let (partition, journal) = &mut logs[0];
        return journal.fail(partition, &why, deliveries);
    }
    let mark = match wal.append_group(&parts) {
        Ok(mark) => mark,
        Err(e) => {
            let why = e.to_string();
            wal.fail(&why);
            for (partition, journal) in logs {
                journal.stop(partition, &why);
            }
            return storage_errors(&why, deliveries);
        }
    };
    let mut fsync = Fsync::Never;
    for (_, journal) in logs {
        journal.last_mark = mark;
        fsync = journal.fsync;
    }
    match (&wal.syncer, fsync) {
        (Some(syncer), Fsync::Always) if !deliveries.is_empty() => syncer.after_sync(mark, deliveries),
        _ => deliveries,
    }
}

/// Start the syncer thread of `wal` (none with `--fsync never`). Should an `fsync` fail
/// (or the thread panic), every partition refuses persistent writes from then on: the
/// log is theirs alike.
fn start_syncer(shared: &Arc<Shared>, wal: &Wal, fsync: Fsync) -> io::Result<()> {
    let Some(syncer) = wal.syncer.clone() else {
        return Ok(());
    };
    let shared = shared.clone();
    std::thread::Builder::new().name("fsync".into()).spawn(move || {
        let run = std::panic::AssertUnwindSafe(|| syncer.run(fsync, &|ready| shared.registry.deliver(ready)));
        let why = std::panic::catch_unwind(run).unwrap_or_else(|_| "the fsync thread panicked".into());
        // No reply may wait for a thread that is gone.
        shared.registry.deliver(syncer.fail_waiting(&why));
        error!("the write-ahead log failed: {why}; persistent objects are read-only until a restart");
        for index in 0..shared.shards.count() {
            let stopped = shared.shards.with(index, |s| match &mut s.log {
                Some(journal) => journal.stop(&mut s.partition, &why),
                None => s.partition.storage_failed(&why),
            });
            if let Err(e) = stopped {
                error!(partition = index, "could not stop persistent writes: {e}");
            }
        }
    })?;
    Ok(())
}

/// After partition `done`'s snapshot: the others snapshot too if the log grew enough since
/// theirs (one that writes nothing never gets to, and its old snapshot would keep the log).
fn snapshot_others(shared: &Shared, done: usize) {
    for index in (0..shared.shards.count()).filter(|i| *i != done) {
        let failed = shared.shards.with(index, |s| {
            s.log.as_mut().map(|journal| {
                let written = journal.wal.written();
                journal.maybe_snapshot(&mut s.partition, written)
            })
        });
        if let Ok(Some(failed)) = failed {
            shared.registry.deliver(failed);
        }
    }
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

/// Recover every partition from the write-ahead log in `dir` (after upgrading a data
/// directory of an earlier release), then start the log's syncer. Runs before the server
/// accepts connections; every error is a [`RecoveryError`].
pub(crate) fn start(shared: &Arc<Shared>, dir: &Path, fsync: Fsync, snapshot_after: u64) -> io::Result<()> {
    recover_and_start(shared, dir, fsync, snapshot_after).map_err(|e| {
        match e.get_ref().is_some_and(|inner| inner.is::<RecoveryError>()) {
            true => e,
            // The storage crate's message names the file and the offset.
            false => recovery_error(e.to_string()),
        }
    })
}

fn recover_and_start(shared: &Arc<Shared>, dir: &Path, fsync: Fsync, snapshot_after: u64) -> io::Result<()> {
    let started = Instant::now();
    let count = shared.shards.count();
    storage::remove_stale_temp_files(dir)?;
    crate::upgrade::upgrade(dir, count, shared.config.limits.reply_log_limits(count))?;
    let wal_dir = storage::wal::wal_dir(dir);
    if !wal_dir.is_dir() {
        fs::create_dir(&wal_dir)
            .and_then(|()| storage::sync_dir(dir))
            .map_err(|e| recovery_error(format!("cannot create {}: {e}", wal_dir.display())))?;
    }
    storage::remove_stale_temp_files(&wal_dir)?;
    let plan = storage::wal::plan_wal_recovery(&wal_dir, count as u32)?;
    for rejected in &plan.rejected_snapshots {
        warn!(
            "ignoring snapshot {}: {} (using an older one and more of the log)",
            rejected.path.display(),
            rejected.reason
        );
    }
    let now = Instant::now();
    // Snapshots load in parallel: one thread each, every one locking only its own shard.
    let plan = &plan;
    std::thread::scope(|scope| {
        let threads: Vec<_> = (0..count)
            .map(|index| scope.spawn(move || restore(shared, plan, index, now)))
            .collect();
        threads.into_iter().try_for_each(|t| {
            t.join()
                .unwrap_or_else(|_| Err(recovery_error("recovery panicked".into())))
        })
    })?;
    let replayed = replay(shared, &wal_dir, plan, now)?;
    let mut log = match plan.segments.last() {
        Some(last) => LogWriter::open(&last.path)?,
        None => LogWriter::create(&wal_dir, storage::wal::WAL_LOG, FIRST_SEGMENT_SEQ)?,
    };
    let mut highest_conn: ConnId = 0;
    let mut clients = Vec::new();
    let mut objects = 0;
    let replayed_bytes = log.position().offset;
    for index in 0..count {
        let restarted = shared.shards.with(index, |s| {
            let partition = &mut s.partition;
            // The old server's connections are gone: their parked calls go, durably,
            // before anything new is applied.
            partition.restart(now);
            highest_conn = highest_conn.max(partition.highest_logged_conn());
            clients.append(&mut partition.logged_clients());
            objects += partition.persistent_len();
            match partition.take_log() {
                Some(records) => log
                    .append_prefixed(&storage::wal::tag(index as u32), &records)
                    .map(drop),
                None => Ok(()),
            }
        });
        restarted.map_err(io::Error::other)??;
    }
    log.sync()?;
    // Marks count the log from where replay began (the snapshots' distances need that).
    let written = replayed.bytes + (log.position().offset - replayed_bytes);
    shared.registry.start_after(highest_conn);
    let classes = crate::hosts::register_recovered_classes(shared).map_err(io::Error::other)?;
    let wal = Arc::new(Wal::new(wal_dir, log, written, fsync)?);
    if plan.rejected_snapshots.is_empty() {
        // A crash between publishing a snapshot and pruning left one too many.
        for index in 0..count {
            storage::prune_snapshots(&wal.dir, index as u32, SNAPSHOTS_KEPT)?;
        }
        wal.compact(count)?;
    }
    start_syncer(shared, &wal, fsync)?;
    for (index, snapshot_mark) in replayed.partition_starts.into_iter().enumerate() {
        let journal = Journal {
            index,
            shared: Arc::downgrade(shared),
            wal: wal.clone(),
            fsync,
            stopped: false,
            last_mark: written,
            snapshot_after,
            snapshot_mark,
            snapshotting: Arc::new(AtomicBool::new(false)),
        };
        shared
            .shards
            .with(index, move |s| {
                // A long tail replayed: snapshot it now (no call waits yet: no replies).
                let _ = s.log.insert(journal).maybe_snapshot(&mut s.partition, written);
            })
            .map_err(io::Error::other)?;
    }
    // After the journals are in place: a session that ends at once logs its end.
    (shared.adopt_sessions)(shared, clients);
    info!(
        data_dir = %dir.display(),
        records = replayed.records,
        snapshots = plan.snapshots.iter().flatten().count(),
        persistent_objects = objects,
        classes,
        fsync = ?fsync,
        "recovered in {:.1} ms",
        started.elapsed().as_secs_f64() * 1e3
    );
    Ok(())
}

/// Load partition `index`'s snapshot of `plan`, if it has one.
fn restore(shared: &Shared, plan: &storage::wal::WalPlan, index: usize, now: Instant) -> io::Result<()> {
    let snapshot = plan.snapshots[index].as_ref();
    let mut body = snapshot.map(|s| storage::SnapshotReader::open(&s.path)).transpose()?;
    let restored = shared
        .shards
        .with(index, |s| {
            s.partition.enable_storage();
            match (&mut body, snapshot) {
                (Some(body), Some(snapshot)) => s.partition.restore_snapshot(body, now).map_err(|why| {
                    format!(
                        "partition {index}: snapshot {} does not restore: {why}",
                        snapshot.path.display()
                    )
                }),
                _ => Ok(()),
            }
        })
        .map_err(|e| recovery_error(format!("partition {index}: {e}")))?;
    restored.map_err(recovery_error)
}

/// What replaying the write-ahead log found.
struct Replayed {
    /// Records replayed (those after their partition's snapshot).
    records: u64,
    /// Bytes of log read.
    bytes: u64,
    /// For each partition, the bytes read before its records start (its snapshot's position).
    partition_starts: Vec<u64>,
}

/// Replay the log of `plan` in one pass, each record through its partition's pure
/// `replay` (those its snapshot holds are skipped), and cut a torn tail.
fn replay(shared: &Shared, wal_dir: &Path, plan: &storage::wal::WalPlan, now: Instant) -> io::Result<Replayed> {
    let count = shared.shards.count();
    let starts: Vec<LogPosition> = (0..count as u32).map(|p| plan.start_of(p)).collect();
    let mut out = Replayed {
        records: 0,
        bytes: 0,
        partition_starts: vec![0; count],
    };
    let outcome = storage::replay_segments(plan.start(), &plan.segments, |end, payload| {
        let len = storage::log::RECORD_HEADER_LEN + payload.len() as u64;
        out.bytes += len;
        for (start, before) in starts.iter().zip(&mut out.partition_starts) {
            if end <= *start {
                *before += len;
            }
        }
        let at = end.offset - len;
        let path = || storage::segment_path(wal_dir, storage::wal::WAL_LOG, end.seq);
        let (index, record) = match storage::wal::untag(payload) {
            Some((storage::wal::GROUP, group)) => {
                let parts = storage::wal::decode_group(group).ok_or_else(|| {
                    recovery_error(format!(
                        "write-ahead log {} holds a malformed group record at byte offset {at}",
                        path().display()
                    ))
                })?;
                for (index, records) in parts {
                    let index = index as usize;
                    if index >= count {
                        return Err(recovery_error(format!(
                            "write-ahead log {} holds a group record at byte offset {at} with a part of partition \
                             {index}, but the data directory has {count} partitions",
                            path().display()
                        )));
                    }
                    if end <= starts[index] {
                        continue; // In the partition's snapshot.
                    }
                    for record in records {
                        out.records += 1;
                        let replayed = shared.shards.with(index, |s| s.partition.replay(record, now));
                        replayed.map_err(io::Error::other)?.map_err(|why| {
                            recovery_error(format!(
                                "write-ahead log {} holds an unreadable record of partition {index} in the group \
                                 record at byte offset {at}: {why}",
                                path().display()
                            ))
                        })?;
                    }
                }
                return Ok(());
            }
            Some((index, record)) if (index as usize) < count => (index as usize, record),
            tagged => {
                return Err(recovery_error(format!(
                    "write-ahead log {} holds a record at byte offset {at} of partition {}, but the data directory has \
                     {count} partitions",
                    path().display(),
                    tagged.map_or("(none: too short)".into(), |(p, _)| p.to_string())
                )))
            }
        };
        if end <= starts[index] {
            return Ok(()); // In the partition's snapshot.
        }
        out.records += 1;
        let replayed = shared.shards.with(index, |s| s.partition.replay(record, now));
        replayed.map_err(io::Error::other)?.map_err(|why| {
            recovery_error(format!(
                "write-ahead log {} holds an unreadable record of partition {index} at byte offset {at}: {why}",
                path().display()
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
    Ok(out)
}

/// Capture partition `index`'s snapshot a chunk at a time, write it as the snapshot at
/// `position`, and delete the log no partition needs any more.
fn write_snapshot(
    shared: &Shared,
    index: usize,
    wal: &Wal,
    position: LogPosition,
    header: &[u8],
) -> io::Result<storage::SnapshotInfo> {
    let mut file = storage::begin_snapshot(&wal.dir, index as u32, position)?;
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
    storage::prune_snapshots(&wal.dir, index as u32, SNAPSHOTS_KEPT)?;
    wal.compact(shared.shards.count())?;
    Ok(info)
}

#[cfg(test)]
mod tests {
    use super::*;
    use spindle_core::{ErrorKind, Token, Value};

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
    fn a_full_disk_fails_the_waiting_calls_and_every_later_write() {
        let dir = std::env::temp_dir().join(format!("spindle-journal-test-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir).unwrap();
        let log = LogWriter::create_with(&dir, 0, FIRST_SEGMENT_SEQ, |file| SmallDisk { file, room: 400 }).unwrap();
        let wal = Arc::new(Wal::without_syncer(dir.clone(), log, 0));
        let journal = |index| Journal {
            index,
            shared: Weak::new(),
            wal: wal.clone(),
            fsync: Fsync::Never,
            stopped: false,
            last_mark: 0,
            snapshot_after: 0,
            snapshot_mark: 0,
            snapshotting: Arc::new(AtomicBool::new(false)),
        };
        let (mut j, mut other) = (journal(0), journal(1));
        let mut p = Partition::new();
        p.enable_storage();
        let mut q = Partition::new();
        q.enable_storage();
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
        // The log is shared: the other partition's writes are refused too, its reads are not.
        let out = other.submit(&mut q, records(1), reply(7));
        let e = out[0].reply.clone().unwrap_err();
        assert!(e.message.contains("No space left on device"), "{e}");
        assert_eq!(other.submit(&mut q, records(0), reply(8)), reply(8));
        // What was acknowledged is intact on disk.
        let mut scan = storage::SegmentScanner::open(&storage::segment_path(&dir, 0, FIRST_SEGMENT_SEQ)).unwrap();
        let mut found = 0;
        while scan.next_record().unwrap().is_some() {
            found += 1;
        }
        assert_eq!(found, 2);
        let _ = fs::remove_dir_all(&dir);
    }
}
