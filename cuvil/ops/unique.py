"""``unique`` (ONNX Unique-11): the distinct elements, or distinct slices along ``axis``, of a tensor.

Outputs: ``Y``, the distinct values (flattened input) or slices (the input with ``axis`` cut to
them); ``indices``, where each first occurs; ``inverse_indices``, for every element (or slice)
of the input, the position of its value in ``Y``; ``counts``, how often each occurs.  ``sorted=1``
(the default) orders ``Y`` ascending (slices lexicographically, in the flattened order of their
elements); ``sorted=0`` by first occurrence.  NaNs are equal to each other and sort last; a
value and slice of ``Y`` is the one at its first occurrence (``-0.0`` or ``0.0``, whichever
comes first).  Every output's length but ``inverse_indices``' is known only at run time.
"""

from __future__ import annotations

import numpy as np

from cuvil.ir.dtypes import NUMERIC, DType
from cuvil.ir.symbolic import UNKNOWN, product
from cuvil.ir.types import TensorType
from cuvil.ops.common import normalize_axis
from cuvil.ops.registry import AttrSpec, InferCtx, OpDef, RefCtx, register


def _infer(ctx: InferCtx) -> list[TensorType]:
    x = ctx.type(0)
    ctx.require_dtype(0, NUMERIC | {DType.bool})
    if ctx.attrs["sorted"] not in (0, 1):
        raise ctx.fail(f"sorted must be 0 or 1, got {ctx.attrs['sorted']}")
    axis = ctx.attrs["axis"]
    if axis is None:
        y = TensorType(x.dtype, (UNKNOWN,))
        inverse = TensorType(DType.i64, (product(x.shape),))
    else:
        if x.rank == 0:
            raise ctx.fail("a scalar has no axis to take slices along")
        a = normalize_axis(ctx.op, int(axis), x.rank)
        y = TensorType(x.dtype, (*x.shape[:a], UNKNOWN, *x.shape[a + 1 :]))
        inverse = TensorType(DType.i64, (x.shape[a],))
    n = TensorType(DType.i64, (UNKNOWN,))
    return [y, n, inverse, n]


def _reference(ctx: RefCtx) -> list[np.ndarray]:
    x = ctx.input(0)
    axis = ctx.attrs["axis"]
    if axis is None:
        rows = x.reshape(-1, 1)
    else:
        a = normalize_axis(ctx.op, int(axis), x.ndim)
        rows = np.moveaxis(x, a, 0).reshape(x.shape[a], -1)
    n = rows.shape[0]
    order = sorted(range(n), key=lambda i: tuple(_key(v) for v in rows[i]))  # stable: ties by first occurrence
    groups: list[list[int]] = []
    for i in order:
        if groups and all(_same(p, q) for p, q in zip(rows[groups[-1][0]], rows[i])):
            groups[-1].append(i)
        else:
            groups.append([i])
    if not ctx.attrs["sorted"]:
        groups.sort(key=lambda g: g[0])
    first = np.array([g[0] for g in groups], dtype=np.int64)
    counts = np.array([len(g) for g in groups], dtype=np.int64)
    inverse = np.zeros(n, dtype=np.int64)
    for j, g in enumerate(groups):
        inverse[g] = j
    y = x.reshape(-1)[first] if axis is None else np.take(x, first, axis=normalize_axis(ctx.op, int(axis), x.ndim))
    return [y, first, inverse, counts]


def _key(v: object) -> tuple[int, object]:
    """A sort key: numbers ascending, NaN after every number."""
    f = v.item() if isinstance(v, np.generic) else v
    return (1, 0) if isinstance(f, float) and f != f else (0, f)


def _same(a: object, b: object) -> bool:
    return bool(a == b) or bool(a != a and b != b)


register(
    OpDef(
        name="unique",
        inputs=("X",),
        outputs=("Y", "indices", "inverse_indices", "counts"),
        attrs={"axis": AttrSpec("int", None), "sorted": AttrSpec("int", 1)},
        infer=_infer,
        reference=_reference,
        doc="The distinct elements (or slices along `axis`) of X, where they first occur, the inverse map "
        "and the counts (ONNX Unique); sorted or in order of first occurrence.",
    )
)
