/*
 * spindle.h: write a Spindle compiled object type (wasm:<name>) in C, with no libc.
 *
 * Build one object type from one C file:
 *
 *     clang --target=wasm32 -nostdlib -O2 -Wl,--no-entry -Wl,--stack-first \
 *           -I sdk/wasm/c -o bank.wasm bank.c
 *
 * (--stack-first puts the C stack below the data, so a stack overflow traps instead of
 * overwriting globals.)
 *
 * An object is a state (bytes the server keeps) and methods. Every call runs on a fresh
 * instance: read the state, compute, write the new state, reply. Nothing else survives a
 * call, so the bump allocator below never needs to free.
 *
 *     SPINDLE_METHOD(deposit) {                     // exported as "deposit"
 *         int64_t amount = spindle_arg_int(args);   // the first positional argument
 *         int64_t balance = spindle_state_int(0);   // the state, a MessagePack int
 *         spindle_set_state_int(balance + amount);
 *         spindle_reply_int(balance + amount);
 *     }
 *
 * Arguments arrive as a MessagePack array; args->count is how many there are and the
 * spindle_arg_* readers take them in order. A reader that meets another type than it expects
 * fails the call with TypeError. spindle_fail("ValueError", "insufficient funds") raises
 * that exception in the caller and leaves the state as it was. The ABI is in docs/wasm.md.
 *
 * A method may call a method of another object (a nested call, docs/wasm.md "Nested calls"):
 *
 *     spindle_writer call_args = {0};               // the positional arguments: [amount]
 *     spindle_write_array(&call_args, 1);
 *     spindle_write_int(&call_args, amount);
 *     spindle_reader r = spindle_call_or_fail("bob", "deposit", &call_args);
 *     int64_t bobs = spindle_read_int(&r);          // bob's reply; bob's error is raised as ours
 *
 * The nested call runs in the caller's transaction: if the method fails afterwards, bob's
 * deposit is undone too. The server runs the method again from its start for every nested
 * call whose result it does not know yet, handing back the earlier results in order, so a
 * method makes the same calls in the same order given the same state and arguments, and makes
 * them before its expensive work where it can.
 */
#ifndef SPINDLE_H
#define SPINDLE_H

/* No libc: the fixed-width types from the compiler's own macros. */
typedef __INT8_TYPE__ int8_t;
typedef __UINT8_TYPE__ uint8_t;
typedef __INT16_TYPE__ int16_t;
typedef __UINT16_TYPE__ uint16_t;
typedef __INT32_TYPE__ int32_t;
typedef __UINT32_TYPE__ uint32_t;
typedef __INT64_TYPE__ int64_t;
typedef __UINT64_TYPE__ uint64_t;
typedef __SIZE_TYPE__ size_t;
#ifndef __cplusplus
typedef _Bool bool;
#define true 1
#define false 0
#endif
#define INT64_MAX __INT64_MAX__
#define INT64_MIN (-__INT64_MAX__ - 1)

#define SPINDLE_IMPORT(name) __attribute__((import_module("spindle"), import_name(#name)))
#define SPINDLE_EXPORT(name) __attribute__((export_name(#name)))
#define SPINDLE_INLINE static inline __attribute__((unused))

/* ---- the host's functions (docs/wasm.md, "Imports") ---------------------------------- */

SPINDLE_IMPORT(state_len) int32_t spindle_host_state_len(void);
SPINDLE_IMPORT(state_read) void spindle_host_state_read(void *ptr);
SPINDLE_IMPORT(state_write) void spindle_host_state_write(const void *ptr, int32_t len);
SPINDLE_IMPORT(reply) void spindle_host_reply(const void *ptr, int32_t len);
SPINDLE_IMPORT(fail) void spindle_host_fail(const char *kind, int32_t kind_len, const char *msg, int32_t msg_len);
SPINDLE_IMPORT(call) int32_t spindle_host_call(const char *key, int32_t key_len, const char *method,
                                               int32_t method_len, const void *args, int32_t args_len);
SPINDLE_IMPORT(result_read) void spindle_host_result_read(void *ptr);

/* ---- the few libc functions the compiler may call -------------------------------------- */

