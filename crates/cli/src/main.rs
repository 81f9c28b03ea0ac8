//! `spindle`: run a server, run a program against one, or ask a running one for its status
//! and objects.

mod calls;
mod cert;
mod client;
mod cluster;
mod limits;
mod objects;
mod run;
mod sh;
mod users;

use std::cell::Cell;
use std::io::{self, IsTerminal, Write};
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use clap::{Args, Parser, Subcommand};
use spindle_server::config::{
    default_max_workers, default_object_hosts, default_partitions, default_python, Fsync, FunctionsConfig, HostsConfig,
};
use spindle_server::{ClusterConfig, Config, RecoveryError, Server};
use tracing::{debug, error, info};

const DEFAULT_ADDRESS: &str = "127.0.0.1:7070";

#[derive(Parser)]
#[command(name = "spindle", version, about = "Spindle: stateful serverless objects")]
#[command(
    after_help = "Shared objects are commands too: spindle counter|map|treemap|list|barrier|rdv|pipe|semaphore|\nlatch|queue|blob -n NAME OPERATION [ARGS] (or the same through a link of that name, or the functions\nof `eval \"$(spindle shell-env)\"`); `spindle counter --help` tells more."
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run a state server (objects and functions) in the foreground.
    Server(Box<ServerArgs>),
    /// Run a development cluster on this machine (`local`), look at a cluster (`status`), add
    /// a node to it (`add`) or take one out (`remove`).
    Cluster(cluster::ClusterArgs),
    /// Run a Python program against $SPINDLE_ADDRESS, or else against a server started
    /// for it (and stopped after); exits with the program's exit code.
    Run(run::RunArgs),
    /// Run a shell command as a function and stream its output back; exits with its status.
    Sh(sh::ShArgs),
    /// Show a running server's address, uptime, objects, connections and call rate.
    Status(StatusArgs),
    /// List the running and queued function calls: id, state, age, worker, user, function
    /// and caller (a user sees its own calls, an admin everyone's).
    Ps(AddressArg),
    /// Kill a function call: a queued one is withdrawn, a running one's worker killed (its
    /// caller gets WorkerCrashed); a detached `spindle sh --async` call too.
    Kill(calls::KillArgs),
    /// Print a function call's latest output (its last 64 KiB); -f follows it until it ends.
    Logs(calls::LogsArgs),
    /// Add, remove and list the server's users (`SPINDLE_USER` and `SPINDLE_TOKEN` say who
    /// a client is).
    User(users::UserArgs),
    /// Add, remove and list the roles users hold: rules of permissions per name prefix.
    Role(users::RoleArgs),
    /// List the named objects of a running server.
    Objects {
        /// Only names starting with this prefix.
        prefix: Option<String>,
        /// Only persistent objects (those on disk).
        #[arg(long)]
        persistent: bool,
        /// Unnamed objects too, and each object's size in bytes (approximate, as
        /// --max-memory counts them).
        #[arg(long)]
        all: bool,
        #[command(flatten)]
        address: AddressArg,
    },
    /// Define a compiled object type from a WebAssembly module: `wasm:NAME`, NAME being the
    /// file's stem unless --name says otherwise. Prints the methods the module exports; the
    /// server refuses a module that does not keep the ABI (docs/wasm.md) and says why.
    Define {
        /// The module (a .wasm file).
        file: std::path::PathBuf,
        /// The type's name [default: the file's stem].
        #[arg(long)]
        name: Option<String>,
        #[command(flatten)]
        address: AddressArg,
    },
    /// Repair the write-ahead log in a data directory after `spindle server` refused to start on
    /// corruption: keeps every intact record, sets the damaged originals aside as
    /// `*.corrupt`, and prints what it did. Run it only while no server uses the directory.
    Repair {
        /// The server's data directory.
        #[arg(long)]
        data_dir: PathBuf,
    },
    /// Print shell functions that make the shared objects commands (`counter -n c increment`):
    /// eval "$(spindle shell-env)".
    ShellEnv,
    /// Make a development CA and certificates for TLS in DIR: ca.pem and ca-key.pem (the CA),
    /// server.pem and server-key.pem (for `spindle server --tls-cert/--tls-key`, valid for
    /// localhost, 127.0.0.1, ::1 and each --name; nodes of a cluster also present it to each
    /// other), client.pem and client-key.pem (a client certificate, for servers with
    /// --tls-client-ca). Key files are readable by their owner only; existing files are
    /// never overwritten.
    Cert(cert::CertArgs),
}

