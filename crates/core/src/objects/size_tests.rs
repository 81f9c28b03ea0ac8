//! `Object::size` is kept as a running total: after any sequence of calls it equals the
//! size of the same contents counted from scratch (the object rebuilt from its snapshot).

use super::testing::*;
use crate::value::approx_size;
use crate::Value;

fn text(n: usize) -> Value {
    Value::from("x".repeat(n))
}

/// Run `calls` on a new `type_name` object, checking the running size after each one.
fn tracks(type_name: &str, args: &[Value], calls: &[(&str, Vec<Value>)]) -> usize {
    let mut solo = Solo::new(super::create(type_name, args).unwrap());
    for (method, args) in calls {
        solo.call(1, method, args);
        let state = solo.obj.snapshot().expect("a container has a snapshot");
        let fresh = super::snapshot::restore(type_name, &state).unwrap();
        assert_eq!(solo.obj.size(), fresh.size(), "{type_name}.{method}{args:?}");
    }
    solo.obj.size()
}

#[test]
fn dict_and_sorted_dict() {
    let calls = [
        ("setitem", vec![text(10), text(100)]),
        ("setitem", vec![text(10), text(5)]),
        ("setitem", vec![1.into(), Value::Array(vec![text(50), text(60)])]),
        (
            "update",
            vec![Value::Map(vec![(text(3), text(30)), (2.into(), 2.into())])],
        ),
        ("merge", vec![1.into(), Value::Array(vec![text(70)]), "append".into()]),
        ("merge", vec![text(4), text(40), "replace".into()]),
        (
            "merge_many",
            vec![Value::Array(vec![Value::Array(vec![2.into(), 5.into()])]), "sum".into()],
        ),
        ("setdefault", vec![text(8), text(80)]),
        ("delitem", vec![text(10)]),
        ("pop", vec![text(3)]),
        ("popitem", vec![]),
    ];
    for t in ["Dict", "SortedDict"] {
        assert!(tracks(t, &[], &calls) > 200);
        let mut cleared = calls.to_vec();
        cleared.push(("clear", vec![]));
        assert_eq!(tracks(t, &[], &cleared), 0);
    }
}

#[test]
fn list() {
    let ints = |v: &[i64]| Value::Array(v.iter().map(|&i| i.into()).collect());
    let size = tracks(
        "List",
        &[ints(&[1, 2, 3])],
        &[
            ("append", vec![text(100)]),
            ("insert", vec![0.into(), text(50)]),
            ("extend", vec![Value::Array(vec![text(7), text(9)])]),
            ("setitem", vec![1.into(), text(300)]),
            (
                "setslice",
                vec![0.into(), 2.into(), Value::Nil, Value::Array(vec![text(1)])],
            ),
            ("setslice", vec![Value::Nil, Value::Nil, 2.into(), ints(&[0, 0, 0, 0])]),
            ("delslice", vec![Value::Nil, Value::Nil, 3.into()]),
            ("delslice", vec![0.into(), 1.into(), Value::Nil]),
            ("delitem", vec![0.into()]),
            ("pop", vec![]),
            ("remove", vec![0.into()]),
            ("reverse", vec![]),
            ("sort", vec![]),
        ],
    );
    assert!(size > 0);
    assert_eq!(
        tracks("List", &[ints(&[1])], &[("append", vec![text(5)]), ("clear", vec![])]),
        0
    );
}

#[test]
fn queues() {
    for t in ["Queue", "LifoQueue", "PriorityQueue"] {
        let calls = [
            ("put", vec![text(100)]),
            ("put", vec![text(20)]),
            ("get", vec![]),
            ("put", vec![text(300)]),
        ];
        assert!(tracks(t, &[], &calls) >= 320, "{t}");
        let drained = [("put", vec![text(10)]), ("get", vec![])];
        assert_eq!(tracks(t, &[], &drained), 0, "{t}");
    }
}

#[test]
fn blob_value_and_array() {
    let bytes = |n: usize| Value::Binary(vec![7; n]);
    assert_eq!(
        tracks("Blob", &[], &[("set", vec![bytes(100)]), ("append", vec![bytes(20)])]),
        120
    );
    assert_eq!(tracks("Blob", &[bytes(100)], &[("set", vec![bytes(3)])]), 3);
    let v = tracks(
        "Value",
        &[text(10)],
        &[
            ("set", vec![text(1000)]),
            ("get_and_set", vec![text(500)]),
            ("compare_and_set", vec![text(500), text(50)]),
        ],
    );
    assert_eq!(v, approx_size(&text(50)));
    assert_eq!(
        tracks(
            "Array",
            &[Value::Array(vec![10.into(), 3.into()]), "float32".into()],
            &[]
        ),
        120
    );
}

#[test]
fn future_counts_its_result_and_primitives_nothing() {
    let mut f = Solo::new(super::create("Future", &[]).unwrap());
    assert_eq!(f.obj.size(), 0);
    f.ok("set_result", &[text(1000)]);
    assert_eq!(f.obj.size(), approx_size(&text(1000)));
    assert!(!f.obj.may_grow("cancel") && f.obj.may_grow("set_result"));
    for t in ["Lock", "Semaphore", "Event", "Counter"] {
        assert_eq!(super::create(t, &[]).unwrap().size(), 0, "{t}");
    }
}

#[test]
fn shrinking_methods_may_not_grow() {
    let create = |t: &str| super::create(t, &[]).unwrap();
    let d = create("Dict");
    assert!(d.may_grow("setitem") && d.may_grow("merge") && !d.may_grow("pop") && !d.may_grow("delitem"));
    assert!(!d.may_grow("clear") && !d.may_grow("getitem"));
    let l = create("List");
    assert!(l.may_grow("append") && !l.may_grow("pop") && !l.may_grow("remove") && !l.may_grow("len"));
    let q = create("Queue");
    assert!(q.may_grow("put") && !q.may_grow("get") && !q.may_grow("task_done"));
}
