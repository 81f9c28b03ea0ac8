/* A check of the C SDK (crates/wasm/tests/wasm/examples.rs loads it as sdk_echo.wasm): every
 * MessagePack value goes through the SDK's reader and writer and comes back equal. */
#include "spindle.h"

/* Read one value and write it again, recursively. */
static void copy(spindle_reader *r, spindle_writer *w) {
    uint32_t len;
    switch (spindle_peek(r)) {
    case SPINDLE_NIL: spindle_read_nil(r); spindle_write_nil(w); return;
    case SPINDLE_BOOL: spindle_write_bool(w, spindle_read_bool(r)); return;
    case SPINDLE_INT: spindle_write_int(w, spindle_read_int(r)); return;
    case SPINDLE_FLOAT: spindle_write_float(w, spindle_read_float(r)); return;
    case SPINDLE_STR: {
        const char *s = spindle_read_str(r, &len);
        spindle_write_str(w, s, len);
        return;
    }
    case SPINDLE_BIN: {
        const uint8_t *b = spindle_read_bin(r, &len);
        spindle_write_bin(w, b, len);
        return;
    }
    case SPINDLE_ARRAY:
        len = spindle_read_array(r);
        spindle_write_array(w, len);
        while (len--) copy(r, w);
        return;
    case SPINDLE_MAP:
        len = spindle_read_map(r);
        spindle_write_map(w, len);
        for (len *= 2; len; len--) copy(r, w);
        return;
    default: spindle_fail("TypeError", "echo copies no ext values");
    }
}

/* echo(*values) -> [values...], and the arguments become the state. */
SPINDLE_METHOD(echo) {
    spindle_writer w = {0};
    spindle_write_array(&w, args->count);
    while (args->count) copy(spindle_next_arg(args), &w);
    spindle_set_state_writer(&w);
    spindle_reply(&w);
}

/* skip(*values) -> the number of values skipped. */
SPINDLE_METHOD(skip) {
    int64_t n = 0;
    for (; args->count; n++) spindle_skip(spindle_next_arg(args));
    spindle_reply_int(n);
}

/* state() -> the state's bytes. */
SPINDLE_METHOD(state) {
    uint32_t len;
    const uint8_t *bytes = spindle_state(&len);
    spindle_writer w = {0};
    spindle_write_bin(&w, bytes, len);
    spindle_reply(&w);
}

/* fail(kind, message): raises. */
SPINDLE_METHOD(fail) {
    uint32_t kind_len, message_len;
    const char *kind = spindle_arg_str(args, &kind_len);
    const char *message = spindle_arg_str(args, &message_len);
    spindle_host_fail(kind, (int32_t)kind_len, message, (int32_t)message_len);
}

/* allocate(n): n bytes, touched (past the memory limit: a "memory" error). */
SPINDLE_METHOD(allocate) {
    int64_t n = spindle_arg_int(args);
    uint8_t *bytes = (uint8_t *)spindle_malloc((uint32_t)n);
    memset(bytes, 1, (size_t)n);
    spindle_reply_int(bytes[n - 1]);
}

/* A NUL-terminated copy of a str argument. */
static const char *arg_cstr(spindle_reader *args) {
    uint32_t len;
    const char *s = spindle_arg_str(args, &len);
    char *copy = (char *)spindle_malloc(len + 1);
    memcpy(copy, s, len);
    copy[len] = 0;
    return copy;
}

/* The arguments of a nested call: `args` (the next argument) copied as it is, any value (a
 * list, normally), or None for none (a NULL writer). */
static const spindle_writer *call_args(spindle_reader *args) {
    spindle_reader *value = spindle_next_arg(args);
    if (spindle_peek(value) == SPINDLE_NIL) {
        spindle_read_nil(value);
        return 0;
    }
    spindle_writer *w = (spindle_writer *)spindle_malloc(sizeof *w);
    *w = (spindle_writer){0};
    spindle_write_value(w, value);
    return w;
}

/* relay(key, method, args) -> [ok, value]: calls key.method(*args) (a nested call); ok is
 * true and value its result when it returned, false and [kind, message] when it raised. The
 * reply becomes the state. */
SPINDLE_METHOD(relay) {
    spindle_expect_args(args, 3, 3);
    uint32_t key_len, method_len;
    const char *key = spindle_arg_str(args, &key_len);
    const char *method = spindle_arg_str(args, &method_len);
    spindle_reader result;
    bool ok = spindle_call_n(key, key_len, method, method_len, call_args(args), &result);
    spindle_writer w = {0};
    spindle_write_array(&w, 2);
    spindle_write_bool(&w, ok);
    spindle_write_value(&w, &result);
    spindle_set_state_writer(&w);
    spindle_reply(&w);
}

/* relay_or_fail(key, method, args) -> value: the same, raising the nested call's error as its
 * own; the result becomes the state. */
SPINDLE_METHOD(relay_or_fail) {
    spindle_expect_args(args, 3, 3);
    const char *key = arg_cstr(args);
    const char *method = arg_cstr(args);
    spindle_reader result = spindle_call_or_fail(key, method, call_args(args));
    spindle_writer w = {0};
    spindle_write_value(&w, &result);
    spindle_set_state_writer(&w);
    spindle_reply(&w);
}
