//! The host's side of one call: what the guest can reach through the `spindle` imports, and
//! the limiter that holds its memory to the limit.
//!
//! Every import checks the guest's pointers against the guest's memory and, when the guest
//! breaks the ABI (a range outside its memory, a reply that is not one MessagePack value, a
//! state over the limit), stops the call by returning an [`Abort`] from the host function:
//! wasmtime unwinds the guest as for a trap, and the call's error names what was wrong.
//! Nothing the guest does can make the host panic.

use std::fmt;

use spindle_core::{Reply, Value};
use wasmtime::{Caller, Extern, Linker, Memory, ResourceLimiter, Trap};

use crate::abi::IMPORT_MODULE;

/// A store's data: the call's inputs and what the guest handed back.
pub(crate) struct Host {
    /// The object's state as the call began.
    pub state: Vec<u8>,
    /// The last state the guest wrote, kept only if the call ends without error.
    pub new_state: Option<Vec<u8>>,
    /// The last reply, already decoded (so checked to be one MessagePack value).
    pub reply: Option<Value>,
    /// `(exception type, message)` from `spindle.fail`.
    pub failure: Option<(String, String)>,
    pub limiter: MemoryLimiter,
    pub state_limit: usize,
    /// The instance's memory, once instantiated (before, during a start function, the
    /// imports look it up by name).
    pub memory: Option<Memory>,
    /// The replies of the calls to other objects the method makes, known so far.
    pub nested: Vec<Reply>,
    /// Calls to other objects made so far in this run.
    pub calls_made: usize,
    /// The last call's reply as the guest reads it (`result_read`).
    pub result: Vec<u8>,
}

impl Host {
    pub fn new(state: Vec<u8>, nested: &[Reply], memory_limit: usize, state_limit: usize) -> Host {
        Host {
            state,
            new_state: None,
            reply: None,
            failure: None,
            limiter: MemoryLimiter { limit: memory_limit },
            state_limit,
            memory: None,
            nested: nested.to_vec(),
            calls_made: 0,
            result: Vec::new(),
        }
    }
}

/// Why the host stopped a call from inside an import or the limiter.
#[derive(Debug)]
pub(crate) enum Abort {
    /// The guest broke the ABI; the text says how.
    Fault(String),
    /// The guest called `spindle.fail` (the details are in [`Host::failure`]).
    Failed,
    /// The guest asked for more memory than the limit.
    Memory { desired: usize, limit: usize },
    /// The guest wrote a state over the limit.
    State { len: usize, limit: usize },
    /// The guest called `method` of the object `key` with `args`, whose reply is not known
    /// yet: the server runs that call, then this method again.
    Nested {
        key: String,
        method: String,
        args: Vec<Value>,
    },
}

impl fmt::Display for Abort {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Abort::Fault(what) => f.write_str(what),
            Abort::Failed => f.write_str("the method failed"),
            Abort::Memory { desired, limit } => {
                write!(
                    f,
                    "memory growth to {desired} bytes refused: the limit is {limit} bytes per call"
                )
            }
            Abort::State { len, limit } => write!(f, "state of {len} bytes refused: the limit is {limit} bytes"),
            Abort::Nested { key, method, .. } => write!(f, "it calls {key}.{method}"),
        }
    }
}

impl std::error::Error for Abort {}

/// Holds each instance to one memory of at most `limit` bytes. Growth past it traps (rather
/// than `memory.grow` returning -1) so the call reports "memory" instead of whatever the
/// guest does with a failed allocation.
pub(crate) struct MemoryLimiter {
    limit: usize,
}

impl ResourceLimiter for MemoryLimiter {
    fn memory_growing(&mut self, _current: usize, desired: usize, _maximum: Option<usize>) -> wasmtime::Result<bool> {
        if desired > self.limit {
            return Err(Abort::Memory {
                desired,
                limit: self.limit,
            }
            .into());
        }
        Ok(true)
    }

    fn table_growing(&mut self, _current: usize, desired: usize, _maximum: Option<usize>) -> wasmtime::Result<bool> {
        // Tables hold function references for indirect calls; a few thousand is plenty.
        Ok(desired <= 100_000)
    }

    fn instances(&self) -> usize {
        1
    }

    fn memories(&self) -> usize {
        1
    }
}

