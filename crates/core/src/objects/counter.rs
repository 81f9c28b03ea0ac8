//! `Counter`: a 64-bit signed integer. Overflow is an error, never a wrap.

use super::snapshot::{self, Fields};
use crate::object::args;
use crate::{Ctx, Error, ErrorKind, Object, Step, Value};

#[derive(Clone)]
pub struct Counter {
    value: i64,
}

impl Counter {
    pub fn new(a: &[Value]) -> Result<Self, Error> {
        args::arity("Counter", a, 0, 1)?;
        Ok(Counter {
            value: args::int_or("Counter", a, 0, "initial", 0)?,
        })
    }

    pub(crate) fn restore(state: &Value) -> Result<Self, Error> {
        let f = Fields::open("Counter", state, &["value"])?;
        Ok(Counter { value: f.i64("value")? })
    }

    fn add(&mut self, delta: i64) -> Result<i64, Error> {
        self.value = self.value.checked_add(delta).ok_or_else(|| {
            Error::new(
                ErrorKind::OverflowError,
                format!("Counter overflow: {} + {delta} does not fit in 64 bits", self.value),
            )
        })?;
        Ok(self.value)
    }
}

impl Object for Counter {
    fn type_name(&self) -> &'static str {
        "Counter"
    }

    fn is_mutating(&self, method: &str) -> bool {
        !matches!(method, "get")
    }

    fn snapshot(&self) -> Option<Value> {
        Some(snapshot::encode(vec![("value", Value::from(self.value))]))
    }

    fn apply(&mut self, method: &str, a: &[Value], _ctx: &mut Ctx) -> Result<Step, Error> {
        let v = match method {
            "get" => {
                args::arity(method, a, 0, 0)?;
                Value::from(self.value)
            }
            "set" => {
                args::arity(method, a, 1, 1)?;
                self.value = args::int(method, a, 0, "value")?;
                Value::Nil
            }
            "add" => {
                args::arity(method, a, 1, 1)?;
                Value::from(self.add(args::int(method, a, 0, "delta")?)?)
            }
            "get_and_add" => {
                args::arity(method, a, 1, 1)?;
                let old = self.value;
                self.add(args::int(method, a, 0, "delta")?)?;
                Value::from(old)
            }
            "increment" => {
                args::arity(method, a, 0, 0)?;
                Value::from(self.add(1)?)
            }
            "decrement" => {
                args::arity(method, a, 0, 0)?;
                Value::from(self.add(-1)?)
            }
            "compare_and_set" => {
                args::arity(method, a, 2, 2)?;
                let (expected, new) = (args::int(method, a, 0, "expected")?, args::int(method, a, 1, "new")?);
                let hit = self.value == expected;
                if hit {
                    self.value = new;
                }
                Value::Boolean(hit)
            }
            _ => return Err(super::unknown_method("Counter", method)),
        };
        Ok(Step::Reply(v))
    }
}
