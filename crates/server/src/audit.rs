//! The log of what clients do wrong: refusals (the audit trail), protocol faults and failed
//! calls, whether answered at once or later (a woken waiter, an object host's or a
//! function's result). A client is logged once a minute at most for each (each kind of error
//! of a failed call its own, so the first of each is seen), with how many lines the quiet
//! spell held back, so that a client hammering the server with bad credentials or bad frames
//! cannot flood its log (nor grow this table without bound). What is still held back when
//! the server stops is said then.

use ahash::HashMap;
use std::io;
use std::net::{IpAddr, Ipv4Addr};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use spindle_core::{ConnId, Error, ErrorKind};
use tracing::{debug, error, info, warn};

/// At most one line per client in this long.
const EVERY: Duration = Duration::from_secs(60);
/// Clients remembered at once; past it, the ones quiet for a minute are forgotten, and while
/// none is, a refusal from yet another client is logged unremembered.
const MAX_CLIENTS: usize = 4096;

#[derive(Default)]
pub(crate) struct Audit {
    /// Per client and kind of line: when it was last logged, and the lines held back since.
    clients: Mutex<HashMap<(IpAddr, Kind), (Instant, u64)>>,
}

/// The address of lines no client can be named for: a reply to a connection closed since,
/// the server's own `accept`.
const NOBODY: IpAddr = IpAddr::V4(Ipv4Addr::UNSPECIFIED);

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Kind {
    Refusal,
    Fault,
    Failed(ErrorKind),
    /// `accept` failed (out of descriptors, which clients opening connections cause).
    Accept,
}

impl Kind {
    fn describe(self) -> String {
        match self {
            Kind::Refusal => "refusals".to_string(),
            Kind::Fault => "protocol faults".to_string(),
            Kind::Failed(kind) => format!("{} errors", kind.as_str()),
            Kind::Accept => "failed accepts".to_string(),
        }
    }
}

impl Audit {
    /// A request of the client at `peer` was refused (`why`: what it was told).
    pub(crate) fn refused(&self, peer: IpAddr, why: &str) {
        if let Some(since) = self.admit((peer, Kind::Refusal), Instant::now()) {
            match since {
                0 => warn!(%peer, "refused: {why}"),
                n => warn!(%peer, "refused: {why} (suppressed {n} similar in the last minute)"),
            }
        }
    }

    /// The client at `peer` broke the protocol (`what`: what it was told).
    pub(crate) fn fault(&self, peer: IpAddr, what: &str) {
        if let Some(since) = self.admit((peer, Kind::Fault), Instant::now()) {
            match since {
                0 => warn!(%peer, "{what}"),
                n => warn!(%peer, "{what} (suppressed {n} similar in the last minute)"),
            }
        }
    }

    /// The error reply `e` to request `id` of connection `conn`, of the client at `peer`
    /// (`None`: the connection closed since): one log line, summarized as the kind of error
    /// asks (see [`log_error_reply`]).
    pub(crate) fn error_reply(&self, peer: Option<IpAddr>, conn: ConnId, id: u64, e: &Error) {
        let peer = peer.unwrap_or(NOBODY);
        match e.kind {
            ErrorKind::Unauthorized | ErrorKind::PermissionDenied => self.refused(peer, &e.message),
            // A client's own fault: as many as it likes to send, so summarized.
            ErrorKind::ProtocolError | ErrorKind::FrameTooLarge | ErrorKind::NoSession => {
                let line = format!("{}: {} (connection {conn}, request {id})", e.kind.as_str(), e.message);
                self.fault(peer, &line)
            }
            kind if is_control_flow(kind) => log_error_reply(conn, id, e, 0),
            // Bad calls, calls refused at a limit (`--max-memory`), failed functions: as many
            // as a client likes to make, so summarized too.
            kind => {
                if let Some(suppressed) = self.admit((peer, Kind::Failed(kind)), Instant::now()) {
                    log_error_reply(conn, id, e, suppressed)
                }
            }
        }
    }

    /// Accepting a connection failed (usually out of file descriptors, retried every few
    /// milliseconds while it lasts).
    pub(crate) fn accept_failed(&self, e: &io::Error) {
        match self.admit((NOBODY, Kind::Accept), Instant::now()) {
            Some(0) => warn!("accept failed: {e}"),
            Some(n) => warn!("accept failed: {e} (suppressed {n} similar in the last minute)"),
            None => {}
        }
    }

