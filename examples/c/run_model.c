/* Run a model compiled by Cuvil, from C, without Python.
 *
 * Build it against a saved artifact (`cuvil compile MODEL -t native -o ART`),
 * either linking the artifact's library:
 *
 *     cc -std=c11 -O2 -I ART examples/c/run_model.c ART/model.so -Wl,-rpath,"$PWD/ART" -o run_model
 *
 * or compiling the generated C into the program (flags: "rebuild" in ART/meta.json):
 *
 *     cc -std=c11 -O2 -ffp-contract=off -fno-math-errno -march=native -I ART \
 *        examples/c/run_model.c ART/model.c -lm -o run_model
 *
 * Usage:
 *
 *     run_model [-o OUTDIR] ART/weights.bin INPUT...
 *
 * Each INPUT is, in the model's input order, either a tensor file (format
 * below) or `random:DTYPE:DIMS[:SEED]`, e.g. `random:f32:1x3x224x224:7`:
 * seeded values in [-1, 1) (floats) or [-10, 10] (integers). The program
 * prints each output's element type, shape, sum and FNV-1a hash of its
 * bytes; with -o it also writes OUTDIR/input_K.ct and OUTDIR/output_K.ct.
 *
 * Tensor file (.ct), all little-endian:
 *     "CUVT"  uint32 dtype (enum cuvil_dtype)  uint32 rank  int64 shape[rank]  raw elements in C order
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuvil_api.h"

static const struct {
    const char *name;
    size_t size;
} DTYPES[] = {
    [CUVIL_F64] = {"f64", 8}, [CUVIL_F32] = {"f32", 4}, [CUVIL_F16] = {"f16", 2}, [CUVIL_BF16] = {"bf16", 2},
    [CUVIL_I64] = {"i64", 8}, [CUVIL_I32] = {"i32", 4}, [CUVIL_I16] = {"i16", 2}, [CUVIL_I8] = {"i8", 1},
    [CUVIL_U8] = {"u8", 1},   [CUVIL_U16] = {"u16", 2}, [CUVIL_U32] = {"u32", 4}, [CUVIL_U64] = {"u64", 8},
    [CUVIL_BOOL] = {"bool", 1},
};
#define N_DTYPES ((int)(sizeof DTYPES / sizeof DTYPES[0]))

static int64_t numel(const cuvil_tensor *t) {
    int64_t n = 1;
    for (int i = 0; i < t->rank; i++) n *= t->shape[i];
    return n;
}

static size_t nbytes(const cuvil_tensor *t) { return (size_t)numel(t) * DTYPES[t->dtype].size; }

/* ---- tensor files ----------------------------------------------------------------------- */

static int read_tensor(const char *path, cuvil_tensor *t) {
    FILE *f = fopen(path, "rb");
    if (!f) {
        fprintf(stderr, "run_model: cannot open %s: %s\n", path, strerror(errno));
        return -1;
    }
    char magic[4];
    uint32_t dtype = 0, rank = 0;
    int ok = fread(magic, 1, 4, f) == 4 && memcmp(magic, "CUVT", 4) == 0 && fread(&dtype, 4, 1, f) == 1 &&
             fread(&rank, 4, 1, f) == 1 && dtype < (uint32_t)N_DTYPES && rank <= CUVIL_MAX_RANK;
    memset(t, 0, sizeof *t);
    if (ok) {
        t->dtype = (int32_t)dtype;
        t->rank = (int32_t)rank;
        ok = rank == 0 || fread(t->shape, 8, rank, f) == rank;
        for (uint32_t i = 0; ok && i < rank; i++) ok = t->shape[i] >= 0;
    }
    if (ok) {
        size_t size = nbytes(t);
        t->data = malloc(size ? size : 1);
        ok = t->data && fread(t->data, 1, size, f) == size && fgetc(f) == EOF;
    }
    fclose(f);
    if (!ok) fprintf(stderr, "run_model: %s is not a valid tensor file\n", path);
    return ok ? 0 : -1;
}

