/* Cuvil's resize runtime (ONNX Resize-19): separable nearest / N-linear / N-cubic interpolation.
 *
 * Exactly the reference's arithmetic (cuvil/ops/resize.py), in float64: for each resized axis,
 * each output position gets `ntaps` (input index, weight) pairs -- the nonzero entries of the
 * reference's dense [out, in] matrix, duplicates allowed where taps are clamped to the edge --
 * and the axes are applied one after another to a float64 copy of the data.
 */
#ifndef CUVIL_RESIZE_H
#define CUVIL_RESIZE_H

#include "cuvil_rt.h"

enum { CUVIL_RESIZE_NEAREST = 0, CUVIL_RESIZE_LINEAR = 1, CUVIL_RESIZE_CUBIC = 2 };
enum {
    CUVIL_NEAREST_ROUND_PREFER_FLOOR = 0,
    CUVIL_NEAREST_ROUND_PREFER_CEIL = 1,
    CUVIL_NEAREST_FLOOR = 2,
    CUVIL_NEAREST_CEIL = 3
};
enum {
    CUVIL_COORD_HALF_PIXEL = 0,
    CUVIL_COORD_HALF_PIXEL_SYMMETRIC = 1,
    CUVIL_COORD_PYTORCH_HALF_PIXEL = 2,
    CUVIL_COORD_ALIGN_CORNERS = 3,
    CUVIL_COORD_ASYMMETRIC = 4,
    CUVIL_COORD_TF_CROP_AND_RESIZE = 5,
    CUVIL_COORD_TF_HALF_PIXEL_FOR_NN = 6
};

typedef struct cuvil_resize_params {
    int mode, nearest_mode, coord, antialias, exclude_outside;
    double cubic_a;
} cuvil_resize_params;

/* The first tap offset j (taps run over j in [start, 1 - start]). */
static inline int64_t cuvil_resize_tap_start(const cuvil_resize_params *p, double scale) {
    if (p->mode == CUVIL_RESIZE_NEAREST) return 0;
    const double support = p->mode == CUVIL_RESIZE_LINEAR ? 1.0 : 2.0;
    const double stretch = p->antialias ? (scale < 1.0 ? scale : 1.0) : 1.0;
    return (int64_t)floor(-support / stretch) + 1;
}

/* Taps per output position. */
static CUVIL_UNUSED int64_t cuvil_resize_ntaps(const cuvil_resize_params *p, double scale) {
    return p->mode == CUVIL_RESIZE_NEAREST ? 1 : 2 - 2 * cuvil_resize_tap_start(p, scale);
}

/* Position in the input of output index y; *outside is set for tf_crop_and_resize extrapolation. */
static inline double cuvil_resize_coord(int coord, double y, int64_t out_len, int64_t in_len, double scale,
                                        double roi_start, double roi_end, int *outside) {
    const double width = scale * (double)in_len;
    const double in = (double)in_len;
    *outside = 0;
    switch (coord) {
    case CUVIL_COORD_HALF_PIXEL:
        return (y + 0.5) / scale - 0.5;
    case CUVIL_COORD_HALF_PIXEL_SYMMETRIC: {
        const double offset = in / 2 * (1 - (double)out_len / width);
        return offset + (y + 0.5) / scale - 0.5;
    }
    case CUVIL_COORD_PYTORCH_HALF_PIXEL:
        return width > 1 ? (y + 0.5) / scale - 0.5 : 0.0;
    case CUVIL_COORD_ALIGN_CORNERS:
        return width != 1 ? y * (in - 1) / (width - 1) : 0.0;
    case CUVIL_COORD_ASYMMETRIC:
        return y / scale;
    case CUVIL_COORD_TF_HALF_PIXEL_FOR_NN:
        return (y + 0.5) / scale;
    default: {
        double x;
        if (width != 1) {
            x = roi_start * (in - 1) + y * (roi_end - roi_start) * (in - 1) / (width - 1);
        } else {
            x = 0.5 * (roi_start + roi_end) * (in - 1);
        }
        *outside = x < 0 || x > in - 1;
        return x;
    }
    }
}

static inline double cuvil_resize_cubic(double t, double a) {
    t = fabs(t);
    if (t <= 1) return ((a + 2) * t - (a + 3)) * t * t + 1;
    if (t < 2) return ((a * t - 5 * a) * t + 8 * a) * t - 4 * a;
    return 0.0;
}

