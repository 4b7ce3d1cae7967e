/* Cuvil's 8-bit integer GEMM (the quantization step itself is cuvil_qrun.h's).
 *
 * The GEMM (cuvil_qgemm) computes, for a row operand R [M, K] and a column operand C [K, N] of
 * int8 or uint8 (any strides) with zero points zr (per row or one) and zc (per column or one),
 *   acc[i, j] = sum_k (R[i, k] - zr[i]) * (C[k, j] - zc[j])       in int32, wrapping,
 * then either stores acc, or adds an int32 bias and requantizes:
 *   y[i, j] = clamp(rint(float(acc + bias) * mult), lo - zp, hi - zp) + zp,
 * or adds the bias and dequantizes to float32: y[i, j] = float(acc + bias) * mult.
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
 *   AVX2, one operand a constant whose bytes lie in [-64, 64] (7-bit weights; KU = 4 bytes, the
 *     byte path, CUVIL_QG_BYTES): vpmaddubsw, exact for such bytes, then vpmaddwd against ones.
 *     The narrow side is the signed one; the other is shifted to unsigned (off, or roff for R);
 *   portable C (generic, wasm32; KU = 2 int16): the same arithmetic in plain loops.
 * A panel holds MR rows of R (or NR columns of C) for the whole K; a register-blocked micro-kernel
 * multiplies one R panel by one C panel.  Constant operands (the weights) are packed once, with
 * their sums, into the model's constant cache; the others per call.  Work is split into blocks of
 * rows x one column panel across the call's threads; integer results do not depend on the split.
 * With AVX-512 (AVX2) the zero-point corrections and the requantization of a tile run on 16-lane
 * (two 8-lane) vectors (cuvil_qg_epilogue_v, cuvil_qreq16, cuvil_qreq16_avx2) with the scalar
 * code's exact results; on AVX2, when the zero points are uniform (symmetric weights) the
 * corrections are one precomputed term per row and one per column (cuvil_qg_separable).
 */
#ifndef CUVIL_QGEMM_H
#define CUVIL_QGEMM_H

#include "cuvil_qrun.h"
#include "cuvil_rt.h"
#include "cuvil_threads.h"

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

/* AVX2 without VNNI also has a byte path (KU = 4 bytes): vpmaddubsw multiplies unsigned by signed
 * bytes and adds pairs into int16 lanes, saturating; when the signed side's bytes all lie in
 * [-64, 64] no pair sum can reach int16's limits (2 * 255 * 64 = 32640), so the path is exact.  A
 * GEMM takes it when one operand is such a constant (cuvil_qg_narrow: 7-bit weights). */
#if CUVIL_QG_KU == 2 && defined(__AVX2__) && !defined(__AVX512BW__)
#define CUVIL_QG_BYTES 1
#else
#define CUVIL_QG_BYTES 0
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

/* What happens to acc: stored as int32 (y32), dequantized into yf, or requantized into yq (int8
 * when yq_signed); exactly one of the three is set. */
typedef struct cuvil_qg_output {
    int32_t *y32;
    float *yf;
    void *yq;
    int yq_signed;
    int64_t ldy;
    const int32_t *bias; /* or NULL; bias[i * bias_rs + j * bias_cs] */
    int64_t bias_rs, bias_cs;
    const float *mult; /* mult[i * mult_rs + j * mult_cs] */
    int64_t mult_rs, mult_cs;
    int32_t zp, lo, hi;
} cuvil_qg_output;

static inline int64_t cuvil_qg_groups(int64_t K, int ku) { return (K + ku - 1) / ku; }

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
#define CUVIL_QG_DEFINE_PACK(T, sfx, KU, E)                                                                            \
    static void cuvil_qg_pack_panel_##sfx(const T *src, int64_t sl, int64_t sk, int64_t count, int64_t K, int width,   \
                                          int32_t off, E *dst, int32_t *sums) {                                        \
        const int64_t G = (K + KU - 1) / KU;                                                                           \
        memset(dst, 0, sizeof(uint32_t) * (size_t)(G * width));                                                        \
        uint32_t acc[CUVIL_QG_NR] = {0};                                                                               \
        if (sk == 1 || sl != 1) {                                                                                      \
            for (int64_t l = 0; l < count; l++) {                                                                      \
                const T *line = src + l * sl;                                                                          \
                uint32_t sum = 0;                                                                                      \
                for (int64_t k = 0; k < K; k++) {                                                                      \
                    const int32_t v = (int32_t)line[k * sk] + off;                                                     \
                    sum += (uint32_t)v;                                                                                \
                    dst[((k / KU) * width + l) * KU + k % KU] = (E)v;                                                  \
                }                                                                                                      \
                acc[l] = sum;                                                                                          \
            }                                                                                                          \
        } else {                                                                                                       \
            for (int64_t k = 0; k < K; k++) {                                                                          \
                const T *row = src + k * sk;                                                                           \
                E *d = dst + (k / KU) * width * KU + k % KU;                                                           \
                for (int64_t l = 0; l < count; l++) {                                                                  \
                    const int32_t v = (int32_t)row[l] + off;                                                           \
                    acc[l] += (uint32_t)v;                                                                             \
                    d[l * KU] = (E)v;                                                                                  \
                }                                                                                                      \
            }                                                                                                          \
        }                                                                                                              \
        for (int64_t l = 0; l < count; l++) sums[l] = (int32_t)acc[l];                                                 \
    }
CUVIL_QG_DEFINE_PACK(int8_t, s8, CUVIL_QG_KU, cuvil_qg_elem)
CUVIL_QG_DEFINE_PACK(uint8_t, u8, CUVIL_QG_KU, cuvil_qg_elem)
#if CUVIL_QG_BYTES
CUVIL_QG_DEFINE_PACK(int8_t, s8b, 4, uint8_t)
CUVIL_QG_DEFINE_PACK(uint8_t, u8b, 4, uint8_t)
#endif

