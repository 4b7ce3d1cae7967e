/* Cuvil's Winograd convolutions: F(m x m, 3 x 3) for m = 2, 4, 6, for 2-D 3x3 convolutions with
 * unit strides and dilations, one group, any padding (ONNX layout: X [N, C, H, W], W [M, C, 3, 3]).
 *
 * An output tile of m x m pixels is Y = A^T [ (G w G^T) . (B^T d B) ] A, where d is the
 * (m + 2) x (m + 2) input patch under the tile and "." the elementwise product at the
 * P = (m + 2)^2 transform points.  Summed over input channels, the product at each point is
 * a GEMM:
 *     M_p [tiles, cout] = V_p [tiles, cin] x U_p [cin, cout]     (p = 0 .. P - 1)
 * so a 3x3 convolution costs P / m^2 multiply-adds per output instead of 9 (4, 2.25, 1.78 times
 * fewer for m = 2, 4, 6), plus the transforms.
 *
 * Channels are innermost in the transformed domain, so both transforms are whole-vector adds on
 * CUVIL_WINO_W channels at once and need no gathers:
 *   weights  U = G w G^T, computed in double once per model (cuvil_threads.h's constant cache,
 *            keyed by the weight pointer) as panels of CUVIL_WINO_NW output channels:
 *            U[cout / NW][p][cin][NW];
 *   input    the rows of the image a block of tiles reads are first copied, zero-padded, into a
 *            channels-innermost buffer Xs[row][col][cin] (the halo and the padding are real
 *            zeros there, so no tile is a special case); then V_p[tile][cin] = B^T d B, a vector
 *            of channels at a time;
 *   products cuvil_wino_micro: CUVIL_WINO_R tiles x NW output channels in registers, the tiles'
 *            V entries broadcast in place (no packing), U read as vectors;
 *   output   Y = A^T M A per tile and vector of output channels, plus the bias, then transposed
 *            (W channels x W pixels at a time) into whole output rows: straight into y, where the
 *            fused epilogue (kernels/conv.py generates it per node) then runs on each row in place,
 *            or, when the epilogue reads an operand that may share y's memory, into a staging
 *            buffer from which the epilogue stores each row.
 *
 * Work is split into blocks of whole tile rows (of one or several images), sized so that a
 * block's transformed input stays in L2 while the weights stream past it, and, when blocks are
 * few, into ranges of output-channel panels (a small image with few channels, one block of
 * one panel, is cut into smaller blocks instead).  Each task transforms its own input and computes
 * its outputs in a fixed order: results are bitwise the same for any number of threads.  A block's
 * panel ranges are consecutive tasks, so a thread usually runs several of them in a row
 * (cuvil_threads.h gives each thread a contiguous range of tasks first): it keeps the block's
 * transformed input from the first and skips the transform for the next.  So a block's transform
 * is made by each thread that runs some of its panels: once per thread at most, from data in that
 * thread's own caches.  With many threads on a block of few output channels that repeats a
 * sizeable share of the work (the transform costs about 2 (m + 2) operations per point and input
 * channel, the products 2 cout), so when the repeats would add more than CUVIL_WINO_REPEAT_MAX of
 * the products' work, the block's input transform is made once instead, split across the threads
 * by tile slots, and shared by its panel tasks ("shared mode").  Not by default: a thread reading
 * a transform another thread wrote is slow where the two run on cores that share no cache (a
 * virtual machine's vCPUs, placed by its host): there ResNet-18's 28x28 layers took 1.9 times
 * their time on near cores at two threads in shared mode, 1.4 times with each thread making its own.
 *
 * The transform matrices (Lavin & Gray; points 0, +-1, +-2, +-1/2, infinity):
 *   F(2,3): B^T = [1 0 -1 0; 0 1 1 0; 0 -1 1 0; 0 1 0 -1]   G = [1 0 0; .5 .5 .5; .5 -.5 .5; 0 0 1]
 *           A^T = [1 1 1 0; 0 1 -1 -1]
 *   F(4,3), F(6,3): the rows written out in cuvil_wino_bt4/at4/bt6/at6 and cuvil_wino_g4/g6 below.
 */
#ifndef CUVIL_WINOGRAD_H
#define CUVIL_WINOGRAD_H

#include "cuvil_conv.h"
#include "cuvil_gemm.h"
#include "cuvil_rt.h"
#include "cuvil_threads.h"

/* The vector: CUVIL_WINO_W channels side by side.  The products keep CUVIL_WINO_R tiles x
 * CUVIL_WINO_NW (two vectors of) output channels in registers. */
#if CUVIL_GEMM_VECTOR
#define CUVIL_WINO_W CUVIL_GEMM_W
typedef cuvil_vf cuvil_wv;
#define CUVIL_WINO_SPLAT(s) CUVIL_VSPLAT(s)
#define CUVIL_WINO_FMA(a, b, c) CUVIL_VFMA(a, b, c)
#else
#define CUVIL_WINO_W 1
typedef float cuvil_wv;
#define CUVIL_WINO_SPLAT(s) (s)
#define CUVIL_WINO_FMA(a, b, c) ((c) + (a) * (b))
#endif
#define CUVIL_WINO_NW (2 * CUVIL_WINO_W)
/* The transforms' loops run over at most 8 points: unrolled, their vectors stay in registers. */
#define CUVIL_WINO_UNROLL _Pragma("GCC unroll 8")
#if CUVIL_GEMM_NREG >= 32
#define CUVIL_WINO_R 12
#define CUVIL_WINO_ROWS(X) X(0) X(1) X(2) X(3) X(4) X(5) X(6) X(7) X(8) X(9) X(10) X(11)
#else
#define CUVIL_WINO_R 6
#define CUVIL_WINO_ROWS(X) X(0) X(1) X(2) X(3) X(4) X(5)
#endif
/* How far ahead (floats) the first pass of the products over the weights prefetches them. */
#define CUVIL_WINO_FETCH 4096
/* Input channels per pass of the products (a U panel of KC x NW floats stays in L1). */
#define CUVIL_WINO_KC 128
/* A block's transformed input is kept near this many bytes (L2 also holds the staging rows,
 * the products of one panel and the weights streaming through) ... */
#define CUVIL_WINO_VBYTES ((int64_t)384 << 10)
/* ... or near this many when the transformed weights are so large that streaming them once per
 * block from memory costs more than re-reading a larger block from L3 once per panel. */
