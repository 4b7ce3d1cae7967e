"""ATen elementwise ops: arithmetic, comparisons, logic, activations, ``where`` and ``clamp``.

Operands are promoted with PyTorch's rules (:func:`common.result_dtype`)
and cast before the Cuvil op, whose inputs share one element type.  Ops that
PyTorch computes in floating point for integer inputs (``div``, ``exp``,
``sigmoid`` ...) cast to the float type torch.export recorded for the result.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from cuvil.frontends.torch.aten.common import cast, mapping, operand, result_dtype, scalar_value
from cuvil.frontends.torch.converter import TorchCtx
from cuvil.ir.dtypes import DType
from cuvil.ir.graph import Value

# arithmetic ----------------------------------------------------------------------------------------


def _scaled(ctx: TorchCtx, v: Value, alpha: Any) -> Value:
    """``alpha * v`` for the ``alpha`` argument of add/sub (1 leaves ``v`` alone)."""
    if alpha is None or alpha == 1:
        return v
    if v.type.dtype == DType.bool:
        raise ctx.fail("alpha is not supported for boolean tensors")
    if v.type.dtype.is_int and isinstance(alpha, float):
        raise ctx.fail(f"alpha={alpha} is a float but the operands are integers")
    return ctx.emit1("mul", [v, scalar_value(ctx, alpha, v.type.dtype)])


def _add_sub(ctx: TorchCtx, op: str) -> Value:
    a, b = ctx.arg(0), ctx.arg(1, "other")
    dt = result_dtype(ctx, a, b)
    x, y = operand(ctx, a, dt), operand(ctx, b, dt)
    y = _scaled(ctx, y, ctx.arg(2, "alpha", 1))
    if dt == DType.bool:
        if op == "sub":
            raise ctx.fail("subtracting boolean tensors is not defined (PyTorch refuses it too)")
        return ctx.emit1("or", [x, y])
    return ctx.emit1(op, [x, y])


@mapping("aten.add.Tensor", "aten.add.Scalar")
def _add(ctx: TorchCtx) -> Value:
    return _add_sub(ctx, "add")


@mapping("aten.sub.Tensor", "aten.sub.Scalar")
def _sub(ctx: TorchCtx) -> Value:
    return _add_sub(ctx, "sub")


@mapping("aten.mul.Tensor", "aten.mul.Scalar")
def _mul(ctx: TorchCtx) -> Value:
    a, b = ctx.arg(0), ctx.arg(1, "other")
    dt = result_dtype(ctx, a, b)
    x, y = operand(ctx, a, dt), operand(ctx, b, dt)
    return ctx.emit1("and" if dt == DType.bool else "mul", [x, y])


def _trunc(ctx: TorchCtx, v: Value) -> Value:
    """Round toward zero: floor for positive values, ceil for negative ones."""
    neg = ctx.emit1("less", [v, ctx.constant(np.array(0, v.type.dtype.np))])
    return ctx.emit1("where", [neg, ctx.emit1("ceil", [v]), ctx.emit1("floor", [v])])


def _floor_div_int(ctx: TorchCtx, x: Value, y: Value) -> Value:
    """Integer floor division: ``x - mod(x, y)`` is an exact multiple of ``y``."""
    rem = ctx.emit1("mod", [x, y], {"fmod": 0})
    return ctx.emit1("div", [ctx.emit1("sub", [x, rem]), y])


@mapping("aten.div.Tensor", "aten.div.Scalar", "aten.div.Tensor_mode", "aten.div.Scalar_mode")
def _div(ctx: TorchCtx) -> Value:
    a, b = ctx.arg(0), ctx.arg(1, "other")
    mode = ctx.arg(2, "rounding_mode") if ctx.target.endswith("_mode") else None
    if mode not in (None, "trunc", "floor"):
        raise ctx.fail(f"unknown rounding_mode {mode!r}")
    dt = result_dtype(ctx, a, b)
    if mode is None or dt.is_float:
        out = ctx.out_type().dtype if mode is None else dt  # true division of integers gives a float
        q = ctx.emit1("div", [operand(ctx, a, out), operand(ctx, b, out)])
        if mode == "trunc":
            q = _trunc(ctx, q)
        elif mode == "floor":
            q = ctx.emit1("floor", [q])
        return q
    if dt == DType.bool:
        raise ctx.fail("integer division of boolean tensors is not supported")
    x, y = operand(ctx, a, dt), operand(ctx, b, dt)
    # Cuvil's integer div truncates toward zero, as rounding_mode="trunc"
    return ctx.emit1("div", [x, y]) if mode == "trunc" else _floor_div_int(ctx, x, y)


@mapping("aten.remainder.Tensor", "aten.remainder.Scalar", "aten.fmod.Tensor", "aten.fmod.Scalar")
def _remainder(ctx: TorchCtx) -> Value:
    a, b = ctx.arg(0), ctx.arg(1, "other")
    dt = result_dtype(ctx, a, b)
    fmod = 1 if "fmod" in ctx.target else 0
    return ctx.emit1("mod", [operand(ctx, a, dt), operand(ctx, b, dt)], {"fmod": fmod})


@mapping("aten.pow.Tensor_Scalar", "aten.pow.Tensor_Tensor", "aten.pow.Scalar")
def _pow(ctx: TorchCtx) -> Value:
    a, b = ctx.arg(0), ctx.arg(1, "exponent")
    dt = ctx.out_type().dtype
    if isinstance(b, (int, float)) and not isinstance(b, bool) and b == 2:
        x = operand(ctx, a, dt)
        return ctx.emit1("mul", [x, x])  # as PyTorch's kernel computes x ** 2
    return ctx.emit1("pow", [operand(ctx, a, dt), operand(ctx, b, dt)])


@mapping("aten.maximum.default", "aten.minimum.default")
def _max_min(ctx: TorchCtx) -> Value:
    a, b = ctx.arg(0), ctx.arg(1)
    dt = result_dtype(ctx, a, b)
    op = "max" if "maximum" in ctx.target else "min"
    x, y = operand(ctx, a, dt), operand(ctx, b, dt)
    if dt == DType.bool:
        return ctx.emit1("or" if op == "max" else "and", [x, y])
    return ctx.emit1(op, [x, y])


# unary math ------------------------------------------------------------------------------------------

_UNARY = {
    "aten.neg.default": "neg", "aten.abs.default": "abs", "aten.exp.default": "exp", "aten.log.default": "log",
    "aten.sqrt.default": "sqrt", "aten.reciprocal.default": "reciprocal", "aten.sin.default": "sin",
    "aten.cos.default": "cos", "aten.tan.default": "tan", "aten.tanh.default": "tanh",
    "aten.sigmoid.default": "sigmoid", "aten.erf.default": "erf", "aten.floor.default": "floor",
    "aten.ceil.default": "ceil", "aten.round.default": "round", "aten.sign.default": "sign",
    "aten.asin.default": "asin", "aten.acos.default": "acos", "aten.atan.default": "atan",
    "aten.sinh.default": "sinh", "aten.cosh.default": "cosh", "aten.relu.default": "relu",
}


@mapping(*_UNARY)
def _unary(ctx: TorchCtx) -> Value:
    dt = ctx.out_type().dtype
    x = ctx.value(ctx.arg(0))
    if x.type.dtype.is_int and _UNARY[ctx.target] in ("floor", "ceil", "round"):
        return x  # integers are already whole (PyTorch returns them unchanged)
    return ctx.emit1(_UNARY[ctx.target], [cast(ctx, x, dt)])


@mapping("aten.rsqrt.default")
def _rsqrt(ctx: TorchCtx) -> Value:
    x = cast(ctx, ctx.value(ctx.arg(0)), ctx.out_type().dtype)
    return ctx.emit1("reciprocal", [ctx.emit1("sqrt", [x])])


@mapping("aten.log1p.default", "aten.expm1.default", "aten.log2.default", "aten.log10.default", "aten.exp2.default")
def _log_exp_variants(ctx: TorchCtx) -> Value:
    dt = ctx.out_type().dtype
    x = cast(ctx, ctx.value(ctx.arg(0)), dt)
    one = ctx.constant(np.array(1, dt.np))
    name = ctx.target.split(".")[1]
    if name == "log1p":
        return ctx.emit1("log", [ctx.emit1("add", [x, one])])
    if name == "expm1":
        return ctx.emit1("sub", [ctx.emit1("exp", [x]), one])
    if name == "exp2":
        return ctx.emit1("pow", [ctx.constant(np.array(2, dt.np)), x])
    base = 2.0 if name == "log2" else 10.0
    return ctx.emit1("div", [ctx.emit1("log", [x]), ctx.constant(np.array(np.log(base), dt.np))])


@mapping("aten.trunc.default")
def _trunc_op(ctx: TorchCtx) -> Value:
    x = ctx.value(ctx.arg(0))
    return x if x.type.dtype.is_int else _trunc(ctx, x)


@mapping("aten.isnan.default")
def _isnan(ctx: TorchCtx) -> Value:
    x = ctx.value(ctx.arg(0))
    if not x.type.dtype.is_float:
        return ctx.emit1("full_like", [x], {"value": np.array(False)})
    return ctx.emit1("is_nan", [x])


@mapping("aten.isinf.default")
def _isinf(ctx: TorchCtx) -> Value:
    x = ctx.value(ctx.arg(0))
    if not x.type.dtype.is_float:
        return ctx.emit1("full_like", [x], {"value": np.array(False)})
    return ctx.emit1("is_inf", [x])


# activations --------------------------------------------------------------------------------------------


@mapping("aten.gelu.default")
def _gelu(ctx: TorchCtx) -> Value:
    approximate = ctx.arg(1, "approximate", "none")
    if approximate not in ("none", "tanh"):
        raise ctx.fail(f"gelu approximate={approximate!r} is not one of 'none', 'tanh'")
    return ctx.emit1("gelu", [ctx.value(ctx.arg(0))], {"approximate": approximate})


@mapping("aten.leaky_relu.default")
def _leaky_relu(ctx: TorchCtx) -> Value:
    return ctx.emit1("leaky_relu", [ctx.value(ctx.arg(0))], {"alpha": float(ctx.arg(1, "negative_slope", 0.01))})


@mapping("aten.elu.default")
def _elu(ctx: TorchCtx) -> Value:
    x = ctx.value(ctx.arg(0))
    alpha = float(ctx.arg(1, "alpha", 1.0))
    scale = float(ctx.arg(2, "scale", 1.0))
    input_scale = float(ctx.arg(3, "input_scale", 1.0))
    dt = x.type.dtype
    if input_scale != 1.0:
        x = ctx.emit1("mul", [x, ctx.constant(np.array(input_scale, dt.np))])
    # elu(x * input_scale) with the negative branch's alpha, then the whole result times scale;
    # the positive branch must not see input_scale, so rebuild it from the original input
    y = ctx.emit1("elu", [x], {"alpha": alpha})
    if input_scale != 1.0:
        orig = ctx.value(ctx.arg(0))
        pos = ctx.emit1("greater", [orig, ctx.constant(np.array(0, dt.np))])
        y = ctx.emit1("where", [pos, orig, y])
    if scale != 1.0:
        y = ctx.emit1("mul", [y, ctx.constant(np.array(scale, dt.np))])
    return y


def _bounds(ctx: TorchCtx, lo: Any, hi: Any) -> Value:
    x_arg = ctx.arg(0)
    dt = ctx.out_type().dtype
    x = operand(ctx, x_arg, dt)
    if lo is None and hi is None:
        raise ctx.fail("clamp needs at least one of min and max")
    both_scalar = not any(hasattr(b, "op") for b in (lo, hi))
    if both_scalar:
        return ctx.emit1("clip", [x, None if lo is None else operand(ctx, lo, dt),
                                  None if hi is None else operand(ctx, hi, dt)])
    # tensor bounds broadcast against x: max then min, which is PyTorch's order (min > max gives max)
    if lo is not None:
        x = ctx.emit1("max", [x, operand(ctx, lo, dt)])
    if hi is not None:
        x = ctx.emit1("min", [x, operand(ctx, hi, dt)])
    return x


@mapping("aten.clamp.default", "aten.clamp.Tensor")
def _clamp(ctx: TorchCtx) -> Value:
    return _bounds(ctx, ctx.arg(1, "min"), ctx.arg(2, "max"))


@mapping("aten.hardtanh.default")
def _hardtanh(ctx: TorchCtx) -> Value:
    return _bounds(ctx, float(ctx.arg(1, "min_val", -1.0)), float(ctx.arg(2, "max_val", 1.0)))


# comparisons and logic ------------------------------------------------------------------------------------

_COMPARE = {"eq": "equal", "ne": "equal", "lt": "less", "le": "less_or_equal", "gt": "greater",
            "ge": "greater_or_equal"}


@mapping(*(f"aten.{c}.{o}" for c in _COMPARE for o in ("Tensor", "Scalar")))
def _compare(ctx: TorchCtx) -> Value:
    a, b = ctx.arg(0), ctx.arg(1, "other")
    dt = result_dtype(ctx, a, b)
    name = ctx.target.split(".")[1]
    x, y = operand(ctx, a, dt), operand(ctx, b, dt)
    if dt == DType.bool and name not in ("eq", "ne"):
        # order booleans as 0 < 1
        x, y = cast(ctx, x, DType.u8), cast(ctx, y, DType.u8)
    out = ctx.emit1(_COMPARE[name], [x, y])
    return ctx.emit1("not", [out]) if name == "ne" else out


def _as_bool(ctx: TorchCtx, arg: Any) -> Value:
    return operand(ctx, arg, DType.bool)


@mapping("aten.logical_not.default")
def _logical_not(ctx: TorchCtx) -> Value:
    return ctx.emit1("not", [_as_bool(ctx, ctx.arg(0))])


@mapping("aten.logical_and.default", "aten.logical_or.default", "aten.logical_xor.default")
def _logical(ctx: TorchCtx) -> Value:
    op = ctx.target.split(".")[1].removeprefix("logical_")
    return ctx.emit1(op, [_as_bool(ctx, ctx.arg(0)), _as_bool(ctx, ctx.arg(1))])


@mapping("aten.bitwise_not.default", "aten.bitwise_and.Tensor", "aten.bitwise_or.Tensor", "aten.bitwise_xor.Tensor",
         "aten.bitwise_and.Scalar", "aten.bitwise_or.Scalar", "aten.bitwise_xor.Scalar")
def _bitwise(ctx: TorchCtx) -> Value:
    args = [ctx.arg(0)] if "not" in ctx.target else [ctx.arg(0), ctx.arg(1)]
    dt = result_dtype(ctx, *args)
    if dt != DType.bool:
        raise ctx.unsupported(f"bitwise operations on {dt} tensors (only bool is mapped)")
    op = ctx.target.split(".")[1].removeprefix("bitwise_")
    return ctx.emit1(op, [operand(ctx, a, DType.bool) for a in args])


@mapping("aten.where.self")
def _where(ctx: TorchCtx) -> Value:
    cond = _as_bool(ctx, ctx.arg(0))
    a, b = ctx.arg(1), ctx.arg(2)
    dt = ctx.out_type().dtype
    return ctx.emit1("where", [cond, operand(ctx, a, dt), operand(ctx, b, dt)])
