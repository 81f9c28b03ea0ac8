//! A FIFO queue of parked calls, shared by every blocking type.
//!
//! Waiters are woken in arrival order; any one of them can be withdrawn in O(log n) (a
//! timeout, a disconnect), so thousands of parked callers cost nothing per wake-up.

use ahash::HashMap;
use std::collections::BTreeMap;
use std::time::Instant;

use crate::{ConnId, Ctx, Error, Reply, Step, Token, Value};

/// One parked call and what the object needs to answer it later.
#[derive(Clone, Debug)]
pub struct Waiter<T> {
    pub token: Token,
    pub conn: ConnId,
    pub deadline: Option<Instant>,
    pub data: T,
}

#[derive(Clone, Debug)]
pub struct WaitQueue<T> {
    next: u64,
    order: BTreeMap<u64, Waiter<T>>,
    index: HashMap<Token, u64>,
}

impl<T> Default for WaitQueue<T> {
    fn default() -> Self {
        WaitQueue {
            next: 0,
            order: BTreeMap::new(),
            index: HashMap::default(),
        }
    }
}

impl<T> WaitQueue<T> {
    /// Park the current caller; returns the step to hand back to the partition.
    pub fn park(&mut self, ctx: &Ctx, deadline: Option<Instant>, data: T) -> Step {
        self.push(Waiter {
            token: ctx.token,
            conn: ctx.caller.conn,
            deadline,
            data,
        });
        Step::Park { deadline }
    }

    pub fn push(&mut self, w: Waiter<T>) {
        self.next += 1;
        self.index.insert(w.token, self.next);
        self.order.insert(self.next, w);
    }

    pub fn pop(&mut self) -> Option<Waiter<T>> {
        let (seq, w) = self.order.pop_first()?;
        self.unindex(w.token, seq);
        Some(w)
    }

    pub fn get(&self, token: Token) -> Option<&Waiter<T>> {
        self.index.get(&token).and_then(|seq| self.order.get(seq))
    }

    pub fn remove(&mut self, token: Token) -> Option<Waiter<T>> {
        let seq = self.index.remove(&token)?;
        self.order.remove(&seq)
    }

    /// Withdraw `token` if it is still parked and due: its own deadline has passed, or its
    /// caller withdraws it. Checking the deadline guards against a stale timer meeting a
    /// newer call that reused the token.
    pub fn take_due(&mut self, token: Token, ctx: &Ctx) -> Option<Waiter<T>> {
        if ctx.is_due(self.get(token)?.deadline) {
            self.remove(token)
        } else {
            None
        }
    }

    /// Answer `token` with `reply` if it is still parked here and due (see [`Self::take_due`]);
    /// returns whether it was.
    pub fn expire_with(&mut self, token: Token, ctx: &mut Ctx, reply: Reply) -> bool {
        match self.take_due(token, ctx) {
            Some(w) => {
                ctx.deliver(w.token, reply);
                true
            }
            None => false,
        }
    }

    /// Answer every waiter, oldest first, with `err`, leaving the queue empty.
    pub fn fail_all(&mut self, ctx: &mut Ctx, err: &Error) {
        for w in self.drain() {
            ctx.deliver(w.token, Err(err.clone()));
        }
    }

    /// Withdraw every waiter of a connection, in arrival order.
    pub fn remove_conn(&mut self, conn: ConnId) -> Vec<Waiter<T>> {
        if !self.order.values().any(|w| w.conn == conn) {
            return Vec::new();
        }
        let seqs: Vec<u64> = self
            .order
            .iter()
            .filter(|(_, w)| w.conn == conn)
            .map(|(s, _)| *s)
            .collect();
        seqs.into_iter()
            .filter_map(|s| {
                let w = self.order.remove(&s)?;
                self.unindex(w.token, s);
                Some(w)
            })
            .collect()
    }

    /// Every waiter, oldest first, leaving the queue empty.
    pub fn drain(&mut self) -> Vec<Waiter<T>> {
        self.index.clear();
        std::mem::take(&mut self.order).into_values().collect()
    }

    pub fn is_empty(&self) -> bool {
        self.order.is_empty()
    }

    /// Forget the index entry only if it still points at this waiter (a reused token may
    /// point at a newer one).
    fn unindex(&mut self, token: Token, seq: u64) {
        if self.index.get(&token) == Some(&seq) {
            self.index.remove(&token);
        }
    }
}

/// A gate that stays shut until it opens for everyone (`Event`, `CountDownLatch`).
impl WaitQueue<()> {
    /// `wait([timeout])` on the gate: `true` at once if it is `open`, `false` at once for a
    /// zero timeout, else park the caller until [`Self::open_gate`] or its deadline.
    pub fn wait_gate(&mut self, open: bool, timeout: Option<f64>, ctx: &Ctx) -> Step {
        if open {
            Step::Reply(Value::Boolean(true))
        } else if timeout == Some(0.0) {
            Step::Reply(Value::Boolean(false))
        } else {
            self.park(ctx, ctx.deadline(timeout), ())
        }
    }

    /// The gate opened: every waiter, oldest first, hears `true`.
    pub fn open_gate(&mut self, ctx: &mut Ctx) {
        for w in self.drain() {
            ctx.deliver(w.token, Ok(Value::Boolean(true)));
        }
    }
}

/// The [`Object`](crate::Object) methods of a type whose parked calls all wait in the one
/// `WaitQueue` field `$queue`: a due waiter is answered `$timeout`, a connection's end
/// forgets its waiters (then calls `on_disconnect`, the type's own method for what else the
/// connection gives back, if any), and deleting the object fails every waiter.
macro_rules! wait_queue_methods {
    ($queue:ident, timeout: $timeout:expr) => {
        $crate::objects::waiters::wait_queue_methods!(@common $queue, $timeout);

        fn disconnect(&mut self, conn: $crate::ConnId, _ctx: &mut $crate::Ctx) {
            self.$queue.remove_conn(conn);
        }
    };
    ($queue:ident, timeout: $timeout:expr, on_disconnect: $release:ident) => {
        $crate::objects::waiters::wait_queue_methods!(@common $queue, $timeout);

        fn disconnect(&mut self, conn: $crate::ConnId, ctx: &mut $crate::Ctx) {
            self.$queue.remove_conn(conn);
            self.$release(conn, ctx);
        }
    };
    (@common $queue:ident, $timeout:expr) => {
        fn expire(&mut self, waiter: $crate::Token, ctx: &mut $crate::Ctx) {
            self.$queue.expire_with(waiter, ctx, $timeout);
        }

        fn drain_waiters(&mut self, ctx: &mut $crate::Ctx, reply: &$crate::Error) {
            self.$queue.fail_all(ctx, reply);
        }

        fn has_waiters(&self) -> bool {
            !self.$queue.is_empty()
        }

        fn tracks_connections(&self) -> bool {
            true
        }
    };
}

pub(super) use wait_queue_methods;
