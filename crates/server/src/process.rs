//! Child Python processes the server starts and supervises: function workers
//! (`spindle.worker`) and object hosts (`spindle.host`). Both connect back to the server and
//! prove who they are with a secret id; both run in their own process group, so killing
//! one takes the subprocesses it started with it. Workers are also subreapers
//! (`PR_SET_CHILD_SUBREAPER`): a process their code orphans (a `setsid` double fork) becomes
//! the worker's child instead of init's, so it stays in the tree that is measured against
//! the memory limit and killed with the worker, or at the end of the call.
//!
//! Where the server can make cgroups (crate::cgroup), each child also runs in one of its own,
//! which the kernel holds it to: a memory limit a margin above the sampled one (the sampler
//! names the limit in its error; the kernel holds between samples), a process-count limit,
//! and a kill of every process in it when the child is killed or ends, orphans of a dead
//! worker or host included.

use ahash::HashMap;
use std::ffi::OsStr;
use std::io::{self, Read};
use std::os::unix::process::ExitStatusExt;
use std::path::Path;
use std::process::Stdio;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use tokio::process::{Child, Command};
use tokio::sync::Notify;

use crate::cgroup::{is_zombie, Cgroup, Containment};

/// How often a watched process's resident memory is read.
const MEMORY_SAMPLE: Duration = Duration::from_millis(50);

/// How a process ended (from `wait()`); all `None` when it never ran or could not be waited for.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Exit {
    pub(crate) status: Option<i32>,
    pub(crate) signal: Option<i32>,
}

impl Exit {
    /// "exited with status 3", "was killed by signal 9", or "ended".
    pub(crate) fn describe(self) -> String {
        match self {
            Exit {
                signal: Some(signal), ..
            } => format!("was killed by signal {signal}"),
            Exit {
                status: Some(status), ..
            } => format!("exited with status {status}"),
            _ => "ended".to_string(),
        }
    }
}

/// One child process, as its owner and its supervising task share it.
pub(crate) struct Proc {
    /// The id the process must present when it connects: `<id>-<random hex>`.
    pub(crate) secret: String,
    pub(crate) pid: u32,
    /// Resident-memory limit in bytes; 0: not watched.
    limit: AtomicU64,
    /// Wakes the supervisor: `limit` changed.
    watch_changed: Notify,
    /// Tells the supervisor to kill the process group.
    kill: Notify,
    /// The process's own cgroup, when the server makes them.
    cgroup: Option<Arc<Cgroup>>,
    /// The kernel memory limit last set on `cgroup`.
    kernel_limit: AtomicU64,
}

impl Proc {
    /// Watch the resident memory against `limit` bytes (0: stop watching).
    pub(crate) fn watch(&self, limit: u64) {
        self.limit.store(limit, Ordering::Relaxed);
        self.watch_changed.notify_one();
        if let Some(cgroup) = &self.cgroup {
            let kernel = backstop(limit);
            if limit > 0 && self.kernel_limit.swap(kernel, Ordering::Relaxed) != kernel {
                if let Err(e) = cgroup.limit_memory(kernel) {
                    // The sampler still holds the process to `limit`.
                    tracing::warn!(pid = self.pid, "cannot set the cgroup's memory limit: {e}");
                }
            }
        }
    }

    /// Kill every process the process started, but not the process: its descendants and,
    /// with a cgroup, every other process in it (one whose parent died went to init).
    pub(crate) fn kill_strays(&self) {
        kill_descendants(self.pid);
        if let Some(cgroup) = &self.cgroup {
            cgroup.kill(Some(self.pid));
        }
    }

    pub(crate) fn kill(&self) {
        self.kill.notify_one();
    }
}

/// The live processes of one kind, by id.
pub(crate) struct Table {
    procs: Mutex<HashMap<u64, Arc<Proc>>>,
}

impl Table {
    pub(crate) fn new() -> Self {
        Table {
            procs: Mutex::new(HashMap::default()),
        }
    }

    fn lock(&self) -> MutexGuard<'_, HashMap<u64, Arc<Proc>>> {
        // A plain map, consistent even if a holder panicked.
        self.procs.lock().unwrap_or_else(PoisonError::into_inner)
    }

    pub(crate) fn get(&self, id: u64) -> Option<Arc<Proc>> {
        self.lock().get(&id).cloned()
    }

    pub(crate) fn remove(&self, id: u64) {
        self.lock().remove(&id);
    }

    /// The process presenting `secret`, if this table started it.
    pub(crate) fn authenticate(&self, secret: &str) -> Option<(u64, Arc<Proc>)> {
        let id: u64 = secret.split_once('-')?.0.parse().ok()?;
        let proc = self.get(id)?;
        constant_time_eq(proc.secret.as_bytes(), secret.as_bytes()).then_some((id, proc))
    }
}

