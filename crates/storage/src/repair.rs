//! Repair of a damaged segment: keep every intact record, drop only damaged bytes.
//!
//! Backs `spindle repair`. The walk is the reader's, except that instead of stopping at
//! a bad record it resynchronises: from the bad offset it searches byte by byte for the
//! next offset where a record with a correct checksum (and this segment's salt) starts,
//! drops the bytes in between, and goes on from there. A torn tail is dropped the same
//! way. The result is written to `<name>.repair.tmp`, fsynced, the original is hard-linked
//! to `<name>.corrupt` (or `<name>.corrupt.N` if that exists) and the repaired file is
//! renamed over `<name>`, then the directory is fsynced: at every moment `<name>` is
//! either the original or the repaired file, and the original bytes are never lost.
//!
//! Records keep their exact bytes (the header, and so the salt, is copied), so the
//! repaired segment validates under the normal reader. A segment whose header is
//! damaged cannot be repaired: without the salt no record can be checked.

use std::fs::{self, OpenOptions};
use std::io::{self, Write};
use std::path::{Path, PathBuf};

use crate::log::{
    check_frame, find_valid_record, is_preallocated, parse_segment_name, Frame, RECORD_HEADER_LEN, SEGMENT_HEADER_LEN,
};
use crate::{parent_dir, sync_dir, Corruption, ResultExt, SegmentHeader};

/// Bytes that `repair` dropped.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DroppedRange {
    /// Offset in the original file.
    pub offset: u64,
    pub len: u64,
    /// Why the record at `offset` was rejected.
    pub reason: String,
}

/// What `repair` did to one segment.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RepairReport {
    pub path: PathBuf,
    pub records_kept: u64,
    /// Bytes of records kept (frames included, header excluded).
    pub bytes_kept: u64,
    pub dropped: Vec<DroppedRange>,
    pub bytes_dropped: u64,
    /// Where the original was kept; `None` if the segment was intact and left untouched.
    pub corrupt_copy: Option<PathBuf>,
}

impl RepairReport {
    /// Whether the segment was already intact.
    pub fn was_clean(&self) -> bool {
        self.dropped.is_empty()
    }
}

/// Repairs one segment in place (see the module docs). An intact segment is left as is.
pub fn repair(path: &Path) -> io::Result<RepairReport> {
    let bytes = fs::read(path).ctx("reading segment to repair", path)?;
    let header = SegmentHeader::decode(&bytes).map_err(|reason| {
        Corruption {
            path: path.to_owned(),
            offset: 0,
            next_valid: None,
            reason: format!("{reason}; the header holds the checksum salt, so this segment cannot be repaired"),
        }
        .into_io()
    })?;
    let salt = header.salt;
    let mut out = Vec::with_capacity(bytes.len());
    out.extend_from_slice(&bytes[..SEGMENT_HEADER_LEN as usize]);
    let mut report = RepairReport {
        path: path.to_owned(),
        records_kept: 0,
        bytes_kept: 0,
        dropped: Vec::new(),
        bytes_dropped: 0,
        corrupt_copy: None,
    };
    let mut at = SEGMENT_HEADER_LEN as usize;
    while at < bytes.len() {
        match check_frame(&bytes[at..], salt) {
            Frame::Valid(len) => {
                let end = at + RECORD_HEADER_LEN as usize + len as usize;
                out.extend_from_slice(&bytes[at..end]);
                report.records_kept += 1;
                report.bytes_kept += (end - at) as u64;
                at = end;
            }
            // Preallocated space after the last record: not damage (a repaired copy drops it).
            Frame::Bad(_) if is_preallocated(&bytes[at..]) => break,
            Frame::Bad(reason) => {
                // Without a valid record after it, the damage ends where preallocated zeros begin.
                let zeros = bytes.len() - bytes.iter().rev().take_while(|&&b| b == 0).count();
                let next = find_valid_record(&bytes, at + 1, salt).unwrap_or(zeros.max(at + 1));
                let len = (next - at) as u64;
                report.dropped.push(DroppedRange {
                    offset: at as u64,
                    len,
                    reason,
                });
                report.bytes_dropped += len;
                at = next;
            }
        }
    }
    if report.dropped.is_empty() {
        return Ok(report);
    }

    let dir = parent_dir(path);
    let name = path
        .file_name()
        .and_then(|n| n.to_str())
        .unwrap_or("segment")
        .to_owned();
    let tmp = dir.join(format!("{name}.repair.tmp"));
    let written = (|| {
        let mut f = OpenOptions::new().write(true).create(true).truncate(true).open(&tmp)?;
        f.write_all(&out)?;
        f.sync_all()
    })()
    .ctx("writing repaired segment", &tmp);
    if let Err(e) = written {
        let _ = fs::remove_file(&tmp);
        return Err(e);
    }
    let Some(copy) = (0..1000)
        .map(|n| {
            if n == 0 {
                dir.join(format!("{name}.corrupt"))
            } else {
                dir.join(format!("{name}.corrupt.{n}"))
            }
        })
        .find(|p| !p.exists())
    else {
        let _ = fs::remove_file(&tmp);
        return Err(io::Error::new(
            io::ErrorKind::AlreadyExists,
            format!(
                "repairing {}: no free name for keeping the original (.corrupt..corrupt.999)",
                path.display()
            ),
        ));
    };
    // A hard link keeps the original bytes without copying; the rename below is atomic.
    if let Err(e) = fs::hard_link(path, &copy).ctx("keeping the original as", &copy) {
        let _ = fs::remove_file(&tmp);
        return Err(e);
    }
    fs::rename(&tmp, path).ctx("replacing with repaired segment", path)?;
    sync_dir(dir)?;
    report.corrupt_copy = Some(copy);
    Ok(report)
}

/// Repairs every segment in data directory `dir`, in name order: those of its
/// write-ahead log (`dir/wal`), and those of an earlier release's per-partition logs.
pub fn repair_dir(dir: &Path) -> io::Result<Vec<RepairReport>> {
    let mut paths = Vec::new();
    let wal = crate::wal::wal_dir(dir);
    for dir in [dir, wal.as_path()] {
        if dir == wal && !wal.is_dir() {
            continue;
        }
        for entry in fs::read_dir(dir).ctx("listing", dir)? {
            let entry = entry.ctx("listing", dir)?;
            if entry.file_name().to_str().and_then(parse_segment_name).is_some() {
                paths.push(entry.path());
            }
        }
    }
    paths.sort();
    paths.iter().map(|p| repair(p)).collect()
}
