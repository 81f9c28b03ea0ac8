//! Object hosts: the Python processes (`PYTHON -m spindle.host`) that hold user-defined
//! objects and run their methods, so a method that crashes or hangs never takes the server
//! down.
//!
//! The partitions own the objects (names, sessions, exactly-once) and emit requests for
//! their hosts as `Forward`s; each object goes to one of `--object-hosts` slots by a hash of
//! its key. A slot's bookkeeping (which host runs, what it was sent, what it holds) is the
//! pure state machine in [`slot`]; this module carries out its actions: start and kill
//! processes, send requests, and feed the hosts' answers back to the partitions.
//!
//! Lock order: classes → shard → slot → connection outbox. A host's reply takes its slot's
//! lock, lets go, and only then locks the object's shard.

mod output;
mod slot;

use ahash::HashMap;
use std::collections::VecDeque;
use std::io;
use std::path::PathBuf;
use std::process::Stdio;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, RwLock, RwLockReadGuard};
use std::time::Instant;

use spindle_core::objects::compiled;
use spindle_core::objects::user::{self, Forward};
use spindle_core::partition::KeyAndOwner;
use spindle_core::{ConnId, Error, ErrorKind, Partition, Value};
use tokio::process::Child;
use tokio::sync::Notify;

use crate::config::Config;
use crate::process::{self, Exit, Launch, Proc, Table};
use crate::Shared;
pub(crate) use slot::{Action, HostId};
use slot::{Limits, Slot};

/// A defined class: its version (a content hash the client computes) and code (opaque).
pub(crate) struct Class {
    pub(crate) version: String,
    pub(crate) code: Arc<Vec<u8>>,
    /// A compiled type's module, compiled at `define`: held here so the runtime's cache (of
    /// modules something uses) still has it when the first create comes.
    _module: Option<Arc<dyn compiled::Code>>,
}

pub(crate) struct Hosts {
    slots: Box<[Mutex<Slot>]>,
    procs: Table,
    /// Defined classes by type name; one version per type at a time.
    classes: RwLock<HashMap<String, Class>>,
    python: PathBuf,
    /// The deadline the timer task sleeps until.
    armed: Mutex<Option<Instant>>,
    /// Wakes the timer task when a deadline earlier than the armed one appears.
    timer: Notify,
}

impl Hosts {
    pub(crate) fn new(config: &Config) -> Self {
        let count = config.hosts.count.max(1);
        let limits = Limits {
            call_timeout: config.hosts.call_timeout,
            start_timeout: config.functions.start_timeout,
        };
        Hosts {
            slots: (0..count).map(|i| Mutex::new(Slot::new(i, count, limits))).collect(),
            procs: Table::new(),
            classes: RwLock::new(HashMap::default()),
            python: config
                .hosts
                .python
                .clone()
                .unwrap_or_else(|| config.functions.python.clone()),
            armed: Mutex::new(None),
            timer: Notify::new(),
        }
    }

    fn slot(&self, index: usize) -> MutexGuard<'_, Slot> {
        // A slot's invariants hold between events, so a panicked holder left it usable.
        self.slots[index].lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn slot_of_key(&self, key: &str) -> usize {
        crate::shard_of(key, self.slots.len())
    }

    /// `(hosts running or starting, requests sent to them and not answered)`, for `status`.
    pub(crate) fn counts(&self) -> (usize, usize) {
        (0..self.slots.len()).fold((0, 0), |(hosts, calls), i| {
            let slot = self.slot(i);
            (hosts + usize::from(slot.has_host()), calls + slot.in_flight())
        })
    }

    /// The defined classes; `create` of a `py:` type holds this across its apply, so a
    /// concurrent `define` cannot replace the version it constructs.
    pub(crate) fn classes(&self) -> RwLockReadGuard<'_, HashMap<String, Class>> {
        self.classes.read().unwrap_or_else(PoisonError::into_inner)
    }

    fn arm(&self, next: Option<Instant>) {
        let mut armed = self.armed.lock().unwrap_or_else(PoisonError::into_inner);
        if next.is_some() && (armed.is_none() || next < *armed) {
            *armed = next;
            self.timer.notify_one();
        }
    }
}

