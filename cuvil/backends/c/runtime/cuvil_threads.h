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
 * Waiting.  Idle workers spin (yielding the core to any other thread that wants it) while a call
 * holds the pool and briefly after it leaves, then sleep on a condition variable; a call that ran a parallel region last time, or declined one only because the workers
 * slept, wakes them as it starts, so they are spinning by the time its first region comes.  The caller of a region works on its tasks too,
 * then spins briefly for the workers still inside, then sleeps until the last one leaves: on a
 * loaded machine a worker may be preempted mid-task, and spinning on the core it needs would
 * cost a scheduler time slice per region.
 *
 * Cost model.  Kernels ask cuvil_parallel_worth whether a region that would take `ns` on one
 * thread pays for the pool: what splitting saves, ns (1 - 1/threads), must exceed a fixed cost
 * of handing out tasks (more when a worker sleeps and must be woken) plus what the caller has
 * recently spent waiting for workers at the end of its regions (a moving average, measured; a
 * region that had to wake a sleeping worker, and a call that started by waking them, are left out
 * of it: a worker just woken can be slow for a while, which says nothing of how busy the cores are).
 * On a machine whose cores are busy with other work, workers start late or are preempted, that
 * wait grows, and short regions stop being split; each region run serially for that reason
 * lets the estimate decay, so splitting is tried again once the machine is quieter.
 * The model's split policy (cuvil_set_split_policy) can turn the cost model off: under
 * CUVIL_SPLIT_ALWAYS every region a kernel offers to split runs on the pool whatever its size or
 * the workers' recent waits, so which regions thread no longer depends on timing or machine load
 * (tests that check the threaded kernels rely on it; it is not a speed setting).
 *
 * Which thread runs which task.  A region's tasks are cut into one contiguous range per thread;
 * each thread runs its own range first, in order, then takes what is left of the others' (a late
 * or preempted worker's share goes to the threads that are running).  Kernels number their tasks
 * along their outputs, so consecutive regions tend to give a thread the same part of the data
 * (the rows it wrote, its packed panels), which stays in that core's caches.  This matters on
 * virtual machines whose vCPUs the host may place on cores that share no cache: there, reading
 * data another core wrote is several times slower than reading one's own, and handing out tasks
 * in one shared order cost ResNet-18 5-8% at two threads.
 *
 * Determinism.  Which thread runs a task varies (with timing); kernels make each task compute
 * its own outputs in a fixed order, so results are bitwise the same for any number of threads.
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
#include <sched.h>
#include <stdatomic.h>
#include <time.h>
#else
#define CUVIL_POOL 0
#endif

/* Workers can see which CPU they run on and move off the caller's (cuvil_worker_settle). */
#if CUVIL_POOL && defined(__linux__) && defined(CPU_SET)
#define CUVIL_POOL_MOVE 1
#else
#define CUVIL_POOL_MOVE 0
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

/* An idle worker waits for the next region by spinning CUVIL_SPIN pauses (a few microseconds),
 * then by yielding its core (sched_yield) while a call holds the pool and until CUVIL_SPIN_NS
 * after, then it sleeps.  A call that threaded last time wakes the workers as it starts; where an
 * idle core halts (a virtual machine's idle vCPU), that can take a millisecond and more, and the
 * caller runs the tasks alone until they join.  The spin after a call is kept short so that
 * workers idle between calls do not take the cores from other work.  Yielding rather than
 * spinning matters when the cores are busy with other work: a spinning worker would take the
 * core its own caller needs. */
#define CUVIL_SPIN 200
/* Between yields a waiting worker spins this many pauses: most of the time it is spinning, not in
 * the system call, so it sees a new region within a pause or so (a yield takes a microsecond). */
#define CUVIL_SPIN_BURST 100
#define CUVIL_SPIN_NS 2e6
/* The caller of a region spins this many pauses for the workers still inside before it sleeps. */
#define CUVIL_WAIT_SPIN 2000
/* A region shorter than this (nanoseconds on one thread) runs on the calling thread: with the
 * workers spinning, handing out tasks and waiting for the last one costs a few microseconds;
 * with a worker asleep, waking it costs tens (more when the cores are busy with other work). */
#define CUVIL_PAR_MIN_NS 5000.0
#define CUVIL_PAR_MIN_NS_ASLEEP 60000.0
/* Weight of the newest region in the moving average of the end-of-region wait, and the factor
 * that average decays by for each region the cost model runs on one thread. */
#define CUVIL_WAIT_EMA 0.25
#define CUVIL_WAIT_DECAY 0.97

/* The model's split policy: CUVIL_SPLIT_AUTO asks the cost model; CUVIL_SPLIT_ALWAYS splits every
 * region a kernel can split (one thread per region: no threads, no split). */
#define CUVIL_SPLIT_AUTO 0
#define CUVIL_SPLIT_ALWAYS 1

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
    size_t bytes;
    struct cuvil_cache_entry *next_const; /* the model's derived constants (cuvil_cache_get_constant) */
} cuvil_cache_entry;

