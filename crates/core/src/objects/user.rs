//! User-defined objects (`py:` types). The partition owns them like any object (names,
//! sessions, exactly-once replies), but their state and methods live in an object host
//! process: a call here only queues the caller and emits a [`Forward`] for the server to send
//! to the host, and the host's answer comes back through `Partition::complete`.

use std::collections::VecDeque;

use crate::{Error, ErrorKind, Token, Value};

/// Every type starting with this is user-defined.
pub const USER_PREFIX: &str = "py:";
/// Longest user-defined type name, in bytes.
pub const MAX_TYPE_NAME: usize = 256;

pub fn is_user_type(type_name: &str) -> bool {
    type_name.starts_with(USER_PREFIX)
}

/// Check a user-defined type name (`py:<module>.<qualname>`).
pub fn check_type_name(type_name: &str) -> Result<(), Error> {
    if !is_user_type(type_name) || type_name.len() == USER_PREFIX.len() {
        return Err(Error::bad_args(format!(
            "'{type_name}' is no user-defined type name (py:<module>.<qualname>)"
        )));
    }
    if type_name.len() > MAX_TYPE_NAME {
        return Err(Error::bad_args(format!(
            "a user-defined type name is at most {MAX_TYPE_NAME} bytes, not {}",
            type_name.len()
        )));
    }
    Ok(())
}

/// The class name as people write it: `py:__main__.Centroids` → `Centroids`.
pub fn short_name(type_name: &str) -> &str {
    let name = type_name.strip_prefix(USER_PREFIX).unwrap_or(type_name);
    name.rsplit('.').next().unwrap_or(name)
}

/// Where a user-defined object stands.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum UserState {
    /// The constructor runs in the host; its `create` waits at the front of the calls.
    Constructing,
    Ready,
    /// Its host died with it (the reason says how); calls answer `ObjectLost`.
    Lost(String),
    /// A persistent object that no host holds (after a restart, or after its host died):
    /// its last logged state is [`UserObject::last_state`], and the next call restores it
    /// in a host ([`Forward::Restore`]) before it runs.
    Stored,
}

/// A request for the object's host, in the order the partition applied the calls.
#[derive(Clone, Debug, PartialEq)]
pub enum Forward {
    Construct {
        key: String,
        object_id: u64,
        type_name: String,
        version: String,
        args: Vec<Value>,
        kwargs: Value,
        /// The host sends the instance's pickled state with the constructor's reply and
        /// with every call's (a persistent object).
        persistent: bool,
    },
    /// Rebuild a persistent object from its last logged state (no constructor runs); the
    /// host sends its state with every later reply, as after a persistent `Construct`.
    Restore {
        key: String,
        object_id: u64,
        type_name: String,
        version: String,
        state: Vec<u8>,
    },
    Call {
        key: String,
        object_id: u64,
        /// For messages (a call that ran past the object call timeout).
        type_name: String,
        method: String,
        args: Vec<Value>,
        kwargs: Value,
    },
    /// The object was deleted: the host forgets its instance.
    Drop { key: String, object_id: u64 },
    /// A transaction's first touch of the object: the host keeps a copy of instance
    /// `object_id` (its state pickled and rebuilt; a persistent object's copy starts from
    /// its last state sent) under `copy_id`, for that transaction's calls.
    Copy { key: String, object_id: u64, copy_id: u64 },
    /// A call of a transaction, on its copy (answered, with the copy's state for a
    /// persistent object, as a call is).
    CopyCall {
        key: String,
        copy_id: u64,
        type_name: String,
        method: String,
        args: Vec<Value>,
        kwargs: Value,
    },
    /// The transaction committed: its copy becomes instance `object_id` of the object.
    Adopt { key: String, object_id: u64, copy_id: u64 },
    /// The transaction ended without it (aborted, or the copy is not needed): the copy goes.
    DropCopy { key: String, copy_id: u64 },
}

impl Forward {
    pub fn key(&self) -> &str {
        match self {
            Forward::Construct { key, .. }
            | Forward::Restore { key, .. }
            | Forward::Call { key, .. }
            | Forward::Drop { key, .. }
            | Forward::Copy { key, .. }
            | Forward::CopyCall { key, .. }
            | Forward::Adopt { key, .. }
            | Forward::DropCopy { key, .. } => key,
        }
    }

    /// The instance the request is about in its host: the object's, or a transaction's copy.
    pub fn object_id(&self) -> u64 {
        match self {
            Forward::Construct { object_id, .. }
            | Forward::Restore { object_id, .. }
            | Forward::Call { object_id, .. }
            | Forward::Drop { object_id, .. }
            | Forward::Adopt { object_id, .. } => *object_id,
            Forward::Copy { copy_id, .. } | Forward::CopyCall { copy_id, .. } | Forward::DropCopy { copy_id, .. } => {
                *copy_id
            }
        }
    }
}