/// Run `f` on slot `index`, send the requests it produced while the slot is still locked (so
/// they leave in order), and return the other actions with the slot's next deadline.
fn lock_slot(
    shared: &Shared,
    index: usize,
    f: impl FnOnce(&mut Slot) -> Vec<Action>,
) -> (Vec<Action>, Option<Instant>) {
    let mut slot = shared.hosts.slot(index);
    let mut actions = f(&mut slot);
    actions.retain_mut(|action| match action {
        Action::Send { conn, request } => {
            let mut frame = Vec::new();
            spindle_proto::encode_frame(request, &mut frame);
            // A host whose connection is gone is being killed; its exit loses its objects.
            if !shared.registry.send(*conn, &mut frame) {
                tracing::debug!(conn = *conn, "request for a closed host connection dropped");
            }
            false
        }
        _ => true,
    });
    (actions, slot.next_deadline())
}

fn with_slot(shared: &Shared, index: usize, f: impl FnOnce(&mut Slot) -> Vec<Action>) -> Vec<Action> {
    let (actions, next) = lock_slot(shared, index, f);
    shared.hosts.arm(next);
    actions
}

/// Hand the partition's new requests to their hosts. Called with the partition's shard
/// still locked, so each host gets its objects' calls in the order they were applied; the
/// returned actions must be [`run`] after the shard is unlocked. `code` is the class's code
/// when the call was a `create` (the only source of `Construct`s).
pub(crate) fn forward(shared: &Shared, partition: &mut Partition, code: Option<&Arc<Vec<u8>>>) -> Vec<Action> {
    let forwards = partition.take_forwards();
    if forwards.is_empty() {
        return Vec::new();
    }
    let now = Instant::now();
    let mut actions = Vec::new();
    for fwd in forwards {
        let code = match &fwd {
            Forward::Construct { .. } => code,
            // A stored object's class is in its partition (logged with its first state).
            Forward::Restore { type_name, version, .. } => partition.class_code(type_name, version),
            _ => None,
        };
        let index = shared.hosts.slot_of_key(fwd.key());
        actions.extend(with_slot(shared, index, |s| s.forward(fwd, code, now)));
    }
    actions
}

/// Carry out slot actions (no lock held): start and kill hosts, and give the partitions the
/// hosts' answers.
pub(crate) fn run(shared: &Arc<Shared>, actions: Vec<Action>) {
    let mut pending: VecDeque<Action> = actions.into();
    while let Some(action) = pending.pop_front() {
        match action {
            Action::Spawn(id) => {
                if let Err(e) = spawn(shared, id) {
                    let why = format!("cannot start `{} -m spindle.host`: {e}", shared.hosts.python.display());
                    tracing::error!(host = id, "{why}");
                    let index = Slot::of(id, shared.hosts.slots.len());
                    pending.extend(with_slot(shared, index, |s| s.exited(id, Exit::default(), Some(&why))));
                }
            }
            Action::Kill(id) => {
                if let Some(proc) = shared.hosts.procs.get(id) {
                    proc.kill();
                }
            }
            Action::Complete {
                key,
                object_id,
                reply,
                state,
            } => {
                pending.extend(on_shard(shared, &key, |p, now| {
                    p.complete_with_state(&key, object_id, reply, state, now)
                }));
            }
            Action::Lose { key, object_id, reason } => {
                pending.extend(on_shard(shared, &key, |p, now| p.lose(&key, object_id, &reason, now)));
            }
            Action::Orphan { key, object_id, reason } => {
                pending.extend(on_shard(shared, &key, |p, now| {
                    p.orphaned(&key, object_id, &reason, now)
                }));
            }
            // Sent under the slot lock by `lock_slot`.
            Action::Send { .. } => {}
        }
    }
}

/// Run `f` on the partition holding `key` and deliver its replies (once the state of a
/// persistent object they log is durable).
fn on_shard(
    shared: &Arc<Shared>,
    key: &str,
    f: impl FnOnce(&mut Partition, Instant) -> Vec<spindle_core::Delivery>,
) -> Vec<Action> {
    let index = shared.shards.index_of(key);
    match shared.shards.with(index, |s| {
        if !s.serving() {
            // Stopped leading since the call went to the host: its caller was answered.
            return (Vec::new(), Vec::new());
        }
        let replies = f(&mut s.partition, Instant::now());
        let replies = s.journal(replies);
        (replies, forward(shared, &mut s.partition, None))
    }) {
        Ok((replies, actions)) => {
            shared.registry.deliver(replies);
            actions
        }
        Err(e) => {
            tracing::error!(shard = index, "an object host's answer was dropped: {e}");
            Vec::new()
        }
    }
}

