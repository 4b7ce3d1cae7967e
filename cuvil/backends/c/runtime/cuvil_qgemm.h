/* Cuvil's 8-bit integer arithmetic: the quantization step and the integer GEMM.
 *
 * Quantization (cuvil_quantize_f/_d): y = clamp(rint(q), lo - zp, hi - zp) + zp, rounding
 * half to even (the default rounding mode), NaN giving the zero point.  Clamping before the
 * zero point is added keeps every intermediate in range.
 *
 * The GEMM (cuvil_qgemm) computes, for a row operand R [M, K] and a column operand C [K, N] of
 * int8 or uint8 (any strides) with zero points zr (per row or one) and zc (per column or one),
 *   acc[i, j] = sum_k (R[i, k] - zr[i]) * (C[k, j] - zc[j])       in int32, wrapping,
 * then either stores acc, or adds an int32 bias and requantizes:
 *   y[i, j] = clamp(rint(float(acc + bias) * mult), lo - zp, hi - zp) + zp.
 * Matmul passes the activations as R and the weight as C (channels are columns); convolution
 * (cuvil_qconv.h) passes the weight as R and the im2col'ed input as C (channels are rows, the
 * output is NCHW).
 *
 * The product itself runs on the raw bytes, and the zero points come in afterwards:
 *   acc = P - ZC[j] * rowsum(R)[i] - zr[i] * colsum(C')[j] + K * zr[i] * ZC[j],
 * with P = sum_k R[i, k] * C'[k, j], C' = C + off and ZC = zc + off, all modulo 2^32, so it is
 * exact whatever the offset.  Operands are packed in 4-byte units along K, KU elements each:
 *   AVX-512 VNNI (KU = 4 bytes): vpdpbusd multiplies unsigned by signed bytes and adds groups of
 *     four into int32 lanes.  R keeps its type; C' is shifted by 128 when it has R's signedness
 *     (off = +128 turns int8 into uint8, -128 uint8 into int8), so one side is unsigned;
 *   AVX-512BW, AVX2 (KU = 2 int16): vpmaddwd multiplies int16 pairs and adds them into int32
 *     lanes, exactly (no saturation, unlike vpmaddubsw's int16 sums);
 *   portable C (generic, wasm32; KU = 2 int16): the same arithmetic in plain loops.
 * A panel holds MR rows of R (or NR columns of C) for the whole K; a register-blocked micro-kernel
 * multiplies one R panel by one C panel.  Constant operands (the weights) are packed once, with
 * their sums, into the model's constant cache; the others per call.  Work is split into blocks of
 * rows x one column panel across the call's threads; integer results do not depend on the split.
 */
#ifndef CUVIL_QGEMM_H
#define CUVIL_QGEMM_H

#include "cuvil_rt.h"
#include "cuvil_threads.h"

static inline int32_t cuvil_quantize_f(float q, int32_t zp, int32_t lo, int32_t hi) {
    float r = rintf(q);
    const float a = (float)(lo - zp), b = (float)(hi - zp);
    if (r != r) r = 0.0f;
    r = r < a ? a : (r > b ? b : r);
    return (int32_t)r + zp;
}

static inline int32_t cuvil_quantize_d(double q, int32_t zp, int32_t lo, int32_t hi) {
    double r = rint(q);
    const double a = (double)(lo - zp), b = (double)(hi - zp);
    if (r != r) r = 0.0;
    r = r < a ? a : (r > b ? b : r);
    return (int32_t)r + zp;
}

/* DynamicQuantizeLinear's scale and zero point: the range [min(0, min x), max(0, max x)] over
 * the non-NaN elements, in float32 arithmetic. */
static CUVIL_UNUSED void cuvil_dynamic_qparams(const float *x, int64_t n, float *scale, int32_t *zp) {
    float lo = 0.0f, hi = 0.0f;
    for (int64_t i = 0; i < n; i++) {
        const float v = x[i];
        if (v < lo) lo = v;
        if (v > hi) hi = v;
    }
    const float s = (hi == lo ? 1.0f : hi - lo) / 255.0f;
    float z = 0.0f - lo / s;
    z = z < 0.0f ? 0.0f : (z > 255.0f ? 255.0f : z);
    *scale = s;
    *zp = (int32_t)rintf(z);
}

