"""Kernel of the ``attention`` op: a call of ``cuvil_attention_f32`` (runtime/cuvil_attention.h).

The generated code fills a ``cuvil_attn`` with the operands' element strides, so the 3-D
form ``[batch, seq, heads * head_size]`` and the 4-D form ``[batch, heads, seq, head_size]``
are read and written in place, without transposes.  With a KV cache, ``present_key`` /
``present_value`` are written first (the past entries, then the new ones) and the attention
reads them; without one, requested present outputs are copies of K / V in the 4-D layout.
Half floats are widened to float32 scratch around the call and the results rounded once;
float64 and a ``softmax_precision`` wider than float32 are refused with an error naming them.
"""

from __future__ import annotations

from cuvil.backends.c.codegen import CodegenError
from cuvil.backends.c.kernel import CVal, KernelCtx, kernel
from cuvil.ir.dtypes import DType

_MODES = {"split": "CUVIL_ATT_SPLIT", "mul": "CUVIL_ATT_MUL", "div": "CUVIL_ATT_DIV"}


def _f32(k: KernelCtx, v: CVal) -> tuple[str, bool]:
    """``v``'s data as a float pointer, and whether it is scratch to release (f16/bf16 widened)."""
    if v.dtype is DType.f32:
        return v.ptr, False
    buf = k.scratch("float", f"{v.numel()} > 0 ? {v.numel()} : 1", "f32")
    i = k.tmp("i")
    with k.w.block(f"for (int64_t {i} = 0; {i} < {v.numel()}; {i}++)"):
        k.w.line(f"{buf}[{i}] = {v.load(i)};")
    return buf, True


class _Layout:
    """(batch, heads, seq, head_size) of an operand as C expressions, and its element strides."""

    def __init__(self, k: KernelCtx, v: CVal, heads_attr: str | None) -> None:
        w = k.w
        self.b, self.h, self.s, self.d = (k.tmp(n) for n in ("b", "h", "s", "d"))
        if v.rank == 4:
            w.line(f"const int64_t {self.b} = {v.dim(0)}, {self.h} = {v.dim(1)}, {self.s} = {v.dim(2)}, "
                   f"{self.d} = {v.dim(3)};")
            self.strides = (f"{self.h} * {self.s} * {self.d}", f"{self.s} * {self.d}", self.d)
        else:
            heads = int(k.attrs[heads_attr]) if heads_attr else 0
            k.fail_if(f"{v.dim(2)} % {heads} != 0", f"hidden size %lld is not a multiple of {heads_attr}={heads}",
                      f"(long long){v.dim(2)}")
            w.line(f"const int64_t {self.b} = {v.dim(0)}, {self.h} = {heads}, {self.s} = {v.dim(1)}, "
                   f"{self.d} = {v.dim(2)} / {heads};")
            self.strides = (f"{self.s} * {self.h} * {self.d}", self.d, f"{self.h} * {self.d}")


def _copy_heads(k: KernelCtx, dst: str, total: str, p0: str, src: str, lay: _Layout) -> None:
    """dst[b, h, p0 + s, :] = src[b, h, s, :] (dst 4-D with ``total`` positions, src in layout ``lay``)."""
    b, h, s = k.tmp("b"), k.tmp("h"), k.tmp("s")
    sb, sh, ss = lay.strides
    with k.w.block(f"for (int64_t {b} = 0; {b} < {lay.b}; {b}++)"), \
            k.w.block(f"for (int64_t {h} = 0; {h} < {lay.h}; {h}++)"), \
            k.w.block(f"for (int64_t {s} = 0; {s} < {lay.s}; {s}++)"):
        k.w.line(f"memcpy({dst} + (({b} * {lay.h} + {h}) * {total} + {p0} + {s}) * {lay.d}, "
                 f"{src} + {b} * ({sb}) + {h} * ({sh}) + {s} * ({ss}), (size_t){lay.d} * sizeof(float));")


