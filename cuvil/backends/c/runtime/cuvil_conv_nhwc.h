/* Cuvil's channels-last 2-D convolutions (conv_nhwc: X [N, H, W, C], W [KH, KW, C/group, M],
 * Y [N, OH, OW, M]), float32: the entry points the generated code calls.
 *
 * Dense and grouped convolutions (cuvil_conv_nhwc_f32) run the direct kernel of
 * cuvil_nhwc_direct.h.  Where it does not apply (no vector extensions, or weight panels too
 * large for the cache) they run, per group, one GEMM  Y_g [P, Mg] = cols [P, K] x W_g [K, Mg]
 * with K = KH*KW*Cg:
 *   - a 1x1 kernel with unit strides and no padding needs no im2col: the input itself is the
 *     [P, C] matrix (each group a column slice of it);
 *   - otherwise the im2col row of a pixel is KH*KW contiguous runs of Cg channels, copied
 *     whole; it is built for blocks of pixels at a time (CUVIL_NHWC_COLS_BYTES), so the
 *     buffer stays small whatever the image size.
 * The weight is the GEMM's B operand as it lies (rows K, columns M): a constant weight is
 * packed once per model by cuvil_sgemm_ep (cuvil_gemm.h).  The bias and the node's fused
 * epilogue run on each finished GEMM tile (cuvil_nhwc_finish below).
 *
 * Depthwise convolutions (one input channel per group) run a direct kernel that is vectorised
 * across channels: a strip of output pixels by one vector of channels is kept in registers
 * across all kernel taps.  3-wide kernels at column stride 1 or 2 (MobileNet's) take strips of
 * CUVIL_NHWC_DW3_R pixels that load each input vector of a tap row once for all the outputs
 * reading it, the border strips reading columns outside the image as zeros; other shapes take
 * strips of CUVIL_NHWC_DW_OB pixels with every tap's column in the image, and pixels one at a
 * time at the borders.  Rows of output pixels are the parallel tasks.
 *
 * Every output element is computed by one thread, in an order that does not depend on the
 * number of threads: results are bitwise the same for any thread count.
 */
#ifndef CUVIL_CONV_NHWC_H
#define CUVIL_CONV_NHWC_H

#include "cuvil_gemm.h"
#include "cuvil_nhwc_direct.h"
#include "cuvil_rt.h"
#include "cuvil_threads.h"

/* The im2col buffer of one block of output pixels holds at most this many bytes. */
#define CUVIL_NHWC_COLS_BYTES ((int64_t)4 << 20)
/* Output pixels a depthwise strip keeps in registers (cuvil_nhwc_dw_strip names them). */
#define CUVIL_NHWC_DW_OB 4
/* Below this many multiply-adds a depthwise convolution runs on one thread. */
#define CUVIL_NHWC_PAR_MIN ((int64_t)1 << 16)

/* The bias and then the fused epilogue (either may be absent) on a finished tile of Y.  As a
 * cuvil_sgemm_epi_fn it finds the tile's columns from its offset in Y, whose rows are m wide. */
typedef struct cuvil_nhwc_finish {
    const float *y, *b;
    int64_t m;
    const cuvil_sgemm_epilogue *next;
} cuvil_nhwc_finish;

#if CUVIL_LIB_BODY /* the kernel library's code (cuvil_rt.h) */
static void cuvil_nhwc_finish_fn(const void *ctx, float *c, int64_t ldc, int64_t i0, int64_t j0, int64_t rows,
                                 int64_t cols) {
    const cuvil_nhwc_finish *f = (const cuvil_nhwc_finish *)ctx;
    if (f->b) {
        const float *restrict b = f->b + (int64_t)(c - f->y) % f->m; /* a tile never wraps past a row of Y */
        for (int64_t i = 0; i < rows; i++) {
            float *restrict r = c + i * ldc;
            for (int64_t j = 0; j < cols; j++) r[j] += b[j];
        }
    }
    if (f->next) f->next->fn(f->next->ctx, c, ldc, i0, j0, rows, cols);
}