/* ---- per-tensor runs: quantize, dequantize, quantized add ----------------------------------
 * The same arithmetic as cuvil_quantize_f and the scalar dequantization, on blocks of CUVIL_QRUN
 * elements: bytes are widened to float (or floats narrowed to bytes) in loops of their own, so
 * that each loop has one element type and compilers vectorize it (the division is IEEE, rintf is
 * vroundps/vrndscaleps); every element goes through the same operations in the same order as
 * the scalar code, so the results are identical. */
#define CUVIL_QRUN 256

static inline void cuvil_qrun_widen(const void *x, int is_signed, int64_t n, float *f) {
    if (is_signed) {
        const int8_t *s = (const int8_t *)x;
        for (int64_t i = 0; i < n; i++) f[i] = (float)s[i];
    } else {
        const uint8_t *u = (const uint8_t *)x;
        for (int64_t i = 0; i < n; i++) f[i] = (float)u[i];
    }
}

/* y[i] = cuvil_quantize_f(v[i] / s, zp, lo, hi) as bytes. */
static inline void cuvil_qrun_quantize(const float *v, int64_t n, float s, int32_t zp, int32_t lo, int32_t hi,
                                       void *y, int y_signed) {
    const float a = (float)(lo - zp), b = (float)(hi - zp);
    int32_t q[CUVIL_QRUN];
    for (int64_t i = 0; i < n; i++) {
        float r = rintf(v[i] / s);
        r = r != r ? 0.0f : r;
        r = r < a ? a : (r > b ? b : r);
        q[i] = (int32_t)r + zp;
    }
    if (y_signed) {
        int8_t *o = (int8_t *)y;
        for (int64_t i = 0; i < n; i++) o[i] = (int8_t)q[i];
    } else {
        uint8_t *o = (uint8_t *)y;
        for (int64_t i = 0; i < n; i++) o[i] = (uint8_t)q[i];
    }
}

/* quantize_linear of float32 x per tensor, dividing in float32. */
static CUVIL_UNUSED void cuvil_quantize_f32_run(const float *x, int64_t n, float s, int32_t zp, int32_t lo, int32_t hi,
                                                void *y, int y_signed) {
    for (int64_t i0 = 0; i0 < n; i0 += CUVIL_QRUN) {
        const int64_t m = n - i0 < CUVIL_QRUN ? n - i0 : CUVIL_QRUN;
        cuvil_qrun_quantize(x + i0, m, s, zp, lo, hi, (uint8_t *)y + i0, y_signed);
    }
}

/* dequantize_linear of 8-bit x per tensor to float32: y = ((float)x - (float)zp) * s. */
static CUVIL_UNUSED void cuvil_dequantize_f32_run(const void *x, int x_signed, int64_t n, float zp, float s, float *y) {
    for (int64_t i0 = 0; i0 < n; i0 += CUVIL_QRUN) {
        const int64_t m = n - i0 < CUVIL_QRUN ? n - i0 : CUVIL_QRUN;
        float f[CUVIL_QRUN];
        cuvil_qrun_widen((const uint8_t *)x + i0, x_signed, m, f);
        for (int64_t i = 0; i < m; i++) y[i0 + i] = (f[i] - zp) * s;
    }
}

/* qlinear_add (cuvil/ops/quant.py, rule 8): y = quantize(dequantize(a) + dequantize(b)) per tensor,
 * in float32, relu applied to the sum when asked (NaN stays NaN, then gives the zero point). */
typedef struct {
    const void *x;
    int is_signed;
    float zp, scale;
} cuvil_qadd_operand;

