//! The runtime against hand-written modules (WebAssembly text): the ABI checks at load, calls
//! with state, the errors and limits, and concurrency.

use std::sync::Arc;

use spindle_core::objects::compiled::{Code, Library};
use spindle_core::{Error, ErrorKind, Value};
use spindle_wasm::{Allocator, Limits, Runtime};

/// A module that keeps the ABI, with one method per thing a test needs a guest to do.
const GUEST: &str = r#"
(module
  (import "spindle" "state_len" (func $state_len (result i32)))
  (import "spindle" "state_read" (func $state_read (param i32)))
  (import "spindle" "state_write" (func $state_write (param i32 i32)))
  (import "spindle" "reply" (func $reply (param i32 i32)))
  (import "spindle" "fail" (func $fail (param i32 i32 i32 i32)))
  (memory (export "memory") 1)
  (global $next (mut i32) (i32.const 1024))
  (data (i32.const 0) "ValueError")
  (data (i32.const 16) "insufficient funds")
  (data (i32.const 40) "\a5ab")
  (data (i32.const 48) "\01\02")
  (func $alloc (export "spindle_alloc") (param $len i32) (result i32)
    (local $p i32)
    (local.set $p (global.get $next))
    (global.set $next (i32.add (global.get $next) (local.get $len)))
    ;; Grow the memory to hold the new end (in 64 KiB pages).
    (if (i32.gt_u (global.get $next) (i32.mul (memory.size) (i32.const 65536)))
      (then (drop (memory.grow
        (i32.sub (i32.div_u (i32.add (global.get $next) (i32.const 65535)) (i32.const 65536)) (memory.size))))))
    (local.get $p))
  ;; The new object's state is its constructor's arguments.
  (func (export "init") (param i32 i32) (call $state_write (local.get 0) (local.get 1)))
  (func (export "echo") (param i32 i32) (call $reply (local.get 0) (local.get 1)))
  (func (export "store") (param i32 i32) (call $state_write (local.get 0) (local.get 1)))
  (func (export "load") (param i32 i32)
    (local $n i32) (local $p i32)
    (local.set $n (call $state_len))
    (local.set $p (call $alloc (local.get $n)))
    (call $state_read (local.get $p))
    (call $reply (local.get $p) (local.get $n)))
  (func (export "count_calls") (param i32 i32)
    ;; A global that survived from an earlier call would show here: the reply would grow.
    (i32.store8 (i32.const 100) (i32.add (i32.load8_u (i32.const 100)) (i32.const 1)))
    (call $reply (i32.const 100) (i32.const 1)))
  (func (export "refuse") (param i32 i32)
    (call $state_write (local.get 0) (local.get 1))
    (call $fail (i32.const 0) (i32.const 10) (i32.const 16) (i32.const 18))
    (call $reply (i32.const 48) (i32.const 1)))
  (func (export "spin") (param i32 i32)
    (call $state_write (local.get 0) (local.get 1))
    (loop $forever (br $forever)))
  (func (export "hog") (param i32 i32)
    (call $state_write (local.get 0) (local.get 1))
    (loop $forever (drop (memory.grow (i32.const 16))) (br $forever)))
  (func $recurse (export "recurse") (param i32 i32)
    (call $state_write (local.get 0) (local.get 1))
    (call $recurse (local.get 0) (local.get 1)))
  (func (export "crash") (param i32 i32)
    (call $state_write (local.get 0) (local.get 1))
    unreachable)
  (func (export "out_of_bounds") (param i32 i32)
    (call $state_write (local.get 0) (local.get 1))
    (drop (i32.load (i32.const -4))))
  (func (export "divide_by_zero") (param i32 i32)
    (call $state_write (local.get 0) (local.get 1))
    (drop (i32.div_s (i32.const 1) (i32.sub (local.get 1) (local.get 1)))))
  (func (export "reply_out_of_bounds") (param i32 i32) (call $reply (i32.const 65530) (i32.const 100)))
  (func (export "reply_negative_length") (param i32 i32) (call $reply (i32.const 0) (i32.const -1)))
  (func (export "read_state_out_of_bounds") (param i32 i32) (call $state_read (i32.const 65535)))
  (func (export "write_state_out_of_bounds") (param i32 i32) (call $state_write (i32.const -8) (i32.const 16)))
  (func (export "fail_out_of_bounds") (param i32 i32)
    (call $fail (i32.const 0) (i32.const 10) (i32.const 70000) (i32.const 18)))
  (func (export "reply_garbage") (param i32 i32) (call $reply (i32.const 40) (i32.const 3)))
  (func (export "reply_two_values") (param i32 i32) (call $reply (i32.const 48) (i32.const 2)))
  (func (export "reply_truncated") (param i32 i32) (call $reply (local.get 0) (i32.sub (local.get 1) (i32.const 1))))
  ;; Replies bin8 with the bits of 0.0 / 0.0 (x86 makes 0xfff8..., the canonical NaN is 0x7ff8...).
  (func (export "nan") (param i32 i32)
    (i32.store8 (i32.const 200) (i32.const 0xc4))
    (i32.store8 (i32.const 201) (i32.const 8))
    (f64.store (i32.const 202) (f64.div (f64.load (i32.const 300)) (f64.load (i32.const 300))))
    (call $reply (i32.const 200) (i32.const 10)))
  ;; The same with a signalling NaN with a payload, made quiet by an addition.
  (func (export "nan_payload") (param i32 i32)
    (i32.store8 (i32.const 200) (i32.const 0xc4))
    (i32.store8 (i32.const 201) (i32.const 8))
    (f64.store (i32.const 202) (f64.add (f64.reinterpret_i64 (i64.const 0x7ff4000000000001)) (f64.const 1)))
    (call $reply (i32.const 200) (i32.const 10)))
  (func (export "_private") (param i32 i32) unreachable)
  (func (export "spindle_internal") (param i32 i32) unreachable)
  (global (export "a_global") i32 (i32.const 0))
)"#;

