//! Parked calls across connections: waking, timeouts, and clean-up when a connection or a
//! session ends. Uses `Lock` and `Queue` (docs/protocol.md, "Synchronization").

mod common;

use common::{eventually, field, kind, ParkedProbe, Server, Value};

#[test]
fn a_parked_acquire_is_answered_when_the_holder_releases() {
    let server = Server::start(&[]);
    let mut holder = server.session("holder");
    let mut waiter = server.session("waiter");
    holder.create("Lock", "l", vec![], false).unwrap();
    assert_eq!(holder.call("Lock", "l", "acquire", vec![]), Ok(true.into()));

    let acquire = waiter.send_call("Lock", "l", "acquire", vec![]);
    // Later requests are answered while the acquire stays parked.
    assert_eq!(waiter.request("ping", vec![]), Ok("pong".into()));
    assert_eq!(holder.call("Lock", "l", "locked", vec![]), Ok(true.into()));

    assert_eq!(holder.call("Lock", "l", "release", vec![]), Ok(Value::Nil));
    assert_eq!(waiter.recv_reply(), (acquire, Ok(true.into())));
}

#[test]
fn a_lock_held_by_a_closed_connection_is_abandoned() {
    let server = Server::start(&[]);
    let mut holder = server.session("doomed");
    let mut waiter = server.session("heir");
    holder.create("Lock", "l", vec![], false).unwrap();
    assert_eq!(holder.call("Lock", "l", "acquire", vec![]), Ok(true.into()));
    let acquire = waiter.send_call("Lock", "l", "acquire", vec![]);
    assert_eq!(waiter.request("ping", vec![]), Ok("pong".into()));

    drop(holder);
    assert_eq!(waiter.recv_reply(), (acquire, Ok("abandoned".into())));
    assert_eq!(waiter.call("Lock", "l", "locked", vec![]), Ok(true.into()));
}

#[test]
fn timed_waits_expire() {
    let server = Server::start(&[]);
    let mut conn = server.session("impatient");
    conn.create("Lock", "l", vec![], false).unwrap();
    conn.create("Queue", "q", vec![], false).unwrap();
    assert_eq!(conn.call("Lock", "l", "acquire", vec![]), Ok(true.into()));
    assert_eq!(
        conn.call("Lock", "l", "acquire", vec![true.into(), 0.05.into()]),
        Ok(false.into())
    );
    assert_eq!(
        kind(conn.call("Queue", "q", "get", vec![true.into(), 0.05.into()])),
        "Empty"
    );
    // A long wait armed first does not hold back a shorter one armed later.
    let long = conn.send_call("Queue", "q", "get", vec![true.into(), 600.into()]);
    let short = conn.send_call("Lock", "l", "acquire", vec![true.into(), 0.05.into()]);
    assert_eq!(conn.recv_reply(), (short, Ok(false.into())));
    // The woken get and the put are answered together, in either order.
    let put = conn.send_call("Queue", "q", "put", vec!["late".into()]);
    let mut replies = vec![conn.recv_reply(), conn.recv_reply()];
    replies.sort_by_key(|(id, _)| *id);
    assert_eq!(replies, vec![(long, Ok("late".into())), (put, Ok(Value::Nil))]);
}

#[test]
fn a_put_wakes_a_getter_on_another_connection() {
    let server = Server::start(&["--partitions", "4"]);
    let mut producer = server.session("producer");
    let mut consumer = server.session("consumer");
    producer.create("Queue", "jobs", vec![], false).unwrap();
    let get = consumer.send_call("Queue", "jobs", "get", vec![]);
    assert_eq!(consumer.request("ping", vec![]), Ok("pong".into()));
    producer.call("Queue", "jobs", "put", vec!["job-1".into()]).unwrap();
    assert_eq!(consumer.recv_reply(), (get, Ok("job-1".into())));
}

