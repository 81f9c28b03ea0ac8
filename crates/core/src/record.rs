//! Op-log records: the events that change persistent objects, as the partition produces
//! them and as recovery feeds them back (see `Partition::replay`). Each record is one
//! MessagePack array; the storage crate frames and checksums it.
//!
//! ```text
//! [1, "apply", conn, client, thread, req, seq, op]   a call, create or delete applied
//!     op := ["create", type, key, args, owned, persistent]
//!         | ["call", type, key, method, args]
//!         | ["call", type, key, method, args, [reply...]]   with the replies of the calls
//!                                   to other objects a compiled method made (nested calls)
//!         | ["delete", key]
//! [1, "expire", key, conn, req]     a parked call answered with its timeout result
//!                                   (its deadline passed, or its caller withdrew it)
//! [1, "disconnect", conn]           a connection ended (its parked calls are dropped)
//! [1, "evict", key, bytes]          the server, over --max-memory, let the cache at `key`
//!                                   free `bytes` from its least recently used entries
//! [1, "end_session", client]        a session ended (its unnamed objects and replies go)
//! [1, "user_state", key, type, version, owner, conn, req, client, seq, reply, state]
//!     a persistent user-defined object's constructor or method ran (returned or raised):
//!     its state after it, and the reply (recorded for `client`/`seq` unless nil/0)
//!     owner := client | nil           the session owning an unnamed object
//!     reply := ["ok", value] | ["err", kind, message, data]
//!     state := bin                    the pickled state (opaque to the server)
//! [1, "class", type, version, code]  a user-defined class, before its first state in this
//!                                   partition's log
//! [1, "commit", client, seq, [record...]]  a transaction's changes here, all or none: the
//!                                   records of its calls (each a bin), and the commit's
//!                                   reply `true` recorded for `client`/`seq` unless nil/0
//! [1, "commit", client, seq, [record...], reply]   the same, recording `reply` instead (a
//!                                   call whose nested calls the server ran as a transaction)
//! [1, "prepare", client, number, coordinator, [key...], [record...]]
//!                                   a cluster transaction prepared here (two-phase commit):
//!                                   the keys it holds until decided, and the records of its
//!                                   calls (each a bin), applied if it commits
//! [1, "decide", client, number, commit]   the outcome of a prepared transaction here
//! [1, "decision", client, number, commit, seq, message, [shard...]]
//!                                   the coordinator shard's decision on a transaction over
//!                                   `shard`s: its commit's reply (`true`, or a conflict with
//!                                   `message`) recorded for `client`/`seq` unless 0
//! [1, "forget", client, number]     every participant learned the decision: it goes
//! ```
//!
//! The leading `1` is the record format version. Records come from disk: decoding never
//! panics, and anything unexpected is an error naming what is wrong.

use std::sync::Arc;

use rmp::decode::{DecodeStringError, NumValueReadError, ValueReadError};
use rmp::Marker;

use crate::op::Op;
use crate::{Caller, ConnId, Error, ErrorKind, Reply, Token, Value};

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
        /// The caller holds the replies of its calls below this `seq` (0: no word on them).
        acked: u64,
        op: Op,
    },
    Expire {
        key: String,
        token: Token,
    },
    Disconnect {
        conn: ConnId,
    },
    Evict {
        key: String,
        bytes: u64,
    },
    EndSession {
        client: String,
    },
    /// A persistent user-defined object's state after its constructor or a method ran.
    UserState {
        key: String,
        type_name: String,
        version: String,
        owner: Option<String>,
        token: Token,
        /// Whose reply this is, for exactly-once retries (`None`/0: not recorded).
        client: Option<String>,
        seq: u64,
        reply: Reply,
        state: Vec<u8>,
    },
    /// A user-defined class's code, logged before the first state of its version.
    Class {
        type_name: String,
        version: String,
        code: Vec<u8>,
    },
    /// A transaction's records in this partition, replayed together or not at all.
    Commit {
        /// Whose commit this is, for exactly-once retries (`None`/0: not recorded here).
        client: Option<String>,
        seq: u64,
        records: Vec<Vec<u8>>,
        /// The reply recorded: `true` for a commit, a method's for a call the server ran
        /// as a transaction (its nested calls).
        reply: Reply,
    },
    /// A cluster transaction's validated writes in a participant shard, held until decided.
    Prepare {
        client: String,
        number: u64,
        /// The shard whose group records the decision.
        coordinator: u64,
        /// Every key it touched here: other calls on them wait for the decision.
        keys: Vec<String>,
        records: Vec<Vec<u8>>,
    },
    /// The decision on a transaction prepared here: apply its records, or drop them.
    Decide {
        client: String,
        number: u64,
        commit: bool,
    },
    /// The coordinator's decision, which participants ask for until they learn it.
    Decision {
        client: String,
        number: u64,
        commit: bool,
        /// The commit call whose reply this is (0: a presumed abort, nobody's reply).
        seq: u64,
        /// Why it aborted (empty when it commits).
        message: String,
        participants: Vec<u64>,
    },
    /// Every participant applied the decision: it is dropped.
    Forget {
        client: String,
        number: u64,
    },
}

