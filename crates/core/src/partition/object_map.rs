//! The partition's objects by key: a hash index over slots that never move, so a snapshot
//! can walk the slots a chunk at a time while objects come and go (see [`super::snapshot`]).
//!
//! It also keeps the server's memory account ([`Memory`]): every object enters and leaves
//! through here, with the size it had when last measured; and which objects are caches, the
//! ones that may evict when the server is over it.

use ahash::HashMap;
use std::collections::BTreeSet;
use std::sync::Arc;

use super::memory::{object_size, Memory};
use super::Entry;

#[derive(Default)]
pub(super) struct ObjectMap {
    index: HashMap<Arc<str>, usize>,
    /// Each object with its key and what it is counted for in `meter`.
    slots: Vec<Option<(Arc<str>, Entry, Counted)>>,
    /// Empty slots, reused before the slots grow.
    free: Vec<usize>,
    meter: Meter,
    /// The keys of the caches, in a fixed order (evictions must be the same everywhere).
    caches: BTreeSet<Arc<str>>,
}

/// What an object is counted for: its bytes (its key's among them), and whether they are a
/// cache's (its entries then count as cached: what eviction can free); and its version.
pub(super) struct Counted {
    bytes: usize,
    cache: bool,
    /// Changes with every change of the object (see [`Meter::changed`]): a transaction
    /// commits only over the versions it read.
    version: u64,
}

/// The bytes this map's objects are counted for, and the shared account they are counted in.
#[derive(Default)]
pub(super) struct Meter {
    memory: Memory,
    held: usize,
    /// The part of `held` in caches.
    cached: usize,
    /// The last version given to an object of this map (versions never repeat in it).
    clock: u64,
}

impl Meter {
    fn add(&mut self, n: usize, cache: bool) {
        self.held += n;
        self.cached += if cache { n } else { 0 };
        self.memory.add(n, cache);
    }

    fn sub(&mut self, n: usize, cache: bool) {
        self.held -= n;
        self.cached -= if cache { n } else { 0 };
        self.memory.sub(n, cache);
    }

    /// The object counted for `counted` changed, and now holds `now` bytes.
    pub(super) fn changed(&mut self, counted: &mut Counted, now: usize) {
        self.clock += 1;
        counted.version = self.clock;
        self.resize(counted, now);
    }

    /// An object counted for `counted` now holds `now` bytes.
    fn resize(&mut self, counted: &mut Counted, now: usize) {
        // Most calls leave the size as it was: no write to the account the partitions share.
        // By the difference: the part of the size that is the key's was counted apart from a
        // cache's entries (see `insert`), and it does not change.
        if now > counted.bytes {
            self.add(now - counted.bytes, counted.cache);
        } else if now < counted.bytes {
            self.sub(counted.bytes - now, counted.cache);
        }
        counted.bytes = now;
    }

    /// Give back everything counted here.
    fn clear(&mut self) {
        let (held, cached) = (self.held, self.cached);
        self.sub(cached, true);
        self.sub(held - cached, false);
    }
}

impl Drop for ObjectMap {
    /// A partition replaced (failover, restore) gives its objects' bytes back.
    fn drop(&mut self) {
        self.meter.clear();
    }
}

impl ObjectMap {
    pub(super) fn len(&self) -> usize {
        self.index.len()
    }

    pub(super) fn is_empty(&self) -> bool {
        self.index.is_empty()
    }

    pub(super) fn contains_key(&self, key: &str) -> bool {
        self.index.contains_key(key)
    }

    /// The version of the object at `key` (0: there is none): any change gives it a new one.
    pub(super) fn version(&self, key: &str) -> u64 {
        let Some(&slot) = self.index.get(key) else { return 0 };
        self.slots[slot].as_ref().map_or(0, |(_, _, counted)| counted.version)
    }

    pub(super) fn get(&self, key: &str) -> Option<&Entry> {
        let slot = *self.index.get(key)?;
        self.slots[slot].as_ref().map(|(_, e, _)| e)
    }