/* no_builtin: otherwise the optimizer turns these very loops into calls to themselves. */
#define SPINDLE_LIBC __attribute__((weak, no_builtin("memcpy", "memmove", "memset", "memcmp", "bcmp")))

SPINDLE_LIBC void *memcpy(void *dst, const void *src, size_t n) {
    uint8_t *d = (uint8_t *)dst;
    const uint8_t *s = (const uint8_t *)src;
    while (n--) *d++ = *s++;
    return dst;
}

SPINDLE_LIBC void *memmove(void *dst, const void *src, size_t n) {
    uint8_t *d = (uint8_t *)dst;
    const uint8_t *s = (const uint8_t *)src;
    if (d < s) {
        while (n--) *d++ = *s++;
    } else {
        while (n--) d[n] = s[n];
    }
    return dst;
}

SPINDLE_LIBC void *memset(void *dst, int c, size_t n) {
    uint8_t *d = (uint8_t *)dst;
    while (n--) *d++ = (uint8_t)c;
    return dst;
}

SPINDLE_LIBC int memcmp(const void *a, const void *b, size_t n) {
    const uint8_t *x = (const uint8_t *)a, *y = (const uint8_t *)b;
    for (size_t i = 0; i < n; i++) {
        if (x[i] != y[i]) return x[i] < y[i] ? -1 : 1;
    }
    return 0;
}

/* What the optimizer turns `memcmp(a, b, n) == 0` into. */
SPINDLE_LIBC int bcmp(const void *a, const void *b, size_t n) { return memcmp(a, b, n); }

SPINDLE_INLINE size_t spindle_strlen(const char *s) {
    size_t n = 0;
    while (s[n]) n++;
    return n;
}

/* ---- failing ----------------------------------------------------------------------------- */

/* Raise `kind` (a Python builtin exception name: "ValueError", "KeyError"...) with `message`
 * in the caller. Never returns; the object's state stays as it was. */
__attribute__((noreturn, unused)) static void spindle_fail(const char *kind, const char *message) {
    spindle_host_fail(kind, (int32_t)spindle_strlen(kind), message, (int32_t)spindle_strlen(message));
    __builtin_unreachable();
}

/* ---- memory: a bump allocator (a call's instance is thrown away after it) ---------------- */

extern uint8_t __heap_base;
static uint32_t spindle_heap_next;

/* `len` bytes aligned to 8. Grows the memory as needed; past the server's limit the call
 * fails with a "memory" error. */
SPINDLE_INLINE void *spindle_malloc(uint32_t len) {
    if (spindle_heap_next == 0) spindle_heap_next = (uint32_t)(size_t)&__heap_base;
    uint32_t start = (spindle_heap_next + 7u) & ~7u;
    uint64_t end = (uint64_t)start + len;
    uint64_t size = (uint64_t)__builtin_wasm_memory_size(0) * 65536u;
    if (end > size) {
        uint64_t pages = (end - size + 65535u) / 65536u;
        if (end > 0xFFFFFFFFull || __builtin_wasm_memory_grow(0, (size_t)pages) == (size_t)-1) {
            spindle_fail("MemoryError", "out of guest memory");
        }
    }
    spindle_heap_next = (uint32_t)end;
    return (void *)(size_t)start;
}

/* Where the host writes a call's arguments (the ABI's `spindle_alloc`). */
SPINDLE_EXPORT(spindle_alloc) int32_t spindle_alloc(int32_t len) {
    return (int32_t)(size_t)spindle_malloc((uint32_t)len);
}

/* ---- reading MessagePack ------------------------------------------------------------------ */

typedef struct {
    const uint8_t *p;
    const uint8_t *end;
    uint32_t count; /* for the arguments: how many the caller passed */
} spindle_reader;

typedef enum {
    SPINDLE_NIL,
    SPINDLE_BOOL,
    SPINDLE_INT,
    SPINDLE_FLOAT,
    SPINDLE_STR,
    SPINDLE_BIN,
    SPINDLE_ARRAY,
    SPINDLE_MAP,
    SPINDLE_EXT,
    SPINDLE_END, /* nothing left */
} spindle_type;

