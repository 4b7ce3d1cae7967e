"""Kernels of the softmax family: ``softmax``, ``log_softmax`` and ``hardmax``.

The input is viewed as ``[outer, n, inner]`` around the normalized axis (or,
with ``coerce_2d``, the axes from ``axis`` to the last, which are then one
contiguous run with ``inner == 1``).  When ``inner`` is 1 each row is
contiguous and is done in three unit-stride passes (max, exp and sum,
normalize); otherwise the passes run over ``[n, inner]`` tiles with the
inner loop over ``inner``, keeping per-column maxima and sums in scratch.
Half floats compute in float32, like the reference.  In float32 the exponential is
``cuvil_exp_f`` (``cuvil_math.h``'s vectorisable one, the same bits on every target), and a
row's exponentials are written in one loop and summed, in order, in the next, so the first
vectorises.
"""

from __future__ import annotations

from cuvil.backends.c import ctypes_map as ct
from cuvil.backends.c.kernel import KernelCtx, kernel
from cuvil.backends.c.kernels.elementwise import MATH_HEADER
from cuvil.backends.c.kernels.reduce import AxisView, axis_view, mathfn
from cuvil.errors import CuvilError
from cuvil.ir.dtypes import DType
from cuvil.ops.common import normalize_axis


def _view(k: KernelCtx) -> tuple[AxisView, bool]:
    """The ``[outer, n, inner]`` view and whether ``inner`` is statically 1."""
    x = k.inp(0)
    axis = normalize_axis(k.node.op, k.attrs["axis"], x.rank)
    last = x.rank - 1 if k.attrs["coerce_2d"] else axis
    rows = all(x.static_dim(j) == 1 for j in range(last + 1, x.rank))
    return axis_view(k, x, axis, last), rows


@kernel("softmax", "log_softmax")
def _softmax(k: KernelCtx) -> None:
    x, y, w = k.inp(0), k.out(0), k.w
    dt = x.dtype
    c = "double" if dt is DType.f64 else "float"
    is_log = k.node.op == "log_softmax"
    v, rows = _view(k)
    half = dt not in (DType.f32, DType.f64)
    line = f"{v.n} * {v.inner}"
    # softmax keeps exp(x - max) until the sum is known: in the output itself, or in float scratch for halves.
    buf = k.scratch(c, f"{line} > 0 ? {line} : 1", "ebuf") if half and not is_log else None

    def ld(ptr: str, i: str) -> str:
        return ct.load(dt, ptr, i)

    if c == "float":
        k.include(MATH_HEADER)
    cols = None if rows else _column_scratch(k, v, c)
    with w.block(f"for (int64_t o = 0; o < {v.outer}; o++)"):
        w.line(f"const {x.ctype} *restrict xp = {x.ptr} + o * {line};")
        w.line(f"{y.ctype} *restrict yp = {y.ptr} + o * {line};")
        if cols:
            _columns(k, v, c, buf, cols, is_log)
        else:
            _row(k, v, c, buf, is_log)
    for b in (buf, cols):
        if b and not b.startswith("shared_"):
            k.release(b)


def _column_scratch(k: KernelCtx, v: AxisView, c: str) -> str:
    """The per-column maxima and sums: call-owned scratch, or, with the planted fault "shared-scratch"
    (cuvil/faults.py), a static buffer every concurrent call of the model writes at once."""
    from cuvil import faults

    if not faults.active("shared-scratch", k.options.faults):
        return k.scratch(c, f"2 * ({v.inner} > 0 ? {v.inner} : 1)", "cols")
    x = k.inp(0)
    axis = normalize_axis(k.node.op, k.attrs["axis"], x.rank)
    last = x.rank - 1 if k.attrs["coerce_2d"] else axis
    inner = [x.static_dim(j) for j in range(last + 1, x.rank)]
    if any(d is None for d in inner):
        raise CuvilError(f"node {k.node.name!r}: the shared-scratch fault needs a static softmax shape")
    size = 1
    for d in inner:
        size *= int(d)  # type: ignore[arg-type]
    name = k.tmp("shared_cols")
    k.w.line(f"static {c} {name}[2 * {max(size, 1)}];")
    return name


def _exp(c: str) -> str:
    """The exponential for compute type ``c``: the vectorisable float one, or libm's double one."""
    return "cuvil_exp_f" if c == "float" else mathfn("exp", c)


