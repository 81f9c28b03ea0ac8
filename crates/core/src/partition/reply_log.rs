//! The reply log: each client's recorded replies, so that a retried call (same client and
//! seq) gets its first reply instead of running twice, within count and byte caps.

use std::collections::VecDeque;
use std::sync::Arc;

use super::{storage_error, Partition, Storage};
use crate::{Caller, Delivery, Error, ErrorKind, Reply, Token, Value};

/// How many recorded replies each client keeps per partition. A client never retries a call
/// older than its oldest call in flight, so a window is enough; a client that says which
/// replies it holds (`acked`) keeps only those of its calls in flight.
pub(super) const REPLY_LOG_LEN: usize = 4096;

/// Bytes of replies each client keeps per partition unless told otherwise
/// ([`Partition::set_reply_log_limit`]).
pub const DEFAULT_REPLY_LOG_BYTES: usize = 64 << 20;

/// Bytes of replies all clients keep together per partition unless told otherwise.
pub const DEFAULT_REPLY_LOGS_BYTES: usize = 256 << 20;

#[derive(Default)]
pub(super) struct ReplyLog {
    /// The replies, sorted by sequence number and searched by halves. Rings, not trees: a
    /// client's sequence numbers mostly grow, so a new reply goes at the back (a late one a
    /// few places before it) and the oldest leaves from the front, with no node to allocate,
    /// split or merge (a hash table would touch a random slot of every client's thousands).
    pub(super) replies: VecDeque<Recorded>,
    /// The sequence numbers in the order recorded: the oldest recorded is forgotten first
    /// (not the lowest: a call parked long ago may have been answered just now).
    pub(super) order: VecDeque<u64>,
    /// The highest sequence number recorded: a client's new call is above it, and is known
    /// new without a search.
    pub(super) highest: u64,
    /// The client holds the replies of all its calls below this seq (the highest `acked` it
    /// sent, or the seq of the call that sent it if lower): it never sends those again, so a
    /// copy of one arriving now (delayed in the network, say, on a connection the client
    /// gave up) is refused, not run again.
    pub(super) acked_below: u64,
    /// Calls at or above `acked_below` whose replies were forgotten for room (sorted, at
    /// most [`REPLY_LOG_LEN`]): a retry of one is refused, not run a second time.
    pub(super) forgotten: VecDeque<u64>,
    /// About how many bytes the replies take.
    pub(super) bytes: usize,
}

pub(super) struct Recorded {
    pub(super) seq: u64,
    /// Boxed: most replies are values, and a busy client keeps thousands.
    pub(super) reply: Result<Value, Box<Error>>,
    /// Whether the call is in the op log (only those go into snapshots: a replay would not
    /// have recorded the others).
    pub(super) durable: bool,
}

impl ReplyLog {
    /// Record `seq`'s reply, forgetting the oldest recorded while the log holds
    /// [`REPLY_LOG_LEN`] replies or would pass `max_bytes`.
    pub(super) fn record(&mut self, seq: u64, reply: Reply, durable: bool, max_bytes: usize) {
        let reply = reply.map_err(Box::new);
        let size = reply_size(&reply);
        self.bytes += size;
        if let Some(i) = self.position(seq) {
            let r = &mut self.replies[i];
            self.bytes -= reply_size(&r.reply);
            (r.reply, r.durable) = (reply, durable);
            return;
        }
        if let Ok(i) = self.forgotten.binary_search(&seq) {
            self.forgotten.remove(i); // a replica replaying it records it again
        }
        // Forget first: the rings never grow past their length, nor the log past its bytes.
        while (self.order.len() >= REPLY_LOG_LEN || self.bytes > max_bytes) && self.forget_oldest() {}
        self.order.push_back(seq);
        let recorded = Recorded { seq, reply, durable };
        if seq > self.highest {
            self.highest = seq;
            self.replies.push_back(recorded);
        } else {
            // A late call: the ring moves the few replies recorded above it.
            let i = self.replies.partition_point(|r| r.seq < seq);
            self.replies.insert(i, recorded);
        }
    }

