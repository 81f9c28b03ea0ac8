//! The worker pool as a pure state machine: invocations queue FIFO, workers start, run one
//! task at a time, and die; every event returns the [`Action`]s the gateway must carry out
//! (spawn, send a task, reply, kill). No I/O and no clock: time comes in as an argument, so
//! every scheduling decision is unit-tested here.

use ahash::HashMap;
use std::collections::VecDeque;
use std::time::{Duration, Instant};

use spindle_core::partition::Charge;
use spindle_core::{ConnId, Error, ErrorKind, Reply, Value};

use super::output::{Log, Stream, ENDED_KEPT};
use crate::process::Exit;

pub(crate) type WorkerId = u64;
pub(crate) type TaskId = u64;

/// Pool limits.
#[derive(Clone, Debug)]
pub(crate) struct Limits {
    pub(crate) max_workers: usize,
    pub(crate) idle_timeout: Duration,
    /// How long a started worker may take to connect before it counts as failed.
    pub(crate) start_timeout: Duration,
}

/// A call waiting for, or running on, a worker.
#[derive(Debug)]
pub(crate) struct Invocation {
    pub(crate) conn: ConnId,
    pub(crate) req: u64,
    pub(crate) payload: Vec<u8>,
    /// Its payload's and options' bytes in the `--max-memory` account, while it waits here.
    pub(crate) charge: Charge,
    /// Forwarded to the worker as given.
    pub(crate) options: Value,
    pub(crate) timeout: Option<Duration>,
    pub(crate) memory_limit: u64,
    /// Runs to its end even if the invoking connection closes (its reply is then dropped).
    pub(crate) detach: bool,
    pub(crate) submitted: Instant,
    /// Who asked for it and what it runs, for `spindle ps`.
    pub(crate) about: About,
}

/// What `spindle ps` tells of a call besides its state.
#[derive(Clone, Debug, Default)]
pub(crate) struct About {
    /// The user whose connection invoked it: who may see and kill it.
    pub(crate) owner: String,
    /// The caller as it describes itself (process, host), after the user.
    pub(crate) caller: String,
    /// The function's name (or the shell command).
    pub(crate) function: String,
    /// The caller sees the output as it comes (`[req, 2, {"stdout": bytes}]`).
    pub(crate) live: bool,
}

/// A call in the queue: its number (its task id once it runs) and its output so far.
#[derive(Debug)]
struct Queued {
    id: TaskId,
    invocation: Invocation,
    log: Log,
}

/// A row of `spindle ps`.
#[derive(Debug, PartialEq)]
pub(crate) struct CallInfo {
    pub(crate) id: TaskId,
    pub(crate) owner: String,
    pub(crate) caller: String,
    pub(crate) function: String,
    /// "queued" or "running".
    pub(crate) state: &'static str,
    /// Seconds since it was submitted (queued) or started (running).
    pub(crate) age: f64,
    /// The pid of the worker running it.
    pub(crate) worker: Option<u32>,
}

/// What the gateway must do after an event.
#[derive(Debug)]
pub(crate) enum Action {
    /// Start worker process `worker`.
    Spawn(WorkerId),
    /// Send `[task, "run", payload, options]` on the worker's connection.
    Run {
        worker: WorkerId,
        conn: ConnId,
        task: TaskId,
        payload: Vec<u8>,
        options: Value,
        /// Resident bytes above which the worker is killed while it runs this task.
        memory_limit: u64,
    },
    /// The worker is idle: stop watching its memory.
    Idle(WorkerId),
    /// Answer request `req` of connection `conn`.
    Reply { conn: ConnId, req: u64, reply: Reply },
    /// Kill the worker's process; its exit comes back as [`Pool::exited`].
    Kill(WorkerId),
    /// Send `[req, 2, value]` to connection `conn`: progress of a call still running.
    Push { conn: ConnId, req: u64, value: Value },
}

#[derive(Debug)]
struct Running {
    task: TaskId,
    /// `None` once the invoking connection closed: the result is dropped.
    conn: Option<ConnId>,
    req: u64,
    started: Instant,
    queued: f64,
    cold: bool,
    deadline: Option<Instant>,
    /// Not stopped when its caller goes away.
    detach: bool,
    about: About,
    log: Log,
}

#[derive(Debug)]
enum State {
    /// Spawned; its connection has not said `worker` yet.
    Starting {
        since: Instant,
    },
    Idle {
        since: Instant,
    },
    Busy(Running),
    /// Killed (or lost); waiting for the process to exit. `task` is answered at exit,
    /// when the exit status is known.
    Dying {
        reason: String,
        task: Option<Running>,
        before_hello: bool,
    },
}

#[derive(Debug)]
struct Worker {
    state: State,
    conn: ConnId,
    pid: u32,
    tasks_run: u64,
}

/// Pool sizes for `status`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Counts {
    pub(crate) workers: usize,
    pub(crate) busy: usize,
    pub(crate) queued: usize,
}

pub(crate) struct Pool {
    limits: Limits,
    queue: VecDeque<Queued>,
    workers: HashMap<WorkerId, Worker>,
    next_worker: WorkerId,
    next_task: TaskId,
    /// Invocations answered (for `invocations_per_s`).
    pub(crate) completed: u64,
    /// The logs of the latest ended calls: `(call, owner, log)`.
    ended: VecDeque<(TaskId, String, Log)>,
}

impl Pool {
    pub(crate) fn new(limits: Limits) -> Self {
        Pool {
            limits,
            queue: VecDeque::new(),
            workers: HashMap::default(),
            next_worker: 1,
            next_task: 1,
            completed: 0,
            ended: VecDeque::new(),
        }
    }

    pub(crate) fn counts(&self) -> Counts {
        Counts {
            workers: self.workers.len(),
            busy: self
                .workers
                .values()
                .filter(|w| matches!(w.state, State::Busy(_)))
                .count(),
            queued: self.queue.len(),
        }
    }

