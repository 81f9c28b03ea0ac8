// A check of the AssemblyScript SDK (crates/wasm/tests/wasm/examples.rs loads it as
// sdk_echo_as.wasm): every MessagePack value goes through the SDK's reader and writer and
// comes back equal.

import {
  Args, Reader, Type, Writer, call, callOrFail, fail, reply, setStateWriter, state,
} from "../assemblyscript/assembly/index";

export { spindle_alloc } from "../assemblyscript/assembly/index";

/** Read one value and write it again, recursively. */
function copy(r: Reader, w: Writer): void {
  switch (r.peek()) {
    case Type.Nil: r.nil(); w.nil(); break;
    case Type.Bool: w.bool(r.bool()); break;
    case Type.Int: w.int(r.int()); break;
    case Type.Float: w.float(r.float()); break;
    case Type.Str: w.str(r.str()); break;
    case Type.Bin: w.bin(r.bin()); break;
    case Type.Array: {
      const n = r.array();
      w.array(n);
      for (let i: u32 = 0; i < n; i++) copy(r, w);
      break;
    }
    case Type.Map: {
      const n = r.map();
      w.map(n);
      for (let i: u32 = 0; i < 2 * n; i++) copy(r, w);
      break;
    }
    default: fail("TypeError", "echo copies no ext values");
  }
}

/** echo(*values) -> [values...], and the arguments become the state. */
export function echo(argsPtr: i32, argsLen: i32): void {
  const args = Args.of(argsPtr, argsLen);
  const w = new Writer().array(args.count);
  while (args.count > 0) copy(args.next(), w);
  setStateWriter(w);
  reply(w);
}

/** skip(*values) -> the number of values skipped. */
export function skip(argsPtr: i32, argsLen: i32): void {
  const args = Args.of(argsPtr, argsLen);
  let n: i64 = 0;
  for (; args.count > 0; n++) args.next().skip();
  reply(new Writer().int(n));
}

/** state() -> the state's bytes. */
export function state_bytes(argsPtr: i32, argsLen: i32): void {
  Args.of(argsPtr, argsLen).expect(0, 0);
  reply(new Writer().bin(Uint8Array.wrap(state())));
}

/** fail(kind, message): raises. */
export function raise(argsPtr: i32, argsLen: i32): void {
  const args = Args.of(argsPtr, argsLen);
  const kind = args.str();
  fail(kind, args.str());
}

/** An AssemblyScript runtime error: routed to fail("RuntimeError", ...) by --use abort=. */
export function out_of_range(argsPtr: i32, argsLen: i32): void {
  Args.of(argsPtr, argsLen);
  const list = new Array<i32>(2);
  reply(new Writer().int(list[5]));
}

/** A throw: the same. */
export function throws(argsPtr: i32, argsLen: i32): void {
  Args.of(argsPtr, argsLen);
  throw new Error("thrown on purpose");
}

/** The arguments of a nested call: the next argument copied as it is, any value (a list,
 * normally), or None for none (a null writer). */
function callArgs(args: Args): Writer | null {
  const value = args.next();
  if (value.peek() == Type.Nil) {
    value.nil();
    return null;
  }
  return new Writer().value(value);
}

/** relay(key, method, args) -> [ok, value]: calls key.method(*args) (a nested call); ok is
 * true and value its result when it returned, false and [kind, message] when it raised. The
 * reply becomes the state. */
export function relay(argsPtr: i32, argsLen: i32): void {
  const args = Args.of(argsPtr, argsLen);
  args.expect(3, 3);
  const key = args.str();
  const method = args.str();
  const result = call(key, method, callArgs(args));
  const w = new Writer().array(2).bool(result.ok).value(result.reader);
  setStateWriter(w);
  reply(w);
}

/** relay_or_fail(key, method, args) -> value: the same, raising the nested call's error as
 * its own; the result becomes the state. */
export function relay_or_fail(argsPtr: i32, argsLen: i32): void {
  const args = Args.of(argsPtr, argsLen);
  args.expect(3, 3);
  const key = args.str();
  const method = args.str();
  const w = new Writer().value(callOrFail(key, method, callArgs(args)));
  setStateWriter(w);
  reply(w);
}
