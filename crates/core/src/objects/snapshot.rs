//! Snapshots: an object's complete durable state as one MessagePack value, for persistent
//! objects (recovery loads the snapshot, then replays the op-log tail through `apply`).
//!
//! [`Object::snapshot`] writes it, [`restore`] reads it back. Parked calls are never state:
//! they belong to live connections, which do not survive a restart. Types whose whole state
//! is who holds or who waits (`Lock`, `RLock`, `Semaphore`, `BoundedSemaphore`, `Event`,
//! `Condition`, `Barrier`, `CountDownLatch`, `Future`) and user-defined objects have no
//! snapshot ([`is_durable`] is false).
//!
//! # Format, version 1
//!
//! Every snapshot is a map with string keys: `"v"` (the format version, `1`) and exactly the
//! fields below, no others. A reader refuses a version it does not know and any missing,
//! extra, duplicate or ill-typed field, so adding a field means a new version.
//!
//! | type | fields |
//! |---|---|
//! | `Counter` | `value`: int (signed 64-bit) |
//! | `Value` | `value`: any |
//! | `Dict` | `items`: array of `[key, value]` pairs, in insertion order |
//! | `SortedDict` | `items`: array of `[key, value]` pairs, in key order |
//! | `List` | `items`: array |
//! | `Blob` | `data`: bin |
//! | `Array` | `dtype`: `"float64"`, `"float32"` or `"int64"`; `shape`: array of non-negative ints; `data`: bin, little-endian, C order (the wire's ndarray map) |
//! | `Queue`, `LifoQueue` | `maxsize`: int as given (0 or less: unbounded); `items`: array, oldest put first; `unfinished`: non-negative int (puts not yet marked `task_done`) |
//! | `PriorityQueue` | as `Queue`, with `items` in `get` order (equal items in put order) |
//!
//! Keys must be unique (by Python equality, `1 == 1.0`) and hashable; a queue holds at most
//! `maxsize` items when bounded. A state breaking any rule is a `ValueError` naming the type,
//! never a panic: snapshots come from disk and may be corrupt.
//!
//! Restoring keeps every order a later call can observe (dictionary order, priority ties),
//! but not internal counters: two snapshots of equal objects are equal values.

use std::fmt::Display;

use crate::value::type_of;
use crate::{Error, ErrorKind, Object, Value};

use super::{queue, Array, Blob, Counter, Dict, List, Queue, SharedValue, SortedDict, TYPES};

/// The format version written by [`Object::snapshot`].
pub const VERSION: u64 = 1;

/// Whether objects of `type_name` have a snapshot (so may be persistent).
pub fn is_durable(type_name: &str) -> bool {
    matches!(
        type_name,
        "Counter"
            | "Value"
            | "Dict"
            | "SortedDict"
            | "List"
            | "Blob"
            | "Array"
            | "Queue"
            | "LifoQueue"
            | "PriorityQueue"
    )
}

/// Rebuild an object from its [`Object::snapshot`]. The object has no parked calls.
pub fn restore(type_name: &str, state: &Value) -> Result<Box<dyn Object>, Error> {
    Ok(match type_name {
        "Counter" => Box::new(Counter::restore(state)?),
        "Value" => Box::new(SharedValue::restore(state)?),
        "Dict" => Box::new(Dict::restore(state)?),
        "SortedDict" => Box::new(SortedDict::restore(state)?),
        "List" => Box::new(List::restore(state)?),
        "Blob" => Box::new(Blob::restore(state)?),
        "Array" => Box::new(Array::restore(state)?),
        "Queue" => Box::new(Queue::restore(state, queue::Order::Fifo)?),
        "LifoQueue" => Box::new(Queue::restore(state, queue::Order::Lifo)?),
        "PriorityQueue" => Box::new(Queue::restore(state, queue::Order::Priority)?),
        t if TYPES.contains(&t) || super::user::is_user_type(t) => {
            return Err(Error::value(format!(
                "{t} is not durable: it has no snapshot to restore"
            )))
        }
        t => {
            return Err(Error::new(
                ErrorKind::UnknownType,
                format!("unknown object type '{t}' (known: {})", TYPES.join(", ")),
            ))
        }
    })
}

/// Build a version-1 snapshot from its fields.
pub(crate) fn encode(fields: Vec<(&str, Value)>) -> Value {
    let mut map = Vec::with_capacity(fields.len() + 1);
    map.push((Value::from("v"), Value::from(VERSION)));
    map.extend(fields.into_iter().map(|(k, v)| (Value::from(k), v)));
    Value::Map(map)
}

