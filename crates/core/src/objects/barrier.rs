//! `Barrier`: a cyclic `threading.Barrier` whose action runs in a client.
//!
//! With `has_action`, the last arrival gets `[0, generation]` instead of `0` and the others
//! stay parked until it reports `action_done(generation, ok)`. Arrivals during that window
//! are queued and enter the next generation in order once it opens. A timeout, an abort, a
//! failed action, or a parked party's connection ending breaks the barrier for everyone.

use std::time::Instant;

use crate::object::args;
use crate::{ConnId, Ctx, Error, ErrorKind, Object, Reply, Step, Token, Value};

#[derive(Clone)]
struct Party {
    token: Token,
    conn: ConnId,
    deadline: Option<Instant>,
    /// The arrival index it will be told: 0 for the first to arrive, as in `threading`.
    index: u64,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Phase {
    Filling,
    /// The last arrival (on connection `runner`) is running the action.
    Action {
        runner: ConnId,
    },
    Broken,
}

#[derive(Clone)]
pub struct Barrier {
    parties: u64,
    has_action: bool,
    timeout: Option<f64>,
    generation: u64,
    phase: Phase,
    /// Parked parties of the current generation.
    waiting: Vec<Party>,
    /// Arrivals while the action runs, for the next generation.
    queued: Vec<Party>,
}

fn broken() -> Error {
    Error::new(ErrorKind::BrokenBarrier, "the barrier is broken")
}

impl Barrier {
    pub fn new(a: &[Value]) -> Result<Self, Error> {
        args::arity("Barrier", a, 1, 3)?;
        let parties = args::int("Barrier", a, 0, "parties")?;
        if parties < 1 {
            return Err(Error::value("parties must be at least 1"));
        }
        Ok(Barrier {
            parties: parties as u64,
            has_action: args::bool_or("Barrier", a, 1, "has_action", false)?,
            timeout: args::timeout("Barrier", a, 2)?,
            generation: 0,
            phase: Phase::Filling,
            waiting: Vec::new(),
            queued: Vec::new(),
        })
    }

    /// One party arrives. `Some(reply)` answers it now; `None` means it is parked.
    fn arrive(&mut self, token: Token, conn: ConnId, deadline: Option<Instant>, ctx: &mut Ctx) -> Option<Reply> {
        let mut party = Party {
            token,
            conn,
            deadline,
            index: 0,
        };
        match self.phase {
            Phase::Broken => Some(Err(broken())),
            Phase::Action { .. } => {
                self.queued.push(party);
                None
            }
            Phase::Filling => {
                party.index = self.waiting.len() as u64;
                if party.index + 1 == self.parties {
                    if self.has_action {
                        self.phase = Phase::Action { runner: conn };
                        let g = self.generation;
                        return Some(Ok(Value::Array(vec![party.index.into(), g.into()])));
                    }
                    self.open(ctx);
                    return Some(Ok(Value::from(party.index)));
                }
                if deadline.is_some_and(|d| d <= ctx.now) {
                    // A zero timeout cannot wait: it times out at once, breaking the barrier.
                    self.break_all(ctx);
                    return Some(Err(broken()));
                }
                self.waiting.push(party);
                None
            }
        }
    }

    /// The generation is complete: release its parties and let queued arrivals in.
    fn open(&mut self, ctx: &mut Ctx) {
        for p in self.waiting.drain(..) {
            ctx.deliver(p.token, Ok(Value::from(p.index)));
        }
        self.generation += 1;
        self.phase = Phase::Filling;
        for p in std::mem::take(&mut self.queued) {
            if let Some(r) = self.arrive(p.token, p.conn, p.deadline, ctx) {
                ctx.deliver(p.token, r);
            }
        }
    }

    /// Answer every parked party with BrokenBarrier.
    fn fail_parked(&mut self, ctx: &mut Ctx) {
        for p in self.waiting.drain(..).chain(self.queued.drain(..)) {
            ctx.deliver(p.token, Err(broken()));
        }
    }

    fn break_all(&mut self, ctx: &mut Ctx) {
        self.phase = Phase::Broken;
        self.fail_parked(ctx);
    }

