/* Cuvil runtime: data movement for the shape, indexing and generation kernels.
 *
 * The core is cuvil_view_copy: copy an N-d strided view of a source buffer
 * into a contiguous destination.  Transpose (permuted strides), slice
 * (offset and stepped strides), expand (zero strides) and tile (a view of
 * rank 2r whose repeat axes have stride 0) are all such views.  The view is
 * simplified first (size-1 dims dropped, dims that are contiguous with
 * each other merged), then copied block by block:
 *   - the innermost dim has stride 1: a memcpy per row;
 *   - stride 0: a fill per row;
 *   - otherwise, when another dim has stride 1: 2-D tiles over that dim
 *     and the innermost one (a cache-friendly transpose);
 *   - otherwise a strided row loop.
 * Data movement does not depend on the element type, only on its size, so
 * the typed inner loops exist for sizes 1, 2, 4 and 8 bytes.
 *
 * Also: overflow-checked size arithmetic for shapes computed from tensor
 * values (reshape, tile, expand, constant_of_shape, range...).
 *
 * All functions are static; nothing here keeps state between calls.
 */
#ifndef CUVIL_INDEX_H
#define CUVIL_INDEX_H

#include "cuvil_rt.h"
#include "cuvil_threads.h"

/* The largest rank of a view (tile doubles its input's rank). */
#define CUVIL_VIEW_MAX_RANK 32
#define CUVIL_VIEW_TILE 32

/* ---- checked size arithmetic ------------------------------------------ */

/* a * b for non-negative a and b; -1 when either is negative or the product overflows int64. */
static inline CUVIL_UNUSED int64_t cuvil_mul_nonneg(int64_t a, int64_t b) {
    if (a < 0 || b < 0) return -1;
    if (a != 0 && b > INT64_MAX / a) return -1;
    return a * b;
}

/* The byte size of a tensor of `shape` with `esize`-byte elements; -1 when a dim
 * is negative or the size overflows int64. */
CUVIL_LIB int64_t cuvil_checked_bytes(const int64_t *shape, int rank, int64_t esize);
#if CUVIL_LIB_BODY /* the kernel library's code (cuvil_rt.h) */
CUVIL_LIB int64_t cuvil_checked_bytes(const int64_t *shape, int rank, int64_t esize) {
    int64_t n = esize;
    for (int i = 0; i < rank; i++) {
        n = cuvil_mul_nonneg(n, shape[i]);
        if (n < 0) return -1;
    }
    return n;
}
#endif

/* ---- strided views ----------------------------------------------------- */

typedef struct cuvil_view {
    int rank;
    int64_t shape[CUVIL_VIEW_MAX_RANK];
    int64_t stride[CUVIL_VIEW_MAX_RANK]; /* in elements; may be 0 or negative */
} cuvil_view;

/* Drop size-1 dims and merge dims that are contiguous with each other.
 * Returns 0 when the view holds no element. */
#if CUVIL_LIB_BODY /* the kernel library's code (cuvil_rt.h) */
static CUVIL_UNUSED int cuvil_view_simplify(cuvil_view *v, int rank, const int64_t *shape, const int64_t *stride) {
    int r = 0;
    for (int j = 0; j < rank; j++) {
        if (shape[j] == 0) return 0;
        if (shape[j] == 1) continue;
        if (r > 0 && v->stride[r - 1] == stride[j] * shape[j]) {
            v->shape[r - 1] *= shape[j];
            v->stride[r - 1] = stride[j];
            continue;
        }
        v->shape[r] = shape[j];
        v->stride[r] = stride[j];
        r++;
    }
    v->rank = r;
    return 1;
}
#endif

