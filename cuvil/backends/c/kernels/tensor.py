"""Kernels of the ops that cut, join and repeat tensors: concat, split, slice, tile, trilu.

Concat and split move contiguous blocks with memcpy (one block per input
and outer index); slice and tile are strided views (``cuvil_view_copy``).
Bounds that come from tensors at run time (slice starts/ends/axes/steps,
split sizes, tile repeats) are resolved in C with the reference's rules,
and checked before any memory is touched.
"""

from __future__ import annotations

from cuvil.backends.c.kernel import KernelCtx, kernel
from cuvil.backends.c.kernels.shape import (
    const_ints,
    dims_of,
    guarded_copy,
    has_unknown_dims,
    operand,
    prod,
    require_length,
    set_output_shape,
    view_copy,
)
from cuvil.ops.common import normalize_axes, normalize_axis

# concat ------------------------------------------------------------------------


@kernel("concat")
def _concat(k: KernelCtx) -> None:
    out = k.out(0)
    ins = [k.inp(i) for i in range(len(k.ins)) if k.has(i)]
    axis = normalize_axis(k.node.op, int(k.attrs["axis"]), out.rank)
    w = k.w
    for x in ins:
        for j in range(out.rank):
            if j != axis:
                k.require(x.dim(j), out.dim(j), f"concat input dim {j} differs from the output's")
    k.require(out.dim(axis), " + ".join(f"(int64_t){x.dim(axis)}" for x in ins), "concat output dim")
    inner = prod(dims_of(out, axis + 1))
    blocks = [k.tmp("blk") for _ in ins]
    outer, ob, o, dst = k.tmp("outer"), k.tmp("ob"), k.tmp("o"), k.tmp("dst")
    w.line(f"int64_t {outer} = {prod(dims_of(out, 0, axis))}, {ob} = {out.dim(axis)} * {inner};")
    for x, b in zip(ins, blocks):
        w.line(f"int64_t {b} = (int64_t){x.dim(axis)} * {inner};")
    with w.block(f"for (int64_t {o} = 0; {o} < {outer}; {o}++)"):
        w.line(f"{out.ctype} *{dst} = {out.ptr} + {o} * {ob};")
        for x, b in zip(ins, blocks):
            guarded_copy(k, dst, f"{x.ptr} + {o} * {b}", b, out.ctype)
            w.line(f"{dst} += {b};")
        w.line(f"(void){dst};")


# split ----------------------------------------------------------------------------


@kernel("split", computes_shape=True)
def _split(k: KernelCtx) -> None:
    x = k.inp(0)
    outs = k.outs
    axis = normalize_axis(k.node.op, int(k.attrs["axis"]), x.rank)
    w = k.w
    if k.has(1) and const_ints(k, 1) is None and any(has_unknown_dims(o) for o in outs):
        require_length(k, 1, len(outs), "split")
        sizes = [k.tmp("sz") for _ in outs]
        for i, s in enumerate(sizes):
            w.line(f"int64_t {s} = {operand(k, 1, i)};")
            k.fail_if(f"{s} < 0", f"split size {i} is negative (%lld)", f"(long long){s}")
        total = " + ".join(sizes)
        k.fail_if(f"{total} != {x.dim(axis)}", f"the split sizes add up to %lld, not to dim {axis} (%lld)",
                  f"(long long)({total})", f"(long long){x.dim(axis)}")
        k.include("cuvil_index.h")
        for i, s in enumerate(sizes):
            dims = [s if j == axis else x.dim(j) for j in range(x.rank)]
            set_output_shape(k, i, dims)
    for o in outs:
        for j in range(x.rank):
            if j != axis:
                k.require(o.dim(j), x.dim(j), f"split output dim {j} differs from the input's")
    k.require(" + ".join(f"(int64_t){o.dim(axis)}" for o in outs), x.dim(axis), "the split sizes' sum")
    inner = prod(dims_of(x, axis + 1))
    outer, ib, o_, src = k.tmp("outer"), k.tmp("ib"), k.tmp("o"), k.tmp("src")
    blocks = [k.tmp("blk") for _ in outs]
    w.line(f"int64_t {outer} = {prod(dims_of(x, 0, axis))}, {ib} = (int64_t){x.dim(axis)} * {inner};")
    for c, b in zip(outs, blocks):
        w.line(f"int64_t {b} = (int64_t){c.dim(axis)} * {inner};")
    with w.block(f"for (int64_t {o_} = 0; {o_} < {outer}; {o_}++)"):
        w.line(f"const {x.ctype} *{src} = {x.ptr} + {o_} * {ib};")
        for c, b in zip(outs, blocks):
            guarded_copy(k, f"{c.ptr} + {o_} * {b}", src, b, x.ctype)
            w.line(f"{src} += {b};")
        w.line(f"(void){src};")


