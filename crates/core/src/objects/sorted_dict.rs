//! `SortedDict`: the `Dict` methods over a map ordered by key, plus range queries.

use std::collections::BTreeMap;
use std::ops::Bound;

use crate::object::args;
use crate::value::{cmp_values, Key};
use crate::{Ctx, Error, ErrorKind, Object, Step, Value};

use super::dict::{apply_map, init_store, is_read, key, may_grow, pair, restore_store, snapshot_store, Measured};

#[derive(Clone)]
pub struct SortedDict {
    store: Measured<BTreeMap<Key, Value>>,
}

impl SortedDict {
    pub fn new(a: &[Value]) -> Result<Self, Error> {
        let mut store = Measured::default();
        init_store("SortedDict", &mut store, a)?;
        Ok(SortedDict { store })
    }

    pub(crate) fn restore(state: &Value) -> Result<Self, Error> {
        let mut store = Measured::default();
        restore_store("SortedDict", &mut store, state)?;
        Ok(SortedDict { store })
    }

    fn bound(method: &str, a: &[Value], i: usize) -> Result<Option<Key>, Error> {
        match args::get(a, i) {
            Value::Nil => Ok(None),
            _ => key(method, a, i).map(Some),
        }
    }

    fn range(&self, method: &str, a: &[Value]) -> Result<Value, Error> {
        args::arity(method, a, 0, 2)?;
        let lo = Self::bound(method, a, 0)?;
        let hi = Self::bound(method, a, 1)?;
        if let (Some(l), Some(h)) = (&lo, &hi) {
            // BTreeMap::range panics on an inverted range; Python just yields nothing.
            if l >= h {
                return Ok(Value::Array(vec![]));
            }
        }
        let lo = lo.map_or(Bound::Unbounded, Bound::Included);
        let hi = hi.map_or(Bound::Unbounded, Bound::Excluded);
        Ok(Value::Array(
            self.store.range((lo, hi)).map(|(k, v)| pair(k, v)).collect(),
        ))
    }

    fn most_common(&self, method: &str, a: &[Value]) -> Result<Value, Error> {
        args::arity(method, a, 0, 1)?;
        let n = match args::get(a, 0) {
            Value::Nil => self.store.len(),
            // Like Counter.most_common, a negative count yields nothing.
            _ => usize::try_from(args::int(method, a, 0, "n")?.max(0)).unwrap_or(usize::MAX),
        };
        let mut entries: Vec<(&Key, &Value)> = self.store.iter().collect();
        // Stable sort over key-ordered entries: ties stay in key order.
        entries.sort_by(|x, y| cmp_values(y.1, x.1));
        Ok(Value::Array(
            entries.into_iter().take(n).map(|(k, v)| pair(k, v)).collect(),
        ))
    }
}

fn empty() -> Error {
    Error::new(ErrorKind::KeyError, "SortedDict is empty")
}

