/* Cuvil's sampling runtime: grid_sample and roi_align (ONNX GridSample-22, RoiAlign-16) in float64.
 *
 * The arithmetic is the reference's (cuvil/ops/sampling.py), one output position at a time:
 * each spatial axis gives the position up to four taps (a valid index and a weight; a tap that
 * zero padding drops is left out), and the channels are the weighted sums over every
 * combination of one tap per axis.
 */
#ifndef CUVIL_SAMPLING_H
#define CUVIL_SAMPLING_H

#include "cuvil_rt.h"

enum { CUVIL_GRID_NEAREST = 0, CUVIL_GRID_LINEAR = 1, CUVIL_GRID_CUBIC = 2 };
enum { CUVIL_PAD_ZEROS = 0, CUVIL_PAD_BORDER = 1, CUVIL_PAD_REFLECTION = 2 };
#define CUVIL_GRID_MAX_AXES 8
#define CUVIL_GRID_MAX_COMBOS 256 /* taps per axis ** axes: the emitter checks it */

/* c reflected at lo and hi until it lies between them (ONNX's _gs_reflect). */
static inline double cuvil_reflect(double c, double lo, double hi) {
    if (!(c < lo) && !(c > hi)) return c;
    double span = hi - lo;
    if (span < 1.0) span = 1.0; /* 0 only for a 1-pixel axis with align_corners */
    const int below = c < lo;
    const double dist = below ? lo - c : c - hi;
    const double n = floor(dist / span);
    const double rem = dist - n * span;
    const int even = fmod(n, 2.0) == 0.0;
    if (below) return even ? lo + rem : hi - rem;
    return even ? hi - rem : lo + rem;
}

/* The tap at integral position i of an axis of `size`: 0 when zero padding drops it, else 1 with *index set. */
static inline int cuvil_grid_tap(double i, int64_t size, int padding, double lo, double hi, int64_t *index) {
    if (padding == CUVIL_PAD_ZEROS) {
        if (!(i >= 0.0 && i < (double)size)) return 0;
        *index = (int64_t)i;
        return 1;
    }
    if (padding == CUVIL_PAD_REFLECTION) i = cuvil_reflect(i, lo, hi);
    i = fmin(fmax(i, 0.0), (double)(size - 1)); /* fmax also turns NaN into 0 */
    *index = (int64_t)i;
    return 1;
}

static inline void cuvil_cubic_weights(double t, double w[4]) {
    const double a = -0.75;
    const double s0 = t + 1.0, s3 = 2.0 - t, u = 1.0 - t;
    w[0] = ((a * s0 - 5.0 * a) * s0 + 8.0 * a) * s0 - 4.0 * a;
    w[1] = ((a + 2.0) * t - (a + 3.0)) * t * t + 1.0;
    w[2] = ((a + 2.0) * u - (a + 3.0)) * u * u + 1.0;
    w[3] = ((a * s3 - 5.0 * a) * s3 + 8.0 * a) * s3 - 4.0 * a;
}

/* The taps of one axis at normalized coordinate g; returns their number (dropped taps left out). */
static inline int cuvil_grid_axis(double g, int64_t size, int mode, int padding, int align, int64_t idx[4],
                                  double wt[4]) {
    const double sz = (double)size;
    const double lo = align ? 0.0 : -0.5, hi = align ? sz - 1.0 : sz - 0.5;
    double c = align ? (g + 1.0) / 2.0 * (sz - 1.0) : ((g + 1.0) * sz - 1.0) / 2.0;
    if (mode == CUVIL_GRID_NEAREST) c = nearbyint(c);
    if (c < lo || c > hi) {
        if (padding == CUVIL_PAD_BORDER) c = fmin(fmax(c, 0.0), sz - 1.0);
        else if (padding == CUVIL_PAD_REFLECTION) c = cuvil_reflect(c, lo, hi);
    }
    int n = 0;
    if (mode == CUVIL_GRID_NEAREST) {
        if (cuvil_grid_tap(c, size, padding, lo, hi, &idx[0])) wt[n++] = 1.0;
        return n;
    }
    const double f = floor(c), t = c - f;
    double w[4];
    int first, count;
    if (mode == CUVIL_GRID_LINEAR) {
        w[0] = 1.0 - t;
        w[1] = t;
        first = 0;
        count = 2;
    } else {
        cuvil_cubic_weights(t, w);
        first = -1;
        count = 4;
    }
    for (int k = 0; k < count; k++) {
        if (cuvil_grid_tap(f + (double)(first + k), size, padding, lo, hi, &idx[n])) wt[n++] = w[k];
    }
    return n;
}