static CUVIL_UNUSED void cuvil_qadd(const cuvil_qadd_operand *a, const cuvil_qadd_operand *b, int64_t n, int relu,
                                    float ys, int32_t zp, int32_t lo, int32_t hi, void *y, int y_signed) {
    for (int64_t i0 = 0; i0 < n; i0 += CUVIL_QRUN) {
        const int64_t m = n - i0 < CUVIL_QRUN ? n - i0 : CUVIL_QRUN;
        float fa[CUVIL_QRUN], fb[CUVIL_QRUN];
        cuvil_qrun_widen((const uint8_t *)a->x + i0, a->is_signed, m, fa);
        cuvil_qrun_widen((const uint8_t *)b->x + i0, b->is_signed, m, fb);
        for (int64_t i = 0; i < m; i++) {
            /* one rounding per operation, as the reference: separate statements are never fused into an fma */
            const float da = (fa[i] - a->zp) * a->scale;
            const float db = (fb[i] - b->zp) * b->scale;
            const float v = da + db;
            fa[i] = relu && v < 0.0f ? 0.0f : v;
        }
        cuvil_qrun_quantize(fa, m, ys, zp, lo, hi, (uint8_t *)y + i0, y_signed);
    }
}

/* ---- the integer GEMM ------------------------------------------------------------------- */

#if (defined(__GNUC__) || defined(__clang__)) && defined(__AVX512BW__)
#include <immintrin.h>
#define CUVIL_QG_MR 8
#define CUVIL_QG_NR 32
#if defined(__AVX512VNNI__)
#define CUVIL_QG_KU 4
#define CUVIL_QG_ISA "avx512-vnni"
#else
#define CUVIL_QG_KU 2
#define CUVIL_QG_ISA "avx512bw"
#endif
#elif (defined(__GNUC__) || defined(__clang__)) && defined(__AVX2__)
#include <immintrin.h>
#define CUVIL_QG_MR 6
#define CUVIL_QG_NR 16
#define CUVIL_QG_KU 2
#define CUVIL_QG_ISA "avx2"
#else
#define CUVIL_QG_MR 4
#define CUVIL_QG_NR 8
#define CUVIL_QG_KU 2
#define CUVIL_QG_ISA "portable"
#endif

/* Below this many multiply-adds a product runs on one thread. */
#define CUVIL_QG_PAR_MIN ((int64_t)1 << 18)
/* Rows of R per task (a multiple of every MR above). */
#define CUVIL_QG_RB 96

/* An int8/uint8 matrix operand: element (a, b) at p[a * s0 + b * s1]; zero point zp[a or b * zstep]. */
typedef struct cuvil_qg_operand {
    const void *p;
    int64_t s0, s1;
    int is_signed;
    const int32_t *zp;
    int64_t zstep;
} cuvil_qg_operand;

/* What happens to acc: stored as int32 (y32), or requantized into yq (int8 when yq_signed). */
typedef struct cuvil_qg_output {
    int32_t *y32;
    void *yq;
    int yq_signed;
    int64_t ldy;
    const int32_t *bias; /* or NULL; bias[i * bias_rs + j * bias_cs] */
    int64_t bias_rs, bias_cs;
    const float *mult; /* mult[i * mult_rs + j * mult_cs] */
    int64_t mult_rs, mult_cs;
    int32_t zp, lo, hi;
} cuvil_qg_output;

static inline int64_t cuvil_qg_groups(int64_t K) { return (K + CUVIL_QG_KU - 1) / CUVIL_QG_KU; }

#if CUVIL_QG_KU == 4
typedef uint8_t cuvil_qg_elem; /* one element of a packed unit (its bits) */
#else
typedef uint16_t cuvil_qg_elem;
#endif

/* One panel of `width` (MR or NR) lines of an operand: line l is row a0 + l (R) or column a0 + l
 * (C); unit (g, l) at dst[g * width + l] holds elements g*KU .. g*KU+KU-1 along K plus `off`,
 * zero-filled past K and past `count` lines.  sums[l] = the sum of the line's elements plus off.
 * The loop nest walks the source along its unit stride (K for a row-major R, the lines for a
 * row-major C), and is instantiated per source type so the inner loop has no branch. */
