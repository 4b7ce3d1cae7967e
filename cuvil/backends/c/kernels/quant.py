"""Kernels of the linear quantization ops: ``quantize_linear``, ``dequantize_linear``, ``dynamic_quantize_linear``.

Semantics are ``cuvil/ops/quant.py``'s and ``cuvil/ops/qlinear.py``'s.  A node's elements are walked as
``[outer, D, inner]`` around the quantization axis, so the scale and zero
point are loaded once per run of ``inner`` elements that share them
(per-tensor: one run; per-axis: ``inner`` elements; blocked: the scale index
moves with the inner position too).

The quantization step itself is ``cuvil_quantize_f``/``_d`` (``cuvil_qrun.h``):
round half to even, NaN to the zero point, clamp before adding the zero
point.  The division is done in the node's precision type; for float16 and
bfloat16 the operands and the quotient are rounded to that type around a
float32 division, which gives the correctly rounded half-precision quotient
(float32 has more than twice the bits of either, so rounding twice is exact).

The low-bit types (``cuvil_lowbit.h``): a 4- or 2-bit result is stored in its
byte by ``cuvil_to_<type>``; a float8 or float4 result is the quotient converted
by ``cuvil_to_<type>`` with the node's ``saturate``.  A float8/float4 zero point
must be zero: a constant one was checked by inference, any other is checked
when the node runs.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

from cuvil.backends.c import ctypes_map as ct
from cuvil.backends.c.codegen import CodegenError
from cuvil.backends.c.kernel import CVal, KernelCtx, kernel
from cuvil.backends.c.kernels.conv import MAX_SPATIAL, window_dims
from cuvil.backends.c.kernels.reduce import prod_expr
from cuvil.ir.dtypes import LOWBIT, LOWBIT_FLOATS, DType
from cuvil.ops.quant import LINEAR_INT_RANGES, QUANT_RANGES, dequantize_compute

QGEMM_HEADER = "cuvil_qgemm.h"
QRUN_HEADER = "cuvil_qrun.h"
_BYTES = (DType.i8, DType.u8)
QCONV_HEADER = "cuvil_qconv.h"


def _layout(k: KernelCtx, x: CVal, s: CVal) -> tuple[str, str, str, str, str, int]:
    """``outer, D, inner`` extents, the scale's index for ``(o, d)`` and its stride over ``inner``, and the block."""
    if all(d == 1 for d in s.value.type.shape):
        return "INT64_C(1)", "INT64_C(1)", x.numel(), "0", "0", 0
    axis = int(k.attrs["axis"]) % x.rank
    block = int(k.attrs.get("block_size") or 0)
    outer, dim, inner = prod_expr(x, 0, axis), f"(int64_t){x.dim(axis)}", prod_expr(x, axis + 1, x.rank)
    if block == 0:
        return outer, dim, inner, "d", "0", 0
    sd = f"(int64_t){s.dim(axis)}"
    return outer, dim, inner, f"(o * {sd} + d / {block}) * {inner}", "1", block


def _walk(k: KernelCtx, x: CVal, s: CVal, body: Callable[[str, str], None]) -> None:
    """Loops over ``[outer, D, inner]``; ``body(si, xi)`` emits one element (scale index, element index)."""
    outer, dim, inner, sidx, sstride, _ = _layout(k, x, s)
    w = k.w
    with w.block(""):
        w.line(f"const int64_t n_outer = {outer}, n_dim = {dim}, n_inner = {inner};")
        with w.block("for (int64_t o = 0; o < n_outer; o++)"), w.block("for (int64_t d = 0; d < n_dim; d++)"):
            w.line(f"const int64_t sb = {sidx}, xb = (o * n_dim + d) * n_inner;")
            with w.block("for (int64_t i = 0; i < n_inner; i++)"):
                si = "sb" if sstride == "0" else "sb + i"
                body(si, "xb + i")


