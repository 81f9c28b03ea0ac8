//! User-defined objects and their object hosts, with stand-in host processes
//! (`common::fake_python`): the test speaks the host protocol on the host's behalf. The real
//! Python host is covered by the pytest suite.

mod common;

use common::fake_python::{Announced, FakePython};
use common::{eventually, field, kind, request, Conn, Remote, Server, Value};

const T: &str = "py:__main__.Centroids";

fn map(entries: Vec<(&str, Value)>) -> Value {
    Value::Map(entries.into_iter().map(|(k, v)| (k.into(), v)).collect())
}

fn define(conn: &mut Conn, version: &str, code: &[u8]) -> common::Reply {
    conn.request("define", vec![T.into(), version.into(), Value::Binary(code.to_vec())])
}

/// Send `create` of a `T` without waiting (its reply comes when the host constructed it).
fn send_create(conn: &mut Conn, key: &str, version: &str, args: Vec<Value>) -> u64 {
    let (id, seq) = (conn.next_id(), conn.next_seq());
    let ctor = vec![version.into(), Value::Array(args), map(vec![])];
    conn.send(&request(
        id,
        "create",
        vec![
            seq.into(),
            0.into(),
            T.into(),
            key.into(),
            Value::Array(ctor),
            false.into(),
        ],
    ));
    id
}

fn send_call(conn: &mut Conn, seq: u64, key: &str, method: &str, args: Vec<Value>) -> u64 {
    let id = conn.next_id();
    let operands = common::call_operands(seq, T, key, method, vec![Value::Array(args), map(vec![])]);
    conn.send(&request(id, "call", operands));
    id
}

/// The reply to request `id`, which must come next.
fn reply_to(conn: &mut Conn, id: u64) -> common::Reply {
    let (got, reply) = conn.recv_reply();
    assert_eq!(got, id, "reply id");
    reply
}

fn lost_reason(error: &Remote) -> &str {
    assert_eq!(error.kind, "ObjectLost", "{error:?}");
    field(&error.data, "reason").as_str().expect("reason")
}

/// The test speaking for an object host on its connection.
struct HostConn {
    conn: Conn,
}

impl HostConn {
    fn connect(server: &Server, host: &Announced) -> HostConn {
        let mut conn = server.connect();
        let hello = map(vec![("id", host.secret.as_str().into()), ("pid", host.pid.into())]);
        assert_eq!(conn.request("host", vec![hello]), Ok(Value::Boolean(true)));
        HostConn { conn }
    }

    /// The next request: `(rid, op, operands)`.
    fn request(&mut self) -> (u64, String, Vec<Value>) {
        let frame = self.conn.recv().expect("a request");
        let items = frame.as_array().expect("an array").clone();
        let op = items[1].as_str().expect("op").to_string();
        (items[0].as_u64().expect("rid"), op, items[2..].to_vec())
    }

    fn answer(&mut self, rid: u64, result: Value) {
        self.conn.send(&Value::Array(vec![rid.into(), 0.into(), result]));
    }

    fn fail(&mut self, rid: u64, kind: &str, message: &str) {
        let error = Value::Array(vec![kind.into(), message.into(), Value::Nil]);
        self.conn.send(&Value::Array(vec![rid.into(), 1.into(), error]));
    }
}

/// The host process `pid` was killed and reaped, and the server counts no host.
fn gone(server: &Server, pid: u32) {
    eventually("the host process is gone", || {
        !std::path::Path::new(&format!("/proc/{pid}")).exists()
    });
    eventually("no host in status", || {
        field(&server.status(), "object_hosts") == &Value::from(0)
    });
}

/// A server with stand-in hosts, one slot so every object shares one host.
fn start(python: &FakePython, extra: &[&str]) -> Server {
    let path = python.path();
    let mut args = vec!["--python", path.as_str(), "--object-hosts", "1"];
    args.extend_from_slice(extra);
    Server::start(&args)
}