#define CUVIL_QG_DEFINE_PACK(T, sfx)                                                                                  \
    static void cuvil_qg_pack_panel_##sfx(const T *src, int64_t sl, int64_t sk, int64_t count, int64_t K, int width, \
                                          int32_t off, cuvil_qg_elem *dst, int32_t *sums) {                        \
        const int64_t G = (K + CUVIL_QG_KU - 1) / CUVIL_QG_KU;                                                     \
        memset(dst, 0, sizeof(uint32_t) * (size_t)(G * width));                                                  \
        uint32_t acc[CUVIL_QG_NR] = {0};                                                                           \
        if (sk == 1 || sl != 1) {                                                                                  \
            for (int64_t l = 0; l < count; l++) {                                                                  \
                const T *line = src + l * sl;                                                                      \
                uint32_t sum = 0;                                                                                  \
                for (int64_t k = 0; k < K; k++) {                                                                  \
                    const int32_t v = (int32_t)line[k * sk] + off;                                                 \
                    sum += (uint32_t)v;                                                                            \
                    dst[((k / CUVIL_QG_KU) * width + l) * CUVIL_QG_KU + k % CUVIL_QG_KU] = (cuvil_qg_elem)v;       \
                }                                                                                                  \
                acc[l] = sum;                                                                                      \
            }                                                                                                      \
        } else {                                                                                                   \
            for (int64_t k = 0; k < K; k++) {                                                                      \
                const T *row = src + k * sk;                                                                       \
                cuvil_qg_elem *d = dst + (k / CUVIL_QG_KU) * width * CUVIL_QG_KU + k % CUVIL_QG_KU;                \
                for (int64_t l = 0; l < count; l++) {                                                              \
                    const int32_t v = (int32_t)row[l] + off;                                                       \
                    acc[l] += (uint32_t)v;                                                                         \
                    d[l * CUVIL_QG_KU] = (cuvil_qg_elem)v;                                                         \
                }                                                                                                  \
            }                                                                                                      \
        }                                                                                                          \
        for (int64_t l = 0; l < count; l++) sums[l] = (int32_t)acc[l];                                             \
    }
CUVIL_QG_DEFINE_PACK(int8_t, s8)
CUVIL_QG_DEFINE_PACK(uint8_t, u8)

static void cuvil_qg_pack_panel(const cuvil_qg_operand *op, int is_c, int64_t a0, int64_t count, int64_t K,
                                int width, int32_t off, uint32_t *dst, int32_t *sums) {
    const int64_t sl = is_c ? op->s1 : op->s0, sk = is_c ? op->s0 : op->s1;
    if (op->is_signed)
        cuvil_qg_pack_panel_s8((const int8_t *)op->p + a0 * sl, sl, sk, count, K, width, off, (cuvil_qg_elem *)dst, sums);
    else
        cuvil_qg_pack_panel_u8((const uint8_t *)op->p + a0 * sl, sl, sk, count, K, width, off, (cuvil_qg_elem *)dst,
                               sums);
}

/* The whole packed operand: panels, then one sum per line (rows of R, columns of C). */
typedef struct cuvil_qg_pack_args {
    cuvil_qg_operand op;
    int is_c;
    int64_t lines, K;
    int32_t off;
} cuvil_qg_pack_args;

static inline int64_t cuvil_qg_width(int is_c) { return is_c ? CUVIL_QG_NR : CUVIL_QG_MR; }
static inline int64_t cuvil_qg_panels(const cuvil_qg_pack_args *a) {
    const int64_t w = cuvil_qg_width(a->is_c);
    return (a->lines + w - 1) / w;
}
static inline size_t cuvil_qg_packed_units(const cuvil_qg_pack_args *a) {
    return (size_t)(cuvil_qg_panels(a) * cuvil_qg_width(a->is_c) * cuvil_qg_groups(a->K) + a->lines);
}

static void cuvil_qg_pack_task(void *ctx, int64_t panel, int tid) {
    (void)tid;
    const cuvil_qg_pack_args *a = (const cuvil_qg_pack_args *)((void **)ctx)[0];
    uint32_t *dst = (uint32_t *)((void **)ctx)[1];
    const int64_t w = cuvil_qg_width(a->is_c), G = cuvil_qg_groups(a->K);
    int32_t *sums = (int32_t *)(dst + cuvil_qg_panels(a) * w * G);
    const int64_t a0 = panel * w, count = a->lines - a0 < w ? a->lines - a0 : w;
    cuvil_qg_pack_panel(&a->op, a->is_c, a0, count, a->K, (int)w, a->off, dst + panel * w * G, sums + a0);
}

