//! Partition snapshots: the persistent part of a partition as of one moment, captured while
//! calls go on, so the op log behind it can be dropped and recovery replays only the tail.
//!
//! [`Partition::begin_snapshot`] marks the moment: it returns the snapshot's header (the
//! partition-wide state: recorded replies, logged connections and sessions, the calls parked
//! on persistent objects) and how many object slots there are. The objects themselves are
//! captured later, walking the slots a chunk at a time ([`Partition::snapshot_chunk`]), each
//! under a short hold of the shard lock: an object about to change (or go) before its turn is
//! captured first (copy on write, [`Partition::preserve`]), and objects made after the moment
//! are left out (their epoch is the snapshot's), so the snapshot is exactly the state at that
//! moment. The server puts the moment in the log (it
//! starts a new segment there), and recovery loads the snapshot, then replays the log after it.
//!
//! # Body format, version 1
//!
//! A stream of MessagePack values:
//!
//! ```text
//! [1, "partition", header]                      header: a map, below
//! ["object", key, type, owner | nil, state]     a built-in persistent object (state: Object::snapshot)
//! ["user", key, type, version, owner | nil, state]   a user-defined one (state: its last logged pickle, bin)
//! ["end", objects]                              the number of objects before it
//! ```
//!
//! `header` has exactly the fields `next_object_id`, `highest_logged_conn` (ints),
//! `logged_conns` (array of ints), `logged_clients` (array of strings), `replies` (array of
//! `[client, [[seq, reply]...], acked_below]`, oldest reply first; `reply` is `["ok", value]`
//! or `["err", kind, message, data]`; `acked_below`, absent from older snapshots: the
//! session's calls below it are refused), `parked` (array of `[record, recorded]`: the op-log
//! record of a parked call as bin, in park order, and whether its reply will be recorded
//! for retries: not once its session ended) and `classes` (array of `[type, version, code]`, code as bin: the classes of
//! user-defined objects this partition logged), and, only when there are any, `prepared`
//! (the `prepare` records of the cluster transactions prepared and undecided here) and
//! `decisions` (the `decision` records this coordinator keeps), each an array of bin. A user-defined object still constructing
//! at the moment has no logged state and is left to the log. Restoring applies the parked records again, so the calls parked at the moment are
//! parked again and a later record that answered one (a `put` handing its item to a waiting
//! `get`) replays as it ran.

use ahash::HashMap;
use std::io::Read;
use std::sync::Arc;
use std::time::Instant;

use super::{Body, Entry, Partition, ReplyLog, Storage, StoredUser};
use crate::objects::{compiled, user};
use crate::record::Record;
use crate::{objects, Error, ErrorKind, Reply, Token, Value};

/// The snapshot format version.
pub const SNAPSHOT_VERSION: u64 = 1;

/// A snapshot being captured.
pub(super) struct Capture {
    epoch: u64,
    /// The next object slot to capture, and the end of the slots at the moment of the
    /// snapshot (objects in later slots were made after it).
    next: usize,
    end: usize,
    /// Encoded objects captured and not yet handed out.
    ready: Vec<u8>,
    objects: u64,
}

