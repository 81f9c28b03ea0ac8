//! `Semaphore` and `BoundedSemaphore`: counted permits, handed to parked acquirers in
//! arrival order. Permits are tracked per connection so that a dead connection's permits
//! come back.

use crate::object::args;
use crate::{ConnId, Ctx, Error, ErrorKind, Object, Step, Value};
use ahash::HashMap;

use super::lock::acquire_args;
use super::waiters::{wait_queue_methods, WaitQueue};

#[derive(Clone)]
pub struct Semaphore {
    value: u64,
    initial: u64,
    bounded: bool,
    /// Permits each connection acquired and has not released itself. A release by another
    /// connection (a semaphore used as a signal) does not shrink anyone's holding.
    held: HashMap<ConnId, u64>,
    /// Parked acquirers; `true` for a `keep` acquire, whose permit is not tracked.
    waiters: WaitQueue<bool>,
}

impl Semaphore {
    pub fn new(a: &[Value], bounded: bool) -> Result<Self, Error> {
        let name = if bounded { "BoundedSemaphore" } else { "Semaphore" };
        args::arity(name, a, 0, 1)?;
        let value = args::int_or(name, a, 0, "value", 1)?;
        let value = u64::try_from(value).map_err(|_| Error::value("semaphore initial value must be >= 0"))?;
        Ok(Semaphore {
            value,
            initial: value,
            bounded,
            held: HashMap::default(),
            waiters: WaitQueue::default(),
        })
    }

    fn take(&mut self, conn: ConnId) {
        *self.held.entry(conn).or_default() += 1;
    }

    /// Add `n` permits: parked acquirers take them first, oldest first.
    fn release(&mut self, n: u64, ctx: &mut Ctx) {
        let mut left = n;
        while left > 0 {
            let Some(w) = self.waiters.pop() else { break };
            if !w.data {
                self.take(w.conn);
            }
            ctx.deliver(w.token, Ok(Value::Boolean(true)));
            left -= 1;
        }
        // No waiter is left: the rest of the permits go back in one step.
        self.value = self.value.saturating_add(left);
    }

    /// A connection ended: the permits it still holds come back.
    fn return_permits(&mut self, conn: ConnId, ctx: &mut Ctx) {
        if let Some(mut n) = self.held.remove(&conn) {
            if self.bounded {
                // Signal-style releases by others may already have refilled it.
                n = n.min(self.initial.saturating_sub(self.value));
            }
            self.release(n, ctx);
        }
    }
}

