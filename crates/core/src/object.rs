//! The contract every object type keeps: `apply(call) -> reply | park`, waking parked
//! callers through [`Ctx::deliver`]. No I/O, no clock: `now` arrives in the context.

use std::time::{Duration, Instant};

use crate::{Caller, ConnId, Delivery, Error, Reply, Token, Value};

/// What a call did right away.
#[derive(Debug, PartialEq)]
pub enum Step {
    /// Answer the caller now.
    Reply(Value),
    /// The object stored the caller's token as a waiter; it will be answered later through
    /// [`Ctx::deliver`], or by [`Object::expire`] once `deadline` passes (`None`: never).
    Park { deadline: Option<Instant> },
}

/// Everything a method may look at or produce besides its own state.
pub struct Ctx<'a> {
    pub caller: &'a Caller,
    pub token: Token,
    pub now: Instant,
    /// Set while [`Object::expire`] runs for a call its caller withdrew: the call is due now,
    /// whatever its deadline.
    pub withdrawing: bool,
    /// Set when the caller may only read the object: a method that would change it fails
    /// instead (compiled objects, whose reads are known only once a method ran; a built-in's
    /// are known ahead, see `objects::is_read`).
    pub read_only: bool,
    /// The replies of the calls to other objects a compiled method made, as far as the
    /// server's driver of nested calls ran them (see [`ErrorKind::NestedCall`](crate::ErrorKind)).
    pub nested: &'a [crate::Reply],
    deliveries: &'a mut Vec<Delivery>,
}

impl<'a> Ctx<'a> {
    pub fn new(caller: &'a Caller, token: Token, now: Instant, deliveries: &'a mut Vec<Delivery>) -> Self {
        Ctx {
            caller,
            token,
            now,
            withdrawing: false,
            read_only: false,
            nested: &[],
            deliveries,
        }
    }

    /// Whether a parked call with this deadline should be answered by [`Object::expire`] now.
    pub fn is_due(&self, deadline: Option<Instant>) -> bool {
        self.withdrawing || deadline.is_some_and(|d| d <= self.now)
    }

    /// Answer a parked call (a waiter woken by this call, or by a timeout).
    pub fn deliver(&mut self, token: Token, reply: Reply) {
        self.deliveries.push(Delivery { token, reply });
    }

    /// Turn a `timeout` argument (nil = forever, seconds otherwise) into a deadline.
    pub fn deadline(&self, timeout: Option<f64>) -> Option<Instant> {
        timeout.map(|t| self.now + Duration::from_secs_f64(t))
    }
}

/// A copy of an object, for a transaction's workspace: the transaction's calls run on it,
/// and the object itself changes only when the transaction commits. Every object type has
/// it through `Clone`.
pub trait Fork {
    fn fork(&self) -> Box<dyn Object>;
}

impl<T: Object + Clone + 'static> Fork for T {
    fn fork(&self) -> Box<dyn Object> {
        Box::new(self.clone())
    }
}

/// A shared object living in one partition.
pub trait Object: Send + Fork {
    /// The type name clients use: `"Counter"`, `"Queue"`, ...
    fn type_name(&self) -> &str;

    /// Run one method. Unknown methods return `ErrorKind::UnknownMethod`.
    fn apply(&mut self, method: &str, args: &[Value], ctx: &mut Ctx) -> Result<Step, Error>;

    /// Whether a method may change state. Replies of mutating calls are recorded so that a
    /// retried call (same client and seq) gets the recorded reply instead of a second run.
    fn is_mutating(&self, method: &str) -> bool;

    /// Whether a method may make the object hold more bytes (Redis's `denyoom` flag): such
    /// calls are refused while the server is over `--max-memory`. Methods that only shrink
    /// (pops, removes, clear) stay allowed, so a full server can be emptied.
    fn may_grow(&self, method: &str) -> bool {
        self.is_mutating(method)
    }

    /// Approximately how many bytes the object holds, for `--max-memory`. O(1): containers
    /// keep a running total as they change.
    fn size(&self) -> usize {
        0
    }

    /// Whether the object is a cache (a `Dict` created with `max_memory`): the partition
    /// lets it [`evict`](Object::evict) before refusing calls over `--max-memory`.
    fn is_cache(&self) -> bool {
        false
    }

    /// A cache lets its least recently used entries go until it holds `bytes` less (or
    /// nothing), and says how many bytes it freed. Other objects never evict: 0.
    fn evict(&mut self, _bytes: usize) -> usize {
        0
    }

    /// A parked call is due: its deadline passed, or its caller withdrew it (`ctx.withdrawing`;
    /// test with [`Ctx::is_due`]). If `waiter` is still parked here, answer it (through
    /// `ctx.deliver`) with the method's timeout result; if it was answered already, do nothing.
    fn expire(&mut self, _waiter: Token, _ctx: &mut Ctx) {}

