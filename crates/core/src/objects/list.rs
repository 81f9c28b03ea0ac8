//! `List`: a Python list. Indexes and slices follow Python exactly (`slice.indices`).

use super::snapshot::{self, Fields};
use crate::object::args;
use std::cmp::Ordering;
use std::ops::Range;

use crate::value::{approx_size, cmp_values, eq_values, type_of};
use crate::{Ctx, Error, ErrorKind, Object, Step, Value};

#[derive(Clone)]
pub struct List {
    items: Items,
}

/// The list's items with the running total of their approximate sizes, so
/// [`Object::size`] is O(1). Reads go through `Deref` to the slice; every change goes
/// through a method here, which keeps the total.
#[derive(Clone, Default)]
struct Items {
    vec: Vec<Value>,
    bytes: usize,
}

impl std::ops::Deref for Items {
    type Target = [Value];

    fn deref(&self) -> &[Value] {
        &self.vec
    }
}

impl Items {
    fn new(vec: Vec<Value>) -> Items {
        let bytes = vec.iter().map(approx_size).sum();
        Items { vec, bytes }
    }

    fn push(&mut self, v: Value) {
        self.bytes += approx_size(&v);
        self.vec.push(v);
    }

    fn insert(&mut self, i: usize, v: Value) {
        self.bytes += approx_size(&v);
        self.vec.insert(i, v);
    }

    fn extend_from_slice(&mut self, more: &[Value]) {
        self.bytes += more.iter().map(approx_size).sum::<usize>();
        self.vec.extend_from_slice(more);
    }

    fn set(&mut self, i: usize, v: Value) {
        self.bytes = self.bytes + approx_size(&v) - approx_size(&self.vec[i]);
        self.vec[i] = v;
    }

    fn remove(&mut self, i: usize) -> Value {
        let v = self.vec.remove(i);
        self.bytes -= approx_size(&v);
        v
    }

    /// Replace `range` with `values`.
    fn splice(&mut self, range: Range<usize>, values: Vec<Value>) {
        self.bytes += values.iter().map(approx_size).sum::<usize>();
        let gone: usize = self.vec.splice(range, values).map(|v| approx_size(&v)).sum();
        self.bytes -= gone;
    }

    /// Keep the items whose flag in `doomed` is false.
    fn remove_flagged(&mut self, doomed: &[bool]) {
        let mut i = 0;
        let mut gone = 0;
        self.vec.retain(|v| {
            i += 1;
            if doomed[i - 1] {
                gone += approx_size(v);
            }
            !doomed[i - 1]
        });
        self.bytes -= gone;
    }

    fn clear(&mut self) {
        self.vec.clear();
        self.bytes = 0;
    }

    fn reverse(&mut self) {
        self.vec.reverse();
    }

    fn sort_by(&mut self, compare: impl FnMut(&Value, &Value) -> Ordering) {
        self.vec.sort_by(compare);
    }
}

fn index_error(message: &str) -> Error {
    Error::new(ErrorKind::IndexError, message)
}

fn array_arg<'v>(method: &str, a: &'v [Value], i: usize, name: &str) -> Result<&'v [Value], Error> {
    match args::get(a, i) {
        Value::Array(items) => Ok(items),
        other => Err(Error::bad_args(format!(
            "{method}(): '{name}' must be an array, not {}",
            type_of(other)
        ))),
    }
}

/// A slice resolved against a length, as Python's `slice.indices` plus the slice length.
#[derive(Clone, Debug, PartialEq)]
struct Slice {
    start: i128,
    stop: i128,
    step: i128,
    len: usize,
}

