//! Requests: `[req_id, op, ...operands]` decoded into a typed [`Request`].

use rmpv::Value;
use spindle_core::value::type_of;

/// The protocol version this crate speaks (the `protocol` field of `hello`).
pub const PROTOCOL_VERSION: u64 = 1;

/// The newest cluster format this build reads: the format of what the nodes of a cluster
/// write for each other (Raft entries, metadata snapshots, `raft` and `snapshot` frames).
/// Format 1 is the first release's, which wrote no version; a node tells the highest it
/// reads in its `hello` reply (`cluster_format`), and writes only what every node reads.
pub const CLUSTER_FORMAT: u64 = 5;

const OPS: &str =
    "hello, create, call, delete, keep, objects, status, ping, withdraw, invoke, cancel, calls, worker, define, host, acl";

/// One request, with its operands checked and moved out of the MessagePack value.
#[derive(Clone, Debug, PartialEq)]
pub enum Request {
    Hello {
        id: u64,
        client: String,
        /// The user the connection acts as (`None`: the default user, with the server's
        /// token if it has one).
        user: Option<String>,
        /// The user's token or password, or the server's token.
        token: Option<String>,
        /// The session's secret (see [`crate::session`]): `client` is its id.
        secret: Option<String>,
    },
    Create {
        id: u64,
        seq: u64,
        thread: u64,
        type_name: String,
        key: String,
        args: Vec<Value>,
        owned: bool,
        /// Logged and recovered after a restart (optional 9th item, default `false`).
        persistent: bool,
        /// The client holds the replies of all its calls below this `seq`, which the server
        /// may forget (optional 10th item; 0, the default: no word on them).
        acked: u64,
        /// The transaction the create is part of (optional 11th item).
        txn: Option<TxnRef>,
    },
    Call {
        id: u64,
        seq: u64,
        thread: u64,
        type_name: String,
        key: String,
        method: String,
        args: Vec<Value>,
        /// As in `Create` (optional 9th item).
        acked: u64,
        /// The transaction the call is part of (optional 10th item).
        txn: Option<TxnRef>,
    },
    Delete {
        id: u64,
        seq: u64,
        key: String,
        /// The transaction the delete is part of (optional 5th item).
        txn: Option<TxnRef>,
    },
    /// Make transaction `txn` of this session visible to all, atomically, or refuse it
    /// (`TransactionConflict`) and leave nothing of it.
    Commit {
        id: u64,
        seq: u64,
        txn: u64,
        /// In a cluster, the shards its calls went to (optional 3rd item): the leader of
        /// the lowest one coordinates the commit.
        shards: Vec<u64>,
    },
    /// Drop transaction `txn` of this session: nothing it did is ever visible.
    Abort {
        id: u64,
        txn: u64,
    },
    Keep {
        id: u64,
        seq: u64,
        type_name: String,
        key: String,
        /// `None`: only detach the object from its session.
        name: Option<String>,
    },
    Objects {
        id: u64,
        prefix: String,
        /// List only persistent objects (optional 4th item, default `false`).
        persistent: bool,
        /// Unnamed objects too, and every object's size (optional 5th item, default
        /// `false`): rows `[key, type, bytes]`.
        all: bool,
    },
    Status {
        id: u64,
    },
    Ping {
        id: u64,
    },
    /// Give up on a call of this connection parked on `key`: it is answered now with its
    /// timeout result (an interrupted client, which keeps its connection and its locks).
    Withdraw {
        id: u64,
        call_id: u64,
        key: String,
    },
    /// Run a function: `payload` is opaque to the server, `options` a map (or nil) the
    /// gateway checks and forwards to the worker.
    Invoke {
        id: u64,
        runtime: String,
        payload: Vec<u8>,
        options: Value,
    },
    /// Withdraw a queued invocation sent on this connection.
    Cancel {
        id: u64,
        invoke_id: u64,
    },
    /// The server's function calls: `list` them, `kill` call `call`, or show its `logs`
    /// (`follow`: and the rest of them as they come, until it ends).
    Calls {
        id: u64,
        action: CallsAction,
    },
    /// A worker process announcing itself with the secret the gateway gave it.
    Worker {
        id: u64,
        worker: String,
        pid: Option<u64>,
        runtime: String,
    },
    /// Register the code of a user-defined type (`py:...`) under its version.
    Define {
        id: u64,
        type_name: String,
        version: String,
        code: Vec<u8>,
    },
    /// An object host process announcing itself with the secret the server gave it.
    Host {
        id: u64,
        host: String,
        pid: Option<u64>,
    },
    /// The cluster's map: its nodes, and each shard's replicas and leader.
    Cluster {
        id: u64,
    },
    /// Users and roles: `action` is `whoami`, `users`, `roles`, `set_user`, `remove_user`,
    /// `set_role` or `remove_role`; `args` a map of its operands (checked by the server).
    Acl {
        id: u64,
        action: String,
        args: Vec<(String, Value)>,
    },
    /// Add node `node` (reachable at `address`) to the cluster (sent to the leader of the
    /// metadata group; others answer `NotLeader`).
    Join {
        id: u64,
        node: u64,
        address: String,
    },
    /// Remove node `node` from the cluster: its replicas move away first.
    Leave {
        id: u64,
        node: u64,
    },
    /// Put an object that `keep` moves from a shard led by another node under `name`, in
    /// the shard of `name` (sent by the node that led the object's shard). A retry with the
    /// same `origin` is answered as the first was.
    Adopt {
        id: u64,
        type_name: String,
        name: String,
        /// The object's snapshot (the format of `spindle_core::objects::snapshot`).
        state: Value,
        /// Names this move (unique per move): a resend is recognized by it.
        origin: String,
        /// Unix time in milliseconds after which the move is off: refused.
        expires: u64,
    },
    /// A Raft snapshot on its way to a peer (one-way: never answered): the first frame
    /// carries the `MsgSnapshot` (without its data) and the data's first chunk, the frames
    /// after it on the connection the next chunks, the last without `more`.
    Snapshot {
        id: u64,
        from: u64,
        address: String,
        group: u64,
        /// The protobuf-encoded message, in the first frame only.
        message: Option<Vec<u8>>,
        chunk: Vec<u8>,
        more: bool,
    },
    /// Two-phase commit, between nodes: prepare transaction `txn` of session `client` in
    /// shard `shard` (this node leads it), its decision kept by shard `coordinator`.
    Prepare {
        id: u64,
        client: String,
        txn: u64,
        shard: u64,
        coordinator: u64,
    },
    /// Two-phase commit: apply (`commit`) or drop the transaction prepared in `shard`.
    Decide {
        id: u64,
        client: String,
        txn: u64,
        shard: u64,
        commit: bool,
    },
    /// Two-phase commit: the decision on a transaction, asked of its coordinator `shard`.
    Decision {
        id: u64,
        client: String,
        txn: u64,
        shard: u64,
    },
    /// Raft messages between the nodes of a cluster (one-way: never answered).
    Raft {
        id: u64,
        /// The sending node and its address (so the receiver can answer).
        from: u64,
        address: String,
        group: u64,
        /// Protobuf-encoded `raft::eraftpb::Message`s.
        messages: Vec<Vec<u8>>,
        /// The one message is a part of a larger one, whose next part follows on this
        /// connection (a message over the frame limit, such as a snapshot, travels in parts).
        more: bool,
    },
}

