//! `spindle-loadgen`: drives Spindle (its own protocol, docs/protocol.md) and Redis (RESP, through
//! the `redis` crate) with the same client code: the same number of connections, the same
//! number of requests in flight per connection, the same uniformly random keys.
//!
//! Prints one JSON object on stdout. Exits non-zero with a message on stderr when a connection
//! fails, or when more than 1% of the requests got an error reply.

use std::collections::{BTreeMap, HashMap};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::{Parser, ValueEnum};
use hdrhistogram::Histogram;
use rmpv::Value;
use spindle_proto::{encode_frame, split_frame, Split, DEFAULT_MAX_FRAME};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum Target {
    Spindle,
    Redis,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum Op {
    /// Add 1. Spindle: `Counter.add(1)`; Redis: `INCRBY key 1`.
    Incr,
    /// Multiply a float by `--factor`. Spindle: the built-in `Array.scale(factor)` on a
    /// one-element float64 array (Counter has no multiply); Redis: a Lua script (`EVALSHA`:
    /// GET, multiply, SET), since Redis has no multiply command.
    Multiply,
    /// `--steps` sequential multiplications by `--factor`. Spindle: method `--method` of the
    /// type `--object-type` (created beforehand); Redis: a Lua script (`EVALSHA`).
    Complex,
    /// A trivial method: Spindle: `--method` of `--object-type` (created beforehand) with
    /// the argument 1, a compiled type's beside `incr`'s built-in; Redis: `INCRBY key 1`.
    Method,
    /// Write a `--value-size` byte value. Spindle: `Blob.set(value)`; Redis: `SET key value`.
    Put,
    /// Read a `--value-size` byte value (written at setup). Spindle: `Blob.get()`; Redis:
    /// `GET key`.
    Get,
}

#[derive(Parser, Debug, Clone)]
#[command(
    name = "spindle-loadgen",
    about = "Load generator for Spindle and Redis (bench/throughput.py)"
)]
struct Args {
    /// The system to drive.
    #[arg(long, value_enum)]
    target: Target,
    /// host:port (default 127.0.0.1:7070 for spindle, 127.0.0.1:6379 for redis). Spindle: any
    /// node of a cluster. Redis: a comma-separated list shards the keys over independent
    /// masters (as a cluster's shards, by the same hash).
    #[arg(long)]
    address: Option<String>,
    /// Concurrent connections.
    #[arg(long, default_value_t = 200)]
    connections: usize,
    /// Requests in flight per connection (pipelining depth).
    #[arg(long, default_value_t = 1)]
    pipeline: usize,
    /// Number of objects (keys), chosen uniformly at random.
    #[arg(long, default_value_t = 800)]
    keys: usize,
    /// Measured seconds.
    #[arg(long, default_value_t = 30.0)]
    seconds: f64,
    /// Seconds of load before the measure starts.
    #[arg(long, default_value_t = 2.0)]
    warmup: f64,
    /// The operation.
    #[arg(long, value_enum)]
    op: Op,
    /// Seed of the key choice.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Spindle: create the built-in objects persistent (the server needs --data-dir).
    #[arg(long)]
    persistent: bool,
    /// Key names are `<prefix><i>` for i in 0..keys (default: `incr-`, `mul-`, `num-` or `blob-`).
    #[arg(long)]
    key_prefix: Option<String>,
    /// The factor of `multiply` and `complex`.
    #[arg(long, default_value_t = 1.0000001)]
    factor: f64,
    /// Multiplications per `complex` operation.
    #[arg(long, default_value_t = 10_000)]
    steps: u64,
    /// Spindle `complex` and `method`: the object type, user-defined (`py:<module>.<class>`)
    /// or compiled (`wasm:<name>`).
    #[arg(long, default_value = "py:__main__.Number")]
    object_type: String,
    /// Spindle `complex` and `method`: the method, called as `method(steps, factor)` or
    /// `method(1)`.
    #[arg(long, default_value = "spin")]
    method: String,
    /// Bytes of each value of `put` and `get`.
    #[arg(long, default_value_t = 1024)]
    value_size: usize,
    /// Redis: after each command, `WAIT N` for N replicas to acknowledge it (a replicated
    /// write, as a Spindle cluster's replication factor N+1).
    #[arg(long, default_value_t = 0)]
    wait: u64,
}

