/* Cuvil's portable single-precision GEMM:
 *   C[i, j] = alpha * sum_k A[i, k] * B[k, j] + beta * C[i, j]
 * with any strides for A and B (so transposes are free) and row stride ldc for C.
 *
 * The structure is the classic one (Goto / BLIS): B is packed in KC x NC
 * blocks of NR-wide column panels, A in MC x KC blocks of MR-high row panels
 * (alpha folded in), and a register-blocked MR x NR micro-kernel multiplies
 * one A panel by one B panel, keeping the whole C tile in vector registers.
 * Edges are zero-padded in the packed panels, so the micro-kernel always runs
 * at full size; partial C tiles are written through a small local tile.
 *
 * The micro-kernel is written with GCC/Clang vector extensions, which both
 * compilers lower to SSE, AVX, AVX-512, NEON or wasm SIMD128.  The vector
 * width and tile shape follow the target's register file:
 *   AVX-512 (32 x 512-bit):  8 x 32 tile, 16 accumulators
 *   AVX     (16 x 256-bit):  6 x 16 tile, 12 accumulators
 *   otherwise (16 x 128-bit): 6 x 8 tile, 12 accumulators
 * Fused multiply-add is used where the target has it (the build passes
 * -ffp-contract=off, so it is spelled out with intrinsics behind __FMA__);
 * without the vector extensions a scalar path gives the same results.
 *
 * Scratch (the packed panels) is allocated per call: no global state.
 */
#ifndef CUVIL_GEMM_H
#define CUVIL_GEMM_H

#include "cuvil_rt.h"

#if defined(__GNUC__) || defined(__clang__)
#define CUVIL_GEMM_VECTOR 1
#else
#define CUVIL_GEMM_VECTOR 0
#endif

#if CUVIL_GEMM_VECTOR && (defined(__AVX512F__) || defined(__AVX__) || defined(__FMA__))
#include <immintrin.h>
#endif

#if CUVIL_GEMM_VECTOR && defined(__AVX512F__)
#define CUVIL_GEMM_W 16
#define CUVIL_GEMM_MR 8
#define CUVIL_GEMM_KC 256
#define CUVIL_GEMM_MC 128
typedef float cuvil_vf __attribute__((vector_size(64)));
#define CUVIL_VSPLAT(s) _mm512_set1_ps(s)
#define CUVIL_VFMA(a, b, c) _mm512_fmadd_ps((a), (b), (c))
#elif CUVIL_GEMM_VECTOR && defined(__AVX__)
#define CUVIL_GEMM_W 8
#define CUVIL_GEMM_MR 6
#define CUVIL_GEMM_KC 256
#define CUVIL_GEMM_MC 120
typedef float cuvil_vf __attribute__((vector_size(32)));
#define CUVIL_VSPLAT(s) _mm256_set1_ps(s)
#if defined(__FMA__)
#define CUVIL_VFMA(a, b, c) _mm256_fmadd_ps((a), (b), (c))
#endif
#else
#define CUVIL_GEMM_W 4
#define CUVIL_GEMM_MR 6
#define CUVIL_GEMM_KC 256
#define CUVIL_GEMM_MC 120
#if CUVIL_GEMM_VECTOR
typedef float cuvil_vf __attribute__((vector_size(16)));
#define CUVIL_VSPLAT(s) ((cuvil_vf){(s), (s), (s), (s)})
#if defined(__FMA__)
#define CUVIL_VFMA(a, b, c) _mm_fmadd_ps((a), (b), (c))
#endif
#endif
#endif

#if CUVIL_GEMM_VECTOR && !defined(CUVIL_VFMA)
#define CUVIL_VFMA(a, b, c) ((c) + (a) * (b))
#endif

#define CUVIL_GEMM_NR (2 * CUVIL_GEMM_W)
#define CUVIL_GEMM_NC 4096

