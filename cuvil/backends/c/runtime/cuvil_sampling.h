/* Cuvil's sampling runtime: grid_sample, roi_align and deform_conv (ONNX GridSample-22, RoiAlign-16,
 * DeformConv-22) in float64.
 *
 * The arithmetic is the reference's (cuvil/ops/sampling.py), one output position at a time:
 * each spatial axis gives the position up to four taps (a valid index and a weight; a tap that
 * zero padding drops is left out), and the channels are the weighted sums over every
 * combination of one tap per axis.  Output positions, regions and channels are independent
 * steps, shared out among the call's threads (cuvil_parallel_steps).
 */
#ifndef CUVIL_SAMPLING_H
#define CUVIL_SAMPLING_H

#include "cuvil_rt.h"
#include "cuvil_threads.h"

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

typedef struct cuvil_grid_job {
    const double *x, *grid;
    double *y;
    int64_t channels, in_plane, out_plane, stride[CUVIL_GRID_MAX_AXES];
    const int64_t *in_dims;
    int r, mode, padding, align;
} cuvil_grid_job;

/* Output positions [lo, hi) of all batches (position q: batch q / out_plane). */
static void cuvil_grid_range(const void *vctx, int64_t lo, int64_t hi) {
    const cuvil_grid_job *j = (const cuvil_grid_job *)vctx;
    const int r = j->r;
    int64_t off[2][CUVIL_GRID_MAX_COMBOS];
    double wt[2][CUVIL_GRID_MAX_COMBOS];
    for (int64_t q = lo; q < hi; q++) {
        const int64_t n = q / j->out_plane, p = q % j->out_plane;
        const double *g = j->grid + q * r;
        int ncombo = 1, cur = 0;
        off[0][0] = 0;
        wt[0][0] = 1.0;
        for (int d = 0; d < r; d++) { /* X's spatial axis d is the grid's component r-1-d */
            int64_t ti[4];
            double tw[4];
            const int nt = cuvil_grid_axis(g[r - 1 - d], j->in_dims[d], j->mode, j->padding, j->align, ti, tw);
            int m = 0;
            for (int a = 0; a < ncombo; a++) {
                for (int b = 0; b < nt; b++) {
                    off[1 - cur][m] = off[cur][a] + ti[b] * j->stride[d];
                    wt[1 - cur][m] = wt[cur][a] * tw[b];
                    m++;
                }
            }
            cur = 1 - cur;
            ncombo = m;
        }
        const int64_t *o = off[cur];
        const double *w = wt[cur];
        for (int64_t c = 0; c < j->channels; c++) {
            const double *xp = j->x + (n * j->channels + c) * j->in_plane;
            double acc = 0.0;
            for (int a = 0; a < ncombo; a++) acc += w[a] * xp[o[a]];
            j->y[(n * j->channels + c) * j->out_plane + p] = acc;
        }
    }
}

