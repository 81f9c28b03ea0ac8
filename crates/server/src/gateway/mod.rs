//! The function gateway: runs `invoke`s on a pool of worker processes
//! (`PYTHON -m spindle.worker`) that connect back to this server.
//!
//! The scheduling decisions live in [`pool`] (a pure state machine behind one mutex); this
//! module carries out its actions: start and watch processes ([`worker`]), send tasks on
//! worker connections, reply to invokers. Object calls never touch any of it.

mod output;
mod pool;
mod worker;

use std::collections::VecDeque;
use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock, PoisonError};
use std::time::{Duration, Instant};

use spindle_core::{ConnId, Delivery, Error, ErrorKind, Reply, Token, Value};
use tokio::sync::Notify;

use crate::config::FunctionsConfig;
use crate::process::{Exit, Table};
use crate::Shared;
use output::Stream;
pub(crate) use pool::WorkerId;
use pool::{About, Action, CallInfo, Counts, Invocation, Limits, Pool};

/// The runtimes this gateway runs (all on the same Python workers: `shell` runs a command
/// with bash, see python/spindle/shell.py; `json` a registered function with plain values,
/// for the HTTP front end).
const RUNTIMES: &[&str] = &["python", "shell", "json"];

/// The runtime workers announce in their `worker` hello.
const WORKER_RUNTIMES: &[&str] = &["python"];

pub(crate) struct Gateway {
    config: FunctionsConfig,
    state: Mutex<Guarded>,
    /// Worker processes by id (their secret, pid and watch flags).
    procs: Table,
    /// Wakes the timer task when a deadline earlier than the armed one appears.
    timer: Notify,
    /// The directory of [`spindle_proto::SHELL_OBJECT_COMMANDS`] symlinks, made when the first worker starts
    /// (`None` if it could not be made) and removed with the gateway.
    commands: OnceLock<Option<PathBuf>>,
}

struct Guarded {
    pool: Pool,
    /// The deadline the timer task sleeps until.
    armed: Option<Instant>,
}

impl Gateway {
    pub(crate) fn new(config: FunctionsConfig) -> Self {
        let limits = Limits {
            max_workers: config.max_workers.max(1),
            idle_timeout: config.idle_timeout,
            start_timeout: config.start_timeout,
        };
        Gateway {
            config,
            state: Mutex::new(Guarded {
                pool: Pool::new(limits),
                armed: None,
            }),
            procs: Table::new(),
            timer: Notify::new(),
            commands: OnceLock::new(),
        }
    }

    /// The directory of object-command symlinks for the workers' `PATH`.
    pub(crate) fn commands_dir(&self) -> Option<&Path> {
        self.commands
            .get_or_init(|| match make_commands_dir() {
                Ok(dir) => Some(dir),
                Err(e) => {
                    tracing::warn!("cannot make the object commands' directory: {e}; shell functions run without them");
                    None
                }
            })
            .as_deref()
    }

    /// `SPINDLE_FS`, created (private to this user) if missing.
    pub(crate) fn fs_dir(&self) -> &Path {
        let fs = &self.config.fs;
        if let Err(e) = std::fs::DirBuilder::new().recursive(true).mode(0o700).create(fs) {
            tracing::warn!("cannot create the shared directory {} (--fs): {e}", fs.display());
        }
        fs
    }

    /// Run `f` on the pool, then wake the timer if a deadline moved earlier.
    fn with_pool<R>(&self, f: impl FnOnce(&mut Pool) -> R) -> R {
        // The pool's invariants hold between events, so a panicked holder left it usable.
        let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        let result = f(&mut state.pool);
        let next = state.pool.next_deadline();
        if next.is_some() && (state.armed.is_none() || next < state.armed) {
            state.armed = next;
            self.timer.notify_one();
        }
        result
    }

    pub(crate) fn counts(&self) -> Counts {
        self.with_pool(|p| p.counts())
    }

    /// Invocations answered so far.
    pub(crate) fn completed(&self) -> u64 {
        self.with_pool(|p| p.completed)
    }
}

impl Drop for Gateway {
    fn drop(&mut self) {
        if let Some(Some(dir)) = self.commands.get() {
            let _ = std::fs::remove_dir_all(dir);
        }
    }
}

