//! `Dict`: a map keeping insertion order like Python's `dict`, with server-side `merge`.
//!
//! The methods are shared with `SortedDict` through [`MapStore`]; only the storage differs.
//! A `Dict` created with cache options evicts (see [`super::cache`]); others never do.

use ahash::{HashMap, HashSet};
use std::collections::BTreeMap;

use super::cache::Cache;
use super::snapshot::{self, Fields};
use crate::object::args;
use crate::value::{approx_size, cmp_values, eq_values, type_of, Key};
use crate::{Ctx, Error, ErrorKind, Object, Step, Value};

/// The storage a dictionary type provides to the shared methods.
pub(crate) trait MapStore {
    fn len(&self) -> usize;
    fn get(&self, k: &Key) -> Option<&Value>;
    /// Change the value at `k` in place, returning what `f` returns (`None`: no such key).
    fn update<R>(&mut self, k: &Key, f: impl FnOnce(&mut Value) -> R) -> Option<R>;
    /// Insert or replace, returning the replaced value; a replaced key keeps its position.
    fn insert(&mut self, k: Key, v: Value) -> Option<Value>;
    fn remove(&mut self, k: &Key) -> Option<Value>;
    /// The entry `popitem` takes: the last inserted (Dict) or the largest key (SortedDict).
    fn pop_last(&mut self) -> Option<(Key, Value)>;
    /// The first entry in iteration order: the one a cache evicts first.
    fn pop_first(&mut self) -> Option<(Key, Value)>;
    /// `k` was used: an insertion-ordered store moves it to the end, as if inserted now.
    fn touch(&mut self, _k: &Key) {}
    fn clear(&mut self);
    fn entries(&self) -> Box<dyn Iterator<Item = (&Key, &Value)> + '_>;
}

/// Insertion-ordered map with O(1) lookup and O(log n) deletion: each key gets a rising
/// sequence number, and a BTreeMap from numbers to keys gives the order.
#[derive(Clone, Default)]
pub(crate) struct OrderedMap {
    map: HashMap<Key, (u64, Value)>,
    order: BTreeMap<u64, Key>,
    next: u64,
}

impl MapStore for OrderedMap {
    fn len(&self) -> usize {
        self.map.len()
    }

    fn get(&self, k: &Key) -> Option<&Value> {
        self.map.get(k).map(|(_, v)| v)
    }

    fn update<R>(&mut self, k: &Key, f: impl FnOnce(&mut Value) -> R) -> Option<R> {
        self.map.get_mut(k).map(|(_, v)| f(v))
    }

    fn insert(&mut self, k: Key, v: Value) -> Option<Value> {
        if let Some(slot) = self.map.get_mut(&k) {
            return Some(std::mem::replace(&mut slot.1, v));
        }
        self.next += 1;
        self.order.insert(self.next, k.clone());
        self.map.insert(k, (self.next, v));
        None
    }

    fn remove(&mut self, k: &Key) -> Option<Value> {
        let (seq, v) = self.map.remove(k)?;
        self.order.remove(&seq);
        Some(v)
    }

    fn pop_last(&mut self) -> Option<(Key, Value)> {
        let (_, k) = self.order.pop_last()?;
        let (_, v) = self.map.remove(&k)?;
        Some((k, v))
    }

    fn pop_first(&mut self) -> Option<(Key, Value)> {
        let (_, k) = self.order.pop_first()?;
        let (_, v) = self.map.remove(&k)?;
        Some((k, v))
    }

    fn touch(&mut self, k: &Key) {
        if let Some(slot) = self.map.get_mut(k) {
            if let Some(key) = self.order.remove(&slot.0) {
                self.next += 1;
                slot.0 = self.next;
                self.order.insert(self.next, key);
            }
        }
    }

    fn clear(&mut self) {
        self.map.clear();
        self.order.clear();
    }

    fn entries(&self) -> Box<dyn Iterator<Item = (&Key, &Value)> + '_> {
        Box::new(
            self.order
                .values()
                .filter_map(|k| self.map.get_key_value(k).map(|(k, (_, v))| (k, v))),
        )
    }
}

impl MapStore for BTreeMap<Key, Value> {
    fn len(&self) -> usize {
        BTreeMap::len(self)
    }

    fn get(&self, k: &Key) -> Option<&Value> {
        BTreeMap::get(self, k)
    }

    fn update<R>(&mut self, k: &Key, f: impl FnOnce(&mut Value) -> R) -> Option<R> {
        BTreeMap::get_mut(self, k).map(f)
    }