/* y[n, c, *out] from x[n, c, *in] and grid[n, *out, r]. */
static CUVIL_UNUSED void cuvil_grid_sample(const double *x, const double *grid, double *y, int64_t batch,
                                           int64_t channels, int r, const int64_t *in_dims,
                                           const int64_t *out_dims, int mode, int padding, int align) {
    cuvil_grid_job j = {x, grid, y, channels, 1, 1, {0}, in_dims, r, mode, padding, align};
    for (int d = r - 1; d >= 0; d--) {
        j.stride[d] = j.in_plane;
        j.in_plane *= in_dims[d];
    }
    for (int d = 0; d < r; d++) j.out_plane *= out_dims[d];
    const int taps = mode == CUVIL_GRID_NEAREST ? 1 : (mode == CUVIL_GRID_LINEAR ? 2 : 4);
    double per = (double)channels;
    for (int d = 0; d < r; d++) per *= (double)taps;
    cuvil_parallel_steps(batch * j.out_plane, per, cuvil_grid_range, &j);
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

typedef struct cuvil_roi_job {
    const double *x, *rois;
    const int64_t *batch;
    double *y, scale;
    int64_t channels, height, width, oh, ow, ratio;
    int half_pixel, use_max;
} cuvil_roi_job;

/* Regions [lo, hi). */
static void cuvil_roi_range(const void *vctx, int64_t lo, int64_t hi) {
    const cuvil_roi_job *j = (const cuvil_roi_job *)vctx;
    const double *x = j->x, *rois = j->rois, scale = j->scale;
    const int64_t *batch = j->batch;
    double *y = j->y;
    const int64_t channels = j->channels, height = j->height, width = j->width, oh = j->oh, ow = j->ow;
    const int64_t ratio = j->ratio;
    const int half_pixel = j->half_pixel, use_max = j->use_max;
    const double shift = half_pixel ? 0.5 : 0.0;
    for (int64_t r = lo; r < hi; r++) {
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
                    int64_t yi[2] = {0, 0};
                    double yw[2] = {0.0, 0.0};
                    const int y_in = cuvil_roi_axis(yy, height, yi, yw);
                    for (int64_t ix = 0; ix < gw; ix++) {
                        const double xx = x1 + (double)pw * bw + ((double)ix + 0.5) * bw / (double)gw;
                        int64_t xi[2] = {0, 0};
                        double xw[2] = {0.0, 0.0};
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

/* y[r, c, oh, ow] pooled from x[batch[r], c] over each roi (rois[r] = x1, y1, x2, y2); batch indices valid. */
static CUVIL_UNUSED void cuvil_roi_align(const double *x, const double *rois, const int64_t *batch, double *y,
                                         int64_t channels, int64_t height, int64_t width, int64_t nroi,
                                         int64_t oh, int64_t ow, int64_t ratio, double scale, int half_pixel,
                                         int use_max) {
    const cuvil_roi_job j = {x, rois, batch, y, scale, channels, height, width, oh, ow, ratio, half_pixel, use_max};
    const double samples = ratio > 0 ? (double)(ratio * ratio) : 4.0;
    cuvil_parallel_steps(nroi, (double)(channels * oh * ow) * samples * 4.0, cuvil_roi_range, &j);
}

typedef struct cuvil_deform_job {
    const double *x, *w, *off, *b, *mask;
    double *y, *cols;
    int64_t bn, ic, ih, iw, oc, kh, kw, oh, ow, group, offset_group;
    const int64_t *s, *p, *d;
} cuvil_deform_job;

/* The bilinear columns of input channels [lo, hi) of batch entry bn: cols[(c * taps + t) * plane + q]. */
static void cuvil_deform_columns(const void *vctx, int64_t lo, int64_t hi) {
    const cuvil_deform_job *j = (const cuvil_deform_job *)vctx;
    const int64_t taps = j->kh * j->kw, plane = j->oh * j->ow, icog = j->ic / j->offset_group;
    const int64_t ih = j->ih, iw = j->iw, bn = j->bn;
    for (int64_t c = lo; c < hi; c++) {
        const int64_t g = c / icog;
        const double *xc = j->x + (bn * j->ic + c) * ih * iw;
        for (int64_t t = 0; t < taps; t++) {
            const int64_t ki = t / j->kw, kj = t % j->kw;
            const double *oy = j->off + ((bn * j->offset_group + g) * taps * 2 + t * 2) * plane, *ox = oy + plane;
            const double *mk = j->mask ? j->mask + ((bn * j->offset_group + g) * taps + t) * plane : NULL;
            double *col = j->cols + (c * taps + t) * plane;
            for (int64_t i = 0; i < j->oh; i++) {
                for (int64_t jj = 0; jj < j->ow; jj++) {
                    const int64_t q = i * j->ow + jj;
                    const double hs = (double)(i * j->s[0] - j->p[0] + ki * j->d[0]) + oy[q];
                    const double ws = (double)(jj * j->s[1] - j->p[1] + kj * j->d[1]) + ox[q];
                    const double h0 = floor(hs), w0 = floor(ws);
                    double v = 0.0;
                    for (int a = 0; a < 2; a++) {
                        const double hi_ = h0 + (double)a;
                        if (!(hi_ >= 0.0 && hi_ < (double)ih)) continue;
                        for (int e = 0; e < 2; e++) {
                            const double wi = w0 + (double)e;
                            if (!(wi >= 0.0 && wi < (double)iw)) continue;
                            const double wt = (1.0 - fabs(hs - hi_)) * (1.0 - fabs(ws - wi));
                            v += wt * xc[(int64_t)hi_ * iw + (int64_t)wi];
                        }
                    }
                    col[q] = mk ? v * mk[q] : v;
                }
            }
        }
    }
}

/* Output channels [lo, hi) of batch entry bn: the grouped product of W with the columns, plus B. */
static void cuvil_deform_product(const void *vctx, int64_t lo, int64_t hi) {
    const cuvil_deform_job *j = (const cuvil_deform_job *)vctx;
    const int64_t taps = j->kh * j->kw, plane = j->oh * j->ow, icg = j->ic / j->group, ocg = j->oc / j->group;
    for (int64_t o = lo; o < hi; o++) {
        const int64_t g = o / ocg;
        double *yo = j->y + (j->bn * j->oc + o) * plane;
        for (int64_t q = 0; q < plane; q++) yo[q] = j->b ? j->b[o] : 0.0;
        for (int64_t k = 0; k < icg * taps; k++) {
            const double wv = j->w[o * icg * taps + k];
            const double *col = j->cols + (g * icg * taps + k) * plane;
            for (int64_t q = 0; q < plane; q++) yo[q] += wv * col[q];
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
    cuvil_deform_job j = {x, w, off, b, mask, y, cols, 0, ic, ih, iw, oc, kh, kw, oh, ow, group, offset_group, s, p, d};
    const double work = (double)(kh * kw * oh * ow);
    for (j.bn = 0; j.bn < n; j.bn++) {
        cuvil_parallel_steps(ic, work * 12.0, cuvil_deform_columns, &j);
        cuvil_parallel_steps(oc, work * (double)(ic / group), cuvil_deform_product, &j);
    }
}

#endif
