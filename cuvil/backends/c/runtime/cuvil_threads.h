/* Cuvil's threads: a model's thread pool, the parallel-for that kernels use,
 * and the model's cache of operands prepared once (packed constant weights).
 *
 * Ownership.  A loaded model owns one cuvil_shared: its pool (num_threads - 1
 * worker threads; none when num_threads is 1) and its constant cache.  Both
 * live from cuvil_load (or cuvil_set_num_threads) to cuvil_unload, which
 * joins the workers and frees the cache: no thread or buffer outlives the
 * model.  Each cuvil_run enters an execution context (cuvil_exec) that this
 * thread's kernels find through a thread-local pointer, so the kernels'
 * signatures need no extra argument and calls on other threads see their own
 * contexts.
 *
 * Several threads may call one model at once.  The pool runs one parallel
 * region at a time: a call takes it with a try-lock for its whole duration,
 * and a call that finds it taken runs single-threaded (the cores are busy
 * with the other call anyway) instead of waiting.  The cache is guarded by a
 * mutex.
 *
 * Determinism.  cuvil_parallel_for hands out task indices dynamically, so
 * which thread runs a task varies; kernels make each task compute its own
 * outputs in a fixed order, so results are bitwise the same for any number
 * of threads.
 *
 * Without POSIX threads (wasm32, Windows) or with CUVIL_NO_THREADS defined,
 * there is no pool and every region runs on the calling thread.
 */
#ifndef CUVIL_THREADS_H
#define CUVIL_THREADS_H

#include "cuvil_rt.h"

#if !defined(__wasm__) && !defined(_WIN32)
#define CUVIL_HAVE_PTHREADS 1
#include <pthread.h>
#else
#define CUVIL_HAVE_PTHREADS 0
#endif

#if CUVIL_HAVE_PTHREADS && !defined(CUVIL_NO_THREADS)
#define CUVIL_POOL 1
#include <stdatomic.h>
#else
#define CUVIL_POOL 0
#endif

/* A wasm32 instance without the threads proposal runs one thread: the cache needs no lock.
 * On Windows there is no lock here: no cache (operands are prepared per call). */
#if CUVIL_HAVE_PTHREADS || (defined(__wasm__) && !defined(__wasm_atomics__))
#define CUVIL_CACHE 1
#else
#define CUVIL_CACHE 0
#endif

#if CUVIL_HAVE_PTHREADS
#define CUVIL_TLS _Thread_local
#else
#define CUVIL_TLS
#endif

#if defined(__x86_64__) || defined(__i386__)
#define CUVIL_PAUSE() __builtin_ia32_pause()
#elif defined(__aarch64__)
#define CUVIL_PAUSE() __asm__ __volatile__("yield")
#else
#define CUVIL_PAUSE() ((void)0)
#endif

/* A worker spins this many pauses (about 0.1 ms on x86-64) for the next region before it sleeps:
 * a model's kernels follow each other closely, and waking a sleeping thread costs tens of
 * microseconds; spinning longer would take a core from other work between calls. */
#define CUVIL_SPIN 5000

/* A task of a parallel region; `tid` in [0, threads of the region) names the thread running it
 * (for per-thread scratch), never what it computes. */
typedef void (*cuvil_task_fn)(void *ctx, int64_t task, int tid);

/* ---- the constant cache --------------------------------------------------------------- */

#define CUVIL_CACHE_KEY 8
#define CUVIL_CACHE_BUCKETS 256

typedef struct cuvil_cache_entry {
    struct cuvil_cache_entry *next;
    const void *src;
    int64_t key[CUVIL_CACHE_KEY];
    void *data;
} cuvil_cache_entry;

/* ---- the pool --------------------------------------------------------------------------- */

typedef struct cuvil_shared cuvil_shared;

#if CUVIL_POOL
struct cuvil_pool;
typedef struct cuvil_worker {
    pthread_t thread;
    struct cuvil_pool *pool;
    int tid;
} cuvil_worker;

typedef struct cuvil_pool {
    int n; /* threads, the caller included */
    cuvil_worker *workers;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    atomic_uint gen;      /* the latest region; bumped to start one (or to stop) */
    atomic_uint closed;   /* the latest region whose tasks are all done */
    atomic_int sleepers;  /* workers blocked on cv */
    atomic_int active;    /* workers inside a region: the caller waits for them before the next */
    atomic_llong next;    /* the next task index to hand out */
    atomic_llong done;    /* tasks finished */
    atomic_int stop;
    /* the current region (written before gen is bumped; stable until its caller sees active == 0) */
    int64_t ntasks;
    cuvil_task_fn fn;
    void *ctx;
    cuvil_shared *shared;
} cuvil_pool;
#else
typedef struct cuvil_pool cuvil_pool;
#endif

