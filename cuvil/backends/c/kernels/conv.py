"""Kernels of ``conv`` and ``conv_transpose``, and the window geometry they share with pooling.

The generated code fills a ``cuvil_conv_geom`` (sizes, strides, dilations, resolved begin pads)
and calls the runtime: f32 convolutions run im2col + ``cuvil_sgemm_ep`` over chunks of output
rows that stay in cache, with a fused epilogue applied on each finished tile
(``cuvil_conv_tiled.h``); the image itself is the GEMM operand for 1x1 unit-stride
convolutions.  ``cuvil_conv.h`` has a direct kernel for depthwise 2-D convolutions, im2col +
GEMM per image for f64, and GEMM + col2im for the transposed convolution.  f64 runs in f64.
f16/bf16 accumulate in f32 like the reference (:func:`cuvil.backends.c.kernels.half.half_conv`:
bf16 dot products where the target has them, else the f32 algorithm on widened operands).

f32 2-D 3x3 convolutions with unit strides and dilations and one group may instead run by
Winograd F(m x m, 3 x 3) (``cuvil_winograd.h``); which algorithm each node gets is decided in
:mod:`cuvil.backends.c.kernels.conv_algorithm` (a heuristic, or the user's choice).  A fused
epilogue (``fused_conv``) is then applied inside the Winograd output transform, by a store
function generated here per node.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from cuvil import faults
from cuvil.backends.c.codegen import CodegenError
from cuvil.backends.c.kernel import CVal, KernelCtx, kernel
from cuvil.backends.c.kernels import conv_algorithm as algo
from cuvil.backends.c.kernels.half import HALF, half_conv
from cuvil.ir.dtypes import DType
from cuvil.ir.graph import Graph

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
          group: int, cin: str, cout: str, pads_begin: Sequence[str], *, faulty: bool = False) -> str:
    """Fill a ``cuvil_conv_geom``; ``faulty``: the node may carry the planted faults
    ``conv-stride`` / ``conv-pad`` (cuvil/faults.py), which reach every algorithm through it."""
    n = x.rank - 2
    strides = [str(win.stride) for win in wins]
    pads = list(pads_begin)
    if faulty and faults.active("conv-stride", k.options.faults) and n > 0 and wins[-1].stride > 1:
        strides[-1] = "1"  # a strided convolution steps its last dim with unit spacing
    if faulty and faults.active("conv-pad", k.options.faults) and n > 0:
        pads[-1] = f"({pads[-1]} + 1)"  # the begin pad of the last dim is one too large
    if n > MAX_SPATIAL:
        raise CodegenError(f"node {k.node.name!r} ({k.node.op}): {n} spatial dims; the C kernel supports {MAX_SPATIAL}")
    g = k.tmp("geom")
    w = k.w
    w.line(f"cuvil_conv_geom {g};")
    w.line(f"memset(&{g}, 0, sizeof {g});")
    w.line(f"{g}.nsp = {n}; {g}.batch = {x.dim(0)}; {g}.group = {group}; {g}.cin = {cin}; {g}.cout = {cout};")
    for i in range(n):
        w.line(f"{g}.in[{i}] = {x.dim(2 + i)}; {g}.out[{i}] = {y.dim(2 + i)}; {g}.k[{i}] = {kernel_dims[i]};")
        w.line(f"{g}.stride[{i}] = {strides[i]}; {g}.dil[{i}] = {wins[i].dilation}; {g}.pad[{i}] = {pads[i]};")
    return g


def _run(k: KernelCtx, fn_f32: str, fn_f64: str, g: str, x: CVal, w: CVal, y: CVal, void: bool = False) -> None:
    """Call the f32/f64 runtime function on the node's operands (f16/bf16 go through ``half_conv``)."""
    b = k.inp(2) if k.has(2) else None
    rc = k.tmp("rc")
    call = f"{fn_f64 if x.dtype is DType.f64 else fn_f32}(&{g}, {x.ptr}, {w.ptr}, {b.ptr if b else 'NULL'}, {y.ptr})"
    if void:
        k.w.line(f"{call};")
        k.w.line(f"int {rc} = 0;")
    else:
        k.w.line(f"int {rc} = {call};")
    k.fail_if(f"{rc} != 0", "out of memory")


def _check_bias(k: KernelCtx, channels: str) -> None:
    if k.has(2):
        k.require(k.inp(2).dim(0), channels, "bias length vs output channels")


@kernel("conv")
def _conv(k: KernelCtx) -> None:
    _emit_conv(k, None, ())


def conv_with_epilogue(k: KernelCtx, epilogue: Graph, extras: Sequence[CVal]) -> bool:
    """Emit ``k``'s convolution with ``epilogue`` applied in its Winograd output transform, when
    this node runs by Winograd; False (nothing emitted) when it runs another algorithm, whose
    epilogue the fused kernel applies itself."""
    if not isinstance(_choose(k), algo.Winograd):
        return False
    _emit_conv(k, epilogue, extras)
    return True


def _choose(k: KernelCtx) -> algo.Choice:
    x, w = k.inp(0), k.inp(1)
    return algo.choose(k.node.name, algo.conv_shape(k.node, x.value.type, w.value.type, k.has(2)),
                       k.options.conv_algorithm)


