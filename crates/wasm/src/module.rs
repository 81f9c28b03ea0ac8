//! A loaded compiled type, and how one call runs.
//!
//! Every call (and every construction) gets a fresh instance of the module, made from an
//! `InstancePre` (imports resolved once at load), in a fresh store with its own fuel and
//! memory limiter:
//!
//! ```text
//! instantiate -> ptr = spindle_alloc(len(args)) -> write args at ptr -> method(ptr, len)
//!             -> the guest reads the state, writes the new one, replies -> drop the instance
//! ```
//!
//! Nothing survives the call but what the guest handed to `state_write` and `reply`, so a
//! call cannot see another call's leftovers, two objects of one type share nothing, and a trap
//! anywhere (the guest's own, a limit, an ABI breach) leaves no half-written state behind: the
//! error is returned and the partition keeps the old state.

use std::sync::Arc;

use spindle_core::objects::compiled::{Called, Code};
use spindle_core::{Error, ErrorKind, Reply, Value};
use wasmtime::{Extern, InstancePre, ModuleExport, PoolConcurrencyLimitError, Store, Trap, TypedFunc};

use crate::abi::Exports;
use crate::host::{Abort, Host};
use crate::Limits;

/// Code compiled from one module's bytes; shared by every type loaded from those bytes.
pub(crate) struct Compiled {
    pre: InstancePre<Host>,
    exports: Exports,
    method_names: Vec<String>,
}

impl Compiled {
    pub fn new(pre: InstancePre<Host>, exports: Exports) -> Compiled {
        let method_names = exports.methods.iter().map(|(name, _)| name.clone()).collect();
        Compiled {
            pre,
            exports,
            method_names,
        }
    }
}

/// A compiled object type: what [`crate::Runtime`]'s `load` returns.
pub struct Module {
    type_name: String,
    compiled: Arc<Compiled>,
    limits: Limits,
}

impl Module {
    pub(crate) fn new(type_name: &str, compiled: Arc<Compiled>, limits: Limits) -> Module {
        Module {
            type_name: type_name.to_string(),
            compiled,
            limits,
        }
    }

    pub fn type_name(&self) -> &str {
        &self.type_name
    }

    /// Run the export `entry` (named `name`, for messages) on `state` with `args`, and the
    /// replies of the calls to other objects it makes known so far.
    fn run(
        &self,
        name: &str,
        entry: &ModuleExport,
        state: &[u8],
        args: &[Value],
        nested: &[Reply],
    ) -> Result<Host, Error> {
        let args = encode_args(args);
        if args.len() > self.limits.memory_bytes {
            return Err(Error::bad_args(format!(
                "{}.{name}: {} bytes of arguments do not fit in a guest memory of {} bytes",
                self.type_name,
                args.len(),
                self.limits.memory_bytes
            )));
        }
        let host = Host::new(
            state.to_vec(),
            nested,
            self.limits.memory_bytes,
            self.limits.state_bytes,
        );
        let mut store = Store::new(self.compiled.pre.module().engine(), host);
        store.limiter(|host| &mut host.limiter);
        store.set_fuel(self.limits.fuel).expect("the engine consumes fuel");
        match self.enter(&mut store, entry, &args) {
            Ok(()) => Ok(store.into_data()),
            Err(error) => Err(self.call_error(name, error, store.data())),
        }
    }

    fn enter(&self, store: &mut Store<Host>, entry: &ModuleExport, args: &[u8]) -> wasmtime::Result<()> {
        let exports = &self.compiled.exports;
        let instance = self.compiled.pre.instantiate(&mut *store)?;
        let Some(Extern::Memory(memory)) = instance.get_module_export(&mut *store, &exports.memory) else {
            unreachable!("the ABI check found the memory export")
        };
        store.data_mut().memory = Some(memory);
        let alloc: TypedFunc<i32, i32> =
            func(instance.get_module_export(&mut *store, &exports.alloc)).typed(&*store)?;
        let len = args.len() as i32;
        let ptr = alloc.call(&mut *store, len)?;
        memory.write(&mut *store, ptr as u32 as usize, args).map_err(|_| {
            Abort::Fault(format!(
                "spindle_alloc({len}) returned {}, but [{0}, {}) is outside the guest's memory of {} bytes",
                ptr as u32,
                ptr as u32 as u64 + len as u64,
                memory.data_size(&*store)
            ))
        })?;
        let method: TypedFunc<(i32, i32), ()> = func(instance.get_module_export(&mut *store, entry)).typed(&*store)?;
        method.call(&mut *store, (ptr, len))
    }

