//! The object space split by key hash into shards, each a [`Partition`] behind its own mutex.
//! A connection task locks the shard of the key it calls for the length of one `apply`, so
//! calls never hop threads and calls on different shards run in parallel.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use spindle_core::objects::compiled::Library;
use spindle_core::partition::Memory;
use spindle_core::{Delivery, Detached, Error, ErrorKind, Partition, Value};
use tokio::sync::Notify;

use crate::cluster::{not_serving, Replica};
use crate::journal::Journal;
use crate::Shared;

/// What a shard's mutex guards.
pub(crate) struct ShardState {
    pub(crate) partition: Partition,
    /// The deadline the shard's timer task sleeps until (`None`: no timer armed).
    armed: Option<Instant>,
    /// Object operations applied here (for `status`).
    pub(crate) calls: u64,
    /// The op log (with `--data-dir`, on a single server).
    pub(crate) log: Option<Journal>,
    /// The shard's Raft replica (in a cluster), in place of the op log.
    pub(crate) replica: Option<Replica>,
}

impl ShardState {
    /// After any partition entry point: hand its op-log records, with the replies that
    /// depend on them, to the log writer. Returns the replies that may go now.
    pub(crate) fn journal(&mut self, mut deliveries: Vec<Delivery>) -> Vec<Delivery> {
        // A call handed to the driver of nested calls (`nested.rs`) changed nothing: it goes
        // now, to the front end that starts the driver.
        let handed: Vec<Delivery> = deliveries
            .extract_if(.., |d| matches!(&d.reply, Err(e) if e.kind == ErrorKind::NestedCall))
            .collect();
        let mut out = match self.partition.take_log() {
            Some(records) => self.write(records, deliveries),
            None => deliveries,
        };
        out.extend(handed);
        out
    }

    /// Write `records` to the shard's Raft group in a cluster, else to its op log (if it
    /// has one); returns the replies that may go now.
    pub(crate) fn write(&mut self, records: Vec<Vec<u8>>, deliveries: Vec<Delivery>) -> Vec<Delivery> {
        match (&mut self.replica, &mut self.log) {
            (Some(replica), _) => replica.submit(records, deliveries),
            (None, Some(journal)) => journal.append(&mut self.partition, records, deliveries),
            (None, None) => deliveries,
        }
    }

    /// The partition with its op log, for a write across shards' logs (`journal::submit_group`).
    pub(crate) fn logged(&mut self) -> Option<(&mut Partition, &mut Journal)> {
        self.log.as_mut().map(|journal| (&mut self.partition, journal))
    }

    /// Whether calls may run on this shard here: always on a single server; in a cluster,
    /// only on the shard's serving leader (elsewhere the partition follows the Raft log).
    pub(crate) fn serving(&self) -> bool {
        self.replica.as_ref().is_none_or(|r| r.serving)
    }
}

struct Shard {
    state: Mutex<ShardState>,
    /// Wakes the timer task when a deadline earlier than the armed one appears.
    timer: Notify,
}

impl Shard {
    /// After any entry point: a call may have parked (or a transaction opened) with a
    /// deadline earlier than the timer's.
    fn arm(&self, state: &mut ShardState) {
        let next = state.partition.next_deadline();
        if next.is_some() && (state.armed.is_none() || next < state.armed) {
            state.armed = next;
            self.timer.notify_one();
        }
    }
}

pub(crate) struct Shards {
    shards: Box<[Shard]>,
    /// The bytes all partitions' objects hold, against `--max-memory`.
    memory: Memory,
    /// Compiles the code of compiled (WebAssembly) types for every partition.
    library: Arc<dyn Library>,
}

impl Shards {
    /// `count` shards, each keeping up to `reply_log` bytes of replies per client and in
    /// all (see `Limits::reply_log_limits`), their objects counted together in `memory`.
    pub(crate) fn new(count: usize, reply_log: (usize, usize), memory: Memory, library: Arc<dyn Library>) -> Self {
        let shards = (0..count.max(1))
            .map(|_| Shard {
                state: Mutex::new(ShardState {
                    partition: {
                        let mut partition = Partition::new();
                        partition.set_reply_log_limit(reply_log.0, reply_log.1);
                        partition.set_memory(memory.clone());
                        partition.set_library(library.clone());
                        partition
                    },
                    armed: None,
                    calls: 0,
                    log: None,
                    replica: None,
                }),
                timer: Notify::new(),
            })
            .collect();
        Shards {
            shards,
            memory,
            library,
        }
    }

