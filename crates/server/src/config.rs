//! Server settings (the flags of `spindle server`).

use std::time::Duration;

#[derive(Clone, Debug)]
pub struct Config {
    /// Interface to bind; loopback by default (see DESIGN.md §6, Security).
    pub host: String,
    /// TCP port; 0 picks a free one (read it back from [`crate::Server::local_addr`]).
    pub port: u16,
    /// Number of shards the object space is split into.
    pub partitions: usize,
    /// Largest frame body accepted, in bytes.
    pub max_frame: usize,
    /// How long a session outlives its last connection.
    pub session_ttl: Duration,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            host: "127.0.0.1".into(),
            port: 7070,
            partitions: default_partitions(),
            max_frame: spindle_proto::DEFAULT_MAX_FRAME,
            session_ttl: Duration::from_secs(5),
        }
    }
}

/// One shard per core: enough to keep every worker busy without contention.
pub fn default_partitions() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}
