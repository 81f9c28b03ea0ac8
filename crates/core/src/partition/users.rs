//! User-defined objects (`py:` types) run in object hosts: their calls park here and leave as
//! [`Forward`]s, which the server drains with [`Partition::take_forwards`] right after each
//! entry point (so a host sees one object's calls in the order applied here); the host's
//! answers come back through [`Partition::complete`] and [`Partition::lose`].

use ahash::HashMap;
use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Instant;

use super::{Body, Entry, KeyAndOwner, Partition, Storage};
use crate::objects::compiled;
use crate::objects::user::{self, Forward, UserObject, UserState};
use crate::record::{encode_class, encode_user_state, UserStateRef, MAX_RECORD_LEN};
use crate::{Delivery, Error, ErrorKind, Reply, Token, Value};

/// A persistent user-defined object as logged: what a partition snapshot keeps of it.
#[derive(Clone, Debug, PartialEq)]
pub struct StoredUser {
    pub key: String,
    pub type_name: String,
    pub version: String,
    /// The session owning it (an unnamed object), if any.
    pub owner: Option<String>,
    /// Its last logged state (a pickle; opaque here).
    pub state: Vec<u8>,
}

/// One user-defined object of its version less (deleted, or lost with its host).
pub(super) fn uncount(versions: &mut HashMap<(String, String), usize>, u: &UserObject) {
    let key = (u.type_name.clone(), u.version.clone());
    if let Some(n) = versions.get_mut(&key) {
        *n -= 1;
        if *n == 0 {
            versions.remove(&key);
        }
    }
}

/// Refuse a method that is not shared (private and special ones), before it reaches a host.
pub(super) fn shared_method(type_name: &str, method: &str) -> Result<(), Error> {
    if method.starts_with('_') {
        return Err(Error::new(
            ErrorKind::UnknownMethod,
            format!("{type_name} has no shared method '{method}': private and special methods are not shared"),
        ));
    }
    Ok(())
}

/// Queue a call on a user-defined object for its host.
pub(super) fn forward_call(
    u: &mut UserObject,
    token: Token,
    key: &str,
    method: &str,
    args: Vec<Value>,
    next_object_id: &mut u64,
    forwards: &mut Vec<Forward>,
) -> Result<(), Error> {
    shared_method(&u.type_name, method)?;
    let (args, kwargs) = user::parse_call_args(&u.type_name, method, args)?;
    if let UserState::Lost(reason) = &u.state {
        return Err(user::lost(&u.type_name, key, reason));
    }
    restore_if_stored(u, key, next_object_id, forwards);
    u.calls.push_back(token);
    forwards.push(Forward::Call {
        key: key.to_string(),
        object_id: u.id,
        type_name: u.type_name.clone(),
        method: method.to_string(),
        args,
        kwargs,
    });
    Ok(())
}

/// A persistent object that no host holds is rebuilt in one from its last logged state
/// before anything else reaches it.
pub(super) fn restore_if_stored(u: &mut UserObject, key: &str, next_object_id: &mut u64, forwards: &mut Vec<Forward>) {
    if u.state == UserState::Stored {
        // Rebuilt from its last logged state, under a new id: answers about the instance
        // its dead host held are dropped.
        *next_object_id += 1;
        u.id = *next_object_id;
        u.state = UserState::Ready;
        forwards.push(Forward::Restore {
            key: key.to_string(),
            object_id: u.id,
            type_name: u.type_name.clone(),
            version: u.version.clone(),
            state: u.last_state.clone().unwrap_or_default(),
        });
    }
}

impl Partition {
    /// User-defined objects alive (constructing or constructed; not lost).
    pub fn hosted_objects(&self) -> usize {
        self.versions.values().sum()
    }

    /// User-defined objects of `type_name` at `version` alive (lost ones hold no instance).
    pub fn count_version(&self, type_name: &str, version: &str) -> usize {
        self.versions
            .get(&(type_name.to_string(), version.to_string()))
            .copied()
            .unwrap_or(0)
    }

