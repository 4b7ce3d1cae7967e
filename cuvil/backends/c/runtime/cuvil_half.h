/* cuvil_half.h: float16 / bfloat16 conversion, and the f16/bf16 products and convolutions.
 *
 * The reference widens f16/bf16 operands to float32, accumulates in float32 and rounds the result
 * once; so does everything here, in one of two ways:
 *
 * 1. Widened: the operands are converted (exactly) to float32 and the float32 kernel runs
 *    (cuvil_sgemm, cuvil_conv_f32, Winograd, the depthwise kernel ...); its result is rounded once.  A
 *    constant operand (a weight) is widened once per loaded model into the model's constant cache
 *    (cuvil_threads.h), where it counts as a constant itself, so the float32 GEMM caches its
 *    packed form too: after the first call a weight costs nothing to convert.
 * 2. bf16 dot products (CUVIL_HAVE_BF16_DOT: the target has AVX512_BF16): vdpbf16ps multiplies
 *    pairs of bf16 values exactly and accumulates them in float32, twice the multiply-adds of an
 *    FMA per instruction, with no widened copy.  cuvil_bf16_gemm and cuvil_conv_bf16 run on it.
 *
 * The bulk conversions use F16C / AVX-512 where the target has them, else the scalar conversions
 * of cuvil_rt.h; all round to nearest even and keep NaN a (quiet) NaN.
 */
#ifndef CUVIL_HALF_H
#define CUVIL_HALF_H

#include "cuvil_conv.h"
#include "cuvil_conv_tiled.h"
#include "cuvil_gemm.h"
#include "cuvil_rt.h"
#include "cuvil_threads.h"
#include "cuvil_winograd.h"
#if defined(__AVX512F__) || defined(__F16C__)
#include <immintrin.h>
#endif

#if defined(__AVX512BF16__) && defined(__AVX512BW__) && defined(__AVX512VL__)
#define CUVIL_HAVE_BF16_DOT 1
#endif

/* ---- rounding in registers ------------------------------------------------------------- */

/* x rounded to the nearest float16 (ties to even) and widened back: bitwise
 * cuvil_f16_to_f32(cuvil_f32_to_f16(x)), in float32 and integer operations that vectorise (the
 * scalar conversions keep a loop from vectorising).  A fused f16 intermediate is rounded by it. */
static inline float cuvil_f16_round_f(float x) {
    uint32_t b, s, r;
    memcpy(&b, &x, 4);
    const uint32_t sign = b & 0x80000000u, a = b & 0x7fffffffu;
    float ax, sub, y;
    memcpy(&ax, &a, 4);
    /* f16 normals: the mantissa rounded to 10 bits, ties to even (a carry moves into the exponent) */
    const uint32_t n = (a + 0xfffu + ((a >> 13) & 1u)) & 0xffffe000u;
    /* f16 subnormals (|x| < 2^-14): multiples of 2^-24, float32's spacing in [0.5, 1) */
    sub = (ax + 0.5f) - 0.5f;
    memcpy(&s, &sub, 4);
    r = a < 0x38800000u ? s : n;
    r = r > 0x477fe000u ? 0x7f800000u : r;                      /* beyond 65504: infinity */
    r = a > 0x7f800000u ? ((a | 0x00400000u) & 0xffffe000u) : r; /* NaN: quiet, its payload's top bits */
    r |= sign;
    memcpy(&y, &r, 4);
    return y;
}

/* ---- clamps ---------------------------------------------------------------------------- */

/* A fused relu / clip of a result before it is rounded: max then min against bounds that are not
 * NaN, as cuvil_max_nn_f / cuvil_min_nn_f (cuvil_math.h) compute them (a NaN passes, and a value
 * equal to a bound gives the bound).  With bounds of the result's type, rounding commutes with it. */
static inline float cuvil_clamp_nn_f(float v, float lo, float hi) {
    v = v <= lo ? lo : v;
    return v >= hi ? hi : v;
}

#if defined(__AVX512F__)
static inline __m512 cuvil_clamp_nn16(__m512 v, __m512 lo, __m512 hi) {
    v = _mm512_mask_mov_ps(v, _mm512_cmp_ps_mask(v, lo, _CMP_LE_OQ), lo);
    return _mm512_mask_mov_ps(v, _mm512_cmp_ps_mask(v, hi, _CMP_GE_OQ), hi);
}
#endif

/* ---- bulk conversions ------------------------------------------------------------------ */

#if defined(__AVX512F__)
/* 16 float32 values rounded to bf16 exactly as cuvil_f32_to_bf16 rounds one. */
static inline __m256i cuvil_bf16_round16(__m512 v) {
    const __m512i x = _mm512_castps_si512(v);
    const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(x, 16), _mm512_set1_epi32(1));
    __m512i r = _mm512_srli_epi32(_mm512_add_epi32(x, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7fff))), 16);
    const __mmask16 nan = _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
    r = _mm512_mask_mov_epi32(r, nan, _mm512_or_si512(_mm512_srli_epi32(x, 16), _mm512_set1_epi32(0x40)));
    return _mm512_cvtepi32_epi16(r);
}

static inline __m512 cuvil_bf16_widen16(const uint16_t *s) {
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)s)), 16));
}
#endif

static CUVIL_UNUSED void cuvil_f16_to_f32_n(const cuvil_f16 *restrict s, float *restrict d, int64_t n) {
    int64_t i = 0;
#if defined(__AVX512F__)
    for (; i + 16 <= n; i += 16)
        _mm512_storeu_ps(d + i, _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(s + i))));