#if CUVIL_QG_KU == 4 && CUVIL_QG_NR == 32
/* The VNNI panel of 32 lines that lie side by side (unit stride across lines, sk between the K
 * positions: a row-major C, the columns of a convolution), 4 rows of 32 bytes at a time: adding
 * off = +-128 to a byte is flipping its top bit, and two rounds of byte and word unpacks make the
 * 4-byte units (within 128-bit lanes, so the four results hold units 0-3|16-19, 4-7|20-23, ...;
 * the lane permutes put them in order).  The line sums come from vpdpbusd against ones, the
 * units read unsigned (C' unsigned) or signed (C' signed), as the product reads them.  Lines past
 * `count` and rows past K are zero, as the scalar packing leaves them. */
static void cuvil_qg_pack_c_vnni(const uint8_t *src, int64_t sk, int64_t count, int64_t K, int32_t off,
                                 int c_signed, uint8_t *dst, int32_t *sums) {
    const __mmask32 km = count >= 32 ? (__mmask32)0xffffffffu : (__mmask32)((1u << count) - 1u);
    const __m256i flip = _mm256_set1_epi8(off ? (char)0x80 : 0);
    const __m512i ones = _mm512_set1_epi8(1);
    __m512i s0 = _mm512_setzero_si512(), s1 = _mm512_setzero_si512();
    for (int64_t k0 = 0; k0 < K; k0 += 4) {
        __m256i r[4];
        for (int kk = 0; kk < 4; kk++)
            r[kk] = k0 + kk < K ? _mm256_maskz_mov_epi8(km, _mm256_xor_si256(_mm256_maskz_loadu_epi8(km, src + (k0 + kk) * sk), flip))
                                : _mm256_setzero_si256();
        const __m256i t01l = _mm256_unpacklo_epi8(r[0], r[1]), t01h = _mm256_unpackhi_epi8(r[0], r[1]);
        const __m256i t23l = _mm256_unpacklo_epi8(r[2], r[3]), t23h = _mm256_unpackhi_epi8(r[2], r[3]);
        const __m256i a = _mm256_unpacklo_epi16(t01l, t23l), b = _mm256_unpackhi_epi16(t01l, t23l);
        const __m256i c = _mm256_unpacklo_epi16(t01h, t23h), d = _mm256_unpackhi_epi16(t01h, t23h);
        const __m512i lo = _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_permute2x128_si256(a, b, 0x20)),
                                              _mm256_permute2x128_si256(c, d, 0x20), 1);
        const __m512i hi = _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_permute2x128_si256(a, b, 0x31)),
                                              _mm256_permute2x128_si256(c, d, 0x31), 1);
        uint8_t *o = dst + k0 / 4 * 128;
        _mm512_storeu_si512((void *)o, lo);
        _mm512_storeu_si512((void *)(o + 64), hi);
        if (c_signed) {
            s0 = _mm512_dpbusd_epi32(s0, ones, lo);
            s1 = _mm512_dpbusd_epi32(s1, ones, hi);
        } else {
            s0 = _mm512_dpbusd_epi32(s0, lo, ones);
            s1 = _mm512_dpbusd_epi32(s1, hi, ones);
        }
    }
    int32_t all[32];
    _mm512_storeu_si512((void *)all, s0);
    _mm512_storeu_si512((void *)(all + 16), s1);
    memcpy(sums, all, sizeof(int32_t) * (size_t)count);
}
#endif

#if CUVIL_QG_BYTES
/* The byte path's panel of 16 columns that lie side by side (a row-major C: the columns of a
 * convolution), read unsigned (C' = C + off with off = 0 for uint8, +128 for int8: flipping the top
 * bit), 4 rows of 16 bytes at a time: two rounds of byte and word unpacks make the 4-byte units in
 * column order.  The column sums come from vpmaddubsw and vpmaddwd against ones.  Rows past K are
 * zero, as the scalar packing leaves them. */
static void cuvil_qg_pack_c_b16(const uint8_t *src, int64_t sk, int64_t K, int32_t off, uint8_t *dst, int32_t *sums) {
    const __m128i flip = _mm_set1_epi8(off ? (char)0x80 : 0), ones8 = _mm_set1_epi8(1), ones16 = _mm_set1_epi16(1);
    __m128i s[4] = {_mm_setzero_si128(), _mm_setzero_si128(), _mm_setzero_si128(), _mm_setzero_si128()};
    for (int64_t k0 = 0; k0 < K; k0 += 4) {
        __m128i r[4];
        for (int kk = 0; kk < 4; kk++)
            r[kk] = k0 + kk < K ? _mm_xor_si128(_mm_loadu_si128((const __m128i *)(src + (k0 + kk) * sk)), flip)
                                : _mm_setzero_si128();
        const __m128i t01l = _mm_unpacklo_epi8(r[0], r[1]), t01h = _mm_unpackhi_epi8(r[0], r[1]);
        const __m128i t23l = _mm_unpacklo_epi8(r[2], r[3]), t23h = _mm_unpackhi_epi8(r[2], r[3]);
        const __m128i u[4] = {_mm_unpacklo_epi16(t01l, t23l), _mm_unpackhi_epi16(t01l, t23l),
                              _mm_unpacklo_epi16(t01h, t23h), _mm_unpackhi_epi16(t01h, t23h)};
        uint8_t *o = dst + k0 / 4 * 64;
        for (int q = 0; q < 4; q++) {
            _mm_storeu_si128((__m128i *)(o + 16 * q), u[q]);
            s[q] = _mm_add_epi32(s[q], _mm_madd_epi16(_mm_maddubs_epi16(u[q], ones8), ones16));
        }
    }
    for (int q = 0; q < 4; q++) _mm_storeu_si128((__m128i *)(sums + 4 * q), s[q]);
}
#endif