    fn insert(&mut self, k: Key, v: Value) -> Option<Value> {
        BTreeMap::insert(self, k, v)
    }

    fn remove(&mut self, k: &Key) -> Option<Value> {
        BTreeMap::remove(self, k)
    }

    fn pop_last(&mut self) -> Option<(Key, Value)> {
        BTreeMap::pop_last(self)
    }

    fn pop_first(&mut self) -> Option<(Key, Value)> {
        BTreeMap::pop_first(self)
    }

    fn clear(&mut self) {
        BTreeMap::clear(self)
    }

    fn entries(&self) -> Box<dyn Iterator<Item = (&Key, &Value)> + '_> {
        Box::new(self.iter())
    }
}

/// A store that keeps the approximate size of its keys and values as they change, so a
/// dictionary's [`Object::size`] is O(1). Reads go through `Deref` to the store itself.
#[derive(Clone, Default)]
pub(crate) struct Measured<S> {
    store: S,
    bytes: usize,
}

impl<S> Measured<S> {
    pub(crate) fn bytes(&self) -> usize {
        self.bytes
    }
}

impl<S> std::ops::Deref for Measured<S> {
    type Target = S;

    fn deref(&self) -> &S {
        &self.store
    }
}

pub(crate) fn entry_size(k: &Key, v: &Value) -> usize {
    approx_size(k.value()) + approx_size(v)
}

impl<S: MapStore> MapStore for Measured<S> {
    fn len(&self) -> usize {
        self.store.len()
    }

    fn get(&self, k: &Key) -> Option<&Value> {
        self.store.get(k)
    }

    fn update<R>(&mut self, k: &Key, f: impl FnOnce(&mut Value) -> R) -> Option<R> {
        let (r, before, after) = self.store.update(k, |v| {
            let before = approx_size(v);
            let r = f(v);
            (r, before, approx_size(v))
        })?;
        self.bytes = self.bytes - before + after;
        Some(r)
    }

    fn insert(&mut self, k: Key, v: Value) -> Option<Value> {
        let key_size = approx_size(k.value());
        let value_size = approx_size(&v);
        let old = self.store.insert(k, v);
        // A replaced entry keeps its (equal) key: only the old value leaves.
        match &old {
            Some(old) => self.bytes = self.bytes + value_size - approx_size(old),
            None => self.bytes += key_size + value_size,
        }
        old
    }

    fn remove(&mut self, k: &Key) -> Option<Value> {
        let v = self.store.remove(k)?;
        self.bytes -= entry_size(k, &v);
        Some(v)
    }

    fn pop_last(&mut self) -> Option<(Key, Value)> {
        let (k, v) = self.store.pop_last()?;
        self.bytes -= entry_size(&k, &v);
        Some((k, v))
    }

    fn pop_first(&mut self) -> Option<(Key, Value)> {
        let (k, v) = self.store.pop_first()?;
        self.bytes -= entry_size(&k, &v);
        Some((k, v))
    }

    fn touch(&mut self, k: &Key) {
        self.store.touch(k)
    }

    fn clear(&mut self) {
        self.store.clear();
        self.bytes = 0;
    }

    fn entries(&self) -> Box<dyn Iterator<Item = (&Key, &Value)> + '_> {
        self.store.entries()
    }
}

#[derive(Clone)]
pub struct Dict {
    store: Measured<OrderedMap>,
    /// Set for a dictionary created as a cache: it evicts; `None` never does.
    cache: Option<Cache>,
}

impl Dict {
    /// `[]`, `[initial]`, or `[initial_or_nil, cache_options]` (see [`Cache::parse`]).
    pub fn new(a: &[Value]) -> Result<Self, Error> {
        args::arity("Dict", a, 0, 2)?;
        let cache = Cache::parse(args::get(a, 1))?;
        let mut store = Measured::default();
        init_store("Dict", &mut store, &a[..a.len().min(1)])?;
        if let Some(cache) = &cache {
            cache.fit(&mut store);
        }
        Ok(Dict { store, cache })
    }

    pub(crate) fn restore(state: &Value) -> Result<Self, Error> {
        let f = Fields::open_with("Dict", state, &["items"], &["max_memory"])?;
        let cache = match f.find("max_memory") {
            Some(_) => Some(Cache::restore(f.u64("max_memory")?).map_err(|e| f.wrap(e))?),
            None => None,
        };
        let mut store = Measured::default();
        restore_items(&f, &mut store)?;
        Ok(Dict { store, cache })
    }
}