/// The fields of a `user_state` record, borrowed (the partition encodes without copying
/// its state first).
pub struct UserStateRef<'a> {
    pub key: &'a str,
    pub type_name: &'a str,
    pub version: &'a str,
    pub owner: Option<&'a str>,
    pub token: Token,
    pub client: Option<&'a str>,
    pub seq: u64,
    pub reply: &'a Reply,
    pub state: &'a [u8],
}

/// Encode a `user_state` record.
pub fn encode_user_state(r: &UserStateRef<'_>) -> Vec<u8> {
    let mut w = Writer::record("user_state", 10, 64 + r.state.len());
    w.str(r.key).str(r.type_name).str(r.version).opt_str(r.owner);
    w.uint(r.token.conn).uint(r.token.req).opt_str(r.client).uint(r.seq);
    w.reply(r.reply).bin(r.state);
    w.0
}

/// Encode a `class` record.
pub fn encode_class(type_name: &str, version: &str, code: &[u8]) -> Vec<u8> {
    let mut w = Writer::record("class", 3, 64 + code.len());
    w.str(type_name).str(version).bin(code);
    w.0
}

/// Encode an `apply` record without taking `op` (it is applied right after). Written
/// field by field: it is the record of every logged call, on every replica.
pub fn encode_apply(caller: &Caller, token: Token, seq: u64, acked: u64, op: &Op) -> Vec<u8> {
    // Room for the strings, and 64 bytes for the markers, the numbers and small arguments.
    let strings = match op {
        Op::Create { type_name, key, .. } => type_name.len() + key.len(),
        Op::Call {
            type_name, key, method, ..
        } => type_name.len() + key.len() + method.len(),
        Op::Delete { key } => key.len(),
    };
    // `acked` is the last field, written only when the caller gave it.
    let fields = if acked == 0 { 6 } else { 7 };
    let mut w = Writer::record("apply", fields, 64 + caller.client.len() + strings);
    w.uint(caller.conn)
        .str(&caller.client)
        .uint(caller.thread)
        .uint(token.req)
        .uint(seq);
    match op {
        Op::Create {
            type_name,
            key,
            args,
            owned,
            persistent,
        } => {
            w.array(6)
                .str("create")
                .str(type_name)
                .str(key)
                .values(args)
                .bool(*owned)
                .bool(*persistent);
        }
        Op::Call {
            type_name,
            key,
            method,
            args,
            nested,
        } => {
            let nested = nested.as_deref().unwrap_or_default();
            w.array(if nested.is_empty() { 5 } else { 6 })
                .str("call")
                .str(type_name)
                .str(key)
                .str(method)
                .values(args);
            if !nested.is_empty() {
                w.array(nested.len());
                for reply in nested {
                    w.reply(reply);
                }
            }
        }
        Op::Delete { key } => {
            w.array(2).str("delete").str(key);
        }
    }
    if acked != 0 {
        w.uint(acked);
    }
    w.0
}

/// MessagePack written straight into a `Vec` (which cannot fail: the results are unused).
struct Writer(Vec<u8>);

impl Writer {
    /// A record's version and tag, the `fields` after them to follow (`capacity`: the
    /// bytes expected in all).
    fn record(tag: &str, fields: usize, capacity: usize) -> Writer {
        let mut w = Writer(Vec::with_capacity(capacity));
        w.array(fields + 2).uint(RECORD_VERSION).str(tag);
        w
    }

