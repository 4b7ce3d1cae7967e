/* Cuvil's fused scaled dot-product attention (the `attention` op), single precision:
 *
 *   Y[b, h, i, :] = sum_j softmax_j(softcap(scale(Q[b,h,i,:] . K[b,g,j,:])) + bias[b,h,i,j]) V[b,g,j,:]
 *
 * with g = h / (q_heads / kv_heads) (grouped-query heads).  The bias is the attention mask
 * (float, or bool: true attends; broadcast by strides; keys at or past its last dim are
 * masked), the causal mask (key j of query i is masked when j > i + offset) and the padding
 * mask (keys at or past nonpad[b] are masked).
 *
 * First the keys and values are packed once per call, per (batch, key/value head, block of KB
 * keys): the key block transposed ([head_size][KB], scaled for the split scale) and the value
 * block padded to whole vectors (O(seq) memory, like K and V themselves).
 * Then, flash-style, a task owns one (batch, query head, block of QB queries).  It walks the
 * key blocks, computes the QB x KB score block into a small buffer (a register-blocked
 * product of the query block and the packed key block, vectorised over keys),
 * applies scale, softcap and bias, and folds the block into each row's running maximum m,
 * running sum l and unnormalised output O (online softmax: O and l are rescaled by
 * exp(m_old - m_new) when the maximum grows), then O += P V (vectorised over the value dims).
 * The full seq x seq score matrix never exists; a task's buffers (some tens of KB) stay in
 * L1/L2.  With causal or padding masks, key blocks no query of the block may see are skipped.
 *
 * exp is a vector polynomial (Cephes' expf: range reduction by ln 2, degree-6 polynomial,
 * about 1 ulp), exact 0 for -inf and NaN kept.  Tasks are independent and each computes its
 * rows in one fixed order, so results are bitwise the same for any number of threads.
 *
 * qk (when not NULL) receives the [b, q_heads, q_seq, kv_seq] scores at the stage qk_mode
 * names (0 scaled, 1 after softcap, 2 after the bias, 3 the probabilities); key blocks are
 * then never skipped.
 */
#ifndef CUVIL_ATTENTION_H
#define CUVIL_ATTENTION_H

#include <math.h>
#include <string.h>

#include "cuvil_rt.h"
#include "cuvil_threads.h"
#include "cuvil_vmath.h" /* the soft-cap's tanh, vectorised */

#if (defined(__GNUC__) || defined(__clang__))
#if defined(__AVX512F__) || defined(__FMA__)
#include <immintrin.h>
#endif
#if defined(__AVX512F__)
#define CUVIL_ATT_W 16
typedef float cuvil_av __attribute__((vector_size(64)));
typedef int32_t cuvil_ai __attribute__((vector_size(64)));
#define CUVIL_ATT_FMA(a, b, c) ((cuvil_av)_mm512_fmadd_ps((__m512)(a), (__m512)(b), (__m512)(c)))
#elif defined(__AVX__)
#define CUVIL_ATT_W 8
typedef float cuvil_av __attribute__((vector_size(32)));
typedef int32_t cuvil_ai __attribute__((vector_size(32)));
#if defined(__FMA__)
#define CUVIL_ATT_FMA(a, b, c) ((cuvil_av)_mm256_fmadd_ps((__m256)(a), (__m256)(b), (__m256)(c)))
#endif
#else
#define CUVIL_ATT_W 4
typedef float cuvil_av __attribute__((vector_size(16)));
typedef int32_t cuvil_ai __attribute__((vector_size(16)));
#endif
#else
#error "cuvil_attention.h needs GCC or Clang vector extensions"
#endif
#ifndef CUVIL_ATT_FMA
#define CUVIL_ATT_FMA(a, b, c) ((a) * (b) + (c))
#endif
/* Keep a vector loaded once in a register: GCC would otherwise fold its load into each of the
 * four multiply-adds that read it, and the loads, not the multiply-adds, would set the pace. */
#if defined(CUVIL_ATT_KEEP)
/* set by the build (an emulated target, whose vectors live in no register, sets it empty) */
#elif defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define CUVIL_ATT_KEEP(v) __asm__("" : "+v"(v))
#else
#define CUVIL_ATT_KEEP(v) ((void)0)
#endif

