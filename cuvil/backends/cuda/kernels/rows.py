"""CUDA kernels that reduce over rows: Softmax and LogSoftmax, LayerNormalization, and the
reductions (ReduceSum, ReduceMean, ReduceMax, ReduceMin, ReduceProd).

One block per row: its threads stride over the row, combine their partial results with warp
shuffles and then across warps through shared memory (``cuvil_block_*_f``, cuvil_cuda_kernels.h),
and every thread then finishes its own elements; softmax and layer norm are one kernel each, reading
the row once per statistic and writing it once.  All in float32 (f16/bf16 rows are widened on load
and rounded on store)."""

from __future__ import annotations

from cuvil.backends.c import ctypes_map as ct
from cuvil.backends.c.codegen import CodegenError
from cuvil.backends.c.kernel import CVal
from cuvil.backends.c.writer import c_float
from cuvil.backends.cuda.kernel import CudaKernelCtx, cuda_kernel
from cuvil.backends.cuda.kernels.common import check_dtypes, define_kernel
from cuvil.ir.dtypes import DType

ROW_BLOCK = 256
_FLOAT_ROWS = (DType.f32, DType.f16, DType.bf16)


def _axis(k: CudaKernelCtx, rank: int, axis: int) -> int:
    a = axis + rank if axis < 0 else axis
    if not 0 <= a < max(rank, 1):
        raise CodegenError(f"node {k.node.name!r} ({k.node.op}): axis {axis} out of range for rank {rank}")
    return a


def _split(x: CVal, axis: int) -> tuple[str, str, str]:
    """The outer count, the row length and the inner count of ``x`` around ``axis`` (C expressions)."""
    def prod(js: range) -> str:
        return "(" + " * ".join(f"(int64_t){x.dim(j)}" for j in js) + ")" if len(js) else "(int64_t)1"

    return prod(range(axis)), f"(int64_t){x.dim(axis)}" if x.rank else "(int64_t)1", prod(range(axis + 1, x.rank))


def _float_only(k: CudaKernelCtx, vals: list[CVal]) -> None:
    check_dtypes(k, vals)
    for v in vals:
        if v.dtype not in _FLOAT_ROWS:
            raise CodegenError(f"node {k.node.name!r} ({k.node.op}): the CUDA kernel takes f32, f16 or bf16, not {v.dtype}")


def _launch_rows(k: CudaKernelCtx, name: str, rows: str, args: list[str]) -> None:
    with k.w.block(f"if ({rows} > 0)"):
        k.launch(name, f"dim3(cuvil_blocks({rows}, 1))", f"dim3({ROW_BLOCK})", [rows, *args])


@cuda_kernel("softmax", "log_softmax")
def _softmax(k: CudaKernelCtx) -> None:
    x, y = k.inp(0), k.out(0)
    _float_only(k, [x, y])
    if int(k.attrs.get("coerce_2d") or 0):
        raise CodegenError(f"node {k.node.name!r} ({k.node.op}): coerce_2d has no CUDA kernel yet")
    axis = _axis(k, x.rank, int(k.attrs.get("axis", -1)))
    log = k.node.op == "log_softmax"
    finish = "(v - mx) - logf(total)" if log else "cuvil_exp_f(v - mx) / total"
    text = f"""__global__ void {{name}}(int64_t rows, int64_t n, int64_t inner, const {x.ctype} *x, {y.ctype} *y) {{
    __shared__ float scratch[32];
    for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {{
        const int64_t base = (row / inner) * n * inner + row % inner;
        float mx = -INFINITY;
        for (int64_t j = threadIdx.x; j < n; j += blockDim.x) mx = cuvil_max_f(mx, {ct.load(x.dtype, 'x', 'base + j * inner')});
        mx = cuvil_block_max_f(mx, scratch);
        float part = 0.0f;
        for (int64_t j = threadIdx.x; j < n; j += blockDim.x) part += cuvil_exp_f({ct.load(x.dtype, 'x', 'base + j * inner')} - mx);
        const float total = cuvil_block_sum_f(part, scratch);
        for (int64_t j = threadIdx.x; j < n; j += blockDim.x) {{
            const float v = {ct.load(x.dtype, 'x', 'base + j * inner')};
            {ct.store(y.dtype, 'y', 'base + j * inner', finish)}
        }}
    }}
}}"""
    name = define_kernel(k, k.node.op, text)
    outer, n, inner = _split(x, axis)
    with k.w.block(""):
        rows, nn, inn = k.tmp("rows"), k.tmp("n"), k.tmp("inner")
        k.w.line(f"const int64_t {rows} = {outer} * {inner}, {nn} = {n}, {inn} = {inner};")
        _launch_rows(k, name, rows, [nn, inn, x.ptr, y.ptr])