fn spawn(shared: &Arc<Shared>, id: HostId) -> io::Result<()> {
    let hosts = &shared.hosts;
    let (mut child, proc) = process::spawn(
        &hosts.procs,
        Launch {
            python: &hosts.python,
            module: "spindle.host",
            id_var: "SPINDLE_HOST_ID",
            id,
            address: &shared.worker_address,
            tls: shared.tls.as_ref().map(|tls| &tls.children),
            token: shared.access.server_token(),
            max_frame: shared.config.max_frame,
            // A host's prints and tracebacks belong in the server's log, capped (output.rs).
            stdout: Stdio::piped(),
            stderr: Stdio::piped(),
            // On another Python (`--host-python`) a class shipped as code could not load, or
            // would run bytecode of another version: hosts import classes from their modules.
            env: match shared.config.hosts.python {
                Some(_) => &[("SPINDLE_HOST_IMPORTS", "1")],
                None => &[],
            },
            // An object may keep subprocesses across its calls, which the host does not reap.
            subreaper: false,
            containment: &shared.containment,
            kind: "host",
            memory_limit: shared.config.hosts.memory_limit_mb << 20,
        },
    )?;
    tracing::debug!(host = id, pid = proc.pid, "object host started");
    if let Some(stdout) = child.stdout.take() {
        output::drain(id, "stdout", stdout);
    }
    if let Some(stderr) = child.stderr.take() {
        output::drain(id, "stderr", stderr);
    }
    proc.watch(shared.config.hosts.memory_limit_mb << 20);
    tokio::spawn(supervise(shared.clone(), id, child, proc));
    Ok(())
}

/// Wait for the host to end (killing it when asked, or when it goes over its memory
/// limit), then lose what it held.
async fn supervise(shared: Arc<Shared>, id: HostId, mut child: Child, proc: Arc<Proc>) {
    let mut over_memory = false;
    let exit = process::supervise(&mut child, &proc, || {
        if !over_memory {
            tracing::info!(
                host = id,
                pid = proc.pid,
                "object host over its memory limit; killing it"
            );
            over_memory = true;
            proc.kill();
        }
    })
    .await;
    tracing::debug!(host = id, pid = proc.pid, ?exit, "object host ended");
    shared.hosts.procs.remove(id);
    let index = Slot::of(id, shared.hosts.slots.len());
    let why = over_memory.then(|| {
        let limit = shared.config.hosts.memory_limit_mb;
        format!("its object host went over its memory limit ({limit} MiB, --host-memory-limit) and was killed")
    });
    let actions = with_slot(&shared, index, |s| s.exited(id, exit, why.as_deref()));
    run(&shared, actions);
}

/// The server is stopping: the deaths of its hosts, killed with it, are no losses to warn of.
pub(crate) fn stopping(shared: &Shared) {
    for index in 0..shared.hosts.slots.len() {
        shared.hosts.slot(index).stop();
    }
}

/// A connection said `host` with `secret`: the host it names, if the server started it and
/// waits for it. The connection answers, then calls [`connected`].
pub(crate) fn authenticate(shared: &Shared, secret: &str) -> Result<HostId, Error> {
    let unknown = || {
        Error::new(
            ErrorKind::Unauthorized,
            "unknown object host id: hosts are started by the server, which gives each its id",
        )
    };
    let (id, proc) = shared.hosts.procs.authenticate(secret).ok_or_else(unknown)?;
    let index = Slot::of(id, shared.hosts.slots.len());
    if !shared.hosts.slot(index).expects(id) {
        return Err(Error::new(
            ErrorKind::ProtocolError,
            "this object host already connected (or is being stopped)",
        ));
    }
    tracing::debug!(host = id, pid = proc.pid, "object host connected");
    Ok(id)
}

/// The host's hello was answered on `conn`: send it what waited.
pub(crate) fn connected(shared: &Arc<Shared>, id: HostId, conn: ConnId) {
    let index = Slot::of(id, shared.hosts.slots.len());
    let mut expected = true;
    let actions = with_slot(shared, index, |s| {
        s.connected(id, conn, Instant::now()).unwrap_or_else(|| {
            expected = false;
            Vec::new()
        })
    });
    if !expected {
        // Killed (a start timeout) between its hello and now.
        if let Some(proc) = shared.hosts.procs.get(id) {
            proc.kill();
        }
    }
    run(shared, actions);
}

