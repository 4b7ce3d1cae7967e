"""Kernels of the layout ops: reshape, flatten, squeeze, unsqueeze, transpose, expand, shape, size.

Also the helpers the shape, indexing and generation kernels share: reading
one element of a small integer operand (a C literal when it is a constant),
strided view copies (``cuvil_index.h``), and :func:`set_output_shape`, which
gives an output whose dims only the kernel can compute its shape and memory.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from cuvil.backends.c.kernel import CVal, KernelCtx, kernel
from cuvil.backends.c.kernels.common import copy
from cuvil.backends.c.writer import c_int
from cuvil.errors import CuvilError
from cuvil.ir.symbolic import is_unknown
from cuvil.ops.common import normalize_axes

VIEW_MAX_RANK = 32  # CUVIL_VIEW_MAX_RANK in cuvil_index.h


class KernelError(CuvilError):
    """A shape or indexing kernel cannot generate code for this node."""


# Shared helpers --------------------------------------------------------------


def has_unknown_dims(c: CVal) -> bool:
    """Whether the node's output type leaves dims to the kernel (the generator may still know them)."""
    return any(is_unknown(d) for d in c.value.type.shape)


def operand(k: KernelCtx, i: int, j: int) -> str:
    """Element ``j`` of the small integer input ``i`` as a C int64 expression (a literal when constant)."""
    c = k.const(i)
    if c is not None:
        return c_int(int(np.asarray(c).reshape(-1)[j]))
    return f"(int64_t){k.inp(i).ptr}[{j}]"


def const_ints(k: KernelCtx, i: int) -> list[int] | None:
    c = k.const(i)
    return None if c is None else [int(x) for x in np.asarray(c).reshape(-1)]


def require_length(k: KernelCtx, i: int, n: int, what: str) -> None:
    """Check at run time that input ``i`` holds ``n`` elements (reading them is then in bounds)."""
    k.require(k.inp(i).numel(), str(n), f"{what} must hold {n} element(s)")


def set_output_shape(k: KernelCtx, i: int, dims: Sequence[str]) -> None:
    """Give output ``i`` the C dims ``dims`` and allocate it.

    The code generator already allocated the output when it could derive
    every dim itself; then the dims computed here are checked against its."""
    out = k.out(i)
    w = k.w
    with w.block(f"if ({out.ptr} == NULL)"):
        for j, d in enumerate(dims):
            w.line(f"{out.shape}[{j}] = {d};")
        k.fail_if(f"cuvil_checked_bytes({out.shape}, {out.rank}, (int64_t)sizeof({out.ctype})) < 0",
                  "the output shape is too large (or has a negative dim)")
        k.alloc(i)
    with w.block("else"):
        for j, d in enumerate(dims):
            k.fail_if(f"{out.shape}[{j}] != ({d})", f"output dim {j} is %lld, but its inference gave %lld",
                      f"(long long)({d})", f"(long long){out.shape}[{j}]")


def view_copy(k: KernelCtx, dst: CVal, src: str, rank: int, shape: str, strides: str) -> None:
    """``dst`` = the view (``shape``, ``strides`` in elements, C arrays of ``rank``) of ``src``."""
    if rank > VIEW_MAX_RANK:
        raise KernelError(f"node {k.node.name!r} ({k.node.op}): a view of rank {rank} exceeds the C kernels' "
                          f"limit of {VIEW_MAX_RANK}")
    k.include("cuvil_index.h")
    k.w.line(f"cuvil_view_copy({dst.ptr}, {src}, sizeof({dst.ctype}), {rank}, {shape}, {strides});")


def prod(dims: Sequence[str]) -> str:
    """The product of C dim expressions (int64), ``1`` when empty."""
    if not dims:
        return "INT64_C(1)"
    if all(d.isdigit() for d in dims):
        return str(int(np.prod([int(d) for d in dims], dtype=object)))
    return "(" + " * ".join(f"(int64_t){d}" for d in dims) + ")"


def dims_of(c: CVal, lo: int = 0, hi: int | None = None) -> list[str]:
    return [c.dim(j) for j in range(lo, c.rank if hi is None else hi)]


def guarded_copy(k: KernelCtx, dst: str, src: str, count: str, ctype: str) -> None:
    """memcpy of ``count`` elements, skipped when empty (a zero-size buffer may be NULL)."""
    k.w.line(f"cuvil_copy({dst}, {src}, (int64_t)sizeof({ctype}) * ({count}));")


def copy_same_count(k: KernelCtx, src: CVal, dst: CVal) -> None:
    """Copy ``src`` into ``dst`` after checking that their element counts agree."""
    k.require(dst.numel(), src.numel(), "the output and input element counts differ")
    k.w.line(f"if ({dst.numel()} > 0) " + f"memcpy({dst.ptr}, {src.ptr}, sizeof({dst.ctype}) * (size_t){dst.numel()});")


# reshape ---------------------------------------------------------------------


@kernel("reshape", computes_shape=True)
def _reshape(k: KernelCtx) -> None:
    x, out = k.inp(0), k.out(0)
    if has_unknown_dims(out):
        _reshape_dims(k, x, out)
    copy_same_count(k, x, out)