#[test]
fn objects_are_constructed_and_called_in_their_host() {
    let python = FakePython::waiting();
    let server = start(&python, &[]);
    let mut client = server.session("client");
    assert_eq!(
        kind(client.create(T, "c", vec!["v1".into(), Value::Array(vec![]), map(vec![])], false)),
        "UnknownType"
    );
    assert_eq!(define(&mut client, "v1", b"CODE"), Ok(Value::Boolean(true)));
    assert_eq!(
        define(&mut client, "v1", b"CODE"),
        Ok(Value::Boolean(true)),
        "the same version again"
    );
    let create = send_create(&mut client, "c", "v1", vec![3.into()]);
    let update = send_call(&mut client, 100, "c", "update", vec![1.into()]);
    let announced = python.next();
    assert_eq!(
        announced.token.len(),
        48,
        "the server's made-up token: {}",
        announced.token
    );
    let mut host = HostConn::connect(&server, &announced);
    let (rid, op, operands) = host.request();
    assert_eq!(op, "construct");
    assert_eq!(
        operands,
        vec![
            "c".into(),
            T.into(),
            "v1".into(),
            Value::Binary(b"CODE".to_vec()),
            Value::Array(vec![3.into()]),
            map(vec![]),
        ]
    );
    host.answer(rid, Value::Nil);
    assert_eq!(reply_to(&mut client, create), Ok(Value::Boolean(true)));
    let (rid, op, operands) = host.request();
    assert_eq!(
        (op.as_str(), &operands[..2]),
        ("call", &["c".into(), "update".into()][..])
    );
    let status = server.status();
    assert_eq!(field(&status, "object_hosts"), &Value::from(1));
    assert_eq!(field(&status, "hosted_objects"), &Value::from(1));
    assert_eq!(field(&status, "object_calls_in_flight"), &Value::from(1));
    host.answer(rid, 42.into());
    assert_eq!(reply_to(&mut client, update), Ok(42.into()));
    // Exactly-once: the same seq gets the recorded reply, and the host sees nothing.
    let again = send_call(&mut client, 100, "c", "update", vec![1.into()]);
    assert_eq!(reply_to(&mut client, again), Ok(42.into()));
    // A raising method; private methods never reach the host.
    let bad = send_call(&mut client, 101, "c", "explode", vec![]);
    let (rid, _, _) = host.request();
    host.fail(rid, "Raised", "ValueError: no");
    assert_eq!(reply_to(&mut client, bad).unwrap_err().kind, "Raised");
    let private = send_call(&mut client, 102, "c", "_state", vec![]);
    assert_eq!(reply_to(&mut client, private).unwrap_err().kind, "UnknownMethod");
    // A second object: the host has the code already. Its key exists: `false` at once.
    let other = send_create(&mut client, "d", "v1", vec![]);
    let (rid, op, operands) = host.request();
    assert_eq!((op.as_str(), &operands[3]), ("construct", &Value::Nil));
    host.answer(rid, Value::Nil);
    assert_eq!(reply_to(&mut client, other), Ok(Value::Boolean(true)));
    let existing = send_create(&mut client, "d", "v1", vec![]);
    assert_eq!(reply_to(&mut client, existing), Ok(Value::Boolean(false)));
    // Delete drops the instance from its host.
    assert_eq!(client.request("delete", vec![900.into(), "d".into()]), Ok(true.into()));
    let (rid, op, operands) = host.request();
    assert_eq!((op.as_str(), operands), ("drop", vec!["d".into()]));
    host.answer(rid, Value::Nil);
    let names = client.request("objects", vec![]).expect("objects");
    assert_eq!(names, Value::Array(vec![Value::Array(vec!["c".into(), T.into()])]));
}

