"""CUDA kernels of MatMul (batched, broadcasting), Gemm and their fused forms with an elementwise
epilogue (``fused_matmul``, ``fused_gemm``: bias, activation, residual).

One tiled kernel serves them all: a block computes a TILE x TILE tile of one product, staging
TILE x TILE tiles of A and B through shared memory (a barrier after the loads, another before
they are overwritten), accumulating in float32; operands are read through row and column strides,
so transposed Gemm operands need no copy; the epilogue (Gemm's alpha and beta * C, then the fused
ops' composed expression) runs on the accumulator before the one store."""

from __future__ import annotations

from cuvil.backends.c import ctypes_map as ct
from cuvil.backends.c.codegen import CodegenError
from cuvil.backends.c.kernel import CVal
from cuvil.backends.c.kernels.fused import compose
from cuvil.backends.c.writer import c_float
from cuvil.backends.cuda.kernel import CudaKernelCtx, cuda_kernel
from cuvil.backends.cuda.kernels.common import check_dtypes, define_kernel
from cuvil.faults import active
from cuvil.ir.dtypes import DType
from cuvil.ops.fused import extra_kind

TILE = 16
_FLOATS = (DType.f32, DType.f16, DType.bf16)


def _tile_kernel(k: CudaKernelCtx, a: CVal, b: CVal, y: CVal, batch_rank: int, epilogue: str,
                 extra_params: list[str]) -> str:
    faults = k.options.faults  # planted faults (cuvil/faults.py): the barrier and the inner bound live here
    sync = "" if active("cuda-matmul-no-sync", faults) else "__syncthreads();"
    bound = "<=" if active("cuda-matmul-tile-bound", faults) else "<"
    text = f"""__global__ void {{name}}(int64_t M, int64_t N, int64_t K, int64_t a_rs, int64_t a_cs, int64_t b_rs,
        int64_t b_cs, int64_t batches, cuvil_dims bd, cuvil_dims as, cuvil_dims bs, const {a.ctype} *a,
        const {b.ctype} *b, {y.ctype} *y{''.join(', ' + p for p in extra_params)}) {{
    __shared__ float ta[{TILE}][{TILE + 1}];
    __shared__ float tb[{TILE}][{TILE + 1}];
    const int tx = (int)threadIdx.x, ty = (int)threadIdx.y;
    (void)bd; (void)as; (void)bs;
    for (int64_t z = blockIdx.z; z < batches; z += gridDim.z) {{
        int64_t ao = 0, bo = 0;
        {{
            int64_t r = z;
            for (int j = {batch_rank - 1}; j >= 0; j--) {{
                const int64_t c = r % bd.d[j];
                r /= bd.d[j];
                ao += c * as.d[j];
                bo += c * bs.d[j];
            }}
        }}
        const int64_t row = (int64_t)blockIdx.y * {TILE} + ty, col = (int64_t)blockIdx.x * {TILE} + tx;
        float acc = 0.0f;
        for (int64_t k0 = 0; k0 < K; k0 += {TILE}) {{
            const int64_t ka = k0 + tx, kb = k0 + ty;
            ta[ty][tx] = (row < M && ka {bound} K) ? {ct.load(a.dtype, 'a', 'ao + row * a_rs + ka * a_cs')} : 0.0f;
            tb[ty][tx] = (kb {bound} K && col < N) ? {ct.load(b.dtype, 'b', 'bo + kb * b_rs + col * b_cs')} : 0.0f;
            __syncthreads();
            for (int kk = 0; kk < {TILE}; kk++) acc += ta[ty][kk] * tb[kk][tx];
            {sync}
        }}
        if (row < M && col < N) {{
            const int64_t idx = (z * M + row) * N + col;
            (void)idx;
            const float v = {epilogue};
            {ct.store(y.dtype, 'y', 'idx', 'v')}
        }}
    }}
}}"""
    return define_kernel(k, k.node.op, text)