/// A dictionary's snapshot: its entries as `[key, value]` pairs, in iteration order.
pub(crate) fn snapshot_store<S: MapStore>(store: &S) -> Value {
    snapshot::encode(vec![("items", snapshot_items(store))])
}

fn snapshot_items<S: MapStore>(store: &S) -> Value {
    Value::Array(store.entries().map(|(k, v)| pair(k, v)).collect())
}

/// Fill an empty dictionary from its snapshot, in the snapshot's order.
pub(crate) fn restore_store<S: MapStore>(type_name: &'static str, store: &mut S, state: &Value) -> Result<(), Error> {
    restore_items(&Fields::open(type_name, state, &["items"])?, store)
}

fn restore_items<S: MapStore>(f: &Fields, store: &mut S) -> Result<(), Error> {
    let entries = pairs("items", f.get("items")?).map_err(|e| f.wrap(e))?;
    let n = entries.len();
    for (k, v) in entries {
        store.insert(k, v);
    }
    if store.len() != n {
        return Err(f.corrupt(format!(
            "'items' holds duplicate keys ({n} pairs, {} keys)",
            store.len()
        )));
    }
    Ok(())
}

impl Object for Dict {
    fn type_name(&self) -> &'static str {
        "Dict"
    }

    fn is_mutating(&self, method: &str) -> bool {
        // A cache's reads move their key in its order: a replay must see them.
        !is_read(method) || (self.cache.is_some() && Cache::is_use(method))
    }

    fn may_grow(&self, method: &str) -> bool {
        may_grow(method)
    }

    fn size(&self) -> usize {
        self.store.bytes()
    }

    fn is_cache(&self) -> bool {
        self.cache.is_some()
    }

    fn evict(&mut self, bytes: usize) -> usize {
        match &self.cache {
            Some(_) => Cache::evict(&mut self.store, bytes),
            None => 0,
        }
    }

    fn snapshot(&self) -> Option<Value> {
        let items = ("items", snapshot_items(&self.store));
        Some(snapshot::encode(match &self.cache {
            Some(cache) => vec![items, ("max_memory", Value::from(cache.max_memory))],
            None => vec![items],
        }))
    }

    fn apply(&mut self, method: &str, a: &[Value], _ctx: &mut Ctx) -> Result<Step, Error> {
        let reply = match &self.cache {
            Some(cache) => cache.apply(&mut self.store, method, a),
            None => apply_map(&mut self.store, method, a),
        };
        match reply {
            Some(r) => r.map(Step::Reply),
            None => Err(super::unknown_method("Dict", method)),
        }
    }
}

/// Fill a new dictionary from its constructor arguments: `[]`, `[nil]` or `[map_or_pairs]`.
pub(crate) fn init_store<S: MapStore>(type_name: &str, store: &mut S, a: &[Value]) -> Result<(), Error> {
    args::arity(type_name, a, 0, 1)?;
    if !matches!(args::get(a, 0), Value::Nil) {
        for (k, v) in pairs(type_name, &a[0])? {
            store.insert(k, v);
        }
    }
    Ok(())
}

/// The methods that only read (their replies need no recording).
pub(crate) fn is_read(method: &str) -> bool {
    matches!(
        method,
        "len" | "getitem" | "get" | "contains" | "keys" | "values" | "items"
    )
}

/// The methods that may add bytes (all writes but those that only take entries out).
pub(crate) fn may_grow(method: &str) -> bool {
    !is_read(method) && !matches!(method, "delitem" | "pop" | "popitem" | "clear")
}

pub(crate) fn key(method: &str, a: &[Value], i: usize) -> Result<Key, Error> {
    Key::new(args::get(a, i).clone()).map_err(|e| Error::bad_args(format!("{method}(): {}", e.message)))
}

pub(crate) fn key_error(k: &Key) -> Error {
    Error::new(ErrorKind::KeyError, super::repr(k.value())).with_data(k.value().clone())
}

pub(crate) fn pair(k: &Key, v: &Value) -> Value {
    Value::Array(vec![k.value().clone(), v.clone()])
}