    /// The server stops: say how many lines each client's quiet spell still holds back.
    pub(crate) fn flush(&self) {
        let mut clients = self.clients.lock().unwrap_or_else(|e| e.into_inner());
        let mut held: Vec<((IpAddr, Kind), u64)> = clients
            .drain()
            .filter(|(_, (_, held))| *held > 0)
            .map(|(key, (_, held))| (key, held))
            .collect();
        held.sort_unstable_by_key(|((peer, _), _)| *peer);
        for ((peer, kind), n) in held {
            let what = kind.describe();
            match kind {
                // At the level of the lines held back.
                Kind::Failed(_) => info!(%peer, "suppressed {n} similar lines of {what} since the last logged"),
                _ => warn!(%peer, "suppressed {n} similar lines of {what} since the last logged"),
            }
        }
    }

    /// Whether to log a line at `now`: `Some(lines held back since the last one)`.
    fn admit(&self, peer: (IpAddr, Kind), now: Instant) -> Option<u64> {
        let mut clients = self.clients.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((logged, held)) = clients.get_mut(&peer) {
            if now.duration_since(*logged) < EVERY {
                *held += 1;
                return None;
            }
            let since = std::mem::take(held);
            *logged = now;
            return Some(since);
        }
        if clients.len() >= MAX_CLIENTS {
            clients.retain(|_, (logged, _)| now.duration_since(*logged) < EVERY);
        }
        if clients.len() < MAX_CLIENTS {
            clients.insert(peer, (now, 0));
        }
        Some(0)
    }
}

/// Outcomes that are ordinary control flow (an empty queue, a timed-out wait, a missing key,
/// an exception a user-defined method raised), logged at debug, so a busy server's log is
/// not flooded by `get_nowait`.
pub(crate) fn is_control_flow(kind: ErrorKind) -> bool {
    matches!(
        kind,
        ErrorKind::Empty
            | ErrorKind::Full
            | ErrorKind::Timeout
            | ErrorKind::KeyError
            | ErrorKind::IndexError
            | ErrorKind::BrokenBarrier
            | ErrorKind::Cancelled
            | ErrorKind::FutureException
            | ErrorKind::Raised
            | ErrorKind::Moved
            | ErrorKind::NotLeader
            | ErrorKind::TransactionConflict
    )
}

/// One log line per error reply: client faults at warn, failures a caller should look into
/// at info, control flow at debug; `suppressed`: similar lines held back before this one.
fn log_error_reply(conn: ConnId, id: u64, e: &Error, suppressed: u64) {
    let kind = e.kind.as_str();
    let message = match suppressed {
        0 => e.message.clone(),
        n => format!("{} (suppressed {n} similar in the last minute)", e.message),
    };
    match e.kind {
        ErrorKind::ProtocolError | ErrorKind::FrameTooLarge | ErrorKind::NoSession | ErrorKind::Unauthorized => {
            warn!(conn, id, kind, "{message}")
        }
        ErrorKind::Internal => error!(conn, id, kind, "{message}"),
        kind if is_control_flow(kind) => debug!(conn, id, kind = kind.as_str(), "{message}"),
        _ => info!(conn, id, kind, "{message}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_client_is_logged_once_a_minute_with_what_it_held_back() {
        let audit = Audit::default();
        let (a, b): (IpAddr, IpAddr) = ("10.0.0.1".parse().unwrap(), "10.0.0.2".parse().unwrap());
        let t0 = Instant::now();
        assert_eq!(audit.admit((a, Kind::Refusal), t0), Some(0));
        for i in 1..=5 {
            assert_eq!(audit.admit((a, Kind::Refusal), t0 + Duration::from_secs(i)), None);
        }
        assert_eq!(
            audit.admit((b, Kind::Refusal), t0 + Duration::from_secs(6)),
            Some(0),
            "another client is its own"
        );
        assert_eq!(audit.admit((a, Kind::Refusal), t0 + EVERY), Some(5));
        assert_eq!(
            audit.admit((a, Kind::Refusal), t0 + EVERY + Duration::from_secs(1)),
            None
        );
    }

    #[test]
    fn the_table_stays_bounded() {
        let audit = Audit::default();
        let t0 = Instant::now();
        for i in 0..(MAX_CLIENTS as u32 + 100) {
            let peer = IpAddr::from(i.to_be_bytes());
            assert_eq!(
                audit.admit((peer, Kind::Fault), t0),
                Some(0),
                "a new client is always logged"
            );
        }
        assert_eq!(audit.clients.lock().unwrap().len(), MAX_CLIENTS);
        // A minute on, the quiet ones make room.
        let late = IpAddr::from([255, 255, 255, 255]);
        assert_eq!(audit.admit((late, Kind::Fault), t0 + EVERY), Some(0));
        assert_eq!(audit.clients.lock().unwrap().len(), 1);
    }
}
