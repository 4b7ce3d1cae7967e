/* Cuvil's 2-D max pooling: separable, vectorisable, threaded.
 *
 * A max over a kh x kw window is a max over kh rows of maxes over kw columns, so each output row
 * is made in two passes over contiguous memory:
 *
 *   1. vertical: the running max, column by column, of the window's input rows that land inside
 *      the input (a loop over whole rows, which the compiler vectorises);
 *   2. horizontal: each output of the row is the max of the window's columns of that row, with
 *      the taps that land outside the input (padding, the ceil_mode overhang) left out.  Outputs
 *      whose whole window is inside come in one loop per tap over a strided read, which the
 *      compiler also vectorises; the few at the edges have their own bounds.
 *
 * Semantics are the reference's (cuvil/ops/conv.py): padding never takes part, a window with no
 * tap inside the input gives the type's lowest value, and for floats a NaN in the window makes
 * the output NaN (as NumPy's max does).  A max is exact and its order does not matter, so the
 * result is bitwise the same however the rows are split across threads.
 *
 * Work is split over (plane, output row) ranges; each thread has its own row buffers.  Halves are
 * widened to float a row at a time (cuvil_half.h instantiates their pools).  Indices (MaxPool's
 * second output) and other ranks use the generic loops in kernels/pool.py.
 *
 * With AVX-512, the 2x2 stride-2 float32 pool without padding (a VGG's or U-Net's downsampling)
 * has its own path (cuvil_pool_fast_f32): the rows of these pools are short, and the separable
 * passes spent most of their time on the rounded-up row buffers.
 */
#ifndef CUVIL_POOL_H
#define CUVIL_POOL_H

#include "cuvil_conv.h"
#include "cuvil_threads.h"

typedef struct cuvil_pool2d {
    int64_t planes, ih, iw, oh, ow;
    int64_t kh, kw, sh, sw, dh, dw, ph, pw;
} cuvil_pool2d;

/* The max that lets a NaN through from either side (b > a or b is NaN: b; else a, NaN or not). */
#define CUVIL_PMAX_FLOAT(a, b) ((((b) > (a)) | ((b) != (b))) ? (b) : (a))
#define CUVIL_PMAX_INT(a, b) ((b) > (a) ? (b) : (a))

/* Output rows a task makes: enough to amortise its row buffer, few enough to balance two cores. */
#define CUVIL_POOL_ROWS_PER_TASK 16

/* dst[i] = max over taps t of src[i * S + t * dw], for i < n */
#define CUVIL_POOL_ROW(T, PMAX, S)                                                                                  \
    do {                                                                                                            \
        for (int64_t i = 0; i < n; i++) dst[i] = src[i * (S)];                                                      \
        for (int64_t t = 1; t < g->kw; t++) {                                                                       \
            const T *restrict tap = src + t * g->dw;                                                                \
            for (int64_t i = 0; i < n; i++) dst[i] = PMAX(dst[i], tap[i * (S)]);                                    \
        }                                                                                                           \
    } while (0)

/* Output rows are made CUVIL_POOL_VEC at a time (a row buffer rounded up to it), so no output is
 * left to a scalar remainder loop, whose compare-and-select compiles to mispredicted branches. */
#define CUVIL_POOL_VEC 64

/* The row buffers of one thread: the window's columns of an output row, with `pw` lowest values
 * before them and enough after them for every tap of the rounded-up row; then that output row. */
static inline int64_t cuvil_pool2d_owpad(const cuvil_pool2d *g) {
    return (g->ow + CUVIL_POOL_VEC - 1) / CUVIL_POOL_VEC * CUVIL_POOL_VEC;
}
static inline int64_t cuvil_pool2d_cols(const cuvil_pool2d *g) {
    const int64_t reach = (cuvil_pool2d_owpad(g) - 1) * g->sw + (g->kw - 1) * g->dw + 1;
    return reach > g->pw + g->iw ? reach : g->pw + g->iw;
}

/* Row conversions between the element type T and the compute type C: a whole row at a time,
 * so that they vectorise (halves: cuvil_half.h's converters; the rest: the row itself). */
