//! A shard replica's Raft storage: raft-rs' in-memory log, backed by append-only files of
//! checksummed records (the op log's segment format) that are replayed at start, and by the
//! group's latest Raft snapshot.
//!
//! Each record is one tag byte and a protobuf message: an entry, the hard state (term, vote,
//! commit) or the configuration. Appending an entry whose index is already held truncates
//! the log there, on disk as in memory, because the replay appends the same way.
//!
//! # Snapshots and compaction
//!
//! A snapshot (the state machine as of entry `S`: its index, term, configuration and data)
//! is installed in three durable steps: the log moves to a new segment that starts with the
//! hard state, the configuration and a copy of the entries after `S`; the snapshot is written
//! as `snap-<group>-<new segment>-0.sps` (the op log's snapshot file format, whose body is the
//! protobuf `Snapshot`); then the snapshots but the newest two are deleted, and the segments
//! before the older one kept. At start, the newest snapshot that passes its checks is loaded
//! and the segments from its own on are replayed, so a crash between any two steps recovers
//! the same log (before the snapshot exists, the older segments still hold every entry).
//!
//! The body's protobuf `Snapshot` has its metadata first and its data (a partition's
//! snapshot body) last, so the data is streamed in and out of the file: a replica keeps only
//! the metadata in memory, and reads the data when it rebuilds its partition or a peer needs
//! the snapshot. (Protobuf allows fields in any order; a body with its data first still reads.)
//!
//! The snapshot raft-rs gets from [`RaftStorage`] names the file instead of holding the data
//! ([`file_data`]): the peer link streams the file to the peer, which writes it to a file of
//! its own and hands raft-rs a snapshot naming that one (see `peers` and `connection`).

use std::fs::File;
use std::io::{self, Read, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, RwLock};

use protobuf::Message as _;
use raft::prelude::{ConfState, Entry, HardState, Snapshot, SnapshotMetadata};
use raft::storage::MemStorage;
use raft::{GetEntriesContext, RaftState, StorageError};
use spindle_storage::{self as storage, LogPosition, LogWriter, ScanEnd, SegmentScanner};
use tracing::warn;

const ENTRY: u8 = 1;
const HARD_STATE: u8 = 2;
const CONF_STATE: u8 = 3;
/// Snapshots kept on disk: if the newest is damaged, the older one and the log after it
/// still rebuild the state.
const SNAPSHOTS_KEPT: usize = 2;

/// The largest snapshot metadata read (a configuration: a few node ids).
const MAX_METADATA_LEN: u64 = 1 << 20;

/// A snapshot's data on its way to [`Store::install`]: in memory (a leader's, the metadata
/// group's), or a file a capture wrote (a shard's partition body), deleted once installed.
pub(crate) enum SnapshotData {
    Bytes(Vec<u8>),
    File(PathBuf),
}

impl SnapshotData {
    /// The data, read as it is consumed.
    pub(crate) fn reader(&self) -> io::Result<Box<dyn Read + '_>> {
        Ok(match self {
            SnapshotData::Bytes(bytes) => Box::new(&bytes[..]),
            SnapshotData::File(path) => Box::new(io::BufReader::with_capacity(1 << 20, File::open(path)?)),
        })
    }
}

/// The latest snapshot: its metadata, and the file holding its data (none yet: `None`).
#[derive(Clone, Default)]
struct Latest {
    snapshot: Snapshot,
    path: Option<PathBuf>,
    data_len: u64,
    /// Peers failed to take it again and again (a damaged file?): a newer one is needed.
    refused: bool,
}

/// Starts the data of a Raft snapshot that names a file of this node instead of holding
/// the data. Such a snapshot never leaves the node as it is: the link to a peer streams the
/// file's data, and the peer's own snapshot names the file it wrote.
const FILE_DATA: &[u8] = b"\0spindle snapshot file\0";

/// The data of a Raft snapshot that stands for the snapshot data in file `path`.
pub(crate) fn file_data(path: &Path) -> Vec<u8> {
    use std::os::unix::ffi::OsStrExt;
    [FILE_DATA, path.as_os_str().as_bytes()].concat()
}

/// The file a Raft snapshot's `data` names ([`file_data`]), if it names one.
pub(crate) fn data_file(data: &[u8]) -> Option<PathBuf> {
    use std::os::unix::ffi::OsStrExt;
    let path = data.strip_prefix(FILE_DATA)?;
    Some(PathBuf::from(std::ffi::OsStr::from_bytes(path)))
}

/// Prefix of the files snapshots from the leader of `group` are received into.
fn incoming_prefix(group: u32) -> String {
    format!("snap-{group}-incoming-")
}

/// The file the `n`th snapshot received for `group` is written to.
pub(crate) fn incoming_file(dir: &Path, group: u32, n: u64) -> PathBuf {
    dir.join(format!("{}{n}.tmp", incoming_prefix(group)))
}

