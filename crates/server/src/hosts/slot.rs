//! One object-host slot as a pure state machine: at most one live host process (an
//! incarnation), the requests sent to it in order, the objects it holds, and the hosts being
//! killed. Every event returns the [`Action`]s the I/O layer must carry out. No I/O and no
//! clock: time comes in as an argument.

use ahash::{HashMap, HashSet};
use std::collections::VecDeque;
use std::sync::Arc;
use std::time::{Duration, Instant};

use spindle_core::objects::user::{short_name, Forward};
use spindle_core::{ConnId, Error, ErrorKind, Reply, Value};

use crate::process::Exit;

pub(crate) type HostId = u64;

#[derive(Clone, Copy, Debug)]
pub(crate) struct Limits {
    /// A request at the front of a host's queue longer than this gets the host killed.
    pub(crate) call_timeout: Duration,
    /// A started host that has not connected after this long is killed.
    pub(crate) start_timeout: Duration,
}

/// What the I/O layer must do after an event.
#[derive(Debug, PartialEq)]
pub(crate) enum Action {
    /// Start host process `HostId`; it connects back with its secret.
    Spawn(HostId),
    /// Send this request on the host's connection. Carried out before the slot is unlocked,
    /// so requests leave in the order they were queued.
    Send { conn: ConnId, request: Value },
    /// Kill the host's process group; its exit comes back as [`Slot::exited`].
    Kill(HostId),
    /// The host answered the oldest call (or the constructor) of this object; `state`: the
    /// pickled state it sent with the answer (a persistent object).
    Complete {
        key: String,
        object_id: u64,
        reply: Reply,
        state: Option<Vec<u8>>,
    },
    /// The object's host died: the partition answers its calls `ObjectLost`.
    Lose {
        key: String,
        object_id: u64,
        reason: String,
    },
    /// A call reached this slot for an object no host of it holds: its constructor failed or
    /// its host died, and that answer is on its way (or already given). The partition answers
    /// `ObjectLost` unless the object is still constructing (`Partition::orphaned`).
    Orphan {
        key: String,
        object_id: u64,
        reason: String,
    },
}

#[derive(Debug)]
enum What {
    /// `code`: the request carried the class's code (the host has not loaded it yet).
    Construct {
        type_name: String,
        version: String,
        code: bool,
    },
    /// Rebuilding a persistent object from its stored state.
    Restore {
        type_name: String,
        version: String,
        code: bool,
    },
    Call {
        type_name: String,
        method: String,
    },
    Drop,
    /// A transaction's copy of the object (`Pending::object_id` is the copy's id).
    Copy,
    /// The copy becomes the instance: an instance that did not would miss a commit.
    Adopt,
    /// The copy goes; the host holds it until it answers.
    DropCopy,
}

/// A request sent (or buffered) and not answered yet.
#[derive(Debug)]
struct Pending {
    rid: u64,
    key: String,
    object_id: u64,
    what: What,
}

#[derive(Debug)]
struct Host {
    id: HostId,
    /// `None` until the process connects and says `host`.
    conn: Option<ConnId>,
    started: Instant,
    /// Requests waiting for the connection.
    buffered: Vec<Value>,
    /// The instances it holds (constructed or constructing): key → object id.
    objects: HashMap<String, u64>,
    /// The transactions' copies it holds (asked for, and not dropped or adopted yet), as
    /// (key, copy id): lost with it like the instances.
    copies: HashSet<(String, u64)>,
    /// Types and versions whose code it has been sent.
    versions: HashSet<(String, String)>,
    /// Requests in the order sent; the host answers the front first.
    pending: VecDeque<Pending>,
    /// When the front request reached the front (`None`: nothing pending, or not connected).
    front_since: Option<Instant>,
    next_rid: u64,
    /// Set once the host is being killed: why (`None`: its exit status will tell).
    doom: Option<Option<String>>,
}

impl Host {
    fn new(id: HostId, now: Instant) -> Self {
        Host {
            id,
            conn: None,
            started: now,
            buffered: Vec::new(),
            objects: HashMap::default(),
            copies: HashSet::default(),
            versions: HashSet::default(),
            pending: VecDeque::new(),
            front_since: None,
            next_rid: 1,
            doom: None,
        }
    }

    fn holds(&self, key: &str, object_id: u64) -> bool {
        self.objects.get(key) == Some(&object_id)
    }

    fn holds_copy(&self, key: &str, copy_id: u64) -> bool {
        !self.copies.is_empty() && self.copies.contains(&(key.to_string(), copy_id))
    }

    /// Queue `request` (whose first item is filled in with its rid) and send it if connected.
    fn send(&mut self, pending: Pending, mut request: Vec<Value>, now: Instant, actions: &mut Vec<Action>) {
        let rid = self.next_rid;
        self.next_rid += 1;
        request[0] = Value::from(rid);
        let request = Value::Array(request);
        if self.pending.is_empty() && self.conn.is_some() {
            self.front_since = Some(now);
        }
        self.pending.push_back(Pending { rid, ..pending });
        match self.conn {
            Some(conn) => actions.push(Action::Send { conn, request }),
            None => self.buffered.push(request),
        }
    }
}

pub(crate) struct Slot {
    index: usize,
    /// Slots in all (host ids are `incarnation × slots + index`, so an id names its slot).
    slots: usize,
    incarnations: u64,
    limits: Limits,
    live: Option<Host>,
    /// Hosts being killed, until their exit: their objects are lost then.
    dying: Vec<Host>,
    /// Why this slot's last host died: the answer to calls on its objects that arrive later.
    last_loss: Option<String>,
    /// The server is stopping: its hosts die with it, which loses nothing worth a warning.
    stopping: bool,
}

impl Slot {
    pub(crate) fn new(index: usize, slots: usize, limits: Limits) -> Self {
        Slot {
            index,
            slots,
            incarnations: 0,
            limits,
            live: None,
            dying: Vec::new(),
            last_loss: None,
            stopping: false,
        }
    }

