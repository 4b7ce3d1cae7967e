/* Cuvil's GEMM for products of a few rows (M <= MR): a batch-1 MLP layer, one token of a
 * transformer.  Included by cuvil_gemm.h, whose job description (cuvil_sgemm_job) it reads.
 *
 * With a handful of rows the blocked path's work is mostly overhead: packing A, a mostly empty
 * MR x NR tile, C re-read once per KC block.  Here:
 *   - A is read in place (one broadcast per row and k);
 *   - B is streamed once, k by k, from the NR-wide panels of a constant operand's packed form
 *     (the same cached layout the blocked path reads), or straight from a row-major B;
 *   - the columns go in strips of one or two NR panels; a strip keeps all M rows x its columns
 *     in registers for the whole K loop (two panels when the registers hold 2 x 2 x M
 *     accumulators, so each B load feeds more independent FMA chains), so C is written once;
 *   - strips are split across the call's threads, each column computed whole by one thread in
 *     the serial order: bitwise the same results for any number of threads;
 *   - the epilogue runs on each strip right after its store;
 *   - a last panel of at most W columns of a packed B (zero past N) takes one vector, not two.
 * A row-major B that is not a constant cannot be read past column N, so its last partial NR
 * panel runs through a scalar loop (same order of terms).
 */
#ifndef CUVIL_GEMM_SMALL_H
#define CUVIL_GEMM_SMALL_H

#ifndef CUVIL_GEMM_H
#error "cuvil_gemm_small.h is part of cuvil_gemm.h: include that"
#endif

#if CUVIL_GEMM_VECTOR && (defined(__GNUC__) || defined(__clang__))
#define CUVIL_GEMM_SMALL 1
#define CUVIL_GEMM_INLINE static inline __attribute__((always_inline))

/* Products with one column panel and at most this many rows run as the small path per tile of rows
 * (cuvil_sgemm_ep). */
#define CUVIL_SMALL_N_MAX_ROWS (8 * CUVIL_GEMM_MR)

/* Tasks per thread when the columns are split across threads. */
#define CUVIL_SMALL_TASKS_PER_THREAD 8

/* Panels per strip for R rows: two when 2 x 2 x R accumulators, the 4 B vectors and the broadcast fit. */
#define CUVIL_SMALL_PANELS(R) (4 * (R) + 5 <= CUVIL_GEMM_NREG ? 2 : 1)

/* C[0:R, j0:j0 + P * NR) of the product (panel q = j0 / NR), K loop in registers; R and P are
 * constants after inlining, so the loops below unroll and the accumulators stay in registers.
 * V: the vectors of the strip that hold columns of C (2 * P, or 1 for a last panel of at most W
 * columns, whose second vector would only multiply the panel's zero padding). */
