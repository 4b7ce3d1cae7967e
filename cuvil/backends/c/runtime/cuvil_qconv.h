/* Cuvil's integer convolution: conv(X - xzp, W - wzp) in int32, stored or requantized exactly
 * as cuvil_qgemm's epilogue does (cuvil_qgemm.h), on NCHW bytes.
 *
 * Two paths, with the same integer results (sums of exact products, modulo 2^32):
 *   depthwise (every group has one input channel, 2-D): a direct kernel.  Each task is one
 *     (image, output channel): the channel's plane minus its zero point is copied into a
 *     zero-padded int16 plane (padding with the zero point is padding X - xzp with 0), split
 *     into phases by the strides, so that every tap reads the plane at one offset and unit
 *     stride.  A thread's plane is zeroed once per call (every task writes the same elements).
 *     With AVX-512 the sums are made 32 at a time in registers, two taps per vpmaddwd
 *     (cuvil_qdw_taps_avx512; the weight pairs are made once per model when the weight zero
 *     points are 0, else once per call), and requantized in vectors; with AVX2 the same 16 at a
 *     time (cuvil_qdw_taps_avx2, cuvil_qconv_req_avx2, the plane filled by cuvil_qdw_row_avx2
 *     and cuvil_qdw_row2_avx2); elsewhere each tap is one long multiply-add into int32 sums,
 *     which compilers vectorize.  A GEMM per channel (M = 1) would spend its time packing;
 *   otherwise: im2col per image and group (positions outside the input get xzp; the 2-D case
 *     copies whole row runs and is split across threads by input channel) and cuvil_qgemm with
 *     the weight as R [mg, cg * taps] and the columns as C [cg * taps, P].  A 1x1, unit-stride,
 *     unpadded convolution needs no im2col: the image [cg, P] is C itself.  The weight's packed
 *     panels are cached once per model; C is packed per call, with AVX-512 VNNI four rows at a
 *     time (cuvil_qg_pack_c_vnni).
 */
#ifndef CUVIL_QCONV_H
#define CUVIL_QCONV_H

#include "cuvil_conv.h"
#include "cuvil_qgemm.h"

#if defined(__AVX512BW__)
/* The requantization of n sums (plus the bias b, times m) into the bytes at y, 32 per store (a
 * narrowing store of 16 is slow on some cores). */
static inline void cuvil_qconv_req_avx512(const cuvil_qg_output *o, float m, int32_t b, const int32_t *acc, int64_t n,
                                          uint8_t *y) {
    const __m512 vm = _mm512_set1_ps(m), vlo = _mm512_set1_ps((float)(o->lo - o->zp));
    const __m512 vhi = _mm512_set1_ps((float)(o->hi - o->zp));
    const __m512i vb = _mm512_set1_epi32(b), vzp = _mm512_set1_epi32(o->zp);
    const int nan = cuvil_qnonfinite(&m, 1, 1);
    for (int64_t i = 0; i < n; i += 32) {
        const __mmask16 k0 = cuvil_qmask16(n - i), k1 = cuvil_qmask16(n - i > 16 ? n - i - 16 : 0);
        const __m512i v0 = _mm512_add_epi32(_mm512_maskz_loadu_epi32(k0, acc + i), vb);
        const __m512i v1 = _mm512_add_epi32(_mm512_maskz_loadu_epi32(k1, acc + i + 16), vb);
        const __m128i q0 = cuvil_qreq16(v0, vm, vlo, vhi, vzp, nan), q1 = cuvil_qreq16(v1, vm, vlo, vhi, vzp, nan);
        _mm256_mask_storeu_epi8(y + i, (__mmask32)k0 | (__mmask32)k1 << 16,
                                _mm256_inserti128_si256(_mm256_castsi128_si256(q0), q1, 1));
    }
}
#elif defined(__AVX2__)
/* The same on AVX2, 16 at a time: writes up to 15 bytes past n (the callers' slack) when `full`,
 * else the last partial step goes through a buffer; reads up to 15 sums past n only when `full`. */
static inline void cuvil_qconv_req_avx2(const cuvil_qg_output *o, float m, int32_t b, const int32_t *acc, int64_t n,
                                        uint8_t *y, int full) {
    const __m256 vm = _mm256_set1_ps(m), vlo = _mm256_set1_ps((float)(o->lo - o->zp));
    const __m256 vhi = _mm256_set1_ps((float)(o->hi - o->zp));
    const __m256i vb = _mm256_set1_epi32(b), vzp = _mm256_set1_epi32(o->zp);
    const int nan = cuvil_qnonfinite(&m, 1, 1);
    int64_t i = 0;
    for (; i + 16 <= n || (full && i < n); i += 16) {
        const __m256i v0 = _mm256_add_epi32(_mm256_loadu_si256((const __m256i *)(acc + i)), vb);
        const __m256i v1 = _mm256_add_epi32(_mm256_loadu_si256((const __m256i *)(acc + i + 8)), vb);
        _mm_storeu_si128((__m128i *)(y + i), cuvil_qreq16_avx2(v0, v1, vm, vm, vlo, vhi, vzp, nan, o->yq_signed));
    }
    if (i < n) {
        int32_t a[16] = {0};
        uint8_t q[16];
        memcpy(a, acc + i, sizeof(int32_t) * (size_t)(n - i));
        const __m256i v0 = _mm256_add_epi32(_mm256_loadu_si256((const __m256i *)a), vb);
        const __m256i v1 = _mm256_add_epi32(_mm256_loadu_si256((const __m256i *)(a + 8)), vb);
        _mm_storeu_si128((__m128i *)q, cuvil_qreq16_avx2(v0, v1, vm, vm, vlo, vhi, vzp, nan, o->yq_signed));
        memcpy(y + i, q, (size_t)(n - i));
    }
}
#endif

/* The requantization of one output run (cuvil_qg_epilogue's arithmetic on one row): acc holds
 * the int32 sums of output channel `ch`, n of them, written to the output at element `at`. */
static inline void cuvil_qconv_store(const cuvil_qg_output *o, int64_t ch, const int32_t *acc, int64_t n, int64_t at) {
    const int32_t b = o->bias ? o->bias[ch * o->bias_rs] : 0;
    if (o->y32) {
        for (int64_t i = 0; i < n; i++) o->y32[at + i] = (int32_t)((uint32_t)acc[i] + (uint32_t)b);
        return;
    }
    const float m = o->mult[ch * o->mult_rs];
#if defined(__AVX512BW__)
    cuvil_qconv_req_avx512(o, m, b, acc, n, (uint8_t *)o->yq + at);
    return;
#elif defined(__AVX2__)
    cuvil_qconv_req_avx2(o, m, b, acc, n, (uint8_t *)o->yq + at, 0);
    return;
#endif
    const float lo = (float)(o->lo - o->zp), hi = (float)(o->hi - o->zp);
    const int32_t zp = o->zp;
    if (o->yq_signed) {
        int8_t *restrict y = (int8_t *)o->yq + at;
        for (int64_t i = 0; i < n; i++) {
            float f = rintf((float)(int32_t)((uint32_t)acc[i] + (uint32_t)b) * m);
            f = f != f ? 0.0f : f; /* NaN (an infinite or NaN multiplier) gives the zero point */
            f = f < lo ? lo : (f > hi ? hi : f);
            y[i] = (int8_t)((int32_t)f + zp);
        }
    } else {
        uint8_t *restrict y = (uint8_t *)o->yq + at;
        for (int64_t i = 0; i < n; i++) {
            float f = rintf((float)(int32_t)((uint32_t)acc[i] + (uint32_t)b) * m);
            f = f != f ? 0.0f : f;
            f = f < lo ? lo : (f > hi ? hi : f);
            y[i] = (uint8_t)((int32_t)f + zp);
        }
    }
}

/* d[0, n) = s[0, n): 32 and 16 bytes at a time, then the rest (under 16) as two 8-byte or 4-byte
 * moves that may overlap (the same bytes twice), so that a short row costs no library call. */
static inline void cuvil_qcopy(uint8_t *restrict d, const uint8_t *restrict s, int64_t n) {
#if defined(__AVX2__)
    int64_t i = 0;
    for (; i + 32 <= n; i += 32) _mm256_storeu_si256((__m256i *)(d + i), _mm256_loadu_si256((const __m256i *)(s + i)));
    if (i + 16 <= n) {
        _mm_storeu_si128((__m128i *)(d + i), _mm_loadu_si128((const __m128i *)(s + i)));
        i += 16;
    }
    const int64_t r = n - i;
    if (r >= 8) {
        memcpy(d + i, s + i, 8);
        memcpy(d + n - 8, s + n - 8, 8);
    } else if (r >= 4) {
        memcpy(d + i, s + i, 4);
        memcpy(d + n - 4, s + n - 4, 4);
    } else {
        if (r > 0) d[i] = s[i];
        if (r > 1) d[i + 1] = s[i + 1];
        if (r > 2) d[i + 2] = s[i + 2];
    }
#else
    for (int64_t i = 0; i < n; i++) d[i] = s[i];
#endif
}

