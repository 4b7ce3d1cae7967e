"""Kernels of ``conv`` and ``conv_transpose``, and the window geometry they share with pooling.

The generated code fills a ``cuvil_conv_geom`` (sizes, strides, dilations, resolved begin pads)
and calls the runtime in ``cuvil_conv.h``: im2col + ``cuvil_sgemm`` per image and group, the
image itself as the GEMM operand for 1x1 unit-stride convolutions, a direct kernel for
depthwise 2-D convolutions, GEMM + col2im for the transposed convolution.  f16/bf16 are
converted to f32 around the f32 path (the reference accumulates them in f32); f64 runs in f64.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from cuvil.backends.c.codegen import CodegenError
from cuvil.backends.c.kernel import CVal, KernelCtx, kernel
from cuvil.ir.dtypes import DType

MAX_SPATIAL = 6  # CUVIL_CONV_MAXD in cuvil_conv.h


@dataclass(frozen=True)
class Window:
    """One spatial dim of a sliding window, as C expressions (literals where static)."""

    size: str
    out: str
    kernel: str
    stride: int
    dilation: int
    pad_begin: str
    pad_end: str


def _ints(k: KernelCtx, name: str, n: int, default: int) -> list[int]:
    value = k.attrs.get(name)
    return [default] * n if value is None else [int(v) for v in value]


def window_dims(k: KernelCtx, x: CVal, y: CVal, kernel_dims: Sequence[str]) -> list[Window]:
    """The windows of a conv/pool node from ``x`` to ``y``; SAME padding is resolved in C at run time.

    Mirrors :func:`cuvil.ops.conv.window_attrs` and :func:`cuvil.ops.conv.resolve_pads`."""
    n = x.rank - 2
    auto_pad = str(k.attrs.get("auto_pad", "NOTSET"))
    strides = _ints(k, "strides", n, 1)
    dilations = _ints(k, "dilations", n, 1)
    pads = _ints(k, "pads", 2 * n, 0)
    if auto_pad != "NOTSET":
        pads = [0] * (2 * n)
    dims: list[Window] = []
    for i in range(n):
        size, out, ker = x.dim(2 + i), y.dim(2 + i), kernel_dims[i]
        s, d = strides[i], dilations[i]
        if auto_pad in ("SAME_UPPER", "SAME_LOWER"):
            total, pb, pe = k.tmp("pad_total"), k.tmp("pad_b"), k.tmp("pad_e")
            k.w.line(f"int64_t {total} = ((int64_t){out} - 1) * {s} + ((int64_t){ker} - 1) * {d} + 1 - (int64_t){size};")
            k.w.line(f"if ({total} < 0) {total} = 0;")
            small, large = f"({total} / 2)", f"({total} - {total} / 2)"
            begin, end = (small, large) if auto_pad == "SAME_UPPER" else (large, small)
            k.w.line(f"const int64_t {pb} = {begin}, {pe} = {end};")
            k.w.line(f"(void){pe};")  # only count_include_pad pooling reads the end pad
            dims.append(Window(size, out, ker, s, d, pb, pe))
        else:
            dims.append(Window(size, out, ker, s, d, str(pads[i]), str(pads[n + i])))
    return dims


def _kernel_dims(k: KernelCtx, w: CVal) -> list[str]:
    """The kernel's spatial dims, checking ``kernel_shape`` against symbolic weight dims."""
    n = w.rank - 2
    ks = k.attrs.get("kernel_shape")
    if ks is not None:
        for i in range(n):
            k.require(w.dim(2 + i), str(int(ks[i])), f"weight spatial dim {i} vs kernel_shape")
    return [w.dim(2 + i) for i in range(n)]


