/* Cuvil's sorting runtime: a stable merge sort of indices under a comparison with context, and
 * unique's grouping (ONNX Unique-11) on top of it.
 *
 * The comparison sees a context pointer (no global state: a model may run on many threads).
 */
#ifndef CUVIL_SORT_H
#define CUVIL_SORT_H

#include "cuvil_rt.h"

typedef int (*cuvil_cmp_fn)(const void *ctx, int64_t a, int64_t b);

/* Sorts v[0..n) stably by cmp (bottom-up merges through tmp, n entries). */
static CUVIL_UNUSED void cuvil_merge_sort(int64_t *v, int64_t *tmp, int64_t n, cuvil_cmp_fn cmp, const void *ctx) {
    int64_t *src = v, *dst = tmp;
    for (int64_t width = 1; width < n; width *= 2) {
        for (int64_t lo = 0; lo < n; lo += 2 * width) {
            const int64_t mid = lo + width < n ? lo + width : n, hi = lo + 2 * width < n ? lo + 2 * width : n;
            int64_t a = lo, b = mid, o = lo;
            while (a < mid && b < hi) dst[o++] = cmp(ctx, src[b], src[a]) < 0 ? src[b++] : src[a++];
            while (a < mid) dst[o++] = src[a++];
            while (b < hi) dst[o++] = src[b++];
        }
        int64_t *t = src;
        src = dst;
        dst = t;
    }
    if (src != v) memcpy(v, src, sizeof(int64_t) * (size_t)n);
}

static int cuvil_cmp_first(const void *ctx, int64_t a, int64_t b) {
    const int64_t *first = (const int64_t *)ctx;
    return first[a] < first[b] ? -1 : (first[a] > first[b] ? 1 : 0);
}

/* Groups the n items that cmp orders: first[g] (where group g first occurs), count[g], inverse[item] = g,
 * groups ascending (sorted) or by first occurrence.  perm, tmp, rank hold n entries each. Returns the
 * number of groups. */
static CUVIL_UNUSED int64_t cuvil_unique(int64_t n, cuvil_cmp_fn cmp, const void *ctx, int sorted, int64_t *first,
                                         int64_t *count, int64_t *inverse, int64_t *perm, int64_t *tmp,
                                         int64_t *rank) {
    for (int64_t i = 0; i < n; i++) perm[i] = i;
    cuvil_merge_sort(perm, tmp, n, cmp, ctx);
    int64_t g = -1;
    for (int64_t t = 0; t < n; t++) {
        if (t == 0 || cmp(ctx, perm[t - 1], perm[t]) != 0) {
            g++;
            first[g] = perm[t]; /* the sort is stable: a group's first item is its first occurrence */
            count[g] = 0;
        }
        count[g]++;
        inverse[perm[t]] = g;
    }
    const int64_t groups = g + 1;
    if (!sorted && groups > 1) {
        for (int64_t j = 0; j < groups; j++) perm[j] = j;
        cuvil_merge_sort(perm, tmp, groups, cuvil_cmp_first, first);
        for (int64_t j = 0; j < groups; j++) rank[perm[j]] = j;
        for (int64_t j = 0; j < groups; j++) tmp[j] = first[perm[j]];
        for (int64_t j = 0; j < groups; j++) first[j] = tmp[j];
        for (int64_t j = 0; j < groups; j++) tmp[j] = count[perm[j]];
        for (int64_t j = 0; j < groups; j++) count[j] = tmp[j];
        for (int64_t i = 0; i < n; i++) inverse[i] = rank[inverse[i]];
    }
    return groups;
}

#endif
