/* k-means centroids as a compiled object type (wasm:kmeans): examples/kmeans.py's
 * GlobalCentroids, same methods, same results bit for bit.
 *
 *     init(initial, parts)          initial: k rows of dims numbers
 *     get() -> k rows of dims floats
 *     update(sums, counts) -> None, or the largest move of a coordinate once all `parts`
 *                                   parts of an iteration are in (the new centroids are set)
 *
 * A row is a list of numbers or bytes holding float64s (little-endian: NumPy's
 * `row.tobytes()`); `counts` likewise (k numbers). As in Python, the parts are added up in a
 * fixed order (sorted by the bytes of their counts, then of their sums), not in the order
 * they arrive, so a run is reproducible whatever the threads' timing.
 *
 * State (all little-endian, as wasm is):
 *     u32 k, u32 dims, u32 parts, u32 received
 *     f64 centroids[k * dims]
 *     received times: f64 counts[k], f64 sums[k * dims]
 */
#include "spindle.h"

typedef struct {
    uint32_t k, dims, parts, received;
} header;

/* A state with room for `extra` more parts. */
typedef struct {
    header *h;
    double *centroids;
    uint8_t *bytes;
    uint32_t len;
} centroids_state;

static uint32_t part_doubles(const header *h) { return h->k + h->k * h->dims; }

static double *part_at(centroids_state *s, uint32_t i) {
    return s->centroids + (uint64_t)s->h->k * s->h->dims + (uint64_t)i * part_doubles(s->h);
}

static uint32_t state_size(const header *h, uint32_t parts) {
    uint64_t doubles = (uint64_t)h->k * h->dims + (uint64_t)parts * part_doubles(h);
    uint64_t size = sizeof(header) + 8 * doubles;
    if (size > 0x7fffffff) spindle_fail("ValueError", "the centroids are too large");
    return (uint32_t)size;
}

static centroids_state load(uint32_t extra_parts) {
    uint32_t len;
    const uint8_t *bytes = spindle_state(&len);
    if (len < sizeof(header)) spindle_fail("RuntimeError", "the object has no centroids");
    header h;
    memcpy(&h, bytes, sizeof h);
    centroids_state s;
    s.len = state_size(&h, h.received + extra_parts);
    s.bytes = (uint8_t *)spindle_malloc(s.len);
    memcpy(s.bytes, bytes, len);
    s.h = (header *)s.bytes;
    s.centroids = (double *)(s.bytes + sizeof(header));
    return s;
}

/* `n` float64s from a list of numbers or from bytes of float64s, into `out`. */
static void read_doubles(spindle_reader *r, double *out, uint32_t n, const char *what) {
    if (spindle_peek(r) == SPINDLE_BIN) {
        uint32_t len;
        const uint8_t *bytes = spindle_read_bin(r, &len);
        if (len != 8 * n) spindle_fail("ValueError", what);
        memcpy(out, bytes, len);
        return;
    }
    if (spindle_read_array(r) != n) spindle_fail("ValueError", what);
    for (uint32_t i = 0; i < n; i++) out[i] = spindle_read_float(r);
}

/* k rows of `dims` float64s, as a list of rows or as one block of k * dims float64s. */
static void read_rows(spindle_reader *r, double *out, uint32_t k, uint32_t dims, const char *what) {
    if (spindle_peek(r) == SPINDLE_BIN) {
        read_doubles(r, out, k * dims, what);
        return;
    }
    if (spindle_read_array(r) != k) spindle_fail("ValueError", what);
    for (uint32_t i = 0; i < k; i++) read_doubles(r, out + (uint64_t)i * dims, dims, what);
}

