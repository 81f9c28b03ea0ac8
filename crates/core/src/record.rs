//! Op-log records: the events that change persistent objects, as the partition produces
//! them and as recovery feeds them back (see `Partition::replay`). Each record is one
//! MessagePack array; the storage crate frames and checksums it.
//!
//! ```text
//! [1, "apply", conn, client, thread, req, seq, op]   a call, create or delete applied
//!     op := ["create", type, key, args, owned, persistent]
//!         | ["call", type, key, method, args]
//!         | ["delete", key]
//! [1, "expire", key, conn, req]     a parked call answered with its timeout result
//!                                   (its deadline passed, or its caller withdrew it)
//! [1, "disconnect", conn]           a connection ended (its parked calls are dropped)
//! [1, "end_session", client]        a session ended (its unnamed objects and replies go)
//! ```
//!
//! The leading `1` is the record format version. Records come from disk: decoding never
//! panics, and anything unexpected is an error naming what is wrong.

use std::sync::Arc;

use crate::partition::Op;
use crate::{Caller, ConnId, Token, Value};

/// The record format version written by [`Record::encode`].
pub const RECORD_VERSION: u64 = 1;

/// The largest record the op log holds (the storage crate's limit): a change that would
/// need more is refused before it is applied, rather than failing the log.
pub const MAX_RECORD_LEN: usize = 64 << 20;

#[derive(Clone, Debug, PartialEq)]
pub enum Record {
    Apply {
        caller: Caller,
        token: Token,
        seq: u64,
        op: Op,
    },
    Expire {
        key: String,
        token: Token,
    },
    Disconnect {
        conn: ConnId,
    },
    EndSession {
        client: String,
    },
}

/// Encode an `apply` record without taking `op` (it is applied right after).
pub fn encode_apply(caller: &Caller, token: Token, seq: u64, op: &Op) -> Vec<u8> {
    let op = match op {
        Op::Create {
            type_name,
            key,
            args,
            owned,
            persistent,
        } => Value::Array(vec![
            "create".into(),
            type_name.as_str().into(),
            key.as_str().into(),
            Value::Array(args.clone()),
            Value::Boolean(*owned),
            Value::Boolean(*persistent),
        ]),
        Op::Call {
            type_name,
            key,
            method,
            args,
        } => Value::Array(vec![
            "call".into(),
            type_name.as_str().into(),
            key.as_str().into(),
            method.as_str().into(),
            Value::Array(args.clone()),
        ]),
        Op::Delete { key } => Value::Array(vec!["delete".into(), key.as_str().into()]),
    };
    to_bytes(vec![
        "apply".into(),
        caller.conn.into(),
        (*caller.client).into(),
        caller.thread.into(),
        token.req.into(),
        seq.into(),
        op,
    ])
}

fn to_bytes(mut items: Vec<Value>) -> Vec<u8> {
    items.insert(0, RECORD_VERSION.into());
    let mut buf = Vec::new();
    // Writing to a Vec cannot fail.
    let _ = rmpv::encode::write_value(&mut buf, &Value::Array(items));
    buf
}

impl Record {
    pub fn encode(&self) -> Vec<u8> {
        match self {
            Record::Apply { caller, token, seq, op } => encode_apply(caller, *token, *seq, op),
            Record::Expire { key, token } => to_bytes(vec![
                "expire".into(),
                key.as_str().into(),
                token.conn.into(),
                token.req.into(),
            ]),
            Record::Disconnect { conn } => to_bytes(vec!["disconnect".into(), (*conn).into()]),
            Record::EndSession { client } => to_bytes(vec!["end_session".into(), client.as_str().into()]),
        }
    }