SPINDLE_INLINE spindle_reader spindle_reader_of(const void *bytes, uint32_t len) {
    spindle_reader r = {(const uint8_t *)bytes, (const uint8_t *)bytes + len, 0};
    return r;
}

__attribute__((noreturn, unused)) static void spindle_type_error(const char *expected) {
    spindle_fail("TypeError", expected);
}

SPINDLE_INLINE const uint8_t *spindle_take(spindle_reader *r, uint32_t n) {
    if ((uint32_t)(r->end - r->p) < n) spindle_fail("ValueError", "truncated MessagePack data");
    const uint8_t *at = r->p;
    r->p += n;
    return at;
}

SPINDLE_INLINE uint64_t spindle_be(spindle_reader *r, uint32_t n) {
    const uint8_t *b = spindle_take(r, n);
    uint64_t v = 0;
    for (uint32_t i = 0; i < n; i++) v = (v << 8) | b[i];
    return v;
}

/* The type of the next value, without reading it. */
SPINDLE_INLINE spindle_type spindle_peek(const spindle_reader *r) {
    if (r->p >= r->end) return SPINDLE_END;
    uint8_t m = *r->p;
    if (m <= 0x7f || m >= 0xe0) return SPINDLE_INT;
    if (m <= 0x8f) return SPINDLE_MAP;
    if (m <= 0x9f) return SPINDLE_ARRAY;
    if (m <= 0xbf) return SPINDLE_STR;
    switch (m) {
    case 0xc0: return SPINDLE_NIL;
    case 0xc2: case 0xc3: return SPINDLE_BOOL;
    case 0xc4: case 0xc5: case 0xc6: return SPINDLE_BIN;
    case 0xca: case 0xcb: return SPINDLE_FLOAT;
    case 0xcc: case 0xcd: case 0xce: case 0xcf:
    case 0xd0: case 0xd1: case 0xd2: case 0xd3: return SPINDLE_INT;
    case 0xd9: case 0xda: case 0xdb: return SPINDLE_STR;
    case 0xdc: case 0xdd: return SPINDLE_ARRAY;
    case 0xde: case 0xdf: return SPINDLE_MAP;
    default: return SPINDLE_EXT;
    }
}

SPINDLE_INLINE void spindle_read_nil(spindle_reader *r) {
    if (spindle_peek(r) != SPINDLE_NIL) spindle_type_error("expected None");
    r->p++;
}

SPINDLE_INLINE bool spindle_read_bool(spindle_reader *r) {
    if (spindle_peek(r) != SPINDLE_BOOL) spindle_type_error("expected a bool");
    return *r->p++ == 0xc3;
}

/* An integer that fits in int64 (larger ones fail with OverflowError). */
SPINDLE_INLINE int64_t spindle_read_int(spindle_reader *r) {
    if (spindle_peek(r) != SPINDLE_INT) spindle_type_error("expected an int");
    uint8_t m = *r->p++;
    if (m <= 0x7f) return m;
    if (m >= 0xe0) return (int8_t)m;
    switch (m) {
    case 0xcc: return (int64_t)spindle_be(r, 1);
    case 0xcd: return (int64_t)spindle_be(r, 2);
    case 0xce: return (int64_t)spindle_be(r, 4);
    case 0xcf: {
        uint64_t v = spindle_be(r, 8);
        if (v > (uint64_t)INT64_MAX) spindle_fail("OverflowError", "integer does not fit in 64 bits");
        return (int64_t)v;
    }
    case 0xd0: return (int8_t)spindle_be(r, 1);
    case 0xd1: return (int16_t)spindle_be(r, 2);
    case 0xd2: return (int32_t)spindle_be(r, 4);
    default: return (int64_t)spindle_be(r, 8);
    }
}

/* A float; an int is taken too (as Python would). */
SPINDLE_INLINE double spindle_read_float(spindle_reader *r) {
    spindle_type t = spindle_peek(r);
    if (t == SPINDLE_INT) return (double)spindle_read_int(r);
    if (t != SPINDLE_FLOAT) spindle_type_error("expected a float");
    uint8_t m = *r->p++;
    if (m == 0xca) {
        uint32_t bits = (uint32_t)spindle_be(r, 4);
        float f;
        __builtin_memcpy(&f, &bits, 4);
        return f;
    }
    uint64_t bits = spindle_be(r, 8);
    double d;
    __builtin_memcpy(&d, &bits, 8);
    return d;
}

