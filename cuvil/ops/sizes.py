"""Symbolic evaluation of size arithmetic: what ``shape(x)``-derived tensors hold.

Exported models compute shapes with ops (``Shape -> Gather -> Concat ->
Reshape``, ``sym_size -> mul -> view``).  Each op here gets a ``sym_eval``
that gives its output's contents as dims when its inputs' are known, so
``reshape(x, concat(shape(x)[0:1], [2, -1]))`` infers ``[batch, 2, ...]``
instead of unknown dims.  Only small 0-D/1-D integer tensors carry such
values (``Value.sym_value``); they are derived, never stored in the IR.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence

from cuvil.ir.dtypes import INTS
from cuvil.ir.symbolic import Dim, floordiv, product
from cuvil.ops.registry import InferCtx, get, register

MAX_ELEMENTS = 16
SymOut = Sequence[tuple[Dim, ...] | None]


def _attach(op: str, fn: Callable[[InferCtx], SymOut]) -> None:
    register(dataclasses.replace(get(op), sym_eval=fn), replace=True)


def _small_int(ctx: InferCtx, i: int) -> bool:
    t = ctx.type(i)
    return t.dtype in INTS and t.rank <= 1


def _shape(ctx: InferCtx) -> SymOut:
    dims = ctx.type(0).shape
    rank = len(dims)
    start = ctx.attrs.get("start", 0) or 0
    end = ctx.attrs.get("end")
    start = max(0, min(rank, start + rank if start < 0 else start))
    stop = rank if end is None else max(0, min(rank, end + rank if end < 0 else end))
    return [tuple(dims[start:stop])]


def _size(ctx: InferCtx) -> SymOut:
    return [(product(ctx.type(0).shape),)]


def _same(ctx: InferCtx) -> SymOut:
    if not _small_int(ctx, 0):
        return [None]
    return [ctx.sym_value(0)]


def _cast(ctx: InferCtx) -> SymOut:
    to = ctx.attrs.get("to")
    if not _small_int(ctx, 0) or getattr(to, "is_int", False) is not True:
        return [None]
    return [ctx.sym_value(0)]


def _concat(ctx: InferCtx) -> SymOut:
    out: list[Dim] = []
    for i in range(len(ctx.types)):
        if not ctx.has(i) or ctx.type(i).rank != 1:
            return [None]
        v = ctx.sym_value(i)
        if v is None:
            return [None]
        out.extend(v)
    return [tuple(out)] if len(out) <= MAX_ELEMENTS else [None]


def _gather(ctx: InferCtx) -> SymOut:
    data, idx = ctx.sym_value(0), ctx.const(1)
    if data is None or idx is None or ctx.type(0).rank != 1 or idx.ndim > 1 or ctx.attrs.get("axis", 0) not in (0, -1):
        return [None]
    n = len(data)
    picked = []
    for k in idx.reshape(-1):
        k = int(k)
        if not -n <= k < n:
            return [None]
        picked.append(data[k])
    return [tuple(picked)]


def _slice(ctx: InferCtx) -> SymOut:
    data = ctx.sym_value(0)
    if data is None or ctx.type(0).rank != 1:
        return [None]
    parts = [ctx.const(i) if ctx.has(i) else None for i in range(1, 5)]
    starts, ends, axes, steps = parts
    if starts is None or ends is None or starts.size != 1 or ends.size != 1:
        return [None]
    if axes is not None and int(axes.reshape(-1)[0]) not in (0, -1):
        return [None]
    step = int(steps.reshape(-1)[0]) if steps is not None else 1
    if step == 0:
        return [None]
    n = len(data)
    lo, hi = int(starts.reshape(-1)[0]), int(ends.reshape(-1)[0])
    lo, hi = max(-n - 1, min(n + 1, lo)), max(-n - 1, min(n + 1, hi))  # INT64_MAX ends clamp like Python
    return [tuple(data[lo:hi:step])]


def _reshape_like(ctx: InferCtx) -> SymOut:
    """squeeze / unsqueeze / reshape / flatten of a size vector keep its contents."""
    if not _small_int(ctx, 0):
        return [None]
    return [ctx.sym_value(0)]


def _binary(fn: Callable[[Dim, Dim], Dim | None]) -> Callable[[InferCtx], SymOut]:
    def ev(ctx: InferCtx) -> SymOut:
        if not (_small_int(ctx, 0) and _small_int(ctx, 1)):
            return [None]
        a, b = ctx.sym_value(0), ctx.sym_value(1)
        if a is None or b is None:
            return [None]
        if len(a) == 1 and len(b) != 1:
            a = a * len(b)
        if len(b) == 1 and len(a) != 1:
            b = b * len(a)
        if len(a) != len(b):
            return [None]
        out = [fn(x, y) for x, y in zip(a, b)]
        return [None] if any(o is None for o in out) else [tuple(o for o in out if o is not None)]

    return ev


def _div(a: Dim, b: Dim) -> Dim | None:
    # sizes are not negative, so truncating and floor division agree when the divisor is positive
    if isinstance(b, int) and b > 0 and (not isinstance(a, int) or a >= 0):
        return floordiv(a, b)
    if isinstance(a, int) and isinstance(b, int) and b != 0:
        q = abs(a) // abs(b)
        return q if (a >= 0) == (b > 0) else -q
    return None


_attach("shape", _shape)
_attach("size", _size)
_attach("identity", _same)
_attach("cast", _cast)
_attach("concat", _concat)
_attach("gather", _gather)
_attach("slice", _slice)
for _op in ("squeeze", "unsqueeze", "reshape", "flatten"):
    _attach(_op, _reshape_like)
_attach("add", _binary(lambda a, b: a + b))
_attach("sub", _binary(lambda a, b: a - b))
_attach("mul", _binary(lambda a, b: a * b))
_attach("div", _binary(_div))