/// What raft-rs reads: the in-memory log, and the latest snapshot for peers that need the
/// entries compacted away.
#[derive(Clone)]
pub(crate) struct RaftStorage {
    pub(crate) mem: MemStorage,
    latest: Arc<RwLock<Latest>>,
    /// A peer needs a newer snapshot than the latest (see `snapshot`).
    wanted: Arc<AtomicBool>,
}

impl raft::Storage for RaftStorage {
    fn initial_state(&self) -> raft::Result<RaftState> {
        self.mem.initial_state()
    }

    fn entries(
        &self,
        low: u64,
        high: u64,
        max_size: impl Into<Option<u64>>,
        context: GetEntriesContext,
    ) -> raft::Result<Vec<Entry>> {
        self.mem.entries(low, high, max_size, context)
    }

    fn term(&self, idx: u64) -> raft::Result<u64> {
        self.mem.term(idx)
    }

    fn first_index(&self) -> raft::Result<u64> {
        self.mem.first_index()
    }

    fn last_index(&self) -> raft::Result<u64> {
        self.mem.last_index()
    }

    /// The latest snapshot, if it can serve peer `to`. A replica added after it is not in
    /// its configuration and would refuse it: a newer one is asked for, and raft-rs asks
    /// again later.
    fn snapshot(&self, request_index: u64, to: u64) -> raft::Result<Snapshot> {
        let latest = self.latest.read().unwrap_or_else(|e| e.into_inner());
        let meta = latest.snapshot.get_metadata();
        let conf = meta.get_conf_state();
        let member = [&conf.voters, &conf.learners, &conf.voters_outgoing, &conf.learners_next]
            .iter()
            .any(|ids| ids.contains(&to));
        if meta.index == 0 || meta.index < request_index || !member || latest.refused {
            self.wanted.store(true, Ordering::Release);
            return Err(raft::Error::Store(StorageError::SnapshotTemporarilyUnavailable));
        }
        let mut snapshot = latest.snapshot.clone();
        if let Some(path) = &latest.path {
            snapshot.set_data(file_data(path).into());
        }
        Ok(snapshot)
    }
}

/// The on-disk log of one shard's replica, with the in-memory copy raft-rs reads. Records
/// are buffered and written in one go by [`flush`](Store::flush) (one `write` per `Ready`),
/// in the order they were made.
pub(crate) struct Store {
    pub(crate) mem: MemStorage,
    latest: Arc<RwLock<Latest>>,
    wanted: Arc<AtomicBool>,
    dir: PathBuf,
    group: u32,
    file: LogWriter,
    /// The log file's handle for fsyncs on another thread (see `flush_for_sync`).
    sync_file: Arc<File>,
    pending: Vec<Vec<u8>>,
    /// Bytes of entries written since the last snapshot (when to take the next).
    since_snapshot: u64,
}