/// A fresh private directory in the temporary directory holding one symlink per object
/// command, each to this executable.
fn make_commands_dir() -> std::io::Result<PathBuf> {
    let exe = std::env::current_exe()?;
    let dir = std::env::temp_dir().join(format!(
        "spindle-commands-{}-{}",
        std::process::id(),
        crate::process::random_hex(6)?
    ));
    std::fs::DirBuilder::new().mode(0o700).create(&dir)?;
    // The `spindle` binary dispatches on argv[0]; shell functions find these first on PATH.
    for name in spindle_proto::SHELL_OBJECT_COMMANDS.iter().chain(&["spindle"]) {
        std::os::unix::fs::symlink(&exe, dir.join(name))?;
    }
    Ok(dir)
}

/// `invoke`: queue the call; its reply comes when it ends. `Err` is the immediate reply
/// to a refused call. `owner` is the invoking connection's user.
pub(crate) fn invoke(
    shared: &Arc<Shared>,
    conn: ConnId,
    req: u64,
    (runtime, owner): (&str, &str),
    payload: Vec<u8>,
    options: Value,
) -> Result<(), Error> {
    if !RUNTIMES.contains(&runtime) {
        return Err(Error::bad_args(format!(
            "unknown runtime '{runtime}' (this server runs: {})",
            RUNTIMES.join(", ")
        )));
    }
    let gateway = &shared.gateway;
    let parsed = parse_options(&options, gateway.config.memory_limit_mb)?;
    // A client could queue invocations faster than workers take them: they wait in the
    // server's memory, counted with the objects.
    let size = payload.len() + spindle_core::value::approx_size(&options);
    let charge = shared.shards.memory().charge(size)?;
    let now = Instant::now();
    let invocation = Invocation {
        conn,
        req,
        payload,
        charge,
        options: with_runtime(options, runtime),
        timeout: parsed.timeout,
        memory_limit: parsed.memory_mb.saturating_mul(1024 * 1024),
        detach: parsed.detach,
        submitted: now,
        about: About {
            owner: owner.to_string(),
            caller: parsed.caller,
            function: parsed.function,
            live: parsed.live,
        },
    };
    let actions = gateway.with_pool(|p| p.submit(invocation, now));
    execute(shared, actions);
    Ok(())
}

/// `cancel`: withdraw a queued invocation of this connection.
pub(crate) fn cancel(shared: &Arc<Shared>, conn: ConnId, invoke_id: u64) -> bool {
    let (cancelled, actions) = shared.gateway.with_pool(|p| p.cancel(conn, invoke_id));
    execute(shared, actions);
    cancelled
}

/// An invoking connection closed.
pub(crate) fn connection_closed(shared: &Arc<Shared>, conn: ConnId) {
    let actions = shared.gateway.with_pool(|p| p.connection_closed(conn));
    execute(shared, actions);
}

/// A connection said `worker` with `secret`. On success the connection becomes that
/// worker's task channel; the returned actions must run after the hello reply is sent,
/// so the worker reads its reply before its first task.
pub(crate) fn worker_hello(
    shared: &Arc<Shared>,
    conn: ConnId,
    secret: &str,
    runtime: &str,
) -> Result<(WorkerId, Vec<Action>), Error> {
    let unknown = || {
        Error::new(
            ErrorKind::Unauthorized,
            "unknown worker id: workers are started by the server, which gives each its id",
        )
    };
    if !WORKER_RUNTIMES.contains(&runtime) {
        return Err(Error::bad_args(format!("unknown worker runtime '{runtime}'")));
    }
    let gateway = &shared.gateway;
    let (worker, proc) = gateway.procs.authenticate(secret).ok_or_else(unknown)?;
    let (accepted, actions) = gateway.with_pool(|p| p.ready(worker, conn, Instant::now()));
    if !accepted {
        return Err(Error::new(
            ErrorKind::ProtocolError,
            "this worker already connected (or is being stopped)",
        ));
    }
    tracing::debug!(worker, pid = proc.pid, conn, "worker connected");
    Ok((worker, actions))
}