static void cuvil_qg_pack_panel(const cuvil_qg_operand *op, int is_c, int64_t a0, int64_t count, int64_t K,
                                int width, int32_t off, int ku, uint32_t *dst, int32_t *sums) {
    const int64_t sl = is_c ? op->s1 : op->s0, sk = is_c ? op->s0 : op->s1;
#if CUVIL_QG_BYTES
    if (ku == 4) {
        if (is_c && sl == 1 && sk != 1 && width == 16 && count == 16 && (!op->is_signed || off == 128)) {
            cuvil_qg_pack_c_b16((const uint8_t *)op->p + a0, sk, K, off, (uint8_t *)dst, sums);
            return;
        }
        if (op->is_signed)
            cuvil_qg_pack_panel_s8b((const int8_t *)op->p + a0 * sl, sl, sk, count, K, width, off, (uint8_t *)dst, sums);
        else
            cuvil_qg_pack_panel_u8b((const uint8_t *)op->p + a0 * sl, sl, sk, count, K, width, off, (uint8_t *)dst,
                                    sums);
        return;
    }
#endif
    (void)ku;
#if CUVIL_QG_KU == 4 && CUVIL_QG_NR == 32
    if (sl == 1 && sk != 1 && width == 32) {
        const int c_signed = off ? off < 0 : op->is_signed;
        cuvil_qg_pack_c_vnni((const uint8_t *)op->p + a0, sk, count, K, off, c_signed, (uint8_t *)dst, sums);
        return;
    }
#endif
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
    int ku; /* elements per 4-byte unit: CUVIL_QG_KU, or 4 on the byte path */
} cuvil_qg_pack_args;

static inline int64_t cuvil_qg_width(int is_c) { return is_c ? CUVIL_QG_NR : CUVIL_QG_MR; }
static inline int64_t cuvil_qg_panels(const cuvil_qg_pack_args *a) {
    const int64_t w = cuvil_qg_width(a->is_c);
    return (a->lines + w - 1) / w;
}
static inline size_t cuvil_qg_packed_units(const cuvil_qg_pack_args *a) {
    return (size_t)(cuvil_qg_panels(a) * cuvil_qg_width(a->is_c) * cuvil_qg_groups(a->K, a->ku) + a->lines);
}

static void cuvil_qg_pack_task(void *ctx, int64_t panel, int tid) {
    (void)tid;
    const cuvil_qg_pack_args *a = (const cuvil_qg_pack_args *)((void **)ctx)[0];
    uint32_t *dst = (uint32_t *)((void **)ctx)[1];
    const int64_t w = cuvil_qg_width(a->is_c), G = cuvil_qg_groups(a->K, a->ku);
    int32_t *sums = (int32_t *)(dst + cuvil_qg_panels(a) * w * G);
    const int64_t a0 = panel * w, count = a->lines - a0 < w ? a->lines - a0 : w;
    cuvil_qg_pack_panel(&a->op, a->is_c, a0, count, a->K, (int)w, a->off, a->ku, dst + panel * w * G, sums + a0);
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
                                                  a->op.is_signed, a->off, a->ku * 65536 + cuvil_qg_width(a->is_c)};
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

/* ---- requantization of 16 lanes (AVX-512) -------------------------------------------------
 * cuvil_quantize_f's arithmetic lane by lane, with the same results: (float)v (vcvtdq2ps rounds to
 * nearest as the C conversion does), one multiply (never fused: -ffp-contract=off), NaN to 0, the
 * clamp to [lo - zp, hi - zp] (min then max, which equals the scalar comparisons once NaN is gone),
 * and the rounding to an integer by vcvtps2dq in the current rounding mode, as rintf rounds.
 * Clamping before rounding gives what rounding before clamping gives, since both bounds are
 * integers and rounding is monotonic.  `nan` is 0 when no multiplier can make a NaN (all finite:
 * a finite product of a finite float); then the NaN test is skipped. */
#if defined(__AVX512BW__)
static inline __m128i cuvil_qreq16(__m512i v, __m512 m, __m512 lo, __m512 hi, __m512i zp, int nan) {
    __m512 f = _mm512_mul_ps(_mm512_cvtepi32_ps(v), m);
    if (nan) f = _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(f, f, _CMP_ORD_Q), f);
    f = _mm512_max_ps(_mm512_min_ps(f, hi), lo);
    return _mm512_cvtepi32_epi8(_mm512_add_epi32(_mm512_cvtps_epi32(f), zp));
}

static inline __mmask16 cuvil_qmask16(int64_t n) { return n >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << n) - 1u); }
#elif defined(__AVX2__)
/* The same arithmetic on 16 lanes held in two 8-lane vectors (AVX2), narrowed to 16 bytes in order:
 * vpackssdw (the lanes are within [lo, hi] plus zp, so nothing saturates) interleaves the two
 * vectors' 128-bit halves, vpermq undoes that, and vpacksswb / vpackuswb make the bytes. */
static inline __m128i cuvil_qreq16_avx2(__m256i v0, __m256i v1, __m256 m0, __m256 m1, __m256 lo, __m256 hi,
                                        __m256i zp, int nan, int out_signed) {
    __m256 f0 = _mm256_mul_ps(_mm256_cvtepi32_ps(v0), m0), f1 = _mm256_mul_ps(_mm256_cvtepi32_ps(v1), m1);
    if (nan) {
        f0 = _mm256_and_ps(f0, _mm256_cmp_ps(f0, f0, _CMP_ORD_Q));
        f1 = _mm256_and_ps(f1, _mm256_cmp_ps(f1, f1, _CMP_ORD_Q));
    }
    f0 = _mm256_max_ps(_mm256_min_ps(f0, hi), lo);
    f1 = _mm256_max_ps(_mm256_min_ps(f1, hi), lo);
    const __m256i q0 = _mm256_add_epi32(_mm256_cvtps_epi32(f0), zp), q1 = _mm256_add_epi32(_mm256_cvtps_epi32(f1), zp);
    const __m256i w = _mm256_permute4x64_epi64(_mm256_packs_epi32(q0, q1), 0xD8);
    const __m128i wl = _mm256_castsi256_si128(w), wh = _mm256_extracti128_si256(w, 1);
    return out_signed ? _mm_packs_epi16(wl, wh) : _mm_packus_epi16(wl, wh);
}

