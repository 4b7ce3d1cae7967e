"""Kernels of the pooling ops: ``max_pool`` (with ``Indices``), ``average_pool``, and the global pools.

Windows are placed exactly as the reference places them (:mod:`cuvil.ops.conv`'s geometry,
shared with the conv kernels through :func:`window_dims`).  Each output position loops over the
taps of its window that land inside the input -- padding and the ``ceil_mode`` overhang never take
part -- using per-dim tap ranges computed once per position, so the inner loops carry no bounds
tests.  Loops are generated for the node's rank; every plane ``[n, c]`` is independent.

A 2-D max pool without indices (float, half or byte elements) -- the one CNNs have -- instead
calls the separable, vectorised and threaded kernel of runtime/cuvil_pool.h (a max is exact, so
both give the same bits).
"""

from __future__ import annotations

from contextlib import ExitStack

from cuvil.backends.c.kernel import CVal, KernelCtx, kernel
from cuvil.backends.c.kernels.conv import Window, window_dims
from cuvil.ir.dtypes import DType

_LOWEST = {
    DType.i8: "INT32_C(-128)",
    DType.u8: "UINT32_C(0)",
}


def _acc(x: CVal) -> str:
    return "double" if x.dtype is DType.f64 else "float"


def _planes(k: KernelCtx, st: ExitStack, x: CVal, y: CVal) -> tuple[str, str, str]:
    """Open the loop over ``[n, c]`` planes; returns (plane index, input offset, output offset)."""
    n = x.rank - 2
    p, xo, yo = k.tmp("plane"), k.tmp("xoff"), k.tmp("yoff")
    in_plane = " * ".join(f"(int64_t){x.dim(2 + i)}" for i in range(n))
    out_plane = " * ".join(f"(int64_t){y.dim(2 + i)}" for i in range(n))
    st.enter_context(k.w.block(f"for (int64_t {p} = 0; {p} < (int64_t){x.dim(0)} * (int64_t){x.dim(1)}; {p}++)"))
    k.w.line(f"const int64_t {xo} = {p} * {in_plane}, {yo} = {p} * {out_plane};")
    return p, xo, yo


def _positions(k: KernelCtx, stack: ExitStack, wins: list[Window]) -> list[str]:
    """Open the loops over output positions; returns each dim's window start."""
    w = k.w
    starts = []
    for win in wins:
        oi, st = k.tmp("oi"), k.tmp("start")
        stack.enter_context(w.block(f"for (int64_t {oi} = 0; {oi} < (int64_t){win.out}; {oi}++)"))
        w.line(f"const int64_t {st} = {oi} * {win.stride} - {win.pad_begin};")
        starts.append(st)
    return starts


def _tap_ranges(k: KernelCtx, wins: list[Window], starts: list[str]) -> list[tuple[str, str]]:
    """Per dim, the taps [lo, hi) of the window that land inside the input."""
    out = []
    for win, st in zip(wins, starts):
        lo, hi = k.tmp("tlo"), k.tmp("thi")
        k.w.line(f"int64_t {lo}, {hi};")
        k.w.line(f"cuvil_conv_valid({st}, {win.dilation}, {win.size}, {win.kernel}, &{lo}, &{hi});")
        out.append((lo, hi))
    return out


def _open_taps(k: KernelCtx, stack: ExitStack, wins: list[Window], starts: list[str], ranges: list[tuple[str, str]],
               xo: str) -> tuple[str, list[str]]:
    """Open the tap loops; returns (input element index, input coordinate per dim)."""
    w = k.w
    coords: list[str] = []
    off = "0"  # row-major index within the plane
    for win, st, (lo, hi) in zip(wins, starts, ranges):
        t, c, nxt = k.tmp("t"), k.tmp("ix"), k.tmp("xi")
        stack.enter_context(w.block(f"for (int64_t {t} = {lo}; {t} < {hi}; {t}++)"))
        w.line(f"const int64_t {c} = {st} + {t} * {win.dilation};")
        w.line(f"const int64_t {nxt} = {off} * (int64_t){win.size} + {c};" if coords else f"const int64_t {nxt} = {c};")
        coords.append(c)
        off = nxt
    idx = k.tmp("xi")
    w.line(f"const int64_t {idx} = {xo} + {off};")
    return idx, coords


