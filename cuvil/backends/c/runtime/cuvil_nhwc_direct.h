/* Cuvil's direct channels-last 2-D convolution, float32 (conv_nhwc: X [N, H, W, C],
 * W [KH, KW, C/group, M], Y [N, OH, OW, M]), and the geometry every NHWC kernel shares.
 *
 * In NHWC an output pixel's inputs are KH rows of KW pixels of C contiguous channels, so a
 * convolution is a GEMM whose left operand (the im2col matrix) never has to exist: a register
 * tile of MR output pixels by NV vectors of output channels accumulates, over the kernel taps
 * and input channels, one broadcast input value per pixel times one vector row of the weights.
 * The input is read where it lies (a tap row of KW pixels is one contiguous run of KW*C values
 * when the convolution has one group and no dilation), the weights are repacked once per model
 * (the model's constant cache) into NV-vector-wide column panels, zero-padded, and the bias and
 * the node's fused epilogue are applied on the finished tile / strip while it is in L1.  Unlike
 * the im2col + GEMM path this copies nothing per call, and the panel width follows the layer's
 * output channels (1 to 4 vectors), so a 1x1 convolution to 16 or 24 channels wastes no tile.
 *
 * The work is a grid of (output pixels) x (column panels); pixels are split into strips of MR
 * along an output row (or along the flattened pixels when the convolution is 1x1, unit-stride and
 * unpadded), panels into chunks whose weights stay in L2.  Output pixels whose taps leave the
 * image (the borders) run one pixel at a time with only their taps inside.  Every output element
 * is computed by one task, in an order that does not depend on the thread count: results are
 * bitwise the same for any number of threads.
 */
#ifndef CUVIL_NHWC_DIRECT_H
#define CUVIL_NHWC_DIRECT_H

#include "cuvil_gemm.h"
#include "cuvil_rt.h"
#include "cuvil_threads.h"

typedef struct cuvil_nhwc_geom {
    int64_t n, h, w, c;     /* input */
    int64_t oh, ow, m;      /* output */
    int64_t kh, kw, sh, sw, dh, dw, ph, pw; /* ph, pw: padding at the beginning */
    int64_t group;
} cuvil_nhwc_geom;

/* [*olo, *ohi): the output columns whose every tap lies inside the image (empty: *ohi == *olo). */
static inline void cuvil_nhwc_interior_cols(const cuvil_nhwc_geom *g, int64_t *olo, int64_t *ohi) {
    int64_t lo = 0, hi = g->ow;
    for (int64_t j = 0; j < g->kw; j++) {
        const int64_t base = j * g->dw - g->pw;
        const int64_t l = base >= 0 ? 0 : (-base + g->sw - 1) / g->sw;
        const int64_t h = g->w - 1 - base >= 0 ? (g->w - 1 - base) / g->sw + 1 : 0;
        if (l > lo) lo = l;
        if (h < hi) hi = h;
    }
    *olo = lo;
    *ohi = hi < lo ? lo : hi;
}

#if CUVIL_GEMM_VECTOR
#define CUVIL_NHWC_DIRECT 1

/* Register tiles: MR pixels for NV vectors of output channels (accumulators MR * NV, plus NV
 * weight vectors and a broadcast, within the register file). */
#if CUVIL_GEMM_NREG >= 32
#define CUVIL_NHWC_NV_MAX 4
#define CUVIL_NHWC_MR(nv) ((nv) <= 2 ? 12 : (nv) == 3 ? 8 : 6)
#else
#define CUVIL_NHWC_NV_MAX 3
#define CUVIL_NHWC_MR(nv) ((nv) == 1 ? 8 : (nv) == 2 ? 6 : 4)
#endif
/* The weights of the panels one task sweeps per strip of pixels stay under this many bytes (L2). */
#define CUVIL_NHWC_CHUNK_BYTES ((int64_t)256 << 10)
/* A unit of flattened pixels (1x1 convolutions) holds about this many output values of a chunk:
 * one call of the strip loop and of the epilogue per unit, on outputs still in L1. */
