/* A bank account as a compiled object type (wasm:bank). The state is the balance, one
 * MessagePack int, so the C and AssemblyScript builds of this type read each other's state.
 *
 *     init(balance=0)   deposit(n) -> balance   withdraw(n) -> balance   balance() -> balance
 *     transfer(to, n) -> balance: deposit(n) on the account named `to` (a nested call), then
 *                                 withdraw(n) here
 */
#include "spindle.h"

static int64_t checked(int64_t n) {
    if (n < 0) spindle_fail("ValueError", "the amount must not be negative");
    return n;
}

static int64_t amount(spindle_reader *args) {
    spindle_expect_args(args, 1, 1);
    return checked(spindle_arg_int(args));
}

/* Take n from the balance and reply what is left. */
static void take(int64_t n) {
    int64_t balance = spindle_state_int(0);
    if (n > balance) spindle_fail("ValueError", "insufficient funds");
    spindle_set_state_int(balance - n);
    spindle_reply_int(balance - n);
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

SPINDLE_METHOD(withdraw) { take(amount(args)); }

/* The deposit comes first: a method makes its nested calls before its own work, since the
 * server runs it again from its start once a nested call's result is known. A short balance
 * then fails the transfer after the deposit, and the transaction the two share undoes it. */
SPINDLE_METHOD(transfer) {
    spindle_expect_args(args, 2, 2);
    uint32_t to_len;
    const char *to = spindle_arg_str(args, &to_len);
    int64_t n = checked(spindle_arg_int(args));
    spindle_writer deposit_args = {0};
    spindle_write_array(&deposit_args, 1);
    spindle_write_int(&deposit_args, n);
    spindle_call_or_fail_n(to, to_len, "deposit", sizeof "deposit" - 1, &deposit_args); /* its error is ours */
    take(n);
}

SPINDLE_METHOD(balance) {
    spindle_expect_args(args, 0, 0);
    spindle_reply_int(spindle_state_int(0));
}
