/* Cuvil runtime helpers for reductions and sorts.
 *
 * A reduction over any set of axes (known at compile time or read from a
 * tensor at run time) is run as one walk over the input in memory order:
 * the input's dims are merged into runs that are all kept or all reduced,
 * the last run becomes a unit-stride inner loop, and an odometer over the
 * other runs tracks the offset into the (keepdims-shaped) accumulator.
 *
 * The top-k sorts order (key, index) pairs by a total order: larger (or
 * smaller) keys first, NaN beyond every number, and the lower index first
 * among equal keys, so the result is the same as a stable sort.
 */
#ifndef CUVIL_REDUCE_H
#define CUVIL_REDUCE_H

#include "cuvil_rt.h"

/* Merge the dims of `shape` (rank `rank`; `reduced[j]` says whether axis j is reduced) into runs.
 * Writes the run sizes to `dims` and the accumulator stride of each run to `ostride` (0 for reduced
 * runs); returns the number of runs (at least 1) and sets *last_reduced for the innermost run.
 * `dims` and `ostride` hold at least max(rank, 1) entries. */
static CUVIL_UNUSED int cuvil_reduce_plan(const int64_t *shape, int rank, const int *reduced, int64_t *dims,
                                          int64_t *ostride, int *last_reduced) {
    int n = 0;
    int prev = -1;
    for (int j = 0; j < rank; j++) {
        if (shape[j] == 1) continue; /* a size-1 axis changes no offset, kept or not */
        int r = reduced[j] ? 1 : 0;
        if (n > 0 && r == prev) {
            dims[n - 1] *= shape[j];
        } else {
            dims[n] = shape[j];
            ostride[n] = r; /* a flag for now, a stride below */
            n++;
            prev = r;
        }
    }
    if (n == 0) {
        dims[0] = 1;
        ostride[0] = 0;
        *last_reduced = 0;
        return 1;
    }
    *last_reduced = (int)ostride[n - 1];
    int64_t s = 1;
    for (int j = n - 1; j >= 0; j--) {
        if (ostride[j]) {
            ostride[j] = 0;
        } else {
            ostride[j] = s;
            s *= dims[j];
        }
    }
    return n;
}

/* Advance the odometer `idx` over runs [0, n) and keep *off (the accumulator offset) in step. */
static inline void cuvil_odometer_next(int64_t *idx, const int64_t *dims, const int64_t *stride, int n, int64_t *off) {
    for (int j = n - 1; j >= 0; j--) {
        if (++idx[j] < dims[j]) {
            *off += stride[j];
            return;
        }
        *off -= (dims[j] - 1) * stride[j];
        idx[j] = 0;
    }
}

/* Read a list of axes (int32 or int64) into a reduced-axes mask; returns 0, or the position
 * of the first axis that is out of range (as -(i + 1)) or repeated (as i + 1 with *repeated set). */
static CUVIL_UNUSED int64_t cuvil_axes_mask(const void *axes, int is_i64, int64_t count, int rank, int *mask,
                                            int64_t *bad_value, int *repeated) {
    for (int j = 0; j < rank; j++) mask[j] = 0;
    *repeated = 0;
    for (int64_t i = 0; i < count; i++) {
        int64_t a = is_i64 ? ((const int64_t *)axes)[i] : (int64_t)((const int32_t *)axes)[i];
        *bad_value = a;
        if (a < -(int64_t)rank || a >= (int64_t)rank) return -(i + 1);
        if (a < 0) a += rank;
        if (mask[a]) {
            *repeated = 1;
            return i + 1;
        }
        mask[a] = 1;
    }
    return 0;
}

/* Stable-equivalent sorts of `idx[0..n)` by `key[idx]`, descending (largest) or ascending.
 * `tmp` is scratch of n entries. One instance per key type. */
#define CUVIL_DEFINE_TOPK_SORT(NAME, T, ISNAN)                                                           \
    static inline int NAME##_before(T a, int64_t ia, T b, int64_t ib, int largest) {                  \
        int na = ISNAN(a), nb = ISNAN(b);                                                              \
        if (na || nb) {                                                                                \
            if (na && nb) return ia < ib;                                                              \
            return largest ? na : nb; /* NaN beyond every number */                                  \
        }                                                                                              \
        if (a == b) return ia < ib;                                                                    \
        return largest ? (a > b) : (a < b);                                                            \
    }                                                                                                  \
    static CUVIL_UNUSED void NAME(const T *key, int64_t *idx, int64_t *tmp, int64_t n, int largest) {  \
        for (int64_t width = 1; width < n; width *= 2) {                                               \
            for (int64_t lo = 0; lo < n; lo += 2 * width) {                                            \
                int64_t mid = lo + width < n ? lo + width : n;                                         \
                int64_t hi = lo + 2 * width < n ? lo + 2 * width : n;                                  \
                int64_t i = lo, j = mid, o = lo;                                                       \
                while (i < mid && j < hi) {                                                            \
                    if (NAME##_before(key[idx[j]], idx[j], key[idx[i]], idx[i], largest))              \
                        tmp[o++] = idx[j++];                                                           \
                    else                                                                               \
                        tmp[o++] = idx[i++];                                                           \
                }                                                                                      \
                while (i < mid) tmp[o++] = idx[i++];                                                   \
                while (j < hi) tmp[o++] = idx[j++];                                                    \
            }                                                                                          \
            memcpy(idx, tmp, sizeof(int64_t) * (size_t)n);                                             \
        }                                                                                              \
    }

#define CUVIL_ISNAN_FLOAT(x) ((x) != (x))
#define CUVIL_ISNAN_NEVER(x) 0

CUVIL_DEFINE_TOPK_SORT(cuvil_sort_f32, float, CUVIL_ISNAN_FLOAT)
CUVIL_DEFINE_TOPK_SORT(cuvil_sort_f64, double, CUVIL_ISNAN_FLOAT)
CUVIL_DEFINE_TOPK_SORT(cuvil_sort_i64, int64_t, CUVIL_ISNAN_NEVER)
CUVIL_DEFINE_TOPK_SORT(cuvil_sort_u64, uint64_t, CUVIL_ISNAN_NEVER)

#endif /* CUVIL_REDUCE_H */
