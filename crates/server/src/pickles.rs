//! Pickled values carry who wrote them. A pickle is code to whoever unpickles it, so the
//! server stamps every pickle a client writes (ext type 1, or one already stamped: ext type
//! 6) with the writing user and whether that user may run code here; SDKs unpickle only
//! what a trusted writer (or the reader's own user) wrote (docs/security.md).

use spindle_core::{Error, ErrorKind, Value};

use crate::acl::Principal;

/// A pickle as a client sends it.
const EXT_PICKLE: i8 = 1;
/// A pickle with its writer: the MessagePack array `[writer, trusted, pickle]`.
const EXT_STAMPED: i8 = 6;
const EXT_TUPLE: i8 = 3;

/// How deep values may nest, tuples' bodies included (each is decoded on its own, so their
/// depths add up past the frame decoder's limit): deeper is refused, so no later walk of
/// the value (comparing, hashing, stamping) can run out of stack.
const MAX_DEPTH: usize = 256;

/// Stamp every pickle in `args` (at any depth) as written by `who`.
pub(crate) fn stamp(args: &mut [Value], who: &Principal) -> Result<(), Error> {
    let mut stamp = None;
    for arg in args {
        visit(arg, who, &mut stamp, 1)?;
    }
    Ok(())
}

/// `stamp`: the stamp's first two items, encoded once per request. Whether `value` changed.
fn visit(value: &mut Value, who: &Principal, stamp: &mut Option<Vec<u8>>, depth: usize) -> Result<bool, Error> {
    if depth > MAX_DEPTH {
        return Err(Error::bad_args(format!("values nest at most {MAX_DEPTH} deep")));
    }
    let mut changed = false;
    match value {
        Value::Array(items) => {
            for item in items {
                changed |= visit(item, who, stamp, depth + 1)?;
            }
        }
        Value::Map(pairs) => {
            for (k, v) in pairs {
                changed |= visit(k, who, stamp, depth + 1)?;
                changed |= visit(v, who, stamp, depth + 1)?;
            }
        }
        Value::Ext(EXT_PICKLE, data) => {
            let data = std::mem::take(data);
            *value = stamped(&data, who, stamp);
            changed = true;
        }
        Value::Ext(EXT_STAMPED, body) => {
            // Sent back as read: stamped again, as written by this writer.
            let data = pickle_of(body)?;
            *value = stamped(&data, who, stamp);
            changed = true;
        }
        // Tuples (ext 3) hold values too: exactly one, an array.
        Value::Ext(EXT_TUPLE, body) => {
            let mut rest = &body[..];
            let mut inner = rmpv::decode::read_value_with_max_depth(&mut rest, MAX_DEPTH + 1 - depth)
                .map_err(|e| Error::bad_args(format!("a tuple (ext type 3) does not decode: {e}")))?;
            if !rest.is_empty() || !inner.is_array() {
                return Err(Error::bad_args("a tuple (ext type 3) must hold exactly one array"));
            }
            if visit(&mut inner, who, stamp, depth + 1)? {
                let mut out = Vec::with_capacity(body.len() + 32);
                rmpv::encode::write_value(&mut out, &inner).expect("encoding to memory");
                *body = out;
                changed = true;
            }
        }
        _ => {}
    }
    Ok(changed)
}

fn stamped(data: &[u8], who: &Principal, stamp: &mut Option<Vec<u8>>) -> Value {
    let head = stamp.get_or_insert_with(|| {
        let mut head = Vec::new();
        rmp::encode::write_array_len(&mut head, 3).expect("encoding to memory");
        rmp::encode::write_str(&mut head, &who.user).expect("encoding to memory");
        rmp::encode::write_bool(&mut head, who.runs_code()).expect("encoding to memory");
        head
    });
    let mut body = Vec::with_capacity(head.len() + data.len() + 5);
    body.extend_from_slice(head);
    rmp::encode::write_bin(&mut body, data).expect("encoding to memory");
    Value::Ext(EXT_STAMPED, body)
}

/// The pickle inside a stamped value's body.
fn pickle_of(body: &[u8]) -> Result<Vec<u8>, Error> {
    let bad = || Error::bad_args("a stamped pickle (ext type 6) must be [writer, trusted, pickle]");
    match rmpv::decode::read_value(&mut &body[..]).map_err(|_| bad())? {
        Value::Array(mut items) if items.len() == 3 => match items.pop() {
            Some(Value::Binary(data)) => Ok(data),
            _ => Err(bad()),
        },
        _ => Err(bad()),
    }
}

