//! Where replies go: every connection has an [`Outbox`] in front of its socket, and the
//! registry finds the outbox of any connection so a call can wake waiters parked elsewhere.
//!
//! One party at a time holds the right to write to the socket. Whoever produces frames (the
//! connection's own reader, or any task sending to it: a forwarded call, a host's answer, a
//! woken waiter) writes them straight to the socket when nothing is queued and nobody is
//! writing, with a non-blocking `try_write` (no task hop on the hot path); what the socket
//! does not take is queued, and the connection's writer task sends the queue, waiting for
//! the socket to be writable.
//!
//! A TLS connection has no direct path: a record written in part cannot be finished without
//! waiting, so its writer task alone writes, encrypting every batch in one go.

use ahash::HashMap;
use std::collections::VecDeque;
use std::io;
use std::net::IpAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, RwLock};

use spindle_core::{ConnId, Delivery, Reply, Value};

use crate::audit::Audit;
use tokio::io::{AsyncWrite, AsyncWriteExt};
use tokio::net::tcp::OwnedWriteHalf;
use tokio::sync::{oneshot, Notify};

/// A queue of encoded frames in front of a connection's socket. Frames are appended as
/// bytes to chunks of up to [`CHUNK`], so the writer sends many in each `write` call.
pub(crate) struct Outbox {
    state: Mutex<OutboxState>,
    /// Wakes the writer: bytes were queued or the connection is closing.
    ready: Notify,
    /// Wakes a reader throttled because the client does not read its replies.
    drained: Notify,
    /// Wakes the reader when the outbox dies (the socket failed, or too much waited).
    died: Notify,
    /// Queued bytes past which the connection is closed (`--output-hard-limit`).
    hard_limit: usize,
    /// Replies others sent here (see [`Registry::deliver`]): with the ones its reader sent,
    /// they tell whether the connection has a request in flight.
    delivered: AtomicU64,
    /// The client's address, for the log of the errors others' calls answer it.
    peer: IpAddr,
}

#[derive(Default)]
struct OutboxState {
    bytes: Queued,
    /// Someone is writing to the socket; queued bytes wait for them to finish.
    writing: bool,
    /// No more replies will come: the writer flushes what is queued and exits.
    closing: bool,
    /// The socket failed; queued and future bytes are dropped.
    dead: bool,
    /// It died of too many unread replies.
    overflowed: bool,
    /// The socket, for direct writes; let go when the connection closes, so that the writer
    /// task holds the last handle and the write side shuts down after the queue is sent.
    socket: Option<Arc<OwnedWriteHalf>>,
}

/// Queued frames are appended to the last chunk while it stays under this size; a larger
/// frame is a chunk of its own.
const CHUNK: usize = 256 * 1024;

/// Frames waiting for the writer, in chunks: a backlog grows without copying itself into
/// ever larger buffers (each doubling would hold the old copy and the new one at once).
#[derive(Default)]
struct Queued {
    chunks: VecDeque<Vec<u8>>,
    len: usize,
}

impl Queued {
    fn len(&self) -> usize {
        self.len
    }

    fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Queue `frames` last, leaving it empty.
    fn push_back(&mut self, frames: &mut Vec<u8>) {
        self.len += frames.len();
        match self.chunks.back_mut() {
            Some(last) if last.len() + frames.len() <= CHUNK => {
                last.extend_from_slice(frames);
                frames.clear();
            }
            _ => self.chunks.push_back(std::mem::take(frames)),
        }
    }

    /// Queue `bytes` first.
    fn push_front(&mut self, bytes: Vec<u8>) {
        self.len += bytes.len();
        self.chunks.push_front(bytes);
    }
}

/// What the writer should do next.
enum Drain {
    /// Bytes to send (swapped out of the outbox).
    Write,
    /// Nothing queued yet.
    Wait,
    /// Nothing queued and the connection is closing.
    Finish,
}

impl Outbox {
    /// An outbox whose frames go to `socket` directly when it is free; without one, every
    /// frame goes through the writer task.
    /// More than `hard_limit` bytes queued kills it. `peer`: the client's address.
    pub(crate) fn new(socket: Option<Arc<OwnedWriteHalf>>, hard_limit: usize, peer: IpAddr) -> Self {
        Outbox {
            state: Mutex::new(OutboxState {
                socket,
                ..OutboxState::default()
            }),
            ready: Notify::new(),
            drained: Notify::new(),
            died: Notify::new(),
            hard_limit,
            delivered: AtomicU64::new(0),
            peer,
        }
    }

