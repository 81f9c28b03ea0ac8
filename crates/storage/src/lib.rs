//! Spindle's durable storage: op-log segments, snapshots, recovery and repair.
//!
//! This crate knows nothing about objects: it stores opaque byte records. The server
//! encodes each state-changing call as one record, appends a whole group of them with
//! one write ([`LogWriter::append_batch`]), makes them durable with one `fsync`
//! ([`LogWriter::sync`]), and only then sends the replies (group commit).
//!
//! # On-disk layout
//!
//! A server keeps one write-ahead log shared by its partitions, with per-partition
//! snapshots, under `<dir>/wal/` (see [`wal`]). Data directories of earlier releases hold
//! one log per partition, read once at start (an upgrade):
//!
//! ```text
//! <dir>/log-<partition>-<seq:020>.spl                  op-log segment number <seq>
//! <dir>/snap-<partition>-<seq:020>-<offset:020>.sps    snapshot covering the log up to (seq, offset)
//! <dir>/*.tmp                                          unfinished files: never read, removed by pruning
//! <dir>/*.corrupt, *.corrupt.N                         originals kept aside by `repair`
//! ```
//!
//! The log is a sequence of segments numbered from [`FIRST_SEGMENT_SEQ`] upward with no
//! gaps. A [`LogPosition`] `(seq, offset)` names a point in it: the byte `offset` inside
//! segment `seq`, always at a record boundary. A snapshot at position `p` contains the
//! effect of exactly the records before `p`. See [`log`] and [`snapshot`] for the byte
//! formats and [`recovery`] for how recovery and compaction fit together.
//!
//! # Example: group commit, snapshot, compaction, recovery
//!
//! ```
//! use spindle_storage::*;
//! # fn main() -> std::io::Result<()> {
//! # let dir = std::env::temp_dir().join(format!("spindle-storage-doc-{}", std::process::id()));
//! # std::fs::create_dir_all(&dir)?;
//! let mut log = LogWriter::create(&dir, 0, FIRST_SEGMENT_SEQ)?;
//! // Group commit: one write and one fsync for the whole batch, then the replies.
//! log.append_batch([b"incr a".as_slice(), b"incr b".as_slice()])?;
//! log.sync()?;
//!
//! // Snapshot: rotate, capture the state as of `pos`, write it, prune, compact.
//! let pos = log.rotate()?;
//! write_snapshot(&dir, 0, pos, b"state after two calls")?;
//! if let Some(floor) = prune_snapshots(&dir, 0, 2)? {
//!     delete_segments_before(&dir, 0, floor.seq)?;
//! }
//! log.append(b"incr a")?;
//! log.sync()?;
//! drop(log);
//!
//! // Recovery: snapshot, then the records after it.
//! remove_stale_temp_files(&dir)?;
//! let plan = plan_recovery(&dir, 0)?;
//! let body = read_snapshot(&plan.snapshot.as_ref().unwrap().path)?.1;
//! assert_eq!(body, b"state after two calls");
//! let mut tail = Vec::new();
//! let outcome = replay(&plan, |_pos, record| {
//!     tail.push(record.to_vec());
//!     Ok(())
//! })?;
//! assert_eq!(tail, [b"incr a".to_vec()]);
//! if let Some(torn) = &outcome.torn {
//!     eprintln!("truncating torn tail of {} at {}", torn.path.display(), torn.offset);
//!     truncate_torn_tail(&torn.path, torn.offset)?;
//! }
//! let log = LogWriter::create(&dir, 0, outcome.end.seq + 1)?;
//! # drop(log);
//! # std::fs::remove_dir_all(&dir)?;
//! # Ok(())
//! # }
//! ```
//!
//! # Errors
//!
//! Everything returns [`std::io::Error`]; nothing panics on bad input or a failing
//! disk. Errors carry the file and the operation in their message and keep the original
//! [`std::io::ErrorKind`] (so disk-full stays recognisable). Corruption is an
//! [`std::io::ErrorKind::InvalidData`] error whose inner value is a [`Corruption`].

pub mod log;
pub mod recovery;
pub mod repair;
pub mod snapshot;
pub mod wal;

#[cfg(test)]
pub(crate) mod testutil;

use std::fmt;
use std::fs::File;
use std::io;
use std::path::{Path, PathBuf};

pub use log::{
    delete_segments_before, list_segments, parse_segment_name, segment_path, truncate_torn_tail, LogFile, LogWriter,
    ScanEnd, SegmentHeader, SegmentInfo, SegmentScanner, TornTail, FIRST_SEGMENT_SEQ, MAX_RECORD_LEN, PREALLOCATE,
    SEGMENT_HEADER_LEN,
};
pub use recovery::{plan_recovery, replay, replay_segments, RecoveryPlan, ReplayOutcome, ReplaySegment};
pub use repair::{repair, repair_dir, DroppedRange, RepairReport};
pub use snapshot::{
    begin_snapshot, latest_valid_snapshot, list_snapshots, load_latest_snapshot, prune_snapshots, read_snapshot,
    remove_stale_temp_files, snapshot_path, verify_snapshot, write_snapshot, RejectedSnapshot, SnapshotInfo,
    SnapshotReader, SnapshotWriter,
};

