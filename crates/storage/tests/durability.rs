//! Integration tests: torn tails, corruption, repair, snapshots, write failures, recovery.

use std::fs::{self, File};
use std::io::{self, Write};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use spindle_storage::snapshot::{parse_snapshot_name, SNAPSHOT_HEADER_LEN};
use spindle_storage::*;

struct TempDir(PathBuf);

impl TempDir {
    fn new() -> Self {
        static N: AtomicU64 = AtomicU64::new(0);
        let p = std::env::temp_dir().join(format!(
            "spindle-storage-it-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = fs::remove_dir_all(&p);
        fs::create_dir_all(&p).unwrap();
        TempDir(p)
    }
    fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.0);
    }
}

fn rec(i: usize) -> Vec<u8> {
    // Varying sizes, including empty payloads.
    let len = (i * 31) % 200;
    (0..len).map(|j| (i + j) as u8).collect()
}

struct Scan {
    records: Vec<(u64, Vec<u8>)>,
    end: ScanEnd,
}

fn scan(path: &Path) -> io::Result<Scan> {
    let mut s = SegmentScanner::open(path)?;
    let mut records = Vec::new();
    while let Some((off, r)) = s.next_record()? {
        records.push((off, r.to_vec()));
    }
    Ok(Scan {
        records,
        end: s.end().unwrap().clone(),
    })
}

/// Writes `n` records in batches of 7 and returns (path, record start offsets, end); the
/// segment is trimmed to its records, as when the log moves past it.
fn write_segment(dir: &Path, n: usize) -> (PathBuf, Vec<u64>, u64) {
    let mut w = LogWriter::create(dir, 0, FIRST_SEGMENT_SEQ).unwrap();
    let mut starts = Vec::new();
    let recs: Vec<Vec<u8>> = (0..n).map(rec).collect();
    for chunk in recs.chunks(7) {
        let mut off = w.position().offset;
        for r in chunk {
            starts.push(off);
            off += 8 + r.len() as u64;
        }
        w.append_batch(chunk).unwrap();
        w.sync().unwrap();
    }
    w.trim().unwrap();
    (w.path().to_owned(), starts, w.position().offset)
}

#[test]
fn many_batches_round_trip() {
    let dir = TempDir::new();
    let (path, starts, end) = write_segment(dir.path(), 1000);
    let s = scan(&path).unwrap();
    assert_eq!(s.end, ScanEnd::Clean { len: end });
    assert_eq!(s.records.len(), 1000);
    for (i, (off, r)) in s.records.iter().enumerate() {
        assert_eq!(*off, starts[i]);
        assert_eq!(*r, rec(i));
    }
}

#[test]
fn cut_at_every_byte_is_a_torn_tail_keeping_earlier_records() {
    let dir = TempDir::new();
    // The last batch (records 14..20) holds a 0-byte record (i = 0 mod 200/31 ... ) and larger ones.
    let (path, starts, end) = write_segment(dir.path(), 20);
    let full = fs::read(&path).unwrap();
    assert_eq!(full.len() as u64, end);
    for cut in SEGMENT_HEADER_LEN..end {
        fs::write(&path, &full[..cut as usize]).unwrap();
        let s = scan(&path).unwrap_or_else(|e| panic!("cut at {cut}: {e}"));
        let complete = starts
            .iter()
            .enumerate()
            .filter(|(i, _)| starts.get(i + 1).copied().unwrap_or(end) <= cut)
            .count();
        assert_eq!(s.records.len(), complete, "cut at {cut}");
        for (i, (_, r)) in s.records.iter().enumerate() {
            assert_eq!(*r, rec(i));
        }
        let boundary = starts.get(complete).copied().unwrap_or(end);
        // A cut that leaves only zero bytes of a record is as if it was never written.
        if boundary == cut || full[boundary as usize..cut as usize].iter().all(|&b| b == 0) {
            assert_eq!(s.end, ScanEnd::Clean { len: boundary }, "cut at {cut}");
        } else {
            let ScanEnd::Torn(t) = &s.end else {
                panic!("cut at {cut}: {:?}", s.end)
            };
            assert_eq!((t.offset, t.file_len), (boundary, cut), "cut at {cut}");
            // Truncating makes the segment clean and appendable again.
            assert_eq!(truncate_torn_tail(&path, t.offset).unwrap(), cut - boundary);
            let mut w = LogWriter::open(&path).unwrap();
            w.append(b"after repair").unwrap();
            w.sync().unwrap();
            let s = scan(&path).unwrap();
            assert_eq!(s.records.len(), complete + 1);
            assert_eq!(s.records.last().unwrap().1, b"after repair");
        }
    }
}

