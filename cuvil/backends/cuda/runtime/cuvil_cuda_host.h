/* Cuvil CUDA runtime, host side: the per-call state that generated CUDA model code uses.
 *
 * The same names as the C runtime (cuvil_rt.h: cuvil_call, cuvil_fail, cuvil_alloc, cuvil_release,
 * the memory plan's arithmetic) so the C backend's input binding, shape checks and arena sizing
 * are emitted unchanged; here the memory a call allocates is device memory, on the call's own
 * stream.  Included after cuvil_cuda.h (the CUDA / HIP / CPU-harness shim), before the kernels.
 *
 * A call owns a stream (created by cuvil_call_begin), its device allocations and its arena; all
 * are released by cuvil_call_end, which first waits for the stream.  Calls share nothing but the
 * model's weights on the device (read only), so several host threads may call one model at once.
 */
#ifndef CUVIL_CUDA_HOST_H
#define CUVIL_CUDA_HOST_H

#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuvil_api.h"

#if defined(__GNUC__) || defined(__clang__)
#define CUVIL_UNUSED __attribute__((unused))
#define CUVIL_LIKELY(x) __builtin_expect(!!(x), 1)
#define CUVIL_UNLIKELY(x) __builtin_expect(!!(x), 0)
#else
#define CUVIL_UNUSED
#define CUVIL_LIKELY(x) (x)
#define CUVIL_UNLIKELY(x) (x)
#endif

#define CUVIL_ALIGN 256 /* cudaMalloc's alignment; the arena's buffers are rounded to it */

typedef uint16_t cuvil_f16;
typedef uint16_t cuvil_bf16;
typedef uint8_t cuvil_bool;

typedef struct cuvil_call {
    void **allocs; /* device memory owned by the call */
    size_t n_allocs, cap_allocs;
    char *err;
    size_t errlen;
    void *arena; /* the memory plan's arena (device) */
    cudaStream_t stream;
    int has_stream;
    /* Where kernels that index by data record the first index out of range ({check + 1, index,
     * size}; device memory, zeroed at the start of the call, NULL in a graph without such a kernel),
     * and its host copy, read back with the outputs: see cuvil_status_failed. */
    unsigned long long *status;
    unsigned long long status_host[3];
} cuvil_call;

static CUVIL_UNUSED int cuvil_fail(cuvil_call *c, const char *fmt, ...) {
    if (c->err && c->errlen && c->err[0] == 0) { /* the first failure is the one reported */
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(c->err, c->errlen, fmt, ap);
        va_end(ap);
    }
    return -1;
}

/* Fails the call with the CUDA error `e` (returns 1) unless it is cudaSuccess. */
static CUVIL_UNUSED int cuvil_cuda_failed(cuvil_call *c, cudaError_t e, const char *what) {
    if (e == cudaSuccess) return 0;
    cuvil_fail(c, "%s: CUDA error %d (%s)", what, (int)e, cudaGetErrorString(e));
    return 1;
}

/* After a kernel launch: a launch error fails the call (named by the node). */
static CUVIL_UNUSED int cuvil_launched(cuvil_call *c, const char *node, const char *op) {
    cudaError_t e = cudaGetLastError();
    if (e == cudaSuccess) return 0;
    cuvil_fail(c, "node %s (%s): kernel launch failed: CUDA error %d (%s)", node, op, (int)e, cudaGetErrorString(e));
    return 1;
}

static CUVIL_UNUSED int cuvil_call_begin(cuvil_call *c) {
    if (cuvil_cuda_failed(c, cudaStreamCreateWithFlags(&c->stream, cudaStreamNonBlocking), "creating the call's stream"))
        return -1;
    c->has_stream = 1;
    return 0;
}

static CUVIL_UNUSED void *cuvil_alloc_uninit(cuvil_call *c, int64_t bytes) {
    if (bytes < 0) return NULL;
    if (c->n_allocs == c->cap_allocs) {
        size_t cap = c->cap_allocs ? 2 * c->cap_allocs : 64;
        void **a = (void **)realloc(c->allocs, cap * sizeof(void *));
        if (!a) return NULL;
        c->allocs = a;
        c->cap_allocs = cap;
    }
    void *p = NULL;
    if (cudaMalloc(&p, bytes > 0 ? (size_t)bytes : (size_t)CUVIL_ALIGN) != cudaSuccess) {
        (void)cudaGetLastError(); /* an allocation failure is reported by the caller, not left pending */
        return NULL;
    }
    c->allocs[c->n_allocs++] = p;
    return p;
}

/* Zeroed device memory owned by the call (on its stream). */
static CUVIL_UNUSED void *cuvil_alloc(cuvil_call *c, int64_t bytes) {
    void *p = cuvil_alloc_uninit(c, bytes);
    if (p && bytes > 0 && cudaMemsetAsync(p, 0, (size_t)bytes, c->stream) != cudaSuccess) return NULL;
    return p;
}