/* ---- depthwise ------------------------------------------------------------------------------- */

/* Elements past the plane and past the sums that the vectorized taps may read or write. */
#define CUVIL_QDW_SLACK 64

typedef struct cuvil_qdw_job {
    const cuvil_conv_geom *g;
    const void *x;
    int x_signed;
    int32_t xzp;
    const void *w;
    int w_signed;
    const int32_t *wzp;
    int64_t wzstep;
    const cuvil_qg_output *out;
    int64_t PHp, PWp; /* one phase of the padded plane */
    const int64_t *toff; /* per tap, where it reads the plane (see cuvil_qdw_task) */
    const int64_t *poff; /* the taps in pairs, pass after pass (cuvil_qdw_taps_avx512) */
    const int32_t *wpair; /* per output channel, its npairs weight pairs */
    int64_t npairs;
    char *scratch;    /* per thread: the phases (int16), the sums (int32), the requantized run */
    size_t per_thread;
} cuvil_qdw_job;

/* Taps per pass of the vectorized kernel (a pass keeps its 32 sums in registers). */
#define CUVIL_QDW_MAXT 64

/* Tap pairs over all passes: each pass of nt taps makes (nt + 1) / 2 pairs. */
static inline int64_t cuvil_qdw_npairs(int64_t taps) {
    int64_t np = 0;
    for (int64_t t0 = 0; t0 < taps; t0 += CUVIL_QDW_MAXT) np += ((taps - t0 < CUVIL_QDW_MAXT ? taps - t0 : CUVIL_QDW_MAXT) + 1) / 2;
    return np;
}

typedef struct cuvil_qdw_pair_args {
    const void *w;
    int w_signed;
    const int32_t *wzp;
    int64_t wzstep, cout, taps;
} cuvil_qdw_pair_args;

/* Per output channel, its weights minus their zero point as int16 pairs (tap 2p low, 2p + 1 high),
 * pass after pass; an odd last tap of a pass is paired with 0.  What vpmaddwd multiplies by. */
static CUVIL_UNUSED void cuvil_qdw_pairs_build(void *dst, const void *arg) {
    const cuvil_qdw_pair_args *a = (const cuvil_qdw_pair_args *)arg;
    int32_t *wp = (int32_t *)dst;
    for (int64_t oc = 0; oc < a->cout; oc++) {
        const int32_t wz = a->wzp[oc * a->wzstep];
        for (int64_t t0 = 0; t0 < a->taps; t0 += CUVIL_QDW_MAXT) {
            const int64_t nt = a->taps - t0 < CUVIL_QDW_MAXT ? a->taps - t0 : CUVIL_QDW_MAXT;
            for (int64_t q = 0; q < nt; q += 2) {
                uint32_t pair = 0;
                for (int64_t h = 0; h < 2 && q + h < nt; h++) {
                    const int64_t wi = oc * a->taps + t0 + q + h;
                    const int32_t wv = (a->w_signed ? (int32_t)((const int8_t *)a->w)[wi]
                                                    : (int32_t)((const uint8_t *)a->w)[wi]) - wz;
                    pair |= (uint32_t)(uint16_t)(int16_t)wv << (16 * h);
                }
                *wp++ = (int32_t)pair;
            }
        }
    }
}

#if defined(__AVX512BW__)
/* acc[0, n) = the sum over taps of plane[tap offset + i] * (w[tap] - wz), 32 sums at a time kept in
 * registers across all taps of a pass.  Taps go in pairs (a, b): vpunpck{l,h}wd interleave the two
 * taps' int16 values and vpmaddwd multiplies each pair by (wa, wb) and adds them, exactly (|x - xzp|
 * and |w - wz| are at most 255; with AVX-512 VNNI vpdpwssd adds them to the sums in the same
 * instruction, wrapping as the separate add does); an odd last tap is paired with a zero weight.
 * The unpacks work within 128-bit lanes, so the two int32 vectors hold positions {0-3, 8-11, ...}
 * and {4-7, 12-15, ...}; one two-source permute per half puts them back in order.  Reads run up to
 * 31 elements past the last sum's taps (into the plane's zeroed slack); up to 31 sums past n are
 * written, unused. */
static inline __m512i cuvil_qdw_madd(__m512i acc, __m512i x, __m512i w) {
#if defined(__AVX512VNNI__)
    return _mm512_dpwssd_epi32(acc, x, w);
#else
    return _mm512_add_epi32(acc, _mm512_madd_epi16(x, w));
#endif
}

static void cuvil_qdw_taps_avx512(const cuvil_qdw_job *j, const int16_t *plane, int64_t oc, int64_t n, int32_t *acc) {
    const int64_t taps = j->g->k[0] * j->g->k[1];
    const int32_t *wpair = j->wpair + oc * j->npairs;
    const int64_t *off = j->poff;
    const __m512i i0 = _mm512_setr_epi32(0, 1, 2, 3, 16, 17, 18, 19, 4, 5, 6, 7, 20, 21, 22, 23);
    const __m512i i1 = _mm512_setr_epi32(8, 9, 10, 11, 24, 25, 26, 27, 12, 13, 14, 15, 28, 29, 30, 31);
    const __m512i u0 = _mm512_setr_epi32(0, 1, 2, 3, 8, 9, 10, 11, 16, 17, 18, 19, 24, 25, 26, 27);
    const __m512i u1 = _mm512_setr_epi32(4, 5, 6, 7, 12, 13, 14, 15, 20, 21, 22, 23, 28, 29, 30, 31);
    for (int64_t t0 = 0; t0 < taps; t0 += CUVIL_QDW_MAXT) {
        const int64_t nt = taps - t0 < CUVIL_QDW_MAXT ? taps - t0 : CUVIL_QDW_MAXT, np = (nt + 1) / 2;
        for (int64_t i = 0; i < n; i += 32) {
            __m512i lo = _mm512_setzero_si512(), hi = _mm512_setzero_si512();
            if (t0 > 0) { /* a later pass adds to the sums, taken back into the permuted order */
                const __m512i a0 = _mm512_loadu_si512((const void *)(acc + i));
                const __m512i a1 = _mm512_loadu_si512((const void *)(acc + i + 16));
                lo = _mm512_permutex2var_epi32(a0, u0, a1);
                hi = _mm512_permutex2var_epi32(a0, u1, a1);
            }
            for (int64_t p = 0; p < np; p++) {
                const __m512i xa = _mm512_loadu_si512((const void *)(plane + off[2 * p] + i));
                const __m512i xb = _mm512_loadu_si512((const void *)(plane + off[2 * p + 1] + i));
                const __m512i w = _mm512_set1_epi32(wpair[p]);
                lo = cuvil_qdw_madd(lo, _mm512_unpacklo_epi16(xa, xb), w);
                hi = cuvil_qdw_madd(hi, _mm512_unpackhi_epi16(xa, xb), w);
            }
            _mm512_storeu_si512((void *)(acc + i), _mm512_permutex2var_epi32(lo, i0, hi));
            _mm512_storeu_si512((void *)(acc + i + 16), _mm512_permutex2var_epi32(lo, i1, hi));
        }
        off += 2 * np;
        wpair += np;
    }
}
#endif

#if defined(__AVX2__) && !defined(__AVX512BW__)
/* cuvil_qdw_taps_avx512's arithmetic on 16 sums at a time (two 8-lane int32 vectors): vpunpck{l,h}wd
 * interleave two taps' int16 values within 128-bit lanes, so the two vectors hold positions
 * {0-3, 8-11} and {4-7, 12-15}; vperm2i128 puts them back in order.  Reads run up to 15 elements
 * past the last sum's taps (into the plane's zeroed slack); up to 15 sums past n are written. */