def _reshape_dims(k: KernelCtx, x: CVal, out: CVal) -> None:
    """The ONNX Reshape rules (0 copies an input dim unless allowzero, one -1 is inferred), in C."""
    w = k.w
    n = out.rank
    allowzero = bool(k.attrs["allowzero"])
    dims, infer, known, zero = k.tmp("dims"), k.tmp("infer"), k.tmp("known"), k.tmp("zero")
    require_length(k, 1, n, "the shape input")
    w.line(f"int64_t {dims}[{max(n, 1)}]; int {infer} = -1, {zero} = 0; int64_t {known} = 1;")
    w.line(f"(void){zero};")
    for j in range(n):
        v = k.tmp("v")
        w.line(f"int64_t {v} = {operand(k, 1, j)};")
        with w.block(f"if ({v} == -1)"):
            k.fail_if(f"{infer} >= 0", "the shape has more than one -1")
            w.line(f"{infer} = {j}; {dims}[{j}] = 1;")
        if not allowzero:
            with w.block(f"else if ({v} == 0)"):
                if j < x.rank:
                    w.line(f"{dims}[{j}] = {x.dim(j)};")
                else:
                    k.fail_if("1", f"the shape copies dim {j} (a 0) but the input has rank {x.rank}")
        with w.block("else"):
            k.fail_if(f"{v} < 0", f"the shape has a negative dim %lld at {j}", f"(long long){v}")
            w.line(f"{dims}[{j}] = {v};")
        w.line(f"if ({v} == 0) {zero} = 1;")
        with w.block(f"if ({infer} != {j})"):
            w.line(f"{known} = cuvil_mul_nonneg({known}, {dims}[{j}]);")
            k.fail_if(f"{known} < 0", "the shape holds too many elements")
    total = k.tmp("total")
    w.line(f"int64_t {total} = {x.numel()};")
    with w.block(f"if ({infer} >= 0)"):
        if allowzero:
            k.fail_if(zero, "the shape has both a 0 and a -1 with allowzero=1")
        k.fail_if(f"{known} == 0", "cannot infer the -1: the other dims hold no elements")
        k.fail_if(f"{total} % {known} != 0", "cannot reshape %lld elements to a shape holding a multiple of %lld",
                  f"(long long){total}", f"(long long){known}")
        w.line(f"{dims}[{infer}] = {total} / {known};")
    with w.block("else"):
        k.fail_if(f"{known} != {total}", "cannot reshape %lld elements to a shape of %lld elements",
                  f"(long long){total}", f"(long long){known}")
    k.include("cuvil_index.h")
    set_output_shape(k, 0, [f"{dims}[{j}]" for j in range(n)])


@kernel("flatten")
def _flatten(k: KernelCtx) -> None:
    copy(k, k.inp(0), k.out(0))


# squeeze / unsqueeze -----------------------------------------------------------


@kernel("squeeze", computes_shape=True)
def _squeeze(k: KernelCtx) -> None:
    x, out = k.inp(0), k.out(0)
    axes = const_ints(k, 1) if k.has(1) else None
    if k.has(1) and has_unknown_dims(out):
        _squeeze_axes_in_c(k, x, out)
    elif axes is not None:
        for a in normalize_axes(k.node.op, axes, x.rank):
            k.require(x.dim(a), "1", f"cannot squeeze axis {a}: its size is not 1")
    copy_same_count(k, x, out)


def _squeeze_axes_in_c(k: KernelCtx, x: CVal, out: CVal) -> None:
    w = k.w
    r, n = x.rank, x.rank - out.rank
    drop = k.tmp("drop")
    require_length(k, 1, n, "axes")
    w.line(f"int {drop}[{max(r, 1)}] = {{0}};")
    for j in range(n):
        a = k.tmp("a")
        w.line(f"int64_t {a} = {operand(k, 1, j)};")
        k.fail_if(f"{a} < -{r} || {a} >= {r}", f"axis %lld is out of range for rank {r}", f"(long long){a}")
        w.line(f"if ({a} < 0) {a} += {r};")
        k.fail_if(f"{drop}[{a}]", "repeated axis %lld", f"(long long){a}")
        k.fail_if(f"{x.shape}[{a}] != 1", "cannot squeeze axis %lld: its size is %lld, not 1",
                  f"(long long){a}", f"(long long){x.shape}[{a}]")
        w.line(f"{drop}[{a}] = 1;")
    dims, o = k.tmp("dims"), k.tmp("o")
    w.line(f"int64_t {dims}[{max(out.rank, 1)}] = {{0}}; int {o} = 0;")
    with w.block(f"for (int j = 0; j < {r}; j++)"):
        w.line(f"if (!{drop}[j] && {o} < {out.rank}) {dims}[{o}++] = {x.shape}[j];")
    k.include("cuvil_index.h")
    set_output_shape(k, 0, [f"{dims}[{j}]" for j in range(out.rank)])


