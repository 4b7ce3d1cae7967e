"""Kernels of the normalization ops: ``batch_norm``, ``instance_norm``, ``layer_norm``, ``group_norm``
and ``lp_normalization``.

The standardizing ops see their input as rows (one per instance, group or
leading index) that are contiguous in memory, and make three unit-stride
passes per row: the mean, the variance of the centred values (the two-pass
form, as the reference computes it), then the output; ``layer_norm`` on
float32 keeps the two sums in 16 lanes, so those are vector passes too.
Statistics are in
the reference's precision (float32 for half floats, ``stash_type`` for
``layer_norm``/``group_norm``), and where the reference rounds an
intermediate to the input's type (the standardized value, then each affine
step) the kernel rounds too, so half-float results match bit for bit in
most cases.
"""

from __future__ import annotations

from cuvil.backends.c import ctypes_map as ct
from cuvil.backends.c.kernel import CVal, KernelCtx, kernel
from cuvil.backends.c.kernels.reduce import axis_view, mathfn, prod_expr, round_to
from cuvil.backends.c.writer import c_float
from cuvil.ir.dtypes import DType
from cuvil.ops.common import normalize_axis


def _ctype(dt: DType) -> str:
    """The C type the reference computes ``dt`` data in (float32 except for float64)."""
    return "double" if dt is DType.f64 else "float"


def _lit(x: float, ctype: str) -> str:
    return c_float(x, "f" if ctype == "float" else "")


def _stats(k: KernelCtx, x: CVal, xp: str, length: str, s: str, eps: float) -> None:
    """Declare ``mean`` and ``inv`` (in C type ``s``) of the ``length`` values at ``xp``."""
    w = k.w
    sqrt = mathfn("sqrt", s)
    w.line(f"{s} mean = 0, var = 0;")
    w.line(f"for (int64_t i = 0; i < {length}; i++) mean += ({s}){ct.load(x.dtype, xp, 'i')};")
    w.line(f"mean /= ({s}){length};")
    w.line(f"for (int64_t i = 0; i < {length}; i++) {{ const {s} d = ({s}){ct.load(x.dtype, xp, 'i')} - mean; "
           "var += d * d; }")
    w.line(f"var /= ({s}){length};")
    w.line(f"const {s} inv = ({s})1 / {sqrt}(var + {_lit(eps, s)});")


def _stats_lanes(k: KernelCtx, length: str, eps: float) -> None:
    """``_stats`` for float32 rows read as float32: the sums kept in 16 lanes (which the compiler
    turns into vector adds) then added in a fixed order, so one row costs a few vector passes
    instead of two scalar add chains.  Still the two-pass variance of the reference."""
    w = k.w
    w.line("float mean = 0, var = 0, lane[16];")
    with w.block(""):
        w.line("int64_t i = 0;")
        w.line("for (int l = 0; l < 16; l++) lane[l] = 0;")
        w.line(f"for (; i + 16 <= {length}; i += 16) for (int l = 0; l < 16; l++) lane[l] += xp[i + l];")
        w.line("for (int l = 0; l < 16; l++) mean += lane[l];")
        w.line(f"for (; i < {length}; i++) mean += xp[i];")
        w.line(f"mean /= (float){length};")
        w.line("i = 0;")
        w.line("for (int l = 0; l < 16; l++) lane[l] = 0;")
        w.line(f"for (; i + 16 <= {length}; i += 16) for (int l = 0; l < 16; l++) "
               "{ const float d = xp[i + l] - mean; lane[l] += d * d; }")
        w.line("for (int l = 0; l < 16; l++) var += lane[l];")
        w.line(f"for (; i < {length}; i++) {{ const float d = xp[i] - mean; var += d * d; }}")
        w.line(f"var /= (float){length};")
    w.line(f"const float inv = 1.0f / sqrtf(var + {_lit(eps, 'float')});")


