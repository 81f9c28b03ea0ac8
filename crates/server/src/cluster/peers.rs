//! Links between the nodes of a cluster: one outgoing TCP connection per peer (TLS when the
//! node has a certificate, which it presents as the client's), carrying Raft messages as
//! `raft` requests on the peer's ordinary port, and snapshots as `snapshot` requests streamed
//! from their files. A link that fails drops what it held and reconnects; Raft resends
//! whatever mattered. The peer's `hello` reply tells the newest cluster format it reads
//! (see `format`): the link's frames name theirs when the peer reads more than format 1.

use ahash::HashMap;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use spindle_core::{Error, ErrorKind, Value};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::mpsc;
use tracing::{debug, error, info, warn};

use super::format;
use crate::acl::NODE_USER;
use crate::tls::{Stream, Tls};
use crate::Shared;

/// What a link sends to its peer.
pub(crate) enum Outgoing {
    /// Messages of one shard.
    Messages(u64, Vec<Vec<u8>>),
    /// A shard's `MsgSnapshot` (its data left out), and the snapshot file whose data follows.
    Snapshot(u64, Vec<u8>, PathBuf),
}

/// Messages queued for a peer beyond this are dropped (Raft resends): a dead peer never
/// grows memory without bound.
const QUEUE_LIMIT: usize = 4096;
/// Bytes of messages per `raft` frame, well under the receiver's frame limit.
const FRAME_BYTES: usize = 8 << 20;
/// How long a peer may take to answer a hello or a request.
const REPLY_TIMEOUT: Duration = Duration::from_secs(5);
const CONNECT_TIMEOUT: Duration = Duration::from_secs(1);
const RECONNECT_AFTER: Duration = Duration::from_millis(200);

#[derive(Default)]
pub(crate) struct Peers {
    links: Mutex<HashMap<u64, mpsc::Sender<Outgoing>>>,
    /// Nodes whose link failed to connect last time (redirects avoid them).
    down: Mutex<std::collections::HashSet<u64>>,
    /// The newest cluster format each peer reads, as its last `hello` reply told.
    formats: Mutex<HashMap<u64, u64>>,
    /// Connections for requests that are answered (two-phase commit's), idle, by address:
    /// a transaction's requests do not each pay a connection and a hello.
    idle: Mutex<HashMap<String, Vec<Box<dyn Stream>>>>,
}

/// Idle request connections kept per address.
const IDLE_PER_PEER: usize = 16;

impl Peers {
    /// Whether this node's last attempt to reach `node` failed.
    pub(crate) fn is_down(&self, node: u64) -> bool {
        self.down.lock().unwrap_or_else(|e| e.into_inner()).contains(&node)
    }

    /// The newest cluster format `node` reads (format 1 until it tells otherwise).
    pub(crate) fn format_of(&self, node: u64) -> u64 {
        let formats = self.formats.lock().unwrap_or_else(|e| e.into_inner());
        formats.get(&node).copied().unwrap_or(format::OLDEST)
    }

    fn set_format(&self, node: u64, reads: u64) {
        let mut formats = self.formats.lock().unwrap_or_else(|e| e.into_inner());
        if formats.insert(node, reads).unwrap_or(format::OLDEST) != reads {
            info!(node, "the peer reads cluster formats up to {reads}");
        }
    }

    fn set_down(&self, node: u64, down: bool) {
        let mut set = self.down.lock().unwrap_or_else(|e| e.into_inner());
        match down {
            true => set.insert(node),
            false => set.remove(&node),
        };
    }

    /// The link to node `to`, started on first use.
    fn link(&self, shared: &Arc<Shared>, to: u64) -> mpsc::Sender<Outgoing> {
        let mut links = self.links.lock().unwrap_or_else(|e| e.into_inner());
        links
            .entry(to)
            .or_insert_with(|| {
                let (tx, rx) = mpsc::channel(QUEUE_LIMIT);
                tokio::spawn(run_link(shared.clone(), to, rx));
                tx
            })
            .clone()
    }

    /// Open a link to each of `nodes` that has none: each tells the cluster format it reads
    /// as it connects, even to a node that has nothing to send it.
    pub(crate) fn reach(&self, shared: &Arc<Shared>, nodes: impl Iterator<Item = u64>) {
        for node in nodes {
            let known = self.links.lock().unwrap_or_else(|e| e.into_inner()).contains_key(&node);
            if !known {
                self.link(shared, node);
            }
        }
    }