impl Request {
    pub fn id(&self) -> u64 {
        match self {
            Request::Hello { id, .. }
            | Request::Create { id, .. }
            | Request::Call { id, .. }
            | Request::Delete { id, .. }
            | Request::Commit { id, .. }
            | Request::Abort { id, .. }
            | Request::Keep { id, .. }
            | Request::Objects { id, .. }
            | Request::Status { id }
            | Request::Ping { id }
            | Request::Withdraw { id, .. }
            | Request::Invoke { id, .. }
            | Request::Cancel { id, .. }
            | Request::Calls { id, .. }
            | Request::Worker { id, .. }
            | Request::Define { id, .. }
            | Request::Host { id, .. }
            | Request::Cluster { id }
            | Request::Acl { id, .. }
            | Request::Join { id, .. }
            | Request::Leave { id, .. }
            | Request::Adopt { id, .. }
            | Request::Prepare { id, .. }
            | Request::Decide { id, .. }
            | Request::Decision { id, .. }
            | Request::Snapshot { id, .. }
            | Request::Raft { id, .. } => *id,
        }
    }

    pub fn op(&self) -> &'static str {
        match self {
            Request::Hello { .. } => "hello",
            Request::Create { .. } => "create",
            Request::Call { .. } => "call",
            Request::Delete { .. } => "delete",
            Request::Commit { .. } => "commit",
            Request::Abort { .. } => "abort",
            Request::Keep { .. } => "keep",
            Request::Objects { .. } => "objects",
            Request::Status { .. } => "status",
            Request::Ping { .. } => "ping",
            Request::Withdraw { .. } => "withdraw",
            Request::Invoke { .. } => "invoke",
            Request::Cancel { .. } => "cancel",
            Request::Calls { .. } => "calls",
            Request::Worker { .. } => "worker",
            Request::Define { .. } => "define",
            Request::Host { .. } => "host",
            Request::Cluster { .. } => "cluster",
            Request::Acl { .. } => "acl",
            Request::Join { .. } => "join",
            Request::Leave { .. } => "leave",
            Request::Adopt { .. } => "adopt",
            Request::Prepare { .. } => "prepare",
            Request::Decide { .. } => "decide",
            Request::Decision { .. } => "decision",
            Request::Snapshot { .. } => "snapshot",
            Request::Raft { .. } => "raft",
        }
    }
}

/// A call's transaction: its number in the session, and its age (the time its first
/// attempt began, in microseconds since the Unix epoch), which decides between two
/// transactions that want the same object: the older goes on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TxnRef {
    pub number: u64,
    pub age: u64,
    /// The transaction's first call: a later one of a transaction the server does not know
    /// (it restarted, or aborted it) must not open it again without its earlier calls.
    pub first: bool,
}

/// What a `calls` request asks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CallsAction {
    List,
    Kill { call: u64 },
    Logs { call: u64, follow: bool },
}

/// A malformed request: answered with a `ProtocolError` under `id` (0 when no id could be read).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct RequestError {
    pub id: u64,
    pub message: String,
}

/// Decode a frame body and parse it as a request.
pub fn decode_request(body: &[u8]) -> Result<Request, RequestError> {
    match decode_call(body) {
        Some(call) => Ok(call),
        None => decode_any(body),
    }
}

/// The request nearly every frame holds, `[id, "call", seq, thread, type, key, method,
/// args, acked?]`, read straight from the bytes: no `Value` for its envelope, its op or its
/// strings. `None` for anything else, malformed calls included: the general path reads
/// those, and words their errors.
fn decode_call(body: &[u8]) -> Option<Request> {
    let mut rd = body;
    let len = rmp::decode::read_array_len(&mut rd).ok()?;
    if len != 8 && len != 9 {
        return None;
    }
    let id = rmp::decode::read_int(&mut rd).ok()?;
    if read_str(&mut rd)? != "call" {
        return None;
    }
    let seq = rmp::decode::read_int(&mut rd).ok()?;
    let thread = rmp::decode::read_int(&mut rd).ok()?;
    let type_name = read_str(&mut rd)?.to_owned();
    let key = read_str(&mut rd)?.to_owned();
    let method = read_str(&mut rd)?.to_owned();
    let n = rmp::decode::read_array_len(&mut rd).ok()? as usize;
    // (An item takes a byte at least: a count past the bytes left is not allocated for.)
    let mut args = Vec::with_capacity(n.min(rd.len()));
    for _ in 0..n {
        // As deep as the general path lets an item of the request's args array go.
        args.push(rmpv::decode::read_value_with_max_depth(&mut rd, rmpv::decode::MAX_DEPTH - 2).ok()?);
    }
    let acked = match len {
        9 => rmp::decode::read_int(&mut rd).ok()?,
        _ => 0,
    };
    rd.is_empty().then_some(Request::Call {
        id,
        seq,
        thread,
        type_name,
        key,
        method,
        args,
        acked,
        txn: None,
    })
}

/// A MessagePack str, borrowed from the bytes (`None` if it is not one, or not UTF-8).
fn read_str<'a>(rd: &mut &'a [u8]) -> Option<&'a str> {
    let len = rmp::decode::read_str_len(rd).ok()? as usize;
    if rd.len() < len {
        return None;
    }
    let (s, rest) = rd.split_at(len);
    *rd = rest;
    std::str::from_utf8(s).ok()
}

/// Any request: its MessagePack value decoded, then parsed.
fn decode_any(body: &[u8]) -> Result<Request, RequestError> {
    let mut rest = body;
    let value = read_request_value(&mut rest).map_err(|e| RequestError {
        id: 0,
        message: format!("frame body is not valid MessagePack: {e}"),
    })?;
    if !rest.is_empty() {
        return Err(RequestError {
            id: peek_id(&value),
            message: format!(
                "frame body holds {} bytes after the request; a frame carries exactly one MessagePack value",
                rest.len()
            ),
        });
    }
    parse_request(value)
}

/// A frame body's value. A request's array is read into a vector sized for its items, then
/// its items one by one (rmpv grows every array a push at a time).
fn read_request_value(rest: &mut &[u8]) -> Result<Value, rmpv::decode::Error> {
    if !matches!(rest.first(), Some(0x90..=0x9f | 0xdc | 0xdd)) {
        return rmpv::decode::read_value(rest);
    }
    let len = rmp::decode::read_array_len(rest)? as usize;
    // A request has a dozen items at most; a longer array grows as it is read (its count
    // is the sender's word: a frame of bytes could claim millions).
    let mut items = Vec::with_capacity(len.min(16));
    for _ in 0..len {
        items.push(rmpv::decode::read_value(rest)?);
    }
    Ok(Value::Array(items))
}

/// The id of the request in frame `body`, read without decoding the rest (0 if none).
pub fn request_id(body: &[u8]) -> u64 {
    let mut rd = body;
    match rmp::decode::read_array_len(&mut rd) {
        Ok(len) if len > 0 => rmp::decode::read_int(&mut rd).unwrap_or(0),
        _ => 0,
    }
}

fn peek_id(value: &Value) -> u64 {
    match value {
        Value::Array(items) => items.first().and_then(Value::as_u64).unwrap_or(0),
        _ => 0,
    }
}