#define CUVIL_VIEW_KERNELS(SUF, T)                                                                              \
    /* d[i] = s[i * st] for i < n */                                                                          \
    static CUVIL_UNUSED void cuvil_vrow_##SUF(T *restrict d, const T *restrict s, int64_t n, int64_t st) {     \
        if (st == 0) {                                                                                        \
            const T x = s[0];                                                                                 \
            for (int64_t i = 0; i < n; i++) d[i] = x;                                                         \
        } else {                                                                                              \
            for (int64_t i = 0; i < n; i++) d[i] = s[i * st];                                                 \
        }                                                                                                     \
    }                                                                                                         \
    /* d[a * NB + b] = s[a + b * ssb] for a < na, b < NB: NB planes interleaved (NB a constant, so the  \
     * loop vectorises with shuffles: an image's 3 or 4 channel planes into channels-last pixels) */       \
    static inline void cuvil_vinterleave_##SUF(T *restrict d, const T *restrict s, int64_t na, int64_t ssb,   \
                                                const int NB) {                                               \
        for (int64_t a = 0; a < na; a++)                                                                      \
            for (int b = 0; b < NB; b++) d[a * NB + b] = s[a + b * ssb];                                      \
    }                                                                                                         \
    /* d[a * dsa + b] = s[a + b * ssb] for a < na, b < nb, in square tiles */                                 \
    static CUVIL_UNUSED void cuvil_vtile_##SUF(T *restrict d, const T *restrict s, int64_t na, int64_t dsa,     \
                                               int64_t nb, int64_t ssb) {                                     \
        if (dsa == nb && nb >= 2 && nb <= 4) {                                                                \
            if (nb == 2) cuvil_vinterleave_##SUF(d, s, na, ssb, 2);                                           \
            else if (nb == 3) cuvil_vinterleave_##SUF(d, s, na, ssb, 3);                                      \
            else cuvil_vinterleave_##SUF(d, s, na, ssb, 4);                                                   \
            return;                                                                                           \
        }                                                                                                     \
        for (int64_t a0 = 0; a0 < na; a0 += CUVIL_VIEW_TILE) {                                                \
            const int64_t ae = na - a0 < CUVIL_VIEW_TILE ? na : a0 + CUVIL_VIEW_TILE;                         \
            for (int64_t b0 = 0; b0 < nb; b0 += CUVIL_VIEW_TILE) {                                            \
                const int64_t be = nb - b0 < CUVIL_VIEW_TILE ? nb : b0 + CUVIL_VIEW_TILE;                     \
                for (int64_t a = a0; a < ae; a++) {                                                           \
                    T *restrict dr = d + a * dsa;                                                             \
                    const T *restrict sr = s + a;                                                             \
                    for (int64_t b = b0; b < be; b++) dr[b] = sr[b * ssb];                                    \
                }                                                                                             \
            }                                                                                                 \
        }                                                                                                     \
    }

#if CUVIL_LIB_BODY /* the kernel library's code (cuvil_rt.h) */
CUVIL_VIEW_KERNELS(1, uint8_t)
CUVIL_VIEW_KERNELS(2, uint16_t)
CUVIL_VIEW_KERNELS(4, uint32_t)
CUVIL_VIEW_KERNELS(8, uint64_t)

static CUVIL_UNUSED void cuvil_vrow(void *d, const void *s, size_t esize, int64_t n, int64_t st) {
    if (st == 1) {
        memcpy(d, s, esize * (size_t)n);
        return;
    }
    switch (esize) {
    case 1: cuvil_vrow_1((uint8_t *)d, (const uint8_t *)s, n, st); break;
    case 2: cuvil_vrow_2((uint16_t *)d, (const uint16_t *)s, n, st); break;
    case 4: cuvil_vrow_4((uint32_t *)d, (const uint32_t *)s, n, st); break;
    default: cuvil_vrow_8((uint64_t *)d, (const uint64_t *)s, n, st); break;
    }
}

static CUVIL_UNUSED void cuvil_vtile(void *d, const void *s, size_t esize, int64_t na, int64_t dsa, int64_t nb,
                                     int64_t ssb) {
    switch (esize) {
    case 1: cuvil_vtile_1((uint8_t *)d, (const uint8_t *)s, na, dsa, nb, ssb); break;
    case 2: cuvil_vtile_2((uint16_t *)d, (const uint16_t *)s, na, dsa, nb, ssb); break;
    case 4: cuvil_vtile_4((uint32_t *)d, (const uint32_t *)s, na, dsa, nb, ssb); break;
    default: cuvil_vtile_8((uint64_t *)d, (const uint64_t *)s, na, dsa, nb, ssb); break;
    }
}
#endif

/* The blocks of a view copy: each is a row of the innermost dim (cuvil_vrow), or, when the
 * innermost dim is strided and dim q has stride 1, a tile of up to CUVIL_VIEW_QCHUNK positions of q
 * by the innermost dim (cuvil_vtile).  Block b is outer position b / nqc (the odometer over the
 * other dims, counted in mixed radix on[]) and chunk b % nqc of q. */
