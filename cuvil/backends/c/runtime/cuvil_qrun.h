/* Cuvil's quantization step and its per-tensor runs: quantize, dequantize, quantized add.
 *
 * Quantization (cuvil_quantize_f/_d): y = clamp(rint(q), lo - zp, hi - zp) + zp, rounding
 * half to even (the default rounding mode), NaN giving the zero point.  Clamping before the
 * zero point is added keeps every intermediate in range.  The integer GEMM's requantization
 * (cuvil_qgemm.h) is the same step.
 */
#ifndef CUVIL_QRUN_H
#define CUVIL_QRUN_H

#include "cuvil_rt.h"

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

#endif /* CUVIL_QRUN_H */
