//! The partition's own tests: reply log, parking, user-defined and persistent objects.

use std::collections::VecDeque;

use super::reply_log::REPLY_LOG_LEN;
use super::*;
use crate::objects::testing::*;
use crate::record::{Record, MAX_RECORD_LEN};
use crate::Reply;

#[test]
fn a_retried_call_gets_the_recorded_reply() {
    let mut p = Harness::new();
    p.create_ok("Counter", "c", vec![]);
    let (t, out) = p.call(&who(1), 7, "Counter", "c", "increment", vec![]);
    assert_eq!(value_of(&out, t), Value::from(1));
    // Same client and seq, even on another connection: not applied twice.
    let again = Caller { conn: 9, ..who(1) };
    let (t, out) = p.call(&again, 7, "Counter", "c", "increment", vec![]);
    assert_eq!(value_of(&out, t), Value::from(1));
    assert_eq!(p.ok("Counter", "c", "get", vec![]), Value::from(1));
    // seq 0 opts out; another client's seq 7 is its own.
    p.call(&who(1), 0, "Counter", "c", "increment", vec![]);
    let (t, out) = p.call(&who(2), 7, "Counter", "c", "increment", vec![]);
    assert_eq!(value_of(&out, t), Value::from(3));
}

#[test]
fn a_call_acknowledging_replies_makes_the_partition_forget_them_but_never_its_own() {
    let mut p = Harness::new();
    p.create_ok("Counter", "c", vec![]);
    let increment = || Op::Call {
        type_name: "Counter".into(),
        key: "c".into(),
        method: "increment".into(),
        args: vec![],
        nested: None,
    };
    // A client with one call in flight at a time acknowledges all before it.
    for seq in 1..=100 {
        let t = p.token(1);
        let out = p.p.apply(&who(1), t, seq, seq, increment(), p.now);
        assert_eq!(value_of(&out, t), Value::from(seq as i64));
    }
    let log = &p.p.logs["c1"];
    assert_eq!(
        (log.replies.len(), log.order.len()),
        (1, 1),
        "only the call in flight's"
    );
    // The unacknowledged call still gets its recorded reply when retried, even from a
    // client acknowledging it by mistake (`acked` above its own seq).
    for acked in [100, 500] {
        let t = p.token(1);
        let out = p.p.apply(&who(1), t, 100, acked, increment(), p.now);
        assert_eq!(value_of(&out, t), Value::from(100));
    }
    // An acknowledged call's reply is forgotten, and a stale copy of the call refused.
    let t = p.token(1);
    let out = p.p.apply(&who(1), t, 99, 0, increment(), p.now);
    assert_eq!(error_of(&out, t).kind, ErrorKind::ProtocolError);
    assert!(error_of(&out, t).message.contains("stale copy"));
    assert_eq!(p.ok("Counter", "c", "get", vec![]), Value::from(100));
    // Without `acked` (0) nothing is forgotten before the window is full.
    for seq in 1000..1100 {
        let t = p.token(2);
        p.p.apply(&who(2), t, seq, 0, increment(), p.now);
    }
    assert_eq!(p.p.logs["c2"].replies.len(), 100);
}

#[test]
fn a_retry_of_a_call_whose_reply_was_forgotten_for_room_is_refused_not_run_again() {
    let mut p = Harness::new();
    p.p.set_reply_log_limit(1 << 10, usize::MAX);
    p.create_ok("Dict", "d", vec![]);
    let setdefault = |value: Value| Op::Call {
        type_name: "Dict".into(),
        key: "d".into(),
        method: "setdefault".into(),
        args: vec!["k".into(), value],
        nested: None,
    };
    let big = Value::Binary(vec![1; 600]);
    // A session that never acknowledges: each 600-byte reply pushes the previous out.
    for seq in 1..=3 {
        let t = p.token(1);
        let out = p.p.apply(&who(1), t, seq, 0, setdefault(big.clone()), p.now);
        assert_eq!(value_of(&out, t), big);
    }
    assert!(p.p.logs["c1"].get(1).is_none(), "forgotten for room");
    let t = p.token(1);
    let out = p.p.apply(&who(1), t, 1, 0, setdefault(Value::Nil), p.now);
    let e = error_of(&out, t);
    assert_eq!(e.kind, ErrorKind::ProtocolError);
    assert!(
        e.message.contains("reply was forgotten") && e.message.contains("--max-reply-log"),
        "{e}"
    );
    // Still recorded: answered from the log. New calls run.
    let t = p.token(1);
    assert_eq!(
        value_of(&p.p.apply(&who(1), t, 3, 0, setdefault(Value::Nil), p.now), t),
        big
    );
    let t = p.token(1);
    assert_eq!(
        value_of(&p.p.apply(&who(1), t, 4, 0, setdefault(Value::Nil), p.now), t),
        big
    );
    // Acknowledged, the forgotten call is a stale copy, as any acknowledged one.
    let t = p.token(1);
    p.p.apply(&who(1), t, 5, 5, setdefault(Value::Nil), p.now);
    let t = p.token(1);
    let out = p.p.apply(&who(1), t, 1, 0, setdefault(Value::Nil), p.now);
    assert!(error_of(&out, t).message.contains("stale copy"));
    assert!(p.p.logs["c1"].forgotten.is_empty());
}

#[test]
fn a_replica_replaying_the_log_forgets_the_same_replies() {
    let (mut live, now) = (Partition::new(), Instant::now());
    live.enable_storage();
    let create = Op::Create {
        type_name: "Counter".into(),
        key: "c".into(),
        args: vec![],
        owned: false,
        persistent: true,
    };
    live.apply(&who(1), Token { conn: 1, req: 1 }, 1, 0, create, now);
    for seq in 2..=50 {
        let op = Op::Call {
            type_name: "Counter".into(),
            key: "c".into(),
            method: "increment".into(),
            args: vec![],
            nested: None,
        };
        // Two calls in flight: each acknowledges up to the one before it.
        live.apply(&who(1), Token { conn: 1, req: seq }, seq, seq - 1, op, now);
    }
    let mut replica = Partition::new();
    replica.enable_storage();
    for record in live.take_log().unwrap() {
        replica.replay(&record, now).unwrap();
    }
    let seqs = |p: &Partition| p.logs["c1"].replies.iter().map(|r| r.seq).collect::<Vec<_>>();
    assert_eq!(seqs(&live), [49, 50]);
    assert_eq!(seqs(&replica), seqs(&live));
}

#[test]
fn a_reply_log_finds_every_kept_reply_whatever_the_order_of_its_calls() {
    let mut log = ReplyLog::default();
    // A client's calls may be recorded out of order (several threads, parked calls).
    for seq in [10, 3, 7] {
        log.record(seq, Ok(Value::from(seq)), true, usize::MAX);
    }
    for seq in [3, 7, 10] {
        assert_eq!(log.get(seq).map(|(r, _)| r), Some(Ok(Value::from(seq))), "seq {seq}");
    }
    assert!(log.get(11).is_none() && log.get(5).is_none());
    // Recording a seq again replaces its reply in place.
    log.record(7, Err(Error::value("again")), false, usize::MAX);
    assert_eq!(
        log.get(7).map(|(r, durable)| (r.is_err(), durable)),
        Some((true, false))
    );
    assert_eq!(log.durable().map(|(seq, _)| seq).collect::<Vec<_>>(), [10, 3]);
    // The oldest recorded are forgotten first, the newest kept.
    for seq in 11..11 + REPLY_LOG_LEN as u64 {
        log.record(seq, Ok(Value::Nil), false, usize::MAX);
    }
    assert!(log.get(10).is_none() && log.get(3).is_none());
    assert!(log.get(10 + REPLY_LOG_LEN as u64).is_some());
    assert!(log.get(11 + REPLY_LOG_LEN as u64).is_none());
    // A late call is kept as the newest: the oldest recorded (11) goes, not the lowest.
    log.record(5, Ok(Value::Nil), true, usize::MAX);
    assert!(log.get(5).is_some() && log.get(11).is_none() && log.get(12).is_some());
    assert_eq!(log.replies.len(), REPLY_LOG_LEN);
}

#[test]
fn a_reply_log_forgets_the_oldest_recorded_past_its_bytes() {
    let mut log = ReplyLog::default();
    let big = || Ok(Value::Binary(vec![7; 1 << 20]));
    for seq in 1..=100 {
        log.record(seq, big(), false, 8 << 20);
        assert!(log.bytes <= (8 << 20) + (2 << 20), "{} bytes after {seq}", log.bytes);
    }
    assert!(log.get(100).is_some() && log.get(94).is_some(), "the newest are kept");
    assert!(log.get(90).is_none(), "the oldest are forgotten");
    // Acknowledging them all leaves nothing counted.
    log.acknowledge(101);
    assert_eq!(log.bytes, 0);
    // A reply larger than the limit is still recorded, alone.
    log.record(200, Ok(Value::Binary(vec![0; 9 << 20])), false, 8 << 20);
    log.record(201, Ok(Value::Nil), false, 8 << 20);
    assert!(log.get(200).is_none() && log.get(201).is_some());
}

#[test]
fn all_clients_logs_together_stay_under_their_total_the_largest_forgetting_first() {
    let mut p = Partition::new();
    p.set_reply_log_limit(8 << 20, 20 << 20);
    let big = || Ok(Value::Binary(vec![7; 1 << 20]));
    let small: Arc<str> = Arc::from("small");
    p.record_reply(&small, 1, Ok(Value::from(1)), false);
    // Session after session, each filling its own log.
    for n in 0..10 {
        let client: Arc<str> = Arc::from(format!("c{n}"));
        for seq in 1..=8 {
            p.record_reply(&client, seq, big(), false);
        }
        let total: usize = p.logs.values().map(|log| log.bytes).sum();
        assert_eq!(total, p.logs_bytes);
        assert!(total <= 20 << 20, "{total} bytes after {n}");
    }
    assert!(p.logs["small"].get(1).is_some(), "a small log is left alone");
    assert!(p.logs["c9"].get(8).is_some(), "the newest reply is kept");
    // An ended session gives its bytes back.
    p.end_session("c9", Instant::now());
    assert_eq!(p.logs_bytes, p.logs.values().map(|log| log.bytes).sum::<usize>());
}

#[test]
fn a_reply_just_recorded_is_kept_whatever_its_clients_name() {
    // Logs of one reply each, the total full: the next client's reply is kept and another
    // log forgets, even when the new client's name sorts last among logs of equal size.
    let mut p = Partition::new();
    p.set_reply_log_limit(8 << 20, 4 << 20);
    let big = || Ok(Value::Binary(vec![7; 1 << 20]));
    for name in ["a", "b", "c", "d"] {
        p.record_reply(&Arc::from(name), 1, big(), false);
    }
    let last: Arc<str> = Arc::from("z");
    p.record_reply(&last, 1, big(), false);
    assert!(p.logs["z"].get(1).is_some(), "the reply just recorded is kept");
    assert!(
        p.logs["d"].get(1).is_none(),
        "the largest other log, last by name, forgot"
    );
    assert!(p.logs_bytes <= 4 << 20);
}

