//! Snapshot files: an opaque body covering the log up to a [`LogPosition`].
//!
//! # Snapshot file format (version 1)
//!
//! A snapshot is `<dir>/snap-<partition>-<seq:020>-<offset:020>.sps`, named after the
//! log position it covers. It is a 48-byte header followed by the body, integers
//! little-endian:
//!
//! ```text
//! offset size field
//!      0    8 magic       b"SPNDSNAP"
//!      8    4 version     1
//!     12    4 partition
//!     16    8 log seq     \ the position covered: the body reflects exactly the
//!     24    8 log offset  / records before it (must match the file name)
//!     32    8 body_len    bytes of body after the header; file length = 48 + body_len
//!     40    4 body_crc    CRC-32 (IEEE) of the body
//!     44    4 header_crc  CRC-32 of bytes 0..44
//!     48      body
//! ```
//!
//! # Atomicity
//!
//! The body is streamed into `<name>.tmp`, the header is written last, the file is
//! fsynced, renamed to `<name>`, and the directory fsynced. So a `.sps` file either is
//! complete or was damaged later; `.tmp` files are never read. A snapshot that fails any
//! check (header, length, body checksum) is skipped with a reason and the next older one
//! is tried. Keep two ([`prune_snapshots`] with `keep = 2`) and compact the log only
//! behind the *older* one, so falling back still finds the log it needs.

use std::fs::{self, File, OpenOptions};
use std::io::{self, BufWriter, Read, Write};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use crate::{ctx, sync_dir, LogPosition, ResultExt};

/// File magic of a snapshot.
pub const SNAPSHOT_MAGIC: [u8; 8] = *b"SPNDSNAP";
/// Current snapshot format version.
pub const SNAPSHOT_VERSION: u32 = 1;
/// Size of the snapshot header.
pub const SNAPSHOT_HEADER_LEN: u64 = 48;

/// Path of the snapshot of `partition` covering the log up to `pos`.
pub fn snapshot_path(dir: &Path, partition: u32, pos: LogPosition) -> PathBuf {
    dir.join(format!("snap-{partition}-{:020}-{:020}.sps", pos.seq, pos.offset))
}

/// `(partition, position)` from a snapshot file name; `None` for any other file.
pub fn parse_snapshot_name(name: &str) -> Option<(u32, LogPosition)> {
    let rest = name.strip_prefix("snap-")?.strip_suffix(".sps")?;
    let mut parts = rest.split('-');
    let (p, s, o) = (parts.next()?, parts.next()?, parts.next()?);
    if parts.next().is_some()
        || [p, s, o]
            .iter()
            .any(|x| x.is_empty() || !x.bytes().all(|b| b.is_ascii_digit()))
    {
        return None;
    }
    Some((
        p.parse().ok()?,
        LogPosition {
            seq: s.parse().ok()?,
            offset: o.parse().ok()?,
        },
    ))
}

/// A verified snapshot.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SnapshotInfo {
    pub path: PathBuf,
    pub partition: u32,
    /// The body reflects exactly the log records before this position.
    pub position: LogPosition,
    pub body_len: u64,
}

/// A snapshot skipped during recovery, and why. Worth a log line.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RejectedSnapshot {
    pub path: PathBuf,
    pub reason: String,
}

/// The snapshot files of `partition` in `dir` by name, oldest position first
/// (not verified).
pub fn list_snapshots(dir: &Path, partition: u32) -> io::Result<Vec<(LogPosition, PathBuf)>> {
    let mut out = Vec::new();
    for entry in fs::read_dir(dir).ctx("listing", dir)? {
        let entry = entry.ctx("listing", dir)?;
        if let Some((p, pos)) = entry.file_name().to_str().and_then(parse_snapshot_name) {
            if p == partition {
                out.push((pos, entry.path()));
            }
        }
    }
    out.sort();
    Ok(out)
}

