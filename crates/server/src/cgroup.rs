//! Kernel-enforced containment of the server's children: each worker and object host runs in
//! a cgroup of its own, with a memory and a process-count limit, and is killed with every
//! process in it. A double fork leaves a process group and a session, never a cgroup (short
//! of root privileges in the child).
//!
//! The server keeps its own cgroup and makes one below it, `spindle-<server pid>`, holding
//! one cgroup per child, `<kind>-<id>`:
//! - cgroup v2 (`/sys/fs/cgroup` unified): only when the server's own cgroup can give the
//!   memory and pids controllers to its children (`cgroup.subtree_control`); the kernel
//!   refuses that to a cgroup holding processes other than the root, and the server moves
//!   nothing, so under systemd this takes a delegated subtree the server is the root of.
//! - cgroup v1: the memory and pids hierarchies at `/sys/fs/cgroup/{memory,pids}`, writable.
//! - neither: no cgroups; workers' subreaper (see `process.rs`) is what finds orphans.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::os::fd::{AsRawFd, RawFd};
use std::path::{Path, PathBuf};

const ROOT: &str = "/sys/fs/cgroup";

/// Rounds of "read the members, SIGKILL them" before giving up on a cgroup that keeps
/// forking (the pids limit bounds how many each round meets).
const KILL_ROUNDS: usize = 100;

/// Makes the server's base cgroup(s) from /proc/self/cgroup and their name.
type Setup = fn(&str, &str) -> io::Result<Vec<PathBuf>>;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Mode {
    V2,
    V1,
    /// No cgroups: a subreaper only.
    Subreaper,
}

impl Mode {
    /// As `spindle status` says it (`containment`).
    pub(crate) fn name(self) -> &'static str {
        match self {
            Mode::V2 => "cgroup-v2",
            Mode::V1 => "cgroup-v1",
            Mode::Subreaper => "subreaper",
        }
    }
}

/// The server's cgroups: where children's cgroups go, and their limits.
pub(crate) struct Containment {
    mode: Mode,
    /// `spindle-<pid>` in each hierarchy: v2 one, v1 memory then pids; empty without cgroups.
    bases: Vec<PathBuf>,
    /// `pids.max` of each child.
    pids_max: u64,
}

impl Containment {
    /// The best mode this server can use (`enabled`: cgroups are wanted at all).
    pub(crate) fn detect(enabled: bool, pids_max: u64) -> Containment {
        let none = Containment {
            mode: Mode::Subreaper,
            bases: Vec::new(),
            pids_max,
        };
        if !enabled {
            return none;
        }
        let own = fs::read_to_string("/proc/self/cgroup").unwrap_or_default();
        let name = format!("spindle-{}", std::process::id());
        let attempts: [(Mode, Setup); 2] = [(Mode::V2, setup_v2), (Mode::V1, setup_v1)];
        for (mode, setup) in attempts {
            match setup(&own, &name) {
                Ok(bases) => {
                    for base in &bases {
                        clean_stale(base.parent().unwrap_or(base));
                    }
                    return Containment { mode, bases, pids_max };
                }
                Err(e) => tracing::debug!("no {}: {e}", mode.name()),
            }
        }
        none
    }

    pub(crate) fn mode(&self) -> Mode {
        self.mode
    }

    /// A cgroup for child `<kind>-<id>` limited to `memory` bytes (`None` without cgroups).
    pub(crate) fn create(&self, kind: &str, id: u64, memory: u64) -> io::Result<Option<Cgroup>> {
        if self.bases.is_empty() {
            return Ok(None);
        }
        let dirs: Vec<PathBuf> = self.bases.iter().map(|b| b.join(format!("{kind}-{id}"))).collect();
        let mut procs = Vec::new();
        for dir in &dirs {
            match fs::create_dir(dir) {
                Err(e) if e.kind() != io::ErrorKind::AlreadyExists => return Err(e),
                _ => {}
            }
            procs.push(OpenOptions::new().write(true).open(dir.join("cgroup.procs"))?);
        }
        let cgroup = Cgroup {
            mode: self.mode,
            dirs,
            procs,
        };
        cgroup.limit_memory(memory)?;
        let pids = cgroup.dirs.iter().find(|d| d.join("pids.max").exists());
        if let Some(dir) = pids {
            write(&dir.join("pids.max"), &self.pids_max.to_string())?;
        }
        Ok(Some(cgroup))
    }
}

impl Containment {
    /// Kill what runs in the children's cgroups and remove them and the server's; `false`
    /// while some remain (killed processes take a moment to leave).
    pub(crate) fn remove_all(&self) -> bool {
        self.bases.iter().fold(true, |gone, base| {
            remove_tree(base);
            gone && !base.exists()
        })
    }
}

impl Drop for Containment {
    fn drop(&mut self) {
        self.remove_all();
    }
}

/// One child's cgroup (in each hierarchy of the mode).
pub(crate) struct Cgroup {
    mode: Mode,
    dirs: Vec<PathBuf>,
    /// `cgroup.procs` of each dir, open before the fork so the child joins without
    /// allocating (see [`Cgroup::join_fds`]).
    procs: Vec<File>,
}