impl Slice {
    fn new(method: &str, a: &[Value], len: usize) -> Result<Slice, Error> {
        let opt = |i, name| match args::get(a, i) {
            Value::Nil => Ok(None),
            _ => args::int(method, a, i, name).map(|n| Some(i128::from(n))),
        };
        let (start, stop) = (opt(0, "start")?, opt(1, "stop")?);
        let step = opt(2, "step")?.unwrap_or(1);
        if step == 0 {
            return Err(Error::value("slice step cannot be zero"));
        }
        let n = len as i128;
        let back = step < 0;
        let adjust = |v: Option<i128>, default: i128| match v {
            None => default,
            Some(mut v) => {
                if v < 0 {
                    v += n;
                    if v < 0 {
                        v = if back { -1 } else { 0 };
                    }
                } else if v >= n {
                    v = if back { n - 1 } else { n };
                }
                v
            }
        };
        let start = adjust(start, if back { n - 1 } else { 0 });
        let stop = adjust(stop, if back { -1 } else { n });
        let count = if back {
            if stop < start {
                (start - stop - 1) / -step + 1
            } else {
                0
            }
        } else if start < stop {
            (stop - start - 1) / step + 1
        } else {
            0
        };
        Ok(Slice {
            start,
            stop,
            step,
            len: count as usize,
        })
    }

    /// The element indexes the slice covers, in slice order.
    fn indexes(&self) -> impl Iterator<Item = usize> + '_ {
        (0..self.len as i128).map(move |i| (self.start + i * self.step) as usize)
    }

    /// For a step-1 slice: the range of elements it replaces (Python clamps stop to start).
    fn range(&self) -> std::ops::Range<usize> {
        let start = self.start as usize;
        start..(self.stop.max(self.start) as usize)
    }
}

impl List {
    pub fn new(a: &[Value]) -> Result<Self, Error> {
        args::arity("List", a, 0, 1)?;
        let items = match args::get(a, 0) {
            Value::Nil => Vec::new(),
            _ => array_arg("List", a, 0, "initial")?.to_vec(),
        };
        Ok(List {
            items: Items::new(items),
        })
    }

    pub(crate) fn restore(state: &Value) -> Result<Self, Error> {
        let f = Fields::open("List", state, &["items"])?;
        Ok(List {
            items: Items::new(f.array("items")?.to_vec()),
        })
    }

    /// A Python index (negative from the end) as a position, if in range.
    fn position(&self, method: &str, a: &[Value], i: usize) -> Result<Option<usize>, Error> {
        let n = self.items.len() as i128;
        let mut idx = i128::from(args::int(method, a, i, "index")?);
        if idx < 0 {
            idx += n;
        }
        Ok((0..n).contains(&idx).then_some(idx as usize))
    }

    fn set_slice(&mut self, method: &str, a: &[Value]) -> Result<(), Error> {
        args::arity(method, a, 4, 4)?;
        let values = array_arg(method, a, 3, "values")?.to_vec();
        let s = Slice::new(method, a, self.items.len())?;
        if s.step == 1 {
            self.items.splice(s.range(), values);
            return Ok(());
        }
        if values.len() != s.len {
            return Err(Error::value(format!(
                "attempt to assign sequence of size {} to extended slice of size {}",
                values.len(),
                s.len
            )));
        }
        let idx: Vec<usize> = s.indexes().collect();
        for (i, v) in idx.into_iter().zip(values) {
            self.items.set(i, v);
        }
        Ok(())
    }

    fn del_slice(&mut self, method: &str, a: &[Value]) -> Result<(), Error> {
        args::arity(method, a, 3, 3)?;
        let s = Slice::new(method, a, self.items.len())?;
        if s.step == 1 {
            self.items.splice(s.range(), Vec::new());
            return Ok(());
        }
        let mut doomed = vec![false; self.items.len()];
        s.indexes().for_each(|i| doomed[i] = true);
        self.items.remove_flagged(&doomed);
        Ok(())
    }

    fn index(&self, method: &str, a: &[Value]) -> Result<Value, Error> {
        args::arity(method, a, 1, 3)?;
        let n = self.items.len() as i128;
        // list.index clamps like a slice: negative counts from the end, then floors at 0.
        let bound = |i, name, default: i128| -> Result<usize, Error> {
            let mut v = match args::get(a, i) {
                Value::Nil => default,
                _ => i128::from(args::int(method, a, i, name)?),
            };
            if v < 0 {
                v = (v + n).max(0);
            }
            Ok(v.min(n) as usize)
        };
        let (start, stop) = (bound(1, "start", 0)?, bound(2, "stop", n)?);
        if start < stop {
            if let Some(i) = self.items[start..stop].iter().position(|x| eq_values(x, &a[0])) {
                return Ok(Value::from((start + i) as u64));
            }
        }
        Err(Error::value(format!("{} is not in list", super::repr(&a[0]))))
    }
}

