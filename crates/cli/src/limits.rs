//! The flags of `spindle server` that bound what one client may hold (docs/limits.md).

use std::time::Duration;

use clap::Args;
use spindle_server::config::{default_max_connections, default_max_memory, Limits, TransactionLimits};

#[derive(Args, Clone)]
pub(crate) struct LimitArgs {
    /// Connections served at once, workers' and object hosts' included; past it a new one
    /// is told so and closed [default: 10000, fewer under a lower open-files limit].
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..))]
    max_connections: Option<u32>,
    /// Seconds a new connection may take to say hello before it is closed.
    #[arg(long, default_value_t = 10.0, value_name = "SECONDS")]
    hello_timeout: f64,
    /// Seconds a client connection with no call in flight may stay silent before it is
    /// closed (0: never). Calls waiting on an object (a lock, a queue) are in flight.
    #[arg(long, default_value_t = 0.0, value_name = "SECONDS")]
    client_timeout: f64,
    /// Seconds to receive a frame once it has started, and as many again per MiB of it.
    #[arg(long, default_value_t = 10.0, value_name = "SECONDS")]
    frame_timeout: f64,
    /// Bytes of frames being received across all connections; a frame that would pass it
    /// is refused (Busy) and its connection closed.
    #[arg(long, default_value_t = Limits::default().partial_frames, value_name = "BYTES")]
    max_partial_frames: usize,
    /// MessagePack values one frame may hold (each decodes to about 32 bytes).
    #[arg(long, default_value_t = Limits::default().frame_values, value_name = "N")]
    max_frame_values: usize,
    /// Bytes of replies a client has not read past which its requests wait unread.
    #[arg(long, default_value_t = Limits::default().output_soft, value_name = "BYTES")]
    output_limit: usize,
    /// Bytes of replies a client has not read past which it is closed when other clients'
    /// calls produce more for it (a waiter woken: such replies cannot wait).
    #[arg(long, default_value_t = Limits::default().output_hard, value_name = "BYTES")]
    output_hard_limit: usize,
    /// Bytes of replies a session keeps per shard for its retries until it acknowledges
    /// them; past it, its oldest recorded are forgotten (as past 4096 replies).
    #[arg(long, default_value_t = Limits::default().reply_log, value_name = "BYTES")]
    max_reply_log: usize,
    /// Bytes of replies all sessions keep together for their retries (shared evenly by the
    /// shards); past it, the oldest of the largest logs are forgotten.
    #[arg(long, default_value_t = Limits::default().reply_logs, value_name = "BYTES")]
    max_reply_logs_total: usize,
    /// Calls of one connection waiting for their reply (parked on a lock or a queue, say)
    /// past which its new calls are refused (Busy).
    #[arg(long, default_value_t = Limits::default().calls_in_flight, value_name = "N")]
    max_calls_in_flight: usize,
    /// Bytes the objects may hold (keys and values, approximately): past it, caches (Dicts
    /// made with max_memory) evict their least recently used keys, then calls that may grow
    /// an object are refused with OutOfMemory (reads, deletes and shrinking calls still run).
    /// A size with an optional unit (B, KiB, MiB, GiB, TiB, KB, MB, GB, TB: 512MiB), or
    /// "unlimited" (or 0) [default: half the machine's memory, or of the cgroup's limit when
    /// lower].
    #[arg(long, value_name = "SIZE", value_parser = parse_size)]
    max_memory: Option<usize>,
    /// Seconds from a transaction's first call to its commit; past it, it is aborted.
    #[arg(long, default_value_t = TransactionLimits::default().duration.as_secs_f64(), value_name = "SECONDS")]
    max_transaction_time: f64,
    /// Objects one transaction may touch.
    #[arg(long, default_value_t = TransactionLimits::default().objects, value_name = "N")]
    max_transaction_objects: usize,
    /// Bytes of arguments one transaction's calls may carry, and bytes its copies of the
    /// objects it touched may hold in each shard (at most 32MiB), with a unit as
    /// --max-memory's.
    #[arg(long, default_value = "10MiB", value_name = "SIZE", value_parser = parse_size)]
    max_transaction_bytes: usize,
    /// Transactions one session may have open at once.
    #[arg(long, default_value_t = TransactionLimits::default().per_session, value_name = "N")]
    max_transactions_per_session: usize,
}