/// The value `put` writes and `get` reads: `--value-size` bytes.
fn value_bytes(args: &Args) -> Vec<u8> {
    (0..args.value_size).map(|i| b'a' + (i % 26) as u8).collect()
}

/// `multiply` on Redis: GET, one multiplication, SET (as `Array.scale`, no result).
const LUA_MULTIPLY: &str = "local x = tonumber(redis.call('GET', KEYS[1]) or '1') * tonumber(ARGV[1])\n\
redis.call('SET', KEYS[1], x)\n";

/// `complex` on Redis: GET, `steps` multiplications, SET; returns the value.
const LUA_COMPLEX: &str = "local x = tonumber(redis.call('GET', KEYS[1]) or '1')\n\
local f = tonumber(ARGV[1])\n\
for i = 1, tonumber(ARGV[2]) do x = x * f end\n\
redis.call('SET', KEYS[1], x)\n\
return tostring(x)\n";

/// What one connection (or one in-flight slot of a Redis connection) measured.
struct Stats {
    ops: u64,
    errors: u64,
    first_error: Option<String>,
    hist: Histogram<u64>,
}

impl Stats {
    fn new() -> Stats {
        Stats {
            ops: 0,
            errors: 0,
            first_error: None,
            hist: Histogram::new_with_bounds(1, 3_600_000_000, 3).expect("histogram bounds"),
        }
    }

    fn merge(&mut self, other: Stats) {
        self.ops += other.ops;
        self.errors += other.errors;
        if self.first_error.is_none() {
            self.first_error = other.first_error;
        }
        self.hist.add(&other.hist).expect("same histogram bounds");
    }

    fn error(&mut self, message: String) {
        self.errors += 1;
        if self.first_error.is_none() {
            self.first_error = Some(message);
        }
    }
}

/// When the measure starts and ends; only operations completed inside it count.
#[derive(Clone, Copy)]
struct Window {
    from: Instant,
    to: Instant,
}

impl Window {
    fn record(&self, stats: &mut Stats, sent: Instant, done: Instant, ok: Result<(), String>) {
        if done < self.from || done > self.to {
            return;
        }
        match ok {
            Ok(()) => {
                stats.ops += 1;
                let us = done.duration_since(sent).as_micros().max(1) as u64;
                stats.hist.saturating_record(us);
            }
            Err(e) => stats.error(e),
        }
    }
}

/// splitmix64: a seeded, fast key choice.
struct Rng(u64);

impl Rng {
    fn new(seed: u64, stream: u64) -> Rng {
        Rng(seed ^ stream.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ 0xD1B5_4A32_D192_ED03)
    }

    fn below(&mut self, n: usize) -> usize {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^= z >> 31;
        ((z as u128 * n as u128) >> 64) as usize
    }
}

// --- Spindle ----------------------------------------------------------------------------

/// One Spindle connection with its own session: its own session id and seq numbers.
struct SpindleConn {
    stream: TcpStream,
    buf: Vec<u8>,
    out: Vec<u8>,
    next_id: u64,
    next_seq: u64,
    /// The seqs of the calls in flight, by request id: each call tells the server the
    /// lowest (`acked`), so that it forgets the replies below it, as a client does.
    waiting: BTreeMap<u64, u64>,
}