/* A string: a pointer into the data (not NUL-terminated) and its length in *len. */
SPINDLE_INLINE const char *spindle_read_str(spindle_reader *r, uint32_t *len) {
    if (spindle_peek(r) != SPINDLE_STR) spindle_type_error("expected a str");
    uint8_t m = *r->p++;
    uint32_t n = m <= 0xbf ? (uint32_t)(m & 0x1f) : (uint32_t)spindle_be(r, m == 0xd9 ? 1 : m == 0xda ? 2 : 4);
    *len = n;
    return (const char *)spindle_take(r, n);
}

/* Bytes: a pointer into the data and its length in *len. */
SPINDLE_INLINE const uint8_t *spindle_read_bin(spindle_reader *r, uint32_t *len) {
    if (spindle_peek(r) != SPINDLE_BIN) spindle_type_error("expected bytes");
    uint8_t m = *r->p++;
    uint32_t n = (uint32_t)spindle_be(r, m == 0xc4 ? 1 : m == 0xc5 ? 2 : 4);
    *len = n;
    return spindle_take(r, n);
}

/* An array's header: the number of values that follow. */
SPINDLE_INLINE uint32_t spindle_read_array(spindle_reader *r) {
    if (spindle_peek(r) != SPINDLE_ARRAY) spindle_type_error("expected a list");
    uint8_t m = *r->p++;
    return m <= 0x9f ? (uint32_t)(m & 0x0f) : (uint32_t)spindle_be(r, m == 0xdc ? 2 : 4);
}

/* A map's header: the number of key-value pairs that follow. */
SPINDLE_INLINE uint32_t spindle_read_map(spindle_reader *r) {
    if (spindle_peek(r) != SPINDLE_MAP) spindle_type_error("expected a dict");
    uint8_t m = *r->p++;
    return m <= 0x8f ? (uint32_t)(m & 0x0f) : (uint32_t)spindle_be(r, m == 0xde ? 2 : 4);
}

/* Skip one value, whatever it holds. */
SPINDLE_INLINE void spindle_skip(spindle_reader *r) {
    uint32_t len;
    switch (spindle_peek(r)) {
    case SPINDLE_END: spindle_fail("ValueError", "truncated MessagePack data");
    case SPINDLE_NIL: case SPINDLE_BOOL: r->p++; return;
    case SPINDLE_INT: spindle_read_int(r); return;
    case SPINDLE_FLOAT: spindle_read_float(r); return;
    case SPINDLE_STR: spindle_read_str(r, &len); return;
    case SPINDLE_BIN: spindle_read_bin(r, &len); return;
    case SPINDLE_ARRAY: for (uint32_t n = spindle_read_array(r); n; n--) spindle_skip(r); return;
    case SPINDLE_MAP: for (uint32_t n = 2 * spindle_read_map(r); n; n--) spindle_skip(r); return;
    case SPINDLE_EXT: {
        uint8_t m = *r->p++;
        uint32_t size = m == 0xd4 ? 1 : m == 0xd5 ? 2 : m == 0xd6 ? 4 : m == 0xd7 ? 8 : m == 0xd8 ? 16
                      : (uint32_t)spindle_be(r, m == 0xc7 ? 1 : m == 0xc8 ? 2 : 4);
        spindle_take(r, size + 1); /* the ext type byte, then the data */
        return;
    }
    }
}

/* ---- arguments ---------------------------------------------------------------------------- */

