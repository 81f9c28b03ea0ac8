//! Op-log segments: checksummed, length-framed records appended in batches.
//!
//! # Segment file format (version 1)
//!
//! A segment is `<dir>/log-<partition>-<seq:020>.spl` (partition in decimal, seq in
//! decimal zero-padded to 20 digits). It starts with a 32-byte header, all integers
//! little-endian:
//!
//! ```text
//! offset size field
//!      0    8 magic      b"SPNDLOG\0"
//!      8    4 version    1
//!     12    4 partition  partition number (must match the file name)
//!     16    8 seq        segment sequence number (must match the file name)
//!     24    4 salt       random per segment; seeds every record checksum
//!     28    4 crc        CRC-32 (IEEE, crc32fast) of bytes 0..28
//! ```
//!
//! Records follow back to back from offset 32. A live segment is preallocated
//! ([`PREALLOCATE`] bytes at a time) by writing zeros: appending then overwrites blocks
//! that are already allocated and written, so an `fdatasync` flushes the data without a
//! metadata commit. A sparse extension or `fallocate` would leave holes or unwritten
//! extents, and filling those is a metadata change that every `fdatasync` has to commit
//! (on ext4, a 16 KiB batch's `fdatasync` takes about twice as long). The records end where
//! the zeros begin; a segment is trimmed to its records when the log moves past it.
//!
//! ```text
//! [len: u32][crc: u32][payload: len bytes]
//! crc = CRC-32(salt as u32 LE ++ len as u32 LE ++ payload)
//! ```
//!
//! `len` is at most [`MAX_RECORD_LEN`]. The checksum covers the length so a damaged
//! length is caught, and is seeded with the segment's salt so that (a) a run of zero
//! bytes (preallocated space after a crash) never reads as a valid record, and (b) record
//! bytes that a client managed to place inside a payload, or stale blocks of a deleted
//! segment that a crash exposes at the end of a file, never validate as a record of this
//! segment during the resync scan below. A segment is created atomically with its
//! header (temp file, fsync, link into place, fsync the directory), so a segment that
//! exists always has a complete header; a bad header is corruption.
//!
//! # Torn tail versus corruption
//!
//! Reading stops at the first offset `X` where a record does not validate: fewer than
//! 8 bytes left, `len` over the maximum, the payload running past the end of the file,
//! or a checksum mismatch. The scanner then searches every later byte offset for the
//! start of a record that validates (length fits in the file and checksum matches):
//!
//! * **only zeros to the end of the file**: preallocated space, the clean end of the
//!   records ([`ScanEnd::Clean`] at `X`).
//! * **none found**: the bytes from `X` to the end are a *torn tail*, the remains of a
//!   write that never completed. Nothing after `X` was ever
//!   acknowledged, because the write was not followed by a completed `fsync`. The scan
//!   reports [`ScanEnd::Torn`] with `X`; the caller logs it and cuts the file at `X`
//!   with [`truncate_torn_tail`].
//! * **one found at `Y`**: intact data follows damaged data, so acknowledged records may
//!   be lost. The scan fails with a [`Corruption`] error naming the file, `X` and `Y`.
//!   Nothing is skipped silently; `repair()` is the explicit way to go on.
//!
//! The resync scan reads the rest of the file into memory; it runs only on this rare
//! path, and costs one checksum per byte offset at most (runs of zeros are cheaper).
//!
//! Known limit: if a crash loses an *unsynced* page in the middle of the last batch
//! while a later page of the same batch survives, the result looks like corruption (the
//! safe answer: start is refused and `repair` keeps every intact record).
//!
//! # Writing
//!
//! [`LogWriter::append_batch`] encodes all records of a batch into one reused buffer and
//! issues a single positional write; [`LogWriter::sync`] issues one `fdatasync`. A write
//! that fails (disk full) is cut back to the last good offset so no half-record is left
//! behind; if even that fails, or an `fsync` fails (after which the kernel may have
//! dropped the dirty pages), the writer refuses all further calls until the segment is
//! reopened, which re-reads the file from disk.

use std::fs::{self, File, OpenOptions};
use std::hash::{BuildHasher, Hasher};
use std::io::{self, BufReader, Read, Seek, SeekFrom};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use crate::{ctx, parent_dir, sync_dir, Corruption, LogPosition, ResultExt};

/// File magic of a log segment.
pub const SEGMENT_MAGIC: [u8; 8] = *b"SPNDLOG\0";
/// Current segment format version.
pub const SEGMENT_VERSION: u32 = 1;
/// Size of the segment header; the first record starts here.
pub const SEGMENT_HEADER_LEN: u64 = 32;
/// Size of a record's frame (length + checksum) before its payload.
pub const RECORD_HEADER_LEN: u64 = 8;
/// Largest payload accepted. Bounds memory on read and lets a damaged length be spotted.
/// A partition's record holds up to 64 MiB; the rest is room for the write-ahead log's
/// partition tag.
pub const MAX_RECORD_LEN: u32 = (64 << 20) + 16;
/// A live segment grows by this much at a time (see "Segment file format"): the zeros are
/// written under the partition's lock and flushed by the next `fdatasync`, so a step is
/// small enough to cost that call about a millisecond.
pub const PREALLOCATE: u64 = 1 << 20;
/// Sequence number of a partition's first segment. Recovery without a snapshot requires
/// the log to start here, so a log compacted behind a lost snapshot is detected.
pub const FIRST_SEGMENT_SEQ: u64 = 1;