    /// The server is stopping (its hosts are killed with it).
    pub(crate) fn stop(&mut self) {
        self.stopping = true;
    }

    /// The slot of host `id`.
    pub(crate) fn of(id: HostId, slots: usize) -> usize {
        (id % slots as u64) as usize
    }

    /// Whether the slot has a host running or starting (for `status`).
    pub(crate) fn has_host(&self) -> bool {
        self.live.is_some()
    }

    /// Requests sent to the live host and not answered yet.
    pub(crate) fn in_flight(&self) -> usize {
        self.live.as_ref().map_or(0, |h| h.pending.len())
    }

    /// Whether host `id` is this slot's live host and still waiting for its connection.
    pub(crate) fn expects(&self, id: HostId) -> bool {
        self.live.as_ref().is_some_and(|h| h.id == id && h.conn.is_none())
    }

    /// A request for the host of `fwd`'s object, applied by its partition in this order.
    /// `code` is the class's code for a `Construct` (sent once per host and version).
    pub(crate) fn forward(&mut self, fwd: Forward, code: Option<&Arc<Vec<u8>>>, now: Instant) -> Vec<Action> {
        let mut actions = Vec::new();
        match fwd {
            Forward::Construct {
                key,
                object_id,
                type_name,
                version,
                args,
                kwargs,
                persistent,
            } => {
                let class = (type_name.clone(), version.clone());
                let known = self.live.as_ref().is_some_and(|h| h.versions.contains(&class));
                let code = match (known, code) {
                    (true, _) => Value::Nil,
                    (false, Some(code)) => Value::Binary(code.to_vec()),
                    (false, None) => {
                        // The server passes the code with every construct; without it the
                        // host could not build the object.
                        let e = Error::new(ErrorKind::UnknownType, format!("{type_name} is not defined"));
                        actions.push(Action::Complete {
                            key,
                            object_id,
                            reply: Err(e),
                            state: None,
                        });
                        return actions;
                    }
                };
                let host = self.live_host(now, &mut actions);
                let sends_code = !code.is_nil();
                host.versions.insert(class);
                host.objects.insert(key.clone(), object_id);
                let mut request = vec![
                    Value::Nil,
                    "construct".into(),
                    key.as_str().into(),
                    type_name.as_str().into(),
                    version.as_str().into(),
                    code,
                    Value::Array(args),
                    kwargs,
                ];
                if persistent {
                    // An optional operand: the host sends the instance's state with every answer.
                    request.push(Value::Boolean(true));
                }
                let pending = Pending {
                    rid: 0,
                    key,
                    object_id,
                    what: What::Construct {
                        type_name,
                        version,
                        code: sends_code,
                    },
                };
                host.send(pending, request, now, &mut actions);
            }
            Forward::Restore {
                key,
                object_id,
                type_name,
                version,
                state,
            } => {
                let class = (type_name.clone(), version.clone());
                let known = self.live.as_ref().is_some_and(|h| h.versions.contains(&class));
                let code = match (known, code) {
                    (true, _) => Value::Nil,
                    (false, Some(code)) => Value::Binary(code.to_vec()),
                    (false, None) => {
                        let reason =
                            format!("it could not be restored: this server has no code for {type_name} {version}");
                        actions.push(Action::Lose { key, object_id, reason });
                        return actions;
                    }
                };
                let host = self.live_host(now, &mut actions);
                let sends_code = !code.is_nil();
                host.versions.insert(class);
                host.objects.insert(key.clone(), object_id);
                let request = vec![
                    Value::Nil,
                    "restore".into(),
                    key.as_str().into(),
                    type_name.as_str().into(),
                    version.as_str().into(),
                    code,
                    Value::Binary(state),
                ];
                let pending = Pending {
                    rid: 0,
                    key,
                    object_id,
                    what: What::Restore {
                        type_name,
                        version,
                        code: sends_code,
                    },
                };
                host.send(pending, request, now, &mut actions);
            }
            Forward::Call {
                key,
                object_id,
                type_name,
                method,
                args,
                kwargs,
            } => match self.live.as_mut().filter(|h| h.holds(&key, object_id)) {
                Some(host) => {
                    let request = call_request(&key, &method, args, kwargs, None);
                    let pending = Pending {
                        rid: 0,
                        key,
                        object_id,
                        what: What::Call { type_name, method },
                    };
                    host.send(pending, request, now, &mut actions);
                }
                // Its host is being killed: the object is lost when it is gone, this call too.
                None if self.dying.iter().any(|h| h.holds(&key, object_id)) => {}
                None => actions.push(Action::Orphan {
                    key,
                    object_id,
                    reason: self.loss_reason(),
                }),
            },
            Forward::Drop { key, object_id } => {
                for host in self.dying.iter_mut().filter(|h| h.holds(&key, object_id)) {
                    host.objects.remove(&key);
                }
                if let Some(host) = self.live.as_mut().filter(|h| h.holds(&key, object_id)) {
                    host.objects.remove(&key);
                    let request = vec![Value::Nil, "drop".into(), key.as_str().into()];
                    let pending = Pending {
                        rid: 0,
                        key,
                        object_id,
                        what: What::Drop,
                    };
                    host.send(pending, request, now, &mut actions);
                }
            }
            Forward::Copy {
                key,
                object_id,
                copy_id,
            } => match self.live.as_mut().filter(|h| h.holds(&key, object_id)) {
                Some(host) => {
                    host.copies.insert((key.clone(), copy_id));
                    let request = vec![Value::Nil, "copy".into(), key.as_str().into(), copy_id.into()];
                    let pending = Pending {
                        rid: 0,
                        key,
                        object_id: copy_id,
                        what: What::Copy,
                    };
                    host.send(pending, request, now, &mut actions);
                }
                // The instance is gone with its host (or going): so is the copy.
                None => actions.push(Action::Orphan {
                    key,
                    object_id: copy_id,
                    reason: self.loss_reason(),
                }),
            },
            Forward::CopyCall {
                key,
                copy_id,
                type_name,
                method,
                args,
                kwargs,
            } => match self.live.as_mut().filter(|h| h.holds_copy(&key, copy_id)) {
                Some(host) => {
                    let request = call_request(&key, &method, args, kwargs, Some(copy_id));
                    let pending = Pending {
                        rid: 0,
                        key,
                        object_id: copy_id,
                        what: What::Call { type_name, method },
                    };
                    host.send(pending, request, now, &mut actions);
                }
                // Its host is being killed: the copy is lost when it is gone, this call too.
                None if self.dying.iter().any(|h| h.holds_copy(&key, copy_id)) => {}
                None => actions.push(Action::Orphan {
                    key,
                    object_id: copy_id,
                    reason: self.loss_reason(),
                }),
            },
            Forward::Adopt {
                key,
                object_id,
                copy_id,
            } => {
                // A host that died with the copy lost the object too: nothing to adopt.
                if let Some(host) = self.live.as_mut().filter(|h| h.holds_copy(&key, copy_id)) {
                    host.copies.remove(&(key.clone(), copy_id));
                    host.objects.insert(key.clone(), object_id);
                    let request = vec![Value::Nil, "adopt".into(), key.as_str().into(), copy_id.into()];
                    let pending = Pending {
                        rid: 0,
                        key,
                        object_id: copy_id,
                        what: What::Adopt,
                    };
                    host.send(pending, request, now, &mut actions);
                }
            }
            // A dying host's copies are lost with it (its calls answered then).
            Forward::DropCopy { key, copy_id } => {
                if let Some(host) = self.live.as_mut().filter(|h| h.holds_copy(&key, copy_id)) {
                    let request = vec![Value::Nil, "drop".into(), key.as_str().into(), copy_id.into()];
                    let pending = Pending {
                        rid: 0,
                        key,
                        object_id: copy_id,
                        what: What::DropCopy,
                    };
                    host.send(pending, request, now, &mut actions);
                }
            }
        }
        actions
    }

