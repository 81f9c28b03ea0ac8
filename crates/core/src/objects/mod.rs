//! The built-in object types, one file each (like Redis' `t_*.c`).

mod counter;

pub use counter::Counter;

use crate::{Error, ErrorKind, Object, Value};

/// Every type name a client may create.
pub const TYPES: &[&str] = &["Counter"];

/// Construct a new object of `type_name` from its constructor arguments.
pub fn create(type_name: &str, args: &[Value]) -> Result<Box<dyn Object>, Error> {
    Ok(match type_name {
        "Counter" => Box::new(Counter::new(args)?),
        _ => {
            return Err(Error::new(
                ErrorKind::UnknownType,
                format!("unknown object type '{type_name}' (known: {})", TYPES.join(", ")),
            ))
        }
    })
}

/// The error for a method the type does not have.
pub fn unknown_method(type_name: &str, method: &str) -> Error {
    Error::new(
        ErrorKind::UnknownMethod,
        format!("{type_name} has no method '{method}'"),
    )
}
