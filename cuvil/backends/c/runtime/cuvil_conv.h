/* Cuvil's convolution kernels (ONNX layout: X [N, C, D1..Dn], W [M, C/group, k1..kn]).
 *
 * A convolution is, per image and group, one GEMM:
 *     Y_g [Mg, P] = W_g [Mg, Cg * taps] x cols [Cg * taps, P]
 * where cols is the im2col matrix of the image (P = output pixels).  A 1x1
 * kernel with unit strides and no padding needs no im2col: the image itself
 * is the [Cg, P] matrix.  Depthwise 2-D convolutions (one input channel per
 * group) run a direct kernel instead: their GEMMs would be 1-deep.
 *
 * A transposed convolution is the adjoint: cols = W_g^T x X_g, then col2im
 * scatter-adds each column into the output.
 *
 * f32 runs on cuvil_sgemm; f64 has its own (simple) GEMM, since the
 * reference accumulates f64 in f64.  f16/bf16 are converted to f32 by the
 * generated code.  The type-generic parts are instantiated from macros.
 */
#ifndef CUVIL_CONV_H
#define CUVIL_CONV_H

#include "cuvil_gemm.h"
#include "cuvil_rt.h"
#include "cuvil_threads.h"

/* Below this many elements of work a conv step (im2col, depthwise) runs on one thread. */
#define CUVIL_CONV_PAR_MIN ((int64_t)1 << 15)
/* Thread counts up to this keep their per-thread failure flags on the stack. */
#define CUVIL_CONV_MAXT 64

#define CUVIL_CONV_MAXD 6

/* The geometry of one convolution node (spatial arrays hold `nsp` entries). */
typedef struct cuvil_conv_geom {
    int nsp;
    int64_t batch, group;
    int64_t cin, cout; /* total input / output channels */
    int64_t in[CUVIL_CONV_MAXD], out[CUVIL_CONV_MAXD], k[CUVIL_CONV_MAXD];
    int64_t stride[CUVIL_CONV_MAXD], dil[CUVIL_CONV_MAXD], pad[CUVIL_CONV_MAXD]; /* pad: at the beginning */
} cuvil_conv_geom;

static inline int64_t cuvil_conv_prod(const int64_t *a, int n) {
    int64_t p = 1;
    for (int i = 0; i < n; i++) p *= a[i];
    return p;
}

/* The range [lo, hi) of positions o in [0, n) with 0 <= o * s + base < size. */
static inline void cuvil_conv_valid(int64_t base, int64_t s, int64_t size, int64_t n, int64_t *lo, int64_t *hi) {
    int64_t l = base >= 0 ? 0 : (-base + s - 1) / s;
    int64_t h = size - 1 - base >= 0 ? (size - 1 - base) / s + 1 : 0;
    if (l > n) l = n;
    if (h > n) h = n;
    if (h < l) h = l;
    *lo = l;
    *hi = h;
}

/* Plain f64 GEMM (same contract as cuvil_sgemm); f64 convolutions are rare and small. */
static CUVIL_UNUSED int cuvil_dgemm(int64_t M, int64_t N, int64_t K, double alpha, const double *A, int64_t rsa,
                                    int64_t csa, const double *B, int64_t rsb, int64_t csb, double beta, double *C,
                                    int64_t ldc) {
    for (int64_t i = 0; i < M; i++) {
        double *restrict c = C + i * ldc;
        for (int64_t j = 0; j < N; j++) c[j] = beta == 0.0 ? 0.0 : beta * c[j];
        for (int64_t k = 0; k < K; k++) {
            const double a = alpha * A[i * rsa + k * csa];
            const double *b = B + k * rsb;
            if (csb == 1) {
                for (int64_t j = 0; j < N; j++) c[j] += a * b[j];
            } else {
                for (int64_t j = 0; j < N; j++) c[j] += a * b[j * csb];
            }
        }
    }
    return 0;
}