/// The file's blocks are all allocated: its preallocated space was written, not left as a
/// hole (filling a hole makes every `fdatasync` commit metadata).
fn assert_written(path: &Path) {
    use std::os::unix::fs::MetadataExt;
    let meta = fs::metadata(path).unwrap();
    assert!(
        meta.blocks() * 512 >= meta.len(),
        "{} has {} bytes in {} blocks: its preallocated space is sparse",
        path.display(),
        meta.len(),
        meta.blocks()
    );
}

#[test]
fn a_live_segment_is_preallocated_and_its_zeros_are_a_clean_end() {
    let dir = TempDir::new();
    let mut w = LogWriter::create(dir.path(), 0, FIRST_SEGMENT_SEQ).unwrap();
    let path = w.path().to_owned();
    assert_eq!(fs::metadata(&path).unwrap().len(), SEGMENT_HEADER_LEN + PREALLOCATE);
    assert_written(&path);
    // Appends stay inside the preallocated space: the file's size does not change.
    let recs: Vec<Vec<u8>> = (0..30).map(rec).collect();
    w.append_batch(&recs).unwrap();
    w.sync().unwrap();
    let end = w.position().offset;
    assert_eq!(fs::metadata(&path).unwrap().len(), SEGMENT_HEADER_LEN + PREALLOCATE);
    // A crash now: the zeros after the records are no torn tail, and the log reopens there.
    let s = scan(&path).unwrap();
    assert_eq!(s.records.len(), 30);
    assert_eq!(s.end, ScanEnd::Clean { len: end });
    drop(w);
    let mut w = LogWriter::open(&path).unwrap();
    assert_eq!(w.position().offset, end);
    // A batch larger than what is left grows the file by whole preallocation steps.
    let big = vec![vec![1u8; (PREALLOCATE / 2) as usize]; 3];
    w.append_batch(&big).unwrap();
    w.sync().unwrap();
    let after = w.position().offset;
    assert_eq!(fs::metadata(&path).unwrap().len(), after.next_multiple_of(PREALLOCATE));
    assert_written(&path);
    assert_eq!(scan(&path).unwrap().records.len(), 33);
    assert!(
        repair(&path).unwrap().was_clean(),
        "repair leaves preallocated space alone"
    );
    // Moving past the segment trims it to its records.
    w.rotate().unwrap();
    assert_eq!(fs::metadata(&path).unwrap().len(), after);
    assert_eq!(scan(&path).unwrap().end, ScanEnd::Clean { len: after });
}

#[test]
fn zeros_over_an_unsynced_last_record_end_the_records_there() {
    let dir = TempDir::new();
    let (path, starts, _) = write_segment(dir.path(), 30);
    // Its pages never reached the disk, and preallocated zeros follow.
    let mut bytes = fs::read(&path).unwrap();
    let last = *starts.last().unwrap() as usize;
    bytes[last..].fill(0);
    bytes.extend_from_slice(&[0u8; 8192]);
    fs::write(&path, &bytes).unwrap();
    let s = scan(&path).unwrap();
    assert_eq!(s.records.len(), 29);
    assert_eq!(s.end, ScanEnd::Clean { len: last as u64 });
    // A torn record before the zeros is a torn tail, cut with the zeros.
    bytes[last] = 9;
    fs::write(&path, &bytes).unwrap();
    let ScanEnd::Torn(t) = scan(&path).unwrap().end else {
        panic!("a torn tail")
    };
    assert_eq!(t.offset, last as u64);
    let report = repair(&path).unwrap();
    assert_eq!(report.records_kept, 29);
    assert_eq!(
        report.dropped.iter().map(|d| (d.offset, d.len)).collect::<Vec<_>>(),
        [(last as u64, 1)]
    );
}