    /// The live user-defined objects of `type_name` at `version`, as `(key, owner)`: the
    /// session an unnamed object goes with, `None` for a named (or kept) one. What stops
    /// another version from being defined, for the refusal to name.
    pub fn objects_of_version(&self, type_name: &str, version: &str) -> Vec<KeyAndOwner> {
        if self.count_version(type_name, version) == 0 {
            return Vec::new();
        }
        self.objects
            .iter()
            .filter_map(|(key, e)| match &e.body {
                Body::User(u)
                    if u.type_name == type_name && u.version == version && !matches!(u.state, UserState::Lost(_)) =>
                {
                    Some((key.to_string(), e.owner.clone()))
                }
                _ => None,
            })
            .collect()
    }

    /// The code of class `type_name` at `version`, if this partition logged it.
    pub fn class_code(&self, type_name: &str, version: &str) -> Option<&Arc<Vec<u8>>> {
        self.classes.get(&(type_name.to_string(), version.to_string()))
    }

    /// Every class whose code this partition logged, as `(type, version, code)` (for a
    /// partition snapshot, and to register them with the server after recovery).
    pub fn classes(&self) -> Vec<(String, String, Arc<Vec<u8>>)> {
        self.classes
            .iter()
            .map(|((t, v), code)| (t.clone(), v.clone(), code.clone()))
            .collect()
    }

    /// A persistent create of a user-defined type is about to be applied with `code` as
    /// its class: keep the code to log it with the first state of that version here.
    /// A compiled type's code is compiled here too, as any create of it needs it; the error
    /// is the library's refusal.
    pub fn offer_class(&mut self, type_name: &str, version: &str, code: &Arc<Vec<u8>>) -> Result<(), Error> {
        if compiled::is_compiled_type(type_name) {
            self.compile(type_name, version, code)?;
            self.forget_unused_code(type_name, version);
        }
        let class = (type_name.to_string(), version.to_string());
        if self.storage != Storage::None && !self.classes.contains_key(&class) {
            self.unlogged_classes.entry(class).or_insert_with(|| code.clone());
        }
        Ok(())
    }

    /// Put a class logged earlier back (replay, or a partition snapshot being restored),
    /// compiling a compiled type's.
    pub fn insert_class(&mut self, type_name: &str, version: &str, code: Arc<Vec<u8>>) -> Result<(), Error> {
        if compiled::is_compiled_type(type_name) {
            self.compile(type_name, version, &code)?;
        }
        let class = (type_name.to_string(), version.to_string());
        self.unlogged_classes.remove(&class);
        self.classes.insert(class, code);
        Ok(())
    }

    /// Every persistent user-defined object with its last logged state, by key (for a
    /// partition snapshot). One still constructing has no state yet and is left out.
    pub fn stored_user_objects(&self) -> Vec<StoredUser> {
        let mut found: Vec<StoredUser> = self
            .objects
            .iter()
            .filter(|(_, e)| e.persistent)
            .filter_map(|(k, e)| match &e.body {
                Body::User(u) => u.last_state.as_ref().map(|state| StoredUser {
                    key: k.to_string(),
                    type_name: u.type_name.clone(),
                    version: u.version.clone(),
                    owner: e.owner.as_deref().map(str::to_string),
                    state: state.clone(),
                }),
                Body::Builtin(_) => None,
            })
            .collect();
        found.sort_unstable_by(|a, b| a.key.cmp(&b.key));
        found
    }

    /// Put a persistent user-defined object at `o.key` with no instance in any host (the
    /// next call restores it from `o.state`), replacing what was there: replay of its
    /// `user_state` record, or a partition snapshot being restored.
    pub fn insert_stored_user(&mut self, o: StoredUser) {
        let same = matches!(
            self.objects.get(&o.key),
            Some(Entry { body: Body::User(u), persistent: true, .. })
                if u.type_name == o.type_name && u.version == o.version && u.calls.is_empty()
        );
        if same {
            if let Some(Entry {
                body: Body::User(u),
                owner,
                ..
            }) = self.objects.get_mut(&o.key)
            {
                u.state = UserState::Stored;
                u.last_state = Some(o.state);
                *owner = o.owner.map(Arc::from);
            }
            return;
        }
        self.remove(&o.key);
        self.next_object_id += 1;
        *self
            .versions
            .entry((o.type_name.clone(), o.version.clone()))
            .or_default() += 1;
        let u = UserObject {
            type_name: o.type_name,
            version: o.version,
            id: self.next_object_id,
            state: UserState::Stored,
            calls: VecDeque::new(),
            last_state: Some(o.state),
        };
        self.objects.insert(
            o.key,
            Entry {
                body: Body::User(Box::new(u)),
                owner: o.owner.map(Arc::from),
                persistent: true,
                epoch: self.snapshot_epoch,
            },
        );
    }

