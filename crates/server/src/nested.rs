//! Nested calls: a compiled method that calls methods of other objects (`spindle.call`,
//! docs/wasm.md), as LambdaStore's objects do.
//!
//! A method that makes no nested call runs as any call. One that makes calls runs in a
//! transaction this module drives, so that it and every call it makes commit together or not
//! at all, isolated from other calls as any transaction is. Nothing in the partition
//! suspends: the method runs to its first call whose reply is not known,
//! which stops it (`NestedCall`, the call's key, method and arguments); the driver runs that
//! call in the transaction (it may nest in turn), then runs the method again from its start
//! with the replies known so far. A compiled method sees only its state, its arguments and
//! those replies, so each run makes the same calls until it makes a new one; only the last
//! run's state counts. The method's call is logged with the replies, so replay and replicas
//! run it once, never its nested calls again (their own records are in the same commit).
//!
//! ```text
//! client ─call A.m─► partition: A makes calls ─NestedCall─► driver (a task)
//!   driver: txn{ A.m [] } ─needs B.n(x)─► txn{ B.n(x) } = r1 ─► txn{ A.m [r1] } = v
//!           commit (A's record carries [r1]; v recorded for the client's seq) ─► client: v
//! ```
//!
//! A call outside any transaction gets a transaction of its own, retried on conflict like
//! `@spindle.transactional`, whose commit records the method's reply for the client's
//! `seq` in the object's partition: a retried call gets it, exactly once (a copy sent while
//! it runs waits for the same reply). A call inside the client's transaction runs its nested
//! calls in that transaction, its reply kept there for a resent copy. Each nested call needs
//! the permission the client would need to make it; an object in the chain of calls cannot
//! be called again (its runs would see their own half-made changes). There are no
//! savepoints: a nested call that raised after its own nested calls changed objects fails the
//! whole call (and aborts the client's transaction), since nothing undoes those alone.

use ahash::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, PoisonError};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use spindle_core::objects::user;
use spindle_core::partition::{Op, TxnId};
use spindle_core::{Caller, ConnId, Delivery, Error, ErrorKind, Reply, Token, Value};
use spindle_proto::{Request, TxnRef};

use crate::access::{self, Grant};
use crate::acl::Principal;
use crate::registry::Mailbox;
use crate::{calls, transactions, Shared};

/// Calls to other objects one method call may make (all its nested calls' included).
pub(crate) const MAX_CALLS: usize = 64;

/// How deep a chain of calls may go (a method calling a method calling ...).
pub(crate) const MAX_DEPTH: usize = 8;

/// Attempts of a call's own transaction before its conflict is the reply.
const ATTEMPTS: u32 = 50;

/// Transaction numbers of the driver's own transactions: a range clients do not use (their
/// SDKs count from 1).
const OWN_NUMBERS: u64 = 1 << 62;

/// Where the replies of the driver's calls come back: a mailbox of its own, as HTTP's.
#[derive(Default)]
pub(crate) struct Drivers {
    mailroom: OnceLock<(ConnId, Arc<Mailbox>)>,
    next: AtomicU64,
    /// The calls being driven, by session and seq, with the copies of each sent again
    /// meanwhile (a reconnect, an HTTP retry), which get the same reply.
    running: Mutex<Running>,
}

/// The calls being driven, by `(session, seq)`: the tokens of the copies sent meanwhile.
type Running = HashMap<(Arc<str>, u64), Vec<Token>>;

impl Drivers {
    fn mailroom(&self, shared: &Shared) -> &(ConnId, Arc<Mailbox>) {
        self.mailroom.get_or_init(|| {
            let mailbox = Arc::new(Mailbox::default());
            (shared.registry.register_mailbox(mailbox.clone()), mailbox)
        })
    }

    fn next(&self) -> u64 {
        self.next.fetch_add(1, Ordering::Relaxed) + 1
    }

