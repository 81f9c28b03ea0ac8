//! The op log's contract: replaying the records a partition produced, into a fresh
//! partition, rebuilds every persistent object exactly (compared by snapshot), whatever
//! parked, woke, expired, was withdrawn or lost its connection along the way.

use ahash::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::objects::testing::Rng;
use crate::op::Op;
use crate::{Caller, Delivery, ErrorKind, Partition, Token, Value};

/// A partition under test with its op log so far.
struct Live {
    p: Partition,
    now: Instant,
    log: Vec<Vec<u8>>,
    next_req: u64,
    seq: u64,
}

impl Live {
    fn new() -> Self {
        let mut p = Partition::new();
        p.enable_storage();
        Live {
            p,
            now: Instant::now(),
            log: Vec::new(),
            next_req: 0,
            seq: 0,
        }
    }

    fn drain(&mut self, out: Vec<Delivery>) -> Vec<Delivery> {
        if let Some(records) = self.p.take_log() {
            self.log.extend(records);
        }
        out
    }

    fn apply(&mut self, conn: u64, op: Op) -> (Token, Vec<Delivery>) {
        self.next_req += 1;
        self.seq += 1;
        let caller = Caller {
            conn,
            client: Arc::from(format!("c{}", conn % 3)),
            thread: 0,
        };
        let token = Token {
            conn,
            req: self.next_req,
        };
        let out = self.p.apply(&caller, token, self.seq, 0, op, self.now);
        (token, self.drain(out))
    }

    /// `op` from the session "acking", which numbers its own calls and acknowledges replies.
    fn apply_acking(&mut self, conn: u64, seq: u64, acked: u64, op: Op) -> (Token, Vec<Delivery>) {
        self.next_req += 1;
        let caller = Caller {
            conn,
            client: Arc::from("acking"),
            thread: 0,
        };
        let token = Token {
            conn,
            req: self.next_req,
        };
        let out = self.p.apply(&caller, token, seq, acked, op, self.now);
        (token, self.drain(out))
    }

    fn call(
        &mut self,
        conn: u64,
        type_name: &str,
        key: &str,
        method: &str,
        args: Vec<Value>,
    ) -> (Token, Vec<Delivery>) {
        self.apply(conn, call_op(type_name, key, method, args))
    }

    fn create(&mut self, conn: u64, type_name: &str, key: &str, args: Vec<Value>, persistent: bool) -> Vec<Delivery> {
        let op = Op::Create {
            type_name: type_name.into(),
            key: key.into(),
            args,
            owned: key.starts_with('~'),
            persistent,
        };
        self.apply(conn, op).1
    }

    fn tick(&mut self, by: Duration) {
        self.now += by;
        let out = self.p.tick(self.now);
        self.drain(out);
    }

    fn replayed(&self) -> Partition {
        let mut fresh = Partition::new();
        fresh.enable_storage();
        let now = Instant::now();
        for record in &self.log {
            fresh.replay(record, now).expect("records decode");
        }
        fresh
    }

    fn check(&self) {
        let replayed = self.replayed();
        assert_eq!(replayed.persistent_snapshots(), self.p.persistent_snapshots());
    }
}

fn call_op(type_name: &str, key: &str, method: &str, args: Vec<Value>) -> Op {
    Op::Call {
        type_name: type_name.into(),
        key: key.into(),
        method: method.into(),
        args,
        nested: None,
    }
}

fn reply(out: &[Delivery], token: Token) -> Option<&crate::Reply> {
    out.iter().find(|d| d.token == token).map(|d| &d.reply)
}

#[test]
fn only_persistent_objects_are_logged_and_replayed() {
    let mut l = Live::new();
    l.create(1, "Counter", "eph", vec![], false);
    l.call(1, "Counter", "eph", "add", vec![5.into()]);
    assert!(l.log.is_empty(), "ephemeral objects leave no record");
    l.create(1, "Counter", "n", vec![10.into()], true);
    l.call(1, "Counter", "n", "add", vec![5.into()]);
    let before = l.log.len();
    l.call(1, "Counter", "n", "get", vec![]);
    assert_eq!(l.log.len(), before, "a read leaves no record");
    l.check();
    let replayed = l.replayed();
    assert_eq!(
        replayed.objects("", false),
        vec![("n".to_string(), "Counter".to_string())]
    );
    assert_eq!(replayed.objects("", true).len(), 1);
}

