//! The write-ahead log: one log per server, shared by its partitions.
//!
//! # Layout
//!
//! ```text
//! <dir>/wal/log-0-<seq:020>.spl                  segment <seq> of the log (log number 0)
//! <dir>/wal/snap-<partition>-<seq:020>-<offset:020>.sps
//!                                                a partition's snapshot, covering its records
//!                                                before WAL position (seq, offset)
//! ```
//!
//! Segments and snapshots have the formats of [`crate::log`] and [`crate::snapshot`]; the
//! segments' partition number is [`WAL_LOG`]. Each record's payload is the partition's
//! record behind a tag naming the partition:
//!
//! ```text
//! [partition: u32 LE][the partition's record]
//! ```
//!
//! Records of one partition are in that partition's order; partitions interleave. A
//! partition recovers from its newest valid snapshot, then its records after the
//! snapshot's position. Replay is one pass over the log from the oldest position any
//! partition needs ([`plan_wal_recovery`]); segments are deleted only behind the oldest
//! snapshot kept by any partition ([`compaction_floor`]), and not at all while a partition
//! has none (it needs the log from its start).

use std::io;
use std::path::{Path, PathBuf};

use crate::log::{list_segments, FIRST_SEGMENT_SEQ};
use crate::recovery::ReplaySegment;
use crate::snapshot::{latest_valid_snapshot, list_snapshots, RejectedSnapshot, SnapshotInfo};
use crate::LogPosition;

/// The write-ahead log's directory inside a data directory.
pub const WAL_DIR: &str = "wal";
/// The partition number in the write-ahead log's segment names and headers.
pub const WAL_LOG: u32 = 0;
/// Bytes of the partition tag before each record.
pub const TAG_LEN: usize = 4;

/// `<dir>/wal`.
pub fn wal_dir(dir: &Path) -> PathBuf {
    dir.join(WAL_DIR)
}

/// The tag that heads partition `partition`'s records (for [`crate::LogWriter::append_prefixed`]).
pub fn tag(partition: u32) -> [u8; TAG_LEN] {
    partition.to_le_bytes()
}

/// `(partition, record)` of a write-ahead log payload; `None` if it is too short to hold a tag.
pub fn untag(payload: &[u8]) -> Option<(u32, &[u8])> {
    let (tag, record) = payload.split_at_checked(TAG_LEN)?;
    Some((u32::from_le_bytes(tag.try_into().ok()?), record))
}

/// The tag of a group record: records of several partitions that must be replayed all or
/// none (a transaction's commit over several partitions), in one checksummed payload.
pub const GROUP: u32 = u32::MAX;

/// The payload of a group record: each partition with its records, as
/// `count, (partition, records, (len, bytes)*)*` in little-endian `u32`s.
pub fn encode_group(parts: &[(u32, Vec<Vec<u8>>)]) -> Vec<u8> {
    let len: usize = parts.iter().flat_map(|(_, rs)| rs).map(|r| r.len() + 4).sum();
    let mut out = Vec::with_capacity(4 + parts.len() * 8 + len);
    out.extend_from_slice(&(parts.len() as u32).to_le_bytes());
    for (partition, records) in parts {
        out.extend_from_slice(&partition.to_le_bytes());
        out.extend_from_slice(&(records.len() as u32).to_le_bytes());
        for record in records {
            out.extend_from_slice(&(record.len() as u32).to_le_bytes());
            out.extend_from_slice(record);
        }
    }
    out
}

/// One partition's records in a group record.
pub type GroupPart<'a> = (u32, Vec<&'a [u8]>);

/// The parts of a group record's payload; `None` if it is malformed.
pub fn decode_group(mut payload: &[u8]) -> Option<Vec<GroupPart<'_>>> {
    fn u32_of(bytes: &mut &[u8]) -> Option<u32> {
        let (n, rest) = bytes.split_at_checked(4)?;
        *bytes = rest;
        Some(u32::from_le_bytes(n.try_into().ok()?))
    }
    let count = u32_of(&mut payload)?;
    let mut parts = Vec::new();
    for _ in 0..count {
        let partition = u32_of(&mut payload)?;
        let n = u32_of(&mut payload)?;
        let mut records = Vec::new();
        for _ in 0..n {
            let len = u32_of(&mut payload)? as usize;
            let (record, rest) = payload.split_at_checked(len)?;
            records.push(record);
            payload = rest;
        }
        parts.push((partition, records));
    }
    payload.is_empty().then_some(parts)
}