const SEGMENT_EXT: &str = "spl";

/// The decoded header of a segment.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SegmentHeader {
    pub partition: u32,
    pub seq: u64,
    pub salt: u32,
}

impl SegmentHeader {
    fn encode(&self) -> [u8; SEGMENT_HEADER_LEN as usize] {
        let mut h = [0u8; SEGMENT_HEADER_LEN as usize];
        h[0..8].copy_from_slice(&SEGMENT_MAGIC);
        h[8..12].copy_from_slice(&SEGMENT_VERSION.to_le_bytes());
        h[12..16].copy_from_slice(&self.partition.to_le_bytes());
        h[16..24].copy_from_slice(&self.seq.to_le_bytes());
        h[24..28].copy_from_slice(&self.salt.to_le_bytes());
        let crc = crc32fast::hash(&h[0..28]);
        h[28..32].copy_from_slice(&crc.to_le_bytes());
        h
    }

    /// Decodes and checks a header; `Err` is the reason it is unusable.
    pub(crate) fn decode(h: &[u8]) -> Result<Self, String> {
        if h.len() < SEGMENT_HEADER_LEN as usize {
            return Err(format!(
                "segment header incomplete ({} of {SEGMENT_HEADER_LEN} bytes)",
                h.len()
            ));
        }
        if h[0..8] != SEGMENT_MAGIC {
            return Err("not a Spindle log segment (bad magic)".into());
        }
        let crc = u32::from_le_bytes(h[28..32].try_into().unwrap());
        if crc != crc32fast::hash(&h[0..28]) {
            return Err("segment header checksum mismatch".into());
        }
        let version = u32::from_le_bytes(h[8..12].try_into().unwrap());
        if version != SEGMENT_VERSION {
            return Err(format!(
                "unsupported segment format version {version} (this build reads {SEGMENT_VERSION})"
            ));
        }
        Ok(SegmentHeader {
            partition: u32::from_le_bytes(h[12..16].try_into().unwrap()),
            seq: u64::from_le_bytes(h[16..24].try_into().unwrap()),
            salt: u32::from_le_bytes(h[24..28].try_into().unwrap()),
        })
    }
}

/// Checksum of one record: salt, then length, then payload.
fn record_crc(salt: u32, payload: &[u8]) -> u32 {
    let mut h = crc32fast::Hasher::new();
    h.update(&salt.to_le_bytes());
    h.update(&(payload.len() as u32).to_le_bytes());
    h.update(payload);
    h.finalize()
}

/// Appends one framed record to `buf`, its payload `prefix ++ body` (no copy in between).
fn encode_record(buf: &mut Vec<u8>, salt: u32, prefix: &[u8], body: &[u8]) {
    let len = (prefix.len() + body.len()) as u32;
    let mut h = crc32fast::Hasher::new();
    h.update(&salt.to_le_bytes());
    h.update(&len.to_le_bytes());
    h.update(prefix);
    h.update(body);
    buf.extend_from_slice(&len.to_le_bytes());
    buf.extend_from_slice(&h.finalize().to_le_bytes());
    buf.extend_from_slice(prefix);
    buf.extend_from_slice(body);
}

/// What is at the start of `buf` (which runs to the end of the file).
pub(crate) enum Frame {
    /// A valid record with this payload length.
    Valid(u32),
    /// Not a valid record, for this reason.
    Bad(String),
}

/// Checks whether a valid record starts at `buf[0]`.
pub(crate) fn check_frame(buf: &[u8], salt: u32) -> Frame {
    if buf.len() < RECORD_HEADER_LEN as usize {
        return Frame::Bad(format!(
            "incomplete record header ({} bytes before end of file)",
            buf.len()
        ));
    }
    let len = u32::from_le_bytes(buf[0..4].try_into().unwrap());
    if len > MAX_RECORD_LEN {
        return Frame::Bad(format!("record length {len} exceeds the maximum {MAX_RECORD_LEN}"));
    }
    let end = RECORD_HEADER_LEN as usize + len as usize;
    if end > buf.len() {
        return Frame::Bad(format!("record of {len} bytes runs past the end of the file"));
    }
    let crc = u32::from_le_bytes(buf[4..8].try_into().unwrap());
    if crc != record_crc(salt, &buf[RECORD_HEADER_LEN as usize..end]) {
        return Frame::Bad(format!("checksum mismatch on record of {len} bytes"));
    }
    Frame::Valid(len)
}