#if CUVIL_GEMM_MR == 8
#define CUVIL_GEMM_ROWS(X) X(0) X(1) X(2) X(3) X(4) X(5) X(6) X(7)
#else
#define CUVIL_GEMM_ROWS(X) X(0) X(1) X(2) X(3) X(4) X(5)
#endif

#if CUVIL_GEMM_VECTOR

static inline cuvil_vf cuvil_vload(const float *p) {
    cuvil_vf v;
    memcpy(&v, p, sizeof v);
    return v;
}

static inline void cuvil_vstore(float *p, cuvil_vf v) { memcpy(p, &v, sizeof v); }

/* C[0:MR, 0:NR] (+)= Ap (MR x kc, packed) * Bp (kc x NR, packed); `acc` selects += over =.
 * A partial tile (mr < MR or nr < NR) goes through a local buffer. */
static CUVIL_UNUSED void cuvil_sgemm_micro(int64_t kc, const float *restrict Ap, const float *restrict Bp,
                                           float *restrict C, int64_t ldc, int acc, int64_t mr, int64_t nr) {
#define CUVIL_MK_DECL(i) cuvil_vf c##i##a = {0}, c##i##b = {0};
    CUVIL_GEMM_ROWS(CUVIL_MK_DECL)
#undef CUVIL_MK_DECL
    for (int64_t k = 0; k < kc; k++) {
        const cuvil_vf b0 = cuvil_vload(Bp);
        const cuvil_vf b1 = cuvil_vload(Bp + CUVIL_GEMM_W);
#define CUVIL_MK_STEP(i)                        \
    {                                           \
        const cuvil_vf a = CUVIL_VSPLAT(Ap[i]); \
        c##i##a = CUVIL_VFMA(a, b0, c##i##a);   \
        c##i##b = CUVIL_VFMA(a, b1, c##i##b);   \
    }
        CUVIL_GEMM_ROWS(CUVIL_MK_STEP)
#undef CUVIL_MK_STEP
        Ap += CUVIL_GEMM_MR;
        Bp += CUVIL_GEMM_NR;
    }
    float tile[CUVIL_GEMM_MR * CUVIL_GEMM_NR];
    const int full = mr == CUVIL_GEMM_MR && nr == CUVIL_GEMM_NR;
    float *dst = full ? C : tile;
    const int64_t ld = full ? ldc : CUVIL_GEMM_NR;
    if (full && acc) {
#define CUVIL_MK_ACC(i)                                                                          \
    cuvil_vstore(dst + i * ld, cuvil_vload(dst + i * ld) + c##i##a);                             \
    cuvil_vstore(dst + i * ld + CUVIL_GEMM_W, cuvil_vload(dst + i * ld + CUVIL_GEMM_W) + c##i##b);
        CUVIL_GEMM_ROWS(CUVIL_MK_ACC)
#undef CUVIL_MK_ACC
        return;
    }
#define CUVIL_MK_SET(i)                 \
    cuvil_vstore(dst + i * ld, c##i##a); \
    cuvil_vstore(dst + i * ld + CUVIL_GEMM_W, c##i##b);
    CUVIL_GEMM_ROWS(CUVIL_MK_SET)
#undef CUVIL_MK_SET
    if (full) return;
    for (int64_t i = 0; i < mr; i++) {
        float *restrict crow = C + i * ldc;
        const float *trow = tile + i * CUVIL_GEMM_NR;
        if (acc) {
            for (int64_t j = 0; j < nr; j++) crow[j] += trow[j];
        } else {
            for (int64_t j = 0; j < nr; j++) crow[j] = trow[j];
        }
    }
}

#else /* no vector extensions: the same tiles, scalar arithmetic */

static CUVIL_UNUSED void cuvil_sgemm_micro(int64_t kc, const float *restrict Ap, const float *restrict Bp,
                                           float *restrict C, int64_t ldc, int acc, int64_t mr, int64_t nr) {
    float tile[CUVIL_GEMM_MR * CUVIL_GEMM_NR] = {0};
    for (int64_t k = 0; k < kc; k++) {
        for (int i = 0; i < CUVIL_GEMM_MR; i++) {
            const float a = Ap[i];
            for (int j = 0; j < CUVIL_GEMM_NR; j++) tile[i * CUVIL_GEMM_NR + j] += a * Bp[j];
        }
        Ap += CUVIL_GEMM_MR;
        Bp += CUVIL_GEMM_NR;
    }
    for (int64_t i = 0; i < mr; i++)
        for (int64_t j = 0; j < nr; j++) {
            const float t = tile[i * CUVIL_GEMM_NR + j];
            C[i * ldc + j] = acc ? C[i * ldc + j] + t : t;
        }
}

#endif

/* Pack rows [0, mc) x cols [0, kc) of alpha * A into MR-high panels, each k-major, zero-padded. */
static CUVIL_UNUSED void cuvil_sgemm_pack_a(int64_t mc, int64_t kc, float alpha, const float *A, int64_t rsa,
                                            int64_t csa, float *restrict Ap) {
    for (int64_t i0 = 0; i0 < mc; i0 += CUVIL_GEMM_MR) {
        const int64_t mr = mc - i0 < CUVIL_GEMM_MR ? mc - i0 : CUVIL_GEMM_MR;
        /* k outer: MR read streams, one contiguous write stream (good for either layout of A). */
        if (mr == CUVIL_GEMM_MR && csa == 1) { /* row-major A: MR contiguous read streams */
            const float *rows[CUVIL_GEMM_MR];
            for (int i = 0; i < CUVIL_GEMM_MR; i++) rows[i] = A + (i0 + i) * rsa;
            for (int64_t k = 0; k < kc; k++)
                for (int i = 0; i < CUVIL_GEMM_MR; i++) Ap[k * CUVIL_GEMM_MR + i] = alpha * rows[i][k];
        } else {
            for (int64_t k = 0; k < kc; k++) {
                const float *src = A + i0 * rsa + k * csa;
                for (int64_t i = 0; i < mr; i++) Ap[k * CUVIL_GEMM_MR + i] = alpha * src[i * rsa];
            }
        }
        for (int64_t i = mr; i < CUVIL_GEMM_MR; i++)
            for (int64_t k = 0; k < kc; k++) Ap[k * CUVIL_GEMM_MR + i] = 0.0f;
        Ap += kc * CUVIL_GEMM_MR;
    }
}

/* Pack rows [0, kc) x cols [0, nc) of B into NR-wide panels, each k-major, zero-padded. */
static CUVIL_UNUSED void cuvil_sgemm_pack_b(int64_t kc, int64_t nc, const float *B, int64_t rsb, int64_t csb,
                                            float *restrict Bp) {
    for (int64_t j0 = 0; j0 < nc; j0 += CUVIL_GEMM_NR) {
        const int64_t nr = nc - j0 < CUVIL_GEMM_NR ? nc - j0 : CUVIL_GEMM_NR;
        for (int64_t k = 0; k < kc; k++) {
            const float *src = B + k * rsb + j0 * csb;
            float *restrict dst = Bp + k * CUVIL_GEMM_NR;
            if (csb == 1) { /* a plain loop: a libc call per NR floats would cost more than the copy */
                for (int64_t j = 0; j < nr; j++) dst[j] = src[j];
            } else {
                for (int64_t j = 0; j < nr; j++) dst[j] = src[j * csb];
            }
            for (int64_t j = nr; j < CUVIL_GEMM_NR; j++) dst[j] = 0.0f;
        }
        Bp += kc * CUVIL_GEMM_NR;
    }
}

static inline int64_t cuvil_gemm_round_up(int64_t x, int64_t m) { return (x + m - 1) / m * m; }

/* Returns 0, or -1 when scratch memory cannot be had. */
static CUVIL_UNUSED int cuvil_sgemm(int64_t M, int64_t N, int64_t K, float alpha, const float *A, int64_t rsa,
                                    int64_t csa, const float *B, int64_t rsb, int64_t csb, float beta, float *C,
                                    int64_t ldc) {
    if (M <= 0 || N <= 0) return 0;
    /* beta == 0 overwrites C (NaN in C does not survive), as BLAS does; the first K block then
     * stores instead of accumulating, so C is never read. */
    int first_acc = 1;
    if (beta == 0.0f) {
        first_acc = 0;
        if (K <= 0 || alpha == 0.0f) {
            for (int64_t i = 0; i < M; i++) memset(C + i * ldc, 0, sizeof(float) * (size_t)N);
            return 0;
        }
    } else if (beta != 1.0f) {
        for (int64_t i = 0; i < M; i++)
            for (int64_t j = 0; j < N; j++) C[i * ldc + j] *= beta;
    }
    if (K <= 0 || alpha == 0.0f) return 0;
    const int64_t ncap = cuvil_gemm_round_up(N < CUVIL_GEMM_NC ? N : CUVIL_GEMM_NC, CUVIL_GEMM_NR);
    const int64_t kcap = K < CUVIL_GEMM_KC ? K : CUVIL_GEMM_KC;
    const int64_t mcap = cuvil_gemm_round_up(M < CUVIL_GEMM_MC ? M : CUVIL_GEMM_MC, CUVIL_GEMM_MR);
    const size_t bbytes = (size_t)cuvil_gemm_round_up(ncap * kcap * 4, CUVIL_ALIGN);
    const size_t abytes = (size_t)cuvil_gemm_round_up(mcap * kcap * 4, CUVIL_ALIGN);
    float *Bp = (float *)aligned_alloc(CUVIL_ALIGN, bbytes);
    float *Ap = (float *)aligned_alloc(CUVIL_ALIGN, abytes);
    if (!Bp || !Ap) {
        free(Bp);
        free(Ap);
        return -1;
    }
    for (int64_t jc = 0; jc < N; jc += CUVIL_GEMM_NC) {
        const int64_t nc = N - jc < CUVIL_GEMM_NC ? N - jc : CUVIL_GEMM_NC;
        for (int64_t pc = 0; pc < K; pc += CUVIL_GEMM_KC) {
            const int64_t kc = K - pc < CUVIL_GEMM_KC ? K - pc : CUVIL_GEMM_KC;
            const int acc = pc > 0 || first_acc;
            cuvil_sgemm_pack_b(kc, nc, B + pc * rsb + jc * csb, rsb, csb, Bp);
            for (int64_t ic = 0; ic < M; ic += CUVIL_GEMM_MC) {
                const int64_t mc = M - ic < CUVIL_GEMM_MC ? M - ic : CUVIL_GEMM_MC;
                cuvil_sgemm_pack_a(mc, kc, alpha, A + ic * rsa + pc * csa, rsa, csa, Ap);
                for (int64_t jr = 0; jr < nc; jr += CUVIL_GEMM_NR) {
                    const int64_t nr = nc - jr < CUVIL_GEMM_NR ? nc - jr : CUVIL_GEMM_NR;
                    const float *bp = Bp + (jr / CUVIL_GEMM_NR) * kc * CUVIL_GEMM_NR;
                    for (int64_t ir = 0; ir < mc; ir += CUVIL_GEMM_MR) {
                        const int64_t mr = mc - ir < CUVIL_GEMM_MR ? mc - ir : CUVIL_GEMM_MR;
                        cuvil_sgemm_micro(kc, Ap + (ir / CUVIL_GEMM_MR) * kc * CUVIL_GEMM_MR, bp,
                                          C + (ic + ir) * ldc + jc + jr, ldc, acc, mr, nr);
                    }
                }
            }
        }
    }
    free(Bp);
    free(Ap);
    return 0;
}

#endif /* CUVIL_GEMM_H */