impl Cgroup {
    /// Where to write "0" (the writer itself, in v1 and v2) from the forked child.
    pub(crate) fn join_fds(&self) -> Vec<RawFd> {
        self.procs.iter().map(AsRawFd::as_raw_fd).collect()
    }

    /// The dir in the first hierarchy (v1: memory).
    pub(crate) fn path(&self) -> &Path {
        &self.dirs[0]
    }

    /// Set the kernel's memory limit. Lowering it below the usage fails (v1: EBUSY after
    /// reclaim; v2 would reclaim or OOM-kill); the caller logs it.
    pub(crate) fn limit_memory(&self, bytes: u64) -> io::Result<()> {
        let (file, value) = match self.mode {
            Mode::V2 => ("memory.max", bytes.to_string()),
            _ => ("memory.limit_in_bytes", bytes.to_string()),
        };
        let dir = self.dirs.iter().find(|d| d.join(file).exists());
        match dir {
            Some(dir) => write(&dir.join(file), &value),
            None => Ok(()),
        }
    }

    /// SIGKILL every live process in the cgroup but `except`, round after round until none
    /// is left (they may fork meanwhile). Returns whether it emptied: a killed process takes
    /// a moment to go, so a caller that must see the cgroup empty retries (see `release`).
    pub(crate) fn kill(&self, except: Option<u32>) -> bool {
        if self.mode == Mode::V2 && except.is_none() && write(&self.dirs[0].join("cgroup.kill"), "1").is_ok() {
            return true;
        }
        for _ in 0..KILL_ROUNDS {
            let live: Vec<u32> = self
                .members()
                .into_iter()
                .filter(|&pid| Some(pid) != except && !is_zombie(pid))
                .collect();
            if live.is_empty() {
                return true;
            }
            for pid in live {
                if let Ok(pid) = i32::try_from(pid) {
                    // SAFETY: kill(2) takes plain integers and touches no memory of ours.
                    unsafe {
                        libc::kill(pid, libc::SIGKILL);
                    }
                }
            }
            std::thread::yield_now();
        }
        false
    }

    /// The processes in the cgroup (v1: the memory hierarchy's; the pids one has the same).
    pub(crate) fn members(&self) -> Vec<u32> {
        fs::read_to_string(self.dirs[0].join("cgroup.procs"))
            .map(|s| s.split_whitespace().filter_map(|p| p.parse().ok()).collect())
            .unwrap_or_default()
    }

    /// Remove the (emptied) cgroup; `false` while a process in it is still exiting.
    pub(crate) fn remove(&self) -> bool {
        let mut removed = true;
        for dir in &self.dirs {
            match fs::remove_dir(dir) {
                Err(e) if e.kind() != io::ErrorKind::NotFound => removed = false,
                _ => {}
            }
        }
        removed
    }
}

/// cgroup v2: `<own>/spindle-<pid>` with memory and pids for its children.
fn setup_v2(own: &str, name: &str) -> io::Result<Vec<PathBuf>> {
    let path = own
        .lines()
        .find_map(|l| l.strip_prefix("0::"))
        .ok_or_else(|| io::Error::other("no cgroup v2 entry in /proc/self/cgroup"))?;
    let root = Path::new(ROOT);
    if !root.join("cgroup.controllers").exists() {
        return Err(io::Error::other("/sys/fs/cgroup is not cgroup v2"));
    }
    let own = root.join(path.trim_start_matches('/'));
    let available = fs::read_to_string(own.join("cgroup.controllers"))?;
    for controller in ["memory", "pids"] {
        if !available.split_whitespace().any(|c| c == controller) {
            return Err(io::Error::other(format!(
                "no {controller} controller in {}",
                own.display()
            )));
        }
    }
    // Refused (EBUSY) when the server's cgroup holds processes and is not the root.
    write(&own.join("cgroup.subtree_control"), "+memory +pids")?;
    let base = own.join(name);
    make_base(&base)?;
    if let Err(e) = write(&base.join("cgroup.subtree_control"), "+memory +pids") {
        let _ = fs::remove_dir(&base);
        return Err(e);
    }
    Ok(vec![base])
}

/// cgroup v1: `spindle-<pid>` under the server's cgroup in the memory and pids hierarchies.
fn setup_v1(own: &str, name: &str) -> io::Result<Vec<PathBuf>> {
    let mut bases = Vec::new();
    for controller in ["memory", "pids"] {
        let path = own
            .lines()
            .filter_map(|l| l.split_once(':').and_then(|(_, rest)| rest.split_once(':')))
            .find(|(controllers, _)| controllers.split(',').any(|c| c == controller))
            .map(|(_, path)| path)
            .ok_or_else(|| io::Error::other(format!("no {controller} cgroup in /proc/self/cgroup")))?;
        let base = Path::new(ROOT)
            .join(controller)
            .join(path.trim_start_matches('/'))
            .join(name);
        if let Err(e) = make_base(&base) {
            for made in &bases {
                let _ = fs::remove_dir(made);
            }
            return Err(e);
        }
        bases.push(base);
    }
    Ok(bases)
}

