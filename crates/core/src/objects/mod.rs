//! The built-in object types, one file each (like Redis' `t_*.c`).

mod array;
mod barrier;
mod blob;
mod cache;
pub mod compiled;
mod condition;
mod counter;
mod dict;
mod event;
mod future;
mod latch;
mod list;
mod lock;
mod queue;
mod rlock;
mod semaphore;
pub mod snapshot;
mod sorted_dict;
pub mod user;
mod value;
mod waiters;

#[cfg(test)]
mod size_tests;
#[cfg(test)]
pub(crate) mod testing;

pub use array::Array;
pub use barrier::Barrier;
pub use blob::Blob;
pub use condition::Condition;
pub use counter::Counter;
pub use dict::Dict;
pub use event::Event;
pub use future::Future;
pub use latch::CountDownLatch;
pub use list::List;
pub use lock::Lock;
pub use queue::Queue;
pub use rlock::RLock;
pub use semaphore::Semaphore;
pub use snapshot::{is_durable, restore};
pub use sorted_dict::SortedDict;
pub use user::{Forward, UserObject, UserState};
pub use value::SharedValue;

use crate::{Error, ErrorKind, Object, Value};

/// Every type name a client may create.
pub const TYPES: &[&str] = &[
    "Counter",
    "Value",
    "Dict",
    "SortedDict",
    "List",
    "Blob",
    "Array",
    "Lock",
    "RLock",
    "Semaphore",
    "BoundedSemaphore",
    "Event",
    "Condition",
    "Barrier",
    "Queue",
    "LifoQueue",
    "PriorityQueue",
    "CountDownLatch",
    "Future",
];

/// Construct a new object of `type_name` from its constructor arguments.
pub fn create(type_name: &str, args: &[Value]) -> Result<Box<dyn Object>, Error> {
    Ok(match type_name {
        "Counter" => Box::new(Counter::new(args)?),
        "Value" => Box::new(SharedValue::new(args)?),
        "Dict" => Box::new(Dict::new(args)?),
        "SortedDict" => Box::new(SortedDict::new(args)?),
        "List" => Box::new(List::new(args)?),
        "Blob" => Box::new(Blob::new(args)?),
        "Array" => Box::new(Array::new(args)?),
        "Lock" => Box::new(Lock::new(args)?),
        "RLock" => Box::new(RLock::new(args)?),
        "Semaphore" => Box::new(Semaphore::new(args, false)?),
        "BoundedSemaphore" => Box::new(Semaphore::new(args, true)?),
        "Event" => Box::new(Event::new(args)?),
        "Condition" => Box::new(Condition::new(args)?),
        "Barrier" => Box::new(Barrier::new(args)?),
        "Queue" => Box::new(Queue::new(args, queue::Order::Fifo)?),
        "LifoQueue" => Box::new(Queue::new(args, queue::Order::Lifo)?),
        "PriorityQueue" => Box::new(Queue::new(args, queue::Order::Priority)?),
        "CountDownLatch" => Box::new(CountDownLatch::new(args)?),
        "Future" => Box::new(Future::new(args)?),
        _ => {
            return Err(Error::new(
                ErrorKind::UnknownType,
                format!("unknown object type '{type_name}' (known: {})", TYPES.join(", ")),
            ))
        }
    })
}

/// Whether `method` of `type_name` only reads (a reader may call it: see the server's
/// permissions). Unknown types and methods, user-defined ones included, count as writes.
pub fn is_read(type_name: &str, method: &str) -> bool {
    match type_name {
        "Counter" | "Value" => method == "get",
        "Dict" => dict::is_read(method),
        "SortedDict" => dict::is_read(method) || matches!(method, "range" | "first" | "last" | "most_common"),
        "List" => matches!(
            method,
            "len" | "getitem" | "getslice" | "index" | "count" | "contains" | "items"
        ),
        "Blob" => matches!(method, "get" | "len" | "read"),
        "Array" => matches!(method, "get" | "shape" | "dtype"),
        "Lock" => method == "locked",
        "RLock" => matches!(method, "locked" | "is_owned"),
        "Semaphore" | "BoundedSemaphore" => method == "value",
        "Event" => matches!(method, "is_set" | "wait"),
        "Barrier" => method == "info",
        "Queue" | "LifoQueue" | "PriorityQueue" => matches!(method, "qsize" | "empty" | "full" | "maxsize" | "join"),
        "CountDownLatch" => matches!(method, "count" | "wait"),
        "Future" => matches!(method, "result" | "exception" | "done" | "cancelled" | "running"),
        _ => false,
    }
}

/// The error for a method the type does not have.
pub fn unknown_method(type_name: &str, method: &str) -> Error {
    Error::new(
        ErrorKind::UnknownMethod,
        format!("{type_name} has no method '{method}'"),
    )
}

/// A value as error messages show it, cut short so a huge key cannot bloat a reply.
pub(crate) fn repr(v: &Value) -> String {
    const MAX: usize = 200;
    let s = v.to_string();
    match s.char_indices().nth(MAX) {
        Some((i, _)) => format!("{}...", &s[..i]),
        None => s,
    }
}

#[cfg(test)]
mod tests {
    use super::testing::*;
    use super::*;

    fn valid_args(t: &str) -> Vec<Value> {
        match t {
            "Array" => vec![3.into(), "int64".into()],
            "Condition" => vec!["Lock".into(), "l".into()],
            "Barrier" | "CountDownLatch" => vec![2.into()],
            _ => vec![],
        }
    }

