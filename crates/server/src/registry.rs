//! Where replies go: every connection has an [`Outbox`] that its writer task drains, and the
//! registry finds the outbox of any connection so a call can wake waiters parked elsewhere.
//!
//! One party at a time holds the right to write to the socket: the connection's reader, which
//! writes its own replies straight away when nothing else is queued (no task hop on the hot
//! path), or the writer task, which sends everything else.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, RwLock};

use spindle_core::{ConnId, Delivery, Error, ErrorKind, Reply};
use tokio::sync::Notify;

/// Encoded reply frames waiting for a connection's writer task. Replies are appended as
/// bytes, so the writer sends everything queued in one `write` call.
pub(crate) struct Outbox {
    state: Mutex<OutboxState>,
    /// Wakes the writer: bytes were queued or the connection is closing.
    ready: Notify,
    /// Wakes a reader throttled because the client does not read its replies.
    drained: Notify,
}

#[derive(Default)]
pub(crate) struct OutboxState {
    pub(crate) bytes: Vec<u8>,
    /// Someone is writing to the socket; queued bytes wait for them to finish.
    writing: bool,
    /// No more replies will come: the writer flushes what is queued and exits.
    closing: bool,
    /// The socket failed; queued and future bytes are dropped.
    dead: bool,
}

/// What the writer should do next.
pub(crate) enum Drain {
    /// Bytes to send (swapped out of the outbox).
    Write,
    /// Nothing queued yet.
    Wait,
    /// Nothing queued and the connection is closing.
    Finish,
}

impl Outbox {
    pub(crate) fn new() -> Self {
        Outbox {
            state: Mutex::new(OutboxState::default()),
            ready: Notify::new(),
            drained: Notify::new(),
        }
    }

    fn lock(&self) -> MutexGuard<'_, OutboxState> {
        // The state is plain bytes and flags, valid even if a holder panicked.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Append already-encoded frames, leaving `frames` empty. Returns how many bytes are now
    /// waiting for the writer.
    pub(crate) fn push_frames(&self, frames: &mut Vec<u8>) -> usize {
        let mut state = self.lock();
        if state.dead {
            frames.clear();
            return 0;
        }
        if state.bytes.is_empty() {
            // The usual case: hand the buffer over instead of copying it.
            std::mem::swap(&mut state.bytes, frames);
        } else {
            state.bytes.extend_from_slice(frames);
            frames.clear();
        }
        let pending = state.bytes.len();
        drop(state);
        self.ready.notify_one();
        pending
    }

    /// Encode and append one reply.
    pub(crate) fn push_reply(&self, id: u64, reply: &Reply) {
        let mut state = self.lock();
        if state.dead {
            return;
        }
        spindle_proto::encode_reply(id, reply, &mut state.bytes);
        drop(state);
        self.ready.notify_one();
    }

    /// Bytes queued and not yet handed to the writer.
    pub(crate) fn pending(&self) -> usize {
        self.lock().bytes.len()
    }

    /// Swap the queued bytes into `into` (which must be empty) so they can be written
    /// without holding the lock.
    pub(crate) fn take(&self, into: &mut Vec<u8>) -> Drain {
        let mut state = self.lock();
        if state.writing {
            // The reader is writing directly; it wakes us when it is done.
            Drain::Wait
        } else if !state.bytes.is_empty() {
            std::mem::swap(&mut state.bytes, into);
            state.writing = true;
            Drain::Write
        } else if state.closing || state.dead {
            Drain::Finish
        } else {
            Drain::Wait
        }
    }

    /// The writer task sent what [`take`](Self::take) gave it.
    pub(crate) fn written(&self) {
        self.lock().writing = false;
    }

    /// Claim the socket for a direct write: only when nothing is queued or being written,
    /// so bytes leave in the order they were produced.
    pub(crate) fn claim(&self) -> bool {
        let mut state = self.lock();
        if state.writing || state.dead || !state.bytes.is_empty() {
            return false;
        }
        state.writing = true;
        true
    }

    /// End a direct write; what the socket did not take goes first in the queue.
    /// Returns how many bytes wait for the writer task.
    pub(crate) fn release(&self, unwritten: &[u8]) -> usize {
        let mut state = self.lock();
        state.writing = false;
        if state.dead {
            return 0;
        }
        if !unwritten.is_empty() {
            state.bytes.splice(0..0, unwritten.iter().copied());
        }
        let pending = state.bytes.len();
        drop(state);
        if pending > 0 {
            self.ready.notify_one();
        }
        pending
    }

