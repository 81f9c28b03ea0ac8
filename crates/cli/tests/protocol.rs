//! The wire protocol end to end: a real server process, real sockets.

mod common;

use std::collections::HashSet;
use std::io::Write;

use common::{call_operands, field, frame, kind, request, Server, Value};

#[test]
fn hello_create_call_round_trip_on_a_counter() {
    let server = Server::start(&[]);
    let mut conn = server.connect();
    let hello = conn.hello("round-trip");
    assert_eq!(field(&hello, "protocol"), &Value::from(1));
    assert_eq!(field(&hello, "resumed"), &Value::Boolean(false));
    assert!(field(&hello, "version").is_str());

    assert_eq!(conn.request("ping", vec![]), Ok(Value::from("pong")));
    assert_eq!(conn.create("Counter", "hits", vec![10.into()], false), Ok(true.into()));
    assert_eq!(conn.create("Counter", "hits", vec![], false), Ok(false.into()));
    assert_eq!(conn.call("Counter", "hits", "increment", vec![]), Ok(11.into()));
    assert_eq!(conn.call("Counter", "hits", "add", vec![5.into()]), Ok(16.into()));
    assert_eq!(conn.call("Counter", "hits", "get", vec![]), Ok(16.into()));

    let seq = conn.next_seq();
    assert_eq!(conn.request("delete", vec![seq.into(), "hits".into()]), Ok(true.into()));
    let seq = conn.next_seq();
    assert_eq!(
        conn.request("delete", vec![seq.into(), "hits".into()]),
        Ok(false.into())
    );
    assert_eq!(kind(conn.call("Counter", "hits", "get", vec![])), "NotFound");
}

#[test]
fn pipelined_requests_are_answered_by_id() {
    let server = Server::start(&[]);
    let mut conn = server.session("pipeliner");
    conn.create("Counter", "c", vec![], false).unwrap();

    const N: u64 = 2000;
    let mut batch = Vec::new();
    let mut sent = HashSet::new();
    for _ in 0..N {
        let (id, seq) = (conn.next_id(), conn.next_seq());
        sent.insert(id);
        batch.extend(frame(&request(
            id,
            "call",
            call_operands(seq, "Counter", "c", "add", vec![1.into()]),
        )));
    }
    // Everything is written before any reply is read.
    conn.stream.write_all(&batch).unwrap();

    let mut seen_ids = HashSet::new();
    let mut results = HashSet::new();
    for _ in 0..N {
        let (id, reply) = conn.recv_reply();
        assert!(sent.contains(&id), "reply to an id never sent: {id}");
        assert!(seen_ids.insert(id), "two replies for id {id}");
        results.insert(reply.unwrap().as_i64().unwrap());
    }
    assert_eq!(results, (1..=N as i64).collect::<HashSet<_>>(), "each add ran once");
    assert_eq!(conn.call("Counter", "c", "get", vec![]), Ok((N as i64).into()));
}

#[test]
fn a_resent_call_applies_once_even_on_a_new_connection() {
    let server = Server::start(&["--session-ttl", "60"]);
    let mut first = server.session("retrier");
    first.create("Counter", "once", vec![], false).unwrap();
    assert_eq!(
        first.call_seq(100, "Counter", "once", "increment", vec![]),
        Ok(1.into())
    );
    assert_eq!(
        first.call_seq(100, "Counter", "once", "increment", vec![]),
        Ok(1.into())
    );
    assert_eq!(first.call_seq(0, "Counter", "once", "get", vec![]), Ok(1.into()));
    drop(first);

    // A reconnect of the same session resends the call: the recorded reply comes back.
    let mut second = server.connect();
    let hello = second.hello("retrier");
    assert_eq!(field(&hello, "resumed"), &Value::Boolean(true));
    assert_eq!(
        second.call_seq(100, "Counter", "once", "increment", vec![]),
        Ok(1.into())
    );
    assert_eq!(second.call_seq(0, "Counter", "once", "get", vec![]), Ok(1.into()));

    // seq 0 opts out: the same call runs every time.
    assert_eq!(second.call_seq(0, "Counter", "once", "increment", vec![]), Ok(2.into()));
    assert_eq!(second.call_seq(0, "Counter", "once", "increment", vec![]), Ok(3.into()));

    // Another session's seq 100 is its own call.
    let mut other = server.session("someone-else");
    assert_eq!(
        other.call_seq(100, "Counter", "once", "increment", vec![]),
        Ok(4.into())
    );
}