def _to_precision(src: DType, prec: DType, expr: str) -> str:
    """``expr`` (``src``'s compute type) rounded to ``prec``, as ``prec``'s compute type."""
    if prec is DType.f64:
        return f"(double)({expr})"
    if prec is DType.f32:
        return f"(float)({expr})"
    conv = "cuvil_f64_to_f16" if src is DType.f64 and prec is DType.f16 else f"cuvil_f32_to_{prec.value}"
    arg = expr if conv == "cuvil_f64_to_f16" else f"(float)({expr})"
    return f"cuvil_{prec.value}_to_f32({conv}({arg}))"


def _float_zero_point(k: KernelCtx, zp: CVal | None) -> None:
    """Fail the run when a float8/float4 zero point computed at run time is not zero (ONNX requires zero)."""
    if zp is None or zp.const is not None:  # a constant was checked by inference
        return
    j = k.tmp("j")
    with k.w.block(f"for (int64_t {j} = 0; {j} < {zp.numel()}; {j}++)"):
        k.fail_if(f"!({zp.load(j)} == 0.0f)", f"the zero point of a {zp.dtype} quantization must be 0, got %g",
                  f"(double){zp.load(j)}")


@kernel("quantize_linear")
def _quantize(k: KernelCtx) -> None:
    x, s, y = k.inp(0), k.inp(1), k.out(0)
    zp = k.inp(2) if k.has(2) else None
    k.include(QRUN_HEADER)
    k.include("cuvil_math.h")
    prec = k.attrs.get("precision") or s.dtype
    if y.dtype in LOWBIT:
        k.include(ct.LOWBIT_HEADER)
    if y.dtype in LOWBIT_FLOATS:
        _quantize_float(k, x, s, zp, y, prec)
        return
    lo, hi = LINEAR_INT_RANGES[y.dtype]
    fn = "cuvil_quantize_d" if prec is DType.f64 else "cuvil_quantize_f"
    if _one(s) and x.dtype is DType.f32 and prec is DType.f32 and s.dtype is DType.f32 and y.dtype in _BYTES:
        k.note(f"quantize to {y.dtype} per tensor, dividing in f32 (vectorised run, {QRUN_HEADER})")
        z = f"(int32_t){zp.load('0')}" if zp else "0"
        k.w.line(f"cuvil_quantize_f32_run({x.ptr}, {x.numel()}, {s.load('0')}, {z}, {lo}, {hi}, {y.ptr}, "
                 f"{int(y.dtype is DType.i8)});")
        return
    k.note(f"quantize to {y.dtype}, dividing in {prec}")

    def body(si: str, xi: str) -> None:
        z = f"(int32_t){zp.load(si)}" if zp else "0"
        k.w.line(y.store(xi, f"{fn}({_quotient(x, s, prec, si, xi)}, {z}, {lo}, {hi})"))

    _walk(k, x, s, body)


def _quotient(x: CVal, s: CVal, prec: DType, si: str, xi: str) -> str:
    """``X / scale`` for element ``xi``, divided in ``prec`` (as its compute type): for float16 and
    bfloat16, the operands and the quotient are rounded to it around a float32 division."""
    q = f"({_to_precision(x.dtype, prec, x.load(xi))}) / ({_to_precision(s.dtype, prec, s.load(si))})"
    return _to_precision(DType.f32, prec, q) if prec in (DType.f16, DType.bf16) else q


def _quantize_float(k: KernelCtx, x: CVal, s: CVal, zp: CVal | None, y: CVal, prec: DType) -> None:
    sat = int(bool(k.attrs.get("saturate", 1)))
    k.note(f"quantize to {y.dtype} (saturate={sat}), dividing in {prec}")
    _float_zero_point(k, zp)
    _walk(k, x, s, lambda si, xi: k.w.line(
        f"{y.ptr}[{xi}] = cuvil_to_{y.dtype.value}((float)({_quotient(x, s, prec, si, xi)}), {sat});"))


