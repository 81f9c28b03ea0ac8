//! Server settings (the flags of `spindle server`).

use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

#[derive(Clone, Debug)]
pub struct Config {
    /// Interface to bind; loopback by default (see DESIGN.md §6, Security).
    pub host: String,
    /// TCP port; 0 picks a free one (read it back from [`crate::Server::local_addr`]).
    pub port: u16,
    /// The HTTP front end's port on the same host (`--http-port`; 0 picks a free one, read
    /// back from [`crate::Server::http_addr`]); `None`: no HTTP.
    pub http_port: Option<u16>,
    /// Serve beyond loopback in plaintext (`--insecure`): tokens and data then cross the
    /// network readable by anyone on the path.
    pub insecure: bool,
    /// Number of shards the object space is split into.
    pub partitions: usize,
    /// Largest frame body accepted, in bytes.
    pub max_frame: usize,
    /// How long a session outlives its last connection.
    pub session_ttl: Duration,
    /// What one client may hold (docs/limits.md).
    pub limits: Limits,
    /// The function gateway's settings.
    pub functions: FunctionsConfig,
    /// Object hosts, which run user-defined objects (they use `functions`' Python, token and
    /// start timeout).
    pub hosts: HostsConfig,
    /// Where the op logs of persistent objects live; `None`: persistent objects are refused.
    pub data_dir: Option<PathBuf>,
    /// When logged changes are made durable (with `data_dir`).
    pub fsync: Fsync,
    /// Log bytes a partition writes before it snapshots its persistent objects and drops
    /// the log behind the snapshot (0: never).
    pub snapshot_after: u64,
    /// Cluster mode (`--node-id`): shards are Raft groups replicated on the cluster's nodes.
    pub cluster: Option<crate::ClusterConfig>,
    /// TLS on the listening port (`--tls-cert`): then it speaks TLS only.
    pub tls: Option<TlsConfig>,
    /// What one call of a compiled (WebAssembly) method may use (`--wasm-fuel`, `--wasm-memory`).
    pub wasm: spindle_wasm::Limits,
}

/// The TLS flags: PEM files.
#[derive(Clone, Debug)]
pub struct TlsConfig {
    /// The server's certificate chain, leaf first (`--tls-cert`).
    pub cert: PathBuf,
    /// Its private key (`--tls-key`).
    pub key: PathBuf,
    /// Clients must present a certificate this CA signed (`--tls-client-ca`): mutual TLS.
    pub client_ca: Option<PathBuf>,
    /// The CA that signed the nodes' certificates (`--tls-ca`), which this node's peers,
    /// workers and object hosts verify with; the client CA when left out.
    pub ca: Option<PathBuf>,
}

impl TlsConfig {
    /// The CA this server's own clients (peers, workers, hosts) trust.
    pub fn trusted_ca(&self) -> Option<&Path> {
        self.ca.as_deref().or(self.client_ca.as_deref())
    }
}

/// What one client may hold on the server, so that no request can grow its memory without
/// bound (docs/limits.md has the table users read).
#[derive(Clone, Debug)]
pub struct Limits {
    /// Connections served at once (workers' and object hosts' included): past it, a new
    /// connection is told so and closed.
    pub max_connections: usize,
    /// How long a new connection may take to say `hello` before it is closed.
    pub hello_timeout: Duration,
    /// A client connection with no request in flight closes after this long without one
    /// (Redis's `timeout`); `None`: never.
    pub idle_timeout: Option<Duration>,
    /// Time allowed to receive a frame once it started: this long, and as long again per
    /// MiB of the frame, so a slow client may still send a large one.
    pub frame_timeout: Duration,
    /// Bytes of frames being received, across all connections: a frame that would take the
    /// total past it is refused.
    pub partial_frames: usize,
    /// Values (MessagePack items) one frame may decode to: a frame of tiny values decodes
    /// to about 32 times its size.
    pub frame_values: usize,
    /// Replies a connection has not taken yet past which its requests wait unread.
    pub output_soft: usize,
    /// Replies a connection has not taken yet past which it is closed when others' calls
    /// produce more for it (a waiter woken: such replies cannot wait).
    pub output_hard: usize,
    /// Bytes of replies one session keeps recorded per shard for retries: past it, the
    /// oldest recorded are forgotten.
    pub reply_log: usize,
    /// Bytes of replies all sessions keep recorded together, shared evenly by the shards:
    /// past it, the oldest of the largest logs are forgotten.
    pub reply_logs: usize,
    /// Calls of one connection waiting for their reply (parked on an object, running in a
    /// host or a function, waiting for the log): past it, its new calls are refused with
    /// `Busy`, so a client cannot park a waiter per 40 bytes it sends.
    pub calls_in_flight: usize,
    /// Bytes the objects may hold (keys and values, approximately) past which caches evict
    /// and then calls that may grow an object are refused with `OutOfMemory` (Redis's
    /// `maxmemory`); 0: no limit.
    pub max_memory: usize,
    /// What one transaction may take (docs/transactions.md).
    pub transactions: TransactionLimits,
}