/* What a loaded model shares among the calls on it. */
struct cuvil_shared {
    int num_threads;
    const unsigned char *weights; /* operands inside [weights, weights + size) never change */
    size_t size;
    cuvil_cache_entry *cache[CUVIL_CACHE_BUCKETS];
#if CUVIL_HAVE_PTHREADS
    pthread_mutex_t cache_lock;
#endif
#if CUVIL_POOL
    pthread_mutex_t pool_lock; /* held by the call that uses the pool */
    cuvil_pool *pool;
#endif
};

/* The execution context of the code running on this thread: a call, or a task of its region. */
typedef struct cuvil_exec {
    cuvil_shared *shared;
    cuvil_pool *pool; /* NULL: run regions on this thread */
} cuvil_exec;

static CUVIL_TLS cuvil_exec *cuvil_cur_exec;

/* Threads a kernel running now may use (1 inside a region: regions do not nest). */
static CUVIL_UNUSED int cuvil_num_threads_now(void) {
#if CUVIL_POOL
    const cuvil_exec *e = cuvil_cur_exec;
    return e && e->pool ? e->pool->n : 1;
#else
    return 1;
#endif
}

#if CUVIL_POOL
static void cuvil_pool_run_tasks(cuvil_pool *p, int tid) {
    for (;;) {
        const long long i = atomic_fetch_add_explicit(&p->next, 1, memory_order_relaxed);
        if (i >= p->ntasks) return;
        p->fn(p->ctx, (int64_t)i, tid);
        atomic_fetch_add_explicit(&p->done, 1, memory_order_release);
    }
}

static void *cuvil_pool_worker(void *arg) {
    const cuvil_worker *self = (const cuvil_worker *)arg;
    cuvil_pool *p = self->pool;
    unsigned seen = 0;
    for (;;) {
        unsigned g;
        int spins = 0;
        while ((g = atomic_load_explicit(&p->gen, memory_order_acquire)) == seen) {
            if (++spins < CUVIL_SPIN) {
                CUVIL_PAUSE();
                continue;
            }
            /* sleepers is raised before gen is read again under the mutex, and the dispatcher bumps
             * gen before it reads sleepers (both sequentially consistent): one of them sees the other. */
            pthread_mutex_lock(&p->mu);
            atomic_fetch_add(&p->sleepers, 1);
            while (atomic_load(&p->gen) == seen) pthread_cond_wait(&p->cv, &p->mu);
            atomic_fetch_sub(&p->sleepers, 1);
            pthread_mutex_unlock(&p->mu);
            spins = 0;
        }
        /* The caller does not wait for workers that wake late: it closes a region once its tasks
         * are done, then waits for the workers inside.  A worker enters, then checks that the
         * latest region is still open (the caller closes, then reads active: one of them sees the
         * other); its fields stay as they are until the worker leaves. */
        atomic_fetch_add(&p->active, 1);
        g = atomic_load(&p->gen);
        seen = g;
        const int stop = atomic_load(&p->stop); /* set before the last bump of gen */
        if (!stop && atomic_load(&p->closed) != g) {
            cuvil_exec task = {p->shared, NULL};
            cuvil_cur_exec = &task;
            cuvil_pool_run_tasks(p, self->tid);
            cuvil_cur_exec = NULL;
        }
        atomic_fetch_sub_explicit(&p->active, 1, memory_order_release);
        if (stop) return NULL;
    }
}

static void cuvil_pool_wake(cuvil_pool *p) {
    atomic_fetch_add(&p->gen, 1);
    if (atomic_load(&p->sleepers) > 0) {
        pthread_mutex_lock(&p->mu);
        pthread_cond_broadcast(&p->cv);
        pthread_mutex_unlock(&p->mu);
    }
}

static void cuvil_pool_free(cuvil_pool *p) {
    if (!p) return;
    atomic_store(&p->stop, 1);
    cuvil_pool_wake(p);
    for (int i = 0; i < p->n - 1; i++) pthread_join(p->workers[i].thread, NULL);
    pthread_cond_destroy(&p->cv);
    pthread_mutex_destroy(&p->mu);
    free(p->workers);
    free(p);
}