#[test]
fn type_and_method_errors() {
    let server = Server::start(&[]);
    let mut conn = server.session("errors");
    conn.create("Counter", "n", vec![], false).unwrap();

    let mismatch = conn.call("Dict", "n", "len", vec![]).unwrap_err();
    assert_eq!(mismatch.kind, "TypeMismatch");
    assert!(mismatch.message.contains("Counter"), "{}", mismatch.message);
    assert_eq!(kind(conn.create("Dict", "n", vec![], false)), "TypeMismatch");

    let unknown_type = conn.create("Teapot", "t", vec![], false).unwrap_err();
    assert_eq!(unknown_type.kind, "UnknownType");
    assert!(unknown_type.message.contains("Teapot"), "{}", unknown_type.message);
    assert_eq!(kind(conn.call("Counter", "n", "frobnicate", vec![])), "UnknownMethod");
    assert_eq!(kind(conn.call("Counter", "n", "add", vec!["x".into()])), "BadArguments");
    assert_eq!(kind(conn.call("Counter", "missing", "get", vec![])), "NotFound");
    // Errors change nothing and the connection keeps serving.
    assert_eq!(conn.call("Counter", "n", "get", vec![]), Ok(0.into()));
}

#[test]
fn a_request_before_hello_gets_no_session() {
    let server = Server::start(&[]);
    let mut conn = server.connect();
    let error = conn.request("ping", vec![]).unwrap_err();
    assert_eq!(error.kind, "NoSession");
    let error = conn.call("Counter", "c", "get", vec![]).unwrap_err();
    assert_eq!(error.kind, "NoSession");
    // Hello still works on the same connection afterwards.
    conn.hello("late");
    assert_eq!(conn.request("ping", vec![]), Ok("pong".into()));
}

#[test]
fn malformed_bodies_get_protocol_errors_and_the_connection_stays() {
    let server = Server::start(&[]);
    let mut conn = server.session("garbage");

    // An array announcing two items that holds one: not decodable, so id 0.
    conn.send_raw(&[0, 0, 0, 2, 0x92, 0x01]);
    let (id, reply) = conn.recv_reply();
    assert_eq!(id, 0);
    assert_eq!(kind(reply), "ProtocolError");

    // Decodable but not a request.
    conn.send(&Value::from("hello?"));
    let (id, reply) = conn.recv_reply();
    assert_eq!(id, 0);
    assert_eq!(kind(reply), "ProtocolError");

    // The id is readable: the error carries it.
    conn.send(&request(77, "call", vec!["not-a-seq".into()]));
    let (id, reply) = conn.recv_reply();
    assert_eq!(id, 77);
    let error = reply.unwrap_err();
    assert_eq!(error.kind, "ProtocolError");
    assert!(
        error.message.contains("'call' takes 8 to 10 items"),
        "{}",
        error.message
    );

    conn.send(&request(78, "explode", vec![]));
    let (id, reply) = conn.recv_reply();
    assert_eq!(id, 78);
    assert!(reply.unwrap_err().message.contains("unknown op 'explode'"));

    assert_eq!(conn.request("ping", vec![]), Ok("pong".into()));
}