    /// Make user-defined object `key` anew (replacing a lost one there): its host constructs
    /// it, and the create is answered when the constructor returns (`complete`).
    pub(super) fn construct(
        &mut self,
        token: Token,
        type_name: String,
        key: String,
        (version, args, kwargs): (String, Vec<Value>, Value),
        owner: Option<Arc<str>>,
        persistent: bool,
    ) {
        self.remove(&key);
        self.next_object_id += 1;
        let object_id = self.next_object_id;
        self.forwards.push(Forward::Construct {
            key: key.clone(),
            object_id,
            type_name: type_name.clone(),
            version: version.clone(),
            args,
            kwargs,
            persistent,
        });
        *self.versions.entry((type_name.clone(), version.clone())).or_default() += 1;
        self.hosted.insert(token);
        let u = UserObject {
            type_name,
            version,
            id: object_id,
            state: UserState::Constructing,
            calls: VecDeque::from([token]),
            last_state: None,
        };
        self.objects.insert(
            key,
            Entry {
                body: Body::User(Box::new(u)),
                owner,
                persistent,
                epoch: self.snapshot_epoch,
            },
        );
    }

    /// The requests for object hosts produced since the last call, in order.
    pub fn take_forwards(&mut self) -> Vec<Forward> {
        std::mem::take(&mut self.forwards)
    }

    /// A call resent (same client and seq) while the first is still with the object's host
    /// must not run twice: the resent one takes the first one's place and gets its reply.
    pub(super) fn take_over(&mut self, client: &Arc<str>, token: Token, seq: u64, key: &str) -> bool {
        let Some(Entry {
            body: Body::User(u), ..
        }) = self.objects.get_mut(key)
        else {
            return false;
        };
        let parked_seqs = &self.parked_seqs;
        let Some(slot) = u
            .calls
            .iter_mut()
            .find(|t| parked_seqs.get(t).is_some_and(|(c, s)| *s == seq && **c == **client))
        else {
            return false;
        };
        let old = std::mem::replace(slot, token);
        if let Some(record) = self.parked_seqs.remove(&old) {
            self.parked_seqs.insert(token, record);
        }
        self.hosted.remove(&old);
        self.hosted.insert(token);
        true
    }

    /// The id the next object created here will follow.
    pub fn next_object_id(&self) -> u64 {
        self.next_object_id
    }

    /// Number objects created from now on above `next`: a partition rebuilt in place of
    /// another must not reuse ids that object hosts may still answer about.
    pub fn skip_object_ids(&mut self, next: u64) {
        self.next_object_id = self.next_object_id.max(next);
    }

    /// The host of user-defined object `object_id` at `key` answered its oldest call (or its
    /// constructor). A reply about an object that is gone (deleted, lost, recreated) is
    /// dropped.
    pub fn complete(&mut self, key: &str, object_id: u64, reply: Reply, now: Instant) -> Vec<Delivery> {
        self.complete_with_state(key, object_id, reply, None, now)
    }

    /// [`complete`](Self::complete) with the object's pickled state after the call, which the
    /// host sends for a persistent object (unless the call never ran, or its state did not
    /// pickle). That state is logged with the reply (and the class's code before the first
    /// state of its version), so the reply waits for the record to be durable.
    pub fn complete_with_state(
        &mut self,
        key: &str,
        object_id: u64,
        mut reply: Reply,
        state: Option<Vec<u8>>,
        now: Instant,
    ) -> Vec<Delivery> {
        if self.is_copy(object_id) {
            let mut out = self.complete_copy(object_id, reply, state);
            // A transaction it aborted held objects others wait for.
            out.extend(self.wake(now));
            return out;
        }
        let mut out = Vec::new();
        let persistent = match self.objects.get(key) {
            Some(Entry {
                body: Body::User(u),
                persistent,
                ..
            }) if u.id == object_id && !u.calls.is_empty() => *persistent,
            _ => return out,
        };
        // Why the object goes back to its last logged state after this call, if it does.
        let restore = match persistent {
            true => self.log_answer(key, object_id, &mut reply, state),
            false => None,
        };
        let Some(u) = self.user_mut(key, object_id) else {
            return out;
        };
        let Some(token) = u.calls.pop_front() else {
            return out;
        };
        match (&u.state, reply) {
            (UserState::Constructing, Ok(_)) => {
                u.state = UserState::Ready;
                out.push(Delivery {
                    token,
                    reply: Ok(Value::Boolean(true)),
                });
            }
            (UserState::Constructing, Err(e)) => {
                // No object is left; what was queued behind the constructor finds none.
                let type_name = u.type_name.clone();
                let message = format!(
                    "{type_name} '{key}' does not exist: its constructor failed ({}: {})",
                    e.kind.as_str(),
                    e.message
                );
                out.push(Delivery { token, reply: Err(e) });
                if let Some(Entry {
                    body: Body::User(u), ..
                }) = self.remove(key)
                {
                    let err = Error::new(ErrorKind::NotFound, message);
                    out.extend(u.calls.into_iter().map(|token| Delivery {
                        token,
                        reply: Err(err.clone()),
                    }));
                }
            }
            (_, reply) => out.push(Delivery { token, reply }),
        }
        self.settle(&out);
        if let Some(reason) = restore {
            out.extend(self.lose(key, object_id, reason, now));
        }
        out
    }