/// The error for a state that is not a valid snapshot of `type_name`.
pub(crate) fn corrupt(type_name: &str, why: impl Display) -> Error {
    Error::value(format!("corrupt {type_name} snapshot: {why}"))
}

/// The fields of a version-1 snapshot, checked for shape (not yet for content).
pub(crate) struct Fields<'v> {
    type_name: &'static str,
    fields: Vec<(&'v str, &'v Value)>,
}

impl<'v> Fields<'v> {
    /// Open `state` as a version-1 snapshot with exactly the fields `names` (besides `v`).
    pub fn open(type_name: &'static str, state: &'v Value, names: &[&str]) -> Result<Self, Error> {
        Self::open_with(type_name, state, names, &[])
    }

    /// [`open`](Self::open), allowing the fields `optional` too (read them with
    /// [`find`](Self::find)).
    pub fn open_with(
        type_name: &'static str,
        state: &'v Value,
        names: &[&str],
        optional: &[&str],
    ) -> Result<Self, Error> {
        let Value::Map(map) = state else {
            return Err(corrupt(type_name, format!("expected a map, not {}", type_of(state))));
        };
        let mut fields: Vec<(&str, &Value)> = Vec::with_capacity(map.len());
        for (k, v) in map {
            let name = k
                .as_str()
                .ok_or_else(|| corrupt(type_name, format!("field names must be strings, not {}", type_of(k))))?;
            if name != "v" && !names.contains(&name) && !optional.contains(&name) {
                return Err(corrupt(type_name, format!("unexpected field '{name}'")));
            }
            if fields.iter().any(|(n, _)| *n == name) {
                return Err(corrupt(type_name, format!("duplicate field '{name}'")));
            }
            fields.push((name, v));
        }
        let f = Fields { type_name, fields };
        match f.find("v").map(|v| v.as_u64()) {
            Some(Some(VERSION)) => {}
            Some(_) => {
                return Err(corrupt(
                    type_name,
                    format!("unsupported version {} (this server reads {VERSION})", f.get("v")?),
                ))
            }
            None => return Err(corrupt(type_name, "no version field 'v'")),
        }
        for name in names {
            f.get(name)?;
        }
        Ok(f)
    }

