//! User-defined objects in transactions. Their state lives in object hosts, so a
//! transaction's workspace cannot hold a fork of one: on its first touch of such an object
//! here, a transaction takes it as it takes a built-in one (a fork of no value that notes
//! its version, and ownership through the same `lock_for`), and asks the object's host for
//! a **copy** of the instance ([`Forward::Copy`]), made in the partition's order of that
//! object's requests, so it holds exactly the state that the order gives it at that point.
//! The transaction's calls go to the copy ([`Forward::CopyCall`]); they park here, like
//! single calls on user-defined objects, until the host answers (`Partition::complete`).
//!
//! Its commit (after the versions validated) makes each copy it changed the instance
//! ([`Forward::Adopt`]), and logs a persistent object's state, which the host sent with
//! the copy's last call, in the commit's record: a replay (and a Raft replica) restores
//! it, all or nothing with the rest of the commit. An abort, wound, expiry or session end
//! drops the copies ([`Forward::DropCopy`]); a call still on a dropped copy is answered
//! `TransactionConflict` when its host answers. A host that dies with a copy aborts its
//! transaction; the object itself never saw the copy's changes.

use ahash::HashMap;
use std::collections::VecDeque;

use super::{conflict, Fork, TxnCall, TxnId};
use crate::objects::user::{self, Forward, UserState};
use crate::op::Op;
use crate::partition::durability::storage_error;
use crate::partition::users::{restore_if_stored, shared_method};
use crate::partition::{check_type, memory, moved, Body, Entry, Partition, Storage};
use crate::record::{encode_user_state, UserStateRef};
use crate::{Caller, Delivery, Error, ErrorKind, Reply, Token, Value};

use super::COMMIT_TOKEN;

/// The user-defined objects transactions hold here, and their copies in hosts.
#[derive(Default)]
pub(in crate::partition) struct Copies {
    /// What each open transaction holds of user-defined objects here, by key.
    held: HashMap<TxnId, HashMap<String, Held>>,
    /// Copies in hosts by id: open transactions' copies, and those of ended transactions
    /// until their host answered what it was sent.
    copies: HashMap<u64, Copy>,
}

/// What a transaction holds of one user-defined object.
pub(in crate::partition) struct Held {
    type_name: String,
    version: String,
    /// Its copy in the host (none when its first touch deleted it).
    copy: Option<u64>,
    /// The transaction deleted it: its commit does.
    deleted: bool,
}

/// A transaction's copy of a user-defined object, held by the object's host.
struct Copy {
    key: String,
    /// Its transaction; `None` once that ended without it (the copy is forgotten when its
    /// host has answered everything it was sent about it).
    txn: Option<TxnId>,
    /// Its transaction's number (for messages).
    number: u64,
    /// The instance it was copied from.
    object_id: u64,
    persistent: bool,
    /// The host answered the copy request.
    copied: bool,
    /// A call ran on it: it may differ from the object.
    changed: bool,
    /// The state the host sent with its last call's answer (a persistent object's): what
    /// the commit logs.
    state: Option<Vec<u8>>,
    /// Its calls sent and not answered, oldest first, with their seq.
    calls: VecDeque<(Token, u64)>,
    /// Bytes its transaction's copies may hold here (its state counts).
    max_bytes: usize,
}

impl Copies {
    /// Whether `id` names a copy (copies are numbered with the objects, so never like one).
    fn is_copy(&self, id: u64) -> bool {
        !self.copies.is_empty() && self.copies.contains_key(&id)
    }
}

fn not_found(type_name: &str, key: &str) -> Error {
    Error::new(
        ErrorKind::NotFound,
        format!("{type_name} '{key}' does not exist (it was deleted, or the session that created it ended)"),
    )
}

fn aborted_while_running(number: u64, key: &str) -> Error {
    conflict(format!(
        "transaction {number} was aborted while its call on '{key}' ran (an older transaction took an object it \
         held, it ran past its time limit, or its session ended)"
    ))
}

