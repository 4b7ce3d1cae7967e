"""CUDA kernels that move data: Transpose, Expand, Slice, Concat (one strided-copy kernel), Gather
and Pad.

The strided copy walks an iteration space of up to 8 dims and reads and writes each element at a
base offset plus its coordinates times per-dim strides (computed on the host from the run-time
shapes): a transpose permutes the input's strides, an expand zeroes the broadcast ones, a slice
starts at its first element and multiplies by its steps, and each input of a concat is copied into
its window of the output.  Slice's and Pad's parameters must be constants (their values
decide the host-side strides; a parameter computed on the device has no kernel yet)."""

from __future__ import annotations

import numpy as np

from cuvil.backends.c.codegen import CodegenError
from cuvil.backends.c.kernel import CVal
from cuvil.backends.c.kernels.cast import literal
from cuvil.backends.cuda.kernel import CudaKernelCtx, cuda_kernel
from cuvil.backends.cuda.kernels.common import BLOCK, check_dtypes, define_kernel, grid_stride


def _const_ints(k: CudaKernelCtx, i: int, what: str) -> list[int]:
    c = k.const(i)
    if c is None:
        raise CodegenError(f"node {k.node.name!r} ({k.node.op}): {what} computed at run time has no CUDA kernel yet")
    return [int(v) for v in np.asarray(c).reshape(-1)]


def _axis(k: CudaKernelCtx, a: int, rank: int) -> int:
    b = a + rank if a < 0 else a
    if not 0 <= b < max(rank, 1):
        raise CodegenError(f"node {k.node.name!r} ({k.node.op}): axis {a} out of range for rank {rank}")
    return b


def strided_copy(k: CudaKernelCtx, src: CVal, dst: CVal, rank: int, dims: str, src_base: str, src_st: str,
                 dst_base: str, dst_st: str) -> None:
    """Copy the ``dims`` iteration space (a ``cuvil_dims``, ``rank`` of them) from ``src`` at
    ``src_base + sum c_j src_st[j]`` to ``dst`` at ``dst_base + sum c_j dst_st[j]``."""
    check_dtypes(k, [src, dst])
    text = f"""__global__ void {{name}}(int64_t n, cuvil_dims dims, int64_t sb, cuvil_dims ss, int64_t db, cuvil_dims ds,
        const {src.ctype} *src, {dst.ctype} *dst) {{
    {grid_stride()} {{
        int64_t r = i, so = sb, dof = db;
        for (int j = {rank - 1}; j >= 0; j--) {{
            const int64_t c = r % dims.d[j];
            r /= dims.d[j];
            so += c * ss.d[j];
            dof += c * ds.d[j];
        }}
        dst[dof] = src[so];
    }}
}}"""
    name = define_kernel(k, "move", text)
    n = k.tmp("n")
    k.w.line(f"const int64_t {n} = cuvil_numel({dims}.d, {rank});")
    with k.w.block(f"if ({n} > 0)"):
        k.launch(name, f"dim3(cuvil_blocks({n}, {BLOCK}))", f"dim3({BLOCK})",
                 [n, dims, src_base, src_st, dst_base, dst_st, src.ptr, dst.ptr])


@cuda_kernel("transpose")
def _transpose(k: CudaKernelCtx) -> None:
    x, y = k.inp(0), k.out(0)
    r = x.rank
    perm = [int(p) for p in (k.attrs.get("perm") or list(range(r))[::-1])]
    with k.w.block(""):
        st, ps, dims, ys = k.tmp("st"), k.tmp("ps"), k.tmp("dims"), k.tmp("ys")
        k.w.line(f"const cuvil_dims {st} = cuvil_strides_of({x.shape}, {r});")
        k.w.line(f"cuvil_dims {ps} = {st};")
        for j, p in enumerate(perm):
            k.w.line(f"{ps}.d[{j}] = {st}.d[{_axis(k, p, r)}];")
        k.w.line(f"const cuvil_dims {dims} = cuvil_dims_of({y.shape}, {r});")
        k.w.line(f"const cuvil_dims {ys} = cuvil_strides_of({y.shape}, {r});")
        strided_copy(k, x, y, r, dims, "0", ps, "0", ys)


@cuda_kernel("expand")
def _expand(k: CudaKernelCtx) -> None:
    x, y = k.inp(0), k.out(0)
    r = y.rank
    with k.w.block(""):
        k.fail_if(f"!cuvil_bcast_ok({x.shape}, {x.rank}, {y.shape}, {r})", "the input does not broadcast to the shape")
        st, dims, ys = k.tmp("st"), k.tmp("dims"), k.tmp("ys")
        k.w.line(f"const cuvil_dims {st} = cuvil_bcast_strides({x.shape}, {x.rank}, {r});")
        k.w.line(f"const cuvil_dims {dims} = cuvil_dims_of({y.shape}, {r});")
        k.w.line(f"const cuvil_dims {ys} = cuvil_strides_of({y.shape}, {r});")
        strided_copy(k, x, y, r, dims, "0", st, "0", ys)


