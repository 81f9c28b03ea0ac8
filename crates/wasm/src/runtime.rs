//! The runtime: one wasmtime engine for the whole server, the limits every call runs under,
//! and the cache of compiled modules.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, Weak};

use sha2::{Digest, Sha256};
use spindle_core::objects::compiled::{Code, Library};
use spindle_core::Error;
use wasmtime::{Config, Enabled, Engine, InstanceAllocationStrategy, Linker, OptLevel, PoolingAllocationConfig};

type Sha256Digest = [u8; 32];

/// Bytes of a pooled memory (and of a table) kept mapped between calls, zeroed in place.
const KEEP_RESIDENT: usize = 1 << 20;
/// Pool slots kept ready for the module that used them last (each holds up to
/// `KEEP_RESIDENT` bytes resident: 32 MiB at most in all).
const WARM_SLOTS: u32 = 32;

use crate::abi;
use crate::host::{self, Host};
use crate::module::{Compiled, Module};

/// What one call may use. A call past a limit fails with `ErrorKind::Trapped` and leaves the
/// object as it was; the same call fails the same way on every replica, because fuel counts
/// instructions, not time.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Instructions per call (wasmtime's fuel: about one unit per wasm instruction), counting
    /// the instance's start-up, the argument allocation and the method, and one unit a byte
    /// the imports copy or decode (`state_read`, `state_write`, `reply`). Default 100,000,000:
    /// a few tenths of a second of straight-line code.
    pub fuel: u64,
    /// Linear memory per instance, in bytes. Default 64 MiB.
    pub memory_bytes: usize,
    /// Wasm stack per call, in bytes. Default 512 KiB. The calling thread's own stack must
    /// have this much room left (tokio's workers have 2 MiB).
    pub stack_bytes: usize,
    /// Size of a module's binary. Default 16 MiB.
    pub module_bytes: usize,
    /// Size of an object's state. Default 16 MiB: an object's state travels in the op log,
    /// snapshots and replication like any object's.
    pub state_bytes: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            fuel: 100_000_000,
            memory_bytes: 64 << 20,
            stack_bytes: 512 << 10,
            module_bytes: 16 << 20,
            state_bytes: 16 << 20,
        }
    }
}

/// How instances get their memory and tables. `examples/call_overhead.rs` measures both: a
/// trivial call costs about 4 us pooled and 30 to 50 us on demand (mapping and unmapping a
/// 4 GiB reservation per call, and the page faults of a fresh mapping).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Allocator {
    /// Map fresh memory for every instance and unmap it after.
    OnDemand,
    /// Keep `instances` slots reserved (4 GiB of address space each, mapped only as used) and
    /// reuse them. At most `instances` calls run at once; one more fails with `Busy`.
    Pooling { instances: u32 },
}

impl Allocator {
    /// Pooled: many more slots than the server has partition threads.
    pub const DEFAULT: Allocator = Allocator::Pooling { instances: 256 };
}

/// Compiles modules into compiled object types and keeps them; implements [`Library`].
pub struct Runtime {
    engine: Engine,
    linker: Linker<Host>,
    limits: Limits,
    /// Compiled code by the sha256 of its bytes, shared by every type loaded from them.
    /// Weak: code no module uses any more is freed (a redefined type's old versions).
    compiled: Mutex<HashMap<Sha256Digest, Weak<Compiled>>>,
    /// Loaded types by (sha256, type name), so a second load returns the same module while
    /// anything (an object, a partition's table, the server's defined class) holds it.
    modules: Mutex<HashMap<(Sha256Digest, String), Weak<Module>>>,
}

impl Runtime {
    pub fn new(limits: Limits) -> Result<Runtime, Error> {
        Runtime::with_allocator(limits, Allocator::DEFAULT)
    }