    /// A new invocation: it runs on an idle worker at once, or waits in the queue (starting
    /// a worker when the pool may grow).
    pub(crate) fn submit(&mut self, invocation: Invocation, now: Instant) -> Vec<Action> {
        let id = self.next_task;
        self.next_task += 1;
        let (conn, req, live) = (invocation.conn, invocation.req, invocation.about.live);
        let mut actions = Vec::new();
        if live && invocation.detach {
            // Its caller is about to leave: the number is how it finds the call again.
            let value = Value::Map(vec![(Value::from("call"), Value::from(id))]);
            actions.push(Action::Push { conn, req, value });
        }
        self.queue.push_back(Queued {
            id,
            invocation,
            log: Log::default(),
        });
        self.schedule(now, &mut actions);
        let full = self.workers.len() >= self.limits.max_workers;
        if live && full && self.queue.back().is_some_and(|q| q.id == id) {
            // It waits for a busy worker: the caller may warn of a pool too small.
            let value = Value::Map(vec![
                (Value::from("queued"), Value::from(id)),
                (Value::from("max_workers"), Value::from(self.limits.max_workers)),
            ]);
            actions.push(Action::Push { conn, req, value });
        }
        actions
    }

    /// `cancel`: withdraw a queued invocation of `conn`. Returns whether it was queued.
    pub(crate) fn cancel(&mut self, conn: ConnId, req: u64) -> (bool, Vec<Action>) {
        let Some(at) = self
            .queue
            .iter()
            .position(|q| q.invocation.conn == conn && q.invocation.req == req)
        else {
            return (false, Vec::new());
        };
        let message = "the invocation was cancelled before it ran";
        (true, self.withdraw(at, message))
    }

    /// Take the queued call at `at` out of the queue, answering it `Cancelled`.
    fn withdraw(&mut self, at: usize, message: &str) -> Vec<Action> {
        let mut actions = Vec::new();
        let Some(q) = self.queue.remove(at) else {
            return actions;
        };
        self.completed += 1;
        let (conn, req) = (q.invocation.conn, q.invocation.req);
        let reply = Err(Error::new(ErrorKind::Cancelled, message));
        actions.push(Action::Reply { conn, req, reply });
        self.close_log(q.id, q.invocation.about.owner, q.log, "cancelled", &mut actions);
        actions
    }

    /// A call ended: its followers are answered, and its log kept among the latest.
    fn close_log(&mut self, id: TaskId, owner: String, mut log: Log, outcome: &str, actions: &mut Vec<Action>) {
        for (conn, req) in std::mem::take(&mut log.followers) {
            let reply = Ok(ended(id, outcome, log.dropped));
            actions.push(Action::Reply { conn, req, reply });
        }
        if self.ended.len() >= ENDED_KEPT {
            self.ended.pop_front();
        }
        self.ended.push_back((id, owner, log));
    }

    /// Output of `worker`'s call `task`: forwarded to its caller (if live) and followers.
    pub(crate) fn output(&mut self, worker: WorkerId, task: TaskId, stream: Stream, bytes: Vec<u8>) -> Vec<Action> {
        let Some(Worker {
            state: State::Busy(r) | State::Dying { task: Some(r), .. },
            ..
        }) = self.workers.get_mut(&worker)
        else {
            return Vec::new();
        };
        if r.task != task {
            return Vec::new();
        }
        let Some(value) = r.log.take(stream, bytes) else {
            return Vec::new();
        };
        let caller = r.conn.filter(|_| r.about.live).map(|conn| (conn, r.req));
        caller
            .into_iter()
            .chain(r.log.followers.iter().copied())
            .map(|(conn, req)| Action::Push {
                conn,
                req,
                value: value.clone(),
            })
            .collect()
    }

    /// The queued and running calls, oldest first (`spindle ps`).
    pub(crate) fn calls(&self, now: Instant) -> Vec<CallInfo> {
        let mut rows: Vec<CallInfo> = self
            .workers
            .values()
            .filter_map(|w| match &w.state {
                State::Busy(r) => Some(CallInfo {
                    id: r.task,
                    owner: r.about.owner.clone(),
                    caller: r.about.caller.clone(),
                    function: r.about.function.clone(),
                    state: "running",
                    age: now.saturating_duration_since(r.started).as_secs_f64(),
                    worker: Some(w.pid),
                }),
                _ => None,
            })
            .collect();
        rows.sort_by_key(|row| row.id);
        rows.extend(self.queue.iter().map(|q| CallInfo {
            id: q.id,
            owner: q.invocation.about.owner.clone(),
            caller: q.invocation.about.caller.clone(),
            function: q.invocation.about.function.clone(),
            state: "queued",
            age: now.saturating_duration_since(q.invocation.submitted).as_secs_f64(),
            worker: None,
        }));
        rows
    }

    /// The user who owns call `id` (queued, running, or among the latest ended).
    pub(crate) fn owner_of(&self, id: TaskId) -> Option<&str> {
        let queued = self
            .queue
            .iter()
            .find(|q| q.id == id)
            .map(|q| &q.invocation.about.owner);
        queued
            .or_else(|| self.running(id).map(|(_, r)| &r.about.owner))
            .or_else(|| self.ended.iter().find(|e| e.0 == id).map(|e| &e.1))
            .map(String::as_str)
    }

    fn running(&self, id: TaskId) -> Option<(WorkerId, &Running)> {
        self.workers.iter().find_map(|(&wid, w)| match &w.state {
            State::Busy(r) if r.task == id => Some((wid, r)),
            _ => None,
        })
    }

