//! `Condition`: a condition variable whose lock is another object the clients acquire and
//! release themselves. The server keeps the queue of wait tickets: `register` while holding
//! the lock (Python's "append to waiters"), release the lock, then `wait(ticket)`. A ticket
//! notified before its `wait` arrives is remembered, so no notification slips between the
//! release and the wait.

use ahash::HashMap;
use std::collections::{BTreeMap, BTreeSet};
use std::time::Instant;

use crate::object::args;
use crate::{ConnId, Ctx, Error, Object, Step, Token, Value};

#[derive(Clone)]
struct Ticket {
    conn: ConnId,
    notified: bool,
    /// The parked `wait` call, if it arrived.
    waiter: Option<Token>,
}

#[derive(Clone)]
pub struct Condition {
    lock_type: String,
    lock_key: String,
    next: u64,
    tickets: BTreeMap<u64, Ticket>,
    /// Tickets not notified yet, oldest first: the ones `notify` picks.
    pending: BTreeSet<u64>,
    parked: HashMap<Token, (u64, Option<Instant>)>,
}

impl Condition {
    pub fn new(a: &[Value]) -> Result<Self, Error> {
        args::arity("Condition", a, 2, 2)?;
        Ok(Condition {
            lock_type: args::str("Condition", a, 0, "lock_type")?.to_string(),
            lock_key: args::str("Condition", a, 1, "lock_key")?.to_string(),
            next: 0,
            tickets: BTreeMap::new(),
            pending: BTreeSet::new(),
            parked: HashMap::default(),
        })
    }

    fn ticket(&self, method: &str, a: &[Value]) -> Result<u64, Error> {
        let t = args::int(method, a, 0, "ticket")?;
        match u64::try_from(t) {
            Ok(t) if t >= 1 && t <= self.next => Ok(t),
            _ => Err(Error::value(format!("{method}(): unknown ticket {t}"))),
        }
    }

    /// Mark up to `n` of the oldest pending tickets notified; returns how many.
    fn notify(&mut self, n: u64, ctx: &mut Ctx) -> u64 {
        let mut done = 0;
        while done < n {
            let Some(t) = self.pending.pop_first() else { break };
            done += 1;
            let Some(ticket) = self.tickets.get_mut(&t) else {
                continue;
            };
            match ticket.waiter {
                Some(token) => {
                    self.tickets.remove(&t);
                    self.parked.remove(&token);
                    ctx.deliver(token, Ok(Value::Boolean(true)));
                }
                None => ticket.notified = true,
            }
        }
        done
    }

    /// Withdraw a ticket; its parked `wait`, if any, is answered `false`.
    fn withdraw(&mut self, t: u64, ctx: &mut Ctx) {
        self.pending.remove(&t);
        if let Some(Ticket {
            waiter: Some(token), ..
        }) = self.tickets.remove(&t)
        {
            self.parked.remove(&token);
            ctx.deliver(token, Ok(Value::Boolean(false)));
        }
    }

    fn wait(&mut self, method: &str, a: &[Value], ctx: &mut Ctx) -> Result<Step, Error> {
        args::arity(method, a, 1, 2)?;
        let t = self.ticket(method, a)?;
        let timeout = args::timeout(method, a, 1)?;
        let Some(ticket) = self.tickets.get_mut(&t) else {
            // Issued but gone: consumed by an earlier wait, or dropped with a dead connection
            // before this retry. Condition waits may wake spuriously; callers recheck.
            return Ok(Step::Reply(Value::Boolean(true)));
        };
        if ticket.notified {
            self.tickets.remove(&t);
            return Ok(Step::Reply(Value::Boolean(true)));
        }
        if ticket.waiter.is_some() {
            return Err(Error::runtime(format!("ticket {t} is already being waited on")));
        }
        if timeout == Some(0.0) {
            self.tickets.remove(&t);
            self.pending.remove(&t);
            return Ok(Step::Reply(Value::Boolean(false)));
        }
        let deadline = ctx.deadline(timeout);
        ticket.waiter = Some(ctx.token);
        ticket.conn = ctx.caller.conn;
        self.parked.insert(ctx.token, (t, deadline));
        Ok(Step::Park { deadline })
    }
}

