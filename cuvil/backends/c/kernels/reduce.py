"""Kernels of the reductions: ``reduce_*``, ``arg_max``/``arg_min``, ``cumsum``/``cumprod`` and ``top_k``.

A ``reduce_*`` node becomes one walk over its input in memory order
(``cuvil_reduce_plan`` in ``cuvil_reduce.h``) that folds every element into
an accumulator array shaped like the keepdims output, then one pass that
turns accumulators into outputs.  The axes may be constant or read at run
time; either way they become a per-axis mask, so both cases share one code
path.  Accumulators follow the reference: float32 for half floats, the
input's own float type otherwise, and for integers 64-bit unsigned
arithmetic, whose wrap-around agrees with the reference's wrapping in the
narrower type once the result is cast back (and has no undefined overflow).

The helpers at the top (:func:`axis_view`, :func:`acc_ctype`, ...) are shared
by the softmax and normalization kernels.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from cuvil.backends.c import ctypes_map as ct
from cuvil.backends.c.kernel import CVal, KernelCtx, kernel
from cuvil.backends.c.writer import c_int
from cuvil.ir.dtypes import DType
from cuvil.ops.common import normalize_axes, normalize_axis

HALF = (DType.f16, DType.bf16)
_INT_LIMITS: dict[DType, tuple[str, str]] = {
    DType.i8: ("INT8_MIN", "INT8_MAX"),
    DType.i16: ("INT16_MIN", "INT16_MAX"),
    DType.i32: ("INT32_MIN", "INT32_MAX"),
    DType.i64: ("INT64_MIN", "INT64_MAX"),
    DType.u8: ("0", "UINT8_MAX"),
    DType.u16: ("0", "UINT16_MAX"),
    DType.u32: ("0", "UINT32_MAX"),
    DType.u64: ("0", "UINT64_MAX"),
    DType.bool: ("0", "1"),
}


# shared helpers --------------------------------------------------------------------------


def acc_ctype(dt: DType) -> str:
    """The C type that sums and products of ``dt`` accumulate in."""
    if dt is DType.f64:
        return "double"
    if dt.is_float:
        return "float"
    return "uint64_t"


def to_acc(dt: DType, expr: str) -> str:
    """``expr`` (in ``dt``'s compute type) as an accumulator value (integers sign-extend, then wrap)."""
    if dt.is_float:
        return expr
    if dt.is_signed:
        return f"(uint64_t)(int64_t)({expr})"
    return f"(uint64_t)({expr})"


def mathfn(name: str, ctype: str) -> str:
    """The libm function ``name`` for ``float`` (``expf``) or ``double`` (``exp``)."""
    return name + "f" if ctype == "float" else name


def round_to(dt: DType, expr: str) -> str:
    """``expr`` rounded to ``dt``'s precision and back to its compute type (a no-op except for half floats)."""
    if dt is DType.f16:
        return f"cuvil_f16_to_f32(cuvil_f32_to_f16({expr}))"
    if dt is DType.bf16:
        return f"cuvil_bf16_to_f32(cuvil_f32_to_bf16({expr}))"
    return expr


def prod_expr(x: CVal, lo: int, hi: int) -> str:
    """The product of dims ``[lo, hi)`` of ``x`` as a C int64 expression."""
    dims = [x.dim(j) for j in range(lo, hi)]
    if all(d.isdigit() for d in dims):
        n = 1
        for d in dims:
            n *= int(d)
        return f"INT64_C({n})"
    return "(" + " * ".join(f"(int64_t){d}" for d in dims) + ")"


@dataclass(frozen=True)
class AxisView:
    """A tensor seen as ``[outer, n, inner]`` around one axis (C variable names)."""

    outer: str
    n: str
    inner: str


def axis_view(k: KernelCtx, x: CVal, axis: int, last: int | None = None) -> AxisView:
    """Declare ``outer``, ``n`` and ``inner`` for ``x`` around ``axis`` (or the axes ``axis..last``)."""
    last = axis if last is None else last
    names = AxisView(k.tmp("outer"), k.tmp("n"), k.tmp("inner"))
    k.w.line(f"const int64_t {names.outer} = {prod_expr(x, 0, axis)};")
    k.w.line(f"const int64_t {names.n} = {prod_expr(x, axis, last + 1)};")
    k.w.line(f"const int64_t {names.inner} = {prod_expr(x, last + 1, x.rank)};")
    k.w.line(f"(void){names.outer}; (void){names.n}; (void){names.inner};")
    return names


def scalar_int_input(k: KernelCtx, i: int, what: str) -> str:
    """A C int64 expression for a scalar integer input (0-D or one element), checked to hold one value."""
    v = k.inp(i)
    c = k.const(i)
    if c is not None:
        return c_int(int(c.reshape(-1)[0]))
    if v.rank == 1:
        k.require(v.dim(0), "1", f"{what} must hold exactly one value; its length")
    return f"(int64_t){v.ptr}[0]"


def alloc_outputs(k: KernelCtx, *which: int) -> None:
    for i in which:
        if not k.allocated[i]:
            k.alloc(i)


# reduce_* ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Reduction:
    """How one ``reduce_*`` op accumulates: identity, update and finish, as C over the accumulator."""

    acc: Callable[[DType], str]
    init: Callable[[DType], str]
    update: Callable[[DType, str, str], str]  # (dtype, acc, x in compute type) -> new acc
    finish: Callable[[DType, str, str], str]  # (dtype, acc, count) -> output in compute type


def _abs_acc(dt: DType, x: str) -> str:
    if dt.is_float:
        return f"{mathfn('fabs', acc_ctype(dt))}({x})"
    if dt.is_signed:
        return f"(({x}) < 0 ? (uint64_t)0 - (uint64_t)(int64_t)({x}) : (uint64_t)(int64_t)({x}))"
    return f"(uint64_t)({x})"


def _int_finish(dt: DType, a: str) -> str:
    return f"({ct.storage(dt)})({a})"


def _mean_finish(dt: DType, a: str, count: str) -> str:
    if dt.is_float:
        return f"{a} / ({acc_ctype(dt)}){count}"
    wide = "int64_t" if dt.is_signed else "uint64_t"
    # The reference divides the total, wrapped to the input type, truncating toward zero.
    return f"({count} ? ({wide}){_int_finish(dt, a)} / ({wide}){count} : 0)"


def _l2_finish(dt: DType, a: str, count: str) -> str:
    if dt.is_float:
        return f"{mathfn('sqrt', acc_ctype(dt))}({a})"
    s = f"({ct.storage(dt)})({a})"
    if dt.is_signed:  # a wrapped negative sum of squares has no real root: give 0, not undefined behaviour
        return f"({s} < 0 ? 0 : floor(sqrt((double){s})))"
    return f"floor(sqrt((double){s}))"


def _extreme(largest: bool) -> Callable[[DType], str]:
    def init(dt: DType) -> str:
        if dt.is_float:
            return "(-INFINITY)" if largest else "INFINITY"
        lo, hi = _INT_LIMITS[dt]
        return lo if largest else hi

    return init


def _pick(largest: bool) -> Callable[[DType, str, str], str]:
    op = ">" if largest else "<"

    def update(dt: DType, a: str, x: str) -> str:
        if dt.is_float:  # NaN wins and stays, as in NumPy
            return f"(({x}) {op} ({a}) || ({x}) != ({x})) ? ({x}) : ({a})"
        return f"(({x}) {op} ({a})) ? ({x}) : ({a})"

    return update


def _zero(dt: DType) -> str:
    return "0"


def _plain(dt: DType, a: str, count: str) -> str:
    return a


_REDUCTIONS: dict[str, Reduction] = {
    "reduce_sum": Reduction(acc_ctype, _zero, lambda dt, a, x: f"{a} + {to_acc(dt, x)}", _plain),
    "reduce_mean": Reduction(acc_ctype, _zero, lambda dt, a, x: f"{a} + {to_acc(dt, x)}", _mean_finish),
    "reduce_prod": Reduction(acc_ctype, lambda dt: "1", lambda dt, a, x: f"{a} * {to_acc(dt, x)}", _plain),
    "reduce_l1": Reduction(acc_ctype, _zero, lambda dt, a, x: f"{a} + {_abs_acc(dt, x)}", _plain),
    "reduce_sum_square": Reduction(
        acc_ctype, _zero, lambda dt, a, x: f"{a} + {to_acc(dt, x)} * {to_acc(dt, x)}", _plain),
    "reduce_l2": Reduction(acc_ctype, _zero, lambda dt, a, x: f"{a} + {to_acc(dt, x)} * {to_acc(dt, x)}", _l2_finish),
    "reduce_log_sum": Reduction(
        acc_ctype, _zero, lambda dt, a, x: f"{a} + {x}", lambda dt, a, c: f"{mathfn('log', acc_ctype(dt))}({a})"),
    "reduce_max": Reduction(ct.compute, _extreme(True), _pick(True), _plain),
    "reduce_min": Reduction(ct.compute, _extreme(False), _pick(False), _plain),
}


def _reduce_mask(k: KernelCtx, x: CVal) -> str:
    """Declare ``int mask[rank]`` (1 on reduced axes), from constant or run-time axes."""
    w = k.w
    rank = x.rank
    mask = k.tmp("mask")
    noop = bool(k.attrs["noop_with_empty_axes"])
    listed: list[int] | None
    if not k.has(1):
        listed = []
    elif k.const(1) is not None:
        listed = [int(a) for a in k.const(1).reshape(-1)]  # type: ignore[union-attr]
    elif k.inp(1).static_dim(0) == 0:
        listed = []
    else:
        listed = None
    if listed is not None:
        if not listed:
            axes = set() if noop else set(range(rank))
        else:
            axes = set(normalize_axes(k.node.op, listed, rank))
        w.line(f"int {mask}[{max(rank, 1)}] = {{{', '.join('1' if j in axes else '0' for j in range(max(rank, 1)))}}};")
        return mask
    a = k.inp(1)
    count, bad, rep, pos = k.tmp("naxes"), k.tmp("bad"), k.tmp("rep"), k.tmp("pos")
    w.line(f"int {mask}[{max(rank, 1)}] = {{0}};")
    w.line(f"const int64_t {count} = {a.dim(0)};")
    w.line(f"int64_t {bad} = 0; int {rep} = 0;")
    w.line(f"int64_t {pos} = cuvil_axes_mask({a.ptr}, {int(a.dtype is DType.i64)}, {count}, {rank}, {mask}, &{bad}, &{rep});")
    k.fail_if(f"{pos} != 0 && {rep}", "axis %lld is listed twice", f"(long long){bad}")
    k.fail_if(f"{pos} != 0", f"axis %lld is out of range for rank {rank}", f"(long long){bad}")
    if not noop:
        with w.block(f"if ({count} == 0)"):
            w.line(f"for (int j = 0; j < {rank}; j++) {mask}[j] = 1;")
    return mask


def _reduce_shape(k: KernelCtx, x: CVal, mask: str) -> None:
    out = k.out(0)
    w = k.w
    if k.allocated[0]:
        return
    if k.attrs["keepdims"]:
        for j in range(x.rank):
            w.line(f"{out.shape}[{j}] = {mask}[{j}] ? 1 : {x.dim(j)};")
    else:
        kept = k.tmp("kept")
        w.line(f"int {kept} = 0;")
        with w.block(f"for (int j = 0; j < {x.rank}; j++)"), w.block(f"if (!{mask}[j])"):
            w.line(f"if ({kept} < {max(out.rank, 1)}) {out.shape}[{kept}] = {x.shape}[j];")
            w.line(f"{kept}++;")
        k.fail_if(f"{kept} != {out.rank}", f"the axes leave %d dims, but the output has rank {out.rank}", kept)
    k.alloc(0)


def _reduce_walk(k: KernelCtx, x: CVal, mask: str, acc: str, acc_t: str,
                 update: Callable[[str, str, str], str], aux: str | None = None) -> None:
    """Fold every element of ``x`` into ``acc`` (keepdims-shaped): ``acc = update(acc, x, aux)``."""
    w = k.w
    rank = max(x.rank, 1)
    dims, strides, nrun, lastred = k.tmp("rd"), k.tmp("rs"), k.tmp("nrun"), k.tmp("lastred")
    total = k.tmp("total")
    w.line(f"const int64_t {total} = {x.numel()};")
    with w.block(f"if ({total} > 0)"):
        w.line(f"int64_t {dims}[{rank}], {strides}[{rank}], idx[{rank}]; int {lastred} = 0;")
        w.line(f"int {nrun} = cuvil_reduce_plan({x.shape}, {x.rank}, {mask}, {dims}, {strides}, &{lastred});")
        w.line(f"for (int j = 0; j < {nrun}; j++) idx[j] = 0;")
        w.line(f"const int64_t len = {dims}[{nrun} - 1], blocks = {total} / len;")
        w.line("int64_t o = 0;")
        with w.block("for (int64_t b = 0; b < blocks; b++)"):
            w.line(f"const {x.ctype} *restrict xp = {x.ptr} + b * len;")
            with w.block(f"if ({lastred})"):
                w.line(f"{acc_t} a = {acc}[o];")
                if aux:
                    w.line(f"const {acc_t} s = {aux}[o];")
                w.line(f"for (int64_t j = 0; j < len; j++) a = {update('a', ct.load(x.dtype, 'xp', 'j'), 's')};")
                w.line(f"{acc}[o] = a;")
            with w.block("else"):
                w.line(f"{acc_t} *restrict ap = {acc} + o;")
                if aux:
                    w.line(f"const {acc_t} *restrict sp = {aux} + o;")
                w.line(f"for (int64_t j = 0; j < len; j++) ap[j] = {update('ap[j]', ct.load(x.dtype, 'xp', 'j'), 'sp[j]')};")
            w.line(f"cuvil_odometer_next(idx, {dims}, {strides}, {nrun} - 1, &o);")


def _count(k: KernelCtx, x: CVal, mask: str) -> str:
    count = k.tmp("count")
    k.w.line(f"int64_t {count} = 1;")
    k.w.line(f"for (int j = 0; j < {x.rank}; j++) if ({mask}[j]) {count} *= {x.shape}[j];")
    k.w.line(f"(void){count};")
    return count


def _emit_reduce(k: KernelCtx) -> None:
    k.include("cuvil_reduce.h")
    x, out, w = k.inp(0), k.out(0), k.w
    dt = x.dtype
    mask = _reduce_mask(k, x)
    _reduce_shape(k, x, mask)
    count = _count(k, x, mask)
    n = k.tmp("nout")
    w.line(f"const int64_t {n} = {out.numel()};")
    if k.node.op == "reduce_log_sum_exp":
        _log_sum_exp(k, x, mask, n)
        return
    r = _REDUCTIONS[k.node.op]
    acc_t = r.acc(dt)
    acc = k.scratch(acc_t, n, "acc")
    w.line(f"for (int64_t i = 0; i < {n}; i++) {acc}[i] = ({acc_t}){r.init(dt)};")
    _reduce_walk(k, x, mask, acc, acc_t, lambda a, v, s: r.update(dt, a, v))
    w.line(f"for (int64_t i = 0; i < {n}; i++) {out.store('i', r.finish(dt, f'{acc}[i]', count))}")
    k.release(acc)


def _log_sum_exp(k: KernelCtx, x: CVal, mask: str, n: str) -> None:
    """Two walks: the largest finite value per output (the shift), then the sum of exp(x - shift)."""
    w, out, dt = k.w, k.out(0), x.dtype
    acc_t = acc_ctype(dt)
    exp, log = mathfn("exp", acc_t), mathfn("log", acc_t)
    shift = k.scratch(acc_t, n, "shift")
    total = k.scratch(acc_t, n, "sum")
    w.line(f"for (int64_t i = 0; i < {n}; i++) {shift}[i] = -INFINITY;")
    _reduce_walk(k, x, mask, shift, acc_t, lambda a, v, s: f"(isfinite({v}) && ({v}) > ({a})) ? ({v}) : ({a})")
    w.line(f"for (int64_t i = 0; i < {n}; i++) if (!isfinite({shift}[i])) {shift}[i] = 0;")
    _reduce_walk(k, x, mask, total, acc_t, lambda a, v, s: f"{a} + {exp}(({v}) - {s})", aux=shift)
    w.line(f"for (int64_t i = 0; i < {n}; i++) {out.store('i', f'{log}({total}[i]) + {shift}[i]')}")
    k.release(shift)
    k.release(total)


for _op in [*_REDUCTIONS, "reduce_log_sum_exp"]:
    kernel(_op, computes_shape=True)(_emit_reduce)


# arg_max / arg_min -------------------------------------------------------------------------


@kernel("arg_max", "arg_min")
def _arg(k: KernelCtx) -> None:
    x, out, w = k.inp(0), k.out(0), k.w
    axis = normalize_axis(k.node.op, k.attrs["axis"], x.rank)
    v = axis_view(k, x, axis)
    op = ">" if k.node.op == "arg_max" else "<"
    last = bool(k.attrs["select_last_index"])
    cmp = f"v {op}= best" if last else f"v {op} best"
    if x.dtype.is_float:  # NumPy: the first NaN wins (the last with select_last_index)
        take = f"(best != best) ? {'(v != v)' if last else '0'} : ({cmp} || v != v)"
    else:
        take = cmp
    k.fail_if(f"{v.n} == 0", "the reduced axis is empty")
    with w.block(f"for (int64_t o = 0; o < {v.outer}; o++)"), w.block(f"for (int64_t j = 0; j < {v.inner}; j++)"):
        w.line(f"const {x.ctype} *xp = {x.ptr} + o * {v.n} * {v.inner} + j;")
        w.line(f"{x.ctype_compute} best = {ct.load(x.dtype, 'xp', '0')}; int64_t bi = 0;")
        with w.block(f"for (int64_t i = 1; i < {v.n}; i++)"):
            w.line(f"const {x.ctype_compute} v = {ct.load(x.dtype, 'xp', f'i * {v.inner}')};")
            w.line(f"if ({take}) {{ best = v; bi = i; }}")
        w.line(f"{out.ptr}[o * {v.inner} + j] = bi;")


# cumsum, cumprod -----------------------------------------------------------------------------


def _cumulative(k: KernelCtx, combine: str, identity: str) -> None:
    """A running ``acc combine= x`` along the axis (``+``, ``*``), from ``identity``."""
    x, y, w = k.inp(0), k.out(0), k.w
    dt = x.dtype
    rank = x.rank
    axis = k.tmp("axis")
    w.line(f"int64_t {axis} = {scalar_int_input(k, 1, 'axis')};")
    k.fail_if(f"{axis} < -{rank} || {axis} >= {rank}", f"axis %lld is out of range for rank {rank}",
              f"(long long){axis}")
    w.line(f"if ({axis} < 0) {axis} += {rank};")
    outer, n, inner = k.tmp("outer"), k.tmp("n"), k.tmp("inner")
    w.line(f"int64_t {outer} = 1, {inner} = 1; const int64_t {n} = {x.shape}[{axis}];")
    w.line(f"for (int64_t j = 0; j < {axis}; j++) {outer} *= {x.shape}[j];")
    w.line(f"for (int64_t j = {axis} + 1; j < {rank}; j++) {inner} *= {x.shape}[j];")
    acc_t = acc_ctype(dt)
    acc = k.scratch(acc_t, f"{inner} > 0 ? {inner} : 1", "acc")
    reverse, exclusive = bool(k.attrs["reverse"]), bool(k.attrs["exclusive"])
    step = "i = n - 1 - ii" if reverse else "i = ii"
    with w.block(f"for (int64_t o = 0; o < {outer}; o++)"):
        w.line(f"for (int64_t j = 0; j < {inner}; j++) {acc}[j] = {identity};")
        w.line(f"const int64_t n = {n};")
        with w.block("for (int64_t ii = 0; ii < n; ii++)"):
            w.line(f"const int64_t {step};")
            w.line(f"const {x.ctype} *restrict xp = {x.ptr} + (o * n + i) * {inner};")
            w.line(f"{y.ctype} *restrict yp = {y.ptr} + (o * n + i) * {inner};")
            with w.block(f"for (int64_t j = 0; j < {inner}; j++)"):
                v = to_acc(dt, ct.load(dt, "xp", "j"))
                if exclusive:
                    w.line(ct.store(dt, "yp", "j", f"{acc}[j]"))
                    w.line(f"{acc}[j] {combine}= {v};")
                else:
                    w.line(f"{acc}[j] {combine}= {v};")
                    w.line(ct.store(dt, "yp", "j", f"{acc}[j]"))
    k.release(acc)


@kernel("cumsum")
def _cumsum(k: KernelCtx) -> None:
    _cumulative(k, "+", "0")


@kernel("cumprod")
def _cumprod(k: KernelCtx) -> None:
    _cumulative(k, "*", "1")


# top_k ---------------------------------------------------------------------------------------


def _sort_key(dt: DType) -> tuple[str, str]:
    """The (key C type, sort function) top_k uses for ``dt``."""
    if dt is DType.f64:
        return "double", "cuvil_sort_f64"
    if dt.is_float:
        return "float", "cuvil_sort_f32"
    if dt.is_signed:
        return "int64_t", "cuvil_sort_i64"
    return "uint64_t", "cuvil_sort_u64"


@kernel("top_k", computes_shape=True)
def _top_k(k: KernelCtx) -> None:
    k.include("cuvil_reduce.h")
    x, vals, idx, w = k.inp(0), k.out(0), k.out(1), k.w
    axis = normalize_axis(k.node.op, k.attrs["axis"], x.rank)
    kk = k.tmp("k")
    w.line(f"const int64_t {kk} = {scalar_int_input(k, 1, 'K')};")
    v = axis_view(k, x, axis)
    k.fail_if(f"{kk} < 0 || {kk} > {v.n}", f"K=%lld is outside [0, %lld] for axis {axis}",
              f"(long long){kk}", f"(long long){v.n}")
    for o in (vals, idx):
        if not k.allocated[k.outs.index(o)]:
            for j in range(x.rank):
                w.line(f"{o.shape}[{j}] = {kk if j == axis else x.dim(j)};")
    alloc_outputs(k, 0, 1)
    key_t, sort = _sort_key(x.dtype)
    size = f"{v.n} > 0 ? {v.n} : 1"
    keys = k.scratch(key_t, size, "keys")
    order = k.scratch("int64_t", size, "order")
    tmp = k.scratch("int64_t", size, "tmp")
    largest = int(bool(k.attrs["largest"]))
    with w.block(f"for (int64_t o = 0; o < {v.outer}; o++)"), w.block(f"for (int64_t j = 0; j < {v.inner}; j++)"):
        w.line(f"const int64_t base = o * {v.n} * {v.inner} + j, obase = o * {kk} * {v.inner} + j;")
        with w.block(f"for (int64_t i = 0; i < {v.n}; i++)"):
            w.line(f"{keys}[i] = ({key_t}){x.load(f'base + i * {v.inner}')};")
            w.line(f"{order}[i] = i;")
        w.line(f"{sort}({keys}, {order}, {tmp}, {v.n}, {largest});")
        with w.block(f"for (int64_t i = 0; i < {kk}; i++)"):
            w.line(f"{vals.ptr}[obase + i * {v.inner}] = {x.ptr}[base + {order}[i] * {v.inner}];")
            w.line(f"{idx.ptr}[obase + i * {v.inner}] = {order}[i];")
    for b in (keys, order, tmp):
        k.release(b)
