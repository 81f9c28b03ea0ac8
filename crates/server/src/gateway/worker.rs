//! Worker processes: start one with its output captured, watch its memory while it runs a
//! task, and report its exit to the pool (the process code itself is in `crate::process`).

use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::FileExt;
use std::process::Stdio;
use std::sync::Arc;
use std::time::Instant;

use tokio::process::Child;

use super::pool::{Action, WorkerId};
use crate::process::{self, random_hex, Launch, Proc};
use crate::Shared;
use spindle_core::{ErrorKind, Value};

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

/// Start worker `id` and its supervising task.
pub(crate) fn spawn(shared: &Arc<Shared>, id: WorkerId) -> io::Result<()> {
    let gateway = &shared.gateway;
    let capture = Capture::new(id)?;
    // Shell functions run in SPINDLE_FS, with the object commands first on their PATH.
    let fs = gateway.fs_dir().to_string_lossy().into_owned();
    let commands = gateway
        .commands_dir()
        .map(|dir| dir.to_string_lossy().into_owned())
        .unwrap_or_default();
    let max_output = gateway.config.max_call_output.to_string();
    let (child, proc) = process::spawn(
        &gateway.procs,
        Launch {
            python: &gateway.config.python,
            module: "spindle.worker",
            id_var: "SPINDLE_WORKER_ID",
            id,
            address: &shared.worker_address,
            tls: shared.tls.as_ref().map(|tls| &tls.children),
            token: shared.access.server_token(),
            max_frame: shared.config.max_frame,
            stdout: Stdio::from(capture.stdout.try_clone()?),
            stderr: Stdio::from(capture.stderr.try_clone()?),
            // The worker reports each call's output itself, and keeps the files within
            // --max-call-output; the gateway reads what a crashed call left in them.
            env: &[
                ("SPINDLE_CAPTURE", "fds"),
                ("SPINDLE_FS", &fs),
                ("SPINDLE_COMMANDS", &commands),
                ("SPINDLE_MAX_CALL_OUTPUT", &max_output),
            ],
            subreaper: true,
            containment: &shared.containment,
            kind: "worker",
            memory_limit: gateway.config.memory_limit_mb << 20,
        },
    )?;
    gateway.with_pool(|p| p.spawned(id, proc.pid));
    tracing::debug!(worker = id, pid = proc.pid, "worker started");
    tokio::spawn(supervise(shared.clone(), id, child, proc, capture));
    Ok(())
}

/// Wait for the worker to end, killing it when its task goes over its memory limit; then
/// tell the pool how it ended.
async fn supervise(shared: Arc<Shared>, id: WorkerId, mut child: Child, proc: Arc<Proc>, capture: Capture) {
    let exit = process::supervise(&mut child, &proc, || {
        tracing::info!(worker = id, pid = proc.pid, "worker over its memory limit; killing it");
        let actions = shared.gateway.with_pool(|p| p.over_memory(id));
        super::execute(&shared, actions);
    })
    .await;
    tracing::debug!(worker = id, pid = proc.pid, ?exit, "worker ended");
    shared.gateway.procs.remove(id);
    let mut actions = shared.gateway.with_pool(|p| p.exited(id, exit, None, Instant::now()));
    capture.fill(&mut actions);
    super::execute(&shared, actions);
}