def _emit_conv(k: KernelCtx, epilogue: Graph | None, extras: Sequence[CVal]) -> None:
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
    g = _geom(k, x, y, kd, wins, group, x.dim(1), w.dim(0), [win.pad_begin for win in wins], faulty=True)
    choice = _choose(k)
    if isinstance(choice, algo.Winograd):
        k.note(f"3x3 conv by Winograd F({choice.m}x{choice.m},3x3) ({choice.why})"
               + ("; epilogue in its output transform" if epilogue is not None else ""))
        _run_winograd(k, choice.m, g, x, w, y, epilogue, extras)
        return
    depthwise = x.rank == 4 and group > 1 and w.static_dim(1) == 1 and x.dtype is not DType.f64
    if x.dtype in HALF:
        # Widened operands run the float32 algorithms: the float32 choice for the same shapes.
        wide = algo.choose(k.node.name, algo.conv_shape(k.node, x.value.type.with_dtype(DType.f32),
                                                        w.value.type.with_dtype(DType.f32), k.has(2)),
                           k.options.conv_algorithm)
        m = wide.m if isinstance(wide, algo.Winograd) else 0
        how = half_conv(k, "depthwise" if depthwise else "conv", g, x, w, y, winograd=m)
        plan = "direct depthwise 2-D kernel; " if depthwise else "" if m else _gemm_plan(w, wins, group) + "; "
        k.note(f"{plan}{x.dtype} by {how} ({wide.why})")
        return
    if depthwise:
        k.note(f"direct depthwise 2-D kernel, cuvil_conv_depthwise2d_f32 ({group} groups of one input channel)"
               + _precision(x) + f" ({choice.why})")
        _run(k, "cuvil_conv_depthwise2d_f32", "", g, x, w, y, void=True)
    elif x.dtype is DType.f32:
        _run_tiled(k, g, x, w, y)
        k.note(_gemm_plan(w, wins, group) + " over chunks of output rows (cuvil_conv_tiled.h)"
               + ("; epilogue on each finished tile" if k.epilogue else "") + f" ({choice.why})")
    else:
        k.note(_gemm_plan(w, wins, group) + _precision(x) + f" ({choice.why})")
        _run(k, "cuvil_conv_f32", "cuvil_conv_f64", g, x, w, y)


def _run_tiled(k: KernelCtx, g: str, x: CVal, w: CVal, y: CVal) -> None:
    """Call ``cuvil_conv_tiled_f32`` with the fused epilogue, if any, applied on each finished tile."""
    k.include("cuvil_conv_tiled.h")
    b = k.inp(2).ptr if k.has(2) else "NULL"
    rc = k.tmp("rc")
    k.w.line(f"int {rc} = cuvil_conv_tiled_f32(&{g}, {x.ptr}, {w.ptr}, {b}, {y.ptr}, {k.epilogue or 'NULL'});")
    k.fail_if(f"{rc} != 0", "out of memory")
    k.epilogue_applied = k.epilogue is not None


def _run_winograd(k: KernelCtx, m: int, g: str, x: CVal, w: CVal, y: CVal, epilogue: Graph | None,
                  extras: Sequence[CVal]) -> None:
    """Call ``cuvil_conv_winograd_f32`` (f32 operands only: conv_algorithm.conv_shape checks it)."""
    k.include("cuvil_winograd.h")
    k.enable("CUVIL_WINO_TILES", m)
    b = k.inp(2).ptr if k.has(2) else "NULL"
    store, ctx = "NULL", "NULL"
    if epilogue is not None:
        store = _epilogue_store(k, epilogue, extras, y)
        if extras:
            ctx = k.tmp("epi")
            k.w.line(f"const float *{ctx}[{len(extras)}] = {{{', '.join(e.ptr for e in extras)}}};")
    rc = k.tmp("rc")
    # an epilogue without operands reads only the convolution's value: it may run on y in place
    in_place = int(not extras)
    k.w.line(f"int {rc} = cuvil_conv_winograd_f32(&{g}, {m}, {x.ptr}, {w.ptr}, {b}, {y.ptr}, {store}, {ctx}, {in_place});")
    k.fail_if(f"{rc} == -2", f"Winograd F({m}x{m},3x3) is not compiled in (a Cuvil bug: please report it)")
    k.fail_if(f"{rc} != 0", "out of memory")


def _epilogue_store(k: KernelCtx, epilogue: Graph, extras: Sequence[CVal], y: CVal) -> str:
    """A file-scope ``cuvil_wino_store_fn`` writing ``epilogue(src, extras...)`` for a run of outputs."""
    from cuvil.backends.c.kernels.elementwise import MATH_HEADER
    from cuvil.backends.c.kernels.fused import compose
    from cuvil.ops.fused import extra_kind

    k.include(MATH_HEADER)
    name = k.tmp("wino_store")
    leaves = ["a"]
    for i, e in enumerate(extras):
        kind = extra_kind(y.value.type.shape, e.value.type.shape)
        if e.dtype is not DType.f32 or kind is None:
            raise CodegenError(f"node {k.node.name!r}: epilogue operand {e.value} does not fit {y.value}")
        leaves.append({"scalar": f"e[{i}][0]", "full": f"e[{i}][i]", "row": f"e[{i}][i % ldy]"}[kind])
    body = compose(epilogue, leaves)
    k.define(name, f"""static void {name}(const void *ctx, const float *src, float *y, int64_t index, int64_t n,
                       int64_t ldy) {{
    const float *const *e = (const float *const *)ctx;
    (void)e;
    (void)ldy;
    for (int64_t j = 0; j < n; j++) {{
        const int64_t i = index + j;
        const float a = src[j];
        y[i] = {body};
    }}
}}""")
    return name


def _precision(x: CVal) -> str:
    return "; in float64 (cuvil_dgemm)" if x.dtype is DType.f64 else ""


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
    if x.dtype in HALF:
        k.note(f"GEMM + col2im; {x.dtype} by {half_conv(k, 'transpose', g, x, w, y)}")
        return
    _run(k, "cuvil_conv_transpose_f32", "cuvil_conv_transpose_f64", g, x, w, y)