/* The next positional argument. Reading past the last fails with TypeError. */
SPINDLE_INLINE spindle_reader *spindle_next_arg(spindle_reader *args) {
    if (args->count == 0) spindle_type_error("missing a positional argument");
    args->count--;
    return args;
}
#define spindle_arg_int(args) spindle_read_int(spindle_next_arg(args))
#define spindle_arg_float(args) spindle_read_float(spindle_next_arg(args))
#define spindle_arg_bool(args) spindle_read_bool(spindle_next_arg(args))
#define spindle_arg_str(args, len) spindle_read_str(spindle_next_arg(args), len)
#define spindle_arg_bin(args, len) spindle_read_bin(spindle_next_arg(args), len)
#define spindle_arg_array(args) spindle_read_array(spindle_next_arg(args))
#define spindle_arg_map(args) spindle_read_map(spindle_next_arg(args))

/* Fail with TypeError unless between `min` and `max` arguments are left. */
SPINDLE_INLINE void spindle_expect_args(const spindle_reader *args, uint32_t min, uint32_t max) {
    if (args->count < min) spindle_type_error("missing a positional argument");
    if (args->count > max) spindle_type_error("too many positional arguments");
}

/* ---- writing MessagePack ------------------------------------------------------------------ */

typedef struct {
    uint8_t *buf;
    uint32_t len;
    uint32_t cap;
} spindle_writer;

SPINDLE_INLINE uint8_t *spindle_room(spindle_writer *w, uint32_t n) {
    if (w->cap - w->len < n) {
        uint32_t cap = w->cap ? w->cap : 64;
        while (cap - w->len < n) cap *= 2;
        uint8_t *buf = (uint8_t *)spindle_malloc(cap);
        if (w->len) memcpy(buf, w->buf, w->len);
        w->buf = buf;
        w->cap = cap;
    }
    uint8_t *at = w->buf + w->len;
    w->len += n;
    return at;
}

SPINDLE_INLINE void spindle_put_be(spindle_writer *w, uint8_t marker, uint64_t v, uint32_t n) {
    uint8_t *at = spindle_room(w, 1 + n);
    at[0] = marker;
    for (uint32_t i = 0; i < n; i++) at[1 + i] = (uint8_t)(v >> (8 * (n - 1 - i)));
}

SPINDLE_INLINE void spindle_write_nil(spindle_writer *w) { *spindle_room(w, 1) = 0xc0; }

SPINDLE_INLINE void spindle_write_bool(spindle_writer *w, bool v) { *spindle_room(w, 1) = v ? 0xc3 : 0xc2; }

/* The shortest encoding, unsigned for v >= 0 (as every MessagePack library writes it). */
SPINDLE_INLINE void spindle_write_int(spindle_writer *w, int64_t v) {
    if (v >= 0) {
        if (v <= 0x7f) *spindle_room(w, 1) = (uint8_t)v;
        else if (v <= 0xff) spindle_put_be(w, 0xcc, (uint64_t)v, 1);
        else if (v <= 0xffff) spindle_put_be(w, 0xcd, (uint64_t)v, 2);
        else if (v <= 0xffffffffll) spindle_put_be(w, 0xce, (uint64_t)v, 4);
        else spindle_put_be(w, 0xcf, (uint64_t)v, 8);
    } else if (v >= -32) *spindle_room(w, 1) = (uint8_t)(int8_t)v;
    else if (v >= -128) spindle_put_be(w, 0xd0, (uint64_t)v, 1);
    else if (v >= -32768) spindle_put_be(w, 0xd1, (uint64_t)v, 2);
    else if (v >= -2147483647 - 1) spindle_put_be(w, 0xd2, (uint64_t)v, 4);
    else spindle_put_be(w, 0xd3, (uint64_t)v, 8);
}

SPINDLE_INLINE void spindle_write_float(spindle_writer *w, double v) {
    uint64_t bits;
    __builtin_memcpy(&bits, &v, 8);
    spindle_put_be(w, 0xcb, bits, 8);
}

SPINDLE_INLINE void spindle_write_str(spindle_writer *w, const char *s, uint32_t len) {
    if (len <= 31) *spindle_room(w, 1) = (uint8_t)(0xa0 | len);
    else if (len <= 0xff) spindle_put_be(w, 0xd9, len, 1);
    else if (len <= 0xffff) spindle_put_be(w, 0xda, len, 2);
    else spindle_put_be(w, 0xdb, len, 4);
    memcpy(spindle_room(w, len), s, len);
}