    /// One request to the node at `address` (as `client`, with `key`), on an idle
    /// connection if there is one; the connection is kept for the next once answered.
    pub(crate) async fn request(
        &self,
        address: &str,
        client: &str,
        key: &str,
        tls: Option<&Tls>,
        request: Vec<Value>,
    ) -> Result<Value, Error> {
        let mut items = vec![Value::from(1)];
        items.extend(request);
        let request = Value::Array(items);
        let idle = self
            .idle
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get_mut(address)
            .and_then(Vec::pop);
        let (mut stream, reused) = match idle {
            Some(stream) => (stream, true),
            None => (open(address, client, key, tls).await?.0, false),
        };
        let mut reply = tokio::time::timeout(REPLY_TIMEOUT, roundtrip(&mut stream, request.clone())).await;
        if reused && matches!(&reply, Ok(Err(e)) if e.kind == ErrorKind::Busy) {
            // The idle connection broke meanwhile (the peer restarted): a new one. The
            // requests sent this way are idempotent.
            stream = open(address, client, key, tls).await?.0;
            reply = tokio::time::timeout(REPLY_TIMEOUT, roundtrip(&mut stream, request)).await;
        }
        let reply = reply.map_err(|_| Error::new(ErrorKind::Busy, format!("{address} did not answer within 5 s")))?;
        // A broken connection is dropped; one that answered (even an error) is kept.
        if !reply
            .as_ref()
            .is_err_and(|e| matches!(e.kind, ErrorKind::Busy | ErrorKind::ProtocolError))
        {
            let mut idle = self.idle.lock().unwrap_or_else(|e| e.into_inner());
            let kept = idle.entry(address.to_string()).or_default();
            if kept.len() < IDLE_PER_PEER {
                kept.push(stream);
            }
        }
        reply
    }

    /// Queue `messages` of shard `group` for node `to`.
    pub(crate) fn send(&self, shared: &Arc<Shared>, to: u64, group: u64, messages: Vec<Vec<u8>>) {
        let link = self.link(shared, to);
        // Full: the peer is not keeping up (or is down); Raft will retry.
        let mut batch = Vec::new();
        let mut bytes = 0;
        for m in messages {
            if bytes + m.len() > FRAME_BYTES && !batch.is_empty() {
                let _ = link.try_send(Outgoing::Messages(group, std::mem::take(&mut batch)));
                bytes = 0;
            }
            bytes += m.len();
            batch.push(m);
        }
        if !batch.is_empty() {
            let _ = link.try_send(Outgoing::Messages(group, batch));
        }
    }

    /// Queue shard `group`'s `MsgSnapshot` for node `to` (`message`, without its data), to
    /// be followed by the data of snapshot file `path`.
    pub(crate) fn send_snapshot(&self, shared: &Arc<Shared>, to: u64, group: u64, message: Vec<u8>, path: PathBuf) {
        let _ = self.link(shared, to).try_send(Outgoing::Snapshot(group, message, path));
    }
}