/* y[n, c, *out] from x[n, c, *in] and grid[n, *out, r]. */
static CUVIL_UNUSED void cuvil_grid_sample(const double *x, const double *grid, double *y, int64_t batch,
                                           int64_t channels, int r, const int64_t *in_dims,
                                           const int64_t *out_dims, int mode, int padding, int align) {
    int64_t in_plane = 1, out_plane = 1, stride[CUVIL_GRID_MAX_AXES];
    for (int d = r - 1; d >= 0; d--) {
        stride[d] = in_plane;
        in_plane *= in_dims[d];
    }
    for (int d = 0; d < r; d++) out_plane *= out_dims[d];
    int64_t off[2][CUVIL_GRID_MAX_COMBOS];
    double wt[2][CUVIL_GRID_MAX_COMBOS];
    for (int64_t n = 0; n < batch; n++) {
        for (int64_t p = 0; p < out_plane; p++) {
            const double *g = grid + (n * out_plane + p) * r;
            int ncombo = 1, cur = 0;
            off[0][0] = 0;
            wt[0][0] = 1.0;
            for (int d = 0; d < r; d++) { /* X's spatial axis d is the grid's component r-1-d */
                int64_t ti[4];
                double tw[4];
                const int nt = cuvil_grid_axis(g[r - 1 - d], in_dims[d], mode, padding, align, ti, tw);
                int m = 0;
                for (int a = 0; a < ncombo; a++) {
                    for (int b = 0; b < nt; b++) {
                        off[1 - cur][m] = off[cur][a] + ti[b] * stride[d];
                        wt[1 - cur][m] = wt[cur][a] * tw[b];
                        m++;
                    }
                }
                cur = 1 - cur;
                ncombo = m;
            }
            const int64_t *o = off[cur];
            const double *w = wt[cur];
            for (int64_t c = 0; c < channels; c++) {
                const double *xp = x + (n * channels + c) * in_plane;
                double acc = 0.0;
                for (int a = 0; a < ncombo; a++) acc += w[a] * xp[o[a]];
                y[(n * channels + c) * out_plane + p] = acc;
            }
        }
    }
}

/* The two taps of one roi_align axis at sample coordinate c (ONNX's pre_calc_for_bilinear_interpolate);
 * 0 when the sample lies beyond one pixel outside the axis. */
static inline int cuvil_roi_axis(double c, int64_t size, int64_t idx[2], double wt[2]) {
    const double sz = (double)size;
    if (c < -1.0 || c > sz) return 0;
    if (c < 0.0) c = 0.0;
    double low = floor(c), high;
    if (low >= sz - 1.0) {
        low = high = sz - 1.0;
        c = low;
    } else {
        high = low + 1.0;
    }
    idx[0] = (int64_t)low;
    idx[1] = (int64_t)high;
    wt[1] = c - low;
    wt[0] = 1.0 - wt[1];
    return 1;
}

/* y[r, c, oh, ow] pooled from x[batch[r], c] over each roi (rois[r] = x1, y1, x2, y2); batch indices valid. */
static CUVIL_UNUSED void cuvil_roi_align(const double *x, const double *rois, const int64_t *batch, double *y,
                                         int64_t channels, int64_t height, int64_t width, int64_t nroi,
                                         int64_t oh, int64_t ow, int64_t ratio, double scale, int half_pixel,
                                         int use_max) {
    const double shift = half_pixel ? 0.5 : 0.0;
    for (int64_t r = 0; r < nroi; r++) {
        const double *box = rois + r * 4;
        const double x1 = box[0] * scale - shift, y1 = box[1] * scale - shift;
        const double x2 = box[2] * scale - shift, y2 = box[3] * scale - shift;
        double rw = x2 - x1, rh = y2 - y1;
        if (!half_pixel) {
            if (rw < 1.0) rw = 1.0;
            if (rh < 1.0) rh = 1.0;
        }
        const double bh = rh / (double)oh, bw = rw / (double)ow;
        int64_t gh = ratio > 0 ? ratio : (int64_t)ceil(rh / (double)oh);
        int64_t gw = ratio > 0 ? ratio : (int64_t)ceil(rw / (double)ow);
        if (gh < 0) gh = 0;
        if (gw < 0) gw = 0;
        const int64_t count = gh * gw > 1 ? gh * gw : 1;
        const double *xb = x + batch[r] * channels * height * width;
        double *yr = y + r * channels * oh * ow;
        for (int64_t ph = 0; ph < oh; ph++) {
            for (int64_t pw = 0; pw < ow; pw++) {
                const int64_t at = ph * ow + pw;
                for (int64_t c = 0; c < channels; c++) yr[c * oh * ow + at] = 0.0;
                int first = 1;
                for (int64_t iy = 0; iy < gh; iy++) {
                    const double yy = y1 + (double)ph * bh + ((double)iy + 0.5) * bh / (double)gh;
                    int64_t yi[2];
                    double yw[2];
                    const int y_in = cuvil_roi_axis(yy, height, yi, yw);
                    for (int64_t ix = 0; ix < gw; ix++) {
                        const double xx = x1 + (double)pw * bw + ((double)ix + 0.5) * bw / (double)gw;
                        int64_t xi[2];
                        double xw[2];
                        const int in = y_in && cuvil_roi_axis(xx, width, xi, xw);
                        int64_t pos[4] = {0, 0, 0, 0};
                        double w[4] = {0.0, 0.0, 0.0, 0.0};
                        if (in) {
                            for (int a = 0; a < 2; a++) {
                                for (int b = 0; b < 2; b++) {
                                    pos[a * 2 + b] = yi[a] * width + xi[b];
                                    w[a * 2 + b] = yw[a] * xw[b];
                                }
                            }
                        }
                        for (int64_t c = 0; c < channels; c++) {
                            const double *xp = xb + c * height * width;
                            double *out = &yr[c * oh * ow + at];
                            if (use_max) {
                                double v = 0.0;
                                if (in) {
                                    v = w[0] * xp[pos[0]];
                                    for (int q = 1; q < 4; q++) {
                                        const double u = w[q] * xp[pos[q]];
                                        if (u > v || u != u) v = u;
                                    }
                                }
                                if (first || v > *out || v != v) *out = v;
                            } else if (in) {
                                *out += w[0] * xp[pos[0]] + w[1] * xp[pos[1]] + w[2] * xp[pos[2]] + w[3] * xp[pos[3]];
                            }
                        }
                        first = 0;
                    }
                }
                if (!use_max) {
                    for (int64_t c = 0; c < channels; c++) yr[c * oh * ow + at] /= (double)count;
                }
            }
        }
    }
}