/// A map, or an array of `[key, value]` pairs, as validated keys and values.
pub(crate) fn pairs(method: &str, v: &Value) -> Result<Vec<(Key, Value)>, Error> {
    let check = |k: &Value| Key::new(k.clone()).map_err(|e| Error::bad_args(format!("{method}(): {}", e.message)));
    match v {
        Value::Map(m) => m.iter().map(|(k, v)| Ok((check(k)?, v.clone()))).collect(),
        Value::Array(items) => items
            .iter()
            .enumerate()
            .map(|(i, item)| match item {
                Value::Array(kv) if kv.len() == 2 => Ok((check(&kv[0])?, kv[1].clone())),
                _ => Err(Error::bad_args(format!(
                    "{method}(): sequence element #{i} is not a [key, value] pair"
                ))),
            })
            .collect(),
        other => Err(Error::bad_args(format!(
            "{method}(): expected a map or an array of [key, value] pairs, not {}",
            type_of(other)
        ))),
    }
}

/// Run a method every dictionary type has; `None` when `method` is not one of them.
pub(crate) fn apply_map<S: MapStore>(store: &mut S, method: &str, a: &[Value]) -> Option<Result<Value, Error>> {
    apply_inner(store, method, a).transpose()
}

fn apply_inner<S: MapStore>(store: &mut S, method: &str, a: &[Value]) -> Result<Option<Value>, Error> {
    let v = match method {
        "len" => {
            args::arity(method, a, 0, 0)?;
            Value::from(store.len() as u64)
        }
        "getitem" => {
            args::arity(method, a, 1, 1)?;
            let k = key(method, a, 0)?;
            store.get(&k).cloned().ok_or_else(|| key_error(&k))?
        }
        "get" => {
            args::arity(method, a, 1, 2)?;
            let k = key(method, a, 0)?;
            store.get(&k).cloned().unwrap_or_else(|| args::get(a, 1).clone())
        }
        "setitem" => {
            args::arity(method, a, 2, 2)?;
            store.insert(key(method, a, 0)?, a[1].clone());
            Value::Nil
        }
        "delitem" => {
            args::arity(method, a, 1, 1)?;
            let k = key(method, a, 0)?;
            store.remove(&k).ok_or_else(|| key_error(&k))?;
            Value::Nil
        }
        "contains" => {
            args::arity(method, a, 1, 1)?;
            Value::Boolean(store.get(&key(method, a, 0)?).is_some())
        }
        "keys" => {
            args::arity(method, a, 0, 0)?;
            Value::Array(store.entries().map(|(k, _)| k.value().clone()).collect())
        }
        "values" => {
            args::arity(method, a, 0, 0)?;
            Value::Array(store.entries().map(|(_, v)| v.clone()).collect())
        }
        "items" => {
            args::arity(method, a, 0, 0)?;
            Value::Array(store.entries().map(|(k, v)| pair(k, v)).collect())
        }
        "setdefault" => {
            args::arity(method, a, 1, 2)?;
            let k = key(method, a, 0)?;
            match store.get(&k) {
                Some(v) => v.clone(),
                None => {
                    let v = args::get(a, 1).clone();
                    store.insert(k, v.clone());
                    v
                }
            }
        }
        "pop" => {
            args::arity(method, a, 1, 2)?;
            let k = key(method, a, 0)?;
            match store.remove(&k) {
                Some(v) => v,
                // An absent default differs from an explicit nil one.
                None if a.len() == 2 => a[1].clone(),
                None => return Err(key_error(&k)),
            }
        }
        "popitem" => {
            args::arity(method, a, 0, 0)?;
            let (k, v) = store
                .pop_last()
                .ok_or_else(|| Error::new(ErrorKind::KeyError, "popitem(): dictionary is empty"))?;
            pair(&k, &v)
        }
        "update" => {
            args::arity(method, a, 1, 1)?;
            // Validate every key before inserting any, so a bad entry changes nothing.
            for (k, v) in pairs(method, &a[0])? {
                store.insert(k, v);
            }
            Value::Nil
        }
        "clear" => {
            args::arity(method, a, 0, 0)?;
            store.clear();
            Value::Nil
        }
        "merge" => {
            args::arity(method, a, 3, 3)?;
            let k = key(method, a, 0)?;
            let op = MergeOp::parse(method, a, 2)?;
            let merged = store.update(&k, |cur| {
                merge_existing(cur, a[1].clone(), op)?;
                Ok::<_, Error>(cur.clone())
            });
            match merged {
                Some(r) => r?,
                None => {
                    let v = merge_new(a[1].clone(), op)?;
                    store.insert(k, v.clone());
                    v
                }
            }
        }
        "merge_many" => {
            args::arity(method, a, 2, 2)?;
            let entries = pairs(method, &a[0])?;
            let op = MergeOp::parse(method, a, 1)?;
            merge_many(store, entries, op)?;
            Value::Nil
        }
        _ => return Ok(None),
    };
    Ok(Some(v))
}