#[test]
fn a_new_version_waits_until_no_object_of_the_old_one_exists() {
    let python = FakePython::waiting();
    let server = start(&python, &[]);
    let mut client = server.session("client");
    define(&mut client, "v1", b"ONE").expect("define");
    let create = send_create(&mut client, "c", "v1", vec![]);
    let mut host = HostConn::connect(&server, &python.next());
    let (rid, _, _) = host.request();
    host.answer(rid, Value::Nil);
    reply_to(&mut client, create).expect("created");
    let e = define(&mut client, "v2", b"TWO").unwrap_err();
    assert_eq!(e.kind, "TypeMismatch");
    assert!(e.message.contains("v1") && e.message.contains("v2"), "{}", e.message);
    let e = client.create(T, "x", vec!["v2".into(), Value::Array(vec![]), map(vec![])], false);
    assert_eq!(kind(e), "UnknownType");
    client.request("delete", vec![900.into(), "c".into()]).expect("delete");
    assert_eq!(define(&mut client, "v2", b"TWO"), Ok(Value::Boolean(true)));
    let create = send_create(&mut client, "c", "v2", vec![]);
    let (rid, op, _) = host.request();
    assert_eq!(op, "drop");
    host.answer(rid, Value::Nil);
    let (rid, op, operands) = host.request();
    assert_eq!(
        (op.as_str(), &operands[3]),
        ("construct", &Value::Binary(b"TWO".to_vec()))
    );
    host.fail(rid, "Raised", "TypeError: bad");
    let e = reply_to(&mut client, create).unwrap_err();
    assert_eq!((e.kind.as_str(), e.message.as_str()), ("Raised", "TypeError: bad"));
    assert_eq!(
        field(&server.status(), "hosted_objects"),
        &Value::from(0),
        "a failed constructor leaves nothing"
    );
}

/// A connection whose hello, without the server's token, was refused.
/// A hello without the token, with the requests `after` sends right behind it: the refusal
/// comes back, then the connection closes, and nothing sent after the hello runs.
fn refused_hello(server: &Server, after: impl FnOnce(&mut Conn)) {
    let mut conn = server.connect();
    let hello = map(vec![("client", "anonymous".into()), ("protocol", 1.into())]);
    let id = conn.next_id();
    conn.send(&request(id, "hello", vec![hello]));
    after(&mut conn);
    let (got, reply) = conn.recv_reply();
    assert_eq!((got, kind(reply)), (id, "Unauthorized".to_string()));
    assert!(conn.recv().is_none(), "the connection closes after a refused hello");
}

#[test]
fn running_code_needs_the_token_and_hosts_get_it() {
    let python = FakePython::waiting();
    let server = start(&python, &["--token", "sekrit"]);
    refused_hello(&server, |anonymous| {
        let id = anonymous.next_id();
        let code = Value::Binary(b"C".to_vec());
        anonymous.send(&request(id, "define", vec![T.into(), "v1".into(), code]));
        send_create(anonymous, "c", "v1", vec![]);
    });
    let mut client = server.connect();
    let hello = map(vec![
        ("client", "c".into()),
        ("protocol", 1.into()),
        ("token", "sekrit".into()),
    ]);
    client.request("hello", vec![hello]).expect("hello");
    define(&mut client, "v1", b"C").expect("define");
    send_create(&mut client, "c", "v1", vec![]);
    let announced = python.next();
    assert_eq!(announced.token, "sekrit");
    // Only the ids the server handed out are hosts.
    let mut impostor = server.connect();
    let fake = map(vec![(
        "id",
        format!("{}-00", announced.secret.split('-').next().unwrap()).into(),
    )]);
    assert_eq!(kind(impostor.request("host", vec![fake])), "Unauthorized");
}

