//! `--max-memory`: the bytes all partitions' objects hold, against the limit (Redis's
//! `maxmemory`: over it, caches evict their least recently used entries, then calls that may
//! grow an object are refused; see `Partition::make_room`). Bytes the server holds for
//! clients outside the objects (queued function invocations' payloads) are counted in the
//! same account, as a [`Charge`] each.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use crate::{Error, ErrorKind};

/// What an object costs beyond its key and its value's bytes: its slot, its index entry, and
/// the allocations of its key and its body. Counted, so that a million tiny objects cannot
/// hold 160 MB under a `--max-memory` of 8 (measured: a million Counters take 163 MB).
pub(super) const PER_OBJECT: usize = 160;

/// The bytes an object at `key` whose value holds `size` is counted for.
pub(super) fn object_size(key: &str, size: usize) -> usize {
    PER_OBJECT + key.len() + size
}

/// One account shared by the partitions of a server (clones share it), with its limit.
#[derive(Clone, Debug, Default)]
pub struct Memory {
    counts: Arc<Counts>,
    /// 0: no limit.
    limit: usize,
}

#[derive(Debug, Default)]
struct Counts {
    used: AtomicUsize,
    /// The part of `used` in caches, which may evict.
    cached: AtomicUsize,
}

impl Memory {
    /// An empty account; `limit` 0 means none.
    pub fn new(limit: usize) -> Self {
        Memory {
            counts: Arc::default(),
            limit,
        }
    }

    /// Approximately how many bytes the objects counted here hold (their keys and values).
    pub fn used(&self) -> usize {
        self.counts.used.load(Ordering::Relaxed)
    }

    /// How many of those bytes caches hold (they give them back when over the limit).
    pub fn cached(&self) -> usize {
        self.counts.cached.load(Ordering::Relaxed)
    }

    /// The limit, 0 for none.
    pub fn limit(&self) -> usize {
        self.limit
    }

    /// Whether the objects hold more than the limit: cheap enough for every call to ask
    /// (one relaxed load of a count written only when an object's size changes).
    pub fn is_over(&self) -> bool {
        self.limit != 0 && self.used() > self.limit
    }

    /// Count `n` bytes held for a client outside the objects (a queued invocation's payload)
    /// until the returned charge is dropped. Refused with `OutOfMemory` while what caches
    /// cannot give back holds more than the limit (caches evict for it at the next call that
    /// may grow an object); like a call, one charge may pass the limit by its own size.
    pub fn charge(&self, n: usize) -> Result<Charge, Error> {
        let kept = self.used().saturating_sub(self.cached());
        if self.limit != 0 && kept > self.limit {
            return Err(Error::new(
                ErrorKind::OutOfMemory,
                format!(
                    "objects and queued invocations hold {kept} bytes, over --max-memory {}: \
                     wait for calls to end, delete objects or raise the limit",
                    self.limit
                ),
            ));
        }
        self.add(n, false);
        Ok(Charge {
            memory: self.clone(),
            bytes: n,
        })
    }

    pub(super) fn add(&self, n: usize, cache: bool) {
        self.counts.used.fetch_add(n, Ordering::Relaxed);
        if cache {
            self.counts.cached.fetch_add(n, Ordering::Relaxed);
        }
    }

    pub(super) fn sub(&self, n: usize, cache: bool) {
        self.counts.used.fetch_sub(n, Ordering::Relaxed);
        if cache {
            self.counts.cached.fetch_sub(n, Ordering::Relaxed);
        }
    }

    /// `OutOfMemory` while the objects hold more than the limit. A call checked here may
    /// still pass the limit by its own growth (at most one frame).
    pub(super) fn check(&self) -> Result<(), Error> {
        if !self.is_over() {
            return Ok(());
        }
        Err(Error::new(
            ErrorKind::OutOfMemory,
            format!(
                "objects hold {} bytes, over --max-memory {}: delete objects or raise the limit",
                self.used(),
                self.limit
            ),
        ))
    }
}

/// Bytes counted in a [`Memory`] account (see [`Memory::charge`]) until dropped.
#[derive(Debug, Default)]
pub struct Charge {
    memory: Memory,
    bytes: usize,
}