@cuda_kernel("layer_norm")
def _layer_norm(k: CudaKernelCtx) -> None:
    x, scale, y = k.inp(0), k.inp(1), k.out(0)
    bias = k.inp(2) if k.has(2) else None
    _float_only(k, [x, scale, y, *([bias] if bias else [])])
    stats = k.outs[1:3]  # the optional Mean and InvStdDev outputs, one float per row
    _float_only(k, list(stats))
    axis = _axis(k, x.rank, int(k.attrs.get("axis", -1)))
    eps = c_float(float(k.attrs.get("epsilon", 1e-5)))
    outer, _, _ = _split(x, axis)
    n = "(" + " * ".join(f"(int64_t){x.dim(j)}" for j in range(axis, x.rank)) + ")"
    # scale and bias broadcast over the normalized dims: read at j modulo their element count
    b_load = ct.load(bias.dtype, "b", "j % nb") if bias else "0.0f"
    text = f"""__global__ void {{name}}(int64_t rows, int64_t n, int64_t ns, int64_t nb, const {x.ctype} *x,
        const {scale.ctype} *s, const {bias.ctype if bias else 'float'} *b, {y.ctype} *y,
        {stats[0].ctype if len(stats) > 0 else 'float'} *mean_out, {stats[1].ctype if len(stats) > 1 else 'float'} *inv_out) {{
    __shared__ float scratch[32];
    (void)b; (void)nb; (void)mean_out; (void)inv_out;
    for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {{
        const int64_t base = row * n;
        float part = 0.0f;
        for (int64_t j = threadIdx.x; j < n; j += blockDim.x) part += {ct.load(x.dtype, 'x', 'base + j')};
        const float mean = cuvil_block_sum_f(part, scratch) / (float)n;
        float sq = 0.0f;
        for (int64_t j = threadIdx.x; j < n; j += blockDim.x) {{
            const float d = {ct.load(x.dtype, 'x', 'base + j')} - mean;
            sq += d * d;
        }}
        const float inv = 1.0f / sqrtf(cuvil_block_sum_f(sq, scratch) / (float)n + {eps});
        if (threadIdx.x == 0) {{
            {ct.store(stats[0].dtype, 'mean_out', 'row', 'mean') if len(stats) > 0 else ''}
            {ct.store(stats[1].dtype, 'inv_out', 'row', 'inv') if len(stats) > 1 else ''}
        }}
        for (int64_t j = threadIdx.x; j < n; j += blockDim.x) {{
            const float v = ({ct.load(x.dtype, 'x', 'base + j')} - mean) * inv * {ct.load(scale.dtype, 's', 'j % ns')} + {b_load};
            {ct.store(y.dtype, 'y', 'base + j', 'v')}
        }}
    }}
}}"""
    name = define_kernel(k, "layer_norm", text)
    with k.w.block(""):
        rows, nn = k.tmp("rows"), k.tmp("n")
        k.w.line(f"const int64_t {rows} = {outer}, {nn} = {n};")
        k.require(f"{nn} % {scale.numel()}", "0", "scale does not tile the normalized dims")
        _launch_rows(k, name, rows, [nn, scale.numel(), bias.numel() if bias else "(int64_t)1", x.ptr, scale.ptr,
                                     bias.ptr if bias else "(const float *)NULL", y.ptr,
                                     stats[0].ptr if len(stats) > 0 else "(float *)NULL",
                                     stats[1].ptr if len(stats) > 1 else "(float *)NULL"])


# op -> (block combine, identity, per-element term, finish given the combined value and count)
_REDUCE = {
    "reduce_sum": ("cuvil_block_sum_f", "0.0f", "acc += v;", "acc"),
    "reduce_mean": ("cuvil_block_sum_f", "0.0f", "acc += v;", "acc / (float)count"),
    "reduce_max": ("cuvil_block_max_f", "-INFINITY", "acc = cuvil_max_f(acc, v);", "acc"),
    "reduce_min": ("cuvil_block_min_f", "INFINITY", "acc = cuvil_min_f(acc, v);", "acc"),
    "reduce_prod": ("cuvil_block_prod_f", "1.0f", "acc *= v;", "acc"),
}


