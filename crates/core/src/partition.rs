//! One partition of the object space: its objects, parked-call timers, and the reply log
//! that makes retried calls exactly-once. A pure state machine: every entry point takes the
//! current time and returns the replies to send.

use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::sync::Arc;
use std::time::Instant;

use crate::{objects, Caller, ConnId, Ctx, Delivery, Error, ErrorKind, Object, Reply, Step, Token, Value};

/// How many recorded replies each client keeps per partition. A client never retries a call
/// older than its oldest call in flight, so a window is enough.
const REPLY_LOG_LEN: usize = 4096;

/// Prefix of the keys of unnamed objects; names given by users never start with it.
pub const UNNAMED_PREFIX: char = '~';

struct Entry {
    obj: Box<dyn Object>,
    /// The session an unnamed object lives and dies with; `None` for named or kept objects.
    owner: Option<Arc<str>>,
}

/// An object taken out of its partition by `keep`, on its way to another key.
pub struct Detached {
    obj: Box<dyn Object>,
    owner: Option<Arc<str>>,
}

#[derive(Default)]
struct ReplyLog {
    replies: HashMap<u64, Reply>,
    order: VecDeque<u64>,
}

impl ReplyLog {
    fn record(&mut self, seq: u64, reply: Reply) {
        if self.replies.insert(seq, reply).is_none() {
            self.order.push_back(seq);
            if self.order.len() > REPLY_LOG_LEN {
                if let Some(old) = self.order.pop_front() {
                    self.replies.remove(&old);
                }
            }
        }
    }
}

/// A call as the partition receives it.
#[derive(Clone, Debug)]
pub enum Op {
    /// Create the object with `args` unless it exists; reply `true` if created.
    Create {
        type_name: String,
        key: String,
        args: Vec<Value>,
        owned: bool,
    },
    /// Run `method` on the object.
    Call {
        type_name: String,
        key: String,
        method: String,
        args: Vec<Value>,
    },
    /// Remove the object; reply `true` if it existed.
    Delete { key: String },
}

impl Op {
    pub fn key(&self) -> &str {
        match self {
            Op::Create { key, .. } | Op::Call { key, .. } | Op::Delete { key } => key,
        }
    }
}

#[derive(Default)]
pub struct Partition {
    objects: HashMap<String, Entry>,
    /// Keys that `keep` moved away, with their new key and the session that owned them.
    moved: HashMap<String, (String, Option<Arc<str>>)>,
    /// Deadlines of parked calls, earliest first. A timer goes as soon as its call is
    /// answered, so long timeouts on calls answered early do not pile up.
    timers: BTreeMap<(Instant, u64), (String, Token)>,
    timer_of: HashMap<Token, (Instant, u64)>,
    timer_seq: u64,
    /// Parked mutating calls whose eventual reply must be recorded.
    parked_seqs: HashMap<Token, (Arc<str>, u64)>,
    logs: HashMap<Arc<str>, ReplyLog>,
    /// Keys of connection-tracking objects each connection has used (for disconnect clean-up).
    conn_keys: HashMap<ConnId, HashSet<String>>,
}

fn system_caller() -> Caller {
    Caller {
        conn: 0,
        client: Arc::from(""),
        thread: 0,
    }
}

impl Partition {
    pub fn new() -> Self {
        Self::default()
    }

    /// Number of objects held.
    pub fn len(&self) -> usize {
        self.objects.len()
    }

    pub fn is_empty(&self) -> bool {
        self.objects.is_empty()
    }

    /// Named objects whose name starts with `prefix`, as `(name, type)`.
    pub fn objects(&self, prefix: &str) -> Vec<(String, &'static str)> {
        self.objects
            .iter()
            .filter(|(k, _)| !k.starts_with(UNNAMED_PREFIX) && k.starts_with(prefix))
            .map(|(k, e)| (k.clone(), e.obj.type_name()))
            .collect()
    }

    /// Apply one call. `seq` is the caller's sequence number (0: do not deduplicate).
    /// Returns the caller's reply (unless the call parked) and any woken waiters' replies.
    pub fn apply(&mut self, caller: &Caller, token: Token, seq: u64, op: Op, now: Instant) -> Vec<Delivery> {
        let mut out = Vec::new();
        if seq != 0 {
            if let Some(reply) = self.logs.get(&caller.client).and_then(|l| l.replies.get(&seq)) {
                out.push(Delivery {
                    token,
                    reply: reply.clone(),
                });
                return out;
            }
        }
        let (reply, record) = match op {
            Op::Create {
                type_name,
                key,
                args,
                owned,
            } => (self.create(caller, &type_name, key, &args, owned), true),
            Op::Delete { key } => (Ok(Some(Value::Boolean(self.delete(&key, now, &mut out)))), true),
            Op::Call {
                type_name,
                key,
                method,
                args,
            } => self.call(caller, token, &type_name, &key, &method, &args, now, &mut out),
        };
        match reply {
            Ok(None) => {
                if record && seq != 0 {
                    self.parked_seqs.insert(token, (caller.client.clone(), seq));
                }
            }
            Ok(Some(v)) => self.reply(caller, token, seq, record, Ok(v), &mut out),
            Err(e) => self.reply(caller, token, seq, record, Err(e), &mut out),
        }
        self.settle(&out);
        out
    }

