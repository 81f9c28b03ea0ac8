//! `RLock`: a reentrant lock owned by a `(client, thread)` pair, as `threading.RLock` is
//! owned by a thread. Same FIFO hand-over and "abandoned" rule as `Lock`.

use std::sync::Arc;

use crate::object::args;
use crate::{Caller, ConnId, Ctx, Error, ErrorKind, Object, Step, Value};

use super::lock::{acquire_args, granted};
use super::waiters::{wait_queue_methods, WaitQueue};

type Owner = (Arc<str>, u64);

fn owner_of(c: &Caller) -> Owner {
    (c.client.clone(), c.thread)
}

#[derive(Clone)]
struct Held {
    owner: Owner,
    /// The connection of the owner's latest acquire: its end releases the lock.
    conn: ConnId,
    count: u64,
}

#[derive(Clone)]
pub struct RLock {
    held: Option<Held>,
    abandoned: bool,
    waiters: WaitQueue<Owner>,
}

impl RLock {
    pub fn new(a: &[Value]) -> Result<Self, Error> {
        args::arity("RLock", a, 0, 0)?;
        Ok(RLock {
            held: None,
            abandoned: false,
            waiters: WaitQueue::default(),
        })
    }

    fn hand_over(&mut self, ctx: &mut Ctx) {
        self.held = self.waiters.pop().map(|w| {
            let v = granted(&mut self.abandoned);
            ctx.deliver(w.token, Ok(v));
            Held {
                owner: w.data,
                conn: w.conn,
                count: 1,
            }
        });
    }

    /// An owner whose connection ended releases the lock "abandoned", however often it
    /// acquired it.
    fn release_if_owner(&mut self, conn: ConnId, ctx: &mut Ctx) {
        if self.held.as_ref().is_some_and(|h| h.conn == conn) {
            self.abandoned = true;
            self.hand_over(ctx);
        }
    }

    fn owned_by(&self, c: &Caller) -> bool {
        self.held
            .as_ref()
            .is_some_and(|h| *h.owner.0 == *c.client && h.owner.1 == c.thread)
    }
}