@kernel("unsqueeze", computes_shape=True)
def _unsqueeze(k: KernelCtx) -> None:
    x, out = k.inp(0), k.out(0)
    if has_unknown_dims(out):
        w = k.w
        rank, n = out.rank, out.rank - x.rank
        ins, dims, src = k.tmp("ins"), k.tmp("dims"), k.tmp("src")
        require_length(k, 1, n, "axes")
        w.line(f"int {ins}[{max(rank, 1)}] = {{0}};")
        for j in range(n):
            a = k.tmp("a")
            w.line(f"int64_t {a} = {operand(k, 1, j)};")
            k.fail_if(f"{a} < -{rank} || {a} >= {rank}", f"axis %lld is out of range for rank {rank}", f"(long long){a}")
            w.line(f"if ({a} < 0) {a} += {rank};")
            k.fail_if(f"{ins}[{a}]", "repeated axis %lld", f"(long long){a}")
            w.line(f"{ins}[{a}] = 1;")
        w.line(f"int64_t {dims}[{max(rank, 1)}] = {{0}}; int {src} = 0;")
        with w.block(f"for (int j = 0; j < {rank}; j++)"):
            w.line(f"if ({ins}[j]) {dims}[j] = 1; else if ({src} < {max(x.rank, 1)}) {dims}[j] = {x.shape}[{src}++];")
        k.include("cuvil_index.h")
        set_output_shape(k, 0, [f"{dims}[{j}]" for j in range(rank)])
    copy_same_count(k, x, out)


# transpose -----------------------------------------------------------------------


@kernel("transpose")
def _transpose(k: KernelCtx) -> None:
    x, out = k.inp(0), k.out(0)
    r = x.rank
    perm = k.attrs["perm"]
    perm = list(range(r))[::-1] if perm is None else [int(p) for p in perm]
    # dims of size 1 do not move data: only the order of the others matters
    moving = [p for p in perm if x.static_dim(p) != 1]
    if moving == sorted(moving):
        copy(k, x, out)
        return
    w = k.w
    st, vs = k.tmp("st"), k.tmp("vs")
    k.include("cuvil_index.h")
    w.line(f"int64_t {st}[{r}]; cuvil_strides({x.shape}, {r}, {st});")
    w.line(f"int64_t {vs}[{r}] = {{{', '.join(f'{st}[{p}]' for p in perm)}}};")
    with w.block(f"if ({out.numel()} > 0)"):
        view_copy(k, out, x.ptr, r, out.shape, vs)


# expand ------------------------------------------------------------------------


@kernel("expand", computes_shape=True)
def _expand(k: KernelCtx) -> None:
    x, out = k.inp(0), k.out(0)
    w = k.w
    rank, r = out.rank, x.rank
    k.include("cuvil_index.h")
    if has_unknown_dims(out):
        n = k.inp(1).static_dim(0)
        assert n is not None  # inference requires a static length
        require_length(k, 1, n, "the shape input")
        dims = k.tmp("dims")
        w.line(f"int64_t {dims}[{max(rank, 1)}];")
        for j in range(rank):
            a = x.dim(j - (rank - r)) if j >= rank - r else "1"
            if j >= rank - n:
                b = k.tmp("b")
                w.line(f"int64_t {b} = {operand(k, 1, j - (rank - n))};")
                k.fail_if(f"{b} < 0", f"the shape has a negative dim %lld at {j - (rank - n)}", f"(long long){b}")
                w.line(f"{dims}[{j}] = cuvil_bcast({a}, {b});")
                k.fail_if(f"{dims}[{j}] < 0", f"the input dim %lld and the shape's %lld at output dim {j} do not "
                          "broadcast", f"(long long){a}", f"(long long){b}")
            else:
                w.line(f"{dims}[{j}] = {a};")
        set_output_shape(k, 0, [f"{dims}[{j}]" for j in range(rank)])
    k.fail_if(f"!cuvil_bcast_ok({x.shape}, {r}, {out.shape}, {rank})", "the input does not broadcast to the output shape")
    st = k.tmp("st")
    w.line(f"int64_t {st}[{max(rank, 1)}];")
    w.line(f"cuvil_bcast_strides({x.shape}, {r}, {out.shape}, {rank}, {st});")
    with w.block(f"if ({out.numel()} > 0)"):
        view_copy(k, out, x.ptr, rank, out.shape, st)


# shape / size ------------------------------------------------------------------


@kernel("shape")
def _shape(k: KernelCtx) -> None:
    x, out = k.inp(0), k.out(0)
    r = x.rank
    start = int(k.attrs["start"])
    end = r if k.attrs["end"] is None else int(k.attrs["end"])
    start = min(max(start + r if start < 0 else start, 0), r)
    end = max(start, min(max(end + r if end < 0 else end, 0), r))
    for i, j in enumerate(range(start, end)):
        k.w.line(f"{out.ptr}[{i}] = (int64_t){x.dim(j)};")


@kernel("size")
def _size(k: KernelCtx) -> None:
    k.w.line(f"{k.out(0).ptr}[0] = {k.inp(0).numel()};")
