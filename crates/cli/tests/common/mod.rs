//! Test harness: the real `spindle` binary in a child process, and a tiny protocol client
//! written here from docs/protocol.md (independent of the server's own codec).

#![allow(dead_code)]

pub mod fake_python;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::process::{Child, ChildStdin, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

pub use rmpv::Value;

/// Reads never block a test forever: a missing reply fails the test instead.
const READ_TIMEOUT: Duration = Duration::from_secs(30);
/// Upper bound for conditions that become true asynchronously (a close being noticed).
const EVENTUALLY: Duration = Duration::from_secs(30);

pub struct Server {
    child: Child,
    stdin: Option<ChildStdin>,
    pub address: String,
}

impl Server {
    /// Start `spindle server --port 0 <extra>` and wait for its listening line.
    pub fn start(extra: &[&str]) -> Server {
        let mut child = Command::new(env!("CARGO_BIN_EXE_spindle"))
            .args(["server", "--port", "0"])
            .args(extra)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(if std::env::var_os("SPINDLE_TEST_LOG").is_some() {
                Stdio::inherit()
            } else {
                Stdio::null()
            })
            .spawn()
            .expect("spawn spindle server");
        let stdin = child.stdin.take();
        let mut line = String::new();
        BufReader::new(child.stdout.take().expect("stdout"))
            .read_line(&mut line)
            .expect("read the listening line");
        let address = line
            .trim_end()
            .strip_prefix("spindle listening on ")
            .unwrap_or_else(|| panic!("unexpected first line {line:?}"))
            .to_string();
        assert!(!address.ends_with(":0"), "the real port is printed: {address}");
        Server { child, stdin, address }
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// A raw connection (no hello).
    pub fn connect(&self) -> Conn {
        Conn::connect(&self.address)
    }

    /// A connection that said hello as `client`.
    pub fn session(&self, client: &str) -> Conn {
        let mut conn = self.connect();
        let hello = conn.hello(client);
        assert_eq!(field(&hello, "server"), &Value::from("spindle"));
        conn
    }

    pub fn signal(&self, name: &str) {
        let status = Command::new("kill")
            .args([format!("-{name}"), self.pid().to_string()])
            .status()
            .expect("run kill");
        assert!(status.success());
    }

    pub fn close_stdin(&mut self) {
        self.stdin.take();
    }

    /// Wait for the process to exit (failing the test if it does not within a generous bound).
    pub fn wait_exit(&mut self) -> ExitStatus {
        let deadline = Instant::now() + EVENTUALLY;
        loop {
            if let Some(status) = self.child.try_wait().expect("try_wait") {
                return status;
            }
            assert!(Instant::now() < deadline, "server did not exit");
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// The `status` map, read on a fresh connection.
    pub fn status(&self) -> Value {
        let mut conn = self.session("status-probe");
        conn.request("status", vec![]).expect("status")
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        // SIGTERM first: a server that shuts down stops its worker processes, while one
        // killed outright would leave stand-in workers (tests/functions.rs) behind.
        if let Ok(None) = self.child.try_wait() {
            let _ = Command::new("kill").args(["-TERM", &self.pid().to_string()]).status();
            let deadline = Instant::now() + Duration::from_secs(10);
            while Instant::now() < deadline && matches!(self.child.try_wait(), Ok(None)) {
                std::thread::sleep(Duration::from_millis(5));
            }
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// An error reply: `[kind, message, data]`.
#[derive(Debug, Clone, PartialEq)]
pub struct Remote {
    pub kind: String,
    pub message: String,
    pub data: Value,
}

pub type Reply = Result<Value, Remote>;

pub struct Conn {
    pub stream: TcpStream,
    next_id: u64,
    next_seq: u64,
}

impl Conn {
    pub fn connect(address: &str) -> Conn {
        let stream = TcpStream::connect(address).expect("connect");
        stream.set_read_timeout(Some(READ_TIMEOUT)).expect("timeout");
        stream.set_nodelay(true).expect("nodelay");
        Conn {
            stream,
            next_id: 1,
            next_seq: 1,
        }
    }

    pub fn next_id(&mut self) -> u64 {
        let id = self.next_id;
        self.next_id += 1;
        id
    }

    pub fn next_seq(&mut self) -> u64 {
        let seq = self.next_seq;
        self.next_seq += 1;
        seq
    }

    pub fn send_raw(&mut self, bytes: &[u8]) {
        self.stream.write_all(bytes).expect("write");
    }

    pub fn send(&mut self, value: &Value) {
        let bytes = frame(value);
        self.send_raw(&bytes);
    }

    /// The next frame, or `None` when the server closed the connection.
    pub fn recv(&mut self) -> Option<Value> {
        let mut header = [0u8; 4];
        match self.stream.read_exact(&mut header) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return None,
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => return None,
            Err(e) => panic!("read failed: {e}"),
        }
        let mut body = vec![0u8; u32::from_be_bytes(header) as usize];
        self.stream.read_exact(&mut body).expect("read body");
        let mut slice = &body[..];
        let value = rmpv::decode::read_value(&mut slice).expect("reply is MessagePack");
        assert!(slice.is_empty(), "one value per frame");
        Some(value)
    }

    /// The next reply as `(id, result)`.
    pub fn recv_reply(&mut self) -> (u64, Reply) {
        let frame = self.recv().expect("a reply, not a closed connection");
        parse_reply(&frame)
    }

    /// Send `[id, op, ...operands]` and wait for its reply (no other request in flight).
    pub fn request(&mut self, op: &str, operands: Vec<Value>) -> Reply {
        let id = self.next_id();
        self.send(&request(id, op, operands));
        let (got, reply) = self.recv_reply();
        assert_eq!(got, id, "reply id");
        reply
    }

    pub fn hello(&mut self, client: &str) -> Value {
        let map = Value::Map(vec![
            (Value::from("client"), Value::from(client)),
            (Value::from("protocol"), Value::from(1)),
        ]);
        self.request("hello", vec![map]).expect("hello")
    }

    pub fn create(&mut self, type_name: &str, key: &str, args: Vec<Value>, owned: bool) -> Reply {
        let seq = self.next_seq();
        self.request(
            "create",
            vec![
                seq.into(),
                0.into(),
                type_name.into(),
                key.into(),
                Value::Array(args),
                owned.into(),
            ],
        )
    }

    pub fn call_seq(&mut self, seq: u64, type_name: &str, key: &str, method: &str, args: Vec<Value>) -> Reply {
        self.request("call", call_operands(seq, type_name, key, method, args))
    }

    pub fn call(&mut self, type_name: &str, key: &str, method: &str, args: Vec<Value>) -> Reply {
        let seq = self.next_seq();
        self.call_seq(seq, type_name, key, method, args)
    }

    /// Send a call without waiting; returns its request id.
    pub fn send_call(&mut self, type_name: &str, key: &str, method: &str, args: Vec<Value>) -> u64 {
        let (id, seq) = (self.next_id(), self.next_seq());
        self.send(&request(id, "call", call_operands(seq, type_name, key, method, args)));
        id
    }

    /// Assert that the server closes the connection without sending anything more.
    pub fn expect_closed(&mut self) {
        if let Some(frame) = self.recv() {
            panic!("expected the connection to close, got {frame}");
        }
    }
}

pub fn call_operands(seq: u64, type_name: &str, key: &str, method: &str, args: Vec<Value>) -> Vec<Value> {
    vec![
        seq.into(),
        0.into(),
        type_name.into(),
        key.into(),
        method.into(),
        Value::Array(args),
    ]
}

pub fn request(id: u64, op: &str, operands: Vec<Value>) -> Value {
    let mut items = vec![Value::from(id), Value::from(op)];
    items.extend(operands);
    Value::Array(items)
}

pub fn frame(value: &Value) -> Vec<u8> {
    let mut body = Vec::new();
    rmpv::encode::write_value(&mut body, value).expect("encode");
    let mut bytes = (body.len() as u32).to_be_bytes().to_vec();
    bytes.extend(body);
    bytes
}

pub fn parse_reply(frame: &Value) -> (u64, Reply) {
    let items = frame.as_array().unwrap_or_else(|| panic!("reply is an array: {frame}"));
    assert_eq!(items.len(), 3, "reply has 3 items: {frame}");
    let id = items[0].as_u64().expect("reply id");
    match items[1].as_u64() {
        Some(0) => (id, Ok(items[2].clone())),
        Some(1) => {
            let error = items[2].as_array().expect("error triple");
            assert_eq!(error.len(), 3, "error has 3 items: {frame}");
            (
                id,
                Err(Remote {
                    kind: error[0].as_str().expect("kind").to_string(),
                    message: error[1].as_str().expect("message").to_string(),
                    data: error[2].clone(),
                }),
            )
        }
        _ => panic!("bad reply status: {frame}"),
    }
}

pub fn field<'a>(map: &'a Value, name: &str) -> &'a Value {
    map.as_map()
        .unwrap_or_else(|| panic!("a map: {map}"))
        .iter()
        .find(|(k, _)| k.as_str() == Some(name))
        .map(|(_, v)| v)
        .unwrap_or_else(|| panic!("no field {name} in {map}"))
}

/// The error kind of a reply that must be an error.
pub fn kind(reply: Reply) -> String {
    match reply {
        Ok(v) => panic!("expected an error, got {v}"),
        Err(e) => e.kind,
    }
}

/// An exact probe for "calls are parked on this object", one that moves nothing: the
/// counterpart of `has_parked_callers` in tests/conftest.py.
///
/// The server refuses `keep` under a new name with `Busy` ("... has parked callers ...")
/// while calls are parked on the object, and it checks that before it looks at the new name
/// (docs/protocol.md, `keep`). The probe asks to keep the object under the name of another
/// object in the same shard: when nobody is parked, the move fails with `TypeMismatch`
/// ("'NAME' is already a ...") and the object is put back under the same hold of the shard's
/// lock, so no call ever finds it missing (`Shards::keep`, crates/server/src/shards.rs).
/// Any other answer fails the test.
pub struct ParkedProbe {
    conn: Conn,
    type_name: String,
    key: String,
    /// The placeholder object the probe tries to move onto, in the key's shard.
    taken: String,
}

impl ParkedProbe {
    pub fn new(server: &Server, type_name: &str, key: &str) -> ParkedProbe {
        let mut conn = server.session("parked-probe");
        let status = conn.request("status", vec![]).expect("status");
        let partitions = field(&status, "partitions").as_u64().expect("partitions is a count") as usize;
        assert!(partitions > 0, "a server has shards: {status}");
        let shard = spindle_server::shard_of(key, partitions);
        let taken = (0..)
            .map(|i| format!("parked-probe.{i}"))
            .find(|name| name != key && spindle_server::shard_of(name, partitions) == shard)
            .expect("a name in the key's shard");
        conn.create("Counter", &taken, vec![], false)
            .expect("the probe's placeholder object");
        ParkedProbe {
            conn,
            type_name: type_name.to_string(),
            key: key.to_string(),
            taken,
        }
    }

    /// Whether calls are parked on the object right now (false while it does not exist).
    pub fn parked(&mut self) -> bool {
        let seq = self.conn.next_seq();
        let reply = self.conn.request(
            "keep",
            vec![
                seq.into(),
                self.type_name.as_str().into(),
                self.key.as_str().into(),
                self.taken.as_str().into(),
            ],
        );
        match reply {
            Err(e) if e.kind == "Busy" && e.message.contains("parked") => true,
            Err(e) if e.kind == "TypeMismatch" && e.message.starts_with(&format!("'{}' is already a", self.taken)) => {
                false
            }
            Err(e) if e.kind == "NotFound" => false,
            other => panic!(
                "probing {} '{}' for parked calls: unexpected answer {other:?}",
                self.type_name, self.key
            ),
        }
    }
}

/// Poll `condition` until it holds; fails the test after a generous bound.
pub fn eventually(what: &str, mut condition: impl FnMut() -> bool) {
    let deadline = Instant::now() + EVENTUALLY;
    while !condition() {
        assert!(Instant::now() < deadline, "timed out waiting for: {what}");
        std::thread::sleep(Duration::from_millis(10));
    }
}
