"""Kernels of the ops that read or write at positions held in an index tensor.

gather, gather_elements, scatter_elements, gather_nd, scatter_nd, one_hot
and non_zero.  Every index read from a tensor is checked against its axis
before it is used: negative indices wrap once, anything outside ``[-n, n)``
fails the call with the offending value (one_hot excepted: ONNX gives an
out-of-range index a row of off values).  Shape relations the IR leaves
symbolic (indices dims within the data's, updates shaped like the indices)
are checked at run time too.
"""

from __future__ import annotations

from collections.abc import Callable

from cuvil.backends.c import ctypes_map as ct
from cuvil.backends.c.kernel import CVal, KernelCtx, kernel
from cuvil.backends.c.kernels.shape import (
    dims_of,
    guarded_copy,
    has_unknown_dims,
    prod,
    set_output_shape,
)
from cuvil.ir.dtypes import DType
from cuvil.ops.common import normalize_axis

# gather -------------------------------------------------------------------------


def _check_index(k: KernelCtx, ix: str, n: str, axis: int) -> None:
    k.fail_if(f"{ix} < -{n} || {ix} >= {n}", f"index %lld is out of range for axis {axis} of size %lld",
              f"(long long){ix}", f"(long long){n}")


def _elem_copy(k: KernelCtx, dst: str, src: str, inner: str, ctype: str) -> None:
    """Copy ``inner`` elements: an assignment when it is one (the common last-axis case), else memcpy."""
    k.w.line(f"if ({inner} == 1) {dst}[0] = {src}[0]; else if ({inner} > 0) "
             f"memcpy({dst}, {src}, sizeof({ctype}) * (size_t){inner});")


@kernel("gather")
def _gather(k: KernelCtx) -> None:
    x, ind, out = k.inp(0), k.inp(1), k.out(0)
    w = k.w
    axis = normalize_axis(k.node.op, int(k.attrs["axis"]), x.rank)
    outer, n, inner, m, t, o, ix = (k.tmp(h) for h in ("outer", "n", "inner", "m", "t", "o", "ix"))
    w.line(f"const int64_t {outer} = {prod(dims_of(x, 0, axis))}, {n} = {x.dim(axis)}, "
           f"{inner} = {prod(dims_of(x, axis + 1))}, {m} = {ind.numel()};")
    with w.block(f"for (int64_t {t} = 0; {t} < {m}; {t}++)"):
        w.line(f"const int64_t {ix} = (int64_t){ind.ptr}[{t}];")
        _check_index(k, ix, n, axis)
    with w.block(f"for (int64_t {o} = 0; {o} < {outer}; {o}++)"), w.block(f"for (int64_t {t} = 0; {t} < {m}; {t}++)"):
        w.line(f"int64_t {ix} = (int64_t){ind.ptr}[{t}];")
        w.line(f"if ({ix} < 0) {ix} += {n};")
        src, dst = f"({x.ptr} + ({o} * {n} + {ix}) * {inner})", f"({out.ptr} + ({o} * {m} + {t}) * {inner})"
        _elem_copy(k, dst, src, inner, x.ctype)


# gather_elements / scatter_elements --------------------------------------------------


def _reduce_expr(dtype: DType, reduction: str) -> Callable[[str, str], str]:
    """``f(current, update)`` in ``dtype``'s compute type; integer arithmetic wraps like NumPy's."""
    if reduction == "none":
        return lambda a, u: u
    if dtype is DType.bool:
        return {"add": lambda a, u: f"({a} | {u})", "mul": lambda a, u: f"({a} & {u})",
                "max": lambda a, u: f"({a} | {u})", "min": lambda a, u: f"({a} & {u})"}[reduction]
    if dtype.is_float:
        return {"add": lambda a, u: f"({a} + {u})", "mul": lambda a, u: f"({a} * {u})",
                "max": lambda a, u: f"(({a} != {a} || {a} > {u}) ? {a} : {u})",
                "min": lambda a, u: f"(({a} != {a} || {a} < {u}) ? {a} : {u})"}[reduction]
    if reduction in ("add", "mul"):
        op = "+" if reduction == "add" else "*"
        if dtype in (DType.i32, DType.i64):  # signed overflow is undefined in C: wrap in unsigned
            ut = "uint32_t" if dtype is DType.i32 else "uint64_t"
            return lambda a, u: f"({ct.storage(dtype)})(({ut}){a} {op} ({ut}){u})"
        return lambda a, u: f"({a} {op} {u})"
    cmp = ">" if reduction == "max" else "<"
    return lambda a, u: f"({a} {cmp} {u} ? {a} : {u})"


