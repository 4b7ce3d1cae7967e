/* Channels-last convolutions (conv_nhwc) of float16 / bfloat16 operands.
 *
 * As for every f16/bf16 convolution (cuvil_half.h), the operands are widened exactly to float32,
 * the float32 kernel runs (the direct kernel of cuvil_nhwc_direct.h, or the depthwise one of
 * cuvil_conv_nhwc.h) and its result, bias included, is rounded once: the reference's semantics.
 * The weight is widened once per loaded model into the constant cache, where it counts as a
 * constant itself, so the float32 kernel's packed panels of it are cached too: after the first
 * call a weight costs nothing; the input is widened and the output rounded on each call.
 *
 * Except two cases that make no widened copy of the input or the result:
 *
 * A depthwise convolution.  A 3x3 one at column stride 1 or 2 on AVX-512 reads its input in place,
 * widening each vector in registers (cuvil_nhwc_dwh3_row); any other widens, per task, a band of
 * the input rows that a group of CUVIL_NHWC_DWH_G output rows reads into per-thread float32 scratch
 * and runs the float32 row kernel on that band (a small image of its own: rows outside the band lie
 * outside it).  Either adds the bias and rounds each row as it is finished.  The arithmetic is the
 * float32 kernel's, so results are bitwise those of widening the whole input; the input is read
 * once in its own type and the result written once, in one parallel region.
 *
 * And a bf16 pointwise convolution (1x1, unit stride, unpadded, one group) on a target with
 * AVX512_BF16: the product of the [pixels x C] input, read in place, and the [C x M] weight on
 * vdpbf16ps (exact products accumulated in float32, the weight's panels cached once per model),
 * each output tile getting its bias and rounded once to bf16 as it leaves the registers.
 *
 * Every path applies a fused relu or clip (a clamp) to the float32 result before it is rounded,
 * which gives the bits of clamping the rounded result (the bounds are values of its type).
 */
#ifndef CUVIL_CONV_NHWC_HALF_H
#define CUVIL_CONV_NHWC_HALF_H

#include "cuvil_conv_nhwc.h"
#include "cuvil_half.h"

/* Output rows a depthwise task widens the input band of at once (at stride 1, a 3-tall kernel
 * widens each input row (G + 2) / G times). */
#define CUVIL_NHWC_DWH_G 8

typedef struct cuvil_nhwc_dwh_job {
    const cuvil_nhwc_geom *g;
    int is_bf16;
    const uint16_t *x;
    const float *w, *b;
    uint16_t *y;
    float *scratch; /* band path, per thread: the band (band_floats), then one output row (ow * m) */
    int64_t band_floats, per_thread, tasks;
    float lo, hi; /* the clamp before the rounding (-INFINITY, INFINITY: none) */
} cuvil_nhwc_dwh_job;

/* dst[p, m] = yr[p, m] + b[m] (b may be NULL), clamped to [lo, hi], rounded once to f16 / bf16, for
 * `pixels` rows of M. */
static void cuvil_nhwc_dwh_round(int is_bf16, const float *restrict yr, const float *restrict b, uint16_t *restrict dst,
                                 int64_t pixels, int64_t M, float lo, float hi) {
#if defined(__AVX512F__)
    const __m512 lov = _mm512_set1_ps(lo), hiv = _mm512_set1_ps(hi);
#endif
    for (int64_t p = 0; p < pixels; p++) {
        const float *restrict ys = yr + p * M;
        uint16_t *restrict d = dst + p * M;
        int64_t m = 0;
#if defined(__AVX512F__)
        for (; m + 16 <= M; m += 16) {
            __m512 v = _mm512_loadu_ps(ys + m);
            if (b) v = _mm512_add_ps(v, _mm512_loadu_ps(b + m));
            v = cuvil_clamp_nn16(v, lov, hiv);
            const __m256i h = is_bf16 ? cuvil_bf16_round16(v) : _mm512_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT);
            _mm256_storeu_si256((__m256i *)(d + m), h);
        }
#elif defined(__F16C__)
        if (!is_bf16)
            for (; m + 8 <= M; m += 8) {
                float v[8];
                for (int l = 0; l < 8; l++) v[l] = cuvil_clamp_nn_f(b ? ys[m + l] + b[m + l] : ys[m + l], lo, hi);
                _mm_storeu_si128((__m128i *)(d + m), _mm256_cvtps_ph(_mm256_loadu_ps(v), _MM_FROUND_TO_NEAREST_INT));
            }
#endif
        for (; m < M; m++) {
            const float v = cuvil_clamp_nn_f(b ? ys[m] + b[m] : ys[m], lo, hi);
            d[m] = is_bf16 ? cuvil_f32_to_bf16(v) : cuvil_f32_to_f16(v);
        }
    }
}