fn encode_header(partition: u32, pos: LogPosition, body_len: u64, body_crc: u32) -> [u8; 48] {
    let mut h = [0u8; 48];
    h[0..8].copy_from_slice(&SNAPSHOT_MAGIC);
    h[8..12].copy_from_slice(&SNAPSHOT_VERSION.to_le_bytes());
    h[12..16].copy_from_slice(&partition.to_le_bytes());
    h[16..24].copy_from_slice(&pos.seq.to_le_bytes());
    h[24..32].copy_from_slice(&pos.offset.to_le_bytes());
    h[32..40].copy_from_slice(&body_len.to_le_bytes());
    h[40..44].copy_from_slice(&body_crc.to_le_bytes());
    let crc = crc32fast::hash(&h[0..44]);
    h[44..48].copy_from_slice(&crc.to_le_bytes());
    h
}

fn invalid(path: &Path, reason: impl std::fmt::Display) -> io::Error {
    io::Error::new(
        io::ErrorKind::InvalidData,
        format!("invalid snapshot {}: {reason}", path.display()),
    )
}

/// Streams a snapshot body to disk; [`SnapshotWriter::finish`] publishes it atomically.
/// Dropped without `finish`, it removes its temp file and publishes nothing.
pub struct SnapshotWriter {
    out: Option<BufWriter<File>>,
    tmp: PathBuf,
    path: PathBuf,
    dir: PathBuf,
    partition: u32,
    position: LogPosition,
    hasher: crc32fast::Hasher,
    len: u64,
}

/// Starts a snapshot of `partition` covering the log up to `pos`; write the body into the
/// returned writer, then call [`SnapshotWriter::finish`].
pub fn begin_snapshot(dir: &Path, partition: u32, pos: LogPosition) -> io::Result<SnapshotWriter> {
    let path = snapshot_path(dir, partition, pos);
    let tmp = path.with_extension("sps.tmp");
    let file = OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .open(&tmp)
        .ctx("creating snapshot", &tmp)?;
    let mut out = BufWriter::with_capacity(1 << 20, file);
    // Placeholder header; the real one is written once the body's length and CRC are known.
    let mut w = SnapshotWriter {
        out: None,
        tmp,
        path,
        dir: dir.to_owned(),
        partition,
        position: pos,
        hasher: crc32fast::Hasher::new(),
        len: 0,
    };
    out.write_all(&[0u8; SNAPSHOT_HEADER_LEN as usize])
        .map_err(|e| ctx(e, "writing snapshot", &w.tmp))?;
    w.out = Some(out);
    Ok(w)
}

impl Write for SnapshotWriter {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let out = self
            .out
            .as_mut()
            .ok_or_else(|| io::Error::other("snapshot writer already finished"))?;
        let n = out.write(buf).map_err(|e| ctx(e, "writing snapshot", &self.tmp))?;
        self.hasher.update(&buf[..n]);
        self.len += n as u64;
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        match self.out.as_mut() {
            Some(out) => out.flush().map_err(|e| ctx(e, "writing snapshot", &self.tmp)),
            None => Ok(()),
        }
    }
}

impl SnapshotWriter {
    /// Writes the header, fsyncs, renames into place and fsyncs the directory. Only
    /// after this returns may the log behind the snapshot be compacted.
    pub fn finish(mut self) -> io::Result<SnapshotInfo> {
        let out = self
            .out
            .take()
            .ok_or_else(|| io::Error::other("snapshot writer already finished"))?;
        let tmp = self.tmp.clone();
        let file = out
            .into_inner()
            .map_err(|e| ctx(e.into_error(), "writing snapshot", &tmp))?;
        let header = encode_header(self.partition, self.position, self.len, self.hasher.clone().finalize());
        file.write_all_at(&header, 0).ctx("writing snapshot header", &tmp)?;
        file.sync_all().ctx("fsyncing snapshot", &tmp)?;
        drop(file);
        fs::rename(&tmp, &self.path).ctx("publishing snapshot", &self.path)?;
        // Published: nothing for Drop to clean up any more.
        self.tmp = PathBuf::new();
        sync_dir(&self.dir)?;
        Ok(SnapshotInfo {
            path: self.path.clone(),
            partition: self.partition,
            position: self.position,
            body_len: self.len,
        })
    }
}