@kernel("dequantize_linear")
def _dequantize(k: KernelCtx) -> None:
    x, s, y = k.inp(0), k.inp(1), k.out(0)
    zp = k.inp(2) if k.has(2) else None
    cd = "double" if dequantize_compute(s.dtype, y.dtype).itemsize == 8 else "float"
    if _one(s) and x.dtype in _BYTES and s.dtype is DType.f32 and y.dtype is DType.f32:
        k.include(QRUN_HEADER)
        k.note(f"dequantize {x.dtype} per tensor to f32 (vectorised run, {QRUN_HEADER})")
        z = f"(float){zp.load('0')}" if zp else "0.0f"
        k.w.line(f"cuvil_dequantize_f32_run({x.ptr}, {int(x.dtype is DType.i8)}, {x.numel()}, {z}, {s.load('0')}, "
                 f"{y.ptr});")
        return
    k.note(f"dequantize {x.dtype} to {y.dtype}, computing in {cd}")
    if x.dtype in LOWBIT:
        k.include(ct.LOWBIT_HEADER)
    if x.dtype in LOWBIT_FLOATS:  # the zero point is zero: not subtracted
        _float_zero_point(k, zp)
        zp = None

    def body(si: str, xi: str) -> None:
        dx = f"({cd}){x.load(xi)}"
        if zp:
            dx = f"({dx} - ({cd}){zp.load(si)})"
        k.w.line(ct.store(y.dtype, y.ptr, xi, f"{dx} * ({cd}){s.load(si)}"))

    _walk(k, x, s, body)


@kernel("dynamic_quantize_linear")
def _dynamic(k: KernelCtx) -> None:
    x, y, ys, yz = k.inp(0), k.out(0), k.out(1), k.out(2)
    k.include(QRUN_HEADER)
    w = k.w
    with w.block(""):
        w.line(f"const int64_t n = {x.numel()};")
        w.line("float scale; int32_t zp;")
        w.line(f"cuvil_dynamic_qparams({x.ptr}, n, &scale, &zp);")
        w.line(f"{ys.ptr}[0] = scale; {yz.ptr}[0] = (uint8_t)zp;")
        w.line(f"for (int64_t i = 0; i < n; i++) {y.ptr}[i] = (uint8_t)cuvil_quantize_f({x.ptr}[i] / scale, zp, 0, 255);")


# integer products ----------------------------------------------------------------------------------


class Requant(NamedTuple):
    """The operands that requantize a product: scales, the output zero point, the int32 bias.  Without
    ``y_scale`` the product is dequantized to float32 instead (``qlinear_matmul_float``)."""

    x_scale: CVal
    w_scale: CVal
    y_scale: CVal | None
    y_zero_point: CVal | None
    bias: CVal | None


def _one(v: CVal) -> bool:
    return all(d == 1 for d in v.value.type.shape)


def _zero_points(k: KernelCtx, v: CVal | None, count: str, scratch: list[str]) -> tuple[str, str]:
    """An int32 array of ``v``'s zero points and its step (0: one for all); scratch goes to ``scratch``."""
    name = k.tmp("zp")
    if v is None or _one(v):
        k.w.line(f"const int32_t {name}[1] = {{{f'(int32_t){v.load(chr(48))}' if v else '0'}}};")
        return name, "0"
    k.require(v.numel(), count, "zero point length and channels")
    buf = k.scratch("int32_t", count, "zp")
    k.w.line(f"for (int64_t c = 0; c < {count}; c++) {buf}[c] = (int32_t){v.load('c')};")
    k.w.line(f"const int32_t *{name} = {buf};")
    scratch.append(buf)
    return name, "1"


def _round_scale(dt: DType, expr: str) -> str:
    """``expr`` (float or double) rounded to the scales' element type ``dt``."""
    if dt in (DType.f16, DType.bf16):
        return f"cuvil_{dt.value}_to_f32(cuvil_f32_to_{dt.value}({expr}))"
    return expr


