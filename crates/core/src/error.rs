//! Errors that travel back to the caller. Each kind maps to one exception in every SDK
//! (see docs/protocol.md, "Errors").

use std::fmt;

use crate::Value;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ErrorKind {
    ProtocolError,
    FrameTooLarge,
    NoSession,
    UnknownType,
    UnknownMethod,
    TypeMismatch,
    NotFound,
    BadArguments,
    KeyError,
    IndexError,
    ValueError,
    OverflowError,
    RuntimeError,
    Timeout,
    BrokenBarrier,
    Empty,
    Full,
    InvalidState,
    Cancelled,
    FutureException,
    Moved,
    Busy,
    Internal,
    /// A function's worker process died during the call.
    WorkerCrashed,
    /// A function ran past its timeout.
    FunctionTimeout,
    /// Authentication failed (no token, or a wrong one), or the operation needs it.
    Unauthorized,
    /// The session's user may not do this operation on this name (its roles do not allow it).
    PermissionDenied,
    /// A user-defined object's method (or constructor) raised.
    Raised,
    /// A user-defined object's host died or was restarted.
    ObjectLost,
    /// The op log could not be written (disk full, I/O error): the call's effect is not durable.
    StorageError,
    /// In a cluster: this node does not lead the call's shard; `data` is the leader's
    /// address (nil while no leader is known). The call did not run here.
    NotLeader,
    /// The server's objects hold more bytes than `--max-memory`: a call that may grow an
    /// object (or create one) is refused until objects are deleted or the limit raised.
    OutOfMemory,
    /// A transaction lost an object to an older one, or read an object changed since: it
    /// was aborted and left nothing behind. Running it again may succeed.
    TransactionConflict,
    /// A transaction cannot go on as asked: a call that would block, a limit passed, a
    /// transaction that ended or expired. It was aborted and left nothing behind.
    TransactionError,
    /// A compiled (WebAssembly) method trapped or passed a limit (fuel, memory, stack); `data`
    /// is `{"reason": "trap" | "fuel" | "memory" | "stack"}`. The object is as it was.
    Trapped,
    /// Inside the server only, never sent: a compiled method called another object (`data`
    /// is `[key, method, args]`) and needs that call's reply, which the server's driver of
    /// nested calls runs before it runs the method again (`calls::nested`).
    NestedCall,
}

impl ErrorKind {
    /// Every kind, in declaration order.
    pub const ALL: [ErrorKind; 36] = [
        ErrorKind::ProtocolError,
        ErrorKind::FrameTooLarge,
        ErrorKind::NoSession,
        ErrorKind::UnknownType,
        ErrorKind::UnknownMethod,
        ErrorKind::TypeMismatch,
        ErrorKind::NotFound,
        ErrorKind::BadArguments,
        ErrorKind::KeyError,
        ErrorKind::IndexError,
        ErrorKind::ValueError,
        ErrorKind::OverflowError,
        ErrorKind::RuntimeError,
        ErrorKind::Timeout,
        ErrorKind::BrokenBarrier,
        ErrorKind::Empty,
        ErrorKind::Full,
        ErrorKind::InvalidState,
        ErrorKind::Cancelled,
        ErrorKind::FutureException,
        ErrorKind::Moved,
        ErrorKind::Busy,
        ErrorKind::Internal,
        ErrorKind::WorkerCrashed,
        ErrorKind::FunctionTimeout,
        ErrorKind::Unauthorized,
        ErrorKind::PermissionDenied,
        ErrorKind::Raised,
        ErrorKind::ObjectLost,
        ErrorKind::StorageError,
        ErrorKind::NotLeader,
        ErrorKind::OutOfMemory,
        ErrorKind::TransactionConflict,
        ErrorKind::TransactionError,
        ErrorKind::Trapped,
        ErrorKind::NestedCall,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            ErrorKind::ProtocolError => "ProtocolError",
            ErrorKind::FrameTooLarge => "FrameTooLarge",
            ErrorKind::NoSession => "NoSession",
            ErrorKind::UnknownType => "UnknownType",
            ErrorKind::UnknownMethod => "UnknownMethod",
            ErrorKind::TypeMismatch => "TypeMismatch",
            ErrorKind::NotFound => "NotFound",
            ErrorKind::BadArguments => "BadArguments",
            ErrorKind::KeyError => "KeyError",
            ErrorKind::IndexError => "IndexError",
            ErrorKind::ValueError => "ValueError",
            ErrorKind::OverflowError => "OverflowError",
            ErrorKind::RuntimeError => "RuntimeError",
            ErrorKind::Timeout => "Timeout",
            ErrorKind::BrokenBarrier => "BrokenBarrier",
            ErrorKind::Empty => "Empty",
            ErrorKind::Full => "Full",
            ErrorKind::InvalidState => "InvalidState",
            ErrorKind::Cancelled => "Cancelled",
            ErrorKind::FutureException => "FutureException",
            ErrorKind::Moved => "Moved",
            ErrorKind::Busy => "Busy",
            ErrorKind::Internal => "Internal",
            ErrorKind::WorkerCrashed => "WorkerCrashed",
            ErrorKind::FunctionTimeout => "FunctionTimeout",
            ErrorKind::Unauthorized => "Unauthorized",
            ErrorKind::PermissionDenied => "PermissionDenied",
            ErrorKind::Raised => "Raised",
            ErrorKind::ObjectLost => "ObjectLost",
            ErrorKind::StorageError => "StorageError",
            ErrorKind::NotLeader => "NotLeader",
            ErrorKind::OutOfMemory => "OutOfMemory",
            ErrorKind::TransactionConflict => "TransactionConflict",
            ErrorKind::TransactionError => "TransactionError",
            ErrorKind::Trapped => "Trapped",
            ErrorKind::NestedCall => "NestedCall",
        }
    }

    /// The kind named `name` on the wire (a worker's error reply carries it back).
    pub fn from_name(name: &str) -> Option<ErrorKind> {
        ErrorKind::ALL.into_iter().find(|k| k.as_str() == name)
    }
}

/// An error reply: a kind, a human message, and optional data (the stored exception of a
/// `Future`, the new key of a moved object, the offending key of a `KeyError`).
#[derive(Clone, Debug, PartialEq)]
pub struct Error {
    pub kind: ErrorKind,
    pub message: String,
    pub data: Value,
}

impl Error {
    pub fn new(kind: ErrorKind, message: impl Into<String>) -> Self {
        Error {
            kind,
            message: message.into(),
            data: Value::Nil,
        }
    }

    pub fn with_data(mut self, data: Value) -> Self {
        self.data = data;
        self
    }

    pub fn bad_args(message: impl Into<String>) -> Self {
        Error::new(ErrorKind::BadArguments, message)
    }

    pub fn value(message: impl Into<String>) -> Self {
        Error::new(ErrorKind::ValueError, message)
    }

    pub fn runtime(message: impl Into<String>) -> Self {
        Error::new(ErrorKind::RuntimeError, message)
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.kind.as_str(), self.message)
    }
}

impl std::error::Error for Error {}

#[cfg(test)]
mod tests {
    use super::ErrorKind;

    #[test]
    fn every_kind_round_trips_by_name() {
        for kind in ErrorKind::ALL {
            assert_eq!(ErrorKind::from_name(kind.as_str()), Some(kind));
        }
        assert_eq!(ErrorKind::from_name("Nope"), None);
    }
}
