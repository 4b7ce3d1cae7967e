"""Importers of ONNX Cast and CastLike (both become Cuvil's ``cast``).

Cast-1 names the target type with a string (``"FLOAT"``); later versions with
a TensorProto enum value.  ``saturate`` (opset 19) only changes conversions to
the float8 types: for those it passes through (``cuvil/ops/lowbit.py``), for
other targets it is checked and dropped.  ``round_mode`` (opset 24) only acts
on conversions to float8e8m0, a type Cuvil refuses by name: it is checked and
dropped.
"""

from __future__ import annotations

from collections.abc import Sequence

import onnx

from cuvil.errors import UnsupportedOpError
from cuvil.frontends.onnx.importer import ImportCtx, dtype_of, importer
from cuvil.frontends.onnx.ops_elementwise import first_opset, input_value
from cuvil.ir.dtypes import FLOAT8S, DType
from cuvil.ir.graph import Value

_ROUND_MODES = ("up", "down", "nearest")


def _check_float8_attrs(ctx: ImportCtx) -> None:
    known = {"to", "saturate", "round_mode"} if ctx.op_type == "Cast" else {"saturate", "round_mode"}
    unknown = sorted(set(ctx.attrs) - known)
    if unknown:
        raise ctx.fail(f"unknown attribute(s) {', '.join(unknown)}")
    if ctx.attr("saturate", 1) not in (0, 1):
        raise ctx.fail(f"saturate must be 0 or 1, got {ctx.attr('saturate')}")
    if ctx.attr("round_mode", "up") not in _ROUND_MODES:
        raise ctx.fail(f"round_mode must be one of {', '.join(_ROUND_MODES)}, got {ctx.attr('round_mode')!r}")


def _target(ctx: ImportCtx) -> DType:
    to = ctx.attr("to")
    if to is None:
        raise ctx.fail("attribute 'to' is required")
    if isinstance(to, str):  # Cast-1
        try:
            to = onnx.TensorProto.DataType.Value(to.upper())
        except ValueError:
            raise ctx.fail(f"'to' names no ONNX element type: {to!r}") from None
    if to not in onnx.TensorProto.DataType.values():
        raise ctx.fail(f"'to' is not an ONNX element type: {to}")
    try:
        return dtype_of(to, f"node {ctx.name!r}")
    except UnsupportedOpError:
        raise ctx.unsupported(f"cast to {onnx.TensorProto.DataType.Name(to)}") from None


def _cast_attrs(ctx: ImportCtx, to: DType) -> dict[str, object]:
    if to in FLOAT8S and ctx.attr("saturate", 1) == 0:
        return {"to": to, "saturate": 0}
    return {"to": to}


@importer("Cast", since=first_opset("Cast"))
def _cast(ctx: ImportCtx) -> Sequence[Value | None]:
    _check_float8_attrs(ctx)
    return [ctx.emit1("cast", [input_value(ctx, 0)], _cast_attrs(ctx, _target(ctx)))]


@importer("CastLike", since=first_opset("CastLike"))
def _cast_like(ctx: ImportCtx) -> Sequence[Value | None]:
    _check_float8_attrs(ctx)
    if ctx.num_inputs != 2:
        raise ctx.fail(f"takes 2 inputs, got {ctx.num_inputs}")
    like = input_value(ctx, 1)
    return [ctx.emit1("cast", [input_value(ctx, 0)], _cast_attrs(ctx, like.type.dtype))]
