"""Range observers and the choice of quantization parameters for int8 post-training quantization.

A :class:`TensorObserver` watches one activation over the calibration set and
turns what it saw into a clipping range, by one of three methods:

1. ``minmax``: the smallest and largest value seen.
2. ``percentile``: the ``percentile``-th percentile of ``|x|`` (symmetric) or the
   ``100 - p`` and ``p`` percentiles of ``x`` (asymmetric), read from a histogram
   (each value counts in the bin that holds it; the range ends at that bin's upper
   edge).
3. ``entropy``: TensorRT's KL-divergence calibration over a histogram of ``|x|``:
   among the thresholds ``t`` at bin edges from ``levels`` bins up, the one whose
   clipped distribution, merged into ``levels`` quantization bins and expanded
   back, is closest (smallest KL divergence) to the clipped distribution.
   ``levels`` is 128 for a symmetric int8 tensor, 256 for a tensor that is never
   negative and is quantized asymmetrically (all of uint8's codes are positive);
   a signed tensor quantized asymmetrically is clipped to ``[-t, t]`` within its
   observed range.

Histograms have :data:`BINS` bins whose edges are fixed from the first pass's
range before anything is counted, and counts are integers, so the result does
not depend on the order or grouping of the samples.  Everything is float64 and
computed in a fixed order: the same data gives byte-identical scales.

:func:`activation_qparams` turns a range into a scale and zero point (and the
warnings the range deserves); :func:`quantize_weight` quantizes a constant
weight symmetrically per output channel (or per tensor).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from cuvil.errors import CuvilError
from cuvil.ir.dtypes import DType

BINS = 2048
METHODS = ("minmax", "percentile", "entropy")
ONE_SIDED = 0.05  # a symmetric range whose smaller side is below this fraction of the larger is "one-sided"
ONE_SIDED_WARNING = "symmetric int8 quantization of a one-sided range"
ONE_SIDED_ADVICE = "quantize asymmetrically (symmetric=False) to use them all"
WEIGHT_QMAX = 127  # weights use [-127, 127]: symmetric, so -128 (which has no positive twin) is never used
# With reduce_range, [-64, 64]: 7-bit weights, which the AVX2 int8 kernels multiply with vpmaddubsw exactly
# (cuvil_qgemm.h's byte path), as onnxruntime's quantizer's reduce_range does for the same reason
REDUCED_WEIGHT_QMAX = 64


class CalibrationError(CuvilError):
    """Calibration cannot give sound quantization parameters (non-finite values, bad options)."""


@dataclass(frozen=True)
class QParams:
    """The quantization of one tensor: ``q = saturate(rint(x / scale) + zero_point)`` in ``dtype``."""

    scale: float  # a float32 value (stored in the IR as float32, exactly)
    zero_point: int
    dtype: DType  # i8 (symmetric) or u8 (asymmetric)
    lo: float  # the clipping range the scale was chosen for
    hi: float

    def to_json(self) -> dict[str, object]:
        return {"scale": self.scale, "zero_point": self.zero_point, "dtype": str(self.dtype),
                "range": [self.lo, self.hi]}


class TensorObserver:
    """The statistics of one tensor over the calibration set.

    First pass: :meth:`observe_range` on every sample.  Second pass (percentile and
    entropy only): :meth:`start_histogram`, then :meth:`observe_histogram` on every sample."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.min = math.inf
        self.max = -math.inf
        self.count = 0
        self.hist: np.ndarray | None = None
        self.hist_lo = 0.0
        self.hist_hi = 0.0
        self.hist_abs = True
        self.skip_zeros = False

    def observe_range(self, a: np.ndarray) -> None:
        if a.size == 0:
            return
        lo, hi = float(np.min(a)), float(np.max(a))
        if not (math.isfinite(lo) and math.isfinite(hi)):
            what = "NaN" if np.isnan(a).any() else "an infinite value"
            raise CalibrationError(f"tensor {self.name!r} holds {what} on a calibration sample: its range cannot be "
                                   "quantized; check the calibration data (or the fp32 model) for overflow")
        self.min, self.max = min(self.min, lo), max(self.max, hi)
        self.count += a.size

    def start_histogram(self, absolute: bool, skip_zeros: bool = False) -> None:
        """Fix the bins: over ``[0, max |x|]`` of ``|x|`` (``absolute``), else over ``[min, max]`` of ``x``;
        ``skip_zeros`` leaves exact zeros out of the counts."""
        self.hist_abs = absolute
        self.skip_zeros = skip_zeros
        if absolute:
            self.hist_lo, self.hist_hi = 0.0, max(abs(self.min), abs(self.max), 0.0)
        else:
            self.hist_lo, self.hist_hi = self.min, self.max
        self.hist = np.zeros(BINS, np.int64)

    def observe_histogram(self, a: np.ndarray) -> None:
        assert self.hist is not None
        if a.size == 0 or self.hist_hi <= self.hist_lo:
            return
        x = np.abs(a, dtype=np.float64) if self.hist_abs else a.astype(np.float64)
        if self.skip_zeros:
            x = x[x != 0.0]
        counts, _ = np.histogram(x, bins=BINS, range=(self.hist_lo, self.hist_hi))
        self.hist += counts

    @property
    def seen(self) -> bool:
        return self.count > 0

    def clip_range(self, method: str, symmetric: bool, percentile: float) -> tuple[float, float]:
        """The range to quantize: the observed one, or one clipped by ``method``."""
        if not self.seen:
            raise CalibrationError(f"tensor {self.name!r} was never computed on the calibration samples")
        lo, hi = self.min, self.max
        if method == "minmax" or self.hist is None or self.hist_hi <= self.hist_lo:
            return lo, hi
        width = (self.hist_hi - self.hist_lo) / BINS
        if method == "percentile":
            if self.hist_abs:
                t = self.hist_lo + width * (_percentile_bin(self.hist, percentile) + 1)
                return max(lo, -t), min(hi, t)
            lo_bin = _percentile_bin(self.hist, 100.0 - percentile)
            hi_bin = _percentile_bin(self.hist, percentile)
            return self.hist_lo + width * lo_bin, self.hist_lo + width * (hi_bin + 1)
        if method == "entropy":
            levels = 256 if (not symmetric and lo >= 0.0) else 128
            t = width * entropy_bins(self.hist, levels)
            return max(lo, -t), min(hi, t)
        raise CalibrationError(f"unknown calibration method {method!r}; choose one of {', '.join(METHODS)}")