/* 2-D deformable convolution.  Geometry: stride, pad_begin, dilation per axis (s[0..1], p[0..1], d[0..1]);
 * b and mask may be NULL; cols holds (ic * kh * kw) x (oh * ow) values. */
static CUVIL_UNUSED void cuvil_deform_conv2d(const double *x, const double *w, const double *off, const double *b,
                                             const double *mask, double *y, int64_t n, int64_t ic, int64_t ih,
                                             int64_t iw, int64_t oc, int64_t kh, int64_t kw, int64_t oh, int64_t ow,
                                             int64_t group, int64_t offset_group, const int64_t *s, const int64_t *p,
                                             const int64_t *d, double *cols) {
    const int64_t taps = kh * kw, plane = oh * ow, icog = ic / offset_group, icg = ic / group, ocg = oc / group;
    for (int64_t bn = 0; bn < n; bn++) {
        for (int64_t c = 0; c < ic; c++) {
            const int64_t g = c / icog;
            const double *xc = x + (bn * ic + c) * ih * iw;
            for (int64_t t = 0; t < taps; t++) {
                const int64_t ki = t / kw, kj = t % kw;
                const double *oy = off + ((bn * offset_group + g) * taps * 2 + t * 2) * plane, *ox = oy + plane;
                const double *mk = mask ? mask + ((bn * offset_group + g) * taps + t) * plane : NULL;
                double *col = cols + (c * taps + t) * plane;
                for (int64_t i = 0; i < oh; i++) {
                    for (int64_t j = 0; j < ow; j++) {
                        const int64_t q = i * ow + j;
                        const double hs = (double)(i * s[0] - p[0] + ki * d[0]) + oy[q];
                        const double ws = (double)(j * s[1] - p[1] + kj * d[1]) + ox[q];
                        const double h0 = floor(hs), w0 = floor(ws);
                        double v = 0.0;
                        for (int a = 0; a < 2; a++) {
                            const double hi = h0 + (double)a;
                            if (!(hi >= 0.0 && hi < (double)ih)) continue;
                            for (int e = 0; e < 2; e++) {
                                const double wi = w0 + (double)e;
                                if (!(wi >= 0.0 && wi < (double)iw)) continue;
                                const double wt = (1.0 - fabs(hs - hi)) * (1.0 - fabs(ws - wi));
                                v += wt * xc[(int64_t)hi * iw + (int64_t)wi];
                            }
                        }
                        col[q] = mk ? v * mk[q] : v;
                    }
                }
            }
        }
        for (int64_t o = 0; o < oc; o++) {
            const int64_t g = o / ocg;
            double *yo = y + (bn * oc + o) * plane;
            for (int64_t q = 0; q < plane; q++) yo[q] = b ? b[o] : 0.0;
            for (int64_t k = 0; k < icg * taps; k++) {
                const double wv = w[o * icg * taps + k];
                const double *col = cols + (g * icg * taps + k) * plane;
                for (int64_t q = 0; q < plane; q++) yo[q] += wv * col[q];
            }
        }
    }
}

#endif
