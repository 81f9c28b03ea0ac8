//! Persistent objects: every event that changes one (a mutating call, create or delete, and
//! the expiry, withdrawal, disconnect or session end that resolves a parked call on one)
//! leaves an op-log [`Record`], in the order applied, which the server drains with
//! [`Partition::take_log`] under the same lock and makes durable before sending the replies.
//! Recovery feeds the records back through [`Partition::replay`], which calls the very entry
//! points that produced them.

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Instant;

use super::{check_type, moved, Body, Entry, Partition, StoredUser};
use crate::objects::{self, compiled, user};
use crate::op::Op;
use crate::record::{encode_apply, Record, MAX_RECORD_LEN};
use crate::{Caller, ConnId, Delivery, Error, ErrorKind, Token, Value};

/// Whether this partition may hold persistent objects.
#[derive(Clone, Debug, Default, PartialEq)]
pub(super) enum Storage {
    /// The server has no data directory.
    #[default]
    None,
    Ok,
    /// The op log failed (disk full...): no persistent write is accepted until a restart.
    Failed(String),
}

pub(super) fn storage_error(why: &str) -> Error {
    Error::new(
        ErrorKind::StorageError,
        format!(
            "persistent objects of this partition are read-only until the server restarts: the op log failed ({why})"
        ),
    )
}

/// Whether `e` is a persistent object a replay of the log would find.
pub(super) fn is_durable(e: &Entry) -> bool {
    e.persistent
        && match &e.body {
            Body::User(u) => u.last_state.is_some(),
            Body::Builtin(_) => true,
        }
}

impl Partition {
    /// Accept persistent objects: the server logs what [`take_log`](Self::take_log) gives.
    pub fn enable_storage(&mut self) {
        self.storage = Storage::Ok;
    }

    /// The op log failed: refuse every further persistent write (ephemeral objects go on).
    pub fn storage_failed(&mut self, why: &str) {
        self.storage = Storage::Failed(why.to_string());
    }

    /// The op-log records produced since the last call, in order, or `None` if no persistent
    /// object was reached: then the replies may go at once. With `Some` (even empty), the
    /// replies go only once everything logged before, and these records, are durable.
    pub fn take_log(&mut self) -> Option<Vec<Vec<u8>>> {
        if !self.touched_persistent && self.records.is_empty() {
            return None;
        }
        self.touched_persistent = false;
        Some(std::mem::take(&mut self.records))
    }

    /// The sessions named in logged records that have not ended.
    pub fn logged_clients(&self) -> Vec<Arc<str>> {
        self.logged_clients.iter().cloned().collect()
    }

    /// The highest connection id in a logged record: new connections after a restart must
    /// be numbered above it.
    pub fn highest_logged_conn(&self) -> ConnId {
        self.highest_logged_conn
    }

    /// Every persistent object a replay of the log would find (not one still constructing),
    /// with its snapshot (`None` for one without: never, for durable types; always for
    /// user-defined ones, whose state is [`stored_user_objects`](Self::stored_user_objects)),
    /// by key.
    pub fn persistent_snapshots(&self) -> BTreeMap<String, (String, Option<Value>)> {
        self.objects
            .iter()
            .filter(|(_, e)| is_durable(e))
            .map(|(k, e)| {
                let snap = match &e.body {
                    Body::Builtin(obj) => obj.snapshot(),
                    Body::User(_) => None,
                };
                (k.to_string(), (e.body.type_name().to_string(), snap))
            })
            .collect()
    }

