//! Compiled object types (`wasm:` types): their code is a WebAssembly module that the server
//! compiled once, and their methods run right here, inside the partition's apply, like a
//! built-in's. The object's state is a byte string the code reads and writes whole, so
//! snapshots, the op log, replication and transactions treat it as any built-in object.
//!
//! This crate only knows the [`Code`] contract; the server's runtime (`spindle-wasm`) keeps
//! the compiled modules and implements it. Code must be deterministic: the same state and
//! arguments give the same result and state, on every replica and in every replay.

use std::sync::Arc;

use crate::{Error, Value};

/// Every compiled type's name starts with this.
pub const WASM_PREFIX: &str = "wasm:";

pub fn is_compiled_type(type_name: &str) -> bool {
    type_name.starts_with(WASM_PREFIX)
}

/// What a method call returned: its result and, if it wrote one, the object's new state.
#[derive(Clone, Debug, PartialEq)]
pub struct Called {
    pub result: Value,
    pub state: Option<Vec<u8>>,
}

/// A compiled object type's code.
pub trait Code: Send + Sync {
    /// The methods the code exports, sorted.
    fn methods(&self) -> &[String];

    /// Run the constructor on `args` and return the new object's state (empty when the
    /// code has no constructor and `args` is empty).
    fn construct(&self, args: &[Value]) -> Result<Vec<u8>, Error>;

    /// Run `method` on an object in `state`. An error (the method failed, trapped or passed
    /// a limit) leaves the object as it was.
    fn call(&self, state: &[u8], method: &str, args: &[Value]) -> Result<Called, Error>;
}

/// Where partitions find the code of compiled types: the server's runtime.
pub trait Library: Send + Sync {
    /// Compile `code` as `type_name` at `version` (or find it compiled already), refusing a
    /// module that does not keep the ABI with an error that says what is wrong.
    fn load(&self, type_name: &str, version: &str, code: &[u8]) -> Result<Arc<dyn Code>, Error>;
}