/// What to start: `python -m module` with the server's connection details.
pub(crate) struct Launch<'a> {
    pub(crate) python: &'a Path,
    pub(crate) module: &'a str,
    /// The environment variable carrying the secret (`SPINDLE_WORKER_ID`, `SPINDLE_HOST_ID`).
    pub(crate) id_var: &'a str,
    pub(crate) id: u64,
    pub(crate) address: &'a str,
    pub(crate) token: &'a str,
    /// The server speaks TLS: the child connects back with it.
    pub(crate) tls: Option<&'a crate::tls::ChildFiles>,
    pub(crate) max_frame: usize,
    pub(crate) stdout: Stdio,
    pub(crate) stderr: Stdio,
    pub(crate) env: &'a [(&'a str, &'a str)],
    /// Make the process a subreaper (see the module's doc).
    pub(crate) subreaper: bool,
    /// Where its cgroup goes, named `<kind>-<id>`.
    pub(crate) containment: &'a Containment,
    pub(crate) kind: &'a str,
    /// The sampled memory limit it starts with, in bytes (the kernel's is a margin above).
    pub(crate) memory_limit: u64,
}

/// The kernel's memory limit for a sampled `limit`: far enough above that the sampler, which
/// says what happened, is the one that acts; the kernel catches a spike between samples.
fn backstop(limit: u64) -> u64 {
    limit.saturating_add((limit / 4).max(256 << 20))
}

/// Start the process and enter it in `table` (before it can connect, so a quick hello finds
/// its entry).
pub(crate) fn spawn(table: &Table, launch: Launch) -> io::Result<(Child, Arc<Proc>)> {
    let secret = format!("{}-{}", launch.id, random_hex(16)?);
    let mut command = Command::new(launch.python);
    command
        .args([OsStr::new("-m"), OsStr::new(launch.module)])
        .env("SPINDLE_ADDRESS", launch.address)
        .env(launch.id_var, &secret)
        // The largest frame the server reads: a bigger reply is refused by the child itself.
        .env("SPINDLE_MAX_FRAME", launch.max_frame.to_string())
        .envs(launch.env.iter().copied())
        .stdin(Stdio::null())
        .stdout(launch.stdout)
        .stderr(launch.stderr)
        // A terminal's Ctrl-C is for the server (or `spindle run`'s script), which stops its
        // children itself; it must not crash calls in flight.
        .process_group(0)
        .kill_on_drop(true);
    // The server's own token (the default user's): never a user's, from the server's
    // environment.
    command.env("SPINDLE_TOKEN", launch.token).env_remove("SPINDLE_USER");
    // Not inherited: the child's TLS is the server's, or none.
    for var in ["SPINDLE_TLS_CA", "SPINDLE_TLS_CERT", "SPINDLE_TLS_KEY"] {
        command.env_remove(var);
    }
    if let Some(tls) = launch.tls {
        command.env("SPINDLE_TLS_CA", &tls.ca);
        if let Some((cert, key)) = &tls.identity {
            command.env("SPINDLE_TLS_CERT", cert).env("SPINDLE_TLS_KEY", key);
        }
    }
    if launch.subreaper {
        // SAFETY: prctl(2) is async-signal-safe and touches no memory of ours; the flag
        // survives the exec.
        unsafe {
            command.pre_exec(|| match libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) {
                0 => Ok(()),
                _ => Err(io::Error::last_os_error()),
            });
        }
    }
    let kernel_limit = backstop(launch.memory_limit);
    let cgroup = launch
        .containment
        .create(launch.kind, launch.id, kernel_limit)?
        .map(Arc::new);
    if let Some(cgroup) = &cgroup {
        // Joined before exec, so even the interpreter's first instruction runs inside.
        let fds = cgroup.join_fds();
        // SAFETY: `join` only calls write(2) on fds the parent holds open over the spawn.
        unsafe {
            command.pre_exec(move || crate::cgroup::join(&fds));
        }
    }
    let mut procs = table.lock();
    let child = match command.spawn() {
        Ok(child) => child,
        Err(e) => {
            if let Some(cgroup) = &cgroup {
                cgroup.remove();
            }
            return Err(e);
        }
    };
    let proc = Arc::new(Proc {
        secret,
        pid: child.id().unwrap_or(0),
        limit: AtomicU64::new(0),
        watch_changed: Notify::new(),
        kill: Notify::new(),
        cgroup,
        kernel_limit: AtomicU64::new(kernel_limit),
    });
    procs.insert(launch.id, proc.clone());
    Ok((child, proc))
}