def _reduce_axes(k: CudaKernelCtx, rank: int) -> list[int] | None:
    """The reduced axes (sorted), or None for "all" (no axes given and not a no-op)."""
    axes = k.attrs.get("axes")
    if k.has(1):
        c = k.const(1)
        if c is None:
            raise CodegenError(f"node {k.node.name!r} ({k.node.op}): axes only known at run time have no CUDA kernel yet")
        axes = [int(a) for a in c.reshape(-1)]
    if axes is None or len(axes) == 0:
        if int(k.attrs.get("noop_with_empty_axes") or 0):
            return []
        return list(range(rank))
    return sorted({a + rank if a < 0 else a for a in axes})


@cuda_kernel(*_REDUCE)
def _reduce(k: CudaKernelCtx) -> None:
    x, y = k.inp(0), k.out(0)
    _float_only(k, [x, y])
    combine, identity, term, finish = _REDUCE[k.node.op]
    axes = _reduce_axes(k, x.rank) or []
    kept = [j for j in range(x.rank) if j not in axes]

    # the output element: its index over the kept dims; the reduced set: an index over the reduced dims
    def walk(var: str, dims: list[int], dname: str, sname: str, target: str) -> list[str]:
        if not dims:
            return [f"        const int64_t {target} = 0;"]
        lines = [f"        int64_t r_ = {var}, {target} = 0;"]
        for pos in range(len(dims) - 1, -1, -1):
            lines.append(f"        {target} += (r_ % {dname}.d[{pos}]) * {sname}.d[{pos}]; r_ /= {dname}.d[{pos}];")
        return lines

    out_walk = walk("o", kept, "kd", "ks", "base")
    red_walk = [ln.replace("r_", "q_") for ln in walk("e", axes, "rd", "rs", "off")]
    text = "\n".join([
        f"__global__ void {{name}}(int64_t outs, int64_t count, cuvil_dims kd, cuvil_dims ks, cuvil_dims rd, "
        f"cuvil_dims rs, const {x.ctype} *x, {y.ctype} *y) {{",
        "    __shared__ float scratch[32];",
        "    (void)kd; (void)ks; (void)rd; (void)rs;",
        "    for (int64_t o = blockIdx.x; o < outs; o += gridDim.x) {",
        *out_walk,
        f"        float acc = {identity};",
        "        for (int64_t e = threadIdx.x; e < count; e += blockDim.x) {",
        *["    " + ln for ln in red_walk],
        f"            const float v = {ct.load(x.dtype, 'x', 'base + off')};",
        f"            {term}",
        "        }",
        f"        acc = {combine}(acc, scratch);",
        f"        if (threadIdx.x == 0) {{ {ct.store(y.dtype, 'y', 'o', finish)} }}",
        "    }",
        "}",
    ])
    name = define_kernel(k, k.node.op, text)
    with k.w.block(""):
        st, kd, ks, rd, rs = (k.tmp(h) for h in ("st", "kd", "ks", "rd", "rs"))
        outs, count = k.tmp("outs"), k.tmp("count")
        k.w.line(f"const cuvil_dims {st} = cuvil_strides_of({x.shape}, {x.rank});")
        k.w.line(f"cuvil_dims {kd}, {ks}, {rd}, {rs};")
        for pos, j in enumerate(kept):
            k.w.line(f"{kd}.d[{pos}] = {x.shape}[{j}]; {ks}.d[{pos}] = {st}.d[{j}];")
        for pos, j in enumerate(axes):
            k.w.line(f"{rd}.d[{pos}] = {x.shape}[{j}]; {rs}.d[{pos}] = {st}.d[{j}];")
        k.w.line(f"for (int j_ = {len(kept)}; j_ < CUVIL_MAX_DIMS; j_++) {{ {kd}.d[j_] = 1; {ks}.d[j_] = 0; }}")
        k.w.line(f"for (int j_ = {len(axes)}; j_ < CUVIL_MAX_DIMS; j_++) {{ {rd}.d[j_] = 1; {rs}.d[j_] = 0; }}")
        prod_kept = " * ".join(f"(int64_t){x.dim(j)}" for j in kept) or "(int64_t)1"
        prod_red = " * ".join(f"(int64_t){x.dim(j)}" for j in axes) or "(int64_t)1"
        k.w.line(f"const int64_t {outs} = {prod_kept}, {count} = {prod_red};")
        with k.w.block(f"if ({outs} > 0)"):
            k.launch(name, f"dim3(cuvil_blocks({outs}, 1))", f"dim3({ROW_BLOCK})",
                     [outs, count, kd, ks, rd, rs, x.ptr, y.ptr])