impl Object for SortedDict {
    fn type_name(&self) -> &'static str {
        "SortedDict"
    }

    fn is_mutating(&self, method: &str) -> bool {
        !(is_read(method) || matches!(method, "range" | "first" | "last" | "most_common"))
    }

    fn may_grow(&self, method: &str) -> bool {
        may_grow(method)
    }

    fn size(&self) -> usize {
        self.store.bytes()
    }

    fn snapshot(&self) -> Option<Value> {
        Some(snapshot_store(&self.store))
    }

    fn apply(&mut self, method: &str, a: &[Value], _ctx: &mut Ctx) -> Result<Step, Error> {
        if let Some(r) = apply_map(&mut self.store, method, a) {
            return r.map(Step::Reply);
        }
        let v = match method {
            "range" => self.range(method, a)?,
            "first" => {
                args::arity(method, a, 0, 0)?;
                let (k, v) = self.store.first_key_value().ok_or_else(empty)?;
                pair(k, v)
            }
            "last" => {
                args::arity(method, a, 0, 0)?;
                let (k, v) = self.store.last_key_value().ok_or_else(empty)?;
                pair(k, v)
            }
            "most_common" => self.most_common(method, a)?,
            _ => return Err(super::unknown_method("SortedDict", method)),
        };
        Ok(Step::Reply(v))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::objects::testing::*;

    fn filled() -> Harness {
        let mut p = Harness::new();
        p.create_ok("SortedDict", "s", vec![]);
        for (k, v) in [(5, "e"), (1, "a"), (3, "c"), (2, "b")] {
            p.ok("SortedDict", "s", "setitem", vec![k.into(), v.into()]);
        }
        p
    }

    fn keys(v: Value) -> Vec<Value> {
        match v {
            Value::Array(items) => items
                .into_iter()
                .map(|kv| match kv {
                    Value::Array(mut kv) => kv.swap_remove(0),
                    other => other,
                })
                .collect(),
            other => panic!("not an array: {other}"),
        }
    }

    #[test]
    fn ordered_by_key() {
        let mut p = filled();
        assert_eq!(
            p.ok("SortedDict", "s", "keys", vec![]),
            arr(vec![1.into(), 2.into(), 3.into(), 5.into()])
        );
        assert_eq!(
            p.ok("SortedDict", "s", "first", vec![]),
            arr(vec![1.into(), "a".into()])
        );
        assert_eq!(p.ok("SortedDict", "s", "last", vec![]), arr(vec![5.into(), "e".into()]));
        assert_eq!(
            p.ok("SortedDict", "s", "popitem", vec![]),
            arr(vec![5.into(), "e".into()])
        );
        // Mixed types order nil < number < str.
        p.ok("SortedDict", "s", "setitem", vec!["z".into(), 0.into()]);
        p.ok("SortedDict", "s", "setitem", vec![Value::Nil, 0.into()]);
        assert_eq!(
            p.ok("SortedDict", "s", "keys", vec![]),
            arr(vec![Value::Nil, 1.into(), 2.into(), 3.into(), "z".into()])
        );
    }

    #[test]
    fn range_queries() {
        let mut p = filled();
        let r = p.ok("SortedDict", "s", "range", vec![2.into(), 5.into()]);
        assert_eq!(keys(r), vec![2.into(), 3.into()]);
        let r = p.ok("SortedDict", "s", "range", vec![Value::Nil, 3.into()]);
        assert_eq!(keys(r), vec![1.into(), 2.into()]);
        let r = p.ok("SortedDict", "s", "range", vec![Value::F64(2.5), Value::Nil]);
        assert_eq!(keys(r), vec![3.into(), 5.into()]);
        assert_eq!(p.ok("SortedDict", "s", "range", vec![5.into(), 1.into()]), arr(vec![]));
        assert_eq!(p.ok("SortedDict", "s", "range", vec![3.into(), 3.into()]), arr(vec![]));
        let e = p.err("SortedDict", "s", "range", vec![Value::Map(vec![]), 3.into()]);
        assert_eq!(e.kind, ErrorKind::BadArguments);
    }

    #[test]
    fn most_common_by_value_then_key() {
        let mut p = Harness::new();
        p.create_ok("SortedDict", "s", vec![]);
        for (k, v) in [("b", 3), ("a", 3), ("c", 7), ("d", 1)] {
            p.ok("SortedDict", "s", "setitem", vec![k.into(), v.into()]);
        }
        let r = p.ok("SortedDict", "s", "most_common", vec![3.into()]);
        assert_eq!(keys(r), vec!["c".into(), "a".into(), "b".into()]);
        assert_eq!(keys(p.ok("SortedDict", "s", "most_common", vec![])).len(), 4);
        assert_eq!(p.ok("SortedDict", "s", "most_common", vec![(-1).into()]), arr(vec![]));
    }

    #[test]
    fn empty_errors_and_shared_methods() {
        let mut p = Harness::new();
        p.create_ok("SortedDict", "s", vec![]);
        assert_eq!(p.err("SortedDict", "s", "first", vec![]).kind, ErrorKind::KeyError);
        assert_eq!(p.err("SortedDict", "s", "last", vec![]).kind, ErrorKind::KeyError);
        assert_eq!(p.err("SortedDict", "s", "popitem", vec![]).kind, ErrorKind::KeyError);
        assert_eq!(
            p.ok("SortedDict", "s", "merge", vec!["k".into(), 2.into(), "sum".into()]),
            Value::from(2)
        );
        let e = p.err("SortedDict", "s", "getitem", vec!["x".into()]);
        assert_eq!((e.kind, e.data), (ErrorKind::KeyError, Value::from("x")));
        let o = SortedDict::new(&[]).unwrap();
        assert!(!o.is_mutating("range") && !o.is_mutating("most_common") && o.is_mutating("merge"));
    }
}
