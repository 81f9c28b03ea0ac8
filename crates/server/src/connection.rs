//! One client connection: a reader loop that decodes and runs requests in place, and a
//! writer task that sends queued replies, many per `write` when requests are pipelined.

use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use spindle_core::partition::{Op, TxnId};
use spindle_core::{Caller, ConnId, Delivery, Error, ErrorKind, Reply, Token, Value};
use spindle_proto::{decode_request, encode_reply, split_frame, CallsAction, Request, Split, TxnRef, PROTOCOL_VERSION};
use tokio::io::{AsyncRead, AsyncReadExt};
use tokio::net::TcpStream;
use tracing::{debug, info, warn};

use crate::access::{self, Grant};
use crate::acl::{Change, Permission, Principal};
use crate::calls::{self, redirect};
use crate::cluster::{moves, two_phase, MetadataChange};
use crate::gateway::{self, WorkerId};
use crate::hosts::{self, HostId};
use crate::registry::{self, Outbox, Sink};
use crate::{nested, pickles, sessions, status, transactions, Shared};

/// Read buffer of an idle connection; it grows for large frames and shrinks back after.
const INITIAL_READ_BUFFER: usize = 4 * 1024;
/// Free space to offer each read, so pipelined requests arrive in few reads.
const MIN_READ_SPACE: usize = 8 * 1024;
/// Buffers above this size are released once empty, to keep idle memory small.
const KEEP_BUFFER: usize = 256 * 1024;
/// Frames up to this size fit the buffer a connection keeps anyway: only larger ones count
/// against `--max-partial-frames`.
const SMALL_FRAME: usize = INITIAL_READ_BUFFER + MIN_READ_SPACE;
/// After refusing an oversized frame, how long to swallow its body before closing, so the
/// kernel does not answer the unread bytes with a reset that could destroy our reply.
const LINGER: Duration = Duration::from_secs(1);

/// Why the reader stopped.
enum End {
    /// The client closed between frames.
    Closed,
    /// The client closed in the middle of a frame.
    Truncated { buffered: usize },
    /// A frame over the limit was refused; the connection closes after the reply.
    FrameTooLarge,
    /// A `hello` was refused (`Unauthorized`; the connection closes after the reply, so a
    /// client cannot pipeline guesses on it, each costing a credential check), or never
    /// came in time, or a limit was reached (connections, a frame's time, frames' bytes,
    /// the client's silence).
    Refused,
    /// The client's unread replies passed `--output-hard-limit`.
    Overflowed,
    /// The socket failed.
    Failed(std::io::Error),
}

/// What a connection waits for in time.
#[derive(Clone, Copy)]
enum Deadline {
    Hello,
    Frame,
    Idle,
}

/// What ended a wait for the client's bytes.
enum Input {
    Read(std::io::Result<usize>),
    /// A deadline or the outbox's death that does not end the connection: look anew.
    Again,
    End(End),
}

/// Sleep until `at`; forever without one.
async fn sleep_until(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at.into()).await,
        None => std::future::pending().await,
    }
}

/// Bytes of a large frame being received, held against `--max-partial-frames` (the server's
/// total of such frames) until it has arrived or the connection ends.
struct Held {
    shared: Arc<Shared>,
    bytes: usize,
}

impl Held {
    fn new(shared: &Arc<Shared>) -> Self {
        Held {
            shared: shared.clone(),
            bytes: 0,
        }
    }

    /// Hold `bytes` (0: none) instead of what was held; refused past the budget.
    fn hold(&mut self, bytes: usize) -> Result<(), String> {
        if bytes == self.bytes {
            return Ok(());
        }
        let total = &self.shared.stats.receiving;
        total.fetch_sub(std::mem::take(&mut self.bytes), Ordering::Relaxed);
        if bytes == 0 {
            return Ok(());
        }
        let limit = self.shared.config.limits.partial_frames;
        let before = total.fetch_add(bytes, Ordering::Relaxed);
        if before + bytes > limit {
            total.fetch_sub(bytes, Ordering::Relaxed);
            return Err(format!(
                "the server is receiving {before} bytes of large frames and takes {limit} at most \
                 (--max-partial-frames): a frame of {bytes} bytes must wait; try again later"
            ));
        }
        self.bytes = bytes;
        Ok(())
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        self.shared.stats.receiving.fetch_sub(self.bytes, Ordering::Relaxed);
    }
}

struct Connection {
    id: ConnId,
    /// The client's address, for the audit log.
    peer: SocketAddr,
    shared: Arc<Shared>,
    /// The session, once `hello` arrived.
    client: Option<Arc<str>>,
    /// Who the session acts as (set with `client`), and the generation of the users and
    /// roles its rules were read from.
    principal: Option<Principal>,
    generation: u64,
    /// What the request being applied may do: a condition (`Grant::IfExists`, `IfReads`) is
    /// checked under its lock so that it cannot change meanwhile.
    grant: Grant,
    /// A `hello` was refused: nothing more is read.
    refused: bool,
    /// Shards this connection called into, which must hear of its end.
    touched: Vec<bool>,
    /// In front of the socket's write side (shared with the writer task; the write side
    /// shuts down when both let go).
    outbox: Arc<Outbox>,
    /// Replies to this connection's own requests in the current batch, flushed to the
    /// outbox once per read.
    replies: Vec<u8>,
    /// This connection invoked functions: the gateway must hear of its end.
    invoked: bool,
    /// Set when this is a worker's task channel: its frames are replies to tasks.
    worker: Option<WorkerId>,
    /// Set when this is an object host's channel: its frames are replies to its requests.
    host: Option<HostId>,
    /// A peer's Raft message arriving in parts: its shard and the bytes so far.
    raft_part: Option<(u64, Vec<u8>)>,
    /// A snapshot a peer is streaming to this node.
    incoming: Option<IncomingSnapshot>,
    /// Requests read that expect a reply, and replies this connection's reader sent (others
    /// count theirs in the outbox): a client is idle only with every request answered.
    asked: u64,
    answered: u64,
}

/// A snapshot arriving in `snapshot` frames: its message, and the file its data goes to
/// (deleted unless the whole snapshot came and went to its group).
struct IncomingSnapshot {
    group: u64,
    message: Vec<u8>,
    path: std::path::PathBuf,
    file: Option<std::io::BufWriter<std::fs::File>>,
    /// Bytes of data so far.
    written: u64,
}

impl IncomingSnapshot {
    fn create(group: u64, message: Vec<u8>, path: std::path::PathBuf) -> std::io::Result<Self> {
        let file = std::fs::File::create(&path)?;
        Ok(IncomingSnapshot {
            group,
            message,
            path,
            file: Some(std::io::BufWriter::with_capacity(1 << 20, file)),
            written: 0,
        })
    }