def _standardized(dt: DType, xc: str, s: str) -> str:
    """``(x[i] - mean) * inv`` in the stash type ``s``, then cast to the input type ``dt`` (as a ``xc``)."""
    x = ct.load(dt, "xp", "i")
    return round_to(dt, f"({xc})((({s}){x} - mean) * inv)")


def _param_vector(k: KernelCtx, p: CVal, count: str, what: str, ctype: str, round_dt: DType | None) -> str:
    """``p`` (checked to hold ``count`` values) converted to ``ctype`` in scratch (rounded to ``round_dt``)."""
    k.require(p.numel(), count, f"{what} must have one value per channel; its size")
    buf = k.scratch(ctype, f"{count} > 0 ? {count} : 1", "param")
    v = f"({ctype}){p.load('i')}"
    if round_dt is not None:
        v = round_to(round_dt, v)
    k.w.line(f"for (int64_t i = 0; i < {count}; i++) {buf}[i] = {v};")
    return buf


def _broadcast_param(k: KernelCtx, p: CVal, x: CVal, axis: int, ctype: str, round_dt: DType) -> tuple[str, str]:
    """Materialize ``p`` broadcast to ``x.shape[s0:]`` (``s0 <= axis``), as ``round_dt`` values in ``ctype``.

    Returns the buffer and how many rows (of ``prod(x.shape[axis:])``) it spans before repeating."""
    w = k.w
    lead = 0
    while lead < p.rank and p.static_dim(lead) == 1:
        lead += 1
    eff = p.rank - lead
    s0 = min(x.rank - eff, axis)
    rank = x.rank - s0
    pshape, xshape = f"{p.shape} + {lead}", f"{x.shape} + {s0}"
    k.fail_if(f"!cuvil_bcast_ok({pshape}, {eff}, {xshape}, {rank})",
              "a parameter's shape does not broadcast to the normalized input")
    size = prod_expr(x, s0, x.rank)
    buf = k.scratch(ctype, f"{size} > 0 ? {size} : 1", "param")
    st = k.tmp("st")
    w.line(f"int64_t {st}[{max(rank, 1)}];")
    w.line(f"cuvil_bcast_strides({pshape}, {eff}, {xshape}, {rank}, {st});")
    idx = [k.tmp("d") for _ in range(rank)]
    with w.block(""):
        w.line("int64_t o = 0;")
        for j, d in enumerate(idx):
            w.line(f"for (int64_t {d} = 0; {d} < {x.dim(s0 + j)}; {d}++) {{")
        off = " + ".join(f"{d} * {st}[{j}]" for j, d in enumerate(idx)) or "0"
        w.line(f"    {buf}[o++] = {round_to(round_dt, f'({ctype}){p.load(off)}')};")
        for _ in idx:
            w.line("}")
    return buf, prod_expr(x, s0, axis)


@kernel("batch_norm")
def _batch_norm(k: KernelCtx) -> None:
    x, y, w = k.inp(0), k.out(0), k.w
    c = _ctype(x.dtype)
    per_activation = k.inp(1).rank == x.rank - 1 and x.rank > 2
    if per_activation:
        params, spatial = prod_expr(x, 1, x.rank), "INT64_C(1)"
        for i in range(1, 5):
            for j in range(x.rank - 1):
                k.require(k.inp(i).dim(j), x.dim(j + 1), f"dim {j} of parameter {i}")
    else:
        params, spatial = x.dim(1), prod_expr(x, 2, x.rank)
    mean, scale, bias, var = (_param_vector(k, k.inp(i), params, n, c, None)
                              for i, n in ((3, "mean"), (1, "scale"), (2, "B"), (4, "var")))
    sqrt = mathfn("sqrt", c)
    eps = _lit(k.attrs["epsilon"], c)
    # scale becomes inv * scale in place: y = (x - mean) * (inv * scale) + B, as the reference groups it.
    w.line(f"for (int64_t i = 0; i < {params}; i++) {scale}[i] = (({c})1 / {sqrt}({var}[i] + {eps})) * {scale}[i];")
    with w.block(f"for (int64_t b = 0; b < {x.dim(0)}; b++)"), w.block(f"for (int64_t p = 0; p < {params}; p++)"):
        w.line(f"const int64_t base = (b * {params} + p) * {spatial};")
        w.line(f"const {c} m = {mean}[p], f = {scale}[p], t = {bias}[p];")
        w.line(f"const {x.ctype} *restrict xp = {x.ptr} + base;")
        w.line(f"{y.ctype} *restrict yp = {y.ptr} + base;")
        val = f"({ct.load(x.dtype, 'xp', 'i')} - m) * f + t"
        w.line(f"for (int64_t i = 0; i < {spatial}; i++) {ct.store(y.dtype, 'yp', 'i', val)}")
    for b in (mean, scale, bias, var):
        k.release(b)


