"""Normalization ops: ``batch_norm`` (inference), ``instance_norm``, ``layer_norm``, ``group_norm``
and ``lp_normalization``.

Statistics are computed in float32 for half-precision inputs (in the
``stash_type`` precision for ``layer_norm``/``group_norm``, as ONNX defines),
and the result is rounded to the input's type once.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from cuvil.ir.dtypes import FLOATS, DType
from cuvil.ir.symbolic import Dim
from cuvil.ir.types import TensorType
from cuvil.ops.common import normalize_axis
from cuvil.ops.registry import AttrSpec, InferCtx, OpDef, RefCtx, register


def _compute_dtype(dt: np.dtype) -> np.dtype:
    return np.dtype(np.float64) if dt == np.float64 else np.dtype(np.float32)


def _dims_match(a: Dim, b: Dim) -> bool:
    """False only when two dims are provably different (symbolic dims may be equal at run time)."""
    return a == b or not (isinstance(a, int) and isinstance(b, int))


def _require_shape(ctx: InferCtx, i: int, what: str, want: Sequence[Dim]) -> None:
    t = ctx.type(i)
    if t.rank != len(want) or not all(_dims_match(a, b) for a, b in zip(t.shape, want)):
        raise ctx.fail(f"{what} must have shape [{', '.join(map(str, want))}], got {t}")
    for j, (a, b) in enumerate(zip(t.shape, want)):
        ctx.assume_equal(a, b, f"{what}'s dim {j} and the dim it normalizes")


def _require_unidirectional(ctx: InferCtx, i: int, what: str, target: Sequence[Dim]) -> None:
    """Input ``i`` must broadcast to ``target`` without changing it."""
    t = ctx.type(i)
    tail = list(target[len(target) - t.rank :]) if t.rank <= len(target) else None
    if tail is None or not all(d == 1 or _dims_match(d, e) for d, e in zip(t.shape, tail)):
        raise ctx.fail(f"{what} of type {t} does not broadcast to [{', '.join(map(str, target))}]")
    for j, (d, e) in enumerate(zip(t.shape, tail)):
        ctx.assume_broadcast_to(d, e, f"{what}'s dim {j} and the input's dim {j + len(target) - t.rank}")


# batch_norm ---------------------------------------------------------------------------


def _batch_norm_infer(ctx: InferCtx) -> list[TensorType]:
    for i in range(5):
        ctx.require_dtype(i, FLOATS)
    t = ctx.type(0)
    if t.rank < 2:
        raise ctx.fail(f"input must have rank >= 2 (N, C, ...), got {t}")
    names = ("scale", "B", "mean", "var")
    per_activation = ctx.type(1).rank == t.rank - 1 and t.rank > 2
    want = t.shape[1:] if per_activation else (t.shape[1],)
    for i, what in enumerate(names, start=1):
        _require_shape(ctx, i, what, want)
    return [t]


def _batch_norm_ref(ctx: RefCtx) -> list[np.ndarray]:
    x = ctx.input(0)
    cdt = _compute_dtype(x.dtype)
    scale, bias, mean, var = (ctx.input(i).astype(cdt) for i in range(1, 5))
    if scale.ndim == 1:  # per channel: broadcast over the spatial dims
        shape = (-1,) + (1,) * (x.ndim - 2)
        scale, bias, mean, var = (p.reshape(shape) for p in (scale, bias, mean, var))
    inv = 1.0 / np.sqrt(var + np.asarray(ctx.attrs["epsilon"], cdt))
    y = (x.astype(cdt) - mean) * (inv * scale) + bias
    return [y.astype(ctx.out_dtype())]


register(
    OpDef(
        name="batch_norm",
        inputs=("X", "scale", "B", "mean", "var"),
        attrs={"epsilon": AttrSpec("float", 1e-5)},
        infer=_batch_norm_infer,
        reference=_batch_norm_ref,
        doc="Inference-mode batch normalization: (X - mean) / sqrt(var + epsilon) * scale + B. The parameters "
        "are per channel ([C]) or, as ONNX's old spatial=0 form, per activation ([C, D1, ..., Dn]).",
    )
)


# instance_norm -----------------------------------------------------------------------


def _instance_norm_infer(ctx: InferCtx) -> list[TensorType]:
    for i in range(3):
        ctx.require_dtype(i, FLOATS)
    t = ctx.type(0)
    if t.rank < 3:
        raise ctx.fail(f"input must have rank >= 3 (N, C, D1, ...), got {t}")
    _require_shape(ctx, 1, "scale", (t.shape[1],))
    _require_shape(ctx, 2, "B", (t.shape[1],))
    return [t]


def _standardize(x: np.ndarray, axes: tuple[int, ...], epsilon: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(x - mean) * inv_std over ``axes`` (population variance), with mean and inv_std kept as dims."""
    mean = np.mean(x, axis=axes, keepdims=True)
    d = x - mean
    var = np.mean(d * d, axis=axes, keepdims=True)
    inv_std = 1.0 / np.sqrt(var + np.asarray(epsilon, x.dtype))
    return d * inv_std, mean, inv_std