/* -DCUVIL_QDW_3X3=0 builds the general loop only, to compare against */
#ifndef CUVIL_QDW_3X3
#define CUVIL_QDW_3X3 1
#endif
static void cuvil_qdw_taps_avx2(const cuvil_qdw_job *j, const int16_t *plane, int64_t oc, int64_t n, int32_t *acc) {
    const int64_t taps = j->g->k[0] * j->g->k[1];
    const int32_t *wpair = j->wpair + oc * j->npairs;
    const int64_t *off = j->poff;
    if (CUVIL_QDW_3X3 && taps == 9) { /* 3x3, the common kernel: its five pairs unrolled, weights in registers */
        const int16_t *q0 = plane + off[0], *q1 = plane + off[1], *q2 = plane + off[2], *q3 = plane + off[3];
        const int16_t *q4 = plane + off[4], *q5 = plane + off[5], *q6 = plane + off[6], *q7 = plane + off[7];
        const int16_t *q8 = plane + off[8], *q9 = plane + off[9];
        const __m256i w0 = _mm256_set1_epi32(wpair[0]), w1 = _mm256_set1_epi32(wpair[1]);
        const __m256i w2 = _mm256_set1_epi32(wpair[2]), w3 = _mm256_set1_epi32(wpair[3]);
        const __m256i w4 = _mm256_set1_epi32(wpair[4]);
#define CUVIL_QDW_PAIR(a, b, w)                                                                       \
    do {                                                                                              \
        const __m256i xa = _mm256_loadu_si256((const __m256i *)(a + i));                              \
        const __m256i xb = _mm256_loadu_si256((const __m256i *)(b + i));                              \
        lo = _mm256_add_epi32(lo, _mm256_madd_epi16(_mm256_unpacklo_epi16(xa, xb), w));               \
        hi = _mm256_add_epi32(hi, _mm256_madd_epi16(_mm256_unpackhi_epi16(xa, xb), w));               \
    } while (0)
        for (int64_t i = 0; i < n; i += 16) {
            __m256i lo = _mm256_setzero_si256(), hi = _mm256_setzero_si256();
            CUVIL_QDW_PAIR(q0, q1, w0);
            CUVIL_QDW_PAIR(q2, q3, w1);
            CUVIL_QDW_PAIR(q4, q5, w2);
            CUVIL_QDW_PAIR(q6, q7, w3);
            CUVIL_QDW_PAIR(q8, q9, w4);
            _mm256_storeu_si256((__m256i *)(acc + i), _mm256_permute2x128_si256(lo, hi, 0x20));
            _mm256_storeu_si256((__m256i *)(acc + i + 8), _mm256_permute2x128_si256(lo, hi, 0x31));
        }
#undef CUVIL_QDW_PAIR
        return;
    }
    for (int64_t t0 = 0; t0 < taps; t0 += CUVIL_QDW_MAXT) {
        const int64_t nt = taps - t0 < CUVIL_QDW_MAXT ? taps - t0 : CUVIL_QDW_MAXT, np = (nt + 1) / 2;
        for (int64_t i = 0; i < n; i += 16) {
            __m256i lo = _mm256_setzero_si256(), hi = _mm256_setzero_si256();
            if (t0 > 0) { /* a later pass adds to the sums, taken back into the interleaved order */
                const __m256i a0 = _mm256_loadu_si256((const __m256i *)(acc + i));
                const __m256i a1 = _mm256_loadu_si256((const __m256i *)(acc + i + 8));
                lo = _mm256_permute2x128_si256(a0, a1, 0x20);
                hi = _mm256_permute2x128_si256(a0, a1, 0x31);
            }
            for (int64_t p = 0; p < np; p++) {
                const __m256i xa = _mm256_loadu_si256((const __m256i *)(plane + off[2 * p] + i));
                const __m256i xb = _mm256_loadu_si256((const __m256i *)(plane + off[2 * p + 1] + i));
                const __m256i w = _mm256_set1_epi32(wpair[p]);
                lo = _mm256_add_epi32(lo, _mm256_madd_epi16(_mm256_unpacklo_epi16(xa, xb), w));
                hi = _mm256_add_epi32(hi, _mm256_madd_epi16(_mm256_unpackhi_epi16(xa, xb), w));
            }
            _mm256_storeu_si256((__m256i *)(acc + i), _mm256_permute2x128_si256(lo, hi, 0x20));
            _mm256_storeu_si256((__m256i *)(acc + i + 8), _mm256_permute2x128_si256(lo, hi, 0x31));
        }
        off += 2 * np;
        wpair += np;
    }
}
#endif

#if defined(__AVX2__) && !defined(__AVX512BW__)
/* d[q] = x[q] - xzp for q < n, 16 at a time (the last step overlapping the one before: same values);
 * reads no byte past x[n - 1]. */
static inline void cuvil_qdw_row_avx2(int16_t *d, const uint8_t *x, int x_signed, int64_t n, int32_t xzp) {
    if (n < 16) { /* 8 (or 4) at a time, the last step overlapping; fewer than 4 one by one */
        const __m128i z = _mm_set1_epi16((int16_t)xzp);
        const int w = n >= 8 ? 8 : (n >= 4 ? 4 : 0);
        if (w == 0) {
            for (int64_t q = 0; q < n; q++) d[q] = (int16_t)((x_signed ? (int32_t)(int8_t)x[q] : (int32_t)x[q]) - xzp);
            return;
        }
        for (int64_t q = 0;; q += w) {
            if (q > n - w) q = n - w;
            __m128i b;
            if (w == 8) {
                int64_t v;
                memcpy(&v, x + q, 8);
                b = _mm_cvtsi64_si128(v);
            } else {
                int32_t v;
                memcpy(&v, x + q, 4);
                b = _mm_cvtsi32_si128(v);
            }
            const __m128i e = _mm_sub_epi16(x_signed ? _mm_cvtepi8_epi16(b) : _mm_cvtepu8_epi16(b), z);
            if (w == 8)
                _mm_storeu_si128((__m128i *)(d + q), e);
            else
                _mm_storel_epi64((__m128i *)(d + q), e);
            if (q == n - w) break;
        }
        return;
    }
    const __m256i z = _mm256_set1_epi16((int16_t)xzp);
    for (int64_t q = 0;; q += 16) {
        if (q > n - 16) q = n - 16;
        const __m128i b = _mm_loadu_si128((const __m128i *)(x + q));
        const __m256i v = x_signed ? _mm256_cvtepi8_epi16(b) : _mm256_cvtepu8_epi16(b);
        _mm256_storeu_si256((__m256i *)(d + q), _mm256_sub_epi16(v, z));
        if (q == n - 16) break;
    }
}

/* Column stride 2: both column phases of one padded row from the same loads (cuvil_qdw_row2_avx512's
 * arithmetic): 2w input bytes give w of each phase (w = 16, or 8 or 4 for shorter rows), for q in
 * [vs, vend), where both phases' columns 2q + c lie in [clo, chi); the last step overlaps the one
 * before (same values).  The columns left at either end (at most one or two) one by one. */
static inline void cuvil_qdw_split2_avx2(int16_t *d0, int16_t *d1, const uint8_t *src, int x_signed, int64_t qs,
                                         int w, __m256i z) {
    if (w == 4) { /* 8 bytes: 4 of each phase */
        int64_t v;
        memcpy(&v, src + 2 * qs, 8);
        const __m128i b = _mm_cvtsi64_si128(v), zz = _mm256_castsi256_si128(z);
        const __m128i ev = x_signed ? _mm_srai_epi16(_mm_slli_epi16(b, 8), 8) : _mm_and_si128(b, _mm_set1_epi16(0xff));
        const __m128i od = x_signed ? _mm_srai_epi16(b, 8) : _mm_srli_epi16(b, 8);
        _mm_storel_epi64((__m128i *)(d0 + qs), _mm_sub_epi16(ev, zz));
        _mm_storel_epi64((__m128i *)(d1 + qs), _mm_sub_epi16(od, zz));
    } else if (w == 16) {
        const __m256i b = _mm256_loadu_si256((const __m256i *)(src + 2 * qs));
        const __m256i ev = x_signed ? _mm256_srai_epi16(_mm256_slli_epi16(b, 8), 8) : _mm256_and_si256(b, _mm256_set1_epi16(0xff));
        const __m256i od = x_signed ? _mm256_srai_epi16(b, 8) : _mm256_srli_epi16(b, 8);
        _mm256_storeu_si256((__m256i *)(d0 + qs), _mm256_sub_epi16(ev, z));
        _mm256_storeu_si256((__m256i *)(d1 + qs), _mm256_sub_epi16(od, z));
    } else {
        const __m128i b = _mm_loadu_si128((const __m128i *)(src + 2 * qs)), zz = _mm256_castsi256_si128(z);
        const __m128i ev = x_signed ? _mm_srai_epi16(_mm_slli_epi16(b, 8), 8) : _mm_and_si128(b, _mm_set1_epi16(0xff));
        const __m128i od = x_signed ? _mm_srai_epi16(b, 8) : _mm_srli_epi16(b, 8);
        _mm_storeu_si128((__m128i *)(d0 + qs), _mm_sub_epi16(ev, zz));
        _mm_storeu_si128((__m128i *)(d1 + qs), _mm_sub_epi16(od, zz));
    }
}