#[test]
fn a_put_that_woke_a_parked_get_is_replayed_with_it() {
    let mut l = Live::new();
    l.create(1, "Queue", "q", vec![], true);
    let (get, out) = l.call(2, "Queue", "q", "get", vec![true.into(), Value::Nil]);
    assert!(out.is_empty(), "parked");
    let (_, out) = l.call(3, "Queue", "q", "put", vec!["x".into()]);
    assert_eq!(reply(&out, get), Some(&Ok(Value::from("x"))));
    l.check();
    let (_, out) = l.call(3, "Queue", "q", "qsize", vec![]);
    assert_eq!(out[0].reply, Ok(Value::from(0)));
}

#[test]
fn expired_withdrawn_and_disconnected_gets_are_replayed() {
    let mut l = Live::new();
    l.create(1, "Queue", "q", vec![], true);
    // Expires by timer before the put: the put's item stays.
    let (expired, _) = l.call(2, "Queue", "q", "get", vec![true.into(), 1.0.into()]);
    l.tick(Duration::from_secs(2));
    // Withdrawn by its caller.
    let (withdrawn, _) = l.call(3, "Queue", "q", "get", vec![true.into(), Value::Nil]);
    let out = l.p.withdraw(withdrawn, "q", l.now);
    assert_eq!(
        reply(&out, withdrawn).map(|r| r.as_ref().unwrap_err().kind),
        Some(ErrorKind::Empty)
    );
    l.drain(out);
    // Its connection closes.
    l.call(4, "Queue", "q", "get", vec![true.into(), Value::Nil]);
    let out = l.p.disconnect(4, l.now);
    l.drain(out);
    let (_, out) = l.call(5, "Queue", "q", "put", vec!["kept".into()]);
    assert!(reply(&out, expired).is_none() && reply(&out, withdrawn).is_none());
    let (_, out) = l.call(5, "Queue", "q", "qsize", vec![]);
    assert_eq!(out[0].reply, Ok(Value::from(1)), "no dead getter took the item");
    l.check();
}

#[test]
fn a_restart_drops_parked_calls_durably() {
    let mut l = Live::new();
    l.create(1, "Queue", "q", vec![], true);
    l.call(2, "Queue", "q", "get", vec![true.into(), Value::Nil]);
    // The server dies; recovery replays and restarts, logging the disconnects.
    let mut second = l.replayed();
    let out = second.restart(l.now);
    assert!(out.is_empty());
    l.log.extend(second.take_log().expect("disconnects are logged"));
    l.p = second;
    // In the new run, a put keeps its item; a replay of both runs must agree.
    let (_, out) = l.call(9, "Queue", "q", "put", vec!["x".into()]);
    assert_eq!(out.len(), 1);
    l.check();
    let (_, out) = l.call(9, "Queue", "q", "qsize", vec![]);
    assert_eq!(out[0].reply, Ok(Value::from(1)));
    assert_eq!(l.p.highest_logged_conn(), 9);
}

#[test]
fn retried_calls_get_their_recorded_reply_after_replay() {
    let mut l = Live::new();
    l.create(1, "Counter", "n", vec![], true);
    let caller = Caller {
        conn: 1,
        client: Arc::from("c1"),
        thread: 0,
    };
    let op = || Op::Call {
        type_name: "Counter".into(),
        key: "n".into(),
        method: "add".into(),
        args: vec![5.into()],
        nested: None,
    };
    let token = Token { conn: 1, req: 99 };
    let out = l.p.apply(&caller, token, 777, 0, op(), l.now);
    l.drain(out);
    let mut replayed = l.replayed();
    // The client resends on a new connection after the restart: applied once.
    let again = Caller { conn: 50, ..caller };
    let t2 = Token { conn: 50, req: 1 };
    let out = replayed.apply(&again, t2, 777, 0, op(), l.now);
    assert_eq!(out[0].reply, Ok(Value::from(5)));
    assert_eq!(replayed.persistent_snapshots(), l.p.persistent_snapshots());
}