#define CUVIL_POOL_SAME_ROWS(sfx, T)                                                                                \
    static inline const T *cuvil_pool_widen_##sfx(const T *row, T *wide, int64_t n) {                              \
        (void)wide, (void)n;                                                                                        \
        return row;                                                                                                 \
    }                                                                                                               \
    static inline void cuvil_pool_narrow_##sfx(const T *restrict src, T *restrict dst, int64_t n) {                 \
        memcpy(dst, src, sizeof(T) * (size_t)n);                                                                    \
    }
#define CUVIL_POOL_HALF_ROWS(sfx, T)                                                                                \
    static inline const float *cuvil_pool_widen_##sfx(const T *row, float *wide, int64_t n) {                       \
        cuvil_##sfx##_to_f32_n(row, wide, n);                                                                       \
        return wide;                                                                                                \
    }                                                                                                               \
    static inline void cuvil_pool_narrow_##sfx(const float *restrict src, T *restrict dst, int64_t n) {             \
        cuvil_f32_to_##sfx##_n(src, dst, n);                                                                        \
    }

#define CUVIL_DEFINE_MAXPOOL2D(sfx, T, C, LOWEST, PMAX)                                                             \
    typedef struct {                                                                                                \
        const cuvil_pool2d *g;                                                                                      \
        const T *x;                                                                                                 \
        T *y;                                                                                                       \
        C *tmp; /* one set of row buffers per thread, in the compute type */                                        \
        int64_t rows, per_task, per_thread;                                                                         \
    } cuvil_maxpool2d_job_##sfx;                                                                                    \
                                                                                                                    \
    static void cuvil_maxpool2d_rows_##sfx(const cuvil_pool2d *g, const T *restrict x, T *restrict y, C *restrict buf, \
                                           int64_t r0, int64_t r1) {                                               \
        const int64_t ncols = cuvil_pool2d_cols(g), n = cuvil_pool2d_owpad(g);                                     \
        C *restrict cols = buf, *restrict dst = buf + ncols, *restrict wide = dst + n;                              \
        for (int64_t i = 0; i < ncols; i++) cols[i] = LOWEST; /* padding and overhang stay lowest */                \
        C *restrict data = cols + g->pw;                                                                            \
        const C *restrict src = cols;                                                                               \
        for (int64_t r = r0; r < r1; r++) {                                                                         \
            const int64_t p = r / g->oh, oy = r % g->oh;                                                            \
            const T *restrict plane = x + p * g->ih * g->iw;                                                        \
            T *restrict out = y + p * g->oh * g->ow + oy * g->ow;                                                   \
            const int64_t base = oy * g->sh - g->ph;                                                                \
            int64_t tlo, thi;                                                                                       \
            cuvil_conv_valid(base, g->dh, g->ih, g->kh, &tlo, &thi);                                                \
            if (tlo == thi) { /* no row of the window inside the input */                                           \
                for (int64_t ox = 0; ox < g->ow; ox++) dst[ox] = LOWEST;                                            \
                cuvil_pool_narrow_##sfx(dst, out, g->ow);                                                           \
                continue;                                                                                           \
            }                                                                                                       \
            const C *row = cuvil_pool_widen_##sfx(plane + (base + tlo * g->dh) * g->iw, wide, g->iw);              \
            for (int64_t i = 0; i < g->iw; i++) data[i] = row[i];                                                   \
            for (int64_t t = tlo + 1; t < thi; t++) {                                                               \
                row = cuvil_pool_widen_##sfx(plane + (base + t * g->dh) * g->iw, wide, g->iw);                     \
                for (int64_t i = 0; i < g->iw; i++) data[i] = PMAX(data[i], row[i]);                                \
            }                                                                                                       \
            if (g->sw == 1) CUVIL_POOL_ROW(C, PMAX, 1);                                                             \
            else if (g->sw == 2) CUVIL_POOL_ROW(C, PMAX, 2);                                                        \
            else CUVIL_POOL_ROW(C, PMAX, g->sw);                                                                    \
            cuvil_pool_narrow_##sfx(dst, out, g->ow); /* a max is one of its inputs: narrowing is exact */          \
        }                                                                                                           \
    }                                                                                                               \
                                                                                                                    \
    static void cuvil_maxpool2d_task_##sfx(void *ctx, int64_t task, int tid) {                                      \
        cuvil_maxpool2d_job_##sfx *j = (cuvil_maxpool2d_job_##sfx *)ctx;                                            \
        const int64_t r0 = task * j->per_task;                                                                      \
        const int64_t r1 = r0 + j->per_task < j->rows ? r0 + j->per_task : j->rows;                                 \
        cuvil_maxpool2d_rows_##sfx(j->g, j->x, j->y, j->tmp + (int64_t)tid * j->per_thread, r0, r1);                \
    }                                                                                                               \
                                                                                                                    \
    /* 0, or -1 when the row buffers cannot be had. */                                                              \
    static CUVIL_UNUSED int cuvil_maxpool2d_##sfx(const cuvil_pool2d *g, const T *x, T *y) {                       \
        const int64_t rows = g->planes * g->oh;                                                                     \
        if (rows <= 0 || g->ow <= 0) return 0;                                                                      \
        if (cuvil_pool_fast_##sfx(g, x, y)) return 0;                                                               \
        /* ~0.3 ns per element of a vertical pass and per tap of a horizontal one */                                \
        const double ns = 0.3 * (double)rows * (double)(g->kh * g->iw + g->kw * g->ow);                             \
        int threads = cuvil_num_threads_now();                                                                      \
        if (threads > 1 && !cuvil_parallel_worth(ns)) threads = 1;                                                  \
        /* the columns, the output row, a widened input row */                                                      \
        const int64_t per_thread = cuvil_pool2d_cols(g) + cuvil_pool2d_owpad(g) + g->iw;                           \
        const size_t bytes = cuvil_size3(sizeof(C), (size_t)threads, (size_t)per_thread);                           \
        C *tmp = bytes == SIZE_MAX ? NULL : (C *)malloc(bytes);                                                     \
        if (!tmp) return -1;                                                                                        \
        const int64_t per_task = threads > 1 ? CUVIL_POOL_ROWS_PER_TASK : rows;                                     \
        cuvil_maxpool2d_job_##sfx j = {g, x, y, tmp, rows, per_task, per_thread};                                   \
        cuvil_parallel_for((rows + per_task - 1) / per_task, cuvil_maxpool2d_task_##sfx, &j);                       \
        free(tmp);                                                                                                  \
        return 0;                                                                                                   \
    }

#if defined(__AVX512F__)
/* The 2x2, stride-2 float32 pool with every window inside the input (no padding, no dilation, no
 * overhang), the common case: each output row from its two input rows in registers, 16 outputs
 * per step: the vertical max of 32 columns, then the max of each even column and the odd one after
 * it, in the generic path's order (so NaN payloads come out the same). */
static inline __m512 cuvil_pool_pmax16(__m512 a, __m512 b) {
    const __mmask16 take_b = _mm512_cmp_ps_mask(b, a, _CMP_GT_OQ) | _mm512_cmp_ps_mask(b, b, _CMP_UNORD_Q);
    return _mm512_mask_blend_ps(take_b, a, b);
}

typedef struct {
    const cuvil_pool2d *g;
    const float *x;
    float *y;
    int64_t rows, per_task;
} cuvil_maxpool2x2_job;

static void cuvil_maxpool2x2_task(void *ctx, int64_t task, int tid) {
    (void)tid;
    const cuvil_maxpool2x2_job *j = (const cuvil_maxpool2x2_job *)ctx;
    const cuvil_pool2d *g = j->g;
    const __m512i even = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
    const __m512i odd = _mm512_setr_epi32(1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31);
    const int64_t r0 = task * j->per_task, r1 = r0 + j->per_task < j->rows ? r0 + j->per_task : j->rows;
    for (int64_t r = r0; r < r1; r++) {
        const int64_t p = r / g->oh, oy = r % g->oh;
        const float *top = j->x + (p * g->ih + 2 * oy) * g->iw, *bottom = top + g->iw;
        float *out = j->y + r * g->ow;
        for (int64_t ox = 0; ox < g->ow; ox += 16) {
            const int64_t m = g->ow - ox < 16 ? g->ow - ox : 16; /* outputs of this step */
            const __mmask16 k0 = (__mmask16)(m >= 8 ? 0xffffu : (1u << (2 * m)) - 1u);
            const __mmask16 k1 = (__mmask16)(m > 8 ? (m == 16 ? 0xffffu : (1u << (2 * m - 16)) - 1u) : 0u);
            const __m512 a0 = _mm512_maskz_loadu_ps(k0, top + 2 * ox), a1 = _mm512_maskz_loadu_ps(k1, top + 2 * ox + 16);
            const __m512 b0 = _mm512_maskz_loadu_ps(k0, bottom + 2 * ox);
            const __m512 b1 = _mm512_maskz_loadu_ps(k1, bottom + 2 * ox + 16);
            const __m512 v0 = cuvil_pool_pmax16(a0, b0), v1 = cuvil_pool_pmax16(a1, b1);
            const __m512 e = _mm512_permutex2var_ps(v0, even, v1), o = _mm512_permutex2var_ps(v0, odd, v1);
            _mm512_mask_storeu_ps(out + ox, (__mmask16)(m == 16 ? 0xffffu : (1u << m) - 1u), cuvil_pool_pmax16(e, o));
        }
    }
}

/* 1 when the 2x2 stride-2 path ran (0: the pool is another shape; the other element types have no
 * such path). */
static inline int cuvil_pool_fast_f32(const cuvil_pool2d *g, const float *x, float *y) {
    if (!(g->kh == 2 && g->kw == 2 && g->sh == 2 && g->sw == 2 && g->dh == 1 && g->dw == 1 && g->ph == 0 &&
          g->pw == 0 && 2 * g->oh <= g->ih && 2 * g->ow <= g->iw))
        return 0;
    const int64_t rows = g->planes * g->oh;
    if (rows <= 0 || g->ow <= 0) return 1;
    /* ~5 ns per 16 outputs of a row, and per row */
    const double ns = 5.0 * (double)rows * (double)((g->ow + 15) / 16 + 1);
    const int threads = cuvil_num_threads_now() > 1 && cuvil_parallel_worth(ns) ? cuvil_num_threads_now() : 1;
    const int64_t per_task = threads > 1 ? (rows + 8 * threads - 1) / (8 * threads) : rows;
    cuvil_maxpool2x2_job j = {g, x, y, rows, per_task};
    cuvil_parallel_for((rows + per_task - 1) / per_task, cuvil_maxpool2x2_task, &j);
    return 1;
}
#else
static inline int cuvil_pool_fast_f32(const cuvil_pool2d *g, const float *x, float *y) {
    return (void)g, (void)x, (void)y, 0;
}
#endif
static inline int cuvil_pool_fast_f64(const cuvil_pool2d *g, const double *x, double *y) {
    return (void)g, (void)x, (void)y, 0;
}
static inline int cuvil_pool_fast_u8(const cuvil_pool2d *g, const uint8_t *x, uint8_t *y) {
    return (void)g, (void)x, (void)y, 0;
}
static inline int cuvil_pool_fast_i8(const cuvil_pool2d *g, const int8_t *x, int8_t *y) {
    return (void)g, (void)x, (void)y, 0;
}

CUVIL_POOL_SAME_ROWS(f32, float)
CUVIL_POOL_SAME_ROWS(f64, double)
CUVIL_POOL_SAME_ROWS(u8, uint8_t)
CUVIL_POOL_SAME_ROWS(i8, int8_t)

CUVIL_DEFINE_MAXPOOL2D(f32, float, float, -INFINITY, CUVIL_PMAX_FLOAT)

CUVIL_DEFINE_MAXPOOL2D(f64, double, double, -INFINITY, CUVIL_PMAX_FLOAT)
CUVIL_DEFINE_MAXPOOL2D(u8, uint8_t, uint8_t, 0, CUVIL_PMAX_INT)
CUVIL_DEFINE_MAXPOOL2D(i8, int8_t, int8_t, -128, CUVIL_PMAX_INT)

#endif /* CUVIL_POOL_H */