#define CUVIL_NHWC_BLOCK_VALUES 4096
/* Taps of one run list: KH tap rows, or KH*KW taps when a row does not make one run. */
#define CUVIL_NHWC_MAX_RUNS 64

/* A run of the im2col row: `len` consecutive input values at offset `x` from the pixel's origin,
 * multiplying rows [k, k + len) of the packed weight panel. */
typedef struct cuvil_nhwc_run {
    int64_t x, k, len;
} cuvil_nhwc_run;

typedef struct cuvil_nhwc_direct {
    const cuvil_nhwc_geom *g;
    const float *x, *wp, *b; /* wp: packed panels; b: the bias as given (or NULL) */
    float *y;
    const cuvil_sgemm_epilogue *ep;
    int64_t cg, mg, K, nv, nr, npg; /* channels and outputs per group, K = KH*KW*cg, panel width nr = nv*W */
    int flat;                       /* 1x1, unit stride, no padding: pixels are the rows of X */
    int64_t chunk, block;           /* panels per L2 chunk; pixels per unit when flat */
    int64_t units, mparts, pparts;  /* pixel units (blocks of pixels or output rows), the task grid */
} cuvil_nhwc_direct;

/* Rows [0, rows) of a tile buffer t (rows `width` floats apart) into y, ncols of each, plus the bias. */
#if CUVIL_LIB_BODY /* the kernel library's code (cuvil_rt.h) */
static __attribute__((noinline)) void cuvil_nhwc_store_part(const float *t, int rows, int64_t width, const float *b,
                                                            float *y, int64_t ldy, int64_t ncols) {
    for (int i = 0; i < rows; i++)
        for (int64_t j = 0; j < ncols; j++) y[i * ldy + j] = b ? t[i * width + j] + b[j] : t[i * width + j];
}

/* Y[pixels, cols] of one tile: MR pixels (origins `origin + i * ps` in X) by one panel. */
static inline __attribute__((always_inline)) void cuvil_nhwc_tile(const int MR, const int NV, const float *restrict x,
                                                                  int64_t origin, int64_t ps,
                                                                  const cuvil_nhwc_run *runs, int nruns,
                                                                  const float *restrict wp, const float *restrict b,
                                                                  float *restrict y, int64_t ldy, int64_t ncols) {
    const int64_t W = CUVIL_GEMM_W;
    cuvil_vf acc[12][CUVIL_NHWC_NV_MAX];
#pragma GCC unroll 12
    for (int i = 0; i < MR; i++)
#pragma GCC unroll 4
        for (int v = 0; v < NV; v++) acc[i][v] = (cuvil_vf){0};
    for (int r = 0; r < nruns; r++) {
        const float *restrict xr = x + (origin + runs[r].x);
        const float *restrict wr = wp + runs[r].k * NV * W;
        const int64_t len = runs[r].len;
        for (int64_t k = 0; k < len; k++) {
            cuvil_vf bv[CUVIL_NHWC_NV_MAX];
#pragma GCC unroll 4
            for (int v = 0; v < NV; v++) bv[v] = cuvil_vload(wr + v * W);
#pragma GCC unroll 12
            for (int i = 0; i < MR; i++) {
                const cuvil_vf a = CUVIL_VSPLAT(xr[i * ps + k]);
#pragma GCC unroll 4
                for (int v = 0; v < NV; v++) acc[i][v] = CUVIL_VFMA(a, bv[v], acc[i][v]);
            }
            wr += NV * W;
        }
    }
    /* the bias after the sum, as the reference adds it */
    if (ncols == NV * W) {
        cuvil_vf bias[CUVIL_NHWC_NV_MAX];
#pragma GCC unroll 4
        for (int v = 0; v < NV; v++) bias[v] = b ? cuvil_vload(b + v * W) : (cuvil_vf){0};
#pragma GCC unroll 12
        for (int i = 0; i < MR; i++)
#pragma GCC unroll 4
            for (int v = 0; v < NV; v++) cuvil_vstore(y + i * ldy + v * W, b ? acc[i][v] + bias[v] : acc[i][v]);
        return;
    }
    cuvil_vf t[12 * CUVIL_NHWC_NV_MAX]; /* a panel past the last output channel: through a buffer */
#pragma GCC unroll 12
    for (int i = 0; i < MR; i++)
#pragma GCC unroll 4
        for (int v = 0; v < NV; v++) t[i * NV + v] = acc[i][v];
    cuvil_nhwc_store_part((const float *)t, MR, NV * W, b, y, ldy, ncols);
}
#endif