    #[test]
    fn every_type_can_be_created() {
        let mut p = Harness::new();
        for t in TYPES {
            p.create_ok(t, &format!("o-{t}"), valid_args(t));
            let e = p.err(t, &format!("o-{t}"), "no_such_method", vec![]);
            assert_eq!(e.kind, ErrorKind::UnknownMethod, "{t}");
        }
        assert_eq!(p.create_err("Widget", "w", vec![]).kind, ErrorKind::UnknownType);
    }

    #[test]
    fn type_mismatch_names_both_types() {
        let mut p = Harness::new();
        p.create_ok("Queue", "jobs", vec![]);
        let e = p.err("Counter", "jobs", "get", vec![]);
        assert_eq!(e.kind, ErrorKind::TypeMismatch);
        assert_eq!(e.message, "'jobs' is a Queue, not a Counter");
        assert_eq!(
            p.create("Counter", "jobs", vec![]).unwrap_err().kind,
            ErrorKind::TypeMismatch
        );
    }

    /// Throw hostile arguments at every method of every type: nothing may panic, and no
    /// reply may be an `Internal` error.
    #[test]
    fn hostile_arguments_never_panic() {
        let nd = |shape: Value, data: Vec<u8>| {
            Value::Map(vec![
                ("dtype".into(), "int64".into()),
                ("shape".into(), shape),
                ("data".into(), Value::Binary(data)),
            ])
        };
        let weird = [
            Value::Nil,
            true.into(),
            0.into(),
            1.into(),
            (-1).into(),
            2.into(),
            i64::MIN.into(),
            i64::MAX.into(),
            u64::MAX.into(),
            Value::F64(f64::NAN),
            Value::F64(f64::INFINITY),
            Value::F64(-0.0),
            Value::F64(1e300),
            Value::F32(0.5),
            "x".into(),
            "sum".into(),
            "append".into(),
            Value::Binary(vec![0; 24]),
            Value::Array(vec![]),
            Value::Array(vec![1.into(), Value::Map(vec![])]),
            Value::Array(vec![Value::Array(vec!["k".into(), 1.into()])]),
            Value::Map(vec![]),
            Value::Map(vec![(1.into(), 2.into())]),
            Value::Ext(1, vec![1]),
            nd(Value::Array(vec![3.into()]), vec![0; 24]),
            nd(Value::Array(vec![(-3).into()]), vec![]),
            nd(3.into(), vec![0; 23]),
        ];
        let methods = [
            "get",
            "set",
            "add",
            "len",
            "getitem",
            "setitem",
            "delitem",
            "contains",
            "keys",
            "values",
            "items",
            "setdefault",
            "pop",
            "popitem",
            "update",
            "clear",
            "merge",
            "merge_many",
            "range",
            "first",
            "last",
            "most_common",
            "getslice",
            "setslice",
            "delslice",
            "insert",
            "append",
            "extend",
            "index",
            "count",
            "remove",
            "reverse",
            "sort",
            "read",
            "scale",
            "fill",
            "shape",
            "dtype",
            "acquire",
            "release",
            "locked",
            "is_owned",
            "value",
            "is_set",
            "wait",
            "lock",
            "register",
            "notify",
            "notify_all",
            "cancel",
            "action_done",
            "reset",
            "abort",
            "info",
            "put",
            "qsize",
            "empty",
            "full",
            "maxsize",
            "task_done",
            "join",
            "count_down",
            "set_result",
            "set_exception",
            "result",
            "exception",
            "done",
            "cancelled",
            "running",
            "get_and_set",
            "compare_and_set",
            "get_and_add",
            "increment",
        ];
        let mut rng: u64 = 0x2545_f491_4f6c_dd1d;
        let mut next = |n: usize| {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            (rng % n as u64) as usize
        };
        let mut p = Harness::new();
        let mut created = 0;
        for t in TYPES {
            for ctor in 0..12 {
                let key = format!("{t}-{ctor}");
                let args: Vec<Value> = match ctor {
                    0 => valid_args(t),
                    _ => (0..next(4)).map(|_| weird[next(weird.len())].clone()).collect(),
                };
                if p.create(t, &key, args).is_err() {
                    continue;
                }
                created += 1;
                for round in 0..2000 {
                    let method = methods[next(methods.len())];
                    let args: Vec<Value> = (0..next(5)).map(|_| weird[next(weird.len())].clone()).collect();
                    let conn = 1 + next(4) as u64;
                    let (_, out) = p.call(&who(conn), 0, t, &key, method, args);
                    let mut all = out;
                    if round % 37 == 0 {
                        all.extend(p.advance(next(3) as f64));
                    }
                    if round % 53 == 0 {
                        all.extend(p.disconnect(conn));
                    }
                    for d in &all {
                        if let Err(e) = &d.reply {
                            assert_ne!(e.kind, ErrorKind::Internal, "{t}.{method}: {e}");
                        }
                    }
                }
                p.delete(&key);
            }
        }
        assert!(created >= TYPES.len(), "only {created} objects created");
    }

    #[test]
    fn repr_is_bounded() {
        let long = Value::from("x".repeat(10_000));
        assert!(repr(&long).len() < 300);
        assert_eq!(repr(&Value::from(5)), "5");
    }
}
