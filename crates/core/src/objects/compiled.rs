//! Compiled object types (`wasm:` types): their code is a WebAssembly module that the server
//! compiled once, and their methods run right here, inside the partition's apply, like a
//! built-in's. The object's state is a byte string the code reads and writes whole, so
//! snapshots, the op log, replication and transactions treat it as any built-in object.
//!
//! This crate only knows the [`Code`] contract; the server's runtime (`spindle-wasm`) keeps
//! the compiled modules and implements it. Code must be deterministic: the same state and
//! arguments give the same result and state, on every replica and in every replay.

use std::fmt;
use std::sync::Arc;

use super::snapshot::{self, Fields};
use crate::{Ctx, Error, ErrorKind, Object, Reply, Step, Value};

/// Every compiled type's name starts with this.
pub const WASM_PREFIX: &str = "wasm:";

pub fn is_compiled_type(type_name: &str) -> bool {
    type_name.starts_with(WASM_PREFIX)
}

/// Check a compiled type name (`wasm:<name>`), as `define` receives it.
pub fn check_type_name(type_name: &str) -> Result<(), Error> {
    let name = type_name.strip_prefix(WASM_PREFIX).unwrap_or_default();
    if name.is_empty() || type_name.len() > super::user::MAX_TYPE_NAME {
        return Err(Error::bad_args(format!(
            "'{type_name}' is no compiled type name (wasm:<name>, at most {} bytes)",
            super::user::MAX_TYPE_NAME
        )));
    }
    Ok(())
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

    /// Run `method` on an object in `state`, with the replies of the calls to other objects
    /// it makes known so far (`nested`, in the order it makes them). An error (the method
    /// failed, trapped or passed a limit, or made a call past `nested`: `NestedCall`) leaves
    /// the object as it was.
    fn run(&self, state: &[u8], method: &str, args: &[Value], nested: &[Reply]) -> Result<Called, Error>;

    /// [`run`](Self::run) a method that calls no other object.
    fn call(&self, state: &[u8], method: &str, args: &[Value]) -> Result<Called, Error> {
        self.run(state, method, args, &[])
    }

    /// Whether its methods may call other objects.
    fn makes_calls(&self) -> bool {
        false
    }
}

/// Where partitions find the code of compiled types: the server's runtime.
pub trait Library: Send + Sync {
    /// Compile `code` as `type_name` at `version` (or find it compiled already), refusing a
    /// module that does not keep the ABI with an error that says what is wrong.
    fn load(&self, type_name: &str, version: &str, code: &[u8]) -> Result<Arc<dyn Code>, Error>;
}

/// `create` arguments of a compiled type: `[version: str, args: array]`.
pub fn parse_create_args(type_name: &str, args: Vec<Value>) -> Result<(String, Vec<Value>), Error> {
    let shape = || Error::bad_args(format!("creating a {type_name} takes [version: str, args: array]"));
    let [version, args]: [Value; 2] = args.try_into().map_err(|_| shape())?;
    match (version, args) {
        (Value::String(v), Value::Array(args)) => {
            let version = v.into_str().filter(|v| !v.is_empty()).ok_or_else(shape)?;
            Ok((version, args))
        }
        _ => Err(shape()),
    }
}

/// The error for a create or a restore of a version this partition has no code for.
pub fn not_defined(type_name: &str, version: &str) -> Error {
    Error::new(
        ErrorKind::UnknownType,
        format!("{type_name} at version {version} is not defined on this server: define its module first"),
    )
}

/// An object of a compiled type: its code and its state.
#[derive(Clone)]
pub struct CompiledObject {
    type_name: Arc<str>,
    version: Arc<str>,
    code: Arc<dyn Code>,
    state: Vec<u8>,
}

impl fmt::Debug for CompiledObject {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}@{} ({} bytes)", self.type_name, self.version, self.state.len())
    }
}

impl CompiledObject {
    /// A new object: its constructor runs on `args`.
    pub fn new(type_name: &str, version: &str, code: Arc<dyn Code>, args: &[Value]) -> Result<Self, Error> {
        let state = code.construct(args)?;
        Ok(CompiledObject {
            type_name: type_name.into(),
            version: version.into(),
            code,
            state,
        })
    }

    /// The version a [`snapshot`](Object::snapshot) of a compiled object was taken at, to
    /// find its code before [`restore`](Self::restore).
    pub fn snapshot_version(state: &Value) -> Result<String, Error> {
        let f = Fields::open("compiled object", state, &["version", "state"])?;
        match f.get("version")?.as_str() {
            Some(v) => Ok(v.to_string()),
            None => Err(f.corrupt("the version is not a string")),
        }
    }

    /// Rebuild an object from its snapshot and its version's code (no constructor runs).
    pub fn restore(type_name: &str, code: Arc<dyn Code>, state: &Value) -> Result<Self, Error> {
        let f = Fields::open("compiled object", state, &["version", "state"])?;
        Ok(CompiledObject {
            type_name: type_name.into(),
            version: Self::snapshot_version(state)?.into(),
            code,
            state: f.bytes("state")?.to_vec(),
        })
    }

    pub fn version(&self) -> &str {
        &self.version
    }
}

impl Object for CompiledObject {
    fn type_name(&self) -> &str {
        &self.type_name
    }

    fn apply(&mut self, method: &str, args: &[Value], ctx: &mut Ctx) -> Result<Step, Error> {
        if self
            .code
            .methods()
            .binary_search_by(|m| m.as_str().cmp(method))
            .is_err()
        {
            return Err(super::unknown_method(&self.type_name, method));
        }
        let called = self.code.run(&self.state, method, args, ctx.nested)?;
        if let Some(state) = called.state {
            if ctx.read_only {
                return Err(Error::new(
                    ErrorKind::PermissionDenied,
                    format!("{}.{method} changes the object's state", self.type_name),
                ));
            }
            self.state = state;
        }
        Ok(Step::Reply(called.result))
    }

    /// Any method may write the state: every reply is recorded, every call logged.
    fn is_mutating(&self, _method: &str) -> bool {
        true
    }

    fn size(&self) -> usize {
        self.state.len() + self.type_name.len() + self.version.len()
    }

    fn makes_calls(&self) -> bool {
        self.code.makes_calls()
    }

    fn snapshot(&self) -> Option<Value> {
        Some(snapshot::encode(vec![
            ("version", Value::from(&*self.version)),
            ("state", Value::Binary(self.state.clone())),
        ]))
    }
}
