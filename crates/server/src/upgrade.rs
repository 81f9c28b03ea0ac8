//! Data directories of earlier releases: one op log per partition, with its snapshots, in
//! the data directory itself (`log-<partition>-<seq>.spl`, `snap-<partition>-….sps`).
//!
//! Read once at start: each partition is recovered from its old log (newest valid snapshot,
//! then the log after it) and snapshotted into a new write-ahead log directory at its very
//! start, built aside (`wal.upgrade/`) and moved into place whole (`wal/`). Only then are
//! the old files deleted: a crash before the move leaves the old layout as it was (the
//! upgrade runs again), one after it leaves old files that the next start deletes.

use std::fs;
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::time::Instant;

use spindle_core::Partition;
use spindle_storage::{self as storage, LogPosition, FIRST_SEGMENT_SEQ};
use tracing::{info, warn};

/// An error that stops the upgrade (and the start), with its message.
fn upgrade_error(message: String) -> io::Error {
    io::Error::other(message)
}

/// Where the new layout is built before it moves to `wal/`.
const STAGING_DIR: &str = "wal.upgrade";

/// Move `dir` from per-partition logs to the write-ahead log, if it holds the old layout.
pub(crate) fn upgrade(dir: &Path, partitions: usize, reply_log: (usize, usize)) -> io::Result<()> {
    let old = old_files(dir)?;
    let wal = storage::wal::wal_dir(dir);
    if wal.is_dir() {
        // Moved into place by an upgrade that stopped before deleting the old files.
        return remove(dir, &old);
    }
    if old.is_empty() {
        return Ok(());
    }
    let started = Instant::now();
    info!(data_dir = %dir.display(), "the data directory has one op log per partition (an earlier release): moving it to one write-ahead log");
    let staging = dir.join(STAGING_DIR);
    if staging.exists() {
        fs::remove_dir_all(&staging).map_err(|e| upgrade_error(format!("cannot remove {}: {e}", staging.display())))?;
    }
    fs::create_dir(&staging).map_err(|e| upgrade_error(format!("cannot create {}: {e}", staging.display())))?;
    let mut objects = 0;
    for index in 0..partitions {
        let mut partition = Partition::new();
        partition.set_reply_log_limit(reply_log.0, reply_log.1);
        partition.enable_storage();
        recover(&mut partition, dir, index as u32)?;
        objects += partition.persistent_len();
        snapshot(&mut partition, &staging, index as u32)?;
    }
    // The log the snapshots stand at the start of.
    drop(storage::LogWriter::create(
        &staging,
        storage::wal::WAL_LOG,
        FIRST_SEGMENT_SEQ,
    )?);
    storage::sync_dir(&staging)?;
    fs::rename(&staging, &wal)
        .map_err(|e| upgrade_error(format!("cannot move {} to {}: {e}", staging.display(), wal.display())))?;
    storage::sync_dir(dir)?;
    remove(dir, &old)?;
    info!(
        data_dir = %dir.display(),
        persistent_objects = objects,
        "moved to one write-ahead log in {:.1} ms",
        started.elapsed().as_secs_f64() * 1e3
    );
    Ok(())
}

/// The old layout's segments and snapshots in `dir`.
fn old_files(dir: &Path) -> io::Result<Vec<PathBuf>> {
    let mut out = Vec::new();
    for entry in fs::read_dir(dir)? {
        let entry = entry?;
        let name = entry.file_name();
        let name = name.to_str().unwrap_or_default();
        if storage::parse_segment_name(name).is_some() || storage::snapshot::parse_snapshot_name(name).is_some() {
            out.push(entry.path());
        }
    }
    Ok(out)
}

fn remove(dir: &Path, files: &[PathBuf]) -> io::Result<()> {
    for file in files {
        fs::remove_file(file).map_err(|e| upgrade_error(format!("cannot delete {}: {e}", file.display())))?;
    }
    if !files.is_empty() {
        storage::sync_dir(dir)?;
    }
    Ok(())
}

/// Load partition `index`'s newest old snapshot and replay its old log after it (a torn
/// tail is left to the old files, which go).
fn recover(partition: &mut Partition, dir: &Path, index: u32) -> io::Result<()> {
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
            .map_err(|why| upgrade_error(format!("snapshot {} does not restore: {why}", snapshot.path.display())))?;
    }
    let outcome = storage::replay(&plan, |pos, record| {
        partition.replay(record, now).map_err(|why| {
            let path = storage::segment_path(dir, index, pos.seq);
            let at = pos
                .offset
                .saturating_sub(record.len() as u64 + storage::log::RECORD_HEADER_LEN);
            upgrade_error(format!(
                "op log {} holds an unreadable record at byte offset {at}: {why}",
                path.display()
            ))
        })
    })?;
    if let Some(torn) = &outcome.torn {
        warn!(
            "ignoring the torn tail of {} at byte offset {} ({} bytes of a write that never completed: {})",
            torn.path.display(),
            torn.offset,
            torn.len(),
            torn.reason
        );
    }
    Ok(())
}

/// Write `partition`'s snapshot into `wal` at the log's start (the new log is empty).
fn snapshot(partition: &mut Partition, wal: &Path, index: u32) -> io::Result<()> {
    let position = LogPosition::segment_start(FIRST_SEGMENT_SEQ);
    let mut file = storage::begin_snapshot(wal, index, position)?;
    file.write_all(&partition.begin_snapshot())?;
    loop {
        let (chunk, done) = partition
            .snapshot_chunk(usize::MAX)
            .ok_or_else(|| io::Error::other("the capture was aborted"))?;
        file.write_all(&chunk)?;
        if done {
            break;
        }
    }
    file.finish()?;
    Ok(())
}
