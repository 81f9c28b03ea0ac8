// Write a Spindle compiled object type (wasm:<name>) in AssemblyScript.
//
// An object is a state (bytes the server keeps) and methods: every exported function
// `(argsPtr: i32, argsLen: i32): void` of the entry file is a method, `init` is the
// constructor. Every call runs on a fresh instance, so the stub runtime (which never frees)
// is all a method needs. Build with the flags in examples/wasm/Makefile.wasm:
//
//     asc bank.ts --runtime stub --use abort=spindleAbort -O3 -o bank.wasm
//
//     import { Args, fail, stateInt, setStateInt, replyInt } from "<this directory>/index";
//     export { spindle_alloc, spindleAbort } from "<this directory>/index";
//
//     export function deposit(argsPtr: i32, argsLen: i32): void {
//       const args = Args.of(argsPtr, argsLen);   // the positional arguments
//       const balance = stateInt(0) + args.int();
//       setStateInt(balance);
//       replyInt(balance);
//     }
//
// A reader that meets another type than it expects fails the call with TypeError;
// fail("ValueError", "insufficient funds") raises that exception in the caller and leaves
// the state as it was. The ABI is in docs/wasm.md.
//
// A method may call a method of another object (a nested call, docs/wasm.md "Nested calls"):
//
//     const r = callOrFail("bob", "deposit", new Writer().array(1).int(amount));
//     const bobs = r.int();     // bob's reply; bob's error is raised as this method's own
//
// The nested call runs in the caller's transaction: if the method fails afterwards, bob's
// deposit is undone too. The server runs the method again from its start for every nested
// call whose result it does not know yet, handing back the earlier results in order, so a
// method makes the same calls in the same order given the same state and arguments, and
// makes them before its expensive work where it can.

// ---- the host's functions (docs/wasm.md, "Imports") ----------------------------------------

// @ts-ignore: decorator
@external("spindle", "state_len")
declare function host_state_len(): i32;
// @ts-ignore: decorator
@external("spindle", "state_read")
declare function host_state_read(ptr: usize): void;
// @ts-ignore: decorator
@external("spindle", "state_write")
declare function host_state_write(ptr: usize, len: i32): void;
// @ts-ignore: decorator
@external("spindle", "reply")
declare function host_reply(ptr: usize, len: i32): void;
// @ts-ignore: decorator
@external("spindle", "fail")
declare function host_fail(kindPtr: usize, kindLen: i32, msgPtr: usize, msgLen: i32): void;
// @ts-ignore: decorator
@external("spindle", "call")
declare function host_call(
  keyPtr: usize, keyLen: i32, methodPtr: usize, methodLen: i32, argsPtr: usize, argsLen: i32,
): i32;
// @ts-ignore: decorator
@external("spindle", "result_read")
declare function host_result_read(ptr: usize): void;

// ---- memory and failing ---------------------------------------------------------------------

/** Where the host writes a call's arguments (the ABI's `spindle_alloc`): re-export it. */
export function spindle_alloc(len: i32): i32 {
  return <i32>heap.alloc(<usize>len);
}

/** Raise `kind` (a Python builtin exception name) with `message` in the caller. Never
 * returns; the object's state stays as it was. */
export function fail(kind: string, message: string): void {
  const k = String.UTF8.encode(kind);
  const m = String.UTF8.encode(message);
  host_fail(changetype<usize>(k), k.byteLength, changetype<usize>(m), m.byteLength);
  unreachable();
}

/** AssemblyScript's `abort` (a failed assertion, an index out of range, `throw`): routed
 * here with `--use abort=...` so the module needs no `env.abort` import. */
export function spindleAbort(message: string | null, fileName: string | null, line: u32, column: u32): void {
  let text = message !== null ? message : "abort";
  if (fileName !== null) text += " (" + fileName + ":" + line.toString() + ":" + column.toString() + ")";
  fail("RuntimeError", text);
}

// ---- reading MessagePack ----------------------------------------------------------------------

export enum Type { Nil, Bool, Int, Float, Str, Bin, Array, Map, Ext, End }

/** Reads MessagePack values one after the other from guest memory. */
export class Reader {
  constructor(public p: usize, public end: usize) {}

  static of(bytes: ArrayBuffer): Reader {
    const p = changetype<usize>(bytes);
    return new Reader(p, p + <usize>bytes.byteLength);
  }

  private take(n: usize): usize {
    if (this.end - this.p < n) fail("ValueError", "truncated MessagePack data");
    const at = this.p;
    this.p += n;
    return at;
  }