def _geom(k: KernelCtx, x: CVal, y: CVal, kernel_dims: Sequence[str], wins: Sequence[Window],
          group: int, cin: str, cout: str, pads_begin: Sequence[str]) -> str:
    n = x.rank - 2
    if n > MAX_SPATIAL:
        raise CodegenError(f"node {k.node.name!r} ({k.node.op}): {n} spatial dims; the C kernel supports {MAX_SPATIAL}")
    g = k.tmp("geom")
    w = k.w
    w.line(f"cuvil_conv_geom {g};")
    w.line(f"memset(&{g}, 0, sizeof {g});")
    w.line(f"{g}.nsp = {n}; {g}.batch = {x.dim(0)}; {g}.group = {group}; {g}.cin = {cin}; {g}.cout = {cout};")
    for i in range(n):
        w.line(f"{g}.in[{i}] = {x.dim(2 + i)}; {g}.out[{i}] = {y.dim(2 + i)}; {g}.k[{i}] = {kernel_dims[i]};")
        w.line(f"{g}.stride[{i}] = {wins[i].stride}; {g}.dil[{i}] = {wins[i].dilation}; {g}.pad[{i}] = {pads_begin[i]};")
    return g


def _to_f32(k: KernelCtx, v: CVal) -> str:
    """``v``'s data as a float pointer (converted into scratch for f16/bf16)."""
    if v.dtype is DType.f32:
        return v.ptr
    buf = k.scratch("float", v.numel(), "f32")
    i = k.tmp("i")
    with k.w.block(f"for (int64_t {i} = 0; {i} < {v.numel()}; {i}++)"):
        k.w.line(f"{buf}[{i}] = {v.load(i)};")
    return buf


def _run(k: KernelCtx, fn_f32: str, fn_f64: str, g: str, x: CVal, w: CVal, y: CVal, void: bool = False) -> None:
    """Call the f32/f64 runtime function on the node's operands, converting f16/bf16 around it."""
    b = k.inp(2) if k.has(2) else None
    rc = k.tmp("rc")
    if x.dtype is DType.f64:
        args = f"&{g}, {x.ptr}, {w.ptr}, {b.ptr if b else 'NULL'}, {y.ptr}"
        k.w.line(f"int {rc} = {fn_f64}({args});")
    else:
        xp, wp = _to_f32(k, x), _to_f32(k, w)
        bp = _to_f32(k, b) if b is not None else "NULL"
        yp = y.ptr if y.dtype is DType.f32 else k.scratch("float", y.numel(), "f32")
        call = f"{fn_f32}(&{g}, {xp}, {wp}, {bp}, {yp})"
        if void:
            k.w.line(f"{call};")
            k.w.line(f"int {rc} = 0;")
        else:
            k.w.line(f"int {rc} = {call};")
        if y.dtype is not DType.f32:
            i = k.tmp("i")
            with k.w.block(f"for (int64_t {i} = 0; {i} < {y.numel()}; {i}++)"):
                k.w.line(y.store(i, f"{yp}[{i}]"))
    k.fail_if(f"{rc} != 0", "out of memory")


def _check_bias(k: KernelCtx, channels: str) -> None:
    if k.has(2):
        k.require(k.inp(2).dim(0), channels, "bias length vs output channels")


@kernel("conv")
def _conv(k: KernelCtx) -> None:
    k.include("cuvil_conv.h")
    x, w, y = k.inp(0), k.inp(1), k.out(0)
    group = int(k.attrs.get("group", 1))
    kd = _kernel_dims(k, w)
    k.require(x.dim(1), f"(int64_t){w.dim(1)} * {group}", "input channels vs weight channels x group")
    if w.static_dim(0) is None:
        k.fail_if(f"{w.dim(0)} % {group} != 0", "output channels %lld are not divisible by the group count",
                  f"(long long){w.dim(0)}")
    _check_bias(k, w.dim(0))
    wins = window_dims(k, x, y, kd)
    g = _geom(k, x, y, kd, wins, group, x.dim(1), w.dim(0), [win.pad_begin for win in wins])
    depthwise = x.rank == 4 and group > 1 and w.static_dim(1) == 1 and x.dtype is not DType.f64
    if depthwise:
        k.note(f"direct depthwise 2-D kernel, cuvil_conv_depthwise2d_f32 ({group} groups of one input channel)"
               + _precision(x))
        _run(k, "cuvil_conv_depthwise2d_f32", "", g, x, w, y, void=True)
    else:
        k.note(_gemm_plan(w, wins, group) + _precision(x))
        _run(k, "cuvil_conv_f32", "cuvil_conv_f64", g, x, w, y)


