//! Recovery: newest valid snapshot, then the log after its position.
//!
//! # Protocol (what the server does)
//!
//! Writing, per partition: one [`crate::LogWriter`]; records are appended in batches and
//! a batch's replies go out only after [`crate::LogWriter::sync`]. To snapshot: call
//! [`crate::LogWriter::rotate`] (syncs, starts segment `seq + 1`, returns its start
//! position `P`); capture the state as of that moment (all records before `P` applied,
//! none after); write it in the background with [`crate::begin_snapshot`] at `P`; after
//! `finish` returns, [`crate::prune_snapshots`] with `keep = 2` and
//! [`crate::delete_segments_before`] the *oldest kept* snapshot's `seq`.
//!
//! Recovering, per partition: [`crate::remove_stale_temp_files`] once for the
//! directory, then [`plan_recovery`] (log each rejected snapshot), load the snapshot
//! body, [`replay`] the records through the same pure `apply` that serves live calls,
//! and if a torn tail is reported, log it and [`crate::truncate_torn_tail`]. Then start
//! a fresh segment `end.seq + 1` with [`crate::LogWriter::create`] (or reopen the last
//! one with [`crate::LogWriter::open`]). Corruption errors must stop the start with
//! their message, which names the file, the offset and `spindle repair`.
//!
//! A torn tail is only acceptable in the *last* segment: every earlier segment was
//! synced before the next one was created, so damage there is corruption.

use std::io;
use std::path::{Path, PathBuf};

use crate::log::{list_segments, ScanEnd, SegmentScanner, TornTail, FIRST_SEGMENT_SEQ};
use crate::snapshot::{latest_valid_snapshot, RejectedSnapshot, SnapshotInfo};
use crate::{Corruption, LogPosition};

/// One segment to replay, from `start_offset` to its end.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReplaySegment {
    pub seq: u64,
    pub path: PathBuf,
    pub start_offset: u64,
}

/// What recovery of one partition will read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RecoveryPlan {
    pub partition: u32,
    /// The snapshot to load first (already fully verified), if any.
    pub snapshot: Option<SnapshotInfo>,
    /// Newer snapshots that failed verification; log each.
    pub rejected_snapshots: Vec<RejectedSnapshot>,
    /// Segments to replay after the snapshot, in order, without gaps.
    pub segments: Vec<ReplaySegment>,
}

impl RecoveryPlan {
    /// Where replay starts: the snapshot's position, or the start of the log.
    pub fn start(&self) -> LogPosition {
        self.snapshot
            .as_ref()
            .map_or(LogPosition::segment_start(FIRST_SEGMENT_SEQ), |s| s.position)
    }
}

/// Finds the newest valid snapshot and the segments to replay after it.
///
/// Fails (`InvalidData`) if a needed segment is missing: the log must run without gaps
/// from the snapshot's segment (or from [`FIRST_SEGMENT_SEQ`] without a snapshot) to the
/// newest segment. Segments older than the start are compaction leftovers and ignored.
pub fn plan_recovery(dir: &Path, partition: u32) -> io::Result<RecoveryPlan> {
    let (snapshot, rejected_snapshots) = latest_valid_snapshot(dir, partition)?;
    let mut plan = RecoveryPlan {
        partition,
        snapshot,
        rejected_snapshots,
        segments: Vec::new(),
    };
    let start = plan.start();
    let segments: Vec<_> = list_segments(dir, partition)?
        .into_iter()
        .filter(|s| s.seq >= start.seq)
        .collect();
    if segments.is_empty() && plan.snapshot.is_none() {
        if plan.rejected_snapshots.is_empty() {
            return Ok(plan); // A partition that never wrote anything.
        }
        return Err(missing(dir, partition, start.seq, &plan));
    }
    for (seg, expected) in segments.into_iter().zip(start.seq..) {
        if seg.seq != expected {
            return Err(missing(dir, partition, expected, &plan));
        }
        let start_offset = if seg.seq == start.seq {
            start.offset
        } else {
            crate::SEGMENT_HEADER_LEN
        };
        plan.segments.push(ReplaySegment {
            seq: seg.seq,
            path: seg.path,
            start_offset,
        });
    }
    if plan.segments.is_empty() {
        return Err(missing(dir, partition, start.seq, &plan));
    }
    Ok(plan)
}

fn missing(dir: &Path, partition: u32, seq: u64, plan: &RecoveryPlan) -> io::Error {
    let from = match &plan.snapshot {
        Some(s) => format!("after snapshot {}", s.path.display()),
        None => "from the start of the log (no valid snapshot)".to_owned(),
    };
    let mut msg = format!(
        "cannot recover partition {partition} in {}: log segment {} is missing, needed {from}",
        dir.display(),
        crate::segment_path(dir, partition, seq).display()
    );
    for r in &plan.rejected_snapshots {
        msg.push_str(&format!("; rejected snapshot {}: {}", r.path.display(), r.reason));
    }
    io::Error::new(io::ErrorKind::InvalidData, msg)
}

/// The result of [`replay`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReplayOutcome {
    /// Records passed to the callback.
    pub records: u64,
    /// Position after the last intact record (where a torn tail starts, if any).
    pub end: LogPosition,
    /// A torn tail at the end of the last segment: log it, then truncate it.
    pub torn: Option<TornTail>,
}

/// Feeds every record of `plan` to `apply` in log order, with the position just after
/// the record (what a snapshot taken right after applying it would cover).
///
/// Reads only; it never changes a file, so it also serves dry runs. Stops at the first
/// error from `apply` or from the log (corruption, or a torn tail in a segment that is
/// not the last).
pub fn replay(
    plan: &RecoveryPlan,
    apply: impl FnMut(LogPosition, &[u8]) -> io::Result<()>,
) -> io::Result<ReplayOutcome> {
    replay_segments(plan.start(), &plan.segments, apply)
}

/// [`replay`] of `segments` (the first read from its `start_offset`), `start` being where
/// they begin: the write-ahead log's replay of every partition in one pass.
pub fn replay_segments(
    start: LogPosition,
    segments: &[ReplaySegment],
    mut apply: impl FnMut(LogPosition, &[u8]) -> io::Result<()>,
) -> io::Result<ReplayOutcome> {
    let mut out = ReplayOutcome {
        records: 0,
        end: start,
        torn: None,
    };
    for (i, seg) in segments.iter().enumerate() {
        let mut scan = SegmentScanner::open_at(&seg.path, seg.start_offset)?;
        while let Some((offset, payload)) = scan.next_record()? {
            let end = LogPosition {
                seq: seg.seq,
                offset: offset + crate::log::RECORD_HEADER_LEN + payload.len() as u64,
            };
            apply(end, payload)?;
            out.records += 1;
        }
        out.end = scan.position();
        if let Some(ScanEnd::Torn(t)) = scan.end() {
            if i + 1 != segments.len() {
                return Err(Corruption {
                    path: t.path.clone(),
                    offset: t.offset,
                    next_valid: None,
                    reason: format!("{}, in a segment that is followed by segment {}", t.reason, seg.seq + 1),
                }
                .into_io());
            }
            out.torn = Some(t.clone());
        }
    }
    Ok(out)
}