#define CUVIL_WINO_VBYTES_BIG ((int64_t)1 << 20)
#define CUVIL_WINO_BIG_U ((int64_t)4 << 20)
/* Key of a transformed weight in the constant cache (key[0]; cuvil_sgemm uses 0 and 1). */
/* Shared mode only when each thread making a block's transform itself would add more than this
 * fraction of the products' work. */
#define CUVIL_WINO_REPEAT_MAX 0.1
#define CUVIL_WINO_CACHE_TAG INT64_C(0x57494e4f)

/* Stores n consecutive outputs: y[index + i] = epilogue(src[i], ...) for i < n, where index is
 * the start of an output row of ldy elements or lies inside one (the fused epilogue reads its
 * row-broadcast operands at (index + i) % ldy).  NULL: a plain copy. */
typedef void (*cuvil_wino_store_fn)(const void *ctx, const float *src, float *y, int64_t index, int64_t n,
                                    int64_t ldy);

static inline cuvil_wv cuvil_wino_load(const float *p) {
    cuvil_wv v;
    memcpy(&v, p, sizeof v);
    return v;
}

static inline void cuvil_wino_store(float *p, cuvil_wv v) { memcpy(p, &v, sizeof v); }

/* dst[l * ld + i] = src[i][l] for i, l < W: a W x W transpose (channels <-> pixels). */
static inline __attribute__((always_inline)) void cuvil_wino_transpose(const float *const *src, float *dst, int64_t ld) {
#if CUVIL_GEMM_VECTOR && defined(__AVX512F__) && CUVIL_WINO_W == 16
    __m512 r[16], t[16];
    for (int i = 0; i < 16; i++) r[i] = _mm512_loadu_ps(src[i]);
    for (int i = 0; i < 8; i++) { /* per 128-bit lane: pairs of rows interleaved */
        t[2 * i] = _mm512_unpacklo_ps(r[2 * i], r[2 * i + 1]);
        t[2 * i + 1] = _mm512_unpackhi_ps(r[2 * i], r[2 * i + 1]);
    }
    for (int i = 0; i < 4; i++) { /* per lane: one column of four rows */
        const __m512d a = _mm512_castps_pd(t[4 * i]), b = _mm512_castps_pd(t[4 * i + 1]);
        const __m512d c = _mm512_castps_pd(t[4 * i + 2]), d = _mm512_castps_pd(t[4 * i + 3]);
        r[4 * i] = _mm512_castpd_ps(_mm512_unpacklo_pd(a, c));
        r[4 * i + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(a, c));
        r[4 * i + 2] = _mm512_castpd_ps(_mm512_unpacklo_pd(b, d));
        r[4 * i + 3] = _mm512_castpd_ps(_mm512_unpackhi_pd(b, d));
    }
    for (int i = 0; i < 2; i++) /* lanes of eight rows */
        for (int k = 0; k < 4; k++) {
            t[8 * i + k] = _mm512_shuffle_f32x4(r[8 * i + k], r[8 * i + 4 + k], 0x88);
            t[8 * i + 4 + k] = _mm512_shuffle_f32x4(r[8 * i + k], r[8 * i + 4 + k], 0xdd);
        }
    for (int k = 0; k < 8; k++) {
        _mm512_storeu_ps(dst + k * ld, _mm512_shuffle_f32x4(t[k], t[8 + k], 0x88));
        _mm512_storeu_ps(dst + (k + 8) * ld, _mm512_shuffle_f32x4(t[k], t[8 + k], 0xdd));
    }
#else
    for (int l = 0; l < CUVIL_WINO_W; l++)
        for (int i = 0; i < CUVIL_WINO_W; i++) dst[l * ld + i] = src[i][l];
#endif
}

/* F(2x2,3x3): d = B^T s (4 -> 4) */
static inline void cuvil_wino_bt2(const cuvil_wv *s, int64_t ss, cuvil_wv *d, int64_t ds) {
    const cuvil_wv s0 = s[0], s1 = s[1 * ss], s2 = s[2 * ss], s3 = s[3 * ss];
    d[0 * ds] = s0 - s2;
    d[1 * ds] = s1 + s2;
    d[2 * ds] = -s1 + s2;
    d[3 * ds] = s1 - s3;
}

/* F(2x2,3x3): d = A^T s (4 -> 2) */
static inline void cuvil_wino_at2(const cuvil_wv *s, int64_t ss, cuvil_wv *d, int64_t ds) {
    const cuvil_wv s0 = s[0], s1 = s[1 * ss], s2 = s[2 * ss], s3 = s[3 * ss];
    d[0 * ds] = s0 + s1 + s2;
    d[1 * ds] = s1 - s2 - s3;
}

/* F(4x4,3x3): d = B^T s (6 -> 6) */
static inline void cuvil_wino_bt4(const cuvil_wv *s, int64_t ss, cuvil_wv *d, int64_t ds) {
    const cuvil_wv s0 = s[0], s1 = s[1 * ss], s2 = s[2 * ss], s3 = s[3 * ss], s4 = s[4 * ss], s5 = s[5 * ss];
    d[0 * ds] = s0 * 4.0f - s2 * 5.0f + s4;
    d[1 * ds] = -s1 * 4.0f - s2 * 4.0f + s3 + s4;
    d[2 * ds] = s1 * 4.0f - s2 * 4.0f - s3 + s4;
    d[3 * ds] = -s1 * 2.0f - s2 + s3 * 2.0f + s4;
    d[4 * ds] = s1 * 2.0f - s2 - s3 * 2.0f + s4;
    d[5 * ds] = s1 * 4.0f - s3 * 5.0f + s5;
}

/* F(4x4,3x3): d = A^T s (6 -> 4) */
static inline void cuvil_wino_at4(const cuvil_wv *s, int64_t ss, cuvil_wv *d, int64_t ds) {
    const cuvil_wv s0 = s[0], s1 = s[1 * ss], s2 = s[2 * ss], s3 = s[3 * ss], s4 = s[4 * ss], s5 = s[5 * ss];
    d[0 * ds] = s0 + s1 + s2 + s3 + s4;
    d[1 * ds] = s1 - s2 + s3 * 2.0f - s4 * 2.0f;
    d[2 * ds] = s1 + s2 + s3 * 4.0f + s4 * 4.0f;
    d[3 * ds] = s1 - s2 + s3 * 8.0f - s4 * 8.0f + s5;
}