fn runtime(limits: Limits) -> Runtime {
    Runtime::new(limits).expect("runtime")
}

fn load_with(limits: Limits, wat: &str) -> Result<Arc<dyn Code>, Error> {
    let bytes = wat::parse_str(wat).expect("valid text");
    runtime(limits).load("wasm:test", "1", &bytes)
}

fn guest() -> Arc<dyn Code> {
    load_with(Limits::default(), GUEST).expect("the guest loads")
}

fn msgpack(value: &Value) -> Vec<u8> {
    let mut bytes = Vec::new();
    rmpv::encode::write_value(&mut bytes, value).unwrap();
    bytes
}

fn args(values: &[i64]) -> Vec<Value> {
    values.iter().map(|&v| Value::from(v)).collect()
}

fn reason(error: &Error) -> &str {
    assert_eq!(error.kind, ErrorKind::Trapped, "{error:?}");
    match &error.data {
        Value::Map(entries) => {
            assert_eq!(entries.len(), 1, "{error:?}");
            assert_eq!(entries[0].0, Value::from("reason"));
            entries[0].1.as_str().expect("a string reason")
        }
        other => panic!("Trapped data is {other:?}"),
    }
}

// --- the ABI checks at load -------------------------------------------------------------

fn refusal(wat: &str) -> String {
    refusal_with(Limits::default(), wat)
}

fn refusal_with(limits: Limits, wat: &str) -> String {
    let error = load_with(limits, wat).err().expect("the module is refused");
    assert_eq!(error.kind, ErrorKind::BadArguments, "{error:?}");
    assert!(
        error.message.starts_with("wasm:test cannot be loaded: "),
        "{}",
        error.message
    );
    error.message
}

const MEMORY_AND_ALLOC: &str = r#"(memory (export "memory") 1)
    (func (export "spindle_alloc") (param i32) (result i32) (i32.const 0))"#;