@kernel("instance_norm")
def _instance_norm(k: KernelCtx) -> None:
    x, y, w = k.inp(0), k.out(0), k.w
    c = _ctype(x.dtype)
    channels, spatial = x.dim(1), prod_expr(x, 2, x.rank)
    scale = _param_vector(k, k.inp(1), channels, "scale", c, None)
    bias = _param_vector(k, k.inp(2), channels, "B", c, None)
    with w.block(f"for (int64_t r = 0; r < (int64_t){x.dim(0)} * {channels}; r++)"):
        w.line(f"const {x.ctype} *restrict xp = {x.ptr} + r * {spatial};")
        w.line(f"{y.ctype} *restrict yp = {y.ptr} + r * {spatial};")
        w.line(f"const {c} sc = {scale}[r % {channels}], bi = {bias}[r % {channels}];")
        _stats(k, x, "xp", spatial, c, k.attrs["epsilon"])
        val = f"(({c}){ct.load(x.dtype, 'xp', 'i')} - mean) * inv * sc + bi"
        w.line(f"for (int64_t i = 0; i < {spatial}; i++) {ct.store(y.dtype, 'yp', 'i', val)}")
    k.release(scale)
    k.release(bias)


@kernel("layer_norm")
def _layer_norm(k: KernelCtx) -> None:
    k.include("cuvil_reduce.h")
    x, y, w = k.inp(0), k.out(0), k.w
    dt = x.dtype
    xc = ct.compute(dt)
    stash: DType = k.attrs["stash_type"]
    s = _ctype(stash)
    axis = normalize_axis(k.node.op, k.attrs["axis"], x.rank)
    v = axis_view(k, x, axis, x.rank - 1)
    scale, srows = _broadcast_param(k, k.inp(1), x, axis, xc, dt)
    bias, brows = _broadcast_param(k, k.inp(2), x, axis, xc, dt) if k.has(2) else (None, "1")
    with w.block(f"for (int64_t r = 0; r < {v.outer}; r++)"):
        w.line(f"const {x.ctype} *restrict xp = {x.ptr} + r * {v.n};")
        w.line(f"{y.ctype} *restrict yp = {y.ptr} + r * {v.n};")
        w.line(f"const {xc} *restrict sc = {scale} + (r % {srows}) * {v.n};")
        if bias:
            w.line(f"const {xc} *restrict bi = {bias} + (r % {brows}) * {v.n};")
        if dt is DType.f32 and stash is DType.f32:
            _stats_lanes(k, v.n, k.attrs["epsilon"])
        else:
            _stats(k, x, "xp", v.n, s, k.attrs["epsilon"])
        for i, o in enumerate(k.outs[1:3], start=1):
            w.line(ct.store(o.dtype, o.ptr, "r", "mean" if i == 1 else "inv"))
        with w.block(f"for (int64_t i = 0; i < {v.n}; i++)"):
            w.line(f"const {xc} nv = {_standardized(dt, xc, s)};")
            val = round_to(dt, "nv * sc[i]")
            if bias:
                val = f"{val} + bi[i]"
            w.line(ct.store(dt, "yp", "i", val))
    k.release(scale)
    if bias:
        k.release(bias)