CUVIL_GEMM_INLINE void cuvil_sgemm_small_strip_v(const cuvil_sgemm_job *g, int64_t q, const int R, const int P,
                                                 const int V) {
    cuvil_vf acc[CUVIL_GEMM_MR][4];
    const float *arow[CUVIL_GEMM_MR];
    const int64_t K = g->K, j0 = q * CUVIL_GEMM_NR, csa = g->csa;
    const float alpha = g->alpha;
#pragma GCC unroll 8
    for (int i = 0; i < R; i++) {
        arow[i] = g->A + i * g->rsa;
#pragma GCC unroll 4
        for (int v = 0; v < V; v++) acc[i][v] = CUVIL_VSPLAT(0.0f);
    }
    /* Packed B comes in KC blocks (a pair of panels never straddles an NC block: NC is a multiple
     * of 2 NR and pairs start at even panels); a row-major B is one block of K rows. */
    const int64_t kstep = g->Bp_all ? CUVIL_GEMM_KC : K;
    for (int64_t pc = 0; pc < K; pc += kstep) {
        const int64_t kc = cuvil_gemm_min(K - pc, kstep);
        const float *b;
        int64_t bstride, boff; /* from one k to the next; from one panel to the next */
        if (g->Bp_all) {
            const int64_t jc = j0 / CUVIL_GEMM_NC * CUVIL_GEMM_NC;
            const int64_t ncpad = cuvil_gemm_round_up(cuvil_gemm_min(g->N - jc, CUVIL_GEMM_NC), CUVIL_GEMM_NR);
            b = g->Bp_all + jc * K + pc * ncpad + (j0 - jc) / CUVIL_GEMM_NR * kc * CUVIL_GEMM_NR;
            bstride = CUVIL_GEMM_NR;
            boff = kc * CUVIL_GEMM_NR;
        } else {
            b = g->B + pc * g->rsb + j0;
            bstride = g->rsb;
            boff = CUVIL_GEMM_NR;
        }
        for (int64_t k = pc; k < pc + kc; k++) {
            cuvil_vf bv[4];
#pragma GCC unroll 4
            for (int v = 0; v < V; v++) bv[v] = cuvil_vload(b + (v / 2) * boff + (v % 2) * CUVIL_GEMM_W);
#pragma GCC unroll 8
            for (int i = 0; i < R; i++) {
                const cuvil_vf a = CUVIL_VSPLAT(alpha * arow[i][k * csa]); /* alpha * A, as packing A does */
#pragma GCC unroll 4
                for (int v = 0; v < V; v++) acc[i][v] = CUVIL_VFMA(a, bv[v], acc[i][v]);
            }
            b += bstride;
        }
    }
    const int64_t cols = cuvil_gemm_min(P * CUVIL_GEMM_NR, g->N - j0);
    float *c0 = g->C + j0;
#pragma GCC unroll 8
    for (int i = 0; i < R; i++) {
        float *crow = c0 + i * g->ldc;
        if (cols == P * CUVIL_GEMM_NR) {
#pragma GCC unroll 4
            for (int v = 0; v < V; v++) {
                float *dst = crow + v * CUVIL_GEMM_W;
                cuvil_vstore(dst, g->first_acc ? cuvil_vload(dst) + acc[i][v] : acc[i][v]);
            }
        } else {
            float tile[4 * CUVIL_GEMM_W];
#pragma GCC unroll 4
            for (int v = 0; v < V; v++) cuvil_vstore(tile + v * CUVIL_GEMM_W, acc[i][v]);
            for (int64_t j = 0; j < cols; j++) crow[j] = g->first_acc ? crow[j] + tile[j] : tile[j];
        }
    }
    if (g->ep) g->ep->fn(g->ep->ctx, c0, g->ldc, 0, j0, R, cols);
}

CUVIL_GEMM_INLINE void cuvil_sgemm_small_strip(const cuvil_sgemm_job *g, int64_t q, const int R, const int P) {
    cuvil_sgemm_small_strip_v(g, q, R, P, 2 * P);
}

/* Columns [j0, j1) of a row-major, unpacked B, one at a time (fewer than NR of them). */
static void cuvil_sgemm_small_scalar(const cuvil_sgemm_job *g, int64_t j0, int64_t j1) {
    for (int64_t i = 0; i < g->M; i++) {
        float *crow = g->C + i * g->ldc;
        for (int64_t j = j0; j < j1; j++) {
            float s = 0.0f;
            for (int64_t k = 0; k < g->K; k++) s += (g->alpha * g->A[i * g->rsa + k * g->csa]) * g->B[k * g->rsb + j];
            crow[j] = g->first_acc ? crow[j] + s : s;
        }
    }
    if (g->ep) g->ep->fn(g->ep->ctx, g->C + j0, g->ldc, 0, j0, g->M, j1 - j0);
}

/* Panels [q0, q1) (q0 even) for R rows: strips of P panels, then a single one; with an unpacked
 * B, the panels that end past column N go to the scalar loop. */
CUVIL_GEMM_INLINE void cuvil_sgemm_small_cols(const cuvil_sgemm_job *g, int64_t q0, int64_t q1, const int R) {
    const int P = CUVIL_SMALL_PANELS(R);
    const int64_t vec_end = g->Bp_all ? q1 : cuvil_gemm_min(q1, g->N / CUVIL_GEMM_NR);
    int64_t q = q0;
    /* a last panel of at most W columns (packed B: it is zero past N) takes one vector */
    const int half = g->Bp_all && vec_end > q0 && g->N - (vec_end - 1) * CUVIL_GEMM_NR <= CUVIL_GEMM_W;
    const int64_t full_end = vec_end - half;
    for (; q + P <= full_end; q += P) cuvil_sgemm_small_strip(g, q, R, P);
    if (P == 2 && q < full_end) cuvil_sgemm_small_strip(g, q++, R, 1);
    if (half) cuvil_sgemm_small_strip_v(g, q++, R, 1, 1);
    if (q < q1) cuvil_sgemm_small_scalar(g, q * CUVIL_GEMM_NR, cuvil_gemm_min(q1 * CUVIL_GEMM_NR, g->N));
}

