/* The throughput benchmark's complex operation (bench/throughput.py, Number.spin) as a
 * compiled object type (wasm:number). The state is x, one MessagePack float64.
 *
 *     init(x=1.0)   spin(n, f) -> x   (n sequential multiplications by f)   get() -> x
 */
#include "spindle.h"

static double state(void) {
    spindle_reader r = spindle_state_reader();
    return spindle_peek(&r) == SPINDLE_END ? 1.0 : spindle_read_float(&r);
}

static void set_state(double x) {
    spindle_writer w = {0};
    spindle_write_float(&w, x);
    spindle_set_state_writer(&w);
}

SPINDLE_METHOD(init) {
    spindle_expect_args(args, 0, 1);
    set_state(args->count ? spindle_arg_float(args) : 1.0);
}

SPINDLE_METHOD(spin) {
    spindle_expect_args(args, 2, 2);
    int64_t n = spindle_arg_int(args);
    double f = spindle_arg_float(args);
    double x = state();
    for (int64_t i = 0; i < n; i++) x = x * f;
    set_state(x);
    spindle_reply_float(x);
}

SPINDLE_METHOD(get) {
    spindle_expect_args(args, 0, 0);
    spindle_reply_float(state());
}