/// A point in a partition's log: byte `offset` inside segment `seq`, at a record boundary.
///
/// Ordered by segment first, then offset, which is the order records were written in.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct LogPosition {
    pub seq: u64,
    pub offset: u64,
}

impl LogPosition {
    /// The position of the first record of segment `seq` (just after its header).
    pub fn segment_start(seq: u64) -> Self {
        LogPosition {
            seq,
            offset: SEGMENT_HEADER_LEN,
        }
    }
}

impl fmt::Display for LogPosition {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "segment {} offset {}", self.seq, self.offset)
    }
}

/// Damage found in the middle of a log segment (or in a header): the data cannot be
/// trusted and recovery must stop rather than silently skip acknowledged records.
///
/// Carried inside an [`io::ErrorKind::InvalidData`] error; get it back with
/// [`Corruption::from_io`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Corruption {
    /// The damaged file.
    pub path: PathBuf,
    /// Byte offset of the first bad byte range (a record start, or 0 for a bad header).
    pub offset: u64,
    /// Offset of the next intact record after the damage, if one was found.
    pub next_valid: Option<u64>,
    /// What was wrong at `offset`.
    pub reason: String,
}

impl Corruption {
    /// The [`Corruption`] inside `err`, if `err` reports one.
    pub fn from_io(err: &io::Error) -> Option<&Corruption> {
        err.get_ref()?.downcast_ref::<Corruption>()
    }

    pub(crate) fn into_io(self) -> io::Error {
        io::Error::new(io::ErrorKind::InvalidData, self)
    }
}

impl fmt::Display for Corruption {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "corrupt op log {} at byte offset {}: {}",
            self.path.display(),
            self.offset,
            self.reason
        )?;
        if let Some(next) = self.next_valid {
            write!(f, " (an intact record follows at byte offset {next})")?;
        }
        write!(
            f,
            "; refusing to continue, run `spindle repair` to keep every intact record"
        )
    }
}

impl std::error::Error for Corruption {}

/// An I/O error with the operation and file it happened on; keeps the original as source.
#[derive(Debug)]
struct Context {
    msg: String,
    source: io::Error,
}

impl fmt::Display for Context {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.msg, self.source)
    }
}

impl std::error::Error for Context {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&self.source)
    }
}

/// Wraps `err` with "`op` `path`" while keeping its kind (ENOSPC stays `StorageFull`).
pub(crate) fn ctx(err: io::Error, op: &str, path: &Path) -> io::Error {
    io::Error::new(
        err.kind(),
        Context {
            msg: format!("{op} {}", path.display()),
            source: err,
        },
    )
}

/// Extension to attach context to `io::Result`s in one call.
pub(crate) trait ResultExt<T> {
    fn ctx(self, op: &str, path: &Path) -> io::Result<T>;
}

impl<T> ResultExt<T> for io::Result<T> {
    fn ctx(self, op: &str, path: &Path) -> io::Result<T> {
        self.map_err(|e| ctx(e, op, path))
    }
}

/// An exclusive claim on a data directory, held as long as this value lives: two processes
/// writing one directory's logs at the same offsets would silently destroy each other's
/// records.
#[derive(Debug)]
pub struct DirLock {
    _file: std::fs::File,
}

/// Claim `dir` (through `<dir>/LOCK`, an advisory `flock`); an error names the directory when
/// another process holds it.
pub fn lock_dir(dir: &Path) -> io::Result<DirLock> {
    std::fs::create_dir_all(dir)?;
    let path = dir.join("LOCK");
    let file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)
        .map_err(|e| io::Error::new(e.kind(), format!("cannot open {}: {e}", path.display())))?;
    match file.try_lock() {
        Ok(()) => Ok(DirLock { _file: file }),
        Err(std::fs::TryLockError::WouldBlock) => Err(io::Error::new(
            io::ErrorKind::WouldBlock,
            format!(
                "the data directory {} is in use by another process (a running spindle server, or spindle repair)",
                dir.display()
            ),
        )),
        Err(std::fs::TryLockError::Error(e)) => {
            Err(io::Error::new(e.kind(), format!("cannot lock {}: {e}", path.display())))
        }
    }
}

/// Makes renames, creations and deletions inside `dir` durable: on Linux a new directory
/// entry is only crash-safe once the directory itself has been fsynced.
pub fn sync_dir(dir: &Path) -> io::Result<()> {
    File::open(dir)
        .and_then(|d| d.sync_all())
        .ctx("fsyncing directory", dir)
}

/// `path`'s directory ("." for a bare file name).
pub(crate) fn parent_dir(path: &Path) -> &Path {
    match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    }
}
