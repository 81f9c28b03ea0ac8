//! The Spindle wire protocol (docs/protocol.md): length-prefixed MessagePack frames,
//! typed requests, and encoded replies. No I/O runtime here: the server drives these
//! functions over tokio sockets, the CLI over blocking std sockets.

pub mod frame;
pub mod reply;
pub mod request;
pub mod session;
pub mod values;

pub use frame::{encode_frame, read_frame, split_frame, write_frame, FrameError, Split, DEFAULT_MAX_FRAME, HEADER_LEN};
pub use reply::{encode_error_reply, encode_reply, reply_frame};
pub use request::{
    decode_request, parse_request, CallsAction, Request, RequestError, TxnRef, CLUSTER_FORMAT, PROTOCOL_VERSION,
};
pub use session::{session_id, unnamed_key, MIN_SECRET_LEN, SECRET_SESSION_PREFIX};
pub use values::count_values;

/// The shared objects that are shell commands (`counter -n c increment`): the `spindle`
/// binary runs one when started under its name, and the server puts them on the `PATH` of
/// shell functions (docs/shell.md).
pub const SHELL_OBJECT_COMMANDS: [&str; 11] = [
    "counter",
    "map",
    "treemap",
    "list",
    "barrier",
    "rdv",
    "pipe",
    "semaphore",
    "latch",
    "queue",
    "blob",
];