#[test]
fn refuses_bytes_that_are_not_wasm() {
    let error = runtime(Limits::default())
        .load("wasm:test", "1", b"print('hello')")
        .err()
        .unwrap();
    assert_eq!(error.kind, ErrorKind::BadArguments);
    assert!(error.message.contains("not a WebAssembly module"), "{}", error.message);

    let error = runtime(Limits::default())
        .load("wasm:test", "1", b"\0asm\x01\0\0\0\x99")
        .err()
        .unwrap();
    assert!(
        error.message.contains("the module does not compile"),
        "{}",
        error.message
    );
}

#[test]
fn refuses_a_module_over_the_size_limit() {
    let limits = Limits {
        module_bytes: 100,
        ..Limits::default()
    };
    let message = refusal_with(limits, GUEST);
    assert!(
        message.contains("too large") && message.contains("the limit is 100 bytes"),
        "{message}"
    );
}

#[test]
fn refuses_a_module_without_memory() {
    let message = refusal(
        r#"(module (memory 1) (func (export "spindle_alloc") (param i32) (result i32) (i32.const 0))
            (func (export "m") (param i32 i32)))"#,
    );
    assert!(message.contains("missing export `memory`"), "{message}");
}

#[test]
fn refuses_a_module_without_spindle_alloc() {
    let message = refusal(r#"(module (memory (export "memory") 1) (func (export "m") (param i32 i32)))"#);
    assert!(message.contains("missing export `spindle_alloc`"), "{message}");

    let message = refusal(
        r#"(module (memory (export "memory") 1) (func (export "spindle_alloc") (param i32))
            (func (export "m") (param i32 i32)))"#,
    );
    assert!(
        message.contains("`spindle_alloc` has signature (i32) -> (), expected (i32) -> i32"),
        "{message}"
    );
}

#[test]
fn refuses_a_method_of_another_signature() {
    let message = refusal(&format!(
        r#"(module {MEMORY_AND_ALLOC} (func (export "deposit") (param i64)))"#
    ));
    assert!(
        message.contains("method `deposit` has signature (i64) -> (), expected (i32, i32) -> ()"),
        "{message}"
    );

    let message = refusal(&format!(
        r#"(module {MEMORY_AND_ALLOC} (func (export "m") (param i32 i32)) (func (export "init") (result i32) (i32.const 0)))"#
    ));
    assert!(
        message.contains("constructor `init` has signature () -> i32, expected (i32, i32) -> ()"),
        "{message}"
    );
}

#[test]
fn refuses_imports_outside_the_abi() {
    let message = refusal(&format!(
        r#"(module (import "env" "foo" (func)) {MEMORY_AND_ALLOC} (func (export "m") (param i32 i32)))"#
    ));
    assert!(
        message.contains("import `env.foo` not allowed: only spindle.* imports listed in the ABI"),
        "{message}"
    );

    let message = refusal(&format!(
        r#"(module (import "spindle" "clock" (func (result i64))) {MEMORY_AND_ALLOC} (func (export "m") (param i32 i32)))"#
    ));
    assert!(message.contains("import `spindle.clock` not allowed"), "{message}");

    let message = refusal(&format!(
        r#"(module (import "spindle" "reply" (func (param i32))) {MEMORY_AND_ALLOC} (func (export "m") (param i32 i32)))"#
    ));
    assert!(
        message.contains("import `spindle.reply` has signature (i32) -> (), expected (i32, i32) -> ()"),
        "{message}"
    );

    let message = refusal(&format!(
        r#"(module (import "spindle" "state_len" (global i32)) {MEMORY_AND_ALLOC} (func (export "m") (param i32 i32)))"#
    ));
    assert!(
        message.contains("import `spindle.state_len` must be a function"),
        "{message}"
    );
}