/* Instantiates, for element type T and GEMM `gemm`:
 *   cuvil_im2col_rows_<sfx>(g, x, cg, q0, q1, cols)  the columns of output rows [q0, q1) only
 *   cuvil_im2col_<sfx>(g, x, cg, cols)      x: [cg, in...]  ->  cols: [cg * taps, P]
 *   cuvil_col2im_<sfx>(g, cols, mg, y)      cols: [mg * taps, Pin]  +->  y: [mg, out...]
 *   cuvil_conv_<sfx>(g, x, w, b, y)         forward convolution, bias optional
 *   cuvil_conv_transpose_<sfx>(g, x, w, b, y)
 * For the transposed convolution, g->in is X's spatial size and g->out Y's. */
#define CUVIL_DEFINE_CONV(T, sfx, gemm)                                                                             \
    /* cols [cg * taps, (q1 - q0) * ow] = the im2col of output rows [q0, q1) (rows: the output's spatial       \
     * positions but the last dim, in row-major order) */                                                       \
    static CUVIL_UNUSED void cuvil_im2col_rows_##sfx(const cuvil_conv_geom *g, const T *x, int64_t cg, int64_t q0,   \
                                                     int64_t q1, T *cols) {                                       \
        const int nd = g->nsp, last = nd - 1;                                                                     \
        const int64_t taps = cuvil_conv_prod(g->k, nd), plane = cuvil_conv_prod(g->in, nd);                      \
        const int64_t ow = g->out[last], s = g->stride[last], nc = (q1 - q0) * ow;                               \
        int64_t first[CUVIL_CONV_MAXD] = {0}; /* the coordinates of output row q0 */                             \
        for (int64_t d = last - 1, rem = q0; d >= 0; d--) {                                                       \
            first[d] = rem % g->out[d];                                                                           \
            rem /= g->out[d];                                                                                     \
        }                                                                                                         \
        for (int64_t c = 0; c < cg; c++) {                                                                        \
            for (int64_t t = 0; t < taps; t++) {                                                                  \
                int64_t tk[CUVIL_CONV_MAXD], rem = t;                                                             \
                for (int d = last; d >= 0; d--) {                                                                 \
                    tk[d] = rem % g->k[d];                                                                        \
                    rem /= g->k[d];                                                                               \
                }                                                                                                 \
                const T *src = x + c * plane;                                                                     \
                T *dst = cols + (c * taps + t) * nc;                                                              \
                const int64_t base = tk[last] * g->dil[last] - g->pad[last];                                     \
                int64_t lo, hi;                                                                                   \
                cuvil_conv_valid(base, s, g->in[last], ow, &lo, &hi);                                            \
                int64_t oi[CUVIL_CONV_MAXD];                                                                      \
                for (int d = 0; d < last; d++) oi[d] = first[d];                                                  \
                for (int64_t q = q0; q < q1; q++) {                                                               \
                    T *restrict row = dst + (q - q0) * ow;                                                        \
                    int valid = 1;                                                                                \
                    int64_t off = 0;                                                                              \
                    for (int d = 0; d < last; d++) {                                                              \
                        const int64_t ii = oi[d] * g->stride[d] - g->pad[d] + tk[d] * g->dil[d];                  \
                        if (ii < 0 || ii >= g->in[d]) valid = 0;                                                  \
                        off = off * g->in[d] + ii;                                                                \
                    }                                                                                             \
                    if (!valid) {                                                                                 \
                        memset(row, 0, sizeof(T) * (size_t)ow);                                                   \
                    } else {                                                                                      \
                        const T *restrict in = src + off * g->in[last] + base; /* + o * s: in range on [lo, hi) */\
                        for (int64_t o = 0; o < lo; o++) row[o] = 0;                                              \
                        if (s == 1) {                                                                             \
                            if (hi > lo) memcpy(row + lo, in + lo, sizeof(T) * (size_t)(hi - lo));                \
                        } else if (s == 2) {                                                                      \
                            for (int64_t o = lo; o < hi; o++) row[o] = in[o * 2];                                 \
                        } else {                                                                                  \
                            for (int64_t o = lo; o < hi; o++) row[o] = in[o * s];                                 \
                        }                                                                                         \
                        for (int64_t o = hi; o < ow; o++) row[o] = 0;                                             \
                    }                                                                                             \
                    for (int d = last - 1; d >= 0; d--) {                                                         \
                        if (++oi[d] < g->out[d]) break;                                                           \
                        oi[d] = 0;                                                                                \
                    }                                                                                             \
                }                                                                                                 \
            }                                                                                                     \
        }                                                                                                         \
    }                                                                                                             \
                                                                                                                  \
    static CUVIL_UNUSED void cuvil_im2col_##sfx(const cuvil_conv_geom *g, const T *x, int64_t cg, T *cols) {        \
        const int64_t ow = g->out[g->nsp - 1], P = cuvil_conv_prod(g->out, g->nsp);                               \
        if (P > 0) cuvil_im2col_rows_##sfx(g, x, cg, 0, P / ow, cols);                                            \
    }                                                                                                             \
                                                                                                                  \
    static CUVIL_UNUSED void cuvil_col2im_##sfx(const cuvil_conv_geom *g, const T *cols, int64_t mg, T *y) {        \
        const int nd = g->nsp, last = nd - 1;                                                                     \
        const int64_t taps = cuvil_conv_prod(g->k, nd), Pin = cuvil_conv_prod(g->in, nd);                        \
        const int64_t plane = cuvil_conv_prod(g->out, nd), iw = g->in[last];                                     \
        if (Pin == 0) return;                                                                                     \
        const int64_t rows = Pin / iw, s = g->stride[last];                                                      \
        for (int64_t m = 0; m < mg; m++) {                                                                        \
            for (int64_t t = 0; t < taps; t++) {                                                                  \
                int64_t tk[CUVIL_CONV_MAXD], rem = t;                                                             \
                for (int d = last; d >= 0; d--) {                                                                 \
                    tk[d] = rem % g->k[d];                                                                        \
                    rem /= g->k[d];                                                                               \
                }                                                                                                 \
                const T *src = cols + (m * taps + t) * Pin;                                                       \
                T *dst = y + m * plane;                                                                           \
                const int64_t base = tk[last] * g->dil[last] - g->pad[last];                                     \
                int64_t lo, hi;                                                                                   \
                cuvil_conv_valid(base, s, g->out[last], iw, &lo, &hi);                                           \
                int64_t ii[CUVIL_CONV_MAXD] = {0};                                                                \
                for (int64_t q = 0; q < rows; q++) {                                                              \
                    int valid = 1;                                                                                \
                    int64_t off = 0;                                                                              \
                    for (int d = 0; d < last; d++) {                                                              \
                        const int64_t oo = ii[d] * g->stride[d] - g->pad[d] + tk[d] * g->dil[d];                  \
                        if (oo < 0 || oo >= g->out[d]) valid = 0;                                                 \
                        off = off * g->out[d] + oo;                                                               \
                    }                                                                                             \
                    if (valid) {                                                                                  \
                        const T *restrict srow = src + q * iw;                                                    \
                        const int64_t start = off * g->out[last] + base;                                          \
                        for (int64_t i = lo; i < hi; i++) dst[start + i * s] += srow[i];                          \
                    }                                                                                             \
                    for (int d = last - 1; d >= 0; d--) {                                                         \
                        if (++ii[d] < g->in[d]) break;                                                            \
                        ii[d] = 0;                                                                                \
                    }                                                                                             \
                }                                                                                                 \
            }                                                                                                     \
        }                                                                                                         \
    }                                                                                                             \
                                                                                                                  \
    /* Y[n, m, ...] = bias[m] (or 0). */                                                                         \
    static CUVIL_UNUSED void cuvil_conv_bias_##sfx(int64_t batch, int64_t ch, int64_t plane, const T *b, T *y) {   \
        for (int64_t n = 0; n < batch; n++)                                                                       \
            for (int64_t m = 0; m < ch; m++) {                                                                    \
                T *restrict p = y + (n * ch + m) * plane;                                                         \
                const T v = b ? b[m] : (T)0;                                                                      \
                for (int64_t i = 0; i < plane; i++) p[i] = v;                                                     \
            }                                                                                                     \
    }                                                                                                             \
                                                                                                                  \
    /* The parallel decomposition (cuvil_threads.h): each task writes its own outputs in the serial               \
     * order, so results are bitwise the same for any number of threads.  With at least as many                   \
     * (image, group) pairs as threads, a task is one pair (its GEMM single-threaded, its own                     \
     * im2col buffer); otherwise the pairs run in turn, each im2col split over channels and each                  \
     * GEMM over output blocks (cuvil_gemm.h). */                                                                 \
    typedef struct cuvil_conv_job_##sfx {                                                                         \
        const cuvil_conv_geom *g;                                                                                 \
        const T *x, *w;                                                                                           \
        T *y, *cols;      /* cols: one K x P buffer per thread, or NULL (no im2col) */                            \
        int *failed;      /* per thread */                                                                        \
        int64_t cg, mg, K, P, plane, ctasks;                                                                      \
    } cuvil_conv_job_##sfx;                                                                                       \
                                                                                                                  \
    static void cuvil_conv_pair_##sfx(void *ctx, int64_t task, int tid) {                                         \
        const cuvil_conv_job_##sfx *j = (const cuvil_conv_job_##sfx *)ctx;                                        \
        const cuvil_conv_geom *g = j->g;                                                                          \
        const int64_t n = task / g->group, gi = task % g->group;                                                  \
        const T *xg = j->x + (n * g->cin + gi * j->cg) * j->plane;                                                \
        const T *bmat = xg;                                                                                       \
        if (j->cols) {                                                                                            \
            T *cols = j->cols + (size_t)tid * (size_t)j->K * (size_t)j->P;                                        \
            cuvil_im2col_##sfx(g, xg, j->cg, cols);                                                               \
            bmat = cols;                                                                                          \
        }                                                                                                         \
        if (gemm(j->mg, j->P, j->K, (T)1, j->w + gi * j->mg * j->K, j->K, 1, bmat, j->P, 1, (T)1,                 \
                 j->y + (n * g->cout + gi * j->mg) * j->P, j->P) != 0)                                            \
            j->failed[tid] = 1;                                                                                   \
    }                                                                                                             \
                                                                                                                  \
    /* Part `task` of the channels of one image's im2col (j->x: the image's group, j->cols: its matrix). */       \
    static void cuvil_im2col_part_##sfx(void *ctx, int64_t task, int tid) {                                       \
        const cuvil_conv_job_##sfx *j = (const cuvil_conv_job_##sfx *)ctx;                                        \
        int64_t lo, hi;                                                                                           \
        (void)tid;                                                                                                \
        cuvil_split(j->cg, j->ctasks, task, &lo, &hi);                                                            \
        const int64_t taps = j->K / j->cg;                                                                        \
        cuvil_im2col_##sfx(j->g, j->x + lo * j->plane, hi - lo, j->cols + lo * taps * j->P);                      \
    }                                                                                                             \
                                                                                                                  \
    static CUVIL_UNUSED int cuvil_conv_##sfx(const cuvil_conv_geom *g, const T *x, const T *w, const T *b, T *y) {\
        const int nd = g->nsp;                                                                                    \
        const int64_t cg = g->cin / g->group, mg = g->cout / g->group;                                            \
        const int64_t taps = cuvil_conv_prod(g->k, nd), P = cuvil_conv_prod(g->out, nd);                          \
        const int64_t plane = cuvil_conv_prod(g->in, nd), K = cg * taps;                                          \
        int direct = 1; /* a 1x1 kernel, unit strides, no padding: the image is the GEMM operand */               \
        for (int d = 0; d < nd; d++)                                                                              \
            if (g->k[d] != 1 || g->stride[d] != 1 || g->pad[d] != 0 || g->out[d] != g->in[d]) direct = 0;         \
        cuvil_conv_bias_##sfx(g->batch, g->cout, P, b, y);                                                        \
        if (P == 0 || mg == 0) return 0;                                                                          \
        const int threads = cuvil_num_threads_now();                                                              \
        const int64_t pairs = g->batch * g->group;                                                                \
        const int per_pair = threads > 1 && pairs >= threads && (pairs % threads == 0 || pairs >= 4 * threads);   \
        const int64_t nbuf = per_pair ? threads : 1;                                                              \
        cuvil_conv_job_##sfx j = {g, x, w, y, NULL, NULL, cg, mg, K, P, plane, 1};                                \
        int failed[CUVIL_CONV_MAXT] = {0};                                                                        \
        j.failed = failed;                                                                                        \
        if (per_pair && threads > CUVIL_CONV_MAXT) {                                                              \
            j.failed = (int *)calloc((size_t)threads, sizeof(int));                                               \
            if (!j.failed) return -1;                                                                             \
        }                                                                                                         \
        if (!direct && K > 0) {                                                                                   \
            j.cols = (T *)malloc(cuvil_size3(sizeof(T), (size_t)K * (size_t)nbuf, (size_t)P));                    \
            if (!j.cols) {                                                                                        \
                if (j.failed != failed) free(j.failed);                                                           \
                return -1;                                                                                        \
            }                                                                                                     \
        }                                                                                                         \
        int rc = 0;                                                                                               \
        if (per_pair) {                                                                                           \
            cuvil_parallel_for(pairs, cuvil_conv_pair_##sfx, &j);                                                 \
            for (int t = 0; t < threads; t++)                                                                     \
                if (j.failed[t]) rc = -1;                                                                         \
        } else {                                                                                                  \
            /* im2col splits over channels when each thread gets enough to copy */                                \
            j.ctasks = threads > 1 && K * P >= CUVIL_CONV_PAR_MIN ? (cg < threads ? cg : threads) : 1;            \
            for (int64_t n = 0; n < g->batch && rc == 0; n++) {                                                   \
                for (int64_t gi = 0; gi < g->group && rc == 0; gi++) {                                            \
                    const T *xg = x + (n * g->cin + gi * cg) * plane;                                             \
                    const T *bmat = xg;                                                                           \
                    if (j.cols) {                                                                                 \
                        j.x = xg;                                                                                 \
                        cuvil_parallel_for(j.ctasks, cuvil_im2col_part_##sfx, &j);                                \
                        bmat = j.cols;                                                                            \
                    }                                                                                             \
                    rc = gemm(mg, P, K, (T)1, w + gi * mg * K, K, 1, bmat, P, 1, (T)1,                            \
                              y + (n * g->cout + gi * mg) * P, P);                                                \
                }                                                                                                 \
            }                                                                                                     \
        }                                                                                                         \
        free(j.cols);                                                                                             \
        if (j.failed != failed) free(j.failed);                                                                   \
        return rc;                                                                                                \
    }                                                                                                             \
                                                                                                                  \
    static CUVIL_UNUSED int cuvil_conv_transpose_##sfx(const cuvil_conv_geom *g, const T *x, const T *w,          \
                                                       const T *b, T *y) {                                       \
        const int nd = g->nsp;                                                                                    \
        const int64_t cg = g->cin / g->group, mg = g->cout / g->group;                                            \
        const int64_t taps = cuvil_conv_prod(g->k, nd), Pin = cuvil_conv_prod(g->in, nd);                        \
        const int64_t Pout = cuvil_conv_prod(g->out, nd), R = mg * taps;                                         \
        cuvil_conv_bias_##sfx(g->batch, g->cout, Pout, b, y);                                                     \
        if (Pin == 0 || Pout == 0 || R == 0) return 0;                                                            \
        T *cols = (T *)malloc(cuvil_size3(sizeof(T), (size_t)R, (size_t)Pin));                                               \
        if (!cols) return -1;                                                                                     \
        int rc = 0;                                                                                               \
        for (int64_t n = 0; n < g->batch && rc == 0; n++) {                                                      \
            for (int64_t gi = 0; gi < g->group && rc == 0; gi++) {                                               \
                /* cols [R, Pin] = W_g^T [R, cg] x X_g [cg, Pin];  W_g is [cg, R] row-major. */                   \
                rc = gemm(R, Pin, cg, (T)1, w + gi * cg * R, 1, R, x + (n * g->cin + gi * cg) * Pin, Pin, 1,      \
                          (T)0, cols, Pin);                                                                       \
                if (rc == 0) cuvil_col2im_##sfx(g, cols, mg, y + (n * g->cout + gi * mg) * Pout);                 \
            }                                                                                                     \
        }                                                                                                         \
        free(cols);                                                                                               \
        return rc;                                                                                                \
    }

