//! The partition's objects by key: a hash index over slots that never move, so a snapshot
//! can walk the slots a chunk at a time while objects come and go (see [`super::snapshot`]).

use std::collections::HashMap;
use std::sync::Arc;

use super::Entry;

#[derive(Default)]
pub(super) struct ObjectMap {
    index: HashMap<Arc<str>, usize>,
    slots: Vec<Option<(Arc<str>, Entry)>>,
    /// Empty slots, reused before the slots grow.
    free: Vec<usize>,
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

    pub(super) fn get(&self, key: &str) -> Option<&Entry> {
        let slot = *self.index.get(key)?;
        self.slots[slot].as_ref().map(|(_, e)| e)
    }

    pub(super) fn get_mut(&mut self, key: &str) -> Option<&mut Entry> {
        let slot = *self.index.get(key)?;
        self.slots[slot].as_mut().map(|(_, e)| e)
    }

    /// Put `entry` at `key`, returning the entry it replaces.
    pub(super) fn insert(&mut self, key: String, entry: Entry) -> Option<Entry> {
        if let Some(e) = self.get_mut(&key) {
            return Some(std::mem::replace(e, entry));
        }
        let key: Arc<str> = Arc::from(key);
        let slot = match self.free.pop() {
            Some(slot) => slot,
            None => {
                self.slots.push(None);
                self.slots.len() - 1
            }
        };
        self.slots[slot] = Some((key.clone(), entry));
        self.index.insert(key, slot);
        None
    }

    pub(super) fn remove(&mut self, key: &str) -> Option<Entry> {
        let slot = self.index.remove(key)?;
        self.free.push(slot);
        self.slots[slot].take().map(|(_, e)| e)
    }

    pub(super) fn iter(&self) -> impl Iterator<Item = (&str, &Entry)> {
        self.slots.iter().flatten().map(|(k, e)| (&**k, e))
    }

    pub(super) fn values(&self) -> impl Iterator<Item = &Entry> {
        self.slots.iter().flatten().map(|(_, e)| e)
    }

    /// Slots in use or free: every object is in a slot below this, and keeps its slot for
    /// as long as it lives.
    pub(super) fn slot_count(&self) -> usize {
        self.slots.len()
    }

    /// The object in `slot`, if any.
    pub(super) fn slot_mut(&mut self, slot: usize) -> Option<(&str, &mut Entry)> {
        self.slots.get_mut(slot)?.as_mut().map(|(k, e)| (&**k, e))
    }
}