impl Store {
    /// Open the log of shard `group` in `dir` (created empty if missing).
    pub(crate) fn open(dir: &Path, group: u32) -> io::Result<Store> {
        std::fs::create_dir_all(dir)?;
        let mem = MemStorage::new();
        // Captures a crash interrupted, and snapshots received and never installed.
        for entry in std::fs::read_dir(dir)?.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            if name.starts_with(&incoming_prefix(group)) || name.starts_with(&capture_prefix(group)) {
                let _ = std::fs::remove_file(entry.path());
            }
        }
        // Checked whole (streaming), then only its metadata is read.
        let (found, rejected) = storage::latest_valid_snapshot(dir, group)?;
        for r in rejected {
            warn!(
                shard = group,
                "ignoring snapshot {}: {} (using an older one and more of the log)",
                r.path.display(),
                r.reason
            );
        }
        let mut latest = Latest::default();
        let mut from_seq = storage::FIRST_SEGMENT_SEQ;
        if let Some(info) = found {
            let (metadata, _, data_len) = open_snapshot_file(&info.path)?;
            latest.snapshot.set_metadata(metadata);
            (latest.path, latest.data_len) = (Some(info.path), data_len);
            mem.wl()
                .apply_snapshot(latest.snapshot.clone())
                .map_err(io::Error::other)?;
            from_seq = info.position.seq;
        }
        let (segments, since_snapshot) = load_segments(&mem, dir, group, from_seq, |path, offset| {
            let cut = storage::truncate_torn_tail(path, offset)?;
            warn!(
                shard = group,
                "cut a torn record of {cut} bytes at the end of {} (a write the crash interrupted)",
                path.display()
            );
            Ok(())
        })?;
        let file = match segments.last() {
            Some(segment) => LogWriter::open(&segment.path)?,
            None => LogWriter::create(dir, group, from_seq)?,
        };
        Ok(Store {
            mem,
            latest: Arc::new(RwLock::new(latest)),
            wanted: Arc::new(AtomicBool::new(false)),
            dir: dir.to_path_buf(),
            group,
            sync_file: Arc::new(file.sync_handle()?),
            file,
            pending: Vec::new(),
            since_snapshot,
        })
    }

    /// What raft-rs reads.
    pub(crate) fn storage(&self) -> RaftStorage {
        RaftStorage {
            mem: self.mem.clone(),
            latest: self.latest.clone(),
            wanted: self.wanted.clone(),
        }
    }

    /// Send peers no more of the latest snapshot: they get a newer one, asked for here.
    pub(crate) fn refuse_latest(&self) {
        self.latest.write().unwrap_or_else(|e| e.into_inner()).refused = true;
        self.wanted.store(true, Ordering::Release);
    }

    pub(crate) fn latest_refused(&self) -> bool {
        self.latest.read().unwrap_or_else(|e| e.into_inner()).refused
    }

    /// Whether a peer asked for a newer snapshot than the latest (the request is taken).
    pub(crate) fn take_wanted(&self) -> bool {
        self.wanted.swap(false, Ordering::AcqRel)
    }

    /// Whether nothing was ever stored (a new replica).
    pub(crate) fn is_empty(&self) -> bool {
        self.mem.rl().hard_state().term == 0 && last_index(&self.mem) == 0
    }

    fn latest(&self) -> std::sync::RwLockReadGuard<'_, Latest> {
        self.latest.read().unwrap_or_else(|e| e.into_inner())
    }

    /// The latest snapshot's metadata (index 0: none yet).
    pub(crate) fn snapshot_metadata(&self) -> SnapshotMetadata {
        self.latest().snapshot.get_metadata().clone()
    }

    /// Bytes of the latest snapshot's data.
    pub(crate) fn snapshot_len(&self) -> u64 {
        self.latest().data_len
    }

    /// The latest snapshot's data, read from its file as it is consumed (`None`: no
    /// snapshot yet).
    pub(crate) fn snapshot_data(&self) -> io::Result<Option<DataReader>> {
        match &self.latest().path {
            Some(path) => Ok(Some(open_snapshot_file(path)?.1)),
            None => Ok(None),
        }
    }

    /// The state `load` makes of the latest snapshot's data (`None`: no snapshot yet) and
    /// the entries after it up to `to`. Should that fail (a snapshot damaged since it was
    /// written), the state it makes of the newest older snapshot and the log kept behind
    /// it, which hold the same state.
    pub(crate) fn restore_state<T>(
        &mut self,
        to: u64,
        mut load: impl FnMut(Option<DataReader>, Vec<Entry>) -> Result<T, String>,
    ) -> Result<T, String> {
        let latest = self.snapshot_data().map_err(|e| e.to_string());
        let why = match latest.and_then(|data| load(data, self.entries(1, to))) {
            Ok(state) => return Ok(state),
            Err(why) => why,
        };
        warn!(
            shard = self.group,
            "the latest snapshot does not restore ({why}); trying the one before"
        );
        match self.older_state(to) {
            Ok(Some((data, entries))) => load(Some(data), entries).map_err(|e| format!("{why}; the one before: {e}")),
            Ok(None) => Err(why),
            Err(e) => Err(format!("{why}; the one before cannot be read: {e}")),
        }
    }

    /// The newest snapshot other than the latest that passes its checks, and the entries
    /// after it up to `to`, read back from the log kept on disk behind it. `None` without one.
    fn older_state(&mut self, to: u64) -> io::Result<Option<(DataReader, Vec<Entry>)>> {
        self.flush()?;
        let latest = self.latest().path.clone();
        let mut older = storage::list_snapshots(&self.dir, self.group)?;
        older.retain(|(_, path)| Some(path) != latest.as_ref());
        let Some((position, path)) = older
            .into_iter()
            .rev()
            .find(|(_, path)| storage::verify_snapshot(path).is_ok())
        else {
            return Ok(None);
        };
        let (metadata, data, _) = open_snapshot_file(&path)?;
        let from = metadata.index + 1;
        let mem = MemStorage::new();
        let mut snapshot = Snapshot::default();
        snapshot.set_metadata(metadata);
        mem.wl().apply_snapshot(snapshot).map_err(io::Error::other)?;
        // (A torn tail is this replica's live segment being written: left as it is.)
        load_segments(&mem, &self.dir, self.group, position.seq, |_, _| Ok(()))?;
        // Up to the latest snapshot, the log behind the older one must be the log the latest
        // covers (the same entry at its index: the same log before it); after it, the
        // entries are this replica's own.
        let covered = self.snapshot_metadata();
        if raft::Storage::term(&mem, covered.index).ok() != Some(covered.term) {
            return Ok(None); // gone, or another log (a leader's snapshot was installed)
        }
        let mut entries = raft::Storage::entries(&mem, from, covered.index + 1, None, GetEntriesContext::empty(false))
            .map_err(io::Error::other)?;
        entries.extend(self.entries(covered.index + 1, to));
        Ok(Some((data, entries)))
    }

    /// Where capture `id` writes the body of a snapshot of this group (a temp file: one left
    /// by a crash is removed at start).
    pub(crate) fn capture_path(&self, id: u64) -> PathBuf {
        self.dir.join(format!("{}{id}.tmp", capture_prefix(self.group)))
    }

    /// Bytes of entries written since the last snapshot.
    pub(crate) fn since_snapshot(&self) -> u64 {
        self.since_snapshot
    }

    pub(crate) fn append(&mut self, entries: &[Entry]) -> io::Result<()> {
        if entries.is_empty() {
            return Ok(());
        }
        let records: Vec<Vec<u8>> = entries.iter().map(|e| encode(ENTRY, e)).collect();
        self.since_snapshot += records.iter().map(|r| r.len() as u64).sum::<u64>();
        self.pending.extend(records);
        self.mem.wl().append(entries).map_err(io::Error::other)
    }

    pub(crate) fn set_hard_state(&mut self, hs: &HardState) -> io::Result<()> {
        self.pending.push(encode(HARD_STATE, hs));
        self.mem.wl().set_hardstate(hs.clone());
        Ok(())
    }

    /// Record the commit index (raft-rs reports it apart from the hard state).
    pub(crate) fn set_commit(&mut self, commit: u64) -> io::Result<()> {
        let mut hs = self.mem.rl().hard_state().clone();
        hs.commit = commit;
        self.set_hard_state(&hs)
    }

    pub(crate) fn set_conf_state(&mut self, cs: &ConfState) -> io::Result<()> {
        self.pending.push(encode(CONF_STATE, cs));
        self.mem.wl().set_conf_state(cs.clone());
        Ok(())
    }

    /// Write the buffered records (to the OS: a crash of the process loses none of them).
    pub(crate) fn flush(&mut self) -> io::Result<()> {
        if !self.pending.is_empty() {
            self.file.append_batch(&self.pending)?;
            self.pending.clear();
        }
        Ok(())
    }

    /// Write the buffered records. Returns the log file, to make them durable with
    /// `sync_data` off this thread (an fsync may take milliseconds), and the end of the
    /// data that makes durable, for `synced`.
    pub(crate) fn flush_for_sync(&mut self) -> io::Result<(Arc<File>, u64)> {
        self.flush()?;
        Ok((self.sync_file.clone(), self.file.sync_target()?))
    }

    /// How the fsync of `flush_for_sync` went (a failed one fails every later write).
    pub(crate) fn synced(&mut self, target: u64, result: io::Result<()>) -> io::Result<()> {
        self.file.sync_done(target, result)
    }

    /// Write the buffered records and make everything written durable.
    pub(crate) fn sync(&mut self) -> io::Result<()> {
        self.flush()?;
        self.file.sync()
    }

    /// Install `snapshot` (its metadata names the entry it covers), on disk and then in
    /// memory. A snapshot this replica took keeps the entries after it; one a leader sent
    /// (`from_leader`) replaces the whole log, as raft-rs expects.
    pub(crate) fn install(
        &mut self,
        metadata: SnapshotMetadata,
        data: SnapshotData,
        from_leader: bool,
    ) -> io::Result<()> {
        let index = metadata.index;
        // The current segment complete before the log moves on.
        self.sync()?;
        // The new segment keeps the current hard state (its vote above all): the snapshot
        // does not exist yet when it is written. Loading a snapshot raises the commit index.
        // So does the configuration: the start of a restarted group replays the membership
        // changes after the snapshot onto the snapshot's.
        let hs = self.mem.rl().hard_state().clone();
        let conf = raft::Storage::initial_state(&self.mem)
            .map_err(io::Error::other)?
            .conf_state;
        let kept = match from_leader {
            true => Vec::new(),
            false => self.entries(index + 1, u64::MAX),
        };
        let seq = self.file.header().seq + 1;
        let mut file = LogWriter::create(&self.dir, self.group, seq)?;
        let mut records = vec![encode(HARD_STATE, &hs), encode(CONF_STATE, &conf)];
        records.extend(kept.iter().map(|e| encode(ENTRY, e)));
        file.append_batch(&records)?;
        file.sync()?;
        let position = LogPosition::segment_start(seq);
        let (written, data_len) = match &data {
            SnapshotData::Bytes(bytes) => {
                let len = bytes.len() as u64;
                let written = write_snapshot_file(&self.dir, self.group, position, &metadata, &mut &bytes[..], len)?;
                (written, len)
            }
            SnapshotData::File(path) => {
                let mut file = File::open(path)?;
                let len = file.metadata()?.len();
                (
                    write_snapshot_file(&self.dir, self.group, position, &metadata, &mut file, len)?,
                    len,
                )
            }
        };
        if let SnapshotData::File(path) = &data {
            let _ = std::fs::remove_file(path);
        }
        let mut snapshot = Snapshot::default();
        snapshot.set_metadata(metadata);
        {
            let mut core = self.mem.wl();
            core.apply_snapshot(snapshot.clone()).map_err(io::Error::other)?;
            if !from_leader {
                core.append(&kept).map_err(io::Error::other)?;
                core.set_hardstate(hs);
                core.set_conf_state(conf);
            }
        }
        *self.latest.write().unwrap_or_else(|e| e.into_inner()) = Latest {
            snapshot,
            data_len,
            path: Some(written.path.clone()),
            refused: false,
        };
        self.sync_file = Arc::new(file.sync_handle()?);
        self.file = file;
        self.since_snapshot = 0;
        // Behind the older of the two kept only: if the newest is ever damaged, the older one
        // and the log after it still rebuild the state. Not so past a leader's snapshot (the
        // log has a gap before it): only it is kept.
        let keep = if from_leader { 1 } else { SNAPSHOTS_KEPT };
        let oldest_kept = storage::prune_snapshots(&self.dir, self.group, keep)?;
        if let Some(floor) = oldest_kept.filter(|floor| from_leader || *floor < written.position) {
            storage::delete_segments_before(&self.dir, self.group, floor.seq)?;
        }
        Ok(())
    }

    /// The entries from `from` on, up to `to` (inclusive), of those held (after the snapshot).
    pub(crate) fn entries(&self, from: u64, to: u64) -> Vec<Entry> {
        let first = raft::Storage::first_index(&self.mem).unwrap_or(1).max(from);
        let last = last_index(&self.mem).min(to);
        if first > last {
            return Vec::new();
        }
        raft::Storage::entries(&self.mem, first, last + 1, None, raft::GetEntriesContext::empty(false))
            .unwrap_or_default()
    }
}