    fn lock(&self) -> MutexGuard<'_, OutboxState> {
        // The state is plain bytes and flags, valid even if a holder panicked.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Send already-encoded frames of the connection's own reader, leaving `frames` empty
    /// (its allocation may be swapped for another). When nothing is queued and nobody is
    /// writing, they go straight to the socket, as much of them as it takes without
    /// blocking; the rest is queued behind anything queued before, for the writer task.
    /// Never blocks (a lock held by the caller, such as a shard's, stays short). Returns how
    /// many bytes now wait for the writer (0 when `frames` is empty: nothing was sent, so
    /// nothing to throttle): the reader stops reading past its soft limit.
    pub(crate) fn push_frames(&self, frames: &mut Vec<u8>) -> usize {
        self.push(frames, false)
    }

    /// Send frames others produced for this connection (a woken waiter's reply, a task):
    /// they cannot wait, so a connection already over the hard limit behind is closed
    /// instead (as Redis's `client-output-buffer-limit`), rather than given the server's
    /// memory.
    pub(crate) fn push_delivered(&self, frames: &mut Vec<u8>) {
        self.push(frames, true);
    }

    fn push(&self, frames: &mut Vec<u8>, delivered: bool) -> usize {
        if frames.is_empty() {
            return 0;
        }
        let mut state = self.lock();
        if state.dead {
            frames.clear();
            return 0;
        }
        if delivered && state.bytes.len() > self.hard_limit {
            state.overflowed = true;
            drop(state);
            frames.clear();
            self.kill();
            return 0;
        }
        let socket = match &state.socket {
            Some(socket) if !state.writing && state.bytes.is_empty() => socket.clone(),
            _ => {
                // Busy (or closing): queue behind what is there.
                state.bytes.push_back(frames);
                let pending = state.bytes.len();
                drop(state);
                self.ready.notify_one();
                return pending;
            }
        };
        state.writing = true;
        drop(state);
        let written = try_write_all(&socket, frames);
        drop(socket);
        match written {
            Ok(n) => self.release(frames, n),
            Err(e) => {
                tracing::debug!("write failed, dropping further frames: {e}");
                frames.clear();
                self.kill();
                0
            }
        }
    }

    /// End a direct write that sent `frames[..written]`: the rest goes first in the queue,
    /// before what others queued meanwhile. Leaves `frames` empty; returns how many bytes
    /// wait for the writer task.
    fn release(&self, frames: &mut Vec<u8>, written: usize) -> usize {
        let mut state = self.lock();
        state.writing = false;
        if state.dead {
            frames.clear();
            drop(state);
            self.ready.notify_one();
            return 0;
        }
        if written < frames.len() {
            frames.drain(..written);
            state.bytes.push_front(std::mem::take(frames));
        }
        frames.clear();
        let pending = state.bytes.len();
        // Queued while we wrote, or left over, or closed meanwhile: the writer's turn (a
        // writer that found us writing has used up its wake-up and waits for this one).
        let wake = pending > 0 || state.closing;
        drop(state);
        if wake {
            self.ready.notify_one();
        }
        pending
    }

    /// Bytes queued and not yet handed to the writer.
    pub(crate) fn pending(&self) -> usize {
        self.lock().bytes.len()
    }

    /// Swap the queued chunks into `into` (which must be empty) so they can be written
    /// without holding the lock.
    fn take(&self, into: &mut VecDeque<Vec<u8>>) -> Drain {
        let mut state = self.lock();
        if state.writing {
            // Someone is writing directly; they wake us if they leave bytes behind.
            Drain::Wait
        } else if !state.bytes.is_empty() {
            std::mem::swap(&mut state.bytes.chunks, into);
            state.bytes.len = 0;
            state.writing = true;
            Drain::Write
        } else if state.closing || state.dead {
            Drain::Finish
        } else {
            Drain::Wait
        }
    }

    /// The writer task sent what [`take`](Self::take) gave it.
    fn written(&self) {
        self.lock().writing = false;
    }