    fn array(&mut self, len: usize) -> &mut Self {
        let _ = rmp::encode::write_array_len(&mut self.0, len as u32);
        self
    }
    fn uint(&mut self, n: u64) -> &mut Self {
        let _ = rmp::encode::write_uint(&mut self.0, n);
        self
    }
    fn str(&mut self, s: &str) -> &mut Self {
        let _ = rmp::encode::write_str(&mut self.0, s);
        self
    }
    fn opt_str(&mut self, s: Option<&str>) -> &mut Self {
        match s {
            Some(s) => self.str(s),
            None => {
                let _ = rmp::encode::write_nil(&mut self.0);
                self
            }
        }
    }
    fn bin(&mut self, bytes: &[u8]) -> &mut Self {
        let _ = rmp::encode::write_bin(&mut self.0, bytes);
        self
    }
    fn value(&mut self, v: &Value) -> &mut Self {
        let _ = rmpv::encode::write_value(&mut self.0, v);
        self
    }
    /// `["ok", value]` or `["err", kind, message, data]`.
    fn reply(&mut self, reply: &Reply) -> &mut Self {
        match reply {
            Ok(v) => self.array(2).str("ok").value(v),
            Err(e) => self
                .array(4)
                .str("err")
                .str(e.kind.as_str())
                .str(&e.message)
                .value(&e.data),
        }
    }

    fn bool(&mut self, b: bool) -> &mut Self {
        let _ = rmp::encode::write_bool(&mut self.0, b);
        self
    }
    fn values(&mut self, values: &[Value]) -> &mut Self {
        self.array(values.len());
        for v in values {
            self.value(v);
        }
        self
    }
}

impl Record {
    pub fn encode(&self) -> Vec<u8> {
        match self {
            Record::Apply {
                caller,
                token,
                seq,
                acked,
                op,
            } => encode_apply(caller, *token, *seq, *acked, op),
            Record::Expire { key, token } => {
                let mut w = Writer::record("expire", 3, 64);
                w.str(key).uint(token.conn).uint(token.req);
                w.0
            }
            Record::Disconnect { conn } => {
                let mut w = Writer::record("disconnect", 1, 32);
                w.uint(*conn);
                w.0
            }
            Record::Evict { key, bytes } => {
                let mut w = Writer::record("evict", 2, 64);
                w.str(key).uint(*bytes);
                w.0
            }
            Record::EndSession { client } => {
                let mut w = Writer::record("end_session", 1, 64);
                w.str(client);
                w.0
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
            } => encode_user_state(&UserStateRef {
                key,
                type_name,
                version,
                owner: owner.as_deref(),
                token: *token,
                client: client.as_deref(),
                seq: *seq,
                reply,
                state,
            }),
            Record::Class {
                type_name,
                version,
                code,
            } => encode_class(type_name, version, code),
            Record::Commit {
                client,
                seq,
                records,
                reply,
            } => {
                let len: usize = records.iter().map(|r| r.len() + 5).sum();
                let committed = *reply == Ok(Value::Boolean(true));
                let mut w = Writer::record("commit", if committed { 3 } else { 4 }, 64 + len);
                w.opt_str(client.as_deref()).uint(*seq).array(records.len());
                for record in records {
                    w.bin(record);
                }
                if !committed {
                    w.reply(reply);
                }
                w.0
            }
            Record::Prepare {
                client,
                number,
                coordinator,
                keys,
                records,
            } => {
                let len: usize = records.iter().map(|r| r.len() + 5).sum::<usize>()
                    + keys.iter().map(|k| k.len() + 5).sum::<usize>();
                let mut w = Writer::record("prepare", 5, 64 + client.len() + len);
                w.str(client).uint(*number).uint(*coordinator).array(keys.len());
                for key in keys {
                    w.str(key);
                }
                w.array(records.len());
                for record in records {
                    w.bin(record);
                }
                w.0
            }
            Record::Decide { client, number, commit } => {
                let mut w = Writer::record("decide", 3, 64 + client.len());
                w.str(client).uint(*number).bool(*commit);
                w.0
            }
            Record::Decision {
                client,
                number,
                commit,
                seq,
                message,
                participants,
            } => {
                let mut w = Writer::record("decision", 6, 64 + client.len() + message.len());
                w.str(client).uint(*number).bool(*commit).uint(*seq).str(message);
                w.array(participants.len());
                for p in participants {
                    w.uint(*p);
                }
                w.0
            }
            Record::Forget { client, number } => {
                let mut w = Writer::record("forget", 2, 64 + client.len());
                w.str(client).uint(*number);
                w.0
            }
        }
    }

