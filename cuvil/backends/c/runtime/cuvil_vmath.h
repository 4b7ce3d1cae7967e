/* Cuvil C runtime: float32 exp, erf, erfc, sigmoid, GELU, tanh, expm1, log and log1p that loops can
 * vectorise.
 *
 * libm's expf / erff / erfcf are calls the compiler cannot vectorise (without -ffast-math and a
 * vector math library), so a loop applying them runs one element at a time: a GELU epilogue
 * cost five times the GEMM it finished.  The functions here are branch-free C11 (selects,
 * polynomials, a division, integer bit operations), so after inlining GCC and Clang vectorise a
 * loop over them for SSE, AVX, AVX-512 or wasm SIMD128 alike; no intrinsics, no target checks.
 * They give the same bits on every target (the build keeps -ffp-contract=off, so no
 * multiply-add is fused behind our back).
 *
 * The methods:
 *  - exp(y + d) * m: y rounded to n ln 2 + r (Cody-Waite, with the ln 2 of 9 bits so that
 *    y - n ln2_hi is exact), e^r by Cephes' degree-7 polynomial on |r| <= ln 2 / 2, and 2^n
 *    applied as two exact powers of two (2^(n/2) then the rest), so a result in the subnormal
 *    range is rounded once.  The extra term d carries the low part of an argument whose high
 *    part y is exact (below), and m a factor applied before the scaling.
 *  - erfc(a), a >= 0: exp(-a^2) erfcx(a) with erfcx(a) = erfc(a) exp(a^2) a rational of degree
 *    (4, 5) in a with positive coefficients (no cancellation in Horner's scheme), fitted for the
 *    least maximum relative error on [0, 10.5] (approximation error 6.2e-9).  exp(-a^2) is where
 *    the accuracy would go: one ulp of a^2 near 100 is 8e-6 relative in the result, so a is
 *    split into a 12-bit high part h (h^2 exact) and the rest, and -a^2 = -h^2 - (a - h)(a + h)
 *    goes to exp as y = -h^2 (exact) and d.  Beyond a = 10.5 erfc(a) < 1e-49 rounds to 0; for
 *    x < 0, erfc(x) = 2 - erfc(-x).
 *  - erf(x): x P(x^2) for |x| < 0.875 (degree 5 in x^2, approximation error 8.5e-9), beyond it
 *    +-(1 - erfc(|x|)).
 *  - gelu(x) = x Phi(x) = x erfc(-x / sqrt 2) / 2: erfc as above, but -x^2 / 2 split from x
 *    itself, so the rounding of x / sqrt 2 never reaches the exponential: the result is accurate
 *    to a few ulp of the exact x Phi(x) for every x (including the far negative tail, where
 *    1 + erf(x / sqrt 2) would cancel to nothing).
 *  - sigmoid(x) = 1 / (1 + e) for x >= 0, e / (1 + e) for x < 0, with e = exp(-|x|).
 *  - tanh, expm1, log and log1p: see each function.
 *
 * Largest errors against double-precision libm over every 7th float, where the result is a normal
 * float: exp 0.98 ulp, erf 2.5, erfc 6.9, gelu 7.8, sigmoid 2.3, tanh 1.3, expm1 1.7, log 0.8,
 * log1p 2.4 (erfc and gelu: the rational's Horner rounding, about 3 ulp, and exp's); a subnormal
 * result is within a few units of 2^-149.
 * NaN gives NaN, +-inf the limits.  tests/backends/c/test_vmath.py checks these bounds.
 */
#ifndef CUVIL_VMATH_H
#define CUVIL_VMATH_H

#include <math.h>
#include <stdint.h>
#include <string.h>

/* Inlined even where a model calls them from many loops: a call left in a loop stops its vectorisation.
 * A file that defines CUVIL_VM_INLINE first chooses the qualifiers itself (CUDA source: host and device). */
#if defined(CUVIL_VM_INLINE)
#elif defined(__GNUC__) || defined(__clang__)
#define CUVIL_VM_INLINE static inline __attribute__((always_inline))
#else
#define CUVIL_VM_INLINE static inline
#endif