impl Drop for SnapshotWriter {
    fn drop(&mut self) {
        if !self.tmp.as_os_str().is_empty() {
            self.out = None;
            let _ = fs::remove_file(&self.tmp);
        }
    }
}

/// Writes a whole in-memory snapshot atomically (see [`begin_snapshot`] for streaming).
pub fn write_snapshot(dir: &Path, partition: u32, pos: LogPosition, body: &[u8]) -> io::Result<SnapshotInfo> {
    let mut w = begin_snapshot(dir, partition, pos)?;
    w.write_all(body)?;
    w.finish()
}

/// Reads a snapshot body, checking length and checksum as it goes: the read that
/// reaches the end fails with `InvalidData` if the body does not match its checksum.
pub struct SnapshotReader {
    file: io::Take<io::BufReader<File>>,
    info: SnapshotInfo,
    expected_crc: u32,
    hasher: crc32fast::Hasher,
    checked: bool,
}

impl SnapshotReader {
    /// Opens a snapshot and checks its header and length (not yet the body checksum).
    pub fn open(path: &Path) -> io::Result<Self> {
        let file = File::open(path).ctx("opening snapshot", path)?;
        let file_len = file.metadata().ctx("reading metadata of", path)?.len();
        let mut reader = io::BufReader::with_capacity(1 << 20, file);
        let mut h = [0u8; SNAPSHOT_HEADER_LEN as usize];
        if file_len < SNAPSHOT_HEADER_LEN {
            return Err(invalid(path, format_args!("{file_len} bytes, shorter than its header")));
        }
        reader.read_exact(&mut h).ctx("reading snapshot", path)?;
        if h[0..8] != SNAPSHOT_MAGIC {
            return Err(invalid(path, "bad magic"));
        }
        if u32::from_le_bytes(h[44..48].try_into().unwrap()) != crc32fast::hash(&h[0..44]) {
            return Err(invalid(path, "header checksum mismatch"));
        }
        let version = u32::from_le_bytes(h[8..12].try_into().unwrap());
        if version != SNAPSHOT_VERSION {
            return Err(invalid(path, format_args!("unsupported version {version}")));
        }
        let partition = u32::from_le_bytes(h[12..16].try_into().unwrap());
        let position = LogPosition {
            seq: u64::from_le_bytes(h[16..24].try_into().unwrap()),
            offset: u64::from_le_bytes(h[24..32].try_into().unwrap()),
        };
        let body_len = u64::from_le_bytes(h[32..40].try_into().unwrap());
        let expected_crc = u32::from_le_bytes(h[40..44].try_into().unwrap());
        if let Some((p, pos)) = path.file_name().and_then(|n| n.to_str()).and_then(parse_snapshot_name) {
            if (p, pos) != (partition, position) {
                return Err(invalid(
                    path,
                    format_args!("header says partition {partition} at {position}"),
                ));
            }
        }
        if file_len - SNAPSHOT_HEADER_LEN != body_len {
            return Err(invalid(
                path,
                format_args!(
                    "body is {} bytes, header says {body_len}",
                    file_len - SNAPSHOT_HEADER_LEN
                ),
            ));
        }
        Ok(SnapshotReader {
            file: reader.take(body_len),
            info: SnapshotInfo {
                path: path.to_owned(),
                partition,
                position,
                body_len,
            },
            expected_crc,
            hasher: crc32fast::Hasher::new(),
            checked: false,
        })
    }

    /// What the header says about this snapshot.
    pub fn info(&self) -> &SnapshotInfo {
        &self.info
    }
}