static inline void cuvil_qdw_row2_avx2(int16_t *d0, int16_t *d1, const uint8_t *src, int x_signed, int64_t clo,
                                       int64_t chi, const int64_t q0[2], const int64_t q1[2], int32_t xzp) {
    const __m256i z = _mm256_set1_epi16((int16_t)xzp);
    const int64_t vs = (clo + 1) / 2, vend = chi / 2;
    int64_t ve = vs;
    const int64_t w = vend - vs >= 16 ? 16 : (vend - vs >= 8 ? 8 : (vend - vs >= 4 ? 4 : 0));
    if (w == 16) { /* a loop per width, each with its width known */
        for (int64_t qs = vs;; qs += 16) {
            if (qs > vend - 16) qs = vend - 16;
            cuvil_qdw_split2_avx2(d0, d1, src, x_signed, qs, 16, z);
            if (qs == vend - 16) break;
        }
        ve = vend;
    } else if (w) {
        for (int64_t qs = vs;; qs += w) {
            if (qs > vend - w) qs = vend - w;
            cuvil_qdw_split2_avx2(d0, d1, src, x_signed, qs, (int)w, z);
            if (qs == vend - w) break;
        }
        ve = vend;
    }
    for (int c = 0; c < 2; c++) {
        int16_t *d = c ? d1 : d0;
        const int64_t a = q0[c], b = q1[c], m0 = vs < a ? a : (vs > b ? b : vs), m1 = ve > b ? b : (ve < m0 ? m0 : ve);
        /* [a, m0) and [m1, b): the columns before and after the vector steps */
        if (x_signed) {
            for (int64_t q = a; q < m0; q++) d[q] = (int16_t)((int32_t)(int8_t)src[2 * q + c] - xzp);
            for (int64_t q = m1; q < b; q++) d[q] = (int16_t)((int32_t)(int8_t)src[2 * q + c] - xzp);
        } else {
            for (int64_t q = a; q < m0; q++) d[q] = (int16_t)((int32_t)src[2 * q + c] - xzp);
            for (int64_t q = m1; q < b; q++) d[q] = (int16_t)((int32_t)src[2 * q + c] - xzp);
        }
    }
}
#endif

#if defined(__AVX512BW__)
/* d[q] = x[q * sw] - xzp for q < n, sw 1 or 2, 32 at a time; masked loads read no byte past the
 * last one used.  With sw == 2 the even bytes are the low halves of the 16-bit words. */
static inline __attribute__((always_inline)) void cuvil_qdw_row_avx512(int16_t *d, const uint8_t *x, int x_signed,
                                                                      int64_t sw, int64_t n, int32_t xzp) {
    const __m512i z = _mm512_set1_epi16((int16_t)xzp);
    for (int64_t q = 0; q < n; q += 32) {
        const int64_t m = n - q < 32 ? n - q : 32;
        const __mmask32 km = m == 32 ? (__mmask32)0xffffffffu : (__mmask32)((1u << m) - 1u);
        __m512i v;
        if (sw == 1) {
            const __m256i b = _mm256_maskz_loadu_epi8(km, x + q);
            v = x_signed ? _mm512_cvtepi8_epi16(b) : _mm512_cvtepu8_epi16(b);
        } else {
            const int64_t nb = 2 * m - 1;
            const __mmask64 kb = nb == 64 ? ~(__mmask64)0 : (((__mmask64)1 << nb) - 1);
            const __m512i b = _mm512_maskz_loadu_epi8(kb, x + 2 * q);
            v = x_signed ? _mm512_srai_epi16(_mm512_slli_epi16(b, 8), 8) : _mm512_and_si512(b, _mm512_set1_epi16(0xff));
        }
        _mm512_mask_storeu_epi16(d + q, km, _mm512_sub_epi16(v, z));
    }
}
#endif

#if defined(__AVX512BW__)
/* Bits [lo, hi) of a 64-bit mask (clamped to 0..64). */
static inline uint64_t cuvil_qdw_bits(int64_t lo, int64_t hi) {
    lo = lo < 0 ? 0 : lo;
    hi = hi > 64 ? 64 : hi;
    if (hi <= lo) return 0;
    return (hi == 64 ? ~(uint64_t)0 : (((uint64_t)1 << hi) - 1)) & ~(((uint64_t)1 << lo) - 1);
}

/* Column stride 2: both column phases of one padded row from the same loads.  src[px] is the input
 * byte of padded column px (read only for clo <= px < chi, by masked loads); padded column
 * 2q + c goes to dc[q] - xzp for q in [q0[c], q1[c]).  The even bytes are the low halves of the
 * 16-bit words, the odd ones the high halves.  The masks of the row's 32-column steps are the same
 * for every row: made once (cuvil_qdw_row2_masks) for rows of up to CUVIL_QDW_ROW2_STEPS steps. */
#define CUVIL_QDW_ROW2_STEPS 8
typedef struct cuvil_qdw_row2 {
    int64_t qs0, steps;
    __mmask64 kb[CUVIL_QDW_ROW2_STEPS];
    __mmask32 k0[CUVIL_QDW_ROW2_STEPS], k1[CUVIL_QDW_ROW2_STEPS];
} cuvil_qdw_row2;

/* The masks of every step, or 0 when the row has more steps than they hold. */
static inline int cuvil_qdw_row2_masks(cuvil_qdw_row2 *m, int64_t clo, int64_t chi, const int64_t q0[2],
                                       const int64_t q1[2]) {
    const int64_t qe = q1[0] > q1[1] ? q1[0] : q1[1];
    m->qs0 = clo / 2;
    m->steps = qe > m->qs0 ? (qe - m->qs0 + 31) / 32 : 0;
    if (m->steps > CUVIL_QDW_ROW2_STEPS) return 0;
    for (int64_t s = 0; s < m->steps; s++) {
        const int64_t qs = m->qs0 + 32 * s;
        m->kb[s] = (__mmask64)cuvil_qdw_bits(clo - 2 * qs, chi - 2 * qs);
        m->k0[s] = (__mmask32)cuvil_qdw_bits(q0[0] - qs, q1[0] - qs);
        m->k1[s] = (__mmask32)cuvil_qdw_bits(q0[1] - qs, q1[1] - qs);
    }
    return 1;
}

static inline __attribute__((always_inline)) void cuvil_qdw_row2_step(int16_t *d0, int16_t *d1, const uint8_t *src,
                                                                     int x_signed, __m512i z, int64_t qs,
                                                                     __mmask64 kb, __mmask32 k0, __mmask32 k1) {
    const __m512i b = _mm512_maskz_loadu_epi8(kb, src + 2 * qs);
    const __m512i ev = x_signed ? _mm512_srai_epi16(_mm512_slli_epi16(b, 8), 8) : _mm512_and_si512(b, _mm512_set1_epi16(0xff));
    const __m512i od = x_signed ? _mm512_srai_epi16(b, 8) : _mm512_srli_epi16(b, 8);
    _mm512_mask_storeu_epi16(d0 + qs, k0, _mm512_sub_epi16(ev, z));
    _mm512_mask_storeu_epi16(d1 + qs, k1, _mm512_sub_epi16(od, z));
}

static inline __attribute__((always_inline)) void cuvil_qdw_row2_avx512(int16_t *d0, int16_t *d1, const uint8_t *src,
                                                                       int x_signed, int64_t clo, int64_t chi,
                                                                       const int64_t q0[2], const int64_t q1[2],
                                                                       const cuvil_qdw_row2 *m, int32_t xzp) {
    const __m512i z = _mm512_set1_epi16((int16_t)xzp);
    if (m) {
        for (int64_t s = 0; s < m->steps; s++)
            cuvil_qdw_row2_step(d0, d1, src, x_signed, z, m->qs0 + 32 * s, m->kb[s], m->k0[s], m->k1[s]);
        return;
    }
    const int64_t qe = q1[0] > q1[1] ? q1[0] : q1[1];
    for (int64_t qs = clo / 2; qs < qe; qs += 32)
        cuvil_qdw_row2_step(d0, d1, src, x_signed, z, qs, (__mmask64)cuvil_qdw_bits(clo - 2 * qs, chi - 2 * qs),
                            (__mmask32)cuvil_qdw_bits(q0[0] - qs, q1[0] - qs),
                            (__mmask32)cuvil_qdw_bits(q0[1] - qs, q1[1] - qs));
}
#endif

/* One (image, output channel).  The padded plane (every row and column a tap reads) is split into
 * sh * sw phases by row and column remainder modulo the strides, so every tap reads one phase at
 * unit stride: output (oy, ox) of tap (ky, kx) is element (oy + ky*dh / sh, ox + kx*dw / sw) of
 * phase (ky*dh % sh, kx*dw % sw).  Rows of sums are PWp apart, so each tap is one long
 * multiply-add over (OH - 1) * PWp + OW sums; the columns past OW are ignored. */