def _elements_loops(k: KernelCtx, x: CVal, ind: CVal, axis: int, body: Callable[[str, str, str], None]) -> None:
    """Loop over every position of ``ind``; ``body(pos, data_offset, ix)`` with the checked, wrapped index."""
    w = k.w
    r = x.rank
    k.fail_if(" || ".join(f"(int64_t){ind.dim(j)} > (int64_t){x.dim(j)}" for j in range(r) if j != axis) or "0",
              "indices dims exceed the data dims (other than the axis)")
    ds, n, pos = k.tmp("ds"), k.tmp("n"), k.tmp("pos")
    k.include("cuvil_index.h")
    w.line(f"int64_t {ds}[{r}]; cuvil_strides({x.shape}, {r}, {ds});")
    w.line(f"const int64_t {n} = {x.dim(axis)}; int64_t {pos} = 0;")
    idx = [k.tmp("i") for _ in range(r)]
    offs = [k.tmp("p") for _ in range(r)]
    prev = "0"
    for j in range(r):
        w.line(f"for (int64_t {idx[j]} = 0; {idx[j]} < {ind.dim(j)}; {idx[j]}++) {{")
        term = "0" if j == axis else f"{idx[j]} * {ds}[{j}]"
        w.line(f"    const int64_t {offs[j]} = {prev} + {term};")
        prev = offs[j]
    ix = k.tmp("ix")
    with w.indented():
        w.line(f"int64_t {ix} = (int64_t){ind.ptr}[{pos}];")
        _check_index(k, ix, n, axis)
        w.line(f"if ({ix} < 0) {ix} += {n};")
        body(pos, f"{prev} + {ix} * {ds}[{axis}]", ix)
        w.line(f"{pos}++;")
    for _ in range(r):
        w.line("}")


@kernel("gather_elements")
def _gather_elements(k: KernelCtx) -> None:
    x, ind, out = k.inp(0), k.inp(1), k.out(0)
    axis = normalize_axis(k.node.op, int(k.attrs["axis"]), x.rank)
    _elements_loops(k, x, ind, axis, lambda pos, off, ix: k.w.line(f"{out.ptr}[{pos}] = {x.ptr}[{off}];"))


@kernel("scatter_elements")
def _scatter_elements(k: KernelCtx) -> None:
    x, ind, upd, out = k.inp(0), k.inp(1), k.inp(2), k.out(0)
    axis = normalize_axis(k.node.op, int(k.attrs["axis"]), x.rank)
    for j in range(ind.rank):
        k.require(upd.dim(j), ind.dim(j), f"updates dim {j} must equal the indices'")
    guarded_copy(k, out.ptr, x.ptr, x.numel(), x.ctype)
    f = _reduce_expr(x.dtype, str(k.attrs["reduction"]))

    def body(pos: str, off: str, ix: str) -> None:
        k.w.line(out.store(off, f(out.load(off), upd.load(pos))))

    _elements_loops(k, x, ind, axis, body)


# gather_nd / scatter_nd ------------------------------------------------------------


def _nd_offset(k: KernelCtx, x: CVal, ind: CVal, b: int, row: str, ds: str) -> str:
    """The data offset (within one batch) of the index tuple ``ind[row*kk : row*kk + kk]``, checked."""
    w = k.w
    kk = ind.static_dim(ind.rank - 1)
    assert kk is not None
    off = k.tmp("off")
    w.line(f"int64_t {off} = 0;")
    for j in range(kk):
        v = k.tmp("ix")
        w.line(f"int64_t {v} = (int64_t){ind.ptr}[{row} * {kk} + {j}];")
        _check_index(k, v, x.dim(b + j), b + j)
        w.line(f"if ({v} < 0) {v} += {x.dim(b + j)};")
        w.line(f"{off} += {v} * {ds}[{b + j}];")
    return off


