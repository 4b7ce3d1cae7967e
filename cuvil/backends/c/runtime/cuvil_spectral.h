/* Cuvil's spectral runtime: dft and stft (ONNX DFT-20, STFT-17) as direct sums in float64.
 *
 * A transform of length n sums over the (at most n) input samples with twiddles from one table
 * of the n-th roots of unity (index j * k mod n, so every sum uses exactly rounded roots);
 * the cost is O(n) per output bin, and the bins are shared out among the call's threads.  Signals are [outer, m, inner, comps] (comps 1: real,
 * 2: real and imaginary); spectra [outer, bins, inner, 2].
 */
#ifndef CUVIL_SPECTRAL_H
#define CUVIL_SPECTRAL_H

#include "cuvil_rt.h"
#include "cuvil_threads.h"

/* cs[2k], cs[2k + 1] = cos, sin of 2 pi k / n, for k in [0, n). */
static CUVIL_UNUSED void cuvil_roots(double *cs, int64_t n) {
    const double pi = 3.14159265358979323846;
    for (int64_t k = 0; 2 * k <= n; k++) {
        const double a = 2.0 * pi * (double)k / (double)n;
        cs[2 * k] = cos(a);
        cs[2 * k + 1] = sin(a);
        if (k > 0 && 2 * k < n) { /* the roots come in conjugate pairs: exactly so here */
            cs[2 * (n - k)] = cs[2 * k];
            cs[2 * (n - k) + 1] = -cs[2 * k + 1];
        }
    }
    if (n % 2 == 0) { /* the exact roots where the table has them */
        cs[n] = -1.0;
        cs[n + 1] = 0.0;
    }
    if (n % 4 == 0) {
        cs[n / 2] = 0.0;
        cs[n / 2 + 1] = 1.0;
        cs[3 * n / 2] = 0.0;
        cs[3 * n / 2 + 1] = -1.0;
    }
}

typedef struct cuvil_dft_job {
    const double *x, *w, *cs;
    double *y;
    int64_t outer, m, inner, n, bins, length, step, size, frames;
    int comps, inverse;
} cuvil_dft_job;

/* Bins of the complex transform, (o, k) pairs [lo, hi): y[o, k, i] = scale * sum_{j < min(m, n)} x[o, j, i]
 * e^(sign 2 pi i jk / n). */
static void cuvil_dft_range(const void *vctx, int64_t lo, int64_t hi) {
    const cuvil_dft_job *jb = (const cuvil_dft_job *)vctx;
    const int64_t m = jb->m, n = jb->n, inner = jb->inner, used = m < n ? m : n;
    const int comps = jb->comps;
    const double sign = jb->inverse ? 1.0 : -1.0, scale = jb->inverse ? 1.0 / (double)n : 1.0;
    for (int64_t ok = lo; ok < hi; ok++) {
        const int64_t o = ok / jb->bins, k = ok % jb->bins;
        for (int64_t i = 0; i < inner; i++) {
            double re = 0.0, im = 0.0;
            int64_t t = 0; /* j * k mod n */
            for (int64_t j = 0; j < used; j++) {
                const double *v = jb->x + ((o * m + j) * inner + i) * comps;
                const double c = jb->cs[2 * t], s = sign * jb->cs[2 * t + 1];
                const double xr = v[0], xi = comps == 2 ? v[1] : 0.0;
                re += xr * c - xi * s;
                im += xr * s + xi * c;
                t += k % n;
                if (t >= n) t -= n;
            }
            double *out = jb->y + (ok * inner + i) * 2;
            out[0] = re * scale;
            out[1] = im * scale;
        }
    }
}

/* The complex transform of x[outer, m, inner, comps] to y[outer, bins, inner, 2] (roots cs of order n). */
static CUVIL_UNUSED void cuvil_dft(const double *x, double *y, int64_t outer, int64_t m, int64_t inner, int comps,
                                   int64_t n, int64_t bins, int inverse, const double *cs) {
    const cuvil_dft_job jb = {x, NULL, cs, y, outer, m, inner, n, bins, 0, 0, 0, 0, comps, inverse};
    cuvil_parallel_steps(outer * bins, (double)(inner * (m < n ? m : n)) * 2.0, cuvil_dft_range, &jb);
}