impl SpindleConn {
    async fn connect(address: &str, session: &str) -> Result<SpindleConn, String> {
        let stream = TcpStream::connect(address)
            .await
            .map_err(|e| format!("cannot connect to spindle at {address}: {e}"))?;
        stream.set_nodelay(true).map_err(|e| e.to_string())?;
        let mut conn = SpindleConn {
            stream,
            buf: Vec::with_capacity(64 * 1024),
            out: Vec::with_capacity(64 * 1024),
            next_id: 1,
            next_seq: 1,
            waiting: BTreeMap::new(),
        };
        let mut hello = vec![
            (Value::from("client"), Value::from(session)),
            (Value::from("protocol"), Value::from(1)),
        ];
        // Who the load is, as every client says it (SPINDLE_USER and SPINDLE_TOKEN).
        for (field, var) in [("user", "SPINDLE_USER"), ("token", "SPINDLE_TOKEN")] {
            if let Some(value) = std::env::var(var).ok().filter(|v| !v.is_empty()) {
                hello.push((Value::from(field), Value::from(value)));
            }
        }
        let hello = Value::Map(hello);
        let id = conn.push("hello", vec![hello]);
        conn.flush().await?;
        let (got, reply) = conn.next_reply().await?;
        if got != id {
            return Err(format!("hello: reply to request {got}, expected {id}"));
        }
        reply.map_err(|e| format!("hello refused by {address}: {e}"))?;
        Ok(conn)
    }

    /// Queue request `[id, op, operands...]`; returns its id.
    fn push(&mut self, op: &str, operands: Vec<Value>) -> u64 {
        let id = self.next_id;
        self.next_id += 1;
        let mut items = Vec::with_capacity(2 + operands.len());
        items.push(Value::from(id));
        items.push(Value::from(op));
        items.extend(operands);
        encode_frame(&Value::Array(items), &mut self.out);
        id
    }

    fn seq(&mut self) -> u64 {
        let s = self.next_seq;
        self.next_seq += 1;
        s
    }

    async fn flush(&mut self) -> Result<(), String> {
        self.stream
            .write_all(&self.out)
            .await
            .map_err(|e| format!("spindle connection lost while writing: {e}"))?;
        self.out.clear();
        Ok(())
    }

    /// The next reply: its request id and its result or error (`kind: message`).
    async fn next_reply(&mut self) -> Result<(u64, Result<Value, String>), String> {
        loop {
            match split_frame(&self.buf, DEFAULT_MAX_FRAME) {
                Split::Frame { body, consumed } => {
                    let mut slice = body;
                    let value = rmpv::decode::read_value(&mut slice).map_err(|e| format!("bad reply frame: {e}"))?;
                    self.buf.drain(..consumed);
                    let (id, reply) = parse_reply(value)?;
                    self.waiting.remove(&id);
                    return Ok((id, reply));
                }
                Split::TooLarge { len } => return Err(format!("reply frame of {len} bytes is over the limit")),
                Split::Incomplete { .. } => {
                    let n = self
                        .stream
                        .read_buf(&mut self.buf)
                        .await
                        .map_err(|e| format!("spindle connection lost while reading: {e}"))?;
                    if n == 0 {
                        return Err("spindle closed the connection".into());
                    }
                }
            }
        }
    }
}

fn parse_reply(value: Value) -> Result<(u64, Result<Value, String>), String> {
    let Value::Array(mut items) = value else {
        return Err(format!("reply is not an array: {value}"));
    };
    if items.len() != 3 {
        return Err(format!("reply of {} items", items.len()));
    }
    let result = items.pop().unwrap_or(Value::Nil);
    let id = items[0].as_u64().ok_or("reply id is not an integer")?;
    match items[1].as_u64() {
        Some(0) => Ok((id, Ok(result))),
        Some(1) => {
            let text = match &result {
                Value::Array(e) if e.len() >= 2 => {
                    format!("{}: {}", e[0].as_str().unwrap_or("?"), e[1].as_str().unwrap_or("?"))
                }
                other => other.to_string(),
            };
            Ok((id, Err(text)))
        }
        _ => Err(format!("reply status is not 0 or 1: {}", items[1])),
    }
}

/// What a Spindle call of `op` on key `key` looks like: type, method, args.
struct SpindleCall {
    type_name: String,
    method: String,
    args: Value,
}