#elif defined(__F16C__)
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(d + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(s + i))));
#endif
    for (; i < n; i++) d[i] = cuvil_f16_to_f32(s[i]);
}

static CUVIL_UNUSED void cuvil_f32_to_f16_n(const float *restrict s, cuvil_f16 *restrict d, int64_t n) {
    int64_t i = 0;
#if defined(__AVX512F__)
    for (; i + 16 <= n; i += 16)
        _mm256_storeu_si256((__m256i *)(d + i), _mm512_cvtps_ph(_mm512_loadu_ps(s + i), _MM_FROUND_TO_NEAREST_INT));
#elif defined(__F16C__)
    for (; i + 8 <= n; i += 8)
        _mm_storeu_si128((__m128i *)(d + i), _mm256_cvtps_ph(_mm256_loadu_ps(s + i), _MM_FROUND_TO_NEAREST_INT));
#endif
    for (; i < n; i++) d[i] = cuvil_f32_to_f16(s[i]);
}

static CUVIL_UNUSED void cuvil_bf16_to_f32_n(const cuvil_bf16 *restrict s, float *restrict d, int64_t n) {
    int64_t i = 0;
#if defined(__AVX512F__)
    for (; i + 16 <= n; i += 16) _mm512_storeu_ps(d + i, cuvil_bf16_widen16(s + i));
#endif
    for (; i < n; i++) d[i] = cuvil_bf16_to_f32(s[i]);
}

static CUVIL_UNUSED void cuvil_f32_to_bf16_n(const float *restrict s, cuvil_bf16 *restrict d, int64_t n) {
    int64_t i = 0;
#if defined(__AVX512F__)
    for (; i + 16 <= n; i += 16) _mm256_storeu_si256((__m256i *)(d + i), cuvil_bf16_round16(_mm512_loadu_ps(s + i)));
#endif
    for (; i < n; i++) d[i] = cuvil_f32_to_bf16(s[i]);
}

/* Conversions of n values split over the call's threads when that pays (each task converts its
 * own range: the result does not depend on the split). */
#define CUVIL_HALF_CHUNK ((int64_t)1 << 14)

typedef struct cuvil_half_cvt_job {
    int is_bf16, widen;
    const void *s;
    void *d;
    int64_t n, ntasks;
    int clamp; /* rounding: clamp to [lo, hi] first (cuvil_clamp_nn_f) */
    float lo, hi;
} cuvil_half_cvt_job;

/* n float32 values clamped to [lo, hi] and rounded to f16 / bf16. */
static void cuvil_f32_to_half_clamp_n(int is_bf16, const float *restrict s, uint16_t *restrict d, int64_t n, float lo,
                                      float hi) {
    int64_t i = 0;
#if defined(__AVX512F__)
    const __m512 lov = _mm512_set1_ps(lo), hiv = _mm512_set1_ps(hi);
    for (; i + 16 <= n; i += 16) {
        const __m512 v = cuvil_clamp_nn16(_mm512_loadu_ps(s + i), lov, hiv);
        _mm256_storeu_si256((__m256i *)(d + i),
                            is_bf16 ? cuvil_bf16_round16(v) : _mm512_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT));
    }
#endif
    for (; i < n; i++) {
        const float v = cuvil_clamp_nn_f(s[i], lo, hi);
        d[i] = is_bf16 ? cuvil_f32_to_bf16(v) : cuvil_f32_to_f16(v);
    }
}

static void cuvil_half_cvt_task(void *ctx, int64_t task, int tid) {
    const cuvil_half_cvt_job *j = (const cuvil_half_cvt_job *)ctx;
    int64_t lo, hi;
    (void)tid;
    cuvil_split(j->n, j->ntasks, task, &lo, &hi);
    if (j->widen) {
        const uint16_t *s = (const uint16_t *)j->s + lo;
        float *d = (float *)j->d + lo;
        if (j->is_bf16) cuvil_bf16_to_f32_n(s, d, hi - lo);
        else cuvil_f16_to_f32_n(s, d, hi - lo);
    } else {
        const float *s = (const float *)j->s + lo;
        uint16_t *d = (uint16_t *)j->d + lo;
        if (j->clamp) cuvil_f32_to_half_clamp_n(j->is_bf16, s, d, hi - lo, j->lo, j->hi);
        else if (j->is_bf16) cuvil_f32_to_bf16_n(s, d, hi - lo);
        else cuvil_f32_to_f16_n(s, d, hi - lo);
    }
}

static void cuvil_half_convert(int is_bf16, int widen, const void *s, void *d, int64_t n, int clamp, float lo,
                               float hi) {
    cuvil_half_cvt_job j = {is_bf16, widen, s, d, n, 1, clamp, lo, hi};
    const int threads = cuvil_num_threads_now();
    if (threads > 1 && n >= 2 * CUVIL_HALF_CHUNK && cuvil_parallel_worth(0.15 * (double)n)) /* ~0.15 ns a value */
        j.ntasks = threads;
    if (j.ntasks == 1) cuvil_half_cvt_task(&j, 0, 0);
    else cuvil_parallel_for(j.ntasks, cuvil_half_cvt_task, &j);
}

/* n f16 (is_bf16 = 0) or bf16 values widened into d / rounded from s. */
static CUVIL_UNUSED void cuvil_half_to_f32(int is_bf16, const uint16_t *s, float *d, int64_t n) {
    cuvil_half_convert(is_bf16, 1, s, d, n, 0, 0.0f, 0.0f);
}