#[test]
fn a_host_that_exits_loses_its_objects_and_is_replaced() {
    let python = FakePython::waiting();
    let server = start(&python, &[]);
    let mut client = server.session("client");
    define(&mut client, "v1", b"C").expect("define");
    let create = send_create(&mut client, "c", "v1", vec![]);
    let first = python.next();
    let mut host = HostConn::connect(&server, &first);
    let (rid, _, _) = host.request();
    host.answer(rid, Value::Nil);
    reply_to(&mut client, create).expect("created");
    let running = send_call(&mut client, 50, "c", "update", vec![]);
    host.request();
    python.exit(first.pid, 3);
    let e = reply_to(&mut client, running).unwrap_err();
    assert_eq!(lost_reason(&e), "its object host exited with status 3");
    // Later calls are lost too, without a host; the retry of the lost call gets its reply.
    let later = send_call(&mut client, 51, "c", "update", vec![]);
    assert_eq!(
        lost_reason(&reply_to(&mut client, later).unwrap_err()),
        "its object host exited with status 3"
    );
    let retry = send_call(&mut client, 50, "c", "update", vec![]);
    assert_eq!(reply_to(&mut client, retry).unwrap_err().kind, "ObjectLost");
    eventually("the host is gone from status", || {
        field(&server.status(), "object_hosts") == &Value::from(0)
    });
    // A lost object holds no instance: a fixed class may be defined, and a create of the lost
    // key constructs a fresh object of it on a new host.
    assert_eq!(field(&server.status(), "hosted_objects"), &Value::from(0));
    assert_eq!(define(&mut client, "v2", b"C2"), Ok(Value::Boolean(true)));
    let create = send_create(&mut client, "c", "v2", vec![]);
    let second = python.next();
    assert_ne!(second.pid, first.pid);
    let mut host = HostConn::connect(&server, &second);
    let (rid, op, operands) = host.request();
    assert_eq!(
        (op.as_str(), &operands[3]),
        ("construct", &Value::Binary(b"C2".to_vec()))
    );
    host.answer(rid, Value::Nil);
    assert_eq!(reply_to(&mut client, create), Ok(Value::Boolean(true)));
}

#[test]
fn a_call_past_the_timeout_restarts_its_host() {
    let python = FakePython::waiting();
    let server = start(&python, &["--object-call-timeout", "0.3"]);
    let mut client = server.session("client");
    define(&mut client, "v1", b"C").expect("define");
    let create = send_create(&mut client, "c", "v1", vec![]);
    let announced = python.next();
    let mut host = HostConn::connect(&server, &announced);
    let (rid, _, _) = host.request();
    host.answer(rid, Value::Nil);
    reply_to(&mut client, create).expect("created");
    let hang = send_call(&mut client, 7, "c", "update", vec![]);
    let queued = send_call(&mut client, 8, "c", "update", vec![]);
    host.request();
    host.request();
    let e = reply_to(&mut client, hang).unwrap_err();
    assert_eq!(
        lost_reason(&e),
        "Centroids.update ran longer than the object call timeout (0.3 s); its host was restarted"
    );
    assert_eq!(reply_to(&mut client, queued).unwrap_err().kind, "ObjectLost");
    gone(&server, announced.pid);
}

#[test]
fn a_host_that_breaks_the_protocol_is_killed() {
    let python = FakePython::waiting();
    let server = start(&python, &[]);
    let mut client = server.session("client");
    define(&mut client, "v1", b"C").expect("define");
    let create = send_create(&mut client, "c", "v1", vec![]);
    let announced = python.next();
    let mut host = HostConn::connect(&server, &announced);
    host.request();
    // A request of its own on its host connection.
    host.conn.send(&request(1, "ping", vec![]));
    let e = reply_to(&mut client, create).unwrap_err();
    assert!(
        lost_reason(&e).starts_with("its object host broke the protocol"),
        "{e:?}"
    );
    gone(&server, announced.pid);
    assert_eq!(
        field(&server.status(), "hosted_objects"),
        &Value::from(0),
        "lost while constructing: gone"
    );
}

#[test]
fn a_host_that_never_connects_fails_the_create() {
    let python = FakePython::waiting();
    let server = start(&python, &["--worker-start-timeout", "0.3"]);
    let mut client = server.session("client");
    define(&mut client, "v1", b"C").expect("define");
    let create = send_create(&mut client, "c", "v1", vec![]);
    python.next();
    let e = reply_to(&mut client, create).unwrap_err();
    assert_eq!(lost_reason(&e), "its object host did not connect within 0.3 s");
}

