/* cuvil_lowbit.h: the low-bit storage types: int4, uint4, int2, uint2, the float8 formats
 * (e4m3fn, e4m3fnuz, e5m2, e5m2fnuz) and float4 e2m1.
 *
 * Every element is one byte holding its value in the low bits, as ml_dtypes keeps it; reading
 * ignores the higher bits, writing leaves them zero.  cuvil_from_<type> gives the value in the
 * type's compute type (int32_t, uint32_t or float, all exact); cuvil_to_<type> makes the byte.
 * The rules are cuvil/ops/lowbit.py's, bit for bit:
 *
 * - integers keep their low bits (two's complement wrap-around); a float goes through
 *   cuvil_lowbit_trunc first: truncated toward zero, 0 for NaN, infinities and magnitudes of 2^31
 *   or more;
 * - a float becomes a float8/float4 by rounding its float32 value to nearest even (a double is
 *   rounded to float32 first).  A result beyond the largest finite value, or an infinity, gives
 *   the largest finite value of its sign when saturating, else infinity (e5m2) or NaN (the
 *   formats without infinity); float4 always saturates.  NaN gives NaN (sign kept by e4m3fn and
 *   e5m2, 0x80 for the fnuz formats, which also have no negative zero); float4 has no NaN and
 *   gives +0.
 *
 * The conversions are integer operations on the float32 bits (no dependence on the rounding
 * mode), written once for all formats: the per-format wrappers pass constants, which the
 * compiler folds.
 */
#ifndef CUVIL_LOWBIT_H
#define CUVIL_LOWBIT_H

#include "cuvil_rt.h"

/* ---- integers ------------------------------------------------------------------------------ */

static inline int32_t cuvil_from_i4(uint8_t b) { return (int32_t)((b & 0xfu) ^ 0x8u) - 8; }
static inline uint32_t cuvil_from_u4(uint8_t b) { return b & 0xfu; }
static inline int32_t cuvil_from_i2(uint8_t b) { return (int32_t)((b & 0x3u) ^ 0x2u) - 2; }
static inline uint32_t cuvil_from_u2(uint8_t b) { return b & 0x3u; }
static inline uint8_t cuvil_to_i4(uint32_t v) { return (uint8_t)(v & 0xfu); }
static inline uint8_t cuvil_to_u4(uint32_t v) { return (uint8_t)(v & 0xfu); }
static inline uint8_t cuvil_to_i2(uint32_t v) { return (uint8_t)(v & 0x3u); }
static inline uint8_t cuvil_to_u2(uint32_t v) { return (uint8_t)(v & 0x3u); }

/* A float on its way to a 4- or 2-bit integer: the low 32 bits of its truncation (all that the
 * narrow type keeps), 0 where that is not defined by C. */
static inline uint32_t cuvil_lowbit_trunc(double x) {
    return fabs(x) < 2147483648.0 ? (uint32_t)(int32_t)x : 0u;
}

/* ---- float8 / float4 ----------------------------------------------------------------------- */

/* What a format has besides finite numbers. */
#define CUVIL_LB_IEEE 0 /* all-ones exponent: infinity (mantissa 0) and NaN (e5m2) */
#define CUVIL_LB_FN 1   /* S.1111.111 is NaN, no infinity (e4m3fn) */
#define CUVIL_LB_FNUZ 2 /* 0x80 is NaN, no infinity, no negative zero (e4m3fnuz, e5m2fnuz) */
#define CUVIL_LB_NONE 3 /* finite numbers only (float4 e2m1) */