impl Partition {
    /// Start a snapshot of the persistent objects as they are now; returns its header (the
    /// first bytes of the body). Write the log position of this moment with it. A snapshot
    /// already in progress is abandoned.
    pub fn begin_snapshot(&mut self) -> Vec<u8> {
        self.snapshot_epoch += 1;
        self.capture = Some(Capture {
            epoch: self.snapshot_epoch,
            next: 0,
            end: self.objects.slot_count(),
            ready: Vec::new(),
            objects: 0,
        });
        let mut replies = Vec::new();
        for (client, log) in &self.logs {
            let durable: Vec<Value> = log
                .durable()
                .map(|(seq, reply)| Value::Array(vec![seq.into(), encode_reply(&reply)]))
                .collect();
            // A session named in no record is never ended by one: its mark is left out.
            let acked_below = match self.logged_clients.contains(client) {
                true => log.acked_below,
                false => 0,
            };
            if !durable.is_empty() || acked_below != 0 {
                replies.push(Value::Array(vec![
                    (**client).into(),
                    Value::Array(durable),
                    acked_below.into(),
                ]));
            }
        }
        let mut parked: Vec<(&Token, &(u64, Vec<u8>))> = self.parked_records.iter().collect();
        parked.sort_unstable_by_key(|(_, (order, _))| *order);
        let mut clients: Vec<&str> = self.logged_clients.iter().map(|c| &**c).collect();
        clients.sort_unstable();
        let header = vec![
            ("next_object_id", self.next_object_id.into()),
            ("highest_logged_conn", self.highest_logged_conn.into()),
            (
                "logged_conns",
                Value::Array(self.logged_conns.iter().map(|c| (*c).into()).collect()),
            ),
            (
                "logged_clients",
                Value::Array(clients.into_iter().map(Value::from).collect()),
            ),
            ("replies", Value::Array(replies)),
            (
                "parked",
                Value::Array(
                    parked
                        .into_iter()
                        .map(|(token, (_, r))| {
                            let recorded = self.parked_seqs.contains_key(token);
                            Value::Array(vec![Value::Binary(r.clone()), recorded.into()])
                        })
                        .collect(),
                ),
            ),
            (
                "classes",
                Value::Array(
                    self.classes()
                        .into_iter()
                        .map(|(t, v, code)| Value::Array(vec![t.into(), v.into(), Value::Binary(code.to_vec())]))
                        .collect(),
                ),
            ),
        ];
        let mut header = header;
        // Only when there are any: a snapshot without them reads on nodes that know neither.
        let (prepared, decisions) = self.two_phase_records();
        let bins = |records: Vec<Vec<u8>>| Value::Array(records.into_iter().map(Value::Binary).collect());
        if !prepared.is_empty() {
            header.push(("prepared", bins(prepared)));
        }
        if !decisions.is_empty() {
            header.push(("decisions", bins(decisions)));
        }
        let header = Value::Map(header.into_iter().map(|(k, v)| (Value::from(k), v)).collect());
        let mut buf = Vec::new();
        write(
            &mut buf,
            Value::Array(vec![SNAPSHOT_VERSION.into(), "partition".into(), header]),
        );
        buf
    }

    /// The next part of the snapshot in progress: about `budget` bytes of captured objects,
    /// and `true` with the last part (which ends the snapshot). `None` when no snapshot is
    /// in progress (it was aborted: what was captured must not be published).
    pub fn snapshot_chunk(&mut self, budget: usize) -> Option<(Vec<u8>, bool)> {
        let c = self.capture.as_mut()?;
        while c.ready.len() < budget && c.next < c.end {
            if let Some((key, e)) = self.objects.slot_mut(c.next) {
                capture(c, key, e);
            }
            c.next += 1;
        }
        let mut out = std::mem::take(&mut c.ready);
        if c.next < c.end {
            return Some((out, false));
        }
        write(&mut out, Value::Array(vec!["end".into(), c.objects.into()]));
        self.capture = None;
        Some((out, true))
    }

    /// Give up the snapshot in progress (its file could not be written).
    pub fn abort_snapshot(&mut self) {
        self.capture = None;
    }

    /// Before `key`'s object changes: capture it first if the snapshot in progress still
    /// needs it as it was.
    pub(super) fn preserve(&mut self, key: &str) {
        // No lookup while no snapshot is in progress (nearly always).
        if let Some(c) = self.capture.as_mut() {
            if let Some(e) = self.objects.get_mut(key) {
                capture(c, key, e);
            }
        }
    }