static void cuvil_qdw_task(void *ctx, int64_t task, int tid) {
    const cuvil_qdw_job *j = (const cuvil_qdw_job *)ctx;
    const cuvil_conv_geom *g = j->g;
    const int64_t H = g->in[0], W = g->in[1], OH = g->out[0], OW = g->out[1];
    const int64_t sh = g->stride[0], sw = g->stride[1];
    const int64_t PHp = j->PHp, PWp = j->PWp, phase = PHp * PWp, mg = g->cout / g->group;
    const int64_t b = task / g->cout, oc = task % g->cout, ic = oc / mg;
    int16_t *restrict plane = (int16_t *)(j->scratch + (size_t)tid * j->per_thread);
    const int64_t planes = (sh * sw * phase + CUVIL_QDW_SLACK + 31) / 32 * 32;
    int32_t *restrict acc = (int32_t *)(plane + planes);
    /* no clearing: the scratch was zeroed once, and every task of the call writes the same plane
       elements (the input's), so the padding and the slack stay zero */
    const int64_t pt = g->pad[0], pl = g->pad[1];
    int64_t clo, chi; /* padded columns that hold input: pl <= px < pl + W, within the plane */
    cuvil_conv_valid(-pl, 1, W, sw * PWp, &clo, &chi);
    const int64_t base = (b * g->cin + ic) * H * W;
#if defined(__AVX512BW__)
    if (sh == 1 && sw == 1) { /* one phase: each input row is one run of the plane, no index arithmetic */
        const int64_t rows = H < PHp - pt ? H : PHp - pt;
        for (int64_t iy = 0; iy < rows && chi > clo; iy++)
            cuvil_qdw_row_avx512(plane + (iy + pt) * PWp + clo, (const uint8_t *)j->x + base + iy * W + clo - pl,
                                 j->x_signed, 1, chi - clo, j->xzp);
    } else if (sw == 2) { /* both column phases of a row at once */
        int64_t q0[2], q1[2];
        for (int64_t c0 = 0; c0 < 2; c0++) {
            q0[c0] = clo > c0 ? (clo - c0 + 1) / 2 : 0;
            q1[c0] = chi > c0 ? (chi - c0 + 1) / 2 : 0;
        }
        cuvil_qdw_row2 masks;
        const cuvil_qdw_row2 *m = cuvil_qdw_row2_masks(&masks, clo, chi, q0, q1) ? &masks : NULL;
        int64_t pr = pt % sh, pq = pt / sh;
        for (int64_t iy = 0; iy < H && pq < PHp && chi > clo; iy++, pr = pr + 1 < sh ? pr + 1 : 0, pq += pr == 0)
            cuvil_qdw_row2_avx512(plane + pr * 2 * phase + pq * PWp, plane + (pr * 2 + 1) * phase + pq * PWp,
                                  (const uint8_t *)j->x + base + iy * W - pl, j->x_signed, clo, chi, q0, q1, m, j->xzp);
    } else
#elif defined(__AVX2__)
    if (sh == 1 && sw == 1) { /* one phase: each input row is one run of the plane */
        const int64_t rows = H < PHp - pt ? H : PHp - pt;
        for (int64_t iy = 0; iy < rows && chi > clo; iy++)
            cuvil_qdw_row_avx2(plane + (iy + pt) * PWp + clo, (const uint8_t *)j->x + base + iy * W + clo - pl,
                               j->x_signed, chi - clo, j->xzp);
    } else if (sw == 2) { /* both column phases of a row at once */
        int64_t q0[2], q1[2];
        for (int64_t c0 = 0; c0 < 2; c0++) {
            q0[c0] = clo > c0 ? (clo - c0 + 1) / 2 : 0;
            q1[c0] = chi > c0 ? (chi - c0 + 1) / 2 : 0;
        }
        int64_t pr = pt % sh, pq = pt / sh;
        for (int64_t iy = 0; iy < H && pq < PHp && chi > clo; iy++, pr = pr + 1 < sh ? pr + 1 : 0, pq += pr == 0)
            cuvil_qdw_row2_avx2(plane + pr * 2 * phase + pq * PWp, plane + (pr * 2 + 1) * phase + pq * PWp,
                                (const uint8_t *)j->x + base + iy * W - pl, j->x_signed, clo, chi, q0, q1, j->xzp);
    } else
#endif
    for (int64_t c0 = 0; c0 < sw; c0++) { /* column phase c0: px = q * sw + c0 */
        const int64_t q0 = clo > c0 ? (clo - c0 + sw - 1) / sw : 0, q1 = chi > c0 ? (chi - c0 + sw - 1) / sw : 0;
        if (q1 <= q0) continue;
        int64_t pr = pt % sh, pq = pt / sh; /* padded row iy + pt: row pq of row phase pr */
        for (int64_t iy = 0; iy < H && pq < PHp; iy++, pr = pr + 1 < sh ? pr + 1 : 0, pq += pr == 0) {
            int16_t *restrict d = plane + (pr * sw + c0) * phase + pq * PWp;
            const int64_t s0 = base + iy * W + c0 - pl; /* input column of q = 0, read only for q >= q0 */
            const int32_t xzp = j->xzp;
#if defined(__AVX512BW__)
            if (sw <= 2) {
                cuvil_qdw_row_avx512(d + q0, (const uint8_t *)j->x + s0 + q0 * sw, j->x_signed, sw, q1 - q0, xzp);
                continue;
            }
#endif
            if (j->x_signed) {
                const int8_t *src = (const int8_t *)j->x + s0;
                if (sw == 1) /* constant strides, loops of their own so that they vectorize */
                    for (int64_t q = q0; q < q1; q++) d[q] = (int16_t)((int32_t)src[q] - xzp);
                else if (sw == 2)
                    for (int64_t q = q0; q < q1; q++) d[q] = (int16_t)((int32_t)src[2 * q] - xzp);
                else
                    for (int64_t q = q0; q < q1; q++) d[q] = (int16_t)((int32_t)src[q * sw] - xzp);
            } else {
                const uint8_t *src = (const uint8_t *)j->x + s0;
                if (sw == 1)
                    for (int64_t q = q0; q < q1; q++) d[q] = (int16_t)((int32_t)src[q] - xzp);
                else if (sw == 2)
                    for (int64_t q = q0; q < q1; q++) d[q] = (int16_t)((int32_t)src[2 * q] - xzp);
                else
                    for (int64_t q = q0; q < q1; q++) d[q] = (int16_t)((int32_t)src[q * sw] - xzp);
            }
        }
    }
    const int64_t n = (OH - 1) * PWp + OW;
#if defined(__AVX512BW__)
    cuvil_qdw_taps_avx512(j, plane, oc, n, acc);
#elif defined(__AVX2__)
    cuvil_qdw_taps_avx2(j, plane, oc, n, acc);
#else
    const int32_t wz = j->wzp[oc * j->wzstep];
    const int64_t KH = g->k[0], KW = g->k[1];
    for (int64_t i = 0; i < n; i++) acc[i] = 0;
    for (int64_t ky = 0; ky < KH; ky++)
        for (int64_t kx = 0; kx < KW; kx++) {
            const int64_t t = oc * KH * KW + ky * KW + kx;
            const int32_t wv = (j->w_signed ? (int32_t)((const int8_t *)j->w)[t] : (int32_t)((const uint8_t *)j->w)[t]) - wz;
            const uint32_t wt = (uint32_t)wv;
            const int16_t *restrict src = plane + j->toff[ky * KW + kx];
            for (int64_t i = 0; i < n; i++) acc[i] = (int32_t)((uint32_t)acc[i] + (uint32_t)(int32_t)src[i] * wt);
        }
#endif
    const int64_t y0 = (b * g->cout + oc) * OH * OW;
#if defined(__AVX512BW__)
    if (!j->out->y32) { /* the whole run at once (fuller vectors than row by row), then its rows */
        const cuvil_qg_output *o = j->out;
        uint8_t *run = (uint8_t *)(acc + OH * PWp + CUVIL_QDW_SLACK);
        cuvil_qconv_req_avx512(o, o->mult[oc * o->mult_rs], o->bias ? o->bias[oc * o->bias_rs] : 0, acc, n, run);
        uint8_t *y = (uint8_t *)o->yq + y0;
        if (OW <= 64) { /* short rows: one masked move each */
            const __mmask64 km = OW == 64 ? ~(__mmask64)0 : (((__mmask64)1 << OW) - 1);
            for (int64_t oy = 0; oy < OH; oy++)
                _mm512_mask_storeu_epi8(y + oy * OW, km, _mm512_maskz_loadu_epi8(km, run + oy * PWp));
        } else
            for (int64_t oy = 0; oy < OH; oy++) memcpy(y + oy * OW, run + oy * PWp, (size_t)OW);
        return;
    }
#elif defined(__AVX2__)
    if (!j->out->y32) { /* the whole run at once, then its rows */
        const cuvil_qg_output *o = j->out;
        uint8_t *run = (uint8_t *)(acc + OH * PWp + CUVIL_QDW_SLACK);
        cuvil_qconv_req_avx2(o, o->mult[oc * o->mult_rs], o->bias ? o->bias[oc * o->bias_rs] : 0, acc, n, run, 1);
        uint8_t *y = (uint8_t *)o->yq + y0;
        for (int64_t oy = 0; oy < OH; oy++) cuvil_qcopy(y + oy * OW, run + oy * PWp, OW);
        return;
    }
#endif
    for (int64_t oy = 0; oy < OH; oy++) cuvil_qconv_store(j->out, oc, acc + oy * PWp, OW, y0 + oy * OW);
}