    /// The runtime of compiled types (a partition put in place of another gets it with
    /// [`Partition::set_library`] before it restores).
    pub(crate) fn library(&self) -> &Arc<dyn Library> {
        &self.library
    }

    /// The account every partition here counts its objects in (a partition put in place
    /// of another joins it with [`Partition::set_memory`]).
    pub(crate) fn memory(&self) -> &Memory {
        &self.memory
    }

    /// Over `--max-memory`, before a call runs: the caches of every shard served here evict
    /// their least recently used entries (one shard locked at a time, in order) until the
    /// objects fit or no cache holds anything. A call's own shard alone could not make room
    /// with the caches of the others (see `Partition::make_room`).
    pub(crate) fn make_room(&self) {
        for index in 0..self.shards.len() {
            if !self.memory.is_over() || self.memory.cached() == 0 {
                return;
            }
            // A poisoned shard has nothing to give.
            let _ = self.with(index, |s| {
                if s.serving() {
                    s.partition.make_room();
                    // Evictions of persistent caches are logged: nobody waits on them.
                    let _ = s.journal(Vec::new());
                }
            });
        }
    }

    pub(crate) fn count(&self) -> usize {
        self.shards.len()
    }

    /// The shard that holds `key`.
    pub(crate) fn index_of(&self, key: &str) -> usize {
        crate::shard_of(key, self.shards.len())
    }

    /// Run `f` with shard `index` locked. A panic inside `f` (a bug in an object type)
    /// poisons that shard: it answers `Internal` from then on while the others keep serving.
    pub(crate) fn with<R>(&self, index: usize, f: impl FnOnce(&mut ShardState) -> R) -> Result<R, Error> {
        let shard = &self.shards[index];
        let outcome = catch_unwind(AssertUnwindSafe(|| {
            let mut state = shard.state.lock().ok()?;
            let result = f(&mut state);
            shard.arm(&mut state);
            Some(result)
        }));
        match outcome {
            Ok(Some(result)) => Ok(result),
            Ok(None) => Err(poisoned(index)),
            Err(_) => {
                tracing::error!(
                    shard = index,
                    "a call panicked inside the shard; the shard is out of service"
                );
                Err(poisoned(index))
            }
        }
    }

    /// Run `f` with the shards `indices` (ascending, no repeats) locked together, each given
    /// with its index: a transaction's commit. Locks are always taken in ascending order,
    /// and single-shard callers hold one at a time, so no two callers wait on each other.
    pub(crate) fn with_many<R>(
        &self,
        indices: &[usize],
        f: impl FnOnce(&mut [(usize, &mut ShardState)]) -> R,
    ) -> Result<R, Error> {
        debug_assert!(indices.windows(2).all(|w| w[0] < w[1]));
        let outcome = catch_unwind(AssertUnwindSafe(|| {
            let mut guards = Vec::with_capacity(indices.len());
            for &index in indices {
                match self.shards[index].state.lock() {
                    Ok(guard) => guards.push((index, guard)),
                    Err(_) => return Err(poisoned(index)),
                }
            }
            let mut states: Vec<(usize, &mut ShardState)> = guards.iter_mut().map(|(i, g)| (*i, &mut **g)).collect();
            let result = f(&mut states);
            for (index, state) in states {
                self.shards[index].arm(state);
            }
            Ok(result)
        }));
        outcome.unwrap_or_else(|_| {
            tracing::error!(
                shards = ?indices,
                "a commit panicked inside the shards; they are out of service"
            );
            Err(poisoned(indices[0]))
        })
    }