    fn running(&self) -> MutexGuard<'_, Running> {
        self.running.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// After `calls::apply` or `transactions::call` (in the client's transaction `txn`): if
/// `token`'s reply is the partition asking for its method's nested calls, drive them on a
/// task of their own (the reply comes from there, through the registry).
pub(crate) fn drive_if_asked(
    shared: &Arc<Shared>,
    caller: &Caller,
    who: Option<&Principal>,
    (token, seq): (Token, u64),
    txn: Option<TxnRef>,
    deliveries: &mut Vec<Delivery>,
) {
    let Some(at) = deliveries
        .iter()
        .position(|d| d.token == token && matches!(&d.reply, Err(e) if e.kind == ErrorKind::NestedCall))
    else {
        return;
    };
    let Err(asked) = deliveries.swap_remove(at).reply else {
        unreachable!("found above")
    };
    let Some(op) = handed_op(asked.data) else {
        let e = Error::new(ErrorKind::Internal, "a nested call's request was malformed");
        deliveries.push(Delivery { token, reply: Err(e) });
        return;
    };
    let what = "a method's calls to other objects";
    if let Err(e) = crate::cluster::require_format(shared, crate::cluster::format::NESTED_CALLS, what) {
        deliveries.push(Delivery { token, reply: Err(e) });
        return;
    }
    let running = (caller.client.clone(), seq);
    if seq != 0 {
        let mut drivers = shared.nested.running();
        if let Some(copies) = drivers.get_mut(&running) {
            // Sent again while its first copy runs: one run, one reply for both.
            copies.push(token);
            return;
        }
        drivers.insert(running.clone(), Vec::new());
    }
    let driver = Driver {
        shared: shared.clone(),
        client: caller.clone(),
        who: who.cloned(),
    };
    tokio::spawn(async move {
        let reply = match txn {
            Some(txn) => driver.in_transaction(txn, seq, op).await,
            None => driver.on_its_own(seq, op).await,
        };
        let copies = match seq {
            0 => Vec::new(),
            _ => driver.shared.nested.running().remove(&running).unwrap_or_default(),
        };
        let replies = std::iter::once(token).chain(copies).map(|token| Delivery {
            token,
            reply: reply.clone(),
        });
        driver.shared.registry.deliver(replies.collect::<Vec<_>>());
    });
}

struct Driver {
    shared: Arc<Shared>,
    /// The client whose call this is: its session, connection and thread.
    client: Caller,
    who: Option<Principal>,
}

/// One transaction the driver makes calls in.
struct Txn {
    number: u64,
    age: u64,
    /// No call of it has run yet.
    first: bool,
    /// Calls to other objects made so far.
    calls: usize,
}

impl Driver {
    /// The client's call, in a transaction of its own: the method's reply, recorded for
    /// `seq` at the commit.
    async fn on_its_own(&self, seq: u64, op: Op) -> Reply {
        let age = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default()
            .as_micros() as u64;
        let key = op.key().to_string();
        let mut last = None;
        let started = Instant::now();
        for attempt in 0..ATTEMPTS {
            // Past a transaction's time limit, its conflicts are not worth another attempt.
            if started.elapsed() > self.shared.config.limits.transactions.duration {
                break;
            }
            if attempt > 1 {
                tokio::time::sleep(Duration::from_millis(u64::from(attempt.min(20)))).await;
            }
            let mut txn = Txn {
                number: OWN_NUMBERS + self.shared.nested.next(),
                age,
                first: true,
                calls: 0,
            };
            // A fatal error (a conflict among them) and the method's own are both the
            // reply; nothing of the attempt commits.
            let committed = match self.run(&mut txn, op.clone(), &[key.as_str()]).await {
                Ok(Ok(value)) => self.commit(&txn, seq, &key, Ok(value)).await,
                Ok(Err(e)) | Err(e) => Err(e),
            };
            match committed {
                Err(e) if e.kind == ErrorKind::TransactionConflict => {
                    transactions::abort(&self.shared, &self.client.client, txn.number);
                    last = Some(e);
                }
                reply => {
                    transactions::abort(&self.shared, &self.client.client, txn.number);
                    return reply;
                }
            }
        }
        Err(last.unwrap_or_else(|| Error::new(ErrorKind::TransactionConflict, "no attempt ran")))
    }

    /// The client's call `seq` inside its transaction `txn`: the method's reply, kept in the
    /// transaction for a resent call. A method that raised after its nested calls changed
    /// objects aborts the transaction (nothing undoes those changes alone).
    async fn in_transaction(&self, txn: TxnRef, seq: u64, op: Op) -> Reply {
        let key = op.key().to_string();
        let call = format!("{key}.{}", op_method(&op));
        let mut txn = Txn {
            number: txn.number,
            age: txn.age,
            first: false,
            calls: 0,
        };
        let reply = match self.run(&mut txn, op, &[key.as_str()]).await {
            // Its nested calls changed objects, and nothing undoes them alone.
            Ok(Err(e)) if txn.calls > 0 => Err(aborts(
                &self.shared,
                &self.client,
                txn.number,
                raised_after_calls(&call, &e),
            )),
            Ok(reply) => reply,
            Err(e) if e.kind == ErrorKind::TransactionConflict => Err(e),
            Err(e) => Err(aborts(&self.shared, &self.client, txn.number, e)),
        };
        let id = TxnId {
            client: self.client.client.clone(),
            number: txn.number,
        };
        let index = self.shared.shards.index_of(&key);
        let _ = self
            .shared
            .shards
            .with(index, |s| s.partition.answered_in(&id, seq, reply.clone()));
        reply
    }