    /// Recovery: apply one op-log record through the entry point that produced it. Replies
    /// are dropped (their connections died with the old server) and no record is produced
    /// again. Fails on a record that does not decode.
    pub fn replay(&mut self, record: &[u8], now: Instant) -> Result<(), String> {
        match Record::decode(record)? {
            Record::Apply {
                caller,
                token,
                seq,
                acked,
                op,
            } => {
                self.apply_as(&caller, token, seq, acked, op, now, Some(record));
            }
            // Forced: the replayed call's deadline was computed from the replay's clock.
            Record::Expire { key, token } => {
                self.withdraw(token, &key, now);
            }
            Record::Disconnect { conn } => {
                self.disconnect(conn, now);
            }
            Record::Evict { key, bytes } => {
                self.evict(&key, usize::try_from(bytes).unwrap_or(usize::MAX));
            }
            Record::EndSession { client } => {
                self.end_session(&client, now);
            }
            Record::UserState {
                key,
                type_name,
                version,
                owner,
                token,
                client,
                seq,
                reply,
                state,
            } => {
                if let Some(owner) = &owner {
                    self.logged_clients.insert(Arc::from(owner.as_str()));
                }
                if let Some(client) = client.filter(|_| seq != 0) {
                    let client: Arc<str> = Arc::from(client);
                    self.record_reply(&client, seq, reply, true);
                    self.logged_clients.insert(client);
                }
                self.highest_logged_conn = self.highest_logged_conn.max(token.conn);
                self.insert_stored_user(StoredUser {
                    key,
                    type_name,
                    version,
                    owner,
                    state,
                });
            }
            Record::Class {
                type_name,
                version,
                code,
            } => self
                .insert_class(&type_name, &version, Arc::new(code))
                .map_err(|e| format!("the code of {type_name} at version {version}: {}", e.message))?,
            Record::Commit {
                client,
                seq,
                records,
                reply,
            } => self.replay_commit(client, seq, records, reply, now)?,
            r @ (Record::Prepare { .. } | Record::Decide { .. } | Record::Decision { .. } | Record::Forget { .. }) => {
                self.replay_two_phase(r, now)
            }
        }
        // Nothing runs in a host during replay: stored objects are restored on their next call.
        self.forwards.clear();
        self.records.clear();
        self.touched_persistent = false;
        Ok(())
    }

    /// After recovery: every connection of the old server is gone, so drop the calls still
    /// parked. The disconnects are logged like live ones, so a later replay sees them too.
    pub fn restart(&mut self, now: Instant) -> Vec<Delivery> {
        let conns: Vec<ConnId> = self.logged_conns.iter().copied().collect();
        conns.into_iter().flat_map(|c| self.disconnect(c, now)).collect()
    }

    pub(super) fn log(&mut self, record: Vec<u8>) {
        self.records.push(record);
        self.touched_persistent = true;
    }

    /// Whether `key` holds a persistent object.
    /// (One still constructing is not yet: it has no record that a replay would find, so
    /// nothing about it may be logged.)
    pub(super) fn is_persistent(&self, key: &str) -> bool {
        self.objects.get(key).is_some_and(is_durable)
    }

    /// Whether `op` reaches a persistent object (kept for a snapshot in progress). Its
    /// replies, and those about an absent key, wait for the log (see [`take_log`](Self::take_log)).
    pub(super) fn touch(&mut self, op: &Op) -> bool {
        let persistent = match op {
            Op::Create { persistent: true, .. } => self.storage != Storage::None,
            op => self.is_persistent(op.key()),
        };
        // An absent key may be a persistent object whose delete is not durable yet: answers
        // about it wait for the log like answers about persistent objects.
        let durable = self.storage != Storage::None;
        self.touched_persistent |= persistent || (durable && !self.objects.contains_key(op.key()));
        if persistent {
            self.preserve(op.key());
        }
        persistent
    }

    /// Whether `op`, on a `persistent` object or not, is logged as it is applied; refused if
    /// its persistence does not suit (a create) or it may change a persistent object while
    /// the log is failed.
    pub(super) fn check_write(&self, op: &Op, persistent: bool) -> Result<bool, Error> {
        if let Op::Create {
            type_name,
            key,
            persistent: wanted,
            ..
        } = op
        {
            self.check_persistence(type_name, key, *wanted)?;
        }
        // A persistent user-defined object's create and calls are logged when its host
        // answers them, with its state after them (`complete`); they may change it, so a
        // failed log refuses them too.
        let mut user_write = false;
        let logged = persistent
            && match op {
                Op::Call { key, method, .. } => match self.objects.get(key).map(|e| &e.body) {
                    Some(Body::Builtin(obj)) => obj.is_mutating(method) && self.reading.is_none(),
                    Some(Body::User(_)) => {
                        user_write = true;
                        false
                    }
                    None => false,
                },
                Op::Create { type_name, .. } if user::is_user_type(type_name) => {
                    user_write = true;
                    false
                }
                Op::Create { .. } | Op::Delete { .. } => true,
            };
        if logged || user_write {
            if let Storage::Failed(why) = &self.storage {
                return Err(storage_error(why));
            }
        }
        Ok(logged)
    }