    fn reply(&mut self, caller: &Caller, token: Token, seq: u64, record: bool, reply: Reply, out: &mut Vec<Delivery>) {
        if record && seq != 0 {
            self.logs
                .entry(caller.client.clone())
                .or_default()
                .record(seq, reply.clone());
        }
        out.push(Delivery { token, reply });
    }

    /// Book-keeping for answered calls: record the replies of parked mutating calls (for
    /// exactly-once retries) and drop their timers.
    fn settle(&mut self, out: &[Delivery]) {
        for d in out {
            if let Some(at) = self.timer_of.remove(&d.token) {
                self.timers.remove(&at);
            }
            if let Some((client, seq)) = self.parked_seqs.remove(&d.token) {
                self.logs.entry(client).or_default().record(seq, d.reply.clone());
            }
        }
    }

    fn create(
        &mut self,
        caller: &Caller,
        type_name: &str,
        key: String,
        args: &[Value],
        owned: bool,
    ) -> Result<Option<Value>, Error> {
        if key.is_empty() {
            return Err(Error::bad_args("an object name must not be empty"));
        }
        if let Some(e) = self.objects.get(&key) {
            check_type(&key, e.obj.type_name(), type_name)?;
            return Ok(Some(Value::Boolean(false)));
        }
        if let Some((new_key, _)) = self.moved.get(&key) {
            return Err(moved(&key, new_key));
        }
        let obj = objects::create(type_name, args)?;
        let owner = owned.then(|| caller.client.clone());
        self.objects.insert(key, Entry { obj, owner });
        Ok(Some(Value::Boolean(true)))
    }

    #[allow(clippy::too_many_arguments)]
    fn call(
        &mut self,
        caller: &Caller,
        token: Token,
        type_name: &str,
        key: &str,
        method: &str,
        args: &[Value],
        now: Instant,
        out: &mut Vec<Delivery>,
    ) -> (Result<Option<Value>, Error>, bool) {
        let Some(entry) = self.objects.get_mut(key) else {
            let err = match self.moved.get(key) {
                Some((new_key, _)) => moved(key, new_key),
                None => Error::new(
                    ErrorKind::NotFound,
                    format!(
                        "{type_name} '{key}' does not exist (it was deleted, or the session that created it ended)"
                    ),
                ),
            };
            return (Err(err), false);
        };
        if let Err(e) = check_type(key, entry.obj.type_name(), type_name) {
            return (Err(e), false);
        }
        let record = entry.obj.is_mutating(method);
        let mut ctx = Ctx::new(caller, token, now, out);
        let step = entry.obj.apply(method, args, &mut ctx);
        if entry.obj.tracks_connections() {
            self.conn_keys.entry(caller.conn).or_default().insert(key.to_string());
        }
        match step {
            Ok(Step::Reply(v)) => (Ok(Some(v)), record),
            Ok(Step::Park { deadline }) => {
                if let Some(d) = deadline {
                    self.timer_seq += 1;
                    let at = (d, self.timer_seq);
                    if let Some(old) = self.timer_of.insert(token, at) {
                        self.timers.remove(&old);
                    }
                    self.timers.insert(at, (key.to_string(), token));
                }
                (Ok(None), record)
            }
            Err(e) => (Err(e), record),
        }
    }

    fn delete(&mut self, key: &str, now: Instant, out: &mut Vec<Delivery>) -> bool {
        self.moved.remove(key);
        match self.objects.remove(key) {
            Some(mut e) => {
                let caller = system_caller();
                let err = Error::new(
                    ErrorKind::NotFound,
                    format!("{} '{key}' was deleted", e.obj.type_name()),
                );
                let mut ctx = Ctx::new(&caller, Token { conn: 0, req: 0 }, now, out);
                e.obj.drain_waiters(&mut ctx, &err);
                true
            }
            None => false,
        }
    }

    /// The earliest deadline of a parked call, for the driver's timer.
    pub fn next_deadline(&self) -> Option<Instant> {
        self.timers.first_key_value().map(|((d, _), _)| *d)
    }

    /// Answer parked calls whose deadline has passed.
    pub fn tick(&mut self, now: Instant) -> Vec<Delivery> {
        let mut out = Vec::new();
        let caller = system_caller();
        while let Some(entry) = self.timers.first_entry() {
            if entry.key().0 > now {
                break;
            }
            let (key, token) = entry.remove();
            self.timer_of.remove(&token);
            if let Some(e) = self.objects.get_mut(&key) {
                let mut ctx = Ctx::new(&caller, token, now, &mut out);
                e.obj.expire(token, &mut ctx);
            }
        }
        self.settle(&out);
        out
    }

