//! The function gateway's mechanics, with stand-in workers (`common::fake_python`): the test
//! speaks the worker protocol on the worker's behalf. The real Python worker is covered by
//! the pytest suite.

mod common;

use std::fs;
use std::process::Command;
use std::sync::atomic::{AtomicU32, Ordering};

use common::fake_python::{Announced, FakePython};
use common::{field, kind, request, Conn, Server, Value};

/// The test speaking for a worker on its task connection.
struct WorkerConn {
    conn: Conn,
}

impl WorkerConn {
    fn connect(server: &Server, worker: &Announced) -> WorkerConn {
        let mut conn = server.connect();
        let hello = Value::Map(vec![
            ("id".into(), worker.secret.as_str().into()),
            ("pid".into(), worker.pid.into()),
            ("runtime".into(), "python".into()),
        ]);
        conn.request("worker", vec![hello])
            .expect("the server accepts its worker");
        WorkerConn { conn }
    }

    /// The next task: `(task_id, payload, options)`.
    fn task(&mut self) -> (u64, Vec<u8>, Value) {
        let frame = self.conn.recv().expect("a task");
        let items = frame.as_array().expect("an array").clone();
        assert_eq!(items.len(), 4, "[task_id, \"run\", payload, options]: {frame}");
        assert_eq!(items[1].as_str(), Some("run"));
        let payload = match &items[2] {
            Value::Binary(b) => b.clone(),
            other => panic!("payload is bin: {other}"),
        };
        (items[0].as_u64().expect("task id"), payload, items[3].clone())
    }

    /// Answer a task with a report whose result echoes `result`.
    fn answer(&mut self, task: u64, result: Vec<u8>) {
        let report = Value::Map(vec![
            ("ok".into(), true.into()),
            ("result".into(), Value::Binary(result)),
            ("error".into(), Value::Nil),
            ("stdout".into(), Value::Binary(b"out".to_vec())),
            ("stderr".into(), Value::Binary(vec![])),
            ("truncated".into(), 0.into()),
            ("duration".into(), Value::F64(0.001)),
            ("peak_rss".into(), 1000.into()),
        ]);
        self.conn.send(&Value::Array(vec![task.into(), 0.into(), report]));
    }

    /// Serve tasks by echoing their payloads, until the server closes the connection.
    fn echo_forever(mut self) {
        while let Some(frame) = self.conn.recv() {
            let items = frame.as_array().expect("a task").clone();
            let Value::Binary(payload) = items[2].clone() else {
                panic!("payload is bin")
            };
            self.answer(items[0].as_u64().expect("task id"), payload);
        }
    }
}

fn invoke(conn: &mut Conn, payload: &[u8], options: Vec<(&str, Value)>) -> u64 {
    let id = conn.next_id();
    let options = Value::Map(options.into_iter().map(|(k, v)| (k.into(), v)).collect());
    conn.send(&request(
        id,
        "invoke",
        vec!["python".into(), Value::Binary(payload.to_vec()), options],
    ));
    id
}

/// Wait until every request sent so far on `conn` has been read by the server.
fn sync(conn: &mut Conn) {
    assert_eq!(
        conn.request("ping", vec![]),
        Ok("pong".into()),
        "the ping's reply comes first"
    );
}

fn data<'a>(error: &'a common::Remote, name: &str) -> &'a Value {
    field(&error.data, name)
}

#[test]
fn a_call_runs_on_a_started_worker_and_then_on_the_warm_one() {
    let python = FakePython::waiting();
    let server = Server::start(&["--python", &python.path()]);
    let mut caller = server.session("caller");
    let first = invoke(&mut caller, b"one", vec![("label", "first".into())]);
    let announced = python.next();
    // The server's own token, made up at start when it has none: a worker connects as the
    // default user even once the server has users.
    assert_eq!(announced.token.len(), 48, "{}", announced.token);
    let mut worker = WorkerConn::connect(&server, &announced);
    let (task, payload, options) = worker.task();
    assert_eq!(payload, b"one");
    assert_eq!(field(&options, "label"), &Value::from("first"));
    worker.answer(task, b"1".to_vec());
    let (id, reply) = caller.recv_reply();
    assert_eq!(id, first);
    let report = reply.expect("a report");
    assert_eq!(field(&report, "result"), &Value::Binary(b"1".to_vec()));
    assert_eq!(field(&report, "stdout"), &Value::Binary(b"out".to_vec()));
    assert_eq!(field(&report, "cold"), &Value::Boolean(true));
    assert_eq!(field(&report, "worker"), &Value::from(announced.pid));
    assert!(field(&report, "queued").as_f64().is_some_and(|q| q >= 0.0));

    let second = invoke(&mut caller, b"two", vec![]);
    let (task, payload, _) = worker.task();
    assert_eq!(payload, b"two");
    worker.answer(task, b"2".to_vec());
    let (id, reply) = caller.recv_reply();
    assert_eq!(id, second);
    assert_eq!(field(&reply.unwrap(), "cold"), &Value::Boolean(false));
}