def _wmma_kernel(k: CudaKernelCtx, y: CVal, batch_rank: int, epilogue: str, extra_params: list[str]) -> str:
    """The f16 product on tensor cores: one warp per TILE x TILE tile of the output, the operand
    tiles staged through shared memory as halves, 16 x 16 x 16 WMMA products accumulated in float32,
    the epilogue applied to the accumulator tile (read back through shared memory) before the store.
    Under HIP (no nvcuda::wmma) the unit has no such kernel and launches the scalar one."""
    text = f"""#if CUVIL_HAS_WMMA
__global__ void {{name}}(int64_t M, int64_t N, int64_t K, int64_t a_rs, int64_t a_cs, int64_t b_rs,
        int64_t b_cs, int64_t batches, cuvil_dims bd, cuvil_dims as, cuvil_dims bs, const cuvil_f16 *a16,
        const cuvil_f16 *b16, {y.ctype} *y{''.join(', ' + p for p in extra_params)}) {{
    using namespace nvcuda;
    __shared__ __half ta[{TILE} * {TILE}];
    __shared__ __half tb[{TILE} * {TILE}];
    __shared__ float tc[{TILE} * {TILE}];
    const __half *a = reinterpret_cast<const __half *>(a16), *b = reinterpret_cast<const __half *>(b16);
    const int lane = (int)threadIdx.x;
    (void)bd; (void)as; (void)bs;
    for (int64_t z = blockIdx.z; z < batches; z += gridDim.z) {{
        int64_t ao = 0, bo = 0;
        {{
            int64_t r = z;
            for (int j = {batch_rank - 1}; j >= 0; j--) {{
                const int64_t c = r % bd.d[j];
                r /= bd.d[j];
                ao += c * as.d[j];
                bo += c * bs.d[j];
            }}
        }}
        const int64_t r0 = (int64_t)blockIdx.y * {TILE}, c0 = (int64_t)blockIdx.x * {TILE};
        wmma::fragment<wmma::accumulator, 16, 16, 16, float> fc;
        wmma::fill_fragment(fc, 0.0f);
        for (int64_t k0 = 0; k0 < K; k0 += {TILE}) {{
            for (int e = lane; e < {TILE * TILE}; e += 32) {{
                const int64_t i = e / {TILE}, j = e % {TILE};
                const int64_t row = r0 + i, ka = k0 + j, kb = k0 + i, col = c0 + j;
                ta[e] = (row < M && ka < K) ? a[ao + row * a_rs + ka * a_cs] : __float2half(0.0f);
                tb[e] = (kb < K && col < N) ? b[bo + kb * b_rs + col * b_cs] : __float2half(0.0f);
            }}
            __syncwarp();
            wmma::fragment<wmma::matrix_a, 16, 16, 16, __half, wmma::row_major> fa;
            wmma::fragment<wmma::matrix_b, 16, 16, 16, __half, wmma::row_major> fb;
            wmma::load_matrix_sync(fa, ta, {TILE});
            wmma::load_matrix_sync(fb, tb, {TILE});
            wmma::mma_sync(fc, fa, fb, fc);
            __syncwarp();
        }}
        wmma::store_matrix_sync(tc, fc, {TILE}, wmma::mem_row_major);
        __syncwarp();
        for (int e = lane; e < {TILE * TILE}; e += 32) {{
            const int64_t row = r0 + e / {TILE}, col = c0 + e % {TILE};
            if (row < M && col < N) {{
                const int64_t idx = (z * M + row) * N + col;
                (void)idx;
                const float acc = tc[e];
                const float v = {epilogue};
                {ct.store(y.dtype, 'y', 'idx', 'v')}
            }}
        }}
        __syncwarp();
    }}
}}
#endif"""
    return define_kernel(k, f"{k.node.op}_wmma", text)


def _extras(k: CudaKernelCtx, y: CVal, extras: list[CVal], n_leaf: int) -> tuple[list[str], list[str], list[str]]:
    """Each epilogue operand as a kernel parameter, the argument passed and the leaf it reads."""
    params, args, leaves = [], [], []
    for j, e in enumerate(extras):
        kind = extra_kind(y.value.type.shape, e.value.type.shape)
        index = {"scalar": "0", "full": "idx", "row": "col"}.get(kind or "")
        if index is None:
            raise CodegenError(f"node {k.node.name!r} ({k.node.op}): epilogue operand {j} of shape "
                               f"{e.value.type.shape} has no CUDA kernel yet")
        params.append(f"const {e.ctype} *e{j + n_leaf}")
        args.append(e.ptr)
        leaves.append(ct.load(e.dtype, f"e{j + n_leaf}", index))
    return params, args, leaves