#[test]
fn persistence_rules() {
    let mut l = Live::new();
    let out = l.create(1, "Lock", "l", vec![], true);
    let e = out[0].reply.clone().unwrap_err();
    assert_eq!(e.kind, ErrorKind::ValueError);
    assert!(
        e.message
            .contains("Lock is a synchronization object, ephemeral by nature"),
        "{e}"
    );
    l.create(1, "Counter", "e", vec![], false);
    let e = l.create(1, "Counter", "e", vec![], true)[0].reply.clone().unwrap_err();
    assert!(e.message.contains("existing ephemeral Counter"), "{e}");
    l.create(1, "Counter", "p", vec![], true);
    let e = l.create(1, "Counter", "p", vec![], false)[0].reply.clone().unwrap_err();
    assert!(e.message.contains("existing persistent Counter"), "{e}");
    assert_eq!(
        l.create(1, "Counter", "p", vec![], true)[0].reply,
        Ok(Value::Boolean(false))
    );
    let mut off = Partition::new();
    let caller = Caller {
        conn: 1,
        client: Arc::from("c"),
        thread: 0,
    };
    let op = Op::Create {
        type_name: "Counter".into(),
        key: "k".into(),
        args: vec![],
        owned: false,
        persistent: true,
    };
    let out = off.apply(&caller, Token { conn: 1, req: 1 }, 0, 0, op, l.now);
    assert!(out[0].reply.clone().unwrap_err().message.contains("no --data-dir"));
    assert!(off.take_log().is_none());
    // After a failed write, persistent writes are refused; ephemeral objects go on.
    l.p.storage_failed("disk full");
    let (_, out) = l.call(1, "Counter", "p", "add", vec![1.into()]);
    assert_eq!(out[0].reply.clone().unwrap_err().kind, ErrorKind::StorageError);
    let (_, out) = l.call(1, "Counter", "e", "add", vec![1.into()]);
    assert_eq!(out[0].reply, Ok(Value::from(1)));
}

/// The keys of the random histories, and one random step of a history on them.
const KEYS: [(&str, &str); 6] = [
    ("Counter", "n"),
    ("Dict", "d"),
    ("Queue", "q"),
    ("Queue", "bq"),
    ("List", "l"),
    ("Counter", "~c1.1"),
];