/// The first index `i >= from` at which a valid record starts in `buf`, if any.
pub(crate) fn find_valid_record(buf: &[u8], from: usize, salt: u32) -> Option<usize> {
    let last = buf.len().checked_sub(RECORD_HEADER_LEN as usize)?;
    // An empty record's checksum depends only on the salt: comparing it directly makes
    // scanning a long run of zeros (preallocated space) cheap.
    let empty_crc = record_crc(salt, &[]);
    (from..=last).find(|&i| {
        // Cheap pre-checks on the length before paying for a checksum.
        let len = u32::from_le_bytes(buf[i..i + 4].try_into().unwrap());
        if len == 0 {
            return u32::from_le_bytes(buf[i + 4..i + 8].try_into().unwrap()) == empty_crc;
        }
        len <= MAX_RECORD_LEN
            && (len as usize) <= buf.len() - i - RECORD_HEADER_LEN as usize
            && matches!(check_frame(&buf[i..], salt), Frame::Valid(_))
    })
}

/// A fresh random salt; std's `RandomState` is seeded from the OS.
/// Never one under which eight zero bytes (preallocated space) frame a valid empty record.
fn random_salt() -> u32 {
    loop {
        let mut h = std::collections::hash_map::RandomState::new().build_hasher();
        h.write_u32(std::process::id());
        if let Ok(d) = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH) {
            h.write_u128(d.as_nanos());
        }
        let v = h.finish();
        let salt = (v ^ (v >> 32)) as u32;
        if record_crc(salt, &[]) != 0 {
            return salt;
        }
    }
}

/// Whether `rest` (the bytes from a record boundary to the end of the file) is
/// preallocated space: only zeros.
pub(crate) fn is_preallocated(rest: &[u8]) -> bool {
    rest.iter().all(|&b| b == 0)
}

// ---------------------------------------------------------------------------------------
// Naming and listing
// ---------------------------------------------------------------------------------------

/// Path of segment `seq` of `partition` in `dir`.
pub fn segment_path(dir: &Path, partition: u32, seq: u64) -> PathBuf {
    dir.join(format!("log-{partition}-{seq:020}.{SEGMENT_EXT}"))
}

/// `(partition, seq)` from a segment file name, `None` for any other file
/// (temp files, `.corrupt` copies, snapshots).
pub fn parse_segment_name(name: &str) -> Option<(u32, u64)> {
    let rest = name.strip_prefix("log-")?.strip_suffix(".spl")?;
    let (p, s) = rest.split_once('-')?;
    if p.is_empty() || s.is_empty() || !p.bytes().chain(s.bytes()).all(|b| b.is_ascii_digit()) {
        return None;
    }
    Some((p.parse().ok()?, s.parse().ok()?))
}

/// A segment found on disk.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SegmentInfo {
    pub seq: u64,
    pub path: PathBuf,
}

/// The segments of `partition` in `dir`, in sequence order.
pub fn list_segments(dir: &Path, partition: u32) -> io::Result<Vec<SegmentInfo>> {
    let mut out = Vec::new();
    for entry in fs::read_dir(dir).ctx("listing", dir)? {
        let entry = entry.ctx("listing", dir)?;
        let name = entry.file_name();
        if let Some((p, seq)) = name.to_str().and_then(parse_segment_name) {
            if p == partition {
                out.push(SegmentInfo {
                    seq,
                    path: entry.path(),
                });
            }
        }
    }
    out.sort_by_key(|s| s.seq);
    Ok(out)
}

/// Compaction: deletes the segments of `partition` numbered below `seq`, then fsyncs
/// the directory. Returns the deleted paths.
///
/// Pass the position of the *oldest snapshot kept* (see
/// `prune_snapshots`), not the newest, so that falling back to the
/// older snapshot still finds its log.
pub fn delete_segments_before(dir: &Path, partition: u32, seq: u64) -> io::Result<Vec<PathBuf>> {
    let mut deleted = Vec::new();
    for seg in list_segments(dir, partition)? {
        if seg.seq < seq {
            fs::remove_file(&seg.path).ctx("deleting old segment", &seg.path)?;
            deleted.push(seg.path);
        }
    }
    if !deleted.is_empty() {
        sync_dir(dir)?;
    }
    Ok(deleted)
}

// ---------------------------------------------------------------------------------------
// Writing
// ---------------------------------------------------------------------------------------

/// The file operations [`LogWriter`] needs. Implemented for [`File`]; tests wrap a file
/// to inject failures (a disk that fills up after N bytes).
pub trait LogFile {
    /// Writes all of `buf` at `offset`. May have written a prefix when it fails.
    fn write_all_at(&mut self, buf: &[u8], offset: u64) -> io::Result<()>;
    /// Truncates (or extends) the file to `len` bytes.
    fn set_len(&mut self, len: u64) -> io::Result<()>;
    /// Makes written data durable (`fdatasync`).
    fn sync_data(&mut self) -> io::Result<()>;
}

impl LogFile for File {
    fn write_all_at(&mut self, buf: &[u8], offset: u64) -> io::Result<()> {
        FileExt::write_all_at(self, buf, offset)
    }
    fn set_len(&mut self, len: u64) -> io::Result<()> {
        File::set_len(self, len)
    }
    fn sync_data(&mut self) -> io::Result<()> {
        File::sync_data(self)
    }
}

