"""Kernels of ``grid_sample``, ``roi_align`` and ``deform_conv``: float64 copies of the operands through runtime/cuvil_sampling.h.

The runtime computes in float64 as the reference does; an operand of another float type is
converted into a call-owned float64 buffer first (and the result converted back), a float64
one is read in place.  Shape relations the IR leaves symbolic (grid and X batch sizes, the
grid's last dim, the rois' 4 columns) and every batch index are checked before the call.
"""

from __future__ import annotations

from cuvil.backends.c.kernel import CVal, KernelCtx, kernel
from cuvil.backends.c.kernels.shape import KernelError
from cuvil.backends.c.writer import c_float
from cuvil.ir.dtypes import DType
from cuvil.ops.sampling import GRID_MODES, PADDING_MODES

_MAX_AXES = 8  # CUVIL_GRID_MAX_AXES
_MAX_COMBOS = 256  # CUVIL_GRID_MAX_COMBOS


def as_double(k: KernelCtx, v: CVal, hint: str) -> str:
    """A ``const double *`` holding ``v``'s elements: its own data when float64, else a converted copy."""
    if v.dtype is DType.f64:
        return v.ptr
    buf, i = k.scratch("double", v.numel(), hint), k.tmp("i")
    with k.w.block(f"for (int64_t {i} = 0; {i} < {v.numel()}; {i}++)"):
        k.w.line(f"{buf}[{i}] = (double){v.load(i)};")
    return buf


def double_out(k: KernelCtx, y: CVal, hint: str) -> str:
    """Where the runtime writes ``y`` in float64 (``y`` itself when float64); :func:`store_out` finishes it."""
    return y.ptr if y.dtype is DType.f64 else k.scratch("double", y.numel(), hint)


def store_out(k: KernelCtx, y: CVal, buf: str) -> None:
    if y.dtype is DType.f64:
        return
    i = k.tmp("i")
    with k.w.block(f"for (int64_t {i} = 0; {i} < {y.numel()}; {i}++)"):
        k.w.line(y.store(i, f"{buf}[{i}]"))


def release(k: KernelCtx, *pairs: tuple[CVal, str]) -> None:
    for v, buf in pairs:
        if v.dtype is not DType.f64:
            k.release(buf)


@kernel("grid_sample")
def _grid_sample(k: KernelCtx) -> None:
    x, grid, y = k.inp(0), k.inp(1), k.out(0)
    w = k.w
    r = x.rank - 2
    mode = str(k.attrs["mode"])
    taps = {"nearest": 1, "linear": 2, "cubic": 4}[mode]
    if r > _MAX_AXES or taps**r > _MAX_COMBOS:
        raise KernelError(f"node {k.node.name!r} (grid_sample): {mode} sampling over {r} spatial axes exceeds "
                          f"the C kernel's {_MAX_COMBOS} taps per position")
    k.require(grid.dim(0), x.dim(0), "batch sizes of grid and X")
    k.require(grid.dim(grid.rank - 1), str(r), "grid's last dim (the number of spatial axes)")
    k.include("cuvil_sampling.h")
    ind, outd = k.tmp("in_dims"), k.tmp("out_dims")
    w.line(f"const int64_t {ind}[{r}] = {{{', '.join(f'(int64_t){x.dim(2 + d)}' for d in range(r))}}};")
    w.line(f"const int64_t {outd}[{r}] = {{{', '.join(f'(int64_t){grid.dim(1 + d)}' for d in range(r))}}};")
    xd, gd = as_double(k, x, "gs_x"), as_double(k, grid, "gs_grid")
    yd = double_out(k, y, "gs_y")
    w.line(f"cuvil_grid_sample({xd}, {gd}, {yd}, {x.dim(0)}, {x.dim(1)}, {r}, {ind}, {outd}, "
           f"{GRID_MODES.index(mode)}, {PADDING_MODES.index(str(k.attrs['padding_mode']))}, "
           f"{int(k.attrs['align_corners'])});")
    store_out(k, y, yd)
    release(k, (x, xd), (grid, gd), (y, yd))