SPINDLE_INLINE void spindle_write_cstr(spindle_writer *w, const char *s) {
    spindle_write_str(w, s, (uint32_t)spindle_strlen(s));
}

SPINDLE_INLINE void spindle_write_bin(spindle_writer *w, const void *bytes, uint32_t len) {
    if (len <= 0xff) spindle_put_be(w, 0xc4, len, 1);
    else if (len <= 0xffff) spindle_put_be(w, 0xc5, len, 2);
    else spindle_put_be(w, 0xc6, len, 4);
    memcpy(spindle_room(w, len), bytes, len);
}

/* The next value of `r`, whatever it holds (ext values too), copied as it is. */
SPINDLE_INLINE void spindle_write_value(spindle_writer *w, spindle_reader *r) {
    const uint8_t *start = r->p;
    spindle_skip(r);
    uint32_t len = (uint32_t)(r->p - start);
    memcpy(spindle_room(w, len), start, len);
}

/* An array's header; write `n` values after it. */
SPINDLE_INLINE void spindle_write_array(spindle_writer *w, uint32_t n) {
    if (n <= 15) *spindle_room(w, 1) = (uint8_t)(0x90 | n);
    else if (n <= 0xffff) spindle_put_be(w, 0xdc, n, 2);
    else spindle_put_be(w, 0xdd, n, 4);
}

/* A map's header; write `n` keys and values after it, alternating. */
SPINDLE_INLINE void spindle_write_map(spindle_writer *w, uint32_t n) {
    if (n <= 15) *spindle_room(w, 1) = (uint8_t)(0x80 | n);
    else if (n <= 0xffff) spindle_put_be(w, 0xde, n, 2);
    else spindle_put_be(w, 0xdf, n, 4);
}

/* ---- state and reply ---------------------------------------------------------------------- */

/* The object's state as the call began: its bytes (in fresh memory) and their count. */
SPINDLE_INLINE const uint8_t *spindle_state(uint32_t *len) {
    uint32_t n = (uint32_t)spindle_host_state_len();
    uint8_t *bytes = (uint8_t *)spindle_malloc(n);
    spindle_host_state_read(bytes);
    *len = n;
    return bytes;
}

/* The state as a MessagePack reader (a state written with spindle_set_state_writer). */
SPINDLE_INLINE spindle_reader spindle_state_reader(void) {
    uint32_t len;
    const uint8_t *bytes = spindle_state(&len);
    return spindle_reader_of(bytes, len);
}

/* Set the object's new state (kept only if the call ends without failing). */
SPINDLE_INLINE void spindle_set_state(const void *bytes, uint32_t len) { spindle_host_state_write(bytes, (int32_t)len); }

SPINDLE_INLINE void spindle_set_state_writer(const spindle_writer *w) { spindle_set_state(w->buf, w->len); }

/* A state that is one MessagePack int (`empty` when there is no state yet). */
SPINDLE_INLINE int64_t spindle_state_int(int64_t empty) {
    spindle_reader r = spindle_state_reader();
    return spindle_peek(&r) == SPINDLE_END ? empty : spindle_read_int(&r);
}

SPINDLE_INLINE void spindle_set_state_int(int64_t v) {
    spindle_writer w = {0};
    spindle_write_int(&w, v);
    spindle_set_state_writer(&w);
}

/* The method's result: the one MessagePack value in `w`. Without a reply the result is None. */
SPINDLE_INLINE void spindle_reply(const spindle_writer *w) { spindle_host_reply(w->buf, (int32_t)w->len); }

SPINDLE_INLINE void spindle_reply_int(int64_t v) {
    spindle_writer w = {0};
    spindle_write_int(&w, v);
    spindle_reply(&w);
}

SPINDLE_INLINE void spindle_reply_float(double v) {
    spindle_writer w = {0};
    spindle_write_float(&w, v);
    spindle_reply(&w);
}

SPINDLE_INLINE void spindle_reply_bool(bool v) {
    spindle_writer w = {0};
    spindle_write_bool(&w, v);
    spindle_reply(&w);
}

/* ---- nested calls: a method of another object (docs/wasm.md, "Nested calls") ------------ */

