/* Cuvil's float32 convolution by GEMM over tiles of output rows (NCHW, any spatial rank).
 *
 * cuvil_conv.h's cuvil_conv_f32 builds the whole im2col matrix of an image, [Cg * taps, P], then
 * runs one GEMM.  For a large image that matrix leaves the cache (ResNet's 7x7 stem: 147 x 12544
 * floats, 7.4 MB) and the GEMM reads it back from memory.  Here the output pixels are cut into
 * chunks of whole output rows (all spatial dims but the last), sized so that a chunk's im2col
 * columns stay in L2, and each chunk is one task:
 *
 *   1. im2col of the chunk's rows into the thread's buffer [Cg * taps, rows * OW] (a 1x1
 *      unit-stride unpadded kernel needs none: the image's columns are the GEMM operand);
 *   2. the chunk of Y set to the bias;
 *   3. Y_chunk += W_g x cols by cuvil_sgemm_ep, whose epilogue (a fused activation, residual add,
 *      ...) finishes each tile while it is in cache: no second pass over Y.
 *
 * Chunks depend only on the geometry, never on the thread count, and each C element is computed
 * by one GEMM in its serial K order, so results are bitwise the same for any number of threads.
 * The tasks are (image, group, chunk, range of output channels); with several threads and too few
 * chunks to share out evenly (a small image at batch 1), each chunk's output channels are cut into
 * ranges (multiples of CUVIL_CONV_MROWS).  A chunk's ranges are consecutive tasks, and a thread
 * whose previous task was the same chunk keeps its im2col columns: so each thread makes the
 * columns it multiplies itself, from data in its own caches, rather than reading columns another
 * thread made (slow where the two run on cores that share no cache: a virtual machine's vCPUs,
 * placed by its host).
 */
#ifndef CUVIL_CONV_TILED_H
#define CUVIL_CONV_TILED_H

#include "cuvil_conv.h"

/* A chunk's im2col columns: at most this many floats (192 KiB), so they stay in L2 with the
 * GEMM's packed panels. */
#define CUVIL_CONV_TILE_ELEMS ((int64_t)262144)
/* Output channels per range are a multiple of this (whole micro-kernel row tiles). */
#define CUVIL_CONV_MROWS ((int64_t)16)

typedef struct cuvil_conv_tiled_job {
    const cuvil_conv_geom *g;
    const float *x, *w, *b;
    float *y, *cols; /* cols: one chunk buffer per thread, or NULL (no im2col) */
    const cuvil_sgemm_epilogue *ep;
    int64_t cg, mg, K, P, plane, ow, rows, rq, nchunks, per_thread;
    int64_t mparts, mrange; /* ranges of output channels per chunk, channels per range */
    int *failed;            /* per thread */
    int64_t *made;          /* per thread (stride 8): the (image, group, chunk) whose columns it holds, or -1 */
} cuvil_conv_tiled_job;

/* Task = (image, group, chunk of output rows, range of output channels). */
static void cuvil_conv_tiled_task(void *ctx, int64_t task, int tid) {
    const cuvil_conv_tiled_job *j = (const cuvil_conv_tiled_job *)ctx;
    const cuvil_conv_geom *g = j->g;
    const int64_t part = task % j->mparts, whole = task / j->mparts;
    const int64_t m0 = part * j->mrange, m1 = m0 + j->mrange < j->mg ? m0 + j->mrange : j->mg;
    if (m0 >= m1) return;
    const int64_t chunk = whole % j->nchunks, pair = whole / j->nchunks;
    const int64_t n = pair / g->group, gi = pair % g->group;
    const int64_t q0 = chunk * j->rq, q1 = q0 + j->rq < j->rows ? q0 + j->rq : j->rows;
    const int64_t c0 = q0 * j->ow, nc = (q1 - q0) * j->ow;
    const float *xg = j->x + (n * g->cin + gi * j->cg) * j->plane;
    float *yc = j->y + (n * g->cout + gi * j->mg) * j->P + c0;
    const float *bmat;
    int64_t ldb;
    if (j->cols) {
        float *cols = j->cols + (size_t)tid * (size_t)j->per_thread;
        if (j->made[8 * tid] != whole) { /* else this thread's last task made these columns */
            cuvil_im2col_rows_f32(g, xg, j->cg, q0, q1, cols);
            j->made[8 * tid] = whole;
        }
        bmat = cols;
        ldb = nc;
    } else {
        bmat = xg + c0;
        ldb = j->P;
    }
    for (int64_t m = m0; m < m1; m++) {
        float *restrict row = yc + m * j->P;
        const float v = j->b ? j->b[gi * j->mg + m] : 0.0f;
        for (int64_t i = 0; i < nc; i++) row[i] = v;
    }
    if (cuvil_sgemm_ep(m1 - m0, nc, j->K, 1.0f, j->w + (gi * j->mg + m0) * j->K, j->K, 1, bmat, ldb, 1, 1.0f,
                       yc + m0 * j->P, j->P, j->ep) != 0)
        j->failed[tid] = 1;
}

