/* A bank account as a compiled object type (wasm:bank). The state is the balance, one
 * MessagePack int, so the C and AssemblyScript builds of this type read each other's state.
 *
 *     init(balance=0)   deposit(n) -> balance   withdraw(n) -> balance   balance() -> balance
 */
#include "spindle.h"

static int64_t amount(spindle_reader *args) {
    spindle_expect_args(args, 1, 1);
    int64_t n = spindle_arg_int(args);
    if (n < 0) spindle_fail("ValueError", "the amount must not be negative");
    return n;
}

SPINDLE_METHOD(init) {
    spindle_expect_args(args, 0, 1);
    int64_t balance = args->count ? spindle_arg_int(args) : 0;
    if (balance < 0) spindle_fail("ValueError", "the balance must not be negative");
    spindle_set_state_int(balance);
}

SPINDLE_METHOD(deposit) {
    int64_t n = amount(args);
    int64_t balance;
    if (__builtin_add_overflow(spindle_state_int(0), n, &balance)) {
        spindle_fail("OverflowError", "the balance would not fit in 64 bits");
    }
    spindle_set_state_int(balance);
    spindle_reply_int(balance);
}

SPINDLE_METHOD(withdraw) {
    int64_t n = amount(args);
    int64_t balance = spindle_state_int(0);
    if (n > balance) spindle_fail("ValueError", "insufficient funds");
    spindle_set_state_int(balance - n);
    spindle_reply_int(balance - n);
}

SPINDLE_METHOD(balance) {
    spindle_expect_args(args, 0, 0);
    spindle_reply_int(spindle_state_int(0));
}
