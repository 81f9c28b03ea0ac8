//! Counters for `status`, and the answer itself.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use spindle_core::Value;

use crate::Shared;

pub(crate) struct Stats {
    started: Instant,
    /// Open connections.
    pub(crate) connections: AtomicUsize,
    /// Bytes of large frames being received (held against `--max-partial-frames`).
    pub(crate) receiving: AtomicUsize,
    /// Calls in the last sampled second, as `f64` bits.
    calls_per_s: AtomicU64,
    /// Invocations answered in the last sampled second, as `f64` bits.
    invocations_per_s: AtomicU64,
}

impl Stats {
    pub(crate) fn new() -> Self {
        Stats {
            started: Instant::now(),
            connections: AtomicUsize::new(0),
            receiving: AtomicUsize::new(0),
            calls_per_s: AtomicU64::new(0f64.to_bits()),
            invocations_per_s: AtomicU64::new(0f64.to_bits()),
        }
    }
}

/// Total calls over all shards. Each shard counts under the lock its calls take anyway,
/// so the hot path pays no shared atomic.
fn total_calls(shared: &Shared) -> u64 {
    (0..shared.shards.count())
        .filter_map(|i| shared.shards.with(i, |s| s.calls).ok())
        .sum()
}

/// Sample the call and invocation rates once a second.
pub(crate) async fn run_sampler(shared: Arc<Shared>) {
    let mut interval = tokio::time::interval(Duration::from_secs(1));
    interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    interval.tick().await;
    let sample = |shared: &Shared| (Instant::now(), total_calls(shared), shared.gateway.completed());
    let mut last = sample(&shared);
    loop {
        interval.tick().await;
        let now = sample(&shared);
        let seconds = now.0.duration_since(last.0).as_secs_f64().max(1e-3);
        let rate = |now: u64, last: u64| (now.saturating_sub(last) as f64 / seconds).to_bits();
        let stats = &shared.stats;
        stats.calls_per_s.store(rate(now.1, last.1), Ordering::Relaxed);
        stats.invocations_per_s.store(rate(now.2, last.2), Ordering::Relaxed);
        last = now;
    }
}

/// The `status` reply (see docs/protocol.md, "Status").
pub(crate) fn status(shared: &Shared) -> Value {
    let objects: usize = (0..shared.shards.count())
        .filter_map(|i| shared.shards.with(i, |s| s.partition.len()).ok())
        .sum();
    let persistent: usize = (0..shared.shards.count())
        .filter_map(|i| shared.shards.with(i, |s| s.partition.persistent_len()).ok())
        .sum();
    let data_dir = match &shared.config.data_dir {
        Some(dir) => Value::from(dir.display().to_string()),
        None => Value::Nil,
    };
    let calls_per_s = f64::from_bits(shared.stats.calls_per_s.load(Ordering::Relaxed));
    let invocations_per_s = f64::from_bits(shared.stats.invocations_per_s.load(Ordering::Relaxed));
    let pool = shared.gateway.counts();
    let (hosted_objects, replies) = (0..shared.shards.count())
        .filter_map(|i| {
            let counts =
                |s: &mut crate::shards::ShardState| (s.partition.hosted_objects(), s.partition.recorded_replies());
            shared.shards.with(i, counts).ok()
        })
        .fold((0, 0), |(h, r), (hosted, replies)| (h + hosted, r + replies));
    let (object_hosts, object_calls) = shared.hosts.counts();
    let txns = shared.transactions.counts();
    let entries: Vec<(&str, Value)> = vec![
        ("address", Value::from(shared.address.as_str())),
        ("version", Value::from(crate::VERSION)),
        ("pid", Value::from(std::process::id())),
        ("uptime", Value::F64(shared.stats.started.elapsed().as_secs_f64())),
        ("objects", Value::from(objects)),
        ("persistent_objects", Value::from(persistent)),
        ("data_dir", data_dir),
        // Bytes the objects hold, approximately, against --max-memory (0: no limit).
        ("memory_used", Value::from(shared.shards.memory().used())),
        ("max_memory", Value::from(shared.shards.memory().limit())),
        (
            "connections",
            Value::from(shared.stats.connections.load(Ordering::Relaxed)),
        ),
        ("sessions", Value::from(shared.sessions.count())),
        ("replies", Value::from(replies)),
        ("partitions", Value::from(shared.shards.count())),
        ("calls", Value::from(total_calls(shared))),
        ("calls_per_s", Value::F64(calls_per_s)),
        ("workers", Value::from(pool.workers)),
        ("max_workers", Value::from(shared.config.functions.max_workers)),
        ("cores", Value::from(crate::config::cores())),
        ("busy", Value::from(pool.busy)),
        ("queued", Value::from(pool.queued)),
        ("invocations_per_s", Value::F64(invocations_per_s)),
        // How the processes functions start are kept within reach of their limits and kills.
        ("containment", Value::from(shared.containment.mode().name())),
        ("object_hosts", Value::from(object_hosts)),
        ("hosted_objects", Value::from(hosted_objects)),
        ("object_calls_in_flight", Value::from(object_calls)),
        ("transactions_committed", Value::from(txns.committed)),
        ("transactions_aborted", Value::from(txns.aborted)),
        ("transactions_open", Value::from(txns.open)),
    ];
    Value::Map(entries.into_iter().map(|(k, v)| (Value::from(k), v)).collect())
}