#[test]
fn refuses_a_module_without_methods() {
    let message = refusal(&format!(
        r#"(module {MEMORY_AND_ALLOC} (func (export "init") (param i32 i32)) (func (export "_m") (param i32 i32)))"#
    ));
    assert!(message.contains("no methods"), "{message}");
}

#[test]
fn refuses_a_memory_that_starts_over_the_limit() {
    let limits = Limits {
        memory_bytes: 1 << 20,
        ..Limits::default()
    };
    let message = refusal_with(
        limits,
        r#"(module (memory (export "memory") 17) (func (export "spindle_alloc") (param i32) (result i32) (i32.const 0))
            (func (export "m") (param i32 i32)))"#,
    );
    // Pooled instances check it as the module compiles, on demand ones as the ABI is checked.
    assert!(
        message.contains("starts at 1114112 bytes, over the limit of 1048576 bytes")
            || message.contains("minimum byte size of 1114112 which exceeds the limit of 0x100000 bytes"),
        "{message}"
    );
}

#[test]
fn refuses_shared_memory() {
    let message = refusal(
        r#"(module (memory (export "memory") 1 1 shared) (func (export "spindle_alloc") (param i32) (result i32) (i32.const 0))
            (func (export "m") (param i32 i32)))"#,
    );
    assert!(message.contains("shared") || message.contains("threads"), "{message}");
}

// --- calls ------------------------------------------------------------------------------

#[test]
fn methods_are_the_abi_functions_sorted() {
    let code = guest();
    let methods = code.methods();
    assert!(methods.windows(2).all(|w| w[0] < w[1]), "{methods:?}");
    for expected in ["echo", "load", "store", "spin", "nan"] {
        assert!(methods.iter().any(|m| m == expected), "{expected} in {methods:?}");
    }
    for hidden in [
        "init",
        "_private",
        "spindle_internal",
        "spindle_alloc",
        "memory",
        "a_global",
    ] {
        assert!(!methods.iter().any(|m| m == hidden), "{hidden} in {methods:?}");
    }
}

#[test]
fn a_call_gets_its_arguments_as_one_msgpack_array_and_replies() {
    let called = guest()
        .call(b"", "echo", &[Value::from(5), Value::from("five")])
        .unwrap();
    assert_eq!(called.result, Value::Array(vec![Value::from(5), Value::from("five")]));
    assert_eq!(called.state, None, "echo writes no state");

    let called = guest().call(b"", "store", &[]).unwrap();
    assert_eq!(called.result, Value::Nil, "no reply is nil");
}

#[test]
fn state_round_trips_through_calls() {
    let code = guest();
    let stored = code.call(b"old", "store", &args(&[1, 2, 3])).unwrap();
    let state = stored.state.expect("store writes the state");
    assert_eq!(state, msgpack(&Value::Array(args(&[1, 2, 3]))));

    let loaded = code.call(&state, "load", &[]).unwrap();
    assert_eq!(loaded.result, Value::Array(args(&[1, 2, 3])));
    assert_eq!(loaded.state, None);

    let big = msgpack(&Value::Binary(vec![7; 200_000]));
    assert_eq!(
        code.call(&big, "load", &[]).unwrap().result,
        Value::Binary(vec![7; 200_000])
    );
}

#[test]
fn every_call_runs_on_a_fresh_instance() {
    let code = guest();
    for _ in 0..3 {
        assert_eq!(code.call(b"", "count_calls", &[]).unwrap().result, Value::from(1));
    }
}