@kernel("attention")
def _attention(k: KernelCtx) -> None:
    k.include("cuvil_attention.h")
    q, kk, v = k.inp(0), k.inp(1), k.inp(2)
    dt = q.dtype
    name = f"node {k.node.name!r} (attention)"
    if dt not in (DType.f32, DType.f16, DType.bf16):
        raise CodegenError(f"{name}: the C kernel computes f32, f16 and bf16 attention, not {dt}")
    sp = k.attrs["softmax_precision"]
    if sp is not None and sp not in (DType.f32, DType.f16, DType.bf16):
        raise CodegenError(f"{name}: softmax_precision={sp} (the C kernel computes the softmax in f32)")
    w = k.w
    ql = _Layout(k, q, "q_num_heads")
    kl = _Layout(k, kk, "kv_num_heads")
    vl = _Layout(k, v, "kv_num_heads")
    k.require(kl.b, ql.b, "batch sizes of Q and K")
    k.require(vl.b, ql.b, "batch sizes of Q and V")
    k.require(kl.d, ql.d, "head sizes of Q and K")
    k.require(vl.h, kl.h, "head counts of K and V")
    k.require(vl.s, kl.s, "sequence lengths of K and V")
    k.fail_if(f"{kl.h} <= 0 || {ql.h} % {kl.h} != 0", "%lld query heads are not a multiple of %lld key/value heads",
              f"(long long){ql.h}", f"(long long){kl.h}")
    scratch: list[str] = []

    def f32(val: CVal) -> str:
        ptr, owned = _f32(k, val)
        if owned:
            scratch.append(ptr)
        return ptr

    qp, kp, vp = f32(q), f32(kk), f32(v)
    past = k.has(4)
    total = k.tmp("total")
    w.line(f"const int64_t {total} = {kl.s}{f' + {k.inp(4).dim(2)}' if past else ''};")
    # present_key / present_value: the past entries then the new ones, 4-D; the attention reads them.
    presents: list[tuple[str, CVal | None]] = []
    for i, (src, lay, d) in enumerate(((kp, kl, kl.d), (vp, vl, vl.d)), start=1):
        out = k.outs[i] if len(k.outs) > i else None
        if not past and out is None:
            presents.append((src, None))
            continue
        buf = out.ptr if out is not None and out.dtype is DType.f32 else k.scratch("float", f"{lay.b} * {lay.h} * {total} * {d} + 1", "present")
        if buf != (out.ptr if out is not None else None):
            scratch.append(buf)
        if past:
            pv = k.inp(3 + i)
            k.require(pv.dim(0), lay.b, f"batch size of input {3 + i}")
            k.require(pv.dim(1), lay.h, f"head count of input {3 + i}")
            k.require(pv.dim(3), d, f"head size of input {3 + i}")
            pp = f32(pv)
            plen = pv.dim(2)
            pl = _Layout(k, pv, None)
            _copy_heads(k, buf, total, "0", pp, pl)
            _copy_heads(k, buf, total, plen, src, lay)
        else:
            _copy_heads(k, buf, total, "0", src, lay)
        presents.append((buf, out))
    a = k.tmp("att")
    w.line(f"cuvil_attn {a};")
    w.line(f"memset(&{a}, 0, sizeof {a});")
    w.line(f"{a}.batch = {ql.b}; {a}.hq = {ql.h}; {a}.hkv = {kl.h}; {a}.sq = {ql.s}; {a}.skv = {total}; "
           f"{a}.dk = {ql.d}; {a}.dv = {vl.d};")
    w.line(f"{a}.q = {qp};")
    for field, lay, (ptr, _) in (("k", kl, presents[0]), ("v", vl, presents[1])):
        if past:  # the attention reads the 4-D present buffer
            strides = (f"{lay.h} * {total} * {lay.d}", f"{total} * {lay.d}", lay.d)
        else:
            strides, ptr = lay.strides, (kp if field == "k" else vp)
        w.line(f"{a}.{field} = {ptr};")
        for j, st in enumerate(strides):
            w.line(f"{a}.{field}s[{j}] = {st};")
    for j, st in enumerate(ql.strides):
        w.line(f"{a}.qs[{j}] = {st};")
    y = k.out(0)
    yp = y.ptr if y.dtype is DType.f32 else k.scratch("float", f"{y.numel()} > 0 ? {y.numel()} : 1", "y")
    ys = (f"{ql.h} * {ql.s} * {vl.d}", f"{ql.s} * {vl.d}", vl.d) if q.rank == 4 else \
        (f"{ql.s} * {ql.h} * {vl.d}", vl.d, f"{ql.h} * {vl.d}")
    w.line(f"{a}.y = {yp};")
    for j, st in enumerate(ys):
        w.line(f"{a}.ys[{j}] = {st};")
    if k.has(3):
        _mask(k, a, k.inp(3), ql, total, f32)
    if k.has(6):
        npd = k.inp(6)
        k.require(npd.dim(0), ql.b, "length of nonpad_kv_seqlen vs the batch size")
        w.line(f"{a}.nonpad = {npd.ptr};")
    w.line(f"{a}.causal = {int(k.attrs['is_causal'])};")
    w.line(f"{a}.causal_offset = {k.inp(4).dim(2) if past else 0};")
    w.line(f"{a}.scale_mode = {_MODES[k.attrs['scale_mode']]};")
    scale = k.attrs["scale"]
    if k.attrs["scale_mode"] == "split":
        # sqrt(scale) rounded to float, as the reference rounds it to the input type (scale absent:
        # 1/sqrt(head size)); sqrt is correctly rounded, so double math here gives the same value.
        s = f"(double){scale!r}" if scale is not None else f"1.0 / sqrt((double){ql.d})"
        w.line(f"{a}.scale = (float)sqrt({s});")
    else:
        w.line(f"{a}.scale = (float){float(scale)!r};")
    w.line(f"{a}.softcap = (float){float(k.attrs['softcap'])!r};")
    w.line(f"{a}.guard = {int(k.attrs['guard_masked_rows'])};")
    qk = k.outs[3] if len(k.outs) > 3 else None
    if qk is not None:
        qkp = qk.ptr if qk.dtype is DType.f32 else k.scratch("float", f"{qk.numel()} > 0 ? {qk.numel()} : 1", "qk")
        w.line(f"{a}.qk = {qkp}; {a}.qk_mode = {int(k.attrs['qk_matmul_output_mode'])};")
    k.note(f"fused attention, cuvil_attention_f32 ({'3-D' if q.rank == 3 else '4-D'} operands"
           + (", grouped-query heads" if k.attrs["q_num_heads"] != k.attrs["kv_num_heads"] else "") + ")")
    rc = k.tmp("rc")
    w.line(f"int {rc} = cuvil_attention_f32(&{a});")
    k.fail_if(f"{rc} != 0", "out of memory")
    # Results computed in float scratch: round them into the half-float outputs once.
    for out, ptr in ((y, yp), *((o, p) for p, o in presents), (qk, f"{a}.qk")):
        if out is None or out.dtype is DType.f32:
            continue
        ix = k.tmp("i")
        with w.block(f"for (int64_t {ix} = 0; {ix} < {out.numel()}; {ix}++)"):
            w.line(out.store(ix, f"{ptr}[{ix}]"))
    for ptr in scratch:
        k.release(ptr)
    if yp != y.ptr:
        k.release(yp)
    if qk is not None and qk.dtype is not DType.f32:
        k.release(f"{a}.qk")