async fn run_link(shared: Arc<Shared>, to: u64, mut rx: mpsc::Receiver<Outgoing>) {
    let Some(cluster) = shared.cluster.as_ref() else { return };
    let mut next_id = 1u64;
    loop {
        let Some(address) = cluster.address_of(to) else {
            // Not known yet (it is learned from the log and from the peer's own messages).
            if drop_until(&mut rx, RECONNECT_AFTER).await {
                return;
            }
            continue;
        };
        let key = shared.access.cluster_key().unwrap_or_default();
        let (stream, reads) = match open(&address, &cluster.name(), key, shared.tls.as_ref()).await {
            Ok(opened) => {
                info!(node = to, %address, "connected to peer");
                cluster.peers.set_down(to, false);
                cluster.peers.set_format(to, opened.1);
                opened
            }
            Err(e) => {
                debug!(node = to, %address, "cannot reach peer: {e}");
                cluster.peers.set_down(to, true);
                if drop_until(&mut rx, RECONNECT_AFTER).await {
                    return;
                }
                continue;
            }
        };
        // The frames' format: the newest both ends read (format 1's frames name none).
        let link_format = reads.min(format::NEWEST);
        let (mut reader, mut writer) = tokio::io::split(stream);
        // Raft requests are never answered: an answer is an error (a token that differs).
        let outcome = tokio::select! {
            _ = async {
                let mut buf = vec![0u8; 4096];
                let mut warned = false;
                while let Ok(n) = reader.read(&mut buf).await {
                    if n == 0 { break; }
                    if !warned {
                        warn!(
                            node = to,
                            "the peer refused Raft messages: {} (do all nodes have the same --cluster-key?)",
                            String::from_utf8_lossy(&buf[..n]).escape_debug()
                        );
                        warned = true;
                    }
                }
            } => "the peer closed the link".to_string(),
            e = async {
                let mut out = Vec::new();
                // Parts well under the receiver's frame limit (ours, as nodes share settings).
                let part = (shared.config.max_frame / 2).clamp(1, FRAME_BYTES);
                while let Some(first) = rx.recv().await {
                    // Whatever else the groups queued meanwhile goes in the same write.
                    let mut next = Some(first);
                    while let Some(outgoing) = next.take() {
                        let (group, messages) = match outgoing {
                            Outgoing::Messages(group, messages) => (group, messages),
                            Outgoing::Snapshot(group, message, path) => {
                                // What is queued goes first, in order.
                                if let Err(e) = send(&mut writer, &out).await {
                                    return e.to_string();
                                }
                                out.clear();
                                let header = |id: u64| -> Vec<Value> {
                                    vec![id.into(), "snapshot".into(), cluster.node_id.into(),
                                         cluster.address.as_str().into(), group.into()]
                                };
                                if let Err(e) = stream_snapshot(&mut writer, &path, message, part, &mut next_id, header, link_format).await {
                                    return e;
                                }
                                next = rx.try_recv().ok();
                                continue;
                            }
                        };
                        let request = |id: u64, messages: Vec<Value>, more: bool| {
                            let mut items = vec![
                                id.into(),
                                "raft".into(),
                                cluster.node_id.into(),
                                cluster.address.as_str().into(),
                                group.into(),
                                Value::Array(messages),
                            ];
                            if more || link_format > format::OLDEST {
                                items.push(more.into());
                            }
                            if link_format > format::OLDEST {
                                items.push(link_format.into());
                            }
                            Value::Array(items)
                        };
                        // In their order: runs of messages up to `part` bytes per frame, and
                        // a message over it (a snapshot) in consecutive parts.
                        let mut run: Vec<Value> = Vec::new();
                        let mut run_bytes = 0;
                        for message in messages {
                            if !run.is_empty() && run_bytes + message.len() > part {
                                append_frame(&mut out, &request(next_id, std::mem::take(&mut run), false));
                                next_id += 1;
                                run_bytes = 0;
                            }
                            if message.len() <= part {
                                run_bytes += message.len();
                                run.push(Value::Binary(message));
                                continue;
                            }
                            let count = message.len().div_ceil(part);
                            for (i, chunk) in message.chunks(part).enumerate() {
                                let frame = request(next_id, vec![Value::Binary(chunk.to_vec())], i + 1 < count);
                                append_frame(&mut out, &frame);
                                next_id += 1;
                                // Written as they are made: a large message is not copied whole.
                                if out.len() >= FRAME_BYTES {
                                    if let Err(e) = send(&mut writer, &out).await {
                                        return e.to_string();
                                    }
                                    out.clear();
                                }
                            }
                        }
                        if !run.is_empty() {
                            append_frame(&mut out, &request(next_id, run, false));
                            next_id += 1;
                        }
                        if out.len() < FRAME_BYTES {
                            next = rx.try_recv().ok();
                        }
                    }
                    if let Err(e) = send(&mut writer, &out).await {
                        return e.to_string();
                    }
                    out.clear();
                    // Keep the buffer from pinning a snapshot's worth of memory.
                    out.shrink_to(FRAME_BYTES);
                }
                "the server is stopping".to_string()
            } => e,
        };
        debug!(node = to, "peer link ended: {outcome}");
        cluster.peers.set_down(to, true);
        if rx.is_closed() {
            return;
        }
    }
}