    async fn wait_ready(&self) {
        self.ready.notified().await
    }

    fn notify_drained(&self) {
        self.drained.notify_one();
    }

    pub(crate) async fn wait_drained(&self) {
        self.drained.notified().await
    }

    /// Returns when the outbox dies (ask [`death`](Self::death) how), or died since the
    /// last call.
    pub(crate) async fn died(&self) {
        self.died.notified().await
    }

    /// `Some(overflowed)` once the outbox is dead.
    pub(crate) fn death(&self) -> Option<bool> {
        let state = self.lock();
        state.dead.then_some(state.overflowed)
    }

    /// Replies sent here by others so far.
    pub(crate) fn delivered(&self) -> u64 {
        self.delivered.load(Ordering::Relaxed)
    }

    /// The reader is done: flush what is queued, then close. Only the writer task writes
    /// from now on, and the write side shuts down when it lets go of the socket.
    pub(crate) fn close(&self) {
        let mut state = self.lock();
        state.closing = true;
        let socket = state.socket.take();
        drop(state);
        drop(socket);
        self.ready.notify_one();
    }

    /// The socket failed (whoever was writing gives up the socket): drop what is queued and
    /// refuse more.
    pub(crate) fn kill(&self) {
        let mut state = self.lock();
        state.dead = true;
        state.writing = false;
        state.bytes = Queued::default();
        let socket = state.socket.take();
        drop(state);
        drop(socket);
        // The writer task exits, and the reader stops, throttled on this outbox or not.
        self.ready.notify_one();
        self.drained.notify_one();
        self.died.notify_one();
    }
}

/// What a connection's writer task writes to.
pub(crate) enum Sink {
    /// A plain socket, which producers also write to directly (the outbox holds it too).
    Socket(Arc<OwnedWriteHalf>),
    /// Any other stream (TLS), written by the writer task alone.
    Stream(Box<dyn AsyncWrite + Send + Unpin>),
}

impl Sink {
    async fn write_all(&mut self, chunks: &VecDeque<Vec<u8>>) -> io::Result<()> {
        match self {
            Sink::Socket(socket) => {
                for chunk in chunks {
                    write_all(socket, chunk).await?;
                }
                Ok(())
            }
            Sink::Stream(stream) => {
                for chunk in chunks {
                    stream.write_all(chunk).await?;
                }
                stream.flush().await
            }
        }
    }
}

/// How long a closing TLS connection may take to send its `close_notify`.
const SHUTDOWN_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(5);

/// Send queued replies until the connection closes; many replies leave in each write.
pub(crate) async fn write_loop(mut sink: Sink, outbox: Arc<Outbox>, conn: ConnId) {
    let mut batch = VecDeque::new();
    loop {
        match outbox.take(&mut batch) {
            Drain::Write => {
                if let Err(e) = sink.write_all(&batch).await {
                    tracing::debug!(conn, "write failed, dropping further replies: {e}");
                    outbox.kill();
                    return;
                }
                outbox.written();
                batch.clear();
                outbox.notify_drained();
            }
            Drain::Wait => outbox.wait_ready().await,
            // Dropping the last handle of the write half shuts it down (FIN after the data);
            // a TLS stream says `close_notify` first.
            Drain::Finish => {
                if let Sink::Stream(stream) = &mut sink {
                    let _ = tokio::time::timeout(SHUTDOWN_TIMEOUT, stream.shutdown()).await;
                }
                return;
            }
        }
    }
}

