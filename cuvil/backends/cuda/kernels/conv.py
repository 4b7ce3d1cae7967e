"""CUDA kernels of Conv (NCHW, 1-D and 2-D) and ``fused_conv`` (an elementwise epilogue).

A convolution is an implicit GEMM per image and group: the weights are the M x K matrix (output
channels by input channels x kernel taps), the input patches the K x N one (N the output pixels)
read straight from the image through the im2col index arithmetic, never materialised.  A block
computes a TILE x TILE tile of the product staging both operands through shared memory, as the
matmul kernel does; bias and epilogue run on the accumulator before the store.  A depthwise
convolution (one input and one output channel per group) has its own kernel: one thread per output
element over its taps."""

from __future__ import annotations

from cuvil.backends.c import ctypes_map as ct
from cuvil.backends.c.codegen import CodegenError
from cuvil.backends.c.kernel import CVal
from cuvil.backends.c.kernels.fused import compose
from cuvil.backends.cuda.kernel import CudaKernelCtx, cuda_kernel
from cuvil.backends.cuda.kernels.common import BLOCK, check_dtypes, define_kernel, grid_stride
from cuvil.ir.dtypes import DType
from cuvil.ops.fused import extra_kind

TILE = 16


def conv_geometry(k: CudaKernelCtx, x: CVal, kernel: list[int | None]) -> tuple[list[int], list[int], list[int]]:
    """(pads begin+end over H, W; strides; dilations) as 2-D lists (1-D: H is a unit dim).

    ``kernel``: the window's spatial size (None where only known at run time); SAME_UPPER and
    SAME_LOWER pads are computed here from it and the input's static spatial dims."""
    sp = x.rank - 2
    if sp not in (1, 2):
        raise CodegenError(f"node {k.node.name!r} ({k.node.op}): {sp}-D has no CUDA kernel yet (1-D and 2-D do)")
    auto = str(k.attrs.get("auto_pad") or "NOTSET")
    pads = list(k.attrs.get("pads") or [0] * (2 * sp))
    strides = list(k.attrs.get("strides") or [1] * sp)
    dil = list(k.attrs.get("dilations") or [1] * sp)
    if auto == "VALID":
        pads = [0] * (2 * sp)
    elif auto in ("SAME_UPPER", "SAME_LOWER"):
        sizes = [x.static_dim(2 + j) for j in range(sp)]
        if any(v is None for v in [*sizes, *kernel]):
            raise CodegenError(f"node {k.node.name!r} ({k.node.op}): auto_pad {auto} over dims known only at run "
                               "time has no CUDA kernel yet")
        pads = [0] * (2 * sp)
        for j in range(sp):
            n, s, d, kk = int(sizes[j]), int(strides[j]), int(dil[j]), int(kernel[j])  # type: ignore[arg-type]
            total = max(0, (-(-n // s) - 1) * s + (kk - 1) * d + 1 - n)
            small, big = total // 2, total - total // 2
            pads[j], pads[sp + j] = (small, big) if auto == "SAME_UPPER" else (big, small)
    elif auto != "NOTSET":
        raise CodegenError(f"node {k.node.name!r} ({k.node.op}): auto_pad {auto} is not an ONNX padding mode")
    if sp == 1:
        pads = [0, pads[0], 0, pads[1]]
        strides = [1, *strides]
        dil = [1, *dil]
    return [int(p) for p in pads], [int(s) for s in strides], [int(d) for d in dil]


def hw(v: CVal) -> tuple[str, str]:
    """The (H, W) dims of an NCHW (or NCW: H = 1) tensor as C expressions."""
    if v.rank == 3:
        return "(int64_t)1", f"(int64_t){v.dim(2)}"
    return f"(int64_t){v.dim(2)}", f"(int64_t){v.dim(3)}"


def _epilogue(k: CudaKernelCtx, y: CVal, epilogue: tuple[object, list[CVal]] | None, base: str,
              hw_expr: str) -> tuple[str, list[str], list[str]]:
    if epilogue is None:
        return base, [], []
    body, extras = epilogue
    params, args, leaves = [], [], []
    for j, e in enumerate(extras):
        kind = extra_kind(y.value.type.shape, e.value.type.shape)
        index = {"scalar": "0", "full": "idx", "row": f"(idx % {hw_expr})"}.get(kind or "")
        if index is None:
            raise CodegenError(f"node {k.node.name!r} ({k.node.op}): epilogue operand {j} has no CUDA kernel yet")
        params.append(f"const {e.ctype} *e{j}")
        args.append(e.ptr)
        leaves.append(ct.load(e.dtype, f"e{j}", index))
    return compose(body, [base, *leaves]), params, args  # type: ignore[arg-type]


def _conv(k: CudaKernelCtx, epilogue: tuple[object, list[CVal]] | None) -> None:
    x, w, y = k.inp(0), k.inp(1), k.out(0)
    b = k.inp(2) if k.has(2) else None
    check_dtypes(k, [x, w, y])
    for v in (x, w, y):
        if v.dtype not in (DType.f32, DType.f16, DType.bf16):
            raise CodegenError(f"node {k.node.name!r} ({k.node.op}): the CUDA kernel takes f32, f16 or bf16, not {v.dtype}")
    pads, strides, dil = conv_geometry(k, x, [w.static_dim(j) for j in range(2, w.rank)])
    group = int(k.attrs.get("group") or 1)
    ih, iw = hw(x)
    oh, ow = hw(y)
    kh, kw = hw(w)
    bias = ct.load(b.dtype, "bias", "oc") if b is not None else "0.0f"
    base = f"(acc + {bias})"
    expr, ep_params, ep_args = _epilogue(k, y, epilogue, base, "OW")
    params = ("int64_t C, int64_t IH, int64_t IW, int64_t OC, int64_t OH, int64_t OW, int64_t KH, int64_t KW, "
              "int64_t groups, int64_t images")
    geom = (f"const int64_t SH = {strides[0]}, SW = {strides[1]}, PH = {pads[0]}, PW = {pads[1]}, "
            f"DH = {dil[0]}, DW = {dil[1]};")
    bias_param = f"const {b.ctype if b else 'float'} *bias"
    depthwise = w.static_dim(1) == 1 and group > 1
    if depthwise:
        text = f"""__global__ void {{name}}({params}, const {x.ctype} *x, const {w.ctype} *w, {bias_param}, {y.ctype} *y{''.join(', ' + p for p in ep_params)}) {{
    {geom}
    const int64_t n = images * OC * OH * OW;
    (void)bias; (void)groups; (void)C;
    {grid_stride('idx', 'n')} {{
        const int64_t ox = idx % OW, oy = (idx / OW) % OH, oc = (idx / (OW * OH)) % OC, img = idx / (OW * OH * OC);
        const int64_t ic = oc / (OC / groups);
        float acc = 0.0f;
        for (int64_t ky = 0; ky < KH; ky++) {{
            const int64_t iy = oy * SH - PH + ky * DH;
            if (iy < 0 || iy >= IH) continue;
            for (int64_t kx = 0; kx < KW; kx++) {{
                const int64_t ix = ox * SW - PW + kx * DW;
                if (ix < 0 || ix >= IW) continue;
                acc += {ct.load(x.dtype, 'x', '((img * C + ic) * IH + iy) * IW + ix')} * {ct.load(w.dtype, 'w', '(oc * KH + ky) * KW + kx')};
            }}
        }}
        const float v = {expr};
        {ct.store(y.dtype, 'y', 'idx', 'v')}
    }}
}}"""
        name = define_kernel(k, "conv_depthwise", text)
        k.note("depthwise convolution kernel, one thread per output element")
    else:
        text = f"""__global__ void {{name}}({params}, const {x.ctype} *x, const {w.ctype} *w, {bias_param}, {y.ctype} *y{''.join(', ' + p for p in ep_params)}) {{
    {geom}
    __shared__ float ta[{TILE}][{TILE + 1}];
    __shared__ float tb[{TILE}][{TILE + 1}];
    const int tx = (int)threadIdx.x, ty = (int)threadIdx.y;
    const int64_t M = OC / groups, CG = C / groups, K = CG * KH * KW, N = OH * OW;
    (void)bias;
    for (int64_t z = blockIdx.z; z < images * groups; z += gridDim.z) {{
        const int64_t img = z / groups, g = z % groups;
        const int64_t row = (int64_t)blockIdx.y * {TILE} + ty, col = (int64_t)blockIdx.x * {TILE} + tx;
        const int64_t oy = col / OW, ox = col % OW;
        float acc = 0.0f;
        for (int64_t k0 = 0; k0 < K; k0 += {TILE}) {{
            const int64_t ka = k0 + tx, kb = k0 + ty;
            ta[ty][tx] = (row < M && ka < K) ? {ct.load(w.dtype, 'w', '(g * M + row) * K + ka')} : 0.0f;
            float vb = 0.0f;
            if (kb < K && col < N) {{
                const int64_t c = kb / (KH * KW), r = kb % (KH * KW), ky = r / KW, kx = r % KW;
                const int64_t iy = oy * SH - PH + ky * DH, ix = ox * SW - PW + kx * DW;
                if (iy >= 0 && iy < IH && ix >= 0 && ix < IW)
                    vb = {ct.load(x.dtype, 'x', '((img * C + g * CG + c) * IH + iy) * IW + ix')};
            }}
            tb[ty][tx] = vb;
            __syncthreads();
            for (int kk = 0; kk < {TILE}; kk++) acc += ta[ty][kk] * tb[kk][tx];
            __syncthreads();
        }}
        if (row < M && col < N) {{
            const int64_t oc = g * M + row;
            const int64_t idx = (img * OC + oc) * N + col;
            (void)idx; (void)oc;
            const float v = {expr};
            {ct.store(y.dtype, 'y', 'idx', 'v')}
        }}
    }}
}}"""
        name = define_kernel(k, "conv", text)
        k.note("convolution as an implicit GEMM tiled through shared memory")
    with k.w.block(""):
        names = [k.tmp(h) for h in ("C", "IH", "IW", "OC", "OH", "OW", "KH", "KW", "G", "B")]
        exprs = [f"(int64_t){x.dim(1)}", ih, iw, f"(int64_t){y.dim(1)}", oh, ow, kh, kw, f"(int64_t){group}",
                 f"(int64_t){x.dim(0)}"]
        k.w.line("const int64_t " + ", ".join(f"{n} = {e}" for n, e in zip(names, exprs)) + ";")
        c, _, _, oc, ohn, own, _, _, g, imgs = names
        k.require(f"(int64_t){w.dim(1)} * {g}", c, "input channels")
        k.require(f"(int64_t){w.dim(0)}", oc, "output channels")
        k.fail_if(f"{oc} % {g} != 0 || {c} % {g} != 0", "channels do not split into %lld groups", f"(long long){g}")
        args = [*names, x.ptr, w.ptr, b.ptr if b is not None else "(const float *)NULL", y.ptr, *ep_args]
        total = f"{imgs} * {oc} * {ohn} * {own}"
        with k.w.block(f"if ({total} > 0)"):
            if depthwise:
                k.launch(name, f"dim3(cuvil_blocks({total}, {BLOCK}))", f"dim3({BLOCK})", args)
            else:
                zs = f"{imgs} * {g}"
                grid = (f"dim3((unsigned)(({ohn} * {own} + {TILE - 1}) / {TILE}), (unsigned)(({oc} / {g} + {TILE - 1}) / "
                        f"{TILE}), (unsigned)({zs} < 65535 ? {zs} : 65535))")
                k.launch(name, grid, f"dim3({TILE}, {TILE})", args)


@cuda_kernel("conv")
def _conv_kernel(k: CudaKernelCtx) -> None:
    _conv(k, None)


@cuda_kernel("fused_conv")
def _fused_conv(k: CudaKernelCtx) -> None:
    extras = [v for v in k.ins[3:] if v is not None]
    body = k.attrs["epilogue"]
    k.note(f"epilogue before the store: {', '.join(n.op for n in body.nodes)}")
    sub = k.derive(k.node, k.ins[:3], k.outs, k.allocated)
    _conv(sub, (body, extras))  # type: ignore[arg-type]