/// Send snapshot file `path`'s data after `message` (a `MsgSnapshot` without its data) as
/// `snapshot` frames of up to `part` bytes, read from the file as they go (`header` makes a
/// frame's first items; `link_format` its last, past format 1). A file that is gone (pruned meanwhile) sends nothing: Raft asks
/// again. Fails, ending the link, when the file breaks off mid-way.
async fn stream_snapshot(
    writer: &mut (impl AsyncWrite + Unpin),
    path: &Path,
    message: Vec<u8>,
    part: usize,
    next_id: &mut u64,
    header: impl Fn(u64) -> Vec<Value>,
    link_format: u64,
) -> Result<(), String> {
    let (_, mut data, len) = match super::store::open_snapshot_file(path) {
        Ok(opened) => opened,
        Err(e) => {
            warn!("a snapshot to send cannot be read: {e}");
            return Ok(());
        }
    };
    let mut message = Some(message);
    let (mut sent, mut chunk) = (0u64, vec![0u8; part.max(1)]);
    loop {
        // Reading up to a frame from the file: off the async workers' duty meanwhile.
        let filled = tokio::task::block_in_place(|| {
            let mut filled = 0;
            while filled < chunk.len() {
                match data.read(&mut chunk[filled..]) {
                    Ok(0) => break,
                    Ok(n) => filled += n,
                    Err(e) => return Err(e),
                }
            }
            Ok(filled)
        })
        .map_err(|e| {
            // A damaged snapshot file: the peer gets nothing (a new snapshot replaces it).
            error!("cannot send the snapshot {}: {e}", path.display());
            format!("reading {}: {e}", path.display())
        })?;
        sent += filled as u64;
        if filled == 0 && sent < len {
            return Err(format!("{} ended before its {len} bytes of data", path.display()));
        }
        let more = sent < len;
        let mut items = header(*next_id);
        items.push(message.take().map_or(Value::Nil, Value::Binary));
        items.push(Value::Binary(chunk[..filled].to_vec()));
        items.push(more.into());
        if link_format > format::OLDEST {
            items.push(link_format.into());
        }
        *next_id += 1;
        send(writer, &frame(&Value::Array(items)))
            .await
            .map_err(|e| e.to_string())?;
        if !more {
            return Ok(());
        }
    }
}

/// Write `bytes` and push them onto the wire (TLS buffers what it encrypts until flushed).
async fn send(writer: &mut (impl AsyncWrite + Unpin), bytes: &[u8]) -> std::io::Result<()> {
    writer.write_all(bytes).await?;
    writer.flush().await
}

/// Drop queued messages for `wait`; true when the queue closed.
async fn drop_until(rx: &mut mpsc::Receiver<Outgoing>, wait: Duration) -> bool {
    let deadline = tokio::time::Instant::now() + wait;
    loop {
        match tokio::time::timeout_at(deadline, rx.recv()).await {
            Ok(Some(_)) => continue,
            Ok(None) => return true,
            Err(_) => return false,
        }
    }
}

/// One request frame.
fn frame(request: &Value) -> Vec<u8> {
    let mut out = Vec::new();
    append_frame(&mut out, request);
    out
}

/// Append one request frame to `out`.
fn append_frame(out: &mut Vec<u8>, request: &Value) {
    let start = out.len();
    out.extend_from_slice(&[0u8; 4]);
    // Writing MessagePack to a Vec cannot fail.
    rmpv::encode::write_value(out, request).expect("encoding to memory");
    let len = (out.len() - start - 4) as u32;
    out[start..start + 4].copy_from_slice(&len.to_be_bytes());
}

/// Connect to a node (with TLS when this node has it) and say hello as `client`, a node of
/// the cluster (with its key); also returns the newest cluster format the node reads.
async fn open(address: &str, client: &str, key: &str, tls: Option<&Tls>) -> Result<(Box<dyn Stream>, u64), Error> {
    let unavailable = |e: String| Error::new(ErrorKind::Busy, format!("cannot reach {address}: {e}"));
    let stream = tokio::time::timeout(CONNECT_TIMEOUT, TcpStream::connect(address))
        .await
        .map_err(|_| unavailable("timed out".into()))?
        .map_err(|e| unavailable(e.to_string()))?;
    let _ = stream.set_nodelay(true);
    let mut stream: Box<dyn Stream> = match tls {
        Some(tls) => tls
            .connect(address, stream)
            .await
            .map_err(|e| unavailable(format!("TLS: {e}")))?,
        None => Box::new(stream),
    };
    let hello = vec![
        (Value::from("client"), Value::from(client)),
        (Value::from("protocol"), Value::from(1)),
        (Value::from("user"), Value::from(NODE_USER)),
        (Value::from("token"), Value::from(key)),
    ];
    let hello = roundtrip(
        &mut stream,
        Value::Array(vec![0.into(), "hello".into(), Value::Map(hello)]),
    );
    // A paused peer's kernel still accepts the connection: the hello must answer in time.
    let reply = tokio::time::timeout(REPLY_TIMEOUT, hello)
        .await
        .map_err(|_| unavailable("no answer to hello within 5 s".into()))??;
    Ok((stream, reads_format(&reply)))
}

