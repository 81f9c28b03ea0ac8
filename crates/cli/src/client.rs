//! A small blocking client: `spindle status` and `spindle objects`, and the shell's object
//! commands (`counter -n c increment`), one short-lived connection per process.

use std::io::{ErrorKind, Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::path::PathBuf;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use rustls::{ClientConfig, ClientConnection, StreamOwned};

use spindle_core::Value;
use spindle_proto::{read_frame, write_frame};

const TIMEOUT: Duration = Duration::from_secs(5);
/// Replies may be larger than the server's request limit (a whole `Blob`).
const MAX_REPLY: usize = 1 << 30;

/// An error reply from the server: `[kind, message, data]`.
#[derive(Debug)]
pub(crate) struct Remote {
    pub kind: String,
    pub message: String,
    /// The error's data (a `NotLeader`'s leader address).
    pub data: Value,
}

/// Why a request got no result.
#[derive(Debug)]
pub(crate) enum Failure {
    /// The server answered with an error.
    Remote(Remote),
    /// No answer: the connection failed, closed or timed out.
    Connection(String),
}

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Failure::Remote(r) => write!(f, "{}: {}", r.kind, r.message),
            Failure::Connection(message) => f.write_str(message),
        }
    }
}

impl Failure {
    /// The message for the user when request `op` failed.
    pub(crate) fn said(self, op: &str) -> String {
        match self {
            Failure::Remote(r) => format!("the server refused '{op}': {}: {}", r.kind, r.message),
            Failure::Connection(message) => message,
        }
    }
}

/// The TLS flags of the commands that connect; each defaults to its environment variable,
/// which every other command (`spindle sh`, the object commands) reads too.
#[derive(clap::Args, Clone, Default)]
pub(crate) struct TlsArgs {
    /// Connect with TLS, trusting the CA certificates in FILE [default: $SPINDLE_TLS_CA].
    #[arg(long, env = "SPINDLE_TLS_CA", value_name = "FILE", hide_env = true)]
    pub(crate) tls_ca: Option<PathBuf>,
    /// Present this client certificate, for servers with --tls-client-ca [default:
    /// $SPINDLE_TLS_CERT].
    #[arg(
        long,
        env = "SPINDLE_TLS_CERT",
        value_name = "FILE",
        hide_env = true,
        requires = "tls_key"
    )]
    pub(crate) tls_cert: Option<PathBuf>,
    /// The client certificate's private key [default: $SPINDLE_TLS_KEY].
    #[arg(
        long,
        env = "SPINDLE_TLS_KEY",
        value_name = "FILE",
        hide_env = true,
        requires = "tls_cert"
    )]
    pub(crate) tls_key: Option<PathBuf>,
}

/// This process's TLS settings: set once from the flags, else read from the environment.
static TLS: OnceLock<Result<Option<Arc<ClientConfig>>, String>> = OnceLock::new();

/// Use these TLS settings for every connection of this process (call before connecting).
pub(crate) fn use_tls(args: &TlsArgs) {
    let _ = TLS.set(load_tls(args));
}

fn tls() -> Result<Option<Arc<ClientConfig>>, String> {
    TLS.get_or_init(|| {
        let var = |name: &str| std::env::var_os(name).filter(|v| !v.is_empty()).map(PathBuf::from);
        load_tls(&TlsArgs {
            tls_ca: var("SPINDLE_TLS_CA"),
            tls_cert: var("SPINDLE_TLS_CERT"),
            tls_key: var("SPINDLE_TLS_KEY"),
        })
    })
    .clone()
}

fn load_tls(args: &TlsArgs) -> Result<Option<Arc<ClientConfig>>, String> {
    let Some(ca) = &args.tls_ca else {
        if args.tls_cert.is_some() {
            return Err(
                "a client certificate (SPINDLE_TLS_CERT) needs the server's CA too (--tls-ca or SPINDLE_TLS_CA)".into(),
            );
        }
        return Ok(None);
    };
    let identity = match (&args.tls_cert, &args.tls_key) {
        (Some(cert), Some(key)) => Some((cert.as_path(), key.as_path())),
        (None, None) => None,
        _ => {
            return Err(
                "a client certificate needs both --tls-cert and --tls-key (SPINDLE_TLS_CERT and SPINDLE_TLS_KEY)"
                    .into(),
            )
        }
    };
    spindle_server::tls::client_config(ca, identity)
        .map(|config| Some(Arc::new(config)))
        .map_err(|e| format!("TLS: {e}"))
}

