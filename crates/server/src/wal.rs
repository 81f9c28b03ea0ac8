//! The server's write-ahead log, shared by its partitions, and its [`Syncer`] thread.
//!
//! Calls write their partition's records under their shard lock, then take the log's lock
//! for the write alone (never the reverse order), so one partition's records stay in its
//! order and the lock is held for one `write`. One syncer `fsync`s the log for all of them
//! (group commit across partitions: each `fsync` covers every record written before it, by
//! any partition) and sends every reply it covered.

use std::collections::VecDeque;
use std::fs;
use std::io;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, OnceLock, PoisonError};

use spindle_core::{Delivery, Error, ErrorKind};
use spindle_storage::{self as storage, wal, LogFile, LogPosition, LogWriter};

use crate::config::Fsync;

/// The write-ahead log: the segment being written and how much was written.
pub(crate) struct Wal<F: LogFile = fs::File> {
    state: Mutex<WalState<F>>,
    /// `None` with `--fsync never`.
    pub(crate) syncer: Option<Arc<Syncer>>,
    /// Why the log failed: every later record is refused (what is on disk is unknown).
    failure: OnceLock<String>,
    /// `<data dir>/wal`.
    pub(crate) dir: PathBuf,
    /// Held while segments are deleted (partitions' snapshots finish on threads of their own).
    compaction: Mutex<()>,
}

struct WalState<F: LogFile> {
    log: LogWriter<F>,
    /// Bytes written since the server started, counting the log replayed at start (the
    /// marks the syncer releases replies at, and snapshots' distances).
    written: u64,
}

impl Wal {
    /// The log continuing `log`, `written` bytes into it (see [`WalState::written`]).
    pub(crate) fn new(dir: PathBuf, log: LogWriter, written: u64, fsync: Fsync) -> io::Result<Self> {
        let syncer = match fsync {
            Fsync::Never => None,
            _ => Some(Arc::new(Syncer::new(log.sync_handle()?, written))),
        };
        Ok(Wal {
            syncer,
            ..Wal::without_syncer(dir, log, written)
        })
    }

    /// Move the log to a new segment (the moment of a partition's snapshot): everything
    /// before is synced; returns the new segment's start, which the snapshot covers, and
    /// the mark there.
    pub(crate) fn rotate(&self) -> io::Result<(LogPosition, u64)> {
        let mut state = self.lock();
        let position = state.log.rotate()?;
        if let Some(syncer) = &self.syncer {
            syncer.switch_file(state.log.sync_handle()?);
        }
        Ok((position, state.written))
    }

    /// Delete the segments no partition needs any more (see [`wal::compaction_floor`]).
    pub(crate) fn compact(&self, partitions: usize) -> io::Result<()> {
        let _only_one = self.compaction.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(floor) = wal::compaction_floor(&self.dir, partitions as u32)? {
            storage::delete_segments_before(&self.dir, wal::WAL_LOG, floor)?;
        }
        Ok(())
    }
}

impl<F: LogFile> Wal<F> {
    /// A log whose writes are never `fsync`ed here (`--fsync never`, and tests).
    pub(crate) fn without_syncer(dir: PathBuf, log: LogWriter<F>, written: u64) -> Self {
        Wal {
            state: Mutex::new(WalState { log, written }),
            syncer: None,
            failure: OnceLock::new(),
            dir,
            compaction: Mutex::new(()),
        }
    }

    fn lock(&self) -> MutexGuard<'_, WalState<F>> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Why the log failed, if it did (a write here, or an `fsync` on the syncer).
    pub(crate) fn failure(&self) -> Option<String> {
        self.failure
            .get()
            .cloned()
            .or_else(|| self.syncer.as_ref().and_then(|s| s.failure()))
    }

    /// Stop the log: nothing is written after `why`.
    pub(crate) fn fail(&self, why: &str) {
        let _ = self.failure.set(why.to_string());
    }

    /// Write partition `partition`'s `records`; returns the mark after them (replies that
    /// depend on them wait for the syncer to reach it).
    pub(crate) fn append(&self, partition: usize, records: &[Vec<u8>]) -> io::Result<u64> {
        let mut state = self.lock();
        if let Some(why) = self.failure.get() {
            return Err(io::Error::other(why.clone()));
        }
        let before = state.log.position().offset;
        state.log.append_prefixed(&wal::tag(partition as u32), records)?;
        state.written += state.log.position().offset - before;
        if let Some(syncer) = &self.syncer {
            syncer.written.store(state.written, Ordering::Release);
        }
        Ok(state.written)
    }

    /// Write several partitions' records as one group record (replayed all or none);
    /// returns the mark after it.
    pub(crate) fn append_group(&self, parts: &[(u32, Vec<Vec<u8>>)]) -> io::Result<u64> {
        let payload = wal::encode_group(parts);
        let mut state = self.lock();
        if let Some(why) = self.failure.get() {
            return Err(io::Error::other(why.clone()));
        }
        let before = state.log.position().offset;
        state.log.append_prefixed(&wal::tag(wal::GROUP), &[payload])?;
        state.written += state.log.position().offset - before;
        if let Some(syncer) = &self.syncer {
            syncer.written.store(state.written, Ordering::Release);
        }
        Ok(state.written)
    }