impl Object for RLock {
    fn type_name(&self) -> &'static str {
        "RLock"
    }

    fn is_mutating(&self, method: &str) -> bool {
        // `acquire` is not recorded: what it took is given back when its connection ends,
        // so a call resent on a new connection must run again rather than replay `true`.
        !matches!(method, "locked" | "is_owned" | "acquire")
    }

    fn apply(&mut self, method: &str, a: &[Value], ctx: &mut Ctx) -> Result<Step, Error> {
        let v = match method {
            "acquire" => {
                let park = acquire_args(method, a, ctx)?;
                let mine = self.owned_by(ctx.caller);
                match &mut self.held {
                    None => {
                        self.held = Some(Held {
                            owner: owner_of(ctx.caller),
                            conn: ctx.caller.conn,
                            count: 1,
                        });
                        granted(&mut self.abandoned)
                    }
                    Some(h) if mine => {
                        h.count = h
                            .count
                            .checked_add(1)
                            .ok_or_else(|| Error::new(ErrorKind::OverflowError, "RLock acquired too many times"))?;
                        h.conn = ctx.caller.conn;
                        Value::Boolean(true)
                    }
                    Some(_) => match park {
                        Some(deadline) => return Ok(self.waiters.park(ctx, deadline, owner_of(ctx.caller))),
                        None => Value::Boolean(false),
                    },
                }
            }
            "release" => {
                args::arity(method, a, 0, 0)?;
                if !self.owned_by(ctx.caller) {
                    return Err(Error::runtime("cannot release un-acquired lock"));
                }
                if let Some(h) = &mut self.held {
                    h.count -= 1;
                    if h.count == 0 {
                        self.hand_over(ctx);
                    }
                }
                Value::Nil
            }
            "locked" => {
                args::arity(method, a, 0, 0)?;
                Value::Boolean(self.held.is_some())
            }
            "is_owned" => {
                args::arity(method, a, 0, 0)?;
                Value::Boolean(self.owned_by(ctx.caller))
            }
            _ => return Err(super::unknown_method("RLock", method)),
        };
        Ok(Step::Reply(v))
    }

    wait_queue_methods!(waiters, timeout: Ok(Value::Boolean(false)), on_disconnect: release_if_owner);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::objects::testing::*;

    fn thread(conn: u64, client: &str, thread: u64) -> Caller {
        Caller {
            conn,
            client: Arc::from(client),
            thread,
        }
    }

    #[test]
    fn reentrant_for_the_owner_only() {
        let mut p = Harness::new();
        p.create_ok("RLock", "r", vec![]);
        let (a, b) = (thread(1, "A", 1), thread(1, "A", 2));
        assert_eq!(p.ok_as(&a, "RLock", "r", "acquire", vec![]), Value::Boolean(true));
        assert_eq!(p.ok_as(&a, "RLock", "r", "acquire", vec![]), Value::Boolean(true));
        assert_eq!(p.ok_as(&a, "RLock", "r", "is_owned", vec![]), Value::Boolean(true));
        // Another thread of the same client is another owner.
        assert_eq!(p.ok_as(&b, "RLock", "r", "is_owned", vec![]), Value::Boolean(false));
        assert_eq!(
            p.ok_as(&b, "RLock", "r", "acquire", vec![false.into()]),
            Value::Boolean(false)
        );
        let e = p.err_as(&b, "RLock", "r", "release", vec![]);
        assert_eq!(
            (e.kind, e.message.as_str()),
            (ErrorKind::RuntimeError, "cannot release un-acquired lock")
        );
        let (tb, _) = p.park_as(&b, "RLock", "r", "acquire", vec![]);
        let (_, out) = p.call(&a, 0, "RLock", "r", "release", vec![]);
        assert_eq!(reply_of(&out, tb), None, "still held once");
        let (_, out) = p.call(&a, 0, "RLock", "r", "release", vec![]);
        assert_eq!(value_of(&out, tb), Value::Boolean(true));
        assert_eq!(p.ok_as(&b, "RLock", "r", "is_owned", vec![]), Value::Boolean(true));
        assert_eq!(
            p.err_as(&a, "RLock", "r", "release", vec![]).kind,
            ErrorKind::RuntimeError
        );
        p.ok_as(&b, "RLock", "r", "release", vec![]);
        assert_eq!(p.ok_as(&b, "RLock", "r", "locked", vec![]), Value::Boolean(false));
        assert_eq!(
            p.err_as(&b, "RLock", "r", "release", vec![]).kind,
            ErrorKind::RuntimeError
        );
    }

    #[test]
    fn timeouts_fifo_and_abandon() {
        let mut p = Harness::new();
        p.create_ok("RLock", "r", vec![]);
        let a = thread(1, "A", 0);
        p.ok_as(&a, "RLock", "r", "acquire", vec![]);
        p.ok_as(&a, "RLock", "r", "acquire", vec![]);
        let (t2, _) = p.park_as(&thread(2, "B", 0), "RLock", "r", "acquire", vec![true.into(), 1.into()]);
        let (t3, _) = p.park_as(&thread(3, "C", 0), "RLock", "r", "acquire", vec![]);
        let (t4, _) = p.park_as(&thread(4, "D", 0), "RLock", "r", "acquire", vec![]);
        assert_eq!(value_of(&p.advance(1.0), t2), Value::Boolean(false));
        // A dies holding it twice: fully released, C gets it abandoned, D waits on.
        let out = p.disconnect(1);
        assert_eq!(value_of(&out, t3), Value::from("abandoned"));
        assert_eq!(reply_of(&out, t4), None);
        let (_, out) = p.call(&thread(3, "C", 0), 0, "RLock", "r", "release", vec![]);
        assert_eq!(value_of(&out, t4), Value::Boolean(true));
        let out = p.disconnect(4);
        assert!(out.is_empty());
        assert_eq!(p.ok_as(&a, "RLock", "r", "acquire", vec![]), Value::from("abandoned"));
        let (t5, _) = p.park_as(&thread(5, "E", 0), "RLock", "r", "acquire", vec![]);
        assert_eq!(error_of(&p.delete("r"), t5).kind, ErrorKind::NotFound);
    }
}