/// What recovery of every partition from the write-ahead log will read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WalPlan {
    /// Each partition's snapshot to load first (already verified), if any.
    pub snapshots: Vec<Option<SnapshotInfo>>,
    /// Newer snapshots that failed verification; log each.
    pub rejected_snapshots: Vec<RejectedSnapshot>,
    /// Segments to replay, in order, without gaps, from [`WalPlan::start`].
    pub segments: Vec<ReplaySegment>,
}

impl WalPlan {
    /// Where partition `partition`'s records start: its snapshot's position, or the log's start.
    pub fn start_of(&self, partition: u32) -> LogPosition {
        self.snapshots
            .get(partition as usize)
            .and_then(Option::as_ref)
            .map_or(LogPosition::segment_start(FIRST_SEGMENT_SEQ), |s| s.position)
    }

    /// Where replay starts: the oldest position a partition needs.
    pub fn start(&self) -> LogPosition {
        (0..self.snapshots.len() as u32)
            .map(|p| self.start_of(p))
            .min()
            .unwrap_or(LogPosition::segment_start(FIRST_SEGMENT_SEQ))
    }
}

/// Finds each of `partitions`' newest valid snapshot in `wal` (a [`wal_dir`]) and the
/// segments to replay after the oldest of their positions.
///
/// Fails (`InvalidData`) if a needed segment is missing: the log must run without gaps
/// from the oldest position needed to the newest segment.
pub fn plan_wal_recovery(wal: &Path, partitions: u32) -> io::Result<WalPlan> {
    let mut plan = WalPlan {
        snapshots: Vec::new(),
        rejected_snapshots: Vec::new(),
        segments: Vec::new(),
    };
    for p in 0..partitions {
        // A partition without a valid snapshot needs the log from its first segment.
        let (snapshot, mut rejected) = latest_valid_snapshot(wal, p)?;
        plan.rejected_snapshots.append(&mut rejected);
        plan.snapshots.push(snapshot);
    }
    let start = plan.start();
    let segments: Vec<_> = list_segments(wal, WAL_LOG)?
        .into_iter()
        .filter(|s| s.seq >= start.seq)
        .collect();
    if segments.is_empty() {
        return match plan.snapshots.iter().all(Option::is_none) && plan.rejected_snapshots.is_empty() {
            true => Ok(plan), // A log that was never written.
            false => Err(missing(wal, needing(&plan, start), start.seq, &plan.rejected_snapshots)),
        };
    }
    for (seg, expected) in segments.into_iter().zip(start.seq..) {
        if seg.seq != expected {
            return Err(missing(wal, needing(&plan, start), expected, &plan.rejected_snapshots));
        }
        let start_offset = match seg.seq == start.seq {
            true => start.offset,
            false => crate::SEGMENT_HEADER_LEN,
        };
        plan.segments.push(ReplaySegment {
            seq: seg.seq,
            path: seg.path,
            start_offset,
        });
    }
    Ok(plan)
}

/// The partition whose start is `start` (the one that needs the log from there).
fn needing(plan: &WalPlan, start: LogPosition) -> u32 {
    (0..plan.snapshots.len() as u32)
        .find(|p| plan.start_of(*p) == start)
        .unwrap_or(0)
}

fn missing(wal: &Path, partition: u32, seq: u64, rejected: &[RejectedSnapshot]) -> io::Error {
    let mut msg = format!(
        "cannot recover partition {partition} in {}: write-ahead log segment {} is missing",
        wal.display(),
        crate::segment_path(wal, WAL_LOG, seq).display()
    );
    for r in rejected {
        msg.push_str(&format!("; rejected snapshot {}: {}", r.path.display(), r.reason));
    }
    io::Error::new(io::ErrorKind::InvalidData, msg)
}