/// Merge a batch atomically: compute every new value on the side, commit only if all succeed.
fn merge_many<S: MapStore>(store: &mut S, entries: Vec<(Key, Value)>, op: MergeOp) -> Result<(), Error> {
    let mut staged: HashMap<Key, Value> = HashMap::default();
    let mut order: Vec<Key> = Vec::new();
    for (k, v) in entries {
        if let Some(cur) = staged.get_mut(&k) {
            merge_existing(cur, v, op)?;
            continue;
        }
        let new = match store.get(&k) {
            Some(cur) => {
                let mut cur = cur.clone();
                merge_existing(&mut cur, v, op)?;
                cur
            }
            None => merge_new(v, op)?,
        };
        order.push(k.clone());
        staged.insert(k, new);
    }
    for k in order {
        if let Some(v) = staged.remove(&k) {
            store.insert(k, v);
        }
    }
    Ok(())
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum MergeOp {
    Sum,
    Min,
    Max,
    Append,
    Union,
    Replace,
}

impl MergeOp {
    fn parse(method: &str, a: &[Value], i: usize) -> Result<MergeOp, Error> {
        Ok(match args::str(method, a, i, "op")? {
            "sum" => MergeOp::Sum,
            "min" => MergeOp::Min,
            "max" => MergeOp::Max,
            "append" => MergeOp::Append,
            "union" => MergeOp::Union,
            "replace" => MergeOp::Replace,
            other => {
                return Err(Error::value(format!(
                    "{method}(): unknown op '{other}' (expected sum, min, max, append, union or replace)"
                )))
            }
        })
    }

    fn name(self) -> &'static str {
        match self {
            MergeOp::Sum => "sum",
            MergeOp::Min => "min",
            MergeOp::Max => "max",
            MergeOp::Append => "append",
            MergeOp::Union => "union",
            MergeOp::Replace => "replace",
        }
    }
}

fn wrong_type(op: MergeOp, what: &str, v: &Value) -> Error {
    Error::bad_args(format!("merge '{}' needs {what}, not {}", op.name(), type_of(v)))
}

fn is_number(v: &Value) -> bool {
    matches!(v, Value::Integer(_) | Value::F32(_) | Value::F64(_))
}

/// The value a missing key takes.
pub(crate) fn merge_new(v: Value, op: MergeOp) -> Result<Value, Error> {
    match op {
        MergeOp::Sum if !is_number(&v) => Err(wrong_type(op, "a number", &v)),
        MergeOp::Append => Ok(Value::Array(vec![v])),
        MergeOp::Union => match v {
            Value::Array(items) => {
                let mut out = Vec::new();
                union_extend(&mut out, items);
                Ok(Value::Array(out))
            }
            other => Err(wrong_type(op, "an array", &other)),
        },
        _ => Ok(v),
    }
}

/// Merge into an existing value. Every check happens before `cur` changes.
pub(crate) fn merge_existing(cur: &mut Value, v: Value, op: MergeOp) -> Result<(), Error> {
    match op {
        MergeOp::Sum => {
            if !is_number(cur) {
                return Err(wrong_type(op, "a number at the key", cur));
            }
            if !is_number(&v) {
                return Err(wrong_type(op, "a number", &v));
            }
            *cur = add_numbers(cur, &v)?;
        }
        MergeOp::Min => {
            if cmp_values(&v, cur).is_lt() {
                *cur = v;
            }
        }
        MergeOp::Max => {
            if cmp_values(&v, cur).is_gt() {
                *cur = v;
            }
        }
        MergeOp::Append => match cur {
            Value::Array(items) => items.push(v),
            other => return Err(wrong_type(op, "an array at the key", other)),
        },
        MergeOp::Union => {
            let Value::Array(items) = v else {
                return Err(wrong_type(op, "an array", &v));
            };
            match cur {
                Value::Array(existing) => union_extend(existing, items),
                other => return Err(wrong_type(op, "an array at the key", other)),
            }
        }
        MergeOp::Replace => *cur = v,
    }
    Ok(())
}

