"""Kernels of the activation functions (ReLU family, sigmoids, GELU, soft functions, shrink, PRelu, Clip).

Each op is a scalar expression (see ``elementwise.py``) following the
reference in ``cuvil/ops/activations.py``: attributes are constants in the
compute type (as NumPy converts a Python float against a float32 array),
and NaN propagates where NumPy's maximum/minimum/clip propagate it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from cuvil.backends.c.kernel import KernelCtx, kernel
from cuvil.backends.c.kernels.common import elementwise
from cuvil.backends.c.kernels.elementwise import (
    MATH_HEADER,
    Scalar,
    constant_not_nan,
    elementwise_op,
    is_float,
    nan_max,
    nan_min,
    scalar_ctx,
    wrapping,
)
from cuvil.backends.c.writer import c_float
from cuvil.ir.dtypes import SIGNED_INTS

_SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)


def _attr(s: Scalar, name: str) -> str:
    return s.lit(float(s.attrs[name]))


@elementwise_op("relu")
def relu(s: Scalar, a: Sequence[str]) -> str:
    return nan_max(s, a[0], s.lit(0) if is_float(s) else "0", b_not_nan=True)


@elementwise_op("leaky_relu")
def leaky_relu(s: Scalar, a: Sequence[str]) -> str:
    x = a[0]
    return f"({x} < 0 ? {_attr(s, 'alpha')} * {x} : {x})"


@elementwise_op("elu")
def elu(s: Scalar, a: Sequence[str]) -> str:
    x = a[0]
    if s.is_double:
        return f"({x} < 0 ? {_attr(s, 'alpha')} * expm1({x}) : {x})"
    return f"cuvil_vm_pick({x} < 0, {_attr(s, 'alpha')} * cuvil_expm1_f({x}), {x})"


@elementwise_op("celu")
def celu(s: Scalar, a: Sequence[str]) -> str:
    x, alpha = a[0], _attr(s, "alpha")
    neg = f"{alpha} * {'expm1' if s.is_double else 'cuvil_expm1_f'}({x} / {alpha})"
    return f"({nan_max(s, x, s.lit(0))} + {nan_min(s, s.lit(0), neg)})"


@elementwise_op("selu")
def selu(s: Scalar, a: Sequence[str]) -> str:
    x = a[0]
    if s.is_double:
        return f"({_attr(s, 'gamma')} * ({x} > 0 ? {x} : {_attr(s, 'alpha')} * expm1({x})))"
    return f"({_attr(s, 'gamma')} * cuvil_vm_pick({x} > 0, {x}, {_attr(s, 'alpha')} * cuvil_expm1_f({x})))"


@elementwise_op("thresholded_relu")
def thresholded_relu(s: Scalar, a: Sequence[str]) -> str:
    x = a[0]
    return f"({x} > {_attr(s, 'alpha')} ? {x} : {s.lit(0)})"


def _sigmoid(s: Scalar, x: str) -> str:
    """The logistic function; in float, the vectorisable one of ``cuvil_vmath.h``."""
    return f"cuvil_sigmoid_d({x})" if s.is_double else f"cuvil_sigmoid_vf({x})"


@elementwise_op("sigmoid")
def sigmoid(s: Scalar, a: Sequence[str]) -> str:
    return _sigmoid(s, a[0])


def _hard_sigmoid(s: Scalar, x: str, alpha: float, beta: float) -> str:
    return f"{s.helper('clamp')}({s.lit(alpha)} * {x} + {s.lit(beta)}, {s.lit(0)}, {s.lit(1)})"


@elementwise_op("hard_sigmoid")
def hard_sigmoid(s: Scalar, a: Sequence[str]) -> str:
    return _hard_sigmoid(s, a[0], float(s.attrs["alpha"]), float(s.attrs["beta"]))


@elementwise_op("hard_swish")
def hard_swish(s: Scalar, a: Sequence[str]) -> str:
    return f"({a[0]} * {_hard_sigmoid(s, a[0], 1 / 6, 0.5)})"


@elementwise_op("softplus")
def softplus(s: Scalar, a: Sequence[str]) -> str:
    return f"{s.helper('softplus')}({a[0]})"


@elementwise_op("softsign")
def softsign(s: Scalar, a: Sequence[str]) -> str:
    return f"({a[0]} / ({s.lit(1)} + {s.fn('fabs')}({a[0]})))"


@elementwise_op("mish")
def mish(s: Scalar, a: Sequence[str]) -> str:
    tanh = "tanh" if s.is_double else "cuvil_tanh_f"
    return f"({a[0]} * {tanh}({softplus(s, a)}))"


@elementwise_op("gelu")
def gelu(s: Scalar, a: Sequence[str]) -> str:
    """X * Phi(X), written as sigmoid / erfc so that large negative X does not cancel.

    In float, both forms are the branch-free functions of ``cuvil_vmath.h``, so a loop over them
    (an elementwise kernel, a fused loop, a GEMM epilogue) vectorises."""
    x = a[0]
    if s.attrs.get("approximate", "none") == "tanh":
        u = f"{s.lit(2 * _SQRT_2_OVER_PI)} * ({x} + {s.lit(0.044715)} * ({x} * {x} * {x}))"
        return f"({x} * {_sigmoid(s, u)})"
    if not s.is_double:
        return f"cuvil_gelu_f({x})"
    return f"({s.lit(0.5)} * {x} * {s.fn('erfc')}(-{x} / {s.lit(math.sqrt(2.0))}))"


@elementwise_op("shrink")
def shrink(s: Scalar, a: Sequence[str]) -> str:
    """X < -lambd ? X + bias : X > lambd ? X - bias : 0; integers compute in double, then truncate."""
    lambd, bias = float(s.attrs["lambd"]), float(s.attrs["bias"])
    if is_float(s):
        x, lo, hi, b, zero = a[0], s.lit(-lambd), s.lit(lambd), s.lit(bias), s.lit(0)
        return f"({x} < {lo} ? {x} + {b} : ({x} > {hi} ? {x} - {b} : {zero}))"
    x = f"(double){a[0]}"
    lo, hi, b = c_float(-lambd, ""), c_float(lambd, ""), c_float(bias, "")
    return f"cuvil_f2i_{s.dtype.value}({x} < {lo} ? {x} + {b} : ({x} > {hi} ? {x} - {b} : 0.0))"


@elementwise_op("prelu")
def prelu(s: Scalar, a: Sequence[str]) -> str:
    """X < 0 ? X * slope : X (the kernel checks that slope broadcasts to X)."""
    x = a[0]
    if not is_float(s) and s.dtype not in SIGNED_INTS:
        return x
    return f"({x} < 0 ? {wrapping(s, '*', x, a[1])} : {x})"


@kernel("clip")
def _clip(k: KernelCtx) -> None:
    """min(max(X, lo), hi); the bounds, one-element tensors, are read once (elementwise); NaN propagates."""
    k.include(MATH_HEADER)
    ins = [k.inp(0)]
    at: dict[int, int] = {}  # bound (1: lo, 2: hi) -> its operand in ins
    for i in (1, 2):
        if k.has(i):
            at[i] = len(ins)
            ins.append(k.inp(i))
    s = scalar_ctx(k)
    not_nan = {i: constant_not_nan(k.node.inputs[i]) for i in at}

    def expr(args: Sequence[str]) -> str:
        y = args[0]
        if 1 in at:
            y = nan_max(s, y, args[at[1]], not_nan[1])
        if 2 in at:
            y = nan_min(s, y, args[at[2]], not_nan[2])
        return y

    elementwise(k, expr, ins)