typedef void (*cuvil_sgemm_small_fn)(const cuvil_sgemm_job *g, int64_t q0, int64_t q1);
#define CUVIL_SMALL_ROWS(R)                                                                                    \
    static void cuvil_sgemm_small_##R(const cuvil_sgemm_job *g, int64_t q0, int64_t q1) {                      \
        cuvil_sgemm_small_cols(g, q0, q1, R);                                                                  \
    }
CUVIL_SMALL_ROWS(1)
CUVIL_SMALL_ROWS(2)
CUVIL_SMALL_ROWS(3)
CUVIL_SMALL_ROWS(4)
CUVIL_SMALL_ROWS(5)
CUVIL_SMALL_ROWS(6)
#if CUVIL_GEMM_MR == 8
CUVIL_SMALL_ROWS(7)
CUVIL_SMALL_ROWS(8)
static const cuvil_sgemm_small_fn cuvil_sgemm_small_rows[9] = {
    NULL, cuvil_sgemm_small_1, cuvil_sgemm_small_2, cuvil_sgemm_small_3, cuvil_sgemm_small_4,
    cuvil_sgemm_small_5, cuvil_sgemm_small_6, cuvil_sgemm_small_7, cuvil_sgemm_small_8};
#else
static const cuvil_sgemm_small_fn cuvil_sgemm_small_rows[7] = {
    NULL, cuvil_sgemm_small_1, cuvil_sgemm_small_2, cuvil_sgemm_small_3,
    cuvil_sgemm_small_4, cuvil_sgemm_small_5, cuvil_sgemm_small_6};
#endif
#undef CUVIL_SMALL_ROWS

typedef struct cuvil_sgemm_small_job {
    const cuvil_sgemm_job *g;
    int64_t pairs, ntasks; /* the columns as pairs of NR panels, split in ntasks near-equal runs */
} cuvil_sgemm_small_job;

static void cuvil_sgemm_small_task(void *ctx, int64_t task, int tid) {
    (void)tid;
    const cuvil_sgemm_small_job *s = (const cuvil_sgemm_small_job *)ctx;
    const int64_t panels = cuvil_gemm_round_up(s->g->N, CUVIL_GEMM_NR) / CUVIL_GEMM_NR;
    int64_t lo, hi;
    cuvil_split(s->pairs, s->ntasks, task, &lo, &hi);
    if (lo < hi) cuvil_sgemm_small_rows[s->g->M](s->g, 2 * lo, cuvil_gemm_min(2 * hi, panels));
}

/* The product of g (1 <= M <= MR; B packed in g->Bp_all, or row-major: csb == 1). */
static void cuvil_sgemm_small(const cuvil_sgemm_job *g) {
    const int64_t panels = cuvil_gemm_round_up(g->N, CUVIL_GEMM_NR) / CUVIL_GEMM_NR;
    cuvil_sgemm_small_job s = {g, (panels + 1) / 2, 1};
    int threads = cuvil_num_threads_now();
    if (threads > 1) {
        /* B is streamed once: its bytes, or the multiply-adds, whichever takes longer. */
        const double macs = (double)g->M * (double)g->N * (double)g->K / CUVIL_GEMM_MAC_PER_NS;
        const double bytes = 4.0 * (double)g->N * (double)g->K / CUVIL_GEMM_BYTES_PER_NS;
        /* Several tasks per thread: a worker that arrives late, or is preempted, holds up little. */
        if (cuvil_parallel_worth(macs > bytes ? macs : bytes))
            s.ntasks = CUVIL_SMALL_TASKS_PER_THREAD * threads < s.pairs ? CUVIL_SMALL_TASKS_PER_THREAD * threads : s.pairs;
    }
    if (s.ntasks <= 1)
        cuvil_sgemm_small_task(&s, 0, 0);
    else
        cuvil_parallel_for(s.ntasks, cuvil_sgemm_small_task, &s);
}

#else
#define CUVIL_GEMM_SMALL 0
#endif

#endif /* CUVIL_GEMM_SMALL_H */