/// Python's `+` on two numbers: exact (checked) for integers, float as soon as one is a float.
pub(crate) fn add_numbers(a: &Value, b: &Value) -> Result<Value, Error> {
    fn int(v: &Value) -> Option<i128> {
        match v {
            Value::Integer(n) => n.as_i64().map(i128::from).or_else(|| n.as_u64().map(i128::from)),
            _ => None,
        }
    }
    fn float(v: &Value) -> f64 {
        match v {
            Value::Integer(n) => n.as_f64().unwrap_or(0.0),
            Value::F32(x) => f64::from(*x),
            Value::F64(x) => *x,
            _ => 0.0,
        }
    }
    match (int(a), int(b)) {
        (Some(x), Some(y)) => {
            let s = x + y; // both fit in 65 bits, so i128 cannot overflow
            if let Ok(s) = i64::try_from(s) {
                Ok(Value::from(s))
            } else if let Ok(s) = u64::try_from(s) {
                Ok(Value::from(s))
            } else {
                Err(Error::new(
                    ErrorKind::OverflowError,
                    format!("merge 'sum' overflow: {x} + {y} does not fit in 64 bits"),
                ))
            }
        }
        _ => Ok(Value::F64(float(a) + float(b))),
    }
}

/// Append the items not already present (Python equality), keeping their order.
fn union_extend(existing: &mut Vec<Value>, items: Vec<Value>) {
    let mut seen: HashSet<Key> = existing.iter().filter_map(|v| Key::new(v.clone()).ok()).collect();
    for item in items {
        let fresh = match Key::new(item.clone()) {
            Ok(k) => seen.insert(k),
            // Maps are unhashable: compare them one by one (rare).
            Err(_) => !existing.iter().any(|e| eq_values(e, &item)),
        };
        if fresh {
            existing.push(item);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::objects::testing::*;

    fn d(p: &mut Harness) {
        p.create_ok("Dict", "d", vec![]);
    }

    #[test]
    fn keeps_insertion_order_and_updates_in_place() {
        let mut p = Harness::new();
        d(&mut p);
        for (k, v) in [("b", 1), ("a", 2), ("c", 3)] {
            p.ok("Dict", "d", "setitem", vec![k.into(), v.into()]);
        }
        p.ok("Dict", "d", "setitem", vec!["b".into(), 10.into()]);
        assert_eq!(
            p.ok("Dict", "d", "keys", vec![]),
            arr(vec!["b".into(), "a".into(), "c".into()])
        );
        p.ok("Dict", "d", "delitem", vec!["b".into()]);
        p.ok("Dict", "d", "setitem", vec!["b".into(), 5.into()]);
        assert_eq!(
            p.ok("Dict", "d", "values", vec![]),
            arr(vec![2.into(), 3.into(), 5.into()])
        );
        assert_eq!(p.ok("Dict", "d", "popitem", vec![]), arr(vec!["b".into(), 5.into()]));
        assert_eq!(
            p.ok("Dict", "d", "items", vec![]),
            arr(vec![arr(vec!["a".into(), 2.into()]), arr(vec!["c".into(), 3.into()])])
        );
        assert_eq!(p.ok("Dict", "d", "len", vec![]), Value::from(2));
    }

    #[test]
    fn numeric_keys_follow_python_equality() {
        let mut p = Harness::new();
        d(&mut p);
        p.ok("Dict", "d", "setitem", vec![1.into(), "one".into()]);
        assert_eq!(p.ok("Dict", "d", "getitem", vec![Value::F64(1.0)]), Value::from("one"));
        assert_eq!(
            p.ok("Dict", "d", "contains", vec![Value::F64(1.5)]),
            Value::Boolean(false)
        );
    }

    #[test]
    fn missing_keys() {
        let mut p = Harness::new();
        d(&mut p);
        let e = p.err("Dict", "d", "getitem", vec!["x".into()]);
        assert_eq!((e.kind, e.data), (ErrorKind::KeyError, Value::from("x")));
        assert_eq!(
            p.err("Dict", "d", "delitem", vec!["x".into()]).kind,
            ErrorKind::KeyError
        );
        assert_eq!(p.err("Dict", "d", "pop", vec!["x".into()]).kind, ErrorKind::KeyError);
        assert_eq!(p.ok("Dict", "d", "pop", vec!["x".into(), Value::Nil]), Value::Nil);
        assert_eq!(p.ok("Dict", "d", "pop", vec!["x".into(), 7.into()]), Value::from(7));
        assert_eq!(p.ok("Dict", "d", "get", vec!["x".into()]), Value::Nil);
        assert_eq!(p.ok("Dict", "d", "get", vec!["x".into(), 3.into()]), Value::from(3));
        assert_eq!(p.err("Dict", "d", "popitem", vec![]).kind, ErrorKind::KeyError);
        assert_eq!(
            p.ok("Dict", "d", "setdefault", vec!["x".into(), 4.into()]),
            Value::from(4)
        );
        assert_eq!(
            p.ok("Dict", "d", "setdefault", vec!["x".into(), 5.into()]),
            Value::from(4)
        );
        assert_eq!(p.ok("Dict", "d", "pop", vec!["x".into()]), Value::from(4));
    }

    #[test]
    fn bad_keys_and_arguments() {
        let mut p = Harness::new();
        d(&mut p);
        let map = Value::Map(vec![]);
        assert_eq!(
            p.err("Dict", "d", "setitem", vec![map.clone(), 1.into()]).kind,
            ErrorKind::BadArguments
        );
        assert_eq!(p.err("Dict", "d", "getitem", vec![]).kind, ErrorKind::BadArguments);
        assert_eq!(
            p.err("Dict", "d", "update", vec![1.into()]).kind,
            ErrorKind::BadArguments
        );
        assert_eq!(p.err("Dict", "d", "frobnicate", vec![]).kind, ErrorKind::UnknownMethod);
        // A bad pair anywhere in update changes nothing.
        let bad = arr(vec![arr(vec!["a".into(), 1.into()]), arr(vec![map, 2.into()])]);
        assert_eq!(p.err("Dict", "d", "update", vec![bad]).kind, ErrorKind::BadArguments);
        assert_eq!(p.ok("Dict", "d", "len", vec![]), Value::from(0));
        assert_eq!(p.create_err("Dict", "e", vec![1.into()]).kind, ErrorKind::BadArguments);
    }

    #[test]
    fn constructor_and_update_take_maps_or_pairs() {
        let mut p = Harness::new();
        let m = Value::Map(vec![("a".into(), 1.into()), ("b".into(), 2.into())]);
        p.create_ok("Dict", "d", vec![m]);
        p.ok("Dict", "d", "update", vec![arr(vec![arr(vec!["c".into(), 3.into()])])]);
        assert_eq!(
            p.ok("Dict", "d", "keys", vec![]),
            arr(vec!["a".into(), "b".into(), "c".into()])
        );
        p.ok("Dict", "d", "clear", vec![]);
        assert_eq!(p.ok("Dict", "d", "len", vec![]), Value::from(0));
    }

    #[test]
    fn merge_ops() {
        let mut p = Harness::new();
        d(&mut p);
        let merge =
            |p: &mut Harness, k: &str, v: Value, op: &str| p.ok("Dict", "d", "merge", vec![k.into(), v, op.into()]);
        assert_eq!(merge(&mut p, "s", 2.into(), "sum"), Value::from(2));
        assert_eq!(merge(&mut p, "s", 3.into(), "sum"), Value::from(5));
        assert_eq!(merge(&mut p, "s", Value::F64(0.5), "sum"), Value::F64(5.5));
        assert_eq!(merge(&mut p, "m", 5.into(), "min"), Value::from(5));
        assert_eq!(merge(&mut p, "m", 3.into(), "min"), Value::from(3));
        assert_eq!(merge(&mut p, "m", 9.into(), "min"), Value::from(3));
        assert_eq!(merge(&mut p, "x", 3.into(), "max"), Value::from(3));
        assert_eq!(merge(&mut p, "x", 9.into(), "max"), Value::from(9));
        assert_eq!(merge(&mut p, "a", 1.into(), "append"), arr(vec![1.into()]));
        assert_eq!(merge(&mut p, "a", 1.into(), "append"), arr(vec![1.into(), 1.into()]));
        let u = arr(vec![1.into(), 2.into(), 1.into()]);
        assert_eq!(merge(&mut p, "u", u, "union"), arr(vec![1.into(), 2.into()]));
        let u = arr(vec![Value::F64(2.0), 3.into()]);
        assert_eq!(merge(&mut p, "u", u, "union"), arr(vec![1.into(), 2.into(), 3.into()]));
        assert_eq!(merge(&mut p, "u", "z".into(), "replace"), Value::from("z"));
    }

    #[test]
    fn merge_errors_change_nothing() {
        let mut p = Harness::new();
        d(&mut p);
        p.ok("Dict", "d", "setitem", vec!["s".into(), i64::MAX.into()]);
        p.ok("Dict", "d", "setitem", vec!["t".into(), "text".into()]);
        // Past i64 but within u64 is still a valid MessagePack integer.
        p.ok("Dict", "d", "setitem", vec!["s".into(), (u64::MAX - 1).into()]);
        assert_eq!(
            p.ok("Dict", "d", "merge", vec!["s".into(), 1.into(), "sum".into()]),
            Value::from(u64::MAX)
        );
        let e = p.err("Dict", "d", "merge", vec!["s".into(), 1.into(), "sum".into()]);
        assert_eq!(e.kind, ErrorKind::OverflowError);
        p.ok("Dict", "d", "setitem", vec!["n".into(), i64::MIN.into()]);
        let e = p.err("Dict", "d", "merge", vec!["n".into(), (-1).into(), "sum".into()]);
        assert_eq!(e.kind, ErrorKind::OverflowError);
        assert_eq!(p.ok("Dict", "d", "getitem", vec!["n".into()]), Value::from(i64::MIN));
        let e = p.err("Dict", "d", "merge", vec!["t".into(), 1.into(), "sum".into()]);
        assert_eq!(e.kind, ErrorKind::BadArguments);
        let e = p.err("Dict", "d", "merge", vec!["new".into(), "x".into(), "sum".into()]);
        assert_eq!(e.kind, ErrorKind::BadArguments);
        let e = p.err("Dict", "d", "merge", vec!["t".into(), 1.into(), "append".into()]);
        assert_eq!(e.kind, ErrorKind::BadArguments);
        let e = p.err("Dict", "d", "merge", vec!["new".into(), 1.into(), "union".into()]);
        assert_eq!(e.kind, ErrorKind::BadArguments);
        let e = p.err("Dict", "d", "merge", vec!["new".into(), 1.into(), "nope".into()]);
        assert_eq!(e.kind, ErrorKind::ValueError);
        assert_eq!(p.ok("Dict", "d", "contains", vec!["new".into()]), Value::Boolean(false));
        assert_eq!(p.ok("Dict", "d", "getitem", vec!["t".into()]), Value::from("text"));
        let e = p.err("Dict", "d", "merge", vec![true.into(), true.into(), "sum".into()]);
        assert_eq!(e.kind, ErrorKind::BadArguments);
    }

    #[test]
    fn merge_many_is_atomic() {
        let mut p = Harness::new();
        d(&mut p);
        let batch = arr(vec![
            arr(vec!["a".into(), 1.into()]),
            arr(vec!["b".into(), 2.into()]),
            arr(vec!["a".into(), 3.into()]),
        ]);
        p.ok("Dict", "d", "merge_many", vec![batch, "sum".into()]);
        assert_eq!(
            p.ok("Dict", "d", "items", vec![]),
            arr(vec![arr(vec!["a".into(), 4.into()]), arr(vec!["b".into(), 2.into()])])
        );
        // The last entry is bad: nothing of the batch may land.
        let batch = Value::Map(vec![
            ("a".into(), 1.into()),
            ("c".into(), 1.into()),
            ("b".into(), "x".into()),
        ]);
        let e = p.err("Dict", "d", "merge_many", vec![batch, "sum".into()]);
        assert_eq!(e.kind, ErrorKind::BadArguments);
        assert_eq!(p.ok("Dict", "d", "getitem", vec!["a".into()]), Value::from(4));
        assert_eq!(p.ok("Dict", "d", "contains", vec!["c".into()]), Value::Boolean(false));
        let batch = Value::Map(vec![("a".into(), 1.into()), ("b".into(), i64::MAX.into())]);
        p.ok("Dict", "d", "merge_many", vec![batch, "sum".into()]);
        let batch = Value::Map(vec![("a".into(), 1.into()), ("b".into(), u64::MAX.into())]);
        let e = p.err("Dict", "d", "merge_many", vec![batch, "sum".into()]);
        assert_eq!(e.kind, ErrorKind::OverflowError);
        assert_eq!(p.ok("Dict", "d", "getitem", vec!["a".into()]), Value::from(5));
    }

    #[test]
    fn reads_are_not_mutating() {
        let o = Dict::new(&[]).unwrap();
        for m in ["len", "getitem", "get", "contains", "keys", "values", "items"] {
            assert!(!o.is_mutating(m), "{m}");
        }
        for m in [
            "setitem",
            "delitem",
            "pop",
            "popitem",
            "setdefault",
            "update",
            "clear",
            "merge",
            "merge_many",
        ] {
            assert!(o.is_mutating(m), "{m}");
        }
    }
}