#[derive(Args)]
struct ServerArgs {
    /// Interface to listen on.
    #[arg(long, default_value = "127.0.0.1")]
    host: String,
    /// TCP port (0 picks a free one; the listening line tells which).
    #[arg(long, default_value_t = 7070)]
    port: u16,
    /// Serve objects over HTTP too, on this port of the same host (0 picks a free one; a
    /// line "spindle http on ADDRESS" tells which). Off by default; see docs/http.md.
    #[arg(long, value_name = "PORT")]
    http_port: Option<u16>,
    /// Serve an interface beyond loopback in plaintext (without TLS).
    #[arg(long)]
    insecure: bool,
    /// Speak TLS on the port (only TLS), with this certificate chain (PEM, leaf first;
    /// `spindle cert` makes one for development).
    #[arg(long, value_name = "FILE", requires = "tls_key")]
    tls_cert: Option<PathBuf>,
    /// The private key of --tls-cert (PEM).
    #[arg(long, value_name = "FILE", requires = "tls_cert")]
    tls_key: Option<PathBuf>,
    /// Mutual TLS: every client (peer nodes, workers and object hosts included) must present
    /// a certificate signed by this CA (PEM).
    #[arg(long, value_name = "FILE", requires = "tls_cert")]
    tls_client_ca: Option<PathBuf>,
    /// The CA that signed the nodes' certificates (PEM): this node verifies its peers with
    /// it, and its workers and object hosts verify it [default: --tls-client-ca].
    #[arg(long, value_name = "FILE", requires = "tls_cert")]
    tls_ca: Option<PathBuf>,
    /// Number of object partitions [default: number of cores].
    #[arg(long, value_parser = clap::value_parser!(u16).range(1..))]
    partitions: Option<u16>,
    /// Threads that serve connections and run calls [default: number of cores]. Nodes that
    /// share a machine split its cores (as `spindle cluster local` does): more threads than
    /// cores only switch among themselves.
    #[arg(long, value_parser = clap::value_parser!(u16).range(1..=1024))]
    threads: Option<u16>,
    /// The cores are shared with other busy processes (the other nodes of `spindle cluster
    /// local`, which sets this, and their clients): a thread that runs out of calls after a
    /// busy spell lets them run before it sleeps, and so wakes to a batch of calls rather
    /// than one. Saves CPU per call; costs latency next to a CPU-bound process.
    #[arg(long)]
    shared_cores: bool,
    /// Largest request frame accepted, in bytes.
    #[arg(long, default_value_t = spindle_proto::DEFAULT_MAX_FRAME)]
    max_frame: usize,
    /// Seconds a session outlives its last connection.
    #[arg(long, default_value_t = 5.0)]
    session_ttl: f64,
    /// Also exit when stdin reaches end of file (for a server started by a client process,
    /// so it dies with its parent).
    #[arg(long)]
    embedded: bool,
    /// Directory for the write-ahead log of persistent objects (created if missing).
    /// Without it, persistent=True is refused.
    #[arg(long)]
    data_dir: Option<PathBuf>,
    /// When the write-ahead log is fsynced: `always` (before every reply that depends on a logged
    /// change, one fsync per group of calls), `interval=10ms` (replies after the write,
    /// fsync in the background: a power loss may lose the last interval) or `never`
    /// (the kernel decides). A crash of the server alone loses nothing with any of them.
    #[arg(long, default_value = "always", value_parser = clap::value_parser!(Fsync))]
    fsync: Fsync,
    /// Bytes of write-ahead log after which a partition snapshots its persistent objects
    /// (in the background), the log behind every partition's snapshots being deleted;
    /// recovery loads the snapshots and replays about this much log. In a cluster, the
    /// bytes of each replica's Raft log. 0: never snapshot.
    #[arg(long, default_value_t = spindle_server::config::DEFAULT_SNAPSHOT_AFTER, value_name = "BYTES")]
    snapshot_after: u64,
    /// Run as node ID of a cluster: every partition becomes a shard replicated by Raft on
    /// the cluster's nodes (needs --data-dir). Without --join, a new cluster starts here.
    #[arg(long, value_name = "ID", value_parser = clap::value_parser!(u64).range(1..))]
    node_id: Option<u64>,
    /// Join the cluster that the node at HOST:PORT belongs to (a new node; a restarted
    /// member needs only its --data-dir).
    #[arg(long, value_name = "HOST:PORT", requires = "node_id")]
    join: Option<String>,
    /// The address other nodes and clients reach this node at [default: the bound address].
    #[arg(long, value_name = "HOST:PORT", requires = "node_id")]
    advertise: Option<String>,
    /// Replicas of each shard in a new cluster (fewer while the cluster has fewer nodes).
    #[arg(long, value_name = "N", requires = "node_id", default_value_t = spindle_server::DEFAULT_REPLICATION_FACTOR as u8,
          value_parser = clap::value_parser!(u8).range(1..=7))]
    replication_factor: u8,
    /// A node not heard from for longer is declared dead: its replicas move to live nodes
    /// (it takes them back if it returns).
    #[arg(long, value_name = "SECONDS", requires = "node_id",
          default_value_t = spindle_server::DEFAULT_DEAD_AFTER.as_secs_f64(),
          value_parser = parse_dead_after)]
    dead_after: f64,
    /// What the cluster's nodes authenticate to each other with: the same on every node
    /// [default: the --token].
    #[arg(
        long,
        value_name = "KEY",
        env = "SPINDLE_CLUSTER_KEY",
        hide_env_values = true,
        requires = "node_id"
    )]
    cluster_key: Option<String>,
    #[command(flatten)]
    limits: limits::LimitArgs,
    #[command(flatten)]
    functions: FunctionArgs,
    #[command(flatten)]
    hosts: HostArgs,
    #[command(flatten)]
    wasm: WasmArgs,
}

