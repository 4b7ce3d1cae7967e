"""A small vocabulary for importers that write an ONNX op as Cuvil arithmetic.

:class:`Arith` wraps an :class:`ImportCtx` with one method per Cuvil op the
decompositions use (``add``, ``where``, ``gather_nd`` ...).  Python numbers
become constants of the working element type, so a formula reads as one:
``a.div(a.sub(a.mul(a.add(g, 1), size), 1), 2)``.  Every node goes through
``ctx.emit``, so a sub-expression whose operands are constants (shapes that
are static, attribute values) is folded at import.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from cuvil.frontends.onnx.importer import ImportCtx
from cuvil.ir.dtypes import DType
from cuvil.ir.graph import Value

Operand = Value | float | int


class Arith:
    """Cuvil ops on values, with numbers as constants of ``dtype`` (integers: int64 where asked)."""

    def __init__(self, ctx: ImportCtx, dtype: DType) -> None:
        self.ctx = ctx
        self.dtype = dtype

    # operands ------------------------------------------------------------------------------
    def const(self, value: object, dtype: DType | None = None) -> Value:
        return self.ctx.constant(np.asarray(value, dtype=(dtype or self.dtype).np))

    def ints(self, values: Sequence[int] | int) -> Value:
        return self.const(values, DType.i64)

    def v(self, x: Operand, like: Value | None = None) -> Value:
        """A value: ``x`` itself, or the number ``x`` as a 0-D constant of ``like``'s type (else ``dtype``)."""
        if isinstance(x, Value):
            return x
        return self.const(x, like.type.dtype if like is not None else self.dtype)

    def _pair(self, a: Operand, b: Operand) -> tuple[Value, Value]:
        if isinstance(a, Value):
            return a, self.v(b, a)
        if isinstance(b, Value):
            return self.v(a, b), b
        return self.v(a), self.v(b)

    def op(self, name: str, *inputs: Value | None, **attrs: object) -> Value:
        return self.ctx.emit1(name, list(inputs), dict(attrs))

    # arithmetic ----------------------------------------------------------------------------
    def _binary(self, name: str, a: Operand, b: Operand) -> Value:
        x, y = self._pair(a, b)
        return self.op(name, x, y)

    def add(self, a: Operand, b: Operand) -> Value:
        return self._binary("add", a, b)

    def sub(self, a: Operand, b: Operand) -> Value:
        return self._binary("sub", a, b)

    def mul(self, a: Operand, b: Operand) -> Value:
        return self._binary("mul", a, b)

    def div(self, a: Operand, b: Operand) -> Value:
        return self._binary("div", a, b)

    def max(self, a: Operand, b: Operand) -> Value:
        return self._binary("max", a, b)

    def min(self, a: Operand, b: Operand) -> Value:
        return self._binary("min", a, b)

    def less(self, a: Operand, b: Operand) -> Value:
        return self._binary("less", a, b)

    def greater(self, a: Operand, b: Operand) -> Value:
        return self._binary("greater", a, b)

    def greater_equal(self, a: Operand, b: Operand) -> Value:
        return self._binary("greater_or_equal", a, b)

    def equal(self, a: Operand, b: Operand) -> Value:
        return self._binary("equal", a, b)

    def and_(self, a: Value, b: Value) -> Value:
        return self.op("and", a, b)

    def or_(self, a: Value, b: Value) -> Value:
        return self.op("or", a, b)

    def not_(self, a: Value) -> Value:
        return self.op("not", a)

    def floor(self, a: Value) -> Value:
        return self.op("floor", a)

    def round(self, a: Value) -> Value:
        return self.op("round", a)

    def abs(self, a: Value) -> Value:
        return self.op("abs", a)

    def neg(self, a: Value) -> Value:
        return self.op("neg", a)

    def where(self, cond: Value, a: Operand, b: Operand) -> Value:
        x, y = self._pair(a, b)
        return self.op("where", cond, x, y)

    def clip(self, x: Value, lo: Operand, hi: Operand) -> Value:
        return self.min(self.max(x, lo), hi)

    def cast(self, x: Value, to: DType) -> Value:
        return x if x.type.dtype is to else self.op("cast", x, to=to)

    # shapes and data movement ------------------------------------------------------------------
    def shape(self, x: Value, start: int = 0, end: int | None = None) -> Value:
        return self.op("shape", x, start=start, end=end)

    def dim(self, x: Value, axis: int) -> Value:
        """Dim ``axis`` of ``x`` as a 0-D int64 (a constant when it is static)."""
        d = x.type.shape[axis]
        if isinstance(d, int):
            return self.ints(d)
        return self.op("squeeze", self.shape(x, axis, axis + 1 if axis != -1 else None), self.ints([0]))

    def reshape(self, x: Value, shape: Value | Sequence[int]) -> Value:
        s = shape if isinstance(shape, Value) else self.ints(list(shape))
        return self.op("reshape", x, s)

    def concat(self, values: Sequence[Value], axis: int = 0) -> Value:
        return self.ctx.emit1("concat", list(values), {"axis": axis})

    def transpose(self, x: Value, perm: Sequence[int]) -> Value:
        return self.op("transpose", x, perm=list(perm))

    def unsqueeze(self, x: Value, axes: Sequence[int]) -> Value:
        return self.op("unsqueeze", x, self.ints(list(axes)))

    def squeeze(self, x: Value, axes: Sequence[int]) -> Value:
        return self.op("squeeze", x, self.ints(list(axes)))

    def gather(self, x: Value, index: Value | int | Sequence[int], axis: int = 0) -> Value:
        idx = index if isinstance(index, Value) else self.ints(index)
        return self.op("gather", x, idx, axis=axis)

    def gather_nd(self, x: Value, index: Value, batch_dims: int = 0) -> Value:
        return self.op("gather_nd", x, index, batch_dims=batch_dims)

    def slice(self, x: Value, starts: Sequence[int], ends: Sequence[int], axes: Sequence[int],
              steps: Sequence[int] | None = None) -> Value:
        return self.op("slice", x, self.ints(list(starts)), self.ints(list(ends)), self.ints(list(axes)),
                       self.ints(list(steps)) if steps is not None else None)

    def matmul(self, a: Value, b: Value) -> Value:
        return self.op("matmul", a, b)

    def reduce(self, name: str, x: Value, axes: Sequence[int], keepdims: int = 0) -> Value:
        return self.op(name, x, self.ints(list(axes)), keepdims=keepdims)

    def sum_all(self, values: Sequence[Value]) -> Value:
        """The sum of ``values`` (added pairwise in order)."""
        acc = values[0]
        for v in values[1:]:
            acc = self.add(acc, v)
        return acc
