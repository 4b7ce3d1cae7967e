"""Discrete Fourier transforms: ``dft`` (ONNX DFT-20) and ``stft`` (ONNX STFT-17).

A signal's last axis holds its real part (size 1) or its real and imaginary parts (size 2);
results are complex (``[..., 2]``) except the inverse of a one-sided spectrum, which is real.

* ``dft``: the transform along ``axis`` (an input, possibly known only at run time: from
  ``-r`` to ``r - 2`` for a signal of rank ``r``, its complex axis excluded) of length
  ``dft_length`` (default: the axis' size; for a one-sided inverse ``2 * (size - 1)``), the
  signal cut or zero-padded to it.  Forward: ``X_k = sum_j x_j e^(-2 pi i jk/n)``, the first
  ``n // 2 + 1`` bins when ``onesided``.  Inverse: ``1/n`` times the sum with ``e^(+...)``; with
  ``onesided`` the input is the half spectrum of a real signal of length ``n`` (NumPy's
  ``irfft``: the imaginary parts of the zero and, for even ``n``, Nyquist bins are ignored).
* ``stft``: frames of ``frame_length`` samples (default: the window's length, else the
  signal's) every ``frame_step`` samples, each multiplied by ``window`` (default ones) and
  transformed: ``[batch, frames, bins, 2]``, ``bins = frame_length // 2 + 1`` when ``onesided``
  (the default).

The references are NumPy's FFT at the input's precision (single precision below float64), as
ONNX's reference implementation computes them: its expected outputs carry that FFT's rounding
(about 1e-7 where the exact result is 0).  The C kernels compute in float64.
"""

from __future__ import annotations

import numpy as np

from cuvil.ir.dtypes import FLOATS, INTS
from cuvil.ir.symbolic import UNKNOWN, Dim, floordiv, is_unknown
from cuvil.ir.types import TensorType
from cuvil.ops.registry import AttrSpec, InferCtx, OpDef, RefCtx, register


def _flag(ctx: InferCtx, name: str) -> bool:
    v = ctx.attrs[name]
    if v not in (0, 1):
        raise ctx.fail(f"{name} must be 0 or 1, got {v}")
    return bool(v)


def _scalar(ctx: InferCtx, i: int, what: str) -> Dim | None:
    """The value of the 0-D or one-element integer input ``i`` when known (as a dim), else None."""
    if not ctx.has(i):
        return None
    t = ctx.type(i)
    ctx.require_dtype(i, INTS)
    if t.rank > 1 or (t.rank == 1 and isinstance(t.shape[0], int) and t.shape[0] != 1):
        raise ctx.fail(f"{what} must be a scalar, got {t}")
    v = ctx.sym_value(i)
    return v[0] if v else None


def dft_axis(op: str, axis: int, rank: int) -> int:
    """``axis`` normalized for a signal of ``rank`` (its complex axis excluded), or ValueError."""
    if not -rank <= axis <= rank - 2:
        raise ValueError(f"{op}: axis {axis} is out of range for a signal of rank {rank} (its last axis holds "
                         "the real and imaginary parts)")
    return axis + rank if axis < 0 else axis


def _dft_infer(ctx: InferCtx) -> list[TensorType]:
    x = ctx.type(0)
    ctx.require_dtype(0, FLOATS)
    inverse, onesided = _flag(ctx, "inverse"), _flag(ctx, "onesided")
    if x.rank < 2:
        raise ctx.fail(f"the signal needs rank 2 or more (its last axis holds real and imaginary parts), got {x}")
    last = x.shape[-1]
    if isinstance(last, int) and last not in (1, 2):
        raise ctx.fail(f"the signal's last dim must be 1 (real) or 2 (complex), got {x}")
    n_in = _scalar(ctx, 1, "dft_length")
    if isinstance(n_in, int) and n_in < 1:
        raise ctx.fail(f"dft_length must be positive, got {n_in}")
    axis_v = _scalar(ctx, 2, "axis") if ctx.has(2) else -2
    out_last = 1 if inverse and onesided else 2
    if not isinstance(axis_v, int):
        if not ctx.has(1) and not onesided:  # every axis keeps its size
            return [TensorType(x.dtype, (*x.shape[:-1], out_last))]
        return [TensorType(x.dtype, (*(UNKNOWN,) * (x.rank - 1), out_last))]
    try:
        axis = dft_axis(ctx.op, axis_v, x.rank)
    except ValueError as exc:
        raise ctx.fail(str(exc).removeprefix(f"{ctx.op}: ")) from None
    m = x.shape[axis]
    n: Dim = (n_in if n_in is not None else UNKNOWN) if ctx.has(1) else (2 * (m - 1) if inverse and onesided else m)
    out: Dim = n
    if onesided and not inverse:
        out = UNKNOWN if is_unknown(n) else floordiv(n, 2) + 1
    return [TensorType(x.dtype, (*x.shape[:axis], out, *x.shape[axis + 1 : -1], out_last))]


def _complex(x: np.ndarray) -> np.ndarray:
    """The signal as complex numbers: complex128 for float64, else complex64 (NumPy then transforms in
    single precision, as ONNX's reference does)."""
    z = np.zeros(x.shape[:-1], np.complex128 if x.dtype == np.float64 else np.complex64)
    z.real = x[..., 0]
    if x.shape[-1] == 2:
        z.imag = x[..., 1]
    return z