#define CUVIL_ATT_KB (4 * CUVIL_ATT_W) /* keys per block: four vectors */
#define CUVIL_ATT_QB 32                /* queries per task (at most) */
#define CUVIL_ATT_RB 4                 /* rows per register block */

enum { CUVIL_ATT_SPLIT = 0, CUVIL_ATT_MUL = 1, CUVIL_ATT_DIV = 2 };

typedef struct cuvil_attn {
    int64_t batch, hq, hkv, sq, skv, dk, dv;
    /* element strides (batch, head, position) of each operand; the head-size dim is contiguous */
    int64_t qs[3], ks[3], vs[3], ys[3];
    const float *q, *k, *v;
    float *y;
    const float *mask_f;   /* float mask, or NULL */
    const uint8_t *mask_b; /* bool mask, or NULL */
    int64_t ms[4];         /* mask strides over (batch, query head, query, key); 0 where broadcast */
    int64_t mcols;         /* the mask's keys: keys past it are masked */
    const int64_t *nonpad; /* [batch] valid keys, or NULL */
    int causal;
    int64_t causal_offset; /* used when nonpad is NULL */
    int scale_mode;
    float scale;           /* the factor on Q and K (split), or on the scores (mul, div) */
    float softcap;         /* 0: none */
    int guard;             /* a row whose bias masks every key gives 0 */
    float *qk;             /* [batch, hq, sq, skv] scores, or NULL */
    int qk_mode;
} cuvil_attn;

#if CUVIL_LIB_BODY /* the kernel library's code (cuvil_rt.h) */
static inline cuvil_av cuvil_att_load(const float *p) {
    cuvil_av v;
    memcpy(&v, p, sizeof v);
    return v;
}

static inline void cuvil_att_store(float *p, cuvil_av v) { memcpy(p, &v, sizeof v); }

static inline cuvil_av cuvil_att_splat(float s) {
    cuvil_av v;
    for (int i = 0; i < CUVIL_ATT_W; i++) v[i] = s;
    return v;
}

/* exp(x) per lane: Cephes expf.  x < -87.3 (and -inf) gives 0, x > 88.7 gives inf, NaN stays NaN. */
static inline __attribute__((always_inline)) cuvil_av cuvil_att_exp(cuvil_av x) {
    const cuvil_av hi = cuvil_att_splat(88.3762626647949f), lo = cuvil_att_splat(-87.3365447504f);
    cuvil_av c = x;
    cuvil_ai over = c > hi, under = c < lo;
    c = (cuvil_av)(((cuvil_ai)c & ~(over | under)) | ((cuvil_ai)hi & over) | ((cuvil_ai)lo & under));
    const cuvil_av magic = cuvil_att_splat(12582912.0f); /* 1.5 * 2^23: adding it rounds to an integer */
    const cuvil_av n = (c * cuvil_att_splat(1.44269504088896341f) + magic) - magic;
    cuvil_av r = c - n * cuvil_att_splat(0.693359375f);
    r = r - n * cuvil_att_splat(-2.12194440e-4f);
    cuvil_av p = cuvil_att_splat(1.9875691500e-4f);
    p = p * r + cuvil_att_splat(1.3981999507e-3f);
    p = p * r + cuvil_att_splat(8.3334519073e-3f);
    p = p * r + cuvil_att_splat(4.1665795894e-2f);
    p = p * r + cuvil_att_splat(1.6666665459e-1f);
    p = p * r + cuvil_att_splat(5.0000001201e-1f);
    p = p * (r * r) + r + cuvil_att_splat(1.0f);
    const cuvil_ai e = (__builtin_convertvector(n, cuvil_ai) + 127) << 23;
    cuvil_av y = p * (cuvil_av)e;
    const cuvil_av inf = cuvil_att_splat(INFINITY);
    y = (cuvil_av)(((cuvil_ai)y & ~(over | under)) | ((cuvil_ai)inf & over)); /* under: 0 */
    const cuvil_ai nan = x != x;
    return (cuvil_av)(((cuvil_ai)y & ~nan) | ((cuvil_ai)x & nan));
}
#endif