    fn parked(&self) -> impl Iterator<Item = &Party> {
        self.waiting.iter().chain(self.queued.iter())
    }

    fn info(&self) -> Value {
        let n_waiting = match self.phase {
            Phase::Filling => self.waiting.len(),
            Phase::Action { .. } => self.queued.len(),
            Phase::Broken => 0,
        };
        Value::Map(vec![
            ("parties".into(), self.parties.into()),
            ("n_waiting".into(), (n_waiting as u64).into()),
            ("broken".into(), (self.phase == Phase::Broken).into()),
            ("timeout".into(), self.timeout.map_or(Value::Nil, Value::F64)),
            ("has_action".into(), self.has_action.into()),
        ])
    }
}

impl Object for Barrier {
    fn type_name(&self) -> &'static str {
        "Barrier"
    }

    fn is_mutating(&self, method: &str) -> bool {
        !matches!(method, "info")
    }

    fn apply(&mut self, method: &str, a: &[Value], ctx: &mut Ctx) -> Result<Step, Error> {
        let v = match method {
            "wait" => {
                args::arity(method, a, 0, 1)?;
                let timeout = match args::get(a, 0) {
                    Value::Nil => self.timeout,
                    _ => args::timeout(method, a, 0)?,
                };
                let deadline = ctx.deadline(timeout);
                return match self.arrive(ctx.token, ctx.caller.conn, deadline, ctx) {
                    Some(r) => r.map(Step::Reply),
                    None => Ok(Step::Park { deadline }),
                };
            }
            "action_done" => {
                args::arity(method, a, 2, 2)?;
                let generation = args::int(method, a, 0, "generation")?;
                let ok = args::bool_or(method, a, 1, "ok", false)?;
                // A stale report (the barrier was reset or broke meanwhile) changes nothing.
                if matches!(self.phase, Phase::Action { .. }) && u64::try_from(generation) == Ok(self.generation) {
                    if ok {
                        self.open(ctx);
                    } else {
                        self.break_all(ctx);
                    }
                }
                Value::Nil
            }
            "reset" => {
                args::arity(method, a, 0, 0)?;
                self.fail_parked(ctx);
                self.generation += 1;
                self.phase = Phase::Filling;
                Value::Nil
            }
            "abort" => {
                args::arity(method, a, 0, 0)?;
                self.break_all(ctx);
                Value::Nil
            }
            "info" => {
                args::arity(method, a, 0, 0)?;
                self.info()
            }
            _ => return Err(super::unknown_method("Barrier", method)),
        };
        Ok(Step::Reply(v))
    }

    fn expire(&mut self, waiter: Token, ctx: &mut Ctx) {
        let due = self.parked().any(|p| p.token == waiter && ctx.is_due(p.deadline));
        if due {
            self.break_all(ctx);
        }
    }

    fn disconnect(&mut self, conn: ConnId, ctx: &mut Ctx) {
        // The party can never arrive (or finish the action): nobody may hang on it.
        let runner_died = self.phase == (Phase::Action { runner: conn });
        if runner_died || self.parked().any(|p| p.conn == conn) {
            self.waiting.retain(|p| p.conn != conn);
            self.queued.retain(|p| p.conn != conn);
            self.break_all(ctx);
        }
    }

    fn drain_waiters(&mut self, ctx: &mut Ctx, reply: &Error) {
        for p in self.waiting.drain(..).chain(self.queued.drain(..)) {
            ctx.deliver(p.token, Err(reply.clone()));
        }
    }

    fn has_waiters(&self) -> bool {
        !(self.waiting.is_empty() && self.queued.is_empty())
    }

