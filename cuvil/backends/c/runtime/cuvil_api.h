/* The C API of a model compiled by Cuvil.
 *
 *   char err[512];
 *   cuvil_model *m = cuvil_load("weights.bin", err, sizeof err);
 *   cuvil_tensor in[1] = {{data, {1, 3, 224, 224}, 4, CUVIL_F32}};
 *   cuvil_tensor out[1];
 *   if (cuvil_run(m, in, out, err, sizeof err) != 0) fprintf(stderr, "%s\n", err);
 *   ... use out[0].data, out[0].shape, out[0].rank ...
 *   cuvil_free(out[0].data);
 *   cuvil_unload(m);
 *
 * Inputs are checked (count is given by cuvil_num_inputs(); element type,
 * rank, static dims and symbol constraints) before anything runs; a failed
 * check returns non-zero with a message in err. Outputs are allocated by
 * cuvil_run and released with cuvil_free. Any number of threads may call
 * cuvil_run on one loaded model at once.
 *
 * A model runs single-threaded until cuvil_set_num_threads(m, n) gives it
 * n threads: n - 1 worker threads, started there and joined by cuvil_unload,
 * that split the large kernels (GEMM, convolution) of a call with the calling
 * thread. Results are bitwise the same for any n. One call at a time uses
 * the workers; a call made while another holds them runs single-threaded.
 * Constant weights are packed for the kernels once, on first use, and kept
 * until cuvil_unload: the weights must not change while the model is loaded.
 */
#ifndef CUVIL_API_H
#define CUVIL_API_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define CUVIL_MAX_RANK 8

enum cuvil_dtype {
    CUVIL_F64 = 0,
    CUVIL_F32 = 1,
    CUVIL_F16 = 2,
    CUVIL_BF16 = 3,
    CUVIL_I64 = 4,
    CUVIL_I32 = 5,
    CUVIL_I16 = 6,
    CUVIL_I8 = 7,
    CUVIL_U8 = 8,
    CUVIL_U16 = 9,
    CUVIL_U32 = 10,
    CUVIL_U64 = 11,
    CUVIL_BOOL = 12,
    /* low-bit storage types (cuvil_lowbit.h): one element a byte, the value in its low bits */
    CUVIL_I4 = 13,
    CUVIL_U4 = 14,
    CUVIL_I2 = 15,
    CUVIL_U2 = 16,
    CUVIL_F8E4M3FN = 17,
    CUVIL_F8E4M3FNUZ = 18,
    CUVIL_F8E5M2 = 19,
    CUVIL_F8E5M2FNUZ = 20,
    CUVIL_F4E2M1 = 21
};

typedef struct cuvil_tensor {
    void *data;
    int64_t shape[CUVIL_MAX_RANK];
    int32_t rank;
    int32_t dtype; /* enum cuvil_dtype */
} cuvil_tensor;

typedef struct cuvil_model cuvil_model;

#if defined(_WIN32)
#define CUVIL_EXPORT __declspec(dllexport)
#else
#define CUVIL_EXPORT __attribute__((visibility("default")))
#endif

/* Load the weights file written beside the library (NULL if the model has none). */
CUVIL_EXPORT cuvil_model *cuvil_load(const char *weights_path, char *err, size_t errlen);
/* Load from weights already in memory (the buffer must outlive the model). */
CUVIL_EXPORT cuvil_model *cuvil_load_from_memory(const void *weights, size_t size, char *err, size_t errlen);
CUVIL_EXPORT void cuvil_unload(cuvil_model *model);
/* Use n >= 1 threads per call from now on (1: no worker threads). Returns 0, or -1 with a message
 * in err (the model then runs single-threaded). Not to be called while cuvil_run runs on the model. */
CUVIL_EXPORT int cuvil_set_num_threads(cuvil_model *model, int n, char *err, size_t errlen);
CUVIL_EXPORT int cuvil_get_num_threads(const cuvil_model *model);
/* How calls split their kernels' work over the threads: 0 (the default) lets the cost model decide
 * region by region (a region too small, or workers recently slow to join, runs on the calling
 * thread); 1 splits every region that can be split, whatever its size and however slowly the
 * workers answer, so which regions run threaded does not depend on timing (for tests; slower for
 * small regions).  Returns 0, or -1 for a null model or an unknown policy.  Not to be called while
 * cuvil_run runs on the model. */
CUVIL_EXPORT int cuvil_set_split_policy(cuvil_model *model, int policy);
CUVIL_EXPORT int cuvil_get_split_policy(const cuvil_model *model);
/* What the model's worker threads did since cuvil_set_num_threads started them, for finding out why a
 * call did not run faster on more threads.  Writes the first n of these numbers to out and returns
 * how many there are (CUVIL_THREAD_STATS), or -1 for a null model:
 *   0 calls that had the worker threads (a call made while another has them runs alone);
 *   1 parallel regions (a kernel's work split into tasks) run on the threads;
 *   2 regions run on the calling thread alone because the cost model judged the split not worth
 *     its overhead: too little work, or workers recently slow to join (cores busy with other work);
 *   3 tasks of the regions run on the threads;  4 of those, the tasks workers ran (the caller ran
 *     the rest: few means the workers hardly got a core);
 *   5 nanoseconds callers waited for workers at the ends of regions;
 *   6 the cost model's current estimate of that wait per region, in nanoseconds.
 * All zero when the model runs one thread.  Waits for a call that has the threads to finish. */
#define CUVIL_THREAD_STATS 7
CUVIL_EXPORT int cuvil_get_thread_stats(const cuvil_model *model, int64_t *out, int n);
CUVIL_EXPORT int cuvil_num_inputs(void);
CUVIL_EXPORT int cuvil_num_outputs(void);
/* The library's own facts as JSON: {"target": ..., "inputs": [[dtype, rank], ...], "outputs": [...]}
 * (dtype as Cuvil names it: "f32", "i64" ...). A loader compares them with what it was told. */
CUVIL_EXPORT const char *cuvil_signature(void);
/* Limits for the next calls made on this thread (0: none): no loop runs more than
 * max_loop_iterations iterations, no value a loop builds holds more than max_output_bytes bytes;
 * a call that would pass one fails. Off until set. */
CUVIL_EXPORT void cuvil_set_run_limits(int64_t max_loop_iterations, int64_t max_output_bytes);
CUVIL_EXPORT int cuvil_run(const cuvil_model *model, const cuvil_tensor *inputs, cuvil_tensor *outputs, char *err,
                           size_t errlen);
CUVIL_EXPORT void cuvil_free(void *data);
/* For hosts that cannot call the C library's allocator themselves (WebAssembly). */
CUVIL_EXPORT void *cuvil_malloc(size_t size);

#ifdef __cplusplus
}
#endif
#endif /* CUVIL_API_H */