/* [lo, hi) of part `i` of `n` near-equal parts of [0, total). */
static inline void cuvil_split(int64_t total, int64_t n, int64_t i, int64_t *lo, int64_t *hi) {
    const int64_t q = total / n, r = total % n;
    *lo = i * q + (i < r ? i : r);
    *hi = *lo + q + (i < r ? 1 : 0);
}

/* ---- the pool --------------------------------------------------------------------------- */

typedef struct cuvil_shared cuvil_shared;

/* What a model's pool did since it started (cuvil_get_thread_stats): written by the call holding
 * the pool, read under the model's pool lock.  A region is a cuvil_parallel_for of more than one
 * task on a call holding the pool; a declined region is one the cost model ran on the calling
 * thread alone. */
typedef struct cuvil_pool_stats {
    int64_t calls;        /* calls that held the pool */
    int64_t regions;      /* regions run on the pool */
    int64_t declined;     /* regions run on the calling thread alone */
    int64_t tasks;        /* tasks of the regions run on the pool */
    int64_t worker_tasks; /* ... of which workers ran (the rest the caller did) */
    double wait_ns;       /* time callers spent waiting for workers at the end of regions */
} cuvil_pool_stats;

/* Arenas a model keeps between calls: one per call that may run at once, up to this many. */
#define CUVIL_ARENA_KEEP 4

#if CUVIL_POOL
struct cuvil_pool;
typedef struct cuvil_worker {
    pthread_t thread;
    struct cuvil_pool *pool;
    int tid;
    atomic_int cpu; /* the CPU it last ran a region on (-1: not known) */
} cuvil_worker;

/* The part of a region's tasks that one thread takes first: [next, end), on its own cache line. */
typedef struct cuvil_task_range {
    atomic_llong next;
    int64_t end;
    char pad[64 - sizeof(atomic_llong) - sizeof(int64_t)];
} cuvil_task_range;