impl Partition {
    /// Whether `op` of transaction `id` is about a user-defined object (a `py:` type, or a key
    /// holding one in the transaction's view): it goes to [`user_step`](Self::user_step).
    pub(super) fn is_user_op(&self, id: &TxnId, op: &Op) -> bool {
        if let Op::Create { type_name, .. } | Op::Call { type_name, .. } = op {
            if user::is_user_type(type_name) {
                return true;
            }
        }
        let key = op.key();
        if self.txn_copies.held.get(id).is_some_and(|h| h.contains_key(key)) {
            return true;
        }
        let forked = self.txns.get(id).is_some_and(|ws| ws.forks.contains_key(key));
        !forked && matches!(self.objects.get(key).map(|e| &e.body), Some(Body::User(_)))
    }

    /// A call of transaction `txn` on a user-defined object, its workspace open: its reply,
    /// or `None` while it runs on the transaction's copy in the host (answered by `complete`).
    pub(super) fn user_step(
        &mut self,
        txn: TxnCall<'_>,
        caller: &Caller,
        token: Token,
        seq: u64,
        op: Op,
    ) -> Option<Reply> {
        let id = txn.id;
        let key = op.key().to_string();
        if let Some((new_key, _)) = self.moved.get(&key) {
            return Some(Err(moved(&key, new_key)));
        }
        // Resent while it runs: the resent call takes the first one's place.
        if let Some(copy) = self
            .held_copy(id, &key)
            .and_then(|c| self.txn_copies.copies.get_mut(&c))
        {
            if let Some(call) = copy.calls.iter_mut().find(|(_, s)| seq != 0 && *s == seq) {
                call.0 = token;
                return None;
            }
        }
        if let Err(e) = self.hold_user(txn, &key, &op) {
            return Some(Err(e));
        }
        let held = &self.txn_copies.held[id][&key];
        match op {
            Op::Create { .. } if held.deleted => Some(Err(constructing_refused(&key))),
            Op::Create { .. } => Some(Ok(Value::Boolean(false))),
            Op::Delete { .. } if held.deleted => Some(Ok(Value::Boolean(false))),
            Op::Delete { .. } => {
                self.txn_copies
                    .held
                    .get_mut(id)
                    .and_then(|h| h.get_mut(&key))
                    .expect("held above")
                    .deleted = true;
                // Its commit deletes it as a single delete does (`apply`): the instance and
                // a persistent object's record go.
                self.txns.get_mut(id).expect("open").ops.push((caller.clone(), op));
                Some(Ok(Value::Boolean(true)))
            }
            Op::Call { .. } if held.deleted => Some(Err(not_found(&held.type_name, &key))),
            Op::Call {
                type_name,
                method,
                args,
                ..
            } => {
                let copy_id = held.copy.expect("a copy unless deleted at first touch");
                let call =
                    shared_method(&type_name, &method).and_then(|()| user::parse_call_args(&type_name, &method, args));
                let (args, kwargs) = match call {
                    Ok(parsed) => parsed,
                    Err(e) => return Some(Err(e)),
                };
                let copy = self.txn_copies.copies.get_mut(&copy_id).expect("a held copy");
                copy.calls.push_back((token, seq));
                self.forwards.push(Forward::CopyCall {
                    key,
                    copy_id,
                    type_name,
                    method,
                    args,
                    kwargs,
                });
                None
            }
        }
    }

    /// The copy transaction `id` holds of `key`, if any.
    fn held_copy(&self, id: &TxnId, key: &str) -> Option<u64> {
        self.txn_copies.held.get(id)?.get(key)?.copy
    }