static void cuvil_nhwc_dwh_part(void *ctx, int64_t task, int tid) {
    const cuvil_nhwc_dwh_job *j = (const cuvil_nhwc_dwh_job *)ctx;
    const cuvil_nhwc_geom *g = j->g;
    const int64_t rowv = g->w * g->c, M = g->m, G = CUVIL_NHWC_DWH_G;
    float *band = j->scratch + (size_t)tid * (size_t)j->per_thread, *yr = band + j->band_floats;
    int64_t lo, hi, olo, ohi;
    cuvil_split(g->n * g->oh, j->tasks, task, &lo, &hi);
    cuvil_nhwc_interior_cols(g, &olo, &ohi);
    for (int64_t r = lo; r < hi;) {
        const int64_t n = r / g->oh, oh0 = r % g->oh;
        int64_t rows = g->oh - oh0 < G ? g->oh - oh0 : G; /* up to G rows, within the task and the image */
        rows = hi - r < rows ? hi - r : rows;
        /* the input rows [ih0, ih1) these output rows read, inside the image */
        int64_t ih0 = oh0 * g->sh - g->ph, ih1 = (oh0 + rows - 1) * g->sh - g->ph + (g->kh - 1) * g->dh + 1;
        ih0 = ih0 < 0 ? 0 : ih0;
        ih1 = ih1 > g->h ? g->h : ih1;
        if (ih1 < ih0) ih1 = ih0;
        const uint16_t *src = j->x + (n * g->h + ih0) * rowv;
        if (j->is_bf16) cuvil_bf16_to_f32_n(src, band, (ih1 - ih0) * rowv);
        else cuvil_f16_to_f32_n(src, band, (ih1 - ih0) * rowv);
        /* the band as an image of one item: output row oh0 + k is its row k, reading band row ih - ih0 */
        cuvil_nhwc_geom b = *g;
        b.n = 1;
        b.h = ih1 - ih0;
        b.ph = g->ph + ih0 - oh0 * g->sh;
        for (int64_t k = 0; k < rows; k++) {
            cuvil_nhwc_dw_row(&b, band, j->w, yr, 0, k, olo, ohi);
            cuvil_nhwc_dwh_round(j->is_bf16, yr, j->b, j->y + (r + k) * g->ow * M, g->ow, M, j->lo, j->hi);
        }
        r += rows;
    }
}

#if defined(__AVX512F__) && CUVIL_GEMM_VECTOR && CUVIL_GEMM_W == 16
/* 3x3 depthwise convolutions at column stride 1 or 2 (MobileNet's), reading f16 / bf16 in place: the
 * float32 kernel's strips and pixels (cuvil_conv_nhwc.h, cuvil_nhwc_dw3_row) with each input vector
 * widened in registers as it is loaded, and each output vector getting its bias and rounded as it is
 * stored.  The same operations in the same order as the float32 kernel on a widened input, so the
 * same bits as the band path, without widening anything to memory. */
#define CUVIL_NHWC_DWH3 1

static inline __attribute__((always_inline)) __m512 cuvil_half_load16(const int BF, const uint16_t *p) {
    return BF ? cuvil_bf16_widen16(p) : _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)p));
}

static inline __attribute__((always_inline)) float cuvil_half_load1(const int BF, uint16_t h) {
    return BF ? cuvil_bf16_to_f32(h) : cuvil_f16_to_f32(h);
}

/* v clamped to [lo, hi], rounded and stored. */
static inline __attribute__((always_inline)) void cuvil_half_store16(const int BF, uint16_t *p, __m512 v, float lo,
                                                                     float hi) {
    v = cuvil_clamp_nn16(v, _mm512_set1_ps(lo), _mm512_set1_ps(hi));
    _mm256_storeu_si256((__m256i *)p, BF ? cuvil_bf16_round16(v) : _mm512_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT));
}

static inline __attribute__((always_inline)) uint16_t cuvil_half_round1(const int BF, float v, float lo, float hi) {
    v = cuvil_clamp_nn_f(v, lo, hi);
    return BF ? cuvil_f32_to_bf16(v) : cuvil_f32_to_f16(v);
}

/* Output pixels [o0, o0 + R) of row (n, oh) (cuvil_nhwc_dw3_strip, EDGE: columns outside the image
 * read as zeros) into yr, the row's first pixel. */
