//! The example object types of examples/wasm/, built by `make wasm` (C and AssemblyScript),
//! run through the runtime: they keep the ABI and compute what their Python twins compute.

use std::sync::Arc;

use spindle_core::objects::compiled::{Code, Library};
use spindle_core::{Error, ErrorKind, Value};
use spindle_wasm::{Limits, Runtime};

fn example(file: &str) -> Arc<dyn Code> {
    let path = format!("{}/../../examples/wasm/build/{file}", env!("CARGO_MANIFEST_DIR"));
    let bytes = std::fs::read(&path).unwrap_or_else(|e| {
        panic!("examples/wasm/build/{file} cannot be read ({e}): run `make wasm` to build the examples")
    });
    let runtime = Runtime::new(Limits::default()).unwrap();
    runtime
        .load(&format!("wasm:{}", file.trim_end_matches(".wasm")), "1", &bytes)
        .unwrap()
}

fn msgpack(value: impl Into<Value>) -> Vec<u8> {
    let mut bytes = Vec::new();
    rmpv::encode::write_value(&mut bytes, &value.into()).unwrap();
    bytes
}

fn raised(error: &Error) -> (&str, &str) {
    assert_eq!(error.kind, ErrorKind::Raised, "{error:?}");
    let Value::Map(entries) = &error.data else {
        panic!("{error:?}")
    };
    let field = |name: &str| {
        entries
            .iter()
            .find(|(k, _)| k.as_str() == Some(name))
            .unwrap()
            .1
            .as_str()
            .unwrap()
    };
    (field("type"), field("message"))
}

/// Call `method` and return its result and the state after it (the old one if it wrote none).
fn call(code: &Arc<dyn Code>, state: &[u8], method: &str, args: &[Value]) -> (Value, Vec<u8>) {
    let called = code
        .call(state, method, args)
        .unwrap_or_else(|e| panic!("{method}: {e:?}"));
    (called.result, called.state.unwrap_or_else(|| state.to_vec()))
}

// --- the bank, in C and in AssemblyScript --------------------------------------------------

fn check_bank(bank: Arc<dyn Code>) {
    assert_eq!(bank.methods(), ["balance", "deposit", "transfer", "withdraw"]);
    assert!(bank.makes_calls(), "it imports spindle.call");
    assert_eq!(bank.construct(&[]).unwrap(), msgpack(0), "init(balance=0)");
    let state = bank.construct(&[Value::from(100)]).unwrap();
    assert_eq!(state, msgpack(100));

    let (result, state) = call(&bank, &state, "deposit", &[Value::from(50)]);
    assert_eq!((result, &state), (Value::from(150), &msgpack(150)));
    let (result, state) = call(&bank, &state, "withdraw", &[Value::from(30)]);
    assert_eq!((result, &state), (Value::from(120), &msgpack(120)));

    let error = bank.call(&state, "withdraw", &[Value::from(500)]).unwrap_err();
    assert_eq!(raised(&error), ("ValueError", "insufficient funds"));
    assert_eq!(error.message, "ValueError: insufficient funds");

    let (result, after) = call(&bank, &state, "balance", &[]);
    assert_eq!(
        (result, after),
        (Value::from(120), msgpack(120)),
        "balance writes nothing"
    );

    let big = 1i64 << 40; // past 32 bits: the full int64 path of both MessagePack codecs
    let (result, _) = call(&bank, &state, "deposit", &[Value::from(big)]);
    assert_eq!(result, Value::from(120 + big));

    assert_eq!(
        raised(&bank.call(&state, "deposit", &[Value::from(-1)]).unwrap_err()).0,
        "ValueError"
    );
    assert_eq!(
        raised(&bank.call(&state, "deposit", &[Value::from("ten")]).unwrap_err()).0,
        "TypeError"
    );
    assert_eq!(raised(&bank.call(&state, "deposit", &[]).unwrap_err()).0, "TypeError");
    let overflow = bank.call(&msgpack(i64::MAX), "deposit", &[Value::from(1)]).unwrap_err();
    assert_eq!(raised(&overflow).0, "OverflowError");
    assert_eq!(
        bank.call(&state, "steal", &[]).unwrap_err().kind,
        ErrorKind::UnknownMethod
    );
    check_transfer(&bank, &state);
}