    /// Log a call [`check_write`](Self::check_write) found logged: its `replayed` record, or
    /// one encoded now. Refused if the record would be too large.
    pub(super) fn log_call(
        &mut self,
        caller: &Caller,
        token: Token,
        seq: u64,
        acked: u64,
        op: &Op,
        replayed: Option<&[u8]>,
    ) -> Result<(), Error> {
        let record: Cow<[u8]> = match replayed {
            Some(bytes) => Cow::Borrowed(bytes),
            None => Cow::Owned(encode_apply(caller, token, seq, acked, op)),
        };
        if record.len() > MAX_RECORD_LEN {
            return Err(Error::value(format!(
                "this change to persistent object '{}' would be an op-log record of {} bytes, more than \
                 the {MAX_RECORD_LEN} a record may hold: make it in smaller parts",
                op.key(),
                record.len()
            )));
        }
        // A replay compiles a compiled type's code from its logged module, before the create.
        if let Op::Create { type_name, args, .. } = op {
            if let (true, Some(version)) = (
                compiled::is_compiled_type(type_name),
                args.first().and_then(Value::as_str),
            ) {
                self.log_class_once((type_name.clone(), version.to_string()));
            }
        }
        match record {
            Cow::Owned(record) => self.log(record),
            Cow::Borrowed(_) => self.touched_persistent = true,
        }
        self.logged_conns.insert(caller.conn);
        if !self.logged_clients.contains(&caller.client) {
            self.logged_clients.insert(caller.client.clone());
        }
        self.highest_logged_conn = self.highest_logged_conn.max(caller.conn);
        Ok(())
    }

    /// A logged call parked: keep its record (the `replayed` one, or the one logged at
    /// `logged_at`) for a snapshot, whose restore applies it again.
    pub(super) fn keep_parked_record(&mut self, token: Token, logged_at: usize, replayed: Option<&[u8]>) {
        let record = match replayed {
            Some(bytes) => Some(bytes.to_vec()),
            None => self.records.get(logged_at).cloned(),
        };
        if let Some(record) = record {
            self.parked_order += 1;
            self.parked_records.insert(token, (self.parked_order, record));
        }
    }

    /// A `create`'s `persistent` must suit the type, the server and the object already there.
    pub(super) fn check_persistence(&self, type_name: &str, key: &str, persistent: bool) -> Result<(), Error> {
        if persistent {
            if objects::TYPES.contains(&type_name) && !objects::is_durable(type_name) {
                return Err(Error::value(format!(
                    "{type_name} is a synchronization object, ephemeral by nature: persistent=True is only \
                     for data objects (Counter, Value, Dict, SortedDict, List, Blob, Array, Queue, LifoQueue, \
                     PriorityQueue)"
                )));
            }
            if self.storage == Storage::None {
                return Err(Error::value(
                    "persistent=True needs a server started with a data directory: this server has no --data-dir",
                ));
            }
            // Forwarding notes are not logged: answer here, where a replay would too.
            if let Some((new_key, _)) = self.moved.get(key) {
                return Err(moved(key, new_key));
            }
        }
        match self.objects.get(key) {
            // Refused here, unlogged: a replay has no ephemeral (or still constructing) object
            // at `key`, so a logged create would succeed there and diverge from the live run.
            Some(e) if persistent && !is_durable(e) && e.body.type_name() != type_name => {
                check_type(key, e.body.type_name(), type_name)
            }
            Some(e) if e.body.type_name() == type_name && e.persistent != persistent => {
                let (is, not) = match e.persistent {
                    true => ("persistent", "persistent=False"),
                    false => ("ephemeral", "persistent=True"),
                };
                Err(Error::value(format!(
                    "'{key}' is an existing {is} {type_name}: it cannot be used with {not} (delete it first, or use another name)"
                )))
            }
            _ => Ok(()),
        }
    }
}
