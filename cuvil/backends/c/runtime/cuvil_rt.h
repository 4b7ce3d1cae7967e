/* Cuvil C runtime: the types and helpers that generated model code uses.
 *
 * Everything here is static: each generated model is one translation unit
 * that includes this header (with the kernel library, below, linked in), so a
 * model library exports only its own API.
 * A call owns all memory it allocates (cuvil_call); calls share nothing,
 * so one loaded model may run on many threads at once.
 */
#ifndef CUVIL_RT_H
#define CUVIL_RT_H

/* The thread pool asks which CPU a thread runs on and moves its workers (sched_getcpu,
 * sched_setaffinity: GNU extensions that glibc and musl declare under _GNU_SOURCE).  This header
 * comes first in every generated model, before any system header. */
#if defined(__linux__) && !defined(_GNU_SOURCE)
#define _GNU_SOURCE 1
#endif

#include <math.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuvil_api.h"

#if defined(__GNUC__) || defined(__clang__)
#define CUVIL_UNUSED __attribute__((unused))
#define CUVIL_MALLOC __attribute__((malloc))
#define CUVIL_LIKELY(x) __builtin_expect(!!(x), 1)
#define CUVIL_UNLIKELY(x) __builtin_expect(!!(x), 0)
#else
#define CUVIL_UNUSED
#define CUVIL_MALLOC
#define CUVIL_LIKELY(x) (x)
#define CUVIL_UNLIKELY(x) (x)
#endif

#define CUVIL_ALIGN 64

/* The kernel library.  The runtime's largest model-independent code (the thread pool and the
 * GEMM, cuvil_threads.h and cuvil_gemm.h) takes most of the time a model's build spends in the
 * compiler, so a build compiles it once per compiler and flags, into an object every model of
 * those flags links (cuvil/backends/c/kernel_library.py).  CUVIL_KERNEL_LIBRARY says which unit
 * this is:
 *   0 (the default): the only one: every function is static and defined here, as in a saved
 *      artifact's model.c compiled on its own;
 *   1: a model linked with the library: the library's functions are declared here, not defined;
 *   2: the library: it defines them, hidden (no model library exports them).
 * CUVIL_LIB marks those functions, CUVIL_LIB_BODY says whether this unit holds their bodies. */
#ifndef CUVIL_KERNEL_LIBRARY
#define CUVIL_KERNEL_LIBRARY 0
#endif
#if CUVIL_KERNEL_LIBRARY == 0
#define CUVIL_LIB static CUVIL_UNUSED
#elif defined(__GNUC__) || defined(__clang__)
#define CUVIL_LIB __attribute__((visibility("hidden")))
#else
#define CUVIL_LIB
#endif
#define CUVIL_LIB_BODY (CUVIL_KERNEL_LIBRARY != 1)

typedef uint16_t cuvil_f16;
typedef uint16_t cuvil_bf16;
typedef uint8_t cuvil_bool;

/* ---- per-call state -------------------------------------------------- */

typedef struct cuvil_call {
    void **allocs;
    size_t n_allocs, cap_allocs;
    char *err;
    size_t errlen;
    /* the arena of a memory-planned call, lent by its model (cuvil_threads.h's cuvil_arena_get)
     * and given back by cuvil_call_end */
    void *arena;
    size_t arena_cap;
    void *arena_home;
    void (*arena_put)(void *home, void *arena, size_t cap);
} cuvil_call;

static CUVIL_UNUSED int cuvil_fail(cuvil_call *c, const char *fmt, ...) {
    if (c->err && c->errlen) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(c->err, c->errlen, fmt, ap);
        va_end(ap);
    }
    return -1;
}

/* Aligned scratch memory owned by the call (freed at its end unless kept), NOT zeroed: the arena
 * of a memory-planned model, whose every intermediate is written by its kernel before it is read. */
/* malloc-like: the result aliases nothing else, which lets the compiler reason about copies */
static CUVIL_UNUSED CUVIL_MALLOC void *cuvil_alloc_uninit(cuvil_call *c, int64_t bytes) {
    if (bytes < 0) return NULL;
    /* size_t is 32 bits on wasm32: a larger request must fail, not wrap to a small buffer. */
    if ((uint64_t)bytes > (uint64_t)(SIZE_MAX - CUVIL_ALIGN)) return NULL;
    if (c->n_allocs == c->cap_allocs) {
        size_t cap = c->cap_allocs ? 2 * c->cap_allocs : 64;
        void **a = (void **)realloc(c->allocs, cap * sizeof(void *));
        if (!a) return NULL;
        c->allocs = a;
        c->cap_allocs = cap;
    }
    size_t n = (size_t)bytes;
    n = (n + CUVIL_ALIGN - 1) / CUVIL_ALIGN * CUVIL_ALIGN;
    if (n == 0) n = CUVIL_ALIGN;
    void *p = aligned_alloc(CUVIL_ALIGN, n);
    if (!p) return NULL;
    c->allocs[c->n_allocs++] = p;
    return p;
}