# slice ------------------------------------------------------------------------------


@kernel("slice", computes_shape=True)
def _slice(k: KernelCtx) -> None:
    x, out = k.inp(0), k.out(0)
    w = k.w
    r = x.rank
    n = k.inp(1).static_dim(0)
    assert n is not None  # inference requires static operand lengths
    for i, what in ((1, "starts"), (2, "ends"), (3, "axes"), (4, "steps")):
        if k.has(i):
            require_length(k, i, n, what)
    k.include("cuvil_index.h")
    start, step, length = k.tmp("start"), k.tmp("step"), k.tmp("len")
    w.line(f"int64_t {start}[{max(r, 1)}] = {{0}}, {step}[{max(r, 1)}], {length}[{max(r, 1)}];")
    for j in range(r):
        w.line(f"{step}[{j}] = 1; {length}[{j}] = {x.dim(j)};")
    axes = const_ints(k, 3) if k.has(3) else list(range(n))
    static_axes = normalize_axes(k.node.op, axes, r) if axes is not None else None
    seen = k.tmp("seen")
    if static_axes is None:
        w.line(f"int {seen}[{max(r, 1)}] = {{0}};")
    for i in range(n):
        a: str
        if static_axes is not None:
            a = str(static_axes[i])
        else:
            a = k.tmp("a")
            w.line(f"int64_t {a} = {operand(k, 3, i)};")
            k.fail_if(f"{a} < -{r} || {a} >= {r}", f"axis %lld is out of range for rank {r}", f"(long long){a}")
            w.line(f"if ({a} < 0) {a} += {r};")
            k.fail_if(f"{seen}[{a}]", "repeated axis %lld", f"(long long){a}")
            w.line(f"{seen}[{a}] = 1;")
        st = operand(k, 4, i) if k.has(4) else "INT64_C(1)"
        s = k.tmp("s")
        w.line(f"int64_t {s} = {st};")
        k.fail_if(f"{s} == 0", f"step {i} is 0")
        w.line(f"{step}[{a}] = {s}; {start}[{a}] = {operand(k, 1, i)};")
        w.line(f"{length}[{a}] = cuvil_slice_range({x.shape}[{a}], &{start}[{a}], {operand(k, 2, i)}, {s});")
    dims = [f"{length}[{j}]" for j in range(r)]
    if has_unknown_dims(out):
        set_output_shape(k, 0, dims)
    else:
        for j, d in enumerate(dims):
            k.require(out.dim(j), d, f"slice output dim {j}")
    with w.block(f"if ({out.numel()} > 0)"):
        ist, vs, off = k.tmp("ist"), k.tmp("vs"), k.tmp("off")
        w.line(f"int64_t {ist}[{max(r, 1)}], {vs}[{max(r, 1)}], {off} = 0;")
        w.line(f"cuvil_strides({x.shape}, {r}, {ist});")
        with w.block(f"for (int j = 0; j < {r}; j++)"):
            w.line(f"{off} += {start}[j] * {ist}[j]; {vs}[j] = {step}[j] * {ist}[j];")
        view_copy(k, out, f"{x.ptr} + {off}", r, length, vs)


# tile ---------------------------------------------------------------------------------