/// A connection to a server: plain, or TLS over the socket.
enum Stream {
    Plain(TcpStream),
    Tls(Box<StreamOwned<ClientConnection, TcpStream>>),
}

impl Stream {
    fn socket(&self) -> &TcpStream {
        match self {
            Stream::Plain(socket) => socket,
            Stream::Tls(tls) => tls.get_ref(),
        }
    }

    fn set_read_timeout(&self, timeout: Option<Duration>) -> std::io::Result<()> {
        self.socket().set_read_timeout(timeout)
    }
}

impl Read for Stream {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        match self {
            Stream::Plain(socket) => socket.read(buf),
            Stream::Tls(tls) => tls.read(buf),
        }
    }
}

impl Write for Stream {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        match self {
            Stream::Plain(socket) => socket.write(buf),
            Stream::Tls(tls) => tls.write(buf),
        }
    }

    fn flush(&mut self) -> std::io::Result<()> {
        match self {
            Stream::Plain(socket) => socket.flush(),
            Stream::Tls(tls) => tls.flush(),
        }
    }
}

pub(crate) struct Client {
    stream: Stream,
    address: String,
    next_id: u64,
    /// The session's call numbers: one attempt per call, so never reused.
    next_seq: u64,
    /// The session's secret, given in `hello` (see `spindle_proto::session`).
    secret: String,
    /// Whether the server takes `acked` (its hello lists it).
    acks: bool,
    /// Whether the session pipelines recorded calls ([`call_seq`](Self::call_seq)): a call's
    /// reply may then still be out when the next goes, so none acknowledges.
    pipelined: bool,
}

impl Client {
    /// Connect to the first address of a comma-separated list that answers, and say hello
    /// (as `$SPINDLE_USER` with `$SPINDLE_TOKEN` when set) as a fresh session.
    pub(crate) fn connect(addresses: &str) -> Result<Client, String> {
        let mut failures = Vec::new();
        for address in addresses.split(',').map(str::trim).filter(|a| !a.is_empty()) {
            match open_stream(address) {
                Ok(stream) => {
                    let mut client = Client {
                        stream,
                        address: address.to_string(),
                        next_id: 1,
                        next_seq: 1,
                        secret: new_secret()?,
                        acks: false,
                        pipelined: false,
                    };
                    client.hello()?;
                    return Ok(client);
                }
                Err(e) => failures.push(e),
            }
        }
        Err(match failures.len() {
            0 => format!("bad server address '{addresses}': no address given"),
            _ if failures.iter().all(|f| f.starts_with("no Spindle server")) => {
                format!("{}; start one with `spindle server`", failures.join("; "))
            }
            _ => failures.join("; "),
        })
    }

    fn hello(&mut self) -> Result<(), String> {
        let mut hello = vec![
            ("client".into(), spindle_proto::session_id(&self.secret).into()),
            ("secret".into(), self.secret.as_str().into()),
            ("protocol".into(), spindle_proto::PROTOCOL_VERSION.into()),
        ];
        if let Some(token) = std::env::var("SPINDLE_TOKEN").ok().filter(|t| !t.is_empty()) {
            hello.push(("token".into(), token.into()));
        }
        if let Some(user) = std::env::var("SPINDLE_USER").ok().filter(|u| !u.is_empty()) {
            hello.push(("user".into(), user.into()));
        }
        let reply = self.request("hello", vec![Value::Map(hello)])?;
        // An older server refuses the operand.
        self.acks = field(&reply, "features")
            .and_then(Value::as_array)
            .is_some_and(|features| features.iter().any(|f| f.as_str() == Some("acked")));
        Ok(())
    }

    pub(crate) fn request(&mut self, op: &str, operands: Vec<Value>) -> Result<Value, String> {
        self.exchange(op, operands, Some(TIMEOUT)).map_err(|e| e.said(op))
    }

    /// Send one request and wait for its reply, at most `wait` (`None`: as long as it takes,
    /// for calls that park in the server). In a cluster, a call reaching a node that does
    /// not lead its object's shard is sent again (same seq) to the leader the node names.
    fn exchange(&mut self, op: &str, operands: Vec<Value>, wait: Option<Duration>) -> Result<Value, Failure> {
        let mut redirects = 0;
        loop {
            match self.exchange_once(op, operands.clone(), wait) {
                Err(Failure::Remote(r)) if r.kind == "NotLeader" && redirects < 50 => {
                    redirects += 1;
                    match r.data.as_str() {
                        Some(leader) => self.reconnect(leader).map_err(Failure::Connection)?,
                        None => std::thread::sleep(Duration::from_millis(100)), // an election
                    }
                }
                outcome => return outcome,
            }
        }
    }