    /// The host of persistent user-defined object `object_id` at `key` answered `reply`, with
    /// `state` after the call: log them, or, when they cannot be, make the reply an error and
    /// drop the host's instance. Returns why the object goes back to its last logged state,
    /// if it does.
    fn log_answer(
        &mut self,
        key: &str,
        object_id: u64,
        reply: &mut Reply,
        state: Option<Vec<u8>>,
    ) -> Option<&'static str> {
        let mut restore = None;
        self.touched_persistent = true;
        self.preserve(key);
        let constructing = self
            .user_mut(key, object_id)
            .is_some_and(|u| u.state == UserState::Constructing);
        match state {
            Some(state) => {
                if constructing {
                    if let Ok(v) = reply {
                        *v = Value::Boolean(true);
                    }
                }
                if !(constructing && reply.is_err()) {
                    if let Err(len) = self.log_user_state(key, reply, state) {
                        // Unloggable: the host's instance (and the calls sent to it
                        // after this one) go; the object keeps its last logged state.
                        *reply = Err(Error::value(format!(
                            "the state of the persistent object '{key}' with this call's reply is {len} \
                             bytes, over the {MAX_RECORD_LEN} an op-log record holds: this call did not \
                             take effect and the object keeps its last acknowledged state"
                        )));
                        self.forwards.push(Forward::Drop {
                            key: key.to_string(),
                            object_id,
                        });
                        if !constructing {
                            restore = Some("an earlier call left a state too large to log");
                        }
                    }
                }
            }
            // A host must send the state after a persistent object's constructor or call
            // returned: without it the change cannot be logged, so it is undone.
            None if reply.is_ok() => {
                *reply = Err(Error::new(
                    ErrorKind::Internal,
                    format!(
                        "the object host sent no state for the persistent object '{key}' (a server bug): this \
                         call did not take effect"
                    ),
                ));
                self.forwards.push(Forward::Drop {
                    key: key.to_string(),
                    object_id,
                });
                if !constructing {
                    restore = Some("an earlier call's state was not sent");
                }
            }
            None => {}
        }
        restore
    }

    /// The host of user-defined object `object_id` at `key` died: every call waiting for it
    /// is answered `ObjectLost`, and so is every later call until the key is deleted or
    /// constructed again. An object lost while constructing is gone, as if its constructor
    /// had raised. A persistent object is not lost: it goes back to its last logged state
    /// ([`UserState::Stored`]), its calls in flight are answered `ObjectLost` (they did not
    /// take effect), and the next call restores it in a host.
    pub fn lose(&mut self, key: &str, object_id: u64, reason: &str, now: Instant) -> Vec<Delivery> {
        let mut out = self.lose_object(key, object_id, reason);
        // The transactions it aborted held objects others wait for.
        out.extend(self.wake(now));
        out
    }

    fn lose_object(&mut self, key: &str, object_id: u64, reason: &str) -> Vec<Delivery> {
        if self.is_copy(object_id) {
            return self.lose_copy(object_id, reason);
        }
        let mut out = Vec::new();
        let found = matches!(self.objects.get(key), Some(Entry { body: Body::User(u), .. }) if u.id == object_id);
        if found {
            // A transaction's copy may hold a change of a call that did not take effect.
            self.abort_copies_of(key);
        }
        let (u, persistent) = match self.objects.get_mut(key) {
            Some(Entry {
                body: Body::User(u),
                persistent,
                ..
            }) if u.id == object_id => (u, *persistent),
            _ => return out,
        };
        let stored = persistent && u.state == UserState::Ready;
        let err = match stored {
            true => user::lost_persistent(&u.type_name, key, reason),
            false => user::lost(&u.type_name, key, reason),
        };
        let calls = std::mem::take(&mut u.calls);
        // Their answers must not overtake those of calls whose records are being written.
        self.touched_persistent |= persistent;
        match u.state {
            UserState::Constructing => {
                self.remove(key);
            }
            // Still counted: its version stays held back from `define`.
            UserState::Ready if stored => u.state = UserState::Stored,
            UserState::Ready => {
                // No instance is left anywhere: it no longer holds its version back from `define`.
                uncount(&mut self.versions, u);
                u.state = UserState::Lost(reason.to_string());
            }
            // Lost already (its host's exit and a call that found no host both say so):
            // uncounted already. Stored: restored on its next call.
            UserState::Lost(_) | UserState::Stored => {}
        }
        out.extend(calls.into_iter().map(|token| Delivery {
            token,
            reply: Err(err.clone()),
        }));
        self.settle(&out);
        out
    }

    /// A call on user-defined object `object_id` reached its host slot, which holds no
    /// instance of it. While it constructs, the slot's record went with an answer already on
    /// its way (the constructor raised, or the host died): that answer settles its calls.
    /// Otherwise the object is lost, as in [`lose`](Self::lose).
    pub fn orphaned(&mut self, key: &str, object_id: u64, reason: &str, now: Instant) -> Vec<Delivery> {
        match self.user_mut(key, object_id) {
            Some(u) if u.state == UserState::Constructing => Vec::new(),
            _ => self.lose(key, object_id, reason, now),
        }
    }

    /// Log the state of persistent user-defined object `key` after its oldest call in flight
    /// (answered `reply`), preceded by its class's code the first time. `Err(len)`: the
    /// record would be over [`MAX_RECORD_LEN`]; nothing is logged.
    pub(super) fn log_user_state(&mut self, key: &str, reply: &Reply, state: Vec<u8>) -> Result<(), usize> {
        let Some(Entry {
            body: Body::User(u),
            owner,
            ..
        }) = self.objects.get(key)
        else {
            return Ok(());
        };
        let Some(&token) = u.calls.front() else {
            return Ok(());
        };
        let class = (u.type_name.clone(), u.version.clone());
        let recorded = self.parked_seqs.get(&token).cloned();
        let record = encode_user_state(&UserStateRef {
            key,
            type_name: &u.type_name,
            version: &u.version,
            owner: owner.as_deref(),
            token,
            client: recorded.as_ref().map(|(c, _)| &**c),
            seq: recorded.as_ref().map_or(0, |(_, s)| *s),
            reply,
            state: &state,
        });
        if record.len() > MAX_RECORD_LEN {
            return Err(record.len());
        }
        let owner = owner.clone();
        self.log_class_once(class);
        self.log(record);
        self.logged_hosted.insert(token);
        self.logged_clients.extend(owner);
        if let Some((client, _)) = recorded {
            self.logged_clients.insert(client);
        }
        self.highest_logged_conn = self.highest_logged_conn.max(token.conn);
        if let Some(Entry {
            body: Body::User(u), ..
        }) = self.objects.get_mut(key)
        {
            u.last_state = Some(state);
        }
        Ok(())
    }

    pub(super) fn user_mut(&mut self, key: &str, object_id: u64) -> Option<&mut UserObject> {
        match self.objects.get_mut(key) {
            Some(Entry {
                body: Body::User(u), ..
            }) if u.id == object_id => Some(u),
            _ => None,
        }
    }

    /// Log `class`'s code before the first state of an object of it that is logged (a
    /// replay needs the class to rebuild the object).
    pub(super) fn log_class_once(&mut self, class: (String, String)) {
        if !self.classes.contains_key(&class) {
            if let Some(code) = self.unlogged_classes.remove(&class) {
                self.log(encode_class(&class.0, &class.1, &code));
                self.classes.insert(class, code);
            }
        }
    }
}