impl Object for List {
    fn type_name(&self) -> &'static str {
        "List"
    }

    fn is_mutating(&self, method: &str) -> bool {
        !matches!(
            method,
            "len" | "getitem" | "getslice" | "index" | "count" | "contains" | "items"
        )
    }

    fn may_grow(&self, method: &str) -> bool {
        self.is_mutating(method) && !matches!(method, "delitem" | "delslice" | "pop" | "remove" | "clear")
    }

    fn size(&self) -> usize {
        self.items.bytes
    }

    fn snapshot(&self) -> Option<Value> {
        Some(snapshot::encode(vec![("items", Value::Array(self.items.to_vec()))]))
    }

    fn apply(&mut self, method: &str, a: &[Value], _ctx: &mut Ctx) -> Result<Step, Error> {
        let v = match method {
            "len" => {
                args::arity(method, a, 0, 0)?;
                Value::from(self.items.len() as u64)
            }
            "getitem" => {
                args::arity(method, a, 1, 1)?;
                let i = self
                    .position(method, a, 0)?
                    .ok_or_else(|| index_error("list index out of range"))?;
                self.items[i].clone()
            }
            "setitem" => {
                args::arity(method, a, 2, 2)?;
                let i = self
                    .position(method, a, 0)?
                    .ok_or_else(|| index_error("list assignment index out of range"))?;
                self.items.set(i, a[1].clone());
                Value::Nil
            }
            "delitem" => {
                args::arity(method, a, 1, 1)?;
                let i = self
                    .position(method, a, 0)?
                    .ok_or_else(|| index_error("list assignment index out of range"))?;
                self.items.remove(i);
                Value::Nil
            }
            "getslice" => {
                args::arity(method, a, 3, 3)?;
                let s = Slice::new(method, a, self.items.len())?;
                Value::Array(s.indexes().map(|i| self.items[i].clone()).collect())
            }
            "setslice" => {
                self.set_slice(method, a)?;
                Value::Nil
            }
            "delslice" => {
                self.del_slice(method, a)?;
                Value::Nil
            }
            "insert" => {
                args::arity(method, a, 2, 2)?;
                let n = self.items.len() as i128;
                let mut i = i128::from(args::int(method, a, 0, "index")?);
                if i < 0 {
                    i = (i + n).max(0);
                }
                self.items.insert(i.min(n) as usize, a[1].clone());
                Value::Nil
            }
            "append" => {
                args::arity(method, a, 1, 1)?;
                self.items.push(a[0].clone());
                Value::Nil
            }
            "extend" => {
                args::arity(method, a, 1, 1)?;
                let more = array_arg(method, a, 0, "values")?;
                self.items.extend_from_slice(more);
                Value::Nil
            }
            "pop" => {
                args::arity(method, a, 0, 1)?;
                if self.items.is_empty() {
                    return Err(index_error("pop from empty list"));
                }
                let i = match args::get(a, 0) {
                    Value::Nil => Some(self.items.len() - 1),
                    _ => self.position(method, a, 0)?,
                };
                let i = i.ok_or_else(|| index_error("pop index out of range"))?;
                self.items.remove(i)
            }
            "index" => self.index(method, a)?,
            "count" => {
                args::arity(method, a, 1, 1)?;
                Value::from(self.items.iter().filter(|x| eq_values(x, &a[0])).count() as u64)
            }
            "remove" => {
                args::arity(method, a, 1, 1)?;
                let i = self
                    .items
                    .iter()
                    .position(|x| eq_values(x, &a[0]))
                    .ok_or_else(|| Error::value("list.remove(x): x not in list"))?;
                self.items.remove(i);
                Value::Nil
            }
            "contains" => {
                args::arity(method, a, 1, 1)?;
                Value::Boolean(self.items.iter().any(|x| eq_values(x, &a[0])))
            }
            "reverse" => {
                args::arity(method, a, 0, 0)?;
                self.items.reverse();
                Value::Nil
            }
            "clear" => {
                args::arity(method, a, 0, 0)?;
                self.items.clear();
                Value::Nil
            }
            "sort" => {
                args::arity(method, a, 0, 1)?;
                // Stable both ways, as Python's sort(reverse=True) keeps equal items in order.
                if args::bool_or(method, a, 0, "reverse", false)? {
                    self.items.sort_by(|x, y| cmp_values(y, x));
                } else {
                    self.items.sort_by(cmp_values);
                }
                Value::Nil
            }
            "items" => {
                args::arity(method, a, 0, 0)?;
                Value::Array(self.items.to_vec())
            }
            _ => return Err(super::unknown_method("List", method)),
        };
        Ok(Step::Reply(v))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::objects::testing::*;

    fn ints(v: &[i64]) -> Value {
        arr(v.iter().map(|&i| Value::from(i)).collect())
    }

    fn opt(v: Option<i64>) -> Value {
        v.map_or(Value::Nil, Value::from)
    }

    fn list(items: &[i64]) -> Harness {
        let mut p = Harness::new();
        p.create_ok("List", "l", vec![ints(items)]);
        p
    }

    /// Python's `list(range(n))[start:stop:step]`, computed the slow obvious way.
    fn python_slice(n: i64, start: Option<i64>, stop: Option<i64>, step: i64) -> Vec<i64> {
        let norm = |v: i64| if v < 0 { v + n } else { v };
        let mut out = Vec::new();
        if step > 0 {
            let s = start.map_or(0, |v| norm(v).clamp(0, n));
            let e = stop.map_or(n, |v| norm(v).clamp(0, n));
            let mut i = s;
            while i < e {
                out.push(i);
                i += step;
            }
        } else {
            let s = start.map_or(n - 1, |v| norm(v).clamp(-1, n - 1));
            let e = stop.map_or(-1, |v| norm(v).clamp(-1, n - 1));
            let mut i = s;
            while i > e {
                out.push(i);
                i += step;
            }
        }
        out
    }

    #[test]
    fn slices_match_python() {
        let bounds = [
            None,
            Some(-7),
            Some(-3),
            Some(-1),
            Some(0),
            Some(1),
            Some(3),
            Some(5),
            Some(9),
        ];
        for n in [0i64, 1, 5] {
            let all: Vec<i64> = (0..n).collect();
            let mut p = list(&all);
            for start in bounds {
                for stop in bounds {
                    for step in [-3i64, -2, -1, 1, 2, 3] {
                        let got = p.ok("List", "l", "getslice", vec![opt(start), opt(stop), step.into()]);
                        let want = ints(&python_slice(n, start, stop, step));
                        assert_eq!(got, want, "n={n} [{start:?}:{stop:?}:{step}]");
                    }
                }
            }
        }
    }

    #[test]
    fn known_slices() {
        let mut p = list(&[0, 1, 2, 3, 4]);
        let s = |p: &mut Harness, a: Value, b: Value, c: Value| p.ok("List", "l", "getslice", vec![a, b, c]);
        assert_eq!(s(&mut p, Value::Nil, Value::Nil, (-1).into()), ints(&[4, 3, 2, 1, 0]));
        assert_eq!(s(&mut p, 1.into(), Value::Nil, Value::Nil), ints(&[1, 2, 3, 4]));
        assert_eq!(s(&mut p, (-2).into(), Value::Nil, Value::Nil), ints(&[3, 4]));
        assert_eq!(s(&mut p, 3.into(), 0.into(), (-2).into()), ints(&[3, 1]));
        assert_eq!(s(&mut p, i64::MIN.into(), i64::MAX.into(), i64::MAX.into()), ints(&[0]));
        assert_eq!(s(&mut p, i64::MAX.into(), i64::MIN.into(), i64::MIN.into()), ints(&[4]));
        let e = p.err("List", "l", "getslice", vec![Value::Nil, Value::Nil, 0.into()]);
        assert_eq!(e.kind, ErrorKind::ValueError);
        let e = p.err("List", "l", "getslice", vec!["a".into(), Value::Nil, Value::Nil]);
        assert_eq!(e.kind, ErrorKind::BadArguments);
    }

    #[test]
    fn set_and_delete_slices() {
        let mut p = list(&[0, 1, 2, 3, 4]);
        p.ok(
            "List",
            "l",
            "setslice",
            vec![1.into(), 3.into(), Value::Nil, ints(&[7, 8, 9])],
        );
        assert_eq!(p.ok("List", "l", "items", vec![]), ints(&[0, 7, 8, 9, 3, 4]));
        // stop before start inserts at start, like Python.
        p.ok("List", "l", "setslice", vec![2.into(), 0.into(), 1.into(), ints(&[5])]);
        assert_eq!(p.ok("List", "l", "items", vec![]), ints(&[0, 7, 5, 8, 9, 3, 4]));
        p.ok(
            "List",
            "l",
            "setslice",
            vec![Value::Nil, Value::Nil, (-2).into(), ints(&[10, 11, 12, 13])],
        );
        assert_eq!(p.ok("List", "l", "items", vec![]), ints(&[13, 7, 12, 8, 11, 3, 10]));
        let e = p.err(
            "List",
            "l",
            "setslice",
            vec![Value::Nil, Value::Nil, 2.into(), ints(&[1])],
        );
        assert_eq!(e.kind, ErrorKind::ValueError);
        assert_eq!(
            e.message,
            "attempt to assign sequence of size 1 to extended slice of size 4"
        );
        let e = p.err(
            "List",
            "l",
            "setslice",
            vec![Value::Nil, Value::Nil, Value::Nil, 5.into()],
        );
        assert_eq!(e.kind, ErrorKind::BadArguments);
        p.ok("List", "l", "delslice", vec![Value::Nil, Value::Nil, 2.into()]);
        assert_eq!(p.ok("List", "l", "items", vec![]), ints(&[7, 8, 3]));
        p.ok("List", "l", "delslice", vec![(-1).into(), Value::Nil, (-1).into()]);
        assert_eq!(p.ok("List", "l", "items", vec![]), ints(&[]));
        let mut p = list(&[0, 1, 2, 3, 4]);
        p.ok("List", "l", "delslice", vec![1.into(), (-1).into(), Value::Nil]);
        assert_eq!(p.ok("List", "l", "items", vec![]), ints(&[0, 4]));
        p.ok("List", "l", "delslice", vec![5.into(), 1.into(), Value::Nil]);
        assert_eq!(p.ok("List", "l", "items", vec![]), ints(&[0, 4]));
    }

    #[test]
    fn indexing() {
        let mut p = list(&[10, 20, 30]);
        assert_eq!(p.ok("List", "l", "getitem", vec![(-1).into()]), Value::from(30));
        let e = p.err("List", "l", "getitem", vec![3.into()]);
        assert_eq!(
            (e.kind, e.message.as_str()),
            (ErrorKind::IndexError, "list index out of range")
        );
        assert_eq!(
            p.err("List", "l", "getitem", vec![(-4).into()]).kind,
            ErrorKind::IndexError
        );
        assert_eq!(
            p.err("List", "l", "getitem", vec![i64::MIN.into()]).kind,
            ErrorKind::IndexError
        );
        assert_eq!(
            p.err("List", "l", "getitem", vec![u64::MAX.into()]).kind,
            ErrorKind::OverflowError
        );
        assert_eq!(
            p.err("List", "l", "getitem", vec![Value::F64(1.0)]).kind,
            ErrorKind::BadArguments
        );
        p.ok("List", "l", "setitem", vec![(-3).into(), 11.into()]);
        assert_eq!(
            p.err("List", "l", "setitem", vec![5.into(), 1.into()]).kind,
            ErrorKind::IndexError
        );
        p.ok("List", "l", "delitem", vec![1.into()]);
        assert_eq!(
            p.err("List", "l", "delitem", vec![2.into()]).kind,
            ErrorKind::IndexError
        );
        assert_eq!(p.ok("List", "l", "items", vec![]), ints(&[11, 30]));
        p.ok("List", "l", "insert", vec![(-100).into(), 1.into()]);
        p.ok("List", "l", "insert", vec![100.into(), 99.into()]);
        p.ok("List", "l", "insert", vec![(-1).into(), 50.into()]);
        assert_eq!(p.ok("List", "l", "items", vec![]), ints(&[1, 11, 30, 50, 99]));
    }

    #[test]
    fn pop_index_count_remove() {
        let mut p = list(&[1, 2, 3, 2]);
        assert_eq!(p.ok("List", "l", "pop", vec![]), Value::from(2));
        assert_eq!(p.ok("List", "l", "pop", vec![0.into()]), Value::from(1));
        assert_eq!(p.err("List", "l", "pop", vec![5.into()]).kind, ErrorKind::IndexError);
        p.ok("List", "l", "extend", vec![ints(&[2, 3])]);
        assert_eq!(p.ok("List", "l", "items", vec![]), ints(&[2, 3, 2, 3]));
        assert_eq!(p.ok("List", "l", "index", vec![3.into()]), Value::from(1));
        assert_eq!(p.ok("List", "l", "index", vec![3.into(), 2.into()]), Value::from(3));
        assert_eq!(
            p.ok("List", "l", "index", vec![Value::F64(2.0), (-2).into()]),
            Value::from(2)
        );
        let e = p.err("List", "l", "index", vec![3.into(), 0.into(), 1.into()]);
        assert_eq!(e.kind, ErrorKind::ValueError);
        assert_eq!(p.err("List", "l", "index", vec![9.into()]).message, "9 is not in list");
        assert_eq!(p.ok("List", "l", "count", vec![2.into()]), Value::from(2));
        p.ok("List", "l", "remove", vec![2.into()]);
        assert_eq!(p.ok("List", "l", "items", vec![]), ints(&[3, 2, 3]));
        assert_eq!(p.err("List", "l", "remove", vec![7.into()]).kind, ErrorKind::ValueError);
        assert_eq!(p.ok("List", "l", "contains", vec![3.into()]), Value::Boolean(true));
        p.ok("List", "l", "clear", vec![]);
        let e = p.err("List", "l", "pop", vec![]);
        assert_eq!(
            (e.kind, e.message.as_str()),
            (ErrorKind::IndexError, "pop from empty list")
        );
        assert_eq!(
            p.err("List", "l", "extend", vec![1.into()]).kind,
            ErrorKind::BadArguments
        );
    }

    #[test]
    fn sort_and_reverse_are_stable() {
        let mut p = Harness::new();
        let items = arr(vec![3.into(), Value::F64(1.0), "a".into(), 1.into(), Value::Nil]);
        p.create_ok("List", "l", vec![items]);
        p.ok("List", "l", "sort", vec![]);
        let want = arr(vec![Value::Nil, Value::F64(1.0), 1.into(), 3.into(), "a".into()]);
        assert_eq!(p.ok("List", "l", "items", vec![]), want);
        p.ok("List", "l", "sort", vec![true.into()]);
        let want = arr(vec!["a".into(), 3.into(), Value::F64(1.0), 1.into(), Value::Nil]);
        assert_eq!(p.ok("List", "l", "items", vec![]), want);
        p.ok("List", "l", "reverse", vec![]);
        assert_eq!(p.ok("List", "l", "getitem", vec![0.into()]), Value::Nil);
        assert_eq!(p.ok("List", "l", "len", vec![]), Value::from(5));
        assert_eq!(p.create_err("List", "m", vec![1.into()]).kind, ErrorKind::BadArguments);
        let o = List::new(&[]).unwrap();
        assert!(!o.is_mutating("getslice") && o.is_mutating("sort") && o.is_mutating("pop"));
    }
}