    /// `spindle kill`: withdraw call `id` if queued, or kill its worker if running (its
    /// caller then gets `WorkerCrashed` saying why). `None` if no such call runs or waits.
    pub(crate) fn kill_call(&mut self, id: TaskId, by: &str) -> Option<Vec<Action>> {
        if let Some(at) = self.queue.iter().position(|q| q.id == id) {
            let message = format!("the call was killed before it ran (spindle kill, by user '{by}')");
            return Some(self.withdraw(at, &message));
        }
        let (worker, _) = self.running(id)?;
        Some(self.kill(worker, &format!("{KILLED}, by user '{by}'")))
    }

    /// `spindle logs`: the kept output of call `id` as progress values, and, to follow it,
    /// `(conn, req)` registered for its next chunks and its end (`Ok(false)`: ended, or
    /// followed by too many already). `None` if the call is unknown.
    pub(crate) fn logs(&mut self, id: TaskId, follow: Option<(ConnId, u64)>) -> Option<(Vec<Value>, bool)> {
        let log = match self.queue.iter_mut().find(|q| q.id == id) {
            Some(q) => Some(&mut q.log),
            None => self.workers.values_mut().find_map(|w| match &mut w.state {
                State::Busy(r) if r.task == id => Some(&mut r.log),
                _ => None,
            }),
        };
        if let Some(log) = log {
            let followed = follow.is_some_and(|(conn, req)| log.follow(conn, req));
            return Some((log.chunks(), followed));
        }
        let (_, _, log) = self.ended.iter().find(|e| e.0 == id)?;
        Some((log.chunks(), false))
    }

    /// The invoking connection closed: its queued calls go, and its running calls are
    /// stopped (nobody will read their results), so a vanished client's work frees the pool
    /// at once, as a process's daemon threads end with it. Detached calls stay queued and
    /// run to their end; their replies are dropped.
    pub(crate) fn connection_closed(&mut self, conn: ConnId) -> Vec<Action> {
        self.queue.retain(|q| q.invocation.conn != conn || q.invocation.detach);
        for q in &mut self.queue {
            q.log.followers.retain(|f| f.0 != conn);
        }
        for worker in self.workers.values_mut() {
            if let State::Busy(r) | State::Dying { task: Some(r), .. } = &mut worker.state {
                r.log.followers.retain(|f| f.0 != conn);
            }
        }
        for worker in self.workers.values_mut() {
            if let State::Busy(r) = &mut worker.state {
                if r.detach && r.conn == Some(conn) {
                    r.conn = None;
                }
            }
        }
        let mut orphaned = Vec::new();
        for (&id, worker) in self.workers.iter_mut() {
            let running = match &mut worker.state {
                State::Busy(r) => Some(r),
                State::Dying { task: Some(r), .. } => Some(r),
                _ => None,
            };
            if let Some(r) = running.filter(|r| r.conn == Some(conn)) {
                r.conn = None;
                orphaned.push(id);
            }
        }
        orphaned.sort_unstable();
        orphaned
            .into_iter()
            .flat_map(|id| self.kill(id, "its caller went away"))
            .collect()
    }

    /// The gateway started the process of `worker` (after [`Action::Spawn`]).
    pub(crate) fn spawned(&mut self, worker: WorkerId, pid: u32) {
        if let Some(w) = self.workers.get_mut(&worker) {
            w.pid = pid;
        }
    }

    /// The worker connected on `conn`. Returns false if it was not expected (unknown, or
    /// already connected); the gateway then refuses it.
    pub(crate) fn ready(&mut self, worker: WorkerId, conn: ConnId, now: Instant) -> (bool, Vec<Action>) {
        let mut actions = Vec::new();
        match self.workers.get_mut(&worker) {
            Some(w) if matches!(w.state, State::Starting { .. }) => {
                w.state = State::Idle { since: now };
                w.conn = conn;
            }
            _ => return (false, actions),
        }
        self.schedule(now, &mut actions);
        (true, actions)
    }

    /// The worker answered `task` with `reply` (its report, or an error).
    pub(crate) fn finished(&mut self, worker: WorkerId, task: TaskId, reply: Reply, now: Instant) -> Vec<Action> {
        let mut actions = Vec::new();
        let Some(w) = self.workers.get_mut(&worker) else {
            return actions;
        };
        let running = match &mut w.state {
            State::Busy(r) if r.task == task => {
                let State::Busy(r) = std::mem::replace(&mut w.state, State::Idle { since: now }) else {
                    unreachable!("matched Busy above")
                };
                actions.push(Action::Idle(worker));
                r
            }
            // Killed just as it finished: the result is complete, so it still counts.
            State::Dying { task: slot, .. } if slot.as_ref().is_some_and(|r| r.task == task) => {
                slot.take().expect("checked above")
            }
            _ => {
                tracing::warn!(worker, task, "a worker answered a task it was not running; ignored");
                return actions;
            }
        };
        let pid = w.pid;
        self.answer(
            running,
            reply.map(|report| with_platform_keys(report, pid)),
            &mut actions,
        );
        self.schedule(now, &mut actions);
        actions
    }

    /// The gateway saw the worker's memory go over the task's limit.
    pub(crate) fn over_memory(&mut self, worker: WorkerId) -> Vec<Action> {
        self.kill(worker, "memory limit")
    }

    /// The worker's connection closed: the process is useless without it.
    pub(crate) fn disconnected(&mut self, worker: WorkerId) -> Vec<Action> {
        self.kill(worker, "the worker's connection closed")
    }

    /// Mark the worker dying with `reason` and kill it; a running task is answered at exit.
    fn kill(&mut self, worker: WorkerId, reason: &str) -> Vec<Action> {
        let Some(w) = self.workers.get_mut(&worker) else {
            return Vec::new();
        };
        if matches!(w.state, State::Dying { .. }) {
            return Vec::new();
        }
        let dying = State::Dying {
            reason: reason.to_string(),
            task: None,
            before_hello: matches!(w.state, State::Starting { .. }),
        };
        if let State::Busy(r) = std::mem::replace(&mut w.state, dying) {
            if let State::Dying { task, .. } = &mut w.state {
                *task = Some(r);
            }
        }
        vec![Action::Kill(worker)]
    }