    /// Why an object no host of this slot holds is gone.
    fn loss_reason(&self) -> String {
        self.last_loss
            .clone()
            .unwrap_or_else(|| "its object host stopped".to_string())
    }

    /// The live host, started if there is none.
    fn live_host(&mut self, now: Instant, actions: &mut Vec<Action>) -> &mut Host {
        if self.live.is_none() {
            self.incarnations += 1;
            let id = self.incarnations * self.slots as u64 + self.index as u64;
            actions.push(Action::Spawn(id));
            self.live = Some(Host::new(id, now));
        }
        self.live.as_mut().expect("set above")
    }

    /// Host `id` connected on `conn` (its `host` hello was answered): send what waited for
    /// it. `None` if it was not expected (unknown, connected already, or being killed).
    pub(crate) fn connected(&mut self, id: HostId, conn: ConnId, now: Instant) -> Option<Vec<Action>> {
        let host = self.live.as_mut().filter(|h| h.id == id && h.conn.is_none())?;
        host.conn = Some(conn);
        if !host.pending.is_empty() {
            host.front_since = Some(now);
        }
        let actions = host
            .buffered
            .drain(..)
            .map(|request| Action::Send { conn, request })
            .collect();
        Some(actions)
    }

    /// A frame from host `id`: `[rid, 0, result]` or `[rid, 1, [kind, message, data]]`,
    /// answering the oldest request. Anything else gets the host killed.
    pub(crate) fn reply(&mut self, id: HostId, frame: Value, now: Instant) -> Vec<Action> {
        let Some(host) = self.live.as_mut().filter(|h| h.id == id) else {
            // A host being killed may still answer; its objects are lost anyway.
            return Vec::new();
        };
        let (rid, reply, state) = match parse_reply(frame) {
            Ok(parsed) => parsed,
            Err(message) => return self.kill(format!("its object host broke the protocol ({message})")),
        };
        match host.pending.front() {
            Some(front) if front.rid == rid => {}
            Some(front) => {
                let message = format!("it answered request {rid} while request {} was due", front.rid);
                return self.kill(format!("its object host broke the protocol ({message})"));
            }
            None => {
                let message = format!("it answered request {rid}, but none was due");
                return self.kill(format!("its object host broke the protocol ({message})"));
            }
        }
        let done = host.pending.pop_front().expect("checked above");
        host.front_since = (!host.pending.is_empty()).then_some(now);
        let (key, object_id) = (done.key, done.object_id);
        match done.what {
            What::Construct {
                type_name,
                version,
                code,
            } => {
                if reply.is_err() && host.holds(&key, object_id) {
                    host.objects.remove(&key);
                }
                if reply.is_err() && code {
                    // Perhaps the class did not load (a module missing in the host): the next
                    // construct sends the code again rather than meet "no code for it" there.
                    host.versions.remove(&(type_name, version));
                }
                let reply = reply.map(|_| Value::Nil);
                vec![Action::Complete {
                    key,
                    object_id,
                    reply,
                    state,
                }]
            }
            What::Restore {
                type_name,
                version,
                code,
            } => match reply {
                Ok(_) => Vec::new(),
                Err(e) => {
                    // The host holds no instance: its calls queued behind are answered
                    // `ObjectLost` now, and the object stays stored for its next call.
                    if host.holds(&key, object_id) {
                        host.objects.remove(&key);
                    }
                    if code {
                        host.versions.remove(&(type_name, version));
                    }
                    let reason = format!(
                        "it could not be restored from its stored state in its object host ({}: {})",
                        e.kind.as_str(),
                        e.message
                    );
                    vec![Action::Lose { key, object_id, reason }]
                }
            },
            What::Call { .. } => vec![Action::Complete {
                key,
                object_id,
                reply,
                state,
            }],
            What::Drop => Vec::new(),
            What::Copy => vec![Action::Complete {
                key,
                object_id,
                reply: reply.map(|_| Value::Nil),
                state: None,
            }],
            What::Adopt => match reply {
                Ok(_) => Vec::new(),
                // Its instance misses a committed change: it must not serve another call.
                Err(e) => self.kill(format!(
                    "its object host could not adopt a transaction's copy of '{key}' ({}: {})",
                    e.kind.as_str(),
                    e.message
                )),
            },
            What::DropCopy => {
                host.copies.remove(&(key, object_id));
                Vec::new()
            }
        }
    }