CUVIL_VM_INLINE float cuvil_vm_float(uint32_t u) {
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

CUVIL_VM_INLINE uint32_t cuvil_vm_bits(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

/* c ? a : b as bit operations.  GCC does not if-convert a select one of whose arms is a float
 * computation (it may trap, under the default -ftrapping-math), and a loop with a branch left in
 * it does not vectorise; a select between constants, or these masks, it does. */
CUVIL_VM_INLINE float cuvil_vm_pick(int c, float a, float b) {
    const uint32_t m = (uint32_t)0 - (uint32_t)(c != 0);
    return cuvil_vm_float((cuvil_vm_bits(a) & m) | (cuvil_vm_bits(b) & ~m));
}

/* m * exp(y + d) for y in [-110, 89] (callers clamp it; NaN never gets here), |d| < 0.1. */
CUVIL_VM_INLINE float cuvil_vm_exp_mul(float y, float d, float m) {
    const float magic = 12582912.0f; /* 1.5 * 2^23: adding it rounds a float below 2^22 to an integer */
    const float nf = ((y + d) * 1.44269504088896341f + magic) - magic;
    /* exact: n ln2_hi has at most 17 significant bits, and y is within a factor 2 of it (or n = 0) */
    float r = y - nf * 0.693359375f;
    r = (r + d) - nf * -2.12194440e-4f;
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * (r * r) + r + 1.0f;
    const int32_t n = (int32_t)nf, n1 = n / 2, n2 = n - n1; /* both in [-80, 64]: normal powers of two */
    const float s1 = cuvil_vm_float((uint32_t)(n1 + 127) << 23), s2 = cuvil_vm_float((uint32_t)(n2 + 127) << 23);
    return ((p * m) * s1) * s2; /* the first product is exact, the second rounds once (maybe to a subnormal) */
}

/* exp(x). */
CUVIL_VM_INLINE float cuvil_exp_f(float x) {
    const int nan = x != x;
    float c = x > 89.0f ? 89.0f : x; /* e^89 overflows to inf, e^-104 rounds to 0 */
    c = c < -104.0f ? -104.0f : c;
    const float e = cuvil_vm_exp_mul(nan ? 0.0f : c, 0.0f, 1.0f);
    return nan ? x : e;
}

/* erfc(a) exp(a^2) for 0 <= a <= 10.5. */
CUVIL_VM_INLINE float cuvil_vm_erfcx(float a) {
    float p = 3.313674033e-02f, q = 5.873269960e-02f;
    p = p * a + 2.308359742e-01f;
    p = p * a + 7.349922657e-01f;
    p = p * a + 1.241639733e+00f;
    p = p * a + 1.0f;
    q = q * a + 4.091709554e-01f;
    q = q * a + 1.331694007e+00f;
    q = q * a + 2.409262896e+00f;
    q = q * a + 2.370019436e+00f;
    q = q * a + 1.0f;
    return p / q;
}

/* erfc(a) for 0 <= a <= 10.5: exp(-h^2 - (a - h)(a + h)) erfcx(a), h = a rounded down to 12 bits. */
CUVIL_VM_INLINE float cuvil_vm_erfc_pos(float a) {
    const float h = cuvil_vm_float(cuvil_vm_bits(a) & 0xfffff000u);
    return cuvil_vm_exp_mul(-(h * h), -((a - h) * (a + h)), cuvil_vm_erfcx(a));
}

/* 10.5 or more: erfc rounds to 0 (and NaN is set aside before), so the argument is clamped there. */
CUVIL_VM_INLINE float cuvil_vm_clamp_arg(float a) { return a > 10.5f ? 10.5f : a; }

/* erfc(x). */
CUVIL_VM_INLINE float cuvil_erfc_f(float x) {
    const int nan = x != x;
    const float a = nan ? 0.0f : cuvil_vm_clamp_arg(x < 0 ? -x : x);
    const float e = cuvil_vm_erfc_pos(a);
    return nan ? x : (x < 0 ? 2.0f - e : e);
}

/* erf(x). */
CUVIL_VM_INLINE float cuvil_erf_f(float x) {
    const float z = x * x;
    float p = -6.203263183e-04f;
    p = p * z + 5.032182671e-03f;
    p = p * z + -2.679146454e-02f;
    p = p * z + 1.128245518e-01f;
    p = p * z + -3.761255145e-01f;
    p = p * z + 1.128379107e+00f;
    const float a = x < 0 ? -x : x;
    const float big = 1.0f - cuvil_erfc_f(a); /* NaN stays NaN here */
    return a < 0.875f ? x * p : (x < 0 ? -big : big);
}

/* x Phi(x) = x erfc(-x / sqrt 2) / 2, the exact (erf) GELU.  For x < 0 the factor x / 2 goes
 * into exp's multiplier, so a result in the subnormal range is rounded once. */
CUVIL_VM_INLINE float cuvil_gelu_f(float x) {
    const int nan = x != x;
    const float xs = nan ? 0.0f : (x > 14.8f ? 14.8f : (x < -14.8f ? -14.8f : x)); /* 14.8 / sqrt 2 > 10.46 */
    const float a = (xs < 0 ? -xs : xs) * 0.707106781f;
    /* -x^2 / 2 from x itself: h^2 is exact, and so is halving it */
    const float h = cuvil_vm_float(cuvil_vm_bits(xs) & 0xfffff000u);
    const float m = cuvil_vm_erfcx(cuvil_vm_clamp_arg(a)) * (xs < 0 ? 0.5f * xs : 0.5f);
    const float e = cuvil_vm_exp_mul(-0.5f * (h * h), -0.5f * ((xs - h) * (xs + h)), m); /* x Phi(x), or Phi(-x) */
    /* -inf: NaN, as the reference's -inf * erfc(inf) = -inf * 0 */
    return nan ? x : (x < 0 ? (x == -INFINITY ? NAN : e) : x * (1.0f - e));
}

/* 1 / (1 + exp(-x)), as exp(x) / (1 + exp(x)) for x < 0: the exponential is of -|x|, so it never
 * overflows, and a result that is tiny (down to the subnormals) keeps its relative accuracy. */
CUVIL_VM_INLINE float cuvil_sigmoid_vf(float x) {
    const float e = cuvil_exp_f(x < 0 ? x : -x);
    return (x < 0 ? e : 1.0f) / (1.0f + e);
}

/* exp(x) - 1.  For |x| < 1/2, Taylor's series to x^9 (truncation below 3e-10 relative), x plus a
 * correction at most a quarter of it, so no cancellation; beyond, exp(x) - 1, which cancels
 * nothing there (|exp(x) - 1| > 0.39).  NaN and +-inf come through exp. */
CUVIL_VM_INLINE float cuvil_expm1_f(float x) {
    float p = 2.7557319224e-6f; /* 1/9! */
    p = p * x + 2.4801587302e-5f;
    p = p * x + 1.9841269841e-4f;
    p = p * x + 1.3888888889e-3f;
    p = p * x + 8.3333333333e-3f;
    p = p * x + 4.1666666667e-2f;
    p = p * x + 1.6666666667e-1f;
    p = p * x + 0.5f;
    const float small = x + (x * x) * p;
    const float big = cuvil_exp_f(x) - 1.0f;
    return cuvil_vm_pick(x == 0.0f, x, cuvil_vm_pick((x < 0.5f) & (x > -0.5f), small, big)); /* -0 stays -0 */
}

/* log(x).  Cephes' logf: x = m 2^e with m in [sqrt(1/2), sqrt(2)) (subnormals scaled by 2^23
 * first), z = m - 1 exact, log(m) = z - z^2 / 2 + z^3 P(z), and e ln 2 added in two parts (ln2_hi
 * of 9 bits: e ln2_hi is exact).  0 gives -inf, a negative x NaN, +inf +inf. */
CUVIL_VM_INLINE float cuvil_log_f(float x) {
    const float sub = x < 1.17549435e-38f ? 1.0f : 0.0f;
    const uint32_t b = cuvil_vm_bits(x * (1.0f + sub * 8388607.0f)); /* subnormals times 2^23 */
    float m = cuvil_vm_float((b & 0x7fffffu) | 0x3f800000u);        /* [1, 2) */
    float fe = (float)((int32_t)((b >> 23) & 0xffu) - 127) - sub * 23.0f;
    const float high = m > 1.41421356f ? 1.0f : 0.0f;
    m = m * (1.0f - 0.5f * high);
    fe = fe + high;
    const float z = m - 1.0f, zz = z * z;
    float p = 7.0376836292e-2f;
    p = p * z - 1.1514610310e-1f;
    p = p * z + 1.1676998740e-1f;
    p = p * z - 1.2420140846e-1f;
    p = p * z + 1.4249322787e-1f;
    p = p * z - 1.6668057665e-1f;
    p = p * z + 2.0000714765e-1f;
    p = p * z - 2.4999993993e-1f;
    p = p * z + 3.3333331174e-1f;
    float y = p * z * zz;
    y = y + fe * -2.12194440e-4f;
    y = y - 0.5f * zz;
    float r = (z + y) + fe * 0.693359375f;
    r = cuvil_vm_pick(x == INFINITY, x, r);
    r = cuvil_vm_pick(x == 0.0f, -INFINITY, r);
    r = cuvil_vm_pick(x < 0.0f, NAN, r);
    return cuvil_vm_pick(x != x, x, r);
}

/* log(1 + x): u = 1 + x rounded, then log(u) x / (u - 1), which corrects for the rounding
 * (Goldberg); x itself where u rounds to 1.  +inf +inf, below -1 NaN. */
CUVIL_VM_INLINE float cuvil_log1p_f(float x) {
    const float u = 1.0f + x, d = u - 1.0f;
    const float r = cuvil_log_f(u) * (x / cuvil_vm_pick(d == 0.0f, 1.0f, d));
    return cuvil_vm_pick((d == 0.0f) | (x == INFINITY), x, r);
}

/* tanh(x), odd: on a = |x|, the sign put back.  Below 0.625, Cephes' tanhf polynomial
 * a + a z P(z), z = a^2 (no cancellation, subnormals exact); above, 1 - 2 / (exp(2a) + 1), whose
 * subtraction loses nothing (2 / (exp(2a) + 1) < 0.45 there).  a is clamped to 10, past which the
 * float result is 1 and exp(2a) would only risk overflow; NaN gives NaN. */
CUVIL_VM_INLINE float cuvil_tanh_f(float x) {
    const float a = fabsf(x), z = a * a;
    const float small =
        ((((-5.70498872745e-3f * z + 2.06390887954e-2f) * z - 5.37397155531e-2f) * z + 1.33314422036e-1f) * z -
         3.33332819422e-1f) * z * a + a;
    const float e = cuvil_exp_f(2.0f * (a < 10.0f ? a : 10.0f));
    const float big = 1.0f - 2.0f / (e + 1.0f);
    const float t = a < 0.625f ? small : big;
    return x != x ? x : copysignf(t, x);
}

#endif /* CUVIL_VMATH_H */