def _multipliers(k: KernelCtx, xs: CVal, ws: CVal, ys: CVal | None, count: str,
                 scratch: list[str]) -> tuple[str, str]:
    """float32 ``x_scale * w_scale / y_scale`` (without ``ys``: ``x_scale * w_scale``) per channel (or
    one), in the scales' type; and its step."""
    dt = xs.dtype
    ct_ = "double" if dt is DType.f64 else "float"
    per = not _one(ws)
    n = count if per else "1"
    buf = k.scratch("float", n, "mult")
    scratch.append(buf)
    with k.w.block(f"for (int64_t c = 0; c < {n}; c++)"):
        prod = _round_scale(dt, f"({ct_}){xs.load('0')} * ({ct_}){ws.load('c' if per else '0')}")
        full = prod if ys is None else _round_scale(dt, f"({prod}) / ({ct_}){ys.load(chr(48))}")
        k.w.line(f"{buf}[c] = (float)({full});")
    if per:
        k.require(ws.numel(), count, "weight scale length and channels")
    return buf, "1" if per else "0"


def _output(k: KernelCtx, y: CVal, requant: Requant | None, chan_rows: bool, channels: str,
            scratch: list[str]) -> str:
    """Declare the ``cuvil_qg_output`` of node output ``y``: requantized for the qlinear ops, dequantized to
    float32 without an output scale, int32 otherwise."""
    o = k.tmp("qout")
    w = k.w
    w.line(f"cuvil_qg_output {o};")
    w.line(f"memset(&{o}, 0, sizeof {o});")
    if requant is None:
        w.line(f"{o}.y32 = {y.ptr};")
        return o
    xs, ws, ys, yz, bias = requant
    mult, mstep = _multipliers(k, xs, ws, ys, channels, scratch)
    rs, cs = (mstep, "0") if chan_rows else ("0", mstep)
    w.line(f"{o}.mult = {mult}; {o}.mult_rs = {rs}; {o}.mult_cs = {cs};")
    if ys is None:
        w.line(f"{o}.yf = {y.ptr};")
    else:
        assert yz is not None
        lo, hi = QUANT_RANGES[y.dtype]
        zp = f"(int32_t){yz.load('0')}"
        w.line(f"{o}.yq = {y.ptr}; {o}.yq_signed = {int(y.dtype is DType.i8)};")
        w.line(f"{o}.zp = {zp}; {o}.lo = {lo if not k.attrs.get('relu') else zp}; {o}.hi = {hi};")
    if bias is not None:
        k.require(bias.dim(0), channels, "bias length and channels")
        w.line(f"{o}.bias = {bias.ptr}; {o}.bias_rs = {1 if chan_rows else 0}; {o}.bias_cs = {0 if chan_rows else 1};")
    return o