    fn tracks_connections(&self) -> bool {
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::objects::testing::*;

    fn barrier(args: Vec<Value>) -> Harness {
        let mut p = Harness::new();
        p.create_ok("Barrier", "b", args);
        p
    }

    fn info(p: &mut Harness, field: &str) -> Value {
        match p.ok("Barrier", "b", "info", vec![]) {
            Value::Map(m) => m
                .into_iter()
                .find(|(k, _)| k.as_str() == Some(field))
                .map(|(_, v)| v)
                .unwrap(),
            other => panic!("info is not a map: {other}"),
        }
    }

    #[test]
    fn indexes_and_generations() {
        let mut p = barrier(vec![3.into()]);
        for _ in 0..2 {
            let t1 = p.park(1, "Barrier", "b", "wait", vec![]);
            let t2 = p.park(2, "Barrier", "b", "wait", vec![]);
            assert_eq!(info(&mut p, "n_waiting"), Value::from(2));
            let (t3, out) = p.call(&who(3), 0, "Barrier", "b", "wait", vec![]);
            assert_eq!(value_of(&out, t3), Value::from(2));
            assert_eq!(value_of(&out, t1), Value::from(0));
            assert_eq!(value_of(&out, t2), Value::from(1));
            assert_eq!(info(&mut p, "n_waiting"), Value::from(0));
        }
        assert_eq!(info(&mut p, "broken"), Value::Boolean(false));
        assert_eq!(info(&mut p, "parties"), Value::from(3));
        let mut one = barrier(vec![1.into()]);
        assert_eq!(one.ok("Barrier", "b", "wait", vec![]), Value::from(0));
    }

    #[test]
    fn timeout_breaks_it_for_everyone_until_reset() {
        let mut p = barrier(vec![3.into(), false.into(), 5.into()]);
        assert_eq!(info(&mut p, "timeout"), Value::F64(5.0));
        let t1 = p.park(1, "Barrier", "b", "wait", vec![]);
        let t2 = p.park(2, "Barrier", "b", "wait", vec![1.into()]);
        let out = p.advance(1.0);
        assert_eq!(error_of(&out, t1).kind, ErrorKind::BrokenBarrier);
        assert_eq!(error_of(&out, t2).kind, ErrorKind::BrokenBarrier);
        assert_eq!(info(&mut p, "broken"), Value::Boolean(true));
        assert_eq!(p.err("Barrier", "b", "wait", vec![]).kind, ErrorKind::BrokenBarrier);
        assert!(p.advance(10.0).is_empty(), "t1's own timer finds nothing to do");
        p.ok("Barrier", "b", "reset", vec![]);
        // The default timeout applies when none is given.
        let t3 = p.park(3, "Barrier", "b", "wait", vec![]);
        assert_eq!(error_of(&p.advance(5.0), t3).kind, ErrorKind::BrokenBarrier);
    }

    #[test]
    fn zero_timeout_breaks_at_once_unless_last() {
        let mut p = barrier(vec![2.into()]);
        let t1 = p.park(1, "Barrier", "b", "wait", vec![]);
        assert_eq!(p.ok("Barrier", "b", "wait", vec![0.into()]), Value::from(1));
        let _ = t1;
        let t1 = p.park(1, "Barrier", "b", "wait", vec![]);
        p.ok("Barrier", "b", "reset", vec![]);
        assert_eq!(
            p.err("Barrier", "b", "wait", vec![0.into()]).kind,
            ErrorKind::BrokenBarrier
        );
        let _ = t1;
    }

    #[test]
    fn reset_and_abort() {
        let mut p = barrier(vec![3.into()]);
        let t1 = p.park(1, "Barrier", "b", "wait", vec![]);
        let (t, out) = p.call(&who(2), 0, "Barrier", "b", "reset", vec![]);
        assert_eq!(value_of(&out, t), Value::Nil);
        assert_eq!(error_of(&out, t1).kind, ErrorKind::BrokenBarrier);
        assert_eq!(info(&mut p, "broken"), Value::Boolean(false));
        let t2 = p.park(2, "Barrier", "b", "wait", vec![]);
        let (_, out) = p.call(&who(1), 0, "Barrier", "b", "abort", vec![]);
        assert_eq!(error_of(&out, t2).kind, ErrorKind::BrokenBarrier);
        assert_eq!(p.err("Barrier", "b", "wait", vec![]).kind, ErrorKind::BrokenBarrier);
    }

    #[test]
    fn action_protocol() {
        let mut p = barrier(vec![3.into(), true.into()]);
        let t1 = p.park(1, "Barrier", "b", "wait", vec![]);
        let t2 = p.park(2, "Barrier", "b", "wait", vec![]);
        let (t3, out) = p.call(&who(3), 0, "Barrier", "b", "wait", vec![]);
        assert_eq!(value_of(&out, t3), arr(vec![2.into(), 0.into()]));
        assert_eq!(out.len(), 1, "the others wait for the action");
        // Arrivals during the action go to the next generation.
        let t4 = p.park(4, "Barrier", "b", "wait", vec![]);
        let t5 = p.park(5, "Barrier", "b", "wait", vec![]);
        let t6 = p.park(6, "Barrier", "b", "wait", vec![]);
        assert_eq!(
            p.ok("Barrier", "b", "action_done", vec![7.into(), true.into()]),
            Value::Nil
        );
        let (_, out) = p.call(&who(3), 0, "Barrier", "b", "action_done", vec![0.into(), true.into()]);
        assert_eq!(value_of(&out, t1), Value::from(0));
        assert_eq!(value_of(&out, t2), Value::from(1));
        assert_eq!(value_of(&out, t6), arr(vec![2.into(), 1.into()]));
        assert_eq!(reply_of(&out, t4), None);
        // The action fails: generation 1 breaks.
        let (_, out) = p.call(&who(6), 0, "Barrier", "b", "action_done", vec![1.into(), false.into()]);
        assert_eq!(error_of(&out, t4).kind, ErrorKind::BrokenBarrier);
        assert_eq!(error_of(&out, t5).kind, ErrorKind::BrokenBarrier);
        assert_eq!(p.err("Barrier", "b", "wait", vec![]).kind, ErrorKind::BrokenBarrier);
    }

    #[test]
    fn a_dead_party_breaks_it() {
        let mut p = barrier(vec![3.into()]);
        let t1 = p.park(1, "Barrier", "b", "wait", vec![]);
        let t2 = p.park(2, "Barrier", "b", "wait", vec![]);
        let out = p.disconnect(2);
        assert_eq!(error_of(&out, t1).kind, ErrorKind::BrokenBarrier);
        assert_eq!(reply_of(&out, t2), None);
        assert_eq!(info(&mut p, "broken"), Value::Boolean(true));
        // A connection with nothing parked changes nothing.
        let mut p = barrier(vec![2.into()]);
        p.ok_as(&who(7), "Barrier", "b", "info", vec![]);
        assert!(p.disconnect(7).is_empty());
        assert_eq!(info(&mut p, "broken"), Value::Boolean(false));
    }

    #[test]
    fn a_dead_action_runner_breaks_it() {
        let mut p = barrier(vec![2.into(), true.into()]);
        let t1 = p.park(1, "Barrier", "b", "wait", vec![]);
        p.ok_as(&who(2), "Barrier", "b", "wait", vec![]);
        let out = p.disconnect(2);
        assert_eq!(error_of(&out, t1).kind, ErrorKind::BrokenBarrier);
    }

    #[test]
    fn errors_and_delete() {
        let mut p = Harness::new();
        assert_eq!(p.create_err("Barrier", "b", vec![0.into()]).kind, ErrorKind::ValueError);
        assert_eq!(p.create_err("Barrier", "b", vec![]).kind, ErrorKind::BadArguments);
        assert_eq!(
            p.create_err("Barrier", "b", vec![2.into(), false.into(), (-1).into()])
                .kind,
            ErrorKind::ValueError
        );
        p.create_ok("Barrier", "b", vec![2.into()]);
        assert_eq!(
            p.err("Barrier", "b", "wait", vec![(-1).into()]).kind,
            ErrorKind::ValueError
        );
        assert_eq!(
            p.err("Barrier", "b", "action_done", vec![0.into()]).kind,
            ErrorKind::BadArguments
        );
        let t = p.park(2, "Barrier", "b", "wait", vec![]);
        assert_eq!(error_of(&p.delete("b"), t).kind, ErrorKind::NotFound);
        let o = Barrier::new(&[2.into()]).unwrap();
        assert!(!o.is_mutating("info") && o.is_mutating("wait") && o.is_mutating("action_done"));
    }
}