#[test]
fn bytes_that_are_not_frames_get_frame_too_large_and_a_close() {
    let server = Server::start(&[]);
    let mut conn = server.session("http");
    // "GET " read as a length is about 1.2 GB.
    conn.send_raw(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n");
    let (id, reply) = conn.recv_reply();
    assert_eq!(id, 0);
    assert_eq!(kind(reply), "FrameTooLarge");
    conn.expect_closed();
    assert_eq!(server.session("after").request("ping", vec![]), Ok("pong".into()));
}

#[test]
fn a_truncated_frame_is_dropped_and_the_server_keeps_serving() {
    let server = Server::start(&[]);
    let mut conn = server.session("truncator");
    let create = frame(&request(
        1,
        "create",
        vec![
            1.into(),
            0.into(),
            "Counter".into(),
            "half".into(),
            Value::Array(vec![]),
            false.into(),
        ],
    ));
    conn.send_raw(&create[..create.len() - 1]);
    drop(conn);
    // Checked once the server has seen the connection end (where a half frame could be
    // taken for a whole one), not before: only the status probe's own connection is left.
    common::eventually("the truncator's close is noticed", || {
        field(&server.status(), "connections") == &Value::from(1)
    });

    let mut other = server.session("observer");
    assert_eq!(kind(other.call("Counter", "half", "get", vec![])), "NotFound");
    assert_eq!(other.request("objects", vec!["".into()]), Ok(Value::Array(vec![])));
}

#[test]
fn an_oversized_frame_closes_only_its_connection() {
    let server = Server::start(&["--max-frame", "1024"]);
    let mut bystander = server.session("bystander");
    bystander.create("Counter", "b", vec![], false).unwrap();

    let mut offender = server.session("offender");
    let mut oversized = 2048u32.to_be_bytes().to_vec();
    oversized.extend(vec![0xc0; 2048]);
    offender.send_raw(&oversized);
    let (id, reply) = offender.recv_reply();
    assert_eq!(id, 0);
    let error = reply.unwrap_err();
    assert_eq!(error.kind, "FrameTooLarge");
    assert!(error.message.contains("1024"), "{}", error.message);
    offender.expect_closed();

    // A frame of exactly the limit is read (and refused only for its content).
    let mut boundary = server.session("boundary");
    let mut at_limit = 1024u32.to_be_bytes().to_vec();
    at_limit.extend([0xda, 0x03, 0xfd]); // str16 of 1021 bytes
    at_limit.extend(vec![b'x'; 1021]);
    boundary.send_raw(&at_limit);
    assert_eq!(kind(boundary.recv_reply().1), "ProtocolError");

    assert_eq!(bystander.call("Counter", "b", "increment", vec![]), Ok(1.into()));
}

#[test]
fn a_thousand_connections_come_and_go() {
    let server = Server::start(&[]);
    let connections = |server: &Server| field(&server.status(), "connections").as_u64().unwrap();
    // The probe's own connection is counted in each reading.
    let baseline = connections(&server);

    let mut open = Vec::new();
    for i in 0..1000 {
        let mut conn = server.connect();
        if i % 2 == 0 {
            conn.hello(&format!("client-{i}"));
        }
        open.push(conn);
    }
    // Every connection is served, the newest and the oldest.
    open.last_mut().unwrap().hello("last");
    assert_eq!(open[0].request("ping", vec![]), Ok("pong".into()));
    assert!(connections(&server) >= baseline + 1000);
    drop(open);

    common::eventually("the connection count returns to the baseline", || {
        connections(&server) == baseline
    });
    assert_eq!(server.session("survivor").request("ping", vec![]), Ok("pong".into()));
}

#[test]
fn status_reports_every_field() {
    let server = Server::start(&["--partitions", "3"]);
    let mut conn = server.session("stats");
    conn.create("Counter", "a", vec![], false).unwrap();
    conn.create("Counter", "~stats.1", vec![], true).unwrap();
    let status = conn.request("status", vec![]).unwrap();
    assert_eq!(field(&status, "address"), &Value::from(server.address.as_str()));
    assert_eq!(field(&status, "pid"), &Value::from(server.pid()));
    assert_eq!(field(&status, "objects"), &Value::from(2));
    assert_eq!(field(&status, "connections"), &Value::from(1));
    assert_eq!(field(&status, "sessions"), &Value::from(1));
    assert_eq!(field(&status, "partitions"), &Value::from(3));
    assert_eq!(field(&status, "calls"), &Value::from(2));
    assert!(field(&status, "uptime").as_f64().unwrap() >= 0.0);
    assert!(field(&status, "calls_per_s").as_f64().unwrap() >= 0.0);
    assert!(field(&status, "version").is_str());
}

#[test]
fn objects_lists_named_objects_sorted() {
    let server = Server::start(&[]);
    let mut conn = server.session("lister");
    for name in ["b/2", "a/1", "b/1", "c"] {
        conn.create("Counter", name, vec![], false).unwrap();
    }
    conn.create("Counter", "~lister.1", vec![], true).unwrap();
    let pair = |name: &str| Value::Array(vec![name.into(), "Counter".into()]);
    assert_eq!(
        conn.request("objects", vec!["".into()]),
        Ok(Value::Array(vec![pair("a/1"), pair("b/1"), pair("b/2"), pair("c")]))
    );
    assert_eq!(
        conn.request("objects", vec!["b/".into()]),
        Ok(Value::Array(vec![pair("b/1"), pair("b/2")]))
    );
}

#[test]
fn keep_moves_an_object_and_leaves_a_forwarding_note() {
    let server = Server::start(&[]);
    let mut conn = server.session("keeper");
    conn.create("Counter", "~keeper.1", vec![5.into()], true).unwrap();
    let seq = conn.next_seq();
    let keep = |seq: u64, name: Value| vec![seq.into(), "Counter".into(), "~keeper.1".into(), name];
    assert_eq!(conn.request("keep", keep(seq, "saved".into())), Ok("saved".into()));
    // A retry of the same keep answers the same.
    assert_eq!(conn.request("keep", keep(seq, "saved".into())), Ok("saved".into()));

    let moved = conn.call("Counter", "~keeper.1", "get", vec![]).unwrap_err();
    assert_eq!(moved.kind, "Moved");
    assert_eq!(moved.data, Value::from("saved"));
    assert_eq!(conn.call("Counter", "saved", "get", vec![]), Ok(5.into()));

    conn.create("Counter", "~keeper.2", vec![], true).unwrap();
    let seq = conn.next_seq();
    assert_eq!(
        conn.request(
            "keep",
            vec![seq.into(), "Counter".into(), "~keeper.2".into(), Value::Nil]
        ),
        Ok("~keeper.2".into())
    );
    let seq = conn.next_seq();
    assert_eq!(
        kind(conn.request("keep", vec![seq.into(), "Counter".into(), "nothing".into(), "x".into()])),
        "NotFound"
    );
}
