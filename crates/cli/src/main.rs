//! `spindle`: run a server, or ask a running one for its status and objects.

mod client;

use std::io::{self, IsTerminal, Write};
use std::process::ExitCode;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};
use spindle_server::{config::default_partitions, Config, Server};
use tracing::{error, info};

const DEFAULT_ADDRESS: &str = "127.0.0.1:7070";

#[derive(Parser)]
#[command(name = "spindle", version, about = "Spindle: stateful serverless objects")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run a state server in the foreground.
    Server(ServerArgs),
    /// Show a running server's address, uptime, objects, connections and call rate.
    Status(AddressArg),
    /// List the named objects of a running server.
    Objects {
        /// Only names starting with this prefix.
        prefix: Option<String>,
        #[command(flatten)]
        address: AddressArg,
    },
}

#[derive(Args)]
struct ServerArgs {
    /// Interface to listen on.
    #[arg(long, default_value = "127.0.0.1")]
    host: String,
    /// TCP port (0 picks a free one; the listening line tells which).
    #[arg(long, default_value_t = 7070)]
    port: u16,
    /// Number of object partitions [default: number of cores].
    #[arg(long, value_parser = clap::value_parser!(u16).range(1..))]
    partitions: Option<u16>,
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
}

#[derive(Args)]
struct AddressArg {
    /// Server address [default: $SPINDLE_ADDRESS or 127.0.0.1:7070].
    #[arg(long, env = "SPINDLE_ADDRESS", default_value = DEFAULT_ADDRESS)]
    address: String,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Server(args) => return run_server(args),
        Command::Status(AddressArg { address }) => client::status(&address),
        Command::Objects { prefix, address } => client::objects(&address.address, prefix.as_deref().unwrap_or("")),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(message) => {
            eprintln!("spindle: {message}");
            ExitCode::FAILURE
        }
    }
}

fn run_server(args: ServerArgs) -> ExitCode {
    tracing_subscriber::fmt()
        .with_writer(io::stderr)
        .with_ansi(io::stderr().is_terminal())
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .init();
    let session_ttl = match Duration::try_from_secs_f64(args.session_ttl) {
        Ok(ttl) => ttl,
        Err(_) => {
            eprintln!("spindle: --session-ttl must be a non-negative number of seconds");
            return ExitCode::FAILURE;
        }
    };
    let config = Config {
        host: args.host,
        port: args.port,
        partitions: args.partitions.map_or_else(default_partitions, usize::from),
        max_frame: args.max_frame,
        session_ttl,
    };
    let runtime = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
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
        let mut stdout = io::stdout().lock();
        // Whoever started us waits for this exact line; if nobody reads stdout, carry on.
        let _ = writeln!(stdout, "spindle listening on {address}").and_then(|()| stdout.flush());
        drop(stdout);
        match server.run(shutdown_signal(embedded)).await {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                error!("server failed: {e}");
                ExitCode::FAILURE
            }
        }
    })
}

/// Completes on SIGTERM or SIGINT, or (embedded) when stdin closes.
async fn shutdown_signal(embedded: bool) {
    use tokio::signal::unix::{signal, SignalKind};
    let (mut term, mut int) = match (signal(SignalKind::terminate()), signal(SignalKind::interrupt())) {
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
