"""Error figures: how far a computed tensor is from its oracle, under one policy for the whole project.

Every check of ``cuvil verify``, the pass instruments, the quantization accuracy report, the tests and
the benchmarks measure error with the functions here, so a figure means the same thing wherever it is
reported.  ``got`` is the tensor under test, ``want`` the oracle (the reference it is judged against).

Figures
    * relative L2 error, ``||got - want|| / ||want||`` (:func:`relative_l2`);
    * max abs error, ``max |got - want|`` (:func:`max_abs_error`);
    * SNR in dB, ``10 log10(sum(want^2) / sum((got - want)^2))`` (:func:`snr_db`);
    * drift between two results, ``||a - b|| / ||ref||`` (:func:`drift`): the distance between two
      targets' outputs on the scale of a common reference, so that a matrix of drifts is symmetric and
      every entry is comparable.

Element types
    Everything is computed in float64.  Float16, bfloat16 and the other ml_dtypes floats are widened to
    float64 first (exactly); integers are converted to float64 (exact up to 2**53); bools count as 0 and
    1.  Complex tensors are not compared (a ``TypeError``).

Non-finite values
    * At a position where ``got`` and ``want`` hold the same non-finite value (NaN and NaN, +inf and
      +inf, -inf and -inf), the two agree; the position is left out and the finite rest is compared
      as usual.  ``got=[nan, 2]`` against ``want=[nan, 1]`` has relative L2 1.0, not 0.
    * Any other non-finite value on either side is an error, whatever the rest holds: a NaN or an
      infinity where the oracle is finite, a finite value where the oracle is NaN or infinite, a NaN
      against an infinity, an infinity of the wrong sign.  The figures of an error are relative L2 =
      inf, max abs = inf, SNR = -inf, and :attr:`Comparison.problem` says where and what.

Edge cases
    * Shapes that differ (broadcasting is not applied: ``(3,)`` against ``(1, 3)`` differs) are an
      error, reported like a non-finite mismatch (inf, inf, -inf) with the two shapes as the problem.
    * Empty tensors (of the same shape) agree: relative L2 0, max abs 0, SNR inf.  So does a tensor
      whose every element is a matching non-finite value.
    * An all-zero oracle (over the compared positions) has no scale: relative L2 is 0 when ``got`` is
      zero there too and inf otherwise, however small the difference; SNR is inf or -inf the same way;
      max abs is the plain difference.  A caller that wants an absolute figure for such outputs uses
      :func:`max_abs_error`.

Errors summed over several samples (the accuracy report, the int8 output SNR) use :class:`Comparison`
and its ``+``: the squared sums add, so the figures are those of the concatenation.

This module imports NumPy only, so that any layer of the project can use it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

__all__ = [
    "Comparison",
    "compare",
    "drift",
    "error_figures",
    "max_abs_error",
    "relative_l2",
    "snr_db",
    "widen",
]


def widen(x: Any) -> np.ndarray:
    """``x`` as a float64 array: floats of any width (ml_dtypes' included), integers, and bools as 0/1."""
    a = np.asarray(x)
    if a.dtype.kind == "c":
        raise TypeError(f"complex tensors ({a.dtype}) have no error figures")
    if a.dtype.kind == "b":
        a = a.astype(np.uint8)
    return a.astype(np.float64)


@dataclass(frozen=True)
class Comparison:
    """Squared sums of one comparison (or of several, added with ``+``) and the figures they give.

    ``err2`` is ``sum((got - want)^2)`` and ``ref2`` is ``sum(want^2)`` over the compared positions;
    ``peak`` is the largest ``|got - want|``; ``problem`` is None, or why the comparison is an error (a
    shape mismatch, a non-finite value the other side does not have), in which case every figure is
    the error's."""

    err2: float = 0.0
    ref2: float = 0.0
    peak: float = 0.0
    problem: str | None = None

    def __add__(self, other: Comparison) -> Comparison:
        return Comparison(self.err2 + other.err2, self.ref2 + other.ref2, max(self.peak, other.peak),
                          self.problem if self.problem is not None else other.problem)

    @property
    def ok(self) -> bool:
        """True when the comparison is not an error (its figures are finite or a matter of scale)."""
        return self.problem is None

    @property
    def rel_l2(self) -> float:
        if self.problem is not None:
            return math.inf
        if self.err2 == 0.0:
            return 0.0
        return math.sqrt(self.err2 / self.ref2) if self.ref2 > 0.0 else math.inf

    @property
    def max_abs(self) -> float:
        return math.inf if self.problem is not None else self.peak

    @property
    def snr_db(self) -> float:
        if self.problem is not None:
            return -math.inf
        if self.err2 == 0.0:
            return math.inf
        return 10.0 * math.log10(self.ref2 / self.err2) if self.ref2 > 0.0 else -math.inf

    def figures(self) -> dict[str, float]:
        """``{"rel_l2": ..., "max_abs": ..., "snr_db": ...}``, the keys reports use."""
        return {"rel_l2": self.rel_l2, "max_abs": self.max_abs, "snr_db": self.snr_db}


def _agreeing_nonfinite(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Where ``a`` and ``b`` hold the same non-finite value (NaN and NaN, or the same infinity)."""
    same: np.ndarray = (np.isnan(a) & np.isnan(b)) | (np.isinf(a) & (a == b))
    return same


def _first_disagreement(got: np.ndarray, want: np.ndarray, bad: np.ndarray) -> str:
    flat = int(np.argmax(bad.reshape(-1)))
    idx = [int(i) for i in np.unravel_index(flat, bad.shape)] if bad.ndim else []
    g, w = float(got.reshape(-1)[flat]), float(want.reshape(-1)[flat])
    return (f"{int(bad.sum())} of {bad.size} elements are non-finite on one side only; first at index {idx}: "
            f"{g!r} where the oracle has {w!r}")


def compare(got: Any, want: Any) -> Comparison:
    """The comparison of ``got`` with the oracle ``want`` under this module's policy."""
    g, w = widen(got), widen(want)
    if g.shape != w.shape:
        return Comparison(problem=f"shape {list(g.shape)} against the oracle's {list(w.shape)}")
    keep = ~_agreeing_nonfinite(g, w)
    bad = keep & ~(np.isfinite(g) & np.isfinite(w))
    if bad.any():
        return Comparison(problem=_first_disagreement(g, w, bad))
    diff = np.subtract(g, w, out=np.zeros_like(g), where=keep)  # inf - inf at agreeing places is not taken
    ref = np.where(keep, w, 0.0)
    return Comparison(float(np.sum(diff * diff)), float(np.sum(ref * ref)),
                      float(np.max(np.abs(diff), initial=0.0)))


def relative_l2(got: Any, want: Any) -> float:
    """``||got - want|| / ||want||`` in float64 under this module's policy (0 when equal, inf on an error)."""
    return compare(got, want).rel_l2


def max_abs_error(got: Any, want: Any) -> float:
    """``max |got - want|`` in float64 under this module's policy (0 for empty tensors, inf on an error)."""
    return compare(got, want).max_abs


def snr_db(got: Any, want: Any) -> float:
    """Signal-to-noise ratio of ``got`` against ``want`` in dB (inf when equal, -inf on an error)."""
    return compare(got, want).snr_db


def error_figures(got: Any, want: Any) -> dict[str, float]:
    """Relative L2, max abs error and SNR (dB) of ``got`` against ``want``, keyed as reports name them."""
    return compare(got, want).figures()


def drift(a: Any, b: Any, ref: Any) -> float:
    """``||a - b|| / ||ref||`` in float64: the distance between two results on the scale of a reference.

    ``a`` and ``b`` are compared with each other under this module's policy (the same non-finite value
    at the same place agrees, any other non-finite value is an infinite drift, as is a shape mismatch);
    ``ref`` gives only the scale, the norm of its finite elements at the compared positions.  Two results
    that agree have drift 0 whatever the reference; a difference against an all-zero (or mis-shaped)
    reference is an infinite drift.  ``drift(x, r, r) == relative_l2(x, r)``."""
    c = compare(a, b)
    if c.problem is not None:
        return math.inf
    if c.err2 == 0.0:
        return 0.0
    x, y, r = widen(a), widen(b), widen(ref)
    if r.shape != x.shape:
        return math.inf
    keep = ~_agreeing_nonfinite(x, y) & np.isfinite(r)
    ref2 = float(np.sum(np.where(keep, r, 0.0) ** 2))
    return math.sqrt(c.err2 / ref2) if ref2 > 0.0 else math.inf