#[test]
fn a_reply_log_answers_as_a_map_that_forgets_the_oldest_recorded_first() {
    // The model: what the log must answer, however its calls arrive.
    #[derive(Default)]
    struct Model {
        replies: BTreeMap<u64, (Reply, bool)>,
        order: VecDeque<u64>,
        forgotten: BTreeSet<u64>,
    }
    impl Model {
        fn record(&mut self, seq: u64, reply: Reply, durable: bool) {
            self.forgotten.remove(&seq);
            if self.replies.insert(seq, (reply, durable)).is_none() {
                self.order.push_back(seq);
                if self.order.len() > REPLY_LOG_LEN {
                    let old = self.order.pop_front().unwrap();
                    self.replies.remove(&old);
                    if self.forgotten.len() >= REPLY_LOG_LEN {
                        self.forgotten.pop_first();
                    }
                    self.forgotten.insert(old);
                }
            }
        }
        fn acknowledge(&mut self, seq: u64) {
            self.replies.retain(|&s, _| s >= seq);
            self.order.retain(|&s| s >= seq);
            self.forgotten.retain(|&s| s >= seq);
        }
    }
    let mut state = 0x9e37_79b9_7f4a_7c15_u64;
    let mut rand = |n: u64| {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state % n
    };
    let (mut log, mut model, mut next) = (ReplyLog::default(), Model::default(), 0_u64);
    for step in 0..3 * REPLY_LOG_LEN as u64 {
        // New calls, late ones, retries of old or forgotten ones, the lowest seqs.
        let seq = match rand(8) {
            0..=3 => {
                next += 1 + rand(2);
                next
            }
            4 | 5 => next.saturating_sub(rand(2 * REPLY_LOG_LEN as u64)),
            6 => rand(4),
            _ => next + rand(3),
        };
        // The last third also acknowledges (after the first two filled the log).
        if step > 2 * REPLY_LOG_LEN as u64 && rand(30) == 0 {
            let below = next.saturating_sub(rand(64));
            log.acknowledge(below);
            model.acknowledge(below);
            assert_eq!(log.order, model.order, "step {step}");
        } else if rand(10) < 6 {
            let reply = match rand(4) {
                0 => Err(Error::value(format!("{step}"))),
                _ => Ok(Value::from(step)),
            };
            let durable = rand(2) == 0;
            log.record(seq, reply.clone(), durable, usize::MAX);
            model.record(seq, reply, durable);
            assert!(log
                .replies
                .iter()
                .zip(log.replies.iter().skip(1))
                .all(|(a, b)| a.seq < b.seq));
            assert_eq!(log.order, model.order, "step {step}");
        } else {
            assert_eq!(
                log.get(seq),
                model.replies.get(&seq).cloned(),
                "get({seq}), step {step}"
            );
            assert_eq!(
                log.was_forgotten(seq),
                model.forgotten.contains(&seq),
                "was_forgotten({seq}), step {step}"
            );
        }
    }
    for seq in 0..=next + 2 {
        assert_eq!(log.get(seq), model.replies.get(&seq).cloned(), "get({seq})");
    }
    let durable: Vec<(u64, Reply)> = model
        .order
        .iter()
        .filter_map(|seq| match &model.replies[seq] {
            (reply, true) => Some((*seq, reply.clone())),
            _ => None,
        })
        .collect();
    assert_eq!(log.durable().collect::<Vec<_>>(), durable);
    assert!(
        log.replies.capacity() < 2 * REPLY_LOG_LEN,
        "the ring outgrew its length"
    );
}

#[test]
fn a_parked_then_woken_call_is_recorded() {
    let mut p = Harness::new();
    p.create_ok("Queue", "q", vec![]);
    let (t, out) = p.call(&who(2), 5, "Queue", "q", "get", vec![]);
    assert!(out.is_empty());
    let (_, out) = p.call(&who(1), 1, "Queue", "q", "put", vec!["job".into()]);
    assert_eq!(value_of(&out, t), Value::from("job"));
    p.ok("Queue", "q", "put", vec!["other".into()]);
    // The retry must not take a second item.
    let (t, out) = p.call(&who(2), 5, "Queue", "q", "get", vec![]);
    assert_eq!(value_of(&out, t), Value::from("job"));
    assert_eq!(p.ok("Queue", "q", "qsize", vec![]), Value::from(1));
}

#[test]
fn timed_out_and_withdrawn_calls() {
    let mut p = Harness::new();
    p.create_ok("Queue", "q", vec![]);
    let (t, _) = p.call(&who(2), 5, "Queue", "q", "get", vec![true.into(), 1.into()]);
    assert_eq!(p.p.next_deadline(), Some(p.now + std::time::Duration::from_secs(1)));
    assert_eq!(error_of(&p.advance(1.0), t).kind, ErrorKind::Empty);
    assert_eq!(p.p.next_deadline(), None);
    p.ok("Queue", "q", "put", vec!["x".into()]);
    let (t, out) = p.call(&who(2), 5, "Queue", "q", "get", vec![true.into(), 1.into()]);
    assert_eq!(error_of(&out, t).kind, ErrorKind::Empty, "the recorded timeout");
    // A call withdrawn by a disconnect was never answered: its retry runs.
    let (_, out) = p.call(&who(3), 6, "Queue", "q", "get", vec![]);
    assert_eq!(out.len(), 1);
    let (_, out) = p.call(&who(3), 7, "Queue", "q", "get", vec![true.into(), 100.into()]);
    assert!(out.is_empty());
    assert!(p.p.next_deadline().is_some());
    assert!(p.disconnect(3).is_empty());
    assert_eq!(p.p.next_deadline(), None, "the withdrawn call's timer goes with it");
    p.ok("Queue", "q", "put", vec!["y".into()]);
    let (t, out) = p.call(&who(3), 7, "Queue", "q", "get", vec![]);
    assert_eq!(value_of(&out, t), Value::from("y"));
}

#[test]
fn timers_of_answered_calls_go_away() {
    let mut p = Harness::new();
    p.create_ok("Lock", "l", vec![]);
    p.ok("Lock", "l", "acquire", vec![]);
    for _ in 0..100 {
        p.park(2, "Lock", "l", "acquire", vec![true.into(), 3600.into()]);
        p.ok("Lock", "l", "release", vec![]);
        p.ok_as(&who(2), "Lock", "l", "release", vec![]);
        p.ok("Lock", "l", "acquire", vec![]);
    }
    assert_eq!(p.p.timers.len(), 0);
    assert_eq!(p.p.next_deadline(), None);
}

#[test]
fn ending_a_session_deletes_its_unnamed_objects() {
    let mut p = Harness::new();
    let owner = who(1);
    let op = Op::Create {
        type_name: "Event".into(),
        key: "~c1.1".into(),
        args: vec![],
        owned: true,
        persistent: false,
    };
    let t0 = p.token(1);
    p.p.apply(&owner, t0, 1, 0, op, p.now);
    let (t, out) = p.call(&who(2), 3, "Event", "~c1.1", "wait", vec![]);
    assert!(out.is_empty());
    let out = p.p.end_session("c1", p.now);
    assert_eq!(error_of(&out, t).kind, ErrorKind::NotFound);
    assert_eq!(p.err("Event", "~c1.1", "is_set", vec![]).kind, ErrorKind::NotFound);
    assert!(p.p.is_empty());
}

#[test]
fn a_withdrawn_call_gets_its_timeout_result_and_its_connection_keeps_its_lock() {
    let mut h = Harness::new();
    h.create_ok("Lock", "l", vec![]);
    h.create_ok("Queue", "q", vec![]);
    h.create_ok("Barrier", "b", vec![2.into()]);
    assert_eq!(h.ok_as(&who(1), "Lock", "l", "acquire", vec![]), Value::Boolean(true));
    // Connection 1 waits on an empty queue with no timeout, then gives up.
    let get = h.park(1, "Queue", "q", "get", vec![]);
    let out = h.withdraw(get, "q");
    assert_eq!(error_of(&out, get).kind, ErrorKind::Empty);
    assert_eq!(h.ok("Lock", "l", "locked", vec![]), Value::Boolean(true));
    // The withdrawn get takes nothing: the next item waits for the next get.
    h.ok("Queue", "q", "put", vec![7.into()]);
    assert_eq!(h.ok("Queue", "q", "qsize", vec![]), Value::from(1));
    // Withdrawing what is not parked (answered already, or unknown) does nothing.
    assert!(h.withdraw(get, "q").is_empty());
    assert!(h.withdraw(get, "missing").is_empty());
    // A barrier party that gives up breaks the barrier, as an interrupted threading wait does.
    let wait = h.park(2, "Barrier", "b", "wait", vec![]);
    assert_eq!(error_of(&h.withdraw(wait, "b"), wait).kind, ErrorKind::BrokenBarrier);
    let lock_wait = h.park(3, "Lock", "l", "acquire", vec![]);
    assert_eq!(value_of(&h.withdraw(lock_wait, "l"), lock_wait), Value::Boolean(false));
}

mod user_objects {
    use super::*;
    use crate::objects::user::Forward;

    const T: &str = "py:__main__.Centroids";

    fn ctor(version: &str, args: Vec<Value>) -> Vec<Value> {
        vec![version.into(), Value::Array(args), Value::Map(vec![])]
    }

    fn margs(args: Vec<Value>) -> Vec<Value> {
        vec![Value::Array(args), Value::Map(vec![])]
    }

    /// Send `create` of a user-defined object; returns its token and immediate replies.
    fn create(
        h: &mut Harness,
        caller: &Caller,
        seq: u64,
        key: &str,
        args: Vec<Value>,
        owned: bool,
    ) -> (Token, Vec<Delivery>) {
        let token = h.token(caller.conn);
        let op = Op::Create {
            type_name: T.into(),
            key: key.into(),
            args,
            owned,
            persistent: false,
        };
        let out = h.p.apply(caller, token, seq, 0, op, h.now);
        (token, out)
    }

    /// Construct `key` (version v1) and let its host succeed; returns its object id.
    fn constructed(h: &mut Harness, key: &str) -> u64 {
        let (t, out) = create(h, &who(1), 0, key, ctor("v1", vec![]), false);
        assert!(out.is_empty(), "create parks until the host answers");
        let id = match h.p.take_forwards().as_slice() {
            [Forward::Construct { object_id, .. }] => *object_id,
            other => panic!("expected one Construct, got {other:?}"),
        };
        let out = h.p.complete(key, id, Ok(Value::Nil), h.now);
        assert_eq!(value_of(&out, t), Value::Boolean(true));
        id
    }