static void cuvil_qg_pack_all(void *dst, const void *arg) {
    const cuvil_qg_pack_args *a = (const cuvil_qg_pack_args *)arg;
    void *ctx[2] = {(void *)a, dst};
    for (int64_t p = 0; p < cuvil_qg_panels(a); p++) cuvil_qg_pack_task(ctx, p, 0);
}

/* The packed operand: from the constant cache when it lies in the weights, else packed into
 * *owned (freed by the caller).  NULL when out of memory. */
static const uint32_t *cuvil_qg_packed(const cuvil_qg_pack_args *a, int64_t work, uint32_t **owned) {
    *owned = NULL;
    const int64_t sl = a->is_c ? a->op.s1 : a->op.s0, sk = a->is_c ? a->op.s0 : a->op.s1;
    const size_t bytes = cuvil_qg_packed_units(a) * sizeof(uint32_t);
    if (sl >= 0 && sk >= 0 && a->lines > 0 && a->K > 0) {
        const size_t extent = (size_t)((a->lines - 1) * sl + (a->K - 1) * sk) + 1;
        if (cuvil_is_constant(a->op.p, extent)) {
            const int64_t key[CUVIL_CACHE_KEY] = {0x5147454d00 + a->is_c, a->lines, a->K, a->op.s0, a->op.s1,
                                                  a->op.is_signed, a->off, CUVIL_QG_KU * 65536 + cuvil_qg_width(a->is_c)};
            const void *c = cuvil_cache_get(a->op.p, key, bytes, cuvil_qg_pack_all, a);
            if (c) return (const uint32_t *)c;
        }
    }
    *owned = (uint32_t *)aligned_alloc(CUVIL_ALIGN, (bytes + CUVIL_ALIGN - 1) / CUVIL_ALIGN * CUVIL_ALIGN);
    if (!*owned) return NULL;
    void *ctx[2] = {(void *)a, *owned};
    if (work >= CUVIL_QG_PAR_MIN)
        cuvil_parallel_for(cuvil_qg_panels(a), cuvil_qg_pack_task, ctx);
    else
        for (int64_t p = 0; p < cuvil_qg_panels(a); p++) cuvil_qg_pack_task(ctx, p, 0);
    return *owned;
}

/* ---- micro-kernels: tile[r * NR + c] = sum over the K groups of R unit (g, r) . C unit (g, c) */