impl Drop for Charge {
    fn drop(&mut self) {
        self.memory.sub(self.bytes, false);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::objects::testing::*;
    use crate::partition::Op;
    use crate::{Partition, Token, Value};

    fn text(n: usize) -> Value {
        Value::from("x".repeat(n))
    }

    #[test]
    fn counts_keys_and_objects_as_they_change() {
        let mut h = Harness::new();
        let memory = Memory::new(0);
        h.p.set_memory(memory.clone());
        h.create_ok("Blob", "b", vec![]);
        assert_eq!(memory.used(), PER_OBJECT + 1);
        h.ok("Blob", "b", "set", vec![Value::Binary(vec![0; 1000])]);
        assert_eq!(memory.used(), PER_OBJECT + 1001);
        h.ok("Blob", "b", "append", vec![Value::Binary(vec![0; 24])]);
        assert_eq!(memory.used(), PER_OBJECT + 1025);
        h.create_ok("Counter", "count", vec![]);
        assert_eq!(memory.used(), 2 * PER_OBJECT + 1030);
        h.delete("b");
        assert_eq!(memory.used(), PER_OBJECT + 5);
        // A partition replaced (failover, restore) gives back what it held.
        h.create_ok("Blob", "b", vec![Value::Binary(vec![0; 100])]);
        drop(h);
        assert_eq!(memory.used(), 0);
    }

    #[test]
    fn over_the_limit_only_growth_is_refused() {
        let mut h = Harness::new();
        let memory = Memory::new(PER_OBJECT + 1000);
        h.p.set_memory(memory.clone());
        h.create_ok("Dict", "d", vec![]);
        h.ok("Dict", "d", "setitem", vec![1.into(), text(600)]);
        // Under the limit, one call may pass it by its own size.
        h.ok("Dict", "d", "setitem", vec![2.into(), text(600)]);
        let used = memory.used();
        assert!(used > 1000);
        let e = h.err("Dict", "d", "setitem", vec![3.into(), 3.into()]);
        assert_eq!(e.kind, ErrorKind::OutOfMemory);
        assert!(
            e.message.contains(&format!(
                "objects hold {used} bytes, over --max-memory {}",
                PER_OBJECT + 1000
            )),
            "{e}"
        );
        assert_eq!(h.create("List", "l", vec![]).unwrap_err().kind, ErrorKind::OutOfMemory);
        assert_eq!(memory.used(), used, "a refused call changes nothing");
        // Reads, shrinking calls, creates of existing objects and deletes still run.
        assert_eq!(h.ok("Dict", "d", "len", vec![]), Value::from(2));
        assert_eq!(h.create("Dict", "d", vec![]), Ok(Value::Boolean(false)));
        h.ok("Dict", "d", "pop", vec![1.into()]);
        assert!(memory.used() < PER_OBJECT + 1000);
        h.ok("Dict", "d", "setitem", vec![3.into(), 3.into()]);
    }

    #[test]
    fn the_items_of_parked_puts_count_until_their_calls_go() {
        let mut h = Harness::new();
        let memory = Memory::new(0);
        h.p.set_memory(memory.clone());
        h.create_ok("Queue", "q", vec![1.into()]);
        h.ok("Queue", "q", "put", vec![1.into()]);
        let empty = memory.used();
        let item = || Value::Binary(vec![0; 1000]);
        h.park(1, "Queue", "q", "put", vec![item(), true.into(), Value::F64(1.0)]);
        let withdrawn = h.park(2, "Queue", "q", "put", vec![item()]);
        h.park(3, "Queue", "q", "put", vec![item()]);
        assert!(memory.used() > empty + 3000);
        // A timeout, a withdraw and a disconnect each take their item from the count.
        h.advance(2.0);
        h.withdraw(withdrawn, "q");
        h.disconnect(3);
        assert_eq!(memory.used(), empty);
    }

    #[test]
    fn charges_count_until_dropped_and_are_refused_over_the_limit() {
        let mut h = Harness::new();
        let memory = Memory::new(PER_OBJECT + 1000);
        h.p.set_memory(memory.clone());
        let first = memory.charge(600).unwrap();
        let second = memory.charge(600).unwrap();
        assert_eq!(memory.used(), 1200, "one charge may pass the limit by its own size");
        let e = memory.charge(1).unwrap_err();
        assert_eq!(e.kind, ErrorKind::OutOfMemory);
        assert!(e.message.contains("over --max-memory"), "{e}");
        // Objects are refused growth by the same account.
        assert_eq!(h.create("List", "l", vec![]).unwrap_err().kind, ErrorKind::OutOfMemory);
        drop(first);
        drop(second);
        assert_eq!(memory.used(), 0);
        h.create_ok("List", "l", vec![]);
        let _third = memory.charge(10).unwrap();
    }

    #[test]
    fn a_charge_over_the_limit_waits_for_no_cache() {
        let mut h = Harness::new();
        let memory = Memory::new(5000);
        h.p.set_memory(memory.clone());
        let options = Value::Map(vec![("max_memory".into(), (1 << 20).into())]);
        h.create_ok("Dict", "cache", vec![Value::Nil, options]);
        h.ok("Dict", "cache", "setitem", vec![1.into(), text(6000)]);
        assert!(memory.is_over());
        // What the cache holds it gives back at the next growing call: not counted against.
        let charge = memory.charge(100).unwrap();
        h.create_ok("Counter", "n", vec![]);
        assert!(memory.used() <= 5000, "the cache made room for the charge");
        drop(charge);
    }

    #[test]
    fn replayed_calls_are_never_refused() {
        let mut live = Partition::new();
        live.enable_storage();
        let now = std::time::Instant::now();
        let ops = [
            Op::Create {
                type_name: "List".into(),
                key: "l".into(),
                args: vec![],
                owned: false,
                persistent: true,
            },
            Op::Call {
                type_name: "List".into(),
                key: "l".into(),
                method: "append".into(),
                args: vec![text(5000)],
                nested: None,
            },
        ];
        for (i, op) in ops.into_iter().enumerate() {
            let req = i as u64 + 1;
            live.apply(&who(1), Token { conn: 1, req }, req, 0, op, now);
        }
        let log = live.take_log().unwrap_or_default();
        // Recovery under a lower limit than the log needs rebuilds everything all the same.
        let mut recovered = Partition::new();
        recovered.enable_storage();
        recovered.set_memory(Memory::new(10));
        for record in &log {
            recovered.replay(record, now).unwrap();
        }
        assert_eq!(recovered.memory().used(), live.memory().used());
        assert!(recovered.memory().used() > 5000);
    }

    #[test]
    fn over_the_limit_caches_evict_before_anything_is_refused() {
        let mut h = Harness::new();
        let memory = Memory::new(30_000);
        h.p.set_memory(memory.clone());
        let options = Value::Map(vec![("max_memory".into(), (1 << 20).into())]);
        h.create_ok("Dict", "cache", vec![Value::Nil, options]);
        h.create_ok("Dict", "plain", vec![]);
        for i in 0..20 {
            h.ok("Dict", "cache", "setitem", vec![i.into(), text(1000)]);
        }
        h.ok("Dict", "cache", "getitem", vec![0.into()]);
        let mut written = 0;
        let refused = loop {
            match h.reply("Dict", "plain", "setitem", vec![written.into(), text(1000)]) {
                Ok(_) => written += 1,
                Err(e) => break e,
            }
            assert!(written < 100, "never refused");
        };
        assert_eq!(refused.kind, ErrorKind::OutOfMemory);
        // The cache gave everything before the plain dict was refused; it lost nothing.
        assert_eq!(h.ok("Dict", "cache", "len", vec![]), Value::from(0));
        assert_eq!(h.ok("Dict", "plain", "len", vec![]), Value::from(written));
        assert!(written > 20, "{written}");
    }

    #[test]
    fn caches_evict_their_least_recently_used_entries_in_proportion_to_their_size() {
        let mut h = Harness::new();
        let memory = Memory::new(40_000);
        h.p.set_memory(memory.clone());
        let options = || Value::Map(vec![("max_memory".into(), (1 << 20).into())]);
        h.create_ok("Dict", "big", vec![Value::Nil, options()]);
        h.create_ok("Dict", "small", vec![Value::Nil, options()]);
        for i in 0..20 {
            h.ok("Dict", "big", "setitem", vec![i.into(), text(1000)]);
        }
        for i in 0..10 {
            h.ok("Dict", "small", "setitem", vec![i.into(), text(1000)]);
        }
        h.ok("Dict", "big", "get", vec![0.into()]);
        h.create_ok("Blob", "b", vec![Value::Binary(vec![0; 15_000])]);
        // Over by some 7 KB: the big cache frees about twice what the small one does.
        h.create_ok("Counter", "n", vec![]);
        assert!(memory.used() <= 40_000);
        let keys = |h: &mut Harness, k: &str| match h.ok("Dict", k, "keys", vec![]) {
            Value::Array(keys) => keys,
            other => panic!("{other}"),
        };
        let (big, small) = (keys(&mut h, "big"), keys(&mut h, "small"));
        let (big_lost, small_lost) = (20 - big.len(), 10 - small.len());
        assert!(
            small_lost > 0 && big_lost >= 2 * small_lost - 1,
            "{big_lost} {small_lost}"
        );
        // The least recently used went: of the big one 1, 2... (0 was read), of the small 0, 1...
        assert_eq!(big[0], Value::from(big_lost as u64 + 1));
        assert_eq!(*big.last().unwrap(), Value::from(0));
        assert_eq!(small[0], Value::from(small_lost as u64));
    }

    #[test]
    fn the_bytes_caches_hold_are_counted_apart() {
        let mut h = Harness::new();
        let memory = Memory::new(0);
        h.p.set_memory(memory.clone());
        let options = Value::Map(vec![("max_memory".into(), 1000.into())]);
        h.create_ok("Dict", "c", vec![Value::Nil, options]);
        h.create_ok("Dict", "plain", vec![]);
        h.ok("Dict", "plain", "setitem", vec![1.into(), text(500)]);
        assert_eq!(memory.cached(), 0, "an empty cache has nothing to give");
        h.ok("Dict", "c", "setitem", vec![1.into(), text(500)]);
        let cached = memory.cached();
        assert!(cached > 500 && cached < memory.used() - 500, "{cached}");
        h.ok("Dict", "c", "setitem", vec![2.into(), text(800)]);
        assert!(memory.cached() <= 1000 && memory.cached() > 800);
        // Moved to another account, and given back when dropped, caches' part too.
        let other = Memory::new(0);
        h.p.set_memory(other.clone());
        assert_eq!((memory.used(), memory.cached()), (0, 0));
        assert!(other.cached() > 800);
        h.delete("c");
        assert_eq!(other.cached(), 0);
        drop(h);
        assert_eq!(other.used(), 0);
    }
}