/// A frame from a worker: `[task_id, 0, report]`, `[task_id, 1, [kind, message, data]]`,
/// or, while the task runs, its output `[task_id, 2, {"stdout"|"stderr": bytes}]`.
pub(crate) fn worker_reply(shared: &Arc<Shared>, worker: WorkerId, frame: Value) -> Result<(), String> {
    let Value::Array(items) = frame else {
        return Err("a worker reply must be an array [task_id, status, result]".into());
    };
    let [task, status, result]: [Value; 3] = items
        .try_into()
        .map_err(|_| "a worker reply has 3 items [task_id, status, result]".to_string())?;
    let task = task.as_u64().ok_or("the task id must be an unsigned integer")?;
    let reply: Reply = match status.as_u64() {
        Some(0) => Ok(result),
        Some(1) => Err(error_from_value(result)),
        Some(2) => return worker_output(shared, worker, task, result),
        _ => return Err("the reply status must be 0, 1 or 2".into()),
    };
    let actions = shared
        .gateway
        .with_pool(|p| p.finished(worker, task, reply, Instant::now()));
    execute(shared, actions);
    Ok(())
}

/// `[task, 2, {"stdout"|"stderr": bytes}]`: output of the worker's running task.
fn worker_output(shared: &Arc<Shared>, worker: WorkerId, task: u64, chunk: Value) -> Result<(), String> {
    let malformed = || "output must be {\"stdout\" or \"stderr\": bytes}".to_string();
    let Value::Map(entries) = chunk else {
        return Err(malformed());
    };
    let [(stream, Value::Binary(bytes))]: [(Value, Value); 1] = entries.try_into().map_err(|_| malformed())? else {
        return Err(malformed());
    };
    let stream = stream.as_str().and_then(Stream::parse).ok_or_else(malformed)?;
    let actions = shared.gateway.with_pool(|p| p.output(worker, task, stream, bytes));
    execute(shared, actions);
    Ok(())
}

/// Who asks about calls (`spindle ps`, `kill`, `logs`): a user sees and controls its own
/// calls, an admin everyone's.
pub(crate) struct Asker<'a> {
    pub(crate) user: &'a str,
    pub(crate) admin: bool,
}

impl Asker<'_> {
    fn may(&self, owner: &str) -> bool {
        self.admin || self.user == owner
    }
}

/// `calls list`: the queued and running calls the asker may see.
pub(crate) fn list_calls(shared: &Arc<Shared>, asker: &Asker) -> Value {
    let rows = shared.gateway.with_pool(|p| p.calls(Instant::now()));
    let rows = rows
        .into_iter()
        .filter(|row| asker.may(&row.owner))
        .map(call_row)
        .collect();
    Value::Array(rows)
}

fn call_row(row: CallInfo) -> Value {
    let entries: Vec<(&str, Value)> = vec![
        ("id", Value::from(row.id)),
        ("state", Value::from(row.state)),
        ("user", Value::from(row.owner)),
        ("caller", Value::from(row.caller)),
        ("function", Value::from(row.function)),
        ("age", Value::F64(row.age)),
        ("worker", row.worker.map_or(Value::Nil, Value::from)),
    ];
    Value::Map(entries.into_iter().map(|(k, v)| (Value::from(k), v)).collect())
}

/// Call `id` if the asker may act on it, else the error to answer (`NotFound` both when
/// there is no such call and when it is another user's: ids are not secrets, calls are).
fn check_call(pool: &Pool, id: u64, asker: &Asker) -> Result<(), Error> {
    match pool.owner_of(id) {
        Some(owner) if asker.may(owner) => Ok(()),
        _ => Err(Error::new(
            ErrorKind::NotFound,
            format!("no call {id} (see spindle ps)"),
        )),
    }
}

/// `calls kill`: withdraw a queued call or kill the worker of a running one.
pub(crate) fn kill_call(shared: &Arc<Shared>, id: u64, asker: &Asker) -> Result<Value, Error> {
    let actions = shared.gateway.with_pool(|p| {
        check_call(p, id, asker)?;
        p.kill_call(id, asker.user)
            .ok_or_else(|| Error::value(format!("call {id} has ended already")))
    })?;
    execute(shared, actions);
    Ok(Value::Boolean(true))
}

