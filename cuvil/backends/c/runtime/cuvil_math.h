/* Cuvil C runtime: scalar math of the elementwise kernels.
 *
 * Each function is the defined-for-every-input version of one scalar
 * operation, written so that no input is undefined behaviour in C:
 *
 *  - integer division and remainder by zero give 0, and INT_MIN / -1 wraps
 *    (to INT_MIN; the remainder is 0), like the wrap-around of the other
 *    integer arithmetic;
 *  - float to integer conversion truncates toward zero, saturates values
 *    outside the target's range, and gives 0 for NaN;
 *  - max/min propagate NaN from either operand (NumPy's maximum/minimum).
 *
 * Suffixes name the C type computed in: _f float, _d double, _i32/_i64
 * signed, _u32/_u64 unsigned.  Everything is static inline and portable C11.
 */
#ifndef CUVIL_MATH_H
#define CUVIL_MATH_H

#include <math.h>
#include <stdint.h>
#include <string.h>

#include "cuvil_rt.h"
#include "cuvil_vmath.h" /* float32 exp, erf, erfc, sigmoid, GELU, tanh, log... that loops vectorise */

/* ---- NaN-propagating max/min ------------------------------------------- */

static inline float cuvil_max_f(float a, float b) { return (a > b || a != a) ? a : b; }
static inline float cuvil_min_f(float a, float b) { return (a < b || a != a) ? a : b; }
static inline double cuvil_max_d(double a, double b) { return (a > b || a != a) ? a : b; }
static inline double cuvil_min_d(double a, double b) { return (a < b || a != a) ? a : b; }

/* The same when b is known not to be NaN (a literal, a constant bound): a NaN a still comes
 * through, and equal operands still give b, in one compare and one select per element. */
static inline float cuvil_max_nn_f(float a, float b) { return a <= b ? b : a; }
static inline float cuvil_min_nn_f(float a, float b) { return a >= b ? b : a; }
static inline double cuvil_max_nn_d(double a, double b) { return a <= b ? b : a; }
static inline double cuvil_min_nn_d(double a, double b) { return a >= b ? b : a; }

/* ---- wrapping signed arithmetic (no signed overflow) -------------------- */

static inline int32_t cuvil_add_i32(int32_t a, int32_t b) { return (int32_t)((uint32_t)a + (uint32_t)b); }
static inline int32_t cuvil_sub_i32(int32_t a, int32_t b) { return (int32_t)((uint32_t)a - (uint32_t)b); }
static inline int32_t cuvil_mul_i32(int32_t a, int32_t b) { return (int32_t)((uint32_t)a * (uint32_t)b); }
static inline int32_t cuvil_neg_i32(int32_t a) { return (int32_t)(0u - (uint32_t)a); }
static inline int64_t cuvil_add_i64(int64_t a, int64_t b) { return (int64_t)((uint64_t)a + (uint64_t)b); }
static inline int64_t cuvil_sub_i64(int64_t a, int64_t b) { return (int64_t)((uint64_t)a - (uint64_t)b); }
static inline int64_t cuvil_mul_i64(int64_t a, int64_t b) { return (int64_t)((uint64_t)a * (uint64_t)b); }
static inline int64_t cuvil_neg_i64(int64_t a) { return (int64_t)(0u - (uint64_t)a); }

/* ---- integer division and remainder ------------------------------------ */

/* Truncating division; x / 0 = 0, INT_MIN / -1 = INT_MIN. */
static inline int32_t cuvil_div_i32(int32_t a, int32_t b) {
    if (b == 0) return 0;
    if (b == -1) return cuvil_neg_i32(a);
    return a / b;
}
static inline int64_t cuvil_div_i64(int64_t a, int64_t b) {
    if (b == 0) return 0;
    if (b == -1) return cuvil_neg_i64(a);
    return a / b;
}
static inline uint32_t cuvil_div_u32(uint32_t a, uint32_t b) { return b ? a / b : 0u; }
static inline uint64_t cuvil_div_u64(uint64_t a, uint64_t b) { return b ? a / b : 0u; }