    /// Transaction `txn` touches user-defined object `key` with `op`: on its first touch
    /// here, take the object (its version noted, ownership as for built-in objects) and ask its host
    /// for a copy. Refused if the object is not (or no longer) what `op` wants.
    fn hold_user(&mut self, txn: TxnCall<'_>, key: &str, op: &Op) -> Result<(), Error> {
        let id = txn.id;
        let wanted = match op {
            Op::Create { type_name, .. } | Op::Call { type_name, .. } => Some(type_name.as_str()),
            Op::Delete { .. } => None,
        };
        if let Some(held) = self.txn_copies.held.get(id).and_then(|h| h.get(key)) {
            if let Some(wanted) = wanted {
                check_type(key, &held.type_name, wanted)?;
            }
            return match op {
                Op::Create { args, .. } => check_version(key, wanted.unwrap_or(""), &held.version, args),
                _ => Ok(()),
            };
        }
        if let Some(fork) = self.txns[id].forks.get(key) {
            // The transaction's own view of the key: a built-in object it made or forked,
            // or none.
            return Err(match (&fork.obj, op) {
                (Some(obj), _) => user_object_mismatch(key, obj.type_name()),
                (None, Op::Create { .. }) => constructing_refused(key),
                (None, _) => not_found(wanted.unwrap_or("object"), key),
            });
        }
        let found = match self.objects.get(key) {
            Some(Entry {
                body: Body::Builtin(obj),
                ..
            }) => return Err(user_object_mismatch(key, obj.type_name())),
            None => None,
            Some(Entry {
                body: Body::User(u),
                persistent,
                ..
            }) => {
                if let UserState::Lost(reason) = &u.state {
                    return Err(match op {
                        Op::Create { .. } => constructing_refused(key),
                        _ => user::lost(&u.type_name, key, reason),
                    });
                }
                if let Some(wanted) = wanted {
                    check_type(key, &u.type_name, wanted)?;
                }
                if let Op::Create { args, .. } = op {
                    check_version(key, &u.type_name, &u.version, args)?;
                }
                Some((u.type_name.clone(), u.version.clone(), u.id, *persistent))
            }
        };
        let Some((type_name, version, object_id, persistent)) = found else {
            // Absent: the transaction still takes the key (a create by another conflicts).
            self.fork(id, key, txn.max_bytes)?;
            self.lock_for(id, key);
            return Err(match op {
                Op::Create { .. } => constructing_refused(key),
                _ => not_found(wanted.unwrap_or("object"), key),
            });
        };
        if let Op::Create { persistent: wanted, .. } = op {
            self.check_persistence(&type_name, key, *wanted)?;
        }
        if persistent {
            if let Storage::Failed(why) = &self.storage {
                return Err(storage_error(why));
            }
        }
        let base = self.objects.version(key);
        let ws = self.txns.get_mut(id).expect("the workspace is open");
        ws.forks.insert(
            key.to_string(),
            Fork {
                obj: None,
                base,
                bytes: 0,
            },
        );
        self.lock_for(id, key);
        let deleting = matches!(op, Op::Delete { .. });
        let copy = match deleting {
            true => None,
            false => Some(self.copy(id, key, object_id, persistent, txn.max_bytes)),
        };
        let held = Held {
            type_name,
            version,
            copy,
            deleted: false,
        };
        self.txn_copies
            .held
            .entry(id.clone())
            .or_default()
            .insert(key.to_string(), held);
        Ok(())
    }

    /// Ask the host of user-defined object `key` for a copy of it for transaction `id`
    /// (restoring a stored persistent object first). Returns the copy's id.
    fn copy(&mut self, id: &TxnId, key: &str, mut object_id: u64, persistent: bool, max_bytes: usize) -> u64 {
        if let Some(Entry {
            body: Body::User(u), ..
        }) = self.objects.get_mut(key)
        {
            restore_if_stored(u, key, &mut self.next_object_id, &mut self.forwards);
            object_id = u.id;
        }
        self.next_object_id += 1;
        let copy_id = self.next_object_id;
        self.forwards.push(Forward::Copy {
            key: key.to_string(),
            object_id,
            copy_id,
        });
        let copy = Copy {
            key: key.to_string(),
            txn: Some(id.clone()),
            number: id.number,
            object_id,
            persistent,
            copied: false,
            changed: false,
            state: None,
            calls: VecDeque::new(),
            max_bytes,
        };
        self.txn_copies.copies.insert(copy_id, copy);
        copy_id
    }