static int write_tensor(const char *path, const cuvil_tensor *t) {
    FILE *f = fopen(path, "wb");
    uint32_t dtype = (uint32_t)t->dtype, rank = (uint32_t)t->rank;
    int ok = f && fwrite("CUVT", 1, 4, f) == 4 && fwrite(&dtype, 4, 1, f) == 1 && fwrite(&rank, 4, 1, f) == 1 &&
             (rank == 0 || fwrite(t->shape, 8, rank, f) == rank) && fwrite(t->data, 1, nbytes(t), f) == nbytes(t);
    if (f && fclose(f) != 0) ok = 0;
    if (!ok) fprintf(stderr, "run_model: cannot write %s\n", path);
    return ok ? 0 : -1;
}

/* ---- random inputs: random:DTYPE:DIMS[:SEED] ---------------------------------------------- */

static uint64_t xorshift64s(uint64_t *s) {
    uint64_t x = *s;
    x ^= x >> 12;
    x ^= x << 25;
    x ^= x >> 27;
    *s = x;
    return x * UINT64_C(0x2545F4914F6CDD1D);
}

static int random_tensor(const char *spec, cuvil_tensor *t) {
    char dtype[8] = {0};
    const char *p = spec + strlen("random:");
    const char *colon = strchr(p, ':');
    memset(t, 0, sizeof *t);
    if (!colon || colon - p >= (ptrdiff_t)sizeof dtype) goto bad;
    memcpy(dtype, p, (size_t)(colon - p));
    t->dtype = -1;
    for (int i = 0; i < N_DTYPES; i++)
        if (strcmp(dtype, DTYPES[i].name) == 0) t->dtype = i;
    if (t->dtype != CUVIL_F32 && t->dtype != CUVIL_F64 && t->dtype != CUVIL_I64 && t->dtype != CUVIL_I32) {
        fprintf(stderr, "run_model: %s: random inputs are f32, f64, i64 or i32; use a tensor file\n", spec);
        return -1;
    }
    p = colon + 1;
    if (*p != ':') { /* an empty DIMS is a scalar */
        for (;;) {
            char *end;
            long long d = strtoll(p, &end, 10);
            if (end == p || d < 0 || t->rank == CUVIL_MAX_RANK) goto bad;
            t->shape[t->rank++] = d;
            p = end;
            if (*p != 'x') break;
            p++;
        }
    }
    uint64_t seed = 0;
    if (*p == ':') {
        char *end;
        seed = strtoull(p + 1, &end, 10);
        if (end == p + 1) goto bad;
        p = end;
    }
    if (*p != '\0') goto bad;
    uint64_t state = seed * UINT64_C(0x9E3779B97F4A7C15) + UINT64_C(0x632BE59BD9B4E019);
    int64_t n = numel(t);
    t->data = malloc(nbytes(t) ? nbytes(t) : 1);
    if (!t->data) return -1;
    for (int64_t i = 0; i < n; i++) {
        uint64_t r = xorshift64s(&state);
        double u = (double)(r >> 11) * (1.0 / 9007199254740992.0) * 2.0 - 1.0; /* [-1, 1) */
        int64_t k = (int64_t)(r % 21) - 10;                                       /* [-10, 10] */
        switch (t->dtype) {
        case CUVIL_F32: ((float *)t->data)[i] = (float)u; break;
        case CUVIL_F64: ((double *)t->data)[i] = u; break;
        case CUVIL_I64: ((int64_t *)t->data)[i] = k; break;
        default: ((int32_t *)t->data)[i] = (int32_t)k; break;
        }
    }
    return 0;
bad:
    fprintf(stderr, "run_model: bad random input %s (want random:DTYPE:DIMS[:SEED], e.g. random:f32:1x3x32x32:7)\n",
            spec);
    return -1;
}

/* ---- summary ------------------------------------------------------------------------------ */

