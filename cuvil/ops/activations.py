"""Activation functions: the ReLU family, sigmoids, GELU, soft functions, shrink and clip.

Each op's math is one small function of NumPy arrays (float16/bfloat16 are
computed in float32 by the factories of ``elementwise.py``); attributes keep
ONNX's names and defaults.
"""

from __future__ import annotations

import math

import numpy as np

from cuvil.ir.dtypes import FLOATS, NUMERIC, SIGNED_INTS
from cuvil.ir.symbolic import is_static
from cuvil.ir.types import TensorType
from cuvil.ops.elementwise import erfc, unary, widen
from cuvil.ops.registry import ELEMENTWISE, AttrSpec, InferCtx, OpDef, RefCtx, register

_SELU_ALPHA = 1.67326319217681884765625
_SELU_GAMMA = 1.05070102214813232421875
_SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)


def _zero(x: np.ndarray) -> np.ndarray:
    return np.zeros((), x.dtype)


def _relu(x: np.ndarray) -> np.ndarray:
    return np.asarray(np.maximum(x, _zero(x)))


def _leaky_relu(x: np.ndarray, *, alpha: float) -> np.ndarray:
    return np.where(x < 0, alpha * x, x)


def _prelu(x: np.ndarray, slope: np.ndarray) -> np.ndarray:
    return np.where(x < 0, x * slope, x)


def _elu(x: np.ndarray, *, alpha: float) -> np.ndarray:
    return np.where(x < 0, alpha * np.expm1(x), x)


def _celu(x: np.ndarray, *, alpha: float) -> np.ndarray:
    return np.asarray(np.maximum(x, _zero(x)) + np.minimum(_zero(x), alpha * np.expm1(x / alpha)))


def _selu(x: np.ndarray, *, alpha: float, gamma: float) -> np.ndarray:
    return gamma * np.where(x > 0, x, alpha * np.expm1(x))


def _thresholded_relu(x: np.ndarray, *, alpha: float) -> np.ndarray:
    return np.where(x > alpha, x, _zero(x))


def _sigmoid(x: np.ndarray) -> np.ndarray:
    # each branch only exponentiates non-positive numbers, so neither overflows where it is used
    e = np.exp(-np.abs(x))
    return np.asarray(np.where(x >= 0, 1 / (1 + e), e / (1 + e)))


def _hard_sigmoid(x: np.ndarray, *, alpha: float, beta: float) -> np.ndarray:
    return np.clip(alpha * x + beta, 0, 1)


def _hard_swish(x: np.ndarray) -> np.ndarray:
    return np.asarray(x * _hard_sigmoid(x, alpha=1 / 6, beta=0.5))


def _softplus(x: np.ndarray) -> np.ndarray:
    return np.asarray(np.logaddexp(_zero(x), x))  # log(1 + exp(x)) without overflow for large x


def _softsign(x: np.ndarray) -> np.ndarray:
    return np.asarray(x / (1 + np.abs(x)))


def _mish(x: np.ndarray) -> np.ndarray:
    return np.asarray(x * np.tanh(_softplus(x)))


def _gelu(x: np.ndarray, *, approximate: str) -> np.ndarray:
    # Written without 1 + tanh(u) or 1 + erf(u), which cancel for large negative X:
    # 0.5*(1 + tanh(u)) = sigmoid(2u) and 0.5*(1 + erf(v)) = 0.5*erfc(-v).
    if approximate == "tanh":
        return np.asarray(x * _sigmoid(2 * _SQRT_2_OVER_PI * (x + 0.044715 * x**3)))
    return np.asarray(0.5 * x * erfc(-x / math.sqrt(2.0)), dtype=x.dtype)


def _validate_gelu(ctx: InferCtx) -> None:
    if ctx.attrs["approximate"] not in ("none", "tanh"):
        raise ctx.fail(f"approximate must be 'none' or 'tanh', got {ctx.attrs['approximate']!r}")


def _shrink(x: np.ndarray, *, bias: float, lambd: float) -> np.ndarray:
    return np.where(x < -lambd, x + bias, np.where(x > lambd, x - bias, 0))


def _validate_celu(ctx: InferCtx) -> None:
    if ctx.attrs["alpha"] == 0:
        raise ctx.fail("alpha must be nonzero (it divides X)")


def _validate_shrink(ctx: InferCtx) -> None:
    if ctx.attrs["lambd"] < 0:
        raise ctx.fail(f"lambd must be non-negative, got {ctx.attrs['lambd']}")


def _alpha(default: float) -> dict[str, AttrSpec]:
    return {"alpha": AttrSpec("float", default)}


