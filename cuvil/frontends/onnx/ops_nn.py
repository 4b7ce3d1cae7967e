"""Importers of ONNX's spatial ops: Conv, ConvTranspose, the pools, Pad, Resize, DepthToSpace,
SpaceToDepth, Col2Im.

Conv, the pools and the depth/space ops kept their meaning across opsets (later versions only
added attributes whose defaults reproduce the earlier behaviour), so their attributes pass
straight through; the Cuvil op rejects any it does not know.  Pad and Resize changed shape
over time and are upgraded here:

* Pad-1 (``paddings``, ``value``) and Pad-2 (``pads``, ``value``) attributes become the
  ``pads`` and ``constant_value`` inputs of Pad-11+.
* Resize-10 (``X``, ``scales``; asymmetric coordinates) becomes the newest Resize with the
  coordinate mode and nearest rounding that onnxruntime gives Resize-10.  Resize-11/13 take an
  ``roi`` and ``scales`` that are often empty placeholders; those are dropped.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from cuvil.frontends.onnx.importer import ImportCtx, importer
from cuvil.ir.dtypes import DType
from cuvil.ir.graph import Value
from cuvil.ops.common import const_of


def _pass_through(op_type: str, cuvil_op: str) -> None:
    def fn(ctx: ImportCtx) -> Sequence[Value | None]:
        return ctx.emit(cuvil_op, ctx.inputs(), dict(ctx.attrs), num_outputs=ctx.num_outputs)

    importer(op_type)(fn)


for _onnx, _cuvil in {
    "Conv": "conv",
    "ConvTranspose": "conv_transpose",
    "MaxPool": "max_pool",
    "AveragePool": "average_pool",
    "GlobalAveragePool": "global_average_pool",
    "GlobalMaxPool": "global_max_pool",
    "DepthToSpace": "depth_to_space",
    "SpaceToDepth": "space_to_depth",
    "Col2Im": "col2im",
}.items():
    _pass_through(_onnx, _cuvil)


# Pad ---------------------------------------------------------------------------------------------


@importer("Pad")
def _pad(ctx: ImportCtx) -> Sequence[Value | None]:
    data = ctx.input(0)
    if data is None:
        raise ctx.fail("Pad needs its data input")
    mode = ctx.attr("mode", "constant")
    if ctx.opset >= 11:
        extra = sorted(set(ctx.attrs) - {"mode"})
        if extra:
            raise ctx.unsupported(f"attribute(s) {', '.join(extra)} are not part of Pad-{ctx.opset}")
        return ctx.emit("pad", ctx.inputs(), {"mode": mode})
    name = "paddings" if ctx.opset < 2 else "pads"
    pads = ctx.attr(name)
    if pads is None:
        raise ctx.fail(f"Pad-{ctx.opset} needs the {name!r} attribute")
    extra = sorted(set(ctx.attrs) - {"mode", "value", name})
    if extra:
        raise ctx.unsupported(f"attribute(s) {', '.join(extra)} are not part of Pad-{ctx.opset}")
    pads_v = ctx.constant(np.asarray(pads, dtype=np.int64))
    value = ctx.constant(np.asarray(ctx.attr("value", 0.0)).astype(data.type.dtype.np))
    return ctx.emit("pad", [data, pads_v, value], {"mode": mode})


# Resize ------------------------------------------------------------------------------------------

_RESIZE_10_MODES = ("nearest", "linear")


def _is_empty_const(v: Value | None) -> bool:
    c = const_of(v)
    return c is not None and c.size == 0


@importer("Resize")
def _resize(ctx: ImportCtx) -> Sequence[Value | None]:
    if ctx.opset < 11:
        return _resize_10(ctx)
    x, roi, scales, sizes = (ctx.input(i) for i in range(4))
    if x is None:
        raise ctx.fail("Resize needs its X input")
    attrs = dict(ctx.attrs)
    if ctx.opset < 18:
        for name in ("antialias", "axes", "keep_aspect_ratio_policy"):
            if name in attrs:
                raise ctx.unsupported(f"attribute {name!r} is not part of Resize-{ctx.opset}")
    # roi only takes effect with tf_crop_and_resize; elsewhere it is a placeholder.
    if attrs.get("coordinate_transformation_mode") != "tf_crop_and_resize" or _is_empty_const(roi):
        roi = None
    if _is_empty_const(scales):
        scales = None
    if _is_empty_const(sizes):
        sizes = None
    return ctx.emit("resize", [x, roi, scales, sizes], attrs)


def _resize_10(ctx: ImportCtx) -> Sequence[Value | None]:
    """Resize-10: ``output = floor(input * scale)`` with asymmetric coordinates.

    onnxruntime (the runtime these models were written against) rounds nearest source indices
    down on upsampled axes and up on downsampled ones; one rounding attribute cannot say both,
    so a nearest resize that does both becomes two resizes over disjoint axes (nearest
    resizing is separable, so this is exact)."""
    x, scales = ctx.input(0), ctx.input(1)
    if x is None or scales is None:
        raise ctx.fail("Resize-10 needs the X and scales inputs")
    extra = sorted(set(ctx.attrs) - {"mode"})
    if extra:
        raise ctx.unsupported(f"attribute(s) {', '.join(extra)} are not part of Resize-10")
    mode = ctx.attr("mode", "nearest")
    if mode not in _RESIZE_10_MODES:
        raise ctx.unsupported(f"mode {mode!r} (Resize-10 has nearest and linear)")
    base = {"mode": mode, "coordinate_transformation_mode": "asymmetric"}
    if mode == "linear":
        return ctx.emit("resize", [x, None, scales, None], base)
    values = const_of(scales)
    if values is None:
        raise ctx.unsupported("nearest Resize-10 with run-time scales (its rounding depends on the scale values)")
    vals = [float(s) for s in values.reshape(-1)]
    if len(vals) != x.type.rank:
        raise ctx.fail(f"scales has {len(vals)} values for an input of rank {x.type.rank}")
    up = [a for a, s in enumerate(vals) if s >= 1]
    down = [a for a, s in enumerate(vals) if s < 1]
    y = x
    for axes, rounding in ((up, "floor"), (down, "ceil")):
        if not axes:
            continue
        part = ctx.constant(np.asarray([vals[a] for a in axes], dtype=np.float32), DType.f32)
        y = ctx.emit1("resize", [y, None, part, None], {**base, "nearest_mode": rounding, "axes": axes})
    return [y]
