//! `Future`: `concurrent.futures.Future` without the executor. One side sets a result or an
//! exception once; `result`/`exception` park until then.

use crate::object::args;
use crate::value::approx_size;
use crate::{Ctx, Error, ErrorKind, Object, Reply, Step, Value};

use super::waiters::{wait_queue_methods, WaitQueue};

#[derive(Clone)]
enum State {
    Pending,
    Result(Value),
    Exception(Value),
    Cancelled,
}

/// Which method a parked caller called: they are answered differently.
#[derive(Clone, Copy)]
enum Want {
    Result,
    Exception,
}

#[derive(Clone)]
pub struct Future {
    state: State,
    /// The approximate size of the result or exception once set.
    bytes: usize,
    waiters: WaitQueue<Want>,
}

fn future_exception(exc: &Value) -> Error {
    // The SDK sends `[type_name, message, pickled]`; show the first two to humans.
    let message = match exc {
        Value::Array(parts) => match (parts.first(), parts.get(1)) {
            (Some(Value::String(t)), Some(Value::String(m))) => {
                format!("{}: {}", t.as_str().unwrap_or("?"), m.as_str().unwrap_or("?"))
            }
            _ => super::repr(exc),
        },
        _ => super::repr(exc),
    };
    Error::new(ErrorKind::FutureException, message).with_data(exc.clone())
}

fn cancelled() -> Error {
    Error::new(ErrorKind::Cancelled, "the future was cancelled")
}

impl Future {
    pub fn new(a: &[Value]) -> Result<Self, Error> {
        args::arity("Future", a, 0, 0)?;
        Ok(Future {
            state: State::Pending,
            bytes: 0,
            waiters: WaitQueue::default(),
        })
    }

    /// The answer to `want` in the current (finished) state; `None` while pending.
    fn answer(&self, want: Want) -> Option<Reply> {
        Some(match (&self.state, want) {
            (State::Pending, _) => return None,
            (State::Cancelled, _) => Err(cancelled()),
            (State::Result(v), Want::Result) => Ok(v.clone()),
            (State::Result(_), Want::Exception) => Ok(Value::Nil),
            (State::Exception(e), Want::Result) => Err(future_exception(e)),
            (State::Exception(e), Want::Exception) => Ok(e.clone()),
        })
    }

    fn finish(&mut self, state: State, ctx: &mut Ctx) -> Result<(), Error> {
        if !matches!(self.state, State::Pending) {
            return Err(Error::new(ErrorKind::InvalidState, "the future is already done"));
        }
        self.bytes = match &state {
            State::Result(v) | State::Exception(v) => approx_size(v),
            State::Pending | State::Cancelled => 0,
        };
        self.state = state;
        for w in self.waiters.drain() {
            if let Some(r) = self.answer(w.data) {
                ctx.deliver(w.token, r);
            }
        }
        Ok(())
    }

    fn wait(&mut self, method: &str, a: &[Value], want: Want, ctx: &mut Ctx) -> Result<Step, Error> {
        args::arity(method, a, 0, 1)?;
        let timeout = args::timeout(method, a, 0)?;
        match self.answer(want) {
            Some(r) => r.map(Step::Reply),
            None if timeout == Some(0.0) => Err(timed_out()),
            None => Ok(self.waiters.park(ctx, ctx.deadline(timeout), want)),
        }
    }
}

fn timed_out() -> Error {
    Error::new(ErrorKind::Timeout, "the future did not finish in time")
}

