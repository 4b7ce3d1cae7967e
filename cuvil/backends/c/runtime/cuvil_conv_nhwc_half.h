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
 * A depthwise convolution widens, per task, a band of the input rows that a group of
 * CUVIL_NHWC_DWH_G output rows reads into per-thread float32 scratch, runs the float32 row kernel
 * on that band (a small image of its own: rows outside the band lie outside it), adds the bias and
 * rounds each row as it is finished.  The arithmetic is the float32 kernel's, so results are
 * bitwise those of widening the whole input; the input is read once in its own type and the result
 * written once, in one parallel region.
 *
 * And a bf16 pointwise convolution (1x1, unit stride, unpadded, one group) on a target with
 * AVX512_BF16: the product of the [pixels x C] input, read in place, and the [C x M] weight on
 * vdpbf16ps (exact products accumulated in float32, the weight's panels cached once per model),
 * each output tile getting its bias and rounded once to bf16 as it leaves the registers.
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
    float *scratch; /* per thread: the band (band_floats), then one output row (ow * m) */
    int64_t band_floats, per_thread, tasks;
} cuvil_nhwc_dwh_job;

/* dst[p, m] = yr[p, m] + b[m] (b may be NULL) rounded once to f16 / bf16, for `pixels` rows of M. */
static void cuvil_nhwc_dwh_round(int is_bf16, const float *restrict yr, const float *restrict b, uint16_t *restrict dst,
                                 int64_t pixels, int64_t M) {
    for (int64_t p = 0; p < pixels; p++) {
        const float *restrict ys = yr + p * M;
        uint16_t *restrict d = dst + p * M;
        int64_t m = 0;
#if defined(__AVX512F__)
        for (; m + 16 <= M; m += 16) {
            __m512 v = _mm512_loadu_ps(ys + m);
            if (b) v = _mm512_add_ps(v, _mm512_loadu_ps(b + m));
            const __m256i h = is_bf16 ? cuvil_bf16_round16(v) : _mm512_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT);
            _mm256_storeu_si256((__m256i *)(d + m), h);
        }
#elif defined(__F16C__)
        if (!is_bf16)
            for (; m + 8 <= M; m += 8) {
                __m256 v = _mm256_loadu_ps(ys + m);
                if (b) v = _mm256_add_ps(v, _mm256_loadu_ps(b + m));
                _mm_storeu_si128((__m128i *)(d + m), _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT));
            }
#endif
        for (; m < M; m++) {
            const float v = b ? ys[m] + b[m] : ys[m];
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
            cuvil_nhwc_dwh_round(j->is_bf16, yr, j->b, j->y + (r + k) * g->ow * M, g->ow, M);
        }
        r += rows;
    }
}

/* A depthwise convolution of f16 / bf16 operands, the bias (or NULL) and weight in float32.
 * Returns 0, or -1 when out of memory. */
static int cuvil_conv_nhwc_depthwise_half(const cuvil_nhwc_geom *g, int is_bf16, const uint16_t *x, const float *w,
                                          const float *b, uint16_t *y) {
    const int64_t rows = g->n * g->oh;
    if (rows == 0 || g->ow == 0 || g->m == 0) return 0;
    const int64_t band_rows = (CUVIL_NHWC_DWH_G - 1) * g->sh + (g->kh - 1) * g->dh + 1;
    const int64_t A = CUVIL_ALIGN / (int64_t)sizeof(float); /* each thread's band and row start aligned */
    const int64_t band = ((band_rows < g->h ? band_rows : g->h) * g->w * g->c + A - 1) / A * A;
    const int64_t row = (g->ow * g->m + A - 1) / A * A;
    cuvil_nhwc_dwh_job j = {g, is_bf16, x, w, b, y, NULL, band, band + row, cuvil_nhwc_dw_tasks(g)};
    const size_t bytes = cuvil_size3(sizeof(float), (size_t)(band + row), (size_t)(j.tasks > 1 ? cuvil_num_threads_now() : 1));
    j.scratch = bytes == SIZE_MAX ? NULL : (float *)aligned_alloc(CUVIL_ALIGN, bytes);
    if (!j.scratch) return -1;
    cuvil_parallel_for(j.tasks, cuvil_nhwc_dwh_part, &j);
    free(j.scratch);
    return 0;
}

/* x: xn values, w: wn, b: bn (or NULL), y: yn; x32 and y32: float32 scratch of xn and yn values
 * (unused, and may be NULL, for a depthwise convolution).  Returns 0, or -1 when out of memory. */
static CUVIL_UNUSED int cuvil_conv_nhwc_half(const cuvil_nhwc_geom *g, int depthwise, int is_bf16, const uint16_t *x,
                                             int64_t xn, const uint16_t *w, int64_t wn, const uint16_t *b,
                                             int64_t bn, uint16_t *y, int64_t yn, float *x32, float *y32) {
#if defined(CUVIL_HAVE_BF16_DOT)
    if (is_bf16 && !depthwise && g->group == 1 && g->kh == 1 && g->kw == 1 && g->sh == 1 && g->sw == 1 &&
        g->ph == 0 && g->pw == 0 && g->oh == g->h && g->ow == g->w && g->c > 0) {
        float *bias_own = NULL;
        const float *b32 = b ? cuvil_half_widened(1, b, bn, &bias_own) : NULL;
        if (b && !b32) return -1;
        const int rc = cuvil_bf16_gemm_into(g->n * g->h * g->w, g->m, g->c, (const cuvil_bf16 *)x, g->c, 1,
                                            (const cuvil_bf16 *)w, g->m, 1, NULL, y, b32, g->m);
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
        rc = cuvil_conv_nhwc_depthwise_half(g, is_bf16, x, w32, b32, y);
    } else {
        cuvil_half_to_f32(is_bf16, x, x32, xn);
        rc = cuvil_conv_nhwc_f32(g, x32, w32, b32, y32, NULL);
        if (rc == 0) cuvil_f32_to_half(is_bf16, y32, y, yn);
    }
    free(wown);
    free(bown);
    return rc;
}

#endif /* CUVIL_CONV_NHWC_HALF_H */