#[test]
fn a_worker_crash_fails_its_call_with_the_exit_status_and_is_replaced() {
    let python = FakePython::waiting();
    let server = Server::start(&["--python", &python.path()]);
    let mut caller = server.session("caller");
    let doomed = invoke(&mut caller, b"crash", vec![]);
    let first = python.next();
    let mut worker = WorkerConn::connect(&server, &first);
    worker.task();
    python.exit(first.pid, 3);
    let (id, reply) = caller.recv_reply();
    assert_eq!(id, doomed);
    let error = reply.unwrap_err();
    assert_eq!(error.kind, "WorkerCrashed");
    assert_eq!(data(&error, "status"), &Value::from(3));
    assert_eq!(data(&error, "signal"), &Value::Nil);
    assert!(error.message.contains("exited with status 3"), "{}", error.message);

    // Killed by a signal: the signal is reported.
    let killed = invoke(&mut caller, b"kill", vec![]);
    let second = python.next();
    let mut worker = WorkerConn::connect(&server, &second);
    worker.task();
    let status = Command::new("kill")
        .args(["-KILL", &second.pid.to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    let (id, reply) = caller.recv_reply();
    assert_eq!(id, killed);
    let error = reply.unwrap_err();
    assert_eq!(error.kind, "WorkerCrashed");
    assert_eq!(data(&error, "signal"), &Value::from(9));
    assert_eq!(data(&error, "status"), &Value::Nil);

    // The pool recovers.
    let fine = invoke(&mut caller, b"fine", vec![]);
    let third = python.next();
    std::thread::spawn({
        let worker = WorkerConn::connect(&server, &third);
        move || worker.echo_forever()
    });
    let (id, reply) = caller.recv_reply();
    assert_eq!(id, fine);
    assert_eq!(field(&reply.unwrap(), "result"), &Value::Binary(b"fine".to_vec()));
}

#[test]
fn a_worker_whose_connection_drops_mid_call_fails_the_call() {
    let python = FakePython::waiting();
    let server = Server::start(&["--python", &python.path()]);
    let mut caller = server.session("caller");
    let id = invoke(&mut caller, b"x", vec![]);
    let mut worker = WorkerConn::connect(&server, &python.next());
    worker.task();
    drop(worker);
    let (got, reply) = caller.recv_reply();
    assert_eq!(got, id);
    let error = reply.unwrap_err();
    assert_eq!(error.kind, "WorkerCrashed");
    assert_eq!(data(&error, "reason"), &Value::from("the worker's connection closed"));
    assert_eq!(data(&error, "signal"), &Value::from(9), "the gateway killed it");
}

#[test]
fn a_timeout_kills_the_worker_and_the_next_call_succeeds() {
    let python = FakePython::waiting();
    let server = Server::start(&["--python", &python.path()]);
    let mut caller = server.session("caller");
    let slow = invoke(&mut caller, b"slow", vec![("timeout", Value::F64(0.2))]);
    let mut worker = WorkerConn::connect(&server, &python.next());
    worker.task();
    // The worker never answers.
    let (id, reply) = caller.recv_reply();
    assert_eq!(id, slow);
    let error = reply.unwrap_err();
    assert_eq!(error.kind, "FunctionTimeout");
    assert!(error.message.contains("timeout of 0.2 s"), "{}", error.message);

    // A timeout too far out for the clock is no deadline (it once overflowed the clock).
    let next = invoke(&mut caller, b"next", vec![("timeout", Value::F64(1e19))]);
    std::thread::spawn({
        let worker = WorkerConn::connect(&server, &python.next());
        move || worker.echo_forever()
    });
    let (id, reply) = caller.recv_reply();
    assert_eq!(id, next);
    assert_eq!(field(&reply.unwrap(), "result"), &Value::Binary(b"next".to_vec()));
}

#[test]
fn a_worker_that_never_connects_fails_the_call_instead_of_hanging() {
    let python = FakePython::new("exec sleep 600");
    let server = Server::start(&["--python", &python.path(), "--worker-start-timeout", "0.3"]);
    let mut caller = server.session("caller");
    let id = invoke(&mut caller, b"x", vec![]);
    python.next();
    let (got, reply) = caller.recv_reply();
    assert_eq!(got, id);
    let error = reply.unwrap_err();
    assert_eq!(error.kind, "WorkerCrashed");
    assert!(
        error.message.contains("did not connect within 0.3 s"),
        "{}",
        error.message
    );
}

#[test]
fn a_missing_interpreter_fails_calls_instead_of_hanging() {
    let server = Server::start(&["--python", "/nonexistent/python3", "--max-workers", "2"]);
    let mut caller = server.session("caller");
    let ids: Vec<u64> = (0..5).map(|_| invoke(&mut caller, b"x", vec![])).collect();
    let mut failed = Vec::new();
    for _ in &ids {
        let (id, reply) = caller.recv_reply();
        let error = reply.unwrap_err();
        assert_eq!(error.kind, "WorkerCrashed");
        assert!(error.message.contains("/nonexistent/python3"), "{}", error.message);
        failed.push(id);
    }
    failed.sort_unstable();
    assert_eq!(failed, ids);
}

#[test]
fn a_worker_over_its_memory_limit_is_killed() {
    // The stand-in turns into a process holding 128 MiB.
    let python = FakePython::new("exec python3 -c 'import time; b = b\"x\" * (128 << 20); time.sleep(600)'");
    let server = Server::start(&["--python", &python.path()]);
    let mut caller = server.session("caller");
    let id = invoke(&mut caller, b"x", vec![("memory_mb", 32.into())]);
    let mut worker = WorkerConn::connect(&server, &python.next());
    worker.task();
    let (got, reply) = caller.recv_reply();
    assert_eq!(got, id);
    let error = reply.unwrap_err();
    assert_eq!(error.kind, "WorkerCrashed");
    assert_eq!(data(&error, "reason"), &Value::from("memory limit"));
    assert_eq!(data(&error, "signal"), &Value::from(9));
}

#[test]
fn many_calls_queue_over_a_small_pool_and_all_complete() {
    let python = FakePython::waiting();
    let server = Server::start(&["--python", &python.path(), "--max-workers", "2"]);
    let mut caller = server.session("caller");
    let calls = 200;
    let ids: Vec<u64> = (0..calls)
        .map(|n| invoke(&mut caller, format!("call {n}").as_bytes(), vec![]))
        .collect();
    sync(&mut caller);
    let workers = [python.next(), python.next()];

    // Nothing ran yet: the workers have not connected.
    let status = server.status();
    assert_eq!(field(&status, "workers"), &Value::from(2));
    assert_eq!(field(&status, "busy"), &Value::from(0));
    assert_eq!(field(&status, "queued"), &Value::from(calls));
    assert!(field(&status, "invocations_per_s").as_f64().is_some());
    let printed = Command::new(env!("CARGO_BIN_EXE_spindle"))
        .args(["status", "--address", &server.address])
        .output()
        .unwrap();
    let text = String::from_utf8(printed.stdout).unwrap();
    assert!(
        text.lines().any(|l| l.split_whitespace().eq(["queued", "200"])),
        "{text}"
    );
    assert!(text.lines().any(|l| l.starts_with("invocations/s ")), "{text}");

    for worker in &workers {
        let conn = WorkerConn::connect(&server, worker);
        std::thread::spawn(move || conn.echo_forever());
    }
    let mut pids = std::collections::HashSet::new();
    for _ in 0..calls {
        let (id, reply) = caller.recv_reply();
        let n = ids.iter().position(|&i| i == id).expect("a known id");
        let report = reply.expect("a report");
        assert_eq!(
            field(&report, "result"),
            &Value::Binary(format!("call {n}").into_bytes())
        );
        pids.insert(field(&report, "worker").as_u64().unwrap());
    }
    assert!(pids.len() <= 2);
    let status = server.status();
    assert_eq!(field(&status, "queued"), &Value::from(0));
    assert_eq!(field(&status, "busy"), &Value::from(0));
}

#[test]
fn cancel_withdraws_a_queued_call_and_a_closed_caller_withdraws_its_own() {
    let python = FakePython::waiting();
    let server = Server::start(&["--python", &python.path(), "--max-workers", "1"]);
    let mut leaving = server.session("leaving");
    invoke(&mut leaving, b"running", vec![]);
    let queued = invoke(&mut leaving, b"queued", vec![]);
    let cancelled = invoke(&mut leaving, b"cancelled", vec![]);
    let mut worker = WorkerConn::connect(&server, &python.next());
    let (task, payload, _) = worker.task();
    assert_eq!(payload, b"running");

    // Two replies, in either order: the cancel's, and the withdrawn call's.
    let cancel = leaving.next_id();
    leaving.send(&request(cancel, "cancel", vec![cancelled.into()]));
    let mut replies = [leaving.recv_reply(), leaving.recv_reply()];
    replies.sort_by_key(|(id, _)| *id);
    assert_eq!(replies[0].0, cancelled);
    assert_eq!(replies[0].1.clone().unwrap_err().kind, "Cancelled");
    assert_eq!(replies[1], (cancel, Ok(true.into())));
    assert_eq!(leaving.request("cancel", vec![cancelled.into()]), Ok(false.into()));
    assert_eq!(leaving.request("cancel", vec![12345.into()]), Ok(false.into()));
    assert_eq!(
        field(&server.status(), "queued"),
        &Value::from(1),
        "{queued} still waits"
    );

    // Another caller queues behind; the first one leaves with a call running and one queued.
    let mut staying = server.session("staying");
    let mine = invoke(&mut staying, b"mine", vec![]);
    sync(&mut staying);
    drop(leaving);
    eventually_queued(&server, 1);
    // Its running call is stopped with its worker (nobody wants the result), which frees the
    // pool for the caller still here.
    let _ = task;
    drop(worker);
    let mut worker = WorkerConn::connect(&server, &python.next());
    let (task, payload, _) = worker.task();
    assert_eq!(payload, b"mine", "the departed caller's queued call was withdrawn");
    worker.answer(task, b"ok".to_vec());
    let (id, reply) = staying.recv_reply();
    assert_eq!(id, mine);
    assert_eq!(field(&reply.unwrap(), "result"), &Value::Binary(b"ok".to_vec()));
}

/// Wait until the gateway noticed a closed connection (its calls left the queue).
fn eventually_queued(server: &Server, queued: u64) {
    common::eventually("the queue shrinks", || {
        field(&server.status(), "queued").as_u64() == Some(queued)
    });
}

#[test]
fn every_operation_needs_the_token_when_the_server_has_one() {
    let python = FakePython::waiting();
    let server = Server::start(&["--python", &python.path(), "--token", "sekrit", "--max-workers", "1"]);
    let hello = |token: Option<&str>| {
        let mut fields = vec![("client".into(), "c".into()), ("protocol".into(), 1.into())];
        fields.extend(token.map(|t| ("token".into(), t.into())));
        Value::Map(fields)
    };
    // Without the token, or with a wrong one, hello is refused and the connection closes:
    // nothing sent behind the hello runs, not code, and not data operations either (a
    // stored pickle is code to its reader).
    for token in [None, Some("guess"), Some("")] {
        let mut stranger = server.connect();
        let id = stranger.next_id();
        stranger.send(&request(id, "hello", vec![hello(token)]));
        let create = stranger.next_id();
        stranger.send(&request(
            create,
            "create",
            vec![
                1.into(),
                0.into(),
                "Counter".into(),
                "planted".into(),
                Value::Array(vec![]),
                false.into(),
            ],
        ));
        invoke(&mut stranger, b"x", vec![]);
        let (got, refused) = stranger.recv_reply();
        assert_eq!((got, kind(refused).as_str()), (id, "Unauthorized"), "{token:?}");
        assert!(stranger.recv().is_none(), "the connection closes after a refused hello");
    }

    let mut trusted = server.connect();
    trusted.request("hello", vec![hello(Some("sekrit"))]).unwrap();
    assert!(trusted.create("Counter", "c", vec![], false).is_ok());
    assert_eq!(
        trusted.call("Counter", "c", "add", vec![2.into()]).unwrap(),
        Value::from(2)
    );
    let listed = trusted.request("objects", vec!["".into()]).unwrap();
    assert!(!listed.to_string().contains("planted"), "{listed}");
    // A wrong token in a second hello is refused too, and closes the connection.
    assert_eq!(
        trusted.request("hello", vec![hello(Some("guess"))]).unwrap_err().kind,
        "Unauthorized"
    );
    assert!(trusted.recv().is_none());
    let mut trusted = server.connect();
    trusted.request("hello", vec![hello(Some("sekrit"))]).unwrap();
    let id = invoke(&mut trusted, b"x", vec![]);
    let announced = python.next();
    assert_eq!(
        announced.token, "sekrit",
        "workers get the token for their own connections"
    );
    std::thread::spawn({
        let worker = WorkerConn::connect(&server, &announced);
        move || worker.echo_forever()
    });
    let (got, reply) = trusted.recv_reply();
    assert_eq!(got, id);
    assert!(reply.is_ok());

    // A made-up worker id is refused.
    let mut impostor = server.connect();
    let bogus = Value::Map(vec![("id".into(), "1-00".into()), ("pid".into(), 1.into())]);
    assert_eq!(
        impostor.request("worker", vec![bogus]).unwrap_err().kind,
        "Unauthorized"
    );
}

#[test]
fn a_server_on_a_public_interface_needs_a_token_and_tls_or_insecure() {
    let start = |args: &[&str]| {
        Command::new(env!("CARGO_BIN_EXE_spindle"))
            .args(["server", "--host", "0.0.0.0", "--port", "0"])
            .args(args)
            .env_remove("SPINDLE_TOKEN")
            .stdin(std::process::Stdio::null())
            .output()
            .unwrap()
    };
    let output = start(&[]);
    assert_eq!(output.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("without a token"), "{stderr}");
    let output = start(&["--token", "sekrit"]);
    assert_eq!(output.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("in plaintext") && stderr.contains("--insecure"),
        "{stderr}"
    );
}

#[test]
fn bad_invocations_are_refused_at_once() {
    let server = Server::start(&["--python", "/nonexistent/python3"]);
    let mut caller = server.session("caller");
    let id = caller.next_id();
    caller.send(&request(
        id,
        "invoke",
        vec!["cobol".into(), Value::Binary(vec![]), Value::Nil],
    ));
    assert_eq!(caller.recv_reply().1.unwrap_err().kind, "BadArguments");
    invoke(&mut caller, b"x", vec![("timeout", Value::F64(-1.0))]);
    assert_eq!(caller.recv_reply().1.unwrap_err().kind, "ValueError");
    let reply = caller.request("invoke", vec!["python".into(), "not bytes".into(), Value::Nil]);
    assert_eq!(reply.unwrap_err().kind, "ProtocolError");
}

/// `spindle run` with a shell standing in for Python.
fn spindle_run(script: &str, extra_env: &[(&str, &str)]) -> std::process::Output {
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let path = std::env::temp_dir().join(format!(
        "spindle-run-{}-{}.sh",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    ));
    fs::write(&path, script).unwrap();
    let mut command = Command::new(env!("CARGO_BIN_EXE_spindle"));
    command
        .args(["run", "--python", "/bin/sh"])
        .arg(&path)
        .args(["first", "--second"])
        .env_remove("SPINDLE_ADDRESS")
        .env_remove("SPINDLE_TOKEN")
        .env("SPINDLE_BIN", env!("CARGO_BIN_EXE_spindle"));
    for (k, v) in extra_env {
        command.env(k, v);
    }
    let output = command.output().expect("run spindle run");
    let _ = fs::remove_file(&path);
    output
}

#[test]
fn spindle_run_forwards_the_exit_code_and_serves_the_program() {
    // The program reaches the embedded server and gets its arguments.
    let output = spindle_run(
        "test \"$1 $2\" = 'first --second' || exit 90\n\
         \"$SPINDLE_BIN\" status | grep -q '^workers' || exit 91\n\
         exit 7\n",
        &[],
    );
    assert_eq!(
        output.status.code(),
        Some(7),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );

    let output = spindle_run("kill -TERM $$\n", &[]);
    assert_eq!(output.status.code(), Some(128 + 15));
}

#[test]
fn spindle_run_uses_the_server_in_spindle_address() {
    let server = Server::start(&[]);
    let output = spindle_run(
        "echo \"$SPINDLE_ADDRESS\"\n",
        &[("SPINDLE_ADDRESS", server.address.as_str())],
    );
    assert!(output.status.success());
    assert_eq!(String::from_utf8_lossy(&output.stdout).trim(), server.address);
}