/// Bounds of transactions: past one, a transaction is refused (`TransactionError`) or, past
/// its time, aborted (`TransactionConflict`), and leaves nothing behind.
#[derive(Clone, Debug, PartialEq)]
pub struct TransactionLimits {
    /// Time from a transaction's first call to its commit (FoundationDB's 5 s).
    pub duration: Duration,
    /// Objects one transaction may touch.
    pub objects: usize,
    /// Bytes of arguments one transaction's calls may carry.
    pub bytes: usize,
    /// Transactions one session may have open at once.
    pub per_session: usize,
}

impl Default for TransactionLimits {
    fn default() -> Self {
        TransactionLimits {
            duration: Duration::from_secs(5),
            objects: 10_000,
            bytes: 10 << 20,
            per_session: 1_000,
        }
    }
}

impl Limits {
    /// What each of `shards` shards keeps of a session's replies, and of all sessions'.
    pub fn reply_log_limits(&self, shards: usize) -> (usize, usize) {
        (self.reply_log, self.reply_logs / shards.max(1))
    }
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_connections: default_max_connections(),
            hello_timeout: Duration::from_secs(10),
            idle_timeout: None,
            frame_timeout: Duration::from_secs(10),
            partial_frames: 1 << 30,
            frame_values: 1 << 23,
            output_soft: 16 << 20,
            output_hard: 256 << 20,
            reply_log: spindle_core::partition::DEFAULT_REPLY_LOG_BYTES,
            reply_logs: 1 << 30,
            calls_in_flight: 1 << 16,
            max_memory: default_max_memory(),
            transactions: TransactionLimits::default(),
        }
    }
}

/// A snapshot after this much log keeps recovery to about a second of replay.
pub const DEFAULT_SNAPSHOT_AFTER: u64 = 64 << 20;

/// When the op log is `fsync`ed, like Redis' `appendfsync`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fsync {
    /// Before any reply that depends on a logged change (group commit: one `fsync` per batch).
    Always,
    /// Replies after the write; an `fsync` every interval in the background (a crash loses
    /// at most about that much of acknowledged writes; a process crash alone loses nothing).
    Interval(Duration),
    /// Replies after the write; the kernel flushes when it likes.
    Never,
}

impl std::str::FromStr for Fsync {
    type Err = String;

    /// `always`, `never`, or `interval=<n>ms` / `interval=<n>s`.
    fn from_str(s: &str) -> Result<Self, String> {
        let bad = || format!("--fsync takes always, interval=<n>ms (or <n>s) or never, not '{s}'");
        match s {
            "always" => Ok(Fsync::Always),
            "never" => Ok(Fsync::Never),
            _ => {
                let every = s.strip_prefix("interval=").ok_or_else(bad)?;
                let (number, unit) = match every.strip_suffix("ms") {
                    Some(n) => (n, 1e-3),
                    None => (every.strip_suffix('s').ok_or_else(bad)?, 1.0),
                };
                let n: f64 = number.parse().map_err(|_| bad())?;
                Duration::try_from_secs_f64(n * unit)
                    .ok()
                    .filter(|d| !d.is_zero() && *d <= Duration::from_secs(3600))
                    .map(Fsync::Interval)
                    .ok_or_else(bad)
            }
        }
    }
}

/// Object hosts: how many, and how long one call may run.
#[derive(Clone, Debug)]
pub struct HostsConfig {
    /// Host slots; each object lives on one, chosen by a hash of its key.
    pub count: usize,
    /// A call running longer than this gets its host killed (and its objects lost).
    pub call_timeout: Duration,
    /// The hosts' Python interpreter (`None`: the workers' one). Another implementation or
    /// version (PyPy, say) imports classes from their modules (see `spindle.host`).
    pub python: Option<PathBuf>,
    /// Resident memory limit per host, in MiB: a host over it is killed (its objects lost).
    pub memory_limit_mb: u64,
}

impl Default for HostsConfig {
    fn default() -> Self {
        HostsConfig {
            count: default_object_hosts(),
            call_timeout: Duration::from_secs(60),
            python: None,
            memory_limit_mb: 2048,
        }
    }
}