def histogram_kind(method: str, symmetric: bool) -> tuple[bool, bool] | None:
    """The histogram ``method`` needs, as :meth:`TensorObserver.start_histogram`'s arguments
    (``absolute``, ``skip_zeros``), or None for none.

    Entropy calibration leaves exact zeros out: every scale represents 0 exactly, so they carry
    no quantization error, yet a ReLU output's spike of zeros would otherwise dominate the
    distribution and pull the threshold down (TensorRT's calibrator removes that spike too)."""
    if method == "minmax":
        return None
    if method == "percentile":
        return symmetric, False
    return True, True


def _percentile_bin(hist: np.ndarray, percentile: float) -> int:
    """The first bin at which the cumulative count reaches ``percentile`` % of the total."""
    cum = np.cumsum(hist)
    total = int(cum[-1])
    if total == 0:
        return len(hist) - 1
    need = percentile / 100.0 * total
    return int(np.searchsorted(cum, need, side="left"))


def entropy_bins(hist: np.ndarray, levels: int) -> int:
    """The number of leading histogram bins whose clipped distribution loses least (KL) when
    quantized to ``levels`` levels (TensorRT's entropy calibration)."""
    h = hist.astype(np.float64)
    nbins = len(h)
    if levels >= nbins or h.sum() == 0.0:
        return nbins
    suffix = np.concatenate([np.cumsum(h[::-1])[::-1], [0.0]])  # suffix[i] = h[i:].sum()
    best_i, best_kl = nbins, math.inf
    for i in range(levels, nbins + 1):
        kept = h[:i]
        p = kept.copy()
        p[-1] += suffix[i]  # the outliers are clipped into the last kept bin
        if p.sum() == 0.0:
            continue
        # merge the kept bins into ``levels`` groups of (nearly) equal width, then spread each
        # group's count evenly over its non-empty bins
        group = (np.arange(i) * levels) // i
        sums = np.bincount(group, weights=kept, minlength=levels)
        nonzero = np.bincount(group, weights=(kept != 0).astype(np.float64), minlength=levels)
        per = np.divide(sums, nonzero, out=np.zeros_like(sums), where=nonzero > 0)
        q = np.where(kept != 0, per[group], 0.0)
        kl = _kl(p, q)
        if kl < best_kl:
            best_i, best_kl = i, kl
    return best_i


def _kl(p: np.ndarray, q: np.ndarray) -> float:
    """KL(p || q) of two unnormalised histograms; a bin that q lacks but p has costs as if q held a tiny mass."""
    ps, qs = p.sum(), q.sum()
    if qs == 0.0:
        return math.inf
    pn, qn = p / ps, q / qs
    mask = pn > 0
    qm = np.where(qn[mask] > 0, qn[mask], 1e-12)
    return float(np.sum(pn[mask] * np.log(pn[mask] / qm)))


