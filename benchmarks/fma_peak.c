/* fma_peak.c: the machine's measured single-precision FMA peak, in GFLOP/s.
 *
 * Usage: fma_peak THREADS SECONDS [REPEATS]
 * Prints one line per instruction set it was built with ("avx512 2 123.4", "avx2 2 120.1"):
 * the ISA, the thread count and the GFLOP/s (one FMA = 2 FLOPs per lane) over all threads,
 * the best of REPEATS (default 3) measurements of SECONDS each: a peak is what the machine can
 * sustain, and on a shared machine a single measurement may land on a busy moment.
 *
 * Each thread runs a loop that only issues independent FMAs into many accumulators:
 * 16 zmm accumulators for AVX-512, 12 ymm for AVX2 (the rest of the register file holds the
 * two operands), which covers FMA latency x throughput on current x86 cores (4-5 cycles x 2 ports).
 * acc = acc * a + b with a = 0.999999, b = 1e-6 converges to 1: no overflow, no denormals.
 * The accumulators are summed and printed to stderr, so the compiler cannot drop the loop, and
 * FMA intrinsics are never reassociated without -ffast-math.  Each measurement runs after a
 * warm-up of the same length, so the cores have reached their sustained clock.
 *
 * Build: cc -O2 -march=native -pthread fma_peak.c -o fma_peak
 */
#define _POSIX_C_SOURCE 200809L
#include <immintrin.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#define INNER 1024 /* FMAs per accumulator between two checks of the clock */

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

typedef struct {
    int isa; /* 512 or 256 */
    double seconds;
    float seed;   /* from the command line's thread count: not a compile-time constant */
    double flops; /* out */
    float sink;   /* out */
} job;

#if defined(__AVX512F__)
static void run512(job *j) {
    const __m512 a = _mm512_set1_ps(0.999999f), b = _mm512_set1_ps(1e-6f);
    /* distinct starting values known only at run time: equal ones would let the compiler merge the chains */
#define START(i) _mm512_set1_ps(j->seed * (float)(i + 1))
    __m512 c0 = START(0), c1 = START(1), c2 = START(2), c3 = START(3), c4 = START(4), c5 = START(5);
    __m512 c6 = START(6), c7 = START(7), c8 = START(8), c9 = START(9), c10 = START(10), c11 = START(11);
    __m512 c12 = START(12), c13 = START(13), c14 = START(14), c15 = START(15);
#undef START
    uint64_t blocks = 0;
    const double end = now() + j->seconds;
    do {
        for (int i = 0; i < INNER; i++) {
            c0 = _mm512_fmadd_ps(c0, a, b); c1 = _mm512_fmadd_ps(c1, a, b);
            c2 = _mm512_fmadd_ps(c2, a, b); c3 = _mm512_fmadd_ps(c3, a, b);
            c4 = _mm512_fmadd_ps(c4, a, b); c5 = _mm512_fmadd_ps(c5, a, b);
            c6 = _mm512_fmadd_ps(c6, a, b); c7 = _mm512_fmadd_ps(c7, a, b);
            c8 = _mm512_fmadd_ps(c8, a, b); c9 = _mm512_fmadd_ps(c9, a, b);
            c10 = _mm512_fmadd_ps(c10, a, b); c11 = _mm512_fmadd_ps(c11, a, b);
            c12 = _mm512_fmadd_ps(c12, a, b); c13 = _mm512_fmadd_ps(c13, a, b);
            c14 = _mm512_fmadd_ps(c14, a, b); c15 = _mm512_fmadd_ps(c15, a, b);
        }
        blocks++;
    } while (now() < end);
    __m512 s = _mm512_add_ps(_mm512_add_ps(_mm512_add_ps(c0, c1), _mm512_add_ps(c2, c3)),
                             _mm512_add_ps(_mm512_add_ps(c4, c5), _mm512_add_ps(c6, c7)));
    s = _mm512_add_ps(s, _mm512_add_ps(_mm512_add_ps(_mm512_add_ps(c8, c9), _mm512_add_ps(c10, c11)),
                                       _mm512_add_ps(_mm512_add_ps(c12, c13), _mm512_add_ps(c14, c15))));
    j->sink = _mm512_reduce_add_ps(s);
    j->flops = (double)blocks * INNER * 16 /* accumulators */ * 16 /* lanes */ * 2;
}
#endif