    pub fn decode(bytes: &[u8]) -> Result<Record, String> {
        if bytes.is_empty() {
            return Err("the record is empty".into());
        }
        let mut rest = bytes;
        let mut f = Fields::open(&mut rest, "the record")?;
        let version = f.uint("version")?;
        if version != RECORD_VERSION {
            return Err(format!(
                "record format version {version}, this server knows {RECORD_VERSION}"
            ));
        }
        let record = match f.str("tag")? {
            "apply" => {
                let conn = f.uint("conn")?;
                let client: Arc<str> = Arc::from(f.str("client")?);
                let thread = f.uint("thread")?;
                let req = f.uint("req")?;
                let seq = f.uint("seq")?;
                let mut o = f.nested("op")?;
                let op = match o.str("op")? {
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
                        nested: match o.left {
                            0 => None,
                            _ => {
                                let mut n = o.nested("nested replies")?;
                                Some((0..n.left).map(|_| n.reply("nested reply")).collect::<Result<_, _>>()?)
                            }
                        },
                    },
                    "delete" => Op::Delete { key: o.string("key")? },
                    other => return Err(format!("unknown op '{other}'")),
                };
                o.end()?;
                let acked = match f.left {
                    0 => 0,
                    _ => f.uint("acked")?,
                };
                Record::Apply {
                    caller: Caller { conn, client, thread },
                    token: Token { conn, req },
                    seq,
                    acked,
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
            "evict" => Record::Evict {
                key: f.string("key")?,
                bytes: f.uint("bytes")?,
            },
            "end_session" => Record::EndSession {
                client: f.string("client")?,
            },
            "user_state" => {
                let key = f.string("key")?;
                let type_name = f.string("type")?;
                let version = f.string("version")?;
                let owner = f.opt_string("owner")?;
                let token = Token {
                    conn: f.uint("conn")?,
                    req: f.uint("req")?,
                };
                let client = f.opt_string("client")?;
                let seq = f.uint("seq")?;
                let reply = f.reply("reply")?;
                Record::UserState {
                    key,
                    type_name,
                    version,
                    owner,
                    token,
                    client,
                    seq,
                    reply,
                    state: f.binary("state")?,
                }
            }
            "class" => Record::Class {
                type_name: f.string("type")?,
                version: f.string("version")?,
                code: f.binary("code")?,
            },
            "commit" => {
                let client = f.opt_string("client")?;
                let seq = f.uint("seq")?;
                let mut r = f.nested("records")?;
                let records = (0..r.left).map(|_| r.binary("record")).collect::<Result<_, _>>()?;
                let reply = match f.left {
                    0 => Ok(Value::Boolean(true)),
                    _ => f.reply("reply")?,
                };
                Record::Commit {
                    client,
                    seq,
                    records,
                    reply,
                }
            }
            "prepare" => {
                let client = f.string("client")?;
                let number = f.uint("number")?;
                let coordinator = f.uint("coordinator")?;
                let mut k = f.nested("keys")?;
                let keys = (0..k.left).map(|_| k.string("key")).collect::<Result<_, _>>()?;
                let mut r = f.nested("records")?;
                let records = (0..r.left).map(|_| r.binary("record")).collect::<Result<_, _>>()?;
                Record::Prepare {
                    client,
                    number,
                    coordinator,
                    keys,
                    records,
                }
            }
            "decide" => Record::Decide {
                client: f.string("client")?,
                number: f.uint("number")?,
                commit: f.boolean("commit")?,
            },
            "decision" => {
                let client = f.string("client")?;
                let number = f.uint("number")?;
                let commit = f.boolean("commit")?;
                let seq = f.uint("seq")?;
                let message = f.string("message")?;
                let mut p = f.nested("participants")?;
                let participants = (0..p.left).map(|_| p.uint("participant")).collect::<Result<_, _>>()?;
                Record::Decision {
                    client,
                    number,
                    commit,
                    seq,
                    message,
                    participants,
                }
            }
            "forget" => Record::Forget {
                client: f.string("client")?,
                number: f.uint("number")?,
            },
            other => return Err(format!("unknown record '{other}'")),
        };
        f.end()?;
        if !rest.is_empty() {
            return Err(format!("{} bytes after the record", rest.len()));
        }
        Ok(record)
    }
}

fn cut_short(name: &str) -> String {
    format!("the record is cut short at {name}")
}

/// The items of one MessagePack array, read in order straight from the record's bytes
/// (nothing is decoded that the record does not keep).
struct Fields<'r, 'a> {
    rest: &'r mut &'a [u8],
    left: u32,
}

impl<'r, 'a> Fields<'r, 'a> {
    fn open(rest: &'r mut &'a [u8], name: &str) -> Result<Self, String> {
        if rest.is_empty() {
            return Err(cut_short(name));
        }
        let left = rmp::decode::read_array_len(rest).map_err(|e| match e {
            ValueReadError::InvalidDataRead(_) => cut_short(name),
            _ => format!("{name} is not an array"),
        })?;
        Ok(Fields { rest, left })
    }