    /// Whether `object_id` names a transaction's copy (its host's answers go to
    /// [`complete_copy`](Self::complete_copy) and [`lose_copy`](Self::lose_copy)).
    pub(in crate::partition) fn is_copy(&self, object_id: u64) -> bool {
        self.txn_copies.is_copy(object_id)
    }

    /// The host answered the oldest request about copy `copy_id`: the copy itself, then
    /// each call on it, in order; `state`: the copy's after the call (a persistent object's).
    pub(in crate::partition) fn complete_copy(
        &mut self,
        copy_id: u64,
        mut reply: Reply,
        state: Option<Vec<u8>>,
    ) -> Vec<Delivery> {
        let Some(copy) = self.txn_copies.copies.get_mut(&copy_id) else {
            return Vec::new();
        };
        let (key, txn, number) = (copy.key.clone(), copy.txn.clone(), copy.number);
        if !copy.copied {
            copy.copied = true;
            let (Err(e), Some(txn)) = (&reply, txn) else {
                self.forget_copy_if_idle(copy_id);
                return Vec::new();
            };
            // The object did not copy (its state does not pickle, say): the transaction
            // cannot go on with it, and would fail the same way if run again.
            let why = Error::new(
                ErrorKind::TransactionError,
                format!(
                    "'{key}' could not be copied for transaction {number} ({}: {}), which was aborted: a \
                     user-defined object takes part in a transaction through a copy of its state",
                    e.kind.as_str(),
                    e.message
                ),
            );
            self.forget_txn(&txn, "");
            return self.fail_copy(copy_id, why);
        }
        let Some((token, seq)) = copy.calls.pop_front() else {
            return Vec::new();
        };
        let mut abort = false;
        match &txn {
            None => reply = Err(aborted_while_running(number, &key)),
            Some(_) if copy.persistent => match state {
                Some(state) => {
                    copy.changed = true;
                    copy.state = Some(state);
                }
                // A host must send a persistent object's state after a call that ran:
                // without it the commit could not log the change.
                None if reply.is_ok() => {
                    reply = Err(Error::new(
                        ErrorKind::Internal,
                        format!(
                            "the object host sent no state for the persistent object '{key}' (a server bug): \
                             transaction {number} was aborted"
                        ),
                    ));
                    abort = true;
                }
                None => {}
            },
            // It ran (a method that raised may have changed it before), unless the host
            // refused it (no such method, say).
            Some(_) => copy.changed |= !matches!(&reply, Err(e) if e.kind != ErrorKind::Raised),
        }
        let (persistent, size, max_bytes) = (copy.persistent, copy.state.as_ref().map_or(0, Vec::len), copy.max_bytes);
        if let Some(txn) = &txn {
            if persistent && !abort {
                // The state it holds counts against the transaction's bytes here.
                if let Err(e) = self.resize_fork(txn, &key, size, max_bytes) {
                    reply = Err(e);
                    abort = true;
                }
            }
            match abort {
                true => self.forget_txn(txn, ""),
                false => {
                    if let (Some(ws), true) = (self.txns.get_mut(txn), seq != 0) {
                        ws.last_reply = Some((seq, reply.clone()));
                    }
                }
            }
        }
        self.forget_copy_if_idle(copy_id);
        vec![Delivery { token, reply }]
    }

    /// The host of copy `copy_id` died (or holds no such copy): its transaction is aborted
    /// and its calls answered `TransactionConflict`; the object never saw its changes.
    pub(in crate::partition) fn lose_copy(&mut self, copy_id: u64, reason: &str) -> Vec<Delivery> {
        let Some(copy) = self.txn_copies.copies.get(&copy_id) else {
            return Vec::new();
        };
        let why = conflict(format!(
            "transaction {} was aborted: its copy of '{}' was lost with its object host ({reason}); the object \
             never saw its changes (run it again)",
            copy.number, copy.key
        ));
        // Forgotten first: its host is gone, nothing is sent about it.
        let txn = copy.txn.clone();
        let out = self.fail_copy(copy_id, why);
        if let Some(txn) = txn {
            self.forget_txn(&txn, "");
        }
        out
    }

