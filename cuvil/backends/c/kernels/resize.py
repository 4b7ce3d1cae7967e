"""Kernel of ``resize``: every mode, coordinate transformation and option the reference implements.

The generated code plans each resized axis at run time exactly as the reference's ``_plan``
does (scales or sizes, ``keep_aspect_ratio_policy``, the ``tf_crop_and_resize`` roi), sizes the
output when inference could not, then runs ``cuvil_resize.h``: a float64 copy of the data is
resized axis by axis through per-axis tap tables.  Integer outputs are rounded half to even and
saturated, as the reference does.
"""

from __future__ import annotations

from cuvil.backends.c.kernel import CVal, KernelCtx, kernel
from cuvil.backends.c.writer import c_float
from cuvil.ir.dtypes import DType
from cuvil.ir.symbolic import is_unknown
from cuvil.ops.resize import COORD_MODES, MODES, NEAREST_MODES

# C type, minimum, maximum, and one past the maximum (a power of two, exact in double).
_C_TYPES_INT = {
    DType.i8: ("int8_t", "INT8_MIN", "INT8_MAX", 2**7),
    DType.i16: ("int16_t", "INT16_MIN", "INT16_MAX", 2**15),
    DType.i32: ("int32_t", "INT32_MIN", "INT32_MAX", 2**31),
    DType.i64: ("int64_t", "INT64_MIN", "INT64_MAX", 2**63),
    DType.u8: ("uint8_t", "0", "UINT8_MAX", 2**8),
    DType.u16: ("uint16_t", "0", "UINT16_MAX", 2**16),
    DType.u32: ("uint32_t", "0", "UINT32_MAX", 2**32),
    DType.u64: ("uint64_t", "0", "UINT64_MAX", 2**64),
}


def _given(k: KernelCtx, i: int) -> bool:
    """An optional 1-D input counts as given unless absent or statically empty (as inference decides)."""
    if not k.has(i):
        return False
    v = k.inp(i)
    return not (v.rank == 1 and v.static_dim(0) == 0)


def _store_int(y: CVal, index: str, v: str) -> str:
    """Round half to even, saturate (NaN -> 0, avoiding an undefined conversion)."""
    ctype, lo, hi, past = _C_TYPES_INT[y.dtype]
    top = c_float(float(past), "")
    r = f"nearbyint({v})"
    return (f"{y.ptr}[{index}] = ({v} != {v}) ? ({ctype})0 : ({r} <= (double){lo} ? ({ctype}){lo} : "
            f"({r} >= {top} ? ({ctype}){hi} : ({ctype}){r}));")