    /// The worker's process ended (or could not start: `exit` all `None`, `why` says why).
    pub(crate) fn exited(&mut self, worker: WorkerId, exit: Exit, why: Option<&str>, now: Instant) -> Vec<Action> {
        let mut actions = Vec::new();
        let Some(w) = self.workers.remove(&worker) else {
            return actions;
        };
        let (reason, task, before_hello) = match w.state {
            State::Starting { .. } => (
                why.map_or_else(
                    || format!("the worker {} before it connected", exit.describe()),
                    str::to_string,
                ),
                None,
                true,
            ),
            State::Idle { .. } => (String::new(), None, false),
            State::Busy(r) => ("died during the call".to_string(), Some(r), false),
            State::Dying {
                reason,
                task,
                before_hello,
            } => (reason, task, before_hello),
        };
        if let Some(r) = task {
            let reply = if reason == TIMEOUT {
                timed_out(&r)
            } else {
                let message = format!("{} ({reason})", crashed_message(w.pid, exit));
                Err(crashed(message, exit, &reason))
            };
            self.answer(r, reply, &mut actions);
        } else if before_hello {
            // A worker that cannot start fails the oldest waiting call, so a broken worker
            // setup ends every call with an error instead of respawning forever.
            if let Some(q) = self.queue.pop_front() {
                self.completed += 1;
                let message = format!("no worker could start: {reason}");
                let reply = Err(crashed(message, exit, &reason));
                actions.push(Action::Reply {
                    conn: q.invocation.conn,
                    req: q.invocation.req,
                    reply,
                });
                self.close_log(q.id, q.invocation.about.owner, q.log, "failed", &mut actions);
            }
        } else if !reason.is_empty() && reason != IDLE {
            tracing::debug!(worker, "worker ended: {reason}");
        }
        self.schedule(now, &mut actions);
        actions
    }

    /// The earliest moment [`tick`](Self::tick) has something to do.
    pub(crate) fn next_deadline(&self) -> Option<Instant> {
        self.workers
            .values()
            .filter_map(|w| match &w.state {
                State::Starting { since } => Some(*since + self.limits.start_timeout),
                State::Idle { since } => Some(*since + self.limits.idle_timeout),
                State::Busy(r) => r.deadline,
                State::Dying { .. } => None,
            })
            .min()
    }

    /// Time passed: time out calls, reap idle workers, give up on workers that never connect.
    pub(crate) fn tick(&mut self, now: Instant) -> Vec<Action> {
        let mut actions = Vec::new();
        let mut kills: Vec<(WorkerId, String)> = Vec::new();
        for (&id, w) in &mut self.workers {
            match &w.state {
                State::Starting { since } if now >= *since + self.limits.start_timeout => {
                    let secs = self.limits.start_timeout.as_secs_f64();
                    kills.push((id, format!("the worker did not connect within {secs} s")));
                }
                State::Idle { since } if now >= *since + self.limits.idle_timeout => {
                    kills.push((id, IDLE.to_string()));
                }
                // Answered when the killed worker is gone (milliseconds), with what it wrote.
                State::Busy(r) if r.deadline.is_some_and(|d| now >= d) => {
                    kills.push((id, TIMEOUT.to_string()));
                }
                _ => {}
            }
        }
        for (id, reason) in kills {
            actions.extend(self.kill(id, &reason));
        }
        actions
    }

    /// Send a finished call's reply, unless its caller left.
    fn answer(&mut self, mut r: Running, reply: Reply, actions: &mut Vec<Action>) {
        let outcome = match &reply {
            Ok(_) => "ended",
            Err(_) => "failed",
        };
        let reply = reply.map(|report| {
            set_keys(
                report,
                [("cold", Value::Boolean(r.cold)), ("queued", Value::F64(r.queued))],
            )
        });
        let (task, owner, log) = (r.task, std::mem::take(&mut r.about.owner), std::mem::take(&mut r.log));
        deliver(&mut self.completed, r, reply, actions);
        self.close_log(task, owner, log, outcome, actions);
    }

    /// Hand queued calls to idle workers (FIFO), then grow the pool for what still waits.
    fn schedule(&mut self, now: Instant, actions: &mut Vec<Action>) {
        while !self.queue.is_empty() {
            // The most recently idle worker: the others stay idle longer and get reaped,
            // so the pool shrinks to what the load needs.
            let Some((&id, _)) = self
                .workers
                .iter()
                .filter_map(|(id, w)| match w.state {
                    State::Idle { since } => Some((id, since)),
                    _ => None,
                })
                .max_by_key(|(id, since)| (*since, **id))
            else {
                break;
            };
            let Queued {
                id: task,
                invocation: i,
                log,
            } = self.queue.pop_front().expect("queue is not empty");
            let w = self.workers.get_mut(&id).expect("found above");
            if i.about.live {
                let value = Value::Map(vec![
                    (Value::from("started"), Value::from(task)),
                    (Value::from("worker"), Value::from(w.pid)),
                ]);
                actions.push(Action::Push {
                    conn: i.conn,
                    req: i.req,
                    value,
                });
            }
            w.tasks_run += 1;
            w.state = State::Busy(Running {
                task,
                conn: Some(i.conn),
                req: i.req,
                started: now,
                queued: now.saturating_duration_since(i.submitted).as_secs_f64(),
                cold: w.tasks_run == 1,
                // A timeout past what the clock can hold is no deadline at all.
                deadline: i.timeout.and_then(|t| now.checked_add(t)),
                detach: i.detach,
                about: i.about,
                log,
            });
            actions.push(Action::Run {
                worker: id,
                conn: w.conn,
                task,
                payload: i.payload,
                options: i.options,
                memory_limit: i.memory_limit,
            });
            // The payload is on its way to the worker (its connection's output is bounded).
            drop(i.charge);
        }
        let starting = self
            .workers
            .values()
            .filter(|w| matches!(w.state, State::Starting { .. }))
            .count();
        let mut wanted = self.queue.len().saturating_sub(starting);
        while wanted > 0 && self.workers.len() < self.limits.max_workers {
            let id = self.next_worker;
            self.next_worker += 1;
            self.workers.insert(
                id,
                Worker {
                    state: State::Starting { since: now },
                    conn: 0,
                    pid: 0,
                    tasks_run: 0,
                },
            );
            actions.push(Action::Spawn(id));
            wanted -= 1;
        }
    }
}

