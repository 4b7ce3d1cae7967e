"""Linear algebra ops: ``matmul``, ``gemm``, ``einsum`` and ``det``.

``matmul`` follows NumPy: 1-D operands are promoted to matrices and the
promoted dim removed afterwards, and batch dims broadcast.  ``gemm`` is
``alpha * op(A) @ op(B) + beta * C`` with ``C`` broadcast to ``[M, N]``.
``einsum`` takes a general equation (ellipsis, implicit output, repeated
labels for diagonals); the equation is parsed once here into an explicit form
that both inference and the reference read.

Half-precision floats accumulate in float32; integers stay exact (wrapping).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from cuvil.errors import ShapeError
from cuvil.ir.dtypes import FLOATS, NUMERIC, DType, is_float_np
from cuvil.ir.symbolic import Dim, broadcast_dim
from cuvil.ir.types import TensorType
from cuvil.ops.common import broadcast_shapes
from cuvil.ops.registry import AttrSpec, InferCtx, OpDef, RefCtx, register

_HALF = (np.dtype(np.float16), DType.bf16.np)
_GEMM_DTYPES = FLOATS | {DType.i32, DType.i64, DType.u32, DType.u64}


def _acc(x: np.ndarray) -> np.ndarray:
    return x.astype(np.float32) if x.dtype in _HALF else x


def _dims_match(a: Dim, b: Dim) -> bool:
    """False only when two dims are provably different."""
    return a == b or not (isinstance(a, int) and isinstance(b, int))


# matmul ------------------------------------------------------------------------------


def matmul_shape(ctx: InferCtx, a: tuple[Dim, ...], b: tuple[Dim, ...]) -> tuple[Dim, ...]:
    """The shape of ``a @ b`` under NumPy's matmul rules."""
    if not a or not b:
        raise ctx.fail(f"operands must have rank >= 1, got ranks {len(a)} and {len(b)}")
    a2 = (1, *a) if len(a) == 1 else a
    b2 = (*b, 1) if len(b) == 1 else b
    if not _dims_match(a2[-1], b2[-2]):
        raise ctx.fail(f"inner dims differ: [{', '.join(map(str, a))}] @ [{', '.join(map(str, b))}]")
    ctx.assume_equal(a2[-1], b2[-2], "inner dims")
    batch = broadcast_shapes(ctx.op, a2[:-2], b2[:-2], ctx=ctx)
    out = list(batch)
    if len(a) > 1:
        out.append(a2[-2])
    if len(b) > 1:
        out.append(b2[-1])
    return tuple(out)


def _matmul_infer(ctx: InferCtx) -> list[TensorType]:
    dt = ctx.same_dtype(0, 1)
    ctx.require_dtype(0, NUMERIC)
    return [TensorType(dt, matmul_shape(ctx, ctx.type(0).shape, ctx.type(1).shape))]


def _matmul_ref(ctx: RefCtx) -> list[np.ndarray]:
    y = np.matmul(_acc(ctx.input(0)), _acc(ctx.input(1)))
    return [np.asarray(y).astype(ctx.out_dtype(), copy=False)]


register(
    OpDef(
        name="matmul",
        inputs=("A", "B"),
        infer=_matmul_infer,
        reference=_matmul_ref,
        doc="Matrix product with NumPy semantics (1-D operands, broadcast batch dims).",
    )
)


# gemm ----------------------------------------------------------------------------------


def _gemm_infer(ctx: InferCtx) -> list[TensorType]:
    dt = ctx.same_dtype(0, 1, 2)
    ctx.require_dtype(0, _GEMM_DTYPES)
    a, b = ctx.type(0), ctx.type(1)
    if a.rank != 2 or b.rank != 2:
        raise ctx.fail(f"A and B must be 2-D, got {a} and {b}")
    m, ka = (a.shape[1], a.shape[0]) if ctx.attrs["transA"] else a.shape
    kb, n = (b.shape[1], b.shape[0]) if ctx.attrs["transB"] else b.shape
    if not _dims_match(ka, kb):
        raise ctx.fail(f"inner dims differ: op(A) is [{m}, {ka}], op(B) is [{kb}, {n}]")
    ctx.assume_equal(ka, kb, "inner dims")
    if ctx.has(2):
        c = ctx.type(2)
        tail = (m, n)[2 - c.rank :] if c.rank <= 2 else None
        if tail is None or not all(d == 1 or _dims_match(d, e) for d, e in zip(c.shape, tail)):
            raise ctx.fail(f"C of type {c} does not broadcast to [{m}, {n}]")
        for j, (d, e) in enumerate(zip(c.shape, tail)):
            ctx.assume_broadcast_to(d, e, f"C's dim {j} and the output's dim {j + 2 - c.rank}")
    return [TensorType(dt, (m, n))]


