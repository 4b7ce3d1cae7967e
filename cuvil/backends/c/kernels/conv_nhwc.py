"""Kernel of ``conv_nhwc`` (``cuvil/ops/layout.py``): channels-last 2-D convolution, float32.

The generated code fills a ``cuvil_nhwc_geom`` and calls ``cuvil_conv_nhwc.h``: one GEMM per
group over the ``[N*OH*OW, M]`` output (the input itself as the left operand for a 1x1
unit-stride unpadded kernel, im2col rows of contiguous channel runs otherwise), or the direct
depthwise kernel vectorised across channels when each group has one input channel.  The bias
and, for ``fused_conv_nhwc``, the fused epilogue (``KernelCtx.epilogue``, a
``cuvil_sgemm_epilogue``) run on each finished tile or row of the output, so the kernel
reports the epilogue applied.
"""

from __future__ import annotations

from cuvil.backends.c.codegen import CodegenError
from cuvil.backends.c.kernel import CVal, KernelCtx, kernel
from cuvil.ir.dtypes import DType


def _pads(k: KernelCtx, x: CVal, y: CVal, kernel_dims: list[str]) -> list[str]:
    """The begin pads of H and W as C expressions; SAME padding is resolved at run time.

    Mirrors :func:`cuvil.ops.conv.window_attrs` and :func:`cuvil.ops.conv.resolve_pads`."""
    auto_pad = str(k.attrs.get("auto_pad", "NOTSET"))
    strides = [int(s) for s in k.attrs.get("strides") or (1, 1)]
    dilations = [int(d) for d in k.attrs.get("dilations") or (1, 1)]
    if auto_pad not in ("SAME_UPPER", "SAME_LOWER"):
        pads = [int(p) for p in k.attrs.get("pads") or (0, 0, 0, 0)] if auto_pad == "NOTSET" else [0, 0, 0, 0]
        return [str(pads[0]), str(pads[1])]
    begins = []
    for i in range(2):
        total, pb = k.tmp("pad_total"), k.tmp("pad_b")
        k.w.line(f"int64_t {total} = ((int64_t){y.dim(1 + i)} - 1) * {strides[i]} + ((int64_t){kernel_dims[i]} - 1) * "
                 f"{dilations[i]} + 1 - (int64_t){x.dim(1 + i)};")
        k.w.line(f"if ({total} < 0) {total} = 0;")
        small, large = f"({total} / 2)", f"({total} - {total} / 2)"
        k.w.line(f"const int64_t {pb} = {small if auto_pad == 'SAME_UPPER' else large};")
        begins.append(pb)
    return begins


@kernel("conv_nhwc")
def _conv_nhwc(k: KernelCtx) -> None:
    x, w, y = k.inp(0), k.inp(1), k.out(0)
    if x.dtype is not DType.f32:
        raise CodegenError(f"node {k.node.name!r} (conv_nhwc): element type {x.dtype}; the channels-last kernels "
                           "run float32 only")
    k.include("cuvil_conv_nhwc.h")
    group = int(k.attrs.get("group", 1))
    kd = [w.dim(0), w.dim(1)]
    ks = k.attrs.get("kernel_shape")
    if ks is not None:
        for i in range(2):
            k.require(kd[i], str(int(ks[i])), f"weight spatial dim {i} vs kernel_shape")
    k.require(x.dim(3), f"(int64_t){w.dim(2)} * {group}", "input channels vs weight channels x group")
    if w.static_dim(3) is None:
        k.fail_if(f"{w.dim(3)} % {group} != 0", "output channels %lld are not divisible by the group count",
                  f"(long long){w.dim(3)}")
    b = k.inp(2) if k.has(2) else None
    if b is not None:
        k.require(b.dim(0), w.dim(3), "bias length vs output channels")
    pads = _pads(k, x, y, kd)
    strides = [int(s) for s in k.attrs.get("strides") or (1, 1)]
    dilations = [int(d) for d in k.attrs.get("dilations") or (1, 1)]
    g = k.tmp("geom")
    k.w.line(f"const cuvil_nhwc_geom {g} = {{.n = {x.dim(0)}, .h = {x.dim(1)}, .w = {x.dim(2)}, .c = {x.dim(3)}, "
             f".oh = {y.dim(1)}, .ow = {y.dim(2)}, .m = {y.dim(3)}, .kh = {kd[0]}, .kw = {kd[1]}, "
             f".sh = {strides[0]}, .sw = {strides[1]}, .dh = {dilations[0]}, .dw = {dilations[1]}, "
             f".ph = {pads[0]}, .pw = {pads[1]}, .group = {group}}};")
    ep = k.epilogue or "NULL"
    bias = b.ptr if b is not None else "NULL"
    depthwise = group > 1 and w.static_dim(2) == 1
    epi = "; bias and epilogue on each finished row" if k.epilogue else ""
    if depthwise:
        k.note(f"NHWC depthwise, direct kernel vectorised across channels ({group} groups){epi}")
        k.w.line(f"cuvil_conv_nhwc_depthwise_f32(&{g}, {x.ptr}, {w.ptr}, {bias}, {y.ptr}, {ep});")
    else:
        ones = w.static_dim(0) == 1 and w.static_dim(1) == 1
        how = "GEMM on the input itself when unit-stride and unpadded" if ones else "im2col of channel runs + GEMM"
        k.note(f"NHWC convolution, {how}, per group ({group}){epi.replace('row', 'tile')}")
        rc = k.tmp("rc")
        k.w.line(f"int {rc} = cuvil_conv_nhwc_gemm_f32(&{g}, {x.ptr}, {w.ptr}, {bias}, {y.ptr}, {ep});")
        k.fail_if(f"{rc} != 0", "out of memory")
    k.epilogue_applied = k.epilogue is not None