/* F(6x6,3x3): d = B^T s (8 -> 8) */
static inline void cuvil_wino_bt6(const cuvil_wv *s, int64_t ss, cuvil_wv *d, int64_t ds) {
    const cuvil_wv s0 = s[0], s1 = s[1 * ss], s2 = s[2 * ss], s3 = s[3 * ss], s4 = s[4 * ss], s5 = s[5 * ss], s6 = s[6 * ss], s7 = s[7 * ss];
    d[0 * ds] = s0 - s2 * 5.25f + s4 * 5.25f - s6;
    d[1 * ds] = s1 + s2 - s3 * 4.25f - s4 * 4.25f + s5 + s6;
    d[2 * ds] = -s1 + s2 + s3 * 4.25f - s4 * 4.25f - s5 + s6;
    d[3 * ds] = s1 * 0.5f + s2 * 0.25f - s3 * 2.5f - s4 * 1.25f + s5 * 2.0f + s6;
    d[4 * ds] = -s1 * 0.5f + s2 * 0.25f + s3 * 2.5f - s4 * 1.25f - s5 * 2.0f + s6;
    d[5 * ds] = s1 * 2.0f + s2 * 4.0f - s3 * 2.5f - s4 * 5.0f + s5 * 0.5f + s6;
    d[6 * ds] = -s1 * 2.0f + s2 * 4.0f + s3 * 2.5f - s4 * 5.0f - s5 * 0.5f + s6;
    d[7 * ds] = -s1 + s3 * 5.25f - s5 * 5.25f + s7;
}

/* F(6x6,3x3): d = A^T s (8 -> 6) */
static inline void cuvil_wino_at6(const cuvil_wv *s, int64_t ss, cuvil_wv *d, int64_t ds) {
    const cuvil_wv s0 = s[0], s1 = s[1 * ss], s2 = s[2 * ss], s3 = s[3 * ss], s4 = s[4 * ss], s5 = s[5 * ss], s6 = s[6 * ss], s7 = s[7 * ss];
    d[0 * ds] = s0 + s1 + s2 + s3 + s4 + s5 + s6;
    d[1 * ds] = s1 - s2 + s3 * 2.0f - s4 * 2.0f + s5 * 0.5f - s6 * 0.5f;
    d[2 * ds] = s1 + s2 + s3 * 4.0f + s4 * 4.0f + s5 * 0.25f + s6 * 0.25f;
    d[3 * ds] = s1 - s2 + s3 * 8.0f - s4 * 8.0f + s5 * 0.125f - s6 * 0.125f;
    d[4 * ds] = s1 + s2 + s3 * 16.0f + s4 * 16.0f + s5 * 0.0625f + s6 * 0.0625f;
    d[5 * ds] = s1 - s2 + s3 * 32.0f - s4 * 32.0f + s5 * 0.03125f - s6 * 0.03125f + s7;
}


/* G for the weight transform (applied in double): u = G w G^T. */
static const double cuvil_wino_g2[4][3] = {{1, 0, 0}, {0.5, 0.5, 0.5}, {0.5, -0.5, 0.5}, {0, 0, 1}};
static const double cuvil_wino_g4[6][3] = {{1.0 / 4, 0, 0},           {-1.0 / 6, -1.0 / 6, -1.0 / 6},
                                           {-1.0 / 6, 1.0 / 6, -1.0 / 6}, {1.0 / 24, 1.0 / 12, 1.0 / 6},
                                           {1.0 / 24, -1.0 / 12, 1.0 / 6}, {0, 0, 1}};
static const double cuvil_wino_g6[8][3] = {{1, 0, 0},
                                           {-2.0 / 9, -2.0 / 9, -2.0 / 9},
                                           {-2.0 / 9, 2.0 / 9, -2.0 / 9},
                                           {1.0 / 90, 1.0 / 45, 2.0 / 45},
                                           {1.0 / 90, -1.0 / 45, 2.0 / 45},
                                           {32.0 / 45, 16.0 / 45, 8.0 / 45},
                                           {32.0 / 45, -16.0 / 45, 8.0 / 45},
                                           {0, 0, 1}};

static inline const double *cuvil_wino_g(int m) {
    return m == 2 ? &cuvil_wino_g2[0][0] : m == 4 ? &cuvil_wino_g4[0][0] : &cuvil_wino_g6[0][0];
}


/* ---- the transformed weights ------------------------------------------------------------- */

typedef struct cuvil_wino_wargs {
    int m;
    int64_t cout, cin;
    const float *w; /* [cout, cin, 3, 3] */
} cuvil_wino_wargs;

static inline int64_t cuvil_wino_cin_pad(int64_t cin) { return cuvil_gemm_round_up(cin, CUVIL_WINO_W); }
static inline int64_t cuvil_wino_cout_pad(int64_t cout) { return cuvil_gemm_round_up(cout, CUVIL_WINO_NW); }

/* Floats of the transformed weights U[cout_pad / NW][P][cin_pad][NW]: a panel's points lie
 * together, so the products of one panel read its weights as one sequential stream (and a
 * zero tail, so that the products' prefetches stay inside the buffer). */
static inline int64_t cuvil_wino_ufloats(int m, int64_t cout, int64_t cin) {
    return (int64_t)(m + 2) * (m + 2) * cuvil_wino_cout_pad(cout) * cuvil_wino_cin_pad(cin) + CUVIL_WINO_FETCH +
           CUVIL_WINO_NW;
}

/* U_p[ci][co] = (G w[co, ci] G^T)[p] in NW-wide panels of output channels; padding zero. */
static void cuvil_wino_build_u(void *dst, const void *arg) {
    const cuvil_wino_wargs *a = (const cuvil_wino_wargs *)arg;
    const int alpha = a->m + 2, P = alpha * alpha;
    const double *G = cuvil_wino_g(a->m);
    const int64_t cin = a->cin, cin_p = cuvil_wino_cin_pad(cin);
    float *u = (float *)dst;
    memset(u, 0, sizeof(float) * (size_t)cuvil_wino_ufloats(a->m, a->cout, cin));
    for (int64_t co = 0; co < a->cout; co++)
        for (int64_t ci = 0; ci < cin; ci++) {
            const float *w = a->w + (co * cin + ci) * 9;
            double t[8][3], v[8][8];
            for (int i = 0; i < alpha; i++)
                for (int j = 0; j < 3; j++)
                    t[i][j] = G[i * 3] * w[j] + G[i * 3 + 1] * w[3 + j] + G[i * 3 + 2] * w[6 + j];
            for (int i = 0; i < alpha; i++)
                for (int j = 0; j < alpha; j++)
                    v[i][j] = t[i][0] * G[j * 3] + t[i][1] * G[j * 3 + 1] + t[i][2] * G[j * 3 + 2];
            const int64_t at = co / CUVIL_WINO_NW * P * cin_p * CUVIL_WINO_NW + ci * CUVIL_WINO_NW + co % CUVIL_WINO_NW;
            for (int p = 0; p < P; p++) u[at + p * cin_p * CUVIL_WINO_NW] = (float)v[p / alpha][p % alpha];
        }
}