SPINDLE_METHOD(init) {
    spindle_expect_args(args, 2, 2);
    /* Read the rows twice: once for the shape, once for the values. */
    spindle_reader shape = *spindle_next_arg(args);
    header h = {0, 0, 0, 0};
    h.k = spindle_read_array(&shape);
    if (h.k == 0) spindle_fail("ValueError", "initial must have at least one centroid");
    if (spindle_peek(&shape) == SPINDLE_BIN) {
        uint32_t len;
        spindle_read_bin(&shape, &len);
        h.dims = len / 8;
    } else {
        h.dims = spindle_read_array(&shape);
    }
    if (h.dims == 0) spindle_fail("ValueError", "centroids must have at least one dimension");
    uint32_t len = state_size(&h, 0);
    uint8_t *bytes = (uint8_t *)spindle_malloc(len);
    read_rows(args, (double *)(bytes + sizeof(header)), h.k, h.dims, "initial must be k rows of equal length");
    int64_t parts = spindle_arg_int(args);
    if (parts < 1 || parts > 0xffff) spindle_fail("ValueError", "parts must be between 1 and 65535");
    h.parts = (uint32_t)parts;
    memcpy(bytes, &h, sizeof h);
    spindle_set_state(bytes, len);
}

SPINDLE_METHOD(get) {
    spindle_expect_args(args, 0, 0);
    centroids_state s = load(0);
    spindle_writer w = {0};
    spindle_write_array(&w, s.h->k);
    for (uint32_t i = 0; i < s.h->k; i++) {
        spindle_write_array(&w, s.h->dims);
        for (uint32_t j = 0; j < s.h->dims; j++) spindle_write_float(&w, s.centroids[(uint64_t)i * s.h->dims + j]);
    }
    spindle_reply(&w);
}

/* Python's sort key: (counts.tobytes(), sums.tobytes()), compared as bytes. */
static int compare_parts(const header *h, const double *a, const double *b) {
    int c = memcmp(a, b, 8 * h->k);
    return c ? c : memcmp(a + h->k, b + h->k, 8 * (uint64_t)h->k * h->dims);
}

SPINDLE_METHOD(update) {
    spindle_expect_args(args, 2, 2);
    centroids_state s = load(1);
    header *h = s.h;
    double *part = part_at(&s, h->received);
    read_rows(spindle_next_arg(args), part + h->k, h->k, h->dims, "local_sums must be k rows of dims numbers");
    read_doubles(spindle_next_arg(args), part, h->k, "local_counts must be k numbers");
    h->received++;
    if (h->received < h->parts) {
        spindle_set_state(s.bytes, state_size(h, h->received));
        return; /* None */
    }

    /* All parts are in: add them up in sorted order (insertion sort of indices: few parts). */
    uint32_t n = h->received, k = h->k, dims = h->dims;
    uint32_t *order = (uint32_t *)spindle_malloc(4 * n);
    for (uint32_t i = 0; i < n; i++) {
        uint32_t j = i;
        while (j > 0 && compare_parts(h, part_at(&s, order[j - 1]), part_at(&s, i)) > 0) {
            order[j] = order[j - 1];
            j--;
        }
        order[j] = i;
    }
    double *counts = (double *)spindle_malloc(8 * k);
    double *sums = (double *)spindle_malloc(8 * (uint64_t)k * dims);
    memset(counts, 0, 8 * k);
    memset(sums, 0, 8 * (uint64_t)k * dims);
    for (uint32_t p = 0; p < n; p++) {
        const double *part_counts = part_at(&s, order[p]);
        const double *part_sums = part_counts + k;
        for (uint32_t i = 0; i < k; i++) counts[i] += part_counts[i];
        for (uint64_t i = 0; i < (uint64_t)k * dims; i++) sums[i] += part_sums[i];
    }

    /* new = where(counts > 0, sums / maximum(counts, 1), old); shift = max |new - old|. */
    double shift = 0.0;
    bool first = true;
    for (uint32_t i = 0; i < k; i++) {
        double divisor = counts[i] > 1.0 ? counts[i] : 1.0;
        for (uint32_t j = 0; j < dims; j++) {
            double *c = &s.centroids[(uint64_t)i * dims + j];
            double updated = counts[i] > 0.0 ? sums[(uint64_t)i * dims + j] / divisor : *c;
            double move = __builtin_fabs(updated - *c);
            /* NumPy's max: the first NaN wins, as any comparison with NaN is false. */
            if (first || move > shift || move != move) {
                if (shift == shift) shift = move;
            }
            first = false;
            *c = updated;
        }
    }
    h->received = 0;
    spindle_set_state(s.bytes, state_size(h, 0));
    spindle_reply_float(shift);
}
