//! Transactions' calls that wait (wound-wait): a call wanting an object an older transaction
//! holds waits until that one commits or aborts, then runs again, oldest transaction first.
//! Waits only ever go from younger to older, so they cannot form a cycle; an older
//! transaction wanting an object a younger one holds still takes it (the younger is aborted
//! here, and its own waiting call, if any, is answered `TransactionConflict`). A waiting
//! call ends at its transaction's deadline at the latest.

use ahash::HashMap;
use std::time::Instant;

use super::{Op, Partition, TxnCall, TxnId};
use crate::{Caller, Delivery, Error, ErrorKind, Token};

/// A transaction's call put aside: it waits for an older transaction's object, or (in a
/// cluster) for a prepared transaction's decision.
pub(super) struct TxnWaiter {
    pub(super) id: TxnId,
    pub(super) age: u64,
    pub(super) first: bool,
    pub(super) deadline: Instant,
    pub(super) max_bytes: usize,
    pub(super) caller: Caller,
    pub(super) token: Token,
    pub(super) seq: u64,
    pub(super) op: Op,
}

impl TxnWaiter {
    pub(super) fn new(txn: TxnCall<'_>, caller: &Caller, token: Token, seq: u64, op: Op) -> Self {
        Self {
            id: txn.id.clone(),
            age: txn.age,
            first: txn.first,
            deadline: txn.deadline,
            max_bytes: txn.max_bytes,
            caller: caller.clone(),
            token,
            seq,
            op,
        }
    }
}

/// The calls waiting for objects transactions hold, in one partition.
#[derive(Default)]
pub(super) struct LockWaits {
    /// By key: the calls waiting for it.
    waiters: HashMap<String, Vec<TxnWaiter>>,
    /// By transaction: the key its call waits for, and the call (a transaction has one call
    /// in flight).
    waiting: HashMap<TxnId, (String, Token)>,
    /// Keys released since the waiters last ran.
    released: Vec<String>,
    /// Replies to waiting calls of transactions that ended here, not sent yet.
    replies: Vec<Delivery>,
}

impl Partition {
    /// Whether transaction `id` must wait for `key`: an older transaction holds it.
    pub(super) fn must_wait(&self, id: &TxnId, key: &str) -> bool {
        let Some(holder) = self.locks.get(key).filter(|h| *h != id) else {
            return false;
        };
        match (self.txns.get(holder), self.txns.get(id)) {
            (Some(them), Some(us)) => them.older_than(holder, us, id),
            _ => false,
        }
    }

    /// Run a call that waited: one that turns out to call other objects (its object was
    /// created meanwhile) cannot be handed to the server's driver of nested calls from here,
    /// so its transaction is aborted, to run again (when the call goes to the driver at once).
    pub(super) fn run_woken(&mut self, w: TxnWaiter, now: Instant) -> Option<Delivery> {
        let id = w.id.clone();
        let mut woken = self.run_in(w, now)?;
        if matches!(&woken.reply, Err(e) if e.kind == ErrorKind::NestedCall) {
            self.forget_txn(&id, "");
            woken.reply = Err(Error::new(
                ErrorKind::TransactionConflict,
                format!(
                    "transaction {} was aborted: the object its call waited for calls other objects (run it again)",
                    id.number
                ),
            ));
        }
        Some(woken)
    }

    /// Put `w` aside until `key`'s holder ends.
    pub(super) fn wait_for_lock(&mut self, w: TxnWaiter) {
        let key = w.op.key().to_string();
        // A call sent again (its client reconnected) takes the first one's place.
        if let Some((old, _)) = self.lock_waits.waiting.insert(w.id.clone(), (key.clone(), w.token)) {
            if let Some(waiters) = self.lock_waits.waiters.get_mut(&old) {
                waiters.retain(|other| other.id != w.id);
                if waiters.is_empty() {
                    self.lock_waits.waiters.remove(&old);
                }
            }
        }
        self.lock_waits.waiters.entry(key).or_default().push(w);
    }