/* `count` pixels (origins origin + p * ps, outputs y + p * ldy) by panels [q0, q1) of group gi: full
 * strips, then the last pixels one at a time. */
#define CUVIL_NHWC_PIXELS(NV)                                                                                        \
    static void cuvil_nhwc_pixels_nv##NV(const cuvil_nhwc_direct *d, int64_t origin, int64_t ps,                   \
                                         const cuvil_nhwc_run *runs, int nruns, int64_t count, float *y, int64_t gi, \
                                         int64_t q0, int64_t q1) {                                                  \
        const int MRF = CUVIL_NHWC_MR(NV);                                                                          \
        const int64_t ldy = d->g->m, panel = d->K * d->nr;                                                          \
        int64_t p = 0;                                                                                              \
        for (; p + MRF <= count; p += MRF)                                                                          \
            for (int64_t q = q0; q < q1; q++) {                                                                     \
                const int64_t col = q * d->nr, ncols = d->mg - col < d->nr ? d->mg - col : d->nr;                  \
                cuvil_nhwc_tile(MRF, NV, d->x, origin + p * ps, ps, runs, nruns, d->wp + (gi * d->npg + q) * panel, \
                                d->b ? d->b + gi * d->mg + col : NULL, y + p * ldy + col, ldy, ncols);               \
            }                                                                                                       \
        for (; p < count; p++)                                                                                      \
            for (int64_t q = q0; q < q1; q++) {                                                                     \
                const int64_t col = q * d->nr, ncols = d->mg - col < d->nr ? d->mg - col : d->nr;                  \
                cuvil_nhwc_tile(1, NV, d->x, origin + p * ps, ps, runs, nruns, d->wp + (gi * d->npg + q) * panel,   \
                                d->b ? d->b + gi * d->mg + col : NULL, y + p * ldy + col, ldy, ncols);               \
            }                                                                                                       \
    }
#if CUVIL_LIB_BODY /* the kernel library's code (cuvil_rt.h) */
CUVIL_NHWC_PIXELS(1)
CUVIL_NHWC_PIXELS(2)
CUVIL_NHWC_PIXELS(3)
#endif
#if CUVIL_NHWC_NV_MAX >= 4
#if CUVIL_LIB_BODY /* the kernel library's code (cuvil_rt.h) */
CUVIL_NHWC_PIXELS(4)
#endif
#endif
#undef CUVIL_NHWC_PIXELS

#if CUVIL_LIB_BODY /* the kernel library's code (cuvil_rt.h) */
static void cuvil_nhwc_pixels(const cuvil_nhwc_direct *d, int64_t origin, int64_t ps, const cuvil_nhwc_run *runs,
                              int nruns, int64_t count, float *y, int64_t gi, int64_t q0, int64_t q1) {
    switch (d->nv) {
    case 1: cuvil_nhwc_pixels_nv1(d, origin, ps, runs, nruns, count, y, gi, q0, q1); break;
    case 2: cuvil_nhwc_pixels_nv2(d, origin, ps, runs, nruns, count, y, gi, q0, q1); break;
    case 3: cuvil_nhwc_pixels_nv3(d, origin, ps, runs, nruns, count, y, gi, q0, q1); break;
#if CUVIL_NHWC_NV_MAX >= 4
    default: cuvil_nhwc_pixels_nv4(d, origin, ps, runs, nruns, count, y, gi, q0, q1); break;
#endif
    }
}

