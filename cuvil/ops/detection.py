"""``non_max_suppression`` (ONNX NonMaxSuppression-11): greedy selection of boxes per batch and class.

Boxes ``[batches, boxes, 4]`` are corners ``[y1, x1, y2, x2]`` (either diagonal) or, with
``center_point_box=1``, ``[x_center, y_center, width, height]``; scores are
``[batches, classes, boxes]``.  For every batch and class, the boxes scoring above
``score_threshold`` (all of them when it is absent) are visited by decreasing score (ties: lower
index first); a box is selected unless its IoU with an already selected box of that class exceeds
``iou_threshold`` (default 0), until ``max_output_boxes_per_class`` (default 0: none) are
selected.  The output ``[selected, 3]`` lists ``(batch, class, box)`` in that order; its length
is known only at run time.  The geometry is float32 arithmetic in ONNX's reference's order, so
an IoU that equals the threshold compares the same everywhere.
"""

from __future__ import annotations

import numpy as np

from cuvil.ir.dtypes import DType
from cuvil.ir.symbolic import UNKNOWN
from cuvil.ir.types import TensorType
from cuvil.ops.registry import AttrSpec, InferCtx, OpDef, RefCtx, register


def _infer(ctx: InferCtx) -> list[TensorType]:
    boxes, scores = ctx.type(0), ctx.type(1)
    ctx.require_dtype(0, {DType.f32})
    ctx.require_dtype(1, {DType.f32})
    if ctx.attrs["center_point_box"] not in (0, 1):
        raise ctx.fail(f"center_point_box must be 0 or 1, got {ctx.attrs['center_point_box']}")
    if boxes.rank != 3 or scores.rank != 3:
        raise ctx.fail(f"boxes must be [batches, boxes, 4] and scores [batches, classes, boxes], got {boxes}, {scores}")
    ctx.assume_equal(boxes.shape[2], 4, "boxes' last dim and 4")
    ctx.assume_equal(scores.shape[0], boxes.shape[0], "batch sizes of boxes and scores")
    ctx.assume_equal(scores.shape[2], boxes.shape[1], "numbers of boxes in boxes and scores")
    for i, what, dt in ((2, "max_output_boxes_per_class", {DType.i64}), (3, "iou_threshold", {DType.f32}),
                        (4, "score_threshold", {DType.f32})):
        if ctx.has(i):
            ctx.require_dtype(i, dt)
            if ctx.type(i).rank > 1:
                raise ctx.fail(f"{what} must be a scalar or one-element 1-D tensor, got {ctx.type(i)}")
    return [TensorType(DType.i64, (UNKNOWN, 3))]


def _corners(box: np.ndarray, center: bool) -> tuple[np.float32, np.float32, np.float32, np.float32]:
    """(x_min, x_max, y_min, y_max) in float32, as ONNX's reference computes them."""
    if center:
        half_w, half_h = box[2] / np.float32(2), box[3] / np.float32(2)
        return box[0] - half_w, box[0] + half_w, box[1] - half_h, box[1] + half_h
    return min(box[1], box[3]), max(box[1], box[3]), min(box[0], box[2]), max(box[0], box[2])


def suppresses(a: np.ndarray, b: np.ndarray, center: bool, threshold: np.float32) -> bool:
    ax0, ax1, ay0, ay1 = _corners(a, center)
    bx0, bx1, by0, by1 = _corners(b, center)
    ix0, ix1 = max(ax0, bx0), min(ax1, bx1)
    if ix1 <= ix0:
        return False
    iy0, iy1 = max(ay0, by0), min(ay1, by1)
    if iy1 <= iy0:
        return False
    inter = (ix1 - ix0) * (iy1 - iy0)
    area_a, area_b = (ax1 - ax0) * (ay1 - ay0), (bx1 - bx0) * (by1 - by0)
    union = area_a + area_b - inter
    if inter <= 0 or area_a <= 0 or area_b <= 0 or union <= 0:
        return False
    return bool(inter / union > threshold)


def _scalar(ctx: RefCtx, i: int) -> np.ndarray | None:
    if not ctx.has(i) or ctx.input(i).size == 0:
        return None
    return np.asarray(ctx.input(i).reshape(-1)[0])


def _reference(ctx: RefCtx) -> list[np.ndarray]:
    boxes, scores = ctx.input(0).astype(np.float32), ctx.input(1).astype(np.float32)
    if boxes.ndim != 3 or boxes.shape[2] != 4 or scores.shape[0] != boxes.shape[0] or scores.shape[2] != boxes.shape[1]:
        raise ValueError(f"non_max_suppression: boxes {list(boxes.shape)} and scores {list(scores.shape)} do not fit")
    limit_v, iou_v, score_v = _scalar(ctx, 2), _scalar(ctx, 3), _scalar(ctx, 4)
    limit = max(int(limit_v), 0) if limit_v is not None else 0
    iou = np.float32(iou_v) if iou_v is not None else np.float32(0)
    center = bool(ctx.attrs["center_point_box"])
    out: list[tuple[int, int, int]] = []
    for b in range(boxes.shape[0]):
        for c in range(scores.shape[1]):
            s = scores[b, c]
            cand = [i for i in range(s.shape[0]) if score_v is None or s[i] > np.float32(score_v)]
            cand.sort(key=lambda i: (-s[i], i))
            chosen: list[int] = []
            for i in cand:
                if len(chosen) >= limit:
                    break
                if not any(suppresses(boxes[b, i], boxes[b, j], center, iou) for j in chosen):
                    chosen.append(i)
                    out.append((b, c, i))
    return [np.array(out, dtype=np.int64).reshape(-1, 3)]


register(
    OpDef(
        name="non_max_suppression",
        inputs=("boxes", "scores", "max_output_boxes_per_class?", "iou_threshold?", "score_threshold?"),
        attrs={"center_point_box": AttrSpec("int", 0)},
        infer=_infer,
        reference=_reference,
        doc="The (batch, class, box) triples greedy non-maximum suppression selects (ONNX NonMaxSuppression); "
        "i64 [selected, 3], selected known at run time.",
    )
)
