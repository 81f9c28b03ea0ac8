//! A call as a partition receives it: what the request path builds, the op log records and
//! a replay hands back (apart from `partition`, so `record` need not import it).

use crate::{Reply, Value};

/// A call as the partition receives it.
#[derive(Clone, Debug, PartialEq)]
pub enum Op {
    /// Create the object with `args` unless it exists; reply `true` if created.
    Create {
        type_name: String,
        key: String,
        args: Vec<Value>,
        owned: bool,
        /// Logged and recovered after a restart (durable types only).
        persistent: bool,
    },
    /// Run `method` on the object.
    Call {
        type_name: String,
        key: String,
        method: String,
        args: Vec<Value>,
        /// The replies of the calls to other objects the method makes, in order, as far as
        /// the server's driver of nested calls ran them (`Ctx::nested`); `None` from clients.
        nested: Option<Vec<Reply>>,
    },
    /// Remove the object; reply `true` if it existed.
    Delete { key: String },
}

impl Op {
    pub fn key(&self) -> &str {
        match self {
            Op::Create { key, .. } | Op::Call { key, .. } | Op::Delete { key } => key,
        }
    }
}