/* Lanes l < n of an 8-lane mask (all lanes for n >= 8, none for n <= 0). */
static inline __m256i cuvil_qmask8(int64_t n) {
    return _mm256_cmpgt_epi32(_mm256_set1_epi32((int)(n < 0 ? 0 : (n > 8 ? 8 : n))),
                              _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}
#endif

#if defined(__AVX512BW__) || defined(__AVX2__)
/* Whether any of the n floats at p (stride s) is infinite or NaN. */
static inline int cuvil_qnonfinite(const float *p, int64_t n, int64_t s) {
    for (int64_t i = 0; i < n; i++)
        if (!(p[i * s] - p[i * s] == 0.0f)) return 1;
    return 0;
}
#endif

/* ---- micro-kernels: tile[r * NR + c] = sum over the K groups of R unit (g, r) . C unit (g, c) */

/* fn(n, r_unsigned, G, rp, cp, tile) with the row count n and r_unsigned constants, so that each
 * call inlines a kernel specialized to them (the callers' switch on rows). */
#define CUVIL_QG_CALL(fn, n) (r_unsigned ? fn(n, 1, G, rp, cp, tile) : fn(n, 0, G, rp, cp, tile))

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

#if CUVIL_QG_BYTES
/* The byte path: each 4-byte unit holds 4 elements along K; vpmaddubsw (unsigned first, signed
 * second) makes the two pair sums of each unit in int16 lanes, exactly when the signed bytes lie in
 * [-64, 64], and vpmaddwd against ones adds them into the int32 lane.  `r_unsigned`: R is the
 * unsigned side (else C is). */
static inline __attribute__((always_inline)) void cuvil_qg_micro_b_n(int rows, int r_unsigned, int64_t G,
                                                                     const uint32_t *rp, const uint32_t *cp,
                                                                     int32_t *tile) {
    const __m256i ones = _mm256_set1_epi16(1);
    __m256i acc[CUVIL_QG_MR][2];
#pragma GCC unroll 8
    for (int r = 0; r < rows; r++) acc[r][0] = acc[r][1] = _mm256_setzero_si256();
    for (int64_t g = 0; g < G; g++) {
        const __m256i c0 = _mm256_loadu_si256((const __m256i *)(cp + g * CUVIL_QG_NR));
        const __m256i c1 = _mm256_loadu_si256((const __m256i *)(cp + g * CUVIL_QG_NR + 8));
#pragma GCC unroll 8
        for (int r = 0; r < rows; r++) {
            const __m256i b = _mm256_set1_epi32((int)rp[g * CUVIL_QG_MR + r]);
            const __m256i p0 = r_unsigned ? _mm256_maddubs_epi16(b, c0) : _mm256_maddubs_epi16(c0, b);
            const __m256i p1 = r_unsigned ? _mm256_maddubs_epi16(b, c1) : _mm256_maddubs_epi16(c1, b);
            acc[r][0] = _mm256_add_epi32(acc[r][0], _mm256_madd_epi16(p0, ones));
            acc[r][1] = _mm256_add_epi32(acc[r][1], _mm256_madd_epi16(p1, ones));
        }
    }
#pragma GCC unroll 8
    for (int r = 0; r < rows; r++) {
        _mm256_storeu_si256((__m256i *)(tile + r * CUVIL_QG_NR), acc[r][0]);
        _mm256_storeu_si256((__m256i *)(tile + r * CUVIL_QG_NR + 8), acc[r][1]);
    }
}

/* A panel's first 8 columns only (a tail panel of at most 8 columns: 3 of ResNet's 7x7 maps' 49
 * positions fill 3 panels and leave 1), all rows in one pass; the tile's other columns are zero. */
static inline __attribute__((always_inline)) void cuvil_qg_micro_b8_n(int rows, int r_unsigned, int64_t G,
                                                                      const uint32_t *rp, const uint32_t *cp,
                                                                      int32_t *tile) {
    const __m256i ones = _mm256_set1_epi16(1);
    __m256i acc[CUVIL_QG_MR];
#pragma GCC unroll 8
    for (int r = 0; r < rows; r++) acc[r] = _mm256_setzero_si256();
    for (int64_t g = 0; g < G; g++) {
        const __m256i c0 = _mm256_loadu_si256((const __m256i *)(cp + g * CUVIL_QG_NR));
#pragma GCC unroll 8
        for (int r = 0; r < rows; r++) {
            const __m256i b = _mm256_set1_epi32((int)rp[g * CUVIL_QG_MR + r]);
            const __m256i p0 = r_unsigned ? _mm256_maddubs_epi16(b, c0) : _mm256_maddubs_epi16(c0, b);
            acc[r] = _mm256_add_epi32(acc[r], _mm256_madd_epi16(p0, ones));
        }
    }
#pragma GCC unroll 8
    for (int r = 0; r < rows; r++) {
        _mm256_storeu_si256((__m256i *)(tile + r * CUVIL_QG_NR), acc[r]);
        _mm256_storeu_si256((__m256i *)(tile + r * CUVIL_QG_NR + 8), _mm256_setzero_si256());
    }
}

/* Up to 3 rows per pass over K: 6 accumulators, the two C vectors, the broadcast, the ones and a
 * product fit the 16 registers (6 rows' 12 accumulators would not, and spilled).  `nr` <= 8: the
 * half-width kernel above. */
static void cuvil_qg_micro_b(int rows, int r_unsigned, int64_t G, const uint32_t *rp, const uint32_t *cp,
                             int32_t *tile, int nr) {
    if (nr <= 8) {
        switch (rows) {
        case 1: CUVIL_QG_CALL(cuvil_qg_micro_b8_n, 1); return;
        case 2: CUVIL_QG_CALL(cuvil_qg_micro_b8_n, 2); return;
        case 3: CUVIL_QG_CALL(cuvil_qg_micro_b8_n, 3); return;
        case 4: CUVIL_QG_CALL(cuvil_qg_micro_b8_n, 4); return;
        case 5: CUVIL_QG_CALL(cuvil_qg_micro_b8_n, 5); return;
        default: CUVIL_QG_CALL(cuvil_qg_micro_b8_n, CUVIL_QG_MR); return;
        }
    }
    for (int r0 = 0; r0 < rows; r0 += 3) {
        const int n = rows - r0 < 3 ? rows - r0 : 3;
        const uint32_t *p = rp + r0;
        int32_t *t = tile + r0 * CUVIL_QG_NR;
        if (n == 3)
            r_unsigned ? cuvil_qg_micro_b_n(3, 1, G, p, cp, t) : cuvil_qg_micro_b_n(3, 0, G, p, cp, t);
        else if (n == 2)
            r_unsigned ? cuvil_qg_micro_b_n(2, 1, G, p, cp, t) : cuvil_qg_micro_b_n(2, 0, G, p, cp, t);
        else
            r_unsigned ? cuvil_qg_micro_b_n(1, 1, G, p, cp, t) : cuvil_qg_micro_b_n(1, 0, G, p, cp, t);
    }
}
#endif

static void cuvil_qg_micro(int rows, int r_unsigned, int64_t G, const uint32_t *rp, const uint32_t *cp,
                           int32_t *tile) {
    switch (rows) {
    case 1: CUVIL_QG_CALL(cuvil_qg_micro_n, 1); return;
    case 2: CUVIL_QG_CALL(cuvil_qg_micro_n, 2); return;
    case 3: CUVIL_QG_CALL(cuvil_qg_micro_n, 3); return;
#if CUVIL_QG_MR > 4
    case 4: CUVIL_QG_CALL(cuvil_qg_micro_n, 4); return;
    case 5: CUVIL_QG_CALL(cuvil_qg_micro_n, 5); return;
#endif
#if CUVIL_QG_MR > 6
    case 6: CUVIL_QG_CALL(cuvil_qg_micro_n, 6); return;
    case 7: CUVIL_QG_CALL(cuvil_qg_micro_n, 7); return;
#endif
    default: CUVIL_QG_CALL(cuvil_qg_micro_n, CUVIL_QG_MR); return;
    }
}

#if CUVIL_QG_BYTES
/* Whether operand `op` (lines x K) is a signed constant whose bytes all lie in [-64, 64]: the
 * signed side the byte path can take.  Scanned once per model (the constant cache), or per call
 * when the model has no cache. */
typedef struct cuvil_qg_narrow_args {
    const cuvil_qg_operand *op;
    int64_t lines, K, sl, sk;
} cuvil_qg_narrow_args;

static void cuvil_qg_narrow_scan(void *dst, const void *arg) {
    const cuvil_qg_narrow_args *a = (const cuvil_qg_narrow_args *)arg;
    const int8_t *p = (const int8_t *)a->op->p;
    int32_t ok = 1;
    for (int64_t l = 0; l < a->lines && ok; l++)
        for (int64_t k = 0; k < a->K; k++) {
            const int8_t v = p[l * a->sl + k * a->sk];
            if (v < -64 || v > 64) {
                ok = 0;
                break;
            }
        }
    *(int32_t *)dst = ok;
}

static int cuvil_qg_narrow(const cuvil_qg_operand *op, int64_t lines, int64_t K, int is_c) {
    const int64_t sl = is_c ? op->s1 : op->s0, sk = is_c ? op->s0 : op->s1;
    if (!op->is_signed || sl < 0 || sk < 0 || lines <= 0 || K <= 0) return 0;
    const size_t extent = (size_t)((lines - 1) * sl + (K - 1) * sk) + 1;
    if (!cuvil_is_constant(op->p, extent)) return 0;
    const cuvil_qg_narrow_args a = {op, lines, K, sl, sk};
    const int64_t key[CUVIL_CACHE_KEY] = {0x514e4152, lines, K, op->s0, op->s1, is_c, 0, 0};
    const int32_t *c = (const int32_t *)cuvil_cache_get(op->p, key, sizeof(int32_t), cuvil_qg_narrow_scan, &a);
    if (c) return *c;
    int32_t ok;
    cuvil_qg_narrow_scan(&ok, &a);
    return ok;
}
#endif

/* ---- the product ------------------------------------------------------------------------ */

typedef struct cuvil_qg_job {
    int64_t M, N, K, G;
    const uint32_t *Rp, *Cp;      /* packed operands */
    const int32_t *rsum, *csum;   /* their sums */
    const cuvil_qg_operand *R, *C;
    int32_t off, roff;            /* the shifts of C and R (see cuvil_qgemm) */
    int r_unsigned, bytes;        /* bytes: the byte path (CUVIL_QG_BYTES) */
    const cuvil_qg_output *out;
    int64_t nrb, ncp;             /* row blocks, column panels */
    int mult_nan;                 /* some multiplier is not finite (the product may be NaN) */
    const int32_t *rc, *cd;       /* or NULL: the separable corrections (cuvil_qg_separable) */
} cuvil_qg_job;

/* The zero-point corrections, bias and store of one tile (rows i0.., columns j0..): per row, the
 * int32 results into a row buffer, then the store or the requantization as separate loops (which
 * compilers vectorize: rintf is vroundps). */
#if defined(__AVX512BW__) && CUVIL_QG_NR == 32
/* The same arithmetic on two 16-lane halves per row (masked past nr), for the layouts the GEMM is
 * called with: column zero points, biases and multipliers either one or contiguous per column. */
static void cuvil_qg_epilogue_v(const cuvil_qg_job *g, const int32_t *tile, int64_t i0, int mr, int64_t j0, int nr) {
    const cuvil_qg_output *o = g->out;
    const __mmask16 km[2] = {cuvil_qmask16(nr), cuvil_qmask16(nr - 16 > 0 ? nr - 16 : 0)};
    __m512i zc[2], cs[2];
    for (int h = 0; h < 2; h++) {
        const int64_t j = j0 + 16 * h;
        zc[h] = g->C->zstep ? _mm512_maskz_loadu_epi32(km[h], g->C->zp + j) : _mm512_set1_epi32(g->C->zp[0]);
        zc[h] = _mm512_add_epi32(zc[h], _mm512_set1_epi32(g->off));
        cs[h] = _mm512_maskz_loadu_epi32(km[h], g->csum + j);
    }
    const __m512 lo = _mm512_set1_ps((float)(o->lo - o->zp)), hi = _mm512_set1_ps((float)(o->hi - o->zp));
    const __m512i zp = _mm512_set1_epi32(o->zp);
    const __mmask32 kq = (__mmask32)km[0] | (__mmask32)km[1] << 16;
    const int zc_one = g->C->zstep == 0, bias_row = o->bias && !o->bias_cs;
    for (int r = 0; r < mr; r++) {
        const int64_t i = i0 + r;
        const int32_t zr = (int32_t)((uint32_t)g->R->zp[i * g->R->zstep] + (uint32_t)g->roff);
        const __m512i vzr = _mm512_set1_epi32(zr), vrs = _mm512_set1_epi32(g->rsum[i]);
        const __m512i vkz = _mm512_set1_epi32((int32_t)((uint32_t)g->K * (uint32_t)zr));
        /* what does not vary along the row, in one constant: - zc * rowsum + bias */
        uint32_t c = bias_row ? (uint32_t)o->bias[i * o->bias_rs] : 0u;
        if (zc_one) c -= ((uint32_t)g->C->zp[0] + (uint32_t)g->off) * (uint32_t)g->rsum[i];
        const __m512i vc = _mm512_set1_epi32((int32_t)c);
        __m512i v[2];
#pragma GCC unroll 2
        for (int h = 0; h < 2; h++) {
            const int64_t j = j0 + 16 * h;
            v[h] = _mm512_add_epi32(_mm512_load_si512((const void *)(tile + r * CUVIL_QG_NR + 16 * h)), vc);
            if (!zc_one) v[h] = _mm512_sub_epi32(v[h], _mm512_mullo_epi32(zc[h], vrs));
            if (zr) {
                v[h] = _mm512_sub_epi32(v[h], _mm512_mullo_epi32(vzr, cs[h]));
                v[h] = _mm512_add_epi32(v[h], _mm512_mullo_epi32(vkz, zc[h]));
            }
            if (o->bias && o->bias_cs)
                v[h] = _mm512_add_epi32(v[h], _mm512_maskz_loadu_epi32(km[h], o->bias + i * o->bias_rs + j));
        }
        if (o->y32) {
            _mm512_mask_storeu_epi32(o->y32 + i * o->ldy + j0, km[0], v[0]);
            _mm512_mask_storeu_epi32(o->y32 + i * o->ldy + j0 + 16, km[1], v[1]);
            continue;
        }
        const float *mp = o->mult + i * o->mult_rs;
        const __m512 m0 = o->mult_cs ? _mm512_maskz_loadu_ps(km[0], mp + j0) : _mm512_set1_ps(mp[0]);
        const __m512 m1 = o->mult_cs ? _mm512_maskz_loadu_ps(km[1], mp + j0 + 16) : m0;
        if (o->yf) {
            _mm512_mask_storeu_ps(o->yf + i * o->ldy + j0, km[0], _mm512_mul_ps(_mm512_cvtepi32_ps(v[0]), m0));
            _mm512_mask_storeu_ps(o->yf + i * o->ldy + j0 + 16, km[1], _mm512_mul_ps(_mm512_cvtepi32_ps(v[1]), m1));
            continue;
        }
        /* both halves narrowed in registers, then one 32-byte store per row (a narrowing store to
           memory per half is slow on some cores) */
        const __m128i q0 = cuvil_qreq16(v[0], m0, lo, hi, zp, g->mult_nan);
        const __m128i q1 = cuvil_qreq16(v[1], m1, lo, hi, zp, g->mult_nan);
        _mm256_mask_storeu_epi8((uint8_t *)o->yq + i * o->ldy + j0, kq,
                                _mm256_inserti128_si256(_mm256_castsi128_si256(q0), q1, 1));
    }
}
#endif

#if !defined(__AVX512BW__) && defined(__AVX2__) && CUVIL_QG_NR == 16
/* cuvil_qg_epilogue_v on AVX2: two 8-lane halves per row, masked loads and stores past nr (bytes
 * past nr through a buffer: AVX2 has no byte mask). */
static void cuvil_qg_epilogue_v(const cuvil_qg_job *g, const int32_t *tile, int64_t i0, int mr, int64_t j0, int nr) {
    const cuvil_qg_output *o = g->out;
    const __m256i km[2] = {cuvil_qmask8(nr), cuvil_qmask8(nr - 8)};
    __m256i zc[2], cs[2];
    for (int h = 0; h < 2; h++) {
        const int64_t j = j0 + 8 * h;
        zc[h] = g->C->zstep ? _mm256_maskload_epi32(g->C->zp + j, km[h]) : _mm256_set1_epi32(g->C->zp[0]);
        zc[h] = _mm256_add_epi32(zc[h], _mm256_set1_epi32(g->off));
        cs[h] = _mm256_maskload_epi32(g->csum + j, km[h]);
    }
    const __m256 lo = _mm256_set1_ps((float)(o->lo - o->zp)), hi = _mm256_set1_ps((float)(o->hi - o->zp));
    const __m256i zp = _mm256_set1_epi32(o->zp);
    const int zc_one = g->C->zstep == 0, bias_row = o->bias && !o->bias_cs;
    for (int r = 0; r < mr; r++) {
        const int64_t i = i0 + r;
        const int32_t zr = (int32_t)((uint32_t)g->R->zp[i * g->R->zstep] + (uint32_t)g->roff);
        const __m256i vzr = _mm256_set1_epi32(zr), vrs = _mm256_set1_epi32(g->rsum[i]);
        const __m256i vkz = _mm256_set1_epi32((int32_t)((uint32_t)g->K * (uint32_t)zr));
        uint32_t c = bias_row ? (uint32_t)o->bias[i * o->bias_rs] : 0u;
        if (zc_one) c -= ((uint32_t)g->C->zp[0] + (uint32_t)g->off) * (uint32_t)g->rsum[i];
        const __m256i vc = _mm256_set1_epi32((int32_t)c);
        __m256i v[2];
#pragma GCC unroll 2
        for (int h = 0; h < 2; h++) {
            const int64_t j = j0 + 8 * h;
            v[h] = _mm256_add_epi32(_mm256_load_si256((const __m256i *)(tile + r * CUVIL_QG_NR + 8 * h)), vc);
            if (!zc_one) v[h] = _mm256_sub_epi32(v[h], _mm256_mullo_epi32(zc[h], vrs));
            if (zr) {
                v[h] = _mm256_sub_epi32(v[h], _mm256_mullo_epi32(vzr, cs[h]));
                v[h] = _mm256_add_epi32(v[h], _mm256_mullo_epi32(vkz, zc[h]));
            }
            if (o->bias && o->bias_cs)
                v[h] = _mm256_add_epi32(v[h], _mm256_maskload_epi32(o->bias + i * o->bias_rs + j, km[h]));
        }
        if (o->y32) {
            _mm256_maskstore_epi32(o->y32 + i * o->ldy + j0, km[0], v[0]);
            _mm256_maskstore_epi32(o->y32 + i * o->ldy + j0 + 8, km[1], v[1]);
            continue;
        }
        const float *mp = o->mult + i * o->mult_rs;
        const __m256 m0 = o->mult_cs ? _mm256_maskload_ps(mp + j0, km[0]) : _mm256_set1_ps(mp[0]);
        const __m256 m1 = o->mult_cs ? _mm256_maskload_ps(mp + j0 + 8, km[1]) : m0;
        if (o->yf) {
            _mm256_maskstore_ps(o->yf + i * o->ldy + j0, km[0], _mm256_mul_ps(_mm256_cvtepi32_ps(v[0]), m0));
            _mm256_maskstore_ps(o->yf + i * o->ldy + j0 + 8, km[1], _mm256_mul_ps(_mm256_cvtepi32_ps(v[1]), m1));
            continue;
        }
        const __m128i q = cuvil_qreq16_avx2(v[0], v[1], m0, m1, lo, hi, zp, g->mult_nan, o->yq_signed);
        uint8_t *y = (uint8_t *)o->yq + i * o->ldy + j0;
        if (nr == 16) {
            _mm_storeu_si128((__m128i *)y, q);
        } else {
            uint8_t buf[16];
            _mm_storeu_si128((__m128i *)buf, q);
            memcpy(y, buf, (size_t)nr);
        }
    }
}
#endif

#if !defined(__AVX512BW__) && defined(__AVX2__) && CUVIL_QG_NR == 16
/* The requantization when the corrections are separable (g->rc, g->cd): acc + rc[i] + cd[j], with
 * the multiplier per row or per column; the common case (symmetric weights) with no per-row work
 * but one add and the requantization. */
static void cuvil_qg_epilogue_sep(const cuvil_qg_job *g, const int32_t *tile, int64_t i0, int mr, int64_t j0, int nr) {
    const cuvil_qg_output *o = g->out;
    const __m256i km[2] = {cuvil_qmask8(nr), cuvil_qmask8(nr - 8)};
    const __m256i d0 = _mm256_maskload_epi32(g->cd + j0, km[0]), d1 = _mm256_maskload_epi32(g->cd + j0 + 8, km[1]);
    const __m256 lo = _mm256_set1_ps((float)(o->lo - o->zp)), hi = _mm256_set1_ps((float)(o->hi - o->zp));
    const __m256i zp = _mm256_set1_epi32(o->zp);
    __m256 mc0 = _mm256_setzero_ps(), mc1 = mc0;
    if (o->mult_cs) {
        mc0 = _mm256_maskload_ps(o->mult + j0, km[0]);
        mc1 = _mm256_maskload_ps(o->mult + j0 + 8, km[1]);
    }
    uint8_t *y = (uint8_t *)o->yq + i0 * o->ldy + j0;
    for (int r = 0; r < mr; r++, y += o->ldy) {
        const __m256i c = _mm256_set1_epi32(g->rc[i0 + r]);
        const __m256i v0 = _mm256_add_epi32(_mm256_add_epi32(_mm256_load_si256((const __m256i *)(tile + r * 16)), c), d0);
        const __m256i v1 = _mm256_add_epi32(_mm256_add_epi32(_mm256_load_si256((const __m256i *)(tile + r * 16 + 8)), c), d1);
        const __m256 m0 = o->mult_cs ? mc0 : _mm256_set1_ps(o->mult[(i0 + r) * o->mult_rs]);
        const __m128i q = cuvil_qreq16_avx2(v0, v1, o->mult_cs ? mc0 : m0, o->mult_cs ? mc1 : m0, lo, hi, zp,
                                            g->mult_nan, o->yq_signed);
        if (nr == 16) {
            _mm_storeu_si128((__m128i *)y, q);
        } else {
            uint8_t buf[16];
            _mm_storeu_si128((__m128i *)buf, q);
            memcpy(y, buf, (size_t)nr);
        }
    }
}

/* Whether the zero-point corrections of a requantized product split into a per-row and a per-column
 * term (one zero point for all rows and one for all columns: symmetric weights), with the bias and
 * the multipliers per row, per column or one; then *rc (M terms) and *cd (N terms), allocated
 * together, hold them:
 *   rc[i] = -ZC * rowsum[i] + K * ZR * ZC (+ bias[i]),   cd[j] = -ZR * colsum[j] (+ bias[j]),
 * with ZR = zr + roff and ZC = zc + off, modulo 2^32 as the general epilogue computes. */
static int32_t *cuvil_qg_separable(const cuvil_qg_job *g) {
    const cuvil_qg_output *o = g->out;
    if (!o->yq || (o->mult_rs && o->mult_cs) || (uint64_t)o->mult_rs > 1 || (uint64_t)o->mult_cs > 1) return NULL;
    if (o->bias && ((o->bias_rs && o->bias_cs) || (uint64_t)o->bias_rs > 1 || (uint64_t)o->bias_cs > 1)) return NULL;
    for (int64_t i = 1; g->R->zstep && i < g->M; i++)
        if (g->R->zp[i * g->R->zstep] != g->R->zp[0]) return NULL;
    for (int64_t j = 1; g->C->zstep && j < g->N; j++)
        if (g->C->zp[j * g->C->zstep] != g->C->zp[0]) return NULL;
    int32_t *t = (int32_t *)malloc(sizeof(int32_t) * (size_t)(g->M + g->N + 8));
    if (!t) return NULL; /* the general epilogue */
    const uint32_t zr = (uint32_t)g->R->zp[0] + (uint32_t)g->roff, zc = (uint32_t)g->C->zp[0] + (uint32_t)g->off;
    const uint32_t kzz = (uint32_t)g->K * zr * zc;
    for (int64_t i = 0; i < g->M; i++)
        t[i] = (int32_t)(kzz - zc * (uint32_t)g->rsum[i] + (o->bias && o->bias_rs ? (uint32_t)o->bias[i] : 0u));
    for (int64_t j = 0; j < g->N; j++)
        t[g->M + j] = (int32_t)(0u - zr * (uint32_t)g->csum[j] + (o->bias && o->bias_cs ? (uint32_t)o->bias[j] : 0u));
    if (o->bias && !o->bias_rs && !o->bias_cs) /* one bias for all */
        for (int64_t i = 0; i < g->M; i++) t[i] = (int32_t)((uint32_t)t[i] + (uint32_t)o->bias[0]);
    return t;
}
#endif

static void cuvil_qg_epilogue(const cuvil_qg_job *g, const int32_t *tile, int64_t i0, int mr, int64_t j0, int nr) {
    const cuvil_qg_output *o = g->out;
#if !defined(__AVX512BW__) && defined(__AVX2__) && CUVIL_QG_NR == 16
    if (g->rc) {
        cuvil_qg_epilogue_sep(g, tile, i0, mr, j0, nr);
        return;
    }
#endif
#if (defined(__AVX512BW__) && CUVIL_QG_NR == 32) || (defined(__AVX2__) && CUVIL_QG_NR == 16)
    if ((uint64_t)g->C->zstep <= 1 && (uint64_t)o->bias_cs <= 1 && (uint64_t)o->mult_cs <= 1) {
        cuvil_qg_epilogue_v(g, tile, i0, mr, j0, nr);
        return;
    }
#endif
    uint32_t zc[CUVIL_QG_NR], cs[CUVIL_QG_NR];
    for (int c = 0; c < nr; c++) {
        zc[c] = (uint32_t)g->C->zp[(j0 + c) * g->C->zstep] + (uint32_t)g->off;
        cs[c] = (uint32_t)g->csum[j0 + c];
    }
    for (int r = 0; r < mr; r++) {
        const int64_t i = i0 + r;
        const uint32_t zr = (uint32_t)g->R->zp[i * g->R->zstep] + (uint32_t)g->roff, rs = (uint32_t)g->rsum[i], kz = (uint32_t)g->K * zr;
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
        if (o->yf) {
            float *y = o->yf + i * o->ldy + j0;
            for (int c = 0; c < nr; c++) y[c] = (float)v[c] * m[c * o->mult_cs];
            continue;
        }
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
        const uint32_t *rp = g->Rp + i0 / CUVIL_QG_MR * CUVIL_QG_MR * g->G;
#if CUVIL_QG_BYTES
        if (g->bytes)
            cuvil_qg_micro_b(mr, g->r_unsigned, g->G, rp, cp, tile, nr);
        else
#endif
            cuvil_qg_micro(mr, g->r_unsigned, g->G, rp, cp, tile);
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
                const float m = out->mult[i * out->mult_rs + j * out->mult_cs];
                if (out->yf) {
                    out->yf[i * out->ldy + j] = (float)v * m;
                    continue;
                }
                const int32_t q = cuvil_quantize_f((float)v * m, out->zp, out->lo, out->hi);
                if (out->yq_signed)
                    ((int8_t *)out->yq)[i * out->ldy + j] = (int8_t)q;
                else
                    ((uint8_t *)out->yq)[i * out->ldy + j] = (uint8_t)q;
            }
        return 0;
    }
    const int64_t work = M * N * K;
    /* VNNI needs one unsigned side: C is shifted when it has R's signedness. */
    int32_t off = CUVIL_QG_KU == 4 && R->is_signed == C->is_signed ? (C->is_signed ? 128 : -128) : 0, roff = 0;
    int ku = CUVIL_QG_KU, r_unsigned = !R->is_signed;
#if CUVIL_QG_BYTES
    /* the byte path when one side is narrow: that side is the signed one, the other is shifted to
       unsigned when it is signed */
    if (cuvil_qg_narrow(R, M, K, 0)) {
        ku = 4, r_unsigned = 0, off = C->is_signed ? 128 : 0;
    } else if (cuvil_qg_narrow(C, N, K, 1)) {
        ku = 4, r_unsigned = 1, roff = R->is_signed ? 128 : 0;
    }
#endif
    const cuvil_qg_pack_args ra = {*R, 0, M, K, roff, ku}, ca = {*C, 1, N, K, off, ku};
    uint32_t *rown = NULL, *cown = NULL;
    const uint32_t *Rp = cuvil_qg_packed(&ra, work, &rown);
    const uint32_t *Cp = Rp ? cuvil_qg_packed(&ca, work, &cown) : NULL;
    if (!Rp || !Cp) {
        free(rown);
        free(cown);
        return -1;
    }
    const int64_t G = cuvil_qg_groups(K, ku);
    cuvil_qg_job g;
    g.M = M, g.N = N, g.K = K, g.G = G, g.Rp = Rp, g.Cp = Cp;
    g.rsum = (const int32_t *)(Rp + cuvil_qg_panels(&ra) * CUVIL_QG_MR * G);
    g.csum = (const int32_t *)(Cp + cuvil_qg_panels(&ca) * CUVIL_QG_NR * G);
    g.R = R, g.C = C, g.off = off, g.roff = roff, g.r_unsigned = r_unsigned, g.bytes = ku != CUVIL_QG_KU, g.out = out;
    g.nrb = (M + CUVIL_QG_RB - 1) / CUVIL_QG_RB, g.ncp = (N + CUVIL_QG_NR - 1) / CUVIL_QG_NR;
    g.mult_nan = 1;
#if defined(__AVX512BW__) || defined(__AVX2__)
    if (out->yq) /* the multipliers are per row, per column or one */
        g.mult_nan = out->mult_rs ? cuvil_qnonfinite(out->mult, M, out->mult_rs)
                                  : cuvil_qnonfinite(out->mult, out->mult_cs ? N : 1, out->mult_cs);
#endif
    g.rc = g.cd = NULL;
    int32_t *sep = NULL;
#if !defined(__AVX512BW__) && defined(__AVX2__) && CUVIL_QG_NR == 16
    sep = cuvil_qg_separable(&g);
    if (sep) g.rc = sep, g.cd = sep + M;
#endif
    if (work >= CUVIL_QG_PAR_MIN)
        cuvil_parallel_for(g.nrb * g.ncp, cuvil_qg_task, &g);
    else
        for (int64_t t = 0; t < g.nrb * g.ncp; t++) cuvil_qg_task(&g, t, 0);
    free(sep);
    free(rown);
    free(cown);
    return 0;
}

#endif /* CUVIL_QGEMM_H */