fn spindle_call(args: &Args) -> SpindleCall {
    match args.op {
        Op::Incr => SpindleCall {
            type_name: "Counter".into(),
            method: "add".into(),
            args: Value::Array(vec![Value::from(1)]),
        },
        Op::Multiply => SpindleCall {
            type_name: "Array".into(),
            method: "scale".into(),
            args: Value::Array(vec![Value::from(args.factor)]),
        },
        Op::Complex | Op::Method => {
            let positional = match args.op {
                Op::Complex => vec![Value::from(args.steps), Value::from(args.factor)],
                _ => vec![Value::from(1)],
            };
            SpindleCall {
                type_name: args.object_type.clone(),
                method: args.method.clone(),
                // A user-defined method's args are [positional, keyword]; a compiled one's
                // are positional.
                args: match args.object_type.starts_with("py:") {
                    true => Value::Array(vec![Value::Array(positional), Value::Map(vec![])]),
                    false => Value::Array(positional),
                },
            }
        }
        Op::Put => SpindleCall {
            type_name: "Blob".into(),
            method: "set".into(),
            args: Value::Array(vec![Value::Binary(value_bytes(args))]),
        },
        Op::Get => SpindleCall {
            type_name: "Blob".into(),
            method: "get".into(),
            args: Value::Array(vec![]),
        },
    }
}

impl SpindleConn {
    fn push_call(&mut self, call: &SpindleCall, key: &str) -> u64 {
        let seq = self.seq();
        // Ids grow with seqs: the first call waiting has the lowest seq. (Sent without asking
        // hello's `features`: the load generator runs against the server built with it.)
        let acked = self.waiting.first_key_value().map_or(seq, |(_, &lowest)| lowest);
        let id = self.push(
            "call",
            vec![
                Value::from(seq),
                Value::from(0),
                Value::from(call.type_name.as_str()),
                Value::from(key),
                Value::from(call.method.as_str()),
                call.args.clone(),
                Value::from(acked),
            ],
        );
        self.waiting.insert(id, seq);
        id
    }

    async fn request(&mut self, id: u64) -> Result<Value, String> {
        self.flush().await?;
        let (got, reply) = self.next_reply().await?;
        if got != id {
            return Err(format!("reply to request {got}, expected {id}"));
        }
        reply
    }
}

/// Create the built-in objects (an existing one is kept) and try one call, so that a missing
/// object or type fails here with a clear message.
async fn spindle_setup(args: &Args, address: &str, keys: &[String], session: &str) -> Result<(), String> {
    let mut conn = SpindleConn::connect(address, session).await?;
    let call = spindle_call(args);
    let ctor = match args.op {
        Op::Incr => Some(Value::Array(vec![])),
        Op::Multiply => Some(Value::Array(vec![
            Value::Array(vec![Value::from(1)]),
            Value::from("float64"),
        ])),
        // User-defined or compiled: created by the caller (bench/throughput.py).
        Op::Complex | Op::Method => None,
        Op::Put | Op::Get => Some(Value::Array(vec![Value::Binary(value_bytes(args))])),
    };
    if let Some(ctor) = ctor {
        for chunk in keys.chunks(256) {
            let mut ids = Vec::new();
            for key in chunk {
                let seq = conn.seq();
                ids.push(conn.push(
                    "create",
                    vec![
                        Value::from(seq),
                        Value::from(0),
                        Value::from(call.type_name.as_str()),
                        Value::from(key.as_str()),
                        ctor.clone(),
                        Value::from(false),
                        Value::from(args.persistent),
                    ],
                ));
            }
            conn.flush().await?;
            for _ in &ids {
                let (_, reply) = conn.next_reply().await?;
                reply.map_err(|e| format!("create {} failed: {e}", call.type_name))?;
            }
        }
    }
    let id = conn.push_call(&call, &keys[0]);
    conn.request(id).await.map_err(|e| {
        format!(
            "trial call {}.{} on {:?} failed: {e}",
            call.type_name, call.method, keys[0]
        )
    })?;
    Ok(())
}

