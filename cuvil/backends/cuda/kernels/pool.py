"""CUDA kernels of pooling: MaxPool and AveragePool (1-D and 2-D, NCHW; one thread per output
element over its window) and GlobalAveragePool / GlobalMaxPool (one block per image and channel,
reducing with warp shuffles)."""

from __future__ import annotations

from cuvil.backends.c import ctypes_map as ct
from cuvil.backends.c.codegen import CodegenError
from cuvil.backends.cuda.kernel import CudaKernelCtx, cuda_kernel
from cuvil.backends.cuda.kernels.common import BLOCK, check_dtypes, define_kernel, grid_stride
from cuvil.backends.cuda.kernels.conv import conv_geometry, hw
from cuvil.backends.cuda.kernels.rows import ROW_BLOCK
from cuvil.ir.dtypes import DType


def _float(k: CudaKernelCtx) -> None:
    check_dtypes(k, [k.inp(0), k.out(0)])
    for v in (k.inp(0), k.out(0)):
        if v.dtype not in (DType.f32, DType.f16, DType.bf16):
            raise CodegenError(f"node {k.node.name!r} ({k.node.op}): the CUDA kernel takes f32, f16 or bf16, not {v.dtype}")


@cuda_kernel("max_pool", "average_pool")
def _pool(k: CudaKernelCtx) -> None:
    x, y = k.inp(0), k.out(0)
    _float(k)
    if len(k.outs) > 1:
        raise CodegenError(f"node {k.node.name!r} (max_pool): the indices output has no CUDA kernel yet")
    if int(k.attrs.get("storage_order") or 0):
        raise CodegenError(f"node {k.node.name!r} ({k.node.op}): storage_order 1 has no CUDA kernel yet")
    ks = [int(v) for v in k.attrs["kernel_shape"]]
    pads, strides, dil = conv_geometry(k, x, list(ks))
    if len(ks) == 1:
        ks = [1, *ks]
    is_max = k.node.op == "max_pool"
    include_pad = int(k.attrs.get("count_include_pad") or 0)
    if is_max:
        init, step, finish = "-INFINITY", "acc = cuvil_max_f(acc, v);", "acc"
    else:
        init, step = "0.0f", "acc += v;"
        # the divisor: taps inside the padded input (count_include_pad) or inside the input itself
        finish = "acc / (float)(padded > 0 ? padded : 1)" if include_pad else "acc / (float)(count > 0 ? count : 1)"
    text = f"""__global__ void {{name}}(int64_t total, int64_t IH, int64_t IW, int64_t OH, int64_t OW, const {x.ctype} *x,
        {y.ctype} *y) {{
    const int64_t KH = {ks[0]}, KW = {ks[1]}, SH = {strides[0]}, SW = {strides[1]}, PH = {pads[0]}, PW = {pads[1]};
    const int64_t DH = {dil[0]}, DW = {dil[1]}, PHE = {pads[2]}, PWE = {pads[3]};
    (void)PHE; (void)PWE;
    {grid_stride('idx', 'total')} {{
        const int64_t ox = idx % OW, oy = (idx / OW) % OH, plane = idx / (OW * OH);
        float acc = {init};
        int64_t count = 0, padded = 0;
        for (int64_t ky = 0; ky < KH; ky++) {{
            const int64_t iy = oy * SH - PH + ky * DH;
            for (int64_t kx = 0; kx < KW; kx++) {{
                const int64_t ix = ox * SW - PW + kx * DW;
                if (iy < IH + PHE && ix < IW + PWE) padded++;
                if (iy < 0 || iy >= IH || ix < 0 || ix >= IW) continue;
                const float v = {ct.load(x.dtype, 'x', '(plane * IH + iy) * IW + ix')};
                {step}
                count++;
            }}
        }}
        (void)count; (void)padded;
        {ct.store(y.dtype, 'y', 'idx', finish)}
    }}
}}"""
    name = define_kernel(k, k.node.op, text)
    ih, iw = hw(x)
    oh, ow = hw(y)
    with k.w.block(""):
        total = k.tmp("total")
        k.w.line(f"const int64_t {total} = (int64_t){y.dim(0)} * (int64_t){y.dim(1)} * {oh} * {ow};")
        with k.w.block(f"if ({total} > 0)"):
            k.launch(name, f"dim3(cuvil_blocks({total}, {BLOCK}))", f"dim3({BLOCK})", [total, ih, iw, oh, ow, x.ptr, y.ptr])


@cuda_kernel("global_average_pool", "global_max_pool")
def _global_pool(k: CudaKernelCtx) -> None:
    x, y = k.inp(0), k.out(0)
    _float(k)
    is_max = k.node.op == "global_max_pool"
    init, step, combine = ("-INFINITY", "acc = cuvil_max_f(acc, v);", "cuvil_block_max_f") if is_max else \
        ("0.0f", "acc += v;", "cuvil_block_sum_f")
    finish = "acc" if is_max else "acc / (float)n"
    text = f"""__global__ void {{name}}(int64_t planes, int64_t n, const {x.ctype} *x, {y.ctype} *y) {{
    __shared__ float scratch[32];
    for (int64_t p = blockIdx.x; p < planes; p += gridDim.x) {{
        float acc = {init};
        for (int64_t j = threadIdx.x; j < n; j += blockDim.x) {{
            const float v = {ct.load(x.dtype, 'x', 'p * n + j')};
            {step}
        }}
        acc = {combine}(acc, scratch);
        if (threadIdx.x == 0) {{ {ct.store(y.dtype, 'y', 'p', finish)} }}
    }}
}}"""
    name = define_kernel(k, k.node.op, text)
    with k.w.block(""):
        planes, n = k.tmp("planes"), k.tmp("n")
        spatial = " * ".join(f"(int64_t){x.dim(j)}" for j in range(2, x.rank)) or "(int64_t)1"
        k.w.line(f"const int64_t {planes} = (int64_t){x.dim(0)} * (int64_t){x.dim(1)}, {n} = {spatial};")
        with k.w.block(f"if ({planes} > 0)"):
            k.launch(name, f"dim3(cuvil_blocks({planes}, 1))", f"dim3({ROW_BLOCK})", [planes, n, x.ptr, y.ptr])