/// The function gateway: worker pool size and limits, and who may run code.
#[derive(Clone, Debug)]
pub struct FunctionsConfig {
    /// Most worker processes alive at once.
    pub max_workers: usize,
    /// A worker idle this long is stopped.
    pub idle_timeout: Duration,
    /// Default per-worker resident memory limit, in MiB (a call may ask for another).
    pub memory_limit_mb: u64,
    /// The interpreter that runs `-m spindle.worker`.
    pub python: PathBuf,
    /// When set, every connection must give it in `hello` before any operation.
    pub token: Option<String>,
    /// A started worker that has not connected after this long is killed, and a waiting
    /// call fails, so a broken worker setup never hangs callers.
    pub start_timeout: Duration,
    /// `SPINDLE_FS`: the directory every function and client shares for files (shell
    /// commands run in it); created when the first worker starts.
    pub fs: PathBuf,
    /// Run each worker and object host in a cgroup of its own when the machine allows it
    /// (false: subreaper only).
    pub cgroups: bool,
    /// Most processes in one worker's or host's cgroup (`pids.max`).
    pub pids_limit: u64,
    /// Bytes of a call's stdout, and as many of its stderr, its worker keeps on disk while
    /// it runs (0: no limit); past them, the rest is cut as it comes.
    pub max_call_output: u64,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            host: "127.0.0.1".into(),
            port: 7070,
            insecure: false,
            http_port: None,
            partitions: default_partitions(),
            max_frame: spindle_proto::DEFAULT_MAX_FRAME,
            session_ttl: Duration::from_secs(5),
            limits: Limits::default(),
            functions: FunctionsConfig::default(),
            hosts: HostsConfig::default(),
            data_dir: None,
            fsync: Fsync::Always,
            snapshot_after: DEFAULT_SNAPSHOT_AFTER,
            cluster: None,
            tls: None,
            wasm: spindle_wasm::Limits::default(),
        }
    }
}

/// `--max-call-output`'s default: far more than anyone reads of a call's output (its report
/// carries 1 MiB of each stream), far less than a disk.
pub const DEFAULT_MAX_CALL_OUTPUT: u64 = 64 << 20;

impl Default for FunctionsConfig {
    fn default() -> Self {
        FunctionsConfig {
            max_workers: default_max_workers(),
            idle_timeout: Duration::from_secs(60),
            memory_limit_mb: 2048,
            python: default_python(),
            token: None,
            start_timeout: Duration::from_secs(30),
            fs: default_fs(),
            cgroups: true,
            pids_limit: 4096,
            max_call_output: DEFAULT_MAX_CALL_OUTPUT,
        }
    }
}

impl Config {
    /// Refuse settings that are unsafe to serve with: code execution open to a network.
    pub fn check(&self) -> Result<(), String> {
        if self.functions.token.is_none() && !is_loopback(&self.host) {
            return Err(format!(
                "refusing to listen on {} without a token: invocations run code, so a server \
                 reachable from other machines needs --token (or SPINDLE_TOKEN)",
                self.host
            ));
        }
        if self.functions.token.as_deref() == Some("") {
            return Err("the token must not be empty".into());
        }
        if let Some(tls) = &self.tls {
            if tls.trusted_ca().is_none() {
                return Err(MISSING_CA.into());
            }
        }
        // TLS keeps the token and the values private on the way.
        if !self.insecure && self.tls.is_none() && !is_loopback(&self.host) {
            return Err(format!(
                "refusing to listen on {} in plaintext: the token and every value would cross the \
                 network readable by anyone on the path; serve TLS (--tls-cert and --tls-key; `spindle cert` \
                 makes development certificates) or pass --insecure to serve without it",
                self.host
            ));
        }
        if self.cluster.is_some() && self.cluster_key().is_none_or(str::is_empty) {
            return Err(
                "a cluster node needs --cluster-key (or SPINDLE_CLUSTER_KEY, or --token): \
                        its nodes authenticate each other with it"
                    .into(),
            );
        }
        if self.functions.fs == private_fs() {
            check_private_dir(&self.functions.fs)?;
        }
        Ok(())
    }

    /// What the nodes of this node's cluster authenticate to each other with.
    pub(crate) fn cluster_key(&self) -> Option<&str> {
        let cluster = self.cluster.as_ref()?;
        cluster.key.as_deref().or(self.functions.token.as_deref())
    }
}

/// Said when TLS is on but nothing tells the server's own clients (workers, hosts, peers)
/// which CA signed its certificate.
pub const MISSING_CA: &str = "TLS needs the CA that signed the nodes' certificates, which \
     the server's workers, object hosts and peers verify it with: pass --tls-ca FILE (or --tls-client-ca FILE)";