#[test]
fn construct_runs_init_or_gives_empty_state() {
    let code = guest();
    assert_eq!(
        code.construct(&args(&[10])).unwrap(),
        msgpack(&Value::Array(args(&[10])))
    );

    let without_init = load_with(
        Limits::default(),
        &format!(r#"(module {MEMORY_AND_ALLOC} (func (export "m") (param i32 i32)))"#),
    )
    .unwrap();
    assert_eq!(without_init.construct(&[]).unwrap(), Vec::<u8>::new());
    let error = without_init.construct(&args(&[1])).unwrap_err();
    assert_eq!(error.kind, ErrorKind::BadArguments);
    assert!(error.message.contains("no constructor"), "{}", error.message);
}

#[test]
fn an_unknown_method_is_named() {
    let error = guest().call(b"", "withdraw", &[]).unwrap_err();
    assert_eq!(error.kind, ErrorKind::UnknownMethod);
    assert_eq!(error.message, "wasm:test has no method 'withdraw'");
    for not_a_method in ["init", "_private", "spindle_alloc"] {
        assert_eq!(
            guest().call(b"", not_a_method, &[]).unwrap_err().kind,
            ErrorKind::UnknownMethod
        );
    }
}

#[test]
fn fail_raises_the_named_exception_and_keeps_the_state() {
    let error = guest().call(b"old", "refuse", &args(&[1])).unwrap_err();
    assert_eq!(error.kind, ErrorKind::Raised);
    assert_eq!(error.message, "ValueError: insufficient funds");
    assert_eq!(
        error.data,
        Value::Map(vec![
            ("type".into(), "ValueError".into()),
            ("message".into(), "insufficient funds".into()),
            ("traceback".into(), "".into()),
            ("exception".into(), Value::Nil),
        ])
    );
}

// --- limits and traps: each one an error, never a new state -------------------------------

/// The error of `method` under `limits`, the same with either instance allocator.
fn trapped(limits: Limits, method: &str) -> Error {
    let bytes = wat::parse_str(GUEST).unwrap();
    let errors: Vec<Error> = [Allocator::OnDemand, Allocator::Pooling { instances: 4 }]
        .into_iter()
        .map(|allocator| {
            let code = Runtime::with_allocator(limits, allocator)
                .unwrap()
                .load("wasm:test", "1", &bytes)
                .unwrap();
            code.call(b"old", method, &args(&[1])).expect_err("the call fails")
        })
        .collect();
    assert_eq!(errors[0], errors[1], "on demand and pooled");
    errors.into_iter().next().unwrap()
}

#[test]
fn running_out_of_fuel_traps() {
    let error = trapped(
        Limits {
            fuel: 1_000_000,
            ..Limits::default()
        },
        "spin",
    );
    assert_eq!(reason(&error), "fuel");
    assert!(
        error.message.contains("wasm:test.spin ran out of fuel"),
        "{}",
        error.message
    );
    assert!(error.message.contains("1000000 instructions") && error.message.contains("Limits::fuel"));
}

#[test]
fn growing_memory_past_the_limit_traps() {
    let error = trapped(
        Limits {
            memory_bytes: 4 << 20,
            ..Limits::default()
        },
        "hog",
    );
    assert_eq!(reason(&error), "memory");
    assert!(
        error.message.contains("wasm:test.hog") && error.message.contains("4194304"),
        "{}",
        error.message
    );
}

#[test]
fn unbounded_recursion_overflows_the_stack() {
    let error = trapped(Limits::default(), "recurse");
    assert_eq!(reason(&error), "stack");
    assert!(
        error.message.contains("wasm:test.recurse overflowed its stack"),
        "{}",
        error.message
    );
}

#[test]
fn guest_traps_are_reported_with_wasmtimes_description() {
    for (method, description) in [
        ("crash", "unreachable"),
        ("out_of_bounds", "out of bounds memory access"),
        ("divide_by_zero", "integer divide by zero"),
    ] {
        let error = trapped(Limits::default(), method);
        assert_eq!(reason(&error), "trap");
        assert!(
            error.message.contains(&format!("wasm:test.{method} trapped")),
            "{}",
            error.message
        );
        assert!(error.message.contains(description), "{}", error.message);
    }
}

#[test]
fn a_state_over_the_limit_is_refused() {
    let code = load_with(
        Limits {
            state_bytes: 4,
            ..Limits::default()
        },
        GUEST,
    )
    .unwrap();
    let error = code.call(b"", "store", &args(&[1, 2, 3, 4, 5])).unwrap_err();
    assert_eq!(reason(&error), "memory");
    assert!(
        error.message.contains("state of 6 bytes refused: the limit is 4 bytes"),
        "{}",
        error.message
    );
    assert!(code.call(b"", "store", &args(&[1, 2, 3])).is_ok(), "4 bytes fit");
}

#[test]
fn pointers_outside_the_guest_memory_are_errors() {
    for (method, import) in [
        ("reply_out_of_bounds", "spindle.reply was given bytes [65530, 65630)"),
        ("reply_negative_length", "spindle.reply was given bytes [0, 4294967295)"),
        (
            "write_state_out_of_bounds",
            "spindle.state_write was given bytes [4294967288, 4294967304)",
        ),
        ("fail_out_of_bounds", "spindle.fail was given bytes [70000, 70018)"),
    ] {
        let error = guest().call(b"", method, &[]).unwrap_err();
        assert_eq!(reason(&error), "trap", "{method}");
        assert!(error.message.contains(import), "{method}: {}", error.message);
        assert!(
            error.message.contains("outside the guest's memory of 65536 bytes"),
            "{}",
            error.message
        );
    }
    let error = guest()
        .call(b"0123456789", "read_state_out_of_bounds", &[])
        .unwrap_err();
    assert!(
        error
            .message
            .contains("spindle.state_read was given bytes [65535, 65545)"),
        "{}",
        error.message
    );
}

#[test]
fn a_bad_pointer_from_spindle_alloc_is_an_error() {
    let code = load_with(
        Limits::default(),
        r#"(module (memory (export "memory") 1)
            (func (export "spindle_alloc") (param i32) (result i32) (i32.const 65535))
            (func (export "m") (param i32 i32)))"#,
    )
    .unwrap();
    let error = code.call(b"", "m", &args(&[1, 2])).unwrap_err();
    assert_eq!(reason(&error), "trap");
    assert!(
        error.message.contains("spindle_alloc(3) returned 65535"),
        "{}",
        error.message
    );
}

