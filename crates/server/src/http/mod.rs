//! The HTTP front end (`spindle server --http-port`): every object reachable with JSON over
//! HTTP/1.1, as docs/http.md describes. It is one more front end over [`crate::calls`], like
//! the native protocol's connections: sessions, exactly-once, permissions, routing to shards,
//! redirects, persistence and replication are the same code.
//!
//! How HTTP meets the native model:
//! - **Who:** each request authenticates with the native credentials (`Authorization: Bearer
//!   <server token>`, or `Basic` with a user and its token), checked by [`crate::access`] (a
//!   credential verified once is remembered there, so Argon2 does not run per request).
//! - **Sessions:** each user has one session for the server's life, its id made from a secret
//!   drawn at start (nobody else can resume it). Its calls carry this front end's connection
//!   id, registered with a [`Mailbox`] instead of a socket: the registry hands each reply to
//!   the request waiting for it, whether the call answered at once or parked.
//! - **Exactly-once:** a request with an `Idempotency-Key` gets a sequence number of its
//!   user's session, remembered for the last [`KEYS_KEPT`] keys; the partition's reply log
//!   answers a retry with the recorded reply. Without a key, `seq` is 0 (may run again).
//! - **Functions:** a function registered by name (the pickle in the `Value` named
//!   `functions/NAME`, run only if its writer may run code) goes through the gateway as a
//!   native `invoke` of the `json` runtime, with the request's JSON arguments.
//! - **Bounds:** bodies of [`MAX_BODY`] bytes, headers of [`MAX_HEADERS`] bytes and counts,
//!   a request's whole time ([`REQUEST_TIMEOUT`]; a parked call is withdrawn after it), and
//!   connections counted with the native ones against `--max-connections`.

mod json;
mod routes;

use ahash::HashMap;
use std::collections::VecDeque;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use hyper_util::rt::{TokioIo, TokioTimer};
use spindle_core::ConnId;
use tokio::net::{TcpListener, TcpStream};
use tracing::{debug, info};

use crate::registry::Mailbox;
use crate::Shared;

/// Largest request body (413 past it).
pub(crate) const MAX_BODY: usize = 10 << 20;
/// Bytes of a request's line and headers hyper buffers at most (431 or a closed connection
/// past it), and how many headers.
const MAX_HEADERS: usize = 64 << 10;
const MAX_HEADER_COUNT: usize = 64;
/// A client must send a request's headers this soon (slow clients hold no connection long).
const HEADER_TIMEOUT: Duration = Duration::from_secs(10);
/// The longest a request takes, body and call together: a call parked longer is withdrawn
/// and answered 408 (long waits belong to a loop of shorter ones).
pub(crate) const REQUEST_TIMEOUT: Duration = Duration::from_secs(60);
/// Idempotency keys remembered per user: as many as the replies each session keeps per
/// partition, so a key is never remembered longer than its reply.
const KEYS_KEPT: usize = 4096;

/// The front end's state, shared by its requests.
pub(crate) struct Front {
    shared: Arc<Shared>,
    /// The connection id every HTTP call carries, and where their replies arrive.
    conn: ConnId,
    mailbox: Arc<Mailbox>,
    next_request: AtomicU64,
    /// Drawn at start: what each user's HTTP session id is made from.
    secret: String,
    sessions: Mutex<HashMap<String, Arc<Session>>>,
}

/// One user's HTTP session.
pub(crate) struct Session {
    client: Arc<str>,
    keys: Mutex<Keys>,
}

/// Idempotency keys and the sequence numbers they were given, the oldest forgotten first.
#[derive(Default)]
struct Keys {
    seqs: HashMap<String, u64>,
    order: VecDeque<String>,
    last: u64,
}

impl Session {
    /// The sequence number of the call sent with `key`: a new one for a new key, the same
    /// for a key seen before (a retry, answered from the reply log).
    fn seq_of(&self, key: &str) -> u64 {
        let mut keys = self.keys.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(&seq) = keys.seqs.get(key) {
            return seq;
        }
        if keys.order.len() >= KEYS_KEPT {
            if let Some(oldest) = keys.order.pop_front() {
                keys.seqs.remove(&oldest);
            }
        }
        keys.last += 1;
        let seq = keys.last;
        keys.seqs.insert(key.to_string(), seq);
        keys.order.push_back(key.to_string());
        seq
    }
}