/* A pool of n threads (n - 1 workers), or NULL when they cannot be had. */
static cuvil_pool *cuvil_pool_new(int n, cuvil_shared *shared) {
    cuvil_pool *p = (cuvil_pool *)calloc(1, sizeof(cuvil_pool));
    if (!p) return NULL;
    p->workers = (cuvil_worker *)calloc((size_t)n, sizeof(cuvil_worker));
    if (!p->workers || pthread_mutex_init(&p->mu, NULL) != 0) {
        free(p->workers);
        free(p);
        return NULL;
    }
    if (pthread_cond_init(&p->cv, NULL) != 0) {
        pthread_mutex_destroy(&p->mu);
        free(p->workers);
        free(p);
        return NULL;
    }
    atomic_init(&p->gen, 0u);
    atomic_init(&p->closed, 0u);
    atomic_init(&p->sleepers, 0);
    atomic_init(&p->active, 0);
    atomic_init(&p->next, 0);
    atomic_init(&p->done, 0);
    atomic_init(&p->stop, 0);
    p->shared = shared;
    p->n = 1;
    for (int i = 0; i < n - 1; i++) {
        p->workers[i].pool = p;
        p->workers[i].tid = i + 1;
        if (pthread_create(&p->workers[i].thread, NULL, cuvil_pool_worker, &p->workers[i]) != 0) {
            cuvil_pool_free(p); /* joins the workers started so far */
            return NULL;
        }
        p->n++;
    }
    return p;
}
#endif

/* Run fn(ctx, i, tid) for every i in [0, ntasks), on the current call's threads when it holds the
 * pool (tid < cuvil_num_threads_now() as read before the call).  Tasks must write disjoint memory;
 * they may run in any order and on any thread. */
static CUVIL_UNUSED void cuvil_parallel_for(int64_t ntasks, cuvil_task_fn fn, void *ctx) {
    if (ntasks <= 0) return;
#if CUVIL_POOL
    cuvil_exec *e = cuvil_cur_exec;
    cuvil_pool *p = e ? e->pool : NULL;
    if (p && ntasks > 1) {
        p->fn = fn;
        p->ctx = ctx;
        p->ntasks = ntasks;
        atomic_store_explicit(&p->next, 0, memory_order_relaxed);
        atomic_store_explicit(&p->done, 0, memory_order_relaxed);
        cuvil_pool_wake(p); /* publishes the fields above */
        cuvil_exec task = {e->shared, NULL};
        cuvil_cur_exec = &task; /* the caller's tasks run single-threaded, as the workers' do */
        cuvil_pool_run_tasks(p, 0);
        cuvil_cur_exec = e;
        while (atomic_load_explicit(&p->done, memory_order_acquire) < ntasks) CUVIL_PAUSE();
        atomic_store(&p->closed, atomic_load_explicit(&p->gen, memory_order_relaxed));
        while (atomic_load_explicit(&p->active, memory_order_acquire) > 0) CUVIL_PAUSE();
        return;
    }
#endif
    for (int64_t i = 0; i < ntasks; i++) fn(ctx, i, 0);
}

/* [lo, hi) of part `i` of `n` near-equal parts of [0, total). */
static inline void cuvil_split(int64_t total, int64_t n, int64_t i, int64_t *lo, int64_t *hi) {
    const int64_t q = total / n, r = total % n;
    *lo = i * q + (i < r ? i : r);
    *hi = *lo + q + (i < r ? 1 : 0);
}

/* ---- the model's shared state ------------------------------------------------------------ */

static int cuvil_shared_init(cuvil_shared *s, const unsigned char *weights, size_t size) {
    memset(s, 0, sizeof *s);
    s->num_threads = 1;
    s->weights = weights;
    s->size = size;
#if CUVIL_HAVE_PTHREADS
    if (pthread_mutex_init(&s->cache_lock, NULL) != 0) return -1;
#endif
#if CUVIL_POOL
    if (pthread_mutex_init(&s->pool_lock, NULL) != 0) {
        pthread_mutex_destroy(&s->cache_lock);
        return -1;
    }
#endif
    return 0;
}

static void cuvil_shared_destroy(cuvil_shared *s) {
#if CUVIL_POOL
    cuvil_pool_free(s->pool);
    s->pool = NULL;
    pthread_mutex_destroy(&s->pool_lock);
#endif
    for (int b = 0; b < CUVIL_CACHE_BUCKETS; b++) {
        for (cuvil_cache_entry *c = s->cache[b], *next; c; c = next) {
            next = c->next;
            free(c->data);
            free(c);
        }
        s->cache[b] = NULL;
    }
#if CUVIL_HAVE_PTHREADS
    pthread_mutex_destroy(&s->cache_lock);
#endif
}