/// Define the `spindle` imports of [`crate::abi::IMPORTS`] in `linker`.
pub(crate) fn define_imports(linker: &mut Linker<Host>) -> wasmtime::Result<()> {
    linker.func_wrap(IMPORT_MODULE, "state_len", |caller: Caller<'_, Host>| -> i32 {
        // The state came from an earlier call, so it is within the state limit (< 2 GiB).
        caller.data().state.len() as i32
    })?;
    linker.func_wrap(IMPORT_MODULE, "state_read", |mut caller: Caller<'_, Host>, ptr: i32| {
        copy_to_guest(&mut caller, "state_read", ptr, |host| &host.state)
    })?;
    linker.func_wrap(
        IMPORT_MODULE,
        "state_write",
        |mut caller: Caller<'_, Host>, ptr: i32, len: i32| {
            let limit = caller.data().state_limit;
            if len as u32 as usize > limit {
                return Err(Abort::State {
                    len: len as u32 as usize,
                    limit,
                }
                .into());
            }
            let memory = memory(&mut caller)?;
            guest_range(memory.data_size(&caller), "state_write", ptr, len)?;
            charge(&mut caller, len as u32 as usize)?;
            let (data, host) = memory.data_and_store_mut(&mut caller);
            let range = guest_range(data.len(), "state_write", ptr, len)?;
            let new_state = host.new_state.get_or_insert_with(Vec::new);
            new_state.clear();
            new_state.extend_from_slice(&data[range]);
            Ok(())
        },
    )?;
    linker.func_wrap(
        IMPORT_MODULE,
        "reply",
        |mut caller: Caller<'_, Host>, ptr: i32, len: i32| {
            let memory = memory(&mut caller)?;
            guest_range(memory.data_size(&caller), "reply", ptr, len)?;
            charge(&mut caller, len as u32 as usize)?;
            let (data, host) = memory.data_and_store_mut(&mut caller);
            let bytes = &data[guest_range(data.len(), "reply", ptr, len)?];
            host.reply = Some(decode_one(bytes, host.state_limit)?);
            Ok(())
        },
    )?;
    linker.func_wrap(
        IMPORT_MODULE,
        "fail",
        |mut caller: Caller<'_, Host>,
         kind_ptr: i32,
         kind_len: i32,
         msg_ptr: i32,
         msg_len: i32|
         -> wasmtime::Result<()> {
            let memory = memory(&mut caller)?;
            let (data, host) = memory.data_and_store_mut(&mut caller);
            let kind = &data[guest_range(data.len(), "fail", kind_ptr, kind_len)?];
            let message = &data[guest_range(data.len(), "fail", msg_ptr, msg_len)?];
            let kind = String::from_utf8_lossy(kind).into_owned();
            let kind = if kind.is_empty() {
                "RuntimeError".to_string()
            } else {
                kind
            };
            host.failure = Some((kind, String::from_utf8_lossy(message).into_owned()));
            // Never returns to the guest: unwinding stops the method where it failed.
            Err(Abort::Failed.into())
        },
    )?;
    linker.func_wrap(
        IMPORT_MODULE,
        "call",
        |mut caller: Caller<'_, Host>,
         key_ptr: i32,
         key_len: i32,
         method_ptr: i32,
         method_len: i32,
         args_ptr: i32,
         args_len: i32|
         -> wasmtime::Result<i32> {
            let (key, method, args) = ((key_ptr, key_len), (method_ptr, method_len), (args_ptr, args_len));
            let memory = memory(&mut caller)?;
            let size = memory.data_size(&caller);
            for (ptr, len) in [key, method, args] {
                guest_range(size, "call", ptr, len)?;
            }
            charge(&mut caller, (key.1 as u32 + method.1 as u32 + args.1 as u32) as usize)?;
            let (data, host) = memory.data_and_store_mut(&mut caller);
            let Some(reply) = host.nested.get(host.calls_made) else {
                let text = |(ptr, len), what: &str| {
                    String::from_utf8(data[guest_range(data.len(), "call", ptr, len)?].to_vec())
                        .map_err(|_| Abort::Fault(format!("{IMPORT_MODULE}.call was given a {what} that is not UTF-8")))
                };
                let (key, method) = (text(key, "key")?, text(method, "method name")?);
                let args = match decode_one(
                    &data[guest_range(data.len(), "call", args.0, args.1)?],
                    host.state_limit,
                ) {
                    Ok(Value::Array(args)) => args,
                    Ok(_) => {
                        return Err(Abort::Fault(format!(
                            "{IMPORT_MODULE}.call was given arguments that are not one MessagePack array"
                        ))
                        .into())
                    }
                    Err(e) => return Err(e.into()),
                };
                return Err(Abort::Nested { key, method, args }.into());
            };
            host.calls_made += 1;
            let (bytes, raised) = match reply {
                Ok(value) => (encode(value), false),
                Err(e) => (encode(&nested_error(e)), true),
            };
            let len = bytes.len() as i32;
            host.result = bytes;
            Ok(if raised { -len - 1 } else { len })
        },
    )?;
    linker.func_wrap(
        IMPORT_MODULE,
        "result_read",
        |mut caller: Caller<'_, Host>, ptr: i32| copy_to_guest(&mut caller, "result_read", ptr, |host| &host.result),
    )?;
    Ok(())
}