/// What one call of a compiled (WebAssembly) method may use; past a limit the call fails
/// with Trapped and the object is as it was.
#[derive(Args, Clone)]
pub(crate) struct WasmArgs {
    /// Instructions one call of a compiled method may run (wasmtime fuel: about one per
    /// WebAssembly instruction) [default: 100000000].
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..))]
    wasm_fuel: Option<u64>,
    /// Memory one call of a compiled method may use, in MiB [default: 64].
    #[arg(long, value_name = "MIB", value_parser = clap::value_parser!(u64).range(1..4096))]
    wasm_memory: Option<u64>,
}

impl WasmArgs {
    fn limits(&self) -> spindle_wasm::Limits {
        let default = spindle_wasm::Limits::default();
        spindle_wasm::Limits {
            fuel: self.wasm_fuel.unwrap_or(default.fuel),
            memory_bytes: self
                .wasm_memory
                .map_or(default.memory_bytes, |mib| (mib as usize) << 20),
            ..default
        }
    }
}

/// The object hosts' flags (user-defined `@spindle.shared` objects), shared by `server` and
/// `run`.
#[derive(Args, Clone)]
pub(crate) struct HostArgs {
    /// Object host processes that run the methods of user-defined objects; each object lives
    /// on one, chosen by a hash of its key, and hosts start on first use. Calls on objects of
    /// different hosts run in parallel [default: number of cores].
    #[arg(long, value_parser = clap::value_parser!(u16).range(1..))]
    object_hosts: Option<u16>,
    /// Seconds one call on a user-defined object may run. A longer call gets its host killed
    /// and restarted; every object that host held is lost (its calls raise ObjectLost).
    #[arg(long, default_value_t = 60.0, value_name = "SECONDS")]
    object_call_timeout: f64,
    /// Python interpreter for object hosts, if not --python's: PyPy, say, whose JIT runs
    /// methods' loops many times faster. Its environment needs the spindle package, and
    /// classes the caller's interpreter cannot hand over as code (another Python version or
    /// implementation) are imported from their modules, which it must find on its path.
    #[arg(long, value_name = "PATH")]
    host_python: Option<PathBuf>,
    /// Resident memory limit per object host, in MiB (the host and the processes it starts):
    /// a host over it is killed, and the objects it held are lost (ObjectLost).
    #[arg(long, default_value_t = 2048, value_name = "MIB", value_parser = clap::value_parser!(u64).range(1..))]
    host_memory_limit: u64,
}