    /// The mark after the last record written.
    pub(crate) fn written(&self) -> u64 {
        self.lock().written
    }
}

/// Makes the log durable in the background and sends the replies that wait for it
/// (group commit: one `fsync` covers every record written before it, by any partition).
pub(crate) struct Syncer {
    /// Bytes written to the log so far (the log's mark after its last write).
    written: AtomicU64,
    state: Mutex<SyncState>,
    wake: Condvar,
    /// The current segment (replaced when the log moves to a new one, after syncing the old).
    file: Mutex<Arc<fs::File>>,
}

#[derive(Default)]
struct SyncState {
    /// Replies waiting for the log to be durable up to their mark, lowest mark first.
    waiting: VecDeque<(u64, Vec<Delivery>)>,
    /// The highest mark known durable.
    synced: u64,
    failed: Option<String>,
    /// The syncer waits for replies (calls wake it only then: a wake-up is a system call).
    idle: bool,
}

impl Syncer {
    fn new(file: fs::File, written: u64) -> Self {
        Syncer {
            written: AtomicU64::new(written),
            state: Mutex::new(SyncState {
                synced: written,
                ..SyncState::default()
            }),
            wake: Condvar::new(),
            file: Mutex::new(Arc::new(file)),
        }
    }

    fn lock(&self) -> MutexGuard<'_, SyncState> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn failure(&self) -> Option<String> {
        self.lock().failed.clone()
    }

    /// Queue `deliveries` until the log is durable up to `mark`; returns them if it is already.
    pub(crate) fn after_sync(&self, mark: u64, deliveries: Vec<Delivery>) -> Vec<Delivery> {
        let mut state = self.lock();
        if let Some(why) = &state.failed {
            return storage_errors(why, deliveries);
        }
        if mark <= state.synced {
            return deliveries;
        }
        // Partitions queue after their write, outside the log's lock: keep the marks sorted.
        let at = state.waiting.partition_point(|(m, _)| *m <= mark);
        state.waiting.insert(at, (mark, deliveries));
        if state.idle {
            self.wake.notify_one();
        }
        Vec::new()
    }

    /// Fail from now on; returns the replies that were waiting, failed.
    pub(crate) fn fail_waiting(&self, why: &str) -> Vec<Delivery> {
        let mut state = self.lock();
        state.failed.get_or_insert_with(|| why.to_string());
        state
            .waiting
            .drain(..)
            .flat_map(|(_, d)| storage_errors(why, d))
            .collect()
    }

    fn switch_file(&self, file: fs::File) {
        *self.file.lock().unwrap_or_else(PoisonError::into_inner) = Arc::new(file);
    }

    /// `fsync` until the server exits: `always`, whenever replies wait (back to back under
    /// load, each covering what was written meanwhile); `interval`, every interval. Replies
    /// covered go to `deliver`. Returns why an `fsync` failed, the replies waiting failed:
    /// then the log is lost to every partition.
    pub(crate) fn run(&self, fsync: Fsync, deliver: &dyn Fn(Vec<Delivery>)) -> String {
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
            deliver(ready);
            if let Some(why) = failed {
                deliver(self.fail_waiting(&why));
                return why;
            }
        }
    }
}

/// `deliveries` answered with the `StorageError` of a failed log.
pub(crate) fn storage_errors(why: &str, deliveries: Vec<Delivery>) -> Vec<Delivery> {
    let err = Error::new(
        ErrorKind::StorageError,
        format!(
            "the write-ahead log could not be written ({why}): this call's change is not durable, \
             and persistent objects are read-only until the server restarts"
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

#[cfg(test)]
mod tests {
    use super::*;
    use spindle_core::{Token, Value};

    fn reply(req: u64) -> Vec<Delivery> {
        vec![Delivery {
            token: Token { conn: 1, req },
            reply: Ok(Value::from(req)),
        }]
    }

    #[test]
    fn a_failed_syncer_answers_later_calls_at_once_with_storage_errors() {
        let syncer = Syncer::new(fs::File::open("/dev/null").unwrap(), 0);
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
    fn replies_queued_out_of_order_by_two_partitions_wait_in_mark_order() {
        let syncer = Syncer::new(fs::File::open("/dev/null").unwrap(), 0);
        // Partition B wrote after A but queued first.
        assert!(syncer.after_sync(20, reply(2)).is_empty());
        assert!(syncer.after_sync(10, reply(1)).is_empty());
        let marks: Vec<u64> = syncer.lock().waiting.iter().map(|(m, _)| *m).collect();
        assert_eq!(marks, [10, 20]);
    }
}
