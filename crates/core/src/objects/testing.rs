//! Test harness: drives objects through a real `Partition` with synthetic callers and time.

use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::op::Op;
use crate::{Caller, Ctx, Delivery, Error, Object, Partition, Reply, Step, Token, Value};

pub fn arr(items: Vec<Value>) -> Value {
    Value::Array(items)
}

/// A caller on connection `conn`, session `c<conn>`, thread 0.
pub fn who(conn: u64) -> Caller {
    Caller {
        conn,
        client: Arc::from(format!("c{conn}")),
        thread: 0,
    }
}

pub struct Harness {
    pub p: Partition,
    pub now: Instant,
    next_req: u64,
}

impl Default for Harness {
    fn default() -> Self {
        Self::new()
    }
}

impl Harness {
    pub fn new() -> Self {
        Harness {
            p: Partition::new(),
            now: Instant::now(),
            next_req: 0,
        }
    }

    pub fn token(&mut self, conn: u64) -> Token {
        self.next_req += 1;
        Token {
            conn,
            req: self.next_req,
        }
    }

    /// Send one call; returns its token and everything delivered.
    pub fn call(
        &mut self,
        caller: &Caller,
        seq: u64,
        type_name: &str,
        key: &str,
        method: &str,
        args: Vec<Value>,
    ) -> (Token, Vec<Delivery>) {
        let token = self.token(caller.conn);
        let op = Op::Call {
            type_name: type_name.into(),
            key: key.into(),
            method: method.into(),
            args,
            nested: None,
        };
        let out = self.p.apply(caller, token, seq, 0, op, self.now);
        (token, out)
    }

    /// Call as connection 1 and return the immediate reply (panics if it parked).
    pub fn reply(&mut self, type_name: &str, key: &str, method: &str, args: Vec<Value>) -> Reply {
        self.reply_as(&who(1), type_name, key, method, args)
    }

    pub fn reply_as(&mut self, caller: &Caller, type_name: &str, key: &str, method: &str, args: Vec<Value>) -> Reply {
        let (token, out) = self.call(caller, 0, type_name, key, method, args);
        reply_of(&out, token).unwrap_or_else(|| panic!("{method} parked; expected an immediate reply"))
    }

    pub fn ok(&mut self, type_name: &str, key: &str, method: &str, args: Vec<Value>) -> Value {
        self.reply(type_name, key, method, args)
            .unwrap_or_else(|e| panic!("{method} failed: {e}"))
    }

    pub fn ok_as(&mut self, caller: &Caller, type_name: &str, key: &str, method: &str, args: Vec<Value>) -> Value {
        self.reply_as(caller, type_name, key, method, args)
            .unwrap_or_else(|e| panic!("{method} failed: {e}"))
    }

    pub fn err(&mut self, type_name: &str, key: &str, method: &str, args: Vec<Value>) -> Error {
        match self.reply(type_name, key, method, args) {
            Ok(v) => panic!("{method} returned {v}; expected an error"),
            Err(e) => e,
        }
    }

    pub fn err_as(&mut self, caller: &Caller, type_name: &str, key: &str, method: &str, args: Vec<Value>) -> Error {
        match self.reply_as(caller, type_name, key, method, args) {
            Ok(v) => panic!("{method} returned {v}; expected an error"),
            Err(e) => e,
        }
    }

    /// Call and assert it parked (no reply for it); returns its token and other deliveries.
    pub fn park_as(
        &mut self,
        caller: &Caller,
        type_name: &str,
        key: &str,
        method: &str,
        args: Vec<Value>,
    ) -> (Token, Vec<Delivery>) {
        let (token, out) = self.call(caller, 0, type_name, key, method, args);
        assert!(reply_of(&out, token).is_none(), "{method} answered at once: {out:?}");
        (token, out)
    }

    pub fn park(&mut self, conn: u64, type_name: &str, key: &str, method: &str, args: Vec<Value>) -> Token {
        self.park_as(&who(conn), type_name, key, method, args).0
    }

    pub fn create(&mut self, type_name: &str, key: &str, args: Vec<Value>) -> Reply {
        let caller = who(1);
        let token = self.token(1);
        let op = Op::Create {
            type_name: type_name.into(),
            key: key.into(),
            args,
            owned: false,
            persistent: false,
        };
        let out = self.p.apply(&caller, token, 0, 0, op, self.now);
        reply_of(&out, token).expect("create always answers")
    }