/* Zeroed, aligned scratch memory owned by the call (freed at its end unless kept). */
static CUVIL_UNUSED CUVIL_MALLOC void *cuvil_alloc(cuvil_call *c, int64_t bytes) {
    void *p = cuvil_alloc_uninit(c, bytes);
    if (p) { /* the whole block, its padding included, as cuvil_alloc_uninit sized it */
        size_t n = ((size_t)bytes + CUVIL_ALIGN - 1) / CUVIL_ALIGN * CUVIL_ALIGN;
        memset(p, 0, n ? n : CUVIL_ALIGN);
    }
    return p;
}

/* ---- memory plan arithmetic (cuvil/backends/c/memplan.py) -------------- */

/* `bytes` rounded up to CUVIL_ALIGN; -1 when negative (an overflowed size) or too large. */
static inline int64_t cuvil_arena_round(int64_t bytes) {
    if (bytes < 0 || bytes > INT64_MAX - CUVIL_ALIGN) return -1;
    return (bytes + CUVIL_ALIGN - 1) / CUVIL_ALIGN * CUVIL_ALIGN;
}

/* max(cur, off + size): the lowest offset above a block at `off` of `size` bytes; -1 propagates
 * (from any argument) and marks an overflow. */
static inline int64_t cuvil_arena_above(int64_t cur, int64_t off, int64_t size) {
    if (cur < 0 || off < 0 || size < 0 || off > INT64_MAX - size) return -1;
    return cur > off + size ? cur : off + size;
}

static CUVIL_UNUSED void cuvil_forget(cuvil_call *c, const void *p) {
    for (size_t i = c->n_allocs; i-- > 0;) {
        if (c->allocs[i] == p) {
            c->allocs[i] = c->allocs[--c->n_allocs];
            return;
        }
    }
}

/* Free a buffer the call no longer needs. */
static CUVIL_UNUSED void cuvil_release(cuvil_call *c, void *p) {
    if (!p) return;
    cuvil_forget(c, p);
    free(p);
}

static CUVIL_UNUSED void cuvil_call_end(cuvil_call *c) {
    if (c->arena) c->arena_put(c->arena_home, c->arena, c->arena_cap);
    c->arena = NULL;
    for (size_t i = 0; i < c->n_allocs; i++) free(c->allocs[i]);
    free(c->allocs);
    c->allocs = NULL;
    c->n_allocs = c->cap_allocs = 0;
}

/* ---- shape arithmetic -------------------------------------------------- */

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

/* Broadcast of two dims; -1 when they do not broadcast. */
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

/* Copy `bytes` bytes between distinct buffers. Out of line on purpose: GCC's -Wrestrict
 * otherwise reasons about copy sizes it cannot bound from run-time shapes and reports
 * impossible overlaps of 2^63-byte copies. */
#if defined(__GNUC__) || defined(__clang__)
__attribute__((noinline))
#endif
static CUVIL_UNUSED void cuvil_copy(void *dst, const void *src, int64_t bytes) {
    if (bytes > 0) memcpy(dst, src, (size_t)bytes);
}

/* Bytes of a tensor, or -1 when the count overflows (the allocation then fails cleanly). */
static inline int64_t cuvil_nbytes(int64_t elsize, const int64_t *shape, int rank) {
    int64_t n = elsize;
    for (int i = 0; i < rank; i++) {
        if (shape[i] < 0) return -1;
        if (shape[i] != 0 && n > INT64_MAX / shape[i]) return -1;
        n *= shape[i];
    }
    return n;
}

/* a * b * c in size_t, or SIZE_MAX when it overflows (so malloc fails instead of wrapping). */
static inline size_t cuvil_size3(size_t a, size_t b, size_t c) {
    if (b != 0 && a > SIZE_MAX / b) return SIZE_MAX;
    size_t ab = a * b;
    if (c != 0 && ab > SIZE_MAX / c) return SIZE_MAX;
    return ab * c;
}

/* Strides (in elements) that read an input of shape `in` (rank `r`) broadcast to `out` (rank `R`). */
static CUVIL_UNUSED void cuvil_bcast_strides(const int64_t *in, int r, const int64_t *out, int R, int64_t *strides) {
    int64_t s = 1;
    for (int j = R - 1; j >= 0; j--) {
        int i = j - (R - r);
        if (i < 0 || in[i] == 1) {
            strides[j] = 0;
        } else {
            strides[j] = s;
        }
        if (i >= 0) s *= in[i];
    }
    (void)out;
}