/// `transfer(to, n)` deposits into `to` first (a nested call), then withdraws here.
fn check_transfer(bank: &Arc<dyn Code>, state: &[u8]) {
    let args = [Value::from("bob"), Value::from(20)];
    // Its first run stops at the call whose reply is not known, naming it.
    let asked = bank.run(state, "transfer", &args, &[]).unwrap_err();
    assert_eq!(asked.kind, ErrorKind::NestedCall);
    assert_eq!(
        asked.data,
        Value::Array(vec!["bob".into(), "deposit".into(), Value::Array(vec![20.into()])])
    );
    // Run again with that call's reply, it finishes.
    let called = bank.run(state, "transfer", &args, &[Ok(Value::from(20))]).unwrap();
    assert_eq!(called.result, Value::from(100));
    assert_eq!(called.state.unwrap(), msgpack(100));
    // A nested call that raised: the method raises the same, under the exception's name.
    let refused = Error::new(ErrorKind::Raised, "ValueError: no").with_data(Value::Map(vec![
        ("type".into(), "ValueError".into()),
        ("message".into(), "no".into()),
    ]));
    let error = bank.run(state, "transfer", &args, &[Err(refused)]).unwrap_err();
    assert_eq!(raised(&error), ("ValueError", "no"));
    let missing = Error::new(ErrorKind::NotFound, "'bob' does not exist");
    let error = bank.run(state, "transfer", &args, &[Err(missing)]).unwrap_err();
    assert_eq!(raised(&error), ("NotFound", "'bob' does not exist"));
    // Short of funds after the deposit: it fails (the server's transaction undoes the deposit).
    let error = bank
        .run(
            state,
            "transfer",
            &[Value::from("bob"), Value::from(500)],
            &[Ok(Value::from(500))],
        )
        .unwrap_err();
    assert_eq!(raised(&error), ("ValueError", "insufficient funds"));
    // A constructor cannot call: only methods run in the driver's transaction.
    assert_eq!(bank.construct(&[Value::from(1)]).unwrap(), msgpack(1));
}

#[test]
fn bank_in_c() {
    check_bank(example("bank.wasm"));
}

#[test]
fn bank_in_assemblyscript() {
    check_bank(example("bank_as.wasm"));
}

#[test]
fn the_two_banks_read_each_others_state() {
    let (c, assemblyscript) = (example("bank.wasm"), example("bank_as.wasm"));
    let (_, state) = call(
        &c,
        &c.construct(&[Value::from(7)]).unwrap(),
        "deposit",
        &[Value::from(5)],
    );
    let (result, state) = call(&assemblyscript, &state, "deposit", &[Value::from(1)]);
    assert_eq!(result, Value::from(13));
    assert_eq!(call(&c, &state, "balance", &[]).0, Value::from(13));
}

// --- the benchmark's operation ----------------------------------------------------------------

/// bench/shared_objects.py's Number.spin: Python ints, so the modulo is never negative.
fn spin(mut x: i128, steps: usize) -> i128 {
    for _ in 0..steps {
        x = (x * 31 + 7).rem_euclid(1_000_003);
    }
    x
}

