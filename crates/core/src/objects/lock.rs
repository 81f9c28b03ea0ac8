//! `Lock`: `threading.Lock` in the server. Waiters queue in arrival order and the lock is
//! handed straight to the oldest one on release, so nobody barges ahead of a parked caller.
//! A holder whose connection dies releases the lock "abandoned": the next acquirer learns
//! the state it protects may be half-updated.

use crate::object::args;
use crate::{ConnId, Ctx, Error, Object, Step, Value};

use super::waiters::{wait_queue_methods, WaitQueue};

#[derive(Clone)]
pub struct Lock {
    /// The connection holding the lock, if locked.
    holder: Option<ConnId>,
    /// The last holder died holding it; the next acquirer hears "abandoned".
    abandoned: bool,
    waiters: WaitQueue<()>,
}

/// Read `acquire([blocking], [timeout])`: `None` means "do not park".
pub(crate) fn acquire_args(method: &str, a: &[Value], ctx: &Ctx) -> Result<Option<Option<std::time::Instant>>, Error> {
    args::arity(method, a, 0, 2)?;
    let blocking = args::bool_or(method, a, 0, "blocking", true)?;
    let timeout = args::timeout(method, a, 1)?;
    if !blocking {
        if timeout.is_some() {
            return Err(Error::value("can't specify a timeout for a non-blocking call"));
        }
        return Ok(None);
    }
    Ok(match timeout {
        Some(0.0) => None,
        t => Some(ctx.deadline(t)),
    })
}

/// What an acquirer is told: `"abandoned"` once after a holder died, `true` otherwise.
pub(crate) fn granted(abandoned: &mut bool) -> Value {
    if std::mem::take(abandoned) {
        Value::from("abandoned")
    } else {
        Value::Boolean(true)
    }
}

impl Lock {
    pub fn new(a: &[Value]) -> Result<Self, Error> {
        args::arity("Lock", a, 0, 0)?;
        Ok(Lock {
            holder: None,
            abandoned: false,
            waiters: WaitQueue::default(),
        })
    }

    /// Release: hand the lock to the oldest waiter, or leave it free.
    fn release(&mut self, ctx: &mut Ctx) {
        match self.waiters.pop() {
            Some(w) => {
                self.holder = Some(w.conn);
                let v = granted(&mut self.abandoned);
                ctx.deliver(w.token, Ok(v));
            }
            None => self.holder = None,
        }
    }

    /// A holder whose connection ended releases the lock "abandoned".
    fn release_if_holder(&mut self, conn: ConnId, ctx: &mut Ctx) {
        if self.holder == Some(conn) {
            self.abandoned = true;
            self.release(ctx);
        }
    }
}