    /// Rebuild a fresh partition from a snapshot body (recovery, before replaying the log
    /// after the snapshot), read from `body` one value at a time (the body is never held
    /// whole). Fails, naming what is wrong, on a body that does not decode or cannot be read.
    pub fn restore_snapshot(&mut self, body: &mut impl Read, now: Instant) -> Result<(), String> {
        if !self.objects.is_empty() || !self.logs.is_empty() {
            return Err("a snapshot is restored into an empty partition only".into());
        }
        if self.storage == Storage::None {
            return Err("a snapshot is restored into a partition with storage enabled only".into());
        }
        let mut next = |what: &str| -> Result<Vec<Value>, String> {
            match rmpv::decode::read_value(body) {
                Ok(Value::Array(items)) => Ok(items),
                Ok(_) => Err(format!("{what} is not an array")),
                Err(e) => match e.kind() {
                    std::io::ErrorKind::UnexpectedEof => Err(format!("the body ends before {what}")),
                    std::io::ErrorKind::Other => Err(format!("{what} is not MessagePack: {e}")),
                    // A damaged file (its checksum), or a read that failed.
                    _ => Err(format!("reading {what}: {e}")),
                },
            }
        };
        let mut head = Items::new(next("the header")?, "the header");
        let version = head.uint("version")?;
        if version != SNAPSHOT_VERSION {
            return Err(format!(
                "snapshot format version {version}, this server knows {SNAPSHOT_VERSION}"
            ));
        }
        head.tag("partition")?;
        let header = head.next("header")?;
        head.end()?;
        let mut fields = header_fields(header)?;
        let mut field = |name: &str| {
            fields
                .remove(name)
                .ok_or_else(|| format!("header field {name} is missing"))
        };
        self.next_object_id = uint(field("next_object_id")?, "next_object_id")?;
        self.highest_logged_conn = uint(field("highest_logged_conn")?, "highest_logged_conn")?;
        for c in array(field("logged_conns")?, "logged_conns")? {
            self.logged_conns.insert(uint(c, "a logged connection")?);
        }
        for c in array(field("logged_clients")?, "logged_clients")? {
            self.logged_clients.insert(Arc::from(string(c, "a logged client")?));
        }
        let logged_clients = self.logged_clients.clone();
        for entry in array(field("replies")?, "replies")? {
            let mut items = Items::new(array(entry, "a reply log")?, "a reply log");
            let client: Arc<str> = Arc::from(items.string("client")?);
            let mut log = ReplyLog::default();
            for r in items.array("replies")? {
                let mut r = Items::new(array(r, "a reply")?, "a reply");
                let seq = r.uint("seq")?;
                let reply = decode_reply(r.next("reply")?)?;
                r.end()?;
                log.record(seq, reply, true, self.reply_log_limit.per_client);
            }
            log.acked_below = items.optional_uint("acked_below")?;
            items.end()?;
            self.logs_bytes += log.bytes;
            if let Some(replaced) = self.logs.insert(client, log) {
                self.logs_bytes -= replaced.bytes;
            }
        }
        let mut parked = Vec::new();
        for p in array(field("parked")?, "parked")? {
            let mut items = Items::new(array(p, "a parked call")?, "a parked call");
            let record = items.binary("record")?;
            let recorded = items.next("recorded")?.as_bool().ok_or("recorded is not a bool")?;
            items.end()?;
            let token = match Record::decode(&record)? {
                Record::Apply { token, .. } => token,
                _ => return Err("a parked call's record is not an apply record".into()),
            };
            parked.push((record, token, recorded));
        }
        for class in array(field("classes")?, "classes")? {
            let mut items = Items::new(array(class, "a class")?, "a class");
            let type_name = items.string("type")?;
            let version = items.string("version")?;
            let code = items.binary("code")?;
            items.end()?;
            self.insert_class(&type_name, &version, Arc::new(code))
                .map_err(|e| format!("the code of {type_name} at version {version}: {}", e.message))?;
        }
        let mut two_phase = Vec::new();
        for name in ["prepared", "decisions"] {
            for r in fields
                .remove(name)
                .map(|v| array(v, name))
                .transpose()?
                .unwrap_or_default()
            {
                match r {
                    Value::Binary(record) => two_phase.push(record),
                    _ => return Err(format!("an item of {name} is not a record")),
                }
            }
        }
        if let Some(extra) = fields.keys().next() {
            return Err(format!("unexpected header field {extra}"));
        }
        let mut count = 0u64;
        loop {
            let mut items = Items::new(next("the end")?, "an object");
            match items.string("tag")?.as_str() {
                "object" => {
                    let key = items.string("key")?;
                    let type_name = items.string("type")?;
                    let owner = match items.next("owner")? {
                        Value::Nil => None,
                        v => Some(Arc::from(string(v, "owner")?)),
                    };
                    let state = items.next("state")?;
                    items.end()?;
                    let obj = match compiled::is_compiled_type(&type_name) {
                        true => self.restore_compiled(&type_name, &state),
                        false => objects::snapshot::restore(&type_name, &state),
                    }
                    .map_err(|e| format!("object '{key}': {}", e.message))?;
                    let entry = Entry {
                        body: Body::Builtin(obj),
                        owner,
                        persistent: true,
                        epoch: self.snapshot_epoch,
                    };
                    if self.objects.insert(key.clone(), entry).is_some() {
                        return Err(format!("object '{key}' appears twice"));
                    }
                    count += 1;
                }
                "user" => {
                    let o = StoredUser {
                        key: items.string("key")?,
                        type_name: items.string("type")?,
                        version: items.string("version")?,
                        owner: match items.next("owner")? {
                            Value::Nil => None,
                            v => Some(string(v, "owner")?),
                        },
                        state: items.binary("state")?,
                    };
                    items.end()?;
                    user::check_type_name(&o.type_name).map_err(|e| format!("object '{}': {}", o.key, e.message))?;
                    if self.objects.contains_key(&o.key) {
                        return Err(format!("object '{}' appears twice", o.key));
                    }
                    self.insert_stored_user(o);
                    count += 1;
                }
                "end" => {
                    let n = items.uint("count")?;
                    items.end()?;
                    if n != count {
                        return Err(format!("the end says {n} objects, the body holds {count}"));
                    }
                    break;
                }
                other => return Err(format!("unknown entry '{other}'")),
            }
        }
        let mut after = [0u8; 1];
        match body.read(&mut after) {
            Ok(0) => {}
            Ok(_) => return Err("bytes after the end".into()),
            Err(e) => return Err(format!("reading past the end: {e}")),
        }
        // The calls parked at the moment of the snapshot park again, in their order. One
        // whose session had ended stays parked as it was then: its reply is not recorded,
        // and its session is not named again.
        for (record, token, recorded) in parked {
            self.replay(&record, now)?;
            if !recorded {
                self.parked_seqs.remove(&token);
            }
        }
        self.logged_clients = logged_clients;
        // Prepared transactions hold their keys again; kept decisions are kept again.
        for record in two_phase {
            self.replay(&record, now)?;
        }
        Ok(())
    }
}