/* The forward convolution of f32 operands, bias optional, then `ep` (NULL: none) on each finished
 * tile of Y.  Returns 0, or -1 when scratch memory cannot be had. */
static CUVIL_UNUSED int cuvil_conv_tiled_f32(const cuvil_conv_geom *g, const float *x, const float *w, const float *b,
                                             float *y, const cuvil_sgemm_epilogue *ep) {
    const int nd = g->nsp, last = nd - 1;
    const int64_t cg = g->cin / g->group, mg = g->cout / g->group;
    const int64_t taps = cuvil_conv_prod(g->k, nd), P = cuvil_conv_prod(g->out, nd);
    const int64_t plane = cuvil_conv_prod(g->in, nd), K = cg * taps, ow = g->out[last];
    if (P == 0 || mg == 0 || g->batch == 0) return 0;
    int direct = 1; /* a 1x1 kernel, unit strides, no padding: the image is the GEMM operand */
    for (int d = 0; d < nd; d++)
        if (g->k[d] != 1 || g->stride[d] != 1 || g->pad[d] != 0 || g->out[d] != g->in[d]) direct = 0;
    const int64_t rows = P / ow;
    /* rows per chunk: as many as keep the chunk's columns within the tile, then evened out */
    int64_t rq = K > 0 ? CUVIL_CONV_TILE_ELEMS / (K * ow) : rows;
    if (rq < 1) rq = 1;
    if (rq > rows) rq = rows;
    const int64_t nchunks = (rows + rq - 1) / rq;
    rq = (rows + nchunks - 1) / nchunks;
    const int64_t wholes = g->batch * g->group * nchunks;
    int threads = cuvil_num_threads_now();
    int64_t mparts = 1;
    if (threads > 1) {
        const double macs = (double)g->batch * (double)g->cout * (double)P * (double)K;
        /* too few chunks to share out evenly: cut each chunk's output channels into ranges */
        const int even = wholes >= threads && (wholes % threads == 0 || wholes >= 4 * threads);
        if (!even) {
            const int64_t units = (mg + CUVIL_CONV_MROWS - 1) / CUVIL_CONV_MROWS;
            const int64_t want = (2 * (int64_t)threads + wholes - 1) / wholes;
            mparts = want < units ? want : units;
        }
        const int64_t tasks = wholes * mparts;
        const int shared = tasks >= threads && (tasks % threads == 0 || tasks >= 4 * threads);
        if (!shared || !cuvil_parallel_worth(macs / CUVIL_GEMM_MAC_PER_NS)) threads = 1, mparts = 1;
    }
    const int64_t munits = (mg + CUVIL_CONV_MROWS - 1) / CUVIL_CONV_MROWS;
    const int64_t mrange = (munits + mparts - 1) / mparts * CUVIL_CONV_MROWS, tasks = wholes * mparts;
    int failed_stack[CUVIL_CONV_MAXT] = {0};
    /* a chunk buffer per thread, each starting on a cache line */
    const int64_t per_thread = (rq * ow * K + CUVIL_ALIGN / 4 - 1) / (CUVIL_ALIGN / 4) * (CUVIL_ALIGN / 4);
    int64_t made_stack[8 * CUVIL_CONV_MAXT];
    cuvil_conv_tiled_job j = {g, x, w, b, y, NULL, ep, cg, mg, K, P, plane, ow, rows, rq, nchunks, per_thread,
                              mparts, mrange, failed_stack, made_stack};
    if (threads > CUVIL_CONV_MAXT) {
        j.failed = (int *)calloc((size_t)threads, sizeof(int));
        j.made = (int64_t *)malloc(sizeof(int64_t) * 8 * (size_t)threads);
        if (!j.failed || !j.made) {
            free(j.failed);
            free(j.made);
            return -1;
        }
    }
    for (int t = 0; t < threads; t++) j.made[8 * t] = -1;
    int rc = 0;
    if (!direct && K > 0) {
        const size_t bytes = cuvil_size3(sizeof(float), (size_t)per_thread, (size_t)threads);
        j.cols = bytes == SIZE_MAX ? NULL : (float *)aligned_alloc(CUVIL_ALIGN, bytes);
        if (!j.cols) rc = -1;
    }
    if (rc == 0) {
        if (threads > 1) {
            cuvil_parallel_for(tasks, cuvil_conv_tiled_task, &j);
        } else { /* in turn, on this thread: each GEMM may split its own blocks */
            for (int64_t t = 0; t < tasks && !j.failed[0]; t++) cuvil_conv_tiled_task(&j, t, 0);
        }
        for (int t = 0; t < threads; t++)
            if (j.failed[t]) rc = -1;
    }
    free(j.cols);
    if (j.failed != failed_stack) free(j.failed);
    if (j.made != made_stack) free(j.made);
    return rc;
}

#endif /* CUVIL_CONV_TILED_H */