    #[test]
    fn create_and_calls_go_to_the_host_in_order() {
        let mut h = Harness::new();
        let (create_t, out) = create(&mut h, &who(1), 1, "c", ctor("v1", vec![3.into()]), false);
        assert!(out.is_empty());
        // A call while constructing queues behind the constructor.
        let (call_t, out) = h.call(&who(2), 1, T, "c", "update", margs(vec![1.into()]));
        assert!(out.is_empty());
        let forwards = h.p.take_forwards();
        let id = forwards[0].object_id();
        assert_eq!(
            forwards,
            vec![
                Forward::Construct {
                    key: "c".into(),
                    object_id: id,
                    type_name: T.into(),
                    version: "v1".into(),
                    args: vec![3.into()],
                    kwargs: Value::Map(vec![]),
                    persistent: false,
                },
                Forward::Call {
                    key: "c".into(),
                    object_id: id,
                    type_name: T.into(),
                    method: "update".into(),
                    args: vec![1.into()],
                    kwargs: Value::Map(vec![]),
                },
            ]
        );
        assert!(h.p.take_forwards().is_empty());
        assert_eq!(
            value_of(&h.p.complete("c", id, Ok(Value::Nil), h.now), create_t),
            Value::Boolean(true)
        );
        assert_eq!(
            value_of(&h.p.complete("c", id, Ok(7.into()), h.now), call_t),
            Value::from(7)
        );
        // Nothing in flight: a stray reply is dropped.
        assert!(h.p.complete("c", id, Ok(8.into()), h.now).is_empty());
        assert_eq!(h.p.objects("", false), vec![("c".to_string(), T.to_string())]);
        assert_eq!(
            (
                h.p.hosted_objects(),
                h.p.count_version(T, "v1"),
                h.p.count_version(T, "v2")
            ),
            (1, 1, 0)
        );
        // The create was recorded: a retry says `true` again without constructing.
        let (t, out) = create(&mut h, &who(1), 1, "c", ctor("v1", vec![]), false);
        assert_eq!(value_of(&out, t), Value::Boolean(true));
        assert!(h.p.take_forwards().is_empty());
    }

    #[test]
    fn objects_of_a_version_name_their_owners() {
        let mut h = Harness::new();
        constructed(&mut h, "named");
        create(&mut h, &who(1), 2, "~c1.1", ctor("v1", vec![]), true);
        let mut found = h.p.objects_of_version(T, "v1");
        found.sort();
        assert_eq!(
            found,
            vec![
                ("named".to_string(), None),
                ("~c1.1".to_string(), Some(Arc::from("c1")))
            ]
        );
        assert!(h.p.objects_of_version(T, "v2").is_empty());
        h.p.end_session("c1", h.now);
        assert_eq!(h.p.objects_of_version(T, "v1"), vec![("named".to_string(), None)]);
    }

    #[test]
    fn create_of_an_existing_key() {
        let mut h = Harness::new();
        let (_, out) = create(&mut h, &who(1), 0, "c", ctor("v1", vec![]), false);
        assert!(out.is_empty());
        h.p.take_forwards();
        // While constructing, as after: `false` at once, nothing forwarded.
        let (t, out) = create(&mut h, &who(2), 0, "c", ctor("v1", vec![]), false);
        assert_eq!(value_of(&out, t), Value::Boolean(false));
        let (t, out) = create(&mut h, &who(2), 0, "c", ctor("v2", vec![]), false);
        let e = error_of(&out, t);
        assert_eq!(e.kind, ErrorKind::TypeMismatch);
        assert_eq!(e.message, format!("'c' is a {T} of version v1, not of version v2"));
        assert!(h.p.take_forwards().is_empty());
        h.create_ok("Counter", "n", vec![]);
        let (t, out) = create(&mut h, &who(2), 0, "n", ctor("v1", vec![]), false);
        assert_eq!(error_of(&out, t).kind, ErrorKind::TypeMismatch);
        assert_eq!(h.err(T, "n", "get", margs(vec![])).kind, ErrorKind::TypeMismatch);
        assert_eq!(h.err("Counter", "c", "get", vec![]).kind, ErrorKind::TypeMismatch);
        for bad in [
            vec![],
            vec!["v1".into()],
            vec!["v1".into(), Value::Nil, Value::Map(vec![])],
        ] {
            let (t, out) = create(&mut h, &who(2), 0, "d", bad, false);
            assert_eq!(error_of(&out, t).kind, ErrorKind::BadArguments);
        }
        assert!(h.p.take_forwards().is_empty());
    }

    #[test]
    fn a_failed_constructor_leaves_no_object() {
        let mut h = Harness::new();
        let (create_t, _) = create(&mut h, &who(1), 0, "c", ctor("v1", vec![]), false);
        let (call_t, _) = h.call(&who(2), 3, T, "c", "update", margs(vec![]));
        let id = h.p.take_forwards()[0].object_id();
        let raised = Error::new(ErrorKind::Raised, "ValueError: k must be positive");
        let out = h.p.complete("c", id, Err(raised.clone()), h.now);
        assert_eq!(error_of(&out, create_t), raised);
        let e = error_of(&out, call_t);
        assert_eq!(e.kind, ErrorKind::NotFound);
        assert!(
            e.message
                .contains("its constructor failed (Raised: ValueError: k must be positive)"),
            "{e}"
        );
        assert!(h.p.is_empty());
        assert_eq!(h.p.hosted_objects(), 0);
        // The host still answers the queued call (it holds no such key): dropped.
        assert!(h
            .p
            .complete("c", id, Err(Error::new(ErrorKind::NotFound, "no")), h.now)
            .is_empty());
        assert_eq!(h.err(T, "c", "update", margs(vec![])).kind, ErrorKind::NotFound);
    }

    #[test]
    fn private_methods_and_bad_arguments_never_reach_the_host() {
        let mut h = Harness::new();
        constructed(&mut h, "c");
        let e = h.err(T, "c", "_secret", margs(vec![]));
        assert_eq!(e.kind, ErrorKind::UnknownMethod);
        assert!(e.message.contains("private and special methods are not shared"), "{e}");
        assert_eq!(
            h.err(T, "c", "__reduce__", margs(vec![])).kind,
            ErrorKind::UnknownMethod
        );
        assert_eq!(h.err(T, "c", "update", vec![]).kind, ErrorKind::BadArguments);
        assert!(h.p.take_forwards().is_empty());
    }

    #[test]
    fn a_lost_object_answers_object_lost_until_constructed_again() {
        let mut h = Harness::new();
        let id = constructed(&mut h, "c");
        let (a, _) = h.call(&who(1), 0, T, "c", "update", margs(vec![]));
        let (b, _) = h.call(&who(2), 4, T, "c", "update", margs(vec![]));
        assert_eq!(h.p.take_forwards().len(), 2);
        let reason = "its object host exited with status 3";
        let out = h.p.lose("c", id, reason, h.now);
        assert_eq!(tokens(&out), vec![a, b]);
        let e = error_of(&out, b);
        assert_eq!(e.kind, ErrorKind::ObjectLost);
        assert_eq!(e.data, Value::Map(vec![("reason".into(), reason.into())]));
        // Later calls are not forwarded; the retry of b gets its recorded reply.
        assert_eq!(h.err(T, "c", "update", margs(vec![])).kind, ErrorKind::ObjectLost);
        let (t, out) = h.call(&who(2), 4, T, "c", "update", margs(vec![]));
        assert_eq!(error_of(&out, t).kind, ErrorKind::ObjectLost);
        assert!(h.p.take_forwards().is_empty());
        assert_eq!(h.p.len(), 1, "a lost object keeps its key");
        assert_eq!(
            (h.p.hosted_objects(), h.p.count_version(T, "v1")),
            (0, 0),
            "but holds no instance"
        );
        // A create constructs a fresh object under a new id (of the version defined now);
        // the old id's replies are dropped.
        let (t, out) = create(&mut h, &who(1), 0, "c", ctor("v2", vec![]), false);
        assert!(out.is_empty());
        let new_id = h.p.take_forwards()[0].object_id();
        assert_ne!(new_id, id);
        assert!(h.p.complete("c", id, Ok(Value::Nil), h.now).is_empty());
        assert!(h.p.lose("c", id, "late", h.now).is_empty());
        assert_eq!(
            value_of(&h.p.complete("c", new_id, Ok(Value::Nil), h.now), t),
            Value::Boolean(true)
        );
        assert_eq!((h.p.hosted_objects(), h.p.count_version(T, "v2")), (1, 1));
        // Deleting it after it was lost again counts nothing twice.
        h.p.lose("c", new_id, "gone", h.now);
        h.delete("c");
        assert_eq!((h.p.len(), h.p.hosted_objects()), (0, 0));
    }

    #[test]
    fn an_object_lost_while_constructing_is_gone() {
        let mut h = Harness::new();
        let (create_t, _) = create(&mut h, &who(1), 0, "c", ctor("v1", vec![]), false);
        let (call_t, _) = h.call(&who(2), 0, T, "c", "update", margs(vec![]));
        let id = h.p.take_forwards()[0].object_id();
        let out = h.p.lose("c", id, "its object host did not connect within 30 s", h.now);
        assert_eq!(error_of(&out, create_t).kind, ErrorKind::ObjectLost);
        assert_eq!(error_of(&out, call_t).kind, ErrorKind::ObjectLost);
        assert!(h.p.is_empty());
        assert_eq!(h.p.hosted_objects(), 0);
    }

    #[test]
    fn a_call_resent_while_in_flight_runs_once() {
        let mut h = Harness::new();
        let id = constructed(&mut h, "c");
        let first = Caller { conn: 1, ..who(5) };
        let (t1, out) = h.call(&first, 9, T, "c", "update", margs(vec![]));
        assert!(out.is_empty());
        assert_eq!(h.p.take_forwards().len(), 1);
        // The client reconnects and resends: not forwarded again.
        let again = Caller { conn: 2, ..who(5) };
        let (t2, out) = h.call(&again, 9, T, "c", "update", margs(vec![]));
        assert!(out.is_empty());
        assert!(h.p.take_forwards().is_empty());
        let out = h.p.complete("c", id, Ok(42.into()), h.now);
        assert_eq!(tokens(&out), vec![t2], "the resent call takes the first one's place");
        assert_ne!(t1, t2);
        let (t3, out) = h.call(&again, 9, T, "c", "update", margs(vec![]));
        assert_eq!(value_of(&out, t3), Value::from(42));
        // A retried create while constructing takes over the same way.
        let (c1, _) = create(&mut h, &first, 10, "d", ctor("v1", vec![]), false);
        let (c2, out) = create(&mut h, &again, 10, "d", ctor("v1", vec![]), false);
        assert!(out.is_empty());
        let d = h.p.take_forwards()[0].object_id();
        assert_eq!(tokens(&h.p.complete("d", d, Ok(Value::Nil), h.now)), vec![c2]);
        assert_ne!(c1, c2);
    }