/// The default shared directory must be this user's alone: another user who made it first
/// could read the functions' files, or plant symlinks that their `>FILE` writes follow.
fn check_private_dir(dir: &Path) -> Result<(), String> {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    let Ok(meta) = std::fs::symlink_metadata(dir) else {
        return Ok(()); // Made with mode 0700 when the first worker starts.
    };
    // SAFETY: getuid has no preconditions and cannot fail.
    let uid = unsafe { libc::getuid() };
    if !meta.is_dir() || meta.uid() != uid || meta.permissions().mode() & 0o022 != 0 {
        return Err(format!(
            "refusing to use {} as the shared directory: it is not a directory of this user that \
             only this user may write; pass --fs DIR (or set SPINDLE_FS)",
            dir.display()
        ));
    }
    Ok(())
}

/// Whether `host` names only this machine (an unresolved host name counts as remote).
pub fn is_loopback(host: &str) -> bool {
    let host = host.trim_start_matches('[').trim_end_matches(']');
    host.eq_ignore_ascii_case("localhost") || host.parse::<IpAddr>().is_ok_and(|ip| ip.is_loopback())
}

/// 10,000 connections, or fewer when the process may open fewer files (a few dozen are
/// kept for logs, data and children's pipes): past the descriptor limit, a client would get
/// no answer at all.
pub fn default_max_connections() -> usize {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes the struct it is given and nothing else.
    let files = match unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) } {
        0 => usize::try_from(limit.rlim_cur).unwrap_or(usize::MAX),
        _ => 1024,
    };
    files.saturating_sub(64).clamp(16, 10_000)
}

/// Half the memory this process may use: the machine's, or its cgroup's when lower. The
/// objects' count is an estimate below what the allocator takes, and the server needs room
/// besides its objects (connections, reply logs, snapshots being written).
pub fn default_max_memory() -> usize {
    // SAFETY: sysconf only reads system settings.
    let (pages, page) = unsafe { (libc::sysconf(libc::_SC_PHYS_PAGES), libc::sysconf(libc::_SC_PAGESIZE)) };
    let machine = usize::try_from(pages)
        .unwrap_or(0)
        .saturating_mul(usize::try_from(page).unwrap_or(0));
    let usable = cgroup_memory_limits().into_iter().fold(machine, usize::min);
    // No word from the system at all: 1 GiB rather than no limit.
    match usable {
        0 => 1 << 30,
        n => n / 2,
    }
}

/// The memory limits of this process's cgroup (v2 `memory.max`, v1
/// `memory.limit_in_bytes`), at its own path and at the root a container shows it as.
fn cgroup_memory_limits() -> Vec<usize> {
    let own = std::fs::read_to_string("/proc/self/cgroup").unwrap_or_default();
    let mut files = vec![
        "/sys/fs/cgroup/memory.max".to_string(),
        "/sys/fs/cgroup/memory/memory.limit_in_bytes".to_string(),
    ];
    for line in own.lines() {
        let mut fields = line.splitn(3, ':');
        let (_, controllers, path) = (fields.next(), fields.next(), fields.next().unwrap_or(""));
        match controllers {
            Some("") => files.push(format!("/sys/fs/cgroup{path}/memory.max")),
            Some(c) if c.split(',').any(|c| c == "memory") => {
                files.push(format!("/sys/fs/cgroup/memory{path}/memory.limit_in_bytes"))
            }
            _ => {}
        }
    }
    // "max" (no limit) does not parse: skipped.
    files
        .iter()
        .filter_map(|f| std::fs::read_to_string(f).ok()?.trim().parse::<usize>().ok())
        .collect()
}

/// One shard per core: enough to keep every worker busy without contention.
pub fn default_partitions() -> usize {
    cores()
}

/// One object host per core: hosts run Python methods, one call at a time each.
pub fn default_object_hosts() -> usize {
    cores()
}

/// Functions mostly wait on shared objects and I/O, so the pool may outnumber the cores.
pub fn default_max_workers() -> usize {
    8 * cores()
}

/// The cores this process may run on.
pub fn cores() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

/// `$SPINDLE_FS`, else this user's own `spindle-fs-UID` in the system's temporary directory.
pub fn default_fs() -> PathBuf {
    match std::env::var_os("SPINDLE_FS").filter(|p| !p.is_empty()) {
        Some(dir) => PathBuf::from(dir),
        None => private_fs(),
    }
}