impl HostArgs {
    pub(crate) fn config(&self) -> Result<HostsConfig, String> {
        let call_timeout = Duration::try_from_secs_f64(self.object_call_timeout)
            .ok()
            .filter(|t| !t.is_zero())
            .ok_or("--object-call-timeout must be a positive number of seconds")?;
        Ok(HostsConfig {
            count: self.object_hosts.map_or_else(default_object_hosts, usize::from),
            call_timeout,
            python: self.host_python.clone(),
            memory_limit_mb: self.host_memory_limit,
        })
    }
}

/// The function gateway's flags, shared by `server` and `run`.
#[derive(Args, Clone)]
pub(crate) struct FunctionArgs {
    /// Most worker processes at once [default: 8 × cores].
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..))]
    max_workers: Option<u32>,
    /// Seconds a worker may stay idle before it is stopped.
    #[arg(long, default_value_t = 60.0)]
    idle_timeout: f64,
    /// Resident memory limit per worker, in MiB (a call may ask for another with `memory_mb`).
    #[arg(long, default_value_t = 2048, value_parser = clap::value_parser!(u64).range(1..))]
    memory_limit: u64,
    /// Python interpreter for workers (and for `run`'s program) [default: $SPINDLE_PYTHON, else
    /// the python3 next to this executable, else python3 on PATH].
    #[arg(long)]
    python: Option<PathBuf>,
    /// Token that every connection must give in `hello` before any operation [default: $SPINDLE_TOKEN].
    #[arg(long, env = "SPINDLE_TOKEN", hide_env_values = true)]
    token: Option<String>,
    /// Seconds a started worker may take to connect before its waiting call fails.
    #[arg(long, default_value_t = 30.0, hide = true)]
    worker_start_timeout: f64,
    /// Directory shared by every function and client for files (`spindle sh` commands run
    /// in it), exported to workers as SPINDLE_FS [default: $SPINDLE_FS, else this user's
    /// spindle-fs-UID in the temporary directory, which must be this user's alone].
    #[arg(long, value_name = "DIR")]
    fs: Option<PathBuf>,
    /// Do not run workers and object hosts in cgroups of their own, even where the machine
    /// allows it: only the subreaper keeps what they start within reach (docs/security.md).
    #[arg(long)]
    no_cgroups: bool,
    /// Most processes in one worker's or object host's cgroup (with cgroups).
    #[arg(long, default_value_t = 4096, value_name = "N", value_parser = clap::value_parser!(u64).range(8..))]
    pids_limit: u64,
    /// Bytes of a function call's stdout, and as many of its stderr, kept on disk while it
    /// runs: past them the rest is cut, and its output says "[output truncated at N bytes]".
    /// A size with a unit as --max-memory's, or "unlimited".
    #[arg(long, default_value = "64MiB", value_name = "SIZE", value_parser = limits::parse_size)]
    max_call_output: usize,
}

impl FunctionArgs {
    pub(crate) fn config(&self) -> Result<FunctionsConfig, String> {
        // Capped (at ~31 years) so that deadlines computed from them never overflow the clock.
        let seconds = |flag: &str, value: f64| {
            Duration::try_from_secs_f64(value)
                .map(|d| d.min(Duration::from_secs(1_000_000_000)))
                .map_err(|_| format!("--{flag} must be a non-negative number of seconds"))
        };
        Ok(FunctionsConfig {
            max_workers: self.max_workers.map_or_else(default_max_workers, |n| n as usize),
            idle_timeout: seconds("idle-timeout", self.idle_timeout)?,
            memory_limit_mb: self.memory_limit,
            python: self.python.clone().unwrap_or_else(default_python),
            token: self.token.clone().filter(|t| !t.is_empty()),
            start_timeout: seconds("worker-start-timeout", self.worker_start_timeout)?,
            fs: std::path::absolute(self.fs.clone().unwrap_or_else(spindle_server::config::default_fs))
                .map_err(|e| format!("--fs: {e}"))?,
            cgroups: !self.no_cgroups,
            pids_limit: self.pids_limit,
            max_call_output: self.max_call_output as u64,
        })
    }
}

#[derive(Args)]
struct StatusArgs {
    /// Print the status map as JSON (one object per line with --watch).
    #[arg(long)]
    json: bool,
    /// Print it again every SECONDS until interrupted.
    #[arg(long, value_name = "SECONDS", num_args = 0..=1, default_missing_value = "2")]
    watch: Option<f64>,
    #[command(flatten)]
    address: AddressArg,
}