fn make_base(base: &Path) -> io::Result<()> {
    match fs::create_dir(base) {
        Err(e) if e.kind() != io::ErrorKind::AlreadyExists => Err(e),
        _ => Ok(()),
    }
}

/// Kill and remove the `spindle-<pid>` cgroups in `parent` of servers no longer running
/// (one that was SIGKILLed left its children's cgroups, and maybe processes in them).
fn clean_stale(parent: &Path) {
    let Ok(entries) = fs::read_dir(parent) else { return };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(pid) = name.to_str().and_then(|n| n.strip_prefix("spindle-")) else {
            continue;
        };
        let Ok(pid) = pid.parse::<u32>() else { continue };
        if pid != std::process::id() && !Path::new(&format!("/proc/{pid}")).exists() {
            tracing::info!(cgroup = %entry.path().display(), "removing the cgroup of a server gone");
            remove_tree(&entry.path());
        }
    }
}

/// Kill what runs in `base`'s child cgroups and remove them, then `base` (cgroup dirs go
/// with rmdir, not by unlinking their files).
fn remove_tree(base: &Path) {
    if let Ok(entries) = fs::read_dir(base) {
        for entry in entries.flatten() {
            if entry.file_type().is_ok_and(|t| t.is_dir()) {
                let procs = fs::read_to_string(entry.path().join("cgroup.procs")).unwrap_or_default();
                for pid in procs.split_whitespace().filter_map(|p| p.parse::<i32>().ok()) {
                    // SAFETY: kill(2) takes plain integers and touches no memory of ours.
                    unsafe {
                        libc::kill(pid, libc::SIGKILL);
                    }
                }
                let _ = fs::remove_dir(entry.path());
            }
        }
    }
    let _ = fs::remove_dir(base);
}

fn write(path: &Path, value: &str) -> io::Result<()> {
    OpenOptions::new()
        .write(true)
        .open(path)
        .and_then(|mut f| f.write_all(value.as_bytes()))
        .map_err(|e| io::Error::new(e.kind(), format!("{}: {e}", path.display())))
}

/// In the forked child, before exec: move the calling process into the cgroup(s) whose
/// `cgroup.procs` are `fds`. No allocation (it runs between fork and exec).
pub(crate) fn join(fds: &[RawFd]) -> io::Result<()> {
    for &fd in fds {
        // SAFETY: write(2) of a static one-byte buffer to an fd the parent opened.
        if unsafe { libc::write(fd, b"0".as_ptr().cast(), 1) } != 1 {
            return Err(io::Error::last_os_error());
        }
    }
    Ok(())
}

/// Whether the process has ended and waits to be reaped (or is gone).
pub(crate) fn is_zombie(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|stat| {
            stat.rsplit_once(')')
                .map(|(_, rest)| rest.trim_start().starts_with(['Z', 'X']))
        })
        .unwrap_or(true)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn modes_name_themselves() {
        assert_eq!(Mode::V2.name(), "cgroup-v2");
        assert_eq!(Mode::V1.name(), "cgroup-v1");
        assert_eq!(Mode::Subreaper.name(), "subreaper");
        assert_eq!(Containment::detect(false, 10).mode(), Mode::Subreaper);
    }

    /// Where the machine allows cgroups (CI: root, cgroup v1), a child joins its cgroup
    /// and dies with it, orphans included.
    #[test]
    fn a_cgroup_holds_and_kills_a_double_fork() {
        let containment = Containment::detect(true, 64);
        let Some(cgroup) = containment.create("test", 1, 256 << 20).expect("a cgroup") else {
            return; // no cgroups here
        };
        let fds = cgroup.join_fds();
        let mut command = std::process::Command::new("sh");
        command.args(["-c", "setsid sh -c 'sleep 600 & sleep 600' & exec sleep 600"]);
        // SAFETY: write(2) of a static buffer is async-signal-safe.
        unsafe {
            std::os::unix::process::CommandExt::pre_exec(&mut command, move || join(&fds));
        }
        let mut child = command.spawn().expect("sh");
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        while cgroup.members().len() < 4 && std::time::Instant::now() < deadline {
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        assert!(cgroup.members().contains(&child.id()));
        assert!(cgroup.members().len() >= 4, "{:?}", cgroup.members());
        // A killed process takes a moment to go (longer on a loaded machine): retry as
        // `release` does until the cgroup holds only the excepted process.
        let emptied = |except: Option<u32>| {
            let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
            while !cgroup.kill(except) {
                assert!(std::time::Instant::now() < deadline, "{:?}", cgroup.members());
                std::thread::sleep(std::time::Duration::from_millis(10));
            }
        };
        emptied(Some(child.id()));
        assert_eq!(child.try_wait().expect("wait"), None, "the excepted process lives");
        emptied(None);
        let _ = child.wait();
        while !cgroup.remove() {
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        assert!(!cgroup.path().exists());
    }
}