    /// Forget the oldest recorded reply; false if none is left.
    pub(super) fn forget_oldest(&mut self) -> bool {
        let Some(old) = self.order.pop_front() else {
            return false;
        };
        let at = match self.replies.front() {
            Some(r) if r.seq == old => Some(0),
            _ => self.position(old),
        };
        if let Some(r) = at.and_then(|i| self.replies.remove(i)) {
            self.bytes -= reply_size(&r.reply);
            self.remember_forgotten(old);
        }
        true
    }

    /// Forget the replies below `seq`, and refuse those calls from now on: their client holds
    /// the replies, and never sends the calls again.
    pub(super) fn acknowledge(&mut self, seq: u64) {
        self.acked_below = self.acked_below.max(seq);
        if self.replies.front().is_none_or(|r| r.seq >= seq) {
            return;
        }
        let kept = self.replies.partition_point(|r| r.seq < seq);
        let forgotten: usize = self.replies.drain(..kept).map(|r| reply_size(&r.reply)).sum();
        self.bytes -= forgotten;
        // Short: only the calls in flight are left.
        self.order.retain(|&s| s >= seq);
        let gone = self.forgotten.partition_point(|&s| s < seq);
        self.forgotten.drain(..gone);
    }

    fn remember_forgotten(&mut self, seq: u64) {
        if self.forgotten.len() >= REPLY_LOG_LEN {
            self.forgotten.pop_front();
        }
        match self.forgotten.back() {
            Some(&last) if last > seq => {
                let i = self.forgotten.partition_point(|&s| s < seq);
                self.forgotten.insert(i, seq);
            }
            _ => self.forgotten.push_back(seq),
        }
    }

    /// Whether `seq`'s reply was recorded, then forgotten for room.
    pub(super) fn was_forgotten(&self, seq: u64) -> bool {
        self.forgotten.binary_search(&seq).is_ok()
    }

    fn position(&self, seq: u64) -> Option<usize> {
        if seq > self.highest {
            return None;
        }
        self.replies.binary_search_by_key(&seq, |r| r.seq).ok()
    }

    /// The reply recorded for `seq`, and whether its call is in the op log.
    pub(super) fn get(&self, seq: u64) -> Option<(Reply, bool)> {
        let r = &self.replies[self.position(seq)?];
        Some((r.reply.clone().map_err(|e| *e), r.durable))
    }

    /// The replies of logged calls, oldest recorded first (what a snapshot carries).
    pub(super) fn durable(&self) -> impl Iterator<Item = (u64, Reply)> + '_ {
        self.order.iter().filter_map(|&seq| match self.get(seq) {
            Some((reply, true)) => Some((seq, reply)),
            _ => None,
        })
    }
}

/// About how many bytes a recorded reply takes.
fn reply_size(reply: &Result<Value, Box<Error>>) -> usize {
    std::mem::size_of::<Recorded>()
        + match reply {
            Ok(value) => crate::value::approx_size(value),
            Err(e) => std::mem::size_of::<Error>() + e.message.len() + crate::value::approx_size(&e.data),
        }
}

pub(super) struct ReplyLogLimit {
    pub(super) per_client: usize,
    pub(super) total: usize,
}

impl Default for ReplyLogLimit {
    fn default() -> Self {
        ReplyLogLimit {
            per_client: DEFAULT_REPLY_LOG_BYTES,
            total: DEFAULT_REPLY_LOGS_BYTES,
        }
    }
}

impl Partition {
    /// Keep at most `per_client` bytes of a client's recorded replies here (it acknowledges
    /// none, say), forgetting its oldest; and at most `total` of all clients' together,
    /// forgetting the oldest of the largest log first, so that clients opening session
    /// after session, each filling its log, cannot take the server's memory.
    pub fn set_reply_log_limit(&mut self, per_client: usize, total: usize) {
        self.reply_log_limit = ReplyLogLimit { per_client, total };
    }

    /// `client` holds the replies of its calls below `seq`: forget them (see
    /// [`ReplyLog::acknowledge`]).
    pub(super) fn acknowledge(&mut self, client: &Arc<str>, seq: u64) {
        // The client's log is found by reference: its name is cloned only for a new one.
        let log = match self.logs.get_mut(client) {
            Some(log) => log,
            None => self.logs.entry(client.clone()).or_default(),
        };
        let before = log.bytes;
        log.acknowledge(seq);
        self.logs_bytes -= before - log.bytes;
    }