fn random_step(l: &mut Live, rng: &mut Rng, parked: &mut Vec<(Token, &'static str)>) {
    let conn = 1 + rng.below(6) as u64;
    let (type_name, key) = KEYS[rng.below(KEYS.len())];
    let persistent = key != "l";
    match rng.below(16) {
        0 => {
            let args = if key == "bq" { vec![2.into()] } else { vec![] };
            l.create(conn, type_name, key, args, persistent);
        }
        1 if rng.below(4) == 0 => {
            l.apply(conn, Op::Delete { key: key.into() });
        }
        2 => l.tick(Duration::from_millis(rng.below(400) as u64)),
        3 => {
            if let Some((token, key)) = parked.pop() {
                let out = l.p.withdraw(token, key, l.now);
                l.drain(out);
            }
        }
        4 if rng.below(3) == 0 => {
            let out = l.p.disconnect(conn, l.now);
            l.drain(out);
        }
        5 if rng.below(8) == 0 => {
            let out = l.p.end_session(&format!("c{}", conn % 3), l.now);
            l.drain(out);
        }
        _ => {
            let timeout = match rng.below(3) {
                0 => Value::Nil,
                n => Value::F64(n as f64 * 0.1),
            };
            let (method, args): (&str, Vec<Value>) = match type_name {
                "Counter" => ("add", vec![(rng.below(10) as i64).into()]),
                "Dict" => (
                    "merge",
                    vec![format!("k{}", rng.below(4)).into(), 1.into(), "sum".into()],
                ),
                "Queue" if rng.below(2) == 0 => ("put", vec![(rng.below(100) as u64).into(), true.into(), timeout]),
                "Queue" => ("get", vec![true.into(), timeout]),
                _ => ("append", vec![1.into()]),
            };
            let (token, out) = l.call(conn, type_name, key, method, args);
            if out.iter().all(|d| d.token != token) {
                parked.push((token, key));
            }
        }
    }
}

fn seeded(seed: u64) -> Rng {
    Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
}

#[test]
fn replaying_a_random_history_rebuilds_every_persistent_object() {
    for seed in 1..=40u64 {
        let mut rng = seeded(seed);
        let mut l = Live::new();
        let mut parked = Vec::new();
        for _ in 0..300 {
            random_step(&mut l, &mut rng, &mut parked);
        }
        l.check();
    }
}

/// A fresh partition from a snapshot body and the log records after it.
fn restored(body: &[u8], tail: &[Vec<u8>]) -> Partition {
    let mut p = Partition::new();
    p.enable_storage();
    let now = Instant::now();
    p.restore_snapshot(&mut &body[..], now).expect("the snapshot restores");
    for record in tail {
        p.replay(record, now).expect("records decode");
    }
    p
}

#[test]
fn a_snapshot_taken_while_calls_go_on_plus_the_tail_equals_a_full_replay() {
    for seed in 1..=400u64 {
        let mut rng = seeded(seed);
        let mut l = Live::new();
        let mut parked = Vec::new();
        for _ in 0..rng.below(150) {
            random_step(&mut l, &mut rng, &mut parked);
        }
        // The moment of the snapshot: the log so far is behind it.
        let at = l.log.len();
        let mut body = l.p.begin_snapshot();
        // Capture one object at a time, with calls changing, deleting and making objects
        // in between (copy on write keeps the snapshot at its moment).
        loop {
            if rng.below(2) == 0 {
                random_step(&mut l, &mut rng, &mut parked);
                continue;
            }
            let (chunk, done) = l.p.snapshot_chunk(1).unwrap();
            body.extend(chunk);
            if done {
                break;
            }
        }
        for _ in 0..rng.below(150) {
            random_step(&mut l, &mut rng, &mut parked);
        }
        let from_snapshot = restored(&body, &l.log[at..]);
        let full = l.replayed();
        assert_eq!(
            from_snapshot.persistent_snapshots(),
            full.persistent_snapshots(),
            "seed {seed}"
        );
        assert_eq!(
            from_snapshot.persistent_snapshots(),
            l.p.persistent_snapshots(),
            "seed {seed}"
        );
        assert_eq!(from_snapshot.durable_replies(), full.durable_replies(), "seed {seed}");
        // The snapshot alone is the state at its moment.
        let at_moment = restored(&body, &[]);
        let mut replayed_to_moment = Partition::new();
        replayed_to_moment.enable_storage();
        for record in &l.log[..at] {
            replayed_to_moment.replay(record, l.now).unwrap();
        }
        assert_eq!(
            at_moment.persistent_snapshots(),
            replayed_to_moment.persistent_snapshots(),
            "seed {seed}"
        );
    }
}

#[test]
fn a_snapshot_keeps_the_replies_a_client_acknowledged_forgotten_and_their_calls_refused() {
    let mut l = Live::new();
    l.create(1, "Counter", "c", vec![], true);
    let increment = |l: &mut Live, seq: u64, acked: u64| {
        l.apply_acking(1, seq, acked, call_op("Counter", "c", "increment", vec![]))
    };
    for seq in 1..=10 {
        increment(&mut l, seq, seq);
    }
    let mut body = l.p.begin_snapshot();
    body.extend(l.p.snapshot_chunk(usize::MAX).unwrap().0);
    for mut p in [restored(&body, &[]), l.replayed()] {
        std::mem::swap(&mut l.p, &mut p);
        // A stale copy of an acknowledged call is refused; the last call's reply is kept.
        let (stale, out) = increment(&mut l, 4, 0);
        assert_eq!(
            reply(&out, stale).map(|r| r.as_ref().unwrap_err().kind),
            Some(ErrorKind::ProtocolError)
        );
        let (again, out) = increment(&mut l, 10, 10);
        assert_eq!(reply(&out, again), Some(&Ok(Value::from(10))));
    }
}

#[test]
fn a_call_parked_below_its_sessions_mark_parks_again_from_a_snapshot() {
    let mut l = Live::new();
    l.create(1, "Queue", "q", vec![], true);
    l.create(1, "Counter", "c", vec![], true);
    let (get, out) = l.apply_acking(7, 5, 5, call_op("Queue", "q", "get", vec![true.into(), Value::Nil]));
    assert!(out.is_empty(), "parked");
    // A client acknowledging past its parked call (mistaken, or giving up on it).
    l.apply_acking(7, 6, 7, call_op("Counter", "c", "increment", vec![]));
    let at = l.log.len();
    let mut body = l.p.begin_snapshot();
    body.extend(l.p.snapshot_chunk(usize::MAX).unwrap().0);
    let (_, out) = l.call(2, "Queue", "q", "put", vec!["x".into()]);
    assert_eq!(reply(&out, get), Some(&Ok(Value::from("x"))));
    // Restored, the get parks again and takes the item, as it did live.
    let p = restored(&body, &l.log[at..]);
    assert_eq!(p.persistent_snapshots(), l.p.persistent_snapshots());
}

#[test]
fn a_get_parked_at_the_snapshot_takes_the_item_of_a_later_put() {
    let mut l = Live::new();
    l.create(1, "Queue", "q", vec![], true);
    let (get, _) = l.call(2, "Queue", "q", "get", vec![true.into(), Value::Nil]);
    let at = l.log.len();
    let mut body = l.p.begin_snapshot();
    body.extend(l.p.snapshot_chunk(usize::MAX).unwrap().0);
    let (_, out) = l.call(3, "Queue", "q", "put", vec!["x".into()]);
    assert_eq!(reply(&out, get), Some(&Ok(Value::from("x"))));
    let mut p = restored(&body, &l.log[at..]);
    assert_eq!(p.persistent_snapshots(), l.p.persistent_snapshots());
    // The get's reply is recorded: its client resending it after a restart gets "x" again.
    let caller = Caller {
        conn: 40,
        client: Arc::from("c2"),
        thread: 0,
    };
    let op = Op::Call {
        type_name: "Queue".into(),
        key: "q".into(),
        method: "get".into(),
        args: vec![true.into(), Value::Nil],
        nested: None,
    };
    let get_seq = 2; // The Live helper numbers calls 1, 2, 3...
    let out = p.apply(&caller, Token { conn: 40, req: 1 }, get_seq, 0, op, l.now);
    assert_eq!(out[0].reply, Ok(Value::from("x")));
}

#[test]
fn a_damaged_snapshot_body_is_an_error_never_a_panic() {
    let mut l = Live::new();
    l.create(1, "Dict", "d", vec![], true);
    l.call(1, "Dict", "d", "setitem", vec!["a".into(), 1.into()]);
    l.create(1, "Queue", "q", vec![], true);
    l.call(2, "Queue", "q", "get", vec![true.into(), Value::Nil]);
    let mut body = l.p.begin_snapshot();
    body.extend(l.p.snapshot_chunk(usize::MAX).unwrap().0);
    let whole = restored(&body, &[]);
    assert_eq!(whole.persistent_snapshots(), l.p.persistent_snapshots());
    for cut in 0..body.len() {
        let mut p = Partition::new();
        p.enable_storage();
        assert!(p.restore_snapshot(&mut &body[..cut], l.now).is_err(), "cut at {cut}");
    }
    let mut extra = body.clone();
    extra.push(0xc0);
    let mut p = Partition::new();
    p.enable_storage();
    assert!(p
        .restore_snapshot(&mut &extra[..], l.now)
        .unwrap_err()
        .contains("after the end"));
}

#[test]
fn a_persistent_create_refused_over_an_ephemeral_object_is_not_logged() {
    let mut l = Live::new();
    l.create(1, "Dict", "k", vec![], false);
    let out = l.create(1, "List", "k", vec![], true);
    assert_eq!(out[0].reply.as_ref().unwrap_err().kind, ErrorKind::TypeMismatch);
    // Had the refused create been logged, a replay would hold a persistent List at `k`, and
    // the acknowledged writes to the persistent Dict made there next would be lost.
    l.apply(1, Op::Delete { key: "k".into() });
    assert_eq!(
        l.create(1, "Dict", "k", vec![], true)[0].reply,
        Ok(Value::Boolean(true))
    );
    let (_, out) = l.call(1, "Dict", "k", "setitem", vec!["a".into(), 1.into()]);
    assert!(out[0].reply.is_ok());
    l.check();
}

#[test]
fn answers_about_a_delete_still_being_written_wait_for_it() {
    let mut l = Live::new();
    l.create(1, "Counter", "n", vec![], true);
    let _ = l.p.take_log();
    let caller = Caller {
        conn: 1,
        client: Arc::from("c1"),
        thread: 0,
    };
    let delete = || Op::Delete { key: "n".into() };
    let out = l.p.apply(&caller, Token { conn: 1, req: 5 }, 55, 0, delete(), l.now);
    assert_eq!(out[0].reply, Ok(Value::Boolean(true)));
    assert_eq!(l.p.take_log().map(|r| r.len()), Some(1), "the delete is being written");
    // Its resend (the connection was lost) gets the recorded reply, after the record.
    let again = Caller { conn: 2, ..caller };
    let out = l.p.apply(&again, Token { conn: 2, req: 1 }, 55, 0, delete(), l.now);
    assert_eq!(out[0].reply, Ok(Value::Boolean(true)));
    assert!(l.p.take_log().is_some(), "a recorded reply waits for the log");
    // Another client's read finds nothing, and must not say so before the delete is durable.
    let other = Caller {
        conn: 3,
        client: Arc::from("c2"),
        thread: 0,
    };
    let get = Op::Call {
        type_name: "Counter".into(),
        key: "n".into(),
        method: "get".into(),
        args: vec![],
        nested: None,
    };
    let out = l.p.apply(&other, Token { conn: 3, req: 1 }, 0, 0, get, l.now);
    assert_eq!(out[0].reply.as_ref().unwrap_err().kind, ErrorKind::NotFound);
    assert!(
        l.p.take_log().is_some(),
        "an answer about an absent key waits for the log"
    );
}

#[test]
fn a_resent_call_whose_write_failed_is_not_acknowledged() {
    let mut l = Live::new();
    l.create(1, "Counter", "n", vec![], true);
    let caller = Caller {
        conn: 1,
        client: Arc::from("c1"),
        thread: 0,
    };
    let add = || Op::Call {
        type_name: "Counter".into(),
        key: "n".into(),
        method: "add".into(),
        args: vec![5.into()],
        nested: None,
    };
    l.p.apply(&caller, Token { conn: 1, req: 9 }, 777, 0, add(), l.now);
    let _ = l.p.take_log();
    // The journal fails that record's write (its caller gets StorageError) and tells the
    // partition; the SDK resends seq 777 on a new connection.
    l.p.storage_failed("disk full");
    let again = Caller { conn: 2, ..caller };
    let out = l.p.apply(&again, Token { conn: 2, req: 1 }, 777, 0, add(), l.now);
    assert_eq!(out[0].reply.as_ref().unwrap_err().kind, ErrorKind::StorageError);
}

#[test]
fn a_change_too_large_for_one_record_is_refused_before_it_is_applied() {
    let mut l = Live::new();
    l.create(1, "Blob", "b", vec![], true);
    let big = Value::Binary(vec![7; crate::record::MAX_RECORD_LEN]);
    let (_, out) = l.call(1, "Blob", "b", "set", vec![big]);
    let e = out[0].reply.clone().unwrap_err();
    assert_eq!(e.kind, ErrorKind::ValueError);
    assert!(e.message.contains("smaller parts"), "{e}");
    let (_, out) = l.call(1, "Blob", "b", "len", vec![]);
    assert_eq!(out[0].reply, Ok(Value::from(0)), "not applied");
    // The log stays writable: the next change is logged as usual.
    let (_, out) = l.call(1, "Blob", "b", "set", vec![Value::Binary(vec![1, 2])]);
    assert!(out[0].reply.is_ok());
    l.check();
}

/// Random histories mixing built-in objects with persistent user-defined ones whose host
/// answers (with a state, without one, raising) or dies at random.
mod user_objects {
    use super::*;
    use crate::objects::user::Forward;
    use crate::Error;

    const T: &str = "py:__main__.Box";
    const KEYS: [&str; 3] = ["u1", "u2", "~c1.u"];

    struct Run {
        l: Live,
        /// The object id in a host per key (what the host would hold).
        hosted: HashMap<String, u64>,
        n: u64,
    }

    impl Run {
        fn track_forwards(&mut self) {
            for f in self.l.p.take_forwards() {
                match f {
                    Forward::Construct { key, object_id, .. }
                    | Forward::Restore { key, object_id, .. }
                    | Forward::Call { key, object_id, .. } => {
                        self.hosted.insert(key, object_id);
                    }
                    Forward::Drop { key, .. } => {
                        self.hosted.remove(&key);
                    }
                    // No transactions here.
                    Forward::Copy { .. }
                    | Forward::CopyCall { .. }
                    | Forward::Adopt { .. }
                    | Forward::DropCopy { .. } => {}
                }
            }
        }

        fn step(&mut self, rng: &mut Rng, parked: &mut Vec<(Token, &'static str)>) {
            let key = KEYS[rng.below(KEYS.len())];
            let conn = 1 + rng.below(6) as u64;
            match rng.below(12) {
                0 | 1 => {
                    self.l.p.offer_class(T, "v1", &Arc::new(vec![1, 2])).unwrap();
                    let op = Op::Create {
                        type_name: T.into(),
                        key: key.into(),
                        args: vec!["v1".into(), Value::Array(vec![]), Value::Map(vec![])],
                        owned: key.starts_with('~'),
                        persistent: true,
                    };
                    self.l.apply(conn, op);
                }
                2..=4 => {
                    let op = Op::Call {
                        type_name: T.into(),
                        key: key.into(),
                        method: "m".into(),
                        args: vec![Value::Array(vec![]), Value::Map(vec![])],
                        nested: None,
                    };
                    self.l.apply(conn, op);
                }
                5..=7 => {
                    if let Some(id) = self.hosted.get(key).copied() {
                        self.n += 1;
                        let state = (rng.below(5) != 0).then(|| format!("s{}", self.n).into_bytes());
                        let reply = match rng.below(4) {
                            0 => Err(Error::new(ErrorKind::Raised, "x")),
                            _ => Ok(Value::from(self.n)),
                        };
                        let out = self.l.p.complete_with_state(key, id, reply, state, self.l.now);
                        self.l.drain(out);
                    }
                }
                8 => {
                    if let Some(id) = self.hosted.remove(key) {
                        let out = self.l.p.lose(key, id, "died", self.l.now);
                        self.l.drain(out);
                    }
                }
                9 if rng.below(3) == 0 => {
                    self.l.apply(conn, Op::Delete { key: key.into() });
                }
                10 if rng.below(6) == 0 => {
                    let out = self.l.p.end_session(&format!("c{}", conn % 3), self.l.now);
                    self.l.drain(out);
                }
                // A built-in create at a user object's key, and the rest of the usual history.
                11 if rng.below(4) == 0 => {
                    self.l.create(conn, "Counter", key, vec![], rng.below(2) == 0);
                }
                _ => random_step(&mut self.l, rng, parked),
            }
            self.track_forwards();
        }
    }

    #[test]
    fn snapshot_plus_tail_full_replay_and_live_agree() {
        for seed in 1..=400u64 {
            let mut rng = seeded(seed);
            let mut r = Run {
                l: Live::new(),
                hosted: HashMap::default(),
                n: 0,
            };
            let mut parked = Vec::new();
            for _ in 0..rng.below(200) {
                r.step(&mut rng, &mut parked);
            }
            let at = r.l.log.len();
            let mut body = r.l.p.begin_snapshot();
            loop {
                if rng.below(2) == 0 {
                    r.step(&mut rng, &mut parked);
                    continue;
                }
                let (chunk, done) = r.l.p.snapshot_chunk(1).unwrap();
                body.extend(chunk);
                if done {
                    break;
                }
            }
            for _ in 0..rng.below(200) {
                r.step(&mut rng, &mut parked);
            }
            let snap = restored(&body, &r.l.log[at..]);
            let full = r.l.replayed();
            let live = &r.l.p;
            assert_eq!(snap.persistent_snapshots(), full.persistent_snapshots(), "seed {seed}");
            assert_eq!(full.persistent_snapshots(), live.persistent_snapshots(), "seed {seed}");
            assert_eq!(snap.stored_user_objects(), full.stored_user_objects(), "seed {seed}");
            assert_eq!(full.stored_user_objects(), live.stored_user_objects(), "seed {seed}");
            assert_eq!(snap.durable_replies(), full.durable_replies(), "seed {seed}");
            assert_eq!(full.durable_replies(), live.durable_replies(), "seed {seed}");
        }
    }
}

#[test]
fn an_aborted_capture_yields_nothing_more_to_publish() {
    let mut l = Live::new();
    for i in 0..4u64 {
        l.create(1, "Counter", &format!("k{i}"), vec![Value::from(i)], true);
    }
    let _header = l.p.begin_snapshot();
    let (_, done) = l.p.snapshot_chunk(1).unwrap();
    assert!(!done);
    // The op log failed mid-capture: the rest must not read as a complete snapshot.
    l.p.abort_snapshot();
    assert!(l.p.snapshot_chunk(usize::MAX).is_none());
}

#[test]
fn evictions_over_max_memory_replay_the_same_under_no_limit() {
    let mut l = Live::new();
    l.p.set_memory(crate::partition::Memory::new(30_000));
    let options = Value::Map(vec![("max_memory".into(), 20_000.into())]);
    l.create(1, "Dict", "cache", vec![Value::Nil, options], true);
    l.create(1, "Dict", "plain", vec![], true);
    let mut rng = seeded(28);
    let text = |n: usize| Value::from("x".repeat(n));
    for i in 0..200 {
        // Reads are uses: the replay must know them to evict the same keys.
        let k = Value::from(rng.int(0, 40));
        match rng.below(4) {
            0 => l.call(1, "Dict", "cache", "getitem", vec![k]),
            1 => l.call(1, "Dict", "cache", "get", vec![k]),
            2 => l.call(1, "Dict", "cache", "setitem", vec![k, text(rng.below(1500))]),
            _ => l.call(1, "Dict", "plain", "setitem", vec![i.into(), text(400)]),
        };
    }
    let evicted = l
        .log
        .iter()
        .filter(|r| crate::record::Record::decode(r).is_ok_and(|r| matches!(r, crate::record::Record::Evict { .. })))
        .count();
    assert!(evicted > 0, "the server never evicted");
    // Replayed under no limit (a follower, or a restart with another limit), the same.
    let replayed = l.replayed();
    assert_eq!(replayed.persistent_snapshots(), l.p.persistent_snapshots());
    assert_eq!(replayed.memory().used(), l.p.memory().used());
}

#[test]
fn a_committed_transaction_is_replayed_whole_with_its_reply_and_an_aborted_one_not_at_all() {
    use crate::partition::{TxnCall, TxnId};

    let mut l = Live::new();
    l.create(1, "Counter", "a", vec![100.into()], true);
    l.create(1, "Queue", "q", vec![], true);
    let records_before = l.log.len();
    let txn = |number| TxnId {
        client: Arc::from("c1"),
        number,
    };
    let caller = Caller {
        conn: 1,
        client: Arc::from("c1"),
        thread: 0,
    };
    let run = |l: &mut Live, number: u64, first: bool, op: Op| {
        let call = TxnCall {
            id: &txn(number),
            age: number,
            first,
            deadline: l.now + Duration::from_secs(5),
            max_bytes: 1 << 20,
        };
        l.p.apply_in(call, &caller, Token { conn: 1, req: 50 }, 0, op, l.now)
            .remove(0)
            .reply
    };
    assert_eq!(
        run(&mut l, 7, true, call_op("Counter", "a", "add", vec![(-30).into()])),
        Ok(70.into())
    );
    run(
        &mut l,
        7,
        false,
        call_op("Queue", "q", "put", vec!["job".into(), false.into(), Value::Nil]),
    )
    .unwrap();
    // An aborted one leaves nothing to replay.
    run(&mut l, 8, true, call_op("Counter", "b", "add", vec![1.into()])).unwrap_err();
    l.p.drop_txn(&txn(8), l.now);
    l.p.validate(&txn(7)).unwrap();
    let out = l.p.commit(&txn(7), 1, 9, &Ok(true.into()), l.now);
    l.drain(out);
    assert_eq!(l.log.len(), records_before + 1, "one commit record");
    l.check();
    let mut replayed = l.replayed();
    assert_eq!(replayed.recorded("c1", 9), Some(Ok(true.into())));
    let get = replayed.apply(
        &caller,
        Token { conn: 1, req: 60 },
        0,
        0,
        call_op("Counter", "a", "get", vec![]),
        l.now,
    );
    assert_eq!(get[0].reply, Ok(70.into()));
}