    /// Continue the session on the node at `address`.
    fn reconnect(&mut self, address: &str) -> Result<(), String> {
        self.stream = open_stream(address)?;
        self.address = address.to_string();
        self.hello()
    }

    fn exchange_once(&mut self, op: &str, operands: Vec<Value>, wait: Option<Duration>) -> Result<Value, Failure> {
        let id = self.next_id;
        self.next_id += 1;
        let mut items = vec![Value::from(id), Value::from(op)];
        items.extend(operands);
        let address = self.address.clone();
        let lost = |e: &dyn std::fmt::Display| Failure::Connection(format!("lost the connection to {address}: {e}"));
        write_frame(&mut self.stream, &Value::Array(items)).map_err(|e| lost(&e))?;
        let _ = self.stream.set_read_timeout(wait);
        let reply = match read_frame(&mut self.stream, MAX_REPLY) {
            Ok(Some(reply)) => reply,
            Ok(None) => return Err(lost(&"the server closed the connection")),
            Err(spindle_proto::FrameError::Io(e))
                if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) =>
            {
                let secs = wait.unwrap_or_default().as_secs_f64();
                return Err(Failure::Connection(format!("no reply from {address} within {secs} s")));
            }
            Err(e) => return Err(lost(&e)),
        };
        match reply {
            // Id 0: an error about the connection itself (plaintext to a TLS port, say).
            Value::Array(mut items)
                if items.len() == 3
                    && (items[0].as_u64() == Some(id)
                        || (items[0].as_u64() == Some(0) && items[1].as_u64() == Some(1))) =>
            {
                let result = items.pop().unwrap_or(Value::Nil);
                match items[1].as_u64() {
                    Some(0) => Ok(result),
                    _ => Err(Failure::Remote(remote(&result))),
                }
            }
            other => Err(Failure::Connection(format!("unexpected reply from {address}: {other}"))),
        }
    }

    fn next_seq(&mut self) -> Value {
        let seq = self.next_seq;
        self.next_seq += 1;
        Value::from(seq)
    }

    /// A recorded call's operands, which `build` makes from a fresh seq, then `acked` where
    /// the server takes it: the call's own seq (calls one at a time: every earlier one was
    /// answered, or given up and never sent again), so the server forgets their replies.
    fn numbered(&mut self, build: impl FnOnce(Value) -> Vec<Value>) -> Vec<Value> {
        let seq = self.next_seq();
        let acked = (self.acks && !self.pipelined).then(|| seq.clone());
        let mut operands = build(seq);
        operands.extend(acked);
        operands
    }

    /// `create`: `true` if the object was created, `false` if it existed.
    pub(crate) fn create(
        &mut self,
        type_name: &str,
        key: &str,
        args: Vec<Value>,
        owned: bool,
        persistent: bool,
    ) -> Result<bool, Failure> {
        let operands = self.numbered(|seq| {
            vec![
                seq,
                0.into(),
                type_name.into(),
                key.into(),
                Value::Array(args),
                owned.into(),
                persistent.into(),
            ]
        });
        let created = self.exchange("create", operands, Some(TIMEOUT))?;
        Ok(created.as_bool().unwrap_or(false))
    }

    /// A method call that answers at once (it never parks in the server).
    pub(crate) fn call(
        &mut self,
        type_name: &str,
        key: &str,
        method: &str,
        args: Vec<Value>,
    ) -> Result<Value, Failure> {
        self.call_waiting(type_name, key, method, args, Some(Duration::ZERO))
    }

    /// A method call that may park in the server (a barrier's `wait`, a queue's `get`):
    /// the reply may take `wait` (its own timeout; `None` for none) and then some.
    pub(crate) fn call_waiting(
        &mut self,
        type_name: &str,
        key: &str,
        method: &str,
        args: Vec<Value>,
        wait: Option<Duration>,
    ) -> Result<Value, Failure> {
        let operands = self.numbered(|seq| {
            vec![
                seq,
                0.into(),
                type_name.into(),
                key.into(),
                method.into(),
                Value::Array(args),
            ]
        });
        self.exchange("call", operands, wait.map(|w| w.saturating_add(TIMEOUT)))
    }

    /// `delete`: `true` if the object existed.
    pub(crate) fn delete(&mut self, key: &str) -> Result<bool, Failure> {
        let seq = self.next_seq();
        let existed = self.exchange("delete", vec![seq, key.into()], Some(TIMEOUT))?;
        Ok(existed.as_bool().unwrap_or(false))
    }

    /// The cluster map of the node (`cluster`).
    pub(crate) fn cluster(&mut self) -> Result<Value, String> {
        self.request("cluster", vec![])
    }

    /// In a cluster, the shard count and the shards this connection's node leads, after
    /// moving the connection to a node that leads one if this one leads none (`None` on a
    /// single server). Pipelined requests do not follow redirects: keys in these shards
    /// reach their leader.
    pub(crate) fn shards_led_here(&mut self) -> Result<Option<(usize, Vec<usize>)>, String> {
        let led = |map: &Value| -> Vec<usize> {
            groups(map)
                .iter()
                .filter(|g| field(g, "serving_here").and_then(Value::as_bool) == Some(true))
                .filter_map(|g| Some(field(g, "shard").and_then(Value::as_u64)? as usize))
                .collect()
        };
        let Some(mut map) = self.cluster_map().map_err(|e| e.to_string())? else {
            return Ok(None);
        };
        if led(&map).is_empty() {
            let leader = groups(&map)
                .iter()
                .find_map(|g| field(g, "leader_address").and_then(Value::as_str).map(str::to_string))
                .ok_or("no shard of the cluster has a leader at the moment (an election?); try again")?;
            self.reconnect(&leader)?;
            map = self.cluster()?;
        }
        let shards = field(&map, "shards").and_then(Value::as_u64).unwrap_or(1) as usize;
        let mine = led(&map);
        if mine.is_empty() {
            return Err("the node leads no shard at the moment (leadership is moving); try again".into());
        }
        Ok(Some((shards, mine)))
    }

    /// Ask the metadata group's leader to add `node`, reachable at `address`, to the cluster.
    pub(crate) fn join(&mut self, node: u64, address: &str) -> Result<Value, Failure> {
        self.exchange("join", vec![node.into(), address.into()], Some(TIMEOUT))
    }

    /// Show or change the users and roles (`action`: see docs/protocol.md, "acl"); in a
    /// cluster a change goes to the metadata group's leader.
    pub(crate) fn acl(&mut self, action: &str, operands: Vec<(&str, Value)>) -> Result<Value, String> {
        let operands = operands.into_iter().map(|(k, v)| (Value::from(k), v)).collect();
        self.exchange("acl", vec![action.into(), Value::Map(operands)], Some(TIMEOUT))
            .map_err(|e| match e {
                Failure::Remote(r) => format!("{}: {}", r.kind, r.message),
                Failure::Connection(message) => message,
            })
    }

    /// Ask the metadata group's leader to remove `node` from the cluster.
    pub(crate) fn leave(&mut self, node: u64) -> Result<Value, String> {
        self.request("leave", vec![node.into()])
    }

    /// The server's `status` map.
    pub(crate) fn status(&mut self) -> Result<Value, Failure> {
        self.exchange("status", vec![], Some(TIMEOUT))
    }

    /// The type of the named object `key`, if there is one (`objects` with it as prefix).
    /// In a cluster the node serving the key's shard is asked (a listing made during an
    /// election would miss the key): this connection moves to it.
    pub(crate) fn type_of(&mut self, key: &str) -> Result<Option<String>, Failure> {
        let mut tries = 0;
        while let Some(map) = self.cluster_map()? {
            let shards = field(&map, "shards").and_then(Value::as_u64).unwrap_or(1) as usize;
            let shard = spindle_server::shard_of(key, shards) as u64;
            let groups = groups(&map);
            let group = groups
                .iter()
                .find(|g| field(g, "shard").and_then(Value::as_u64) == Some(shard));
            let serving = group.and_then(|g| field(g, "serving_here")).and_then(Value::as_bool);
            if serving == Some(true) {
                break;
            }
            tries += 1;
            if tries > 100 {
                return Err(Failure::Connection(format!(
                    "no node serves the shard of {key} (an election that does not end?)"
                )));
            }
            match group.and_then(|g| field(g, "leader_address")).and_then(Value::as_str) {
                Some(leader) if leader != self.address => self.reconnect(leader).map_err(Failure::Connection)?,
                _ => std::thread::sleep(Duration::from_millis(100)), // an election
            }
        }
        let listing = self.exchange("objects", vec![key.into(), false.into()], Some(TIMEOUT))?;
        let found = listed(&listing).find_map(|(name, type_name)| (name == key).then_some(type_name));
        Ok(found)
    }

    /// Every object under `prefix`, unnamed ones too, with its size: `(key, type, bytes)`,
    /// sorted; in a cluster, from every node (see [`ask_every_node`](Self::ask_every_node)).
    pub(crate) fn all_objects(
        &mut self,
        prefix: &str,
        persistent: bool,
    ) -> Result<Vec<(String, String, Option<u64>)>, String> {
        let operands = vec![prefix.into(), persistent.into(), true.into()];
        let listings = self
            .ask_every_node("objects", operands)
            .map_err(|e| e.said("objects"))?;
        let mut rows: Vec<(String, String, Option<u64>)> = listings
            .iter()
            .filter_map(Value::as_array)
            .flatten()
            .filter_map(|row| {
                let row = row.as_array()?;
                let name = row.first()?.as_str()?.to_string();
                Some((
                    name,
                    row.get(1)?.as_str()?.to_string(),
                    row.get(2).and_then(Value::as_u64),
                ))
            })
            .collect();
        rows.sort_unstable();
        rows.dedup();
        Ok(rows)
    }

    /// The cluster map of the node this connection reaches (`None`: a single server).
    fn cluster_map(&mut self) -> Result<Option<Value>, Failure> {
        match self.exchange("cluster", vec![], Some(TIMEOUT)) {
            Ok(map) => Ok(Some(map)),
            Err(Failure::Remote(r)) if r.kind == "ValueError" => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// The named objects under `prefix` as `(name, type)`, sorted; in a cluster, from every
    /// node (see [`ask_every_node`](Self::ask_every_node)).
    pub(crate) fn objects(&mut self, prefix: &str, persistent: bool) -> Result<Vec<(String, String)>, Failure> {
        let listings = self.ask_every_node("objects", vec![Value::from(prefix), Value::Boolean(persistent)])?;
        let mut rows: Vec<(String, String)> = listings.iter().flat_map(listed).collect();
        rows.sort_unstable();
        rows.dedup();
        Ok(rows)
    }

    /// `op`'s reply from this node and, in a cluster, from every other: each node answers
    /// for the shards it leads. One that does not answer is skipped (its shards' new leaders
    /// answer for them once elected).
    fn ask_every_node(&mut self, op: &str, operands: Vec<Value>) -> Result<Vec<Value>, Failure> {
        let mut replies = vec![self.exchange(op, operands.clone(), Some(TIMEOUT))?];
        if let Some(map) = self.cluster_map()? {
            let here = field(&map, "node").and_then(Value::as_u64);
            let others = field(&map, "nodes")
                .and_then(Value::as_map)
                .cloned()
                .unwrap_or_default();
            for (node, address) in others {
                let Some(address) = address.as_str().filter(|_| node.as_u64() != here) else {
                    continue;
                };
                let reply = Client::connect(address)
                    .map_err(Failure::Connection)
                    .and_then(|mut c| c.exchange(op, operands.clone(), Some(TIMEOUT)));
                if let Ok(reply) = reply {
                    replies.push(reply);
                }
            }
        }
        Ok(replies)
    }
}

/// Pipelined requests, for `spindle sh` (sh.rs): many in flight on the connection, replies
/// read as they come.
impl Client {
    /// The key of this session's `n`th unnamed object.
    pub(crate) fn unnamed_key(&self, n: u64) -> String {
        spindle_proto::unnamed_key(&self.secret, n)
    }

    /// A fresh call number for a request sent with [`send`](Self::send) (the session
    /// acknowledges no more: the call's reply may be out when the next one goes).
    pub(crate) fn call_seq(&mut self) -> Value {
        self.pipelined = true;
        self.next_seq()
    }

    /// Send `[id, op, ...operands]` without waiting for its reply; returns the id.
    pub(crate) fn send(&mut self, op: &str, operands: Vec<Value>) -> Result<u64, Failure> {
        let id = self.next_id;
        self.next_id += 1;
        let mut items = vec![Value::from(id), Value::from(op)];
        items.extend(operands);
        write_frame(&mut self.stream, &Value::Array(items))
            .map_err(|e| Failure::Connection(format!("lost the connection to {}: {e}", self.address)))?;
        Ok(id)
    }

    /// The next reply, however long it takes: `(id, Ok(result))`, or `(id, Err([kind,
    /// message, data]))` for an error reply.
    pub(crate) fn receive(&mut self) -> Result<(u64, Result<Value, Value>), Failure> {
        let (id, status, result) = self.receive_frame()?;
        match status {
            0 => Ok((id, Ok(result))),
            _ => Ok((id, Err(result))),
        }
    }

    /// The next frame, however long it takes: `(id, status, value)`, status 0 a result, 1 an
    /// error `[kind, message, data]`, 2 progress of a request still running.
    pub(crate) fn receive_frame(&mut self) -> Result<(u64, u64, Value), Failure> {
        let address = self.address.clone();
        let lost = |e: &dyn std::fmt::Display| Failure::Connection(format!("lost the connection to {address}: {e}"));
        let _ = self.stream.set_read_timeout(None);
        let reply = read_frame(&mut self.stream, MAX_REPLY)
            .map_err(|e| lost(&e))?
            .ok_or_else(|| lost(&"the server closed the connection"))?;
        match reply {
            Value::Array(mut items) if items.len() == 3 => {
                let result = items.pop().unwrap_or(Value::Nil);
                let id = items[0].as_u64().unwrap_or(0);
                Ok((id, items[1].as_u64().unwrap_or(1), result))
            }
            other => Err(Failure::Connection(format!("unexpected reply from {address}: {other}"))),
        }
    }
}

/// One server address: the first of its resolved socket addresses that accepts, with TLS
/// when this process uses it (the handshake done, within [`TIMEOUT`]).
fn open_stream(address: &str) -> Result<Stream, String> {
    let tls = tls()?;
    let targets = address
        .to_socket_addrs()
        .map_err(|e| format!("bad server address '{address}': {e}"))?;
    let mut last_error = None;
    let mut socket = None;
    for target in targets {
        match TcpStream::connect_timeout(&target, TIMEOUT) {
            Ok(stream) => {
                socket = Some(stream);
                break;
            }
            Err(e) => last_error = Some(e),
        }
    }
    let Some(socket) = socket else {
        return Err(match last_error {
            Some(e) => format!("no Spindle server at {address} ({e})"),
            None => format!("bad server address '{address}': it resolves to nothing"),
        });
    };
    let _ = socket.set_nodelay(true);
    let _ = socket.set_read_timeout(Some(TIMEOUT));
    let Some(config) = tls else {
        return Ok(Stream::Plain(socket));
    };
    let host = address.rsplit_once(':').map_or(address, |(host, _)| host);
    let host = host.trim_start_matches('[').trim_end_matches(']');
    let failed = |e: &dyn std::fmt::Display| {
        format!(
            "TLS with {address} failed: {e} (does the server speak TLS, and did the CA of --tls-ca / SPINDLE_TLS_CA sign its certificate?)"
        )
    };
    let name = rustls::pki_types::ServerName::try_from(host.to_string()).map_err(|e| failed(&e))?;
    let mut conn = ClientConnection::new(config, name).map_err(|e| failed(&e))?;
    let mut socket = socket;
    while conn.is_handshaking() {
        conn.complete_io(&mut socket).map_err(|e| failed(&e))?;
    }
    Ok(Stream::Tls(Box::new(StreamOwned::new(conn, socket))))
}

/// A fresh session secret: 16 bytes from the kernel, in hex (no fallback: a guessable
/// secret would hand the session to whoever guesses it).
fn new_secret() -> Result<String, String> {
    let bytes = urandom().map_err(|e| format!("cannot read /dev/urandom for a session secret: {e}"))?;
    Ok(bytes.iter().map(|b| format!("{b:02x}")).collect())
}

/// A token or key: 32 bytes from the kernel, in hex (no fallback either).
pub(crate) fn new_token() -> Result<String, String> {
    Ok(format!("{}{}", new_secret()?, new_secret()?))
}

/// 16 random bytes from the kernel.
fn urandom() -> std::io::Result<[u8; 16]> {
    let mut bytes = [0u8; 16];
    std::fs::File::open("/dev/urandom").and_then(|mut f| f.read_exact(&mut bytes))?;
    Ok(bytes)
}

/// 16 random bytes from the kernel; without /dev/urandom, the clock and the pid (unique
/// enough for ids, which is all they are for).
pub(crate) fn random_bytes() -> [u8; 16] {
    urandom().unwrap_or_else(|_| {
        let nanos = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_nanos());
        (nanos ^ u128::from(std::process::id()) << 64).to_le_bytes()
    })
}