impl Object for Future {
    fn type_name(&self) -> &'static str {
        "Future"
    }

    fn is_mutating(&self, method: &str) -> bool {
        matches!(method, "set_result" | "set_exception" | "cancel")
    }

    fn may_grow(&self, method: &str) -> bool {
        matches!(method, "set_result" | "set_exception")
    }

    fn size(&self) -> usize {
        self.bytes
    }

    fn apply(&mut self, method: &str, a: &[Value], ctx: &mut Ctx) -> Result<Step, Error> {
        let v = match method {
            "set_result" => {
                args::arity(method, a, 1, 1)?;
                self.finish(State::Result(a[0].clone()), ctx)?;
                Value::Nil
            }
            "set_exception" => {
                args::arity(method, a, 1, 1)?;
                self.finish(State::Exception(a[0].clone()), ctx)?;
                Value::Nil
            }
            "result" => return self.wait(method, a, Want::Result, ctx),
            "exception" => return self.wait(method, a, Want::Exception, ctx),
            "done" => {
                args::arity(method, a, 0, 0)?;
                Value::Boolean(!matches!(self.state, State::Pending))
            }
            "cancelled" => {
                args::arity(method, a, 0, 0)?;
                Value::Boolean(matches!(self.state, State::Cancelled))
            }
            "running" => {
                // Nothing runs "inside" a bare future: it is pending or done.
                args::arity(method, a, 0, 0)?;
                Value::Boolean(false)
            }
            "cancel" => {
                args::arity(method, a, 0, 0)?;
                match self.state {
                    State::Pending => {
                        self.finish(State::Cancelled, ctx)?;
                        Value::Boolean(true)
                    }
                    // As in concurrent.futures, cancelling twice still reports cancelled.
                    State::Cancelled => Value::Boolean(true),
                    _ => Value::Boolean(false),
                }
            }
            _ => return Err(super::unknown_method("Future", method)),
        };
        Ok(Step::Reply(v))
    }

    wait_queue_methods!(waiters, timeout: Err(timed_out()));
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::objects::testing::*;

    fn fut() -> Harness {
        let mut p = Harness::new();
        p.create_ok("Future", "f", vec![]);
        p
    }

    #[test]
    fn result_wakes_both_kinds_of_waiters() {
        let mut p = fut();
        let t2 = p.park(2, "Future", "f", "result", vec![]);
        let t3 = p.park(3, "Future", "f", "exception", vec![]);
        assert_eq!(p.ok("Future", "f", "done", vec![]), Value::Boolean(false));
        let (_, out) = p.call(&who(1), 0, "Future", "f", "set_result", vec![42.into()]);
        assert_eq!(tokens(&out)[..2], [t2, t3]);
        assert_eq!(value_of(&out, t2), Value::from(42));
        assert_eq!(value_of(&out, t3), Value::Nil);
        assert_eq!(p.ok("Future", "f", "result", vec![0.into()]), Value::from(42));
        assert_eq!(p.ok("Future", "f", "done", vec![]), Value::Boolean(true));
        assert_eq!(p.ok("Future", "f", "running", vec![]), Value::Boolean(false));
        assert_eq!(p.ok("Future", "f", "cancel", vec![]), Value::Boolean(false));
        let e = p.err("Future", "f", "set_result", vec![1.into()]);
        assert_eq!(e.kind, ErrorKind::InvalidState);
        assert_eq!(
            p.err("Future", "f", "set_exception", vec![1.into()]).kind,
            ErrorKind::InvalidState
        );
    }

    #[test]
    fn exception_travels_as_data() {
        let mut p = fut();
        let exc = arr(vec!["ValueError".into(), "bad".into(), Value::Ext(1, vec![1, 2])]);
        let t2 = p.park(2, "Future", "f", "result", vec![]);
        let (_, out) = p.call(&who(1), 0, "Future", "f", "set_exception", vec![exc.clone()]);
        let e = error_of(&out, t2);
        assert_eq!(
            (e.kind, e.data, e.message.as_str()),
            (ErrorKind::FutureException, exc.clone(), "ValueError: bad")
        );
        assert_eq!(p.ok("Future", "f", "exception", vec![]), exc);
        assert_eq!(p.err("Future", "f", "result", vec![]).kind, ErrorKind::FutureException);
    }

    #[test]
    fn timeouts_and_cancel() {
        let mut p = fut();
        assert_eq!(p.err("Future", "f", "result", vec![0.into()]).kind, ErrorKind::Timeout);
        assert_eq!(
            p.err("Future", "f", "exception", vec![0.into()]).kind,
            ErrorKind::Timeout
        );
        let t2 = p.park(2, "Future", "f", "result", vec![1.into()]);
        let t3 = p.park(3, "Future", "f", "exception", vec![2.into()]);
        let t4 = p.park(4, "Future", "f", "result", vec![]);
        assert_eq!(error_of(&p.advance(1.0), t2).kind, ErrorKind::Timeout);
        assert_eq!(error_of(&p.advance(1.0), t3).kind, ErrorKind::Timeout);
        let (t, out) = p.call(&who(1), 0, "Future", "f", "cancel", vec![]);
        assert_eq!(value_of(&out, t), Value::Boolean(true));
        assert_eq!(error_of(&out, t4).kind, ErrorKind::Cancelled);
        assert_eq!(p.ok("Future", "f", "cancel", vec![]), Value::Boolean(true));
        assert_eq!(p.ok("Future", "f", "cancelled", vec![]), Value::Boolean(true));
        assert_eq!(p.err("Future", "f", "result", vec![]).kind, ErrorKind::Cancelled);
        assert_eq!(p.err("Future", "f", "exception", vec![]).kind, ErrorKind::Cancelled);
        assert_eq!(
            p.err("Future", "f", "set_result", vec![1.into()]).kind,
            ErrorKind::InvalidState
        );
    }

    #[test]
    fn disconnect_and_delete() {
        let mut p = fut();
        let t2 = p.park(2, "Future", "f", "result", vec![]);
        let t3 = p.park(3, "Future", "f", "result", vec![]);
        assert!(p.disconnect(2).is_empty());
        let out = p.delete("f");
        assert_eq!(error_of(&out, t3).kind, ErrorKind::NotFound);
        assert_eq!(reply_of(&out, t2), None);
        let o = Future::new(&[]).unwrap();
        assert!(!o.is_mutating("result") && !o.is_mutating("done") && o.is_mutating("cancel"));
    }
}