/// `calls logs`: the call's kept output, as progress frames `[req, 2, chunk]` before the
/// reply; with `follow`, its next chunks too, and the reply only when it ends.
pub(crate) fn call_logs(
    shared: &Arc<Shared>,
    conn: ConnId,
    req: u64,
    id: u64,
    follow: bool,
    asker: &Asker,
) -> Result<(), Error> {
    let (chunks, followed) = shared.gateway.with_pool(|p| {
        check_call(p, id, asker)?;
        p.logs(id, follow.then_some((conn, req)))
            .ok_or_else(|| Error::new(ErrorKind::NotFound, format!("no call {id}")))
    })?;
    let mut actions: Vec<Action> = chunks
        .into_iter()
        .map(|value| Action::Push { conn, req, value })
        .collect();
    if !followed {
        let value = Value::Map(vec![(Value::from("call"), Value::from(id))]);
        actions.push(Action::Reply {
            conn,
            req,
            reply: Ok(value),
        });
    }
    execute(shared, actions);
    Ok(())
}

/// A worker's connection closed: its process is killed, and its call fails at exit.
pub(crate) fn worker_disconnected(shared: &Arc<Shared>, worker: WorkerId) {
    let actions = shared.gateway.with_pool(|p| p.disconnected(worker));
    execute(shared, actions);
}

/// Time out calls and reap workers, sleeping until the pool's next deadline.
pub(crate) async fn run_timer(shared: Arc<Shared>) {
    let gateway = &shared.gateway;
    loop {
        let (actions, next) = {
            let mut state = gateway.state.lock().unwrap_or_else(PoisonError::into_inner);
            let actions = state.pool.tick(Instant::now());
            state.armed = state.pool.next_deadline();
            (actions, state.armed)
        };
        execute(&shared, actions);
        match next {
            Some(deadline) => {
                tokio::select! {
                    _ = tokio::time::sleep_until(deadline.into()) => {}
                    _ = gateway.timer.notified() => {}
                }
            }
            None => gateway.timer.notified().await,
        }
    }
}

/// Carry out the pool's actions (outside its lock). Replies go out together at the end.
pub(crate) fn execute(shared: &Arc<Shared>, actions: Vec<Action>) {
    if actions.is_empty() {
        return;
    }
    let gateway = &shared.gateway;
    let mut pending: VecDeque<Action> = actions.into();
    let mut replies = Vec::new();
    while let Some(action) = pending.pop_front() {
        match action {
            Action::Spawn(id) => {
                if let Err(e) = worker::spawn(shared, id) {
                    let python = gateway.config.python.display();
                    let why = format!("cannot start `{python} -m spindle.worker`: {e}");
                    tracing::error!(worker = id, "{why}");
                    pending.extend(gateway.with_pool(|p| p.exited(id, Exit::default(), Some(&why), Instant::now())));
                }
            }
            Action::Run {
                worker,
                conn,
                task,
                payload,
                options,
                memory_limit,
            } => {
                if let Some(proc) = gateway.procs.get(worker) {
                    proc.watch(memory_limit);
                }
                let run = Value::Array(vec![
                    Value::from(task),
                    Value::from("run"),
                    Value::Binary(payload),
                    options,
                ]);
                let mut frame = Vec::new();
                spindle_proto::encode_frame(&run, &mut frame);
                // A worker whose connection is gone is being killed; its exit fails the call.
                if !shared.registry.send(conn, &mut frame) {
                    tracing::debug!(worker, task, "task for a closed worker connection dropped");
                }
            }
            Action::Idle(worker) => {
                if let Some(proc) = gateway.procs.get(worker) {
                    proc.watch(0);
                    // Whatever the call started ends with it: a warm worker carries nothing
                    // of one call into the next.
                    proc.kill_strays();
                }
            }
            Action::Reply { conn, req, reply } => replies.push(Delivery {
                token: Token { conn, req },
                reply,
            }),
            Action::Push { conn, req, value } => {
                // Before the replies gathered so far: a call's output goes before its end.
                shared.registry.deliver(std::mem::take(&mut replies));
                shared.registry.push(conn, req, value);
            }
            Action::Kill(worker) => {
                if let Some(proc) = gateway.procs.get(worker) {
                    // A shell function's command runs in a session of its own, and a
                    // double fork leaves its group: out of reach of the kill of the worker's
                    // process group, they go first.
                    proc.kill_strays();
                    proc.kill();
                }
            }
        }
    }
    shared.registry.deliver(replies);
}