static CUVIL_UNUSED void cuvil_f32_to_half(int is_bf16, const float *s, uint16_t *d, int64_t n) {
    cuvil_half_convert(is_bf16, 0, s, d, n, 0, 0.0f, 0.0f);
}

/* cuvil_f32_to_half of the values clamped to [lo, hi] (a fused relu or clip; -INFINITY, INFINITY: none). */
static CUVIL_UNUSED void cuvil_f32_to_half_clamped(int is_bf16, const float *s, uint16_t *d, int64_t n, float lo,
                                                   float hi) {
    cuvil_half_convert(is_bf16, 0, s, d, n, lo > -INFINITY || hi < INFINITY, lo, hi);
}

/* A strided rows x cols matrix of f16 / bf16 values as a row-major float32 matrix. */
static CUVIL_UNUSED void cuvil_half_matrix_to_f32(int is_bf16, const uint16_t *s, int64_t rows, int64_t cols,
                                                 int64_t rs, int64_t cs, float *restrict d) {
    if (cs == 1 && (rs == cols || rows == 1)) {
        cuvil_half_to_f32(is_bf16, s, d, rows * cols);
        return;
    }
    for (int64_t i = 0; i < rows; i++) {
        if (cs == 1) {
            if (is_bf16) cuvil_bf16_to_f32_n(s + i * rs, d + i * cols, cols);
            else cuvil_f16_to_f32_n(s + i * rs, d + i * cols, cols);
            continue;
        }
        for (int64_t j = 0; j < cols; j++) {
            const uint16_t h = s[i * rs + j * cs];
            d[i * cols + j] = is_bf16 ? cuvil_bf16_to_f32(h) : cuvil_f16_to_f32(h);
        }
    }
}

/* ---- widened constants ------------------------------------------------------------------ */

#define CUVIL_HALF_TAG_WIDE 0x68616c6677ll /* cache keys of this header's entries start with a tag */
#define CUVIL_HALF_TAG_PAIRS 0x68616c6670ll
#define CUVIL_HALF_TAG_PANELS 0x68616c6662ll

typedef struct cuvil_half_widen_args {
    int is_bf16;
    const uint16_t *src;
    int64_t n;
} cuvil_half_widen_args;

static void cuvil_half_widen_build(void *dst, const void *arg) {
    const cuvil_half_widen_args *a = (const cuvil_half_widen_args *)arg;
    if (a->is_bf16) cuvil_bf16_to_f32_n(a->src, (float *)dst, a->n);
    else cuvil_f16_to_f32_n(a->src, (float *)dst, a->n);
}

/* `src` (n values) as float32: for a constant, the model's cached widened copy (a constant too);
 * otherwise a widened copy in new memory, returned in *owned for the caller to free.  NULL when
 * out of memory. */
static CUVIL_UNUSED const float *cuvil_half_widened(int is_bf16, const uint16_t *src, int64_t n, float **owned) {
    static const float none = 0.0f;
    *owned = NULL;
    if (n <= 0) return &none;
    if (cuvil_is_constant(src, (size_t)n * sizeof(uint16_t))) {
        const int64_t key[CUVIL_CACHE_KEY] = {CUVIL_HALF_TAG_WIDE, is_bf16, n, 0, 0, 0, 0, 0};
        const cuvil_half_widen_args args = {is_bf16, src, n};
        const float *c = (const float *)cuvil_cache_get_constant(src, key, (size_t)n * sizeof(float),
                                                                  cuvil_half_widen_build, &args);
        if (c) return c;
    }
    *owned = (float *)malloc((size_t)n * sizeof(float));
    if (*owned) cuvil_half_to_f32(is_bf16, src, *owned, n);
    return *owned;
}

/* A strided rows x cols matrix of f16 / bf16 values as a float32 operand of cuvil_sgemm, its
 * strides in *ors / *ocs.  A constant (a weight) with non-negative strides: the model's cached
 * widened copy of the values it spans, read with its own strides (a constant too, so the GEMM caches
 * its packed panels: after the first call the weight costs nothing, a transposed one included).
 * Otherwise, or when the cache has no memory: widened row-major into d (rows * cols values). */
static CUVIL_UNUSED const float *cuvil_half_matrix_operand(int is_bf16, const uint16_t *s, int64_t rows, int64_t cols,
                                                           int64_t rs, int64_t cs, float *restrict d, int64_t *ors,
                                                           int64_t *ocs) {
    if (rows > 0 && cols > 0 && rs >= 0 && cs >= 0) {
        const int64_t span = (rows - 1) * rs + (cols - 1) * cs + 1;
        if (cuvil_is_constant(s, (size_t)span * sizeof(uint16_t))) {
            const int64_t key[CUVIL_CACHE_KEY] = {CUVIL_HALF_TAG_WIDE, is_bf16, span, 0, 0, 0, 0, 0};
            const cuvil_half_widen_args args = {is_bf16, s, span};
            const float *c = (const float *)cuvil_cache_get_constant(s, key, (size_t)span * sizeof(float),
                                                                      cuvil_half_widen_build, &args);
            if (c) {
                *ors = rs;
                *ocs = cs;
                return c;
            }
        }
    }
    cuvil_half_matrix_to_f32(is_bf16, s, rows, cols, rs, cs, d);
    *ors = cols;
    *ocs = 1;
    return d;
}

/* ---- convolution on widened operands ------------------------------------------------------ */