    /// The array in the next item (read it whole before reading on here).
    fn nested(&mut self, name: &str) -> Result<Fields<'_, 'a>, String> {
        self.take(name)?;
        Fields::open(self.rest, name)
    }

    fn take(&mut self, name: &str) -> Result<(), String> {
        match self.left.checked_sub(1) {
            Some(_) if self.rest.is_empty() => Err(cut_short(name)),
            Some(left) => {
                self.left = left;
                Ok(())
            }
            None => Err(format!("{name} is missing")),
        }
    }

    fn next(&mut self, name: &str) -> Result<Value, String> {
        self.take(name)?;
        rmpv::decode::read_value(self.rest).map_err(|e| match e {
            rmpv::decode::Error::InvalidMarkerRead(_) | rmpv::decode::Error::InvalidDataRead(_) => cut_short(name),
            e => format!("{name} is not MessagePack: {e}"),
        })
    }

    fn uint(&mut self, name: &str) -> Result<u64, String> {
        self.take(name)?;
        rmp::decode::read_int(self.rest).map_err(|e| match e {
            NumValueReadError::InvalidDataRead(_) => cut_short(name),
            _ => format!("{name} is not a non-negative integer"),
        })
    }

    fn str(&mut self, name: &str) -> Result<&'a str, String> {
        self.take(name)?;
        self.read_str(name)
    }