const IDLE: &str = "idle";
/// The reason of a worker killed because its call ran past its timeout.
const TIMEOUT: &str = "timeout";
/// The reason of a worker killed by `spindle kill` (the user who did follows it).
const KILLED: &str = "killed with spindle kill";

/// The final reply to a `logs -f`: how the call ended, and what it dropped.
fn ended(id: TaskId, outcome: &str, dropped: u64) -> Value {
    Value::Map(vec![
        (Value::from("call"), Value::from(id)),
        (Value::from("ended"), Value::from(outcome)),
        (Value::from("dropped"), Value::from(dropped)),
    ])
}

/// The reply to a call whose worker was killed for running past its timeout; its output is
/// filled in from the worker's capture files (worker.rs).
fn timed_out(r: &Running) -> Reply {
    let limit = r.deadline.map_or(0.0, |d| d.duration_since(r.started).as_secs_f64());
    let message = format!("the function ran past its timeout of {limit} s; its worker was killed");
    let output = Value::Map(vec![
        (Value::from("stdout"), Value::Binary(Vec::new())),
        (Value::from("stderr"), Value::Binary(Vec::new())),
    ]);
    Err(Error::new(ErrorKind::FunctionTimeout, message).with_data(output))
}

/// Count a call as answered and reply to it, unless its caller left.
fn deliver(completed: &mut u64, r: Running, reply: Reply, actions: &mut Vec<Action>) {
    *completed += 1;
    if let Some(conn) = r.conn {
        actions.push(Action::Reply {
            conn,
            req: r.req,
            reply,
        });
    }
}

/// The report with the gateway's keys set (`worker`).
fn with_platform_keys(report: Value, pid: u32) -> Value {
    set_keys(report, [("worker", Value::from(pid))])
}

/// Set `keys` in a map value, replacing same-named entries (a non-map becomes a map).
fn set_keys<const N: usize>(report: Value, keys: [(&str, Value); N]) -> Value {
    let mut entries = match report {
        Value::Map(entries) => entries,
        other => vec![(Value::from("result"), other)],
    };
    for (key, value) in keys {
        match entries.iter_mut().find(|(k, _)| k.as_str() == Some(key)) {
            Some(entry) => entry.1 = value,
            None => entries.push((Value::from(key), value)),
        }
    }
    Value::Map(entries)
}

fn crashed_message(pid: u32, exit: Exit) -> String {
    format!("worker {pid} {}", exit.describe())
}