    fn write(&mut self, chunk: &[u8]) -> std::io::Result<()> {
        use std::io::Write as _;
        self.written += chunk.len() as u64;
        match &mut self.file {
            Some(file) => file.write_all(chunk),
            None => Err(std::io::Error::other("the snapshot was finished")),
        }
    }

    /// The whole snapshot came: its message, naming the file that holds its data (the
    /// file is the group's from now on).
    fn finish(mut self) -> Result<Vec<u8>, String> {
        use protobuf::Message as _;
        use std::io::Write as _;
        let file = self.file.take().ok_or("finished twice")?;
        file.into_inner()
            .map_err(|e| e.to_string())
            .and_then(|mut f| f.flush().map_err(|e| e.to_string()))?;
        let mut message = raft::prelude::Message::parse_from_bytes(&self.message).map_err(|e| e.to_string())?;
        let data = crate::cluster::snapshot_file_data(&self.path);
        message.mut_snapshot().set_data(data.into());
        let bytes = message.write_to_bytes().map_err(|e| e.to_string())?;
        self.path = std::path::PathBuf::new();
        Ok(bytes)
    }
}

impl Drop for IncomingSnapshot {
    fn drop(&mut self) {
        if !self.path.as_os_str().is_empty() {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

/// Serve one accepted connection, the `open`th open (counted by the accept loop), until it
/// closes: on a TLS port, after its handshake.
pub(crate) async fn serve(shared: Arc<Shared>, stream: TcpStream, peer: SocketAddr, open: usize) {
    if let Err(e) = stream.set_nodelay(true) {
        debug!(%peer, "could not set TCP_NODELAY: {e}");
    }
    match &shared.tls {
        None => {
            let (reader, writer) = stream.into_split();
            let writer = Arc::new(writer);
            let outbox = Outbox::new(Some(writer.clone()), shared.config.limits.output_hard, peer.ip());
            run(shared, reader, outbox, Sink::Socket(writer), peer, open).await
        }
        Some(tls) => {
            let max = shared.config.limits.max_connections;
            // No handshake at the limit: a refusal could only be told after one.
            let stream = match open > max {
                true => {
                    let why = format!("the server serves {max} connections at most (--max-connections)");
                    shared.audit.refused(peer.ip(), &why);
                    None
                }
                false => crate::tls::accept(&shared, tls, stream, peer).await,
            };
            let Some(stream) = stream else {
                shared.stats.connections.fetch_sub(1, Ordering::Relaxed);
                return;
            };
            let (reader, writer) = tokio::io::split(stream);
            let outbox = Outbox::new(None, shared.config.limits.output_hard, peer.ip());
            run(shared, reader, outbox, Sink::Stream(Box::new(writer)), peer, open).await
        }
    }
}

/// Serve the connection's requests from `reader`; replies leave through `outbox`, to `sink`.
/// It is the `open`th connection open (counted in `serve`; `finish` counts it out).
async fn run(
    shared: Arc<Shared>,
    mut reader: impl AsyncRead + Unpin,
    outbox: Outbox,
    sink: Sink,
    peer: SocketAddr,
    open: usize,
) {
    let outbox = Arc::new(outbox);
    let id = shared.registry.register(outbox.clone());
    debug!(conn = id, %peer, "connection opened");
    let writer_task = tokio::spawn(registry::write_loop(sink, outbox.clone(), id));

    let mut conn = Connection {
        id,
        peer,
        touched: vec![false; shared.shards.count()],
        shared,
        client: None,
        principal: None,
        generation: 0,
        grant: Grant::Yes,
        refused: false,
        outbox,
        replies: Vec::new(),
        invoked: false,
        worker: None,
        host: None,
        raft_part: None,
        incoming: None,
        asked: 0,
        answered: 0,
    };
    let max = conn.shared.config.limits.max_connections;
    let end = match open > max {
        // Told at once, rather than left to time out at the descriptor limit.
        true => {
            let message = format!("the server serves {max} connections at most (--max-connections); try again later");
            conn.shared.audit.refused(peer.ip(), &message);
            conn.reply(0, Err(Error::new(ErrorKind::Busy, message)));
            conn.flush();
            End::Refused
        }
        false => conn.read_loop(&mut reader).await,
    };
    match &end {
        End::Closed => debug!(conn = id, "connection closed by the client"),
        End::Truncated { buffered } => {
            debug!(
                conn = id,
                buffered, "connection closed in the middle of a frame; the partial frame is dropped"
            )
        }
        End::FrameTooLarge => debug!(conn = id, "closing after an oversized frame"),
        End::Refused => debug!(conn = id, "closing after a refused or missing hello, or at a limit"),
        End::Overflowed => {
            let limit = conn.shared.config.limits.output_hard;
            let why = format!("its unread replies passed {limit} bytes (--output-hard-limit): connection closed");
            conn.shared.audit.refused(peer.ip(), &why);
        }
        End::Failed(e) => debug!(conn = id, "connection failed: {e}"),
    }
    conn.finish();
    match end {
        End::FrameTooLarge | End::Refused => {
            // Let the writer send the last reply and its FIN before the socket closes.
            let _ = writer_task.await;
            let _ = tokio::time::timeout(LINGER, discard_input(&mut reader)).await;
        }
        // Its writer may wait forever on a client that does not read, holding the socket
        // and the bytes it was sending: stop it.
        End::Overflowed => writer_task.abort(),
        _ => {}
    }
}

impl Connection {
    async fn read_loop(&mut self, reader: &mut (impl AsyncRead + Unpin)) -> End {
        let max_frame = self.shared.config.max_frame;
        let soft_limit = self.shared.config.limits.output_soft;
        let opened = Instant::now();
        let mut buf: Vec<u8> = Vec::with_capacity(INITIAL_READ_BUFFER);
        let mut start = 0;
        // The frame being received: when it began, and its bytes held against the server's
        // budget for frames in progress.
        let mut receiving: Option<Instant> = None;
        let mut held = Held::new(&self.shared);
        let mut last_request = opened;
        let idle_timeout = self.shared.config.limits.idle_timeout.is_some();
        loop {
            // Run every whole frame already buffered, then send their replies at once; a
            // client whose replies pile up unread is not served more until it reads.
            let frame_size = loop {
                match split_frame(&buf[start..], max_frame) {
                    Split::Frame { body, consumed } => {
                        self.handle_frame(body);
                        start += consumed;
                        receiving = None;
                        if self.refused {
                            self.flush();
                            return End::Refused;
                        }
                        // Large replies go to the outbox as they come (moved, not copied),
                        // rather than piling up in a buffer that doubles as it grows.
                        if self.replies.len() > KEEP_BUFFER.min(soft_limit) && self.flush() > soft_limit {
                            self.wait_for_writer(soft_limit).await;
                        }
                    }
                    Split::Incomplete { total } => break total,
                    Split::TooLarge { len } => {
                        if let Some(host) = self.host {
                            let why = format!("it sent a frame of {len} bytes, over the limit of {max_frame}");
                            hosts::broke_protocol(&self.shared, host, &why);
                        }
                        let message = format!(
                            "frame of {len} bytes is over the limit of {max_frame} bytes; closing the connection"
                        );
                        return self.close_with(ErrorKind::FrameTooLarge, message, End::FrameTooLarge);
                    }
                }
            };
            if start > 0 && idle_timeout {
                last_request = Instant::now();
            }
            if self.flush() > soft_limit {
                self.wait_for_writer(soft_limit).await;
            }
            if let Some(overflowed) = self.outbox.death() {
                return match overflowed {
                    true => End::Overflowed,
                    false => End::Failed(std::io::ErrorKind::BrokenPipe.into()),
                };
            }

            if start == buf.len() {
                buf.clear();
                if buf.capacity() > KEEP_BUFFER {
                    buf = Vec::with_capacity(INITIAL_READ_BUFFER);
                }
            } else if start > 0 {
                buf.drain(..start);
            }
            start = 0;
            if !buf.is_empty() && receiving.is_none() {
                receiving = Some(Instant::now());
            }
            let frame = frame_size.filter(|&size| size > SMALL_FRAME).unwrap_or(0);
            if let Err(message) = held.hold(frame) {
                return self.close_with(ErrorKind::Busy, message, End::Refused);
            }
            let wanted = frame_size.unwrap_or(0).max(buf.len() + MIN_READ_SPACE);
            buf.reserve(wanted - buf.len());

            let deadline = self.deadline(opened, last_request, receiving.map(|at| (at, frame_size)));
            let read = match self.wait_for_input(reader, &mut buf, deadline, frame_size).await {
                Input::Read(read) => read,
                Input::Again => continue,
                Input::End(end) => return end,
            };
            match read {
                Ok(0) if buf.is_empty() => return End::Closed,
                Ok(0) => return End::Truncated { buffered: buf.len() },
                Ok(_) => {}
                Err(e) => return End::Failed(e),
            }
        }
    }

    /// Read more of the client's bytes into `buf`, unless a deadline passes first or the
    /// outbox dies (`Again`: look at the connection anew).
    async fn wait_for_input(
        &mut self,
        reader: &mut (impl AsyncRead + Unpin),
        buf: &mut Vec<u8>,
        deadline: Option<(Instant, Deadline)>,
        frame_size: Option<usize>,
    ) -> Input {
        // With no deadline and no call of its own parked (whose wake-up could overflow its
        // outbox), only the client ends the wait: a plain read, the common case.
        if deadline.is_none() && !self.in_flight() {
            return Input::Read(reader.read_buf(buf).await);
        }
        let outbox = self.outbox.clone();
        tokio::select! {
            biased;
            read = reader.read_buf(buf) => Input::Read(read),
            // The writer closed the connection (its client fell too far behind).
            _ = outbox.died() => Input::Again,
            () = sleep_until(deadline.as_ref().map(|(at, _)| *at)) => {
                let Some((_, why)) = deadline else { return Input::Again };
                let message = match why {
                    Deadline::Hello => {
                        let timeout = self.shared.config.limits.hello_timeout;
                        format!("no hello within {timeout:?}: closing the connection")
                    }
                    Deadline::Frame => format!(
                        "a frame of {} bytes took too long to arrive ({} came; --frame-timeout): closing the connection",
                        frame_size.map_or_else(|| "unknown".to_string(), |n| n.to_string()),
                        buf.len(),
                    ),
                    // Still waiting for a reply: not idle (look again later).
                    Deadline::Idle if self.in_flight() => return Input::Again,
                    Deadline::Idle => {
                        let timeout = self.shared.config.limits.idle_timeout.unwrap_or_default();
                        format!("idle for {timeout:?}: closing the connection (--client-timeout)")
                    }
                };
                let kind = match why {
                    Deadline::Idle => ErrorKind::Timeout,
                    _ => ErrorKind::ProtocolError,
                };
                Input::End(self.close_with(kind, message, End::Refused))
            }
        }
    }

    /// The next deadline of this connection, and what it is for: its `hello`; the frame it
    /// is receiving (begun at, of size if known); its client's silence (`--client-timeout`).
    fn deadline(
        &self,
        opened: Instant,
        last_request: Instant,
        receiving: Option<(Instant, Option<usize>)>,
    ) -> Option<(Instant, Deadline)> {
        let limits = &self.shared.config.limits;
        let introduced = self.client.is_some() || self.worker.is_some() || self.host.is_some();
        if !introduced {
            // A connection must say hello in time: one that never does holds a descriptor
            // and its buffer for nothing. A partial frame does not extend it.
            return Some((opened + limits.hello_timeout, Deadline::Hello));
        }
        if let Some((began, size)) = receiving {
            // In proportion to the frame's size: a slow client may still send a large one.
            let mib = size.unwrap_or(0) as u32 >> 20;
            return Some((began + limits.frame_timeout * (1 + mib), Deadline::Frame));
        }
        // Workers, object hosts and peer nodes are the server's own: never idle-closed.
        let client =
            self.worker.is_none() && self.host.is_none() && !self.principal.as_ref().is_some_and(Principal::is_node);
        match (limits.idle_timeout, client) {
            (Some(timeout), true) => {
                // Looked at again from now while a call waits for its reply.
                let from = match self.in_flight() {
                    true => Instant::now(),
                    false => last_request,
                };
                Some((from + timeout, Deadline::Idle))
            }
            _ => None,
        }
    }

    /// Whether a request of this connection still waits for its reply.
    fn in_flight(&self) -> bool {
        self.calls_in_flight() > 0
    }

    /// Requests of this connection (the one being handled included) that still wait for
    /// their reply.
    fn calls_in_flight(&self) -> u64 {
        self.asked.saturating_sub(self.answered + self.outbox.delivered())
    }

    /// Tell the client why (`kind`, `message`), in a frame of id 0, and end with `end`.
    fn close_with(&mut self, kind: ErrorKind, message: String, end: End) -> End {
        self.reply(0, Err(Error::new(kind, message)));
        self.flush();
        end
    }

    /// Wait until the client reads enough of its replies (or the connection dies).
    async fn wait_for_writer(&self, limit: usize) {
        debug!(
            conn = self.id,
            "client is not reading its replies; pausing its requests"
        );
        while self.outbox.pending() > limit && self.outbox.death().is_none() {
            self.outbox.wait_drained().await;
        }
    }

    /// Send this batch's replies: straight to the socket when it is free and takes them all,
    /// otherwise through the writer task. Returns the bytes left waiting for the writer.
    fn flush(&mut self) -> usize {
        let pending = self.outbox.push_frames(&mut self.replies);
        if self.replies.capacity() > KEEP_BUFFER {
            self.replies = Vec::new();
        }
        pending
    }

    fn handle_frame(&mut self, body: &[u8]) {
        // Counted before it is decoded: a frame of tiny values decodes to 32 times its size.
        let max_values = self.shared.config.limits.frame_values;
        if body.len() > max_values {
            if let Err(count) = spindle_proto::count_values(body, max_values) {
                let message = format!(
                    "the frame holds over {max_values} values ({count} so far; --max-frame-values): send them in parts"
                );
                let id = spindle_proto::request::request_id(body);
                if let Some(host) = self.host {
                    // A method's result: that call fails, not the host's other objects.
                    let error = Value::Array(vec!["ValueError".into(), message.into(), Value::Nil]);
                    return hosts::reply(&self.shared, host, Value::Array(vec![id.into(), 1.into(), error]));
                }
                self.asked += 1;
                return self.reply(id, Err(Error::new(ErrorKind::ProtocolError, message)));
            }
        }
        if let Some(worker) = self.worker {
            return self.handle_worker_frame(worker, body);
        }
        if let Some(host) = self.host {
            return self.handle_host_frame(host, body);
        }
        match decode_request(body) {
            Ok(request) => {
                // Raft messages and snapshots' parts are one-way.
                if !matches!(request, Request::Raft { .. } | Request::Snapshot { .. }) {
                    self.asked += 1;
                }
                self.dispatch(request)
            }
            Err(e) => {
                self.asked += 1;
                self.reply(e.id, Err(Error::new(ErrorKind::ProtocolError, e.message)))
            }
        }
    }

    fn dispatch(&mut self, mut request: Request) {
        self.grant = Grant::Yes;
        // The one gate of authentication: a session exists only once `hello` passed it (the
        // token, the session's secret); workers and hosts prove themselves with their ids.
        let introduces = matches!(
            request,
            Request::Hello { .. } | Request::Worker { .. } | Request::Host { .. }
        );
        if self.client.is_none() && !introduces {
            let message = format!("'{}' before 'hello': a connection must start with hello", request.op());
            return self.reply(request.id(), Err(Error::new(ErrorKind::NoSession, message)));
        }
        let may_wait = matches!(
            request,
            Request::Call { .. } | Request::Create { .. } | Request::Delete { .. } | Request::Invoke { .. }
        );
        let max = self.shared.config.limits.calls_in_flight;
        if may_wait && self.calls_in_flight() > max as u64 {
            let message = format!(
                "this connection has {max} calls waiting for their reply (--max-calls-in-flight): \
                 wait for one before making more"
            );
            return self.reply(request.id(), Err(Error::new(ErrorKind::Busy, message)));
        }
        if !introduces {
            match self.authorize(&request) {
                Ok(grant) => self.grant = grant,
                Err(e) => return self.reply(request.id(), Err(e)),
            }
        }
        if let (Request::Create { args, .. } | Request::Call { args, .. }, Some(who)) = (&mut request, &self.principal)
        {
            if let Err(e) = pickles::stamp(args, who) {
                return self.reply(request.id(), Err(e));
            }
        }
        match request {
            Request::Hello {
                id,
                client,
                user,
                token,
                secret,
            } => self.hello(id, client, user, token, secret),
            Request::Create {
                id,
                seq,
                thread,
                type_name,
                key,
                args,
                owned,
                persistent,
                acked,
                txn,
            } => {
                let op = Op::Create {
                    type_name,
                    key,
                    args,
                    owned,
                    persistent,
                };
                match txn {
                    Some(txn) => self.transact(id, seq, thread, txn, op),
                    None => self.apply(id, seq, acked, thread, op),
                }
            }
            Request::Call {
                id,
                seq,
                thread,
                type_name,
                key,
                method,
                args,
                acked,
                txn,
            } => {
                let op = Op::Call {
                    type_name,
                    key,
                    method,
                    args,
                    nested: None,
                };
                match txn {
                    Some(txn) => self.transact(id, seq, thread, txn, op),
                    None => self.apply(id, seq, acked, thread, op),
                }
            }
            Request::Delete { id, seq, key, txn } => match txn {
                Some(txn) => self.transact(id, seq, 0, txn, Op::Delete { key }),
                None => self.apply(id, seq, 0, 0, Op::Delete { key }),
            },
            Request::Commit { id, seq, txn, shards } => self.commit(id, seq, txn, shards),
            Request::Abort { id, txn } => {
                let client = self.client.clone().expect("a session exists past hello");
                let aborted = transactions::abort(&self.shared, &client, txn);
                self.reply(id, Ok(Value::Boolean(aborted)))
            }
            Request::Keep {
                id,
                type_name,
                key,
                name,
                ..
            } => {
                if let Some(to) = name.as_ref().filter(|name| moves::is_remote(&self.shared, &key, name)) {
                    return self.keep_elsewhere(id, type_name, key, to.clone());
                }
                // A retried keep is answered the same way by `Shards::keep`, so its seq
                // needs no reply log.
                let reply = match self.shared.shards.keep(&type_name, &key, name.as_deref()) {
                    // Name the leader, so the client can go there.
                    Err(e) if e.kind == ErrorKind::NotLeader => {
                        Err(redirect(&self.shared, self.shared.shards.index_of(&key)))
                    }
                    reply => reply,
                };
                self.reply(id, reply)
            }
            Request::Objects {
                id,
                prefix,
                persistent,
                all,
            } => {
                // Only the names this user may read.
                let reply = calls::objects(&self.shared, &prefix, persistent, all, self.principal.as_ref());
                self.reply(id, Ok(reply))
            }
            Request::Status { id } => {
                let reply = status::status(&self.shared);
                self.reply(id, Ok(reply))
            }
            Request::Ping { id } => self.reply(id, Ok(Value::from("pong"))),
            Request::Withdraw { id, call_id, key } => self.withdraw(id, call_id, &key),
            Request::Invoke {
                id,
                runtime,
                payload,
                options,
            } => self.invoke(id, &runtime, payload, options),
            Request::Cancel { id, invoke_id } => {
                let cancelled = self.invoked && gateway::cancel(&self.shared, self.id, invoke_id);
                self.reply(id, Ok(Value::Boolean(cancelled)))
            }
            Request::Calls { id, action } => self.calls(id, action),
            Request::Worker {
                id, worker, runtime, ..
            } => self.worker_hello(id, &worker, &runtime),
            Request::Define {
                id,
                type_name,
                version,
                code,
            } => {
                let unless_defined = match self.take_grant() {
                    Grant::IfExists(refusal) => Some(refusal),
                    _ => None,
                };
                let reply = sessions::define(&self.shared, &type_name, &version, code, unless_defined);
                self.reply(id, reply)
            }
            Request::Host { id, host, .. } => self.host_hello(id, &host),
            Request::Cluster { id } => {
                let reply = match &self.shared.cluster {
                    Some(cluster) => Ok(cluster.map()),
                    None => Err(not_clustered()),
                };
                self.reply(id, reply)
            }
            Request::Acl { id, action, args } => self.acl(id, &action, args),
            Request::Join { id, node, address } => self.change(id, MetadataChange::AddNode { node, address }),
            Request::Leave { id, node } => self.change(id, MetadataChange::RemoveNode { node }),
            Request::Adopt {
                id,
                type_name,
                name,
                state,
                origin,
                expires,
            } => {
                let reply = match moves::adopt(&self.shared, &type_name, &name, &state, &origin, expires) {
                    Err(e) if e.kind == ErrorKind::NotLeader => {
                        Err(redirect(&self.shared, self.shared.shards.index_of(&name)))
                    }
                    reply => reply,
                };
                self.reply(id, reply)
            }
            Request::Prepare {
                id,
                client,
                txn,
                shard,
                coordinator,
            } => self.two_phase(id, client, txn, shard, move |shared, txn, shard| {
                Box::pin(async move {
                    let home = coordinator as usize;
                    two_phase::prepare_here(&shared, &txn, shard, home)
                        .await
                        .map(|()| Value::Boolean(true))
                })
            }),
            Request::Decide {
                id,
                client,
                txn,
                shard,
                commit,
            } => self.two_phase(id, client, txn, shard, move |shared, txn, shard| {
                Box::pin(async move {
                    two_phase::decide_here(&shared, &txn, shard, commit)
                        .await
                        .map(|()| Value::Boolean(true))
                })
            }),
            Request::Decision { id, client, txn, shard } => {
                self.two_phase(id, client, txn, shard, |shared, txn, shard| {
                    Box::pin(async move {
                        let answer = two_phase::ask_here(&shared, &txn, shard).await?;
                        Ok(answer.map_or(Value::Nil, Value::Boolean))
                    })
                })
            }
            Request::Snapshot {
                id,
                from,
                address,
                group,
                message,
                chunk,
                more,
            } => self.snapshot_frame(id, from, &address, group, message, &chunk, more),
            Request::Raft {
                id,
                from,
                address,
                group,
                messages,
                more,
            } => {
                if self.shared.cluster.is_none() {
                    return self.reply(id, Err(not_clustered()));
                }
                // A snapshot's stream broke off (its link started over).
                self.incoming = None;
                // Never answered: Raft messages are one-way.
                if let Some(messages) = self.assemble(group, messages, more) {
                    if let Some(cluster) = &self.shared.cluster {
                        let _ = cluster.receive(from, &address, group, messages);
                    }
                }
            }
        }
    }

    /// A frame of a snapshot a peer streams (see [`IncomingSnapshot`]); never answered.
    #[allow(clippy::too_many_arguments)]
    fn snapshot_frame(
        &mut self,
        id: u64,
        from: u64,
        address: &str,
        group: u64,
        message: Option<Vec<u8>>,
        chunk: &[u8],
        more: bool,
    ) {
        let Some(cluster) = self.shared.cluster.as_ref() else {
            return self.reply(id, Err(not_clustered()));
        };
        if let Some(message) = message.filter(|_| cluster.has_group(group)) {
            self.incoming = IncomingSnapshot::create(group, message, cluster.incoming_snapshot(group))
                .map_err(|e| warn!(conn = self.id, "cannot receive a snapshot: {e}"))
                .ok();
        }
        let Some(incoming) = self.incoming.as_mut().filter(|i| i.group == group) else {
            self.incoming = None;
            return; // the rest of a snapshot this node could not receive: Raft sends again
        };
        // File writes of up to a frame: off the async workers' duty meanwhile.
        if let Err(e) = tokio::task::block_in_place(|| incoming.write(chunk)) {
            warn!(conn = self.id, "cannot receive a snapshot: {e}");
            self.incoming = None;
            return;
        }
        if more {
            return;
        }
        let Some(incoming) = self.incoming.take() else { return };
        let (path, bytes) = (incoming.path.clone(), incoming.written);
        match tokio::task::block_in_place(|| incoming.finish()) {
            Ok(message) => {
                cluster.snapshot_finished(path.clone());
                if cluster.receive(from, address, group, vec![message]) {
                    info!(
                        shard = group,
                        bytes,
                        "received a snapshot from node {from} into {}",
                        path.display()
                    );
                } else if cluster.take_finished(&path) {
                    // No group to take it: the file is not kept.
                    let _ = std::fs::remove_file(&path);
                }
            }
            Err(e) => warn!(conn = self.id, "dropped a snapshot that does not decode: {e}"),
        }
    }

    /// Join the parts of a Raft message too large for one frame (they follow each other on
    /// this connection, the last without `more`); `None` until the last part has come.
    fn assemble(&mut self, group: u64, mut messages: Vec<Vec<u8>>, more: bool) -> Option<Vec<Vec<u8>>> {
        if self.raft_part.is_none() && !more {
            return Some(messages);
        }
        if messages.len() != 1 {
            warn!(conn = self.id, "a peer broke off a Raft message sent in parts; dropped");
            self.raft_part = None;
            return Some(messages);
        }
        let part = messages.pop().unwrap_or_default();
        let (shard, bytes) = self.raft_part.get_or_insert_with(|| (group, Vec::new()));
        if *shard != group || bytes.len() + part.len() > crate::cluster::MAX_RAFT_MESSAGE {
            warn!(
                conn = self.id,
                "dropped a Raft message sent in parts (parts of two shards, or over {} bytes)",
                crate::cluster::MAX_RAFT_MESSAGE
            );
            self.raft_part = None;
            return None;
        }
        bytes.extend_from_slice(&part);
        if more {
            return None;
        }
        self.raft_part.take().map(|(_, message)| vec![message])
    }

    /// `keep` under a name whose shard another node leads: answered once the object moved.
    fn keep_elsewhere(&mut self, id: u64, type_name: String, key: String, name: String) {
        let (shared, conn) = (self.shared.clone(), self.id);
        tokio::spawn(async move {
            let reply = match moves::keep_elsewhere(&shared, &type_name, &key, &name).await {
                Err(e) if e.kind == ErrorKind::NotLeader => Err(redirect(&shared, shared.shards.index_of(&key))),
                reply => reply,
            };
            shared.registry.deliver([Delivery {
                token: Token { conn, req: id },
                reply,
            }]);
        });
    }

    /// A two-phase commit request of a peer about transaction `txn` of session `client` in
    /// shard `shard`: `run` answers it, in a task of its own.
    fn two_phase(
        &mut self,
        id: u64,
        client: String,
        txn: u64,
        shard: u64,
        run: impl FnOnce(Arc<Shared>, TxnId, usize) -> TwoPhaseTask + Send + 'static,
    ) {
        let shard = match usize::try_from(shard).ok().filter(|&s| s < self.shared.shards.count()) {
            Some(shard) if self.shared.cluster.is_some() => shard,
            _ => return self.reply(id, Err(Error::value(format!("no shard {shard} in this cluster")))),
        };
        let txn = TxnId {
            client: Arc::from(client),
            number: txn,
        };
        let (shared, conn) = (self.shared.clone(), self.id);
        tokio::spawn(async move {
            let reply = run(shared.clone(), txn, shard).await;
            shared.registry.deliver([Delivery {
                token: Token { conn, req: id },
                reply,
            }]);
        });
    }

    /// `join` or `leave`: a change of the cluster's nodes, answered once proposed.
    fn change(&mut self, id: u64, change: MetadataChange) {
        if self.shared.cluster.is_none() {
            return self.reply(id, Err(not_clustered()));
        }
        let (shared, conn) = (self.shared.clone(), self.id);
        tokio::spawn(async move {
            let Some(cluster) = shared.cluster.as_ref() else { return };
            let reply = cluster.change(change).await;
            shared.registry.deliver([Delivery {
                token: Token { conn, req: id },
                reply,
            }]);
        });
    }

    fn invoke(&mut self, id: u64, runtime: &str, payload: Vec<u8>, options: Value) {
        self.invoked = true;
        let owner = self.principal.as_ref().map_or("", |p| p.user.as_str());
        if let Err(e) = gateway::invoke(&self.shared, self.id, id, (runtime, owner), payload, options) {
            self.reply(id, Err(e));
        }
    }

    /// `calls`: `spindle ps`, `kill` and `logs`, over the calls this user may see.
    fn calls(&mut self, id: u64, action: CallsAction) {
        let Some(who) = &self.principal else {
            return self.reply(id, Err(Error::new(ErrorKind::NoSession, "no hello on this connection")));
        };
        let asker = gateway::Asker {
            user: &who.user,
            admin: who.allows(Permission::Admin, ""),
        };
        let reply = match action {
            CallsAction::List => Ok(gateway::list_calls(&self.shared, &asker)),
            CallsAction::Kill { call } => {
                info!(conn = self.id, user = who.user, peer = %self.peer, call, "spindle kill");
                gateway::kill_call(&self.shared, call, &asker)
            }
            CallsAction::Logs { call, follow } => {
                // Answered (and followed) by the gateway: a follower's reply comes at the end.
                self.invoked = true;
                match gateway::call_logs(&self.shared, self.id, id, call, follow, &asker) {
                    Ok(()) => return,
                    Err(e) => Err(e),
                }
            }
        };
        self.reply(id, reply)
    }

    /// A worker process announcing itself: from now on this connection carries its tasks.
    fn worker_hello(&mut self, id: u64, secret: &str, runtime: &str) {
        // A `hello` before is fine (the Python worker opens an ordinary connection first).
        if self.worker.is_some() || self.host.is_some() {
            let message = "this connection already said 'worker' or 'host'";
            return self.reply(id, Err(Error::new(ErrorKind::ProtocolError, message)));
        }
        match gateway::worker_hello(&self.shared, self.id, secret, runtime) {
            Ok((worker, actions)) => {
                self.worker = Some(worker);
                self.reply(id, Ok(hello_reply(&self.shared, false, &Principal::default_user())));
                // The worker reads this reply before its first task.
                self.flush();
                gateway::execute(&self.shared, actions);
            }
            Err(e) => self.reply(id, Err(e)),
        }
    }

    /// An object host announcing itself: from now on this connection carries its requests.
    fn host_hello(&mut self, id: u64, secret: &str) {
        if self.worker.is_some() || self.host.is_some() {
            let message = "this connection already said 'worker' or 'host'";
            return self.reply(id, Err(Error::new(ErrorKind::ProtocolError, message)));
        }
        match hosts::authenticate(&self.shared, secret) {
            Ok(host) => {
                self.host = Some(host);
                self.reply(id, Ok(Value::Boolean(true)));
                // The host reads this reply before its first request.
                self.flush();
                hosts::connected(&self.shared, host, self.id);
            }
            Err(e) => self.reply(id, Err(e)),
        }
    }

    /// A frame on a host's connection: the answer to its oldest request. A host makes its
    /// own calls on other connections, so anything else is a protocol violation.
    fn handle_host_frame(&mut self, host: HostId, body: &[u8]) {
        let mut rest = body;
        match rmpv::decode::read_value(&mut rest) {
            Ok(value) if rest.is_empty() => hosts::reply(&self.shared, host, value),
            Ok(_) => hosts::broke_protocol(&self.shared, host, "a frame held more than one value"),
            Err(e) => {
                let why = format!("a frame was not valid MessagePack: {e}");
                hosts::broke_protocol(&self.shared, host, &why)
            }
        }
    }

    /// A frame on a worker's connection: a task's reply, or (rarely) a request of its own.
    fn handle_worker_frame(&mut self, worker: WorkerId, body: &[u8]) {
        let mut rest = body;
        let value = match rmpv::decode::read_value(&mut rest) {
            Ok(value) => value,
            Err(e) => {
                let message = format!("frame body is not valid MessagePack: {e}");
                return self.reply(0, Err(Error::new(ErrorKind::ProtocolError, message)));
            }
        };
        let is_request = matches!(&value, Value::Array(items) if items.get(1).is_some_and(Value::is_str));
        if is_request {
            return match spindle_proto::parse_request(value) {
                Ok(request) => self.dispatch(request),
                Err(e) => self.reply(e.id, Err(Error::new(ErrorKind::ProtocolError, e.message))),
            };
        }
        if let Err(message) = gateway::worker_reply(&self.shared, worker, value) {
            warn!(conn = self.id, worker, "bad frame from a worker: {message}");
            self.reply(0, Err(Error::new(ErrorKind::ProtocolError, message)));
        }
    }

    fn hello(&mut self, id: u64, client: String, user: Option<String>, token: Option<String>, secret: Option<String>) {
        if self.worker.is_some() || self.host.is_some() {
            let message = "this connection already said 'worker' or 'host'; their hello comes before it";
            return self.reply(id, Err(Error::new(ErrorKind::ProtocolError, message)));
        }
        // With credentials configured, nothing runs for a connection that did not give them:
        // data operations included (a pickled value is code to whoever reads it).
        let generation = self.shared.access.generation();
        let principal = match self.shared.access.authenticate(user.as_deref(), token.as_deref()) {
            Ok(principal) => principal,
            Err(e) => {
                self.refused = true;
                return self.reply(id, Err(e));
            }
        };
        if let Err(e) = sessions::check_secret(&client, secret.as_deref()) {
            return self.reply(id, Err(e));
        }
        if let Some(current) = &self.client {
            if **current != *client || self.principal.as_ref().is_some_and(|p| p.user != principal.user) {
                let message = format!("this connection already said hello as client '{current}'");
                return self.reply(id, Err(Error::new(ErrorKind::ProtocolError, message)));
            }
            return self.reply(id, Ok(hello_reply(&self.shared, true, &principal)));
        }
        let (client, resumed) = self.shared.sessions.open(&client);
        debug!(
            conn = self.id,
            client = &*client,
            user = principal.user,
            resumed,
            "hello"
        );
        self.client = Some(client);
        self.reply(id, Ok(hello_reply(&self.shared, resumed, &principal)));
        self.principal = Some(principal);
        self.generation = generation;
    }

    /// Whether this connection's user may make `request` now: its rules are read again after
    /// any change of the users and roles (a removed user can do nothing more).
    fn authorize(&mut self, request: &Request) -> Result<Grant, Error> {
        let generation = self.shared.access.generation();
        if generation != self.generation {
            // Gone once the user is removed or given a new credential.
            let old = self.principal.take();
            self.principal = old.and_then(|old| {
                let now = self.shared.access.principal(&old.user)?;
                (now.credential == old.credential).then_some(now)
            });
            self.generation = generation;
        }
        match &self.principal {
            Some(who) => access::permit(who, request),
            None => Err(Error::new(
                ErrorKind::Unauthorized,
                "this connection's user was removed or given a new credential",
            )),
        }
    }

    /// `acl`: show or change the users and roles (all but `whoami` need admin, which
    /// `authorize` checked). A change takes effect on every node once applied.
    fn acl(&mut self, id: u64, action: &str, args: Vec<(String, Value)>) {
        let who = self.principal.as_ref().map(|p| p.user.clone()).unwrap_or_default();
        let change = match acl_change(action, &args) {
            Ok(Some(change)) => change,
            Ok(None) => {
                let reply = match action {
                    "whoami" => Ok(Value::Map(vec![("user".into(), who.as_str().into())])),
                    "users" => Ok(self.shared.access.list_users()),
                    _ => Ok(self.shared.access.list_roles()),
                };
                return self.reply(id, reply);
            }
            Err(e) => return self.reply(id, Err(e)),
        };
        info!(conn = self.id, user = who, peer = %self.peer, "users and roles: {change}");
        let Some(_) = &self.shared.cluster else {
            let reply = self
                .shared
                .access
                .check(&change)
                .and_then(|()| self.shared.access.apply(change))
                .map(|()| Value::Boolean(true));
            return self.reply(id, reply);
        };
        self.change(id, MetadataChange::Acl(change));
    }

    /// The grant of the request being applied, for the one step that uses it.
    fn take_grant(&mut self) -> Grant {
        std::mem::replace(&mut self.grant, Grant::Yes)
    }

    /// Run an object operation on its shard, in this task (see `calls::apply`).
    fn apply(&mut self, id: u64, seq: u64, acked: u64, thread: u64, op: Op) {
        let grant = self.take_grant();
        let Some(client) = self.client.clone() else {
            return self.reply(id, Err(Error::new(ErrorKind::NoSession, "no hello on this connection")));
        };
        self.touched[self.shared.shards.index_of(op.key())] = true;
        let caller = Caller {
            conn: self.id,
            client,
            thread,
        };
        let token = Token { conn: self.id, req: id };
        match calls::apply(&self.shared, &caller, token, (seq, acked), op, grant) {
            Ok(mut applied) => {
                let who = self.principal.as_ref();
                nested::drive_if_asked(&self.shared, &caller, who, (token, seq), None, &mut applied.deliveries);
                self.route(applied.deliveries);
                hosts::run(&self.shared, applied.host_actions);
            }
            Err(e) => self.reply(id, Err(e)),
        }
    }

    /// A call of a transaction: it runs on the transaction's workspace (transactions.rs).
    fn transact(&mut self, id: u64, seq: u64, thread: u64, txn: TxnRef, op: Op) {
        let grant = self.take_grant();
        let Some(client) = self.client.clone() else {
            return self.reply(id, Err(Error::new(ErrorKind::NoSession, "no hello on this connection")));
        };
        if let Grant::IfExists(refusal) | Grant::IfReads(refusal) = grant {
            // A reader's create attaches to an existing object, and a reader's call of a
            // compiled object may write: inside a transaction, refused.
            return self.reply(id, Err(refusal));
        }
        // Its commit applies its calls as this connection (a lock it acquires is this
        // connection's): its end must reach the shard.
        self.touched[self.shared.shards.index_of(op.key())] = true;
        let caller = Caller {
            conn: self.id,
            client,
            thread,
        };
        let token = Token { conn: self.id, req: id };
        if let Err(e) = calls::offer_module(&self.shared, &op) {
            return self.reply(id, Err(e));
        }
        match transactions::call(&self.shared, &caller, token, seq, txn, op) {
            Ok(mut deliveries) => {
                let who = self.principal.as_ref();
                nested::drive_if_asked(&self.shared, &caller, who, (token, seq), Some(txn), &mut deliveries);
                self.route(deliveries)
            }
            Err(e) => self.reply(id, Err(e)),
        }
    }

    fn commit(&mut self, id: u64, seq: u64, txn: u64, shards: Vec<u64>) {
        let Some(client) = self.client.clone() else {
            return self.reply(id, Err(Error::new(ErrorKind::NoSession, "no hello on this connection")));
        };
        let caller = Caller {
            conn: self.id,
            client,
            thread: 0,
        };
        let token = Token { conn: self.id, req: id };
        if self.shared.cluster.is_some() {
            if let Err(e) = two_phase::check_format(&self.shared) {
                return self.reply(id, Err(e));
            }
            let shared = self.shared.clone();
            tokio::spawn(two_phase::commit(shared, caller, token, seq, txn, shards));
            return;
        }
        match transactions::commit(&self.shared, &caller, token, seq, txn) {
            Ok(deliveries) => self.route(deliveries),
            Err(e) => self.reply(id, Err(e)),
        }
    }

    /// Answer this connection's call `call_id`, parked on `key`, with its timeout result now;
    /// reply `true` if it was still parked. Its answer goes out before this reply.
    fn withdraw(&mut self, id: u64, call_id: u64, key: &str) {
        let parked = Token {
            conn: self.id,
            req: call_id,
        };
        let this = Token { conn: self.id, req: id };
        match calls::withdraw(&self.shared, parked, key, Some(this)) {
            Ok(applied) => {
                hosts::run(&self.shared, applied.host_actions);
                self.route(applied.deliveries)
            }
            Err(e) => self.reply(id, Err(e)),
        }
    }

    /// Replies for this connection join the batch; others go to their connections now.
    fn route(&mut self, deliveries: Vec<Delivery>) {
        if deliveries.iter().all(|d| d.token.conn == self.id) {
            for d in deliveries {
                self.reply(d.token.req, d.reply);
            }
            return;
        }
        let (mine, others): (Vec<_>, Vec<_>) = deliveries.into_iter().partition(|d| d.token.conn == self.id);
        self.shared.registry.deliver(others);
        for d in mine {
            self.reply(d.token.req, d.reply);
        }
    }

    fn reply(&mut self, id: u64, reply: Reply) {
        if let Err(e) = &reply {
            self.shared.audit.error_reply(Some(self.peer.ip()), self.id, id, e);
        }
        self.answered += 1;
        encode_reply(id, &reply, &mut self.replies);
    }

    /// The connection is gone: withdraw its parked calls, release what it held, and let its
    /// session start counting down.
    fn finish(&mut self) {
        let shared = self.shared.clone();
        shared.registry.unregister(self.id);
        if let Some(worker) = self.worker {
            gateway::worker_disconnected(&shared, worker);
        }
        if let Some(host) = self.host {
            hosts::disconnected(&shared, host);
        }
        if self.invoked {
            gateway::connection_closed(&shared, self.id);
        }
        shared.stats.connections.fetch_sub(1, Ordering::Relaxed);
        let now = Instant::now();
        for (index, _) in self.touched.iter().enumerate().filter(|(_, t)| **t) {
            match shared.shards.with(index, |s| {
                if !s.serving() {
                    // Stopped leading: the connection's calls there were answered then.
                    return Vec::new();
                }
                let deliveries = s.partition.disconnect(self.id, now);
                s.journal(deliveries)
            }) {
                Ok(deliveries) => shared.registry.deliver(deliveries),
                Err(e) => warn!(conn = self.id, shard = index, "disconnect clean-up skipped: {e}"),
            }
        }
        self.flush();
        // Only the writer task may still write; when it lets go, the write side shuts down.
        self.outbox.close();
        if let Some(client) = self.client.take() {
            sessions::connection_closed(&shared, client);
        }
    }
}

/// What a peer's two-phase commit request runs.
type TwoPhaseTask = std::pin::Pin<Box<dyn std::future::Future<Output = Reply> + Send>>;

fn not_clustered() -> Error {
    Error::value("this server is not part of a cluster (start it with --node-id)")
}

/// The optional operands `hello` lists: `acked` on `call` and `create`.
const FEATURES: &[&str] = &["acked"];

fn hello_reply(shared: &Shared, resumed: bool, principal: &Principal) -> Value {
    let mut fields = vec![
        (Value::from("user"), Value::from(principal.user.as_str())),
        (Value::from("server"), Value::from("spindle")),
        (Value::from("version"), Value::from(crate::VERSION)),
        (Value::from("protocol"), Value::from(PROTOCOL_VERSION)),
        (Value::from("resumed"), Value::Boolean(resumed)),
        // What this server understands beyond protocol 1's first shape: a client sends an
        // optional operand only to a server that lists it (older servers refuse them).
        (
            Value::from("features"),
            Value::Array(FEATURES.iter().map(|&f| Value::from(f)).collect()),
        ),
    ];
    if let Some(cluster) = &shared.cluster {
        // Clients of a cluster route calls by shard: `cluster` tells the shard map.
        fields.push((Value::from("node"), Value::from(cluster.node_id)));
        fields.push((Value::from("shards"), Value::from(shared.shards.count() as u64)));
        // The newest format of what nodes write for each other that this one reads.
        fields.push((
            Value::from("cluster_format"),
            Value::from(spindle_proto::CLUSTER_FORMAT),
        ));
    }
    Value::Map(fields)
}

async fn discard_input(reader: &mut (impl AsyncRead + Unpin)) {
    let mut sink = vec![0u8; 16 * 1024];
    while let Ok(n) = reader.read(&mut sink).await {
        if n == 0 {
            break;
        }
    }
}

/// The change an `acl` action asks for (`None` for the actions that only show).
fn acl_change(action: &str, args: &[(String, Value)]) -> Result<Option<Change>, Error> {
    let field = |name: &str| args.iter().find(|(k, _)| k == name).map(|(_, v)| v);
    let text = |name: &str| match field(name).and_then(Value::as_str) {
        Some(s) => Ok(s.to_string()),
        None => Err(Error::bad_args(format!("acl {action}: \"{name}\" must be a str"))),
    };
    let texts = |name: &str| -> Result<Vec<String>, Error> {
        let items = field(name).and_then(Value::as_array);
        let items = items.ok_or_else(|| Error::bad_args(format!("acl {action}: \"{name}\" must be a list of str")))?;
        items
            .iter()
            .map(|v| v.as_str().map(str::to_string))
            .collect::<Option<_>>()
            .ok_or_else(|| Error::bad_args(format!("acl {action}: \"{name}\" must be a list of str")))
    };
    Ok(Some(match action {
        "whoami" | "users" | "roles" => return Ok(None),
        "set_user" => {
            let token = text("token")?;
            if token.chars().count() < MIN_CREDENTIAL_LEN {
                return Err(Error::value(format!(
                    "a user's token or password has {MIN_CREDENTIAL_LEN} characters at least"
                )));
            }
            Change::SetUser {
                name: text("name")?,
                user: crate::acl::User {
                    hash: access::hash_credential(&token)?,
                    roles: texts("roles")?,
                },
            }
        }
        "remove_user" => Change::RemoveUser { name: text("name")? },
        "set_role" => Change::SetRole {
            name: text("name")?,
            rules: texts("rules")?,
        },
        "remove_role" => Change::RemoveRole { name: text("name")? },
        other => {
            return Err(Error::bad_args(format!(
            "unknown acl action '{other}' (known: whoami, users, roles, set_user, remove_user, set_role, remove_role)"
        )))
        }
    }))
}

/// Shorter than this, a password is a guess away.
const MIN_CREDENTIAL_LEN: usize = 12;