#[test]
fn damaged_last_record_with_nothing_after_is_torn() {
    let dir = TempDir::new();
    let (path, starts, _) = write_segment(dir.path(), 10);
    let mut bytes = fs::read(&path).unwrap();
    let last = *starts.last().unwrap() as usize;
    *bytes.last_mut().unwrap() ^= 0x40;
    fs::write(&path, &bytes).unwrap();
    let s = scan(&path).unwrap();
    assert_eq!(s.records.len(), 9);
    assert!(matches!(s.end, ScanEnd::Torn(ref t) if t.offset == last as u64 && t.reason.contains("checksum")));
}

#[test]
fn bit_flip_in_the_middle_is_corruption_at_its_offset() {
    let dir = TempDir::new();
    let (path, starts, _) = write_segment(dir.path(), 40);
    let good = fs::read(&path).unwrap();
    let victim = 17;
    let (from, to) = (starts[victim] as usize, starts[victim + 1] as usize);
    for byte in from..to {
        for bit in [0, 3, 7] {
            let mut bad = good.clone();
            bad[byte] ^= 1 << bit;
            fs::write(&path, &bad).unwrap();
            let mut s = SegmentScanner::open(&path).unwrap();
            let mut n = 0;
            let err = loop {
                match s.next_record() {
                    Ok(Some(_)) => n += 1,
                    Ok(None) => panic!("byte {byte} bit {bit}: read to the end, {:?}", s.end()),
                    Err(e) => break e,
                }
            };
            assert_eq!(n, victim, "records before the damage are returned");
            assert_eq!(err.kind(), io::ErrorKind::InvalidData);
            let c = Corruption::from_io(&err).expect("a Corruption");
            assert_eq!(c.offset, from as u64, "byte {byte} bit {bit}");
            assert_eq!(c.next_valid, Some(to as u64), "byte {byte} bit {bit}");
            let msg = err.to_string();
            assert!(
                msg.contains(&path.display().to_string()) && msg.contains(&format!("offset {from}")),
                "{msg}"
            );
            assert!(msg.contains("spindle repair"), "{msg}");
        }
    }
}

#[test]
fn repair_keeps_every_intact_record() {
    let dir = TempDir::new();
    let (path, starts, end) = write_segment(dir.path(), 50);
    let mut bytes = fs::read(&path).unwrap();
    // Damage record 10 (a bit in its payload/crc) and records 30..=31 (zeroed), plus a torn tail.
    bytes[starts[10] as usize + 5] ^= 0x10;
    bytes[starts[30] as usize..starts[32] as usize].fill(0);
    bytes.extend_from_slice(&[7, 0, 0]);
    fs::write(&path, &bytes).unwrap();
    let original = bytes.clone();
    assert!(scan(&path).is_err());

    let report = repair(&path).unwrap();
    assert_eq!(report.records_kept, 47);
    let dropped: Vec<(u64, u64)> = report.dropped.iter().map(|d| (d.offset, d.len)).collect();
    assert_eq!(
        dropped,
        [
            (starts[10], starts[11] - starts[10]),
            (starts[30], starts[32] - starts[30]),
            // The damage only: zeros after it read as preallocated space.
            (end, 1)
        ]
    );
    assert_eq!(report.bytes_dropped, dropped.iter().map(|d| d.1).sum::<u64>());
    let copy = report.corrupt_copy.clone().unwrap();
    assert_eq!(
        copy.file_name().unwrap().to_str().unwrap(),
        format!("{}.corrupt", path.file_name().unwrap().to_str().unwrap())
    );
    assert_eq!(fs::read(&copy).unwrap(), original, "the original is kept byte for byte");

    let s = scan(&path).unwrap();
    assert!(matches!(s.end, ScanEnd::Clean { .. }));
    let want: Vec<Vec<u8>> = (0..50).filter(|i| ![10, 30, 31].contains(i)).map(rec).collect();
    let got: Vec<Vec<u8>> = s.records.into_iter().map(|(_, r)| r).collect();
    assert_eq!(got, want);
    // The .corrupt copy is not mistaken for a segment.
    assert_eq!(list_segments(dir.path(), 0).unwrap().len(), 1);

    // Repairing again is a no-op; a second damaged repair gets a fresh .corrupt name.
    assert!(repair(&path).unwrap().was_clean());
    let mut b = fs::read(&path).unwrap();
    b[starts[3] as usize] ^= 1;
    fs::write(&path, &b).unwrap();
    let r2 = repair_dir(dir.path()).unwrap();
    assert_eq!(r2.len(), 1);
    assert!(r2[0]
        .corrupt_copy
        .as_ref()
        .unwrap()
        .to_str()
        .unwrap()
        .ends_with(".corrupt.1"));
}