#if CUVIL_QG_KU == 4 || defined(__AVX512BW__)
/* AVX-512: two 16-lane vectors per C group; `rows` is a constant after inlining. */
static inline __attribute__((always_inline)) void cuvil_qg_micro_n(int rows, int r_unsigned, int64_t G,
                                                                   const uint32_t *rp, const uint32_t *cp,
                                                                   int32_t *tile) {
    __m512i acc[CUVIL_QG_MR][2];
#pragma GCC unroll 8
    for (int r = 0; r < rows; r++) acc[r][0] = acc[r][1] = _mm512_setzero_si512();
    for (int64_t g = 0; g < G; g++) {
        const __m512i c0 = _mm512_loadu_si512((const void *)(cp + g * CUVIL_QG_NR));
        const __m512i c1 = _mm512_loadu_si512((const void *)(cp + g * CUVIL_QG_NR + 16));
#pragma GCC unroll 8
        for (int r = 0; r < rows; r++) {
            const __m512i b = _mm512_set1_epi32((int)rp[g * CUVIL_QG_MR + r]);
#if CUVIL_QG_KU == 4
            if (r_unsigned) {
                acc[r][0] = _mm512_dpbusd_epi32(acc[r][0], b, c0);
                acc[r][1] = _mm512_dpbusd_epi32(acc[r][1], b, c1);
            } else {
                acc[r][0] = _mm512_dpbusd_epi32(acc[r][0], c0, b);
                acc[r][1] = _mm512_dpbusd_epi32(acc[r][1], c1, b);
            }
#else
            (void)r_unsigned;
            acc[r][0] = _mm512_add_epi32(acc[r][0], _mm512_madd_epi16(b, c0));
            acc[r][1] = _mm512_add_epi32(acc[r][1], _mm512_madd_epi16(b, c1));
#endif
        }
    }
#pragma GCC unroll 8
    for (int r = 0; r < rows; r++) {
        _mm512_storeu_si512((void *)(tile + r * CUVIL_QG_NR), acc[r][0]);
        _mm512_storeu_si512((void *)(tile + r * CUVIL_QG_NR + 16), acc[r][1]);
    }
}
#elif defined(__AVX2__)
static inline __attribute__((always_inline)) void cuvil_qg_micro_n(int rows, int r_unsigned, int64_t G,
                                                                   const uint32_t *rp, const uint32_t *cp,
                                                                   int32_t *tile) {
    (void)r_unsigned;
    __m256i acc[CUVIL_QG_MR][2];
#pragma GCC unroll 8
    for (int r = 0; r < rows; r++) acc[r][0] = acc[r][1] = _mm256_setzero_si256();
    for (int64_t g = 0; g < G; g++) {
        const __m256i c0 = _mm256_loadu_si256((const __m256i *)(cp + g * CUVIL_QG_NR));
        const __m256i c1 = _mm256_loadu_si256((const __m256i *)(cp + g * CUVIL_QG_NR + 8));
#pragma GCC unroll 8
        for (int r = 0; r < rows; r++) {
            const __m256i b = _mm256_set1_epi32((int)rp[g * CUVIL_QG_MR + r]);
            acc[r][0] = _mm256_add_epi32(acc[r][0], _mm256_madd_epi16(b, c0));
            acc[r][1] = _mm256_add_epi32(acc[r][1], _mm256_madd_epi16(b, c1));
        }
    }
#pragma GCC unroll 8
    for (int r = 0; r < rows; r++) {
        _mm256_storeu_si256((__m256i *)(tile + r * CUVIL_QG_NR), acc[r][0]);
        _mm256_storeu_si256((__m256i *)(tile + r * CUVIL_QG_NR + 8), acc[r][1]);
    }
}
#else
static inline void cuvil_qg_micro_n(int rows, int r_unsigned, int64_t G, const uint32_t *rp, const uint32_t *cp,
                                    int32_t *tile) {
    (void)r_unsigned;
    uint32_t acc[CUVIL_QG_MR][CUVIL_QG_NR] = {{0}};
    for (int64_t g = 0; g < G; g++) {
        for (int r = 0; r < rows; r++) {
            const uint32_t ru = rp[g * CUVIL_QG_MR + r];
            const int32_t a0 = (int16_t)(ru & 0xffffu), a1 = (int16_t)(ru >> 16);
            for (int c = 0; c < CUVIL_QG_NR; c++) {
                const uint32_t cu = cp[g * CUVIL_QG_NR + c];
                acc[r][c] += (uint32_t)(a0 * (int16_t)(cu & 0xffffu) + a1 * (int16_t)(cu >> 16));
            }
        }
    }
    for (int r = 0; r < rows; r++)
        for (int c = 0; c < CUVIL_QG_NR; c++) tile[r * CUVIL_QG_NR + c] = (int32_t)acc[r][c];
}
#endif

static void cuvil_qg_micro(int rows, int r_unsigned, int64_t G, const uint32_t *rp, const uint32_t *cp,
                           int32_t *tile) {
#define CUVIL_QG_CASE(n)                                                    \
    case n:                                                                 \
        if (r_unsigned)                                                     \
            cuvil_qg_micro_n(n, 1, G, rp, cp, tile);                        \
        else                                                                \
            cuvil_qg_micro_n(n, 0, G, rp, cp, tile);                        \
        break;
    switch (rows) {
        CUVIL_QG_CASE(1)
        CUVIL_QG_CASE(2)
        CUVIL_QG_CASE(3)
#if CUVIL_QG_MR > 4
        CUVIL_QG_CASE(4)
        CUVIL_QG_CASE(5)
#endif
#if CUVIL_QG_MR > 6
        CUVIL_QG_CASE(6)
        CUVIL_QG_CASE(7)
#endif
    default:
        if (r_unsigned)
            cuvil_qg_micro_n(CUVIL_QG_MR, 1, G, rp, cp, tile);
        else
            cuvil_qg_micro_n(CUVIL_QG_MR, 0, G, rp, cp, tile);
    }
#undef CUVIL_QG_CASE
}