def _parts(z: np.ndarray) -> np.ndarray:
    return np.stack([z.real, z.imag], axis=-1)


def _dft_ref(ctx: RefCtx) -> list[np.ndarray]:
    x = ctx.input(0)
    if x.shape[-1] not in (1, 2):
        raise ValueError(f"dft: the signal's last dim must be 1 or 2, got {list(x.shape)}")
    axis = dft_axis(ctx.op, int(ctx.input(2).reshape(-1)[0]), x.ndim) if ctx.has(2) else x.ndim - 2
    inverse, onesided = bool(ctx.attrs["inverse"]), bool(ctx.attrs["onesided"])
    m = x.shape[axis]
    if ctx.has(1):
        n = int(ctx.input(1).reshape(-1)[0])
    else:
        n = 2 * (m - 1) if inverse and onesided else m
    if n < 1:
        raise ValueError(f"dft: the transform length must be positive, got {n}")
    z = _complex(x)
    if inverse and onesided:
        y = np.fft.irfft(z, n=n, axis=axis)[..., None]
    elif inverse:
        y = _parts(np.fft.ifft(z, n=n, axis=axis))
    else:
        f = np.fft.fft(z, n=n, axis=axis)
        if onesided:
            f = np.take(f, np.arange(n // 2 + 1), axis=axis)
        y = _parts(f)
    return [y.astype(ctx.out_dtype())]


register(
    OpDef(
        name="dft",
        inputs=("input", "dft_length?", "axis?"),
        attrs={"inverse": AttrSpec("int", 0), "onesided": AttrSpec("int", 0)},
        infer=_dft_infer,
        reference=_dft_ref,
        tolerance=1e-4,
        doc="The discrete Fourier transform of a real [..., 1] or complex [..., 2] signal along `axis` "
        "(ONNX DFT-20): inverse, onesided.",
    )
)


# stft ------------------------------------------------------------------------------------------------


def _stft_infer(ctx: InferCtx) -> list[TensorType]:
    x = ctx.type(0)
    ctx.require_dtype(0, FLOATS)
    onesided = _flag(ctx, "onesided")
    if x.rank != 3:
        raise ctx.fail(f"the signal must be [batch, length, 1 or 2], got {x}")
    if isinstance(x.shape[2], int) and x.shape[2] not in (1, 2):
        raise ctx.fail(f"the signal's last dim must be 1 (real) or 2 (complex), got {x}")
    step = _scalar(ctx, 1, "frame_step")
    if ctx.has(2):
        ctx.require_dtype(2, FLOATS)
        if ctx.type(2).rank != 1:
            raise ctx.fail(f"window must be 1-D, got {ctx.type(2)}")
    length = _scalar(ctx, 3, "frame_length")
    if length is None and not ctx.has(3):
        length = ctx.type(2).shape[0] if ctx.has(2) else x.shape[1]
    for v, what in ((step, "frame_step"), (length, "frame_length")):
        if isinstance(v, int) and v < 1:
            raise ctx.fail(f"{what} must be positive, got {v}")
    frames: Dim = UNKNOWN
    if step is not None and length is not None:
        frames = floordiv(x.shape[1] - length, step) + 1
    bins: Dim = UNKNOWN if length is None else (floordiv(length, 2) + 1 if onesided else length)
    return [TensorType(x.dtype, (x.shape[0], frames, bins, 2))]


def _stft_ref(ctx: RefCtx) -> list[np.ndarray]:
    x = ctx.input(0)
    step = int(ctx.input(1).reshape(-1)[0])
    window = ctx.input(2) if ctx.has(2) else None
    if ctx.has(3):
        n = int(ctx.input(3).reshape(-1)[0])
    else:
        n = window.shape[0] if window is not None else x.shape[1]
    if step < 1 or n < 1:
        raise ValueError(f"stft: frame_step ({step}) and frame_length ({n}) must be positive")
    if window is None:
        window = np.ones(n, x.dtype)
    frames = (x.shape[1] - n) // step + 1
    if frames < 0:
        raise ValueError(f"stft: frame_length {n} exceeds the signal's length {x.shape[1]}")
    z = _complex(x)  # [batch, length]
    size = window.shape[0]
    padded = np.concatenate([z, np.zeros((z.shape[0], max(0, (frames - 1) * step + size - z.shape[1])), z.dtype)],
                            axis=1)
    at = np.arange(frames)[:, None] * step + np.arange(size)[None, :]
    f = np.fft.fft(padded[:, at] * window, n=n, axis=-1)  # [batch, frames, n]
    if ctx.attrs["onesided"]:
        f = f[..., : n // 2 + 1]
    return [_parts(f).astype(ctx.out_dtype())]


register(
    OpDef(
        name="stft",
        inputs=("signal", "frame_step", "window?", "frame_length?"),
        attrs={"onesided": AttrSpec("int", 1)},
        infer=_stft_infer,
        reference=_stft_ref,
        tolerance=1e-4,
        doc="The short-time Fourier transform of [batch, length, 1 or 2] signals (ONNX STFT-17): "
        "[batch, frames, bins, 2].",
    )
)