/* cols[p - p0, :] = the im2col row of output pixel p, for p in [p0, p1), channels [c0, c0 + cg). */
static void cuvil_nhwc_im2col(const cuvil_nhwc_geom *g, const float *x, int64_t c0, int64_t cg, int64_t p0,
                              int64_t p1, float *cols) {
    const int64_t K = g->kh * g->kw * cg, plane = g->oh * g->ow;
    for (int64_t p = p0; p < p1; p++) {
        const int64_t n = p / plane, oh = p % plane / g->ow, ow = p % g->ow;
        float *restrict row = cols + (p - p0) * K;
        for (int64_t i = 0; i < g->kh; i++) {
            const int64_t ih = oh * g->sh - g->ph + i * g->dh;
            for (int64_t j = 0; j < g->kw; j++) {
                const int64_t iw = ow * g->sw - g->pw + j * g->dw;
                float *restrict dst = row + (i * g->kw + j) * cg;
                if (ih < 0 || ih >= g->h || iw < 0 || iw >= g->w)
                    memset(dst, 0, sizeof(float) * (size_t)cg);
                else
                    memcpy(dst, x + ((n * g->h + ih) * g->w + iw) * g->c + c0, sizeof(float) * (size_t)cg);
            }
        }
    }
}
#endif

typedef struct cuvil_nhwc_cols_job {
    const cuvil_nhwc_geom *g;
    const float *x;
    float *cols;
    int64_t c0, cg, p0, p1, tasks;
} cuvil_nhwc_cols_job;

#if CUVIL_LIB_BODY /* the kernel library's code (cuvil_rt.h) */
static void cuvil_nhwc_im2col_part(void *ctx, int64_t task, int tid) {
    const cuvil_nhwc_cols_job *j = (const cuvil_nhwc_cols_job *)ctx;
    int64_t lo, hi;
    (void)tid;
    cuvil_split(j->p1 - j->p0, j->tasks, task, &lo, &hi);
    cuvil_nhwc_im2col(j->g, j->x, j->c0, j->cg, j->p0 + lo, j->p0 + hi,
                      j->cols + lo * j->g->kh * j->g->kw * j->cg);
}

/* Dense (and grouped) convolution by GEMM.  Returns 0, or -1 when memory cannot be had. */
static CUVIL_UNUSED int cuvil_conv_nhwc_gemm_f32(const cuvil_nhwc_geom *g, const float *x, const float *w,
                                                 const float *b, float *y, const cuvil_sgemm_epilogue *ep) {
    const int64_t P = g->n * g->oh * g->ow, cg = g->c / g->group, mg = g->m / g->group;
    const int64_t K = g->kh * g->kw * cg;
    if (P == 0 || g->m == 0) return 0;
    const cuvil_nhwc_finish fin = {y, b, g->m, ep};
    const cuvil_sgemm_epilogue finish = {cuvil_nhwc_finish_fn, &fin};
    const cuvil_sgemm_epilogue *tail = b ? &finish : ep;
    const int direct = g->kh == 1 && g->kw == 1 && g->sh == 1 && g->sw == 1 && g->ph == 0 && g->pw == 0 &&
                       g->oh == g->h && g->ow == g->w;
    if (direct) {
        for (int64_t gi = 0; gi < g->group; gi++)
            if (cuvil_sgemm_ep(P, mg, K, 1.0f, x + gi * cg, g->c, 1, w + gi * mg, g->m, 1, 0.0f, y + gi * mg, g->m,
                               tail) != 0)
                return -1;
        return 0;
    }
    int64_t block = K > 0 ? CUVIL_NHWC_COLS_BYTES / (K * (int64_t)sizeof(float)) : P;
    block = block < CUVIL_GEMM_MR ? CUVIL_GEMM_MR : block / CUVIL_GEMM_MR * CUVIL_GEMM_MR;
    if (block > P) block = P;
    float *cols = (float *)malloc(cuvil_size3(sizeof(float), (size_t)block, (size_t)(K > 0 ? K : 1)));
    if (!cols) return -1;
    const int threads = cuvil_num_threads_now();
    int rc = 0;
    for (int64_t p0 = 0; p0 < P && rc == 0; p0 += block) {
        const int64_t p1 = p0 + block < P ? p0 + block : P;
        for (int64_t gi = 0; gi < g->group && rc == 0; gi++) {
            cuvil_nhwc_cols_job j = {g, x, cols, gi * cg, cg, p0, p1, 1};
            /* a copy: worth splitting when each thread gets a fair share of it */
            if (threads > 1 && cuvil_parallel_worth((double)(p1 - p0) * (double)K / CUVIL_GEMM_BYTES_PER_NS))
                j.tasks = threads;
            cuvil_parallel_for(j.tasks, cuvil_nhwc_im2col_part, &j);
            rc = cuvil_sgemm_ep(p1 - p0, mg, K, 1.0f, cols, K, 1, w + gi * mg, g->m, 1, 0.0f,
                                y + p0 * g->m + gi * mg, g->m, tail);
        }
    }
    free(cols);
    return rc;
}
#endif