  private be(n: usize): u64 {
    const at = this.take(n);
    let v: u64 = 0;
    for (let i: usize = 0; i < n; i++) v = (v << 8) | <u64>load<u8>(at + i);
    return v;
  }

  /** The type of the next value, without reading it. */
  peek(): Type {
    if (this.p >= this.end) return Type.End;
    const m = load<u8>(this.p);
    if (m <= 0x7f || m >= 0xe0) return Type.Int;
    if (m <= 0x8f) return Type.Map;
    if (m <= 0x9f) return Type.Array;
    if (m <= 0xbf) return Type.Str;
    if (m == 0xc0) return Type.Nil;
    if (m == 0xc2 || m == 0xc3) return Type.Bool;
    if (m >= 0xc4 && m <= 0xc6) return Type.Bin;
    if (m == 0xca || m == 0xcb) return Type.Float;
    if (m >= 0xcc && m <= 0xd3) return Type.Int;
    if (m >= 0xd9 && m <= 0xdb) return Type.Str;
    if (m == 0xdc || m == 0xdd) return Type.Array;
    if (m == 0xde || m == 0xdf) return Type.Map;
    return Type.Ext;
  }

  private expect(t: Type, what: string): u8 {
    if (this.peek() != t) fail("TypeError", "expected " + what);
    return load<u8>(this.take(1));
  }

  nil(): void {
    this.expect(Type.Nil, "None");
  }

  bool(): bool {
    return this.expect(Type.Bool, "a bool") == 0xc3;
  }

  /** An integer that fits in i64 (larger ones fail with OverflowError). */
  int(): i64 {
    const m = this.expect(Type.Int, "an int");
    if (m <= 0x7f) return <i64>m;
    if (m >= 0xe0) return <i64><i8>m;
    switch (m) {
      case 0xcc: return <i64>this.be(1);
      case 0xcd: return <i64>this.be(2);
      case 0xce: return <i64>this.be(4);
      case 0xcf: {
        const v = this.be(8);
        if (v > <u64>i64.MAX_VALUE) fail("OverflowError", "integer does not fit in 64 bits");
        return <i64>v;
      }
      case 0xd0: return <i64><i8>this.be(1);
      case 0xd1: return <i64><i16>this.be(2);
      case 0xd2: return <i64><i32>this.be(4);
      default: return <i64>this.be(8);
    }
  }

  /** A float; an int is taken too (as Python would). */
  float(): f64 {
    if (this.peek() == Type.Int) return <f64>this.int();
    const m = this.expect(Type.Float, "a float");
    if (m == 0xca) return <f64>reinterpret<f32>(<u32>this.be(4));
    return reinterpret<f64>(this.be(8));
  }

  str(): string {
    const m = this.expect(Type.Str, "a str");
    const n = m <= 0xbf ? <usize>(m & 0x1f) : <usize>this.be(m == 0xd9 ? 1 : m == 0xda ? 2 : 4);
    return String.UTF8.decodeUnsafe(this.take(n), n);
  }

  bin(): Uint8Array {
    const m = this.expect(Type.Bin, "bytes");
    const n = <i32>this.be(m == 0xc4 ? 1 : m == 0xc5 ? 2 : 4);
    const out = new Uint8Array(n);
    memory.copy(out.dataStart, this.take(<usize>n), <usize>n);
    return out;
  }

  /** An array's header: the number of values that follow. */
  array(): u32 {
    const m = this.expect(Type.Array, "a list");
    return m <= 0x9f ? <u32>(m & 0x0f) : <u32>this.be(m == 0xdc ? 2 : 4);
  }

  /** A map's header: the number of key-value pairs that follow. */
  map(): u32 {
    const m = this.expect(Type.Map, "a dict");
    return m <= 0x8f ? <u32>(m & 0x0f) : <u32>this.be(m == 0xde ? 2 : 4);
  }

  /** Skip one value, whatever it holds. */
  skip(): void {
    switch (this.peek()) {
      case Type.End: fail("ValueError", "truncated MessagePack data"); break;
      case Type.Nil: case Type.Bool: this.take(1); break;
      case Type.Int: this.int(); break;
      case Type.Float: this.float(); break;
      case Type.Str: this.str(); break;
      case Type.Bin: this.bin(); break;
      case Type.Array: for (let n = this.array(); n > 0; n--) this.skip(); break;
      case Type.Map: for (let n = 2 * this.map(); n > 0; n--) this.skip(); break;
      default: {
        const m = load<u8>(this.take(1));
        let size: usize = m == 0xd4 ? 1 : m == 0xd5 ? 2 : m == 0xd6 ? 4 : m == 0xd7 ? 8 : m == 0xd8 ? 16 : 0;
        if (size == 0) size = <usize>this.be(m == 0xc7 ? 1 : m == 0xc8 ? 2 : 4);
        this.take(size + 1); // the ext type byte, then the data
      }
    }
  }
}

