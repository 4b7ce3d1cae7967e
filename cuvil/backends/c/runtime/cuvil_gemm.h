/* Cuvil's portable single-precision GEMM:
 *   C[i, j] = alpha * sum_k A[i, k] * B[k, j] + beta * C[i, j]
 * with any strides for A and B (so transposes are free) and row stride ldc for C.
 *
 * B is packed in KC x NC panels; four rows of A are applied to a packed panel
 * at a time, so the inner loop over j is unit-stride and vectorises on every
 * target (including wasm32 SIMD128). The per-target register-blocked kernels
 * come on top of this.
 */
#ifndef CUVIL_GEMM_H
#define CUVIL_GEMM_H

#include "cuvil_rt.h"

#define CUVIL_GEMM_KC 256
#define CUVIL_GEMM_NC 512

static CUVIL_UNUSED void cuvil_sgemm_panel(int64_t M, int64_t nc, int64_t kc, float alpha, const float *A,
                                           int64_t rsa, int64_t csa, const float *restrict Bp, float *C, int64_t ldc) {
    int64_t i = 0;
    for (; i + 4 <= M; i += 4) {
        float *restrict c0 = C + (i + 0) * ldc;
        float *restrict c1 = C + (i + 1) * ldc;
        float *restrict c2 = C + (i + 2) * ldc;
        float *restrict c3 = C + (i + 3) * ldc;
        for (int64_t k = 0; k < kc; k++) {
            const float a0 = alpha * A[(i + 0) * rsa + k * csa];
            const float a1 = alpha * A[(i + 1) * rsa + k * csa];
            const float a2 = alpha * A[(i + 2) * rsa + k * csa];
            const float a3 = alpha * A[(i + 3) * rsa + k * csa];
            const float *restrict b = Bp + k * nc;
            for (int64_t j = 0; j < nc; j++) {
                const float bj = b[j];
                c0[j] += a0 * bj;
                c1[j] += a1 * bj;
                c2[j] += a2 * bj;
                c3[j] += a3 * bj;
            }
        }
    }
    for (; i < M; i++) {
        float *restrict c0 = C + i * ldc;
        for (int64_t k = 0; k < kc; k++) {
            const float a0 = alpha * A[i * rsa + k * csa];
            const float *restrict b = Bp + k * nc;
            for (int64_t j = 0; j < nc; j++) c0[j] += a0 * b[j];
        }
    }
}

/* Returns 0, or -1 when scratch memory cannot be had. */
static CUVIL_UNUSED int cuvil_sgemm(int64_t M, int64_t N, int64_t K, float alpha, const float *A, int64_t rsa,
                                    int64_t csa, const float *B, int64_t rsb, int64_t csb, float beta, float *C,
                                    int64_t ldc) {
    if (M <= 0 || N <= 0) return 0;
    if (beta == 0.0f) {
        for (int64_t i = 0; i < M; i++) memset(C + i * ldc, 0, sizeof(float) * (size_t)N);
    } else if (beta != 1.0f) {
        for (int64_t i = 0; i < M; i++)
            for (int64_t j = 0; j < N; j++) C[i * ldc + j] *= beta;
    }
    if (K <= 0 || alpha == 0.0f) return 0;
    int64_t ncap = N < CUVIL_GEMM_NC ? N : CUVIL_GEMM_NC;
    int64_t kcap = K < CUVIL_GEMM_KC ? K : CUVIL_GEMM_KC;
    float *Bp = (float *)aligned_alloc(CUVIL_ALIGN, (size_t)((ncap * kcap * 4 + CUVIL_ALIGN - 1) / CUVIL_ALIGN * CUVIL_ALIGN));
    if (!Bp) return -1;
    for (int64_t j0 = 0; j0 < N; j0 += CUVIL_GEMM_NC) {
        int64_t nc = N - j0 < CUVIL_GEMM_NC ? N - j0 : CUVIL_GEMM_NC;
        for (int64_t k0 = 0; k0 < K; k0 += CUVIL_GEMM_KC) {
            int64_t kc = K - k0 < CUVIL_GEMM_KC ? K - k0 : CUVIL_GEMM_KC;
            for (int64_t k = 0; k < kc; k++) {
                const float *src = B + (k0 + k) * rsb + j0 * csb;
                float *dst = Bp + k * nc;
                if (csb == 1) {
                    memcpy(dst, src, sizeof(float) * (size_t)nc);
                } else {
                    for (int64_t j = 0; j < nc; j++) dst[j] = src[j * csb];
                }
            }
            cuvil_sgemm_panel(M, nc, kc, alpha, A + k0 * csa, rsa, csa, Bp, C + j0, ldc);
        }
    }
    free(Bp);
    return 0;
}

#endif /* CUVIL_GEMM_H */