/// Wait for the process to end, killing its group when asked and sampling its memory while
/// watched (calling `over_memory` each time it is over the limit).
pub(crate) async fn supervise(child: &mut Child, proc: &Proc, mut over_memory: impl FnMut()) -> Exit {
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
                if let Some(cgroup) = &proc.cgroup {
                    cgroup.kill(None);
                }
                if let Err(e) = child.start_kill() {
                    tracing::warn!(pid = proc.pid, "cannot kill process: {e}");
                }
            }
            _ = proc.watch_changed.notified(), if !watching => {}
            _ = sample.tick(), if watching && !killed => {
                let limit = proc.limit.load(Ordering::Relaxed);
                if limit > 0 && tree_resident_bytes(proc.pid).is_some_and(|rss| rss > limit) {
                    over_memory();
                }
            }
        }
    };
    if let Some(cgroup) = &proc.cgroup {
        release(cgroup.clone());
    }
    match status {
        Ok(status) => Exit {
            status: status.code(),
            signal: status.signal(),
        },
        Err(e) => {
            tracing::warn!(pid = proc.pid, "cannot wait for process: {e}");
            Exit::default()
        }
    }
}

/// Kill what is left in an ended process's cgroup (what it orphaned), then remove the cgroup
/// once the kernel has let the killed go (in the background: the exit is reported now).
fn release(cgroup: Arc<Cgroup>) {
    cgroup.kill(None);
    tokio::spawn(async move {
        for _ in 0..200 {
            if cgroup.remove() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
            cgroup.kill(None);
        }
        tracing::warn!(cgroup = %cgroup.path().display(), "cannot remove the cgroup: processes stay in it");
    });
}

/// Kill the process's whole group (it leads one: `process_group(0)`), so the subprocesses it
/// started die with it.
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

/// The resident memory of the process and of its descendants (the commands a shell
/// function runs, the subprocesses of a Python one): what the process costs the machine.
/// `None` when the process is gone.
///
/// With descendants, pages a fork shares copy-on-write would count once per process in
/// `VmRSS`, so the tree is summed in proportional set sizes (each shared page split among
/// its sharers); a lone process is its `VmRSS` (cheaper to read).
fn tree_resident_bytes(pid: u32) -> Option<u64> {
    let rss = resident_bytes(pid)?;
    let descendants = descendants(pid);
    if descendants.is_empty() {
        return Some(rss);
    }
    let own = proportional_bytes(pid).unwrap_or(rss);
    let theirs: u64 = descendants
        .into_iter()
        .map(|child| proportional_bytes(child).or_else(|| resident_bytes(child)).unwrap_or(0))
        .sum();
    Some(own + theirs)
}

/// The process's proportional set size (`Pss` of /proc/PID/smaps_rollup, in kB).
fn proportional_bytes(pid: u32) -> Option<u64> {
    let rollup = std::fs::read_to_string(format!("/proc/{pid}/smaps_rollup")).ok()?;
    let line = rollup.lines().find(|l| l.starts_with("Pss:"))?;
    line.split_whitespace().nth(1)?.parse::<u64>().ok().map(|kb| kb * 1024)
}

/// SIGKILL every live descendant of `pid` (whatever its process group or session), round
/// after round until none is left, for processes that forked meanwhile. The dead stay as
/// zombies of their subreaper until it reaps them; they are not counted.
pub(crate) fn kill_descendants(pid: u32) {
    for _ in 0..20 {
        let live: Vec<u32> = descendants(pid)
            .into_iter()
            .filter(|&child| !is_zombie(child))
            .collect();
        if live.is_empty() {
            return;
        }
        for child in live {
            if let Ok(child) = i32::try_from(child) {
                // SAFETY: kill(2) takes plain integers and touches no memory of ours.
                unsafe {
                    libc::kill(child, libc::SIGKILL);
                }
            }
        }
    }
    tracing::warn!(pid, "descendants still running after 20 rounds of SIGKILL");
}