/// A `WorkerCrashed` error with its documented data.
fn crashed(message: String, exit: Exit, reason: &str) -> Error {
    let int = |n: Option<i32>| n.map_or(Value::Nil, Value::from);
    Error::new(ErrorKind::WorkerCrashed, message).with_data(Value::Map(vec![
        (Value::from("status"), int(exit.status)),
        (Value::from("signal"), int(exit.signal)),
        (Value::from("reason"), Value::from(reason)),
        // Filled in from the worker's capture files by its watcher (worker.rs).
        (Value::from("stdout"), Value::Binary(Vec::new())),
        (Value::from("stderr"), Value::Binary(Vec::new())),
    ]))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits(max_workers: usize) -> Limits {
        Limits {
            max_workers,
            idle_timeout: Duration::from_secs(60),
            start_timeout: Duration::from_secs(30),
        }
    }

    fn call(conn: ConnId, req: u64, now: Instant) -> Invocation {
        Invocation {
            conn,
            req,
            payload: vec![req as u8],
            charge: Charge::default(),
            options: Value::Map(vec![]),
            timeout: None,
            memory_limit: 1 << 30,
            detach: false,
            submitted: now,
            about: About::default(),
        }
    }

    fn spawns(actions: &[Action]) -> Vec<WorkerId> {
        actions
            .iter()
            .filter_map(|a| match a {
                Action::Spawn(id) => Some(*id),
                _ => None,
            })
            .collect()
    }

    /// `(worker, task, request id from the payload)` of each `Run`.
    fn runs(actions: &[Action]) -> Vec<(WorkerId, TaskId, u8)> {
        actions
            .iter()
            .filter_map(|a| match a {
                Action::Run {
                    worker, task, payload, ..
                } => Some((*worker, *task, payload[0])),
                _ => None,
            })
            .collect()
    }

    fn replies(actions: Vec<Action>) -> Vec<(ConnId, u64, Reply)> {
        actions
            .into_iter()
            .filter_map(|a| match a {
                Action::Reply { conn, req, reply } => Some((conn, req, reply)),
                _ => None,
            })
            .collect()
    }

    fn field<'a>(v: &'a Value, name: &str) -> &'a Value {
        v.as_map()
            .and_then(|m| m.iter().find(|(k, _)| k.as_str() == Some(name)))
            .map(|(_, v)| v)
            .unwrap_or_else(|| panic!("no {name} in {v}"))
    }

    fn report() -> Value {
        Value::Map(vec![(Value::from("ok"), Value::Boolean(true))])
    }

    #[test]
    fn a_call_starts_a_worker_then_runs_warm() {
        let t0 = Instant::now();
        let mut pool = Pool::new(limits(4));
        let a = pool.submit(call(1, 10, t0), t0);
        assert_eq!(spawns(&a), vec![1]);
        pool.spawned(1, 4242);
        let (ok, a) = pool.ready(1, 99, t0 + Duration::from_millis(100));
        assert!(ok);
        let run = runs(&a);
        assert_eq!(run.len(), 1);
        let (_, task, _) = run[0];
        assert!(matches!(a[0], Action::Run { conn: 99, .. }));

        let out = replies(pool.finished(1, task, Ok(report()), t0 + Duration::from_millis(150)));
        assert_eq!(out.len(), 1);
        let (conn, req, reply) = &out[0];
        assert_eq!((*conn, *req), (1, 10));
        let r = reply.as_ref().unwrap();
        assert_eq!(field(r, "cold"), &Value::Boolean(true));
        assert_eq!(field(r, "worker"), &Value::from(4242));
        assert_eq!(field(r, "queued"), &Value::F64(0.1));
        assert_eq!(field(r, "ok"), &Value::Boolean(true));

        // The second call goes to the warm worker without a spawn.
        let a = pool.submit(call(1, 11, t0), t0 + Duration::from_millis(200));
        assert!(spawns(&a).is_empty());
        let (_, task, _) = runs(&a)[0];
        let out = replies(pool.finished(1, task, Ok(report()), t0));
        assert_eq!(field(out[0].2.as_ref().unwrap(), "cold"), &Value::Boolean(false));
        assert_eq!(pool.completed, 2);
    }

    #[test]
    fn many_calls_queue_fifo_over_a_small_pool() {
        let t0 = Instant::now();
        let mut pool = Pool::new(limits(2));
        let mut spawned = Vec::new();
        for req in 0..100 {
            spawned.extend(spawns(&pool.submit(call(1, req, t0), t0)));
        }
        assert_eq!(spawned, vec![1, 2], "the pool grows to its limit only");
        assert_eq!(
            pool.counts(),
            Counts {
                workers: 2,
                busy: 0,
                queued: 100
            }
        );
        let mut order = Vec::new();
        let mut running = Vec::new();
        for w in [1, 2] {
            let (_, a) = pool.ready(w, 100 + w, t0);
            running.extend(runs(&a));
        }
        assert_eq!(pool.counts().busy, 2);
        while let Some((worker, task, req)) = running.pop() {
            order.push(req);
            let a = pool.finished(worker, task, Ok(report()), t0);
            running.extend(runs(&a));
            assert_eq!(replies(a).len(), 1);
        }
        order.sort_unstable();
        assert_eq!(order, (0..100).collect::<Vec<u8>>());
        assert_eq!(pool.counts().queued, 0);
    }

    #[test]
    fn dispatch_is_first_in_first_out() {
        let t0 = Instant::now();
        let mut pool = Pool::new(limits(1));
        for req in 0..3 {
            pool.submit(call(1, req, t0), t0);
        }
        let (_, a) = pool.ready(1, 7, t0);
        let (w, task, req) = runs(&a)[0];
        assert_eq!(req, 0);
        let (_, task, req) = runs(&pool.finished(w, task, Ok(report()), t0))[0];
        assert_eq!(req, 1);
        assert_eq!(runs(&pool.finished(w, task, Ok(report()), t0))[0].2, 2);
    }

    #[test]
    fn a_crash_fails_only_its_call_and_the_worker_is_replaced() {
        let t0 = Instant::now();
        let mut pool = Pool::new(limits(1));
        pool.submit(call(1, 1, t0), t0);
        pool.submit(call(2, 2, t0), t0);
        pool.spawned(1, 55);
        let (_, a) = pool.ready(1, 9, t0);
        assert_eq!(runs(&a)[0].2, 1);
        let exit = Exit {
            status: Some(3),
            signal: None,
        };
        let a = pool.exited(1, exit, None, t0);
        assert_eq!(spawns(&a), vec![2], "a replacement starts for the waiting call");
        let out = replies(a);
        assert_eq!(out.len(), 1);
        let (conn, req, reply) = &out[0];
        assert_eq!((*conn, *req), (1, 1));
        let e = reply.as_ref().unwrap_err();
        assert_eq!(e.kind, ErrorKind::WorkerCrashed);
        assert_eq!(field(&e.data, "status"), &Value::from(3));
        assert_eq!(field(&e.data, "signal"), &Value::Nil);
        assert_eq!(e.message, "worker 55 exited with status 3 (died during the call)");
        let (_, a) = pool.ready(2, 10, t0);
        assert_eq!(runs(&a)[0].2, 2);
    }

    #[test]
    fn over_memory_kills_and_reports_the_signal_at_exit() {
        let t0 = Instant::now();
        let mut pool = Pool::new(limits(1));
        pool.submit(call(1, 1, t0), t0);
        pool.ready(1, 9, t0);
        let a = pool.over_memory(1);
        assert!(matches!(a[..], [Action::Kill(1)]));
        let exit = Exit {
            status: None,
            signal: Some(9),
        };
        let out = replies(pool.exited(1, exit, None, t0));
        let e = out[0].2.as_ref().unwrap_err();
        assert_eq!(e.kind, ErrorKind::WorkerCrashed);
        assert_eq!(field(&e.data, "reason"), &Value::from("memory limit"));
        assert_eq!(field(&e.data, "signal"), &Value::from(9));
    }

    #[test]
    fn a_timeout_kills_the_worker_and_answers_when_it_is_gone() {
        let t0 = Instant::now();
        let mut pool = Pool::new(limits(1));
        let mut c = call(1, 1, t0);
        c.timeout = Some(Duration::from_secs(2));
        pool.submit(c, t0);
        pool.submit(call(1, 2, t0), t0);
        pool.ready(1, 9, t0);
        assert_eq!(pool.next_deadline(), Some(t0 + Duration::from_secs(2)));
        assert!(pool.tick(t0 + Duration::from_secs(1)).is_empty());
        let a = pool.tick(t0 + Duration::from_secs(2));
        assert!(matches!(a[..], [Action::Kill(1)]), "answered once the worker is gone");
        // The killed worker still counts until it exits; then a replacement starts.
        assert_eq!(pool.counts().workers, 1);
        let exit = Exit {
            status: None,
            signal: Some(9),
        };
        let a = pool.exited(1, exit, None, t0 + Duration::from_secs(2));
        assert_eq!(spawns(&a), vec![2]);
        let out = replies(a);
        let error = out[0].2.as_ref().unwrap_err();
        assert_eq!(error.kind, ErrorKind::FunctionTimeout);
        assert!(error.message.contains("timeout of 2 s"), "{}", error.message);
    }

    fn replies_is_empty(actions: &[Action]) -> bool {
        !actions.iter().any(|a| matches!(a, Action::Reply { .. }))
    }

    #[test]
    fn a_worker_that_never_connects_fails_a_waiting_call() {
        let t0 = Instant::now();
        let mut pool = Pool::new(limits(1));
        pool.submit(call(1, 1, t0), t0);
        pool.submit(call(1, 2, t0), t0);
        assert_eq!(pool.next_deadline(), Some(t0 + Duration::from_secs(30)));
        let a = pool.tick(t0 + Duration::from_secs(30));
        assert!(matches!(a[..], [Action::Kill(1)]));
        let exit = Exit {
            status: None,
            signal: Some(9),
        };
        let a = pool.exited(1, exit, None, t0 + Duration::from_secs(30));
        assert_eq!(spawns(&a), vec![2], "the next waiting call gets a fresh try");
        let out = replies(a);
        assert_eq!(out.len(), 1);
        let e = out[0].2.as_ref().unwrap_err();
        assert_eq!(out[0].1, 1);
        assert_eq!(e.kind, ErrorKind::WorkerCrashed);
        assert!(e.message.contains("did not connect within 30 s"), "{}", e.message);
    }

    #[test]
    fn a_worker_that_cannot_spawn_fails_calls_until_none_wait() {
        let t0 = Instant::now();
        let mut pool = Pool::new(limits(2));
        let mut pending: Vec<WorkerId> = Vec::new();
        for req in 0..5 {
            pending.extend(spawns(&pool.submit(call(1, req, t0), t0)));
        }
        let mut failed = 0;
        let none = Exit {
            status: None,
            signal: None,
        };
        while let Some(w) = pending.pop() {
            let a = pool.exited(w, none, Some("cannot start python: not found"), t0);
            pending.extend(spawns(&a));
            failed += replies(a).len();
        }
        assert_eq!(failed, 5);
        assert_eq!(pool.counts().workers, 0);
    }

    #[test]
    fn idle_workers_are_reaped() {
        let t0 = Instant::now();
        let mut pool = Pool::new(limits(1));
        pool.submit(call(1, 1, t0), t0);
        let (_, a) = pool.ready(1, 9, t0);
        let (_, task, _) = runs(&a)[0];
        pool.finished(1, task, Ok(report()), t0);
        assert_eq!(pool.next_deadline(), Some(t0 + Duration::from_secs(60)));
        let a = pool.tick(t0 + Duration::from_secs(60));
        assert!(matches!(a[..], [Action::Kill(1)]));
        let a = pool.exited(
            1,
            Exit {
                status: None,
                signal: Some(9),
            },
            None,
            t0,
        );
        assert!(a.is_empty());
        assert_eq!(pool.counts().workers, 0);
    }

    #[test]
    fn cancel_withdraws_only_queued_calls() {
        let t0 = Instant::now();
        let mut pool = Pool::new(limits(1));
        pool.submit(call(1, 1, t0), t0);
        pool.submit(call(1, 2, t0), t0);
        pool.ready(1, 9, t0);
        assert!(!pool.cancel(1, 1).0, "running: not cancellable");
        assert!(!pool.cancel(2, 2).0, "another connection's call");
        let (ok, a) = pool.cancel(1, 2);
        assert!(ok);
        let out = replies(a);
        assert_eq!(out[0].2.as_ref().unwrap_err().kind, ErrorKind::Cancelled);
        assert_eq!(pool.counts().queued, 0);
    }

    #[test]
    fn a_closed_connection_withdraws_queued_calls_and_drops_results() {
        let t0 = Instant::now();
        let mut pool = Pool::new(limits(1));
        pool.submit(call(1, 1, t0), t0);
        pool.submit(call(1, 2, t0), t0);
        pool.submit(call(2, 3, t0), t0);
        let (_, a) = pool.ready(1, 9, t0);
        assert_eq!(runs(&a).len(), 1);
        let a = pool.connection_closed(1);
        assert!(
            matches!(a[..], [Action::Kill(1)]),
            "its running call stops: nobody wants it"
        );
        assert_eq!(pool.counts().queued, 1);
        let killed = Exit {
            status: None,
            signal: Some(9),
        };
        let a = pool.exited(1, killed, None, t0);
        assert!(replies_is_empty(&a), "nobody listens for the result");
        assert!(
            a.iter().any(|x| matches!(x, Action::Spawn(_))),
            "a worker for the other call"
        );
    }

    #[test]
    fn detached_calls_outlive_their_connection() {
        let t0 = Instant::now();
        let mut pool = Pool::new(limits(1));
        let detached = |req| Invocation {
            detach: true,
            ..call(1, req, t0)
        };
        pool.submit(detached(1), t0);
        pool.submit(detached(2), t0);
        pool.submit(call(1, 3, t0), t0);
        let (_, a) = pool.ready(1, 9, t0);
        let (_, task, req) = runs(&a)[0];
        assert_eq!(req, 1);
        let a = pool.connection_closed(1);
        assert!(a.is_empty(), "nothing is killed: {a:?}");
        assert_eq!(
            pool.counts().queued,
            1,
            "the detached call stays queued, the other goes"
        );
        let a = pool.finished(1, task, Ok(report()), t0);
        assert!(replies_is_empty(&a), "nobody listens for the result");
        assert_eq!(runs(&a)[0].2, 2, "the queued detached call runs next");
        assert_eq!(pool.completed, 1);
    }

    #[test]
    fn a_lost_worker_connection_fails_its_call_at_exit() {
        let t0 = Instant::now();
        let mut pool = Pool::new(limits(1));
        pool.submit(call(1, 1, t0), t0);
        pool.ready(1, 9, t0);
        assert!(matches!(pool.disconnected(1)[..], [Action::Kill(1)]));
        assert!(pool.disconnected(1).is_empty(), "killed once");
        let out = replies(pool.exited(
            1,
            Exit {
                status: Some(0),
                signal: None,
            },
            None,
            t0,
        ));
        let e = out[0].2.as_ref().unwrap_err();
        assert_eq!(e.kind, ErrorKind::WorkerCrashed);
        assert_eq!(field(&e.data, "reason"), &Value::from("the worker's connection closed"));
    }

    #[test]
    fn an_unknown_or_second_hello_is_refused() {
        let t0 = Instant::now();
        let mut pool = Pool::new(limits(1));
        assert!(!pool.ready(7, 1, t0).0);
        pool.submit(call(1, 1, t0), t0);
        assert!(pool.ready(1, 2, t0).0);
        assert!(!pool.ready(1, 3, t0).0);
    }

    fn pushes(actions: &[Action]) -> Vec<(ConnId, u64)> {
        actions
            .iter()
            .filter_map(|a| match a {
                Action::Push { conn, req, .. } => Some((*conn, *req)),
                _ => None,
            })
            .collect()
    }

    #[test]
    fn output_goes_to_a_live_caller_and_followers_and_kill_ends_calls() {
        let t0 = Instant::now();
        let mut pool = Pool::new(limits(1));
        let live = |conn, req| Invocation {
            about: About {
                owner: "ann".into(),
                live: true,
                ..About::default()
            },
            ..call(conn, req, t0)
        };
        pool.submit(live(1, 10), t0);
        let queued = pool.submit(live(1, 11), t0);
        assert_eq!(pushes(&queued), vec![(1, 11)], "told it waits behind a full pool");
        pool.spawned(1, 77);
        let (_, a) = pool.ready(1, 9, t0);
        let (_, task, _) = runs(&a)[0];
        assert_eq!(pushes(&a), vec![(1, 10)], "told it started");
        assert_eq!(
            pool.logs(task, Some((5, 50))).map(|(c, f)| (c.len(), f)),
            Some((0, true))
        );
        let out = pool.output(1, task, Stream::Stdout, b"hi\n".to_vec());
        assert_eq!(pushes(&out), vec![(1, 10), (5, 50)]);
        assert!(
            pool.output(1, task + 7, Stream::Stdout, b"x".to_vec()).is_empty(),
            "another task's"
        );
        let rows = pool.calls(t0);
        assert_eq!(
            rows.iter().map(|r| (r.id, r.state)).collect::<Vec<_>>(),
            vec![(task, "running"), (task + 1, "queued")]
        );
        assert_eq!(pool.owner_of(task), Some("ann"));

        // Killing the queued call answers it Cancelled; the running one's worker is killed.
        let a = pool.kill_call(task + 1, "root").unwrap();
        let out = replies(a);
        assert_eq!(out[0].2.as_ref().unwrap_err().kind, ErrorKind::Cancelled);
        let a = pool.kill_call(task, "root").unwrap();
        assert!(matches!(a[..], [Action::Kill(1)]));
        let out = replies(pool.exited(1, Exit::default(), None, t0));
        let mut reqs: Vec<u64> = out.iter().map(|(_, req, _)| *req).collect();
        reqs.sort_unstable();
        assert_eq!(reqs, vec![10, 50], "the caller and the follower are answered");
        let crashed = out.iter().find(|(_, req, _)| *req == 10).unwrap();
        assert!(crashed
            .2
            .as_ref()
            .unwrap_err()
            .message
            .contains("spindle kill, by user 'root'"));
        assert!(pool.kill_call(task, "root").is_none(), "ended");
        assert_eq!(
            pool.logs(task, None).map(|(c, _)| c.len()),
            Some(1),
            "an ended call's logs stay"
        );
    }

    #[test]
    fn a_live_detached_call_is_told_its_number_at_once() {
        let t0 = Instant::now();
        let mut pool = Pool::new(limits(4));
        let about = About {
            live: true,
            ..About::default()
        };
        let detached = Invocation {
            detach: true,
            about: about.clone(),
            ..call(1, 10, t0)
        };
        let a = pool.submit(detached, t0);
        let told: Vec<&Value> = a
            .iter()
            .filter_map(|a| match a {
                Action::Push {
                    conn: 1,
                    req: 10,
                    value,
                } => Some(value),
                _ => None,
            })
            .collect();
        let number = Value::Map(vec![(Value::from("call"), Value::from(1))]);
        assert_eq!(told, vec![&number], "before any worker started");
        assert_eq!(pool.calls(t0)[0].id, 1, "the number spindle ps shows");
        let attached = Invocation {
            about,
            ..call(1, 11, t0)
        };
        assert!(
            pushes(&pool.submit(attached, t0)).is_empty(),
            "an attached call learns it when it starts"
        );
    }
}