    #[test]
    fn a_disconnect_keeps_the_reply_of_a_call_the_host_runs() {
        let mut h = Harness::new();
        let id = constructed(&mut h, "c");
        let (_, out) = h.call(&who(3), 9, T, "c", "update", margs(vec![]));
        assert!(out.is_empty());
        assert_eq!(h.p.take_forwards().len(), 1);
        assert!(h.disconnect(3).is_empty());
        // The reply goes to the closed connection (the server drops it) and is recorded.
        assert_eq!(h.p.complete("c", id, Ok(5.into()), h.now).len(), 1);
        let back = Caller { conn: 4, ..who(3) };
        let (t, out) = h.call(&back, 9, T, "c", "update", margs(vec![]));
        assert_eq!(value_of(&out, t), Value::from(5));
        assert!(h.p.take_forwards().is_empty());
    }

    #[test]
    fn delete_and_session_end_drain_calls_and_drop_the_instance() {
        let mut h = Harness::new();
        let id = constructed(&mut h, "c");
        let (t, _) = h.call(&who(2), 0, T, "c", "update", margs(vec![]));
        h.p.take_forwards();
        let out = h.delete("c");
        assert_eq!(error_of(&out, t).kind, ErrorKind::NotFound);
        assert_eq!(
            h.p.take_forwards(),
            vec![Forward::Drop {
                key: "c".into(),
                object_id: id
            }]
        );
        assert_eq!(h.p.hosted_objects(), 0);
        // The host's late answer about the deleted object is dropped.
        assert!(h.p.complete("c", id, Ok(1.into()), h.now).is_empty());
        // An unnamed object goes with its session, constructing or not.
        let (t, _) = create(&mut h, &who(1), 0, "~c1.1", ctor("v1", vec![]), true);
        let id = h.p.take_forwards()[0].object_id();
        let out = h.p.end_session("c1", h.now);
        assert_eq!(error_of(&out, t).kind, ErrorKind::NotFound);
        assert_eq!(
            h.p.take_forwards(),
            vec![Forward::Drop {
                key: "~c1.1".into(),
                object_id: id
            }]
        );
        assert!(h.p.is_empty());
    }

    #[test]
    fn keep_detaches_but_never_renames() {
        let mut h = Harness::new();
        let (t, _) = create(&mut h, &who(1), 0, "~c1.1", ctor("v1", vec![]), true);
        let id = h.p.take_forwards()[0].object_id();
        h.p.complete("~c1.1", id, Ok(Value::Nil), h.now);
        let e = h.p.detach(T, "~c1.1").err().expect("refused");
        assert_eq!(e.kind, ErrorKind::ValueError);
        assert!(e.message.contains("construct it with name= instead"), "{e}");
        assert_eq!(h.p.disown(T, "~c1.1"), Ok(()));
        assert!(h.p.end_session("c1", h.now).is_empty());
        assert_eq!(h.p.len(), 1, "kept: it outlives its session");
        assert_ne!(t.req, 0);
    }

    #[test]
    fn an_object_lost_twice_is_uncounted_once() {
        // Its host's exit and a call that found no host both report the loss.
        let mut h = Harness::new();
        let a = constructed(&mut h, "a");
        constructed(&mut h, "b");
        assert_eq!(h.p.count_version(T, "v1"), 2);
        let (t, _) = h.call(&who(1), 0, T, "a", "update", margs(vec![]));
        let out = h.p.lose("a", a, "its object host exited with status 1", h.now);
        assert_eq!(error_of(&out, t).kind, ErrorKind::ObjectLost);
        assert!(h
            .p
            .lose("a", a, "its object host exited with status 1", h.now)
            .is_empty());
        assert_eq!(
            (h.p.count_version(T, "v1"), h.p.hosted_objects()),
            (1, 1),
            "b still holds v1 back from define"
        );
        h.delete("a");
        assert_eq!(h.p.count_version(T, "v1"), 1);
    }

    #[test]
    fn a_call_that_finds_no_instance_while_constructing_waits_for_the_constructor() {
        // The host answered the constructor with an exception (so it holds no instance)
        // while a call was being applied: the constructor's answer is on its way.
        let mut h = Harness::new();
        let (create_t, _) = create(&mut h, &who(1), 0, "c", ctor("v1", vec![]), false);
        let (call_t, _) = h.call(&who(2), 0, T, "c", "update", margs(vec![]));
        let id = h.p.take_forwards()[0].object_id();
        assert!(h.p.orphaned("c", id, "its object host stopped", h.now).is_empty());
        let raised = Error::new(ErrorKind::Raised, "ValueError: k must be positive");
        let out = h.p.complete("c", id, Err(raised.clone()), h.now);
        assert_eq!(error_of(&out, create_t), raised);
        assert_eq!(error_of(&out, call_t).kind, ErrorKind::NotFound);
        // A constructed object no host holds is lost, as before.
        let id = constructed(&mut h, "d");
        let (t, _) = h.call(&who(2), 0, T, "d", "update", margs(vec![]));
        let out = h.p.orphaned("d", id, "its object host exited with status 1", h.now);
        assert_eq!(error_of(&out, t).kind, ErrorKind::ObjectLost);
    }

    #[test]
    fn an_ended_session_keeps_no_reply_log_for_calls_still_in_flight() {
        let mut h = Harness::new();
        let id = constructed(&mut h, "c");
        let (_, out) = h.call(&who(3), 9, T, "c", "update", margs(vec![]));
        assert!(out.is_empty());
        assert!(h.disconnect(3).is_empty());
        assert!(h.p.end_session("c3", h.now).is_empty());
        // The host answers after the session is gone: nobody can retry it any more.
        assert_eq!(h.p.complete("c", id, Ok(5.into()), h.now).len(), 1);
        assert!(h.p.logs.is_empty(), "a log for an ended session");
        assert!(h.p.parked_seqs.is_empty() && h.p.hosted.is_empty());
    }

    mod persistent {
        use super::*;

        /// A harness whose partition logs, and a persistent create of `key` (class code
        /// offered first, as the server does).
        pub(super) fn durable() -> Harness {
            let mut h = Harness::new();
            h.p.enable_storage();
            h
        }

        pub(super) fn create_p(
            h: &mut Harness,
            caller: &Caller,
            seq: u64,
            key: &str,
            owned: bool,
        ) -> (Token, Vec<Delivery>) {
            h.p.offer_class(T, "v1", &Arc::new(vec![0xc0, 0xde])).unwrap();
            let token = h.token(caller.conn);
            let op = Op::Create {
                type_name: T.into(),
                key: key.into(),
                args: ctor("v1", vec![]),
                owned,
                persistent: true,
            };
            let out = h.p.apply(caller, token, seq, 0, op, h.now);
            (token, out)
        }

        pub(super) fn decode_all(log: &[Vec<u8>]) -> Vec<Record> {
            log.iter().map(|r| Record::decode(r).expect("decodes")).collect()
        }

        /// Construct persistent `key` with state `s0`; returns its id and the records.
        pub(super) fn constructed_p(h: &mut Harness, key: &str) -> (u64, Vec<Vec<u8>>) {
            let (t, out) = create_p(h, &who(1), 1, key, false);
            assert!(out.is_empty());
            assert_eq!(h.p.take_log(), Some(vec![]), "the create itself is not logged");
            let id = match h.p.take_forwards().as_slice() {
                [Forward::Construct {
                    object_id,
                    persistent: true,
                    ..
                }] => *object_id,
                other => panic!("expected one persistent Construct, got {other:?}"),
            };
            let out =
                h.p.complete_with_state(key, id, Ok(Value::Nil), Some(b"s0".to_vec()), h.now);
            assert_eq!(value_of(&out, t), Value::Boolean(true));
            (id, h.p.take_log().expect("logged"))
        }

        #[test]
        fn a_persistent_user_object_needs_a_data_directory() {
            let mut h = Harness::new();
            let (t, out) = create_p(&mut h, &who(1), 1, "c", false);
            let e = error_of(&out, t);
            assert_eq!(e.kind, ErrorKind::ValueError);
            assert!(e.message.contains("no --data-dir"), "{e}");
            assert!(h.p.take_forwards().is_empty() && h.p.is_empty());
        }

        #[test]
        fn complete_logs_the_class_once_then_the_state_with_the_reply() {
            let mut h = durable();
            let (id, log) = constructed_p(&mut h, "c");
            assert_eq!(
                decode_all(&log),
                vec![
                    Record::Class {
                        type_name: T.into(),
                        version: "v1".into(),
                        code: vec![0xc0, 0xde]
                    },
                    Record::UserState {
                        key: "c".into(),
                        type_name: T.into(),
                        version: "v1".into(),
                        owner: None,
                        token: Token { conn: 1, req: 1 },
                        client: Some("c1".into()),
                        seq: 1,
                        reply: Ok(Value::Boolean(true)),
                        state: b"s0".to_vec(),
                    },
                ]
            );
            assert_eq!(h.p.persistent_len(), 1);
            // A method that raises logs its state too, with its error as the reply.
            let (t, _) = h.call(&who(2), 7, T, "c", "update", margs(vec![]));
            assert_eq!(h.p.take_log(), Some(vec![]), "a call waits for the log, unlogged");
            let raised = Error::new(ErrorKind::Raised, "ValueError: no");
            let out =
                h.p.complete_with_state("c", id, Err(raised.clone()), Some(b"s1".to_vec()), h.now);
            assert_eq!(error_of(&out, t), raised);
            let log = decode_all(&h.p.take_log().expect("logged"));
            assert!(
                matches!(&log[..], [Record::UserState { seq: 7, reply: Err(e), state, .. }]
                    if *e == raised && state == b"s1"),
                "{log:?}"
            );
            // A call whose state did not pickle logs nothing (the host kept the last one).
            let (t, _) = h.call(&who(2), 8, T, "c", "update", margs(vec![]));
            let e = Error::new(ErrorKind::Raised, "TypeError: cannot pickle the state");
            let out = h.p.complete_with_state("c", id, Err(e.clone()), None, h.now);
            assert_eq!(error_of(&out, t), e);
            assert_eq!(h.p.take_log(), Some(vec![]));
            assert_eq!(h.p.stored_user_objects()[0].state, b"s1".to_vec());
            assert_eq!(h.p.classes().len(), 1);
        }

