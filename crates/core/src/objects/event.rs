//! `Event`: `threading.Event`. `set` wakes every parked `wait`.

use crate::object::args;
use crate::{Ctx, Error, Object, Step, Value};

use super::waiters::{wait_queue_methods, WaitQueue};

#[derive(Clone)]
pub struct Event {
    flag: bool,
    waiters: WaitQueue<()>,
}

impl Event {
    pub fn new(a: &[Value]) -> Result<Self, Error> {
        args::arity("Event", a, 0, 0)?;
        Ok(Event {
            flag: false,
            waiters: WaitQueue::default(),
        })
    }
}

impl Object for Event {
    fn type_name(&self) -> &'static str {
        "Event"
    }

    fn is_mutating(&self, method: &str) -> bool {
        matches!(method, "set" | "clear")
    }

    fn apply(&mut self, method: &str, a: &[Value], ctx: &mut Ctx) -> Result<Step, Error> {
        let v = match method {
            "set" => {
                args::arity(method, a, 0, 0)?;
                self.flag = true;
                self.waiters.open_gate(ctx);
                Value::Nil
            }
            "clear" => {
                args::arity(method, a, 0, 0)?;
                self.flag = false;
                Value::Nil
            }
            "is_set" => {
                args::arity(method, a, 0, 0)?;
                Value::Boolean(self.flag)
            }
            "wait" => {
                args::arity(method, a, 0, 1)?;
                let timeout = args::timeout(method, a, 0)?;
                return Ok(self.waiters.wait_gate(self.flag, timeout, ctx));
            }
            _ => return Err(super::unknown_method("Event", method)),
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
    fn set_wakes_all_waiters_in_order() {
        let mut p = Harness::new();
        p.create_ok("Event", "e", vec![]);
        assert_eq!(p.ok("Event", "e", "wait", vec![0.into()]), Value::Boolean(false));
        let t2 = p.park(2, "Event", "e", "wait", vec![]);
        let t3 = p.park(3, "Event", "e", "wait", vec![Value::F64(2.5)]);
        let t4 = p.park(4, "Event", "e", "wait", vec![1.into()]);
        assert_eq!(value_of(&p.advance(1.0), t4), Value::Boolean(false));
        assert!(p.disconnect(2).is_empty());
        let t5 = p.park(5, "Event", "e", "wait", vec![]);
        let (_, out) = p.call(&who(1), 0, "Event", "e", "set", vec![]);
        assert_eq!(value_of(&out, t3), Value::Boolean(true));
        assert_eq!(tokens(&out)[..2], [t3, t5]);
        assert_eq!(reply_of(&out, t2), None);
        assert_eq!(p.ok("Event", "e", "is_set", vec![]), Value::Boolean(true));
        assert_eq!(p.ok("Event", "e", "wait", vec![]), Value::Boolean(true));
        p.ok("Event", "e", "clear", vec![]);
        assert_eq!(p.ok("Event", "e", "is_set", vec![]), Value::Boolean(false));
        assert!(p.advance(10.0).is_empty(), "answered waiters never time out");
    }

    #[test]
    fn errors_and_delete() {
        let mut p = Harness::new();
        p.create_ok("Event", "e", vec![]);
        assert_eq!(
            p.err("Event", "e", "wait", vec![(-1).into()]).kind,
            ErrorKind::ValueError
        );
        assert_eq!(
            p.err("Event", "e", "wait", vec!["soon".into()]).kind,
            ErrorKind::BadArguments
        );
        assert_eq!(p.err("Event", "e", "set", vec![1.into()]).kind, ErrorKind::BadArguments);
        let t = p.park(2, "Event", "e", "wait", vec![]);
        assert_eq!(error_of(&p.delete("e"), t).kind, ErrorKind::NotFound);
        let o = Event::new(&[]).unwrap();
        assert!(!o.is_mutating("wait") && !o.is_mutating("is_set") && o.is_mutating("set"));
    }
}
