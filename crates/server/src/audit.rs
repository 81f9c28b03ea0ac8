//! The log of what clients do wrong: refusals (the audit trail), protocol faults and failed
//! calls. A client is logged once a minute at most for each (each kind of error of a failed
//! call its own, so the first of each is seen), with how many lines the quiet spell held back,
//! so that a client hammering the server with bad credentials or bad frames cannot flood its
//! log (nor grow this table without bound).

use ahash::HashMap;
use std::net::IpAddr;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use spindle_core::ErrorKind;
use tracing::warn;

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

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Kind {
    Refusal,
    Fault,
    Failed(ErrorKind),
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

    /// A call of the client at `peer` failed with an error of `kind`: whether to log it,
    /// `Some(lines of that kind held back since the last one)`.
    pub(crate) fn failed(&self, peer: IpAddr, kind: ErrorKind) -> Option<u64> {
        self.admit((peer, Kind::Failed(kind)), Instant::now())
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