#[derive(Args)]
pub(crate) struct AddressArg {
    /// Server address [default: $SPINDLE_ADDRESS or 127.0.0.1:7070].
    // The help's first line says the default and the variable: clap's would repeat them.
    #[arg(long, env = "SPINDLE_ADDRESS", default_value = DEFAULT_ADDRESS, hide_env = true,
          hide_default_value = true)]
    pub(crate) address: String,
    #[command(flatten)]
    pub(crate) tls: client::TlsArgs,
}

// Each call allocates and frees small buffers (its frame, its op-log record, its reply) on
// whichever worker runs it. In paired runs on a 3-node cluster (2 cores), mimalloc took the
// nodes' CPU per call 4% (rf = 1) to 10% (rf = 3) below the system allocator's.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> ExitCode {
    // `counter -n c increment` (through a link or `spindle counter`) skips clap and the rest.
    if let Some(status) =
        objects::dispatch(|word| <Cli as clap::CommandFactory>::command().find_subcommand(word).is_some())
    {
        return status;
    }
    let cli = Cli::parse();
    if matches!(
        cli.command,
        Command::Status(_) | Command::Objects { .. } | Command::Cluster(_) | Command::Ps(_) | Command::Logs(_)
    ) {
        // Listings end quietly when their reader goes away (`spindle cluster status | head`).
        // SAFETY: restoring the default action of a signal has no preconditions.
        unsafe { libc::signal(libc::SIGPIPE, libc::SIG_DFL) };
    }
    let result = match cli.command {
        Command::Server(args) => return run_server(*args),
        Command::Run(args) => return run::run(args),
        Command::Sh(args) => return sh::run(args),
        Command::Status(args) => {
            client::use_tls(&args.address.tls);
            client::status(&args.address.address, args.json, args.watch)
        }
        Command::Ps(address) => calls::ps(&address),
        Command::Kill(args) => calls::kill(args),
        Command::Logs(args) => calls::logs(args),
        Command::User(args) => users::user(args),
        Command::Role(args) => users::role(args),
        Command::Objects {
            prefix,
            persistent,
            all,
            address,
        } => {
            client::use_tls(&address.tls);
            client::objects(&address.address, prefix.as_deref().unwrap_or(""), persistent, all)
        }
        Command::Define { file, name, address } => {
            client::use_tls(&address.tls);
            client::define(&address.address, &file, name.as_deref())
        }
        Command::Repair { data_dir } => repair(&data_dir),
        Command::Cluster(args) => cluster::run(args),
        Command::ShellEnv => objects::shell_env(),
        Command::Cert(args) => cert::run(args),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(message) => {
            eprintln!("spindle: {message}");
            ExitCode::FAILURE
        }
    }
}

/// `spindle repair --data-dir DIR`: keep every intact record of every log segment.
fn repair(dir: &std::path::Path) -> Result<(), String> {
    if !dir.is_dir() {
        return Err(format!("{} is not a directory", dir.display()));
    }
    let _lock = spindle_storage::lock_dir(dir).map_err(|e| e.to_string())?;
    let reports = spindle_storage::repair_dir(dir).map_err(|e| format!("repair of {} failed: {e}", dir.display()))?;
    let mut damaged = 0;
    for r in &reports {
        if r.was_clean() {
            continue;
        }
        damaged += 1;
        println!(
            "{}: kept {} records, dropped {} bytes",
            r.path.display(),
            r.records_kept,
            r.bytes_dropped
        );
        for d in &r.dropped {
            println!("  dropped {} bytes at byte offset {}: {}", d.len, d.offset, d.reason);
        }
        if let Some(copy) = &r.corrupt_copy {
            println!("  the original is kept as {}", copy.display());
        }
    }
    println!(
        "{} log segments checked, {damaged} repaired, {} intact",
        reports.len(),
        reports.len() - damaged
    );
    Ok(())
}

/// Log to stderr at `level` unless RUST_LOG says otherwise.
pub(crate) fn init_logging(level: &str) {
    tracing_subscriber::fmt()
        .with_writer(io::stderr)
        .with_ansi(io::stderr().is_terminal())
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(level)),
        )
        .init();
}

