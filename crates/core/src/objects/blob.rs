//! `Blob`: a byte string, for large inputs passed by reference instead of inlined.

use super::snapshot::{self, Fields};
use crate::object::args;
use crate::{Ctx, Error, Object, Step, Value};

#[derive(Clone)]
pub struct Blob {
    data: Vec<u8>,
}

impl Blob {
    pub fn new(a: &[Value]) -> Result<Self, Error> {
        args::arity("Blob", a, 0, 1)?;
        let data = match args::get(a, 0) {
            Value::Nil => Vec::new(),
            _ => args::bytes("Blob", a, 0, "initial")?.to_vec(),
        };
        Ok(Blob { data })
    }

    pub(crate) fn restore(state: &Value) -> Result<Self, Error> {
        let f = Fields::open("Blob", state, &["data"])?;
        Ok(Blob {
            data: f.bytes("data")?.to_vec(),
        })
    }
}

fn non_negative(method: &str, a: &[Value], i: usize, name: &str) -> Result<usize, Error> {
    let n = args::int(method, a, i, name)?;
    usize::try_from(n).map_err(|_| Error::value(format!("{method}(): '{name}' must be non-negative")))
}

impl Object for Blob {
    fn type_name(&self) -> &'static str {
        "Blob"
    }

    fn is_mutating(&self, method: &str) -> bool {
        !matches!(method, "get" | "len" | "read")
    }

    fn size(&self) -> usize {
        self.data.len()
    }

    fn snapshot(&self) -> Option<Value> {
        Some(snapshot::encode(vec![("data", Value::Binary(self.data.clone()))]))
    }

    fn apply(&mut self, method: &str, a: &[Value], _ctx: &mut Ctx) -> Result<Step, Error> {
        let v = match method {
            "get" => {
                args::arity(method, a, 0, 0)?;
                Value::Binary(self.data.clone())
            }
            "set" => {
                args::arity(method, a, 1, 1)?;
                self.data = args::bytes(method, a, 0, "data")?.to_vec();
                Value::Nil
            }
            "append" => {
                args::arity(method, a, 1, 1)?;
                self.data.extend_from_slice(args::bytes(method, a, 0, "data")?);
                Value::from(self.data.len() as u64)
            }
            "len" => {
                args::arity(method, a, 0, 0)?;
                Value::from(self.data.len() as u64)
            }
            "read" => {
                args::arity(method, a, 2, 2)?;
                let offset = non_negative(method, a, 0, "offset")?;
                let size = non_negative(method, a, 1, "size")?;
                let start = offset.min(self.data.len());
                let end = start.saturating_add(size).min(self.data.len());
                Value::Binary(self.data[start..end].to_vec())
            }
            _ => return Err(super::unknown_method("Blob", method)),
        };
        Ok(Step::Reply(v))
    }
}