#[test]
fn repair_refuses_a_damaged_header() {
    let dir = TempDir::new();
    let (path, _, _) = write_segment(dir.path(), 3);
    let mut b = fs::read(&path).unwrap();
    b[26] ^= 1; // the salt
    fs::write(&path, &b).unwrap();
    let err = repair(&path).unwrap_err();
    assert_eq!(Corruption::from_io(&err).unwrap().offset, 0);
    assert_eq!(fs::read(&path).unwrap(), b, "left untouched");
}

// ---------------------------------------------------------------------------------------
// Injected write failures
// ---------------------------------------------------------------------------------------

#[derive(Default)]
struct Faults {
    /// Bytes that may still be written before the "disk" is full.
    budget: Option<u64>,
    fail_set_len: bool,
    fail_sync: bool,
}

struct FaultyFile {
    file: File,
    faults: Arc<Mutex<Faults>>,
}

fn enospc() -> io::Error {
    io::Error::from_raw_os_error(28)
}

impl LogFile for FaultyFile {
    fn write_all_at(&mut self, buf: &[u8], offset: u64) -> io::Result<()> {
        let mut f = self.faults.lock().unwrap();
        match f.budget {
            Some(b) if (buf.len() as u64) > b => {
                // Like a real disk filling up: a prefix lands, then ENOSPC.
                std::os::unix::fs::FileExt::write_all_at(&self.file, &buf[..b as usize], offset)?;
                f.budget = Some(0);
                Err(enospc())
            }
            _ => {
                if let Some(b) = f.budget.as_mut() {
                    *b -= buf.len() as u64;
                }
                std::os::unix::fs::FileExt::write_all_at(&self.file, buf, offset)
            }
        }
    }
    fn set_len(&mut self, len: u64) -> io::Result<()> {
        if self.faults.lock().unwrap().fail_set_len {
            return Err(io::Error::from_raw_os_error(5));
        }
        self.file.set_len(len)
    }
    fn sync_data(&mut self) -> io::Result<()> {
        if self.faults.lock().unwrap().fail_sync {
            return Err(io::Error::from_raw_os_error(5));
        }
        self.file.sync_data()
    }
}

fn faulty_writer(dir: &Path) -> (LogWriter<FaultyFile>, Arc<Mutex<Faults>>) {
    let faults = Arc::new(Mutex::new(Faults::default()));
    let f2 = faults.clone();
    let w = LogWriter::create_with(dir, 0, FIRST_SEGMENT_SEQ, move |file| FaultyFile { file, faults: f2 }).unwrap();
    (w, faults)
}