#[test]
fn a_closed_connection_withdraws_its_parked_calls() {
    let server = Server::start(&[]);
    let mut producer = server.session("producer");
    producer.create("Queue", "jobs", vec![], false).unwrap();
    let connections = |server: &Server| field(&server.status(), "connections").as_u64().unwrap();
    let baseline = connections(&server);

    let mut consumer = server.session("consumer");
    consumer.send_call("Queue", "jobs", "get", vec![]);
    assert_eq!(consumer.request("ping", vec![]), Ok("pong".into()));
    drop(consumer);
    eventually("the consumer's close is noticed", || connections(&server) == baseline);

    // Nobody is listening for the withdrawn get: the item stays in the queue.
    producer.call("Queue", "jobs", "put", vec!["job".into()]).unwrap();
    assert_eq!(producer.call("Queue", "jobs", "qsize", vec![]), Ok(1.into()));
    assert_eq!(
        producer.call("Queue", "jobs", "get", vec![false.into()]),
        Ok("job".into())
    );
}

#[test]
fn keep_is_refused_while_calls_are_parked() {
    let server = Server::start(&[]);
    let mut owner = server.session("owner");
    let mut waiter = server.session("waiter");
    owner.create("Queue", "~owner.1", vec![], true).unwrap();
    let get = waiter.send_call("Queue", "~owner.1", "get", vec![]);
    assert_eq!(waiter.request("ping", vec![]), Ok("pong".into()));
    let seq = owner.next_seq();
    let keep = vec![seq.into(), "Queue".into(), "~owner.1".into(), "named-queue".into()];
    assert_eq!(kind(owner.request("keep", keep)), "Busy");

    owner.call("Queue", "~owner.1", "put", vec![1.into()]).unwrap();
    assert_eq!(waiter.recv_reply(), (get, Ok(1.into())));
    let seq = owner.next_seq();
    let keep = vec![seq.into(), "Queue".into(), "~owner.1".into(), "named-queue".into()];
    assert_eq!(owner.request("keep", keep), Ok("named-queue".into()));
}

#[test]
fn the_parked_probe_sees_parked_calls_and_moves_nothing() {
    // The harness's probe (`common::ParkedProbe`), which other tests wait on.
    for partitions in ["1", "8"] {
        let server = Server::start(&["--partitions", partitions]);
        let mut owner = server.session("owner");
        let mut waiter = server.session("waiter");
        let mut probe = ParkedProbe::new(&server, "Queue", "q");
        assert!(!probe.parked(), "nobody waits on a missing object");
        owner.create("Queue", "q", vec![], false).unwrap();
        owner.call("Queue", "q", "put", vec![1.into()]).unwrap();
        assert!(!probe.parked());
        // Still under its key, contents and all: the probe moved nothing.
        assert_eq!(owner.call("Queue", "q", "get", vec![]), Ok(1.into()));

        let get = waiter.send_call("Queue", "q", "get", vec![]);
        // Requests on a connection are applied in order: the get is parked now.
        assert_eq!(waiter.request("ping", vec![]), Ok("pong".into()));
        assert!(probe.parked());
        assert!(probe.parked(), "probing leaves the parked call alone");
        owner.call("Queue", "q", "put", vec![2.into()]).unwrap();
        assert_eq!(waiter.recv_reply(), (get, Ok(2.into())));
        assert!(!probe.parked());
        assert_eq!(owner.call("Queue", "q", "qsize", vec![]), Ok(0.into()));
    }
}

#[test]
fn a_session_end_answers_callers_parked_on_its_objects() {
    let server = Server::start(&["--session-ttl", "1"]);
    let mut owner = server.session("owner");
    let mut waiter = server.session("waiter");
    owner.create("Queue", "~owner.1", vec![], true).unwrap();
    let get = waiter.send_call("Queue", "~owner.1", "get", vec![]);
    assert_eq!(waiter.request("ping", vec![]), Ok("pong".into()));
    drop(owner);
    let (id, reply) = waiter.recv_reply();
    assert_eq!(id, get);
    assert_eq!(kind(reply), "NotFound");
}
