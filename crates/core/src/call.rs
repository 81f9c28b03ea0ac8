//! Who is calling, and where the answer goes.

use std::sync::Arc;

use crate::{Error, Value};

/// A connection as the server numbers them. Parked calls and held locks are tied to it.
pub type ConnId = u64;

/// Identifies one in-flight call: the connection it came on and its request id there.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Token {
    pub conn: ConnId,
    pub req: u64,
}

/// The caller of a method: its connection, its session (client id) and the thread inside
/// that client. Lock ownership uses `(client, thread)`; disconnect clean-up uses `conn`.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Caller {
    pub conn: ConnId,
    pub client: Arc<str>,
    pub thread: u64,
}

pub type Reply = Result<Value, Error>;

/// A reply to send to the call identified by `token`.
#[derive(Clone, Debug, PartialEq)]
pub struct Delivery {
    pub token: Token,
    pub reply: Reply,
}