/// Prefix of the files snapshots of `group` are captured into (one per capture).
fn capture_prefix(group: u32) -> String {
    format!("snap-{group}-capture-")
}

/// Write snapshot file `pos` of `group`: a protobuf `Snapshot`, `metadata` first, then the
/// `len` bytes of `data`, streamed.
fn write_snapshot_file(
    dir: &Path,
    group: u32,
    pos: LogPosition,
    metadata: &SnapshotMetadata,
    data: &mut dyn Read,
    len: u64,
) -> io::Result<storage::SnapshotInfo> {
    let mut head = Vec::new();
    {
        let mut out = protobuf::CodedOutputStream::vec(&mut head);
        let metadata = metadata.write_to_bytes().map_err(io::Error::other)?;
        out.write_bytes(2, &metadata).map_err(io::Error::other)?;
        out.write_tag(1, protobuf::wire_format::WireTypeLengthDelimited)
            .map_err(io::Error::other)?;
        out.write_raw_varint64(len).map_err(io::Error::other)?;
        out.flush().map_err(io::Error::other)?;
    }
    let mut file = storage::begin_snapshot(dir, group, pos)?;
    file.write_all(&head)?;
    let copied = io::copy(&mut data.take(len), &mut file)?;
    if copied != len {
        return Err(io::Error::new(
            io::ErrorKind::UnexpectedEof,
            format!("a snapshot's data ended after {copied} of {len} bytes"),
        ));
    }
    file.finish()
}

