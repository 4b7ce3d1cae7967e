"""Importers of ONNX elementwise arithmetic and math ops, and the helpers the other
elementwise importers share.

Older forms are upgraded here:

* ``consumed_inputs`` (opset < 6) was a memory-planning hint with no effect on
  the values: it is dropped;
* binary ops before opset 7 broadcast only when ``broadcast=1``, matching B's
  shape against A's dims from ``axis`` on (the trailing dims when ``axis`` is
  absent): B is reshaped so that NumPy broadcasting gives the same result;
* Max/Min/Sum/Mean before opset 8 required equal shapes: that is checked.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import onnx

from cuvil.frontends.onnx.importer import ImportCtx, importer
from cuvil.ir.graph import Value

# Ops whose version-1 schema has the consumed_inputs hint, superseded at opset 6.
_CONSUMED_INPUTS_UNTIL = 6
# Binary ops with the broadcast/axis attributes before opset 7.
_LEGACY_BROADCAST_UNTIL = 7


def modern_attrs(ctx: ImportCtx, defaults: dict[str, Any] | None = None, drop: Sequence[str] = ()) -> dict[str, Any]:
    """The node's attributes with ``consumed_inputs`` dropped where the opset defines it.

    ``defaults`` fills attributes the node leaves out (for old opsets whose defaults differ);
    ``drop`` names attributes the importer has already translated."""
    attrs = dict(defaults or {})
    attrs.update(ctx.attrs)
    if ctx.opset < _CONSUMED_INPUTS_UNTIL:
        attrs.pop("consumed_inputs", None)
    for name in drop:
        attrs.pop(name, None)
    return attrs


def first_opset(op_type: str) -> int:
    """The opset that introduced ``op_type`` (the importer refuses models older than that)."""
    return _FIRST_OPSET[op_type]


_FIRST_OPSET: dict[str, int] = {}
for _schema in onnx.defs.get_all_schemas_with_history():
    if _schema.domain in ("", "ai.onnx"):
        _FIRST_OPSET[_schema.name] = min(_FIRST_OPSET.get(_schema.name, _schema.since_version), _schema.since_version)


def input_value(ctx: ImportCtx, i: int) -> Value:
    v = ctx.input(i)
    if v is None:
        raise ctx.fail(f"input {i} is required")
    return v


def unary_op(onnx_op: str, cuvil_op: str, *, v1_defaults: dict[str, Any] | None = None) -> None:
    """Register an importer for a one-input ONNX op mapping to ``cuvil_op`` with the same attributes.

    ``v1_defaults``: attribute defaults of the opset-1 schema where they differ from later ones."""

    def fn(ctx: ImportCtx) -> Sequence[Value | None]:
        if ctx.num_inputs != 1:
            raise ctx.fail(f"takes 1 input, got {ctx.num_inputs}")
        defaults = v1_defaults if ctx.opset < _CONSUMED_INPUTS_UNTIL else None
        return [ctx.emit1(cuvil_op, [input_value(ctx, 0)], modern_attrs(ctx, defaults))]

    importer(onnx_op, since=first_opset(onnx_op))(fn)


def legacy_broadcast(ctx: ImportCtx, a: Value, b: Value) -> Value:
    """B prepared for NumPy broadcasting under the pre-opset-7 ``broadcast``/``axis`` rules."""
    broadcast = ctx.attr("broadcast", 0)
    axis = ctx.attr("axis")
    sa, sb = a.type.shape, b.type.shape
    if broadcast not in (0, 1):
        raise ctx.fail(f"broadcast must be 0 or 1, got {broadcast}")
    if not broadcast:
        if axis is not None:
            raise ctx.fail("axis is only meaningful with broadcast=1")
        if sa != sb:
            raise ctx.fail(f"without broadcast=1 the inputs must have equal shapes, got {a.type} and {b.type}")
        return b
    if len(sb) > len(sa):
        raise ctx.fail(f"broadcast=1 needs B's rank <= A's rank, got {b.type} and {a.type}")
    start = len(sa) - len(sb) if axis is None else axis + len(sa) if axis < 0 else axis
    is_scalar = all(d == 1 for d in sb)  # a one-element B broadcasts against any A
    if not is_scalar and (start < 0 or start + len(sb) > len(sa) or tuple(sa[start : start + len(sb)]) != tuple(sb)):
        raise ctx.fail(f"broadcast=1 with axis={axis}: B {b.type} does not match A {a.type}")
    trailing = 0 if is_scalar else len(sa) - start - len(sb)
    if trailing == 0:
        return b  # B lines up with A's trailing dims: NumPy broadcasting does the rest
    value = ctx.const_input(1)
    if value is None:
        raise ctx.unsupported(f"legacy broadcast with axis={axis} of a B computed at run time")
    return ctx.constant(value.reshape(value.shape + (1,) * trailing))


def binary_op(onnx_op: str, cuvil_op: str, *, legacy_broadcast_until: int = _LEGACY_BROADCAST_UNTIL) -> None:
    """Register an importer for a two-input ONNX op with NumPy broadcasting (upgrading older forms)."""

    def fn(ctx: ImportCtx) -> Sequence[Value | None]:
        if ctx.num_inputs != 2:
            raise ctx.fail(f"takes 2 inputs, got {ctx.num_inputs}")
        a, b = input_value(ctx, 0), input_value(ctx, 1)
        legacy = ctx.opset < legacy_broadcast_until
        if legacy:
            b = legacy_broadcast(ctx, a, b)
        attrs = modern_attrs(ctx, drop=("broadcast", "axis") if legacy else ())
        return [ctx.emit1(cuvil_op, [a, b], attrs)]

    importer(onnx_op, since=first_opset(onnx_op))(fn)


def variadic_op(onnx_op: str, cuvil_op: str) -> None:
    """Register an importer for Max/Min/Sum/Mean (equal shapes required before opset 8)."""

    def fn(ctx: ImportCtx) -> Sequence[Value | None]:
        xs = [input_value(ctx, i) for i in range(ctx.num_inputs)]
        if not xs:
            raise ctx.fail("needs at least one input")
        if ctx.opset < 8 and len({x.type.shape for x in xs}) > 1:
            shapes = ", ".join(str(x.type) for x in xs)
            raise ctx.fail(f"before opset 8 the inputs must have equal shapes, got {shapes}")
        return [ctx.emit1(cuvil_op, xs, modern_attrs(ctx))]

    importer(onnx_op, since=first_opset(onnx_op))(fn)


for _onnx, _cuvil in {
    "Add": "add",
    "Sub": "sub",
    "Mul": "mul",
    "Div": "div",
    "Pow": "pow",
    "Mod": "mod",
}.items():
    binary_op(_onnx, _cuvil)

for _onnx, _cuvil in {"Max": "max", "Min": "min", "Sum": "sum", "Mean": "mean"}.items():
    variadic_op(_onnx, _cuvil)

for _onnx, _cuvil in {
    "Abs": "abs",
    "Neg": "neg",
    "Sign": "sign",
    "Ceil": "ceil",
    "Floor": "floor",
    "Round": "round",
    "Reciprocal": "reciprocal",
    "Sqrt": "sqrt",
    "Exp": "exp",
    "Log": "log",
    "Erf": "erf",
    "Sin": "sin",
    "Cos": "cos",
    "Tan": "tan",
    "Asin": "asin",
    "Acos": "acos",
    "Atan": "atan",
    "Sinh": "sinh",
    "Cosh": "cosh",
    "Tanh": "tanh",
    "Asinh": "asinh",
    "Acosh": "acosh",
    "Atanh": "atanh",
}.items():
    unary_op(_onnx, _cuvil)
