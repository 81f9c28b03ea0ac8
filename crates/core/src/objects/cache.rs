//! A `Dict` created as a cache: constructor `[initial_or_nil, {"max_memory": bytes,
//! "evict": "lru"}]`. Redis's `allkeys-lru` for one object, and the only objects that evict.
//!
//! A use of a key (`getitem`, `get`, and every write of it) moves it to the end of the
//! dictionary's order, so the order runs from the least to the most recently used key; while
//! the entries hold more than `max_memory` bytes (counted as for `--max-memory`), the first
//! ones go. The server, over `--max-memory`, makes room the same way ([`Cache::evict`]).
//!
//! What a cache evicts depends on its state alone, so a replay and a Raft follower evict the
//! same keys: for that, its reads are mutating calls (logged when it is persistent: they
//! change the order), and its snapshot keeps its order and its `max_memory`.

use super::dict::{apply_map, entry_size, MapStore, Measured, OrderedMap};
use crate::value::{type_of, Key};
use crate::{Error, Value};

#[derive(Clone)]
/// A cache's options.
pub(crate) struct Cache {
    /// The bytes its entries may hold.
    pub(crate) max_memory: usize,
}

impl Cache {
    /// The cache options of a `Dict` constructor: nil (no cache) or a map of `max_memory`
    /// (positive bytes) and `evict` (`"lru"`, the one policy, and the default).
    pub(crate) fn parse(options: &Value) -> Result<Option<Cache>, Error> {
        let entries = match options {
            Value::Nil => return Ok(None),
            Value::Map(entries) => entries,
            other => {
                return Err(Error::bad_args(format!(
                    "Dict(): the cache options must be a map, not {}",
                    type_of(other)
                )))
            }
        };
        let mut max_memory = None;
        for (name, v) in entries {
            match (name.as_str(), v) {
                (Some("max_memory"), Value::Integer(n)) => match n.as_u64().filter(|&n| n > 0) {
                    Some(n) => max_memory = Some(Cache::restore(n)?),
                    None => return Err(Error::value("Dict(): max_memory must be a positive number of bytes")),
                },
                (Some("max_memory"), other) => {
                    return Err(Error::bad_args(format!(
                        "Dict(): max_memory must be an int (bytes), not {}",
                        type_of(other)
                    )))
                }
                (Some("evict"), Value::String(s)) if s.as_str() == Some("lru") => {}
                (Some("evict"), other) => {
                    return Err(Error::value(format!(
                        "Dict(): unknown eviction policy {other} (the one known: \"lru\")"
                    )))
                }
                _ => return Err(Error::bad_args(format!("Dict(): unknown cache option {name}"))),
            }
        }
        match max_memory {
            Some(cache) => Ok(Some(cache)),
            None => Err(Error::bad_args("Dict(): a cache needs max_memory (bytes)")),
        }
    }

    /// A cache of `max_memory` bytes, as a snapshot keeps it.
    pub(crate) fn restore(max_memory: u64) -> Result<Cache, Error> {
        match usize::try_from(max_memory) {
            Ok(max_memory) if max_memory > 0 => Ok(Cache { max_memory }),
            _ => Err(Error::value(format!(
                "a cache's max_memory must be positive and fit this machine, not {max_memory}"
            ))),
        }
    }

    /// Whether a read is a use of its key (it moves the key to the most recently used end).
    pub(crate) fn is_use(method: &str) -> bool {
        matches!(method, "getitem" | "get")
    }

    /// Run a dictionary method as a cache: refuse an entry larger than the whole cache
    /// before anything changes, then mark the keys used, then evict past `max_memory`.
    pub(crate) fn apply(
        &self,
        store: &mut Measured<OrderedMap>,
        method: &str,
        a: &[Value],
    ) -> Option<Result<Value, Error>> {
        if let Err(e) = self.admit(store, method, a) {
            return Some(Err(e));
        }
        let reply = apply_map(store, method, a)?;
        if reply.is_ok() {
            for k in used_keys(method, a) {
                if let Ok(k) = Key::new(k.clone()) {
                    store.touch(&k);
                }
            }
            self.fit(store);
        }
        Some(reply)
    }

    /// Evict until the entries fit `max_memory`. The key just used is last in the order,
    /// and fits alone (`admit`), so it stays; only a `merge` can make an entry larger than
    /// the cache, and then it goes too.
    pub(crate) fn fit(&self, store: &mut Measured<OrderedMap>) {
        let over = store.bytes().saturating_sub(self.max_memory);
        if over > 0 {
            Cache::evict(store, over);
        }
    }