enum { CUVIL_HALF_CONV = 0, CUVIL_HALF_CONV_DEPTHWISE = 1, CUVIL_HALF_CONV_TRANSPOSE = 2 };

/* A half convolution's weight (wn values) and bias (bn, or NULL) in float32 (cuvil_half_widened:
 * *wown and *bown are what the caller frees, NULL when cached).  Returns 0, or -1 when out of memory. */
static CUVIL_UNUSED int cuvil_half_conv_operands(int is_bf16, const uint16_t *w, int64_t wn, const uint16_t *b,
                                                 int64_t bn, const float **w32, float **wown, const float **b32,
                                                 float **bown) {
    *b32 = NULL;
    *bown = NULL;
    if (!(*w32 = cuvil_half_widened(is_bf16, w, wn, wown))) return -1;
    if (b && !(*b32 = cuvil_half_widened(is_bf16, b, bn, bown))) {
        free(*wown);
        return -1;
    }
    return 0;
}

/* A convolution of f16 / bf16 operands (x: xn values, w: wn, b: the bias or NULL, y: yn) by the
 * float32 algorithm `kind` (CUVIL_HALF_CONV: Winograd F(m x m, 3 x 3) when wino_m > 0, else the
 * float32 path's GEMM over tiles of output rows, cuvil_conv_tiled.h), through float32 scratch x32
 * (xn values) and y32 (yn values); the result is clamped to [lo, hi] as it is rounded (a fused relu
 * or clip; -INFINITY, INFINITY: none).  Returns 0, or -1 when out of memory. */
static CUVIL_UNUSED int cuvil_conv_half(const cuvil_conv_geom *g, int kind, int is_bf16, const uint16_t *x,
                                        int64_t xn, const uint16_t *w, int64_t wn, const uint16_t *b, int64_t bn,
                                        uint16_t *y, int64_t yn, int wino_m, float *x32, float *y32, float lo,
                                        float hi) {
    float *wown, *bown;
    const float *w32, *b32;
    if (cuvil_half_conv_operands(is_bf16, w, wn, b, bn, &w32, &wown, &b32, &bown) != 0) return -1;
    cuvil_half_to_f32(is_bf16, x, x32, xn);
    int rc = 0;
    if (kind == CUVIL_HALF_CONV_DEPTHWISE) cuvil_conv_depthwise2d_f32(g, x32, w32, b32, y32);
    else if (kind == CUVIL_HALF_CONV_TRANSPOSE) rc = cuvil_conv_transpose_f32(g, x32, w32, b32, y32);
    else if (wino_m > 0) rc = cuvil_conv_winograd_f32(g, wino_m, x32, w32, b32, y32, NULL, NULL, 0);
    else rc = cuvil_conv_tiled_f32(g, x32, w32, b32, y32, NULL);
    if (rc == 0) cuvil_f32_to_half_clamped(is_bf16, y32, y, yn, lo, hi);
    free(wown);
    free(bown);
    return rc;
}

#if defined(CUVIL_HAVE_BF16_DOT)
/* ---- bf16 dot products ------------------------------------------------------------------ *
 * Y [M x N] = A [M x K] B [K x N] in float32 over bf16 operands.  vdpbf16ps takes its operands as
 * pairs of bf16 values along K in 32-bit lanes:
 *   A as rows of pairs (A[i][2p], A[i][2p+1]): a row-major A with an even K already is;
 *   B in 16-column panels, panel q holding (B[2p][j], B[2p+1][j]) for j in [16q, 16q + 16) at
 *   Bp + (q * KP + p) * 16;
 * an odd K is padded with a zero.  The micro-kernel keeps R (up to 8) rows x 32 columns of float32
 * accumulators in registers over the whole K; its tile is then stored as float32, or, with a bias
 * added, rounded once to bf16.  Tiles are independent and each runs its K loop in one order, so the
 * split over threads (contiguous ranges of tiles) does not change any result. */

typedef uint32_t cuvil_u32_a2 __attribute__((aligned(2), may_alias)); /* pairs inside a bf16 array */

#define CUVIL_BF16_MR 8

typedef struct cuvil_bf16_job {
    int64_t M, N, KP, NP;
    const cuvil_u32_a2 *A; /* pairs, row i at A + i * lda */
    int64_t lda;
    const uint32_t *Bp;    /* panels */
    float *Y;              /* float32 result (row stride ldy), or: */
    uint16_t *Yh;          /* bf16 result, bias[i] or bias_col[j] added before the rounding (or neither) */
    const float *bias;
    int64_t ldy, mblocks, ntiles, ntasks;
    const float *bias_col; /* per column of Yh (the output channels of a channels-last convolution) */
    int clamp;             /* Yh: clamp to [lo, hi] (cuvil_clamp_nn16) before the rounding */
    float lo, hi;
} cuvil_bf16_job;