impl Object for Semaphore {
    fn type_name(&self) -> &'static str {
        if self.bounded {
            "BoundedSemaphore"
        } else {
            "Semaphore"
        }
    }

    fn is_mutating(&self, method: &str) -> bool {
        // `acquire` is not recorded: what it took is given back when its connection ends,
        // so a call resent on a new connection must run again rather than replay `true`.
        !matches!(method, "value" | "acquire")
    }

    fn apply(&mut self, method: &str, a: &[Value], ctx: &mut Ctx) -> Result<Step, Error> {
        let v = match method {
            "acquire" => {
                // `keep`: the permit stays taken when this connection ends. A shell's
                // `semaphore acquire` is a process of its own, which exits holding it.
                args::arity(method, a, 0, 3)?;
                let keep = args::bool_or(method, a, 2, "keep", false)?;
                let park = acquire_args(method, &a[..a.len().min(2)], ctx)?;
                if self.value > 0 {
                    self.value -= 1;
                    if !keep {
                        self.take(ctx.caller.conn);
                    }
                    Value::Boolean(true)
                } else {
                    match park {
                        Some(deadline) => return Ok(self.waiters.park(ctx, deadline, keep)),
                        None => Value::Boolean(false),
                    }
                }
            }
            "release" => {
                args::arity(method, a, 0, 1)?;
                let n = args::int_or(method, a, 0, "n", 1)?;
                if n < 1 {
                    return Err(Error::value("n must be one or more"));
                }
                let n = n as u64;
                if self.bounded && n > self.initial.saturating_sub(self.value) {
                    return Err(Error::value("Semaphore released too many times"));
                }
                if self.value.checked_add(n).is_none() {
                    return Err(Error::new(ErrorKind::OverflowError, "Semaphore value overflow"));
                }
                if let Some(h) = self.held.get_mut(&ctx.caller.conn) {
                    *h = h.saturating_sub(n);
                    if *h == 0 {
                        self.held.remove(&ctx.caller.conn);
                    }
                }
                self.release(n, ctx);
                Value::Nil
            }
            "value" => {
                args::arity(method, a, 0, 0)?;
                Value::from(self.value)
            }
            _ => return Err(super::unknown_method(self.type_name(), method)),
        };
        Ok(Step::Reply(v))
    }

    wait_queue_methods!(waiters, timeout: Ok(Value::Boolean(false)), on_disconnect: return_permits);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::objects::testing::*;

    #[test]
    fn counts_permits_and_parks_in_order() {
        let mut p = Harness::new();
        p.create_ok("Semaphore", "s", vec![2.into()]);
        assert_eq!(p.ok("Semaphore", "s", "acquire", vec![]), Value::Boolean(true));
        assert_eq!(p.ok("Semaphore", "s", "acquire", vec![]), Value::Boolean(true));
        assert_eq!(p.ok("Semaphore", "s", "value", vec![]), Value::from(0));
        assert_eq!(
            p.ok("Semaphore", "s", "acquire", vec![false.into()]),
            Value::Boolean(false)
        );
        assert_eq!(
            p.ok("Semaphore", "s", "acquire", vec![true.into(), 0.into()]),
            Value::Boolean(false)
        );
        let t2 = p.park(2, "Semaphore", "s", "acquire", vec![]);
        let t3 = p.park(3, "Semaphore", "s", "acquire", vec![true.into(), 5.into()]);
        let t4 = p.park(4, "Semaphore", "s", "acquire", vec![]);
        assert_eq!(value_of(&p.advance(5.0), t3), Value::Boolean(false));
        let (_, out) = p.call(&who(1), 0, "Semaphore", "s", "release", vec![3.into()]);
        assert_eq!(tokens(&out)[..2], [t2, t4]);
        assert_eq!(value_of(&out, t4), Value::Boolean(true));
        assert_eq!(p.ok("Semaphore", "s", "value", vec![]), Value::from(1));
        // An unbounded semaphore may grow past its initial value.
        p.ok("Semaphore", "s", "release", vec![5.into()]);
        assert_eq!(p.ok("Semaphore", "s", "value", vec![]), Value::from(6));
    }

    #[test]
    fn errors() {
        let mut p = Harness::new();
        assert_eq!(
            p.create_err("Semaphore", "s", vec![(-1).into()]).kind,
            ErrorKind::ValueError
        );
        assert_eq!(
            p.create_err("Semaphore", "s", vec!["x".into()]).kind,
            ErrorKind::BadArguments
        );
        p.create_ok("Semaphore", "s", vec![]);
        assert_eq!(p.ok("Semaphore", "s", "value", vec![]), Value::from(1));
        assert_eq!(
            p.err("Semaphore", "s", "release", vec![0.into()]).kind,
            ErrorKind::ValueError
        );
        assert_eq!(
            p.err("Semaphore", "s", "release", vec![(-3).into()]).kind,
            ErrorKind::ValueError
        );
        p.ok("Semaphore", "s", "release", vec![i64::MAX.into()]);
        p.ok("Semaphore", "s", "release", vec![i64::MAX.into()]);
        let e = p.err("Semaphore", "s", "release", vec![i64::MAX.into()]);
        assert_eq!(e.kind, ErrorKind::OverflowError);
        p.create_ok("BoundedSemaphore", "b", vec![2.into()]);
        p.ok("BoundedSemaphore", "b", "acquire", vec![]);
        let e = p.err("BoundedSemaphore", "b", "release", vec![2.into()]);
        assert_eq!(
            (e.kind, e.message.as_str()),
            (ErrorKind::ValueError, "Semaphore released too many times")
        );
        p.ok("BoundedSemaphore", "b", "release", vec![]);
        assert_eq!(
            p.err("BoundedSemaphore", "b", "release", vec![]).kind,
            ErrorKind::ValueError
        );
        let e = p.err("Semaphore", "b", "value", vec![]);
        assert_eq!(e.message, "'b' is a BoundedSemaphore, not a Semaphore");
    }

    #[test]
    fn dead_connection_returns_its_permits() {
        let mut p = Harness::new();
        p.create_ok("BoundedSemaphore", "s", vec![2.into()]);
        p.ok_as(&who(1), "BoundedSemaphore", "s", "acquire", vec![]);
        p.ok_as(&who(1), "BoundedSemaphore", "s", "acquire", vec![]);
        let t2 = p.park(2, "BoundedSemaphore", "s", "acquire", vec![]);
        let t3 = p.park(3, "BoundedSemaphore", "s", "acquire", vec![]);
        let t4 = p.park(4, "BoundedSemaphore", "s", "acquire", vec![]);
        assert!(p.disconnect(3).is_empty());
        let out = p.disconnect(1);
        assert_eq!(
            value_of(&out, t2),
            Value::Boolean(true),
            "a semaphore never says abandoned"
        );
        assert_eq!(value_of(&out, t4), Value::Boolean(true));
        assert_eq!(out.len(), 2);
        // Conn 2 now holds one: its death gives it back.
        p.disconnect(2);
        assert_eq!(p.ok("BoundedSemaphore", "s", "value", vec![]), Value::from(1));
        let _ = t3;
    }

    #[test]
    fn a_kept_permit_outlives_its_connection() {
        let mut p = Harness::new();
        p.create_ok("Semaphore", "s", vec![1.into()]);
        let keep = || vec![true.into(), Value::Nil, true.into()];
        assert_eq!(
            p.ok_as(&who(1), "Semaphore", "s", "acquire", keep()),
            Value::Boolean(true)
        );
        let t2 = p.park(2, "Semaphore", "s", "acquire", keep());
        p.disconnect(1);
        assert_eq!(p.ok("Semaphore", "s", "value", vec![]), Value::from(0));
        let (_, out) = p.call(&who(3), 0, "Semaphore", "s", "release", vec![]);
        assert_eq!(value_of(&out, t2), Value::Boolean(true));
        p.disconnect(2);
        assert_eq!(p.ok("Semaphore", "s", "value", vec![]), Value::from(0));
        p.ok_as(&who(3), "Semaphore", "s", "release", vec![]);
        assert_eq!(p.ok("Semaphore", "s", "value", vec![]), Value::from(1));
    }

    #[test]
    fn signal_releases_never_exceed_the_bound_on_disconnect() {
        let mut p = Harness::new();
        p.create_ok("BoundedSemaphore", "s", vec![1.into()]);
        p.ok_as(&who(1), "BoundedSemaphore", "s", "acquire", vec![]);
        p.ok_as(&who(2), "BoundedSemaphore", "s", "release", vec![]);
        p.disconnect(1);
        assert_eq!(p.ok("BoundedSemaphore", "s", "value", vec![]), Value::from(1));
    }

    #[test]
    fn delete_drains() {
        let mut p = Harness::new();
        p.create_ok("Semaphore", "s", vec![0.into()]);
        let t = p.park(2, "Semaphore", "s", "acquire", vec![]);
        assert!(p.p.detach("Semaphore", "s").is_err_and(|e| e.kind == ErrorKind::Busy));
        assert_eq!(error_of(&p.delete("s"), t).kind, ErrorKind::NotFound);
    }
}