/// An error reply's `[kind, message, data]`.
pub(crate) fn remote(error: &Value) -> Remote {
    let part = |i: usize| error.as_array().and_then(|p| p.get(i)).and_then(Value::as_str);
    Remote {
        kind: part(0).unwrap_or("?").to_string(),
        message: part(1).map_or_else(|| error.to_string(), str::to_string),
        data: error.as_array().and_then(|p| p.get(2)).cloned().unwrap_or(Value::Nil),
    }
}

/// The value under `name` in a map (nil-free: `None` when absent or not a map).
pub(crate) fn field<'a>(map: &'a Value, name: &str) -> Option<&'a Value> {
    map.as_map()?
        .iter()
        .find(|(k, _)| k.as_str() == Some(name))
        .map(|(_, v)| v)
}

/// The shard groups of a cluster map (`cluster`).
pub(crate) fn groups(map: &Value) -> Vec<Value> {
    field(map, "groups")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default()
}

/// The `(name, type)` rows of an `objects` listing.
fn listed(listing: &Value) -> impl Iterator<Item = (String, String)> + '_ {
    listing.as_array().into_iter().flatten().filter_map(|item| {
        let pair = item.as_array()?;
        Some((pair.first()?.as_str()?.to_string(), pair.get(1)?.as_str()?.to_string()))
    })
}