/// Writes zeros to `file` from `from` to `to` (preallocated space, allocated and written).
fn write_zeros<F: LogFile>(file: &mut F, from: u64, to: u64) -> io::Result<()> {
    static ZEROS: [u8; 64 << 10] = [0; 64 << 10];
    let mut at = from;
    while at < to {
        let n = (to - at).min(ZEROS.len() as u64);
        file.write_all_at(&ZEROS[..n as usize], at)?;
        at += n;
    }
    Ok(())
}

/// Appends batches of records to one segment. Not thread-safe by design: one writer task
/// per partition owns it and does group commit.
pub struct LogWriter<F: LogFile = File> {
    file: F,
    path: PathBuf,
    header: SegmentHeader,
    /// End of the last complete record written (the next record goes here).
    len: u64,
    /// The file's size: zeros from `len` to here are preallocated space.
    allocated: u64,
    /// End of the data known durable.
    synced: u64,
    /// Reused encoding buffer: no allocation per batch once warmed up.
    buf: Vec<u8>,
    /// Set when the file's state is unknown; every later call fails with this message.
    failed: Option<String>,
}

impl LogWriter<File> {
    /// Creates segment `seq` of `partition` in `dir`, failing if it already exists.
    ///
    /// The header is written to a temp file, fsynced, linked into place (no clobbering)
    /// and the directory fsynced, so the segment never exists without its header.
    pub fn create(dir: &Path, partition: u32, seq: u64) -> io::Result<Self> {
        Self::create_with(dir, partition, seq, |f| f)
    }

    /// Opens an existing segment for appending after its last record.
    ///
    /// Reads the whole segment first; fails on corruption, and on a torn tail (call
    /// [`truncate_torn_tail`] first: the decision to cut is the caller's, and logged).
    pub fn open(path: &Path) -> io::Result<Self> {
        let mut scan = SegmentScanner::open(path)?;
        while scan.next_record()?.is_some() {}
        if let Some(ScanEnd::Torn(t)) = scan.end() {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!(
                    "opening {} for append: torn tail at byte offset {} ({} bytes); truncate it first",
                    path.display(),
                    t.offset,
                    t.len()
                ),
            ));
        }
        let header = *scan.header();
        let len = scan.position().offset;
        let file = OpenOptions::new()
            .write(true)
            .open(path)
            .ctx("opening segment for append", path)?;
        let allocated = file.metadata().ctx("reading metadata of", path)?.len();
        Ok(LogWriter {
            file,
            path: path.to_owned(),
            header,
            len,
            allocated,
            synced: len,
            buf: Vec::new(),
            failed: None,
        })
    }

    /// Another handle on this segment's file, for a thread that only makes it durable
    /// (`sync_data` on it covers everything written through this writer before the call).
    pub fn sync_handle(&self) -> io::Result<File> {
        self.file.try_clone().ctx("duplicating the handle of", &self.path)
    }

    /// Syncs this segment and starts the next one (`seq + 1`) in the same directory.
    ///
    /// Returns the start of the new segment: the position a snapshot taken now covers.
    /// Call this when a snapshot starts so older segments can later be deleted whole.
    pub fn rotate(&mut self) -> io::Result<LogPosition> {
        self.trim()?;
        self.sync()?;
        let next = LogWriter::create(parent_dir(&self.path), self.header.partition, self.header.seq + 1)?;
        *self = next;
        Ok(self.position())
    }
}

impl<F: LogFile> LogWriter<F> {
    /// Like [`LogWriter::create`], with the opened file wrapped by `wrap` (used to inject
    /// I/O failures in tests).
    pub fn create_with(dir: &Path, partition: u32, seq: u64, wrap: impl FnOnce(File) -> F) -> io::Result<Self> {
        let path = segment_path(dir, partition, seq);
        let tmp = path.with_extension("spl.tmp");
        let header = SegmentHeader {
            partition,
            seq,
            salt: random_salt(),
        };
        let file = (|| {
            let mut file = OpenOptions::new()
                .read(true)
                .write(true)
                .create(true)
                .truncate(true)
                .open(&tmp)?;
            FileExt::write_all_at(&file, &header.encode(), 0)?;
            write_zeros(&mut file, SEGMENT_HEADER_LEN, SEGMENT_HEADER_LEN + PREALLOCATE)?;
            file.sync_all()?;
            Ok(file)
        })()
        .map_err(|e: io::Error| {
            let _ = fs::remove_file(&tmp);
            ctx(e, "creating segment", &tmp)
        })?;
        // hard_link fails if the target exists: never clobber a segment.
        let linked = fs::hard_link(&tmp, &path).ctx("creating segment", &path);
        let _ = fs::remove_file(&tmp);
        linked?;
        sync_dir(dir)?;
        Ok(LogWriter {
            file: wrap(file),
            path,
            header,
            len: SEGMENT_HEADER_LEN,
            allocated: SEGMENT_HEADER_LEN + PREALLOCATE,
            synced: SEGMENT_HEADER_LEN,
            buf: Vec::new(),
            failed: None,
        })
    }