#[test]
fn complex_op_matches_the_python_arithmetic() {
    let code = example("complex_op.wasm");
    assert_eq!(code.construct(&[]).unwrap(), msgpack(1), "init(x=1), as Number's");
    for x in [1i64, 0, 12345, 1_000_002, -5, -1_000_000_007, i64::MAX, i64::MIN] {
        let state = code.construct(&[Value::from(x)]).unwrap();
        let (result, after) = call(&code, &state, "complex", &[]);
        let expected = spin(x as i128, 10_000) as i64;
        assert_eq!(
            (result, &after),
            (Value::from(expected), &msgpack(expected)),
            "complex() from {x}"
        );
        let (result, after) = call(&code, &after, "simple", &[]);
        assert_eq!(result, Value::from(spin(x as i128, 10_001) as i64));
        let (result, _) = call(&code, &after, "spin", &[Value::from(1000)]);
        assert_eq!(result, Value::from(spin(x as i128, 11_001) as i64));
        assert_eq!(
            call(&code, &state, "spin", &[Value::from(0)]).0,
            Value::from(x),
            "spin(0) keeps x as is"
        );
    }
}

// --- k-means centroids ------------------------------------------------------------------------

/// examples/kmeans.py's GlobalCentroids.update, in Rust: the parts sorted by the bytes of
/// their counts then sums, added up in that order, then the means and the largest move.
fn centroids_update(old: &[Vec<f64>], parts: &[(Vec<Vec<f64>>, Vec<f64>)]) -> (Vec<Vec<f64>>, f64) {
    let bytes = |values: &[f64]| values.iter().flat_map(|v| v.to_le_bytes()).collect::<Vec<u8>>();
    let mut sorted: Vec<_> = parts.iter().collect();
    sorted.sort_by_key(|(sums, counts)| (bytes(counts), bytes(&sums.concat())));
    let (k, dims) = (old.len(), old[0].len());
    let mut sums = vec![vec![0.0; dims]; k];
    let mut counts = vec![0.0; k];
    for (part_sums, part_counts) in sorted {
        for i in 0..k {
            counts[i] += part_counts[i];
            for j in 0..dims {
                sums[i][j] += part_sums[i][j];
            }
        }
    }
    let mut shift: f64 = 0.0;
    let new: Vec<Vec<f64>> = (0..k)
        .map(|i| {
            (0..dims)
                .map(|j| {
                    let value = if counts[i] > 0.0 {
                        sums[i][j] / counts[i].max(1.0)
                    } else {
                        old[i][j]
                    };
                    shift = shift.max((value - old[i][j]).abs());
                    value
                })
                .collect()
        })
        .collect();
    (new, shift)
}

fn rows(rows: &[Vec<f64>]) -> Value {
    Value::Array(
        rows.iter()
            .map(|row| Value::Array(row.iter().map(|&v| Value::from(v)).collect()))
            .collect(),
    )
}

fn floats(values: &[f64]) -> Value {
    Value::Array(values.iter().map(|&v| Value::from(v)).collect())
}

fn float64_bytes(values: &[f64]) -> Value {
    Value::Binary(values.iter().flat_map(|v| v.to_le_bytes()).collect())
}

/// A few numbers that do not add up exactly in floating point, so the order matters.
fn noise(seed: u64, n: usize) -> Vec<f64> {
    let mut x = seed;
    (0..n)
        .map(|_| {
            x = x.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            ((x >> 11) as f64 / (1u64 << 53) as f64 - 0.5) * 1e3
        })
        .collect()
}