impl Read for SnapshotReader {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.file.read(buf).ctx("reading snapshot", &self.info.path)?;
        self.hasher.update(&buf[..n]);
        if !self.checked {
            // Check as soon as the last body byte is read, so `read_exact` callers are covered.
            if self.file.limit() == 0 {
                if self.hasher.clone().finalize() != self.expected_crc {
                    return Err(invalid(&self.info.path, "body checksum mismatch"));
                }
                self.checked = true;
            } else if n == 0 && !buf.is_empty() {
                return Err(invalid(&self.info.path, "body ends early"));
            }
        }
        Ok(n)
    }
}

/// Checks a snapshot completely (header, length, body checksum) without keeping its body.
pub fn verify_snapshot(path: &Path) -> io::Result<SnapshotInfo> {
    let mut r = SnapshotReader::open(path)?;
    io::copy(&mut r, &mut io::sink())?;
    Ok(r.info)
}

/// Reads and checks a whole snapshot into memory.
pub fn read_snapshot(path: &Path) -> io::Result<(SnapshotInfo, Vec<u8>)> {
    let mut r = SnapshotReader::open(path)?;
    let mut body = Vec::with_capacity(r.info.body_len.min(1 << 30) as usize);
    r.read_to_end(&mut body)?;
    Ok((r.info, body))
}

/// A found snapshot (if any), and the newer snapshots rejected on the way to it.
pub type Found<T> = (Option<T>, Vec<RejectedSnapshot>);

/// The newest snapshot of `partition` that passes every check, plus the newer ones that
/// did not (log each). Falling back is always safe as long as the log was compacted only
/// behind the oldest kept snapshot: replay from an older position reaches the same state.
pub fn latest_valid_snapshot(dir: &Path, partition: u32) -> io::Result<Found<SnapshotInfo>> {
    latest_with(dir, partition, verify_snapshot)
}

/// Like [`latest_valid_snapshot`], also returning the body (read and checked in one pass).
pub fn load_latest_snapshot(dir: &Path, partition: u32) -> io::Result<Found<(SnapshotInfo, Vec<u8>)>> {
    latest_with(dir, partition, read_snapshot)
}

fn latest_with<T>(dir: &Path, partition: u32, mut load: impl FnMut(&Path) -> io::Result<T>) -> io::Result<Found<T>> {
    let mut rejected = Vec::new();
    for (_, path) in list_snapshots(dir, partition)?.into_iter().rev() {
        match load(&path) {
            Ok(v) => return Ok((Some(v), rejected)),
            // Any failure, checksum or read error alike, means this file cannot be trusted.
            Err(e) => rejected.push(RejectedSnapshot {
                path,
                reason: e.to_string(),
            }),
        }
    }
    Ok((None, rejected))
}

/// Deletes all but the newest `keep` snapshots of `partition` (by position; not
/// verified) and fsyncs the directory. Returns the position of the oldest snapshot kept:
/// compact the log behind that one ([`crate::delete_segments_before`] with its `seq`).
pub fn prune_snapshots(dir: &Path, partition: u32, keep: usize) -> io::Result<Option<LogPosition>> {
    let all = list_snapshots(dir, partition)?;
    let cut = all.len().saturating_sub(keep.max(1));
    for (_, path) in &all[..cut] {
        fs::remove_file(path).ctx("deleting old snapshot", path)?;
    }
    if cut > 0 {
        sync_dir(dir)?;
    }
    Ok(all.get(cut).map(|(pos, _)| *pos))
}

