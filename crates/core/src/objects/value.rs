//! `Value`: one value of any type, read and replaced atomically.

use super::snapshot::{self, Fields};
use crate::object::args;
use crate::value::eq_values;
use crate::{Ctx, Error, Object, Step, Value};

/// Named `SharedValue` so it does not shadow the MessagePack `Value` it holds.
pub struct SharedValue {
    value: Value,
}

impl SharedValue {
    pub fn new(a: &[Value]) -> Result<Self, Error> {
        args::arity("Value", a, 0, 1)?;
        Ok(SharedValue {
            value: args::get(a, 0).clone(),
        })
    }

    pub(crate) fn restore(state: &Value) -> Result<Self, Error> {
        let f = Fields::open("Value", state, &["value"])?;
        Ok(SharedValue {
            value: f.get("value")?.clone(),
        })
    }
}

impl Object for SharedValue {
    fn type_name(&self) -> &'static str {
        "Value"
    }

    fn is_mutating(&self, method: &str) -> bool {
        !matches!(method, "get")
    }

    fn snapshot(&self) -> Option<Value> {
        Some(snapshot::encode(vec![("value", self.value.clone())]))
    }

    fn apply(&mut self, method: &str, a: &[Value], _ctx: &mut Ctx) -> Result<Step, Error> {
        let v = match method {
            "get" => {
                args::arity(method, a, 0, 0)?;
                self.value.clone()
            }
            "set" => {
                args::arity(method, a, 1, 1)?;
                self.value = a[0].clone();
                Value::Nil
            }
            "get_and_set" => {
                args::arity(method, a, 1, 1)?;
                std::mem::replace(&mut self.value, a[0].clone())
            }
            "compare_and_set" => {
                args::arity(method, a, 2, 2)?;
                let hit = eq_values(&self.value, &a[0]);
                if hit {
                    self.value = a[1].clone();
                }
                Value::Boolean(hit)
            }
            _ => return Err(super::unknown_method("Value", method)),
        };
        Ok(Step::Reply(v))
    }
}