def _launch(k: CudaKernelCtx, name: str, m: str, n: str, kk: str, strides: list[str], batches: str,
            batch: tuple[str, str, str], ptrs: list[str], wmma: str | None = None) -> None:
    """Launch the tiled kernel ``name`` (or, where the compiler has WMMA, ``wmma``: one warp a tile)."""
    with k.w.block(f"if ({m} > 0 && {n} > 0 && {batches} > 0)"):
        grid = (f"dim3((unsigned)(({n} + {TILE - 1}) / {TILE}), (unsigned)(({m} + {TILE - 1}) / {TILE}), "
                f"(unsigned)({batches} < 65535 ? {batches} : 65535))")
        args = [m, n, kk, *strides, batches, *batch, *ptrs]
        if wmma is None:
            k.launch(name, grid, f"dim3({TILE}, {TILE})", args)
            return
        k.w.line("#if CUVIL_HAS_WMMA")
        k.launch(wmma, grid, "dim3(32)", args)
        k.w.line("#else")
        k.launch(name, grid, f"dim3({TILE}, {TILE})", args)
        k.w.line("#endif")


def _on_tensor_cores(k: CudaKernelCtx, a: CVal, b: CVal) -> bool:
    """f16 operands run on tensor cores (WMMA), unless a planted fault lives in the scalar kernel."""
    faults = k.options.faults
    return (a.dtype is DType.f16 and b.dtype is DType.f16 and not active("cuda-matmul-no-sync", faults)
            and not active("cuda-matmul-tile-bound", faults))


def _matmul(k: CudaKernelCtx, epilogue: tuple[object, list[CVal]] | None) -> None:
    a, b, y = k.inp(0), k.inp(1), k.out(0)
    check_dtypes(k, [a, b, y])
    for v in (a, b, y):
        if v.dtype not in _FLOATS:
            raise CodegenError(f"node {k.node.name!r} ({k.node.op}): the CUDA kernel takes f32, f16 or bf16, not {v.dtype}")
    if a.rank == 1 and b.rank == 1:
        batch_rank = 0
    elif a.rank == 1:
        batch_rank = b.rank - 2
    elif b.rank == 1:
        batch_rank = a.rank - 2
    else:
        batch_rank = y.rank - 2
    params: list[str] = []
    ptr_extra: list[str] = []
    expr = "acc"
    if epilogue is not None:
        body, extras = epilogue
        params, ptr_extra, leaves = _extras(k, y, extras, 0)
        expr = compose(body, ["acc", *leaves])  # type: ignore[arg-type]
    name = _tile_kernel(k, a, b, y, batch_rank, expr, params)
    wmma = _wmma_kernel(k, y, batch_rank, expr, params) if _on_tensor_cores(k, a, b) else None
    with k.w.block(""):
        m, n, kk = k.tmp("M"), k.tmp("N"), k.tmp("K")
        m_e = "(int64_t)1" if a.rank == 1 else f"(int64_t){a.dim(a.rank - 2)}"
        k_e = f"(int64_t){a.dim(a.rank - 1)}"
        n_e = "(int64_t)1" if b.rank == 1 else f"(int64_t){b.dim(b.rank - 1)}"
        k.w.line(f"const int64_t {m} = {m_e}, {n} = {n_e}, {kk} = {k_e};")
        k.require(kk, f"(int64_t){b.dim(0 if b.rank == 1 else b.rank - 2)}", "inner dims")
        bd, as_, bs = k.tmp("bd"), k.tmp("as"), k.tmp("bs")
        batches = k.tmp("batches")
        a_mat = max(a.rank - 2, 0)
        b_mat = max(b.rank - 2, 0)
        k.w.line(f"const cuvil_dims {bd} = cuvil_dims_of({y.shape}, {batch_rank});")
        k.w.line(f"cuvil_dims {as_} = cuvil_bcast_strides({a.shape}, {a_mat}, {batch_rank});")
        k.w.line(f"cuvil_dims {bs} = cuvil_bcast_strides({b.shape}, {b_mat}, {batch_rank});")
        k.w.line(f"for (int j_ = 0; j_ < CUVIL_MAX_DIMS; j_++) {{ {as_}.d[j_] *= {m} * {kk}; {bs}.d[j_] *= {kk} * {n}; }}")
        prod = " * ".join(f"(int64_t){y.dim(j)}" for j in range(batch_rank)) or "(int64_t)1"
        k.w.line(f"const int64_t {batches} = {prod};")
        strides = [kk, "(int64_t)1", n, "(int64_t)1"] if b.rank > 1 else [kk, "(int64_t)1", "(int64_t)1", "(int64_t)0"]
        _launch(k, name, m, n, kk, strides, batches, (bd, as_, bs), [a.ptr, b.ptr, y.ptr, *ptr_extra], wmma)


