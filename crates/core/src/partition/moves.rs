//! Objects leaving their key or their node: `keep` (detach, attach, forwarding notes),
//! export to another node, and abandoning the shard.

use std::sync::Arc;
use std::time::Instant;

use super::{check_type, system_caller, Body, Entry, Partition};
use crate::objects::user::{Forward, UserState};
use crate::{objects, Ctx, Delivery, Error, ErrorKind, Object, Token, Value};

/// An object taken out of its partition by `keep`, on its way to another key.
pub struct Detached {
    obj: Box<dyn Object>,
    owner: Option<Arc<str>>,
}

impl Detached {
    pub fn owner(&self) -> Option<Arc<str>> {
        self.owner.clone()
    }

    /// The object's type and state (its snapshot, [`crate::objects::snapshot`]), to move it
    /// to another node ([`Partition::decode_detached`] there): `None` for a type whose state
    /// is who holds and who waits (a `Lock`, a `Barrier`...), which cannot leave its node's
    /// connections.
    pub fn encode(&self) -> Option<(&str, Value)> {
        self.obj.snapshot().map(|state| (self.obj.type_name(), state))
    }
}

/// `keep` moves objects between keys and sessions, which the op log does not record yet.
pub(super) fn persistent_keep(type_name: &str, key: &str) -> Error {
    Error::value(format!(
        "persistent {type_name} '{key}' cannot be kept under a new name or outside its session yet; \
         construct it with name= instead"
    ))
}

pub(super) fn moved(key: &str, new_key: &str) -> Error {
    Error::new(ErrorKind::Moved, format!("'{key}' was kept as '{new_key}'")).with_data(Value::from(new_key))
}

impl Partition {
    /// [`detach`](Self::detach) for `keep` under `name`: `Ok(None)` when the key holds no
    /// object because an earlier try of the same `keep` already moved it to `name` (a retry).
    pub fn detach_to(&mut self, type_name: &str, key: &str, name: &str) -> Result<Option<Detached>, Error> {
        match self.detach(type_name, key) {
            Ok(detached) => Ok(Some(detached)),
            Err(e) if e.kind == ErrorKind::NotFound && self.moved.get(key).is_some_and(|(to, _)| to == name) => {
                Ok(None)
            }
            Err(e) => Err(e),
        }
    }

    /// The inverse of [`Detached::encode`], on the node the object moves to (owned by
    /// nobody, as `keep` leaves it). A bad state is a `ValueError`; a compiled type's code
    /// must have been offered here first ([`offer_class`](Self::offer_class)).
    pub fn decode_detached(&self, type_name: &str, state: &Value) -> Result<Detached, Error> {
        let obj = match objects::compiled::is_compiled_type(type_name) {
            true => self.restore_compiled(type_name, state)?,
            false => objects::snapshot::restore(type_name, state)?,
        };
        Ok(Detached { obj, owner: None })
    }

    /// Take an object out for `keep`. Refused while calls are parked on it.
    pub fn detach(&mut self, type_name: &str, key: &str) -> Result<Detached, Error> {
        let e = self
            .objects
            .get(key)
            .ok_or_else(|| Error::new(ErrorKind::NotFound, format!("{type_name} '{key}' does not exist")))?;
        check_type(key, e.body.type_name(), type_name)?;
        if e.persistent {
            return Err(persistent_keep(type_name, key));
        }
        let obj = match &e.body {
            Body::Builtin(obj) => obj,
            Body::User(_) => {
                return Err(Error::value(format!(
                    "a user-defined object stays under its key: {type_name} '{key}' cannot be kept \
                     under a new name; construct it with name= instead"
                )))
            }
        };
        if obj.has_waiters() {
            return Err(Error::new(
                ErrorKind::Busy,
                format!("{type_name} '{key}' has parked callers; keep it when none are waiting"),
            ));
        }
        if self.prepared_holder(key).is_some() {
            return Err(Error::new(
                ErrorKind::Busy,
                format!("{type_name} '{key}' is held by a transaction being committed; keep it once it is"),
            ));
        }
        let e = self.remove(key).expect("checked");
        let Body::Builtin(obj) = e.body else {
            unreachable!("checked above")
        };
        Ok(Detached { obj, owner: e.owner })
    }

    /// Put a detached object under `key`, owned by nobody. Gives it back if `key` is taken.
    pub fn attach(&mut self, key: &str, d: Detached) -> Result<(), (Error, Detached)> {
        if let Some(e) = self.objects.get(key) {
            let err = Error::new(
                ErrorKind::TypeMismatch,
                format!("'{key}' is already a {}", e.body.type_name()),
            );
            return Err((err, d));
        }
        self.moved.remove(key);
        self.objects.insert(
            key.to_string(),
            Entry {
                body: Body::Builtin(d.obj),
                owner: None,
                // `detach` refuses persistent objects.
                persistent: false,
                epoch: self.snapshot_epoch,
            },
        );
        Ok(())
    }

    /// Undo a detach whose attach failed. False (and the object dropped) if `key` was made
    /// anew meanwhile (only possible when the object was away from the shard's lock).
    #[must_use]
    pub fn restore(&mut self, key: &str, d: Detached) -> bool {
        if self.objects.contains_key(key) {
            return false;
        }
        self.objects.insert(
            key.to_string(),
            Entry {
                body: Body::Builtin(d.obj),
                owner: d.owner,
                persistent: false,
                epoch: self.snapshot_epoch,
            },
        );
        true
    }

    /// Leave a forwarding note at an old key after `keep` moved its object.
    pub fn set_moved(&mut self, old_key: &str, new_key: &str, owner: Option<Arc<str>>) {
        self.moved.insert(old_key.to_string(), (new_key.to_string(), owner));
    }

    /// `keep(obj)` without a new name: the object outlives its session.
    pub fn disown(&mut self, type_name: &str, key: &str) -> Result<(), Error> {
        let e = self
            .objects
            .get_mut(key)
            .ok_or_else(|| Error::new(ErrorKind::NotFound, format!("{type_name} '{key}' does not exist")))?;
        check_type(key, e.body.type_name(), type_name)?;
        if e.persistent && e.owner.is_some() {
            return Err(persistent_keep(type_name, key));
        }
        e.owner = None;
        Ok(())
    }

    /// This replica stops serving its shard (in a cluster, the shard's leadership moved):
    /// answer every parked call, and every call waiting for an object host, with `error`,
    /// and let the hosts drop their objects (see [`take_forwards`](Self::take_forwards)).
    /// The partition is replaced after this.
    pub fn abandon(&mut self, error: &Error, now: Instant) -> Vec<Delivery> {
        let keys: Vec<String> = self.objects.iter().map(|(k, _)| k.to_string()).collect();
        let mut out = self.abandon_waiting(error);
        out.extend(self.abandon_lock_waits(error));
        out.extend(self.abandon_copies(error));
        for key in keys {
            let Some(e) = self.remove(&key) else { continue };
            match e.body {
                Body::Builtin(mut obj) => {
                    let caller = system_caller();
                    let mut ctx = Ctx::new(&caller, Token { conn: 0, req: 0 }, now, &mut out);
                    obj.drain_waiters(&mut ctx, error);
                }
                Body::User(u) => {
                    out.extend(u.calls.into_iter().map(|token| Delivery {
                        token,
                        reply: Err(error.clone()),
                    }));
                    if u.state != UserState::Stored {
                        self.forwards.push(Forward::Drop { key, object_id: u.id });
                    }
                }
            }
        }
        out
    }
}