def _matmul_like(k: KernelCtx, a: CVal, b: CVal, azp: CVal | None, bzp: CVal | None, y: CVal,
                 requant: Requant | None) -> None:
    k.include(QGEMM_HEADER)
    scratch: list[str] = []
    w = k.w
    ra, rb = a.rank, b.rank
    kd = a.dim(ra - 1)
    kb = b.dim(rb - 2) if rb > 1 else b.dim(0)
    n = b.dim(rb - 1) if rb > 1 else "1"
    k.require(kd, kb, "the inner dims differ")
    za, _ = _zero_points(k, azp, "1", scratch)
    zb, zbstep = _zero_points(k, bzp, n, scratch)
    o = _output(k, y, requant, False, n, scratch)
    w.line(f"{o}.ldy = {n};")
    sa, sb = str(int(a.dtype is DType.i8)), str(int(b.dtype is DType.i8))
    yel, ycast = (f"{o}.y32", "(int32_t *)") if requant is None else (
        (f"{o}.yf", "(float *)") if requant.y_scale is None else (f"{o}.yq", "(uint8_t *)"))

    def product(rows: str, ap: str, bp: str, yoff: str) -> None:
        with w.block(""):
            w.line(f"const cuvil_qg_operand R = {{{ap}, {kd}, 1, {sa}, {za}, 0}};")
            w.line(f"const cuvil_qg_operand C = {{{bp}, {n}, 1, {sb}, {zb}, {zbstep}}};")
            w.line(f"cuvil_qg_output ob = {o};")
            w.line(f"ob.{yel.split('.')[1]} = {ycast}{yel} + {yoff};")
            k.fail_if(f"cuvil_qgemm({rows}, {n}, {kd}, &R, &C, &ob) != 0", "out of memory")

    ba, bb = max(ra - 2, 0), max(rb - 2, 0)
    nb = max(ba, bb)
    m = a.dim(ra - 2) if ra > 1 else "1"
    kind = "int32" if requant is None else ("float32" if requant.y_scale is None else "requantized")
    k.note(f"cuvil_qgemm ({kind} output), kernel {QGEMM_HEADER}")
    if bb == 0:
        rows = prod_expr(a, 0, ra - 1) if ra > 1 else "INT64_C(1)"
        product(rows, a.ptr, b.ptr, "0")
    else:
        for v, r in ((a, ba), (b, bb)):
            k.fail_if(f"!cuvil_bcast_ok({v.shape}, {r}, {y.shape}, {nb})", "the batch dims do not broadcast")
        sta, stb = k.tmp("sta"), k.tmp("stb")
        w.line(f"int64_t {sta}[{nb}], {stb}[{nb}];")
        w.line(f"cuvil_bcast_strides({a.shape}, {ba}, {y.shape}, {nb}, {sta});")
        w.line(f"cuvil_bcast_strides({b.shape}, {bb}, {y.shape}, {nb}, {stb});")
        with w.block(f"for (int64_t bi = 0; bi < {prod_expr(y, 0, nb)}; bi++)"):
            w.line("int64_t rem = bi, oa = 0, ob_ = 0;")
            with w.block(f"for (int d = {nb - 1}; d >= 0; d--)"):
                w.line(f"const int64_t t = rem % {y.shape}[d]; rem /= {y.shape}[d];")
                w.line(f"oa += t * {sta}[d]; ob_ += t * {stb}[d];")
            product(m, f"{a.ptr} + oa * {m} * {kd}", f"{b.ptr} + ob_ * {kd} * {n}", f"bi * {m} * {n}")
    for buf in scratch:
        k.release(buf)


@kernel("matmul_integer")
def _matmul_integer(k: KernelCtx) -> None:
    _matmul_like(k, k.inp(0), k.inp(1), k.inp(2) if k.has(2) else None, k.inp(3) if k.has(3) else None, k.out(0), None)


@kernel("qlinear_matmul")
def _qlinear_matmul(k: KernelCtx) -> None:
    bias = k.inp(8) if k.has(8) else None
    _matmul_like(k, k.inp(0), k.inp(3), k.inp(2), k.inp(5), k.out(0),
                 Requant(k.inp(1), k.inp(4), k.inp(6), k.inp(7), bias))


@kernel("qlinear_matmul_float")
def _qlinear_matmul_float(k: KernelCtx) -> None:
    bias = k.inp(6) if k.has(6) else None
    _matmul_like(k, k.inp(0), k.inp(3), k.inp(2), k.inp(5), k.out(0), Requant(k.inp(1), k.inp(4), None, None, bias))