#define CUVIL_BF16_TILE(R)                                                                                       \
    static void cuvil_bf16_tile_##R(const cuvil_bf16_job *j, int64_t i0, int64_t q) {                             \
        const int64_t KP = j->KP;                                                                                 \
        const int two = q + 1 < j->NP;                                                                            \
        const uint32_t *b0 = j->Bp + q * KP * 16, *b1 = two ? b0 + KP * 16 : b0;                                  \
        const cuvil_u32_a2 *a[R];                                                                                 \
        __m512 c[R][2];                                                                                           \
        _Pragma("GCC unroll 8") for (int r = 0; r < R; r++) {                                                     \
            a[r] = j->A + (i0 + r) * j->lda;                                                                      \
            c[r][0] = c[r][1] = _mm512_setzero_ps();                                                              \
        }                                                                                                         \
        for (int64_t p = 0; p < KP; p++) {                                                                        \
            const __m512bh v0 = (__m512bh)_mm512_load_si512(b0 + p * 16);                                        \
            const __m512bh v1 = (__m512bh)_mm512_load_si512(b1 + p * 16);                                        \
            _Pragma("GCC unroll 8") for (int r = 0; r < R; r++) {                                                 \
                const __m512bh av = (__m512bh)_mm512_set1_epi32((int)a[r][p]);                                   \
                c[r][0] = _mm512_dpbf16_ps(c[r][0], av, v0);                                                      \
                c[r][1] = _mm512_dpbf16_ps(c[r][1], av, v1);                                                      \
            }                                                                                                     \
        }                                                                                                         \
        for (int r = 0; r < R; r++)                                                                               \
            for (int h = 0; h < 1 + two; h++) {                                                                   \
                const int64_t col = (q + h) * 16, i = i0 + r;                                                     \
                const __mmask16 mask =                                                                            \
                    j->N - col >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (j->N - col)) - 1u);                \
                if (j->Yh) {                                                                                      \
                    __m512 v = j->bias ? _mm512_add_ps(c[r][h], _mm512_set1_ps(j->bias[i])) : c[r][h];            \
                    if (j->bias_col) v = _mm512_add_ps(v, _mm512_maskz_loadu_ps(mask, j->bias_col + col));         \
                    if (j->clamp) v = cuvil_clamp_nn16(v, _mm512_set1_ps(j->lo), _mm512_set1_ps(j->hi));             \
                    _mm256_mask_storeu_epi16(j->Yh + i * j->ldy + col, mask, cuvil_bf16_round16(v));              \
                } else {                                                                                          \
                    _mm512_mask_storeu_ps(j->Y + i * j->ldy + col, mask, c[r][h]);                                \
                }                                                                                                 \
            }                                                                                                     \
    }

CUVIL_BF16_TILE(1)
CUVIL_BF16_TILE(2)
CUVIL_BF16_TILE(3)
CUVIL_BF16_TILE(4)
CUVIL_BF16_TILE(5)
CUVIL_BF16_TILE(6)
CUVIL_BF16_TILE(7)
CUVIL_BF16_TILE(8)

typedef void (*cuvil_bf16_tile_fn)(const cuvil_bf16_job *j, int64_t i0, int64_t q);
static const cuvil_bf16_tile_fn cuvil_bf16_tiles[CUVIL_BF16_MR + 1] = {
    NULL, cuvil_bf16_tile_1, cuvil_bf16_tile_2, cuvil_bf16_tile_3, cuvil_bf16_tile_4,
    cuvil_bf16_tile_5, cuvil_bf16_tile_6, cuvil_bf16_tile_7, cuvil_bf16_tile_8};

/* Tiles [lo, hi) of the grid, column-pair major (consecutive tiles share their B panels). */
static void cuvil_bf16_gemm_task(void *ctx, int64_t task, int tid) {
    const cuvil_bf16_job *j = (const cuvil_bf16_job *)ctx;
    int64_t lo, hi;
    (void)tid;
    cuvil_split(j->ntiles, j->ntasks, task, &lo, &hi);
    for (int64_t t = lo; t < hi; t++) {
        const int64_t i0 = t % j->mblocks * CUVIL_BF16_MR, q = t / j->mblocks * 2;
        const int64_t mr = j->M - i0 < CUVIL_BF16_MR ? j->M - i0 : CUVIL_BF16_MR;
        cuvil_bf16_tiles[mr](j, i0, q);
    }
}

static void cuvil_bf16_gemm_run(cuvil_bf16_job *j) {
    j->mblocks = (j->M + CUVIL_BF16_MR - 1) / CUVIL_BF16_MR;
    j->ntiles = j->mblocks * ((j->NP + 1) / 2);
    j->ntasks = 1;
    const int threads = cuvil_num_threads_now();
    /* vdpbf16ps: 32 multiply-adds; about 64 a nanosecond on one core */
    if (threads > 1 && j->ntiles > 1 && cuvil_parallel_worth((double)j->M * (double)j->N * 2.0 * (double)j->KP / 64.0))
        j->ntasks = j->ntiles < 4 * threads ? j->ntiles : 4 * threads;
    if (j->ntasks == 1) cuvil_bf16_gemm_task(j, 0, 0);
    else cuvil_parallel_for(j->ntasks, cuvil_bf16_gemm_task, j);
}

/* Where the rows of B come from: a strided matrix, or the im2col matrix of one image's group. */
typedef struct cuvil_bf16_pack_job {
    int64_t K, N, KP, NP, ntasks;
    const uint16_t *B; /* matrix: row k at B + k * rsb, columns csb apart */
    int64_t rsb, csb;
    const cuvil_conv_geom *g; /* else the convolution g of x (cg channels) */
    const uint16_t *x;
    int direct;               /* a 1x1 unit-stride unpadded window: row k is channel k */
    uint16_t *tmp;            /* per thread: two rows of NP * 16 values */
    uint32_t *bp;
} cuvil_bf16_pack_job;

