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


@kernel("max_roi_pool")
def _max_roi_pool(k: KernelCtx) -> None:
    x, rois, y = k.inp(0), k.inp(1), k.out(0)
    w = k.w
    k.require(rois.dim(1), "5", "rois' last dim")
    ph, pw = (int(v) for v in k.attrs["pooled_shape"])
    scale = c_float(float(k.attrs["spatial_scale"]))
    r, b, c, i, j, hh, ww, best, corner = (k.tmp(h) for h in ("r", "b", "c", "i", "j", "h", "w", "best", "corner"))
    lo, hi, step = k.tmp("lo"), k.tmp("hi"), k.tmp("step")
    nc, ih, iw = (f"(int64_t){x.dim(d)}" for d in (1, 2, 3))
    acc = "double" if x.dtype is DType.f64 else "float"
    with w.block(f"for (int64_t {r} = 0; {r} < (int64_t){rois.dim(0)}; {r}++)"):
        w.line(f"const int64_t {b} = (int64_t){rois.load(f'{r} * 5')};")
        k.fail_if(f"{b} < 0 || {b} >= (int64_t){x.dim(0)}", "batch index %lld is out of range for a batch of %lld",
                  f"(long long){b}", f"(long long){x.dim(0)}")
        w.line(f"int64_t {corner}[4];")
        w.line(f"for (int {i} = 0; {i} < 4; {i}++) {corner}[{i}] = (int64_t)roundf((float){rois.load(f'{r} * 5 + 1 + {i}')}"
               f" * {scale});")
        w.line(f"int64_t {lo}[{ph + pw}], {hi}[{ph + pw}];")
        for pooled, start, end, size, off in ((ph, 1, 3, ih, 0), (pw, 0, 2, iw, ph)):  # rows, then columns
            with w.block(""):
                w.line(f"const int64_t len_ = {corner}[{end}] - {corner}[{start}] + 1;")
                w.line(f"const float {step} = (float)(len_ > 1 ? len_ : 1) / (float){pooled};")
                with w.block(f"for (int64_t {i} = 0; {i} < {pooled}; {i}++)"):
                    w.line(f"int64_t a_ = (int64_t)floorf((float){i} * {step}) + {corner}[{start}];")
                    w.line(f"int64_t e_ = (int64_t)ceilf((float)({i} + 1) * {step}) + {corner}[{start}];")
                    w.line(f"{lo}[{off} + {i}] = a_ < 0 ? 0 : (a_ > {size} ? {size} : a_);")
                    w.line(f"{hi}[{off} + {i}] = e_ < 0 ? 0 : (e_ > {size} ? {size} : e_);")
        with (w.block(f"for (int64_t {c} = 0; {c} < {nc}; {c}++)"), w.block(f"for (int64_t {i} = 0; {i} < {ph}; {i}++)"),
              w.block(f"for (int64_t {j} = 0; {j} < {pw}; {j}++)")):
            w.line(f"{acc} {best} = 0;")
            with w.block(f"if ({hi}[{i}] > {lo}[{i}] && {hi}[{ph} + {j}] > {lo}[{ph} + {j}])"):
                w.line(f"{best} = -INFINITY;")
                with (w.block(f"for (int64_t {hh} = {lo}[{i}]; {hh} < {hi}[{i}]; {hh}++)"),
                      w.block(f"for (int64_t {ww} = {lo}[{ph} + {j}]; {ww} < {hi}[{ph} + {j}]; {ww}++)")):
                    v = k.tmp("v")
                    w.line(f"const {acc} {v} = {x.load(f'(({b} * {nc} + {c}) * {ih} + {hh}) * {iw} + {ww}')};")
                    w.line(f"if ({v} > {best} || {v} != {v}) {best} = {v};")
            w.line(y.store(f"(({r} * {nc} + {c}) * {ph} + {i}) * {pw} + {j}", best))