/* Remainder of truncating division (sign of a, C's %); x % 0 = 0. */
static inline int32_t cuvil_fmod_i32(int32_t a, int32_t b) { return (b == 0 || b == -1) ? 0 : a % b; }
static inline int64_t cuvil_fmod_i64(int64_t a, int64_t b) { return (b == 0 || b == -1) ? 0 : a % b; }

/* Remainder of floor division (sign of b, Python's %); x mod 0 = 0. */
static inline int32_t cuvil_mod_i32(int32_t a, int32_t b) {
    if (b == 0 || b == -1) return 0;
    int32_t r = a % b;
    return (r != 0 && ((r < 0) != (b < 0))) ? r + b : r;
}
static inline int64_t cuvil_mod_i64(int64_t a, int64_t b) {
    if (b == 0 || b == -1) return 0;
    int64_t r = a % b;
    return (r != 0 && ((r < 0) != (b < 0))) ? r + b : r;
}
static inline uint32_t cuvil_mod_u32(uint32_t a, uint32_t b) { return b ? a % b : 0u; }
static inline uint64_t cuvil_mod_u64(uint64_t a, uint64_t b) { return b ? a % b : 0u; }

/* Float remainder of floor division (NumPy's mod): the sign of b; a zero result takes b's sign. */
static inline double cuvil_mod_d(double a, double b) {
    double r = fmod(a, b);
    if (b == 0) return r; /* NaN */
    if (r != 0) {
        if ((b < 0) != (r < 0)) r += b;
    } else {
        r = copysign(0.0, b);
    }
    return r;
}
static inline float cuvil_mod_f(float a, float b) {
    float r = fmodf(a, b);
    if (b == 0) return r;
    if (r != 0) {
        if ((b < 0) != (r < 0)) r += b;
    } else {
        r = copysignf(0.0f, b);
    }
    return r;
}

/* ---- integer power -------------------------------------------------------- */

/* a ** b modulo 2**64 for b >= 0; for b < 0, 1/a**|b| truncated: +-1 when |a| = 1, else 0. */
static inline int64_t cuvil_pow_i64(int64_t a, int64_t b) {
    if (b < 0) {
        if (a == 1) return 1;
        if (a == -1) return (b % 2 == 0) ? 1 : -1;
        return 0;
    }
    uint64_t base = (uint64_t)a, acc = 1u, e = (uint64_t)b;
    while (e) {
        if (e & 1u) acc *= base;
        base *= base;
        e >>= 1;
    }
    return (int64_t)acc;
}

/* ---- float to integer: truncate, saturate, NaN -> 0 ------------------------ */

static inline int8_t cuvil_f2i_i8(double x) {
    if (x != x) return 0;
    if (x >= 128.0) return INT8_MAX;
    if (x < -128.0) return INT8_MIN;
    return (int8_t)x;
}
static inline int16_t cuvil_f2i_i16(double x) {
    if (x != x) return 0;
    if (x >= 32768.0) return INT16_MAX;
    if (x < -32768.0) return INT16_MIN;
    return (int16_t)x;
}
static inline int32_t cuvil_f2i_i32(double x) {
    if (x != x) return 0;
    if (x >= 2147483648.0) return INT32_MAX;
    if (x < -2147483648.0) return INT32_MIN;
    return (int32_t)x;
}
static inline int64_t cuvil_f2i_i64(double x) {
    if (x != x) return 0;
    if (x >= 9223372036854775808.0) return INT64_MAX;
    if (x < -9223372036854775808.0) return INT64_MIN;
    return (int64_t)x;
}
static inline uint8_t cuvil_f2i_u8(double x) {
    if (x != x || x <= -1.0) return 0;
    if (x >= 256.0) return UINT8_MAX;
    return (uint8_t)x;
}
static inline uint16_t cuvil_f2i_u16(double x) {
    if (x != x || x <= -1.0) return 0;
    if (x >= 65536.0) return UINT16_MAX;
    return (uint16_t)x;
}
static inline uint32_t cuvil_f2i_u32(double x) {
    if (x != x || x <= -1.0) return 0;
    if (x >= 4294967296.0) return UINT32_MAX;
    return (uint32_t)x;
}
static inline uint64_t cuvil_f2i_u64(double x) {
    if (x != x || x <= -1.0) return 0;
    if (x >= 18446744073709551616.0) return UINT64_MAX;
    return (uint64_t)x;
}