/// The pickle in `value` if a writer who may run code here wrote it (its stamp says so):
/// what the server may hand a worker to unpickle on behalf of another user.
pub(crate) fn trusted_code(value: &Value) -> Result<Vec<u8>, Error> {
    let untrusted = |why: &str| Error::new(ErrorKind::PermissionDenied, why.to_string());
    let Value::Ext(EXT_STAMPED, body) = value else {
        return Err(untrusted("not a function (a stamped pickle)"));
    };
    let bad = || Error::bad_args("a stamped pickle (ext type 6) must be [writer, trusted, pickle]");
    match rmpv::decode::read_value(&mut &body[..]).map_err(|_| bad())? {
        Value::Array(items) => match items.as_slice() {
            [_, Value::Boolean(true), Value::Binary(code)] => Ok(code.clone()),
            [writer, Value::Boolean(false), Value::Binary(_)] => Err(untrusted(&format!(
                "written by user '{}', who may not run code here",
                writer.as_str().unwrap_or("?")
            ))),
            _ => Err(bad()),
        },
        _ => Err(bad()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::acl::{Acl, Change, User};

    fn reader_only() -> Principal {
        let mut acl = Acl::default();
        acl.apply(Change::SetUser {
            name: "mallory".into(),
            user: User {
                hash: String::new(),
                roles: vec!["readwrite".into()],
            },
        });
        acl.principal("mallory").unwrap()
    }

    fn body(writer: &str, trusted: bool, data: &[u8]) -> Vec<u8> {
        let v = Value::Array(vec![writer.into(), trusted.into(), Value::Binary(data.to_vec())]);
        let mut out = Vec::new();
        rmpv::encode::write_value(&mut out, &v).unwrap();
        out
    }

    #[test]
    fn pickles_at_any_depth_are_stamped_with_their_writer() {
        let mallory = reader_only();
        let pickle = Value::Ext(EXT_PICKLE, b"PICKLE".to_vec());
        let mut tuple = Vec::new();
        rmpv::encode::write_value(&mut tuple, &Value::Array(vec![1.into(), pickle.clone()])).unwrap();
        let mut args = vec![
            "key".into(),
            Value::Map(vec![("k".into(), Value::Array(vec![pickle.clone()]))]),
            Value::Ext(3, tuple),
            // A forged stamp: stamped again as Mallory's.
            Value::Ext(EXT_STAMPED, body("admin", true, b"FORGED")),
        ];
        stamp(&mut args, &mallory).unwrap();
        let stamped = Value::Ext(EXT_STAMPED, body("mallory", false, b"PICKLE"));
        assert_eq!(
            args[1],
            Value::Map(vec![("k".into(), Value::Array(vec![stamped.clone()]))])
        );
        let Value::Ext(3, inner) = &args[2] else { panic!() };
        let inner = rmpv::decode::read_value(&mut &inner[..]).unwrap();
        assert_eq!(inner, Value::Array(vec![1.into(), stamped]));
        assert_eq!(args[3], Value::Ext(EXT_STAMPED, body("mallory", false, b"FORGED")));
        assert_eq!(args[0], Value::from("key"));

        let mut trusted = vec![pickle];
        stamp(&mut trusted, &Principal::default_user()).unwrap();
        assert_eq!(trusted[0], Value::Ext(EXT_STAMPED, body("default", true, b"PICKLE")));
    }

    #[test]
    fn tuples_nested_too_deep_or_with_trailing_bytes_are_refused() {
        let mut deep = Value::Array(vec![Value::Ext(EXT_PICKLE, b"P".to_vec())]);
        for _ in 0..20_000 {
            let mut body = Vec::new();
            rmpv::encode::write_value(&mut body, &Value::Array(vec![deep])).unwrap();
            deep = Value::Ext(EXT_TUPLE, body);
        }
        let e = stamp(&mut [deep], &reader_only()).unwrap_err();
        assert_eq!(e.kind, spindle_core::ErrorKind::BadArguments, "{}", e.message);
        let mut body = Vec::new();
        rmpv::encode::write_value(&mut body, &Value::Array(vec![1.into()])).unwrap();
        body.extend([0xc7, 1, 1, b'P']); // a raw pickle after the tuple's array
        assert!(stamp(&mut [Value::Ext(EXT_TUPLE, body)], &reader_only()).is_err());
    }

    #[test]
    fn a_malformed_stamp_is_refused() {
        for bad in [b"\xc1".to_vec(), body("x", true, b"")[..3].to_vec(), {
            let mut out = Vec::new();
            rmpv::encode::write_value(&mut out, &Value::Array(vec!["x".into(), true.into(), "str".into()])).unwrap();
            out
        }] {
            let mut args = vec![Value::Ext(EXT_STAMPED, bad)];
            assert_eq!(
                stamp(&mut args, &reader_only()).unwrap_err().kind,
                spindle_core::ErrorKind::BadArguments
            );
        }
    }
}
