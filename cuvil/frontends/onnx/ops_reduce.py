"""Importers of ONNX reductions: Reduce*, ArgMax/ArgMin, CumSum/CumProd and TopK.

Older opsets give the reduce axes (and TopK's k) as attributes; they become
constant inputs of the Cuvil op, which follows the newest ONNX form.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import numpy as np

from cuvil.frontends.onnx.importer import ImportCtx, importer
from cuvil.ir.dtypes import DType
from cuvil.ir.graph import Value


def known_attrs(ctx: ImportCtx, allowed: Iterable[str]) -> None:
    """Refuse any attribute this importer does not handle (none is ever silently ignored)."""
    extra = sorted(set(ctx.attrs) - set(allowed))
    if extra:
        raise ctx.unsupported(f"attribute(s) {', '.join(extra)} not supported at opset {ctx.opset}")


# ONNX op -> (Cuvil op, first opset where the axes are an input rather than an attribute).
_REDUCE = {
    "ReduceSum": ("reduce_sum", 13),
    "ReduceMean": ("reduce_mean", 18),
    "ReduceMax": ("reduce_max", 18),
    "ReduceMin": ("reduce_min", 18),
    "ReduceProd": ("reduce_prod", 18),
    "ReduceL1": ("reduce_l1", 18),
    "ReduceL2": ("reduce_l2", 18),
    "ReduceSumSquare": ("reduce_sum_square", 18),
    "ReduceLogSum": ("reduce_log_sum", 18),
    "ReduceLogSumExp": ("reduce_log_sum_exp", 18),
}


def _reduce_importer(onnx_op: str, cuvil_op: str, axes_input_since: int) -> None:
    @importer(onnx_op)
    def fn(ctx: ImportCtx) -> Sequence[Value | None]:
        attrs = {"keepdims": ctx.attr("keepdims", 1)}
        if ctx.opset >= axes_input_since:
            known_attrs(ctx, ("keepdims", "noop_with_empty_axes"))
            attrs["noop_with_empty_axes"] = ctx.attr("noop_with_empty_axes", 0)
            axes = ctx.input(1)
        else:
            known_attrs(ctx, ("keepdims", "axes"))
            listed = ctx.attr("axes")
            # No axes attribute (or an empty one) reduces over every axis.
            axes = ctx.constant(np.asarray(listed, dtype=np.int64)) if listed else None
        return ctx.emit(cuvil_op, [ctx.input(0), axes], attrs)


for _onnx, (_cuvil, _since) in _REDUCE.items():
    _reduce_importer(_onnx, _cuvil, _since)


def _arg_importer(onnx_op: str, cuvil_op: str) -> None:
    @importer(onnx_op)
    def fn(ctx: ImportCtx) -> Sequence[Value | None]:
        allowed = ["axis", "keepdims"] + (["select_last_index"] if ctx.opset >= 12 else [])
        known_attrs(ctx, allowed)
        return ctx.emit(cuvil_op, [ctx.input(0)], dict(ctx.attrs))


_arg_importer("ArgMax", "arg_max")
_arg_importer("ArgMin", "arg_min")


def _cumulative_importer(onnx_op: str, cuvil_op: str) -> None:
    @importer(onnx_op)
    def fn(ctx: ImportCtx) -> Sequence[Value | None]:
        known_attrs(ctx, ("exclusive", "reverse"))
        return ctx.emit(cuvil_op, ctx.inputs(), dict(ctx.attrs))


_cumulative_importer("CumSum", "cumsum")
_cumulative_importer("CumProd", "cumprod")


@importer("TopK")
def _top_k(ctx: ImportCtx) -> Sequence[Value | None]:
    attrs = {"axis": ctx.attr("axis", -1)}
    k: Value | None
    if ctx.opset < 10:
        known_attrs(ctx, ("axis", "k"))
        if "k" not in ctx.attrs:
            raise ctx.fail("attribute 'k' is required before opset 10")
        k = ctx.constant(np.asarray([ctx.attrs["k"]], dtype=np.int64), DType.i64)
    else:
        known_attrs(ctx, ("axis", "largest", "sorted") if ctx.opset >= 11 else ("axis",))
        k = ctx.input(1)
        attrs.update({n: ctx.attrs[n] for n in ("largest", "sorted") if n in ctx.attrs})
    return ctx.emit("top_k", [ctx.input(0), k], attrs, num_outputs=2)