def _instance_norm_ref(ctx: RefCtx) -> list[np.ndarray]:
    x = ctx.input(0)
    cdt = _compute_dtype(x.dtype)
    norm, _, _ = _standardize(x.astype(cdt), tuple(range(2, x.ndim)), ctx.attrs["epsilon"])
    shape = (-1,) + (1,) * (x.ndim - 2)
    y = norm * ctx.input(1).astype(cdt).reshape(shape) + ctx.input(2).astype(cdt).reshape(shape)
    return [y.astype(ctx.out_dtype())]


register(
    OpDef(
        name="instance_norm",
        inputs=("input", "scale", "B"),
        attrs={"epsilon": AttrSpec("float", 1e-5)},
        infer=_instance_norm_infer,
        reference=_instance_norm_ref,
        doc="Normalizes each (instance, channel) over its spatial dims, then scale[C] and B[C].",
    )
)


# layer_norm --------------------------------------------------------------------------


def _stash(ctx: InferCtx) -> DType:
    st = ctx.attrs["stash_type"]
    if not isinstance(st, DType) or st not in FLOATS:
        raise ctx.fail(f"stash_type must be a float element type, got {st}")
    return st


def _layer_norm_infer(ctx: InferCtx) -> list[TensorType]:
    ctx.require_dtype(0, FLOATS)
    ctx.require_dtype(1, FLOATS)
    t = ctx.type(0)
    if t.rank == 0:
        raise ctx.fail("input must have rank >= 1")
    axis = normalize_axis(ctx.op, ctx.attrs["axis"], t.rank)
    _require_unidirectional(ctx, 1, "Scale", t.shape)
    if ctx.has(2):
        ctx.require_dtype(2, FLOATS)
        _require_unidirectional(ctx, 2, "B", t.shape)
    stash = _stash(ctx)
    stats = TensorType(stash, t.shape[:axis] + (1,) * (t.rank - axis))
    return [t, stats, stats]


def _layer_norm_ref(ctx: RefCtx) -> list[np.ndarray]:
    x = ctx.input(0)
    axis = normalize_axis(ctx.op, ctx.attrs["axis"], x.ndim)
    stash = ctx.attrs["stash_type"].np
    norm, mean, inv_std = _standardize(x.astype(stash), tuple(range(axis, x.ndim)), ctx.attrs["epsilon"])
    # As ONNX's definition: the standardized value is cast back to X's type before the affine step.
    y = norm.astype(x.dtype) * ctx.input(1).astype(x.dtype)
    if ctx.has(2):
        y = y + ctx.input(2).astype(x.dtype)
    return [y.astype(ctx.out_dtype(0)), mean.astype(stash), inv_std.astype(stash)]


register(
    OpDef(
        name="layer_norm",
        inputs=("X", "Scale", "B?"),
        outputs=("Y", "Mean?", "InvStdDev?"),
        attrs={
            "axis": AttrSpec("int", -1),
            "epsilon": AttrSpec("float", 1e-5),
            "stash_type": AttrSpec("dtype", DType.f32),
        },
        infer=_layer_norm_infer,
        reference=_layer_norm_ref,
        doc="Normalizes over the axes from axis to the last (statistics in stash_type), then * Scale + B "
        "(both broadcast to X). Mean and InvStdDev keep the normalized axes as size 1.",
    )
)