    /// `keep`: give an object a life of its own, optionally under a new key. The object
    /// moves between shards one lock at a time (never two locks held at once). In a cluster
    /// both shards must be served here; otherwise see [`crate::cluster::moves`].
    pub(crate) fn keep(&self, type_name: &str, key: &str, name: Option<&str>) -> Result<Value, Error> {
        let (source, target) = (self.index_of(key), self.index_of(name.unwrap_or(key)));
        let Some(name) = name.filter(|n| *n != key) else {
            self.with(source, |s| match s.serving() {
                true => s.partition.disown(type_name, key),
                false => Err(not_serving()),
            })??;
            return Ok(Value::from(key));
        };
        if source == target {
            return self.with(source, |s| {
                if !s.serving() {
                    return Err(not_serving());
                }
                s.calls += 1;
                let Some(detached) = s.partition.detach_to(type_name, key, name)? else {
                    return Ok(Value::from(name)); // a retry
                };
                let owner = detached.owner();
                match s.partition.attach(name, detached) {
                    Ok(()) => {
                        s.partition.set_moved(key, name, owner);
                        Ok(Value::from(name))
                    }
                    Err((e, detached)) => {
                        // Under the same hold of the lock as the detach: the key is free.
                        let _ = s.partition.restore(key, detached);
                        Err(e)
                    }
                }
            })?;
        }
        let detached = self.with(source, |s| match s.serving() {
            true => s.partition.detach_to(type_name, key, name),
            false => Err(not_serving()),
        })??;
        let Some(detached) = detached else {
            return Ok(Value::from(name)); // a retry
        };
        let owner = detached.owner();
        match self.with(target, |s| {
            // In a cluster, this node may have stopped leading the name's shard meanwhile.
            if !s.serving() {
                return Err((not_serving(), detached));
            }
            s.calls += 1;
            s.partition.attach(name, detached)
        })? {
            // A shard this node stopped leading meanwhile was rebuilt from its log: no note
            // to leave, no object to put back.
            Ok(()) => {
                self.with(source, |s| {
                    if s.serving() {
                        s.partition.set_moved(key, name, owner)
                    }
                })?;
                Ok(Value::from(name))
            }
            Err((e, detached)) => {
                self.put_back(source, key, detached)?;
                Err(e)
            }
        }
    }

    /// A move out of shard `index` failed: the object goes back under `key`, unless this
    /// node stopped serving the shard meanwhile (its ephemeral objects went with that) or the
    /// key was made anew while the object was away (the object is then dropped).
    pub(crate) fn put_back(&self, index: usize, key: &str, detached: Detached) -> Result<(), Error> {
        self.with(index, |s| {
            if s.serving() && !s.partition.restore(key, detached) {
                tracing::warn!("'{key}' was made anew while its object was away: the object is dropped");
            }
        })
    }
}

/// A key's hash for spreading keys over shards and object hosts (FNV-1a: fast on short keys,
/// and spread is all we need).
pub(crate) fn hash(key: &str) -> u64 {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for byte in key.bytes() {
        hash ^= u64::from(byte);
        hash = hash.wrapping_mul(0x0100_0000_01b3);
    }
    hash
}

fn poisoned(index: usize) -> Error {
    Error::new(
        ErrorKind::Internal,
        format!("shard {index} is out of service after an internal error (a server bug; see the server log)"),
    )
}