impl Object for Condition {
    fn type_name(&self) -> &'static str {
        "Condition"
    }

    fn is_mutating(&self, method: &str) -> bool {
        !matches!(method, "lock")
    }

    fn apply(&mut self, method: &str, a: &[Value], ctx: &mut Ctx) -> Result<Step, Error> {
        let v = match method {
            "lock" => {
                args::arity(method, a, 0, 0)?;
                Value::Array(vec![self.lock_type.as_str().into(), self.lock_key.as_str().into()])
            }
            "register" => {
                args::arity(method, a, 0, 0)?;
                self.next += 1;
                self.tickets.insert(
                    self.next,
                    Ticket {
                        conn: ctx.caller.conn,
                        notified: false,
                        waiter: None,
                    },
                );
                self.pending.insert(self.next);
                Value::from(self.next)
            }
            "wait" => return self.wait(method, a, ctx),
            "notify" => {
                args::arity(method, a, 0, 1)?;
                // Like threading.Condition, n <= 0 notifies nobody.
                let n = args::int_or(method, a, 0, "n", 1)?.max(0) as u64;
                Value::from(self.notify(n, ctx))
            }
            "notify_all" => {
                args::arity(method, a, 0, 0)?;
                Value::from(self.notify(u64::MAX, ctx))
            }
            "cancel" => {
                args::arity(method, a, 1, 1)?;
                let t = self.ticket(method, a)?;
                self.withdraw(t, ctx);
                Value::Nil
            }
            _ => return Err(super::unknown_method("Condition", method)),
        };
        Ok(Step::Reply(v))
    }

    fn expire(&mut self, waiter: Token, ctx: &mut Ctx) {
        if let Some(&(t, deadline)) = self.parked.get(&waiter) {
            if ctx.is_due(deadline) {
                self.withdraw(t, ctx);
            }
        }
    }

    fn disconnect(&mut self, conn: ConnId, ctx: &mut Ctx) {
        let dead: Vec<u64> = self
            .tickets
            .iter()
            .filter(|(_, tk)| tk.conn == conn)
            .map(|(t, _)| *t)
            .collect();
        let mut lost = 0;
        for t in dead {
            self.pending.remove(&t);
            if let Some(tk) = self.tickets.remove(&t) {
                if let Some(token) = tk.waiter {
                    self.parked.remove(&token);
                }
                lost += u64::from(tk.notified);
            }
        }
        // A notification taken by a dead party would be lost for good; pass it on.
        self.notify(lost, ctx);
    }

    fn drain_waiters(&mut self, ctx: &mut Ctx, reply: &Error) {
        let mut parked: Vec<(u64, Token)> = self.parked.drain().map(|(token, (t, _))| (t, token)).collect();
        parked.sort();
        for (t, token) in parked {
            self.tickets.remove(&t);
            self.pending.remove(&t);
            ctx.deliver(token, Err(reply.clone()));
        }
    }

    fn has_waiters(&self) -> bool {
        !self.parked.is_empty()
    }

    fn tracks_connections(&self) -> bool {
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::objects::testing::*;
    use crate::ErrorKind;

    fn cond() -> Harness {
        let mut p = Harness::new();
        p.create_ok("Condition", "c", vec!["RLock".into(), "r".into()]);
        p
    }

    fn register(p: &mut Harness, conn: u64) -> Value {
        p.ok_as(&who(conn), "Condition", "c", "register", vec![])
    }

    #[test]
    fn notify_wakes_oldest_tickets_first() {
        let mut p = cond();
        assert_eq!(
            p.ok("Condition", "c", "lock", vec![]),
            arr(vec!["RLock".into(), "r".into()])
        );
        let k2 = register(&mut p, 2);
        let k3 = register(&mut p, 3);
        let k4 = register(&mut p, 4);
        let t2 = p.park(2, "Condition", "c", "wait", vec![k2]);
        let t3 = p.park(3, "Condition", "c", "wait", vec![k3]);
        let (t, out) = p.call(&who(1), 0, "Condition", "c", "notify", vec![]);
        assert_eq!(value_of(&out, t), Value::from(1));
        assert_eq!(value_of(&out, t2), Value::Boolean(true));
        assert_eq!(reply_of(&out, t3), None);
        // Ticket 4 has not waited yet: it is notified now and returns at once later.
        let (t, out) = p.call(&who(1), 0, "Condition", "c", "notify", vec![5.into()]);
        assert_eq!(value_of(&out, t), Value::from(2));
        assert_eq!(value_of(&out, t3), Value::Boolean(true));
        assert_eq!(
            p.ok_as(&who(4), "Condition", "c", "wait", vec![k4]),
            Value::Boolean(true)
        );
        assert_eq!(p.ok("Condition", "c", "notify_all", vec![]), Value::from(0));
        assert_eq!(p.ok("Condition", "c", "notify", vec![(-1).into()]), Value::from(0));
    }

    #[test]
    fn timeout_withdraws_the_ticket() {
        let mut p = cond();
        let k2 = register(&mut p, 2);
        let k3 = register(&mut p, 3);
        let t2 = p.park(2, "Condition", "c", "wait", vec![k2, 1.into()]);
        assert_eq!(value_of(&p.advance(1.0), t2), Value::Boolean(false));
        // The withdrawn ticket no longer eats a notification.
        let t3 = p.park(3, "Condition", "c", "wait", vec![k3.clone()]);
        let (_, out) = p.call(&who(1), 0, "Condition", "c", "notify", vec![]);
        assert_eq!(value_of(&out, t3), Value::Boolean(true));
        let k = register(&mut p, 2);
        assert_eq!(p.ok("Condition", "c", "wait", vec![k, 0.into()]), Value::Boolean(false));
        assert_eq!(p.ok("Condition", "c", "notify", vec![]), Value::from(0));
    }

    #[test]
    fn cancel_and_disconnect_drop_tickets() {
        let mut p = cond();
        let k2 = register(&mut p, 2);
        let k3 = register(&mut p, 3);
        let k4 = register(&mut p, 4);
        let t4 = p.park(4, "Condition", "c", "wait", vec![k4.clone()]);
        p.ok("Condition", "c", "cancel", vec![k2]);
        let (_, _) = p.park_as(&who(3), "Condition", "c", "wait", vec![k3]);
        assert!(p.disconnect(3).is_empty());
        let (_, out) = p.call(&who(1), 0, "Condition", "c", "notify", vec![]);
        assert_eq!(value_of(&out, t4), Value::Boolean(true));
        // Cancelling a consumed ticket is a no-op; cancelling a parked one answers it false.
        p.ok("Condition", "c", "cancel", vec![k4]);
        let k5 = register(&mut p, 5);
        let t = p.park(5, "Condition", "c", "wait", vec![k5.clone()]);
        let (_, out) = p.call(&who(1), 0, "Condition", "c", "cancel", vec![k5]);
        assert_eq!(value_of(&out, t), Value::Boolean(false));
        assert_eq!(p.ok("Condition", "c", "notify_all", vec![]), Value::from(0));
    }

    #[test]
    fn notification_of_a_dead_party_passes_on() {
        let mut p = cond();
        let _k2 = register(&mut p, 2);
        let k3 = register(&mut p, 3);
        p.ok("Condition", "c", "notify", vec![]);
        let t3 = p.park(3, "Condition", "c", "wait", vec![k3]);
        let out = p.disconnect(2);
        assert_eq!(value_of(&out, t3), Value::Boolean(true));
    }

    #[test]
    fn errors_and_delete() {
        let mut p = cond();
        assert_eq!(p.create_err("Condition", "d", vec![]).kind, ErrorKind::BadArguments);
        assert_eq!(
            p.create_err("Condition", "d", vec![1.into(), "x".into()]).kind,
            ErrorKind::BadArguments
        );
        assert_eq!(
            p.err("Condition", "c", "wait", vec![1.into()]).kind,
            ErrorKind::ValueError
        );
        assert_eq!(p.err("Condition", "c", "wait", vec![]).kind, ErrorKind::BadArguments);
        let k = register(&mut p, 2);
        assert_eq!(
            p.err("Condition", "c", "wait", vec![k.clone(), (-1).into()]).kind,
            ErrorKind::ValueError
        );
        let t = p.park(2, "Condition", "c", "wait", vec![k.clone()]);
        assert_eq!(
            p.err("Condition", "c", "wait", vec![k.clone()]).kind,
            ErrorKind::RuntimeError
        );
        assert_eq!(
            p.err("Condition", "c", "cancel", vec![0.into()]).kind,
            ErrorKind::ValueError
        );
        assert_eq!(error_of(&p.delete("c"), t).kind, ErrorKind::NotFound);
    }
}