    fn check_usable(&self) -> io::Result<()> {
        match &self.failed {
            None => Ok(()),
            Some(why) => Err(io::Error::other(format!(
                "log segment {} is unusable after an earlier failure ({why}); reopen it",
                self.path.display()
            ))),
        }
    }

    /// Appends one record (a batch of one).
    pub fn append(&mut self, record: &[u8]) -> io::Result<LogPosition> {
        self.append_batch(std::iter::once(record))
    }

    /// Appends all `records` with a single write; returns the position after the last.
    ///
    /// The records are not durable until [`LogWriter::sync`] returns. On error nothing of
    /// the batch remains in the file (it is cut back), or, if that cut fails too, the
    /// writer is marked failed and refuses further calls.
    pub fn append_batch<I>(&mut self, records: I) -> io::Result<LogPosition>
    where
        I: IntoIterator,
        I::Item: AsRef<[u8]>,
    {
        self.append_prefixed(&[], records)
    }

    /// Like [`LogWriter::append_batch`], every record's payload starting with `prefix`
    /// (a write-ahead log's partition tag, see the `wal` module).
    pub fn append_prefixed<I>(&mut self, prefix: &[u8], records: I) -> io::Result<LogPosition>
    where
        I: IntoIterator,
        I::Item: AsRef<[u8]>,
    {
        self.check_usable()?;
        self.buf.clear();
        for r in records {
            let r = r.as_ref();
            if prefix.len() + r.len() > MAX_RECORD_LEN as usize {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidInput,
                    format!(
                        "record of {} bytes exceeds the maximum {MAX_RECORD_LEN}",
                        prefix.len() + r.len()
                    ),
                ));
            }
            encode_record(&mut self.buf, self.header.salt, prefix, r);
        }
        if self.buf.is_empty() {
            return Ok(self.position());
        }
        let written = self.buf.len() as u64;
        if self.len + written > self.allocated {
            let size = (self.len + written).next_multiple_of(PREALLOCATE);
            let op = format!("preallocating {size} bytes for");
            // Zeros only past the batch (a large batch is not written twice); a failure
            // leaves some zeros past `allocated`: preallocated space all the same.
            let from = self.allocated.max(self.len + written);
            write_zeros(&mut self.file, from, size).map_err(|e| ctx(e, &op, &self.path))?;
            self.allocated = size;
        }
        let result = self.file.write_all_at(&self.buf, self.len);
        // Keep the buffer from pinning a huge allocation after one giant batch.
        if self.buf.capacity() > 16 << 20 {
            self.buf = Vec::new();
        }
        match result {
            Ok(()) => {
                self.len += written;
                Ok(self.position())
            }
            Err(e) => {
                let op = format!("appending {written} bytes at offset {} to", self.len);
                match self.file.set_len(self.len) {
                    Ok(()) => self.allocated = self.len,
                    Err(cut) => self.failed = Some(format!("could not cut back a failed write: {cut}")),
                }
                Err(ctx(e, &op, &self.path))
            }
        }
    }

    /// Makes everything appended so far durable with one `fdatasync`. Reply to the calls
    /// of a batch only after this returns `Ok`.
    ///
    /// A failed sync marks the writer failed: after a failed `fsync` Linux may have
    /// dropped the dirty pages, so retrying could report success for lost data.
    pub fn sync(&mut self) -> io::Result<()> {
        self.check_usable()?;
        if self.synced == self.len {
            return Ok(());
        }
        let result = self.file.sync_data();
        self.sync_done(self.len, result)
    }

    /// For an fsync made on another thread through a [`sync_handle`](LogWriter::sync_handle)
    /// (where `sync` would block this one): the end of the data it makes durable.
    pub fn sync_target(&self) -> io::Result<u64> {
        self.check_usable()?;
        Ok(self.len)
    }

    /// Record how the fsync of the data up to `target` went, as `sync` does: durable, or
    /// the writer failed.
    pub fn sync_done(&mut self, target: u64, result: io::Result<()>) -> io::Result<()> {
        match result {
            Ok(()) => {
                self.synced = self.synced.max(target);
                Ok(())
            }
            Err(e) => {
                self.failed = Some(format!("fsync failed: {e}"));
                Err(ctx(e, "fsyncing", &self.path))
            }
        }
    }

    /// Cuts the preallocated space after the records (a segment the log moves past), and
    /// makes that durable.
    pub fn trim(&mut self) -> io::Result<()> {
        self.check_usable()?;
        if self.allocated > self.len {
            let path = &self.path;
            self.file.set_len(self.len).ctx("trimming", path)?;
            self.file.sync_data().ctx("fsyncing", path)?;
            self.allocated = self.len;
        }
        Ok(())
    }

    /// Position after the last record appended (synced or not).
    pub fn position(&self) -> LogPosition {
        LogPosition {
            seq: self.header.seq,
            offset: self.len,
        }
    }

    /// Position after the last record known durable.
    pub fn synced_position(&self) -> LogPosition {
        LogPosition {
            seq: self.header.seq,
            offset: self.synced,
        }
    }

    /// This segment's file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// This segment's header.
    pub fn header(&self) -> &SegmentHeader {
        &self.header
    }

    /// Whether an earlier failure made the writer refuse further calls.
    pub fn is_failed(&self) -> bool {
        self.failed.is_some()
    }
}