#if defined(__AVX2__) && !defined(__AVX512BW__)
/* ---- depthwise on small planes: channels in vector lanes --------------------------------------
 * Planes of at most CUVIL_QDWC_MAXP outputs spend more on per-channel setup than on sums, so there the
 * channels go in the lanes, as an NHWC kernel has them: per block of 16 channels, the image is
 * transposed into a padded [PHt][PWt][16] block of raw bytes (padding: the zero point's byte), each
 * output pixel sums its tap pairs for the 16 channels with vpmaddwd against the channels' weight
 * pairs, the zero point's share (xzp times the sum of the channel's weights) is taken off with the
 * bias, and the requantized bytes are transposed back.  The same integers as the planar path. */
#define CUVIL_QDWC_MAXP 256
#ifndef CUVIL_QDWC /* -DCUVIL_QDWC=0: the planar path for every plane, to compare against */
#define CUVIL_QDWC 1
#endif

/* 16 rows of 16 bytes (r[i]) transposed in place: r[i] byte j becomes r[j] byte i. */
static inline __attribute__((always_inline)) void cuvil_t16x16(__m128i r[16]) {
    __m128i a[16];
    for (int i = 0; i < 8; i++) {
        a[i] = _mm_unpacklo_epi8(r[2 * i], r[2 * i + 1]);
        a[i + 8] = _mm_unpackhi_epi8(r[2 * i], r[2 * i + 1]);
    }
    /* a[i] (i < 8): rows 2i, 2i+1 interleaved, columns 0-7; a[i + 8]: columns 8-15 */
    __m128i b[16];
    for (int h = 0; h < 2; h++)
        for (int i = 0; i < 4; i++) {
            b[h * 8 + i] = _mm_unpacklo_epi16(a[h * 8 + 2 * i], a[h * 8 + 2 * i + 1]);
            b[h * 8 + i + 4] = _mm_unpackhi_epi16(a[h * 8 + 2 * i], a[h * 8 + 2 * i + 1]);
        }
    /* b[h*8 + i] (i < 4): rows 4i..4i+3, columns h*8 + 0..3; b[h*8 + i + 4]: columns h*8 + 4..7 */
    __m128i c[16];
    for (int q = 0; q < 4; q++)
        for (int i = 0; i < 2; i++) {
            c[q * 4 + i] = _mm_unpacklo_epi32(b[q * 4 + 2 * i], b[q * 4 + 2 * i + 1]);
            c[q * 4 + i + 2] = _mm_unpackhi_epi32(b[q * 4 + 2 * i], b[q * 4 + 2 * i + 1]);
        }
    /* c[q*4 + i] (i < 2): rows 8i..8i+7, columns q*4 + 0..1; c[q*4 + i + 2]: columns q*4 + 2..3 */
    for (int q = 0; q < 8; q++) {
        r[2 * q] = _mm_unpacklo_epi64(c[q * 2], c[q * 2 + 1]);
        r[2 * q + 1] = _mm_unpackhi_epi64(c[q * 2], c[q * 2 + 1]);
    }
}

typedef struct cuvil_qdwc_job {
    const cuvil_qdw_job *j;
    int64_t PHt, PWt, C, np, b;
    const int64_t *toff; /* per tap, its offset in a block's padded image (pixels) */
    const int32_t *wv;   /* per block and pair, the 16 channels' weight pairs in lane order */
    const int32_t *corr; /* per channel: bias - xzp * (sum of its weights) */
    const float *mult;   /* per channel */
    uint8_t *img, *res;  /* per block: the padded image and the requantized outputs */
} cuvil_qdwc_job;

/* The lanes unpack{lo,hi}_epi16 put in the low and high 8-lane vectors: channels {0-3, 8-11} and
 * {4-7, 12-15}; vperm2i128 puts sums back in order. */
static const int cuvil_qdwc_lane[16] = {0, 1, 2, 3, 8, 9, 10, 11, 4, 5, 6, 7, 12, 13, 14, 15};

typedef struct cuvil_qdwc_sums {
    const uint8_t *img;
    const int64_t *toff;
    const int32_t *wv;
    __m256i k0, k1;
    __m256 m0, m1, lo, hi;
    __m256i zp;
    int nan, out_signed;
} cuvil_qdwc_sums;

/* Every output pixel of one block: its np tap pairs summed for the 16 channels, requantized into
 * res (16 bytes a pixel); np and x_signed constants where inlined. */
static inline __attribute__((always_inline)) void cuvil_qdwc_rows(const cuvil_qdwc_sums *u, const cuvil_conv_geom *g,
                                                                  int64_t PWt, uint8_t *res, int64_t np, int x_signed) {
    const int64_t OH = g->out[0], OW = g->out[1], sh = g->stride[0], sw = g->stride[1];
    for (int64_t oy = 0; oy < OH; oy++)
        for (int64_t ox = 0; ox < OW; ox++) {
            const uint8_t *base = u->img + (oy * sh * PWt + ox * sw) * 16;
            __m256i sl = _mm256_setzero_si256(), shv = _mm256_setzero_si256();
            for (int64_t p = 0; p < np; p++) {
                const __m128i ba = _mm_loadu_si128((const __m128i *)(base + u->toff[2 * p] * 16));
                const __m128i bb = _mm_loadu_si128((const __m128i *)(base + u->toff[2 * p + 1] * 16));
                const __m256i xa = x_signed ? _mm256_cvtepi8_epi16(ba) : _mm256_cvtepu8_epi16(ba);
                const __m256i xb = x_signed ? _mm256_cvtepi8_epi16(bb) : _mm256_cvtepu8_epi16(bb);
                sl = _mm256_add_epi32(sl, _mm256_madd_epi16(_mm256_unpacklo_epi16(xa, xb),
                                                            _mm256_loadu_si256((const __m256i *)(u->wv + p * 16))));
                shv = _mm256_add_epi32(shv, _mm256_madd_epi16(_mm256_unpackhi_epi16(xa, xb),
                                                              _mm256_loadu_si256((const __m256i *)(u->wv + p * 16 + 8))));
            }
            const __m256i a0 = _mm256_add_epi32(_mm256_permute2x128_si256(sl, shv, 0x20), u->k0);
            const __m256i a1 = _mm256_add_epi32(_mm256_permute2x128_si256(sl, shv, 0x31), u->k1);
            _mm_storeu_si128((__m128i *)(res + (oy * OW + ox) * 16),
                             cuvil_qreq16_avx2(a0, a1, u->m0, u->m1, u->lo, u->hi, u->zp, u->nan, u->out_signed));
        }
}

static void cuvil_qdwc_task(void *ctx, int64_t blk, int tid) {
    (void)tid;
    const cuvil_qdwc_job *d = (const cuvil_qdwc_job *)ctx;
    const cuvil_qdw_job *j = d->j;
    const cuvil_conv_geom *g = j->g;
    const int64_t H = g->in[0], W = g->in[1], OH = g->out[0], OW = g->out[1], HW = H * W, P = OH * OW;
    const int64_t PHt = d->PHt, PWt = d->PWt, c0 = blk * 16, nc = d->C - c0 < 16 ? d->C - c0 : 16;
    const int64_t pt = g->pad[0], pl = g->pad[1];
    uint8_t *img = d->img + blk * PHt * PWt * 16, *res = d->res + blk * (P + 16) * 16;
    const uint8_t *x = (const uint8_t *)j->x + (d->b * d->C + c0) * HW;
    memset(img, (uint8_t)j->xzp, (size_t)(PHt * PWt * 16));
    /* the image in: 16 pixels of the 16 channels at a time */
    int64_t iy = 0, ix = 0; /* the input position of pixel p0 */
    for (int64_t p0 = 0; p0 < HW; p0 += 16) {
        const int64_t np = HW - p0 < 16 ? HW - p0 : 16;
        __m128i r[16];
        if (nc == 16 && np == 16) {
            for (int k = 0; k < 16; k++) r[k] = _mm_loadu_si128((const __m128i *)(x + k * HW + p0));
        } else {
            for (int k = 0; k < 16; k++) {
                uint8_t buf[16] = {0};
                if (k < nc) memcpy(buf, x + k * HW + p0, (size_t)np);
                r[k] = _mm_loadu_si128((const __m128i *)buf);
            }
        }
        cuvil_t16x16(r);
        for (int64_t i = 0; i < np; i++) {
            const int64_t py = iy + pt, px = ix + pl;
            if (py >= 0 && py < PHt && px >= 0 && px < PWt) _mm_storeu_si128((__m128i *)(img + (py * PWt + px) * 16), r[i]);
            if (++ix == W) ix = 0, iy++;
        }
    }
    /* the sums of each output pixel, requantized */
    const int32_t *wv = d->wv + blk * d->np * 16;
    const __m256i k0 = _mm256_loadu_si256((const __m256i *)(d->corr + c0)), k1 = _mm256_loadu_si256((const __m256i *)(d->corr + c0 + 8));
    const __m256 m0 = _mm256_loadu_ps(d->mult + c0), m1 = _mm256_loadu_ps(d->mult + c0 + 8);
    const cuvil_qg_output *o = j->out;
    const __m256 lo = _mm256_set1_ps((float)(o->lo - o->zp)), hi = _mm256_set1_ps((float)(o->hi - o->zp));
    const __m256i zp = _mm256_set1_epi32(o->zp);
    const int nan = cuvil_qnonfinite(d->mult + c0, 16, 1);
    const cuvil_qdwc_sums sums = {img, d->toff, wv, k0, k1, m0, m1, lo, hi, zp, nan, o->yq_signed};
    if (d->np == 5)
        j->x_signed ? cuvil_qdwc_rows(&sums, g, PWt, res, 5, 1) : cuvil_qdwc_rows(&sums, g, PWt, res, 5, 0);
    else
        j->x_signed ? cuvil_qdwc_rows(&sums, g, PWt, res, d->np, 1) : cuvil_qdwc_rows(&sums, g, PWt, res, d->np, 0);
    /* the outputs out: 16 pixels of the 16 channels at a time */
    uint8_t *y = (uint8_t *)o->yq + (d->b * d->C + c0) * P;
    for (int64_t p0 = 0; p0 < P; p0 += 16) {
        const int64_t np = P - p0 < 16 ? P - p0 : 16;
        __m128i r[16];
        for (int k = 0; k < 16; k++) r[k] = _mm_loadu_si128((const __m128i *)(res + (p0 + k) * 16));
        cuvil_t16x16(r);
        for (int64_t k = 0; k < nc; k++) {
            if (np == 16) {
                _mm_storeu_si128((__m128i *)(y + k * P + p0), r[k]);
            } else {
                uint8_t buf[16];
                _mm_storeu_si128((__m128i *)buf, r[k]);
                memcpy(y + k * P + p0, buf, (size_t)np);
            }
        }
    }
}