    pub fn with_allocator(limits: Limits, allocator: Allocator) -> Result<Runtime, Error> {
        if limits.state_bytes > i32::MAX as usize || limits.memory_bytes > u32::MAX as usize {
            return Err(Error::bad_args(
                "state_bytes must be below 2 GiB and memory_bytes at most 4 GiB",
            ));
        }
        let mut config = Config::new();
        config
            .consume_fuel(true)
            .max_wasm_stack(limits.stack_bytes)
            .cranelift_opt_level(OptLevel::Speed)
            // Determinism: every NaN an instruction produces has the same bits on every CPU;
            // no relaxed SIMD (its results may differ between CPUs); no threads or shared
            // memory; one memory of 32-bit addresses.
            .cranelift_nan_canonicalization(true)
            .wasm_relaxed_simd(false)
            .relaxed_simd_deterministic(true)
            .wasm_multi_memory(false)
            .wasm_memory64(false)
            .wasm_backtrace_max_frames(None);
        if let Allocator::Pooling { instances } = allocator {
            let mut pool = PoolingAllocationConfig::default();
            pool.total_core_instances(instances)
                .total_memories(instances)
                .total_tables(instances)
                .max_memory_size(limits.memory_bytes)
                // A slot is reset after each call. Zero the pages the call dirtied (found with
                // the PAGEMAP_SCAN ioctl where the kernel has it, 6.7+) rather than unmapping
                // them, so the next call takes no page faults: ~4 us a call instead of ~8.
                .linear_memory_keep_resident(KEEP_RESIDENT)
                .table_keep_resident(KEEP_RESIDENT)
                .pagemap_scan(Enabled::Auto)
                .max_unused_warm_slots(WARM_SLOTS.min(instances));
            config.allocation_strategy(InstanceAllocationStrategy::Pooling(pool));
        }
        let engine = Engine::new(&config).map_err(|e| Error::runtime(format!("wasm engine: {e}")))?;
        let mut linker = Linker::new(&engine);
        host::define_imports(&mut linker).map_err(|e| Error::runtime(format!("wasm imports: {e}")))?;
        Ok(Runtime {
            engine,
            linker,
            limits,
            compiled: Mutex::default(),
            modules: Mutex::default(),
        })
    }

    pub fn limits(&self) -> &Limits {
        &self.limits
    }

    fn compile(&self, type_name: &str, code: &[u8]) -> Result<Arc<Compiled>, Error> {
        let refuse = |what: String| Error::bad_args(format!("{type_name} cannot be loaded: {what}"));
        if code.len() > self.limits.module_bytes {
            return Err(refuse(format!(
                "the module is too large: {} bytes, the limit is {} bytes",
                code.len(),
                self.limits.module_bytes
            )));
        }
        if !code.starts_with(b"\0asm") {
            return Err(refuse(
                "not a WebAssembly module (no \\0asm header); compile it to a .wasm binary".into(),
            ));
        }
        let module = wasmtime::Module::new(&self.engine, code)
            .map_err(|e| refuse(format!("the module does not compile: {e:#}")))?;
        let exports = abi::check(type_name, &module, self.limits.memory_bytes)?;
        let pre = self
            .linker
            .instantiate_pre(&module)
            .map_err(|e| refuse(format!("{e:#}")))?;
        Ok(Arc::new(Compiled::new(pre, exports)))
    }
}

impl Library for Runtime {
    /// Compile `code` once per distinct bytes (the cache key is their sha256; `version` only
    /// names them, the bytes are what counts). A module that breaks the ABI is refused with
    /// `ErrorKind::BadArguments` and a message that names the problem.
    fn load(&self, type_name: &str, _version: &str, code: &[u8]) -> Result<Arc<dyn Code>, Error> {
        let digest: Sha256Digest = Sha256::digest(code).into();
        let key = (digest, type_name.to_string());
        if let Some(module) = self
            .modules
            .lock()
            .expect("module cache")
            .get(&key)
            .and_then(Weak::upgrade)
        {
            return Ok(module as Arc<dyn Code>);
        }
        let cached = self
            .compiled
            .lock()
            .expect("code cache")
            .get(&digest)
            .and_then(Weak::upgrade);
        // Compiling takes milliseconds: never under the lock. Two threads loading the same
        // new bytes at once both compile, and the first to finish wins.
        let compiled = match cached {
            Some(compiled) => compiled,
            None => {
                let compiled = self.compile(type_name, code)?;
                cache(&self.compiled, digest, compiled)
            }
        };
        let module = cache(
            &self.modules,
            key,
            Arc::new(Module::new(type_name, compiled, self.limits)),
        );
        Ok(module)
    }
}

/// The live value under `key` in `cache`, else `value` (put there). Entries whose value is
/// gone are dropped on the way, so the cache holds only what something else holds.
fn cache<K: Eq + std::hash::Hash, V>(cache: &Mutex<HashMap<K, Weak<V>>>, key: K, value: Arc<V>) -> Arc<V> {
    let mut cache = cache.lock().expect("wasm cache");
    if let Some(live) = cache.get(&key).and_then(Weak::upgrade) {
        return live;
    }
    cache.retain(|_, held| held.strong_count() > 0);
    cache.insert(key, Arc::downgrade(&value));
    value
}

impl Runtime {
    /// Modules loaded and still held by something: the compiled code in memory.
    pub fn modules_held(&self) -> usize {
        let modules = self.modules.lock().expect("module cache");
        modules.values().filter(|held| held.strong_count() > 0).count()
    }
}

impl std::fmt::Debug for Runtime {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Runtime")
            .field("limits", &self.limits)
            .finish_non_exhaustive()
    }
}

// The server calls from several partition threads at once.
const _: () = {
    const fn send_sync<T: Send + Sync>() {}
    send_sync::<Runtime>();
    send_sync::<Module>();
};