impl Front {
    fn new(shared: Arc<Shared>) -> std::io::Result<Front> {
        let mailbox = Arc::new(Mailbox::default());
        let conn = shared.registry.register_mailbox(mailbox.clone());
        Ok(Front {
            shared,
            conn,
            mailbox,
            next_request: AtomicU64::new(1),
            secret: crate::process::random_hex(16)?,
            sessions: Mutex::new(HashMap::default()),
        })
    }

    /// The HTTP session of `user`, opened on its first request.
    fn session(&self, user: &str) -> Arc<Session> {
        let mut sessions = self.sessions.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(session) = sessions.get(user) {
            return session.clone();
        }
        let secret = format!("http {} {user}", self.secret);
        let (client, _) = self.shared.sessions.open(&spindle_proto::session_id(&secret));
        let session = Arc::new(Session {
            client,
            keys: Mutex::default(),
        });
        sessions.insert(user.to_string(), session.clone());
        session
    }

    fn next_request(&self) -> u64 {
        self.next_request.fetch_add(1, Ordering::Relaxed)
    }
}

/// Bind the HTTP port (on the native port's host).
pub(crate) async fn bind(host: &str, port: u16) -> std::io::Result<TcpListener> {
    TcpListener::bind((host, port)).await
}

/// Serve HTTP on `listener` until the task is dropped.
pub(crate) async fn run(shared: Arc<Shared>, listener: TcpListener) {
    let front = match Front::new(shared.clone()) {
        Ok(front) => Arc::new(front),
        Err(e) => {
            tracing::error!("cannot start the HTTP front end: {e}");
            return;
        }
    };
    let router = routes::router(front);
    if let Ok(address) = listener.local_addr() {
        info!(%address, tls = shared.tls.is_some(), "serving HTTP");
    }
    loop {
        match listener.accept().await {
            Ok((stream, peer)) => {
                // Counted with the native connections, against the same limit.
                let open = shared.stats.connections.fetch_add(1, Ordering::Relaxed) + 1;
                let (shared, router) = (shared.clone(), router.clone());
                tokio::spawn(async move {
                    let max = shared.config.limits.max_connections;
                    if open > max {
                        let why = format!("the server serves {max} connections at most (--max-connections)");
                        shared.audit.refused(peer.ip(), &why);
                        // Told in plain HTTP; on a TLS port, no handshake at the limit.
                        if shared.tls.is_none() {
                            refuse(stream, why).await;
                        }
                    } else {
                        serve(&shared, stream, peer, router).await;
                    }
                    shared.stats.connections.fetch_sub(1, Ordering::Relaxed);
                });
            }
            Err(e) => {
                shared.audit.accept_failed(&e);
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }
}

/// Answer a connection's first request `503 Busy` (why: `message`), then close it.
async fn refuse(stream: TcpStream, message: String) {
    let busy = hyper::service::service_fn(move |_request| {
        let error = spindle_core::Error::new(spindle_core::ErrorKind::Busy, format!("{message}; try again later"));
        async move { Ok::<_, std::convert::Infallible>(routes::failure(error)) }
    });
    let mut http = hyper::server::conn::http1::Builder::new();
    http.timer(TokioTimer::new())
        .header_read_timeout(HEADER_TIMEOUT)
        .max_buf_size(MAX_HEADERS)
        .keep_alive(false);
    let _ = http.serve_connection(TokioIo::new(stream), busy).await;
}

/// Serve one connection's requests (keep-alive), over TLS when the server has a certificate.
async fn serve(shared: &Arc<Shared>, stream: TcpStream, peer: SocketAddr, router: axum::Router) {
    let _ = stream.set_nodelay(true);
    let service = hyper_util::service::TowerToHyperService::new(router);
    let mut http = hyper::server::conn::http1::Builder::new();
    http.timer(TokioTimer::new())
        .header_read_timeout(HEADER_TIMEOUT)
        .max_buf_size(MAX_HEADERS)
        .max_headers(MAX_HEADER_COUNT)
        .keep_alive(true);
    let served = match &shared.tls {
        None => http.serve_connection(TokioIo::new(stream), service).await,
        Some(tls) => match crate::tls::accept(shared, tls, stream, peer).await {
            Some(stream) => http.serve_connection(TokioIo::new(stream), service).await,
            None => return,
        },
    };
    if let Err(e) = served {
        debug!(%peer, "HTTP connection ended: {e}");
    }
}