/* Dense (and grouped) convolution: the direct kernel (cuvil_nhwc_direct.h) when the target has
 * vectors and the weight panels stay cacheable, im2col + GEMM otherwise.  Returns 0, or -1 when
 * memory cannot be had. */
CUVIL_LIB int cuvil_conv_nhwc_f32(const cuvil_nhwc_geom *g, const float *x, const float *w, const float *b,
                                  float *y, const cuvil_sgemm_epilogue *ep);
#if CUVIL_LIB_BODY /* the kernel library's code (cuvil_rt.h) */
CUVIL_LIB int cuvil_conv_nhwc_f32(const cuvil_nhwc_geom *g, const float *x, const float *w, const float *b,
                                  float *y, const cuvil_sgemm_epilogue *ep) {
#if CUVIL_NHWC_DIRECT
    if (cuvil_nhwc_direct_fits(g)) return cuvil_conv_nhwc_direct_f32(g, x, w, b, y, ep);
#endif
    return cuvil_conv_nhwc_gemm_f32(g, x, w, b, y, ep);
}
#endif

/* ---- depthwise ---------------------------------------------------------------------------- */

typedef struct cuvil_nhwc_dw_job {
    const cuvil_nhwc_geom *g;
    const float *x, *w, *b;
    float *y;
    const cuvil_sgemm_epilogue *ep;
    int64_t tasks;
} cuvil_nhwc_dw_job;

/* yr[ow, m] for ow in [o0, o1) of output row (n, oh), for the channel multiplier `mult` (outputs
 * per input channel); generic, one pixel at a time, every tap checked. */
CUVIL_LIB void cuvil_nhwc_dw_pixels(const cuvil_nhwc_geom *g, const float *x, const float *w, float *yr, int64_t n,
                                    int64_t oh, int64_t o0, int64_t o1, int64_t mult);
#if CUVIL_LIB_BODY /* the kernel library's code (cuvil_rt.h) */
CUVIL_LIB void cuvil_nhwc_dw_pixels(const cuvil_nhwc_geom *g, const float *x, const float *w, float *yr, int64_t n,
                                    int64_t oh, int64_t o0, int64_t o1, int64_t mult) {
    const int64_t M = g->m;
    for (int64_t ow = o0; ow < o1; ow++) {
        float *restrict yo = yr + ow * M;
        for (int64_t m = 0; m < M; m++) yo[m] = 0.0f;
        for (int64_t i = 0; i < g->kh; i++) {
            const int64_t ih = oh * g->sh - g->ph + i * g->dh;
            if (ih < 0 || ih >= g->h) continue;
            for (int64_t j = 0; j < g->kw; j++) {
                const int64_t iw = ow * g->sw - g->pw + j * g->dw;
                if (iw < 0 || iw >= g->w) continue;
                const float *restrict xs = x + ((n * g->h + ih) * g->w + iw) * g->c;
                const float *restrict wt = w + (i * g->kw + j) * M;
                if (mult == 1)
                    for (int64_t m = 0; m < M; m++) yo[m] += xs[m] * wt[m];
                else
                    for (int64_t m = 0; m < M; m++) yo[m] += xs[m / mult] * wt[m];
            }
        }
    }
}
#endif

#if CUVIL_GEMM_VECTOR
/* yr[ow, :] for ow in [o0, o0 + OB) (every tap's column in the image for all of them) and one
 * multiplier: OB pixels by one vector of channels accumulate in registers over the taps. */