/* The runs of output column ow's im2col row in tap rows [i0, i1) (origin: the pixel's first tap
 * at (ih0, ow * sw - pw)); taps outside the image are left out.  Returns the count. */
static int cuvil_nhwc_runs(const cuvil_nhwc_geom *g, int64_t cg, int64_t ih0, int64_t ow, cuvil_nhwc_run *runs) {
    const int64_t iw0 = ow * g->sw - g->pw;
    const int whole = g->group == 1 && g->dw == 1 && iw0 >= 0 && iw0 + g->kw <= g->w;
    int n = 0;
    for (int64_t i = 0; i < g->kh; i++) {
        const int64_t ih = ih0 + i * g->dh;
        if (ih < 0 || ih >= g->h) continue;
        if (whole) { /* one contiguous run of KW * C values */
            runs[n++] = (cuvil_nhwc_run){i * g->dh * g->w * g->c, i * g->kw * cg, g->kw * cg};
            continue;
        }
        for (int64_t j = 0; j < g->kw; j++) {
            const int64_t iw = iw0 + j * g->dw;
            if (iw < 0 || iw >= g->w) continue;
            runs[n++] = (cuvil_nhwc_run){(i * g->dh * g->w + j * g->dw) * g->c, (i * g->kw + j) * cg, cg};
        }
    }
    return n;
}

/* Output pixel rows or strips [u0, u1) by panels [q0, q1) of every group, the epilogue on each
 * finished strip. */
static void cuvil_nhwc_direct_block(const cuvil_nhwc_direct *d, int64_t u0, int64_t u1, int64_t q0, int64_t q1) {
    const cuvil_nhwc_geom *g = d->g;
    const int64_t M = g->m, P = g->n * g->oh * g->ow;
    const int64_t chunk = d->chunk;
    cuvil_nhwc_run runs[CUVIL_NHWC_MAX_RUNS];
    for (int64_t gi = 0; gi < g->group; gi++)
        for (int64_t c0 = q0; c0 < q1; c0 += chunk) {
            const int64_t c1 = c0 + chunk < q1 ? c0 + chunk : q1;
            const int64_t col = gi * d->mg + c0 * d->nr;
            const int64_t cols = (c1 * d->nr < d->mg ? c1 * d->nr : d->mg) - c0 * d->nr;
            for (int64_t u = u0; u < u1; u++) {
                int64_t p0, count;
                if (d->flat) { /* a block of the flattened pixels */
                    p0 = u * d->block;
                    count = P - p0 < d->block ? P - p0 : d->block;
                    const cuvil_nhwc_run run = {0, 0, d->cg};
                    cuvil_nhwc_pixels(d, p0 * g->c + gi * d->cg, g->c, &run, 1, count, d->y + p0 * M + gi * d->mg, gi, c0,
                                      c1);
                } else { /* an output row: its interior columns in strips, the borders one by one */
                    const int64_t n = u / g->oh, oh = u % g->oh, ih0 = oh * g->sh - g->ph;
                    p0 = u * g->ow;
                    count = g->ow;
                    int64_t olo, ohi; /* the columns whose every tap lies inside the image */
                    cuvil_nhwc_interior_cols(g, &olo, &ohi);
                    const int64_t row0 = (n * g->h + ih0) * g->w * g->c + gi * d->cg; /* X offset of (ih0, 0) */
                    for (int64_t ow = 0; ow < g->ow; ow++) {
                        if (ow == olo && olo < ohi) { /* the interior: one run list for all of it */
                            const int nr = cuvil_nhwc_runs(g, d->cg, ih0, ow, runs);
                            cuvil_nhwc_pixels(d, row0 + (ow * g->sw - g->pw) * g->c, g->sw * g->c, runs, nr, ohi - olo,
                                              d->y + (p0 + ow) * M + gi * d->mg, gi, c0, c1);
                            ow = ohi - 1;
                            continue;
                        }
                        const int nr = cuvil_nhwc_runs(g, d->cg, ih0, ow, runs);
                        cuvil_nhwc_pixels(d, row0 + (ow * g->sw - g->pw) * g->c, 0, runs, nr, 1,
                                          d->y + (p0 + ow) * M + gi * d->mg, gi, c0, c1);
                    }
                }
                if (d->ep) d->ep->fn(d->ep->ctx, d->y + p0 * M + col, M, p0, col, count, cols);
            }
        }
}