@cuda_kernel("slice")
def _slice(k: CudaKernelCtx) -> None:
    x, y = k.inp(0), k.out(0)
    r = x.rank
    starts, ends = _const_ints(k, 1, "starts"), _const_ints(k, 2, "ends")
    axes = _const_ints(k, 3, "axes") if k.has(3) else list(range(len(starts)))
    steps = _const_ints(k, 4, "steps") if k.has(4) else [1] * len(starts)
    if not len(starts) == len(ends) == len(axes) == len(steps):
        raise CodegenError(f"node {k.node.name!r} (slice): starts, ends, axes and steps differ in length")
    with k.w.block(""):
        start, step, length = k.tmp("start"), k.tmp("step"), k.tmp("len")
        k.w.line(f"int64_t {start}[{max(r, 1)}] = {{0}}, {step}[{max(r, 1)}], {length}[{max(r, 1)}];")
        for j in range(r):
            k.w.line(f"{step}[{j}] = 1; {length}[{j}] = {x.dim(j)};")
        for s, e, a, t in zip(starts, ends, axes, steps):
            if t == 0:
                raise CodegenError(f"node {k.node.name!r} (slice): a step is 0")
            a = _axis(k, a, r)
            k.w.line(f"{step}[{a}] = INT64_C({t}); {start}[{a}] = INT64_C({s});")
            k.w.line(f"{length}[{a}] = cuvil_slice_range({x.shape}[{a}], &{start}[{a}], INT64_C({e}), INT64_C({t}));")
        for j in range(r):
            k.require(y.dim(j), f"{length}[{j}]", f"slice output dim {j}")
        st, vs, dims, ys, base = k.tmp("st"), k.tmp("vs"), k.tmp("dims"), k.tmp("ys"), k.tmp("base")
        k.w.line(f"const cuvil_dims {st} = cuvil_strides_of({x.shape}, {r});")
        k.w.line(f"cuvil_dims {vs} = {st}; int64_t {base} = 0;")
        k.w.line(f"for (int j_ = 0; j_ < {r}; j_++) {{ {base} += {start}[j_] * {st}.d[j_]; {vs}.d[j_] = {step}[j_] * {st}.d[j_]; }}")
        k.w.line(f"const cuvil_dims {dims} = cuvil_dims_of({y.shape}, {r});")
        k.w.line(f"const cuvil_dims {ys} = cuvil_strides_of({y.shape}, {r});")
        strided_copy(k, x, y, r, dims, base, vs, "0", ys)


@cuda_kernel("concat")
def _concat(k: CudaKernelCtx) -> None:
    y = k.out(0)
    r = y.rank
    axis = _axis(k, int(k.attrs["axis"]), r)
    with k.w.block(""):
        ys, off = k.tmp("ys"), k.tmp("off")
        k.w.line(f"const cuvil_dims {ys} = cuvil_strides_of({y.shape}, {r});")
        k.w.line(f"int64_t {off} = 0;")
        for i in range(len(k.ins)):
            if not k.has(i):
                continue
            x = k.inp(i)
            with k.w.block(""):
                st, dims = k.tmp("st"), k.tmp("dims")
                k.w.line(f"const cuvil_dims {st} = cuvil_strides_of({x.shape}, {r});")
                k.w.line(f"const cuvil_dims {dims} = cuvil_dims_of({x.shape}, {r});")
                strided_copy(k, x, y, r, dims, "0", st, f"{off} * {ys}.d[{axis}]", ys)
                k.w.line(f"{off} += {x.shape}[{axis}];")
        k.require(off, y.dim(axis), "concatenated length")