@kernel("tile", computes_shape=True)
def _tile(k: KernelCtx) -> None:
    x, out = k.inp(0), k.out(0)
    w = k.w
    r = x.rank
    require_length(k, 1, r, "repeats")
    k.include("cuvil_index.h")
    reps = [k.tmp("rep") for _ in range(r)]
    for j, rep in enumerate(reps):
        w.line(f"int64_t {rep} = {operand(k, 1, j)};")
        k.fail_if(f"{rep} < 0", f"repeats[{j}] is negative (%lld)", f"(long long){rep}")
    dims = [f"cuvil_mul_nonneg({x.dim(j)}, {rep})" for j, rep in enumerate(reps)]
    if has_unknown_dims(out):
        set_output_shape(k, 0, dims)
    else:
        for j, d in enumerate(dims):
            k.require(out.dim(j), d, f"tile output dim {j}")
    if r == 0:
        k.w.line(f"{out.ptr}[0] = {x.ptr}[0];")
        return
    # the output as a view of rank 2r: [rep0, d0, rep1, d1, ...], the repeat axes of stride 0
    ist, vshape, vs = k.tmp("ist"), k.tmp("vshape"), k.tmp("vs")
    w.line(f"int64_t {ist}[{r}], {vshape}[{2 * r}], {vs}[{2 * r}];")
    w.line(f"cuvil_strides({x.shape}, {r}, {ist});")
    for j, rep in enumerate(reps):
        w.line(f"{vshape}[{2 * j}] = {rep}; {vshape}[{2 * j + 1}] = {x.dim(j)};")
        w.line(f"{vs}[{2 * j}] = 0; {vs}[{2 * j + 1}] = {ist}[{j}];")
    with w.block(f"if ({out.numel()} > 0)"):
        view_copy(k, out, x.ptr, 2 * r, vshape, vs)


# trilu -----------------------------------------------------------------------------------


@kernel("trilu")
def _trilu(k: KernelCtx) -> None:
    x, out = k.inp(0), k.out(0)
    w = k.w
    r = x.rank
    upper = bool(k.attrs["upper"])
    rows, cols = x.dim(r - 2), x.dim(r - 1)
    if k.has(1):
        require_length(k, 1, 1, "k")
    kk, batch, b, i, row, cut = (k.tmp(h) for h in ("k", "batch", "b", "i", "row", "cut"))
    w.line(f"int64_t {kk} = {operand(k, 1, 0) if k.has(1) else 'INT64_C(0)'};")
    # beyond these bounds every row is all kept or all zeroed: clamping avoids overflow below
    w.line(f"if ({kk} < -(int64_t){rows} - 1) {kk} = -(int64_t){rows} - 1;")
    w.line(f"if ({kk} > (int64_t){cols} + 1) {kk} = (int64_t){cols} + 1;")
    w.line(f"int64_t {batch} = {prod(dims_of(x, 0, r - 2))};")
    size = f"sizeof({x.ctype})"
    with w.block(f"for (int64_t {b} = 0; {b} < {batch}; {b}++)"), w.block(f"for (int64_t {i} = 0; {i} < {rows}; {i}++)"):
        w.line(f"int64_t {row} = ({b} * {rows} + {i}) * {cols};")
        # upper keeps columns j >= i + k, lower keeps j <= i + k
        edge = f"{i} + {kk}" if upper else f"{i} + {kk} + 1"
        w.line(f"int64_t {cut} = {edge} < 0 ? 0 : ({edge} > {cols} ? {cols} : {edge});")
        keep_lo, keep_hi = (cut, cols) if upper else ("0", cut)
        zero_a = ("0", cut) if upper else (cut, cols)
        w.line(f"if ({keep_hi} > {keep_lo}) memcpy({out.ptr} + {row} + {keep_lo}, {x.ptr} + {row} + {keep_lo}, "
               f"{size} * (size_t)({keep_hi} - {keep_lo}));")
        w.line(f"if ({zero_a[1]} > {zero_a[0]}) memset({out.ptr} + {row} + {zero_a[0]}, 0, "
               f"{size} * (size_t)({zero_a[1]} - {zero_a[0]}));")