static void cuvil_nhwc_direct_task(void *ctx, int64_t task, int tid) {
    const cuvil_nhwc_direct *d = (const cuvil_nhwc_direct *)ctx;
    int64_t u0, u1, q0, q1;
    (void)tid;
    cuvil_split(d->units, d->mparts, task / d->pparts, &u0, &u1);
    cuvil_split(d->npg, d->pparts, task % d->pparts, &q0, &q1);
    if (u0 < u1 && q0 < q1) cuvil_nhwc_direct_block(d, u0, u1, q0, q1);
}
#endif

/* The packed weights: for each group and panel q, rows [0, K) of nr columns (zero past mg). */
typedef struct cuvil_nhwc_pack_args {
    const float *w;
    int64_t K, M, group, mg, nr, npg;
} cuvil_nhwc_pack_args;

#if CUVIL_LIB_BODY /* the kernel library's code (cuvil_rt.h) */
static void cuvil_nhwc_pack(void *dst, const void *arg) {
    const cuvil_nhwc_pack_args *a = (const cuvil_nhwc_pack_args *)arg;
    float *out = (float *)dst;
    for (int64_t gi = 0; gi < a->group; gi++)
        for (int64_t q = 0; q < a->npg; q++) {
            const int64_t col = q * a->nr, cols = a->mg - col < a->nr ? a->mg - col : a->nr;
            for (int64_t k = 0; k < a->K; k++) {
                const float *src = a->w + k * a->M + gi * a->mg + col;
                for (int64_t j = 0; j < cols; j++) out[j] = src[j];
                for (int64_t j = cols; j < a->nr; j++) out[j] = 0.0f;
                out += a->nr;
            }
        }
}

/* Panel width in vectors for `mg` output channels per group: one panel when it fits in the
 * widest tile, otherwise the widest tile with the least padding. */
static int64_t cuvil_nhwc_panel_vectors(int64_t mg) {
    const int64_t W = CUVIL_GEMM_W, vecs = (mg + W - 1) / W;
    if (vecs <= CUVIL_NHWC_NV_MAX) return vecs;
    int64_t best = CUVIL_NHWC_NV_MAX, waste = -1;
    for (int64_t nv = CUVIL_NHWC_NV_MAX; nv >= 2; nv--) {
        const int64_t pad = (vecs + nv - 1) / nv * nv - vecs;
        if (waste < 0 || pad < waste) best = nv, waste = pad;
    }
    return best;
}

/* Whether the direct kernel takes this convolution: its weight panels must stay cacheable. */
static CUVIL_UNUSED int cuvil_nhwc_direct_fits(const cuvil_nhwc_geom *g) {
    const int64_t K = g->kh * g->kw * (g->c / g->group);
    return K * CUVIL_GEMM_W * (int64_t)sizeof(float) <= ((int64_t)512 << 10) && g->kh * g->kw <= CUVIL_NHWC_MAX_RUNS;
}

/* The direct convolution (bias b and epilogue ep may be NULL).  Returns 0, or -1 when memory for
 * the packed weights cannot be had. */