/* Call `method` of the object named `key` (UTF-8, `key_len` and `method_len` bytes) with the
 * positional arguments in `args`: one MessagePack array (NULL or an empty writer: none).
 * True when it returned: `result` then reads its value. False when it raised: `result` then
 * reads the error, the array [kind: str, message: str] (kind an exception name: "ValueError",
 * "NotFound", "TypeMismatch", "RuntimeError"...). Calling this object itself or one already
 * in the chain of calls, more than 64 nested calls in a method call or a chain deeper than 8
 * are such errors (RuntimeError). The call runs in this call's transaction, with the
 * permissions of the client that called this method. */
SPINDLE_INLINE bool spindle_call_n(const char *key, uint32_t key_len, const char *method, uint32_t method_len,
                                   const spindle_writer *args, spindle_reader *result) {
    static const uint8_t no_args = 0x90; /* [] */
    bool some = args && args->len;
    const void *args_ptr = some ? (const void *)args->buf : (const void *)&no_args;
    uint32_t args_len = some ? args->len : 1;
    int32_t n = spindle_host_call(key, (int32_t)key_len, method, (int32_t)method_len, args_ptr, (int32_t)args_len);
    uint32_t len = n >= 0 ? (uint32_t)n : (uint32_t)(-(n + 1));
    uint8_t *bytes = (uint8_t *)spindle_malloc(len);
    spindle_host_result_read(bytes);
    *result = spindle_reader_of(bytes, len);
    return n >= 0;
}

/* The same with NUL-terminated names. */
SPINDLE_INLINE bool spindle_call(const char *key, const char *method, const spindle_writer *args,
                                 spindle_reader *result) {
    return spindle_call_n(key, (uint32_t)spindle_strlen(key), method, (uint32_t)spindle_strlen(method), args, result);
}

/* Raise a nested call's error, read by `error`, as this method's own: spindle_fail with the
 * same kind and message. Never returns. */
__attribute__((noreturn, unused)) static void spindle_reraise(spindle_reader *error) {
    uint32_t kind_len, message_len;
    if (spindle_read_array(error) < 2) {
        spindle_fail("RuntimeError", "a nested call's error is not [kind, message]");
    }
    const char *kind = spindle_read_str(error, &kind_len);
    const char *message = spindle_read_str(error, &message_len);
    spindle_host_fail(kind, (int32_t)kind_len, message, (int32_t)message_len);
    __builtin_unreachable();
}

/* spindle_call_n, re-raising the nested call's error as this method's: a reader of its value. */
SPINDLE_INLINE spindle_reader spindle_call_or_fail_n(const char *key, uint32_t key_len, const char *method,
                                                     uint32_t method_len, const spindle_writer *args) {
    spindle_reader result;
    if (!spindle_call_n(key, key_len, method, method_len, args, &result)) spindle_reraise(&result);
    return result;
}

/* The same with NUL-terminated names. */
SPINDLE_INLINE spindle_reader spindle_call_or_fail(const char *key, const char *method, const spindle_writer *args) {
    return spindle_call_or_fail_n(key, (uint32_t)spindle_strlen(key), method, (uint32_t)spindle_strlen(method), args);
}

/* ---- methods ------------------------------------------------------------------------------ */

/* Define and export a method (or, named `init`, the constructor); its body sees `args`, a
 * reader positioned on the first positional argument with args->count of them.
 *
 *     SPINDLE_METHOD(balance) { spindle_reply_int(spindle_state_int(0)); }
 */
#define SPINDLE_METHOD(name)                                                                 \
    static void spindle_method_##name(spindle_reader *args);                                 \
    SPINDLE_EXPORT(name) void spindle_export_##name(int32_t args_ptr, int32_t args_len) {    \
        spindle_reader reader = spindle_reader_of((const void *)(size_t)args_ptr, (uint32_t)args_len); \
        reader.count = spindle_read_array(&reader);                                          \
        spindle_method_##name(&reader);                                                      \
    }                                                                                        \
    static void spindle_method_##name(__attribute__((unused)) spindle_reader *args)

#endif /* SPINDLE_H */