@cuda_kernel("gather")
def _gather(k: CudaKernelCtx) -> None:
    x, idx, y = k.inp(0), k.inp(1), k.out(0)
    check_dtypes(k, [x, y])
    axis = _axis(k, int(k.attrs.get("axis", 0)), x.rank)
    text = f"""__global__ void {{name}}(int64_t n, int64_t dim, int64_t count, int64_t inner, const {x.ctype} *x,
        const {idx.ctype} *ix, {y.ctype} *y, unsigned long long *status, unsigned long long check) {{
    {grid_stride()} {{
        const int64_t r = i % inner, q = (i / inner) % count, o = i / (inner * count);
        const int64_t given = (int64_t)ix[q];
        const int64_t j = given < 0 ? given + dim : given;
        if (j < 0 || j >= dim) {{
            /* read nothing; the call fails naming the node and the index once the kernels have run */
            cuvil_index_fault(status, check, given, dim);
            y[i] = ({x.ctype})0;
        }} else {{
            y[i] = x[(o * dim + j) * inner + r];
        }}
    }}
}}"""
    name = define_kernel(k, "gather", text)
    outer = " * ".join(f"(int64_t){x.dim(j)}" for j in range(axis)) or "(int64_t)1"
    inner = " * ".join(f"(int64_t){x.dim(j)}" for j in range(axis + 1, x.rank)) or "(int64_t)1"
    with k.w.block(""):
        n, cnt, inn = k.tmp("n"), k.tmp("count"), k.tmp("inner")
        k.w.line(f"const int64_t {cnt} = {idx.numel()}, {inn} = {inner}, {n} = {outer} * {cnt} * {inn};")
        with k.w.block(f"if ({n} > 0)"):
            status, check = k.index_check(f"index %lld is out of range for axis {axis} of size %lld")
            k.launch(name, f"dim3(cuvil_blocks({n}, {BLOCK}))", f"dim3({BLOCK})",
                     [n, f"(int64_t){x.dim(axis)}", cnt, inn, x.ptr, idx.ptr, y.ptr, status, check])


@cuda_kernel("pad")
def _pad(k: CudaKernelCtx) -> None:
    x, y = k.inp(0), k.out(0)
    check_dtypes(k, [x, y])
    r = x.rank
    mode = str(k.attrs.get("mode", "constant"))
    if mode not in ("constant", "edge", "reflect"):
        raise CodegenError(f"node {k.node.name!r} (pad): mode {mode} has no CUDA kernel yet")
    pads = _const_ints(k, 1, "pads")
    axes = [_axis(k, a, r) for a in _const_ints(k, 3, "axes")] if k.has(3) else list(range(r))
    if len(pads) != 2 * len(axes):
        raise CodegenError(f"node {k.node.name!r} (pad): {len(pads)} pads for {len(axes)} axes")
    begin = [0] * r
    for a, p in zip(axes, pads[: len(axes)]):
        begin[a] = p
    value = "0"
    if mode == "constant" and k.has(2):
        c = k.const(2)
        if c is None:
            raise CodegenError(f"node {k.node.name!r} (pad): a constant value computed at run time has no CUDA kernel yet")
        value = literal(np.asarray(c).reshape(-1)[:1].reshape(()), x.dtype)
    fix = {"constant": "inside = 0;", "edge": "c = c < 0 ? 0 : dim - 1;",
           "reflect": "c = c < 0 ? -c : 2 * (dim - 1) - c;"}[mode]
    text = f"""__global__ void {{name}}(int64_t n, cuvil_dims od, cuvil_dims xd, cuvil_dims pb, cuvil_dims xs,
        const {x.ctype} *x, {y.ctype} *y) {{
    {grid_stride()} {{
        int64_t r = i, off = 0;
        int inside = 1;
        for (int j = {r - 1}; j >= 0; j--) {{
            int64_t c = r % od.d[j] - pb.d[j];
            const int64_t dim = xd.d[j];
            r /= od.d[j];
            if (c < 0 || c >= dim) {{ {fix} }}
            off += c * xs.d[j];
        }}
        y[i] = inside ? x[off] : ({x.ctype})({value});
    }}
}}"""
    name = define_kernel(k, f"pad_{mode}", text)
    with k.w.block(""):
        n, od, xd, pb, xs = k.tmp("n"), k.tmp("od"), k.tmp("xd"), k.tmp("pb"), k.tmp("xs")
        k.w.line(f"const int64_t {n} = {y.numel()};")
        k.w.line(f"const cuvil_dims {od} = cuvil_dims_of({y.shape}, {r}), {xd} = cuvil_dims_of({x.shape}, {r}), "
                 f"{xs} = cuvil_strides_of({x.shape}, {r});")
        k.w.line(f"cuvil_dims {pb}; for (int j_ = 0; j_ < CUVIL_MAX_DIMS; j_++) {pb}.d[j_] = 0;")
        for j, p in enumerate(begin):
            if p:
                k.w.line(f"{pb}.d[{j}] = INT64_C({p});")
        if mode != "constant":
            k.fail_if(f"{n} > 0 && cuvil_numel({x.shape}, {r}) == 0", f"{mode} padding needs a non-empty input")
        with k.w.block(f"if ({n} > 0)"):
            k.launch(name, f"dim3(cuvil_blocks({n}, {BLOCK}))", f"dim3({BLOCK})", [n, od, xd, pb, xs, x.ptr, y.ptr])
