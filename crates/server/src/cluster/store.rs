//! A shard replica's Raft storage: raft-rs' in-memory log, backed by an append-only file of
//! checksummed records (the op log's segment format) that is replayed at start.
//!
//! Each record is one tag byte and a protobuf message: an entry, the hard state (term, vote,
//! commit) or the configuration. Appending an entry whose index is already held truncates
//! the log there, on disk as in memory, because the replay appends the same way.

use std::io;
use std::path::Path;

use protobuf::Message as _;
use raft::prelude::{ConfState, Entry, HardState};
use raft::storage::MemStorage;
use spindle_storage::{self as storage, LogWriter, ScanEnd, SegmentScanner};
use tracing::warn;

const ENTRY: u8 = 1;
const HARD_STATE: u8 = 2;
const CONF_STATE: u8 = 3;

/// The on-disk log of one shard's replica, with the in-memory copy raft-rs reads. Records
/// are buffered and written in one go by [`flush`](Store::flush) (one `write` per `Ready`),
/// in the order they were made.
pub(crate) struct Store {
    pub(crate) mem: MemStorage,
    file: LogWriter,
    pending: Vec<Vec<u8>>,
}

impl Store {
    /// Open the log of shard `group` in `dir` (created empty if missing).
    pub(crate) fn open(dir: &Path, group: u32) -> io::Result<Store> {
        std::fs::create_dir_all(dir)?;
        let mem = MemStorage::new();
        let segments = storage::list_segments(dir, group)?;
        let Some(segment) = segments.last() else {
            let file = LogWriter::create(dir, group, storage::FIRST_SEGMENT_SEQ)?;
            return Ok(Store {
                mem,
                file,
                pending: Vec::new(),
            });
        };
        let mut scan = SegmentScanner::open(&segment.path)?;
        while let Some((offset, record)) = scan.next_record()? {
            load(&mem, record).map_err(|why| {
                io::Error::new(
                    io::ErrorKind::InvalidData,
                    format!("{} at byte offset {offset}: {why}", segment.path.display()),
                )
            })?;
        }
        if let Some(ScanEnd::Torn(tail)) = scan.end() {
            let cut = storage::truncate_torn_tail(&segment.path, tail.offset)?;
            warn!(
                shard = group,
                "cut a torn record of {cut} bytes at the end of {} (a write the crash interrupted)",
                segment.path.display()
            );
        }
        let file = LogWriter::open(&segment.path)?;
        Ok(Store {
            mem,
            file,
            pending: Vec::new(),
        })
    }

    /// Whether nothing was ever stored (a new replica).
    pub(crate) fn is_empty(&self) -> bool {
        self.mem.rl().hard_state().term == 0 && last_index(&self.mem) == 0
    }

    pub(crate) fn append(&mut self, entries: &[Entry]) -> io::Result<()> {
        if entries.is_empty() {
            return Ok(());
        }
        self.pending.extend(entries.iter().map(|e| encode(ENTRY, e)));
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

    /// Write the buffered records and make everything written durable.
    pub(crate) fn sync(&mut self) -> io::Result<()> {
        self.flush()?;
        self.file.sync()
    }

    /// The committed entries from `from` on, up to `to` (inclusive).
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

fn last_index(mem: &MemStorage) -> u64 {
    raft::Storage::last_index(mem).unwrap_or(0)
}

fn encode(tag: u8, message: &dyn protobuf::Message) -> Vec<u8> {
    let mut out = vec![tag];
    // Writing a well-formed message to a Vec cannot fail.
    message.write_to_vec(&mut out).expect("protobuf encoding to memory");
    out
}

fn load(mem: &MemStorage, record: &[u8]) -> Result<(), String> {
    let (tag, body) = record.split_first().ok_or("an empty record")?;
    let bad = |e: protobuf::ProtobufError| format!("a record that does not decode: {e}");
    match *tag {
        ENTRY => {
            let entry = Entry::parse_from_bytes(body).map_err(bad)?;
            let last = last_index(mem);
            if entry.index > last + 1 || entry.index == 0 {
                return Err(format!("entry {} does not follow entry {last}", entry.index));
            }
            mem.wl().append(&[entry]).map_err(|e| e.to_string())
        }
        HARD_STATE => {
            mem.wl().set_hardstate(HardState::parse_from_bytes(body).map_err(bad)?);
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
