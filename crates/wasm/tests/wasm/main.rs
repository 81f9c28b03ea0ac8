//! The runtime's tests, one binary (each test binary links wasmtime, which is slow in release).

mod examples;
mod runtime;