/* What a task of one call shares with the others: the arguments and per-thread scratch. */
typedef struct cuvil_att_job {
    const cuvil_attn *a;
    int64_t qblocks, qb, dvp, per_thread, kblocks;
    float *scratch;
    float *packed; /* per (batch, kv head, key block): Kt [dk][KB] (scaled for split), then V [KB][dvp] */
} cuvil_att_job;

/* Pack key block `task` (of batch x kv heads x key blocks) for every query block that reads it. */
#if CUVIL_LIB_BODY /* the kernel library's code (cuvil_rt.h) */
static void cuvil_att_pack(void *ctx, int64_t task, int tid) {
    const cuvil_att_job *job = (const cuvil_att_job *)ctx;
    const cuvil_attn *a = job->a;
    (void)tid;
    const int64_t KB = CUVIL_ATT_KB, dk = a->dk, dvp = job->dvp;
    const int64_t bg = task / job->kblocks, j0 = (task % job->kblocks) * KB;
    const int64_t b = bg / a->hkv, g = bg % a->hkv;
    const int64_t kn = a->skv - j0 < KB ? a->skv - j0 : KB;
    float *kt = job->packed + (size_t)task * (size_t)(dk * KB + KB * dvp), *vb = kt + dk * KB;
    const float f = a->scale_mode == CUVIL_ATT_SPLIT ? a->scale : 1.0f;
    const int split = a->scale_mode == CUVIL_ATT_SPLIT;
    for (int64_t jj = 0; jj < kn; jj++) {
        const float *kr = a->k + b * a->ks[0] + g * a->ks[1] + (j0 + jj) * a->ks[2];
        const float *vr = a->v + b * a->vs[0] + g * a->vs[1] + (j0 + jj) * a->vs[2];
        if (split)
            for (int64_t c = 0; c < dk; c++) kt[c * KB + jj] = kr[c] * f;
        else
            for (int64_t c = 0; c < dk; c++) kt[c * KB + jj] = kr[c];
        memcpy(vb + jj * dvp, vr, (size_t)a->dv * sizeof(float));
        for (int64_t c = a->dv; c < dvp; c++) vb[jj * dvp + c] = 0.0f;
    }
    for (int64_t jj = kn; jj < KB; jj++) { /* the block's missing keys: zeros, masked in the scores */
        for (int64_t c = 0; c < dk; c++) kt[c * KB + jj] = 0.0f;
        for (int64_t c = 0; c < dvp; c++) vb[jj * dvp + c] = 0.0f;
    }
}
#endif

/* The micro-kernels below name their accumulators one by one: GCC at -O2 does not unroll loops
 * over arrays of vectors, and would keep such accumulators in memory. */
#define CUVIL_ATT_ROW(r, qv)                                                                                      \
    a##r##0 = CUVIL_ATT_FMA(qv, k0, a##r##0), a##r##1 = CUVIL_ATT_FMA(qv, k1, a##r##1),                          \
    a##r##2 = CUVIL_ATT_FMA(qv, k2, a##r##2), a##r##3 = CUVIL_ATT_FMA(qv, k3, a##r##3)
