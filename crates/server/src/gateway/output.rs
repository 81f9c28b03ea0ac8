//! What a call printed, as it prints it: the worker sends its output in chunks while the
//! call runs (`[task, 2, {"stdout"|"stderr": bytes}]`), and the gateway forwards each chunk
//! to the caller (when it asked for live output) and to whoever follows the call's logs
//! (`spindle logs -f`), and keeps the last [`TAIL`] bytes for `spindle logs`.
//!
//! Output is hostile too: a call forwards at most [`LIVE_LIMIT`] bytes (the worker keeps as
//! much per stream and call), the tail is a fixed-size window, a call has at most
//! [`MAX_FOLLOWERS`], and the logs of at most [`ENDED_KEPT`] ended calls are kept.

use std::collections::VecDeque;

use spindle_core::{ConnId, Value};

/// Bytes of a call's latest output kept for `logs`.
pub(crate) const TAIL: usize = 64 * 1024;
/// Bytes of output a call forwards (both streams); past it, its output is dropped.
pub(crate) const LIVE_LIMIT: u64 = 2 << 20;
/// Connections following one call's logs at once.
pub(crate) const MAX_FOLLOWERS: usize = 16;
/// Ended calls whose logs `spindle logs` still shows.
pub(crate) const ENDED_KEPT: usize = 32;

/// Which stream a chunk came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Stream {
    Stdout,
    Stderr,
}

impl Stream {
    pub(crate) fn name(self) -> &'static str {
        match self {
            Stream::Stdout => "stdout",
            Stream::Stderr => "stderr",
        }
    }

    pub(crate) fn parse(name: &str) -> Option<Stream> {
        match name {
            "stdout" => Some(Stream::Stdout),
            "stderr" => Some(Stream::Stderr),
            _ => None,
        }
    }
}

/// One call's output: its latest bytes, what it forwarded, and who follows it.
#[derive(Debug, Default)]
pub(crate) struct Log {
    tail: VecDeque<(Stream, Vec<u8>)>,
    tail_len: usize,
    forwarded: u64,
    /// Bytes dropped past [`LIVE_LIMIT`].
    pub(crate) dropped: u64,
    /// `(connection, request)` of each `logs -f` on the call.
    pub(crate) followers: Vec<(ConnId, u64)>,
}

impl Log {
    /// Take a chunk: `Some(progress value)` to forward, or `None` once over the limit.
    pub(crate) fn take(&mut self, stream: Stream, bytes: Vec<u8>) -> Option<Value> {
        if bytes.is_empty() {
            return None;
        }
        let len = bytes.len() as u64;
        if self.forwarded + len > LIVE_LIMIT {
            self.dropped += len;
            return None;
        }
        self.forwarded += len;
        let value = chunk(stream, &bytes);
        self.keep(stream, bytes);
        Some(value)
    }

    fn keep(&mut self, stream: Stream, mut bytes: Vec<u8>) {
        if bytes.len() > TAIL {
            bytes.drain(..bytes.len() - TAIL);
        }
        self.tail_len += bytes.len();
        self.tail.push_back((stream, bytes));
        while self.tail_len > TAIL {
            let Some((_, front)) = self.tail.front_mut() else { break };
            let over = self.tail_len - TAIL;
            if front.len() <= over {
                self.tail_len -= front.len();
                self.tail.pop_front();
            } else {
                front.drain(..over);
                self.tail_len -= over;
            }
        }
    }

    /// The kept output, oldest first, as progress values.
    pub(crate) fn chunks(&self) -> Vec<Value> {
        self.tail.iter().map(|(stream, bytes)| chunk(*stream, bytes)).collect()
    }

    /// Follow the call from `(conn, req)`; false when it has too many followers already.
    pub(crate) fn follow(&mut self, conn: ConnId, req: u64) -> bool {
        if self.followers.len() >= MAX_FOLLOWERS {
            return false;
        }
        self.followers.push((conn, req));
        true
    }
}

/// The progress value of a chunk: `{"stdout": bytes}` or `{"stderr": bytes}`.
fn chunk(stream: Stream, bytes: &[u8]) -> Value {
    Value::Map(vec![(Value::from(stream.name()), Value::Binary(bytes.to_vec()))])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_tail_keeps_the_latest_bytes_only() {
        let mut log = Log::default();
        for i in 0..100u8 {
            assert!(log.take(Stream::Stdout, vec![i; 1024]).is_some());
        }
        let kept: Vec<u8> = log.tail.iter().flat_map(|(_, b)| b.iter().copied()).collect();
        assert_eq!(kept.len(), TAIL);
        assert_eq!(kept.first(), Some(&36), "the oldest chunks went first");
        assert_eq!(kept.last(), Some(&99));
        log.take(Stream::Stderr, vec![7; 3 * TAIL]);
        assert_eq!(log.tail_len, TAIL);
        assert_eq!(log.chunks().len(), 1, "a chunk larger than the tail is cut to it");
    }

    #[test]
    fn forwarding_stops_at_the_limit() {
        let mut log = Log::default();
        let big = (LIVE_LIMIT / 2) as usize;
        assert!(log.take(Stream::Stdout, vec![0; big]).is_some());
        assert!(log.take(Stream::Stderr, vec![0; big]).is_some());
        assert!(log.take(Stream::Stdout, vec![0; 1]).is_none());
        assert_eq!(log.dropped, 1);
        assert!(log.tail_len <= TAIL);
    }

    #[test]
    fn followers_are_bounded() {
        let mut log = Log::default();
        for req in 0..MAX_FOLLOWERS as u64 {
            assert!(log.follow(1, req));
        }
        assert!(!log.follow(1, 99));
    }
}