# Element types of the separable 2-D max pool (runtime/cuvil_pool.h).
_SEPARABLE = {DType.f32: "f32", DType.f64: "f64", DType.u8: "u8", DType.i8: "i8", DType.f16: "f16",
              DType.bf16: "bf16"}


def _max_pool_2d(k: KernelCtx, x: CVal, y: CVal, wins: list[Window]) -> None:
    """A 2-D max pool without indices: cuvil_pool.h's separable, threaded kernel."""
    k.include("cuvil_half.h" if x.dtype in (DType.f16, DType.bf16) else "cuvil_pool.h")
    g, rc = k.tmp("pool"), k.tmp("rc")
    (hw, ww) = wins
    k.w.line(f"const cuvil_pool2d {g} = {{(int64_t){x.dim(0)} * (int64_t){x.dim(1)}, {hw.size}, {ww.size}, "
             f"{hw.out}, {ww.out}, {hw.kernel}, {ww.kernel}, {hw.stride}, {ww.stride}, {hw.dilation}, "
             f"{ww.dilation}, {hw.pad_begin}, {ww.pad_begin}}};")
    k.w.line(f"const int {rc} = cuvil_maxpool2d_{_SEPARABLE[x.dtype]}(&{g}, {x.ptr}, {y.ptr});")
    k.fail_if(f"{rc} != 0", "out of memory")


@kernel("max_pool")
def _max_pool(k: KernelCtx) -> None:
    k.include("cuvil_conv.h")
    x, y = k.inp(0), k.out(0)
    kernel_dims = [str(int(v)) for v in k.attrs["kernel_shape"]]
    wins = window_dims(k, x, y, kernel_dims)
    indices = k.out(1) if len(k.outs) > 1 else None
    if indices is None and x.rank == 4 and x.dtype in _SEPARABLE and x.dtype is y.dtype:
        _max_pool_2d(k, x, y, wins)
        return
    is_float = x.dtype in (DType.f32, DType.f64, DType.f16, DType.bf16)
    lowest = "-INFINITY" if is_float else _LOWEST[x.dtype]
    with ExitStack() as planes:
        p, xo, yo = _planes(k, planes, x, y)
        o = k.tmp("o")
        k.w.line(f"int64_t {o} = {yo};")
        with ExitStack() as positions:
            starts = _positions(k, positions, wins)
            ranges = _tap_ranges(k, wins, starts)
            best, arg = k.tmp("best"), k.tmp("arg")
            k.w.line(f"{x.ctype_compute} {best} = {lowest}; int64_t {arg} = -1;")
            with ExitStack() as taps:
                idx, coords = _open_taps(k, taps, wins, starts, ranges, xo)
                v = k.tmp("v")
                k.w.line(f"const {x.ctype_compute} {v} = {x.load(idx)};")
                nan = f" || ({v} != {v} && {best} == {best})" if is_float else ""  # NaN wins, as in NumPy
                with k.w.block(f"if ({arg} < 0 || {v} > {best}{nan})"):
                    k.w.line(f"{best} = {v};")
                    if indices is not None and int(k.attrs.get("storage_order", 0)) == 1:
                        terms, stride = [], "1"
                        for i, c in enumerate(coords):  # column major within the plane
                            terms.append(f"{c} * {stride}")
                            stride = f"{stride} * (int64_t){wins[i].size}"
                        k.w.line(f"{arg} = {' + '.join(terms)};")
                    else:
                        k.w.line(f"{arg} = {idx} - {xo};")
            k.w.line(y.store(o, best))
            if indices is not None:
                plane = " * ".join(f"(int64_t){w.size}" for w in wins)
                k.w.line(f"{indices.ptr}[{o}] = {p} * {plane} + {arg};")
            k.w.line(f"{o}++;")