/// Copy the host's bytes that `which` picks (the state, a call's result) to the guest's
/// memory at `ptr`, for `import`.
fn copy_to_guest(
    caller: &mut Caller<'_, Host>,
    import: &str,
    ptr: i32,
    which: fn(&Host) -> &Vec<u8>,
) -> wasmtime::Result<()> {
    let len = which(caller.data()).len();
    let memory = memory(caller)?;
    // Bad pointers are the guest's fault whatever the fuel left: checked before it is charged.
    guest_range(memory.data_size(&*caller), import, ptr, len as i32)?;
    charge(caller, len)?;
    let (data, host) = memory.data_and_store_mut(caller);
    let bytes = which(host);
    let range = guest_range(data.len(), import, ptr, bytes.len() as i32)?;
    data[range].copy_from_slice(bytes);
    Ok(())
}

/// A nested call's error as its caller reads it: `[kind, message]`, with the exception a
/// method raised (`Raised`) under its own name.
fn nested_error(e: &spindle_core::Error) -> Value {
    let field = |name: &str| match &e.data {
        Value::Map(entries) => entries
            .iter()
            .find(|(k, _)| k.as_str() == Some(name))
            .and_then(|(_, v)| v.as_str().map(str::to_string)),
        _ => None,
    };
    let (kind, message) = match (e.kind, field("type"), field("message")) {
        (spindle_core::ErrorKind::Raised, Some(kind), Some(message)) => (kind, message),
        _ => (e.kind.as_str().to_string(), e.message.clone()),
    };
    Value::Array(vec![kind.into(), message.into()])
}

fn encode(value: &Value) -> Vec<u8> {
    let mut bytes = Vec::new();
    rmpv::encode::write_value(&mut bytes, value).expect("writing to a Vec");
    bytes
}

/// Take the fuel of the host's work on `bytes` bytes of the guest's (a copy, a decoding): one
/// unit a byte. Without it a guest loop of a few instructions could make the host copy
/// megabytes on every turn, and one call could hold its partition for hours on the fuel of a
/// fraction of a second. Running out is the same trap as running out in the guest's code.
fn charge(caller: &mut Caller<'_, Host>, bytes: usize) -> wasmtime::Result<()> {
    let fuel = caller.get_fuel()?;
    let cost = bytes as u64;
    if cost > fuel {
        caller.set_fuel(0)?;
        return Err(Trap::OutOfFuel.into());
    }
    caller.set_fuel(fuel - cost)
}

fn memory(caller: &mut Caller<'_, Host>) -> wasmtime::Result<Memory> {
    if let Some(memory) = caller.data().memory {
        return Ok(memory);
    }
    match caller.get_export("memory") {
        Some(Extern::Memory(memory)) => Ok(memory),
        _ => Err(Abort::Fault("the guest has no memory export".into()).into()),
    }
}

/// The bytes `[ptr, ptr + len)` of a guest memory of `size` bytes. Wasm32 pointers and
/// lengths are unsigned, so a negative `i32` is a large number, not an error of its own.
fn guest_range(size: usize, import: &str, ptr: i32, len: i32) -> Result<std::ops::Range<usize>, Abort> {
    let start = ptr as u32 as usize;
    let end = start.saturating_add(len as u32 as usize);
    if end > size {
        return Err(Abort::Fault(format!(
            "{IMPORT_MODULE}.{import} was given bytes [{start}, {end}), outside the guest's memory of {size} bytes"
        )));
    }
    Ok(start..end)
}

/// Values a reply may hold: each byte of MessagePack may decode to about 40 bytes of values,
/// so the count, not only the length, bounds what a reply costs the server.
pub(crate) const MAX_REPLY_VALUES: usize = 1 << 20;

/// The one MessagePack value of a reply of at most `max_bytes` (as a state) and
/// [`MAX_REPLY_VALUES`] values, counted before anything is decoded.
fn decode_one(mut bytes: &[u8], max_bytes: usize) -> Result<Value, Abort> {
    let total = bytes.len();
    if total > max_bytes {
        return Err(Abort::Fault(format!(
            "{IMPORT_MODULE}.reply was given {total} bytes: a reply is at most {max_bytes} bytes, as a state is \
             (Limits::state_bytes)"
        )));
    }
    if let Err(count) = spindle_proto::count_values(bytes, MAX_REPLY_VALUES) {
        return Err(Abort::Fault(format!(
            "{IMPORT_MODULE}.reply was given more than {MAX_REPLY_VALUES} values ({count} counted so far): \
             return fewer, larger values (bytes rather than lists of numbers)"
        )));
    }
    let value = rmpv::decode::read_value(&mut bytes).map_err(|e| {
        Abort::Fault(format!(
            "{IMPORT_MODULE}.reply was given {total} bytes that are not a MessagePack value ({e})"
        ))
    })?;
    if !bytes.is_empty() {
        return Err(Abort::Fault(format!(
            "{IMPORT_MODULE}.reply was given {total} bytes: one MessagePack value and {} more bytes (a reply is one value)",
            bytes.len()
        )));
    }
    Ok(value)
}