impl Object for Lock {
    fn type_name(&self) -> &'static str {
        "Lock"
    }

    fn is_mutating(&self, method: &str) -> bool {
        // `acquire` is not recorded: what it took is given back when its connection ends,
        // so a call resent on a new connection must run again rather than replay `true`.
        !matches!(method, "locked" | "acquire")
    }

    fn apply(&mut self, method: &str, a: &[Value], ctx: &mut Ctx) -> Result<Step, Error> {
        let v = match method {
            "acquire" => {
                let park = acquire_args(method, a, ctx)?;
                if self.holder.is_none() {
                    self.holder = Some(ctx.caller.conn);
                    granted(&mut self.abandoned)
                } else {
                    match park {
                        Some(deadline) => return Ok(self.waiters.park(ctx, deadline, ())),
                        None => Value::Boolean(false),
                    }
                }
            }
            "release" => {
                args::arity(method, a, 0, 0)?;
                if self.holder.is_none() {
                    return Err(Error::runtime("release unlocked lock"));
                }
                self.release(ctx);
                Value::Nil
            }
            "locked" => {
                args::arity(method, a, 0, 0)?;
                Value::Boolean(self.holder.is_some())
            }
            _ => return Err(super::unknown_method("Lock", method)),
        };
        Ok(Step::Reply(v))
    }

    wait_queue_methods!(waiters, timeout: Ok(Value::Boolean(false)), on_disconnect: release_if_holder);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::objects::testing::*;
    use crate::ErrorKind;

    fn lock() -> Harness {
        let mut p = Harness::new();
        p.create_ok("Lock", "l", vec![]);
        p
    }

    #[test]
    fn acquire_release_and_errors() {
        let mut p = lock();
        assert_eq!(p.ok("Lock", "l", "acquire", vec![]), Value::Boolean(true));
        assert_eq!(p.ok("Lock", "l", "locked", vec![]), Value::Boolean(true));
        assert_eq!(p.ok("Lock", "l", "acquire", vec![false.into()]), Value::Boolean(false));
        assert_eq!(
            p.ok("Lock", "l", "acquire", vec![true.into(), 0.into()]),
            Value::Boolean(false)
        );
        // Any caller may release a Lock.
        assert_eq!(p.ok_as(&who(2), "Lock", "l", "release", vec![]), Value::Nil);
        let e = p.err("Lock", "l", "release", vec![]);
        assert_eq!(
            (e.kind, e.message.as_str()),
            (ErrorKind::RuntimeError, "release unlocked lock")
        );
        assert_eq!(
            p.err("Lock", "l", "acquire", vec![false.into(), 1.into()]).kind,
            ErrorKind::ValueError
        );
        assert_eq!(
            p.err("Lock", "l", "acquire", vec![true.into(), (-1).into()]).kind,
            ErrorKind::ValueError
        );
        assert_eq!(
            p.err("Lock", "l", "acquire", vec![true.into(), Value::F64(f64::NAN)])
                .kind,
            ErrorKind::ValueError
        );
        assert_eq!(
            p.err("Lock", "l", "acquire", vec!["x".into()]).kind,
            ErrorKind::BadArguments
        );
        assert_eq!(
            p.err("Lock", "l", "locked", vec![1.into()]).kind,
            ErrorKind::BadArguments
        );
        assert_eq!(p.create_err("Lock", "m", vec![1.into()]).kind, ErrorKind::BadArguments);
    }

    #[test]
    fn waiters_are_woken_in_arrival_order() {
        let mut p = lock();
        p.ok("Lock", "l", "acquire", vec![]);
        let t2 = p.park(2, "Lock", "l", "acquire", vec![]);
        let t3 = p.park(3, "Lock", "l", "acquire", vec![]);
        let t4 = p.park(4, "Lock", "l", "acquire", vec![true.into(), 10.into()]);
        assert!(p.p.objects("", false).iter().any(|(k, _)| k == "l"));
        let (_, out) = p.call(&who(1), 0, "Lock", "l", "release", vec![]);
        assert_eq!(value_of(&out, t2), Value::Boolean(true));
        assert_eq!(reply_of(&out, t3), None);
        let (_, out) = p.call(&who(2), 0, "Lock", "l", "release", vec![]);
        assert_eq!(tokens(&out)[0], t3);
        let (_, out) = p.call(&who(3), 0, "Lock", "l", "release", vec![]);
        assert_eq!(value_of(&out, t4), Value::Boolean(true));
    }

    #[test]
    fn timeout_answers_false_and_leaves_the_queue() {
        let mut p = lock();
        p.ok("Lock", "l", "acquire", vec![]);
        let t2 = p.park(2, "Lock", "l", "acquire", vec![true.into(), Value::F64(0.5)]);
        let t3 = p.park(3, "Lock", "l", "acquire", vec![]);
        assert!(p.advance(0.4).is_empty());
        let out = p.advance(0.2);
        assert_eq!(value_of(&out, t2), Value::Boolean(false));
        let (_, out) = p.call(&who(1), 0, "Lock", "l", "release", vec![]);
        assert_eq!(value_of(&out, t3), Value::Boolean(true));
        assert!(p.advance(100.0).is_empty());
    }

    #[test]
    fn dead_holder_abandons_the_lock_to_the_next_waiter() {
        let mut p = lock();
        p.ok_as(&who(1), "Lock", "l", "acquire", vec![]);
        let t2 = p.park(2, "Lock", "l", "acquire", vec![]);
        let t3 = p.park(3, "Lock", "l", "acquire", vec![]);
        let out = p.disconnect(1);
        assert_eq!(value_of(&out, t2), Value::from("abandoned"));
        assert_eq!(out.len(), 1);
        // The next hand-over is a normal one.
        let (_, out) = p.call(&who(2), 0, "Lock", "l", "release", vec![]);
        assert_eq!(value_of(&out, t3), Value::Boolean(true));
    }

    #[test]
    fn dead_holder_abandons_the_lock_to_the_next_caller() {
        let mut p = lock();
        p.ok_as(&who(1), "Lock", "l", "acquire", vec![]);
        let t2 = p.park(2, "Lock", "l", "acquire", vec![]);
        // The dead connection's own waiter goes silently; its held lock is released.
        assert!(p.disconnect(2).is_empty());
        assert!(p.disconnect(1).is_empty());
        assert_eq!(p.ok("Lock", "l", "locked", vec![]), Value::Boolean(false));
        assert_eq!(
            p.ok_as(&who(3), "Lock", "l", "acquire", vec![]),
            Value::from("abandoned")
        );
        p.ok_as(&who(3), "Lock", "l", "release", vec![]);
        assert_eq!(p.ok_as(&who(3), "Lock", "l", "acquire", vec![]), Value::Boolean(true));
        let _ = t2;
    }

    #[test]
    fn disconnect_of_a_non_holder_keeps_the_lock() {
        let mut p = lock();
        p.ok_as(&who(1), "Lock", "l", "acquire", vec![]);
        p.ok_as(&who(2), "Lock", "l", "locked", vec![]);
        assert!(p.disconnect(2).is_empty());
        assert_eq!(p.ok("Lock", "l", "locked", vec![]), Value::Boolean(true));
    }

    #[test]
    fn delete_drains_waiters() {
        let mut p = lock();
        p.ok("Lock", "l", "acquire", vec![]);
        let t2 = p.park(2, "Lock", "l", "acquire", vec![]);
        let out = p.delete("l");
        assert_eq!(error_of(&out, t2).kind, ErrorKind::NotFound);
    }
}
