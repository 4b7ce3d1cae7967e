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
 * With enough (image, group, chunk) tasks for the threads, they run in parallel, each GEMM on one
 * thread; otherwise they run in turn and each GEMM splits its own output blocks.
 */
#ifndef CUVIL_CONV_TILED_H
#define CUVIL_CONV_TILED_H

#include "cuvil_conv.h"

/* A chunk's im2col columns: at most this many floats (192 KiB), so they stay in L2 with the
 * GEMM's packed panels. */
#define CUVIL_CONV_TILE_ELEMS ((int64_t)262144)

typedef struct cuvil_conv_tiled_job {
    const cuvil_conv_geom *g;
    const float *x, *w, *b;
    float *y, *cols; /* cols: one chunk buffer per thread, or NULL (no im2col) */
    const cuvil_sgemm_epilogue *ep;
    int64_t cg, mg, K, P, plane, ow, rows, rq, nchunks, per_thread;
    int *failed; /* per thread */
} cuvil_conv_tiled_job;

/* Task = (image, group, chunk of output rows). */
static void cuvil_conv_tiled_task(void *ctx, int64_t task, int tid) {
    const cuvil_conv_tiled_job *j = (const cuvil_conv_tiled_job *)ctx;
    const cuvil_conv_geom *g = j->g;
    const int64_t chunk = task % j->nchunks, pair = task / j->nchunks;
    const int64_t n = pair / g->group, gi = pair % g->group;
    const int64_t q0 = chunk * j->rq, q1 = q0 + j->rq < j->rows ? q0 + j->rq : j->rows;
    const int64_t c0 = q0 * j->ow, nc = (q1 - q0) * j->ow;
    const float *xg = j->x + (n * g->cin + gi * j->cg) * j->plane;
    float *yc = j->y + (n * g->cout + gi * j->mg) * j->P + c0;
    const float *bmat;
    int64_t ldb;
    if (j->cols) {
        float *cols = j->cols + (size_t)tid * (size_t)j->per_thread;
        cuvil_im2col_rows_f32(g, xg, j->cg, q0, q1, cols);
        bmat = cols;
        ldb = nc;
    } else {
        bmat = xg + c0;
        ldb = j->P;
    }
    for (int64_t m = 0; m < j->mg; m++) {
        float *restrict row = yc + m * j->P;
        const float v = j->b ? j->b[gi * j->mg + m] : 0.0f;
        for (int64_t i = 0; i < nc; i++) row[i] = v;
    }
    if (cuvil_sgemm_ep(j->mg, nc, j->K, 1.0f, j->w + gi * j->mg * j->K, j->K, 1, bmat, ldb, 1, 1.0f, yc, j->P,
                       j->ep) != 0)
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
    const int64_t tasks = g->batch * g->group * nchunks;
    int threads = cuvil_num_threads_now();
    if (threads > 1) {
        const double macs = (double)g->batch * (double)g->cout * (double)P * (double)K;
        /* tasks in parallel only when they share out evenly; else each GEMM splits its own blocks */
        const int even = tasks >= threads && (tasks % threads == 0 || tasks >= 4 * threads);
        if (!even || !cuvil_parallel_worth(macs / CUVIL_GEMM_MAC_PER_NS)) threads = 1;
    }
    int failed_stack[CUVIL_CONV_MAXT] = {0};
    /* a chunk buffer per thread, each starting on a cache line */
    const int64_t per_thread = (rq * ow * K + CUVIL_ALIGN / 4 - 1) / (CUVIL_ALIGN / 4) * (CUVIL_ALIGN / 4);
    cuvil_conv_tiled_job j = {g, x, w, b, y, NULL, ep, cg, mg, K, P, plane, ow, rows, rq, nchunks, per_thread,
                              failed_stack};
    if (threads > CUVIL_CONV_MAXT) {
        j.failed = (int *)calloc((size_t)threads, sizeof(int));
        if (!j.failed) return -1;
    }
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
    return rc;
}

#endif /* CUVIL_CONV_TILED_H */