/// Capture `e` into `c` unless it is not needed (ephemeral, made after the snapshot's
/// moment, or captured already).
fn capture(c: &mut Capture, key: &str, e: &mut Entry) {
    if !e.persistent || e.epoch >= c.epoch {
        return;
    }
    e.epoch = c.epoch;
    let owner = e.owner.as_deref().map_or(Value::Nil, Value::from);
    let entry = match &e.body {
        Body::Builtin(obj) => vec![
            "object".into(),
            key.into(),
            obj.type_name().into(),
            owner,
            obj.snapshot().unwrap_or(Value::Nil),
        ],
        Body::User(u) => match &u.last_state {
            Some(state) => vec![
                "user".into(),
                key.into(),
                u.type_name.as_str().into(),
                u.version.as_str().into(),
                owner,
                Value::Binary(state.clone()),
            ],
            // Constructing: not acknowledged yet, so not part of the state at the moment.
            None => return,
        },
    };
    write(&mut c.ready, Value::Array(entry));
    c.objects += 1;
}

fn write(buf: &mut Vec<u8>, value: Value) {
    // Writing to a Vec cannot fail.
    let _ = rmpv::encode::write_value(buf, &value);
}

fn encode_reply(reply: &Reply) -> Value {
    match reply {
        Ok(v) => Value::Array(vec!["ok".into(), v.clone()]),
        Err(e) => Value::Array(vec![
            "err".into(),
            e.kind.as_str().into(),
            e.message.as_str().into(),
            e.data.clone(),
        ]),
    }
}

