//! Room under `--max-memory`: what a live call that may grow an object must find before it
//! runs, and the cache evictions that make it.

use std::sync::Arc;

use super::{memory, Body, Partition, Storage};
use crate::op::Op;
use crate::record::Record;
use crate::Error;

impl Partition {
    /// A live call that may grow an object waits for room, which caches give first. Refused
    /// before anything is logged or recorded: a retry may pass.
    pub(super) fn check_room(&mut self, op: &Op) -> Result<(), Error> {
        if self.objects.memory().is_over() && self.may_grow(op) {
            self.make_room();
            self.objects.memory().check()?;
        }
        Ok(())
    }

    /// Over `--max-memory`: the caches here let their least recently used entries go, each
    /// its share of the excess (in proportion to its size), until the objects fit the limit
    /// or the caches are empty. Ordinary objects never lose data. Logged for a persistent
    /// cache, as the bytes to free (a replay or a follower, whose total differs, frees the
    /// same entries: the cache's order is part of its state).
    pub fn make_room(&mut self) {
        let memory = self.objects.memory();
        if !memory.is_over() {
            return;
        }
        let excess = memory.used() - memory.limit();
        // A persistent cache's evictions must be logged: not while the log is failed.
        let logless = matches!(self.storage, Storage::Failed(_));
        let caches: Vec<(Arc<str>, usize)> = self
            .objects
            .caches()
            .filter_map(|key| {
                let entry = self.objects.get(key)?;
                (!(logless && entry.persistent)).then(|| (key.clone(), entry.size()))
            })
            .collect();
        let total: usize = caches.iter().map(|(_, size)| size).sum();
        if excess == 0 || total == 0 {
            return;
        }
        for (key, size) in caches {
            let share = (excess as u128 * size as u128).div_ceil(total as u128);
            let share = usize::try_from(share).unwrap_or(usize::MAX).min(size);
            if share == 0 {
                continue;
            }
            let freed = self.evict(&key, share);
            if freed > 0 && self.is_persistent(&key) {
                let bytes = share as u64;
                self.log(
                    Record::Evict {
                        key: key.to_string(),
                        bytes,
                    }
                    .encode(),
                );
            }
        }
    }

    /// Let the cache at `key` free `bytes` (see [`Object::evict`](crate::Object::evict)); returns what it freed.
    pub(super) fn evict(&mut self, key: &str, bytes: usize) -> usize {
        self.preserve(key);
        let Some((entry, counted, meter)) = self.objects.get_metered(key) else {
            return 0;
        };
        let Some(obj) = entry.body.builtin() else { return 0 };
        let freed = obj.evict(bytes);
        meter.changed(counted, memory::object_size(key, obj.size()));
        freed
    }

    /// Whether `op` may make the objects hold more: a create of a new key, or a call of a
    /// built-in method that may grow its object.
    pub(super) fn may_grow(&self, op: &Op) -> bool {
        match op {
            Op::Create { key, .. } => !self.objects.contains_key(key),
            Op::Call { key, method, .. } => match self.objects.get(key).map(|e| &e.body) {
                Some(Body::Builtin(obj)) => obj.may_grow(method),
                _ => false,
            },
            Op::Delete { .. } => false,
        }
    }
}