        #[test]
        fn replay_rebuilds_a_stored_object_and_its_replies() {
            let mut h = durable();
            let (id, mut log) = constructed_p(&mut h, "c");
            let (_, _) = h.call(&who(2), 7, T, "c", "update", margs(vec![]));
            h.p.take_forwards();
            h.p.complete_with_state("c", id, Ok(41.into()), Some(b"s1".to_vec()), h.now);
            log.extend(h.p.take_log().unwrap());
            // An unnamed one, owned by session c3.
            let (_, _) = create_p(&mut h, &who(3), 1, "~c3.1", true);
            let id3 = h.p.take_forwards()[0].object_id();
            h.p.complete_with_state("~c3.1", id3, Ok(Value::Nil), Some(b"u0".to_vec()), h.now);
            log.extend(h.p.take_log().unwrap());

            let mut r = Partition::new();
            r.enable_storage();
            for rec in &log {
                r.replay(rec, h.now).unwrap();
            }
            assert_eq!(r.stored_user_objects(), h.p.stored_user_objects());
            assert_eq!(r.stored_user_objects().len(), 2);
            assert_eq!(r.class_code(T, "v1").map(|c| c.to_vec()), Some(vec![0xc0, 0xde]));
            assert!(r.take_forwards().is_empty(), "nothing runs in a host during replay");
            assert_eq!(r.count_version(T, "v1"), 2, "stored objects hold their version");
            assert_eq!(r.objects("", true), vec![("c".to_string(), T.to_string())]);
            let mut h2 = Harness::new();
            h2.p = r;
            // The retried call gets its recorded reply; nothing reaches a host.
            let (t, out) = h2.call(&who(2), 7, T, "c", "update", margs(vec![]));
            assert_eq!(value_of(&out, t), Value::from(41));
            let (t, out) = create_p(&mut h2, &who(1), 1, "c", false);
            assert_eq!(value_of(&out, t), Value::Boolean(true));
            assert!(h2.p.take_forwards().is_empty());
            // The owner's session end is logged, and deletes its object.
            assert!(h2.p.end_session("c3", h2.now).is_empty());
            let log = decode_all(&h2.p.take_log().unwrap());
            assert!(log.contains(&Record::EndSession { client: "c3".into() }), "{log:?}");
            assert_eq!(h2.p.stored_user_objects().len(), 1);
            assert!(h2.p.take_forwards().is_empty(), "a stored object is in no host");
        }

        #[test]
        fn a_partition_snapshot_carries_stored_objects_classes_and_their_replies() {
            let mut h = durable();
            let (id, mut log) = constructed_p(&mut h, "c");
            // Constructing at the moment: left to the log.
            let (_, _) = create_p(&mut h, &who(3), 1, "late", false);
            let late = h.p.take_forwards()[0].object_id();
            log.extend(h.p.take_log().unwrap_or_default());
            let at = log.len();
            let mut body = h.p.begin_snapshot();
            // A call completes before the capture reaches the object: copy on write.
            h.call(&who(2), 7, T, "c", "update", margs(vec![]));
            h.p.take_forwards();
            h.p.complete_with_state("c", id, Ok(41.into()), Some(b"s1".to_vec()), h.now);
            h.p.complete_with_state("late", late, Ok(Value::Nil), Some(b"L0".to_vec()), h.now);
            log.extend(h.p.take_log().unwrap());
            body.extend(h.p.snapshot_chunk(usize::MAX).unwrap().0);

            let restore = |tail: &[Vec<u8>]| {
                let mut r = Partition::new();
                r.enable_storage();
                r.restore_snapshot(&mut &body[..], h.now).unwrap();
                for rec in tail {
                    r.replay(rec, h.now).unwrap();
                }
                r
            };
            let at_moment = restore(&[]);
            let stored = at_moment.stored_user_objects();
            assert_eq!(stored.len(), 1, "only the acknowledged object");
            assert_eq!((stored[0].key.as_str(), stored[0].state.as_slice()), ("c", &b"s0"[..]));
            assert_eq!(
                at_moment.class_code(T, "v1").map(|c| c.to_vec()),
                Some(vec![0xc0, 0xde])
            );
            let r = restore(&log[at..]);
            let mut full = Partition::new();
            full.enable_storage();
            for rec in &log {
                full.replay(rec, h.now).unwrap();
            }
            assert_eq!(r.stored_user_objects(), h.p.stored_user_objects());
            assert_eq!(r.stored_user_objects(), full.stored_user_objects());
            assert_eq!(r.durable_replies(), full.durable_replies());
            // Live, the completed call's reply is recorded as durable too.
            assert_eq!(h.p.durable_replies(), full.durable_replies());
        }

        #[test]
        fn nothing_about_an_object_still_constructing_is_logged() {
            let mut h = durable();
            create_p(&mut h, &who(1), 1, "k", false);
            h.p.take_forwards();
            h.p.take_log();
            // A replay finds no object at `k`: a logged create there would make one, a
            // logged delete would answer otherwise.
            let token = h.token(2);
            let op = Op::Create {
                type_name: "Counter".into(),
                key: "k".into(),
                args: vec![],
                owned: false,
                persistent: true,
            };
            let out = h.p.apply(&who(2), token, 1, 0, op, h.now);
            assert_eq!(error_of(&out, token).kind, ErrorKind::TypeMismatch);
            let token = h.token(3);
            let out = h.p.apply(&who(3), token, 1, 0, Op::Delete { key: "k".into() }, h.now);
            assert_eq!(value_of(&out, token), Value::Boolean(true));
            assert!(h.p.take_log().unwrap_or_default().is_empty());
            assert!(h.p.persistent_snapshots().is_empty());
        }

        #[test]
        fn the_first_call_on_a_stored_object_restores_it_first() {
            let mut h = durable();
            let (_, log) = constructed_p(&mut h, "c");
            let mut r = Partition::new();
            r.enable_storage();
            for rec in &log {
                r.replay(rec, h.now).unwrap();
            }
            h.p = r;
            let (t, out) = h.call(&who(2), 3, T, "c", "update", margs(vec![5.into()]));
            assert!(out.is_empty());
            let forwards = h.p.take_forwards();
            let id = forwards[0].object_id();
            assert_eq!(
                forwards,
                vec![
                    Forward::Restore {
                        key: "c".into(),
                        object_id: id,
                        type_name: T.into(),
                        version: "v1".into(),
                        state: b"s0".to_vec(),
                    },
                    Forward::Call {
                        key: "c".into(),
                        object_id: id,
                        type_name: T.into(),
                        method: "update".into(),
                        args: vec![5.into()],
                        kwargs: Value::Map(vec![]),
                    },
                ]
            );
            // Restored once: the next call goes straight to the host.
            h.call(&who(2), 4, T, "c", "update", margs(vec![]));
            assert!(matches!(h.p.take_forwards().as_slice(), [Forward::Call { .. }]));
            let out =
                h.p.complete_with_state("c", id, Ok(1.into()), Some(b"s1".to_vec()), h.now);
            assert_eq!(value_of(&out, t), Value::from(1));
            // Nothing new was logged for the class: the replayed record stands.
            let log = decode_all(&h.p.take_log().unwrap());
            assert!(matches!(&log[..], [Record::UserState { .. }]), "{log:?}");
        }

        #[test]
        fn a_host_death_stores_the_object_and_answers_its_calls_object_lost() {
            let mut h = durable();
            let (id, _) = constructed_p(&mut h, "c");
            let (a, _) = h.call(&who(2), 5, T, "c", "update", margs(vec![]));
            let (b, _) = h.call(&who(2), 6, T, "c", "update", margs(vec![]));
            h.p.take_forwards();
            // a ran (its state is logged), b was running when the host died.
            h.p.complete_with_state("c", id, Ok(1.into()), Some(b"s1".to_vec()), h.now);
            h.p.take_log();
            let out = h.p.lose("c", id, "its object host exited with status 3", h.now);
            assert_eq!(tokens(&out), vec![b]);
            let e = error_of(&out, b);
            assert_eq!(e.kind, ErrorKind::ObjectLost);
            let reason = e.data.as_map().unwrap()[0].1.as_str().unwrap().to_string();
            assert!(reason.starts_with("its object host exited with status 3; "), "{reason}");
            assert!(reason.contains("restored to its last acknowledged state"), "{reason}");
            assert!(reason.contains("this call did not take effect"), "{reason}");
            assert_eq!(h.p.take_log(), Some(vec![]), "nothing logged; replies wait in order");
            assert_eq!(h.p.count_version(T, "v1"), 1, "not lost: its version is held");
            assert_ne!(a, b);
            // The next call restores it from the last logged state under a new id.
            let (t, _) = h.call(&who(2), 7, T, "c", "update", margs(vec![]));
            let forwards = h.p.take_forwards();
            let new_id = forwards[0].object_id();
            assert_ne!(new_id, id);
            assert!(
                matches!(&forwards[0], Forward::Restore { state, .. } if state == b"s1"),
                "{forwards:?}"
            );
            // The dead host's late answer is dropped; the new one's counts.
            assert!(h.p.complete("c", id, Ok(9.into()), h.now).is_empty());
            let out =
                h.p.complete_with_state("c", new_id, Ok(2.into()), Some(b"s2".to_vec()), h.now);
            assert_eq!(value_of(&out, t), Value::from(2));
            h.p.take_log();
            // Lost while constructing: gone, as an ephemeral one.
            let (ct, _) = create_p(&mut h, &who(1), 9, "d", false);
            let d = h.p.take_forwards()[0].object_id();
            let out = h.p.lose("d", d, "its object host was killed by signal 9", h.now);
            assert_eq!(error_of(&out, ct).kind, ErrorKind::ObjectLost);
            // Only `c` is stored (a check that `d` is absent alone passes on an empty list).
            let stored: Vec<String> = h.p.stored_user_objects().into_iter().map(|o| o.key).collect();
            assert_eq!(stored, ["c"]);
            // Deleting a stored object is logged, sends nothing to a host and frees its version.
            h.p.lose("c", new_id, "gone", h.now);
            h.p.take_forwards();
            h.delete("c");
            assert!(h.p.take_forwards().is_empty());
            let log = decode_all(&h.p.take_log().unwrap());
            assert!(
                matches!(
                    &log[..],
                    [Record::Apply {
                        op: Op::Delete { .. },
                        ..
                    }]
                ),
                "{log:?}"
            );
            assert_eq!(h.p.count_version(T, "v1"), 0);
        }

        #[test]
        fn a_state_too_large_to_log_discards_the_call_and_stores_the_object() {
            let mut h = durable();
            let (id, _) = constructed_p(&mut h, "c");
            let (a, _) = h.call(&who(2), 5, T, "c", "update", margs(vec![]));
            let (b, _) = h.call(&who(2), 6, T, "c", "update", margs(vec![]));
            h.p.take_forwards();
            let huge = vec![0; MAX_RECORD_LEN];
            let out = h.p.complete_with_state("c", id, Ok(1.into()), Some(huge), h.now);
            let e = error_of(&out, a);
            assert_eq!(e.kind, ErrorKind::ValueError);
            assert!(e.message.contains("over the 67108864 an op-log record holds"), "{e}");
            // b was sent to the host after a: it ran on a state never logged.
            assert_eq!(error_of(&out, b).kind, ErrorKind::ObjectLost);
            assert_eq!(h.p.take_log(), Some(vec![]));
            assert!(matches!(h.p.take_forwards().as_slice(), [Forward::Drop { .. }]));
            h.call(&who(2), 7, T, "c", "update", margs(vec![]));
            assert!(matches!(&h.p.take_forwards()[0], Forward::Restore { state, .. } if state == b"s0"));
        }

