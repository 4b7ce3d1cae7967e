"""The softmax family: ``softmax``, ``log_softmax`` and ``hardmax``.

Each normalizes along ``axis`` (ONNX opset 13+ semantics, default -1).  With
``coerce_2d=1`` the op instead normalizes jointly over every axis from
``axis`` to the last, which is what ONNX opsets 1-12 define (they view the
input as a 2-D matrix ``[prod(shape[:axis]), prod(shape[axis:])]`` and
normalize its rows); the importer sets it for those opsets.

Half-precision floats are computed in float32 and rounded once.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from cuvil.ir.dtypes import FLOATS
from cuvil.ir.types import TensorType
from cuvil.ops.common import normalize_axis
from cuvil.ops.registry import AttrSpec, InferCtx, OpDef, RefCtx, register


def _infer(ctx: InferCtx) -> list[TensorType]:
    ctx.require_dtype(0, FLOATS)
    t = ctx.type(0)
    if t.rank == 0:
        raise ctx.fail("input must have rank >= 1")
    normalize_axis(ctx.op, ctx.attrs["axis"], t.rank)
    if ctx.attrs["coerce_2d"] not in (0, 1):
        raise ctx.fail(f"coerce_2d must be 0 or 1, got {ctx.attrs['coerce_2d']}")
    return [t]


def _axes(ctx: RefCtx, rank: int) -> tuple[int, ...]:
    axis = normalize_axis(ctx.op, ctx.attrs["axis"], rank)
    return tuple(range(axis, rank)) if ctx.attrs["coerce_2d"] else (axis,)


def _softmax(x: np.ndarray, axes: tuple[int, ...]) -> np.ndarray:
    shifted = x - np.max(x, axis=axes, keepdims=True)
    e = np.exp(shifted)
    return np.asarray(e / np.sum(e, axis=axes, keepdims=True))


def _log_softmax(x: np.ndarray, axes: tuple[int, ...]) -> np.ndarray:
    shifted = x - np.max(x, axis=axes, keepdims=True)
    return np.asarray(shifted - np.log(np.sum(np.exp(shifted), axis=axes, keepdims=True)))


def _hardmax(x: np.ndarray, axes: tuple[int, ...]) -> np.ndarray:
    # View the normalized axes (contiguous and trailing, or a single axis) as one, and mark the
    # first maximum along it.
    moved = np.moveaxis(x, axes[0], -1) if len(axes) == 1 else x
    lead = moved.shape[: moved.ndim - (1 if len(axes) == 1 else len(axes))]
    flat = moved.reshape(*lead, int(np.prod(moved.shape[len(lead):], dtype=np.int64)))
    out = np.zeros_like(flat)
    if flat.shape[-1]:
        np.put_along_axis(out, np.argmax(flat, axis=-1)[..., None], 1, axis=-1)
    out = out.reshape(moved.shape)
    return np.moveaxis(out, -1, axes[0]) if len(axes) == 1 else out


def _ref(fn: Callable[[np.ndarray, tuple[int, ...]], np.ndarray]) -> Callable[[RefCtx], list[np.ndarray]]:
    def ref(ctx: RefCtx) -> list[np.ndarray]:
        x = ctx.input(0)
        xa = x.astype(np.float32) if x.dtype.itemsize < 4 else x
        with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
            y = fn(xa, _axes(ctx, x.ndim))
        return [np.asarray(y).astype(ctx.out_dtype(), copy=False)]

    return ref


_ATTRS = {"axis": AttrSpec("int", -1), "coerce_2d": AttrSpec("int", 0)}
for _name, _fn, _doc in (
    ("softmax", _softmax, "exp(x) / sum(exp(x)) along axis."),
    ("log_softmax", _log_softmax, "x - log(sum(exp(x))) along axis."),
    ("hardmax", _hardmax, "1 at the first maximum along axis, 0 elsewhere."),
):
    register(
        OpDef(
            name=_name,
            inputs=("input",),
            outputs=("output",),
            attrs=_ATTRS,
            infer=_infer,
            reference=_ref(_fn),
            doc=_doc + " With coerce_2d=1, jointly over the axes from axis to the last (ONNX opsets < 13).",
        )
    )