/// Exit status for bad settings (as clap uses for bad flags).
const USAGE: u8 = 2;

fn run_server(args: ServerArgs) -> ExitCode {
    init_logging("info");
    // mimalloc asks for transparent huge pages on its arenas: each first touch then zeroes
    // 2 MiB at once, stalling other clients' calls for milliseconds while one client's
    // replies grow, and a few live bytes pin 2 MiB (Redis turns THP off for itself too).
    // SAFETY: prctl(2) with PR_SET_THP_DISABLE only sets a flag of this process.
    if unsafe { libc::prctl(libc::PR_SET_THP_DISABLE, 1, 0, 0, 0) } != 0 {
        debug!(
            "could not turn transparent huge pages off: {}",
            std::io::Error::last_os_error()
        );
    }
    let limits = match args.limits.config() {
        Ok(limits) => limits,
        Err(message) => {
            eprintln!("spindle: {message}");
            return ExitCode::from(USAGE);
        }
    };
    let session_ttl = match Duration::try_from_secs_f64(args.session_ttl) {
        Ok(ttl) => ttl,
        Err(_) => {
            eprintln!("spindle: --session-ttl must be a non-negative number of seconds");
            return ExitCode::FAILURE;
        }
    };
    let (functions, hosts) = match args.functions.config().and_then(|f| Ok((f, args.hosts.config()?))) {
        Ok(configs) => configs,
        Err(message) => {
            eprintln!("spindle: {message}");
            return ExitCode::from(USAGE);
        }
    };
    let tls = match tls_config(&args) {
        Ok(tls) => tls,
        Err(message) => {
            eprintln!("spindle: {message}");
            return ExitCode::from(USAGE);
        }
    };
    let config = Config {
        tls,
        host: args.host,
        port: args.port,
        http_port: args.http_port,
        insecure: args.insecure,
        partitions: args.partitions.map_or_else(default_partitions, usize::from),
        max_frame: args.max_frame,
        session_ttl,
        limits,
        functions,
        hosts,
        data_dir: args.data_dir,
        fsync: args.fsync,
        snapshot_after: args.snapshot_after,
        wasm: args.wasm.limits(),
        cluster: args.node_id.map(|node_id| ClusterConfig {
            node_id,
            join: args.join,
            advertise: args.advertise,
            replication_factor: usize::from(args.replication_factor),
            key: args.cluster_key,
            dead_after: Duration::from_secs_f64(args.dead_after),
        }),
    };
    if let Err(message) = config.check() {
        error!("{message}");
        eprintln!("spindle: {message}");
        return ExitCode::from(USAGE);
    }
    // Multi-thread even with one thread: blocking steps (restoring or installing a
    // snapshot, writing one received) hand the worker over with `block_in_place`, which a
    // current-thread runtime cannot do.
    let mut builder = tokio::runtime::Builder::new_multi_thread();
    if let Some(threads) = args.threads {
        builder.worker_threads(usize::from(threads));
    }
    if args.shared_cores {
        yield_before_sleeping(&mut builder);
    }
    let runtime = match builder.enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("spindle: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let embedded = args.embedded;
    runtime.block_on(async move {
        let (host, port) = (config.host.clone(), config.port);
        let server = match Server::bind(config).await {
            Ok(server) => server,
            Err(e) if e.get_ref().is_some_and(|inner| inner.is::<RecoveryError>()) => {
                error!("cannot recover persistent objects: {e}");
                eprintln!("spindle: cannot recover persistent objects: {e}");
                return ExitCode::FAILURE;
            }
            Err(e) => {
                error!("cannot listen on {host}:{port}: {e}");
                eprintln!("spindle: cannot listen on {host}:{port}: {e}");
                return ExitCode::FAILURE;
            }
        };
        let address = match server.local_addr() {
            Ok(address) => address,
            Err(e) => {
                eprintln!("spindle: cannot read the listening address: {e}");
                return ExitCode::FAILURE;
            }
        };
        let shutdown = shutdown_signal(embedded);
        let mut stdout = io::stdout().lock();
        if let Some(http) = server.http_addr() {
            let _ = writeln!(stdout, "spindle http on {http}");
        }
        // Whoever started us waits for this exact line; if nobody reads stdout, carry on.
        let _ = writeln!(stdout, "spindle listening on {address}").and_then(|()| stdout.flush());
        drop(stdout);
        match server.run(shutdown).await {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                error!("server failed: {e}");
                ExitCode::FAILURE
            }
        }
    })
}