def _row(k: KernelCtx, v: AxisView, c: str, buf: str | None, is_log: bool) -> None:
    """The three passes over one contiguous row ``xp[0:n]`` (inside the ``o`` loop)."""
    dt, w = k.inp(0).dtype, k.w
    exp, log = _exp(c), mathfn("log", c)
    e = buf or "yp"

    def ld(i: str) -> str:
        return ct.load(dt, "xp", i)

    w.line(f"{c} m = -INFINITY, s = 0;")
    w.line(f"for (int64_t i = 0; i < {v.n}; i++) {{ const {c} t = {ld('i')}; m = t > m ? t : m; }}")
    if is_log:
        w.line(f"for (int64_t i = 0; i < {v.n}; i++) s += {exp}({ld('i')} - m);")
        w.line(f"const {c} lse = {log}(s);")
        val = f"({ld('i')} - m) - lse"
        w.line(f"for (int64_t i = 0; i < {v.n}; i++) {ct.store(dt, 'yp', 'i', val)}")
    else:
        w.line(f"for (int64_t i = 0; i < {v.n}; i++) {e}[i] = {exp}({ld('i')} - m);")
        w.line(f"for (int64_t i = 0; i < {v.n}; i++) s += {e}[i];")
        w.line(f"for (int64_t i = 0; i < {v.n}; i++) {ct.store(dt, 'yp', 'i', f'{e}[i] / s')}")


def _columns(k: KernelCtx, v: AxisView, c: str, buf: str | None, cols: str, is_log: bool) -> None:
    """The passes of one ``[n, inner]`` tile, vectorised over ``inner`` (inside the ``o`` loop)."""
    x, y, w = k.inp(0), k.out(0), k.w
    dt = x.dtype
    exp, log = _exp(c), mathfn("log", c)
    e = buf or "yp"
    w.line(f"{c} *restrict m = {cols}, *restrict s = {cols} + {v.inner};")
    w.line(f"for (int64_t j = 0; j < {v.inner}; j++) {{ m[j] = -INFINITY; s[j] = 0; }}")
    with w.block(f"for (int64_t i = 0; i < {v.n}; i++)"):
        w.line(f"const {x.ctype} *restrict xi = xp + i * {v.inner};")
        w.line(f"for (int64_t j = 0; j < {v.inner}; j++) {{ const {c} t = {ct.load(dt, 'xi', 'j')}; "
               "m[j] = t > m[j] ? t : m[j]; }")
    with w.block(f"for (int64_t i = 0; i < {v.n}; i++)"):
        w.line(f"const {x.ctype} *restrict xi = xp + i * {v.inner};")
        if is_log:
            w.line(f"for (int64_t j = 0; j < {v.inner}; j++) s[j] += {exp}({ct.load(dt, 'xi', 'j')} - m[j]);")
        else:
            w.line(f"{c} *restrict ei = {e} + i * {v.inner};")
            w.line(f"for (int64_t j = 0; j < {v.inner}; j++) {{ const {c} t = {exp}({ct.load(dt, 'xi', 'j')} - m[j]); "
                   "ei[j] = t; s[j] += t; }")
    if is_log:
        w.line(f"for (int64_t j = 0; j < {v.inner}; j++) s[j] = {log}(s[j]);")
    with w.block(f"for (int64_t i = 0; i < {v.n}; i++)"):
        w.line(f"{y.ctype} *restrict yi = yp + i * {v.inner};")
        if is_log:
            w.line(f"const {x.ctype} *restrict xi = xp + i * {v.inner};")
            val = f"({ct.load(dt, 'xi', 'j')} - m[j]) - s[j]"
        else:
            w.line(f"const {c} *restrict ei = {e} + i * {v.inner};")
            val = "ei[j] / s[j]"
        w.line(f"for (int64_t j = 0; j < {v.inner}; j++) {ct.store(dt, 'yi', 'j', val)}")


@kernel("hardmax")
def _hardmax(k: KernelCtx) -> None:
    x, y, w = k.inp(0), k.out(0), k.w
    dt = x.dtype
    c = "double" if dt is DType.f64 else "float"
    v, _ = _view(k)
    one, zero = ct.convert(dt, "1"), ct.convert(dt, "0")
    # The first maximum wins; NaN counts as the maximum (NumPy's argmax).  Every element is written: the
    # output may sit in arena memory another value used before.
    with w.block(f"for (int64_t o = 0; o < {v.outer}; o++)"), w.block(f"for (int64_t j = 0; j < {v.inner}; j++)"):
        w.line(f"if ({v.n} == 0) continue;")
        w.line(f"const int64_t base = o * {v.n} * {v.inner} + j;")
        w.line(f"for (int64_t i = 0; i < {v.n}; i++) {y.ptr}[base + i * {v.inner}] = {zero};")
        w.line(f"{c} best = {x.load('base')}; int64_t bi = 0;")
        with w.block(f"for (int64_t i = 1; i < {v.n} && best == best; i++)"):
            w.line(f"const {c} t = {x.load(f'base + i * {v.inner}')};")
            w.line("if (t > best || t != t) { best = t; bi = i; }")
        w.line(f"{y.ptr}[base + bi * {v.inner}] = {one};")