/// Answer parked calls whose deadline passed, sleeping until the next deadline of shard
/// `index` or until a call arms an earlier one.
pub(crate) async fn run_timer(shared: Arc<Shared>, index: usize) {
    let shard = &shared.shards.shards[index];
    loop {
        let ticked = shared.shards.with(index, |s| {
            if !s.serving() {
                // A follower's parked calls are answered by the leader's logged expiries.
                s.armed = None;
                return (Vec::new(), None, Vec::new());
            }
            let replies = s.partition.tick(Instant::now());
            let replies = s.journal(replies);
            s.armed = s.partition.next_deadline();
            // Expired transactions' copies of user-defined objects go.
            let actions = crate::hosts::forward(&shared, &mut s.partition, None);
            (replies, s.armed, actions)
        });
        let next = match ticked {
            Ok((replies, next, actions)) => {
                shared.registry.deliver(replies);
                crate::hosts::run(&shared, actions);
                next
            }
            Err(_) => return,
        };
        match next {
            Some(deadline) => {
                tokio::select! {
                    _ = tokio::time::sleep_until(deadline.into()) => {}
                    _ = shard.timer.notified() => {}
                }
            }
            None => shard.timer.notified().await,
        }
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use spindle_core::partition::Op;
    use spindle_core::{Caller, Token};

    fn caller() -> Caller {
        Caller {
            conn: 1,
            client: Arc::from("c"),
            thread: 0,
        }
    }

    fn create(shards: &Shards, key: &str, owned: bool) {
        let op = Op::Create {
            type_name: "Counter".into(),
            key: key.into(),
            args: vec![],
            owned,
            persistent: false,
        };
        let index = shards.index_of(key);
        let token = Token { conn: 1, req: 1 };
        let replies = shards
            .with(index, |s| s.partition.apply(&caller(), token, 0, 0, op, Instant::now()))
            .unwrap();
        assert_eq!(replies[0].reply, Ok(Value::Boolean(true)));
    }

    /// A runtime for compiled types that maps instances' memory on demand (no pool to
    /// reserve for a test).
    pub(crate) fn library() -> Arc<dyn Library> {
        let runtime = spindle_wasm::Runtime::with_allocator(Default::default(), spindle_wasm::Allocator::OnDemand);
        Arc::new(runtime.expect("a wasm engine"))
    }

    fn names(shards: &Shards) -> Vec<String> {
        (0..shards.count())
            .flat_map(|i| shards.with(i, |s| s.partition.objects("", false)).unwrap())
            .map(|(name, _)| name)
            .collect()
    }

    #[test]
    fn keys_spread_over_shards() {
        let shards = Shards::new(4, (usize::MAX, usize::MAX), Memory::default(), library());
        let used: std::collections::HashSet<usize> = (0..64).map(|i| shards.index_of(&format!("k{i}"))).collect();
        assert_eq!(used.len(), 4);
        assert_eq!(shards.index_of("same"), shards.index_of("same"));
    }

    #[test]
    fn keep_moves_across_shards_and_retries_are_idempotent() {
        let shards = Shards::new(8, (usize::MAX, usize::MAX), Memory::default(), library());
        let key = "~c.1";
        let name = (0..)
            .map(|i| format!("kept{i}"))
            .find(|n| shards.index_of(n) != shards.index_of(key))
            .unwrap();
        create(&shards, key, true);
        assert_eq!(shards.keep("Counter", key, Some(&name)), Ok(Value::from(name.as_str())));
        assert_eq!(names(&shards), vec![name.clone()]);
        // Sent again (a retry): same answer, nothing moves.
        assert_eq!(shards.keep("Counter", key, Some(&name)), Ok(Value::from(name.as_str())));
        let e = shards.keep("Counter", key, Some("elsewhere")).unwrap_err();
        assert_eq!(e.kind, ErrorKind::NotFound);
    }

    #[test]
    fn keep_onto_a_taken_name_restores_the_object() {
        let shards = Shards::new(3, (usize::MAX, usize::MAX), Memory::default(), library());
        create(&shards, "~c.1", true);
        create(&shards, "taken", false);
        let e = shards.keep("Counter", "~c.1", Some("taken")).unwrap_err();
        assert_eq!(e.kind, ErrorKind::TypeMismatch);
        let total: usize = (0..3).map(|i| shards.with(i, |s| s.partition.len()).unwrap()).sum();
        assert_eq!(total, 2);
    }

    #[test]
    fn a_panic_takes_only_its_shard_out_of_service() {
        let shards = Shards::new(2, (usize::MAX, usize::MAX), Memory::default(), library());
        let result = shards.with(0, |_| -> () { panic!("object bug") });
        assert_eq!(result.unwrap_err().kind, ErrorKind::Internal);
        assert_eq!(
            shards.with(0, |s| s.partition.len()).unwrap_err().kind,
            ErrorKind::Internal
        );
        assert_eq!(shards.with(1, |s| s.partition.len()), Ok(0));
    }
}