    pub fn find(&self, name: &str) -> Option<&'v Value> {
        self.fields.iter().find(|(n, _)| *n == name).map(|(_, v)| *v)
    }

    /// A field (present: [`Fields::open`] checked).
    pub fn get(&self, name: &str) -> Result<&'v Value, Error> {
        self.find(name)
            .ok_or_else(|| corrupt(self.type_name, format!("missing field '{name}'")))
    }

    fn wrong(&self, name: &str, want: &str, got: &Value) -> Error {
        corrupt(self.type_name, format!("'{name}' must be {want}, not {}", type_of(got)))
    }

    pub fn i64(&self, name: &str) -> Result<i64, Error> {
        match self.get(name)? {
            Value::Integer(n) => n.as_i64().ok_or_else(|| {
                corrupt(
                    self.type_name,
                    format!("'{name}' does not fit in a signed 64-bit integer"),
                )
            }),
            other => Err(self.wrong(name, "an integer", other)),
        }
    }

    pub fn u64(&self, name: &str) -> Result<u64, Error> {
        match self.get(name)? {
            Value::Integer(n) => n
                .as_u64()
                .ok_or_else(|| corrupt(self.type_name, format!("'{name}' must be non-negative, not {n}"))),
            other => Err(self.wrong(name, "an integer", other)),
        }
    }

    pub fn array(&self, name: &str) -> Result<&'v [Value], Error> {
        match self.get(name)? {
            Value::Array(items) => Ok(items),
            other => Err(self.wrong(name, "an array", other)),
        }
    }

    pub fn bytes(&self, name: &str) -> Result<&'v [u8], Error> {
        match self.get(name)? {
            Value::Binary(b) => Ok(b),
            other => Err(self.wrong(name, "bytes", other)),
        }
    }

    /// Re-label an error of a shared argument parser as corruption of this type (dropping
    /// its `method(): ` prefix, which names no method here).
    pub fn wrap(&self, e: Error) -> Error {
        let why = match e.message.split_once("(): ") {
            Some((method, rest)) if !method.contains(' ') => rest,
            _ => &e.message,
        };
        corrupt(self.type_name, why)
    }

    pub fn corrupt(&self, why: impl Display) -> Error {
        corrupt(self.type_name, why)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::objects::create;
    use crate::objects::testing::*;

    /// One of `xs` (built before the choice, so it may draw from `r` too).
    fn one_of(mut xs: Vec<Value>, r: &mut Rng) -> Value {
        let i = r.below(xs.len());
        xs.swap_remove(i)
    }

    fn tuple(items: Vec<Value>) -> Value {
        let mut body = Vec::new();
        rmpv::encode::write_value(&mut body, &Value::Array(items)).unwrap();
        Value::Ext(crate::value::EXT_TUPLE, body)
    }

    /// Keys that collide under Python equality (1, 1.0, true), mixed types, tuples, arrays.
    fn key(r: &mut Rng) -> Value {
        match r.below(9) {
            0 => Value::from(r.int(-2, 4)),
            1 => Value::F64(r.int(-1, 3) as f64),
            2 => Value::F64(r.int(0, 5) as f64 + 0.5),
            3 => Value::Boolean(r.below(2) == 0),
            4 => Value::from(["a", "b", "c", "dd"][r.below(4)]),
            5 => Value::Nil,
            6 => tuple(vec![Value::from(r.int(0, 2)), Value::from("t")]),
            7 => arr(vec![Value::from(r.int(0, 2))]),
            _ => Value::Binary(vec![r.below(3) as u8]),
        }
    }

    fn value(r: &mut Rng) -> Value {
        match r.below(6) {
            0 => Value::Map(vec![(Value::from("k"), key(r))]),
            1 => arr(vec![key(r), key(r)]),
            2 => Value::from(r.int(-100, 100)),
            _ => key(r),
        }
    }

    fn nd(dtype: &str, shape: &[u64], data: Vec<u8>) -> Value {
        Value::Map(vec![
            ("dtype".into(), dtype.into()),
            ("shape".into(), arr(shape.iter().map(|&n| Value::from(n)).collect())),
            ("data".into(), Value::Binary(data)),
        ])
    }

    /// Constructor arguments for a durable type.
    fn ctor(t: &str, r: &mut Rng) -> Vec<Value> {
        match t {
            "Array" => {
                let shape = r.pick(&[arr(vec![]), arr(vec![3.into()]), arr(vec![2.into(), 2.into()])]);
                vec![shape, r.pick(&["float64", "float32", "int64"]).into()]
            }
            "Queue" | "LifoQueue" | "PriorityQueue" => vec![r.int(-1, 4).into()],
            "Dict" | "SortedDict" => vec![arr((0..r.below(4)).map(|_| arr(vec![key(r), value(r)])).collect())],
            "List" => vec![arr((0..r.below(4)).map(|_| value(r)).collect())],
            _ => vec![],
        }
    }

    /// A random call of a durable type: none ever parks (non-blocking queue calls).
    fn op(t: &str, r: &mut Rng) -> (&'static str, Vec<Value>) {
        let small = |r: &mut Rng| Value::from(r.int(-5, 5));
        match t {
            "Counter" => match r.below(8) {
                0 => ("get", vec![]),
                1 => ("set", vec![small(r)]),
                2 => (
                    "add",
                    vec![r.pick(&[Value::from(3), Value::from(-2), Value::from(i64::MAX)])],
                ),
                3 => ("get_and_add", vec![small(r)]),
                4 => ("increment", vec![]),
                5 => ("decrement", vec![]),
                6 => ("compare_and_set", vec![small(r), small(r)]),
                _ => ("add", vec!["x".into()]),
            },
            "Value" => match r.below(4) {
                0 => ("get", vec![]),
                1 => ("set", vec![value(r)]),
                2 => ("get_and_set", vec![value(r)]),
                _ => ("compare_and_set", vec![key(r), value(r)]),
            },
            "Dict" | "SortedDict" => {
                let ops = ["sum", "min", "max", "append", "union", "replace"];
                let n = if t == "SortedDict" { 18 } else { 14 };
                match r.below(n) {
                    0..=2 => ("setitem", vec![key(r), value(r)]),
                    3 => ("delitem", vec![key(r)]),
                    4 => ("pop", vec![key(r), Value::Nil]),
                    5 => ("popitem", vec![]),
                    6 => ("setdefault", vec![key(r), value(r)]),
                    7 => (
                        "update",
                        vec![arr(vec![arr(vec![key(r), value(r)]), arr(vec![key(r), value(r)])])],
                    ),
                    8 => (
                        "merge",
                        vec![
                            key(r),
                            one_of(vec![small(r), arr(vec![key(r)])], r),
                            r.pick(&ops).into(),
                        ],
                    ),
                    9 => (
                        "merge_many",
                        vec![
                            arr(vec![arr(vec![key(r), small(r)]), arr(vec![key(r), small(r)])]),
                            r.pick(&ops).into(),
                        ],
                    ),
                    10 => ("items", vec![]),
                    11 => ("get", vec![key(r)]),
                    12 => (if r.below(8) == 0 { "clear" } else { "len" }, vec![]),
                    13 => ("popitem", vec![]),
                    14 => (
                        "range",
                        vec![one_of(vec![Value::Nil, key(r)], r), one_of(vec![Value::Nil, key(r)], r)],
                    ),
                    15 => ("first", vec![]),
                    16 => ("last", vec![]),
                    _ => ("most_common", vec![r.pick(&[Value::Nil, Value::from(2)])]),
                }
            }
            "List" => match r.below(15) {
                0 | 1 => ("append", vec![value(r)]),
                2 => ("extend", vec![arr(vec![key(r), key(r)])]),
                3 => ("insert", vec![small(r), value(r)]),
                4 => ("pop", vec![one_of(vec![Value::Nil, small(r)], r)]),
                5 => ("remove", vec![key(r)]),
                6 => ("sort", vec![r.pick(&[Value::Nil, Value::Boolean(true)])]),
                7 => ("reverse", vec![]),
                8 => ("setslice", vec![small(r), small(r), Value::Nil, arr(vec![key(r)])]),
                9 => (
                    "delslice",
                    vec![small(r), small(r), r.pick(&[Value::Nil, Value::from(2)])],
                ),
                10 => (
                    "getslice",
                    vec![small(r), Value::Nil, r.pick(&[Value::Nil, Value::from(-1)])],
                ),
                11 => ("index", vec![key(r)]),
                12 => ("count", vec![key(r)]),
                13 => ("setitem", vec![small(r), value(r)]),
                _ => ("items", vec![]),
            },
            "Blob" => match r.below(5) {
                0 => ("set", vec![Value::Binary(vec![r.below(256) as u8; r.below(4)])]),
                1 | 2 => ("append", vec![Value::Binary(vec![r.below(256) as u8; r.below(4)])]),
                3 => ("read", vec![r.int(0, 4).into(), r.int(0, 4).into()]),
                _ => ("get", vec![]),
            },
            "Array" => {
                let scalar = |r: &mut Rng| {
                    one_of(
                        vec![Value::from(r.int(-3, 3)), Value::F64(0.5), Value::F64(f64::NAN)],
                        r,
                    )
                };
                match r.below(6) {
                    0 => ("add", vec![scalar(r)]),
                    1 => ("scale", vec![scalar(r)]),
                    2 => ("fill", vec![scalar(r)]),
                    3 => {
                        let x = r.int(-9, 9) as f64 / 4.0;
                        let data = [x, -x, 1e300, f64::NAN].iter().flat_map(|x| x.to_le_bytes()).collect();
                        ("add", vec![nd("float64", &[2, 2], data)])
                    }
                    4 => (
                        "set",
                        vec![nd(
                            "int64",
                            &[3],
                            [1i64, -2, 3].iter().flat_map(|x| x.to_le_bytes()).collect(),
                        )],
                    ),
                    _ => ("get", vec![]),
                }
            }
            "Queue" | "LifoQueue" | "PriorityQueue" => match r.below(8) {
                0..=2 => ("put", vec![value(r), false.into()]),
                3 | 4 => ("get", vec![false.into()]),
                5 => ("task_done", vec![]),
                6 => ("join", vec![0.into()]),
                _ => (r.pick(&["qsize", "empty", "full", "maxsize"]), vec![]),
            },
            _ => unreachable!("{t} is not durable"),
        }
    }

    const DURABLE: [&str; 10] = [
        "Counter",
        "Value",
        "Dict",
        "SortedDict",
        "List",
        "Blob",
        "Array",
        "Queue",
        "LifoQueue",
        "PriorityQueue",
    ];

    /// Through bytes, as a snapshot would go to disk and back.
    fn via_bytes(v: &Value) -> Value {
        let mut buf = Vec::new();
        rmpv::encode::write_value(&mut buf, v).unwrap();
        rmpv::decode::read_value(&mut buf.as_slice()).unwrap()
    }

    /// Snapshot `a`, restore it as `b`, then check both answer a further sequence alike.
    fn check_round_trip(t: &str, a: &mut Solo, r: &mut Rng, more: usize) {
        let snap = a.obj.snapshot().unwrap_or_else(|| panic!("{t} has no snapshot"));
        let restored = restore(t, &via_bytes(&snap)).unwrap_or_else(|e| panic!("{t}: {e} in {snap}"));
        assert_eq!(restored.type_name(), t);
        let mut b = Solo::new(restored);
        assert_eq!(
            b.obj.snapshot().as_ref(),
            Some(&snap),
            "{t}: snapshot of the restored object"
        );
        // Same token numbers on both sides.
        let mut a2 = Solo::new(std::mem::replace(&mut a.obj, Box::new(SharedValue::new(&[]).unwrap())));
        for _ in 0..more {
            let (method, args) = op(t, r);
            let (x, y) = (a2.call(1, method, &args), b.call(1, method, &args));
            assert_eq!(x, y, "{t}.{method}{args:?} after restoring {snap}");
        }
        assert_eq!(a2.obj.snapshot(), b.obj.snapshot(), "{t}");
        a.obj = a2.obj;
    }

    #[test]
    fn random_round_trips_behave_identically() {
        let mut r = Rng(0x9e37_79b9_7f4a_7c15);
        for t in DURABLE {
            for _ in 0..40 {
                let args = ctor(t, &mut r);
                let mut a = Solo::new(create(t, &args).unwrap_or_else(|e| panic!("{t}{args:?}: {e}")));
                // Snapshot at a few points along one history, continuing from the original.
                for _ in 0..4 {
                    for _ in 0..r.below(40) {
                        let (method, args) = op(t, &mut r);
                        a.call(1, method, &args);
                    }
                    check_round_trip(t, &mut a, &mut r, 30);
                }
            }
        }
    }

    #[test]
    fn durability_matches_snapshots() {
        for t in crate::objects::TYPES {
            let args = match *t {
                "Array" => vec![3.into()],
                "Condition" => vec!["Lock".into(), "l".into()],
                "Barrier" | "CountDownLatch" => vec![2.into()],
                _ => vec![],
            };
            let o = create(t, &args).unwrap();
            assert_eq!(is_durable(t), o.snapshot().is_some(), "{t}");
            assert_eq!(is_durable(t), DURABLE.contains(t), "{t}");
            if !is_durable(t) {
                let e = restore(t, &encode(vec![])).err().expect("not durable");
                assert_eq!(e.kind, ErrorKind::ValueError, "{t}");
                assert!(e.message.contains("not durable"), "{}", e.message);
            }
        }
        assert!(!is_durable("py:__main__.Centroids"));
        let e = restore("py:__main__.Centroids", &encode(vec![])).err().unwrap();
        assert!(e.message.contains("not durable"), "{}", e.message);
        assert_eq!(
            restore("Widget", &encode(vec![])).err().unwrap().kind,
            ErrorKind::UnknownType
        );
    }

    #[test]
    fn format_is_documented_shape() {
        let mut c = Solo::new(create("Counter", &[5.into()]).unwrap());
        c.ok("add", &[2.into()]);
        assert_eq!(
            c.obj.snapshot().unwrap(),
            Value::Map(vec![("v".into(), 1.into()), ("value".into(), 7.into())])
        );
        let mut q = Solo::new(create("Queue", &[3.into()]).unwrap());
        q.ok("put", &["a".into()]);
        q.ok("put", &["b".into()]);
        q.ok("get", &[]);
        assert_eq!(
            q.obj.snapshot().unwrap(),
            Value::Map(vec![
                ("v".into(), 1.into()),
                ("maxsize".into(), 3.into()),
                ("items".into(), arr(vec!["b".into()])),
                ("unfinished".into(), 2.into()),
            ])
        );
        let a = Solo::new(create("Array", &[arr(vec![1.into(), 2.into()]), "int64".into()]).unwrap());
        assert_eq!(
            a.obj.snapshot().unwrap(),
            Value::Map(vec![
                ("v".into(), 1.into()),
                ("dtype".into(), "int64".into()),
                ("shape".into(), arr(vec![1.into(), 2.into()])),
                ("data".into(), Value::Binary(vec![0; 16])),
            ])
        );
    }

    fn restored(t: &str, o: &Solo) -> Solo {
        Solo::new(restore(t, &via_bytes(&o.obj.snapshot().unwrap())).unwrap())
    }

    #[test]
    fn dict_keeps_insertion_order() {
        let mut d = Solo::new(create("Dict", &[]).unwrap());
        for k in ["b", "a", "c", "d"] {
            d.ok("setitem", &[k.into(), 0.into()]);
        }
        d.ok("delitem", &["b".into()]);
        d.ok("setitem", &["b".into(), 1.into()]);
        d.ok("setitem", &["a".into(), 2.into()]);
        let mut e = restored("Dict", &d);
        let want = arr(vec!["a".into(), "c".into(), "d".into(), "b".into()]);
        assert_eq!(e.ok("keys", &[]), want);
        // New keys go after the restored ones; popitem takes the newest.
        e.ok("setitem", &["z".into(), 3.into()]);
        assert_eq!(e.ok("popitem", &[]), arr(vec!["z".into(), 3.into()]));
        assert_eq!(e.ok("popitem", &[]), arr(vec!["b".into(), 1.into()]));
    }

    #[test]
    fn sorted_dict_keeps_key_order() {
        let mut d = Solo::new(create("SortedDict", &[]).unwrap());
        for k in [
            Value::from("z"),
            3.into(),
            Value::Nil,
            Value::F64(1.5),
            Value::Binary(vec![1]),
        ] {
            d.ok("setitem", &[k, 0.into()]);
        }
        let mut e = restored("SortedDict", &d);
        let want = arr(vec![
            Value::Nil,
            Value::F64(1.5),
            3.into(),
            "z".into(),
            Value::Binary(vec![1]),
        ]);
        assert_eq!(e.ok("keys", &[]), want);
        assert_eq!(e.ok("first", &[]), arr(vec![Value::Nil, 0.into()]));
        // Out-of-order items in a hand-written snapshot are sorted on restore.
        let s = encode(vec![(
            "items",
            arr(vec![arr(vec![2.into(), "b".into()]), arr(vec![1.into(), "a".into()])]),
        )]);
        let mut f = Solo::new(restore("SortedDict", &s).unwrap());
        assert_eq!(f.ok("keys", &[]), arr(vec![1.into(), 2.into()]));
    }

    #[test]
    fn priority_ties_stay_fifo_across_restore() {
        let mut q = Solo::new(create("PriorityQueue", &[]).unwrap());
        let items = [
            arr(vec![2.into(), "a".into()]),
            arr(vec![1.into(), "b".into()]),
            arr(vec![Value::F64(1.0), "b".into()]),
            arr(vec![Value::Boolean(true), "b".into()]),
            arr(vec![1.into(), "a".into()]),
        ];
        for it in &items {
            q.ok("put", std::slice::from_ref(it));
        }
        q.ok("get", &[]); // [1, "a"]
        let mut e = restored("PriorityQueue", &q);
        // An equal item put after the restore comes out after the restored ones.
        let late = arr(vec![Value::F64(1.0), "b".into()]);
        e.ok("put", std::slice::from_ref(&late));
        let got: Vec<Value> = (0..5).map(|_| e.ok("get", &[])).collect();
        assert_eq!(
            got,
            vec![
                items[1].clone(),
                items[2].clone(),
                items[3].clone(),
                late,
                items[0].clone()
            ]
        );
        let mut l = Solo::new(create("LifoQueue", &[]).unwrap());
        for v in 1..=3 {
            l.ok("put", &[v.into()]);
        }
        let mut m = restored("LifoQueue", &l);
        assert_eq!(m.ok("get", &[]), Value::from(3));
    }

    #[test]
    fn parked_calls_are_not_state() {
        let mut q = Solo::new(create("Queue", &[1.into()]).unwrap());
        q.ok("put", &["in".into()]);
        // A parked put (full queue), a parked join: neither is in the snapshot.
        assert!(q.call(2, "put", &["parked".into()]).is_empty());
        assert!(q.call(3, "join", &[]).is_empty());
        assert!(q.obj.has_waiters());
        let snap = q.obj.snapshot().unwrap();
        let mut e = restored("Queue", &q);
        assert!(!e.obj.has_waiters());
        assert_eq!(e.ok("get", &[]), Value::from("in"));
        assert_eq!(
            e.call(1, "get", &[false.into()])[0].reply.as_ref().unwrap_err().kind,
            ErrorKind::Empty
        );
        assert_eq!(e.ok("task_done", &[]), Value::Nil);
        assert_eq!(e.ok("join", &[0.into()]), Value::Boolean(true));
        // A parked getter takes no item from the snapshot either.
        let mut g = Solo::new(create("Queue", &[]).unwrap());
        assert!(g.call(2, "get", &[]).is_empty());
        assert_eq!(restored("Queue", &g).ok("qsize", &[]), Value::from(0));
        assert!(snap.to_string().contains("\"in\"") && !snap.to_string().contains("parked"));
    }

    #[test]
    fn special_values_survive() {
        let nan = f64::from_bits(0x7ff8_0000_dead_beef);
        let mut a = Solo::new(create("Array", &[2.into()]).unwrap());
        a.ok(
            "set",
            &[nd(
                "float64",
                &[2],
                [nan, -0.0].iter().flat_map(|x| x.to_le_bytes()).collect(),
            )],
        );
        let mut b = restored("Array", &a);
        assert_eq!(b.ok("get", &[]), a.ok("get", &[]));
        let mut c = Solo::new(create("Counter", &[i64::MIN.into()]).unwrap());
        assert_eq!(restored("Counter", &c).ok("get", &[]), c.ok("get", &[]));
        let weird = Value::Map(vec![(Value::Ext(7, vec![1, 2]), tuple(vec![Value::F32(0.5)]))]);
        let v = Solo::new(create("Value", std::slice::from_ref(&weird)).unwrap());
        assert_eq!(restored("Value", &v).ok("get", &[]), weird);
        let mut q = Solo::new(create("Queue", &[(-3).into()]).unwrap());
        q.ok("put", &[1.into()]);
        q.ok("put", &[2.into()]);
        q.ok("task_done", &[]);
        let mut q2 = restored("Queue", &q);
        assert_eq!(q2.ok("maxsize", &[]), Value::from(-3));
        assert_eq!(q2.ok("full", &[]), Value::Boolean(false));
        assert_eq!(q2.ok("qsize", &[]), Value::from(2));
        assert_eq!(q2.ok("task_done", &[]), Value::Nil);
        assert_eq!(
            q2.call(1, "task_done", &[])[0].reply.as_ref().unwrap_err().kind,
            ErrorKind::ValueError
        );
    }

    #[test]
    fn malformed_states_are_errors() {
        let e = |fields: Vec<(&str, Value)>| encode(fields);
        let pairs = |ps: Vec<(Value, Value)>| arr(ps.into_iter().map(|(k, v)| arr(vec![k, v])).collect());
        let array =
            |dtype: Value, shape: Value, data: Value| e(vec![("dtype", dtype), ("shape", shape), ("data", data)]);
        let queue = |maxsize: Value, items: Value, unfinished: Value| {
            e(vec![("maxsize", maxsize), ("items", items), ("unfinished", unfinished)])
        };
        let f64s = |n: usize| Value::Binary(vec![0; 8 * n]);
        let cases: Vec<(&str, Value, &str)> = vec![
            ("Counter", Value::Nil, "expected a map"),
            ("Counter", arr(vec![1.into()]), "expected a map"),
            ("Counter", Value::Map(vec![("value".into(), 1.into())]), "no version"),
            (
                "Counter",
                Value::Map(vec![("v".into(), 2.into()), ("value".into(), 1.into())]),
                "unsupported version 2",
            ),
            (
                "Counter",
                Value::Map(vec![("v".into(), "1".into()), ("value".into(), 1.into())]),
                "unsupported version",
            ),
            (
                "Counter",
                Value::Map(vec![("v".into(), (-1).into()), ("value".into(), 1.into())]),
                "unsupported version",
            ),
            ("Counter", e(vec![]), "missing field 'value'"),
            (
                "Counter",
                e(vec![("value", 1.into()), ("extra", 1.into())]),
                "unexpected field 'extra'",
            ),
            (
                "Counter",
                e(vec![("value", 1.into()), ("value", 2.into())]),
                "duplicate field 'value'",
            ),
            (
                "Counter",
                Value::Map(vec![("v".into(), 1.into()), (1.into(), 1.into())]),
                "field names must be strings",
            ),
            (
                "Counter",
                e(vec![("value", "1".into())]),
                "'value' must be an integer, not str",
            ),
            ("Counter", e(vec![("value", Value::F64(1.0))]), "must be an integer"),
            ("Counter", e(vec![("value", u64::MAX.into())]), "does not fit"),
            ("Value", e(vec![]), "missing field 'value'"),
            ("Blob", e(vec![("data", "abc".into())]), "'data' must be bytes"),
            (
                "List",
                e(vec![("items", Value::Map(vec![]))]),
                "'items' must be an array, not map",
            ),
            ("Dict", e(vec![("items", 1.into())]), "expected a map or an array"),
            (
                "Dict",
                e(vec![("items", arr(vec![arr(vec![1.into()])]))]),
                "element #0 is not a [key, value] pair",
            ),
            (
                "Dict",
                e(vec![("items", pairs(vec![(Value::Map(vec![]), 1.into())]))]),
                "unhashable",
            ),
            (
                "Dict",
                e(vec![(
                    "items",
                    pairs(vec![(1.into(), 1.into()), (Value::F64(1.0), 2.into())]),
                )]),
                "duplicate keys",
            ),
            (
                "SortedDict",
                e(vec![(
                    "items",
                    pairs(vec![("a".into(), 1.into()), ("a".into(), 2.into())]),
                )]),
                "duplicate keys",
            ),
            (
                "Array",
                array("int8".into(), arr(vec![1.into()]), f64s(1)),
                "unsupported dtype 'int8'",
            ),
            (
                "Array",
                array(8.into(), arr(vec![1.into()]), f64s(1)),
                "'dtype' must be a str",
            ),
            (
                "Array",
                array("float64".into(), arr(vec![(-1).into()]), f64s(0)),
                "negative dimensions",
            ),
            (
                "Array",
                array("float64".into(), arr(vec!["2".into()]), f64s(2)),
                "must be integers",
            ),
            (
                "Array",
                array("float64".into(), arr(vec![2.into(), 3.into()]), f64s(5)),
                "data holds 40 bytes",
            ),
            (
                "Array",
                array("float64".into(), arr(vec![2.into()]), Value::Binary(vec![0; 15])),
                "needs 16",
            ),
            (
                "Array",
                array("float32".into(), arr(vec![2.into()]), f64s(2)),
                "needs 8",
            ),
            (
                "Array",
                array("int64".into(), arr(vec![(1u64 << 40).into()]), f64s(0)),
                "too big",
            ),
            (
                "Array",
                array("int64".into(), arr(vec![1.into()]), arr(vec![])),
                "expected an ndarray map",
            ),
            (
                "Array",
                e(vec![("dtype", "int64".into()), ("shape", arr(vec![]))]),
                "missing field 'data'",
            ),
            (
                "Queue",
                queue(0.into(), arr(vec![]), (-1).into()),
                "'unfinished' must be non-negative",
            ),
            (
                "Queue",
                queue(0.into(), arr(vec![]), Value::Nil),
                "'unfinished' must be an integer",
            ),
            (
                "LifoQueue",
                queue(Value::F64(2.0), arr(vec![]), 0.into()),
                "'maxsize' must be an integer",
            ),
            (
                "PriorityQueue",
                queue(0.into(), 5.into(), 0.into()),
                "'items' must be an array",
            ),
            (
                "Queue",
                queue(1.into(), arr(vec![1.into(), 2.into()]), 2.into()),
                "2 items in a queue of maxsize 1",
            ),
        ];
        for (t, state, want) in cases {
            let err = restore(t, &state)
                .err()
                .unwrap_or_else(|| panic!("{t} accepted {state}"));
            assert_eq!(err.kind, ErrorKind::ValueError, "{t} {state}: {err}");
            let prefix = format!("corrupt {t} snapshot: ");
            assert!(
                err.message.starts_with(&prefix) && err.message.contains(want),
                "{t} {state}: '{}' should contain '{want}'",
                err.message
            );
        }
        // Unbounded queues take any number of items.
        assert!(restore("Queue", &queue((-1).into(), arr(vec![1.into(), 2.into()]), 0.into())).is_ok());
    }

    /// Damage valid snapshots at random (in bytes and in structure): restore must never panic.
    #[test]
    fn damaged_snapshots_never_panic() {
        let mut r = Rng(0x2545_f491_4f6c_dd1d);
        let junk = [
            Value::Nil,
            (-1).into(),
            u64::MAX.into(),
            Value::F64(f64::NAN),
            "x".into(),
            Value::Binary(vec![0; 3]),
            arr(vec![]),
            arr(vec![1.into()]),
            Value::Map(vec![]),
            Value::Ext(3, vec![0xc1]),
        ];
        for t in DURABLE {
            for _ in 0..60 {
                let mut a = Solo::new(create(t, &ctor(t, &mut r)).unwrap());
                for _ in 0..r.below(20) {
                    let (method, args) = op(t, &mut r);
                    a.call(1, method, &args);
                }
                let snap = a.obj.snapshot().unwrap();
                // Structural damage: replace one field's value, or one element inside it.
                let Value::Map(mut fields) = snap.clone() else {
                    unreachable!()
                };
                let i = r.below(fields.len());
                match &mut fields[i].1 {
                    Value::Array(items) if !items.is_empty() && r.below(2) == 0 => {
                        let j = r.below(items.len());
                        items[j] = r.pick(&junk);
                    }
                    v => *v = r.pick(&junk),
                }
                let _ = restore(t, &Value::Map(fields));
                // Byte damage: truncate or flip a byte, then decode whatever is left.
                let mut buf = Vec::new();
                rmpv::encode::write_value(&mut buf, &snap).unwrap();
                if r.below(2) == 0 {
                    buf.truncate(r.below(buf.len()));
                } else {
                    let j = r.below(buf.len());
                    buf[j] ^= 1 << r.below(8);
                }
                if let Ok(v) = rmpv::decode::read_value(&mut buf.as_slice()) {
                    let _ = restore(t, &v);
                }
            }
        }
    }
}