#define CUVIL_VIEW_QCHUNK 256

typedef struct cuvil_view_job {
    unsigned char *d;
    const unsigned char *s;
    int64_t es;
    int no, q;
    int64_t on[CUVIL_VIEW_MAX_RANK], os[CUVIL_VIEW_MAX_RANK], od[CUVIL_VIEW_MAX_RANK];
    int64_t n, st, nq, dq, nqc, blocks, ntasks;
} cuvil_view_job;

#if CUVIL_LIB_BODY /* the kernel library's code (cuvil_rt.h) */
static void cuvil_view_blocks(const cuvil_view_job *j, int64_t lo, int64_t hi) {
    if (lo >= hi) return;
    /* the odometer at block lo, then advanced block by block */
    int64_t idx[CUVIL_VIEW_MAX_RANK], outer = lo / j->nqc, c = lo % j->nqc, so = 0, doff = 0;
    for (int k = j->no - 1; k >= 0; k--) {
        idx[k] = outer % j->on[k];
        outer /= j->on[k];
        so += idx[k] * j->os[k];
        doff += idx[k] * j->od[k];
    }
    for (int64_t b = lo; b < hi; b++) {
        if (j->q >= 0) {
            const int64_t q0 = c * CUVIL_VIEW_QCHUNK;
            const int64_t qn = j->nq - q0 < CUVIL_VIEW_QCHUNK ? j->nq - q0 : CUVIL_VIEW_QCHUNK;
            cuvil_vtile(j->d + (doff + q0 * j->dq) * j->es, j->s + (so + q0) * j->es, (size_t)j->es, qn, j->dq, j->n,
                        j->st);
        } else {
            cuvil_vrow(j->d + doff * j->es, j->s + so * j->es, (size_t)j->es, j->n, j->st);
        }
        if (++c < j->nqc) continue;
        c = 0;
        for (int k = j->no - 1; k >= 0; k--) {
            idx[k]++;
            so += j->os[k];
            doff += j->od[k];
            if (idx[k] < j->on[k]) break;
            so -= j->os[k] * j->on[k];
            doff -= j->od[k] * j->on[k];
            idx[k] = 0;
        }
    }
}

static void cuvil_view_task(void *ctx, int64_t task, int tid) {
    const cuvil_view_job *j = (const cuvil_view_job *)ctx;
    int64_t lo, hi;
    (void)tid;
    cuvil_split(j->blocks, j->ntasks, task, &lo, &hi);
    cuvil_view_blocks(j, lo, hi);
}
#endif

/* Copy the view (rank, shape, stride) of `src` into the contiguous `dst`, row-major.
 * `esize` is 1, 2, 4 or 8; `rank` is at most CUVIL_VIEW_MAX_RANK (the code
 * generator checks it).  The caller guarantees that every position of the view
 * lies inside `src`.  The blocks are split over the call's threads when the bytes
 * copied pay for it; each destination element is written once, by one thread. */
CUVIL_LIB void cuvil_view_copy(void *dst, const void *src, size_t esize, int rank, const int64_t *shape,
                               const int64_t *stride);