/// The TLS flags, as absolute paths (workers and object hosts are told them, and may run
/// elsewhere than the server's directory).
fn tls_config(args: &ServerArgs) -> Result<Option<spindle_server::config::TlsConfig>, String> {
    let absolute = |path: &PathBuf| std::path::absolute(path).map_err(|e| format!("{}: {e}", path.display()));
    let (Some(cert), Some(key)) = (&args.tls_cert, &args.tls_key) else {
        return Ok(None);
    };
    Ok(Some(spindle_server::config::TlsConfig {
        cert: absolute(cert)?,
        key: absolute(key)?,
        client_ca: args.tls_client_ca.as_ref().map(absolute).transpose()?,
        ca: args.tls_ca.as_ref().map(absolute).transpose()?,
    }))
}

/// `--shared-cores`: a worker that runs out of work after a busy spell (calls arriving in a
/// stream) first lets the other processes ready to run go, and then sleeps only if no call
/// came meanwhile. It wakes to a batch, which saves per call a sleep and a wakeup (both
/// kernel work), and in a cluster a share of a Raft round and its log write. After a short
/// spell (calls arriving one by one) it sleeps at once: yielding would only delay the next.
fn yield_before_sleeping(builder: &mut tokio::runtime::Builder) {
    /// Time between waking and running out of work that counts as a busy spell.
    const BUSY: Duration = Duration::from_micros(100);
    thread_local! {
        static AWAKE_SINCE: Cell<Option<Instant>> = const { Cell::new(None) };
    }
    builder.on_thread_unpark(|| AWAKE_SINCE.with(|since| since.set(Some(Instant::now()))));
    builder.on_thread_park(|| {
        if AWAKE_SINCE.with(Cell::get).is_none_or(|since| since.elapsed() >= BUSY) {
            std::thread::yield_now();
        }
    });
}

/// Completes on SIGTERM or SIGINT, or (embedded) when stdin closes. The handlers are
/// installed at once, not when the future is first polled: a signal that comes as soon as
/// the server listens must not meet the default action (the process killed).
fn shutdown_signal(embedded: bool) -> impl std::future::Future<Output = ()> {
    use tokio::signal::unix::{signal, SignalKind};
    let handlers = (signal(SignalKind::terminate()), signal(SignalKind::interrupt()));
    async move {
        let (mut term, mut int) = match handlers {
            (Ok(term), Ok(int)) => (term, int),
            (Err(e), _) | (_, Err(e)) => {
                error!("cannot install signal handlers: {e}; stop the server with SIGKILL");
                std::future::pending::<()>().await;
                return;
            }
        };
        let stdin_closed = async {
            if embedded {
                stdin_eof().await
            } else {
                std::future::pending().await
            }
        };
        let reason = tokio::select! {
            _ = term.recv() => "SIGTERM",
            _ = int.recv() => "SIGINT",
            _ = stdin_closed => "stdin closed",
        };
        info!("{reason}: shutting down");
    }
}

/// Completes when stdin reaches end of file (or fails). Read on a plain thread so the
/// runtime never waits for a blocking read at shutdown.
async fn stdin_eof() {
    let (done, closed) = tokio::sync::oneshot::channel::<()>();
    let spawned = std::thread::Builder::new().name("stdin-watch".into()).spawn(move || {
        let mut sink = [0u8; 512];
        let mut stdin = io::stdin().lock();
        while let Ok(n) = io::Read::read(&mut stdin, &mut sink) {
            if n == 0 {
                break;
            }
        }
        let _ = done.send(());
    });
    if let Err(e) = spawned {
        error!("cannot watch stdin: {e}");
        return std::future::pending().await;
    }
    let _ = closed.await;
}

/// `--dead-after`: at least a second (a node is suspect after half of it, and a shorter
/// silence is an ordinary busy moment).
fn parse_dead_after(text: &str) -> Result<f64, String> {
    match text.parse::<f64>() {
        Ok(seconds) if (1.0..=1e9).contains(&seconds) => Ok(seconds),
        _ => Err("must be a number of seconds, 1 or more".into()),
    }
}