#[test]
fn a_class_that_did_not_load_in_its_host_is_sent_again() {
    let python = FakePython::waiting();
    let server = start(&python, &[]);
    let mut client = server.session("client");
    define(&mut client, "v1", b"CODE").expect("define");
    let create = send_create(&mut client, "a", "v1", vec![]);
    let mut host = HostConn::connect(&server, &python.next());
    let (rid, _, operands) = host.request();
    assert_eq!(operands[3], Value::Binary(b"CODE".to_vec()));
    // Unpickling the class failed in the host (a module it cannot import, say).
    host.fail(rid, "Raised", "ModuleNotFoundError: No module named 'extra'");
    assert_eq!(reply_to(&mut client, create).unwrap_err().kind, "Raised");
    // The module is installed now: the next construct brings the code along again.
    let create = send_create(&mut client, "b", "v1", vec![]);
    let (rid, op, operands) = host.request();
    assert_eq!(
        (op.as_str(), &operands[3]),
        ("construct", &Value::Binary(b"CODE".to_vec()))
    );
    host.answer(rid, Value::Nil);
    assert_eq!(reply_to(&mut client, create), Ok(Value::Boolean(true)));
    // Loaded now: later constructs on this host go without it.
    let create = send_create(&mut client, "c", "v1", vec![]);
    let (rid, _, operands) = host.request();
    assert_eq!(operands[3], Value::Nil);
    host.answer(rid, Value::Nil);
    assert_eq!(reply_to(&mut client, create), Ok(Value::Boolean(true)));
}

#[test]
fn calls_on_user_defined_objects_need_the_token() {
    // The host unpickles a call's arguments: running code, as `create` and `invoke` are.
    let python = FakePython::waiting();
    let server = start(&python, &["--token", "sekrit"]);
    let mut client = server.connect();
    let hello = map(vec![
        ("client", "c".into()),
        ("protocol", 1.into()),
        ("token", "sekrit".into()),
    ]);
    client.request("hello", vec![hello]).expect("hello");
    define(&mut client, "v1", b"C").expect("define");
    let create = send_create(&mut client, "c", "v1", vec![]);
    let mut host = HostConn::connect(&server, &python.next());
    let (rid, _, _) = host.request();
    host.answer(rid, Value::Nil);
    reply_to(&mut client, create).expect("created");
    refused_hello(&server, |anonymous| {
        let pickle = Value::Ext(1, b"cos\nsystem\n(S'true'\ntR.".to_vec());
        send_call(anonymous, 1, "c", "update", vec![pickle]);
    });
    // The host never saw it: its next request is the authorized client's.
    let call = send_call(&mut client, 2, "c", "get", vec![]);
    let (rid, op, operands) = host.request();
    assert_eq!((op.as_str(), &operands[1]), ("call", &Value::from("get")));
    host.answer(rid, 1.into());
    assert_eq!(reply_to(&mut client, call), Ok(1.into()));
}

#[test]
fn a_host_that_cannot_start_fails_its_calls_and_the_server_keeps_serving() {
    let server = Server::start(&["--python", "/nonexistent/python3", "--object-hosts", "1"]);
    let mut client = server.session("client");
    define(&mut client, "v1", b"C").expect("define");
    for key in ["a", "b"] {
        let create = send_create(&mut client, key, "v1", vec![]);
        let e = reply_to(&mut client, create).unwrap_err();
        assert!(
            lost_reason(&e).starts_with("cannot start `/nonexistent/python3 -m spindle.host`"),
            "{e:?}"
        );
    }
    let status = server.status();
    assert_eq!(field(&status, "hosted_objects"), &Value::from(0));
    assert_eq!(field(&status, "object_hosts"), &Value::from(0));
    assert_eq!(client.request("ping", vec![]), Ok("pong".into()));
}