/* Row k (= channel * taps + tap) of the im2col matrix of x (cuvil_im2col_f32's layout). */
static void cuvil_im2col_row_u16(const cuvil_conv_geom *g, const uint16_t *x, int64_t k, uint16_t *row) {
    const int nd = g->nsp, last = nd - 1;
    const int64_t taps = cuvil_conv_prod(g->k, nd), plane = cuvil_conv_prod(g->in, nd);
    const int64_t ow = g->out[last], rows = cuvil_conv_prod(g->out, nd) / ow, s = g->stride[last];
    int64_t tk[CUVIL_CONV_MAXD], rem = k % taps;
    for (int d = last; d >= 0; d--) {
        tk[d] = rem % g->k[d];
        rem /= g->k[d];
    }
    const uint16_t *src = x + k / taps * plane;
    const int64_t base = tk[last] * g->dil[last] - g->pad[last];
    int64_t lo, hi;
    cuvil_conv_valid(base, s, g->in[last], ow, &lo, &hi);
    int64_t oi[CUVIL_CONV_MAXD] = {0};
    for (int64_t q = 0; q < rows; q++) {
        uint16_t *restrict out = row + q * ow;
        int valid = 1;
        int64_t off = 0;
        for (int d = 0; d < last; d++) {
            const int64_t ii = oi[d] * g->stride[d] - g->pad[d] + tk[d] * g->dil[d];
            if (ii < 0 || ii >= g->in[d]) valid = 0;
            off = off * g->in[d] + ii;
        }
        if (!valid) {
            memset(out, 0, sizeof(uint16_t) * (size_t)ow);
        } else {
            const int64_t start = off * g->in[last] + base;
            for (int64_t o = 0; o < lo; o++) out[o] = 0;
            if (s == 1) {
                if (hi > lo) memcpy(out + lo, src + start + lo, sizeof(uint16_t) * (size_t)(hi - lo));
            } else {
                for (int64_t o = lo; o < hi; o++) out[o] = src[start + o * s];
            }
            for (int64_t o = hi; o < ow; o++) out[o] = 0;
        }
        for (int d = last - 1; d >= 0; d--) {
            if (++oi[d] < g->out[d]) break;
            oi[d] = 0;
        }
    }
}

static const uint16_t *cuvil_bf16_pack_row(const cuvil_bf16_pack_job *j, int64_t k, uint16_t *tmp) {
    if (j->g) {
        if (j->direct) return j->x + k * j->N;
        cuvil_im2col_row_u16(j->g, j->x, k, tmp);
        return tmp;
    }
    if (j->csb == 1) return j->B + k * j->rsb;
    for (int64_t c = 0; c < j->N; c++) tmp[c] = j->B[k * j->rsb + c * j->csb];
    return tmp;
}

/* Pairs [lo, hi) of rows into the panels. */
static void cuvil_bf16_pack_task(void *ctx, int64_t task, int tid) {
    const cuvil_bf16_pack_job *j = (const cuvil_bf16_pack_job *)ctx;
    int64_t lo, hi;
    cuvil_split(j->KP, j->ntasks, task, &lo, &hi);
    uint16_t *t0 = j->tmp + (size_t)tid * 2 * (size_t)(j->NP * 16), *t1 = t0 + j->NP * 16;
    const int64_t full = j->N / 16 * 16;
    for (int64_t p = lo; p < hi; p++) {
        const uint16_t *r0 = cuvil_bf16_pack_row(j, 2 * p, t0);
        const uint16_t *r1 = 2 * p + 1 < j->K ? cuvil_bf16_pack_row(j, 2 * p + 1, t1) : NULL;
        for (int64_t c = 0; c < full; c += 16) {
            const __m512i v0 = _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)(r0 + c)));
            const __m512i v1 = r1 ? _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)(r1 + c)))
                                  : _mm512_setzero_si512();
            _mm512_store_si512(j->bp + (c / 16 * j->KP + p) * 16, _mm512_or_si512(v0, _mm512_slli_epi32(v1, 16)));
        }
        if (full < j->N) {
            uint32_t *d = j->bp + (full / 16 * j->KP + p) * 16;
            for (int64_t c = full; c < full + 16; c++) {
                const uint32_t lo16 = c < j->N ? r0[c] : 0, hi16 = c < j->N && r1 ? r1[c] : 0;
                d[c - full] = lo16 | (hi16 << 16);
            }
        }
    }
}

/* Packs j's rows into j->bp (NP * KP * 16 values, 64-byte aligned); -1 when out of memory. */
static int cuvil_bf16_pack(cuvil_bf16_pack_job *j) {
    const int threads = cuvil_num_threads_now();
    j->ntasks = 1;
    if (threads > 1 && j->KP > 1 && cuvil_parallel_worth(0.3 * (double)j->K * (double)j->N))
        j->ntasks = j->KP < threads ? j->KP : threads;
    const int64_t nt = j->ntasks == 1 ? 1 : threads; /* tmp is indexed by the thread running a task */
    j->tmp = (uint16_t *)malloc((size_t)nt * 2 * (size_t)(j->NP * 16) * sizeof(uint16_t));
    if (!j->tmp) return -1;
    if (j->ntasks == 1) cuvil_bf16_pack_task(j, 0, 0);
    else cuvil_parallel_for(j->ntasks, cuvil_bf16_pack_task, j);
    free(j->tmp);
    j->tmp = NULL;
    return 0;
}

static size_t cuvil_bf16_panel_bytes(int64_t KP, int64_t NP) {
    return cuvil_size3(sizeof(uint32_t) * 16, (size_t)KP, (size_t)NP);
}

typedef struct cuvil_bf16_pairs_args {
    const uint16_t *A;
    int64_t M, K, KP, rsa, csa;
} cuvil_bf16_pairs_args;