    /// The caller of a parked call gave up waiting (an interrupted client): answer the call now
    /// with its timeout result, as if its deadline had passed, so the connection stays in step
    /// and keeps what it holds. Returns the replies, the withdrawn call's among them if it was
    /// still parked on `key`.
    pub fn withdraw(&mut self, token: Token, key: &str, now: Instant) -> Vec<Delivery> {
        let mut out = Vec::new();
        let caller = system_caller();
        if let Some(e) = self.objects.get_mut(key) {
            let mut ctx = Ctx::new(&caller, token, now, &mut out);
            ctx.withdrawing = true;
            e.obj.expire(token, &mut ctx);
        }
        self.settle(&out);
        out
    }

    /// A connection closed: drop its parked calls and release what it held.
    pub fn disconnect(&mut self, conn: ConnId, now: Instant) -> Vec<Delivery> {
        let mut out = Vec::new();
        let caller = system_caller();
        for key in self.conn_keys.remove(&conn).unwrap_or_default() {
            if let Some(e) = self.objects.get_mut(&key) {
                let mut ctx = Ctx::new(&caller, Token { conn: 0, req: 0 }, now, &mut out);
                e.obj.disconnect(conn, &mut ctx);
            }
        }
        self.parked_seqs.retain(|t, _| t.conn != conn);
        let timers = &mut self.timers;
        self.timer_of.retain(|t, at| {
            let keep = t.conn != conn;
            if !keep {
                timers.remove(at);
            }
            keep
        });
        out.retain(|d| d.token.conn != conn);
        self.settle(&out);
        out
    }

    /// A session ended: its unnamed objects go, and so does its reply log.
    pub fn end_session(&mut self, client: &str, now: Instant) -> Vec<Delivery> {
        let mut out = Vec::new();
        let doomed: Vec<String> = self
            .objects
            .iter()
            .filter(|(_, e)| e.owner.as_deref() == Some(client))
            .map(|(k, _)| k.clone())
            .collect();
        for key in doomed {
            self.delete(&key, now, &mut out);
        }
        self.moved.retain(|_, (_, owner)| owner.as_deref() != Some(client));
        // Parked calls of other sessions answered NotFound keep exactly-once.
        self.settle(&out);
        self.logs.remove(client);
        out
    }

    /// Take an object out for `keep`. Refused while calls are parked on it.
    pub fn detach(&mut self, type_name: &str, key: &str) -> Result<Detached, Error> {
        let e = self
            .objects
            .get(key)
            .ok_or_else(|| Error::new(ErrorKind::NotFound, format!("{type_name} '{key}' does not exist")))?;
        check_type(key, e.obj.type_name(), type_name)?;
        if e.obj.has_waiters() {
            return Err(Error::new(
                ErrorKind::Busy,
                format!("{type_name} '{key}' has parked callers; keep it when none are waiting"),
            ));
        }
        let e = self.objects.remove(key).expect("checked");
        Ok(Detached {
            obj: e.obj,
            owner: e.owner,
        })
    }

    /// Put a detached object under `key`, owned by nobody. Gives it back if `key` is taken.
    pub fn attach(&mut self, key: &str, d: Detached) -> Result<(), (Error, Detached)> {
        if let Some(e) = self.objects.get(key) {
            let err = Error::new(
                ErrorKind::TypeMismatch,
                format!("'{key}' is already a {}", e.obj.type_name()),
            );
            return Err((err, d));
        }
        self.moved.remove(key);
        self.objects.insert(
            key.to_string(),
            Entry {
                obj: d.obj,
                owner: None,
            },
        );
        Ok(())
    }

    /// Undo a detach whose attach failed.
    pub fn restore(&mut self, key: &str, d: Detached) {
        self.objects.insert(
            key.to_string(),
            Entry {
                obj: d.obj,
                owner: d.owner,
            },
        );
    }

    /// Leave a forwarding note at an old key after `keep` moved its object.
    pub fn set_moved(&mut self, old_key: &str, new_key: &str, owner: Option<Arc<str>>) {
        self.moved.insert(old_key.to_string(), (new_key.to_string(), owner));
    }

    /// `keep(obj)` without a new name: the object outlives its session.
    pub fn disown(&mut self, type_name: &str, key: &str) -> Result<(), Error> {
        let e = self
            .objects
            .get_mut(key)
            .ok_or_else(|| Error::new(ErrorKind::NotFound, format!("{type_name} '{key}' does not exist")))?;
        check_type(key, e.obj.type_name(), type_name)?;
        e.owner = None;
        Ok(())
    }
}

impl Detached {
    pub fn owner(&self) -> Option<Arc<str>> {
        self.owner.clone()
    }
}

fn check_type(key: &str, actual: &str, wanted: &str) -> Result<(), Error> {
    if actual == wanted {
        Ok(())
    } else {
        Err(Error::new(
            ErrorKind::TypeMismatch,
            format!("'{key}' is a {actual}, not a {wanted}"),
        ))
    }
}

fn moved(key: &str, new_key: &str) -> Error {
    Error::new(ErrorKind::Moved, format!("'{key}' was kept as '{new_key}'")).with_data(Value::from(new_key))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::objects::testing::*;

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
        };
        let t0 = p.token(1);
        p.p.apply(&owner, t0, 1, op, p.now);
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
}