/// The timeout of a `detach`ed invocation that gives none: nobody waits for its reply, so
/// nothing else would ever stop it (AWS Lambda's longest run, too).
const DETACHED_TIMEOUT: Duration = Duration::from_secs(15 * 60);

/// The options the gateway itself acts on.
#[derive(Debug, PartialEq)]
struct Options {
    timeout: Option<Duration>,
    memory_mb: u64,
    /// The invocation outlives its invoking connection.
    detach: bool,
    /// The caller asked for output as it comes.
    live: bool,
    /// For `spindle ps`, cut to [`DESCRIPTION`] bytes.
    caller: String,
    function: String,
}

/// The longest `caller` and `function` kept for `spindle ps`.
const DESCRIPTION: usize = 120;

/// `text` cut to [`DESCRIPTION`] bytes (at a character boundary).
fn described(text: &str) -> String {
    let mut end = text.len().min(DESCRIPTION);
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    text[..end].to_string()
}

/// The options forwarded to the worker: the client's, with `runtime` set (the worker runs
/// every runtime; it reads which one here).
fn with_runtime(options: Value, runtime: &str) -> Value {
    let mut entries = match options {
        Value::Map(entries) => entries,
        _ => Vec::new(),
    };
    entries.retain(|(k, _)| k.as_str() != Some("runtime"));
    entries.push((Value::from("runtime"), Value::from(runtime)));
    Value::Map(entries)
}

/// The gateway's [`Options`] from an invoke's options map.
fn parse_options(options: &Value, default_memory_mb: u64) -> Result<Options, Error> {
    let mut timeout = None;
    let mut memory_mb = default_memory_mb;
    let mut detach = false;
    let (mut live, mut caller, mut function) = (false, String::new(), String::new());
    for (key, value) in options.as_map().map(Vec::as_slice).unwrap_or_default() {
        match (key.as_str(), value) {
            (_, Value::Nil) => {}
            (Some("timeout"), v) => {
                let seconds = v
                    .as_f64()
                    .or_else(|| v.as_i64().map(|n| n as f64))
                    .or_else(|| v.as_u64().map(|n| n as f64))
                    .ok_or_else(|| Error::bad_args(format!("invoke: timeout must be a number of seconds, not {v}")))?;
                timeout = Some(
                    Duration::try_from_secs_f64(seconds)
                        .map_err(|_| Error::value(format!("invoke: timeout must be non-negative, not {seconds}")))?,
                );
            }
            (Some("memory_mb"), v) => {
                memory_mb = v
                    .as_u64()
                    .filter(|&mb| mb > 0)
                    .ok_or_else(|| Error::value(format!("invoke: memory_mb must be a positive integer, not {v}")))?;
            }
            (Some("detach"), v) => {
                detach = v
                    .as_bool()
                    .ok_or_else(|| Error::bad_args(format!("invoke: detach must be true or false, not {v}")))?;
            }
            (Some("live"), v) => live = v.as_bool().unwrap_or(false),
            (Some("caller"), Value::String(s)) => caller = described(s.as_str().unwrap_or("?")),
            (Some("function"), Value::String(s)) => function = described(s.as_str().unwrap_or("?")),
            // `label` and future keys are the worker's business.
            _ => {}
        }
    }
    if detach && timeout.is_none() {
        timeout = Some(DETACHED_TIMEOUT);
    }
    Ok(Options {
        timeout,
        memory_mb,
        detach,
        live,
        caller,
        function,
    })
}