/// Parse a decoded MessagePack value as a request.
pub fn parse_request(value: Value) -> Result<Request, RequestError> {
    let items = match value {
        Value::Array(items) => items,
        other => {
            return Err(RequestError {
                id: 0,
                message: format!("a request must be an array [id, op, ...], not {}", type_of(&other)),
            })
        }
    };
    let id = match items.first() {
        Some(Value::Integer(n)) if n.as_u64().is_some() => n.as_u64().unwrap_or(0),
        Some(other) => {
            return Err(RequestError {
                id: 0,
                message: format!("the request id must be an unsigned integer, not {}", describe(other)),
            })
        }
        None => {
            return Err(RequestError {
                id: 0,
                message: "a request must be an array [id, op, ...], not an empty array".into(),
            })
        }
    };
    let mut items = items.into_iter().skip(1);
    let op = match items.next() {
        Some(Value::String(s)) => match s.into_str() {
            Some(op) => op,
            None => return Err(bad(id, "the op name is not valid UTF-8")),
        },
        Some(other) => return Err(bad(id, format!("the op must be a string, not {}", describe(&other)))),
        None => return Err(bad(id, "a request must be an array [id, op, ...]; the op is missing")),
    };
    let operands: Vec<Value> = items.collect();
    let mut p = Operands {
        id,
        op: op.as_str(),
        items: operands.into_iter(),
    };
    let request = match op.as_str() {
        "hello" => {
            p.arity("[id, \"hello\", {\"client\": str, \"protocol\": 1}]", 1)?;
            let (client, user, token, secret) = p.hello()?;
            Request::Hello {
                id,
                client,
                user,
                token,
                secret,
            }
        }
        "create" => {
            p.arity_range(
                "[id, \"create\", seq, thread, type, key, args, owned, persistent, acked, txn]",
                6,
                9,
            )?;
            Request::Create {
                id,
                seq: p.uint("seq")?,
                thread: p.uint("thread")?,
                type_name: p.string("type")?,
                key: p.string("key")?,
                args: p.array("args")?,
                owned: p.boolean("owned")?,
                persistent: p.optional_boolean("persistent")?,
                acked: p.optional_uint("acked")?,
                txn: p.txn()?,
            }
        }
        "call" => {
            p.arity_range("[id, \"call\", seq, thread, type, key, method, args, acked, txn]", 6, 8)?;
            Request::Call {
                id,
                seq: p.uint("seq")?,
                thread: p.uint("thread")?,
                type_name: p.string("type")?,
                key: p.string("key")?,
                method: p.string("method")?,
                args: p.array("args")?,
                acked: p.optional_uint("acked")?,
                txn: p.txn()?,
            }
        }
        "delete" => {
            p.arity_range("[id, \"delete\", seq, key, txn]", 2, 3)?;
            Request::Delete {
                id,
                seq: p.uint("seq")?,
                key: p.string("key")?,
                txn: p.txn()?,
            }
        }
        "commit" => {
            p.arity_range("[id, \"commit\", seq, txn, shards]", 2, 3)?;
            let (seq, txn) = (p.uint("seq")?, p.uint("txn")?);
            let shards = match p.next() {
                Value::Nil => Vec::new(),
                Value::Array(items) => items
                    .iter()
                    .map(Value::as_u64)
                    .collect::<Option<Vec<u64>>>()
                    .ok_or_else(|| bad(id, "'commit': shards must be an array of shard numbers".to_string()))?,
                other => return Err(p.error("shards", "an array of shard numbers", &other)),
            };
            Request::Commit { id, seq, txn, shards }
        }
        "prepare" => {
            p.arity("[id, \"prepare\", client, txn, shard, coordinator]", 4)?;
            Request::Prepare {
                id,
                client: p.string("client")?,
                txn: p.uint("txn")?,
                shard: p.uint("shard")?,
                coordinator: p.uint("coordinator")?,
            }
        }
        "decide" => {
            p.arity("[id, \"decide\", client, txn, shard, commit]", 4)?;
            Request::Decide {
                id,
                client: p.string("client")?,
                txn: p.uint("txn")?,
                shard: p.uint("shard")?,
                commit: p.boolean("commit")?,
            }
        }
        "decision" => {
            p.arity("[id, \"decision\", client, txn, shard]", 3)?;
            Request::Decision {
                id,
                client: p.string("client")?,
                txn: p.uint("txn")?,
                shard: p.uint("shard")?,
            }
        }
        "abort" => {
            p.arity("[id, \"abort\", txn]", 1)?;
            Request::Abort {
                id,
                txn: p.uint("txn")?,
            }
        }
        "keep" => {
            p.arity("[id, \"keep\", seq, type, key, name]", 4)?;
            Request::Keep {
                id,
                seq: p.uint("seq")?,
                type_name: p.string("type")?,
                key: p.string("key")?,
                name: p.optional_string("name")?,
            }
        }
        "objects" => {
            // The prefix may be left out or nil: list everything.
            p.arity_range("[id, \"objects\", prefix, persistent, all]", 0, 3)?;
            Request::Objects {
                id,
                prefix: p.optional_string("prefix")?.unwrap_or_default(),
                persistent: p.optional_boolean("persistent")?,
                all: p.optional_boolean("all")?,
            }
        }
        "status" => {
            p.arity("[id, \"status\"]", 0)?;
            Request::Status { id }
        }
        "ping" => {
            p.arity("[id, \"ping\"]", 0)?;
            Request::Ping { id }
        }
        "cluster" => {
            p.arity("[id, \"cluster\"]", 0)?;
            Request::Cluster { id }
        }
        "acl" => {
            p.arity_range("[id, \"acl\", action, {operands}]", 1, 2)?;
            let action = p.string("action")?;
            let args = match p.next() {
                Value::Nil => Vec::new(),
                Value::Map(entries) => {
                    let mut args = Vec::with_capacity(entries.len());
                    for (k, v) in entries {
                        match k {
                            Value::String(k) if k.as_str().is_some() => {
                                args.push((k.into_str().unwrap_or_default(), v))
                            }
                            other => return Err(p.error("an operand's name", "a str", &other)),
                        }
                    }
                    args
                }
                other => return Err(p.error("the operands", "a map", &other)),
            };
            Request::Acl { id, action, args }
        }
        "join" => {
            p.arity("[id, \"join\", node, address]", 2)?;
            Request::Join {
                id,
                node: p.uint("node")?,
                address: p.string("address")?,
            }
        }
        "leave" => {
            p.arity("[id, \"leave\", node]", 1)?;
            Request::Leave {
                id,
                node: p.uint("node")?,
            }
        }
        "adopt" => {
            p.arity("[id, \"adopt\", type, name, state, origin, expires]", 5)?;
            Request::Adopt {
                id,
                type_name: p.string("type")?,
                name: p.string("name")?,
                state: p.next(),
                origin: p.string("origin")?,
                expires: p.uint("expires")?,
            }
        }
        "snapshot" => {
            p.arity_range(
                "[id, \"snapshot\", from, address, shard, message, chunk, more, format?]",
                6,
                7,
            )?;
            let (from, address, group) = (p.uint("from")?, p.string("address")?, p.uint("shard")?);
            let message = match p.next() {
                Value::Nil => None,
                Value::Binary(b) => Some(b),
                other => return Err(p.error("message", "bin or nil", &other)),
            };
            let snapshot = Request::Snapshot {
                id,
                from,
                address,
                group,
                message,
                chunk: p.binary("chunk")?,
                more: p.boolean("more")?,
            };
            p.cluster_format()?;
            snapshot
        }
        "raft" => {
            p.arity_range(
                "[id, \"raft\", from, address, shard, [message, ...], more?, format?]",
                4,
                6,
            )?;
            let (from, address, group) = (p.uint("from")?, p.string("address")?, p.uint("shard")?);
            let mut messages = Vec::new();
            for m in p.array("messages")? {
                match m {
                    Value::Binary(b) => messages.push(b),
                    other => {
                        return Err(bad(
                            id,
                            format!("raft messages must be binary, not {}", describe(&other)),
                        ))
                    }
                }
            }
            let more = p.optional_boolean("more")?;
            if more && messages.len() != 1 {
                return Err(bad(id, "a raft part carries exactly one message".to_string()));
            }
            p.cluster_format()?;
            Request::Raft {
                id,
                from,
                address,
                group,
                messages,
                more,
            }
        }
        "withdraw" => {
            p.arity("[id, \"withdraw\", call_id, key]", 2)?;
            Request::Withdraw {
                id,
                call_id: p.uint("call_id")?,
                key: p.string("key")?,
            }
        }
        "invoke" => {
            p.arity("[id, \"invoke\", runtime, payload, options]", 3)?;
            Request::Invoke {
                id,
                runtime: p.string("runtime")?,
                payload: p.binary("payload")?,
                options: p.map_or_nil("options")?,
            }
        }
        "calls" => {
            p.arity_range("[id, \"calls\", \"list\"|\"kill\"|\"logs\", call, follow]", 1, 3)?;
            let action = match p.string("action")?.as_str() {
                "list" => CallsAction::List,
                "kill" => CallsAction::Kill { call: p.uint("call")? },
                "logs" => CallsAction::Logs {
                    call: p.uint("call")?,
                    follow: p.optional_boolean("follow")?,
                },
                other => {
                    return Err(bad(
                        id,
                        format!("unknown calls action '{other}' (known: list, kill, logs)"),
                    ))
                }
            };
            Request::Calls { id, action }
        }
        "cancel" => {
            p.arity("[id, \"cancel\", invoke_id]", 1)?;
            Request::Cancel {
                id,
                invoke_id: p.uint("invoke_id")?,
            }
        }
        "worker" => {
            p.arity("[id, \"worker\", {\"id\": str, \"pid\": int, \"runtime\": str}]", 1)?;
            p.worker()?
        }
        "define" => {
            p.arity("[id, \"define\", type, version, code]", 3)?;
            Request::Define {
                id,
                type_name: p.string("type")?,
                version: p.string("version")?,
                code: p.binary("code")?,
            }
        }
        "host" => {
            p.arity("[id, \"host\", {\"id\": str, \"pid\": int}]", 1)?;
            p.host()?
        }
        other => return Err(bad(id, format!("unknown op '{other}' (known: {OPS})"))),
    };
    Ok(request)
}