/// One connection keeping `pipeline` calls in flight until the window ends.
async fn spindle_run(
    mut conn: SpindleConn,
    args: Arc<Args>,
    keys: Arc<Vec<String>>,
    window: Window,
    stream: u64,
) -> Result<Stats, String> {
    let call = spindle_call(&args);
    let mut rng = Rng::new(args.seed, stream);
    let mut stats = Stats::new();
    let mut in_flight: HashMap<u64, Instant> = HashMap::with_capacity(args.pipeline * 2);
    loop {
        let now = Instant::now();
        if now < window.to {
            while in_flight.len() < args.pipeline {
                let key = &keys[rng.below(keys.len())];
                let id = conn.push_call(&call, key);
                in_flight.insert(id, now);
            }
            conn.flush().await?;
        } else {
            // Past the end: nothing more is measured; the connection just closes.
            return Ok(stats);
        }
        let (id, reply) = conn.next_reply().await?;
        let done = Instant::now();
        let sent = in_flight
            .remove(&id)
            .ok_or_else(|| format!("reply to unknown request {id}"))?;
        window.record(&mut stats, sent, done, reply.map(|_| ()));
        // Take the replies already read before sending more, so that a pipelined connection
        // writes its next requests in one go.
        while let Split::Frame { .. } = split_frame(&conn.buf, DEFAULT_MAX_FRAME) {
            let (id, reply) = conn.next_reply().await?;
            let sent = in_flight
                .remove(&id)
                .ok_or_else(|| format!("reply to unknown request {id}"))?;
            window.record(&mut stats, sent, done, reply.map(|_| ()));
        }
    }
}

/// A cluster's nodes and, for each key, the index of the node leading its shard; `None`
/// for a single server (it answers `cluster` with an error).
async fn cluster_route(address: &str, keys: &[String]) -> Result<Option<(Vec<String>, Vec<usize>)>, String> {
    let mut conn = SpindleConn::connect(address, &session_id(usize::MAX - 1)).await?;
    let id = conn.push("cluster", vec![]);
    let Ok(map) = conn.request(id).await else {
        return Ok(None);
    };
    let field = |v: &Value, name: &str| {
        v.as_map()
            .and_then(|m| m.iter().find(|(k, _)| k.as_str() == Some(name)).map(|(_, v)| v.clone()))
    };
    let shards = field(&map, "shards")
        .and_then(|v| v.as_u64())
        .ok_or("a cluster map without shards")?;
    let groups = field(&map, "groups")
        .and_then(|v| v.as_array().cloned())
        .unwrap_or_default();
    let mut leaders = Vec::new();
    for g in &groups {
        let leader = field(g, "leader_address")
            .and_then(|v| v.as_str().map(str::to_string))
            .ok_or("a shard without a leader: wait until the cluster is up")?;
        leaders.push(leader);
    }
    let mut nodes: Vec<String> = leaders.clone();
    nodes.sort();
    nodes.dedup();
    let route = keys
        .iter()
        .map(|k| {
            let shard = (fnv1a(k) % shards) as usize;
            nodes.iter().position(|n| *n == leaders[shard]).unwrap_or(0)
        })
        .collect();
    Ok(Some((nodes, route)))
}

/// The keys `route` sends to node (or master) `to`.
fn routed_to(keys: &[String], route: &[usize], to: usize) -> Vec<String> {
    keys.iter()
        .zip(route)
        .filter(|(_, r)| **r == to)
        .map(|(k, _)| k.clone())
        .collect()
}

/// The shard hash of keys (the server's FNV-1a).
fn fnv1a(key: &str) -> u64 {
    key.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}

/// One client of a cluster: a connection to every node, each call sent to the node leading
/// its key's shard (one call in flight).
async fn spindle_run_routed(
    mut conns: Vec<SpindleConn>,
    args: Arc<Args>,
    keys: Arc<Vec<String>>,
    route: Arc<Vec<usize>>,
    window: Window,
    stream: u64,
) -> Result<Stats, String> {
    let call = spindle_call(&args);
    let mut rng = Rng::new(args.seed, stream);
    let mut stats = Stats::new();
    loop {
        let sent = Instant::now();
        if sent >= window.to {
            return Ok(stats);
        }
        let k = rng.below(keys.len());
        let conn = &mut conns[route[k]];
        let id = conn.push_call(&call, &keys[k]);
        let reply = conn.request(id).await;
        window.record(&mut stats, sent, Instant::now(), reply.map(|_| ()));
    }
}