/* ---- half precision from double, rounded once (to nearest, ties to even) -- */

static inline cuvil_f16 cuvil_f64_to_f16(double d) {
    uint64_t x;
    memcpy(&x, &d, 8);
    uint32_t sign = (uint32_t)(x >> 48) & 0x8000u;
    uint64_t absx = x & 0x7fffffffffffffffull;
    if (absx >= 0x7ff0000000000000ull) { /* inf or nan (kept quiet, top payload bits kept) */
        return (cuvil_f16)(sign | 0x7c00u | (absx > 0x7ff0000000000000ull ? 0x200u | (uint32_t)((absx >> 42) & 0x3ffu) : 0u));
    }
    int e = (int)(absx >> 52) - 1023;
    if (e >= 16) return (cuvil_f16)(sign | 0x7c00u); /* >= 2**16 rounds to inf */
    if (e < -25) return (cuvil_f16)sign;             /* below half the smallest subnormal (or a double subnormal) */
    uint64_t m = (absx & 0xfffffffffffffull) | (1ull << 52); /* value = m * 2**(e - 52) */
    int shift;
    uint32_t r;
    if (e >= -14) { /* normal: 10 stored mantissa bits; the implicit bit adds one to the biased exponent */
        shift = 42;
        r = ((uint32_t)(e + 14) << 10) + (uint32_t)(m >> 42);
    } else { /* subnormal: units of 2**-24 */
        shift = 28 - e;
        r = (uint32_t)(m >> shift);
    }
    uint64_t rem = m & ((1ull << shift) - 1u), half = 1ull << (shift - 1);
    if (rem > half || (rem == half && (r & 1u))) r++; /* a carry into the exponent is right, up to inf */
    return (cuvil_f16)(sign | r);
}

/* ---- activations used by more than one op ----------------------------------- */

/* 1 / (1 + exp(-x)); each branch exponentiates a non-positive number, so nothing overflows. */
static inline float cuvil_sigmoid_f(float x) {
    float e = expf(-fabsf(x));
    return x >= 0 ? 1.0f / (1.0f + e) : e / (1.0f + e);
}
static inline double cuvil_sigmoid_d(double x) {
    double e = exp(-fabs(x));
    return x >= 0 ? 1.0 / (1.0 + e) : e / (1.0 + e);
}

/* log(1 + exp(x)) = max(x, 0) + log1p(exp(-|x|)), without overflow; NaN stays NaN.  Inlined, so
 * that a loop over it vectorises (cuvil_vmath.h). */
CUVIL_VM_INLINE float cuvil_softplus_f(float x) {
    return cuvil_max_f(x, 0.0f) + cuvil_log1p_f(cuvil_exp_f(-fabsf(x)));
}
static inline double cuvil_softplus_d(double x) { return cuvil_max_d(x, 0.0) + log1p(exp(-fabs(x))); }

/* min(max(x, lo), hi) with NaN propagating (NumPy's clip). */
static inline float cuvil_clamp_f(float x, float lo, float hi) { return cuvil_min_f(cuvil_max_f(x, lo), hi); }
static inline double cuvil_clamp_d(double x, double lo, double hi) { return cuvil_min_d(cuvil_max_d(x, lo), hi); }

#endif /* CUVIL_MATH_H */