/// A frame on host `id`'s connection: the answer to its oldest request.
pub(crate) fn reply(shared: &Arc<Shared>, id: HostId, frame: Value) {
    let index = Slot::of(id, shared.hosts.slots.len());
    let actions = with_slot(shared, index, |s| s.reply(id, frame, Instant::now()));
    run(shared, actions);
}

/// Host `id`'s connection closed (or carried garbage): it is killed, and its objects lost
/// when it is gone.
pub(crate) fn disconnected(shared: &Arc<Shared>, id: HostId) {
    let index = Slot::of(id, shared.hosts.slots.len());
    let actions = with_slot(shared, index, |s| s.disconnected(id));
    run(shared, actions);
}

/// Host `id` sent something that is no answer: it is killed, and its objects lost.
pub(crate) fn broke_protocol(shared: &Arc<Shared>, id: HostId, why: &str) {
    let index = Slot::of(id, shared.hosts.slots.len());
    let actions = with_slot(shared, index, |s| s.broke_protocol(id, why));
    run(shared, actions);
}

/// Kill hosts whose oldest call ran past the object call timeout, or that never connected.
pub(crate) async fn run_timer(shared: Arc<Shared>) {
    let hosts = &shared.hosts;
    loop {
        let now = Instant::now();
        let mut actions = Vec::new();
        let mut next: Option<Instant> = None;
        for index in 0..hosts.slots.len() {
            let (more, deadline) = lock_slot(&shared, index, |s| s.tick(now));
            actions.extend(more);
            next = match (next, deadline) {
                (Some(a), Some(b)) => Some(a.min(b)),
                (a, b) => a.or(b),
            };
        }
        *hosts.armed.lock().unwrap_or_else(PoisonError::into_inner) = next;
        run(&shared, actions);
        match next {
            Some(deadline) => {
                tokio::select! {
                    _ = tokio::time::sleep_until(deadline.into()) => {}
                    _ = hosts.timer.notified() => {}
                }
            }
            None => hosts.timer.notified().await,
        }
    }
}

/// `define`: register `code` as `type_name`'s class at `version`. Another version replaces
/// the registered one only while no object of that one exists. With `unless_defined`, a
/// caller without the define permission: only a version already defined passes (a no-op).
pub(crate) fn define(
    shared: &Shared,
    type_name: &str,
    version: &str,
    code: Vec<u8>,
    unless_defined: Option<Error>,
) -> Result<Value, Error> {
    let module = compiled::is_compiled_type(type_name);
    match module {
        true => compiled::check_type_name(type_name)?,
        false => user::check_type_name(type_name)?,
    }
    if version.is_empty() {
        return Err(Error::bad_args("define: the version must not be empty"));
    }
    let mut classes = shared.hosts.classes.write().unwrap_or_else(PoisonError::into_inner);
    let defined = classes.get(type_name).is_some_and(|class| class.version == version);
    if let (false, Some(refusal)) = (defined, unless_defined) {
        return Err(refusal);
    }
    if module {
        // Compiled once here, where a module that breaks the ABI is refused with why; its
        // objects keep the code they were created with, so another version may follow.
        let compiled = shared.shards.library().load(type_name, version, &code)?;
        let methods = compiled.methods().iter().map(|m| Value::from(m.as_str())).collect();
        if !defined {
            tracing::debug!(type_name, version, bytes = code.len(), "module defined");
            classes.insert(
                type_name.to_string(),
                Class {
                    version: version.to_string(),
                    code: Arc::new(code),
                    _module: Some(compiled),
                },
            );
        }
        return Ok(Value::Array(methods));
    }
    if let Some(class) = classes.get(type_name) {
        if class.version == version {
            return Ok(Value::Boolean(true));
        }
        // Creates hold the read lock across their apply, so this list cannot go stale.
        let alive = objects_of_version(shared, type_name, &class.version)?;
        if !alive.is_empty() {
            return Err(Error::new(
                ErrorKind::TypeMismatch,
                still_used(type_name, &class.version, version, &alive),
            ));
        }
    }
    tracing::debug!(type_name, version, bytes = code.len(), "class defined");
    classes.insert(
        type_name.to_string(),
        Class {
            version: version.to_string(),
            code: Arc::new(code),
            _module: None,
        },
    );
    Ok(Value::Boolean(true))
}