    pub fn create_ok(&mut self, type_name: &str, key: &str, args: Vec<Value>) {
        assert_eq!(self.create(type_name, key, args), Ok(Value::Boolean(true)));
    }

    pub fn create_err(&mut self, type_name: &str, key: &str, args: Vec<Value>) -> Error {
        self.create(type_name, key, args).expect_err("constructor should fail")
    }

    pub fn delete(&mut self, key: &str) -> Vec<Delivery> {
        let token = self.token(1);
        self.p
            .apply(&who(1), token, 0, 0, Op::Delete { key: key.into() }, self.now)
    }

    /// Move the clock forward and fire due timers.
    pub fn advance(&mut self, secs: f64) -> Vec<Delivery> {
        self.now += Duration::from_secs_f64(secs);
        self.p.tick(self.now)
    }

    pub fn withdraw(&mut self, token: Token, key: &str) -> Vec<Delivery> {
        self.p.withdraw(token, key, self.now)
    }

    pub fn disconnect(&mut self, conn: u64) -> Vec<Delivery> {
        self.p.disconnect(conn, self.now)
    }
}

/// One bare object driven without a partition, for tests that need the object itself
/// (its snapshot). Calls that park get no reply here; timers are not run.
pub struct Solo {
    pub obj: Box<dyn Object>,
    pub now: Instant,
    next_req: u64,
}

impl Solo {
    pub fn new(obj: Box<dyn Object>) -> Self {
        Solo {
            obj,
            now: Instant::now(),
            next_req: 0,
        }
    }

    /// Call as connection `conn`: the call's immediate reply (if any) and every wake-up, in
    /// order. Two `Solo`s given the same calls number their tokens alike.
    pub fn call(&mut self, conn: u64, method: &str, args: &[Value]) -> Vec<Delivery> {
        self.next_req += 1;
        let token = Token {
            conn,
            req: self.next_req,
        };
        let caller = who(conn);
        let mut out = Vec::new();
        let mut ctx = Ctx::new(&caller, token, self.now, &mut out);
        let reply = match self.obj.apply(method, args, &mut ctx) {
            Ok(Step::Reply(v)) => Some(Ok(v)),
            Ok(Step::Park { .. }) => None,
            Err(e) => Some(Err(e)),
        };
        if let Some(reply) = reply {
            out.insert(0, Delivery { token, reply });
        }
        out
    }

    pub fn ok(&mut self, method: &str, args: &[Value]) -> Value {
        let out = self.call(1, method, args);
        let token = Token {
            conn: 1,
            req: self.next_req,
        };
        value_of(&out, token)
    }
}

pub fn reply_of(out: &[Delivery], token: Token) -> Option<Reply> {
    let mut hits = out.iter().filter(|d| d.token == token);
    let first = hits.next().map(|d| d.reply.clone());
    assert!(hits.next().is_none(), "token {token:?} answered twice: {out:?}");
    first
}

/// The successful value delivered to `token` (panics if none or an error).
pub fn value_of(out: &[Delivery], token: Token) -> Value {
    match reply_of(out, token) {
        Some(Ok(v)) => v,
        other => panic!("expected a value for {token:?}, got {other:?} in {out:?}"),
    }
}

pub fn error_of(out: &[Delivery], token: Token) -> Error {
    match reply_of(out, token) {
        Some(Err(e)) => e,
        other => panic!("expected an error for {token:?}, got {other:?} in {out:?}"),
    }
}

/// The tokens answered, in delivery order.
pub fn tokens(out: &[Delivery]) -> Vec<Token> {
    out.iter().map(|d| d.token).collect()
}

/// A fixed-seed xorshift generator for randomized tests (no proptest in this workspace).
pub struct Rng(pub u64);

impl Rng {
    pub fn below(&mut self, n: usize) -> usize {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        (self.0 % n as u64) as usize
    }

    pub fn int(&mut self, lo: i64, hi: i64) -> i64 {
        lo + self.below((hi - lo + 1) as usize) as i64
    }

    pub fn pick<T: Clone>(&mut self, xs: &[T]) -> T {
        xs[self.below(xs.len())].clone()
    }
}