/* Fill idx/w [out_len * ntaps] and outside [out_len] for one axis. */
static CUVIL_UNUSED void cuvil_resize_taps(const cuvil_resize_params *p, int64_t out_len, int64_t in_len, double scale,
                                           double roi_start, double roi_end, int64_t ntaps, int64_t *idx, double *w,
                                           unsigned char *outside) {
    const int64_t start = cuvil_resize_tap_start(p, scale);
    const double stretch = p->antialias ? (scale < 1.0 ? scale : 1.0) : 1.0;
    for (int64_t o = 0; o < out_len; o++) {
        int out_flag;
        const double x = cuvil_resize_coord(p->coord, (double)o, out_len, in_len, scale, roi_start, roi_end, &out_flag);
        outside[o] = (unsigned char)out_flag;
        int64_t *ti = idx + o * ntaps;
        double *tw = w + o * ntaps;
        if (p->mode == CUVIL_RESIZE_NEAREST) {
            double r;
            switch (p->nearest_mode) {
            case CUVIL_NEAREST_ROUND_PREFER_FLOOR: r = ceil(x - 0.5); break;
            case CUVIL_NEAREST_ROUND_PREFER_CEIL: r = floor(x + 0.5); break;
            case CUVIL_NEAREST_FLOOR: r = floor(x); break;
            default: r = ceil(x); break;
            }
            /* clip in double first: x may be far outside int64 (or NaN, which clips to 0 here). */
            int64_t i = r >= (double)(in_len - 1) ? in_len - 1 : (r > 0 ? (int64_t)r : 0);
            ti[0] = i;
            tw[0] = 1.0;
            continue;
        }
        const double base = ceil(x) - 1;
        const double r = x - base;
        double total = 0.0;
        for (int64_t t = 0; t < ntaps; t++) {
            const double j = (double)(start + t);
            const double u = (j - r) * stretch;
            double c;
            if (p->mode == CUVIL_RESIZE_LINEAR) {
                c = 1 - fabs(u);
                c = c < 0 ? 0 : (c > 1 ? 1 : c);
            } else {
                c = cuvil_resize_cubic(u, p->cubic_a);
            }
            tw[t] = c;
            total += c;
        }
        if (p->antialias)
            for (int64_t t = 0; t < ntaps; t++) tw[t] /= total;
        const double b = base + (double)start;
        if (p->exclude_outside) {
            double kept = 0.0;
            for (int64_t t = 0; t < ntaps; t++) {
                const double i = b + (double)t;
                if (i < 0 || i >= (double)in_len) tw[t] = 0.0;
                kept += tw[t];
            }
            if (kept != 0.0)
                for (int64_t t = 0; t < ntaps; t++) tw[t] /= kept;
        }
        for (int64_t t = 0; t < ntaps; t++) {
            const double i = b + (double)t;
            ti[t] = i <= 0 ? 0 : (i >= (double)(in_len - 1) ? in_len - 1 : (int64_t)i);
        }
    }
}

/* out[outer, out_len, inner] = taps applied to in[outer, in_len, inner]; extrapolated positions get `extrap`. */
static CUVIL_UNUSED void cuvil_resize_apply(const double *in, double *out, int64_t outer, int64_t in_len,
                                            int64_t out_len, int64_t inner, int64_t ntaps, const int64_t *idx,
                                            const double *w, const unsigned char *outside, double extrap) {
    for (int64_t a = 0; a < outer; a++) {
        const double *src = in + a * in_len * inner;
        for (int64_t o = 0; o < out_len; o++) {
            double *restrict dst = out + (a * out_len + o) * inner;
            if (outside[o]) {
                for (int64_t i = 0; i < inner; i++) dst[i] = extrap;
                continue;
            }
            for (int64_t i = 0; i < inner; i++) dst[i] = 0.0;
            for (int64_t t = 0; t < ntaps; t++) {
                const double wt = w[o * ntaps + t];
                const double *restrict s = src + idx[o * ntaps + t] * inner;
                for (int64_t i = 0; i < inner; i++) dst[i] += wt * s[i];
            }
        }
    }
}

#endif /* CUVIL_RESIZE_H */