#[test]
fn a_reply_must_be_one_msgpack_value() {
    for (method, expected) in [
        ("reply_garbage", "not a MessagePack value"),
        ("reply_two_values", "one MessagePack value and 1 more bytes"),
        ("reply_truncated", "not a MessagePack value"),
    ] {
        let error = guest().call(b"", method, &args(&[1, 2])).unwrap_err();
        assert_eq!(reason(&error), "trap");
        assert!(error.message.contains(expected), "{method}: {}", error.message);
    }
}

#[test]
fn nans_are_canonical() {
    let canonical = f64::from_bits(0x7ff8_0000_0000_0000).to_bits().to_le_bytes().to_vec();
    for method in ["nan", "nan_payload"] {
        let called = guest().call(b"", method, &[]).unwrap();
        assert_eq!(called.result, Value::Binary(canonical.clone()), "{method}");
    }
}

// --- the runtime ------------------------------------------------------------------------

#[test]
fn the_same_bytes_load_once() {
    let runtime = runtime(Limits::default());
    let bytes = wat::parse_str(GUEST).unwrap();
    let first = runtime.load("wasm:a", "1", &bytes).unwrap();
    let again = runtime.load("wasm:a", "2", &bytes).unwrap();
    assert!(
        Arc::ptr_eq(&first, &again),
        "a second load of the same bytes is the cached module"
    );

    let other_name = runtime.load("wasm:b", "1", &bytes).unwrap();
    assert!(
        !Arc::ptr_eq(&first, &other_name),
        "another type has its own name in messages"
    );
    assert_eq!(
        other_name.call(b"", "nope", &[]).unwrap_err().message,
        "wasm:b has no method 'nope'"
    );

    let mut changed = bytes.clone();
    changed.extend_from_slice(&[0, 2, 1, b'x']); // a custom section: other bytes, same code
    let third = runtime.load("wasm:a", "3", &changed).unwrap();
    assert!(!Arc::ptr_eq(&first, &third));
}