/* The path above for job `j` (one pass of tap pairs, cout == cin, bytes out): 0, or -1 when memory
 * cannot be had. */
static int cuvil_qdw_channels(const cuvil_qdw_job *j) {
    const cuvil_conv_geom *g = j->g;
    const int64_t C = g->cout, nb = (C + 15) / 16, Cp = nb * 16, np = j->npairs, P = g->out[0] * g->out[1];
    const int64_t taps = g->k[0] * g->k[1];
    cuvil_qdwc_job d;
    d.j = j, d.C = C, d.np = np;
    d.PHt = (g->out[0] - 1) * g->stride[0] + (g->k[0] - 1) * g->dil[0] + 1;
    d.PWt = (g->out[1] - 1) * g->stride[1] + (g->k[1] - 1) * g->dil[1] + 1;
    const size_t img = (size_t)(nb * d.PHt * d.PWt * 16), res = (size_t)(nb * (P + 16) * 16);
    const size_t head = sizeof(int64_t) * (size_t)(2 * np) + sizeof(int32_t) * (size_t)(np * Cp + Cp) +
                        sizeof(float) * (size_t)Cp; /* toff, wv, corr, mult */
    char *mem = (char *)malloc(head + img + res);
    if (!mem) return -1;
    int64_t *toff = (int64_t *)mem;
    int32_t *wv = (int32_t *)(toff + 2 * np), *corr = wv + np * Cp;
    float *mult = (float *)(corr + Cp);
    d.img = (uint8_t *)(mult + Cp), d.res = d.img + img;
    /* the pairs' taps as pixel offsets in the padded image (an odd last tap paired with itself) */
    for (int64_t t = 0; t < 2 * np; t++) {
        const int64_t tt = t < taps ? t : taps - 1;
        toff[t] = (tt / g->k[1]) * g->dil[0] * d.PWt + (tt % g->k[1]) * g->dil[1];
    }
    const cuvil_qg_output *o = j->out;
    for (int64_t c = 0; c < Cp; c++) {
        uint32_t wsum = 0;
        for (int64_t p = 0; p < np; p++) {
            const uint32_t v = c < C ? (uint32_t)j->wpair[c * np + p] : 0u;
            wsum += (uint32_t)(int32_t)(int16_t)(v & 0xffffu) + (uint32_t)(int32_t)(int16_t)(v >> 16);
        }
        corr[c] = c < C ? (int32_t)((o->bias ? (uint32_t)o->bias[c * o->bias_rs] : 0u) - (uint32_t)j->xzp * wsum) : 0;
        mult[c] = c < C ? o->mult[c * o->mult_rs] : 0.0f;
    }
    for (int64_t blk = 0; blk < nb; blk++)
        for (int64_t p = 0; p < np; p++)
            for (int k = 0; k < 16; k++) {
                const int64_t c = blk * 16 + cuvil_qdwc_lane[k];
                wv[(blk * np + p) * 16 + k] = c < C ? j->wpair[c * np + p] : 0;
            }
    d.toff = toff, d.wv = wv, d.corr = corr, d.mult = mult;
    const int64_t work = nb * 16 * P * taps;
    for (int64_t b = 0; b < g->batch; b++) {
        d.b = b;
        if (work >= CUVIL_QG_PAR_MIN && nb > 1)
            cuvil_parallel_for(nb, cuvil_qdwc_task, &d);
        else
            for (int64_t blk = 0; blk < nb; blk++) cuvil_qdwc_task(&d, blk, 0);
    }
    free(mem);
    return 0;
}
#endif

/* The depthwise path (2-D, cin == group): returns 0, or -1 when memory cannot be had. */
static int cuvil_qconv_depthwise(const cuvil_conv_geom *g, const void *x, int x_signed, int32_t xzp, const void *w,
                                 int w_signed, const int32_t *wzp, int64_t wzstep, const cuvil_qg_output *out) {
    cuvil_qdw_job j;
    j.g = g, j.x = x, j.x_signed = x_signed, j.xzp = xzp, j.w = w, j.w_signed = w_signed, j.wzp = wzp;
    j.wzstep = wzstep, j.out = out;
    const int64_t sh = g->stride[0], sw = g->stride[1];
    const int64_t PH = (g->out[0] - 1) * sh + (g->k[0] - 1) * g->dil[0] + 1;
    const int64_t PW = (g->out[1] - 1) * sw + (g->k[1] - 1) * g->dil[1] + 1;
    j.PHp = (PH + sh - 1) / sh, j.PWp = (PW + sw - 1) / sw;
    const int64_t planes = (sh * sw * j.PHp * j.PWp + CUVIL_QDW_SLACK + 31) / 32 * 32;
    const int64_t sums = g->out[0] * j.PWp + CUVIL_QDW_SLACK;
    j.per_thread = (size_t)planes * sizeof(int16_t) + (size_t)sums * (sizeof(int32_t) + 1);
    j.per_thread = (j.per_thread + CUVIL_ALIGN - 1) / CUVIL_ALIGN * CUVIL_ALIGN;
    /* tap (ky, kx) reads output (oy, ox)'s input at (oy + ky*dh / sh, ox + kx*dw / sw) of phase
       (ky*dh % sh, kx*dw % sw): one offset into the plane, the same for every channel */
    const int64_t taps = g->k[0] * g->k[1], phase = j.PHp * j.PWp, npairs = cuvil_qdw_npairs(taps);
    int64_t *toff = (int64_t *)malloc(sizeof(int64_t) * (size_t)(taps + 2 * npairs));
    if (!toff) return -1;
    for (int64_t t = 0; t < taps; t++) {
        const int64_t ry = t / g->k[1] * g->dil[0], rx = t % g->k[1] * g->dil[1];
        toff[t] = ((ry % sh) * sw + rx % sw) * phase + (ry / sh) * j.PWp + rx / sw;
    }
    /* the pairs' offsets, pass after pass: an odd last tap is paired with itself (weight 0) */
    int64_t *poff = toff + taps, q = 0;
    for (int64_t t0 = 0; t0 < taps; t0 += CUVIL_QDW_MAXT) {
        const int64_t nt = taps - t0 < CUVIL_QDW_MAXT ? taps - t0 : CUVIL_QDW_MAXT;
        for (int64_t t = 0; t < (nt + 1) / 2 * 2; t++) poff[q++] = toff[t0 + (t < nt ? t : nt - 1)];
    }
    j.toff = toff, j.poff = poff, j.npairs = npairs, j.wpair = NULL;
    int32_t *wown = NULL;
#if defined(__AVX2__)
    /* the weight pairs: cached with the model when the weights are constants and their zero points
       all 0 (symmetric weights; zero points come in a per-call buffer, so other values are not a
       key the cache can trust), else made for this call */
    const cuvil_qdw_pair_args pa = {w, w_signed, wzp, wzstep, g->cout, taps};
    const size_t pbytes = sizeof(int32_t) * (size_t)(g->cout * npairs);
    int zero_wz = 1;
    for (int64_t c = 0; c < (wzstep ? g->cout : 1); c++) zero_wz &= wzp[c * wzstep] == 0;
    if (zero_wz && cuvil_is_constant(w, (size_t)(g->cout * taps))) {
        const int64_t key[CUVIL_CACHE_KEY] = {0x51445750, g->cout, taps, w_signed, 0, 0, 0, 0};
        j.wpair = (const int32_t *)cuvil_cache_get(w, key, pbytes, cuvil_qdw_pairs_build, &pa);
    }
    if (!j.wpair) {
        wown = (int32_t *)malloc(pbytes);
        if (!wown) {
            free(toff);
            return -1;
        }
        cuvil_qdw_pairs_build(wown, &pa);
        j.wpair = wown;
    }
#endif
#if defined(__AVX2__) && !defined(__AVX512BW__)
    if (CUVIL_QDWC && !out->y32 && g->cout == g->cin && taps <= CUVIL_QDW_MAXT &&
        g->out[0] * g->out[1] <= CUVIL_QDWC_MAXP) {
        const int rc = cuvil_qdw_channels(&j);
        free(wown);
        free(toff);
        return rc;
    }
#endif
    const int64_t ntasks = g->batch * g->cout, work = ntasks * g->out[0] * g->out[1] * g->k[0] * g->k[1];
    const int par = work >= CUVIL_QG_PAR_MIN && ntasks > 1;
    const int nt = par ? cuvil_num_threads_now() : 1;
    j.scratch = (char *)aligned_alloc(CUVIL_ALIGN, j.per_thread * (size_t)nt);
    if (!j.scratch) {
        free(wown);
        free(toff);
        return -1;
    }
    memset(j.scratch, 0, j.per_thread * (size_t)nt); /* the planes' padding and slack, for the whole call */
    if (par)
        cuvil_parallel_for(ntasks, cuvil_qdw_task, &j);
    else
        for (int64_t t = 0; t < ntasks; t++) cuvil_qdw_task(&j, t, 0);
    free(wown);
    free(j.scratch);
    free(toff);
    return 0;
}

