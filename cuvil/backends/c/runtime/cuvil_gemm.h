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
 * Scratch (the packed panels) is allocated per call; constant operands are packed once per
 * model, and large products are split across the call's threads (see below).
 *
 * Products of a few rows (M <= MR: a batch-1 MLP, one token of a transformer) take a separate
 * path (cuvil_sgemm_small): A is read in place, B is read as it lies in the packed panels of a
 * constant operand (or straight from a row-major one), each column strip keeps its whole K
 * loop in registers, and the columns are split across threads when that pays (see below).  A
 * product with one column panel of a constant B and a few row tiles (a batched classifier's
 * handful of outputs) runs that path once per tile of MR rows.
 *
 * An epilogue (cuvil_sgemm_epilogue: a function and its context, generated per fused node)
 * runs on each finished tile of C right after the micro-kernel's last store into it, while the
 * tile is in L1, so a fused bias / activation / residual add costs no second pass over C.
 */
#ifndef CUVIL_GEMM_H
#define CUVIL_GEMM_H

#include "cuvil_rt.h"
#include "cuvil_threads.h"

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
#define CUVIL_GEMM_NREG 32
typedef float cuvil_vf __attribute__((vector_size(64)));
#define CUVIL_VSPLAT(s) _mm512_set1_ps(s)
#define CUVIL_VFMA(a, b, c) _mm512_fmadd_ps((a), (b), (c))
#elif CUVIL_GEMM_VECTOR && defined(__AVX__)
#define CUVIL_GEMM_W 8
#define CUVIL_GEMM_MR 6
#define CUVIL_GEMM_KC 256
#define CUVIL_GEMM_MC 120
#define CUVIL_GEMM_NREG 16
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
#define CUVIL_GEMM_NREG 16
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

#endif

static inline int64_t cuvil_gemm_round_up(int64_t x, int64_t m) { return (x + m - 1) / m * m; }
static inline int64_t cuvil_gemm_min(int64_t a, int64_t b) { return a < b ? a : b; }

/* ---- epilogues --------------------------------------------------------------------------
 * fn(ctx, c, ldc, i0, j0, rows, cols) finishes C[i0:i0+rows, j0:j0+cols] (c points at C[i0, j0],
 * rows ldc apart) once every product term is in it.  It is called once per element, on tiles in
 * any order and on any thread, so it must be elementwise: a bias by row or by column, an
 * activation, a residual add, ... composed in one function by the code generator.  Since the
 * tile it gets holds the finished float32 results, it rounds exactly as a second pass would. */
typedef void (*cuvil_sgemm_epi_fn)(const void *ctx, float *c, int64_t ldc, int64_t i0, int64_t j0, int64_t rows,
                                   int64_t cols);
typedef struct cuvil_sgemm_epilogue {
    cuvil_sgemm_epi_fn fn;
    const void *ctx;
} cuvil_sgemm_epilogue;

/* ---- the cost model ----------------------------------------------------------------------
 * Rough single-core speeds, used only to say whether a product is long enough to pay for waking
 * the pool (cuvil_parallel_worth): multiply-adds per nanosecond in the micro-kernel (about 80%
 * of the FMA peak), and bytes per nanosecond streamed from the last-level cache. */
#if defined(__AVX512F__)
#define CUVIL_GEMM_MAC_PER_NS 100.0
#elif defined(__AVX__)
#define CUVIL_GEMM_MAC_PER_NS 50.0
#else
#define CUVIL_GEMM_MAC_PER_NS 8.0
#endif
#define CUVIL_GEMM_BYTES_PER_NS 20.0
/* Packing one element costs about as much as this many multiply-adds in the micro-kernel. */
#define CUVIL_GEMM_PACK_COST 8

/* ---- the API (defined below, or in the kernel library: cuvil_rt.h) ------------------------ */
/* C = alpha * A B + beta * C, then the epilogue `ep` (NULL: none) over all of C.
 * Returns 0, or -1 when scratch memory cannot be had. */
CUVIL_LIB int cuvil_sgemm_ep(int64_t M, int64_t N, int64_t K, float alpha, const float *A, int64_t rsa, int64_t csa,
                             const float *B, int64_t rsb, int64_t csb, float beta, float *C, int64_t ldc,
                             const cuvil_sgemm_epilogue *ep);
CUVIL_LIB int cuvil_sgemm(int64_t M, int64_t N, int64_t K, float alpha, const float *A, int64_t rsa, int64_t csa,
                          const float *B, int64_t rsb, int64_t csb, float beta, float *C, int64_t ldc);