#if CUVIL_LIB_BODY /* the kernel library's code (cuvil_rt.h) */
CUVIL_LIB void cuvil_view_copy(void *dst, const void *src, size_t esize, int rank, const int64_t *shape,
                               const int64_t *stride) {
    cuvil_view v;
    if (!cuvil_view_simplify(&v, rank, shape, stride)) return;
    const int r = v.rank;
    if (r == 0) {
        memcpy(dst, src, esize);
        return;
    }
    /* contiguous strides of the destination */
    int64_t dstr[CUVIL_VIEW_MAX_RANK];
    dstr[r - 1] = 1;
    for (int j = r - 2; j >= 0; j--) dstr[j] = dstr[j + 1] * v.shape[j + 1];
    cuvil_view_job job;
    job.d = (unsigned char *)dst;
    job.s = (const unsigned char *)src;
    job.es = (int64_t)esize;
    /* the block: the innermost dim, plus a unit-stride dim q to tile with when the innermost is strided */
    job.q = -1;
    if (v.stride[r - 1] != 1 && v.stride[r - 1] != 0) {
        for (int j = r - 2; j >= 0; j--) {
            if (v.stride[j] == 1) {
                job.q = j;
                break;
            }
        }
    }
    /* the outer dims */
    job.no = 0;
    int64_t outer = 1;
    for (int j = 0; j < r - 1; j++) {
        if (j == job.q) continue;
        job.on[job.no] = v.shape[j];
        job.os[job.no] = v.stride[j];
        job.od[job.no] = dstr[j];
        outer *= v.shape[j];
        job.no++;
    }
    job.n = v.shape[r - 1];
    job.st = v.stride[r - 1];
    job.nq = job.q >= 0 ? v.shape[job.q] : 1;
    job.dq = job.q >= 0 ? dstr[job.q] : 0;
    job.nqc = job.q >= 0 ? (job.nq + CUVIL_VIEW_QCHUNK - 1) / CUVIL_VIEW_QCHUNK : 1;
    job.blocks = outer * job.nqc;
    job.ntasks = 1;
    const int threads = cuvil_num_threads_now();
    if (threads > 1 && job.blocks > 1) {
        /* bytes read and written, at cuvil_parallel_range's streaming rate */
        const double bytes = 2.0 * (double)job.es * (double)outer * (double)job.nq * (double)job.n;
        if (cuvil_parallel_worth(bytes / CUVIL_STREAM_BYTES_PER_NS))
            job.ntasks = job.blocks < 4 * (int64_t)threads ? job.blocks : 4 * (int64_t)threads;
    }
    if (job.ntasks == 1) cuvil_view_blocks(&job, 0, job.blocks);
    else cuvil_parallel_for(job.ntasks, cuvil_view_task, &job);
}
#endif

/* Contiguous row-major strides (in elements) of `shape`. */
CUVIL_LIB void cuvil_strides(const int64_t *shape, int rank, int64_t *strides);
#if CUVIL_LIB_BODY /* the kernel library's code (cuvil_rt.h) */
CUVIL_LIB void cuvil_strides(const int64_t *shape, int rank, int64_t *strides) {
    int64_t s = 1;
    for (int j = rank - 1; j >= 0; j--) {
        strides[j] = s;
        s *= shape[j];
    }
}
#endif

/* Fill `n` elements of `esize` bytes at `dst` with the element at `value`. */
CUVIL_LIB void cuvil_fill(void *dst, const void *value, size_t esize, int64_t n);
#if CUVIL_LIB_BODY /* the kernel library's code (cuvil_rt.h) */
CUVIL_LIB void cuvil_fill(void *dst, const void *value, size_t esize, int64_t n) {
    if (n <= 0) return;
    cuvil_vrow(dst, value, esize, n, 0);
}
#endif

/* Python's slice(*start, end, step).indices(dim): clamps *start in place and
 * returns the slice's length (ONNX Slice follows the same rules).  step != 0. */
static inline CUVIL_UNUSED int64_t cuvil_slice_range(int64_t dim, int64_t *start, int64_t end, int64_t step) {
    int64_t s = *start, e = end;
    if (step > 0) {
        if (s < 0) { s += dim; if (s < 0) s = 0; } else if (s > dim) { s = dim; }
        if (e < 0) { e += dim; if (e < 0) e = 0; } else if (e > dim) { e = dim; }
        *start = s;
        return e > s ? (e - s - 1) / step + 1 : 0;
    }
    if (s < 0) { s += dim; if (s < 0) s = -1; } else if (s >= dim) { s = dim - 1; }
    if (e < 0) { e += dim; if (e < 0) e = -1; } else if (e >= dim) { e = dim - 1; }
    *start = s;
    const int64_t mag = step == INT64_MIN ? INT64_MAX : -step;
    return s > e ? (s - e - 1) / mag + 1 : 0;
}

/* The length of an integer range: max(ceil((limit - start) / delta), 0), exactly;
 * -1 when it does not fit int64.  delta != 0. */
static inline CUVIL_UNUSED int64_t cuvil_range_len(int64_t start, int64_t limit, int64_t delta) {
    uint64_t span, mag;
    if (delta > 0) {
        if (limit <= start) return 0;
        span = (uint64_t)limit - (uint64_t)start;
        mag = (uint64_t)delta;
    } else {
        if (limit >= start) return 0;
        span = (uint64_t)start - (uint64_t)limit;
        mag = (uint64_t)(-(delta + 1)) + 1u;
    }
    uint64_t n = span / mag + (span % mag != 0);
    return n > (uint64_t)INT64_MAX ? -1 : (int64_t)n;
}

#endif /* CUVIL_INDEX_H */
