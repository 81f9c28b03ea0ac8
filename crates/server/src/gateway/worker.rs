//! Worker processes: start one, watch its memory while it runs a task, kill it on demand,
//! and report its exit to the pool.

use std::fs::{File, OpenOptions};
use std::io::{self, Read};
use std::os::unix::fs::FileExt;
use std::os::unix::process::ExitStatusExt;
use std::process::Stdio;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::process::{Child, Command};
use tokio::sync::Notify;

use super::pool::{Action, Exit, WorkerId};
use crate::Shared;
use spindle_core::{ErrorKind, Value};

/// How often a busy worker's resident memory is read.
const MEMORY_SAMPLE: Duration = Duration::from_millis(50);

/// Bytes of a crashed call's output kept per stream (as for a call that returns).
const OUTPUT_LIMIT: u64 = 1 << 20;

/// The files behind a worker's fds 1 and 2 (unlinked, append-only). The worker empties them
/// after each call, so what they hold when it dies is the output of the call it died in.
struct Capture {
    stdout: File,
    stderr: File,
}

impl Capture {
    fn new(worker: WorkerId) -> io::Result<Capture> {
        let file = |stream: &str| -> io::Result<File> {
            let path = std::env::temp_dir().join(format!("spindle-worker-{worker}-{stream}-{}", random_hex(8)?));
            let file = OpenOptions::new()
                .read(true)
                .append(true)
                .create_new(true)
                .open(&path)?;
            std::fs::remove_file(&path)?;
            Ok(file)
        };
        Ok(Capture {
            stdout: file("stdout")?,
            stderr: file("stderr")?,
        })
    }

    fn read(file: &File) -> Vec<u8> {
        let len = file.metadata().map_or(0, |m| m.len()).min(OUTPUT_LIMIT);
        let mut buf = vec![0; len as usize];
        match file.read_exact_at(&mut buf, 0) {
            Ok(()) => buf,
            Err(_) => Vec::new(),
        }
    }

    /// Put the dead worker's output into the `WorkerCrashed` and `FunctionTimeout` replies
    /// about its call.
    fn fill(&self, actions: &mut [Action]) {
        for action in actions {
            let Action::Reply { reply: Err(e), .. } = action else {
                continue;
            };
            let Value::Map(entries) = &mut e.data else { continue };
            if !matches!(e.kind, ErrorKind::WorkerCrashed | ErrorKind::FunctionTimeout) {
                continue;
            }
            for (key, value) in entries.iter_mut() {
                match key.as_str() {
                    Some("stdout") => *value = Value::Binary(Self::read(&self.stdout)),
                    Some("stderr") => *value = Value::Binary(Self::read(&self.stderr)),
                    _ => {}
                }
            }
        }
    }
}

/// One worker process, as the gateway and the process's watcher task share it.
pub(crate) struct Proc {
    /// The id the worker must present (`SPINDLE_WORKER_ID`): `<worker>-<random hex>`.
    pub(crate) secret: String,
    pub(crate) pid: u32,
    /// Resident-memory limit of the running task in bytes; 0 while idle (not watched).
    limit: AtomicU64,
    /// Wakes the watcher: `limit` changed.
    watch_changed: Notify,
    /// Tells the watcher to kill the process.
    kill: Notify,
}

impl Proc {
    pub(crate) fn watch(&self, limit: u64) {
        self.limit.store(limit, Ordering::Relaxed);
        self.watch_changed.notify_one();
    }

    pub(crate) fn kill(&self) {
        self.kill.notify_one();
    }
}