fn bad(id: u64, message: impl Into<String>) -> RequestError {
    RequestError {
        id,
        message: message.into(),
    }
}

/// A value's type for messages, with the value itself when it is short and telling.
fn describe(v: &Value) -> String {
    match v {
        Value::Integer(n) => format!("the integer {n}"),
        Value::String(s) => match s.as_str() {
            Some(s) if s.len() <= 40 => format!("the str '{s}'"),
            _ => "a str".into(),
        },
        other => type_of(other).to_string(),
    }
}

/// The operands after `[id, op`, consumed in order.
struct Operands<'a> {
    id: u64,
    op: &'a str,
    items: std::vec::IntoIter<Value>,
}

impl Operands<'_> {
    fn arity(&self, shape: &str, n: usize) -> Result<(), RequestError> {
        self.arity_range(shape, n, n)
    }

    fn arity_range(&self, shape: &str, min: usize, max: usize) -> Result<(), RequestError> {
        let got = self.items.len();
        if got < min || got > max {
            let takes = match min == max {
                true => format!("{}", max + 2),
                false => format!("{} to {}", min + 2, max + 2),
            };
            return Err(bad(
                self.id,
                format!("'{}' takes {takes} items {shape}, got {}", self.op, got + 2),
            ));
        }
        Ok(())
    }

    fn next(&mut self) -> Value {
        self.items.next().unwrap_or(Value::Nil)
    }

    fn error(&self, field: &str, want: &str, got: &Value) -> RequestError {
        bad(
            self.id,
            format!("'{}': {field} must be {want}, not {}", self.op, describe(got)),
        )
    }

    fn uint(&mut self, field: &str) -> Result<u64, RequestError> {
        match self.next() {
            Value::Integer(n) if n.as_u64().is_some() => Ok(n.as_u64().unwrap_or(0)),
            other => Err(self.error(field, "a non-negative integer", &other)),
        }
    }

    /// A non-negative integer, or 0 when nil or left out.
    fn optional_uint(&mut self, field: &str) -> Result<u64, RequestError> {
        match self.next() {
            Value::Nil => Ok(0),
            Value::Integer(n) if n.as_u64().is_some() => Ok(n.as_u64().unwrap_or(0)),
            other => Err(self.error(field, "a non-negative integer or nil", &other)),
        }
    }

    fn string(&mut self, field: &str) -> Result<String, RequestError> {
        match self.next() {
            Value::String(s) => s
                .into_str()
                .ok_or_else(|| bad(self.id, format!("'{}': {field} is not valid UTF-8", self.op))),
            other => Err(self.error(field, "a str", &other)),
        }
    }

    fn optional_string(&mut self, field: &str) -> Result<Option<String>, RequestError> {
        match self.next() {
            Value::Nil => Ok(None),
            Value::String(s) => s
                .into_str()
                .map(Some)
                .ok_or_else(|| bad(self.id, format!("'{}': {field} is not valid UTF-8", self.op))),
            other => Err(self.error(field, "a str or nil", &other)),
        }
    }

    fn array(&mut self, field: &str) -> Result<Vec<Value>, RequestError> {
        match self.next() {
            Value::Array(items) => Ok(items),
            other => Err(self.error(field, "an array", &other)),
        }
    }

    fn boolean(&mut self, field: &str) -> Result<bool, RequestError> {
        match self.next() {
            Value::Boolean(b) => Ok(b),
            other => Err(self.error(field, "a bool", &other)),
        }
    }

    /// A call's transaction, `[number, age, first]`, or nil (left out): not in one.
    fn txn(&mut self) -> Result<Option<TxnRef>, RequestError> {
        let shape = "[number, age, first] (non-negative integers and a bool) or nil";
        match self.next() {
            Value::Nil => Ok(None),
            Value::Array(items) => match items.as_slice() {
                [Value::Integer(number), Value::Integer(age), Value::Boolean(first)] => {
                    match (number.as_u64(), age.as_u64()) {
                        (Some(number), Some(age)) => Ok(Some(TxnRef {
                            number,
                            age,
                            first: *first,
                        })),
                        _ => Err(bad(self.id, format!("'{}': txn must be {shape}", self.op))),
                    }
                }
                _ => Err(bad(self.id, format!("'{}': txn must be {shape}", self.op))),
            },
            other => Err(self.error("txn", shape, &other)),
        }
    }

    /// A peer frame's optional last item, the cluster format of what it carries (absent:
    /// format 1, whose nodes wrote none): one newer than this build reads is refused.
    fn cluster_format(&mut self) -> Result<u64, RequestError> {
        let format = self.optional_uint("format")?.max(1);
        if format > CLUSTER_FORMAT {
            return Err(bad(
                self.id,
                format!(
                    "'{}' in cluster format {format}; this node reads cluster formats 1 to {CLUSTER_FORMAT} \
                     (upgrade it before the nodes that write {format})",
                    self.op
                ),
            ));
        }
        Ok(format)
    }

    /// A bool that may be left out or nil (`false`).
    fn optional_boolean(&mut self, field: &str) -> Result<bool, RequestError> {
        match self.next() {
            Value::Nil => Ok(false),
            Value::Boolean(b) => Ok(b),
            other => Err(self.error(field, "a bool or nil", &other)),
        }
    }

    fn binary(&mut self, field: &str) -> Result<Vec<u8>, RequestError> {
        match self.next() {
            Value::Binary(bytes) => Ok(bytes),
            other => Err(self.error(field, "bin", &other)),
        }
    }

    /// A map, or nil for an empty one.
    fn map_or_nil(&mut self, field: &str) -> Result<Value, RequestError> {
        match self.next() {
            Value::Nil => Ok(Value::Map(Vec::new())),
            map @ Value::Map(_) => Ok(map),
            other => Err(self.error(field, "a map or nil", &other)),
        }
    }

    /// The `worker` map: `{"id": str, "pid": int, "runtime": str}`.
    fn worker(&mut self) -> Result<Request, RequestError> {
        let entries = match self.next() {
            Value::Map(entries) => entries,
            other => {
                return Err(self.error(
                    "the operand",
                    "a map {\"id\": str, \"pid\": int, \"runtime\": str}",
                    &other,
                ))
            }
        };
        let (mut worker, mut pid, mut runtime) = (None, None, None);
        for (k, v) in entries {
            match (k.as_str(), v) {
                (Some("id"), Value::String(s)) => worker = s.into_str(),
                (Some("pid"), Value::Integer(n)) => pid = n.as_u64(),
                (Some("runtime"), Value::String(s)) => runtime = s.into_str(),
                (Some(field @ ("id" | "runtime")), other) => return Err(self.error(field, "a str", &other)),
                _ => {}
            }
        }
        Ok(Request::Worker {
            id: self.id,
            worker: worker.ok_or_else(|| bad(self.id, "'worker': the map has no \"id\" str"))?,
            pid,
            runtime: runtime.unwrap_or_else(|| "python".into()),
        })
    }

    /// The `host` map: `{"id": str, "pid": int}`.
    fn host(&mut self) -> Result<Request, RequestError> {
        let entries = match self.next() {
            Value::Map(entries) => entries,
            other => return Err(self.error("the operand", "a map {\"id\": str, \"pid\": int}", &other)),
        };
        let (mut host, mut pid) = (None, None);
        for (k, v) in entries {
            match (k.as_str(), v) {
                (Some("id"), Value::String(s)) => host = s.into_str(),
                (Some("id"), other) => return Err(self.error("id", "a str", &other)),
                (Some("pid"), Value::Integer(n)) => pid = n.as_u64(),
                _ => {}
            }
        }
        Ok(Request::Host {
            id: self.id,
            host: host.ok_or_else(|| bad(self.id, "'host': the map has no \"id\" str"))?,
            pid,
        })
    }

    /// The `hello` map: `{"client": str, "protocol": 1, "token": str, "secret": str}`.
    #[allow(clippy::type_complexity)]
    /// The fields of `hello`: client, user, token, secret.
    #[allow(clippy::type_complexity)]
    fn hello(&mut self) -> Result<(String, Option<String>, Option<String>, Option<String>), RequestError> {
        let entries = match self.next() {
            Value::Map(entries) => entries,
            other => return Err(self.error("the operand", "a map {\"client\": str, \"protocol\": 1}", &other)),
        };
        let mut client = None;
        let mut protocol = None;
        let mut user = None;
        let mut token = None;
        let mut secret = None;
        for (k, v) in entries {
            match k.as_str() {
                Some("client") => client = Some(v),
                Some("protocol") => protocol = Some(v),
                Some("token") => match v {
                    Value::Nil => {}
                    Value::String(s) => token = s.into_str(),
                    other => return Err(self.error("token", "a str or nil", &other)),
                },
                Some("user") => match v {
                    Value::Nil => {}
                    Value::String(s) => user = s.into_str(),
                    other => return Err(self.error("user", "a str or nil", &other)),
                },
                Some("secret") => match v {
                    Value::Nil => {}
                    Value::String(s) => secret = s.into_str(),
                    other => return Err(self.error("secret", "a str or nil", &other)),
                },
                // Unknown fields are ignored so newer clients can send more.
                _ => {}
            }
        }
        match protocol {
            Some(Value::Integer(n)) if n.as_u64() == Some(PROTOCOL_VERSION) => {}
            Some(Value::Integer(n)) => {
                return Err(bad(
                    self.id,
                    format!("unsupported protocol version {n} (this server speaks {PROTOCOL_VERSION})"),
                ))
            }
            Some(other) => return Err(self.error("protocol", "an integer", &other)),
            None => return Err(bad(self.id, "'hello': the map has no \"protocol\" field")),
        }
        match client {
            Some(Value::String(s)) => match s.into_str() {
                Some(c) if !c.is_empty() => Ok((c, user, token, secret)),
                Some(_) => Err(bad(self.id, "'hello': client must be a non-empty str")),
                None => Err(bad(self.id, "'hello': client is not valid UTF-8")),
            },
            Some(other) => Err(self.error("client", "a str", &other)),
            None => Err(bad(self.id, "'hello': the map has no \"client\" field")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v(items: Vec<Value>) -> Value {
        Value::Array(items)
    }

    fn s(x: &str) -> Value {
        Value::from(x)
    }

    fn hello_map(client: Value, protocol: Value) -> Value {
        Value::Map(vec![(s("client"), client), (s("protocol"), protocol)])
    }

    fn error_of(value: Value) -> RequestError {
        parse_request(value).expect_err("should be refused")
    }

    #[test]
    fn parses_every_op() {
        let hello = v(vec![1.into(), s("hello"), hello_map(s("c1"), 1.into())]);
        assert_eq!(
            parse_request(hello).unwrap(),
            Request::Hello {
                id: 1,
                client: "c1".into(),
                user: None,
                token: None,
                secret: None,
            }
        );
        let with_token = Value::Map(vec![
            (s("client"), s("c1")),
            (s("protocol"), 1.into()),
            (s("token"), s("t")),
            (s("user"), s("alice")),
            (s("secret"), s("0123456789abcdef")),
        ]);
        assert_eq!(
            parse_request(v(vec![1.into(), s("hello"), with_token])).unwrap(),
            Request::Hello {
                id: 1,
                client: "c1".into(),
                user: Some("alice".into()),
                token: Some("t".into()),
                secret: Some("0123456789abcdef".into()),
            }
        );
        let invoke = v(vec![
            10.into(),
            s("invoke"),
            s("python"),
            Value::Binary(vec![1, 2]),
            Value::Nil,
        ]);
        assert_eq!(
            parse_request(invoke).unwrap(),
            Request::Invoke {
                id: 10,
                runtime: "python".into(),
                payload: vec![1, 2],
                options: Value::Map(vec![])
            }
        );
        assert_eq!(
            parse_request(v(vec![11.into(), s("cancel"), 10.into()])).unwrap(),
            Request::Cancel { id: 11, invoke_id: 10 }
        );
        let worker = Value::Map(vec![
            (s("id"), s("w-1")),
            (s("pid"), 42.into()),
            (s("runtime"), s("python")),
        ]);
        assert_eq!(
            parse_request(v(vec![12.into(), s("worker"), worker])).unwrap(),
            Request::Worker {
                id: 12,
                worker: "w-1".into(),
                pid: Some(42),
                runtime: "python".into()
            }
        );
        let define = v(vec![
            13.into(),
            s("define"),
            s("py:m.C"),
            s("ab12"),
            Value::Binary(vec![9]),
        ]);
        assert_eq!(
            parse_request(define).unwrap(),
            Request::Define {
                id: 13,
                type_name: "py:m.C".into(),
                version: "ab12".into(),
                code: vec![9]
            }
        );
        let host = Value::Map(vec![(s("id"), s("3-ff")), (s("pid"), 77.into())]);
        assert_eq!(
            parse_request(v(vec![14.into(), s("host"), host])).unwrap(),
            Request::Host {
                id: 14,
                host: "3-ff".into(),
                pid: Some(77)
            }
        );
        let create = v(vec![
            2.into(),
            s("create"),
            5.into(),
            0.into(),
            s("Counter"),
            s("k"),
            v(vec![3.into()]),
            true.into(),
        ]);
        assert_eq!(
            parse_request(create).unwrap(),
            Request::Create {
                id: 2,
                seq: 5,
                thread: 0,
                type_name: "Counter".into(),
                key: "k".into(),
                args: vec![3.into()],
                owned: true,
                persistent: false,
                acked: 0,
                txn: None
            }
        );
        let persistent = v(vec![
            2.into(),
            s("create"),
            5.into(),
            0.into(),
            s("Counter"),
            s("k"),
            v(vec![]),
            false.into(),
            true.into(),
        ]);
        assert!(matches!(
            parse_request(persistent).unwrap(),
            Request::Create {
                persistent: true,
                acked: 0,
                ..
            }
        ));
        // `acked` after `persistent` (nil: left out).
        for (persistent, acked) in [(Value::Nil, 4), (true.into(), 0)] {
            let mut items = vec![2.into(), s("create"), 5.into(), 0.into(), s("Counter"), s("k")];
            items.extend([v(vec![]), false.into(), persistent, Value::from(acked)]);
            assert!(matches!(
                parse_request(v(items)).unwrap(),
                Request::Create { acked: a, .. } if a == acked
            ));
        }
        let call = v(vec![
            3.into(),
            s("call"),
            6.into(),
            9.into(),
            s("Counter"),
            s("k"),
            s("add"),
            v(vec![1.into()]),
        ]);
        assert_eq!(
            parse_request(call).unwrap(),
            Request::Call {
                id: 3,
                seq: 6,
                thread: 9,
                type_name: "Counter".into(),
                key: "k".into(),
                method: "add".into(),
                args: vec![1.into()],
                acked: 0,
                txn: None
            }
        );
        let delete = v(vec![4.into(), s("delete"), 7.into(), s("k")]);
        assert_eq!(
            parse_request(delete).unwrap(),
            Request::Delete {
                id: 4,
                seq: 7,
                key: "k".into(),
                txn: None
            }
        );
        // A transaction's call, commit and abort.
        let in_txn = v(vec![
            3.into(),
            s("call"),
            6.into(),
            9.into(),
            s("Counter"),
            s("k"),
            s("add"),
            v(vec![1.into()]),
            0.into(),
            v(vec![2.into(), 1_700_000_000_000_000u64.into(), true.into()]),
        ]);
        let mut body = Vec::new();
        rmpv::encode::write_value(&mut body, &in_txn).unwrap();
        assert!(matches!(
            decode_request(&body).unwrap(),
            Request::Call {
                txn: Some(TxnRef {
                    number: 2,
                    age: 1_700_000_000_000_000,
                    first: true
                }),
                ..
            }
        ));
        let commit = v(vec![5.into(), s("commit"), 8.into(), 2.into()]);
        assert_eq!(
            parse_request(commit).unwrap(),
            Request::Commit {
                id: 5,
                seq: 8,
                txn: 2,
                shards: vec![]
            }
        );
        let over_shards = v(vec![
            5.into(),
            s("commit"),
            8.into(),
            2.into(),
            v(vec![1.into(), 3.into()]),
        ]);
        assert_eq!(
            parse_request(over_shards).unwrap(),
            Request::Commit {
                id: 5,
                seq: 8,
                txn: 2,
                shards: vec![1, 3]
            }
        );
        let prepare = v(vec![6.into(), s("prepare"), s("#c"), 2.into(), 3.into(), 1.into()]);
        assert_eq!(
            parse_request(prepare).unwrap(),
            Request::Prepare {
                id: 6,
                client: "#c".into(),
                txn: 2,
                shard: 3,
                coordinator: 1
            }
        );
        let abort = v(vec![6.into(), s("abort"), 2.into()]);
        assert_eq!(parse_request(abort).unwrap(), Request::Abort { id: 6, txn: 2 });
        for bad_txn in [
            s("x"),
            v(vec![1.into(), 2.into()]),
            v(vec![(-1).into(), 2.into(), true.into()]),
            v(vec![1.into(), 2.into(), 0.into()]),
        ] {
            let mut items = vec![3.into(), s("call"), 6.into(), 9.into(), s("Counter"), s("k"), s("add")];
            items.extend([v(vec![]), 0.into(), bad_txn]);
            let err = parse_request(v(items)).unwrap_err();
            assert!(err.message.contains("txn must be"), "{}", err.message);
        }
        let keep = v(vec![5.into(), s("keep"), 8.into(), s("Counter"), s("~c.1"), Value::Nil]);
        assert_eq!(
            parse_request(keep).unwrap(),
            Request::Keep {
                id: 5,
                seq: 8,
                type_name: "Counter".into(),
                key: "~c.1".into(),
                name: None
            }
        );
        let objects = v(vec![6.into(), s("objects"), s("ab")]);
        assert_eq!(
            parse_request(objects).unwrap(),
            Request::Objects {
                id: 6,
                prefix: "ab".into(),
                persistent: false,
                all: false
            }
        );
        assert_eq!(
            parse_request(v(vec![7.into(), s("objects")])).unwrap(),
            Request::Objects {
                id: 7,
                prefix: String::new(),
                persistent: false,
                all: false
            }
        );
        assert_eq!(
            parse_request(v(vec![8.into(), s("status")])).unwrap(),
            Request::Status { id: 8 }
        );
        assert_eq!(
            parse_request(v(vec![9.into(), s("ping")])).unwrap(),
            Request::Ping { id: 9 }
        );
        let state = Value::Map(vec![(s("v"), 1.into()), (s("value"), 3.into())]);
        let adopt = v(vec![
            10.into(),
            s("adopt"),
            s("Counter"),
            s("c"),
            state.clone(),
            s("1:~s.1"),
            99.into(),
        ]);
        assert_eq!(
            parse_request(adopt).unwrap(),
            Request::Adopt {
                id: 10,
                type_name: "Counter".into(),
                name: "c".into(),
                state,
                origin: "1:~s.1".into(),
                expires: 99
            }
        );
        let first = v(vec![
            12.into(),
            s("snapshot"),
            2.into(),
            s("h:1"),
            3.into(),
            Value::Binary(vec![8]),
            Value::Binary(vec![1, 2]),
            true.into(),
        ]);
        assert_eq!(
            parse_request(first).unwrap(),
            Request::Snapshot {
                id: 12,
                from: 2,
                address: "h:1".into(),
                group: 3,
                message: Some(vec![8]),
                chunk: vec![1, 2],
                more: true
            }
        );
        let next = v(vec![
            13.into(),
            s("snapshot"),
            2.into(),
            s("h:1"),
            3.into(),
            Value::Nil,
            Value::Binary(vec![3]),
            false.into(),
        ]);
        assert!(matches!(
            parse_request(next).unwrap(),
            Request::Snapshot {
                message: None,
                more: false,
                ..
            }
        ));
        // Peer frames may name their cluster format (absent: 1); a newer one is refused.
        let raft = |format: Option<u64>| {
            let mut items = vec![14.into(), s("raft"), 2.into(), s("h:1"), 3.into(), v(vec![])];
            if let Some(format) = format {
                items.extend([false.into(), format.into()]);
            }
            parse_request(v(items))
        };
        for format in [None, Some(1), Some(CLUSTER_FORMAT)] {
            assert!(matches!(raft(format), Ok(Request::Raft { group: 3, .. })), "{format:?}");
        }
        let newer = raft(Some(CLUSTER_FORMAT + 1)).unwrap_err();
        assert!(
            newer.message.contains(&format!(
                "cluster format {}; this node reads cluster formats 1 to {CLUSTER_FORMAT}",
                CLUSTER_FORMAT + 1
            )),
            "{newer}"
        );
        let snapshot = |format: u64| {
            let items = vec![
                15.into(),
                s("snapshot"),
                2.into(),
                s("h:1"),
                3.into(),
                Value::Nil,
                Value::Binary(vec![3]),
                false.into(),
                format.into(),
            ];
            parse_request(v(items))
        };
        assert!(snapshot(CLUSTER_FORMAT).is_ok());
        assert!(snapshot(CLUSTER_FORMAT + 1).is_err());
        let short = parse_request(v(vec![11.into(), s("adopt"), s("Counter"), s("c")])).unwrap_err();
        assert!(
            short
                .message
                .contains("[id, \"adopt\", type, name, state, origin, expires]"),
            "{short}"
        );
    }

    #[test]
    fn a_request_that_is_not_an_array_has_id_zero() {
        let e = error_of(Value::Map(vec![]));
        assert_eq!(e.id, 0);
        assert_eq!(e.message, "a request must be an array [id, op, ...], not map");
        let e = error_of(v(vec![]));
        assert_eq!(e.id, 0);
        let e = error_of(v(vec![s("x"), s("ping")]));
        assert_eq!(e.id, 0);
        assert_eq!(e.message, "the request id must be an unsigned integer, not the str 'x'");
        let e = error_of(v(vec![(-1).into(), s("ping")]));
        assert_eq!(e.id, 0);
    }

    #[test]
    fn errors_after_the_id_carry_it() {
        let e = error_of(v(vec![12.into()]));
        assert_eq!(e.id, 12);
        assert!(e.message.contains("op is missing"), "{}", e.message);
        let e = error_of(v(vec![12.into(), 3.into()]));
        assert_eq!(e.message, "the op must be a string, not the integer 3");
        let e = error_of(v(vec![12.into(), s("frobnicate")]));
        assert_eq!(
            e.message,
            "unknown op 'frobnicate' (known: hello, create, call, delete, keep, objects, status, ping, withdraw, invoke, cancel, calls, worker, define, host, acl)"
        );
    }

    #[test]
    fn wrong_item_counts_name_the_expected_shape() {
        let e = error_of(v(vec![3.into(), s("call"), 1.into(), 0.into(), s("Counter")]));
        assert_eq!(e.id, 3);
        assert_eq!(
            e.message,
            "'call' takes 8 to 10 items [id, \"call\", seq, thread, type, key, method, args, acked, txn], got 5"
        );
        let e = error_of(v(vec![3.into(), s("ping"), 1.into()]));
        assert_eq!(e.message, "'ping' takes 2 items [id, \"ping\"], got 3");
    }

    #[test]
    fn wrong_operand_types_name_the_field() {
        let call = |seq: Value, args: Value| {
            v(vec![
                4.into(),
                s("call"),
                seq,
                0.into(),
                s("Counter"),
                s("k"),
                s("get"),
                args,
            ])
        };
        let e = error_of(call((-2).into(), v(vec![])));
        assert_eq!(
            e.message,
            "'call': seq must be a non-negative integer, not the integer -2"
        );
        let e = error_of(call(1.into(), Value::Map(vec![])));
        assert_eq!(e.message, "'call': args must be an array, not map");
        let create = v(vec![
            5.into(),
            s("create"),
            1.into(),
            0.into(),
            s("Counter"),
            s("k"),
            v(vec![]),
            Value::Nil,
        ]);
        assert_eq!(error_of(create).message, "'create': owned must be a bool, not None");
        let keep = v(vec![5.into(), s("keep"), 1.into(), s("Counter"), s("k"), 3.into()]);
        assert_eq!(
            error_of(keep).message,
            "'keep': name must be a str or nil, not the integer 3"
        );
    }

    #[test]
    fn define_and_host_check_their_operands() {
        let e = error_of(v(vec![1.into(), s("define"), s("py:m.C"), s("v1"), s("code")]));
        assert_eq!(e.message, "'define': code must be bin, not the str 'code'");
        let e = error_of(v(vec![1.into(), s("define"), s("py:m.C"), s("v1")]));
        assert_eq!(
            e.message,
            "'define' takes 5 items [id, \"define\", type, version, code], got 4"
        );
        let e = error_of(v(vec![2.into(), s("host"), Value::Map(vec![(s("pid"), 1.into())])]));
        assert_eq!((e.id, e.message.as_str()), (2, "'host': the map has no \"id\" str"));
        let e = error_of(v(vec![2.into(), s("host"), Value::Map(vec![(s("id"), 5.into())])]));
        assert_eq!(e.message, "'host': id must be a str, not the integer 5");
        let e = error_of(v(vec![2.into(), s("host"), s("3-ff")]));
        assert!(
            e.message.starts_with("'host': the operand must be a map"),
            "{}",
            e.message
        );
    }

    #[test]
    fn hello_checks_client_and_protocol() {
        let e = error_of(v(vec![1.into(), s("hello"), hello_map(s("c"), 2.into())]));
        assert_eq!(e.message, "unsupported protocol version 2 (this server speaks 1)");
        let e = error_of(v(vec![1.into(), s("hello"), hello_map(s(""), 1.into())]));
        assert_eq!(e.message, "'hello': client must be a non-empty str");
        let e = error_of(v(vec![
            1.into(),
            s("hello"),
            Value::Map(vec![(s("protocol"), 1.into())]),
        ]));
        assert_eq!(e.message, "'hello': the map has no \"client\" field");
        let e = error_of(v(vec![1.into(), s("hello"), s("c")]));
        assert!(
            e.message.starts_with("'hello': the operand must be a map"),
            "{}",
            e.message
        );
        for field in ["token", "secret", "user"] {
            let hello = Value::Map(vec![
                (s("client"), s("c")),
                (s("protocol"), 1.into()),
                (s(field), 7.into()),
            ]);
            let e = error_of(v(vec![1.into(), s("hello"), hello]));
            assert!(
                e.message.contains(field) && e.message.contains("a str or nil"),
                "{}",
                e.message
            );
        }
    }

    #[test]
    fn decode_refuses_garbage_and_trailing_bytes() {
        // An array announcing two items that holds one.
        let e = decode_request(&[0x92, 0x01]).unwrap_err();
        assert_eq!(e.id, 0);
        assert!(
            e.message.starts_with("frame body is not valid MessagePack"),
            "{}",
            e.message
        );
        // 0xc1 is a reserved marker; rmpv reads it as nil, which is no request either.
        let e = decode_request(&[0xc1]).unwrap_err();
        assert_eq!(e.id, 0);
        let e = decode_request(&[]).unwrap_err();
        assert_eq!(e.id, 0);
        // [7, "ping"] followed by a stray nil.
        let e = decode_request(&[0x92, 0x07, 0xa4, b'p', b'i', b'n', b'g', 0xc0]).unwrap_err();
        assert_eq!(e.id, 7);
        assert!(e.message.contains("1 bytes after the request"), "{}", e.message);
        assert_eq!(
            decode_request(&[0x92, 0x07, 0xa4, b'p', b'i', b'n', b'g']).unwrap(),
            Request::Ping { id: 7 }
        );
        // Arrays announcing 4 billion items, or cut inside their length: refused, not
        // allocated for.
        for body in [&[0xdd, 0xff, 0xff, 0xff, 0xff, 0x07][..], &[0xdc, 0x00], &[0xdd]] {
            let e = decode_request(body).unwrap_err();
            assert!(
                e.message.starts_with("frame body is not valid MessagePack"),
                "{}",
                e.message
            );
        }
        // Every cut of a call is refused the same way.
        let call = v(vec![
            Value::from(9),
            s("call"),
            Value::from(1),
            Value::from(0),
            s("Counter"),
            s("hits"),
            s("add"),
            v(vec![Value::from(1)]),
        ]);
        let mut body = Vec::new();
        rmpv::encode::write_value(&mut body, &call).unwrap();
        assert!(matches!(decode_request(&body), Ok(Request::Call { id: 9, .. })));
        for cut in 1..body.len() {
            let e = decode_request(&body[..cut]).unwrap_err();
            assert!(
                e.message.starts_with("frame body is not valid MessagePack"),
                "{cut}: {}",
                e.message
            );
        }
    }

    #[test]
    fn the_fast_path_of_calls_reads_what_the_general_path_reads() {
        // A call, with `acked` as a 9th item if given.
        let acked_call = |seq: Value, key: Value, args: Value, acked: Option<Value>| {
            let mut body = Vec::new();
            let mut items = vec![
                Value::from(9),
                s("call"),
                seq,
                Value::from(3),
                s("Counter"),
                key,
                s("add"),
                args,
            ];
            items.extend(acked);
            rmpv::encode::write_value(&mut body, &v(items)).unwrap();
            body
        };
        let call = |seq: Value, key: Value, args: Value| acked_call(seq, key, args, None);
        let nested = v(vec![Value::Map(vec![(s("a"), v(vec![Value::F64(0.5), Value::Nil]))])]);
        let bodies = [
            call(1.into(), s("hits"), v(vec![1.into()])),
            call(u64::MAX.into(), s(&"k".repeat(300)), v(vec![])),
            call(7.into(), s("ключ"), nested),
            acked_call(70_000.into(), s("hits"), v(vec![1.into()]), Some(65_536.into())),
            call(Value::from(-1), s("k"), v(vec![])),
            call(1.into(), Value::Binary(b"k".to_vec()), v(vec![])),
            call(1.into(), s("k"), Value::Nil),
            acked_call(2.into(), s("k"), v(vec![]), Some(Value::Nil)),
            acked_call(2.into(), s("k"), v(vec![]), Some(Value::from(-1))),
        ];
        // The calls a client sends take the fast path, and it reads them as the general one.
        for body in &bodies[..4] {
            assert!(decode_call(body).is_some());
            assert_eq!(decode_request(body), decode_any(body));
        }
        // Whatever the bytes (cut, or one byte changed), both paths agree: the fast one
        // leaves anything it does not take to the general one.
        const MARKERS: [u8; 16] = [
            0x00, 0x01, 0x7f, 0x80, 0x91, 0x98, 0xa0, 0xa4, 0xc0, 0xc1, 0xc4, 0xcc, 0xd0, 0xd3, 0xd9, 0xff,
        ];
        for body in &bodies {
            assert_eq!(decode_request(body), decode_any(body));
            for cut in 0..body.len() {
                assert_eq!(decode_request(&body[..cut]), decode_any(&body[..cut]), "cut at {cut}");
            }
            for at in 0..body.len() {
                for marker in MARKERS {
                    let mut changed = body.clone();
                    changed[at] = marker;
                    assert_eq!(
                        decode_request(&changed),
                        decode_any(&changed),
                        "byte {at} = {marker:#x}"
                    );
                }
            }
            let mut longer = body.clone();
            longer.push(0xc0);
            assert_eq!(decode_request(&longer), decode_any(&longer));
            assert!(decode_request(&longer).is_err());
        }
        // Arguments nested as deep as the general path takes them, and one level deeper (on a
        // thread with room for rmpv's recursion over 512 levels in a debug build).
        std::thread::scope(|scope| {
            let deep = std::thread::Builder::new()
                .stack_size(64 << 20)
                .spawn_scoped(scope, || {
                    let nest = |levels: usize| (0..levels).fold(v(vec![]), |inner, _| v(vec![inner]));
                    let deep: Vec<_> = (508..=512)
                        .map(|levels| decode_request(&call(1.into(), s("k"), v(vec![nest(levels)]))))
                        .collect();
                    assert!(deep.first().is_some_and(Result::is_ok) && deep.last().is_some_and(Result::is_err));
                    for (levels, got) in (508..=512).zip(deep) {
                        let body = call(1.into(), s("k"), v(vec![nest(levels)]));
                        assert_eq!(got, decode_any(&body), "{levels} levels");
                    }
                });
            let joined = deep.expect("a thread").join();
            joined.unwrap_or_else(|panic| std::panic::resume_unwind(panic));
        });
        // The same call with its integers in wider encodings than needed.
        let mut wide = vec![0x98, 0xd3, 0, 0, 0, 0, 0, 0, 0, 9, 0xa4];
        wide.extend(b"call");
        wide.extend([0xcf, 0, 0, 0, 0, 0, 0, 0, 1, 0xcd, 0, 3, 0xd9, 7]);
        wide.extend(b"Counter");
        wide.extend([0xda, 0, 4]);
        wide.extend(b"hits");
        wide.extend([0xa3]);
        wide.extend(b"add");
        wide.extend([0xdc, 0, 1, 0x01]);
        assert_eq!(decode_call(&wide), Some(decode_any(&bodies[0]).unwrap()));
    }
}