def _gemm_ref(ctx: RefCtx) -> list[np.ndarray]:
    a, b = _acc(ctx.input(0)), _acc(ctx.input(1))
    if ctx.attrs["transA"]:
        a = a.T
    if ctx.attrs["transB"]:
        b = b.T
    alpha, beta = ctx.attrs["alpha"], ctx.attrs["beta"]
    # Skipping a factor of 1 keeps integer products exact.
    y = a @ b
    if alpha != 1.0:
        y = y * np.asarray(alpha, y.dtype if is_float_np(y.dtype) else np.float64)
    if ctx.has(2):
        c = _acc(ctx.input(2))
        if beta != 1.0:
            c = c * np.asarray(beta, c.dtype if is_float_np(c.dtype) else np.float64)
        y = y + c
    return [np.asarray(y).astype(ctx.out_dtype())]


register(
    OpDef(
        name="gemm",
        inputs=("A", "B", "C?"),
        attrs={
            "alpha": AttrSpec("float", 1.0),
            "beta": AttrSpec("float", 1.0),
            "transA": AttrSpec("int", 0),
            "transB": AttrSpec("int", 0),
        },
        infer=_gemm_infer,
        reference=_gemm_ref,
        doc="alpha * op(A) @ op(B) + beta * C, op transposing when transA/transB; C broadcasts to [M, N].",
    )
)


# einsum ----------------------------------------------------------------------------------

ELLIPSIS = "..."


@dataclass(frozen=True)
class Equation:
    """A parsed einsum equation: one label list per operand and the output's (``...`` is one item)."""

    inputs: tuple[tuple[str, ...], ...]
    output: tuple[str, ...]

    def explicit(self) -> str:
        return ",".join("".join(t) for t in self.inputs) + "->" + "".join(self.output)


def _parse_term(term: str, where: str) -> tuple[str, ...]:
    labels: list[str] = []
    i = 0
    while i < len(term):
        if term.startswith(ELLIPSIS, i):
            if ELLIPSIS in labels:
                raise ValueError(f"{where} {term!r} has more than one ellipsis")
            labels.append(ELLIPSIS)
            i += 3
        elif term[i].isascii() and term[i].isalpha():
            labels.append(term[i])
            i += 1
        else:
            raise ValueError(f"{where} {term!r} has an invalid character {term[i]!r}")
    return tuple(labels)


def parse_equation(equation: str, num_inputs: int) -> Equation:
    """Parse an einsum equation; raises ``ValueError`` naming what is wrong."""
    eq = equation.replace(" ", "")
    if eq.count("->") > 1:
        raise ValueError(f"equation {equation!r} has more than one '->'")
    lhs, arrow, rhs = eq.partition("->")
    terms = tuple(_parse_term(t, "input term") for t in lhs.split(","))
    if len(terms) != num_inputs:
        raise ValueError(f"equation {equation!r} has {len(terms)} input terms for {num_inputs} inputs")
    if arrow:
        out = _parse_term(rhs, "output term")
        seen = [x for t in terms for x in t]
        for x in out:
            if x != ELLIPSIS and x not in seen:
                raise ValueError(f"output label {x!r} does not occur in the inputs of {equation!r}")
        if len(set(out)) != len(out):
            raise ValueError(f"output term {rhs!r} repeats a label")
    else:
        counts: dict[str, int] = {}
        for t in terms:
            for x in t:
                counts[x] = counts.get(x, 0) + 1
        # Implicit output: the ellipsis first, then labels occurring once, in ASCII order.
        singles = sorted(x for x, c in counts.items() if c == 1 and x != ELLIPSIS)
        out = ((ELLIPSIS,) if ELLIPSIS in counts else ()) + tuple(singles)
    return Equation(terms, out)