#[test]
fn kmeans_centroids_match_the_python_class() {
    let code = example("kmeans.wasm");
    assert_eq!(code.methods(), ["get", "update"]);
    let (k, dims, parts) = (4, 3, 3);
    let initial: Vec<Vec<f64>> = (0..k).map(|i| noise(i as u64, dims)).collect();
    let mut state = code.construct(&[rows(&initial), Value::from(parts)]).unwrap();
    assert_eq!(call(&code, &state, "get", &[]).0, rows(&initial));

    let mut centroids = initial.clone();
    for iteration in 0..3u64 {
        let parts: Vec<(Vec<Vec<f64>>, Vec<f64>)> = (0..parts as u64)
            .map(|p| {
                let sums = (0..k)
                    .map(|i| noise(100 * iteration + 10 * p + i as u64, dims))
                    .collect();
                let mut counts: Vec<f64> = noise(7 + iteration * 3 + p, k)
                    .iter()
                    .map(|c| (c.abs() / 50.0).floor())
                    .collect();
                counts[3] = 0.0; // cluster 3 stays empty: it keeps its centroid
                (sums, counts)
            })
            .collect();
        let (expected, expected_shift) = centroids_update(&centroids, &parts);
        // The parts arrive in reverse order; the result is the sorted order's all the same.
        for (n, (sums, counts)) in parts.iter().rev().enumerate() {
            // Lists of numbers or bytes of float64s, as the caller likes.
            let args = if n % 2 == 0 {
                [rows(sums), floats(counts)]
            } else {
                [float64_bytes(&sums.concat()), float64_bytes(counts)]
            };
            let (result, after) = call(&code, &state, "update", &args);
            state = after;
            if n + 1 < parts.len() {
                assert_eq!(result, Value::Nil, "part {n} of {}", parts.len());
            } else {
                assert_eq!(
                    result.as_f64().unwrap().to_bits(),
                    expected_shift.to_bits(),
                    "iteration {iteration}"
                );
            }
        }
        assert_eq!(
            call(&code, &state, "get", &[]).0,
            rows(&expected),
            "iteration {iteration}"
        );
        assert_eq!(expected[3], centroids[3]);
        centroids = expected;
    }

    let error = code
        .call(&state, "update", &[floats(&[1.0]), floats(&[1.0])])
        .unwrap_err();
    assert_eq!(raised(&error).0, "ValueError");
    let error = code.construct(&[Value::Array(vec![]), Value::from(1)]).unwrap_err();
    assert_eq!(raised(&error).0, "ValueError");
}

// --- the guest SDKs' MessagePack and helpers (sdk/wasm/tests/echo.c and echo.ts) ------------

fn every_kind_of_value() -> Vec<Value> {
    let ints = [
        0i64,
        1,
        127,
        128,
        255,
        256,
        65535,
        65536,
        u32::MAX as i64,
        u32::MAX as i64 + 1,
        i64::MAX,
        -1,
        -32,
        -33,
        -128,
        -129,
        -32768,
        -32769,
        i32::MIN as i64,
        i32::MIN as i64 - 1,
        i64::MIN,
    ];
    let text = |n: usize| Value::from("x".repeat(n));
    let list = |n: usize| Value::Array(vec![Value::from(1); n]);
    let map = |n: usize| Value::Map((0..n as i64).map(|i| (Value::from(i), Value::from(-i))).collect());
    let mut values = vec![Value::Nil, Value::from(true), Value::from(false)];
    values.extend(ints.iter().map(|&i| Value::from(i)));
    values.extend([1.5, -0.0, f64::INFINITY, f64::MIN_POSITIVE, 1e300].map(Value::from));
    values.extend([
        text(0),
        text(31),
        text(32),
        text(255),
        text(256),
        text(70_000),
        Value::from("é ✓ 雪"),
    ]);
    values.extend([0, 255, 256, 70_000].map(|n| Value::Binary(vec![7; n])));
    values.extend([
        list(0),
        list(15),
        list(16),
        list(70_000),
        map(0),
        map(15),
        map(16),
        map(70_000),
    ]);
    values.push(Value::Array(vec![
        map(2),
        Value::Array(vec![Value::Array(vec![Value::from("deep")])]),
    ]));
    values
}