typedef struct cuvil_pool {
    int n; /* threads, the caller included */
    cuvil_task_range *ranges; /* per thread */
    cuvil_worker *workers;
    pthread_mutex_t mu;
    pthread_cond_t cv;      /* workers sleep on it */
    pthread_cond_t done_cv; /* the caller of a region sleeps on it */
    atomic_uint gen;      /* the latest region; bumped to start one (or to stop) */
    atomic_uint warm;     /* bumped to have sleeping workers spin again (a call is starting) */
    atomic_int waiting;   /* the caller sleeps on done_cv */
    atomic_uint closed;   /* the latest region whose tasks are all done */
    atomic_int sleepers;  /* workers blocked on cv */
    atomic_int active;    /* workers inside a region: the caller waits for them before the next */
    atomic_llong done;    /* tasks finished */
    atomic_int stop;
    atomic_int calling;   /* a call holds the pool: idle workers keep spinning until it leaves */
    atomic_int caller_cpu; /* the CPU the calling thread last ran on (-1: not known) */
    /* owned by the call holding the pool */
    int used;             /* the current call ran a parallel region */
    int used_last;        /* ... and so did the call before it */
    int warmed;           /* the current call had the workers ready as it started */
    int woke;             /* ... by waking sleeping ones: its waits are wake-ups', not contention */
    int wanted;           /* the current call declined a region only because workers slept */
    int wanted_last;      /* ... and so did the call before it */
    double wait_ns;       /* moving average of the caller's end-of-region wait */
    cuvil_pool_stats stats; /* since the pool started */
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
    int split_policy; /* CUVIL_SPLIT_AUTO or CUVIL_SPLIT_ALWAYS; kept across cuvil_shared_set_threads */
    const unsigned char *weights; /* operands inside [weights, weights + size) never change */
    size_t size;
    cuvil_cache_entry *cache[CUVIL_CACHE_BUCKETS];
    cuvil_cache_entry *consts; /* entries that count as constants, like the weights */
    /* arenas of finished calls, kept for the next ones (cuvil_arena_get); guarded by cache_lock */
    void *arenas[CUVIL_ARENA_KEEP];
    size_t arena_caps[CUVIL_ARENA_KEEP];
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

/* A range task: iterations [lo, hi) of a cuvil_parallel_range or cuvil_parallel_steps region. */
typedef void (*cuvil_range_fn)(const void *ctx, int64_t lo, int64_t hi);
/* Iterations per granule: ranges start on cache-line boundaries for elements of up to 8 bytes. */
#define CUVIL_RANGE_GRANULE 256
/* Bytes per nanosecond one thread streams through an elementwise loop (read and written, data in
 * the last-level cache), on the low side: a float32 ReLU on a current x86 core streams about 100. */
#define CUVIL_STREAM_BYTES_PER_NS 40.0
/* Fills a cache entry's `dst` from `arg` (cuvil_cache_get). */
typedef void (*cuvil_cache_build_fn)(void *dst, const void *arg);

/* ---- what kernels and the model's API call (defined below, or in the kernel library: cuvil_rt.h) ---- */
CUVIL_LIB int cuvil_num_threads_now(void);
CUVIL_LIB void cuvil_parallel_for(int64_t ntasks, cuvil_task_fn fn, void *ctx);
CUVIL_LIB int cuvil_parallel_worth(double ns);
CUVIL_LIB void cuvil_parallel_range(int64_t n, double bytes, double item_ns, cuvil_range_fn fn, const void *ctx);
CUVIL_LIB void cuvil_parallel_steps(int64_t n, double item_ns, cuvil_range_fn fn, const void *ctx);
CUVIL_LIB int cuvil_shared_init(cuvil_shared *s, const unsigned char *weights, size_t size);
CUVIL_LIB void cuvil_shared_destroy(cuvil_shared *s);
CUVIL_LIB void *cuvil_arena_get(cuvil_call *c, cuvil_shared *s, int64_t bytes);
CUVIL_LIB int cuvil_shared_set_threads(cuvil_shared *s, int n);
CUVIL_LIB void cuvil_exec_enter(cuvil_exec *e, cuvil_shared *s);
CUVIL_LIB void cuvil_exec_leave(cuvil_exec *e);
CUVIL_LIB void cuvil_shared_thread_stats(cuvil_shared *s, cuvil_pool_stats *out, double *wait_estimate_ns);
CUVIL_LIB int cuvil_is_constant(const void *p, size_t bytes);
CUVIL_LIB const void *cuvil_cache_get(const void *src, const int64_t *key, size_t bytes, cuvil_cache_build_fn build,
                                      const void *arg);
CUVIL_LIB const void *cuvil_cache_get_constant(const void *src, const int64_t *key, size_t bytes,
                                               cuvil_cache_build_fn build, const void *arg);

#if CUVIL_LIB_BODY

static CUVIL_TLS cuvil_exec *cuvil_cur_exec;

/* Threads a kernel running now may use (1 inside a region: regions do not nest). */
CUVIL_LIB int cuvil_num_threads_now(void) {
#if CUVIL_POOL
    const cuvil_exec *e = cuvil_cur_exec;
    return e && e->pool ? e->pool->n : 1;
#else
    return 1;
#endif
}

#if CUVIL_POOL
/* Nanoseconds on the real-time clock (C11's timespec_get): only differences over a region matter. */
static double cuvil_now_ns(void) {
    struct timespec ts;
    if (timespec_get(&ts, TIME_UTC) != TIME_UTC) return 0.0;
    return 1e9 * (double)ts.tv_sec + (double)ts.tv_nsec;
}

/* Wake the region's caller if it sleeps (after a change it waits for: done or active).  The
 * caller raises `waiting`, then re-reads both counters under the mutex; a worker changes a
 * counter, then reads `waiting` (all sequentially consistent): one of them sees the other. */
static void cuvil_pool_notify(cuvil_pool *p) {
    if (atomic_load(&p->waiting)) {
        pthread_mutex_lock(&p->mu);
        pthread_cond_broadcast(&p->done_cv);
        pthread_mutex_unlock(&p->mu);
    }
}

/* Run the region's tasks until none is left; how many this thread ran. */
static int64_t cuvil_pool_run_tasks(cuvil_pool *p, int tid) {
    int64_t ran = 0;
    for (int k = 0; k < p->n; k++) { /* its own range first, then what is left of the others' */
        cuvil_task_range *r = &p->ranges[(tid + k) % p->n];
        for (;;) {
            const long long i = atomic_fetch_add_explicit(&r->next, 1, memory_order_relaxed);
            if (i >= r->end) break;
            p->fn(p->ctx, (int64_t)i, tid);
            ran++;
            if (atomic_fetch_add(&p->done, 1) + 1 == p->ntasks && tid != 0) cuvil_pool_notify(p);
        }
    }
    return ran;
}

/* Keeping workers off the caller's CPU.  On a virtual machine, Linux may take a vCPU that has
 * been idle for some milliseconds for one that is slow to run again, and then place a thread
 * woken for the pool on the waker's CPU: the worker waits there for the caller's time slice to
 * end (milliseconds), then shares its core and stays (the load balancer does not migrate a thread
 * that has just run, and a spinning worker always has), so the call runs on one core in effect.
 * So a worker going to sleep narrows its affinity to the CPUs the rest of its pool does not run
 * on (the caller's last, the other workers'), which makes its wake-up place it on another one,
 * and restores its affinity when woken; and a worker that finds itself on the caller's CPU or
 * another worker's as a region comes moves the same way (narrow, then restore: the kernel
 * migrates it at once) before it enters the region, so the caller never waits for a worker that
 * is moving: it runs the region's tasks meanwhile.  Nothing is narrowed when the pool has more
 * threads than the process has CPUs. */
static int cuvil_this_cpu(void) {
#if CUVIL_POOL_MOVE
    return sched_getcpu();
#else
    return -1;
#endif
}

#if CUVIL_POOL_MOVE
/* Whether `cpu` is the caller's or another worker's. */
static int cuvil_worker_clashes(cuvil_pool *p, const cuvil_worker *self, int cpu) {
    if (cpu == atomic_load_explicit(&p->caller_cpu, memory_order_relaxed)) return 1;
    for (int i = 0; i < p->n - 1; i++)
        if (&p->workers[i] != self && atomic_load_explicit(&p->workers[i].cpu, memory_order_relaxed) == cpu) return 1;
    return 0;
}

/* Narrow this worker's affinity to the CPUs the rest of its pool does not run on; its affinity
 * before goes to *home.  Whether it was narrowed. */
static int cuvil_worker_narrow(cuvil_pool *p, const cuvil_worker *self, cpu_set_t *home) {
    if (sched_getaffinity(0, sizeof *home, home) != 0) return 0;
    cpu_set_t away = *home;
    for (int cpu = 0; cpu < CPU_SETSIZE; cpu++)
        if (CPU_ISSET(cpu, &away) && cuvil_worker_clashes(p, self, cpu)) CPU_CLR(cpu, &away);
    if (CPU_COUNT(&away) == 0 || CPU_EQUAL(&away, home)) return 0;
    return sched_setaffinity(0, sizeof away, &away) == 0;
}
#endif

/* Move off the caller's CPU or another worker's, if on one; note the CPU this worker runs on. */
static void cuvil_worker_settle(cuvil_pool *p, cuvil_worker *self) {
#if CUVIL_POOL_MOVE
    int cpu = sched_getcpu();
    if (cpu >= 0 && cuvil_worker_clashes(p, self, cpu)) {
        cpu_set_t home;
        if (cuvil_worker_narrow(p, self, &home)) {
            (void)sched_setaffinity(0, sizeof home, &home);
            cpu = sched_getcpu();
        }
    }
    atomic_store_explicit(&self->cpu, cpu, memory_order_relaxed);
#else
    (void)p, (void)self;
#endif
}

static void *cuvil_pool_worker(void *arg) {
    cuvil_worker *self = (cuvil_worker *)arg;
    cuvil_pool *p = self->pool;

    unsigned seen = 0;
    for (;;) {
        unsigned g;
        int spins = 0;
        double idle_since = 0.0;
        while ((g = atomic_load_explicit(&p->gen, memory_order_acquire)) == seen) {
            if (++spins < CUVIL_SPIN) {
                CUVIL_PAUSE();
                continue;
            }
            const double t = cuvil_now_ns();
            /* during a call the next region may come after serial nodes of any length: stay ready */
            if (idle_since == 0.0 || atomic_load_explicit(&p->calling, memory_order_relaxed)) idle_since = t;
            if (t - idle_since < CUVIL_SPIN_NS) {
                sched_yield();
                spins = CUVIL_SPIN - CUVIL_SPIN_BURST; /* then spin a burst again: a region starting now is seen at once */
                continue;
            }
            /* sleepers is raised before gen is read again under the mutex, and the dispatcher bumps
             * gen before it reads sleepers (both sequentially consistent): one of them sees the other.
             * A bump of warm (a call starting) sends the worker back to spinning. */
#if CUVIL_POOL_MOVE
            cpu_set_t home;
            const int narrowed = cuvil_worker_narrow(p, self, &home);
#endif
            pthread_mutex_lock(&p->mu);
            const unsigned warm = atomic_load(&p->warm);
            atomic_fetch_add(&p->sleepers, 1);
            while (atomic_load(&p->gen) == seen && atomic_load(&p->warm) == warm) pthread_cond_wait(&p->cv, &p->mu);
            atomic_fetch_sub(&p->sleepers, 1);
            pthread_mutex_unlock(&p->mu);
#if CUVIL_POOL_MOVE
            if (narrowed) (void)sched_setaffinity(0, sizeof home, &home);
#endif
            cuvil_worker_settle(p, self); /* the caller may have moved to this CPU meanwhile */
            spins = 0;
            idle_since = 0.0;
        }
        cuvil_worker_settle(p, self);
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
            (void)cuvil_pool_run_tasks(p, self->tid);
            cuvil_cur_exec = NULL;
        }
        atomic_fetch_sub(&p->active, 1);
        cuvil_pool_notify(p);
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

/* Have sleeping workers spin again: a call that is likely to run regions is starting.  Whether
 * any slept. */
static int cuvil_pool_warm(cuvil_pool *p) {
    if (atomic_load(&p->sleepers) > 0) {
        pthread_mutex_lock(&p->mu);
        atomic_fetch_add(&p->warm, 1);
        pthread_cond_broadcast(&p->cv);
        pthread_mutex_unlock(&p->mu);
        return 1;
    }
    return 0;
}

/* Until ready(p): spin a little, then sleep on done_cv (woken by cuvil_pool_notify). */
static void cuvil_pool_await(cuvil_pool *p, int (*ready)(cuvil_pool *)) {
    for (int spins = 0; spins < CUVIL_WAIT_SPIN; spins++) {
        if (ready(p)) return;
        CUVIL_PAUSE();
    }
    pthread_mutex_lock(&p->mu);
    atomic_store(&p->waiting, 1);
    while (!ready(p)) pthread_cond_wait(&p->done_cv, &p->mu);
    atomic_store(&p->waiting, 0);
    pthread_mutex_unlock(&p->mu);
}

static int cuvil_pool_tasks_done(cuvil_pool *p) { return atomic_load(&p->done) >= p->ntasks; }
static int cuvil_pool_idle(cuvil_pool *p) { return atomic_load(&p->active) == 0; }

static void cuvil_pool_free(cuvil_pool *p) {
    if (!p) return;
    atomic_store(&p->stop, 1);
    cuvil_pool_wake(p);
    for (int i = 0; i < p->n - 1; i++) pthread_join(p->workers[i].thread, NULL);
    pthread_cond_destroy(&p->done_cv);
    pthread_cond_destroy(&p->cv);
    pthread_mutex_destroy(&p->mu);
    free(p->workers);
    free(p->ranges);
    free(p);
}

/* A pool of n threads (n - 1 workers), or NULL when they cannot be had. */
static cuvil_pool *cuvil_pool_new(int n, cuvil_shared *shared) {
    cuvil_pool *p = (cuvil_pool *)calloc(1, sizeof(cuvil_pool));
    if (!p) return NULL;
    p->workers = (cuvil_worker *)calloc((size_t)n, sizeof(cuvil_worker));
    p->ranges = (cuvil_task_range *)aligned_alloc(64, (size_t)n * sizeof(cuvil_task_range));
    if (!p->workers || !p->ranges || pthread_mutex_init(&p->mu, NULL) != 0) {
        free(p->workers);
        free(p->ranges);
        free(p);
        return NULL;
    }
    if (pthread_cond_init(&p->cv, NULL) != 0) {
        pthread_mutex_destroy(&p->mu);
        free(p->workers);
        free(p->ranges);
        free(p);
        return NULL;
    }
    if (pthread_cond_init(&p->done_cv, NULL) != 0) {
        pthread_cond_destroy(&p->cv);
        pthread_mutex_destroy(&p->mu);
        free(p->workers);
        free(p->ranges);
        free(p);
        return NULL;
    }
    atomic_init(&p->gen, 0u);
    atomic_init(&p->warm, 0u);
    atomic_init(&p->waiting, 0);
    atomic_init(&p->closed, 0u);
    atomic_init(&p->sleepers, 0);
    atomic_init(&p->active, 0);
    atomic_init(&p->done, 0);
    atomic_init(&p->stop, 0);
    atomic_init(&p->calling, 0);
    atomic_init(&p->caller_cpu, -1);
    for (int i = 0; i < n; i++) atomic_init(&p->workers[i].cpu, -1);
    for (int i = 0; i < n; i++) atomic_init(&p->ranges[i].next, 0), p->ranges[i].end = 0;
    p->shared = shared;
    p->n = 1;
    for (int i = 0; i < n - 1; i++) {
        p->workers[i].pool = p;
        p->workers[i].tid = i + 1;
        if (pthread_create(&p->workers[i].thread, NULL, cuvil_pool_worker, &p->workers[i]) != 0) {
            cuvil_pool_free(p); /* joins the workers started so far */
            return NULL;
        }
#if CUVIL_POOL_MOVE
        { /* named for top, perf and debuggers: "cuvil-worker-1", ... (at most 15 characters) */
            char name[16];
            snprintf(name, sizeof name, "cuvil-worker-%d", (i + 1) % 100);
            (void)pthread_setname_np(p->workers[i].thread, name);
        }
#endif
        p->n++;
    }
    return p;
}
#endif

/* Run fn(ctx, i, tid) for every i in [0, ntasks), on the current call's threads when it holds the
 * pool (tid < cuvil_num_threads_now() as read before the call).  Tasks must write disjoint memory;
 * they may run in any order and on any thread. */
CUVIL_LIB void cuvil_parallel_for(int64_t ntasks, cuvil_task_fn fn, void *ctx) {
    if (ntasks <= 0) return;
#if CUVIL_POOL
    cuvil_exec *e = cuvil_cur_exec;
    cuvil_pool *p = e ? e->pool : NULL;
    if (p && ntasks > 1) {
        p->fn = fn;
        p->ctx = ctx;
        p->ntasks = ntasks;
        for (int t = 0; t < p->n; t++) {
            int64_t lo, hi;
            cuvil_split(ntasks, p->n, t, &lo, &hi);
            atomic_store_explicit(&p->ranges[t].next, lo, memory_order_relaxed);
            p->ranges[t].end = hi;
        }
        atomic_store_explicit(&p->done, 0, memory_order_relaxed);
        /* a worker asleep now takes a wake-up to join: that wait says nothing of how busy the cores are */
        const int waking = atomic_load_explicit(&p->sleepers, memory_order_relaxed) > 0;
        atomic_store_explicit(&p->caller_cpu, cuvil_this_cpu(), memory_order_relaxed);
        cuvil_pool_wake(p); /* publishes the fields above */
        cuvil_exec task = {e->shared, NULL};
        cuvil_cur_exec = &task; /* the caller's tasks run single-threaded, as the workers' do */
        const int64_t mine = cuvil_pool_run_tasks(p, 0);
        cuvil_cur_exec = e;
        p->used = 1;
        const double t0 = cuvil_now_ns();
        cuvil_pool_await(p, cuvil_pool_tasks_done);
        atomic_store(&p->closed, atomic_load_explicit(&p->gen, memory_order_relaxed));
        cuvil_pool_await(p, cuvil_pool_idle);
        double waited = cuvil_now_ns() - t0;
        if (waited < 0.0) waited = 0.0;
        if (!waking && !p->woke) p->wait_ns += CUVIL_WAIT_EMA * (waited - p->wait_ns);
        p->stats.regions++;
        p->stats.tasks += ntasks;
        p->stats.worker_tasks += ntasks - mine;
        p->stats.wait_ns += waited;
        return;
    }
#endif
    for (int64_t i = 0; i < ntasks; i++) fn(ctx, i, 0);
}

/* Whether a region that would take `ns` nanoseconds on one thread is worth running on the
 * current call's pool (0 when it has none). */
CUVIL_LIB int cuvil_parallel_worth(double ns) {
#if CUVIL_POOL
    const cuvil_exec *e = cuvil_cur_exec;
    if (!e || !e->pool) return 0;
    cuvil_pool *p = e->pool;
    if (p->shared->split_policy == CUVIL_SPLIT_ALWAYS) return 1;
    /* Workers this call woke as it started count as awake: until they run, the caller takes the
     * tasks itself (an idle vCPU can take a millisecond to run again; declining every region
     * until then would run the call's first part single-threaded). */
    const int asleep = !p->warmed && atomic_load_explicit(&p->sleepers, memory_order_relaxed) > 0;
    const double saved = ns * (1.0 - 1.0 / p->n);
    if (saved >= (asleep ? CUVIL_PAR_MIN_NS_ASLEEP : CUVIL_PAR_MIN_NS) + p->wait_ns) return 1;
    /* Worth it with the workers awake: the next call wakes them as it starts (cuvil_exec_enter),
     * or a model whose regions are all short would never thread once its workers slept. */
    if (asleep && saved >= CUVIL_PAR_MIN_NS + p->wait_ns) p->wanted = 1;
    p->wait_ns *= CUVIL_WAIT_DECAY;
    p->stats.declined++;
    return 0;
#else
    (void)ns;
    return 0;
#endif
}

/* ---- loops over ranges ------------------------------------------------------------------
 * A loop of independent iterations over [0, n) (an elementwise op: every element computed alone,
 * the same way wherever it falls), given as fn(ctx, lo, hi).  When the pool pays for the bytes the
 * loop streams, it runs as 4 ranges per thread of whole granules (a thread's own ranges first, in
 * order: consecutive loops over the same data keep each thread on the same part of it); else as
 * one range on the calling thread. */


typedef struct cuvil_range_job {
    cuvil_range_fn fn;
    const void *ctx;
    int64_t n, ntasks;
} cuvil_range_job;

static void cuvil_range_task(void *vctx, int64_t task, int tid) {
    const cuvil_range_job *j = (const cuvil_range_job *)vctx;
    (void)tid;
    int64_t lo, hi;
    cuvil_split((j->n + CUVIL_RANGE_GRANULE - 1) / CUVIL_RANGE_GRANULE, j->ntasks, task, &lo, &hi);
    lo *= CUVIL_RANGE_GRANULE;
    hi = hi * CUVIL_RANGE_GRANULE < j->n ? hi * CUVIL_RANGE_GRANULE : j->n;
    if (lo < hi) j->fn(j->ctx, lo, hi);
}

/* fn over [0, n), a loop that reads and writes `bytes` in all and computes for about `item_ns`
 * nanoseconds an iteration (exp, tanh, ...: a loop can take longer than its streaming). */
CUVIL_LIB void cuvil_parallel_range(int64_t n, double bytes, double item_ns, cuvil_range_fn fn,
                                    const void *ctx) {
    if (n <= 0) return;
    const int threads = cuvil_num_threads_now();
    const double stream_ns = bytes / CUVIL_STREAM_BYTES_PER_NS, compute_ns = (double)n * item_ns;
    if (threads > 1 && n >= 2 * CUVIL_RANGE_GRANULE &&
        cuvil_parallel_worth(stream_ns > compute_ns ? stream_ns : compute_ns)) {
        cuvil_range_job j = {fn, ctx, n, 4 * (int64_t)threads};
        cuvil_parallel_for(j.ntasks, cuvil_range_task, &j);
        return;
    }
    fn(ctx, 0, n);
}

/* ---- loops over heavy steps --------------------------------------------------------------
 * fn(ctx, lo, hi) over [0, n) steps that each compute for about item_ns (a region of interest, an
 * output channel: few steps, much work each), as a few ranges per thread when the pool pays for
 * them, else at once.  Every step writes its own outputs, so results do not depend on the split. */
typedef struct cuvil_steps_job {
    cuvil_range_fn fn;
    const void *ctx;
    int64_t n, ntasks;
} cuvil_steps_job;

static void cuvil_steps_task(void *vctx, int64_t task, int tid) {
    const cuvil_steps_job *j = (const cuvil_steps_job *)vctx;
    (void)tid;
    int64_t lo, hi;
    cuvil_split(j->n, j->ntasks, task, &lo, &hi);
    if (lo < hi) j->fn(j->ctx, lo, hi);
}

CUVIL_LIB void cuvil_parallel_steps(int64_t n, double item_ns, cuvil_range_fn fn, const void *ctx) {
    const int threads = cuvil_num_threads_now();
    if (threads > 1 && n > 1 && cuvil_parallel_worth((double)n * item_ns)) {
        cuvil_steps_job j = {fn, ctx, n, n < 4 * (int64_t)threads ? n : 4 * (int64_t)threads};
        cuvil_parallel_for(j.ntasks, cuvil_steps_task, &j);
        return;
    }
    fn(ctx, 0, n);
}

/* ---- the model's shared state ------------------------------------------------------------ */

CUVIL_LIB int cuvil_shared_init(cuvil_shared *s, const unsigned char *weights, size_t size) {
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

CUVIL_LIB void cuvil_shared_destroy(cuvil_shared *s) {
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
    s->consts = NULL;
    for (int i = 0; i < CUVIL_ARENA_KEEP; i++) {
        free(s->arenas[i]);
        s->arenas[i] = NULL;
        s->arena_caps[i] = 0;
    }
#if CUVIL_HAVE_PTHREADS
    pthread_mutex_destroy(&s->cache_lock);
#endif
}

/* ---- arenas ------------------------------------------------------------------------------
 * A memory-planned call needs one arena for its intermediates.  Allocating it per call would
 * give a large one fresh pages every time (above glibc's mmap threshold, up to 32 MiB, malloc
 * maps and unmaps it, so each call faults its pages in again, and zeroes them); instead a model
 * keeps the arenas of finished calls and lends them to the next ones.  A call takes the smallest
 * kept arena that is large enough (a free one too small is replaced), and gives it back at its
 * end; one that finds none free (calls running at once) gets a new one.  So a model holds, between
 * calls, the arenas of its largest recent calls, as many as ran at once (at most
 * CUVIL_ARENA_KEEP): the memory its calls use anyway, freed by cuvil_unload. */
static void cuvil_arena_put(void *home, void *arena, size_t cap) {
    cuvil_shared *s = (cuvil_shared *)home;
#if CUVIL_HAVE_PTHREADS
    pthread_mutex_lock(&s->cache_lock);
#endif
    int slot = -1;
    for (int i = 0; i < CUVIL_ARENA_KEEP; i++)
        if (!s->arenas[i] && slot < 0) slot = i;
    if (slot < 0) { /* all kept: keep the larger, free the smallest */
        slot = 0;
        for (int i = 1; i < CUVIL_ARENA_KEEP; i++)
            if (s->arena_caps[i] < s->arena_caps[slot]) slot = i;
        if (s->arena_caps[slot] >= cap) slot = -1;
        else free(s->arenas[slot]);
    }
    if (slot >= 0) {
        s->arenas[slot] = arena;
        s->arena_caps[slot] = cap;
        arena = NULL;
    }
#if CUVIL_HAVE_PTHREADS
    pthread_mutex_unlock(&s->cache_lock);
#endif
    free(arena);
}

/* An arena of at least `bytes` (64-byte aligned, NOT zeroed) for call `c` of the model sharing
 * `s`, given back by cuvil_call_end; NULL when memory cannot be had. */
CUVIL_LIB void *cuvil_arena_get(cuvil_call *c, cuvil_shared *s, int64_t bytes) {
    if (bytes < 0 || (uint64_t)bytes > (uint64_t)(SIZE_MAX - CUVIL_ALIGN)) return NULL;
    const size_t need = bytes == 0 ? CUVIL_ALIGN : ((size_t)bytes + CUVIL_ALIGN - 1) / CUVIL_ALIGN * CUVIL_ALIGN;
    void *p = NULL, *small = NULL;
    size_t cap = 0;
#if CUVIL_HAVE_PTHREADS
    pthread_mutex_lock(&s->cache_lock);
#endif
    int best = -1, under = -1;
    for (int i = 0; i < CUVIL_ARENA_KEEP; i++) {
        if (!s->arenas[i]) continue;
        if (s->arena_caps[i] >= need) {
            if (best < 0 || s->arena_caps[i] < s->arena_caps[best]) best = i;
        } else if (under < 0) {
            under = i;
        }
    }
    if (best >= 0) {
        p = s->arenas[best];
        cap = s->arena_caps[best];
        s->arenas[best] = NULL;
    } else if (under >= 0) { /* too small for this call: replaced by the new one when it comes back */
        small = s->arenas[under];
        s->arenas[under] = NULL;
    }
#if CUVIL_HAVE_PTHREADS
    pthread_mutex_unlock(&s->cache_lock);
#endif
    free(small);
    if (!p) {
        p = aligned_alloc(CUVIL_ALIGN, need);
        if (!p) return NULL;
        cap = need;
    }
    c->arena = p;
    c->arena_cap = cap;
    c->arena_home = s;
    c->arena_put = cuvil_arena_put;
    return p;
}

/* Use n threads from now on (n - 1 workers are started here); 0, or -1 when threads cannot be had
 * (the model then stays single-threaded).  Not to be called while calls run on the model. */
CUVIL_LIB int cuvil_shared_set_threads(cuvil_shared *s, int n) {
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
CUVIL_LIB void cuvil_exec_enter(cuvil_exec *e, cuvil_shared *s) {
    e->shared = s;
    e->pool = NULL;
#if CUVIL_POOL
    if (pthread_mutex_trylock(&s->pool_lock) == 0) {
        if (s->pool) {
            e->pool = s->pool;
            atomic_store(&e->pool->calling, 1);
            atomic_store_explicit(&e->pool->caller_cpu, cuvil_this_cpu(), memory_order_relaxed);
            e->pool->warmed = e->pool->used_last || e->pool->wanted_last;
            e->pool->woke = e->pool->warmed && cuvil_pool_warm(e->pool);
            e->pool->used = 0;
            e->pool->wanted = 0;
            e->pool->stats.calls++;
        } else {
            pthread_mutex_unlock(&s->pool_lock);
        }
    }
#endif
    cuvil_cur_exec = e;
}

CUVIL_LIB void cuvil_exec_leave(cuvil_exec *e) {
#if CUVIL_POOL
    if (e->pool) {
        e->pool->used_last = e->pool->used;
        e->pool->wanted_last = e->pool->wanted;
        atomic_store(&e->pool->calling, 0);
        pthread_mutex_unlock(&e->shared->pool_lock);
    }
#endif
    e->pool = NULL;
    cuvil_cur_exec = NULL;
}

/* The pool's statistics and its cost model's current estimate of the end-of-region wait (all zero
 * without a pool); waits for a call holding the pool to leave it. */
CUVIL_LIB void cuvil_shared_thread_stats(cuvil_shared *s, cuvil_pool_stats *out, double *wait_estimate_ns) {
    memset(out, 0, sizeof *out);
    *wait_estimate_ns = 0.0;
#if CUVIL_POOL
    pthread_mutex_lock(&s->pool_lock);
    if (s->pool) {
        *out = s->pool->stats;
        *wait_estimate_ns = s->pool->wait_ns;
    }
    pthread_mutex_unlock(&s->pool_lock);
#else
    (void)s;
#endif
}

/* ---- the constant cache ------------------------------------------------------------------ */

static int cuvil_in_range(const void *p, size_t bytes, const void *base, size_t size) {
    const unsigned char *lo = (const unsigned char *)base, *c = (const unsigned char *)p;
    return lo && c >= lo && c <= lo + size && bytes <= (size_t)(lo + size - c);
}

/* Whether [p, p + bytes) lies in the model's weights (which no call writes) or in a constant
 * derived from them (cuvil_cache_get_constant: a weight widened to float32, say), so that a
 * kernel reading it may in turn cache what it derives from it (its packed form).  Not to be
 * called from a cache build function (the cache lock is held there). */
CUVIL_LIB int cuvil_is_constant(const void *p, size_t bytes) {
    const cuvil_exec *e = cuvil_cur_exec;
    if (!e || !e->shared) return 0;
    cuvil_shared *s = e->shared;
    if (cuvil_in_range(p, bytes, s->weights, s->size)) return 1;
    int found = 0;
#if CUVIL_CACHE
#if CUVIL_HAVE_PTHREADS
    pthread_mutex_lock(&s->cache_lock);
#endif
    for (const cuvil_cache_entry *c = s->consts; c && !found; c = c->next_const)
        found = cuvil_in_range(p, bytes, c->data, c->bytes);
#if CUVIL_HAVE_PTHREADS
    pthread_mutex_unlock(&s->cache_lock);
#endif
#endif
    return found;
}

static const void *cuvil_cache_lookup(const void *src, const int64_t *key, size_t bytes, cuvil_cache_build_fn build,
                                      const void *arg, int as_constant);

/* The buffer derived from the constant `src` identified by `key` (CUVIL_CACHE_KEY numbers):
 * built by build(dst, arg) into `bytes` bytes on first use, kept until the model is unloaded.
 * NULL when there is no cache (no call context, or no memory): the caller then derives it itself. */
CUVIL_LIB const void *cuvil_cache_get(const void *src, const int64_t *key, size_t bytes,
                                      cuvil_cache_build_fn build, const void *arg) {
    return cuvil_cache_lookup(src, key, bytes, build, arg, 0);
}

/* cuvil_cache_get, the result counting as a constant of the model from then on (cuvil_is_constant). */
CUVIL_LIB const void *cuvil_cache_get_constant(const void *src, const int64_t *key, size_t bytes,
                                               cuvil_cache_build_fn build, const void *arg) {
    return cuvil_cache_lookup(src, key, bytes, build, arg, 1);
}

static const void *cuvil_cache_lookup(const void *src, const int64_t *key, size_t bytes, cuvil_cache_build_fn build,
                                      const void *arg, int as_constant) {
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
            c->bytes = bytes;
            c->next = s->cache[b];
            s->cache[b] = c;
            c->next_const = NULL;
            if (as_constant) {
                c->next_const = s->consts;
                s->consts = c;
            }
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
    (void)src, (void)key, (void)bytes, (void)build, (void)arg, (void)as_constant;
    return NULL;
#endif
}

#endif /* CUVIL_LIB_BODY */

#endif /* CUVIL_THREADS_H */
