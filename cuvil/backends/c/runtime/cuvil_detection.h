/* Cuvil's detection runtime: non_max_suppression (ONNX NonMaxSuppression-11).
 *
 * Float32 geometry in the order of ONNX's reference (cuvil/ops/detection.py), so an IoU equal to
 * the threshold compares the same on every target (the generated code never contracts a * b + c).
 */
#ifndef CUVIL_DETECTION_H
#define CUVIL_DETECTION_H

#include "cuvil_rt.h"

typedef struct cuvil_scored {
    float score;
    int64_t index;
} cuvil_scored;

/* Decreasing score, then increasing index. */
static int cuvil_scored_cmp(const void *pa, const void *pb) {
    const cuvil_scored *a = (const cuvil_scored *)pa, *b = (const cuvil_scored *)pb;
    if (a->score > b->score) return -1;
    if (a->score < b->score) return 1;
    return a->index < b->index ? -1 : (a->index > b->index ? 1 : 0);
}

static inline void cuvil_box_corners(const float *b, int center, float c[4]) { /* x_min, x_max, y_min, y_max */
    if (center) {
        const float hw = b[2] / 2.0f, hh = b[3] / 2.0f;
        c[0] = b[0] - hw;
        c[1] = b[0] + hw;
        c[2] = b[1] - hh;
        c[3] = b[1] + hh;
    } else {
        c[0] = b[1] <= b[3] ? b[1] : b[3];
        c[1] = b[1] <= b[3] ? b[3] : b[1];
        c[2] = b[0] <= b[2] ? b[0] : b[2];
        c[3] = b[0] <= b[2] ? b[2] : b[0];
    }
}

static inline int cuvil_box_suppresses(const float *a, const float *b, int center, float threshold) {
    float p[4], q[4];
    cuvil_box_corners(a, center, p);
    cuvil_box_corners(b, center, q);
    const float ix0 = p[0] >= q[0] ? p[0] : q[0], ix1 = p[1] <= q[1] ? p[1] : q[1];
    if (ix1 <= ix0) return 0;
    const float iy0 = p[2] >= q[2] ? p[2] : q[2], iy1 = p[3] <= q[3] ? p[3] : q[3];
    if (iy1 <= iy0) return 0;
    const float inter = (ix1 - ix0) * (iy1 - iy0);
    const float area_a = (p[1] - p[0]) * (p[3] - p[2]), area_b = (q[1] - q[0]) * (q[3] - q[2]);
    const float uni = area_a + area_b - inter;
    if (inter <= 0.0f || area_a <= 0.0f || area_b <= 0.0f || uni <= 0.0f) return 0;
    return inter / uni > threshold;
}

/* Writes the selected (batch, class, box) triples to out (room for batches * classes * min(limit, nboxes));
 * returns their number.  work and chosen hold nboxes entries each. */
static CUVIL_UNUSED int64_t cuvil_nms(const float *boxes, const float *scores, int64_t batches, int64_t classes,
                                      int64_t nboxes, int64_t limit, int has_score_threshold, float score_threshold,
                                      float iou_threshold, int center, int64_t *out, cuvil_scored *work,
                                      int64_t *chosen) {
    int64_t count = 0;
    for (int64_t b = 0; b < batches; b++) {
        const float *bb = boxes + b * nboxes * 4;
        for (int64_t c = 0; c < classes; c++) {
            const float *s = scores + (b * classes + c) * nboxes;
            int64_t m = 0;
            for (int64_t i = 0; i < nboxes; i++) {
                if (!has_score_threshold || s[i] > score_threshold) {
                    work[m].score = s[i];
                    work[m].index = i;
                    m++;
                }
            }
            if (m > 1) qsort(work, (size_t)m, sizeof(cuvil_scored), cuvil_scored_cmp);
            int64_t n = 0;
            for (int64_t t = 0; t < m && n < limit; t++) {
                const int64_t i = work[t].index;
                int keep = 1;
                for (int64_t u = 0; u < n && keep; u++) {
                    if (cuvil_box_suppresses(bb + i * 4, bb + chosen[u] * 4, center, iou_threshold)) keep = 0;
                }
                if (keep) {
                    chosen[n++] = i;
                    out[count * 3] = b;
                    out[count * 3 + 1] = c;
                    out[count * 3 + 2] = i;
                    count++;
                }
            }
        }
    }
    return count;
}

#endif