/// An error reply's `[kind, message, data]` as an [`Error`].
fn error_from_value(value: Value) -> Error {
    let parts = match value {
        Value::Array(parts) => parts,
        other => return Error::new(ErrorKind::Internal, format!("the worker failed: {other}")),
    };
    let mut parts = parts.into_iter();
    let kind = parts.next();
    let kind = kind
        .as_ref()
        .and_then(Value::as_str)
        .and_then(ErrorKind::from_name)
        .unwrap_or(ErrorKind::Internal);
    let message = parts.next();
    let message = message.as_ref().and_then(Value::as_str).unwrap_or("the worker failed");
    Error::new(kind, message).with_data(parts.next().unwrap_or(Value::Nil))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn options_are_checked() {
        let map = |entries: Vec<(&str, Value)>| Value::Map(entries.into_iter().map(|(k, v)| (k.into(), v)).collect());
        assert_eq!(
            parse_options(&map(vec![]), 2048).unwrap(),
            Options {
                timeout: None,
                memory_mb: 2048,
                detach: false,
                live: false,
                caller: String::new(),
                function: String::new(),
            }
        );
        let options = parse_options(
            &map(vec![
                ("timeout", Value::F64(1.5)),
                ("memory_mb", 64.into()),
                ("label", "x".into()),
                ("detach", true.into()),
            ]),
            2048,
        )
        .unwrap();
        assert_eq!(
            options,
            Options {
                timeout: Some(Duration::from_millis(1500)),
                memory_mb: 64,
                detach: true,
                live: false,
                caller: String::new(),
                function: String::new(),
            }
        );
        assert_eq!(
            parse_options(&map(vec![("timeout", 2.into())]), 1).unwrap().timeout,
            Some(Duration::from_secs(2))
        );
        assert_eq!(
            parse_options(&map(vec![("timeout", Value::Nil)]), 1).unwrap().timeout,
            None
        );
        let e = parse_options(&map(vec![("detach", "yes".into())]), 1).unwrap_err();
        assert_eq!(e.kind, ErrorKind::BadArguments);
        let e = parse_options(&map(vec![("timeout", Value::F64(-1.0))]), 1).unwrap_err();
        assert_eq!(e.kind, ErrorKind::ValueError);
        let e = parse_options(&map(vec![("timeout", "soon".into())]), 1).unwrap_err();
        assert_eq!(e.kind, ErrorKind::BadArguments);
        let e = parse_options(&map(vec![("memory_mb", 0.into())]), 1).unwrap_err();
        assert_eq!(e.kind, ErrorKind::ValueError);
    }

    #[test]
    fn detached_invocations_get_a_default_timeout() {
        let map = |entries: Vec<(&str, Value)>| Value::Map(entries.into_iter().map(|(k, v)| (k.into(), v)).collect());
        let detached = parse_options(&map(vec![("detach", true.into())]), 1).unwrap();
        assert_eq!(detached.timeout, Some(Duration::from_secs(900)));
        let detached = parse_options(&map(vec![("detach", true.into()), ("timeout", Value::Nil)]), 1).unwrap();
        assert_eq!(
            detached.timeout,
            Some(Duration::from_secs(900)),
            "nil is no timeout given"
        );
        let given = parse_options(&map(vec![("timeout", 3.into()), ("detach", true.into())]), 1).unwrap();
        assert_eq!(given.timeout, Some(Duration::from_secs(3)), "--timeout overrides");
        let attached = parse_options(&map(vec![("detach", false.into())]), 1).unwrap();
        assert_eq!(attached.timeout, None, "a caller waiting for its reply can cancel it");
    }

    #[test]
    fn the_runtime_goes_to_the_worker_in_the_options() {
        let forwarded = with_runtime(
            Value::Map(vec![("runtime".into(), "python".into()), ("timeout".into(), 1.into())]),
            "shell",
        );
        assert_eq!(
            forwarded,
            Value::Map(vec![("timeout".into(), 1.into()), ("runtime".into(), "shell".into())])
        );
        assert_eq!(
            with_runtime(Value::Nil, "python"),
            Value::Map(vec![("runtime".into(), "python".into())])
        );
    }

    #[test]
    fn worker_errors_keep_their_kind() {
        let e = error_from_value(Value::Array(vec!["ValueError".into(), "bad".into(), 3.into()]));
        assert_eq!(
            (e.kind, e.message.as_str(), e.data),
            (ErrorKind::ValueError, "bad", 3.into())
        );
        assert_eq!(error_from_value(Value::Nil).kind, ErrorKind::Internal);
    }
}