    /// Host `id` sent something that is no answer (`why` says what).
    pub(crate) fn broke_protocol(&mut self, id: HostId, why: &str) -> Vec<Action> {
        match &self.live {
            Some(h) if h.id == id => self.kill(format!("its object host broke the protocol ({why})")),
            _ => Vec::new(),
        }
    }

    /// Kill the live host with `reason`; its objects are lost when it is gone.
    fn kill(&mut self, reason: String) -> Vec<Action> {
        self.doom(Some(reason))
    }

    fn doom(&mut self, reason: Option<String>) -> Vec<Action> {
        let Some(mut host) = self.live.take() else {
            return Vec::new();
        };
        if let Some(reason) = &reason {
            tracing::warn!(host = host.id, slot = self.index, "killing object host: {reason}");
        }
        host.doom = Some(reason);
        let id = host.id;
        self.dying.push(host);
        vec![Action::Kill(id)]
    }

    /// Host `id`'s connection closed: the process is useless without it.
    pub(crate) fn disconnected(&mut self, id: HostId) -> Vec<Action> {
        match &self.live {
            Some(h) if h.id == id => self.doom(None),
            _ => Vec::new(),
        }
    }

    /// Host `id`'s process ended (or could not start: `why` says why). Every object it held
    /// is lost.
    pub(crate) fn exited(&mut self, id: HostId, exit: Exit, why: Option<&str>) -> Vec<Action> {
        let host = if self.live.as_ref().is_some_and(|h| h.id == id) {
            self.live.take()
        } else {
            let at = self.dying.iter().position(|h| h.id == id);
            at.map(|i| self.dying.swap_remove(i))
        };
        let Some(host) = host else {
            return Vec::new();
        };
        let reason = match (host.doom, why) {
            (Some(Some(reason)), _) => reason,
            (_, Some(why)) => why.to_string(),
            _ if host.conn.is_none() => format!("its object host {} before it connected", exit.describe()),
            _ => format!("its object host {}", exit.describe()),
        };
        let objects = host.objects.len();
        if objects > 0 && self.stopping {
            tracing::debug!(
                host = id,
                slot = self.index,
                objects,
                "objects gone with the server: {reason}"
            );
        } else if objects > 0 {
            tracing::warn!(host = id, slot = self.index, objects, "objects lost: {reason}");
        }
        let mut lost: Vec<(String, u64)> = host.objects.into_iter().chain(host.copies).collect();
        lost.sort_unstable();
        self.last_loss = Some(reason.clone());
        lost.into_iter()
            .map(|(key, object_id)| Action::Lose {
                key,
                object_id,
                reason: reason.clone(),
            })
            .collect()
    }

    /// The earliest moment [`tick`](Self::tick) has something to do.
    pub(crate) fn next_deadline(&self) -> Option<Instant> {
        let host = self.live.as_ref()?;
        // A limit too large for the clock never expires.
        match host.conn {
            None => host.started.checked_add(self.limits.start_timeout),
            Some(_) => host.front_since?.checked_add(self.limits.call_timeout),
        }
    }

    /// Time passed: kill a host that never connected, or whose oldest request ran too long.
    pub(crate) fn tick(&mut self, now: Instant) -> Vec<Action> {
        let Some(host) = &self.live else {
            return Vec::new();
        };
        let timeout = self.limits.call_timeout.as_secs_f64();
        let due = self.next_deadline().is_some_and(|deadline| now >= deadline);
        let reason = match (host.conn, host.pending.front()) {
            (None, _) if due => format!(
                "its object host did not connect within {} s",
                self.limits.start_timeout.as_secs_f64()
            ),
            (Some(_), Some(front)) if due => {
                let what = match &front.what {
                    What::Call { type_name, method } => format!("{}.{method}", short_name(type_name)),
                    What::Construct { type_name, .. } => format!("the {} constructor", short_name(type_name)),
                    What::Restore { type_name, .. } => format!("restoring a {}", short_name(type_name)),
                    What::Drop => format!("dropping '{}'", front.key),
                    What::Copy => format!("copying '{}' for a transaction", front.key),
                    What::Adopt => format!("committing a transaction's copy of '{}'", front.key),
                    What::DropCopy => format!("dropping a transaction's copy of '{}'", front.key),
                };
                format!("{what} ran longer than the object call timeout ({timeout} s); its host was restarted")
            }
            _ => return Vec::new(),
        };
        self.kill(reason)
    }
}

/// `[rid, status, result]` (or `[rid, status, result, state]`: a persistent object's
/// pickled state after the call) as a reply.
fn parse_reply(frame: Value) -> Result<(u64, Reply, Option<Vec<u8>>), String> {
    let Value::Array(mut items) = frame else {
        return Err("a reply must be an array [rid, status, result]".into());
    };
    let state = match items.len() {
        4 => match items.pop() {
            Some(Value::Binary(state)) => Some(state),
            Some(Value::Nil) => None,
            _ => return Err("a reply's state must be binary or nil".into()),
        },
        _ => None,
    };
    let [rid, status, result]: [Value; 3] = items
        .try_into()
        .map_err(|_| "a reply has 3 items [rid, status, result] (and a state)".to_string())?;
    let rid = rid.as_u64().ok_or("the request id must be an unsigned integer")?;
    if status.is_str() {
        return Err("it sent a request on its host connection; a host makes its own calls on other connections".into());
    }
    match status.as_u64() {
        Some(0) => Ok((rid, Ok(result), state)),
        Some(1) => Ok((rid, Err(error_from_value(result)?), state)),
        _ => Err("the reply status must be 0 or 1".into()),
    }
}