/// A snapshot's data, read from its file as it is consumed.
pub(crate) type DataReader = Box<dyn Read + Send>;

/// Open snapshot file `path`: its metadata, and its data as a reader with the data's length
/// (checked against the file's checksum once read to the end).
pub(crate) fn open_snapshot_file(path: &Path) -> io::Result<(SnapshotMetadata, DataReader, u64)> {
    let invalid = |why: String| {
        io::Error::new(
            io::ErrorKind::InvalidData,
            format!("snapshot {}: {why}", path.display()),
        )
    };
    let mut body = storage::SnapshotReader::open(path)?;
    let mut metadata = None;
    let mut data: Option<Vec<u8>> = None;
    loop {
        let tag = match read_varint(&mut body) {
            Ok(tag) => tag,
            // The end of the body: a body written data first (read whole above), or with no
            // data at all (protobuf leaves empty bytes out).
            Err(e) if e.kind() == io::ErrorKind::UnexpectedEof && metadata.is_some() => break,
            Err(e) => return Err(e),
        };
        if tag & 7 != 2 {
            return Err(invalid(format!("a field of wire type {} in the Snapshot", tag & 7)));
        }
        let len = read_varint(&mut body)?;
        match (tag >> 3, &metadata) {
            (2, _) if len <= MAX_METADATA_LEN => {
                let mut bytes = vec![0; len as usize];
                body.read_exact(&mut bytes)?;
                metadata = Some(SnapshotMetadata::parse_from_bytes(&bytes).map_err(|e| invalid(e.to_string()))?);
                if data.is_some() {
                    break;
                }
            }
            // The data last: streamed from here.
            (1, Some(metadata)) => return Ok((metadata.clone(), Box::new(body.take(len)), len)),
            (1, None) => {
                let mut bytes = Vec::new();
                body.by_ref().take(len).read_to_end(&mut bytes)?;
                data = Some(bytes);
            }
            (2, _) => return Err(invalid(format!("metadata of {len} bytes (at most {MAX_METADATA_LEN})"))),
            (field, _) => return Err(invalid(format!("an unexpected field {field} of {len} bytes"))),
        }
    }
    let (Some(metadata), data) = (metadata, data.unwrap_or_default()) else {
        return Err(invalid("no metadata".into()));
    };
    let len = data.len() as u64;
    Ok((metadata, Box::new(io::Cursor::new(data)), len))
}