/// The newest cluster format a node reads, as its `hello` reply tells (none: format 1).
fn reads_format(reply: &Value) -> u64 {
    let field = reply.as_map().and_then(|fields| {
        fields
            .iter()
            .find(|(k, _)| k.as_str() == Some("cluster_format"))
            .and_then(|(_, v)| v.as_u64())
    });
    field.unwrap_or(format::OLDEST).max(format::OLDEST)
}

/// Send one request and read its reply.
async fn roundtrip(stream: &mut (impl AsyncRead + AsyncWrite + Unpin), request: Value) -> Result<Value, Error> {
    let broken = |e: std::io::Error| Error::new(ErrorKind::Busy, format!("connection to a peer failed: {e}"));
    send(stream, &frame(&request)).await.map_err(broken)?;
    let mut len = [0u8; 4];
    stream.read_exact(&mut len).await.map_err(broken)?;
    let mut body = vec![0u8; u32::from_be_bytes(len) as usize];
    stream.read_exact(&mut body).await.map_err(broken)?;
    let reply = rmpv::decode::read_value(&mut &body[..])
        .map_err(|e| Error::new(ErrorKind::ProtocolError, format!("a peer's reply does not decode: {e}")))?;
    let bad = || Error::new(ErrorKind::ProtocolError, "a peer's reply is not [id, status, result]");
    let Value::Array(mut items) = reply else {
        return Err(bad());
    };
    if items.len() != 3 {
        return Err(bad());
    }
    let result = items.pop().unwrap_or(Value::Nil);
    match items[1].as_u64() {
        Some(0) => Ok(result),
        Some(_) => Err(error_of(result)),
        None => Err(bad()),
    }
}

fn error_of(result: Value) -> Error {
    let Value::Array(items) = result else {
        return Error::new(ErrorKind::ProtocolError, "a peer's error reply is malformed");
    };
    let kind = items
        .first()
        .and_then(Value::as_str)
        .and_then(ErrorKind::from_name)
        .unwrap_or(ErrorKind::Internal);
    let message = items.get(1).and_then(Value::as_str).unwrap_or("").to_string();
    Error::new(kind, message).with_data(items.get(2).cloned().unwrap_or(Value::Nil))
}

/// One request to the node at `address` on a connection of its own (joining a cluster).
pub(crate) async fn request(
    address: &str,
    client: &str,
    key: &str,
    tls: Option<&Tls>,
    request: Vec<Value>,
) -> Result<Value, Error> {
    let (mut stream, _) = open(address, client, key, tls).await?;
    let mut items = vec![Value::from(1)];
    items.extend(request);
    tokio::time::timeout(REPLY_TIMEOUT, roundtrip(&mut stream, Value::Array(items)))
        .await
        .map_err(|_| Error::new(ErrorKind::Busy, format!("{address} did not answer within 5 s")))?
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_hello_reply_without_a_cluster_format_is_of_the_first_release() {
        let reply = |fields: Vec<(Value, Value)>| Value::Map(fields);
        assert_eq!(reads_format(&reply(vec![("node".into(), 2.into())])), 1);
        let newer = reply(vec![("cluster_format".into(), (format::NEWEST + 1).into())]);
        assert_eq!(reads_format(&newer), format::NEWEST + 1);
        assert_eq!(reads_format(&reply(vec![("cluster_format".into(), 0.into())])), 1);
    }

    #[tokio::test]
    async fn a_peer_that_accepts_and_never_answers_fails_the_hello_in_time() {
        // Like a paused node: the kernel completes the connection, nobody reads it.
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let address = listener.local_addr().unwrap().to_string();
        let opened = tokio::time::timeout(Duration::from_secs(60), open(&address, "test", "key", None)).await;
        let Err(error) = opened.expect("open waited on a peer that never answers") else {
            panic!("a peer that never answers opened");
        };
        assert_eq!(error.kind, ErrorKind::Busy);
        assert!(error.message.contains("no answer to hello"), "{}", error.message);
        drop(listener);
    }
}