    /// Forget copy `copy_id`, answering its calls in flight with `why`.
    fn fail_copy(&mut self, copy_id: u64, why: Error) -> Vec<Delivery> {
        let Some(copy) = self.txn_copies.copies.remove(&copy_id) else {
            return Vec::new();
        };
        copy.calls
            .into_iter()
            .map(|(token, _)| Delivery {
                token,
                reply: Err(why.clone()),
            })
            .collect()
    }

    /// A copy whose transaction ended is forgotten once its host answered all it was sent.
    fn forget_copy_if_idle(&mut self, copy_id: u64) {
        let idle = self
            .txn_copies
            .copies
            .get(&copy_id)
            .is_some_and(|c| c.txn.is_none() && c.copied && c.calls.is_empty());
        if idle {
            self.txn_copies.copies.remove(&copy_id);
        }
    }

    /// User-defined object `key` went back to its last logged state, or was lost: the
    /// transactions holding a copy of it are aborted (a copy may hold a change that never
    /// took effect).
    pub(in crate::partition) fn abort_copies_of(&mut self, key: &str) {
        let holding: Vec<TxnId> = self
            .txn_copies
            .copies
            .values()
            .filter(|c| c.key == key)
            .filter_map(|c| c.txn.clone())
            .collect();
        for txn in holding {
            self.forget_txn(&txn, "its copy of a user-defined object was lost");
        }
    }

    /// The partition is given up (its leader stepped down, or it moved away): every call
    /// running on a copy is answered `error`, and the hosts drop the copies.
    pub(in crate::partition) fn abandon_copies(&mut self, error: &Error) -> Vec<Delivery> {
        self.txn_copies.held.clear();
        let mut out = Vec::new();
        for (copy_id, copy) in std::mem::take(&mut self.txn_copies.copies) {
            out.extend(copy.calls.into_iter().map(|(token, _)| Delivery {
                token,
                reply: Err(error.clone()),
            }));
            self.forwards.push(Forward::DropCopy { key: copy.key, copy_id });
        }
        out
    }

    /// Transaction `id` ended here without committing: its copies go.
    pub(super) fn drop_copies(&mut self, id: &TxnId) {
        let Some(held) = self.txn_copies.held.remove(id) else {
            return;
        };
        for (key, h) in held {
            let Some(copy_id) = h.copy else { continue };
            if let Some(copy) = self.txn_copies.copies.get_mut(&copy_id) {
                copy.txn = None;
                self.forwards.push(Forward::DropCopy { key, copy_id });
                self.forget_copy_if_idle(copy_id);
            }
        }
    }

    /// Whether transaction `id`'s copies here may commit; returns about how many bytes
    /// their states take in its commit record.
    pub(super) fn check_copies(&self, id: &TxnId) -> Result<usize, Error> {
        let Some(held) = self.txn_copies.held.get(id) else {
            return Ok(0);
        };
        let mut bytes = 0;
        for (key, h) in held {
            let Some(copy) = h.copy.and_then(|c| self.txn_copies.copies.get(&c)) else {
                continue;
            };
            if !copy.calls.is_empty() {
                return Err(conflict(format!(
                    "transaction {} was aborted: a call of it on '{key}' was still running at its commit",
                    id.number
                )));
            }
            if let (true, Some(state)) = (copy.persistent && !h.deleted, &copy.state) {
                if let Storage::Failed(why) = &self.storage {
                    return Err(storage_error(why));
                }
                bytes += state.len() + key.len() + h.type_name.len() + h.version.len() + 64;
            }
        }
        Ok(bytes)
    }

