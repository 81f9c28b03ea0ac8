//! `CountDownLatch`: Java's latch. `wait` parks until the count reaches zero.

use crate::object::args;
use crate::{Ctx, Error, Object, Step, Value};

use super::waiters::{wait_queue_methods, WaitQueue};

#[derive(Clone)]
pub struct CountDownLatch {
    count: u64,
    waiters: WaitQueue<()>,
}

impl CountDownLatch {
    pub fn new(a: &[Value]) -> Result<Self, Error> {
        args::arity("CountDownLatch", a, 1, 1)?;
        let count = args::int("CountDownLatch", a, 0, "count")?;
        let count = u64::try_from(count).map_err(|_| Error::value("count must be >= 0"))?;
        Ok(CountDownLatch {
            count,
            waiters: WaitQueue::default(),
        })
    }
}

impl Object for CountDownLatch {
    fn type_name(&self) -> &'static str {
        "CountDownLatch"
    }

    fn is_mutating(&self, method: &str) -> bool {
        matches!(method, "count_down")
    }

    fn apply(&mut self, method: &str, a: &[Value], ctx: &mut Ctx) -> Result<Step, Error> {
        let v = match method {
            "count_down" => {
                args::arity(method, a, 0, 0)?;
                if self.count > 0 {
                    self.count -= 1;
                    if self.count == 0 {
                        self.waiters.open_gate(ctx);
                    }
                }
                Value::from(self.count)
            }
            "count" => {
                args::arity(method, a, 0, 0)?;
                Value::from(self.count)
            }
            "wait" => {
                args::arity(method, a, 0, 1)?;
                let timeout = args::timeout(method, a, 0)?;
                return Ok(self.waiters.wait_gate(self.count == 0, timeout, ctx));
            }
            _ => return Err(super::unknown_method("CountDownLatch", method)),
        };
        Ok(Step::Reply(v))
    }

    wait_queue_methods!(waiters, timeout: Ok(Value::Boolean(false)));
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::objects::testing::*;
    use crate::ErrorKind;

    #[test]
    fn opens_at_zero_and_stays_there() {
        let mut p = Harness::new();
        p.create_ok("CountDownLatch", "l", vec![2.into()]);
        let t2 = p.park(2, "CountDownLatch", "l", "wait", vec![]);
        let t3 = p.park(3, "CountDownLatch", "l", "wait", vec![1.into()]);
        let t4 = p.park(4, "CountDownLatch", "l", "wait", vec![]);
        assert_eq!(value_of(&p.advance(1.0), t3), Value::Boolean(false));
        assert_eq!(p.ok("CountDownLatch", "l", "count_down", vec![]), Value::from(1));
        assert_eq!(
            p.ok("CountDownLatch", "l", "wait", vec![0.into()]),
            Value::Boolean(false)
        );
        let (t, out) = p.call(&who(1), 0, "CountDownLatch", "l", "count_down", vec![]);
        assert_eq!(value_of(&out, t), Value::from(0));
        assert_eq!(tokens(&out)[..2], [t2, t4]);
        assert_eq!(value_of(&out, t4), Value::Boolean(true));
        assert_eq!(p.ok("CountDownLatch", "l", "count_down", vec![]), Value::from(0));
        assert_eq!(p.ok("CountDownLatch", "l", "count", vec![]), Value::from(0));
        assert_eq!(p.ok("CountDownLatch", "l", "wait", vec![]), Value::Boolean(true));
    }

    #[test]
    fn errors_disconnect_delete() {
        let mut p = Harness::new();
        assert_eq!(
            p.create_err("CountDownLatch", "l", vec![(-1).into()]).kind,
            ErrorKind::ValueError
        );
        assert_eq!(
            p.create_err("CountDownLatch", "l", vec![]).kind,
            ErrorKind::BadArguments
        );
        p.create_ok("CountDownLatch", "l", vec![1.into()]);
        let t2 = p.park(2, "CountDownLatch", "l", "wait", vec![]);
        let t3 = p.park(3, "CountDownLatch", "l", "wait", vec![]);
        assert!(p.disconnect(2).is_empty());
        let out = p.delete("l");
        assert_eq!(error_of(&out, t3).kind, ErrorKind::NotFound);
        assert_eq!(reply_of(&out, t2), None);
    }
}
