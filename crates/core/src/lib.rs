//! Spindle's object model as a pure state machine.
//!
//! Nothing in this crate does I/O or reads a clock: time comes in as an argument,
//! replies go out as [`Delivery`] values. The server feeds calls in from the network;
//! later the op-log replay and every Raft replica feed the very same [`Partition`].

pub mod call;
pub mod error;
pub mod object;
pub mod objects;
pub mod op;
pub mod partition;
pub mod record;
pub mod value;

pub use call::{Caller, ConnId, Delivery, Reply, Token};
pub use error::{Error, ErrorKind};
pub use object::{Ctx, Object, Step};
pub use partition::{Detached, Partition};
pub use rmpv::Value;

#[cfg(test)]
mod replay_tests;