fn format_uptime(seconds: f64) -> String {
    let total = seconds.max(0.0) as u64;
    let (days, hours, minutes, secs) = (total / 86_400, total / 3600 % 24, total / 60 % 60, total % 60);
    match (days, hours, minutes) {
        (0, 0, 0) => format!("{secs}s"),
        (0, 0, _) => format!("{minutes}m {secs:02}s"),
        (0, _, _) => format!("{hours}h {minutes:02}m {secs:02}s"),
        _ => format!("{days}d {hours:02}h {minutes:02}m"),
    }
}

/// `spindle status [--json] [--watch [SECONDS]]`.
pub fn status(address: &str, json: bool, watch: Option<f64>) -> Result<(), String> {
    let mut client = Client::connect(address)?;
    loop {
        let status = client.request("status", vec![])?;
        match json {
            true => println!("{}", to_json(&status)),
            false => print_status(&status),
        }
        let Some(seconds) = watch else { return Ok(()) };
        std::thread::sleep(Duration::try_from_secs_f64(seconds.max(0.1)).unwrap_or(Duration::from_secs(2)));
        if !json {
            println!();
        }
    }
}

/// A MessagePack value as JSON (bytes as an array of numbers; map keys as strings).
pub(crate) fn to_json(value: &Value) -> String {
    let list = |items: Vec<String>| format!("[{}]", items.join(","));
    match value {
        Value::Nil => "null".into(),
        Value::Boolean(b) => b.to_string(),
        Value::Integer(n) => n.to_string(),
        Value::F32(x) if x.is_finite() => x.to_string(),
        Value::F64(x) if x.is_finite() => x.to_string(),
        Value::F32(_) | Value::F64(_) => "null".into(),
        Value::String(s) => json_string(&String::from_utf8_lossy(s.as_bytes())),
        Value::Binary(b) | Value::Ext(_, b) => list(b.iter().map(u8::to_string).collect()),
        Value::Array(items) => list(items.iter().map(to_json).collect()),
        Value::Map(entries) => {
            let fields: Vec<String> = entries
                .iter()
                .map(|(k, v)| {
                    let key = k.as_str().map_or_else(|| json_string(&k.to_string()), json_string);
                    format!("{key}:{}", to_json(v))
                })
                .collect();
            format!("{{{}}}", fields.join(","))
        }
    }
}