/* Stop owning `p`; 1 when the call owned it. */
static CUVIL_UNUSED int cuvil_forget(cuvil_call *c, const void *p) {
    for (size_t i = c->n_allocs; i-- > 0;) {
        if (c->allocs[i] == p) {
            c->allocs[i] = c->allocs[--c->n_allocs];
            return 1;
        }
    }
    return 0;
}

/* Free device memory the call no longer needs, once the kernels queued before have run; a pointer
 * the call does not own (a view of the weights) is left alone. */
static CUVIL_UNUSED void cuvil_release(cuvil_call *c, void *p) {
    if (!p || !cuvil_forget(c, p)) return;
    (void)cudaStreamSynchronize(c->stream);
    (void)cudaFree(p);
}

/* The call's arena: one device block sized by the memory plan for this call's shapes. */
static CUVIL_UNUSED void *cuvil_arena_get(cuvil_call *c, void *shared, int64_t bytes) {
    (void)shared;
    c->arena = cuvil_alloc_uninit(c, bytes);
    return c->arena;
}

static CUVIL_UNUSED void cuvil_call_end(cuvil_call *c) {
    if (c->has_stream) (void)cudaStreamSynchronize(c->stream);
    for (size_t i = 0; i < c->n_allocs; i++) (void)cudaFree(c->allocs[i]);
    free(c->allocs);
    c->allocs = NULL;
    c->n_allocs = c->cap_allocs = 0;
    c->arena = NULL;
    if (c->has_stream) (void)cudaStreamDestroy(c->stream);
    c->has_stream = 0;
}

/* The call's status words (zeroed device memory); 0 when they are allocated. */
static CUVIL_UNUSED int cuvil_status_begin(cuvil_call *c) {
    c->status = (unsigned long long *)cuvil_alloc(c, (int64_t)sizeof(c->status_host));
    if (!c->status) return cuvil_fail(c, "out of device memory for the call's status");
    return 0;
}

/* Queue the copy of the status words to the host (after the kernels, before the stream is synchronised). */
static CUVIL_UNUSED int cuvil_status_download(cuvil_call *c) {
    if (!c->status) return 0;
    return cuvil_cuda_failed(c, cudaMemcpyAsync(c->status_host, c->status, sizeof(c->status_host),
                                                cudaMemcpyDeviceToHost, c->stream), "copying the call's status");
}

/* After the stream is synchronised: the check a kernel recorded (1-based, as generated code numbers
 * them; the index and the size it saw in *index and *size), or 0 when every index was in range. */
static CUVIL_UNUSED unsigned long long cuvil_status_check(const cuvil_call *c, long long *index, long long *size) {
    if (!c->status) return 0;
    *index = (long long)c->status_host[1];
    *size = (long long)c->status_host[2];
    return c->status_host[0];
}

/* Copy a host input to new device memory of the call; NULL (and the call failed) on an error. */
static CUVIL_UNUSED void *cuvil_upload(cuvil_call *c, const void *host, int64_t bytes, const char *name) {
    void *d = cuvil_alloc_uninit(c, bytes);
    if (!d) {
        cuvil_fail(c, "input %s: out of device memory (%lld bytes)", name, (long long)bytes);
        return NULL;
    }
    if (bytes > 0 && cuvil_cuda_failed(c, cudaMemcpyAsync(d, host, (size_t)bytes, cudaMemcpyHostToDevice, c->stream),
                                       "copying an input to the device"))
        return NULL;
    return d;
}

/* Copy a device result to new host memory (malloc: the caller frees it with cuvil_free). */
static CUVIL_UNUSED void *cuvil_download(cuvil_call *c, const void *dev, int64_t bytes) {
    void *h = malloc(bytes > 0 ? (size_t)bytes : 1);
    if (!h) {
        cuvil_fail(c, "out of memory for a %lld-byte output", (long long)bytes);
        return NULL;
    }
    if (bytes > 0 && cuvil_cuda_failed(c, cudaMemcpyAsync(h, dev, (size_t)bytes, cudaMemcpyDeviceToHost, c->stream),
                                       "copying an output from the device")) {
        free(h);
        return NULL;
    }
    return h;
}

/* ---- memory plan and shape arithmetic (as cuvil_rt.h) --------------------------------- */

static inline int64_t cuvil_arena_round(int64_t bytes) {
    if (bytes < 0 || bytes > INT64_MAX - CUVIL_ALIGN) return -1;
    return (bytes + CUVIL_ALIGN - 1) / CUVIL_ALIGN * CUVIL_ALIGN;
}

