"""Importers of ONNX's sampling and detection ops: GridSample, RoiAlign, MaxRoiPool, DeformConv and
NonMaxSuppression (Cuvil's ``grid_sample``, ``roi_align``, ``max_roi_pool``, ``deform_conv``,
``non_max_suppression``).

The Cuvil ops follow the newest ONNX forms; older ones are upgraded here:

* GridSample-16 names its modes ``bilinear`` and ``bicubic`` (``linear`` and ``cubic`` from
  opset 20, which also allows more than two spatial axes);
* RoiAlign-10 has no ``coordinate_transformation_mode``: it samples without the half-pixel
  shift, which RoiAlign-16 calls ``output_half_pixel`` (its new default is ``half_pixel``).

Refused by name: DeformConv on other than two spatial axes, integer inputs where ONNX allows them
(GridSample's X), and attribute values outside each op's list.
"""

from __future__ import annotations

from collections.abc import Sequence

from cuvil.frontends.onnx.importer import ImportCtx, importer
from cuvil.frontends.onnx.ops_reduce import known_attrs
from cuvil.ir.dtypes import FLOATS
from cuvil.ir.graph import Value
from cuvil.ops.sampling import PADDING_MODES, ROI_COORD_MODES, ROI_MODES

_GRID_MODES = {"nearest": "nearest", "linear": "linear", "cubic": "cubic"}
_GRID_MODES_16 = {"nearest": "nearest", "bilinear": "linear", "bicubic": "cubic"}


def _float_inputs(ctx: ImportCtx, values: Sequence[Value], names: Sequence[str]) -> None:
    for v, name in zip(values, names):
        if v.type.dtype not in FLOATS:
            raise ctx.unsupported(f"{name} of element type {v.type.dtype} (floating-point {name} is supported)")


@importer("GridSample", since=16)
def _grid_sample(ctx: ImportCtx) -> Sequence[Value | None]:
    known_attrs(ctx, ("align_corners", "mode", "padding_mode"))
    x, grid = ctx.input(0), ctx.input(1)
    if x is None or grid is None:
        raise ctx.fail("inputs X and grid are required")
    modes = _GRID_MODES if ctx.opset >= 20 else _GRID_MODES_16
    mode = str(ctx.attr("mode", "linear" if ctx.opset >= 20 else "bilinear"))
    if mode not in modes:
        raise ctx.unsupported(f"mode={mode!r} (GridSample-{ctx.opset} has {', '.join(modes)})")
    padding = str(ctx.attr("padding_mode", "zeros"))
    if padding not in PADDING_MODES:
        raise ctx.unsupported(f"padding_mode={padding!r} (GridSample has {', '.join(PADDING_MODES)})")
    align = int(ctx.attr("align_corners", 0))
    if align not in (0, 1):
        raise ctx.fail(f"align_corners must be 0 or 1, got {align}")
    _float_inputs(ctx, [x, grid], ["X", "grid"])
    if ctx.opset < 20 and x.type.rank != 4:
        raise ctx.fail(f"GridSample-{ctx.opset} takes 4-D X, got {x.type}")
    return ctx.emit("grid_sample", [x, grid], {"mode": modes[mode], "padding_mode": padding, "align_corners": align})


@importer("RoiAlign", since=10)
def _roi_align(ctx: ImportCtx) -> Sequence[Value | None]:
    known = ["mode", "output_height", "output_width", "sampling_ratio", "spatial_scale"]
    if ctx.opset >= 16:
        known.append("coordinate_transformation_mode")
    known_attrs(ctx, known)
    x, rois, batch = ctx.input(0), ctx.input(1), ctx.input(2)
    if x is None or rois is None or batch is None:
        raise ctx.fail("inputs X, rois and batch_indices are required")
    ctm = str(ctx.attr("coordinate_transformation_mode", "half_pixel" if ctx.opset >= 16 else "output_half_pixel"))
    if ctm not in ROI_COORD_MODES:
        raise ctx.unsupported(f"coordinate_transformation_mode={ctm!r} (RoiAlign has {', '.join(ROI_COORD_MODES)})")
    mode = str(ctx.attr("mode", "avg"))
    if mode not in ROI_MODES:
        raise ctx.unsupported(f"mode={mode!r} (RoiAlign has {', '.join(ROI_MODES)})")
    _float_inputs(ctx, [x, rois], ["X", "rois"])
    attrs = {"mode": mode, "coordinate_transformation_mode": ctm,
             "output_height": int(ctx.attr("output_height", 1)), "output_width": int(ctx.attr("output_width", 1)),
             "sampling_ratio": int(ctx.attr("sampling_ratio", 0)), "spatial_scale": float(ctx.attr("spatial_scale", 1.0))}
    return ctx.emit("roi_align", [x, rois, batch], attrs)


@importer("NonMaxSuppression", since=10)
def _nms(ctx: ImportCtx) -> Sequence[Value | None]:
    known_attrs(ctx, ("center_point_box",))
    if ctx.input(0) is None or ctx.input(1) is None:
        raise ctx.fail("inputs boxes and scores are required")
    center = int(ctx.attr("center_point_box", 0))
    if center not in (0, 1):
        raise ctx.unsupported(f"center_point_box={center} (0: corners, 1: center and size)")
    return ctx.emit("non_max_suppression", ctx.inputs(), {"center_point_box": center})


@importer("DeformConv", since=19)
def _deform_conv(ctx: ImportCtx) -> Sequence[Value | None]:
    known_attrs(ctx, ("dilations", "group", "kernel_shape", "offset_group", "pads", "strides"))
    x, w, offset = ctx.input(0), ctx.input(1), ctx.input(2)
    if x is None or w is None or offset is None:
        raise ctx.fail("inputs X, W and offset are required")
    if x.type.rank != 4:
        raise ctx.unsupported(f"X of rank {x.type.rank} (the 2-D form, 4-D X, is supported)")
    _float_inputs(ctx, [x], ["X"])
    return ctx.emit("deform_conv", ctx.inputs(), dict(ctx.attrs))


@importer("MaxRoiPool")
def _max_roi_pool(ctx: ImportCtx) -> Sequence[Value | None]:
    known_attrs(ctx, ("pooled_shape", "spatial_scale"))
    x, rois = ctx.input(0), ctx.input(1)
    if x is None or rois is None:
        raise ctx.fail("inputs X and rois are required")
    if ctx.attr("pooled_shape") is None:
        raise ctx.fail("the pooled_shape attribute is required")
    _float_inputs(ctx, [x, rois], ["X", "rois"])
    return ctx.emit("max_roi_pool", [x, rois], {"pooled_shape": [int(v) for v in ctx.attr("pooled_shape")],
                                                "spatial_scale": float(ctx.attr("spatial_scale", 1.0))})