#[test]
fn disk_full_mid_batch_leaves_no_half_record() {
    let dir = TempDir::new();
    let (mut w, faults) = faulty_writer(dir.path());
    w.append_batch((0..10).map(rec)).unwrap();
    w.sync().unwrap();
    let good = w.position();
    faults.lock().unwrap().budget = Some(100);
    let err = w.append_batch((10..20).map(rec)).unwrap_err();
    assert_eq!(err.kind(), enospc().kind(), "disk full stays recognisable: {err}");
    let msg = err.to_string();
    assert!(
        msg.contains("appending") && msg.contains(&w.path().display().to_string()),
        "{msg}"
    );
    assert_eq!(w.position(), good);
    assert!(!w.is_failed(), "cut back cleanly, so the writer stays usable");
    assert_eq!(
        fs::metadata(w.path()).unwrap().len(),
        good.offset,
        "the partial batch was cut off"
    );
    let s = scan(w.path()).unwrap();
    assert_eq!(
        (s.records.len(), s.end.clone()),
        (10, ScanEnd::Clean { len: good.offset })
    );

    // Space freed: appending works again and the log reads back whole.
    faults.lock().unwrap().budget = None;
    w.append_batch((20..25).map(rec)).unwrap();
    w.sync().unwrap();
    let got: Vec<Vec<u8>> = scan(w.path()).unwrap().records.into_iter().map(|(_, r)| r).collect();
    let want: Vec<Vec<u8>> = (0..10).chain(20..25).map(rec).collect();
    assert_eq!(got, want);
}

#[test]
fn failed_cut_back_marks_the_writer_failed() {
    let dir = TempDir::new();
    let (mut w, faults) = faulty_writer(dir.path());
    w.append(b"durable").unwrap();
    w.sync().unwrap();
    {
        let mut f = faults.lock().unwrap();
        f.budget = Some(5);
        f.fail_set_len = true;
    }
    assert!(w.append(b"this one will not fit").is_err());
    assert!(w.is_failed());
    *faults.lock().unwrap() = Faults::default();
    let err = w.append(b"refused").unwrap_err();
    assert!(err.to_string().contains("reopen"), "{err}");
    assert!(w.sync().is_err());
    // The half-record on disk reads as a torn tail, never as a record.
    let s = scan(w.path()).unwrap();
    assert_eq!(s.records.len(), 1);
    assert!(matches!(s.end, ScanEnd::Torn(_)));
}

#[test]
fn failed_sync_marks_the_writer_failed() {
    let dir = TempDir::new();
    let (mut w, faults) = faulty_writer(dir.path());
    w.append(b"a").unwrap();
    faults.lock().unwrap().fail_sync = true;
    let err = w.sync().unwrap_err();
    assert!(err.to_string().contains("fsyncing"), "{err}");
    faults.lock().unwrap().fail_sync = false;
    assert!(w.sync().is_err(), "no retry after a failed fsync");
    assert!(w.append(b"b").is_err());
    assert_eq!(w.synced_position().offset, SEGMENT_HEADER_LEN);
}

#[test]
fn missing_directory_is_an_error_with_context() {
    let dir = TempDir::new();
    let err = LogWriter::create(&dir.path().join("nope"), 0, 1).err().unwrap();
    assert_eq!(err.kind(), io::ErrorKind::NotFound);
    assert!(err.to_string().contains("nope"), "{err}");
}

// ---------------------------------------------------------------------------------------
// Snapshots and recovery
// ---------------------------------------------------------------------------------------

#[test]
fn partial_temp_snapshot_is_ignored_and_removed() {
    let dir = TempDir::new();
    let p1 = LogPosition::segment_start(1);
    write_snapshot(dir.path(), 0, p1, b"old").unwrap();
    // A crash mid-write leaves a temp file (even one with a plausible header).
    let newer = snapshot_path(dir.path(), 0, LogPosition::segment_start(2));
    let tmp = newer.with_extension("sps.tmp");
    let mut partial = fs::read(snapshot_path(dir.path(), 0, p1)).unwrap();
    partial.truncate(SNAPSHOT_HEADER_LEN as usize + 1);
    fs::write(&tmp, &partial).unwrap();
    let (snap, rejected) = load_latest_snapshot(dir.path(), 0).unwrap();
    assert_eq!(snap.unwrap().1, b"old");
    assert!(rejected.is_empty());
    assert_eq!(remove_stale_temp_files(dir.path()).unwrap(), std::slice::from_ref(&tmp));
    assert!(!tmp.exists());
    assert!(parse_snapshot_name(tmp.file_name().unwrap().to_str().unwrap()).is_none());
}