// --- Redis ------------------------------------------------------------------------------

fn redis_fatal(e: &redis::RedisError) -> bool {
    e.is_io_error() || e.is_connection_dropped() || e.is_connection_refusal() || e.is_unrecoverable_error()
}

/// The command of one operation; `value` is `put`'s value, built once per connection (as the
/// Spindle side builds its call once), so that neither side pays for making it per request.
fn redis_cmd(args: &Args, sha: &str, key: &str, value: &[u8]) -> redis::Cmd {
    match args.op {
        Op::Incr | Op::Method => {
            let mut c = redis::cmd("INCRBY");
            c.arg(key).arg(1);
            c
        }
        Op::Multiply => {
            let mut c = redis::cmd("EVALSHA");
            c.arg(sha).arg(1).arg(key).arg(args.factor);
            c
        }
        Op::Complex => {
            let mut c = redis::cmd("EVALSHA");
            c.arg(sha).arg(1).arg(key).arg(args.factor).arg(args.steps);
            c
        }
        Op::Put => {
            let mut c = redis::cmd("SET");
            c.arg(key).arg(value);
            c
        }
        Op::Get => {
            let mut c = redis::cmd("GET");
            c.arg(key);
            c
        }
    }
}

async fn redis_connect(client: &redis::Client, address: &str) -> Result<redis::aio::MultiplexedConnection, String> {
    client
        .get_multiplexed_async_connection()
        .await
        .map_err(|e| format!("cannot connect to redis at {address}: {e}"))
}

/// Load the script (if any) and try one command; returns the script's SHA1.
async fn redis_setup(args: &Args, client: &redis::Client, address: &str, keys: &[String]) -> Result<String, String> {
    let mut conn = redis_connect(client, address).await?;
    if matches!(args.op, Op::Put | Op::Get) {
        // Every key holds a value before the clock starts, as Spindle's Blobs do.
        let value = value_bytes(args);
        for chunk in keys.chunks(256) {
            let mut pipe = redis::pipe();
            for key in chunk {
                pipe.cmd("SET").arg(key).arg(&value).ignore();
            }
            pipe.query_async::<()>(&mut conn)
                .await
                .map_err(|e| format!("loading the values failed: {e}"))?;
        }
    }
    let lua = match args.op {
        Op::Incr | Op::Method | Op::Put | Op::Get => None,
        Op::Multiply => Some(LUA_MULTIPLY),
        Op::Complex => Some(LUA_COMPLEX),
    };
    let sha = match lua {
        Some(lua) => redis::cmd("SCRIPT")
            .arg("LOAD")
            .arg(lua)
            .query_async::<String>(&mut conn)
            .await
            .map_err(|e| format!("SCRIPT LOAD failed: {e}"))?,
        None => String::new(),
    };
    redis_cmd(args, &sha, &keys[0], &value_bytes(args))
        .query_async::<redis::Value>(&mut conn)
        .await
        .map_err(|e| format!("trial command on {:?} failed: {e}", keys[0]))?;
    Ok(sha)
}

/// One in-flight slot of a Redis client: one command at a time until the window ends, each
/// on the connection to its key's master (`route`). `pipeline` slots share multiplexed
/// connections, which pipeline their commands.
async fn redis_run(
    mut conns: Vec<redis::aio::MultiplexedConnection>,
    args: Arc<Args>,
    keys: Arc<Vec<String>>,
    route: Arc<Vec<usize>>,
    sha: Arc<String>,
    window: Window,
    stream: u64,
) -> Result<Stats, String> {
    let mut rng = Rng::new(args.seed, stream);
    let mut stats = Stats::new();
    let value = value_bytes(&args);
    loop {
        let sent = Instant::now();
        if sent >= window.to {
            return Ok(stats);
        }
        let k = rng.below(keys.len());
        let (key, conn) = (&keys[k], &mut conns[route[k]]);
        let mut result = redis_cmd(&args, &sha, key, &value)
            .query_async::<redis::Value>(conn)
            .await;
        if args.wait > 0 && result.is_ok() {
            result = redis::cmd("WAIT")
                .arg(args.wait)
                .arg(1000)
                .query_async::<redis::Value>(conn)
                .await;
            if let Ok(redis::Value::Int(acked)) = &result {
                if (*acked as u64) < args.wait {
                    window.record(&mut stats, sent, Instant::now(), Err(format!("WAIT: {acked} replicas")));
                    continue;
                }
            }
        }
        let done = Instant::now();
        let ok = match result {
            Ok(_) => Ok(()),
            Err(e) if redis_fatal(&e) => return Err(format!("redis connection failed: {e}")),
            Err(e) => Err(e.to_string()),
        };
        window.record(&mut stats, sent, done, ok);
    }
}