    /// The entry at `key`, to change it in a way that keeps its size (see
    /// [`get_metered`](Self::get_metered)).
    pub(super) fn get_mut(&mut self, key: &str) -> Option<&mut Entry> {
        let slot = *self.index.get(key)?;
        self.slots[slot].as_mut().map(|(_, e, _)| e)
    }

    /// The entry at `key`, with the bytes it is counted for and the meter to call
    /// [`Meter::resize`] on after a change that may resize it.
    pub(super) fn get_metered(&mut self, key: &str) -> Option<(&mut Entry, &mut Counted, &mut Meter)> {
        let slot = *self.index.get(key)?;
        let (_, e, size) = self.slots[slot].as_mut()?;
        Some((e, size, &mut self.meter))
    }

    /// Put `entry` at `key`, returning the entry it replaces.
    pub(super) fn insert(&mut self, key: String, entry: Entry) -> Option<Entry> {
        let cache = entry.is_cache();
        // Only a cache's entries count as cached (what eviction can free): not its name.
        let fixed = object_size(&key, 0);
        self.meter.clock += 1;
        let size = Counted {
            bytes: object_size(&key, entry.size()),
            cache,
            version: self.meter.clock,
        };
        self.meter.add(fixed, false);
        self.meter.add(size.bytes - fixed, cache);
        if let Some(&slot) = self.index.get(key.as_str()) {
            let (key, e, counted) = self.slots[slot].as_mut()?;
            let old = std::mem::replace(counted, size);
            let fixed = object_size(key, 0);
            self.meter.sub(fixed, false);
            self.meter.sub(old.bytes - fixed, old.cache);
            match cache {
                true => self.caches.insert(key.clone()),
                false => self.caches.remove(&**key),
            };
            return Some(std::mem::replace(e, entry));
        }
        let key: Arc<str> = Arc::from(key);
        if cache {
            self.caches.insert(key.clone());
        }
        let slot = match self.free.pop() {
            Some(slot) => slot,
            None => {
                self.slots.push(None);
                self.slots.len() - 1
            }
        };
        self.slots[slot] = Some((key.clone(), entry, size));
        self.index.insert(key, slot);
        None
    }

    pub(super) fn remove(&mut self, key: &str) -> Option<Entry> {
        let slot = self.index.remove(key)?;
        self.free.push(slot);
        let (_, e, counted) = self.slots[slot].take()?;
        let fixed = object_size(key, 0);
        self.meter.sub(fixed, false);
        self.meter.sub(counted.bytes - fixed, counted.cache);
        if !self.caches.is_empty() {
            self.caches.remove(key);
        }
        Some(e)
    }

    /// The caches' keys, in a fixed order.
    pub(super) fn caches(&self) -> impl Iterator<Item = &Arc<str>> {
        self.caches.iter()
    }

    pub(super) fn iter(&self) -> impl Iterator<Item = (&str, &Entry)> {
        self.slots.iter().flatten().map(|(k, e, _)| (&**k, e))
    }

    pub(super) fn values(&self) -> impl Iterator<Item = &Entry> {
        self.slots.iter().flatten().map(|(_, e, _)| e)
    }

    pub(super) fn memory(&self) -> &Memory {
        &self.meter.memory
    }

    /// Count this map's objects in `memory` from now on, instead of the account they were in.
    pub(super) fn set_memory(&mut self, memory: Memory) {
        let (held, cached) = (self.meter.held, self.meter.cached);
        self.meter.clear();
        self.meter.memory = memory;
        self.meter.add(cached, true);
        self.meter.add(held - cached, false);
    }

    /// Slots in use or free: every object is in a slot below this, and keeps its slot for
    /// as long as it lives.
    pub(super) fn slot_count(&self) -> usize {
        self.slots.len()
    }

    /// The object in `slot`, if any.
    pub(super) fn slot_mut(&mut self, slot: usize) -> Option<(&str, &mut Entry)> {
        self.slots.get_mut(slot)?.as_mut().map(|(k, e, _)| (&**k, e))
    }
}
