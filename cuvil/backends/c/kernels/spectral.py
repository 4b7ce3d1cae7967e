"""Kernels of ``dft`` and ``stft``: run-time geometry, then runtime/cuvil_spectral.h in float64.

The axis, the transform length and the frame parameters are read when the call runs (literals
when constant), checked as the reference checks them, and size the output when inference could
not.  Operands of a float type other than float64 go through float64 copies
(:mod:`cuvil.backends.c.kernels.sampling`'s helpers).
"""

from __future__ import annotations

from cuvil.backends.c.kernel import KernelCtx, kernel
from cuvil.backends.c.kernels.sampling import as_double, double_out, release, store_out
from cuvil.backends.c.kernels.shape import operand, set_output_shape


def _scalar(k: KernelCtx, i: int, what: str) -> str:
    """Input ``i`` (one integer) as a C int64 expression, its length checked."""
    if k.const(i) is None:
        k.require(k.inp(i).numel(), "1", f"{what} must hold one value")
    return operand(k, i, 0)


@kernel("dft", computes_shape=True)
def _dft(k: KernelCtx) -> None:
    x, y = k.inp(0), k.out(0)
    w = k.w
    r = x.rank
    inverse, onesided = bool(k.attrs["inverse"]), bool(k.attrs["onesided"])
    irfft = inverse and onesided
    ax, m, n, bins, outer, inner, comps, j = (k.tmp(h) for h in ("axis", "m", "n", "bins", "outer", "inner", "comps", "j"))
    w.line(f"int64_t {ax} = {_scalar(k, 2, 'axis') if k.has(2) else '-2'};")
    k.fail_if(f"{ax} < -{r} || {ax} > {r - 2}", f"axis %lld is out of range for a signal of rank {r} "
              "(its last axis holds the real and imaginary parts)", f"(long long){ax}")
    w.line(f"if ({ax} < 0) {ax} += {r};")
    k.include("cuvil_index.h")
    w.line(f"const int64_t {comps} = {x.dim(r - 1)};")
    k.fail_if(f"{comps} != 1 && {comps} != 2", "the signal's last dim must be 1 or 2, got %lld", f"(long long){comps}")
    w.line(f"int64_t {m} = 0, {outer} = 1, {inner} = 1;")
    with w.block(f"for (int64_t {j} = 0; {j} < {r - 1}; {j}++)"):
        w.line(f"if ({j} < {ax}) {outer} *= {x.shape}[{j}]; else if ({j} > {ax}) {inner} *= {x.shape}[{j}]; "
               f"else {m} = {x.shape}[{j}];")
    if k.has(1):
        w.line(f"const int64_t {n} = {_scalar(k, 1, 'dft_length')};")
    else:
        w.line(f"const int64_t {n} = {'2 * (' + m + ' - 1)' if irfft else m};")
    k.fail_if(f"{n} < 1", "the transform length must be positive, got %lld", f"(long long){n}")
    w.line(f"const int64_t {bins} = {n + ' / 2 + 1' if onesided and not inverse else n};")
    dims = [f"({ax} == {d} ? {bins} : (int64_t){x.shape}[{d}])" for d in range(r - 1)]
    set_output_shape(k, 0, [*dims, "1" if irfft else "2"])
    k.include("cuvil_spectral.h")
    cs = k.scratch("double", f"2 * {n}", "roots")
    w.line(f"cuvil_roots({cs}, {n});")
    xd, yd = as_double(k, x, "dft_x"), double_out(k, y, "dft_y")
    if irfft:
        w.line(f"cuvil_irdft({xd}, {yd}, {outer}, {m}, {inner}, (int){comps}, {n}, {cs});")
    else:
        w.line(f"cuvil_dft({xd}, {yd}, {outer}, {m}, {inner}, (int){comps}, {n}, {bins}, {int(inverse)}, {cs});")
    store_out(k, y, yd)
    release(k, (x, xd), (y, yd))
    k.release(cs)


@kernel("stft", computes_shape=True)
def _stft(k: KernelCtx) -> None:
    x, y = k.inp(0), k.out(0)
    w = k.w
    step, n, size, frames, bins, comps = (k.tmp(h) for h in ("step", "n", "size", "frames", "bins", "comps"))
    w.line(f"const int64_t {step} = {_scalar(k, 1, 'frame_step')};")
    has_window = k.has(2)
    if has_window:
        w.line(f"const int64_t {size} = {k.inp(2).dim(0)};")
    if k.has(3):
        w.line(f"const int64_t {n} = {_scalar(k, 3, 'frame_length')};")
    else:
        w.line(f"const int64_t {n} = {size if has_window else f'(int64_t){x.dim(1)}'};")
    k.fail_if(f"{step} < 1 || {n} < 1", "frame_step (%lld) and frame_length (%lld) must be positive",
              f"(long long){step}", f"(long long){n}")
    k.fail_if(f"{n} > (int64_t){x.dim(1)}", "frame_length %lld exceeds the signal's length %lld",
              f"(long long){n}", f"(long long){x.dim(1)}")
    w.line(f"const int64_t {comps} = {x.dim(2)};")
    k.fail_if(f"{comps} != 1 && {comps} != 2", "the signal's last dim must be 1 or 2, got %lld", f"(long long){comps}")
    w.line(f"const int64_t {frames} = ((int64_t){x.dim(1)} - {n}) / {step} + 1;")
    w.line(f"const int64_t {bins} = {n + ' / 2 + 1' if k.attrs['onesided'] else n};")
    k.include("cuvil_index.h")
    set_output_shape(k, 0, [f"(int64_t){x.dim(0)}", frames, bins, "2"])
    k.include("cuvil_spectral.h")
    cs = k.scratch("double", f"2 * {n}", "roots")
    w.line(f"cuvil_roots({cs}, {n});")
    xd, yd = as_double(k, x, "stft_x"), double_out(k, y, "stft_y")
    wd = as_double(k, k.inp(2), "stft_w") if has_window else "NULL"
    w.line(f"cuvil_stft({xd}, {wd}, {yd}, {x.dim(0)}, {x.dim(1)}, (int){comps}, {step}, "
           f"{size if has_window else n}, {n}, {frames}, {bins}, {cs});")
    store_out(k, y, yd)
    release(k, (x, xd), (y, yd))
    if has_window:
        release(k, (k.inp(2), wd))
    k.release(cs)