static inline __attribute__((always_inline)) void cuvil_nhwc_dwh3_strip(const int BF, const int S, const int R,
                                                                        const int EDGE, const cuvil_nhwc_geom *g,
                                                                        const uint16_t *x, const float *w,
                                                                        const float *b, uint16_t *yr, int64_t n,
                                                                        int64_t oh, int64_t o0, float lo, float hi) {
    const int64_t C = g->c, cv = C / 16 * 16, iw0 = o0 * S - g->pw;
    for (int64_t c = 0; c < cv; c += 16) {
        __m512 acc[CUVIL_NHWC_DW3_R];
#pragma GCC unroll 8
        for (int o = 0; o < R; o++) acc[o] = _mm512_setzero_ps();
        for (int64_t i = 0; i < 3; i++) {
            const int64_t ih = oh * g->sh - g->ph + i * g->dh;
            if (ih < 0 || ih >= g->h) continue;
            const uint16_t *xrow = x + (n * g->h + ih) * g->w * C + c;
            const __m512 w0 = _mm512_loadu_ps(w + i * 3 * C + c), w1 = _mm512_loadu_ps(w + (i * 3 + 1) * C + c),
                         w2 = _mm512_loadu_ps(w + (i * 3 + 2) * C + c);
#pragma GCC unroll 24
            for (int t = 0; t < (R - 1) * S + 3; t++) {
                const int64_t iw = iw0 + t;
                const __m512 xv = !EDGE || (iw >= 0 && iw < g->w) ? cuvil_half_load16(BF, xrow + iw * C)
                                                                  : _mm512_setzero_ps();
                if (t % S == 0 && t / S < R) acc[t / S] = _mm512_fmadd_ps(xv, w0, acc[t / S]);
                if (t >= 1 && (t - 1) % S == 0 && (t - 1) / S < R)
                    acc[(t - 1) / S] = _mm512_fmadd_ps(xv, w1, acc[(t - 1) / S]);
                if (t >= 2 && (t - 2) % S == 0 && (t - 2) / S < R)
                    acc[(t - 2) / S] = _mm512_fmadd_ps(xv, w2, acc[(t - 2) / S]);
            }
        }
        const __m512 bv = b ? _mm512_loadu_ps(b + c) : _mm512_setzero_ps();
#pragma GCC unroll 8
        for (int o = 0; o < R; o++)
            cuvil_half_store16(BF, yr + (o0 + o) * C + c, b ? _mm512_add_ps(acc[o], bv) : acc[o], lo, hi);
    }
    for (int64_t c = cv; c < C; c++) /* the channels past the last full vector, in the same order of taps */
        for (int o = 0; o < R; o++) {
            float acc = 0.0f;
            for (int64_t i = 0; i < 3; i++) {
                const int64_t ih = oh * g->sh - g->ph + i * g->dh;
                if (ih < 0 || ih >= g->h) continue;
                for (int64_t j = 0; j < 3; j++) {
                    const int64_t iw = iw0 + o * S + j;
                    if (iw >= 0 && iw < g->w)
                        acc += cuvil_half_load1(BF, x[((n * g->h + ih) * g->w + iw) * C + c]) * w[(i * 3 + j) * C + c];
                }
            }
            yr[(o0 + o) * C + c] = cuvil_half_round1(BF, b ? acc + b[c] : acc, lo, hi);
        }
}

/* Output pixels [o0, o1) of row (n, oh), one at a time, every tap checked (cuvil_nhwc_dw_pixels). */
static inline __attribute__((always_inline)) void cuvil_nhwc_dwh_pixels(const int BF, const cuvil_nhwc_geom *g,
                                                                        const uint16_t *x, const float *w,
                                                                        const float *b, uint16_t *yr, int64_t n,
                                                                        int64_t oh, int64_t o0, int64_t o1, float lo,
                                                                        float hi) {
    const int64_t C = g->c, cv = C / 16 * 16;
    for (int64_t ow = o0; ow < o1; ow++) {
        for (int64_t c = 0; c < C;) {
            const int vec = c < cv;
            __m512 acc = _mm512_setzero_ps();
            float a1 = 0.0f;
            for (int64_t i = 0; i < g->kh; i++) {
                const int64_t ih = oh * g->sh - g->ph + i * g->dh;
                if (ih < 0 || ih >= g->h) continue;
                for (int64_t j = 0; j < g->kw; j++) {
                    const int64_t iw = ow * g->sw - g->pw + j * g->dw;
                    if (iw < 0 || iw >= g->w) continue;
                    const uint16_t *xs = x + ((n * g->h + ih) * g->w + iw) * C + c;
                    const float *wt = w + (i * g->kw + j) * C + c;
                    if (vec) acc = _mm512_add_ps(acc, _mm512_mul_ps(cuvil_half_load16(BF, xs), _mm512_loadu_ps(wt)));
                    else a1 += cuvil_half_load1(BF, xs[0]) * wt[0];
                }
            }
            if (vec) {
                cuvil_half_store16(BF, yr + ow * C + c, b ? _mm512_add_ps(acc, _mm512_loadu_ps(b + c)) : acc, lo, hi);
                c += 16;
            } else {
                yr[ow * C + c] = cuvil_half_round1(BF, b ? a1 + b[c] : a1, lo, hi);
                c++;
            }
        }
    }
}