        #[test]
        fn a_failed_log_refuses_calls_on_persistent_user_objects() {
            let mut h = durable();
            constructed_p(&mut h, "c");
            h.p.storage_failed("No space left on device");
            assert_eq!(h.err(T, "c", "update", margs(vec![])).kind, ErrorKind::StorageError);
            assert!(h.p.take_forwards().is_empty());
        }

        #[test]
        fn a_constructor_reply_without_state_fails_the_create() {
            let mut h = durable();
            let (t, _) = create_p(&mut h, &who(1), 1, "c", false);
            let id = h.p.take_forwards()[0].object_id();
            let out = h.p.complete("c", id, Ok(Value::Nil), h.now);
            assert_eq!(error_of(&out, t).kind, ErrorKind::Internal);
            assert!(h.p.is_empty());
            assert!(matches!(h.p.take_forwards().as_slice(), [Forward::Drop { .. }]));
        }
    }

    /// User-defined objects in transactions (`transaction::copies`): copies in the host,
    /// adopted at commit, dropped otherwise.
    mod in_transactions {
        use super::*;
        use std::time::Duration;

        fn txn(client: u64, number: u64) -> TxnId {
            TxnId {
                client: Arc::from(format!("c{client}")),
                number,
            }
        }

        /// Call `op` as transaction `id` (of age `age`) from connection `id`'s client;
        /// returns its token and its reply if it did not park.
        fn step(h: &mut Harness, id: &TxnId, age: u64, seq: u64, op: Op) -> (Token, Option<Reply>) {
            let conn: u64 = id.client[1..].parse().unwrap();
            let token = h.token(conn);
            let call = TxnCall {
                id,
                age,
                first: true,
                deadline: h.now + Duration::from_secs(5),
                max_bytes: 1 << 20,
            };
            let out = h.p.apply_in(call, &who(conn), token, seq, op, h.now);
            (token, out.into_iter().find(|d| d.token == token).map(|d| d.reply))
        }

        fn update(key: &str, n: i64) -> Op {
            Op::Call {
                type_name: T.into(),
                key: key.into(),
                method: "update".into(),
                args: margs(vec![n.into()]),
                nested: None,
            }
        }

        /// The copy a transaction's first call asked for, and the call on it.
        fn copied(h: &mut Harness, key: &str, object_id: u64) -> u64 {
            match h.p.take_forwards().as_slice() {
                [Forward::Copy {
                    key: k,
                    object_id: o,
                    copy_id,
                }, Forward::CopyCall { copy_id: c, .. }]
                    if k == key && *o == object_id && c == copy_id =>
                {
                    *copy_id
                }
                other => panic!("expected a Copy and a CopyCall, got {other:?}"),
            }
        }

        #[test]
        fn calls_run_on_a_copy_and_the_commit_makes_it_the_object() {
            let mut h = Harness::new();
            let id = constructed(&mut h, "c");
            let t1 = txn(1, 1);
            let (call, reply) = step(&mut h, &t1, 10, 1, update("c", 5));
            assert_eq!(reply, None, "it waits for the host");
            let copy = copied(&mut h, "c", id);
            assert_ne!(copy, id);
            // The copy's answer, then the call's: the call is answered from the copy.
            assert!(h.p.complete("c", copy, Ok(Value::Nil), h.now).is_empty());
            let out = h.p.complete("c", copy, Ok(5.into()), h.now);
            assert_eq!(value_of(&out, call), Value::from(5));
            // Resent once answered: the same reply, nothing reaches the host.
            assert_eq!(step(&mut h, &t1, 10, 1, update("c", 5)).1, Some(Ok(5.into())));
            // Its next call goes to the same copy.
            let (call, _) = step(&mut h, &t1, 10, 2, update("c", 1));
            assert!(matches!(h.p.take_forwards().as_slice(), [Forward::CopyCall { copy_id, .. }] if *copy_id == copy));
            assert_eq!(
                value_of(&h.p.complete("c", copy, Ok(6.into()), h.now), call),
                Value::from(6)
            );
            h.p.validate(&t1).unwrap();
            h.p.commit(&t1, 1, 0, &Ok(true.into()), h.now);
            assert_eq!(
                h.p.take_forwards(),
                vec![Forward::Adopt {
                    key: "c".into(),
                    object_id: id,
                    copy_id: copy,
                }]
            );
            assert_eq!(h.p.open_txns(), 0);
            // Single calls go to the instance (the adopted copy) again.
            h.call(&who(2), 0, T, "c", "update", margs(vec![]));
            assert!(matches!(h.p.take_forwards().as_slice(), [Forward::Call { object_id, .. }] if *object_id == id));
        }

        #[test]
        fn an_abort_drops_the_copy_and_a_single_call_in_between_fails_the_commit() {
            let mut h = Harness::new();
            let id = constructed(&mut h, "c");
            let t1 = txn(1, 1);
            let (call, _) = step(&mut h, &t1, 10, 1, update("c", 5));
            let copy = copied(&mut h, "c", id);
            h.p.complete("c", copy, Ok(Value::Nil), h.now);
            h.p.complete("c", copy, Ok(5.into()), h.now);
            // A single call (any method may change the object) between the copy and the commit.
            let (single, _) = h.call(&who(2), 0, T, "c", "get", margs(vec![]));
            assert!(matches!(h.p.take_forwards().as_slice(), [Forward::Call { .. }]));
            assert_eq!(
                value_of(&h.p.complete("c", id, Ok(0.into()), h.now), single),
                Value::from(0)
            );
            let e = h.p.validate(&t1).unwrap_err();
            assert_eq!(e.kind, ErrorKind::TransactionConflict);
            assert!(e.message.contains("changed after the transaction read it"), "{e}");
            h.p.drop_txn(&t1, h.now);
            assert_eq!(
                h.p.take_forwards(),
                vec![Forward::DropCopy {
                    key: "c".into(),
                    copy_id: copy,
                }]
            );
            // A late answer about the dropped copy goes nowhere.
            assert!(h.p.complete("c", copy, Ok(1.into()), h.now).is_empty());
            let _ = call;
        }

        #[test]
        fn a_wounded_transactions_call_in_flight_is_answered_conflict() {
            let mut h = Harness::new();
            let id = constructed(&mut h, "c");
            let (young, old) = (txn(1, 1), txn(2, 1));
            let (call, _) = step(&mut h, &young, 20, 1, update("c", 5));
            let copy = copied(&mut h, "c", id);
            // The older one takes the object: the younger's copy is dropped behind its call.
            let (_, reply) = step(&mut h, &old, 10, 1, update("c", 7));
            assert_eq!(reply, None);
            let forwards = h.p.take_forwards();
            assert!(
                matches!(&forwards[..], [Forward::DropCopy { copy_id, .. }, Forward::Copy { object_id, .. }, Forward::CopyCall { .. }]
                    if *copy_id == copy && *object_id == id),
                "{forwards:?}"
            );
            h.p.complete("c", copy, Ok(Value::Nil), h.now);
            let e = error_of(&h.p.complete("c", copy, Ok(5.into()), h.now), call);
            assert_eq!(e.kind, ErrorKind::TransactionConflict);
            // Its next call (not a first one) learns it was aborted.
            let next = TxnCall {
                id: &young,
                age: 20,
                first: false,
                deadline: h.now + Duration::from_secs(5),
                max_bytes: 1 << 20,
            };
            let token = h.token(1);
            let out = h.p.apply_in(next, &who(1), token, 2, update("c", 1), h.now);
            assert_eq!(error_of(&out, token).kind, ErrorKind::TransactionConflict);
        }

        /// A partition given up (its leader stepped down) answers a transaction's call
        /// running on its copy, and its host drops the copy: the partition that would take
        /// the host's answer is replaced.
        #[test]
        fn a_partition_given_up_answers_a_call_running_on_a_copy() {
            let mut h = Harness::new();
            let id = constructed(&mut h, "c");
            let t1 = txn(1, 1);
            let (call, _) = step(&mut h, &t1, 10, 1, update("c", 5));
            let copy = copied(&mut h, "c", id);
            let error = Error::new(ErrorKind::NotLeader, "this node no longer leads the shard");
            let out = h.p.abandon(&error, h.now);
            let forwards = h.p.take_forwards();
            assert!(
                out.iter().any(|d| d.token == call),
                "the call on the copy is answered: {out:?}"
            );
            assert!(
                forwards
                    .iter()
                    .any(|f| matches!(f, Forward::DropCopy { copy_id, .. } if *copy_id == copy)),
                "the host drops the copy: {forwards:?}"
            );
        }

        #[test]
        fn a_host_dying_with_a_copy_aborts_the_transaction_not_the_object() {
            let mut h = Harness::new();
            let id = constructed(&mut h, "c");
            let t1 = txn(1, 1);
            let (call, _) = step(&mut h, &t1, 10, 1, update("c", 5));
            let copy = copied(&mut h, "c", id);
            let out = h.p.lose("c", copy, "its object host was killed", h.now);
            let e = error_of(&out, call);
            assert_eq!(e.kind, ErrorKind::TransactionConflict);
            assert!(e.message.contains("was lost with its object host"), "{e}");
            assert_eq!(h.p.validate(&t1).unwrap_err().kind, ErrorKind::TransactionConflict);
            // A copy that could not be made (its state does not pickle) cannot be retried.
            let t2 = txn(1, 2);
            let (call, _) = step(&mut h, &t2, 10, 1, update("c", 5));
            let copy = copied(&mut h, "c", id);
            let raised = Error::new(ErrorKind::Raised, "TypeError: cannot pickle '_thread.lock' object");
            let out = h.p.complete("c", copy, Err(raised), h.now);
            let e = error_of(&out, call);
            assert_eq!(e.kind, ErrorKind::TransactionError);
            assert!(e.message.contains("could not be copied"), "{e}");
            assert_eq!(h.p.open_txns(), 0);
        }

