//! `Value`: one value of any type, read and replaced atomically.

use super::snapshot::{self, Fields};
use crate::object::args;
use crate::value::{approx_size, eq_values};
use crate::{Ctx, Error, Object, Step, Value};

#[derive(Clone)]
/// Named `SharedValue` so it does not shadow the MessagePack `Value` it holds.
pub struct SharedValue {
    value: Value,
    /// `approx_size(value)`, kept so [`Object::size`] is O(1).
    size: usize,
}

impl SharedValue {
    pub fn new(a: &[Value]) -> Result<Self, Error> {
        args::arity("Value", a, 0, 1)?;
        Ok(SharedValue::holding(args::get(a, 0).clone()))
    }

    pub(crate) fn restore(state: &Value) -> Result<Self, Error> {
        let f = Fields::open("Value", state, &["value"])?;
        Ok(SharedValue::holding(f.get("value")?.clone()))
    }

    fn holding(value: Value) -> Self {
        let size = approx_size(&value);
        SharedValue { value, size }
    }

    /// Replace the value, returning the old one.
    fn replace(&mut self, value: Value) -> Value {
        self.size = approx_size(&value);
        std::mem::replace(&mut self.value, value)
    }
}

impl Object for SharedValue {
    fn type_name(&self) -> &'static str {
        "Value"
    }

    fn is_mutating(&self, method: &str) -> bool {
        !matches!(method, "get")
    }

    fn size(&self) -> usize {
        self.size
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
                self.replace(a[0].clone());
                Value::Nil
            }
            "get_and_set" => {
                args::arity(method, a, 1, 1)?;
                self.replace(a[0].clone())
            }
            "compare_and_set" => {
                args::arity(method, a, 2, 2)?;
                let hit = eq_values(&self.value, &a[0]);
                if hit {
                    self.replace(a[1].clone());
                }
                Value::Boolean(hit)
            }
            _ => return Err(super::unknown_method("Value", method)),
        };
        Ok(Step::Reply(v))
    }
}
