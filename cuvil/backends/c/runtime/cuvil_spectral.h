/* Cuvil's spectral runtime: dft and stft (ONNX DFT-20, STFT-17) as direct sums in float64.
 *
 * A transform of length n sums over the (at most n) input samples with twiddles from one table
 * of the n-th roots of unity (index j * k mod n, so every sum uses exactly rounded roots);
 * the cost is O(n) per output bin.  Signals are [outer, m, inner, comps] (comps 1: real,
 * 2: real and imaginary); spectra [outer, bins, inner, 2].
 */
#ifndef CUVIL_SPECTRAL_H
#define CUVIL_SPECTRAL_H

#include "cuvil_rt.h"

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

/* The complex transform: y[o, k, i] = scale * sum_{j < min(m, n)} x[o, j, i] e^(sign 2 pi i jk / n), k < bins. */
static CUVIL_UNUSED void cuvil_dft(const double *x, double *y, int64_t outer, int64_t m, int64_t inner, int comps,
                                   int64_t n, int64_t bins, int inverse, const double *cs) {
    const int64_t used = m < n ? m : n;
    const double sign = inverse ? 1.0 : -1.0, scale = inverse ? 1.0 / (double)n : 1.0;
    for (int64_t o = 0; o < outer; o++) {
        for (int64_t k = 0; k < bins; k++) {
            for (int64_t i = 0; i < inner; i++) {
                double re = 0.0, im = 0.0;
                int64_t t = 0; /* j * k mod n */
                for (int64_t j = 0; j < used; j++) {
                    const double *v = x + ((o * m + j) * inner + i) * comps;
                    const double c = cs[2 * t], s = sign * cs[2 * t + 1];
                    const double xr = v[0], xi = comps == 2 ? v[1] : 0.0;
                    re += xr * c - xi * s;
                    im += xr * s + xi * c;
                    t += k % n;
                    if (t >= n) t -= n;
                }
                double *out = y + ((o * bins + k) * inner + i) * 2;
                out[0] = re * scale;
                out[1] = im * scale;
            }
        }
    }
}

/* The inverse of a one-sided spectrum (NumPy's irfft): y[o, t, i] real, t < n, from bins k < m. */
static CUVIL_UNUSED void cuvil_irdft(const double *x, double *y, int64_t outer, int64_t m, int64_t inner, int comps,
                                     int64_t n, const double *cs) {
    const int64_t half = n / 2; /* bins 0..half are read; the rest are their mirror images */
    for (int64_t o = 0; o < outer; o++) {
        for (int64_t t = 0; t < n; t++) {
            for (int64_t i = 0; i < inner; i++) {
                double acc = m > 0 ? x[(o * m * inner + i) * comps] : 0.0;
                int64_t r = 0; /* k * t mod n */
                for (int64_t k = 1; k <= half && k < m; k++) {
                    r += t;
                    r %= n;
                    const double *v = x + ((o * m + k) * inner + i) * comps;
                    const double xr = v[0], xi = comps == 2 ? v[1] : 0.0;
                    if (2 * k == n) acc += xr * cs[2 * r]; /* the Nyquist bin counts once, its imaginary part not at all */
                    else acc += 2.0 * (xr * cs[2 * r] - xi * cs[2 * r + 1]);
                }
                y[(o * n + t) * inner + i] = acc / (double)n;
            }
        }
    }
}

/* y[b, f, k] (complex, k < bins): the transform of length n of frame f of x[b, length, comps], window w[size]. */
static CUVIL_UNUSED void cuvil_stft(const double *x, const double *w, double *y, int64_t batch, int64_t length,
                                    int comps, int64_t step, int64_t size, int64_t n, int64_t frames, int64_t bins,
                                    const double *cs) {
    const int64_t used = size < n ? size : n;
    for (int64_t b = 0; b < batch; b++) {
        for (int64_t f = 0; f < frames; f++) {
            for (int64_t k = 0; k < bins; k++) {
                double re = 0.0, im = 0.0;
                int64_t t = 0;
                for (int64_t j = 0; j < used; j++) {
                    const int64_t at = f * step + j;
                    if (at < length) {
                        const double *v = x + (b * length + at) * comps;
                        const double wj = w ? w[j] : 1.0;
                        const double xr = v[0] * wj, xi = comps == 2 ? v[1] * wj : 0.0;
                        const double c = cs[2 * t], s = -cs[2 * t + 1];
                        re += xr * c - xi * s;
                        im += xr * s + xi * c;
                    }
                    t += k % n;
                    if (t >= n) t -= n;
                }
                double *out = y + ((b * frames + f) * bins + k) * 2;
                out[0] = re;
                out[1] = im;
            }
        }
    }
}

#endif