    pub(crate) async fn wait_ready(&self) {
        self.ready.notified().await
    }

    pub(crate) fn notify_drained(&self) {
        self.drained.notify_one();
    }

    pub(crate) async fn wait_drained(&self) {
        self.drained.notified().await
    }

    /// The reader is done: flush what is queued, then close.
    pub(crate) fn close(&self) {
        self.lock().closing = true;
        self.ready.notify_one();
    }

    /// The socket failed: drop what is queued and refuse more.
    pub(crate) fn kill(&self) {
        let mut state = self.lock();
        state.dead = true;
        state.bytes = Vec::new();
        drop(state);
        // A reader throttled on this outbox must not wait forever.
        self.drained.notify_one();
    }
}

/// Live connections by id.
pub(crate) struct Registry {
    outboxes: RwLock<HashMap<ConnId, Arc<Outbox>>>,
    next_id: AtomicU64,
}

impl Registry {
    pub(crate) fn new() -> Self {
        Registry {
            outboxes: RwLock::new(HashMap::new()),
            // Connection 0 is the partitions' "system" caller; real ones start at 1.
            next_id: AtomicU64::new(1),
        }
    }

    /// Number connections from now on above `id` (the connections named in a recovered op
    /// log belonged to the previous server).
    pub(crate) fn start_after(&self, id: ConnId) {
        self.next_id.fetch_max(id + 1, Ordering::Relaxed);
    }

    /// Number a new connection and register its outbox.
    pub(crate) fn register(&self, outbox: Arc<Outbox>) -> ConnId {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        self.outboxes
            .write()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(id, outbox);
        id
    }

    pub(crate) fn unregister(&self, id: ConnId) {
        self.outboxes
            .write()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(&id);
    }

    /// Queue already-encoded frames for connection `id`. Returns false if it is closed.
    pub(crate) fn send(&self, id: ConnId, frames: &mut Vec<u8>) -> bool {
        let outboxes = self.outboxes.read().unwrap_or_else(PoisonError::into_inner);
        match outboxes.get(&id) {
            Some(outbox) => {
                outbox.push_frames(frames);
                true
            }
            None => false,
        }
    }

    /// Send replies produced outside any connection's own call (timeouts, waiters woken by
    /// another connection, session ends). Replies for closed connections are dropped.
    pub(crate) fn deliver(&self, deliveries: impl IntoIterator<Item = Delivery>) {
        let outboxes = self.outboxes.read().unwrap_or_else(PoisonError::into_inner);
        for d in deliveries {
            if let Err(e) = &d.reply {
                log_error_reply(d.token.conn, d.token.req, e);
            }
            match outboxes.get(&d.token.conn) {
                Some(outbox) => outbox.push_reply(d.token.req, &d.reply),
                None => tracing::debug!(
                    conn = d.token.conn,
                    id = d.token.req,
                    "reply for a closed connection dropped"
                ),
            }
        }
    }
}

/// One log line per error reply: client faults at warn, failures a caller should look into
/// at info, and outcomes that are ordinary control flow (an empty queue, a timed-out wait,
/// a missing key, an exception a user-defined method raised) at debug, so a busy server's log is not flooded by `get_nowait`.
pub(crate) fn log_error_reply(conn: ConnId, id: u64, e: &Error) {
    let kind = e.kind.as_str();
    match e.kind {
        ErrorKind::ProtocolError | ErrorKind::FrameTooLarge | ErrorKind::NoSession | ErrorKind::Unauthorized => {
            tracing::warn!(conn, id, kind, "{}", e.message)
        }
        ErrorKind::Internal => tracing::error!(conn, id, kind, "{}", e.message),
        ErrorKind::Empty
        | ErrorKind::Full
        | ErrorKind::Timeout
        | ErrorKind::KeyError
        | ErrorKind::IndexError
        | ErrorKind::BrokenBarrier
        | ErrorKind::Cancelled
        | ErrorKind::FutureException
        | ErrorKind::Raised
        | ErrorKind::Moved => tracing::debug!(conn, id, kind, "{}", e.message),
        _ => tracing::info!(conn, id, kind, "{}", e.message),
    }
}