// --- main -------------------------------------------------------------------------------

fn session_id(conn: usize) -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    format!("loadgen-{}-{nanos:x}-{conn}", std::process::id())
}

async fn run(args: Args) -> Result<(Stats, f64), String> {
    if args.connections == 0 || args.pipeline == 0 || args.keys == 0 {
        return Err("--connections, --pipeline and --keys must be at least 1".into());
    }
    if !args.seconds.is_finite() || args.seconds <= 0.0 || args.warmup.is_nan() || args.warmup < 0.0 {
        return Err("--seconds must be positive and --warmup not negative".into());
    }
    let address = args.address.clone().unwrap_or_else(|| match args.target {
        Target::Spindle => "127.0.0.1:7070".into(),
        Target::Redis => "127.0.0.1:6379".into(),
    });
    let prefix = args.key_prefix.clone().unwrap_or_else(|| {
        match args.op {
            Op::Incr => "incr-",
            Op::Multiply => "mul-",
            Op::Complex => "num-",
            Op::Method => "obj-",
            Op::Put | Op::Get => "blob-",
        }
        .into()
    });
    let keys: Arc<Vec<String>> = Arc::new((0..args.keys).map(|i| format!("{prefix}{i}")).collect());
    let args = Arc::new(args);
    let mut tasks = tokio::task::JoinSet::new();
    // Connect everything first; the clock starts once all connections are up.
    match args.target {
        Target::Spindle => {
            if let Some((nodes, route)) = cluster_route(&address, &keys).await? {
                if args.pipeline != 1 {
                    return Err("a cluster is driven with --pipeline 1".into());
                }
                for (n, node) in nodes.iter().enumerate() {
                    let mine = routed_to(&keys, &route, n);
                    if !mine.is_empty() {
                        spindle_setup(&args, node, &mine, &session_id(usize::MAX - 2 - n)).await?;
                    }
                }
                let route = Arc::new(route);
                let mut clients = Vec::with_capacity(args.connections);
                for i in 0..args.connections {
                    let mut conns = Vec::with_capacity(nodes.len());
                    for (n, node) in nodes.iter().enumerate() {
                        conns.push(SpindleConn::connect(node, &session_id(i * nodes.len() + n)).await?);
                    }
                    clients.push(conns);
                }
                let window = start_window(&args);
                for (i, conns) in clients.into_iter().enumerate() {
                    tasks.spawn(spindle_run_routed(
                        conns,
                        args.clone(),
                        keys.clone(),
                        route.clone(),
                        window,
                        i as u64,
                    ));
                }
                return collect(tasks, args.seconds).await;
            }
            spindle_setup(&args, &address, &keys, &session_id(usize::MAX)).await?;
            let mut conns = Vec::with_capacity(args.connections);
            for i in 0..args.connections {
                conns.push(SpindleConn::connect(&address, &session_id(i)).await?);
            }
            let window = start_window(&args);
            for (i, conn) in conns.into_iter().enumerate() {
                tasks.spawn(spindle_run(conn, args.clone(), keys.clone(), window, i as u64));
            }
        }
        Target::Redis => {
            let masters: Vec<&str> = address.split(',').map(str::trim).collect();
            if masters.len() > 1 && args.wait > 0 {
                return Err("--wait needs one master (with its replicas), not a list of masters".into());
            }
            let route: Vec<usize> = keys
                .iter()
                .map(|k| (fnv1a(k) % masters.len() as u64) as usize)
                .collect();
            let mut clients = Vec::with_capacity(masters.len());
            let mut sha = String::new();
            for (m, master) in masters.iter().enumerate() {
                let client = redis::Client::open(format!("redis://{master}/"))
                    .map_err(|e| format!("bad redis address {master}: {e}"))?;
                let mine = routed_to(&keys, &route, m);
                if !mine.is_empty() {
                    sha = redis_setup(&args, &client, master, &mine).await?;
                }
                clients.push(client);
            }
            let (sha, route) = (Arc::new(sha), Arc::new(route));
            let mut conns = Vec::with_capacity(args.connections);
            for _ in 0..args.connections {
                let mut mine = Vec::with_capacity(masters.len());
                for (client, master) in clients.iter().zip(&masters) {
                    mine.push(redis_connect(client, master).await?);
                }
                conns.push(mine);
            }
            let window = start_window(&args);
            for (i, mine) in conns.into_iter().enumerate() {
                for slot in 0..args.pipeline {
                    let stream = (i * args.pipeline + slot) as u64;
                    tasks.spawn(redis_run(
                        mine.clone(),
                        args.clone(),
                        keys.clone(),
                        route.clone(),
                        sha.clone(),
                        window,
                        stream,
                    ));
                }
            }
        }
    }
    collect(tasks, args.seconds).await
}

