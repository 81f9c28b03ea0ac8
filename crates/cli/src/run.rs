//! `spindle run script.py [args]`: run a program against a server, starting one in this
//! process (objects and functions, on a free loopback port) when $SPINDLE_ADDRESS names none.

use std::ffi::OsString;
use std::os::unix::process::ExitStatusExt;
use std::path::PathBuf;
use std::process::{ExitCode, ExitStatus};

use clap::Args;
use spindle_server::{Config, Server};
use tokio::signal::unix::{signal, SignalKind};

use crate::{FunctionArgs, HostArgs};

#[derive(Args)]
pub(crate) struct RunArgs {
    #[command(flatten)]
    functions: FunctionArgs,
    #[command(flatten)]
    hosts: HostArgs,
    /// The Python program to run.
    script: PathBuf,
    /// Its arguments.
    #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
    args: Vec<OsString>,
}

pub(crate) fn run(args: RunArgs) -> ExitCode {
    match run_program(args) {
        Ok(status) => exit_code(status),
        Err(message) => {
            eprintln!("spindle run: {message}");
            ExitCode::FAILURE
        }
    }
}

fn run_program(args: RunArgs) -> Result<ExitStatus, String> {
    let functions = args.functions.config()?;
    let hosts = args.hosts.config()?;
    let program = |python: &PathBuf| {
        let mut command = tokio::process::Command::new(python);
        command.arg(&args.script).args(&args.args);
        command
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(|e| format!("cannot start the runtime: {e}"))?;
    if std::env::var_os("SPINDLE_ADDRESS").is_some_and(|a| !a.is_empty()) {
        // A server is named: the program talks to it; nothing to start here.
        return runtime.block_on(wait_forwarding_signals(program(&functions.python)));
    }
    crate::init_logging("warn");
    let mut command = program(&functions.python);
    // The program shares the directory of the functions it runs (`spindle sh`'s files).
    command.env("SPINDLE_FS", &functions.fs);
    match &functions.token {
        Some(token) => command.env("SPINDLE_TOKEN", token),
        None => command.env_remove("SPINDLE_TOKEN"),
    };
    // The server started here is plaintext (on loopback).
    for var in ["SPINDLE_TLS_CA", "SPINDLE_TLS_CERT", "SPINDLE_TLS_KEY"] {
        command.env_remove(var);
    }
    let config = Config {
        host: "127.0.0.1".into(),
        port: 0,
        functions,
        hosts,
        ..Config::default()
    };
    let status = runtime.block_on(async move {
        let server = Server::bind(config)
            .await
            .map_err(|e| format!("cannot start the server: {e}"))?;
        let address = server
            .local_addr()
            .map_err(|e| format!("cannot read the server's address: {e}"))?;
        command.env("SPINDLE_ADDRESS", address.to_string());
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let serving = tokio::spawn(server.run(async {
            let _ = stopped.await;
        }));
        let status = wait_forwarding_signals(command).await;
        let _ = stop.send(());
        let _ = serving.await;
        status
    });
    // Dropping the runtime drops the worker processes' handles, which kills them.
    drop(runtime);
    status
}

/// Run the program to its end. SIGTERM and SIGHUP sent to us are passed on; SIGINT is not,
/// since a terminal's Ctrl-C reaches the program directly (same process group), and we must
/// outlive it to serve its last calls.
async fn wait_forwarding_signals(mut command: tokio::process::Command) -> Result<ExitStatus, String> {
    let install = |kind| signal(kind).map_err(|e| format!("cannot install a signal handler: {e}"));
    let (mut int, mut term, mut hup) = (
        install(SignalKind::interrupt())?,
        install(SignalKind::terminate())?,
        install(SignalKind::hangup())?,
    );
    let mut child = command
        .spawn()
        .map_err(|e| format!("cannot start {:?}: {e}", command.as_std().get_program()))?;
    let pid = child.id().and_then(|pid| i32::try_from(pid).ok());
    let forward = |sig: libc::c_int| {
        if let Some(pid) = pid {
            // SAFETY: kill(2) has no memory effects; the pid is our own unreaped child.
            unsafe { libc::kill(pid, sig) };
        }
    };
    loop {
        tokio::select! {
            status = child.wait() => return status.map_err(|e| format!("cannot wait for the program: {e}")),
            _ = int.recv() => {}
            _ = term.recv() => forward(libc::SIGTERM),
            _ = hup.recv() => forward(libc::SIGHUP),
        }
    }
}

/// The program's exit code; a signal death becomes 128 + n, as shells report it.
fn exit_code(status: ExitStatus) -> ExitCode {
    let code = match (status.code(), status.signal()) {
        (Some(code), _) => code,
        (None, Some(signal)) => 128 + signal,
        (None, None) => 1,
    };
    ExitCode::from(u8::try_from(code).unwrap_or(1))
}