async fn write_all(socket: &OwnedWriteHalf, mut bytes: &[u8]) -> io::Result<()> {
    while !bytes.is_empty() {
        socket.writable().await?;
        match socket.try_write(bytes) {
            Ok(n) => bytes = &bytes[n..],
            Err(e) if matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted) => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// Write as much of `bytes` as the socket takes without blocking; returns how much it took.
fn try_write_all(socket: &OwnedWriteHalf, bytes: &[u8]) -> io::Result<usize> {
    let mut written = 0;
    while written < bytes.len() {
        match socket.try_write(&bytes[written..]) {
            Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
            Ok(n) => written += n,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(written)
}

/// Where the replies of a front end without a socket of its own go (HTTP): each request
/// waits on a one-shot channel of its own, found by its request id. A reply nobody waits
/// for any more (the request gave up) is dropped.
#[derive(Default)]
pub(crate) struct Mailbox {
    waiting: Mutex<HashMap<u64, Waiting>>,
}

/// A request waiting for its reply, and the output pushed to it meanwhile (a function's:
/// the gateway forwards at most `gateway::output::LIVE_LIMIT` bytes of it).
struct Waiting {
    reply: oneshot::Sender<(Reply, Output)>,
    output: Output,
}

/// What a function printed, by stream.
#[derive(Debug, Default)]
pub(crate) struct Output {
    pub(crate) stdout: Vec<u8>,
    pub(crate) stderr: Vec<u8>,
}

impl Mailbox {
    fn lock(&self) -> MutexGuard<'_, HashMap<u64, Waiting>> {
        self.waiting.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Wait for the reply to request `req`, with the output pushed to it before (ask before
    /// the request is made: it may be answered at once).
    pub(crate) fn expect(&self, req: u64) -> oneshot::Receiver<(Reply, Output)> {
        let (reply, rx) = oneshot::channel();
        let output = Output::default();
        self.lock().insert(req, Waiting { reply, output });
        rx
    }

    /// Nobody waits for request `req` any more.
    pub(crate) fn forget(&self, req: u64) {
        self.lock().remove(&req);
    }

    fn post(&self, req: u64, reply: Reply) {
        if let Some(waiting) = self.lock().remove(&req) {
            let _ = waiting.reply.send((reply, waiting.output));
        }
    }

    /// A push to request `req`: its output chunks (`{"stdout"|"stderr": bytes}`) are kept as
    /// bytes; other pushes (a call queued, started) are not needed here.
    fn push(&self, req: u64, value: &Value) {
        let Value::Map(entries) = value else { return };
        let mut waiting = self.lock();
        let Some(output) = waiting.get_mut(&req).map(|w| &mut w.output) else {
            return;
        };
        for (stream, bytes) in entries {
            let into = match stream.as_str() {
                Some("stdout") => &mut output.stdout,
                Some("stderr") => &mut output.stderr,
                _ => continue,
            };
            into.extend_from_slice(bytes.as_slice().unwrap_or_default());
        }
    }
}

/// Live connections by id.
pub(crate) struct Registry {
    outboxes: RwLock<HashMap<ConnId, Arc<Outbox>>>,
    /// Front ends answered in process, by the connection id their calls carry.
    mailboxes: RwLock<HashMap<ConnId, Arc<Mailbox>>>,
    next_id: AtomicU64,
    /// Where the errors delivered are logged.
    audit: Arc<Audit>,
}

impl Registry {
    pub(crate) fn new(audit: Arc<Audit>) -> Self {
        Registry {
            outboxes: RwLock::new(HashMap::default()),
            mailboxes: RwLock::new(HashMap::default()),
            audit,
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

    /// Number a front end answered in process and register its mailbox (for the server's
    /// life).
    pub(crate) fn register_mailbox(&self, mailbox: Arc<Mailbox>) -> ConnId {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        self.mailboxes
            .write()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(id, mailbox);
        id
    }

    pub(crate) fn unregister(&self, id: ConnId) {
        self.outboxes
            .write()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(&id);
    }

    /// Send already-encoded frames to connection `id` (see [`Outbox::push_frames`]: straight
    /// to its socket when it is free). Returns false if it is closed.
    pub(crate) fn send(&self, id: ConnId, frames: &mut Vec<u8>) -> bool {
        let outboxes = self.outboxes.read().unwrap_or_else(PoisonError::into_inner);
        match outboxes.get(&id) {
            Some(outbox) => {
                outbox.push_delivered(frames);
                true
            }
            None => false,
        }
    }

    /// Send replies produced outside any connection's own call (timeouts, waiters woken by
    /// another connection, hosts' answers, session ends). Replies for closed connections are
    /// dropped. Consecutive replies to one connection leave together.
    pub(crate) fn deliver(&self, deliveries: impl IntoIterator<Item = Delivery>) {
        let outboxes = self.outboxes.read().unwrap_or_else(PoisonError::into_inner);
        let mut frames = Vec::new();
        let mut to: Option<(ConnId, &Arc<Outbox>)> = None;
        for d in deliveries {
            if to.is_none_or(|(conn, _)| conn != d.token.conn) {
                if let Some((_, outbox)) = to.take() {
                    outbox.push_delivered(&mut frames);
                }
                match outboxes.get(&d.token.conn) {
                    Some(outbox) => to = Some((d.token.conn, outbox)),
                    None if self.post(&d) => continue,
                    None => {
                        if let Err(e) = &d.reply {
                            self.audit.error_reply(None, d.token.conn, d.token.req, e);
                        }
                        tracing::debug!(
                            conn = d.token.conn,
                            id = d.token.req,
                            "reply for a closed connection dropped"
                        );
                        continue;
                    }
                }
            }
            if let (Err(e), Some((conn, outbox))) = (&d.reply, to) {
                self.audit.error_reply(Some(outbox.peer), conn, d.token.req, e);
            }
            if let Some((_, outbox)) = to {
                outbox.delivered.fetch_add(1, Ordering::Relaxed);
            }
            spindle_proto::encode_reply(d.token.req, &d.reply, &mut frames);
        }
        if let Some((_, outbox)) = to {
            outbox.push_delivered(&mut frames);
        }
    }

    /// Push `value` to request `req` of connection `conn` before its reply (a function's
    /// output): a `[req, 2, value]` frame, or into its mailbox.
    pub(crate) fn push(&self, conn: ConnId, req: u64, value: Value) {
        if let Some(mailbox) = self.mailboxes.read().unwrap_or_else(PoisonError::into_inner).get(&conn) {
            return mailbox.push(req, &value);
        }
        let frame = Value::Array(vec![Value::from(req), Value::from(2u64), value]);
        let mut bytes = Vec::new();
        spindle_proto::encode_frame(&frame, &mut bytes);
        self.send(conn, &mut bytes);
    }

    /// Hand `d` to its mailbox, if it is addressed to one.
    fn post(&self, d: &Delivery) -> bool {
        let mailboxes = self.mailboxes.read().unwrap_or_else(PoisonError::into_inner);
        match mailboxes.get(&d.token.conn) {
            Some(mailbox) => {
                mailbox.post(d.token.req, d.reply.clone());
                true
            }
            None => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use std::future::Future;
    use std::pin::Pin;
    use std::sync::atomic::AtomicBool;
    use std::task::{Context, Poll};
    use std::time::{Duration, Instant};

    use tokio::io::AsyncReadExt;
    use tokio::net::{TcpListener, TcpSocket, TcpStream};

    use super::*;

    /// How often a future was polled, and whether its last poll left it waiting.
    #[derive(Default)]
    struct Polls {
        count: AtomicU64,
        waiting: AtomicBool,
    }

    impl Polls {
        fn count(&self) -> u64 {
            self.count.load(Ordering::SeqCst)
        }

        fn waiting(&self) -> bool {
            self.waiting.load(Ordering::SeqCst)
        }
    }

    /// A future that counts its polls in [`Polls`].
    struct Counted<F> {
        inner: Pin<Box<F>>,
        polls: Arc<Polls>,
    }

    impl<F: Future> Future for Counted<F> {
        type Output = F::Output;

        fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
            self.polls.count.fetch_add(1, Ordering::SeqCst);
            let poll = self.inner.as_mut().poll(cx);
            self.polls.waiting.store(poll.is_pending(), Ordering::SeqCst);
            poll
        }
    }

    /// Yield to the runtime until `condition` holds; the deadline only bounds a failure.
    async fn until(what: &str, condition: impl Fn() -> bool) {
        let deadline = Instant::now() + Duration::from_secs(30);
        while !condition() {
            assert!(Instant::now() < deadline, "timed out waiting for: {what}");
            tokio::task::yield_now().await;
        }
    }

    /// A connected pair whose sending side has small kernel buffers, so writes come up short
    /// soon: the outbox (with its writer task, whose polls are counted) on one end, the raw
    /// peer on the other.
    async fn pair() -> (Arc<Outbox>, tokio::task::JoinHandle<()>, TcpStream, Arc<Polls>) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let socket = TcpSocket::new_v4().unwrap();
        socket.set_send_buffer_size(256 * 1024).unwrap();
        let (ours, theirs) = tokio::join!(socket.connect(listener.local_addr().unwrap()), listener.accept());
        let (ours, (theirs, _)) = (ours.unwrap(), theirs.unwrap());
        let (_, write) = ours.into_split();
        let write = Arc::new(write);
        let outbox = Arc::new(Outbox::new(Some(write.clone()), usize::MAX, [127, 0, 0, 1].into()));
        let polls = Arc::new(Polls::default());
        let writer = tokio::spawn(Counted {
            inner: Box::pin(write_loop(Sink::Socket(write), outbox.clone(), 1)),
            polls: polls.clone(),
        });
        (outbox, writer, theirs, polls)
    }

    /// Frame `seq` of `producer`: a length-prefixed body of `(producer, seq)` and filler.
    fn frame(producer: u32, seq: u32, filler: usize, into: &mut Vec<u8>) {
        into.extend_from_slice(&(8 + filler as u32).to_be_bytes());
        into.extend_from_slice(&producer.to_be_bytes());
        into.extend_from_slice(&seq.to_be_bytes());
        into.extend(std::iter::repeat_n((seq % 251) as u8, filler));
    }

    /// Read frames until EOF; check each producer's frames come in order and intact, and
    /// return how many came from each.
    async fn read_all(peer: &mut TcpStream, producers: usize) -> Vec<u32> {
        let mut bytes = Vec::new();
        peer.read_to_end(&mut bytes).await.unwrap();
        let mut next = vec![0u32; producers];
        let mut rest = &bytes[..];
        while !rest.is_empty() {
            let len = u32::from_be_bytes(rest[..4].try_into().unwrap()) as usize;
            let body = &rest[4..4 + len];
            let producer = u32::from_be_bytes(body[..4].try_into().unwrap()) as usize;
            let seq = u32::from_be_bytes(body[4..8].try_into().unwrap());
            assert_eq!(seq, next[producer], "producer {producer}: frame out of order");
            assert!(
                body[8..].iter().all(|b| *b == (seq % 251) as u8),
                "frame {seq} corrupted"
            );
            next[producer] += 1;
            rest = &rest[4 + len..];
        }
        next
    }

    /// One producer, frames of mixed sizes: some go out directly, some come up short and
    /// queue, later ones queue behind them; the peer gets every frame, in order, then EOF.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn direct_and_queued_writes_keep_order() {
        let (outbox, writer, mut peer, _) = pair().await;
        // The peer starts reading only once a write came up short, so that the socket's
        // buffer fills and writes come up short whatever the machine's speed (23 MB are more
        // than the kernel buffers).
        let (came_up_short, short) = tokio::sync::oneshot::channel::<()>();
        let reader = tokio::spawn(async move {
            // Sent, or dropped when no write came up short (the test fails below).
            let _ = short.await;
            read_all(&mut peer, 1).await
        });
        let mut came_up_short = Some(came_up_short);
        let mut frames = Vec::new();
        let mut left_over = 0;
        for seq in 0..4_000u32 {
            let filler = [0, 10, 3000, 20_000][seq as usize % 4];
            frame(0, seq, filler, &mut frames);
            if outbox.push_frames(&mut frames) > 0 {
                left_over += 1;
                if let Some(tx) = came_up_short.take() {
                    let _ = tx.send(());
                }
            }
            assert!(frames.is_empty());
            if seq % 100 == 0 {
                tokio::task::yield_now().await;
            }
        }
        drop(came_up_short);
        assert!(
            left_over > 0,
            "no write came up short: the test does not test partial writes"
        );
        outbox.close();
        writer.await.unwrap();
        drop(outbox);
        assert_eq!(reader.await.unwrap(), vec![4_000]);
    }

    /// Several threads send to one connection at once (the way connection tasks deliver to
    /// another): each one's frames arrive in its order, none lost.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn concurrent_producers_keep_their_order() {
        let (outbox, writer, mut peer, _) = pair().await;
        let reader = tokio::spawn(async move { read_all(&mut peer, 4).await });
        let threads: Vec<_> = (0..4u32)
            .map(|producer| {
                let outbox = outbox.clone();
                std::thread::spawn(move || {
                    let mut frames = Vec::new();
                    for seq in 0..2_000u32 {
                        frame(producer, seq, (seq as usize * 37) % 2000, &mut frames);
                        outbox.push_frames(&mut frames);
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        outbox.close();
        writer.await.unwrap();
        drop(outbox);
        assert_eq!(reader.await.unwrap(), vec![2_000; 4]);
    }

    /// A peer that stops reading: the socket fills, frames queue (nothing lost), the writer
    /// waits without spinning, and everything arrives once the peer reads again.
    #[tokio::test(flavor = "current_thread")]
    async fn stalled_peer_queues_without_spinning() {
        let (outbox, writer, mut peer, polls) = pair().await;
        let mut frames = Vec::new();
        let mut pending = 0;
        let mut seq = 0;
        while pending < 4 << 20 {
            frame(0, seq, 1000, &mut frames);
            let now = outbox.push_frames(&mut frames);
            assert!(now >= pending, "queued bytes went missing");
            pending = now;
            seq += 1;
        }
        // The writer runs (on this thread) and finds the socket full: it must wait for room.
        until("the writer ran and waits", || polls.count() > 0 && polls.waiting()).await;
        // A counter, not a clock: while this task yields, a writer that waits is polled only
        // when the socket frees room (a few times at most, the peer reading nothing), one
        // that spins at every turn of the runtime, at least once per yield.
        const YIELDS: u64 = 10_000;
        let before = polls.count();
        for _ in 0..YIELDS {
            tokio::task::yield_now().await;
        }
        let spins = polls.count() - before;
        assert!(
            spins < YIELDS / 10,
            "the writer was polled {spins} times in {YIELDS} yields"
        );
        let stuck = {
            let state = outbox.lock();
            state.writing || !state.bytes.is_empty()
        };
        assert!(stuck, "the peer does not read, yet all was sent");
        // More frames queue behind (no direct write while bytes wait).
        frame(0, seq, 10, &mut frames);
        assert!(outbox.push_frames(&mut frames) > 0);
        seq += 1;
        outbox.close();
        drop(outbox);
        let (counts, ()) = tokio::join!(read_all(&mut peer, 1), async { writer.await.unwrap() });
        assert_eq!(counts, vec![seq]);
    }

    /// After the peer goes away, frames are dropped, not queued forever.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn dead_socket_drops_frames() {
        let (outbox, writer, peer, _) = pair().await;
        drop(peer); // our next writes get a reset, then fail
        let mut frames = Vec::new();
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            frame(0, 0, 100, &mut frames);
            if outbox.push_frames(&mut frames) == 0 && outbox.lock().dead {
                break;
            }
            assert!(Instant::now() < deadline, "writes to a reset socket never failed");
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        frame(0, 1, 100, &mut frames);
        assert_eq!(outbox.push_frames(&mut frames), 0);
        assert!(frames.is_empty());
        // The writer exits without waiting for close.
        tokio::time::timeout(Duration::from_secs(5), writer)
            .await
            .unwrap()
            .unwrap();
    }

    #[tokio::test]
    async fn closing_during_a_direct_write_still_ends_the_writer() {
        let (outbox, writer, mut theirs, polls) = pair().await;
        // Another thread (the op-log writer releasing replies) claimed the socket for a direct write.
        outbox.lock().writing = true;
        // The reader ends meanwhile; the writer task finds the socket busy and waits (having
        // used up the close's wake-up, so only the end of the direct write can wake it).
        let before = polls.count();
        outbox.close();
        until("the writer ran after the close and waits", || {
            polls.count() > before && polls.waiting()
        })
        .await;
        {
            let state = outbox.lock();
            assert!(state.closing && state.writing, "the direct write is still on");
        }
        // The direct write completes with everything written.
        let mut frames = Vec::new();
        frame(1, 1, 10, &mut frames);
        let n = frames.len();
        outbox.release(&mut frames, n);
        let done = tokio::time::timeout(Duration::from_secs(5), writer).await;
        assert!(
            done.is_ok(),
            "the writer task never exits, so the write side never shuts down"
        );
        // (The test only pretended to write the frame.) The peer sees the end of the stream.
        let mut buf = [0u8; 1];
        let eof = tokio::time::timeout(Duration::from_secs(5), theirs.read(&mut buf)).await;
        assert!(matches!(eof, Ok(Ok(0))), "no end of file: {eof:?}");
    }
}