/// Start worker `id` and its watcher task.
pub(crate) fn spawn(shared: &Arc<Shared>, id: WorkerId) -> io::Result<()> {
    let config = &shared.gateway.config;
    let secret = format!("{id}-{}", random_hex(16)?);
    let capture = Capture::new(id)?;
    let mut command = Command::new(&config.python);
    command
        .args(["-m", "spindle.worker"])
        .env("SPINDLE_ADDRESS", &shared.worker_address)
        .env("SPINDLE_WORKER_ID", &secret)
        // The worker reports each call's output itself; the gateway reads what a crashed
        // call left in the same files.
        .env("SPINDLE_CAPTURE", "fds")
        // The largest frame the server reads: a bigger report is refused by the worker itself.
        .env("SPINDLE_MAX_FRAME", shared.config.max_frame.to_string())
        .stdin(Stdio::null())
        .stdout(Stdio::from(capture.stdout.try_clone()?))
        .stderr(Stdio::from(capture.stderr.try_clone()?))
        // A terminal's Ctrl-C is for the server (or `spindle run`'s script), which stops
        // workers itself; it must not crash calls in flight.
        .process_group(0)
        .kill_on_drop(true);
    match &config.token {
        Some(token) => command.env("SPINDLE_TOKEN", token),
        None => command.env_remove("SPINDLE_TOKEN"),
    };
    // Held across the spawn, so a quick worker's hello finds its entry.
    let mut procs = shared.gateway.procs();
    let child = command.spawn()?;
    let pid = child.id().unwrap_or(0);
    let proc = Arc::new(Proc {
        secret,
        pid,
        limit: AtomicU64::new(0),
        watch_changed: Notify::new(),
        kill: Notify::new(),
    });
    procs.insert(id, proc.clone());
    drop(procs);
    shared.gateway.with_pool(|p| p.spawned(id, pid));
    tracing::debug!(worker = id, pid, "worker started");
    tokio::spawn(supervise(shared.clone(), id, child, proc, capture));
    Ok(())
}

/// Wait for the process to end, sampling its memory while it runs a task and killing it
/// when asked; then tell the pool how it ended.
async fn supervise(shared: Arc<Shared>, id: WorkerId, mut child: Child, proc: Arc<Proc>, capture: Capture) {
    let mut sample = tokio::time::interval(MEMORY_SAMPLE);
    sample.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut killed = false;
    let status = loop {
        let watching = proc.limit.load(Ordering::Relaxed) > 0;
        tokio::select! {
            status = child.wait() => break status,
            _ = proc.kill.notified(), if !killed => {
                killed = true;
                kill_group(proc.pid);
                if let Err(e) = child.start_kill() {
                    tracing::warn!(worker = id, pid = proc.pid, "cannot kill the worker: {e}");
                }
            }
            _ = proc.watch_changed.notified(), if !watching => {}
            _ = sample.tick(), if watching && !killed => {
                let limit = proc.limit.load(Ordering::Relaxed);
                if limit > 0 && resident_bytes(proc.pid).is_some_and(|rss| rss > limit) {
                    tracing::info!(worker = id, pid = proc.pid, limit, "worker over its memory limit; killing it");
                    let actions = shared.gateway.with_pool(|p| p.over_memory(id));
                    super::execute(&shared, actions);
                }
            }
        }
    };
    let exit = match status {
        Ok(status) => Exit {
            status: status.code(),
            signal: status.signal(),
        },
        Err(e) => {
            tracing::warn!(worker = id, pid = proc.pid, "cannot wait for the worker: {e}");
            Exit {
                status: None,
                signal: None,
            }
        }
    };
    tracing::debug!(worker = id, pid = proc.pid, ?exit, "worker ended");
    shared.gateway.procs().remove(&id);
    let mut actions = shared.gateway.with_pool(|p| p.exited(id, exit, None, Instant::now()));
    capture.fill(&mut actions);
    super::execute(&shared, actions);
}

/// Kill the worker's whole process group (it leads one: `process_group(0)`), so the
/// subprocesses a function started die with the call that is being stopped.
fn kill_group(pid: u32) {
    if let Ok(pgid) = i32::try_from(pid) {
        if pgid > 0 {
            // SAFETY: kill(2) takes plain integers and touches no memory of ours.
            unsafe {
                libc::kill(-pgid, libc::SIGKILL);
            }
        }
    }
}

/// The process's resident memory (`VmRSS` of /proc/PID/status, which is in kB whatever the
/// page size). `None` when the process is gone.
fn resident_bytes(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}

fn random_hex(bytes: usize) -> io::Result<String> {
    let mut buf = vec![0u8; bytes];
    std::fs::File::open("/dev/urandom")?.read_exact(&mut buf)?;
    Ok(buf.iter().map(|b| format!("{b:02x}")).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_our_own_resident_memory() {
        let rss = resident_bytes(std::process::id()).expect("our own /proc entry");
        assert!(rss > 0);
        assert_eq!(resident_bytes(u32::MAX), None);
    }

    #[test]
    fn secrets_are_random_hex() {
        let (a, b) = (random_hex(16).unwrap(), random_hex(16).unwrap());
        assert_eq!(a.len(), 32);
        assert!(a.chars().all(|c| c.is_ascii_hexdigit()));
        assert_ne!(a, b);
    }
}