async fn collect(mut tasks: tokio::task::JoinSet<Result<Stats, String>>, seconds: f64) -> Result<(Stats, f64), String> {
    let mut total = Stats::new();
    while let Some(joined) = tasks.join_next().await {
        let stats = joined.map_err(|e| format!("a connection task panicked: {e}"))??;
        total.merge(stats);
    }
    Ok((total, seconds))
}

fn start_window(args: &Args) -> Window {
    let from = Instant::now() + Duration::from_secs_f64(args.warmup);
    Window {
        from,
        to: from + Duration::from_secs_f64(args.seconds),
    }
}

fn json_str(s: &str) -> String {
    let mut out = String::from("\"");
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if (c as u32) < 0x20 => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

fn main() -> ExitCode {
    let args = Args::parse();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("tokio runtime");
    let (target, op, connections, pipeline, keys) = (args.target, args.op, args.connections, args.pipeline, args.keys);
    let (stats, seconds) = match runtime.block_on(run(args)) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("spindle-loadgen: error: {e}");
            return ExitCode::FAILURE;
        }
    };
    let h = &stats.hist;
    let (p50, p99, max, mean) = if stats.ops > 0 {
        (h.value_at_quantile(0.5), h.value_at_quantile(0.99), h.max(), h.mean())
    } else {
        (0, 0, 0, 0.0)
    };
    let target = format!("{target:?}").to_lowercase();
    let op = format!("{op:?}").to_lowercase();
    println!(
        "{{\"target\": {}, \"op\": {}, \"connections\": {connections}, \"pipeline\": {pipeline}, \"keys\": {keys}, \
         \"seconds\": {seconds}, \"ops\": {}, \"ops_per_s\": {:.1}, \"p50_us\": {p50}, \"p99_us\": {p99}, \
         \"max_us\": {max}, \"mean_us\": {mean:.1}, \"errors\": {}, \"first_error\": {}}}",
        json_str(&target),
        json_str(&op),
        stats.ops,
        stats.ops as f64 / seconds,
        stats.errors,
        stats
            .first_error
            .as_deref()
            .map(json_str)
            .unwrap_or_else(|| "null".into()),
    );
    let total = stats.ops + stats.errors;
    if stats.errors > 0 && stats.errors * 100 > total {
        eprintln!(
            "spindle-loadgen: error: {} of {total} requests got an error reply (over 1%); first: {}",
            stats.errors,
            stats.first_error.as_deref().unwrap_or("?")
        );
        return ExitCode::FAILURE;
    }
    if stats.ops == 0 {
        eprintln!("spindle-loadgen: error: no operation completed in the measured window");
        return ExitCode::FAILURE;
    }
    ExitCode::SUCCESS
}