@kernel("gather_nd")
def _gather_nd(k: KernelCtx) -> None:
    x, ind, out = k.inp(0), k.inp(1), k.out(0)
    w = k.w
    b = int(k.attrs["batch_dims"])
    kk = ind.static_dim(ind.rank - 1)
    assert kk is not None
    for j in range(b):
        k.require(ind.dim(j), x.dim(j), f"batch dim {j} of indices and data")
    ds, nb, m, inner, bs, bi, mi = (k.tmp(h) for h in ("ds", "nb", "m", "inner", "bs", "b", "mi"))
    k.include("cuvil_index.h")
    w.line(f"int64_t {ds}[{x.rank}]; cuvil_strides({x.shape}, {x.rank}, {ds});")
    w.line(f"const int64_t {nb} = {prod(dims_of(x, 0, b))}, {m} = {prod(dims_of(ind, b, ind.rank - 1))}, "
           f"{inner} = {prod(dims_of(x, b + kk))}, {bs} = {prod(dims_of(x, b))};")
    row = k.tmp("row")
    with w.block(f"for (int64_t {bi} = 0; {bi} < {nb}; {bi}++)"), w.block(f"for (int64_t {mi} = 0; {mi} < {m}; {mi}++)"):
        w.line(f"const int64_t {row} = {bi} * {m} + {mi};")
        off = _nd_offset(k, x, ind, b, row, ds)
        _elem_copy(k, f"({out.ptr} + {row} * {inner})", f"({x.ptr} + {bi} * {bs} + {off})", inner, x.ctype)


@kernel("scatter_nd")
def _scatter_nd(k: KernelCtx) -> None:
    x, ind, upd, out = k.inp(0), k.inp(1), k.inp(2), k.out(0)
    w = k.w
    kk = ind.static_dim(ind.rank - 1)
    assert kk is not None
    want = dims_of(ind, 0, ind.rank - 1) + dims_of(x, kk)
    for j, d in enumerate(want):
        k.require(upd.dim(j), d, f"updates dim {j}")
    guarded_copy(k, out.ptr, x.ptr, x.numel(), x.ctype)
    ds, m, inner, mi, e = (k.tmp(h) for h in ("ds", "m", "inner", "mi", "e"))
    k.include("cuvil_index.h")
    w.line(f"int64_t {ds}[{x.rank}]; cuvil_strides({x.shape}, {x.rank}, {ds});")
    w.line(f"const int64_t {m} = {prod(dims_of(ind, 0, ind.rank - 1))}, {inner} = {prod(dims_of(x, kk))};")
    reduction = str(k.attrs["reduction"])
    f = _reduce_expr(x.dtype, reduction)
    with w.block(f"for (int64_t {mi} = 0; {mi} < {m}; {mi}++)"):
        off = _nd_offset(k, x, ind, 0, mi, ds)
        if reduction == "none":
            _elem_copy(k, f"({out.ptr} + {off})", f"({upd.ptr} + {mi} * {inner})", inner, x.ctype)
        else:
            with w.block(f"for (int64_t {e} = 0; {e} < {inner}; {e}++)"):
                dst, src = f"{off} + {e}", f"{mi} * {inner} + {e}"
                w.line(out.store(dst, f(out.load(dst), upd.load(src))))


# one_hot ------------------------------------------------------------------------------


def _int_of_float(k: KernelCtx, expr: str, what: str) -> str:
    """A finite float operand truncated to int64 (failing for NaN, infinities and values beyond int64)."""
    v = k.tmp("f")
    k.w.line(f"const double {v} = (double)({expr});")
    k.fail_if(f"!({v} > -9223372036854775808.0 && {v} < 9223372036854775808.0)",
              f"{what} (%g) is not a finite integer", v)
    return f"(int64_t){v}"