impl LimitArgs {
    pub(crate) fn config(&self) -> Result<Limits, String> {
        let seconds = |value: f64, flag: &str, zero: bool| {
            Duration::try_from_secs_f64(value)
                .ok()
                .filter(|d| zero || !d.is_zero())
                .ok_or_else(|| match zero {
                    true => format!("{flag} must be a non-negative number of seconds"),
                    false => format!("{flag} must be a positive number of seconds"),
                })
        };
        let client_timeout = seconds(self.client_timeout, "--client-timeout", true)?;
        if self.output_hard_limit < self.output_limit {
            return Err("--output-hard-limit must be at least --output-limit".into());
        }
        if self.max_frame_values == 0 {
            return Err("--max-frame-values must be positive".into());
        }
        if self.max_calls_in_flight == 0 {
            return Err("--max-calls-in-flight must be positive".into());
        }
        if self.max_transaction_objects == 0 || self.max_transactions_per_session == 0 {
            return Err("--max-transaction-objects and --max-transactions-per-session must be positive".into());
        }
        // A commit's records over several shards are one log record, at most 64 MiB.
        if !(1..=32 << 20).contains(&self.max_transaction_bytes) {
            return Err("--max-transaction-bytes must be between 1 byte and 32MiB".into());
        }
        Ok(Limits {
            max_connections: self
                .max_connections
                .map_or_else(default_max_connections, |n| n as usize),
            hello_timeout: seconds(self.hello_timeout, "--hello-timeout", false)?,
            idle_timeout: (!client_timeout.is_zero()).then_some(client_timeout),
            frame_timeout: seconds(self.frame_timeout, "--frame-timeout", false)?,
            partial_frames: self.max_partial_frames,
            frame_values: self.max_frame_values,
            output_soft: self.output_limit,
            output_hard: self.output_hard_limit,
            reply_log: self.max_reply_log,
            reply_logs: self.max_reply_logs_total,
            calls_in_flight: self.max_calls_in_flight,
            max_memory: self.max_memory.unwrap_or_else(default_max_memory),
            transactions: TransactionLimits {
                duration: seconds(self.max_transaction_time, "--max-transaction-time", false)?,
                objects: self.max_transaction_objects,
                bytes: self.max_transaction_bytes,
                per_session: self.max_transactions_per_session,
            },
        })
    }
}

/// A size in bytes: a whole number with an optional unit (binary `KiB`, `MiB`, `GiB`, `TiB`,
/// decimal `KB`, `MB`, `GB`, `TB`, any case, or `B`), or `unlimited` (0, as is `0`).
pub(crate) fn parse_size(text: &str) -> Result<usize, String> {
    let text = text.trim();
    if text.eq_ignore_ascii_case("unlimited") {
        return Ok(0);
    }
    let digits = text.find(|c: char| !c.is_ascii_digit()).unwrap_or(text.len());
    let (number, unit) = text.split_at(digits);
    let scale: u64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "kib" => 1 << 10,
        "mib" => 1 << 20,
        "gib" => 1 << 30,
        "tib" => 1 << 40,
        "kb" => 1_000,
        "mb" => 1_000_000,
        "gb" => 1_000_000_000,
        "tb" => 1_000_000_000_000,
        _ => {
            return Err(format!(
                "'{text}' is not a size: a whole number with an optional unit (B, KiB, MiB, GiB, TiB, KB, MB, GB, \
                 TB: 512MiB), or 'unlimited'"
            ))
        }
    };
    let number: u64 = number
        .parse()
        .map_err(|_| format!("'{text}' is not a size: it must start with a whole number of bytes (512MiB)"))?;
    number
        .checked_mul(scale)
        .and_then(|n| usize::try_from(n).ok())
        .ok_or_else(|| format!("'{text}' is more than this machine can count"))
}

#[cfg(test)]
mod tests {
    use super::parse_size;

    #[test]
    fn sizes_take_units_and_unlimited() {
        assert_eq!(parse_size("1024"), Ok(1024));
        assert_eq!(parse_size("512MiB"), Ok(512 << 20));
        assert_eq!(parse_size("4gib"), Ok(4 << 30));
        assert_eq!(parse_size("2 GB"), Ok(2_000_000_000));
        assert_eq!(parse_size("64KB"), Ok(64_000));
        assert_eq!(parse_size("10B"), Ok(10));
        assert_eq!(parse_size("unlimited"), Ok(0));
        assert_eq!(parse_size("0"), Ok(0));
        for bad in ["", "MiB", "-5", "1.5GiB", "12XB", "99999999999TiB", "5 MiB extra"] {
            assert!(parse_size(bad).is_err(), "{bad}");
        }
    }
}