    /// Run `op` (a call of a method that may call others; `chain`: the objects whose
    /// methods are running, `op`'s last) in `txn` until it needs no call it has not made.
    /// Its reply, or a fatal error, which ends the whole call: a limit passed, or the
    /// transaction ended (a conflict: it may run again).
    fn run<'a>(
        &'a self,
        txn: &'a mut Txn,
        mut op: Op,
        chain: &'a [&'a str],
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = Result<Reply, Error>> + Send + 'a>> {
        Box::pin(async move {
            loop {
                let reply = self.call(txn, op.clone()).await;
                let Err(e) = &reply else { return Ok(reply) };
                match e.kind {
                    ErrorKind::NestedCall => {}
                    // The transaction ended (an older one took an object, its time ran out, a
                    // call would have waited): nothing more of it may run.
                    ErrorKind::TransactionConflict | ErrorKind::TransactionError => return reply.map(Ok),
                    _ => return Ok(reply),
                }
                let Op::Call { nested, .. } = &mut op else {
                    unreachable!("only calls nest")
                };
                let nested = nested.get_or_insert_with(Vec::new);
                let reply = match nested_op(&e.data) {
                    None => return Err(Error::new(ErrorKind::Internal, "a nested call's request was malformed")),
                    Some((key, method, args)) => self.nested(txn, chain, key, method, args).await?,
                };
                nested.push(reply);
            }
        })
    }

    /// One nested call, `key.method(args)`, made by the method of `chain`'s last object: its
    /// reply, for the method; or an error that ends the whole call: a limit passed, or a call
    /// that raised after its own nested calls changed objects (nothing undoes those alone).
    async fn nested(
        &self,
        txn: &mut Txn,
        chain: &[&str],
        key: String,
        method: String,
        args: Vec<Value>,
    ) -> Result<Reply, Error> {
        let caller = chain.last().copied().unwrap_or_default();
        let shards = &self.shared.shards;
        if self.shared.cluster.is_some() && shards.index_of(&key) != shards.index_of(chain[0]) {
            // Its commit is one entry of one shard's Raft group.
            return Err(Error::new(
                ErrorKind::TransactionError,
                format!(
                    "{caller} called '{key}', in another shard than '{}': in a cluster, a method's nested calls \
                     must stay in its object's shard (name the objects it calls so that they share its shard, or \
                     call them from the client in a transaction)",
                    chain[0]
                ),
            ));
        }
        txn.calls += 1;
        if txn.calls > MAX_CALLS {
            return Err(Error::runtime(format!(
                "{caller} made more than {MAX_CALLS} calls to other objects in one call"
            )));
        }
        if chain.contains(&key.as_str()) {
            return Err(Error::runtime(format!(
                "{caller} called '{key}', whose method is running in this chain of calls ({}): an object's \
                 method cannot be called again before it returns",
                chain.join(" -> ")
            )));
        }
        if chain.len() >= MAX_DEPTH {
            return Err(Error::runtime(format!(
                "the chain of calls {} -> {key} is deeper than {MAX_DEPTH}",
                chain.join(" -> ")
            )));
        }
        let before = txn.calls;
        match self.reply_of(txn, chain, &key, &method, args).await? {
            Err(e) if txn.calls > before => Err(raised_after_calls(&format!("{key}.{method}"), &e)),
            reply => Ok(reply),
        }
    }

    /// [`nested`](Self::nested)'s call, its errors the method's to handle.
    async fn reply_of(
        &self,
        txn: &mut Txn,
        chain: &[&str],
        key: &str,
        method: &str,
        args: Vec<Value>,
    ) -> Result<Reply, Error> {
        let caller = chain.last().copied().unwrap_or_default();
        let type_name = match calls::type_of(&self.shared, key) {
            Ok(Some(t)) => t,
            Ok(None) => {
                return Ok(Err(Error::new(
                    ErrorKind::NotFound,
                    format!("'{key}' does not exist (called by {caller})"),
                )))
            }
            Err(e) => return Ok(Err(e)),
        };
        if user::is_user_type(&type_name) {
            return Ok(Err(Error::new(
                ErrorKind::TypeMismatch,
                format!(
                    "'{key}' is a {type_name}: a compiled method may call built-in and compiled objects, not \
                     user-defined (Python) ones"
                ),
            )));
        }
        if let Some(who) = &self.who {
            let request = Request::Call {
                id: 0,
                seq: 0,
                thread: 0,
                type_name: type_name.clone(),
                key: key.to_string(),
                method: method.to_string(),
                args: Vec::new(),
                acked: 0,
                txn: None,
            };
            match access::permit(who, &request) {
                Ok(Grant::Yes) => {}
                // A reader's call of a compiled method may write: inside a transaction, refused.
                Ok(Grant::IfExists(refusal) | Grant::IfReads(refusal)) | Err(refusal) => return Ok(Err(refusal)),
            }
        }
        let op = Op::Call {
            type_name,
            key: key.to_string(),
            method: method.to_string(),
            args,
            nested: Some(Vec::new()),
        };
        let mut inner = chain.to_vec();
        inner.push(key);
        self.run(txn, op, &inner).await
    }

    /// One call in `txn`, answered at once or, if it waited (for an older transaction's
    /// object), through the driver's mailbox.
    async fn call(&self, txn: &mut Txn, op: Op) -> Reply {
        let reference = TxnRef {
            number: txn.number,
            age: txn.age,
            first: std::mem::take(&mut txn.first),
        };
        self.exchange(|caller, token| transactions::call(&self.shared, caller, token, 0, reference, op))
            .await
    }

    /// Commit `txn`, recording `reply` for the client's call `seq` on `key`: the reply, or
    /// why it did not commit.
    async fn commit(&self, txn: &Txn, seq: u64, key: &str, reply: Reply) -> Reply {
        let client = self.client.clone();
        self.exchange(|_, token| transactions::commit_call(&self.shared, &client, (token, seq), txn.number, key, reply))
            .await
    }

    /// Send what `send` sends as the driver (a caller on its mailbox, a token of its own),
    /// and wait for its reply: among the replies `send` returns, or later (a call that
    /// waited for an older transaction; a commit's, once its log record is written).
    async fn exchange(&self, send: impl FnOnce(&Caller, Token) -> Result<Vec<Delivery>, Error>) -> Reply {
        let (conn, mailbox) = self.shared.nested.mailroom(&self.shared);
        let token = Token {
            conn: *conn,
            req: self.shared.nested.next(),
        };
        let answer = mailbox.expect(token.req);
        let caller = Caller {
            conn: *conn,
            ..self.client.clone()
        };
        let deliveries = match send(&caller, token) {
            Ok(deliveries) => deliveries,
            Err(e) => {
                mailbox.forget(token.req);
                return Err(e);
            }
        };
        let (mine, others): (Vec<_>, Vec<_>) = deliveries.into_iter().partition(|d| d.token == token);
        self.shared.registry.deliver(others);
        if let Some(d) = mine.into_iter().next() {
            mailbox.forget(token.req);
            return d.reply;
        }
        match answer.await {
            Ok((reply, _)) => reply,
            Err(_) => Err(Error::new(ErrorKind::Internal, "a nested call's reply was lost")),
        }
    }
}

