//! Sessions: a client id shared by every connection of one client process. A session ends
//! `session_ttl` after its last connection closes, unless a connection comes back first.
//! A session with a secret (`#` ids, see `spindle_proto::session`) is opened and resumed
//! only by connections that give its secret.

use ahash::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Instant;

use spindle_core::{Error, ErrorKind, Value};
use spindle_proto::{session_id, MIN_SECRET_LEN, SECRET_SESSION_PREFIX};

use crate::{hosts, Shared};

struct Session {
    /// The client id, shared by the session's connections.
    id: Arc<str>,
    /// Open connections that said hello with this client id.
    connections: usize,
    /// Bumped whenever the connection count changes, so an end scheduled when the last
    /// connection closed can tell that the session was resumed meanwhile.
    epoch: u64,
}

pub(crate) struct Sessions {
    sessions: Mutex<HashMap<Arc<str>, Session>>,
}

impl Sessions {
    pub(crate) fn new() -> Self {
        Sessions {
            sessions: Mutex::new(HashMap::default()),
        }
    }

    fn lock(&self) -> MutexGuard<'_, HashMap<Arc<str>, Session>> {
        // Counters only; consistent even if a holder panicked.
        self.sessions.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Sessions known, including those waiting out their TTL.
    pub(crate) fn count(&self) -> usize {
        self.lock().len()
    }

    /// Whether session `client` is open, or waiting out its TTL (not ended).
    pub(crate) fn is_known(&self, client: &str) -> bool {
        self.lock().contains_key(client)
    }

    /// A connection said hello. Returns the shared client id and whether the session was
    /// already known (`resumed`).
    pub(crate) fn open(&self, client: &str) -> (Arc<str>, bool) {
        let mut sessions = self.lock();
        if let Some(session) = sessions.get_mut(client) {
            session.connections += 1;
            session.epoch += 1;
            return (session.id.clone(), true);
        }
        let id: Arc<str> = Arc::from(client);
        sessions.insert(
            id.clone(),
            Session {
                id: id.clone(),
                connections: 1,
                epoch: 0,
            },
        );
        (id, false)
    }
}

/// Whether a `hello` as `client` with `secret` may open or resume that session: a secret
/// must be long enough and be the one `client` is the id of, and an id made from a secret
/// needs it (it is the session's capability). Ids without a secret are older clients'.
pub(crate) fn check_secret(client: &str, secret: Option<&str>) -> Result<(), Error> {
    match secret {
        Some(secret) if secret.chars().count() < MIN_SECRET_LEN => Err(Error::new(
            ErrorKind::ProtocolError,
            format!("a session secret has {MIN_SECRET_LEN} characters at least"),
        )),
        Some(secret) if session_id(secret) != client => Err(Error::new(
            ErrorKind::ProtocolError,
            format!(
                "'client' must be the id of the session's secret ({})",
                session_id(secret)
            ),
        )),
        None if client.starts_with(SECRET_SESSION_PREFIX) => Err(Error::new(
            ErrorKind::Unauthorized,
            format!("session '{client}' is resumed with its secret only"),
        )),
        _ => Ok(()),
    }
}

/// A connection of `client` closed. If it was the last one, end the session after the TTL
/// unless a connection with the same client id comes back in the meantime.
pub(crate) fn connection_closed(shared: &Arc<Shared>, client: Arc<str>) {
    let epoch = {
        let mut sessions = shared.sessions.lock();
        let Some(session) = sessions.get_mut(&client) else {
            return;
        };
        session.connections = session.connections.saturating_sub(1);
        session.epoch += 1;
        if session.connections > 0 {
            return;
        }
        session.epoch
    };
    end_after_ttl(shared, client, epoch);
}

/// `define` of a class (`hosts::define`), for a caller allowed to define (`unless_defined`
/// is None). The unnamed objects of sessions with no connection left (a program that ended,
/// whose session waits out its TTL) count as gone at once: those sessions end now if their
/// objects are what holds the registered version, so an edited script run again can define
/// its new version right away.
pub(crate) fn define(
    shared: &Arc<Shared>,
    type_name: &str,
    version: &str,
    code: Vec<u8>,
    unless_defined: Option<Error>,
) -> Result<Value, Error> {
    let registered = shared.hosts.classes().get(type_name).map(|c| c.version.clone());
    if let (Some(old), None) = (registered, &unless_defined) {
        if old != version {
            let mut owners: Vec<Arc<str>> = hosts::objects_of_version(shared, type_name, &old)?
                .into_iter()
                .filter_map(|(_, owner)| owner)
                .collect();
            owners.sort_unstable();
            owners.dedup();
            for owner in owners {
                end_if_idle(shared, &owner, None);
            }
        }
    }
    hosts::define(shared, type_name, version, code, unless_defined)
}

/// Sessions named in the op log of a recovered server, or of a shard this node just took
/// the leadership of, that this node does not know: their clients may come back to retry
/// their calls (and get the recorded replies), or never. Like sessions whose last connection
/// just closed, each ends `session_ttl` from now unless a connection comes back first, so
/// its reply log and unnamed objects do not stay forever (in memory and in every snapshot).
pub(crate) fn recovered(shared: &Arc<Shared>, clients: Vec<Arc<str>>) {
    for client in clients {
        {
            let mut sessions = shared.sessions.lock();
            if sessions.contains_key(&client) {
                continue;
            }
            let session = Session {
                id: client.clone(),
                connections: 0,
                epoch: 0,
            };
            sessions.insert(client.clone(), session);
        }
        end_after_ttl(shared, client, 0);
    }
}

fn end_after_ttl(shared: &Arc<Shared>, client: Arc<str>, epoch: u64) {
    let shared = shared.clone();
    tokio::spawn(async move {
        tokio::time::sleep(shared.config.session_ttl).await;
        end_if_idle(&shared, &client, Some(epoch));
    });
}

/// End session `client` if it has no connection (and, given `epoch`, none came and went
/// since its end was scheduled).
fn end_if_idle(shared: &Arc<Shared>, client: &Arc<str>, epoch: Option<u64>) {
    // The sessions lock is held while the shards drop the session, so a `hello` arriving
    // now waits and then starts a fresh session instead of resuming a half-ended one.
    // Lock order is always sessions, then one shard at a time.
    let mut replies = Vec::new();
    let mut actions = Vec::new();
    {
        let mut sessions = shared.sessions.lock();
        match sessions.get(client) {
            Some(s) if s.connections == 0 && epoch.is_none_or(|e| s.epoch == e) => {}
            _ => return,
        }
        sessions.remove(client);
        shared.transactions.end_session(client);
        let now = Instant::now();
        for index in 0..shared.shards.count() {
            match shared.shards.with(index, |s| {
                if !s.serving() {
                    // A follower hears of the session's end from the leader's log.
                    return (Vec::new(), Vec::new());
                }
                let out = s.partition.end_session(client, now);
                let out = s.journal(out);
                (out, hosts::forward(shared, &mut s.partition, None))
            }) {
                Ok((out, more)) => {
                    replies.extend(out);
                    actions.extend(more);
                }
                Err(e) => tracing::error!(shard = index, "could not end session '{client}' there: {e}"),
            }
        }
    }
    tracing::debug!(client = &**client, "session ended");
    shared.registry.deliver(replies);
    hosts::run(shared, actions);
}