    /// Let the least recently used entries go until `bytes` are freed or none is left;
    /// returns the bytes freed.
    pub(crate) fn evict(store: &mut Measured<OrderedMap>, bytes: usize) -> usize {
        let before = store.bytes();
        while before - store.bytes() < bytes && store.pop_first().is_some() {}
        before - store.bytes()
    }

    /// Refuse a write of an entry larger than the whole cache (it would evict everything,
    /// itself included): a `ValueError`, the cache unchanged.
    fn admit(&self, store: &Measured<OrderedMap>, method: &str, a: &[Value]) -> Result<(), Error> {
        let written: Vec<(&Value, &Value)> = match (method, a) {
            ("setitem", [k, v]) => vec![(k, v)],
            // Only an absent key takes the default.
            ("setdefault", [k, rest @ ..]) => match Key::new(k.clone()) {
                Ok(key) if store.get(&key).is_none() => vec![(k, rest.first().unwrap_or(&Value::Nil))],
                _ => vec![],
            },
            ("update", [batch]) => pairs_of(batch).collect(),
            _ => vec![],
        };
        for (k, v) in written {
            let Ok(key) = Key::new(k.clone()) else { continue };
            let size = entry_size(&key, v);
            if size > self.max_memory {
                return Err(Error::value(format!(
                    "{method}(): this entry takes about {size} bytes, more than the cache's max_memory of {}",
                    self.max_memory
                )));
            }
        }
        Ok(())
    }
}

/// The keys a successful call used, in the order it used them.
fn used_keys<'a>(method: &str, a: &'a [Value]) -> Box<dyn Iterator<Item = &'a Value> + 'a> {
    match (method, a) {
        ("getitem" | "get" | "setitem" | "setdefault" | "merge", [k, ..]) => Box::new(std::iter::once(k)),
        ("update" | "merge_many", [batch, ..]) => Box::new(pairs_of(batch).map(|(k, _)| k)),
        _ => Box::new(std::iter::empty()),
    }
}