    /// `key` is free again (its holder committed or ended): its waiters run at the next
    /// [`wake`](Self::wake).
    pub(super) fn lock_released(&mut self, key: &str) {
        if self.lock_waits.waiters.contains_key(key) {
            self.lock_waits.released.push(key.to_string());
        }
    }

    /// Transaction `id` ended here (`why`, if said): its waiting call, if any, is answered
    /// with it.
    pub(super) fn stop_waiting(&mut self, id: &TxnId, why: &str) {
        let Some((key, token)) = self.lock_waits.waiting.remove(id) else {
            return;
        };
        let why = if why.is_empty() { "it was aborted" } else { why };
        // Not among them when its key's waiters are being run (`wake` skips it then).
        if let Some(waiters) = self.lock_waits.waiters.get_mut(&key) {
            waiters.retain(|w| w.id != *id);
            if waiters.is_empty() {
                self.lock_waits.waiters.remove(&key);
            }
        }
        self.lock_waits.replies.push(Delivery {
            token,
            reply: Err(Error::new(
                ErrorKind::TransactionConflict,
                format!(
                    "transaction {} was aborted while it waited for '{key}': {why}",
                    id.number
                ),
            )),
        });
    }

    /// Run the calls waiting for the keys released since the last time, oldest transaction
    /// first (the first takes the key; the others wait again, for it), and return their
    /// replies with those of waiting calls whose transaction ended.
    pub(super) fn wake(&mut self, now: Instant) -> Vec<Delivery> {
        let mut out = std::mem::take(&mut self.lock_waits.replies);
        while let Some(key) = self.lock_waits.released.pop() {
            let Some(mut waiters) = self.lock_waits.waiters.remove(&key) else {
                continue;
            };
            waiters.sort_by(|a, b| (a.age, &a.id).cmp(&(b.age, &b.id)));
            for w in waiters {
                // Answered already if its transaction ended meanwhile (another waiter of
                // this key, older, took one of its objects).
                if self.lock_waits.waiting.remove(&w.id).is_some() {
                    out.extend(self.run_woken(w, now));
                }
            }
            out.append(&mut self.lock_waits.replies);
        }
        out
    }

    /// The waiting calls on the keys a transaction being prepared held wait for its
    /// decision instead.
    pub(super) fn wait_for_prepared(&mut self, keys: &[String]) {
        for key in keys {
            for w in self.lock_waits.waiters.remove(key).unwrap_or_default() {
                self.lock_waits.waiting.remove(&w.id);
                self.wait_in_txn(w);
            }
        }
    }

    /// The waiting call `token` on `key` was withdrawn (its caller gave up): its
    /// transaction is aborted here, and the call answered so.
    pub(super) fn withdraw_waiting(&mut self, token: Token, key: &str) -> bool {
        let Some(w) = self
            .lock_waits
            .waiters
            .get(key)
            .and_then(|ws| ws.iter().find(|w| w.token == token))
        else {
            return false;
        };
        let id = w.id.clone();
        self.forget_txn(&id, "its call was withdrawn");
        true
    }

    /// The partition is given up (its leader stepped down, or it moved away): every waiting
    /// call is answered `error`.
    pub(super) fn abandon_lock_waits(&mut self, error: &Error) -> Vec<Delivery> {
        let waits = std::mem::take(&mut self.lock_waits);
        let waiting = waits.waiters.into_values().flatten().map(|w| Delivery {
            token: w.token,
            reply: Err(error.clone()),
        });
        waits.replies.into_iter().chain(waiting).collect()
    }

    /// Connection `conn` closed: its waiting calls go unanswered (their transactions stay
    /// open: a client that reconnects sends the call again).
    pub(super) fn drop_waiting_of(&mut self, conn: u64) {
        let waiting = &mut self.lock_waits.waiting;
        self.lock_waits.waiters.retain(|_, ws| {
            ws.retain(|w| {
                let keep = w.token.conn != conn;
                if !keep {
                    waiting.remove(&w.id);
                }
                keep
            });
            !ws.is_empty()
        });
    }
}