/// A protobuf varint.
fn read_varint(r: &mut impl Read) -> io::Result<u64> {
    let mut value = 0u64;
    for shift in (0..64).step_by(7) {
        let mut byte = [0u8];
        r.read_exact(&mut byte)?;
        value |= u64::from(byte[0] & 0x7f) << shift;
        if byte[0] & 0x80 == 0 {
            return Ok(value);
        }
    }
    Err(io::Error::new(
        io::ErrorKind::InvalidData,
        "a varint longer than 10 bytes",
    ))
}

fn last_index(mem: &MemStorage) -> u64 {
    raft::Storage::last_index(mem).unwrap_or(0)
}

fn encode(tag: u8, message: &dyn protobuf::Message) -> Vec<u8> {
    // Sized first (the stream would grow it a doubling at a time, copying an entry's data
    // each time), with a byte to spare: the stream's last flush reserves one.
    let mut out = Vec::with_capacity(message.compute_size() as usize + 2);
    out.push(tag);
    // Writing a well-formed message to a Vec cannot fail (its sizes are cached above).
    let mut os = protobuf::CodedOutputStream::vec(&mut out);
    message
        .write_to_with_cached_sizes(&mut os)
        .and_then(|()| os.flush())
        .expect("protobuf encoding to memory");
    drop(os);
    out
}

/// Load the records of `group`'s log segments from sequence `from_seq` on into `mem`, in
/// order; `torn` is told of each segment whose last record is torn (path, offset). Returns
/// the segments and the bytes of records loaded.
fn load_segments(
    mem: &MemStorage,
    dir: &Path,
    group: u32,
    from_seq: u64,
    mut torn: impl FnMut(&Path, u64) -> io::Result<()>,
) -> io::Result<(Vec<storage::SegmentInfo>, u64)> {
    let segments: Vec<_> = storage::list_segments(dir, group)?
        .into_iter()
        .filter(|s| s.seq >= from_seq)
        .collect();
    let mut bytes = 0;
    for segment in &segments {
        let mut scan = SegmentScanner::open(&segment.path)?;
        while let Some((offset, record)) = scan.next_record()? {
            bytes += record.len() as u64;
            load(mem, record).map_err(|why| {
                io::Error::new(
                    io::ErrorKind::InvalidData,
                    format!("{} at byte offset {offset}: {why}", segment.path.display()),
                )
            })?;
        }
        if let Some(ScanEnd::Torn(tail)) = scan.end() {
            torn(&segment.path, tail.offset)?;
        }
    }
    Ok((segments, bytes))
}