@kernel("average_pool")
def _average_pool(k: KernelCtx) -> None:
    k.include("cuvil_conv.h")
    x, y = k.inp(0), k.out(0)
    kernel_dims = [str(int(v)) for v in k.attrs["kernel_shape"]]
    wins = window_dims(k, x, y, kernel_dims)
    include_pad = int(k.attrs.get("count_include_pad", 0)) == 1
    acc = _acc(x)
    with ExitStack() as planes:
        _, xo, yo = _planes(k, planes, x, y)
        o = k.tmp("o")
        k.w.line(f"int64_t {o} = {yo};")
        with ExitStack() as positions:
            starts = _positions(k, positions, wins)
            ranges = _tap_ranges(k, wins, starts)
            count = k.tmp("count")
            if include_pad:
                # Taps in the input or in the (resolved) pads count; those in the ceil_mode overhang do not.
                factors = []
                for win, st in zip(wins, starts):
                    lo, hi = k.tmp("plo"), k.tmp("phi")
                    k.w.line(f"int64_t {lo}, {hi};")
                    k.w.line(f"cuvil_conv_valid({st} + {win.pad_begin}, {win.dilation}, "
                             f"(int64_t){win.size} + {win.pad_begin} + {win.pad_end}, {win.kernel}, &{lo}, &{hi});")
                    factors.append(f"({hi} - {lo})")
            else:
                factors = [f"({hi} - {lo})" for lo, hi in ranges]
            k.w.line(f"const int64_t {count} = {' * '.join(factors)};")
            total = k.tmp("sum")
            k.w.line(f"{acc} {total} = 0;")
            with ExitStack() as taps:
                idx, _ = _open_taps(k, taps, wins, starts, ranges, xo)
                k.w.line(f"{total} += ({acc}){x.load(idx)};")
            k.w.line(y.store(o, f"{total} / ({acc}){count}"))
            k.w.line(f"{o}++;")


def _global(k: KernelCtx, op: str) -> None:
    x, y = k.inp(0), k.out(0)
    n = x.rank - 2
    acc = _acc(x)
    plane, p, i, r, v = k.tmp("plane"), k.tmp("p"), k.tmp("i"), k.tmp("r"), k.tmp("v")
    size = " * ".join(f"(int64_t){x.dim(2 + j)}" for j in range(n))
    k.w.line(f"const int64_t {plane} = {size};")
    with k.w.block(f"for (int64_t {p} = 0; {p} < (int64_t){x.dim(0)} * (int64_t){x.dim(1)}; {p}++)"):
        if op == "mean":
            k.w.line(f"{acc} {r} = 0;")
            with k.w.block(f"for (int64_t {i} = 0; {i} < {plane}; {i}++)"):
                k.w.line(f"{r} += ({acc}){x.load(f'{p} * {plane} + {i}')};")
            k.w.line(y.store(p, f"{r} / ({acc}){plane}"))
        else:
            k.w.line(f"{acc} {r} = -INFINITY;")
            with k.w.block(f"for (int64_t {i} = 0; {i} < {plane}; {i}++)"):
                k.w.line(f"const {acc} {v} = ({acc}){x.load(f'{p} * {plane} + {i}')};")
                k.w.line(f"if ({v} > {r} || ({v} != {v} && {r} == {r})) {r} = {v};")
            k.w.line(y.store(p, r))


@kernel("global_average_pool")
def _global_average_pool(k: KernelCtx) -> None:
    _global(k, "mean")


@kernel("global_max_pool")
def _global_max_pool(k: KernelCtx) -> None:
    _global(k, "max")