#[test]
fn calls_run_concurrently_from_several_threads() {
    for allocator in [Allocator::OnDemand, Allocator::Pooling { instances: 16 }] {
        let runtime = Runtime::with_allocator(Limits::default(), allocator).unwrap();
        let code = runtime.load("wasm:test", "1", &wat::parse_str(GUEST).unwrap()).unwrap();
        let threads: Vec<_> = (0..4i64)
            .map(|thread| {
                let code = code.clone();
                std::thread::spawn(move || {
                    for i in 0..200 {
                        let called = code.call(b"", "store", &args(&[thread, i])).unwrap();
                        let state = called.state.unwrap();
                        let loaded = code.call(&state, "load", &[]).unwrap();
                        assert_eq!(loaded.result, Value::Array(args(&[thread, i])));
                        if i % 50 == 0 {
                            assert_eq!(reason(&code.call(b"", "crash", &[]).unwrap_err()), "trap");
                        }
                    }
                })
            })
            .collect();
        for thread in threads {
            thread.join().expect("no thread panicked");
        }
    }
}

#[test]
fn limits_past_what_the_abi_can_address_are_refused() {
    let error = Runtime::new(Limits {
        state_bytes: 1 << 31,
        ..Limits::default()
    })
    .unwrap_err();
    assert_eq!(error.kind, ErrorKind::BadArguments);
    assert!(error.message.contains("state_bytes"), "{}", error.message);
    assert!(Runtime::new(Limits {
        memory_bytes: 5 << 30,
        ..Limits::default()
    })
    .is_err());
}

#[test]
fn modules_nothing_holds_are_freed() {
    let runtime = runtime(Limits::default());
    let bytes = wat::parse_str(GUEST).unwrap();
    let first = runtime.load("wasm:a", "1", &bytes).unwrap();
    let second = runtime.load("wasm:b", "1", &bytes).unwrap();
    assert_eq!(runtime.modules_held(), 2);
    drop(first);
    assert_eq!(
        runtime.modules_held(),
        1,
        "a module no object or partition holds is freed"
    );
    drop(second);
    assert_eq!(runtime.modules_held(), 0);
    let again = runtime.load("wasm:a", "2", &bytes).unwrap();
    assert_eq!(
        again.call(b"", "echo", &args(&[1])).unwrap().result,
        Value::Array(args(&[1]))
    );
    assert_eq!(runtime.modules_held(), 1);
}

#[test]
fn a_call_past_the_pools_instances_is_busy_and_the_next_runs() {
    let limits = Limits {
        fuel: 2_000_000_000, // "spin" runs for a second or more
        ..Limits::default()
    };
    let runtime = Runtime::with_allocator(limits, Allocator::Pooling { instances: 1 }).unwrap();
    let code = runtime.load("wasm:test", "1", &wat::parse_str(GUEST).unwrap()).unwrap();
    let spinning = {
        let code = code.clone();
        // Refused too while this thread's own calls below hold the instance: it tries again.
        std::thread::spawn(move || loop {
            let error = code.call(b"", "spin", &[]).unwrap_err();
            if error.kind != ErrorKind::Busy {
                return error;
            }
        })
    };
    // Calls made while the spinning one holds the only instance are refused, not queued.
    let mut busy = None;
    while busy.is_none() && !spinning.is_finished() {
        busy = code.call(b"", "echo", &[]).err();
    }
    let busy = busy.expect("a call was refused while the only instance was taken");
    assert_eq!(busy.kind, ErrorKind::Busy, "{busy:?}");
    assert!(busy.message.contains("try again"), "{}", busy.message);
    assert_eq!(reason(&spinning.join().unwrap()), "fuel");
    assert_eq!(
        code.call(b"", "echo", &args(&[7])).unwrap().result,
        Value::Array(args(&[7]))
    );
}