/// An error reply's `[kind, message, data]`.
fn error_from_value(value: Value) -> Result<Error, String> {
    let bad = || "an error reply must be [kind: str, message: str, data]".to_string();
    let [kind, message, data]: [Value; 3] = match value {
        Value::Array(parts) => parts.try_into().map_err(|_| bad())?,
        _ => return Err(bad()),
    };
    let kind = kind.as_str().ok_or_else(bad)?;
    let kind = ErrorKind::from_name(kind).ok_or_else(|| format!("unknown error kind '{kind}'"))?;
    let message = message.as_str().ok_or_else(bad)?;
    Ok(Error::new(kind, message).with_data(data))
}

/// A host's `call` request: a method call on the instance at `key`, or on its copy `copy`.
fn call_request(key: &str, method: &str, args: Vec<Value>, kwargs: Value, copy: Option<u64>) -> Vec<Value> {
    let mut request = vec![
        Value::Nil,
        "call".into(),
        key.into(),
        method.into(),
        Value::Array(args),
        kwargs,
    ];
    request.extend(copy.map(Value::from));
    request
}

#[cfg(test)]
mod tests {
    use super::*;

    const T: &str = "py:__main__.Centroids";

    fn limits() -> Limits {
        Limits {
            call_timeout: Duration::from_secs(60),
            start_timeout: Duration::from_secs(30),
        }
    }

    fn construct(key: &str, object_id: u64) -> Forward {
        Forward::Construct {
            key: key.into(),
            object_id,
            type_name: T.into(),
            version: "v1".into(),
            args: vec![1.into()],
            kwargs: Value::Map(vec![]),
            persistent: false,
        }
    }

    fn call(key: &str, object_id: u64, method: &str) -> Forward {
        Forward::Call {
            key: key.into(),
            object_id,
            type_name: T.into(),
            method: method.into(),
            args: vec![],
            kwargs: Value::Map(vec![]),
        }
    }

    fn code() -> Arc<Vec<u8>> {
        Arc::new(vec![0xc0, 0xde])
    }

    fn ok(rid: u64, result: Value) -> Value {
        Value::Array(vec![rid.into(), 0.into(), result])
    }

    /// The requests sent, without their rids checked.
    fn sent(actions: &[Action]) -> Vec<Value> {
        actions
            .iter()
            .filter_map(|a| match a {
                Action::Send { request, .. } => Some(request.clone()),
                _ => None,
            })
            .collect()
    }

    /// A slot whose host (id returned) is connected on connection 50.
    fn connected(now: Instant) -> (Slot, HostId) {
        let mut slot = Slot::new(2, 4, limits());
        let actions = slot.forward(construct("a", 1), Some(&code()), now);
        let Action::Spawn(id) = actions[0] else {
            panic!("expected a spawn, got {actions:?}")
        };
        assert_eq!(Slot::of(id, 4), 2);
        assert!(slot.expects(id));
        let sends = slot.connected(id, 50, now).expect("expected");
        assert_eq!(sends.len(), 1);
        assert_eq!(
            slot.reply(id, ok(1, Value::Nil), now),
            vec![Action::Complete {
                key: "a".into(),
                object_id: 1,
                reply: Ok(Value::Nil),
                state: None,
            }]
        );
        (slot, id)
    }

    #[test]
    fn requests_wait_for_the_host_then_leave_in_order() {
        let now = Instant::now();
        let mut slot = Slot::new(0, 1, limits());
        let actions = slot.forward(construct("a", 1), Some(&code()), now);
        assert!(matches!(actions.as_slice(), [Action::Spawn(_)]));
        let Action::Spawn(id) = actions[0] else { unreachable!() };
        assert!(slot.forward(call("a", 1, "update"), None, now).is_empty(), "buffered");
        assert!(slot.forward(construct("b", 2), Some(&code()), now).is_empty());
        assert_eq!(slot.in_flight(), 3);
        assert!(slot.connected(id + 1, 9, now).is_none(), "an unknown host");
        let requests = sent(&slot.connected(id, 9, now).unwrap());
        assert_eq!(
            requests,
            vec![
                Value::Array(vec![
                    1.into(),
                    "construct".into(),
                    "a".into(),
                    T.into(),
                    "v1".into(),
                    Value::Binary(vec![0xc0, 0xde]),
                    Value::Array(vec![1.into()]),
                    Value::Map(vec![]),
                ]),
                Value::Array(vec![
                    2.into(),
                    "call".into(),
                    "a".into(),
                    "update".into(),
                    Value::Array(vec![]),
                    Value::Map(vec![]),
                ]),
                // The code goes once per host and version.
                Value::Array(vec![
                    3.into(),
                    "construct".into(),
                    "b".into(),
                    T.into(),
                    "v1".into(),
                    Value::Nil,
                    Value::Array(vec![1.into()]),
                    Value::Map(vec![]),
                ]),
            ]
        );
        assert!(slot.connected(id, 9, now).is_none(), "connected already");
        assert!(!slot.expects(id));
        // Replies complete the front, in order.
        slot.reply(id, ok(1, Value::Nil), now);
        let raised = Value::Array(vec![
            2.into(),
            1.into(),
            Value::Array(vec!["Raised".into(), "boom".into(), Value::Nil]),
        ]);
        assert_eq!(
            slot.reply(id, raised, now),
            vec![Action::Complete {
                key: "a".into(),
                object_id: 1,
                reply: Err(Error::new(ErrorKind::Raised, "boom")),
                state: None,
            }]
        );
        // Connected now: a new request goes out at once.
        let actions = slot.forward(call("a", 1, "get"), None, now);
        assert_eq!(
            sent(&actions)[0],
            Value::Array(vec![
                4.into(),
                "call".into(),
                "a".into(),
                "get".into(),
                Value::Array(vec![]),
                Value::Map(vec![]),
            ])
        );
        assert_eq!(slot.in_flight(), 2);
    }