@kernel("group_norm")
def _group_norm(k: KernelCtx) -> None:
    x, y, w = k.inp(0), k.out(0), k.w
    dt = x.dtype
    xc = ct.compute(dt)
    s = _ctype(k.attrs["stash_type"])
    groups = int(k.attrs["num_groups"])
    channels, spatial = x.dim(1), prod_expr(x, 2, x.rank)
    k.fail_if(f"{channels} % {groups} != 0", f"num_groups={groups} does not divide the %lld channels",
              f"(long long){channels}")
    per = k.tmp("per")
    w.line(f"const int64_t {per} = {channels} / {groups};")
    scale = _param_vector(k, k.inp(1), channels, "scale", xc, dt)
    bias = _param_vector(k, k.inp(2), channels, "bias", xc, dt)
    with w.block(f"for (int64_t r = 0; r < (int64_t){x.dim(0)} * {groups}; r++)"):
        w.line(f"const {x.ctype} *restrict xp = {x.ptr} + r * {per} * {spatial};")
        w.line(f"{y.ctype} *restrict yp = {y.ptr} + r * {per} * {spatial};")
        _stats(k, x, "xp", f"{per} * {spatial}", s, k.attrs["epsilon"])
        with w.block(f"for (int64_t cc = 0; cc < {per}; cc++)"):
            w.line(f"const int64_t ch = (r % {groups}) * {per} + cc;")
            w.line(f"const {xc} sc = {scale}[ch], bi = {bias}[ch];")
            with w.block(f"for (int64_t i = cc * {spatial}; i < (cc + 1) * {spatial}; i++)"):
                w.line(f"const {xc} nv = {_standardized(dt, xc, s)};")
                w.line(ct.store(dt, "yp", "i", f"{round_to(dt, 'nv * sc')} + bi"))
    k.release(scale)
    k.release(bias)


@kernel("lp_normalization")
def _lp_normalization(k: KernelCtx) -> None:
    x, y, w = k.inp(0), k.out(0), k.w
    c = _ctype(x.dtype)
    axis = normalize_axis(k.node.op, k.attrs["axis"], x.rank)
    v = axis_view(k, x, axis)
    norm = k.scratch(c, f"{v.inner} > 0 ? {v.inner} : 1", "norm")
    p1 = int(k.attrs["p"]) == 1
    with w.block(f"for (int64_t o = 0; o < {v.outer}; o++)"):
        w.line(f"const {x.ctype} *restrict xp = {x.ptr} + o * {v.n} * {v.inner};")
        w.line(f"{y.ctype} *restrict yp = {y.ptr} + o * {v.n} * {v.inner};")
        w.line(f"for (int64_t j = 0; j < {v.inner}; j++) {norm}[j] = 0;")
        with w.block(f"for (int64_t i = 0; i < {v.n}; i++)"), w.block(f"for (int64_t j = 0; j < {v.inner}; j++)"):
            w.line(f"const {c} t = ({c}){ct.load(x.dtype, 'xp', f'i * {v.inner} + j')};")
            w.line(f"{norm}[j] += {mathfn('fabs', c) + '(t)' if p1 else 't * t'};")
        if not p1:
            w.line(f"for (int64_t j = 0; j < {v.inner}; j++) {norm}[j] = {mathfn('sqrt', c)}({norm}[j]);")
        with w.block(f"for (int64_t i = 0; i < {v.n}; i++)"), w.block(f"for (int64_t j = 0; j < {v.inner}; j++)"):
            w.line(f"const {c} t = ({c}){ct.load(x.dtype, 'xp', f'i * {v.inner} + j')};")
            w.line(ct.store(y.dtype, "yp", f"i * {v.inner} + j", f"{norm}[j] == 0 ? 0 : t / {norm}[j]"))
    k.release(norm)