// ---------------------------------------------------------------------------------------
// Reading
// ---------------------------------------------------------------------------------------

/// The unfinished write at the end of a segment.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TornTail {
    pub path: PathBuf,
    /// Where the torn bytes start: cut the file here.
    pub offset: u64,
    /// The file's length when scanned.
    pub file_len: u64,
    /// Why the record at `offset` did not validate.
    pub reason: String,
}

impl TornTail {
    /// How many bytes cutting the tail removes.
    pub fn len(&self) -> u64 {
        self.file_len - self.offset
    }

    /// Whether the tail is empty (never, for a reported tail).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// How a scan of a segment ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ScanEnd {
    /// Valid records up to `len`; after them, if anything, only preallocated zeros.
    Clean { len: u64 },
    /// Valid records, then a torn tail.
    Torn(TornTail),
}

/// Reads the records of a segment in order, with the torn-versus-corrupt rule of the
/// module docs. Streams through a buffer; reuses one payload buffer for all records.
pub struct SegmentScanner {
    reader: BufReader<File>,
    path: PathBuf,
    header: SegmentHeader,
    file_len: u64,
    offset: u64,
    payload: Vec<u8>,
    end: Option<ScanEnd>,
}

impl SegmentScanner {
    /// Opens a segment and checks its header; the first record is read next.
    pub fn open(path: &Path) -> io::Result<Self> {
        Self::open_at(path, SEGMENT_HEADER_LEN)
    }

    /// Opens a segment and starts reading at `offset`, a record boundary (a snapshot's
    /// position), skipping the records before it.
    pub fn open_at(path: &Path, offset: u64) -> io::Result<Self> {
        let mut file = File::open(path).ctx("opening segment", path)?;
        let file_len = file.metadata().ctx("reading metadata of", path)?.len();
        let mut h = Vec::with_capacity(SEGMENT_HEADER_LEN as usize);
        (&mut file)
            .take(SEGMENT_HEADER_LEN)
            .read_to_end(&mut h)
            .ctx("reading header of", path)?;
        let header = SegmentHeader::decode(&h).map_err(|reason| {
            Corruption {
                path: path.to_owned(),
                offset: 0,
                next_valid: None,
                reason,
            }
            .into_io()
        })?;
        if let Some((p, s)) = path.file_name().and_then(|n| n.to_str()).and_then(parse_segment_name) {
            if (p, s) != (header.partition, header.seq) {
                let reason = format!(
                    "header says partition {} segment {}, file name says partition {p} segment {s}",
                    header.partition, header.seq
                );
                return Err(Corruption {
                    path: path.to_owned(),
                    offset: 0,
                    next_valid: None,
                    reason,
                }
                .into_io());
            }
        }
        if offset < SEGMENT_HEADER_LEN || offset > file_len {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "start offset {offset} is outside segment {} ({file_len} bytes)",
                    path.display()
                ),
            ));
        }
        file.seek(SeekFrom::Start(offset)).ctx("seeking in", path)?;
        Ok(SegmentScanner {
            reader: BufReader::with_capacity(256 << 10, file),
            path: path.to_owned(),
            header,
            file_len,
            offset,
            payload: Vec::new(),
            end: None,
        })
    }

    /// The next record as `(offset, payload)`, or `None` at the end (then see
    /// [`SegmentScanner::end`]). Fails with a [`Corruption`] error on mid-file damage.
    pub fn next_record(&mut self) -> io::Result<Option<(u64, &[u8])>> {
        if self.end.is_some() {
            return Ok(None);
        }
        let start = self.offset;
        let remaining = self.file_len - start;
        if remaining == 0 {
            self.end = Some(ScanEnd::Clean { len: start });
            return Ok(None);
        }
        if remaining < RECORD_HEADER_LEN {
            return self.bad(format!(
                "incomplete record header ({remaining} bytes before end of file)"
            ));
        }
        let mut frame = [0u8; RECORD_HEADER_LEN as usize];
        self.reader.read_exact(&mut frame).ctx("reading", &self.path)?;
        let len = u32::from_le_bytes(frame[0..4].try_into().unwrap());
        let crc = u32::from_le_bytes(frame[4..8].try_into().unwrap());
        if len > MAX_RECORD_LEN {
            return self.bad(format!("record length {len} exceeds the maximum {MAX_RECORD_LEN}"));
        }
        if len as u64 > remaining - RECORD_HEADER_LEN {
            return self.bad(format!("record of {len} bytes runs past the end of the file"));
        }
        self.payload.resize(len as usize, 0);
        self.reader.read_exact(&mut self.payload).ctx("reading", &self.path)?;
        if crc != record_crc(self.header.salt, &self.payload) {
            return self.bad(format!("checksum mismatch on record of {len} bytes"));
        }
        self.offset = start + RECORD_HEADER_LEN + len as u64;
        Ok(Some((start, &self.payload)))
    }

    /// The record at `self.offset` is bad: torn tail if nothing valid follows, else error.
    fn bad(&mut self, reason: String) -> io::Result<Option<(u64, &[u8])>> {
        let at = self.offset;
        let mut file = File::open(&self.path).ctx("opening segment", &self.path)?;
        file.seek(SeekFrom::Start(at)).ctx("seeking in", &self.path)?;
        let mut rest = Vec::new();
        file.take(self.file_len - at)
            .read_to_end(&mut rest)
            .ctx("reading", &self.path)?;
        if is_preallocated(&rest) {
            self.end = Some(ScanEnd::Clean { len: at });
            return Ok(None);
        }
        if let Some(i) = find_valid_record(&rest, 1, self.header.salt) {
            return Err(Corruption {
                path: self.path.clone(),
                offset: at,
                next_valid: Some(at + i as u64),
                reason,
            }
            .into_io());
        }
        self.end = Some(ScanEnd::Torn(TornTail {
            path: self.path.clone(),
            offset: at,
            file_len: self.file_len,
            reason,
        }));
        Ok(None)
    }

    /// How the scan ended; `None` until [`SegmentScanner::next_record`] returned `None`.
    pub fn end(&self) -> Option<&ScanEnd> {
        self.end.as_ref()
    }

    /// The segment's header.
    pub fn header(&self) -> &SegmentHeader {
        &self.header
    }

    /// Position after the last record returned.
    pub fn position(&self) -> LogPosition {
        LogPosition {
            seq: self.header.seq,
            offset: self.offset,
        }
    }

    /// The segment's path.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

