/* Channels-last convolutions (conv_nhwc) of float16 / bfloat16 operands.
 *
 * As for every f16/bf16 convolution (cuvil_half.h), the operands are widened exactly to float32,
 * the float32 kernel runs (the direct kernel of cuvil_nhwc_direct.h, or the depthwise one of
 * cuvil_conv_nhwc.h) and its result, bias included, is rounded once: the reference's semantics.
 * The weight is widened once per loaded model into the constant cache, where it counts as a
 * constant itself, so the float32 kernel's packed panels of it are cached too: after the first
 * call a weight costs nothing; the input is widened and the output rounded on each call.
 *
 * Except a bf16 pointwise convolution (1x1, unit stride, unpadded, one group) on a target with
 * AVX512_BF16: the product of the [pixels x C] input, read in place, and the [C x M] weight on
 * vdpbf16ps (exact products accumulated in float32, the weight's panels cached once per model),
 * each output tile getting its bias and rounded once to bf16 as it leaves the registers.
 */
#ifndef CUVIL_CONV_NHWC_HALF_H
#define CUVIL_CONV_NHWC_HALF_H

#include "cuvil_conv_nhwc.h"
#include "cuvil_half.h"

/* x: xn values, w: wn, b: bn (or NULL), y: yn; x32 and y32: float32 scratch of xn and yn values.
 * Returns 0, or -1 when out of memory. */
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
    cuvil_half_to_f32(is_bf16, x, x32, xn);
    int rc = 0;
    if (depthwise) cuvil_conv_nhwc_depthwise_f32(g, x32, w32, b32, y32, NULL);
    else rc = cuvil_conv_nhwc_f32(g, x32, w32, b32, y32, NULL);
    if (rc == 0) cuvil_f32_to_half(is_bf16, y32, y, yn);
    free(wown);
    free(bown);
    return rc;
}

#endif /* CUVIL_CONV_NHWC_HALF_H */