    /// A connection ended: forget its parked calls (no reply is needed, nobody listens) and
    /// release what it holds, waking whoever may now proceed.
    fn disconnect(&mut self, _conn: ConnId, _ctx: &mut Ctx) {}

    /// The object is being deleted: answer every parked call with `reply`.
    fn drain_waiters(&mut self, _ctx: &mut Ctx, _reply: &Error) {}

    /// Whether calls are parked on this object (a parked object cannot be moved by `keep`).
    fn has_waiters(&self) -> bool {
        false
    }

    /// The object's complete durable state, in the format of [`crate::objects::snapshot`]
    /// (`objects::restore` is the inverse), or `None` for a type that is ephemeral by nature
    /// (locks, events, futures...: their state is who holds and who waits, which belongs to
    /// live connections). Parked calls are never part of a snapshot.
    fn snapshot(&self) -> Option<Value> {
        None
    }

    /// Whether the object cares about connections ending (parks callers or has owners), so
    /// the partition calls [`Object::disconnect`] on it when one of its callers goes away.
    fn tracks_connections(&self) -> bool {
        false
    }

    /// Whether its methods may call other objects (a compiled type that imports
    /// `spindle.call`): its calls run as transactions the server drives (`calls::nested`).
    fn makes_calls(&self) -> bool {
        false
    }
}

/// Argument readers with uniform error messages.
pub mod args {
    use super::*;

    pub fn arity(method: &str, args: &[Value], min: usize, max: usize) -> Result<(), Error> {
        if args.len() < min || args.len() > max {
            let want = if min == max {
                format!("{min}")
            } else {
                format!("{min} to {max}")
            };
            return Err(Error::bad_args(format!(
                "{method}() takes {want} arguments ({} given)",
                args.len()
            )));
        }
        Ok(())
    }

    pub fn get(args: &[Value], i: usize) -> &Value {
        args.get(i).unwrap_or(&Value::Nil)
    }

    pub fn int(method: &str, args: &[Value], i: usize, name: &str) -> Result<i64, Error> {
        match get(args, i) {
            Value::Integer(n) => n.as_i64().ok_or_else(|| {
                Error::new(
                    crate::ErrorKind::OverflowError,
                    format!("{method}(): '{name}' does not fit in a signed 64-bit integer"),
                )
            }),
            other => Err(Error::bad_args(format!(
                "{method}(): '{name}' must be an integer, not {}",
                crate::value::type_of(other)
            ))),
        }
    }

    pub fn int_or(method: &str, args: &[Value], i: usize, name: &str, default: i64) -> Result<i64, Error> {
        match get(args, i) {
            Value::Nil => Ok(default),
            _ => int(method, args, i, name),
        }
    }

    pub fn bool_or(method: &str, args: &[Value], i: usize, name: &str, default: bool) -> Result<bool, Error> {
        match get(args, i) {
            Value::Nil => Ok(default),
            Value::Boolean(b) => Ok(*b),
            Value::Integer(n) => Ok(n.as_i64() != Some(0)),
            other => Err(Error::bad_args(format!(
                "{method}(): '{name}' must be a bool, not {}",
                crate::value::type_of(other)
            ))),
        }
    }

    pub fn float(method: &str, args: &[Value], i: usize, name: &str) -> Result<f64, Error> {
        match get(args, i) {
            Value::Integer(n) => Ok(n.as_f64().unwrap_or(0.0)),
            Value::F32(x) => Ok(*x as f64),
            Value::F64(x) => Ok(*x),
            other => Err(Error::bad_args(format!(
                "{method}(): '{name}' must be a number, not {}",
                crate::value::type_of(other)
            ))),
        }
    }

    /// A `timeout` argument: nil means wait forever; negative is a ValueError, as in `threading`.
    pub fn timeout(method: &str, args: &[Value], i: usize) -> Result<Option<f64>, Error> {
        match get(args, i) {
            Value::Nil => Ok(None),
            _ => {
                let t = float(method, args, i, "timeout")?;
                if t.is_nan() || t < 0.0 {
                    return Err(Error::value("'timeout' must be a non-negative number"));
                }
                Ok(Some(t.min(1.0e9)))
            }
        }
    }

    pub fn str<'v>(method: &str, args: &'v [Value], i: usize, name: &str) -> Result<&'v str, Error> {
        match get(args, i) {
            Value::String(s) => s
                .as_str()
                .ok_or_else(|| Error::bad_args(format!("{method}(): '{name}' is not valid UTF-8"))),
            other => Err(Error::bad_args(format!(
                "{method}(): '{name}' must be a str, not {}",
                crate::value::type_of(other)
            ))),
        }
    }

    pub fn bytes<'v>(method: &str, args: &'v [Value], i: usize, name: &str) -> Result<&'v [u8], Error> {
        match get(args, i) {
            Value::Binary(b) => Ok(b),
            other => Err(Error::bad_args(format!(
                "{method}(): '{name}' must be bytes, not {}",
                crate::value::type_of(other)
            ))),
        }
    }
}