#[test]
fn corrupt_newest_snapshot_falls_back_to_previous() {
    let dir = TempDir::new();
    write_snapshot(dir.path(), 0, LogPosition::segment_start(1), b"first").unwrap();
    let newest = write_snapshot(dir.path(), 0, LogPosition::segment_start(2), b"second").unwrap();
    let mut b = fs::read(&newest.path).unwrap();
    *b.last_mut().unwrap() ^= 1;
    fs::write(&newest.path, &b).unwrap();
    let (snap, rejected) = load_latest_snapshot(dir.path(), 0).unwrap();
    let (info, body) = snap.unwrap();
    assert_eq!(
        (info.position, body.as_slice()),
        (LogPosition::segment_start(1), &b"first"[..])
    );
    assert_eq!(rejected.len(), 1);
    assert!(rejected[0].reason.contains("checksum"), "{}", rejected[0].reason);

    // A snapshot truncated to nothing is rejected too.
    fs::write(&newest.path, b"").unwrap();
    let (snap, rejected) = latest_valid_snapshot(dir.path(), 0).unwrap();
    assert_eq!(snap.unwrap().position, LogPosition::segment_start(1));
    assert_eq!(rejected.len(), 1);
}

/// A toy state machine: the state is the list of records applied; its snapshot is the
/// records joined with length prefixes.
#[derive(Default, Debug, PartialEq)]
struct Toy(Vec<Vec<u8>>);

impl Toy {
    fn encode(&self) -> Vec<u8> {
        let mut out = Vec::new();
        for r in &self.0 {
            out.extend_from_slice(&(r.len() as u32).to_le_bytes());
            out.extend_from_slice(r);
        }
        out
    }
    fn decode(mut b: &[u8]) -> Toy {
        let mut t = Toy::default();
        while !b.is_empty() {
            let n = u32::from_le_bytes(b[..4].try_into().unwrap()) as usize;
            t.0.push(b[4..4 + n].to_vec());
            b = &b[4 + n..];
        }
        t
    }
}

fn recover(dir: &Path) -> (Toy, RecoveryPlan, ReplayOutcome) {
    let plan = plan_recovery(dir, 0).unwrap();
    let mut toy = match &plan.snapshot {
        Some(s) => Toy::decode(&read_snapshot(&s.path).unwrap().1),
        None => Toy::default(),
    };
    let out = replay(&plan, |_, r| {
        toy.0.push(r.to_vec());
        Ok(())
    })
    .unwrap();
    (toy, plan, out)
}