/* ---- im2col + GEMM ----------------------------------------------------------------------------- */

/* x: [cg, in...] bytes -> cols: [cg * taps, P], positions outside the input get `pad`. */
typedef struct cuvil_qim2col_job {
    const cuvil_conv_geom *g;
    const uint8_t *x;
    uint8_t pad;
    uint8_t *cols;
} cuvil_qim2col_job;

/* The rows of input channel c: one per tap, any number of spatial dims. */
static void cuvil_qim2col_nd(const cuvil_conv_geom *g, const uint8_t *x, int64_t c, uint8_t pad, uint8_t *cols) {
    const int nd = g->nsp;
    const int64_t taps = cuvil_conv_prod(g->k, nd), P = cuvil_conv_prod(g->out, nd), plane = cuvil_conv_prod(g->in, nd);
    for (int64_t t = 0; t < taps; t++) {
        int64_t tk[CUVIL_CONV_MAXD], rem = t;
        for (int d = nd - 1; d >= 0; d--) {
            tk[d] = rem % g->k[d];
            rem /= g->k[d];
        }
        uint8_t *restrict dst = cols + (c * taps + t) * P;
        int64_t oi[CUVIL_CONV_MAXD] = {0};
        for (int64_t p = 0; p < P; p++) {
            int64_t off = 0;
            int valid = 1;
            for (int d = 0; d < nd; d++) {
                const int64_t ii = oi[d] * g->stride[d] - g->pad[d] + tk[d] * g->dil[d];
                if (ii < 0 || ii >= g->in[d]) valid = 0;
                off = off * g->in[d] + ii;
            }
            dst[p] = valid ? x[c * plane + off] : pad;
            for (int d = nd - 1; d >= 0; d--) {
                if (++oi[d] < g->out[d]) break;
                oi[d] = 0;
            }
        }
    }
}

/* The 2-D case: each output row of a tap is a run of input bytes between two runs of padding. */
static void cuvil_qim2col_2d(const cuvil_conv_geom *g, const uint8_t *x, int64_t c, uint8_t pad, uint8_t *cols) {
    const int64_t H = g->in[0], W = g->in[1], OH = g->out[0], OW = g->out[1], KH = g->k[0], KW = g->k[1];
    const int64_t sw = g->stride[1], P = OH * OW;
    const uint8_t *xc = x + c * H * W;
    for (int64_t ky = 0; ky < KH; ky++)
        for (int64_t kx = 0; kx < KW; kx++) {
            uint8_t *restrict dst = cols + ((c * KH + ky) * KW + kx) * P;
            const int64_t bx = kx * g->dil[1] - g->pad[1];
            int64_t lo, hi;
            cuvil_conv_valid(bx, sw, W, OW, &lo, &hi);
            for (int64_t oy = 0; oy < OH; oy++) {
                uint8_t *restrict d = dst + oy * OW;
                const int64_t iy = oy * g->stride[0] - g->pad[0] + ky * g->dil[0];
                if (iy < 0 || iy >= H || hi <= lo) {
                    memset(d, pad, (size_t)OW);
                    continue;
                }
                const uint8_t *restrict s = xc + iy * W;
                /* inline copies: rows are short (7 to 112 bytes in common networks), where a library
                   call per run costs more than the copy */
                for (int64_t ox = 0; ox < lo; ox++) d[ox] = pad;
                if (sw == 1)
                    cuvil_qcopy(d + lo, s + bx + lo, hi - lo);
                else if (sw == 2)
                    for (int64_t ox = lo; ox < hi; ox++) d[ox] = s[bx + 2 * ox];
                else
                    for (int64_t ox = lo; ox < hi; ox++) d[ox] = s[bx + ox * sw];
                for (int64_t ox = hi; ox < OW; ox++) d[ox] = pad;
            }
        }
}

static void cuvil_qim2col_task(void *ctx, int64_t c, int tid) {
    (void)tid;
    const cuvil_qim2col_job *j = (const cuvil_qim2col_job *)ctx;
    if (j->g->nsp == 2)
        cuvil_qim2col_2d(j->g, j->x, c, j->pad, j->cols);
    else
        cuvil_qim2col_nd(j->g, j->x, c, j->pad, j->cols);
}

/* Y = conv(X - xzp, W - wzp): the depthwise kernel when it applies, else per image and group
 * cuvil_qgemm(W_g [mg, K], cols [K, P]); the output's channel parameters (bias, mult) are indexed
 * by row (absolute output channel); `y` is int32 (out->y32) or bytes (out->yq).  Returns 0, or
 * -1 when memory cannot be had. */
static CUVIL_UNUSED int cuvil_qconv(const cuvil_conv_geom *g, const void *x, int x_signed, int32_t xzp,
                                    const void *w, int w_signed, const int32_t *wzp, int64_t wzstep,
                                    const cuvil_qg_output *out) {
    const int nd = g->nsp;
    const int64_t taps = cuvil_conv_prod(g->k, nd), P = cuvil_conv_prod(g->out, nd), plane = cuvil_conv_prod(g->in, nd);
    const int64_t cg = g->cin / g->group, mg = g->cout / g->group, K = cg * taps;
    if (nd == 2 && cg == 1 && g->group > 1 && P > 0 && taps > 0)
        return cuvil_qconv_depthwise(g, x, x_signed, xzp, w, w_signed, wzp, wzstep, out);
    int direct = 1; /* a 1x1, unit-stride, unpadded convolution reads the image itself */
    for (int d = 0; d < nd; d++)
        if (g->k[d] != 1 || g->stride[d] != 1 || g->pad[d] != 0 || g->in[d] != g->out[d]) direct = 0;
    uint8_t *cols = NULL;
    if (!direct && K > 0 && P > 0) {
        cols = (uint8_t *)malloc((size_t)K * (size_t)P);
        if (!cols) return -1;
    }
    const int32_t xz[1] = {xzp};
    int rc = 0;
    for (int64_t b = 0; b < g->batch && rc == 0; b++)
        for (int64_t gi = 0; gi < g->group && rc == 0; gi++) {
            const uint8_t *xg = (const uint8_t *)x + (b * g->cin + gi * cg) * plane;
            if (cols) {
                cuvil_qim2col_job ij = {g, xg, (uint8_t)xzp, cols};
                if (K * P >= CUVIL_QG_PAR_MIN / 8 && cg > 1)
                    cuvil_parallel_for(cg, cuvil_qim2col_task, &ij);
                else
                    for (int64_t c = 0; c < cg; c++) cuvil_qim2col_task(&ij, c, 0);
            }
            const cuvil_qg_operand R = {(const uint8_t *)w + gi * mg * K, K, 1, w_signed, wzp + gi * mg * wzstep, wzstep};
            const cuvil_qg_operand C = {cols ? (const void *)cols : (const void *)xg, P, 1, x_signed, xz, 0};
            cuvil_qg_output o = *out;
            const int64_t y0 = (b * g->cout + gi * mg) * P;
            if (o.y32) o.y32 += y0;
            if (o.yq) o.yq = (uint8_t *)o.yq + y0;
            if (o.bias) o.bias += gi * mg * o.bias_rs;
            if (o.mult) o.mult += gi * mg * o.mult_rs;
            o.ldy = P;
            rc = cuvil_qgemm(mg, P, K, &R, &C, &o);
        }
    free(cols);
    return rc;
}

#endif /* CUVIL_QCONV_H */