/** A method's positional arguments, read in order. Values inside an argument (the items of
 * a list) are read with `args.reader`. */
export class Args {
  constructor(public reader: Reader, public count: u32) {}

  /** The arguments the host wrote at (argsPtr, argsLen): call this first in every method. */
  static of(argsPtr: i32, argsLen: i32): Args {
    const reader = new Reader(<usize>argsPtr, <usize>argsPtr + <usize>argsLen);
    return new Args(reader, reader.array());
  }

  /** Fail with TypeError unless between `min` and `max` arguments are left. */
  expect(min: u32, max: u32): void {
    if (this.count < min) fail("TypeError", "missing a positional argument");
    if (this.count > max) fail("TypeError", "too many positional arguments");
  }

  /** Step to the next argument (its value is then read from `reader`). */
  next(): Reader {
    if (this.count == 0) fail("TypeError", "missing a positional argument");
    this.count--;
    return this.reader;
  }

  int(): i64 { return this.next().int(); }
  float(): f64 { return this.next().float(); }
  bool(): bool { return this.next().bool(); }
  str(): string { return this.next().str(); }
  bin(): Uint8Array { return this.next().bin(); }
  /** A list argument's length; read its items from `reader`. */
  list(): u32 { return this.next().array(); }
}

// ---- writing MessagePack ----------------------------------------------------------------------

/** Builds MessagePack bytes: a reply or a state. */
export class Writer {
  buf: usize = 0;
  len: usize = 0;
  cap: usize = 0;

  private room(n: usize): usize {
    if (this.cap - this.len < n) {
      let cap = this.cap ? this.cap : 64;
      while (cap - this.len < n) cap *= 2;
      const buf = heap.alloc(cap);
      if (this.len) memory.copy(buf, this.buf, this.len);
      this.buf = buf;
      this.cap = cap;
    }
    const at = this.buf + this.len;
    this.len += n;
    return at;
  }

  private putBe(marker: u8, v: u64, n: usize): void {
    const at = this.room(1 + n);
    store<u8>(at, marker);
    for (let i: usize = 0; i < n; i++) store<u8>(at + 1 + i, <u8>(v >> (8 * (n - 1 - i))));
  }

  nil(): Writer { store<u8>(this.room(1), 0xc0); return this; }

  bool(v: bool): Writer { store<u8>(this.room(1), v ? 0xc3 : 0xc2); return this; }

  /** The shortest encoding, unsigned for v >= 0 (as every MessagePack library writes it). */
  int(v: i64): Writer {
    if (v >= 0) {
      if (v <= 0x7f) store<u8>(this.room(1), <u8>v);
      else if (v <= 0xff) this.putBe(0xcc, <u64>v, 1);
      else if (v <= 0xffff) this.putBe(0xcd, <u64>v, 2);
      else if (v <= 0xffffffff) this.putBe(0xce, <u64>v, 4);
      else this.putBe(0xcf, <u64>v, 8);
    } else if (v >= -32) store<u8>(this.room(1), <u8>v);
    else if (v >= -128) this.putBe(0xd0, <u64>v, 1);
    else if (v >= -32768) this.putBe(0xd1, <u64>v, 2);
    else if (v >= -2147483648) this.putBe(0xd2, <u64>v, 4);
    else this.putBe(0xd3, <u64>v, 8);
    return this;
  }

  float(v: f64): Writer { this.putBe(0xcb, reinterpret<u64>(v), 8); return this; }

  str(s: string): Writer {
    const bytes = String.UTF8.encode(s);
    const n = <usize>bytes.byteLength;
    if (n <= 31) store<u8>(this.room(1), <u8>(0xa0 | n));
    else if (n <= 0xff) this.putBe(0xd9, n, 1);
    else if (n <= 0xffff) this.putBe(0xda, n, 2);
    else this.putBe(0xdb, n, 4);
    memory.copy(this.room(n), changetype<usize>(bytes), n);
    return this;
  }