/* Samples of the inverse of a one-sided spectrum (NumPy's irfft), (o, t) pairs [lo, hi). */
static void cuvil_irdft_range(const void *vctx, int64_t lo, int64_t hi) {
    const cuvil_dft_job *jb = (const cuvil_dft_job *)vctx;
    const int64_t m = jb->m, n = jb->n, inner = jb->inner, half = n / 2;
    const int comps = jb->comps;
    for (int64_t ot = lo; ot < hi; ot++) {
        const int64_t o = ot / n, t = ot % n;
        for (int64_t i = 0; i < inner; i++) {
            double acc = m > 0 ? jb->x[(o * m * inner + i) * comps] : 0.0;
            int64_t r = 0; /* k * t mod n */
            for (int64_t k = 1; k <= half && k < m; k++) {
                r += t;
                r %= n;
                const double *v = jb->x + ((o * m + k) * inner + i) * comps;
                const double xr = v[0], xi = comps == 2 ? v[1] : 0.0;
                if (2 * k == n) acc += xr * jb->cs[2 * r]; /* the Nyquist bin counts once, its imaginary part not at all */
                else acc += 2.0 * (xr * jb->cs[2 * r] - xi * jb->cs[2 * r + 1]);
            }
            jb->y[ot * inner + i] = acc / (double)n;
        }
    }
}

/* The inverse of a one-sided spectrum x[outer, m, inner, comps]: y[outer, n, inner] real (bins k < n/2 + 1 read). */
static CUVIL_UNUSED void cuvil_irdft(const double *x, double *y, int64_t outer, int64_t m, int64_t inner, int comps,
                                     int64_t n, const double *cs) {
    const cuvil_dft_job jb = {x, NULL, cs, y, outer, m, inner, n, n, 0, 0, 0, 0, comps, 1};
    cuvil_parallel_steps(outer * n, (double)(inner * (m < n / 2 + 1 ? m : n / 2 + 1)) * 2.0, cuvil_irdft_range, &jb);
}

/* Bins of the frames, (b, f) pairs [lo, hi). */
static void cuvil_stft_range(const void *vctx, int64_t lo, int64_t hi) {
    const cuvil_dft_job *jb = (const cuvil_dft_job *)vctx;
    const int64_t n = jb->n, used = jb->size < n ? jb->size : n;
    const int comps = jb->comps;
    for (int64_t bf = lo; bf < hi; bf++) {
        const int64_t b = bf / jb->frames, f = bf % jb->frames;
        for (int64_t k = 0; k < jb->bins; k++) {
            double re = 0.0, im = 0.0;
            int64_t t = 0;
            for (int64_t j = 0; j < used; j++) {
                const int64_t at = f * jb->step + j;
                if (at < jb->length) {
                    const double *v = jb->x + (b * jb->length + at) * comps;
                    const double wj = jb->w ? jb->w[j] : 1.0;
                    const double xr = v[0] * wj, xi = comps == 2 ? v[1] * wj : 0.0;
                    const double c = jb->cs[2 * t], s = -jb->cs[2 * t + 1];
                    re += xr * c - xi * s;
                    im += xr * s + xi * c;
                }
                t += k % n;
                if (t >= n) t -= n;
            }
            double *out = jb->y + (bf * jb->bins + k) * 2;
            out[0] = re;
            out[1] = im;
        }
    }
}

/* y[b, f, k] (complex, k < bins): the transform of length n of frame f of x[b, length, comps], window w[size]. */
static CUVIL_UNUSED void cuvil_stft(const double *x, const double *w, double *y, int64_t batch, int64_t length,
                                    int comps, int64_t step, int64_t size, int64_t n, int64_t frames, int64_t bins,
                                    const double *cs) {
    const cuvil_dft_job jb = {x, w, cs, y, 0, 0, 0, n, bins, length, step, size, frames, comps, 0};
    cuvil_parallel_steps(batch * frames, (double)(bins * (size < n ? size : n)) * 2.0, cuvil_stft_range, &jb);
}

#endif