    #[test]
    fn a_transactions_copy_is_made_called_adopted_or_dropped_and_lost_with_its_host() {
        let now = Instant::now();
        let (mut slot, id) = connected(now);
        let copy = |copy_id| Forward::Copy {
            key: "a".into(),
            object_id: 1,
            copy_id,
        };
        let copy_call = |copy_id| Forward::CopyCall {
            key: "a".into(),
            copy_id,
            type_name: T.into(),
            method: "update".into(),
            args: vec![],
            kwargs: Value::Map(vec![]),
        };
        let mut requests = sent(&slot.forward(copy(7), None, now));
        requests.extend(sent(&slot.forward(copy_call(7), None, now)));
        let adopt = Forward::Adopt {
            key: "a".into(),
            object_id: 1,
            copy_id: 7,
        };
        requests.extend(sent(&slot.forward(adopt, None, now)));
        requests.extend(sent(&slot.forward(copy(8), None, now)));
        let drop = Forward::DropCopy {
            key: "a".into(),
            copy_id: 8,
        };
        requests.extend(sent(&slot.forward(drop, None, now)));
        assert_eq!(
            requests,
            vec![
                Value::Array(vec![2.into(), "copy".into(), "a".into(), 7.into()]),
                Value::Array(vec![
                    3.into(),
                    "call".into(),
                    "a".into(),
                    "update".into(),
                    Value::Array(vec![]),
                    Value::Map(vec![]),
                    7.into(),
                ]),
                Value::Array(vec![4.into(), "adopt".into(), "a".into(), 7.into()]),
                Value::Array(vec![5.into(), "copy".into(), "a".into(), 8.into()]),
                Value::Array(vec![6.into(), "drop".into(), "a".into(), 8.into()]),
            ]
        );
        // The copy's answer and its call's go to the copy.
        assert_eq!(
            slot.reply(id, ok(2, Value::Nil), now),
            vec![Action::Complete {
                key: "a".into(),
                object_id: 7,
                reply: Ok(Value::Nil),
                state: None,
            }]
        );
        assert!(matches!(
            &slot.reply(id, ok(3, 5.into()), now)[..],
            [Action::Complete { object_id: 7, .. }]
        ));
        assert!(slot.reply(id, ok(4, Value::Nil), now).is_empty(), "adopted");
        // Copy 9 is asked for and the host dies with it (copy 8's drop was not answered:
        // lost too); the object and the copies are lost, copy 7 is the object now.
        slot.forward(copy(9), None, now);
        slot.disconnected(id);
        let mut lost: Vec<u64> = slot
            .exited(id, Exit::default(), None)
            .into_iter()
            .map(|a| match a {
                Action::Lose { object_id, .. } => object_id,
                other => panic!("{other:?}"),
            })
            .collect();
        lost.sort_unstable();
        assert_eq!(lost, vec![1, 8, 9]);
        // No host holds the object now: a copy asked for is lost at once.
        assert!(matches!(
            &slot.forward(copy(10), None, now)[..],
            [Action::Orphan { object_id: 10, .. }]
        ));
    }

    #[test]
    fn a_failed_constructor_leaves_nothing_on_the_host() {
        let now = Instant::now();
        let (mut slot, id) = connected(now);
        slot.forward(construct("b", 2), Some(&code()), now);
        let raised = Value::Array(vec![
            2.into(),
            1.into(),
            Value::Array(vec!["Raised".into(), "no".into(), Value::Nil]),
        ]);
        assert!(matches!(
            &slot.reply(id, raised, now)[..],
            [Action::Complete { reply: Err(_), .. }]
        ));
        // A call on it, already applied by the partition, is not sent: nobody holds it (the
        // partition lets the constructor's answer settle it).
        let actions = slot.forward(call("b", 2, "get"), None, now);
        assert!(matches!(&actions[..], [Action::Orphan { object_id: 2, .. }]));
        // The host exits: only what it holds is lost.
        slot.disconnected(id);
        let lost = slot.exited(
            id,
            Exit {
                status: Some(3),
                signal: None,
            },
            None,
        );
        assert_eq!(
            lost,
            vec![Action::Lose {
                key: "a".into(),
                object_id: 1,
                reason: "its object host exited with status 3".into()
            }]
        );
    }

    #[test]
    fn drop_forgets_the_instance() {
        let now = Instant::now();
        let (mut slot, id) = connected(now);
        let actions = slot.forward(
            Forward::Drop {
                key: "a".into(),
                object_id: 1,
            },
            None,
            now,
        );
        assert_eq!(
            sent(&actions),
            vec![Value::Array(vec![2.into(), "drop".into(), "a".into()])]
        );
        assert!(slot.reply(id, ok(2, Value::Nil), now).is_empty());
        // A drop of what the host does not hold sends nothing.
        assert!(slot
            .forward(
                Forward::Drop {
                    key: "a".into(),
                    object_id: 1
                },
                None,
                now
            )
            .is_empty());
        slot.disconnected(id);
        assert!(slot.exited(id, Exit::default(), None).is_empty());
    }