#if CUVIL_LIB_BODY
#if CUVIL_GEMM_VECTOR

/* C[0:MR, 0:NR] (+)= Ap (MR x kc, packed) * Bp (kc x NR, packed); `acc` selects += over =.
 * A partial tile (mr < MR or nr < NR) goes through a local buffer. */
static CUVIL_UNUSED void cuvil_sgemm_micro(int64_t kc, const float *restrict Ap, const float *restrict Bp,
                                           float *restrict C, int64_t ldc, int acc, int64_t mr, int64_t nr) {
#define CUVIL_MK_DECL(i) cuvil_vf c##i##a = {0}, c##i##b = {0};
    CUVIL_GEMM_ROWS(CUVIL_MK_DECL)
#undef CUVIL_MK_DECL
    if (mr == CUVIL_GEMM_MR) {
        /* The C tile is written (and read, when accumulating) after the K loop; fetching it now
         * hides that miss behind the loop: once C outgrows L2, every KC block re-reads it. */
#define CUVIL_MK_PREFETCH(i) \
    __builtin_prefetch(C + i * ldc, 1, 3); \
    __builtin_prefetch(C + i * ldc + CUVIL_GEMM_NR - 1, 1, 3);
        CUVIL_GEMM_ROWS(CUVIL_MK_PREFETCH)
#undef CUVIL_MK_PREFETCH
    }
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


/* ---- the parallel decomposition --------------------------------------------------------
 * The product is split into a grid of output blocks on MR x NR tile boundaries, one task per
 * block.  Every task runs the whole K loop of its block in the serial order (same KC blocks,
 * same micro-kernel), so each C element is computed by one thread exactly as the serial code
 * computes it: results are bitwise the same for any number of threads.  The grid is the one
 * whose largest task costs least (multiply-adds, plus packing, which tasks that share a row or
 * column of blocks repeat).
 *
 * A constant operand (inside the model's weights) is packed once, whole, into the model's
 * constant cache (cuvil_threads.h), in the layout the blocks read:
 *   A: for each KC block at pc, rows [0, Mpad) in MR panels at Ap + pc * Mpad;
 *   B: for each NC block at jc and KC block at pc, its NR panels at Bp + jc * K + pc * ncpad. */

typedef struct cuvil_sgemm_job {
    int64_t M, N, K, rsa, csa, rsb, csb, ldc;
    float alpha;
    const float *A, *B;
    float *C;
    int first_acc;
    const float *Ap_all, *Bp_all; /* the whole packed operand, or NULL: packed per block */
    const cuvil_sgemm_epilogue *ep;
    int64_t mparts, nparts;       /* the task grid */
    float *scratch;               /* per thread: abytes + bbytes */
    size_t abytes, bbytes;
} cuvil_sgemm_job;

/* C[i0:i1, j0:j1] (i0 a multiple of MR, j0 of NR), the whole K loop; Ap/Bp: packing scratch. */
static void cuvil_sgemm_block(const cuvil_sgemm_job *g, int64_t i0, int64_t i1, int64_t j0, int64_t j1, float *Ap,
                              float *Bp) {
    const int64_t K = g->K, mpad = cuvil_gemm_round_up(g->M, CUVIL_GEMM_MR);
    for (int64_t jc = j0 / CUVIL_GEMM_NC * CUVIL_GEMM_NC; jc < j1; jc += CUVIL_GEMM_NC) {
        const int64_t jlo = jc > j0 ? jc : j0, jhi = cuvil_gemm_min(jc + CUVIL_GEMM_NC, j1);
        const int64_t ncpad = cuvil_gemm_round_up(cuvil_gemm_min(g->N - jc, CUVIL_GEMM_NC), CUVIL_GEMM_NR);
        for (int64_t pc = 0; pc < K; pc += CUVIL_GEMM_KC) {
            const int64_t kc = cuvil_gemm_min(K - pc, CUVIL_GEMM_KC);
            const int acc = pc > 0 || g->first_acc;
            const cuvil_sgemm_epilogue *ep = pc + kc >= K ? g->ep : NULL; /* the last K block finishes C */
            const float *bblk = Bp; /* the panel of column jlo */
            if (g->Bp_all)
                bblk = g->Bp_all + jc * K + pc * ncpad + (jlo - jc) / CUVIL_GEMM_NR * kc * CUVIL_GEMM_NR;
            else
                cuvil_sgemm_pack_b(kc, jhi - jlo, g->B + pc * g->rsb + jlo * g->csb, g->rsb, g->csb, Bp);
            for (int64_t ic = i0; ic < i1; ic += CUVIL_GEMM_MC) {
                const int64_t mc = cuvil_gemm_min(i1 - ic, CUVIL_GEMM_MC);
                const float *ablk = Ap; /* the panel of row ic */
                if (g->Ap_all)
                    ablk = g->Ap_all + pc * mpad + ic / CUVIL_GEMM_MR * kc * CUVIL_GEMM_MR;
                else
                    cuvil_sgemm_pack_a(mc, kc, g->alpha, g->A + ic * g->rsa + pc * g->csa, g->rsa, g->csa, Ap);
                for (int64_t jr = jlo; jr < jhi; jr += CUVIL_GEMM_NR) {
                    const int64_t nr = cuvil_gemm_min(jhi - jr, CUVIL_GEMM_NR);
                    const float *bp = bblk + (jr - jlo) / CUVIL_GEMM_NR * kc * CUVIL_GEMM_NR;
                    for (int64_t ir = 0; ir < mc; ir += CUVIL_GEMM_MR) {
                        const int64_t mr = cuvil_gemm_min(mc - ir, CUVIL_GEMM_MR);
                        float *ct = g->C + (ic + ir) * g->ldc + jr;
                        cuvil_sgemm_micro(kc, ablk + ir / CUVIL_GEMM_MR * kc * CUVIL_GEMM_MR, bp, ct, g->ldc, acc, mr,
                                          nr);
                        if (ep) ep->fn(ep->ctx, ct, g->ldc, ic + ir, jr, mr, nr);
                    }
                }
            }
        }
    }
}

static void cuvil_sgemm_task(void *ctx, int64_t task, int tid) {
    const cuvil_sgemm_job *g = (const cuvil_sgemm_job *)ctx;
    int64_t mlo, mhi, nlo, nhi;
    cuvil_split(cuvil_gemm_round_up(g->M, CUVIL_GEMM_MR) / CUVIL_GEMM_MR, g->mparts, task / g->nparts, &mlo, &mhi);
    cuvil_split(cuvil_gemm_round_up(g->N, CUVIL_GEMM_NR) / CUVIL_GEMM_NR, g->nparts, task % g->nparts, &nlo, &nhi);
    if (mlo == mhi || nlo == nhi) return;
    float *Ap = (float *)((char *)g->scratch + (size_t)tid * (g->abytes + g->bbytes));
    float *Bp = (float *)((char *)Ap + g->abytes);
    cuvil_sgemm_block(g, mlo * CUVIL_GEMM_MR, cuvil_gemm_min(mhi * CUVIL_GEMM_MR, g->M), nlo * CUVIL_GEMM_NR,
                      cuvil_gemm_min(nhi * CUVIL_GEMM_NR, g->N), Ap, Bp);
}

typedef struct cuvil_sgemm_pack_args {
    int64_t M, N, K, rs, cs;
    float alpha;
    const float *src;
} cuvil_sgemm_pack_args;

static void cuvil_sgemm_pack_all_a(void *dst, const void *arg) {
    const cuvil_sgemm_pack_args *a = (const cuvil_sgemm_pack_args *)arg;
    const int64_t mpad = cuvil_gemm_round_up(a->M, CUVIL_GEMM_MR);
    for (int64_t pc = 0; pc < a->K; pc += CUVIL_GEMM_KC)
        cuvil_sgemm_pack_a(a->M, cuvil_gemm_min(a->K - pc, CUVIL_GEMM_KC), a->alpha, a->src + pc * a->cs, a->rs, a->cs,
                           (float *)dst + pc * mpad);
}

static void cuvil_sgemm_pack_all_b(void *dst, const void *arg) {
    const cuvil_sgemm_pack_args *b = (const cuvil_sgemm_pack_args *)arg;
    for (int64_t jc = 0; jc < b->N; jc += CUVIL_GEMM_NC) {
        const int64_t nc = cuvil_gemm_min(b->N - jc, CUVIL_GEMM_NC), ncpad = cuvil_gemm_round_up(nc, CUVIL_GEMM_NR);
        for (int64_t pc = 0; pc < b->K; pc += CUVIL_GEMM_KC)
            cuvil_sgemm_pack_b(cuvil_gemm_min(b->K - pc, CUVIL_GEMM_KC), nc, b->src + pc * b->rs + jc * b->cs, b->rs,
                               b->cs, (float *)dst + jc * b->K + pc * ncpad);
    }
}

/* The whole packed form of a constant operand (rows x cols, strides rs/cs), from the model's
 * cache; NULL when it is not a constant or cannot be cached. */
static const float *cuvil_sgemm_packed_const(int is_a, int64_t rows, int64_t cols, const float *src, int64_t rs,
                                             int64_t cs, float alpha) {
    if (rs < 0 || cs < 0) return NULL;
    const size_t extent = ((size_t)((rows - 1) * rs + (cols - 1) * cs) + 1) * sizeof(float);
    if (!cuvil_is_constant(src, extent)) return NULL;
    uint32_t abits;
    memcpy(&abits, &alpha, sizeof abits);
    /* A: rows = M, cols = K; B: rows = K, cols = N.  The blocking is part of the layout. */
    const int64_t key[CUVIL_CACHE_KEY] = {is_a, rows, cols, rs, cs, is_a ? (int64_t)abits : 0,
                                          is_a ? CUVIL_GEMM_MR : CUVIL_GEMM_NR, CUVIL_GEMM_KC * 65536 + CUVIL_GEMM_NC};
    cuvil_sgemm_pack_args args;
    size_t bytes;
    if (is_a) {
        args = (cuvil_sgemm_pack_args){rows, 0, cols, rs, cs, alpha, src};
        bytes = cuvil_size3(sizeof(float), (size_t)cuvil_gemm_round_up(rows, CUVIL_GEMM_MR), (size_t)cols);
    } else {
        args = (cuvil_sgemm_pack_args){0, cols, rows, rs, cs, 1.0f, src};
        bytes = cuvil_size3(sizeof(float), (size_t)rows, (size_t)cuvil_gemm_round_up(cols, CUVIL_GEMM_NR));
    }
    if (bytes == SIZE_MAX) return NULL;
    return (const float *)cuvil_cache_get(src, key, bytes, is_a ? cuvil_sgemm_pack_all_a : cuvil_sgemm_pack_all_b,
                                          &args);
}

#include "cuvil_gemm_small.h"

/* C = alpha * A B + beta * C, then the epilogue `ep` (NULL: none) over all of C.
 * Returns 0, or -1 when scratch memory cannot be had. */
CUVIL_LIB int cuvil_sgemm_ep(int64_t M, int64_t N, int64_t K, float alpha, const float *A, int64_t rsa,
                             int64_t csa, const float *B, int64_t rsb, int64_t csb, float beta, float *C,
                             int64_t ldc, const cuvil_sgemm_epilogue *ep) {
    if (M <= 0 || N <= 0) return 0;
    /* beta == 0 overwrites C (NaN in C does not survive), as BLAS does; the first K block then
     * stores instead of accumulating, so C is never read. */
    int first_acc = 1;
    if (beta == 0.0f) {
        first_acc = 0;
        if (K <= 0 || alpha == 0.0f) {
            for (int64_t i = 0; i < M; i++) memset(C + i * ldc, 0, sizeof(float) * (size_t)N);
            if (ep) ep->fn(ep->ctx, C, ldc, 0, 0, M, N);
            return 0;
        }
    } else if (beta != 1.0f) {
        for (int64_t i = 0; i < M; i++)
            for (int64_t j = 0; j < N; j++) C[i * ldc + j] *= beta;
    }
    if (K <= 0 || alpha == 0.0f) {
        if (ep) ep->fn(ep->ctx, C, ldc, 0, 0, M, N);
        return 0;
    }
    cuvil_sgemm_job g = {M, N, K, rsa, csa, rsb, csb, ldc, alpha, A, B, C, first_acc, NULL, NULL, ep, 1, 1, NULL, 0, 0};
    g.Bp_all = cuvil_sgemm_packed_const(0, K, N, B, rsb, csb, 1.0f);
#if CUVIL_GEMM_SMALL
    if (M <= CUVIL_GEMM_MR && (g.Bp_all || csb == 1)) {
        cuvil_sgemm_small(&g);
        return 0;
    }
    /* One column panel (a classifier's few outputs) and a few row tiles: the small path per tile
     * of rows, B (one panel, in L2 after the first) read in place; the blocked path would pack A
     * and run one mostly empty tile per KC block and row tile. */
    if (N <= CUVIL_GEMM_NR && M <= CUVIL_SMALL_N_MAX_ROWS && g.Bp_all) {
        for (int64_t i0 = 0; i0 < M; i0 += CUVIL_GEMM_MR) {
            cuvil_sgemm_job t = g;
            t.M = cuvil_gemm_min(M - i0, CUVIL_GEMM_MR);
            t.A = A + i0 * rsa;
            t.C = C + i0 * ldc;
            cuvil_sgemm_small(&t);
        }
        return 0;
    }
#endif
    g.Ap_all = cuvil_sgemm_packed_const(1, M, K, A, rsa, csa, alpha);
    const int64_t mtiles = cuvil_gemm_round_up(M, CUVIL_GEMM_MR) / CUVIL_GEMM_MR;
    const int64_t ntiles = cuvil_gemm_round_up(N, CUVIL_GEMM_NR) / CUVIL_GEMM_NR;
    int threads = cuvil_num_threads_now();
    if (threads > 1) {
        const double pack = (g.Ap_all ? 0.0 : (double)M * K) + (g.Bp_all ? 0.0 : (double)K * N);
        const double ns = ((double)M * N * K + CUVIL_GEMM_PACK_COST * pack) / CUVIL_GEMM_MAC_PER_NS;
        if (!cuvil_parallel_worth(ns)) threads = 1;
    }
    if (threads > 1) {
        double best = -1.0;
        for (int64_t mp = 1; mp <= threads && mp <= mtiles; mp++) {
            for (int64_t np = 1; mp * np <= threads && np <= ntiles; np++) {
                const double rows = (double)((mtiles + mp - 1) / mp * CUVIL_GEMM_MR);
                const double cols = (double)((ntiles + np - 1) / np * CUVIL_GEMM_NR);
                const double pack = (g.Ap_all ? 0.0 : rows) + (g.Bp_all ? 0.0 : cols);
                const double cost = (rows * cols + CUVIL_GEMM_PACK_COST * pack) * (double)K;
                if (best < 0.0 || cost < best) {
                    best = cost;
                    g.mparts = mp;
                    g.nparts = np;
                }
            }
        }
    }
    const int64_t ntasks = g.mparts * g.nparts;
    const int64_t kcap = cuvil_gemm_min(K, CUVIL_GEMM_KC);
    const int64_t mcap = cuvil_gemm_round_up(cuvil_gemm_min((mtiles + g.mparts - 1) / g.mparts * CUVIL_GEMM_MR,
                                                            CUVIL_GEMM_MC), CUVIL_GEMM_MR);
    const int64_t ncap = cuvil_gemm_round_up(cuvil_gemm_min((ntiles + g.nparts - 1) / g.nparts * CUVIL_GEMM_NR,
                                                            CUVIL_GEMM_NC), CUVIL_GEMM_NR);
    g.abytes = g.Ap_all ? 0 : (size_t)cuvil_gemm_round_up(mcap * kcap * 4, CUVIL_ALIGN);
    g.bbytes = g.Bp_all ? 0 : (size_t)cuvil_gemm_round_up(ncap * kcap * 4, CUVIL_ALIGN);
    const int64_t nscratch = ntasks == 1 ? 1 : threads; /* one per thread that may run a task */
    if (g.abytes + g.bbytes > 0) {
        const size_t sbytes = cuvil_size3(g.abytes + g.bbytes, (size_t)nscratch, 1);
        if (sbytes == SIZE_MAX) return -1;
        g.scratch = (float *)aligned_alloc(CUVIL_ALIGN, sbytes);
        if (!g.scratch) return -1;
    }
    if (ntasks == 1)
        cuvil_sgemm_task(&g, 0, 0);
    else
        cuvil_parallel_for(ntasks, cuvil_sgemm_task, &g);
    free(g.scratch);
    return 0;
}

/* C = alpha * A B + beta * C.  Returns 0, or -1 when scratch memory cannot be had. */
CUVIL_LIB int cuvil_sgemm(int64_t M, int64_t N, int64_t K, float alpha, const float *A, int64_t rsa,
                          int64_t csa, const float *B, int64_t rsb, int64_t csb, float beta, float *C,
                          int64_t ldc) {
    return cuvil_sgemm_ep(M, N, K, alpha, A, rsa, csa, B, rsb, csb, beta, C, ldc, NULL);
}

#endif /* CUVIL_LIB_BODY */

#endif /* CUVIL_GEMM_H */