/// The live objects of `type_name` at `version` on every shard, as `(key, owning session)`.
pub(crate) fn objects_of_version(shared: &Shared, type_name: &str, version: &str) -> Result<Vec<KeyAndOwner>, Error> {
    let shards = &shared.shards;
    let mut alive = Vec::new();
    for index in 0..shards.count() {
        alive.extend(shards.with(index, |s| s.partition.objects_of_version(type_name, version))?);
    }
    Ok(alive)
}

/// Why `version` cannot replace `old` yet: which objects still use it, and what to do.
fn still_used(type_name: &str, old: &str, version: &str, alive: &[KeyAndOwner]) -> String {
    const SHOWN: usize = 5;
    let mut named: Vec<&str> = alive
        .iter()
        .filter(|(_, owner)| owner.is_none())
        .map(|(key, _)| key.as_str())
        .collect();
    named.sort_unstable();
    let unnamed = alive.len() - named.len();
    let mut parts = Vec::new();
    if !named.is_empty() {
        let mut list = named
            .iter()
            .take(SHOWN)
            .map(|k| format!("'{k}'"))
            .collect::<Vec<_>>()
            .join(", ");
        if named.len() > SHOWN {
            list.push_str(&format!(" and {} more", named.len() - SHOWN));
        }
        parts.push(format!(
            "{} named object(s) ({list}): delete them (spindle.delete(obj) in Python) to define the new version, \
             or give the edited class another name",
            named.len()
        ));
    }
    if unnamed > 0 {
        parts.push(format!(
            "{unnamed} unnamed object(s) of programs still running: they go when those programs end"
        ));
    }
    format!(
        "{type_name} is defined at version {old}, which objects still use, so version {version} \
         cannot be defined yet: {}",
        parts.join("; ")
    )
}

/// After recovery: register the classes the partitions logged, so objects they stored can be
/// attached to (and their version is held back from `define`) without defining them again.
/// Per type, the version that objects are stored with (one at a time, as `define` keeps it).
pub(crate) fn register_recovered_classes(shared: &Shared) -> Result<usize, Error> {
    let mut found: HashMap<String, (String, Arc<Vec<u8>>, usize)> = HashMap::default();
    for index in 0..shared.shards.count() {
        let classes = shared.shards.with(index, |s| {
            let p = &s.partition;
            p.classes()
                .into_iter()
                .map(|(t, v, code)| {
                    let alive = p.count_version(&t, &v);
                    (t, v, code, alive)
                })
                .collect::<Vec<_>>()
        })?;
        for (type_name, version, code, alive) in classes {
            match found.get_mut(&type_name) {
                Some(entry) if entry.0 == version => entry.2 += alive,
                Some(entry) if entry.2 >= alive => {
                    if alive > 0 {
                        tracing::warn!(type_name, version, "stored objects of two versions of one class");
                    }
                }
                _ => {
                    found.insert(type_name, (version, code, alive));
                }
            }
        }
    }
    let mut classes = shared.hosts.classes.write().unwrap_or_else(PoisonError::into_inner);
    let mut registered = 0;
    for (type_name, (version, code, alive)) in found {
        if alive == 0 {
            continue; // nothing stored needs it
        }
        tracing::debug!(type_name, version, objects = alive, "class recovered");
        // A compiled type's module is compiled in the partitions that hold its objects.
        classes.insert(
            type_name,
            Class {
                version,
                code,
                _module: None,
            },
        );
        registered += 1;
    }
    Ok(registered)
}

/// The code to construct `type_name` at the `version` a `create` names.
pub(crate) fn class_code(
    classes: &HashMap<String, Class>,
    type_name: &str,
    version: &str,
) -> Result<Arc<Vec<u8>>, Error> {
    match classes.get(type_name) {
        Some(class) if class.version == version => Ok(class.code.clone()),
        Some(class) => Err(Error::new(
            ErrorKind::UnknownType,
            format!(
                "{type_name} version {version} is not defined (this server has version {}); define it first",
                class.version
            ),
        )),
        None => Err(Error::new(
            ErrorKind::UnknownType,
            format!("{type_name} is not defined on this server; define it first"),
        )),
    }
}