static void cuvil_bf16_pairs_build(void *dst, const void *arg) {
    const cuvil_bf16_pairs_args *a = (const cuvil_bf16_pairs_args *)arg;
    uint32_t *d = (uint32_t *)dst;
    for (int64_t i = 0; i < a->M; i++)
        for (int64_t p = 0; p < a->KP; p++) {
            const uint32_t lo = a->A[i * a->rsa + 2 * p * a->csa];
            const uint32_t hi = 2 * p + 1 < a->K ? a->A[i * a->rsa + (2 * p + 1) * a->csa] : 0;
            d[i * a->KP + p] = lo | (hi << 16);
        }
}

/* A [M x K] as rows of pairs: A itself when it already is, else a packed copy (the model's cached
 * one for a constant; otherwise new memory returned in *owned).  *lda: the row stride in pairs. */
static const cuvil_u32_a2 *cuvil_bf16_pairs(const uint16_t *A, int64_t M, int64_t K, int64_t rsa, int64_t csa,
                                           int64_t *lda, uint32_t **owned) {
    const int64_t KP = (K + 1) / 2;
    *owned = NULL;
    if (csa == 1 && K % 2 == 0 && rsa % 2 == 0 && rsa >= 0) {
        *lda = rsa / 2;
        return (const cuvil_u32_a2 *)A;
    }
    *lda = KP;
    const cuvil_bf16_pairs_args args = {A, M, K, KP, rsa, csa};
    const size_t bytes = cuvil_size3(sizeof(uint32_t), (size_t)M, (size_t)KP);
    if (rsa >= 0 && csa >= 0 && M > 0 && K > 0 &&
        cuvil_is_constant(A, ((size_t)((M - 1) * rsa + (K - 1) * csa) + 1) * sizeof(uint16_t))) {
        const int64_t key[CUVIL_CACHE_KEY] = {CUVIL_HALF_TAG_PAIRS, M, K, rsa, csa, 0, 0, 0};
        const void *c = cuvil_cache_get(A, key, bytes, cuvil_bf16_pairs_build, &args);
        if (c) return (const cuvil_u32_a2 *)c;
    }
    *owned = (uint32_t *)malloc(bytes);
    if (*owned) cuvil_bf16_pairs_build(*owned, &args);
    return (const cuvil_u32_a2 *)*owned;
}

static void cuvil_bf16_panels_build(void *dst, const void *arg) {
    cuvil_bf16_pack_job j = *(const cuvil_bf16_pack_job *)arg;
    j.bp = (uint32_t *)dst;
    j.ntasks = 1;
    /* a constant B is packed once, on this thread (the cache lock is held: no parallel region) */
    j.tmp = (uint16_t *)malloc(2 * (size_t)(j.NP * 16) * sizeof(uint16_t));
    if (!j.tmp) { /* a build cannot fail: pack without the gathering scratch, one value at a time */
        uint32_t *d = (uint32_t *)dst;
        for (int64_t c = 0; c < j.NP * 16; c++)
            for (int64_t p = 0; p < j.KP; p++) {
                const uint32_t lo = c < j.N ? j.B[2 * p * j.rsb + c * j.csb] : 0;
                const uint32_t hi = c < j.N && 2 * p + 1 < j.K ? j.B[(2 * p + 1) * j.rsb + c * j.csb] : 0;
                d[(c / 16 * j.KP + p) * 16 + c % 16] = lo | (hi << 16);
            }
        return;
    }
    cuvil_bf16_pack_task(&j, 0, 0);
    free(j.tmp);
}

/* A B over K into Y (float32) or Yh (bf16, with bias_col[j] added and, with `clamp`, clamped to
 * [lo, hi] before the rounding); see cuvil_bf16_gemm.  K > 0. */
static int cuvil_bf16_gemm_into(int64_t M, int64_t N, int64_t K, const cuvil_bf16 *A, int64_t rsa, int64_t csa,
                                const cuvil_bf16 *B, int64_t rsb, int64_t csb, float *Y, uint16_t *Yh,
                                const float *bias_col, int64_t ldy, int clamp, float lo, float hi) {
    const int64_t KP = (K + 1) / 2, NP = (N + 15) / 16;
    const size_t pbytes = cuvil_bf16_panel_bytes(KP, NP);
    cuvil_bf16_pack_job pj = {K, N, KP, NP, 1, B, rsb, csb, NULL, NULL, 0, NULL, NULL};
    const uint32_t *bp = NULL;
    uint32_t *bown = NULL, *aown;
    if (rsb >= 0 && csb >= 0 &&
        cuvil_is_constant(B, ((size_t)((K - 1) * rsb + (N - 1) * csb) + 1) * sizeof(uint16_t))) {
        const int64_t key[CUVIL_CACHE_KEY] = {CUVIL_HALF_TAG_PANELS, K, N, rsb, csb, 0, 0, 0};
        bp = (const uint32_t *)cuvil_cache_get(B, key, pbytes, cuvil_bf16_panels_build, &pj);
    }
    if (!bp) {
        pj.bp = bown = (uint32_t *)aligned_alloc(64, (pbytes + 63) / 64 * 64);
        if (!bown || cuvil_bf16_pack(&pj) != 0) {
            free(bown);
            return -1;
        }
        bp = bown;
    }
    int64_t lda;
    const cuvil_u32_a2 *ap = cuvil_bf16_pairs(A, M, K, rsa, csa, &lda, &aown);
    if (!ap) {
        free(bown);
        return -1;
    }
    cuvil_bf16_job j = {M, N, KP, NP, ap, lda, bp, Y, Yh, NULL, ldy, 0, 0, 0, bias_col, clamp, lo, hi};
    cuvil_bf16_gemm_run(&j);
    free(aown);
    free(bown);
    return 0;
}

