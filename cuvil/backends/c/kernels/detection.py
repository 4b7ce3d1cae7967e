"""Kernel of ``non_max_suppression``: runtime/cuvil_detection.h into a worst-case buffer, then the output.

The number of selected boxes is known only when the selection has run: the triples go to a
call-owned buffer with room for every box of every class, and the output is then sized to the
count and filled from it.
"""

from __future__ import annotations

from cuvil.backends.c.kernel import KernelCtx, kernel
from cuvil.backends.c.kernels.shape import set_output_shape


@kernel("non_max_suppression", computes_shape=True)
def _nms(k: KernelCtx) -> None:
    boxes, scores, y = k.inp(0), k.inp(1), k.out(0)
    w = k.w
    k.require(boxes.dim(2), "4", "boxes' last dim")
    k.require(scores.dim(0), boxes.dim(0), "batch sizes of scores and boxes")
    k.require(scores.dim(2), boxes.dim(1), "numbers of boxes in scores and boxes")
    nb, nc, nbox, limit, iou, sthr = (k.tmp(h) for h in ("batches", "classes", "nboxes", "limit", "iou", "score_thr"))
    w.line(f"const int64_t {nb} = {boxes.dim(0)}, {nc} = {scores.dim(1)}, {nbox} = {boxes.dim(1)};")
    w.line(f"int64_t {limit} = 0; float {iou} = 0.0f, {sthr} = 0.0f;")
    for pos, var in ((2, limit), (3, iou), (4, sthr)):
        if k.has(pos):
            v = k.inp(pos)
            w.line(f"if ({v.numel()} > 0) {var} = {v.load('0')};")
    w.line(f"if ({limit} < 0) {limit} = 0;")
    has_thr = f"({k.inp(4).numel()} > 0)" if k.has(4) else "0"
    per = k.tmp("per")
    w.line(f"const int64_t {per} = {limit} < {nbox} ? {limit} : {nbox};")
    k.include("cuvil_detection.h")
    buf = k.scratch("int64_t", f"{nb} * {nc} * {per} * 3 + 1", "nms_out")
    work = k.scratch("cuvil_scored", f"{nbox} + 1", "nms_work")
    chosen = k.scratch("int64_t", f"{nbox} + 1", "nms_chosen")
    cnt, i = k.tmp("count"), k.tmp("i")
    w.line(f"const int64_t {cnt} = cuvil_nms({boxes.ptr}, {scores.ptr}, {nb}, {nc}, {nbox}, {limit}, {has_thr}, "
           f"{sthr}, {iou}, {int(k.attrs['center_point_box'])}, {buf}, {work}, {chosen});")
    k.include("cuvil_index.h")
    set_output_shape(k, 0, [cnt, "3"])
    w.line(f"for (int64_t {i} = 0; {i} < {cnt} * 3; {i}++) {y.ptr}[{i}] = {buf}[{i}];")
    for scratch in (buf, work, chosen):
        k.release(scratch)