/// The process's descendants, at most 10,000 of them: a fork bomb must not stall the caller.
fn descendants(pid: u32) -> Vec<u32> {
    let mut found = Vec::new();
    let mut todo = children(pid);
    while let Some(child) = todo.pop() {
        if found.len() == 10_000 {
            break;
        }
        todo.extend(children(child));
        found.push(child);
    }
    found
}

/// The process's children (`/proc/PID/task/*/children`).
pub(crate) fn children(pid: u32) -> Vec<u32> {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for task in tasks.flatten() {
        if let Ok(list) = std::fs::read_to_string(task.path().join("children")) {
            out.extend(list.split_whitespace().filter_map(|p| p.parse::<u32>().ok()));
        }
    }
    out
}

/// The process's resident memory (`VmRSS` of /proc/PID/status, which is in kB whatever the
/// page size). `None` when the process is gone.
fn resident_bytes(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}

pub(crate) fn random_hex(bytes: usize) -> io::Result<String> {
    let mut buf = vec![0u8; bytes];
    std::fs::File::open("/dev/urandom")?.read_exact(&mut buf)?;
    Ok(buf.iter().map(|b| format!("{b:02x}")).collect())
}

/// Compare secrets without leaking through timing where they differ.
pub(crate) fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_our_own_resident_memory() {
        let rss = resident_bytes(std::process::id()).expect("our own /proc entry");
        assert!(rss > 0);
        assert_eq!(resident_bytes(u32::MAX), None);
        let mut child = std::process::Command::new("sleep").arg("5").spawn().expect("sleep");
        assert!(children(std::process::id()).contains(&child.id()));
        let _ = child.kill();
        let _ = child.wait();
        // A quiet tree (this test process allocates while other tests run): a shell and
        // the sleep it waits for (killed below; its length only outlasts a slow machine).
        let mut shell = std::process::Command::new("sh")
            .args(["-c", "sleep 60 & wait"])
            .spawn()
            .expect("sh");
        // The deadline only bounds a failure. Until the child has exec'd `sleep`, it is a
        // forked copy sharing the shell's pages, whose proportional sizes then change.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        let slept = |pid: u32| std::fs::read_to_string(format!("/proc/{pid}/comm")).is_ok_and(|c| c.trim() == "sleep");
        while !children(shell.id()).first().is_some_and(|&pid| slept(pid)) {
            if std::time::Instant::now() > deadline {
                let _ = shell.kill();
                let _ = shell.wait();
                panic!("the shell started no child");
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        let tree = tree_resident_bytes(shell.id()).expect("the shell's tree");
        let own = proportional_bytes(shell.id()).expect("the shell's smaps_rollup");
        assert!(tree > own, "the child's memory counts: {tree} vs {own}");
        for pid in children(shell.id()) {
            // SAFETY: kill has no memory-safety preconditions; the pid is the shell's child.
            unsafe { libc::kill(pid as libc::pid_t, libc::SIGKILL) };
        }
        let _ = shell.kill();
        let _ = shell.wait();
    }

    #[test]
    fn secrets_are_random_hex() {
        let (a, b) = (random_hex(16).unwrap(), random_hex(16).unwrap());
        assert_eq!(a.len(), 32);
        assert!(a.chars().all(|c| c.is_ascii_hexdigit()));
        assert_ne!(a, b);
    }

    #[test]
    fn secrets_compare_whole() {
        assert!(constant_time_eq(b"abc", b"abc"));
        assert!(!constant_time_eq(b"abc", b"abd"));
        assert!(!constant_time_eq(b"abc", b"ab"));
    }

    #[test]
    fn exits_describe_themselves() {
        let exit = |status, signal| Exit { status, signal }.describe();
        assert_eq!(exit(Some(3), None), "exited with status 3");
        assert_eq!(exit(None, Some(9)), "was killed by signal 9");
        assert_eq!(exit(None, None), "ended");
    }

    #[test]
    fn only_started_processes_authenticate() {
        let table = Table::new();
        let proc = Arc::new(Proc {
            secret: "7-abc".into(),
            pid: 1,
            limit: AtomicU64::new(0),
            watch_changed: Notify::new(),
            kill: Notify::new(),
            cgroup: None,
            kernel_limit: AtomicU64::new(0),
        });
        table.lock().insert(7, proc);
        assert_eq!(table.authenticate("7-abc").map(|(id, _)| id), Some(7));
        for wrong in ["7-abd", "8-abc", "abc", "", "-", "7"] {
            assert!(table.authenticate(wrong).is_none(), "{wrong}");
        }
    }
}