def _precision(x: CVal) -> str:
    if x.dtype is DType.f64:
        return "; in float64 (cuvil_dgemm)"
    return "" if x.dtype is DType.f32 else f"; {x.dtype} converted to float32 around it"


def _gemm_plan(w: CVal, wins: Sequence[Window], group: int) -> str:
    """What ``cuvil_conv_<sfx>`` in cuvil_conv.h will do for this node, as far as the shapes tell now."""
    ones = all(w.static_dim(2 + i) == 1 for i in range(len(wins)))
    unit = all(win.stride == 1 and win.pad_begin == "0" and win.pad_end == "0" for win in wins)
    per = "per image" + (f" and group ({group} groups)" if group > 1 else "")
    if ones and unit:
        return f"1x1 unit-stride unpadded convolution: one GEMM {per}, the image itself the GEMM operand (no im2col)"
    if not all(w.static_dim(2 + i) is not None for i in range(len(wins))) or any(
            not win.pad_begin.lstrip("-").isdigit() for win in wins):
        return (f"im2col + GEMM {per} (a 1x1 unit-stride unpadded window, known only at run time, "
                "skips the im2col)")
    return f"im2col + GEMM {per} (kernel {'x'.join(w.dim(2 + i) for i in range(len(wins)))})"


@kernel("conv_transpose")
def _conv_transpose(k: KernelCtx) -> None:
    k.include("cuvil_conv.h")
    x, w, y = k.inp(0), k.inp(1), k.out(0)
    n = x.rank - 2
    group = int(k.attrs.get("group", 1))
    kd = _kernel_dims(k, w)
    k.require(x.dim(1), w.dim(0), "input channels vs weight dim 0")
    if w.static_dim(0) is None:
        k.fail_if(f"{w.dim(0)} % {group} != 0", "input channels %lld are not divisible by the group count",
                  f"(long long){w.dim(0)}")
    cout = f"((int64_t){w.dim(1)} * {group})"
    _check_bias(k, cout)
    auto_pad = str(k.attrs.get("auto_pad", "NOTSET"))
    strides = _ints(k, "strides", n, 1)
    dilations = _ints(k, "dilations", n, 1)
    out_pad = _ints(k, "output_padding", n, 0)
    pads = _ints(k, "pads", 2 * n, 0) if auto_pad == "NOTSET" else [0] * (2 * n)
    derived = k.attrs.get("output_shape") is not None or auto_pad in ("SAME_UPPER", "SAME_LOWER")
    wins: list[Window] = []
    begins: list[str] = []
    for i in range(n):
        s, d = strides[i], dilations[i]
        wins.append(Window(x.dim(2 + i), y.dim(2 + i), kd[i], s, d, str(pads[i]), str(pads[n + i])))
        if not derived:
            begins.append(str(pads[i]))
            continue
        # Mirrors cuvil.ops.conv._transpose_geometry: the pads follow from the requested output size.
        total, half, pb = k.tmp("pad_total"), k.tmp("half"), k.tmp("pad_b")
        full = f"({s} * ((int64_t){x.dim(2 + i)} - 1) + {out_pad[i]} + ((int64_t){kd[i]} - 1) * {d} + 1)"
        k.w.line(f"const int64_t {total} = {full} - (int64_t){y.dim(2 + i)};")
        k.w.line(f"const int64_t {half} = cuvil_floordiv({total}, 2);")
        k.w.line(f"const int64_t {pb} = {half if auto_pad == 'SAME_UPPER' else f'{total} - {half}'};")
        begins.append(pb)
    g = _geom(k, x, y, kd, wins, group, x.dim(1), cout, begins)
    _run(k, "cuvil_conv_transpose_f32", "cuvil_conv_transpose_f64", g, x, w, y)