    /// The error of a call that did not return normally.
    fn call_error(&self, name: &str, error: wasmtime::Error, host: &Host) -> Error {
        let what = format!("{}.{name}", self.type_name);
        if let Some((kind, message)) = &host.failure {
            let data = Value::Map(vec![
                ("type".into(), kind.as_str().into()),
                ("message".into(), message.as_str().into()),
                ("traceback".into(), "".into()),
                ("exception".into(), Value::Nil),
            ]);
            return Error::new(ErrorKind::Raised, format!("{kind}: {message}")).with_data(data);
        }
        if let Some(busy) = error.downcast_ref::<PoolConcurrencyLimitError>() {
            return Error::new(ErrorKind::Busy, format!("{what} cannot run now: {busy}; try again"));
        }
        let (reason, message) = match (error.downcast_ref::<Abort>(), error.downcast_ref::<Trap>()) {
            (Some(abort @ Abort::Memory { .. }), _) => (
                "memory",
                format!("{what}: {abort} (Limits::memory_bytes, the server's --wasm-memory)"),
            ),
            (Some(abort @ Abort::State { .. }), _) => ("memory", format!("{what}: {abort} (Limits::state_bytes)")),
            (Some(Abort::Nested { key, method, args }), _) => {
                let data = Value::Array(vec![
                    key.as_str().into(),
                    method.as_str().into(),
                    Value::Array(args.clone()),
                ]);
                return Error::new(ErrorKind::NestedCall, format!("{what} calls {key}.{method}")).with_data(data);
            }
            (Some(abort), _) => ("trap", format!("{what} broke the ABI: {abort}")),
            (None, Some(Trap::OutOfFuel)) => (
                "fuel",
                format!(
                    "{what} ran out of fuel: it passed the budget of {} instructions per call \
                     (raise Limits::fuel, the server's --wasm-fuel, to allow longer methods)",
                    self.limits.fuel
                ),
            ),
            (None, Some(Trap::StackOverflow)) => (
                "stack",
                format!(
                    "{what} overflowed its stack of {} bytes (deep recursion?; Limits::stack_bytes)",
                    self.limits.stack_bytes
                ),
            ),
            (None, Some(trap)) => ("trap", format!("{what} trapped: {trap}")),
            (None, None) => ("trap", format!("{what} failed: {error:#}")),
        };
        Error::new(ErrorKind::Trapped, message).with_data(Value::Map(vec![("reason".into(), reason.into())]))
    }
}

impl Code for Module {
    fn methods(&self) -> &[String] {
        &self.compiled.method_names
    }

    fn makes_calls(&self) -> bool {
        self.compiled.exports.makes_calls
    }

    fn construct(&self, args: &[Value]) -> Result<Vec<u8>, Error> {
        let Some(init) = &self.compiled.exports.init else {
            if args.is_empty() {
                return Ok(Vec::new());
            }
            return Err(Error::bad_args(format!(
                "{} has no constructor (no `init` export) but was given {} argument(s)",
                self.type_name,
                args.len()
            )));
        };
        match self.run("init", init, &[], args, &[]) {
            Ok(host) => Ok(host.new_state.unwrap_or_default()),
            Err(e) if e.kind == ErrorKind::NestedCall => Err(Error::runtime(format!(
                "{}'s constructor calls another object: only methods may ({})",
                self.type_name, e.message
            ))),
            Err(e) => Err(e),
        }
    }

    fn run(&self, state: &[u8], method: &str, args: &[Value], nested: &[Reply]) -> Result<Called, Error> {
        let methods = &self.compiled.exports.methods;
        let Ok(index) = methods.binary_search_by(|(name, _)| name.as_str().cmp(method)) else {
            return Err(Error::new(
                ErrorKind::UnknownMethod,
                format!("{} has no method '{method}'", self.type_name),
            ));
        };
        let host = self.run(method, &methods[index].1, state, args, nested)?;
        Ok(Called {
            result: host.reply.unwrap_or(Value::Nil),
            state: host.new_state,
        })
    }
}

fn func(export: Option<Extern>) -> wasmtime::Func {
    match export {
        Some(Extern::Func(func)) => func,
        _ => unreachable!("the ABI check found this function export"),
    }
}

/// The call's arguments as the guest reads them: one MessagePack array.
fn encode_args(args: &[Value]) -> Vec<u8> {
    let mut bytes = Vec::with_capacity(16);
    rmp::encode::write_array_len(&mut bytes, args.len() as u32).expect("writing to a Vec");
    for arg in args {
        rmpv::encode::write_value(&mut bytes, arg).expect("writing to a Vec");
    }
    bytes
}

impl std::fmt::Debug for Module {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Module")
            .field("type_name", &self.type_name)
            .field("methods", &self.methods())
            .finish()
    }
}