/* Y[M x N] (row stride ldy, float32) = A B over K, A and B bf16 with arbitrary strides; a constant
 * A or B is prepared once per model.  Returns 0, or -1 when out of memory. */
static CUVIL_UNUSED int cuvil_bf16_gemm(int64_t M, int64_t N, int64_t K, const cuvil_bf16 *A, int64_t rsa,
                                        int64_t csa, const cuvil_bf16 *B, int64_t rsb, int64_t csb, float *Y,
                                        int64_t ldy) {
    if (M <= 0 || N <= 0) return 0;
    if (K <= 0) {
        for (int64_t i = 0; i < M; i++) memset(Y + i * ldy, 0, sizeof(float) * (size_t)N);
        return 0;
    }
    return cuvil_bf16_gemm_into(M, N, K, A, rsa, csa, B, rsb, csb, Y, NULL, NULL, ldy, 0, 0.0f, 0.0f);
}

/* A forward convolution of bf16 operands on vdpbf16ps: per image and group, the im2col matrix is
 * built straight into the B panels (no float32 or bf16 copy of it), multiplied by the weights as
 * pairs, and each output tile gets its bias, is clamped to [lo, hi] and is rounded once to bf16.  Returns 0, or -1 when
 * out of memory. */
static CUVIL_UNUSED int cuvil_conv_bf16(const cuvil_conv_geom *g, const uint16_t *x, const uint16_t *w,
                                        const uint16_t *b, uint16_t *y, float lo, float hi) {
    const int nd = g->nsp;
    const int64_t cg = g->cin / g->group, mg = g->cout / g->group;
    const int64_t taps = cuvil_conv_prod(g->k, nd), P = cuvil_conv_prod(g->out, nd);
    const int64_t plane = cuvil_conv_prod(g->in, nd), K = cg * taps, KP = (K + 1) / 2, NP = (P + 15) / 16;
    if (P == 0 || mg == 0 || g->batch == 0) return 0;
    int direct = 1;
    for (int d = 0; d < nd; d++)
        if (g->k[d] != 1 || g->stride[d] != 1 || g->pad[d] != 0 || g->out[d] != g->in[d]) direct = 0;
    float *bown = NULL;
    const float *b32 = b ? cuvil_half_widened(1, b, g->cout, &bown) : NULL;
    if (b && !b32) return -1;
    if (K == 0) {
        for (int64_t n = 0; n < g->batch; n++)
            for (int64_t m = 0; m < g->cout; m++) {
                const uint16_t v = cuvil_f32_to_bf16(cuvil_clamp_nn_f(b32 ? b32[m] : 0.0f, lo, hi));
                for (int64_t i = 0; i < P; i++) y[(n * g->cout + m) * P + i] = v;
            }
        free(bown);
        return 0;
    }
    int64_t lda;
    uint32_t *aown;
    const cuvil_u32_a2 *ap = cuvil_bf16_pairs(w, g->cout, K, K, 1, &lda, &aown);
    uint32_t *bp = (uint32_t *)aligned_alloc(64, (cuvil_bf16_panel_bytes(KP, NP) + 63) / 64 * 64);
    int rc = ap && bp ? 0 : -1;
    for (int64_t n = 0; n < g->batch && rc == 0; n++)
        for (int64_t gi = 0; gi < g->group && rc == 0; gi++) {
            cuvil_bf16_pack_job pj = {K, P, KP, NP, 1, NULL, 0, 0, g, x + (n * g->cin + gi * cg) * plane, direct,
                                      NULL, bp};
            rc = cuvil_bf16_pack(&pj);
            if (rc != 0) break;
            cuvil_bf16_job j = {mg, P, KP, NP, ap + gi * mg * lda, lda, bp, NULL,
                                y + (n * g->cout + gi * mg) * P, b32 ? b32 + gi * mg : NULL, P, 0, 0, 0, NULL, 1, lo, hi};
            cuvil_bf16_gemm_run(&j);
        }
    free(bp);
    free(aown);
    free(bown);
    return rc;
}
#endif /* CUVIL_HAVE_BF16_DOT */

/* Max pools of halves (cuvil_pool.h): compared in float, since widening is exact; the max is one
 * of the inputs, so narrowing it back is exact too (a NaN stays a NaN). */
#include "cuvil_pool.h"
CUVIL_POOL_HALF_ROWS(f16, cuvil_f16)
CUVIL_POOL_HALF_ROWS(bf16, cuvil_bf16)
static inline int cuvil_pool_fast_f16(const cuvil_pool2d *g, const cuvil_f16 *x, cuvil_f16 *y) {
    return (void)g, (void)x, (void)y, 0;
}
static inline int cuvil_pool_fast_bf16(const cuvil_pool2d *g, const cuvil_bf16 *x, cuvil_bf16 *y) {
    return (void)g, (void)x, (void)y, 0;
}
CUVIL_DEFINE_MAXPOOL2D(f16, cuvil_f16, float, -INFINITY, CUVIL_PMAX_FLOAT)
CUVIL_DEFINE_MAXPOOL2D(bf16, cuvil_bf16, float, -INFINITY, CUVIL_PMAX_FLOAT)

#endif /* CUVIL_HALF_H */