fn load(mem: &MemStorage, record: &[u8]) -> Result<(), String> {
    let (tag, body) = record.split_first().ok_or("an empty record")?;
    let bad = |e: protobuf::ProtobufError| format!("a record that does not decode: {e}");
    match *tag {
        ENTRY => {
            let entry = Entry::parse_from_bytes(body).map_err(bad)?;
            if entry.index < raft::Storage::first_index(mem).unwrap_or(1) {
                return Ok(()); // covered by the snapshot
            }
            let last = last_index(mem);
            if entry.index > last + 1 || entry.index == 0 {
                return Err(format!(
                    "entry {} does not follow entry {last} (if a damaged snapshot was skipped, the log \
                     before this entry is gone: remove the node with `spindle cluster remove`, clear its \
                     data directory and join it again)",
                    entry.index
                ));
            }
            mem.wl().append(&[entry]).map_err(|e| e.to_string())
        }
        HARD_STATE => {
            let mut hs = HardState::parse_from_bytes(body).map_err(bad)?;
            // Everything a snapshot covers is committed (its segment's hard state may predate it).
            let snapshot_index = raft::Storage::first_index(mem).unwrap_or(1) - 1;
            if snapshot_index > 0 {
                hs.commit = hs.commit.max(snapshot_index);
                hs.term = hs.term.max(raft::Storage::term(mem, snapshot_index).unwrap_or(0));
            }
            mem.wl().set_hardstate(hs);
            Ok(())
        }
        CONF_STATE => {
            mem.wl().set_conf_state(ConfState::parse_from_bytes(body).map_err(bad)?);
            Ok(())
        }
        other => Err(format!("unknown record tag {other}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(index: u64, term: u64, data: &[u8]) -> Entry {
        Entry {
            index,
            term,
            data: data.to_vec().into(),
            ..Default::default()
        }
    }

    fn temp_dir(name: &str) -> std::path::PathBuf {
        let dir = std::env::temp_dir().join(format!("spindle-store-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        dir
    }

    fn metadata(index: u64, term: u64, voters: Vec<u64>) -> SnapshotMetadata {
        let mut metadata = SnapshotMetadata::default();
        (metadata.index, metadata.term) = (index, term);
        metadata.mut_conf_state().voters = voters;
        metadata
    }

    fn install(store: &mut Store, index: u64, term: u64, voters: Vec<u64>, data: &[u8], from_leader: bool) {
        let data = SnapshotData::Bytes(data.to_vec());
        store.install(metadata(index, term, voters), data, from_leader).unwrap();
    }

    /// The latest snapshot's data, read from its file.
    fn data(store: &Store) -> Vec<u8> {
        let mut bytes = Vec::new();
        store.snapshot_data().unwrap().unwrap().read_to_end(&mut bytes).unwrap();
        bytes
    }

    /// Entries 1..=10 of term 1, committed to 8, voted for node 2, voters [1, 2].
    fn ten_entries(dir: &Path) -> Store {
        let mut store = Store::open(dir, 0).unwrap();
        let entries: Vec<Entry> = (1..=10).map(|i| entry(i, 1, format!("e{i}").as_bytes())).collect();
        store.append(&entries).unwrap();
        store
            .set_hard_state(&HardState {
                term: 1,
                vote: 2,
                commit: 8,
                ..Default::default()
            })
            .unwrap();
        store
            .set_conf_state(&ConfState {
                voters: vec![1, 2],
                ..Default::default()
            })
            .unwrap();
        store.sync().unwrap();
        store
    }

    fn data_of(entries: &[Entry]) -> Vec<String> {
        entries
            .iter()
            .map(|e| String::from_utf8_lossy(&e.data).into_owned())
            .collect()
    }

    #[test]
    fn a_snapshot_compacts_the_log_and_a_reopen_loads_it_with_the_entries_after_it() {
        let dir = temp_dir("compact");
        let mut store = ten_entries(&dir);
        for (at, name) in [(4, "first"), (6, "second"), (8, "third")] {
            install(&mut store, at, 1, vec![1, 2], name.as_bytes(), false);
        }
        assert_eq!(data_of(&store.entries(1, 100)), ["e9", "e10"]);
        assert_eq!(store.since_snapshot(), 0, "the count starts again");
        // Two snapshots kept, and the segments before the older of them deleted.
        let snaps = storage::list_snapshots(&dir, 0).unwrap();
        assert_eq!(snaps.len(), 2);
        let first_segment = storage::list_segments(&dir, 0).unwrap()[0].seq;
        assert_eq!(first_segment, snaps[0].0.seq);
        drop(store);
        let store = Store::open(&dir, 0).unwrap();
        assert_eq!(data(&store), b"third");
        assert_eq!(store.snapshot_len(), 5);
        assert_eq!(data_of(&store.entries(1, 100)), ["e9", "e10"]);
        let state = raft::Storage::initial_state(&store.storage()).unwrap();
        assert_eq!(
            (state.hard_state.term, state.hard_state.vote, state.hard_state.commit),
            (1, 2, 8)
        );
        assert_eq!(state.conf_state.voters, vec![1, 2]);
        assert_eq!(raft::Storage::term(&store.storage(), 8).unwrap(), 1);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_crash_before_the_snapshot_file_is_written_recovers_the_whole_log() {
        let dir = temp_dir("crash");
        let mut store = ten_entries(&dir);
        install(&mut store, 6, 1, vec![1, 2], b"s", false);
        drop(store);
        // As if the process died after the new segment and before the snapshot file.
        for (_, path) in storage::list_snapshots(&dir, 0).unwrap() {
            std::fs::remove_file(path).unwrap();
        }
        let store = Store::open(&dir, 0).unwrap();
        assert_eq!(store.snapshot_metadata().index, 0);
        assert!(store.snapshot_data().unwrap().is_none());
        assert_eq!(data_of(&store.entries(1, 100)).len(), 10);
        assert_eq!(store.mem.rl().hard_state().commit, 8);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_leaders_snapshot_replaces_the_log_and_keeps_the_vote() {
        let dir = temp_dir("received");
        let mut store = ten_entries(&dir);
        install(&mut store, 4, 1, vec![1, 2], b"own", false);
        install(&mut store, 20, 3, vec![1, 2, 3], b"leader's", true);
        assert!(store.entries(1, 100).is_empty());
        // The log before a leader's snapshot has a gap: no older snapshot or segment is kept.
        let snaps = storage::list_snapshots(&dir, 0).unwrap();
        assert_eq!(snaps.len(), 1);
        assert_eq!(storage::list_segments(&dir, 0).unwrap()[0].seq, snaps[0].0.seq);
        store.append(&[entry(21, 3, b"e21")]).unwrap();
        store.sync().unwrap();
        drop(store);
        let store = Store::open(&dir, 0).unwrap();
        assert_eq!(data(&store), b"leader's");
        assert_eq!(data_of(&store.entries(1, 100)), ["e21"]);
        let state = raft::Storage::initial_state(&store.storage()).unwrap();
        // The commit index and term are at least the snapshot's; the vote is kept.
        assert_eq!(
            (state.hard_state.term, state.hard_state.vote, state.hard_state.commit),
            (3, 2, 20)
        );
        // (A group's start takes its configuration from the snapshot and the changes after it.)
        assert_eq!(store.snapshot_metadata().get_conf_state().voters, vec![1, 2, 3]);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_peer_outside_the_snapshots_configuration_asks_for_a_newer_one() {
        let dir = temp_dir("wanted");
        let mut store = ten_entries(&dir);
        let storage = store.storage();
        assert!(raft::Storage::snapshot(&storage, 0, 2).is_err(), "no snapshot yet");
        assert!(store.take_wanted());
        install(&mut store, 8, 1, vec![1, 2], b"s", false);
        // The snapshot names its file (a link streams the data from there).
        let sent = raft::Storage::snapshot(&storage, 0, 2).unwrap();
        let path = data_file(sent.get_data()).expect("names a file");
        let (metadata, mut data, _) = open_snapshot_file(&path).unwrap();
        let mut bytes = Vec::new();
        data.read_to_end(&mut bytes).unwrap();
        assert_eq!((metadata.index, bytes), (8, b"s".to_vec()));
        assert!(data_file(b"plain data").is_none());
        assert!(!store.take_wanted());
        assert!(
            raft::Storage::snapshot(&storage, 0, 3).is_err(),
            "node 3 was added after it"
        );
        assert!(store.take_wanted());
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_captured_file_is_streamed_in_and_a_body_with_its_data_first_still_reads() {
        let dir = temp_dir("stream");
        let mut store = ten_entries(&dir);
        let capture = store.capture_path(1);
        let body: Vec<u8> = (0..3_000_000u32).map(|i| (i % 251) as u8).collect();
        std::fs::write(&capture, &body).unwrap();
        store
            .install(metadata(8, 1, vec![1, 2]), SnapshotData::File(capture.clone()), false)
            .unwrap();
        assert!(!capture.exists(), "the capture is moved into the snapshot file");
        assert_eq!((store.snapshot_len(), data(&store) == body), (body.len() as u64, true));
        // A body written by protobuf itself (data first, then metadata) reads the same.
        let mut whole = Snapshot::default();
        whole.set_metadata(metadata(9, 1, vec![1, 2]));
        whole.set_data(b"old layout".to_vec().into());
        let position = LogPosition::segment_start(store.file.header().seq + 1);
        storage::write_snapshot(&dir, 0, position, &whole.write_to_bytes().unwrap()).unwrap();
        drop(store);
        let store = Store::open(&dir, 0).unwrap();
        assert_eq!(store.snapshot_metadata().index, 9);
        assert_eq!(data(&store), b"old layout");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn the_log_survives_a_reopen_with_overwritten_suffixes() {
        let dir = std::env::temp_dir().join(format!("spindle-store-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        {
            let mut store = Store::open(&dir, 0).unwrap();
            assert!(store.is_empty());
            store
                .append(&[entry(1, 1, b"a"), entry(2, 1, b"b"), entry(3, 1, b"c")])
                .unwrap();
            // A new leader overwrote entry 3 onwards.
            store.append(&[entry(3, 2, b"C")]).unwrap();
            store
                .set_hard_state(&HardState {
                    term: 2,
                    vote: 1,
                    ..Default::default()
                })
                .unwrap();
            store.set_commit(3).unwrap();
            store
                .set_conf_state(&ConfState {
                    voters: vec![1, 2],
                    ..Default::default()
                })
                .unwrap();
            store.sync().unwrap();
        }
        let store = Store::open(&dir, 0).unwrap();
        assert!(!store.is_empty());
        let entries = store.entries(1, 10);
        let data: Vec<&[u8]> = entries.iter().map(|e| &e.data[..]).collect();
        assert_eq!(data, vec![&b"a"[..], b"b", b"C"]);
        let core = store.mem.rl();
        assert_eq!((core.hard_state().term, core.hard_state().commit), (2, 3));
        drop(core);
        let state = raft::Storage::initial_state(&store.mem).unwrap();
        assert_eq!(state.conf_state.voters, vec![1, 2]);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