fn json_string(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if (c as u32) < 0x20 => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

fn print_status(status: &Value) {
    let text = |name: &str| match field(status, name) {
        Some(Value::String(s)) => s.as_str().unwrap_or("?").to_string(),
        Some(Value::F64(x)) => format!("{x:.1}"),
        Some(Value::F32(x)) => format!("{x:.1}"),
        Some(Value::Nil) => "-".to_string(),
        Some(other) => other.to_string(),
        None => "?".to_string(),
    };
    let uptime = field(status, "uptime")
        .and_then(Value::as_f64)
        .map_or("?".into(), format_uptime);
    let memory = match text("max_memory").as_str() {
        "0" => format!("{} bytes (no limit)", text("memory_used")),
        limit => format!("{} of {limit} bytes", text("memory_used")),
    };
    let rows = [
        ("address", text("address")),
        ("version", text("version")),
        ("pid", text("pid")),
        ("uptime", uptime),
        ("objects", text("objects")),
        ("persistent", text("persistent_objects")),
        ("data dir", text("data_dir")),
        ("memory", memory),
        ("connections", text("connections")),
        ("sessions", text("sessions")),
        ("partitions", text("partitions")),
        ("calls", text("calls")),
        ("calls/s", text("calls_per_s")),
        ("workers", format!("{} of {}", text("workers"), text("max_workers"))),
        ("busy", text("busy")),
        ("queued", text("queued")),
        ("invocations/s", text("invocations_per_s")),
        ("containment", text("containment")),
        (
            "transactions",
            format!(
                "{} committed, {} aborted, {} in flight",
                text("transactions_committed"),
                text("transactions_aborted"),
                text("transactions_open")
            ),
        ),
    ];
    for (label, value) in rows {
        println!("{label:<14} {value}");
    }
}

/// `spindle define FILE.wasm [--name NAME]`: define the module as `wasm:NAME` at its version
/// (the SHA-256 of its bytes, as the SDKs name it) and print one method per line.
pub fn define(address: &str, file: &std::path::Path, name: Option<&str>) -> Result<(), String> {
    use sha2::{Digest, Sha256};

    let code = std::fs::read(file).map_err(|e| format!("cannot read {}: {e}", file.display()))?;
    let name = match name {
        Some(name) => name.to_string(),
        None => file
            .file_stem()
            .and_then(|s| s.to_str())
            .filter(|s| !s.is_empty())
            .ok_or_else(|| format!("{} has no file name to name the type: use --name", file.display()))?
            .to_string(),
    };
    let version: String = Sha256::digest(&code).iter().map(|b| format!("{b:02x}")).collect();
    let type_name = format!("{}{name}", spindle_core::objects::compiled::WASM_PREFIX);
    let mut client = Client::connect(address)?;
    let reply = client.request(
        "define",
        vec![type_name.as_str().into(), version.as_str().into(), Value::Binary(code)],
    )?;
    let methods = reply
        .as_array()
        .ok_or_else(|| format!("define answered {reply}, not the methods"))?;
    eprintln!("defined {type_name} (version {})", &version[..12]);
    for method in methods {
        println!("{}", method.as_str().unwrap_or_default());
    }
    Ok(())
}

/// `spindle objects [PREFIX] [--persistent]`: one `name  type` line per named object.
pub fn objects(address: &str, prefix: &str, persistent: bool, all: bool) -> Result<(), String> {
    let mut client = Client::connect(address)?;
    let rows: Vec<(String, String, Option<u64>)> = match all {
        false => client
            .objects(prefix, persistent)
            .map_err(|e| e.to_string())?
            .into_iter()
            .map(|(name, type_name)| (name, type_name, None))
            .collect(),
        true => client.all_objects(prefix, persistent)?,
    };
    if rows.is_empty() {
        // On stderr: a listing piped elsewhere stays empty.
        let which = match (persistent, all) {
            (true, _) => "persistent objects",
            (false, true) => "objects",
            (false, false) => "named objects",
        };
        let prefix = if prefix.is_empty() {
            String::new()
        } else {
            format!(" starting with {prefix:?}")
        };
        eprintln!("no {which}{prefix} on {address}");
        return Ok(());
    }
    let width = rows.iter().map(|(name, ..)| name.chars().count()).max().unwrap_or(0);
    let type_width = rows.iter().map(|(_, t, _)| t.chars().count()).max().unwrap_or(0);
    for (name, type_name, size) in rows {
        match size {
            Some(size) => println!("{name:<width$}  {type_name:<type_width$}  {size}"),
            None => println!("{name:<width$}  {type_name}"),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::format_uptime;

    #[test]
    fn uptime_reads_naturally() {
        assert_eq!(format_uptime(4.7), "4s");
        assert_eq!(format_uptime(65.0), "1m 05s");
        assert_eq!(format_uptime(3.0 * 3600.0 + 61.0), "3h 01m 01s");
        assert_eq!(format_uptime(2.0 * 86_400.0 + 3600.0), "2d 01h 00m");
    }
}
