/* The shared-objects benchmark's operation (bench/shared_objects.py, Number.spin) as a
 * compiled object type (wasm:complex_op). The state is x, one MessagePack int.
 *
 *     init(x=1)   complex() -> x   (10,000 steps)   simple() -> x   (one step)   spin(n) -> x
 *
 * One step is x = (x * 31 + 7) % 1000003 with Python's arbitrary-precision ints and modulo
 * (never negative). Reducing x modulo P first gives the same result and keeps every product
 * below 2^35, so int64 arithmetic matches Python bit for bit.
 */
#include "spindle.h"

#define P 1000003
#define A 31
#define B 7

static int64_t spin(int64_t x, int64_t steps) {
    if (steps <= 0) return x;
    x %= P;
    if (x < 0) x += P; /* Python's modulo of a negative x */
    for (int64_t i = 0; i < steps; i++) x = (x * A + B) % P;
    return x;
}

static void step_and_reply(int64_t steps) {
    int64_t x = spin(spindle_state_int(1), steps);
    spindle_set_state_int(x);
    spindle_reply_int(x);
}

SPINDLE_METHOD(init) {
    spindle_expect_args(args, 0, 1);
    spindle_set_state_int(args->count ? spindle_arg_int(args) : 1);
}

SPINDLE_METHOD(complex) {
    spindle_expect_args(args, 0, 0);
    step_and_reply(10000);
}

SPINDLE_METHOD(simple) {
    spindle_expect_args(args, 0, 0);
    step_and_reply(1);
}

SPINDLE_METHOD(spin) {
    spindle_expect_args(args, 1, 1);
    step_and_reply(spindle_arg_int(args));
}

SPINDLE_METHOD(get) {
    spindle_expect_args(args, 0, 0);
    spindle_reply_int(spindle_state_int(1));
}