    #[test]
    fn protocol_violations_kill_the_host() {
        let now = Instant::now();
        for bad in [
            Value::Nil,
            Value::Array(vec![1.into(), 0.into()]),
            ok(7, Value::Nil),
            Value::Array(vec![2.into(), 5.into(), Value::Nil]),
            Value::Array(vec![2.into(), 1.into(), "not a triple".into()]),
            Value::Array(vec![
                2.into(),
                1.into(),
                Value::Array(vec!["Nope".into(), "m".into(), Value::Nil]),
            ]),
        ] {
            let (mut slot, id) = connected(now);
            slot.forward(call("a", 1, "get"), None, now);
            assert_eq!(slot.reply(id, bad.clone(), now), vec![Action::Kill(id)], "{bad}");
            assert!(!slot.has_host());
            // Calls on its objects wait for its exit, then are lost with the reason.
            assert!(slot.forward(call("a", 1, "get"), None, now).is_empty());
            let lost = slot.exited(
                id,
                Exit {
                    status: None,
                    signal: Some(9),
                },
                None,
            );
            let [Action::Lose { reason, .. }] = &lost[..] else {
                panic!("{lost:?}")
            };
            assert!(reason.starts_with("its object host broke the protocol ("), "{reason}");
        }
        // A reply with nothing pending.
        let (mut slot, id) = connected(now);
        assert_eq!(slot.reply(id, ok(2, Value::Nil), now), vec![Action::Kill(id)]);
    }

    #[test]
    fn a_call_past_the_timeout_kills_the_host_and_loses_its_objects() {
        let t0 = Instant::now();
        let (mut slot, id) = connected(t0);
        assert_eq!(slot.next_deadline(), None, "nothing pending");
        slot.forward(call("a", 1, "update"), None, t0);
        assert_eq!(slot.next_deadline(), Some(t0 + Duration::from_secs(60)));
        // The second call's clock starts when it reaches the front.
        slot.forward(call("a", 1, "update"), None, t0);
        let t1 = t0 + Duration::from_secs(50);
        slot.reply(id, ok(2, 1.into()), t1);
        assert_eq!(slot.next_deadline(), Some(t1 + Duration::from_secs(60)));
        assert!(slot.tick(t0 + Duration::from_secs(100)).is_empty());
        let t2 = t1 + Duration::from_secs(60);
        assert_eq!(slot.tick(t2), vec![Action::Kill(id)]);
        assert_eq!(slot.next_deadline(), None);
        let lost = slot.exited(
            id,
            Exit {
                status: None,
                signal: Some(9),
            },
            None,
        );
        assert_eq!(
            lost,
            vec![Action::Lose {
                key: "a".into(),
                object_id: 1,
                reason: "Centroids.update ran longer than the object call timeout (60 s); its host was restarted"
                    .into()
            }]
        );
        // Later calls on the lost object get the same reason; a new construct starts a new host.
        let later = slot.forward(call("a", 1, "update"), None, t2);
        assert!(matches!(&later[..], [Action::Orphan { reason, .. }] if reason.starts_with("Centroids.update")));
        let actions = slot.forward(construct("a", 5), Some(&code()), t2);
        let [Action::Spawn(new_id)] = actions[..] else {
            panic!("{actions:?}")
        };
        assert_ne!(new_id, id);
        assert_eq!(Slot::of(new_id, 4), 2);
        let requests = sent(&slot.connected(new_id, 51, t2).unwrap());
        assert_eq!(requests.len(), 1);
        let Value::Array(items) = &requests[0] else {
            unreachable!()
        };
        assert_eq!(
            items[5],
            Value::Binary(vec![0xc0, 0xde]),
            "a new host gets the code again"
        );
    }

    #[test]
    fn a_host_that_never_connects_is_killed() {
        let t0 = Instant::now();
        let mut slot = Slot::new(0, 1, limits());
        let actions = slot.forward(construct("a", 1), Some(&code()), t0);
        let [Action::Spawn(id)] = actions[..] else { panic!() };
        assert_eq!(slot.next_deadline(), Some(t0 + Duration::from_secs(30)));
        assert_eq!(slot.tick(t0 + Duration::from_secs(30)), vec![Action::Kill(id)]);
        let lost = slot.exited(
            id,
            Exit {
                status: None,
                signal: Some(9),
            },
            None,
        );
        assert_eq!(
            lost,
            vec![Action::Lose {
                key: "a".into(),
                object_id: 1,
                reason: "its object host did not connect within 30 s".into()
            }]
        );
        // One that cannot start at all, or exits before connecting.
        slot.forward(construct("b", 2), Some(&code()), t0);
        let id = slot.live.as_ref().unwrap().id;
        let lost = slot.exited(
            id,
            Exit::default(),
            Some("cannot start `python3 -m spindle.host`: not found"),
        );
        assert!(matches!(&lost[..], [Action::Lose { reason, .. }] if reason.starts_with("cannot start")));
        slot.forward(construct("c", 3), Some(&code()), t0);
        let id = slot.live.as_ref().unwrap().id;
        let lost = slot.exited(
            id,
            Exit {
                status: Some(1),
                signal: None,
            },
            None,
        );
        assert!(
            matches!(&lost[..], [Action::Lose { reason, .. }] if reason == "its object host exited with status 1 before it connected")
        );
    }

    #[test]
    fn replies_from_a_dying_host_are_ignored() {
        let now = Instant::now();
        let (mut slot, id) = connected(now);
        slot.forward(call("a", 1, "get"), None, now);
        assert_eq!(slot.disconnected(id), vec![Action::Kill(id)]);
        assert!(slot.disconnected(id).is_empty());
        assert!(slot.reply(id, ok(2, 1.into()), now).is_empty());
        assert_eq!(slot.in_flight(), 0);
        let lost = slot.exited(
            id,
            Exit {
                status: None,
                signal: Some(9),
            },
            None,
        );
        assert!(
            matches!(&lost[..], [Action::Lose { reason, .. }] if reason == "its object host was killed by signal 9")
        );
        assert!(slot.exited(id, Exit::default(), None).is_empty(), "once");
    }