        #[test]
        fn creates_attach_deletes_commit_and_constructing_inside_is_refused() {
            let mut h = Harness::new();
            let id = constructed(&mut h, "c");
            let t1 = txn(1, 1);
            let attach = Op::Create {
                type_name: T.into(),
                key: "c".into(),
                args: ctor("v1", vec![]),
                owned: false,
                persistent: false,
            };
            assert_eq!(step(&mut h, &t1, 10, 1, attach).1, Some(Ok(false.into())));
            let copy = match h.p.take_forwards().as_slice() {
                [Forward::Copy { copy_id, .. }] => *copy_id,
                other => panic!("{other:?}"),
            };
            let delete = Op::Delete { key: "c".into() };
            assert_eq!(step(&mut h, &t1, 10, 2, delete).1, Some(Ok(true.into())));
            let (_, gone) = step(&mut h, &t1, 10, 3, update("c", 1));
            assert_eq!(gone.unwrap().unwrap_err().kind, ErrorKind::NotFound);
            h.p.complete("c", copy, Ok(Value::Nil), h.now);
            h.p.validate(&t1).unwrap();
            h.p.commit(&t1, 1, 0, &Ok(true.into()), h.now);
            let forwards = h.p.take_forwards();
            assert!(
                forwards.contains(&Forward::Drop {
                    key: "c".into(),
                    object_id: id
                }),
                "{forwards:?}"
            );
            assert!(
                forwards.contains(&Forward::DropCopy {
                    key: "c".into(),
                    copy_id: copy
                }),
                "{forwards:?}"
            );
            assert!(!h.p.is_live("c"));
            // Constructing one inside is refused, and aborts the transaction here.
            let t2 = txn(1, 2);
            let fresh = Op::Create {
                type_name: T.into(),
                key: "d".into(),
                args: ctor("v1", vec![]),
                owned: false,
                persistent: false,
            };
            let e = step(&mut h, &t2, 10, 1, fresh).1.unwrap().unwrap_err();
            assert_eq!(e.kind, ErrorKind::TransactionError);
            assert_eq!(h.p.validate(&t2).unwrap_err().kind, ErrorKind::TransactionConflict);
        }

        mod persistent {
            use super::super::persistent::*;
            use super::*;

            #[test]
            fn a_commit_logs_the_copys_state_and_a_replay_restores_it() {
                let mut h = durable();
                let (id, mut log) = constructed_p(&mut h, "c");
                // Committed: the state the copy's last call sent is in the commit's record.
                let t1 = txn(1, 1);
                let (call, _) = step(&mut h, &t1, 10, 1, update("c", 5));
                let copy = copied(&mut h, "c", id);
                h.p.complete("c", copy, Ok(Value::Nil), h.now);
                let out =
                    h.p.complete_with_state("c", copy, Ok(5.into()), Some(b"s5".to_vec()), h.now);
                assert_eq!(value_of(&out, call), Value::from(5));
                assert_eq!(h.p.take_log(), None, "nothing is logged before the commit");
                h.p.validate(&t1).unwrap();
                h.p.commit(&t1, 1, 7, &Ok(true.into()), h.now);
                let committed = h.p.take_log().unwrap();
                match &decode_all(&committed)[..] {
                    [Record::Commit { records, .. }] => {
                        assert!(
                            matches!(&decode_all(records)[..], [Record::UserState { key, state, .. }] if key == "c" && state == b"s5")
                        );
                    }
                    other => panic!("expected one commit record, got {other:?}"),
                }
                log.extend(committed);
                assert!(matches!(h.p.take_forwards().as_slice(), [Forward::Adopt { .. }]));
                // Aborted: its copy's state never reaches the log.
                let t2 = txn(1, 2);
                step(&mut h, &t2, 10, 1, update("c", 100));
                let copy = copied(&mut h, "c", id);
                h.p.complete("c", copy, Ok(Value::Nil), h.now);
                h.p.complete_with_state("c", copy, Ok(105.into()), Some(b"s105".to_vec()), h.now);
                h.p.drop_txn(&t2, h.now);
                assert_eq!(h.p.take_log(), None);
                assert_eq!(h.p.stored_user_objects()[0].state, b"s5".to_vec());

                let mut r = Partition::new();
                r.enable_storage();
                for rec in &log {
                    r.replay(rec, h.now).unwrap();
                }
                assert_eq!(r.stored_user_objects()[0].state, b"s5".to_vec());
                assert_eq!(r.recorded("c1", 7), Some(Ok(true.into())), "the commit's reply");
                // Restored from the committed state on its next call.
                let mut h2 = Harness::new();
                h2.p = r;
                h2.call(&who(2), 1, T, "c", "update", margs(vec![]));
                assert!(matches!(&h2.p.take_forwards()[0], Forward::Restore { state, .. } if state == b"s5"));
            }

            #[test]
            fn a_call_whose_state_did_not_take_effect_aborts_the_transactions_copying_it() {
                let mut h = durable();
                let (id, _) = constructed_p(&mut h, "c");
                // A single call runs, then a transaction copies the object behind it...
                let (single, _) = h.call(&who(2), 5, T, "c", "update", margs(vec![]));
                h.p.take_forwards();
                let t1 = txn(1, 1);
                step(&mut h, &t1, 10, 1, update("c", 5));
                copied(&mut h, "c", id);
                // ...and that call's state is too large to log: it did not take effect, and
                // the copy (which holds its change) must not commit.
                let huge = vec![0u8; MAX_RECORD_LEN + 1];
                let out = h.p.complete_with_state("c", id, Ok(1.into()), Some(huge), h.now);
                assert_eq!(error_of(&out, single).kind, ErrorKind::ValueError);
                assert_eq!(h.p.validate(&t1).unwrap_err().kind, ErrorKind::TransactionConflict);
            }
        }
    }

    #[test]
    fn withdraw_does_not_touch_hosted_calls() {
        let mut h = Harness::new();
        let id = constructed(&mut h, "c");
        let (t, _) = h.call(&who(2), 0, T, "c", "update", margs(vec![]));
        assert!(h.withdraw(t, "c").is_empty());
        assert_eq!(value_of(&h.p.complete("c", id, Ok(1.into()), h.now), t), Value::from(1));
    }
}

/// Compiled types through the partition, with code written in Rust here (the server's
/// WebAssembly runtime is tested in `spindle-wasm` and end to end).
mod compiled_objects {
    use super::*;
    use crate::objects::compiled::{Called, Code, Library};

    const T: &str = "wasm:adder";
    const MODULE: &[u8] = b"adder module";

    /// State: an i64, little-endian. `add(n)` returns the sum; `fail()` raises.
    struct Adder {
        methods: Vec<String>,
    }

    fn read(state: &[u8]) -> i64 {
        state.try_into().map(i64::from_le_bytes).unwrap_or(0)
    }

    impl Code for Adder {
        fn methods(&self) -> &[String] {
            &self.methods
        }

        fn construct(&self, args: &[Value]) -> Result<Vec<u8>, Error> {
            Ok(args.first().and_then(Value::as_i64).unwrap_or(0).to_le_bytes().to_vec())
        }

        fn run(&self, state: &[u8], method: &str, args: &[Value], _: &[Reply]) -> Result<Called, Error> {
            match method {
                "add" => {
                    let sum = read(state) + args.first().and_then(Value::as_i64).unwrap_or(0);
                    Ok(Called {
                        result: sum.into(),
                        state: Some(sum.to_le_bytes().to_vec()),
                    })
                }
                "get" => Ok(Called {
                    result: read(state).into(),
                    state: None,
                }),
                _ => Err(Error::new(ErrorKind::Trapped, "wasm trap: unreachable")),
            }
        }
    }

    /// A type whose `ask(key)` adds the reply of `key.get()` to its state (a nested call);
    /// `get` replies the state.
    struct Relay {
        methods: Vec<String>,
    }

    const RELAY: &[u8] = b"relay module";

    impl Code for Relay {
        fn methods(&self) -> &[String] {
            &self.methods
        }

        fn construct(&self, _args: &[Value]) -> Result<Vec<u8>, Error> {
            Ok(0i64.to_le_bytes().to_vec())
        }

        fn run(&self, state: &[u8], method: &str, args: &[Value], nested: &[Reply]) -> Result<Called, Error> {
            let state = read(state);
            match (method, nested) {
                ("get", _) => Ok(Called {
                    result: state.into(),
                    state: None,
                }),
                (_, []) => {
                    let data = Value::Array(vec![args[0].clone(), "get".into(), Value::Array(vec![])]);
                    Err(Error::new(ErrorKind::NestedCall, "asks").with_data(data))
                }
                (_, [reply, ..]) => {
                    let sum = state + reply.clone()?.as_i64().unwrap_or(0);
                    Ok(Called {
                        result: sum.into(),
                        state: Some(sum.to_le_bytes().to_vec()),
                    })
                }
            }
        }

        fn makes_calls(&self) -> bool {
            true
        }
    }

    struct Modules;

    impl Library for Modules {
        fn load(&self, _type_name: &str, _version: &str, code: &[u8]) -> Result<Arc<dyn Code>, Error> {
            if code == RELAY {
                let methods = ["ask", "get"].map(String::from).to_vec();
                return Ok(Arc::new(Relay { methods }));
            }
            if code != MODULE {
                return Err(Error::bad_args("not a module"));
            }
            let methods = ["add", "fail", "get"].map(String::from).to_vec();
            Ok(Arc::new(Adder { methods }))
        }
    }

    fn harness(durable: bool) -> Harness {
        let mut h = Harness::new();
        h.p.set_library(Arc::new(Modules));
        if durable {
            h.p.enable_storage();
        }
        h
    }

    fn create(h: &mut Harness, key: &str, persistent: bool, args: Vec<Value>) -> Reply {
        create_at(h, "v1", key, persistent, args)
    }

    fn create_at(h: &mut Harness, version: &str, key: &str, persistent: bool, args: Vec<Value>) -> Reply {
        h.p.offer_class(T, version, &Arc::new(MODULE.to_vec())).unwrap();
        let token = h.token(1);
        let op = Op::Create {
            type_name: T.into(),
            key: key.into(),
            args: vec![version.into(), Value::Array(args)],
            owned: false,
            persistent,
        };
        let out = h.p.apply(&who(1), token, 0, 0, op, h.now);
        reply_of(&out, token).expect("a create of a compiled type answers at once")
    }