    /// Refuse a live call `seq` of `client` that must not run (again): a stale copy of a call
    /// whose reply the client acknowledged, or one whose reply was forgotten for room.
    pub(super) fn check_fresh(&self, client: &Arc<str>, seq: u64) -> Result<(), Error> {
        let Some(log) = self.logs.get(client) else {
            return Ok(());
        };
        if seq < log.acked_below {
            return Err(Error::new(
                ErrorKind::ProtocolError,
                format!(
                    "call {seq} of this session is not run again: its session acknowledged the replies of \
                     its calls below {}, so this is a stale copy",
                    log.acked_below
                ),
            ));
        }
        if log.was_forgotten(seq) {
            return Err(Error::new(
                ErrorKind::ProtocolError,
                format!(
                    "call {seq} of this session ran, but its reply was forgotten: the session's unacknowledged \
                     replies passed --max-reply-log, so it is not run again"
                ),
            ));
        }
        Ok(())
    }

    /// The reply recorded for a retried call (`client`'s `seq`), if any, as it may be sent
    /// now (a call on a `persistent` object whose log failed may not have been made durable).
    pub(super) fn recorded_reply(&mut self, client: &Arc<str>, seq: u64, persistent: bool) -> Option<Reply> {
        let (reply, _) = self.logs.get(client)?.get(seq)?;
        // A recorded reply may be about a change whose record is still being written
        // (it waits like one), or whose write failed (then it is not durable).
        self.touched_persistent |= self.storage != Storage::None;
        Some(match &self.storage {
            Storage::Failed(why) if persistent => Err(storage_error(why)),
            _ => reply,
        })
    }

    /// Record `seq`'s reply in `client`'s log, within the limits (see
    /// [`set_reply_log_limit`](Self::set_reply_log_limit)).
    pub(super) fn record_reply(&mut self, client: &Arc<str>, seq: u64, reply: Reply, durable: bool) {
        // The client's log is found by reference: its name is cloned only for a new one.
        let log = match self.logs.get_mut(client) {
            Some(log) => log,
            None => self.logs.entry(client.clone()).or_default(),
        };
        let before = log.bytes;
        log.record(seq, reply, durable, self.reply_log_limit.per_client);
        self.logs_bytes = self.logs_bytes + log.bytes - before;
        while self.logs_bytes > self.reply_log_limit.total {
            // The largest other log by bytes, then by name (the same on every replica); this
            // client's own only when no other holds anything, so the reply just recorded
            // stays for a retry.
            let victim = self
                .logs
                .iter()
                .filter(|(other, log)| *other != client && log.bytes > 0)
                .max_by(|a, b| (a.1.bytes, a.0).cmp(&(b.1.bytes, b.0)))
                .map_or_else(|| client.clone(), |(other, _)| other.clone());
            let Some(log) = self.logs.get_mut(&victim) else { break };
            let before = log.bytes;
            if !log.forget_oldest() {
                break;
            }
            self.logs_bytes -= before - log.bytes;
        }
    }

    /// How many replies this partition keeps for retries, over all its clients.
    pub fn recorded_replies(&self) -> usize {
        self.logs.values().map(|log| log.replies.len()).sum()
    }

    /// The recorded replies of logged calls, by client (what a snapshot carries).
    #[cfg(test)]
    pub(crate) fn durable_replies(&self) -> std::collections::BTreeMap<String, Vec<(u64, Reply)>> {
        self.logs
            .iter()
            .map(|(client, log)| {
                let replies = log.durable().collect();
                (client.to_string(), replies)
            })
            .filter(|(_, replies): &(String, Vec<_>)| !replies.is_empty())
            .collect()
    }

    #[allow(clippy::too_many_arguments)]
    pub(super) fn reply(
        &mut self,
        caller: &Caller,
        token: Token,
        seq: u64,
        record: bool,
        logged: bool,
        reply: Reply,
        out: &mut Vec<Delivery>,
    ) {
        if record && seq != 0 {
            self.record_reply(&caller.client, seq, reply.clone(), logged);
        }
        out.push(Delivery { token, reply });
    }
}