    #[test]
    fn a_class_that_failed_to_load_is_sent_again() {
        // A class whose code does not unpickle in the host (a module missing there, say):
        // the next construct carries the code again instead of "this host has no code".
        let now = Instant::now();
        let (mut slot, id) = connected(now);
        let fresh = Forward::Construct {
            key: "b".into(),
            object_id: 2,
            type_name: "py:m.Other".into(),
            version: "v1".into(),
            args: vec![],
            kwargs: Value::Map(vec![]),
            persistent: false,
        };
        let requests = sent(&slot.forward(fresh.clone(), Some(&code()), now));
        let Value::Array(items) = &requests[0] else { panic!() };
        assert_eq!(items[5], Value::Binary(vec![0xc0, 0xde]));
        let raised = Value::Array(vec![
            2.into(),
            1.into(),
            Value::Array(vec![
                "Raised".into(),
                "ModuleNotFoundError: no module named 'x'".into(),
                Value::Nil,
            ]),
        ]);
        assert!(matches!(
            &slot.reply(id, raised, now)[..],
            [Action::Complete { reply: Err(_), .. }]
        ));
        let requests = sent(&slot.forward(fresh, Some(&code()), now));
        let Value::Array(items) = &requests[0] else { panic!() };
        assert_eq!(items[5], Value::Binary(vec![0xc0, 0xde]), "the code again");
    }

    #[test]
    fn huge_timeouts_never_overflow_the_clock() {
        let now = Instant::now();
        let huge = Limits {
            call_timeout: Duration::MAX,
            start_timeout: Duration::MAX,
        };
        let mut slot = Slot::new(0, 1, huge);
        let actions = slot.forward(construct("a", 1), Some(&code()), now);
        let [Action::Spawn(id)] = actions[..] else { panic!() };
        assert_eq!(slot.next_deadline(), None, "never");
        assert!(slot.tick(now + Duration::from_secs(3600)).is_empty());
        slot.connected(id, 9, now).expect("expected");
        assert_eq!(slot.next_deadline(), None, "never");
        assert!(slot.tick(now + Duration::from_secs(3600)).is_empty());
    }

    #[test]
    fn persistent_objects_ask_for_their_state_and_are_restored() {
        let now = Instant::now();
        let (mut slot, id) = connected(now);
        let persistent = Forward::Construct {
            key: "p".into(),
            object_id: 2,
            type_name: T.into(),
            version: "v1".into(),
            args: vec![1.into()],
            kwargs: Value::Map(vec![]),
            persistent: true,
        };
        let requests = sent(&slot.forward(persistent, Some(&code()), now));
        let Value::Array(items) = &requests[0] else { panic!() };
        assert_eq!(items.len(), 9);
        assert_eq!(items[8], Value::Boolean(true), "the host is asked for the state");
        // The state comes back as a 4th item, with an answer or an error.
        let with_state = Value::Array(vec![2.into(), 0.into(), Value::Nil, Value::Binary(b"s0".to_vec())]);
        assert_eq!(
            slot.reply(id, with_state, now),
            vec![Action::Complete {
                key: "p".into(),
                object_id: 2,
                reply: Ok(Value::Nil),
                state: Some(b"s0".to_vec()),
            }]
        );
        slot.forward(call("p", 2, "update"), None, now);
        let raised = Value::Array(vec![
            3.into(),
            1.into(),
            Value::Array(vec!["Raised".into(), "no".into(), Value::Nil]),
            Value::Binary(b"s1".to_vec()),
        ]);
        assert!(matches!(
            &slot.reply(id, raised, now)[..],
            [Action::Complete { reply: Err(_), state: Some(s), .. }] if s == b"s1"
        ));
        // A restore carries the stored state (and the code once per host and version).
        let restore = |object_id| Forward::Restore {
            key: "q".into(),
            object_id,
            type_name: T.into(),
            version: "v1".into(),
            state: b"s9".to_vec(),
        };
        let requests = sent(&slot.forward(restore(5), Some(&code()), now));
        assert_eq!(
            requests,
            vec![Value::Array(vec![
                4.into(),
                "restore".into(),
                "q".into(),
                T.into(),
                "v1".into(),
                Value::Nil,
                Value::Binary(b"s9".to_vec()),
            ])]
        );
        assert!(
            slot.reply(id, ok(4, Value::Nil), now).is_empty(),
            "restored: nothing to answer"
        );
        // A restore that fails leaves the object stored: its calls are answered ObjectLost.
        slot.forward(restore(6), Some(&code()), now);
        let failed = Value::Array(vec![
            5.into(),
            1.into(),
            Value::Array(vec!["Raised".into(), "setstate broke".into(), Value::Nil]),
        ]);
        let lost = slot.reply(id, failed, now);
        assert!(
            matches!(&lost[..], [Action::Lose { object_id: 6, reason, .. }]
                if reason.contains("could not be restored") && reason.contains("setstate broke")),
            "{lost:?}"
        );
        // A state that is not binary breaks the protocol.
        slot.forward(call("p", 2, "update"), None, now);
        let bad = Value::Array(vec![6.into(), 0.into(), Value::Nil, "text".into()]);
        assert_eq!(slot.reply(id, bad, now), vec![Action::Kill(id)]);
        // A host that exits holds them: they are "lost" (the partition stores persistent ones).
        let lost = slot.exited(id, Exit::default(), None);
        let keys: Vec<_> = lost
            .iter()
            .filter_map(|a| match a {
                Action::Lose { key, .. } => Some(key.as_str()),
                _ => None,
            })
            .collect();
        assert_eq!(keys, vec!["a", "p"], "not q: its restore failed, the host holds none");
    }

    #[test]
    fn a_construct_without_code_fails_instead_of_reaching_the_host() {
        let now = Instant::now();
        let mut slot = Slot::new(0, 1, limits());
        let actions = slot.forward(construct("a", 1), None, now);
        assert!(matches!(&actions[..], [Action::Complete { reply: Err(e), .. }] if e.kind == ErrorKind::UnknownType));
        assert!(!slot.has_host());
    }
}