fn decode_reply(value: Value) -> Result<Reply, String> {
    let mut items = Items::new(array(value, "a reply")?, "a reply");
    let reply = match items.string("outcome")?.as_str() {
        "ok" => Ok(items.next("value")?),
        "err" => {
            let kind = items.string("kind")?;
            let kind = ErrorKind::from_name(&kind).ok_or_else(|| format!("unknown error kind '{kind}'"))?;
            let message = items.string("message")?;
            Err(Error::new(kind, message).with_data(items.next("data")?))
        }
        other => return Err(format!("unknown reply outcome '{other}'")),
    };
    items.end()?;
    Ok(reply)
}

fn header_fields(header: Value) -> Result<HashMap<String, Value>, String> {
    let Value::Map(pairs) = header else {
        return Err("the header is not a map".into());
    };
    let mut fields = HashMap::default();
    for (k, v) in pairs {
        let name = string(k, "a header field name")?;
        if fields.insert(name.clone(), v).is_some() {
            return Err(format!("header field {name} appears twice"));
        }
    }
    Ok(fields)
}

fn uint(v: Value, what: &str) -> Result<u64, String> {
    v.as_u64()
        .ok_or_else(|| format!("{what} is not a non-negative integer"))
}

fn string(v: Value, what: &str) -> Result<String, String> {
    match v {
        Value::String(s) => s.into_str().ok_or_else(|| format!("{what} is not UTF-8")),
        _ => Err(format!("{what} is not a string")),
    }
}

fn array(v: Value, what: &str) -> Result<Vec<Value>, String> {
    match v {
        Value::Array(items) => Ok(items),
        _ => Err(format!("{what} is not an array")),
    }
}

/// The items of one array value, taken in order.
struct Items {
    items: std::vec::IntoIter<Value>,
    what: &'static str,
}

impl Items {
    fn new(items: Vec<Value>, what: &'static str) -> Self {
        Items {
            items: items.into_iter(),
            what,
        }
    }

    fn next(&mut self, name: &str) -> Result<Value, String> {
        self.items
            .next()
            .ok_or_else(|| format!("{} lacks its {name}", self.what))
    }

    fn uint(&mut self, name: &str) -> Result<u64, String> {
        uint(self.next(name)?, name)
    }

    /// A last item that older snapshots lack: 0 when absent.
    fn optional_uint(&mut self, name: &str) -> Result<u64, String> {
        match self.items.len() {
            0 => Ok(0),
            _ => self.uint(name),
        }
    }

    fn string(&mut self, name: &str) -> Result<String, String> {
        string(self.next(name)?, name)
    }

    fn array(&mut self, name: &str) -> Result<Vec<Value>, String> {
        array(self.next(name)?, name)
    }

    fn binary(&mut self, name: &str) -> Result<Vec<u8>, String> {
        match self.next(name)? {
            Value::Binary(b) => Ok(b),
            _ => Err(format!("{name} is not bin")),
        }
    }

    fn tag(&mut self, expected: &str) -> Result<(), String> {
        match self.string("tag")? {
            t if t == expected => Ok(()),
            t => Err(format!("{} is '{t}', not '{expected}'", self.what)),
        }
    }

    fn end(&mut self) -> Result<(), String> {
        match self.items.len() {
            0 => Ok(()),
            n => Err(format!("{} has {n} unexpected items at its end", self.what)),
        }
    }
}