    #[test]
    fn a_method_that_calls_others_is_handed_over_then_commits_with_its_replies() {
        const R: &str = "wasm:relay";
        let mut h = harness(true);
        h.p.offer_class(R, "v1", &Arc::new(RELAY.to_vec())).unwrap();
        let token = h.token(1);
        let create = Op::Create {
            type_name: R.into(),
            key: "r".into(),
            args: vec!["v1".into(), Value::Array(vec![])],
            owned: false,
            persistent: true,
        };
        assert_eq!(
            reply_of(&h.p.apply(&who(1), token, 0, 0, create, h.now), token),
            Some(Ok(true.into()))
        );
        let mut log = h.p.take_log().expect("the module and the create are logged");
        let ask = |nested: Option<Vec<Reply>>| Op::Call {
            type_name: R.into(),
            key: "r".into(),
            method: "ask".into(),
            args: vec!["other".into()],
            nested,
        };
        // A client's call that makes no nested call runs as any call (and is logged).
        let token = h.token(1);
        let get = Op::Call {
            type_name: R.into(),
            key: "r".into(),
            method: "get".into(),
            args: vec![],
            nested: None,
        };
        assert_eq!(
            reply_of(&h.p.apply(&who(1), token, 6, 0, get, h.now), token),
            Some(Ok(0.into()))
        );
        log.extend(h.p.take_log().expect("logged"));
        // One that makes a call goes to the server's driver: nothing of its run is logged or
        // recorded, and the reply names the call.
        let token = h.token(1);
        let out = h.p.apply(&who(1), token, 7, 0, ask(None), h.now);
        let handed = error_of(&out, token);
        assert_eq!(handed.kind, ErrorKind::NestedCall);
        assert_eq!(
            handed.data,
            Value::Array(vec![
                R.into(),
                "r".into(),
                "ask".into(),
                Value::Array(vec!["other".into()])
            ])
        );
        assert!(h.p.take_log().is_none_or(|r| r.is_empty()), "nothing logged");
        assert_eq!(h.p.recorded("c1", 7), None, "nothing recorded");
        // The driver's transaction: a run that needs a reply names the call; with it, the
        // method finishes; the commit records the method's reply for the client's call.
        let id = TxnId {
            client: Arc::from("c1"),
            number: 1 << 62,
        };
        let txn = TxnCall {
            id: &id,
            age: 1,
            first: true,
            deadline: h.now + std::time::Duration::from_secs(5),
            max_bytes: 1 << 20,
        };
        let token = h.token(1);
        let out = h.p.apply_in(txn, &who(1), token, 0, ask(Some(vec![])), h.now);
        let asked = error_of(&out, token);
        assert_eq!(
            asked.data,
            Value::Array(vec!["other".into(), "get".into(), Value::Array(vec![])])
        );
        let token = h.token(1);
        let txn = TxnCall { first: false, ..txn };
        let out =
            h.p.apply_in(txn, &who(1), token, 0, ask(Some(vec![Ok(5.into())])), h.now);
        assert_eq!(reply_of(&out, token), Some(Ok(5.into())));
        h.p.validate(&id).unwrap();
        h.p.commit(&id, 1, 7, &Ok(5.into()), h.now);
        assert_eq!(h.p.recorded("c1", 7), Some(Ok(5.into())));
        log.extend(h.p.take_log().expect("the commit is logged"));
        // Replayed, the method runs once with its recorded reply, and the reply is recorded.
        let mut r = harness(true);
        for rec in &log {
            r.p.replay(rec, h.now).unwrap();
        }
        assert_eq!(r.p.recorded("c1", 7), Some(Ok(5.into())));
        let token = r.token(1);
        let get = Op::Call {
            type_name: R.into(),
            key: "r".into(),
            method: "get".into(),
            args: vec![],
            nested: Some(vec![]),
        };
        let out =
            r.p.apply_in(TxnCall { first: true, ..txn }, &who(1), token, 0, get, h.now);
        assert_eq!(reply_of(&out, token), Some(Ok(5.into())), "the replayed state");
    }

    #[test]
    fn methods_run_in_the_partition_and_errors_leave_the_state() {
        let mut h = harness(false);
        assert_eq!(create(&mut h, "a", false, vec![5.into()]), Ok(Value::Boolean(true)));
        assert_eq!(h.reply(T, "a", "add", vec![2.into()]), Ok(7.into()));
        let e = h.reply(T, "a", "fail", vec![]).unwrap_err();
        assert_eq!(e.kind, ErrorKind::Trapped);
        assert_eq!(h.reply(T, "a", "get", vec![]), Ok(7.into()));
        let e = h.reply(T, "a", "nope", vec![]).unwrap_err();
        assert_eq!(
            (e.kind, e.message.as_str()),
            (ErrorKind::UnknownMethod, "wasm:adder has no method 'nope'")
        );
        assert_eq!(
            h.reply("Counter", "a", "get", vec![]).unwrap_err().kind,
            ErrorKind::TypeMismatch
        );
    }

    #[test]
    fn an_undefined_version_or_a_refused_module_is_an_error() {
        let mut h = harness(false);
        let token = h.token(1);
        let op = Op::Create {
            type_name: T.into(),
            key: "a".into(),
            args: vec!["v2".into(), Value::Array(vec![])],
            owned: false,
            persistent: false,
        };
        let out = h.p.apply(&who(1), token, 0, 0, op, h.now);
        assert_eq!(error_of(&out, token).kind, ErrorKind::UnknownType);
        let e = h.p.offer_class(T, "v3", &Arc::new(b"junk".to_vec())).unwrap_err();
        assert_eq!(e.message, "not a module");
        // Without a library (a partition of a server with no runtime), nothing compiles.
        let mut bare = Harness::new();
        let e = bare.p.offer_class(T, "v1", &Arc::new(MODULE.to_vec())).unwrap_err();
        assert_eq!(e.kind, ErrorKind::UnknownType);
    }

    #[test]
    fn a_persistent_object_is_logged_after_its_module_and_replays_and_snapshots() {
        let mut h = harness(true);
        assert_eq!(create(&mut h, "a", true, vec![5.into()]), Ok(Value::Boolean(true)));
        h.reply(T, "a", "add", vec![10.into()]).unwrap();
        h.reply(T, "a", "fail", vec![]).unwrap_err();
        let log = h.p.take_log().expect("logged");
        let records: Vec<Record> = log.iter().map(|r| Record::decode(r).expect("decodes")).collect();
        assert!(
            matches!(&records[0], Record::Class { type_name, code, .. } if type_name == T && code == MODULE),
            "the module comes first: {records:?}"
        );
        assert_eq!(records.len(), 4, "class, create and two calls: {records:?}");

        let mut r = harness(true);
        for rec in &log {
            r.p.replay(rec, h.now).unwrap();
        }
        assert_eq!(r.reply(T, "a", "get", vec![]), Ok(15.into()));

        let mut body = h.p.begin_snapshot();
        while let Some((chunk, _)) = h.p.snapshot_chunk(usize::MAX) {
            body.extend(chunk);
        }
        let mut s = harness(true);
        s.p.restore_snapshot(&mut &body[..], h.now).unwrap();
        assert_eq!(s.reply(T, "a", "get", vec![]), Ok(15.into()));
        // A replica whose server has no runtime cannot rebuild it, and says why.
        let mut bare = Partition::new();
        bare.enable_storage();
        let e = bare.replay(&log[0], h.now).unwrap_err();
        assert!(e.contains("wasm:adder at version v1"), "{e}");
    }

    #[test]
    fn a_reader_runs_methods_that_leave_the_state_and_is_refused_the_others() {
        let mut h = harness(true);
        assert_eq!(create(&mut h, "a", true, vec![5.into()]), Ok(Value::Boolean(true)));
        let _ = h.p.take_log();
        let refusal = || Error::new(ErrorKind::PermissionDenied, "user 'r' may not add on 'a'");
        let read = |h: &mut Harness, type_name: &str, method: &str| {
            let token = h.token(1);
            let op = Op::Call {
                type_name: type_name.into(),
                key: "a".into(),
                method: method.into(),
                args: vec![1.into()],
                nested: None,
            };
            let out = h.p.apply_reading(&who(1), token, 0, op, h.now, refusal());
            reply_of(&out, token).expect("answered at once")
        };
        assert_eq!(read(&mut h, T, "get"), Ok(5.into()));
        let e = read(&mut h, T, "add").unwrap_err();
        assert_eq!(e.kind, ErrorKind::PermissionDenied);
        assert_eq!(
            e.message,
            "user 'r' may not add on 'a' (wasm:adder.add changes the object's state)"
        );
        assert!(
            h.p.take_log().is_none_or(|records| records.is_empty()),
            "a reader's calls are not logged"
        );
        assert_eq!(h.reply(T, "a", "get", vec![]), Ok(5.into()), "the state is as it was");
        // Not a compiled object: only its reads run.
        h.create_ok("Counter", "c", vec![]);
        let token = h.token(1);
        let add = Op::Call {
            type_name: "Counter".into(),
            key: "c".into(),
            method: "add".into(),
            args: vec![1.into()],
            nested: None,
        };
        let out = h.p.apply_reading(&who(1), token, 0, add, h.now, refusal());
        assert_eq!(reply_of(&out, token), Some(Err(refusal())));
        assert_eq!(h.reply("Counter", "c", "get", vec![]), Ok(0.into()));
        // Only calls: anything else is the refusal.
        let token = h.token(1);
        let out =
            h.p.apply_reading(&who(1), token, 0, Op::Delete { key: "c".into() }, h.now, refusal());
        assert_eq!(reply_of(&out, token), Some(Err(refusal())));
        assert_eq!(h.reply("Counter", "c", "get", vec![]), Ok(0.into()));
    }

    fn compiled_versions(p: &Partition) -> Vec<String> {
        let mut versions: Vec<String> = p.codes.keys().map(|(_, v)| v.clone()).collect();
        versions.sort_unstable();
        versions
    }

    #[test]
    fn a_redefined_types_unused_versions_are_forgotten_and_replay_brings_back_what_it_needs() {
        let mut h = harness(true);
        let delete = |h: &mut Harness, key: &str| {
            let token = h.token(1);
            let out = h.p.apply(&who(1), token, 0, 0, Op::Delete { key: key.into() }, h.now);
            assert_eq!(reply_of(&out, token), Some(Ok(Value::Boolean(true))));
        };
        assert_eq!(
            create_at(&mut h, "v1", "a", true, vec![1.into()]),
            Ok(Value::Boolean(true))
        );
        h.p.offer_class(T, "v2", &Arc::new(MODULE.to_vec())).unwrap();
        assert_eq!(compiled_versions(&h.p), ["v1", "v2"], "'a' still uses v1");
        delete(&mut h, "a");
        assert_eq!(
            create_at(&mut h, "v2", "b", true, vec![2.into()]),
            Ok(Value::Boolean(true))
        );
        assert_eq!(compiled_versions(&h.p), ["v2"], "nothing uses v1 any more");
        // v1 defined again: compiled again, not logged again (its class record is in the log).
        assert_eq!(
            create_at(&mut h, "v1", "c", true, vec![3.into()]),
            Ok(Value::Boolean(true))
        );
        assert_eq!(compiled_versions(&h.p), ["v1", "v2"], "'b' still uses v2");

        // The replay meets v2's class record between v1's and the create of 'c' at v1: it
        // keeps every version it is given, so 'c' finds its code.
        let log = h.p.take_log().expect("logged");
        let mut r = harness(true);
        for rec in &log {
            r.p.replay(rec, h.now).unwrap();
        }
        assert_eq!(r.reply(T, "b", "get", vec![]), Ok(2.into()));
        assert_eq!(r.reply(T, "c", "get", vec![]), Ok(3.into()));
    }
}