/* Whether `in` (rank r) broadcasts to `out` (rank R): each dim is 1 or equal. */
static CUVIL_UNUSED int cuvil_bcast_ok(const int64_t *in, int r, const int64_t *out, int R) {
    if (r > R) return 0;
    for (int i = 0; i < r; i++) {
        int64_t d = in[i], o = out[i + (R - r)];
        if (d != 1 && d != o) return 0;
    }
    return 1;
}

static CUVIL_UNUSED int cuvil_same_shape(const int64_t *a, int ra, const int64_t *b, int rb) {
    if (ra != rb) return 0;
    for (int i = 0; i < ra; i++)
        if (a[i] != b[i]) return 0;
    return 1;
}

/* ---- half precision ---------------------------------------------------- */

/* With F16C the conversions are one instruction each (same results: round to nearest even, NaN
 * kept quiet with its payload's top bits). */
#if defined(__F16C__)
#include <immintrin.h>
#endif

static inline float cuvil_f16_to_f32(cuvil_f16 h) {
#if defined(__F16C__)
    return _cvtsh_ss(h);
#else
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1fu;
    uint32_t man = h & 0x3ffu;
    uint32_t bits;
    if (exp == 0) {
        if (man == 0) {
            bits = sign;
        } else { /* subnormal: normalise */
            int e = -1;
            do {
                e++;
                man <<= 1;
            } while ((man & 0x400u) == 0);
            bits = sign | ((uint32_t)(127 - 15 - e) << 23) | ((man & 0x3ffu) << 13);
        }
    } else if (exp == 0x1f) {
        bits = sign | 0x7f800000u | (man << 13);
    } else {
        bits = sign | ((exp + 127 - 15) << 23) | (man << 13);
    }
    float f;
    memcpy(&f, &bits, 4);
    return f;
#endif
}

static inline cuvil_f16 cuvil_f32_to_f16(float f) {
#if defined(__F16C__)
    return (cuvil_f16)_cvtss_sh(f, _MM_FROUND_TO_NEAREST_INT);
#else
    uint32_t x;
    memcpy(&x, &f, 4);
    uint32_t sign = (x >> 16) & 0x8000u;
    uint32_t absx = x & 0x7fffffffu;
    if (absx >= 0x7f800000u) { /* inf or nan */
        return (cuvil_f16)(sign | 0x7c00u | (absx > 0x7f800000u ? 0x200u | ((absx >> 13) & 0x3ffu) : 0));
    }
    if (absx >= 0x477ff000u) return (cuvil_f16)(sign | 0x7c00u); /* rounds to inf */
    if (absx < 0x38800000u) {                                     /* subnormal or zero in f16 */
        if (absx < 0x33000000u) return (cuvil_f16)sign;           /* below half the smallest subnormal */
        uint32_t e = absx >> 23;
        uint32_t m = (absx & 0x7fffffu) | 0x800000u;
        uint32_t shift = 126 - e; /* 14 + (112 - e) + ... */
        uint32_t r = m >> (shift - 0);
        uint32_t rem = m & ((1u << shift) - 1);
        uint32_t half = 1u << (shift - 1);
        /* value = m * 2^(e-150); f16 subnormal unit = 2^-24 -> shift = 150 - 24 - e = 126 - e */
        if (rem > half || (rem == half && (r & 1u))) r++;
        return (cuvil_f16)(sign | r);
    }
    uint32_t e = (absx >> 23) - 127 + 15;
    uint32_t m = absx & 0x7fffffu;
    uint32_t r = (e << 10) | (m >> 13);
    uint32_t rem = m & 0x1fffu;
    if (rem > 0x1000u || (rem == 0x1000u && (r & 1u))) r++;
    return (cuvil_f16)(sign | r);
#endif
}

static inline float cuvil_bf16_to_f32(cuvil_bf16 h) {
    uint32_t bits = (uint32_t)h << 16;
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

static inline cuvil_bf16 cuvil_f32_to_bf16(float f) {
    uint32_t x;
    memcpy(&x, &f, 4);
    if ((x & 0x7fffffffu) > 0x7f800000u) return (cuvil_bf16)((x >> 16) | 0x40u); /* quiet nan */
    uint32_t lsb = (x >> 16) & 1u;
    x += 0x7fffu + lsb;
    return (cuvil_bf16)(x >> 16);
}

#endif /* CUVIL_RT_H */