#define CUVIL_ATT_PUT(r)                                                                                          \
    cuvil_att_store(s + r * CUVIL_ATT_KB, a##r##0), cuvil_att_store(s + r * CUVIL_ATT_KB + CUVIL_ATT_W, a##r##1), \
        cuvil_att_store(s + r * CUVIL_ATT_KB + 2 * CUVIL_ATT_W, a##r##2),                                         \
        cuvil_att_store(s + r * CUVIL_ATT_KB + 3 * CUVIL_ATT_W, a##r##3)

/* S[r][0:KB] = sum_c Qs[r][c] Kt[c][0:KB] for the four rows r of one register block. */
#if CUVIL_LIB_BODY /* the kernel library's code (cuvil_rt.h) */
static inline void cuvil_att_scores(const float *qs, const float *kt, int64_t dk, float *s) {
    const cuvil_av z = cuvil_att_splat(0.0f);
    cuvil_av a00 = z, a01 = z, a02 = z, a03 = z, a10 = z, a11 = z, a12 = z, a13 = z;
    cuvil_av a20 = z, a21 = z, a22 = z, a23 = z, a30 = z, a31 = z, a32 = z, a33 = z;
    for (int64_t c = 0; c < dk; c++) {
        const float *kc = kt + c * CUVIL_ATT_KB;
        cuvil_av k0 = cuvil_att_load(kc), k1 = cuvil_att_load(kc + CUVIL_ATT_W), k2 = cuvil_att_load(kc + 2 * CUVIL_ATT_W),
                 k3 = cuvil_att_load(kc + 3 * CUVIL_ATT_W);
        CUVIL_ATT_KEEP(k0);
        CUVIL_ATT_KEEP(k1);
        CUVIL_ATT_KEEP(k2);
        CUVIL_ATT_KEEP(k3);
        CUVIL_ATT_ROW(0, cuvil_att_splat(qs[c]));
        CUVIL_ATT_ROW(1, cuvil_att_splat(qs[dk + c]));
        CUVIL_ATT_ROW(2, cuvil_att_splat(qs[2 * dk + c]));
        CUVIL_ATT_ROW(3, cuvil_att_splat(qs[3 * dk + c]));
    }
    CUVIL_ATT_PUT(0);
    CUVIL_ATT_PUT(1);
    CUVIL_ATT_PUT(2);
    CUVIL_ATT_PUT(3);
}

/* O[r][0:dvp] += sum_j P[r][j] Vb[j][0:dvp] for the four rows r of one register block, kn keys. */
static inline void cuvil_att_pv(const float *p, const float *vb, int64_t kn, int64_t dvp, float *o) {
    const int64_t KB = CUVIL_ATT_KB, W = CUVIL_ATT_W;
    int64_t c0 = 0;
    for (; c0 + 2 * W <= dvp; c0 += 2 * W) {
        float *o0 = o + c0, *o1 = o + dvp + c0, *o2 = o + 2 * dvp + c0, *o3 = o + 3 * dvp + c0;
        cuvil_av a00 = cuvil_att_load(o0), a01 = cuvil_att_load(o0 + W), a10 = cuvil_att_load(o1),
                 a11 = cuvil_att_load(o1 + W), a20 = cuvil_att_load(o2), a21 = cuvil_att_load(o2 + W),
                 a30 = cuvil_att_load(o3), a31 = cuvil_att_load(o3 + W);
        for (int64_t j = 0; j < kn; j++) {
            cuvil_av v0 = cuvil_att_load(vb + j * dvp + c0), v1 = cuvil_att_load(vb + j * dvp + c0 + W);
            CUVIL_ATT_KEEP(v0);
            CUVIL_ATT_KEEP(v1);
            const cuvil_av p0 = cuvil_att_splat(p[j]), p1 = cuvil_att_splat(p[KB + j]),
                           p2 = cuvil_att_splat(p[2 * KB + j]), p3 = cuvil_att_splat(p[3 * KB + j]);
            a00 = CUVIL_ATT_FMA(p0, v0, a00), a01 = CUVIL_ATT_FMA(p0, v1, a01);
            a10 = CUVIL_ATT_FMA(p1, v0, a10), a11 = CUVIL_ATT_FMA(p1, v1, a11);
            a20 = CUVIL_ATT_FMA(p2, v0, a20), a21 = CUVIL_ATT_FMA(p2, v1, a21);
            a30 = CUVIL_ATT_FMA(p3, v0, a30), a31 = CUVIL_ATT_FMA(p3, v1, a31);
        }
        cuvil_att_store(o0, a00), cuvil_att_store(o0 + W, a01), cuvil_att_store(o1, a10), cuvil_att_store(o1 + W, a11);
        cuvil_att_store(o2, a20), cuvil_att_store(o2 + W, a21), cuvil_att_store(o3, a30), cuvil_att_store(o3 + W, a31);
    }
    for (; c0 < dvp; c0 += W) {
        float *o0 = o + c0, *o1 = o + dvp + c0, *o2 = o + 2 * dvp + c0, *o3 = o + 3 * dvp + c0;
        cuvil_av a0 = cuvil_att_load(o0), a1 = cuvil_att_load(o1), a2 = cuvil_att_load(o2), a3 = cuvil_att_load(o3);
        for (int64_t j = 0; j < kn; j++) {
            const cuvil_av v0 = cuvil_att_load(vb + j * dvp + c0);
            a0 = CUVIL_ATT_FMA(cuvil_att_splat(p[j]), v0, a0);
            a1 = CUVIL_ATT_FMA(cuvil_att_splat(p[KB + j]), v0, a1);
            a2 = CUVIL_ATT_FMA(cuvil_att_splat(p[2 * KB + j]), v0, a2);
            a3 = CUVIL_ATT_FMA(cuvil_att_splat(p[3 * KB + j]), v0, a3);
        }
        cuvil_att_store(o0, a0), cuvil_att_store(o1, a1), cuvil_att_store(o2, a2), cuvil_att_store(o3, a3);
    }
}

/* The bias of key j for query i of (b, h): 0, a mask value, or -inf. */
static inline float cuvil_att_bias(const cuvil_attn *a, int64_t b, int64_t h, int64_t i, int64_t j, int64_t kend) {
    if (j >= kend) return -INFINITY;
    if (a->causal) {
        const int64_t off = a->nonpad ? a->nonpad[b] - a->sq : a->causal_offset;
        if (j > i + off) return -INFINITY;
    }
    if (a->mask_f || a->mask_b) {
        if (j >= a->mcols) return -INFINITY;
        const int64_t at = b * a->ms[0] + h * a->ms[1] + i * a->ms[2] + j * a->ms[3];
        if (a->mask_b) return a->mask_b[at] ? 0.0f : -INFINITY;
        return 0.0f + a->mask_f[at];
    }
    return 0.0f;
}

static void cuvil_att_task(void *ctx, int64_t task, int tid) {
    const cuvil_att_job *job = (const cuvil_att_job *)ctx;
    const cuvil_attn *a = job->a;
    const int64_t bh = task / job->qblocks, i0 = (task % job->qblocks) * job->qb;
    const int64_t b = bh / a->hq, h = bh % a->hq, g = h / (a->hq / a->hkv);
    const int64_t rows = a->sq - i0 < job->qb ? a->sq - i0 : job->qb;
    const int64_t rpad = (rows + CUVIL_ATT_RB - 1) / CUVIL_ATT_RB * CUVIL_ATT_RB;
    const int64_t dk = a->dk, dv = a->dv, dvp = job->dvp, KB = CUVIL_ATT_KB;
    float *qs = job->scratch + (size_t)tid * (size_t)job->per_thread; /* [qb][dk] */
    float *s = qs + job->qb * dk;                                       /* [qb][KB] */
    float *o = s + job->qb * KB;                                        /* [qb][dvp] */
    float *m = o + job->qb * dvp, *l = m + job->qb, *seen = l + job->qb; /* [qb] each */
    const float f = a->scale_mode == CUVIL_ATT_SPLIT ? a->scale : 1.0f;
    const int split = a->scale_mode == CUVIL_ATT_SPLIT;
    for (int64_t r = 0; r < rpad; r++) {
        const float *qr = a->q + b * a->qs[0] + h * a->qs[1] + (i0 + r) * a->qs[2];
        for (int64_t c = 0; c < dk; c++) qs[r * dk + c] = r < rows ? (split ? qr[c] * f : qr[c]) : 0.0f;
        for (int64_t c = 0; c < dvp; c++) o[r * dvp + c] = 0.0f;
        m[r] = -INFINITY;
        l[r] = 0.0f;
        seen[r] = 0.0f;
    }
    /* Keys past kend are masked for every query of the block (padding, causal frontier). */
    int64_t kend = a->skv;
    if (a->nonpad && a->nonpad[b] < kend) kend = a->nonpad[b] < 0 ? 0 : a->nonpad[b];
    int64_t kscan = kend;
    if (a->causal) {
        const int64_t off = a->nonpad ? a->nonpad[b] - a->sq : a->causal_offset;
        const int64_t last = i0 + rows - 1 + off + 1;
        if (last < kscan) kscan = last < 0 ? 0 : last;
    }
    if (a->qk) kscan = a->skv;
    const float scale = a->scale; /* a local: stores into the score buffer cannot change it */
    const int has_bias = a->mask_f || a->mask_b || a->causal || a->nonpad;
    const int plain_mask = a->mask_f && a->ms[3] == 1 && !a->causal && !a->nonpad && a->mcols == a->skv;
    const float *kvbase = job->packed + (size_t)((b * a->hkv + g) * job->kblocks) * (size_t)(dk * KB + KB * dvp);
    float *qkbase = a->qk ? a->qk + ((b * a->hq + h) * a->sq + i0) * a->skv : NULL;
    for (int64_t j0 = 0; j0 < kscan; j0 += KB) {
        const int64_t kn = kscan - j0 < KB ? kscan - j0 : KB;
        const float *kt = kvbase + (size_t)(j0 / KB) * (size_t)(dk * KB + KB * dvp), *vb = kt + dk * KB;
        for (int64_t r = 0; r < rpad; r += CUVIL_ATT_RB) cuvil_att_scores(qs + r * dk, kt, dk, s + r * KB);
        for (int64_t r = 0; r < rows; r++) {
            float *restrict sr = s + r * KB;
            float *qkr = qkbase ? qkbase + r * a->skv + j0 : NULL;
            if (a->scale_mode == CUVIL_ATT_MUL)
                for (int64_t jj = 0; jj < kn; jj++) sr[jj] *= scale;
            else if (a->scale_mode == CUVIL_ATT_DIV)
                for (int64_t jj = 0; jj < kn; jj++) sr[jj] /= scale;
            if (qkr && a->qk_mode == 0) memcpy(qkr, sr, (size_t)kn * sizeof(float));
            if (a->softcap > 0)
                for (int64_t jj = 0; jj < kn; jj++) sr[jj] = cuvil_tanh_f(sr[jj] / a->softcap) * a->softcap;
            if (qkr && a->qk_mode == 1) memcpy(qkr, sr, (size_t)kn * sizeof(float));
            if (plain_mask) { /* a contiguous float row of the mask: a vector add */
                const float *restrict mr = a->mask_f + b * a->ms[0] + h * a->ms[1] + (i0 + r) * a->ms[2] + j0;
                for (int64_t jj = 0; jj < kn; jj++) sr[jj] = sr[jj] + (0.0f + mr[jj]);
                if (a->guard && seen[r] == 0.0f)
                    for (int64_t jj = 0; jj < kn; jj++) seen[r] = mr[jj] != -INFINITY ? 1.0f : seen[r];
            } else if (has_bias) {
                for (int64_t jj = 0; jj < kn; jj++) {
                    const float bias = cuvil_att_bias(a, b, h, i0 + r, j0 + jj, kend);
                    if (bias != -INFINITY) seen[r] = 1.0f;
                    sr[jj] = sr[jj] + bias;
                }
            } else {
                seen[r] = 1.0f;
            }
            if (qkr && a->qk_mode >= 2) memcpy(qkr, sr, (size_t)kn * sizeof(float));
            for (int64_t jj = kn; jj < KB; jj++) sr[jj] = -INFINITY;
            /* online softmax: fold this block into the row's maximum, sum and output */
            cuvil_av mv = cuvil_att_load(sr);
            for (int64_t x = CUVIL_ATT_W; x < KB; x += CUVIL_ATT_W) {
                const cuvil_av t = cuvil_att_load(sr + x);
                const cuvil_ai gt = t > mv;
                mv = (cuvil_av)(((cuvil_ai)t & gt) | ((cuvil_ai)mv & ~gt));
            }
            float mb = -INFINITY;
            for (int x = 0; x < CUVIL_ATT_W; x++) mb = mv[x] > mb ? mv[x] : mb;
            const float mnew = mb > m[r] ? mb : m[r];
            if (mnew == -INFINITY) { /* every key so far masked: nothing to add */
                for (int64_t jj = 0; jj < KB; jj++) sr[jj] = 0.0f;
                continue;
            }
            cuvil_av sv = cuvil_att_splat(0.0f);
            for (int64_t x = 0; x < KB; x += CUVIL_ATT_W) {
                const cuvil_av e = cuvil_att_exp(cuvil_att_load(sr + x) - cuvil_att_splat(mnew));
                cuvil_att_store(sr + x, e);
                sv = sv + e;
            }
            float sum = 0.0f;
            for (int x = 0; x < CUVIL_ATT_W; x++) sum += sv[x];
            if (mnew != m[r]) {
                const float corr = m[r] == -INFINITY ? 0.0f : expf(m[r] - mnew);
                l[r] *= corr;
                for (int64_t c = 0; c < dvp; c++) o[r * dvp + c] *= corr;
                m[r] = mnew;
            }
            l[r] += sum;
        }
        for (int64_t r = rows; r < rpad; r++)
            for (int64_t jj = 0; jj < KB; jj++) s[r * KB + jj] = 0.0f;
        for (int64_t r = 0; r < rpad; r += CUVIL_ATT_RB) cuvil_att_pv(s + r * KB, vb, kn, dvp, o + r * dvp);
    }
    for (int64_t r = 0; r < rows; r++) {
        /* keys never scanned (past kscan) are masked: the row has seen them as -inf */
        const int masked = a->guard && seen[r] == 0.0f;
        const float denom = l[r];
        float *yr = a->y + b * a->ys[0] + h * a->ys[1] + (i0 + r) * a->ys[2];
        for (int64_t c = 0; c < dv; c++) yr[c] = masked ? 0.0f : (a->guard && denom == 0.0f ? 0.0f : o[r * dvp + c] / denom);
        if (qkbase && a->qk_mode == 3) {
            float *qkr = qkbase + r * a->skv;
            const float safe = m[r] == -INFINITY ? 0.0f : m[r];
            const float d = denom == 0.0f ? 1.0f : denom;
            for (int64_t j = 0; j < a->skv; j++) {
                float e[CUVIL_ATT_W];
                cuvil_att_store(e, cuvil_att_exp(cuvil_att_splat(qkr[j] - safe)));
                qkr[j] = masked ? 0.0f : e[0] / d;
            }
        }
    }
}
#endif

/* Run attention; 0, or -1 when scratch cannot be had. */
CUVIL_LIB int cuvil_attention_f32(const cuvil_attn *a);
#if CUVIL_LIB_BODY /* the kernel library's code (cuvil_rt.h) */
CUVIL_LIB int cuvil_attention_f32(const cuvil_attn *a) {
    if (a->batch <= 0 || a->hq <= 0 || a->sq <= 0) return 0;
    const int64_t qb = a->sq < CUVIL_ATT_QB ? (a->sq + CUVIL_ATT_RB - 1) / CUVIL_ATT_RB * CUVIL_ATT_RB : CUVIL_ATT_QB;
    const int64_t dvp = (a->dv + CUVIL_ATT_W - 1) / CUVIL_ATT_W * CUVIL_ATT_W;
    cuvil_att_job job;
    memset(&job, 0, sizeof job);
    job.a = a;
    job.qblocks = (a->sq + qb - 1) / qb;
    job.qb = qb;
    job.dvp = dvp > 0 ? dvp : CUVIL_ATT_W;
    job.per_thread = qb * a->dk + qb * CUVIL_ATT_KB + qb * job.dvp + 3 * qb;
    job.per_thread = (job.per_thread + 15) / 16 * 16; /* each thread's scratch on its own cache lines */
    const int64_t ntasks = a->batch * a->hq * job.qblocks;
    const double flops = 2.0 * (double)(a->batch * a->hq * a->sq) * (double)a->skv * (double)(a->dk + a->dv);
    int threads = cuvil_num_threads_now();
    if (threads > 1 && !cuvil_parallel_worth(flops / 16.0)) threads = 1; /* ~16 flop/ns on one core */
    job.kblocks = (a->skv + CUVIL_ATT_KB - 1) / CUVIL_ATT_KB;
    const int64_t packs = a->batch * a->hkv * job.kblocks;
    job.scratch = (float *)malloc(sizeof(float) * (size_t)job.per_thread * (size_t)threads);
    job.packed = (float *)malloc(sizeof(float) * (size_t)(packs > 0 ? packs : 1) *
                                 (size_t)(a->dk * CUVIL_ATT_KB + CUVIL_ATT_KB * job.dvp));
    if (!job.scratch || !job.packed) {
        free(job.scratch);
        free(job.packed);
        return -1;
    }
    if (threads > 1) {
        cuvil_parallel_for(packs, cuvil_att_pack, &job);
        cuvil_parallel_for(ntasks, cuvil_att_task, &job);
    } else {
        for (int64_t t = 0; t < packs; t++) cuvil_att_pack(&job, t, 0);
        for (int64_t t = 0; t < ntasks; t++) cuvil_att_task(&job, t, 0);
    }
    free(job.scratch);
    free(job.packed);
    return 0;
}
#endif

#endif /* CUVIL_ATTENTION_H */