    fn read_str(&mut self, name: &str) -> Result<&'a str, String> {
        match rmp::decode::read_str_from_slice(*self.rest) {
            Ok((s, rest)) => {
                *self.rest = rest;
                Ok(s)
            }
            Err(DecodeStringError::InvalidUtf8(..)) => Err(format!("{name} is not UTF-8")),
            Err(DecodeStringError::InvalidDataRead(_) | DecodeStringError::BufferSizeTooSmall(_)) => {
                Err(cut_short(name))
            }
            Err(_) => Err(format!("{name} is not a string")),
        }
    }

    fn string(&mut self, name: &str) -> Result<String, String> {
        self.str(name).map(str::to_owned)
    }

    fn opt_string(&mut self, name: &str) -> Result<Option<String>, String> {
        self.take(name)?;
        match self.rest.first().copied().map(Marker::from_u8) {
            Some(Marker::Null) => {
                *self.rest = &self.rest[1..];
                Ok(None)
            }
            Some(Marker::FixStr(_) | Marker::Str8 | Marker::Str16 | Marker::Str32) => {
                self.read_str(name).map(|s| Some(s.to_owned()))
            }
            _ => Err(format!("{name} is neither a string nor nil")),
        }
    }

    fn binary(&mut self, name: &str) -> Result<Vec<u8>, String> {
        self.take(name)?;
        let len = rmp::decode::read_bin_len(self.rest).map_err(|e| match e {
            ValueReadError::InvalidDataRead(_) => cut_short(name),
            _ => format!("{name} is not binary"),
        })? as usize;
        if self.rest.len() < len {
            return Err(cut_short(name));
        }
        let (bytes, rest) = self.rest.split_at(len);
        *self.rest = rest;
        Ok(bytes.to_vec())
    }

    fn array(&mut self, name: &str) -> Result<Vec<Value>, String> {
        let mut items = self.nested(name)?;
        (0..items.left).map(|_| items.next(name)).collect()
    }

    /// A reply as [`Writer::reply`] writes it.
    fn reply(&mut self, name: &str) -> Result<Reply, String> {
        let mut r = self.nested(name)?;
        let reply = match r.str("reply status")? {
            "ok" => Ok(r.next("reply value")?),
            "err" => {
                let kind = r.string("error kind")?;
                let kind = ErrorKind::from_name(&kind).ok_or_else(|| format!("unknown error kind '{kind}'"))?;
                let message = r.string("error message")?;
                Err(Error::new(kind, message).with_data(r.next("error data")?))
            }
            other => return Err(format!("unknown reply status '{other}'")),
        };
        r.end()?;
        Ok(reply)
    }

    fn boolean(&mut self, name: &str) -> Result<bool, String> {
        self.take(name)?;
        rmp::decode::read_bool(self.rest).map_err(|_| format!("{name} is not a bool"))
    }

    fn end(&mut self) -> Result<(), String> {
        match self.left {
            0 => Ok(()),
            n => Err(format!("{n} unexpected items at the end")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A record built as a MessagePack value (the encoders' reference, and malformed ones).
    fn to_bytes(mut items: Vec<Value>) -> Vec<u8> {
        items.insert(0, RECORD_VERSION.into());
        let mut buf = Vec::new();
        rmpv::encode::write_value(&mut buf, &Value::Array(items)).unwrap();
        buf
    }

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
                acked: 0,
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
                acked: 4,
                op: Op::Call {
                    type_name: "Queue".into(),
                    key: "q".into(),
                    method: "get".into(),
                    args: vec![Value::Boolean(true), Value::Nil],
                    nested: None,
                },
            },
            // A compiled method's call with the replies of the calls it made.
            Record::Apply {
                caller: caller.clone(),
                token,
                seq: 7,
                acked: 0,
                op: Op::Call {
                    type_name: "wasm:bank".into(),
                    key: "alice".into(),
                    method: "transfer".into(),
                    args: vec!["bob".into(), 5.into()],
                    nested: Some(vec![Ok(Value::from(15)), Err(Error::new(ErrorKind::NotFound, "gone"))]),
                },
            },
            Record::Apply {
                caller,
                token,
                seq: 0,
                acked: 0,
                op: Op::Delete { key: "k".into() },
            },
            Record::Expire { key: "q".into(), token },
            Record::Disconnect { conn: 3 },
            Record::Evict {
                key: "c".into(),
                bytes: 1 << 40,
            },
            Record::EndSession { client: "c1".into() },
            Record::UserState {
                key: "~c1.1".into(),
                type_name: "py:m.C".into(),
                version: "v1".into(),
                owner: Some("c1".into()),
                token,
                client: Some("c1".into()),
                seq: 9,
                reply: Ok(Value::Boolean(true)),
                state: vec![0x80, 4, 0x95],
            },
            Record::UserState {
                key: "k".into(),
                type_name: "py:m.C".into(),
                version: "v1".into(),
                owner: None,
                token,
                client: None,
                seq: 0,
                reply: Err(Error::new(ErrorKind::Raised, "ValueError: no").with_data(Value::Map(vec![]))),
                state: vec![],
            },
            Record::Class {
                type_name: "py:m.C".into(),
                version: "v1".into(),
                code: vec![1, 2, 3],
            },
            Record::Commit {
                client: Some("c1".into()),
                seq: 12,
                records: vec![Record::Disconnect { conn: 3 }.encode(), vec![]],
                reply: Ok(Value::Boolean(true)),
            },
            Record::Commit {
                client: None,
                seq: 0,
                records: vec![],
                reply: Ok(Value::Boolean(true)),
            },
            // A method's nested calls: its reply is recorded, whatever it is.
            Record::Commit {
                client: Some("c1".into()),
                seq: 13,
                records: vec![vec![1]],
                reply: Err(Error::new(ErrorKind::ValueError, "no").with_data(Value::from(1))),
            },
            Record::Prepare {
                client: "c1".into(),
                number: 4,
                coordinator: 2,
                keys: vec!["a".into(), "b".into()],
                records: vec![Record::Disconnect { conn: 3 }.encode()],
            },
            Record::Decide {
                client: "c1".into(),
                number: 4,
                commit: true,
            },
            Record::Decision {
                client: "c1".into(),
                number: 4,
                commit: false,
                seq: 9,
                message: "a conflict".into(),
                participants: vec![0, 2],
            },
            Record::Forget {
                client: "c1".into(),
                number: 4,
            },
        ];
        for r in records {
            assert_eq!(Record::decode(&r.encode()), Ok(r));
        }
    }

    #[test]
    fn other_records_are_the_msgpack_of_their_fields() {
        let token = Token { conn: 4, req: 1 << 20 };
        let reply_err = Error::new(ErrorKind::Raised, "ValueError: no").with_data(Value::from(-1));
        let cases = [
            (
                Record::Expire { key: "q".into(), token },
                to_bytes(vec!["expire".into(), "q".into(), 4.into(), (1 << 20).into()]),
            ),
            (
                Record::Disconnect { conn: 70_000 },
                to_bytes(vec!["disconnect".into(), 70_000.into()]),
            ),
            (
                Record::Evict {
                    key: "c".into(),
                    bytes: 300,
                },
                to_bytes(vec!["evict".into(), "c".into(), 300.into()]),
            ),
            (
                Record::EndSession { client: "c".into() },
                to_bytes(vec!["end_session".into(), "c".into()]),
            ),
            (
                Record::Commit {
                    client: Some("c".into()),
                    seq: 3,
                    records: vec![vec![1, 2]],
                    reply: Ok(Value::Boolean(true)),
                },
                to_bytes(vec![
                    "commit".into(),
                    "c".into(),
                    3.into(),
                    Value::Array(vec![Value::Binary(vec![1, 2])]),
                ]),
            ),
            (
                Record::UserState {
                    key: "k".into(),
                    type_name: "py:m.C".into(),
                    version: "v1".into(),
                    owner: None,
                    token,
                    client: Some("c".into()),
                    seq: 3,
                    reply: Err(reply_err),
                    state: vec![7; 300],
                },
                to_bytes(vec![
                    "user_state".into(),
                    "k".into(),
                    "py:m.C".into(),
                    "v1".into(),
                    Value::Nil,
                    4.into(),
                    (1 << 20).into(),
                    "c".into(),
                    3.into(),
                    Value::Array(vec![
                        "err".into(),
                        "Raised".into(),
                        "ValueError: no".into(),
                        (-1).into(),
                    ]),
                    Value::Binary(vec![7; 300]),
                ]),
            ),
            (
                Record::Class {
                    type_name: "py:m.C".into(),
                    version: "v1".into(),
                    code: vec![1, 2, 3],
                },
                to_bytes(vec![
                    "class".into(),
                    "py:m.C".into(),
                    "v1".into(),
                    Value::Binary(vec![1, 2, 3]),
                ]),
            ),
        ];
        for (record, bytes) in cases {
            assert_eq!(record.encode(), bytes, "{record:?}");
        }
    }

    #[test]
    fn apply_records_are_the_msgpack_of_their_fields() {
        let caller = Caller {
            conn: 300,
            client: Arc::from("client-1"),
            thread: 70_000,
        };
        let token = Token {
            conn: 300,
            req: 1 << 40,
        };
        let args = vec![Value::from(-5), Value::from("x"), Value::Binary(vec![0; 300])];
        let cases = [
            (
                Op::Create {
                    type_name: "Blob".into(),
                    key: "k".into(),
                    args: args.clone(),
                    owned: true,
                    persistent: false,
                },
                Value::Array(vec![
                    "create".into(),
                    "Blob".into(),
                    "k".into(),
                    Value::Array(args.clone()),
                    true.into(),
                    false.into(),
                ]),
            ),
            (
                Op::Call {
                    type_name: "Blob".into(),
                    key: "k".into(),
                    method: "set".into(),
                    args: args.clone(),
                    nested: None,
                },
                Value::Array(vec![
                    "call".into(),
                    "Blob".into(),
                    "k".into(),
                    "set".into(),
                    Value::Array(args),
                ]),
            ),
            (
                Op::Delete { key: "k".into() },
                Value::Array(vec!["delete".into(), "k".into()]),
            ),
        ];
        for (op, expected) in cases {
            let fields = Value::Array(vec![
                RECORD_VERSION.into(),
                "apply".into(),
                300.into(),
                "client-1".into(),
                70_000.into(),
                (1u64 << 40).into(),
                9.into(),
                expected,
            ]);
            let mut bytes = Vec::new();
            rmpv::encode::write_value(&mut bytes, &fields).unwrap();
            assert_eq!(encode_apply(&caller, token, 9, 0, &op), bytes);
            // `acked`, when given, is one more field at the end.
            let Value::Array(mut fields) = fields else {
                unreachable!()
            };
            fields.push(8.into());
            let mut bytes = Vec::new();
            rmpv::encode::write_value(&mut bytes, &Value::Array(fields)).unwrap();
            assert_eq!(encode_apply(&caller, token, 9, 8, &op), bytes);
        }
    }

    #[test]
    fn garbage_is_an_error_never_a_panic() {
        let good = Record::Disconnect { conn: 1 }.encode();
        for cut in 0..good.len() {
            assert!(Record::decode(&good[..cut]).is_err());
        }
        let caller = Caller {
            conn: 1,
            client: Arc::from("client"),
            thread: 300,
        };
        let op = Op::Call {
            type_name: "Blob".into(),
            key: "k".into(),
            method: "set".into(),
            args: vec![Value::Binary(vec![1; 40])],
            nested: None,
        };
        let apply = encode_apply(&caller, Token { conn: 1, req: 70_000 }, 1 << 33, 1 << 32, &op);
        assert_eq!(Record::decode(&[]), Err("the record is empty".into()));
        for cut in 1..apply.len() {
            let why = Record::decode(&apply[..cut]).unwrap_err();
            assert!(why.contains("cut short"), "cut at {cut}: {why}");
        }
        let mut wrong_version = good.clone();
        wrong_version[1] = 9;
        assert!(Record::decode(&wrong_version).unwrap_err().contains("version 9"));
        assert!(Record::decode(&[0xc1]).is_err());
        assert!(Record::decode(&to_bytes(vec!["nope".into()])).is_err());
        assert!(Record::decode(&to_bytes(vec!["disconnect".into(), 1.into(), 2.into()])).is_err());
        let mut trailing = good.clone();
        trailing.push(0);
        assert_eq!(Record::decode(&trailing), Err("1 bytes after the record".into()));
        let apply = |conn: Value, client: Value, op: Value| {
            to_bytes(vec!["apply".into(), conn, client, 1.into(), 2.into(), 3.into(), op])
        };
        let delete = || Value::Array(vec!["delete".into(), "k".into()]);
        let mut not_utf8 = apply(1.into(), "\u{1}\u{2}".into(), delete());
        let at = not_utf8.windows(2).position(|w| w == [1, 2]).unwrap();
        not_utf8[at..at + 2].copy_from_slice(&[0xff, 0xfe]);
        assert!(Record::decode(&apply(1.into(), "c".into(), delete())).is_ok());
        for (bad, why) in [
            (
                apply((-1).into(), "c".into(), delete()),
                "conn is not a non-negative integer",
            ),
            (not_utf8, "client is not UTF-8"),
            (apply(1.into(), "c".into(), "delete".into()), "op is not an array"),
            (
                apply(1.into(), "c".into(), Value::Array(vec!["delete".into()])),
                "key is missing",
            ),
            (
                apply(
                    1.into(),
                    "c".into(),
                    Value::Array(vec!["call".into(), "T".into(), "k".into(), "m".into(), 1.into()]),
                ),
                "args is not an array",
            ),
        ] {
            assert_eq!(Record::decode(&bad), Err(why.to_string()));
        }
    }

    #[test]
    fn malformed_user_records_are_rejected() {
        let token = Token { conn: 1, req: 2 };
        let good = Record::UserState {
            key: "k".into(),
            type_name: "py:m.C".into(),
            version: "v1".into(),
            owner: None,
            token,
            client: Some("c".into()),
            seq: 3,
            reply: Ok(1.into()),
            state: vec![7; 10],
        }
        .encode();
        for cut in 0..good.len() {
            assert!(Record::decode(&good[..cut]).is_err());
        }
        let fields = |reply: Value, state: Value, owner: Value| {
            to_bytes(vec![
                "user_state".into(),
                "k".into(),
                "py:m.C".into(),
                "v1".into(),
                owner,
                1.into(),
                2.into(),
                Value::Nil,
                0.into(),
                reply,
                state,
            ])
        };
        let ok = || Value::Array(vec!["ok".into(), 1.into()]);
        let bin = || Value::Binary(vec![1]);
        assert!(Record::decode(&fields(ok(), bin(), Value::Nil)).is_ok());
        for (bad, why) in [
            (fields(ok(), "text".into(), Value::Nil), "state is not binary"),
            (fields(ok(), bin(), 5.into()), "owner is neither a string nor nil"),
            (fields("ok".into(), bin(), Value::Nil), "reply is not an array"),
            (
                fields(Value::Array(vec!["maybe".into(), 1.into()]), bin(), Value::Nil),
                "unknown reply status 'maybe'",
            ),
            (
                fields(
                    Value::Array(vec!["err".into(), "Nope".into(), "m".into(), Value::Nil]),
                    bin(),
                    Value::Nil,
                ),
                "unknown error kind 'Nope'",
            ),
            (
                fields(
                    Value::Array(vec!["err".into(), "Raised".into(), "m".into()]),
                    bin(),
                    Value::Nil,
                ),
                "error data is missing",
            ),
            (
                fields(Value::Array(vec!["ok".into(), 1.into(), 2.into()]), bin(), Value::Nil),
                "1 unexpected items at the end",
            ),
            (
                to_bytes(vec!["class".into(), "py:m.C".into(), "v1".into(), "code".into()]),
                "code is not binary",
            ),
            (
                to_bytes(vec!["class".into(), "py:m.C".into(), "v1".into()]),
                "code is missing",
            ),
        ] {
            assert_eq!(Record::decode(&bad), Err(why.to_string()));
        }
    }
}