    /// Take transaction `id`'s copies away for its commit ([`adopt_copies`](Self::adopt_copies)).
    pub(super) fn take_copies(&mut self, id: &TxnId) -> Vec<(String, Held)> {
        let mut held: Vec<(String, Held)> = self
            .txn_copies
            .held
            .remove(id)
            .unwrap_or_default()
            .into_iter()
            .collect();
        held.sort_unstable_by(|a, b| a.0.cmp(&b.0));
        held
    }

    /// Commit (validated, its calls applied): each copy the transaction changed becomes its
    /// object, a persistent object's state logged (in the commit's record); the others go.
    pub(super) fn adopt_copies(&mut self, held: Vec<(String, Held)>) {
        for (key, h) in held {
            let Some(copy_id) = h.copy else { continue };
            let Some(copy) = self.txn_copies.copies.remove(&copy_id) else {
                continue;
            };
            let current = match self.objects.get(&key) {
                Some(Entry {
                    body: Body::User(u), ..
                }) if u.id == copy.object_id && u.state != UserState::Stored => Some(u.id),
                _ => None,
            };
            let state = match copy.persistent {
                true => copy.state.as_deref(),
                false => Some(&[][..]),
            };
            let (Some(object_id), Some(state), false, true) = (current, state, h.deleted, copy.changed) else {
                self.forwards.push(Forward::DropCopy { key, copy_id });
                continue;
            };
            if copy.persistent {
                self.log_committed_state(&key, state);
            }
            if let Some((_, counted, meter)) = self.objects.get_metered(&key) {
                meter.changed(counted, memory::object_size(&key, 0));
            }
            self.forwards.push(Forward::Adopt {
                key,
                object_id,
                copy_id,
            });
        }
    }

    /// Log `state` as persistent user-defined object `key`'s, committed by a transaction
    /// (its class's code first, if this partition has not logged it).
    fn log_committed_state(&mut self, key: &str, state: &[u8]) {
        self.preserve(key);
        let Some(Entry {
            body: Body::User(u),
            owner,
            ..
        }) = self.objects.get(key)
        else {
            return;
        };
        let class = (u.type_name.clone(), u.version.clone());
        let record = encode_user_state(&UserStateRef {
            key,
            type_name: &u.type_name,
            version: &u.version,
            owner: owner.as_deref(),
            token: COMMIT_TOKEN,
            client: None,
            seq: 0,
            reply: &Ok(Value::Boolean(true)),
            state,
        });
        let owner = owner.clone();
        self.log_class_once(class);
        self.log(record);
        self.logged_clients.extend(owner);
        if let Some(Entry {
            body: Body::User(u), ..
        }) = self.objects.get_mut(key)
        {
            u.last_state = Some(state.to_vec());
        }
    }

    /// Whether transaction `id` holds user-defined objects here.
    pub(in crate::partition) fn holds_user_objects(&self, id: &TxnId) -> bool {
        self.txn_copies.held.get(id).is_some_and(|h| !h.is_empty())
    }
}

fn user_object_mismatch(key: &str, actual: &str) -> Error {
    Error::new(
        ErrorKind::TypeMismatch,
        format!("'{key}' is a {actual}, not a user-defined object"),
    )
}

/// A `create` of a user-defined object of another version than the one at `key`.
fn check_version(key: &str, type_name: &str, version: &str, args: &[Value]) -> Result<(), Error> {
    match args.first().and_then(Value::as_str) {
        Some(wanted) if wanted != version => Err(Error::new(
            ErrorKind::TypeMismatch,
            format!("'{key}' is a {type_name} of version {version}, not of version {wanted}"),
        )),
        _ => Ok(()),
    }
}

fn constructing_refused(key: &str) -> Error {
    Error::new(
        ErrorKind::TransactionError,
        format!(
            "constructing the user-defined object '{key}' inside a transaction is not supported yet: construct it \
             before the transaction (calls on it, and deleting it, may be part of one)"
        ),
    )
}