/// Cuts a segment at `offset`, the start of a [`TornTail`], and fsyncs it. Returns how
/// many bytes were removed. The caller should log a line saying so.
pub fn truncate_torn_tail(path: &Path, offset: u64) -> io::Result<u64> {
    let file = OpenOptions::new()
        .write(true)
        .open(path)
        .ctx("opening to truncate torn tail", path)?;
    let len = file.metadata().ctx("reading metadata of", path)?.len();
    if offset < SEGMENT_HEADER_LEN || offset > len {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!(
                "torn-tail offset {offset} is outside segment {} ({len} bytes)",
                path.display()
            ),
        ));
    }
    file.set_len(offset).ctx("truncating torn tail of", path)?;
    file.sync_all().ctx("fsyncing", path)?;
    Ok(len - offset)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::TempDir;

    fn records(n: usize) -> Vec<Vec<u8>> {
        (0..n)
            .map(|i| format!("record-{i}-{}", "x".repeat(i % 37)).into_bytes())
            .collect()
    }

    fn read_all(path: &Path) -> io::Result<(Vec<Vec<u8>>, ScanEnd)> {
        let mut s = SegmentScanner::open(path)?;
        let mut out = Vec::new();
        while let Some((_, r)) = s.next_record()? {
            out.push(r.to_vec());
        }
        Ok((out, s.end().unwrap().clone()))
    }

    #[test]
    fn names_round_trip() {
        let p = segment_path(Path::new("/d"), 7, 42);
        assert_eq!(p, Path::new("/d/log-7-00000000000000000042.spl"));
        assert_eq!(parse_segment_name("log-7-00000000000000000042.spl"), Some((7, 42)));
        for bad in [
            "log-7-1.spl.tmp",
            "log-7-1.spl.corrupt",
            "log--1.spl",
            "log-7-.spl",
            "log-a-1.spl",
            "x.spl",
        ] {
            assert_eq!(parse_segment_name(bad), None, "{bad}");
        }
    }

    #[test]
    fn header_round_trip_and_zero_record_never_valid() {
        let h = SegmentHeader {
            partition: 3,
            seq: 9,
            salt: 0xdead_beef,
        };
        assert_eq!(SegmentHeader::decode(&h.encode()), Ok(h));
        // An all-zero frame is not a valid empty record, whatever the salt.
        for salt in [0, 1, 0xffff_ffff, h.salt] {
            assert!(matches!(check_frame(&[0u8; 64], salt), Frame::Bad(_)));
        }
    }

    #[test]
    fn batches_round_trip() {
        let dir = TempDir::new();
        let mut w = LogWriter::create(dir.path(), 0, FIRST_SEGMENT_SEQ).unwrap();
        let recs = records(500);
        for chunk in recs.chunks(17) {
            w.append_batch(chunk).unwrap();
            w.sync().unwrap();
        }
        w.append_batch(Vec::<Vec<u8>>::new()).unwrap();
        assert_eq!(w.position(), w.synced_position());
        let (got, end) = read_all(w.path()).unwrap();
        assert_eq!(got, recs);
        assert_eq!(
            end,
            ScanEnd::Clean {
                len: w.position().offset
            }
        );
    }

    #[test]
    fn an_fsync_on_another_thread_is_recorded_as_sync_records_one() {
        let dir = TempDir::new();
        let mut w = LogWriter::create(dir.path(), 0, FIRST_SEGMENT_SEQ).unwrap();
        let handle = w.sync_handle().unwrap();
        w.append_batch(records(3)).unwrap();
        let target = w.sync_target().unwrap();
        // Written after the fsync began: not covered by it.
        w.append_batch(records(2)).unwrap();
        let done = std::thread::spawn(move || handle.sync_data()).join().unwrap();
        w.sync_done(target, done).unwrap();
        assert_eq!(w.synced_position().offset, target);
        assert!(w.synced_position() < w.position());

        let failed = io::Error::other("the disk is gone");
        let err = w.sync_done(w.sync_target().unwrap(), Err(failed)).unwrap_err();
        assert!(err.to_string().contains("fsyncing"), "{err}");
        // As after a failed `sync`: the writer refuses everything after.
        let refused = w.append_batch(records(1)).unwrap_err();
        assert!(refused.to_string().contains("fsync failed"), "{refused}");
    }

    #[test]
    fn create_refuses_existing_segment() {
        let dir = TempDir::new();
        LogWriter::create(dir.path(), 0, 1).unwrap();
        let err = LogWriter::create(dir.path(), 0, 1).err().unwrap();
        assert_eq!(err.kind(), io::ErrorKind::AlreadyExists);
        assert_eq!(list_segments(dir.path(), 0).unwrap().len(), 1);
    }

    #[test]
    fn oversized_record_is_refused_and_file_unchanged() {
        let dir = TempDir::new();
        let mut w = LogWriter::create(dir.path(), 0, 1).unwrap();
        let big = vec![0u8; MAX_RECORD_LEN as usize + 1];
        let err = w.append_batch([&b"ok"[..], &big[..]]).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::InvalidInput);
        assert_eq!(w.position().offset, SEGMENT_HEADER_LEN);
        assert!(!w.is_failed());
    }

    #[test]
    fn reopen_appends_after_last_record() {
        let dir = TempDir::new();
        let path = {
            let mut w = LogWriter::create(dir.path(), 2, 5).unwrap();
            w.append_batch(records(10)).unwrap();
            w.sync().unwrap();
            w.path().to_owned()
        };
        let mut w = LogWriter::open(&path).unwrap();
        w.append_batch(records(3)).unwrap();
        w.sync().unwrap();
        let (got, _) = read_all(&path).unwrap();
        assert_eq!(got.len(), 13);
        assert_eq!(got[10..], records(3)[..]);
    }

    #[test]
    fn rotate_and_compact() {
        let dir = TempDir::new();
        let mut w = LogWriter::create(dir.path(), 1, FIRST_SEGMENT_SEQ).unwrap();
        w.append(b"a").unwrap();
        let pos = w.rotate().unwrap();
        assert_eq!(pos, LogPosition::segment_start(FIRST_SEGMENT_SEQ + 1));
        w.append(b"b").unwrap();
        w.rotate().unwrap();
        // Another partition's segment is never touched.
        LogWriter::create(dir.path(), 2, FIRST_SEGMENT_SEQ).unwrap();
        let seqs: Vec<u64> = list_segments(dir.path(), 1).unwrap().iter().map(|s| s.seq).collect();
        assert_eq!(seqs, [1, 2, 3]);
        let deleted = delete_segments_before(dir.path(), 1, 3).unwrap();
        assert_eq!(deleted.len(), 2);
        let seqs: Vec<u64> = list_segments(dir.path(), 1).unwrap().iter().map(|s| s.seq).collect();
        assert_eq!(seqs, [3]);
        assert_eq!(list_segments(dir.path(), 2).unwrap().len(), 1);
    }

    #[test]
    fn open_at_skips_to_position() {
        let dir = TempDir::new();
        let mut w = LogWriter::create(dir.path(), 0, 1).unwrap();
        w.append_batch(records(5)).unwrap();
        let mid = w.position();
        w.append_batch(records(2)).unwrap();
        let mut s = SegmentScanner::open_at(w.path(), mid.offset).unwrap();
        let mut n = 0;
        while s.next_record().unwrap().is_some() {
            n += 1;
        }
        assert_eq!(n, 2);
    }

    #[test]
    fn header_damage_is_corruption_at_offset_zero() {
        let dir = TempDir::new();
        let mut w = LogWriter::create(dir.path(), 0, 1).unwrap();
        w.append(b"x").unwrap();
        let mut bytes = fs::read(w.path()).unwrap();
        bytes[13] ^= 1;
        fs::write(w.path(), &bytes).unwrap();
        let err = SegmentScanner::open(w.path()).err().unwrap();
        let c = Corruption::from_io(&err).unwrap();
        assert_eq!(c.offset, 0);
        assert!(err.to_string().contains("log-0-"), "{err}");
    }
}
