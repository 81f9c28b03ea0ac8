//! Spindle's WebAssembly runtime: compiled object types (`wasm:<name>`) whose methods run in
//! the server, next to the object, at the cost of a function call rather than a round trip to
//! an object host.
//!
//! A compiled type is a WebAssembly module. Its exported functions are the object's methods;
//! the object's state is a byte string that the partition keeps (in snapshots, the op log and
//! replication, like any object) and that the module reads and rewrites whole through a
//! handful of imports. The ABI is in [`abi`] and, from the guest's side, in docs/wasm.md.
//!
//! ```text
//! partition apply ──call(state, "deposit", [5])──► Module ──fresh instance──► guest
//!                 ◄──Called { result, state }────         ◄─reply / state_write─┘
//! ```
//!
//! Three properties the rest of the server relies on:
//!
//! * **Deterministic.** Replicas and the op-log replay run every call again and must agree. A
//!   guest sees only its state and its arguments (no clock, no randomness, no WASI); NaNs are
//!   canonicalized; threads and relaxed SIMD are off; limits count instructions (fuel), not
//!   time.
//! * **Isolated.** Every call runs on a fresh instance, so nothing leaks between calls or
//!   objects, and an error of any kind (a trap, a limit, `fail`, an ABI breach) returns `Err`
//!   with the old state untouched.
//! * **Bounded.** [`Limits`] caps the instructions, memory and stack of a call, the size of a
//!   module and of a state.
//!
//! [`Runtime`] compiles each module once (cached by the sha256 of its bytes) and implements
//! `spindle_core::objects::compiled::Library`; the [`Module`] it returns implements `Code`.

pub mod abi;
mod host;
mod module;
mod runtime;

pub use module::Module;
pub use runtime::{Allocator, Limits, Runtime};
