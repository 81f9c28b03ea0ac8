//! The cost of one call beyond the method's own work: a fresh instance, `spindle_alloc`, the
//! arguments, the method, the reply. Compares the on-demand and the pooling instance
//! allocators, from one thread and from several.
//!
//!     cargo run --release -p spindle-wasm --example call_overhead [calls]
//!
//! Also times the example bank's `balance` (examples/wasm/build/bank.wasm, `make wasm`).

use std::sync::Arc;
use std::time::Instant;

use spindle_core::objects::compiled::{Code, Library};
use spindle_core::Value;
use spindle_wasm::{Allocator, Limits, Runtime};

/// The smallest method that keeps the ABI: it replies `nil`.
const TRIVIAL: &str = r#"(module
  (import "spindle" "reply" (func $reply (param i32 i32)))
  (memory (export "memory") 1)
  (data (i32.const 16) "\c0")
  (func (export "spindle_alloc") (param i32) (result i32) (i32.const 1024))
  (func (export "noop") (param i32 i32) (call $reply (i32.const 16) (i32.const 1))))"#;

fn time(code: &Arc<dyn Code>, method: &str, state: &[u8], threads: usize, calls: usize) -> f64 {
    let start = Instant::now();
    std::thread::scope(|scope| {
        for _ in 0..threads {
            scope.spawn(|| {
                for _ in 0..calls {
                    code.call(state, method, &[]).expect("the call succeeds");
                }
            });
        }
    });
    start.elapsed().as_secs_f64() * 1e6 / calls as f64
}

fn main() {
    let calls: usize = std::env::args()
        .nth(1)
        .map(|n| n.parse().expect("a number of calls"))
        .unwrap_or(20_000);
    let bank = std::fs::read(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../examples/wasm/build/bank.wasm"
    ))
    .ok();
    let mut state = Vec::new();
    rmpv::encode::write_value(&mut state, &Value::from(100)).unwrap();
    let threads = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1);
    println!("per call, microseconds (wall time / calls of one thread)");
    println!(
        "{:<40} {:>10} {:>14}",
        "allocator / method",
        "1 thread",
        format!("{threads} threads")
    );
    for allocator in [Allocator::OnDemand, Allocator::Pooling { instances: 64 }] {
        let runtime = Runtime::with_allocator(Limits::default(), allocator).unwrap();
        let mut cases = vec![(
            "noop",
            runtime
                .load("wasm:trivial", "1", &wat::parse_str(TRIVIAL).unwrap())
                .unwrap(),
        )];
        if let Some(bank) = &bank {
            cases.push(("balance", runtime.load("wasm:bank", "1", bank).unwrap()));
        }
        for (method, code) in cases {
            time(&code, method, &state, 1, calls / 10); // warm up
            let one = time(&code, method, &state, 1, calls);
            let many = time(&code, method, &state, threads, calls);
            println!("{:<40} {one:>10.2} {many:>14.2}", format!("{allocator:?} / {method}"));
        }
    }
    if bank.is_none() {
        println!("(examples/wasm/build/bank.wasm is missing: run `make wasm` to time the bank too)");
    }
}