  bin(bytes: Uint8Array): Writer {
    const n = <usize>bytes.length;
    if (n <= 0xff) this.putBe(0xc4, n, 1);
    else if (n <= 0xffff) this.putBe(0xc5, n, 2);
    else this.putBe(0xc6, n, 4);
    memory.copy(this.room(n), bytes.dataStart, n);
    return this;
  }

  /** The next value of `r`, whatever it holds (ext values too), copied as it is. */
  value(r: Reader): Writer {
    const start = r.p;
    r.skip();
    const n = r.p - start;
    memory.copy(this.room(n), start, n);
    return this;
  }

  /** An array's header; write `n` values after it. */
  array(n: u32): Writer {
    if (n <= 15) store<u8>(this.room(1), <u8>(0x90 | n));
    else if (n <= 0xffff) this.putBe(0xdc, n, 2);
    else this.putBe(0xdd, n, 4);
    return this;
  }

  /** A map's header; write `n` keys and values after it, alternating. */
  map(n: u32): Writer {
    if (n <= 15) store<u8>(this.room(1), <u8>(0x80 | n));
    else if (n <= 0xffff) this.putBe(0xde, n, 2);
    else this.putBe(0xdf, n, 4);
    return this;
  }
}

// ---- state and reply --------------------------------------------------------------------------

/** The object's state as the call began. */
export function state(): ArrayBuffer {
  const bytes = new ArrayBuffer(host_state_len());
  host_state_read(changetype<usize>(bytes));
  return bytes;
}

/** The state as a MessagePack reader (a state written with setStateWriter). */
export function stateReader(): Reader {
  return Reader.of(state());
}

/** Set the object's new state (kept only if the call ends without failing). */
export function setState(bytes: ArrayBuffer): void {
  host_state_write(changetype<usize>(bytes), bytes.byteLength);
}

export function setStateWriter(w: Writer): void {
  host_state_write(w.buf, <i32>w.len);
}

/** A state that is one MessagePack int (`empty` when there is no state yet). */
export function stateInt(empty: i64): i64 {
  const r = stateReader();
  return r.peek() == Type.End ? empty : r.int();
}

export function setStateInt(v: i64): void {
  setStateWriter(new Writer().int(v));
}

/** The method's result: the one MessagePack value in `w`. Without a reply it is None. */
export function reply(w: Writer): void {
  host_reply(w.buf, <i32>w.len);
}

export function replyInt(v: i64): void {
  reply(new Writer().int(v));
}

export function replyFloat(v: f64): void {
  reply(new Writer().float(v));
}

// ---- nested calls: a method of another object (docs/wasm.md, "Nested calls") --------------

/** What a nested call came back with. `ok`: it returned, and `reader` reads its value; else it
 * raised, and `reader` reads the error, the list [kind: str, message: str] (kind an exception
 * name: "ValueError", "NotFound", "TypeMismatch", "RuntimeError"...). */
export class CallResult {
  constructor(public ok: bool, public reader: Reader) {}

  /** The value's reader when it returned; else raise its error as this method's own. */
  orFail(): Reader {
    if (!this.ok) reraise(this.reader);
    return this.reader;
  }
}

/** Call `method` of the object named `key` with the positional arguments in `args` (one
 * MessagePack list; null or an empty writer for none). Calling this object itself or one
 * already in the chain of calls, more than 64 nested calls in a method call or a chain
 * deeper than 8 are errors (RuntimeError). The call runs in this call's transaction, with
 * the permissions of the client that called this method. */
export function call(key: string, method: string, args: Writer | null = null): CallResult {
  const k = String.UTF8.encode(key);
  const m = String.UTF8.encode(method);
  const a = args !== null && args.len > 0 ? args : new Writer().array(0);
  const n = host_call(changetype<usize>(k), k.byteLength, changetype<usize>(m), m.byteLength, a.buf, <i32>a.len);
  const bytes = new ArrayBuffer(n >= 0 ? n : -(n + 1));
  host_result_read(changetype<usize>(bytes));
  return new CallResult(n >= 0, Reader.of(bytes));
}

/** `call`, re-raising the nested call's error as this method's: a reader of its value. */
export function callOrFail(key: string, method: string, args: Writer | null = null): Reader {
  return call(key, method, args).orFail();
}

/** Raise a nested call's error, read by `error`, as this method's own: `fail` with the same
 * kind and message. Never returns. */
export function reraise(error: Reader): void {
  if (error.array() < 2) fail("RuntimeError", "a nested call's error is not [kind, message]");
  const kind = error.str();
  fail(kind, error.str());
}