/* ---- the products ------------------------------------------------------------------------ */

/* C[0:rows, 0:NW] (+)= A[0:rows, 0:kc] x B[0:kc, 0:NW] (rows <= R, a constant after inlining):
 * A's rows lda apart (read in place, one broadcast per element), B packed kc x NW, C's rows ldc
 * apart; `acc` selects += over =. */
static inline __attribute__((always_inline)) void cuvil_wino_micro(const int rows, const int fetch, int64_t kc,
                                                                   const float *restrict A, int64_t lda,
                                                                   const float *restrict B, float *restrict C,
                                                                   int64_t ldc, int acc) {
    enum { W = CUVIL_WINO_W };
#define CUVIL_WK_DECL(i) cuvil_wv c##i##a = CUVIL_WINO_SPLAT(0.0f), c##i##b = CUVIL_WINO_SPLAT(0.0f);
    CUVIL_WINO_ROWS(CUVIL_WK_DECL)
#undef CUVIL_WK_DECL
    for (int64_t k = 0; k < kc; k++) {
        const cuvil_wv b0 = cuvil_wino_load(B), b1 = cuvil_wino_load(B + W);
        if (fetch) { /* the weights streaming from memory: ask for them well ahead */
            __builtin_prefetch(B + CUVIL_WINO_FETCH, 0, 0);
            __builtin_prefetch(B + CUVIL_WINO_FETCH + CUVIL_WINO_NW / 2, 0, 0);
        }
#define CUVIL_WK_STEP(i)                                          \
    if (i < rows) {                                               \
        const cuvil_wv a = CUVIL_WINO_SPLAT(A[i * lda + k]);     \
        c##i##a = CUVIL_WINO_FMA(a, b0, c##i##a);                 \
        c##i##b = CUVIL_WINO_FMA(a, b1, c##i##b);                 \
    }
        CUVIL_WINO_ROWS(CUVIL_WK_STEP)
#undef CUVIL_WK_STEP
        B += CUVIL_WINO_NW;
    }
    if (acc) {
#define CUVIL_WK_ACC(i)                                                                   \
    if (i < rows) {                                                                       \
        cuvil_wino_store(C + i * ldc, cuvil_wino_load(C + i * ldc) + c##i##a);           \
        cuvil_wino_store(C + i * ldc + W, cuvil_wino_load(C + i * ldc + W) + c##i##b);   \
    }
        CUVIL_WINO_ROWS(CUVIL_WK_ACC)
#undef CUVIL_WK_ACC
    } else {
#define CUVIL_WK_SET(i)                             \
    if (i < rows) {                                 \
        cuvil_wino_store(C + i * ldc, c##i##a);     \
        cuvil_wino_store(C + i * ldc + W, c##i##b); \
    }
        CUVIL_WINO_ROWS(CUVIL_WK_SET)
#undef CUVIL_WK_SET
    }
}

/* The products of one point for one panel: M_p[0:slots, 0:NW] = V_p[0:slots, 0:cin_p] x U_p panel
 * (slots a multiple of R / 3: full tiles of R rows, then one of R / 3 or 2 R / 3). */
static void cuvil_wino_products(int64_t slots, int64_t cin_p, const float *Vp, const float *Up, float *Mp) {
    enum { R = CUVIL_WINO_R, Q = CUVIL_WINO_R / 3, NW = CUVIL_WINO_NW };
    for (int64_t k0 = 0; k0 < cin_p; k0 += CUVIL_WINO_KC) {
        const int64_t kc = cuvil_gemm_min(cin_p - k0, CUVIL_WINO_KC);
        const float *Bk = Up + k0 * NW;
        int64_t s = 0;
        /* the first pass over this part of the weights fetches ahead; the others find it in L1 */
        if (s + R <= slots) {
            cuvil_wino_micro(R, 1, kc, Vp + k0, cin_p, Bk, Mp, NW, k0 > 0);
            s += R;
        }
        for (; s + R <= slots; s += R)
            cuvil_wino_micro(R, 0, kc, Vp + s * cin_p + k0, cin_p, Bk, Mp + s * NW, NW, k0 > 0);
        if (slots - s == 2 * Q)
            cuvil_wino_micro(2 * Q, s == 0, kc, Vp + s * cin_p + k0, cin_p, Bk, Mp + s * NW, NW, k0 > 0);
        else if (slots - s == Q)
            cuvil_wino_micro(Q, s == 0, kc, Vp + s * cin_p + k0, cin_p, Bk, Mp + s * NW, NW, k0 > 0);
    }
}

/* ---- one convolution ---------------------------------------------------------------------- */

typedef struct cuvil_wino_job {
    const cuvil_conv_geom *g;
    int m;
    const float *x, *u, *b;
    float *y;
    cuvil_wino_store_fn store;
    const void *store_ctx;
    int in_place;           /* outputs may be written to y before the store runs on them */
    int64_t th, tw, trows;  /* tile rows and columns per image; tile rows of the batch */
    int64_t cin_p, cout_p;  /* channel counts padded to W and NW */
    int64_t wp;             /* columns of the padded input rows: tw * m + 2 */
    int64_t rb, slots;      /* tile rows per block; tile slots per block (rb * tw rounded up to R / 3) */
    int64_t cparts;         /* ranges of output-channel panels per block */
    float *scratch;         /* per thread: org, Xs, V, M, O, S (see cuvil_wino_task) */
    int64_t sfloats;        /* floats per thread */
    int64_t sw;             /* floats per staging row: OW rounded up to W */
    const float *bias;      /* cout_p floats (zero past cout) */
    int64_t off_xs, off_v, off_m, off_o, off_s; /* where Xs, V, M, O and S start in a thread's scratch */
    /* shared mode (few blocks, their panels split across threads): the current block's Xs, org and V,
     * made once for all its tasks instead of by each */
    float *xs_sh, *v_sh;
    int64_t *org_sh;
    int64_t cur_block, vparts;
    int64_t *vblock;        /* per thread (stride 8): the block whose transformed input its V holds, or -1 */
} cuvil_wino_job;

/* Image row `row` (in padded coordinates) of image n into dst [wp][cin_p], zero outside. */
static void cuvil_wino_copy_row(const cuvil_wino_job *j, int64_t n, int64_t row, float *dst) {
    const cuvil_conv_geom *g = j->g;
    const int64_t H = g->in[0], Wd = g->in[1], cin = g->cin, cin_p = j->cin_p, wp = j->wp;
    const int64_t yy = row - g->pad[0];
    if (yy < 0 || yy >= H) {
        memset(dst, 0, sizeof(float) * (size_t)(wp * cin_p));
        return;
    }
    /* columns [x0, x1) of the padded row hold image columns [x0 - pad, x1 - pad) */
    const int64_t x0 = cuvil_gemm_min(g->pad[1], wp), x1 = cuvil_gemm_min(g->pad[1] + Wd, wp);
    memset(dst, 0, sizeof(float) * (size_t)(x0 * cin_p));
    if (x1 < wp) memset(dst + x1 * cin_p, 0, sizeof(float) * (size_t)((wp - x1) * cin_p));
    /* image column xx - pad of channel c: src[c * plane + xx - pad] */
    const float *src = j->x + n * cin * H * Wd + yy * Wd;
    const int64_t plane = H * Wd, pad = g->pad[1];
    enum { W = CUVIL_WINO_W };
    /* The rows are copied in order, W channel planes at a time: fetching the row two below
     * (which a later call copies) hides the memory latency of these many streams. */
    const int64_t ahead = yy + 2 < H ? 2 * Wd : 0;
    for (int64_t c0 = 0; c0 < cin_p; c0 += W) {
        int64_t xx = x0;
        if (c0 + W <= cin) /* W channels x W columns at a time */
            for (; xx + W <= x1; xx += W) {
                const float *rows[W];
                for (int l = 0; l < W; l++) {
                    rows[l] = src + (c0 + l) * plane + xx - pad;
                    if (ahead) __builtin_prefetch(rows[l] + ahead, 0, 1);
                }
                cuvil_wino_transpose(rows, dst + xx * cin_p + c0, cin_p);
            }
        for (; xx < x1; xx++)
            for (int64_t c = c0; c < c0 + W; c++) dst[xx * cin_p + c] = c < cin ? src[c * plane + xx - pad] : 0.0f;
    }
}

/* The input rows of tile rows [g0, g1) into Xs; org[i]: the Xs row of tile row g0 + i's first row. */
static void cuvil_wino_copy_rows(const cuvil_wino_job *j, int64_t g0, int64_t g1, float *Xs, int64_t *org) {
    const int m = j->m, alpha = m + 2;
    const int64_t row_floats = j->wp * j->cin_p;
    int64_t o = 0;
    for (int64_t gi = g0; gi < g1; gi++) {
        const int64_t n = gi / j->th, ty = gi % j->th;
        /* a tile row's first two input rows are the previous one's last two, when it has one */
        const int first = gi == g0 || ty == 0 ? 0 : 2;
        for (int r = first; r < alpha; r++) cuvil_wino_copy_row(j, n, ty * m + r, Xs + (o + r - first) * row_floats);
        org[gi - g0] = o - first;
        o += alpha - first;
    }
}

/* V_p[s][0:cin_p] = (B^T d B)[p] for the tile slots [s0, s1) of a block of tile rows. */
static inline __attribute__((always_inline)) void cuvil_wino_input(const cuvil_wino_job *j, const int m,
                                                                   int64_t ntiles, const float *Xs,
                                                                   const int64_t *org, float *V, int64_t s0,
                                                                   int64_t s1) {
    enum { W = CUVIL_WINO_W };
    const int alpha = m + 2, P = alpha * alpha;
    const int64_t cin_p = j->cin_p, slots = j->slots, tw = j->tw, wp = j->wp;
    for (int64_t s = s0; s < s1; s++) {
        if (s >= ntiles) { /* slots past the block's tiles: zero rows of the products */
            for (int p = 0; p < P; p++) memset(V + (p * slots + s) * cin_p, 0, sizeof(float) * (size_t)cin_p);
            continue;
        }
        const float *base = Xs + (org[s / tw] * wp + s % tw * m) * cin_p;
        for (int64_t c = 0; c < cin_p; c += W) {
            cuvil_wv d[64], t[64];
            CUVIL_WINO_UNROLL
            for (int i = 0; i < alpha; i++)
                for (int k = 0; k < alpha; k++) d[i * alpha + k] = cuvil_wino_load(base + (i * wp + k) * cin_p + c);
            CUVIL_WINO_UNROLL
            for (int k = 0; k < alpha; k++) { /* columns: t = B^T d */
                if (m == 2) cuvil_wino_bt2(d + k, alpha, t + k, alpha);
                else if (m == 4) cuvil_wino_bt4(d + k, alpha, t + k, alpha);
                else cuvil_wino_bt6(d + k, alpha, t + k, alpha);
            }
            CUVIL_WINO_UNROLL
            for (int i = 0; i < alpha; i++) { /* rows: d = t B */
                if (m == 2) cuvil_wino_bt2(t + i * alpha, 1, d + i * alpha, 1);
                else if (m == 4) cuvil_wino_bt4(t + i * alpha, 1, d + i * alpha, 1);
                else cuvil_wino_bt6(t + i * alpha, 1, d + i * alpha, 1);
            }
            CUVIL_WINO_UNROLL
            for (int p = 0; p < P; p++) cuvil_wino_store(V + (p * slots + s) * cin_p + c, d[p]);
        }
    }
}

/* Whether the W output channels from c0 are written straight into y: they all exist, and the
 * store (if any) may then run on y in place. */
static inline int cuvil_wino_direct(const cuvil_wino_job *j, int64_t c0) {
    return j->in_place && c0 + CUVIL_WINO_W <= j->g->cout;
}

/* Output channels [c0, c0 + NW) (one panel; M_p [slots][NW]) of the block's tiles, plus the
 * bias, into O[tile][pixel][NW], then transposed into the staging rows S[co - c0][row][sw]. */
static inline __attribute__((always_inline)) void cuvil_wino_output(const cuvil_wino_job *j, const int m,
                                                                    int64_t g0, int64_t g1, int64_t c0,
                                                                    const float *M, float *O, float *S) {
    enum { W = CUVIL_WINO_W, NW = CUVIL_WINO_NW };
    const int alpha = m + 2, P = alpha * alpha, mm = m * m;
    const int64_t slots = j->slots, tw = j->tw, ntiles = (g1 - g0) * tw, sw = j->sw, srows = j->rb * m;
    const int64_t OH = j->g->out[0], OW = j->g->out[1];
    const cuvil_wv bias[2] = {cuvil_wino_load(j->bias + c0), cuvil_wino_load(j->bias + c0 + W)};
    for (int64_t s = 0; s < ntiles; s++)
        for (int h = 0; h < 2; h++) {
            cuvil_wv sv[64], t[64];
            CUVIL_WINO_UNROLL
            for (int p = 0; p < P; p++) sv[p] = cuvil_wino_load(M + (p * slots + s) * NW + h * W);
            CUVIL_WINO_UNROLL
            for (int k = 0; k < alpha; k++) { /* columns: t = A^T s */
                if (m == 2) cuvil_wino_at2(sv + k, alpha, t + k, alpha);
                else if (m == 4) cuvil_wino_at4(sv + k, alpha, t + k, alpha);
                else cuvil_wino_at6(sv + k, alpha, t + k, alpha);
            }
            CUVIL_WINO_UNROLL
            for (int i = 0; i < m; i++) { /* rows: s = t A */
                if (m == 2) cuvil_wino_at2(t + i * alpha, 1, sv + i * m, 1);
                else if (m == 4) cuvil_wino_at4(t + i * alpha, 1, sv + i * m, 1);
                else cuvil_wino_at6(t + i * alpha, 1, sv + i * m, 1);
            }
            CUVIL_WINO_UNROLL
            for (int q = 0; q < mm; q++) cuvil_wino_store(O + (s * mm + q) * NW + h * W, sv[q] + bias[h]);
        }
    /* output row r of tile row gi: pixel x lies in tile x / m at column x % m; a half panel of
     * whole channels goes straight into y when allowed (cuvil_wino_direct), else into S */
    for (int64_t gi = 0; gi < g1 - g0; gi++) {
        const int64_t n = (g0 + gi) / j->th, oy0 = (g0 + gi) % j->th * m;
        for (int r = 0; r < m && oy0 + r < OH; r++)
            for (int h = 0; h < 2; h++) {
                const float *o = O + (gi * tw * mm + r * m) * NW + h * W;
                const int direct = cuvil_wino_direct(j, c0 + h * W);
                float *dst = direct ? j->y + ((n * j->g->cout + c0 + h * W) * OH + oy0 + r) * OW
                                    : S + (h * W * srows + gi * m + r) * sw;
                const int64_t ld = direct ? OH * OW : srows * sw;
                int64_t x0 = 0;
                for (; x0 + W <= OW; x0 += W) {
                    const float *px[W];
                    for (int i = 0; i < W; i++) px[i] = o + ((x0 + i) / m * mm + (x0 + i) % m) * NW;
                    cuvil_wino_transpose(px, dst + x0, ld);
                }
                for (; x0 < OW; x0++)
                    for (int l = 0; l < W; l++) dst[l * ld + x0] = o[(x0 / m * mm + x0 % m) * NW + l];
            }
    }
}

/* One task: a block of tile rows and a range of output-channel panels.  Scratch: org (rb), Xs
 * (the input rows), V (P x slots x cin_p), M (P x slots x NW), O (slots x m^2 x NW), S (NW x
 * rb * m x sw). */
static inline __attribute__((always_inline)) void cuvil_wino_task(const cuvil_wino_job *j, const int m,
                                                                  int64_t task, int tid) {
    const int alpha = m + 2, P = alpha * alpha;
    const cuvil_conv_geom *g = j->g;
    const int64_t cin_p = j->cin_p, cout_p = j->cout_p, slots = j->slots, cout = g->cout;
    const int64_t OH = g->out[0], OW = g->out[1], sw = j->sw, srows = j->rb * m;
    const int64_t block = j->v_sh ? j->cur_block : task / j->cparts;
    const int64_t g0 = block * j->rb, g1 = cuvil_gemm_min(g0 + j->rb, j->trows);
    const int64_t ntiles = (g1 - g0) * j->tw;
    int64_t plo, phi;
    cuvil_split(cout_p / CUVIL_WINO_NW, j->cparts, task % j->cparts, &plo, &phi);
    if (plo == phi) return;
    float *mine = j->scratch + (size_t)tid * (size_t)j->sfloats;
    int64_t *org = (int64_t *)mine;
    float *Xs = mine + j->off_xs, *V = mine + j->off_v, *M = mine + j->off_m, *O = mine + j->off_o;
    float *S = mine + j->off_s;
    if (j->v_sh) {
        V = j->v_sh; /* made for the block by cuvil_wino_vtask */
    } else if (j->vblock[8 * tid] != block) { /* else this thread's last task had the same block */
        cuvil_wino_copy_rows(j, g0, g1, Xs, org);
        cuvil_wino_input(j, m, ntiles, Xs, org, V, 0, slots);
        j->vblock[8 * tid] = block;
    }
    for (int64_t panel = plo; panel < phi; panel++) {
        const int64_t c0 = panel * CUVIL_WINO_NW;
        for (int p = 0; p < P; p++) {
            const float *Up = j->u + ((size_t)panel * (size_t)P + (size_t)p) * (size_t)cin_p * CUVIL_WINO_NW;
            const float *Vp = V + (size_t)p * (size_t)slots * (size_t)cin_p;
            float *Mp = M + (size_t)p * (size_t)slots * CUVIL_WINO_NW;
            cuvil_wino_products(slots, cin_p, Vp, Up, Mp);
        }
        cuvil_wino_output(j, m, g0, g1, c0, M, O, S);
        for (int64_t cl = 0; cl < CUVIL_WINO_NW && c0 + cl < cout; cl++) {
            const int direct = cuvil_wino_direct(j, c0 + cl / CUVIL_WINO_W * CUVIL_WINO_W);
            if (direct && !j->store) continue;
            for (int64_t gi = g0; gi < g1; gi++) {
                const int64_t n = gi / j->th, oy0 = gi % j->th * m;
                for (int r = 0; r < m && oy0 + r < OH; r++) {
                    const int64_t idx = ((n * cout + c0 + cl) * OH + oy0 + r) * OW;
                    const float *src = direct ? j->y + idx : S + (cl * srows + (gi - g0) * m + r) * sw;
                    if (j->store) j->store(j->store_ctx, src, j->y, idx, OW, OW);
                    else memcpy(j->y + idx, src, sizeof(float) * (size_t)OW);
                }
            }
        }
    }
}

/* Shared mode: part `task` of the current block's tile slots through the input transform. */
static inline __attribute__((always_inline)) void cuvil_wino_vtask(const cuvil_wino_job *j, const int m,
                                                                   int64_t task) {
    const int64_t g0 = j->cur_block * j->rb, g1 = cuvil_gemm_min(g0 + j->rb, j->trows);
    int64_t s0, s1;
    cuvil_split(j->slots, j->vparts, task, &s0, &s1);
    cuvil_wino_input(j, m, (g1 - g0) * j->tw, j->xs_sh, j->org_sh, j->v_sh, s0, s1);
}

/* The tile sizes m this unit compiles tasks for, as a bit set (bit m: F(m x m, 3 x 3)).  The
 * generated code defines it from the convolutions it runs (most models use one or two sizes;
 * each size's tasks are a third of this header's code and compile time); by default, all. */
#ifndef CUVIL_WINO_TILES
#define CUVIL_WINO_TILES ((1 << 2) | (1 << 4) | (1 << 6))
#endif
#define CUVIL_WINO_TASKS(M)                                                                         \
    static void cuvil_wino_vtask##M(void *ctx, int64_t task, int tid) {                             \
        (void)tid;                                                                                  \
        cuvil_wino_vtask((const cuvil_wino_job *)ctx, M, task);                                     \
    }                                                                                               \
    static void cuvil_wino_task##M(void *ctx, int64_t task, int tid) {                              \
        cuvil_wino_task((const cuvil_wino_job *)ctx, M, task, tid);                                 \
    }
#if CUVIL_WINO_TILES & (1 << 2)
CUVIL_WINO_TASKS(2)
#endif
#if CUVIL_WINO_TILES & (1 << 4)
CUVIL_WINO_TASKS(4)
#endif
#if CUVIL_WINO_TILES & (1 << 6)
CUVIL_WINO_TASKS(6)
#endif

/* The task of tile size m (vector: the block-split input transform's), or NULL when this unit
 * does not compile that size. */
static inline cuvil_task_fn cuvil_wino_task_of(int m, int vector) {
#if CUVIL_WINO_TILES & (1 << 2)
    if (m == 2) return vector ? cuvil_wino_vtask2 : cuvil_wino_task2;
#endif
#if CUVIL_WINO_TILES & (1 << 4)
    if (m == 4) return vector ? cuvil_wino_vtask4 : cuvil_wino_task4;
#endif
#if CUVIL_WINO_TILES & (1 << 6)
    if (m == 6) return vector ? cuvil_wino_vtask6 : cuvil_wino_task6;
#endif
    (void)m, (void)vector;
    return NULL;
}

/* Y = conv(X, w) + b by Winograd F(m x m, 3 x 3), m in {2, 4, 6} and in CUVIL_WINO_TILES; g: a
 * 2-D convolution with a 3x3 kernel, unit strides and dilations, one group (the generated code
 * checks this).  `store`, when given, writes the outputs (the fused epilogue); `store_in_place`:
 * it reads no operand but its src, so the convolution may be written into y first and the store
 * run on y in place (else, since an epilogue operand may share y's memory, the outputs are
 * staged).  Returns 0, -1 when memory cannot be had, or -2 for a tile size this unit was not
 * built with (a code generator bug). */
static CUVIL_UNUSED int cuvil_conv_winograd_f32(const cuvil_conv_geom *g, int m, const float *x, const float *w,
                                                const float *b, float *y, cuvil_wino_store_fn store,
                                                const void *store_ctx, int store_in_place) {
    const int alpha = m + 2, P = alpha * alpha;
    const int64_t cin = g->cin, cout = g->cout, OH = g->out[0], OW = g->out[1];
    const cuvil_task_fn fn = cuvil_wino_task_of(m, 0), vfn = cuvil_wino_task_of(m, 1);
    if (!fn || !vfn) return -2;
    if (g->batch == 0 || cout == 0 || OH == 0 || OW == 0) return 0;
    if (cin == 0) { /* no inputs: the bias alone */
        for (int64_t n = 0; n < g->batch; n++)
            for (int64_t co = 0; co < cout; co++)
                for (int64_t oy = 0; oy < OH; oy++) {
                    const int64_t idx = ((n * cout + co) * OH + oy) * OW;
                    for (int64_t ox = 0; ox < OW; ox++) y[idx + ox] = b ? b[co] : 0.0f;
                    if (store) store(store_ctx, y + idx, y, idx, OW, OW);
                }
        return 0;
    }
    cuvil_wino_job j;
    memset(&j, 0, sizeof j);
    j.g = g, j.m = m, j.x = x, j.b = b, j.y = y, j.store = store, j.store_ctx = store_ctx;
    j.in_place = !store || store_in_place;
    j.th = (OH + m - 1) / m, j.tw = (OW + m - 1) / m, j.trows = g->batch * j.th;
    j.cin_p = cuvil_wino_cin_pad(cin), j.cout_p = cuvil_wino_cout_pad(cout), j.wp = j.tw * m + 2;
    j.sw = cuvil_gemm_round_up(OW, CUVIL_WINO_W);
    /* Block sizes depend on the shapes only (never on the thread count). */
    const int64_t row_bytes = (int64_t)sizeof(float) * P * j.tw * j.cin_p;
    const int64_t vbytes = (int64_t)sizeof(float) * cuvil_wino_ufloats(m, cout, cin) > CUVIL_WINO_BIG_U
                               ? CUVIL_WINO_VBYTES_BIG : CUVIL_WINO_VBYTES;
    j.rb = cuvil_gemm_min(j.trows, vbytes / row_bytes > 1 ? vbytes / row_bytes : 1);
    const int64_t panels = j.cout_p / CUVIL_WINO_NW;
    const int threads = cuvil_num_threads_now();
    /* A small image with few output channels is one block of one panel: with several threads,
     * smaller blocks, two tasks per thread.  Each tile's arithmetic is the same in any block, so
     * the results stay bitwise the same. */
    if (threads > 1) {
        const int64_t want = (2 * threads + panels - 1) / panels;
        if ((j.trows + j.rb - 1) / j.rb < want) j.rb = (j.trows + want - 1) / want; /* >= 1: trows >= 1 */
    }
    j.slots = cuvil_gemm_round_up(j.rb * j.tw, CUVIL_WINO_R / 3);
    const int64_t blocks = (j.trows + j.rb - 1) / j.rb;
    /* Enough tasks to balance the threads; a panel range that another thread runs repeats its block's
     * input transform, so only as many as needed. */
    j.cparts = 1;
    if (threads > 1 && blocks < 4 * threads) j.cparts = cuvil_gemm_min(panels, (4 * threads + blocks - 1) / blocks);
    /* The transformed weights: from the model's cache when w is a constant, else made for this call. */
    const cuvil_wino_wargs wa = {m, cout, cin, w};
    const size_t ubytes = cuvil_size3(sizeof(float), (size_t)cuvil_wino_ufloats(m, cout, cin), 1);
    if (ubytes == SIZE_MAX) return -1;
    float *own_u = NULL;
    if (cuvil_is_constant(w, cuvil_size3(sizeof(float), (size_t)(cout * cin), 9))) {
        const int64_t key[CUVIL_CACHE_KEY] = {CUVIL_WINO_CACHE_TAG, m, cout, cin, CUVIL_WINO_NW, CUVIL_WINO_W, 0, 0};
        j.u = (const float *)cuvil_cache_get(w, key, ubytes, cuvil_wino_build_u, &wa);
    }
    if (!j.u) {
        own_u = (float *)aligned_alloc(CUVIL_ALIGN, (size_t)cuvil_gemm_round_up((int64_t)ubytes, CUVIL_ALIGN));
        if (!own_u) return -1;
        cuvil_wino_build_u(own_u, &wa);
        j.u = own_u;
    }
    float *bias = (float *)aligned_alloc(CUVIL_ALIGN, (size_t)cuvil_gemm_round_up(4 * j.cout_p, CUVIL_ALIGN));
    if (!bias) {
        free(own_u);
        return -1;
    }
    for (int64_t co = 0; co < j.cout_p; co++) bias[co] = b && co < cout ? b[co] : 0.0f;
    j.bias = bias;
    const int64_t ntasks = blocks * j.cparts, nscratch = ntasks > 1 ? threads : 1;
    const int64_t a4 = CUVIL_ALIGN / 4; /* each buffer starts on an alignment boundary */
    j.off_xs = cuvil_gemm_round_up(2 * j.rb, a4);
    j.off_v = j.off_xs + cuvil_gemm_round_up(j.rb * alpha * j.wp * j.cin_p, a4);
    j.off_m = j.off_v + cuvil_gemm_round_up((int64_t)P * j.slots * j.cin_p, a4);
    j.off_o = j.off_m + cuvil_gemm_round_up((int64_t)P * j.slots * CUVIL_WINO_NW, a4);
    j.off_s = j.off_o + cuvil_gemm_round_up((int64_t)m * m * j.slots * CUVIL_WINO_NW, a4);
    j.sfloats = j.off_s + cuvil_gemm_round_up(CUVIL_WINO_NW * j.rb * m * j.sw, a4);
    const size_t sbytes = cuvil_size3(sizeof(float), (size_t)j.sfloats, (size_t)nscratch);
    j.scratch = sbytes == SIZE_MAX ? NULL : (float *)aligned_alloc(CUVIL_ALIGN, sbytes);
    j.vblock = j.scratch ? (int64_t *)malloc(sizeof(int64_t) * 8 * (size_t)nscratch) : NULL;
    if (!j.vblock) {
        free(j.scratch);
        free(bias);
        free(own_u);
        return -1;
    }
    for (int64_t t = 0; t < nscratch; t++) j.vblock[8 * t] = -1;
    int rc = 0;
    if (ntasks == 1) {
        fn(&j, 0, 0);
    } else if (j.cparts > 2 && (double)(cuvil_gemm_min(threads, j.cparts) - 1) * 2.0 * (m + 2) >
                                   CUVIL_WINO_REPEAT_MAX * 2.0 * (double)j.cout_p) {
        /* Few blocks, each split into several panel ranges: rather than each task repeating its
         * block's input transform, the block's rows are copied once and its transform is split
         * across the threads by tile slots, then its panels are. */
        const size_t xs_f = (size_t)cuvil_gemm_round_up(j.rb * (m + 2) * j.wp * j.cin_p, a4);
        const size_t v_f = (size_t)cuvil_gemm_round_up((int64_t)P * j.slots * j.cin_p, a4);
        const size_t shb = cuvil_size3(sizeof(float), xs_f + v_f + (size_t)cuvil_gemm_round_up(2 * j.rb, a4), 1);
        float *sh = shb == SIZE_MAX ? NULL : (float *)aligned_alloc(CUVIL_ALIGN, shb);
        if (!sh) {
            rc = -1;
        } else {
            j.org_sh = (int64_t *)sh;
            j.xs_sh = sh + cuvil_gemm_round_up(2 * j.rb, a4);
            j.v_sh = j.xs_sh + xs_f;
            j.vparts = cuvil_gemm_min(j.slots, 4 * (int64_t)threads);
            for (int64_t blk = 0; blk < blocks; blk++) {
                j.cur_block = blk;
                cuvil_wino_copy_rows(&j, blk * j.rb, cuvil_gemm_min(blk * j.rb + j.rb, j.trows), j.xs_sh, j.org_sh);
                cuvil_parallel_for(j.vparts, vfn, &j);
                cuvil_parallel_for(j.cparts, fn, &j);
            }
            free(sh);
        }
    } else {
        cuvil_parallel_for(ntasks, fn, &j);
    }
    free(j.vblock);
    free(j.scratch);
    free(bias);
    free(own_u);
    return rc;
}

#endif /* CUVIL_WINOGRAD_H */