def _mask(k: KernelCtx, a: str, m: CVal, ql: _Layout, total: str, f32: object) -> None:
    """The mask's pointer, its strides over (batch, query head, query, key) and its key count."""
    w = k.w
    if m.dtype is DType.bool:
        w.line(f"{a}.mask_b = (const uint8_t *){m.ptr};")
    else:
        ptr = f32(m)  # type: ignore[operator]
        w.line(f"{a}.mask_f = {ptr};")
    cols = m.dim(m.rank - 1)
    k.fail_if(f"{cols} > {total}", "attn_mask's last dim %lld exceeds the %lld keys", f"(long long){cols}",
              f"(long long){total}")
    w.line(f"{a}.mcols = {cols};")
    want = (ql.b, ql.h, ql.s)
    stride = cols
    strides = ["1"]
    # right-aligned: the mask's dims before the last meet (batch, heads, queries)' last ones
    for j in range(m.rank - 2, -1, -1):
        target = want[3 - (m.rank - 1 - j)]
        d = m.dim(j)
        k.fail_if(f"{d} != 1 && {d} != {target}", f"attn_mask's dim {j} (%lld) does not broadcast to %lld",
                  f"(long long){d}", f"(long long){target}")
        strides.insert(0, f"({d} == 1 ? 0 : {stride})")
        stride = f"{stride} * {d}"
    strides = ["0"] * (4 - len(strides)) + strides
    for j, st in enumerate(strides):
        w.line(f"{a}.ms[{j}] = {st};")