/// The error that ends a call whose `call` (`key.method`) raised `e` after its own nested
/// calls changed objects: the method that made it cannot handle it, since nothing undoes
/// those changes alone (there are no savepoints), so the whole call fails.
fn raised_after_calls(call: &str, e: &Error) -> Error {
    Error::new(
        ErrorKind::TransactionError,
        format!(
            "{call} raised after its own calls to other objects ({}: {}): a method cannot go on past a call \
             that changed objects and raised, so the whole call failed and nothing of it happened",
            e.kind.as_str(),
            e.message
        ),
    )
}

fn op_method(op: &Op) -> &str {
    match op {
        Op::Call { method, .. } => method,
        _ => "",
    }
}

/// Abort `client`'s transaction `number`, which must not commit after `e`: the error that
/// says so.
fn aborts(shared: &Arc<Shared>, client: &Caller, number: u64, e: Error) -> Error {
    transactions::abort(shared, &client.client, number);
    let kind = match e.kind {
        ErrorKind::TransactionConflict => ErrorKind::TransactionConflict,
        _ => ErrorKind::TransactionError,
    };
    Error::new(kind, format!("{}; transaction {number} was aborted", e.message))
}

/// The call a partition handed over, `[type, key, method, args]`, to run with nested replies.
fn handed_op(data: Value) -> Option<Op> {
    let Value::Array(fields) = data else { return None };
    let Ok([Value::String(type_name), Value::String(key), Value::String(method), Value::Array(args)]) =
        <[Value; 4]>::try_from(fields)
    else {
        return None;
    };
    Some(Op::Call {
        type_name: type_name.into_str()?,
        key: key.into_str()?,
        method: method.into_str()?,
        args,
        nested: Some(Vec::new()),
    })
}

/// `[key, method, args]` of a call a method made.
fn nested_op(data: &Value) -> Option<(String, String, Vec<Value>)> {
    match data {
        Value::Array(fields) => match fields.as_slice() {
            [Value::String(key), Value::String(method), Value::Array(args)] => {
                Some((key.as_str()?.to_string(), method.as_str()?.to_string(), args.clone()))
            }
            _ => None,
        },
        _ => None,
    }
}