static inline int64_t cuvil_arena_above(int64_t cur, int64_t off, int64_t size) {
    if (cur < 0 || off < 0 || size < 0 || off > INT64_MAX - size) return -1;
    return cur > off + size ? cur : off + size;
}

static inline int64_t cuvil_floordiv(int64_t a, int64_t b) {
    if (b == 0) return 0;
    int64_t q = a / b;
    if ((a % b != 0) && ((a < 0) != (b < 0))) q -= 1;
    return q;
}

static inline int64_t cuvil_floormod(int64_t a, int64_t b) {
    if (b == 0) return 0;
    int64_t r = a % b;
    if (r != 0 && ((r < 0) != (b < 0))) r += b;
    return r;
}

static inline int64_t cuvil_bcast(int64_t a, int64_t b) {
    if (a == 1) return b;
    if (b == 1 || a == b) return a;
    return -1;
}

static inline int64_t cuvil_numel(const int64_t *shape, int rank) {
    int64_t n = 1;
    for (int i = 0; i < rank; i++) n *= shape[i];
    return n;
}

static inline int64_t cuvil_nbytes(int64_t elsize, const int64_t *shape, int rank) {
    int64_t n = elsize;
    for (int i = 0; i < rank; i++) {
        if (shape[i] < 0) return -1;
        if (shape[i] != 0 && n > INT64_MAX / shape[i]) return -1;
        n *= shape[i];
    }
    return n;
}

static CUVIL_UNUSED int cuvil_bcast_ok(const int64_t *in, int r, const int64_t *out, int R) {
    if (r > R) return 0;
    for (int i = 0; i < r; i++) {
        int64_t d = in[i], o = out[i + (R - r)];
        if (d != 1 && d != o) return 0;
    }
    return 1;
}

/* The elements a slice takes of an axis of `dim` elements, its start clamped in place (ONNX Slice). */
static inline CUVIL_UNUSED int64_t cuvil_slice_range(int64_t dim, int64_t *start, int64_t end, int64_t step) {
    int64_t s = *start, e = end;
    if (step > 0) {
        if (s < 0) { s += dim; if (s < 0) s = 0; } else if (s > dim) { s = dim; }
        if (e < 0) { e += dim; if (e < 0) e = 0; } else if (e > dim) { e = dim; }
        *start = s;
        return e > s ? (e - s - 1) / step + 1 : 0;
    }
    if (s < 0) { s += dim; if (s < 0) s = -1; } else if (s >= dim) { s = dim - 1; }
    if (e < 0) { e += dim; if (e < 0) e = -1; } else if (e >= dim) { e = dim - 1; }
    *start = s;
    const int64_t mag = step == INT64_MIN ? INT64_MAX : -step;
    return s > e ? (s - e - 1) / mag + 1 : 0;
}

/* ---- launch geometry -------------------------------------------------------------------- */

#define CUVIL_MAX_DIMS 8

/* Dims or strides passed to a kernel by value. */
typedef struct cuvil_dims {
    int64_t d[CUVIL_MAX_DIMS];
} cuvil_dims;

static CUVIL_UNUSED cuvil_dims cuvil_dims_of(const int64_t *shape, int rank) {
    cuvil_dims r;
    for (int i = 0; i < CUVIL_MAX_DIMS; i++) r.d[i] = i < rank ? shape[i] : 1;
    return r;
}

/* The strides (in elements) reading `in` (rank r) broadcast to an output of rank R. */
static CUVIL_UNUSED cuvil_dims cuvil_bcast_strides(const int64_t *in, int r, int R) {
    cuvil_dims st;
    int64_t s = 1;
    for (int j = CUVIL_MAX_DIMS - 1; j >= 0; j--) st.d[j] = 0;
    for (int j = R - 1; j >= 0; j--) {
        int i = j - (R - r);
        st.d[j] = (i < 0 || in[i] == 1) ? 0 : s;
        if (i >= 0) s *= in[i];
    }
    return st;
}

/* The strides of a contiguous tensor of `shape`. */
static CUVIL_UNUSED cuvil_dims cuvil_strides_of(const int64_t *shape, int rank) {
    cuvil_dims st;
    int64_t s = 1;
    for (int j = CUVIL_MAX_DIMS - 1; j >= 0; j--) st.d[j] = 0;
    for (int j = rank - 1; j >= 0; j--) {
        st.d[j] = s;
        s *= shape[j];
    }
    return st;
}

/* Blocks for `n` threads of `per_block` each, capped (the kernels loop over the rest). */
static inline unsigned cuvil_blocks(int64_t n, int per_block) {
    int64_t b = (n + per_block - 1) / per_block;
    return (unsigned)(b < 1 ? 1 : (b > 65535 ? 65535 : b));
}

#endif /* CUVIL_CUDA_HOST_H */