/// `spindle-fs-UID` in the system's temporary directory.
fn private_fs() -> PathBuf {
    // SAFETY: getuid has no preconditions and cannot fail.
    std::env::temp_dir().join(format!("spindle-fs-{}", unsafe { libc::getuid() }))
}

/// `$SPINDLE_PYTHON`, else the `python3` next to this executable (a virtualenv's `bin/`,
/// where the SDK is installed), else `python3` from `PATH`.
pub fn default_python() -> PathBuf {
    if let Some(python) = std::env::var_os("SPINDLE_PYTHON").filter(|p| !p.is_empty()) {
        return PathBuf::from(python);
    }
    let beside = std::env::current_exe()
        .ok()
        .and_then(|exe| exe.parent().map(|dir| dir.join("python3")))
        .filter(|p| p.is_file());
    beside.unwrap_or_else(|| PathBuf::from("python3"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_max_memory_is_half_of_what_the_process_may_use() {
        // SAFETY: sysconf only reads system settings.
        let machine = unsafe { libc::sysconf(libc::_SC_PHYS_PAGES) * libc::sysconf(libc::_SC_PAGESIZE) } as usize;
        let default = default_max_memory();
        assert!(default > 0 && default <= machine / 2, "{default} of {machine}");
        for limit in cgroup_memory_limits() {
            assert!(default <= limit / 2, "{default}, cgroup {limit}");
        }
    }

    #[test]
    fn loopback_hosts() {
        for host in ["127.0.0.1", "127.1.2.3", "::1", "[::1]", "localhost"] {
            assert!(is_loopback(host), "{host}");
        }
        for host in ["0.0.0.0", "::", "10.0.0.1", "example.com"] {
            assert!(!is_loopback(host), "{host}");
        }
    }

    #[test]
    fn fsync_policies() {
        assert_eq!("always".parse(), Ok(Fsync::Always));
        assert_eq!("never".parse(), Ok(Fsync::Never));
        assert_eq!("interval=10ms".parse(), Ok(Fsync::Interval(Duration::from_millis(10))));
        assert_eq!("interval=1s".parse(), Ok(Fsync::Interval(Duration::from_secs(1))));
        for bad in [
            "",
            "sometimes",
            "interval=",
            "interval=0ms",
            "interval=-1s",
            "interval=10",
        ] {
            assert!(bad.parse::<Fsync>().unwrap_err().contains("--fsync"), "{bad}");
        }
    }

    #[test]
    fn a_public_server_needs_a_token() {
        let mut config = Config {
            host: "0.0.0.0".into(),
            ..Config::default()
        };
        assert!(config.check().unwrap_err().contains("--token"));
        config.functions.token = Some("secret".into());
        assert!(
            config.check().unwrap_err().contains("--insecure"),
            "and TLS, or --insecure"
        );
        config.insecure = true;
        assert!(config.check().is_ok());
        assert!(Config::default().check().is_ok());
    }

    #[test]
    fn tls_satisfies_the_plaintext_rule_but_not_the_token_rule() {
        let tls = TlsConfig {
            cert: "server.pem".into(),
            key: "server-key.pem".into(),
            client_ca: None,
            ca: Some("ca.pem".into()),
        };
        let mut config = Config {
            host: "0.0.0.0".into(),
            tls: Some(tls.clone()),
            ..Config::default()
        };
        assert!(config.check().unwrap_err().contains("--token"), "TLS is no token");
        config.functions.token = Some("secret".into());
        assert!(config.check().is_ok(), "{:?}", config.check());
        config.tls = Some(TlsConfig {
            ca: None,
            ..tls.clone()
        });
        assert!(config.check().unwrap_err().contains("--tls-ca"), "workers need the CA");
        config.tls = Some(TlsConfig {
            ca: None,
            client_ca: Some("ca.pem".into()),
            ..tls
        });
        assert!(config.check().is_ok(), "the client CA is the CA");
    }

    #[test]
    fn the_default_shared_directory_must_be_private() {
        use std::os::unix::fs::PermissionsExt;
        let dir = std::env::temp_dir().join(format!("spindle-config-test-{}", std::process::id()));
        assert!(check_private_dir(&dir).is_ok(), "missing: made private later");
        std::fs::create_dir(&dir).unwrap();
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700)).unwrap();
        assert!(check_private_dir(&dir).is_ok());
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o777)).unwrap();
        assert!(check_private_dir(&dir).unwrap_err().contains("--fs"));
        std::fs::remove_dir(&dir).unwrap();
        std::os::unix::fs::symlink("/tmp", &dir).unwrap();
        assert!(check_private_dir(&dir).is_err(), "a symlink planted in its place");
        std::fs::remove_file(&dir).unwrap();
    }
}
