// A bank account as a compiled object type (wasm:bank), the AssemblyScript twin of bank.c:
// same methods, same state (the balance, one MessagePack int), same errors.
//
//     init(balance=0)   deposit(n) -> balance   withdraw(n) -> balance   balance() -> balance
//     transfer(to, n) -> balance: deposit(n) on the account named `to` (a nested call), then
//                                 withdraw(n) here

import {
  Args, Writer, callOrFail, fail, replyInt, setStateInt, stateInt,
} from "../../sdk/wasm/assemblyscript/assembly/index";

export { spindle_alloc } from "../../sdk/wasm/assemblyscript/assembly/index";

function checked(n: i64): i64 {
  if (n < 0) fail("ValueError", "the amount must not be negative");
  return n;
}

function amount(args: Args): i64 {
  args.expect(1, 1);
  return checked(args.int());
}

/** Take n from the balance and reply what is left. */
function take(n: i64): void {
  const balance = stateInt(0);
  if (n > balance) fail("ValueError", "insufficient funds");
  setStateInt(balance - n);
  replyInt(balance - n);
}

export function init(argsPtr: i32, argsLen: i32): void {
  const args = Args.of(argsPtr, argsLen);
  args.expect(0, 1);
  const balance = args.count > 0 ? args.int() : 0;
  if (balance < 0) fail("ValueError", "the balance must not be negative");
  setStateInt(balance);
}

export function deposit(argsPtr: i32, argsLen: i32): void {
  const n = amount(Args.of(argsPtr, argsLen));
  const old = stateInt(0);
  if (old > i64.MAX_VALUE - n) fail("OverflowError", "the balance would not fit in 64 bits");
  setStateInt(old + n);
  replyInt(old + n);
}

export function withdraw(argsPtr: i32, argsLen: i32): void {
  take(amount(Args.of(argsPtr, argsLen)));
}

/** The deposit comes first: a method makes its nested calls before its own work, since the
 * server runs it again from its start once a nested call's result is known. A short balance
 * then fails the transfer after the deposit, and the transaction the two share undoes it. */
export function transfer(argsPtr: i32, argsLen: i32): void {
  const args = Args.of(argsPtr, argsLen);
  args.expect(2, 2);
  const to = args.str();
  const n = checked(args.int());
  callOrFail(to, "deposit", new Writer().array(1).int(n)); // its error is ours
  take(n);
}

export function balance(argsPtr: i32, argsLen: i32): void {
  Args.of(argsPtr, argsLen).expect(0, 0);
  replyInt(stateInt(0));
}