@kernel("one_hot", computes_shape=True)
def _one_hot(k: KernelCtx) -> None:
    ind, depth_in, values, out = k.inp(0), k.inp(1), k.inp(2), k.out(0)
    w = k.w
    r = ind.rank
    axis = int(k.attrs["axis"])
    axis = axis + r + 1 if axis < 0 else axis
    k.require(depth_in.numel(), "1", "depth must hold one element")
    k.require(values.numel(), "2", "values must hold [off_value, on_value]")
    depth = k.tmp("depth")
    raw = depth_in.load("0")
    if depth_in.dtype.is_float:
        w.line(f"const int64_t {depth} = {_int_of_float(k, raw, 'depth')};")
    else:
        w.line(f"const int64_t {depth} = (int64_t){raw};")
    k.fail_if(f"{depth} < 0", "depth %lld must not be negative", f"(long long){depth}")
    dims = [*dims_of(ind, 0, axis), depth, *dims_of(ind, axis)]
    k.include("cuvil_index.h")
    if has_unknown_dims(out):
        set_output_shape(k, 0, dims)
    else:
        k.require(out.dim(axis), depth, "one_hot depth")
    outer, inner, o, i, ix, base = (k.tmp(h) for h in ("outer", "inner", "o", "i", "ix", "base"))
    w.line(f"const int64_t {outer} = {prod(dims_of(ind, 0, axis))}, {inner} = {prod(dims_of(ind, axis))};")
    w.line(f"cuvil_fill({out.ptr}, {values.ptr}, sizeof({out.ctype}), {out.numel()});")
    with w.block(f"for (int64_t {o} = 0; {o} < {outer}; {o}++)"), w.block(f"for (int64_t {i} = 0; {i} < {inner}; {i}++)"):
        src = ind.load(f"{o} * {inner} + {i}")
        if ind.dtype.is_float:
            v = k.tmp("f")
            w.line(f"const double {v} = (double)({src});")
            # NaN, infinities and values beyond int64 match no class (NumPy's cast gives INT64_MIN)
            w.line(f"if (!({v} > -9223372036854775808.0 && {v} < 9223372036854775808.0)) continue;")
            w.line(f"int64_t {ix} = (int64_t){v};")
        else:
            w.line(f"int64_t {ix} = (int64_t){src};")
        w.line(f"if ({ix} < 0) {ix} += {depth};")
        w.line(f"if ({ix} < 0 || {ix} >= {depth}) continue;")
        w.line(f"const int64_t {base} = ({o} * {depth} + {ix}) * {inner} + {i};")
        w.line(f"{out.ptr}[{base}] = {values.ptr}[1];")


# non_zero -------------------------------------------------------------------------------


@kernel("non_zero", computes_shape=True)
def _non_zero(k: KernelCtx) -> None:
    x, out = k.inp(0), k.out(0)
    w = k.w
    r = x.rank
    n, cnt, i = k.tmp("n"), k.tmp("cnt"), k.tmp("i")
    nz = x.load(i) + " != 0"
    w.line(f"const int64_t {n} = {x.numel()}; int64_t {cnt} = 0;")
    w.line(f"for (int64_t {i} = 0; {i} < {n}; {i}++) {cnt} += ({nz});")
    k.include("cuvil_index.h")
    set_output_shape(k, 0, [str(r), cnt])
    if r == 0:
        return
    c, at = k.tmp("c"), k.tmp("at")
    w.line(f"int64_t {c}[{r}] = {{0}}; int64_t {at} = 0;")
    with w.block(f"for (int64_t {i} = 0; {i} < {n}; {i}++)"):
        with w.block(f"if ({nz})"):
            for j in range(r):
                w.line(f"{out.ptr}[{j} * {cnt} + {at}] = {c}[{j}];")
            w.line(f"{at}++;")
        w.line(f"for (int j = {r - 1}; j >= 0 && ++{c}[j] == {x.shape}[j]; j--) {c}[j] = 0;")