/* Row (n, oh): strips of CUVIL_NHWC_DW3_R then 4 pixels, then pixels one at a time (cuvil_nhwc_dw3_row). */
static inline __attribute__((always_inline)) void cuvil_nhwc_dwh3_row(const int BF, const int S, const cuvil_nhwc_geom *g,
                                                                      const uint16_t *x, const float *w, const float *b,
                                                                      uint16_t *yr, int64_t n, int64_t oh, int64_t olo,
                                                                      int64_t ohi, float lo, float hi) {
    const int R = CUVIL_NHWC_DW3_R;
    int64_t o = 0;
    for (; o + R <= g->ow; o += R) {
        if (o >= olo && o + R <= ohi) cuvil_nhwc_dwh3_strip(BF, S, R, 0, g, x, w, b, yr, n, oh, o, lo, hi);
        else cuvil_nhwc_dwh3_strip(BF, S, R, 1, g, x, w, b, yr, n, oh, o, lo, hi);
    }
#if CUVIL_NHWC_DW3_R > 4
    for (; o + 4 <= g->ow; o += 4) {
        if (o >= olo && o + 4 <= ohi) cuvil_nhwc_dwh3_strip(BF, S, 4, 0, g, x, w, b, yr, n, oh, o, lo, hi);
        else cuvil_nhwc_dwh3_strip(BF, S, 4, 1, g, x, w, b, yr, n, oh, o, lo, hi);
    }
#endif
    cuvil_nhwc_dwh_pixels(BF, g, x, w, b, yr, n, oh, o, g->ow, lo, hi);
}

static void cuvil_nhwc_dwh3_part(void *ctx, int64_t task, int tid) {
    const cuvil_nhwc_dwh_job *j = (const cuvil_nhwc_dwh_job *)ctx; /* no scratch: nothing is widened to memory */
    const cuvil_nhwc_geom *g = j->g;
    int64_t lo, hi, olo, ohi;
    (void)tid;
    cuvil_split(g->n * g->oh, j->tasks, task, &lo, &hi);
    cuvil_nhwc_interior_cols(g, &olo, &ohi);
    for (int64_t r = lo; r < hi; r++) {
        uint16_t *yr = j->y + r * g->ow * g->m;
        const int64_t n = r / g->oh, oh = r % g->oh;
        if (j->is_bf16) {
            if (g->sw == 1) cuvil_nhwc_dwh3_row(1, 1, g, j->x, j->w, j->b, yr, n, oh, olo, ohi, j->lo, j->hi);
            else cuvil_nhwc_dwh3_row(1, 2, g, j->x, j->w, j->b, yr, n, oh, olo, ohi, j->lo, j->hi);
        } else {
            if (g->sw == 1) cuvil_nhwc_dwh3_row(0, 1, g, j->x, j->w, j->b, yr, n, oh, olo, ohi, j->lo, j->hi);
            else cuvil_nhwc_dwh3_row(0, 2, g, j->x, j->w, j->b, yr, n, oh, olo, ohi, j->lo, j->hi);
        }
    }
}
#endif

/* A depthwise convolution of f16 / bf16 operands, the bias (or NULL) and weight in float32.
 * Returns 0, or -1 when out of memory. */