/// Removes leftover `*.tmp` files (unfinished snapshots, segments, repairs) from `dir`.
/// Call once at start, before any writer runs.
pub fn remove_stale_temp_files(dir: &Path) -> io::Result<Vec<PathBuf>> {
    let mut removed = Vec::new();
    for entry in fs::read_dir(dir).ctx("listing", dir)? {
        let entry = entry.ctx("listing", dir)?;
        let name = entry.file_name();
        let Some(name) = name.to_str() else { continue };
        let ours = name.starts_with("snap-") || name.starts_with("log-");
        if ours && name.ends_with(".tmp") {
            fs::remove_file(entry.path()).ctx("removing stale temp file", &entry.path())?;
            removed.push(entry.path());
        }
    }
    Ok(removed)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::TempDir;

    fn pos(seq: u64, offset: u64) -> LogPosition {
        LogPosition { seq, offset }
    }

    #[test]
    fn names_round_trip() {
        let p = snapshot_path(Path::new("/d"), 4, pos(2, 32));
        assert_eq!(
            p.file_name().unwrap(),
            "snap-4-00000000000000000002-00000000000000000032.sps"
        );
        assert_eq!(
            parse_snapshot_name(p.file_name().unwrap().to_str().unwrap()),
            Some((4, pos(2, 32)))
        );
        assert_eq!(parse_snapshot_name("snap-4-2-32.sps.tmp"), None);
        assert_eq!(parse_snapshot_name("snap-4-2.sps"), None);
    }

    #[test]
    fn write_read_round_trip_streaming() {
        let dir = TempDir::new();
        let body: Vec<u8> = (0..3_000_000u32).map(|i| (i * 7) as u8).collect();
        let mut w = begin_snapshot(dir.path(), 1, pos(3, 100)).unwrap();
        for chunk in body.chunks(4097) {
            w.write_all(chunk).unwrap();
        }
        let info = w.finish().unwrap();
        assert_eq!(info.body_len, body.len() as u64);
        let (got, data) = read_snapshot(&info.path).unwrap();
        assert_eq!(got, info);
        assert_eq!(data, body);
        assert_eq!(verify_snapshot(&info.path).unwrap(), info);
        // No temp file left behind.
        assert_eq!(fs::read_dir(dir.path()).unwrap().count(), 1);
    }

    #[test]
    fn empty_body_is_valid() {
        let dir = TempDir::new();
        let info = write_snapshot(dir.path(), 0, pos(1, 32), b"").unwrap();
        assert_eq!(read_snapshot(&info.path).unwrap().1, b"");
    }

    #[test]
    fn dropped_writer_publishes_nothing() {
        let dir = TempDir::new();
        let mut w = begin_snapshot(dir.path(), 0, pos(1, 32)).unwrap();
        w.write_all(b"half a snapshot").unwrap();
        drop(w);
        assert_eq!(fs::read_dir(dir.path()).unwrap().count(), 0);
        assert_eq!(latest_valid_snapshot(dir.path(), 0).unwrap(), (None, vec![]));
    }

    #[test]
    fn every_truncation_and_bit_flip_is_detected() {
        let dir = TempDir::new();
        let info = write_snapshot(dir.path(), 0, pos(1, 32), b"snapshot body bytes").unwrap();
        let good = fs::read(&info.path).unwrap();
        for cut in 0..good.len() {
            fs::write(&info.path, &good[..cut]).unwrap();
            let err = verify_snapshot(&info.path).unwrap_err();
            assert_eq!(err.kind(), io::ErrorKind::InvalidData, "cut {cut}: {err}");
        }
        for i in 0..good.len() * 8 {
            let mut bad = good.clone();
            bad[i / 8] ^= 1 << (i % 8);
            fs::write(&info.path, &bad).unwrap();
            assert!(verify_snapshot(&info.path).is_err(), "bit {i}");
        }
    }

    #[test]
    fn prune_keeps_newest_and_reports_floor() {
        let dir = TempDir::new();
        for s in 1..=4 {
            write_snapshot(dir.path(), 0, pos(s, 32), &[s as u8]).unwrap();
        }
        write_snapshot(dir.path(), 9, pos(1, 32), b"other partition").unwrap();
        assert_eq!(prune_snapshots(dir.path(), 0, 2).unwrap(), Some(pos(3, 32)));
        let left: Vec<LogPosition> = list_snapshots(dir.path(), 0)
            .unwrap()
            .into_iter()
            .map(|(p, _)| p)
            .collect();
        assert_eq!(left, [pos(3, 32), pos(4, 32)]);
        assert_eq!(list_snapshots(dir.path(), 9).unwrap().len(), 1);
        assert_eq!(prune_snapshots(dir.path(), 5, 2).unwrap(), None);
    }
}