unary("relu", _relu, dtypes=FLOATS | SIGNED_INTS, doc="max(X, 0)")
unary("leaky_relu", _leaky_relu, attrs=_alpha(0.01), doc="X < 0 ? alpha*X : X")
unary("elu", _elu, attrs=_alpha(1.0), doc="X < 0 ? alpha*(exp(X)-1) : X")
unary("celu", _celu, attrs=_alpha(1.0), validate=_validate_celu, doc="max(0,X) + min(0, alpha*(exp(X/alpha)-1))")
unary(
    "selu",
    _selu,
    attrs={"alpha": AttrSpec("float", _SELU_ALPHA), "gamma": AttrSpec("float", _SELU_GAMMA)},
    doc="gamma * (X > 0 ? X : alpha*(exp(X)-1))",
)
unary("thresholded_relu", _thresholded_relu, attrs=_alpha(1.0), doc="X > alpha ? X : 0")
unary("sigmoid", _sigmoid, doc="1 / (1 + exp(-X))")
unary(
    "hard_sigmoid",
    _hard_sigmoid,
    attrs={"alpha": AttrSpec("float", 0.2), "beta": AttrSpec("float", 0.5)},
    doc="max(0, min(1, alpha*X + beta))",
)
unary("hard_swish", _hard_swish, doc="X * max(0, min(1, X/6 + 1/2))")
unary("softplus", _softplus, doc="log(1 + exp(X))")
unary("softsign", _softsign, doc="X / (1 + |X|)")
unary("mish", _mish, doc="X * tanh(softplus(X))")
unary(
    "gelu",
    _gelu,
    attrs={"approximate": AttrSpec("str", "none")},
    validate=_validate_gelu,
    doc="X * Phi(X) with the exact normal CDF, or its tanh approximation (approximate='tanh')",
)
unary(
    "shrink",
    _shrink,
    dtypes=NUMERIC,
    attrs={"bias": AttrSpec("float", 0.0), "lambd": AttrSpec("float", 0.5)},
    validate=_validate_shrink,
    doc="X < -lambd ? X+bias : X > lambd ? X-bias : 0",
)


def _prelu_infer(ctx: InferCtx) -> list[TensorType]:
    """slope must broadcast to X's shape: each of its trailing-aligned dims is 1 or X's dim.

    A symbolic dim against another dim cannot be decided here; the output is X's shape either way."""
    ctx.same_dtype(0, 1)
    ctx.require_dtype(0, NUMERIC)
    x, slope = ctx.type(0), ctx.type(1)
    aligned = zip(x.shape[x.rank - slope.rank :], slope.shape)
    if slope.rank > x.rank or any(is_static(dx) and is_static(ds) and ds not in (1, dx) for dx, ds in aligned):
        raise ctx.fail(f"slope {slope} must broadcast to the shape of X {x}")
    return [x]


def _prelu_ref(ctx: RefCtx) -> list[np.ndarray]:
    y = _prelu(widen(ctx.input(0)), widen(ctx.input(1)))
    return [np.asarray(y).astype(ctx.out_dtype(), copy=False)]


register(
    OpDef(
        name="prelu",
        inputs=("X", "slope"),
        infer=_prelu_infer,
        reference=_prelu_ref,
        traits=frozenset({ELEMENTWISE}),
        doc="X < 0 ? slope*X : X; slope broadcasts to X's shape (unidirectionally).",
    )
)


# clip -------------------------------------------------------------------------


def _clip_infer(ctx: InferCtx) -> list[TensorType]:
    dt = ctx.require_dtype(0, NUMERIC)
    for i, what in ((1, "min"), (2, "max")):
        if not ctx.has(i):
            continue
        t = ctx.type(i)
        if t.dtype != dt:
            raise ctx.fail(f"{what} has element type {t.dtype}, X has {dt}")
        if t.shape not in ((), (1,)):
            raise ctx.fail(f"{what} must be a scalar, got shape {t}")
    return [ctx.type(0)]


def _clip(x: np.ndarray, lo: np.ndarray | None, hi: np.ndarray | None) -> np.ndarray:
    """min(max(X, lo), hi): when lo > hi every element becomes hi, as ONNX specifies."""
    if lo is not None:
        x = np.maximum(x, lo.reshape(()))
    if hi is not None:
        x = np.minimum(x, hi.reshape(()))
    return x


def _clip_ref(ctx: RefCtx) -> list[np.ndarray]:
    bounds = [widen(ctx.input(i)) if ctx.has(i) else None for i in (1, 2)]
    y = _clip(widen(ctx.input(0)), *bounds)
    return [np.asarray(y).astype(ctx.out_dtype(), copy=False)]


register(
    OpDef(
        name="clip",
        inputs=("X", "min?", "max?"),
        infer=_clip_infer,
        reference=_clip_ref,
        traits=frozenset({ELEMENTWISE}),
        doc="Limit X to [min, max]; an omitted bound does not limit.",
    )
)
