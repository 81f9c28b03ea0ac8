//! `--max-memory`: the bytes all partitions' objects hold, against the limit (Redis's
//! `maxmemory` without eviction: over it, calls that may grow an object are refused).

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
    used: Arc<AtomicUsize>,
    /// 0: no limit.
    limit: usize,
}

impl Memory {
    /// An empty account; `limit` 0 means none.
    pub fn new(limit: usize) -> Self {
        Memory {
            used: Arc::default(),
            limit,
        }
    }

    /// Approximately how many bytes the objects counted here hold (their keys and values).
    pub fn used(&self) -> usize {
        self.used.load(Ordering::Relaxed)
    }

    /// The limit, 0 for none.
    pub fn limit(&self) -> usize {
        self.limit
    }

    pub(super) fn add(&self, n: usize) {
        self.used.fetch_add(n, Ordering::Relaxed);
    }

    pub(super) fn sub(&self, n: usize) {
        self.used.fetch_sub(n, Ordering::Relaxed);
    }

    /// `OutOfMemory` while the objects hold more than the limit. A call checked here may
    /// still pass the limit by its own growth (at most one frame).
    pub(super) fn check(&self) -> Result<(), Error> {
        let used = self.used();
        if self.limit == 0 || used <= self.limit {
            return Ok(());
        }
        Err(Error::new(
            ErrorKind::OutOfMemory,
            format!(
                "objects hold {used} bytes, over --max-memory {}: delete objects or raise the limit",
                self.limit
            ),
        ))
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
}