/// The segment below which no partition needs the log: the oldest position among the
/// oldest snapshot kept by each of `partitions`. `None` while a partition has no snapshot.
pub fn compaction_floor(wal: &Path, partitions: u32) -> io::Result<Option<u64>> {
    let mut floor: Option<u64> = None;
    for p in 0..partitions {
        let Some((oldest, _)) = list_snapshots(wal, p)?.into_iter().next() else {
            return Ok(None);
        };
        floor = Some(floor.map_or(oldest.seq, |f| f.min(oldest.seq)));
    }
    Ok(floor)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::TempDir;
    use crate::{delete_segments_before, replay_segments, write_snapshot, LogWriter};

    fn partition_records(plan: &WalPlan, partitions: u32) -> Vec<Vec<Vec<u8>>> {
        let mut out = vec![Vec::new(); partitions as usize];
        replay_segments(plan.start(), &plan.segments, |pos, payload| {
            let (p, record) = untag(payload).unwrap();
            if pos > plan.start_of(p) {
                out[p as usize].push(record.to_vec());
            }
            Ok(())
        })
        .unwrap();
        out
    }

    #[test]
    fn partitions_interleave_and_each_replays_after_its_own_snapshot() {
        let dir = TempDir::new();
        let wal = dir.path();
        let mut log = LogWriter::create(wal, WAL_LOG, FIRST_SEGMENT_SEQ).unwrap();
        log.append_prefixed(&tag(0), [b"a1"]).unwrap();
        log.append_prefixed(&tag(1), [b"b1", b"b2"]).unwrap();
        // Partition 0 snapshots here (the log moves to a new segment), partition 1 later.
        let p0 = log.rotate().unwrap();
        write_snapshot(wal, 0, p0, b"a1").unwrap();
        log.append_prefixed(&tag(1), [b"b3"]).unwrap();
        log.append_prefixed(&tag(0), [b"a2"]).unwrap();
        log.sync().unwrap();
        let plan = plan_wal_recovery(wal, 2).unwrap();
        assert_eq!(
            plan.start(),
            LogPosition::segment_start(FIRST_SEGMENT_SEQ),
            "partition 1 needs all"
        );
        let got = partition_records(&plan, 2);
        assert_eq!(got[0], [b"a2".to_vec()]);
        assert_eq!(got[1], [b"b1".to_vec(), b"b2".to_vec(), b"b3".to_vec()]);
        // No segment goes while partition 1 has no snapshot.
        assert_eq!(compaction_floor(wal, 2).unwrap(), None);

        let p1 = log.rotate().unwrap();
        write_snapshot(wal, 1, p1, b"b1 b2 b3").unwrap();
        log.append_prefixed(&tag(1), [b"b4"]).unwrap();
        log.sync().unwrap();
        // Partition 0's snapshot is the oldest: segments before its segment may go, not after.
        let floor = compaction_floor(wal, 2).unwrap().unwrap();
        assert_eq!(floor, p0.seq);
        delete_segments_before(wal, WAL_LOG, floor).unwrap();
        let plan = plan_wal_recovery(wal, 2).unwrap();
        let got = partition_records(&plan, 2);
        assert_eq!(got[0], [b"a2".to_vec()]);
        assert_eq!(got[1], [b"b4".to_vec()]);
    }

    #[test]
    fn a_missing_segment_needed_by_a_partition_fails_recovery() {
        let dir = TempDir::new();
        let wal = dir.path();
        let mut log = LogWriter::create(wal, WAL_LOG, FIRST_SEGMENT_SEQ).unwrap();
        log.append_prefixed(&tag(1), [b"b1"]).unwrap();
        let p0 = log.rotate().unwrap();
        write_snapshot(wal, 0, p0, b"").unwrap();
        // Partition 1 has no snapshot: deleting the first segment loses its record.
        delete_segments_before(wal, WAL_LOG, p0.seq).unwrap();
        let err = plan_wal_recovery(wal, 2).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::InvalidData);
        assert!(err.to_string().contains("partition 1"), "{err}");
        assert!(err.to_string().contains("is missing"), "{err}");
    }

    #[test]
    fn groups_round_trip_and_malformed_ones_are_refused() {
        let parts = vec![(0, vec![b"a".to_vec(), vec![]]), (7, vec![vec![1; 300]])];
        let payload = encode_group(&parts);
        let decoded = decode_group(&payload).unwrap();
        let back: Vec<(u32, Vec<Vec<u8>>)> = decoded
            .into_iter()
            .map(|(p, rs)| (p, rs.into_iter().map(<[u8]>::to_vec).collect()))
            .collect();
        assert_eq!(back, parts);
        assert!(decode_group(&payload[..payload.len() - 1]).is_none());
        let mut longer = payload.clone();
        longer.push(0);
        assert!(decode_group(&longer).is_none());
        assert!(decode_group(&[]).is_none());
        assert_eq!(decode_group(&encode_group(&[])).unwrap().len(), 0);
    }

    #[test]
    fn tags_round_trip_and_a_short_payload_has_none() {
        let mut payload = tag(7).to_vec();
        payload.extend_from_slice(b"record");
        assert_eq!(untag(&payload), Some((7, &b"record"[..])));
        assert_eq!(untag(b"abc"), None);
    }
}