# group_norm --------------------------------------------------------------------------


def _group_norm_infer(ctx: InferCtx) -> list[TensorType]:
    for i in range(3):
        ctx.require_dtype(i, FLOATS)
    t = ctx.type(0)
    if t.rank < 2:
        raise ctx.fail(f"input must have rank >= 2 (N, C, ...), got {t}")
    groups = ctx.attrs["num_groups"]
    if groups <= 0:
        raise ctx.fail(f"num_groups must be positive, got {groups}")
    c = t.shape[1]
    if isinstance(c, int) and c % groups:
        raise ctx.fail(f"num_groups={groups} does not divide the {c} channels")
    _require_shape(ctx, 1, "scale", (c,))
    _require_shape(ctx, 2, "bias", (c,))
    _stash(ctx)
    return [t]


def _group_norm_ref(ctx: RefCtx) -> list[np.ndarray]:
    x = ctx.input(0)
    n, c = x.shape[:2]
    groups = ctx.attrs["num_groups"]
    if c % groups:
        raise ValueError(f"group_norm: num_groups={groups} does not divide the {c} channels")
    stash = ctx.attrs["stash_type"].np
    per_group = (c // groups) * int(np.prod(x.shape[2:], dtype=np.int64))
    grouped = x.astype(stash).reshape(n, groups, per_group)
    norm, _, _ = _standardize(grouped, (2,), ctx.attrs["epsilon"])
    shape = (-1,) + (1,) * (x.ndim - 2)
    y = norm.reshape(x.shape).astype(x.dtype) * ctx.input(1).astype(x.dtype).reshape(shape)
    y = y + ctx.input(2).astype(x.dtype).reshape(shape)
    return [y.astype(ctx.out_dtype())]


register(
    OpDef(
        name="group_norm",
        inputs=("X", "scale", "bias"),
        attrs={
            "epsilon": AttrSpec("float", 1e-5),
            "num_groups": AttrSpec("int"),
            "stash_type": AttrSpec("dtype", DType.f32),
        },
        infer=_group_norm_infer,
        reference=_group_norm_ref,
        doc="Normalizes each group of C/num_groups channels per instance (statistics in stash_type), then "
        "scale[C] and bias[C] per channel (ONNX opset 21 semantics).",
    )
)


# lp_normalization ----------------------------------------------------------------------


def _lp_infer(ctx: InferCtx) -> list[TensorType]:
    ctx.require_dtype(0, FLOATS)
    t = ctx.type(0)
    if t.rank == 0:
        raise ctx.fail("input must have rank >= 1")
    normalize_axis(ctx.op, ctx.attrs["axis"], t.rank)
    if ctx.attrs["p"] not in (1, 2):
        raise ctx.fail(f"p must be 1 or 2, got {ctx.attrs['p']}")
    return [t]


def _lp_ref(ctx: RefCtx) -> list[np.ndarray]:
    x = ctx.input(0)
    axis = normalize_axis(ctx.op, ctx.attrs["axis"], x.ndim)
    xa = x.astype(_compute_dtype(x.dtype))
    if ctx.attrs["p"] == 1:
        norm = np.sum(np.abs(xa), axis=axis, keepdims=True)
    else:
        norm = np.sqrt(np.sum(xa * xa, axis=axis, keepdims=True))
    # A zero norm gives 0 rather than 0/0.
    with np.errstate(invalid="ignore", divide="ignore"):
        y = np.where(norm == 0, 0, xa / norm)
    return [y.astype(ctx.out_dtype())]


register(
    OpDef(
        name="lp_normalization",
        inputs=("input",),
        outputs=("output",),
        attrs={"axis": AttrSpec("int", -1), "p": AttrSpec("int", 2)},
        infer=_lp_infer,
        reference=_lp_ref,
        doc="x / ||x||_p along axis (p = 1 or 2); a zero norm gives 0.",
    )
)
