//! MessagePack values as keys and as ordered items.
//!
//! Python compares `True == 1 == 1.0` and orders tuples lexicographically; dictionary keys
//! and priority-queue items follow the same rules here, with a total order across types
//! (nil < number (bools included) < str < bytes < array < map < ext) where Python would raise.

use std::cmp::Ordering;
use std::hash::{Hash, Hasher};

use crate::{Error, Value};

/// A short name of a value's type for error messages.
pub fn type_of(v: &Value) -> &'static str {
    match v {
        Value::Nil => "None",
        Value::Boolean(_) => "bool",
        Value::Integer(_) => "int",
        Value::F32(_) | Value::F64(_) => "float",
        Value::String(_) => "str",
        Value::Binary(_) => "bytes",
        Value::Array(_) => "array",
        Value::Map(_) => "map",
        Value::Ext(EXT_TUPLE, _) => "tuple",
        Value::Ext(..) => "ext",
    }
}

/// About how many bytes `v` takes in memory: its nodes and the bytes they own. Walks the
/// value (without recursion: a value may nest deep).
pub fn approx_size(v: &Value) -> usize {
    let own = |v: &Value| {
        std::mem::size_of::<Value>()
            + match v {
                Value::String(s) => s.as_bytes().len(),
                Value::Binary(b) | Value::Ext(_, b) => b.len(),
                _ => 0,
            }
    };
    if !matches!(v, Value::Array(_) | Value::Map(_)) {
        return own(v); // most values measured (a call's reply) are scalars: no stack
    }
    let mut size = 0;
    let mut stack = vec![v];
    while let Some(v) = stack.pop() {
        size += own(v);
        match v {
            Value::Array(items) => stack.extend(items),
            Value::Map(pairs) => stack.extend(pairs.iter().flat_map(|(k, v)| [k, v])),
            _ => {}
        }
    }
    size
}

/// The ext type of a tuple: its body is the MessagePack array of its items. Tuples compare
/// and hash by their items, like arrays, but a tuple never equals an array (as in Python).
pub const EXT_TUPLE: i8 = 3;

/// The items of a tuple value, if `v` is one (a malformed body is left opaque).
pub fn tuple_items(v: &Value) -> Option<Vec<Value>> {
    match v {
        Value::Ext(EXT_TUPLE, body) => match rmpv::decode::read_value(&mut body.as_slice()) {
            Ok(Value::Array(items)) => Some(items),
            _ => None,
        },
        _ => None,
    }
}

fn rank(v: &Value) -> u8 {
    match v {
        Value::Nil => 0,
        // bool is a number, as in Python: True == 1.
        Value::Boolean(_) | Value::Integer(_) | Value::F32(_) | Value::F64(_) => 2,
        Value::String(_) => 3,
        Value::Binary(_) => 4,
        Value::Array(_) => 5,
        Value::Ext(EXT_TUPLE, _) if tuple_items(v).is_some() => 6,
        Value::Map(_) => 7,
        Value::Ext(..) => 8,
    }
}

enum Num {
    Int(i128),
    Float(f64),
}

fn num(v: &Value) -> Num {
    match v {
        Value::Boolean(b) => Num::Int(i128::from(*b)),
        Value::Integer(n) => Num::Int(
            n.as_i64()
                .map(i128::from)
                .unwrap_or_else(|| n.as_u64().unwrap_or(0) as i128),
        ),
        Value::F32(x) => Num::Float(*x as f64),
        Value::F64(x) => Num::Float(*x),
        _ => unreachable!("num() of a non-number"),
    }
}

fn cmp_num(a: &Value, b: &Value) -> Ordering {
    match (num(a), num(b)) {
        (Num::Int(x), Num::Int(y)) => x.cmp(&y),
        (Num::Float(x), Num::Float(y)) => x.total_cmp(&y),
        (Num::Int(x), Num::Float(y)) => cmp_int_float(x, y),
        (Num::Float(x), Num::Int(y)) => cmp_int_float(y, x).reverse(),
    }
}

fn cmp_int_float(i: i128, f: f64) -> Ordering {
    if f.is_nan() {
        return Ordering::Less;
    }
    let fi = i as f64;
    match fi.partial_cmp(&f).unwrap_or(Ordering::Equal) {
        // Equal as floats: break the tie exactly when f is integral.
        Ordering::Equal if f.fract() == 0.0 && f.abs() < 1.7e38 => i.cmp(&(f as i128)),
        o => o,
    }
}

/// The total order used for sorted keys and priority-queue items.
pub fn cmp_values(a: &Value, b: &Value) -> Ordering {
    let (ra, rb) = (rank(a), rank(b));
    if ra != rb {
        return ra.cmp(&rb);
    }
    match (a, b) {
        (Value::Nil, Value::Nil) => Ordering::Equal,
        (Value::String(x), Value::String(y)) => x.as_bytes().cmp(y.as_bytes()),
        (Value::Binary(x), Value::Binary(y)) => x.cmp(y),
        (Value::Array(x), Value::Array(y)) => cmp_seq(x.iter(), y.iter()),
        (Value::Map(x), Value::Map(y)) => {
            let flat = |m: &Vec<(Value, Value)>| m.iter().flat_map(|(k, v)| [k.clone(), v.clone()]).collect::<Vec<_>>();
            cmp_seq(flat(x).iter(), flat(y).iter())
        }
        (Value::Ext(tx, x), Value::Ext(ty, y)) => match (tuple_items(a), tuple_items(b)) {
            (Some(x), Some(y)) => cmp_seq(x.iter(), y.iter()),
            _ => tx.cmp(ty).then_with(|| x.cmp(y)),
        },
        _ => cmp_num(a, b),
    }
}

