"""Kernel of ``conv_nhwc`` (``cuvil/ops/layout.py``): channels-last 2-D convolution, float32 (f16 / bf16
operands are widened to it and the result rounded once; a bf16 1x1 convolution runs on vdpbf16ps where
the target has AVX512_BF16).

The generated code fills a ``cuvil_nhwc_geom`` and calls the runtime: the direct kernel
(``cuvil_nhwc_direct.h``: the input read in place, the weights packed once per model into panels
as wide as the output channels need; im2col + GEMM in ``cuvil_conv_nhwc.h`` when the panels would
outgrow the cache or the target has no vector extensions), or the depthwise kernel vectorised
across channels when each group has one input channel.  The bias and, for ``fused_conv_nhwc``,
the fused epilogue (``KernelCtx.epilogue``, a ``cuvil_sgemm_epilogue``) run on each finished strip
or row of the float32 output, so the kernel reports the epilogue applied.
"""

from __future__ import annotations

from cuvil.backends.c.codegen import CodegenError
from cuvil.backends.c.kernel import CVal, KernelCtx, kernel
from cuvil.backends.c.kernels.half import HALF
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
    if x.dtype not in (DType.f32, *HALF):
        raise CodegenError(f"node {k.node.name!r} (conv_nhwc): element type {x.dtype}; the channels-last kernels "
                           "run float32, float16 and bfloat16 only")
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
    depthwise = group > 1 and w.static_dim(2) == 1
    if x.dtype in HALF:
        _half(k, g, depthwise, group, x, w, b, y)
        return
    ep = k.epilogue or "NULL"
    bias = b.ptr if b is not None else "NULL"
    epi = "; bias and epilogue on each finished row" if k.epilogue else ""
    if depthwise:
        k.note(f"NHWC depthwise, direct kernel vectorised across channels ({group} groups){epi}")
        k.w.line(f"cuvil_conv_nhwc_depthwise_f32(&{g}, {x.ptr}, {w.ptr}, {bias}, {y.ptr}, {ep});")
    else:
        k.note(f"NHWC convolution, direct (input read in place, weights in panels of the output channels; "
               f"im2col of channel runs + GEMM when the panels outgrow the cache or the target has no vectors), "
               f"{group} group(s){epi.replace('row', 'strip')}")
        rc = k.tmp("rc")
        k.w.line(f"int {rc} = cuvil_conv_nhwc_f32(&{g}, {x.ptr}, {w.ptr}, {bias}, {y.ptr}, {ep});")
        k.fail_if(f"{rc} != 0", "out of memory")
    k.epilogue_applied = k.epilogue is not None


def _half(k: KernelCtx, g: str, depthwise: bool, group: int, x: CVal, w: CVal, b: CVal | None, y: CVal) -> None:
    """f16 / bf16 operands: the float32 kernel on widened operands, the result rounded once
    (``cuvil_conv_nhwc_half.h``).  A dense convolution widens the whole input into float32 scratch
    and rounds a float32 result (a bf16 1x1 one on a target with AVX512_BF16 is a vdpbf16ps
    product instead, the scratch unused); a depthwise one widens bands of input rows per thread and
    needs no scratch from the call.  A fused clamp (``KernelCtx.clamp``) is applied before the
    rounding, so no pass over the result follows."""
    k.include("cuvil_conv_nhwc_half.h")
    rc = k.tmp("rc")
    lo, hi = k.clamp or ("-INFINITY", "INFINITY")
    if depthwise:
        x32 = y32 = "NULL"
    else:
        x32, y32 = k.tmp("x32"), k.tmp("y32")
        for buf, v in ((x32, x), (y32, y)):  # written whole before being read: not zeroed
            k.w.line(f"float *{buf} = (float *)cuvil_alloc_uninit(call, (int64_t)sizeof(float) * (int64_t)({v.numel()}));")
            k.fail_if(f"!{buf}", "out of memory")
    bptr = f"(const uint16_t *){b.ptr}" if b is not None else "NULL"
    bn = b.numel() if b is not None else "0"
    k.w.line(f"int {rc} = cuvil_conv_nhwc_half(&{g}, {int(depthwise)}, {int(x.dtype is DType.bf16)}, "
             f"(const uint16_t *){x.ptr}, {x.numel()}, (const uint16_t *){w.ptr}, {w.numel()}, {bptr}, {bn}, "
             f"(uint16_t *){y.ptr}, {y.numel()}, {x32}, {y32}, {lo}, {hi});")
    k.epilogue_applied = k.clamp is not None
    if not depthwise:
        k.release(x32)
        k.release(y32)
    k.fail_if(f"{rc} != 0", "out of memory")
    kind = f"NHWC depthwise ({group} groups)" if depthwise else f"NHWC convolution, direct, {group} group(s)"
    dot = " (a 1x1 one on vdpbf16ps where the target has AVX512_BF16)" if x.dtype is DType.bf16 and not depthwise else ""
    how = "bands of input rows widened per thread" if depthwise else "operands widened"
    clamp = "; its clamp (relu or clip) applied before the rounding" if k.clamp else ""
    k.note(f"{kind} on {x.dtype} {how} to float32 (weights once per model), the result rounded once{dot}{clamp}")