def _gemm(k: CudaKernelCtx, epilogue: tuple[object, list[CVal]] | None) -> None:
    a, b, y = k.inp(0), k.inp(1), k.out(0)
    c = k.inp(2) if k.has(2) else None
    check_dtypes(k, [a, b, y])
    ta, tb = int(k.attrs.get("transA") or 0), int(k.attrs.get("transB") or 0)
    alpha, beta = float(k.attrs.get("alpha", 1.0)), float(k.attrs.get("beta", 1.0))
    params: list[str] = []
    ptr_extra: list[str] = []
    expr = "acc" if alpha == 1.0 else f"({c_float(alpha)} * acc)"
    if c is not None and beta != 0.0:
        params.append(f"const {c.ctype} *cb")
        params.append("int64_t c_r, int64_t c_c")
        term = ct.load(c.dtype, "cb", "row * c_r + col * c_c")
        expr = f"({expr} + {term})" if beta == 1.0 else f"({expr} + {c_float(beta)} * {term})"
    if epilogue is not None:
        body, extras = epilogue
        p2, ptr_extra, leaves = _extras(k, y, extras, 0)
        params += p2
        expr = compose(body, [expr, *leaves])  # type: ignore[arg-type]
    name = _tile_kernel(k, a, b, y, 0, expr, params)
    wmma = _wmma_kernel(k, y, 0, expr, params) if _on_tensor_cores(k, a, b) else None
    with k.w.block(""):
        m, n, kk = k.tmp("M"), k.tmp("N"), k.tmp("K")
        k.w.line(f"const int64_t {m} = {a.dim(1 if ta else 0)}, {kk} = {a.dim(0 if ta else 1)}, "
                 f"{n} = {b.dim(0 if tb else 1)};")
        k.require(kk, f"(int64_t){b.dim(1 if tb else 0)}", "inner dims")
        strides = [("(int64_t)1" if ta else kk), (m if ta else "(int64_t)1"),
                   ("(int64_t)1" if tb else n), (kk if tb else "(int64_t)1")]
        zero = k.tmp("zd")
        k.w.line(f"const cuvil_dims {zero} = cuvil_dims_of({y.shape}, 0);")
        cargs: list[str] = []
        if c is not None and beta != 0.0:
            cs = k.tmp("cs")
            k.w.line(f"const cuvil_dims {cs} = cuvil_bcast_strides({c.shape}, {c.rank}, 2);")
            cargs = [c.ptr, f"{cs}.d[0]", f"{cs}.d[1]"]
        _launch(k, name, m, n, kk, strides, "(int64_t)1", (zero, zero, zero), [a.ptr, b.ptr, y.ptr, *cargs, *ptr_extra],
                wmma)


@cuda_kernel("matmul")
def _matmul_kernel(k: CudaKernelCtx) -> None:
    _matmul(k, None)


@cuda_kernel("gemm")
def _gemm_kernel(k: CudaKernelCtx) -> None:
    _gemm(k, None)


@cuda_kernel("fused_matmul", "fused_gemm")
def _fused(k: CudaKernelCtx) -> None:
    n_base = 2 if k.node.op == "fused_matmul" else 3
    extras = [v for v in k.ins[n_base:] if v is not None]
    body = k.attrs["epilogue"]
    k.note(f"epilogue before the store: {', '.join(n.op for n in body.nodes)}")
    sub = k.derive(k.node, k.ins[:n_base], k.outs, k.allocated)
    (_matmul if n_base == 2 else _gemm)(sub, (body, extras))  # type: ignore[arg-type]