/// A user-defined object as the partition sees it: no state of its own, only who waits.
#[derive(Debug)]
pub struct UserObject {
    pub type_name: String,
    pub version: String,
    /// Unique in its partition (so unique for its key): a late host reply about a deleted
    /// and recreated object names the old id and is dropped.
    pub id: u64,
    pub state: UserState,
    /// Calls sent to the host and not answered yet, oldest first. The host answers one
    /// object's calls in order, so a reply completes the front. While constructing, the
    /// front is the `create`.
    pub calls: VecDeque<Token>,
    /// A persistent object's last logged state (a pickle, opaque here): what a host that
    /// died with it, or a restarted server, brings it back to. `None` for ephemeral ones
    /// (and while a persistent one constructs).
    pub last_state: Option<Vec<u8>>,
}

/// `create` arguments of a `py:` type: `[version, args, kwargs]`.
pub fn parse_create_args(type_name: &str, args: Vec<Value>) -> Result<(String, Vec<Value>, Value), Error> {
    let shape = || {
        Error::bad_args(format!(
            "creating a {type_name} takes [version: str, args: array, kwargs: map]"
        ))
    };
    let [version, args, kwargs]: [Value; 3] = args.try_into().map_err(|_| shape())?;
    match (version, args, kwargs) {
        (Value::String(v), Value::Array(args), kwargs @ Value::Map(_)) => {
            let version = v.into_str().filter(|v| !v.is_empty()).ok_or_else(shape)?;
            Ok((version, args, kwargs))
        }
        _ => Err(shape()),
    }
}

/// `call` arguments of a `py:` type: `[args, kwargs]`.
pub fn parse_call_args(type_name: &str, method: &str, args: Vec<Value>) -> Result<(Vec<Value>, Value), Error> {
    let shape = || Error::bad_args(format!("{type_name}.{method} takes [args: array, kwargs: map]"));
    let [args, kwargs]: [Value; 2] = args.try_into().map_err(|_| shape())?;
    match (args, kwargs) {
        (Value::Array(args), kwargs @ Value::Map(_)) => Ok((args, kwargs)),
        _ => Err(shape()),
    }
}

/// The reply to a call on an object whose host died.
pub fn lost(type_name: &str, key: &str, reason: &str) -> Error {
    Error::new(ErrorKind::ObjectLost, format!("{type_name} '{key}' was lost: {reason}"))
        .with_data(Value::Map(vec![(Value::from("reason"), Value::from(reason))]))
}

/// The reply to a call on a persistent object whose host died before answering it: the
/// object is back to its last logged state, and the call did not take effect.
pub fn lost_persistent(type_name: &str, key: &str, reason: &str) -> Error {
    let reason = format!(
        "{reason}; the object was restored to its last acknowledged state (it is rebuilt in a host on its \
         next call) and this call did not take effect"
    );
    Error::new(
        ErrorKind::ObjectLost,
        format!("{type_name} '{key}' lost this call: {reason}"),
    )
    .with_data(Value::Map(vec![(Value::from("reason"), Value::from(reason))]))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn type_names() {
        assert!(check_type_name("py:__main__.Centroids").is_ok());
        assert_eq!(check_type_name("py:").unwrap_err().kind, ErrorKind::BadArguments);
        assert_eq!(check_type_name("Counter").unwrap_err().kind, ErrorKind::BadArguments);
        let long = format!("py:{}", "x".repeat(MAX_TYPE_NAME));
        assert!(check_type_name(&long)
            .unwrap_err()
            .message
            .contains("at most 256 bytes"));
        assert!(check_type_name(&long[..MAX_TYPE_NAME]).is_ok());
        assert_eq!(short_name("py:__main__.Centroids"), "Centroids");
        assert_eq!(short_name("py:Plain"), "Plain");
    }

    #[test]
    fn argument_shapes() {
        let map = Value::Map(vec![]);
        let ok = vec!["v1".into(), Value::Array(vec![1.into()]), map.clone()];
        assert_eq!(
            parse_create_args("py:m.C", ok).unwrap(),
            ("v1".to_string(), vec![1.into()], map.clone())
        );
        for bad in [
            vec![],
            vec!["v1".into(), Value::Array(vec![])],
            vec![1.into(), Value::Array(vec![]), map.clone()],
            vec!["".into(), Value::Array(vec![]), map.clone()],
            vec!["v1".into(), map.clone(), map.clone()],
            vec!["v1".into(), Value::Array(vec![]), Value::Nil],
        ] {
            assert_eq!(
                parse_create_args("py:m.C", bad).unwrap_err().kind,
                ErrorKind::BadArguments
            );
        }
        assert!(parse_call_args("py:m.C", "f", vec![Value::Array(vec![]), map.clone()]).is_ok());
        let e = parse_call_args("py:m.C", "f", vec![Value::Array(vec![])]).unwrap_err();
        assert_eq!(e.message, "py:m.C.f takes [args: array, kwargs: map]");
    }
}