#if CUVIL_LIB_BODY /* the kernel library's code (cuvil_rt.h) */
static void cuvil_nhwc_dw_strip(const cuvil_nhwc_geom *g, const float *x, const float *w, float *yr, int64_t n,
                                int64_t oh, int64_t o0) {
    const int64_t C = g->c, VW = CUVIL_GEMM_W;
    const int64_t cv = C / VW * VW;
    const int64_t step = g->sw * C; /* from one output pixel's input to the next's */
    for (int64_t c = 0; c < cv; c += VW) {
        cuvil_vf a0 = {0}, a1 = {0}, a2 = {0}, a3 = {0}; /* CUVIL_NHWC_DW_OB pixels, named: kept in registers */
        for (int64_t i = 0; i < g->kh; i++) {
            const int64_t ih = oh * g->sh - g->ph + i * g->dh;
            if (ih < 0 || ih >= g->h) continue;
            const float *xrow = x + (n * g->h + ih) * g->w * C + c + (o0 * g->sw - g->pw) * C;
            const float *wrow = w + i * g->kw * C + c;
            for (int64_t j = 0; j < g->kw; j++) {
                const cuvil_vf wv = cuvil_vload(wrow + j * C);
                const float *xs = xrow + j * g->dw * C;
                a0 = CUVIL_VFMA(cuvil_vload(xs), wv, a0);
                a1 = CUVIL_VFMA(cuvil_vload(xs + step), wv, a1);
                a2 = CUVIL_VFMA(cuvil_vload(xs + 2 * step), wv, a2);
                a3 = CUVIL_VFMA(cuvil_vload(xs + 3 * step), wv, a3);
            }
        }
        float *yo = yr + o0 * C + c;
        cuvil_vstore(yo, a0);
        cuvil_vstore(yo + C, a1);
        cuvil_vstore(yo + 2 * C, a2);
        cuvil_vstore(yo + 3 * C, a3);
    }
    /* the channels past the last full vector, in the same order of taps */
    for (int64_t c = cv; c < C; c++) {
        for (int o = 0; o < CUVIL_NHWC_DW_OB; o++) {
            float acc = 0.0f;
            for (int64_t i = 0; i < g->kh; i++) {
                const int64_t ih = oh * g->sh - g->ph + i * g->dh;
                if (ih < 0 || ih >= g->h) continue;
                for (int64_t j = 0; j < g->kw; j++) {
                    const int64_t iw = (o0 + o) * g->sw - g->pw + j * g->dw;
                    acc += x[((n * g->h + ih) * g->w + iw) * C + c] * w[(i * g->kw + j) * C + c];
                }
            }
            yr[(o0 + o) * C + c] = acc;
        }
    }
}
#endif

/* The 3-wide kernels with unit column dilation and column stride S (1 or 2): a strip of R output
 * pixels per vector of channels, each input vector of a tap row loaded once and multiplied into
 * every output of the strip that reads it (3 of them at stride 1), so a tap row costs
 * (R - 1) * S + 3 loads instead of 3 * R.  With EDGE, input columns outside the image read as
 * zeros (the strips at the borders); taps are added in the generic order (rows, then columns). */