/* Use n threads from now on (n - 1 workers are started here); 0, or -1 when threads cannot be had
 * (the model then stays single-threaded).  Not to be called while calls run on the model. */
static int cuvil_shared_set_threads(cuvil_shared *s, int n) {
    (void)s;
    if (n < 1) return -1;
#if CUVIL_POOL
    pthread_mutex_lock(&s->pool_lock);
    cuvil_pool_free(s->pool);
    s->pool = NULL;
    s->num_threads = 1;
    int rc = 0;
    if (n > 1) {
        s->pool = cuvil_pool_new(n, s);
        if (s->pool)
            s->num_threads = n;
        else
            rc = -1;
    }
    pthread_mutex_unlock(&s->pool_lock);
    return rc;
#else
    return n == 1 ? 0 : -1;
#endif
}

/* Enter a call on this thread: it gets the pool unless another call holds it. */
static void cuvil_exec_enter(cuvil_exec *e, cuvil_shared *s) {
    e->shared = s;
    e->pool = NULL;
#if CUVIL_POOL
    if (pthread_mutex_trylock(&s->pool_lock) == 0) {
        if (s->pool)
            e->pool = s->pool;
        else
            pthread_mutex_unlock(&s->pool_lock);
    }
#endif
    cuvil_cur_exec = e;
}

static void cuvil_exec_leave(cuvil_exec *e) {
#if CUVIL_POOL
    if (e->pool) pthread_mutex_unlock(&e->shared->pool_lock);
#endif
    e->pool = NULL;
    cuvil_cur_exec = NULL;
}

/* ---- the constant cache ------------------------------------------------------------------ */

typedef void (*cuvil_cache_build_fn)(void *dst, const void *arg);

/* Whether [p, p + bytes) lies in the model's weights (which no call writes). */
static CUVIL_UNUSED int cuvil_is_constant(const void *p, size_t bytes) {
    const cuvil_exec *e = cuvil_cur_exec;
    if (!e || !e->shared || !e->shared->weights) return 0;
    const unsigned char *lo = e->shared->weights, *c = (const unsigned char *)p;
    return c >= lo && c <= lo + e->shared->size && bytes <= (size_t)(lo + e->shared->size - c);
}

/* The buffer derived from the constant `src` identified by `key` (CUVIL_CACHE_KEY numbers):
 * built by build(dst, arg) into `bytes` bytes on first use, kept until the model is unloaded.
 * NULL when there is no cache (no call context, or no memory): the caller then derives it itself. */
static CUVIL_UNUSED const void *cuvil_cache_get(const void *src, const int64_t *key, size_t bytes,
                                                cuvil_cache_build_fn build, const void *arg) {
#if CUVIL_CACHE
    const cuvil_exec *e = cuvil_cur_exec;
    if (!e || !e->shared) return NULL;
    cuvil_shared *s = e->shared;
    uint64_t h = (uint64_t)(uintptr_t)src * 0x9e3779b97f4a7c15ull;
    for (int i = 0; i < CUVIL_CACHE_KEY; i++) h = (h ^ (uint64_t)key[i]) * 0x100000001b3ull;
    const size_t b = (size_t)(h >> 32) % CUVIL_CACHE_BUCKETS;
#if CUVIL_HAVE_PTHREADS
    pthread_mutex_lock(&s->cache_lock); /* held while building: the first call builds, the others wait */
#endif
    void *found = NULL;
    for (cuvil_cache_entry *c = s->cache[b]; c; c = c->next)
        if (c->src == src && memcmp(c->key, key, sizeof c->key) == 0) {
            found = c->data;
            break;
        }
    if (!found) {
        cuvil_cache_entry *c = (cuvil_cache_entry *)malloc(sizeof *c);
        void *data = aligned_alloc(CUVIL_ALIGN, (bytes + CUVIL_ALIGN - 1) / CUVIL_ALIGN * CUVIL_ALIGN);
        if (c && data) {
            build(data, arg);
            c->src = src;
            memcpy(c->key, key, sizeof c->key);
            c->data = data;
            c->next = s->cache[b];
            s->cache[b] = c;
            found = data;
        } else {
            free(c);
            free(data);
        }
    }
#if CUVIL_HAVE_PTHREADS
    pthread_mutex_unlock(&s->cache_lock);
#endif
    return found;
#else
    (void)src, (void)key, (void)bytes, (void)build, (void)arg;
    return NULL;
#endif
}

#endif /* CUVIL_THREADS_H */