#[test]
fn snapshot_plus_tail_equals_full_replay() {
    let dir = TempDir::new();
    let d = dir.path();
    assert_eq!(
        plan_recovery(d, 0).unwrap().segments,
        [],
        "a fresh directory is an empty plan"
    );
    let mut live = Toy::default();
    let mut w = LogWriter::create(d, 0, FIRST_SEGMENT_SEQ).unwrap();
    let mut n = 0;
    let mut step = |w: &mut LogWriter, live: &mut Toy, k: usize| {
        let batch: Vec<Vec<u8>> = (n..n + k).map(rec).collect();
        n += k;
        w.append_batch(&batch).unwrap();
        w.sync().unwrap();
        live.0.extend(batch);
    };
    step(&mut w, &mut live, 25);
    for round in 0..4 {
        // Snapshot: rotate, capture state as of the new segment's start, write, prune, compact.
        let pos = w.rotate().unwrap();
        let body = live.encode();
        step(&mut w, &mut live, 10 + round); // calls go on while the snapshot is written
        let info = write_snapshot(d, 0, pos, &body).unwrap();
        assert_eq!(info.position, pos);
        let floor = prune_snapshots(d, 0, 2).unwrap().unwrap();
        delete_segments_before(d, 0, floor.seq).unwrap();
        step(&mut w, &mut live, 5);
    }
    assert_eq!(list_snapshots(d, 0).unwrap().len(), 2);
    assert_eq!(
        list_segments(d, 0).unwrap().len(),
        2,
        "compacted behind the older snapshot"
    );

    // Crash with a torn tail: part of a write landed in the preallocated space.
    let f = fs::OpenOptions::new().write(true).open(w.path()).unwrap();
    f.write_all_at(&[42, 0, 0, 0, 1, 2], w.position().offset).unwrap();
    drop(f);
    let (got, plan, out) = recover(d);
    assert_eq!(got, live);
    assert_eq!(
        plan.segments.len(),
        1,
        "only the tail after the newest snapshot is replayed"
    );
    assert_eq!(out.records, 10 + 3 + 5);
    let torn = out.torn.clone().unwrap();
    assert_eq!(torn.offset, out.end.offset);
    truncate_torn_tail(&torn.path, torn.offset).unwrap();
    assert_eq!(recover(d).2.torn, None);

    // Newest snapshot damaged: fall back to the older one and a longer replay, same state.
    let newest = plan.snapshot.unwrap();
    let mut b = fs::read(&newest.path).unwrap();
    b[SNAPSHOT_HEADER_LEN as usize + 3] ^= 0xff;
    fs::write(&newest.path, &b).unwrap();
    let (got, plan2, out2) = recover(d);
    assert_eq!(got, live);
    assert_eq!(plan2.rejected_snapshots.len(), 1);
    assert!(out2.records > out.records);

    // Restart: a fresh segment after the end; replay sees it (empty) without complaint.
    let next = LogWriter::create(d, 0, out2.end.seq + 1).unwrap();
    drop(next);
    assert_eq!(recover(d).0, live);
}

#[test]
fn missing_segment_and_torn_middle_segment_are_refused() {
    let dir = TempDir::new();
    let d = dir.path();
    let mut w = LogWriter::create(d, 0, FIRST_SEGMENT_SEQ).unwrap();
    w.append(b"1").unwrap();
    w.rotate().unwrap();
    w.append(b"2").unwrap();
    w.rotate().unwrap();
    w.append(b"3").unwrap();
    w.sync().unwrap();

    // A torn tail in segment 2, which is followed by segment 3.
    let seg2 = segment_path(d, 0, 2);
    let mut f = fs::OpenOptions::new().append(true).open(&seg2).unwrap();
    f.write_all(&[7, 1, 2, 3, 4]).unwrap();
    drop(f);
    let plan = plan_recovery(d, 0).unwrap();
    let err = replay(&plan, |_, _| Ok(())).unwrap_err();
    let c = Corruption::from_io(&err).unwrap();
    assert_eq!(c.path, seg2);

    // A missing segment.
    fs::remove_file(&seg2).unwrap();
    let err = plan_recovery(d, 0).unwrap_err();
    assert!(err.to_string().contains("log-0-00000000000000000002.spl"), "{err}");

    // Without any snapshot the log must start at the first segment.
    fs::remove_file(segment_path(d, 0, 1)).unwrap();
    fs::remove_file(segment_path(d, 0, 3)).unwrap();
    LogWriter::create(d, 0, 7).unwrap();
    assert!(plan_recovery(d, 0).is_err());
}

#[test]
fn replay_positions_are_record_ends() {
    let dir = TempDir::new();
    let mut w = LogWriter::create(dir.path(), 3, FIRST_SEGMENT_SEQ).unwrap();
    let mut ends = Vec::new();
    for i in 0..5 {
        ends.push(w.append(&rec(i)).unwrap());
    }
    w.sync().unwrap();
    let plan = plan_recovery(dir.path(), 3).unwrap();
    let mut seen = Vec::new();
    let out = replay(&plan, |p, _| {
        seen.push(p);
        Ok(())
    })
    .unwrap();
    assert_eq!(seen, ends);
    assert_eq!(out.end, *ends.last().unwrap());
    // An error from apply stops replay and is returned as is.
    let err = replay(&plan, |_, _| Err(io::Error::other("apply failed"))).unwrap_err();
    assert_eq!(err.to_string(), "apply failed");
}