#if CUVIL_GEMM_NREG >= 32
#define CUVIL_NHWC_DW3_R 8
#else
#define CUVIL_NHWC_DW3_R 4
#endif
static inline __attribute__((always_inline)) void cuvil_nhwc_dw3_strip(const int S, const int R, const int EDGE,
                                                                       const cuvil_nhwc_geom *g, const float *x,
                                                                       const float *w, float *yr, int64_t n,
                                                                       int64_t oh, int64_t o0) {
    const int64_t C = g->c, VW = CUVIL_GEMM_W, cv = C / VW * VW, iw0 = o0 * S - g->pw;
    for (int64_t c = 0; c < cv; c += VW) {
        cuvil_vf acc[CUVIL_NHWC_DW3_R];
#pragma GCC unroll 8
        for (int o = 0; o < R; o++) acc[o] = (cuvil_vf){0};
        for (int64_t i = 0; i < 3; i++) {
            const int64_t ih = oh * g->sh - g->ph + i * g->dh;
            if (ih < 0 || ih >= g->h) continue;
            const float *xrow = x + (n * g->h + ih) * g->w * C + c;
            const cuvil_vf w0 = cuvil_vload(w + i * 3 * C + c), w1 = cuvil_vload(w + (i * 3 + 1) * C + c),
                           w2 = cuvil_vload(w + (i * 3 + 2) * C + c);
#pragma GCC unroll 24
            for (int t = 0; t < (R - 1) * S + 3; t++) {
                const int64_t iw = iw0 + t;
                const cuvil_vf xv = !EDGE || (iw >= 0 && iw < g->w) ? cuvil_vload(xrow + iw * C) : (cuvil_vf){0};
                if (t % S == 0 && t / S < R) acc[t / S] = CUVIL_VFMA(xv, w0, acc[t / S]);
                if (t >= 1 && (t - 1) % S == 0 && (t - 1) / S < R) acc[(t - 1) / S] = CUVIL_VFMA(xv, w1, acc[(t - 1) / S]);
                if (t >= 2 && (t - 2) % S == 0 && (t - 2) / S < R) acc[(t - 2) / S] = CUVIL_VFMA(xv, w2, acc[(t - 2) / S]);
            }
        }
#pragma GCC unroll 8
        for (int o = 0; o < R; o++) cuvil_vstore(yr + (o0 + o) * C + c, acc[o]);
    }
    for (int64_t c = cv; c < C; c++) /* the channels past the last full vector, in the same order of taps */
        for (int o = 0; o < R; o++) {
            float acc = 0.0f;
            for (int64_t i = 0; i < 3; i++) {
                const int64_t ih = oh * g->sh - g->ph + i * g->dh;
                if (ih < 0 || ih >= g->h) continue;
                for (int64_t j = 0; j < 3; j++) {
                    const int64_t iw = iw0 + o * S + j;
                    if (iw >= 0 && iw < g->w) acc += x[((n * g->h + ih) * g->w + iw) * C + c] * w[(i * 3 + j) * C + c];
                }
            }
            yr[(o0 + o) * C + c] = acc;
        }
}

/* Output columns [o, ow) of a row of a 3-wide depthwise convolution with column stride S: strips of
 * R then 4 pixels (bounds-checked where they reach past [olo, ohi)); returns where they stop. */
static inline __attribute__((always_inline)) int64_t cuvil_nhwc_dw3_row(const int S, const cuvil_nhwc_geom *g,
                                                                        const float *x, const float *w, float *yr,
                                                                        int64_t n, int64_t oh, int64_t olo,
                                                                        int64_t ohi) {
    const int R = CUVIL_NHWC_DW3_R;
    int64_t o = 0;
    for (; o + R <= g->ow; o += R) {
        if (o >= olo && o + R <= ohi) cuvil_nhwc_dw3_strip(S, R, 0, g, x, w, yr, n, oh, o);
        else cuvil_nhwc_dw3_strip(S, R, 1, g, x, w, yr, n, oh, o);
    }
#if CUVIL_NHWC_DW3_R > 4
    for (; o + 4 <= g->ow; o += 4) {
        if (o >= olo && o + 4 <= ohi) cuvil_nhwc_dw3_strip(S, 4, 0, g, x, w, yr, n, oh, o);
        else cuvil_nhwc_dw3_strip(S, 4, 1, g, x, w, yr, n, oh, o);
    }
#endif
    return o;
}
#endif

/* Output row (n, oh) of a depthwise convolution into yr[ow, m] (olo, ohi: cuvil_nhwc_interior_cols). */
CUVIL_LIB void cuvil_nhwc_dw_row(const cuvil_nhwc_geom *g, const float *x, const float *w, float *yr, int64_t n,
                                 int64_t oh, int64_t olo, int64_t ohi);
