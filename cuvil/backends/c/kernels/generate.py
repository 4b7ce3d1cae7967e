"""Kernels of the ops that make tensors from a shape or a few scalars: constant_of_shape, eye_like, range.

Shapes and lengths read from tensors at run time follow the reference's
rules (no negative dims; range's length max(ceil((limit - start) / delta), 0),
exact for integers) and are checked for overflow before allocating.
"""

from __future__ import annotations

import numpy as np

from cuvil.backends.c import ctypes_map as ct
from cuvil.backends.c.kernel import KernelCtx, kernel
from cuvil.backends.c.kernels.shape import has_unknown_dims, operand, require_length, set_output_shape
from cuvil.backends.c.writer import c_float, c_int
from cuvil.ir.dtypes import DType


def c_literal(dtype: DType, value: np.ndarray) -> str:
    """The one element of ``value`` as a C expression of ``dtype``'s storage type (bit-exact for floats)."""
    v = np.asarray(value, dtype=dtype.np).reshape(-1)[0]
    if dtype in (DType.f16, DType.bf16):
        return f"({ct.storage(dtype)})0x{int(np.asarray(v).view(np.uint16)):04x}u"
    if dtype is DType.f32:
        return c_float(float(v))
    if dtype is DType.f64:
        return c_float(float(v), suffix="")
    if dtype is DType.bool:
        return f"(cuvil_bool){int(bool(v))}"
    if dtype in (DType.u8, DType.u16, DType.u32, DType.u64):
        return f"({ct.storage(dtype)})UINT64_C({int(v)})"
    return f"({ct.storage(dtype)}){c_int(int(v))}"


# constant_of_shape ---------------------------------------------------------------------


@kernel("constant_of_shape", computes_shape=True)
def _constant_of_shape(k: KernelCtx) -> None:
    out = k.out(0)
    w = k.w
    value = k.attrs["value"]
    value = np.zeros((), np.float32) if value is None else np.asarray(value)
    if has_unknown_dims(out):
        n = out.rank
        require_length(k, 0, n, "the shape input")
        dims = [k.tmp("d") for _ in range(n)]
        for j, d in enumerate(dims):
            w.line(f"const int64_t {d} = {operand(k, 0, j)};")
            k.fail_if(f"{d} < 0", f"the shape has a negative dim %lld at {j}", f"(long long){d}")
        k.include("cuvil_index.h")
        set_output_shape(k, 0, dims)
    n_, i, v = k.tmp("n"), k.tmp("i"), k.tmp("v")
    w.line(f"const int64_t {n_} = {out.numel()}; const {out.ctype} {v} = {c_literal(out.dtype, value)};")
    w.line(f"for (int64_t {i} = 0; {i} < {n_}; {i}++) {out.ptr}[{i}] = {v};")


# eye_like --------------------------------------------------------------------------------


@kernel("eye_like")
def _eye_like(k: KernelCtx) -> None:
    out = k.out(0)
    w = k.w
    # a diagonal beyond +-2**62 is empty for any tensor that fits in memory; clamping keeps i + k exact
    diag = max(min(int(k.attrs["k"]), 2**62), -(2**62))
    rows, cols = out.dim(0), out.dim(1)
    i, j = k.tmp("i"), k.tmp("j")
    w.line(f"if ({out.numel()} > 0) memset({out.ptr}, 0, sizeof({out.ctype}) * (size_t){out.numel()});")
    with w.block(f"for (int64_t {i} = {max(0, -diag)}; {i} < {rows}; {i}++)"):
        w.line(f"const int64_t {j} = {i} + {c_int(diag)};")
        w.line(f"if ({j} >= {cols}) break;")
        w.line(out.store(f"{i} * {cols} + {j}", "1"))


# range --------------------------------------------------------------------------------------


@kernel("range", computes_shape=True)
def _range(k: KernelCtx) -> None:
    out = k.out(0)
    w = k.w
    dtype = out.dtype
    for j, what in enumerate(("start", "limit", "delta")):
        require_length(k, j, 1, what)
    n, i = k.tmp("n"), k.tmp("i")
    if dtype.is_float:
        # the length is computed in double from the values in the stash type, as the reference does
        stash = "float" if dtype in (DType.f16, DType.bf16) and k.attrs["stash_type"] is DType.f32 else "double"
        s, lim, d, q = k.tmp("start"), k.tmp("limit"), k.tmp("delta"), k.tmp("q")
        for name, idx in ((s, 0), (lim, 1), (d, 2)):
            w.line(f"const {stash} {name} = ({stash}){k.inp(idx).load('0')};")
        k.fail_if(f"{d} == 0", "delta must not be 0")
        w.line(f"const double {q} = ceil(((double){lim} - (double){s}) / (double){d});")
        k.fail_if(f"!({q} > -INFINITY && {q} < 9223372036854775808.0)", "the length of the range (%g) is not a valid size", q)
        w.line(f"const int64_t {n} = {q} > 0 ? (int64_t){q} : 0;")
        value = f"({s} + ({stash}){i} * {d})"
    else:
        s, d = k.tmp("start"), k.tmp("delta")
        w.line(f"const int64_t {s} = (int64_t){k.inp(0).ptr}[0], {d} = (int64_t){k.inp(2).ptr}[0];")
        k.fail_if(f"{d} == 0", "delta must not be 0")
        w.line(f"const int64_t {n} = cuvil_range_len({s}, (int64_t){k.inp(1).ptr}[0], {d});")
        k.fail_if(f"{n} < 0", "the range is too long")
        # start + i * delta lies between start and limit: exact, computed with wrapping arithmetic
        value = f"(int64_t)((uint64_t){s} + (uint64_t){i} * (uint64_t){d})"
    k.include("cuvil_index.h")
    if has_unknown_dims(out):
        set_output_shape(k, 0, [n])
    else:
        k.require(out.dim(0), n, "range length")
    w.line(f"for (int64_t {i} = 0; {i} < {n}; {i}++) {ct.store(dtype, out.ptr, i, value)}")