/* ---- the product ------------------------------------------------------------------------ */

typedef struct cuvil_qg_job {
    int64_t M, N, K, G;
    const uint32_t *Rp, *Cp;      /* packed operands */
    const int32_t *rsum, *csum;   /* their sums */
    const cuvil_qg_operand *R, *C;
    int32_t off;
    int r_unsigned;
    const cuvil_qg_output *out;
    int64_t nrb, ncp;             /* row blocks, column panels */
} cuvil_qg_job;

/* The zero-point corrections, bias and store of one tile (rows i0.., columns j0..): per row, the
 * int32 results into a row buffer, then the store or the requantization as separate loops (which
 * compilers vectorize: rintf is vroundps). */
static void cuvil_qg_epilogue(const cuvil_qg_job *g, const int32_t *tile, int64_t i0, int mr, int64_t j0, int nr) {
    const cuvil_qg_output *o = g->out;
    uint32_t zc[CUVIL_QG_NR], cs[CUVIL_QG_NR];
    for (int c = 0; c < nr; c++) {
        zc[c] = (uint32_t)g->C->zp[(j0 + c) * g->C->zstep] + (uint32_t)g->off;
        cs[c] = (uint32_t)g->csum[j0 + c];
    }
    for (int r = 0; r < mr; r++) {
        const int64_t i = i0 + r;
        const uint32_t zr = (uint32_t)g->R->zp[i * g->R->zstep], rs = (uint32_t)g->rsum[i], kz = (uint32_t)g->K * zr;
        int32_t v[CUVIL_QG_NR];
        const int32_t *t = tile + r * CUVIL_QG_NR;
        for (int c = 0; c < nr; c++) v[c] = (int32_t)((uint32_t)t[c] - zc[c] * rs - zr * cs[c] + kz * zc[c]);
        if (o->bias) {
            const int32_t *b = o->bias + i * o->bias_rs + j0 * o->bias_cs;
            for (int c = 0; c < nr; c++) v[c] = (int32_t)((uint32_t)v[c] + (uint32_t)b[c * o->bias_cs]);
        }
        if (o->y32) {
            memcpy(o->y32 + i * o->ldy + j0, v, sizeof(int32_t) * (size_t)nr);
            continue;
        }
        const float *m = o->mult + i * o->mult_rs + j0 * o->mult_cs;
        const float lo = (float)(o->lo - o->zp), hi = (float)(o->hi - o->zp);
        int32_t q[CUVIL_QG_NR];
        for (int c = 0; c < nr; c++) {
            float f = rintf((float)v[c] * m[c * o->mult_cs]);
            f = f != f ? 0.0f : f; /* NaN (an infinite or NaN multiplier) gives the zero point */
            f = f < lo ? lo : (f > hi ? hi : f);
            q[c] = (int32_t)f + o->zp;
        }
        if (o->yq_signed) {
            int8_t *y = (int8_t *)o->yq + i * o->ldy + j0;
            for (int c = 0; c < nr; c++) y[c] = (int8_t)q[c];
        } else {
            uint8_t *y = (uint8_t *)o->yq + i * o->ldy + j0;
            for (int c = 0; c < nr; c++) y[c] = (uint8_t)q[c];
        }
    }
}