#if CUVIL_LIB_BODY /* the kernel library's code (cuvil_rt.h) */
CUVIL_LIB void cuvil_nhwc_dw_row(const cuvil_nhwc_geom *g, const float *x, const float *w, float *yr, int64_t n,
                                 int64_t oh, int64_t olo, int64_t ohi) {
    const int64_t mult = g->m / g->c;
#if CUVIL_GEMM_VECTOR
    if (mult == 1 && g->kh == 3 && g->kw == 3 && g->dw == 1 && (g->sw == 1 || g->sw == 2)) {
        const int64_t o = g->sw == 1 ? cuvil_nhwc_dw3_row(1, g, x, w, yr, n, oh, olo, ohi)
                                     : cuvil_nhwc_dw3_row(2, g, x, w, yr, n, oh, olo, ohi);
        cuvil_nhwc_dw_pixels(g, x, w, yr, n, oh, o, g->ow, 1);
        return;
    }
    if (mult == 1) {
        int64_t o = olo;
        cuvil_nhwc_dw_pixels(g, x, w, yr, n, oh, 0, olo, 1);
        for (; o + CUVIL_NHWC_DW_OB <= ohi; o += CUVIL_NHWC_DW_OB) cuvil_nhwc_dw_strip(g, x, w, yr, n, oh, o);
        cuvil_nhwc_dw_pixels(g, x, w, yr, n, oh, o, g->ow, 1);
        return;
    }
#else
    (void)olo, (void)ohi;
#endif
    cuvil_nhwc_dw_pixels(g, x, w, yr, n, oh, 0, g->ow, mult);
}

static void cuvil_nhwc_dw_part(void *ctx, int64_t task, int tid) {
    const cuvil_nhwc_dw_job *jb = (const cuvil_nhwc_dw_job *)ctx;
    const cuvil_nhwc_geom *g = jb->g;
    int64_t lo, hi;
    (void)tid;
    cuvil_split(g->n * g->oh, jb->tasks, task, &lo, &hi);
    int64_t olo, ohi; /* the output columns whose every tap lies inside the image */
    cuvil_nhwc_interior_cols(g, &olo, &ohi);
    for (int64_t r = lo; r < hi; r++) {
        float *yr = jb->y + r * g->ow * g->m;
        cuvil_nhwc_dw_row(g, jb->x, jb->w, yr, r / g->oh, r % g->oh, olo, ohi);
        if (jb->ep) jb->ep->fn(jb->ep->ctx, yr, g->m, r * g->ow, 0, g->ow, g->m);
    }
}
#endif

/* Rows of output pixels a depthwise convolution splits into tasks for the call's threads (1: none). */
CUVIL_LIB int64_t cuvil_nhwc_dw_tasks(const cuvil_nhwc_geom *g);
#if CUVIL_LIB_BODY /* the kernel library's code (cuvil_rt.h) */
CUVIL_LIB int64_t cuvil_nhwc_dw_tasks(const cuvil_nhwc_geom *g) {
    const int64_t rows = g->n * g->oh;
    const double macs = (double)rows * (double)g->ow * (double)g->m * (double)(g->kh * g->kw);
    const int threads = cuvil_num_threads_now();
    if (threads > 1 && macs >= (double)CUVIL_NHWC_PAR_MIN && cuvil_parallel_worth(macs / CUVIL_GEMM_MAC_PER_NS * 4.0))
        return rows < (int64_t)threads * 4 ? rows : (int64_t)threads * 4;
    return 1;
}
#endif

/* Depthwise convolution (group == C, M a multiple of C). */
CUVIL_LIB void cuvil_conv_nhwc_depthwise_f32(const cuvil_nhwc_geom *g, const float *x, const float *w,
                                             const float *b, float *y, const cuvil_sgemm_epilogue *ep);
#if CUVIL_LIB_BODY /* the kernel library's code (cuvil_rt.h) */
CUVIL_LIB void cuvil_conv_nhwc_depthwise_f32(const cuvil_nhwc_geom *g, const float *x, const float *w,
                                             const float *b, float *y, const cuvil_sgemm_epilogue *ep) {
    const int64_t rows = g->n * g->oh;
    if (rows == 0 || g->ow == 0 || g->m == 0) return;
    const cuvil_nhwc_finish fin = {y, b, g->m, ep};
    const cuvil_sgemm_epilogue finish = {cuvil_nhwc_finish_fn, &fin};
    const int64_t tasks = cuvil_nhwc_dw_tasks(g);
    cuvil_nhwc_dw_job jb = {g, x, w, b, y, b ? &finish : ep, tasks};
    cuvil_parallel_for(tasks, cuvil_nhwc_dw_part, &jb);
}
#endif

#endif /* CUVIL_CONV_NHWC_H */