#if defined(__FMA__)
static void run256(job *j) {
    const __m256 a = _mm256_set1_ps(0.999999f), b = _mm256_set1_ps(1e-6f);
#define START(i) _mm256_set1_ps(j->seed * (float)(i + 1))
    __m256 c0 = START(0), c1 = START(1), c2 = START(2), c3 = START(3), c4 = START(4), c5 = START(5);
    __m256 c6 = START(6), c7 = START(7), c8 = START(8), c9 = START(9), c10 = START(10), c11 = START(11);
#undef START
    uint64_t blocks = 0;
    const double end = now() + j->seconds;
    do {
        for (int i = 0; i < INNER; i++) {
            c0 = _mm256_fmadd_ps(c0, a, b); c1 = _mm256_fmadd_ps(c1, a, b);
            c2 = _mm256_fmadd_ps(c2, a, b); c3 = _mm256_fmadd_ps(c3, a, b);
            c4 = _mm256_fmadd_ps(c4, a, b); c5 = _mm256_fmadd_ps(c5, a, b);
            c6 = _mm256_fmadd_ps(c6, a, b); c7 = _mm256_fmadd_ps(c7, a, b);
            c8 = _mm256_fmadd_ps(c8, a, b); c9 = _mm256_fmadd_ps(c9, a, b);
            c10 = _mm256_fmadd_ps(c10, a, b); c11 = _mm256_fmadd_ps(c11, a, b);
        }
        blocks++;
    } while (now() < end);
    __m256 s = _mm256_add_ps(_mm256_add_ps(_mm256_add_ps(c0, c1), _mm256_add_ps(c2, c3)),
                             _mm256_add_ps(_mm256_add_ps(c4, c5), _mm256_add_ps(c6, c7)));
    s = _mm256_add_ps(s, _mm256_add_ps(_mm256_add_ps(c8, c9), _mm256_add_ps(c10, c11)));
    float lanes[8];
    _mm256_storeu_ps(lanes, s);
    j->sink = lanes[0] + lanes[1] + lanes[2] + lanes[3] + lanes[4] + lanes[5] + lanes[6] + lanes[7];
    j->flops = (double)blocks * INNER * 12 /* accumulators */ * 8 /* lanes */ * 2;
}
#endif

static void *worker(void *arg) {
    job *j = arg;
#if defined(__AVX512F__)
    if (j->isa == 512) run512(j);
#endif
#if defined(__FMA__)
    if (j->isa == 256) run256(j);
#endif
    return NULL;
}

/* GFLOP/s of `threads` threads each issuing FMAs of the given width for `seconds`. */
static double measure(int isa, int threads, double seconds) {
    pthread_t tid[256];
    job jobs[256];
    for (int i = 0; i < threads; i++) jobs[i] = (job){isa, seconds, 1e-3f * (float)(threads + i), 0.0, 0.0f};
    const double t0 = now();
    for (int i = 0; i < threads; i++)
        if (pthread_create(&tid[i], NULL, worker, &jobs[i])) {
            perror("pthread_create");
            exit(1);
        }
    double flops = 0.0;
    float sink = 0.0f;
    for (int i = 0; i < threads; i++) {
        pthread_join(tid[i], NULL);
        flops += jobs[i].flops;
        sink += jobs[i].sink;
    }
    const double dt = now() - t0;
    fprintf(stderr, "checksum %g\n", (double)sink);
    return flops / dt / 1e9;
}

int main(int argc, char **argv) {
    if (argc != 3 && argc != 4) {
        fprintf(stderr, "usage: %s THREADS SECONDS [REPEATS]\n", argv[0]);
        return 2;
    }
    const int threads = atoi(argv[1]);
    const double seconds = atof(argv[2]);
    const int repeats = argc == 4 ? atoi(argv[3]) : 3;
    if (threads < 1 || threads > 256 || !(seconds > 0.0) || repeats < 1) {
        fprintf(stderr, "THREADS must be 1..256, SECONDS and REPEATS positive\n");
        return 2;
    }
    int isas[2], n = 0;
#if defined(__AVX512F__)
    isas[n++] = 512;
#endif
#if defined(__FMA__)
    isas[n++] = 256;
#endif
    if (n == 0) {
        fprintf(stderr, "built without AVX-512F or FMA: nothing to measure\n");
        return 1;
    }
    for (int i = 0; i < n; i++) {
        measure(isas[i], threads, seconds); /* warm-up: let the clock settle */
        double best = 0.0;
        for (int r = 0; r < repeats; r++) {
            const double g = measure(isas[i], threads, seconds);
            if (g > best) best = g;
        }
        printf("%s %d %.2f\n", isas[i] == 512 ? "avx512" : "avx2", threads, best);
    }
    return 0;
}