# quantization parameters ----------------------------------------------------------------------------


def activation_qparams(name: str, lo: float, hi: float, observed: tuple[float, float],
                       symmetric: bool) -> tuple[QParams, list[str]]:
    """The scale and zero point for a tensor clipped to ``[lo, hi]`` (``observed``: its full range),
    and the warnings its range deserves (each naming the tensor).

    Symmetric: int8 with zero point 0 and ``scale = max(|lo|, |hi|) / 127``.  Asymmetric: uint8 over
    ``[min(lo, 0), max(hi, 0)]`` (0 must be exact: padding and ReLU produce it), ``scale = range / 255``,
    ``zero_point = rint(-lo / scale)``.  A tensor that was 0 everywhere gets scale 1."""
    warnings: list[str] = []
    omin, omax = observed
    if symmetric:
        amax = max(abs(lo), abs(hi))
        scale = np.float32(amax / 127.0) if amax > 0.0 else np.float32(1.0)
        oamax = max(abs(omin), abs(omax))
        small = min(abs(omin), abs(omax)) if omin < 0.0 < omax else 0.0
        if oamax > 0.0 and small < ONE_SIDED * oamax:
            side = "non-negative" if omin >= -ONE_SIDED * oamax else "non-positive"
            warnings.append(
                f"tensor {name!r}: {ONE_SIDED_WARNING} [{omin:.6g}, {omax:.6g}] "
                f"(almost all {side}): about half of the 256 codes are never used, so it gets ~7 bits of "
                f"resolution; {ONE_SIDED_ADVICE}")
        if oamax == 0.0:
            warnings.append(f"tensor {name!r} was 0 on every calibration sample; its scale is set to 1")
        return QParams(float(scale), 0, DType.i8, -amax, amax), warnings
    lo0, hi0 = min(lo, 0.0), max(hi, 0.0)
    if hi0 == lo0:
        warnings.append(f"tensor {name!r} was 0 on every calibration sample; its scale is set to 1")
        return QParams(1.0, 0, DType.u8, 0.0, 0.0), warnings
    scale32 = np.float32((hi0 - lo0) / 255.0)
    zp = int(np.clip(np.rint(-lo0 / float(scale32)), 0, 255))
    if lo > 0.0 or hi < 0.0:
        ideal = _ideal_zero_point(lo, hi)
        used = (hi - lo) / (hi0 - lo0)
        warnings.append(
            f"tensor {name!r}: asymmetric uint8 quantization of the range [{lo:.6g}, {hi:.6g}], which excludes 0: "
            f"its zero point would be {ideal}, outside 0..255; the range is widened to [{lo0:.6g}, {hi0:.6g}] "
            f"so that 0 stays exact, and only {100.0 * used:.1f}% of the codes are used")
    return QParams(float(scale32), zp, DType.u8, lo0, hi0), warnings


def _ideal_zero_point(lo: float, hi: float) -> str:
    """The zero point that would map exactly ``[lo, hi]`` onto 0..255 (text: it may be unbounded)."""
    if hi == lo:
        return "undefined (a constant range)"
    return str(int(np.rint(-lo / ((hi - lo) / 255.0))))


def quantize_weight(name: str, w: np.ndarray, axis: int | None,
                    qmax: int = WEIGHT_QMAX) -> tuple[np.ndarray, np.ndarray]:
    """``w`` as symmetric int8 in ``[-qmax, qmax]`` and its float32 scales: one per slice along ``axis``
    (per output channel), or one for the whole tensor (``axis`` None).  An all-zero channel gets scale 1."""
    if not np.all(np.isfinite(w)):
        raise CalibrationError(f"weight {name!r} holds NaN or infinite values: it cannot be quantized")
    w64 = w.astype(np.float64)
    if axis is None:
        amax = np.array(np.max(np.abs(w64)) if w64.size else 0.0)
    else:
        others = tuple(i for i in range(w.ndim) if i != axis)
        amax = np.max(np.abs(w64), axis=others) if w64.size else np.zeros(w.shape[axis])
    scale = np.where(amax > 0.0, amax / qmax, 1.0).astype(np.float32)
    shape = [1] * w.ndim
    if axis is not None:
        shape[axis] = -1
    # divide by the float32 scale the IR stores, in float32 as dequantize_linear multiplies back
    q = np.rint(w.astype(np.float32) / scale.reshape(shape))
    return np.clip(q, -qmax, qmax).astype(np.int8), scale