static int cuvil_conv_nhwc_depthwise_half(const cuvil_nhwc_geom *g, int is_bf16, const uint16_t *x, const float *w,
                                          const float *b, uint16_t *y, float lo, float hi) {
    const int64_t rows = g->n * g->oh;
    if (rows == 0 || g->ow == 0 || g->m == 0) return 0;
#if defined(CUVIL_NHWC_DWH3)
    if (g->m == g->c && g->kh == 3 && g->kw == 3 && g->dw == 1 && (g->sw == 1 || g->sw == 2)) {
        cuvil_nhwc_dwh_job j3 = {g, is_bf16, x, w, b, y, NULL, 0, 0, cuvil_nhwc_dw_tasks(g), lo, hi};
        cuvil_parallel_for(j3.tasks, cuvil_nhwc_dwh3_part, &j3);
        return 0;
    }
#endif
    const int64_t band_rows = (CUVIL_NHWC_DWH_G - 1) * g->sh + (g->kh - 1) * g->dh + 1;
    const int64_t A = CUVIL_ALIGN / (int64_t)sizeof(float); /* each thread's band and row start aligned */
    const int64_t band = ((band_rows < g->h ? band_rows : g->h) * g->w * g->c + A - 1) / A * A;
    const int64_t row = (g->ow * g->m + A - 1) / A * A;
    cuvil_nhwc_dwh_job j = {g, is_bf16, x, w, b, y, NULL, band, band + row, cuvil_nhwc_dw_tasks(g), lo, hi};
    const size_t bytes = cuvil_size3(sizeof(float), (size_t)(band + row), (size_t)(j.tasks > 1 ? cuvil_num_threads_now() : 1));
    j.scratch = bytes == SIZE_MAX ? NULL : (float *)aligned_alloc(CUVIL_ALIGN, bytes);
    if (!j.scratch) return -1;
    cuvil_parallel_for(j.tasks, cuvil_nhwc_dwh_part, &j);
    free(j.scratch);
    return 0;
}

/* A fused clamp as the float32 kernel's tile epilogue (cuvil_sgemm_epilogue). */
static void cuvil_nhwc_clamp_tile(const void *ctx, float *c, int64_t ldc, int64_t i0, int64_t j0, int64_t rows,
                                  int64_t cols) {
    const float *lohi = (const float *)ctx;
    (void)i0, (void)j0;
    for (int64_t i = 0; i < rows; i++)
        for (int64_t j = 0; j < cols; j++) c[i * ldc + j] = cuvil_clamp_nn_f(c[i * ldc + j], lohi[0], lohi[1]);
}

/* x: xn values, w: wn, b: bn (or NULL), y: yn; x32 and y32: float32 scratch of xn and yn values
 * (unused, and may be NULL, for a depthwise convolution); the result (its bias added) is clamped
 * to [lo, hi] before it is rounded (-INFINITY, INFINITY: no clamp, as clamping to them changes no
 * value).  Returns 0, or -1 when out of memory. */
static CUVIL_UNUSED int cuvil_conv_nhwc_half(const cuvil_nhwc_geom *g, int depthwise, int is_bf16, const uint16_t *x,
                                             int64_t xn, const uint16_t *w, int64_t wn, const uint16_t *b,
                                             int64_t bn, uint16_t *y, int64_t yn, float *x32, float *y32, float lo,
                                             float hi) {
#if defined(CUVIL_HAVE_BF16_DOT)
    if (is_bf16 && !depthwise && g->group == 1 && g->kh == 1 && g->kw == 1 && g->sh == 1 && g->sw == 1 &&
        g->ph == 0 && g->pw == 0 && g->oh == g->h && g->ow == g->w && g->c > 0) {
        float *bias_own = NULL;
        const float *b32 = b ? cuvil_half_widened(1, b, bn, &bias_own) : NULL;
        if (b && !b32) return -1;
        const int rc = cuvil_bf16_gemm_into(g->n * g->h * g->w, g->m, g->c, (const cuvil_bf16 *)x, g->c, 1,
                                            (const cuvil_bf16 *)w, g->m, 1, NULL, y, b32, g->m, 1, lo, hi);
        free(bias_own);
        (void)xn, (void)wn, (void)yn, (void)x32, (void)y32;
        return rc;
    }
#endif
    float *wown, *bown;
    const float *w32, *b32;
    if (cuvil_half_conv_operands(is_bf16, w, wn, b, bn, &w32, &wown, &b32, &bown) != 0) return -1;
    int rc;
    if (depthwise) {
        rc = cuvil_conv_nhwc_depthwise_half(g, is_bf16, x, w32, b32, y, lo, hi);
    } else {
        cuvil_half_to_f32(is_bf16, x, x32, xn);
        const float lohi[2] = {lo, hi};
        const cuvil_sgemm_epilogue clamp = {cuvil_nhwc_clamp_tile, lohi};
        const int clamped = lo > -INFINITY || hi < INFINITY;
        rc = cuvil_conv_nhwc_f32(g, x32, w32, b32, y32, clamped ? &clamp : NULL);
        if (rc == 0) cuvil_f32_to_half(is_bf16, y32, y, yn);
    }
    free(wown);
    free(bown);
    return rc;
}

#endif /* CUVIL_CONV_NHWC_HALF_H */