fn check_sdk(code: Arc<dyn Code>, state_method: &str, fail_method: &str) {
    let values = every_kind_of_value();
    let called = code.call(b"", "echo", &values).unwrap();
    assert_eq!(called.result, Value::Array(values.clone()));
    // The SDK writes what rmpv writes: the shortest form, unsigned for non-negative ints.
    assert_eq!(called.state.unwrap(), msgpack(Value::Array(values.clone())));
    assert_eq!(
        code.call(b"", "skip", &values).unwrap().result,
        Value::from(values.len())
    );

    let too_large = code.call(b"", "echo", &[Value::from(u64::MAX)]).unwrap_err();
    assert_eq!(raised(&too_large), ("OverflowError", "integer does not fit in 64 bits"));
    let ext = code.call(b"", "echo", &[Value::Ext(1, vec![1, 2])]).unwrap_err();
    assert_eq!(raised(&ext).0, "TypeError");
    assert_eq!(
        code.call(b"", "skip", &[Value::Ext(1, vec![1, 2, 3])]).unwrap().result,
        Value::from(1)
    );

    let raw = b"\x00\x01raw state\xff";
    assert_eq!(
        code.call(raw, state_method, &[]).unwrap().result,
        Value::Binary(raw.to_vec())
    );
    let error = code
        .call(raw, fail_method, &[Value::from("KeyError"), Value::from("no such key")])
        .unwrap_err();
    assert_eq!(raised(&error), ("KeyError", "no such key"));
    check_relay(&code);
}

/// The SDK's nested calls: `relay(key, method, args)` replies `[ok, value]`.
fn check_relay(code: &Arc<dyn Code>) {
    let inner = Value::Array(vec![1.into(), Value::Array(vec!["x".into()])]);
    let args = [Value::from("other"), Value::from("get"), inner.clone()];
    let asked = code.run(b"", "relay", &args, &[]).unwrap_err();
    assert_eq!(asked.kind, ErrorKind::NestedCall);
    assert_eq!(asked.data, Value::Array(vec!["other".into(), "get".into(), inner]));
    let returned = Value::Map(vec![("deep".into(), Value::Array(vec![Value::Nil, 2.5.into()]))]);
    let called = code.run(b"", "relay", &args, &[Ok(returned.clone())]).unwrap();
    assert_eq!(called.result, Value::Array(vec![true.into(), returned.clone()]));
    let failed = Err(Error::new(ErrorKind::KeyError, "'x'"));
    let called = code.run(b"", "relay", &args, std::slice::from_ref(&failed)).unwrap();
    assert_eq!(
        called.result,
        Value::Array(vec![false.into(), Value::Array(vec!["KeyError".into(), "'x'".into()])])
    );
    let called = code.run(b"", "relay_or_fail", &args, &[Ok(returned.clone())]).unwrap();
    assert_eq!(called.result, returned);
    let error = code.run(b"", "relay_or_fail", &args, &[failed]).unwrap_err();
    assert_eq!(raised(&error), ("KeyError", "'x'"));
    // Arguments that are not one array break the ABI: the call fails, nothing is asked.
    let error = code
        .run(
            b"",
            "relay",
            &[Value::from("other"), Value::from("get"), Value::from(3)],
            &[],
        )
        .unwrap_err();
    assert_eq!(error.kind, ErrorKind::Trapped, "{error:?}");
}

#[test]
fn c_sdk() {
    let code = example("sdk_echo.wasm");
    check_sdk(code.clone(), "state", "fail");
    let error = code.call(b"", "allocate", &[Value::from(100 << 20)]).unwrap_err();
    assert_eq!(error.kind, ErrorKind::Trapped);
    assert_eq!(error.data, Value::Map(vec![("reason".into(), "memory".into())]));
    assert_eq!(
        code.call(b"", "allocate", &[Value::from(1 << 20)]).unwrap().result,
        Value::from(1)
    );
}

#[test]
fn assemblyscript_sdk() {
    let code = example("sdk_echo_as.wasm");
    check_sdk(code.clone(), "state_bytes", "raise");
    let error = code.call(b"", "out_of_range", &[]).unwrap_err();
    let (kind, message) = raised(&error);
    assert_eq!(kind, "RuntimeError");
    assert!(
        message.contains("Index out of range") && message.contains("~lib/array.ts"),
        "{message}"
    );
    let error = code.call(b"", "throws", &[]).unwrap_err();
    let (kind, message) = raised(&error);
    assert_eq!(kind, "RuntimeError");
    assert!(
        message.starts_with("thrown on purpose (sdk/wasm/tests/echo.ts:"),
        "{message}"
    );
}