CUVIL_DEFINE_CONV(float, f32, cuvil_sgemm)
CUVIL_DEFINE_CONV(double, f64, cuvil_dgemm)

/* Depthwise 2-D convolution: group == C, one input channel per group, `mult` outputs per channel.
 * Output planes [lo, hi) of the batch x cout planes: a task of the parallel split over channels. */
typedef struct cuvil_dw_job {
    const cuvil_conv_geom *g;
    const float *x, *w;
    float *y;
    int64_t tasks;
} cuvil_dw_job;

static void cuvil_conv_depthwise2d_part(void *ctx, int64_t task, int tid) {
    const cuvil_dw_job *j = (const cuvil_dw_job *)ctx;
    const cuvil_conv_geom *g = j->g;
    const int64_t H = g->in[0], W = g->in[1], OH = g->out[0], OW = g->out[1];
    const int64_t KH = g->k[0], KW = g->k[1], sh = g->stride[0], sw = g->stride[1];
    const int64_t dh = g->dil[0], dw = g->dil[1], ph = g->pad[0], pw = g->pad[1];
    const int64_t mult = g->cout / g->group;
    int64_t lo, hi;
    (void)tid;
    cuvil_split(g->batch * g->cout, j->tasks, task, &lo, &hi);
    for (int64_t plane = lo; plane < hi; plane++) {
        const int64_t n = plane / g->cout, m = plane % g->cout;
        const float *restrict xc = j->x + (n * g->cin + m / mult) * H * W;
        const float *restrict wm = j->w + m * KH * KW;
        float *restrict yc = j->y + plane * OH * OW;
        for (int64_t kw = 0; kw < KW; kw++) {
            const int64_t base = kw * dw - pw;
            int64_t olo, ohi;
            cuvil_conv_valid(base, sw, W, OW, &olo, &ohi);
            for (int64_t oh = 0; oh < OH; oh++) {
                float *restrict yr = yc + oh * OW;
                for (int64_t kh = 0; kh < KH; kh++) {
                    const int64_t ih = oh * sh - ph + kh * dh;
                    if (ih < 0 || ih >= H) continue;
                    const float wv = wm[kh * KW + kw];
                    const int64_t start = ih * W + base; /* + o * sw is in range for o in [olo, ohi) */
                    if (sw == 1) {
                        const float *restrict xr = xc + start + olo;
                        float *restrict yo = yr + olo;
                        for (int64_t o = 0; o < ohi - olo; o++) yo[o] += wv * xr[o];
                    } else {
                        for (int64_t o = olo; o < ohi; o++) yr[o] += wv * xc[start + o * sw];
                    }
                }
            }
        }
    }
}

static CUVIL_UNUSED void cuvil_conv_depthwise2d_f32(const cuvil_conv_geom *g, const float *x, const float *w,
                                                    const float *b, float *y) {
    const int64_t planes = g->batch * g->cout, per_plane = g->out[0] * g->out[1] * g->k[0] * g->k[1];
    cuvil_conv_bias_f32(g->batch, g->cout, g->out[0] * g->out[1], b, y);
    const int threads = cuvil_num_threads_now();
    /* Each plane is one task's, computed in the serial order: the split does not change results. */
    int64_t tasks = threads > 1 && planes * per_plane >= CUVIL_CONV_PAR_MIN ? (int64_t)threads * 4 : 1;
    if (tasks > planes) tasks = planes;
    if (tasks < 1) return;
    cuvil_dw_job j = {g, x, w, y, tasks};
    cuvil_parallel_for(tasks, cuvil_conv_depthwise2d_part, &j);
}

#endif /* CUVIL_CONV_H */
