"""Kernel of ``unique``: runtime/cuvil_sort.h's stable sort and grouping under a generated comparison.

The comparison of two slices (single elements without an axis) is generated per element type:
lexicographic over the slice's elements in flattened order, numbers ascending, NaNs equal to
each other and after every number.  The outputs are sized from the number of groups.
"""

from __future__ import annotations

from cuvil.backends.c import ctypes_map as ct
from cuvil.backends.c.kernel import KernelCtx, kernel
from cuvil.backends.c.kernels.shape import dims_of, guarded_copy, prod, set_output_shape
from cuvil.ops.common import normalize_axis


def _comparison(k: KernelCtx) -> str:
    """The name of the C comparison of two slices of ``X``'s element type (defined once per type)."""
    x = k.inp(0)
    dt = x.dtype
    name = f"cuvil_unique_cmp_{dt}"
    ctype = ct.compute(dt)
    nan = "{a} != {a}" if dt.is_float else "0"
    body = f"""typedef struct {name}_ctx {{ const {x.ctype} *x; int64_t outer, n, inner; }} {name}_ctx;
static int {name}(const void *vctx, int64_t a, int64_t b) {{
    const {name}_ctx *c = (const {name}_ctx *)vctx;
    for (int64_t o = 0; o < c->outer; o++) {{
        for (int64_t i = 0; i < c->inner; i++) {{
            const {ctype} va = {ct.load(dt, 'c->x', '(o * c->n + a) * c->inner + i')};
            const {ctype} vb = {ct.load(dt, 'c->x', '(o * c->n + b) * c->inner + i')};
            const int na = {nan.format(a='va')}, nb = {nan.format(a='vb')};
            if (na || nb) {{
                if (na && nb) continue;
                return na ? 1 : -1;
            }}
            if (va < vb) return -1;
            if (va > vb) return 1;
        }}
    }}
    return 0;
}}
"""
    k.define(name, body)
    return name


@kernel("unique", computes_shape=True)
def _unique(k: KernelCtx) -> None:
    x = k.inp(0)
    w = k.w
    axis_attr = k.attrs["axis"]
    if axis_attr is None:
        outer, n, inner, a = "1", x.numel(), "1", None
    else:
        a = normalize_axis(k.node.op, int(axis_attr), x.rank)
        outer, n, inner = prod(dims_of(x, 0, a)), f"(int64_t){x.dim(a)}", prod(dims_of(x, a + 1))
    no, nn, ni = k.tmp("outer"), k.tmp("n"), k.tmp("inner")
    w.line(f"const int64_t {no} = {outer}, {nn} = {n}, {ni} = {inner};")
    k.include("cuvil_sort.h")
    cmp = _comparison(k)
    cx = k.tmp("cmp_ctx")
    w.line(f"const {cmp}_ctx {cx} = {{{x.ptr}, {no}, {nn}, {ni}}};")
    first, count, inverse, perm, tmp, rank = (k.scratch("int64_t", f"{nn} + 1", h)
                                              for h in ("first", "count", "inverse", "perm", "tmp", "rank"))
    groups = k.tmp("groups")
    w.line(f"const int64_t {groups} = cuvil_unique({nn}, {cmp}, &{cx}, {int(k.attrs['sorted'])}, {first}, {count}, "
           f"{inverse}, {perm}, {tmp}, {rank});")
    k.include("cuvil_index.h")
    y = k.out(0)
    if a is None:
        set_output_shape(k, 0, [groups])
    else:
        set_output_shape(k, 0, [*(f"(int64_t){x.dim(d)}" if d != a else groups for d in range(x.rank))])
    o, j, i = k.tmp("o"), k.tmp("j"), k.tmp("i")
    with (w.block(f"for (int64_t {o} = 0; {o} < {no}; {o}++)"), w.block(f"for (int64_t {j} = 0; {j} < {groups}; {j}++)"),
          w.block(f"for (int64_t {i} = 0; {i} < {ni}; {i}++)")):
        w.line(f"{y.ptr}[({o} * {groups} + {j}) * {ni} + {i}] = {x.ptr}[({o} * {nn} + {first}[{j}]) * {ni} + {i}];")
    for out_i, src, length in ((1, first, groups), (2, inverse, nn), (3, count, groups)):
        if out_i < len(k.outs):
            set_output_shape(k, out_i, [length])
            guarded_copy(k, k.out(out_i).ptr, src, length, "int64_t")
    for b in (first, count, inverse, perm, tmp, rank):
        k.release(b)