static inline float cuvil_lowbit_bits_f32(uint32_t u) {
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* The value of the nbits-bit code b (1 sign bit, mbits mantissa bits, exponent bias bias). */
static inline float cuvil_lowbit_decode(uint32_t b, int nbits, int mbits, int bias, int kind) {
    b &= (1u << nbits) - 1u;
    const uint32_t sign = b >> (nbits - 1), mag = b & ((1u << (nbits - 1)) - 1u);
    const uint32_t e = mag >> mbits, m = mag & ((1u << mbits) - 1u);
    const uint32_t nan = 0x7fc00000u | sign << 31;
    if (kind == CUVIL_LB_FNUZ && b == 1u << (nbits - 1)) return cuvil_lowbit_bits_f32(0xffc00000u);
    if (kind == CUVIL_LB_FN && mag == (1u << (nbits - 1)) - 1u) return cuvil_lowbit_bits_f32(nan);
    if (kind == CUVIL_LB_IEEE && e == (1u << (nbits - 1 - mbits)) - 1u)
        return cuvil_lowbit_bits_f32(m ? nan : 0x7f800000u | sign << 31);
    float v;
    if (e == 0) /* subnormal: m units of 2^(1 - bias - mbits), a power of two float32 holds */
        v = (float)m * cuvil_lowbit_bits_f32((uint32_t)(127 + 1 - bias - mbits) << 23);
    else
        v = cuvil_lowbit_bits_f32((e + (uint32_t)(127 - bias)) << 23 | m << (23 - mbits));
    return sign ? -v : v;
}

/* The nbits-bit code of x rounded to nearest even; max_code is the largest finite magnitude's. */
static inline uint8_t cuvil_lowbit_encode(float x, int nbits, int mbits, int bias, int kind, uint32_t max_code,
                                          int saturate) {
    uint32_t u;
    memcpy(&u, &x, 4);
    const uint32_t sign = u >> 31, a = u & 0x7fffffffu;
    const uint32_t sbit = sign << (nbits - 1);
    if (a > 0x7f800000u) { /* NaN */
        if (kind == CUVIL_LB_FNUZ) return (uint8_t)(1u << (nbits - 1));
        if (kind == CUVIL_LB_FN) return (uint8_t)(sbit | ((1u << (nbits - 1)) - 1u));
        if (kind == CUVIL_LB_IEEE) return (uint8_t)(sbit | ((1u << (nbits - 1)) - 1u - 1u)); /* quiet: S.11111.10 */
        return 0;
    }
    uint32_t code;
    const int emin = 1 - bias; /* exponent of the smallest normal */
    if (a == 0x7f800000u) {
        code = max_code + 1u; /* overflows below */
    } else if (a < (uint32_t)(127 + emin) << 23) { /* below the smallest normal: units of 2^(emin - mbits) */
        if (a < 0x00800000u) {
            code = 0; /* zero or a float32 subnormal: far below half a unit */
        } else {
            const uint32_t e = a >> 23, m = (a & 0x7fffffu) | 0x800000u;
            const uint32_t shift = (uint32_t)(150 + emin - mbits) - e; /* x = m * 2^-shift units */
            if (shift > 24) {
                code = 0; /* below half a unit */
            } else {
                const uint32_t half = 1u << (shift - 1), rem = m & ((1u << shift) - 1u);
                code = m >> shift;
                if (rem > half || (rem == half && (code & 1u))) code++; /* may become the smallest normal */
            }
        }
    } else { /* normal: round the mantissa to mbits (a carry moves into the exponent), rebias */
        const uint32_t shift = (uint32_t)(23 - mbits);
        code = (a + (1u << (shift - 1)) - 1u + ((a >> shift) & 1u)) >> shift;
        code -= (uint32_t)(127 - bias) << mbits;
    }
    if (code > max_code) {
        if (saturate || kind == CUVIL_LB_NONE) code = max_code;
        else if (kind == CUVIL_LB_IEEE) code = max_code + 1u; /* the all-ones exponent: infinity */
        else if (kind == CUVIL_LB_FNUZ) return (uint8_t)(1u << (nbits - 1));
        else code = (1u << (nbits - 1)) - 1u; /* NaN */
    }
    if (kind == CUVIL_LB_FNUZ && code == 0) return 0; /* no negative zero */
    return (uint8_t)(sbit | code);
}

#define CUVIL_LOWBIT_FLOAT(name, nbits, mbits, bias, kind, max_code)                                          \
    static inline float cuvil_from_##name(uint8_t b) { return cuvil_lowbit_decode(b, nbits, mbits, bias, kind); } \
    static inline uint8_t cuvil_to_##name(float x, int saturate) {                                              \
        return cuvil_lowbit_encode(x, nbits, mbits, bias, kind, max_code, saturate);                            \
    }

CUVIL_LOWBIT_FLOAT(f8e4m3fn, 8, 3, 7, CUVIL_LB_FN, 0x7eu)      /* largest 448 */
CUVIL_LOWBIT_FLOAT(f8e4m3fnuz, 8, 3, 8, CUVIL_LB_FNUZ, 0x7fu)  /* 240 */
CUVIL_LOWBIT_FLOAT(f8e5m2, 8, 2, 15, CUVIL_LB_IEEE, 0x7bu)     /* 57344 */
CUVIL_LOWBIT_FLOAT(f8e5m2fnuz, 8, 2, 16, CUVIL_LB_FNUZ, 0x7fu) /* 57344 */
CUVIL_LOWBIT_FLOAT(f4e2m1, 4, 1, 1, CUVIL_LB_NONE, 0x7u)       /* 6 */

#undef CUVIL_LOWBIT_FLOAT

#endif /* CUVIL_LOWBIT_H */