fn cmp_seq<'a>(mut x: impl Iterator<Item = &'a Value>, mut y: impl Iterator<Item = &'a Value>) -> Ordering {
    loop {
        match (x.next(), y.next()) {
            (None, None) => return Ordering::Equal,
            (None, Some(_)) => return Ordering::Less,
            (Some(_), None) => return Ordering::Greater,
            (Some(a), Some(b)) => match cmp_values(a, b) {
                Ordering::Equal => continue,
                o => return o,
            },
        }
    }
}

/// Value equality with Python's numeric rules (`True == 1 == 1.0`).
pub fn eq_values(a: &Value, b: &Value) -> bool {
    cmp_values(a, b) == Ordering::Equal
}

/// A value usable as a dictionary key: anything but a map (Python's "unhashable type").
#[derive(Clone, Debug)]
pub struct Key(Value);

impl Key {
    pub fn new(v: Value) -> Result<Key, Error> {
        check_hashable(&v)?;
        Ok(Key(v))
    }

    pub fn value(&self) -> &Value {
        &self.0
    }

    pub fn into_value(self) -> Value {
        self.0
    }
}

fn check_hashable(v: &Value) -> Result<(), Error> {
    match v {
        Value::Map(_) => Err(Error::bad_args("unhashable type: 'dict'")),
        Value::Array(items) => items.iter().try_for_each(check_hashable),
        Value::Ext(EXT_TUPLE, _) => tuple_items(v).unwrap_or_default().iter().try_for_each(check_hashable),
        _ => Ok(()),
    }
}

impl PartialEq for Key {
    fn eq(&self, other: &Self) -> bool {
        eq_values(&self.0, &other.0)
    }
}

impl Eq for Key {}

impl PartialOrd for Key {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Key {
    fn cmp(&self, other: &Self) -> Ordering {
        cmp_values(&self.0, &other.0)
    }
}

impl Hash for Key {
    fn hash<H: Hasher>(&self, state: &mut H) {
        hash_value(&self.0, state)
    }
}

fn hash_value<H: Hasher>(v: &Value, state: &mut H) {
    rank(v).hash(state);
    match v {
        Value::Nil => {}
        // Equal numbers hash alike: bools and integral floats hash as the integer they equal.
        Value::Boolean(_) | Value::Integer(_) | Value::F32(_) | Value::F64(_) => match num(v) {
            Num::Int(i) => i.hash(state),
            Num::Float(f) if f.fract() == 0.0 && f.abs() < 1.7e38 => (f as i128).hash(state),
            Num::Float(f) => f.to_bits().hash(state),
        },
        Value::String(s) => s.as_bytes().hash(state),
        Value::Binary(b) => b.hash(state),
        Value::Array(items) => {
            items.len().hash(state);
            items.iter().for_each(|i| hash_value(i, state));
        }
        Value::Map(_) => {}
        Value::Ext(t, b) => match tuple_items(v) {
            Some(items) => {
                items.len().hash(state);
                items.iter().for_each(|i| hash_value(i, state));
            }
            None => {
                t.hash(state);
                b.hash(state);
            }
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ints_and_floats_compare_numerically() {
        assert_eq!(cmp_values(&Value::from(1), &Value::F64(1.5)), Ordering::Less);
        assert!(eq_values(&Value::from(2), &Value::F64(2.0)));
        assert_eq!(Key::new(Value::from(2)).unwrap(), Key::new(Value::F64(2.0)).unwrap());
    }

    #[test]
    fn bools_are_numbers_as_in_python() {
        assert!(eq_values(&Value::Boolean(true), &Value::from(1)));
        assert_eq!(
            Key::new(Value::Boolean(false)).unwrap(),
            Key::new(Value::F64(0.0)).unwrap()
        );
        assert_eq!(cmp_values(&Value::Boolean(true), &Value::from(2)), Ordering::Less);
    }

    fn tuple(items: Vec<Value>) -> Value {
        let mut body = Vec::new();
        rmpv::encode::write_value(&mut body, &Value::Array(items)).unwrap();
        Value::Ext(EXT_TUPLE, body)
    }

    #[test]
    fn tuples_compare_by_items_and_differ_from_arrays() {
        let a = tuple(vec![Value::from(1), Value::from("b")]);
        let b = tuple(vec![Value::F64(1.0), Value::from("c")]);
        assert_eq!(cmp_values(&a, &b), Ordering::Less);
        assert!(eq_values(&tuple(vec![Value::from(2)]), &tuple(vec![Value::F64(2.0)])));
        assert_eq!(
            Key::new(tuple(vec![Value::from(2)])).unwrap(),
            Key::new(tuple(vec![Value::F64(2.0)])).unwrap()
        );
        assert!(!eq_values(
            &tuple(vec![Value::from(1)]),
            &Value::Array(vec![Value::from(1)])
        ));
        assert!(Key::new(tuple(vec![Value::Map(vec![])])).is_err());
    }

    #[test]
    fn arrays_compare_like_tuples() {
        let a = Value::Array(vec![Value::from(1), Value::from("b")]);
        let b = Value::Array(vec![Value::from(1), Value::from("c")]);
        assert_eq!(cmp_values(&a, &b), Ordering::Less);
    }

    #[test]
    fn maps_are_unhashable() {
        assert_eq!(
            Key::new(Value::Map(vec![])).unwrap_err().kind,
            crate::ErrorKind::BadArguments
        );
    }
}