static double element(const cuvil_tensor *t, int64_t i) {
    const void *d = t->data;
    switch (t->dtype) {
    case CUVIL_F64: return ((const double *)d)[i];
    case CUVIL_F32: return ((const float *)d)[i];
    case CUVIL_I64: return (double)((const int64_t *)d)[i];
    case CUVIL_I32: return ((const int32_t *)d)[i];
    case CUVIL_I16: return ((const int16_t *)d)[i];
    case CUVIL_I8: return ((const int8_t *)d)[i];
    case CUVIL_U8: case CUVIL_BOOL: return ((const uint8_t *)d)[i];
    case CUVIL_U16: return ((const uint16_t *)d)[i];
    case CUVIL_U32: return ((const uint32_t *)d)[i];
    case CUVIL_U64: return (double)((const uint64_t *)d)[i];
    default: return 0.0; /* f16 / bf16: the hash still covers them */
    }
}

static void summarize(const char *what, int k, const cuvil_tensor *t) {
    uint64_t h = UINT64_C(0xcbf29ce484222325);
    const unsigned char *b = (const unsigned char *)t->data;
    for (size_t i = 0; i < nbytes(t); i++) h = (h ^ b[i]) * UINT64_C(0x100000001b3);
    double sum = 0.0;
    for (int64_t i = 0; i < numel(t); i++) sum += element(t, i);
    printf("%s %d: %s [", what, k, DTYPES[t->dtype].name);
    for (int i = 0; i < t->rank; i++) printf(i ? ", %" PRId64 : "%" PRId64, t->shape[i]);
    printf("] sum %.9g fnv1a %016" PRIx64 "\n", sum, h);
}

int main(int argc, char **argv) {
    const char *outdir = NULL;
    int a = 1;
    if (a + 1 < argc && strcmp(argv[a], "-o") == 0) {
        outdir = argv[a + 1];
        a += 2;
    }
    if (argc - a < 1) {
        fprintf(stderr, "usage: %s [-o OUTDIR] WEIGHTS INPUT...  (INPUT: a .ct file or random:DTYPE:DIMS[:SEED])\n",
                argv[0]);
        return 2;
    }
    const char *weights = argv[a++];
    int n_in = cuvil_num_inputs(), n_out = cuvil_num_outputs();
    if (argc - a != n_in) {
        fprintf(stderr, "run_model: the model takes %d inputs, %d given\n", n_in, argc - a);
        return 2;
    }
    cuvil_tensor *in = calloc((size_t)n_in + 1, sizeof *in);
    cuvil_tensor *out = calloc((size_t)n_out + 1, sizeof *out);
    char err[1024], path[4096];
    int rc = 1, n_read = 0;
    cuvil_model *m = NULL;
    if (!in || !out) goto done;
    for (; n_read < n_in; n_read++) {
        const char *arg = argv[a + n_read];
        int r = strncmp(arg, "random:", 7) == 0 ? random_tensor(arg, &in[n_read]) : read_tensor(arg, &in[n_read]);
        if (r != 0) {
            free(in[n_read].data);
            goto done;
        }
    }
    m = cuvil_load(weights, err, sizeof err);
    if (!m) {
        fprintf(stderr, "run_model: cannot load the model: %s\n", err);
        goto done;
    }
    if (cuvil_run(m, in, out, err, sizeof err) != 0) {
        fprintf(stderr, "run_model: %s\n", err);
        goto done;
    }
    rc = 0;
    for (int k = 0; k < n_out; k++) {
        summarize("output", k, &out[k]);
        if (outdir) {
            snprintf(path, sizeof path, "%s/output_%d.ct", outdir, k);
            if (write_tensor(path, &out[k]) != 0) rc = 1;
        }
        cuvil_free(out[k].data);
    }
    for (int k = 0; outdir && k < n_in; k++) {
        snprintf(path, sizeof path, "%s/input_%d.ct", outdir, k);
        if (write_tensor(path, &in[k]) != 0) rc = 1;
    }
done:
    for (int k = 0; k < n_read; k++) free(in[k].data);
    cuvil_unload(m);
    free(in);
    free(out);
    return rc;
}
