"""Kernel of ``col2im``: the blocks' geometry read at run time, the sum in a float64 image.

``image_shape`` and ``block_shape`` are read (literals when constant) and checked as the
reference checks them (positive, a whole number of channels, one column per block position);
the output is sized from them when inference could not.  Every value is added, in the
reference's order, into a zeroed float64 image, then rounded once to the output type.
"""

from __future__ import annotations

from cuvil.backends.c.kernel import KernelCtx, kernel
from cuvil.backends.c.kernels.shape import operand, set_output_shape
from cuvil.ops.blocks import geometry


@kernel("col2im", computes_shape=True)
def _col2im(k: KernelCtx) -> None:
    x, y = k.inp(0), k.out(0)
    w = k.w
    r = k.inp(1).static_dim(0)
    assert r is not None
    dil, pads, strides = geometry(k.attrs, r)
    k.require(k.inp(1).numel(), str(r), "image_shape length")
    k.require(k.inp(2).numel(), str(r), "block_shape length")
    img, blk, cnt = k.tmp("image"), k.tmp("block"), k.tmp("count")
    w.line(f"int64_t {img}[{r}], {blk}[{r}], {cnt}[{r}];")
    kk, nl, px = k.tmp("k"), k.tmp("blocks"), k.tmp("pixels")
    w.line(f"int64_t {kk} = 1, {nl} = 1, {px} = 1;")
    for d in range(r):
        w.line(f"{img}[{d}] = {operand(k, 1, d)}; {blk}[{d}] = {operand(k, 2, d)};")
        k.fail_if(f"{img}[{d}] < 1 || {blk}[{d}] < 1", f"image_shape and block_shape must be positive (axis {d})")
        w.line(f"{cnt}[{d}] = ({img}[{d}] + {pads[d] + pads[d + r]} - {dil[d]} * ({blk}[{d}] - 1) - 1) / {strides[d]} + 1;")
        k.fail_if(f"{img}[{d}] + {pads[d] + pads[d + r]} - {dil[d]} * ({blk}[{d}] - 1) - 1 < 0",
                  f"no block fits along axis {d}")
        w.line(f"{kk} *= {blk}[{d}]; {nl} *= {cnt}[{d}]; {px} *= {img}[{d}];")
    k.fail_if(f"(int64_t){x.dim(1)} % {kk} != 0", "input dim 1 (%lld) is not a multiple of prod(block_shape) (%lld)",
              f"(long long){x.dim(1)}", f"(long long){kk}")
    k.require(x.dim(2), nl, "input dim 2 vs the number of blocks")
    ch = k.tmp("channels")
    w.line(f"const int64_t {ch} = (int64_t){x.dim(1)} / {kk};")
    k.include("cuvil_index.h")
    set_output_shape(k, 0, [f"(int64_t){x.dim(0)}", ch, *(f"{img}[{d}]" for d in range(r))])
    acc = k.scratch("double", f"(int64_t){x.dim(0)} * {ch} * {px}", "col2im_acc")
    plane, o, lb, pos, at, rest, left, flat, st, inside, i = (
        k.tmp(h) for h in ("plane", "o", "l", "pos", "at", "rest", "left", "flat", "st", "inside", "i"))
    with (w.block(f"for (int64_t {plane} = 0; {plane} < (int64_t){x.dim(0)} * {ch}; {plane}++)"),
          w.block(f"for (int64_t {o} = 0; {o} < {kk}; {o}++)")):
        w.line(f"int64_t {at}[{r}]; int64_t {rest} = {o};")
        for d in reversed(range(r)):
            w.line(f"{at}[{d}] = {rest} % {blk}[{d}]; {rest} /= {blk}[{d}];")
        with w.block(f"for (int64_t {lb} = 0; {lb} < {nl}; {lb}++)"):
            w.line(f"int64_t {left} = {lb}, {flat} = 0, {st} = 1, {pos}; int {inside} = 1;")
            for d in reversed(range(r)):
                w.line(f"{pos} = ({left} % {cnt}[{d}]) * {strides[d]} - {pads[d]} + {at}[{d}] * {dil[d]}; "
                       f"{left} /= {cnt}[{d}];")
                w.line(f"if ({pos} < 0 || {pos} >= {img}[{d}]) {inside} = 0;")
                w.line(f"{flat} += {pos} * {st}; {st} *= {img}[{d}];")
            w.line(f"if ({inside}) {acc}[{plane} * {px} + {flat}] += "
                   f"(double){x.load(f'({plane} * {kk} + {o}) * {nl} + {lb}')};")
    with w.block(f"for (int64_t {i} = 0; {i} < (int64_t){x.dim(0)} * {ch} * {px}; {i}++)"):
        w.line(y.store(i, f"{acc}[{i}]"))
    k.release(acc)