@kernel("resize", computes_shape=True)
def _resize(k: KernelCtx) -> None:
    k.include("cuvil_resize.h")
    x, y = k.inp(0), k.out(0)
    w = k.w
    rank = x.rank
    axes_attr = k.attrs.get("axes")
    axes = list(range(rank)) if axes_attr is None else [int(a) % rank if rank else 0 for a in axes_attr]
    n = len(axes)
    coord = str(k.attrs["coordinate_transformation_mode"])
    tf_crop = coord == "tf_crop_and_resize"
    policy = str(k.attrs.get("keep_aspect_ratio_policy", "stretch"))
    scale, outl, rs, re = k.tmp("scale"), k.tmp("out_len"), k.tmp("roi_s"), k.tmp("roi_e")
    w.line(f"double {scale}[{max(n, 1)}] = {{0}}, {rs}[{max(n, 1)}] = {{0}}, {re}[{max(n, 1)}] = {{0}};")
    w.line(f"int64_t {outl}[{max(n, 1)}] = {{0}};")
    i = k.tmp("i")
    w.line(f"for (int64_t {i} = 0; {i} < {n}; {i}++) {{ {rs}[{i}] = 0.0; {re}[{i}] = 1.0; }}")
    if k.has(1):
        roi = k.inp(1)
        with w.block(f"if ({roi.numel()} > 0)"):
            k.require(roi.numel(), str(2 * n), "roi length vs 2 x number of resized axes")
            with w.block(f"for (int64_t {i} = 0; {i} < {n}; {i}++)"):
                w.line(f"{rs}[{i}] = (double){roi.load(i)}; {re}[{i}] = (double){roi.load(f'{n} + {i}')};")
    in_len = [f"(int64_t){x.dim(a)}" for a in axes]
    if _given(k, 2):
        sc = k.inp(2)
        k.require(sc.numel(), str(n), "scales length vs number of resized axes")
        for j in range(n):
            w.line(f"{scale}[{j}] = (double){sc.load(str(j))};")
            k.fail_if(f"!({scale}[{j}] > 0)", "scales must be positive, got %g", f"{scale}[{j}]")
            crop = f"({re}[{j}] - {rs}[{j}])" if tf_crop else "1.0"
            w.line(f"{outl}[{j}] = (int64_t)floor((double){in_len[j]} * {crop} * {scale}[{j}]);")
            k.fail_if(f"{outl}[{j}] < 0", "the output size of a resized axis is negative")
    else:
        sz = k.inp(3)
        k.require(sz.numel(), str(n), "sizes length vs number of resized axes")
        for j in range(n):
            w.line(f"{outl}[{j}] = (int64_t){sz.ptr}[{j}];")
            k.fail_if(f"{outl}[{j}] < 0", "sizes must be non-negative, got %lld", f"(long long){outl}[{j}]")
            k.fail_if(f"{in_len[j]} == 0", "cannot derive a scale from sizes for an empty axis")
            w.line(f"{scale}[{j}] = (double){outl}[{j}] / (double){in_len[j]};")
        if policy != "stretch":
            pick, op = k.tmp("policy_scale"), ("<" if policy == "not_larger" else ">")
            w.line(f"double {pick} = {scale}[0];")
            for j in range(1, n):
                w.line(f"if ({scale}[{j}] {op} {pick}) {pick} = {scale}[{j}];")
            for j in range(n):
                w.line(f"{scale}[{j}] = {pick};")
                w.line(f"{outl}[{j}] = (int64_t)({pick} * (double){in_len[j]} + 0.5);")
    # Size the output when inference could not (any dim unknown in the static type).
    if any(is_unknown(d) for d in y.value.type.shape):
        with w.block(f"if (!{y.ptr})"):
            for a in range(rank):
                w.line(f"{y.shape}[{a}] = {x.dim(a)};")
            for j, a in enumerate(axes):
                w.line(f"{y.shape}[{a}] = {outl}[{j}];")
            k.alloc(0)
    for j, a in enumerate(axes):
        k.require(f"{y.shape}[{a}]", f"{outl}[{j}]", f"output dim {a}")
    # Resize in float64, axis by axis.
    cur, cur_shape = k.tmp("cur"), k.tmp("cur_shape")
    w.line(f"int64_t {cur_shape}[{max(rank, 1)}] = {{0}};")
    for a in range(rank):
        w.line(f"{cur_shape}[{a}] = {x.dim(a)};")
    cur_buf = k.scratch("double", x.numel(), "resize_in")
    w.line(f"double *{cur} = {cur_buf};")
    with w.block(f"for (int64_t {i} = 0; {i} < {x.numel()}; {i}++)"):
        w.line(f"{cur}[{i}] = (double){x.load(i)};")
    params = k.tmp("params")
    w.line(f"cuvil_resize_params {params} = {{{MODES.index(k.attrs['mode'])}, "
           f"{NEAREST_MODES.index(k.attrs['nearest_mode'])}, {COORD_MODES.index(coord)}, "
           f"{int(k.attrs['antialias'])}, {int(k.attrs['exclude_outside'])}, "
           f"{c_float(float(k.attrs['cubic_coeff_a']), '')}}};")
    extrap = c_float(float(k.attrs["extrapolation_value"]), "")
    for j, a in enumerate(axes):
        outer = " * ".join([f"{cur_shape}[{b}]" for b in range(a)]) or "1"
        inner = " * ".join([f"{cur_shape}[{b}]" for b in range(a + 1, rank)]) or "1"
        identity = f"{outl}[{j}] == {cur_shape}[{a}] && {scale}[{j}] == 1.0"
        if tf_crop:
            identity += f" && {rs}[{j}] == 0.0 && {re}[{j}] == 1.0"
        with w.block(f"if (!({identity}))"):
            k.fail_if(f"{cur_shape}[{a}] == 0 && {outl}[{j}] > 0",
                      f"axis {a} is empty and cannot be resized to %lld", f"(long long){outl}[{j}]")
            nt, ti, tw, to, nxt = k.tmp("ntaps"), k.tmp("tap_i"), k.tmp("tap_w"), k.tmp("outside"), k.tmp("next")
            w.line(f"const int64_t {nt} = cuvil_resize_ntaps(&{params}, {scale}[{j}]);")
            ti_buf = k.scratch("int64_t", f"{outl}[{j}] * {nt}", "tap_i")
            tw_buf = k.scratch("double", f"{outl}[{j}] * {nt}", "tap_w")
            to_buf = k.scratch("unsigned char", f"{outl}[{j}]", "outside")
            w.line(f"int64_t *{ti} = {ti_buf}; double *{tw} = {tw_buf}; unsigned char *{to} = {to_buf};")
            w.line(f"if ({cur_shape}[{a}] > 0) cuvil_resize_taps(&{params}, {outl}[{j}], {cur_shape}[{a}], "
                   f"{scale}[{j}], {rs}[{j}], {re}[{j}], {nt}, {ti}, {tw}, {to});")
            nbuf = k.scratch("double", f"({outer}) * {outl}[{j}] * ({inner})", "resize_next")
            w.line(f"double *{nxt} = {nbuf};")
            w.line(f"cuvil_resize_apply({cur}, {nxt}, {outer}, {cur_shape}[{a}], {outl}[{j}], {inner}, {nt}, "
                   f"{ti}, {tw}, {to}, {extrap});")
            for buf in (ti, tw, to, cur):
                k.release(buf)
            w.line(f"{cur} = {nxt};")
            w.line(f"{cur_shape}[{a}] = {outl}[{j}];")
    with w.block(f"for (int64_t {i} = 0; {i} < {y.numel()}; {i}++)"):
        if y.dtype in _C_TYPES_INT:
            w.line(_store_int(y, i, f"{cur}[{i}]"))
        else:
            w.line(y.store(i, f"{cur}[{i}]"))
    k.release(cur)