def _conv_like(k: KernelCtx, x: CVal, wt: CVal, xzp: CVal | None, wzp: CVal | None, y: CVal,
               requant: Requant | None) -> None:
    k.include(QCONV_HEADER)
    scratch: list[str] = []
    w = k.w
    nsp = x.rank - 2
    if nsp > MAX_SPATIAL:
        raise CodegenError(f"node {k.node.name!r} ({k.node.op}): {nsp} spatial dims; the C kernel supports {MAX_SPATIAL}")
    group = int(k.attrs.get("group", 1))
    kdims = [wt.dim(2 + i) for i in range(nsp)]
    ks = k.attrs.get("kernel_shape")
    if ks is not None:
        for i in range(nsp):
            k.require(kdims[i], str(int(ks[i])), f"weight spatial dim {i} vs kernel_shape")
    wins = window_dims(k, x, y, kdims)
    cout = wt.dim(0)
    k.require(x.dim(1), f"{wt.dim(1)} * {group}", "input channels vs weight channels x group")
    g = k.tmp("geom")
    w.line(f"cuvil_conv_geom {g};")
    w.line(f"memset(&{g}, 0, sizeof {g});")
    w.line(f"{g}.nsp = {nsp}; {g}.batch = {x.dim(0)}; {g}.group = {group}; {g}.cin = {x.dim(1)}; {g}.cout = {cout};")
    for i, win in enumerate(wins):
        w.line(f"{g}.in[{i}] = {x.dim(2 + i)}; {g}.out[{i}] = {y.dim(2 + i)}; {g}.k[{i}] = {kdims[i]};")
        w.line(f"{g}.stride[{i}] = {win.stride}; {g}.dil[{i}] = {win.dilation}; {g}.pad[{i}] = {win.pad_begin};")
    xz = f"(int32_t){xzp.load('0')}" if xzp is not None else "0"
    zw, zwstep = _zero_points(k, wzp, cout, scratch)
    o = _output(k, y, requant, True, cout, scratch)
    depthwise = nsp == 2 and group > 1 and wt.value.type.shape[1] == 1  # cuvil_qconv's own test, at run time
    path = "direct depthwise" if depthwise else "im2col + cuvil_qgemm per image and group"
    k.note(f"{path} ({'requantized' if requant else 'int32'} output), kernel {QCONV_HEADER}")
    k.fail_if(f"cuvil_qconv(&{g}, {x.ptr}, {int(x.dtype is DType.i8)}, {xz}, {wt.ptr}, {int(wt.dtype is DType.i8)}, "
              f"{zw}, {zwstep}, &{o}) != 0", "out of memory")
    for buf in scratch:
        k.release(buf)


@kernel("conv_integer")
def _conv_integer(k: KernelCtx) -> None:
    _conv_like(k, k.inp(0), k.inp(1), k.inp(2) if k.has(2) else None, k.inp(3) if k.has(3) else None, k.out(0), None)


@kernel("qlinear_conv")
def _qlinear_conv(k: KernelCtx) -> None:
    bias = k.inp(8) if k.has(8) else None
    _conv_like(k, k.inp(0), k.inp(3), k.inp(2), k.inp(5), k.out(0),
               Requant(k.inp(1), k.inp(4), k.inp(6), k.inp(7), bias))


@kernel("qlinear_add")
def _qlinear_add(k: KernelCtx) -> None:
    a, b, y = k.inp(0), k.inp(3), k.out(0)
    k.include(QRUN_HEADER)
    lo, hi = QUANT_RANGES[y.dtype]
    for i in range(a.rank):
        k.require(a.dim(i), b.dim(i), f"dim {i} of A and B")
    k.note(f"dequantize, add{', relu' if k.attrs.get('relu') else ''} and quantize in float32 ({QRUN_HEADER})")
    ops = []
    for v, si, zi in ((a, 1, 2), (b, 4, 5)):
        ops.append(f"{{{v.ptr}, {int(v.dtype is DType.i8)}, (float){k.inp(zi).load('0')}, {k.inp(si).load('0')}}}")
    with k.w.block(""):
        k.w.line(f"const cuvil_qadd_operand qa = {ops[0]}, qb = {ops[1]};")
        k.w.line(f"cuvil_qadd(&qa, &qb, {a.numel()}, {int(bool(k.attrs.get('relu')))}, {k.inp(6).load('0')}, "
                 f"(int32_t){k.inp(7).load('0')}, {lo}, {hi}, {y.ptr}, {int(y.dtype is DType.i8)});")