/// The `[key, value]` pairs of a map or an array of pairs, as `update` takes them (the
/// method itself checks their shape).
fn pairs_of(batch: &Value) -> Box<dyn Iterator<Item = (&Value, &Value)> + '_> {
    match batch {
        Value::Map(entries) => Box::new(entries.iter().map(|(k, v)| (k, v))),
        Value::Array(items) => Box::new(items.iter().filter_map(|item| match item {
            Value::Array(kv) if kv.len() == 2 => Some((&kv[0], &kv[1])),
            _ => None,
        })),
        _ => Box::new(std::iter::empty()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::objects::testing::*;
    use crate::ErrorKind;

    /// About 1 KB an entry.
    fn kb() -> Value {
        Value::from("x".repeat(1000))
    }

    /// A cache with room for three of those entries.
    fn cache(h: &mut Harness) {
        let options = Value::Map(vec![("max_memory".into(), 3500.into()), ("evict".into(), "lru".into())]);
        h.create_ok("Dict", "c", vec![Value::Nil, options]);
    }

    fn keys(h: &mut Harness) -> Value {
        h.ok("Dict", "c", "keys", vec![])
    }

    #[test]
    fn evicts_the_least_recently_used_keys_past_its_max_memory() {
        let mut h = Harness::new();
        cache(&mut h);
        for k in ["a", "b", "c"] {
            h.ok("Dict", "c", "setitem", vec![k.into(), kb()]);
        }
        // A read and a write are uses: "b" is now the least recently used.
        h.ok("Dict", "c", "getitem", vec!["a".into()]);
        h.ok("Dict", "c", "setitem", vec!["c".into(), kb()]);
        h.ok("Dict", "c", "setitem", vec!["d".into(), kb()]);
        assert_eq!(keys(&mut h), arr(vec!["a".into(), "c".into(), "d".into()]));
        h.ok("Dict", "c", "get", vec!["a".into()]);
        h.ok("Dict", "c", "update", vec![Value::Map(vec![("e".into(), kb())])]);
        assert_eq!(keys(&mut h), arr(vec!["d".into(), "a".into(), "e".into()]));
        // Only uses reorder: contains, len and iteration do not.
        h.ok("Dict", "c", "contains", vec!["d".into()]);
        h.ok("Dict", "c", "merge", vec!["f".into(), kb(), "replace".into()]);
        assert_eq!(keys(&mut h), arr(vec!["a".into(), "e".into(), "f".into()]));
    }

    #[test]
    fn an_entry_larger_than_the_cache_is_refused_and_changes_nothing() {
        let mut h = Harness::new();
        cache(&mut h);
        h.ok("Dict", "c", "setitem", vec!["a".into(), kb()]);
        let huge = Value::from("x".repeat(4000));
        for (method, args) in [
            ("setitem", vec!["b".into(), huge.clone()]),
            ("setdefault", vec!["b".into(), huge.clone()]),
            ("update", vec![arr(vec![arr(vec!["b".into(), huge.clone()])])]),
        ] {
            let e = h.err("Dict", "c", method, args);
            assert_eq!(e.kind, ErrorKind::ValueError, "{method}");
            assert!(e.message.contains("max_memory of 3500"), "{e}");
        }
        assert_eq!(keys(&mut h), arr(vec!["a".into()]));
        // A present key keeps its value: setdefault's default is not written.
        assert_eq!(h.ok("Dict", "c", "setdefault", vec!["a".into(), huge]), kb());
    }

    #[test]
    fn reads_are_mutating_only_in_a_cache() {
        let plain = super::super::create("Dict", &[]).unwrap();
        let options = Value::Map(vec![("max_memory".into(), 100.into())]);
        let cache = super::super::create("Dict", &[Value::Nil, options]).unwrap();
        for m in ["getitem", "get"] {
            assert!(!plain.is_mutating(m) && cache.is_mutating(m), "{m}");
            assert!(!cache.may_grow(m), "{m}");
        }
        assert!(!cache.is_mutating("contains") && !cache.is_mutating("items"));
        assert!(cache.is_cache() && !plain.is_cache());
    }

    #[test]
    fn the_options_are_checked() {
        let mut h = Harness::new();
        let bad = |options: Vec<(Value, Value)>| vec![Value::Nil, Value::Map(options)];
        for (options, kind) in [
            (bad(vec![("max_memory".into(), 0.into())]), ErrorKind::ValueError),
            (bad(vec![("max_memory".into(), (-5).into())]), ErrorKind::ValueError),
            (bad(vec![("max_memory".into(), "1MiB".into())]), ErrorKind::BadArguments),
            (
                bad(vec![("max_memory".into(), 9.into()), ("evict".into(), "random".into())]),
                ErrorKind::ValueError,
            ),
            (bad(vec![("evict".into(), "lru".into())]), ErrorKind::BadArguments),
            (
                bad(vec![("max_memory".into(), 9.into()), ("ttl".into(), 1.into())]),
                ErrorKind::BadArguments,
            ),
            (vec![Value::Nil, 5.into()], ErrorKind::BadArguments),
        ] {
            assert_eq!(h.create_err("Dict", "c", options.clone()).kind, kind, "{options:?}");
        }
    }

    #[test]
    fn initial_entries_past_max_memory_keep_the_last() {
        let mut h = Harness::new();
        let initial = Value::Map(["a", "b", "c", "d", "e"].map(|k| (k.into(), kb())).to_vec());
        let options = Value::Map(vec![("max_memory".into(), 3500.into())]);
        h.create_ok("Dict", "c", vec![initial, options]);
        assert_eq!(keys(&mut h), arr(vec!["c".into(), "d".into(), "e".into()]));
    }

    #[test]
    fn a_snapshot_keeps_the_max_memory_and_the_order_of_use() {
        let options = Value::Map(vec![("max_memory".into(), 3500.into())]);
        let mut a = Solo::new(super::super::create("Dict", &[Value::Nil, options]).unwrap());
        for k in ["a", "b", "c"] {
            a.ok("setitem", &[k.into(), kb()]);
        }
        a.ok("getitem", &["a".into()]);
        let snap = a.obj.snapshot().unwrap();
        let mut b = Solo::new(crate::objects::snapshot::restore("Dict", &snap).unwrap());
        assert!(b.obj.is_cache());
        assert_eq!(b.obj.size(), a.obj.size());
        for solo in [&mut a, &mut b] {
            solo.ok("setitem", &["d".into(), kb()]);
            assert_eq!(solo.ok("keys", &[]), arr(vec!["c".into(), "a".into(), "d".into()]));
        }
        assert_eq!(a.obj.snapshot(), b.obj.snapshot());
        // A plain dict's snapshot is as it was: no cache field.
        let plain = super::super::create("Dict", &[]).unwrap().snapshot().unwrap();
        assert!(!format!("{plain}").contains("max_memory"));
    }
}