def einsum_shape(eq: Equation, shapes: list[tuple[Dim, ...]], ctx: InferCtx | None = None) -> tuple[Dim, ...]:
    """The output shape of an einsum; raises ``ValueError`` when operand shapes do not fit.

    With ``ctx``, the label dims only run time can match are recorded on it as checks."""
    label_dims: dict[str, Dim] = {}
    ell_shapes: list[tuple[Dim, ...]] = []
    for k, (term, shape) in enumerate(zip(eq.inputs, shapes)):
        n_labels = len(term) - (1 if ELLIPSIS in term else 0)
        if ELLIPSIS in term:
            if len(shape) < n_labels:
                raise ValueError(f"input {k} has rank {len(shape)}, fewer than the {n_labels} labels of its term")
        elif len(shape) != n_labels:
            raise ValueError(f"input {k} has rank {len(shape)} but its term {''.join(term)!r} has {n_labels} labels")
        n_ell = len(shape) - n_labels
        pos = 0
        own: dict[str, Dim] = {}
        for x in term:
            if x == ELLIPSIS:
                ell_shapes.append(shape[pos : pos + n_ell])
                pos += n_ell
                continue
            d = shape[pos]
            pos += 1
            if x in own and not _dims_match(own[x], d):  # a repeated label takes a diagonal
                raise ValueError(f"label {x!r} of input {k} stands for dims {own[x]} and {d}")
            if x in own and ctx is not None:
                ctx.assume_equal(own[x], d, f"dims of input {k} labelled {x!r} (a diagonal)")
            own.setdefault(x, d)
            if x in label_dims:
                try:
                    merged = broadcast_dim(label_dims[x], d)
                except ValueError:
                    raise ValueError(f"label {x!r} stands for dims {label_dims[x]} and {d}") from None
                if ctx is not None:
                    ctx.assume_broadcast(label_dims[x], d, f"dims labelled {x!r}")
                label_dims[x] = merged
            else:
                label_dims[x] = d
    ell: tuple[Dim, ...] = ()
    for s in ell_shapes:
        try:
            ell = broadcast_shapes("einsum", ell, s, ctx=ctx)
        except ShapeError:
            raise ValueError("the dims standing for '...' do not broadcast") from None
    if ell and ELLIPSIS not in eq.output:
        raise ValueError(f"'...' stands for {len(ell)} dims but the output term has no '...'")
    out: list[Dim] = []
    for x in eq.output:
        out.extend(ell if x == ELLIPSIS else (label_dims[x],))
    return tuple(out)


def _einsum_infer(ctx: InferCtx) -> list[TensorType]:
    n = len(ctx.types)
    if n == 0:
        raise ctx.fail("needs at least one input")
    dt = ctx.same_dtype(*range(n))
    ctx.require_dtype(0, NUMERIC)
    try:
        eq = parse_equation(ctx.attrs["equation"], n)
        shape = einsum_shape(eq, [ctx.type(i).shape for i in range(n)], ctx)
    except ValueError as exc:
        raise ctx.fail(str(exc)) from None
    return [TensorType(dt, shape)]


def _einsum_ref(ctx: RefCtx) -> list[np.ndarray]:
    arrays = [_acc(ctx.input(i)) for i in range(len(ctx.inputs))]
    eq = parse_equation(ctx.attrs["equation"], len(arrays))
    y = np.einsum(eq.explicit(), *arrays)
    return [np.asarray(y).astype(ctx.out_dtype(), copy=False)]


register(
    OpDef(
        name="einsum",
        inputs=("Inputs*",),
        outputs=("Output",),
        attrs={"equation": AttrSpec("str")},
        infer=_einsum_infer,
        reference=_einsum_ref,
        doc="Einstein summation over the inputs (ellipsis, implicit output in ASCII order, diagonals).",
    )
)


# det ---------------------------------------------------------------------------------------


def _det_infer(ctx: InferCtx) -> list[TensorType]:
    ctx.require_dtype(0, FLOATS)
    x = ctx.type(0)
    if x.rank < 2:
        raise ctx.fail(f"X must have rank >= 2 ([..., M, M]), got {x}")
    if not _dims_match(x.shape[-2], x.shape[-1]):
        raise ctx.fail(f"the matrices of {x} are not square")
    ctx.assume_equal(x.shape[-2], x.shape[-1], "matrix dims")
    return [TensorType(x.dtype, x.shape[:-2])]


def _det_ref(ctx: RefCtx) -> list[np.ndarray]:
    x = ctx.input(0).astype(np.float64)
    y = np.linalg.det(x) if x.size else np.ones(x.shape[:-2])  # an empty batch, or 0x0 matrices (det 1)
    return [np.asarray(y).astype(ctx.out_dtype())]


register(
    OpDef(
        name="det",
        inputs=("X",),
        infer=_det_infer,
        reference=_det_ref,
        tolerance=1e-4,
        doc="Determinant of each square matrix of the last two dims (LU with partial pivoting, in float64).",
    )
)