@kernel("roi_align")
def _roi_align(k: KernelCtx) -> None:
    x, rois, batch, y = k.inp(0), k.inp(1), k.inp(2), k.out(0)
    w = k.w
    k.require(rois.dim(1), "4", "rois' last dim")
    k.require(batch.dim(0), rois.dim(0), "numbers of batch indices and rois")
    bi, i = k.scratch("int64_t", f"(int64_t){rois.dim(0)} + 1", "roi_batch"), k.tmp("i")
    with w.block(f"for (int64_t {i} = 0; {i} < (int64_t){rois.dim(0)}; {i}++)"):
        w.line(f"{bi}[{i}] = (int64_t){batch.load(i)};")
        k.fail_if(f"{bi}[{i}] < 0 || {bi}[{i}] >= (int64_t){x.dim(0)}",
                  "batch index %lld is out of range for a batch of %lld", f"(long long){bi}[{i}]",
                  f"(long long){x.dim(0)}")
    k.include("cuvil_sampling.h")
    xd, rd = as_double(k, x, "roi_x"), as_double(k, rois, "roi_boxes")
    yd = double_out(k, y, "roi_y")
    scale = float(k.attrs["spatial_scale"])
    w.line(f"cuvil_roi_align({xd}, {rd}, {bi}, {yd}, {x.dim(1)}, {x.dim(2)}, {x.dim(3)}, {rois.dim(0)}, "
           f"{int(k.attrs['output_height'])}, {int(k.attrs['output_width'])}, {int(k.attrs['sampling_ratio'])}, "
           f"{c_float(scale, '')}, {int(k.attrs['coordinate_transformation_mode'] == 'half_pixel')}, "
           f"{int(k.attrs['mode'] == 'max')});")
    store_out(k, y, yd)
    release(k, (x, xd), (rois, rd), (y, yd))
    k.release(bi)


@kernel("deform_conv")
def _deform_conv(k: KernelCtx) -> None:
    x, wt, off, y = k.inp(0), k.inp(1), k.inp(2), k.out(0)
    w = k.w
    strides, dil = (list(k.attrs.get(a) or [1, 1]) for a in ("strides", "dilations"))
    pads = list(k.attrs.get("pads") or [0, 0, 0, 0])
    group, og = int(k.attrs["group"]), int(k.attrs["offset_group"])
    k.require(x.dim(1), f"(int64_t){wt.dim(1)} * {group}", "X's channels vs W's input channels x group")
    k.fail_if(f"(int64_t){x.dim(1)} % {og} != 0 || (int64_t){wt.dim(0)} % {group} != 0",
              "channels do not divide into offset_group or group")
    k.require(off.dim(0), x.dim(0), "batch sizes of offset and X")
    k.require(off.dim(1), f"(int64_t){wt.dim(2)} * (int64_t){wt.dim(3)} * {2 * og}", "offset channels")
    for i in range(2):
        k.require(off.dim(2 + i), y.dim(2 + i), f"offset dim {2 + i} vs the output's")
    if k.has(3):
        k.require(k.inp(3).dim(0), wt.dim(0), "B's length vs W's output channels")
    if k.has(4):
        m = k.inp(4)
        k.require(m.dim(0), x.dim(0), "batch sizes of mask and X")
        k.require(m.dim(1), f"(int64_t){wt.dim(2)} * (int64_t){wt.dim(3)} * {og}", "mask channels")
        for i in range(2):
            k.require(m.dim(2 + i), y.dim(2 + i), f"mask dim {2 + i} vs the output's")
    k.include("cuvil_sampling.h")
    st, pd, dl = k.tmp("strides"), k.tmp("pads"), k.tmp("dilations")
    w.line(f"const int64_t {st}[2] = {{{strides[0]}, {strides[1]}}}, {pd}[2] = {{{pads[0]}, {pads[1]}}}, "
           f"{dl}[2] = {{{dil[0]}, {dil[1]}}};")
    ins = [(v, as_double(k, v, f"dc_in{i}")) for i, v in enumerate(k.ins) if v is not None]
    ptr = {id(v): p for v, p in ins}
    b = ptr[id(k.inp(3))] if k.has(3) else "NULL"
    mask = ptr[id(k.inp(4))] if k.has(4) else "NULL"
    yd = double_out(k, y, "dc_y")
    cols = k.scratch("double", f"(int64_t){x.dim(1)} * (int64_t){wt.dim(2)} * (int64_t){wt.dim(3)} * "
                               f"(int64_t){y.dim(2)} * (int64_t){y.dim(3)}", "dc_cols")
    w.line(f"cuvil_deform_conv2d({ptr[id(x)]}, {ptr[id(wt)]}, {ptr[id(off)]}, {b}, {mask}, {yd}, {x.dim(0)}, "
           f"{x.dim(1)}, {x.dim(2)}, {x.dim(3)}, {wt.dim(0)}, {wt.dim(2)}, {wt.dim(3)}, {y.dim(2)}, {y.dim(3)}, "
           f"{group}, {og}, {st}, {pd}, {dl}, {cols});")
    store_out(k, y, yd)
    release(k, *ins, (y, yd))
    k.release(cols)