static CUVIL_UNUSED int cuvil_conv_nhwc_direct_f32(const cuvil_nhwc_geom *g, const float *x, const float *w,
                                                   const float *b, float *y, const cuvil_sgemm_epilogue *ep) {
    const int64_t P = g->n * g->oh * g->ow;
    if (P == 0 || g->m == 0) return 0;
    cuvil_nhwc_direct d = {g, x, NULL, b, y, ep, g->c / g->group, g->m / g->group, 0, 0, 0, 0, 0, 0, 0, 0, 1, 1};
    d.K = g->kh * g->kw * d.cg;
    d.nv = cuvil_nhwc_panel_vectors(d.mg);
    d.nr = d.nv * CUVIL_GEMM_W;
    d.npg = (d.mg + d.nr - 1) / d.nr;
    d.flat = g->kh == 1 && g->kw == 1 && g->sh == 1 && g->sw == 1 && g->ph == 0 && g->pw == 0 && g->oh == g->h &&
             g->ow == g->w;
    const cuvil_nhwc_pack_args args = {w, d.K, g->m, g->group, d.mg, d.nr, d.npg};
    const size_t bytes = cuvil_size3(sizeof(float), (size_t)(g->group * d.npg * d.K), (size_t)d.nr);
    if (bytes == SIZE_MAX) return -1;
    float *own = NULL;
    if (d.K > 0 && cuvil_is_constant(w, (size_t)(d.K * g->m) * sizeof(float))) {
        const int64_t key[CUVIL_CACHE_KEY] = {0x6e687763 /* "nhwc" */, d.K, g->m, g->group, d.nr, 0, 0, 0};
        d.wp = (const float *)cuvil_cache_get(w, key, bytes, cuvil_nhwc_pack, &args);
    }
    if (!d.wp) {
        own = (float *)aligned_alloc(CUVIL_ALIGN, (bytes + CUVIL_ALIGN - 1) / CUVIL_ALIGN * CUVIL_ALIGN);
        if (!own) return -1;
        cuvil_nhwc_pack(own, &args);
        d.wp = own;
    }
    const int64_t strip = CUVIL_NHWC_MR(d.nv), panel_bytes = d.K * d.nr * (int64_t)sizeof(float);
    d.chunk = panel_bytes > 0 && CUVIL_NHWC_CHUNK_BYTES / panel_bytes > 1 ? CUVIL_NHWC_CHUNK_BYTES / panel_bytes : 1;
    const int64_t chunk_cols = (d.chunk < d.npg ? d.chunk : d.npg) * d.nr;
    const int64_t strips = CUVIL_NHWC_BLOCK_VALUES / (strip * chunk_cols);
    d.block = strip * (strips > 1 ? strips : 1);
    d.units = d.flat ? (P + d.block - 1) / d.block : g->n * g->oh;
    const int threads = cuvil_num_threads_now();
    const double macs = (double)P * (double)g->m * (double)d.K;
    if (threads > 1 && cuvil_parallel_worth(macs / CUVIL_GEMM_MAC_PER_NS)) {
        /* the grid whose largest task has the fewest tiles; ties go to fewer column parts (each
         * column part re-reads the input) */
        int64_t best = -1;
        for (int64_t mp = 1; mp <= threads; mp++)
            for (int64_t pp = 1; mp * pp <= threads; pp++) {
                if (mp > d.units || pp > d.npg) continue;
                const int64_t cost = (d.units + mp - 1) / mp * ((d.npg + pp - 1) / pp);
                if (best < 0 || cost < best) best = cost, d.mparts = mp, d.pparts = pp;
            }
    }
    if (d.mparts * d.pparts == 1)
        cuvil_nhwc_direct_block(&d, 0, d.units, 0, d.npg);
    else
        cuvil_parallel_for(d.mparts * d.pparts, cuvil_nhwc_direct_task, &d);
    free(own);
    return 0;
}
#endif

#endif /* CUVIL_GEMM_VECTOR */

#endif /* CUVIL_NHWC_DIRECT_H */