static void cuvil_qg_task(void *ctx, int64_t task, int tid) {
    (void)tid;
    const cuvil_qg_job *g = (const cuvil_qg_job *)ctx;
    const int64_t rb = task / g->ncp, cpn = task % g->ncp;
    const int64_t j0 = cpn * CUVIL_QG_NR;
    const int nr = (int)(g->N - j0 < CUVIL_QG_NR ? g->N - j0 : CUVIL_QG_NR);
    const uint32_t *cp = g->Cp + cpn * CUVIL_QG_NR * g->G;
    int32_t tile[CUVIL_QG_MR * CUVIL_QG_NR] __attribute__((aligned(64)));
    const int64_t iend = (rb + 1) * CUVIL_QG_RB < g->M ? (rb + 1) * CUVIL_QG_RB : g->M;
    for (int64_t i0 = rb * CUVIL_QG_RB; i0 < iend; i0 += CUVIL_QG_MR) {
        const int mr = (int)(iend - i0 < CUVIL_QG_MR ? iend - i0 : CUVIL_QG_MR);
        cuvil_qg_micro(mr, g->r_unsigned, g->G, g->Rp + i0 / CUVIL_QG_MR * CUVIL_QG_MR * g->G, cp, tile);
        cuvil_qg_epilogue(g, tile, i0, mr, j0, nr);
    }
}

/* The product described at the top of this file.  Returns 0, or -1 when memory cannot be had. */
static CUVIL_UNUSED int cuvil_qgemm(int64_t M, int64_t N, int64_t K, const cuvil_qg_operand *R,
                                    const cuvil_qg_operand *C, const cuvil_qg_output *out) {
    if (M <= 0 || N <= 0) return 0;
    if (K <= 0) { /* empty sums: acc is the bias (or 0) */
        for (int64_t i = 0; i < M; i++)
            for (int64_t j = 0; j < N; j++) {
                const int32_t v = out->bias ? out->bias[i * out->bias_rs + j * out->bias_cs] : 0;
                if (out->y32) {
                    out->y32[i * out->ldy + j] = v;
                    continue;
                }
                const int32_t q = cuvil_quantize_f((float)v * out->mult[i * out->mult_rs + j * out->mult_cs], out->zp,
                                                   out->lo, out->hi);
                if (out->yq_signed)
                    ((int8_t *)out->yq)[i * out->ldy + j] = (int8_t)q;
                else
                    ((uint8_t *)out->yq)[i * out->ldy + j] = (uint8_t)q;
            }
        return 0;
    }
    const int64_t work = M * N * K;
    /* VNNI needs one unsigned side: C is shifted when it has R's signedness. */
    const int32_t off = CUVIL_QG_KU == 4 && R->is_signed == C->is_signed ? (C->is_signed ? 128 : -128) : 0;
    const cuvil_qg_pack_args ra = {*R, 0, M, K, 0}, ca = {*C, 1, N, K, off};
    uint32_t *rown = NULL, *cown = NULL;
    const uint32_t *Rp = cuvil_qg_packed(&ra, work, &rown);
    const uint32_t *Cp = Rp ? cuvil_qg_packed(&ca, work, &cown) : NULL;
    if (!Rp || !Cp) {
        free(rown);
        free(cown);
        return -1;
    }
    const int64_t G = cuvil_qg_groups(K);
    cuvil_qg_job g;
    g.M = M, g.N = N, g.K = K, g.G = G, g.Rp = Rp, g.Cp = Cp;
    g.rsum = (const int32_t *)(Rp + cuvil_qg_panels(&ra) * CUVIL_QG_MR * G);
    g.csum = (const int32_t *)(Cp + cuvil_qg_panels(&ca) * CUVIL_QG_NR * G);
    g.R = R, g.C = C, g.off = off, g.r_unsigned = !R->is_signed, g.out = out;
    g.nrb = (M + CUVIL_QG_RB - 1) / CUVIL_QG_RB, g.ncp = (N + CUVIL_QG_NR - 1) / CUVIL_QG_NR;
    if (work >= CUVIL_QG_PAR_MIN)
        cuvil_parallel_for(g.nrb * g.ncp, cuvil_qg_task, &g);
    else
        for (int64_t t = 0; t < g.nrb * g.ncp; t++) cuvil_qg_task(&g, t, 0);
    free(rown);
    free(cown);
    return 0;
}

#endif /* CUVIL_QGEMM_H */