    pub fn decode(bytes: &[u8]) -> Result<Record, String> {
        let mut rest = bytes;
        let value = rmpv::decode::read_value(&mut rest).map_err(|e| format!("not MessagePack: {e}"))?;
        if !rest.is_empty() {
            return Err(format!("{} bytes after the record", rest.len()));
        }
        let Value::Array(items) = value else {
            return Err("not an array".into());
        };
        let mut f = Fields(items.into_iter());
        let version = f.uint("version")?;
        if version != RECORD_VERSION {
            return Err(format!(
                "record format version {version}, this server knows {RECORD_VERSION}"
            ));
        }
        let record = match f.string("tag")?.as_str() {
            "apply" => {
                let conn = f.uint("conn")?;
                let client: Arc<str> = Arc::from(f.string("client")?);
                let thread = f.uint("thread")?;
                let req = f.uint("req")?;
                let seq = f.uint("seq")?;
                let Value::Array(op) = f.next("op")? else {
                    return Err("op is not an array".into());
                };
                let mut o = Fields(op.into_iter());
                let op = match o.string("op")?.as_str() {
                    "create" => Op::Create {
                        type_name: o.string("type")?,
                        key: o.string("key")?,
                        args: o.array("args")?,
                        owned: o.boolean("owned")?,
                        persistent: o.boolean("persistent")?,
                    },
                    "call" => Op::Call {
                        type_name: o.string("type")?,
                        key: o.string("key")?,
                        method: o.string("method")?,
                        args: o.array("args")?,
                    },
                    "delete" => Op::Delete { key: o.string("key")? },
                    other => return Err(format!("unknown op '{other}'")),
                };
                o.end()?;
                Record::Apply {
                    caller: Caller { conn, client, thread },
                    token: Token { conn, req },
                    seq,
                    op,
                }
            }
            "expire" => Record::Expire {
                key: f.string("key")?,
                token: Token {
                    conn: f.uint("conn")?,
                    req: f.uint("req")?,
                },
            },
            "disconnect" => Record::Disconnect { conn: f.uint("conn")? },
            "end_session" => Record::EndSession {
                client: f.string("client")?,
            },
            other => return Err(format!("unknown record '{other}'")),
        };
        f.end()?;
        Ok(record)
    }
}

struct Fields(std::vec::IntoIter<Value>);

impl Fields {
    fn next(&mut self, name: &str) -> Result<Value, String> {
        self.0.next().ok_or_else(|| format!("{name} is missing"))
    }

    fn uint(&mut self, name: &str) -> Result<u64, String> {
        self.next(name)?
            .as_u64()
            .ok_or_else(|| format!("{name} is not a non-negative integer"))
    }

    fn string(&mut self, name: &str) -> Result<String, String> {
        match self.next(name)? {
            Value::String(s) => s.into_str().ok_or_else(|| format!("{name} is not UTF-8")),
            _ => Err(format!("{name} is not a string")),
        }
    }

    fn array(&mut self, name: &str) -> Result<Vec<Value>, String> {
        match self.next(name)? {
            Value::Array(items) => Ok(items),
            _ => Err(format!("{name} is not an array")),
        }
    }

    fn boolean(&mut self, name: &str) -> Result<bool, String> {
        self.next(name)?
            .as_bool()
            .ok_or_else(|| format!("{name} is not a bool"))
    }

    fn end(&mut self) -> Result<(), String> {
        match self.0.len() {
            0 => Ok(()),
            n => Err(format!("{n} unexpected items at the end")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_round_trip() {
        let caller = Caller {
            conn: 3,
            client: Arc::from("c1"),
            thread: 7,
        };
        let token = Token { conn: 3, req: 11 };
        let records = [
            Record::Apply {
                caller: caller.clone(),
                token,
                seq: 5,
                op: Op::Create {
                    type_name: "Counter".into(),
                    key: "k".into(),
                    args: vec![1.into()],
                    owned: false,
                    persistent: true,
                },
            },
            Record::Apply {
                caller: caller.clone(),
                token,
                seq: 6,
                op: Op::Call {
                    type_name: "Queue".into(),
                    key: "q".into(),
                    method: "get".into(),
                    args: vec![Value::Boolean(true), Value::Nil],
                },
            },
            Record::Apply {
                caller,
                token,
                seq: 0,
                op: Op::Delete { key: "k".into() },
            },
            Record::Expire { key: "q".into(), token },
            Record::Disconnect { conn: 3 },
            Record::EndSession { client: "c1".into() },
        ];
        for r in records {
            assert_eq!(Record::decode(&r.encode()), Ok(r));
        }
    }

    #[test]
    fn garbage_is_an_error_never_a_panic() {
        let good = Record::Disconnect { conn: 1 }.encode();
        for cut in 0..good.len() {
            assert!(Record::decode(&good[..cut]).is_err());
        }
        let mut wrong_version = good.clone();
        wrong_version[1] = 9;
        assert!(Record::decode(&wrong_version).unwrap_err().contains("version 9"));
        assert!(Record::decode(&[0xc1]).is_err());
        assert!(Record::decode(&to_bytes(vec!["nope".into()])).is_err());
        assert!(Record::decode(&to_bytes(vec!["disconnect".into(), 1.into(), 2.into()])).is_err());
    }
}
